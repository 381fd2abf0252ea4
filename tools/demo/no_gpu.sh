#!/bin/sh
# `make demo` on a machine without a GPU (tools/demo/gpu_probe said why):
# what poolshim does, on a recorded allocation log and on the fake GPU of
# the shim tests, in three steps, then the command for a GPU machine.
#   1. replay: a PyTorch transformer's allocation log (recorded on an H100
#      with PyTorch's cache off), against the default pool and against no
#      pool, on a simulated 80 GiB device: the peaks and the calls that
#      reached CUDA;
#   2. plot: the same log's memory over time as an SVG;
#   3. ab: tools/demo/alloc_churn_fake.c (alloc_churn.cu's allocations)
#      natively and under the shim, over the fake CUDA (host memory).
# Usage: tools/demo/no_gpu.sh BUILD_DIR "WHY" (from the repository root).
set -eu
build=${1:-build}
why=${2:-no GPU}
cli=$build/poolshim
log=tests/data/logs/h100_torch_transformer_uncached.csv.gz

echo "make demo: $why: showing poolshim on a recorded allocation log and on a fake GPU instead"
echo
echo "== 1. replay: a PyTorch transformer's allocations (recorded on an H100, PyTorch's cache off),"
echo "==    the default pool against no pool, on a simulated 80 GiB device"
"$cli" replay "$log" --simulate 80GiB -c config/examples/default_pool.ini -c tools/demo/no_pool.ini
echo "upstream = the allocations each stack made from CUDA for the program's (no_pool: one each)."
echo "The simulated device answers every call at once; on a GPU each upstream allocation is a"
echo "cudaMalloc or cudaFree of its own, which the pool's reuse saves."
echo
echo "== 2. plot: the same log's memory over time"
"$cli" plot "$log" -o "$build/demo/memory.svg" -t "Memory over time: a PyTorch transformer, replayed over the default pool"
echo "plot: $build/demo/memory.svg (requested by the program, reserved by the pool)"
echo
echo "== 3. ab: the demo's allocation loop (6,000 cudaMalloc+cudaFree pairs) natively and under the shim,"
echo "==    over the fake CUDA of the shim tests (host memory behind the CUDA API: wall times are not a GPU's)"
LD_LIBRARY_PATH="$build/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$cli" ab --runs 3 --no-cupti -- "$build/demo/alloc_churn_fake" 2000
echo
echo "On a machine with an NVIDIA GPU, its driver and the CUDA toolkit, the same 'make demo' builds"
echo "tools/demo/alloc_churn.cu with nvcc and runs it natively, then under poolshim with its statistics;"
echo "'$cli ab -- ./your_program' compares your own program."
