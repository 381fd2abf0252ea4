/* Remap on growth (pool option `remap`, core/pool_expandable.c): an expandable
 * pool that must grow while whole free pieces lie elsewhere in its range
 * issues a barrier, waits on the host for the barrier that released those
 * pieces (barrier_wait; a device synchronize where it cannot), unmaps them
 * and maps the growth, so the mapped total stays the same; with remap_lend
 * (the default; the last tests here) it maps their memory a second time
 * instead of waiting, and unmaps the old addresses once that barrier passed. The fake
 * device's fences and barriers never complete unless a test says so (a
 * lagging GPU): an unmap without the wait would count as unsafe. When the
 * barrier that released the pieces has passed (they are idle), no wait. */
#include "pool_fixture.h"

#define LAYOUT_BLOCKS 5 /* a b c d e, 8 MiB each */

/* remap_lend of the pools these tests open: 0 (the host waits for busy
 * pieces), except in the lending tests at the end. */
static int lend_in_tests;

/* An expandable pool over a fake device with virtual memory. */
static void open_remap_pool_as(pool_fixture_t *f, int remap, int no_vm_keep)
{
    ps_pool_options_t o = small_pool_options();
    o.remap = remap;
    o.remap_lend = lend_in_tests;
    fixture_open_on(f, (ps_fake_gpu_options_t){.virtual_memory = 1, .no_vm_keep = no_vm_keep}, &o);
    cr_assert(ps_pool_is_expandable(f->pool));
}
static void open_remap_pool(pool_fixture_t *f, int remap) { open_remap_pool_as(f, remap, 0); }

/* Maps a b c d e (8 MiB each), then s and t (1 MiB each, one piece), frees
 * b and d and takes s again: the allocation's eager barrier releases b and
 * d, so two 8 MiB holes of whole free pieces lie between used blocks, no
 * 16 MiB block fits, and nothing is pending. 42 MiB mapped. */
static void make_two_holes(pool_fixture_t *f, void *blocks[LAYOUT_BLOCKS], void **s, void **t)
{
    for (int i = 0; i < LAYOUT_BLOCKS; i++)
        cr_assert_eq(ps_allocate(f->pool, 8 * PS_MiB, PS_STREAM_NONE, &blocks[i]), PS_OK);
    cr_assert_eq(ps_allocate(f->pool, PS_MiB, PS_STREAM_NONE, s), PS_OK);
    cr_assert_eq(ps_allocate(f->pool, PS_MiB, PS_STREAM_NONE, t), PS_OK);
    /* the fake judges unmaps by when each granule was freed */
    cr_assert_eq(ps_fake_gpu_note_free(f->gpu, *s, PS_MiB), PS_OK);
    cr_assert_eq(ps_deallocate(f->pool, *s, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_fake_gpu_note_free(f->gpu, blocks[1], 8 * PS_MiB), PS_OK);
    cr_assert_eq(ps_deallocate(f->pool, blocks[1], 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_fake_gpu_note_free(f->gpu, blocks[3], 8 * PS_MiB), PS_OK);
    cr_assert_eq(ps_deallocate(f->pool, blocks[3], 0, PS_STREAM_NONE), PS_OK);
    void *again;
    cr_assert_eq(ps_allocate(f->pool, PS_MiB, PS_STREAM_NONE, &again), PS_OK);
    cr_assert_eq(again, *s, "the barrier released s, b and d; s fits best");
    ps_resource_info_t info = fixture_info(f->pool);
    cr_assert_eq(info.bytes_reserved, 42 * PS_MiB);
    cr_assert_eq(info.bytes_pending, 0);
    cr_assert_eq(ps_fake_gpu_device_syncs(f->gpu), 0);
    cr_assert_eq(ps_pool_check(f->pool), PS_OK);
}

/* Frees what make_two_holes left in use, and `big`. */
static void free_layout(pool_fixture_t *f, void *blocks[LAYOUT_BLOCKS], void *s, void *t, void *big)
{
    for (int i = 0; i < LAYOUT_BLOCKS; i += 2)
        cr_assert_eq(ps_deallocate(f->pool, blocks[i], 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f->pool, s, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f->pool, t, 0, PS_STREAM_NONE), PS_OK);
    if (big)
        cr_assert_eq(ps_deallocate(f->pool, big, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_pool_check(f->pool), PS_OK);
}

Test(pool_remap, growth_moves_free_pieces_and_keeps_the_mapped_total)
{
    pool_fixture_t f;
    open_remap_pool(&f, 1);
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    make_two_holes(&f, blocks, &s, &t);
    uint64_t barriers = ps_fake_gpu_barriers(f.gpu);
    cr_assert_eq(ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_reserved, 42 * PS_MiB, "b's and d's pieces moved to the growth: %llu MiB mapped",
                 (unsigned long long)(info.bytes_reserved / PS_MiB));
    cr_assert_eq(info.peak_bytes_reserved, 42 * PS_MiB, "the peak did not move");
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 42 * PS_MiB);
    cr_assert_eq(info.remap_waits, 1);
    cr_assert_eq(ps_fake_gpu_barrier_waits(f.gpu), 1, "one host wait for the barrier that released b and d");
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0, "no device synchronize");
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), barriers + 1, "a barrier first: it proves no capture is open");
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    uint64_t moved = ps_fake_gpu_vm_maps_kept(f.gpu);
    cr_assert_gt(moved, 0, "the moved pieces' memory was mapped again, not released and created");
    cr_assert_eq(moved * 2 * PS_MiB, 16 * PS_MiB, "%llu pieces moved with their memory", (unsigned long long)moved);
    cr_assert_eq(ps_fake_gpu_vm_kept_now(f.gpu), 0, "nothing left kept after the growth");
    /* the holes serve 8 MiB requests again (mapped once more) */
    void *hole;
    cr_assert_eq(ps_allocate(f.pool, 8 * PS_MiB, PS_STREAM_NONE, &hole), PS_OK);
    cr_assert(hole == blocks[1] || hole == blocks[3], "a hole is mapped again, not the range's end");
    cr_assert_eq(ps_deallocate(f.pool, hole, 0, PS_STREAM_NONE), PS_OK);
    free_layout(&f, blocks, s, t, big);
    fixture_close(&f);
}

Test(pool_remap, without_kept_memory_the_pieces_are_released_and_created)
{
    /* a GPU-ops table without vm_unmap_keep: the same layout, the moved
     * pieces released and new ones created */
    pool_fixture_t f;
    open_remap_pool_as(&f, 1, 1);
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    make_two_holes(&f, blocks, &s, &t);
    uint64_t maps = ps_fake_gpu_vm_maps(f.gpu);
    cr_assert_eq(ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 42 * PS_MiB);
    cr_assert_eq(ps_fake_gpu_vm_maps_kept(f.gpu), 0);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), maps + 8, "8 pieces created for the growth");
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 42 * PS_MiB);
    free_layout(&f, blocks, s, t, big);
    fixture_close(&f);
}

Test(pool_remap, off_the_growth_adds_memory)
{
    pool_fixture_t f;
    open_remap_pool(&f, 0);
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    make_two_holes(&f, blocks, &s, &t);
    cr_assert_eq(ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 58 * PS_MiB, "remap off: 16 MiB more");
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0);
    free_layout(&f, blocks, s, t, big);
    fixture_close(&f);
}

Test(pool_remap, no_synchronize_while_a_barrier_is_refused)
{
    /* a refused barrier means a stream capture is open: a device
     * synchronize then would invalidate it, so the growth maps new memory */
    pool_fixture_t f;
    open_remap_pool(&f, 1);
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    make_two_holes(&f, blocks, &s, &t);
    ps_fake_gpu_block_barriers(f.gpu, 1);
    cr_assert_eq(ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    ps_fake_gpu_block_barriers(f.gpu, 0);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 58 * PS_MiB);
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0, "no synchronize while the barrier was refused");
    cr_assert_eq(ps_fake_gpu_barrier_waits(f.gpu), 0, "nor a wait");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    free_layout(&f, blocks, s, t, big);
    fixture_close(&f);
}

/* Tables without barrier_wait (the remap then synchronizes the device). */
static int drop_barrier_wait;

/* One call of `op` in the growth fails: the pool stays consistent, the
 * allocation is served or PS_ENOMEM (then served on retry), and the device
 * holds exactly what the pool says it reserved. idle: the barrier that
 * released the holes has passed (the remap needs no synchronize). */
static void fail_in_growth_of(ps_fake_op_t op, int idle)
{
    pool_fixture_t f;
    open_remap_pool(&f, 1);
    if (drop_barrier_wait)
        f.gpu->barrier_wait = NULL;
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big = NULL;
    make_two_holes(&f, blocks, &s, &t);
    if (idle)
        ps_fake_gpu_complete_barriers_upto(f.gpu, ps_fake_gpu_barriers(f.gpu));
    uint64_t before = ps_fake_gpu_calls(f.gpu, op);
    cr_assert_eq(ps_fake_gpu_fail_call(f.gpu, op, before + 1, 0), PS_OK);
    int status = ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &big);
    const char *name = ps_fake_gpu_op_name(op);
    cr_assert_eq(ps_fake_gpu_faults_fired(f.gpu, NULL, NULL), 1, "%s: the growth made that call", name);
    cr_assert(status == PS_OK || status == PS_ENOMEM, "%s: status %d", name, status);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK, "%s", name);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_reserved, ps_fake_gpu_bytes_outstanding(f.gpu), "%s: nothing lost", name);
    cr_assert_eq(ps_fake_gpu_vm_kept_now(f.gpu), 0, "%s: no kept memory left behind", name);
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0, "%s", name);
    if (status != PS_OK)
        cr_assert_eq(ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &big), PS_OK, "%s: the retry", name);
    cr_assert_eq(info.bytes_in_use + info.bytes_free + info.bytes_pending, info.bytes_reserved, "%s", name);
    free_layout(&f, blocks, s, t, big);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0, "%s", name);
    fixture_close(&f);
}

static void fail_in_growth(ps_fake_op_t op) { fail_in_growth_of(op, 0); }

Test(pool_remap, a_failed_unmap_leaves_the_pool_consistent) { fail_in_growth(PS_FAKE_OP_VM_UNMAP); }
Test(pool_remap, a_failed_map_leaves_the_pool_consistent) { fail_in_growth(PS_FAKE_OP_VM_MAP); }
Test(pool_remap, a_failed_barrier_wait_leaves_the_pool_consistent) { fail_in_growth(PS_FAKE_OP_BARRIER_WAIT); }
Test(pool_remap, a_failed_synchronize_leaves_the_pool_consistent)
{
    drop_barrier_wait = 1; /* the synchronize comes only where no barrier wait can be had */
    fail_in_growth(PS_FAKE_OP_DEVICE_SYNCHRONIZE);
    drop_barrier_wait = 0;
}
Test(pool_remap, a_failed_barrier_leaves_the_pool_consistent) { fail_in_growth(PS_FAKE_OP_BARRIER); }
Test(pool_remap, a_failed_barrier_query_leaves_the_pool_consistent) { fail_in_growth(PS_FAKE_OP_BARRIER_PASSED); }
Test(pool_remap, idle_a_failed_barrier_query_leaves_the_pool_consistent)
{
    fail_in_growth_of(PS_FAKE_OP_BARRIER_PASSED, 1);
}
Test(pool_remap, idle_a_failed_unmap_leaves_the_pool_consistent) { fail_in_growth_of(PS_FAKE_OP_VM_UNMAP, 1); }
Test(pool_remap, idle_a_failed_map_leaves_the_pool_consistent) { fail_in_growth_of(PS_FAKE_OP_VM_MAP, 1); }
Test(pool_remap, idle_a_failed_barrier_leaves_the_pool_consistent) { fail_in_growth_of(PS_FAKE_OP_BARRIER, 1); }

/* ---- idle pieces: no device synchronize ------------------------------- */

/* make_two_holes, then the 16 MiB growth; returns its info. */
static ps_resource_info_t grow_over_two_holes(pool_fixture_t *f, void *blocks[LAYOUT_BLOCKS], void **s, void **t,
                                              void **big, int barriers_passed)
{
    make_two_holes(f, blocks, s, t);
    if (barriers_passed)
        ps_fake_gpu_complete_barriers_upto(f->gpu, ps_fake_gpu_barriers(f->gpu));
    cr_assert_eq(ps_allocate(f->pool, 16 * PS_MiB, PS_STREAM_NONE, big), PS_OK);
    cr_assert_eq(ps_pool_check(f->pool), PS_OK);
    return fixture_info(f->pool);
}

Test(pool_remap, pieces_a_passed_barrier_released_move_without_a_synchronize)
{
    pool_fixture_t f;
    open_remap_pool(&f, 1);
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    ps_resource_info_t info = grow_over_two_holes(&f, blocks, &s, &t, &big, 1);
    cr_assert_eq(info.bytes_reserved, 42 * PS_MiB, "b's and d's pieces moved: %llu MiB mapped",
                 (unsigned long long)(info.bytes_reserved / PS_MiB));
    cr_assert_eq(info.remaps_idle, 1);
    cr_assert_eq(info.remap_syncs, 0);
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0, "the GPU had passed the barrier that released them");
    cr_assert_gt(ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_BARRIER_PASSED), 0);
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    free_layout(&f, blocks, s, t, big);
    fixture_close(&f);
}

Test(pool_remap, pieces_a_pending_barrier_released_wait_for_that_barrier)
{
    pool_fixture_t f;
    open_remap_pool(&f, 1);
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    uint64_t released_by = 0;
    make_two_holes(&f, blocks, &s, &t);
    released_by = ps_fake_gpu_barriers(f.gpu); /* the eager barrier of make_two_holes' last allocation */
    cr_assert_eq(ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_reserved, 42 * PS_MiB);
    cr_assert_eq(info.remaps_idle, 0);
    cr_assert_eq(info.remap_waits, 1);
    cr_assert_eq(info.remap_syncs, 0);
    cr_assert_eq(ps_fake_gpu_barrier_waits(f.gpu), 1, "the GPU may still use b and d: wait for their barrier");
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0, "not for the whole device");
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), released_by + 1, "the remap's own barrier came after");
    cr_assert_eq(f.gpu->barrier_passed(f.gpu->ctx, released_by + 1), PS_ENOTREADY,
                 "the wait left the remap's own barrier (newer work) running");
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    free_layout(&f, blocks, s, t, big);
    fixture_close(&f);
}

Test(pool_remap, without_a_barrier_wait_the_device_is_synchronized)
{
    pool_fixture_t f;
    open_remap_pool(&f, 1);
    f.gpu->barrier_wait = NULL;
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    ps_resource_info_t info = grow_over_two_holes(&f, blocks, &s, &t, &big, 0);
    cr_assert_eq(info.bytes_reserved, 42 * PS_MiB);
    cr_assert_eq(info.remap_syncs, 1);
    cr_assert_eq(info.remap_waits, 0);
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 1, "the GPU may still use b and d: synchronize first");
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    free_layout(&f, blocks, s, t, big);
    fixture_close(&f);
}

/* A barrier_wait that returns at once without waiting (the negative
 * control of the two tests above). */
static int wait_not(void *ctx, uint64_t generation)
{
    (void)ctx;
    (void)generation;
    return PS_OK;
}

Test(pool_remap, a_wait_that_does_not_wait_unmaps_pieces_the_gpu_may_use)
{
    pool_fixture_t f;
    open_remap_pool(&f, 1);
    f.gpu->barrier_wait = wait_not;
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    ps_resource_info_t info = grow_over_two_holes(&f, blocks, &s, &t, &big, 0);
    cr_assert_eq(info.remap_waits, 1);
    cr_assert_gt(ps_fake_gpu_unsafe_unmaps(f.gpu), 0, "the judge saw b and d unmapped under the GPU");
    free_layout(&f, blocks, s, t, big);
    fixture_close(&f);
}

Test(pool_remap, skipping_the_idle_check_unmaps_pieces_the_gpu_may_use)
{
    /* the negative control of the test above: a pool that took every block
     * for idle (or a device that says every barrier passed) unmaps b and d
     * with no synchronize while the GPU has not passed their barrier; the
     * fake's judge (which knows when b and d were freed) counts it */
    for (int variant = 0; variant < 2; variant++) {
        pool_fixture_t f;
        open_remap_pool(&f, 1);
        if (variant == 0)
            ps_pool_test_skip_idle_check(1);
        else
            ps_fake_gpu_assume_barriers_passed(f.gpu, 1);
        void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
        ps_resource_info_t info = grow_over_two_holes(&f, blocks, &s, &t, &big, 0);
        ps_pool_test_skip_idle_check(0);
        cr_assert_eq(info.remaps_idle, 1, "variant %d", variant);
        cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0, "variant %d", variant);
        cr_assert_gt(ps_fake_gpu_unsafe_unmaps(f.gpu), 0, "variant %d: the judge saw it", variant);
        free_layout(&f, blocks, s, t, big);
        fixture_close(&f);
    }
}

Test(pool_remap, a_lagging_gpu_passes_the_barrier_after_the_lag)
{
    /* timed fake: barriers pass lag_ns of simulated clock after they were
     * issued */
    for (int late = 0; late < 2; late++) {
        pool_fixture_t f;
        ps_pool_options_t o = small_pool_options();
    o.remap_lend = lend_in_tests;
        ps_fake_gpu_options_t host = {.virtual_memory = 1, .lag_ns = 2000000};
        cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
        cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
        cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
        void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
        make_two_holes(&f, blocks, &s, &t);
        ps_fake_gpu_set_clock(f.gpu, late ? 2000000 : 1999999);
        cr_assert_eq(ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
        ps_resource_info_t info = fixture_info(f.pool);
        cr_assert_eq(info.bytes_reserved, 42 * PS_MiB, "late %d", late);
        cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0, "late %d", late);
        cr_assert_eq(ps_fake_gpu_barrier_waits(f.gpu), late ? 0 : 1, "late %d: a wait only before the lag", late);
        if (!late) /* 1 ns before the barrier passes: the wait takes 1 ns, a synchronize at least as long */
            cr_assert(ps_fake_gpu_barrier_wait_ns(f.gpu) == 1 &&
                          ps_fake_gpu_wait_instead_sync_ns(f.gpu) >= ps_fake_gpu_barrier_wait_ns(f.gpu),
                      "wait %llu ns, as a synchronize %llu ns", (unsigned long long)ps_fake_gpu_barrier_wait_ns(f.gpu),
                      (unsigned long long)ps_fake_gpu_wait_instead_sync_ns(f.gpu));
        cr_assert_eq(info.remaps_idle, late ? 1 : 0, "late %d", late);
        cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0, "late %d", late);
        cr_assert_eq(ps_pool_check(f.pool), PS_OK);
        free_layout(&f, blocks, s, t, big);
        fixture_close(&f);
    }
}

Test(pool_remap, merged_blocks_take_the_newest_generation)
{
    /* b and d were released by a barrier that has passed; c, between them,
     * is freed afterwards and released by a barrier that has not: the
     * merged b+c+d block must count as busy (a merge that kept b's older
     * generation would unmap c's pieces under a running kernel) */
    pool_fixture_t f;
    open_remap_pool(&f, 1);
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    make_two_holes(&f, blocks, &s, &t);
    ps_fake_gpu_complete_barriers_upto(f.gpu, ps_fake_gpu_barriers(f.gpu));
    cr_assert_eq(ps_fake_gpu_note_free(f.gpu, blocks[2], 8 * PS_MiB), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, blocks[2], 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 32 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.remap_waits, 1, "c's barrier has not passed: wait for it");
    cr_assert_eq(info.remaps_idle, 0);
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    for (int i = 0; i < LAYOUT_BLOCKS; i += 4)
        cr_assert_eq(ps_deallocate(f.pool, blocks[i], 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, s, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, t, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, big, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

/* `iterations` times: two 8 MiB blocks freed between kept separators and
 * a kept 16 MiB allocation that must grow (little memory turns over).
 * Returns the device synchronizes it cost. */
static uint64_t growth_after_growth(unsigned turnover_percent, int iterations)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.remap_lend = lend_in_tests;
    o.remap_turnover_percent = turnover_percent;
    ps_fake_gpu_options_t host = {.virtual_memory = 1};
    cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    void **kept = calloc((size_t)iterations * 3, sizeof *kept);
    cr_assert_not_null(kept);
    for (int i = 0; i < iterations; i++) {
        void *u1, *u2;
        cr_assert_eq(ps_allocate(f.pool, 8 * PS_MiB, PS_STREAM_NONE, &u1), PS_OK);
        cr_assert_eq(ps_allocate(f.pool, 2 * PS_MiB, PS_STREAM_NONE, &kept[3 * i]), PS_OK);
        cr_assert_eq(ps_allocate(f.pool, 8 * PS_MiB, PS_STREAM_NONE, &u2), PS_OK);
        cr_assert_eq(ps_allocate(f.pool, 2 * PS_MiB, PS_STREAM_NONE, &kept[3 * i + 1]), PS_OK);
        cr_assert_eq(ps_deallocate(f.pool, u1, 0, PS_STREAM_NONE), PS_OK);
        cr_assert_eq(ps_deallocate(f.pool, u2, 0, PS_STREAM_NONE), PS_OK);
        cr_assert_eq(ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &kept[3 * i + 2]), PS_OK);
    }
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    uint64_t syncs = ps_fake_gpu_device_syncs(f.gpu) + ps_fake_gpu_barrier_waits(f.gpu);
    cr_assert_eq(fixture_info(f.pool).remap_syncs + fixture_info(f.pool).remap_waits, syncs);
    for (int i = 0; i < iterations * 3; i++)
        cr_assert_eq(ps_deallocate(f.pool, kept[i], 0, PS_STREAM_NONE), PS_OK);
    free(kept);
    fixture_close(&f);
    return syncs;
}

Test(pool_remap, synchronizes_are_bounded_by_the_memory_turned_over)
{
    /* every iteration could remap; with remap_turnover_percent 0 every one
     * does. With 100 (the default), after the first 16 each needs as many
     * bytes freed as the pool reserves: these iterations free 16 MiB of a
     * pool of 20 MiB more each time, so few more are allowed */
    uint64_t unlimited = growth_after_growth(0, 40);
    uint64_t limited = growth_after_growth(100, 40);
    cr_log_info("remaps: %llu without a limit, %llu with", (unsigned long long)unlimited, (unsigned long long)limited);
    cr_assert_eq(unlimited, 40, "without a limit every growth remaps");
    cr_assert_geq(limited, 16, "the burst");
    cr_assert_leq(limited, 24, "the turnover limits the rest: %llu", (unsigned long long)limited);
}

/* A word that names block `id` at word `at`. */
static uint64_t stamp(uint64_t id, size_t at)
{
    return id * 0x9e3779b97f4a7c15ull ^ at;
}

/* The words of a block of `words` words that carry its stamp: one every
 * 64 KiB and the last. */
static size_t next_stamped(size_t at, size_t words)
{
    size_t next = (at / 8192 + 1) * 8192;
    return at + 1 == words ? words : next < words ? next : words - 1;
}

static void stamp_block(uint64_t *p, size_t words, uint64_t id)
{
    for (size_t at = 0; at < words; at = next_stamped(at, words))
        p[at] = stamp(id, at);
}

/* Whether every stamped word of the block is still there. */
static int stamps_intact(const uint64_t *p, size_t words, uint64_t id)
{
    for (size_t at = 0; at < words; at = next_stamped(at, words))
        if (p[at] != stamp(id, at))
            return 0;
    return 1;
}

/* lend: remap_lend, and every 64 operations the GPU passes all barriers but
 * the newest, so lent addresses are unmapped and mapped again later. */
static void random_workload_over_real_memory(int lend)
{
    /* backed memory: an unmapped piece faults, a piece mapped again reads
     * zeros. Each live block carries its stamp at both ends and in every
     * 64 KiB; it must still be there when the block is freed, after
     * thousands of remaps (no bound, to make as many as possible). */
    enum { OPS = 20000, LIVE = 48 };
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.remap_lend = lend;
    o.remap_turnover_percent = 0;
    o.small_from_back = PS_MiB;
    ps_fake_gpu_options_t host = {.virtual_memory = 1, .backed = 1};
    cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    struct { uint64_t *p; size_t size; uint64_t id; } live[LIVE] = {{0}};
    uint64_t rng = 12345, next_id = 1;
    for (int op = 0; op < OPS; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int slot = (int)((rng >> 33) % LIVE);
        if (live[slot].p) {
            cr_assert(stamps_intact(live[slot].p, live[slot].size / 8, live[slot].id), "op %d: block %llu changed",
                      op, (unsigned long long)live[slot].id);
            cr_assert_eq(ps_deallocate(f.pool, live[slot].p, live[slot].size, PS_STREAM_NONE), PS_OK);
            live[slot].p = NULL;
        } else {
            int shift = 8 + (int)((rng >> 20) % 16); /* 256 B .. 8 MiB, then a random part of that */
            size_t size = ((size_t)1 << shift) + (size_t)((rng >> 40) % ((size_t)1 << shift));
            size = (size + 7) & ~(size_t)7;
            void *p;
            cr_assert_eq(ps_allocate(f.pool, size, PS_STREAM_NONE, &p), PS_OK);
            live[slot].p = p;
            live[slot].size = size;
            live[slot].id = next_id++;
            stamp_block(live[slot].p, size / 8, live[slot].id);
        }
        if (op % 1000 == 0)
            cr_assert_eq(ps_pool_check(f.pool), PS_OK, "op %d", op);
        if (lend && op % 64 == 0 && ps_fake_gpu_barriers(f.gpu) > 1)
            ps_fake_gpu_complete_barriers_upto(f.gpu, ps_fake_gpu_barriers(f.gpu) - 1);
    }
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    ps_resource_info_t info = fixture_info(f.pool);
    uint64_t remaps = info.remap_syncs + info.remap_waits + info.remaps_lent;
    if (lend)
        cr_assert_gt(info.remaps_lent, 10, "lent %llu times", (unsigned long long)info.remaps_lent);
    cr_assert_eq(info.bytes_reserved, ps_fake_gpu_bytes_outstanding(f.gpu), "every byte counted once");
    cr_log_info("remaps: %llu", (unsigned long long)remaps);
    cr_assert_gt(remaps, 10, "the workload exercised remap: %llu", (unsigned long long)remaps);
    for (int i = 0; i < LIVE; i++)
        if (live[i].p)
            cr_assert_eq(ps_deallocate(f.pool, live[i].p, live[i].size, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_remap, random_workload_over_real_memory_never_moves_a_used_byte) { random_workload_over_real_memory(0); }
Test(pool_remap, lending_random_workload_over_real_memory_never_moves_a_used_byte)
{
    random_workload_over_real_memory(1);
}

/* remap_slack_percent: a remap that would wait on the host grows instead
 * while reserved stays within that share above the most bytes in use (and
 * needed) at a growth. make_two_holes's last growth needed 42 MiB in use;
 * the 16 MiB growth would take reserved to 58 MiB: within 40 % (58.8 MiB),
 * not within 30 % (54.6 MiB). */
static void grow_with_slack(unsigned slack, uint64_t want_reserved, uint64_t want_waits, uint64_t want_slack)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.remap_lend = lend_in_tests;
    o.remap_slack_percent = slack;
    ps_fake_gpu_options_t host = {.virtual_memory = 1};
    cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    make_two_holes(&f, blocks, &s, &t);
    cr_assert_eq(ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_reserved, want_reserved, "slack %u %%: %llu MiB mapped", slack,
                 (unsigned long long)(info.bytes_reserved / PS_MiB));
    cr_assert_eq(info.remap_waits, want_waits, "slack %u %%", slack);
    cr_assert_eq(ps_fake_gpu_barrier_waits(f.gpu), want_waits, "slack %u %%", slack);
    cr_assert_eq(info.remaps_slack, want_slack, "slack %u %%", slack);
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0);
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    free_layout(&f, blocks, s, t, big);
    fixture_close(&f);
}

Test(pool_remap, slack_grows_instead_of_waiting_while_within_its_share)
{
    grow_with_slack(40, 58 * PS_MiB, 0, 1);
}

Test(pool_remap, slack_waits_as_before_past_its_share)
{
    grow_with_slack(30, 42 * PS_MiB, 1, 0);
    grow_with_slack(0, 42 * PS_MiB, 1, 0);
}

/* ---- remap_lend: busy pieces lend their memory, no host wait ----------- */

/* make_two_holes and the 16 MiB growth over a lending pool, b's and d's
 * barrier not passed: returns its info. */
static ps_resource_info_t lend_over_two_holes(pool_fixture_t *f, void *blocks[LAYOUT_BLOCKS], void **s, void **t,
                                              void **big)
{
    lend_in_tests = 1;
    open_remap_pool(f, 1);
    lend_in_tests = 0;
    return grow_over_two_holes(f, blocks, s, t, big, 0);
}

Test(pool_remap, busy_pieces_lend_their_memory_to_the_growth_without_a_wait)
{
    pool_fixture_t f;
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    ps_resource_info_t info = lend_over_two_holes(&f, blocks, &s, &t, &big);
    cr_assert_eq(info.remaps_lent, 1);
    cr_assert_eq(info.remap_waits + info.remap_syncs + info.remaps_idle, 0);
    cr_assert_eq(ps_fake_gpu_barrier_waits(&f.gpu[0]), 0, "no host wait for b's and d's barrier");
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0);
    cr_assert_eq(info.bytes_reserved, 42 * PS_MiB, "the mapped total kept: %llu MiB",
                 (unsigned long long)(info.bytes_reserved / PS_MiB));
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 42 * PS_MiB, "no new memory: b's and d's serve twice");
    cr_assert_eq(ps_fake_gpu_vm_aliases(f.gpu), 16 * PS_MiB / (2 * PS_MiB), "each 2 MiB piece mapped a second time");
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0, "b and d still mapped");
    /* their old addresses stay mapped while the barrier has not passed */
    uint64_t unmaps = ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_UNMAP);
    void *more;
    cr_assert_eq(ps_allocate(f.pool, 24 * PS_MiB, PS_STREAM_NONE, &more), PS_OK);
    cr_assert_eq(ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_UNMAP), unmaps, "not unmapped before their barrier passed");
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    cr_assert_eq(ps_deallocate(f.pool, more, 0, PS_STREAM_NONE), PS_OK);
    /* once it passed, the next growth unmaps them (the memory stays where it serves) */
    ps_fake_gpu_complete_barriers_upto(f.gpu, ps_fake_gpu_barriers(f.gpu));
    cr_assert_eq(ps_allocate(f.pool, 40 * PS_MiB, PS_STREAM_NONE, &more), PS_OK);
    cr_assert_gt(ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_UNMAP), unmaps, "the old addresses went");
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, ps_fake_gpu_bytes_outstanding(f.gpu));
    cr_assert_eq(ps_deallocate(f.pool, more, 0, PS_STREAM_NONE), PS_OK);
    free_layout(&f, blocks, s, t, big);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 0, "every piece freed once");
    fixture_close(&f);
}

Test(pool_remap, lent_addresses_unmapped_before_their_barrier_are_caught)
{
    /* the negative control of the test above: a pool that unmaps lent
     * addresses without asking whether their barrier passed (the test
     * hook) unmaps b and d under the GPU, and the judge sees it */
    pool_fixture_t f;
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big, *more;
    ps_resource_info_t info = lend_over_two_holes(&f, blocks, &s, &t, &big);
    cr_assert_eq(info.remaps_lent, 1);
    ps_pool_test_skip_idle_check(1);
    cr_assert_eq(ps_allocate(f.pool, 24 * PS_MiB, PS_STREAM_NONE, &more), PS_OK);
    ps_pool_test_skip_idle_check(0);
    cr_assert_gt(ps_fake_gpu_unsafe_unmaps(f.gpu), 0, "b and d unmapped under the GPU");
    cr_assert_eq(ps_deallocate(f.pool, more, 0, PS_STREAM_NONE), PS_OK);
    free_layout(&f, blocks, s, t, big);
    fixture_close(&f);
}

Test(pool_remap, a_trim_synchronizes_and_unmaps_lent_addresses)
{
    pool_fixture_t f;
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    lend_over_two_holes(&f, blocks, &s, &t, &big);
    free_layout(&f, blocks, s, t, big);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 0, "nothing left mapped anywhere");
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

/* One call of `op` fails in a lending growth (or in the growth after it,
 * which unmaps the lent addresses): as fail_in_growth_of. */
static void fail_in_lending_growth(ps_fake_op_t op, int later)
{
    pool_fixture_t f;
    lend_in_tests = 1;
    open_remap_pool(&f, 1);
    lend_in_tests = 0;
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big = NULL, *more = NULL;
    make_two_holes(&f, blocks, &s, &t);
    const char *name = ps_fake_gpu_op_name(op);
    if (later) {
        cr_assert_eq(ps_allocate(f.pool, 16 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
        cr_assert_eq(fixture_info(f.pool).remaps_lent, 1);
        ps_fake_gpu_complete_barriers_upto(f.gpu, ps_fake_gpu_barriers(f.gpu));
    }
    uint64_t before = ps_fake_gpu_calls(f.gpu, op);
    cr_assert_eq(ps_fake_gpu_fail_call(f.gpu, op, before + 1, 0), PS_OK);
    void **target = later ? &more : &big;
    int status = ps_allocate(f.pool, later ? 40 * PS_MiB : 16 * PS_MiB, PS_STREAM_NONE, target);
    cr_assert_eq(ps_fake_gpu_faults_fired(f.gpu, NULL, NULL), 1, "%s: the growth made that call", name);
    cr_assert(status == PS_OK || status == PS_ENOMEM, "%s: status %d", name, status);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK, "%s", name);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_reserved, ps_fake_gpu_bytes_outstanding(f.gpu), "%s: nothing lost", name);
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0, "%s", name);
    if (status != PS_OK)
        cr_assert_eq(ps_allocate(f.pool, later ? 40 * PS_MiB : 16 * PS_MiB, PS_STREAM_NONE, target), PS_OK,
                     "%s: the retry", name);
    if (more)
        cr_assert_eq(ps_deallocate(f.pool, more, 0, PS_STREAM_NONE), PS_OK);
    free_layout(&f, blocks, s, t, big);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0, "%s", name);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 0, "%s: every piece freed once", name);
    fixture_close(&f);
}

Test(pool_remap, lend_a_failed_map_leaves_the_pool_consistent) { fail_in_lending_growth(PS_FAKE_OP_VM_MAP, 0); }
Test(pool_remap, lend_a_failed_barrier_query_leaves_the_pool_consistent)
{
    fail_in_lending_growth(PS_FAKE_OP_BARRIER_PASSED, 0);
}
Test(pool_remap, lend_a_failed_unmap_of_a_lent_address_leaves_the_pool_consistent)
{
    fail_in_lending_growth(PS_FAKE_OP_VM_UNMAP, 1);
}

Test(pool_remap, a_driver_that_will_not_map_memory_twice_makes_the_pool_wait_instead)
{
    /* the alias map is refused: the growth is tried again without lending
     * (it waits for b's and d's barrier), and the pool lends no more */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.remap_lend = 1;
    ps_fake_gpu_options_t host = {.virtual_memory = 1, .no_vm_alias = 1};
    cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    ps_resource_info_t info = grow_over_two_holes(&f, blocks, &s, &t, &big, 0);
    cr_assert_eq(info.remaps_lent, 0, "the lending try was taken back");
    cr_assert_eq(info.remap_waits, 1, "the second try waited");
    cr_assert_eq(info.bytes_reserved, 42 * PS_MiB);
    cr_assert_eq(info.bytes_reserved, ps_fake_gpu_bytes_outstanding(f.gpu));
    cr_assert_eq(ps_fake_gpu_vm_aliases(f.gpu), 0);
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    /* the next busy remap waits at once (no lending try) */
    void *again;
    cr_assert_eq(ps_deallocate(f.pool, big, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_fake_gpu_note_free(f.gpu, blocks[2], 8 * PS_MiB), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, blocks[2], 0, PS_STREAM_NONE), PS_OK);
    uint64_t map_calls = ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_MAP);
    cr_assert_eq(ps_allocate(f.pool, 40 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    info = fixture_info(f.pool);
    cr_assert_eq(info.remaps_lent, 0);
    cr_assert_eq(ps_fake_gpu_faults_fired(f.gpu, NULL, NULL), 0);
    cr_assert_gt(ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_MAP), map_calls);
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, big, 0, PS_STREAM_NONE), PS_OK);
    blocks[2] = NULL;
    for (int i = 0; i < LAYOUT_BLOCKS; i += 2)
        if (blocks[i])
            cr_assert_eq(ps_deallocate(f.pool, blocks[i], 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, s, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, t, 0, PS_STREAM_NONE), PS_OK);
    (void)again;
    fixture_close(&f);
}

Test(pool_remap, the_return_lent_switch_unmaps_lent_addresses_under_the_gpu)
{
    /* POOLSHIM_TEST_RETURN_LENT=1 (tests/gpu/remap_idle.cu's negative
     * control) must really unmap b and d at once: the fake's judge sees it */
    pool_fixture_t f;
    void *blocks[LAYOUT_BLOCKS], *s, *t, *big;
    ps_pool_test_return_lent_at_once(1);
    ps_resource_info_t info = lend_over_two_holes(&f, blocks, &s, &t, &big);
    ps_pool_test_return_lent_at_once(0);
    cr_assert_eq(info.remaps_lent, 1);
    cr_assert_gt(ps_fake_gpu_unsafe_unmaps(f.gpu), 0, "b and d unmapped right after the growth");
    cr_assert_eq(info.bytes_reserved, ps_fake_gpu_bytes_outstanding(f.gpu));
    free_layout(&f, blocks, s, t, big);
    fixture_close(&f);
}
