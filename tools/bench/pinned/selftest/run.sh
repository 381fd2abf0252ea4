#!/usr/bin/env bash
# A dry run of tools/bench/pinned/pinned_bench.py on a machine without a GPU,
# PyTorch or CuPy: selftest/fake_python.py stands in for the workloads and for
# the shim's report, so this checks the driver (variants, fallbacks, the
# table, every verdict), not memory or time. Each case states the verdicts it
# must produce; a FAIL the case expects is the driver proving it can fail.
#   tools/bench/pinned/selftest/run.sh [LIB]   (LIB: any existing file; default build/libpoolshim.so)
set -u
here=$(cd "$(dirname "$0")" && pwd)
lib=${1:-$here/../../../../build/libpoolshim.so}
bad=0
# case MODE EXPECTED_EXIT PATTERN...: every PATTERN must be among the driver's lines
case_() {
    local mode=$1 want=$2
    shift 2
    local out rc
    out=$(FAKE_MODE=$mode python3 "$here/../pinned_bench.py" --python "$here/fake_python.py" --lib "$lib" --repeats 2 2>&1)
    rc=$?
    local ok=1
    [ "$rc" = "$want" ] || { ok=0; echo "  exit $rc, expected $want"; }
    for pat in "$@"; do
        grep -qE -- "$pat" <<<"$out" || { ok=0; echo "  missing: $pat"; }
    done
    if [ $ok = 1 ]; then echo "PASS selftest $mode"; else echo "FAIL selftest $mode"; echo "$out" | sed 's/^/    /'; bad=1; fi
}
case_ ok 0 "^PASS torch_loader: checksums identical across 3 of 3 variants" \
    "^PASS torch_loader: poolshim served 600 pinned calls" \
    "^PASS torch_loader: poolshim pinned peak reserved 1.05x requested" \
    "^PASS cupy_pipeline: checksums of every run equal" \
    "^NOTE cupy_pipeline_free_early: poolshim pinned peak reserved 1.05x requested \\(no target" \
    "torch_uncached +6.000s .* 1.00x faster" "poolshim +1.600s .* 3.75x faster" \
    "cupy_pool .* 90.0 MiB +130.0 MiB +1.44x" "off as asked"
case_ corrupt 1 "^FAIL torch_loader: checksums differ" "^FAIL cupy_pipeline: checksums of 2 runs differ"
case_ ratio 1 "^FAIL torch_loader: poolshim pinned peak reserved 1.40x requested"
case_ refuse 0 "^NOTE torch_loader: this PyTorch refuses pinned_max_cached_size_mb" \
    "^PASS torch_loader: checksums identical across 3 of 3 variants"
case_ nointercept 1 "^FAIL torch_loader: poolshim served 0 pinned calls"
exit $bad
