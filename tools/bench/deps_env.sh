# shellcheck shell=sh
# Sourced by the scripts that fetch and build the benchmark peers
# (fetch_rmm.sh, fetch_samples.sh): the repository, where the peers go
# (DEPS_DIR, default <repo>/build/deps: inside build/, so it goes to the GPU
# machine with build/), the CUDA toolkit (CUDA_HOME, NVCC, GPU_ARCH sm_90),
# and a temporary folder ($tmp) removed at exit.
repo=$(cd "$(dirname "$0")/../.." && pwd)
DEPS_DIR=${DEPS_DIR:-$repo/build/deps}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
GPU_ARCH=${GPU_ARCH:-sm_90}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
