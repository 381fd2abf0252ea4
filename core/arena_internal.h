/* The arena's shared types and the calls between its files: core/arena.c
 * (the vtable, defragmentation), core/arena_local.c (thread and stream
 * arenas, size classes, deferred frees), core/arena_large.c (requests above
 * half a superblock) and core/arena_global.c (the global arena: chunks from
 * the upstream, runs of superblocks, the page table). Internal to the
 * arena; see core/arena.c for the algorithm as a whole. */
#ifndef PS_ARENA_INTERNAL_H
#define PS_ARENA_INTERNAL_H

#include "arena.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define ADDRESS_BITS 48 /* addresses the page table covers */
#define LEAF_BITS 12    /* pages per page-table leaf: 2^12 */
#define NO_INDEX UINT32_MAX
#define CACHE_LINE 64   /* arenas and spans of different threads never share one */

/* Zeroed memory aligned to a cache line, so that two threads' arenas (or
 * spans) never falsely share a line. */
static inline void *line_calloc(size_t size)
{
    size_t rounded = ps_align_up(size, CACHE_LINE);
    void *p = aligned_alloc(CACHE_LINE, rounded);
    if (p)
        memset(p, 0, rounded);
    return p;
}

struct arena;
struct chunk;

typedef enum span_kind {
    SPAN_FREE = 0,      /* in the global free list */
    SPAN_SMALL,         /* a superblock owned by an arena, cut into blocks */
    SPAN_LARGE,         /* handed out whole to one large request */
    SPAN_PENDING_LARGE  /* a large block freed under EVENT, waiting for a fence */
} span_kind_t;

/* A run of superblocks. Small spans are exactly one superblock. */
typedef struct span {
    uintptr_t base;                 /* address of the first superblock */
    size_t pages;                   /* superblocks in the run */
    span_kind_t kind;               /* changed only under the global lock */
    struct chunk *chunk;            /* the upstream chunk it lies in */
    struct span *prev, *next;       /* links: global free list, or the owner's class list */
    int linked;                     /* on its owner's class list (has free blocks) */
    _Atomic(struct arena *) owner;  /* SMALL: the arena that owns it, else NULL */
    unsigned size_class;            /* SMALL: class index */
    size_t block_size;              /* SMALL: bytes per block; LARGE: bytes handed out */
    uint32_t block_count;           /* SMALL: blocks in the superblock */
    uint32_t used;                  /* SMALL: blocks handed out or pending */
    uint32_t free_top;              /* SMALL: entries on free_stack */
    uint32_t *free_stack;           /* SMALL: indices of free blocks (LIFO) */
    uint32_t stack_capacity;        /* entries allocated in free_stack */
    uint64_t *in_use;               /* SMALL: bit i set = block i handed out */
    ps_fence_t *fence;              /* FREE: must complete before reuse (from a stream arena) */
    ps_stream_t fence_stream;       /* the stream `fence` was recorded on */
    struct span *all_next;          /* every span struct ever made (freed at destroy) */
} span_t;

/* One upstream allocation. */
typedef struct chunk {
    void *memory;         /* as the upstream returned it */
    size_t bytes;         /* as asked of the upstream */
    uintptr_t first;      /* first superblock-aligned address */
    size_t pages;         /* superblocks in it */
    struct chunk *next;   /* all chunks */
} chunk_t;

typedef struct arena_resource arena_resource_t;

/* A thread's or a stream's arena. */
typedef struct arena {
    pthread_mutex_t lock;       /* guards everything below and its spans' blocks */
    arena_resource_t *parent;   /* the resource */
    ps_stream_t stream;         /* PS_STREAM_NONE: a thread arena */
    int orphaned;               /* thread arena whose thread exited */
    int retired;                /* stream arena whose stream was destroyed, waiting for reuse */
    ps_fence_t *retire_fence;   /* recorded on the destroyed stream; NULL once complete */
    uint64_t retired_free;      /* bytes free at the destroy, counted as pending until then (in `pending`) */
    span_t **avail;             /* per class: superblocks with free blocks */
    ps_reuse_t reuse[2];        /* its cudaFree'd blocks until a barrier or fence (core/reuse.c), in two
                                   segments: frees before and after the start of the family's last barrier */
    unsigned deferring;         /* index of the segment frees join now */
    uint64_t in_use;            /* bytes of its blocks handed out (per arena: no shared cache line) */
    uint64_t pending;           /* retired_free while the retire fence runs (reuse counts the rest) */
    struct arena *next;         /* the resource's list of arenas */
} arena_t;

typedef _Atomic(span_t *) span_slot_t;

/* The fields every call reads come first and are written only at
 * creation; the locks and what they guard sit on cache lines of their own
 * (a read lock of arenas_lock on every stream-ordered call, on the line of
 * `shift` and `page_table`, made every lookup of 16 threads miss). */
struct arena_resource {
    ps_resource_t base;         /* vtable first */
    const ps_gpu_ops_t *gpu;    /* fences, device sync */
    ps_arena_options_t opts;    /* effective options */
    unsigned shift;             /* log2(superblock_size) */
    unsigned class_count;       /* size classes served inside superblocks */
    size_t small_max;           /* largest small request: superblock_size / 2 */
    uint64_t id;                /* never reused: names this resource in threads' stream hints */
    pthread_key_t key;          /* this thread's arena */
    _Atomic(span_slot_t *) *page_table; /* level 1: leaves of 2^LEAF_BITS slots */
    size_t leaf_count;          /* entries in page_table */
    _Alignas(CACHE_LINE) pthread_rwlock_t arenas_lock; /* guards the arena list (order: before any arena lock) */
    arena_t *arenas;            /* every arena, thread and stream */
    _Atomic unsigned thread_arenas; /* thread arenas whose thread lives (written at thread start and exit) */
    _Atomic unsigned meet_checks; /* misses that looked for another thread in the arena (window of MEET_WINDOW) */
    _Atomic unsigned meet_hits;   /* of those, how many found one */
    _Atomic int threads_met;      /* sticky: threads were seen in the arena at once (the thread floor applies) */
    _Alignas(CACHE_LINE) pthread_mutex_t global_lock; /* guards the global arena below (order: after arena locks) */
    span_t *free_spans;         /* FREE spans */
    chunk_t *chunks;            /* upstream chunks */
    span_t *spare_spans;        /* span structs for reuse */
    span_t *all_spans;          /* every span struct */
    ps_reuse_t large_reuse;     /* cudaFree'd large blocks (global lock) */
    ps_reuse_family_t family;   /* barrier numbers shared by every arena's reuse state and large_reuse */
    uint64_t reserved;          /* bytes of chunks */
    uint64_t peak_reserved;     /* maximum of reserved */
    uint64_t upstream_allocs;   /* chunk allocations */
    uint64_t upstream_frees;    /* chunks given back */
    uint64_t large_in_use;      /* bytes of large blocks handed out (global lock) */
    _Atomic uint64_t fences;    /* fences recorded */
    _Atomic uint64_t waits;     /* host fence waits */
};

static inline unsigned log2_floor(size_t x) { return (unsigned)(63 - __builtin_clzll((unsigned long long)x)); }

/* The span holding superblock-aligned `address` (NULL: none), from any
 * thread without a lock: two levels, leaves made once and never freed
 * before destroy, slots written with release. */
static inline span_t *lookup(arena_resource_t *a, uintptr_t address)
{
    size_t page = address >> a->shift;
    size_t leaf = page >> LEAF_BITS;
    if (leaf >= a->leaf_count)
        return NULL;
    span_slot_t *slots = atomic_load_explicit(&a->page_table[leaf], memory_order_acquire);
    if (!slots)
        return NULL;
    return atomic_load_explicit(&slots[page & ((1u << LEAF_BITS) - 1)], memory_order_acquire);
}

/* Bytes of the arena's cudaFree'd blocks waiting for a barrier or fence.
 * Arena lock held. */
static inline uint64_t arena_pending(const arena_t *ar)
{
    return ar->reuse[0].bytes_pending + ar->reuse[1].bytes_pending;
}

/* ---- core/arena_local.c ------------------------------------------------ */

/* Size class of a request of `size` bytes (1 <= size <= small_max). */
unsigned arena_class_of(const arena_resource_t *a, size_t size);

/* Allocates `size` bytes (> 0) for `stream`: a small block from the
 * thread's or the stream's arena, a large one from arena_large.c. No lock
 * held. */
int arena_try_allocate(arena_resource_t *a, size_t size, ps_stream_t stream, void **out);
/* Block `index` of superblock `s` is free again (its in-use bit already
 * cleared). Arena lock held. */
void arena_block_return(arena_t *ar, span_t *s, uint32_t index);
/* A block freed with PS_STREAM_NONE waits for a barrier or fence (into the
 * arena's current segment). Arena lock held. */
int arena_defer(arena_t *ar, uintptr_t ptr, uint64_t bytes);
/* Releases every empty superblock of the arena to the global arena
 * (keep_one: but the last of its class). Arena lock held. */
void arena_release_empty(arena_t *ar, int keep_one);
/* Whether the arena's retire fence (if any) is behind us; with `wait`,
 * host-waits for it. Arena lock held. */
int arena_retire_fence_done(arena_t *ar, int wait);
/* The pthread key's destructor: the thread's arena becomes an orphan. */
void arena_thread_exit(void *value);

/* ---- core/arena_large.c (global lock held, except init) ------------------ */

/* Prepares the large blocks' reuse state (at create). */
void arena_large_init(arena_resource_t *a);
/* A run of whole superblocks for a request above small_max. Takes the
 * global lock. */
int arena_large_allocate(arena_resource_t *a, size_t size, ps_stream_t stream, void **out);
/* Frees the large block at `ptr` (span `s`, looked up without the lock).
 * Takes the global lock. */
int arena_large_deallocate(arena_resource_t *a, span_t *s, void *ptr, ps_stream_t stream);

/* ---- core/arena_global.c (global lock held) ---------------------------- */

/* Gives free span `s` back to the global arena (fenced on `fence_stream`
 * when `fence` is set), merging with free neighbours of its chunk. */
void arena_global_put(arena_resource_t *a, span_t *s, ps_fence_t *fence, ps_stream_t fence_stream);
/* Drops span `s`'s completed fence (it may merge). */
void arena_unfence(arena_resource_t *a, span_t *s);
/* Takes one chunk from the upstream big enough for `pages` superblocks. */
int arena_grow(arena_resource_t *a, size_t pages);
/* Takes `pages` superblocks for `taker` (best fit; growing when nothing
 * fits and `may_grow`). */
int arena_global_take(arena_resource_t *a, size_t pages, ps_stream_t taker, int may_grow, span_t **out);
/* Gives wholly free, unfenced chunks back to the upstream. */
void arena_release_free_chunks(arena_resource_t *a);

#endif
