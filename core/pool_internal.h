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

    atomic_int freed;           /* 1 once a block was freed to the pool (expandable_setup_run_min);
                                   written before any lock, read under the pool's lock */
    int eager_barrier;          /* 1: free_sync barrier with barrier_pending_percent > 0 */
    int expandable;             /* 1: growth maps pieces of virtual-memory ranges, not chunks */
    uint32_t unmapped_head;     /* UNMAPPED blocks, linked by prev_free/next_free */
    uint64_t bytes_unmapped;    /* sum of their sizes */
    uint32_t lent_head;         /* LENT blocks, linked by prev_free/next_free */
    uint64_t bytes_lent;        /* sum of their sizes (their memory counts where it serves now) */
    /* read by every cache operation, written only by barriers: a line of its own */
    _Alignas(64) ps_reuse_family_t family; /* barrier numbers of the reuse state and the thread caches (lock-free) */
    _Alignas(64) ps_lock_t barrier_lock; /* one thread cache's barrier at a time (the others wait and share it) */
    _Atomic uint64_t cache_barriers; /* barriers issued for thread caches (pool_tcache_barrier) */
} pool_t;

/* Remap's credit (pool_remap_earn_locked): a burst of REMAP_BURST remaps,
 * counted in 1/REMAP_CREDIT_UNIT. */
#define REMAP_CREDIT_UNIT 1000u
#define REMAP_BURST 16u

/* ---- pool_decay.c: free memory not needed for a while goes back -------- */
uint64_t pool_decay(ps_resource_t *r, uint64_t now_ns, uint64_t decay_ns, uint64_t want);

/* Every allocation, pool lock held: the decay's view of the working set. */
static inline void pool_note_allocation(pool_t *pool)
{
    pool->decay_allocs++;
    if (pool->bytes_in_use > pool->decay_high)
        pool->decay_high = pool->bytes_in_use;
}

/* ---- pool_lists.c: descriptors, blocks, TLSF lists --------------------- */
int pool_reserve_descriptors_locked(pool_t *pool, uint32_t count);
uint32_t pool_release_block(pool_t *pool, uint32_t index, uint32_t owner_index, uint64_t stamp, uint64_t idle);
uint64_t pool_largest_free_locked(const pool_t *pool);

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

/* Good fit: a free block of `owner` with size >= `size`, or NIL. */
static inline uint32_t pool_list_find(const pool_t *pool, const pool_owner_t *owner, size_t size)
{
    unsigned fl, sl;
    size_t key = size - 1;
    key_class(key, &fl, &sl);
    uint32_t head = owner->heads[fl][sl];
    if (head != NIL && pool->blocks[head].size >= size)
        return head;
    /* the first class whose every block is >= size: keys from `rounded` up */
    size_t rounded = key + ((size_t)1 << (fl - SL_LOG2)) - 1;
    if (rounded < key)
        return NIL;
    key_class(rounded, &fl, &sl);
    uint32_t sl_map = owner->sl_bitmap[fl] & (~0u << sl);
    if (!sl_map) {
        uint64_t fl_map = fl + 1 < FL_COUNT ? owner->fl_bitmap & (~0ull << (fl + 1)) : 0;
        if (!fl_map)
            return NIL;
        fl = (unsigned)__builtin_ctzll(fl_map);
        sl_map = owner->sl_bitmap[fl];
    }
    return owner->heads[fl][(unsigned)__builtin_ctz(sl_map)];
}

/* Moves/resizes free block `index` in place; its lists change only when
 * its size class does (the common case on the hot path: they do not). */
static inline void pool_free_block_resize(pool_t *pool, uint32_t index, uintptr_t addr, size_t size)
{
    pool_block_t *b = &pool->blocks[index];
    unsigned old_fl, old_sl, new_fl, new_sl;
    size_class(b->size, &old_fl, &old_sl);
    size_class(size, &new_fl, &new_sl);
    if (old_fl == new_fl && old_sl == new_sl) {
        pool_owner_t *owner = pool->owners[b->owner];
        owner->free_bytes = owner->free_bytes - b->size + size;
        pool->bytes_free = pool->bytes_free - b->size + size;
        b->addr = addr;
        b->size = size;
    } else {
        uint32_t owner_index = b->owner;
        pool_list_remove(pool, index);
        b->addr = addr;
        b->size = size;
        pool_list_insert(pool, owner_index, index);
    }
}

/* Takes free block `index` for a request of `size` bytes and returns the
 * used block's index: the front is cut off as a new used block (the free
 * rest keeps its descriptor and, usually, its list position) unless less
 * than one alignment unit would be left; a request of at most
 * small_from_back bytes is cut off the back instead. The used block is
 * mapped. Needs one reserved descriptor and one reserved in-use map slot. */
static inline uint32_t pool_take_block(pool_t *pool, uint32_t index, size_t size)
{
    pool_block_t *f = &pool->blocks[index];
    uint32_t used_index = index;
    if (size <= pool->options.small_from_back && f->size - size >= pool->options.alignment) {
        used_index = pool_take_descriptor(pool);
        f = &pool->blocks[index];
        pool_block_t *used = &pool->blocks[used_index];
        used->addr = f->addr + f->size - size;
        used->size = size;
        used->free_stamp = 0;
        used->idle_gen = f->idle_gen; /* splitting keeps it (a thread cache's refill gives it back) */
        used->prev_phys = index;
        used->next_phys = f->next_phys;
        used->chunk = f->chunk;
        used->owner = f->owner;
        if (f->next_phys != NIL)
            pool->blocks[f->next_phys].prev_phys = used_index;
        f->next_phys = used_index;
        pool_free_block_resize(pool, index, f->addr, f->size - size);
    } else if (f->size - size >= pool->options.alignment) {
        used_index = pool_take_descriptor(pool);
        f = &pool->blocks[index];
        pool_block_t *used = &pool->blocks[used_index];
        used->addr = f->addr;
        used->size = size;
        used->free_stamp = 0;
        used->idle_gen = f->idle_gen;
        used->prev_phys = f->prev_phys;
        used->next_phys = index;
        used->chunk = f->chunk;
        used->owner = f->owner;
        if (f->prev_phys != NIL)
            pool->blocks[f->prev_phys].next_phys = used_index;
        else
            pool->chunks[f->chunk].first_block = used_index;
        f->prev_phys = used_index;
        pool_free_block_resize(pool, index, f->addr + size, f->size - size);
    } else {
        pool_list_remove(pool, index);
    }
    pool_block_t *used = &pool->blocks[used_index];
    used->state = BLOCK_USED;
    pool->bytes_in_use += used->size;
    pool_note_allocation(pool);
    ps_ptr_map_put(&pool->in_use, used->addr, used_index);
    return used_index;
}

/* ---- pool_caches.c: quick cache, size stack, thread caches, contention ---- */
void pool_stack_flush_locked(pool_t *pool);
void pool_quick_flush_locked(pool_t *pool);
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

/* A block that joins a run when the quick cache is flushed. */
static inline int ready_or_parked(const pool_block_t *b)
{
    return b->state == BLOCK_CACHED || (b->state == BLOCK_FREE && b->owner == OWNER_READY);
}

/* A parked block of exactly `size` bytes, taken as used, or NIL. Needs a
 * reserved in-use map slot. */
static inline uint32_t pool_quick_take(pool_t *pool, size_t size)
{
    uint32_t slot = quick_slot(pool, size);
    uint32_t index = pool->quick[slot];
    if (index == NIL || pool->blocks[index].size != size)
        return NIL;
    pool->quick[slot] = NIL;
    pool->quick_mask &= ~(1u << slot);
    pool->bytes_free -= size;
    pool->blocks[index].state = BLOCK_USED;
    pool->bytes_in_use += size;
    pool_note_allocation(pool);
    ps_ptr_map_put(&pool->in_use, pool->blocks[index].addr, index);
    return index;
}

/* Parks ready block `index` (a cudaFree under free_sync none) in the quick
 * cache; the block parked in its slot before is merged into the lists. */
static inline void pool_quick_park(pool_t *pool, uint32_t index)
{
    pool_block_t *b = &pool->blocks[index];
    uint32_t slot = quick_slot(pool, b->size);
    uint32_t evicted = pool->quick[slot];
    pool->quick[slot] = index;
    pool->quick_mask |= 1u << slot;
    b->state = BLOCK_CACHED;
    b->owner = OWNER_READY;
    b->free_stamp = 0;
    b->idle_gen = IDLE_NEVER; /* a cudaFree under free_sync none: a kernel may still use it */
    pool->bytes_free += b->size;
    if (evicted != NIL) {
        pool->bytes_free -= pool->blocks[evicted].size;
        pool_release_block(pool, evicted, OWNER_READY, 0, pool->blocks[evicted].idle_gen);
    }
}

/* A parked block of the stack, taken as used (the caller checked its size).
 * Needs a reserved in-use map slot. */
static inline uint32_t pool_stack_take(pool_t *pool)
{
    uint32_t index = pool->stack_head;
    pool_block_t *b = &pool->blocks[index];
    pool->stack_head = b->next_free;
    pool->stack_count--;
    pool->bytes_free -= b->size;
    b->state = BLOCK_USED;
    pool->bytes_in_use += b->size;
    pool_note_allocation(pool);
    ps_ptr_map_put(&pool->in_use, b->addr, index);
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

/* ---- pool_streams.c: stream owners, stealing, fences, the barrier ------ */
pool_owner_t *pool_owner_new(ps_stream_t stream);
int pool_owner_of_stream_locked(pool_t *pool, ps_stream_t stream, uint32_t *out);
int pool_poll_stream_lists_locked(pool_t *pool, int record, int wait);
int pool_steal_stream_list_locked(pool_t *pool, uint32_t to, size_t size);
int pool_anything_pending_locked(const pool_t *pool);
int pool_barrier_release_locked(pool_t *pool);
void pool_flush_all_locked(pool_t *pool);
/* The resource's stream_destroyed entry (takes the lock). */
void pool_stream_destroyed(ps_resource_t *r, ps_stream_t stream);

/* ---- pool_growth.c: chunks, growth and its bounds, giving memory back ---- */
int pool_chunk_slot_locked(pool_t *pool, uint32_t *slot);
int pool_add_chunk_locked(pool_t *pool, size_t chunk_size, size_t need, uint32_t *grown);
int pool_grow_locked(pool_t *pool, size_t need, uint32_t *grown);
int pool_wait_pending_over_bound_locked(pool_t *pool, size_t need, void **out);
int pool_fit_budget_locked(pool_t *pool, size_t need, void **out);
int pool_under_budget_min_locked(const pool_t *pool, size_t need);
int pool_close_and_poll_locked(pool_t *pool, size_t need);
void pool_fence_batch_locked(pool_t *pool, size_t freed);
void pool_release_free_chunks_locked(pool_t *pool, uint64_t keep);
uint64_t pool_release_idle_locked(pool_t *pool, uint64_t keep, uint64_t passed);
void pool_map_first_piece_locked(pool_t *pool);

/* ---- pool_expandable.c: the expandable range, remap, lending ----------- */
int pool_grow_expandable_locked(pool_t *pool, size_t need, uint32_t *grown);
/* Reserves an expandable pool's first range at its creation (nothing
 * mapped), so its first growth does not pay for it; a failure is left to
 * that growth, which tries again. */
void pool_reserve_first_range_locked(pool_t *pool);
void pool_unmap_free_pieces_locked(pool_t *pool, uint64_t keep);
int pool_return_lent_locked(pool_t *pool, uint64_t passed);
int pool_whole_pieces_of(const pool_t *pool, const ps_vm_range_t *range, uint32_t index, uintptr_t *lo,
                         uintptr_t *hi);
uintptr_t pool_runs_for(const ps_vm_range_t *range, uintptr_t lo, uintptr_t hi, uint64_t want);
size_t pool_unmap_block_pieces_locked(pool_t *pool, uint32_t slot, uint32_t index, uintptr_t lo, uintptr_t hi,
                                      ps_vm_stash_t *stash, uint32_t *after);
/* The newest barrier the GPU has passed (IDLE_NOW: none known): a ready
 * block with idle_gen <= it is idle. */
uint64_t pool_newest_passed_locked(const pool_t *pool);
void pool_remap_earn_locked(pool_t *pool, uint64_t released);

/* ---- pool.c: the recipe ------------------------------------------------ */
extern const ps_resource_ops_t pool_ops; /* (a resource is a pool when its ops are these) */
int pool_try_ready_locked(pool_t *pool, size_t need, void **out);
int pool_defer_block(pool_t *pool, uint32_t index);

#endif
