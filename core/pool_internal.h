/* The pool's insides: its data structures and the functions its files
 * share, declared under the file that defines them (core/pool.c opens
 * with the pool's algorithm and the map of its files). Nothing here is
 * API: core/pool.h is. Every function below expects the pool's lock held
 * unless its name or comment says otherwise. What every allocation and
 * free runs is inline here, under its file's heading (docs/benchmarks.md,
 * "The pool's design choices", says why). */
#ifndef POOLSHIM_POOL_INTERNAL_H
#define POOLSHIM_POOL_INTERNAL_H

#include "pool.h"
#include "pool_expandable.h"
#include "pool_growth.h"
#include "pool_lists.h"
#include "pool_streams.h"
#include "ptr_map.h"
#include "thread_cache.h"
#include "vm_range.h"

#include <stdatomic.h>
#include <stdint.h>

#define MIN_ALIGNMENT 256              /* cudaMalloc's documented alignment */
#define QUICK_SLOTS 32                 /* quick cache: recently freed blocks by exact size */
#define STACK_MAX 1024                   /* size stack: released blocks of one size kept unmerged */

/* One tick of the decay (core/pool_decay.c). DECAY_TICKS covers a window
 * of four ticks with room for late ones. */
#define DECAY_TICKS 8
typedef struct pool_decay_tick {
    uint64_t at_ns;  /* when (0: unused) */
    uint64_t high;   /* most bytes in use between the tick before and this one */
    uint64_t allocs; /* the allocation count then */
} pool_decay_tick_t;

typedef struct pool {
    ps_resource_t base;         /* the resource (first member) */
    ps_pool_options_t options;  /* effective options */
    const ps_gpu_ops_t *gpu;    /* fences and stream waits (NULL: free_sync none only) */
    ps_tcache_t *tcache;        /* per-thread caches in front of the pool (options.thread_cache), or NULL */
    size_t tcache_max_block;    /* largest block the caches keep (0: no caches) */
    /* Everything above is fixed once the pool is made and read by every
     * allocation and free, by every thread: the lock and what it guards
     * start on another cache line, so a thread taking the lock does not
     * take that line away from the threads served by their caches
     * (16 threads: they did). */
    _Alignas(64) ps_lock_t lock; /* guards everything below but the family (a spinlock: sections are short) */

    pool_lists_t lists;         /* blocks, chunks, free lists (core/pool_lists.h) */
    pool_expandable_t range;    /* the expandable range (core/pool_expandable.h) */
    pool_growth_t growth;       /* chunks, growth bounds, giving back (core/pool_growth.h) */

    uint32_t quick[QUICK_SLOTS]; /* quick cache: a parked ready block per size slot, or NIL */
    uint32_t quick_mask;        /* bit s: quick[s] holds a block */
    uint32_t stack_head;        /* size stack: the newest parked block a barrier (or fence) released, or NIL */
    uint32_t stack_count;       /* blocks in it (at most STACK_MAX), linked newest first by next_free */
    size_t stack_size;          /* the size of every block in it */
    unsigned alignment_log2;    /* log2(alignment), for the quick cache's slot */
    uint32_t locks_taken;       /* hot-path lock acquisitions in the current window (pool_lock) */
    uint32_t locks_contended;   /* those that found the lock held */

    uint64_t pending_waits;     /* host waits because pending bytes passed the growth bound */
    uint64_t decay_high;        /* decay: most bytes in use since the last tick (core/pool_decay.c) */
    pool_decay_tick_t decay_ring[DECAY_TICKS]; /* decay: the last ticks, oldest overwritten */
    unsigned decay_next;        /* decay: the ring's next slot */

    int eager_barrier;          /* 1: free_sync barrier with barrier_pending_percent > 0 */
    pool_streams_t streams;     /* epochs, stream lists, barriers (core/pool_streams.h); last: its
                                   barrier family keeps a cache line of its own */
} pool_t;

/* ---- pool_decay.c: free memory not needed for a while goes back -------- */
uint64_t pool_decay(ps_resource_t *r, uint64_t now_ns, uint64_t decay_ns, uint64_t want);

/* After a locked allocation, pool lock held: the decay's view of the
 * working set (its count of allocations is lists.blocks_taken). */
static inline void pool_note_allocation(pool_t *pool)
{
    if (pool->lists.bytes_in_use > pool->decay_high)
        pool->decay_high = pool->lists.bytes_in_use;
}

/* ---- pool_caches.c: quick cache, size stack, thread caches, contention ---- */
void pool_stack_flush_locked(pool_t *pool);
void pool_quick_flush_locked(pool_t *pool);
uint64_t pool_largest_free_locked(const pool_t *pool);
/* The reuse state's release callback (core/reuse.h): `item` is a descriptor index. */
void pool_release_pending(void *owner, uint64_t item);
/* The thread caches' callbacks (core/thread_cache.h); the barrier runs without the pool's lock. */
void pool_tcache_give_back_locked(void *owner, const ps_tcache_block_t *blocks, size_t count);
int pool_tcache_barrier(void *owner, uint64_t tag);
void pool_tcache_refill_room_locked(pool_t *pool, size_t need, size_t room);
int pool_tcache_drain_locked(pool_t *pool, size_t need, int stream_allocation, int force, void **out);
void pool_note_contention_locked(pool_t *pool, uint32_t count);

/* The quick cache's slot for a block of `size` bytes. */
static inline uint32_t quick_slot(const pool_t *pool, size_t size)
{
    return (uint32_t)(size >> pool->alignment_log2) & (QUICK_SLOTS - 1);
}

/* A parked block of exactly `size` bytes, taken as used, or NIL. Needs a
 * reserved in-use map slot. */
static inline uint32_t pool_quick_take(pool_t *pool, size_t size)
{
    uint32_t slot = quick_slot(pool, size);
    uint32_t index = pool->quick[slot];
    if (index == NIL || pool->lists.blocks[index].size != size)
        return NIL;
    pool->quick[slot] = NIL;
    pool->quick_mask &= ~(1u << slot);
    pool_lists_take_parked(&pool->lists, index);
    return index;
}

/* Parks ready block `index` (a cudaFree under free_sync none) in the quick
 * cache; the block parked in its slot before is merged into the lists. */
static inline void pool_quick_park(pool_t *pool, uint32_t index)
{
    uint32_t slot = quick_slot(pool, pool->lists.blocks[index].size);
    uint32_t evicted = pool->quick[slot];
    pool->quick[slot] = index;
    pool->quick_mask |= 1u << slot;
    pool_lists_park(&pool->lists, index, IDLE_NEVER); /* a cudaFree under free_sync none: a kernel may still use it */
    if (evicted != NIL)
        pool_lists_unpark(&pool->lists, evicted);
}

/* A parked block of the stack, taken as used (the caller checked its size).
 * Needs a reserved in-use map slot. */
static inline uint32_t pool_stack_take(pool_t *pool)
{
    uint32_t index = pool->stack_head;
    pool->stack_head = pool->lists.blocks[index].next_free;
    pool->stack_count--;
    pool_lists_take_parked(&pool->lists, index);
    return index;
}

/* The hot paths take the lock here: while thread caches keep no cudaFree'd
 * blocks, it counts how often the lock was found held, and when threads
 * met on it in 1 of LOCK_WINDOW / LOCK_CONTENDED_SHARE acquisitions of a
 * window, the caches start keeping them (core/thread_cache.h). */
#define LOCK_WINDOW 4096
#define LOCK_CONTENDED_SHARE 16
static inline void pool_lock(pool_t *pool)
{
    if (__builtin_expect(ps_lock_try(&pool->lock), 1)) {
        if (pool->tcache && ++pool->locks_taken == LOCK_WINDOW)
            pool->locks_taken = pool->locks_contended = 0;
        return;
    }
    ps_lock_slow(&pool->lock);
    pool_note_contention_locked(pool, 1);
}

/* After a locked allocation of `need` (<= tcache_max_block) bytes. */
static inline __attribute__((always_inline)) void pool_tcache_refill_locked(pool_t *pool, size_t need)
{
    size_t room = ps_tcache_refill_room_locked(pool->tcache, need);
    if (room)
        pool_tcache_refill_room_locked(pool, need, room);
}

/* ---- pool.c: the recipe ------------------------------------------------ */
extern const ps_resource_ops_t pool_ops; /* (a resource is a pool when its ops are these) */
int pool_try_ready_locked(pool_t *pool, size_t need, void **out);
bool pool_barrier_locked(pool_t *pool);

#endif
