/* Copies and memsets (driver door; the runtime's cudaMemcpy* and
 * cudaMemset* reach these through cuGetProcAddress, static and shared
 * cudart alike: tools/prof/copy_calls.sh lists which function each runtime
 * call reaches). Every hook passes the call through; when it touches mapped
 * memory of another device than the current one it is ordered around the
 * real call as CUDA orders cudaMalloc memory (copy_order.c). cuMemcpyPeer*
 * name their contexts and are ordered by the driver itself: not hooked.
 */
#include "copy_order.h"
#include "real.h"

/* The hook `name`: dst and src are the pointers the call touches (0: none),
 * stream its stream (NULL: the default one, per-thread when per_thread). */
#define COPY_HOOK(name, params, args, dst, src, stream, per_thread)                                   \
    PS_EXPORT CUresult name params                                                                     \
    {                                                                                                  \
        if (!ps_real.name && ps_real_load_driver() != PS_OK)                                           \
            return CUDA_ERROR_NOT_INITIALIZED;                                                         \
        if (!ps_real.name)                                                                             \
            return CUDA_ERROR_NOT_FOUND;                                                               \
        ps_copy_order_t order_;                                                                        \
        if (PS_LIKELY(!ps_copy_order_begin(&order_, (uintptr_t)(dst), (uintptr_t)(src), stream, per_thread))) \
            return ps_real.name args;                                                                  \
        CUresult r_ = ps_real.name args;                                                               \
        ps_copy_order_end(&order_, r_);                                                                \
        return r_;                                                                                     \
    }

/* The device pointer a 2D/3D copy's side names: its device pointer for
 * device and unified memory, nothing for host memory and arrays. */
#define SIDE(p, side) ((p) && ((p)->side##MemoryType == CU_MEMORYTYPE_DEVICE || (p)->side##MemoryType == CU_MEMORYTYPE_UNIFIED) ? (p)->side##Device : 0)

/* each twice: legacy default stream, and per-thread (_ptds / _ptsz) */
#define BOTH(X, name, ptname, params, args, dst, src, stream) \
    X(name, params, args, dst, src, stream, false)           \
    X(ptname, params, args, dst, src, stream, true)

BOTH(COPY_HOOK, cuMemcpy, cuMemcpy_ptds, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n), dst, src, NULL)
BOTH(COPY_HOOK, cuMemcpyAsync, cuMemcpyAsync_ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s),
     (dst, src, n, s), dst, src, s)
BOTH(COPY_HOOK, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds, (CUdeviceptr dst, const void *src, size_t n), (dst, src, n),
     dst, 0, NULL)
BOTH(COPY_HOOK, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds, (void *dst, CUdeviceptr src, size_t n), (dst, src, n), 0, src,
     NULL)
BOTH(COPY_HOOK, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n),
     dst, src, NULL)
BOTH(COPY_HOOK, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz,
     (CUdeviceptr dst, const void *src, size_t n, CUstream s), (dst, src, n, s), dst, 0, s)
BOTH(COPY_HOOK, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz, (void *dst, CUdeviceptr src, size_t n, CUstream s),
     (dst, src, n, s), 0, src, s)
BOTH(COPY_HOOK, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz,
     (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), dst, src, s)
BOTH(COPY_HOOK, cuMemcpy2D_v2, cuMemcpy2D_v2_ptds, (const CUDA_MEMCPY2D *p), (p), SIDE(p, dst), SIDE(p, src), NULL)
BOTH(COPY_HOOK, cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds, (const CUDA_MEMCPY2D *p), (p), SIDE(p, dst),
     SIDE(p, src), NULL)
BOTH(COPY_HOOK, cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz, (const CUDA_MEMCPY2D *p, CUstream s), (p, s),
     SIDE(p, dst), SIDE(p, src), s)
BOTH(COPY_HOOK, cuMemcpy3D_v2, cuMemcpy3D_v2_ptds, (const CUDA_MEMCPY3D *p), (p), SIDE(p, dst), SIDE(p, src), NULL)
BOTH(COPY_HOOK, cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz, (const CUDA_MEMCPY3D *p, CUstream s), (p, s),
     SIDE(p, dst), SIDE(p, src), s)
BOTH(COPY_HOOK, cuMemsetD8_v2, cuMemsetD8_v2_ptds, (CUdeviceptr p, unsigned char v, size_t n), (p, v, n), p, 0, NULL)
BOTH(COPY_HOOK, cuMemsetD16_v2, cuMemsetD16_v2_ptds, (CUdeviceptr p, unsigned short v, size_t n), (p, v, n), p, 0,
     NULL)
BOTH(COPY_HOOK, cuMemsetD32_v2, cuMemsetD32_v2_ptds, (CUdeviceptr p, unsigned int v, size_t n), (p, v, n), p, 0, NULL)
BOTH(COPY_HOOK, cuMemsetD8Async, cuMemsetD8Async_ptsz, (CUdeviceptr p, unsigned char v, size_t n, CUstream s),
     (p, v, n, s), p, 0, s)
BOTH(COPY_HOOK, cuMemsetD16Async, cuMemsetD16Async_ptsz, (CUdeviceptr p, unsigned short v, size_t n, CUstream s),
     (p, v, n, s), p, 0, s)
BOTH(COPY_HOOK, cuMemsetD32Async, cuMemsetD32Async_ptsz, (CUdeviceptr p, unsigned int v, size_t n, CUstream s),
     (p, v, n, s), p, 0, s)
BOTH(COPY_HOOK, cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds, (CUdeviceptr p, size_t pitch, unsigned char v, size_t w, size_t h),
     (p, pitch, v, w, h), p, 0, NULL)
BOTH(COPY_HOOK, cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds,
     (CUdeviceptr p, size_t pitch, unsigned short v, size_t w, size_t h), (p, pitch, v, w, h), p, 0, NULL)
BOTH(COPY_HOOK, cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds,
     (CUdeviceptr p, size_t pitch, unsigned int v, size_t w, size_t h), (p, pitch, v, w, h), p, 0, NULL)
BOTH(COPY_HOOK, cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz,
     (CUdeviceptr p, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s), (p, pitch, v, w, h, s), p, 0, s)
BOTH(COPY_HOOK, cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz,
     (CUdeviceptr p, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s), (p, pitch, v, w, h, s), p, 0, s)
BOTH(COPY_HOOK, cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz,
     (CUdeviceptr p, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s), (p, pitch, v, w, h, s), p, 0, s)
