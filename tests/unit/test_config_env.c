/* Environment overrides and precedence: embedded default < file <
 * POOLSHIM_OPTIONS < short forms, every value with its origin. The tests
 * pass explicit environment arrays (no_env = 1): the real environment is
 * never read, except where a test checks that it is ignored. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../config/config_internal.h"
#include "../../tools/sim/fake_gpu.h"

/* Loads `text` as the user file with the given options and environment;
 * asserts the expected status. */
static ps_config_t *load(const char *text, const char *options, char **env, int expect)
{
    ps_config_input_t in = {.options = options, .environ = env, .no_env = 1};
    ps_config_t *cfg = NULL;
    int rc = ps_config_load_text(text ? text : "", "user.ini", &in, &cfg);
    if (rc != expect)
        ps_config_print_errors(cfg, stderr);
    cr_assert_eq(rc, expect, "load returned %d", rc);
    cr_assert_not_null(cfg);
    return cfg;
}

static const ps_resource_def_t *def_of(const ps_config_t *cfg, const char *name)
{
    int i = ps_config_def_index(cfg, name);
    cr_assert_geq(i, 0, "no resource %s", name);
    return &cfg->defs[i];
}

static int has_error(const ps_config_t *cfg, const char *text)
{
    for (size_t i = 0; i < ps_config_error_count(cfg); i++)
        if (strstr(ps_config_error(cfg, i), text))
            return 1;
    return 0;
}

static void expect_error(const ps_config_t *cfg, const char *text)
{
    if (!has_error(cfg, text))
        ps_config_print_errors(cfg, stderr);
    cr_assert(has_error(cfg, text), "no error containing: %s", text);
}

Test(config_env, embedded_default_is_a_pool_named_main_on_every_device)
{
    char *env[] = {NULL};
    ps_config_t *cfg = load(NULL, NULL, env, PS_OK);
    const ps_device_def_t *d = ps_config_device(cfg, 3);
    cr_assert_not_null(d);
    cr_assert_eq(d->device, -1, "device 3 uses [device.*]");
    cr_assert_str_eq(cfg->defs[d->resource].name, "main");
    const ps_resource_def_t *main_def = def_of(cfg, "main");
    cr_assert_eq(main_def->type, PS_TYPE_POOL);
    cr_assert_eq(main_def->values[PS_KEY_TYPE].origin.kind, PS_ORIGIN_EMBEDDED);
    cr_assert_eq(main_def->values[PS_KEY_INITIAL_SIZE].set, 0, "no initial reservation");
    cr_assert_str_eq(cfg->defs[main_def->upstream].name, "cuda", "implicit cuda upstream");
    const ps_global_config_t *g = ps_config_global(cfg);
    cr_assert_eq(g->stats, PS_STATS_OFF);
    cr_assert_eq(g->free_sync, PS_FREE_SYNC_BARRIER);
    cr_assert_eq(g->on_error, PS_ON_ERROR_EXIT);
    cr_assert_eq(g->verbosity, 1);
    cr_assert_eq(cfg->global_origin[PS_GKEY_STATS].kind, PS_ORIGIN_NONE);
    ps_config_free(cfg);
}

Test(config_env, each_source_overrides_the_one_before_and_records_its_origin)
{
    const char *file = "[global]\nstats = text\nfree_sync = device\nverbosity = 2\nmeminfo = device\n";
    char *env[] = {"POOLSHIM_STATS=json", NULL};
    ps_config_t *cfg = load(file, "global.free_sync=none,global.stats=off", env, PS_OK);
    const ps_global_config_t *g = ps_config_global(cfg);
    char where[256];
    /* short form beats OPTIONS beats file */
    cr_assert_eq(g->stats, PS_STATS_JSON);
    cr_assert_str_eq(ps_origin_format(&cfg->global_origin[PS_GKEY_STATS], where, sizeof where),
                     "POOLSHIM_STATS");
    /* OPTIONS beats file */
    cr_assert_eq(g->free_sync, PS_FREE_SYNC_NONE);
    cr_assert_str_eq(ps_origin_format(&cfg->global_origin[PS_GKEY_FREE_SYNC], where, sizeof where),
                     "POOLSHIM_OPTIONS item 1");
    /* file beats default */
    cr_assert_eq(g->verbosity, 2);
    cr_assert_str_eq(ps_origin_format(&cfg->global_origin[PS_GKEY_VERBOSITY], where, sizeof where),
                     "user.ini:4");
    cr_assert_eq(g->meminfo, PS_MEMINFO_DEVICE);
    /* untouched keys stay default */
    cr_assert_eq(g->on_error, PS_ON_ERROR_EXIT);
    cr_assert_str_eq(ps_origin_format(&cfg->global_origin[PS_GKEY_ON_ERROR], where, sizeof where), "default");
    ps_config_free(cfg);
}

/* global.oom_retry: on by default; a file or POOLSHIM_OPTIONS turns it off
 * with any boolean spelling, and the value keeps its origin */
Test(config_env, oom_retry_is_on_by_default_and_any_source_turns_it_off)
{
    char *env[] = {NULL};
    char where[256];
    ps_config_t *cfg = load(NULL, NULL, env, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->oom_retry, 1, "on by default");
    cr_assert_str_eq(ps_origin_format(&cfg->global_origin[PS_GKEY_OOM_RETRY], where, sizeof where), "default");
    ps_config_free(cfg);
    cfg = load("[global]\noom_retry = off\n", NULL, env, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->oom_retry, 0, "off in the file");
    cr_assert_str_eq(ps_origin_format(&cfg->global_origin[PS_GKEY_OOM_RETRY], where, sizeof where), "user.ini:2");
    ps_config_free(cfg);
    cfg = load("[global]\noom_retry = no\n", "global.stats=off,global.oom_retry=1", env, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->oom_retry, 1, "POOLSHIM_OPTIONS beats the file");
    cr_assert_str_eq(ps_origin_format(&cfg->global_origin[PS_GKEY_OOM_RETRY], where, sizeof where),
                     "POOLSHIM_OPTIONS item 2");
    ps_config_free(cfg);
    char *options[] = {"POOLSHIM_OPTIONS=global.oom_retry=0", NULL};
    cfg = load(NULL, NULL, options, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->oom_retry, 0, "as the shim tests turn it off");
    ps_config_free(cfg);
    cfg = load(NULL, "global.oom_retry=maybe", env, PS_ECONFIG);
    expect_error(cfg, "POOLSHIM_OPTIONS item 1: bad value `maybe` for `oom_retry` in [global]: not a boolean");
    ps_config_free(cfg);
}

Test(config_env, decay_and_neighbours_default_and_every_source_sets_them)
{
    char *env[] = {NULL};
    char where[256];
    ps_config_t *cfg = load(NULL, NULL, env, PS_OK);
    const ps_global_config_t *g = ps_config_global(cfg);
    cr_assert_eq(g->decay_ms, 5000);
    cr_assert_eq(g->neighbour_release, 1);
    cr_assert_eq(g->neighbour_wait_ms, 1000);
    ps_config_free(cfg);
    cfg = load("[global]\ndecay_ms = 250\nneighbour_release = no\nneighbour_wait_ms = 0\n", NULL, env, PS_OK);
    g = ps_config_global(cfg);
    cr_assert_eq(g->decay_ms, 250);
    cr_assert_eq(g->neighbour_release, 0);
    cr_assert_eq(g->neighbour_wait_ms, 0);
    ps_config_free(cfg);
    char *short_form[] = {"POOLSHIM_DECAY_MS=0", NULL};
    cfg = load("[global]\ndecay_ms = 250\n", NULL, short_form, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->decay_ms, 0, "the short form beats the file");
    cr_assert_str_eq(ps_origin_format(&cfg->global_origin[PS_GKEY_DECAY_MS], where, sizeof where),
                     "POOLSHIM_DECAY_MS");
    ps_config_free(cfg);
    cfg = load(NULL, "global.decay_ms=3600001", env, PS_ECONFIG);
    expect_error(cfg, "POOLSHIM_OPTIONS item 1: bad value `3600001` for `decay_ms` in [global]: too large");
    ps_config_free(cfg);
}

Test(config_env, options_set_resource_keys_and_quoted_lists)
{
    char *env[] = {NULL};
    ps_config_t *cfg = load(NULL,
                            "resource.main.type=binning, resource.main.bins=\"256, 1KiB,4KiB\","
                            "resource.main.fallback=big,resource.big.type=pool,"
                            "resource.big.initial_size=1.5GiB",
                            env, PS_OK);
    const ps_resource_def_t *m = def_of(cfg, "main");
    cr_assert_eq(m->type, PS_TYPE_BINNING);
    cr_assert_eq(m->bin_count, 3);
    cr_assert_eq(m->bins[0].max_size, 256);
    cr_assert_eq(m->bins[2].max_size, 4096);
    cr_assert_str_eq(cfg->defs[m->fallback].name, "big");
    cr_assert_eq(def_of(cfg, "big")->values[PS_KEY_INITIAL_SIZE].number, 3ull << 29);
    cr_assert_eq(def_of(cfg, "big")->values[PS_KEY_INITIAL_SIZE].origin.line, 5, "item number");
    ps_config_free(cfg);
}

Test(config_env, malformed_options_get_exact_messages)
{
    char *env[] = {NULL};
    struct {
        const char *options; /* POOLSHIM_OPTIONS */
        const char *message; /* the whole error line */
    } cases[] = {
        {"global.stats=json,", "POOLSHIM_OPTIONS: ends with a comma"},
        {"global.stats", "POOLSHIM_OPTIONS item 1: `global.stats`: missing '=' (expected section.key=value, e.g. global.stats=json)"},
        {"global.stats=json,,global.verbosity=2", "POOLSHIM_OPTIONS item 2: empty item (two commas in a row?)"},
        {"stats=json", "POOLSHIM_OPTIONS item 1: `stats`: missing section (expected section.key=value, e.g. global.stats=json)"},
        {"global.=json", "POOLSHIM_OPTIONS item 1: `global.`: missing section (expected section.key=value, e.g. global.stats=json)"},
        {"=json", "POOLSHIM_OPTIONS item 1: missing key before '=' (expected section.key=value)"},
        {"resource.main.bins=\"256,1KiB", "POOLSHIM_OPTIONS item 1: `resource.main.bins`: the value's opening '\"' has no closing '\"'"},
        {"global.stats=\"json\"x", "POOLSHIM_OPTIONS item 1: `global.stats`: unexpected text after the closing '\"'"},
        {"global.stats=loud", "POOLSHIM_OPTIONS item 1: bad value `loud` for `stats` in [global]: not a statistics mode (expected off, text or json (or 0/1))"},
        {"global.verbosity=1,resource.main.intial_size=1G", "POOLSHIM_OPTIONS item 2: unknown key `intial_size` in [resource.main] (did you mean `initial_size`?)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ps_config_t *cfg = load(NULL, cases[i].options, env, PS_ECONFIG);
        int found = 0;
        for (size_t e = 0; e < ps_config_error_count(cfg); e++)
            found |= strcmp(ps_config_error(cfg, e), cases[i].message) == 0;
        if (!found)
            ps_config_print_errors(cfg, stderr);
        cr_expect(found, "options `%s`: expected exactly: %s", cases[i].options, cases[i].message);
        ps_config_free(cfg);
    }
}

Test(config_env, empty_options_are_fine)
{
    char *env[] = {"POOLSHIM_OPTIONS=", NULL};
    ps_config_t *cfg = load(NULL, NULL, env, PS_OK);
    ps_config_free(cfg);
    cfg = load(NULL, "  ", env, PS_OK);
    ps_config_free(cfg);
}

Test(config_env, options_come_from_the_environment_array_when_not_given)
{
    char *env[] = {"POOLSHIM_OPTIONS=global.meminfo=device", NULL};
    ps_config_t *cfg = load(NULL, NULL, env, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->meminfo, PS_MEMINFO_DEVICE);
    ps_config_free(cfg);
}

Test(config_env, short_forms_set_their_keys)
{
    char *env[] = {"POOLSHIM_STATS=1", "POOLSHIM_STATS_FILE=s-%p.txt", "POOLSHIM_LOG=ev-%d.csv",
                   "POOLSHIM_FREE_SYNC=device", "POOLSHIM_VERBOSE=debug", "POOLSHIM_DISABLE=yes",
                   "POOLSHIM_ON_ERROR=passthrough", NULL};
    ps_config_t *cfg = load(NULL, NULL, env, PS_OK);
    const ps_global_config_t *g = ps_config_global(cfg);
    cr_assert_eq(g->stats, PS_STATS_TEXT, "1 means text");
    cr_assert_str_eq(g->stats_file, "s-%p.txt");
    cr_assert_str_eq(g->log_file, "ev-%d.csv");
    cr_assert_eq(g->free_sync, PS_FREE_SYNC_DEVICE);
    cr_assert_eq(g->verbosity, 3);
    cr_assert_eq(g->disable, 1);
    cr_assert_eq(g->on_error, PS_ON_ERROR_PASSTHROUGH);
    cr_assert_eq(cfg->global_origin[PS_GKEY_LOG_FILE].kind, PS_ORIGIN_ENV);
    cr_assert_str_eq(cfg->global_origin[PS_GKEY_LOG_FILE].source, "POOLSHIM_LOG");
    ps_config_free(cfg);

    char *off[] = {"POOLSHIM_STATS=0", NULL};
    cfg = load("[global]\nstats = json\n", NULL, off, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->stats, PS_STATS_OFF, "0 turns statistics off");
    ps_config_free(cfg);
}

Test(config_env, bad_short_form_values_name_the_variable)
{
    char *env[] = {"POOLSHIM_STATS=loud", "POOLSHIM_VERBOSE=9", "POOLSHIM_RESOURCE=poool", NULL};
    ps_config_t *cfg = load(NULL, NULL, env, PS_ECONFIG);
    expect_error(cfg, "POOLSHIM_STATS: bad value `loud` for `stats` in [global]");
    expect_error(cfg, "POOLSHIM_VERBOSE: bad value `9` for `verbosity` in [global]");
    expect_error(cfg, "POOLSHIM_RESOURCE: unknown type `poool` in [resource.main] (did you mean `pool`?)");
    cr_assert_eq(ps_config_error_count(cfg), 3);
    ps_config_free(cfg);
}

Test(config_env, resource_short_form_changes_the_type_of_the_default_device_resource)
{
    const char *file = "[resource.work]\ntype = pool\ninitial_size = 2GiB\ngrowth_percent = 20\n"
                       "[device.*]\nresource = work\n";
    char *env[] = {"POOLSHIM_RESOURCE=arena", NULL};
    ps_config_t *cfg = load(file, NULL, env, PS_OK);
    const ps_resource_def_t *w = def_of(cfg, "work");
    cr_assert_eq(w->type, PS_TYPE_ARENA);
    cr_assert_eq(w->values[PS_KEY_INITIAL_SIZE].number, 2ull << 30, "a key arenas have is kept");
    cr_assert_eq(w->values[PS_KEY_GROWTH_PERCENT].set, 0, "a pool-only key is dropped, not an error");
    cr_assert_eq(def_of(cfg, "main")->type, PS_TYPE_POOL, "the unused default stays as it was");
    ps_config_free(cfg);
}

Test(config_env, a_key_of_the_wrong_type_in_the_same_source_is_an_error)
{
    char *env[] = {NULL};
    ps_config_t *cfg = load(NULL, "resource.main.type=arena,resource.main.growth_percent=20", env, PS_ECONFIG);
    expect_error(cfg, "POOLSHIM_OPTIONS item 2: key `growth_percent` does not apply to type arena");
    ps_config_free(cfg);
}

Test(config_env, no_env_ignores_the_process_environment)
{
    setenv("POOLSHIM_STATS", "json", 1); /* this test runs in its own process */
    setenv("POOLSHIM_OPTIONS", "global.stats=text", 1);
    setenv("POOLSHIM_CONFIG", "/nonexistent/poolshim.ini", 1);
    ps_config_input_t in = {.no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load(&in, &cfg), PS_OK);
    cr_assert_eq(ps_config_global(cfg)->stats, PS_STATS_OFF);
    cr_assert_null(ps_config_file_path(cfg));
    ps_config_free(cfg);

    /* without no_env the same variables are read */
    ps_config_input_t real = {0};
    cr_assert_eq(ps_config_load(&real, &cfg), PS_ECONFIG);
    expect_error(cfg, "POOLSHIM_CONFIG: cannot read the configuration file `/nonexistent/poolshim.ini`");
    cr_assert_eq(ps_config_global(cfg)->stats, PS_STATS_JSON);
    ps_config_free(cfg);
}

Test(config_env, the_config_file_comes_from_poolshim_config_or_xdg)
{
    char dir[] = "/tmp/poolshim-config-test-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char sub[64], path[128], named[128], env_config[160], env_xdg[160];
    snprintf(sub, sizeof sub, "%s/poolshim", dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    snprintf(path, sizeof path, "%s/poolshim.ini", sub);
    FILE *f = fopen(path, "w");
    fputs("[global]\nstats = json\n", f);
    fclose(f);
    snprintf(named, sizeof named, "%s/named.ini", dir);
    f = fopen(named, "w");
    fputs("[global]\nstats = text\n", f);
    fclose(f);
    snprintf(env_xdg, sizeof env_xdg, "XDG_CONFIG_HOME=%s", dir);
    snprintf(env_config, sizeof env_config, "POOLSHIM_CONFIG=%s", named);

    char *xdg_only[] = {env_xdg, NULL};
    ps_config_input_t in = {.environ = xdg_only, .no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load(&in, &cfg), PS_OK);
    cr_assert_eq(ps_config_global(cfg)->stats, PS_STATS_JSON, "the XDG file was read");
    cr_assert_str_eq(ps_config_file_path(cfg), path);
    ps_config_free(cfg);

    char *both[] = {env_xdg, env_config, NULL};
    in.environ = both;
    cr_assert_eq(ps_config_load(&in, &cfg), PS_OK);
    cr_assert_eq(ps_config_global(cfg)->stats, PS_STATS_TEXT, "POOLSHIM_CONFIG wins over XDG");
    ps_config_free(cfg);

    in.file = path; /* an explicit file wins over POOLSHIM_CONFIG */
    cr_assert_eq(ps_config_load(&in, &cfg), PS_OK);
    cr_assert_eq(ps_config_global(cfg)->stats, PS_STATS_JSON);
    ps_config_free(cfg);

    char home[600];
    snprintf(home, sizeof home, "HOME=%s/nohome", dir);
    char *none[] = {home, NULL};
    in.file = NULL;
    in.environ = none;
    cr_assert_eq(ps_config_load(&in, &cfg), PS_OK, "no personal file is fine");
    cr_assert_null(ps_config_file_path(cfg));
    ps_config_free(cfg);

    unlink(path);
    unlink(named);
    rmdir(sub);
    rmdir(dir);
}

Test(config_env, a_directory_is_not_a_readable_file)
{
    ps_config_input_t in = {.file = "/tmp", .no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load(&in, &cfg), PS_ECONFIG);
    expect_error(cfg, "/tmp: cannot read the configuration file: Is a directory");
    ps_config_free(cfg);
}

Test(config_env, device_sections_pick_a_resource_per_device)
{
    const char *file = "[resource.a]\ntype = pool\n[resource.b]\ntype = arena\n"
                       "[device.1]\nresource = b\n[device.*]\nresource = a\n";
    char *env[] = {NULL};
    ps_config_t *cfg = load(file, NULL, env, PS_OK);
    cr_assert_str_eq(cfg->defs[ps_config_device(cfg, 0)->resource].name, "a");
    cr_assert_str_eq(cfg->defs[ps_config_device(cfg, 1)->resource].name, "b", "N wins over *");
    cr_assert_str_eq(cfg->defs[ps_config_device(cfg, 2)->resource].name, "a");
    ps_config_free(cfg);
}

Test(config_env, print_shows_the_stack_with_origins)
{
    const char *file = "[global]\nstats = json\n[resource.cap]\ntype = limit\nlimit = 50%\nupstream = main\n"
                       "[device.*]\nresource = cap\n";
    char *env[] = {"POOLSHIM_LOG=ev.csv", NULL};
    ps_config_t *cfg = load(file, "resource.main.initial_size=1GiB", env, PS_OK);
    char *out = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&out, &size);
    ps_config_print(cfg, m, 0);
    fclose(m);
    cr_assert(strstr(out, "[device.0] resource = cap  (from [device.*], user.ini:8)"), "%s", out);
    cr_assert(strstr(out, "log adaptor, file = ev.csv  (global.log_file, POOLSHIM_LOG)"), "%s", out);
    cr_assert(strstr(out, "stats adaptor, json at exit  (global.stats, user.ini:2)"), "%s", out);
    cr_assert(strstr(out, "[resource.cap] type = limit  (user.ini:4)"), "%s", out);
    cr_assert(strstr(out, "(of device memory, user.ini:5)"), "%s", out);
    cr_assert(strstr(out, "[resource.main] type = pool  (default.ini:"), "%s", out);
    cr_assert(strstr(out, "initial_size       = 1.00 GiB") && strstr(out, "(POOLSHIM_OPTIONS item 1)"), "%s", out);
    cr_assert(strstr(out, "[resource.cuda] type = cuda  (built in)"), "%s", out);
    /* the log is above the stats, which is above the device's resource */
    cr_assert_lt(strstr(out, "log adaptor"), strstr(out, "stats adaptor"));
    cr_assert_lt(strstr(out, "stats adaptor"), strstr(out, "[resource.cap]"));
    free(out);
    ps_config_free(cfg);
}

Test(config_env, every_resource_word_alone_gives_a_stack_that_builds)
{
    /* POOLSHIM_RESOURCE=X must work without any other setting: the GPU
     * suite runs each word as the shim's stack */
    const char *words[] = {"pool", "arena", "binning", "cuda", "async", "managed"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        char var[64];
        snprintf(var, sizeof var, "POOLSHIM_RESOURCE=%s", words[i]);
        char *env[] = {var, NULL};
        ps_config_t *cfg = load(NULL, NULL, env, PS_OK);
        ps_fake_gpu_options_t host = {.capacity = 64ull << 30};
        ps_gpu_ops_t *gpu = NULL;
        cr_assert_eq(ps_fake_gpu_create(&host, &gpu), PS_OK);
        ps_stack_t *stack = NULL;
        cr_assert_eq(ps_config_build_stack(cfg, 0, gpu, &stack), PS_OK, "POOLSHIM_RESOURCE=%s", words[i]);
        void *p = NULL;
        cr_assert_eq(ps_allocate(stack->top, 1000, PS_STREAM_NONE, &p), PS_OK, "%s allocates", words[i]);
        cr_assert_eq(ps_deallocate(stack->top, p, 1000, PS_STREAM_NONE), PS_OK);
        ps_stack_destroy(stack);
        ps_fake_gpu_destroy(gpu);
        ps_config_free(cfg);
    }
}

Test(config_env, print_shows_the_host_pool_with_origins)
{
    const char *file = "[host]\nmin_chunk = 4MiB\n";
    char *env[] = {NULL};
    ps_config_t *cfg = load(file, "host.pending_wait_percent=25", env, PS_OK);
    char *out = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&out, &size);
    ps_config_print(cfg, m, 0);
    fclose(m);
    cr_assert(strstr(out, "\n[host]\n"), "%s", out);
    cr_assert(strstr(out, "min_chunk          = 4.00 MiB") && strstr(out, "(user.ini:2)"), "%s", out);
    cr_assert(strstr(out, "pending_wait_percent = 25") && strstr(out, "(POOLSHIM_OPTIONS item 1)"), "%s", out);
    cr_assert(strstr(out, "free_sync          = event              (default)"), "%s", out);
    cr_assert_lt(strstr(out, "[host]"), strstr(out, "[device.0]"), "[host] comes before the stack");
    free(out);
    ps_config_free(cfg);
}

Test(config_env, debug_keys_default_off_and_come_from_file_options_and_short_forms)
{
    char *none[] = {NULL};
    ps_config_t *cfg = load(NULL, NULL, none, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->debug.nvtx, 0, "nvtx is off by default");
    cr_assert_eq(ps_config_global(cfg)->debug.guard, 0, "guard is off by default");
    cr_assert_eq(ps_config_global(cfg)->debug.nvtx_ranges, 0, "nvtx_ranges is off by default");
    ps_config_free(cfg);

    cfg = load("[debug]\nnvtx_ranges = yes\n", NULL, none, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->debug.nvtx_ranges, 1, "nvtx_ranges from the file");
    cr_assert_eq(ps_config_global(cfg)->debug.nvtx, 0, "independent of nvtx");
    ps_config_free(cfg);

    cfg = load("[debug]\nnvtx = on\nguard = 4KiB\n", NULL, none, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->debug.nvtx, 1);
    cr_assert_eq(ps_config_global(cfg)->debug.guard, 4096);
    ps_config_free(cfg);

    cfg = load("[debug]\nnvtx = on\n", "debug.guard=256,debug.nvtx=off", none, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->debug.nvtx, 0, "POOLSHIM_OPTIONS beats the file");
    cr_assert_eq(ps_config_global(cfg)->debug.guard, 256);
    ps_config_free(cfg);

    char *env[] = {"POOLSHIM_NVTX=1", "POOLSHIM_GUARD=1KiB", "POOLSHIM_NVTX_RANGES=on", NULL};
    cfg = load("[debug]\nnvtx_ranges = off\n", "debug.guard=256", env, PS_OK);
    cr_assert_eq(ps_config_global(cfg)->debug.nvtx_ranges, 1, "POOLSHIM_NVTX_RANGES beats the file");
    cr_assert_eq(ps_config_global(cfg)->debug.nvtx, 1, "POOLSHIM_NVTX sets debug.nvtx");
    cr_assert_eq(ps_config_global(cfg)->debug.guard, 1024, "POOLSHIM_GUARD beats POOLSHIM_OPTIONS");
    char *out = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&out, &size);
    ps_config_print(cfg, m, 0);
    fclose(m);
    cr_assert(strstr(out, "\n[debug]\n"), "%s", out);
    cr_assert(strstr(out, "(POOLSHIM_NVTX)") && strstr(out, "(POOLSHIM_GUARD)"), "%s", out);
    cr_assert(strstr(out, "nvtx_ranges        = on") && strstr(out, "(POOLSHIM_NVTX_RANGES)"), "%s", out);
    free(out);
    ps_config_free(cfg);
}

Test(config_env, debug_guard_refuses_more_than_a_mebibyte_and_bad_short_forms)
{
    char *env[] = {"POOLSHIM_GUARD=2MiB", "POOLSHIM_NVTX=perhaps", NULL};
    ps_config_t *cfg = load(NULL, NULL, env, PS_ECONFIG);
    cr_assert(has_error(cfg, "bad value `2MiB` for `guard` in [debug]: larger than 1MiB"), "%s",
              ps_config_error(cfg, 0));
    cr_assert(has_error(cfg, "POOLSHIM_NVTX=perhaps: expected 1/0, true/false, yes/no or on/off"), "%s",
              ps_config_error(cfg, 0));
    ps_config_free(cfg);
}

/* A misspelled variable is not silently ignored: one warning each, naming
 * the closest known variable; the harness's and the tests' own variables,
 * and every other variable poolshim reads, are not warned about. */
Test(config_env, unknown_poolshim_variables_get_one_warning_with_the_closest_name)
{
    char *env[] = {"POOLSHIM_STAT=json", "POOLSHIM_VERBSE=2", "POOLSHIM_STATS=text", "POOLSHIM_TEST_ANYTHING=1",
                   "POOLSHIM_BUILD=b", "POOLSHIM_CLI=c", "POOLSHIM_TEST_DATA=d", "POOLSHIM_PRELOAD_PREFIX=",
                   "POOLSHIM_LIB=l", "POOLSHIM_CUPTI_LIB=l", "POOLSHIM_CUPTI_OUT=o", "POOLSHIM_SANITIZER=s",
                   "POOLSHIM_TRACE_LOOKUPS=0", "POOLSHIM_DISABLE=0", "POOLSHIM_CONFIG=", "POOLSHIM_FAULTS_SEED=1",
                   "NOT_POOLSHIM_STAT=1", "POOLSHIM_ZZZZZZZZZZZZZZZZZZZZ=1", NULL};
    ps_config_t *cfg = load(NULL, NULL, env, PS_OK);
    cr_assert_eq(ps_config_warning_count(cfg), 3, "three unknown variables");
    cr_expect_str_eq(ps_config_warning(cfg, 0),
                     "POOLSHIM_STAT: not a poolshim variable, ignored (did you mean POOLSHIM_STATS?)");
    cr_expect_str_eq(ps_config_warning(cfg, 1),
                     "POOLSHIM_VERBSE: not a poolshim variable, ignored (did you mean POOLSHIM_VERBOSE?)");
    cr_expect(strstr(ps_config_warning(cfg, 2), "POOLSHIM_ZZZZZZZZZZZZZZZZZZZZ: not a poolshim variable, ignored (did you mean POOLSHIM_"));
    char *out = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&out, &size);
    ps_config_print_warnings(cfg, m);
    fclose(m);
    cr_expect(strstr(out, "poolshim: warning: POOLSHIM_STAT: not a poolshim variable, ignored (did you mean POOLSHIM_STATS?)\n"),
              "%s", out);
    free(out);
    ps_config_free(cfg);
}

/* The off switch never makes the configuration invalid: an empty
 * POOLSHIM_DISABLE is no value (the shim stays on, no message); one that is
 * no boolean, in the environment or in a file, turns the shim off with one
 * warning naming where it came from. */
Test(config_env, disable_that_is_no_boolean_turns_the_shim_off_with_a_warning)
{
    char *empty[] = {"POOLSHIM_DISABLE=", NULL};
    ps_config_t *cfg = load(NULL, NULL, empty, PS_OK);
    cr_expect_eq(ps_config_global(cfg)->disable, 0, "empty: the shim stays on");
    cr_expect_eq(ps_config_warning_count(cfg), 0);
    ps_config_free(cfg);

    char *maybe[] = {"POOLSHIM_DISABLE=maybe", NULL};
    cfg = load(NULL, NULL, maybe, PS_OK);
    cr_expect_eq(ps_config_global(cfg)->disable, 1, "not a boolean: the shim goes out of the way");
    cr_assert_eq(ps_config_warning_count(cfg), 1);
    cr_expect_str_eq(ps_config_warning(cfg, 0),
                     "POOLSHIM_DISABLE=maybe: not one of 1/0, true/false, yes/no or on/off; taken as 1: every "
                     "call passes through to CUDA (0 keeps the shim on)");
    ps_config_free(cfg);

    char *none[] = {NULL};
    cfg = load("[global]\ndisable = perhaps\n", NULL, none, PS_OK);
    cr_expect_eq(ps_config_global(cfg)->disable, 1);
    cr_assert_eq(ps_config_warning_count(cfg), 1);
    cr_expect(strstr(ps_config_warning(cfg, 0), "user.ini:2: disable = perhaps: not one of 1/0"), "%s",
              ps_config_warning(cfg, 0));
    ps_config_free(cfg);
}

/* A size a user set prints as every other size does (the defaults beside
 * it, [global] and [host]): 1.00 GiB, 1000 B, 0 (no cap); a percentage
 * stays one. */
Test(config_env, print_shows_set_sizes_the_human_way)
{
    const char *file = "[resource.main]\ntype = pool\ninitial_size = 1000\nmaximum_size = 0\n"
                       "min_chunk = 16777216\nthread_cache = 1.5MiB\n[resource.cap]\ntype = limit\n"
                       "limit = 50%\nupstream = main\n[device.*]\nresource = cap\n";
    char *env[] = {NULL};
    ps_config_t *cfg = load(file, NULL, env, PS_OK);
    char *out = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&out, &size);
    ps_config_print(cfg, m, 0);
    fclose(m);
    cr_expect(strstr(out, "initial_size       = 1000 B "), "%s", out);
    cr_expect(strstr(out, "maximum_size       = 0 (no cap) "), "%s", out);
    cr_expect(strstr(out, "min_chunk          = 16.0 MiB "), "%s", out);
    cr_expect(strstr(out, "thread_cache       = 1.50 MiB "), "%s", out);
    cr_expect(strstr(out, "limit              = 50% "), "%s", out);
    free(out);
    ps_config_free(cfg);
}

/* No device has 256 TiB: 2^64 - 1 (a "no cap" that is not the key's 0) and
 * every size above 256 TiB is refused with the bound, in every section. */
Test(config_env, sizes_above_256_tib_are_refused)
{
    char *env[] = {NULL};
    ps_config_t *cfg = load("[resource.main]\ntype = pool\ninitial_size = 18446744073709551615\n"
                            "maximum_size = 256TiB\n", NULL, env, PS_ECONFIG);
    cr_expect_eq(ps_config_error_count(cfg), 1, "256TiB itself is allowed");
    expect_error(cfg, "user.ini:3: bad value `18446744073709551615` for `initial_size` in [resource.main]: too "
                      "large (at most 256TiB)");
    ps_config_free(cfg);
    cfg = load("[global]\ndirect_min_size = 257TiB\n[host]\nmaximum_size = 300TiB\n", NULL, env, PS_ECONFIG);
    expect_error(cfg, "`direct_min_size` in [global]: too large (at most 256TiB)");
    expect_error(cfg, "`maximum_size` in [host]: too large (at most 256TiB)");
    ps_config_free(cfg);
    cfg = load("[resource.b]\ntype = binning\nbins = 1KiB,300TiB\nfallback = main\n", NULL, env, PS_ECONFIG);
    expect_error(cfg, "bin 2 `300TiB`: too large (at most 256TiB)");
    ps_config_free(cfg);
}
