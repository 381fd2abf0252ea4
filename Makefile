# poolshim — build, test, install.
#
#   make               build/libpoolshim.so and the poolshim CLI
#   make deps          apt-get install what building and testing need (Debian, as root)
#   make test          the CPU suite: unit tests (Criterion) and shim tests (fake CUDA)
#   make test-all      test, then again under ASan+UBSan, then the threaded tests under TSan,
#                      then test-long, then check-python (the pip package in a fresh venv; CI),
#                      then test-cluster (real Slurm and Prometheus daemons, mk/cluster.mk),
#                      then test-fuzz (the IPC wire format's fuzz targets, 20 s each: mk/fuzz_ipc.mk)
#   make test-long     the 10^7-operation pool model runs (about a minute; not in `make test`)
#   make check-gpu     the GPU suite (on a machine with a GPU and nvcc)
#   make bench-core    CPU micro-benchmark of the core allocators
#   make bench         GPU benchmarks against the peers (on the GPU machine)
#   make install PREFIX=/usr/local   (DESTDIR=/stage too; mk/install.mk lists what goes where)
#   make uninstall PREFIX=/usr/local removes exactly what install put
#   make check-install                install into a temporary DESTDIR, check, uninstall (part of `make test`)
#   make version                      print the version (the file VERSION, mk/version.mk)
#   make clean
#
# Settings (override on the command line):
ifeq ($(origin CC),default)
CC        := gcc
endif
# Optimisation and debug flags.
OPT       ?= -O2 -g
# Sanitizers, e.g. SANITIZE=address,undefined or SANITIZE=thread (builds into build-<name>/).
SANITIZE  ?=
# Treat warnings as errors (CI keeps this on).
WERROR    ?= 1
# Where `make install` puts bin/, lib/, include/ and share/ (below $(DESTDIR), when set).
PREFIX    ?= /usr/local
# The CUDA toolkit (only the GPU suite, the CUPTI profiler and benchmarks need it).
CUDA_HOME ?= /usr/local/cuda
# nvcc for the GPU suite.
NVCC      ?= $(CUDA_HOME)/bin/nvcc
# libinih, linked statically so the .so travels alone. Empty: use the copy in build/ (GPU machine).
INIH_LIB  ?= $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libinih.a /usr/lib/*/libinih.a /usr/lib/libinih.a))
# jansson (the CLI's JSON reader), linked statically so the CLI runs where libjansson is absent.
JANSSON_LIB ?= $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libjansson.a /usr/lib/*/libjansson.a /usr/lib/libjansson.a))
# zlib (the CLI reads gzip-compressed allocation logs), linked statically too.
ZLIB_LIB ?= $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libz.a /usr/lib/*/libz.a /usr/lib/libz.a))

ifeq ($(SANITIZE),)
BUILD     ?= build
SANFLAGS  :=
else
BUILD     ?= build-$(subst $(comma),-,$(SANITIZE))
SANFLAGS  := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
# Criterion's own runner leaks 48 bytes when a test's .timeout timer fires
# late under load; LeakSanitizer is told to ignore that library only.
export LSAN_OPTIONS := suppressions=$(CURDIR)/tests/lsan.supp
endif
comma := ,

# Optional vtable entries are left out of initializers on purpose (they are NULL).
WARN      := -Wall -Wextra -Wshadow -Wno-unused-parameter -Wno-missing-field-initializers $(if $(filter 1,$(WERROR)),-Werror)
CFLAGS    += -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) -fPIC -fvisibility=hidden -pthread $(SANFLAGS)
LDFLAGS   += -pthread $(SANFLAGS)
LDLIBS    += -ldl

# NVTX v3 (header-only, in the CUDA toolkit) for debug.nvtx; without the
# headers shim/nvtx.c builds as a stub that warns when the option is on.
NVTX_INC  ?= $(CUDA_HOME)/include
NVTX_CFLAGS := $(if $(wildcard $(NVTX_INC)/nvtx3/nvToolsExtMem.h),-isystem $(NVTX_INC),-DPS_NO_NVTX)

CORE_SRC  := $(sort $(wildcard core/*.c config/*.c))
SHIM_SRC  := $(sort $(wildcard shim/*.c))
TOOL_SRC  := $(sort $(wildcard tools/*.c))
# The fake GPU (a GPU-ops table over host memory): the tests' device and replay's simulated one.
SIM_SRC   := $(sort $(wildcard tools/sim/*.c))
UNIT_SRC  := $(sort $(wildcard tests/unit/*.c))
CORE_OBJ  := $(CORE_SRC:%.c=$(BUILD)/%.o)
SHIM_OBJ  := $(SHIM_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ  := $(TOOL_SRC:%.c=$(BUILD)/%.o)
SIM_OBJ   := $(SIM_SRC:%.c=$(BUILD)/%.o)
UNIT_OBJ  := $(UNIT_SRC:%.c=$(BUILD)/%.o)

LIB       := $(BUILD)/libpoolshim.so
CORE_LIB  := $(BUILD)/libpoolshim_core.a
SIM_LIB   := $(BUILD)/libpoolshim_sim.a
CLI       := $(BUILD)/poolshim
UNIT      := $(BUILD)/test_unit

.PHONY: all deps test test-unit test-shim test-stress test-long test-all check-gpu bench-core bench-shim bench-pinned-pairs pair-loop bench install uninstall clean
all: $(LIB) $(CLI)

deps:
	./tools/install-deps.sh

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/config/default_ini.h: config/default.ini
	@mkdir -p $(dir $@)
	./tools/embed.sh ps_default_ini < $< > $@
$(BUILD)/config/config.o: $(BUILD)/config/default_ini.h
$(BUILD)/config/config.o: CFLAGS += -I$(BUILD)/config

$(BUILD)/shim/nvtx.o: CFLAGS += $(NVTX_CFLAGS)

$(CORE_LIB): $(CORE_OBJ)
	rm -f $@ && ar rcs $@ $^
$(SIM_LIB): $(SIM_OBJ)
	rm -f $@ && ar rcs $@ $^

$(LIB): $(SHIM_OBJ) $(CORE_LIB) shim/exports.map
	$(CC) -shared -o $@ $(SHIM_OBJ) $(CORE_LIB) $(INIH_LIB) $(LDFLAGS) \
	    -Wl,--version-script=shim/exports.map -Wl,-z,now $(LDLIBS)

$(CLI): $(TOOL_OBJ) $(SIM_LIB) $(CORE_LIB)
	$(CC) -o $@ $(TOOL_OBJ) $(SIM_LIB) $(CORE_LIB) $(INIH_LIB) $(JANSSON_LIB) $(ZLIB_LIB) $(LDFLAGS) $(LDLIBS) -lm

$(UNIT): $(UNIT_OBJ) $(SIM_LIB) $(CORE_LIB)
	$(CC) -o $@ $(UNIT_OBJ) $(SIM_LIB) $(CORE_LIB) $(INIH_LIB) $(LDFLAGS) -lcriterion $(LDLIBS) -lm

test: test-unit test-shim

# Criterion runs each test in its own process; -j2 matches the CI machine.
test-unit: $(UNIT) $(CLI)
	POOLSHIM_TEST_DATA=$(CURDIR)/tests/data POOLSHIM_CLI=$(CURDIR)/$(CLI) $(UNIT) -j2 --short-filename $(UNIT_FILTER)

include tests/shim/shim.mk
-include $(sort $(wildcard mk/*.mk))

# Criterion cannot start under TSan (Snaipe/Criterion#274: "Could not
# initialize inheritable arena"), so the threaded checks for TSan are plain
# programs in tests/stress/, each exiting non-zero on failure.
STRESS_SRC := $(sort $(wildcard tests/stress/*.c))
STRESS_BIN := $(STRESS_SRC:tests/stress/%.c=$(BUILD)/stress/%)
$(BUILD)/stress/%: tests/stress/%.c $(SIM_LIB) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -o $@ $< $(SIM_LIB) $(CORE_LIB) $(LDFLAGS) $(LDLIBS) -lm
test-stress: $(STRESS_BIN)
	@for t in $(STRESS_BIN); do echo "== $$t"; TSAN_OPTIONS=halt_on_error=1 $$t || exit 1; done

# The pool against its reference model for 10^7 random operations (two runs).
test-long: $(UNIT) $(CLI)
	POOLSHIM_TEST_LONG=1 $(UNIT) -j2 --short-filename --filter='pool_model/ten_million_*'

test-all:
	$(MAKE) test
	$(MAKE) test SANITIZE=address,undefined
	$(MAKE) test-stress SANITIZE=thread
	$(MAKE) test-long
	$(MAKE) check-python
	$(MAKE) test-cluster
	$(MAKE) test-fuzz

# For a GPU machine without libinih: build here, copy build/ there; these use it.
check-gpu:
	@test -f $(LIB) || $(MAKE) all
	./tests/gpu/run.sh $(BUILD)

bench-core: $(BUILD)/bench_core
	$(BUILD)/bench_core
$(BUILD)/bench_core: tools/bench/bench_core.c $(SIM_LIB) $(CORE_LIB)
	$(CC) $(CFLAGS) -o $@ $< $(SIM_LIB) $(CORE_LIB) $(INIH_LIB) $(LDFLAGS) $(LDLIBS) -lm

# A pinned alloc/free pair in the default [host] stack over the fake device's
# real-time event model (tools/bench/pinned_pairs.c): fences per pair, ns per pair.
bench-pinned-pairs: $(BUILD)/pinned_pairs
	$(BUILD)/pinned_pairs
$(BUILD)/pinned_pairs: tools/bench/pinned_pairs.c $(SIM_LIB) $(CORE_LIB)
	$(CC) $(CFLAGS) -o $@ $< $(SIM_LIB) $(CORE_LIB) $(INIH_LIB) $(LDFLAGS) $(LDLIBS) -lm

# The whole shim over the fake CUDA of tests/shim (no GPU): psbench's pairs,
# random and thread workloads through the runtime door (tools/bench/bench_shim.c).
bench-shim: $(BUILD)/bench_shim $(LIB)
	LD_LIBRARY_PATH=$(FAKE) LD_PRELOAD=$(CURDIR)/$(LIB) $(BUILD)/bench_shim $(BENCH_SHIM_ARGS)
$(BUILD)/bench_shim: tools/bench/bench_shim.c $(FAKE)/libcudart.so.13 $(FAKE)/libcuda.so.1
	$(CC) $(CFLAGS) -o $@ $< -L$(FAKE) -lcudart $(LDFLAGS) $(LDLIBS)
# One thread's pairs through one door, for instruction counts under callgrind
# (tools/bench/pair_loop.c says how).
pair-loop: $(BUILD)/pair_loop $(LIB)
$(BUILD)/pair_loop: tools/bench/pair_loop.c $(FAKE)/libcudart.so.13 $(FAKE)/libcuda.so.1
	$(CC) $(CFLAGS) -o $@ $< -L$(FAKE) -lcudart $(LDFLAGS) $(LDLIBS)

# A sampling profiler to LD_PRELOAD on a GPU machine without perf
# (tools/prof/sampler.c says how; tools/prof/resolve.py names the functions).
$(BUILD)/sampler.so: tools/prof/sampler.c
	$(CC) $(CFLAGS) -shared -o $@ $< -ldl -lrt
all: $(BUILD)/sampler.so

bench:
	@test -f $(LIB) || $(MAKE) all
	./tools/bench/run.sh $(BUILD)

# The directories below are fixed relative to PREFIX: `poolshim` finds the
# library in ../lib beside its bin/. The file names are in mk/install.mk.
install: all $(INSTALL_GEN)
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/poolshim/examples \
	    $(DESTDIR)$(PREFIX)/include/poolshim $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	    $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man7 \
	    $(DESTDIR)$(PREFIX)/share/bash-completion/completions
	install -m 755 $(LIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 shim/poolshim.h $(DESTDIR)$(PREFIX)/include/poolshim/
	install -m 644 $(BUILD)/poolshim.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/
	install -m 644 $(BUILD)/man/poolshim.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 $(BUILD)/man/poolshim.7 $(DESTDIR)$(PREFIX)/share/man/man7/
	install -m 644 tools/completion/poolshim.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/poolshim
	install -m 644 $(INSTALL_EXAMPLES) $(DESTDIR)$(PREFIX)/share/poolshim/examples/

# Removes the files install put (INSTALLED_FILES, mk/install.mk), then the
# directories that are poolshim's own, when empty; shared ones (lib/, man1/...) stay.
uninstall:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/,$(INSTALLED_FILES))
	for d in share/poolshim/examples share/poolshim include/poolshim; do \
	    if [ -d "$(DESTDIR)$(PREFIX)/$$d" ]; then rmdir --ignore-fail-on-non-empty "$(DESTDIR)$(PREFIX)/$$d"; fi; done

clean:
	rm -rf build build-*

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# The main job of the README. With an NVIDIA driver and a GPU
# (tools/demo/gpu_probe.c asks the driver): build an allocation-heavy CUDA
# program with plain nvcc and run it natively, then under the shim with
# statistics. Without: one line says what is missing, and
# tools/demo/no_gpu.sh shows a replay, a plot and an A/B table over the fake
# CUDA of the shim tests instead, then names the GPU command.
DEMO_PROBE := $(BUILD)/demo/gpu_probe
DEMO_FAKE  := $(BUILD)/demo/alloc_churn_fake
demo: all $(DEMO_PROBE)
	@if why=$$($(DEMO_PROBE)); then $(MAKE) --no-print-directory demo-gpu; \
	else $(MAKE) --no-print-directory demo-no-gpu DEMO_WHY="$$why"; fi
demo-gpu: all
	@mkdir -p $(BUILD)/demo
	$(NVCC) -O2 -o $(BUILD)/demo/alloc_churn tools/demo/alloc_churn.cu
	@echo "== native"; $(BUILD)/demo/alloc_churn
	@echo "== under poolshim"; $(CLI) run -o global.stats=text -- $(BUILD)/demo/alloc_churn
demo-no-gpu: all $(DEMO_FAKE) $(FAKE)/libcudart.so.13 $(FAKE)/libcuda.so.1
	@./tools/demo/no_gpu.sh $(BUILD) "$(or $(DEMO_WHY),no GPU)"
$(DEMO_PROBE): tools/demo/gpu_probe.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -o $@ $< -ldl
$(DEMO_FAKE): tools/demo/alloc_churn_fake.c $(FAKE)/libcudart.so.13
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -o $@ $< -L$(FAKE) -lcudart
# (the shim tests run both, tests/shim/test_shim.c: demo/*)
test-shim: $(DEMO_PROBE) $(DEMO_FAKE)
.PHONY: demo demo-gpu demo-no-gpu
