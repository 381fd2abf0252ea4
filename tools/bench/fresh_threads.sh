#!/usr/bin/env bash
# psbench's threads and threads_mixed in a FRESH process per library: the pool
# starts empty, as in a program that starts 16 threads at once (scaling.sh runs
# pairs and random first, which grow the pool: an H100 saw 40-51 ns per pair of
# all threads there, 583-1060 ns in a fresh process). Prints per library and run
# the medians and, from the shim's statistics, the reserved peak and the barriers.
#
#   tools/bench/fresh_threads.sh [label=lib[@POOLSHIM_OPTIONS] ...]
#
# (on a GPU machine, $DEPS_DIR/bench/psbench built by make bench-rmm, DEPS_DIR default
# build/deps; REPEATS, default 2)
set -u
cd "$(dirname "$0")/../.." || exit 1
psbench=${DEPS_DIR:-build/deps}/bench/psbench
[ -x "$psbench" ] || { echo "fresh_threads: $psbench missing (make bench-rmm where nvcc and pip work, then copy build/ here)"; exit 1; }
specs=${*:-poolshim=build/libpoolshim.so}
stats=$(mktemp)
for rep in $(seq 1 "${REPEATS:-2}"); do
    for spec in $specs; do
        label=${spec%%=*}; lib=${spec#*=}; opts=
        case $lib in *@*) opts=${lib#*@}; lib=${lib%@*} ;; esac
        medians=$(POOLSHIM_OPTIONS=$opts POOLSHIM_STATS=text POOLSHIM_STATS_FILE=$stats LD_PRELOAD=$(readlink -f "$lib") \
            "$psbench" --label "$label" --workloads threads_mixed,threads --allocator cudaMalloc 2>&1 |
            sed -n 's/^JSON //p' | python3 -c '
import sys, json
rows = [json.loads(l) for l in sys.stdin]
print(" ".join("%s/%s=%.0f" % (r["workload"], r["case"].split("_")[0], r["median"]) for r in rows))')
        echo "$label run $rep: $medians | $(grep -hoE 'reserved peak [0-9.]+ [KMG]iB|[0-9]+ barriers' "$stats" | tr '\n' ' ')"
    done
done
rm -f "$stats"
