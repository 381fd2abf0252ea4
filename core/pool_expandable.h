/* The pool's expandable range (core/pool_expandable.c): ranges of virtual
 * addresses that grow in place piece by piece, move free pieces to where
 * a growth needs them (remap) and lend busy ones. Above the lists
 * (core/pool_lists.h), which it asks for blocks and chunk slots; it calls
 * nothing above. A remap needs a barrier, which only the front issues: a
 * growth is begun (pool_expandable_begin), the front issues the barrier
 * the growth asks for, and the growth is finished with what came of it
 * (pool_expandable_finish). Every function expects the pool's lock held. */
#ifndef POOLSHIM_POOL_EXPANDABLE_H
#define POOLSHIM_POOL_EXPANDABLE_H

#include "gpu_ops.h"
#include "pool_lists.h"
#include "pool_options.h"
#include "resource.h"
#include "vm_range.h"

#include <stdatomic.h>
#include <stdbool.h>

/* Remap's credit (pool_expandable_earn): a burst of REMAP_BURST remaps,
 * counted in 1/REMAP_CREDIT_UNIT. */
#define REMAP_CREDIT_UNIT 1000u
#define REMAP_BURST 16u

typedef struct pool_expandable {
    const ps_pool_options_t *options; /* the pool's */
    const ps_gpu_ops_t *gpu;          /* virtual memory, barriers, synchronize */
    const char *name;                 /* the pool's, for messages */
    bool on;                  /* growth maps pieces of ranges, not chunks (options.expandable and
                                 the GPU has virtual memory) */
    atomic_int freed;         /* 1 once a block was freed to the pool (expandable_setup_run_min);
                                 written before any lock (pool_expandable_note_free) */
    uint32_t unmapped_head;   /* UNMAPPED blocks, linked by prev_free/next_free */
    uint64_t bytes_unmapped;  /* sum of their sizes */
    uint32_t lent_head;       /* LENT blocks, linked by prev_free/next_free */
    uint64_t bytes_lent;      /* sum of their sizes (their memory counts where it serves now) */
    ps_vm_stash_t stash;      /* remap: pieces unmapped with their memory kept for the growth
                                 (empty between growths) */
    uint64_t remap_credit;    /* remaps allowed now, in 1/REMAP_CREDIT_UNIT (earned by turnover) */
    bool lend_refused;        /* mapping lent memory a second time failed (not for lack of
                                 memory): this pool no longer lends */
    uint64_t peak_need_in_use; /* most bytes in use + the need at a growth (remap_slack_percent) */
    uint64_t remap_syncs;     /* device synchronizes before moving free pieces to a growth */
    uint64_t remaps_idle;     /* remaps that moved idle pieces without a device synchronize */
    uint64_t remap_waits;     /* remaps that waited for the barrier that released the pieces */
    uint64_t remaps_slack;    /* remaps left out for a growth within remap_slack_percent */
    uint64_t remaps_lent;     /* remaps that lent busy pieces' memory instead of a wait */
} pool_expandable_t;

/* A growth of the range: map [start, start + length) of unmapped block `block`. */
typedef struct pool_growth_plan {
    uint32_t block;   /* the unmapped block, or NIL: none can serve */
    uintptr_t start;  /* first address to map */
    size_t length;    /* bytes to map (whole pieces) */
    bool alone;       /* apart from any free block (a run of its own) */
} pool_growth_plan_t;

/* One growth of the range, begun before the barrier its remap may ask for
 * and finished after it. */
typedef struct pool_range_growth {
    size_t need;              /* the request: the ready block made must hold it */
    pool_growth_plan_t plan;  /* what to map */
    uint64_t passed;          /* the newest barrier known passed, or not asked yet */
    uint32_t lent_before;     /* the lent list's head before the growth */
    bool wants_barrier;       /* a remap may move free pieces: it wants a barrier first */
} pool_range_growth_t;

/* The range side of a pool: on when `gpu` has virtual memory and the
 * options ask for it. */
void pool_expandable_init(pool_expandable_t *vm, const ps_pool_options_t *options, const ps_gpu_ops_t *gpu,
                          const char *name);
void pool_expandable_destroy(pool_expandable_t *vm);
/* A free reached the pool: setup runs end (lock-free, once). */
static inline void pool_expandable_note_free(pool_expandable_t *vm)
{
    if (__builtin_expect(!atomic_load_explicit(&vm->freed, memory_order_relaxed), 0))
        atomic_store_explicit(&vm->freed, 1, memory_order_relaxed);
}
/* Reserves the first range at the pool's creation (nothing mapped), so
 * the first growth does not pay for it; a failure is left to that growth. */
void pool_expandable_reserve_first_range(pool_expandable_t *vm, pool_lists_t *lists);
/* expandable_map_first: the bytes of the first piece to map at the pool's
 * creation (two descriptors reserved), or 0 (nothing to map). */
size_t pool_expandable_first_piece(const pool_expandable_t *vm, pool_lists_t *lists);
/* Begins a growth for a ready block of `need` bytes: lent addresses whose
 * barrier passed are unmapped first, the growth is planned (reserving
 * another range when no unmapped block can serve), and g->wants_barrier
 * says whether a remap wants a barrier before it goes on. */
int pool_expandable_begin(pool_expandable_t *vm, pool_lists_t *lists, size_t need, pool_range_growth_t *g);
/* Finishes growth `g`; `barrier`: the barrier it wanted was issued (the
 * remap may go on). Maps the plan as a ready free block merged with its
 * free neighbours, *grown = that block. A growth that lent pieces and
 * failed takes them back and says so in *lent (the caller may try once
 * more without lending). Needs two reserved descriptors. */
int pool_expandable_finish(pool_expandable_t *vm, pool_lists_t *lists, pool_range_growth_t *g, bool barrier,
                           uint32_t *grown, bool *lent);
/* Lending stops (`refused`) or may go on. */
static inline void pool_expandable_refuse_lending(pool_expandable_t *vm, bool refused)
{
    vm->lend_refused = refused;
}
/* `released` bytes of cudaFree'd memory that a barrier released earn remap credit. */
void pool_expandable_earn(pool_expandable_t *vm, const pool_lists_t *lists, uint64_t released);
/* Gives memory back: after a device synchronize, every whole run inside
 * a ready free block is unmapped until at most `keep` bytes are reserved. */
void pool_expandable_unmap_free_pieces(pool_expandable_t *vm, pool_lists_t *lists, uint64_t keep);
/* Unmaps the lent addresses idle at barrier `passed` (IDLE_NEVER: the
 * device was synchronized). true when none of those is left. */
bool pool_expandable_return_lent(pool_expandable_t *vm, pool_lists_t *lists, uint64_t passed);
/* The whole runs inside ready free block `index` of `range`, as [*lo, *hi). */
bool pool_expandable_whole_pieces(const pool_lists_t *lists, const ps_vm_range_t *range, uint32_t index,
                                  uintptr_t *lo, uintptr_t *hi);
/* [lo, hi) (whole runs) cut to the runs that give back `want` bytes and
 * no more than a run beyond: the new hi. */
uintptr_t pool_expandable_runs_for(const ps_vm_range_t *range, uintptr_t lo, uintptr_t hi, uint64_t want);
/* Unmaps the whole pieces of ready free block `index` (of chunk `slot`)
 * in [lo, hi), their memory kept in `stash` when not NULL, leaving an
 * UNMAPPED block; *after = the block after the hole. Returns the bytes
 * unmapped. The caller made sure no kernel can touch them and reserved
 * two descriptors. */
size_t pool_expandable_unmap_block_pieces(pool_expandable_t *vm, pool_lists_t *lists, uint32_t slot,
                                          uint32_t index, uintptr_t lo, uintptr_t hi, ps_vm_stash_t *stash,
                                          uint32_t *after);
/* Adds the remap counters and the expandable flag to *info. */
void pool_expandable_add_counters(const pool_expandable_t *vm, ps_resource_info_t *info);
/* The newest barrier the GPU has passed (IDLE_NOW: none known): a ready
 * block with idle_gen <= it is idle. */
uint64_t pool_newest_passed(const ps_gpu_ops_t *gpu);

/* Test hooks (the negative controls of core/pool.h). */
void pool_expandable_test_skip_idle_check(bool on);
void pool_expandable_test_return_lent_at_once(bool on);

#endif
