/* The shim's internal header: what the hook files, the router, the
 * registry and the real-function table share.
 *
 *   hooks_runtime.c  exported cudaMalloc & co. (programs linked to libcudart.so)
 *   hooks_driver.c   cuMemAlloc_v2 & co., exported and handed out by
 *                    cuGetProcAddress (static cudart, driver-API programs)
 *   hooks_dlsym.c    dlsym override: hands out our hooks for hooked names
 *   hook_table.c     the table of hooked names (lists the entry points, calls none)
 *   hooks_context.c  cudaDeviceReset, cuDevicePrimaryCtxReset/Release, cuCtxDestroy...:
 *                    a dead context's stack is dropped (router.c)
 *   real.c           the real CUDA functions, found without going through us
 *   router.c         lazy init, per-device stacks, allocate/free routing, context
 *                    lifecycle, streams/captures/peer access on their way to gpu_ops_cuda.c
 *   registry.c       device pointer -> owner (sharded hash, no global lock)
 *   ipc.c            IPC handles of pooled blocks: export table, service thread, imports
 *   gpu_ops_cuda.c   the GPU-ops table of core/ over the real driver, stream tracking,
 *                    the gate that keeps calls out of a dying context
 *   gpu_ops_cuda_vm.c  its virtual-memory entries: mapped pieces, pinned host pieces,
 *                    IPC export/import, peer access to mapped memory
 *                    (both share gpu_ops_cuda_internal.h)
 *   stats.c          the shim's counters and exit report
 *   hints.c          the exit report's hints (PyTorch's or CuPy's own cache was on)
 *   nvtx.c           debug.nvtx: chunks as NVTX heaps, blocks as regions (compute-sanitizer)
 *   nvtx_ranges.c    debug.nvtx_ranges: NVTX ranges around growth, maps, barriers, waits (Nsight)
 *
 * Calls go one way:
 *
 *   hooks_runtime.c hooks_driver.c hooks_context.c hooks_dlsym.c   (entry points)
 *        |    hook_table.c lists them for dlsym and cuGetProcAddress (a table, no calls)
 *        v
 *   router.c                                                       (decides)
 *        v                   (and core/'s stacks, which call the GPU-ops table)
 *   gpu_ops_cuda.c    registry.c    ipc.c    real.c                (do)
 *
 * A hook calls the router, real.c to pass a call through, and the hook
 * table; it never calls another hook file, gpu_ops_cuda.c or registry.c.
 * gpu_ops_cuda.c calls registry.c and real.c only; ipc.c calls the GPU-ops
 * table it is given (and reads ps_exiting); registry.c and real.c
 * call nothing here. stats.c and nvtx.c are leaves any of them may call; stats.c's
 * exit report, registered by the router, reads the router's device table
 * (ps_devices, ps_global: data, no call). Calls back up happen only
 * through CUDA (the real runtime entering our driver hooks), and
 * ps_in_shim passes them straight through.
 */
#ifndef PS_SHIM_H
#define PS_SHIM_H

#include <stdatomic.h>
#include <stdbool.h>

#include "../config/config.h"
#include "../core/common.h"
#include "../core/gpu_ops.h"
#include "../core/resource.h"
#include "cuda_abi.h"

#define PS_EXPORT __attribute__((visibility("default")))
#define PS_TLS __thread __attribute__((tls_model("initial-exec")))
#define PS_LIKELY(x) __builtin_expect(!!(x), 1)
#define PS_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* A rare path kept out of a hot function, so that it saves fewer registers. */
#define PS_COLD __attribute__((noinline, cold))

#define PS_MAX_DEVICES 64

/* ---- real.c: the real functions ---------------------------------------- */
/* X-macro of every real driver function the shim calls or hooks:
 * X(name, return type, parameter list). */
#define PS_REAL_DRIVER(X)                                                                  \
    X(cuInit, CUresult, (unsigned int))                                                    \
    X(cuGetProcAddress, CUresult, (const char *, void **, int, cuuint64_t))                 \
    X(cuGetProcAddress_v2, CUresult,                                                       \
      (const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))           \
    X(cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t))                                    \
    X(cuMemFree_v2, CUresult, (CUdeviceptr))                                               \
    X(cuMemAllocAsync, CUresult, (CUdeviceptr *, size_t, CUstream))                        \
    X(cuMemAllocAsync_ptsz, CUresult, (CUdeviceptr *, size_t, CUstream))                   \
    X(cuMemFreeAsync, CUresult, (CUdeviceptr, CUstream))                                   \
    X(cuMemFreeAsync_ptsz, CUresult, (CUdeviceptr, CUstream))                              \
    X(cuMemAllocManaged, CUresult, (CUdeviceptr *, size_t, unsigned int))                  \
    X(cuMemGetInfo_v2, CUresult, (size_t *, size_t *))                                     \
    X(cuMemGetAddressRange_v2, CUresult, (CUdeviceptr *, size_t *, CUdeviceptr))           \
    X(cuIpcGetMemHandle, CUresult, (CUipcMemHandle *, CUdeviceptr))                        \
    X(cuIpcOpenMemHandle, CUresult, (CUdeviceptr *, CUipcMemHandle, unsigned int))         \
    X(cuIpcOpenMemHandle_v2, CUresult, (CUdeviceptr *, CUipcMemHandle, unsigned int))      \
    X(cuIpcCloseMemHandle, CUresult, (CUdeviceptr))                                        \
    X(cuMemExportToShareableHandle, CUresult, (void *, CUmemGenericAllocationHandle, int, unsigned long long)) \
    X(cuMemImportFromShareableHandle, CUresult, (CUmemGenericAllocationHandle *, void *, int)) \
    X(cuCtxGetCurrent, CUresult, (CUcontext *))                                            \
    X(cuCtxGetDevice, CUresult, (CUdevice *))                                              \
    X(cuCtxPushCurrent_v2, CUresult, (CUcontext))                                          \
    X(cuCtxPopCurrent_v2, CUresult, (CUcontext *))                                         \
    X(cuCtxSynchronize, CUresult, (void))                                                  \
    X(cuCtxSynchronize_v2, CUresult, (CUcontext))                                          \
    X(cuCtxSetCurrent, CUresult, (CUcontext))                                              \
    X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice))                         \
    X(cuDevicePrimaryCtxRelease, CUresult, (CUdevice))                                     \
    X(cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice))                                  \
    X(cuDevicePrimaryCtxReset, CUresult, (CUdevice))                                       \
    X(cuDevicePrimaryCtxReset_v2, CUresult, (CUdevice))                                    \
    X(cuDevicePrimaryCtxSetFlags, CUresult, (CUdevice, unsigned int))                      \
    X(cuDevicePrimaryCtxSetFlags_v2, CUresult, (CUdevice, unsigned int))                   \
    X(cuDevicePrimaryCtxGetState, CUresult, (CUdevice, unsigned int *, int *))             \
    X(cuCtxDestroy, CUresult, (CUcontext))                                                 \
    X(cuCtxDestroy_v2, CUresult, (CUcontext))                                              \
    X(cuCtxGetId, CUresult, (CUcontext, unsigned long long *))                             \
    X(cuEventCreate, CUresult, (CUevent *, unsigned int))                                  \
    X(cuEventDestroy_v2, CUresult, (CUevent))                                              \
    X(cuEventRecord, CUresult, (CUevent, CUstream))                                        \
    X(cuEventQuery, CUresult, (CUevent))                                                   \
    X(cuEventSynchronize, CUresult, (CUevent))                                             \
    X(cuStreamWaitEvent, CUresult, (CUstream, CUevent, unsigned int))                      \
    X(cuStreamQuery, CUresult, (CUstream))                                                 \
    X(cuStreamCreate, CUresult, (CUstream *, unsigned int))                                \
    X(cuStreamCreateWithPriority, CUresult, (CUstream *, unsigned int, int))               \
    X(cuStreamDestroy_v2, CUresult, (CUstream))                                            \
    X(cuStreamGetCtx, CUresult, (CUstream, CUcontext *))                                   \
    X(cuStreamIsCapturing, CUresult, (CUstream, CUstreamCaptureStatus *))                  \
    X(cuStreamIsCapturing_ptsz, CUresult, (CUstream, CUstreamCaptureStatus *))             \
    X(cuThreadExchangeStreamCaptureMode, CUresult, (CUstreamCaptureMode *))                \
    X(cuStreamBeginCapture, CUresult, (CUstream, CUstreamCaptureMode))                      \
    X(cuStreamBeginCapture_ptsz, CUresult, (CUstream, CUstreamCaptureMode))                 \
    X(cuStreamBeginCapture_v2, CUresult, (CUstream, CUstreamCaptureMode))                   \
    X(cuStreamBeginCapture_v2_ptsz, CUresult, (CUstream, CUstreamCaptureMode))              \
    X(cuStreamBeginCaptureToGraph, CUresult,                                                \
      (CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t, CUstreamCaptureMode)) \
    X(cuStreamBeginCaptureToGraph_ptsz, CUresult,                                           \
      (CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t, CUstreamCaptureMode)) \
    X(cuDeviceGetAttribute, CUresult, (int *, int, CUdevice))                               \
    X(cuDeviceGetCount, CUresult, (int *))                                                  \
    X(cuDeviceGetUuid, CUresult, (CUuuid *, CUdevice))                                      \
    X(cuDeviceGetUuid_v2, CUresult, (CUuuid *, CUdevice))                                   \
    X(cuMemGetAllocationGranularity, CUresult, (size_t *, const CUmemAllocationProp *, int)) \
    X(cuMemAddressReserve, CUresult, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)) \
    X(cuMemAddressFree, CUresult, (CUdeviceptr, size_t))                                    \
    X(cuMemCreate, CUresult,                                                                \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
    X(cuMemRelease, CUresult, (CUmemGenericAllocationHandle))                               \
    X(cuMemMap, CUresult, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
    X(cuMemUnmap, CUresult, (CUdeviceptr, size_t))                                          \
    X(cuMemSetAccess, CUresult, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))      \
    X(cuCtxEnablePeerAccess, CUresult, (CUcontext, unsigned int))   \
    X(cuMemHostAlloc, CUresult, (void **, size_t, unsigned int))                            \
    X(cuMemAllocHost_v2, CUresult, (void **, size_t))                                       \
    X(cuMemFreeHost, CUresult, (void *))                                                    \
    X(cuMemHostRegister_v2, CUresult, (void *, size_t, unsigned int))                       \
    X(cuMemHostUnregister, CUresult, (void *))                                              \
    X(cuMemHostGetFlags, CUresult, (unsigned int *, void *))                                \
    X(cuMemHostGetDevicePointer_v2, CUresult, (CUdeviceptr *, void *, unsigned int))       \
    X(cuStreamSynchronize, CUresult, (CUstream))                                            \
    X(cuDeviceCanAccessPeer, CUresult, (int *, CUdevice, CUdevice))                         \
    X(cuStreamGetFlags, CUresult, (CUstream, unsigned int *))                               \
    X(cuMemPoolSetAccess, CUresult, (CUmemoryPool, const CUmemAccessDesc *, size_t))        \
    X(cuDeviceGetMemPool, CUresult, (CUmemoryPool *, CUdevice))                             \
    X(cuDeviceGetDefaultMemPool, CUresult, (CUmemoryPool *, CUdevice))                      \
    X(cuPointerGetAttribute, CUresult, (void *, int, CUdeviceptr))                          \
    X(cuPointerGetAttributes, CUresult, (unsigned int, int *, void **, CUdeviceptr))        \
    X(cuMemRetainAllocationHandle, CUresult, (CUmemGenericAllocationHandle *, void *))      \
    PS_OOM_RETRY_REALS(X)                                                                   \
    PS_COPY_REALS(X)

/* Device allocations the shim does not serve, hooked only to retry them
 * once after giving the pool's free memory back when CUDA answers "out of
 * memory" (hooks_driver.c, ps_route_oom_give_back). cuMemCreate and
 * cuMemAllocManaged are also the shim's own (the expandable pool, the
 * managed upstream): those calls go to ps_real, never through the hooks. */
#define PS_OOM_RETRY_REALS(X)                                                               \
    X(cuMemAllocFromPoolAsync, CUresult, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))   \
    X(cuMemAllocFromPoolAsync_ptsz, CUresult, (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(cuMemAllocPitch_v2, CUresult, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int)) \
    X(cuArrayCreate_v2, CUresult, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))               \
    X(cuArray3DCreate_v2, CUresult, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))           \
    X(cuMipmappedArrayCreate, CUresult, (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int))

/* Copies and memsets (hooks_copy.c: a copy of pooled memory made while
 * another device is current is ordered as CUDA orders cudaMalloc memory,
 * copy_order.c). _ptds/_ptsz: the per-thread default stream variants. */
#define PS_COPY_REALS(X)                                                                    \
    X(cuMemcpy, CUresult, (CUdeviceptr, CUdeviceptr, size_t))                               \
    X(cuMemcpy_ptds, CUresult, (CUdeviceptr, CUdeviceptr, size_t))                          \
    X(cuMemcpyAsync, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                \
    X(cuMemcpyAsync_ptsz, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))           \
    X(cuMemcpyHtoD_v2, CUresult, (CUdeviceptr, const void *, size_t))                       \
    X(cuMemcpyHtoD_v2_ptds, CUresult, (CUdeviceptr, const void *, size_t))                  \
    X(cuMemcpyDtoH_v2, CUresult, (void *, CUdeviceptr, size_t))                             \
    X(cuMemcpyDtoH_v2_ptds, CUresult, (void *, CUdeviceptr, size_t))                        \
    X(cuMemcpyDtoD_v2, CUresult, (CUdeviceptr, CUdeviceptr, size_t))                        \
    X(cuMemcpyDtoD_v2_ptds, CUresult, (CUdeviceptr, CUdeviceptr, size_t))                   \
    X(cuMemcpyHtoDAsync_v2, CUresult, (CUdeviceptr, const void *, size_t, CUstream))        \
    X(cuMemcpyHtoDAsync_v2_ptsz, CUresult, (CUdeviceptr, const void *, size_t, CUstream))   \
    X(cuMemcpyDtoHAsync_v2, CUresult, (void *, CUdeviceptr, size_t, CUstream))              \
    X(cuMemcpyDtoHAsync_v2_ptsz, CUresult, (void *, CUdeviceptr, size_t, CUstream))         \
    X(cuMemcpyDtoDAsync_v2, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))         \
    X(cuMemcpyDtoDAsync_v2_ptsz, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))    \
    X(cuMemcpy2D_v2, CUresult, (const CUDA_MEMCPY2D *))                                     \
    X(cuMemcpy2D_v2_ptds, CUresult, (const CUDA_MEMCPY2D *))                                \
    X(cuMemcpy2DUnaligned_v2, CUresult, (const CUDA_MEMCPY2D *))                            \
    X(cuMemcpy2DUnaligned_v2_ptds, CUresult, (const CUDA_MEMCPY2D *))                       \
    X(cuMemcpy2DAsync_v2, CUresult, (const CUDA_MEMCPY2D *, CUstream))                      \
    X(cuMemcpy2DAsync_v2_ptsz, CUresult, (const CUDA_MEMCPY2D *, CUstream))                 \
    X(cuMemcpy3D_v2, CUresult, (const CUDA_MEMCPY3D *))                                     \
    X(cuMemcpy3D_v2_ptds, CUresult, (const CUDA_MEMCPY3D *))                                \
    X(cuMemcpy3DAsync_v2, CUresult, (const CUDA_MEMCPY3D *, CUstream))                      \
    X(cuMemcpy3DAsync_v2_ptsz, CUresult, (const CUDA_MEMCPY3D *, CUstream))                 \
    X(cuMemsetD8_v2, CUresult, (CUdeviceptr, unsigned char, size_t))                        \
    X(cuMemsetD8_v2_ptds, CUresult, (CUdeviceptr, unsigned char, size_t))                   \
    X(cuMemsetD16_v2, CUresult, (CUdeviceptr, unsigned short, size_t))                      \
    X(cuMemsetD16_v2_ptds, CUresult, (CUdeviceptr, unsigned short, size_t))                 \
    X(cuMemsetD32_v2, CUresult, (CUdeviceptr, unsigned int, size_t))                        \
    X(cuMemsetD32_v2_ptds, CUresult, (CUdeviceptr, unsigned int, size_t))                   \
    X(cuMemsetD8Async, CUresult, (CUdeviceptr, unsigned char, size_t, CUstream))            \
    X(cuMemsetD8Async_ptsz, CUresult, (CUdeviceptr, unsigned char, size_t, CUstream))       \
    X(cuMemsetD16Async, CUresult, (CUdeviceptr, unsigned short, size_t, CUstream))          \
    X(cuMemsetD16Async_ptsz, CUresult, (CUdeviceptr, unsigned short, size_t, CUstream))     \
    X(cuMemsetD32Async, CUresult, (CUdeviceptr, unsigned int, size_t, CUstream))            \
    X(cuMemsetD32Async_ptsz, CUresult, (CUdeviceptr, unsigned int, size_t, CUstream))       \
    X(cuMemsetD2D8_v2, CUresult, (CUdeviceptr, size_t, unsigned char, size_t, size_t))      \
    X(cuMemsetD2D8_v2_ptds, CUresult, (CUdeviceptr, size_t, unsigned char, size_t, size_t)) \
    X(cuMemsetD2D16_v2, CUresult, (CUdeviceptr, size_t, unsigned short, size_t, size_t))    \
    X(cuMemsetD2D16_v2_ptds, CUresult, (CUdeviceptr, size_t, unsigned short, size_t, size_t)) \
    X(cuMemsetD2D32_v2, CUresult, (CUdeviceptr, size_t, unsigned int, size_t, size_t))      \
    X(cuMemsetD2D32_v2_ptds, CUresult, (CUdeviceptr, size_t, unsigned int, size_t, size_t)) \
    X(cuMemsetD2D8Async, CUresult, (CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream)) \
    X(cuMemsetD2D8Async_ptsz, CUresult, (CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream)) \
    X(cuMemsetD2D16Async, CUresult, (CUdeviceptr, size_t, unsigned short, size_t, size_t, CUstream)) \
    X(cuMemsetD2D16Async_ptsz, CUresult, (CUdeviceptr, size_t, unsigned short, size_t, size_t, CUstream)) \
    X(cuMemsetD2D32Async, CUresult, (CUdeviceptr, size_t, unsigned int, size_t, size_t, CUstream)) \
    X(cuMemsetD2D32Async_ptsz, CUresult, (CUdeviceptr, size_t, unsigned int, size_t, size_t, CUstream))

/* The runtime functions the shim forwards to (foreign pointers, cudaFree(NULL),
 * stream capture, passthrough mode). */
#define PS_REAL_RUNTIME(X)                                                          \
    X(cudaMalloc, cudaError_t, (void **, size_t))                                   \
    X(cudaFree, cudaError_t, (void *))                                              \
    X(cudaMallocAsync, cudaError_t, (void **, size_t, cudaStream_t))                \
    X(cudaMallocAsync_ptsz, cudaError_t, (void **, size_t, cudaStream_t))           \
    X(cudaFreeAsync, cudaError_t, (void *, cudaStream_t))                           \
    X(cudaFreeAsync_ptsz, cudaError_t, (void *, cudaStream_t))                      \
    X(cudaMemGetInfo, cudaError_t, (size_t *, size_t *))                            \
    X(cudaStreamCreate, cudaError_t, (cudaStream_t *))                              \
    X(cudaStreamCreateWithFlags, cudaError_t, (cudaStream_t *, unsigned int))       \
    X(cudaStreamCreateWithPriority, cudaError_t, (cudaStream_t *, unsigned int, int)) \
    X(cudaStreamDestroy, cudaError_t, (cudaStream_t))                               \
    X(cudaIpcGetMemHandle, cudaError_t, (cudaIpcMemHandle_t *, void *))             \
    X(cudaIpcOpenMemHandle, cudaError_t, (void **, cudaIpcMemHandle_t, unsigned int)) \
    X(cudaIpcCloseMemHandle, cudaError_t, (void *))                                 \
    X(cudaStreamIsCapturing, cudaError_t, (cudaStream_t, cudaStreamCaptureStatus *)) \
    X(cudaStreamIsCapturing_ptsz, cudaError_t, (cudaStream_t, cudaStreamCaptureStatus *)) \
    X(cudaDeviceReset, cudaError_t, (void))                                         \
    X(cudaSetDeviceFlags, cudaError_t, (unsigned int))                              \
    X(cudaHostAlloc, cudaError_t, (void **, size_t, unsigned int))                  \
    X(cudaMallocHost, cudaError_t, (void **, size_t))                               \
    X(cudaFreeHost, cudaError_t, (void *))                                          \
    X(cudaHostGetFlags, cudaError_t, (unsigned int *, void *))                      \
    X(cudaHostGetDevicePointer, cudaError_t, (void **, void *, unsigned int))       \
    X(cudaHostRegister, cudaError_t, (void *, size_t, unsigned int))                \
    X(cudaHostUnregister, cudaError_t, (void *))

#define PS_DECLARE_REAL(name, ret, params) typedef ret(*ps_##name##_fn) params;
PS_REAL_DRIVER(PS_DECLARE_REAL)
PS_REAL_RUNTIME(PS_DECLARE_REAL)
#undef PS_DECLARE_REAL

typedef struct ps_real {
#define PS_REAL_FIELD(name, ret, params) ps_##name##_fn name;
    PS_REAL_DRIVER(PS_REAL_FIELD)
    PS_REAL_RUNTIME(PS_REAL_FIELD)
#undef PS_REAL_FIELD
} ps_real_t;

/* The real functions. Driver entries are filled by ps_real_load_driver();
 * a runtime entry is resolved on first use by ps_real_runtime(). */
extern ps_real_t ps_real;
extern void *(*ps_real_dlsym)(void *, const char *);

/* Finds the real dlsym (idempotent; no CUDA, safe before constructors). */
void ps_real_find_dlsym(void);
/* Loads libcuda.so.1 and every driver entry (idempotent, thread-safe).
 * Returns PS_OK, or PS_EUPSTREAM when libcuda cannot be loaded. */
int ps_real_load_driver(void);
/* Returns the real runtime function `name` (from libcudart, wherever the
 * program loaded it), or NULL. `slot` caches it. */
void *ps_real_runtime_lookup(const char *name, void **slot);
/* (the slot is read atomically: two threads making their first call of a
 * runtime function race to fill it; TSan saw it in tests/stress/ipc_stress) */
static inline void *ps_real_rt_slot(void **slot, const char *name)
{
    void *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    return fn ? fn : ps_real_runtime_lookup(name, slot);
}
#define PS_REAL_RT(name) ((ps_##name##_fn)ps_real_rt_slot((void **)&ps_real.name, #name))
/* Records the address of a real driver function that a hook replaces, when
 * it was learned from dlsym/cuGetProcAddress rather than by ps_real_load_driver. */
void ps_real_note(const char *name, void *fn);

/* ---- the guard: calls made by the shim are never routed again ----------- */
/* Nonzero while this thread runs inside the shim (a real runtime call made
 * by the shim re-enters our driver hooks: they must pass straight through). */
extern PS_TLS int ps_in_shim;

/* ---- registry.c ---------------------------------------------------------- */
typedef struct ps_allocation {
    uintptr_t ptr;      /* the device pointer handed out (key) */
    size_t size;        /* the size the program asked for */
    ps_stream_t stream; /* allocation stream, PS_STREAM_NONE for cudaMalloc */
    int16_t device;     /* device whose stack owns it */
    uint8_t door;       /* PS_DOOR_RUNTIME or PS_DOOR_DRIVER */
    uint8_t direct : 1; /* 1: went straight to CUDA (direct_min_size), not pooled */
    uint8_t host : 1;   /* 1: pinned host memory from the device's host pool (cudaFreeHost frees it) */
    uint32_t generation; /* the device's context generation when it was handed out */
} ps_allocation_t;

void ps_registry_init(void);
/* Inserts (PS_ENOMEM if the table cannot grow). */
int ps_registry_insert(const ps_allocation_t *a);
/* Removes `ptr` and copies its record to *out; PS_EINVAL when absent.
 * Atomic: of two threads freeing the same pointer only one gets PS_OK. */
int ps_registry_remove(uintptr_t ptr, ps_allocation_t *out);
/* Copies the record of exactly `ptr`; PS_EINVAL when absent. */
int ps_registry_find(uintptr_t ptr, ps_allocation_t *out);
/* Finds the live allocation containing `addr` (slow: scans; rare paths only). */
int ps_registry_find_containing(uintptr_t addr, ps_allocation_t *out);
size_t ps_registry_count(void);
/* Removes every allocation of `device` (its context died with them; no
 * CUDA call). Adds how many and their bytes to *count and *bytes. */
void ps_registry_drop_device(int device, uint64_t *count, uint64_t *bytes);
/* Slabs: memory the shim took from upstream, and for which device. */
void ps_slab_add(uintptr_t base, size_t size, int device);
void ps_slab_remove(uintptr_t base);
bool ps_slab_contains(uintptr_t addr);
/* Device memory was mapped (cuMemMap) into the slab holding `addr`: marks it,
 * and sets its device's bit in ps_slab_mapped_devices (never cleared). */
void ps_slab_mark_mapped(uintptr_t addr);
/* The device of the marked slab holding `addr`, or -1 (not ours, a chunk, a host range). */
int ps_slab_mapped_device(uintptr_t addr);
/* Bit D: some slab of device D holds mapped device memory (read without a lock). */
extern _Atomic uint64_t ps_slab_mapped_devices;
/* Forgets every slab of `device` (its context died; no CUDA call). */
void ps_slab_drop_device(int device);
/* fork(): lock everything before, unlock in the parent, reset in the child. */
void ps_registry_atfork_prepare(void);
void ps_registry_atfork_parent(void);
void ps_registry_atfork_child(void);

/* ---- gpu_ops_cuda.c ------------------------------------------------------- */
/* Creates the GPU-ops table of `device`, whose primary context is `ctx`. */
int ps_gpu_ops_cuda_create(int device, CUcontext ctx, ps_gpu_ops_t **out);

/* Stream tracking: non-blocking streams need their own fence at a cudaFree
 * epoch (the legacy stream does not order them). */
void ps_gpu_ops_cuda_stream_created(CUstream stream, unsigned int flags);
void ps_gpu_ops_cuda_stream_destroyed(CUstream stream);
/* Around every real cuStreamBeginCapture*: no capture may begin while a
 * barrier is half-way (it checked that none was open). */
int ps_gpu_ops_cuda_capture_gate(void);
void ps_gpu_ops_cuda_capture_gate_end(void);
/* Global-mode captures (CUDA prohibits "unsafe" calls such as cudaMalloc
 * and cudaFree on every thread not in relaxed mode while one is open):
 * capture_begun remembers one (streams_lock held: inside the gate);
 * unsafe_call_prohibited answers, for a cudaMalloc/cudaFree the shim would
 * serve, what CUDA answers natively: 0 when the call is allowed (no global
 * capture open, this thread in relaxed mode: one atomic load while none
 * was ever begun), else the CUresult of a real unsafe call made as the
 * program's would have been (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, with
 * whatever that does to the capture natively). */
void ps_gpu_ops_cuda_capture_begun(CUstream stream, CUstreamCaptureMode mode);
CUresult ps_gpu_ops_cuda_unsafe_call_check(void);
/* The legacy stream of the current context may be recorded on and made to
 * wait (no blocking stream of it captures): true with the streams lock
 * held (no capture can begin; release it with legacy_leave), false without. */
bool ps_gpu_ops_cuda_legacy_enter(void);
void ps_gpu_ops_cuda_legacy_leave(void);
/* The out-of-memory retry's give-back on the device of `gpu` (router.c):
 * PS_OK when no stream capture is open in its context, and from then on
 * none can begin (every cuStreamBeginCapture* waits at the capture gate)
 * until ps_gpu_ops_cuda_give_back_leave; PS_EBUSY while one is open, or
 * PS_EUPSTREAM when the context died or CUDA cannot say (then nothing is
 * held). POOLSHIM_TEST_IGNORE_CAPTURES=1 answers PS_OK as if none were open. */
int ps_gpu_ops_cuda_give_back_enter(ps_gpu_ops_t *gpu);
void ps_gpu_ops_cuda_give_back_leave(void);
/* How many global-mode captures may be open (read without the streams lock;
 * 0 on the hot path, where unsafe_call_prohibited is then one load). */
extern atomic_int ps_gpu_ops_cuda_global_captures;
static inline CUresult ps_gpu_ops_cuda_unsafe_call_prohibited(void)
{
    if (PS_LIKELY(atomic_load_explicit(&ps_gpu_ops_cuda_global_captures, memory_order_relaxed) == 0))
        return CUDA_SUCCESS;
    return ps_gpu_ops_cuda_unsafe_call_check();
}
/* Context lifecycle (no CUDA call in either): forget the tracked streams
 * of a context that died; make every later call through `ops` a no-op
 * that fails (its context, events and memory are gone). */
void ps_gpu_ops_cuda_forget_context(CUcontext ctx);
void ps_gpu_ops_cuda_mark_dead(ps_gpu_ops_t *ops);
/* Around a call that may destroy the context of `ops` (its gate, 10. of
 * gpu_ops_cuda.c): close waits for every call inside the table and holds
 * new ones; mark the table dead before open if the context died. */
void ps_gpu_ops_cuda_close(ps_gpu_ops_t *ops);
void ps_gpu_ops_cuda_open(ps_gpu_ops_t *ops);
/* Before a reset, while the context lives and with the gate of `ops`
 * closed: unmap and release its virtual memory (it outlives the context
 * otherwise); its pools are dead. */
bool ps_gpu_ops_cuda_release_vm(ps_gpu_ops_t *ops);
/* fork(): the streams lock is taken before, released in the parent, reset
 * in the child (the child's stream hooks take it). */
void ps_gpu_ops_cuda_atfork_prepare(void);
void ps_gpu_ops_cuda_atfork_parent(void);
void ps_gpu_ops_cuda_atfork_child(void);
/* The current context was just given access to `peer`'s memory
 * (cuCtxEnablePeerAccess / cudaDeviceEnablePeerAccess): memory mapped with
 * cuMemMap is not covered by that, so every mapping of the peer device's
 * pools, and every later one, is made accessible to the current device. */
void ps_gpu_ops_cuda_peer_access_enabled(CUcontext peer);

/* ---- nvtx.c: debug.nvtx (a leaf; NVTX calls only, never CUDA) -------------- */
/* 1 when debug.nvtx is on; every caller tests it first (the option off
 * costs one branch). Set by the router at init, before any stack exists. */
extern int ps_nvtx_on;
void ps_nvtx_enable(void);
/* Device memory taken from CUDA (a chunk, a mapped piece) / given back. */
void ps_nvtx_heap_add(void *base, size_t size, int device);
void ps_nvtx_heap_remove(void *base);
/* A block handed to the program (`size` = the bytes asked for) / freed. */
void ps_nvtx_region_add(void *ptr, size_t size);
void ps_nvtx_region_remove(void *ptr, size_t size);
/* The device's context died: forget its heaps. */
void ps_nvtx_drop_device(int device);
/* Heaps registered now (tests). */
size_t ps_nvtx_heap_count(void);

/* ---- nvtx_ranges.c: debug.nvtx_ranges (a leaf; wraps a GPU-ops table) ------ */
/* Replaces the slow entries of a device's freshly made table by wrappers
 * that push an NVTX range around each call (see the file's top). */
void ps_nvtx_ranges_wrap(ps_gpu_ops_t *gpu);
/* ---- ipc.c: IPC of pooled memory between processes under the shim ---------- */
/* Live exported blocks: the router calls ps_ipc_forget at a free while > 0. */
extern atomic_int ps_ipc_exports;
/* Whether the 64 bytes at `handle` are a handle of ours (our magic). */
bool ps_ipc_is_ours(const void *handle);
/* Exports the live block [block, block + size) of the device whose table is
 * `gpu` into the 64 bytes at `handle` (the same handle again for the same
 * block). PS_EUNSUPPORTED: its memory cannot be exported (the caller
 * refuses); PS_EUPSTREAM: the service socket or thread failed (printed). */
int ps_ipc_export(const ps_gpu_ops_t *gpu, uintptr_t block, size_t size, void *handle);
/* The block is being freed: its export, if any, goes (a handle made for it
 * is stale from now on). */
void ps_ipc_forget(uintptr_t block);
/* Opens a handle of ours through `gpu` (NULL: this process cannot import);
 * *out = the exported block mapped here. Errors are printed, naming `api`:
 * PS_EINVAL (damaged, stale, our own), PS_EUNSUPPORTED, PS_EUPSTREAM, PS_ENOMEM. */
int ps_ipc_open(const char *api, const ps_gpu_ops_t *gpu, const void *handle, void **out);
/* cudaIpcCloseMemHandle of `ptr`: false when it is no pointer we opened;
 * else *status PS_OK and one reference goes (the last unmaps). */
bool ps_ipc_close(uintptr_t ptr, int *status);
/* The opened block containing `addr` (cuMemGetAddressRange), if any. */
bool ps_ipc_import_range(uintptr_t addr, uintptr_t *base, size_t *size);
void ps_ipc_atfork_child(void);

/* ---- router.c --------------------------------------------------------------- */
enum { PS_DOOR_RUNTIME = 0, PS_DOOR_DRIVER = 1 };
enum {
    PS_CALL_CUDA_MALLOC, PS_CALL_CUDA_FREE, PS_CALL_CUDA_MALLOC_ASYNC, PS_CALL_CUDA_FREE_ASYNC,
    PS_CALL_CU_MEM_ALLOC, PS_CALL_CU_MEM_FREE, PS_CALL_CU_MEM_ALLOC_ASYNC, PS_CALL_CU_MEM_FREE_ASYNC,
    /* pinned host memory (the host pool); cudaMallocHost counts as cudaHostAlloc,
     * cuMemAllocHost as cuMemHostAlloc */
    PS_CALL_CUDA_HOST_ALLOC, PS_CALL_CUDA_FREE_HOST, PS_CALL_CU_MEM_HOST_ALLOC, PS_CALL_CU_MEM_FREE_HOST,
    PS_CALL_COUNT
};

/* 1 when the shim routes allocations, 0 in passthrough (POOLSHIM_DISABLE,
 * a bad config with on_error=passthrough, a forked child of a CUDA parent,
 * and from the start of exit() on). */
extern atomic_int ps_active;
/* 1 once exit() began (router.c, exit_begins): the shim starts no CUDA
 * call any more; a free of one of its blocks just forgets it. */
extern atomic_int ps_exiting;
/* 1 when POOLSHIM_DISABLE=1 was set at load: hooks are never handed out. */
extern int ps_disabled_early;
/* 1 when POOLSHIM_TRACE_LOOKUPS=1: every driver/runtime name looked up through
 * dlsym or cuGetProcAddress is printed, with whether we hooked it (to find
 * the entry points a program allocates through). */
extern int ps_trace_lookups;
/* The effective configuration (valid once ps_active is known). */
extern const ps_global_config_t *ps_global;

/* A device's state: its stack, built on first use, dropped when its
 * context dies (reset, last release, destroy) and built again on the next
 * allocation. A dropped stack is never freed (another thread may still
 * hold it); its GPU-ops table is dead, so it makes no CUDA call. */
enum { PS_DEVICE_UNBUILT = 0, PS_DEVICE_READY, PS_DEVICE_FAILED };
typedef struct ps_device_state {
    atomic_int state;       /* PS_DEVICE_UNBUILT / READY / FAILED (then calls pass through) */
    int device;             /* ordinal */
    CUcontext ctx;          /* its primary context, the only one we serve */
    ps_gpu_ops_t *gpu;      /* the GPU-ops table over that context (atomic loads: a reset replaces it) */
    ps_stack_t *stack;      /* the resource stack from the config (atomic loads: a reset replaces it) */
    ps_resource_t *host_pool; /* the top of the pinned host stack ([host]: the pool and its adaptors), or
                                 NULL (atomic loads: a reset replaces it; pinned memory dies with the context) */
    ps_stack_t *host_stack;   /* that stack (its log, track and stats adaptors), or NULL */
    atomic_uint generation; /* +1 at each drop; allocations carry it, a stale one is not ours any more */
    int holds_ref;          /* 1 while we hold a reference on the primary context (devices lock) */
    int has_ctx_id;         /* 1 when ctx_id is known (cuCtxGetId, CUDA 12+) */
    unsigned long long ctx_id; /* the context's unique id when the stack was built */
    /* what the drops took with them (devices lock; read by the exit report) */
    unsigned resets;                /* contexts that died under a stack */
    uint64_t dropped_allocations;   /* live allocations they took */
    uint64_t dropped_bytes;         /* bytes requested by those */
    ps_resource_info_t dropped;     /* the dropped stacks' own figures, summed (peak: max) */
    ps_resource_info_t dropped_host; /* the same for the dropped host pools */
} ps_device_state_t;
/* Hold the devices lock around a report written while the program runs
 * (router.c; a context reset changes what the report reads). Not at exit. */
void ps_devices_report_begin(void);
void ps_devices_report_end(void);
extern ps_device_state_t ps_devices[PS_MAX_DEVICES];
/* The device state of the current context, building its stack on first
 * use; NULL when the call must pass through. */
ps_device_state_t *ps_current_device(int door);

/* Context lifecycle (router.c; the entry points are in hooks_context.c).
 * Each calls the real function, returns its result, and drops the stack
 * of a device whose primary context died, without calling CUDA on it. */
/* After a successful cuDevicePrimaryCtxRetain from outside the shim: builds
 * the device's stack now if it has none (the cost a fresh process's first
 * allocation paid, moved to where the context is made). */
void ps_context_retained(CUdevice device);
CUresult ps_context_reset(CUdevice device, ps_cuDevicePrimaryCtxReset_fn real, const char *api);
CUresult ps_context_release(CUdevice device, ps_cuDevicePrimaryCtxRelease_fn real, const char *api);
CUresult ps_context_destroy(CUcontext ctx, ps_cuCtxDestroy_fn real, const char *api);
CUresult ps_context_set_flags(CUdevice device, unsigned int flags, ps_cuDevicePrimaryCtxSetFlags_fn real,
                              const char *api);
/* After a call that may have destroyed or recreated primary contexts
 * (cudaDeviceReset, cudaSetDeviceFlags, cuDevicePrimaryCtxSetFlags): drops
 * the stack of every device whose context is not the one it was built in. */
void ps_context_check(const char *api);

/* Streams, captures and peer access, as the hooks see them (router.c; the
 * tracking itself is gpu_ops_cuda.c's). A stream was created with `flags`
 * (non-blocking ones are tracked); a stream is about to be destroyed (every
 * stack first retires what it keeps for it); a real cuStreamBeginCapture*
 * runs between capture_gate and capture_gate_end; the current context was
 * given access to `peer`'s memory (ps_gpu_ops_cuda_peer_access_enabled). */
void ps_streams_created(CUstream stream, unsigned int flags);
void ps_streams_destroyed(CUstream stream);
int ps_streams_capture_gate(void);
void ps_streams_capture_gate_end(void);
/* A real cuStreamBeginCapture* on `stream` in `mode` succeeded (called
 * between gate and gate_end). */
void ps_streams_capture_begun(CUstream stream, CUstreamCaptureMode mode);
void ps_peer_access_enabled(CUcontext peer);
/* The program synchronized the current context (cuCtxSynchronize, and so
 * cudaDeviceSynchronize): tells the device's stack, if it was built
 * (release_threshold). */
void ps_route_device_synchronized(void);
/* The out-of-memory retry (hooks_driver.c): a CUDA allocation the shim
 * does not serve (cuMemCreate, cuMemAllocManaged, ...) answered "out of
 * memory". ps_route_oom_epoch, read before that call, counts the
 * give-backs that had returned memory by then. ps_route_oom_give_back
 * gives back to CUDA what the stack of `*device` holds free (ps_trim: it
 * waits for the pending blocks, then returns free chunks and, after a device
 * synchronize, whole free pieces) and answers whether to retry the call
 * once: true when memory went back now, or by another give-back since
 * `epoch`. *device: an ordinal, or -1 for the current context's device
 * (replaced by its ordinal); below -1 (host memory): nothing. Nothing is
 * done either with global.oom_retry off, without a stack on the device,
 * inside the shim, or while a stream capture is open on the device (the
 * synchronize would invalidate it: counted, the call keeps its error).
 * ps_route_oom_retried counts the retry's outcome. */
uint64_t ps_route_oom_epoch(void);
bool ps_route_oom_give_back(int *device, uint64_t epoch, const char *api, bool *asked);
/* The retry after this process's own give-back ran out of memory again and
 * the neighbours were not asked yet (*asked false above): asks them; true
 * when the call is worth making once more. */
bool ps_route_oom_ask_neighbours(int device, uint64_t epoch);
void ps_route_oom_retried(int device, const char *api, bool succeeded);

/* Initialises on first use (config, driver). Returns ps_active. Once it
 * has run, two loads (every intercepted call asks). */
extern atomic_int ps_init_done;
int ps_shim_init(void);
static inline int ps_shim_ensure_init(void)
{
    if (PS_LIKELY(atomic_load_explicit(&ps_init_done, memory_order_acquire)))
        return atomic_load_explicit(&ps_active, memory_order_relaxed);
    return ps_shim_init();
}

/* Outcome of routing: where the call should go. */
typedef enum {
    PS_ROUTE_DONE = 0,    /* served by the shim: *status says how */
    PS_ROUTE_PASSTHROUGH  /* not ours: call the real function */
} ps_route_t;

/* Allocation through the current context's device stack. `stream` is
 * PS_STREAM_NONE for cudaMalloc/cuMemAlloc. On PS_ROUTE_DONE, *status is
 * PS_OK, PS_ENOMEM or PS_EINVAL. */
ps_route_t ps_route_allocate(int call, int door, size_t size, ps_stream_t stream, void **out,
                             int *status);
/* Free of `ptr`. PS_ROUTE_PASSTHROUGH: not ours and not inside our memory
 * (forward to the real free). PS_ROUTE_DONE with *status PS_OK, or
 * PS_EINVAL for a bad pointer (inside our memory but not a live allocation). */
ps_route_t ps_route_free(int call, int door, void *ptr, ps_stream_t stream, int *status);
/* Pinned host memory (cudaHostAlloc & co.): `flags` are cudaHostAlloc's
 * (= CU_MEMHOSTALLOC_*). Pooled: no write-combined bit and size > 0, with
 * [host] enabled and a served current device; otherwise PASSTHROUGH. */
ps_route_t ps_route_host_alloc(int call, int door, size_t size, unsigned flags, void **out, int *status);
/* cudaFreeHost/cuMemFreeHost of `ptr`: PASSTHROUGH when it is not ours and
 * not inside our memory; DONE with PS_OK, or PS_EINVAL (double free, an
 * interior pointer, a device pointer of ours). */
ps_route_t ps_route_host_free(int call, int door, void *ptr, int *status);
/* Pinned blocks asked about (cudaHostGetFlags, cudaHostGetDevicePointer,
 * cudaHostRegister, cudaHostUnregister and their driver twins): 1 when
 * [addr, addr + size) (size 0 counts as 1 byte) begins or ends inside a live
 * pinned block of ours, with *flags (may be NULL) = the flags every pooled
 * pinned block has (PS_HOST_POOL_FLAGS); 0 otherwise (CUDA answers). The
 * hooks then answer as CUDA does for cuMemHostAlloc memory: those flags,
 * device pointer = host pointer, "already registered", "not registered".
 * A block of the host range is not cuMemHostAlloc memory, so CUDA's own
 * answer for it is not relied on. */
int ps_route_pinned_block(uintptr_t addr, size_t size, unsigned *flags);
/* The flags of every pooled pinned block: slabs are cuMemHostAlloc'd with
 * them, and the host range's pieces are accessible from the host and every
 * device (device pointer = host pointer), which is what they promise. */
#define PS_HOST_POOL_FLAGS (PS_HOST_ALLOC_PORTABLE | PS_HOST_ALLOC_MAPPED)

/* Adds the pool's free bytes of the current device to *free_bytes (meminfo=pool). */
void ps_route_meminfo(size_t *free_bytes);
/* Statistics of a dropped stack: its live allocations' bytes are gone. */
void ps_stats_count_dropped(int device, uint64_t bytes);
/* Counts a free of a foreign pointer that CUDA itself refused (a stack
 * address, say): bad pointers are counted whoever answers them. */
void ps_stats_count_foreign_invalid(void);

/* Is `stream` being captured into a graph? (then async calls go to CUDA) */
bool ps_stream_is_capturing(CUstream stream, bool per_thread);
/* Normalises a stream handle of an async call: NULL means the legacy
 * stream, or the per-thread stream in a _ptsz entry point. */
static inline ps_stream_t ps_stream_key(CUstream stream, bool per_thread)
{
    if (stream == NULL)
        return per_thread ? PS_STREAM_PER_THREAD : PS_STREAM_LEGACY;
    return (ps_stream_t)stream;
}

/* IPC (cudaIpcGetMemHandle, cuIpcGetMemHandle and the Open/Close pairs;
 * the mechanism is ipc.c's). ps_route_ipc_get: PASSTHROUGH when `ptr` is not
 * in our memory or is a direct (whole CUDA) allocation; DONE with *status
 * PS_OK and `handle` (64 bytes) filled, or PS_EINVAL: refused, and why was
 * printed (not a live block, or memory that cannot be exported: the chunked
 * pool, global.ipc off, no POSIX fd handles). ps_route_ipc_open:
 * PASSTHROUGH when `handle` is not ours; DONE with PS_OK and *out, or an
 * error (printed). ps_route_ipc_close: PASSTHROUGH when `ptr` is not a
 * handle we opened. */
ps_route_t ps_route_ipc_get(const char *api, uintptr_t ptr, void *handle, int *status);
ps_route_t ps_route_ipc_open(const char *api, int door, const void *handle, void **out, int *status);
ps_route_t ps_route_ipc_close(uintptr_t ptr, int *status);
/* cuMemGetAddressRange of `addr`: PS_ROUTE_DONE when it lies in memory the
 * shim took from CUDA, with *status PS_OK and the live suballocation's
 * *base and *size, or PS_EINVAL inside a slab but in no live allocation;
 * PASSTHROUGH when it is not ours or a direct (whole CUDA) allocation. */
ps_route_t ps_route_address_range(uintptr_t addr, uintptr_t *base, size_t *size, int *status);

/* cuMemPoolSetAccess (and cudaMemPoolSetAccess, which reaches it) on
 * `pool` succeeded: when it is a device's default or current pool and it
 * gave another device access, that device's stream-ordered allocations pass
 * through to CUDA's pool from then on (its blocks then have the access the
 * program asked for, as natively; blocks the shim served before keep what
 * their stack gives: the expandable pool grants every device that can reach
 * it, chunks none). Until the device's context dies. */
void ps_route_pool_access(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count);

/* The live pooled block holding `addr` (not a direct allocation, not a
 * pinned host block, not an imported one): true with *out filled. Looks the
 * exact pointer up first; an interior pointer scans (rare paths only). */
bool ps_route_pooled_block(uintptr_t addr, ps_allocation_t *out);
/* The buffer id of the pooled block at `base` (CU_POINTER_ATTRIBUTE_BUFFER_ID):
 * unique over the process's life, the same until the block is freed. */
uint64_t ps_route_block_id(uintptr_t base);

/* ---- copy_order.c: copies of pooled mapped memory across devices ---------- */
/* What ps_copy_order_begin did, for ps_copy_order_end. */
typedef struct ps_copy_order {
    uint64_t devices; /* bit D: the copy touches mapped memory of device D, not the current one, and the copy's
                         stream was made to wait for D's legacy stream */
    CUstream stream;  /* the copy's stream as a handle the real driver reads (CU_STREAM_LEGACY/PER_THREAD) */
    CUcontext ctx;    /* the current context at the copy */
    int device;       /* its device */
} ps_copy_order_t;
/* Before a copy or memset that touches `dst` and `src` (0: none) on `stream`
 * (NULL: the default stream, per-thread when `per_thread`): true when it
 * touches mapped memory of another device than the current one, and the
 * copy's stream now waits for that device's legacy stream (then call
 * ps_copy_order_end after the real call); false, with nothing done, in the
 * common case (one atomic load when no device has mapped memory). */
bool ps_copy_order_begin(ps_copy_order_t *o, uintptr_t dst, uintptr_t src, CUstream stream, bool per_thread);
/* After the real call (result r): each device of o waits on its legacy
 * stream for the copy. */
void ps_copy_order_end(ps_copy_order_t *o, CUresult r);

/* Hooks handed out by dlsym and cuGetProcAddress (hook_table.c). */
typedef struct ps_hook {
    const char *name; /* exported symbol name */
    void *hook;       /* our function */
    void **real;      /* where the real function's address is kept */
} ps_hook_t;
/* Our hook for `name`, or NULL. */
const ps_hook_t *ps_hook_by_name(const char *name);
/* Our hook replacing the real function at `fn`, or NULL. */
const ps_hook_t *ps_hook_by_real(void *fn);
/* True when `fn` is one of our hooks. */
bool ps_is_our_hook(void *fn);

#endif
