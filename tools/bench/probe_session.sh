#!/usr/bin/env bash
# A short GPU probe used while developing (about a minute): the 256 B
# cudaMalloc+cudaFree pair under the libraries in build/bisect/ (one per
# commit), and psbench's thread workloads under the current shim with and
# without the per-thread caches, with the shim's statistics of each run.
#   OUT=DIR tools/bench/probe_session.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
export PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-/tmp/probe}
mkdir -p "$OUT"
nvcc -O2 -o /tmp/ovh tests/gpu/overhead.cu >/dev/null 2>&1
nvcc -O2 -cudart shared -o /tmp/ovh_sh tests/gpu/overhead.cu >/dev/null 2>&1
{
echo "== 256 B pair median ns per library (static, shared), twice"
for l in build/bisect/lib_*.so; do
    for r in 1 2; do
        echo "$(basename "$l") $(LD_PRELOAD=$PWD/$l /tmp/ovh 256 100000 1.5 | grep -o 'median_ns=[0-9.]*') $(LD_PRELOAD=$PWD/$l /tmp/ovh_sh 256 100000 1.5 | grep -o 'median_ns=[0-9.]*')"
    done
done
echo "== psbench threads workloads, poolshim pool"
for v in default thread_cache=0; do
    opts=""; [ "$v" != default ] && opts=resource.main.$v
    POOLSHIM_OPTIONS=$opts POOLSHIM_STATS=json POOLSHIM_STATS_FILE=$OUT/stats_$v.json LD_PRELOAD=$PWD/build/libpoolshim.so \
        timeout 120 "${DEPS_DIR:-build/deps}/bench/psbench" --allocator cudaMalloc --label "$v" --workloads threads,threads_mixed --quick |
        python3 -c 'import json,sys
for line in sys.stdin:
    if line.startswith("JSON "):
        r = json.loads(line[5:])
        print("%-16s %-14s %-11s %10.1f ns/pair  x_of_one_thread %s" % (r["label"], r["workload"], r["case"], r["median"], r.get("x_of_one_thread", "-")))'
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["devices"][0]; print(sys.argv[2], "barriers", d.get("barriers"), "upstream", d.get("upstream"), "fences", d.get("fences"), "bytes", d.get("bytes"))' "$OUT/stats_$v.json" "$v"
done
} 2>&1 | tee "$OUT/probe.txt"
