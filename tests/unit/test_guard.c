/* The guard adaptor (debug.guard) over a pool on a host-memory device:
 * red zones filled at allocate, checked at free, an overwrite reported
 * with the block and its allocation site, the block freed either way. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../config/config_internal.h"
#include "../../core/adaptors.h"
#include "../../tools/sim/fake_gpu.h"
#include "../../core/pool.h"
#include "../../core/upstream.h"

typedef struct fixture {
    ps_gpu_ops_t *gpu;   /* host-memory device */
    ps_resource_t *up;   /* cuda upstream */
    ps_resource_t *pool; /* the suballocator */
} fixture_t;

static void open_fixture(fixture_t *f)
{
    ps_fake_gpu_options_t h = {.auto_complete = 1, .backed = 1};
    cr_assert_eq(ps_fake_gpu_create(&h, &f->gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f->gpu, &f->up), PS_OK);
    cr_assert_eq(ps_pool_create("main", f->up, f->gpu, NULL, &f->pool), PS_OK);
}

static void close_fixture(fixture_t *f)
{
    ps_destroy(f->pool);
    ps_destroy(f->up);
    ps_fake_gpu_destroy(f->gpu);
}

/* Runs `free` with messages going to a temporary file; returns its text. */
static char messages[16384];
static int free_capturing(ps_resource_t *r, void *p, size_t size, ps_stream_t stream)
{
    FILE *tmp = tmpfile();
    ps_message_set_fd(fileno(tmp));
    int rc = ps_deallocate(r, p, size, stream);
    ps_message_set_fd(2);
    rewind(tmp);
    size_t n = fread(messages, 1, sizeof messages - 1, tmp);
    messages[n] = 0;
    fclose(tmp);
    return rc;
}

Test(guard, clean_blocks_pass_and_the_zone_is_filled_after_each)
{
    fixture_t f;
    open_fixture(&f);
    ps_resource_t *g;
    cr_assert_eq(ps_guard_create("guard", f.pool, f.gpu, 64, NULL, &g), PS_OK);
    static const size_t sizes[] = {1, 255, 256, 1000, 4096, 100000};
    void *p[6];
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(ps_allocate(g, sizes[i], PS_STREAM_NONE, &p[i]), PS_OK);
        for (size_t k = 0; k < 64; k++)
            cr_assert_eq(((unsigned char *)p[i])[sizes[i] + k], PS_GUARD_BYTE, "block %d: red-zone byte %zu", i, k);
        memset(p[i], 0x11, sizes[i]); /* the whole block, not one byte more */
    }
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(free_capturing(g, p[i], sizes[i], PS_STREAM_NONE), PS_OK);
        cr_assert_eq(messages[0], 0, "nothing reported: %s", messages);
    }
    ps_guard_counts_t c;
    ps_guard_get(g, &c);
    cr_assert_eq(c.checked, 6);
    cr_assert_eq(c.overwritten, 0);
    ps_resource_info_t info = {0};
    ps_query(g, &info);
    cr_assert_eq(info.bytes_in_use, 0, "every block and its zone went back");
    ps_destroy(g);
    close_fixture(&f);
}

Test(guard, one_byte_past_the_end_is_reported_with_the_block_and_freed)
{
    fixture_t f;
    open_fixture(&f);
    ps_resource_t *g;
    cr_assert_eq(ps_guard_create("guard", f.pool, f.gpu, 64, NULL, &g), PS_OK);
    void *p, *q;
    cr_assert_eq(ps_allocate(g, 1000, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_allocate(g, 1000, PS_STREAM_NONE, &q), PS_OK);
    ((unsigned char *)p)[1000] = 0; /* one element past the end */
    ((unsigned char *)p)[1003] = 7;
    cr_assert_eq(free_capturing(g, p, 1000, PS_STREAM_NONE), PS_OK, "the free itself succeeds");
    char expected[256];
    snprintf(expected, sizeof expected,
             "poolshim: error: guard: block %p (1000 bytes, cudaMalloc): 2 of the 64 red-zone bytes after it were "
             "overwritten, the first at +0 past its end (block offset 1000) (a track adaptor",
             p);
    cr_assert(strstr(messages, expected), "expected\n%s\nin\n%s", expected, messages);
    cr_assert_eq(free_capturing(g, q, 1000, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(messages[0], 0, "the neighbour is clean: %s", messages);
    ps_guard_counts_t c;
    ps_guard_get(g, &c);
    cr_assert_eq(c.checked, 2);
    cr_assert_eq(c.overwritten, 1);
    /* the block is reusable and gets a fresh zone */
    void *again;
    cr_assert_eq(ps_allocate(g, 1000, PS_STREAM_NONE, &again), PS_OK);
    cr_assert_eq(free_capturing(g, again, 1000, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(messages[0], 0, "a reused block starts clean: %s", messages);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_destroy(g);
    close_fixture(&f);
}

Test(guard, stream_ordered_blocks_are_checked_on_their_stream)
{
    fixture_t f;
    open_fixture(&f);
    ps_resource_t *g;
    cr_assert_eq(ps_guard_create("guard", f.pool, f.gpu, 256, NULL, &g), PS_OK);
    void *p;
    const ps_stream_t s = (ps_stream_t)0x5000;
    cr_assert_eq(ps_allocate(g, 300, s, &p), PS_OK);
    ((unsigned char *)p)[300 + 255] = 0; /* the last byte of the zone */
    cr_assert_eq(free_capturing(g, p, 300, s), PS_OK);
    cr_assert(strstr(messages, "(300 bytes, stream 0x5000): 1 of the 256 red-zone bytes after it were overwritten, "
                               "the first at +255 past its end (block offset 555)"),
              "%s", messages);
    ps_destroy(g);
    close_fixture(&f);
}

/* Exported (and kept out of line) so dladdr can name it in the report. */
__attribute__((visibility("default"), noinline)) void *planted_overflow_site(ps_resource_t *r, size_t size)
{
    void *p = NULL;
    cr_assert_eq(ps_allocate(r, size, PS_STREAM_NONE, &p), PS_OK);
    __asm__ volatile("" ::: "memory"); /* not a tail call: keep this frame */
    return p;
}

Test(guard, a_track_adaptor_below_names_the_allocation_site)
{
    fixture_t f;
    open_fixture(&f);
    ps_resource_t *t, *g;
    cr_assert_eq(ps_track_create("track", f.pool, 8, &t), PS_OK);
    cr_assert_eq(ps_guard_create("guard", t, f.gpu, 32, t, &g), PS_OK);
    void *p = planted_overflow_site(g, 512);
    ((unsigned char *)p)[512] = 0;
    cr_assert_eq(free_capturing(g, p, 512, PS_STREAM_NONE), PS_OK);
    cr_assert(strstr(messages, "(512 bytes, cudaMalloc): 1 of the 32 red-zone bytes"), "%s", messages);
    cr_assert(strstr(messages, "allocated at:\n    #0 planted_overflow_site+0x"), "%s", messages);
    FILE *tmp = tmpfile();
    cr_assert_eq(ps_track_report(t, tmp), 0, "the block was freed after the report");
    fclose(tmp);
    ps_destroy(g);
    ps_destroy(t);
    close_fixture(&f);
}

Test(guard, refused_without_a_way_to_fill_and_read_device_memory)
{
    ps_fake_gpu_options_t h = {.auto_complete = 1}; /* simulated addresses: nothing to read */
    ps_gpu_ops_t *gpu;
    cr_assert_eq(ps_fake_gpu_create(&h, &gpu), PS_OK);
    ps_resource_t *up, *g = NULL;
    cr_assert_eq(ps_cuda_resource_create("cuda", gpu, &up), PS_OK);
    cr_assert_eq(ps_guard_create("guard", up, gpu, 64, NULL, &g), PS_EUNSUPPORTED);
    cr_assert_eq(ps_guard_create("guard", up, gpu, 0, NULL, &g), PS_EINVAL, "0 bytes is no guard");
    cr_assert_null(g);
    ps_destroy(up);
    ps_fake_gpu_destroy(gpu);
}

Test(guard, debug_guard_puts_the_guard_over_the_stack_under_stats)
{
    ps_fake_gpu_options_t h = {.auto_complete = 1, .backed = 1, .capacity = 1ull << 30};
    ps_gpu_ops_t *gpu;
    cr_assert_eq(ps_fake_gpu_create(&h, &gpu), PS_OK);
    ps_config_input_t in = {.no_env = 1, .options = ""};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load_text("[global]\nstats = text\n[debug]\nguard = 128\n"
                                     "[resource.t]\ntype = track\nupstream = main\nstack_depth = 4\n"
                                     "[device.*]\nresource = t\n",
                                     "guard.ini", &in, &cfg),
                 PS_OK);
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_stack(cfg, 0, gpu, &stack), PS_OK);
    cr_assert_str_eq(stack->top->ops->type_name, "stats");
    cr_assert_str_eq(stack->top->upstream->ops->type_name, "guard", "the guard sits under stats");
    cr_assert_str_eq(stack->top->upstream->upstream->ops->type_name, "track");
    void *p;
    cr_assert_eq(ps_allocate(stack->top, 2000, PS_STREAM_NONE, &p), PS_OK);
    ((unsigned char *)p)[2000 + 127] = 1;
    cr_assert_eq(free_capturing(stack->top, p, 2000, PS_STREAM_NONE), PS_OK);
    cr_assert(strstr(messages, "(2000 bytes, cudaMalloc): 1 of the 128 red-zone bytes"), "%s", messages);
    cr_assert(strstr(messages, "allocated at:\n"), "the config's track adaptor names the site: %s", messages);
    ps_stats_t st;
    ps_stats_get(stack->stats, &st);
    cr_assert_eq(st.bytes_requested.total, 2000, "stats above the guard count what the program asked");
    ps_stack_destroy(stack);
    ps_config_free(cfg);
    ps_fake_gpu_destroy(gpu);
}

Test(guard, a_fill_that_fails_fails_the_allocation_and_keeps_nothing)
{
    fixture_t f;
    open_fixture(&f);
    ps_resource_t *g;
    cr_assert_eq(ps_guard_create("guard", f.pool, f.gpu, 64, NULL, &g), PS_OK);
    ps_fake_gpu_fail_call(f.gpu, PS_FAKE_OP_MEMSET_D8, 1, PS_EUPSTREAM);
    void *p = NULL;
    cr_assert_eq(ps_allocate(g, 1000, PS_STREAM_NONE, &p), PS_EUPSTREAM, "the CUDA error reaches the caller");
    ps_resource_info_t info = {0};
    ps_query(g, &info);
    cr_assert_eq(info.bytes_in_use, 0, "the block went back to the pool");
    cr_assert_eq(ps_allocate(g, 1000, PS_STREAM_NONE, &p), PS_OK, "the next allocation works");
    /* a read-back that fails: the block is freed, counted unchecked, nothing reported */
    ps_fake_gpu_fail_call(f.gpu, PS_FAKE_OP_COPY_TO_HOST, 1, PS_EUPSTREAM);
    ((unsigned char *)p)[1000] = 0;
    cr_assert_eq(free_capturing(g, p, 1000, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(messages[0], 0, "%s", messages);
    ps_guard_counts_t c;
    ps_guard_get(g, &c);
    cr_assert_eq(c.unchecked, 1);
    cr_assert_eq(c.overwritten, 0);
    ps_query(g, &info);
    cr_assert_eq(info.bytes_in_use, 0);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_destroy(g);
    close_fixture(&f);
}
