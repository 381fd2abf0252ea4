/* The table of hooked names: every entry point of hooks_*.c that our dlsym
 * (hooks_dlsym.c) and our cuGetProcAddress (hooks_driver.c) hand out in
 * place of the real function, with where that real function is kept. It
 * only lists the entry points and calls none of them: the hook files
 * consult it, so that no hook file refers to another (hooks.h).
 */
#include <string.h>

#include "hooks.h"
#include "real.h"

/* Every hook has the signature of the real function it replaces. Declared
 * here for the table only; the definitions are in hooks_driver.c,
 * hooks_runtime.c, hooks_context.c and hooks_copy.c. */
#define PS_DECLARE_HOOK(name, ret, params) extern ret name params;
PS_REAL_DRIVER(PS_DECLARE_HOOK)
PS_REAL_RUNTIME(PS_DECLARE_HOOK)
#undef PS_DECLARE_HOOK

#define HOOK(name) {#name, (void *)name, (void **)&ps_real.name}
static const ps_hook_t hooks[] = {
    /* driver */
    HOOK(cuGetProcAddress), HOOK(cuGetProcAddress_v2), HOOK(cuMemAlloc_v2), HOOK(cuMemFree_v2),
    HOOK(cuMemAllocAsync), HOOK(cuMemAllocAsync_ptsz), HOOK(cuMemFreeAsync), HOOK(cuMemFreeAsync_ptsz),
    HOOK(cuMemGetInfo_v2), HOOK(cuMemGetAddressRange_v2), HOOK(cuIpcGetMemHandle), HOOK(cuIpcOpenMemHandle),
    HOOK(cuIpcOpenMemHandle_v2), HOOK(cuIpcCloseMemHandle), HOOK(cuStreamCreate),
    HOOK(cuStreamCreateWithPriority), HOOK(cuStreamDestroy_v2), HOOK(cuStreamDestroy), HOOK(cuStreamBeginCapture),
    HOOK(cuStreamBeginCapture_ptsz), HOOK(cuStreamBeginCapture_v2), HOOK(cuStreamBeginCapture_v2_ptsz),
    HOOK(cuStreamBeginCaptureToGraph), HOOK(cuStreamBeginCaptureToGraph_ptsz), HOOK(cuCtxEnablePeerAccess), HOOK(cuMemPoolSetAccess),
    HOOK(cuPointerGetAttribute), HOOK(cuPointerGetAttributes), HOOK(cuMemRetainAllocationHandle),
    HOOK(cuCtxSynchronize), HOOK(cuCtxSynchronize_v2),
    /* allocations beside the pool, retried after a give-back when out of memory */
    HOOK(cuMemCreate), HOOK(cuMemAllocManaged), HOOK(cuMemAllocFromPoolAsync), HOOK(cuMemAllocFromPoolAsync_ptsz),
    HOOK(cuMemAllocPitch_v2), HOOK(cuArrayCreate_v2), HOOK(cuArray3DCreate_v2), HOOK(cuMipmappedArrayCreate),
    /* copies and memsets (hooks_copy.c) */
#define COPY_ROW(name, ret, params) HOOK(name),
    PS_COPY_REALS(COPY_ROW)
#undef COPY_ROW
    /* pinned host memory */
    HOOK(cuMemHostAlloc), HOOK(cuMemAllocHost_v2), HOOK(cuMemFreeHost), HOOK(cuMemHostGetFlags),
    HOOK(cuMemHostGetDevicePointer_v2), HOOK(cuMemHostRegister_v2), HOOK(cuMemHostUnregister),
    /* context lifecycle (hooks_context.c) */
    HOOK(cuDevicePrimaryCtxRetain), HOOK(cuDevicePrimaryCtxReset), HOOK(cuDevicePrimaryCtxReset_v2), HOOK(cuDevicePrimaryCtxRelease),
    HOOK(cuDevicePrimaryCtxRelease_v2), HOOK(cuDevicePrimaryCtxSetFlags), HOOK(cuDevicePrimaryCtxSetFlags_v2),
    HOOK(cuCtxDestroy), HOOK(cuCtxDestroy_v2),
    /* runtime (for programs that dlsym them from a libcudart handle) */
    HOOK(cudaMalloc), HOOK(cudaFree), HOOK(cudaMallocAsync), HOOK(cudaMallocAsync_ptsz), HOOK(cudaFreeAsync),
    HOOK(cudaFreeAsync_ptsz), HOOK(cudaMemGetInfo), HOOK(cudaStreamCreate), HOOK(cudaStreamCreateWithFlags),
    HOOK(cudaStreamCreateWithPriority), HOOK(cudaStreamDestroy), HOOK(cudaIpcGetMemHandle),
    HOOK(cudaIpcOpenMemHandle), HOOK(cudaIpcCloseMemHandle), HOOK(cudaDeviceReset), HOOK(cudaSetDeviceFlags), HOOK(cudaHostAlloc), HOOK(cudaMallocHost), HOOK(cudaFreeHost),
    HOOK(cudaHostGetFlags), HOOK(cudaHostGetDevicePointer), HOOK(cudaHostRegister), HOOK(cudaHostUnregister),
};
#define HOOK_COUNT (sizeof hooks / sizeof hooks[0])

const ps_hook_t *ps_hook_by_name(const char *name)
{
    for (size_t i = 0; i < HOOK_COUNT; i++)
        if (strcmp(hooks[i].name, name) == 0)
            return &hooks[i];
    return NULL;
}

const ps_hook_t *ps_hook_by_real(void *fn)
{
    for (size_t i = 0; i < HOOK_COUNT; i++) {
        void *real = __atomic_load_n(hooks[i].real, __ATOMIC_ACQUIRE);
        if (real && real == fn)
            return &hooks[i];
    }
    return NULL;
}

bool ps_is_our_hook(void *fn)
{
    for (size_t i = 0; i < HOOK_COUNT; i++)
        if (hooks[i].hook == fn)
            return true;
    return false;
}
