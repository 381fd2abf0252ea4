/* arena_large: requests above half a superblock (core/arena_large.h).
 * Everything here runs under the global arena's lock.
 *
 * Algorithm:
 *  1. allocate(size): rounded up to a whole number of superblocks, taken
 *     as one run from the global arena (core/arena_global.c, best fit).
 *     Before that, under free_sync barrier, once the cudaFree'd large
 *     blocks pass PS_REUSE_BARRIER_PENDING_PERCENT of the reserve and
 *     PS_REUSE_EAGER_FLOOR (core/reuse.c's ps_reuse_barrier_worth, the
 *     pool's eager trigger without its floors), one barrier releases them,
 *     so that they serve the next requests instead of those cutting other
 *     runs.
 *  2. When no free run fits: reclaim the pending large blocks (core/reuse.c:
 *     poll, then one barrier, or close and poll the epoch) and try again;
 *     then grow the global arena.
 *  3. free(ptr): stream-ordered, the run goes back to the global arena at
 *     once with a fence on that stream (taken only once it completed, or
 *     by another stream after a stream wait); with PS_STREAM_NONE it
 *     follows free_sync: deferred in the reuse state (barrier and event:
 *     one reuse state of the arena's family), after a device synchronize
 *     (device), at once (none).
 * Guarantees: a large block is handed out again only after a barrier begun
 * after its free, a fence recorded after its free completed, or a device
 * synchronize; a bad or double free returns PS_EINVAL and changes nothing.
 */
#include "arena_large.h"

/* The reuse state's release callback (global lock held): the span at
 * `item` is free. */
static void release_pending_large(void *ctx, uint64_t item)
{
    arena_large_t *l = ctx;
    arena_global_put_locked(l->global, arena_global_lookup(l->global, (uintptr_t)item), NULL, 0);
}

void arena_large_init(arena_large_t *l, arena_global_t *global, const ps_gpu_ops_t *gpu,
                      ps_free_sync_t free_sync, ps_reuse_family_t *family)
{
    l->global = global;
    l->gpu = gpu;
    l->free_sync = free_sync;
    ps_reuse_init(&l->reuse, gpu, free_sync, PS_REUSE_BARRIER_PENDING_PERCENT, family, release_pending_large,
                  l);
}

void arena_large_destroy(arena_large_t *l)
{
    ps_reuse_destroy(&l->reuse);
}

int arena_large_allocate(arena_large_t *l, size_t size, ps_stream_t stream, void **out)
{
    arena_global_t *g = l->global;
    size_t pages = (size + g->superblock_size - 1) >> g->shift;
    arena_global_lock(g);
    span_t *s = NULL;
    /* the eager barrier (step 1: not only when no run fits, for while they
     * wait the requests they could serve cut other runs); then what is
     * free, then what completed fences free, then grow */
    ps_reuse_poll(&l->reuse);
    ps_reuse_barrier_case_t eager = {.reserved = arena_global_reserved_locked(g),
                                     .pending = l->reuse.bytes_pending,
                                     .percent = ps_reuse_eager_percent(&l->reuse)};
    if (ps_reuse_barrier_worth(&eager) == PS_REUSE_BARRIER)
        ps_reuse_barrier(&l->reuse);
    int status = arena_global_take_locked(g, pages, stream, ARENA_NO_GROWTH, &s);
    if (status == PS_ENOMEM && l->reuse.bytes_pending && ps_reuse_reclaim(&l->reuse))
        status = arena_global_take_locked(g, pages, stream, ARENA_NO_GROWTH, &s); /* released: try again */
    if (status == PS_ENOMEM)
        status = arena_global_take_locked(g, pages, stream, ARENA_MAY_GROW, &s);
    if (status == PS_OK) {
        s->kind = SPAN_LARGE;
        s->block_size = pages << g->shift;
        l->in_use += s->block_size;
        *out = (void *)s->base;
    }
    arena_global_unlock(g);
    return status;
}

int arena_large_deallocate(arena_large_t *l, void *ptr, ps_stream_t stream)
{
    arena_global_t *g = l->global;
    arena_global_lock(g);
    span_t *s = arena_global_lookup(g, (uintptr_t)ptr);
    if (!s || s->kind != SPAN_LARGE || s->base != (uintptr_t)ptr) {
        arena_global_unlock(g);
        return PS_EINVAL;
    }
    int status = PS_OK;
    uint64_t bytes = s->block_size;
    if (stream != PS_STREAM_NONE) {
        ps_fence_t *fence = NULL;
        if (l->gpu->fence_record(l->gpu->ctx, stream, &fence) == PS_OK) {
            l->fences++;
            arena_global_put_locked(g, s, fence, stream);
        } else {
            status = PS_EUPSTREAM;
        }
    } else {
        bool defer = ps_reuse_defers(&l->reuse);
        if (!defer && l->free_sync == PS_FREE_SYNC_DEVICE) {
            status = l->gpu->device_synchronize(l->gpu->ctx);
            defer = status == PS_EBUSY; /* a stream capture is open: the span waits in the reuse state */
        }
        if (defer) {
            status = ps_reuse_defer(&l->reuse, s->base, bytes);
            if (status == PS_OK)
                s->kind = SPAN_PENDING_LARGE;
        } else if (status == PS_OK) {
            arena_global_put_locked(g, s, NULL, 0);
        }
    }
    if (status == PS_OK)
        l->in_use -= bytes;
    arena_global_unlock(g);
    return status;
}

void arena_large_reclaim(arena_large_t *l, arena_wait_t wait)
{
    arena_global_lock(l->global);
    ps_reuse_reclaim_pressure(&l->reuse, wait == ARENA_HOST_WAIT);
    arena_global_unlock(l->global);
}

arena_large_figures_t arena_large_figures(arena_large_t *l)
{
    arena_global_lock(l->global);
    arena_large_figures_t f = {.in_use = l->in_use,
                               .pending = l->reuse.bytes_pending,
                               .fences_recorded = l->fences + l->reuse.fences_recorded,
                               .fence_waits = l->reuse.fence_waits,
                               .barriers = l->reuse.barriers};
    arena_global_unlock(l->global);
    return f;
}
