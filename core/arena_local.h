/* The arena's local arenas: one per thread and one per stream, each
 * holding superblocks of the global arena (core/arena_global.h) cut into
 * blocks of one size class, for requests up to half a superblock.
 * core/arena_local.c opens with the algorithm. It calls only the global
 * arena: superblocks are taken from it and given back to it.
 *
 * Locks: the list's lock (arena_locals_t.lock), then one local arena's
 * lock, then the global arena's; never the other way round. */
#ifndef PS_ARENA_LOCAL_H
#define PS_ARENA_LOCAL_H

#include "arena_global.h"
#include "reuse.h"

typedef struct arena_locals arena_locals_t;

/* A thread's or a stream's arena. */
typedef struct local_arena {
    pthread_mutex_t lock;       /* guards everything below and its spans' blocks */
    arena_locals_t *locals;     /* the layer it belongs to */
    ps_stream_t stream;         /* PS_STREAM_NONE: a thread arena */
    bool orphaned;              /* thread arena whose thread exited */
    bool retired;               /* stream arena whose stream was destroyed, waiting for reuse */
    ps_fence_t *retire_fence;   /* recorded on the destroyed stream; NULL once complete */
    uint64_t retired_free;      /* bytes free at the destroy, counted as pending until then (in `pending`) */
    span_t **avail;             /* per class: superblocks with free blocks */
    ps_reuse_t reuse[2];        /* its cudaFree'd blocks until a barrier or fence (core/reuse.c), in two
                                   segments: frees before and after the start of the family's last barrier */
    unsigned deferring;         /* index of the segment frees join now */
    uint64_t in_use;            /* bytes of its blocks handed out (per arena: no shared cache line) */
    uint64_t pending;           /* retired_free while the retire fence runs (reuse counts the rest) */
    struct local_arena *next;   /* the layer's list of arenas */
} local_arena_t;

/* Every local arena of one resource. The fields every call reads come
 * first and are written only at creation; the list's lock and what it
 * guards sit on a cache line of their own. */
struct arena_locals {
    arena_global_t *global;     /* superblocks come from it and go back to it */
    const ps_gpu_ops_t *gpu;    /* fences, device sync */
    ps_reuse_family_t *family;  /* barrier numbers shared with the large blocks */
    ps_free_sync_t free_sync;   /* what a free with PS_STREAM_NONE waits for */
    size_t alignment;           /* the size classes' unit */
    size_t superblock_size;     /* bytes of one superblock */
    size_t thread_floor;        /* pending bytes a thread's arena may grow past instead of a barrier */
    size_t small_max;           /* largest request served here: superblock_size / 2 */
    unsigned class_count;       /* size classes */
    uint64_t id;                /* never reused: names this layer in threads' stream hints */
    pthread_key_t key;          /* this thread's arena */
    _Alignas(ARENA_CACHE_LINE) pthread_rwlock_t lock; /* guards the list (order: before any arena lock) */
    local_arena_t *arenas;      /* every arena, thread and stream */
    _Atomic unsigned thread_arenas; /* thread arenas whose thread lives (written at thread start and exit) */
    _Atomic unsigned meet_checks; /* misses that looked for another thread (a window of MEET_WINDOW) */
    _Atomic unsigned meet_hits;   /* of those, how many found one */
    atomic_bool threads_met;      /* sticky: threads were in the arena at once (the thread floor applies) */
    _Atomic uint64_t fences;      /* fences recorded: superblocks leaving stream arenas, stream destroys */
    _Atomic uint64_t waits;       /* host waits for retire fences */
};

/* arena_local_deallocate's answer for an address in a span no local
 * arena owns (a large block, or a free run). Positive, so never a status. */
#define ARENA_NOT_LOCAL 1

/* Prepares *l over `global` (superblocks of its size), with the arena's
 * free_sync, alignment (the size classes' unit) and thread_floor; every
 * reuse state joins `family`. PS_ENOMEM: no thread key. */
int arena_locals_init(arena_locals_t *l, arena_global_t *global, const ps_gpu_ops_t *gpu,
                      ps_reuse_family_t *family, ps_free_sync_t free_sync, size_t alignment,
                      size_t thread_floor);
/* Frees every local arena (their superblocks go with the global arena). No
 * other thread may use the arena. */
void arena_locals_destroy(arena_locals_t *l);

/* A block of `size` bytes (1 <= size <= small_max) for `stream`: from the
 * calling thread's arena (PS_STREAM_NONE) or the stream's. */
int arena_local_allocate(arena_locals_t *l, size_t size, ps_stream_t stream, void **out);
/* Frees the block at `ptr`, found through the page table from any thread.
 * PS_EINVAL (nothing changed): in no span, or not a block handed out;
 * ARENA_NOT_LOCAL: in a span no local arena owns. */
int arena_local_deallocate(arena_locals_t *l, void *ptr, ps_stream_t stream);

/* Defragmentation's part: every arena reclaims its deferred blocks (one
 * barrier for the family, else its epochs closed and, ARENA_HOST_WAIT,
 * waited for) and gives back its empty superblocks once its retire fence
 * (if any) completed. */
void arena_local_reclaim(arena_locals_t *l, arena_wait_t wait);
/* The program is about to destroy `stream`: its arena is retired. */
void arena_local_stream_destroyed(arena_locals_t *l, ps_stream_t stream);

/* What the local arenas hold and counted. */
typedef struct arena_local_figures {
    uint64_t in_use;          /* bytes of blocks handed out */
    uint64_t pending;         /* bytes freed, waiting for a barrier, a fence or a retire fence */
    uint64_t fences_recorded; /* fences recorded */
    uint64_t fence_waits;     /* host waits */
    uint64_t barriers;        /* barriers their reuse states issued */
} arena_local_figures_t;

arena_local_figures_t arena_local_figures(arena_locals_t *l);

#endif
