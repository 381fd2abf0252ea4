/* The pinned host stack ([host] and ps_config_build_host_stack): the pool
 * over pinned slabs, and the adaptors device stacks have, where [host]
 * asks for them: limit (`limit`), track (`track`, `stack_depth`), stats
 * (with global.stats), log (`log_file`). Built over the fake device
 * (tools/sim/fake_gpu, backed: the pinned memory is real host memory). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../config/config_internal.h"
#include "../../tools/sim/fake_gpu.h"

#define FLAGS (PS_HOST_ALLOC_PORTABLE | PS_HOST_ALLOC_MAPPED)

static ps_config_t *load(const char *text, const char *options, int expect)
{
    char *env[] = {NULL};
    ps_config_input_t in = {.options = options, .environ = env, .no_env = 1};
    ps_config_t *cfg = NULL;
    int rc = ps_config_load_text(text ? text : "", "user.ini", &in, &cfg);
    if (rc != expect)
        ps_config_print_errors(cfg, stderr);
    cr_assert_eq(rc, expect, "load returned %d", rc);
    cr_assert_not_null(cfg);
    return cfg;
}

static int has_error(const ps_config_t *cfg, const char *text)
{
    for (size_t i = 0; i < ps_config_error_count(cfg); i++)
        if (strstr(ps_config_error(cfg, i), text))
            return 1;
    return 0;
}

/* A fake device without virtual memory: pinned memory comes in slabs. */
static ps_gpu_ops_t *device(void)
{
    ps_fake_gpu_options_t o = {.backed = 1, .auto_complete = 1};
    ps_gpu_ops_t *gpu = NULL;
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    return gpu;
}

/* A fake device with virtual memory and host-located pieces (host_vm_map),
 * granularity 1 MiB: the default pinned stack is one host range. */
static ps_gpu_ops_t *vmm_device(void)
{
    ps_fake_gpu_options_t o = {.backed = 1, .auto_complete = 1, .virtual_memory = 1, .vm_granularity = PS_MiB};
    ps_gpu_ops_t *gpu = NULL;
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    return gpu;
}

/* The stack's resources from the top down, as "name<name<..." */
static void chain(const ps_stack_t *s, char *out, size_t size)
{
    out[0] = '\0';
    for (ps_resource_t *r = s->top; r; r = r->upstream) {
        size_t len = strlen(out);
        snprintf(out + len, size - len, "%s%s", len ? "<" : "", r->name);
    }
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot read %s", path);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    return text;
}

Test(host_stack, default_is_the_pool_alone)
{
    ps_config_t *cfg = load(NULL, NULL, PS_OK);
    ps_gpu_ops_t *gpu = device();
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_OK);
    char names[256];
    chain(s, names, sizeof names);
    cr_assert_str_eq(names, "host<pinned");
    cr_assert_null(s->stats);
    cr_assert_null(s->track);
    cr_assert_null(s->log);
    void *p = NULL;
    cr_assert_eq(ps_allocate(s->top, 1000, PS_STREAM_NONE, &p), PS_OK);
    memset(p, 1, 1000); /* pinned host memory: the host writes it */
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 2 * PS_MiB, "one slab of min_chunk");
    cr_assert_eq(ps_deallocate(s->top, p, 1000, PS_STREAM_NONE), PS_OK);
    ps_stack_destroy(s);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 0, "every slab given back");
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
}

Test(host_stack, every_adaptor_in_order_log_stats_track_limit_pool)
{
    char path[] = "/tmp/ps_host_log_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    char options[256];
    snprintf(options, sizeof options, "host.limit=4MiB,host.track=yes,global.stats=json,host.log_file=%s", path);
    ps_config_t *cfg = load(NULL, options, PS_OK);
    ps_gpu_ops_t *gpu = device();
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_OK);
    char names[256];
    chain(s, names, sizeof names);
    cr_assert_str_eq(names, "host.log<host.stats<host.track<host.limit<host<pinned");
    cr_assert_eq(s->log, s->top);
    cr_assert_str_eq(s->stats->name, "host.stats");
    cr_assert_str_eq(s->track->name, "host.track");
    ps_stack_destroy(s);
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
    unlink(path);
}

Test(host_stack, limit_refuses_past_it_and_takes_freed_bytes_back)
{
    ps_config_t *cfg = load("[host]\nlimit = 3MiB\n", "global.stats=text", PS_OK);
    ps_gpu_ops_t *gpu = device();
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_OK);
    void *a = NULL, *b = NULL, *c = NULL;
    cr_assert_eq(ps_allocate(s->top, 2 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(s->top, 1 * PS_MiB, PS_STREAM_NONE, &b), PS_OK, "exactly the limit fits");
    cr_assert_eq(ps_allocate(s->top, 1, PS_STREAM_NONE, &c), PS_ENOMEM, "one byte past the limit");
    ps_stats_t st;
    ps_stats_get(s->stats, &st);
    cr_assert_eq(st.failures, 1, "the stats adaptor counts the refusal");
    cr_assert_eq(st.allocations.peak, 2);
    cr_assert_eq(st.bytes_requested.peak, (int64_t)(3 * PS_MiB));
    cr_assert_eq(ps_deallocate(s->top, a, 2 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(s->top, 2 * PS_MiB, PS_STREAM_NONE, &c), PS_OK, "freed bytes count again");
    cr_assert_eq(ps_deallocate(s->top, b, 1 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(s->top, c, 2 * PS_MiB, PS_STREAM_NONE), PS_OK);
    ps_stack_destroy(s);
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
}

Test(host_stack, track_reports_pinned_leaks_by_name)
{
    ps_config_t *cfg = load("[host]\ntrack = yes\nstack_depth = 4\n", NULL, PS_OK);
    ps_gpu_ops_t *gpu = device();
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_OK);
    cr_assert_not_null(s->track);
    void *kept = NULL, *freed = NULL;
    cr_assert_eq(ps_allocate(s->top, 4096, PS_STREAM_NONE, &kept), PS_OK);
    cr_assert_eq(ps_allocate(s->top, 8192, PS_STREAM_NONE, &freed), PS_OK);
    cr_assert_eq(ps_deallocate(s->top, freed, 8192, PS_STREAM_NONE), PS_OK);
    char *out = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&out, &size);
    cr_assert_eq(ps_track_report(s->track, m), 1, "one pinned block never freed");
    fclose(m);
    cr_assert(strstr(out, "track 'host.track': 1 allocation (4.00 KiB) never freed"), "%s", out);
    free(out);
    cr_assert_eq(ps_deallocate(s->top, kept, 4096, PS_STREAM_NONE), PS_OK);
    m = open_memstream(&out, &size);
    cr_assert_eq(ps_track_report(s->track, m), 0);
    fclose(m);
    cr_assert(strstr(out, "track 'host.track': no leaks"), "%s", out);
    free(out);
    ps_stack_destroy(s);
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
}

Test(host_stack, log_writes_rmm_csv_one_file_per_device)
{
    char dir[] = "/tmp/ps_host_logs_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char options[256];
    snprintf(options, sizeof options, "host.log_file=%s/pinned.csv", dir);
    ps_config_t *cfg = load(NULL, options, PS_OK);
    ps_gpu_ops_t *gpu = device();
    for (int d = 0; d < 2; d++) {
        ps_stack_t *s = NULL;
        cr_assert_eq(ps_config_build_host_stack(cfg, d, gpu, FLAGS, NULL, &s), PS_OK);
        void *p = NULL;
        cr_assert_eq(ps_allocate(s->top, 12345 + (size_t)d, PS_STREAM_NONE, &p), PS_OK);
        cr_assert_eq(ps_deallocate(s->top, p, 12345 + (size_t)d, PS_STREAM_NONE), PS_OK);
        cr_assert_eq(ps_log_flush(s->log), PS_OK);
        char path[512], want[128];
        snprintf(path, sizeof path, d ? "%s/pinned.csv.1" : "%s/pinned.csv", dir);
        const char *text = slurp(path);
        cr_assert(strncmp(text, "Thread,Time,Action,Pointer,Size,Stream\n", 39) == 0, "%s", text);
        snprintf(want, sizeof want, ",allocate,%p,%d,0x0\n", p, 12345 + d);
        cr_assert(strstr(text, want), "device %d: no `%s` in\n%s", d, want, text);
        snprintf(want, sizeof want, ",free,%p,%d,0x0\n", p, 12345 + d);
        cr_assert(strstr(text, want), "device %d: no `%s` in\n%s", d, want, text);
        ps_stack_destroy(s);
        unlink(path);
    }
    rmdir(dir);
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
}

Test(host_stack, unopenable_log_fails_the_build_and_leaks_nothing)
{
    ps_config_t *cfg = load(NULL, "host.log_file=/nonexistent-dir/x/pinned.csv", PS_OK);
    ps_gpu_ops_t *gpu = device();
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_ECONFIG);
    cr_assert_null(s);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 0);
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
}

Test(host_stack, callers_pool_options_win_over_host_section)
{
    ps_config_t *cfg = load("[host]\nmin_chunk = 16MiB\n", NULL, PS_OK);
    ps_gpu_ops_t *gpu = device();
    ps_pool_options_t o;
    ps_host_pool_options(&ps_config_global(cfg)->host, &o);
    cr_assert_eq(o.min_chunk, 16 * PS_MiB);
    o.min_chunk = 2 * PS_MiB;
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, &o, &s), PS_OK);
    void *p = NULL;
    cr_assert_eq(ps_allocate(s->top, 100, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 2 * PS_MiB);
    cr_assert_eq(ps_deallocate(s->top, p, 100, PS_STREAM_NONE), PS_OK);
    ps_stack_destroy(s);
    ps_config_free(cfg);
    cfg = load("[host]\nmin_chunk = 16MiB\n", NULL, PS_OK);
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_OK);
    cr_assert_eq(ps_allocate(s->top, 100, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 16 * PS_MiB, "[host] min_chunk without options");
    cr_assert_eq(ps_deallocate(s->top, p, 100, PS_STREAM_NONE), PS_OK);
    ps_stack_destroy(s);
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
}

Test(host_stack, bad_adaptor_keys_are_errors)
{
    ps_config_t *cfg = load("[host]\nlimit = lots\ntrack = maybe\nstack_depth = 65\nlog_file = a%q.csv\n", NULL,
                            PS_ECONFIG);
    cr_assert(has_error(cfg, "user.ini:2: bad value `lots` for `limit` in [host]"), "limit");
    cr_assert(has_error(cfg, "user.ini:3: bad value `maybe` for `track` in [host]: not a boolean"), "track");
    cr_assert(has_error(cfg, "user.ini:4: bad value `65` for `stack_depth` in [host]"), "stack_depth");
    cr_assert(has_error(cfg, "user.ini:5: bad value `a%q.csv` for `log_file` in [host]"), "log_file");
    ps_gpu_ops_t *gpu = device();
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_ECONFIG, "no stack from errors");
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);

    cfg = load("[host]\nstack_depth = 8\n", NULL, PS_ECONFIG);
    cr_assert(has_error(cfg, "[host] stack_depth is set but track is off"));
    ps_config_free(cfg);

    cfg = load("[host]\nlimt = 1GiB\n", NULL, PS_ECONFIG);
    cr_assert(has_error(cfg, "unknown key `limt` in [host] (did you mean `limit`?)"));
    ps_config_free(cfg);
}

Test(host_stack, config_print_shows_the_adaptor_keys_with_origins)
{
    ps_config_t *cfg = load("[host]\ntrack = on\n", "host.limit=2GiB,host.log_file=pin_%p.csv", PS_OK);
    char *out = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&out, &size);
    ps_config_print(cfg, m, 0);
    fclose(m);
    cr_assert(strstr(out, "limit              = 2.00 GiB") && strstr(out, "(POOLSHIM_OPTIONS item 1)"), "%s", out);
    cr_assert(strstr(out, "track              = yes") && strstr(out, "(user.ini:2)"), "%s", out);
    cr_assert(strstr(out, "log_file           = pin_%p.csv") && strstr(out, "(POOLSHIM_OPTIONS item 2)"), "%s", out);
    cr_assert(strstr(out, "stack_depth        = 0"), "%s", out);
    free(out);
    ps_config_free(cfg);
}

/* host.expandable (default: auto): where the device table maps host
 * pieces (host_vm_map), the pool works on one host range of them; blocks
 * are real memory the host writes, and one block may span two pieces;
 * every piece is unmapped when the stack goes. */
Test(host_stack, default_pool_maps_host_pieces_of_one_range)
{
    ps_config_t *cfg = load("[host]\nexpandable_piece = 1MiB\n", NULL, PS_OK);
    ps_gpu_ops_t *gpu = vmm_device();
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_OK);
    cr_assert(ps_pool_is_expandable(s->top), "expandable without asking: the driver can");
    void *a = NULL, *b = NULL;
    cr_assert_eq(ps_allocate(s->top, 1536 * 1024, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(s->top, 3 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    memset(a, 1, 1536 * 1024); /* across the first piece's end */
    memset(b, 2, 3 * PS_MiB);
    cr_assert_eq((uintptr_t)b, (uintptr_t)a + 1536 * 1024, "the second block follows the first: one range");
    cr_assert_eq(ps_fake_gpu_host_vm_maps(gpu), 5, "1.5 + 3 MiB in host pieces of 1 MiB");
    cr_assert_eq(ps_fake_gpu_vm_maps(gpu), 5, "no device piece");
    cr_assert_eq(ps_fake_gpu_upstream_allocs(gpu), 0, "no cuMemHostAlloc slab");
    cr_assert_eq(ps_fake_gpu_calls(gpu, PS_FAKE_OP_HOST_ALLOC), 0, "no cuMemHostAlloc slab");
    cr_assert_eq(ps_fake_gpu_live_vm_ranges(gpu), 1, "one reserved range");
    cr_assert_eq(ps_deallocate(s->top, a, 1536 * 1024, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(s->top, b, 3 * PS_MiB, PS_STREAM_NONE), PS_OK);
    ps_stack_destroy(s);
    cr_assert_eq(ps_fake_gpu_host_vm_unmaps(gpu), 5, "every piece unmapped");
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 0);
    cr_assert_eq(ps_fake_gpu_live_vm_ranges(gpu), 0, "the range released");
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
}

/* host.expandable = 0 keeps slabs on a device that could map the range. */
Test(host_stack, expandable_off_keeps_slabs)
{
    ps_config_t *cfg = load("[host]\nexpandable = 0\n", NULL, PS_OK);
    ps_gpu_ops_t *gpu = vmm_device();
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_OK);
    cr_assert_not(ps_pool_is_expandable(s->top));
    void *p = NULL;
    cr_assert_eq(ps_allocate(s->top, 1000, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_fake_gpu_upstream_allocs(gpu), 1, "one slab");
    cr_assert_eq(ps_fake_gpu_host_vm_maps(gpu) + ps_fake_gpu_vm_maps(gpu), 0, "nothing mapped");
    cr_assert_eq(ps_deallocate(s->top, p, 1000, PS_STREAM_NONE), PS_OK);
    ps_stack_destroy(s);
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
}

/* Where the driver cannot map host pieces (no virtual memory, no host
 * location, or a host granularity the range's alignment does not cover),
 * the default and host.expandable = 1 both fall back to slabs; the device's
 * own vm_* never serve a pinned pool. */
static void expect_slabs(const char *ini, ps_gpu_ops_t *table, ps_gpu_ops_t *gpu)
{
    ps_config_t *cfg = load(ini, NULL, PS_OK);
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, table, FLAGS, NULL, &s), PS_OK);
    cr_assert_not(ps_pool_is_expandable(s->top), "%s", ini);
    void *p = NULL;
    cr_assert_eq(ps_allocate(s->top, 1000, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 2 * PS_MiB, "one slab of min_chunk (%s)", ini);
    cr_assert_eq(ps_fake_gpu_vm_maps(gpu), 0, "no piece mapped (%s)", ini);
    cr_assert_eq(ps_deallocate(s->top, p, 1000, PS_STREAM_NONE), PS_OK);
    ps_stack_destroy(s);
    ps_config_free(cfg);
}

Test(host_stack, without_host_pieces_the_pool_uses_slabs)
{
    const char *inis[] = {"", "[host]\nexpandable = yes\n"};
    for (int i = 0; i < 2; i++) {
        ps_gpu_ops_t *gpu = device(); /* no virtual memory */
        expect_slabs(inis[i], gpu, gpu);
        ps_fake_gpu_destroy(gpu);
        ps_fake_gpu_options_t o = {.backed = 1, .auto_complete = 1, .virtual_memory = 1, .no_host_vm = 1};
        cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK); /* device pieces only */
        expect_slabs(inis[i], gpu, gpu);
        ps_fake_gpu_destroy(gpu);
        o = (ps_fake_gpu_options_t){.backed = 1, .auto_complete = 1, .virtual_memory = 1,
                                    .vm_granularity = PS_MiB, .host_vm_granularity = 2 * PS_MiB};
        cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK); /* ranges aligned to less than a host piece */
        expect_slabs(inis[i], gpu, gpu);
        ps_fake_gpu_destroy(gpu);
    }
}

/* debug.nvtx with host.expandable unset keeps slabs (as device pools keep
 * chunks under it); asked for explicitly, the range is used. */
Test(host_stack, debug_nvtx_keeps_slabs_unless_asked)
{
    ps_gpu_ops_t *gpu = vmm_device();
    expect_slabs("[debug]\nnvtx = on\n", gpu, gpu);
    ps_config_t *cfg = load("[debug]\nnvtx = on\n[host]\nexpandable = yes\n", NULL, PS_OK);
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_OK);
    cr_assert(ps_pool_is_expandable(s->top));
    ps_stack_destroy(s);
    ps_config_free(cfg);
    ps_fake_gpu_destroy(gpu);
}

Test(host_stack, expandable_keys_parse_and_refuse_bad_values)
{
    ps_config_t *cfg = load("[host]\nexpandable = on\nexpandable_piece = 4MiB\ngrow_budget_percent = 120\n"
                            "grow_budget_min = 64MiB\n", NULL, PS_OK);
    const ps_host_config_t *h = &ps_config_global(cfg)->host;
    cr_assert_eq(h->expandable, 1);
    cr_assert_eq(h->expandable_piece, 4 * PS_MiB);
    cr_assert_eq(h->grow_budget_percent, 120);
    ps_pool_options_t o;
    ps_host_pool_options(h, &o);
    cr_assert_eq(o.expandable, 1);
    cr_assert_eq(o.expandable_piece, 4 * PS_MiB);
    cr_assert_eq(o.grow_budget_percent, 120);
    cr_assert_eq(o.grow_budget_min, 64 * PS_MiB);
    ps_config_free(cfg);
    cfg = load(NULL, NULL, PS_OK);
    h = &ps_config_global(cfg)->host;
    cr_assert_eq(h->expandable, -1, "auto by default: the range where the driver can");
    ps_host_pool_options(h, &o);
    cr_assert_eq(o.expandable, 1);
    cr_assert_eq(o.grow_budget_percent, 110, "the budget applies to the host range");
    cr_assert_eq(o.grow_budget_min, 16 * PS_MiB, "a floor of 16 MiB by default (host.grow_budget_min)");
    ps_config_free(cfg);
    cfg = load(NULL, "host.grow_budget_min=0", PS_OK);
    ps_host_pool_options(&ps_config_global(cfg)->host, &o);
    cr_assert_eq(o.grow_budget_min, 0, "0 turns the floor off");
    ps_config_free(cfg);
    cfg = load("[host]\nexpandable = off\n", NULL, PS_OK);
    h = &ps_config_global(cfg)->host;
    cr_assert_eq(h->expandable, 0);
    ps_host_pool_options(h, &o);
    cr_assert_eq(o.expandable, 0);
    cr_assert_eq(o.grow_budget_percent, 0, "the budget applies to the host range only");
    cr_assert_eq(o.grow_budget_min, 0, "and so does its floor");
    ps_config_free(cfg);
    cfg = load("[host]\nexpandable_piece = 100KiB\ngrow_budget_percent = 50\nexpandable = maybe\n"
               "grow_budget_min = lots\n", NULL, PS_ECONFIG);
    cr_assert(has_error(cfg, "bad value `lots` for `grow_budget_min` in [host]"));
    cr_assert(has_error(cfg, "bad value `100KiB` for `expandable_piece` in [host]"));
    cr_assert(has_error(cfg, "bad value `50` for `grow_budget_percent` in [host]"));
    cr_assert(has_error(cfg, "bad value `maybe` for `expandable` in [host]"));
    ps_config_free(cfg);
}

/* Host pieces the driver refuses (host_vm_map fails): one refusal is
 * retried (step e of core/pool.c), two fail the allocation with out of
 * memory; nothing stays mapped or reserved, and the next allocation works. */
Test(host_stack, refused_host_pieces_fail_cleanly)
{
    ps_config_t *cfg = load(NULL, NULL, PS_OK);
    ps_gpu_ops_t *gpu = vmm_device();
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_OK);
    cr_assert_eq(ps_fake_gpu_fail_call(gpu, PS_FAKE_OP_HOST_VM_MAP, 1, 0), PS_OK);
    void *p = NULL;
    cr_assert_eq(ps_allocate(s->top, 1000, PS_STREAM_NONE, &p), PS_OK, "the retry maps");
    cr_assert_eq(ps_deallocate(s->top, p, 1000, PS_STREAM_NONE), PS_OK);
    ps_stack_destroy(s);
    cr_assert_eq(ps_fake_gpu_host_vm_maps(gpu), 1);
    cr_assert_eq(ps_fake_gpu_host_vm_unmaps(gpu), 1);
    cr_assert_eq(ps_fake_gpu_live_vm_ranges(gpu), 0);
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_OK);
    cr_assert_eq(ps_fake_gpu_fail_call(gpu, PS_FAKE_OP_HOST_VM_MAP, 3, 0), PS_OK);
    cr_assert_eq(ps_fake_gpu_fail_call(gpu, PS_FAKE_OP_HOST_VM_MAP, 4, 0), PS_OK);
    cr_assert_eq(ps_allocate(s->top, 1000, PS_STREAM_NONE, &p), PS_ENOMEM);
    cr_assert_eq(ps_fake_gpu_host_vm_maps(gpu), 1);
    ps_resource_info_t info = {0};
    ps_query(s->top, &info);
    cr_assert_eq(info.bytes_reserved, 0);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 0);
    cr_assert_eq(ps_allocate(s->top, 1000, PS_STREAM_NONE, &p), PS_OK, "the next piece maps");
    memset(p, 3, 1000);
    cr_assert_eq(ps_fake_gpu_host_vm_maps(gpu), 2);
    cr_assert_eq(ps_deallocate(s->top, p, 1000, PS_STREAM_NONE), PS_OK);
    ps_stack_destroy(s);
    cr_assert_eq(ps_fake_gpu_host_vm_unmaps(gpu), 2);
    cr_assert_eq(ps_fake_gpu_live_vm_ranges(gpu), 0);
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
}

/* The decay on the default pinned stack (freed memory goes back):
 * host memory freed and not needed for the window is the system's again,
 * without any call from the program; a loop's working set stays. */
Test(host_stack, the_decay_gives_idle_pinned_memory_back)
{
    const uint64_t sec = 1000000000ull, decay = 4 * sec;
    ps_config_t *cfg = load("[host]\nexpandable_piece = 1MiB\n", NULL, PS_OK);
    ps_gpu_ops_t *gpu = vmm_device();
    ps_stack_t *s = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, FLAGS, NULL, &s), PS_OK);
    void *p[4];
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(ps_allocate(s->top, 3 * PS_MiB, PS_STREAM_NONE, &p[i]), PS_OK);
        memset(p[i], i, 3 * PS_MiB);
    }
    uint64_t given = 0;
    for (uint64_t t = sec; t <= 8 * sec; t += sec) /* a loop: the same blocks freed and taken again */
        for (int i = 0; i < 4; i++) {
            cr_assert_eq(ps_deallocate(s->top, p[i], 3 * PS_MiB, PS_STREAM_NONE), PS_OK);
            cr_assert_eq(ps_allocate(s->top, 3 * PS_MiB, PS_STREAM_NONE, &p[i]), PS_OK);
            given += ps_decay(s->top, t + (uint64_t)i, decay, 0);
        }
    cr_assert_eq(given, 0, "the loop's pinned memory stays");
    uint64_t unmaps = ps_fake_gpu_host_vm_unmaps(gpu);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ps_deallocate(s->top, p[i], 3 * PS_MiB, PS_STREAM_NONE), PS_OK);
    for (uint64_t t = 9 * sec; t <= 20 * sec; t += sec)
        given += ps_decay(s->top, t, decay, 0);
    cr_assert_geq(given, 12 * PS_MiB, "the idle pool gave its pinned memory back");
    cr_assert_gt(ps_fake_gpu_host_vm_unmaps(gpu), unmaps);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 0, "the system has it back");
    ps_stack_destroy(s);
    ps_fake_gpu_destroy(gpu);
    ps_config_free(cfg);
}
