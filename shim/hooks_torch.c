/* The torch door: the functions PyTorch's CUDAPluggableAllocator calls by
 * name when python/poolshim/torch.py installs this library as PyTorch's
 * allocator (loaded by PyTorch; LD_PRELOAD not needed).
 *
 * 1. poolshim_torch_alloc(size, device, stream): `device` is current and
 *    `stream` is PyTorch's current stream on it. The device's stack serves
 *    it as a cudaMalloc (counted as cuMemAllocAsync, through the driver
 *    door), so any block the pool holds may serve it. NULL when it fails
 *    (PyTorch then raises its out-of-memory error) and for size 0 (an empty
 *    tensor).
 * 2. poolshim_torch_free(ptr, size, device, stream): freed as by cudaFree
 *    (counted as cuMemFreeAsync): the block is reused once a barrier orders
 *    every later use after the work issued before the free, on the legacy
 *    stream, the blocking streams and every stream of 3. The pool's barrier
 *    rule then applies as under LD_PRELOAD: memory stays at the pool's floor
 *    (its remap moves free pieces), and a barrier costs one event record plus
 *    one wait per such stream.
 * 3. Streams: a stream other than the legacy one that an allocation names,
 *    or that Tensor.record_stream names (poolshim_torch_record_stream), is
 *    given to the barrier's list (its flags asked once; a non-blocking one
 *    waits for the last barrier at once), as the stream hooks do under
 *    LD_PRELOAD. So a block freed while work on a recorded stream may still
 *    read it is reused only after that work, and a block handed to a side
 *    stream is used only after the barrier that released it. Without
 *    LD_PRELOAD the shim does not see a stream destroyed; PyTorch's own
 *    streams (its pools) live as long as the process.
 * PyTorch allocates from threads of its own (autograd's, for one) on which
 * the runtime never made a context current: PyTorch asks cudaGetDevice
 * (0 on a fresh thread) and calls cudaSetDevice only to change it. The
 * door then makes `device`'s primary context current, as the runtime does
 * at its next call on that thread, when the runtime holds that context
 * (active); never one of its own.
 * While the shim passes calls through (off, exiting), 1 and 2 call the real
 * cuMemAlloc_v2 / cuMemFree_v2.
 * Guarantee: a tensor's memory is handed out again only after the work
 * issued before its free on the streams PyTorch named to the door.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/types.h>

#include "real.h"
#include "router.h"
#include "test_switches.h"

/* ---- streams given to the barrier's list ---------------------------------- */
#define STREAMS_MAX 1024
static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static CUstream streams_seen[STREAMS_MAX]; /* every stream already given (streams_lock) */
static size_t streams_count;
static PS_TLS CUstream last_seen; /* this thread's last stream found in streams_seen */

/* Gives `stream` to the barrier's list once (the legacy and per-thread
 * streams need nothing: legacy semantics order them). */
static void track_stream(CUstream stream)
{
    if (!stream || stream == (CUstream)PS_STREAM_LEGACY || stream == (CUstream)PS_STREAM_PER_THREAD ||
        stream == last_seen)
        return;
    pthread_mutex_lock(&streams_lock);
    bool seen = false;
    for (size_t i = 0; i < streams_count && !seen; i++)
        seen = streams_seen[i] == stream;
    if (!seen && streams_count < STREAMS_MAX)
        streams_seen[streams_count++] = stream;
    pthread_mutex_unlock(&streams_lock);
    last_seen = stream;
    if (seen)
        return;
    unsigned flags = CU_STREAM_NON_BLOCKING; /* when it cannot be asked: as a non-blocking stream (waits) */
    if (ps_real.cuStreamGetFlags)
        (void)ps_real.cuStreamGetFlags(stream, &flags);
    ps_streams_created(stream, flags);
}

/* Makes device's primary context current on a thread that has none, when
 * the runtime keeps it active (a retain and a release around the switch:
 * the runtime's own reference keeps it alive). */
static void ensure_context(int device)
{
    CUcontext ctx = NULL;
    if (!ps_real.cuCtxGetCurrent && ps_real_load_driver() != PS_OK)
        return;
    if (!ps_real.cuCtxGetCurrent || (ps_real.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx))
        return;
    unsigned flags = 0;
    int active = 0;
    ps_cuDevicePrimaryCtxRelease_fn release =
        ps_real.cuDevicePrimaryCtxRelease_v2 ? ps_real.cuDevicePrimaryCtxRelease_v2 : ps_real.cuDevicePrimaryCtxRelease;
    if (!ps_real.cuDevicePrimaryCtxGetState || !ps_real.cuDevicePrimaryCtxRetain || !ps_real.cuCtxSetCurrent ||
        !release || ps_real.cuDevicePrimaryCtxGetState(device, &flags, &active) != CUDA_SUCCESS || !active)
        return;
    if (ps_real.cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS)
        return;
    (void)ps_real.cuCtxSetCurrent(ctx);
    (void)release(device);
}

/* ---- the three functions ------------------------------------------------ */
PS_EXPORT void *poolshim_torch_alloc(ssize_t size, int device, CUstream stream)
{
    if (size <= 0)
        return NULL;
    ensure_context(device);
    if (!ps_shim_ensure_init()) /* off: CUDA's own allocation */
        goto real;
    track_stream(stream);
    void *ptr = NULL;
    int status;
    if (ps_route_allocate(PS_CALL_CU_MEM_ALLOC_ASYNC, PS_DOOR_DRIVER, (size_t)size, PS_STREAM_NONE, &ptr,
                          &status) == PS_ROUTE_DONE)
        return status == PS_OK ? ptr : NULL;
real:
    if (!ps_real.cuMemAlloc_v2 && ps_real_load_driver() != PS_OK)
        return NULL;
    CUdeviceptr p = 0;
    if (!ps_real.cuMemAlloc_v2 || ps_real.cuMemAlloc_v2(&p, (size_t)size) != CUDA_SUCCESS)
        return NULL;
    return (void *)(uintptr_t)p;
}

PS_EXPORT void poolshim_torch_free(void *ptr, ssize_t size, int device, CUstream stream)
{
    (void)size;
    (void)device;
    (void)stream; /* as by cudaFree: the barrier orders every tracked stream */
    if (!ptr)
        return;
    int status;
    if (ps_route_free(PS_CALL_CU_MEM_FREE_ASYNC, PS_DOOR_DRIVER, ptr, PS_STREAM_NONE, &status) == PS_ROUTE_DONE)
        return;
    if (!ps_real.cuMemFree_v2 && ps_real_load_driver() != PS_OK)
        return;
    if (ps_real.cuMemFree_v2)
        (void)ps_real.cuMemFree_v2((CUdeviceptr)(uintptr_t)ptr);
}

PS_EXPORT void poolshim_torch_record_stream(void *ptr, CUstream stream)
{
    (void)ptr; /* every block is freed as by cudaFree: knowing the stream is enough */
    if (PS_UNLIKELY(ps_test.torch_no_join)) { /* the negative control of tests/gpu/torch_door.py */
        static atomic_bool warned;
        if (!atomic_exchange(&warned, true))
            ps_warning("test switch: record_stream is ignored; memory another stream still uses may be reused");
        return;
    }
    track_stream(stream);
}
