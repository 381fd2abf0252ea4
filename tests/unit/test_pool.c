/* The pool: allocation, alignment, splitting, coalescing, growth, limits,
 * upstream failures, trim, the OOM path, bad pointers. */
#include "pool_fixture.h"

#include <stdlib.h>
#include <string.h>

Test(pool, allocates_writable_memory_and_frees_it)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.free_sync = PS_FREE_SYNC_NONE;
    fixture_open(&f, 1, 0, &o);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, 1000, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 5000, PS_STREAM_NONE, &b), PS_OK);
    memset(a, 1, 1000);
    memset(b, 2, 5000);
    cr_assert_eq(((unsigned char *)a)[999], 1, "blocks do not overlap");
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_in_use, 1024 + 5120);
    cr_assert_eq(info.bytes_reserved, 2 * PS_MiB);
    cr_assert_eq(info.bytes_free, 2 * PS_MiB - 1024 - 5120);
    cr_assert_eq(ps_deallocate(f.pool, a, 1000, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, b, 5000, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_in_use, 0);
    cr_assert_eq(info.largest_free_block, 2 * PS_MiB, "everything coalesced back");
    fixture_close(&f);
}

Test(pool, zero_bytes_gets_unique_aligned_pointers)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    fixture_open(&f, 0, 0, &o);
    void *p[8];
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(ps_allocate(f.pool, 0, PS_STREAM_NONE, &p[i]), PS_OK);
        cr_assert_not_null(p[i]);
        cr_assert_eq((uintptr_t)p[i] % 256, 0);
        for (int j = 0; j < i; j++)
            cr_assert_neq(p[i], p[j]);
    }
    cr_assert_eq(fixture_info(f.pool).bytes_in_use, 8 * 256);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

static void check_alignment(size_t alignment)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.alignment = alignment;
    o.free_sync = PS_FREE_SYNC_NONE;
    fixture_open(&f, 0, 0, &o);
    srand(7);
    void *p[300];
    for (int i = 0; i < 300; i++) {
        size_t size = (size_t)rand() % (i % 3 ? 5000 : 3 * PS_MiB);
        cr_assert_eq(ps_allocate(f.pool, size, PS_STREAM_NONE, &p[i]), PS_OK);
        cr_assert_eq((uintptr_t)p[i] % alignment, 0, "pointer %p, alignment %zu", p[i], alignment);
        if (i % 4 == 3)
            cr_assert_eq(ps_deallocate(f.pool, p[i - 2], 0, PS_STREAM_NONE), PS_OK);
    }
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_in_use % alignment, 0);
    fixture_close(&f);
}

Test(pool, every_pointer_is_aligned_to_256) { check_alignment(256); }
Test(pool, every_pointer_is_aligned_to_4096) { check_alignment(4096); }

Test(pool, rejects_bad_options)
{
    ps_gpu_ops_t *gpu;
    ps_resource_t *up, *pool;
    cr_assert_eq(ps_fake_gpu_create(NULL, &gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create(NULL, gpu, &up), PS_OK);
    ps_pool_options_t o;
    ps_pool_options_default(&o);
    o.alignment = 128;
    ps_verbosity = -1; /* the refusals below print errors by design */
    cr_assert_eq(ps_pool_create("p", up, gpu, &o, &pool), PS_EINVAL);
    o.alignment = 768;
    cr_assert_eq(ps_pool_create("p", up, gpu, &o, &pool), PS_EINVAL);
    ps_pool_options_default(&o);
    cr_assert_eq(ps_pool_create("p", up, NULL, &o, &pool), PS_EINVAL, "event policy needs fences");
    o.free_sync = PS_FREE_SYNC_NONE;
    cr_assert_eq(ps_pool_create("p", up, NULL, &o, &pool), PS_OK);
    void *p;
    cr_assert_eq(ps_allocate(pool, 10, 0x100, &p), PS_EUNSUPPORTED, "stream-ordered needs fences");
    ps_destroy(pool);
    ps_destroy(up);
    ps_fake_gpu_destroy(gpu);
}

Test(pool, splits_a_chunk_and_hands_out_the_tail_next)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.initial_size = 32 * PS_MiB;
    fixture_open(&f, 0, 0, &o);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 300, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq((uintptr_t)b, (uintptr_t)a + PS_MiB);
    cr_assert_eq((uintptr_t)c, (uintptr_t)b + PS_MiB);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.upstream_allocs, 1, "served from the initial chunk");
    cr_assert_eq(info.largest_free_block, 30 * PS_MiB - 512);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool, coalesces_neighbours_on_free)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.free_sync = PS_FREE_SYNC_NONE;
    o.initial_size = 8 * PS_MiB;
    fixture_open(&f, 0, 0, &o);
    void *a, *b, *c, *d;
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 5 * PS_MiB, PS_STREAM_NONE, &d), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_free, 0);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, c, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(fixture_info(f.pool).largest_free_block, PS_MiB, "a and c are not neighbours");
    cr_assert_eq(ps_deallocate(f.pool, b, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(fixture_info(f.pool).largest_free_block, 3 * PS_MiB, "b merged with both neighbours");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    void *e;
    cr_assert_eq(ps_allocate(f.pool, 3 * PS_MiB, PS_STREAM_NONE, &e), PS_OK);
    cr_assert_eq(e, a, "the merged block is reusable whole");
    cr_assert_eq(fixture_info(f.pool).upstream_allocs, 1);
    fixture_close(&f);
}

Test(pool, grows_by_growth_percent_when_nothing_fits)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.initial_size = 64 * PS_MiB;
    o.growth_percent = 50;
    o.max_chunk = PS_GiB;
    fixture_open(&f, 0, 0, &o);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.upstream_allocs, 2);
    cr_assert_eq(info.bytes_reserved, 96 * PS_MiB, "growth step = 50%% of 64 MiB");
    cr_assert_eq(ps_allocate(f.pool, 100 * PS_MiB + 1, PS_STREAM_NONE, &c), PS_OK);
    info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_reserved, 198 * PS_MiB, "a big request gets its size rounded to 2 MiB");
    cr_assert_eq(info.peak_bytes_reserved, 198 * PS_MiB);
    cr_assert_neq((uintptr_t)c, (uintptr_t)b + PS_MiB, "blocks do not merge across chunks");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool, maximum_size_reached_returns_enomem_and_leaves_pool_unchanged)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.maximum_size = 8 * PS_MiB;
    fixture_open(&f, 0, 0, &o);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.pool, 3 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 3 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    ps_resource_info_t before = fixture_info(f.pool);
    cr_assert_eq(before.bytes_reserved, 8 * PS_MiB);
    c = (void *)0x1234;
    cr_assert_eq(ps_allocate(f.pool, 3 * PS_MiB, PS_STREAM_NONE, &c), PS_ENOMEM);
    cr_assert_eq(c, (void *)0x1234, "output untouched on failure");
    ps_resource_info_t after = fixture_info(f.pool);
    cr_assert_eq(after.bytes_in_use, before.bytes_in_use);
    cr_assert_eq(after.bytes_reserved, before.bytes_reserved);
    cr_assert_eq(after.bytes_free, before.bytes_free);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &c), PS_OK, "what fits still works");
    fixture_close(&f);
}

Test(pool, upstream_failure_retries_with_half_the_chunk)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.min_chunk = 32 * PS_MiB;
    fixture_open(&f, 0, 0, &o);
    ps_fake_gpu_inject_failure(f.gpu, 0, 2);
    void *a;
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 8 * PS_MiB, "32 and 16 MiB failed, 8 MiB worked");
    fixture_close(&f);
}

Test(pool, upstream_failures_at_random_points_leak_nothing)
{
    for (unsigned seed = 1; seed <= 40; seed++) {
        pool_fixture_t f;
        ps_pool_options_t o = small_pool_options();
        o.free_sync = seed % 2 ? PS_FREE_SYNC_NONE : PS_FREE_SYNC_EVENT;
        fixture_open(&f, 0, 256 * PS_MiB, &o);
        srand(seed);
        ps_fake_gpu_inject_failure(f.gpu, (uint64_t)rand() % 6, 1 + (uint64_t)rand() % 20);
        void *live[64] = {0};
        for (int step = 0; step < 400; step++) {
            int slot = rand() % 64;
            if (live[slot]) {
                cr_assert_eq(ps_deallocate(f.pool, live[slot], 0, PS_STREAM_NONE), PS_OK);
                live[slot] = NULL;
            } else {
                ps_resource_info_t before = fixture_info(f.pool);
                int status = ps_allocate(f.pool, 1 + (size_t)rand() % (6 * PS_MiB), PS_STREAM_NONE, &live[slot]);
                cr_assert(status == PS_OK || status == PS_ENOMEM, "seed %u: status %d", seed, status);
                if (status != PS_OK) {
                    cr_assert_null(live[slot]);
                    cr_assert_eq(fixture_info(f.pool).bytes_in_use, before.bytes_in_use);
                }
            }
            if (step % 50 == 0)
                cr_assert_eq(ps_pool_check(f.pool), PS_OK, "seed %u step %d", seed, step);
        }
        for (int slot = 0; slot < 64; slot++)
            if (live[slot])
                cr_assert_eq(ps_deallocate(f.pool, live[slot], 0, PS_STREAM_NONE), PS_OK);
        cr_assert_eq(ps_trim(f.pool), PS_OK);
        cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 0, "seed %u: trim gave everything back", seed);
        cr_assert_eq(ps_pool_check(f.pool), PS_OK);
        fixture_close(&f);
    }
}

Test(pool, trim_gives_back_every_wholly_free_chunk)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.min_chunk = o.max_chunk = 4 * PS_MiB;
    fixture_open(&f, 0, 0, &o);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.pool, 3 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 3 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 3 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 12 * PS_MiB);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, c, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 4 * PS_MiB, "only b's chunk stays");
    cr_assert_eq(info.bytes_reserved, 4 * PS_MiB);
    cr_assert_eq(info.upstream_frees, 2);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, b, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 0);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0);
    fixture_close(&f);
}

Test(pool, out_of_memory_trims_then_retries)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.free_sync = PS_FREE_SYNC_NONE;
    o.min_chunk = o.max_chunk = 32 * PS_MiB;
    fixture_open(&f, 0, 72 * PS_MiB, &o);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.pool, 20 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 20 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 64 * PS_MiB);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    /* 40 MiB fits no free block and only 8 MiB is left on the device:
     * the pool gives a's chunk back, then grows */
    cr_assert_eq(ps_allocate(f.pool, 40 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.upstream_frees, 1);
    cr_assert_eq(info.bytes_reserved, 72 * PS_MiB);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    void *d;
    cr_assert_eq(ps_allocate(f.pool, 40 * PS_MiB, PS_STREAM_NONE, &d), PS_ENOMEM);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool, bad_pointers_return_einval_and_change_nothing)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    fixture_open(&f, 0, 0, &o);
    void *a;
    int on_stack;
    cr_assert_eq(ps_allocate(f.pool, 4096, PS_STREAM_NONE, &a), PS_OK);
    ps_resource_info_t before = fixture_info(f.pool);
    cr_assert_eq(ps_deallocate(f.pool, &on_stack, 4, PS_STREAM_NONE), PS_EINVAL);
    cr_assert_eq(ps_deallocate(f.pool, (char *)a + 256, 0, PS_STREAM_NONE), PS_EINVAL, "interior pointer");
    cr_assert_eq(ps_deallocate(f.pool, NULL, 0, PS_STREAM_NONE), PS_EINVAL);
    ps_resource_info_t after = fixture_info(f.pool);
    cr_assert_eq(memcmp(&before, &after, sizeof before), 0);
    cr_assert_eq(ps_deallocate(f.pool, a, 4096, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 4096, PS_STREAM_NONE), PS_EINVAL, "double free");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool, initial_size_is_reserved_at_create_and_failure_is_reported)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.initial_size = 10 * PS_MiB;
    fixture_open(&f, 0, 0, &o);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 10 * PS_MiB);
    cr_assert_eq(fixture_info(f.pool).bytes_free, 10 * PS_MiB);
    ps_resource_t *second;
    o.initial_size = PS_GiB;
    ps_fake_gpu_inject_failure(f.gpu, 0, 1);
    cr_assert_eq(ps_pool_create("second", f.upstream, f.gpu, &o, &second), PS_ENOMEM);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 10 * PS_MiB);
    fixture_close(&f);
}
