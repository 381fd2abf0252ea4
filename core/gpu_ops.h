/* The GPU-ops table: the only door from core/ to CUDA.
 *
 * Every algorithm in core/ reaches the device through one of these tables,
 * one table per device. The shim fills it with the real driver functions
 * (shim/gpu_ops_cuda.c); the CPU tests and `poolshim replay --simulate` fill
 * it with host memory or simulated addresses and fake fences whose
 * completion the test controls (core/host_ops.c).
 *
 * A *fence* is a point in GPU time: "everything enqueued so far on these
 * streams". It is how the free policies know that a freed block can no
 * longer be touched by a running kernel:
 *   - fence_record(ctx, stream)          one stream (cudaFreeAsync model)
 *   - fence_record(ctx, PS_STREAM_NONE)  every stream that could touch
 *     memory: the legacy default stream (which orders after every blocking
 *     stream, per-thread default streams included) plus each live
 *     non-blocking stream the shim knows of. This closes a cudaFree epoch.
 * Fences are recycled by the implementation (an event pool), so recording
 * one costs a few event records, not an event creation.
 *
 * Return rule: PS_OK or a negative PS_E* code (core/common.h);
 * fence_query returns PS_OK when complete, PS_ENOTREADY when not yet.
 * All functions must be callable from any thread; the implementation makes
 * the right device/context current itself.
 */
#ifndef PS_GPU_OPS_H
#define PS_GPU_OPS_H

#include "common.h"

typedef struct ps_fence ps_fence_t; /* opaque, owned by the implementation */

typedef struct ps_gpu_ops {
    void *ctx;  /* implementation state (device, CUcontext, event pool...) */
    int device; /* device ordinal this table serves, or -1 when simulated */

    /* Device memory from the real allocator (cuMemAlloc_v2 / cuMemFree_v2,
     * never the intercepted ones). mem_alloc returns PS_ENOMEM when the
     * device is out of memory. */
    int (*mem_alloc)(void *ctx, size_t size, void **out);
    int (*mem_free)(void *ctx, void *ptr, size_t size);

    /* Stream-ordered upstream (cuMemAllocAsync on the device's default
     * mempool); may be NULL when not available. */
    int (*mem_alloc_async)(void *ctx, size_t size, ps_stream_t stream, void **out);
    int (*mem_free_async)(void *ctx, void *ptr, ps_stream_t stream);

    /* Managed memory (cuMemAllocManaged); may be NULL. */
    int (*mem_alloc_managed)(void *ctx, size_t size, void **out);

    /* Free and total bytes of the device (cuMemGetInfo_v2). */
    int (*mem_get_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);

    /* Fences (see above). fence_release returns the fence to the pool. */
    int (*fence_record)(void *ctx, ps_stream_t stream, ps_fence_t **out);
    int (*fence_query)(void *ctx, ps_fence_t *fence);
    int (*fence_wait)(void *ctx, ps_fence_t *fence);
    void (*fence_release)(void *ctx, ps_fence_t *fence);

    /* Make `stream` wait (on the GPU, not the host) for `fence`. */
    int (*stream_wait_fence)(void *ctx, ps_stream_t stream, ps_fence_t *fence);

    /* Host wait for the whole device (cuCtxSynchronize). */
    int (*device_synchronize)(void *ctx);
} ps_gpu_ops_t;

#endif
