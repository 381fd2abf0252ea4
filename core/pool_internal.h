/* The pool's insides (core/pool.c, core/pool_expandable.c): its data
 * structures and the helpers the two files share. Nothing here is API:
 * core/pool.h is. Every function below expects the pool's lock held
 * unless its name says otherwise. */
#ifndef POOLSHIM_POOL_INTERNAL_H
#define POOLSHIM_POOL_INTERNAL_H

#include "pool.h"
#include "ptr_map.h"
#include "thread_cache.h"
#include "vm_range.h"

#include <stdatomic.h>
#include <stdint.h>

#define SL_LOG2 5                      /* second level: 2^5 classes per power of two */
#define SL_COUNT (1u << SL_LOG2)
#define FL_COUNT 64                    /* first level: one per bit of a size */
#define NIL UINT32_MAX                 /* "no block" */
#define OWNER_READY 0                  /* the ready list's owner index */
#define MAX_OWNERS 65535               /* owner indices fit 16 bits */
#define GROWTH_GRANULE (2 * PS_MiB)    /* growth requests are rounded up to this */
#define MIN_ALIGNMENT 256              /* cudaMalloc's documented alignment */
#define QUICK_SLOTS 32                 /* quick cache: recently freed blocks by exact size */
#define STACK_MAX 1024                   /* size stack: released blocks of one size kept unmerged */
#define IDLE_NOW PS_REUSE_IDLE_NOW     /* idle_gen: nothing issued before can still touch it */
#define IDLE_NEVER PS_REUSE_IDLE_NEVER /* idle_gen: unknown, only a device synchronize makes it idle */

typedef enum block_state {
    BLOCK_UNUSED = 0, /* descriptor on the recycle list */
    BLOCK_FREE,       /* in its owner's TLSF lists */
    BLOCK_USED,       /* handed out, in the in-use map */
    BLOCK_PENDING,    /* freed by cudaFree under free_sync event, in an epoch */
    BLOCK_CACHED,     /* free, parked in the quick cache or the size stack (not in lists, not merged yet) */
    BLOCK_UNMAPPED,   /* part of an expandable range with no memory behind it (in the unmapped list) */
    BLOCK_LENT        /* expandable: still mapped, its memory lent to a growth elsewhere (remap_lend);
                         unmapped once barrier idle_gen passed (in the lent list) */
} block_state_t;

typedef struct pool_block {
    uintptr_t addr;     /* device address */
    size_t size;        /* bytes, a multiple of the alignment */
    uint64_t free_stamp; /* free counter when it joined a stream list (0 in the ready list) */
    uint64_t idle_gen;  /* free: once barrier number idle_gen has passed, no GPU work can touch it
                           (0: idle now; IDLE_NEVER: unknown) — remap unmaps it without a synchronize */
    uint32_t prev_phys; /* block just below in the chunk, or NIL */
    uint32_t next_phys; /* block just above in the chunk, or NIL */
    uint32_t prev_free; /* free list links (next_free also links the recycle list) */
    uint32_t next_free;
    uint32_t chunk;     /* index of its chunk */
    uint16_t owner;     /* owner whose lists hold it (when free) */
    uint8_t state;      /* block_state_t */
} pool_block_t;

typedef struct pool_chunk {
    void *base;           /* pointer from the upstream (NULL: slot unused) */
    size_t base_size;     /* bytes asked from the upstream */
    uintptr_t addr;       /* first usable (aligned) address */
    size_t size;          /* usable bytes (expandable: the whole range, mapped or not) */
    uint32_t first_block; /* block at addr */
    ps_vm_range_t *range; /* expandable: the range behind the chunk; NULL: an upstream chunk */
} pool_chunk_t;

typedef struct pool_owner {
    ps_stream_t stream;                   /* the stream (PS_STREAM_NONE for the ready list) */
    uint64_t fl_bitmap;                   /* bit f: some list of first level f is non-empty */
    uint32_t sl_bitmap[FL_COUNT];         /* bit s of [f]: list (f, s) is non-empty */
    uint32_t heads[FL_COUNT][SL_COUNT];   /* list heads */
    uint64_t free_bytes;                  /* bytes in these lists */
    uint64_t free_blocks;                 /* blocks in these lists */
    ps_fence_t *fence;                    /* lazily recorded fence on `stream` (for cudaMalloc), or NULL */
    uint64_t fence_stamp;                 /* it covers blocks with free_stamp <= this */
} pool_owner_t;

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

    pool_block_t *blocks;       /* descriptor array */
    uint32_t blocks_capacity;   /* its length */
    uint32_t blocks_used;       /* descriptors ever handed out (high-water mark) */
    uint32_t recycled_head;     /* recycled descriptors, linked by next_free */
    uint32_t recycled_count;    /* how many */

    pool_chunk_t *chunks;       /* chunk table (slots with base NULL are unused) */
    uint32_t chunks_capacity;   /* its length */
    uint32_t chunks_count;      /* slots ever used (high-water mark) */

    pool_owner_t **owners;      /* owners[0] = ready list, then one per stream */
    uint32_t owners_count;      /* owners in use */
    uint32_t owners_capacity;   /* length of owners[] */
    ps_ptr_map_t stream_owners; /* stream -> owner index */
    uint32_t *dead_owners;      /* owner indices of destroyed streams, reusable */
    uint32_t dead_count;        /* entries in dead_owners */
    ps_stream_t last_stream;    /* one-entry cache of the stream map ... */
    uint32_t last_owner;        /* ... and its owner */

    ps_ptr_map_t in_use;        /* address -> descriptor index of every used block */
    uint32_t quick[QUICK_SLOTS]; /* quick cache: a parked ready block per size slot, or NIL */
    uint32_t quick_mask;        /* bit s: quick[s] holds a block */
    uint32_t stack_head;        /* size stack: the newest parked block a barrier (or fence) released, or NIL */
    uint32_t stack_count;       /* blocks in it (at most STACK_MAX), linked newest first by next_free */
    size_t stack_size;          /* the size of every block in it */
    unsigned alignment_log2;    /* log2(alignment), for the quick cache's slot */
    ps_reuse_t reuse;           /* cudaFree'd blocks (state PENDING) until a barrier or fence (core/reuse.c) */
    uint64_t free_counter;      /* stamps stream-list frees */
    uint32_t locks_taken;       /* hot-path lock acquisitions in the current window (pool_lock) */
    uint32_t locks_contended;   /* those that found the lock held */

    uint64_t bytes_in_use;      /* sum of used block sizes */
    uint64_t bytes_reserved;    /* sum of usable chunk sizes */
    uint64_t peak_bytes_reserved; /* maximum of bytes_reserved */
    uint64_t bytes_free;        /* sum of free block sizes (all owners) */
    uint64_t upstream_allocs;   /* chunks taken */
    uint64_t upstream_frees;    /* chunks given back */
    uint64_t fences_recorded;   /* fences this pool recorded for stream lists (epochs: reuse's) */
    uint64_t fence_waits;       /* host waits on stream lists (epochs: reuse's) */
    uint64_t pending_waits;     /* host waits because pending bytes passed the growth bound */
    uint64_t remap_syncs;       /* device synchronizes before moving free pieces to a growth (remap) */
    ps_vm_stash_t stash;        /* remap: pieces unmapped with their memory kept for the growth (empty between calls) */
    uint64_t remaps_idle;       /* remaps that moved idle pieces without a device synchronize */
    uint64_t remap_waits;       /* remaps that waited for the barrier that released the pieces, not the device */
    uint64_t remaps_slack;      /* remaps left out for a growth within remap_slack_percent instead of a wait */
    uint64_t remaps_lent;       /* remaps that lent busy pieces' memory instead of a wait (remap_lend) */
    int lend_refused;           /* 1: mapping lent memory a second time failed (not for lack of memory):
                                   this pool no longer lends */
    uint64_t peak_need_in_use;  /* most bytes in use + the need at an expandable growth (remap_slack_percent) */
    uint64_t remap_credit;      /* remaps allowed now, in 1/REMAP_CREDIT_UNIT (earned by turnover) */
    uint64_t in_use_high;       /* most of in use + need seen at a growth (grow_budget_percent) */
    uint64_t decay_high;        /* decay: most bytes in use since the last tick (core/pool_decay.c) */
    uint64_t decay_allocs;      /* decay: allocations served, to tell an idle pool */
    pool_decay_tick_t decay_ring[DECAY_TICKS]; /* decay: the last ticks, oldest overwritten */
    unsigned decay_next;        /* decay: the ring's next slot */

    int eager_barrier;          /* 1: free_sync barrier with barrier_pending_percent > 0 */
    int expandable;             /* 1: growth maps pieces of virtual-memory ranges, not chunks */
    uint32_t unmapped_head;     /* UNMAPPED blocks, linked by prev_free/next_free */
    uint64_t bytes_unmapped;    /* sum of their sizes */
    uint32_t lent_head;         /* LENT blocks, linked by prev_free/next_free */
    uint64_t bytes_lent;        /* sum of their sizes (their memory counts where it serves now) */
    /* read by every cache operation, written only by barriers: a line of its own */
    _Alignas(64) ps_reuse_family_t family; /* barrier numbers of the reuse state and the thread caches (lock-free) */
    _Alignas(64) ps_lock_t barrier_lock; /* one thread cache's barrier at a time (the others wait and share it) */
    _Atomic uint64_t cache_barriers; /* barriers issued for thread caches (tcache_barrier) */
} pool_t;

/* Remap's credit (pool_remap_earn_locked): a burst of REMAP_BURST remaps,
 * counted in 1/REMAP_CREDIT_UNIT. */
#define REMAP_CREDIT_UNIT 1000u
#define REMAP_BURST 16u

/* ---- the hot helpers, inline: every allocation and free runs them
 * (docs/benchmarks.md, "The pool's design choices") ---- */

/* TLSF classes of a key: first level floor(log2), second the next SL_LOG2 bits. */
static inline void key_class(size_t key, unsigned *fl, unsigned *sl)
{
    unsigned f = 63u - (unsigned)__builtin_clzll(key); /* key >= 255 */
    *fl = f;
    *sl = (unsigned)(key >> (f - SL_LOG2)) & (SL_COUNT - 1);
}

/* A free block is listed by the class of size - 1, so a class holds sizes
 * (lo, hi]: a whole power-of-two chunk and that chunk less a small block
 * share a class, and the hot split/merge cycle leaves the lists alone. */
static inline void size_class(size_t size, unsigned *fl, unsigned *sl)
{
    key_class(size - 1, fl, sl);
}

/* Lists free block `index` in owner `owner_index`'s TLSF lists (state FREE). */
static inline void pool_list_insert(pool_t *pool, uint32_t owner_index, uint32_t index)
{
    pool_owner_t *owner = pool->owners[owner_index];
    pool_block_t *b = &pool->blocks[index];
    unsigned fl, sl;
    size_class(b->size, &fl, &sl);
    uint32_t head = owner->heads[fl][sl];
    b->state = BLOCK_FREE;
    b->owner = (uint16_t)owner_index;
    b->prev_free = NIL;
    b->next_free = head;
    if (head != NIL)
        pool->blocks[head].prev_free = index;
    owner->heads[fl][sl] = index;
    owner->sl_bitmap[fl] |= 1u << sl;
    owner->fl_bitmap |= 1ull << fl;
    owner->free_bytes += b->size;
    owner->free_blocks++;
    pool->bytes_free += b->size;
}

/* Unlists free block `index` from its owner's lists. */
static inline void pool_list_remove(pool_t *pool, uint32_t index)
{
    pool_block_t *b = &pool->blocks[index];
    pool_owner_t *owner = pool->owners[b->owner];
    if (b->prev_free != NIL)
        pool->blocks[b->prev_free].next_free = b->next_free;
    else {
        unsigned fl, sl;
        size_class(b->size, &fl, &sl);
        owner->heads[fl][sl] = b->next_free;
        if (b->next_free == NIL) {
            owner->sl_bitmap[fl] &= ~(1u << sl);
            if (!owner->sl_bitmap[fl])
                owner->fl_bitmap &= ~(1ull << fl);
        }
    }
    if (b->next_free != NIL)
        pool->blocks[b->next_free].prev_free = b->prev_free;
    owner->free_bytes -= b->size;
    owner->free_blocks--;
    pool->bytes_free -= b->size;
}

/* A descriptor from the recycle list, or the next never used one (reserved beforehand). */
static inline uint32_t pool_take_descriptor(pool_t *pool)
{
    uint32_t index = pool->recycled_head;
    if (index != NIL) {
        pool->recycled_head = pool->blocks[index].next_free;
        pool->recycled_count--;
    } else {
        index = pool->blocks_used++;
    }
    return index;
}

/* Descriptor `index` goes back to the recycle list. */
static inline void pool_recycle_descriptor(pool_t *pool, uint32_t index)
{
    pool->blocks[index].state = BLOCK_UNUSED;
    pool->blocks[index].next_free = pool->recycled_head;
    pool->recycled_head = index;
    pool->recycled_count++;
}

/* ---- core/pool_decay.c: free memory not needed for a while goes back ---- */
uint64_t pool_decay(ps_resource_t *r, uint64_t now_ns, uint64_t decay_ns, uint64_t want);

/* Every allocation, pool lock held: the decay's view of the working set. */
static inline void pool_note_allocation(pool_t *pool)
{
    pool->decay_allocs++;
    if (pool->bytes_in_use > pool->decay_high)
        pool->decay_high = pool->bytes_in_use;
}

/* The quick cache's slot for a block of `size` bytes (core/pool.c). */
static inline uint32_t quick_slot(const pool_t *pool, size_t size)
{
    return (uint32_t)(size >> pool->alignment_log2) & (QUICK_SLOTS - 1);
}

/* A block that joins a run when the quick cache is flushed. */
static inline int ready_or_parked(const pool_block_t *b)
{
    return b->state == BLOCK_CACHED || (b->state == BLOCK_FREE && b->owner == OWNER_READY);
}

/* ---- core/pool.c: blocks, lists, descriptors, chunks, the barrier ---- */
extern const ps_resource_ops_t pool_ops; /* (a resource is a pool when its ops are these) */
uint64_t pool_largest_free_locked(const pool_t *pool);
int pool_add_chunk_locked(pool_t *pool, size_t chunk_size, size_t need, uint32_t *grown);
int pool_barrier_release_locked(pool_t *pool);
int pool_chunk_slot_locked(pool_t *pool, uint32_t *slot);
int pool_poll_stream_lists_locked(pool_t *pool, int record, int wait);
void pool_quick_flush_locked(pool_t *pool);
uint32_t pool_release_block(pool_t *pool, uint32_t index, uint32_t owner_index, uint64_t stamp, uint64_t idle);
int pool_reserve_descriptors_locked(pool_t *pool, uint32_t count);

/* ---- core/pool_expandable.c: growth, remap, giving memory back ---- */
int pool_close_and_poll_locked(pool_t *pool, size_t need);
void pool_fence_batch_locked(pool_t *pool, size_t freed);
void pool_flush_all_locked(pool_t *pool);
int pool_grow_expandable_locked(pool_t *pool, size_t need, uint32_t *grown);
int pool_grow_locked(pool_t *pool, size_t need, uint32_t *grown);
void pool_release_free_chunks_locked(pool_t *pool, uint64_t keep);
uint64_t pool_release_idle_locked(pool_t *pool, uint64_t keep, uint64_t passed);
/* The newest barrier the GPU has passed (IDLE_NOW: none known): a ready
 * block with idle_gen <= it is idle. */
uint64_t pool_newest_passed_locked(const pool_t *pool);
void pool_remap_earn_locked(pool_t *pool, uint64_t released);
int pool_under_budget_min_locked(const pool_t *pool, size_t need);

#endif
