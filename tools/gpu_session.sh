#!/usr/bin/env bash
# GPU runs by name, one after another: the GPU suite, the demo, `poolshim ab`
# on the demo and on PyTorch, the benchmarks and the probes below. It runs on a
# GPU machine, from a copy of the repository with build/ built where libinih
# is (make; make bench-rmm puts the RMM peer in build/deps) and copied there:
#   OUT=/some/dir tools/gpu_session.sh [tests] [demo] [ab] [traces] [replay] [bench] [pinned] [torchmem]
#                                      [ddp] [ddp_transformer] [multigpu] [soak]
#                                      [benchcore] [scaling] [pinned_remap] [ddpt_twogpu] [pinnedpair]
#                                      [freshthreads] [doors] [context_gate] [walltime] [hotprof] [remap_lend]
#                                      [suite1] [suite2] [suite2_doors] [floor] [idlequery] [growth] [live]
#                                      [growthprof] [copybw] [samples]
# pinned: the pinned host memory benchmarks alone (bench runs them too; ~3 min).
# pinnedpair: host.grow_budget_min: the GPU suite's pinned tests (hazards
# over the default stack and slabs, their negative controls, the probes, and
# pinned_timing with its 1000x verdict on the mean 1 MiB pair), the timing again
# with the floor off (the old behaviour, for the record), then the pinned
# benchmarks' memory verdicts (<= 1.15x); about 6 min.
# replay: the committed PyTorch logs replayed on this GPU (tools/bench/replay_logs.sh,
# also part of bench); traces also plots its log with the recorded reserved curve.
# benchcore: build/bench_core (CPU only, over the fake GPU) on this machine's cores: the
# thread-scaling lines of the default stack (the CI machine has 2 CPUs).
# scaling: tools/bench/scaling.sh: psbench pairs/random/threads/threads_mixed for
# poolshim's stacks beside cudaMallocAsync and RMM, then bench_shim and bench_core on
# this machine's cores (LIBS, PROFILE: see the script; about 3 min).
# freshthreads: psbench threads and threads_mixed in a fresh process per library
# (FRESH_LIBS="label=lib[@POOLSHIM_OPTIONS] ...", default build/libpoolshim.so), with
# the reserved peak and the barriers of each run (about 1 min).
# doors: tools/bench/doors.sh: a pair and the random workload through the static-cudart
# and the shared-cudart door beside RMM's pool, three alternated rounds (about 1 min).
# growth: tools/bench/growth.sh, the first cudaMalloc of 1, 8, 32 GiB and a 1 GiB fill,
# natively and per stack in 4 alternated rounds (about 2 min).
# torchmem: NVML memory of varied PyTorch loops per allocator (about 6 min on an
# H100); ddp: DDP per free policy (needs two GPUs); multigpu:
# the GPU suite's multi-GPU and multi-process tests, then mpirun and torchrun
# jobs timed natively and under the shim, a table per rank (two GPUs, about 3 min);
# soak: the randomized soak of tests/gpu/soak.cu on every stack, SOAK_TOTAL seconds
# in all (default 540: 90 s for each of the 6 runs, under 10 minutes in all;
# SOAK_STACKS=pool SOAK_TOTAL=560 gives one stack the whole time).
# pinned_remap: the pinned range, remap's barrier wait and the barrier hazards, then
# the transformer's and conv net's memory and time beside expandable_segments (about
# 6 min); ddpt_twogpu: DDP of the transformer per allocator and the two-GPU tests
# (two GPUs; about 8 min).
# context_gate: the GPU tests the context gate touches (contexts, hazards, streams,
# captures, IPC, remap, PyTorch; about 5 min; passed on an H100, 2026-11-25).
# remap_lend: remap_lend's GPU tests, then the transformer and conv net in two rounds
# beside expandable_segments (~8 min).
# suite1, suite2: the GPU suite in two halves, under 10 minutes each on an H100 (the
# whole suite takes longer). suite2_doors: suite2, then doors (about 8 min).
# floor: the static runtime's entry floor beside the interposed pairs (pair_cost.cu; ~1 min).
# idlequery: a barrier's host time with 16 / 128 streams, GPU idle and busy, per library
# of LIBS (tools/bench/idle_barrier.cu; ~1 min).
# walltime: ROUNDS alternated runs of torch_mem (WORKLOADS, CONFIGS, POOLSHIM_VARIANTS)
# and the wall times side by side (tools/bench/torch_mem/rounds.py); hotprof: psbench
# random and pairs (static cudart) under the sampling profiler.
# copybw: device-to-device copy bandwidth of pooled blocks (tools/bench/copy_bw.cu: cudaMemcpy and
# a copy kernel, 64 MiB / 256 MiB / 1 GiB) natively and per COPYBW_CONFIGS ("label=POOLSHIM_OPTIONS
# ...", default: the default stack, 4 and 16 MiB pieces, runs from 64 MiB), COPYBW_ROUNDS (4)
# alternated rounds, medians and ratios to native (about 1 min).
# samples: `poolshim ab -n SAMPLES_RUNS` (5) on each of NVIDIA's cuda-samples built by
# tools/bench/fetch_samples.sh into build/deps/samples: the time in allocation
# calls natively and under the default stack, one line per program (about 1 min);
# SAMPLES_CONFIGS="a.ini b.ini": those configurations instead of the default one, a line
# each (an empty file is the default stack).
# Results land under $OUT: gpu/ and bench/ from the scripts, and everything
# else in one archive, extra.tgz (a few files to copy back).
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/poolshim-session}
mkdir -p "$OUT"
what=${*:-tests demo ab traces bench benchcore}
export PATH=$PATH:/usr/local/cuda/bin
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/extras/CUPTI/lib64:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for step in $what; do
    case $step in
    tests)
        echo "=== GPU suite"
        OUTDIR=$OUT/gpu TEST_TIMEOUT=${TEST_TIMEOUT:-90} ./tests/gpu/run.sh build | tail -n 40 ;;
    demo)
        echo "=== demo (make demo)"
        mkdir -p build/demo && nvcc -O2 -o build/demo/alloc_churn tools/demo/alloc_churn.cu &&
            { echo "-- native"; build/demo/alloc_churn; echo "-- under poolshim";
              build/poolshim run -o global.stats=text -- build/demo/alloc_churn; } ;;
    ab)
        echo "=== poolshim ab (demo, static cudart)"
        mkdir -p "$OUT/extra"
        build/poolshim ab --runs 3 --plot "$OUT/extra/demo.svg" -- build/demo/alloc_churn 3000 | tee "$OUT/extra/demo.txt"
        echo "=== poolshim ab (PyTorch, caching off)"
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 build/poolshim ab --runs 2 -- python3 tests/gpu/torch_train.py | tee "$OUT/extra/torch.txt" ;;
    traces)
        mkdir -p "$OUT/extra"
        echo "=== allocation log of PyTorch (caching off, 50 steps), for replay"
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 POOLSHIM_LOG="$OUT/extra/torch_train_50.csv" \
            LD_PRELOAD=$PWD/build/libpoolshim.so python3 tests/gpu/torch_train.py 50
        wc -l "$OUT/extra/torch_train_50.csv" "$OUT/extra/torch_train_50.csv.reserved.csv"
        echo "=== its plot (recorded reserved beside simulated) and replay --simulate (recorded peak beside)"
        build/poolshim plot "$OUT/extra/torch_train_50.csv" -o "$OUT/extra/torch_train_50.svg" &&
            grep -c "reserved on the GPU (recorded)" "$OUT/extra/torch_train_50.svg"
        build/poolshim replay "$OUT/extra/torch_train_50.csv" --simulate 80GiB
        echo "=== the same log replayed on this GPU"
        build/poolshim replay "$OUT/extra/torch_train_50.csv" --native
        build/poolshim replay "$OUT/extra/torch_train_50.csv" --native --gpu-lag 5ms
        echo "=== which driver entry points JAX's platform allocator looks up"
        XLA_PYTHON_CLIENT_ALLOCATOR=platform POOLSHIM_TRACE_LOOKUPS=1 POOLSHIM_STATS=text \
            LD_PRELOAD=$PWD/build/libpoolshim.so python3 tools/bench/jax_loop.py 20 >"$OUT/extra/jax_trace.txt" 2>&1
        grep -E "RESULT|stats|calls" "$OUT/extra/jax_trace.txt" | tail -8
        grep -o "trace: [a-zA-Z_]*([a-zA-Z_0-9]*" "$OUT/extra/jax_trace.txt" | grep -iE "mem|alloc|pool|va" | sort | uniq -c | sort -rn | head -40 ;;
    replay)
        echo "=== recorded PyTorch logs replayed on this GPU"
        mkdir -p "$OUT/replay"
        ./tools/bench/replay_logs.sh build "$OUT/replay-work"
        cp "$OUT/replay-work/replay.txt" "$OUT/replay/replay.txt"
        rm -rf "$OUT/replay-work"
        cat "$OUT/replay/replay.txt" ;;
    bench)
        echo "=== benchmarks"
        OUTDIR=$OUT/bench ./tools/bench/run.sh build | tail -n 80 ;;
    pinned)
        echo "=== pinned host memory: PyTorch pin_memory loader, CuPy pipeline (also part of bench)"
        mkdir -p "$OUT/pinned"
        python3 tools/bench/pinned/pinned_bench.py --lib build/libpoolshim.so --json "$OUT/pinned/pinned.json" |
            tee "$OUT/pinned/pinned.txt" | tail -n 60 ;;
    benchcore)
        echo "=== bench_core (CPU, $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg))"
        if [ -x build/bench_core ]; then
            # with the sampling profiler over every thread (the 16-thread rows are where
            # the default pool collapsed on an H100, 2026-11-23): where the time goes
            SAMPLER_MODE=process SAMPLER_OUT=$OUT/bench_core.samples LD_PRELOAD=$PWD/build/sampler.so \
                build/bench_core | tee "$OUT/bench_core.txt"
            python3 tools/prof/resolve.py "$OUT/bench_core.samples" build/bench_core | head -n 30 |
                tee "$OUT/bench_core_profile.txt"
        else echo "build/bench_core missing: make build/bench_core where libinih is, and copy build/ here"; fi ;;
    freshthreads)
        echo "=== threads in a fresh process (tools/bench/fresh_threads.sh)"
        # shellcheck disable=SC2086 # (a list of label=lib words)
        tools/bench/fresh_threads.sh ${FRESH_LIBS:-} ;;
    doors)
        echo "=== both doors beside RMM's pool (tools/bench/doors.sh)"
        tools/bench/doors.sh ;;
    scaling)
        echo "=== thread scaling and pair cost (tools/bench/scaling.sh)"
        OUT_DIR=$OUT/scaling tools/bench/scaling.sh build
        (cd "$OUT" && tar czf scaling.tgz scaling && rm -rf scaling) ;;
    torchmem)
        echo "=== PyTorch memory on varied shapes (NVML)"
        OUT_DIR=$OUT/torchmem TRACE_DIR=$OUT/torchmem/traces tools/bench/torch_mem/run.sh build/libpoolshim.so |
            grep -v '^ran ' | tail -n 50 ;;
    ddp)
        echo "=== DDP on two GPUs per free policy"
        OUT_DIR=$OUT/ddp tools/bench/torch_mem/ddp.sh build/libpoolshim.so ;;
    ddp_transformer)
        echo "=== DDP of the transformer (random length and batch) on two GPUs per free policy"
        OUT_DIR=$OUT/ddp_transformer WORKLOAD=ddp_transformer STEPS=${STEPS:-150} \
            tools/bench/torch_mem/ddp.sh build/libpoolshim.so ;;
    growth)
        echo "=== growth: first cudaMalloc of 1, 8, 32 GiB and a 1 GiB fill (tools/bench/growth.sh)"
        OUT_DIR=$OUT/growth tools/bench/growth.sh build ;;
    growthprof)
        # where a fresh process's first big cudaMalloc spends its time under the default
        # stack (the target: growth at native speed): GROWTHPROF_ROUNDS (default 4) alternated
        # rounds of tools/bench/first_malloc.cu for 1 and 8 GiB, natively and under the
        # shim with its NVTX ranges timed by the CPU tests' NVTX tool (build/fake/
        # libfake_nvtx.so, FAKE_NVTX_SUMMARY=1: each range with its time), the verbose
        # start-up lines and the statistics' cuda_time; about 30 s
        echo "=== growthprof: the first 1 and 8 GiB cudaMalloc, native and under the shim with timed ranges"
        mkdir -p "$OUT/extra/growthprof"
        gp=$OUT/extra/growthprof
        nvcc -O2 -o "$gp/first_malloc" tools/bench/first_malloc.cu >"$gp/build.log" 2>&1 || echo "growthprof: build failed"
        for round in $(seq 1 "${GROWTHPROF_ROUNDS:-4}"); do
            for size in 1 8; do
                env -u LD_PRELOAD "$gp/first_malloc" "$size" | sed "s/^/native $round /"
                env LD_PRELOAD="$PWD/build/libpoolshim.so" POOLSHIM_NVTX_RANGES=1 \
                    NVTX_INJECTION64_PATH="$PWD/build/fake/libfake_nvtx.so" FAKE_NVTX_SUMMARY=1 POOLSHIM_VERBOSE=2 \
                    POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$gp/stats_${size}_$round.json" \
                    "$gp/first_malloc" "$size" 2>&1 | sed "s/^/shim $round /" | grep -E 'first_malloc|fake_nvtx|stack ready|set up in'
            done
        done | tee "$gp/growthprof.txt"
        python3 - "$gp" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/stats_*.json")):
    d = json.load(open(f))["devices"][0]
    print(f.rsplit("/", 1)[1], "cuda_time", json.dumps(d.get("cuda_time")), "time_ns", json.dumps(d.get("time_ns")))
PY
        ;;
    samples)
        samples=${DEPS_DIR:-build/deps}/samples
        echo "=== samples: poolshim ab on NVIDIA's cuda-samples ($(cat "$samples/COMMIT" 2>/dev/null || echo 'none built'))"
        mkdir -p "$OUT/extra/samples"
        for s in "$samples"/*; do
            [ -x "$s" ] && [ -f "$s" ] || continue
            sample_configs=()
            for c in ${SAMPLES_CONFIGS:-}; do sample_configs+=(-c "$c"); done
            build/poolshim ab -n "${SAMPLES_RUNS:-5}" "${sample_configs[@]}" -- "$s" >"$OUT/extra/samples/$(basename "$s").txt" 2>&1
            echo "-- $(basename "$s")"
            grep ' vs baseline: ' "$OUT/extra/samples/$(basename "$s").txt"
        done ;;
    copybw)
        echo "=== copybw: device-to-device copies of pooled blocks, ${COPYBW_ROUNDS:-4} alternated rounds"
        mkdir -p "$OUT/extra/copybw"
        cb=$OUT/extra/copybw
        nvcc -O2 -o "$cb/copy_bw" tools/bench/copy_bw.cu >"$cb/build.log" 2>&1 || echo "copybw: build failed"
        configs=${COPYBW_CONFIGS:-default= piece4=resource.main.expandable_piece=4MiB piece16=resource.main.expandable_piece=16MiB run64=resource.main.expandable_run_min=64MiB}
        for round in $(seq 1 "${COPYBW_ROUNDS:-4}"); do
            env -u LD_PRELOAD "$cb/copy_bw" | sed "s/^/$round native /"
            for c in $configs; do
                env LD_PRELOAD="$PWD/build/libpoolshim.so" POOLSHIM_OPTIONS="${c#*=}" "$cb/copy_bw" | sed "s/^/$round ${c%%=*} /"
            done
        done >"$cb/copybw.txt"
        python3 - "$cb/copybw.txt" <<'PY'
import collections, re, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"(\d+) (\S+) copy_bw: (\S+) (\d+) MiB ([0-9.]+) GB/s", line)
    if m and m.group(1) != "1":  # the first round apart
        runs[(m.group(3), m.group(4), m.group(2))].append(float(m.group(5)))
labels = sorted({k[2] for k in runs}, key=lambda l: (l != "native", l))
for kind, size in sorted({(k[0], k[1]) for k in runs}, key=lambda k: (k[0], int(k[1]))):
    base = statistics.median(runs[(kind, size, "native")])
    cells = ["%s %.0f (%.3f)" % (l, statistics.median(runs[(kind, size, l)]), statistics.median(runs[(kind, size, l)]) / base)
             for l in labels if runs[(kind, size, l)]]
    print("copybw: %-6s %5s MiB  %s  GB/s, medians of rounds 2+" % (kind, size, "  ".join(cells)))
PY
        grep -E "FAIL|error [^c]" "$cb/copybw.txt" | grep -v cudaSuccess | head -5 ;;
    live)
        # poolshim top beside a PyTorch loop against its exit report, the loop's log exported
        # and opened by torch.cuda._memory_viz, its NVTX ranges under the fake NVTX tool
        # (build/fake/libfake_nvtx.so; about 1 min)
        echo "=== live views (tests/gpu/live_views.py)"
        python3 tests/gpu/live_views.py build "$OUT/live" ;;
    multigpu)
        echo "=== several GPUs and processes: tests (tests/gpu/run.sh, TESTS=multi_gpu|mpi_ranks|ddp)"
        OUTDIR=$OUT/multigpu TESTS='multi_gpu|mpi_ranks|ddp' TEST_TIMEOUT=${TEST_TIMEOUT:-180} \
            ./tests/gpu/run.sh build | grep -vE '^(PASS|SKIP) build/' | tail -n 60
        echo "=== several GPUs and processes: per rank, native vs shim (tools/bench/multigpu.sh)"
        OUT_DIR=$OUT/multigpu/bench tools/bench/multigpu.sh build ;;
    pinned_remap)
        # the pinned range (host-located cuMemCreate pieces, the pinned default now),
        # remap's barrier wait (remap_idle busy expects remap_waits>0; its new negative
        # control POOLSHIM_TEST_WAIT_RETURNS=1 must fault), then the transformer's
        # wall time with the waits beside expandable_segments (about 4 min)
        echo "=== pinned_remap: pinned, remap, barrier hazards"
        OUTDIR=$OUT/pinned_remap TESTS='pinned|remap_idle|expandable|hazard_barrier_(legacy|nonblocking|graph|threads16)' \
            TEST_TIMEOUT=${TEST_TIMEOUT:-120} ./tests/gpu/run.sh build | grep -vE '^PASS build/' | tail -n 70
        echo "=== pinned_remap: transformer and conv net memory and time (remap waits)"
        OUT_DIR=$OUT/pinned_remap/tm WORKLOADS="transformer convnet" CONFIGS="nocache expandable poolshim" \
            tools/bench/torch_mem/run.sh build/libpoolshim.so
        rm -rf "$OUT/pinned_remap/tm/runs" ;;
    context_gate)
        # the gate around each GPU-ops table (every
        # call into CUDA of the shim now takes a rwlock; a context reset closes it):
        # context lifecycle, hazards, streams, captures, IPC, remap, PyTorch
        echo "=== context_gate: the GPU tests it touches"
        OUTDIR=$OUT/context_gate/gpu TESTS='context_reset|hazard|async_streams|alloc_basic|capture|ipc|remap_idle|expandable|misc|torch' \
            TEST_TIMEOUT=${TEST_TIMEOUT:-120} ./tests/gpu/run.sh build | grep -vE '^PASS build/' | tail -n 60 ;;
    remap_lend)
        # remap_lend (a remap maps busy pieces' memory a second time instead of
        # waiting on the host): the GPU tests of remap, growth, hazards, contexts and PyTorch
        # (about 4 min), then the transformer and conv net, two alternated rounds beside
        # expandable_segments, with remap_lend=0 as "wait" (about 4 min)
        echo "=== remap_lend: GPU tests"
        OUTDIR=$OUT/remap_lend/gpu TESTS='remap_idle|expandable|hazard_barrier_(nonblocking|legacy|graph|threads16|newstream)|hazard_barrier_skipped_(nonblocking|graph)|context_reset_(static|shared)_runtime_pool|misc|ipc|torch' \
            TEST_TIMEOUT=${TEST_TIMEOUT:-120} ./tests/gpu/run.sh build | grep -vE '^PASS build/' | tail -n 40
        echo "=== remap_lend: transformer and conv net (remap_lend 1 = poolshim, 0 = wait)"
        ROUNDS=${ROUNDS:-2} WORKLOADS="transformer convnet" CONFIGS="expandable poolshim" \
            POOLSHIM_VARIANTS="wait:POOLSHIM_OPTIONS=resource.main.remap_lend=0" OUT=$OUT "$PWD/tools/gpu_session.sh" walltime ;;
    floor)
        # the static runtime's own cost per call pair (tools/bench/pair_cost.cu's
        # entry floor: cudaMalloc of 0 B + cudaFree(NULL), no interposer runs inside it)
        # beside the interposed 256 B and 1 MiB pairs, static and shared cudart, three
        # alternated rounds in fresh processes
        mkdir -p build/floor &&
            nvcc -O2 -o build/floor/pc_static tools/bench/pair_cost.cu -lcuda &&
            nvcc -O2 -cudart shared -o build/floor/pc_shared tools/bench/pair_cost.cu -lcuda || continue
        lib=$PWD/build/libpoolshim.so
        for round in 1 2 3; do
            for kind in static shared; do
                echo "round $round $kind native: $(build/floor/pc_$kind 256 2000 | grep -E 'best' | sed 's/.*best/best/' | tr '\n' ' ')"
                for size in 256 1048576; do
                    echo "round $round $kind shim $size: $(LD_PRELOAD=$lib build/floor/pc_$kind $size 200000 | grep -E 'best' | sed 's/.*best/best/' | tr '\n' ' ')"
                done
            done
        done ;;
    idlequery)
        # a barrier's host time with 16 and 128 non-blocking streams, the GPU idle and
        # busy (tools/bench/idle_barrier.cu: one 4 MiB pair per barrier, barrier_floor 0),
        # for each library of LIBS (default build/libpoolshim.so: e.g. a variant built
        # here with make BUILD=build/variant OPT="-O2 -g -D..." build/variant/libpoolshim.so)
        mkdir -p build/floor && nvcc -O2 -o build/floor/idle_barrier tools/bench/idle_barrier.cu || continue
        for round in 1 2; do
            for gpu in idle busy; do
                for n in 16 128; do
                    for lib in ${LIBS:-build/libpoolshim.so}; do
                        printf 'round %s %-36s ' "$round" "$lib"
                        POOLSHIM_OPTIONS=resource.main.barrier_floor=0 LD_PRELOAD=$PWD/$lib \
                            build/floor/idle_barrier "$n" 2000 "$gpu"
                    done
                done
            done
        done ;;
    walltime)
        # wall time needs rounds: one run moves by 5-25 %. ROUNDS (default 3) runs of
        # torch_mem.sh with WORKLOADS (default "mlp transformer"), CONFIGS (default
        # "expandable poolshim") and POOLSHIM_VARIANTS, then the per-round table
        # (tools/bench/torch_mem/rounds.py); a transformer run is ~18 s, an MLP run ~13 s
        # (each configuration of each workload, per round). Only each round's
        # torch_mem.json is kept ($OUT/walltime/roundN.json), so that a call cut short
        # still brings back the rounds it finished.
        echo "=== walltime: ${ROUNDS:-3} alternated rounds"
        mkdir -p "$OUT/walltime"
        for round in $(seq 1 "${ROUNDS:-3}"); do
            OUT_DIR=$OUT/walltime/r$round WORKLOADS=${WORKLOADS:-mlp transformer} \
                CONFIGS=${CONFIGS:-expandable poolshim} POOLSHIM_VARIANTS=${POOLSHIM_VARIANTS:-} \
                tools/bench/torch_mem/run.sh "$PWD/build/libpoolshim.so" | grep -E '^(ran|FAIL)'
            mv "$OUT/walltime/r$round/torch_mem.json" "$OUT/walltime/round$round.json"
            rm -rf "$OUT/walltime/r$round"
        done
        python3 tools/bench/torch_mem/rounds.py "$OUT"/walltime/round*.json | tee "$OUT/walltime/rounds.txt" ;;
    hotprof)
        # where a static-cudart psbench spends its time on this host (for a GPU machine
        # without perf): the random workload and the 256 B pairs under build/sampler.so;
        # the raw samples come back (resolve them where the build was made:
        # tools/prof/resolve.py FILE build/libpoolshim.so build/deps/bench/psbench); about 1 min
        echo "=== hotprof: psbench random and pairs under the sampler"
        mkdir -p "$OUT/hotprof"
        for w in random pairs; do
            # (env after timeout: the sampler in psbench, not in timeout, which writes the file last)
            timeout 120 env SAMPLER_OUT="$OUT/hotprof/$w.samples" \
                LD_PRELOAD="$PWD/build/libpoolshim.so:$PWD/build/sampler.so" \
                "${DEPS_DIR:-build/deps}/bench/psbench" --label "$w" --workloads "$w" --allocator cudaMalloc 2>&1 |
                sed -n 's/^JSON //p' | cut -c1-200
        done ;;
    pinnedpair)
        echo "=== pinnedpair: pinned tests and pair timing (host.grow_budget_min, default 16 MiB)"
        OUTDIR=$OUT/pinnedpair/gpu TESTS='pinned' TEST_TIMEOUT=${TEST_TIMEOUT:-180} ./tests/gpu/run.sh build |
            grep -vE '^PASS build/' | tail -n 50
        echo "=== pinnedpair: the timing with host.grow_budget_min=0 (the old behaviour)"
        OUTDIR=$OUT/pinnedpair/nofloor TESTS='pinned_timing' PINNED_TIMING_OPTIONS=host.grow_budget_min=0 \
            ./tests/gpu/run.sh build | grep -E 'timing|ratio|stats'
        echo "=== pinnedpair: pinned benchmarks (peak reserved <= 1.15x requested)"
        python3 tools/bench/pinned/pinned_bench.py --lib build/libpoolshim.so --json "$OUT/pinnedpair/pinned.json" |
            tee "$OUT/pinnedpair/pinned.txt" | grep -E '^(PASS|FAIL|NOTE|SKIP)|ratio' ;;
    suite1 | suite2 | suite2_doors)
        # the GPU suite no longer fits one 10-minute call on an H100 (2026-11-25: cut at
        # 420 s in the context tests): suite1 is its CUDA-program half (alloc, hazard,
        # expandable, remap, IPC, misc, async, stacks, barrier per resource, contexts,
        # several GPUs), suite2 the rest (PyTorch, CuPy, numba, pinned, overhead, replay,
        # sanitizer, guard, soak); each about 5-7 min. suite2_doors: suite2 and then both
        # doors beside RMM's pool (first run for the size stack's 1024 places and the
        # inlined lists, which had been timed on the CPU only)
        first='hazard|capture|stack|alloc_basic|expandable|remap|ipc|misc|async|release|fill_count|multi_gpu|mpi|ddp|peer|context_reset'
        half=second sel=(SKIP_TESTS="$first")
        [ "$step" = suite1 ] && half=first sel=(TESTS="$first")
        echo "=== $step: the GPU suite, its $half half"
        env OUTDIR="$OUT/$step" TEST_TIMEOUT="${TEST_TIMEOUT:-120}" "${sel[@]}" ./tests/gpu/run.sh build |
            grep -vE '^(PASS|SKIP) ' | tail -n 30
        if [ "$step" = suite2_doors ]; then
            echo "=== suite2_doors: both doors beside RMM's pool"
            tools/bench/doors.sh
        fi ;;
    ddpt_twogpu)
        # two GPUs: DDP of the transformer per rank, and the
        # two-GPU tests after the peer-access mapping was refactored (about 8 min)
        echo "=== ddpt_twogpu: DDP of the transformer (nocache, torch, expandable, poolshim)"
        CONFIGS="nocache torch expandable poolshim" OUT_DIR=$OUT/ddpt_twogpu/ddpt WORKLOAD=ddp_transformer \
            STEPS=${STEPS:-150} tools/bench/torch_mem/ddp.sh build/libpoolshim.so
        rm -f "$OUT"/ddpt_twogpu/ddpt/*.smi
        echo "=== ddpt_twogpu: two-GPU tests"
        OUTDIR=$OUT/ddpt_twogpu/gpu TESTS='multi_gpu|mpi_ranks|ddp|peer' TEST_TIMEOUT=${TEST_TIMEOUT:-150} \
            ./tests/gpu/run.sh build | grep -vE '^(PASS|SKIP) build/' | tail -n 50 ;;
    soak)
        stacks=${SOAK_STACKS:-pool pool_shared arena binning fixed_over_pool async}
        count=$(printf '%s\n' $stacks | wc -l)
        per=$(( ${SOAK_TOTAL:-540} / count ))
        echo "=== soak: $per s per stack ($stacks)"
        pattern=$(printf 'soak/%s$|' $stacks)
        OUTDIR=$OUT/soak TESTS="^(${pattern%|})" SOAK_SECONDS=$per ./tests/gpu/run.sh build | grep -E '^(PASS|FAIL|SKIP) soak|passed' ;;
    esac
done
[ -d "$OUT/extra" ] && (cd "$OUT" && tar czf extra.tgz extra && rm -rf extra)
