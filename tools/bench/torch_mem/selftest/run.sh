#!/usr/bin/env bash
# A dry run of tools/bench/torch_mem/run.sh on a machine without a GPU: builds a fake
# libnvidia-ml.so.1 (fake_nvml.c), then runs every configuration with the tiny CPU
# loops (DEVICE=cpu SMALL=1). It checks the plumbing (wrapper, environments, variants,
# report), not memory: the CPU runs allocate no GPU memory, so the peaks read 0 and
# the x_nocache column is empty. Needs python3 with torch, gcc, and build/libpoolshim.so
# (make) for the poolshim rows.
#   PYTHON=/path/to/python tools/bench/torch_mem/selftest/run.sh [OUT_DIR]
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-/tmp/torch_mem-selftest}
rm -rf "$out"
mkdir -p "$out/fakenvml" || exit 1
gcc -shared -fPIC -O2 -Wall -Wextra -o "$out/fakenvml/libnvidia-ml.so.1" "$here/fake_nvml.c" || exit 1
echo 0 >"$out/fake_used"
LD_LIBRARY_PATH="$out/fakenvml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FAKE_NVML_FILE="$out/fake_used" \
    OUT_DIR="$out/result" DEVICE=cpu SMALL=1 STEPS=${STEPS:-3} WARMUP=1 RUN_TIMEOUT=120 \
    TRACE_DIR="$out/traces" POOLSHIM_VARIANTS="device:POOLSHIM_FREE_SYNC=device opts:POOLSHIM_OPTIONS=pool.min_chunk=16MiB,pool.growth_percent=50,POOLSHIM_VERBOSE=1" \
    "$here/../run.sh" "$@"
rc=$?
echo "selftest: run.sh exit $rc"
exit $rc
