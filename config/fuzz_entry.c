/* The fuzzing entry points of the configuration: the libFuzzer targets in
 * config/fuzz/ call them, and the CPU suite replays the committed corpora
 * (tests/data/fuzz/) through them, so every corpus file is checked on
 * every test run.
 *
 * ps_config_fuzz_ini, step by step:
 *   1. the bytes become INI text (cut at the first NUL) and are loaded as
 *      the user file, the process environment ignored;
 *   2. the same bytes are loaded again as POOLSHIM_OPTIONS;
 *   3. each valid config is printed (to a memory stream) and built for
 *      devices 0 and 1 with inert resources, then destroyed.
 * ps_config_fuzz_size: every value parser on the bytes, with the
 * invariants that a parsed size prints back to the same number and a
 * parsed percentage lies in [0, 100].
 * Both return 0; a broken invariant calls __builtin_trap() so the fuzzer
 * (and the replay test) sees a crash.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

/* An inert resource: it exists, it is destroyed, it allocates nothing. */
typedef struct inert {
    ps_resource_t base; /* the resource */
} inert_t;

static int inert_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out) { return PS_ENOMEM; }
static int inert_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream) { return PS_EINVAL; }
static void inert_destroy(ps_resource_t *r) { free(r); }
static const ps_resource_ops_t inert_ops = {"inert", inert_allocate, inert_deallocate, NULL, NULL, inert_destroy};

static int inert_make(const char *name, ps_resource_t *upstream, ps_resource_t **out)
{
    inert_t *r = calloc(1, sizeof *r);
    if (!r)
        return PS_ENOMEM;
    r->base.ops = &inert_ops;
    r->base.name = name;
    r->base.upstream = upstream;
    *out = &r->base;
    return PS_OK;
}
static int inert_pool(const char *n, ps_resource_t *u, const ps_gpu_ops_t *g, const ps_pool_options_t *o, ps_resource_t **out) { return inert_make(n, u, out); }
static int inert_arena(const char *n, ps_resource_t *u, const ps_gpu_ops_t *g, const ps_arena_options_t *o, ps_resource_t **out) { return inert_make(n, u, out); }
static int inert_fixed(const char *n, ps_resource_t *u, const ps_gpu_ops_t *g, const ps_fixed_size_options_t *o, ps_resource_t **out) { return inert_make(n, u, out); }
static int inert_binning(const char *n, const ps_bin_t *b, size_t c, ps_resource_t *f, ps_resource_t **out)
{
    for (size_t i = 0; i < c; i++)
        if (!b[i].resource || (i > 0 && b[i].max_size <= b[i - 1].max_size))
            __builtin_trap(); /* the builder must hand over resolved, sorted bins */
    return inert_make(n, f, out);
}
static int inert_leaf(const char *n, const ps_gpu_ops_t *g, ps_resource_t **out) { return inert_make(n, NULL, out); }
static int inert_async(const char *n, const ps_gpu_ops_t *g, uint64_t t, ps_resource_t **out) { return inert_make(n, NULL, out); }
static int inert_limit(const char *n, ps_resource_t *u, size_t l, ps_resource_t **out) { return inert_make(n, u, out); }
static int inert_stats(const char *n, ps_resource_t *u, ps_resource_t **out) { return inert_make(n, u, out); }
static int inert_track(const char *n, ps_resource_t *u, unsigned d, ps_resource_t **out) { return inert_make(n, u, out); }
static int inert_log(const char *n, ps_resource_t *u, const char *p, ps_resource_t **out) { return inert_make(n, u, out); }

static const ps_config_constructors_t inert_constructors = {
    inert_pool, inert_arena, inert_fixed, inert_binning, inert_leaf, inert_async,
    inert_leaf, inert_limit, inert_stats, inert_track, inert_log};

static int sized_device(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = 40ull << 30;
    *total_bytes = 80ull << 30;
    return PS_OK;
}

static void exercise(ps_config_t *cfg, int rc)
{
    if (!cfg)
        return;
    if ((rc == PS_OK) != (ps_config_error_count(cfg) == 0))
        __builtin_trap(); /* the status and the error list must agree */
    char *text = NULL;
    size_t size = 0;
    FILE *sink = open_memstream(&text, &size);
    if (sink) {
        ps_config_print_errors(cfg, sink);
        if (rc == PS_OK) {
            ps_config_print(cfg, sink, -1);
            ps_config_print(cfg, sink, 1);
        }
        fclose(sink);
        free(text);
    }
    if (rc == PS_OK) {
        ps_gpu_ops_t gpu = {.device = 0, .mem_get_info = sized_device};
        int saved = ps_verbosity;
        ps_verbosity = -1; /* build failures are expected (limits vs percentages) */
        for (int device = 0; device < 2; device++) {
            ps_stack_t *stack = NULL;
            if (ps_config_build_stack_with(cfg, device, &gpu, &inert_constructors, &stack) == PS_OK)
                ps_stack_destroy(stack);
        }
        ps_verbosity = saved;
    }
    ps_config_free(cfg);
}

/* The fuzzer's bytes as a string (NUL-terminated copy; NULL: no memory). */
static char *as_text(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text) {
        memcpy(text, data, size);
        text[size] = '\0';
    }
    return text;
}

int ps_config_fuzz_ini(const uint8_t *data, size_t size)
{
    char *text = as_text(data, size);
    if (!text)
        return 0;
    char *env[] = {NULL};
    ps_config_input_t in = {.environ = env, .no_env = 1};
    ps_config_t *cfg = NULL;
    int rc = ps_config_load_text(text, "fuzz.ini", &in, &cfg);
    exercise(cfg, rc);
    in.options = text;
    cfg = NULL;
    rc = ps_config_load_text("", "fuzz.ini", &in, &cfg);
    exercise(cfg, rc);
    free(text);
    return 0;
}

static const char *fixed_lookup(void *ctx, const char *name)
{
    return strcmp(name, "PMI_RANK") == 0 ? "5" : NULL;
}

int ps_config_fuzz_size(const uint8_t *data, size_t size)
{
    char *text = as_text(data, size);
    if (!text)
        return 0;
    for (int allow = 0; allow < 2; allow++) {
        uint64_t bytes = 0;
        double pct = -1;
        int is_pct = -1;
        char why[160];
        if (ps_parse_size_ex(text, allow, &bytes, &pct, &is_pct, why, sizeof why) == PS_OK) {
            if (is_pct && (!allow || !(pct >= 0.0 && pct <= 100.0)))
                __builtin_trap();
            if (!is_pct) {
                char back[32];
                uint64_t again = 0;
                double p2;
                int i2;
                snprintf(back, sizeof back, "%llu", (unsigned long long)bytes);
                if (ps_parse_size_ex(back, 0, &again, &p2, &i2, NULL, 0) != PS_OK || again != bytes)
                    __builtin_trap();
            }
        }
    }
    int flag;
    (void)ps_parse_bool(text, &flag);
    uint64_t n;
    char why[64];
    (void)ps_parse_uint(text, 1000, &n, why, sizeof why);
    if (ps_check_path_pattern(text, 1, why, sizeof why) == PS_OK) {
        char out[512];
        (void)ps_expand_path_env(text, 3, fixed_lookup, NULL, out, sizeof out);
    }
    (void)ps_nearest_word(text, ps_key_names);
    free(text);
    return 0;
}
