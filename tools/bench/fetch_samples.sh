#!/bin/sh
# Builds a few of NVIDIA's cuda-samples for `poolshim ab` (tools/gpu_session.sh samples):
# short, unmodified programs whose time in allocation calls a user sees first.
# Nothing of the samples is committed (they are NVIDIA's, BSD-3-Clause):
#   1. a checkout: SAMPLES_SRC (a cuda-samples tree), else git clone of SAMPLES_URL
#      at SAMPLES_REF into a temporary folder (needs the network);
#   2. nvcc -O2 -arch=$GPU_ARCH -I Common of each program in SAMPLES (a name: from
#      Samples/0_Introduction; CATEGORY/NAME: from Samples/CATEGORY) into SAMPLES_DIR,
#      with the checkout's commit in SAMPLES_DIR/COMMIT; the GPU machine needs only the
#      binaries (static cudart).
# Environment: DEPS_DIR (default <repo>/build/deps: inside build/, so it goes to
# the GPU machine with build/), SAMPLES_DIR (default $DEPS_DIR/samples, what
# `tools/gpu_session.sh samples` runs), NVCC, GPU_ARCH (sm_90),
# SAMPLES ("vectorAdd matrixMul simpleStreams asyncAPI simpleMultiCopy"), SAMPLES_SRC,
# SAMPLES_URL (https://github.com/NVIDIA/cuda-samples), SAMPLES_REF (master).
# The multi-GPU samples of docs/benchmarks.md ("on two GPUs"), run natively and under the
# shim, not under `poolshim ab`:
#   SAMPLES_DIR=build/deps/mgsamples SAMPLES="0_Introduction/simpleP2P 0_Introduction/simpleMultiGPU
#   2_Concepts_and_Techniques/streamOrderedAllocation 2_Concepts_and_Techniques/streamOrderedAllocationP2P
#   5_Domain_Specific/p2pBandwidthLatencyTest" tools/bench/fetch_samples.sh
# Measured with them: docs/benchmarks.md, "NVIDIA samples under poolshim ab".
# shellcheck disable=SC2154 # repo and tmp are deps_env.sh's
set -eu
# shellcheck source=tools/bench/deps_env.sh
. "$(dirname "$0")/deps_env.sh"
SAMPLES=${SAMPLES:-vectorAdd matrixMul simpleStreams asyncAPI simpleMultiCopy}
SAMPLES_URL=${SAMPLES_URL:-https://github.com/NVIDIA/cuda-samples}
SAMPLES_REF=${SAMPLES_REF:-master}

src=${SAMPLES_SRC:-}
if [ -z "$src" ]; then
    echo "fetch_samples: cloning $SAMPLES_URL ($SAMPLES_REF)"
    git clone --quiet --depth 1 --branch "$SAMPLES_REF" "$SAMPLES_URL" "$tmp/cuda-samples"
    src=$tmp/cuda-samples
fi
[ -f "$src/Common/helper_cuda.h" ] || { echo "fetch_samples: $src is no cuda-samples tree (no Common/helper_cuda.h)"; exit 1; }
SAMPLES_DIR=${SAMPLES_DIR:-$DEPS_DIR/samples}
mkdir -p "$SAMPLES_DIR"
for s in $SAMPLES; do
    case $s in
    */*) dir=$src/Samples/$s ;;
    *) dir=$src/Samples/0_Introduction/$s ;;
    esac
    name=$(basename "$s")
    file=$dir/$name.cu
    [ -f "$file" ] || { echo "fetch_samples: no $file"; exit 1; }
    "$NVCC" -O2 -arch="$GPU_ARCH" -I"$src/Common" -I"$dir" -o "$SAMPLES_DIR/$name" "$file"
    echo "fetch_samples: built $SAMPLES_DIR/$name"
done
(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown) >"$SAMPLES_DIR/COMMIT"
