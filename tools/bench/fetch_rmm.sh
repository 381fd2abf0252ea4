#!/bin/sh
# Fetches RMM's headers for the benchmark peers and builds psbench with RMM.
#
# RMM 24.12 is header-only for what psbench uses. Its wheel (librmm-cu12) holds
# include/rmm plus the fmt, spdlog and nvtx3 headers it needs; it builds
# against CUDA 13.0's own CCCL after removing one unused include
# (<thrust/optional.h>, gone from CCCL 3) and defining
# LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE. Nothing of RMM is committed:
#   1. pip download --no-deps librmm-cu12==24.12.* into a temporary folder;
#   2. extract include/{rmm,fmt,spdlog,nvtx3} into $DEPS_DIR/rmm/include
#      (about 2 MiB; RMM is Apache-2.0, its LICENSE goes along), patch it;
#   3. build $DEPS_DIR/bench/psbench with -DPS_WITH_RMM (static cudart, runs on
#      any machine with a driver), and record the source's checksum beside it so
#      tools/bench/run.sh can tell whether the binary matches psbench.cu; then
#      $DEPS_DIR/bench/psbench_shared, the same with -cudart shared (the runtime
#      door; docs/benchmarks.md, "Both doors").
# Environment: DEPS_DIR (default <repo>/build/deps: inside build/, so it goes to
# the GPU machine with build/), NVCC, GPU_ARCH (sm_90), RMM_VERSION (24.12.*),
# PYTHON (python3).
# shellcheck disable=SC2154 # repo and tmp are deps_env.sh's
set -eu
# shellcheck source=tools/bench/deps_env.sh
. "$(dirname "$0")/deps_env.sh"
RMM_VERSION=${RMM_VERSION:-24.12.*}
PYTHON=${PYTHON:-python3}

if [ ! -f "$DEPS_DIR/rmm/include/rmm/mr/device/pool_memory_resource.hpp" ]; then
    echo "fetch_rmm: downloading librmm-cu12==$RMM_VERSION"
    "$PYTHON" -m pip download --quiet --no-deps --dest "$tmp" "librmm-cu12==$RMM_VERSION"
    wheel=$(find "$tmp" -maxdepth 1 -name 'librmm_cu12-*.whl' | head -1)
    mkdir -p "$tmp/x"
    (cd "$tmp/x" && unzip -q "$wheel" 'librmm/include/rmm/*' 'librmm/include/fmt/*' \
        'librmm/include/spdlog/*' 'librmm/include/nvtx3/*' 'librmm/VERSION' '*LICENSE*')
    rm -rf "$DEPS_DIR/rmm"
    mkdir -p "$DEPS_DIR/rmm"
    mv "$tmp/x/librmm/include" "$DEPS_DIR/rmm/include"
    cp "$tmp/x/librmm/VERSION" "$DEPS_DIR/rmm/VERSION"
    find "$tmp/x" -name 'LICENSE*' -exec cp {} "$DEPS_DIR/rmm/" \; 2>/dev/null || true
    # CCCL 3 (CUDA 13) has no thrust/optional.h; RMM 24.12 includes it without using it.
    sed -i '/#include <thrust\/optional.h>/d' "$DEPS_DIR/rmm/include/rmm/mr/device/pool_memory_resource.hpp"
    echo "fetch_rmm: headers of RMM $(cat "$DEPS_DIR/rmm/VERSION") in $DEPS_DIR/rmm/include"
fi

mkdir -p "$DEPS_DIR/bench"
echo "fetch_rmm: building $DEPS_DIR/bench/psbench with RMM (about a minute)"
"$NVCC" -arch="$GPU_ARCH" -O2 -lineinfo -std=c++17 -DPS_WITH_RMM -I"$DEPS_DIR/rmm/include" \
    -DLIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE -DSPDLOG_FMT_EXTERNAL -DFMT_HEADER_ONLY \
    -o "$DEPS_DIR/bench/psbench.tmp" "$repo/tools/bench/psbench.cu"
mv "$DEPS_DIR/bench/psbench.tmp" "$DEPS_DIR/bench/psbench"
# the same linked to the shared cudart: the runtime door (psbench above is static: the driver door)
"$NVCC" -arch="$GPU_ARCH" -O2 -lineinfo -std=c++17 -DPS_WITH_RMM -I"$DEPS_DIR/rmm/include" \
    -DLIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE -DSPDLOG_FMT_EXTERNAL -DFMT_HEADER_ONLY -cudart shared \
    -o "$DEPS_DIR/bench/psbench_shared.tmp" "$repo/tools/bench/psbench.cu" &&
    mv "$DEPS_DIR/bench/psbench_shared.tmp" "$DEPS_DIR/bench/psbench_shared"
(cd "$repo/tools/bench" && sha256sum psbench.cu) >"$DEPS_DIR/bench/psbench.cu.sha256"
du -sh "$DEPS_DIR/rmm" "$DEPS_DIR/bench"
echo "fetch_rmm: done"
