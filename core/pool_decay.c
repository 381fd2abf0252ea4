/* The decay: free memory the program has not needed for a while goes back
 * to the device without any call from the program (the pool's `decay`
 * entry, core/resource.h). The shim's timer thread (shim/decay.c) calls it
 * every quarter of global.decay_ms on each device's stacks; a neighbour
 * process that runs out of memory gets the same with decay_ns 0.
 *
 * Algorithm
 *  1. The allocation paths keep decay_high, the most bytes in use since the
 *     last tick (one comparison under the pool lock they hold anyway), and
 *     decay_allocs, a count of allocations. Nothing else on the hot path.
 *  2. A tick (decay_ns > 0) takes the pool lock only if it is free (a busy
 *     pool skips the tick: an allocating thread never waits for the decay)
 *     and pushes (now, decay_high, decay_allocs) into a ring of DECAY_TICKS;
 *     decay_high starts again at the bytes in use now.
 *  3. keep = the most bytes in use in the last decay_ns: the highs of the
 *     ticks inside the window, and the bytes in use now. The pool is idle
 *     when no allocation happened in the window (the count at the newest
 *     tick at or before the window's start equals the count now); before a
 *     whole window has been seen it is not idle.
 *  4. Slack: an idle pool keeps nothing beyond keep; a busy one keeps
 *     keep / 4 + 2 MiB more, and gives back only above that. A loop whose
 *     peak repeats inside the window holds its working set plus the free
 *     space between its blocks, which is what it needs to run without
 *     growing: 1.006-1.014x its peak in use on the PyTorch logs, 1.09x in
 *     tests/unit/test_pool_decay.c's loop, where a slack of keep / 16 gave
 *     back 4-24 MiB every window and mapped it again (churn). A busy
 *     program whose need fell by more than a fifth gives the rest back.
 *  5. A tick that finds no allocation since the tick before makes pending
 *     memory ready at once (below), so that the barrier has passed when the
 *     window ends. Above keep + slack: pending memory is made ready where that needs no
 *     wait (free_sync barrier: a barrier, which refuses while a capture is
 *     open; free_sync event: the open batch closed, completed fences
 *     polled); parked blocks rejoin the free lists; an idle pool drains its
 *     threads' caches. Then pool_release_idle_locked(keep + slack, newest
 *     passed barrier) unmaps whole free runs and returns wholly free chunks
 *     that the GPU has provably finished with. Never a device synchronize,
 *     never a host wait: a block whose barrier has not passed yet goes at a
 *     later tick.
 *  6. decay_ns 0 (a neighbour asks): keep = the bytes in use now, no slack,
 *     the ring untouched. want > 0 bounds what goes: at most about want
 *     bytes (the neighbour's request; the rest when it asks again).
 *  7. The give-back goes DECAY_STEP at a time and lets the lock go in
 *     between; if an allocating thread took it meanwhile, the rest waits
 *     for a later tick. Unmapping is the slow part (2 MiB pieces on an
 *     H200: ~45 us each on one GPU, ~65 us with a peer GPU mapping them;
 *     tests/gpu/decay_idle.cu gave back 112 GiB in 2.5 s and 6+ s), so a
 *     whole-card give-back in one go would hold the pool for seconds.
 *  8. Giving back takes time (the CUDA calls: ~29 us per 2 MiB piece, 0.35
 *     ms per 1 GiB run on an H200, tests/gpu/unmap_cost_probe.cu), and a
 *     neighbour waits for it. So an idle pool starts early by the time its
 *     give-back is expected to take, at most three quarters of the window:
 *     the pool is idle if it was idle over the window less that lead, and
 *     then it keeps only what it used in that shorter window. The time is
 *     counted mostly in runs (and chunks), which is what the calls cost
 *     by: the free bytes over the pool's mean run (reserved bytes over
 *     runs mapped now) times a time per run, plus RELEASE_PS_PER_BYTE for
 *     each byte. Every give-back of RATE_SAMPLE_RUNS or more measures the
 *     time per run (a moving average over every pool, starting at 44 us:
 *     tests/gpu/decay_idle.cu's 112 GiB of 2 MiB pieces in 2.5 s on an
 *     H200); the byte term is fixed (1,789 runs of 64 MiB took 202 ms on
 *     an H200, 113 us each: 44 us a run and ~1 ps a byte; a neighbour
 *     process had that memory 0.92 s into a 1 s decay and 4.90 s into the
 *     default 5 s, tests/gpu/neighbours.cu). Counted in
 *     bytes alone, as before 2026-11-27, 112 GiB in 64 MiB runs (made
 *     before the first free, expandable_setup_run_min) looked as slow as
 *     in pieces and went back after 0.32 s of a 1 s decay (2 x H200). A
 *     pool whose free memory is in smaller runs than its mean (pieces
 *     beside one big run) starts late rather than early: back a little
 *     after decay_ms.
 *     Memory a program freed is then back within decay_ms of its last
 *     allocation, not decay_ms plus the unmapping (112 GiB: 2.5 s more).
 *     The cap bounds how short a pause may be taken for idleness: with the
 *     default 5 s, a pool is idle after 0.94 s at the least (a pause that
 *     long with that much memory free costs a growth afterwards, at about
 *     what native cudaMalloc costs).
 * Guarantees: the decay never blocks an allocating thread, never waits on
 * the GPU, and never gives back memory a kernel may still touch.
 */
#include <stdatomic.h>

#include "pool_internal.h"

/* The most one step gives back before the lock is let go (7. above):
 * ~1000 pieces, 50-130 ms of unmapping. */
#define DECAY_STEP (2 * PS_GiB)

/* The least slack of a busy pool (4. above). */
#define DECAY_SLACK_MIN (2 * PS_MiB)

/* 8. above: nanoseconds one run (or chunk) given back takes, a moving
 * average over every pool's give-backs of at least RATE_SAMPLE_RUNS (the
 * start: 2 MiB pieces on an H200). Read and written without a lock: a
 * lost update only delays the average by one sample. */
#define RELEASE_NS_PER_RUN_START 44000
static _Atomic uint64_t release_ns_per_run = RELEASE_NS_PER_RUN_START;
#define RATE_SAMPLE_RUNS 16
#define RELEASE_PS_PER_BYTE 1

void ps_pool_decay_set_release_rate(uint64_t ns_per_run) { atomic_store(&release_ns_per_run, ns_per_run); }
uint64_t ps_pool_decay_release_rate_default(void) { return RELEASE_NS_PER_RUN_START; }

/* How much earlier than the window an idle pool starts to give back (8.). */
static uint64_t early_start_ns(const pool_t *pool, uint64_t window_ns)
{
    uint64_t rate = atomic_load_explicit(&release_ns_per_run, memory_order_relaxed);
    uint64_t free_bytes = pool->lists.bytes_reserved > pool->lists.bytes_in_use ? pool->lists.bytes_reserved - pool->lists.bytes_in_use : 0;
    uint64_t mapped = pool->lists.upstream_allocs > pool->lists.upstream_frees ? pool->lists.upstream_allocs - pool->lists.upstream_frees : 0;
    if (!rate || !free_bytes || !mapped)
        return 0; /* (rate 0: the tests' switch) */
    uint64_t mean_run = pool->lists.bytes_reserved / mapped ? pool->lists.bytes_reserved / mapped : 1;
    uint64_t runs = (free_bytes + mean_run - 1) / mean_run;
    uint64_t lead = runs > UINT64_MAX / rate ? UINT64_MAX : runs * rate + free_bytes / 1000 * RELEASE_PS_PER_BYTE;
    uint64_t cap = window_ns / 4 * 3;
    return lead < cap ? lead : cap;
}

/* Takes one give-back's duration into the rate (8.). */
static void measure_release(uint64_t runs, uint64_t bytes, uint64_t ns)
{
    if (runs < RATE_SAMPLE_RUNS)
        return;
    uint64_t by_bytes = bytes / 1000 * RELEASE_PS_PER_BYTE;
    uint64_t sample = ns > by_bytes ? (ns - by_bytes) / runs : 0;
    uint64_t old = atomic_load_explicit(&release_ns_per_run, memory_order_relaxed);
    atomic_store_explicit(&release_ns_per_run, (3 * old + sample) / 4, memory_order_relaxed);
}

/* 3. above: keep and idleness over the window ending at `now_ns`. */
static uint64_t window_keep_locked(const pool_t *pool, uint64_t now_ns, uint64_t decay_ns, int *idle)
{
    uint64_t keep = pool->lists.bytes_in_use;
    uint64_t start = now_ns > decay_ns ? now_ns - decay_ns : 0;
    uint64_t before_at = 0, before_allocs = 0; /* the newest tick at or before the window's start */
    int seen_before = 0;
    for (unsigned i = 0; i < DECAY_TICKS; i++) {
        const pool_decay_tick_t *t = &pool->decay_ring[i];
        if (!t->at_ns)
            continue;
        if (t->at_ns > start) {
            if (t->high > keep)
                keep = t->high;
        } else if (!seen_before || t->at_ns > before_at) {
            before_at = t->at_ns;
            before_allocs = t->allocs;
            seen_before = 1;
        }
    }
    *idle = seen_before && before_allocs == pool->lists.blocks_taken;
    return keep;
}

/* 5. above: pending memory made ready without a wait. */
static void ready_pending_locked(pool_t *pool)
{
    if (pool->options.free_sync == PS_FREE_SYNC_BARRIER) {
        if (pool_streams_pending(&pool->streams))
            pool_barrier_locked(pool);
    } else if (pool->options.free_sync == PS_FREE_SYNC_EVENT) {
        pool_streams_close_open_and_poll(&pool->streams);
    }
}

uint64_t pool_decay(ps_resource_t *r, uint64_t now_ns, uint64_t decay_ns, uint64_t want)
{
    pool_t *pool = (pool_t *)r;
    if (!pool->gpu || !ps_lock_try(&pool->lock))
        return 0;
    uint64_t keep = pool->lists.bytes_in_use, slack = 0;
    int idle = 1;
    if (decay_ns) {
        /* quiet since the last tick: make pending memory ready now, so its
         * barrier has passed by the time the window ends (5. above) */
        const pool_decay_tick_t *last = &pool->decay_ring[(pool->decay_next + DECAY_TICKS - 1) % DECAY_TICKS];
        if (last->at_ns && last->allocs == pool->lists.blocks_taken && pool_streams_pending(&pool->streams))
            ready_pending_locked(pool);
        pool_decay_tick_t *t = &pool->decay_ring[pool->decay_next];
        *t = (pool_decay_tick_t){now_ns ? now_ns : 1, pool->decay_high, pool->lists.blocks_taken};
        pool->decay_next = (pool->decay_next + 1) % DECAY_TICKS;
        pool->decay_high = pool->lists.bytes_in_use;
        keep = window_keep_locked(pool, now_ns, decay_ns, &idle);
        uint64_t lead = idle ? 0 : early_start_ns(pool, decay_ns);
        if (lead) { /* 8. above: idle over the window less the give-back's expected time? */
            int idle_early;
            uint64_t keep_early = window_keep_locked(pool, now_ns, decay_ns - lead, &idle_early);
            if (idle_early) {
                idle = 1;
                keep = keep_early;
            }
        }
        if (!idle)
            slack = keep / 4 + DECAY_SLACK_MIN;
    }
    uint64_t given = 0, target = keep + slack;
    if (want && pool->lists.bytes_reserved > want && pool->lists.bytes_reserved - want > target)
        target = pool->lists.bytes_reserved - want;
    if (pool->lists.bytes_reserved > target) {
        ready_pending_locked(pool);
        pool_caches_flush(&pool->caches, &pool->lists);
        if (idle && pool->tcache)
            ps_tcache_drain_all_locked(pool->tcache);
        uint64_t passed = pool_newest_passed(pool->gpu);
        for (;;) { /* DECAY_STEP at a time, the lock let go in between (7. above) */
            uint64_t step = pool->lists.bytes_reserved > target + DECAY_STEP ? pool->lists.bytes_reserved - DECAY_STEP : target;
            uint64_t started = ps_now_ns(), frees = pool->lists.upstream_frees;
            uint64_t g = pool_growth_release_idle(&pool->growth, &pool->range, &pool->lists, step, passed);
            measure_release(pool->lists.upstream_frees - frees, g, ps_now_ns() - started);
            given += g;
            if (!g || pool->lists.bytes_reserved <= target)
                break;
            ps_unlock(&pool->lock);
            if (!ps_lock_try(&pool->lock))
                return given; /* an allocating thread came: the rest at a later tick */
        }
    }
    ps_unlock(&pool->lock);
    return given;
}
