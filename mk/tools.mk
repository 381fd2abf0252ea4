# The poolshim CLI's extra pieces (see docs/cli.md).
#
#   make tools   the CUPTI injection library build/libpoolshim_cupti.so (needs
#                $(CUDA_HOME)/include/cupti.h; part of `all` when it exists)

# Where libcupti.so lives (the toolkit keeps it in one of these).
CUPTI_LIBDIR ?= $(firstword $(dir $(wildcard $(CUDA_HOME)/lib64/libcupti.so $(CUDA_HOME)/extras/CUPTI/lib64/libcupti.so)))
CUPTI_LIB    := $(BUILD)/libpoolshim_cupti.so
CUPTI_SRC    := $(sort $(wildcard tools/cupti/*.c))
# Empty when the toolkit has no CUPTI: then nothing is built.
TOOLS_EXTRA  := $(if $(wildcard $(CUDA_HOME)/include/cupti.h),$(if $(CUPTI_LIBDIR),$(CUPTI_LIB)))

.PHONY: tools
tools: $(CLI) $(TOOLS_EXTRA)
all: $(TOOLS_EXTRA)
# ab's warning when it cannot find the CUPTI library says whether this build made one.
$(BUILD)/tools/cmd_ab.o: CFLAGS += -DPS_CUPTI_BUILT=$(if $(TOOLS_EXTRA),1,0)
# The unit tests check that warning against the library this build makes.
test-unit: $(TOOLS_EXTRA)

$(CUPTI_LIB): $(CUPTI_SRC)
	@mkdir -p $(dir $@)
	$(CC) $(filter-out $(SANFLAGS),$(CFLAGS)) -I$(CUDA_HOME)/include -shared -o $@ $(CUPTI_SRC) \
	    -L$(CUPTI_LIBDIR) -Wl,-rpath,$(CUPTI_LIBDIR) -lcupti -pthread

# The unit tests call the tools' pure functions (rendering, log parsing,
# replay, plots, JSON reading) in-process: every tools object but main() goes into an
# archive linked into build/test_unit after the core (which it needs).
TOOLS_ARCHIVE := $(BUILD)/libpoolshim_tools.a
TOOLS_ARCHIVE_OBJ := $(filter-out $(BUILD)/tools/poolshim.o,$(TOOL_OBJ))
$(TOOLS_ARCHIVE): $(TOOLS_ARCHIVE_OBJ)
	rm -f $@ && ar rcs $@ $^
$(UNIT): $(TOOLS_ARCHIVE)
$(UNIT): LDFLAGS += $(TOOLS_ARCHIVE) $(SIM_LIB) $(CORE_LIB) $(JANSSON_LIB) $(ZLIB_LIB)

# `make install` also installs the CUPTI library beside libpoolshim.so, where
# `poolshim ab` looks for it (PREFIX/lib, ../lib from PREFIX/bin).
.PHONY: install-tools
install: install-tools
install-tools: $(TOOLS_EXTRA)
	$(if $(TOOLS_EXTRA),install -d $(DESTDIR)$(PREFIX)/lib && install -m 755 $(TOOLS_EXTRA) $(DESTDIR)$(PREFIX)/lib/,@true)
