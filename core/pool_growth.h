/* The pool's growth (core/pool_growth.c): chunks from the upstream, the
 * growth budget and its floor, and giving memory back, for chunks and,
 * through core/pool_expandable.h, for the expandable range. Above the
 * range and the lists; it calls nothing above. Every function expects
 * the pool's lock held. */
#ifndef POOLSHIM_POOL_GROWTH_H
#define POOLSHIM_POOL_GROWTH_H

#include "gpu_ops.h"
#include "pool_expandable.h"
#include "pool_lists.h"
#include "pool_options.h"
#include "resource.h"

#include <stdbool.h>

#define GROWTH_GRANULE (2 * PS_MiB) /* chunks are multiples of this unless chunk_granule says otherwise */

typedef struct pool_growth {
    const ps_pool_options_t *options; /* the pool's */
    const ps_gpu_ops_t *gpu;          /* NULL: free_sync none only */
    ps_resource_t *upstream;          /* where chunks come from and go back to */
    const char *name;                 /* the pool's, for messages */
    uint64_t in_use_high;             /* most of in use + need seen at a growth (grow_budget_percent) */
} pool_growth_t;

/* Where reserved stands against the budget floor (grow_budget_min) for a
 * request: what the epochs' amortization near the floor needs to know. */
typedef enum pool_budget_floor {
    POOL_FLOOR_NONE,  /* no floor, or more than it is reserved */
    POOL_FLOOR_AT,    /* at most the floor is reserved, but the request does not fit under it */
    POOL_FLOOR_UNDER  /* reserved + the request fit under the floor */
} pool_budget_floor_t;

void pool_growth_init(pool_growth_t *growth, const ps_pool_options_t *options, const ps_gpu_ops_t *gpu,
                      ps_resource_t *upstream, const char *name);
/* Gives every chunk back to the upstream and every range's memory (at
 * the pool's destruction). */
void pool_growth_destroy(pool_growth_t *growth, pool_lists_t *lists);
/* Takes one chunk of `chunk_size` bytes (at least `need` usable) from the
 * upstream into the ready list; *grown = its block. Needs one reserved
 * descriptor. */
int pool_growth_add_chunk(pool_growth_t *growth, pool_lists_t *lists, size_t chunk_size, size_t need,
                          uint32_t *grown);
/* Grows by one chunk big enough for `need` bytes, never past maximum_size,
 * halved down to the request while the upstream refuses; *grown = its
 * ready block. */
int pool_growth_add_chunk_for(pool_growth_t *growth, pool_lists_t *lists, size_t need, uint32_t *grown);
/* The growth bound allowed now: max(pending_wait_bytes, pending_wait_percent % of reserved). */
uint64_t pool_growth_pending_bound(const pool_growth_t *growth, const pool_lists_t *lists);
/* The growth budget (grow_budget_percent): a growth for `need` bytes must
 * leave at most the budget reserved. true when it would not: *keep = the
 * reserved bytes to give back down to. */
bool pool_growth_over_budget(pool_growth_t *growth, const pool_lists_t *lists, size_t need, uint64_t *keep);
/* Where reserved + `need` stand against the budget floor. */
pool_budget_floor_t pool_growth_floor(const pool_growth_t *growth, const pool_expandable_t *vm,
                                      const pool_lists_t *lists, size_t need);
/* Gives wholly free ready chunks back to the upstream and (expandable)
 * unmaps whole free pieces after a device synchronize, until at most
 * `keep` bytes are reserved. Parked blocks must have been merged. */
void pool_growth_release_free(pool_growth_t *growth, pool_expandable_t *vm, pool_lists_t *lists, uint64_t keep);
/* The same, down to `keep`, but only memory the GPU has provably finished
 * with, idle at barrier `passed`, with no device synchronize. Returns the
 * bytes given back. */
uint64_t pool_growth_release_idle(pool_growth_t *growth, pool_expandable_t *vm, pool_lists_t *lists, uint64_t keep,
                                  uint64_t passed);

#endif
