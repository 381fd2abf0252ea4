# The Slurm SPANK plugin (tools/slurm/spank_poolshim.c): `srun --poolshim`.
# Built where Slurm's header is (Debian: libslurm-dev); docs/clusters.md.
#
#   make                      also builds build/slurm/spank_poolshim.so when slurm/spank.h is here
#   make install              also installs it as PREFIX/lib/poolshim/spank_poolshim.so
#   make test-cluster         the one-node Slurm and the Prometheus tests (tests/cluster/; part of
#                             `make test-all`; each skips with one line where its daemons cannot start)

# Where slurm/spank.h is.
SLURM_INCLUDE ?= /usr/include
SPANK_PLUGIN  := $(if $(wildcard $(SLURM_INCLUDE)/slurm/spank.h),$(BUILD)/slurm/spank_poolshim.so)
all: $(SPANK_PLUGIN)

# Loaded into srun and slurmd: no sanitizer, and its SPANK symbols visible.
$(BUILD)/slurm/spank_poolshim.so: tools/slurm/spank_poolshim.c
	@mkdir -p $(dir $@)
	$(CC) $(filter-out $(SANFLAGS) -fvisibility=hidden,$(CFLAGS)) $(if $(filter-out /usr/include,$(SLURM_INCLUDE)),-I$(SLURM_INCLUDE)) -shared -o $@ $< -ldl

.PHONY: install-slurm uninstall-slurm
install: install-slurm
install-slurm: $(SPANK_PLUGIN)
	$(if $(SPANK_PLUGIN),install -d $(DESTDIR)$(PREFIX)/lib/poolshim && install -m 755 $(SPANK_PLUGIN) $(DESTDIR)$(PREFIX)/lib/poolshim/,@true)
uninstall: uninstall-slurm
uninstall-slurm:
	rm -f $(DESTDIR)$(PREFIX)/lib/poolshim/spank_poolshim.so
	if [ -d "$(DESTDIR)$(PREFIX)/lib/poolshim" ]; then rmdir --ignore-fail-on-non-empty "$(DESTDIR)$(PREFIX)/lib/poolshim"; fi

# The cluster tests need the CLI, the library, the fake GPU and its test program.
.PHONY: test-cluster
test-cluster: all $(FAKE)/libcuda.so.1 $(SHIM_PROGS)
	POOLSHIM_BUILD=$(BUILD) python3 tests/cluster/test_slurm.py
