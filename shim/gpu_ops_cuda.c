/* The GPU-ops table of core/ (core/gpu_ops.h) over the real CUDA driver.
 *
 * 1. One table per device, bound to its primary context; every operation
 *    makes that context current for its duration (push/pop) when another
 *    one is current: frees may arrive from any device.
 * 2. Fences are sets of recycled events (timing disabled).
 *    fence_record(PS_STREAM_NONE) closes a cudaFree epoch: one event on
 *    the legacy stream (ordered after every blocking and per-thread
 *    stream) and one on each live non-blocking stream of the context
 *    (tracked by our stream-creation hooks); fence_record(stream), one
 *    event on that stream. A record that fails returns no fence: the pool
 *    grows instead, which is always safe. Our own calls run in relaxed
 *    capture mode, so they never invalidate the program's capture.
 * 3. mem_alloc/mem_free: the real cuMemAlloc_v2/cuMemFree_v2, each slab
 *    recorded in the registry (bad-pointer detection).
 * 4. barrier (free_sync barrier), under the streams lock (no stream is
 *    created and no capture begins half-way): refused while a capture it
 *    would touch is open; otherwise every busy stream of the context is
 *    joined into the legacy stream, one event E records there, and every
 *    non-blocking stream waits for E; barrier n passes when E does. Steps
 *    a-e are written above live_barrier.
 * 5., 8., 9. Virtual memory (vm_*, ipc_*, host_vm_*, peer access to mapped
 *    pieces, giving it all back before a reset): shim/gpu_ops_cuda_vm.c.
 *    Stream tracking, the capture gate, global captures and the give-back
 *    gate (2., 4. a, 11.): shim/gpu_ops_cuda_streams.c.
 * 6. With debug.nvtx on, every chunk and mapped piece is announced to
 *    nvtx.c as a heap, and withdrawn before it goes back.
 * 7. memset_d8 / copy_to_host (guard mode): on the block's stream, after
 *    a synchronize, so no kernel can still write what is read.
 * 10. The gate: no call into a context while it dies. Every entry that
 *    calls CUDA takes the table's gate (a writer-first rwlock) to read;
 *    whatever may destroy the context closes it around the real call, and
 *    the table is made dead (dead_* entries) before it opens if the
 *    context died. Written out above ps_gpu_ops_cuda_close.
 * 11. The out-of-memory give-back (oom.c): a trim may synchronize the
 *    device, which would invalidate an open capture, so
 *    ps_gpu_ops_cuda_give_back_enter refuses while one is open and holds
 *    the give-back gate, which every cuStreamBeginCapture* takes, until
 *    the trim ended.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_ops_cuda_internal.h"
#include "test_switches.h"

struct ps_fence {
    ps_fence_t *next_free; /* free-list link */
    int count;             /* events recorded in this fence */
    int capacity;          /* events allocated in `events` */
    CUevent *events;       /* the events */
};

/* What each entry answers once its context died (ps_gpu_ops_cuda_mark_dead):
 * no CUDA call; its events, fences and memory went with the context. The
 * table itself never changes (other threads may be reading it); each entry
 * checks the flag first. */
static int dead_mem_alloc(void *vctx, size_t size, void **out) { return PS_EUPSTREAM; }
static int dead_mem_free(void *vctx, void *ptr, size_t size) { return PS_OK; }
static int dead_mem_alloc_async(void *vctx, size_t size, ps_stream_t stream, void **out) { return PS_EUPSTREAM; }
static int dead_mem_free_async(void *vctx, void *ptr, ps_stream_t stream) { return PS_OK; }
static int dead_mem_get_info(void *vctx, size_t *free_bytes, size_t *total_bytes) { return PS_EUPSTREAM; }
static int dead_fence_record(void *vctx, ps_stream_t stream, ps_fence_t **out) { return PS_EUPSTREAM; }
static int dead_fence_done(void *vctx, ps_fence_t *f) { return PS_OK; } /* nothing can still run */
static int dead_stream_wait_fence(void *vctx, ps_stream_t stream, ps_fence_t *f) { return PS_OK; }
static int dead_device_synchronize(void *vctx) { return PS_OK; }
static int dead_barrier(void *vctx) { return PS_EUPSTREAM; }
static int dead_barrier_passed(void *vctx, uint64_t generation) { return PS_OK; } /* no work is left */
static int dead_barrier_wait(void *vctx, uint64_t generation) { return PS_OK; }
static int dead_memset_d8(void *vctx, void *ptr, uint8_t value, size_t bytes, ps_stream_t stream) { return PS_EUPSTREAM; }
static int dead_copy_to_host(void *vctx, void *dst, const void *src, size_t bytes, ps_stream_t stream) { return PS_EUPSTREAM; }
static int dead_host_alloc(void *vctx, size_t size, unsigned flags, void **out) { return PS_EUPSTREAM; }

/* ---- memory ------------------------------------------------------------------------ */
/* A device slab CUDA just gave (cuMemAlloc, cuMemAllocManaged): recorded
 * as ours, announced to NVTX as a heap, handed out. */
static int new_device_slab(device_ops_t *d, CUdeviceptr p, size_t size, void **out)
{
    ps_slab_add((uintptr_t)p, size, d->ops.device);
    if (PS_UNLIKELY(ps_nvtx_on))
        ps_nvtx_heap_add((void *)(uintptr_t)p, size, d->ops.device);
    *out = (void *)(uintptr_t)p;
    return PS_OK;
}

static int live_mem_alloc(void *vctx, size_t size, void **out)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    CUdeviceptr p = 0;
    CUresult r = ps_real.cuMemAlloc_v2(&p, size);
    leave_ctx(pushed);
    return r == CUDA_SUCCESS ? new_device_slab(d, p, size, out) : status_of(r);
}

static int live_mem_free(void *vctx, void *ptr, size_t size)
{
    device_ops_t *d = vctx;
    ps_slab_remove((uintptr_t)ptr);
    if (PS_UNLIKELY(ps_nvtx_on))
        ps_nvtx_heap_remove(ptr);
    int pushed = enter_ctx(d);
    CUresult r = ps_real.cuMemFree_v2((CUdeviceptr)(uintptr_t)ptr);
    leave_ctx(pushed);
    return status_of(r);
}

static int live_mem_alloc_async(void *vctx, size_t size, ps_stream_t stream, void **out)
{
    device_ops_t *d = vctx;
    if (!ps_real.cuMemAllocAsync)
        return PS_EUNSUPPORTED;
    int pushed = enter_ctx(d);
    uint64_t peers = atomic_load(&d->copy_peers);
    if ((peers & ~atomic_load_explicit(&d->pool_shared, memory_order_relaxed)) && !d->skip_peer_grant &&
        (peers & ~atomic_fetch_or(&d->pool_shared, peers)))
        ps_gpu_ops_cuda_open_pool_to(d, peers);
    CUdeviceptr p = 0;
    CUstream s = stream == PS_STREAM_NONE ? (CUstream)PS_STREAM_LEGACY : (CUstream)stream;
    CUresult r = ps_real.cuMemAllocAsync(&p, size, s);
    leave_ctx(pushed);
    if (r != CUDA_SUCCESS)
        return status_of(r);
    ps_slab_add((uintptr_t)p, size, d->ops.device);
    ps_slab_mark_mapped((uintptr_t)p); /* pool memory: copies from other devices are ordered (copy_order.c) */
    *out = (void *)(uintptr_t)p;
    return PS_OK;
}

static int live_mem_free_async(void *vctx, void *ptr, ps_stream_t stream)
{
    device_ops_t *d = vctx;
    ps_slab_remove((uintptr_t)ptr);
    int pushed = enter_ctx(d);
    CUstream s = stream == PS_STREAM_NONE ? (CUstream)PS_STREAM_LEGACY : (CUstream)stream;
    CUresult r = ps_real.cuMemFreeAsync((CUdeviceptr)(uintptr_t)ptr, s);
    leave_ctx(pushed);
    return status_of(r);
}

/* Pinned host memory in the device's primary context. Its slabs are
 * recorded like device slabs, so a double or interior cudaFreeHost is
 * answered "invalid value" instead of reaching cuMemFreeHost. */
static int live_host_alloc(void *vctx, size_t size, unsigned flags, void **out)
{
    device_ops_t *d = vctx;
    if (!ps_real.cuMemHostAlloc || !ps_real.cuMemFreeHost)
        return PS_EUNSUPPORTED;
    int pushed = enter_ctx(d);
    void *p = NULL;
    CUresult r = ps_real.cuMemHostAlloc(&p, size, flags);
    leave_ctx(pushed);
    if (r != CUDA_SUCCESS)
        return status_of(r);
    ps_slab_add((uintptr_t)p, size, d->ops.device);
    *out = p;
    return PS_OK;
}

static int live_host_free(void *vctx, void *ptr, size_t size)
{
    device_ops_t *d = vctx;
    ps_slab_remove((uintptr_t)ptr);
    int pushed = enter_ctx(d);
    CUresult r = ps_real.cuMemFreeHost(ptr);
    leave_ctx(pushed);
    return status_of(r);
}

static int live_mem_alloc_managed(void *vctx, size_t size, void **out)
{
    device_ops_t *d = vctx;
    if (!ps_real.cuMemAllocManaged)
        return PS_EUNSUPPORTED;
    int pushed = enter_ctx(d);
    CUdeviceptr p = 0;
    CUresult r = ps_real.cuMemAllocManaged(&p, size, CU_MEM_ATTACH_GLOBAL);
    leave_ctx(pushed);
    return r == CUDA_SUCCESS ? new_device_slab(d, p, size, out) : status_of(r);
}

static int live_mem_get_info(void *vctx, size_t *free_bytes, size_t *total_bytes)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    CUresult r = ps_real.cuMemGetInfo_v2(free_bytes, total_bytes);
    leave_ctx(pushed);
    return status_of(r);
}

/* ---- fences ---------------------------------------------------------------------------- */
static ps_fence_t *fence_take(device_ops_t *d)
{
    pthread_mutex_lock(&d->lock);
    ps_fence_t *f = d->free_fences;
    if (f)
        d->free_fences = f->next_free;
    pthread_mutex_unlock(&d->lock);
    if (!f)
        f = calloc(1, sizeof *f);
    if (f)
        f->count = 0;
    return f;
}

static void live_fence_release(void *vctx, ps_fence_t *f)
{
    device_ops_t *d = vctx;
    if (!f)
        return;
    pthread_mutex_lock(&d->lock);
    f->next_free = d->free_fences;
    d->free_fences = f;
    pthread_mutex_unlock(&d->lock);
}

/* Records one more event of `f` on `stream`. Requires d's context current. */
static int fence_add(ps_fence_t *f, CUstream stream)
{
    if (f->count == f->capacity) {
        int cap = f->capacity ? f->capacity * 2 : 4;
        CUevent *grown = realloc(f->events, (size_t)cap * sizeof *grown);
        if (!grown)
            return PS_ENOMEM;
        memset(grown + f->capacity, 0, (size_t)(cap - f->capacity) * sizeof *grown);
        f->events = grown;
        f->capacity = cap;
    }
    CUevent *ev = &f->events[f->count];
    if (!*ev && ps_real.cuEventCreate(ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        *ev = NULL;
        return PS_EUPSTREAM;
    }
    if (ps_real.cuEventRecord(*ev, stream) != CUDA_SUCCESS)
        return PS_EUPSTREAM;
    f->count++;
    return PS_OK;
}

static int live_fence_record(void *vctx, ps_stream_t stream, ps_fence_t **out)
{
    device_ops_t *d = vctx;
    ps_fence_t *f = fence_take(d);
    if (!f)
        return PS_ENOMEM;
    int pushed = enter_ctx(d);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (ps_real.cuThreadExchangeStreamCaptureMode)
        ps_real.cuThreadExchangeStreamCaptureMode(&mode);
    int status = PS_OK;
    if (stream == PS_STREAM_NONE) {
        pthread_mutex_lock(&ps_cuda_streams_lock);
        status = ps_cuda_legacy_usable_locked();
        if (status == PS_OK)
            status = fence_add(f, (CUstream)PS_STREAM_LEGACY);
        for (size_t i = 0; i < ps_cuda_stream_count && status == PS_OK; i++) {
            if (ps_cuda_streams[i].ctx != d->ctx)
                continue;
            status = ps_cuda_capturing(ps_cuda_streams[i].stream) ? PS_EUPSTREAM : fence_add(f, ps_cuda_streams[i].stream);
        }
        pthread_mutex_unlock(&ps_cuda_streams_lock);
    } else if (stream == 0 || stream == PS_STREAM_LEGACY) {
        pthread_mutex_lock(&ps_cuda_streams_lock);
        status = ps_cuda_legacy_usable_locked();
        if (status == PS_OK)
            status = fence_add(f, (CUstream)stream);
        pthread_mutex_unlock(&ps_cuda_streams_lock);
    } else {
        /* Under the streams lock, which every cuStreamBeginCapture* takes (the
         * capture gate): otherwise another thread could begin capturing this
         * stream between the check and the record (a pool stealing a worker's
         * blocks while the worker begins a capture), and the record would land
         * in its capture, which CUDA then invalidates when our stream waits on
         * it. (tests/gpu/soak.cu's rare invalidated capture, a cudaFreeAsync
         * inside a worker's capture, has another cause: docs/design.md.) */
        pthread_mutex_lock(&ps_cuda_streams_lock);
        status = ps_cuda_capturing((CUstream)stream) ? PS_EUPSTREAM : fence_add(f, (CUstream)stream);
        pthread_mutex_unlock(&ps_cuda_streams_lock);
    }
    if (ps_real.cuThreadExchangeStreamCaptureMode)
        ps_real.cuThreadExchangeStreamCaptureMode(&mode);
    leave_ctx(pushed);
    if (status != PS_OK) {
        live_fence_release(d, f);
        return status;
    }
    *out = f;
    return PS_OK;
}

/* `event_call` (cuEventQuery or cuEventSynchronize) on each event of the
 * fence in turn, in the table's context, up to the first that does not
 * answer PS_OK. */
static inline int each_fence_event(device_ops_t *d, ps_fence_t *f, CUresult (*event_call)(CUevent))
{
    int pushed = enter_ctx(d);
    int status = PS_OK;
    for (int i = 0; i < f->count && status == PS_OK; i++)
        status = status_of(event_call(f->events[i]));
    leave_ctx(pushed);
    return status;
}

static int live_fence_query(void *vctx, ps_fence_t *f)
{
    return each_fence_event(vctx, f, ps_real.cuEventQuery);
}

static int live_fence_wait(void *vctx, ps_fence_t *f)
{
    return each_fence_event(vctx, f, ps_real.cuEventSynchronize);
}

/* PS_EBUSY when `stream` is being captured (another thread's stream, e.g.
 * an arena's owner): a wait on an event from outside the capture would
 * invalidate it. Checked and waited under the streams lock, so no capture
 * begins in between; without any capture ever begun, not checked. */
static int live_stream_wait_fence(void *vctx, ps_stream_t stream, ps_fence_t *f)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    pthread_mutex_lock(&ps_cuda_streams_lock);
    int status = PS_OK;
    if (ps_cuda_captures_begun && !ps_test.ignore_captures && stream != PS_STREAM_NONE &&
        ps_cuda_capturing((CUstream)stream))
        status = PS_EBUSY;
    for (int i = 0; i < f->count && status == PS_OK; i++)
        status = status_of(ps_real.cuStreamWaitEvent((CUstream)stream, f->events[i], 0));
    pthread_mutex_unlock(&ps_cuda_streams_lock);
    leave_ctx(pushed);
    return status;
}

/* ---- barrier (4.) --------------------------------------------------------------- */
/* Whether every operation issued to `stream` so far has completed (4. b).
 * Anything but CUDA_SUCCESS (not ready, an error, no entry point) reads as
 * busy: the barrier then records on it as always. PS_BROKEN_STREAM_IDLE
 * builds the deliberately broken variant (every stream idle) that the GPU
 * hazard tests must catch. */
static bool stream_idle(CUstream stream)
{
#ifdef PS_BROKEN_STREAM_IDLE
    (void)stream;
    return true;
#else
    return ps_real.cuStreamQuery && ps_real.cuStreamQuery(stream) == CUDA_SUCCESS;
#endif
}

/* The barrier (4.):
 *   a. refuse (PS_EBUSY) when a capture is open that it would touch:
 *      cuStreamIsCapturing on the legacy stream answers
 *      CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while a blocking stream captures
 *      (documented not to invalidate that capture), and each tracked
 *      non-blocking stream is asked directly (all skipped, with the
 *      capture-mode exchange, while no capture was ever begun in the
 *      process: a barrier is then one event record per stream);
 *   b. record an event on every live non-blocking stream of the context
 *      and make the legacy stream wait for each; a stream that
 *      cuStreamQuery finds idle is skipped: all its work so far has
 *      completed, and any work that may touch a block freed before this
 *      barrier was issued before that free, so before the query (a query
 *      costs less than a record and a wait: with 16 idle streams a barrier
 *      drops from 49 CUDA calls to 33, and the dearest ones go); then ask
 *      each live blocking stream whether it is busy (c joins those by
 *      itself). The busy streams and this count are what barrier_joined
 *      answers: 0 (a program on the legacy stream, whose only other stream
 *      is cuBLASLt's idle one) lets the pools issue eager barriers without
 *      a share of the reserve pending (core/reuse.c, 6b);
 *   c. record the barrier event E on the legacy stream: it completes after
 *      all earlier work of every stream (legacy semantics order blocking
 *      and per-thread streams, b orders the others);
 *   d. make every live non-blocking stream wait for E; blocking streams
 *      order after E by legacy semantics; a non-blocking stream created
 *      later waits for E in ps_gpu_ops_cuda_stream_created;
 *   e. barriers are numbered 1, 2, 3... per table; E of barrier n is slot
 *      n % PS_BARRIER_RING of a ring of events, so barrier_passed asks
 *      cuEventQuery on it and barrier_wait cuEventSynchronize (an older
 *      barrier: the oldest slot; a dead context: passed).
 *      POOLSHIM_TEST_ASSUME_IDLE=1 (tests only) answers passed always: the
 *      negative control of tests/gpu/remap_idle.cu.
 * cudaStreamBeginCapture & co. pass through ps_gpu_ops_cuda_capture_gate,
 * which takes the streams lock, so a capture cannot start between a and d.
 * A global-mode capture begun on a named stream is remembered: while one is
 * open, CUDA refuses "unsafe" calls (cudaMalloc, cudaFree) on every thread
 * not in relaxed mode with cudaErrorStreamCaptureUnsupported, and so does
 * the shim (ps_gpu_ops_cuda_unsafe_call_prohibited, asked by the router
 * before a pool serves one: cuStreamIsCapturing drops ended captures, the
 * thread's own mode is read, then one real cuMemAlloc asks CUDA, whose
 * answer, and effect on the capture, is the native one). */
static int live_barrier(void *vctx)
{
    device_ops_t *d = vctx;
    if (d->skip_barrier) { /* the negative control of the GPU hazard tests: must be caught. */
        /* Numbered like a real barrier, so blocks it "releases" carry a
         * generation that barrier_passed answers "not yet" for: with the
         * number left at 0 they read as idle now and remap unmapped memory
         * under running kernels (an illegal address instead of the wrong
         * bytes the control must report). */
        atomic_fetch_add_explicit(&d->barriers, 1, memory_order_acq_rel);
        return PS_OK;
    }
    if (!ps_real.cuStreamIsCapturing)
        return PS_EUNSUPPORTED;
    int pushed = enter_ctx(d);
    pthread_mutex_lock(&ps_cuda_streams_lock);
    bool check_captures = ps_cuda_captures_begun != 0 && !ps_test.ignore_captures; /* none ever begun: none is open (the gate holds this lock) */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (check_captures && ps_real.cuThreadExchangeStreamCaptureMode)
        ps_real.cuThreadExchangeStreamCaptureMode(&mode);
    int status = check_captures ? ps_cuda_capture_scan_locked(d) : PS_OK;
    /* E of this barrier: its slot of the ring (barrier_passed asks it) */
    uint64_t number = atomic_load_explicit(&d->barriers, memory_order_relaxed) + 1;
    CUevent *slot = &d->barrier_events[number % PS_BARRIER_RING];
    if (status == PS_OK && !*slot && ps_real.cuEventCreate(slot, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        *slot = NULL;
        status = PS_EUPSTREAM;
    }
    /* b: every non-blocking stream's work so far joins the legacy stream */
    unsigned joined = 0;
    for (size_t i = 0; i < ps_cuda_stream_count && status == PS_OK && !d->no_join; i++) {
        tracked_stream_t *t = &ps_cuda_streams[i];
        if (t->ctx != d->ctx)
            continue;
        if (stream_idle(t->stream))
            continue; /* nothing of it left to order after (b. above) */
        if (!t->event && ps_real.cuEventCreate(&t->event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
            t->event = NULL;
            status = PS_EUPSTREAM;
            break;
        }
        if (ps_real.cuEventRecord(t->event, t->stream) != CUDA_SUCCESS ||
            ps_real.cuStreamWaitEvent((CUstream)PS_STREAM_LEGACY, t->event, 0) != CUDA_SUCCESS)
            status = PS_EUPSTREAM;
        joined++;
    }
    /* b': a busy blocking stream is joined by E itself (legacy semantics); only counted */
    for (size_t i = 0; i < ps_cuda_blocking_count && status == PS_OK; i++)
        if (ps_cuda_blocking[i].ctx == d->ctx && !stream_idle(ps_cuda_blocking[i].stream))
            joined++;
    /* c: E after everything issued so far */
    if (status == PS_OK && ps_real.cuEventRecord(*slot, (CUstream)PS_STREAM_LEGACY) != CUDA_SUCCESS)
        status = PS_EUPSTREAM;
    if (status == PS_OK)
        d->barrier_event = *slot;
    /* d: everything issued from now on, after E */
    for (size_t i = 0; i < ps_cuda_stream_count && status == PS_OK; i++)
        if (ps_cuda_streams[i].ctx == d->ctx &&
            ps_real.cuStreamWaitEvent(ps_cuda_streams[i].stream, d->barrier_event, 0) != CUDA_SUCCESS)
            status = PS_EUPSTREAM;
    if (status == PS_OK) {
        d->barrier_recorded = 1;
        atomic_store_explicit(&d->barrier_joins, joined, memory_order_relaxed);
        if (!joined)
            atomic_fetch_add_explicit(&d->barriers_quiet, 1, memory_order_relaxed);
        atomic_store_explicit(&d->barriers, number, memory_order_release);
    }
    if (check_captures && ps_real.cuThreadExchangeStreamCaptureMode)
        ps_real.cuThreadExchangeStreamCaptureMode(&mode);
    pthread_mutex_unlock(&ps_cuda_streams_lock);
    leave_ctx(pushed);
    return status;
}

/* Waits on the host until barrier `generation` has passed (4. e): a
 * cuEventSynchronize of its E, or of the oldest remembered E for an older
 * barrier (it completes later: never too early). The slot is read under
 * ps_cuda_streams_lock and waited on outside it (a wait may take the GPU's whole
 * lag; stream creation must not wait with it); a barrier that re-records
 * the slot meanwhile only makes the wait longer. Work issued after the
 * barrier keeps the GPU busy, unlike a device synchronize. */
static int live_barrier_wait(void *vctx, uint64_t generation)
{
    device_ops_t *d = vctx;
    if (d->skip_barrier) /* barriers recorded nothing: nothing to wait for (the caller synchronizes) */
        return PS_EUNSUPPORTED;
    if (generation == 0 || d->assume_idle || d->wait_returns) /* negative controls of tests/gpu/remap_idle.cu */
        return PS_OK;
    if (!ps_real.cuEventSynchronize)
        return PS_EUNSUPPORTED;
    int pushed = enter_ctx(d);
    pthread_mutex_lock(&ps_cuda_streams_lock);
    uint64_t newest = atomic_load_explicit(&d->barriers, memory_order_relaxed);
    CUevent e = NULL;
    if (generation <= newest) {
        generation = ps_barrier_remembered(newest, generation);
        e = d->barrier_events[generation % PS_BARRIER_RING];
    }
    pthread_mutex_unlock(&ps_cuda_streams_lock);
    int status = e ? status_of(ps_real.cuEventSynchronize(e)) : PS_EINVAL;
    leave_ctx(pushed);
    return status;
}

/* Busy streams the newest barrier joined (4. b): 0 tells the pools that a
 * barrier costs no stream its overlap (core/reuse.c, 6b). */
static unsigned ops_barrier_joined(void *vctx)
{
    return atomic_load_explicit(&((device_ops_t *)vctx)->barrier_joins, memory_order_relaxed);
}

/* Barriers that joined no busy stream, of all issued (statistics). */
static uint64_t ops_barriers_quiet(void *vctx)
{
    return atomic_load_explicit(&((device_ops_t *)vctx)->barriers_quiet, memory_order_relaxed);
}

/* Barrier numbers (4. above): the newest barrier issued. */
static uint64_t ops_barrier_generation(void *vctx)
{
    return atomic_load_explicit(&((device_ops_t *)vctx)->barriers, memory_order_acquire);
}

/* Whether everything issued before barrier `generation` has finished: its
 * E (a barrier older than the ring: the oldest E the ring remembers;
 * E events complete in issue order, all on the legacy stream). A slot
 * re-recorded by a barrier that failed half-way completes later than the
 * barrier it held: the answer is late, never early. */
static int live_barrier_passed(void *vctx, uint64_t generation)
{
    device_ops_t *d = vctx;
    if (d->skip_barrier) /* barriers recorded nothing: no memory is known idle (the hazard tests' control
                            checks reuse ordering; without this, remap unmapped memory in use and the
                            kernels faulted instead of reporting corruption) */
        return PS_ENOTREADY;
    if (generation == 0 || d->assume_idle) /* the negative control of tests/gpu/remap_idle.cu */
        return PS_OK;
    int pushed = enter_ctx(d);
    pthread_mutex_lock(&ps_cuda_streams_lock);
    uint64_t newest = atomic_load_explicit(&d->barriers, memory_order_relaxed);
    int status = PS_EINVAL; /* a barrier never issued */
    if (generation <= newest) {
        generation = ps_barrier_remembered(newest, generation);
        CUevent e = d->barrier_events[generation % PS_BARRIER_RING];
        status = e ? status_of(ps_real.cuEventQuery(e)) : PS_EUPSTREAM;
    }
    pthread_mutex_unlock(&ps_cuda_streams_lock);
    leave_ctx(pushed);
    return status;
}

/* ---- guard mode (7. above) ------------------------------------------------------------ */
static CUstream stream_of(ps_stream_t stream)
{
    return stream == PS_STREAM_NONE ? (CUstream)(uintptr_t)PS_STREAM_LEGACY : (CUstream)stream;
}

static int live_memset_d8(void *vctx, void *ptr, uint8_t value, size_t bytes, ps_stream_t stream)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    CUresult r = ps_real.cuMemsetD8Async((CUdeviceptr)(uintptr_t)ptr, value, bytes, stream_of(stream));
    if (r == CUDA_SUCCESS && stream == PS_STREAM_NONE)
        r = ps_real.cuStreamSynchronize(stream_of(stream));
    leave_ctx(pushed);
    return status_of(r);
}

/* A synchronize of the whole context, unless a stream capture is open in it:
 * CUDA invalidates every capture of a context that is synchronized, in
 * whatever thread and mode it was begun (the soak's thread-local captures
 * died of the pool's synchronize on another thread; tests/gpu/capture_threads.cu).
 * PS_EBUSY then, nothing waited for. The streams lock is held across the
 * synchronize, so no capture begins during it (a cuStreamBeginCapture* waits
 * at the gate). */
static int context_synchronize(device_ops_t *d)
{
    pthread_mutex_lock(&ps_cuda_streams_lock);
    int status = ps_cuda_capture_open_locked(d);
    if (status == PS_OK)
        status = status_of(ps_real.cuCtxSynchronize());
    pthread_mutex_unlock(&ps_cuda_streams_lock);
    return status;
}

static int live_copy_to_host(void *vctx, void *dst, const void *src, size_t bytes, ps_stream_t stream)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    int status = stream == PS_STREAM_NONE ? context_synchronize(d)
                                          : status_of(ps_real.cuStreamSynchronize((CUstream)stream));
    if (status == PS_OK)
        status = status_of(ps_real.cuMemcpyDtoH_v2(dst, (CUdeviceptr)(uintptr_t)src, bytes));
    leave_ctx(pushed);
    return status;
}

static int live_device_synchronize(void *vctx)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    int status = context_synchronize(d);
    leave_ctx(pushed);
    return status;
}

/* ---- the gate (10.): every entry of the table, around its live_ body ---- */
/* (GATED and GATED_VOID: shim/gpu_ops_cuda_internal.h; the virtual-memory entries are
 * in shim/gpu_ops_cuda_vm.c) */
GATED_TIMED(mem_alloc, PS_OP_TIME_CHUNK, (void *vctx, size_t size, void **out), (vctx, size, out), dead_mem_alloc(vctx, size, out))
GATED_TIMED(mem_free, PS_OP_TIME_CHUNK, (void *vctx, void *ptr, size_t size), (vctx, ptr, size), dead_mem_free(vctx, ptr, size))
GATED(mem_alloc_async, (void *vctx, size_t size, ps_stream_t stream, void **out), (vctx, size, stream, out), dead_mem_alloc_async(vctx, size, stream, out))
GATED(mem_free_async, (void *vctx, void *ptr, ps_stream_t stream), (vctx, ptr, stream), dead_mem_free_async(vctx, ptr, stream))
GATED(host_alloc, (void *vctx, size_t size, unsigned flags, void **out), (vctx, size, flags, out), dead_host_alloc(vctx, size, flags, out))
GATED(host_free, (void *vctx, void *ptr, size_t size), (vctx, ptr, size), dead_mem_free(vctx, ptr, size)) /* the context freed its pinned memory */
GATED(mem_alloc_managed, (void *vctx, size_t size, void **out), (vctx, size, out), dead_mem_alloc(vctx, size, out))
GATED(mem_get_info, (void *vctx, size_t *free_bytes, size_t *total_bytes), (vctx, free_bytes, total_bytes), dead_mem_get_info(vctx, free_bytes, total_bytes))
GATED_VOID(fence_release, (void *vctx, ps_fence_t *f), (vctx, f))
GATED(fence_record, (void *vctx, ps_stream_t stream, ps_fence_t **out), (vctx, stream, out), dead_fence_record(vctx, stream, out))
GATED(fence_query, (void *vctx, ps_fence_t *f), (vctx, f), dead_fence_done(vctx, f))
GATED_TIMED(fence_wait, PS_OP_TIME_WAIT, (void *vctx, ps_fence_t *f), (vctx, f), dead_fence_done(vctx, f))
GATED(stream_wait_fence, (void *vctx, ps_stream_t stream, ps_fence_t *f), (vctx, stream, f), dead_stream_wait_fence(vctx, stream, f))
GATED_TIMED(barrier, PS_OP_TIME_BARRIER, (void *vctx), (vctx), dead_barrier(vctx))
GATED_TIMED(barrier_wait, PS_OP_TIME_WAIT, (void *vctx, uint64_t generation), (vctx, generation), dead_barrier_wait(vctx, generation))
GATED(barrier_passed, (void *vctx, uint64_t generation), (vctx, generation), dead_barrier_passed(vctx, generation))
GATED(memset_d8, (void *vctx, void *ptr, uint8_t value, size_t bytes, ps_stream_t stream), (vctx, ptr, value, bytes, stream), dead_memset_d8(vctx, ptr, value, bytes, stream))
GATED(copy_to_host, (void *vctx, void *dst, const void *src, size_t bytes, ps_stream_t stream), (vctx, dst, src, bytes, stream), dead_copy_to_host(vctx, dst, src, bytes, stream))
GATED_TIMED(device_synchronize, PS_OP_TIME_WAIT, (void *vctx), (vctx), dead_device_synchronize(vctx))

int ps_gpu_ops_cuda_create(int device, CUcontext ctx, ps_gpu_ops_t **out)
{
    device_ops_t *d = calloc(1, sizeof *d);
    if (!d)
        return PS_ENOMEM;
    d->ctx = ctx;
    d->device = device;
    d->skip_barrier = ps_test.skip_barrier;
    d->assume_idle = ps_test.assume_idle;
    if (d->assume_idle)
        ps_warning("POOLSHIM_TEST_ASSUME_IDLE=1: every barrier counts as passed; remap may unmap memory a kernel "
                   "still uses (a test switch, never for real work)");
    d->wait_returns = ps_test.wait_returns;
    if (d->wait_returns)
        ps_warning("POOLSHIM_TEST_WAIT_RETURNS=1: waits for a barrier return at once; remap may unmap memory a "
                   "kernel still uses (a test switch, never for real work)");
    d->no_join = ps_test.barrier_no_join;
    if (d->no_join)
        ps_warning("POOLSHIM_TEST_BARRIER_NO_JOIN=1: barriers do not wait for non-blocking streams; memory they "
                   "still use may be reused (a measurement switch, never for real work)");
    if (d->skip_barrier)
        ps_warning("POOLSHIM_TEST_SKIP_BARRIER=1: barriers order nothing; freed memory may be reused while "
                   "kernels still use it (a test switch, never for real work)");
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->vm_lock, NULL);
    pthread_rwlockattr_t gate_attr; /* the writer first (10. above) */
    pthread_rwlockattr_init(&gate_attr);
    pthread_rwlockattr_setkind_np(&gate_attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&d->gate, &gate_attr);
    pthread_rwlockattr_destroy(&gate_attr);
    if (ps_ptr_map_init(&d->vm_handles, 64) != PS_OK || ps_ptr_map_init(&d->vm_sizes, 64) != PS_OK ||
        ps_ptr_map_init(&d->vm_ranges, 4) != PS_OK) {
        ps_ptr_map_free(&d->vm_handles);
        ps_ptr_map_free(&d->vm_sizes);
        free(d);
        return PS_ENOMEM;
    }
    d->ops = (ps_gpu_ops_t){
        .ctx = d,
        .device = device,
        .mem_alloc = ops_mem_alloc,
        .mem_free = ops_mem_free,
        .mem_alloc_async = ops_mem_alloc_async,
        .mem_free_async = ops_mem_free_async,
        .mem_alloc_managed = ops_mem_alloc_managed,
        .mem_get_info = ops_mem_get_info,
        .fence_record = ops_fence_record,
        .fence_query = ops_fence_query,
        .fence_wait = ops_fence_wait,
        .fence_release = ops_fence_release,
        .stream_wait_fence = ops_stream_wait_fence,
        .device_synchronize = ops_device_synchronize,
        .barrier = ops_barrier,
        .barrier_generation = ops_barrier_generation,
        .barrier_joined = ops_barrier_joined,
        .barriers_quiet = ops_barriers_quiet,
        .barrier_passed = ops_barrier_passed,
        .barrier_wait = ops_barrier_wait,
        .host_alloc = ops_host_alloc,
        .host_free = ops_host_free,
    };
    if (ps_real.cuMemsetD8Async && ps_real.cuMemcpyDtoH_v2 && ps_real.cuStreamSynchronize) {
        d->ops.memset_d8 = ops_memset_d8;
        d->ops.copy_to_host = ops_copy_to_host;
    }
    ps_gpu_ops_cuda_vm_attach(d); /* virtual memory, pinned host pieces, IPC: what the device offers */
    if (device >= 0 && device < PS_MAX_DEVICES) {
        pthread_mutex_lock(&ps_cuda_streams_lock);
        ps_cuda_device_tables[device] = d;
        pthread_mutex_unlock(&ps_cuda_streams_lock);
        ps_gpu_ops_cuda_table_in_use(device); /* it and the devices in use reach each other (5. of _vm.c) */
    }
    *out = &d->ops;
    return PS_OK;
}

/* The gate (10.): every entry of the table that calls CUDA is a live_
 * body behind a gated ops_ entry: it takes the table's gate (a rwlock) to
 * read, and answers as the dead table does (dead_*) once the context died.
 * Whatever destroys the context (cudaDeviceReset, the last release,
 * cuCtxDestroy, new flags: lifecycle.c) closes the gate around the real
 * call (ps_gpu_ops_cuda_close: waits for the calls inside it and holds new
 * ones), marks the table dead before it opens again if the context died,
 * then drops the stack. Without it a thread already past the "dead?" check
 * recorded an event of the destroyed context (the TSan stress of context
 * resets sees it). The gate prefers the writer (a reset is not starved by
 * a stream of calls), so no entry may enter it twice: live_ bodies call
 * live_ bodies only. A non-blocking stream created while the gate is
 * closed owes its wait for the last barrier (its event may be of the dying
 * context); it waits when the gate opens on a live context, never on a
 * dead one.
 *
 * Closes the table's gate: returns once no call is inside it;
 * later calls wait until ps_gpu_ops_cuda_open. The caller may then destroy
 * the context, and must mark the table dead before it opens the gate if
 * the context died. It must not call the table meanwhile. */
void ps_gpu_ops_cuda_close(ps_gpu_ops_t *ops)
{
    device_ops_t *d = (device_ops_t *)ops;
    pthread_rwlock_wrlock(&d->gate);
    pthread_mutex_lock(&ps_cuda_streams_lock);
    d->closing = 1;
    pthread_mutex_unlock(&ps_cuda_streams_lock);
}

/* Opens it again: streams created meanwhile wait for the last barrier now
 * if the context lives (a dead one's streams went with it). */
void ps_gpu_ops_cuda_open(ps_gpu_ops_t *ops)
{
    device_ops_t *d = (device_ops_t *)ops;
    pthread_mutex_lock(&ps_cuda_streams_lock);
    d->closing = 0;
    for (size_t i = 0; i < ps_cuda_stream_count; i++)
        if (ps_cuda_streams[i].owes_wait && ps_cuda_streams[i].ctx == d->ctx) {
            ps_cuda_streams[i].owes_wait = false;
            if (!is_dead(d) && d->barrier_recorded)
                ps_real.cuStreamWaitEvent(ps_cuda_streams[i].stream, d->barrier_event, 0);
        }
    pthread_mutex_unlock(&ps_cuda_streams_lock);
    pthread_rwlock_unlock(&d->gate);
}

/* The table of a dead context: every call fails (or does nothing) without
 * calling CUDA. The resources over it keep their pointer to the table, so
 * its entries are replaced in place; its events, fences and memory are
 * abandoned (the driver freed them with the context). Called with the
 * gate closed (10. above), or again by drop_device (nothing more then). */
void ps_gpu_ops_cuda_mark_dead(ps_gpu_ops_t *ops)
{
    if (!ops)
        return;
    atomic_store_explicit(&((device_ops_t *)ops)->dead, 1, memory_order_release);
    /* new streams of the next context (same primary-context handle) must
     * not wait on the dead barrier event */
    device_ops_t *d = (device_ops_t *)ops;
    pthread_mutex_lock(&ps_cuda_streams_lock);
    d->barrier_recorded = 0;
    d->barrier_event = NULL;
    memset(d->barrier_events, 0, sizeof d->barrier_events); /* gone with the context */
    for (int i = 0; i < PS_MAX_DEVICES; i++)
        if (ps_cuda_device_tables[i] == d)
            ps_cuda_device_tables[i] = NULL;
    pthread_mutex_unlock(&ps_cuda_streams_lock);
}
