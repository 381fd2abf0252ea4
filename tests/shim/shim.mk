# The shim's CPU tests: a fake libcuda.so.1 and libcudart.so.13 over host
# memory, test programs that use each door the way real binaries do, and a
# Criterion runner (tests/shim/test_shim.c) that runs them with and without
# LD_PRELOAD=libpoolshim.so.
FAKE       := $(BUILD)/fake
SHIMTEST   := $(BUILD)/shimtest
PROG_FLAGS := -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror -pthread $(SANFLAGS)
SHIM_PROGS := $(SHIMTEST)/prog_runtime $(SHIMTEST)/prog_torch $(SHIMTEST)/prog_ipc $(SHIMTEST)/prog_neighbours $(SHIMTEST)/prog_static $(SHIMTEST)/prog_static_old_dlsym \
              $(SHIMTEST)/prog_rtld_next $(SHIMTEST)/libwrapnext.so
# the fake NVTX tool (debug.nvtx), when the NVTX headers are here
ifeq ($(filter -DPS_NO_NVTX,$(NVTX_CFLAGS)),)
SHIM_PROGS += $(FAKE)/libfake_nvtx.so
endif
# objects named as PyTorch's and CuPy's CUDA libraries, for the exit hints (shim/hints.c)
SHIM_PROGS += $(FAKE)/libc10_cuda.so $(FAKE)/cupy/cuda/memory.so
ifneq ($(findstring address,$(SANITIZE)),)
# an ASan-built library can only be preloaded behind the ASan runtime
SHIM_PRELOAD_PREFIX := $(shell $(CC) -print-file-name=libasan.so)
endif

$(FAKE)/libcuda.so.1: tests/shim/fake_cuda.c tests/shim/fake_cuda.h shim/cuda_abi.h
	@mkdir -p $(FAKE)
	$(CC) $(PROG_FLAGS) -fPIC -shared -Wl,-Bsymbolic -Wl,-soname,libcuda.so.1 -o $@ $<
	ln -sf libcuda.so.1 $(FAKE)/libcuda.so

$(FAKE)/libcudart.so.13: tests/shim/fake_cudart.c tests/shim/fake_cudart.map shim/cuda_abi.h
	@mkdir -p $(FAKE)
	$(CC) $(PROG_FLAGS) -fPIC -shared -Wl,-soname,libcudart.so.13 \
	    -Wl,--version-script=tests/shim/fake_cudart.map -o $@ $< -ldl
	ln -sf libcudart.so.13 $(FAKE)/libcudart.so

$(FAKE)/libfake_nvtx.so: tests/shim/fake_nvtx.c
	@mkdir -p $(FAKE)
	$(CC) $(PROG_FLAGS) -fPIC -shared $(NVTX_CFLAGS) -o $@ $<

$(FAKE)/libc10_cuda.so $(FAKE)/cupy/cuda/memory.so: tests/shim/fake_framework.c
	@mkdir -p $(dir $@)
	$(CC) $(PROG_FLAGS) -fPIC -shared -o $@ $<

$(SHIMTEST)/prog_runtime: tests/shim/prog_runtime.c tests/shim/prog_common.h tests/shim/fake_cuda.h $(FAKE)/libcudart.so.13
	@mkdir -p $(SHIMTEST)
	$(CC) $(PROG_FLAGS) -o $@ $< -L$(FAKE) -lcudart -ldl

$(SHIMTEST)/prog_ipc: tests/shim/prog_ipc.c tests/shim/prog_common.h tests/shim/fake_cuda.h $(FAKE)/libcudart.so.13
	@mkdir -p $(SHIMTEST)
	$(CC) $(PROG_FLAGS) -o $@ $< -L$(FAKE) -lcudart -ldl

$(SHIMTEST)/prog_neighbours: tests/shim/prog_neighbours.c tests/shim/prog_common.h tests/shim/fake_cuda.h $(FAKE)/libcudart.so.13
	@mkdir -p $(SHIMTEST)
	$(CC) $(PROG_FLAGS) -o $@ $< -L$(FAKE) -lcudart -ldl

$(SHIMTEST)/prog_static: tests/shim/prog_static.c tests/shim/prog_common.h tests/shim/fake_cuda.h
	@mkdir -p $(SHIMTEST)
	$(CC) $(PROG_FLAGS) -o $@ $< -ldl

$(SHIMTEST)/prog_static_old_dlsym: tests/shim/prog_static.c tests/shim/prog_common.h tests/shim/fake_cuda.h
	@mkdir -p $(SHIMTEST)
	$(CC) $(PROG_FLAGS) -DOLD_DLSYM -o $@ $< -ldl

$(SHIMTEST)/prog_torch: tests/shim/prog_torch.c tests/shim/prog_common.h tests/shim/fake_cuda.h $(FAKE)/libcudart.so.13 $(FAKE)/libcuda.so.1
	@mkdir -p $(SHIMTEST)
	$(CC) $(PROG_FLAGS) -o $@ $< -L$(FAKE) -lcudart -lcuda -ldl

$(SHIMTEST)/prog_rtld_next: tests/shim/prog_rtld_next.c tests/shim/prog_common.h
	@mkdir -p $(SHIMTEST)
	$(CC) $(PROG_FLAGS) -o $@ $< -ldl

$(SHIMTEST)/libwrapnext.so: tests/shim/libwrapnext.c
	@mkdir -p $(SHIMTEST)
	$(CC) $(PROG_FLAGS) -fPIC -shared -o $@ $< -ldl

$(BUILD)/test_shim: tests/shim/test_shim.c
	$(CC) $(CFLAGS) -o $@ $< $(LDFLAGS) -lcriterion

# the attacks of another local user (tests/shim/test_security.c)
$(BUILD)/test_security: tests/shim/test_security.c
	$(CC) $(CFLAGS) -o $@ $< $(LDFLAGS) -lcriterion

test-shim: $(LIB) $(CLI) $(FAKE)/libcuda.so.1 $(SHIM_PROGS) $(BUILD)/test_shim $(BUILD)/test_security
	POOLSHIM_BUILD=$(BUILD) POOLSHIM_PRELOAD_PREFIX="$(SHIM_PRELOAD_PREFIX)" POOLSHIM_CLI=$(CURDIR)/$(CLI) \
	    POOLSHIM_TEST_DATA=$(CURDIR)/tests/data $(BUILD)/test_shim -j2 --short-filename
	POOLSHIM_BUILD=$(BUILD) POOLSHIM_PRELOAD_PREFIX="$(SHIM_PRELOAD_PREFIX)" POOLSHIM_CLI=$(CURDIR)/$(CLI) \
	    $(BUILD)/test_security -j2 --short-filename

# shim/cuda_abi.h against the real headers, when the toolkit is here
ifneq ($(wildcard $(CUDA_HOME)/include/cuda.h),)
$(SHIMTEST)/abi_check: tests/shim/abi_check.c tests/shim/abi_ours.c tests/shim/abi_cuda.c tests/shim/abi_list.h shim/cuda_abi.h
	@mkdir -p $(SHIMTEST)
	$(CC) $(PROG_FLAGS) -I$(CUDA_HOME)/include -o $@ tests/shim/abi_check.c tests/shim/abi_ours.c tests/shim/abi_cuda.c
test-shim: abi-check
abi-check: $(SHIMTEST)/abi_check
	$(SHIMTEST)/abi_check
.PHONY: abi-check
endif

# A stress program over the shim and the fake CUDA (tests/stress/, run by
# `make test-stress`, under TSan in `make test-all`): it preloads the shim itself.
$(BUILD)/stress/context_reset_stress $(BUILD)/stress/fork_stress $(BUILD)/stress/ipc_stress: $(BUILD)/stress/%: tests/stress/%.c tests/shim/prog_common.h \
                                      tests/shim/fake_cuda.h $(LIB) $(FAKE)/libcuda.so.1 $(FAKE)/libcudart.so.13
	@mkdir -p $(dir $@)
	$(CC) $(PROG_FLAGS) -DPS_BUILD_DIR='"$(abspath $(BUILD))"' -o $@ $< -L$(FAKE) -Wl,-rpath,$(abspath $(FAKE)) -lcudart -ldl
