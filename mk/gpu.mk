# GPU suite and benchmarks (tests/gpu, tools/bench). `make check-gpu` and
# `make bench` (top Makefile) run the scripts on a GPU machine; these targets
# work anywhere nvcc is installed, no GPU needed:
#   make gpu-build    compile every GPU test program and psbench (proves they build)
#   make test-gpu-scripts   (part of `make test`) the unit tests of check_stats.py and a
#                     syntax check (bash -n; shellcheck where installed) of the GPU scripts
#   make bench-rmm    fetch RMM's headers and build psbench with the RMM peers into
#                     build/deps/ (DEPS_DIR; a GPU machine gets it with a copy of build/)
# GPU_ARCH: the nvcc target (H100/H200: sm_90).
GPU_ARCH  ?= sm_90
GPU_BUILD := $(BUILD)/gpu
GPU_NVCC  := $(NVCC) -arch=$(GPU_ARCH) -O2 -lineinfo -std=c++17 -Itests/gpu
GPU_PROGS := alloc_basic_static alloc_basic_shared alloc_basic_driver hazard_static \
             hazard_ptds async_streams_static misc_static overhead_static context_reset_static psbench \
             multi_gpu_static multi_gpu_shared mp_ranks_static \
             sanitize_static soak_static barrier_cost oom_retry_static neighbours_static decay_idle_static

.PHONY: gpu-build bench-rmm test-gpu-scripts
gpu-build: $(GPU_PROGS:%=$(GPU_BUILD)/%)

$(GPU_BUILD)/alloc_basic_static: tests/gpu/alloc_basic.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $<
$(GPU_BUILD)/alloc_basic_shared: tests/gpu/alloc_basic.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -cudart shared -o $@ $<
$(GPU_BUILD)/alloc_basic_driver: tests/gpu/alloc_basic.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -DUSE_DRIVER_API -o $@ $< -lcuda
$(GPU_BUILD)/hazard_static: tests/gpu/hazard.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $<
$(GPU_BUILD)/hazard_ptds: tests/gpu/hazard.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) --default-stream per-thread -o $@ $<
$(GPU_BUILD)/async_streams_static: tests/gpu/async_streams.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $<
$(GPU_BUILD)/misc_static: tests/gpu/misc.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $< -lcuda
$(GPU_BUILD)/context_reset_static: tests/gpu/context_reset.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $< -lcuda
$(GPU_BUILD)/overhead_static: tests/gpu/overhead.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $<
$(GPU_BUILD)/multi_gpu_static: tests/gpu/multi_gpu.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $<
$(GPU_BUILD)/multi_gpu_shared: tests/gpu/multi_gpu.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -cudart shared -o $@ $<
$(GPU_BUILD)/mp_ranks_static: tests/gpu/mp_ranks.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $<
$(GPU_BUILD)/sanitize_static: tests/gpu/sanitize.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $<
$(GPU_BUILD)/soak_static: tests/gpu/soak.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $< -lcuda
$(GPU_BUILD)/oom_retry_static: tests/gpu/oom_retry.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $< -lcuda
$(GPU_BUILD)/decay_idle_static: tests/gpu/decay_idle.cu
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $< -ldl
$(GPU_BUILD)/neighbours_static: tests/gpu/neighbours.cu tests/gpu/gpu_test.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $<
$(GPU_BUILD)/psbench: tools/bench/psbench.cu
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $<
$(GPU_BUILD)/barrier_cost: tools/bench/barrier_cost.cu tools/bench/bench_gpu.h
	@mkdir -p $(dir $@)
	$(GPU_NVCC) -o $@ $< -lcuda

bench-rmm:
	./tools/bench/fetch_rmm.sh

# The GPU suite's scripts, checked on the CPU: check_stats.py's own tests, the
# PyTorch memory report's and its rounds table's, the benchmark set's summary (made-up
# runs), and the shell
# scripts parse (shellcheck too when it is installed).
GPU_SCRIPTS := tests/gpu/run.sh tools/gpu_session.sh tools/bench/run.sh tools/bench/multigpu.sh tools/bench/scaling.sh tools/bench/fresh_threads.sh tools/bench/doors.sh tools/bench/fetch_samples.sh
test: test-gpu-scripts
test-gpu-scripts:
	python3 tests/gpu/test_check_stats.py -q
	python3 tools/bench/torch_mem/selftest/report_test.py >/dev/null
	python3 tools/bench/torch_mem/selftest/rounds_test.py >/dev/null
	python3 tools/bench/torch_loops/selftest.py 2>/dev/null
	python3 tests/gpu/numba_suite.py selftest >/dev/null
	@for s in $(GPU_SCRIPTS); do bash -n $$s || exit 1; done
	@if command -v shellcheck >/dev/null; then shellcheck -S warning $(GPU_SCRIPTS); fi
