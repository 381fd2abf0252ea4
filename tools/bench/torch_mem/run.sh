#!/usr/bin/env bash
# GPU memory really held (NVML) and wall time of PyTorch training loops whose shapes
# vary, under several allocator configurations, side by side in one run.
#
#   tools/bench/torch_mem/run.sh [LIB]
#
# LIB: poolshim's library (default $POOLSHIM_LIB, else build/libpoolshim.so).
# For each workload (workloads.py) it runs, one after another, each under
# nvml_peak.py (idle baseline, then NVML used memory sampled every ~1 ms):
#   nocache      PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor is a cudaMalloc; the floor
#   torch        PyTorch's caching allocator, default settings
#   expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#   torch_async  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
#   poolshim     PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=LIB, POOLSHIM_STATS=json
#   variants     each of $POOLSHIM_VARIANTS, run like poolshim with its variables
#   poolshim_trace  (only with TRACE_DIR) poolshim with POOLSHIM_LOG, the CSV gzipped
#                into TRACE_DIR; a separate run so that the timed rows carry no log
# then report.py prints a table per workload and writes OUT_DIR/torch_mem.{txt,json}.
#
# Environment:
#   OUT_DIR        results (default /tmp/torch_mem-DATE); runs/ holds every log and JSON
#   WORKLOADS      default "mlp transformer convnet"
#   CONFIGS        the built-in configurations to run, in order
#                  (default "nocache torch expandable torch_async poolshim")
#   POOLSHIM_VARIANTS  "name:VAR=VAL[,VAR=VAL...] ..." e.g.
#                  "device:POOLSHIM_FREE_SYNC=device none:POOLSHIM_FREE_SYNC=none"
#                  (a value may hold commas, as in POOLSHIM_OPTIONS=a.b=1,c.d=2: the
#                  list is only cut at a comma followed by an upper-case VAR=);
#                  "before:LD_PRELOAD=/path/libpoolshim.so" runs another build of the
#                  library in the same rounds (a variant's variables come last and win)
#   STEPS          timed steps of every workload; else STEPS_mlp (300),
#                  STEPS_transformer (150), STEPS_convnet (100), STEPS_ddp (300)
#   WARMUP         untimed steps first (default 5; they count for the peaks)
#   RUN_TIMEOUT    seconds per run (default 240)
#   GPU            NVML index of the GPU (default 0); the runs get
#                  CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=$GPU so that CUDA
#                  uses the GPU that NVML samples
#   PYTHON         default python3
#   PIN            a CPU list (taskset -c PIN) every run is bound to, e.g. "4-7": the
#                  lent hosts put a fresh process in one of two speed modes (see
#                  tools/bench/doors.sh), which a host-bound loop (the conv net) shows
#   TRACE_DIR      when set: the extra poolshim_trace run per workload (see above)
#   DEVICE=cpu SMALL=1  a dry run without a GPU (selftest/run.sh, with a fake NVML)
# Exit status: 0 when every run ended well and every loss matched nocache's, 1 otherwise.
set -u

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
lib=${1:-${POOLSHIM_LIB:-$repo/build/libpoolshim.so}}
lib=$(realpath -m "$lib")
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT_DIR:-/tmp/torch_mem-$(date +%Y%m%d-%H%M%S)}
WORKLOADS=${WORKLOADS:-mlp transformer convnet}
CONFIGS=${CONFIGS:-nocache torch expandable torch_async poolshim}
POOLSHIM_VARIANTS=${POOLSHIM_VARIANTS:-}
WARMUP=${WARMUP:-5}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
GPU=${GPU:-0}
DEVICE=${DEVICE:-cuda}
TRACE_DIR=${TRACE_DIR:-}
small=()
[ "${SMALL:-0}" = 1 ] && small=(--small)

runs=$OUT_DIR/runs
mkdir -p "$runs" || exit 1
[ -n "$TRACE_DIR" ] && { mkdir -p "$TRACE_DIR" || exit 1; }
index=$OUT_DIR/runs.tsv
printf 'workload\tconfig\tkind\tlog\tnvml\tstats\tenv\n' >"$index"
log=$OUT_DIR/run.log
: >"$log"
note() { printf '%s\n' "$*" | tee -a "$log"; }
started=$(date +%s)

steps_of() {
    if [ -n "${STEPS:-}" ]; then echo "$STEPS"; return; fi
    local var=STEPS_$1 default
    case $1 in
        mlp | ddp) default=300 ;;
        transformer) default=150 ;;
        *) default=100 ;;
    esac
    echo "${!var:-$default}"
}

# The variables of each built-in configuration, one per line.
config_env() {
    case $1 in
        nocache) echo PYTORCH_NO_CUDA_MEMORY_CACHING=1 ;;
        torch) ;;
        expandable) echo PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ;;
        torch_async) echo PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync ;;
        poolshim) printf '%s\n' PYTORCH_NO_CUDA_MEMORY_CACHING=1 "LD_PRELOAD=$lib" ;;
        *) return 1 ;;
    esac
}

# run_one WORKLOAD CONFIG KIND [VAR=VALUE...]: one process under the NVML wrapper.
problems=0
run_one() {
    local workload=$1 config=$2 kind=$3
    shift 3
    local -a envs=("$@") args=()
    local base=$runs/$workload.$config stats=""
    if [ "$kind" = poolshim ]; then
        stats=$base.stats.json
        rm -f "$stats"
        envs+=(POOLSHIM_STATS=json "POOLSHIM_STATS_FILE=$stats")
    fi
    envs+=(CUDA_DEVICE_ORDER=PCI_BUS_ID "CUDA_VISIBLE_DEVICES=$GPU")
    local item
    for item in "${envs[@]}"; do args+=(--env "$item"); done
    local -a cmd=("$PYTHON" "$here/workloads.py" "$workload" --steps "$(steps_of "$workload")"
        --warmup "$WARMUP" --device "$DEVICE" "${small[@]}")
    [ -n "${PIN:-}" ] && cmd=(taskset -c "$PIN" "${cmd[@]}")
    local t0 rc
    t0=$(date +%s)
    # Whatever the caller's environment says about allocators is removed first.
    "$PYTHON" "$here/nvml_peak.py" --gpu "$GPU" --out "$base.nvml.json" --timeout "$RUN_TIMEOUT" \
        --label "$workload/$config" --unset LD_PRELOAD --unset PYTORCH_NO_CUDA_MEMORY_CACHING \
        --unset PYTORCH_CUDA_ALLOC_CONF --unset PYTORCH_ALLOC_CONF "${args[@]}" -- "${cmd[@]}" \
        >"$base.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$workload" "$config" "$kind" "$base.log" "$base.nvml.json" \
        "$stats" "${envs[*]}" >>"$index"
    local result
    result=$(grep '^RESULT' "$base.log" | tail -1)
    if [ $rc -eq 0 ] && [ -n "$result" ]; then
        note "ran $workload/$config in $(($(date +%s) - t0)) s: $(grep '^nvml_peak:' "$base.log" | tail -1 | sed 's/^nvml_peak: [^:]*: //')"
    else
        problems=$((problems + 1))
        note "FAIL $workload/$config: exit $rc after $(($(date +%s) - t0)) s; last lines of $base.log:"
        tail -8 "$base.log" | sed 's/^/    /' | tee -a "$log"
    fi
    if [ "$kind" = poolshim ] && [ ! -s "$stats" ]; then
        note "  (no poolshim statistics in $stats: the shim writes them at exit once a CUDA call went through it)"
    fi
}

# ------------------------------------------------------------------ checks
if [[ " $CONFIGS $POOLSHIM_VARIANTS " == *poolshim* ]] || [ -n "$POOLSHIM_VARIANTS" ]; then
    [ -f "$lib" ] || note "WARNING: $lib is missing: the poolshim runs will fail (give the library as the argument)"
fi
if ! "$PYTHON" "$here/nvml_peak.py" --gpu "$GPU" --out "$OUT_DIR/nvml_check.json" --baseline-s 0.01 -- true >/dev/null 2>"$OUT_DIR/nvml_check.log"; then
    note "NVML does not work here:"; sed 's/^/    /' "$OUT_DIR/nvml_check.log" | tee -a "$log"
    exit 1
fi
# Warm the file cache (torch's libraries are large) so the first run pays no more than the others.
"$PYTHON" -c 'import torch' >/dev/null 2>&1

# Parse the variants: "name:VAR=VAL,VAR=VAL" -> names and newline-separated variables.
variant_names=()
variant_envs=()
for spec in $POOLSHIM_VARIANTS; do
    name=${spec%%:*}
    rest=${spec#*:}
    [ "$name" = "$spec" ] && rest=""
    if ! [[ $name =~ ^[A-Za-z0-9_.-]+$ ]]; then
        note "POOLSHIM_VARIANTS: bad name in '$spec' (want name:VAR=VALUE[,VAR=VALUE...])"
        exit 2
    fi
    variant_names+=("$name")
    variant_envs+=("$(printf '%s' "$rest" | sed -E 's/,([A-Z_][A-Z0-9_]*=)/\n\1/g')")
done

# ------------------------------------------------------------------ runs
note "torch_mem: workloads '$WORKLOADS', configurations '$CONFIGS${variant_names[*]:+ ${variant_names[*]}}', GPU $GPU${PIN:+, CPUs $PIN}, results in $OUT_DIR"
for workload in $WORKLOADS; do
    for config in $CONFIGS; do
        if ! config_env "$config" >/dev/null; then
            note "unknown configuration '$config' (nocache torch expandable torch_async poolshim)"
            problems=$((problems + 1))
            continue
        fi
        mapfile -t envs < <(config_env "$config")
        kind=native
        [ "$config" = poolshim ] && kind=poolshim
        run_one "$workload" "$config" "$kind" "${envs[@]}"
    done
    for i in "${!variant_names[@]}"; do
        mapfile -t extra < <(printf '%s\n' "${variant_envs[$i]}" | sed '/^$/d')
        run_one "$workload" "${variant_names[$i]}" poolshim PYTORCH_NO_CUDA_MEMORY_CACHING=1 "LD_PRELOAD=$lib" \
            "${extra[@]}"
    done
    if [ -n "$TRACE_DIR" ]; then
        csv=$TRACE_DIR/$workload.poolshim.csv
        rm -f "$csv" "$csv.gz"
        run_one "$workload" poolshim_trace poolshim PYTORCH_NO_CUDA_MEMORY_CACHING=1 "LD_PRELOAD=$lib" \
            "POOLSHIM_LOG=$csv"
        if [ -f "$csv" ]; then
            gzip -f "$csv" && note "  trace: $csv.gz ($(du -h "$csv.gz" | cut -f1))"
        else
            note "  trace: no $csv written"
        fi
    fi
done

# ------------------------------------------------------------------ report
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i "$GPU" 2>/dev/null | head -1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader -i "$GPU" 2>/dev/null | head -1)
torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null)
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null)
note ""
"$PYTHON" "$here/report.py" "$OUT_DIR" --meta "gpu=$gpu" "driver=$driver" "torch=$torch_version" \
    "commit=$commit" "library=$lib" "date=$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "host=$(hostname)" \
    "workloads=$WORKLOADS" "warmup=$WARMUP" "device=$DEVICE" "small=${SMALL:-0}" \
    "variants=$POOLSHIM_VARIANTS" "wall_s=$(($(date +%s) - started))" | tee -a "$log"
report_rc=${PIPESTATUS[0]}
note "torch_mem: $(($(date +%s) - started)) s in all; $OUT_DIR/torch_mem.txt and torch_mem.json"
[ $problems -eq 0 ] && [ "$report_rc" -eq 0 ]
