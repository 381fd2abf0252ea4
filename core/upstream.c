/* Upstream resources: cuda, async, managed and host (pinned host memory), each a thin resource over
 * one pair of GPU-ops calls (core/upstream.h).
 *
 * Algorithm:
 *  1. allocate: size 0 becomes a minimal 256-byte block (a unique pointer);
 *     one GPU call (mem_alloc / mem_alloc_async / mem_alloc_managed); the
 *     pointer and its size go into a hash set of live pointers.
 *  2. deallocate: a pointer not in the set is PS_EINVAL and nothing is
 *     called; otherwise one GPU call (mem_free / mem_free_async) and the
 *     pointer leaves the set.
 *  3. query reports bytes reserved (= in use: nothing is cached), its peak,
 *     and the upstream call counts; destroy frees every live pointer.
 * Guarantees: thread-safe (a mutex around the set, never held across a GPU
 * call); the `cuda` resource can therefore stand alone as a passthrough
 * stack that rejects foreign and double frees.
 * The async resource's release_threshold is kept for the shim's GPU ops
 * (they set it on the device's mempool); on the host it has no effect.
 * The async resource and cudaMalloc/cudaFree semantics (PS_STREAM_NONE):
 * CUDA's pool frees in stream order, so a plain free on the legacy stream
 * would let the next allocation reuse the block while a kernel on a
 * non-blocking stream still writes it (the GPU hazard test caught exactly
 * that). So a PS_STREAM_NONE free first makes the legacy stream wait for a
 * fence on every stream, then frees on the legacy stream; and a
 * PS_STREAM_NONE allocation waits on the host until the legacy stream has
 * passed the allocation, since the program may use the memory on any
 * stream at once. Without a fence for the allocation: synchronize the
 * device. Without one for a free (a stream capture is open, where a device
 * synchronize would invalidate the capture — the GPU soak caught it): the
 * block is deferred (counted reserved and pending) and freed by the next
 * call that can record a fence.
 */
#include "upstream.h"

#include "ptr_map.h"

#include <pthread.h>
#include <stdlib.h>

/* Which GPU-ops pair an upstream uses. */
typedef enum upstream_kind { UPSTREAM_CUDA, UPSTREAM_ASYNC, UPSTREAM_MANAGED, UPSTREAM_HOST } upstream_kind_t;

typedef struct upstream {
    ps_resource_t base;          /* the resource (first member) */
    const ps_gpu_ops_t *gpu;     /* the device's GPU-ops table */
    upstream_kind_t kind;        /* cuda, async or managed */
    uint64_t release_threshold;  /* async only: bytes CUDA's pool keeps cached */
    unsigned host_flags;         /* host only: PS_HOST_ALLOC_* flags of every allocation */
    pthread_mutex_t lock;        /* guards the fields below */
    ps_ptr_map_t live;           /* pointer -> size of each live allocation */
    uint64_t bytes_reserved;     /* sum of live sizes */
    uint64_t peak_bytes_reserved; /* maximum of bytes_reserved */
    uint64_t upstream_allocs;    /* successful allocations */
    uint64_t upstream_frees;     /* successful frees */
    /* async only: cudaFree'd blocks whose ordering fence could not be had (a
     * stream capture was open: a device synchronize would invalidate it), freed
     * at the next call that can record one */
    void **deferred;             /* the blocks */
    size_t *deferred_sizes;      /* their sizes */
    size_t deferred_count, deferred_capacity;
    uint64_t deferred_bytes;     /* sum of deferred_sizes (reserved, pending) */
} upstream_t;

/* The smallest block handed out (size 0 asks for this). */
#define UPSTREAM_MIN_BLOCK 256

static ps_stream_t upstream_stream(ps_stream_t stream)
{
    return stream == PS_STREAM_NONE ? (ps_stream_t)0 : stream;
}

/* async + PS_STREAM_NONE free: the legacy stream waits for every stream.
 * PS_OK: frees on the legacy stream are now ordered after all work so far;
 * otherwise (a capture is open, so no fence, and a device synchronize would
 * break the capture) the caller defers the free. */
static int async_order_free_after_all_streams(upstream_t *up)
{
    ps_fence_t *fence;
    int status = up->gpu->fence_record(up->gpu->ctx, PS_STREAM_NONE, &fence);
    if (status != PS_OK)
        return status;
    status = up->gpu->stream_wait_fence(up->gpu->ctx, PS_STREAM_LEGACY, fence);
    up->gpu->fence_release(up->gpu->ctx, fence);
    return status;
}

/* Keeps a cudaFree'd block for later (lock held). PS_ENOMEM: no room. */
static int defer_locked(upstream_t *up, void *ptr, size_t size)
{
    if (up->deferred_count == up->deferred_capacity) {
        size_t capacity = up->deferred_capacity ? up->deferred_capacity * 2 : 16;
        void **blocks = realloc(up->deferred, capacity * sizeof *blocks);
        if (!blocks)
            return PS_ENOMEM;
        up->deferred = blocks;
        size_t *sizes = realloc(up->deferred_sizes, capacity * sizeof *sizes);
        if (!sizes)
            return PS_ENOMEM;
        up->deferred_sizes = sizes;
        up->deferred_capacity = capacity;
    }
    up->deferred[up->deferred_count] = ptr;
    up->deferred_sizes[up->deferred_count++] = size;
    up->deferred_bytes += size;
    return PS_OK;
}

/* Frees the deferred blocks once a fence orders them after all work (any
 * thread, any call); nothing when none is deferred or a capture is still open. */
static void async_flush_deferred(upstream_t *up)
{
    pthread_mutex_lock(&up->lock);
    size_t count = up->deferred_count;
    pthread_mutex_unlock(&up->lock);
    if (!count || async_order_free_after_all_streams(up) != PS_OK)
        return;
    pthread_mutex_lock(&up->lock);
    for (size_t i = 0; i < up->deferred_count; i++) {
        if (up->gpu->mem_free_async(up->gpu->ctx, up->deferred[i], 0) == PS_OK)
            up->upstream_frees++;
        up->bytes_reserved -= up->deferred_sizes[i];
    }
    up->deferred_count = 0;
    up->deferred_bytes = 0;
    pthread_mutex_unlock(&up->lock);
}

/* async + PS_STREAM_NONE allocation: usable by every stream on return. */
static void async_wait_allocation(upstream_t *up)
{
    ps_fence_t *fence;
    if (up->gpu->fence_record(up->gpu->ctx, PS_STREAM_LEGACY, &fence) == PS_OK) {
        int status = up->gpu->fence_wait(up->gpu->ctx, fence);
        up->gpu->fence_release(up->gpu->ctx, fence);
        if (status == PS_OK)
            return;
    }
    up->gpu->device_synchronize(up->gpu->ctx);
}

/* The GPU call that gives `ptr` back, for the upstream's kind. */
static int upstream_free(upstream_t *up, void *ptr, size_t size, ps_stream_t stream)
{
    switch (up->kind) {
    case UPSTREAM_ASYNC: return up->gpu->mem_free_async(up->gpu->ctx, ptr, upstream_stream(stream));
    case UPSTREAM_HOST: return up->gpu->host_free(up->gpu->ctx, ptr, size);
    default: return up->gpu->mem_free(up->gpu->ctx, ptr, size);
    }
}

static int upstream_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    upstream_t *up = (upstream_t *)r;
    if (size == 0)
        size = UPSTREAM_MIN_BLOCK;
    pthread_mutex_lock(&up->lock);
    int status = ps_ptr_map_reserve(&up->live, 1); /* room first: the insert cannot fail later */
    pthread_mutex_unlock(&up->lock);
    if (status != PS_OK)
        return status;
    if (up->kind == UPSTREAM_ASYNC)
        async_flush_deferred(up);
    void *ptr = NULL;
    switch (up->kind) {
    case UPSTREAM_CUDA: status = up->gpu->mem_alloc(up->gpu->ctx, size, &ptr); break;
    case UPSTREAM_ASYNC:
        status = up->gpu->mem_alloc_async(up->gpu->ctx, size, upstream_stream(stream), &ptr);
        break;
    case UPSTREAM_MANAGED: status = up->gpu->mem_alloc_managed(up->gpu->ctx, size, &ptr); break;
    case UPSTREAM_HOST: status = up->gpu->host_alloc(up->gpu->ctx, size, up->host_flags, &ptr); break;
    }
    if (status != PS_OK)
        return status;
    if (up->kind == UPSTREAM_ASYNC && stream == PS_STREAM_NONE)
        async_wait_allocation(up);
    pthread_mutex_lock(&up->lock);
    /* another thread may have used the reserved slot: reserve again */
    if (ps_ptr_map_reserve(&up->live, 1) != PS_OK) {
        pthread_mutex_unlock(&up->lock);
        upstream_free(up, ptr, size, stream);
        return PS_ENOMEM;
    }
    ps_ptr_map_put(&up->live, (uintptr_t)ptr, size);
    up->bytes_reserved += size;
    if (up->bytes_reserved > up->peak_bytes_reserved)
        up->peak_bytes_reserved = up->bytes_reserved;
    up->upstream_allocs++;
    pthread_mutex_unlock(&up->lock);
    *out = ptr;
    return PS_OK;
}

static int upstream_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    upstream_t *up = (upstream_t *)r;
    uint64_t live_size;
    pthread_mutex_lock(&up->lock);
    int known = ps_ptr_map_remove(&up->live, (uintptr_t)ptr, &live_size);
    pthread_mutex_unlock(&up->lock);
    if (!known)
        return PS_EINVAL;
    if (up->kind == UPSTREAM_ASYNC && stream == PS_STREAM_NONE) {
        if (async_order_free_after_all_streams(up) != PS_OK) {
            pthread_mutex_lock(&up->lock);
            int status = defer_locked(up, ptr, (size_t)live_size);
            if (status != PS_OK)
                ps_ptr_map_put(&up->live, (uintptr_t)ptr, live_size); /* the slot is still there */
            pthread_mutex_unlock(&up->lock);
            return status;
        }
        async_flush_deferred(up); /* the fence just recorded covers them too */
    }
    int status = upstream_free(up, ptr, (size_t)live_size, stream);
    pthread_mutex_lock(&up->lock);
    if (status == PS_OK) {
        up->bytes_reserved -= live_size;
        up->upstream_frees++;
    } else {
        ps_ptr_map_put(&up->live, (uintptr_t)ptr, live_size); /* the slot is still there */
    }
    pthread_mutex_unlock(&up->lock);
    return status;
}

static void upstream_query(ps_resource_t *r, ps_resource_info_t *info)
{
    upstream_t *up = (upstream_t *)r;
    pthread_mutex_lock(&up->lock);
    info->bytes_in_use += up->bytes_reserved - up->deferred_bytes;
    info->bytes_pending += up->deferred_bytes;
    info->bytes_reserved += up->bytes_reserved;
    info->peak_bytes_reserved += up->peak_bytes_reserved;
    info->upstream_allocs += up->upstream_allocs;
    info->upstream_frees += up->upstream_frees;
    pthread_mutex_unlock(&up->lock);
}

static void upstream_destroy(ps_resource_t *r)
{
    upstream_t *up = (upstream_t *)r;
    for (size_t i = 0; i < up->live.capacity; i++) {
        ps_ptr_map_slot_t *slot = &up->live.slots[i];
        if (slot->key == PS_PTR_MAP_EMPTY)
            continue;
        upstream_free(up, (void *)slot->key, (size_t)slot->value, 0);
    }
    for (size_t i = 0; i < up->deferred_count; i++)
        upstream_free(up, up->deferred[i], up->deferred_sizes[i], 0);
    free(up->deferred);
    free(up->deferred_sizes);
    ps_ptr_map_free(&up->live);
    pthread_mutex_destroy(&up->lock);
    free(up);
}

static const ps_resource_ops_t async_ops;

size_t ps_upstream_release_all(ps_resource_t *r)
{
    if (!r || r->ops != &async_ops)
        return 0;
    upstream_t *up = (upstream_t *)r;
    size_t released = 0;
    pthread_mutex_lock(&up->lock);
    for (size_t i = 0; i < up->live.capacity; i++) {
        ps_ptr_map_slot_t *slot = &up->live.slots[i];
        if (slot->key == PS_PTR_MAP_EMPTY)
            continue;
        if (up->gpu->mem_free_async(up->gpu->ctx, (void *)slot->key, 0) == PS_OK)
            released++;
    }
    for (size_t i = 0; i < up->deferred_count; i++)
        if (up->gpu->mem_free_async(up->gpu->ctx, up->deferred[i], 0) == PS_OK)
            released++;
    up->deferred_count = 0;
    up->deferred_bytes = 0;
    ps_ptr_map_free(&up->live);
    ps_ptr_map_init(&up->live, 64);
    up->upstream_frees += released;
    up->bytes_reserved = 0;
    pthread_mutex_unlock(&up->lock);
    return released;
}

static const ps_resource_ops_t cuda_ops = {"cuda", upstream_allocate, upstream_deallocate, NULL,
                                           upstream_query, upstream_destroy};
static const ps_resource_ops_t async_ops = {"async", upstream_allocate, upstream_deallocate, NULL,
                                            upstream_query, upstream_destroy};
static const ps_resource_ops_t managed_ops = {"managed", upstream_allocate, upstream_deallocate,
                                              NULL, upstream_query, upstream_destroy};

static const ps_resource_ops_t host_ops = {"host", upstream_allocate, upstream_deallocate, NULL,
                                           upstream_query, upstream_destroy};

static int upstream_create(const char *name, const ps_gpu_ops_t *gpu, upstream_kind_t kind,
                           const ps_resource_ops_t *ops, ps_resource_t **out)
{
    if (!gpu || !out)
        return PS_EINVAL;
    if ((kind == UPSTREAM_CUDA && (!gpu->mem_alloc || !gpu->mem_free)) ||
        (kind == UPSTREAM_ASYNC && (!gpu->mem_alloc_async || !gpu->mem_free_async)) ||
        (kind == UPSTREAM_MANAGED && (!gpu->mem_alloc_managed || !gpu->mem_free)) ||
        (kind == UPSTREAM_HOST && (!gpu->host_alloc || !gpu->host_free))) {
        ps_error("%s upstream: the device does not offer this allocator", ops->type_name);
        return PS_EUNSUPPORTED;
    }
    upstream_t *up = calloc(1, sizeof *up);
    if (!up)
        return PS_ENOMEM;
    if (ps_ptr_map_init(&up->live, 64) != PS_OK) {
        free(up);
        return PS_ENOMEM;
    }
    pthread_mutex_init(&up->lock, NULL);
    ps_resource_init(&up->base, ops, name, NULL);
    up->gpu = gpu;
    up->kind = kind;
    *out = &up->base;
    return PS_OK;
}

int ps_cuda_resource_create(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out)
{
    return upstream_create(name, gpu, UPSTREAM_CUDA, &cuda_ops, out);
}

int ps_async_resource_create(const char *name, const ps_gpu_ops_t *gpu,
                             uint64_t release_threshold, ps_resource_t **out)
{
    int status = upstream_create(name, gpu, UPSTREAM_ASYNC, &async_ops, out);
    if (status == PS_OK)
        ((upstream_t *)*out)->release_threshold = release_threshold;
    return status;
}

int ps_managed_resource_create(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out)
{
    return upstream_create(name, gpu, UPSTREAM_MANAGED, &managed_ops, out);
}

int ps_host_resource_create(const char *name, const ps_gpu_ops_t *gpu, unsigned flags, ps_resource_t **out)
{
    int status = upstream_create(name, gpu, UPSTREAM_HOST, &host_ops, out);
    if (status == PS_OK)
        ((upstream_t *)*out)->host_flags = flags;
    return status;
}
