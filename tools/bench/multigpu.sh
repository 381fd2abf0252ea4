#!/usr/bin/env bash
# Several processes on two GPUs, natively and under the shim, in one run:
# `tools/gpu_session.sh multigpu` and `make bench` (on a machine with two GPUs)
# run `tools/bench/multigpu.sh BUILD_DIR`. The GPU suite (tests/gpu/run.sh,
# sections 3c and 9) checks the same jobs for correctness; this times them.
#   1. Builds tests/gpu/mp_ranks.cu (plain nvcc, static cudart: the driver door).
#   2. mpirun -np 2 mp_ranks natively, then under the shim (Open MPI: -x
#      LD_PRELOAD; another launcher: `env` in front of the program), each
#      rank writing POOLSHIM_STATS_FILE=OUT_DIR/mpi_stats_%r.json.
#   3. torchrun 2-rank DDP (tools/bench/torch_mem/workloads.py ddp, NCCL),
#      PyTorch's cache off, natively and under the shim (ddp_stats_%r.json).
#   3b. tools/bench/peer_copy_bw.cu in 4 alternated rounds, without and with peer
#      access enabled: median GB/s of each copy natively and under the shim, the ratio.
#   4. multigpu_report.py prints one row per job and rank: allocation calls the
#      shim served, time in them, peak requested / reserved, wall time native
#      and under the shim (the programs' own clocks), and whether the rank's
#      result (checksum, final loss) equals the native one; multigpu.json too.
# A job whose native run fails (no mpirun, one GPU, no PyTorch) is left out
# with a line saying why. Environment: OUT_DIR (default /tmp/poolshim-multigpu),
# MPIRUN (mpirun), MPI_STEPS (20000), DDP_STEPS (300), PYTHON, NVCC, GPU_ARCH.
# Exit status: 0 when every job that ran matched its native results.
set -u
build_dir=${1:-build}
repo=$(cd "$(dirname "$0")/../.." && pwd)
lib=$(realpath -m "$build_dir/libpoolshim.so")
OUT_DIR=${OUT_DIR:-/tmp/poolshim-multigpu}
MPIRUN=${MPIRUN:-mpirun}
MPI_STEPS=${MPI_STEPS:-20000}
DDP_STEPS=${DDP_STEPS:-300}
PYTHON=${PYTHON:-python3}
GPU_ARCH=${GPU_ARCH:-sm_90}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")}
mkdir -p "$OUT_DIR" || exit 1
rm -f "$OUT_DIR"/*_stats_*.json
jobs=()
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "multigpu: $gpus GPU(s); library $lib"

# ---------------------------------------------------------------- 2. mpirun
if ! command -v "$MPIRUN" >/dev/null 2>&1; then
    echo "multigpu: mpirun job left out: no $MPIRUN on PATH"
elif ! "$NVCC" -arch="$GPU_ARCH" -O2 -std=c++17 -I"$repo/tests/gpu" -o "$OUT_DIR/mp_ranks" \
    "$repo/tests/gpu/mp_ranks.cu" >"$OUT_DIR/build.log" 2>&1; then
    echo "multigpu: mpirun job left out: mp_ranks.cu did not build (see $OUT_DIR/build.log)"
else
    mpi=("$MPIRUN" -np 2) mpi_env=() open_mpi=0
    if "$MPIRUN" --version 2>&1 | grep -qiE 'open mpi|open-mpi|openrte|prrte'; then
        open_mpi=1
        mpi+=(--oversubscribe --bind-to none)
        if [ "$(id -u)" = 0 ]; then
            mpi+=(--allow-run-as-root)
            mpi_env=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
        fi
    fi
    env -u LD_PRELOAD "${mpi_env[@]}" timeout 300 "${mpi[@]}" "$OUT_DIR/mp_ranks" "$MPI_STEPS" >"$OUT_DIR/mpi_native.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "multigpu: mpirun job left out: it fails natively (exit $rc, $OUT_DIR/mpi_native.log)"
    else
        stats_env=(POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$OUT_DIR/mpi_stats_%r.json")
        if [ $open_mpi = 1 ]; then
            env -u LD_PRELOAD "${mpi_env[@]}" timeout 300 "${mpi[@]}" -x LD_PRELOAD="$lib" -x "${stats_env[0]}" \
                -x "${stats_env[1]}" "$OUT_DIR/mp_ranks" "$MPI_STEPS" >"$OUT_DIR/mpi_shim.log" 2>&1
        else
            env -u LD_PRELOAD "${mpi_env[@]}" timeout 300 "${mpi[@]}" env LD_PRELOAD="$lib" "${stats_env[@]}" \
                "$OUT_DIR/mp_ranks" "$MPI_STEPS" >"$OUT_DIR/mpi_shim.log" 2>&1
        fi
        rc=$?
        [ $rc -ne 0 ] && echo "multigpu: mpirun under the shim exited $rc ($OUT_DIR/mpi_shim.log)"
        [ ${#jobs[@]} -gt 0 ] && jobs+=(--)
        jobs+=(mpirun "$OUT_DIR/mpi_native.log" "$OUT_DIR/mpi_shim.log" "$OUT_DIR"/mpi_stats_*.json)
    fi
fi

# ---------------------------------------------------------------- 3. torchrun DDP
if [ "$gpus" -lt 2 ]; then
    echo "multigpu: DDP job left out: needs two GPUs"
elif ! "$PYTHON" -c 'import torch, torch.distributed, sys; sys.exit(0 if torch.cuda.device_count() >= 2 and torch.distributed.is_nccl_available() else 1)' >/dev/null 2>&1; then
    echo "multigpu: DDP job left out: no PyTorch with NCCL and two GPUs"
else
    ddp=("$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2
        "$repo/tools/bench/torch_mem/workloads.py" ddp --steps "$DDP_STEPS")
    env -u LD_PRELOAD PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 600 "${ddp[@]}" >"$OUT_DIR/ddp_native.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "multigpu: DDP job left out: it fails natively (exit $rc, $OUT_DIR/ddp_native.log)"
    else
        env LD_PRELOAD="$lib" POOLSHIM_STATS=json POOLSHIM_STATS_FILE="$OUT_DIR/ddp_stats_%r.json" \
            PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 600 "${ddp[@]}" >"$OUT_DIR/ddp_shim.log" 2>&1
        rc=$?
        [ $rc -ne 0 ] && echo "multigpu: DDP under the shim exited $rc ($OUT_DIR/ddp_shim.log)"
        [ ${#jobs[@]} -gt 0 ] && jobs+=(--)
        jobs+=(ddp "$OUT_DIR/ddp_native.log" "$OUT_DIR/ddp_shim.log" "$OUT_DIR"/ddp_stats_*.json)
    fi
fi

# ---------------------------------------------------------------- 3b. copies between the devices
# tools/bench/peer_copy_bw.cu, 4 rounds alternating native and the shim, without and with
# peer access enabled: the median GB/s of each copy and the shim's ratio to native
if [ "$gpus" -ge 2 ] && "$NVCC" -O2 -o "$OUT_DIR/peer_copy_bw" "$repo/tools/bench/peer_copy_bw.cu" >"$OUT_DIR/peer_copy_bw_build.log" 2>&1; then
    for mode in staged peer; do
        arg=()
        [ $mode = peer ] && arg=(peer)
        for round in 1 2 3 4; do
            env -u LD_PRELOAD "$OUT_DIR/peer_copy_bw" "${arg[@]}" | sed "s/^/native $round /"
            env LD_PRELOAD="$lib" "$OUT_DIR/peer_copy_bw" "${arg[@]}" | sed "s/^/shim $round /"
        done >"$OUT_DIR/peer_copy_bw_$mode.txt"
        how="peer access not enabled (a native copy is staged through the host)"
        [ $mode = peer ] && how="peer access enabled"
        echo "multigpu: copies between devices, $how, 4 alternated rounds, medians:"
        "$PYTHON" "$repo/tools/bench/rounds_table.py" peer "$OUT_DIR/peer_copy_bw_$mode.txt"
    done
else
    echo "multigpu: copies between devices left out: needs two GPUs and nvcc"
fi

# ---------------------------------------------------------------- 4. the table
if [ ${#jobs[@]} -eq 0 ]; then
    echo "multigpu: no job ran"
    exit 0
fi
"$PYTHON" "$repo/tools/bench/multigpu_report.py" "${jobs[@]}" --json "$OUT_DIR/multigpu.json" >"$OUT_DIR/multigpu.txt"
rc=$?
cat "$OUT_DIR/multigpu.txt"
exit $rc
