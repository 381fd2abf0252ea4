#!/usr/bin/env bash
# poolshim against its peers, in one run on one GPU: `make bench` runs
# `./tools/bench/run.sh BUILD_DIR` (BUILD_DIR/libpoolshim.so is used as built).
#
#   1. Finds psbench: $DEPS_DIR/bench/psbench (built with RMM by fetch_rmm.sh)
#      when its recorded checksum matches tools/bench/psbench.cu; else builds it
#      here with nvcc, with RMM when $DEPS_DIR/rmm/include exists (about a
#      minute), without RMM otherwise (the RMM peers are then left out).
#   2. Runs psbench once per allocator: cudaMalloc and cudaMallocAsync natively;
#      the same unmodified program (calling cudaMalloc, or cudaMallocAsync)
#      under LD_PRELOAD for the pool, arena and binning stacks; poolshim's
#      exported API directly; RMM's pool, arena, binning-over-pool and async.
#   3. Whole programs: PyTorch training (tests/gpu/torch_train.py) with
#      PYTORCH_NO_CUDA_MEMORY_CACHING=1 natively, the same under poolshim, and
#      with PyTorch's own cache; JAX (jax_loop.py) with
#      XLA_PYTHON_CLIENT_ALLOCATOR=platform natively, under poolshim, and default.
#   3b. Pinned host memory (tools/bench/pinned/pinned_bench.py): PyTorch's
#      pin_memory DataLoader and a CuPy copy pipeline, natively with and without
#      their own pinned caches and under poolshim; pinned.txt and pinned.json.
#   3c. With two GPUs: mpirun and torchrun jobs natively and under the shim, a
#      row per rank (tools/bench/multigpu.sh; multigpu.txt beside bench.txt).
#   3d. Growth: the first cudaMalloc of 1, 8 and 32 GiB and a 1 GiB fill of the
#      card in fresh processes, natively and per stack, 4 alternated rounds
#      (tools/bench/growth.sh; growth.txt beside bench.txt).
#   4. Recorded logs on the GPU: replay_logs.sh replays the committed PyTorch
#      logs through the shim (and --native), with and without --gpu-lag, each
#      beside `replay --simulate` (label replay_logs; BENCH_ONLY applies).
#   5. summarize.py writes latest.json and prints medians and ratios; the
#      replay tables follow it in bench.txt.
# Environment:
#   OUTDIR       results: latest.json, bench.txt (the tables), bench.log (all output);
#                default tools/bench/results (latest.json only goes there then)
#   WORKDIR      binaries, raw results, statistics (default /tmp/poolshim-bench-work)
#   DEPS_DIR     RMM headers and the prebuilt psbench (default <repo>/build/deps)
#   BENCH_REPEATS   processes per allocator, run round-robin (default 3): one
#                   process can be ~1.5x off another of the same allocator, so
#                   the summary takes the median over processes and shows their range
#   BENCH_QUICK=1   shorter time budgets (about a third)
#   BENCH_ONLY      extended regex: only runs whose label matches
#   BENCH_TIMEOUT   seconds per run (default 150)
#   TORCH_STEPS (1000), JAX_STEPS (500), GPU_ARCH (sm_90), NVCC, PYTHON
# Exit status: 0 when every run produced results, 1 otherwise.
set -u

build_dir=${1:-build}
repo=$(cd "$(dirname "$0")/../.." && pwd)
here=$repo/tools/bench
lib=$(realpath -m "$build_dir/libpoolshim.so")
if [ -n "${OUTDIR:-}" ]; then results_dir=$OUTDIR; else results_dir=$here/results; fi
WORKDIR=${WORKDIR:-/tmp/poolshim-bench-work}
DEPS_DIR=${DEPS_DIR:-$repo/build/deps}
BENCH_ONLY=${BENCH_ONLY:-}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-150}
BENCH_REPEATS=${BENCH_REPEATS:-3}
TORCH_STEPS=${TORCH_STEPS:-1000}
JAX_STEPS=${JAX_STEPS:-500}
GPU_ARCH=${GPU_ARCH:-sm_90}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")}
PYTHON=${PYTHON:-python3}
quick=()
[ "${BENCH_QUICK:-0}" = 1 ] && quick=(--quick)

mkdir -p "$results_dir" "$WORKDIR/stats" "$WORKDIR/logs" || exit 1
rm -f "$WORKDIR"/stats/*.json "$WORKDIR"/logs/*.log
raw=$WORKDIR/raw.jsonl
: >"$raw"
log=$WORKDIR/bench.log
: >"$log"
problems=0
started=$(date +%s)

note() { printf '%s\n' "$*" | tee -a "$log"; }
wanted() { [ -z "$BENCH_ONLY" ] || printf '%s\n' "$1" | grep -Eq -- "$BENCH_ONLY"; }

# ---------------------------------------------------------------- 1. psbench
psbench=""
prebuilt=$DEPS_DIR/bench/psbench
if [ -x "$prebuilt" ] && [ -f "$prebuilt.cu.sha256" ] &&
    (cd "$here" && sha256sum --quiet -c "$prebuilt.cu.sha256" >/dev/null 2>&1); then
    psbench=$prebuilt
    note "psbench: prebuilt $prebuilt (matches psbench.cu)"
else
    flags=(-arch="$GPU_ARCH" -O2 -lineinfo -std=c++17)
    if [ -f "$DEPS_DIR/rmm/include/rmm/mr/device/pool_memory_resource.hpp" ]; then
        note "psbench: building with RMM from $DEPS_DIR/rmm/include"
        flags+=(-DPS_WITH_RMM -I"$DEPS_DIR/rmm/include" -DLIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
            -DSPDLOG_FMT_EXTERNAL -DFMT_HEADER_ONLY)
    else
        note "psbench: building without RMM (no $DEPS_DIR/rmm/include; run tools/bench/fetch_rmm.sh where pip works)"
    fi
    if "$NVCC" "${flags[@]}" -o "$WORKDIR/psbench" "$here/psbench.cu" >"$WORKDIR/logs/build.log" 2>&1; then
        psbench=$WORKDIR/psbench
    elif [ -x "$prebuilt" ]; then
        note "psbench: build failed (logs/build.log); using the older prebuilt $prebuilt"
        psbench=$prebuilt
    else
        note "psbench: build failed:"; tail -20 "$WORKDIR/logs/build.log" | tee -a "$log"
        exit 1
    fi
fi
has_rmm=0
"$psbench" --has-rmm && has_rmm=1

# ---------------------------------------------------------------- 2. allocators
# bench LABEL [VAR=VALUE...] -- PSBENCH ARGS: one psbench process; under the
# shim when LD_PRELOAD is among the variables (then its statistics are kept).
bench() {
    local label=$1
    shift
    local -a envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    wanted "$label" || return 0
    local t0 rc out=$WORKDIR/logs/$label.$rep.log
    t0=$(date +%s)
    # Timed runs go without POOLSHIM_STATS: statistics add a stats adaptor
    # and two clock reads per call, which is not what users run. Under the
    # shim, one short extra run per allocator (results discarded) keeps the
    # statistics that prove the calls were intercepted.
    if [ "$rep" = 1 ] && [[ " ${envs[*]} " == *" LD_PRELOAD="* ]]; then
        timeout -k 5 "$BENCH_TIMEOUT" env -u LD_PRELOAD POOLSHIM_STATS=json \
            POOLSHIM_STATS_FILE="$WORKDIR/stats/$label.json" "${envs[@]}" \
            "$psbench" --label "$label" --quick --workloads pairs "$@" >"$out.stats" 2>&1
    fi
    timeout -k 5 "$BENCH_TIMEOUT" env -u LD_PRELOAD "${envs[@]}" \
        "$psbench" --label "$label" "${quick[@]}" "$@" >"$out" 2>&1
    rc=$?
    grep '^JSON ' "$out" >>"$raw"
    if [ $rc -ne 0 ]; then
        problems=$((problems + 1))
        note "FAIL $label (process $rep): exit $rc after $(($(date +%s) - t0)) s; last lines:"
        tail -5 "$out" | sed 's/^/    /' | tee -a "$log"
    else
        note "ran $label (process $rep) in $(($(date +%s) - t0)) s ($(grep -c '^JSON ' "$out") results)"
    fi
}

shim_env=(LD_PRELOAD="$lib")
[ -f "$lib" ] || note "WARNING: $lib is missing: the poolshim runs will fail"

[ $has_rmm = 1 ] || note "RMM peers left out: psbench was built without RMM"
for rep in $(seq 1 "$BENCH_REPEATS"); do
    bench cudaMalloc -- --allocator cudaMalloc
    bench cudaMallocAsync -- --allocator cudaMallocAsync
    for stack in pool arena binning; do
        bench "poolshim_$stack" "${shim_env[@]}" POOLSHIM_RESOURCE=$stack -- --allocator cudaMalloc
    done
    bench poolshim_pool_asyncapi "${shim_env[@]}" POOLSHIM_RESOURCE=pool -- --allocator cudaMallocAsync
    # the pool over chunks instead of the expandable range: its hot path beside the default's
    bench poolshim_pool_chunked "${shim_env[@]}" POOLSHIM_RESOURCE=pool POOLSHIM_OPTIONS=resource.main.expandable=0 \
        -- --allocator cudaMalloc
    # the default pool without its per-thread caches (core/thread_cache.c): the
    # threads and threads_mixed rows show what the caches buy
    bench poolshim_pool_no_thread_cache "${shim_env[@]}" POOLSHIM_RESOURCE=pool \
        POOLSHIM_OPTIONS=resource.main.thread_cache=0 -- --allocator cudaMalloc --workloads pairs,threads,threads_mixed
    bench poolshim_direct "${shim_env[@]}" POOLSHIM_RESOURCE=pool -- --allocator direct
    if [ $has_rmm = 1 ]; then
        for peer in rmm_pool rmm_arena rmm_binning rmm_async; do
            bench "$peer" -- --allocator "$peer"
        done
    fi
done

# ---------------------------------------------------------------- 3. whole programs
# program LABEL CASE SCRIPT STEPS [VAR=VALUE...]: one timed Python program.
program() {
    local label=$1 case_name=$2 script=$3 steps=$4
    shift 4
    wanted "$label" || return 0
    local t0 rc wall
    t0=$(date +%s)
    timeout -k 5 "$BENCH_TIMEOUT" env -u LD_PRELOAD POOLSHIM_STATS=json \
        POOLSHIM_STATS_FILE="$WORKDIR/stats/$label.json" "$@" \
        "$PYTHON" "$script" "$steps" >"$WORKDIR/logs/$label.log" 2>&1
    rc=$?
    wall=$(sed -n 's/^RESULT .*wall_s=\([0-9.]*\).*/\1/p' "$WORKDIR/logs/$label.log" | tail -1)
    if [ $rc -eq 0 ] && [ -n "$wall" ]; then
        printf 'JSON {"label": "%s", "allocator": "%s", "workload": "program", "case": "%s", "unit": "s", "median": %s, "p10": %s, "p90": %s, "min": %s, "max": %s, "samples": 1, "result": "%s"}\n' \
            "$label" "$label" "$case_name" "$wall" "$wall" "$wall" "$wall" "$wall" \
            "$(grep '^RESULT' "$WORKDIR/logs/$label.log" | tail -1)" >>"$raw"
        note "ran $label in $(($(date +%s) - t0)) s: $(grep '^RESULT' "$WORKDIR/logs/$label.log" | tail -1)"
    else
        problems=$((problems + 1))
        note "FAIL $label: exit $rc; last lines:"
        tail -5 "$WORKDIR/logs/$label.log" | sed 's/^/    /' | tee -a "$log"
    fi
}

torch_script=$repo/tests/gpu/torch_train.py
if "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    torch_case=torch_mlp_${TORCH_STEPS}_steps
    program pytorch_uncached "$torch_case" "$torch_script" "$TORCH_STEPS" PYTORCH_NO_CUDA_MEMORY_CACHING=1
    program poolshim_pytorch_uncached "$torch_case" "$torch_script" "$TORCH_STEPS" PYTORCH_NO_CUDA_MEMORY_CACHING=1 "${shim_env[@]}"
    program pytorch_cache "$torch_case" "$torch_script" "$TORCH_STEPS"
else
    note "PyTorch with CUDA not available: its programs left out"
fi
if "$PYTHON" -c 'import jax, sys; sys.exit(0 if jax.default_backend() == "gpu" else 1)' >/dev/null 2>&1; then
    jax_case=jax_mlp_${JAX_STEPS}_steps
    program jax_platform "$jax_case" "$here/jax_loop.py" "$JAX_STEPS" XLA_PYTHON_CLIENT_ALLOCATOR=platform
    program poolshim_jax_platform "$jax_case" "$here/jax_loop.py" "$JAX_STEPS" XLA_PYTHON_CLIENT_ALLOCATOR=platform "${shim_env[@]}"
    program jax_default "$jax_case" "$here/jax_loop.py" "$JAX_STEPS"
else
    note "JAX with a GPU not available: its programs left out"
fi

# ---------------------------------------------------------------- 3b. pinned host memory
# PyTorch's pin_memory DataLoader and a CuPy copy pipeline, natively with and
# without their pinned caches and under poolshim (tools/bench/pinned/pinned_bench.py:
# checksums, time, pinned peak reserved vs requested against the 1.15x target).
# Its own table and verdicts go to pinned.txt / pinned.json beside latest.json;
# a FAIL verdict (a checksum, the target, no interception) counts as a problem.
if wanted pinned; then
    note "=== pinned host memory (tools/bench/pinned)"
    "$PYTHON" "$here/pinned/pinned_bench.py" --lib "$lib" "${quick[@]}" --repeats "$BENCH_REPEATS" \
        --json "$results_dir/pinned.json" 2>&1 | tee "$results_dir/pinned.txt" | tee -a "$log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { problems=$((problems + 1)); note "FAIL pinned: see pinned.txt"; }
fi

# ---------------------------------------------------------------- 3c. several GPUs and processes
# mpirun and torchrun jobs of two ranks, natively and under the shim, a row per
# rank (tools/bench/multigpu.sh); only where two GPUs are present.
if wanted multigpu; then
    if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then
        note "multigpu: mpirun and torchrun jobs on two GPUs (tools/bench/multigpu.sh)"
        OUT_DIR=$WORKDIR/multigpu "$here/multigpu.sh" "$build_dir" >"$WORKDIR/logs/multigpu.log" 2>&1 ||
            problems=$((problems + 1))
        tee -a "$log" <"$WORKDIR/logs/multigpu.log"
        [ -n "${OUTDIR:-}" ] && cp "$WORKDIR/multigpu/multigpu.txt" "$OUTDIR/multigpu.txt" 2>/dev/null
    else
        note "multigpu: left out (needs two GPUs)"
    fi
fi

# ---------------------------------------------------------------- 3d. growth
# the first big cudaMalloc and a fill of the card, natively and per stack
# (tools/bench/growth.sh: medians of alternated rounds, ratios to native)
if wanted growth; then
    note "growth: first cudaMalloc of 1, 8, 32 GiB and a 1 GiB fill (tools/bench/growth.sh)"
    OUT_DIR=$WORKDIR/growth "$here/growth.sh" "$build_dir" >"$WORKDIR/logs/growth.log" 2>&1 ||
        problems=$((problems + 1))
    tee -a "$log" <"$WORKDIR/logs/growth.log"
    [ -n "${OUTDIR:-}" ] && grep -A20 '^growth: first' "$WORKDIR/logs/growth.log" >"$OUTDIR/growth.txt" 2>/dev/null
fi

# ---------------------------------------------------------------- 4. recorded logs on the GPU
if wanted replay_logs; then
    t0=$(date +%s)
    "$here/replay_logs.sh" "$build_dir" "$WORKDIR/replay" | tee -a "$log"
    failed_replays=${PIPESTATUS[0]}
    problems=$((problems + failed_replays))
    note "ran replay_logs in $(($(date +%s) - t0)) s ($failed_replays failed)"
fi

# ---------------------------------------------------------------- 5. summary
stats_args=()
for file in "$WORKDIR"/stats/*.json; do
    [ -f "$file" ] && stats_args+=("$(basename "$file" .json)=$file")
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
cuda=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
"$PYTHON" "$here/summarize.py" "$raw" "$results_dir/latest.json" --meta \
    "gpu=$gpu" "driver=$driver" "cuda=$cuda" "date=$(date -u '+%Y-%m-%dT%H:%M:%SZ')" \
    "host=$(hostname)" "psbench=$psbench" "rmm=$(cat "$DEPS_DIR/rmm/VERSION" 2>/dev/null || echo none)" \
    "quick=${BENCH_QUICK:-0}" "library=$lib" "wall_s=$(($(date +%s) - started))" \
    --stats "${stats_args[@]}" | tee "$WORKDIR/bench.txt" | tee -a "$log"
if [ -s "$WORKDIR/replay/replay.txt" ]; then
    { echo; echo "=== recorded PyTorch logs replayed on this GPU (tools/bench/replay_logs.sh)"; cat "$WORKDIR/replay/replay.txt"; } |
        tee -a "$WORKDIR/bench.txt" >>"$log"
fi
if [ -n "${OUTDIR:-}" ]; then
    cp "$WORKDIR/bench.txt" "$OUTDIR/bench.txt"
    cp "$log" "$OUTDIR/bench.log"
    tar -czf "$OUTDIR/bench-logs.tar.gz" -C "$WORKDIR" logs stats raw.jsonl 2>/dev/null
fi
note "bench: $(($(date +%s) - started)) s, $problems runs without results"
[ $problems -eq 0 ]
