/* The pool's free policies and stream-ordered lists, with fake fences. */
#include "pool_fixture.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define S1 ((ps_stream_t)0x1000)
#define S2 ((ps_stream_t)0x2000)

/* A pool whose one initial chunk is exactly `chunk` bytes. */
static void open_one_chunk(pool_fixture_t *f, ps_free_sync_t policy, size_t chunk, size_t capacity)
{
    ps_pool_options_t o = small_pool_options();
    o.free_sync = policy;
    o.initial_size = chunk;
    fixture_open(f, 0, capacity, &o);
}

Test(pool_epochs, event_block_is_not_reused_before_its_fence_completes)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 0);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 0, "a cudaFree records nothing");
    cr_assert_eq(fixture_info(f.pool).bytes_pending, 4 * PS_MiB);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_neq(b, a, "fence 1 is incomplete: the pool grows instead");
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 1, "the epoch was closed by one fence");
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 0, "no host wait while growth works");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, b, 0, PS_STREAM_NONE), PS_OK);
    ps_fake_gpu_complete_upto(f.gpu, 1);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(c, a, "fence 1 completed: a's block is reused");
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_pending, 4 * PS_MiB, "b still waits");
    cr_assert_eq(info.upstream_allocs, 2);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_epochs, pending_block_does_not_coalesce_with_free_neighbours)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 0);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, b, 0, PS_STREAM_NONE), PS_OK);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.largest_free_block, 2 * PS_MiB, "only the untouched tail is free");
    cr_assert_eq(info.bytes_pending, 2 * PS_MiB);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_epochs, auto_completed_fence_is_reused_without_growing)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 0);
    ps_fake_gpu_set_auto_complete(f.gpu, 1);
    for (int i = 0; i < 100; i++) {
        void *a;
        cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
        cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    }
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.upstream_allocs, 1);
    cr_assert_eq(info.fences_recorded, 99, "one fence per epoch closed");
    fixture_close(&f);
}

Test(pool_epochs, device_policy_synchronizes_at_free_and_reuses_at_once)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_DEVICE, 4 * PS_MiB, 0);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 1);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(b, a);
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 0);
    fixture_close(&f);
}

Test(pool_epochs, none_policy_reuses_at_once)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_NONE, 4 * PS_MiB, 0);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(b, a);
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu) + ps_fake_gpu_device_syncs(f.gpu), 0);
    fixture_close(&f);
}

Test(pool_epochs, memory_pressure_waits_the_oldest_epoch_instead_of_failing)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 4 * PS_MiB);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(b, a);
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 1, "the device is full: the host waited");
    cr_assert_eq(fixture_info(f.pool).fence_waits, 1);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_epochs, per_thread_default_stream_takes_the_epoch_path)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 0);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_PER_THREAD, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_PER_THREAD), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_pending, 4 * PS_MiB);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_PER_THREAD, &b), PS_OK);
    cr_assert_neq(b, a, "another thread's per-thread stream may still use a");
    fixture_close(&f);
}

Test(pool_streams, same_stream_reuse_is_immediate_without_fence)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 0);
    void *a, *b;
    for (int i = 0; i < 10; i++) {
        cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, S1, &a), PS_OK);
        cr_assert_eq(ps_deallocate(f.pool, a, 0, S1), PS_OK);
        cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, S1, &b), PS_OK);
        cr_assert_eq(b, a);
        cr_assert_eq(ps_deallocate(f.pool, b, 0, S1), PS_OK);
    }
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 0);
    cr_assert_eq(ps_fake_gpu_stream_waits(f.gpu), 0);
    cr_assert_eq(fixture_info(f.pool).upstream_allocs, 1);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_streams, legacy_stream_handles_0_and_1_share_one_list)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 0);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, 0, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, 0), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_LEGACY, &b), PS_OK);
    cr_assert_eq(b, a);
    cr_assert_eq(ps_fake_gpu_stream_waits(f.gpu) + ps_fake_gpu_fences_recorded(f.gpu), 0);
    fixture_close(&f);
}

Test(pool_streams, cross_stream_take_records_a_fence_and_a_stream_wait)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 0);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, S1, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, S1), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, S2, &b), PS_OK);
    cr_assert_eq(b, a, "S2 takes S1's block without a host wait");
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 1);
    cr_assert_eq(ps_fake_gpu_stream_waits(f.gpu), 1);
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 0);
    cr_assert_eq(ps_deallocate(f.pool, b, 0, S2), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, S2, &b), PS_OK);
    cr_assert_eq(ps_fake_gpu_stream_waits(f.gpu), 1, "now S2's own block: no new wait");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_streams, destroyed_stream_blocks_wait_for_a_fence_then_become_ready)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 0);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, S1, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, S1), PS_OK);
    ps_stream_destroyed(f.pool, S1);
    uint64_t fences = ps_fake_gpu_fences_recorded(f.gpu);
    cr_assert_eq(fences, 1, "one fence retires the stream's list at the destroy");
    cr_assert_eq(fixture_info(f.pool).bytes_pending, 4 * PS_MiB, "its blocks are pending, not free");
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, S2, &b), PS_OK);
    cr_assert_neq(b, a, "S2 must not take a block of the dead stream before the fence");
    cr_assert_eq(ps_fake_gpu_stream_waits(f.gpu), 0, "nothing may wait on the dead stream");
    ps_fake_gpu_complete_all(f.gpu);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(c, a, "after the fence the block is ready for everyone");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_deallocate(f.pool, b, 0, S2);
    ps_deallocate(f.pool, c, 0, PS_STREAM_NONE);
    fixture_close(&f);
}

Test(pool_streams, stream_churn_recycles_owners)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    fixture_open(&f, 0, 0, &o);
    ps_fake_gpu_set_auto_complete(f.gpu, 1);
    for (uintptr_t i = 0; i < 70000; i++) { /* more streams than owner indices */
        ps_stream_t s = 0x10000 + i * 64;
        void *p;
        cr_assert_eq(ps_allocate(f.pool, 4096, s, &p), PS_OK, "stream %lu", (unsigned long)i);
        cr_assert_eq(ps_deallocate(f.pool, p, 4096, s), PS_OK);
        ps_stream_destroyed(f.pool, s);
    }
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_streams, cudamalloc_waits_for_a_fence_on_the_freeing_stream)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 0);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, S1, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, S1), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_neq(b, a, "the fence on S1 is incomplete");
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 1, "recorded lazily at the cudaMalloc");
    ps_fake_gpu_complete_all(f.gpu);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(c, a, "after the fence completed the block moved to the ready list");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_streams, block_freed_after_the_lazy_fence_is_not_covered_by_it)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 12 * PS_MiB, 0);
    void *a, *spacer, *b, *x, *y, *z;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, S1, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &spacer), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, S1, &b), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, S1), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 12 * PS_MiB, PS_STREAM_NONE, &x), PS_OK); /* records fence 1 on S1 */
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 1);
    cr_assert_eq(ps_deallocate(f.pool, b, 0, S1), PS_OK); /* after fence 1 */
    ps_fake_gpu_complete_upto(f.gpu, 1);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &y), PS_OK);
    cr_assert_eq(y, a, "a is covered by fence 1");
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &z), PS_OK);
    cr_assert_neq(z, b, "b was freed after fence 1 and its own fence is incomplete");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_streams, memory_pressure_merges_stream_lists)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 4 * PS_MiB);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.pool, 2 * PS_MiB, S1, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 2 * PS_MiB, S2, &b), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, S1), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, b, 0, S2), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(c, a, "both halves merged back into one block");
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 2);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_streams, stream_free_of_a_cudamalloc_block_is_reused_by_that_stream)
{
    pool_fixture_t f;
    open_one_chunk(&f, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 0);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, S1), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, S1, &b), PS_OK);
    cr_assert_eq(b, a);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, b, 0, S1), PS_OK);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 0, "trim waits stream lists and gives all back");
    fixture_close(&f);
}

/* ---- threads ------------------------------------------------------------ */

typedef struct thread_args {
    ps_resource_t *pool; /* shared pool */
    unsigned seed;       /* this thread's random seed */
    uint64_t tag;        /* written into every block it owns */
    int failures;        /* corrupted blocks seen */
} thread_args_t;

static void *random_worker(void *arg)
{
    thread_args_t *t = arg;
    void *live[32] = {0};
    size_t sizes[32] = {0};
    uint64_t end = ps_now_ns() + 700 * 1000000ull;
    ps_stream_t stream = (ps_stream_t)(0x10000 + t->tag * 0x100);
    while (ps_now_ns() < end) {
        for (int i = 0; i < 64; i++) {
            int slot = rand_r(&t->seed) % 32;
            ps_stream_t s = (slot & 1) ? stream : PS_STREAM_NONE;
            if (live[slot]) {
                uint64_t *words = live[slot];
                if (words[0] != t->tag || words[sizes[slot] / 8 - 1] != t->tag)
                    t->failures++;
                if (ps_deallocate(t->pool, live[slot], sizes[slot], s) != PS_OK)
                    t->failures++;
                live[slot] = NULL;
            } else {
                sizes[slot] = 8 * (1 + (size_t)rand_r(&t->seed) % 8192);
                if (ps_allocate(t->pool, sizes[slot], s, &live[slot]) != PS_OK) {
                    t->failures++;
                    continue;
                }
                uint64_t *words = live[slot];
                words[0] = words[sizes[slot] / 8 - 1] = t->tag;
            }
        }
    }
    for (int slot = 0; slot < 32; slot++)
        if (live[slot])
            ps_deallocate(t->pool, live[slot], sizes[slot], (slot & 1) ? stream : PS_STREAM_NONE);
    return NULL;
}

Test(pool_thread, eight_threads_allocate_and_free_at_random)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    fixture_open(&f, 1, 0, &o);
    ps_fake_gpu_set_auto_complete(f.gpu, 1);
    pthread_t threads[8];
    thread_args_t args[8];
    for (int i = 0; i < 8; i++) {
        args[i] = (thread_args_t){f.pool, 1234u + (unsigned)i, (uint64_t)i + 1, 0};
        cr_assert_eq(pthread_create(&threads[i], NULL, random_worker, &args[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(threads[i], NULL);
        cr_assert_eq(args[i].failures, 0, "thread %d saw %d failures (overlap or error)", i, args[i].failures);
    }
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_in_use, 0);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 0);
    fixture_close(&f);
}
