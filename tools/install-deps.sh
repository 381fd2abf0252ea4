#!/bin/sh
# Installs what building and testing poolshim need on Debian/Ubuntu, only
# when missing. Runs apt-get as root (directly, or through sudo).
# The cluster tests (make test-cluster) start their own Slurm (slurm-wlm,
# munge; libslurm-dev builds the SPANK plugin) and Prometheus with
# node_exporter, on loopback; the packages' own services are not used.
set -e
need=""
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# clang: the fuzz targets that `make test-all` runs (mk/fuzz_ipc.mk); libFuzzer's
# runtime is libclang-rt-dev where the archive splits it out (Debian 12), added below
for pkg in gcc make libcriterion-dev libinih-dev libjansson-dev zlib1g-dev libxml2-utils librsvg2-bin pkg-config python3 python3-venv python3-pip \
           slurm-wlm libslurm-dev munge prometheus prometheus-node-exporter clang; do
    installed "$pkg" || need="$need $pkg"
done
fuzzer_runtime() { apt-cache show libclang-rt-dev >/dev/null 2>&1 && ! installed libclang-rt-dev; }
[ -z "$need" ] && ! fuzzer_runtime && { echo "deps: all present"; exit 0; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
fuzzer_runtime && need="$need libclang-rt-dev"
echo "deps: installing$need"
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need
