#!/usr/bin/env bash
# One GPU session in one call: the GPU suite, the demo, `poolshim ab` on the
# demo and on PyTorch, and the benchmarks. Used on the lent GPU machine with
# build/ (and .carry/ for the RMM peer) carried from a machine with libinih:
#   OUT=/some/dir tools/gpu_session.sh [tests] [demo] [ab] [bench]
# Results land under $OUT (at most a few files: the device tool returns 8).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/poolshim-session}
mkdir -p "$OUT"
what=${*:-tests demo ab bench}
export PATH=$PATH:/usr/local/cuda/bin
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/extras/CUPTI/lib64:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for step in $what; do
    case $step in
    tests)
        echo "=== GPU suite"
        OUTDIR=$OUT/gpu TEST_TIMEOUT=${TEST_TIMEOUT:-90} ./tests/gpu/run.sh build | tail -n 40 ;;
    demo)
        echo "=== demo (make demo)"
        mkdir -p build/demo && nvcc -O2 -o build/demo/alloc_churn tools/demo/alloc_churn.cu &&
            { echo "-- native"; build/demo/alloc_churn; echo "-- under poolshim";
              build/poolshim run -o global.stats=text -- build/demo/alloc_churn; } ;;
    ab)
        echo "=== poolshim ab (demo, static cudart)"
        mkdir -p "$OUT/ab"
        build/poolshim ab --runs 3 --plot "$OUT/ab/demo.svg" -- build/demo/alloc_churn 3000 | tee "$OUT/ab/demo.txt"
        echo "=== poolshim ab (PyTorch, caching off)"
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 build/poolshim ab --runs 2 -- python3 tests/gpu/torch_train.py | tee "$OUT/ab/torch.txt"
        (cd "$OUT" && tar czf ab.tgz ab && rm -rf ab) ;;
    bench)
        echo "=== benchmarks"
        OUTDIR=$OUT/bench ./tools/bench/run.sh build | tail -n 80 ;;
    esac
done
