/* What the GPU-ops table over the driver shares between its three files:
 * shim/gpu_ops_cuda.c (memory, fences, barriers, the gate, the table's
 * life), shim/gpu_ops_cuda_streams.c (stream tracking, captures, peer
 * access: the streams lock) and shim/gpu_ops_cuda_vm.c (its virtual-memory
 * entries).
 * Numbers (1.-10.) refer to the algorithm at the top of gpu_ops_cuda.c. */
#ifndef PS_GPU_OPS_CUDA_INTERNAL_H
#define PS_GPU_OPS_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "../core/ptr_map.h"
#include "../core/resource.h"
#include "gpu_ops_cuda.h"
#include "nvtx.h"
#include "real.h"
#include "registry.h"
#include "stats.h"

typedef struct device_ops {
    ps_gpu_ops_t ops;          /* the table handed to core/ (must be first) */
    CUcontext ctx;             /* the device's primary context */
    CUdevice device;           /* its device */
    pthread_mutex_t lock;      /* guards free_fences */
    ps_fence_t *free_fences;   /* recycled fences */
    CUevent barrier_event;     /* E of the last barrier: one of barrier_events (guarded by streams_lock) */
    CUevent barrier_events[PS_BARRIER_RING]; /* E of barrier n is [n % PS_BARRIER_RING], for barrier_passed
                                                (created lazily; guarded by streams_lock) */
    int barrier_recorded;      /* E was recorded at least once (guarded by streams_lock) */
    size_t vm_granularity;     /* recommended mapping granularity (0: no virtual memory) */
    size_t host_vm_granularity; /* recommended granularity of host-located pieces (0: none; 9.) */
    int device_count;          /* devices of the process (host pieces grant each of them access) */
    uint64_t reach_peers;      /* bit P: device P (not this one) can reach this device's memory (probed once) */
    _Atomic uint64_t copy_peers; /* bit P: a device of reach_peers in use in the process: every mapping grants it
                                  access, as copies of cudaMalloc memory work from any device (5.) */
    _Atomic uint64_t pool_shared; /* the devices the device's memory pool was opened to (the async upstream) */
    int skip_peer_grant;       /* test only (POOLSHIM_TEST_SKIP_PEER_GRANT=1): mappings name this device only */
    _Atomic uint64_t host_access_refused; /* bit D: device D refused access to a host piece (asked no more) */
    atomic_int shareable;      /* 1: vm_map creates memory exportable as POSIX file descriptors (8.) */
    int skip_barrier;          /* test only (POOLSHIM_TEST_SKIP_BARRIER=1): barriers order nothing */
    int assume_idle;           /* test only (POOLSHIM_TEST_ASSUME_IDLE=1): every barrier has passed */
    int wait_returns;          /* test only (POOLSHIM_TEST_WAIT_RETURNS=1): barrier_wait returns at once */
    int no_join;               /* measurement only (POOLSHIM_TEST_BARRIER_NO_JOIN=1): a barrier does not make the
                                  legacy stream wait for busy non-blocking streams (what the join costs DDP) */
    atomic_int dead;           /* 1: the context died (reset): every entry answers as a dead table (10.) */
    pthread_rwlock_t gate;     /* read by every call into CUDA, written while the context may die (10.) */
    int closing;               /* the gate is closed (guarded by streams_lock) */
    pthread_mutex_t vm_lock;   /* guards the three maps below */
    ps_ptr_map_t vm_handles;   /* mapped address -> its physical allocation handle */
    ps_ptr_map_t vm_sizes;     /* mapped address -> bytes mapped there, | HOST_PIECE for a host piece (9.) */
    ps_ptr_map_t vm_ranges;    /* reserved range -> its size (all, for release before a reset) */
    _Atomic uint64_t barriers; /* barriers issued = the newest barrier's number (written under streams_lock) */
    atomic_uint barrier_joins; /* busy streams the newest barrier joined: non-blocking ones waited for, blocking
                                  ones found busy (4. b) */
    _Atomic uint64_t barriers_quiet; /* barriers that joined none (statistics) */
} device_ops_t;

static inline bool is_dead(void *vctx)
{
    return atomic_load_explicit(&((device_ops_t *)vctx)->dead, memory_order_acquire) != 0;
}

/* Enters the table's gate (10.): false, without entering, once the
 * context died. Every true is paired with a gate_leave. */
static inline bool gate_enter(void *vctx)
{
    device_ops_t *d = vctx;
    if (is_dead(d))
        return false; /* (final: no lock needed) */
    pthread_rwlock_rdlock(&d->gate);
    if (!atomic_load_explicit(&d->dead, memory_order_relaxed))
        return true;
    pthread_rwlock_unlock(&d->gate);
    return false;
}
static inline void gate_leave(void *vctx) { pthread_rwlock_unlock(&((device_ops_t *)vctx)->gate); }

/* The table's context made current for one call (1.): enter_ctx answers
 * whether it pushed, leave_ctx pops then. */
static inline bool enter_ctx(device_ops_t *d)
{
    CUcontext cur = NULL;
    ps_real.cuCtxGetCurrent(&cur);
    if (cur == d->ctx)
        return 0;
    return ps_real.cuCtxPushCurrent_v2(d->ctx) == CUDA_SUCCESS;
}
static inline void leave_ctx(int pushed)
{
    if (pushed) {
        CUcontext popped;
        ps_real.cuCtxPopCurrent_v2(&popped);
    }
}

/* A driver result as a core/ status. */
static inline int status_of(CUresult r)
{
    if (r == CUDA_SUCCESS)
        return PS_OK;
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return PS_ENOMEM;
    if (r == CUDA_ERROR_NOT_READY)
        return PS_ENOTREADY;
    return PS_EUPSTREAM;
}

/* The gate around each entry (10.): GATED(name, parameters, arguments,
 * answer of a dead table) makes ops_name over live_name. */
#define GATED(name, params, args, dead_answer)                                         \
    static int ops_##name params                                                       \
    {                                                                                  \
        if (!gate_enter(vctx))                                                         \
            return dead_answer;                                                        \
        int status_ = live_##name args;                                                \
        gate_leave(vctx);                                                              \
        return status_;                                                                \
    }
#define GATED_VOID(name, params, args)                                                 \
    static void ops_##name params                                                      \
    {                                                                                  \
        if (gate_enter(vctx)) {                                                        \
            live_##name args;                                                          \
            gate_leave(vctx);                                                          \
        }                                                                              \
    }

/* GATED with the entry's host time added to `kind` (above) while statistics are on. */
#define GATED_TIMED(name, kind, params, args, dead_answer)                             \
    static int ops_##name params                                                       \
    {                                                                                  \
        if (!gate_enter(vctx))                                                         \
            return dead_answer;                                                        \
        uint64_t start_ = ps_stats_enabled ? ps_now_ns() : 0;                          \
        int status_ = live_##name args;                                                \
        if (start_)                                                                    \
            ps_stats_count_cuda_time(((device_ops_t *)vctx)->device, kind, ps_now_ns() - start_); \
        gate_leave(vctx);                                                              \
        return status_;                                                                \
    }

/* ---- gpu_ops_cuda_streams.c: streams, captures and what the streams lock guards ---- */
typedef struct tracked_stream {
    CUstream stream; /* a live non-blocking stream */
    CUcontext ctx;   /* its context */
    CUevent event;   /* barrier step b's event on it (created lazily), or NULL */
    bool owes_wait;  /* created while its table's gate was closed: waits for the last barrier when it opens (10.) */
} tracked_stream_t;
/* Guards the stream list, the tables list, captures and barriers' events. */
extern pthread_mutex_t ps_cuda_streams_lock;
extern tracked_stream_t *ps_cuda_streams; /* live non-blocking streams (streams lock) */
extern size_t ps_cuda_stream_count;       /* how many (streams lock) */
/* A live blocking stream (created without CU_STREAM_NON_BLOCKING). */
typedef struct blocking_stream {
    CUstream stream;
    CUcontext ctx;
} blocking_stream_t;
extern blocking_stream_t *ps_cuda_blocking; /* live blocking streams (streams lock) */
extern size_t ps_cuda_blocking_count;       /* how many (streams lock) */
extern device_ops_t *ps_cuda_device_tables[PS_MAX_DEVICES]; /* every table made, for barrier waits of new streams */
/* Stream captures ever begun in this process (every cuStreamBeginCapture*
 * passes the gate). While it is 0 no capture can be open, and a barrier
 * skips the capture checks. Written under the streams lock; read under it. */
extern uint64_t ps_cuda_captures_begun;
/* Is `s` being captured? */
bool ps_cuda_capturing(CUstream s);
/* PS_OK when the legacy stream may be recorded on; PS_EBUSY while a
 * blocking stream captures; PS_EUPSTREAM when CUDA cannot say. Streams lock held. */
int ps_cuda_legacy_usable_locked(void);
/* Whether a stream capture is open in d's context: PS_OK none, PS_EBUSY one
 * is, PS_EUPSTREAM CUDA cannot say. The checks of a barrier (4. a of
 * gpu_ops_cuda.c): the legacy stream answers for the blocking streams, each
 * tracked non-blocking stream for itself; none while no capture was ever
 * begun. Streams lock held (no capture can begin meanwhile). A capture on a
 * thread's per-thread default stream cannot be seen from another thread. */
int ps_cuda_capture_open_locked(const device_ops_t *d);
/* Its scan alone, for a caller whose thread is already in relaxed capture
 * mode and that checked that a capture was ever begun (the barrier). */
int ps_cuda_capture_scan_locked(const device_ops_t *d);

/* Peer access the program granted (gpu_ops_cuda_streams.c keeps it, under
 * the streams lock): bit D of the answer = device D may access `device`'s
 * memory; grant_peer records that `peer` may access `owner`'s and answers
 * owner's table (NULL: none made yet). */
uint64_t ps_gpu_ops_cuda_peers_of(int device);
/* ps_gpu_ops_cuda_device_in_use (gpu_ops_cuda.h) when device's table was
 * just made (gpu_ops_cuda.c). */
void ps_gpu_ops_cuda_table_in_use(int device);
/* The async upstream's pool opened to `peers` (gpu_ops_cuda_vm.c; context entered). */
void ps_gpu_ops_cuda_open_pool_to(device_ops_t *d, uint64_t peers);
device_ops_t *ps_gpu_ops_cuda_grant_peer(int owner, int peer);

/* gpu_ops_cuda_vm.c: probes what the device offers (virtual memory, pinned
 * host pieces, export as file descriptors) and fills those entries of d's
 * table; called once by ps_gpu_ops_cuda_create. */
void ps_gpu_ops_cuda_vm_attach(device_ops_t *d);

#endif
