/* The arena's large blocks: requests above half a superblock, each a run
 * of whole superblocks of the global arena (core/arena_global.h), with
 * their deferred frees and eager barrier. core/arena_large.c opens with the
 * algorithm. It calls only the global arena; its state is guarded by the
 * global arena's lock (every large operation is one of the global arena). */
#ifndef PS_ARENA_LARGE_H
#define PS_ARENA_LARGE_H

#include "arena_global.h"
#include "reuse.h"

typedef struct arena_large {
    arena_global_t *global;     /* where its runs come from; its lock guards the fields below */
    const ps_gpu_ops_t *gpu;    /* fences, device sync */
    ps_free_sync_t free_sync;   /* what a free with PS_STREAM_NONE waits for */
    ps_reuse_t reuse;           /* cudaFree'd large blocks until a barrier or fence (core/reuse.c) */
    uint64_t in_use;            /* bytes of large blocks handed out */
    uint64_t fences;            /* fences recorded at stream-ordered frees */
} arena_large_t;

/* Prepares *l over `global`; its reuse state joins `family` (barrier
 * numbers shared with the local arenas). */
void arena_large_init(arena_large_t *l, arena_global_t *global, const ps_gpu_ops_t *gpu,
                      ps_free_sync_t free_sync, ps_reuse_family_t *family);
/* Drops the deferred blocks' records (their spans go with the global
 * arena). */
void arena_large_destroy(arena_large_t *l);

/* A run of whole superblocks for `size` bytes (above half a superblock)
 * for `stream`. */
int arena_large_allocate(arena_large_t *l, size_t size, ps_stream_t stream, void **out);
/* Frees the large block at `ptr`. PS_EINVAL (nothing changed): not a
 * large block handed out. */
int arena_large_deallocate(arena_large_t *l, void *ptr, ps_stream_t stream);

/* Defragmentation's part: releases the deferred blocks a barrier of the
 * family covers; then one barrier, or, refused or under EVENT, closes the
 * open epoch and (ARENA_HOST_WAIT) host-waits every closed one. */
void arena_large_reclaim(arena_large_t *l, arena_wait_t wait);

/* What the large blocks hold and counted. */
typedef struct arena_large_figures {
    uint64_t in_use;          /* bytes handed out */
    uint64_t pending;         /* bytes freed, waiting for a barrier or fence */
    uint64_t fences_recorded; /* fences recorded (frees and the reuse state) */
    uint64_t fence_waits;     /* host waits of the reuse state */
    uint64_t barriers;        /* barriers its reuse state issued */
} arena_large_figures_t;

arena_large_figures_t arena_large_figures(arena_large_t *l);

#endif
