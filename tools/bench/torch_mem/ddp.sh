#!/usr/bin/env bash
# DDP on two GPUs (torchrun, NCCL) under each free policy, side by side in
# one run: wall time per rank, NVML used memory per GPU (nvidia-smi sampled
# every 20 ms, peak above the idle baseline) and the shim's own peak
# requested / reserved per rank. The barrier makes NCCL's non-blocking
# streams wait at every barrier; this measures what that costs.
#   tools/bench/torch_mem/ddp.sh [LIB]      (OUT_DIR, STEPS, PYTHON, WORKLOAD, CONFIGS)
# CONFIGS: the names of the configurations to run (default all of them).
# WORKLOAD: ddp (the MLP, default) or ddp_transformer (random sequence
# length and batch: tensors large next to NCCL's buffers). nojoin is a measurement, not a
# configuration: barriers that do not wait for NCCL's streams (unsafe; what the join costs).
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
lib=$(realpath -m "${1:-$repo/build/libpoolshim.so}")
OUT_DIR=${OUT_DIR:-/tmp/ddp-mem}
STEPS=${STEPS:-300}
PYTHON=${PYTHON:-python3}
WORKLOAD=${WORKLOAD:-ddp}
mkdir -p "$OUT_DIR"
summary=$OUT_DIR/$WORKLOAD.txt
: >"$summary"
configs=(
    "nocache|PYTORCH_NO_CUDA_MEMORY_CACHING=1"
    "torch|"
    "expandable|PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    "poolshim|PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$lib"
    "lazy_barrier|PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$lib POOLSHIM_OPTIONS=resource.main.barrier_pending_percent=0"
    "event|PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$lib POOLSHIM_FREE_SYNC=event"
    "nojoin|PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$lib POOLSHIM_TEST_BARRIER_NO_JOIN=1"
)
baseline=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -2 | tr '\n' ' ')
printf '%-13s %9s %9s %12s %12s %12s %12s\n' config wall0_s wall1_s gpu0_peak_MiB gpu1_peak_MiB shim_req0_MiB shim_res0_MiB | tee -a "$summary"
for entry in "${configs[@]}"; do
    name=${entry%%|*}
    envs=${entry#*|}
    [ -n "${CONFIGS:-}" ] && ! printf ' %s ' "$CONFIGS" | grep -q " $name " && continue
    samples=$OUT_DIR/$name.smi
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 20 >"$samples" 2>/dev/null &
    smi=$!
    # shellcheck disable=SC2086
    env $envs POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$OUT_DIR/$name.stats_%r.json" \
        timeout 240 torchrun --standalone --nproc-per-node 2 "$here/workloads.py" "$WORKLOAD" --steps "$STEPS" \
        >"$OUT_DIR/$name.log" 2>&1
    rc=$?
    kill $smi 2>/dev/null; wait $smi 2>/dev/null
    w0=$(sed -n 's/^RESULT .*rank=0 .*wall_s=\([0-9.]*\).*/\1/p' "$OUT_DIR/$name.log" | tail -1)
    w1=$(sed -n 's/^RESULT .*rank=1 .*wall_s=\([0-9.]*\).*/\1/p' "$OUT_DIR/$name.log" | tail -1)
    p0=$(awk -F', ' '$1==0 && $2>m {m=$2} END {print m+0}' "$samples")
    p1=$(awk -F', ' '$1==1 && $2>m {m=$2} END {print m+0}' "$samples")
    req=- res=-
    if [ -f "$OUT_DIR/$name.stats_0.json" ]; then
        read -r req res < <("$PYTHON" -c 'import json,sys
d=json.load(open(sys.argv[1]))["devices"][0]["bytes"]
print(d["requested_peak"]>>20, d["reserved_peak"]>>20)' "$OUT_DIR/$name.stats_0.json")
    fi
    printf '%-13s %9s %9s %12s %12s %12s %12s%s\n' "$name" "${w0:--}" "${w1:--}" "$p0" "$p1" "$req" "$res" \
        "$([ $rc -ne 0 ] && echo "  (exit $rc)")" | tee -a "$summary"
done
echo "idle baseline (MiB, GPU 0 and 1): $baseline" | tee -a "$summary"
