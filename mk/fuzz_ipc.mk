# Fuzzing the IPC wire format (shim/ipc_wire.c) with libFuzzer (clang): the
# handle an importer reads with the replies that follow it, and the request
# an exporter reads. Uses FUZZ_CC, FUZZ_CFLAGS and FUZZ_BUILD (mk/config.mk).
#
#   make fuzz-ipc                      build build-fuzz/shim/fuzz_ipc_handle and fuzz_ipc_request
#   make fuzz-ipc-run FUZZ_TIME=120    run each for FUZZ_TIME seconds over the committed corpora
#   make test-fuzz                     run each for FUZZ_TEST_TIME seconds (part of `make test-all`);
#                                      skipped, saying so, where FUZZ_CC cannot build a libFuzzer target
#
# New inputs go to build-fuzz/corpus-ipc-*/ (the committed corpora in
# tests/data/fuzz/ipc_*/ are only read); the CPU suite replays those through
# the same entry points (tests/unit/test_ipc_wire.c).

# Seconds each IPC target runs in test-fuzz.
FUZZ_TEST_TIME ?= 20
FUZZ_IPC_OBJ := $(FUZZ_BUILD)/shim/ipc_wire.o $(FUZZ_BUILD)/shim/fuzz/ipc_fuzz_entry.o

.PHONY: fuzz-ipc fuzz-ipc-run test-fuzz
.SECONDARY: $(FUZZ_IPC_OBJ)
fuzz-ipc: $(FUZZ_BUILD)/shim/fuzz_ipc_handle $(FUZZ_BUILD)/shim/fuzz_ipc_request

$(FUZZ_BUILD)/shim/fuzz_ipc_%: shim/fuzz/fuzz_ipc_%.c $(FUZZ_IPC_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_IPC_OBJ)

fuzz-ipc-run: fuzz-ipc
	@mkdir -p $(FUZZ_BUILD)/corpus-ipc-handle $(FUZZ_BUILD)/corpus-ipc-request
	$(FUZZ_BUILD)/shim/fuzz_ipc_handle -max_total_time=$(FUZZ_TIME) -max_len=4096 \
	    $(FUZZ_BUILD)/corpus-ipc-handle tests/data/fuzz/ipc_handle
	$(FUZZ_BUILD)/shim/fuzz_ipc_request -max_total_time=$(FUZZ_TIME) -max_len=64 \
	    $(FUZZ_BUILD)/corpus-ipc-request tests/data/fuzz/ipc_request

test-fuzz:
	@mkdir -p $(FUZZ_BUILD)
	@printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' > $(FUZZ_BUILD)/probe.c
	@if $(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $(FUZZ_BUILD)/probe $(FUZZ_BUILD)/probe.c >/dev/null 2>&1; then \
	    $(MAKE) --no-print-directory fuzz-ipc-run FUZZ_TIME=$(FUZZ_TEST_TIME); \
	else \
	    echo "test-fuzz: skipped: $(FUZZ_CC) cannot build a libFuzzer target (make deps installs clang)"; \
	fi
