/* The arena's bottom layer, the global arena: chunks from the upstream,
 * cut into superblocks; free runs of superblocks (spans) handed out by best
 * fit; the page table that finds the span of any address without a lock.
 * core/arena_global.c opens with the algorithm. It calls nothing of the
 * arena above it: the local arenas (core/arena_local.h) and the large
 * blocks (core/arena_large.h) take spans from it and give them back.
 *
 * Its lock (arena_global_lock) guards the spans, chunks and counters; the
 * large blocks' state lives under it too. Lock order: the local arenas'
 * list, then one local arena, then this lock. Functions named *_locked
 * need it held; the others take it themselves. */
#ifndef PS_ARENA_GLOBAL_H
#define PS_ARENA_GLOBAL_H

#include "gpu_ops.h"
#include "resource.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_CACHE_LINE 64 /* arenas and spans of different threads never share one */

/* Zeroed memory aligned to a cache line, so that two threads' arenas (or
 * spans) never falsely share a line. */
static inline void *arena_line_calloc(size_t size)
{
    size_t rounded = ps_align_up(size, ARENA_CACHE_LINE);
    void *p = aligned_alloc(ARENA_CACHE_LINE, rounded);
    if (p)
        memset(p, 0, rounded);
    return p;
}

static inline unsigned arena_log2_floor(size_t x)
{
    return (unsigned)(63 - __builtin_clzll((unsigned long long)x));
}

/* Whether a reclaim may host-wait for fences (memory pressure) or only
 * polls them (trim, the background). */
typedef enum arena_wait {
    ARENA_POLL = 0,  /* take what completed, never block */
    ARENA_HOST_WAIT  /* host-wait for what is still running */
} arena_wait_t;

/* Whether arena_global_take_locked may take a new chunk from the upstream. */
typedef enum arena_growth {
    ARENA_NO_GROWTH = 0, /* only what is free now */
    ARENA_MAY_GROW       /* give back wholly free chunks, then take a new one */
} arena_growth_t;

typedef enum span_kind {
    SPAN_FREE = 0,      /* in the global free list */
    SPAN_SMALL,         /* a superblock owned by a local arena, cut into blocks */
    SPAN_LARGE,         /* handed out whole to one large request */
    SPAN_PENDING_LARGE  /* a large block freed under EVENT or BARRIER, waiting for its reuse state */
} span_kind_t;

struct local_arena; /* the owner of a small span (core/arena_local.h); opaque here */
struct chunk;       /* one upstream allocation (core/arena_global.c) */

/* A run of superblocks. Small spans are exactly one superblock. The fields
 * marked SMALL belong to the local arena that owns the span (written under
 * its lock); this layer only keeps their arrays for the next owner. */
typedef struct span {
    uintptr_t base;                 /* address of the first superblock */
    size_t pages;                   /* superblocks in the run */
    span_kind_t kind;               /* changed only under the global lock */
    struct chunk *chunk;            /* the upstream chunk it lies in */
    struct span *prev, *next;       /* links: global free list, or the owner's class list */
    bool linked;                    /* SMALL: on its owner's class list (has free blocks) */
    _Atomic(struct local_arena *) owner; /* SMALL: the local arena that owns it, else NULL */
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

typedef _Atomic(span_t *) span_slot_t;

#define ARENA_ADDRESS_BITS 48 /* addresses the page table covers */
#define ARENA_LEAF_BITS 12    /* pages per page-table leaf: 2^12 */

/* The global arena. The fields every free reads (the page table) sit on a
 * line of their own, written only at creation; the lock and what it guards
 * on the next. */
typedef struct arena_global {
    _Alignas(ARENA_CACHE_LINE) ps_resource_t *upstream; /* where chunks come from */
    const ps_gpu_ops_t *gpu;    /* fences of spans that left a stream arena */
    size_t superblock_size;     /* bytes of one superblock, a power of two */
    size_t maximum_size;        /* cap on bytes reserved (0 = no cap) */
    unsigned shift;             /* log2(superblock_size) */
    _Atomic(span_slot_t *) *page_table; /* level 1: leaves of 2^ARENA_LEAF_BITS slots */
    size_t leaf_count;          /* entries in page_table */
    _Alignas(ARENA_CACHE_LINE) pthread_mutex_t lock; /* guards everything below */
    span_t *free_spans;         /* FREE spans */
    struct chunk *chunks;       /* upstream chunks */
    span_t *spare_spans;        /* span structs for reuse */
    span_t *all_spans;          /* every span struct */
    uint64_t reserved;          /* bytes of chunks */
    uint64_t peak_reserved;     /* maximum of reserved */
    uint64_t upstream_allocs;   /* chunk allocations */
    uint64_t upstream_frees;    /* chunks given back */
    uint64_t fence_waits;       /* host waits for spans' fences (under memory pressure) */
} arena_global_t;

/* Prepares *g (empty: no chunk yet). PS_ENOMEM: no host memory for the
 * page table. */
int arena_global_init(arena_global_t *g, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                      size_t superblock_size, size_t maximum_size);
/* Gives every chunk back to the upstream and frees every span. No other
 * thread may use the arena. */
void arena_global_destroy(arena_global_t *g);

static inline void arena_global_lock(arena_global_t *g) { pthread_mutex_lock(&g->lock); }
static inline void arena_global_unlock(arena_global_t *g) { pthread_mutex_unlock(&g->lock); }

/* The span holding superblock-aligned `address` (NULL: none), from any
 * thread without a lock: two levels, leaves made once and never freed
 * before destroy, slots written with release. */
static inline span_t *arena_global_lookup(const arena_global_t *g, uintptr_t address)
{
    size_t page = address >> g->shift;
    size_t leaf = page >> ARENA_LEAF_BITS;
    if (leaf >= g->leaf_count)
        return NULL;
    span_slot_t *slots = atomic_load_explicit(&g->page_table[leaf], memory_order_acquire);
    if (!slots)
        return NULL;
    return atomic_load_explicit(&slots[page & ((1u << ARENA_LEAF_BITS) - 1)], memory_order_acquire);
}

/* Bytes of chunks held now. */
static inline uint64_t arena_global_reserved_locked(const arena_global_t *g) { return g->reserved; }

/* Takes one chunk of at least `bytes` from the upstream now (the initial
 * reserve). PS_ENOMEM when it cannot. */
int arena_global_reserve(arena_global_t *g, size_t bytes);

/* Takes `pages` superblocks for `taker` (a stream, or PS_STREAM_NONE) as
 * one span off the free list (kind still SPAN_FREE: the caller sets it):
 * best fit, a fenced span only once its fence completed or, of the exact
 * size, by another stream after a stream wait. Nothing fits: PS_ENOMEM, or
 * under ARENA_MAY_GROW a new chunk first. */
int arena_global_take_locked(arena_global_t *g, size_t pages, ps_stream_t taker, arena_growth_t growth,
                             span_t **out);
/* Gives span `s` back, free (fenced on `fence_stream` when `fence` is
 * set), merging with free unfenced neighbours of its chunk. */
void arena_global_put_locked(arena_global_t *g, span_t *s, ps_fence_t *fence, ps_stream_t fence_stream);

/* Defragmentation's part: drops the fences of free spans that completed
 * (ARENA_HOST_WAIT: waits for every one), then gives wholly free chunks
 * back to the upstream. */
void arena_global_reclaim(arena_global_t *g, arena_wait_t wait);
/* `stream` is being destroyed: a span fenced on it is waited for by every
 * taker from now on (a new stream may reuse the handle value). */
void arena_global_stream_destroyed(arena_global_t *g, ps_stream_t stream);

/* What the global arena holds now. */
typedef struct arena_global_figures {
    uint64_t reserved;        /* bytes of chunks */
    uint64_t peak_reserved;   /* maximum of reserved */
    uint64_t upstream_allocs; /* chunk allocations */
    uint64_t upstream_frees;  /* chunks given back */
    uint64_t largest_free;    /* bytes of the largest unfenced free span */
    uint64_t fence_waits;     /* host waits for spans' fences */
} arena_global_figures_t;

arena_global_figures_t arena_global_figures(arena_global_t *g);

#endif
