/* Copies of pooled mapped memory across devices: ordered as CUDA orders a
 * copy of cudaMalloc memory.
 *
 * What CUDA does (tests/gpu/cross_device_probe.cu shows it): memory from
 * cuMemAlloc belongs to a context, and a copy of it made while another
 * device is current is serialized with the memory's device (it waits for
 * the kernels queued there before it, and that device's later work waits
 * for the copy). Memory mapped with cuMemMap belongs to no context: once
 * the copy is accepted (the mapping grants the current device access,
 * gpu_ops_cuda_vm.c) it runs on the current device's stream alone, beside
 * the memory's device's kernels, and reads or writes wrong bytes. A
 * cudaMemcpyAsync on a non-blocking stream is not serialized natively
 * either (the probe's 3b).
 *
 * So, for a copy or memset whose destination or source is mapped memory
 * of device D (a slab marked by ps_slab_mark_mapped) while the current
 * device is C != D, and whose stream is the legacy or per-thread default
 * stream or a blocking stream (not a non-blocking one, not capturing):
 *  1. before the copy: event e_D recorded on D's legacy stream (D's primary
 *     context pushed), the copy's stream waits for it;
 *  2. the real copy;
 *  3. after it: event e_C recorded on the copy's stream, D's legacy stream
 *     waits for it.
 * Legacy semantics then order every blocking stream of D as well. Each
 * device has one event of its own for this (created in its primary
 * context on first use, made again after a reset), recorded and waited on
 * under that device's lock: a wait takes the record made just before it.
 * A current context that is not a device's served primary context gets a
 * fresh event for the call. D's legacy stream is touched only when no
 * blocking capture of D is open (ps_gpu_ops_cuda_legacy_enter).
 * POOLSHIM_TEST_SKIP_COPY_ORDER=1 (tests only) skips 1 and 3: the
 * negative control of tests/gpu/multi_gpu.cu copies, which must then see
 * wrong bytes.
 *
 * Cost: one atomic load while no device has mapped memory; then
 * cuCtxGetCurrent and cuCtxGetDevice, and nothing more while no device but
 * the current one has (a program on one GPU); else a slab lookup under its
 * lock per pointer. Two records, two waits and two context push/pop pairs
 * for a copy that needs ordering.
 */
#include <pthread.h>
#include <stdlib.h>

#include "copy_order.h"
#include "devices.h"
#include "gpu_ops_cuda.h"
#include "real.h"
#include "registry.h"
#include "router.h"
#include "test_switches.h"

typedef struct order_event {
    pthread_mutex_t lock; /* held from a record to the waits that follow it */
    CUevent event;        /* created in `ctx`, or NULL */
    CUcontext ctx;        /* the primary context the event was made in */
    unsigned generation;  /* ps_devices[].generation then (a reset makes a new one) */
} order_event_t;

static order_event_t order_events[PS_MAX_DEVICES];
static pthread_once_t order_once = PTHREAD_ONCE_INIT;

static void order_init(void)
{
    for (int d = 0; d < PS_MAX_DEVICES; d++)
        pthread_mutex_init(&order_events[d].lock, NULL);
    if (ps_test.skip_copy_order)
        ps_warning("POOLSHIM_TEST_SKIP_COPY_ORDER=1: copies of pooled memory across devices are not ordered "
                   "(a test switch: they may read or write it beside the other device's kernels)");
}

/* Device d's served primary context, or NULL. */
static CUcontext served_context(int d, unsigned *generation)
{
    ps_device_state_t *dev = ps_device(d);
    if (atomic_load_explicit(&dev->state, memory_order_acquire) != PS_DEVICE_READY)
        return NULL;
    *generation = atomic_load_explicit(&dev->generation, memory_order_acquire);
    return __atomic_load_n(&dev->ctx, __ATOMIC_ACQUIRE);
}

/* Device d's event, made in `ctx` (current) if need be; its lock held.
 * NULL (lock released) when none can be made. */
static CUevent event_locked(int d, CUcontext ctx, unsigned generation)
{
    order_event_t *e = &order_events[d];
    pthread_mutex_lock(&e->lock);
    if (!e->event || e->ctx != ctx || e->generation != generation) {
        CUevent fresh = NULL; /* (the old one, if any, went with its context: a reset) */
        if (ps_real.cuEventCreate(&fresh, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
            pthread_mutex_unlock(&e->lock);
            return NULL;
        }
        e->event = fresh;
        e->ctx = ctx;
        e->generation = generation;
    }
    return e->event;
}

/* The device of pointer p when it is mapped memory of a device other than
 * `current`, else -1. */
static int other_device(uintptr_t p, int current)
{
    if (!p)
        return -1;
    int d = ps_slab_mapped_device(p);
    return d >= 0 && d < PS_MAX_DEVICES && d != current ? d : -1;
}

/* Step 1 for device d: the copy's stream waits for d's legacy stream. */
static bool wait_for_device(int d, CUstream stream)
{
    unsigned generation = 0;
    CUcontext dctx = served_context(d, &generation);
    if (!dctx || ps_real.cuCtxPushCurrent_v2(dctx) != CUDA_SUCCESS)
        return false;
    bool done = false;
    CUevent e = event_locked(d, dctx, generation);
    if (e && ps_gpu_ops_cuda_legacy_enter()) {
        done = ps_real.cuEventRecord(e, (CUstream)PS_STREAM_LEGACY) == CUDA_SUCCESS;
        ps_gpu_ops_cuda_legacy_leave();
    }
    CUcontext popped;
    ps_real.cuCtxPopCurrent_v2(&popped);
    /* back in the copy's context: `stream` names its streams again (the
     * legacy and per-thread handles mean the current context's) */
    if (done)
        done = ps_real.cuStreamWaitEvent(stream, e, 0) == CUDA_SUCCESS; /* (any device's event may be waited on) */
    if (e)
        pthread_mutex_unlock(&order_events[d].lock);
    return done;
}

bool ps_copy_order_begin(ps_copy_order_t *o, uintptr_t dst, uintptr_t src, CUstream stream, bool per_thread)
{
    uint64_t mapped = ps_slab_mapped_devices();
    if (PS_LIKELY(!mapped) || ps_in_shim)
        return false;
    CUdevice current = -1;
    CUcontext ctx = NULL;
    if (ps_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx || ps_real.cuCtxGetDevice(&current) != CUDA_SUCCESS ||
        current < 0 || current >= PS_MAX_DEVICES || !(mapped & ~(1ull << current)))
        return false; /* no other device has mapped memory (one GPU: always) */
    int a = other_device(dst, current), b = other_device(src, current);
    if (a < 0 && b < 0)
        return false;
    ps_gpu_ops_cuda_device_in_use(current); /* the copy needs its access (granted once) */
    pthread_once(&order_once, order_init);
    if (ps_test.skip_copy_order)
        return false;
    if (!stream)
        stream = per_thread ? (CUstream)PS_STREAM_PER_THREAD : (CUstream)PS_STREAM_LEGACY;
    if ((uintptr_t)stream > (uintptr_t)PS_STREAM_PER_THREAD) {
        unsigned flags = 0;
        if (ps_real.cuStreamGetFlags && ps_real.cuStreamGetFlags(stream, &flags) == CUDA_SUCCESS &&
            (flags & CU_STREAM_NON_BLOCKING))
            return false; /* not serialized natively either */
    }
    if (ps_stream_is_capturing(stream, false))
        return false;
    ps_in_shim++;
    *o = (ps_copy_order_t){0, stream, ctx, current};
    if (a >= 0 && wait_for_device(a, stream))
        o->devices |= 1ull << a;
    if (b >= 0 && b != a && wait_for_device(b, stream))
        o->devices |= 1ull << b;
    ps_in_shim--;
    return o->devices != 0;
}

void ps_copy_order_end(ps_copy_order_t *o, CUresult r)
{
    ps_in_shim++;
    /* e_C on the copy's stream: the current device's own event when its
     * served primary context is current, else one made for this call */
    unsigned generation = 0;
    bool own = o->device >= 0 && o->device < PS_MAX_DEVICES && served_context(o->device, &generation) == o->ctx;
    CUevent e = NULL;
    if (own)
        e = event_locked(o->device, o->ctx, generation);
    else if (ps_real.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        e = NULL;
    if (e && ps_real.cuEventRecord(e, o->stream) == CUDA_SUCCESS) {
        for (int d = 0; d < PS_MAX_DEVICES; d++) {
            if (!(o->devices >> d & 1))
                continue;
            unsigned dgen = 0;
            CUcontext dctx = served_context(d, &dgen);
            if (!dctx || ps_real.cuCtxPushCurrent_v2(dctx) != CUDA_SUCCESS)
                continue;
            if (ps_gpu_ops_cuda_legacy_enter()) {
                ps_real.cuStreamWaitEvent((CUstream)PS_STREAM_LEGACY, e, 0);
                ps_gpu_ops_cuda_legacy_leave();
            }
            CUcontext popped;
            ps_real.cuCtxPopCurrent_v2(&popped);
        }
    }
    if (own && e)
        pthread_mutex_unlock(&order_events[o->device].lock);
    else if (e)
        ps_real.cuEventDestroy_v2(e); /* (released once its record completed) */
    (void)r;
    ps_in_shim--;
}
