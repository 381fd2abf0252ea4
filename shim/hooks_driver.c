/* The driver door: cuMemAlloc_v2 & co.
 *
 * Programs built by plain nvcc link cudart statically; that cudart, like
 * the shared one, dlopens libcuda.so.1 and fetches every driver function
 * through cuGetProcAddress_v2(name, &fn, cudaVersion, flags, &status). We
 * catch it in two places: our dlsym hands out our cuGetProcAddress
 * wrappers (hooks_dlsym.c), and the wrappers below replace the functions
 * we hook. Programs linked to libcuda directly call the exported hooks.
 *
 * How the wrapper picks a hook: it asks the real cuGetProcAddress first,
 * so the driver itself resolves `cudaVersion` and `flags` (legacy or
 * per-thread default stream: the _ptsz variants) and fills symbolStatus.
 * Then, if the returned address is the real function of one of our hooks,
 * it hands out that hook instead. Everything else comes back unchanged.
 */
#include <stdio.h>

#include "hooks.h"
#include "real.h"
#include "router.h"
#include "stats.h"

#define PASS_REAL(name, ...)                                                        \
    do {                                                                            \
        if (!ps_real.name && ps_real_load_driver() != PS_OK)                        \
            return CUDA_ERROR_NOT_INITIALIZED;                                      \
        if (!ps_real.name)                                                          \
            return CUDA_ERROR_NOT_FOUND;                                            \
        return ps_real.name(__VA_ARGS__);                                           \
    } while (0)

/* A memory pool's access: CUDA sets it; if it is a device's own pool and it
 * was opened to another device, that device's stream-ordered allocations
 * go to CUDA's pool from then on (ps_route_pool_access). */
PS_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    if (!ps_real.cuMemPoolSetAccess && ps_real_load_driver() != PS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ps_real.cuMemPoolSetAccess)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = ps_real.cuMemPoolSetAccess(pool, map, count);
    if (r == CUDA_SUCCESS && !ps_in_shim && map && count)
        ps_route_pool_access(pool, map, count);
    return r;
}

static inline CUresult driver_error(int status)
{
    return status == PS_OK ? CUDA_SUCCESS : status == PS_ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY
                                          : status == PS_ECAPTURE ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
                                                                  : CUDA_ERROR_INVALID_VALUE;
}

/* cuMemAlloc_v2 and cuMemFree_v2 keep their passthrough out of line
 * (PS_COLD): the served call's path then saves fewer registers. */
static PS_COLD CUresult real_mem_alloc(CUdeviceptr *dptr, size_t bytesize) { PASS_REAL(cuMemAlloc_v2, dptr, bytesize); }

PS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    if (!ps_in_shim && dptr && bytesize) {
        int status;
        if (ps_route_allocate(PS_CALL_CU_MEM_ALLOC, PS_DOOR_DRIVER, bytesize, PS_STREAM_NONE, (void **)dptr,
                              &status) == PS_ROUTE_DONE)
            return driver_error(status);
    }
    return real_mem_alloc(dptr, bytesize);
}

static PS_COLD CUresult real_mem_free(CUdeviceptr dptr);

PS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    if (!ps_in_shim && dptr) {
        int status;
        if (ps_route_free(PS_CALL_CU_MEM_FREE, PS_DOOR_DRIVER, (void *)(uintptr_t)dptr, PS_STREAM_NONE, &status) ==
            PS_ROUTE_DONE)
            return driver_error(status);
    }
    return real_mem_free(dptr);
}

static CUresult real_mem_free(CUdeviceptr dptr)
{
    if (!ps_real.cuMemFree_v2 && ps_real_load_driver() != PS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = ps_real.cuMemFree_v2(dptr);
    if (r != CUDA_SUCCESS && dptr && !ps_in_shim)
        ps_stats_count_foreign_invalid();
    return r;
}

/* ---- device allocations the shim does not serve: retried once after a give-back ----
 * When CUDA answers one of them "out of memory", the pool of the call's
 * device may hold the memory it needs, freed by the program: the router
 * gives back what the GPU is done with and the call is made once more
 * (router.c, 9.). `device_` is evaluated only then: an ordinal, -1 for the
 * current context's device, below -1 for none (host memory). */
#define RETRY_AFTER_GIVE_BACK(name, api, device_, ...)                              \
    do {                                                                            \
        if (!ps_real.name && ps_real_load_driver() != PS_OK)                        \
            return CUDA_ERROR_NOT_INITIALIZED;                                      \
        if (!ps_real.name)                                                          \
            return CUDA_ERROR_NOT_FOUND;                                            \
        uint64_t epoch_ = ps_route_oom_epoch();                                     \
        CUresult r_ = ps_real.name(__VA_ARGS__);                                    \
        if (PS_UNLIKELY(r_ == CUDA_ERROR_OUT_OF_MEMORY) && !ps_in_shim) {           \
            int device_of_call_ = (device_);                                        \
            bool asked_ = false;                                                    \
            if (ps_route_oom_give_back(&device_of_call_, epoch_, api, &asked_)) {   \
                uint64_t again_ = ps_route_oom_epoch();                             \
                r_ = ps_real.name(__VA_ARGS__);                                     \
                /* the pool's part was not enough: the neighbours' */               \
                if (r_ == CUDA_ERROR_OUT_OF_MEMORY && !asked_ &&                    \
                    ps_route_oom_ask_neighbours(device_of_call_, again_))           \
                    r_ = ps_real.name(__VA_ARGS__);                                 \
                ps_route_oom_retried(device_of_call_, api, r_ == CUDA_SUCCESS);     \
            }                                                                       \
        }                                                                           \
        return r_;                                                                  \
    } while (0)

/* The device cuMemCreate places its memory on; -2 for host memory (not the pool's). */
static int location_device(const CUmemAllocationProp *prop)
{
    return prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -2;
}

PS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags)
{
    RETRY_AFTER_GIVE_BACK(cuMemCreate, "cuMemCreate", location_device(prop), handle, size, prop, flags);
}

PS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    RETRY_AFTER_GIVE_BACK(cuMemAllocManaged, "cuMemAllocManaged", -1, dptr, bytesize, flags);
}

/* (the pool's device is taken to be the current one: CUDA does not say) */
PS_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
    RETRY_AFTER_GIVE_BACK(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", -1, dptr, bytesize, pool, stream);
}

PS_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream stream)
{
    RETRY_AFTER_GIVE_BACK(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", -1, dptr, bytesize, pool, stream);
}

PS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                      unsigned int element_size)
{
    RETRY_AFTER_GIVE_BACK(cuMemAllocPitch_v2, "cuMemAllocPitch", -1, dptr, pitch, width, height, element_size);
}

PS_EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    RETRY_AFTER_GIVE_BACK(cuArrayCreate_v2, "cuArrayCreate", -1, array, desc);
}

PS_EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    RETRY_AFTER_GIVE_BACK(cuArray3DCreate_v2, "cuArray3DCreate", -1, array, desc);
}

PS_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                          unsigned int levels)
{
    RETRY_AFTER_GIVE_BACK(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", -1, array, desc, levels);
}

/* ---- pinned host memory (the host pool, router.c) ---- */
PS_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    if (!ps_in_shim && pp) {
        int status;
        if (ps_route_host_alloc(PS_CALL_CU_MEM_HOST_ALLOC, PS_DOOR_DRIVER, bytesize, Flags, pp, &status) ==
            PS_ROUTE_DONE)
            return driver_error(status);
    }
    PASS_REAL(cuMemHostAlloc, pp, bytesize, Flags);
}

PS_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    if (!ps_in_shim && pp) {
        int status;
        if (ps_route_host_alloc(PS_CALL_CU_MEM_HOST_ALLOC, PS_DOOR_DRIVER, bytesize, 0, pp, &status) ==
            PS_ROUTE_DONE)
            return driver_error(status);
    }
    PASS_REAL(cuMemAllocHost_v2, pp, bytesize);
}

PS_EXPORT CUresult cuMemFreeHost(void *p)
{
    if (!ps_in_shim && p) {
        int status;
        if (ps_route_host_free(PS_CALL_CU_MEM_FREE_HOST, PS_DOOR_DRIVER, p, &status) == PS_ROUTE_DONE)
            return driver_error(status);
    }
    PASS_REAL(cuMemFreeHost, p);
}

/* ---- pinned blocks asked about: answered for blocks of ours as CUDA
 * answers for cuMemHostAlloc memory (ps_route_pinned_*, router.h) ---- */
PS_EXPORT CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
    int status;
    if (ps_route_pinned_flags(p, pFlags, &status) == PS_ROUTE_DONE)
        return driver_error(status);
    PASS_REAL(cuMemHostGetFlags, pFlags, p);
}

PS_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    int status;
    void *device_pointer;
    if (pdptr && ps_route_pinned_device_pointer(p, Flags, &device_pointer, &status) == PS_ROUTE_DONE) {
        if (status == PS_OK)
            *pdptr = (CUdeviceptr)(uintptr_t)device_pointer;
        return driver_error(status);
    }
    PASS_REAL(cuMemHostGetDevicePointer_v2, pdptr, p, Flags);
}

PS_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    int status;
    if (ps_route_pinned_register(p, bytesize, &status) == PS_ROUTE_DONE)
        return driver_error(status);
    PASS_REAL(cuMemHostRegister_v2, p, bytesize, Flags);
}

PS_EXPORT CUresult cuMemHostUnregister(void *p)
{
    int status;
    if (ps_route_pinned_unregister(p, &status) == PS_ROUTE_DONE)
        return driver_error(status);
    PASS_REAL(cuMemHostUnregister, p);
}

/* ---- stream-ordered allocation (ps_route_allocate_async / ps_route_free_async,
 * router.h); 1 with *result when the shim answered, 0: call the real function ---- */
static inline int alloc_async(CUdeviceptr *dptr, size_t size, CUstream stream, bool per_thread, CUresult *result)
{
    int status;
    if (ps_route_allocate_async(PS_CALL_CU_MEM_ALLOC_ASYNC, PS_DOOR_DRIVER, size, stream, per_thread, (void **)dptr,
                                &status) == PS_ROUTE_PASSTHROUGH)
        return 0;
    *result = driver_error(status);
    return 1;
}

static inline int free_async(CUdeviceptr dptr, CUstream stream, bool per_thread, CUresult *result)
{
    int status;
    if (ps_route_free_async(PS_CALL_CU_MEM_FREE_ASYNC, PS_DOOR_DRIVER, (void *)(uintptr_t)dptr, stream, per_thread,
                            &status) == PS_ROUTE_PASSTHROUGH)
        return 0;
    *result = driver_error(status);
    return 1;
}

PS_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    CUresult r;
    if (alloc_async(dptr, bytesize, hStream, false, &r))
        return r;
    PASS_REAL(cuMemAllocAsync, dptr, bytesize, hStream);
}

PS_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    CUresult r;
    if (alloc_async(dptr, bytesize, hStream, true, &r))
        return r;
    PASS_REAL(cuMemAllocAsync_ptsz, dptr, bytesize, hStream);
}

PS_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    CUresult r;
    if (free_async(dptr, hStream, false, &r))
        return r;
    PASS_REAL(cuMemFreeAsync, dptr, hStream);
}

PS_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    CUresult r;
    if (free_async(dptr, hStream, true, &r))
        return r;
    PASS_REAL(cuMemFreeAsync_ptsz, dptr, hStream);
}

PS_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    if (!ps_real.cuMemGetInfo_v2 && ps_real_load_driver() != PS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = ps_real.cuMemGetInfo_v2(free_bytes, total_bytes);
    if (r == CUDA_SUCCESS && free_bytes && !ps_in_shim)
        ps_route_meminfo(free_bytes);
    return r;
}

PS_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    uintptr_t base;
    size_t size;
    int status;
    if (!ps_in_shim && ps_route_address_range((uintptr_t)dptr, &base, &size, &status) == PS_ROUTE_DONE) {
        if (status != PS_OK)
            return CUDA_ERROR_NOT_FOUND; /* inside a slab, in no live allocation */
        if (pbase)                       /* answer for the suballocation, not the slab */
            *pbase = (CUdeviceptr)base;
        if (psize)
            *psize = size;
        return CUDA_SUCCESS;
    }
    PASS_REAL(cuMemGetAddressRange_v2, pbase, psize, dptr);
}

/* ---- pointer queries of a pooled block: answered as for the kind of
 * allocation it stands in for (what CUDA answers: tests/gpu/cross_device_probe.cu):
 * - context: a cudaMalloc block its device's primary context, a
 *   stream-ordered one none (CUDA: none for mapped memory);
 * - range: the block (CUDA: the whole reserved range for mapped memory,
 *   the chunk for chunks);
 * - buffer id: one per block, new after a free (CUDA: one per piece or chunk);
 * - legacy IPC: 1 for a cudaMalloc block the shim can export (shim/ipc.c),
 *   else 0 (cudaMallocAsync memory: 0);
 * - allowed handle types: none, as for cudaMalloc memory; and a block's
 *   physical handle cannot be retained (invalid value, as for cudaMalloc and
 *   cudaMallocAsync memory): it may lie inside a piece or span several, and a
 *   library that exported "the" handle would map the wrong bytes.
 * Device ordinal, memory type, access flags and the rest are CUDA's. ---- */
static void block_attribute(int attribute, void *data, const ps_allocation_t *a)
{
    bool malloc_kind = a->stream == PS_STREAM_NONE;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = malloc_kind ? __atomic_load_n(&ps_device(a->device)->ctx, __ATOMIC_ACQUIRE) : NULL;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)a->ptr;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = a->size;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = ps_route_block_id(a->ptr);
        break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(int *)data = malloc_kind && ps_route_ipc_capable(a);
        break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        *(unsigned int *)data = 0; /* (CUDA writes at most the low bits: 0 or POSIX fd) */
        break;
    }
}

static bool block_answers(int attribute)
{
    return attribute == CU_POINTER_ATTRIBUTE_CONTEXT || attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ||
           attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE || attribute == CU_POINTER_ATTRIBUTE_BUFFER_ID ||
           attribute == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE ||
           attribute == CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES;
}

PS_EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    if (!ps_real.cuPointerGetAttribute && ps_real_load_driver() != PS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ps_real.cuPointerGetAttribute)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = ps_real.cuPointerGetAttribute(data, attribute, ptr);
    ps_allocation_t a;
    if (r == CUDA_SUCCESS && data && !ps_in_shim && block_answers(attribute) &&
        ps_route_pooled_block((uintptr_t)ptr, &a))
        block_attribute(attribute, data, &a);
    return r;
}

PS_EXPORT CUresult cuPointerGetAttributes(unsigned int count, int *attributes, void **data, CUdeviceptr ptr)
{
    if (!ps_real.cuPointerGetAttributes && ps_real_load_driver() != PS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ps_real.cuPointerGetAttributes)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = ps_real.cuPointerGetAttributes(count, attributes, data, ptr);
    if (r != CUDA_SUCCESS || ps_in_shim || !attributes || !data)
        return r;
    bool asked = false;
    for (unsigned i = 0; i < count && !asked; i++)
        asked = data[i] && block_answers(attributes[i]);
    ps_allocation_t a;
    if (asked && ps_route_pooled_block((uintptr_t)ptr, &a))
        for (unsigned i = 0; i < count; i++)
            if (data[i] && block_answers(attributes[i]))
                block_attribute(attributes[i], data[i], &a);
    return r;
}

PS_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    ps_allocation_t a;
    if (!ps_in_shim && ps_route_pooled_block((uintptr_t)addr, &a))
        return CUDA_ERROR_INVALID_VALUE;
    PASS_REAL(cuMemRetainAllocationHandle, handle, addr);
}

PS_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    int status;
    if (!ps_in_shim && pHandle &&
        ps_route_ipc_get("cuIpcGetMemHandle", (uintptr_t)dptr, pHandle, &status) == PS_ROUTE_DONE)
        return driver_error(status);
    PASS_REAL(cuIpcGetMemHandle, pHandle, dptr);
}

/* cuIpcOpenMemHandle (CUDA 10 ABI) and _v2: a handle of ours is opened by
 * the shim, any other goes to CUDA unchanged. */
static bool ipc_open(CUdeviceptr *pdptr, const CUipcMemHandle *handle, CUresult *r)
{
    void *p = NULL;
    int status;
    if (ps_in_shim || !pdptr ||
        ps_route_ipc_open("cuIpcOpenMemHandle", PS_DOOR_DRIVER, handle, &p, &status) != PS_ROUTE_DONE)
        return false;
    if (status == PS_OK)
        *pdptr = (CUdeviceptr)(uintptr_t)p;
    *r = driver_error(status);
    return true;
}

PS_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
    CUresult r;
    if (ipc_open(pdptr, &handle, &r))
        return r;
    PASS_REAL(cuIpcOpenMemHandle, pdptr, handle, flags);
}

PS_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
    CUresult r;
    if (ipc_open(pdptr, &handle, &r))
        return r;
    PASS_REAL(cuIpcOpenMemHandle_v2, pdptr, handle, flags);
}

PS_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    int status;
    if (!ps_in_shim && ps_route_ipc_close((uintptr_t)dptr, &status) == PS_ROUTE_DONE)
        return driver_error(status);
    PASS_REAL(cuIpcCloseMemHandle, dptr);
}

PS_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int flags)
{
    if (!ps_real.cuStreamCreate && ps_real_load_driver() != PS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = ps_real.cuStreamCreate(phStream, flags);
    if (r == CUDA_SUCCESS && phStream)
        ps_streams_created(*phStream, flags);
    return r;
}

PS_EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    if (!ps_real.cuStreamCreateWithPriority && ps_real_load_driver() != PS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = ps_real.cuStreamCreateWithPriority(phStream, flags, priority);
    if (r == CUDA_SUCCESS && phStream)
        ps_streams_created(*phStream, flags);
    return r;
}

PS_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
    ps_streams_destroyed(hStream);
    PASS_REAL(cuStreamDestroy_v2, hStream);
}

/* The unversioned entry (what cuGetProcAddress gives below version 4000,
 * and dlsym by that name): untracked, a destroyed stream stayed in the
 * barrier's list, which then queried and waited on a dead handle. */
PS_EXPORT CUresult cuStreamDestroy(CUstream hStream)
{
    ps_streams_destroyed(hStream);
    PASS_REAL(cuStreamDestroy, hStream);
}

/* Stream capture begins: through the gate (see ps_streams_capture_gate);
 * a global-mode capture that began is remembered (ps_streams_capture_begun). */
#define BEGIN_CAPTURE(name, stream_, mode_, ...)                                    \
    do {                                                                            \
        if (!ps_real.name && ps_real_load_driver() != PS_OK)                        \
            return CUDA_ERROR_NOT_INITIALIZED;                                      \
        if (!ps_real.name)                                                          \
            return CUDA_ERROR_NOT_FOUND;                                            \
        ps_streams_capture_gate();                                                  \
        CUresult r_ = ps_real.name(__VA_ARGS__);                                    \
        if (r_ == CUDA_SUCCESS)                                                     \
            ps_streams_capture_begun(stream_, mode_);                               \
        ps_streams_capture_gate_end();                                              \
        return r_;                                                                  \
    } while (0)

PS_EXPORT CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode)
{
    BEGIN_CAPTURE(cuStreamBeginCapture, s, mode, s, mode);
}
PS_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s, CUstreamCaptureMode mode)
{
    BEGIN_CAPTURE(cuStreamBeginCapture_ptsz, s, mode, s, mode);
}
PS_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
    BEGIN_CAPTURE(cuStreamBeginCapture_v2, s, mode, s, mode);
}
PS_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
    BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, s, mode, s, mode);
}
PS_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                               const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode)
{
    BEGIN_CAPTURE(cuStreamBeginCaptureToGraph, s, mode, s, g, deps, data, n, mode);
}
PS_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                    const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode)
{
    BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz, s, mode, s, g, deps, data, n, mode);
}

/* Peer access: mapped memory needs it granted per mapping (gpu_ops_cuda.c). */
PS_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    if (!ps_real.cuCtxEnablePeerAccess && ps_real_load_driver() != PS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ps_real.cuCtxEnablePeerAccess)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = ps_real.cuCtxEnablePeerAccess(peer, flags);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        ps_peer_access_enabled(peer);
    return r;
}

/* Device synchronize (cudaDeviceSynchronize reaches cuCtxSynchronize through
 * cuGetProcAddress): after it, the stack may give memory back (the pool's
 * release_threshold). _v2 names its context: only the current one counts. */
PS_EXPORT CUresult cuCtxSynchronize(void)
{
    if (!ps_real.cuCtxSynchronize && ps_real_load_driver() != PS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ps_real.cuCtxSynchronize)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = ps_real.cuCtxSynchronize();
    if (r == CUDA_SUCCESS)
        ps_route_device_synchronized();
    return r;
}

PS_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    if (!ps_real.cuCtxSynchronize_v2 && ps_real_load_driver() != PS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ps_real.cuCtxSynchronize_v2)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = ps_real.cuCtxSynchronize_v2(ctx);
    CUcontext current = NULL;
    if (r == CUDA_SUCCESS && (!ctx || (ps_real.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == ctx)))
        ps_route_device_synchronized();
    return r;
}

/* ---- cuGetProcAddress ------------------------------------------------------------ */
static CUresult replace_with_hook(CUresult r, void **pfn, const char *symbol, int version, cuuint64_t flags)
{
    const ps_hook_t *h = NULL;
    if (r == CUDA_SUCCESS && pfn && *pfn && !ps_process_disabled_early()) {
        h = ps_hook_by_real(*pfn);
        if (h)
            *pfn = h->hook;
    }
    if (ps_process_traces_lookups())
        dprintf(2, "poolshim: trace: cuGetProcAddress(%s, version %d, flags %llu)%s%s\n", symbol ? symbol : "?",
                version, (unsigned long long)flags, r == CUDA_SUCCESS ? "" : " -> not found",
                h ? " -> hooked" : "");
    return r;
}

PS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus)
{
    if (ps_real_load_driver() != PS_OK || !ps_real.cuGetProcAddress_v2)
        return CUDA_ERROR_NOT_INITIALIZED;
    return replace_with_hook(ps_real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus), pfn,
                             symbol, cudaVersion, flags);
}

PS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    if (ps_real_load_driver() != PS_OK || !ps_real.cuGetProcAddress)
        return CUDA_ERROR_NOT_INITIALIZED;
    return replace_with_hook(ps_real.cuGetProcAddress(symbol, pfn, cudaVersion, flags), pfn, symbol, cudaVersion,
                             flags);
}
