#!/usr/bin/env bash
# The committed PyTorch allocation logs (tests/data/logs/h100_torch_*_uncached.csv.gz,
# recorded on an H100 with PYTORCH_NO_CUDA_MEMORY_CACHING=1) replayed on this
# GPU with `poolshim replay`, each printed beside `replay --simulate`:
#   simulate   replay --simulate 80GiB               (the simulated device)
#   gpu        replay --native                       (no shim, then the default stack, on the GPU)
#   gpu_lag    replay --native --gpu-lag $REPLAY_GPU_LAG   (a spin kernel of the log's gaps
#              before each call; the host keeps the GPU at most that far behind)
# Usage: tools/bench/replay_logs.sh BUILD_DIR OUT_DIR   (run by tools/bench/run.sh,
# `make bench`, and by tools/gpu_session.sh replay). Writes OUT_DIR/replay.txt
# (every table) and OUT_DIR/replay_NAME_VARIANT.txt; prints "PASS replay NAME VARIANT"
# or "FAIL ..." per run. Environment: REPLAY_GPU_LAG (default 5ms),
# REPLAY_TIMEOUT seconds per run (default 300), REPLAY_LOGS (default: all three).
# Exit status: the number of failed runs (0: all ran).
set -u
build_dir=${1:-build}
out_dir=${2:-/tmp/poolshim-replay-logs}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cli=$(realpath -m "$build_dir/poolshim")
REPLAY_GPU_LAG=${REPLAY_GPU_LAG:-5ms}
REPLAY_TIMEOUT=${REPLAY_TIMEOUT:-300}
REPLAY_LOGS=${REPLAY_LOGS:-$(ls "$repo"/tests/data/logs/h100_torch_*_uncached.csv.gz)}
mkdir -p "$out_dir/logs" || exit 1
report=$out_dir/replay.txt
: >"$report"
failed=0
for gz in $REPLAY_LOGS; do
    name=$(basename "$gz" .csv.gz)
    csv=$out_dir/logs/$name.csv
    gunzip -c "$gz" >"$csv" || { echo "FAIL replay $name: cannot unpack $gz"; failed=$((failed + 1)); continue; }
    for variant in simulate gpu gpu_lag; do
        case $variant in
        simulate) args=(--simulate 80GiB) ;;
        gpu) args=(--native) ;;
        gpu_lag) args=(--native --gpu-lag "$REPLAY_GPU_LAG") ;;
        esac
        out=$out_dir/replay_${name}_$variant.txt
        t0=$(date +%s)
        timeout -k 5 "$REPLAY_TIMEOUT" env -u LD_PRELOAD "$cli" replay "$csv" "${args[@]}" >"$out" 2>&1
        rc=$?
        { echo "== poolshim replay $name.csv ${args[*]}  (exit $rc, $(($(date +%s) - t0)) s)"; cat "$out"; echo; } >>"$report"
        if [ $rc -eq 0 ]; then
            echo "PASS replay $name $variant ($(($(date +%s) - t0)) s)"
        else
            echo "FAIL replay $name $variant: exit $rc; last lines:"
            tail -5 "$out" | sed 's/^/    /'
            failed=$((failed + 1))
        fi
    done
done
exit $failed
