/* The device lifecycle: a device's stack is built, dropped when its
 * context dies, and left alone in a forked child; the process's exit.
 *
 * 1. Build: under the devices lock, with the device's primary context
 *    current, on its first allocation (ps_current_device: the router's
 *    calls) or when the program makes the context live
 *    (ps_context_retained): GPU-ops table, stack from the configuration,
 *    pinned host pool; the first build starts the give-back thread and
 *    registers exit_begins. Only primary contexts are served; another
 *    context passes through, with one warning per context.
 * 2. Which device a call is for: the current context, with this thread's
 *    last answer kept (ps_devices_current, inline in lifecycle.h: one CUDA
 *    call and two loads on the hot path); ps_lifecycle_epoch moves on
 *    whenever a context dies, and every thread looks its answer up again.
 * 3. Context death (the entry points of hooks_context.c end here): around
 *    a call that may destroy a served context, its GPU-ops table's gate is
 *    closed; then one sequence, context_call_done: the gate opens (the
 *    table made dead first if the context died), the stack is dropped
 *    (drop_device: registry entries and slabs forgotten, what the modules
 *    above keep per device forgotten through ps_lifecycle_on_drop, the
 *    figures kept for the exit report, the stack kept on a list never
 *    freed) and the shim's reference on the context settled.
 * 4. Exit: exit_begins (registered by the first build, after the CUDA
 *    runtime's teardown, so it runs before it) stops routing and the
 *    give-back thread; no CUDA call is started afterwards.
 * 5. fork(): the devices lock is taken first (then the streams lock, then
 *    the registry's); a child of a process that built stacks passes
 *    everything through and writes no report.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/adaptors.h"
#include "../core/pool.h"
#include "../core/upstream.h"
#include "give_back.h"
#include "gpu_ops_cuda.h"
#include "ipc.h"
#include "lifecycle.h"
#include "nvtx.h"
#include "real.h"
#include "registry.h"
#include "stats.h"
#include "test_switches.h"

PS_TLS last_context_t ps_lifecycle_last; /* this thread's last answer of ps_current_device (lifecycle.h) */
/* +1 whenever a context died (any device, any kind): every thread's cached
 * context -> device answer is then looked up again (handles are reused). */
atomic_uint ps_lifecycle_epoch;

/* What a module above keeps per device and forgets when its context dies
 * (ps_lifecycle_on_drop: the router's pool access and buffer ids). */
static void (*forget_on_drop)(int device);

void ps_lifecycle_on_drop(void (*forget)(int device)) { forget_on_drop = forget; }

/* Dropped stacks and tables: never freed (a thread may still be inside one),
 * but kept reachable (leak checkers) and for nothing else. */
typedef struct retired {
    struct retired *next; /* older ones */
    ps_stack_t *stack;    /* the dead stack */
    ps_gpu_ops_t *gpu;    /* its dead GPU-ops table */
    ps_stack_t *host_stack; /* its dead pinned host stack, or NULL */
} retired_t;
static retired_t *retired_stacks; /* devices_lock */

/* Non-primary contexts we already warned about (once per context). */
#define WARNED_MAX 256
static CUcontext warned_ctx[WARNED_MAX]; /* devices_lock */
static size_t warned_count;              /* devices_lock */

/* Lock order: ps_devices_lock, then the streams lock (drop_device takes it
 * under ps_devices_lock), then the registry's. */
void ps_lifecycle_atfork_prepare(void)
{
    ps_devices_lock();
    ps_gpu_ops_cuda_atfork_prepare();
    ps_registry_atfork_prepare();
}
void ps_lifecycle_atfork_parent(void)
{
    ps_registry_atfork_parent();
    ps_gpu_ops_cuda_atfork_parent();
    ps_devices_unlock();
}
void ps_lifecycle_atfork_child(void)
{
    /* (initialised stays: the child inherits the parent's initialised state) */
    ps_registry_atfork_child();
    ps_gpu_ops_cuda_atfork_child();
    ps_ipc_atfork_child();
    ps_devices_lock_reinit();
    ps_stats_atfork_child();
    ps_give_back_atfork_child();
    /* CUDA cannot be used in the child of a process that initialised it:
     * if we built a stack, the child's calls pass straight through. The
     * parent's stacks are not ours: another thread may have held one of
     * their locks at the fork, and their figures are the parent's to
     * report. So each device is marked failed (the stream and context
     * hooks then leave its stack alone: a cuStreamDestroy in the child
     * waited forever for a pool lock), and the exit report is skipped. */
    int had_stacks = 0;
    for (int d = 0; d < PS_MAX_DEVICES; d++)
        if (atomic_load(&ps_device(d)->state) != PS_DEVICE_UNBUILT) {
            atomic_store(&ps_device(d)->state, PS_DEVICE_FAILED);
            had_stacks = 1;
        }
    if (had_stacks) {
        ps_process_set_active(0);
        ps_stats_forget_at_exit();
    }
    ps_lifecycle_last = (last_context_t){0};
}

/* Builds device d's pinned host stack from [host] (ps_devices_lock held): a
 * pool with free_sync event and a growth bound over a host upstream whose
 * slabs are cuMemHostAlloc(PORTABLE | DEVICEMAP) memory of the primary
 * context, under the adaptors [host] asks for (limit, track, stats, log;
 * ps_config_build_host_stack). Without it (disabled, or it cannot be made)
 * pinned memory passes through. POOLSHIM_TEST_SKIP_HOST_WAIT=1 (tests
 * only) reuses freed blocks at once: the negative control of
 * tests/gpu/pinned.cu. */
static void build_host_pool(ps_device_state_t *dev, ps_gpu_ops_t *gpu)
{
    const ps_host_config_t *h = &ps_global_config()->host;
    if (!h->enable || !gpu->host_alloc)
        return;
    ps_pool_options_t o;
    ps_host_pool_options(h, &o);
    if (ps_test.skip_host_wait) {
        ps_warning("POOLSHIM_TEST_SKIP_HOST_WAIT=1: freed pinned blocks are reused at once, while copies may "
                   "still read them (a test switch, never for real work)");
        o.free_sync = PS_FREE_SYNC_NONE;
    }
    ps_stack_t *stack = NULL;
    int rc = ps_config_build_host_stack(ps_process_config(), dev->device, gpu, PS_HOST_POOL_FLAGS,
                                        &o, &stack);
    if (rc != PS_OK) {
        ps_warning("device %d: cannot build the pinned host pool (%s): pinned memory passes through",
                   dev->device, ps_status_name(rc));
        return;
    }
    dev->host_stack = stack;
    __atomic_store_n(&dev->host_pool, stack->top, __ATOMIC_RELEASE);
}

/* Runs at exit() before the CUDA runtime's teardown (see 6. above). */
static void exit_begins(void)
{
    ps_process_begin_exit();
    ps_give_back_stop(); /* (a tick in progress ends first: it touches no stack once exiting) */
}

/* A device whose stack cannot be built: global.on_error decides, as for a
 * bad configuration (exit: stop before the allocation; passthrough: the
 * device's calls go to CUDA). */
static void stack_failed(ps_device_state_t *dev, int d)
{
    if (!ps_global_config() || ps_global_config()->on_error == PS_ON_ERROR_EXIT) {
        ps_error("device %d: no resource stack: stopping before the allocation "
                 "(set POOLSHIM_ON_ERROR=passthrough to run without the pool instead)", d);
        _exit(1); /* as for a bad configuration: other threads may be inside CUDA */
    }
    atomic_store(&dev->state, PS_DEVICE_FAILED);
}

/* Builds the stack of device `d` (ps_devices_lock held). */
static void build_device(ps_device_state_t *dev, int d)
{
    static int exit_hook_registered; /* ps_devices_lock */
    uint64_t t0 = ps_now_ns(), t_ops = t0, t_stack = t0, t_pinned = t0; /* the verbose line's phases */
    if (!exit_hook_registered) {
        atexit(exit_begins);
        exit_hook_registered = 1;
    }
    CUcontext primary = NULL;
    if (ps_real.cuDevicePrimaryCtxRetain(&primary, d) != CUDA_SUCCESS || !primary) {
        ps_error("device %d: cannot retain its primary context%s", d,
                 ps_global_config() && ps_global_config()->on_error == PS_ON_ERROR_PASSTHROUGH
                     ? ": on_error=passthrough, passing its calls through"
                     : "");
        stack_failed(dev, d);
        return;
    }
    __atomic_store_n(&dev->ctx, primary, __ATOMIC_RELAXED); /* (read by threads racing a reset) */
    if (dev->device != d)
        dev->device = d; /* written once: racing readers see the same value */
    dev->holds_ref = 1;
    dev->has_ctx_id = ps_real.cuCtxGetId && ps_real.cuCtxGetId(primary, &dev->ctx_id) == CUDA_SUCCESS;
    ps_gpu_ops_t *gpu = NULL;
    if (ps_gpu_ops_cuda_create(d, primary, &gpu) != PS_OK) {
        stack_failed(dev, d);
        return;
    }
    if (ps_global_config()->debug.nvtx_ranges)
        ps_nvtx_ranges_wrap(gpu);
    if (ps_test.return_lent) {
        ps_pool_test_return_lent_at_once(1);
        ps_warning("POOLSHIM_TEST_RETURN_LENT=1: remap unmaps lent pieces' old addresses at once, under kernels "
                   "that may still use them (a test switch, never for real work)");
    }
    __atomic_store_n(&dev->gpu, gpu, __ATOMIC_RELEASE);
    t_ops = ps_now_ns();
    int pushed = 0;
    CUcontext cur = NULL;
    ps_real.cuCtxGetCurrent(&cur);
    if (cur != primary)
        pushed = ps_real.cuCtxPushCurrent_v2(primary) == CUDA_SUCCESS;
    ps_stack_t *stack = NULL;
    ps_in_shim++;
    int rc = ps_config_build_stack(ps_process_config(), d, gpu, &stack);
    ps_in_shim--;
    if (pushed) {
        CUcontext popped;
        ps_real.cuCtxPopCurrent_v2(&popped);
    }
    if (rc != PS_OK) {
        ps_error("device %d: cannot build its resource stack (%s)%s", d, ps_status_name(rc),
                 ps_global_config() && ps_global_config()->on_error == PS_ON_ERROR_PASSTHROUGH
                     ? ": on_error=passthrough, passing its calls through"
                     : "");
        stack_failed(dev, d);
        return;
    }
    __atomic_store_n(&dev->stack, stack, __ATOMIC_RELEASE);
    t_stack = ps_now_ns();
    build_host_pool(dev, gpu);
    t_pinned = ps_now_ns();
    atomic_store_explicit(&dev->state, PS_DEVICE_READY, memory_order_release);
    ps_give_back_start(); /* (once per process: the decay and the neighbours' requests) */
    uint64_t t_end = ps_now_ns();
    /* what a fresh process's first allocation pays on top of its own work */
    ps_info("device %d: stack ready (%s)%s in %.0f us: context and GPU-ops table %.0f, stack %.0f, pinned pool %.0f, "
            "give-back thread %.0f",
            d, stack->top->name, dev->resets ? " again, after a context reset" : "", (t_end - t0) / 1e3,
            (t_ops - t0) / 1e3, (t_stack - t_ops) / 1e3, (t_pinned - t_stack) / 1e3, (t_end - t_pinned) / 1e3);
}

/* A primary context was made live by the program, its runtime or a library
 * (hooks_context.c): build the device's stack now, so that a fresh
 * process's first cudaMalloc does not pay for the GPU-ops table, the
 * stack, the pinned pool and the give-back thread; the context's creation,
 * which this joins, takes far longer. Nothing is built for a
 * context that is not live (the program's own retain made it so), when the
 * shim is off, exiting, or the device failed before. The retain may come
 * from inside the shim (its cudaFree(NULL) passthrough, look_up_device's
 * runtime_lazy_init), so the devices lock is only tried: when another
 * thread holds it, the device's first allocation builds the stack as
 * before (as for a program whose context was made before the shim loaded). */
void ps_context_retained(CUdevice d)
{
    if (d < 0 || d >= PS_MAX_DEVICES || ps_process_exiting() || !ps_process_active())
        return;
    ps_device_state_t *dev = ps_device(d);
    if (atomic_load_explicit(&dev->state, memory_order_acquire) != PS_DEVICE_UNBUILT)
        return;
    if (!ps_devices_trylock())
        return;
    if (atomic_load(&dev->state) == PS_DEVICE_UNBUILT)
        build_device(dev, d);
    ps_devices_unlock();
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

/* Is device d's primary context active (retained by someone)? Unknown: yes. */
static bool primary_active(int d)
{
    unsigned flags = 0;
    int active = 1;
    if (ps_real.cuDevicePrimaryCtxGetState && ps_real.cuDevicePrimaryCtxGetState(d, &flags, &active) != CUDA_SUCCESS)
        return true;
    return active != 0;
}

/* Warns once per context that allocations made in it pass through. */
static void warn_foreign_ctx(CUcontext ctx, int d)
{
    ps_devices_lock();
    size_t i = 0;
    while (i < warned_count && warned_ctx[i] != ctx)
        i++;
    int fresh = i == warned_count;
    if (fresh && warned_count < WARNED_MAX)
        warned_ctx[warned_count++] = ctx;
    ps_devices_unlock();
    if (fresh)
        ps_warning("device %d: context %p is not the device's primary context (cuCtxCreate): "
                   "its allocations pass through to CUDA",
                   d, (void *)ctx);
}

/* ps_current_device when this thread's last answer does not hold: `ctx`
 * is what cuCtxGetCurrent said (`got` its result). Looks the context up,
 * builds the device's stack on first use, and remembers the answer. */
PS_COLD ps_device_state_t *ps_devices_look_up(int door, CUresult got, CUcontext ctx)
{
    if (got != CUDA_SUCCESS || !ctx) {
        if (door != PS_DOOR_RUNTIME)
            return NULL; /* the driver would fail too: let it say so */
        runtime_lazy_init();
        ctx = NULL;
        if (ps_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
            return NULL;
    }
    unsigned epoch = atomic_load_explicit(&ps_lifecycle_epoch, memory_order_acquire);
    if (ctx == ps_lifecycle_last.ctx && epoch == ps_lifecycle_last.epoch)
        return ps_lifecycle_last.device;
    CUdevice d = -1;
    if (ps_real.cuCtxGetDevice(&d) != CUDA_SUCCESS) {
        /* after a reset the thread's current context may be the destroyed
         * primary: the runtime makes it live again on its next call */
        if (door != PS_DOOR_RUNTIME)
            return NULL;
        runtime_lazy_init();
        if (ps_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx || ps_real.cuCtxGetDevice(&d) != CUDA_SUCCESS)
            return NULL;
    }
    if (d < 0 || d >= PS_MAX_DEVICES)
        return NULL;
    ps_device_state_t *dev = ps_device(d);
    if (atomic_load_explicit(&dev->state, memory_order_acquire) == PS_DEVICE_UNBUILT) {
        /* never make a dead primary context live by ourselves: the runtime
         * does it on its own next call; a driver-API program must retain it */
        if (!primary_active(d)) {
            if (door != PS_DOOR_RUNTIME)
                return NULL;
            runtime_lazy_init();
            if (!primary_active(d))
                return NULL;
        }
        ps_devices_lock();
        if (atomic_load(&dev->state) == PS_DEVICE_UNBUILT)
            build_device(dev, d);
        ps_devices_unlock();
    }
    ps_device_state_t *result = NULL;
    if (atomic_load_explicit(&dev->state, memory_order_acquire) == PS_DEVICE_READY) {
        if (__atomic_load_n(&dev->ctx, __ATOMIC_RELAXED) == ctx)
            result = dev;
        else
            warn_foreign_ctx(ctx, d);
    }
    ps_lifecycle_last = (last_context_t){ctx, result, epoch};
    return result;
}

ps_device_state_t *ps_current_device(int door) { return ps_devices_current(door); }

/* ---- context lifecycle -------------------------------------------------------------- */
/* Gives back the shim's reference on device d's primary context. */
static void release_ours(ps_device_state_t *dev)
{
    ps_cuDevicePrimaryCtxRelease_fn release =
        ps_real.cuDevicePrimaryCtxRelease_v2 ? ps_real.cuDevicePrimaryCtxRelease_v2 : ps_real.cuDevicePrimaryCtxRelease;
    if (dev->holds_ref && release)
        release(dev->device);
    dev->holds_ref = 0;
}

/* After dev's context died: made again, our old reference counts in the
 * new one (give it back); not active, it went with the old one. */
static void settle_ref(ps_device_state_t *dev)
{
    if (primary_active(dev->device))
        release_ours(dev);
    else
        dev->holds_ref = 0;
}

/* Adds the figures of a pool dropped with its context to the sum the
 * report keeps of them (dropped, dropped_host; peak: the larger). */
static void add_dropped(ps_resource_info_t *sum, const ps_resource_info_t *info)
{
    sum->bytes_reserved += info->bytes_reserved;
    sum->bytes_in_use += info->bytes_in_use;
    sum->bytes_pending += info->bytes_pending;
    sum->upstream_allocs += info->upstream_allocs;
    sum->upstream_frees += info->upstream_frees;
    sum->fences_recorded += info->fences_recorded;
    sum->fence_waits += info->fence_waits;
    sum->pending_waits += info->pending_waits;
    if (info->peak_bytes_reserved > sum->peak_bytes_reserved)
        sum->peak_bytes_reserved = info->peak_bytes_reserved;
}

/* Drops device d's stack: its context died. No CUDA call on anything of
 * it. Requires ps_devices_lock; the device must have been READY. */
static void drop_device(ps_device_state_t *dev, const char *api)
{
    int d = dev->device;
    ps_stack_t *stack = dev->stack;
    ps_gpu_ops_t *gpu = dev->gpu;
    atomic_store(&dev->state, PS_DEVICE_UNBUILT);
    ps_gpu_ops_cuda_mark_dead(gpu);
    ps_gpu_ops_cuda_forget_context(dev->ctx);
    atomic_fetch_add(&dev->generation, 1);
    atomic_fetch_add(&ps_lifecycle_epoch, 1);
    uint64_t count = 0, bytes = 0;
    ps_registry_drop_device(d, &count, &bytes);
    ps_slab_drop_device(d);
    if (forget_on_drop)
        forget_on_drop(d); /* its pool's access, the buffer ids (router.c) */
    if (ps_nvtx_on)
        ps_nvtx_drop_device(d);
    ps_resource_info_t info = {0};
    ps_query(stack->top, &info);
    if (stack->log)
        ps_log_flush(stack->log); /* (a file write) the new stack's log starts the file again */
    add_dropped(&dev->dropped, &info);
    ps_resource_t *host_pool = dev->host_pool;
    ps_stack_t *host_stack = dev->host_stack;
    if (host_pool) {
        if (host_stack->log)
            ps_log_flush(host_stack->log);
        ps_resource_info_t hinfo = {0};
        ps_query(host_pool, &hinfo);
        add_dropped(&dev->dropped_host, &hinfo);
        __atomic_store_n(&dev->host_pool, NULL, __ATOMIC_RELEASE);
        dev->host_stack = NULL;
    }
    dev->dropped_allocations += count;
    dev->dropped_bytes += bytes;
    dev->resets++;
    ps_stats_count_dropped(d, bytes);
    retired_t *r = malloc(sizeof *r);
    if (r) { /* without it the dead stack is simply leaked, which is harmless */
        *r = (retired_t){retired_stacks, stack, gpu, host_stack};
        retired_stacks = r;
    }
    char b1[32], b2[32];
    ps_info("device %d: its context died (%s): dropped its stack, %llu live allocations (%s) and %s reserved "
            "went with it; the next allocation builds a new stack",
            d, api, (unsigned long long)count, ps_format_bytes(b1, sizeof b1, bytes),
            ps_format_bytes(b2, sizeof b2, info.bytes_reserved));
}

/* Opens the gate of dev's table (closed around a call that may destroy its
 * context), marking the table dead first if the context died. */
static void open_gate(ps_device_state_t *dev, bool died)
{
    if (died)
        ps_gpu_ops_cuda_mark_dead(dev->gpu);
    ps_gpu_ops_cuda_open(dev->gpu);
}

/* What becomes of the shim's reference on a primary context that died. */
enum { REF_AS_IS, REF_SETTLE, REF_RELEASE, REF_GONE };

/* The end of a call that may have destroyed dev's context: the one
 * sequence of a context death. The gate of its table opens (`gated`: it
 * was closed around the call), the table marked dead first when the
 * context `died`; then the stack is dropped and the shim's reference is
 * settled (settle_ref), given back (release_ours: a reset does not release
 * it), gone with the context (REF_GONE), or left as the caller made it. */
static void context_call_done(ps_device_state_t *dev, bool gated, bool died, const char *api, int ref)
{
    if (gated)
        open_gate(dev, died);
    if (!died)
        return;
    drop_device(dev, api);
    if (ref == REF_SETTLE)
        settle_ref(dev);
    else if (ref == REF_RELEASE)
        release_ours(dev);
    else if (ref == REF_GONE)
        dev->holds_ref = 0;
}

/* Is the context dev's stack was built in still alive and the same one? */
static bool context_alive(ps_device_state_t *dev)
{
    if (!primary_active(dev->device))
        return false;
    unsigned long long id = 0;
    if (dev->has_ctx_id && (ps_real.cuCtxGetId(dev->ctx, &id) != CUDA_SUCCESS || id != dev->ctx_id))
        return false; /* destroyed and made again (same handle, new context) */
    return true;
}

/* The state of `device` for a context call, with ps_devices_lock taken;
 * NULL (no lock) for an ordinal beyond the devices the shim keeps: the
 * call then just passes. */
static ps_device_state_t *lock_device(CUdevice device)
{
    if (device < 0 || device >= PS_MAX_DEVICES)
        return NULL;
    ps_devices_lock();
    return ps_device(device);
}

CUresult ps_context_reset(CUdevice device, ps_cuDevicePrimaryCtxReset_fn real, const char *api)
{
    ps_device_state_t *dev = lock_device(device);
    if (!dev)
        return real(device);
    if (atomic_load(&dev->state) != PS_DEVICE_READY) { /* no stack: nothing of ours in the context */
        CUresult r = real(device);
        ps_devices_unlock();
        return r;
    }
    /* no new user of the stack while the context goes away: allocations on
     * this device wait for the lock, then build in the new context */
    atomic_store(&dev->state, PS_DEVICE_UNBUILT);
    atomic_fetch_add(&ps_lifecycle_epoch, 1); /* cached answers are looked up again */
    /* memory outlives the context: give it back while it lives (the stack
     * cannot be used afterwards, whatever the reset says): CUDA's memory
     * pools (the async upstream; through the table) */
    size_t released = 0;
    for (size_t i = 0; i < dev->stack->count; i++)
        released += ps_upstream_release_all(dev->stack->all[i]);
    if (released)
        dev->gpu->device_synchronize(dev->gpu->ctx);
    ps_gpu_ops_cuda_close(dev->gpu); /* no call of ours is inside the context while it dies */
    /* and virtual memory, of any pool of the stack however deep (direct
     * driver calls: no entry of the table maps or unmaps meanwhile) */
    bool released_vm = ps_gpu_ops_cuda_release_vm(dev->gpu) || released; /* given back: the stack must go */
    CUresult r = real(device);
    atomic_store(&dev->state, PS_DEVICE_READY);
    bool died = r == CUDA_SUCCESS || !context_alive(dev) || released_vm;
    /* "resetting the primary context does not release it": whoever retained
     * it releases its usage, which is safe after a reset */
    context_call_done(dev, true, died, api, REF_RELEASE);
    ps_devices_unlock();
    return r;
}

CUresult ps_context_release(CUdevice device, ps_cuDevicePrimaryCtxRelease_fn real, const char *api)
{
    ps_device_state_t *dev = lock_device(device);
    if (!dev)
        return real(device);
    /* the context may die in the call, or in our own release below: the
     * table's gate is closed meanwhile, and a death is acted on (the stack
     * dropped) once it opens again, the table marked dead before */
    bool ready = atomic_load(&dev->state) == PS_DEVICE_READY, died = false;
    if (ready)
        ps_gpu_ops_cuda_close(dev->gpu);
    CUresult r = real(device);
    if (r == CUDA_SUCCESS && ready && dev->holds_ref) {
        /* Was that the program's last reference? Ours keeps the context
         * alive, so let go of ours too and look: still active means someone
         * else holds it (take ours back); inactive means the context is gone
         * now, exactly as it would have been without us. */
        ps_cuDevicePrimaryCtxRelease_fn ours =
            ps_real.cuDevicePrimaryCtxRelease_v2 ? ps_real.cuDevicePrimaryCtxRelease_v2 : ps_real.cuDevicePrimaryCtxRelease;
        if (ours && ps_real.cuDevicePrimaryCtxGetState && ours(device) == CUDA_SUCCESS) {
            CUcontext again = NULL;
            dev->holds_ref = 0;
            if (primary_active(device) && ps_real.cuDevicePrimaryCtxRetain(&again, device) == CUDA_SUCCESS) {
                dev->holds_ref = 1;
                if (!context_alive(dev)) { /* a new context behind the same handle: ours is in it */
                    died = true;
                    release_ours(dev);
                }
            } else {
                died = true; /* our release destroyed it, as the program's would have */
            }
        }
    } else if (r == CUDA_SUCCESS && ready && !context_alive(dev)) {
        died = true;
        settle_ref(dev);
    }
    context_call_done(dev, ready, died, api, REF_AS_IS);
    ps_devices_unlock();
    return r;
}

CUresult ps_context_destroy(CUcontext ctx, ps_cuCtxDestroy_fn real, const char *api)
{
    ps_devices_lock();
    bool ours[PS_MAX_DEVICES] = {false}; /* devices whose stack lives in ctx: gates closed around the call */
    for (int d = 0; d < PS_MAX_DEVICES && ctx; d++)
        if (atomic_load(&ps_device(d)->state) == PS_DEVICE_READY && ps_device(d)->ctx == ctx) {
            ours[d] = true;
            ps_gpu_ops_cuda_close(ps_device(d)->gpu);
        }
    CUresult r = real(ctx);
    for (int d = 0; d < PS_MAX_DEVICES; d++)
        if (ours[d])
            context_call_done(ps_device(d), true, r == CUDA_SUCCESS, api, REF_GONE);
    if (r == CUDA_SUCCESS && ctx) {
        /* a non-primary context: its streams are gone, its handle may come back */
        ps_gpu_ops_cuda_forget_context(ctx);
        for (size_t i = 0; i < warned_count; i++)
            if (warned_ctx[i] == ctx) {
                warned_ctx[i] = warned_ctx[--warned_count];
                break;
            }
        atomic_fetch_add(&ps_lifecycle_epoch, 1);
    }
    ps_devices_unlock();
    return r;
}

CUresult ps_context_set_flags(CUdevice device, unsigned int flags, ps_cuDevicePrimaryCtxSetFlags_fn real,
                              const char *api)
{
    ps_device_state_t *dev = lock_device(device);
    if (!dev)
        return real(device, flags);
    bool ready = atomic_load(&dev->state) == PS_DEVICE_READY;
    if (ready)
        ps_gpu_ops_cuda_close(dev->gpu); /* a driver may make the context again (see ps_context_check) */
    CUresult r = real(device, flags);
    bool died = ready && r == CUDA_SUCCESS && !context_alive(dev);
    context_call_done(dev, ready, died, api, REF_SETTLE);
    ps_devices_unlock();
    return r;
}

void ps_context_check(const char *api)
{
    if (ps_real_load_driver() != PS_OK)
        return;
    ps_devices_lock();
    for (int d = 0; d < PS_MAX_DEVICES; d++) {
        ps_device_state_t *dev = ps_device(d);
        if (atomic_load(&dev->state) == PS_DEVICE_READY && !context_alive(dev))
            context_call_done(dev, false, true, api, REF_SETTLE);
    }
    ps_devices_unlock();
}
