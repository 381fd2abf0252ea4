/* The decay's policy (core/pool_decay.c): how much of the pool's free
 * memory to give back at a tick, from what the front tells it. The front
 * notes each locked allocation (pool_decay_note) and, at a tick, asks what
 * to keep (pool_decay_tick), gives back down to it and reports how long
 * that took (pool_decay_measure). It calls nothing of the pool. */
#ifndef POOLSHIM_POOL_DECAY_H
#define POOLSHIM_POOL_DECAY_H

#include <stdbool.h>
#include <stdint.h>

/* A window of four ticks with room for late ones. */
#define DECAY_TICKS 8

typedef struct pool_decay_tick {
    uint64_t at_ns;  /* when (0: unused) */
    uint64_t high;   /* most bytes in use between the tick before and this one */
    uint64_t allocs; /* the allocation count then */
} pool_decay_tick_t;

typedef struct pool_decay {
    uint64_t high;                        /* most bytes in use since the last tick */
    pool_decay_tick_t ring[DECAY_TICKS];  /* the last ticks, oldest overwritten */
    unsigned next;                        /* the ring's next slot */
} pool_decay_t;

/* What the pool holds at a tick. */
typedef struct pool_decay_view {
    uint64_t in_use;      /* bytes in use */
    uint64_t reserved;    /* bytes reserved */
    uint64_t allocations; /* allocations so far (blocks taken) */
    uint64_t runs;        /* runs and chunks mapped now */
} pool_decay_view_t;

/* After a locked allocation: the most bytes in use since the last tick. */
static inline void pool_decay_note(pool_decay_t *decay, uint64_t in_use)
{
    if (in_use > decay->high)
        decay->high = in_use;
}

/* No allocation since the last tick: pending memory should be made ready
 * now, so its barrier has passed by the time the window ends. */
bool pool_decay_quiet(const pool_decay_t *decay, uint64_t allocations);
/* A tick at `now_ns` over a window of `decay_ns` (0: a neighbour asks, no
 * window: keep what is in use), `want` > 0 the most a neighbour asks for.
 * Returns the bytes to keep reserved; *idle: no allocation in the window
 * (the threads' caches may be drained too). */
uint64_t pool_decay_tick(pool_decay_t *decay, uint64_t now_ns, uint64_t decay_ns, const pool_decay_view_t *view,
                         uint64_t want, bool *idle);
/* A give-back of `runs` runs and `bytes` bytes took `ns`: the estimate of
 * the time per run (shared by every pool) follows it. */
void pool_decay_measure(uint64_t runs, uint64_t bytes, uint64_t ns);
/* The estimate's value (ns per run; 0 turns the early start off) and its
 * start (the test hooks of core/pool.h). */
void pool_decay_set_rate(uint64_t ns_per_run);
uint64_t pool_decay_rate_default(void);

#endif
