/* arena_large: requests above half a superblock (core/arena.c, step 1;
 * types in core/arena_internal.h). Everything here runs under the global
 * lock.
 *
 * Algorithm:
 *  1. allocate(size): rounded up to a whole number of superblocks, taken
 *     as one run from the global arena (core/arena_global.c, best fit).
 *     Before that, under free_sync barrier, once the cudaFree'd large
 *     blocks pass PS_REUSE_BARRIER_PENDING_PERCENT (3 %) of the reserve
 *     and PS_REUSE_EAGER_FLOOR (core/reuse.c's ps_reuse_barrier_worth,
 *     the pool's eager trigger without its floors), one barrier releases
 *     them, so that they serve the next requests instead of those cutting
 *     other runs (replayed: docs/benchmarks.md, "The arena's design
 *     choices").
 *  2. When no free run fits: reclaim the pending large blocks (core/reuse.c:
 *     poll, then one barrier, or close and poll the epoch) and try again;
 *     then grow the global arena.
 *  3. free(ptr): stream-ordered, the run goes back to the global arena at
 *     once with a fence on that stream (taken only once it completed, or
 *     by another stream after a stream wait); with PS_STREAM_NONE it
 *     follows free_sync: deferred in large_reuse (barrier and event: one
 *     reuse state of the arena's family), after a device synchronize
 *     (device), at once (none).
 * Guarantees: a large block is handed out again only after a barrier begun
 * after its free, a fence recorded after its free completed, or a device
 * synchronize; a bad or double free returns PS_EINVAL and changes nothing.
 */
#include "arena_internal.h"

/* ---- large blocks (global lock) --------------------------------------- */

/* large_reuse's release callback (global lock held): the span at `item`
 * is free. */
static void release_pending_large(void *ctx, uint64_t item)
{
    arena_resource_t *a = ctx;
    arena_global_put(a, lookup(a, (uintptr_t)item), NULL, 0);
}

int arena_large_allocate(arena_resource_t *a, size_t size, ps_stream_t stream, void **out)
{
    size_t pages = (size + a->opts.superblock_size - 1) >> a->shift;
    pthread_mutex_lock(&a->global_lock);
    span_t *s = NULL;
    /* the eager barrier (step 1: not only when no run fits, for while they
     * wait the requests they could serve cut other runs); then what is
     * free, then what completed fences free, then grow */
    ps_reuse_poll(&a->large_reuse);
    ps_reuse_barrier_case_t eager = {.reserved = a->reserved,
                                     .pending = a->large_reuse.bytes_pending,
                                     .percent = ps_reuse_eager_percent(&a->large_reuse)};
    if (ps_reuse_barrier_worth(&eager) == PS_REUSE_BARRIER)
        ps_reuse_barrier(&a->large_reuse);
    int status = arena_global_take(a, pages, stream, 0, &s);
    if (status == PS_ENOMEM && a->large_reuse.bytes_pending && ps_reuse_reclaim(&a->large_reuse))
        status = arena_global_take(a, pages, stream, 0, &s); /* after a barrier, or epochs that completed */
    if (status == PS_ENOMEM)
        status = arena_global_take(a, pages, stream, 1, &s);
    if (status == PS_OK) {
        s->kind = SPAN_LARGE;
        s->block_size = pages << a->shift;
        a->large_in_use += s->block_size;
        *out = (void *)s->base;
    }
    pthread_mutex_unlock(&a->global_lock);
    return status;
}

int arena_large_deallocate(arena_resource_t *a, span_t *s, void *ptr, ps_stream_t stream)
{
    pthread_mutex_lock(&a->global_lock);
    if (lookup(a, (uintptr_t)ptr) != s || s->kind != SPAN_LARGE || s->base != (uintptr_t)ptr) {
        pthread_mutex_unlock(&a->global_lock);
        return PS_EINVAL;
    }
    int status = PS_OK;
    uint64_t bytes = s->block_size;
    if (stream != PS_STREAM_NONE) {
        ps_fence_t *fence = NULL;
        if (a->gpu->fence_record(a->gpu->ctx, stream, &fence) == PS_OK) {
            atomic_fetch_add_explicit(&a->fences, 1, memory_order_relaxed);
            arena_global_put(a, s, fence, stream);
        } else {
            status = PS_EUPSTREAM;
        }
    } else {
        int defer = ps_reuse_defers(&a->large_reuse);
        if (!defer && a->opts.free_sync == PS_FREE_SYNC_DEVICE) {
            status = a->gpu->device_synchronize(a->gpu->ctx);
            defer = status == PS_EBUSY; /* a stream capture is open: the span waits in the reuse state */
        }
        if (defer) {
            status = ps_reuse_defer(&a->large_reuse, s->base, bytes);
            if (status == PS_OK)
                s->kind = SPAN_PENDING_LARGE;
        } else if (status == PS_OK) {
            arena_global_put(a, s, NULL, 0);
        }
    }
    if (status == PS_OK)
        a->large_in_use -= bytes;
    pthread_mutex_unlock(&a->global_lock);
    return status;
}

/* The eager trigger at the pool's default percentage (step 1). */
void arena_large_init(arena_resource_t *a)
{
    ps_reuse_init(&a->large_reuse, a->gpu, a->opts.free_sync, PS_REUSE_BARRIER_PENDING_PERCENT, &a->family,
                  release_pending_large, a);
}
