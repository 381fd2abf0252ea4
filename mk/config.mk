# Fuzzing the configuration parsers with libFuzzer (clang).
#
#   make fuzz-config                     build build-fuzz/fuzz_config_ini and build-fuzz/fuzz_size
#   make fuzz-config-run FUZZ_TIME=120   run each for FUZZ_TIME seconds over the committed corpora
#
# New inputs go to build-fuzz/corpus-*/ (the committed corpora in
# tests/data/fuzz/ are only read); copy interesting ones there by hand.
# The CPU suite replays tests/data/fuzz/ through the same entry points.

# The fuzzing compiler.
FUZZ_CC    ?= clang
# Seconds each target runs in fuzz-config-run.
FUZZ_TIME  ?= 60
# Where the fuzz build goes.
FUZZ_BUILD ?= build-fuzz
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
               -fno-sanitize-recover=all -I$(FUZZ_BUILD)/config
FUZZ_SRC   := $(sort $(wildcard core/*.c config/*.c))
FUZZ_OBJ   := $(FUZZ_SRC:%.c=$(FUZZ_BUILD)/%.o)

.PHONY: fuzz-config fuzz-config-run
fuzz-config: $(FUZZ_BUILD)/fuzz_config_ini $(FUZZ_BUILD)/fuzz_size

$(FUZZ_BUILD)/config/default_ini.h: config/default.ini
	@mkdir -p $(dir $@)
	./tools/embed.sh ps_default_ini < $< > $@

$(FUZZ_BUILD)/%.o: %.c $(FUZZ_BUILD)/config/default_ini.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/fuzz_%: config/fuzz/fuzz_%.c $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJ) $(INIH_LIB) -lpthread -ldl -lm

fuzz-config-run: fuzz-config
	@mkdir -p $(FUZZ_BUILD)/corpus-config $(FUZZ_BUILD)/corpus-size
	$(FUZZ_BUILD)/fuzz_config_ini -max_total_time=$(FUZZ_TIME) -max_len=4096 \
	    -dict=tests/data/fuzz/config.dict $(FUZZ_BUILD)/corpus-config tests/data/fuzz/config
	$(FUZZ_BUILD)/fuzz_size -max_total_time=$(FUZZ_TIME) -max_len=64 \
	    $(FUZZ_BUILD)/corpus-size tests/data/fuzz/size
