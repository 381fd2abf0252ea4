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
#   PREBUILT=1    keep the programs an earlier run left in WORKDIR/bin (another library, same sources)
#   TEST_TIMEOUT  seconds per test (default 120)
#   GPU_ARCH      nvcc -arch (default sm_90)
#   SOAK_SECONDS  seconds per stack of the soak (section 11; default 20)
#   SANITIZER     compute-sanitizer (default: on PATH, else $CUDA_HOME/bin); the
#                 sanitizer tests (section 9) are SKIPped when it is absent
#   MEMCHECK=1    the whole suite under compute-sanitizer: every `shim` test of a
#                 CUDA program runs under `memcheck --nvtx yes` with POOLSHIM_NVTX=1
#                 (the pool registers its blocks) and passes only when the program
#                 passes as usual AND memcheck reports 0 errors; tests of other kinds
#                 (native runs, negative controls, Python, multi-process) are not run;
#                 API errors are not counted (docs/debugging.md)
#   NVCC, PYTHON  the tools (default nvcc on PATH or $CUDA_HOME/bin/nvcc, python3)
#   MPIRUN        the MPI launcher for the multi-process tests (default mpirun on PATH)
#   MPI_STEPS, DDP_STEPS   work per rank in the mpirun and torchrun tests (3000, 60)
# Several GPUs (section 3c, multi_gpu.cu) and several processes (section 9,
# mp_ranks.cu under mpirun, DDP under torchrun) need two GPUs of one machine;
# with one GPU they are recorded SKIP.
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
MPIRUN=${MPIRUN:-mpirun}
SANITIZER=${SANITIZER:-$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")}
MPI_STEPS=${MPI_STEPS:-3000}
DDP_STEPS=${DDP_STEPS:-60}
cli=$(realpath -m "$build_dir/poolshim")

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
# TESTS: a regex of the tests to run (default all); SKIP_TESTS: a regex of tests
# not to run (to split the suite over several runs).
wanted() {
    # MEMCHECK=1: only the shim tests of CUDA programs (shim() runs them under memcheck)
    [ "${MEMCHECK:-0}" = 1 ] && [ "${FUNCNAME[1]}" != shim ] && return 1
    { [ -z "$TESTS" ] || printf '%s\n' "$1" | grep -Eq -- "$TESTS"; } &&
        { [ -z "${SKIP_TESTS:-}" ] || ! printf '%s\n' "$1" | grep -Eq -- "$SKIP_TESTS"; }
}

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
    local skip_line
    skip_line=$(grep -m1 -E '^[a-z_]+: SKIP' "$logs/${name//\//_}.log")
    if [ $rc -eq 0 ] && [ -n "$skip_line" ]; then skip_line=${skip_line#*SKIP (}; record "$name" SKIP "${skip_line%)}"
    elif [ $rc -eq 0 ]; then record "$name" PASS; else record "$name" FAIL "exit $rc, log ${name//\//_}.log"; fi
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
    if [ "$program" = "$PYTHON" ]; then
        [ "${MEMCHECK:-0}" = 1 ] && return 0
        path=$PYTHON
    else path=$(exe "$program") || { record "$name" FAIL "$program did not build"; return 0; }; fi
    [ -f "$lib" ] || { record "$name" FAIL "no $lib"; return 0; }
    local log=${name//\//_} stats_file=$stats/${name//\//_}.json
    rm -f "$stats_file"
    local -a wrap=()
    if [ "${MEMCHECK:-0}" = 1 ]; then
        [ -x "$SANITIZER" ] || { record "$name" SKIP "MEMCHECK=1 but no compute-sanitizer at $SANITIZER"; return 0; }
        # these check what only the expandable pool does (IPC of a block,
        # remap, growth in place), and debug.nvtx turns it off: compute-sanitizer
        # refuses NVTX heaps over cuMemMap'd pieces (misc_static_chunks runs
        # misc over chunks)
        case $name in shim/misc_static | shim/misc_shared | shim/expandable | shim/remap_idle_*)
            record "$name" SKIP "MEMCHECK=1: expects the expandable pool, which debug.nvtx turns off"; return 0 ;;
        esac
        # LD_PRELOAD reaches the program through the sanitizer; the statistics
        # are asked of the program only (the sanitizer's own process would
        # write an empty file over them); POOLSHIM_NVTX=1 registers every block
        # API errors are not counted: the tests provoke them on purpose (bad
        # frees, out of memory), and so does the shim's capture probe
        # (cuStreamIsCapturing on the legacy stream answers
        # CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while a blocking stream captures)
        wrap=("$SANITIZER" --tool memcheck --nvtx yes --report-api-errors no --print-limit 20
            env POOLSHIM_NVTX=1 POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$stats_file")
        run_timed "$log" env LD_PRELOAD="$lib" "${envs[@]}" "${wrap[@]}" "$path" "$@"
    else
        run_timed "$log" env LD_PRELOAD="$lib" POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$stats_file" \
            "${envs[@]}" "$path" "$@"
    fi
    local program_rc=$rc
    if [ "${MEMCHECK:-0}" = 1 ] && [ $program_rc -eq 0 ] &&
        ! grep -q 'ERROR SUMMARY: 0 errors' "$logs/$log.log"; then
        keep_log "$log"
        record "$name" FAIL "memcheck: $(grep -m1 'ERROR SUMMARY' "$logs/$log.log" || echo 'no summary'), log $log.log"
        return 0
    fi
    # shellcheck disable=SC2086
    "$PYTHON" "$src/check_stats.py" "$stats_file" $conditions >>"$logs/$log.log" 2>&1
    local stats_rc=$?
    keep_log "$log"
    local skip_line
    skip_line=$(grep -m1 -E '^[a-z_]+: SKIP' "$logs/$log.log")
    if [ $program_rc -ne 0 ]; then record "$name" FAIL "exit $program_rc, log $log.log"
    # a test that cannot run here (one GPU) says so and allocates nothing
    elif [ -n "$skip_line" ] && [ ! -f "$stats_file" ]; then skip_line=${skip_line#*SKIP (}; record "$name" SKIP "${skip_line%)}"
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

# expect_corruption NAME [VAR=VALUE...] -- PROGRAM ARGS: a negative control
# under the shim: passes only when the program reports wrong bytes (exit 3),
# proving that the test would see a broken mechanism.
expect_corruption() {
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
    run_timed "$log" env LD_PRELOAD="$lib" "${envs[@]}" "$path" "$@"
    keep_log "$log"
    if [ $rc -eq 3 ]; then record "$name" PASS "expected failure: wrong bytes detected"
    else record "$name" FAIL "exit $rc where the negative control must exit 3 (wrong bytes seen), log $log.log"; fi
}

# expect_out_of_memory NAME [VAR=VALUE...] -- PROGRAM ARGS: a negative control
# under the shim: passes only when the program ran out of memory (exit 2),
# proving that the test would see the mechanism missing.
expect_out_of_memory() {
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
    run_timed "$log" env LD_PRELOAD="$lib" "${envs[@]}" "$path" "$@"
    keep_log "$log"
    if [ $rc -eq 2 ]; then record "$name" PASS "expected failure: $(grep -m1 'out of memory' "$logs/$log.log")"
    else record "$name" FAIL "exit $rc where the negative control must exit 2 (out of memory), log $log.log"; fi
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
    [ "${PREBUILT:-0}" = 1 ] && [ -x "$bin/$name" ] && return 0 # built by an earlier run in this WORKDIR
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
    [remap_idle_static]="remap_idle.cu"
    [release_threshold_static]="release_threshold.cu"
    [oom_retry_static]="oom_retry.cu -lcuda"
    [decay_idle_static]="decay_idle.cu -ldl"
    [oom_retry_shared]="oom_retry.cu -cudart shared -lcuda"
    [neighbours_static]="neighbours.cu"
    [peer_static]="peer.cu"
    [capture_threads_static]="capture_threads.cu"
    [capture_threads_shared]="capture_threads.cu -cudart shared"
    [capture_global_static]="capture_global.cu"
    [capture_global_shared]="capture_global.cu -cudart shared"
    [peer_shared]="peer.cu -cudart shared"
    [overhead_shared]="overhead.cu -cudart shared"
    [context_reset_static]="context_reset.cu -lcuda"
    [context_reset_shared]="context_reset.cu -cudart shared -lcuda"
    [pinned_static]="pinned.cu"
    [pinned_shared]="pinned.cu -cudart shared"
    [pinned_probe_static]="pinned_probe.cu"
    [pinned_vmm_probe_static]="pinned_vmm_probe.cu -lcuda"
    [multi_gpu_static]="multi_gpu.cu"
    [multi_gpu_shared]="multi_gpu.cu -cudart shared"
    [mp_ranks_static]="mp_ranks.cu"
    [mp_ranks_shared]="mp_ranks.cu -cudart shared"
    [sanitize_static]="sanitize.cu"
    [sanitize_shared]="sanitize.cu -cudart shared"
    [soak_static]="soak.cu -lcuda"
    [soak_shared]="soak.cu -cudart shared -lcuda"
    [ipc_static]="ipc.cu -lcuda"
    [ipc_shared]="ipc.cu -cudart shared -lcuda"
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
for variant in newstream graph threads16 threads16cache threads16churn; do
    native hazard_$variant hazard_static $variant
done
for variant in nonblocking blocking legacy newstream graph threads16 threads16cache threads16churn; do
    shim hazard_barrier_$variant "doors.driver>0 invalid_frees==0 ?barriers>0" -- hazard_static $variant
done
shim hazard_barrier_nonblocking_counted "doors.driver>0 barriers>0 fences.waits==0" -- hazard_static nonblocking
shim hazard_barrier_threads_ptds "doors.driver>0 invalid_frees==0" -- hazard_ptds threads
shim hazard_barrier_graph_shared "doors.runtime>0 barriers>0" -- hazard_shared graph
shim hazard_barrier_chunks "doors.driver>0 barriers>0 expandable==0" POOLSHIM_OPTIONS=resource.main.expandable=0 -- hazard_static nonblocking
shim hazard_event_nonblocking "doors.driver>0 barriers==0" POOLSHIM_FREE_SYNC=event -- hazard_static nonblocking
# threads16cache: reuse after a barrier a 64 MiB free provoked (written for the
# per-thread caches when they held cudaFree'd blocks; they no longer do under the
# barrier, so it covers the pool's path); thread_cache_off: the same without caches
shim hazard_barrier_threads16cache_thread_cache_off "doors.driver>0 invalid_frees==0" \
    POOLSHIM_OPTIONS=resource.main.thread_cache=0 -- hazard_static threads16cache
for variant in nonblocking newstream graph threads16 threads16cache threads16churn; do
    expect_detect hazard_barrier_skipped_${variant}_expected_failure POOLSHIM_TEST_SKIP_BARRIER=1 -- hazard_static $variant
done
expect_detect hazard_barrier_skipped_threads_ptds_expected_failure POOLSHIM_TEST_SKIP_BARRIER=1 -- hazard_ptds threads
# the join alone (POOLSHIM_TEST_BARRIER_NO_JOIN=1, the measurement switch of
# tools/bench/torch_mem/ddp.sh): without it, work still running on a non-blocking
# stream is not ordered before the reuse, which must be caught
for variant in nonblocking threads16; do
    expect_detect hazard_barrier_no_join_${variant}_expected_failure POOLSHIM_TEST_BARRIER_NO_JOIN=1 -- hazard_static $variant
done

# ---------------------------------------------------------------- 3b. expandable pool: holes join
native expandable expandable_static
shim expandable "doors.driver>0 expandable==1" -- expandable_static
# remap on growth never unmaps pieces a running kernel uses: busy lends their memory (remap_lend, the
# default: mapped a second time for B, the old addresses unmapped once their barrier passed), or with
# remap_lend=0 waits (host) for the barrier that released them; idle (the releasing barrier passed)
# needs neither; POOLSHIM_TEST_ASSUME_IDLE=1 (every barrier counts as passed),
# POOLSHIM_TEST_RETURN_LENT=1 (lent addresses unmapped at once) and POOLSHIM_TEST_WAIT_RETURNS=1 (the
# wait returns at once) must make the busy run fault: the negative controls
# A (256 MiB, made before any free) must be pieces, as in a loop: as a setup run
# (expandable_setup_run_min) the 1 MiB block cut from its hole would pin it and nothing would move.
pieces=resource.main.expandable_setup_run_min=0
for mode in busy idle; do native remap_idle_$mode remap_idle_static $mode; done
shim remap_idle_busy "doors.driver>0 expandable==1 remaps_lent>0 remap_waits==0 remaps_idle==0" \
    POOLSHIM_OPTIONS=$pieces -- remap_idle_static busy
shim remap_idle_busy_wait "doors.driver>0 expandable==1 remap_waits>0 remaps_idle==0 remaps_lent==0" \
    POOLSHIM_OPTIONS=resource.main.remap_lend=0,$pieces -- remap_idle_static busy
shim remap_idle_idle "doors.driver>0 expandable==1 remaps_idle>0 remap_syncs==0" POOLSHIM_OPTIONS=$pieces \
    -- remap_idle_static idle
expect_corruption remap_idle_assume_idle_expected_failure POOLSHIM_TEST_ASSUME_IDLE=1 POOLSHIM_OPTIONS=$pieces \
    -- remap_idle_static busy
expect_corruption remap_idle_return_lent_expected_failure POOLSHIM_TEST_RETURN_LENT=1 POOLSHIM_OPTIONS=$pieces \
    -- remap_idle_static busy
expect_corruption remap_idle_wait_returns_expected_failure POOLSHIM_TEST_WAIT_RETURNS=1 \
    POOLSHIM_OPTIONS=resource.main.remap_lend=0,$pieces -- remap_idle_static busy
# release_threshold: cudaDeviceSynchronize gives free memory back (and keeps it without the option)
native release_threshold release_threshold_static released
shim release_threshold "doors.driver>0 upstream.frees>0" \
    POOLSHIM_OPTIONS=resource.main.release_threshold=0,global.meminfo=device -- release_threshold_static released
shim release_threshold_off "doors.driver>0 upstream.frees==0" POOLSHIM_OPTIONS=global.meminfo=device \
    -- release_threshold_static kept
# out of memory beside the pool (the retry after a give-back): 80% of the card cudaMalloc'd and freed, then the same
# bytes through cuMemCreate (from libcuda, or from the runtime's entry point as NCCL and PyTorch get
# it) and cudaMallocManaged: natively the memory is back at the free; under the shim the pool gives
# it back on CUDA's first "out of memory" (global.oom_retry); with the retry off cuMemCreate must run
# out of memory (the negative controls)
for mode in direct entry; do
    native oom_retry_$mode oom_retry_static $mode
    shim oom_retry_$mode "doors.driver>0 oom_retry.succeeded>0 oom_retry.failed==0 oom_retry.given_back>0 \
?oom_retry.skipped_capture>=0" -- oom_retry_static $mode
    expect_out_of_memory oom_retry_${mode}_off_expected_failure POOLSHIM_OPTIONS=global.oom_retry=0 -- oom_retry_static $mode
done
native oom_retry_shared oom_retry_shared entry
shim oom_retry_shared "doors.runtime>0 oom_retry.succeeded>0 oom_retry.failed==0 oom_retry.given_back>0" \
    -- oom_retry_shared entry
expect_out_of_memory oom_retry_shared_off_expected_failure POOLSHIM_OPTIONS=global.oom_retry=0 -- oom_retry_shared entry
# the decay (memory goes back while idle): a program takes 80% of the card, frees it all and idles; what NVML says it
# holds must fall back to its baseline (the context) once the decay time has passed and the pieces
# are unmapped (POOLSHIM_DECAY_MS; 112 GiB of 2 MiB pieces take 2.5 s to unmap on one H200, 6+ s
# with a peer GPU mapping them: the default 5000 ms is waited for up to 10 s, 1000 ms up to 6 s),
# natively at once. The negative control: the decay
# off, the memory stays in the pool (decay_idle exits 1 saying what the process still holds).
expect_held() { # expect_held NAME [VAR=VALUE...] -- PROGRAM ARGS
    local name=shim/$1
    shift
    local -a envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    wanted "$name" || return 0
    local path log=${name//\//_}
    path=$(exe "$1") || { record "$name" FAIL "$1 did not build"; return 0; }
    shift
    run_timed "$log" env LD_PRELOAD="$lib" "${envs[@]}" "$path" "$@"
    keep_log "$log"
    if [ $rc -eq 1 ] && grep -q 'still holds' "$logs/$log.log"; then
        record "$name" PASS "expected failure: $(grep -m1 'still holds' "$logs/$log.log")"
    else record "$name" FAIL "exit $rc where the negative control must exit 1 (memory still held), log $log.log"; fi
}
native decay_idle decay_idle_static 3000
shim decay_idle_default "give_back.decay>0" -- decay_idle_static 10000
shim decay_idle_1s "give_back.decay>0" POOLSHIM_DECAY_MS=1000 -- decay_idle_static 6000
expect_held decay_idle_off_expected_failure POOLSHIM_DECAY_MS=0 -- decay_idle_static 3000
# neighbours (processes under the shim give each other memory): A (`neighbours give`) cudaMallocs 80% of the card in 64 MiB blocks, frees it
# and sleeps; B (`neighbours take`), started once A freed it, cudaMallocs 80%. Natively B gets it at
# once. Both under the shim (decay off, so only the neighbours can give): B asks A
# (global.neighbour_release) and must have it within 1 s; A's stats show bytes given to neighbours,
# B's an answered request. The negative control: neighbour_release=0 and decay_ms=0 in both, B must
# run out of memory. B without the shim beside a shimmed A with POOLSHIM_DECAY_MS=1000 (B retries
# for up to 5 s): B gets the memory once A's decay gave it back, not before (this row checks the
# decay, not the neighbours).
# neighbours_pair NAME EXPECT A_MODE B_MODE B_RETRY_S "A_CONDITIONS" "B_CONDITIONS" "B_CHECKS" [A:VAR=VALUE|B:VAR=VALUE...]
#   MODE: native or shim; EXPECT: pass (B exits 0) or out_of_memory (B exits 2: a negative control);
#   CONDITIONS: check_stats.py conditions on a shimmed program's statistics; B_CHECKS: FIELD<N or
#   FIELD>=N words on B's RESULT line (slowest_ms, waited_ms, came_after_free_ms).
neighbours_pair() {
    local name=neighbours/$1 expect=$2 a_mode=$3 b_mode=$4 retry=$5 a_conditions=$6 b_conditions=$7 b_checks=$8
    shift 8
    wanted "$name" || return 0
    local -a a_env=() b_env=()
    local word
    for word in "$@"; do
        case $word in A:*) a_env+=("${word#A:}") ;; B:*) b_env+=("${word#B:}") ;; esac
    done
    local path log=${name//\//_} dir=$WORKDIR/${name//\//_}
    path=$(exe neighbours_static) || { record "$name" FAIL "neighbours_static did not build"; return 0; }
    [ -f "$lib" ] || { record "$name" FAIL "no $lib"; return 0; }
    local a_stats=$stats/${log}_a.json b_stats=$stats/${log}_b.json
    rm -rf "$dir" "$a_stats" "$b_stats"
    mkdir -p "$dir"
    local -a a_run=(env -u LD_PRELOAD) b_run=(env -u LD_PRELOAD)
    [ "$a_mode" = shim ] && a_run=(env LD_PRELOAD="$lib" POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$a_stats")
    [ "$b_mode" = shim ] && b_run=(env LD_PRELOAD="$lib" POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$b_stats")
    timeout -k 5 "$TEST_TIMEOUT" "${a_run[@]}" "${a_env[@]}" "$path" give "$dir" >"$logs/${log}_a.log" 2>&1 &
    local a_pid=$! i
    for ((i = 0; i < 10 * TEST_TIMEOUT; i++)); do
        [ -f "$dir/ready" ] || ! kill -0 "$a_pid" 2>/dev/null && break
        sleep 0.1
    done
    if [ ! -f "$dir/ready" ]; then
        kill "$a_pid" 2>/dev/null
        wait "$a_pid"
        cp "$logs/${log}_a.log" "$logs/$log.log"
        keep_log "$log"
        record "$name" FAIL "A did not free its memory, log $log.log"
        return 0
    fi
    run_timed "${log}_b" "${b_run[@]}" "${b_env[@]}" "$path" take "$dir" "$retry"
    local b_rc=$rc
    touch "$dir/release"
    wait "$a_pid"
    local a_rc=$?
    {
        echo "--- A: $a_mode ${a_env[*]}: exit $a_rc"
        cat "$logs/${log}_a.log"
        echo "--- B: $b_mode ${b_env[*]}: exit $b_rc"
        cat "$logs/${log}_b.log"
    } >"$logs/$log.log"
    local result detail="" bad="" check field op limit value
    result=$(grep -m1 '^RESULT neighbours take' "$logs/${log}_b.log")
    if [ "$expect" = out_of_memory ]; then
        if [ $b_rc -eq 2 ]; then record "$name" PASS "expected failure: $(grep -m1 'out of memory' "$logs/${log}_b.log")"
        else record "$name" FAIL "exit $b_rc where the negative control must exit 2 (out of memory), log $log.log"; fi
        keep_log "$log"
        return 0
    fi
    [ $a_rc -eq 0 ] || bad="A exit $a_rc"
    [ $b_rc -eq 0 ] || bad="${bad:+$bad, }B exit $b_rc"
    # shellcheck disable=SC2086
    if [ "$a_mode" = shim ] && [ -n "$a_conditions" ]; then
        echo "--- A's statistics" >>"$logs/$log.log"
        "$PYTHON" "$src/check_stats.py" "$a_stats" $a_conditions >>"$logs/$log.log" 2>&1 || bad="${bad:+$bad, }A's stats"
    fi
    # shellcheck disable=SC2086
    if [ "$b_mode" = shim ] && [ -n "$b_conditions" ]; then
        echo "--- B's statistics" >>"$logs/$log.log"
        "$PYTHON" "$src/check_stats.py" "$b_stats" $b_conditions >>"$logs/$log.log" 2>&1 || bad="${bad:+$bad, }B's stats"
    fi
    for check in $b_checks; do
        field=${check%%[<>=]*}
        op=${check#"$field"}
        limit=${op##*[<>=]}
        op=${op%"$limit"}
        value=$(printf '%s\n' "$result" | grep -o "$field=[0-9.-]*" | cut -d= -f2)
        detail="${detail:+$detail, }$field=${value:-?}"
        awk -v v="${value:-nan}" -v l="$limit" -v o="$op" 'BEGIN {
            ok = (o == "<" && v + 0 < l + 0) || (o == "<=" && v + 0 <= l + 0) || (o == ">" && v + 0 > l + 0) ||
                 (o == ">=" && v + 0 >= l + 0); exit !(ok && v != "nan") }' || bad="${bad:+$bad, }$check"
    done
    keep_log "$log"
    if [ -n "$bad" ]; then record "$name" FAIL "$bad; ${detail:+$detail, }log $log.log"
    else record "$name" PASS "$detail"; fi
}
neighbours_pair native pass native native 0 "" "" ""
neighbours_pair shim pass shim shim 0 "give_back.to_neighbours>0" \
    "give_back.neighbour_requests>0 give_back.neighbour_answers>0 give_back.from_neighbours>0" "slowest_ms<1000" \
    A:POOLSHIM_DECAY_MS=0 B:POOLSHIM_DECAY_MS=0
neighbours_pair shim_off_expected_failure out_of_memory shim shim 0 "" "" "" \
    A:POOLSHIM_OPTIONS=global.neighbour_release=0,global.decay_ms=0 \
    B:POOLSHIM_OPTIONS=global.neighbour_release=0,global.decay_ms=0
neighbours_pair native_beside_shim_decay pass shim native 5 "give_back.decay>0 give_back.to_neighbours==0" "" \
    "came_after_free_ms>=700" A:POOLSHIM_DECAY_MS=1000
# the target for memory going back: beside a shimmed program with the default decay (5 s),
# an unshimmed one gets the freed 80% of the card within the decay time
neighbours_pair native_beside_shim_default_decay pass shim native 12 "give_back.decay>0 give_back.to_neighbours==0" "" \
    "came_after_free_ms<=5000"
# a capture on one thread while another allocates and frees (barriers refused, no legacy-stream record)
for mode in relaxed threadlocal; do
    native capture_threads_$mode capture_threads_static $mode
    shim capture_threads_$mode "doors.driver>0 invalid_frees==0" -- capture_threads_static $mode
    shim capture_threads_${mode}_shared "doors.runtime>0 invalid_frees==0" -- capture_threads_shared $mode
    shim capture_threads_${mode}_event "doors.driver>0" POOLSHIM_FREE_SYNC=event -- capture_threads_static $mode
    # the arena takes the barrier too (core/reuse.c): the capture must survive there as well
    shim capture_threads_${mode}_arena "doors.driver>0 invalid_frees==0" POOLSHIM_RESOURCE=arena -- capture_threads_static $mode
    shim capture_threads_${mode}_arena_shared "doors.runtime>0 invalid_frees==0" POOLSHIM_RESOURCE=arena -- capture_threads_shared $mode
    # a non-blocking capturing stream whose block another thread frees on its own
    # stream, and stacks that synchronize at a free: no stack may make the
    # capturing stream wait or synchronize the device during the capture
    native capture_threads_${mode}_nonblocking capture_threads_static $mode nonblocking
    for stack in default:POOLSHIM_RESOURCE=pool device:POOLSHIM_FREE_SYNC=device arena:POOLSHIM_RESOURCE=arena \
        arena_device:POOLSHIM_RESOURCE=arena,POOLSHIM_FREE_SYNC=device binning_device:POOLSHIM_RESOURCE=binning,POOLSHIM_FREE_SYNC=device; do
        # shellcheck disable=SC2046
        shim capture_threads_${mode}_nonblocking_${stack%%:*} "invalid_frees==0" $(tr , ' ' <<<"${stack#*:}") -- \
            capture_threads_static $mode nonblocking
    done
done
# negative control of the non-blocking case: without the capture checks, the
# pool's synchronize at a free (free_sync device) must end the capture
expect_nonblocking_capture_broken() {
    local name=shim/capture_threads_nonblocking_ignoring_captures_expected_failure
    wanted "$name" || return 0
    local path log=${name//\//_}
    path=$(exe capture_threads_static) || { record "$name" FAIL "capture_threads_static did not build"; return 0; }
    run_timed "$log" env LD_PRELOAD="$lib" POOLSHIM_TEST_IGNORE_CAPTURES=1 POOLSHIM_FREE_SYNC=device "$path" threadlocal nonblocking
    keep_log "$log"
    # (CUDA refuses the synchronize during the capture: the free fails, or the capture dies)
    if [ $rc -ne 0 ] && grep -q "ended with cudaError\|returned 90\|could not take the block back" "$logs/$log.log"; then
        record "$name" PASS "expected failure: $(grep -o 'ended with [A-Za-z]*\|returned 90[0-9] ([A-Za-z]*)\|could not take the block back ([a-zA-Z ]*' "$logs/$log.log" | head -1)"
    else record "$name" FAIL "the capture survived without the checks (exit $rc): the test cannot fail"; fi
}
expect_nonblocking_capture_broken
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
# global capture mode (capture_global.cu): another thread's cudaFree/cudaMalloc
# during the capture, in global and then relaxed mode. The program prints one
# RESULT line with CUDA's answer to each call and how the capture ended; under
# the shim (pool, arena; static and shared cudart) it must be the native line.
# same_as_native NAME PROGRAM ARG -- STACK_ENV...: one verdict per stack.
same_as_native() {
    local base=$1 program=$2 arg=$3
    shift 4
    local path native_line
    path=$(exe "$program") || { record "native/$base" FAIL "$program did not build"; return 0; }
    if wanted "native/$base" || wanted "shim/$base"; then
        run_timed "native_$base" env -u LD_PRELOAD "$path" "$arg"
        keep_log "native_$base"
        native_line=$(grep -m1 ' RESULT ' "$logs/native_$base.log")
        if [ $rc -eq 0 ] && [ -n "$native_line" ]; then record "native/$base" PASS "${native_line#* RESULT }"
        else record "native/$base" FAIL "exit $rc, log native_$base.log"; return 0; fi
    fi
    local stack_env stack name log line
    for stack_env in "$@"; do
        stack=${stack_env#POOLSHIM_RESOURCE=}
        name=shim/${base}_$stack
        wanted "$name" || continue
        log=${name//\//_}
        run_timed "$log" env LD_PRELOAD="$lib" "$stack_env" "$path" "$arg"
        keep_log "$log"
        line=$(grep -m1 ' RESULT ' "$logs/$log.log")
        if [ $rc -ne 0 ]; then record "$name" FAIL "exit $rc, log $log.log"
        elif [ "$line" = "$native_line" ]; then record "$name" PASS "as native: ${line#* RESULT }"
        else record "$name" FAIL "native '${native_line#* RESULT }', shim '${line#* RESULT }'"; fi
    done
}
for kind in blocking nonblocking; do
    same_as_native capture_global_${kind} capture_global_static $kind -- POOLSHIM_RESOURCE=pool POOLSHIM_RESOURCE=arena
    same_as_native capture_global_${kind}_shared capture_global_shared $kind -- POOLSHIM_RESOURCE=pool POOLSHIM_RESOURCE=arena
done
# peer access to mapped memory (two GPUs; prints SKIP with one)
native peer_static peer_static
shim peer_static "doors.driver>0 invalid_frees==0" -- peer_static
shim peer_shared "doors.runtime>0 invalid_frees==0" -- peer_shared

# ---------------------------------------------------------------- 3c. several GPUs in one process
# multi_gpu.cu (two GPUs; each case prints SKIP with one): blocks freed with the
# other device current and cudaMemGetInfo per device (cross), device 1's kernels
# on device-0 memory with peer access granted before / after device 0 allocated
# (peer_before, peer_after), peer copies (copies), 16 threads switching devices
# (threads), per-device stacks from multi_gpu_stacks.ini (stacks). Every block
# must come back to its own device: requested bytes of each device end at 0.
gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
for kind in static shared; do
    door=driver
    [ $kind = shared ] && door=runtime
    for case in cross peer_before peer_after copies order mempool threads; do
        native multi_gpu_${case}_$kind multi_gpu_$kind $case
        shim multi_gpu_${case}_$kind "device0.doors.$door>0 device1.doors.$door>0 invalid_frees==0 \
device0.bytes.requested_current==0 device1.bytes.requested_current==0 ?barriers>0" -- multi_gpu_$kind $case
    done
    # the copies across devices under every other stack: chunks, arena, binning, async upstream
    for stack in chunks arena binning async; do
        case $stack in
        chunks) opts=(POOLSHIM_OPTIONS=resource.main.expandable=0) ;;
        arena) opts=(POOLSHIM_CONFIG="$repo/config/examples/arena_many_threads.ini") ;;
        binning) opts=(POOLSHIM_CONFIG="$repo/config/examples/binning_small_sizes.ini") ;;
        async) opts=(POOLSHIM_CONFIG="$repo/config/examples/async_upstream.ini") ;;
        esac
        for case in cross copies order mempool; do
            shim multi_gpu_${case}_${stack}_$kind "invalid_frees==0 device0.bytes.requested_current==0 \
device1.bytes.requested_current==0" "${opts[@]}" -- multi_gpu_$kind $case
        done
    done
    native multi_gpu_stacks_$kind multi_gpu_$kind stacks
    # device 0: the pool (expandable, no limit, 512 MiB held); device 1: the arena
    # behind 256 MiB, which refused the request past it
    shim multi_gpu_stacks_$kind "device0.stack==dev0pool device1.stack==dev1cap device0.expandable==1 \
device1.expandable==0 device0.failures==0 device1.failures>=1 device0.bytes.requested_peak>=536870912 \
device1.bytes.requested_peak<=268435456 device0.bytes.requested_current==0 device1.bytes.requested_current==0 \
invalid_frees==0" POOLSHIM_CONFIG="$src/multi_gpu_stacks.ini" -- multi_gpu_$kind stacks 256
done
# NCCL user-buffer registration of pooled memory (nccl_register.cu), one process on two
# GPUs, against the NCCL of the pip package nvidia-nccl-cu13 when it is installed
nccl_dir=$("$PYTHON" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
if wanted shim/nccl_register_static || wanted native/nccl_register_static; then
    if [ -n "$nccl_dir" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
        build nccl_register_static nccl_register.cu -I"$nccl_dir/include" -L"$nccl_dir/lib" -l:libnccl.so.2 \
            -Xlinker -rpath="$nccl_dir/lib" || keep_log build_nccl_register_static
        export NCCL_NVLS_ENABLE=0
        native nccl_register_static nccl_register_static
        shim nccl_register_static "invalid_frees==0 device0.bytes.requested_current==0" -- nccl_register_static
        # the buffers made after a small block are one run each (setup runs, mapped apart); with setup runs off
        # they start inside the small block's piece and span several: NCCL must give the native sum both ways
        shim nccl_register_pieces_static "invalid_frees==0 device0.bytes.requested_current==0" \
            POOLSHIM_OPTIONS=resource.main.expandable_setup_run_min=0 -- nccl_register_static
    else
        record shim/nccl_register_static SKIP "no NCCL (pip nvidia-nccl-cu13) for $PYTHON"
    fi
fi
# expect_multi_gpu_failure NAME WHAT [VAR=VALUE...] -- ARGS: a negative control
# of multi_gpu_static: passes when the program failed (exit 1 with a line matching
# WHAT, or exit 3: wrong bytes), SKIP with one GPU, fails when it passed.
expect_multi_gpu_failure() {
    local name=shim/$1 what=$2
    shift 2
    local -a envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    wanted "$name" || return 0
    local path log=${name//\//_}
    path=$(exe multi_gpu_static) || { record "$name" FAIL "multi_gpu_static did not build"; return 0; }
    run_timed "$log" env LD_PRELOAD="$lib" "${envs[@]}" "$path" "$@"
    keep_log "$log"
    local skip_line seen
    skip_line=$(grep -m1 -E '^[a-z_]+: SKIP' "$logs/$log.log")
    seen=$(grep -m1 -E "$what" "$logs/$log.log")
    if [ $rc -eq 0 ] && [ -n "$skip_line" ]; then skip_line=${skip_line#*SKIP (}; record "$name" SKIP "${skip_line%)}"
    elif [ $rc -eq 3 ]; then record "$name" PASS "expected failure: wrong bytes seen"
    elif [ $rc -eq 1 ] && [ -n "$seen" ]; then record "$name" PASS "expected failure: ${seen:0:160}"
    elif [ $rc -eq 0 ]; then record "$name" FAIL "it passed without what it checks: the test cannot fail"
    else record "$name" FAIL "exit $rc without the expected failure, log $log.log"; fi
}
# without the peer grants on mapped memory, device 1's kernel must fault (or read wrong bytes)
expect_multi_gpu_failure multi_gpu_peer_without_grant_expected_failure 'FAIL .*returned' \
    POOLSHIM_TEST_SKIP_PEER_GRANT=1 -- peer_before
# without the grant of every device that can reach it, mapped memory refuses a copy made
# while the other device is current (invalid value); without the ordering of such copies
# (shim/copy_order.c) they run beside the other device's kernels: wrong bytes
expect_multi_gpu_failure multi_gpu_cross_without_grant_expected_failure 'returned 1 \(cudaErrorInvalidValue\)' \
    POOLSHIM_TEST_SKIP_PEER_GRANT=1 -- cross
expect_multi_gpu_failure multi_gpu_order_without_ordering_expected_failure 'CORRUPTION' \
    POOLSHIM_TEST_SKIP_COPY_ORDER=1 -- order
expect_multi_gpu_failure multi_gpu_copies_without_ordering_expected_failure 'CORRUPTION' \
    POOLSHIM_TEST_SKIP_COPY_ORDER=1 -- copies
# without the per-device config, device 1 has no limit and the test must notice
expect_multi_gpu_failure multi_gpu_stacks_without_config_expected_failure 'stack is not the configured one' \
    -- stacks 256

# ---------------------------------------------------------------- 4. stream-ordered and graphs
native async_streams_static async_streams_static
native async_streams_shared async_streams_shared
shim async_streams_static "doors.driver>0 calls.cuMemAllocAsync>0|calls.cudaMallocAsync>0" -- async_streams_static
shim async_streams_shared "doors.runtime>0 calls.cudaMallocAsync>0 calls.cudaFreeAsync>0" -- async_streams_shared

# ---------------------------------------------------------------- 5. misc: bad pointers, IPC, ranges, OOM, threads
native misc_static misc_static --expect-ipc=ok
native misc_shared misc_shared --expect-ipc=ok
# (the expandable pool exports pooled blocks, see 5b; the chunked pool refuses)
shim misc_static "doors.driver>0 invalid_frees>=3 ipc.exported>=1 ?failures>0" -- misc_static --expect-ipc=ok
shim misc_shared "doors.runtime>0 invalid_frees>=3 ipc.exported>=1 ?failures>0" -- misc_shared --expect-ipc=ok
shim misc_static_chunks "doors.driver>0 expandable==0 ipc.refused>=1 ?failures>0" POOLSHIM_OPTIONS=resource.main.expandable=0 -- misc_static --expect-ipc=error
shim misc_static_passthrough "invalid_frees>=0 ?passthrough>0" POOLSHIM_RESOURCE=cuda -- misc_static --expect-ipc=any

# ---------------------------------------------------------------- 5b. IPC of pooled memory between two processes
# ipc.cu: the parent exports a cudaMalloc'ed block, a fork+exec'ed child (under the
# shim too: LD_PRELOAD is inherited) opens, verifies and writes it, the parent sees
# the writes; under the shim also its own and a stale handle are refused. Refused
# outright over the chunked pool and with global.ipc=0. Made before the first free,
# the 37 MiB block is one physical allocation (a setup run); ipc_*_pieces turn setup
# runs off so it is 19 pieces, as a block made in a loop is. Negative control: the
# test switch POOLSHIM_TEST_IPC_SKEW=1 maps the pieces out of order: must exit 3 (on
# the pieces: a block of one piece has no order to get wrong).
native ipc_static ipc_static
native ipc_shared ipc_shared
shim ipc_static "doors.driver>0 invalid_frees==0 expandable==1 ipc.exported>=1 ipc.refused>=1" -- ipc_static
shim ipc_shared "doors.runtime>0 invalid_frees==0 expandable==1 ipc.exported>=1 ipc.refused>=1" -- ipc_shared
shim ipc_refused_chunks "doors.driver>0 expandable==0 ipc.refused>=1 ipc.exported==0" POOLSHIM_OPTIONS=resource.main.expandable=0 -- ipc_static --expect=refused
shim ipc_refused_ipc_off "doors.runtime>0 ipc.refused>=1 ipc.exported==0" POOLSHIM_OPTIONS=global.ipc=0 -- ipc_shared --expect=refused
shim ipc_static_pieces "doors.driver>0 invalid_frees==0 expandable==1 ipc.exported>=1 ipc.refused>=1" \
    POOLSHIM_OPTIONS=resource.main.expandable_setup_run_min=0 -- ipc_static
shim ipc_shared_pieces "doors.runtime>0 invalid_frees==0 expandable==1 ipc.exported>=1 ipc.refused>=1" \
    POOLSHIM_OPTIONS=resource.main.expandable_setup_run_min=0 -- ipc_shared
expect_corruption ipc_skew_detected POOLSHIM_TEST_IPC_SKEW=1 POOLSHIM_OPTIONS=resource.main.expandable_setup_run_min=0 \
    -- ipc_static

# ---------------------------------------------------------------- 6. resource types as the stack
for resource in pool arena binning cuda async managed; do
    shim stack_${resource}_alloc_basic "doors.driver>0 invalid_frees==0" POOLSHIM_RESOURCE=$resource -- alloc_basic_static
    shim stack_${resource}_hazard "doors.driver>0 invalid_frees==0" POOLSHIM_RESOURCE=$resource -- hazard_static nonblocking
    shim stack_${resource}_hazard_threads "doors.driver>0 invalid_frees==0" POOLSHIM_RESOURCE=$resource -- hazard_ptds threads
done

# ---------------------------------------------------------------- 6a. the barrier per resource (core/reuse.c)
# arena, binning (fixed_size bins over a pool) and fixed_size (one 16 MiB bin,
# one block per batch, so a freed block is reused) take the barrier like the
# pool: every hazard variant, the count of barriers with no host wait, and
# the negative control (POOLSHIM_TEST_SKIP_BARRIER=1) that must detect
# corruption for each: must_detect fails when nothing was reused.
must_detect() {
    local name=shim/$1
    shift
    local -a envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    wanted "$name" || return 0
    local path log=${name//\//_}
    path=$(exe "$1") || { record "$name" FAIL "$1 did not build"; return 0; }
    shift
    run_timed "$log" env LD_PRELOAD="$lib" "${envs[@]}" "$path" "$@"
    keep_log "$log"
    local reused
    reused=$(grep -c 'overlap yes' "$logs/$log.log")
    if [ $rc -eq 3 ]; then record "$name" PASS "expected failure: corruption detected, $reused rounds reused A"
    elif [ $rc -eq 0 ] && [ "$reused" -eq 0 ]; then record "$name" FAIL "A was never reused: the control proves nothing for this stack"
    elif [ $rc -eq 0 ]; then record "$name" FAIL "A was reused in $reused rounds but no corruption was seen: the test cannot fail"
    else record "$name" FAIL "exit $rc, log $log.log"; fi
}
# shellcheck disable=SC2054 # the commas are inside one POOLSHIM_OPTIONS value
declare -A barrier_stacks=(
    [arena]=POOLSHIM_RESOURCE=arena
    [binning]=POOLSHIM_RESOURCE=binning
    [fixed]=POOLSHIM_OPTIONS=resource.main.type=fixed_size,resource.main.block_size=16MiB,resource.main.blocks_per_batch=1
)
# binning: its 16 MiB round goes to the fallback pool, which below its barrier floor
# (32 MiB) grows instead of issuing a barrier (the floor working as designed), so A
# would never be reused and the controls would prove nothing; these runs turn the
# floor off there (the default-floor binning stack runs in section 5 above).
for stack in arena binning fixed; do
    stack_env=${barrier_stacks[$stack]}
    extra=()
    [ $stack = binning ] && extra=(POOLSHIM_OPTIONS=resource.binning_fallback.barrier_floor=0)
    for variant in nonblocking blocking legacy newstream graph threads16; do
        shim hazard_barrier_${stack}_$variant "doors.driver>0 invalid_frees==0 ?barriers>0" "$stack_env" "${extra[@]}" -- hazard_static $variant
    done
    shim hazard_barrier_${stack}_counted "doors.driver>0 barriers>0 fences.waits==0" "$stack_env" "${extra[@]}" -- hazard_static nonblocking
    shim hazard_barrier_${stack}_threads_ptds "doors.driver>0 invalid_frees==0" "$stack_env" "${extra[@]}" -- hazard_ptds threads
    shim hazard_barrier_${stack}_shared "doors.runtime>0 invalid_frees==0 barriers>0" "$stack_env" "${extra[@]}" -- hazard_shared nonblocking
    shim hazard_event_${stack} "doors.driver>0 barriers==0" "$stack_env" "${extra[@]}" POOLSHIM_FREE_SYNC=event -- hazard_static nonblocking
    for variant in nonblocking newstream graph threads16; do
        must_detect hazard_barrier_skipped_${stack}_${variant}_expected_failure "$stack_env" "${extra[@]}" POOLSHIM_TEST_SKIP_BARRIER=1 -- hazard_static $variant
    done
done
# capacity at large sizes: 1 GiB blocks until the device is full,
# as many under the arena and the pool as natively (expandable.cu prints the
# count; its exit 2, the chunked stacks' failed big block, is not judged here)
if wanted fill_count; then
    fill_native=""
    for mode in native pool arena; do
        name=fill_count_$mode
        path=$(exe expandable_static) || { record "fill_count/$mode" FAIL "not built"; continue; }
        if [ $mode = native ]; then run_timed "$name" env -u LD_PRELOAD "$path"
        else run_timed "$name" env LD_PRELOAD="$lib" POOLSHIM_RESOURCE=$mode "$path"; fi
        keep_log "$name"
        count=$(sed -n 's/.*filled the device with \([0-9]*\) blocks.*/\1/p' "$logs/$name.log" | head -1)
        if [ -z "$count" ] || { [ $rc -ne 0 ] && [ $rc -ne 2 ]; }; then
            record "fill_count/$mode" FAIL "exit $rc, log $name.log"
        elif [ $mode = native ]; then
            fill_native=$count
            record "fill_count/native" PASS "$count blocks of 1 GiB"
        elif [ -n "$fill_native" ] && [ "$count" -ge "$fill_native" ]; then
            record "fill_count/$mode" PASS "$count blocks of 1 GiB, native $fill_native"
        else
            record "fill_count/$mode" FAIL "$count blocks of 1 GiB, native ${fill_native:-unknown}"
        fi
    done
fi

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

# ---------------------------------------------------------------- 7. Python: PyTorch, CuPy, numba
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
    # poolshim.torch: PyTorch's allocator replaced by the torch door (no LD_PRELOAD).
    # record: Tensor.record_stream honoured (the negative control, the door ignoring
    # it, must be caught: exit 1); train: the loss of PyTorch's own allocator.
    door_env=(env -u LD_PRELOAD -u PYTORCH_NO_CUDA_MEMORY_CACHING POOLSHIM_STATS=json)
    if wanted shim/torch_door_record; then
        run_timed shim_torch_door_record "${door_env[@]}" POOLSHIM_STATS_FILE="$stats/torch_door_record.json" \
            "$PYTHON" "$src/torch_door.py" "$lib" record
        keep_log shim_torch_door_record
        if [ $rc -eq 0 ] && "$PYTHON" "$src/check_stats.py" "$stats/torch_door_record.json" \
            "calls.cuMemAllocAsync>0 invalid_frees==0" >>"$logs/shim_torch_door_record.log" 2>&1; then
            record shim/torch_door_record PASS "$(grep RESULT "$logs/shim_torch_door_record.log")"
        else record shim/torch_door_record FAIL "exit $rc, log shim_torch_door_record.log"; fi
    fi
    if wanted shim/torch_door_record_ignored_expected_failure; then
        run_timed shim_torch_door_no_join "${door_env[@]}" POOLSHIM_TEST_TORCH_NO_JOIN=1 \
            "$PYTHON" "$src/torch_door.py" "$lib" record
        keep_log shim_torch_door_no_join
        if [ $rc -eq 1 ]; then record shim/torch_door_record_ignored_expected_failure PASS "caught: $(grep RESULT "$logs/shim_torch_door_no_join.log")"
        else record shim/torch_door_record_ignored_expected_failure FAIL "exit $rc where the control must exit 1, log shim_torch_door_no_join.log"; fi
    fi
    if wanted shim/torch_door_train; then
        run_timed native_torch_door_train env -u LD_PRELOAD "$PYTHON" "$src/torch_door.py" - train
        a=$(sed -n 's/.*final_loss=\([^ ]*\).*/\1/p' "$logs/native_torch_door_train.log")
        run_timed shim_torch_door_train "${door_env[@]}" "$PYTHON" "$src/torch_door.py" "$lib" train
        b=$(sed -n 's/.*final_loss=\([^ ]*\).*/\1/p' "$logs/shim_torch_door_train.log")
        keep_log shim_torch_door_train
        if [ -n "$a" ] && [ -n "$b" ] &&
            "$PYTHON" -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-5 * max(abs(a), abs(b)) else 1)' "$a" "$b"; then
            record shim/torch_door_train PASS "own allocator $a, door $b"
        else record shim/torch_door_train FAIL "own allocator '$a', door '$b', log shim_torch_door_train.log"; fi
    fi
    # torch.multiprocessing shares a CUDA tensor (IPC of pooled segments) with the caching
    # allocator on. With it off PyTorch itself cannot share CUDA tensors
    # (natively: "RuntimeError: invalid device pointer" in _share_cuda_, H100,
    # torch 2.11), so there is nothing to compare the shim with.
    cache_env=POOLSHIM_TORCH_IPC_CACHE=on
    if wanted native/torch_ipc_cache_on; then
        run_timed native_torch_ipc_cache_on env -u LD_PRELOAD $cache_env "$PYTHON" "$src/torch_ipc.py"
        keep_log native_torch_ipc_cache_on
        if [ $rc -eq 0 ]; then record native/torch_ipc_cache_on PASS
        else record native/torch_ipc_cache_on FAIL "exit $rc, log native_torch_ipc_cache_on.log"; fi
    fi
    shim torch_ipc_cache_on "doors.runtime>0 invalid_frees==0 ipc.exported>=1" $cache_env -- "$PYTHON" "$src/torch_ipc.py"
else
    wanted torch_train && record torch_train SKIP "PyTorch with CUDA not available"
    wanted torch_ipc && record torch_ipc SKIP "PyTorch with CUDA not available"
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

# numba-cuda's own driver tests and its IPC tests (tests/gpu/numba_suite.py),
# natively and under the shim: the same tests, and every test that passes
# natively passes under the shim. numba allocates through the driver door
# (cuMemAlloc, cuMemHostAlloc, IPC handles, a device reset). Its negative control
# runs the shim behind a limit of 8 MiB (numba_cap.ini), which refuses memory the
# device has: the comparison must see the difference.
if "$PYTHON" -c 'import numba.cuda' >/dev/null 2>&1; then
    numba_names="numba.cuda.tests.cudadrv numba.cuda.tests.cudapy.test_ipc"
    if wanted native/numba_suite; then
        # shellcheck disable=SC2086 # numba_names: two test package names
        run_timed native_numba_suite env -u LD_PRELOAD "$PYTHON" "$src/numba_suite.py" run "$logs/numba_native.json" $numba_names
        keep_log native_numba_suite
        if [ $rc -eq 0 ]; then record native/numba_suite PASS "$(grep -E '^numba_suite: .* tests \(' "$logs/native_numba_suite.log" | tail -1)"
        else record native/numba_suite FAIL "exit $rc, log native_numba_suite.log"; fi
    fi
    # shellcheck disable=SC2086
    shim numba_suite "doors.driver>0 calls.cuMemAlloc>0 calls.cuMemHostAlloc>0 ipc.exported>0 invalid_frees==0" \
        -- "$PYTHON" "$src/numba_suite.py" run "$logs/numba_shim.json" $numba_names
    if wanted native/numba_suite && wanted shim/numba_suite; then
        if "$PYTHON" "$src/numba_suite.py" compare "$logs/numba_native.json" "$logs/numba_shim.json" >"$logs/numba_compare.log" 2>&1; then
            record shim/numba_suite_matches_native PASS "$(tail -1 "$logs/numba_compare.log")"
        else
            record shim/numba_suite_matches_native FAIL "$(tail -1 "$logs/numba_compare.log"), log numba_compare.log"
        fi
        keep_log numba_compare
    fi
    if wanted native/numba_suite && wanted shim/numba_suite_capped_expected_failure; then
        # shellcheck disable=SC2086
        run_timed shim_numba_capped env LD_PRELOAD="$lib" POOLSHIM_CONFIG="$src/numba_cap.ini" \
            "$PYTHON" "$src/numba_suite.py" run "$logs/numba_capped.json" $numba_names
        keep_log shim_numba_capped
        if [ $rc -ne 0 ]; then
            record shim/numba_suite_capped_expected_failure FAIL "the suite did not run (exit $rc, log shim_numba_capped.log)"
        elif "$PYTHON" "$src/numba_suite.py" compare "$logs/numba_native.json" "$logs/numba_capped.json" >"$logs/numba_capped_compare.log" 2>&1; then
            record shim/numba_suite_capped_expected_failure FAIL "a shim capped at 8 MiB matched the native run"
        else
            record shim/numba_suite_capped_expected_failure PASS "expected failure: $(tail -1 "$logs/numba_capped_compare.log")"
        fi
    fi
else
    wanted numba_suite && record numba_suite SKIP "numba-cuda not available"
fi

# ---------------------------------------------------------------- 7b. pinned host pool (cudaHostAlloc/cudaFreeHost)
# An async copy from/to a pinned block, cudaFreeHost, cudaHostAlloc of the same size
# and a host write at once must not change what the copy delivered; the
# negative control (POOLSHIM_TEST_SKIP_HOST_WAIT=1 reuses freed blocks at once)
# must detect corruption. Static cudart reaches us through cuMemHostAlloc /
# cuMemFreeHost (driver door), shared cudart through cudaHostAlloc/cudaFreeHost.
# These runs use the DEFAULT pinned stack: one range of host-located
# cuMemCreate pieces where the driver can (host.expandable auto; section 7c
# checks natively that such a range is pinned memory), else slabs; the
# *_slabs runs force host.expandable=0 (cuMemHostAlloc slabs).
for kind in static shared; do
    native pinned_$kind pinned_$kind hazard
done
shim pinned_static "calls.cuMemHostAlloc>0 calls.cuMemFreeHost>0 host.upstream.allocs>0 invalid_frees==0 ?host.fences.recorded>0 ?host.fences.waits>0 ?host.bound_waits>0" -- pinned_static hazard
shim pinned_shared "calls.cudaHostAlloc>0 calls.cudaFreeHost>0 host.upstream.allocs>0 invalid_frees==0 ?host.fences.recorded>0 ?host.fences.waits>0 ?host.bound_waits>0" -- pinned_shared hazard
shim pinned_static_slabs "calls.cuMemHostAlloc>0 host.upstream.allocs>0 invalid_frees==0 ?host.bound_waits>0" \
    POOLSHIM_OPTIONS=host.expandable=0 -- pinned_static hazard
shim pinned_shared_slabs "calls.cudaHostAlloc>0 host.upstream.allocs>0 invalid_frees==0 ?host.bound_waits>0" \
    POOLSHIM_OPTIONS=host.expandable=0 -- pinned_shared hazard
shim pinned_static_tiny_bound "host.upstream.allocs>0 invalid_frees==0 ?host.bound_waits>0" \
    POOLSHIM_OPTIONS=host.pending_wait_bytes=0,host.pending_wait_percent=1 -- pinned_static hazard
for kind in static shared; do
    expect_detect pinned_skip_wait_${kind}_expected_failure POOLSHIM_TEST_SKIP_HOST_WAIT=1 -- pinned_$kind hazard
    expect_detect pinned_skip_wait_${kind}_slabs_expected_failure POOLSHIM_OPTIONS=host.expandable=0 \
        POOLSHIM_TEST_SKIP_HOST_WAIT=1 -- pinned_$kind hazard
done
# Timing (host.grow_budget_min): a 1 MiB pair must be >= 1000x cheaper than natively, by
# the mean over PINNED_PAIRS pairs (default 2000), fences and waits included,
# statistics off; the shim's host fences and reserved peak are printed from a
# shorter run with statistics on (400 pairs; host.grow_budget_min:
# ~1 fence per 8 pairs, 16 MiB). PINNED_TIMING_OPTIONS: POOLSHIM_OPTIONS for
# the shim runs (e.g. host.grow_budget_min=0 for the old behaviour).
if wanted pinned_timing; then
    for kind in static shared; do
        native_mean=
        for mode in native shim; do
            name=pinned_timing_${kind}_$mode
            path=$(exe pinned_$kind) || { record "$name" FAIL "not built"; continue; }
            if [ $mode = native ]; then run_timed "$name" env -u LD_PRELOAD "$path" timing "${PINNED_PAIRS:-2000}"
            else
                # the ratio is timed as a program runs by default, statistics
                # off (on, they cost ~0.5 us per pair on an H100, 2026-11-25); a second,
                # short run with statistics gives the fence line below
                rm -f "$stats/$name.json"
                env LD_PRELOAD="$lib" POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$stats/$name.json" \
                    POOLSHIM_OPTIONS="${PINNED_TIMING_OPTIONS:-}" "$path" timing 400 >/dev/null 2>&1
                run_timed "$name" env LD_PRELOAD="$lib" POOLSHIM_OPTIONS="${PINNED_TIMING_OPTIONS:-}" \
                    "$path" timing "${PINNED_PAIRS:-2000}"
            fi
            keep_log "$name"
            line=$(grep '^pinned timing' "$logs/$name.log")
            if [ $rc -eq 0 ] && [ -n "$line" ]; then
                record "pinned_timing/$kind/$mode" PASS
                say "  $kind $mode: ${line#pinned timing: }"
            else
                record "pinned_timing/$kind/$mode" FAIL "exit $rc, log $name.log"
                continue
            fi
            mean=$(printf '%s\n' "$line" | sed -n 's/.*1 MiB [0-9.]* us (mean \([0-9.]*\) us.*/\1/p')
            if [ $mode = native ]; then native_mean=$mean; continue; fi
            [ -f "$stats/$name.json" ] && say "  $kind shim stats: $("$PYTHON" "$src/check_stats.py" "$stats/$name.json" \
                '?host.fences.recorded>0' '?host.fences.waits>0' '?host.bound_waits>0' '?host.reserved_peak>0' 2>&1 |
                tr '\n' ' ')"
            if [ -n "$native_mean" ] && [ -n "$mean" ]; then
                ratio=$(awk -v n="$native_mean" -v s="$mean" 'BEGIN { if (s > 0) printf "%.0f", n / s; else print 0 }')
                if [ "$ratio" -ge 1000 ]; then
                    record "pinned_timing/$kind/ratio_1MiB" PASS "${ratio}x: native $native_mean us, shim $mean us per pair (mean)"
                else
                    record "pinned_timing/$kind/ratio_1MiB" FAIL "${ratio}x < 1000x: native $native_mean us, shim $mean us per pair (mean)"
                fi
            fi
        done
    done
fi

# ---------------------------------------------------------------- 7c. host.expandable (pinned pool on one host range)
# host.expandable (auto: on by default where the driver can) maps pinned
# pieces of one range with cuMemCreate at a HOST location (core/host_vm.h),
# so a pooled block may span several pieces. pinned_vmm_probe.cu checks
# natively what that relies on: host access to every byte, H2D/D2H copies of
# the range and of a window across a piece boundary, a D2H copy behind a
# spinning kernel that returns at once (pinned, not staged), kernel access
# through the same address, bandwidth against cudaHostAlloc, and the costs.
# When it passes, the pinned hazard tests run under the shim with
# host.expandable=1 (a warning instead of slabs if the shim's own probe
# disagrees) and its negative control.
# pinned_probe.cu stays as the documented refutation of the old mechanism
# (one range page-locked piece by piece with cudaHostRegister): it is a fact
# check of CUDA and passes when it reached a verdict (on CUDA 13.0, H100,
# driver 580: a copy across registrations is cudaErrorInvalidValue).
if wanted native/pinned_probe_static; then
    if path=$(exe pinned_probe_static); then
        run_timed native_pinned_probe_static env -u LD_PRELOAD "$path"
        keep_log native_pinned_probe_static
        if [ $rc -eq 0 ]; then
            record native/pinned_probe_static PASS "copies across registered pieces work (the old mechanism would too)"
        elif grep -q 'cudaMemcpyAsync.*cudaErrorInvalidValue' "$logs/native_pinned_probe_static.log"; then
            record native/pinned_probe_static PASS "CUDA refuses a copy across registered pieces (cudaErrorInvalidValue): the old mechanism stays refuted"
        else
            record native/pinned_probe_static FAIL "exit $rc, log native_pinned_probe_static.log"
        fi
        grep -E '^(pinned_probe: (a cudaMemcpyAsync|bandwidth|costs|.*FAIL)|FAIL )' "$logs/native_pinned_probe_static.log" |
            while IFS= read -r line; do say "  ${line#pinned_probe: }"; done
    else
        record native/pinned_probe_static FAIL "pinned_probe_static did not build"
    fi
fi
vmm_probe_ok=0
if wanted native/pinned_vmm_probe_static; then
    if path=$(exe pinned_vmm_probe_static); then
        run_timed native_pinned_vmm_probe_static env -u LD_PRELOAD "$path"
        keep_log native_pinned_vmm_probe_static
        if [ $rc -eq 0 ]; then
            vmm_probe_ok=1
            record native/pinned_vmm_probe_static PASS "host-located cuMemCreate pieces in one range are pinned memory: host.expandable's mechanism holds"
        else
            record native/pinned_vmm_probe_static FAIL "exit $rc, log native_pinned_vmm_probe_static.log (the default pinned stack relies on it)"
        fi
        grep -E '^pinned_vmm_probe: (bandwidth|costs|cudaPointerGetAttributes|.*FAIL)' "$logs/native_pinned_vmm_probe_static.log" |
            while IFS= read -r line; do say "  ${line#pinned_vmm_probe: }"; done
    else
        record native/pinned_vmm_probe_static FAIL "pinned_vmm_probe_static did not build"
    fi
fi
# PINNED_EXPANDABLE_TESTS=1 forces these runs whatever the probe said.
if [ "${PINNED_EXPANDABLE_TESTS:-0}" = 1 ] || [ $vmm_probe_ok = 1 ]; then
    shim pinned_static_expandable "calls.cuMemHostAlloc>0 host.upstream.allocs>0 invalid_frees==0 ?host.bound_waits>0" \
        POOLSHIM_OPTIONS=host.expandable=1 -- pinned_static hazard
    shim pinned_shared_expandable "calls.cudaHostAlloc>0 host.upstream.allocs>0 invalid_frees==0 ?host.bound_waits>0" \
        POOLSHIM_OPTIONS=host.expandable=1 -- pinned_shared hazard
    expect_detect pinned_skip_wait_static_expandable_expected_failure POOLSHIM_OPTIONS=host.expandable=1 \
        POOLSHIM_TEST_SKIP_HOST_WAIT=1 -- pinned_static hazard
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

# ---------------------------------------------------------------- 8b. the log's companion, replay on the GPU
# A program under the shim with POOLSHIM_LOG: its companion LOG.reserved.csv must
# peak where the shim's statistics say it did; then `poolshim replay` of that log
# on this GPU (natively and through the default stack), and with --gpu-lag 1ms
# (check_replay.py says what is compared).
replay_log=$WORKDIR/replay_alloc_basic.csv
if wanted shim/log_companion_matches_stats; then
    rm -f "$replay_log" "$replay_log.reserved.csv"
    shim log_companion_matches_stats "doors.driver>0" POOLSHIM_LOG="$replay_log" -- alloc_basic_static
    if [ -f "$replay_log.reserved.csv" ] &&
        "$PYTHON" "$src/check_replay.py" companion "$replay_log" "$stats/shim_log_companion_matches_stats.json" \
            >"$logs/companion_check.log" 2>&1; then
        record shim/log_companion_peak_is_the_stats_peak PASS "$(tail -1 "$logs/companion_check.log")"
    else
        record shim/log_companion_peak_is_the_stats_peak FAIL "log companion_check.log"
    fi
    keep_log companion_check
fi
for variant in replay_gpu replay_gpu_lag; do
    wanted "cli/$variant" || continue
    [ -f "$replay_log" ] || { record "cli/$variant" SKIP "no log (shim/log_companion_matches_stats did not run)"; continue; }
    args=(--native --json)
    check=replay
    [ $variant = replay_gpu_lag ] && args+=(--gpu-lag 1ms) && check=lag
    run_timed "$variant" env -u LD_PRELOAD "$cli" replay "$replay_log" "${args[@]}"
    program_rc=$rc
    sed -n '/^{/,$p' "$logs/$variant.log" >"$WORKDIR/$variant.json"
    "$PYTHON" "$src/check_replay.py" $check "$replay_log" "$WORKDIR/$variant.json" >>"$logs/$variant.log" 2>&1
    check_rc=$?
    keep_log "$variant"
    if [ $program_rc -ne 0 ]; then record "cli/$variant" FAIL "exit $program_rc, log $variant.log"
    elif [ $check_rc -ne 0 ]; then record "cli/$variant" FAIL "check failed, log $variant.log"
    else record "cli/$variant" PASS; fi
done
# ---------------------------------------------------------------- 9. several processes: mpirun, torchrun
# mp_ranks.cu under `mpirun -np 2` (no MPI library: it reads its rank from the
# launcher's environment and uses device rank % GPUs): natively, then under the
# shim two ways, (a) the launcher's own export (Open MPI `-x`; `env` otherwise)
# and (b) `poolshim run --stats-file ..._%r_%p.json -- mpirun ...` (the launcher
# itself preloaded too). Same RESULT per rank as natively, one statistics file per
# rank naming its rank, its device served, every block back.
# rank_results LOG: "rank checksum" per RESULT line, sorted.
rank_results() {
    sed -n 's/^RESULT mp_ranks rank=\([0-9]*\) .*checksum=\(0x[0-9a-f]*\).*/\1 \2/p' "$1" | sort
}
# rank_stats NAME FILE RANK DOOR [all_freed]: the rank's statistics file names the
# rank and says the shim served its device (rank % GPUs); all_freed: and every
# block came back (a Python program may exit with tensors alive, a C one not).
rank_stats() {
    local name=$1 file=$2 rank=$3 door=$4 device
    device=$((rank % (gpu_count > 0 ? gpu_count : 1)))
    local -a freed=()
    [ "${5:-}" = all_freed ] && freed=("device$device.bytes.requested_current==0")
    if [ -z "$file" ] || [ ! -f "$file" ]; then
        record "$name/rank$rank/stats" FAIL "no statistics file for rank $rank"
    elif "$PYTHON" "$src/check_stats.py" "$file" "rank==$rank" "device$device.doors.$door>0" \
        "${freed[@]}" "invalid_frees==0" >>"$logs/${name//\//_}.log" 2>&1; then
        record "$name/rank$rank/stats" PASS "$(basename "$file")"
    else
        record "$name/rank$rank/stats" FAIL "stats check failed, log ${name//\//_}.log"
    fi
}
if wanted mpi_ranks; then
    mpi_cmd=() mpi_env=() mpi_open=0
    if command -v "$MPIRUN" >/dev/null 2>&1; then
        mpi_cmd=("$MPIRUN" -np 2)
        if "$MPIRUN" --version 2>&1 | grep -qiE 'open mpi|open-mpi|openrte|prrte'; then
            mpi_open=1
            mpi_cmd+=(--oversubscribe --bind-to none)
            if [ "$(id -u)" = 0 ]; then
                mpi_cmd+=(--allow-run-as-root)
                mpi_env=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
            fi
        fi
    fi
    if [ ${#mpi_cmd[@]} -eq 0 ]; then
        record mpi_ranks SKIP "no $MPIRUN on PATH"
    elif ! exe mp_ranks_static >/dev/null || ! exe mp_ranks_shared >/dev/null; then
        record mpi_ranks FAIL "mp_ranks did not build"
    else
        say "mpirun: $("$MPIRUN" --version 2>&1 | head -1); $gpu_count GPU(s)"
        run_timed native_mpi_ranks env -u LD_PRELOAD "${mpi_env[@]}" "${mpi_cmd[@]}" "$(exe mp_ranks_static)" "$MPI_STEPS"
        keep_log native_mpi_ranks
        native_ranks=$(rank_results "$logs/native_mpi_ranks.log")
        if [ $rc -ne 0 ]; then
            record native/mpi_ranks SKIP "mpirun fails natively (exit $rc): $(grep -m1 -iE 'error|denied|not' "$logs/native_mpi_ranks.log" | cut -c1-160)"
        elif [ "$(printf '%s\n' "$native_ranks" | cut -d' ' -f1 | tr '\n' ' ')" != "0 1 " ]; then
            record native/mpi_ranks FAIL "expected a RESULT of rank 0 and of rank 1, got '$native_ranks'"
        elif [ "$(printf '%s\n' "$native_ranks" | cut -d' ' -f2 | sort -u | wc -l)" -ne 2 ]; then
            record native/mpi_ranks FAIL "both ranks printed the same checksum: the ranks were not told apart"
        else
            record native/mpi_ranks PASS "$(printf '%s\n' "$native_ranks" | tr '\n' ' ')"
            rm -f "$stats"/mpi_x_*.json "$stats"/mpi_run_*.json
            # (a) the launcher exports the preload to each rank
            if [ $mpi_open = 1 ]; then
                run_timed shim_mpi_ranks_export env -u LD_PRELOAD "${mpi_env[@]}" "${mpi_cmd[@]}" -x LD_PRELOAD="$lib" \
                    -x POOLSHIM_STATS=json -x POOLSHIM_STATS_FILE="$stats/mpi_x_%r.json" \
                    "$(exe mp_ranks_static)" "$MPI_STEPS"
            else
                run_timed shim_mpi_ranks_export env -u LD_PRELOAD "${mpi_env[@]}" "${mpi_cmd[@]}" env LD_PRELOAD="$lib" \
                    POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$stats/mpi_x_%r.json" "$(exe mp_ranks_static)" "$MPI_STEPS"
            fi
            keep_log shim_mpi_ranks_export
            shim_ranks=$(rank_results "$logs/shim_mpi_ranks_export.log")
            if [ $rc -eq 0 ] && [ "$shim_ranks" = "$native_ranks" ] && [ "$(grep -c 'shim active' "$logs/shim_mpi_ranks_export.log")" -eq 2 ]; then
                record shim/mpi_ranks_export PASS "same checksums as natively, shim active in both ranks"
            else
                record shim/mpi_ranks_export FAIL "exit $rc, ranks '$shim_ranks' against native '$native_ranks', log shim_mpi_ranks_export.log"
            fi
            for r in 0 1; do rank_stats shim/mpi_ranks_export "$stats/mpi_x_$r.json" $r driver all_freed; done
            # (b) poolshim run over the launcher (shared cudart: the runtime door)
            run_timed shim_mpi_ranks_poolshim_run env -u LD_PRELOAD "${mpi_env[@]}" "$cli" run --stats=json \
                --stats-file "$stats/mpi_run_%r_%p.json" -- "${mpi_cmd[@]}" "$(exe mp_ranks_shared)" "$MPI_STEPS"
            keep_log shim_mpi_ranks_poolshim_run
            shim_ranks=$(rank_results "$logs/shim_mpi_ranks_poolshim_run.log")
            if [ $rc -eq 0 ] && [ "$shim_ranks" = "$native_ranks" ] && [ "$(grep -c 'shim active' "$logs/shim_mpi_ranks_poolshim_run.log")" -eq 2 ]; then
                record shim/mpi_ranks_poolshim_run PASS "same checksums as natively (static there, shared cudart here)"
            else
                record shim/mpi_ranks_poolshim_run FAIL "exit $rc, ranks '$shim_ranks' against native '$native_ranks', log shim_mpi_ranks_poolshim_run.log"
            fi
            # the launcher may write a report of its own (no rank, no calls): take the ranks' files
            for r in 0 1; do
                rank_stats shim/mpi_ranks_poolshim_run "$(grep -l "\"rank\": $r," "$stats"/mpi_run_*.json 2>/dev/null | head -1)" $r runtime all_freed
            done
            if [ -x "$cli" ]; then
                say "  per rank under the shim (poolshim stats):"
                "$cli" stats "$stats"/mpi_x_*.json 2>&1 | sed 's/^/    /' | tee -a "$results"
            fi
        fi
    fi
fi
# DDP on two GPUs (tools/bench/torch_mem/workloads.py ddp: torchrun, NCCL), PyTorch's
# cache off so every tensor goes through the shim: the final loss of each rank must
# equal the native one, and each rank writes its own statistics (%r).
if wanted ddp; then
    if ! "$PYTHON" -c 'import torch, torch.distributed, sys; sys.exit(0 if torch.cuda.device_count() >= 2 and torch.distributed.is_nccl_available() else 1)' >/dev/null 2>&1; then
        record ddp SKIP "needs PyTorch with NCCL and two GPUs ($gpu_count GPU(s))"
    else
        ddp_script=$repo/tools/bench/torch_mem/workloads.py
        run_timed native_ddp env -u LD_PRELOAD PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$PYTHON" -m torch.distributed.run \
            --standalone --nproc-per-node 2 "$ddp_script" ddp --steps "$DDP_STEPS"
        keep_log native_ddp
        ddp_losses() { sed -n 's/^RESULT name=ddp rank=\([0-9]*\) .*final_loss=\([^ ]*\).*/\1 \2/p' "$1" | sort; }
        native_losses=$(ddp_losses "$logs/native_ddp.log")
        if [ $rc -ne 0 ] || [ "$(printf '%s\n' "$native_losses" | wc -l)" -ne 2 ]; then
            record native/ddp FAIL "exit $rc, losses '$native_losses', log native_ddp.log"
        else
            record native/ddp PASS "$(printf '%s\n' "$native_losses" | tr '\n' ' ')"
            rm -f "$stats"/ddp_*.json
            run_timed shim_ddp env LD_PRELOAD="$lib" POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$stats/ddp_%r.json" \
                PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2 \
                "$ddp_script" ddp --steps "$DDP_STEPS"
            keep_log shim_ddp
            shim_losses=$(ddp_losses "$logs/shim_ddp.log")
            if [ $rc -eq 0 ] && "$PYTHON" -c '
import sys
native = dict(line.split() for line in sys.argv[1].splitlines())
shim = dict(line.split() for line in sys.argv[2].splitlines())
close = lambda a, b: abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-30)
sys.exit(0 if native.keys() == shim.keys() and all(close(float(native[r]), float(shim[r])) for r in native) else 1)' \
                "$native_losses" "$shim_losses"; then
                record shim/ddp_loss_matches_native PASS "$(printf '%s\n' "$shim_losses" | tr '\n' ' ')"
            else
                record shim/ddp_loss_matches_native FAIL "exit $rc, native '$native_losses', shim '$shim_losses', log shim_ddp.log"
            fi
            for r in 0 1; do rank_stats shim/ddp "$stats/ddp_$r.json" $r runtime; done
        fi
    fi
fi
# ---------------------------------------------------------------- 9. compute-sanitizer sees the pool's blocks (debug.nvtx)
# sanitized NAME errors|clean [VAR=VALUE...] -- PROGRAM ARGS: runs PROGRAM under
# `compute-sanitizer --tool memcheck --nvtx yes`, with the shim preloaded unless
# the first VAR is NOSHIM=1. `errors`: passes when memcheck reported at least one
# error and an invalid global access; `clean`: when it reported 0 errors and the
# program ran to its end.
# Without compute-sanitizer every such test is SKIPped.
sanitized() {
    local name=sanitize/$1 want=$2
    shift 2
    local -a envs=()
    local preload=1
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        if [ "$1" = NOSHIM=1 ]; then preload=0; else envs+=("$1"); fi
        shift
    done
    shift
    wanted "$name" || return 0
    [ -x "$SANITIZER" ] || { record "$name" SKIP "no compute-sanitizer at $SANITIZER"; return 0; }
    local path log=${name//\//_}
    path=$(exe "$1") || { record "$name" FAIL "$1 did not build"; return 0; }
    shift
    [ -f "$lib" ] || { record "$name" FAIL "no $lib"; return 0; }
    if [ $preload -eq 1 ]; then
        run_timed "$log" env LD_PRELOAD="$lib" "${envs[@]}" "$SANITIZER" --tool memcheck --nvtx yes "$path" "$@"
    else
        run_timed "$log" env -u LD_PRELOAD "${envs[@]}" "$SANITIZER" --tool memcheck --nvtx yes "$path" "$@"
    fi
    keep_log "$log"
    local summary errors
    summary=$(grep -m1 -E 'ERROR SUMMARY: [0-9]+ error' "$logs/$log.log")
    errors=$(printf '%s\n' "$summary" | sed -E 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/')
    # after a reported access memcheck leaves the context in error, so the
    # program may stop at its next CUDA call: only a clean run must finish
    if [ -z "$summary" ]; then record "$name" FAIL "no ERROR SUMMARY (exit $rc), log $log.log"
    elif [ "$want" = clean ] && ! grep -q "OK (the verdict" "$logs/$log.log"; then
        record "$name" FAIL "the program did not finish (exit $rc), log $log.log"
    elif [ "$want" = errors ] && [ "$errors" -gt 0 ] && grep -q 'Invalid __global__' "$logs/$log.log"; then
        record "$name" PASS "memcheck: $errors errors"
    elif [ "$want" = clean ] && [ "$errors" -eq 0 ]; then record "$name" PASS "memcheck: 0 errors"
    else record "$name" FAIL "memcheck reported $errors errors, expected $want; log $log.log"; fi
}
# the reference: memcheck sees the overflow of a native cudaMalloc block (no shim)
sanitized overflow_native errors NOSHIM=1 -- sanitize_static overflow
# with debug.nvtx: the overflow into the next block and the use after free are reported
sanitized overflow_nvtx errors POOLSHIM_NVTX=1 -- sanitize_static overflow
sanitized overflow_nvtx_shared errors POOLSHIM_NVTX=1 -- sanitize_shared overflow
sanitized overflow_nvtx_chunks errors POOLSHIM_NVTX=1 POOLSHIM_OPTIONS=resource.main.expandable=0 -- sanitize_static overflow
sanitized overflow_async_nvtx errors POOLSHIM_NVTX=1 -- sanitize_static overflow_async
sanitized uaf_nvtx errors POOLSHIM_NVTX=1 -- sanitize_static uaf
sanitized uaf_nvtx_arena errors POOLSHIM_NVTX=1 POOLSHIM_RESOURCE=arena -- sanitize_static uaf
# and nothing on a clean program
sanitized clean_nvtx clean POOLSHIM_NVTX=1 -- sanitize_static clean
sanitized clean_nvtx_shared clean POOLSHIM_NVTX=1 -- sanitize_shared clean
# why the option exists: without it the same bugs inside the pool go unseen
sanitized overflow_without_nvtx_unseen clean -- sanitize_static overflow
sanitized uaf_without_nvtx_unseen clean -- sanitize_static uaf
# poolshim run --sanitize does the same in one command
if wanted sanitize/cli_run_sanitize_overflow; then
    name=sanitize/cli_run_sanitize_overflow
    if [ ! -x "$SANITIZER" ]; then record "$name" SKIP "no compute-sanitizer at $SANITIZER"
    elif ! path=$(exe sanitize_static) || [ ! -x "$build_dir/poolshim" ]; then record "$name" FAIL "sanitize_static or $build_dir/poolshim missing"
    else
        run_timed sanitize_cli_run_sanitize_overflow env POOLSHIM_SANITIZER="$SANITIZER" POOLSHIM_LIB="$lib" \
            "$build_dir/poolshim" run --sanitize -- "$path" overflow
        keep_log sanitize_cli_run_sanitize_overflow
        if grep -qE 'ERROR SUMMARY: [1-9][0-9]* error' "$logs/sanitize_cli_run_sanitize_overflow.log"; then
            record "$name" PASS
        else
            record "$name" FAIL "no memcheck error reported (exit $rc), log sanitize_cli_run_sanitize_overflow.log"
        fi
    fi
fi

# ---------------------------------------------------------------- 10. guard mode (debug.guard)
# guarded NAME report|none [VAR=VALUE...] -- PROGRAM ARGS: runs PROGRAM (sanitize.cu)
# under the shim; `report`: passes when the shim printed one guard report naming
# block A (the address the program printed) and its 4000 bytes; `none`: when no
# guard report appeared. Both need the program to finish (exit 0).
guarded() {
    local name=guard/$1 want=$2
    shift 2
    local -a envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    wanted "$name" || return 0
    local path log=${name//\//_}
    path=$(exe "$1") || { record "$name" FAIL "$1 did not build"; return 0; }
    shift
    [ -f "$lib" ] || { record "$name" FAIL "no $lib"; return 0; }
    run_timed "$log" env LD_PRELOAD="$lib" "${envs[@]}" "$path" "$@"
    keep_log "$log"
    local block reports
    block=$(sed -n -E 's/^block A (0x[0-9a-f]+) .*/\1/p' "$logs/$log.log" | head -1)
    reports=$(grep -c 'poolshim: error: guard: block' "$logs/$log.log")
    if [ $rc -ne 0 ]; then record "$name" FAIL "exit $rc, log $log.log"
    elif [ "$want" = none ] && [ "$reports" -eq 0 ]; then record "$name" PASS "no guard report"
    elif [ "$want" = report ] && [ -n "$block" ] &&
        grep -q "poolshim: error: guard: block $block (4000 bytes, " "$logs/$log.log"; then
        record "$name" PASS "$reports report(s), block $block named"
    else record "$name" FAIL "$reports guard report(s), wanted $want (block ${block:-?}); log $log.log"; fi
}
guarded overflow report POOLSHIM_GUARD=256 -- sanitize_static overflow
guarded overflow_shared report POOLSHIM_GUARD=256 -- sanitize_shared overflow
guarded overflow_async report POOLSHIM_GUARD=256 -- sanitize_static overflow_async
guarded overflow_arena report POOLSHIM_GUARD=256 POOLSHIM_RESOURCE=arena -- sanitize_static overflow
guarded overflow_tracked_site report \
    'POOLSHIM_OPTIONS=debug.guard=64,resource.t.type=track,resource.t.upstream=main,resource.t.stack_depth=16,device.*.resource=t' \
    -- sanitize_static overflow
if wanted guard/overflow_tracked_site && [ -f "$logs/guard_overflow_tracked_site.log" ]; then
    if grep -q "allocated at:" "$logs/guard_overflow_tracked_site.log"; then
        record guard/overflow_tracked_site_names_the_call_stack PASS
    else
        record guard/overflow_tracked_site_names_the_call_stack FAIL "no 'allocated at:' in the report"
    fi
fi
guarded clean none POOLSHIM_GUARD=256 -- sanitize_static clean
guarded clean_shared none POOLSHIM_GUARD=256 -- sanitize_shared clean
# the negative control: the same overflow without debug.guard is not reported,
# so the report above comes from the red zone, not from elsewhere
guarded overflow_without_guard_unseen none -- sanitize_static overflow

# ---------------------------------------------------------------- 11. soak (every stack, every block checked)
# SOAK_SECONDS per stack (default 20); tools/gpu_session.sh soak runs the long one.
SOAK_SECONDS=${SOAK_SECONDS:-20}
soak() { # soak NAME PROGRAM MAX_BYTES [VAR=VALUE...]
    local name=soak/$1 program=$2 max=$3
    shift 3
    wanted "$name" || return 0
    local path log=${name//\//_}
    path=$(exe "$program") || { record "$name" FAIL "$program did not build"; return 0; }
    local timeout_was=$TEST_TIMEOUT
    TEST_TIMEOUT=$((SOAK_SECONDS * 2 + 60))
    run_timed "$log" env LD_PRELOAD="$lib" POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$stats/$log.json" "$@" \
        "$path" "$SOAK_SECONDS" 8 "$max"
    TEST_TIMEOUT=$timeout_was
    keep_log "$log"
    local line
    line=$(grep -m1 '^RESULT soak' "$logs/$log.log")
    if [ $rc -eq 0 ] && printf '%s\n' "$line" | grep -q 'corrupted_bytes=0$'; then
        record "$name" PASS "${line#RESULT soak }"
    else
        record "$name" FAIL "exit $rc${line:+, ${line#RESULT soak }}; log $log.log"
    fi
}
soak pool soak_static 4194304 POOLSHIM_RESOURCE=pool
soak pool_shared soak_shared 4194304 POOLSHIM_RESOURCE=pool
soak arena soak_static 4194304 POOLSHIM_RESOURCE=arena
soak binning soak_static 4194304 POOLSHIM_RESOURCE=binning
soak fixed_over_pool soak_static 65536 \
    'POOLSHIM_OPTIONS=resource.f.type=fixed_size,resource.f.block_size=64KiB,resource.f.upstream=main,device.*.resource=f'
soak async soak_static 4194304 POOLSHIM_RESOURCE=async

# ---------------------------------------------------------------- summary
tar -czf "$OUTDIR/logs.tar.gz" -C "$WORKDIR" logs stats 2>/dev/null
say ""
[ $skipped -gt 0 ] && say "$skipped skipped"
say "$passed passed, $failed failed"
[ $failed -eq 0 ]
