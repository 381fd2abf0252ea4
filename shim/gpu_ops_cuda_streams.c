/* The GPU-ops table's streams and captures (the table is shim/gpu_ops_cuda.c;
 * numbers refer to the algorithm at its top; shared state is declared in
 * shim/gpu_ops_cuda_internal.h).
 *
 * 1. Stream tracking: every live non-blocking stream, with its context, from
 *    the stream hooks (the router passes them on). A new one waits for the
 *    last barrier of its context (4. d), or owes that wait while the
 *    context's gate is closed (10.). Blocking streams are listed apart: the
 *    legacy stream orders them, and a barrier only asks whether each is busy.
 * 2. The capture gate: every real cuStreamBeginCapture* runs under the
 *    streams lock (and the give-back lock, to write), so no capture begins
 *    half-way through a barrier or a give-back; global-mode captures are
 *    remembered, and "unsafe" calls are refused while one is open, as CUDA
 *    refuses them (4.).
 * 3. Whether the legacy stream may be recorded on (no blocking stream
 *    captures), and the give-back gate of the out-of-memory retry (11.).
 * 4. Peer access granted by the program, and forgetting the streams of a
 *    context that died. Everything here is guarded by the streams lock.
 */
#include <pthread.h>
#include <stdlib.h>

#include "gpu_ops_cuda_internal.h"
#include "test_switches.h"

/* ---- stream tracking -------------------------------------------------------- */
pthread_mutex_t ps_cuda_streams_lock = PTHREAD_MUTEX_INITIALIZER;
tracked_stream_t *ps_cuda_streams;   /* live non-blocking streams */
size_t ps_cuda_stream_count;
static size_t stream_capacity;
device_ops_t *ps_cuda_device_tables[PS_MAX_DEVICES]; /* every table made, for barrier waits of new streams */
/* Peer access granted by the program: bit D of peer_access[P] = device D
 * may access device P's memory (guarded by ps_cuda_streams_lock). */
static uint64_t peer_access[PS_MAX_DEVICES];

/* A new non-blocking stream of `ctx` waits for the last barrier of that
 * context (it would otherwise run beside work issued before it); while the
 * context's table is closed (10. of gpu_ops_cuda.c) it owes that wait instead.
 * ps_cuda_streams_lock held. */
static void wait_last_barrier_locked(tracked_stream_t *s)
{
    for (int d = 0; d < PS_MAX_DEVICES; d++) {
        device_ops_t *t = ps_cuda_device_tables[d];
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
 * ps_cuda_streams_lock for writers; read under it by ops_barrier. */
uint64_t ps_cuda_captures_begun;

/* Held to read by an out-of-memory give-back from its capture check to the
 * end of its trim (which may synchronize the device), to write by every
 * cuStreamBeginCapture* before ps_cuda_streams_lock: no capture begins in between
 * (11. of gpu_ops_cuda.c). Taken before ps_cuda_streams_lock, never under it. */
static pthread_rwlock_t give_back_lock = PTHREAD_RWLOCK_INITIALIZER;

int ps_gpu_ops_cuda_capture_gate(void)
{
    pthread_rwlock_wrlock(&give_back_lock);
    int r = pthread_mutex_lock(&ps_cuda_streams_lock);
    ps_cuda_captures_begun++;
    return r;
}

void ps_gpu_ops_cuda_capture_gate_end(void)
{
    pthread_mutex_unlock(&ps_cuda_streams_lock);
    pthread_rwlock_unlock(&give_back_lock);
}

/* Global-mode captures that began on a named stream and may still be open
 * (guarded by ps_cuda_streams_lock; a stream leaves when cuStreamIsCapturing says
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

/* ps_gpu_ops_cuda_unsafe_call_prohibited (gpu_ops_cuda.h) once a global capture
 * may be open. */
CUresult ps_gpu_ops_cuda_unsafe_call_check(void)
{
    pthread_mutex_lock(&ps_cuda_streams_lock);
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
    pthread_mutex_unlock(&ps_cuda_streams_lock);
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

/* Live blocking streams (1.): the barrier's E on the legacy stream joins
 * each one that is busy without a call of its own, so step b only asks
 * whether it is, to count the join (barrier_joined). cuBLASLt makes one
 * (cuStreamCreate, flags 0) in every PyTorch process. */
blocking_stream_t *ps_cuda_blocking;
size_t ps_cuda_blocking_count;
static size_t blocking_capacity;

/* Tracks blocking stream `stream` of `ctx`. ps_cuda_streams_lock held. */
static void track_blocking_locked(CUstream stream, CUcontext ctx)
{
    for (size_t i = 0; i < ps_cuda_blocking_count; i++)
        if (ps_cuda_blocking[i].stream == stream) { /* a handle reused after a destroy we missed */
            ps_cuda_blocking[i].ctx = ctx;
            return;
        }
    if (ps_cuda_blocking_count == blocking_capacity) {
        size_t cap = blocking_capacity ? blocking_capacity * 2 : 8;
        blocking_stream_t *grown = realloc(ps_cuda_blocking, cap * sizeof *grown);
        if (!grown) {
            ps_warning("out of host memory tracking a stream");
            return;
        }
        ps_cuda_blocking = grown;
        blocking_capacity = cap;
    }
    ps_cuda_blocking[ps_cuda_blocking_count++] = (blocking_stream_t){stream, ctx};
}

static CUcontext context_of(CUstream stream)
{
    CUcontext ctx = NULL;
    if (ps_real.cuStreamGetCtx)
        ps_real.cuStreamGetCtx(stream, &ctx);
    else
        ps_real.cuCtxGetCurrent(&ctx);
    return ctx;
}

void ps_gpu_ops_cuda_stream_created(CUstream stream, unsigned int flags)
{
    if (!stream || ps_real_load_driver() != PS_OK)
        return;
    CUcontext ctx = context_of(stream);
    pthread_mutex_lock(&ps_cuda_streams_lock);
    if (!(flags & CU_STREAM_NON_BLOCKING)) {
        track_blocking_locked(stream, ctx);
        pthread_mutex_unlock(&ps_cuda_streams_lock);
        return;
    }
    for (size_t i = 0; i < ps_cuda_stream_count; i++)
        if (ps_cuda_streams[i].stream == stream) { /* handle reused after a destroy we missed, or both doors */
            ps_cuda_streams[i].ctx = ctx;
            ps_cuda_streams[i].owes_wait = false;
            wait_last_barrier_locked(&ps_cuda_streams[i]);
            pthread_mutex_unlock(&ps_cuda_streams_lock);
            return;
        }
    if (ps_cuda_stream_count == stream_capacity) {
        size_t cap = stream_capacity ? stream_capacity * 2 : 32;
        tracked_stream_t *grown = realloc(ps_cuda_streams, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&ps_cuda_streams_lock);
            ps_warning("out of host memory tracking a stream");
            return;
        }
        ps_cuda_streams = grown;
        stream_capacity = cap;
    }
    ps_cuda_streams[ps_cuda_stream_count] = (tracked_stream_t){stream, ctx, NULL, false};
    wait_last_barrier_locked(&ps_cuda_streams[ps_cuda_stream_count++]);
    pthread_mutex_unlock(&ps_cuda_streams_lock);
}

void ps_gpu_ops_cuda_stream_destroyed(CUstream stream)
{
    pthread_mutex_lock(&ps_cuda_streams_lock);
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
    for (size_t i = 0; i < ps_cuda_stream_count; i++)
        if (ps_cuda_streams[i].stream == stream) {
            if (ps_cuda_streams[i].event)
                ps_real.cuEventDestroy_v2(ps_cuda_streams[i].event);
            ps_cuda_streams[i] = ps_cuda_streams[--ps_cuda_stream_count];
            break;
        }
    for (size_t i = 0; i < ps_cuda_blocking_count; i++)
        if (ps_cuda_blocking[i].stream == stream) {
            ps_cuda_blocking[i] = ps_cuda_blocking[--ps_cuda_blocking_count];
            break;
        }
    pthread_mutex_unlock(&ps_cuda_streams_lock);
}

void ps_gpu_ops_cuda_atfork_prepare(void) { pthread_mutex_lock(&ps_cuda_streams_lock); }
void ps_gpu_ops_cuda_atfork_parent(void) { pthread_mutex_unlock(&ps_cuda_streams_lock); }
void ps_gpu_ops_cuda_atfork_child(void)
{
    pthread_mutex_init(&ps_cuda_streams_lock, NULL);
    pthread_rwlock_init(&give_back_lock, NULL); /* (a give-back of the parent's may have held it) */
}

bool ps_cuda_capturing(CUstream s)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (ps_real.cuStreamIsCapturing && ps_real.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS)
        return st != CU_STREAM_CAPTURE_STATUS_NONE;
    return false;
}

/* PS_OK when the legacy stream may be recorded on; PS_EBUSY while a
 * blocking stream captures (recording there would invalidate that capture:
 * cudaErrorStreamCaptureImplicit), whatever thread captures. ps_cuda_streams_lock
 * held (no capture can begin meanwhile). */
int ps_cuda_legacy_usable_locked(void)
{
    if (!ps_cuda_captures_begun || ps_test.ignore_captures)
        return PS_OK;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = ps_real.cuStreamIsCapturing((CUstream)PS_STREAM_LEGACY, &st);
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || (r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE))
        return PS_EBUSY;
    return r == CUDA_SUCCESS ? PS_OK : PS_EUPSTREAM;
}

bool ps_gpu_ops_cuda_legacy_enter(void)
{
    pthread_mutex_lock(&ps_cuda_streams_lock);
    if (ps_cuda_legacy_usable_locked() == PS_OK)
        return true;
    pthread_mutex_unlock(&ps_cuda_streams_lock);
    return false;
}

void ps_gpu_ops_cuda_legacy_leave(void) { pthread_mutex_unlock(&ps_cuda_streams_lock); }

/* ---- the out-of-memory give-back (11. of gpu_ops_cuda.c) ------------------------------------------ */
int ps_cuda_capture_scan_locked(const device_ops_t *d)
{
    int status = ps_real.cuStreamIsCapturing ? ps_cuda_legacy_usable_locked() : PS_EUPSTREAM;
    for (size_t i = 0; i < ps_cuda_stream_count && status == PS_OK; i++)
        if (ps_cuda_streams[i].ctx == d->ctx && ps_cuda_capturing(ps_cuda_streams[i].stream))
            status = PS_EBUSY;
    return status;
}

int ps_cuda_capture_open_locked(const device_ops_t *d)
{
    if (!ps_cuda_captures_begun || ps_test.ignore_captures)
        return PS_OK;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (ps_real.cuThreadExchangeStreamCaptureMode)
        ps_real.cuThreadExchangeStreamCaptureMode(&mode);
    int status = ps_cuda_capture_scan_locked(d);
    if (ps_real.cuThreadExchangeStreamCaptureMode)
        ps_real.cuThreadExchangeStreamCaptureMode(&mode);
    return status;
}

/* Whether a stream capture is open in d's context (11. of gpu_ops_cuda.c). */
static int live_capture_open(device_ops_t *d)
{
    int pushed = enter_ctx(d);
    pthread_mutex_lock(&ps_cuda_streams_lock);
    int status = ps_cuda_capture_open_locked(d);
    pthread_mutex_unlock(&ps_cuda_streams_lock);
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

/* ---- peer access (5. of gpu_ops_cuda_vm.c) --------------------------------------------- */
uint64_t ps_gpu_ops_cuda_peers_of(int device)
{
    if (device < 0 || device >= PS_MAX_DEVICES)
        return 0;
    pthread_mutex_lock(&ps_cuda_streams_lock);
    uint64_t peers = peer_access[device];
    pthread_mutex_unlock(&ps_cuda_streams_lock);
    return peers;
}

device_ops_t *ps_gpu_ops_cuda_grant_peer(int owner, int peer)
{
    pthread_mutex_lock(&ps_cuda_streams_lock);
    peer_access[owner] |= 1ull << peer;
    device_ops_t *d = ps_cuda_device_tables[owner];
    pthread_mutex_unlock(&ps_cuda_streams_lock);
    return d;
}

/* ---- context lifecycle: a context died (reset, last release, destroy) ----------- */
void ps_gpu_ops_cuda_forget_context(CUcontext ctx)
{
    /* its streams died with it: no fence may be recorded on them, and their
     * handles may come back for new streams */
    pthread_mutex_lock(&ps_cuda_streams_lock);
    for (size_t i = 0; i < ps_cuda_stream_count;)
        if (ps_cuda_streams[i].ctx == ctx)
            ps_cuda_streams[i] = ps_cuda_streams[--ps_cuda_stream_count];
        else
            i++;
    for (size_t i = 0; i < ps_cuda_blocking_count;)
        if (ps_cuda_blocking[i].ctx == ctx)
            ps_cuda_blocking[i] = ps_cuda_blocking[--ps_cuda_blocking_count];
        else
            i++;
    pthread_mutex_unlock(&ps_cuda_streams_lock);
}
