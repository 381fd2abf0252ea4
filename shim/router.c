/* The router: the one place both doors end in.
 *
 * 1. Lazy init on the first intercepted call (never in a constructor):
 *    load libcuda, load and validate the config, register the exit report
 *    and fork handlers. A bad config stops the program (on_error=exit) or
 *    turns the shim into a passthrough (on_error=passthrough).
 * 2. Allocation: the current context decides the device. If no context is
 *    current and the call came through the runtime door, we let the real
 *    runtime create it exactly as it would have (real cudaFree(NULL)), so
 *    the program's later runtime calls see the same primary context. Only
 *    primary contexts are served; another context passes through. The
 *    device's stack is built on first use, with its context current.
 *    A thread-local cache maps the last context to its device.
 * 3. Every pointer handed out is recorded in the registry with its size,
 *    stream and door; a free looks it up (no context query), removes it
 *    atomically and gives it back to the device's stack.
 * 4. A pointer not in the registry is forwarded to the real free — unless
 *    it lies inside memory the shim took from CUDA: then it is a double
 *    free or an interior pointer, answered with "invalid value" and the
 *    pool untouched (forwarding it could free a whole slab).
 * 5. Counters are per thread (no shared cache line on the hot path) and
 *    summed at exit; byte counters and timing only when stats are on.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/adaptors.h"
#include "../core/resource.h"
#include "poolshim.h"
#include "shim.h"
#include "stats.h"

atomic_int ps_active;
const ps_global_config_t *ps_global;
int ps_disabled_early; /* POOLSHIM_DISABLE=1 seen by the constructor */

static ps_config_t *config;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static ps_global_config_t passthrough_global; /* used when the config failed */

ps_device_state_t ps_devices[PS_MAX_DEVICES];
static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;

static PS_TLS CUcontext tls_ctx;                /* last context seen on this thread */
static PS_TLS ps_device_state_t *tls_device;    /* its device state (NULL: pass through) */

int ps_trace_lookups; /* POOLSHIM_TRACE_LOOKUPS=1: print every cu* name looked up */

__attribute__((constructor)) static void read_disable_flag(void)
{
    const char *v = getenv("POOLSHIM_DISABLE");
    ps_disabled_early = v && *v && strcmp(v, "0") != 0;
    v = getenv("POOLSHIM_TRACE_LOOKUPS");
    ps_trace_lookups = v && *v && strcmp(v, "0") != 0;
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&devices_lock);
    ps_registry_atfork_prepare();
}
static void atfork_parent(void)
{
    ps_registry_atfork_parent();
    pthread_mutex_unlock(&devices_lock);
}
static void atfork_child(void)
{
    /* (init_done stays: the child inherits the parent's initialised state) */
    ps_registry_atfork_child();
    pthread_mutex_init(&devices_lock, NULL);
    ps_stats_atfork_child();
    /* CUDA cannot be used in the child of a process that initialised it:
     * if we built a stack, the child's calls pass straight through. */
    for (int d = 0; d < PS_MAX_DEVICES; d++)
        if (atomic_load(&ps_devices[d].state) != PS_DEVICE_UNBUILT) {
            atomic_store(&ps_active, 0);
            /* the parent's stacks are not ours: another thread may have held
             * one of their locks at the fork, and their figures are the
             * parent's to report */
            ps_stats_forget_at_exit();
            break;
        }
    tls_ctx = NULL;
    tls_device = NULL;
}

static void init_once_body(void)
{
    ps_global = &passthrough_global;
    if (ps_disabled_early) {
        atomic_store(&ps_active, 0);
        return;
    }
    if (ps_real_load_driver() != PS_OK) {
        atomic_store(&ps_active, 0);
        return;
    }
    int rc = ps_config_load(NULL, &config);
    if (rc != PS_OK) {
        ps_config_print_errors(config, stderr);
        const ps_global_config_t *g = config ? ps_config_global(config) : NULL;
        if (!g || g->on_error == PS_ON_ERROR_EXIT) {
            ps_error("invalid configuration: stopping before the first allocation "
                     "(set POOLSHIM_ON_ERROR=passthrough to run without the pool instead)");
            _exit(1); /* not exit(): other threads may be inside CUDA, and atexit handlers would race them */
        }
        ps_warning("invalid configuration: on_error=passthrough, running without the pool");
        atomic_store(&ps_active, 0);
        return;
    }
    ps_global = ps_config_global(config);
    ps_verbosity = ps_global->verbosity;
    if (ps_global->disable) {
        atomic_store(&ps_active, 0);
        return;
    }
    ps_stats_init(ps_global->stats != PS_STATS_OFF);
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    atexit(ps_stats_report_at_exit);
    ps_info("active (pid %d): free_sync=%s, stats=%s", (int)getpid(),
            ps_global->free_sync == PS_FREE_SYNC_EVENT    ? "event"
            : ps_global->free_sync == PS_FREE_SYNC_DEVICE ? "device"
                                                          : "none",
            ps_global->stats == PS_STATS_OFF ? "off" : ps_global->stats == PS_STATS_TEXT ? "text" : "json");
    atomic_store(&ps_active, 1);
}

static atomic_int init_done; /* 1 once init_once_body has run (hot-path shortcut) */

int ps_shim_ensure_init(void)
{
    if (PS_LIKELY(atomic_load_explicit(&init_done, memory_order_acquire)))
        return atomic_load_explicit(&ps_active, memory_order_relaxed);
    pthread_once(&init_once, init_once_body);
    atomic_store_explicit(&init_done, 1, memory_order_release);
    return atomic_load_explicit(&ps_active, memory_order_relaxed);
}

/* Builds the stack of device `d` (devices_lock held). */
static void build_device(ps_device_state_t *dev, int d)
{
    CUcontext primary = NULL;
    if (ps_real.cuDevicePrimaryCtxRetain(&primary, d) != CUDA_SUCCESS || !primary) {
        ps_warning("device %d: cannot retain its primary context: passing its calls through", d);
        atomic_store(&dev->state, PS_DEVICE_FAILED);
        return;
    }
    dev->ctx = primary;
    dev->device = d;
    if (ps_gpu_ops_cuda_create(d, primary, &dev->gpu) != PS_OK) {
        atomic_store(&dev->state, PS_DEVICE_FAILED);
        return;
    }
    int pushed = 0;
    CUcontext cur = NULL;
    ps_real.cuCtxGetCurrent(&cur);
    if (cur != primary)
        pushed = ps_real.cuCtxPushCurrent_v2(primary) == CUDA_SUCCESS;
    ps_in_shim++;
    int rc = ps_config_build_stack(config, d, dev->gpu, &dev->stack);
    ps_in_shim--;
    if (pushed) {
        CUcontext popped;
        ps_real.cuCtxPopCurrent_v2(&popped);
    }
    if (rc != PS_OK) {
        ps_error("device %d: cannot build its resource stack (%s): passing its calls through", d,
                 ps_status_name(rc));
        atomic_store(&dev->state, PS_DEVICE_FAILED);
        return;
    }
    ps_info("device %d: stack ready (%s)", d, dev->stack->top->name);
    atomic_store_explicit(&dev->state, PS_DEVICE_READY, memory_order_release);
}

/* Makes a context current the way the runtime would on its first call. */
static void runtime_lazy_init(void)
{
    ps_cudaFree_fn real_free = PS_REAL_RT(cudaFree);
    ps_in_shim++;
    if (real_free) {
        real_free(NULL); /* the runtime's own lazy init: primary context of its current device */
    } else if (ps_real.cuInit && ps_real.cuInit(0) == CUDA_SUCCESS) {
        CUcontext primary = NULL; /* no runtime loaded: do what it would for device 0 */
        if (ps_real.cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS)
            ps_real.cuCtxSetCurrent(primary);
    }
    ps_in_shim--;
}

ps_device_state_t *ps_current_device(int door)
{
    CUcontext ctx = NULL;
    if (ps_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) {
        if (door != PS_DOOR_RUNTIME)
            return NULL; /* the driver would fail too: let it say so */
        runtime_lazy_init();
        ctx = NULL;
        if (ps_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
            return NULL;
    }
    if (PS_LIKELY(ctx == tls_ctx))
        return tls_device;
    CUdevice d = -1;
    if (ps_real.cuCtxGetDevice(&d) != CUDA_SUCCESS || d < 0 || d >= PS_MAX_DEVICES)
        return NULL;
    ps_device_state_t *dev = &ps_devices[d];
    if (atomic_load_explicit(&dev->state, memory_order_acquire) == PS_DEVICE_UNBUILT) {
        pthread_mutex_lock(&devices_lock);
        if (atomic_load(&dev->state) == PS_DEVICE_UNBUILT)
            build_device(dev, d);
        pthread_mutex_unlock(&devices_lock);
    }
    ps_device_state_t *result = NULL;
    if (atomic_load_explicit(&dev->state, memory_order_acquire) == PS_DEVICE_READY) {
        if (dev->ctx == ctx)
            result = dev;
        else if (!dev->warned_foreign_ctx) {
            dev->warned_foreign_ctx = 1;
            ps_warning("device %d: a context other than the primary one is current: "
                       "its allocations pass through to CUDA",
                       d);
        }
    }
    tls_ctx = ctx;
    tls_device = result;
    return result;
}

ps_route_t ps_route_allocate(int call, int door, size_t size, ps_stream_t stream, void **out,
                             int *status)
{
    if (PS_UNLIKELY(!ps_shim_ensure_init()))
        return PS_ROUTE_PASSTHROUGH;
    ps_device_state_t *dev = ps_current_device(door);
    if (!dev) {
        ps_stats_count_passthrough(-1);
        return PS_ROUTE_PASSTHROUGH;
    }
    int timed = ps_stats_enabled;
    uint64_t t0 = timed ? ps_now_ns() : 0;
    ps_allocation_t a = {.size = size, .stream = stream, .device = (int16_t)dev->device, .door = (uint8_t)door};
    void *p = NULL;
    int rc;
    ps_in_shim++;
    if (ps_global->direct_min_size && size >= ps_global->direct_min_size) {
        a.direct = 1;
        rc = dev->gpu->mem_alloc(dev->gpu->ctx, size, &p);
    } else {
        rc = ps_allocate(dev->stack->top, size, stream, &p);
    }
    ps_in_shim--;
    if (rc == PS_OK) {
        a.ptr = (uintptr_t)p;
        if (ps_registry_insert(&a) != PS_OK) {
            ps_in_shim++;
            if (a.direct)
                dev->gpu->mem_free(dev->gpu->ctx, p, size);
            else
                ps_deallocate(dev->stack->top, p, size, stream);
            ps_in_shim--;
            rc = PS_ENOMEM;
        } else {
            *out = p;
        }
    }
    ps_stats_count_allocate(dev->device, call, door, size, rc, timed ? ps_now_ns() - t0 : 0);
    *status = rc;
    return PS_ROUTE_DONE;
}

ps_route_t ps_route_free(int call, int door, void *ptr, ps_stream_t stream, int *status)
{
    if (!ptr || PS_UNLIKELY(!ps_shim_ensure_init()))
        return PS_ROUTE_PASSTHROUGH;
    int timed = ps_stats_enabled;
    uint64_t t0 = timed ? ps_now_ns() : 0;
    ps_allocation_t a;
    if (ps_registry_remove((uintptr_t)ptr, &a) != PS_OK) {
        if (!ps_slab_contains((uintptr_t)ptr)) {
            ps_stats_count_passthrough(-1);
            return PS_ROUTE_PASSTHROUGH;
        }
        ps_stats_count_invalid(call);
        *status = PS_EINVAL;
        return PS_ROUTE_DONE;
    }
    ps_device_state_t *dev = &ps_devices[a.device];
    int rc;
    ps_in_shim++;
    if (a.direct)
        rc = dev->gpu->mem_free(dev->gpu->ctx, ptr, a.size);
    else
        rc = ps_deallocate(dev->stack->top, ptr, a.size, stream);
    ps_in_shim--;
    if (rc != PS_OK && !a.direct) {
        /* the stack refused it: keep the registry as it was */
        ps_registry_insert(&a);
        ps_stats_count_invalid(call);
        rc = PS_EINVAL;
    }
    ps_stats_count_free(a.device, call, door, a.size, timed ? ps_now_ns() - t0 : 0);
    *status = rc;
    return PS_ROUTE_DONE;
}

void ps_route_meminfo(size_t *free_bytes)
{
    if (!ps_shim_ensure_init() || ps_global->meminfo != PS_MEMINFO_POOL)
        return;
    ps_device_state_t *dev = ps_current_device(PS_DOOR_DRIVER);
    if (!dev)
        return;
    ps_resource_info_t info = {0};
    ps_query(dev->stack->top, &info);
    *free_bytes += (size_t)(info.bytes_free + info.bytes_pending);
}

bool ps_stream_is_capturing(CUstream stream, bool per_thread)
{
    ps_cuStreamIsCapturing_fn f = per_thread && ps_real.cuStreamIsCapturing_ptsz
                                      ? ps_real.cuStreamIsCapturing_ptsz
                                      : ps_real.cuStreamIsCapturing;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (f && f(stream, &st) == CUDA_SUCCESS)
        return st != CU_STREAM_CAPTURE_STATUS_NONE;
    return false;
}

/* ---- the public API (shim/poolshim.h) ---------------------------------------------------- */
PS_EXPORT int poolshim_active(void) { return ps_shim_ensure_init(); }

PS_EXPORT int poolshim_allocate(void **ptr, size_t size, uintptr_t stream)
{
    int status = PS_EUNSUPPORTED;
    if (!ptr)
        return PS_EINVAL;
    if (ps_route_allocate(PS_CALL_CUDA_MALLOC, PS_DOOR_RUNTIME, size, (ps_stream_t)stream, ptr,
                          &status) == PS_ROUTE_PASSTHROUGH)
        return PS_EUNSUPPORTED;
    return status;
}

PS_EXPORT int poolshim_deallocate(void *ptr, uintptr_t stream)
{
    int status = PS_EINVAL;
    if (ps_route_free(PS_CALL_CUDA_FREE, PS_DOOR_RUNTIME, ptr, (ps_stream_t)stream, &status) ==
        PS_ROUTE_PASSTHROUGH)
        return PS_EINVAL;
    return status;
}

PS_EXPORT int poolshim_flush(void)
{
    int rc = PS_OK;
    for (int d = 0; d < PS_MAX_DEVICES; d++) {
        ps_device_state_t *dev = &ps_devices[d];
        if (atomic_load(&dev->state) == PS_DEVICE_READY && dev->stack->log)
            if (ps_log_flush(dev->stack->log) != PS_OK)
                rc = PS_EUPSTREAM;
    }
    return rc;
}
