/* The runtime door: cudaMalloc & co., exported so that programs linked to
 * libcudart.so (PyTorch, CuPy, `nvcc -cudart shared`) call these instead.
 * Our definitions are unversioned, which binds them to versioned
 * references such as cudaMalloc@libcudart.so.13.
 *
 * Every hook: (1) passes straight to the real function when called from
 * inside the shim (ps_in_shim) — the real runtime re-enters our driver
 * hooks, and must not be routed twice; (2) asks the router; (3) forwards
 * to the real runtime what the router does not take (size 0, NULL, stream
 * capture, foreign pointers, passthrough mode), with the guard set.
 */
#include "real.h"
#include "router.h"
#include "stats.h"

#define CALL_REAL_RT(name, ...)                                                      \
    do {                                                                             \
        ps_##name##_fn real_ = PS_REAL_RT(name);                                     \
        if (!real_)                                                                  \
            return 3; /* cudaErrorInitializationError: no CUDA runtime loaded */     \
        ps_in_shim++;                                                                \
        cudaError_t r_ = real_(__VA_ARGS__);                                         \
        ps_in_shim--;                                                                \
        return r_;                                                                   \
    } while (0)

static inline cudaError_t runtime_error(int status)
{
    return status == PS_OK ? cudaSuccess : status == PS_ENOMEM ? cudaErrorMemoryAllocation
                                         : status == PS_ECAPTURE ? cudaErrorStreamCaptureUnsupported
                                                                 : cudaErrorInvalidValue;
}

static cudaError_t malloc_common(int call, void **ptr, size_t size, ps_stream_t stream)
{
    int status;
    if (ps_route_allocate(call, PS_DOOR_RUNTIME, size, stream, ptr, &status) == PS_ROUTE_PASSTHROUGH)
        return (cudaError_t)-1;
    return runtime_error(status);
}

/* cudaMalloc and cudaFree keep their passthrough out of line (PS_COLD):
 * the served call's path then saves fewer registers. */
static PS_COLD cudaError_t real_malloc(void **devPtr, size_t size) { CALL_REAL_RT(cudaMalloc, devPtr, size); }

PS_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (!ps_in_shim && devPtr && size) {
        cudaError_t r = malloc_common(PS_CALL_CUDA_MALLOC, devPtr, size, PS_STREAM_NONE);
        if (r != (cudaError_t)-1)
            return r;
    }
    return real_malloc(devPtr, size);
}

static PS_COLD cudaError_t real_free(void *devPtr);

PS_EXPORT cudaError_t cudaFree(void *devPtr)
{
    if (!ps_in_shim && devPtr) {
        int status;
        if (ps_route_free(PS_CALL_CUDA_FREE, PS_DOOR_RUNTIME, devPtr, PS_STREAM_NONE, &status) == PS_ROUTE_DONE)
            return runtime_error(status);
    }
    return real_free(devPtr);
}

static cudaError_t real_free(void *devPtr)
{
    ps_cudaFree_fn real = PS_REAL_RT(cudaFree); /* includes cudaFree(NULL), which creates the context */
    if (!real)
        return 3;
    ps_in_shim++;
    cudaError_t r = real(devPtr);
    ps_in_shim--;
    if (r != cudaSuccess && devPtr && !ps_in_shim)
        ps_stats_count_foreign_invalid(); /* e.g. a stack address: CUDA said so itself */
    return r;
}

/* ---- pinned host memory (the host pool, router.c) ---- */
static cudaError_t host_alloc_common(void **pHost, size_t size, unsigned int flags)
{
    if (ps_in_shim || !pHost)
        return (cudaError_t)-1;
    int status;
    if (ps_route_host_alloc(PS_CALL_CUDA_HOST_ALLOC, PS_DOOR_RUNTIME, size, flags, pHost, &status) ==
        PS_ROUTE_PASSTHROUGH)
        return (cudaError_t)-1;
    return runtime_error(status);
}

PS_EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    cudaError_t r = host_alloc_common(pHost, size, flags);
    if (r != (cudaError_t)-1)
        return r;
    CALL_REAL_RT(cudaHostAlloc, pHost, size, flags);
}

PS_EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    cudaError_t r = host_alloc_common(ptr, size, 0);
    if (r != (cudaError_t)-1)
        return r;
    CALL_REAL_RT(cudaMallocHost, ptr, size);
}

PS_EXPORT cudaError_t cudaFreeHost(void *ptr)
{
    if (!ps_in_shim && ptr) {
        int status;
        if (ps_route_host_free(PS_CALL_CUDA_FREE_HOST, PS_DOOR_RUNTIME, ptr, &status) == PS_ROUTE_DONE)
            return runtime_error(status);
    }
    CALL_REAL_RT(cudaFreeHost, ptr);
}

/* ---- pinned blocks asked about: as the driver hooks (hooks_driver.c), for
 * programs linked to libcudart.so ---- */
PS_EXPORT cudaError_t cudaHostGetFlags(unsigned int *pFlags, void *pHost)
{
    int status;
    if (ps_route_pinned_flags(pHost, pFlags, &status) == PS_ROUTE_DONE)
        return runtime_error(status);
    CALL_REAL_RT(cudaHostGetFlags, pFlags, pHost);
}

PS_EXPORT cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    int status;
    if (ps_route_pinned_device_pointer(pHost, flags, pDevice, &status) == PS_ROUTE_DONE)
        return runtime_error(status);
    CALL_REAL_RT(cudaHostGetDevicePointer, pDevice, pHost, flags);
}

PS_EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    int status;
    if (ps_route_pinned_register(ptr, size, &status) == PS_ROUTE_DONE)
        return runtime_error(status);
    CALL_REAL_RT(cudaHostRegister, ptr, size, flags);
}

PS_EXPORT cudaError_t cudaHostUnregister(void *ptr)
{
    int status;
    if (ps_route_pinned_unregister(ptr, &status) == PS_ROUTE_DONE)
        return runtime_error(status);
    CALL_REAL_RT(cudaHostUnregister, ptr);
}

/* ---- stream-ordered allocation (ps_route_allocate_async / ps_route_free_async,
 * router.h); -1: call the real function ---- */
static inline cudaError_t malloc_async(void **devPtr, size_t size, cudaStream_t stream, bool per_thread)
{
    int status;
    if (ps_route_allocate_async(PS_CALL_CUDA_MALLOC_ASYNC, PS_DOOR_RUNTIME, size, stream, per_thread, devPtr,
                                &status) == PS_ROUTE_PASSTHROUGH)
        return (cudaError_t)-1;
    return runtime_error(status);
}

static inline cudaError_t free_async(void *devPtr, cudaStream_t stream, bool per_thread)
{
    int status;
    if (ps_route_free_async(PS_CALL_CUDA_FREE_ASYNC, PS_DOOR_RUNTIME, devPtr, stream, per_thread, &status) ==
        PS_ROUTE_PASSTHROUGH)
        return (cudaError_t)-1;
    return runtime_error(status);
}

PS_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    cudaError_t r = malloc_async(devPtr, size, stream, false);
    if (r != (cudaError_t)-1)
        return r;
    CALL_REAL_RT(cudaMallocAsync, devPtr, size, stream);
}

PS_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t stream)
{
    cudaError_t r = malloc_async(devPtr, size, stream, true);
    if (r != (cudaError_t)-1)
        return r;
    CALL_REAL_RT(cudaMallocAsync_ptsz, devPtr, size, stream);
}

PS_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
    cudaError_t r = free_async(devPtr, stream, false);
    if (r != (cudaError_t)-1)
        return r;
    CALL_REAL_RT(cudaFreeAsync, devPtr, stream);
}

PS_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t stream)
{
    cudaError_t r = free_async(devPtr, stream, true);
    if (r != (cudaError_t)-1)
        return r;
    CALL_REAL_RT(cudaFreeAsync_ptsz, devPtr, stream);
}

PS_EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    ps_cudaMemGetInfo_fn real = PS_REAL_RT(cudaMemGetInfo);
    if (!real)
        return 3;
    ps_in_shim++;
    cudaError_t r = real(free_bytes, total_bytes);
    ps_in_shim--;
    if (r == cudaSuccess && free_bytes && !ps_in_shim)
        ps_route_meminfo(free_bytes);
    return r;
}

PS_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    ps_cudaStreamCreate_fn real = PS_REAL_RT(cudaStreamCreate);
    if (!real)
        return 3;
    ps_in_shim++;
    cudaError_t r = real(pStream);
    ps_in_shim--;
    if (r == cudaSuccess && pStream)
        ps_streams_created(*pStream, 0); /* a blocking stream: the legacy stream orders it (only counted) */
    return r;
}

PS_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    ps_cudaStreamCreateWithFlags_fn real = PS_REAL_RT(cudaStreamCreateWithFlags);
    if (!real)
        return 3;
    ps_in_shim++;
    cudaError_t r = real(pStream, flags);
    ps_in_shim--;
    if (r == cudaSuccess && pStream)
        ps_streams_created(*pStream, flags);
    return r;
}

PS_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority)
{
    ps_cudaStreamCreateWithPriority_fn real = PS_REAL_RT(cudaStreamCreateWithPriority);
    if (!real)
        return 3;
    ps_in_shim++;
    cudaError_t r = real(pStream, flags, priority);
    ps_in_shim--;
    if (r == cudaSuccess && pStream)
        ps_streams_created(*pStream, flags);
    return r;
}

PS_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    ps_streams_destroyed(stream);
    CALL_REAL_RT(cudaStreamDestroy, stream);
}

PS_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    int status;
    if (!ps_in_shim && handle &&
        ps_route_ipc_get("cudaIpcGetMemHandle", (uintptr_t)devPtr, handle, &status) == PS_ROUTE_DONE)
        return runtime_error(status);
    CALL_REAL_RT(cudaIpcGetMemHandle, handle, devPtr);
}

PS_EXPORT cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    int status;
    void *p = NULL;
    if (!ps_in_shim && devPtr &&
        ps_route_ipc_open("cudaIpcOpenMemHandle", PS_DOOR_RUNTIME, &handle, &p, &status) == PS_ROUTE_DONE) {
        if (status == PS_OK)
            *devPtr = p;
        return runtime_error(status);
    }
    CALL_REAL_RT(cudaIpcOpenMemHandle, devPtr, handle, flags);
}

PS_EXPORT cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    int status;
    if (!ps_in_shim && ps_route_ipc_close((uintptr_t)devPtr, &status) == PS_ROUTE_DONE)
        return runtime_error(status);
    CALL_REAL_RT(cudaIpcCloseMemHandle, devPtr);
}
