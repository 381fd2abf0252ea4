/* The pool's parked blocks (core/pool_caches.c): freed blocks held
 * unmerged in front of the lists, counted as free: the quick cache, the
 * size stack, and the blocks the threads' caches (core/thread_cache.c)
 * take and give back. Above the stream lists (a block a thread cache
 * gives back goes where its free would have gone) and the lists; it calls
 * nothing above. Every function expects the pool's lock held. What every
 * allocation and free runs is inline here. */
#ifndef POOLSHIM_POOL_CACHES_H
#define POOLSHIM_POOL_CACHES_H

#include "gpu_ops.h"
#include "pool_lists.h"
#include "pool_options.h"
#include "pool_streams.h"
#include "thread_cache.h"

#include <stdbool.h>

#define QUICK_SLOTS 32  /* quick cache: recently freed blocks by exact size */
#define STACK_MAX 1024  /* size stack: released blocks of one size kept unmerged */

typedef struct pool_caches {
    const ps_pool_options_t *options; /* the pool's */
    const ps_gpu_ops_t *gpu;          /* the newest barrier, for blocks the thread caches give back */
    pool_lists_t *lists;              /* the pool's lists, and its epochs, for the epochs' release */
    const pool_streams_t *streams;    /*   callback, which gets only this struct */
    size_t stack_small;               /* options.small_from_back: such blocks are stacked in any pool */
    uint64_t stack_reserved;          /* twice options.barrier_floor: a pool of at most this stacks any block */
    uint32_t quick[QUICK_SLOTS];      /* quick cache: a parked ready block per size slot, or NIL */
    uint32_t quick_mask;              /* bit s: quick[s] holds a block */
    uint32_t stack_head;              /* size stack: the newest parked block a barrier (or fence) released, or NIL */
    uint32_t stack_count;             /* blocks in it (at most STACK_MAX), linked newest first by next_free */
    size_t stack_size;                /* the size of every block in it */
    unsigned alignment_log2;          /* log2(alignment), for the quick cache's slot */
} pool_caches_t;

/* Empty caches in front of `lists`, taking the blocks the epochs of
 * `streams` release. */
void pool_caches_init(pool_caches_t *caches, const ps_pool_options_t *options, const ps_gpu_ops_t *gpu,
                      pool_lists_t *lists, const pool_streams_t *streams);
/* Merges the size stack into the ready list. */
void pool_caches_flush_stack(pool_caches_t *caches, pool_lists_t *lists);
/* Merges every parked block, the size stack's and the quick cache's, into
 * the ready list. */
void pool_caches_flush(pool_caches_t *caches, pool_lists_t *lists);
/* The epochs' release callback (core/reuse.h; `caches` its owner): a
 * barrier or fence covers pending block `item`, which joins the size stack
 * or the ready list, idle as the epochs say. */
void pool_caches_release_pending(void *caches, uint64_t item);
/* The largest run a parked block would form with its ready and parked
 * neighbours once merged. */
uint64_t pool_caches_largest_parked(const pool_caches_t *caches, const pool_lists_t *lists);
/* After an allocation of `need` bytes served from the lists: up to `room`
 * (at most 8) more ready blocks of that size go to the calling thread's
 * cache in `tcache`. Never grows. */
void pool_caches_refill(pool_lists_t *lists, ps_tcache_t *tcache, size_t need, size_t room);
/* The thread caches give blocks back (each still a used block here): a
 * ready one joins the ready list, the others go as their free would have
 * gone without the cache. */
void pool_caches_give_back(pool_caches_t *caches, pool_streams_t *streams, pool_lists_t *lists,
                           const ps_tcache_block_t *blocks, size_t count);

/* ---- inline: what every allocation and free runs ----------------------- */

/* The quick cache's slot for a block of `size` bytes. */
static inline uint32_t pool_caches_quick_slot(const pool_caches_t *caches, size_t size)
{
    return (uint32_t)(size >> caches->alignment_log2) & (QUICK_SLOTS - 1);
}

/* A parked block of exactly `size` bytes from the quick cache, taken as
 * used, or NIL. Needs a reserved in-use map slot. */
static inline uint32_t pool_caches_take_quick(pool_caches_t *caches, pool_lists_t *lists, size_t size)
{
    uint32_t slot = pool_caches_quick_slot(caches, size);
    uint32_t index = caches->quick[slot];
    if (index == NIL || lists->blocks[index].size != size)
        return NIL;
    caches->quick[slot] = NIL;
    caches->quick_mask &= ~(1u << slot);
    pool_lists_take_parked(lists, index);
    return index;
}

/* A block of the size stack taken as used when the stack holds blocks of
 * exactly `size` bytes; a stack of another size is merged into the lists
 * first (a request of another size sees every ready block merged). NIL:
 * none taken. Needs a reserved in-use map slot. */
static inline uint32_t pool_caches_take_stacked(pool_caches_t *caches, pool_lists_t *lists, size_t size)
{
    if (caches->stack_head == NIL)
        return NIL;
    if (caches->stack_size != size) {
        pool_caches_flush_stack(caches, lists);
        return NIL;
    }
    uint32_t index = caches->stack_head;
    caches->stack_head = lists->blocks[index].next_free;
    caches->stack_count--;
    pool_lists_take_parked(lists, index);
    return index;
}

/* Parks ready block `index` (a cudaFree under free_sync none) in the quick
 * cache; the block parked in its slot before is merged into the lists. */
static inline void pool_caches_park_quick(pool_caches_t *caches, pool_lists_t *lists, uint32_t index)
{
    uint32_t slot = pool_caches_quick_slot(caches, lists->blocks[index].size);
    uint32_t evicted = caches->quick[slot];
    caches->quick[slot] = index;
    caches->quick_mask |= 1u << slot;
    pool_lists_park(lists, index, IDLE_NEVER); /* a cudaFree under free_sync none: a kernel may still use it */
    if (evicted != NIL)
        pool_lists_unpark(lists, evicted);
}

#endif
