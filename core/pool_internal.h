/* The pool's front (core/pool.c): its struct, which holds one of each
 * layer, and what core/pool_check.c, above it, reads. Nothing here is API:
 * core/pool.h is. Each layer's struct and functions are in its own header;
 * the front and the checker are the only files that see them all. */
#ifndef POOLSHIM_POOL_INTERNAL_H
#define POOLSHIM_POOL_INTERNAL_H

#include "pool.h"
#include "pool_caches.h"
#include "pool_decay.h"
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

    /* what every allocation and free reads first, then the rest */
    pool_lists_t lists;         /* blocks, chunks, free lists (core/pool_lists.h) */
    pool_caches_t caches;       /* the quick cache and the size stack (core/pool_caches.h) */
    pool_decay_t decay;         /* the decay's view of the working set (core/pool_decay.h) */
    uint32_t locks_taken;       /* hot-path lock acquisitions in the current window (pool_lock) */
    uint32_t locks_contended;   /* those that found the lock held */
    uint64_t pending_waits;     /* host waits because pending bytes passed the growth bound */
    bool eager_barrier;         /* free_sync barrier with barrier_pending_percent > 0 */
    pool_streams_t streams;     /* epochs, stream lists, barriers (core/pool_streams.h); its
                                   barrier family keeps a cache line of its own */
    pool_expandable_t range;    /* the expandable range (core/pool_expandable.h) */
    pool_growth_t growth;       /* chunks, growth bounds, giving back (core/pool_growth.h) */
} pool_t;

/* A resource is a pool when its ops are these (core/pool.c). */
extern const ps_resource_ops_t pool_ops;

#endif
