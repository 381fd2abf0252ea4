/* The GPU-ops table of core/ (core/gpu_ops.h) over the real CUDA driver.
 *
 * 1. One table per device, bound to the device's primary context. Every
 *    operation makes that context current for its duration (push/pop)
 *    when another one is current: frees may arrive from any device.
 * 2. Fences are sets of events from a per-device free list (events are
 *    created once, with timing disabled, and recycled).
 *    - fence_record(PS_STREAM_NONE) closes a cudaFree epoch: one event on
 *      the legacy default stream, which orders after all prior work of
 *      every *blocking* stream (per-thread default streams included), plus
 *      one on each live *non-blocking* stream of this context, which the
 *      legacy stream does not order. The stream set comes from our
 *      cudaStreamCreate... and cuStreamCreate... hooks.
 *    - fence_record(stream) records one event on that stream.
 *    If any record fails (a stream being captured into a graph, a sticky
 *    error), no fence is returned: the pool then grows instead of reusing,
 *    which is always safe. Our own calls run in relaxed capture mode so
 *    they never invalidate the program's graph capture.
 * 3. mem_alloc/mem_free call the real cuMemAlloc_v2/cuMemFree_v2 and
 *    record the slab in the registry (bad-pointer detection).
 * 4. barrier (free_sync barrier), under streams_lock so that no stream is
 *    created and no capture begins half-way:
 *      a. refuse (PS_EBUSY) when a capture is open that it would touch:
 *         cuStreamIsCapturing on the legacy stream answers
 *         CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while a blocking stream
 *         captures (documented not to invalidate that capture), and each
 *         tracked non-blocking stream is asked directly (all skipped, with
 *         the capture-mode exchange, while no capture was ever begun in the
 *         process: a barrier is then one event record per stream);
 *      b. record an event on every live non-blocking stream of the
 *         context and make the legacy stream wait for each; a stream that
 *         cuStreamQuery finds idle is skipped: all its work so far has
 *         completed, and any work that may touch a block freed before this
 *         barrier was issued before that free, so before the query (a query
 *         is ~1/3 of a record and a wait on an H100: with 16 idle streams a
 *         barrier drops from 49 CUDA calls to 33, and the dearest ones go);
 *      c. record the barrier event E on the legacy stream: it completes
 *         after all earlier work of every stream (legacy semantics order
 *         blocking and per-thread streams, b orders the others);
 *      d. make every live non-blocking stream wait for E. Blocking
 *         streams order after E by legacy semantics; a non-blocking stream
 *         created later waits for E in ps_gpu_ops_cuda_stream_created.
 *      e. barriers are numbered 1, 2, 3... per table; E of barrier n is
 *         slot n % PS_BARRIER_RING of a ring of events, so barrier_passed
 *         asks cuEventQuery on it and barrier_wait cuEventSynchronize
 *         (an older barrier: on the oldest slot;
 *         a dead context: passed). POOLSHIM_TEST_ASSUME_IDLE=1 (tests
 *         only) answers passed always: the negative control of
 *         tests/gpu/remap_idle.cu.
 *    cudaStreamBeginCapture & co. pass through ps_gpu_ops_cuda_capture_gate,
 *    which takes streams_lock, so a capture cannot start between a and d.
 *    A global-mode capture that begins on a named stream is remembered: while
 *    one is open, CUDA refuses "unsafe" calls (cudaMalloc, cudaFree) on
 *    every thread not in relaxed mode with cudaErrorStreamCaptureUnsupported,
 *    and so does the shim (ps_gpu_ops_cuda_unsafe_call_prohibited, asked by
 *    the router before a pool serves one: cuStreamIsCapturing drops ended
 *    captures, the thread's own mode is read, then one real cuMemAlloc asks
 *    CUDA, whose answer — and effect on the capture — is the native one).
 * 5., 8., 9. The virtual-memory entries (vm_*, ipc_*, host_vm_*, peer access
 *    to mapped pieces, giving it all back before a reset): shim/gpu_ops_cuda_vm.c.
 * 6. With debug.nvtx on, every chunk (mem_alloc, mem_alloc_managed) and
 *    every mapped piece (vm_map) is announced to nvtx.c as a heap, and
 *    withdrawn before it goes back (mem_free, vm_unmap).
 * 7. memset_d8 / copy_to_host (guard mode): cuMemsetD8Async on the
 *    block's stream (the legacy stream for cudaMalloc, then a host wait on
 *    it); cuCtxSynchronize (or cuStreamSynchronize of the block's stream)
 *    before cuMemcpyDtoH, so no kernel can still write what is read.
 * 10. The gate: no call into a context while it dies. Every entry of the
 *    table that calls CUDA is a live_ body behind a gated ops_ entry: it
 *    takes the table's gate (a rwlock) to read, and answers as the dead
 *    table does (dead_* below) once the context died. Whatever destroys
 *    the context (the router's cudaDeviceReset, last release, cuCtxDestroy,
 *    new flags) closes the gate around the real call
 *    (ps_gpu_ops_cuda_close: waits for the calls inside it and holds new
 *    ones), marks the table dead before it opens again if the context
 *    died, then drops the stack. Without it a thread already past the
 *    "dead?" check recorded an event of the destroyed context (the TSan
 *    stress of context resets saw it in 3 runs of 30; in 9 of 10 with the
 *    fake driver's 100 us delay in event calls). The gate prefers the
 *    writer (a reset is not starved by a stream of calls), so no entry may
 *    enter it twice: live_ bodies call live_ bodies only. A non-blocking
 *    stream created while the gate is closed owes its wait for the last
 *    barrier (its event may be of the dying context); it waits when the
 *    gate opens on a live context, never on a dead one.
 * 11. The out-of-memory give-back (router.c, ps_route_oom_give_back): a
 *    trim may synchronize the device, which would invalidate an open stream
 *    capture. ps_gpu_ops_cuda_give_back_enter asks as a barrier does (4. a)
 *    whether a capture is open in the context, and refuses if one is;
 *    otherwise it holds give_back_lock (to read) until the trim ended, and
 *    every cuStreamBeginCapture* takes it (to write) in the capture gate,
 *    so no capture begins half-way.
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

/* ---- stream tracking -------------------------------------------------------- */
typedef struct tracked_stream {
    CUstream stream; /* a live non-blocking stream */
    CUcontext ctx;   /* its context */
    CUevent event;   /* barrier step b's event on it (created lazily), or NULL */
    bool owes_wait;  /* created while its table's gate was closed: waits for the last barrier when it opens (10.) */
} tracked_stream_t;
static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static tracked_stream_t *streams;   /* live non-blocking streams */
static size_t stream_count, stream_capacity;
static device_ops_t *device_tables[PS_MAX_DEVICES]; /* every table made, for barrier waits of new streams */
/* Peer access granted by the program: bit D of peer_access[P] = device D
 * may access device P's memory (guarded by streams_lock). */
static uint64_t peer_access[PS_MAX_DEVICES];

/* A new non-blocking stream of `ctx` waits for the last barrier of that
 * context (it would otherwise run beside work issued before it); while the
 * context's table is closed (10. above) it owes that wait instead.
 * streams_lock held. */
static void wait_last_barrier_locked(tracked_stream_t *s)
{
    for (int d = 0; d < PS_MAX_DEVICES; d++) {
        device_ops_t *t = device_tables[d];
        if (t && t->ctx == s->ctx && t->closing) {
            s->owes_wait = true;
            return;
        }
        if (t && t->ctx == s->ctx && t->barrier_recorded) {
            ps_real.cuStreamWaitEvent(s->stream, t->barrier_event, 0);
            return;
        }
    }
}

/* Stream captures ever begun in this process (every cuStreamBeginCapture*
 * passes the gate). While it is 0 no capture can be open, and a barrier
 * skips the capture checks (3 driver calls of its ~5). Guarded by
 * streams_lock for writers; read under it by ops_barrier. */
static uint64_t captures_begun;

/* Held to read by an out-of-memory give-back from its capture check to the
 * end of its trim (which may synchronize the device), to write by every
 * cuStreamBeginCapture* before streams_lock: no capture begins in between
 * (11. above). Taken before streams_lock, never under it. */
static pthread_rwlock_t give_back_lock = PTHREAD_RWLOCK_INITIALIZER;

int ps_gpu_ops_cuda_capture_gate(void)
{
    pthread_rwlock_wrlock(&give_back_lock);
    int r = pthread_mutex_lock(&streams_lock);
    captures_begun++;
    return r;
}

void ps_gpu_ops_cuda_capture_gate_end(void)
{
    pthread_mutex_unlock(&streams_lock);
    pthread_rwlock_unlock(&give_back_lock);
}

/* Global-mode captures that began on a named stream and may still be open
 * (guarded by streams_lock; a stream leaves when cuStreamIsCapturing says
 * its capture ended). The per-thread and legacy default streams (handle 0
 * and the special values) are not remembered: another thread's cannot be
 * asked. */
#define GLOBAL_CAPTURES_MAX 64
static CUstream global_captures[GLOBAL_CAPTURES_MAX];
atomic_int ps_gpu_ops_cuda_global_captures; /* entries in global_captures (read without the lock) */

void ps_gpu_ops_cuda_capture_begun(CUstream stream, CUstreamCaptureMode mode)
{
    int n = atomic_load(&ps_gpu_ops_cuda_global_captures);
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL || (uintptr_t)stream <= 2 || n == GLOBAL_CAPTURES_MAX)
        return;
    for (int i = 0; i < n; i++)
        if (global_captures[i] == stream)
            return;
    global_captures[n] = stream;
    atomic_store(&ps_gpu_ops_cuda_global_captures, n + 1);
}

/* ps_gpu_ops_cuda_unsafe_call_prohibited (shim.h) once a global capture
 * may be open. */
CUresult ps_gpu_ops_cuda_unsafe_call_check(void)
{
    pthread_mutex_lock(&streams_lock);
    int n = atomic_load(&ps_gpu_ops_cuda_global_captures);
    for (int i = 0; i < n;) {
        CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
        if (ps_real.cuStreamIsCapturing(global_captures[i], &st) == CUDA_SUCCESS &&
            st != CU_STREAM_CAPTURE_STATUS_NONE) {
            i++;
            continue;
        }
        global_captures[i] = global_captures[--n]; /* ended (or the stream is gone) */
    }
    atomic_store(&ps_gpu_ops_cuda_global_captures, n);
    pthread_mutex_unlock(&streams_lock);
    if (n == 0)
        return CUDA_SUCCESS;
    /* this thread's own mode: relaxed may make unsafe calls */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (!ps_real.cuThreadExchangeStreamCaptureMode ||
        ps_real.cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS)
        return CUDA_SUCCESS;
    CUstreamCaptureMode own = mode; /* the thread's mode; put it back */
    ps_real.cuThreadExchangeStreamCaptureMode(&mode);
    if (own == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    /* ask CUDA with a real unsafe call, as the program's would have been */
    CUdeviceptr probe = 0;
    CUresult r = ps_real.cuMemAlloc_v2(&probe, 256);
    if (r == CUDA_SUCCESS) {
        ps_real.cuMemFree_v2(probe);
        return CUDA_SUCCESS;
    }
    return r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ? r : CUDA_SUCCESS;
}

void ps_gpu_ops_cuda_stream_created(CUstream stream, unsigned int flags)
{
    if (!(flags & CU_STREAM_NON_BLOCKING) || !stream || ps_real_load_driver() != PS_OK)
        return;
    CUcontext ctx = NULL;
    if (ps_real.cuStreamGetCtx)
        ps_real.cuStreamGetCtx(stream, &ctx);
    else
        ps_real.cuCtxGetCurrent(&ctx);
    pthread_mutex_lock(&streams_lock);
    for (size_t i = 0; i < stream_count; i++)
        if (streams[i].stream == stream) { /* handle reused after a destroy we missed, or both doors */
            streams[i].ctx = ctx;
            streams[i].owes_wait = false;
            wait_last_barrier_locked(&streams[i]);
            pthread_mutex_unlock(&streams_lock);
            return;
        }
    if (stream_count == stream_capacity) {
        size_t cap = stream_capacity ? stream_capacity * 2 : 32;
        tracked_stream_t *grown = realloc(streams, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&streams_lock);
            ps_warning("out of host memory tracking a stream");
            return;
        }
        streams = grown;
        stream_capacity = cap;
    }
    streams[stream_count] = (tracked_stream_t){stream, ctx, NULL, false};
    wait_last_barrier_locked(&streams[stream_count++]);
    pthread_mutex_unlock(&streams_lock);
}

void ps_gpu_ops_cuda_stream_destroyed(CUstream stream)
{
    pthread_mutex_lock(&streams_lock);
    /* a stream that had a global capture is forgotten with it: asking CUDA
     * about a destroyed handle crashes inside libcuda (GPU suite,
     * async_streams: a graph captured in global mode, its stream destroyed,
     * then cudaFree) */
    int n = atomic_load(&ps_gpu_ops_cuda_global_captures);
    for (int i = 0; i < n; i++)
        if (global_captures[i] == stream) {
            global_captures[i] = global_captures[--n];
            atomic_store(&ps_gpu_ops_cuda_global_captures, n);
            break;
        }
    for (size_t i = 0; i < stream_count; i++)
        if (streams[i].stream == stream) {
            if (streams[i].event)
                ps_real.cuEventDestroy_v2(streams[i].event);
            streams[i] = streams[--stream_count];
            break;
        }
    pthread_mutex_unlock(&streams_lock);
}

void ps_gpu_ops_cuda_atfork_prepare(void) { pthread_mutex_lock(&streams_lock); }
void ps_gpu_ops_cuda_atfork_parent(void) { pthread_mutex_unlock(&streams_lock); }
void ps_gpu_ops_cuda_atfork_child(void)
{
    pthread_mutex_init(&streams_lock, NULL);
    pthread_rwlock_init(&give_back_lock, NULL); /* (a give-back of the parent's may have held it) */
}

/* ---- memory ------------------------------------------------------------------------ */
static int live_mem_alloc(void *vctx, size_t size, void **out)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    CUdeviceptr p = 0;
    CUresult r = ps_real.cuMemAlloc_v2(&p, size);
    leave_ctx(pushed);
    if (r != CUDA_SUCCESS)
        return status_of(r);
    ps_slab_add((uintptr_t)p, size, d->ops.device);
    if (PS_UNLIKELY(ps_nvtx_on))
        ps_nvtx_heap_add((void *)(uintptr_t)p, size, d->ops.device);
    *out = (void *)(uintptr_t)p;
    return PS_OK;
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

/* The async upstream's memory comes from the device's current memory pool,
 * reachable (like mapped memory, 5. of gpu_ops_cuda_vm.c) only from the
 * devices the pool names: a copy of it made while another device is
 * current fails. So at its first allocation the pool is opened to every
 * device that can reach this one, as cudaMalloc memory is (the program
 * then sees that access on its pool too). Context entered by the caller. */
static void open_pool_to_peers(device_ops_t *d, uint64_t peers)
{
    CUmemoryPool pool = NULL;
    if (!ps_real.cuDeviceGetMemPool || !ps_real.cuMemPoolSetAccess ||
        ps_real.cuDeviceGetMemPool(&pool, d->device) != CUDA_SUCCESS)
        return;
    CUmemAccessDesc access[PS_MAX_DEVICES];
    size_t count = 0;
    for (int p = 0; p < PS_MAX_DEVICES; p++)
        if (peers >> p & 1)
            access[count++] = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, p}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUresult r = ps_real.cuMemPoolSetAccess(pool, access, count);
    if (r != CUDA_SUCCESS)
        ps_warning("device %d: its memory pool could not be opened to the other devices (error %d): a copy of the "
                   "async upstream's memory made while another device is current will fail",
                   d->device, r);
}

static int live_mem_alloc_async(void *vctx, size_t size, ps_stream_t stream, void **out)
{
    device_ops_t *d = vctx;
    if (!ps_real.cuMemAllocAsync)
        return PS_EUNSUPPORTED;
    int pushed = enter_ctx(d);
    uint64_t peers = atomic_load(&d->copy_peers);
    if (!atomic_load_explicit(&d->pool_shared, memory_order_relaxed) && peers && !d->skip_peer_grant &&
        !atomic_exchange(&d->pool_shared, 1))
        open_pool_to_peers(d, peers);
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
    if (r != CUDA_SUCCESS)
        return status_of(r);
    ps_slab_add((uintptr_t)p, size, d->ops.device);
    if (PS_UNLIKELY(ps_nvtx_on))
        ps_nvtx_heap_add((void *)(uintptr_t)p, size, d->ops.device);
    *out = (void *)(uintptr_t)p;
    return PS_OK;
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

static bool capturing(CUstream s)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (ps_real.cuStreamIsCapturing && ps_real.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS)
        return st != CU_STREAM_CAPTURE_STATUS_NONE;
    return false;
}

/* PS_OK when the legacy stream may be recorded on; PS_EBUSY while a
 * blocking stream captures (recording there would invalidate that capture:
 * cudaErrorStreamCaptureImplicit), whatever thread captures. streams_lock
 * held (no capture can begin meanwhile). */
static int legacy_usable_locked(void)
{
    if (!captures_begun || ps_test.ignore_captures)
        return PS_OK;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = ps_real.cuStreamIsCapturing((CUstream)PS_STREAM_LEGACY, &st);
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || (r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE))
        return PS_EBUSY;
    return r == CUDA_SUCCESS ? PS_OK : PS_EUPSTREAM;
}

bool ps_gpu_ops_cuda_legacy_enter(void)
{
    pthread_mutex_lock(&streams_lock);
    if (legacy_usable_locked() == PS_OK)
        return true;
    pthread_mutex_unlock(&streams_lock);
    return false;
}

void ps_gpu_ops_cuda_legacy_leave(void) { pthread_mutex_unlock(&streams_lock); }

/* ---- the out-of-memory give-back (11. above) ------------------------------------------ */
/* Whether a stream capture is open in d's context (11. above): PS_OK none,
 * PS_EBUSY one is, PS_EUPSTREAM CUDA cannot say. The checks of a barrier
 * (4. a): the legacy stream answers for the blocking streams, each tracked
 * non-blocking stream for itself; none while no capture was ever begun. */
static int live_capture_open(device_ops_t *d)
{
    int pushed = enter_ctx(d);
    pthread_mutex_lock(&streams_lock);
    int status = PS_OK;
    if (captures_begun && !ps_test.ignore_captures) {
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        if (ps_real.cuThreadExchangeStreamCaptureMode)
            ps_real.cuThreadExchangeStreamCaptureMode(&mode);
        status = ps_real.cuStreamIsCapturing ? legacy_usable_locked() : PS_EUPSTREAM;
        for (size_t i = 0; i < stream_count && status == PS_OK; i++)
            if (streams[i].ctx == d->ctx && capturing(streams[i].stream))
                status = PS_EBUSY;
        if (ps_real.cuThreadExchangeStreamCaptureMode)
            ps_real.cuThreadExchangeStreamCaptureMode(&mode);
    }
    pthread_mutex_unlock(&streams_lock);
    leave_ctx(pushed);
    return status;
}

int ps_gpu_ops_cuda_give_back_enter(ps_gpu_ops_t *gpu)
{
    device_ops_t *d = gpu->ctx;
    pthread_rwlock_rdlock(&give_back_lock);
    int status = PS_EUPSTREAM; /* a dead context: nothing to give back */
    if (gate_enter(d)) {
        status = live_capture_open(d);
        gate_leave(d);
    }
    if (status != PS_OK)
        pthread_rwlock_unlock(&give_back_lock);
    return status;
}

void ps_gpu_ops_cuda_give_back_leave(void) { pthread_rwlock_unlock(&give_back_lock); }

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
        pthread_mutex_lock(&streams_lock);
        status = legacy_usable_locked();
        if (status == PS_OK)
            status = fence_add(f, (CUstream)PS_STREAM_LEGACY);
        for (size_t i = 0; i < stream_count && status == PS_OK; i++) {
            if (streams[i].ctx != d->ctx)
                continue;
            status = capturing(streams[i].stream) ? PS_EUPSTREAM : fence_add(f, streams[i].stream);
        }
        pthread_mutex_unlock(&streams_lock);
    } else if (stream == 0 || stream == PS_STREAM_LEGACY) {
        pthread_mutex_lock(&streams_lock);
        status = legacy_usable_locked();
        if (status == PS_OK)
            status = fence_add(f, (CUstream)stream);
        pthread_mutex_unlock(&streams_lock);
    } else {
        status = capturing((CUstream)stream) ? PS_EUPSTREAM : fence_add(f, (CUstream)stream);
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

static int live_fence_query(void *vctx, ps_fence_t *f)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    int status = PS_OK;
    for (int i = 0; i < f->count && status == PS_OK; i++)
        status = status_of(ps_real.cuEventQuery(f->events[i]));
    leave_ctx(pushed);
    return status;
}

static int live_fence_wait(void *vctx, ps_fence_t *f)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    int status = PS_OK;
    for (int i = 0; i < f->count && status == PS_OK; i++)
        status = status_of(ps_real.cuEventSynchronize(f->events[i]));
    leave_ctx(pushed);
    return status;
}

static int live_stream_wait_fence(void *vctx, ps_stream_t stream, ps_fence_t *f)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    int status = PS_OK;
    for (int i = 0; i < f->count && status == PS_OK; i++)
        status = status_of(ps_real.cuStreamWaitEvent((CUstream)stream, f->events[i], 0));
    leave_ctx(pushed);
    return status;
}

/* ---- barrier (4. above) --------------------------------------------------------------- */
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

static int live_barrier(void *vctx)
{
    device_ops_t *d = vctx;
    if (d->skip_barrier) { /* the negative control of the GPU hazard tests: must be caught. */
        /* Numbered like a real barrier, so blocks it "releases" carry a
         * generation that barrier_passed answers "not yet" for: with the
         * number left at 0 they read as idle now and remap unmapped memory
         * under running kernels (an illegal address instead of the wrong
         * bytes the control must report; GPU suite, H100, 2026-11-23). */
        atomic_fetch_add_explicit(&d->barriers, 1, memory_order_acq_rel);
        return PS_OK;
    }
    if (!ps_real.cuStreamIsCapturing)
        return PS_EUNSUPPORTED;
    int pushed = enter_ctx(d);
    pthread_mutex_lock(&streams_lock);
    bool check_captures = captures_begun != 0 && !ps_test.ignore_captures; /* none ever begun: none is open (the gate holds this lock) */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (check_captures && ps_real.cuThreadExchangeStreamCaptureMode)
        ps_real.cuThreadExchangeStreamCaptureMode(&mode);
    int status = PS_OK;
    if (check_captures) {
        status = legacy_usable_locked();
        for (size_t i = 0; i < stream_count && status == PS_OK; i++)
            if (streams[i].ctx == d->ctx && capturing(streams[i].stream))
                status = PS_EBUSY;
    }
    /* E of this barrier: its slot of the ring (barrier_passed asks it) */
    uint64_t number = atomic_load_explicit(&d->barriers, memory_order_relaxed) + 1;
    CUevent *slot = &d->barrier_events[number % PS_BARRIER_RING];
    if (status == PS_OK && !*slot && ps_real.cuEventCreate(slot, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        *slot = NULL;
        status = PS_EUPSTREAM;
    }
    /* b: every non-blocking stream's work so far joins the legacy stream */
    for (size_t i = 0; i < stream_count && status == PS_OK && !d->no_join; i++) {
        tracked_stream_t *t = &streams[i];
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
    }
    /* c: E after everything issued so far */
    if (status == PS_OK && ps_real.cuEventRecord(*slot, (CUstream)PS_STREAM_LEGACY) != CUDA_SUCCESS)
        status = PS_EUPSTREAM;
    if (status == PS_OK)
        d->barrier_event = *slot;
    /* d: everything issued from now on, after E */
    for (size_t i = 0; i < stream_count && status == PS_OK; i++)
        if (streams[i].ctx == d->ctx &&
            ps_real.cuStreamWaitEvent(streams[i].stream, d->barrier_event, 0) != CUDA_SUCCESS)
            status = PS_EUPSTREAM;
    if (status == PS_OK) {
        d->barrier_recorded = 1;
        atomic_store_explicit(&d->barriers, number, memory_order_release);
    }
    if (check_captures && ps_real.cuThreadExchangeStreamCaptureMode)
        ps_real.cuThreadExchangeStreamCaptureMode(&mode);
    pthread_mutex_unlock(&streams_lock);
    leave_ctx(pushed);
    return status;
}

/* Waits on the host until barrier `generation` has passed (4. e): a
 * cuEventSynchronize of its E, or of the oldest remembered E for an older
 * barrier (it completes later: never too early). The slot is read under
 * streams_lock and waited on outside it (a wait may take the GPU's whole
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
    pthread_mutex_lock(&streams_lock);
    uint64_t newest = atomic_load_explicit(&d->barriers, memory_order_relaxed);
    CUevent e = NULL;
    if (generation <= newest) {
        if (newest - generation >= PS_BARRIER_RING)
            generation = newest - PS_BARRIER_RING + 1;
        e = d->barrier_events[generation % PS_BARRIER_RING];
    }
    pthread_mutex_unlock(&streams_lock);
    int status = e ? status_of(ps_real.cuEventSynchronize(e)) : PS_EINVAL;
    leave_ctx(pushed);
    return status;
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
    pthread_mutex_lock(&streams_lock);
    uint64_t newest = atomic_load_explicit(&d->barriers, memory_order_relaxed);
    int status = PS_EINVAL; /* a barrier never issued */
    if (generation <= newest) {
        if (newest - generation >= PS_BARRIER_RING)
            generation = newest - PS_BARRIER_RING + 1;
        CUevent e = d->barrier_events[generation % PS_BARRIER_RING];
        status = e ? status_of(ps_real.cuEventQuery(e)) : PS_EUPSTREAM;
    }
    pthread_mutex_unlock(&streams_lock);
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

static int live_copy_to_host(void *vctx, void *dst, const void *src, size_t bytes, ps_stream_t stream)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    CUresult r = stream == PS_STREAM_NONE ? ps_real.cuCtxSynchronize() : ps_real.cuStreamSynchronize((CUstream)stream);
    if (r == CUDA_SUCCESS)
        r = ps_real.cuMemcpyDtoH_v2(dst, (CUdeviceptr)(uintptr_t)src, bytes);
    leave_ctx(pushed);
    return status_of(r);
}

static int live_device_synchronize(void *vctx)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    CUresult r = ps_real.cuCtxSynchronize();
    leave_ctx(pushed);
    return status_of(r);
}

/* ---- the gate (10. above): every entry of the table, around its live_ body ---- */
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
        pthread_mutex_lock(&streams_lock);
        device_tables[device] = d;
        pthread_mutex_unlock(&streams_lock);
    }
    *out = &d->ops;
    return PS_OK;
}

/* ---- peer access (5. of gpu_ops_cuda_vm.c) --------------------------------------------- */
uint64_t ps_gpu_ops_cuda_peers_of(int device)
{
    if (device < 0 || device >= PS_MAX_DEVICES)
        return 0;
    pthread_mutex_lock(&streams_lock);
    uint64_t peers = peer_access[device];
    pthread_mutex_unlock(&streams_lock);
    return peers;
}

device_ops_t *ps_gpu_ops_cuda_grant_peer(int owner, int peer)
{
    pthread_mutex_lock(&streams_lock);
    peer_access[owner] |= 1ull << peer;
    device_ops_t *d = device_tables[owner];
    pthread_mutex_unlock(&streams_lock);
    return d;
}

/* ---- context lifecycle: a context died (reset, last release, destroy) ----------- */
void ps_gpu_ops_cuda_forget_context(CUcontext ctx)
{
    /* its streams died with it: no fence may be recorded on them, and their
     * handles may come back for new streams */
    pthread_mutex_lock(&streams_lock);
    for (size_t i = 0; i < stream_count;)
        if (streams[i].ctx == ctx)
            streams[i] = streams[--stream_count];
        else
            i++;
    pthread_mutex_unlock(&streams_lock);
}

/* Closes the table's gate (10. above): returns once no call is inside it;
 * later calls wait until ps_gpu_ops_cuda_open. The caller may then destroy
 * the context, and must mark the table dead before it opens the gate if
 * the context died. It must not call the table meanwhile. */
void ps_gpu_ops_cuda_close(ps_gpu_ops_t *ops)
{
    device_ops_t *d = (device_ops_t *)ops;
    pthread_rwlock_wrlock(&d->gate);
    pthread_mutex_lock(&streams_lock);
    d->closing = 1;
    pthread_mutex_unlock(&streams_lock);
}

/* Opens it again: streams created meanwhile wait for the last barrier now
 * if the context lives (a dead one's streams went with it). */
void ps_gpu_ops_cuda_open(ps_gpu_ops_t *ops)
{
    device_ops_t *d = (device_ops_t *)ops;
    pthread_mutex_lock(&streams_lock);
    d->closing = 0;
    for (size_t i = 0; i < stream_count; i++)
        if (streams[i].owes_wait && streams[i].ctx == d->ctx) {
            streams[i].owes_wait = false;
            if (!is_dead(d) && d->barrier_recorded)
                ps_real.cuStreamWaitEvent(streams[i].stream, d->barrier_event, 0);
        }
    pthread_mutex_unlock(&streams_lock);
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
    pthread_mutex_lock(&streams_lock);
    d->barrier_recorded = 0;
    d->barrier_event = NULL;
    memset(d->barrier_events, 0, sizeof d->barrier_events); /* gone with the context */
    for (int i = 0; i < PS_MAX_DEVICES; i++)
        if (device_tables[i] == d)
            device_tables[i] = NULL;
    pthread_mutex_unlock(&streams_lock);
}
