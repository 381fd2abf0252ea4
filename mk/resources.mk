# Targets of the resource family (core/arena.c, fixed_size, binning, adaptors).

# The track adaptor's leak report names functions with dladdr, which sees an
# executable's functions only when they are exported: link the tests -rdynamic.
$(UNIT): LDFLAGS += -rdynamic

# CPU micro-benchmark of the arena's multi-thread scaling:
#   make bench-arena [BENCH_ARENA_THREADS="1 2 4 8 16"] [BENCH_ARENA_PAIRS=1000000]
BENCH_ARENA_THREADS ?= 1 2
BENCH_ARENA_PAIRS   ?= 1000000
.PHONY: bench-arena
bench-arena: $(BUILD)/bench_arena
	$(BUILD)/bench_arena $(BENCH_ARENA_PAIRS) $(BENCH_ARENA_THREADS)
$(BUILD)/bench_arena: tools/bench/bench_arena.c $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(CORE_LIB) $(LDFLAGS) $(LDLIBS) -lm

