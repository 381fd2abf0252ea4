/* Building stacks from the configuration. Most tests give the builder fake
 * constructors that record what they were asked to create (order, options,
 * upstreams), so the builder's logic is checked on its own. The example-file
 * test uses the real core constructors over the CPU device (tools/sim/fake_gpu):
 * every example must build and serve an allocation. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../config/config_internal.h"
#include "../../tools/sim/fake_gpu.h"

/* ---- fake resources ------------------------------------------------------- */
typedef struct fake {
    ps_resource_t base;        /* the resource */
    char type[16];             /* what constructor made it */
    char name[96];             /* its name */
    char path[256];            /* log: the file */
    size_t size_arg;           /* limit bytes / fixed_size block / threshold */
    ps_pool_options_t pool;    /* pool options seen */
    ps_fixed_size_options_t fixed; /* fixed_size options seen */
    ps_arena_options_t arena;  /* arena options seen */
    size_t bin_count;          /* binning: bins */
    ps_bin_t bins[8];          /* binning: the bins */
    ps_resource_t *fallback;   /* binning: fallback */
} fake_t;

static fake_t *created[64];     /* in creation order */
static int created_count;
static char destroyed[64][96]; /* names, in destruction order */
static int destroyed_count;
static const char *fail_type;   /* constructor of this type fails ... */
static int fail_status;         /* ... with this status */

static void fake_destroy(ps_resource_t *r)
{
    fake_t *f = (fake_t *)r;
    snprintf(destroyed[destroyed_count++], sizeof destroyed[0], "%s", f->name);
    free(f);
}
static int fake_allocate(ps_resource_t *r, size_t size, ps_stream_t s, void **out) { return PS_EUNSUPPORTED; }
static int fake_deallocate(ps_resource_t *r, void *p, size_t size, ps_stream_t s) { return PS_EINVAL; }
static const ps_resource_ops_t fake_ops = {"fake", fake_allocate, fake_deallocate, NULL, NULL, fake_destroy};

static int make(const char *type, const char *name, ps_resource_t *upstream, fake_t **f, ps_resource_t **out)
{
    if (fail_type && strcmp(fail_type, type) == 0)
        return fail_status;
    *f = calloc(1, sizeof **f);
    cr_assert_not_null(*f);
    (*f)->base.ops = &fake_ops;
    (*f)->base.name = name;
    (*f)->base.upstream = upstream;
    snprintf((*f)->type, sizeof (*f)->type, "%s", type);
    snprintf((*f)->name, sizeof (*f)->name, "%s", name);
    created[created_count++] = *f;
    *out = &(*f)->base;
    return PS_OK;
}

static int fake_pool(const char *name, ps_resource_t *up, const ps_gpu_ops_t *gpu, const ps_pool_options_t *o, ps_resource_t **out)
{
    fake_t *f;
    int rc = make("pool", name, up, &f, out);
    if (rc == PS_OK)
        f->pool = *o;
    return rc;
}
static int fake_arena(const char *name, ps_resource_t *up, const ps_gpu_ops_t *gpu, const ps_arena_options_t *o, ps_resource_t **out)
{
    fake_t *f;
    int rc = make("arena", name, up, &f, out);
    if (rc == PS_OK)
        f->arena = *o;
    return rc;
}
static int fake_fixed(const char *name, ps_resource_t *up, const ps_gpu_ops_t *gpu, const ps_fixed_size_options_t *o, ps_resource_t **out)
{
    fake_t *f;
    int rc = make("fixed_size", name, up, &f, out);
    if (rc == PS_OK)
        f->fixed = *o;
    return rc;
}
static int fake_binning(const char *name, const ps_bin_t *bins, size_t n, ps_resource_t *fallback, ps_resource_t **out)
{
    fake_t *f;
    int rc = make("binning", name, NULL, &f, out);
    if (rc == PS_OK) {
        f->bin_count = n;
        memcpy(f->bins, bins, n * sizeof *bins);
        f->fallback = fallback;
    }
    return rc;
}
static int fake_cuda(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out)
{
    fake_t *f;
    return make("cuda", name, NULL, &f, out);
}
static int fake_managed(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out)
{
    fake_t *f;
    return make("managed", name, NULL, &f, out);
}
static int fake_async(const char *name, const ps_gpu_ops_t *gpu, uint64_t threshold, ps_resource_t **out)
{
    fake_t *f;
    int rc = make("async", name, NULL, &f, out);
    if (rc == PS_OK)
        f->size_arg = (size_t)threshold;
    return rc;
}
static int fake_limit(const char *name, ps_resource_t *up, size_t bytes, ps_resource_t **out)
{
    fake_t *f;
    int rc = make("limit", name, up, &f, out);
    if (rc == PS_OK)
        f->size_arg = bytes;
    return rc;
}
static int fake_stats(const char *name, ps_resource_t *up, ps_resource_t **out)
{
    fake_t *f;
    return make("stats", name, up, &f, out);
}
static int fake_track(const char *name, ps_resource_t *up, unsigned depth, ps_resource_t **out)
{
    fake_t *f;
    int rc = make("track", name, up, &f, out);
    if (rc == PS_OK)
        f->size_arg = depth;
    return rc;
}
static int fake_log(const char *name, ps_resource_t *up, const char *path, ps_resource_t **out)
{
    fake_t *f;
    int rc = make("log", name, up, &f, out);
    if (rc == PS_OK)
        snprintf(f->path, sizeof f->path, "%s", path);
    return rc;
}

static const ps_config_constructors_t fakes = {fake_pool, fake_arena, fake_fixed, fake_binning, fake_cuda,
                                               fake_async, fake_managed, fake_limit, fake_stats, fake_track,
                                               fake_log};

/* ---- a device with a size and nothing else -------------------------------- */
static size_t device_total = 80ull << 30;
static int fake_mem_get_info(void *ctx, size_t *free_bytes, size_t *total)
{
    *free_bytes = device_total / 2;
    *total = device_total;
    return PS_OK;
}
static ps_gpu_ops_t fake_gpu = {.device = 0, .mem_get_info = fake_mem_get_info};

static ps_config_t *load(const char *text)
{
    char *env[] = {NULL};
    ps_config_input_t in = {.environ = env, .no_env = 1};
    ps_config_t *cfg = NULL;
    int rc = ps_config_load_text(text, "build.ini", &in, &cfg);
    if (rc != PS_OK)
        ps_config_print_errors(cfg, stderr);
    cr_assert_eq(rc, PS_OK);
    return cfg;
}

static fake_t *find(const char *name)
{
    for (int i = 0; i < created_count; i++)
        if (strcmp(created[i]->name, name) == 0)
            return created[i];
    cr_assert_fail("nothing named %s was created", name);
    return NULL;
}

static int order_of(const char *name)
{
    for (int i = 0; i < created_count; i++)
        if (strcmp(created[i]->name, name) == 0)
            return i;
    return -1;
}

static void reset(void)
{
    ps_verbosity = -1; /* failures are provoked on purpose; the test that reads messages turns them on */
    created_count = 0;
    destroyed_count = 0;
    fail_type = NULL;
}

TestSuite(config_build, .init = reset);

Test(config_build, default_config_builds_main_pool_over_cuda)
{
    ps_config_t *cfg = load("");
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_OK);
    cr_assert_eq(stack->count, 2);
    cr_assert_str_eq(created[0]->type, "cuda", "upstream first");
    cr_assert_str_eq(created[1]->type, "pool");
    cr_assert_str_eq(created[1]->name, "main");
    cr_assert_eq(stack->top, &created[1]->base);
    cr_assert_eq(created[1]->base.upstream, &created[0]->base);
    cr_assert_null(stack->stats);
    cr_assert_null(stack->log);
    cr_assert_eq(created[1]->pool.free_sync, PS_FREE_SYNC_BARRIER);
    cr_assert_eq(created[1]->pool.initial_size, 0, "no reservation by default");
    ps_stack_destroy(stack);
    cr_assert_eq(destroyed_count, 2);
    cr_assert_str_eq(destroyed[0], "main", "destroyed in reverse");
    cr_assert_str_eq(destroyed[1], "cuda");
    ps_config_free(cfg);
}

Test(config_build, options_reach_the_constructor_and_percentages_use_total_memory)
{
    ps_config_t *cfg = load("[resource.main]\ntype = pool\ninitial_size = 25%\nmaximum_size = 50GiB\n"
                            "min_chunk = 64MiB\nmax_chunk = 2GiB\ngrowth_percent = 20\nalignment = 4KiB\n"
                            "epoch_wait_us = 7\n");
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_OK);
    const ps_pool_options_t *o = &find("main")->pool;
    cr_assert_eq(o->initial_size, 20ull << 30, "25%% of 80 GiB");
    cr_assert_eq(o->maximum_size, 50ull << 30);
    cr_assert_eq(o->min_chunk, 64u << 20);
    cr_assert_eq(o->max_chunk, 2ull << 30);
    cr_assert_eq(o->growth_percent, 20);
    cr_assert_eq(o->alignment, 4096);
    cr_assert_eq(o->epoch_wait_ns, 7000);
    ps_stack_destroy(stack);
    ps_config_free(cfg);
}

Test(config_build, percentages_without_a_device_size_fail_cleanly)
{
    ps_config_t *cfg = load("[resource.main]\ntype = pool\ninitial_size = 25%\n");
    ps_gpu_ops_t blind = {.device = 0};
    ps_stack_t *stack = (ps_stack_t *)0x1;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &blind, &fakes, &stack), PS_ECONFIG);
    cr_assert_eq(stack, (ps_stack_t *)0x1, "*out untouched");
    cr_assert_eq(created_count, 0);
    ps_config_free(cfg);
}

Test(config_build, free_sync_defaults_to_the_global_policy)
{
    ps_config_t *cfg = load("[global]\nfree_sync = none\n[resource.main]\ntype = pool\nupstream = own\n"
                            "[resource.own]\ntype = pool\nfree_sync = device\n");
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_OK);
    cr_assert_eq(find("main")->pool.free_sync, PS_FREE_SYNC_NONE);
    cr_assert_eq(find("own")->pool.free_sync, PS_FREE_SYNC_DEVICE);
    cr_assert_eq(find("main")->base.upstream, &find("own")->base);
    ps_stack_destroy(stack);
    ps_config_free(cfg);
}

Test(config_build, a_shared_resource_is_created_once)
{
    ps_config_t *cfg = load("[resource.main]\ntype = binning\nbins = tiny:1KiB, 64KiB\nfallback = big\n"
                            "upstream = big\nblocks_per_batch = 32\n"
                            "[resource.tiny]\ntype = fixed_size\nblock_size = 1KiB\nupstream = big\n"
                            "[resource.big]\ntype = pool\n");
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_OK);
    int pools = 0;
    for (int i = 0; i < created_count; i++)
        pools += strcmp(created[i]->type, "pool") == 0;
    cr_assert_eq(pools, 1, "big serves three parents and is created once");
    cr_assert_eq(stack->count, 5, "cuda, big, tiny, the implicit 64KiB bin, main");
    fake_t *bin = find("main.bin65536");
    cr_assert_str_eq(bin->type, "fixed_size");
    cr_assert_eq(bin->fixed.block_size, 64 * 1024);
    cr_assert_eq(bin->fixed.blocks_per_batch, 32);
    cr_assert_eq(bin->base.upstream, &find("big")->base, "implicit bins sit on the binning's upstream");
    fake_t *m = find("main");
    cr_assert_eq(m->bin_count, 2);
    cr_assert_eq(m->bins[0].max_size, 1024);
    cr_assert_eq(m->bins[0].resource, &find("tiny")->base);
    cr_assert_eq(m->bins[1].resource, &bin->base);
    cr_assert_eq(m->fallback, &find("big")->base);
    cr_assert_lt(order_of("big"), order_of("tiny"));
    cr_assert_lt(order_of("tiny"), order_of("main"));
    cr_assert_eq(stack->top, &m->base);
    ps_stack_destroy(stack);
    cr_assert_eq(destroyed_count, 5);
    ps_config_free(cfg);
}

Test(config_build, stats_and_log_go_on_top_with_the_device_in_the_file_name)
{
    ps_config_t *cfg = load("[global]\nstats = json\nlog_file = ev-%d.csv\n");
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 1, &fake_gpu, &fakes, &stack), PS_OK);
    cr_assert_eq(stack->count, 4);
    cr_assert_str_eq(created[2]->type, "stats");
    cr_assert_str_eq(created[3]->type, "log");
    cr_assert_eq(stack->top, &created[3]->base);
    cr_assert_eq(stack->log, &created[3]->base);
    cr_assert_eq(stack->stats, &created[2]->base);
    cr_assert_eq(created[2]->base.upstream, &find("main")->base);
    cr_assert_str_eq(created[3]->path, "ev-1.csv");
    ps_stack_destroy(stack);
    ps_config_free(cfg);
}

Test(config_build, a_log_name_without_device_gets_one_per_device)
{
    ps_config_t *cfg = load("[global]\nlog_file = ev.csv\n");
    ps_stack_t *s0 = NULL, *s2 = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &s0), PS_OK);
    cr_assert_str_eq(((fake_t *)s0->log)->path, "ev.csv");
    cr_assert_eq(ps_config_build_stack_with(cfg, 2, &fake_gpu, &fakes, &s2), PS_OK);
    cr_assert_str_eq(((fake_t *)s2->log)->path, "ev.csv.2");
    cr_assert_neq(s0->top, s2->top, "each device has its own stack");
    ps_stack_destroy(s0);
    ps_stack_destroy(s2);
    ps_config_free(cfg);
}

Test(config_build, adaptors_in_the_stack_are_found)
{
    ps_config_t *cfg = load("[resource.t]\ntype = track\nstack_depth = 6\nupstream = c\n"
                            "[resource.c]\ntype = limit\nlimit = 10%\nupstream = s\n"
                            "[resource.s]\ntype = stats\nupstream = a\n"
                            "[resource.a]\ntype = async\nrelease_threshold = 1GiB\n"
                            "[device.*]\nresource = t\n");
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_OK);
    cr_assert_eq(stack->count, 4);
    cr_assert_eq(stack->track, &find("t")->base);
    cr_assert_eq(stack->stats, &find("s")->base);
    cr_assert_null(stack->log);
    cr_assert_eq(find("t")->size_arg, 6);
    cr_assert_eq(find("c")->size_arg, 8ull << 30, "10%% of 80 GiB");
    cr_assert_eq(find("a")->size_arg, 1ull << 30);
    ps_stack_destroy(stack);
    ps_config_free(cfg);
}

Test(config_build, async_keeps_everything_cached_by_default)
{
    ps_config_t *cfg = load("[resource.main]\ntype = pool\nupstream = async\n");
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_OK);
    cr_assert_eq(find("async")->size_arg, SIZE_MAX);
    ps_stack_destroy(stack);
    ps_config_free(cfg);
}

Test(config_build, each_device_gets_its_own_section)
{
    ps_config_t *cfg = load("[resource.a]\ntype = pool\n[resource.b]\ntype = arena\nsuperblock_size = 8MiB\n"
                            "[device.1]\nresource = b\n[device.*]\nresource = a\n");
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 1, &fake_gpu, &fakes, &stack), PS_OK);
    cr_assert_str_eq(((fake_t *)stack->top)->name, "b");
    cr_assert_eq(((fake_t *)stack->top)->arena.superblock_size, 8u << 20);
    ps_stack_destroy(stack);
    cr_assert_eq(ps_config_build_stack_with(cfg, 3, &fake_gpu, &fakes, &stack), PS_OK);
    cr_assert_str_eq(((fake_t *)stack->top)->name, "a");
    ps_stack_destroy(stack);
    ps_config_free(cfg);
}

Test(config_build, the_arena_takes_its_thread_floor_and_the_pool_refuses_it)
{
    ps_config_t *cfg = load("[resource.main]\ntype = arena\nthread_floor = 32MiB\n");
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_OK);
    cr_assert_eq(((fake_t *)stack->top)->arena.thread_floor, 32u << 20);
    ps_stack_destroy(stack);
    ps_config_free(cfg);
    cfg = load("[resource.main]\ntype = arena\n");
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_OK);
    cr_assert_eq(((fake_t *)stack->top)->arena.thread_floor, 16u << 20, "default 16 MiB");
    ps_stack_destroy(stack);
    ps_config_free(cfg);
    char *env[] = {NULL};
    ps_config_input_t in = {.environ = env, .no_env = 1};
    cfg = NULL;
    cr_assert_neq(ps_config_load_text("[resource.main]\ntype = pool\nthread_floor = 1MiB\n", "build.ini", &in, &cfg), PS_OK);
    cr_assert_geq(ps_config_error_count(cfg), 1);
    cr_assert(strstr(ps_config_error(cfg, 0), "thread_floor"), "%s", ps_config_error(cfg, 0));
    ps_config_free(cfg);
}

Test(config_build, a_failing_constructor_leaves_nothing_behind)
{
    ps_config_t *cfg = load("[global]\nstats = text\n[resource.main]\ntype = limit\nlimit = 1GiB\nupstream = p\n"
                            "[resource.p]\ntype = pool\n");
    const char *types[] = {"cuda", "pool", "limit", "stats"};
    const int statuses[] = {PS_ENOMEM, PS_EUNSUPPORTED, PS_EINVAL, PS_EUPSTREAM};
    for (int t = 0; t < 4; t++) {
        reset();
        fail_type = types[t];
        fail_status = statuses[t];
        ps_stack_t *stack = (ps_stack_t *)0x1;
        int rc = ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack);
        int want = statuses[t] == PS_ENOMEM || statuses[t] == PS_EUNSUPPORTED ? statuses[t] : PS_ECONFIG;
        cr_assert_eq(rc, want, "%s failing with %d: got %d", types[t], statuses[t], rc);
        cr_assert_eq(stack, (ps_stack_t *)0x1, "*out untouched");
        cr_assert_eq(destroyed_count, created_count, "everything created was destroyed (%s)", types[t]);
        cr_assert_eq(created_count, t, "built bottom-up until %s failed", types[t]);
    }
    ps_config_free(cfg);
}

Test(config_build, a_resource_the_device_cannot_offer_is_reported_by_name)
{
    ps_config_t *cfg = load("[resource.main]\ntype = arena\n");
    FILE *log = tmpfile();
    cr_assert_not_null(log);
    ps_message_set_fd(fileno(log));
    ps_verbosity = PS_MSG_WARNING;
    fail_type = "arena";
    fail_status = PS_EUNSUPPORTED;
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 3, &fake_gpu, &fakes, &stack), PS_EUNSUPPORTED);
    char text[512] = "";
    rewind(log);
    size_t n = fread(text, 1, sizeof text - 1, log);
    text[n] = '\0';
    cr_assert_str_eq(text, "poolshim: error: device 3: cannot create resource `main` (type arena, build.ini:2): "
                           "not supported (the device or its driver lacks what this type needs)\n");
    ps_message_set_fd(2);
    fclose(log);
    ps_config_free(cfg);
}

Test(config_build, an_invalid_config_builds_nothing)
{
    char *env[] = {NULL};
    ps_config_input_t in = {.environ = env, .no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load_text("[resource.main]\ntype = pool\nupstream = main\n", "cycle.ini", &in, &cfg),
                 PS_ECONFIG);
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_ECONFIG);
    cr_assert_eq(created_count, 0);
    cr_assert_null(stack);
    ps_config_free(cfg);
}

Test(config_build, a_limit_below_a_percent_initial_size_is_caught_at_build)
{
    ps_config_t *cfg = load("[resource.cap]\ntype = limit\nlimit = 1GiB\nupstream = main\n"
                            "[resource.main]\ntype = pool\ninitial_size = 50%\n[device.*]\nresource = cap\n");
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_ECONFIG,
                 "1 GiB is below 50%% of 80 GiB");
    cr_assert_eq(created_count, 0);
    device_total = 1ull << 30; /* a 1 GiB device: 50% = 512 MiB fits under the limit */
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_OK);
    ps_stack_destroy(stack);
    device_total = 80ull << 30;
    ps_config_free(cfg);
}

Test(config_build, a_limit_on_another_device_does_not_block_this_one)
{
    ps_config_t *cfg = load("[resource.cap]\ntype = limit\nlimit = 1GiB\nupstream = big\n"
                            "[resource.big]\ntype = pool\ninitial_size = 50%\n[device.1]\nresource = cap\n");
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack_with(cfg, 0, &fake_gpu, &fakes, &stack), PS_OK, "device 0 uses main");
    ps_stack_destroy(stack);
    cr_assert_eq(ps_config_build_stack_with(cfg, 1, &fake_gpu, &fakes, &stack), PS_ECONFIG);
    ps_config_free(cfg);
}

/* ---- the shipped examples ---------------------------------------------------------- */
static char examples_dir[4096];

static int for_each_example(void (*fn)(const char *path))
{
    const char *data = getenv("POOLSHIM_TEST_DATA");
    cr_assert_not_null(data);
    char relative[4096];
    snprintf(relative, sizeof relative, "%s/../../config/examples", data);
    /* absolute: a test may run from a scratch directory */
    if (!realpath(relative, examples_dir))
        snprintf(examples_dir, sizeof examples_dir, "%s", relative);
    DIR *d = opendir(examples_dir);
    cr_assert_not_null(d, "cannot open %s", examples_dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".ini") != 0)
            continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", examples_dir, e->d_name);
        if (fn)
            fn(path);
        n++;
    }
    closedir(d);
    return n;
}

static ps_config_t *load_example(const char *path)
{
    char *env[] = {NULL};
    ps_config_input_t in = {.file = path, .environ = env, .no_env = 1};
    ps_config_t *cfg = NULL;
    int rc = ps_config_load(&in, &cfg);
    if (rc != PS_OK)
        ps_config_print_errors(cfg, stderr);
    cr_assert_eq(rc, PS_OK, "%s does not load", path);
    return cfg;
}

static void build_example_with_fakes(const char *path)
{
    ps_config_t *cfg = load_example(path);
    for (int device = 0; device < 3; device++) {
        reset();
        ps_stack_t *stack = NULL;
        cr_assert_eq(ps_config_build_stack_with(cfg, device, &fake_gpu, &fakes, &stack), PS_OK,
                     "%s, device %d", path, device);
        cr_assert_not_null(stack->top);
        cr_assert_eq(stack->count, (size_t)created_count);
        ps_stack_destroy(stack);
        cr_assert_eq(destroyed_count, created_count);
    }
    ps_config_free(cfg);
}

Test(config_build, every_example_builds_on_every_device_with_fake_resources)
{
    cr_assert_geq(for_each_example(build_example_with_fakes), 6);
}

static void build_example_with_core(const char *path)
{
    ps_config_t *cfg = load_example(path);
    ps_gpu_ops_t *gpu = NULL;
    ps_fake_gpu_options_t opts = {.capacity = 80ull << 30, .backed = 0, .auto_complete = 1};
    cr_assert_eq(ps_fake_gpu_create(&opts, &gpu), PS_OK);
    for (int device = 0; device < 2; device++) {
        ps_stack_t *stack = NULL;
        int rc = ps_config_build_stack(cfg, device, gpu, &stack);
        cr_assert(rc == PS_OK, "%s, device %d: %s", path, device, ps_status_name(rc));
        {
            void *p = NULL;
            cr_assert_eq(ps_allocate(stack->top, 4096, PS_STREAM_NONE, &p), PS_OK, "%s", path);
            cr_assert_eq(ps_deallocate(stack->top, p, 4096, PS_STREAM_NONE), PS_OK, "%s", path);
            ps_stack_destroy(stack);
        }
    }
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
}

Test(config_build, every_example_builds_with_the_core_resources_and_serves_an_allocation)
{
    /* examples with a log adaptor write their event files into the current
     * directory: run from a scratch one, removed afterwards */
    char scratch[] = "/tmp/poolshim-examples-XXXXXX";
    cr_assert_not_null(mkdtemp(scratch));
    char back[4096];
    cr_assert_not_null(getcwd(back, sizeof back));
    cr_assert_eq(chdir(scratch), 0);
    int n = for_each_example(build_example_with_core);
    cr_assert_eq(chdir(back), 0);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    cr_expect_eq(system(cmd), 0);
    cr_assert_geq(n, 6);
}

/* The pool options of [resource.main] in `cfg`. */
static ps_pool_options_t main_pool_options(const ps_config_t *cfg)
{
    for (size_t i = 0; i < cfg->def_count; i++)
        if (!strcmp(cfg->defs[i].name, "main")) {
            cr_assert_eq(cfg->defs[i].type, PS_TYPE_POOL);
            ps_pool_options_t o;
            memset(&o, 0, sizeof o); /* (padding too: compared whole) */
            ps_config_pool_options(cfg, &cfg->defs[i], 80ull << 30, &o);
            return o;
        }
    cr_assert_fail("no [resource.main]");
    return (ps_pool_options_t){0};
}

/* The pool options built from [resource.main] of type pool with `keys`
 * (lines "key = value\n") added. */
static ps_pool_options_t pool_options_with(const char *keys)
{
    char text[512];
    snprintf(text, sizeof text, "[resource.main]\ntype = pool\n%s", keys);
    ps_config_t *cfg = load(text);
    ps_pool_options_t o = main_pool_options(cfg);
    ps_config_free(cfg);
    return o;
}

Test(config_build, the_default_pool_example_is_the_default)
{
    /* config/examples/default_pool.ini says it writes the default out; it
     * once set free_sync = event and chunks (1.8x on the PyTorch logs where
     * the default holds 1.006x). Every value it gives must be the built-in one. */
    char path[8192] = "";
    (void)for_each_example(NULL); /* (finds examples_dir) */
    snprintf(path, sizeof path, "%s/default_pool.ini", examples_dir);
    ps_config_t *example = load_example(path);
    char *env[] = {NULL};
    ps_config_input_t in = {.file = NULL, .environ = env, .no_env = 1};
    ps_config_t *builtin = NULL;
    cr_assert_eq(ps_config_load(&in, &builtin), PS_OK);
    ps_pool_options_t a = main_pool_options(example), b = main_pool_options(builtin);
    cr_assert_eq(memcmp(&a, &b, sizeof a), 0, "default_pool.ini's pool differs from the built-in one");
    cr_assert_eq(ps_config_global(example)->free_sync, ps_config_global(builtin)->free_sync);
    cr_assert_eq(ps_config_global(example)->stats, ps_config_global(builtin)->stats);
    ps_config_free(example);
    ps_config_free(builtin);
}

/* Builds `ini` on a fake GPU with (vm 1) or without virtual memory and
 * returns what the library said (its messages go to a temporary file). */
static void messages_of_building(const char *ini, int vm, char *out, size_t size)
{
    char path[] = "/tmp/poolshim-msg-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    unlink(path);
    char file[] = "/tmp/poolshim-ini-XXXXXX.ini";
    int ifd = mkstemps(file, 4);
    cr_assert_geq(ifd, 0);
    cr_assert_eq(write(ifd, ini, strlen(ini)), (ssize_t)strlen(ini));
    close(ifd);
    ps_config_t *cfg = load_example(file);
    unlink(file);
    ps_gpu_ops_t *gpu = NULL;
    ps_fake_gpu_options_t opts = {.capacity = 8ull << 30, .virtual_memory = vm, .auto_complete = 1};
    cr_assert_eq(ps_fake_gpu_create(&opts, &gpu), PS_OK);
    ps_message_set_fd(fd);
    ps_verbosity = PS_MSG_WARNING; /* (the suite's init silences messages) */
    ps_stack_t *stack = NULL;
    int rc = ps_config_build_stack(cfg, 0, gpu, &stack);
    ps_verbosity = -1;
    ps_message_set_fd(2);
    cr_assert_eq(rc, PS_OK);
    ps_stack_destroy(stack);
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
    ssize_t n = pread(fd, out, size - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    close(fd);
}

Test(config_build, a_pool_says_when_it_will_not_use_the_upstream_it_was_given)
{
    /* an expandable pool maps its own memory: an upstream set for it serves
     * only where the device lacks virtual memory (async_upstream.ini once
     * fell into this and never called cudaMallocAsync) */
    const char *ini = "[resource.mine]\ntype = async\n[resource.main]\ntype = pool\nupstream = mine\n"
                      "[device.*]\nresource = main\n";
    char out[4096];
    messages_of_building(ini, 1, out, sizeof out);
    cr_assert(strstr(out, "pool 'main': its upstream 'mine' is not used") && strstr(out, "expandable = 0"), "%s", out);
    messages_of_building(ini, 0, out, sizeof out); /* no virtual memory: chunks from it */
    cr_assert_null(strstr(out, "is not used"), "%s", out);
    const char *chunks = "[resource.mine]\ntype = async\n[resource.main]\ntype = pool\nupstream = mine\n"
                         "expandable = 0\n[device.*]\nresource = main\n";
    messages_of_building(chunks, 1, out, sizeof out);
    cr_assert_null(strstr(out, "is not used"), "%s", out);
    messages_of_building("[resource.main]\ntype = pool\nupstream = cuda\n", 1, out, sizeof out);
    cr_assert_null(strstr(out, "is not used"), "the implicit upstream written out: %s", out);
}

Test(config_build, expandable_run_min_reaches_the_pool_and_defaults_to_1_gib)
{
    cr_assert_eq(pool_options_with("").expandable_run_min, PS_GiB, "the default: runs from 1 GiB");
    cr_assert_eq(pool_options_with("expandable_run_min = 64MiB\n").expandable_run_min, 64 * PS_MiB);
    cr_assert_eq(pool_options_with("expandable_run_min = 0\n").expandable_run_min, 0, "0: always piece by piece");
}

Test(config_build, expandable_setup_run_min_reaches_the_pool_and_is_off_by_default)
{
    cr_assert_eq(pool_options_with("").expandable_setup_run_min, 0, "the default: no setup runs");
    cr_assert_eq(pool_options_with("").expandable_piece, 8 * PS_MiB, "the default piece: 8 MiB");
    cr_assert_eq(pool_options_with("expandable_setup_run_min = 256MiB\n").expandable_setup_run_min, 256 * PS_MiB);
    cr_assert_eq(pool_options_with("expandable_setup_run_min = 0\n").expandable_setup_run_min, 0, "0: off");
}

Test(config_build, expandable_map_first_reaches_the_pool_on_by_default_and_off_for_the_pinned_pool)
{
    ps_config_t *cfg = load("[resource.main]\ntype = pool\n");
    cr_assert_eq(main_pool_options(cfg).expandable_map_first, 1, "the default: the first piece with the pool");
    ps_pool_options_t host;
    ps_host_pool_options(&ps_config_global(cfg)->host, &host);
    cr_assert_eq(host.expandable_map_first, 0, "the pinned pool maps only what the program asks for");
    ps_config_free(cfg);
    cr_assert_eq(pool_options_with("expandable_map_first = 0\n").expandable_map_first, 0);
}
