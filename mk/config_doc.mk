# docs/config.md's key tables from config/keys.def (tools/gen/config_doc.c).
#
#   make config-doc        rewrite the generated table of every resource key in docs/config.md
#   make config-doc-print  print every key table: [global], [host], [debug], [resource.NAME]
#
# tests/unit/test_config_keys.c fails when docs/config.md and config/keys.def disagree.
CONFIG_DOC_GEN := $(BUILD)/gen_config_doc

$(CONFIG_DOC_GEN): tools/gen/config_doc.c $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(CORE_LIB) $(INIH_LIB) $(LDFLAGS) $(LDLIBS) -lm

.PHONY: config-doc config-doc-print
config-doc: $(CONFIG_DOC_GEN)
	$(CONFIG_DOC_GEN) docs/config.md
config-doc-print: $(CONFIG_DOC_GEN)
	$(CONFIG_DOC_GEN)
