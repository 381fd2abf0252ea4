#!/usr/bin/env bash
# The GPU suite of poolshim: `make check-gpu` runs `./tests/gpu/run.sh BUILD_DIR`.
#
# Needs a GPU, nvcc and python3 (PyTorch and CuPy are used when present); it
# uses BUILD_DIR/libpoolshim.so as built elsewhere and never rebuilds it.
#   1. Compiles the CUDA test programs with nvcc (static cudart, -cudart shared,
#      the driver API, --default-stream per-thread) into $WORKDIR/bin.
#   2. Runs each program natively and under LD_PRELOAD; under the shim it writes
#      POOLSHIM_STATS=json to a file and checks from it that the shim really
#      intercepted the calls (check_stats.py).
#   3. Prints PASS/FAIL/SKIP per test, an overhead table, and last a line
#      `N passed, M failed`; exits 1 when anything failed.
# Environment:
#   OUTDIR        where results go (default /tmp/poolshim-gpu): gpu-tests.log (every
#                 test's output), results.txt (the verdicts), logs.tar.gz (logs + stats)
#   WORKDIR       binaries and per-test logs (default /tmp/poolshim-gpu-work)
#   TESTS         only tests whose name matches this extended regex (default all)
#   TEST_TIMEOUT  seconds per test (default 120)
#   GPU_ARCH      nvcc -arch (default sm_90)
#   NVCC, PYTHON  the tools (default nvcc on PATH or $CUDA_HOME/bin/nvcc, python3)
set -u

build_dir=${1:-build}
repo=$(cd "$(dirname "$0")/../.." && pwd)
src=$repo/tests/gpu
lib=$(realpath -m "$build_dir/libpoolshim.so")
OUTDIR=${OUTDIR:-/tmp/poolshim-gpu}
WORKDIR=${WORKDIR:-/tmp/poolshim-gpu-work}
TESTS=${TESTS:-}
TEST_TIMEOUT=${TEST_TIMEOUT:-120}
GPU_ARCH=${GPU_ARCH:-sm_90}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")}
PYTHON=${PYTHON:-python3}

bin=$WORKDIR/bin
logs=$WORKDIR/logs
stats=$WORKDIR/stats
rm -rf "$logs" "$stats"
mkdir -p "$OUTDIR" "$bin" "$logs" "$stats" || exit 1
results=$OUTDIR/results.txt
combined=$OUTDIR/gpu-tests.log
: >"$results"
: >"$combined"
passed=0
failed=0
skipped=0

say() { printf '%s\n' "$*" | tee -a "$results"; }

# record NAME PASS|FAIL|SKIP [DETAIL]: one verdict line, counted.
record() {
    local name=$1 verdict=$2 detail=${3:-}
    case $verdict in
    PASS) passed=$((passed + 1)) ;;
    SKIP) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) ;;
    esac
    say "$verdict $name${detail:+ ($detail)}"
}

# wanted NAME: true when TESTS is empty or matches NAME.
wanted() { [ -z "$TESTS" ] || printf '%s\n' "$1" | grep -Eq -- "$TESTS"; }

# Appends a test's log to the combined log, under a header.
keep_log() {
    { printf '\n===== %s =====\n' "$1"; cat "$logs/$1.log" 2>/dev/null; } >>"$combined"
}

# run_timed NAME CMD...: runs CMD with a timeout, output to $logs/NAME.log; sets rc.
run_timed() {
    local name=$1
    shift
    timeout -k 5 "$TEST_TIMEOUT" "$@" >"$logs/$name.log" 2>&1
    rc=$?
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "TIMEOUT after ${TEST_TIMEOUT}s" >>"$logs/$name.log"
    return 0
}

# exe NAME: path of a built program, or empty when it did not build.
exe() { [ -x "$bin/$1" ] && printf '%s\n' "$bin/$1"; }

# native NAME PROGRAM [ARGS...]: passes when the program exits 0 without the shim.
native() {
    local name=native/$1 program=$2
    shift 2
    wanted "$name" || return 0
    local path
    path=$(exe "$program") || { record "$name" FAIL "$program did not build"; return 0; }
    run_timed "${name//\//_}" env -u LD_PRELOAD "$path" "$@"
    keep_log "${name//\//_}"
    if [ $rc -eq 0 ]; then record "$name" PASS; else record "$name" FAIL "exit $rc, log ${name//\//_}.log"; fi
}

# shim NAME "CONDITIONS" [VAR=VALUE...] -- PROGRAM [ARGS...]:
# runs PROGRAM (a built test, or python3 with a script) under LD_PRELOAD with
# JSON statistics; passes when it exits 0 and every stats condition holds.
shim() {
    local name=shim/$1 conditions=$2
    shift 2
    local -a envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    wanted "$name" || return 0
    local program=$1 path
    shift
    if [ "$program" = "$PYTHON" ]; then path=$PYTHON
    else path=$(exe "$program") || { record "$name" FAIL "$program did not build"; return 0; }; fi
    [ -f "$lib" ] || { record "$name" FAIL "no $lib"; return 0; }
    local log=${name//\//_} stats_file=$stats/${name//\//_}.json
    rm -f "$stats_file"
    run_timed "$log" env LD_PRELOAD="$lib" POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$stats_file" \
        "${envs[@]}" "$path" "$@"
    local program_rc=$rc
    # shellcheck disable=SC2086
    "$PYTHON" "$src/check_stats.py" "$stats_file" $conditions >>"$logs/$log.log" 2>&1
    local stats_rc=$?
    keep_log "$log"
    local skip_line
    skip_line=$(grep -m1 -E '^[a-z_]+: SKIP' "$logs/$log.log")
    if [ $program_rc -ne 0 ]; then record "$name" FAIL "exit $program_rc, log $log.log"
    # a test that cannot run here (one GPU) says so and allocates nothing
    elif [ -n "$skip_line" ] && [ ! -f "$stats_file" ]; then record "$name" SKIP "${skip_line#*SKIP }"
    elif [ $stats_rc -ne 0 ]; then record "$name" FAIL "stats check failed, log $log.log"
    else record "$name" PASS; fi
}

# expect_detect NAME [VAR=VALUE...] -- PROGRAM ARGS: the hazard test under a
# policy that is allowed to corrupt (free_sync=none). Passes when the program
# detected corruption (exit 3), or exited 0 without ever reusing A's range;
# fails when it reused the range and saw nothing (the test could not fail).
expect_detect() {
    local name=shim/$1
    shift
    local -a envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    wanted "$name" || return 0
    local path log=${name//\//_}
    path=$(exe "$1") || { record "$name" FAIL "$1 did not build"; return 0; }
    shift
    [ -f "$lib" ] || { record "$name" FAIL "no $lib"; return 0; }
    run_timed "$log" env LD_PRELOAD="$lib" POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$stats/$log.json" \
        "${envs[@]}" "$path" "$@"
    keep_log "$log"
    local reused
    reused=$(grep -c 'overlap yes' "$logs/$log.log")
    if [ $rc -eq 3 ]; then record "$name" PASS "expected failure: corruption detected, $reused rounds reused A"
    elif [ $rc -eq 0 ] && [ "$reused" -eq 0 ]; then record "$name" PASS "the pool never reused A, nothing to detect"
    elif [ $rc -eq 0 ]; then record "$name" FAIL "A was reused in $reused rounds but no corruption was seen: the test cannot fail"
    else record "$name" FAIL "exit $rc, log $log.log"; fi
}

# ---------------------------------------------------------------- 0. where we are
{
    echo "poolshim GPU suite, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "library: $lib $( [ -f "$lib" ] && echo present || echo MISSING)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4
    "$NVCC" --version 2>&1 | tail -1
} | tee -a "$results"

# ---------------------------------------------------------------- 1. build
nvcc_flags=(-arch="$GPU_ARCH" -lineinfo -O2 -std=c++17 -I"$src")
build() { # build NAME SOURCE [EXTRA FLAGS...]
    local name=$1 source=$2
    shift 2
    rm -f "$bin/$name"
    "$NVCC" "${nvcc_flags[@]}" "$@" -o "$bin/$name" "$src/$source" >"$logs/build_$name.log" 2>&1
}
declare -A sources=(
    [alloc_basic_static]="alloc_basic.cu"
    [alloc_basic_shared]="alloc_basic.cu -cudart shared"
    [alloc_basic_driver]="alloc_basic.cu -DUSE_DRIVER_API -lcuda"
    [hazard_static]="hazard.cu"
    [hazard_shared]="hazard.cu -cudart shared"
    [hazard_ptds]="hazard.cu --default-stream per-thread"
    [async_streams_static]="async_streams.cu"
    [async_streams_shared]="async_streams.cu -cudart shared"
    [misc_static]="misc.cu -lcuda"
    [misc_shared]="misc.cu -cudart shared -lcuda"
    [overhead_static]="overhead.cu"
    [expandable_static]="expandable.cu"
    [peer_static]="peer.cu"
    [capture_threads_static]="capture_threads.cu"
    [capture_threads_shared]="capture_threads.cu -cudart shared"
    [peer_shared]="peer.cu -cudart shared"
    [overhead_shared]="overhead.cu -cudart shared"
    [context_reset_static]="context_reset.cu -lcuda"
    [context_reset_shared]="context_reset.cu -cudart shared -lcuda"
    [pinned_static]="pinned.cu"
    [pinned_shared]="pinned.cu -cudart shared"
)
build_started=$(date +%s)
for name in "${!sources[@]}"; do
    # shellcheck disable=SC2086
    build "$name" ${sources[$name]} &
done
wait
for name in $(printf '%s\n' "${!sources[@]}" | sort); do
    if [ -x "$bin/$name" ]; then
        record "build/$name" PASS
    else
        keep_log "build_$name"
        record "build/$name" FAIL "log build_$name.log"
    fi
done
say "built in $(($(date +%s) - build_started)) s"

# ---------------------------------------------------------------- 2. alloc_basic (both doors)
native alloc_basic_static alloc_basic_static
native alloc_basic_shared alloc_basic_shared
native alloc_basic_driver alloc_basic_driver
shim alloc_basic_static "doors.driver>0 invalid_frees==0 ?doors.runtime>0 ?calls.cuMemAlloc>0 ?calls.cuMemAllocAsync>0" -- alloc_basic_static
shim alloc_basic_shared "doors.runtime>0 calls.cudaMalloc>0 calls.cudaMallocAsync>0 invalid_frees==0 ?doors.driver>0" -- alloc_basic_shared
shim alloc_basic_driver "calls.cuMemAlloc>0 calls.cuMemAllocAsync>0 invalid_frees==0 ?doors.driver>0 ?doors.runtime>0" -- alloc_basic_driver

# ---------------------------------------------------------------- 3. hazard (the cudaFree contract)
for variant in nonblocking blocking legacy; do
    native hazard_$variant hazard_static $variant
    shim hazard_$variant "doors.driver>0 invalid_frees==0 ?fences.recorded>0 ?fences.waits>0" -- hazard_static $variant
done
native hazard_threads_ptds hazard_ptds threads
shim hazard_threads_ptds "doors.driver>0 invalid_frees==0 ?fences.recorded>0" -- hazard_ptds threads
shim hazard_nonblocking_shared "doors.runtime>0 ?fences.recorded>0" -- hazard_shared nonblocking
shim hazard_nonblocking_free_sync_device "doors.driver>0" POOLSHIM_FREE_SYNC=device -- hazard_static nonblocking
shim hazard_threads_free_sync_device "doors.driver>0" POOLSHIM_FREE_SYNC=device -- hazard_ptds threads
expect_detect hazard_nonblocking_free_sync_none_expected_failure POOLSHIM_FREE_SYNC=none -- hazard_static nonblocking
expect_detect hazard_threads_free_sync_none_expected_failure POOLSHIM_FREE_SYNC=none -- hazard_ptds threads
# the barrier (free_sync barrier, the default): every way of touching a reused
# block after the free; each also with a test-only switch that makes the
# barrier do nothing, which must be caught (negative controls)
for variant in newstream graph threads16 threads16cache; do
    native hazard_$variant hazard_static $variant
done
for variant in nonblocking blocking legacy newstream graph threads16 threads16cache; do
    shim hazard_barrier_$variant "doors.driver>0 invalid_frees==0 ?barriers>0" -- hazard_static $variant
done
shim hazard_barrier_nonblocking_counted "doors.driver>0 barriers>0 fences.waits==0" -- hazard_static nonblocking
shim hazard_barrier_threads_ptds "doors.driver>0 invalid_frees==0" -- hazard_ptds threads
shim hazard_barrier_graph_shared "doors.runtime>0 barriers>0" -- hazard_shared graph
shim hazard_barrier_chunks "doors.driver>0 barriers>0 expandable==0" POOLSHIM_OPTIONS=resource.main.expandable=0 -- hazard_static nonblocking
shim hazard_event_nonblocking "doors.driver>0 barriers==0" POOLSHIM_FREE_SYNC=event -- hazard_static nonblocking
# threads16cache: the thread cache's reuse after a barrier (core/thread_cache.c);
# thread_cache_off: the same without the cache, for comparison
shim hazard_barrier_threads16cache_thread_cache_off "doors.driver>0 invalid_frees==0" \
    POOLSHIM_OPTIONS=resource.main.thread_cache=0 -- hazard_static threads16cache
for variant in nonblocking newstream graph threads16 threads16cache; do
    expect_detect hazard_barrier_skipped_${variant}_expected_failure POOLSHIM_TEST_SKIP_BARRIER=1 -- hazard_static $variant
done
expect_detect hazard_barrier_skipped_threads_ptds_expected_failure POOLSHIM_TEST_SKIP_BARRIER=1 -- hazard_ptds threads

# ---------------------------------------------------------------- 3b. expandable pool: holes join
native expandable expandable_static
shim expandable "doors.driver>0 expandable==1" -- expandable_static
# a capture on one thread while another allocates and frees (barriers refused, no legacy-stream record)
for mode in relaxed threadlocal; do
    native capture_threads_$mode capture_threads_static $mode
    shim capture_threads_$mode "doors.driver>0 invalid_frees==0" -- capture_threads_static $mode
    shim capture_threads_${mode}_shared "doors.runtime>0 invalid_frees==0" -- capture_threads_shared $mode
    shim capture_threads_${mode}_event "doors.driver>0" POOLSHIM_FREE_SYNC=event -- capture_threads_static $mode
done
# negative control: with the capture checks switched off the capture must die
# (exit 1: cudaStreamEndCapture fails), or the test could not fail
expect_capture_broken() {
    local name=shim/capture_threads_ignoring_captures_expected_failure
    wanted "$name" || return 0
    local path log=${name//\//_}
    path=$(exe capture_threads_static) || { record "$name" FAIL "capture_threads_static did not build"; return 0; }
    run_timed "$log" env LD_PRELOAD="$lib" POOLSHIM_TEST_IGNORE_CAPTURES=1 "$path" relaxed
    keep_log "$log"
    if [ $rc -eq 1 ] && grep -q "ended with cudaError" "$logs/$log.log"; then
        record "$name" PASS "expected failure: $(grep -o 'ended with [A-Za-z]*' "$logs/$log.log" | head -1)"
    else record "$name" FAIL "the capture survived without the checks (exit $rc): the test cannot fail"; fi
}
expect_capture_broken
# peer access to mapped memory (two GPUs; prints SKIP with one)
native peer_static peer_static
shim peer_static "doors.driver>0 invalid_frees==0" -- peer_static
shim peer_shared "doors.runtime>0 invalid_frees==0" -- peer_shared

# ---------------------------------------------------------------- 4. stream-ordered and graphs
native async_streams_static async_streams_static
native async_streams_shared async_streams_shared
shim async_streams_static "doors.driver>0 calls.cuMemAllocAsync>0|calls.cudaMallocAsync>0" -- async_streams_static
shim async_streams_shared "doors.runtime>0 calls.cudaMallocAsync>0 calls.cudaFreeAsync>0" -- async_streams_shared

# ---------------------------------------------------------------- 5. misc: bad pointers, IPC, ranges, OOM, threads
native misc_static misc_static --expect-ipc=ok
native misc_shared misc_shared --expect-ipc=ok
shim misc_static "doors.driver>0 invalid_frees>=3 ?failures>0" -- misc_static --expect-ipc=error
shim misc_shared "doors.runtime>0 invalid_frees>=3 ?failures>0" -- misc_shared --expect-ipc=error
shim misc_static_passthrough "invalid_frees>=0 ?passthrough>0" POOLSHIM_RESOURCE=cuda -- misc_static --expect-ipc=any

# ---------------------------------------------------------------- 6. resource types as the stack
for resource in pool arena binning cuda async managed; do
    shim stack_${resource}_alloc_basic "doors.driver>0 invalid_frees==0" POOLSHIM_RESOURCE=$resource -- alloc_basic_static
    shim stack_${resource}_hazard "doors.driver>0 invalid_frees==0" POOLSHIM_RESOURCE=$resource -- hazard_static nonblocking
    shim stack_${resource}_hazard_threads "doors.driver>0 invalid_frees==0" POOLSHIM_RESOURCE=$resource -- hazard_ptds threads
done

# ---------------------------------------------------------------- 6b. context lifecycle (cudaDeviceReset & co.)
# context_reset.cu: `runtime` resets with cudaDeviceReset (live, pending and stream
# blocks; 100 resets, memory must not grow); `driver` uses cuDevicePrimaryCtxReset,
# the last cuDevicePrimaryCtxRelease and a cuCtxCreate context. Under the shim the
# stats must count the resets, for every stack (fixed_size: blocks of 1 MiB over a pool).
for kind in static shared; do
    native context_reset_${kind}_runtime context_reset_$kind runtime
    native context_reset_${kind}_driver context_reset_$kind driver
done
for stack in pool arena binning async fixed_over_pool; do
    if [ $stack = fixed_over_pool ]; then
        stack_env=POOLSHIM_OPTIONS=resource.main.type=fixed_size,resource.main.block_size=1MiB,resource.main.upstream=base,resource.base.type=pool
    else
        stack_env=POOLSHIM_RESOURCE=$stack
    fi
    shim context_reset_static_runtime_$stack "doors.driver>0 resets.count>=101 ?resets.dropped_allocations>0" \
        "$stack_env" -- context_reset_static runtime
    shim context_reset_shared_runtime_$stack "doors.runtime>0 resets.count>=101 ?resets.dropped_allocations>0" \
        "$stack_env" -- context_reset_shared runtime
done
shim context_reset_static_driver "doors.driver>0 resets.count>=2 passthrough>0" -- context_reset_static driver
shim context_reset_shared_driver "doors.driver>0 resets.count>=2 passthrough>0" -- context_reset_shared driver

# ---------------------------------------------------------------- 7. Python: PyTorch and CuPy
if "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    native_loss="" shim_loss=""
    if wanted native/torch_train_uncached; then
        name=native_torch_train_uncached
        run_timed $name env -u LD_PRELOAD PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$PYTHON" "$src/torch_train.py" 200
        keep_log $name
        if [ $rc -eq 0 ]; then record native/torch_train_uncached PASS "$(grep RESULT "$logs/$name.log")"
        else record native/torch_train_uncached FAIL "exit $rc, log $name.log"; fi
        native_loss=$(sed -n 's/.*final_loss=\([^ ]*\).*/\1/p' "$logs/$name.log")
    fi
    if wanted shim/torch_train_uncached; then
        shim torch_train_uncached "doors.runtime>0 calls.cudaMalloc>0 invalid_frees==0" \
            PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- "$PYTHON" "$src/torch_train.py" 200
        say "  $(grep RESULT "$logs/shim_torch_train_uncached.log")"
        shim_loss=$(sed -n 's/.*final_loss=\([^ ]*\).*/\1/p' "$logs/shim_torch_train_uncached.log")
    fi
    if wanted native/torch_train_uncached && wanted shim/torch_train_uncached; then
        if [ -n "$native_loss" ] && [ -n "$shim_loss" ] &&
            "$PYTHON" -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-6 * max(abs(a), abs(b)) else 1)' "$native_loss" "$shim_loss"; then
            record shim/torch_loss_matches_native PASS "native $native_loss, shim $shim_loss"
        else
            record shim/torch_loss_matches_native FAIL "native '$native_loss', shim '$shim_loss'"
        fi
    fi
else
    wanted torch_train && record torch_train SKIP "PyTorch with CUDA not available"
fi
if "$PYTHON" -c 'import cupy' >/dev/null 2>&1; then
    if wanted native/cupy_test; then
        run_timed native_cupy_test env -u LD_PRELOAD "$PYTHON" "$src/cupy_test.py"
        keep_log native_cupy_test
        if [ $rc -eq 0 ]; then record native/cupy_test PASS; else record native/cupy_test FAIL "exit $rc, log native_cupy_test.log"; fi
    fi
    # CuPy's wheels link cudart statically: its calls come through the driver door.
    shim cupy_test "doors.runtime>0|doors.driver>0 calls.cudaMalloc>0|calls.cuMemAlloc>0 invalid_frees==0" -- "$PYTHON" "$src/cupy_test.py"
else
    wanted cupy_test && record cupy_test SKIP "CuPy not available"
fi

# ---------------------------------------------------------------- 7b. pinned host pool (cudaHostAlloc/cudaFreeHost)
# An async copy from/to a pinned block, cudaFreeHost, cudaHostAlloc of the same size
# and a host write at once must not change what the copy delivered; the
# negative control (POOLSHIM_TEST_SKIP_HOST_WAIT=1 reuses freed blocks at once)
# must detect corruption. Static cudart reaches us through cuMemHostAlloc /
# cuMemFreeHost (driver door), shared cudart through cudaHostAlloc/cudaFreeHost.
for kind in static shared; do
    native pinned_$kind pinned_$kind hazard
done
shim pinned_static "calls.cuMemHostAlloc>0 calls.cuMemFreeHost>0 host.upstream.allocs>0 invalid_frees==0 ?host.fences.recorded>0 ?host.fences.waits>0 ?host.bound_waits>0" -- pinned_static hazard
shim pinned_shared "calls.cudaHostAlloc>0 calls.cudaFreeHost>0 host.upstream.allocs>0 invalid_frees==0 ?host.fences.recorded>0 ?host.fences.waits>0 ?host.bound_waits>0" -- pinned_shared hazard
shim pinned_static_tiny_bound "host.upstream.allocs>0 invalid_frees==0 ?host.bound_waits>0" \
    POOLSHIM_OPTIONS=host.pending_wait_bytes=0,host.pending_wait_percent=1 -- pinned_static hazard
for kind in static shared; do
    expect_detect pinned_skip_wait_${kind}_expected_failure POOLSHIM_TEST_SKIP_HOST_WAIT=1 -- pinned_$kind hazard
done
if wanted pinned_timing; then
    for kind in static shared; do
        for mode in native shim; do
            name=pinned_timing_${kind}_$mode
            path=$(exe pinned_$kind) || { record "$name" FAIL "not built"; continue; }
            if [ $mode = native ]; then run_timed "$name" env -u LD_PRELOAD "$path" timing
            else run_timed "$name" env LD_PRELOAD="$lib" "$path" timing; fi
            keep_log "$name"
            line=$(grep '^pinned timing' "$logs/$name.log")
            if [ $rc -eq 0 ] && [ -n "$line" ]; then
                record "pinned_timing/$kind/$mode" PASS
                say "  $kind $mode: ${line#pinned timing: }"
            else
                record "pinned_timing/$kind/$mode" FAIL "exit $rc, log $name.log"
            fi
        done
    done
fi

# ---------------------------------------------------------------- 8. overhead of a cudaMalloc+cudaFree pair
if wanted overhead; then
    table=$WORKDIR/overhead.txt
    : >"$table"
    for build_kind in static shared; do
        for mode in native shim_pool shim_passthrough; do
            name=overhead_${build_kind}_$mode
            path=$(exe overhead_$build_kind) || { record "$name" FAIL "not built"; continue; }
            case $mode in
            native) run_timed "$name" env -u LD_PRELOAD "$path" 256 100000 1.5 ;;
            shim_pool) run_timed "$name" env LD_PRELOAD="$lib" POOLSHIM_RESOURCE=pool "$path" 256 100000 1.5 ;;
            shim_passthrough) run_timed "$name" env LD_PRELOAD="$lib" POOLSHIM_RESOURCE=cuda "$path" 256 100000 1.5 ;;
            esac
            keep_log "$name"
            line=$(grep '^RESULT overhead' "$logs/$name.log")
            expect_shim=1
            [ $mode = native ] && expect_shim=0
            if [ $rc -eq 0 ] && [ -n "$line" ] && printf '%s\n' "$line" | grep -q "shim=$expect_shim"; then
                record "overhead/$build_kind/$mode" PASS
                printf '%s %s %s\n' "$build_kind" "$mode" "$line" >>"$table"
            else
                record "overhead/$build_kind/$mode" FAIL "exit $rc, shim=$expect_shim expected, log $name.log"
            fi
        done
    done
    say ""
    say "cudaMalloc+cudaFree pair of 256 B (host clock, median of 100-pair batches):"
    say "$(printf '%-8s %-18s %12s %12s %12s %8s' build mode median_ns p10_ns p90_ns pairs)"
    while read -r build_kind mode _ _ _ pairs median p10 p90 _; do
        say "$(printf '%-8s %-18s %12s %12s %12s %8s' "$build_kind" "$mode" "${median#median_ns=}" \
            "${p10#p10_ns=}" "${p90#p90_ns=}" "${pairs#pairs=}")"
    done <"$table"
fi

# ---------------------------------------------------------------- summary
tar -czf "$OUTDIR/logs.tar.gz" -C "$WORKDIR" logs stats 2>/dev/null
say ""
[ $skipped -gt 0 ] && say "$skipped skipped"
say "$passed passed, $failed failed"
[ $failed -eq 0 ]
