#!/usr/bin/env bash
# ad-hoc GPU call (session 4): thread scaling after the cache changes
export PATH=$PATH:/usr/local/cuda/bin
P=.carry/bench/psbench; L=$PWD/build/libpoolshim.so
(timeout 170 stdbuf -oL build/bench_core > $OUT/bench_core.txt 2>&1)
row() { sed -n 's/^JSON .*"workload": "\([a-z_]*\)", "case": "\([^"]*\)".*"median": \([0-9.]*\).*/\1\/\2 \3/p'; }
for r in 1 2; do
  for v in default resource.main.thread_cache=0; do
    o=""; [ $v = default ] || o=$v
    echo "== run $r pool [$v]" >> $OUT/ps.txt
    LD_PRELOAD=$L POOLSHIM_RESOURCE=pool POOLSHIM_OPTIONS=$o timeout 80 $P --allocator cudaMalloc --quick --workloads pairs,threads,threads_mixed 2>&1 | row >> $OUT/ps.txt
  done
done
TESTS='hazard_barrier_(threads16|threads16cache|threads16churn|skipped_threads16churn.*)$|overhead' OUTDIR=$OUT/gpu TEST_TIMEOUT=100 timeout 150 tests/gpu/run.sh build > $OUT/suite.txt 2>&1
