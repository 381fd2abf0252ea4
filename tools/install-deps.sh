#!/bin/sh
# Installs what building and testing poolshim need on Debian/Ubuntu, only
# when missing. Runs apt-get as root (directly, or through sudo).
# The cluster tests (make test-cluster) start their own Slurm (slurm-wlm,
# munge; libslurm-dev builds the SPANK plugin) and Prometheus with
# node_exporter, on loopback; the packages' own services are not used.
set -e
need=""
for pkg in gcc make libcriterion-dev libinih-dev libjansson-dev zlib1g-dev libxml2-utils librsvg2-bin pkg-config python3 python3-venv python3-pip \
           slurm-wlm libslurm-dev munge prometheus prometheus-node-exporter; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need="$need $pkg"
done
[ -z "$need" ] && { echo "deps: all present"; exit 0; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "deps: installing$need"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need
