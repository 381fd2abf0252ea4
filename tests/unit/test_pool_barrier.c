/* free_sync barrier: pending blocks become ready through a GPU-side barrier
 * instead of a fence the host polls, so a GPU that lags far behind the
 * host no longer makes the pool grow. The fake device's fences never
 * complete here unless a test says so: that is the lagging GPU. */
#include "pool_fixture.h"

#include <stdlib.h>

/* A pool with options `o` over a fake device; vm: 1 gives the device
 * virtual memory (the pool is then expandable). */
static void open_pool(pool_fixture_t *f, const ps_pool_options_t *o, int vm, size_t capacity)
{
    fixture_open_on(f, (ps_fake_gpu_options_t){.capacity = capacity, .virtual_memory = vm}, o);
}

/* The small test pool with free policy `policy` (fences never complete
 * unless a test says so: the lagging GPU). */
static void open_lagging(pool_fixture_t *f, ps_free_sync_t policy, int vm, size_t capacity)
{
    ps_pool_options_t o = small_pool_options();
    o.free_sync = policy;
    open_pool(f, &o, vm, capacity);
}

Test(pool_barrier, pending_block_is_reused_after_a_barrier_without_host_wait)
{
    pool_fixture_t f;
    open_lagging(&f, PS_FREE_SYNC_BARRIER, 0, 0);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), 0, "a cudaFree issues nothing");
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(b, a, "the barrier released a's block although its fence never completed");
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), 1);
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 0, "the host never waited");
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.upstream_allocs, 1, "no growth");
    cr_assert_eq(info.barriers, 1);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_deallocate(f.pool, b, 0, PS_STREAM_NONE);
    fixture_close(&f);
}

Test(pool_barrier, blocked_barrier_never_hands_out_a_pending_block)
{
    /* a stream capture is open: no barrier; the block stays pending and
     * the pool grows instead (negative control of the test above) */
    pool_fixture_t f;
    open_lagging(&f, PS_FREE_SYNC_BARRIER, 0, 0);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    ps_fake_gpu_block_barriers(f.gpu, 1);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_neq(b, a, "no barrier and no completed fence: a's block must stay pending");
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), 0);
    cr_assert_eq(fixture_info(f.pool).bytes_pending, 4 * PS_MiB);
    ps_fake_gpu_block_barriers(f.gpu, 0);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(c, a, "barriers possible again: the pending block is reused");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_deallocate(f.pool, b, 0, PS_STREAM_NONE);
    ps_deallocate(f.pool, c, 0, PS_STREAM_NONE);
    fixture_close(&f);
}

Test(pool_barrier, growth_merges_with_blocks_a_barrier_released)
{
    /* pending memory smaller than the request is still released before
     * growing, so the growth joins it instead of leaving it as a hole */
    pool_fixture_t f;
    open_lagging(&f, PS_FREE_SYNC_BARRIER, 1, 0);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), 1);
    cr_assert_eq(b, a, "the 64 MiB block starts where the released 1 MiB block was");
    cr_assert_eq(fixture_info(f.pool).peak_bytes_reserved, 64 * PS_MiB, "no hole was left behind");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_deallocate(f.pool, b, 0, PS_STREAM_NONE);
    fixture_close(&f);
}

/* 8 MiB allocated and freed (pending), then a 1 MiB allocation, which
 * fits anyway: the eager trigger's moment. Returns the 1 MiB block. */
static void *free_8_then_take_1(pool_fixture_t *f)
{
    void *big, *small;
    cr_assert_eq(ps_allocate(f->pool, 8 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    cr_assert_eq(ps_deallocate(f->pool, big, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(f->pool, PS_MiB, PS_STREAM_NONE, &small), PS_OK);
    return small;
}

Test(pool_barrier, pending_memory_above_the_threshold_is_released_early)
{
    /* barrier_pending_percent: an allocation that fits anyway still
     * issues a barrier once pending memory passes the threshold (while
     * barriers join busy streams; quiet ones: the test below) */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.barrier_pending_percent = 10;
    o.initial_size = 100 * PS_MiB;
    fixture_open_on(&f, (ps_fake_gpu_options_t){.virtual_memory = 1, .barrier_joins = 1}, &o);
    void *b = free_8_then_take_1(&f);
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), 0, "8 MiB pending of 100 MiB: below 10%%");
    void *c = free_8_then_take_1(&f);
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), 1, "16 MiB pending of 100 MiB: above 10%%, released");
    cr_assert_eq(fixture_info(f.pool).bytes_pending, 0);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_deallocate(f.pool, b, 0, PS_STREAM_NONE);
    ps_deallocate(f.pool, c, 0, PS_STREAM_NONE);
    fixture_close(&f);
}

/* The same loop while barriers join no busy stream (the fake's default, a
 * program on the legacy stream alone): a barrier costs an event record, and
 * memory freed since the last one cannot be reused, so the eager barrier
 * comes once the floor is pending, whatever its share of the reserve
 * (core/reuse.c, 6b; the transformer log: 4,694 piece maps -> 2,525). */
Test(pool_barrier, quiet_barriers_release_pending_memory_below_the_threshold)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.barrier_pending_percent = 10;
    o.initial_size = 100 * PS_MiB;
    open_pool(&f, &o, 1, 0);
    void *b = free_8_then_take_1(&f);
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), 1, "8 MiB pending of 100 MiB, quiet: released");
    cr_assert_eq(fixture_info(f.pool).bytes_pending, 0);
    ps_fake_gpu_set_barrier_joins(f.gpu, 1); /* the next barrier joins a busy stream */
    void *c = free_8_then_take_1(&f);
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), 2, "still quiet: the newest barrier joined nothing");
    void *a = free_8_then_take_1(&f);
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), 2, "the newest barrier joined one: 8 of 100 MiB waits for 10%%");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_deallocate(f.pool, a, 0, PS_STREAM_NONE);
    ps_deallocate(f.pool, b, 0, PS_STREAM_NONE);
    ps_deallocate(f.pool, c, 0, PS_STREAM_NONE);
    fixture_close(&f);
}

Test(pool_barrier, releases_other_streams_lists_too)
{
    pool_fixture_t f;
    open_lagging(&f, PS_FREE_SYNC_BARRIER, 0, 0);
    ps_stream_t s1 = (ps_stream_t)0x1000;
    void *a, *b;
    cr_assert_eq(ps_allocate(f.pool, 8 * PS_MiB, s1, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, s1), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 8 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(b, a, "a cudaMalloc takes s1's freed block after one barrier");
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), 1);
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 0);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_deallocate(f.pool, b, 0, PS_STREAM_NONE);
    fixture_close(&f);
}

/* A training-loop-like workload on a GPU that never catches up: every step
 * allocates tensors whose sizes scale with a random sequence length and
 * batch, frees them, and goes on. Returns peak reserved / peak requested. */
static double lagging_loop(ps_free_sync_t policy, int vm, uint64_t *barriers)
{
    pool_fixture_t f;
    open_lagging(&f, policy, vm, 0);
    srand(7);
    enum { LIVE = 48 };
    void *live[LIVE];
    size_t sizes[LIVE];
    uint64_t requested = 0, peak_requested = 0;
    for (int step = 0; step < 300; step++) {
        size_t scale = (size_t)(64 + rand() % 960) * (size_t)(4 + rand() % 28); /* seq x batch */
        int n = 8 + rand() % (LIVE - 8);
        for (int i = 0; i < n; i++) {
            sizes[i] = scale * (size_t)(256 + rand() % 4096);
            cr_assert_eq(ps_allocate(f.pool, sizes[i], PS_STREAM_NONE, &live[i]), PS_OK);
            requested += ps_align_up(sizes[i], 256);
            if (requested > peak_requested)
                peak_requested = requested;
        }
        for (int i = 0; i < n; i++) {
            cr_assert_eq(ps_deallocate(f.pool, live[i], sizes[i], PS_STREAM_NONE), PS_OK);
            requested -= ps_align_up(sizes[i], 256);
        }
    }
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_resource_info_t info = fixture_info(f.pool);
    *barriers = info.barriers;
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    fixture_close(&f);
    return (double)info.peak_bytes_reserved / (double)peak_requested;
}

Test(pool_barrier, lagging_gpu_keeps_reserved_close_to_requested)
{
    uint64_t barriers;
    double event = lagging_loop(PS_FREE_SYNC_EVENT, 1, &barriers);
    cr_assert_eq(barriers, 0);
    double chunked = lagging_loop(PS_FREE_SYNC_BARRIER, 0, &barriers);
    cr_assert_gt(barriers, 0);
    double expandable = lagging_loop(PS_FREE_SYNC_BARRIER, 1, &barriers);
    cr_log_info("lagging GPU, peak reserved / peak requested: event %.2fx, barrier+chunks %.2fx, "
                "barrier+expandable %.3fx", event, chunked, expandable);
    cr_assert_gt(event, 5.0, "the polled epoch grows without bound when the GPU lags (%.2fx)", event);
    cr_assert_leq(expandable, 1.10, "barrier + expandable: %.3fx", expandable);
    cr_assert_lt(chunked, event / 2, "the barrier alone already bounds growth (%.2fx)", chunked);
}

Test(pool_placement, small_requests_are_cut_from_the_back_large_from_the_front)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.small_from_back = PS_MiB;
    o.initial_size = 16 * PS_MiB;
    open_pool(&f, &o, 1, 0);
    void *large, *small, *exactly;
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &large), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 4096, PS_STREAM_NONE, &small), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &exactly), PS_OK);
    uintptr_t base = (uintptr_t)large;
    cr_assert_eq((uintptr_t)small, base + 16 * PS_MiB - 4096, "a small request comes off the back");
    cr_assert_eq((uintptr_t)exactly, base + 15 * PS_MiB - 4096, "small_from_back is inclusive");
    void *large2;
    cr_assert_eq(ps_allocate(f.pool, 2 * PS_MiB, PS_STREAM_NONE, &large2), PS_OK);
    cr_assert_eq((uintptr_t)large2, base + 4 * PS_MiB, "a large request comes off the front");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_deallocate(f.pool, small, 0, PS_STREAM_NONE);
    ps_deallocate(f.pool, exactly, 0, PS_STREAM_NONE);
    ps_deallocate(f.pool, large, 0, PS_STREAM_NONE);
    ps_deallocate(f.pool, large2, 0, PS_STREAM_NONE);
    ps_trim(f.pool);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

/* ---- the expandable pool (virtual memory) ------------------------------ */

Test(pool_expandable, trim_unmaps_free_pieces_in_the_middle_and_growth_maps_them_again)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    open_pool(&f, &o, 1, 0);
    cr_assert(ps_pool_is_expandable(f.pool));
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.pool, 8 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 8 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 8 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq((uintptr_t)b, (uintptr_t)a + 8 * PS_MiB, "one range: blocks follow each other");
    cr_assert_eq(ps_deallocate(f.pool, b, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 16 * PS_MiB, "the middle 8 MiB were unmapped");
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 16 * PS_MiB);
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0, "the device was synchronized before unmapping");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    void *again;
    cr_assert_eq(ps_allocate(f.pool, 8 * PS_MiB, PS_STREAM_NONE, &again), PS_OK);
    cr_assert_eq(again, b, "the hole is mapped again rather than the range's end");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 24 * PS_MiB);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_deallocate(f.pool, a, 0, PS_STREAM_NONE);
    ps_deallocate(f.pool, again, 0, PS_STREAM_NONE);
    ps_deallocate(f.pool, c, 0, PS_STREAM_NONE);
    fixture_close(&f);
}

Test(pool_expandable, holes_join_for_one_big_block_where_chunks_cannot)
{
    /* fill a 64 MiB device with 8 MiB blocks, free every other one, ask for
     * 24 MiB: no hole is that big, and the device is full. The expandable
     * pool unmaps the free pieces and maps them where the block goes; the
     * chunked pool must fail (its chunks never merge). */
    for (int vm = 1; vm >= 0; vm--) {
        pool_fixture_t f;
        ps_pool_options_t o = small_pool_options();
        o.min_chunk = 16 * PS_MiB; /* chunks: two blocks each, so no chunk ever empties */
        o.max_chunk = 16 * PS_MiB;
        open_pool(&f, &o, vm, 64 * PS_MiB);
        void *blocks[8];
        int filled = 0;
        while (filled < 8 && ps_allocate(f.pool, 8 * PS_MiB, PS_STREAM_NONE, &blocks[filled]) == PS_OK)
            filled++;
        cr_assert_eq(filled, 8, "vm %d: the device holds 8 blocks of 8 MiB", vm);
        for (int i = 0; i < 8; i += 2)
            cr_assert_eq(ps_deallocate(f.pool, blocks[i], 0, PS_STREAM_NONE), PS_OK);
        void *big = NULL;
        int status = ps_allocate(f.pool, 24 * PS_MiB, PS_STREAM_NONE, &big);
        if (vm) {
            cr_assert_eq(status, PS_OK, "the expandable pool joins the holes");
            cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
            cr_assert_leq(ps_fake_gpu_bytes_outstanding(f.gpu), 64 * PS_MiB);
            cr_assert_eq(ps_deallocate(f.pool, big, 0, PS_STREAM_NONE), PS_OK);
        } else {
            cr_assert_eq(status, PS_ENOMEM, "chunks cannot merge: out of memory, pool unchanged");
        }
        cr_assert_eq(ps_pool_check(f.pool), PS_OK);
        for (int i = 1; i < 8; i += 2)
            cr_assert_eq(ps_deallocate(f.pool, blocks[i], 0, PS_STREAM_NONE), PS_OK);
        fixture_close(&f);
    }
}

Test(pool_expandable, device_synchronize_gives_back_memory_above_the_release_threshold)
{
    for (int vm = 1; vm >= 0; vm--) {
        for (int threshold_set = 0; threshold_set <= 1; threshold_set++) {
            pool_fixture_t f;
            ps_pool_options_t o = small_pool_options();
            o.min_chunk = o.max_chunk = 8 * PS_MiB; /* chunks: one block each */
            if (threshold_set)
                o.release_threshold = 8 * PS_MiB;
            open_pool(&f, &o, vm, 0);
            void *blocks[4];
            for (int i = 0; i < 4; i++)
                cr_assert_eq(ps_allocate(f.pool, 8 * PS_MiB, PS_STREAM_NONE, &blocks[i]), PS_OK);
            for (int i = 0; i < 3; i++) /* pending: the fake GPU lags */
                cr_assert_eq(ps_deallocate(f.pool, blocks[i], 0, PS_STREAM_NONE), PS_OK);
            cr_assert_eq(fixture_info(f.pool).bytes_reserved, 32 * PS_MiB);
            ps_device_synchronized(f.pool);
            ps_resource_info_t info = fixture_info(f.pool);
            if (threshold_set) {
                cr_assert_eq(info.bytes_reserved, 8 * PS_MiB, "vm %d: down to the threshold", vm);
                cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 8 * PS_MiB);
            } else {
                cr_assert_eq(info.bytes_reserved, 32 * PS_MiB, "vm %d: no threshold, nothing given back", vm);
            }
            cr_assert_eq(info.bytes_in_use, 8 * PS_MiB);
            cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0, "the device was synchronized before unmapping");
            cr_assert_eq(ps_pool_check(f.pool), PS_OK);
            void *again; /* memory given back is taken again when needed */
            cr_assert_eq(ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &again), PS_OK);
            cr_assert_eq(ps_deallocate(f.pool, again, 0, PS_STREAM_NONE), PS_OK);
            cr_assert_eq(ps_deallocate(f.pool, blocks[3], 0, PS_STREAM_NONE), PS_OK);
            cr_assert_eq(ps_pool_check(f.pool), PS_OK);
            fixture_close(&f);
        }
    }
}

/* A pool on the virtual-memory fake with the default options but no thread
 * caches (the pool itself), 2 MiB pieces and `barrier_floor`; *o gets its options. */
static void open_pool_alone(pool_fixture_t *f, ps_pool_options_t *o, uint64_t barrier_floor)
{
    ps_pool_options_default(o);
    o->thread_cache = 0;
    o->barrier_floor = barrier_floor;
    o->expandable_piece = 2 * PS_MiB; /* the sizes the tests check are counted in 2 MiB pieces */
    open_pool(f, o, 1, 0);
}

/* The barrier floor (options.barrier_floor): a small program that frees
 * and takes back 1 MiB blocks pays one barrier per many pairs (the pool
 * grows up to the floor instead of issuing one per pair or two), and no
 * block is handed out again before a barrier issued after its free. */
static void floor_loop(uint64_t floor, int pairs, uint64_t *barriers, uint64_t *reserved_peak)
{
    pool_fixture_t f;
    ps_pool_options_t o;
    open_pool_alone(&f, &o, floor);
    enum { SEEN = 256 };
    uintptr_t freed_addr[SEEN] = {0};
    uint64_t freed_at[SEEN] = {0}; /* barriers issued when it was freed */
    for (int k = 0; k < pairs; k++) {
        void *p;
        cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &p), PS_OK);
        for (int i = 0; i < SEEN; i++)
            if (freed_addr[i] == (uintptr_t)p) {
                cr_assert_gt(ps_fake_gpu_barriers(f.gpu), freed_at[i],
                             "pair %d: a block came back without a barrier issued after its free", k);
                freed_addr[i] = 0;
            }
        int slot = 0;
        while (slot < SEEN && freed_addr[slot])
            slot++;
        cr_assert_lt(slot, SEEN);
        freed_addr[slot] = (uintptr_t)p;
        freed_at[slot] = ps_fake_gpu_barriers(f.gpu);
        cr_assert_eq(ps_deallocate(f.pool, p, PS_MiB, PS_STREAM_NONE), PS_OK);
    }
    *barriers = ps_fake_gpu_barriers(f.gpu);
    *reserved_peak = fixture_info(f.pool).peak_bytes_reserved;
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_barrier, below_the_barrier_floor_a_free_and_take_loop_pays_one_barrier_per_many_pairs)
{
    const int pairs = 2000;
    uint64_t barriers, peak;
    floor_loop(32 * PS_MiB, pairs, &barriers, &peak);
    cr_log_info("floor 32 MiB: %llu barriers for %d pairs, peak reserved %llu MiB", (unsigned long long)barriers,
                pairs, (unsigned long long)(peak >> 20));
    /* the eager barrier waits for the whole floor pending: one per ~32 pairs */
    cr_assert_leq(barriers * 24, (uint64_t)pairs, "%llu barriers for %d pairs", (unsigned long long)barriers, pairs);
    cr_assert_leq(peak, 34 * PS_MiB, "the floor bounds the growth: %llu", (unsigned long long)peak);
    floor_loop(0, pairs, &barriers, &peak); /* without it: one barrier per pair or two */
    cr_log_info("floor 0: %llu barriers for %d pairs, peak reserved %llu MiB", (unsigned long long)barriers, pairs,
                (unsigned long long)(peak >> 20));
    cr_assert_geq(barriers * 3, (uint64_t)pairs, "floor 0: %llu barriers for %d pairs", (unsigned long long)barriers, pairs);
    cr_assert_leq(peak, 4 * PS_MiB);
}

/* The size stack (core/pool_caches.c): in a pool of at most twice the floor, the
 * blocks one barrier releases stay unmerged, and a request of exactly their
 * size takes the newest of them; a request of another size first merges
 * them back. No block comes back before a barrier issued after its free
 * (the judge of floor_loop, which this path also serves). */
/* A barrier in a pool at the floor releases the floor's worth of one size
 * (32 MiB of 64 KiB blocks: 512): all of them wait on the size stack, so a
 * loop of pairs never merges a block only to split it again (with 64 places
 * the other 448 were merged and cut again: 1213 instructions per 64 KiB pair
 * under callgrind, against 856). */
Test(pool_barrier, size_stack_holds_every_block_a_floor_sized_barrier_releases)
{
    pool_fixture_t f;
    ps_pool_options_t o;
    ps_pool_options_default(&o);
    o.thread_cache = 0;
    open_pool(&f, &o, 1, 0);
    enum { N = 512 };
    static void *first[N], *again[N];
    for (int i = 0; i < N; i++)
        cr_assert_eq(ps_allocate(f.pool, 64 * 1024, PS_STREAM_NONE, &first[i]), PS_OK);
    for (int i = 0; i < N; i++)
        cr_assert_eq(ps_deallocate(f.pool, first[i], 64 * 1024, PS_STREAM_NONE), PS_OK);
    uint64_t barriers = ps_fake_gpu_barriers(f.gpu);
    for (int i = 0; i < N; i++)
        cr_assert_eq(ps_allocate(f.pool, 64 * 1024, PS_STREAM_NONE, &again[i]), PS_OK);
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), barriers + 1, "one barrier released all of them");
    for (int i = 0; i < N; i++)
        cr_assert_eq(again[i], first[N - 1 - i], "allocation %d: the newest released block (the stack)", i);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    for (int i = 0; i < N; i++)
        ps_deallocate(f.pool, again[i], 64 * 1024, PS_STREAM_NONE);
    fixture_close(&f);
}

/* Above twice the floor (a held block), released blocks of at most
 * small_from_back still join the size stack (a loop of small temporary
 * blocks beside a loaded model: no merge and split per pair); bigger ones
 * merge into the lists as before. */
static void cycle_beside_a_held_block(size_t size, int expect_stack)
{
    pool_fixture_t f;
    ps_pool_options_t o;
    open_pool_alone(&f, &o, 8 * PS_MiB);
    void *held;
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &held), PS_OK);
    enum { N = 4 };
    void *first[N], *again[N];
    for (int i = 0; i < N; i++)
        cr_assert_eq(ps_allocate(f.pool, size, PS_STREAM_NONE, &first[i]), PS_OK);
    for (int i = 0; i < N; i++)
        cr_assert_eq(ps_deallocate(f.pool, first[i], size, PS_STREAM_NONE), PS_OK);
    /* the free room taken, so that the next allocation misses and its barrier releases them */
    void *filler = NULL;
    size_t room = fixture_info(f.pool).largest_free_block;
    if (room)
        cr_assert_eq(ps_allocate(f.pool, room, PS_STREAM_NONE, &filler), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_free, 0, "no free room left");
    cr_assert_gt(fixture_info(f.pool).bytes_reserved, 2 * o.barrier_floor);
    uint64_t barriers = ps_fake_gpu_barriers(f.gpu);
    int reversed = 1;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(ps_allocate(f.pool, size, PS_STREAM_NONE, &again[i]), PS_OK);
        reversed &= again[i] == first[N - 1 - i];
        cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    }
    cr_expect_eq(ps_fake_gpu_barriers(f.gpu), barriers + 1, "one barrier released them");
    cr_expect_eq(reversed, expect_stack, "%zu-byte blocks: %s", size,
                 expect_stack ? "the newest released first (the stack)" : "merged, not stacked");
    for (int i = 0; i < N; i++)
        ps_deallocate(f.pool, again[i], size, PS_STREAM_NONE);
    if (filler)
        ps_deallocate(f.pool, filler, room, PS_STREAM_NONE);
    ps_deallocate(f.pool, held, 64 * PS_MiB, PS_STREAM_NONE);
    fixture_close(&f);
}
Test(pool_barrier, small_blocks_join_the_size_stack_in_a_pool_of_any_size)
{
    cycle_beside_a_held_block(64 * 1024, 1);
    cycle_beside_a_held_block(PS_MiB, 1);
    cycle_beside_a_held_block(2 * PS_MiB, 0);
}

Test(pool_barrier, released_blocks_of_one_size_come_back_from_the_size_stack_after_a_barrier_only)
{
    pool_fixture_t f;
    ps_pool_options_t o;
    open_pool_alone(&f, &o, 8 * PS_MiB);
    enum { N = 8 };
    void *first[N], *again[N], *big;
    for (int i = 0; i < N; i++)
        cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &first[i]), PS_OK);
    uint64_t reserved = fixture_info(f.pool).bytes_reserved;
    for (int i = 0; i < N; i++)
        cr_assert_eq(ps_deallocate(f.pool, first[i], PS_MiB, PS_STREAM_NONE), PS_OK);
    uint64_t barriers_at_free = ps_fake_gpu_barriers(f.gpu);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &again[i]), PS_OK);
        for (int j = 0; j < N; j++)
            if (again[i] == first[j])
                cr_assert_gt(ps_fake_gpu_barriers(f.gpu), barriers_at_free,
                             "block %d came back without a barrier issued after its free", j);
    }
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), barriers_at_free + 1, "one barrier released all of them");
    for (int i = 0; i < N; i++)
        cr_assert_eq(again[i], first[N - 1 - i], "allocation %d: the newest released block (the stack)", i);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, reserved, "no growth");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    /* released again, then a request of another size: the stack merges into
     * the lists first, so 4 MiB fits where the 1 MiB blocks were */
    for (int i = 0; i < N; i++)
        cr_assert_eq(ps_deallocate(f.pool, again[i], PS_MiB, PS_STREAM_NONE), PS_OK);
    void *one;
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &one), PS_OK);
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), barriers_at_free + 2);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 4 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, reserved, "the stacked blocks merged: no growth");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_deallocate(f.pool, one, PS_MiB, PS_STREAM_NONE);
    ps_deallocate(f.pool, big, 4 * PS_MiB, PS_STREAM_NONE);
    fixture_close(&f);
}
