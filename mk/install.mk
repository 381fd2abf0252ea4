# What `make install` puts under $(DESTDIR)$(PREFIX) (the recipe is in the
# Makefile), the files it generates, and a test of both:
#
#   make check-install   install into a temporary DESTDIR, check every file and
#                        that the installed pieces work (tests/install/check_install.sh),
#                        uninstall, check that no file is left (part of `make test`)
#
# Installed, relative to PREFIX:
#   bin/poolshim                                  the CLI
#   lib/libpoolshim.so                            the library (LD_PRELOAD it)
#   lib/libpoolshim_cupti.so                      the CUPTI library, where it is built (mk/tools.mk)
#   lib/poolshim/spank_poolshim.so                the Slurm SPANK plugin, where it is built (mk/cluster.mk)
#   include/poolshim/poolshim.h                   the public API (#include <poolshim/poolshim.h>)
#   lib/pkgconfig/poolshim.pc                     pkg-config: Version from VERSION, prefix = PREFIX
#   share/man/man1/poolshim.1                     the CLI's manual (docs/man/poolshim.1)
#   share/man/man7/poolshim.7                     the environment and configuration (docs/man/poolshim.7)
#   share/bash-completion/completions/poolshim    bash completion (tools/completion/poolshim.bash)
#   share/poolshim/examples/*.ini                 config/examples/
#   share/poolshim/prometheus/poolshim.rules.yml  Prometheus rules, and their unit tests
#   share/poolshim/prometheus/poolshim.rules.test.yml   (tools/prometheus/, mk/cluster.mk)

INSTALL_EXAMPLES := $(sort $(wildcard config/examples/*.ini))
INSTALLED_FILES   = bin/poolshim lib/libpoolshim.so lib/libpoolshim_cupti.so lib/poolshim/spank_poolshim.so \
                    include/poolshim/poolshim.h \
                    lib/pkgconfig/poolshim.pc share/man/man1/poolshim.1 share/man/man7/poolshim.7 \
                    share/bash-completion/completions/poolshim \
                    $(INSTALL_EXAMPLES:config/examples/%=share/poolshim/examples/%) \
                    share/poolshim/prometheus/poolshim.rules.yml share/poolshim/prometheus/poolshim.rules.test.yml
INSTALL_GEN      := $(BUILD)/poolshim.pc $(BUILD)/man/poolshim.1 $(BUILD)/man/poolshim.7

# The .pc names the PREFIX of this install, which may differ from the last
# one: written every time.
$(BUILD)/poolshim.pc: VERSION FORCE_PC
	@mkdir -p $(dir $@)
	printf '%s\n' 'prefix=$(PREFIX)' 'exec_prefix=$${prefix}' 'libdir=$${exec_prefix}/lib' \
	    'includedir=$${prefix}/include' '' 'Name: poolshim' \
	    'Description: pool allocator for unmodified CUDA programs (LD_PRELOAD); public API' \
	    'Version: $(POOLSHIM_VERSION)' 'Libs: -L$${libdir} -lpoolshim' 'Cflags: -I$${includedir}' > $@
.PHONY: FORCE_PC
FORCE_PC:

# The man pages' footer names the version (@VERSION@ in docs/man/).
$(BUILD)/man/%: docs/man/% VERSION
	@mkdir -p $(dir $@)
	sed 's/@VERSION@/$(POOLSHIM_VERSION)/g' $< > $@

CHECK_INSTALL_DEST   := $(abspath $(BUILD))/check-install
CHECK_INSTALL_PREFIX := /opt/poolshim
# the CUPTI library and the SPANK plugin are expected only where this build makes them
CHECK_INSTALL_FILES   = $(filter-out $(if $(TOOLS_EXTRA),,lib/libpoolshim_cupti.so) \
                                     $(if $(SPANK_PLUGIN),,lib/poolshim/spank_poolshim.so),$(INSTALLED_FILES))
.PHONY: check-install
test: check-install
check-install: all
	@rm -rf $(CHECK_INSTALL_DEST)
	@$(MAKE) --no-print-directory -s install DESTDIR=$(CHECK_INSTALL_DEST) PREFIX=$(CHECK_INSTALL_PREFIX) >/dev/null
	CC="$(CC)" SANITIZE="$(SANITIZE)" ./tests/install/check_install.sh installed $(CHECK_INSTALL_DEST) \
	    $(CHECK_INSTALL_PREFIX) $(POOLSHIM_VERSION) $(CHECK_INSTALL_FILES)
	@$(MAKE) --no-print-directory -s uninstall DESTDIR=$(CHECK_INSTALL_DEST) PREFIX=$(CHECK_INSTALL_PREFIX)
	./tests/install/check_install.sh uninstalled $(CHECK_INSTALL_DEST) $(CHECK_INSTALL_PREFIX)
	@rm -rf $(CHECK_INSTALL_DEST)
