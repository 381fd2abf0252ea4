# Clusters (docs/clusters.md): the Slurm SPANK plugin (tools/slurm/spank_poolshim.c),
# built where Slurm's header is (Debian: libslurm-dev), and the Prometheus rules
# (tools/prometheus/).
#
#   make              also builds build/slurm/spank_poolshim.so when slurm/spank.h is here
#   make install      also installs it as PREFIX/lib/poolshim/spank_poolshim.so, and the rules
#                     and their unit tests in PREFIX/share/poolshim/prometheus/
#   make test-cluster the one-node Slurm and the Prometheus tests (tests/cluster/; part of
#                     `make test-all`; each skips with one line where its daemons cannot start)

# Where slurm/spank.h is.
SLURM_INCLUDE ?= /usr/include
SPANK_PLUGIN  := $(if $(wildcard $(SLURM_INCLUDE)/slurm/spank.h),$(BUILD)/slurm/spank_poolshim.so)
PROMETHEUS_RULES := tools/prometheus/poolshim.rules.yml tools/prometheus/poolshim.rules.test.yml
all: $(SPANK_PLUGIN)

# Loaded into srun and slurmd: no sanitizer, and its SPANK symbols visible.
$(BUILD)/slurm/spank_poolshim.so: tools/slurm/spank_poolshim.c
	@mkdir -p $(dir $@)
	$(CC) $(filter-out $(SANFLAGS) -fvisibility=hidden,$(CFLAGS)) $(if $(filter-out /usr/include,$(SLURM_INCLUDE)),-I$(SLURM_INCLUDE)) -shared -o $@ $< -ldl

.PHONY: install-cluster uninstall-cluster
install: install-cluster
install-cluster: $(SPANK_PLUGIN)
	$(if $(SPANK_PLUGIN),install -d $(DESTDIR)$(PREFIX)/lib/poolshim && install -m 755 $(SPANK_PLUGIN) $(DESTDIR)$(PREFIX)/lib/poolshim/,@true)
	install -d $(DESTDIR)$(PREFIX)/share/poolshim/prometheus
	install -m 644 $(PROMETHEUS_RULES) $(DESTDIR)$(PREFIX)/share/poolshim/prometheus/
# (before the Makefile's uninstall, which then finds share/poolshim empty)
uninstall: uninstall-cluster
uninstall-cluster:
	rm -f $(DESTDIR)$(PREFIX)/lib/poolshim/spank_poolshim.so $(addprefix $(DESTDIR)$(PREFIX)/share/poolshim/prometheus/,$(notdir $(PROMETHEUS_RULES)))
	for d in lib/poolshim share/poolshim/prometheus; do \
	    if [ -d "$(DESTDIR)$(PREFIX)/$$d" ]; then rmdir --ignore-fail-on-non-empty "$(DESTDIR)$(PREFIX)/$$d"; fi; done

# The cluster tests need the CLI, the library, the fake GPU and its test programs.
CLUSTER_TESTS := tests/cluster/test_slurm.py tests/cluster/test_prometheus.py
.PHONY: test-cluster
test-cluster: all $(FAKE)/libcuda.so.1 $(SHIM_PROGS)
	@status=0; for t in $(CLUSTER_TESTS); do echo "== $$t"; \
	    POOLSHIM_BUILD=$(BUILD) PYTHONDONTWRITEBYTECODE=1 python3 $$t || status=1; done; exit $$status
