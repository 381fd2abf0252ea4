#!/usr/bin/env bash
# Thread scaling and pair cost, side by side in one run: psbench's
# pairs, random, threads and threads_mixed for poolshim's stacks and the peers
# (cudaMallocAsync, RMM pool and arena), then the CPU models on this machine's
# cores: bench_shim (the whole shim over the fake CUDA) and bench_core's
# scaling rows (the core over the fake device).
#
#   tools/bench/scaling.sh [BUILD]          (on a GPU machine; BUILD default build)
#
# Environment:
#   LIBS         "label=path ..." shim libraries to compare (default poolshim=BUILD/libpoolshim.so);
#                each runs the default stack, and the first also the arena and thread_cache=0
#   OPTS         "label=POOLSHIM_OPTIONS ..." variants of the first library's default stack
#                (e.g. "tc16=resource.main.thread_cache=16M"; default none)
#   REPEATS      psbench processes per configuration, alternated (default 2)
#   WORKLOADS    psbench workloads (default pairs,random,threads,threads_mixed)
#   PEERS        1: also cudaMallocAsync, rmm_pool, rmm_arena (default 1)
#   CPU_MODELS   1: also bench_shim and bench_core scaling (default 1)
#   PROFILE      1: bench_shim threads and bench_core scaling once more under the
#                sampling profiler (every thread), top functions printed (default 0)
#   OUT_DIR      where the raw JSON lines and logs go (default /tmp/poolshim-scaling)
set -u
cd "$(dirname "$0")/../.." || exit 1
build=${1:-build}
OUT_DIR=${OUT_DIR:-/tmp/poolshim-scaling}
REPEATS=${REPEATS:-2}
WORKLOADS=${WORKLOADS:-pairs,random,threads,threads_mixed}
PEERS=${PEERS:-1}
CPU_MODELS=${CPU_MODELS:-1}
PROFILE=${PROFILE:-0}
LIBS=${LIBS:-poolshim=$build/libpoolshim.so}
OPTS=${OPTS:-}
mkdir -p "$OUT_DIR"
psbench=${DEPS_DIR:-build/deps}/bench/psbench
[ -x "$psbench" ] || { echo "scaling: $psbench missing (make bench-rmm where nvcc and pip work, then copy build/ here)"; exit 1; }
echo "=== $(nproc) CPUs: $(lscpu 2>/dev/null | grep -E '^(Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\))' | tr -s ' ' | tr '\n' ';')"
jsonl=$OUT_DIR/psbench.jsonl
: >"$jsonl"

# one psbench process: LABEL, then env assignments, then -- psbench args
run_psbench() {
    local label=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    # (no POOLSHIM_STATS here: its counters slowed every thread 2-3x)
    timeout -k 5 120 env "${envs[@]}" "$psbench" --label "$label" --workloads "$WORKLOADS" "$@" \
        >"$OUT_DIR/$label.$rep.log" 2>&1 || echo "scaling: $label (run $rep) failed: $(tail -n 2 "$OUT_DIR/$label.$rep.log")"
    grep '^JSON ' "$OUT_DIR/$label.$rep.log" | sed 's/^JSON //' >>"$jsonl"
}

for rep in $(seq 1 "$REPEATS"); do
    first=1
    for spec in $LIBS; do
        name=${spec%%=*}; lib=$(readlink -f "${spec#*=}")
        run_psbench "$name" LD_PRELOAD="$lib" -- --allocator cudaMalloc
        if [ $first = 1 ]; then
            run_psbench "${name}_no_thread_cache" LD_PRELOAD="$lib" \
                POOLSHIM_OPTIONS=resource.main.thread_cache=0 -- --allocator cudaMalloc
            run_psbench "${name}_arena" LD_PRELOAD="$lib" POOLSHIM_RESOURCE=arena -- --allocator cudaMalloc
            for opt in $OPTS; do
                run_psbench "${opt%%=*}" LD_PRELOAD="$lib" POOLSHIM_OPTIONS="${opt#*=}" -- --allocator cudaMalloc
            done
        fi
        first=0
    done
    if [ "$PEERS" = 1 ]; then
        run_psbench cudaMallocAsync -- --allocator cudaMallocAsync
        if "$psbench" --has-rmm; then
            run_psbench rmm_pool -- --allocator rmm_pool
            run_psbench rmm_arena -- --allocator rmm_arena
        fi
    fi
done
python3 - "$jsonl" <<'EOF'
import json, sys, collections
rows = collections.OrderedDict()
labels = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["workload"], r["case"], r["unit"])
    lab = r["label"]
    if lab not in labels:
        labels.append(lab)
    rows.setdefault(key, collections.defaultdict(list))[lab].append(r["median"])
def fmt(v):
    return "%.0f" % v if v >= 100 else "%.1f" % v
w = max(12, max(len(l) for l in labels) + 1)
print("psbench medians, one value per process (ns):")
print("%-28s" % "workload/case" + "".join(("%" + str(w) + "s") % l for l in labels))
for (wl, case, unit), per in rows.items():
    cells = []
    for l in labels:
        v = per.get(l)
        cells.append("/".join(fmt(x) for x in v) if v else "-")
    print("%-28s" % (wl + "/" + case) + "".join(("%" + str(w) + "s") % c for c in cells))
EOF
if [ "$CPU_MODELS" = 1 ]; then
    spec=${LIBS%% *}; lib=$(readlink -f "${spec#*=}")
    echo "=== bench_shim (the shim over the fake CUDA, $(nproc) CPUs)"
    LD_LIBRARY_PATH=$build/fake LD_PRELOAD="$lib" "$build/bench_shim" | tee "$OUT_DIR/bench_shim.txt"
    echo "=== bench_core scaling (the core over the fake device)"
    BENCH_CORE_REPEATS=${BENCH_CORE_REPEATS:-3} "$build/bench_core" scaling | tee "$OUT_DIR/bench_core.txt"
fi
if [ "$PROFILE" = 1 ]; then
    spec=${LIBS%% *}; lib=$(readlink -f "${spec#*=}")
    echo "=== profile: bench_shim threads_mixed (every thread)"
    SAMPLER_MODE=process SAMPLER_OUT=$OUT_DIR/shim.samples LD_LIBRARY_PATH=$build/fake \
        LD_PRELOAD="$lib:$PWD/$build/sampler.so" "$build/bench_shim" threads_mixed >/dev/null
    python3 tools/prof/resolve.py "$OUT_DIR/shim.samples" "$lib" "$build/bench_shim" | head -n 25
    echo "=== profile: bench_core scaling, default pool cudaMalloc-style (every thread)"
    SAMPLER_MODE=process SAMPLER_OUT=$OUT_DIR/core.samples BENCH_CORE_REPEATS=1 BENCH_CORE_ROWS="pool (default), cudaMalloc" \
        LD_PRELOAD=$PWD/$build/sampler.so "$build/bench_core" scaling >/dev/null
    python3 tools/prof/resolve.py "$OUT_DIR/core.samples" "$build/bench_core" | head -n 25
fi
