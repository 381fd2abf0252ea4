/* Context lifecycle entry points, both doors: every way a context is made
 * live, dies or is made again. Each calls the real function and returns its result; the
 * router (ps_context_*) drops the stack of a device whose primary context
 * died, without calling CUDA on anything of the dead context, and the next
 * allocation builds a new stack in the new context.
 *
 *   cudaDeviceReset                     runtime door (shared cudart); static
 *                                       cudart resets through the driver call
 *   cuDevicePrimaryCtxRetain            the runtime's lazy init (both doors: it
 *                                       finds the driver through
 *                                       cuGetProcAddress) or a driver-API
 *                                       program makes the primary context live:
 *                                       the device's stack is built then, not by
 *                                       its first allocation (ps_context_retained)
 *   cuDevicePrimaryCtxReset(_v2)        always destroys the primary context
 *   cuDevicePrimaryCtxRelease(_v2)      destroys it with the last reference
 *   cuCtxDestroy(_v2)                   a cuCtxCreate context (its streams
 *                                       are forgotten, its handle may return)
 *   cudaSetDeviceFlags,
 *   cuDevicePrimaryCtxSetFlags(_v2)     in case the driver made the context again
 *
 * They act whether or not the call came from inside the shim's own calls
 * into the runtime (ps_in_shim): a context dies the same way for everyone.
 */
#include "real.h"
#include "router.h"

#define DRIVER_READY(name)                                                          \
    do {                                                                            \
        if (!ps_real.name && ps_real_load_driver() != PS_OK)                        \
            return CUDA_ERROR_NOT_INITIALIZED;                                      \
    } while (0)

PS_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    DRIVER_READY(cuDevicePrimaryCtxRetain);
    CUresult r = ps_real.cuDevicePrimaryCtxRetain(pctx, dev);
    if (r == CUDA_SUCCESS && ps_shim_ensure_init())
        ps_context_retained(dev); /* (also inside the shim's cudaFree(NULL): the runtime's lazy init) */
    return r;
}

/* Before each entry below: the driver loaded, and its real function there
 * (read through `real` after the load, which fills it). CUDA_SUCCESS, or
 * what the hook answers instead. */
static CUresult missing(void *const *real)
{
    if (!*real && ps_real_load_driver() != PS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    return *real ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static CUresult reset(ps_cuDevicePrimaryCtxReset_fn *real, CUdevice dev)
{
    CUresult m = missing((void *const *)real);
    return m ? m : ps_context_reset(dev, *real, "cuDevicePrimaryCtxReset");
}

static CUresult release(ps_cuDevicePrimaryCtxRelease_fn *real, CUdevice dev)
{
    CUresult m = missing((void *const *)real);
    return m ? m : ps_context_release(dev, *real, "cuDevicePrimaryCtxRelease");
}

static CUresult destroy(ps_cuCtxDestroy_fn *real, CUcontext ctx)
{
    CUresult m = missing((void *const *)real);
    return m ? m : ps_context_destroy(ctx, *real, "cuCtxDestroy");
}

static CUresult set_flags(ps_cuDevicePrimaryCtxSetFlags_fn *real, CUdevice dev, unsigned int flags)
{
    CUresult r = missing((void *const *)real);
    if (r == CUDA_SUCCESS)
        r = ps_context_set_flags(dev, flags, *real, "cuDevicePrimaryCtxSetFlags");
    if (r == CUDA_SUCCESS)
        ps_context_check("cuDevicePrimaryCtxSetFlags"); /* (another device's context, should the driver) */
    return r;
}

PS_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return reset(&ps_real.cuDevicePrimaryCtxReset, dev); }
PS_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { return reset(&ps_real.cuDevicePrimaryCtxReset_v2, dev); }
PS_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return release(&ps_real.cuDevicePrimaryCtxRelease, dev); }
PS_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return release(&ps_real.cuDevicePrimaryCtxRelease_v2, dev);
}
PS_EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return destroy(&ps_real.cuCtxDestroy, ctx); }
PS_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { return destroy(&ps_real.cuCtxDestroy_v2, ctx); }
PS_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return set_flags(&ps_real.cuDevicePrimaryCtxSetFlags, dev, flags);
}
PS_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    return set_flags(&ps_real.cuDevicePrimaryCtxSetFlags_v2, dev, flags);
}

PS_EXPORT cudaError_t cudaDeviceReset(void)
{
    ps_cudaDeviceReset_fn real = PS_REAL_RT(cudaDeviceReset);
    if (!real)
        return 3; /* cudaErrorInitializationError: no CUDA runtime loaded */
    /* no ps_in_shim here: the runtime resets through cuDevicePrimaryCtxReset,
     * and that hook must do its work (under the devices lock, around the call) */
    cudaError_t r = real();
    ps_context_check("cudaDeviceReset");
    return r;
}

PS_EXPORT cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
    ps_cudaSetDeviceFlags_fn real = PS_REAL_RT(cudaSetDeviceFlags);
    if (!real)
        return 3;
    cudaError_t r = real(flags);
    ps_context_check("cudaSetDeviceFlags");
    return r;
}
