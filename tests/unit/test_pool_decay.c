/* The decay (core/pool_decay.c): free memory not needed for a while goes
 * back without any call from the program, only once the GPU has passed the
 * barrier that released it, never what a loop needs again, and never
 * while the pool's lock is busy. Time is the caller's: the tests pass it. */
#include "pool_fixture.h"

#include <pthread.h>

#define SEC 1000000000ull
#define DECAY (4 * SEC)

/* An expandable pool (free_sync barrier, the default) over a fake device
 * whose barriers pass only when the test says so. */
static void open_decay_pool(pool_fixture_t *f)
{
    ps_pool_options_t o = small_pool_options();
    fixture_open_on(f, (ps_fake_gpu_options_t){.virtual_memory = 1}, &o);
    cr_assert(ps_pool_is_expandable(f->pool));
}

/* Ticks every quarter of DECAY from `from` to `to` (inclusive); returns the bytes given back. */
static uint64_t tick(pool_fixture_t *f, uint64_t from, uint64_t to)
{
    uint64_t given = 0;
    for (uint64_t t = from; t <= to; t += DECAY / 4)
        given += ps_decay(f->pool, t, DECAY, 0);
    return given;
}

Test(pool_decay, an_idle_pool_gives_everything_back_once_its_barrier_passed)
{
    pool_fixture_t f;
    open_decay_pool(&f);
    void *p[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &p[i]), PS_OK);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(ps_fake_gpu_note_free(f.gpu, p[i], 64 * PS_MiB), PS_OK);
        cr_assert_eq(ps_deallocate(f.pool, p[i], 0, PS_STREAM_NONE), PS_OK);
    }
    uint64_t barriers = ps_fake_gpu_barriers(f.gpu);
    cr_assert_eq(tick(&f, SEC, 4 * SEC), 0, "a window not yet seen whole: nothing goes");
    cr_assert_gt(ps_fake_gpu_barriers(f.gpu), barriers,
                 "a quiet tick issued a barrier for the pending blocks before the window ended");
    cr_assert_eq(tick(&f, 5 * SEC, 6 * SEC), 0, "the barrier has not passed: nothing goes");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 256 * PS_MiB);
    ps_fake_gpu_complete_barriers_upto(f.gpu, ps_fake_gpu_barriers(f.gpu));
    cr_assert_eq(tick(&f, 7 * SEC, 7 * SEC), 256 * PS_MiB);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 0, "the device has it back");
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 0, "never a device synchronize");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_decay, a_loop_keeps_its_working_set)
{
    /* a step allocates 8 blocks of 10-80 MiB and frees them; ticks between
     * steps for three windows: no unmap, nothing given back */
    pool_fixture_t f;
    open_decay_pool(&f);
    ps_fake_gpu_set_auto_complete(f.gpu, 1);
    uint64_t reserved = 0, unmaps = 0, given = 0;
    for (int step = 0; step < 120; step++) {
        void *p[8];
        for (int i = 0; i < 8; i++)
            cr_assert_eq(ps_allocate(f.pool, (size_t)(10 + (step * 7 + i * 13) % 71) * PS_MiB, PS_STREAM_NONE,
                                     &p[i]), PS_OK);
        for (int i = 0; i < 8; i++)
            cr_assert_eq(ps_deallocate(f.pool, p[i], 0, PS_STREAM_NONE), PS_OK);
        if (step == 20) { /* warmed up */
            reserved = fixture_info(f.pool).bytes_reserved;
            unmaps = ps_fake_gpu_vm_unmaps(f.gpu);
        }
        given += ps_decay(f.pool, (uint64_t)(step + 1) * SEC / 10, DECAY, 0);
    }
    cr_assert_eq(given, 0, "the loop's memory stays");
    cr_assert_eq(ps_fake_gpu_vm_unmaps(f.gpu), unmaps, "no piece went back and came again");
    cr_assert_geq(fixture_info(f.pool).bytes_reserved, reserved, "nothing went back");
    ps_destroy(f.pool);
    ps_destroy(f.upstream);
    ps_fake_gpu_destroy(f.gpu);
}

Test(pool_decay, a_busy_pool_gives_back_what_it_no_longer_needs)
{
    pool_fixture_t f;
    open_decay_pool(&f);
    ps_fake_gpu_set_auto_complete(f.gpu, 1);
    void *big[6], *small;
    for (int i = 0; i < 6; i++)
        cr_assert_eq(ps_allocate(f.pool, 100 * PS_MiB, PS_STREAM_NONE, &big[i]), PS_OK);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(ps_deallocate(f.pool, big[i], 0, PS_STREAM_NONE), PS_OK);
    uint64_t given = 0;
    for (int step = 1; step <= 100; step++) { /* a smaller loop from now on, 10 s */
        cr_assert_eq(ps_allocate(f.pool, 100 * PS_MiB, PS_STREAM_NONE, &small), PS_OK);
        cr_assert_eq(ps_deallocate(f.pool, small, 0, PS_STREAM_NONE), PS_OK);
        given += ps_decay(f.pool, (uint64_t)step * SEC / 10, DECAY, 0);
    }
    uint64_t reserved = fixture_info(f.pool).bytes_reserved;
    cr_assert_gt(given, 0);
    cr_assert_leq(reserved, 100 * PS_MiB + 100 * PS_MiB / 4 + 2 * PS_MiB + 2 * PS_MiB,
                  "reserved %llu MiB: the loop's 100 MiB and the slack", (unsigned long long)(reserved >> 20));
    cr_assert_geq(reserved, 100 * PS_MiB);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

/* The early start of core/pool_decay.c: an idle pool whose give-back is expected to take
 * long starts early, by that time (at most 3/4 of the window), so the memory
 * is back about decay_ms after the last allocation; with the estimate at 0
 * it starts when the whole window was idle. The time is counted in runs:
 * 256 MiB made before the first free is 4 runs of 64 MiB
 * (expandable_setup_run_min), with setup runs off 128 pieces. Ticks as
 * shim/give_back.c makes them: every quarter of DECAY, over a window of
 * DECAY less one tick. */
static uint64_t first_give_back_at(uint64_t ns_per_run, int pieces)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    if (pieces)
        o.expandable_setup_run_min = 0;
    ps_fake_gpu_options_t host = {.virtual_memory = 1};
    cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    ps_fake_gpu_set_auto_complete(f.gpu, 1);
    void *p[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &p[i]), PS_OK);
    cr_assert_eq(fixture_info(f.pool).upstream_allocs, pieces ? 128 : 4, "the layout: %s", pieces ? "pieces" : "runs");
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ps_deallocate(f.pool, p[i], 0, PS_STREAM_NONE), PS_OK);
    uint64_t at = 0;
    for (uint64_t t = DECAY / 4; t <= 3 * DECAY && !at; t += DECAY / 4) {
        ps_pool_decay_set_release_rate(ns_per_run); /* (each give-back measures the fake's speed) */
        if (ps_decay(f.pool, t, DECAY - DECAY / 4, 0))
            at = t;
    }
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0, "all given back (%llu ns a run: first at %.2f s)",
                 (unsigned long long)ns_per_run, at / 1e9);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
    ps_pool_decay_set_release_rate(ps_pool_decay_release_rate_default());
    return at;
}

Test(pool_decay, an_idle_pool_whose_give_back_takes_long_starts_early)
{
    uint64_t whole = first_give_back_at(0, 0);
    uint64_t small = first_give_back_at(1000000, 0);       /* 4 runs, ~4 ms: less than a tick */
    uint64_t early = first_give_back_at(300000000, 0);     /* ~1.2 s expected: a tick earlier */
    uint64_t capped = first_give_back_at(10000000000, 0);  /* far longer than the window: 3/4 of it, two ticks */
    cr_assert_eq(whole, DECAY, "without the estimate, a decay after the last allocation: %.2f s", whole / 1e9);
    cr_assert_eq(small, whole, "a short give-back does not start early: %.2f s", small / 1e9);
    cr_assert_eq(early, whole - DECAY / 4, "a tick early: %.2f s", early / 1e9);
    cr_assert_eq(capped, whole - 2 * DECAY / 4,
                 "at most three quarters of the window early (not at the first tick): %.2f s", capped / 1e9);
}

Test(pool_decay, the_estimate_counts_runs_not_bytes)
{
    /* the same 256 MiB at the same time per run: 128 pieces take ~1.2 s
     * to unmap and start a tick early; 4 runs take ~38 ms and do not (in
     * bytes both looked the same, and 112 GiB of 64 MiB runs went back at
     * a third of a 1 s decay on two H200s) */
    uint64_t whole = first_give_back_at(0, 0);
    uint64_t pieces = first_give_back_at(9400000, 1);
    uint64_t runs = first_give_back_at(9400000, 0);
    cr_assert_eq(pieces, whole - DECAY / 4, "128 pieces: a tick early (%.2f s)", pieces / 1e9);
    cr_assert_eq(runs, whole, "4 runs: no earlier than the window (%.2f s)", runs / 1e9);
}

Test(pool_decay, a_capture_keeps_pending_memory)
{
    /* barriers refused (a capture is open): pending blocks stay */
    pool_fixture_t f;
    open_decay_pool(&f);
    void *p;
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, p, 0, PS_STREAM_NONE), PS_OK);
    ps_fake_gpu_block_barriers(f.gpu, 1);
    ps_fake_gpu_complete_all(f.gpu);
    cr_assert_eq(tick(&f, SEC, 10 * SEC), 0);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 64 * PS_MiB);
    ps_fake_gpu_block_barriers(f.gpu, 0);
    tick(&f, 11 * SEC, 11 * SEC); /* the barrier */
    ps_fake_gpu_complete_barriers_upto(f.gpu, ps_fake_gpu_barriers(f.gpu));
    cr_assert_eq(tick(&f, 12 * SEC, 12 * SEC), 64 * PS_MiB);
    fixture_close(&f);
}

static void *hold_lock_and_allocate(void *arg)
{
    pool_fixture_t *f = arg;
    void *p;
    for (int i = 0; i < 20000; i++) {
        if (ps_allocate(f->pool, PS_MiB, PS_STREAM_NONE, &p) != PS_OK ||
            ps_deallocate(f->pool, p, 0, PS_STREAM_NONE) != PS_OK)
            return (void *)1;
    }
    return NULL;
}

Test(pool_decay, ticks_beside_an_allocating_thread_keep_the_pool_consistent)
{
    pool_fixture_t f;
    open_decay_pool(&f);
    ps_fake_gpu_set_auto_complete(f.gpu, 1);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, hold_lock_and_allocate, &f), 0);
    for (uint64_t now = SEC; now < 400 * SEC; now += SEC / 4)
        ps_decay(f.pool, now, now % (8 * SEC) ? DECAY : 0, 0);
    void *failed;
    pthread_join(t, &failed);
    cr_assert_null(failed);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_decay, a_neighbour_request_gives_back_all_idle_memory_at_once)
{
    pool_fixture_t f;
    open_decay_pool(&f);
    ps_fake_gpu_set_auto_complete(f.gpu, 1);
    void *p, *q;
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 32 * PS_MiB, PS_STREAM_NONE, &q), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, q, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_decay(f.pool, SEC, 0, 0), 32 * PS_MiB, "no window: every idle free byte, at once");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 64 * PS_MiB);
    cr_assert_eq(ps_deallocate(f.pool, p, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

/* A random workload with remap and lending (blocks freed behind barriers
 * that pass late) and decay ticks in between: the checker passes after
 * every step, no unmap while the GPU may touch the range, and at the end
 * the device has every byte back. */
Test(pool_decay, random_workload_with_lending_and_ticks_stays_consistent)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    ps_fake_gpu_options_t host = {.virtual_memory = 1};
    cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    enum { LIVE = 40 };
    void *live[LIVE] = {0};
    size_t sizes[LIVE] = {0};
    srand(5);
    uint64_t given = 0;
    for (int step = 0; step < 6000; step++) {
        int i = rand() % LIVE;
        if (live[i]) {
            cr_assert_eq(ps_fake_gpu_note_free(f.gpu, live[i], sizes[i]), PS_OK);
            cr_assert_eq(ps_deallocate(f.pool, live[i], 0, PS_STREAM_NONE), PS_OK);
            live[i] = NULL;
        } else {
            sizes[i] = rand() % 3 ? (size_t)(rand() % 2048 + 1) * 1024 : (size_t)(rand() % 48 + 1) * PS_MiB;
            cr_assert_eq(ps_allocate(f.pool, sizes[i], PS_STREAM_NONE, &live[i]), PS_OK, "step %d", step);
        }
        if (step % 7 == 0) /* the GPU catches up now and then */
            ps_fake_gpu_complete_barriers_upto(f.gpu, ps_fake_gpu_barriers(f.gpu) > 2 ? ps_fake_gpu_barriers(f.gpu) - 2 : 0);
        if (step % 5 == 0)
            given += ps_decay(f.pool, (uint64_t)step * SEC / 50, step % 40 ? DECAY / 8 : 0, 0);
        cr_assert_eq(ps_pool_check(f.pool), PS_OK, "step %d", step);
    }
    ps_resource_info_t info = fixture_info(f.pool);
    cr_log_info("lending and ticks: %llu bytes given by the decay, %llu remaps lent", (unsigned long long)given,
                (unsigned long long)info.remaps_lent);
    cr_assert_gt(given, 0);
    cr_assert_gt(info.remaps_lent + info.remaps_idle + info.remap_waits, 0, "the workload moved pieces");
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    for (int i = 0; i < LIVE; i++)
        if (live[i])
            cr_assert_eq(ps_deallocate(f.pool, live[i], 0, PS_STREAM_NONE), PS_OK);
    ps_fake_gpu_complete_all(f.gpu);
    ps_decay(f.pool, 1000 * SEC, 0, 0);
    ps_decay(f.pool, 1000 * SEC, 0, 0);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_decay, the_piece_mapped_with_the_pool_goes_back_when_nothing_uses_it)
{
    /* expandable_map_first maps a piece at the context's creation; a
     * program that never allocates must not hold it past the decay */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.expandable_map_first = 1;
    fixture_open_on(&f, (ps_fake_gpu_options_t){.virtual_memory = 1}, &o);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 2 * PS_MiB, "the piece mapped with the pool");
    cr_assert_eq(tick(&f, SEC, 4 * SEC), 0, "a window not yet seen whole: nothing goes");
    ps_fake_gpu_complete_barriers_upto(f.gpu, ps_fake_gpu_barriers(f.gpu));
    cr_assert_eq(tick(&f, 5 * SEC, 9 * SEC), 2 * PS_MiB, "idle for the whole window: it goes back");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 0, "the device has it back");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}
