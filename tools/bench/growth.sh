#!/usr/bin/env bash
# Growth as a fresh process sees it: tools/bench/first_malloc.cu (the first
# cudaMalloc of 1, 8 and 32 GiB, and a fill of the device with 1 GiB blocks),
# natively and under each stack, ROUNDS alternated rounds (default 4), one fresh
# process per run. Prints the median milliseconds of each (the first round is
# printed apart, not in the median) and the ratio to native.
#   tools/bench/growth.sh BUILD_DIR      (make bench runs it; tools/gpu_session.sh growth)
# Environment: OUT_DIR (default /tmp/poolshim-growth), ROUNDS, SIZES ("1 8 32 1:warm fill"; SIZE:warm
# times the cudaMalloc after a 256 B pair, as in a program that allocated something first),
# STACKS ("label=POOLSHIM_OPTIONS ..."; "native" is always run), NVCC.
# Exit status: 1 when a run failed (a cudaMalloc refused, or a block's bytes wrong).
set -u
build_dir=${1:-build}
repo=$(cd "$(dirname "$0")/../.." && pwd)
lib=$(realpath -m "$build_dir/libpoolshim.so")
OUT_DIR=${OUT_DIR:-/tmp/poolshim-growth}
ROUNDS=${ROUNDS:-4}
SIZES=${SIZES:-1 8 32 1:warm fill}
STACKS=${STACKS:-default= chunks=resource.main.expandable=0 arena=resource.main.type=arena async=resource.main.type=async}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR" || exit 1
bin=$OUT_DIR/first_malloc
"$NVCC" -O2 -o "$bin" "$repo/tools/bench/first_malloc.cu" >"$OUT_DIR/build.log" 2>&1 || {
    echo "growth: could not build first_malloc (see $OUT_DIR/build.log)"
    exit 1
}
raw=$OUT_DIR/growth.txt
: >"$raw"
for round in $(seq 1 "$ROUNDS"); do
    for size in $SIZES; do
        args=("${size%%:*}")
        [ "$size" != "${size#*:}" ] && args+=("${size#*:}")
        env -u LD_PRELOAD "$bin" "${args[@]}" | sed "s/^/native $round /" >>"$raw"
        for stack in $STACKS; do
            label=${stack%%=*} options=${stack#*=}
            env LD_PRELOAD="$lib" POOLSHIM_OPTIONS="$options" "$bin" "${args[@]}" 2>&1 |
                sed "s/^/$label $round /" >>"$raw"
        done
    done
done
failed=0
grep -h FAIL "$raw" && { echo "growth: some runs failed (above)"; failed=1; }
echo "growth: first cudaMalloc and a 1 GiB fill, $ROUNDS alternated rounds, median ms (round 1 apart), ratio to native"
"$PYTHON" "$repo/tools/bench/rounds_table.py" growth "$raw"
exit $failed
