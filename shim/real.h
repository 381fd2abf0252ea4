/* The real CUDA functions (shim/real.c): the table ps_real of every driver
 * and runtime entry point the shim calls or hooks, found without going
 * through the shim, and how it is filled. Calls nothing of the shim. */
#ifndef PS_SHIM_REAL_H
#define PS_SHIM_REAL_H

#include "common.h"

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
    X(cuStreamDestroy, CUresult, (CUstream)) /* v1: cuGetProcAddress below 4000, dlsym */     \
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

#endif
