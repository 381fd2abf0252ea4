#!/usr/bin/env bash
# Both interposition doors beside RMM's pool, in fresh processes, alternated:
# psbench (static cudart: the shim's driver-API door through cuGetProcAddress)
# and psbench_shared (-cudart shared: the runtime door), each under the shim,
# then RMM's pool in psbench. Prints per process the medians of the 256 B,
# 1 MiB and 16 MiB pairs and of the random workload (ns). Single-thread psbench
# processes fall in two modes about 2x apart on the H100 hosts measured (2026-11-25):
# compare rows of one round, and look at several rounds. The last row of a round,
# same_process, runs poolshim (static door) and RMM's pool in one process, batch
# by batch in turn (psbench --beside): the ratio RMM / poolshim per case, with the
# two medians in ns, free of the process's speed mode.
#
#   tools/bench/doors.sh [LIB]      (LIB default build/libpoolshim.so; ROUNDS, default 3)
#
# (on a GPU machine; $DEPS_DIR/bench/psbench and psbench_shared from make bench-rmm,
# DEPS_DIR default build/deps)
set -u
cd "$(dirname "$0")/../.." || exit 1
deps=${DEPS_DIR:-build/deps}
lib=$(readlink -f "${1:-build/libpoolshim.so}")
for b in "$deps/bench/psbench" "$deps/bench/psbench_shared"; do
    [ -x "$b" ] || { echo "doors: $b missing (make bench-rmm where nvcc and pip work, then copy build/ here)"; exit 1; }
done
one() { # LABEL BINARY ALLOCATOR [PRELOAD]
    env ${4:+LD_PRELOAD=$4} timeout 60 "$2" --label "$1" --workloads pairs,random --allocator "$3" 2>&1 |
        sed -n 's/^JSON //p' | python3 -c '
import sys, json
keep = ("256B", "64KiB", "1MiB", "16MiB", "20k_steps_le_4MiB")
rows = [json.loads(l) for l in sys.stdin]
print("%-14s" % sys.argv[1], " ".join("%s=%.0f" % (r["case"], r["median"]) for r in rows if r["case"] in keep) or "no result")' "$1"
}
beside() { # one process: poolshim's static door beside RMM's pool
    env LD_PRELOAD="$lib" timeout 120 "$deps/bench/psbench" --label same_process --workloads pairs,random \
        --allocator cudaMalloc --beside rmm_pool 2>&1 | sed -n 's/^JSON //p' | python3 -c '
import sys, json
rows = [json.loads(l) for l in sys.stdin]
mine = {r["case"]: r["median"] for r in rows if r["workload"] != "beside" and r["allocator"] == "cudaMalloc"}
theirs = {r["case"]: r["median"] for r in rows if r["workload"] != "beside" and r["allocator"] == "rmm_pool"}
ratio = {r["case"]: r["median"] for r in rows if r["workload"] == "beside"}
print("%-14s" % "same_process", " ".join("%s=%.2fx(%.0f/%.0f)" % (c, ratio[c], theirs[c], mine[c]) for c in ratio)
      or "no result")'
}
for round in $(seq 1 "${ROUNDS:-3}"); do
    echo "round $round"
    one static_shim "$deps/bench/psbench" cudaMalloc "$lib"
    one shared_shim "$deps/bench/psbench_shared" cudaMalloc "$lib"
    one rmm_pool "$deps/bench/psbench" rmm_pool
    beside
done
