/* The decay (core/pool_decay.h): free memory the program has not needed
 * for a while goes back to the device without any call from the program.
 * The shim's give-back thread (shim/give_back.c) ticks every quarter of
 * global.decay_ms on each device's stacks; a neighbour process that runs
 * out of memory asks the same with decay_ns 0. This file is the policy;
 * the pool's front does the giving back.
 *
 * Algorithm
 *  1. The front notes, after each locked allocation, the most bytes in use
 *     since the last tick (one comparison under the lock it holds); the
 *     count of allocations is the lists' count of blocks taken.
 *  2. A tick (decay_ns > 0) pushes (now, high, allocations) into a ring of
 *     DECAY_TICKS; the high starts again at the bytes in use now.
 *  3. keep = the most bytes in use in the last decay_ns: the highs of the
 *     ticks inside the window, and the bytes in use now. The pool is idle
 *     when no allocation happened in the window (the count at the newest
 *     tick at or before the window's start equals the count now); before a
 *     whole window has been seen it is not idle.
 *  4. Slack: an idle pool keeps nothing beyond keep; a busy one keeps
 *     keep / 4 + 2 MiB more (a loop whose shapes vary needs the free space
 *     between its blocks to run without growing), so a busy program whose
 *     need fell by more than a fifth gives the rest back.
 *  5. Giving back takes time, and a neighbour waits for it: a pool that is
 *     not idle yet over the window is idle early when it was idle over the
 *     window less the give-back's expected time (at most three quarters of
 *     the window), and then keeps only what it used in that shorter
 *     window. The time is counted in runs (and chunks), what the calls
 *     cost by: the free bytes over the pool's mean run, times a time per
 *     run measured on every give-back of RATE_SAMPLE_RUNS or more (a moving
 *     average over every pool), plus RELEASE_PS_PER_BYTE per byte.
 *  6. decay_ns 0 (a neighbour asks): keep = the bytes in use now, no slack,
 *     the ring untouched. want > 0 bounds what goes: about want bytes.
 *  7. A tick that finds no allocation since the tick before asks the front
 *     to make pending memory ready at once, so that its barrier has passed
 *     when the window ends.
 * Guarantees: the policy keeps at least the most bytes in use over the
 * window (or now); it never blocks or waits: the front only tries the
 * pool's lock, gives back only memory a passed barrier proved idle, never
 * synchronizes, and lets the lock go between steps.
 */
#include "pool_decay.h"

#include "common.h"

#include <stdatomic.h>

/* The least slack of a busy pool (the slack, above). */
#define DECAY_SLACK_MIN (2 * PS_MiB)

/* The early start: nanoseconds one run (or chunk) given back takes, a moving
 * average over every pool's give-backs of at least RATE_SAMPLE_RUNS.
 * Read and written without a lock: a lost update only delays the average
 * by one sample. */
#define RELEASE_NS_PER_RUN_START 44000
static _Atomic uint64_t release_ns_per_run = RELEASE_NS_PER_RUN_START;
#define RATE_SAMPLE_RUNS 16
#define RELEASE_PS_PER_BYTE 1

void pool_decay_set_rate(uint64_t ns_per_run)
{
    atomic_store(&release_ns_per_run, ns_per_run);
}

uint64_t pool_decay_rate_default(void)
{
    return RELEASE_NS_PER_RUN_START;
}

/* How much earlier than the window an idle pool starts to give back. */
static uint64_t early_start_ns(const pool_decay_view_t *view, uint64_t window_ns)
{
    uint64_t rate = atomic_load_explicit(&release_ns_per_run, memory_order_relaxed);
    uint64_t free_bytes = view->reserved > view->in_use ? view->reserved - view->in_use : 0;
    if (!rate || !free_bytes || !view->runs)
        return 0; /* (rate 0: the tests' switch) */
    uint64_t mean_run = view->reserved / view->runs ? view->reserved / view->runs : 1;
    uint64_t runs = (free_bytes + mean_run - 1) / mean_run;
    uint64_t lead = runs > UINT64_MAX / rate ? UINT64_MAX : runs * rate + free_bytes / 1000 * RELEASE_PS_PER_BYTE;
    uint64_t cap = window_ns / 4 * 3;
    return lead < cap ? lead : cap;
}

void pool_decay_measure(uint64_t runs, uint64_t bytes, uint64_t ns)
{
    if (runs < RATE_SAMPLE_RUNS)
        return;
    uint64_t by_bytes = bytes / 1000 * RELEASE_PS_PER_BYTE;
    uint64_t sample = ns > by_bytes ? (ns - by_bytes) / runs : 0;
    uint64_t old = atomic_load_explicit(&release_ns_per_run, memory_order_relaxed);
    atomic_store_explicit(&release_ns_per_run, (3 * old + sample) / 4, memory_order_relaxed);
}

/* Keep and idleness over the window of `decay_ns` ending at `now_ns`. */
static uint64_t window_keep(const pool_decay_t *decay, const pool_decay_view_t *view, uint64_t now_ns,
                            uint64_t decay_ns, bool *idle)
{
    uint64_t keep = view->in_use;
    uint64_t start = now_ns > decay_ns ? now_ns - decay_ns : 0;
    uint64_t before_at = 0, before_allocs = 0; /* the newest tick at or before the window's start */
    bool seen_before = false;
    for (unsigned i = 0; i < DECAY_TICKS; i++) {
        const pool_decay_tick_t *t = &decay->ring[i];
        if (!t->at_ns)
            continue;
        if (t->at_ns > start) {
            if (t->high > keep)
                keep = t->high;
        } else if (!seen_before || t->at_ns > before_at) {
            before_at = t->at_ns;
            before_allocs = t->allocs;
            seen_before = true;
        }
    }
    *idle = seen_before && before_allocs == view->allocations;
    return keep;
}

bool pool_decay_quiet(const pool_decay_t *decay, uint64_t allocations)
{
    const pool_decay_tick_t *last = &decay->ring[(decay->next + DECAY_TICKS - 1) % DECAY_TICKS];
    return last->at_ns && last->allocs == allocations;
}

uint64_t pool_decay_tick(pool_decay_t *decay, uint64_t now_ns, uint64_t decay_ns, const pool_decay_view_t *view,
                         uint64_t want, bool *idle)
{
    uint64_t keep = view->in_use, slack = 0;
    *idle = true;
    if (decay_ns) {
        decay->ring[decay->next] = (pool_decay_tick_t){now_ns ? now_ns : 1, decay->high, view->allocations};
        decay->next = (decay->next + 1) % DECAY_TICKS;
        decay->high = view->in_use;
        keep = window_keep(decay, view, now_ns, decay_ns, idle);
        uint64_t lead = *idle ? 0 : early_start_ns(view, decay_ns);
        if (lead) { /* idle over the window less the give-back's expected time? */
            bool idle_early;
            uint64_t keep_early = window_keep(decay, view, now_ns, decay_ns - lead, &idle_early);
            if (idle_early) {
                *idle = true;
                keep = keep_early;
            }
        }
        if (!*idle)
            slack = keep / 4 + DECAY_SLACK_MIN;
    }
    uint64_t target = keep + slack;
    if (want && view->reserved > want && view->reserved - want > target)
        target = view->reserved - want;
    return target;
}
