/* The arena: a suballocator built for many threads (core/arena.c opens
 * with the algorithm). A global arena of large superblocks; per-thread
 * arenas (per-stream arenas for stream-ordered calls) take superblocks from
 * it, so threads rarely contend. Small requests are served inside
 * superblocks, large ones straight from the global arena. Empty superblocks
 * go back to the global arena; on failure the arena defragments (returns
 * every empty superblock) and retries once, then reports fragmentation.
 * Frees with PS_STREAM_NONE follow the same free_sync policy as the pool. */
#ifndef PS_ARENA_H
#define PS_ARENA_H

#include "gpu_ops.h"
#include "reuse.h" /* ps_free_sync_t */
#include "resource.h"

typedef struct ps_arena_options {
    size_t initial_size;     /* bytes reserved for the global arena at creation (0 = on demand) */
    size_t maximum_size;     /* cap on bytes reserved (0 = no cap) */
    size_t superblock_size;  /* size of one superblock (default 2 MiB) */
    size_t alignment;        /* power of two >= 256 (default 256) */
    ps_free_sync_t free_sync;/* as the pool's */
    size_t thread_floor;     /* free_sync barrier: bytes of cudaFree'd blocks a thread's arena may hold
                                pending and take superblocks past, instead of issuing a barrier, while two
                                or more threads hold arenas (default 16 MiB; 0 = a barrier at every miss) */
} ps_arena_options_t;

void ps_arena_options_default(ps_arena_options_t *opts);
int ps_arena_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                    const ps_arena_options_t *opts, ps_resource_t **out);
#endif
