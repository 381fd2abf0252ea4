/* The router: what the hooks call (shim/router.c: init, allocation, free,
 * pinned memory, IPC and pointers of ours, streams; shim/oom.c: the
 * out-of-memory retry; the current device and the context lifecycle are
 * shim/lifecycle.h's, included here for the hooks).
 * The one place both doors end in; see router.c's opening comment. */
#ifndef PS_SHIM_ROUTER_H
#define PS_SHIM_ROUTER_H

#include "allocation.h"
#include "common.h"
#include "devices.h"
#include "lifecycle.h"
#include "real.h"


/* Streams, captures and peer access, as the hooks see them (router.c; the
 * tracking itself is gpu_ops_cuda_streams.c's). A stream was created with `flags`
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
/* The out-of-memory retry (oom.c; called by hooks_driver.c): a CUDA allocation the shim
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

/* Initialises on first use (config, driver). Returns whether the shim is
 * active. Once it has run, two loads (every intercepted call asks). */
int ps_shim_init(void);
static inline int ps_shim_ensure_init(void)
{
    if (PS_LIKELY(ps_process_initialised()))
        return ps_process_active();
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
 * cudaHostRegister, cudaHostUnregister and their driver twins): true when
 * [addr, addr + size) (size 0 counts as 1 byte) begins or ends inside a live
 * pinned block of ours, with *flags (may be NULL) = the flags every pooled
 * pinned block has (PS_HOST_POOL_FLAGS); false otherwise (CUDA answers). The
 * hooks then answer as CUDA does for cuMemHostAlloc memory: those flags,
 * device pointer = host pointer, "already registered", "not registered".
 * A block of the host range is not cuMemHostAlloc memory, so CUDA's own
 * answer for it is not relied on. */
bool ps_route_pinned_block(uintptr_t addr, size_t size, unsigned *flags);
/* Those answers, for both doors (each turns *status into its own error
 * code). PS_ROUTE_PASSTHROUGH: not a pinned block of ours, or no place for
 * the answer; CUDA answers. PS_ROUTE_DONE with *status:
 * ps_route_pinned_flags          PS_OK, *flags = PS_HOST_POOL_FLAGS
 *                                (cudaHostGetFlags, cuMemHostGetFlags);
 * ps_route_pinned_device_pointer PS_OK, *device_pointer = ptr; PS_EINVAL
 *                                for flags other than 0 (cudaHostGetDevicePointer,
 *                                cuMemHostGetDevicePointer);
 * ps_route_pinned_register       PS_EINVAL, as CUDA answers for cuMemHostAlloc
 *                                memory; size 0 passes
 *                                (cudaHostRegister, cuMemHostRegister);
 * ps_route_pinned_unregister     PS_EINVAL, the same (cudaHostUnregister,
 *                                cuMemHostUnregister). */
static inline ps_route_t ps_route_pinned_flags(const void *ptr, unsigned *flags, int *status)
{
    unsigned pinned;
    if (!flags || !ps_route_pinned_block((uintptr_t)ptr, 1, &pinned))
        return PS_ROUTE_PASSTHROUGH;
    *flags = pinned;
    *status = PS_OK;
    return PS_ROUTE_DONE;
}
static inline ps_route_t ps_route_pinned_device_pointer(void *ptr, unsigned flags, void **device_pointer,
                                                        int *status)
{
    if (!device_pointer || !ps_route_pinned_block((uintptr_t)ptr, 1, NULL))
        return PS_ROUTE_PASSTHROUGH;
    *status = flags ? PS_EINVAL : PS_OK; /* "flags must be 0" */
    if (!flags)
        *device_pointer = ptr; /* host and device pointer are one (UVA, every device mapped) */
    return PS_ROUTE_DONE;
}
static inline ps_route_t ps_route_pinned_register(const void *ptr, size_t size, int *status)
{
    if (!size || !ps_route_pinned_block((uintptr_t)ptr, size, NULL))
        return PS_ROUTE_PASSTHROUGH;
    *status = PS_EINVAL;
    return PS_ROUTE_DONE;
}
static inline ps_route_t ps_route_pinned_unregister(const void *ptr, int *status)
{
    if (!ps_route_pinned_block((uintptr_t)ptr, 1, NULL))
        return PS_ROUTE_PASSTHROUGH;
    *status = PS_EINVAL;
    return PS_ROUTE_DONE;
}

/* Adds the pool's free bytes of the current device to *free_bytes (meminfo=pool). */
void ps_route_meminfo(size_t *free_bytes);
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
/* Stream-ordered allocation and free (cudaMallocAsync/cudaFreeAsync,
 * cuMemAllocAsync/cuMemFreeAsync and their _ptsz twins, both doors), on
 * `stream` as the entry point names it: ps_route_allocate / ps_route_free
 * on its key. PASSTHROUGH from inside the shim and for a NULL pointer; an
 * allocation also for size 0, with the shim off, and on a capturing stream
 * (a graph memory node: CUDA's job). A pooled block freed inside a capture
 * is freed as by cudaFree (the graph has no node for it): the pool then
 * waits for a fence. */
static inline ps_route_t ps_route_allocate_async(int call, int door, size_t size, CUstream stream,
                                                 bool per_thread, void **out, int *status)
{
    if (ps_in_shim || !out || !size || !ps_shim_ensure_init() || ps_stream_is_capturing(stream, per_thread))
        return PS_ROUTE_PASSTHROUGH;
    return ps_route_allocate(call, door, size, ps_stream_key(stream, per_thread), out, status);
}
static inline ps_route_t ps_route_free_async(int call, int door, void *ptr, CUstream stream, bool per_thread,
                                             int *status)
{
    if (ps_in_shim || !ptr)
        return PS_ROUTE_PASSTHROUGH;
    ps_stream_t key = ps_stream_is_capturing(stream, per_thread) ? PS_STREAM_NONE : ps_stream_key(stream, per_thread);
    return ps_route_free(call, door, ptr, key, status);
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
/* Whether the live pooled block `a` (as ps_route_pooled_block gave it) can
 * be exported by ps_route_ipc_get (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE):
 * global.ipc on, its device's table exports, and it lies in mapped memory
 * of its own device. */
bool ps_route_ipc_capable(const ps_allocation_t *a);
/* The buffer id of the pooled block at `base` (CU_POINTER_ATTRIBUTE_BUFFER_ID):
 * unique over the process's life, the same until the block is freed. */
uint64_t ps_route_block_id(uintptr_t base);

#endif
