# The version of poolshim: the file VERSION (one line, semantic version) is
# its only home. The objects that print or return it get it as
# -DPOOLSHIM_VERSION="..." and are rebuilt when VERSION changes:
#   shim/version.c   poolshim_version() of libpoolshim.so (the stats report and
#                    the verbose start-up line take it from there)
#   tools/poolshim.c `poolshim --version`
#   mk/install.mk    Version: of the installed poolshim.pc
#
#   make version     print it

POOLSHIM_VERSION := $(strip $(shell cat $(CURDIR)/VERSION 2>/dev/null))
ifeq ($(POOLSHIM_VERSION),)
$(error VERSION is missing or empty: it holds poolshim's version, e.g. 0.9.0)
endif

VERSION_OBJ := $(BUILD)/shim/version.o $(BUILD)/tools/poolshim.o
$(VERSION_OBJ): VERSION
$(VERSION_OBJ): CFLAGS += -DPOOLSHIM_VERSION='"$(POOLSHIM_VERSION)"'

# The CLI test compares `poolshim --version` with the file itself.
test-unit: export POOLSHIM_TEST_VERSION_FILE := $(CURDIR)/VERSION
test-shim: export POOLSHIM_TEST_VERSION_FILE := $(CURDIR)/VERSION

.PHONY: version
version:
	@echo $(POOLSHIM_VERSION)
