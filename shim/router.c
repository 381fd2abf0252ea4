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
 *    atomically and gives it back to the device's stack. With debug.nvtx
 *    on, the block is shown to compute-sanitizer as an NVTX region from
 *    its registration to its free (nvtx.c).
 * 4. A pointer not in the registry is forwarded to the real free — unless
 *    it lies inside memory the shim took from CUDA: then it is a double
 *    free or an interior pointer, answered with "invalid value" and the
 *    pool untouched (forwarding it could free a whole slab).
 * 5. Counters are per thread (no shared cache line on the hot path) and
 *    summed at exit; byte counters and timing only when stats are on,
 *    timing for one call in 64 per thread and kind (stats.h).
 * 6. Exit: the first stack built registers exit_begins with atexit. The
 *    CUDA runtime registered its own teardown when it initialised, which
 *    came before (a context must exist for a stack to be built), so
 *    exit_begins runs first: from then on allocations pass through, a free
 *    of one of our blocks forgets it (the process ends with it), and no
 *    stack is touched, so the shim starts no CUDA call once the runtime
 *    may be gone. The exit report (registered at init, before the
 *    runtime's teardown, so it runs after) reads memory only. A call
 *    already inside the shim when exit() begins finishes as it started.
 * 7. Context lifecycle: when a device's primary context dies (reset, last
 *    release, recreated by new flags), its stack is dropped under the
 *    devices lock: the GPU-ops table's gate is closed around the real call
 *    (no call of ours inside the context while it dies: 10. of
 *    gpu_ops_cuda.c), the table is made dead before the gate opens (no CUDA
 *    call on the dead events, streams and memory), the registry entries and slabs of
 *    the device are forgotten, the stack is kept on a list that is never
 *    freed (another thread may still be inside it), and the device's
 *    generation and the global context epoch move on. The next allocation
 *    sees the epoch change, and builds a new stack in the new context.
 *    A free of a pointer from before finds no entry (or a stale
 *    generation) and goes to the real free, as natively.
 * 8. IPC: cudaIpcGetMemHandle of a live pooled block goes to ipc.c with
 *    the block and its device's GPU-ops table (a direct allocation or a
 *    pointer not ours passes through; memory that cannot be exported is
 *    refused with the reason); a free forgets the block's export while any
 *    is live; cudaIpcOpenMemHandle of a handle of ours is opened through
 *    the current device's table; cuMemGetAddressRange of an opened block
 *    answers for the block.
 * 9. Out-of-memory retry (global.oom_retry, on by default): memory a program
 *    frees stays in its device's pool, so an allocation that goes to CUDA
 *    beside the pool (cuMemCreate, cuMemAllocManaged, cuMemAllocPitch,
 *    cuMemAllocFromPoolAsync, arrays: hooks_driver.c) can run out of memory
 *    where natively it would not. When one does, its device's stack is
 *    trimmed (ps_trim: pending blocks waited for, free chunks given back,
 *    whole free pieces unmapped after a device synchronize: only memory the
 *    GPU is done with) and the call is made once more. Not while a stream
 *    capture is open on the device (the synchronize would invalidate it):
 *    then the call keeps CUDA's answer. No cost until CUDA says "out of
 *    memory"; counted per device in the statistics.
 * 10. Neighbours (global.neighbour_release, on by default): when a pooled
 *    or direct allocation still finds no memory after the pool's own
 *    give-back, or the retry of 9. has nothing to retry with, the other
 *    processes of this user under the shim on the same GPU are asked to
 *    give back their free memory (neighbours.c: at most
 *    global.neighbour_wait_ms), and the allocation is made once more if
 *    they gave any, or if another thread's give-back ended meanwhile. Asked
 *    from the failing thread, holding no lock of the shim; never inside it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/adaptors.h"
#include "../core/pool.h"
#include "../core/ptr_map.h"
#include "../core/resource.h"
#include "../core/upstream.h"
#include "give_back.h"
#include "neighbours.h"
#include "poolshim.h"
#include "shim.h"
#include "stats.h"
#include "test_switches.h"

atomic_int ps_active;
atomic_int ps_exiting;
const ps_global_config_t *ps_global;
int ps_disabled_early; /* POOLSHIM_DISABLE=1 seen by the constructor */

static ps_config_t *config;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static ps_global_config_t passthrough_global; /* used when the config failed */

ps_device_state_t ps_devices[PS_MAX_DEVICES];
static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;

/* This thread's last answer of ps_current_device: one struct, so the hot
 * path's check reads one cache line of thread-local storage. */
typedef struct last_context {
    CUcontext ctx;             /* last context seen on this thread (NULL: none yet) */
    ps_device_state_t *device; /* its device state (NULL: pass through) */
    unsigned epoch;            /* context_epoch when ctx was looked up */
} last_context_t;
static PS_TLS last_context_t tls_last;
/* +1 whenever a context died (any device, any kind): every thread's cached
 * context -> device answer is then looked up again (handles are reused). */
static atomic_uint context_epoch;

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

int ps_trace_lookups; /* POOLSHIM_TRACE_LOOKUPS=1: print every cu* name looked up */

__attribute__((constructor)) static void read_disable_flag(void)
{
    /* the parser the configuration uses; an invalid POOLSHIM_DISABLE is
     * not a disable: ps_config_load reports it (once) and on_error applies */
    (void)ps_env_bool("POOLSHIM_DISABLE", 0, &ps_disabled_early);
    (void)ps_env_bool("POOLSHIM_TRACE_LOOKUPS", 1, &ps_trace_lookups);
}

/* Lock order: devices_lock, then the streams lock (drop_device takes it
 * under devices_lock), then the registry's. */
static void atfork_prepare(void)
{
    pthread_mutex_lock(&devices_lock);
    ps_gpu_ops_cuda_atfork_prepare();
    ps_registry_atfork_prepare();
}
static void atfork_parent(void)
{
    ps_registry_atfork_parent();
    ps_gpu_ops_cuda_atfork_parent();
    pthread_mutex_unlock(&devices_lock);
}
static void atfork_child(void)
{
    /* (ps_init_done stays: the child inherits the parent's initialised state) */
    ps_registry_atfork_child();
    ps_gpu_ops_cuda_atfork_child();
    ps_ipc_atfork_child();
    pthread_mutex_init(&devices_lock, NULL);
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
        if (atomic_load(&ps_devices[d].state) != PS_DEVICE_UNBUILT) {
            atomic_store(&ps_devices[d].state, PS_DEVICE_FAILED);
            had_stacks = 1;
        }
    if (had_stacks) {
        atomic_store(&ps_active, 0);
        ps_stats_forget_at_exit();
    }
    tls_last = (last_context_t){0};
}

/* global.direct_min_size, SIZE_MAX when off: one comparison per allocation. */
static size_t direct_min = SIZE_MAX;

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
    uint64_t t0 = ps_now_ns();
    int rc = ps_config_load(NULL, &config);
    ps_config_print_warnings(config, stderr); /* unknown POOLSHIM_* variables */
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
    if (ps_global->direct_min_size)
        direct_min = ps_global->direct_min_size;
    if (ps_global->disable) {
        atomic_store(&ps_active, 0);
        return;
    }
    ps_stats_init(ps_global->stats != PS_STATS_OFF);
    if (ps_global->debug.nvtx)
        ps_nvtx_enable();
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    atexit(ps_stats_report_at_exit);
    ps_info("active (pid %d, version %s): set up in %.0f us, free_sync=%s, stats=%s", (int)getpid(),
            poolshim_version(), (ps_now_ns() - t0) / 1e3,
            ps_global->free_sync == PS_FREE_SYNC_EVENT     ? "event"
            : ps_global->free_sync == PS_FREE_SYNC_DEVICE  ? "device"
            : ps_global->free_sync == PS_FREE_SYNC_BARRIER ? "barrier"
                                                           : "none",
            ps_global->stats == PS_STATS_OFF ? "off" : ps_global->stats == PS_STATS_TEXT ? "text" : "json");
    atomic_store(&ps_active, 1);
}

atomic_int ps_init_done; /* 1 once init_once_body has run (ps_shim_ensure_init's shortcut) */

/* ps_shim_ensure_init (shim.h) before the first initialisation finished. */
int ps_shim_init(void)
{
    pthread_once(&init_once, init_once_body);
    atomic_store_explicit(&ps_init_done, 1, memory_order_release);
    return atomic_load_explicit(&ps_active, memory_order_relaxed);
}

/* Builds device d's pinned host stack from [host] (devices_lock held): a
 * pool with free_sync event and a growth bound over a host upstream whose
 * slabs are cuMemHostAlloc(PORTABLE | DEVICEMAP) memory of the primary
 * context, under the adaptors [host] asks for (limit, track, stats, log;
 * ps_config_build_host_stack). Without it (disabled, or it cannot be made)
 * pinned memory passes through. POOLSHIM_TEST_SKIP_HOST_WAIT=1 (tests
 * only) reuses freed blocks at once: the negative control of
 * tests/gpu/pinned.cu. */
static void build_host_pool(ps_device_state_t *dev, ps_gpu_ops_t *gpu)
{
    const ps_host_config_t *h = &ps_global->host;
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
    int rc = ps_config_build_host_stack(config, dev->device, gpu, PS_HOST_POOL_FLAGS,
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
    atomic_store(&ps_exiting, 1);
    atomic_store(&ps_active, 0);
    ps_give_back_stop(); /* (a tick in progress ends first: it touches no stack after ps_exiting) */
}

/* A device whose stack cannot be built: global.on_error decides, as for a
 * bad configuration (exit: stop before the allocation; passthrough: the
 * device's calls go to CUDA). */
static void stack_failed(ps_device_state_t *dev, int d)
{
    if (!ps_global || ps_global->on_error == PS_ON_ERROR_EXIT) {
        ps_error("device %d: no resource stack: stopping before the allocation "
                 "(set POOLSHIM_ON_ERROR=passthrough to run without the pool instead)", d);
        _exit(1); /* as for a bad configuration: other threads may be inside CUDA */
    }
    atomic_store(&dev->state, PS_DEVICE_FAILED);
}

/* Builds the stack of device `d` (devices_lock held). */
static void build_device(ps_device_state_t *dev, int d)
{
    static int exit_hook_registered; /* devices_lock */
    uint64_t t0 = ps_now_ns(), t_ops = t0, t_stack = t0, t_pinned = t0; /* the verbose line's phases */
    if (!exit_hook_registered) {
        atexit(exit_begins);
        exit_hook_registered = 1;
    }
    CUcontext primary = NULL;
    if (ps_real.cuDevicePrimaryCtxRetain(&primary, d) != CUDA_SUCCESS || !primary) {
        ps_error("device %d: cannot retain its primary context%s", d,
                 ps_global && ps_global->on_error == PS_ON_ERROR_PASSTHROUGH
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
    if (ps_global->debug.nvtx_ranges)
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
    int rc = ps_config_build_stack(config, d, gpu, &stack);
    ps_in_shim--;
    if (pushed) {
        CUcontext popped;
        ps_real.cuCtxPopCurrent_v2(&popped);
    }
    if (rc != PS_OK) {
        ps_error("device %d: cannot build its resource stack (%s)%s", d, ps_status_name(rc),
                 ps_global && ps_global->on_error == PS_ON_ERROR_PASSTHROUGH
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
 * (hooks_context.c): build the device's stack now. A fresh process's first
 * cudaMalloc paid 0.3-0.6 ms for the configuration, the GPU-ops table, the
 * stack, the pinned pool and the give-back thread (H200, 2026-11-27: the
 * first 1 GiB took 0.59-0.82 ms against 0.15-0.21 natively); the context's
 * creation, which this joins, takes far longer. Nothing is built for a
 * context that is not live (the program's own retain made it so), when the
 * shim is off, exiting, or the device failed before. The retain may come
 * from inside the shim (its cudaFree(NULL) passthrough, look_up_device's
 * runtime_lazy_init), so the devices lock is only tried: when another
 * thread holds it, the device's first allocation builds the stack as
 * before (as for a program whose context was made before the shim loaded). */
void ps_context_retained(CUdevice d)
{
    if (d < 0 || d >= PS_MAX_DEVICES || atomic_load(&ps_exiting) || !ps_shim_ensure_init())
        return;
    ps_device_state_t *dev = &ps_devices[d];
    if (atomic_load_explicit(&dev->state, memory_order_acquire) != PS_DEVICE_UNBUILT)
        return;
    if (pthread_mutex_trylock(&devices_lock) != 0)
        return;
    if (atomic_load(&dev->state) == PS_DEVICE_UNBUILT)
        build_device(dev, d);
    pthread_mutex_unlock(&devices_lock);
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
    pthread_mutex_lock(&devices_lock);
    size_t i = 0;
    while (i < warned_count && warned_ctx[i] != ctx)
        i++;
    int fresh = i == warned_count;
    if (fresh && warned_count < WARNED_MAX)
        warned_ctx[warned_count++] = ctx;
    pthread_mutex_unlock(&devices_lock);
    if (fresh)
        ps_warning("device %d: context %p is not the device's primary context (cuCtxCreate): "
                   "its allocations pass through to CUDA",
                   d, (void *)ctx);
}

/* ps_current_device when this thread's last answer does not hold: `ctx`
 * is what cuCtxGetCurrent said (`got` its result). Looks the context up,
 * builds the device's stack on first use, and remembers the answer. */
static PS_COLD ps_device_state_t *look_up_device(int door, CUresult got, CUcontext ctx)
{
    if (got != CUDA_SUCCESS || !ctx) {
        if (door != PS_DOOR_RUNTIME)
            return NULL; /* the driver would fail too: let it say so */
        runtime_lazy_init();
        ctx = NULL;
        if (ps_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
            return NULL;
    }
    unsigned epoch = atomic_load_explicit(&context_epoch, memory_order_acquire);
    if (ctx == tls_last.ctx && epoch == tls_last.epoch)
        return tls_last.device;
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
    ps_device_state_t *dev = &ps_devices[d];
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
        pthread_mutex_lock(&devices_lock);
        if (atomic_load(&dev->state) == PS_DEVICE_UNBUILT)
            build_device(dev, d);
        pthread_mutex_unlock(&devices_lock);
    }
    ps_device_state_t *result = NULL;
    if (atomic_load_explicit(&dev->state, memory_order_acquire) == PS_DEVICE_READY) {
        if (__atomic_load_n(&dev->ctx, __ATOMIC_RELAXED) == ctx)
            result = dev;
        else
            warn_foreign_ctx(ctx, d);
    }
    tls_last = (last_context_t){ctx, result, epoch};
    return result;
}

/* The hot path of ps_current_device: the one CUDA call that says which
 * context is current (it can change under us in ways we do not see:
 * cudaSetDevice inside the runtime, cuCtxSetCurrent, push/pop), then this
 * thread's last answer if it is still good: same context, and no context
 * died since (context_epoch; a reset keeps the handle). */
static inline ps_device_state_t *current_device(int door)
{
    CUcontext ctx = NULL;
    CUresult got = ps_real.cuCtxGetCurrent(&ctx);
    if (PS_LIKELY(got == CUDA_SUCCESS && ctx && ctx == tls_last.ctx &&
                  atomic_load_explicit(&context_epoch, memory_order_acquire) == tls_last.epoch))
        return tls_last.device;
    return look_up_device(door, got, ctx);
}

ps_device_state_t *ps_current_device(int door) { return current_device(door); }

/* Buffer ids of pooled blocks (CU_POINTER_ATTRIBUTE_BUFFER_ID: unique per
 * allocation over the process's life; CUDA would answer the id of the
 * mapped piece or chunk, shared by every block in it and kept when a block
 * is freed and its address handed out again). Given on the first query
 * from a counter above CUDA's own ids and forgotten at the block's free, so
 * the block at the same address later gets a new one. While no id was ever
 * asked for, a free pays one relaxed load. */
static pthread_mutex_t block_id_lock = PTHREAD_MUTEX_INITIALIZER;
static ps_ptr_map_t block_ids;              /* block base -> its id (block_id_lock) */
static uint64_t next_block_id = 1ull << 62; /* (block_id_lock) */
static atomic_int block_ids_given;          /* 1 once an id was given: frees forget theirs */

uint64_t ps_route_block_id(uintptr_t base)
{
    pthread_mutex_lock(&block_id_lock);
    uint64_t id = 0;
    if (!block_ids.slots && ps_ptr_map_init(&block_ids, 64) != PS_OK)
        block_ids.slots = NULL;
    if (!block_ids.slots || !ps_ptr_map_get(&block_ids, base, &id)) {
        id = next_block_id++;
        if (block_ids.slots && ps_ptr_map_reserve(&block_ids, 1) == PS_OK)
            ps_ptr_map_put(&block_ids, base, id); /* (else unique, just not stable: no memory for it) */
        atomic_store_explicit(&block_ids_given, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&block_id_lock);
    return id;
}

/* The block at `base` is freed (or its context died: base 0 forgets all). */
static void forget_block_id(uintptr_t base)
{
    pthread_mutex_lock(&block_id_lock);
    if (block_ids.slots && base)
        ps_ptr_map_remove(&block_ids, base, NULL);
    else if (block_ids.slots) {
        for (size_t i = 0; i < block_ids.capacity; i++)
            block_ids.slots[i].key = PS_PTR_MAP_EMPTY;
        block_ids.count = 0;
    }
    pthread_mutex_unlock(&block_id_lock);
}

/* Bit D: device D's memory pool gave another device access: its
 * stream-ordered allocations pass through (ps_route_pool_access). */
static _Atomic uint64_t pool_shared;

void ps_route_pool_access(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    if (!pool || !ps_shim_ensure_init())
        return;
    int devices = 0;
    if (!ps_real.cuDeviceGetCount || ps_real.cuDeviceGetCount(&devices) != CUDA_SUCCESS)
        return;
    for (int d = 0; d < devices && d < PS_MAX_DEVICES; d++) {
        CUmemoryPool current = NULL, fallback = NULL;
        bool mine = (ps_real.cuDeviceGetMemPool && ps_real.cuDeviceGetMemPool(&current, d) == CUDA_SUCCESS &&
                     current == pool) ||
                    (ps_real.cuDeviceGetDefaultMemPool &&
                     ps_real.cuDeviceGetDefaultMemPool(&fallback, d) == CUDA_SUCCESS && fallback == pool);
        if (!mine)
            continue;
        for (size_t i = 0; i < count; i++)
            if (map[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE && map[i].location.id != d && map[i].flags != 0 &&
                !(atomic_fetch_or(&pool_shared, 1ull << d) >> d & 1)) {
                ps_info("device %d: its memory pool gives device %d access: its stream-ordered allocations go to "
                        "CUDA's pool from now on, with that access",
                        d, map[i].location.id);
                break;
            }
    }
}

/* The pool (or CUDA, for a direct allocation) serves `a`. */
static int allocate_from(ps_stack_t *stack, ps_gpu_ops_t *gpu, const ps_allocation_t *a, void **p)
{
    ps_in_shim++;
    int rc = a->direct ? gpu->mem_alloc(gpu->ctx, a->size, p) : ps_allocate(stack->top, a->size, a->stream, p);
    ps_in_shim--;
    return rc;
}

static bool neighbours_gave(int d, uint64_t wanted, uint64_t epoch);

ps_route_t ps_route_allocate(int call, int door, size_t size, ps_stream_t stream, void **out,
                             int *status)
{
    if (PS_UNLIKELY(!ps_shim_ensure_init()))
        return PS_ROUTE_PASSTHROUGH;
    ps_device_state_t *dev = current_device(door);
    if (!dev) {
        ps_stats_count_passthrough(-1);
        return PS_ROUTE_PASSTHROUGH;
    }
    if (PS_UNLIKELY(stream != PS_STREAM_NONE &&
                    (atomic_load_explicit(&pool_shared, memory_order_relaxed) >> dev->device & 1))) {
        ps_stats_count_passthrough(dev->device);
        return PS_ROUTE_PASSTHROUGH; /* the program shares its pool with other devices */
    }
    if (PS_UNLIKELY(stream == PS_STREAM_NONE && (call == PS_CALL_CUDA_MALLOC || call == PS_CALL_CU_MEM_ALLOC) &&
                    ps_gpu_ops_cuda_unsafe_call_prohibited())) {
        *status = PS_ECAPTURE; /* a global-mode capture is open: as CUDA answers */
        return PS_ROUTE_DONE;
    }
    uint64_t clock_start = ps_stats_clock_start(PS_STATS_TIME_ALLOCATE); /* 0: not timed */
    ps_allocation_t a = {.size = size, .stream = stream, .device = (int16_t)dev->device, .door = (uint8_t)door};
    a.generation = atomic_load_explicit(&dev->generation, memory_order_acquire);
    ps_stack_t *stack = __atomic_load_n(&dev->stack, __ATOMIC_ACQUIRE);
    ps_gpu_ops_t *gpu = __atomic_load_n(&dev->gpu, __ATOMIC_ACQUIRE);
    void *p = NULL;
    a.direct = size >= direct_min;
    int rc = allocate_from(stack, gpu, &a, &p);
    if (PS_UNLIKELY(rc == PS_ENOMEM) && neighbours_gave(dev->device, size, ps_route_oom_epoch()))
        rc = allocate_from(stack, gpu, &a, &p); /* once more (10. above) */
    if (rc == PS_OK) {
        a.ptr = (uintptr_t)p;
        if (ps_registry_insert(&a) != PS_OK) {
            ps_in_shim++;
            if (a.direct)
                gpu->mem_free(gpu->ctx, p, size);
            else
                ps_deallocate(stack->top, p, size, stream);
            ps_in_shim--;
            rc = PS_ENOMEM;
        } else {
            if (PS_UNLIKELY(ps_nvtx_on))
                ps_nvtx_region_add(p, size);
            *out = p;
        }
    }
    ps_stats_count_allocate(dev->device, call, door, size, rc, clock_start);
    *status = rc;
    return PS_ROUTE_DONE;
}

/* A free after exit() began: one of our blocks is forgotten without a CUDA
 * call (the process ends with it), a bad pointer into our memory is still
 * "invalid value", anything else goes to CUDA. */
static ps_route_t free_while_exiting(uintptr_t ptr, int *status)
{
    ps_allocation_t a;
    if (ps_registry_remove(ptr, &a) == PS_OK) {
        *status = PS_OK;
        return PS_ROUTE_DONE;
    }
    if (ps_slab_contains(ptr)) {
        *status = PS_EINVAL;
        return PS_ROUTE_DONE;
    }
    return PS_ROUTE_PASSTHROUGH;
}

/* True when `ptr` is pooled memory (not a whole CUDA allocation). */
static bool is_pooled(uintptr_t ptr)
{
    ps_allocation_t a;
    if (!ps_slab_contains(ptr))
        return false;
    if (ps_registry_find(ptr, &a) == PS_OK || ps_registry_find_containing(ptr, &a) == PS_OK)
        return !a.direct;
    return true; /* inside a slab but not live: ours to answer */
}

ps_route_t ps_route_free(int call, int door, void *ptr, ps_stream_t stream, int *status)
{
    if (!ptr)
        return PS_ROUTE_PASSTHROUGH;
    if (PS_UNLIKELY(!ps_shim_ensure_init()))
        return atomic_load(&ps_exiting) ? free_while_exiting((uintptr_t)ptr, status) : PS_ROUTE_PASSTHROUGH;
    /* only cudaFree/cuMemFree are "unsafe" calls; a stream-ordered free on a
     * capturing stream arrives here as PS_STREAM_NONE too, and the check's
     * probe (a real cuMemAlloc) on the capturing thread would invalidate its
     * capture (the GPU suite's async_streams graph test caught it) */
    if (PS_UNLIKELY(stream == PS_STREAM_NONE && (call == PS_CALL_CUDA_FREE || call == PS_CALL_CU_MEM_FREE) &&
                    ps_gpu_ops_cuda_unsafe_call_prohibited())) {
        if (!is_pooled((uintptr_t)ptr))
            return PS_ROUTE_PASSTHROUGH; /* CUDA's own answer */
        *status = PS_ECAPTURE; /* a global-mode capture is open: the block stays allocated, as natively */
        return PS_ROUTE_DONE;
    }
    uint64_t clock_start = ps_stats_clock_start(PS_STATS_TIME_FREE);
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
    if (PS_UNLIKELY(atomic_load_explicit(&ps_ipc_exports, memory_order_relaxed)))
        ps_ipc_forget(a.ptr); /* a handle made for it is stale from now on */
    if (PS_UNLIKELY(atomic_load_explicit(&block_ids_given, memory_order_relaxed)))
        forget_block_id(a.ptr); /* the next block here is another buffer */
    ps_device_state_t *dev = &ps_devices[a.device];
    if (a.generation != atomic_load_explicit(&dev->generation, memory_order_acquire)) {
        /* handed out before its context died (an allocation that raced
         * with the reset): not ours any more, CUDA answers as natively */
        ps_stats_count_passthrough(-1);
        return PS_ROUTE_PASSTHROUGH;
    }
    if (a.host) { /* cudaFree of pinned host memory: CUDA says "invalid value" too */
        ps_registry_insert(&a);
        ps_stats_count_invalid(call);
        *status = PS_EINVAL;
        return PS_ROUTE_DONE;
    }
    ps_stack_t *stack = __atomic_load_n(&dev->stack, __ATOMIC_ACQUIRE);
    ps_gpu_ops_t *gpu = __atomic_load_n(&dev->gpu, __ATOMIC_ACQUIRE);
    int rc;
    if (PS_UNLIKELY(ps_nvtx_on))
        ps_nvtx_region_remove(ptr, a.size); /* before the pool may hand it out again */
    ps_in_shim++;
    if (a.direct)
        rc = gpu->mem_free(gpu->ctx, ptr, a.size);
    else
        rc = ps_deallocate(stack->top, ptr, a.size, stream);
    ps_in_shim--;
    if (rc != PS_OK && !a.direct) {
        /* the stack refused it: keep the registry as it was */
        ps_registry_insert(&a);
        if (PS_UNLIKELY(ps_nvtx_on))
            ps_nvtx_region_add(ptr, a.size);
        ps_stats_count_invalid(call);
        rc = PS_EINVAL;
    }
    ps_stats_count_free(a.device, call, door, a.size, clock_start);
    *status = rc;
    return PS_ROUTE_DONE;
}

/* ---- pinned host memory ---------------------------------------------------------------- */
ps_route_t ps_route_host_alloc(int call, int door, size_t size, unsigned flags, void **out, int *status)
{
    const unsigned pooled_flags = PS_HOST_POOL_FLAGS;
    if (!size || (flags & ~pooled_flags) || PS_UNLIKELY(!ps_shim_ensure_init()) || !ps_global->host.enable)
        return PS_ROUTE_PASSTHROUGH; /* write-combined (or unknown) flags: CUDA's own */
    ps_device_state_t *dev = ps_current_device(door);
    ps_resource_t *pool = dev ? __atomic_load_n(&dev->host_pool, __ATOMIC_ACQUIRE) : NULL;
    if (!pool) {
        ps_stats_count_passthrough(-1);
        return PS_ROUTE_PASSTHROUGH;
    }
    uint64_t clock_start = ps_stats_clock_start(PS_STATS_TIME_HOST_ALLOCATE);
    ps_allocation_t a = {.size = size, .stream = PS_STREAM_NONE, .device = (int16_t)dev->device,
                         .door = (uint8_t)door, .host = 1};
    a.generation = atomic_load_explicit(&dev->generation, memory_order_acquire);
    void *p = NULL;
    ps_in_shim++;
    int rc = ps_allocate(pool, size, PS_STREAM_NONE, &p);
    ps_in_shim--;
    if (rc == PS_OK) {
        a.ptr = (uintptr_t)p;
        if (ps_registry_insert(&a) != PS_OK) {
            ps_in_shim++;
            ps_deallocate(pool, p, size, PS_STREAM_NONE);
            ps_in_shim--;
            rc = PS_ENOMEM;
        } else {
            *out = p;
        }
    }
    ps_stats_count_allocate(dev->device, call, door, size, rc, clock_start);
    *status = rc;
    return PS_ROUTE_DONE;
}

ps_route_t ps_route_host_free(int call, int door, void *ptr, int *status)
{
    if (!ptr)
        return PS_ROUTE_PASSTHROUGH;
    if (PS_UNLIKELY(!ps_shim_ensure_init()))
        return atomic_load(&ps_exiting) ? free_while_exiting((uintptr_t)ptr, status) : PS_ROUTE_PASSTHROUGH;
    uint64_t clock_start = ps_stats_clock_start(PS_STATS_TIME_HOST_FREE);
    ps_allocation_t a;
    if (ps_registry_remove((uintptr_t)ptr, &a) != PS_OK) {
        if (!ps_slab_contains((uintptr_t)ptr)) {
            ps_stats_count_passthrough(-1);
            return PS_ROUTE_PASSTHROUGH;
        }
        ps_stats_count_invalid(call); /* a double free, or inside a block */
        *status = PS_EINVAL;
        return PS_ROUTE_DONE;
    }
    ps_device_state_t *dev = &ps_devices[a.device];
    if (a.generation != atomic_load_explicit(&dev->generation, memory_order_acquire)) {
        ps_stats_count_passthrough(-1); /* its context died with the memory: CUDA answers */
        return PS_ROUTE_PASSTHROUGH;
    }
    ps_resource_t *pool = __atomic_load_n(&dev->host_pool, __ATOMIC_ACQUIRE);
    if (!a.host || !pool) { /* cudaFreeHost of a device pointer of ours */
        ps_registry_insert(&a);
        ps_stats_count_invalid(call);
        *status = PS_EINVAL;
        return PS_ROUTE_DONE;
    }
    ps_in_shim++;
    int rc = ps_deallocate(pool, ptr, a.size, PS_STREAM_NONE);
    ps_in_shim--;
    if (rc != PS_OK) {
        ps_registry_insert(&a);
        ps_stats_count_invalid(call);
        rc = PS_EINVAL;
    }
    ps_stats_count_free(a.device, call, door, a.size, clock_start);
    *status = rc;
    return PS_ROUTE_DONE;
}

/* Whether `addr` is inside a live pinned block of a live stack. The slab
 * registry first (one lookup), so pointers that are not ours cost little. */
static int in_pinned_block(uintptr_t addr)
{
    if (!ps_slab_contains(addr))
        return 0;
    ps_allocation_t a;
    if (ps_registry_find(addr, &a) != PS_OK && ps_registry_find_containing(addr, &a) != PS_OK)
        return 0;
    return a.host && a.generation == atomic_load_explicit(&ps_devices[a.device].generation, memory_order_acquire);
}

int ps_route_pinned_block(uintptr_t addr, size_t size, unsigned *flags)
{
    if (!addr || ps_in_shim)
        return 0;
    uintptr_t last = size > 1 && addr + (size - 1) > addr ? addr + (size - 1) : addr;
    if (!in_pinned_block(addr) && (last == addr || !in_pinned_block(last)))
        return 0;
    if (flags)
        *flags = PS_HOST_POOL_FLAGS;
    return 1;
}

void ps_route_meminfo(size_t *free_bytes)
{
    if (!ps_shim_ensure_init() || ps_global->meminfo != PS_MEMINFO_POOL)
        return;
    ps_device_state_t *dev = ps_current_device(PS_DOOR_DRIVER);
    if (!dev)
        return;
    ps_resource_info_t info = {0};
    ps_query(__atomic_load_n(&dev->stack, __ATOMIC_ACQUIRE)->top, &info);
    *free_bytes += (size_t)(info.bytes_free + info.bytes_pending);
}

/* ---- pointers of ours asked about (IPC handles, address ranges) ---------------------------- */
/* Says why a pooled pointer cannot be exported. */
static void ipc_refuse(const char *api, uintptr_t ptr, const char *why)
{
    ps_error("%s(%p): this pointer is a suballocation inside one of poolshim's slabs and %s; a legacy IPC "
             "handle would map the whole slab in the peer, at the wrong offset. Pooled blocks are exported "
             "when the pool is expandable over CUDA virtual memory with POSIX file descriptor handles "
             "(global.ipc = on, the default) and both processes run under poolshim; else route such "
             "allocations straight to CUDA with POOLSHIM_OPTIONS=global.direct_min_size=SIZE (requests of "
             "at least SIZE bypass the pool) or use a `cuda` resource for this device. Refused with "
             "\"invalid value\".",
             api, (void *)ptr, why);
}

ps_route_t ps_route_ipc_get(const char *api, uintptr_t ptr, void *handle, int *status)
{
    if (!ps_slab_contains(ptr))
        return PS_ROUTE_PASSTHROUGH;
    ps_allocation_t a;
    if (ps_registry_find(ptr, &a) != PS_OK && ps_registry_find_containing(ptr, &a) != PS_OK) {
        ipc_refuse(api, ptr, "is in no live allocation");
        ps_stats_count_ipc(PS_IPC_REFUSED);
        *status = PS_EINVAL;
        return PS_ROUTE_DONE;
    }
    if (a.direct)
        return PS_ROUTE_PASSTHROUGH; /* a whole CUDA allocation: CUDA's own handle is right */
    ps_device_state_t *dev = &ps_devices[a.device];
    ps_gpu_ops_t *gpu = __atomic_load_n(&dev->gpu, __ATOMIC_ACQUIRE);
    int rc = PS_EUNSUPPORTED;
    if (!a.host && a.generation == atomic_load_explicit(&dev->generation, memory_order_acquire)) {
        ps_in_shim++;
        rc = ps_ipc_export(gpu, a.ptr, a.size, handle);
        ps_in_shim--;
    }
    ps_stats_count_ipc(rc == PS_OK ? PS_IPC_EXPORTED : PS_IPC_REFUSED);
    if (rc == PS_EUNSUPPORTED)
        ipc_refuse(api, ptr,
                   a.host ? "is pinned host memory"
                          : "its memory cannot be exported (a chunked pool, global.ipc off, or a device without "
                            "POSIX file descriptor handles)");
    *status = rc == PS_OK ? PS_OK : PS_EINVAL;
    return PS_ROUTE_DONE;
}

ps_route_t ps_route_ipc_open(const char *api, int door, const void *handle, void **out, int *status)
{
    if (!ps_ipc_is_ours(handle))
        return PS_ROUTE_PASSTHROUGH;
    ps_device_state_t *dev = ps_shim_ensure_init() ? ps_current_device(door) : NULL;
    ps_gpu_ops_t *gpu = dev ? __atomic_load_n(&dev->gpu, __ATOMIC_ACQUIRE) : NULL;
    ps_in_shim++;
    *status = ps_ipc_open(api, gpu, handle, out);
    ps_in_shim--;
    ps_stats_count_ipc(*status == PS_OK ? PS_IPC_OPENED : PS_IPC_REFUSED);
    return PS_ROUTE_DONE;
}

ps_route_t ps_route_ipc_close(uintptr_t ptr, int *status)
{
    ps_in_shim++;
    bool ours = ps_ipc_close(ptr, status);
    ps_in_shim--;
    return ours ? PS_ROUTE_DONE : PS_ROUTE_PASSTHROUGH;
}

ps_route_t ps_route_address_range(uintptr_t addr, uintptr_t *base, size_t *size, int *status)
{
    if (!ps_slab_contains(addr)) {
        if (PS_UNLIKELY(ps_ipc_import_range(addr, base, size))) { /* a block opened from another process */
            *status = PS_OK;
            return PS_ROUTE_DONE;
        }
        return PS_ROUTE_PASSTHROUGH;
    }
    ps_allocation_t a;
    int found = ps_registry_find(addr, &a) == PS_OK || ps_registry_find_containing(addr, &a) == PS_OK;
    if (!found) {
        *status = PS_EINVAL; /* inside a slab, in no live allocation */
        return PS_ROUTE_DONE;
    }
    if (a.direct)
        return PS_ROUTE_PASSTHROUGH; /* a whole CUDA allocation: CUDA answers */
    *base = a.ptr;
    *size = a.size;
    *status = PS_OK;
    return PS_ROUTE_DONE;
}

bool ps_route_pooled_block(uintptr_t addr, ps_allocation_t *out)
{
    if (!ps_slab_contains(addr))
        return false;
    ps_allocation_t a;
    if (ps_registry_find(addr, &a) != PS_OK && ps_registry_find_containing(addr, &a) != PS_OK)
        return false;
    if (a.direct || a.host)
        return false;
    *out = a;
    return true;
}

/* ---- streams, captures, peer access (entry points in hooks_*.c, tracking in gpu_ops_cuda.c) ---- */
void ps_streams_created(CUstream stream, unsigned int flags)
{
    ps_gpu_ops_cuda_stream_created(stream, flags);
}

void ps_streams_destroyed(CUstream stream)
{
    /* let every stack retire what it keeps for this stream while the
     * handle is still valid (a fence recorded on a dead stream crashes);
     * not once exit() began (see 6. above) */
    if (stream && (uintptr_t)stream > (uintptr_t)PS_STREAM_PER_THREAD && !atomic_load(&ps_exiting)) {
        ps_in_shim++;
        for (int d = 0; d < PS_MAX_DEVICES; d++)
            if (atomic_load_explicit(&ps_devices[d].state, memory_order_acquire) == PS_DEVICE_READY)
                ps_stream_destroyed(ps_devices[d].stack->top, (ps_stream_t)stream);
        ps_in_shim--;
    }
    ps_gpu_ops_cuda_stream_destroyed(stream);
}

int ps_streams_capture_gate(void)
{
    return ps_gpu_ops_cuda_capture_gate();
}

void ps_streams_capture_gate_end(void)
{
    ps_gpu_ops_cuda_capture_gate_end();
}

void ps_streams_capture_begun(CUstream stream, CUstreamCaptureMode mode)
{
    ps_gpu_ops_cuda_capture_begun(stream, mode);
}

void ps_peer_access_enabled(CUcontext peer)
{
    ps_gpu_ops_cuda_peer_access_enabled(peer);
}

/* A report written while the program runs (the live page, shim/live.c)
 * reads every device's state and what its dropped stacks took: under the
 * devices lock, as a context reset writes them (drop_device). */
void ps_devices_report_begin(void) { pthread_mutex_lock(&devices_lock); }
void ps_devices_report_end(void) { pthread_mutex_unlock(&devices_lock); }

void ps_route_device_synchronized(void)
{
    if (!atomic_load_explicit(&ps_init_done, memory_order_acquire) || ps_disabled_early)
        return;
    CUdevice d = -1;
    if (ps_real.cuCtxGetDevice(&d) != CUDA_SUCCESS || d < 0 || d >= PS_MAX_DEVICES ||
        atomic_load_explicit(&ps_devices[d].state, memory_order_acquire) != PS_DEVICE_READY)
        return; /* nothing built on this device: nothing to give back */
    ps_device_state_t *dev = ps_current_device(PS_DOOR_DRIVER);
    if (dev)
        ps_device_synchronized(__atomic_load_n(&dev->stack, __ATOMIC_ACQUIRE)->top);
}

/* ---- the out-of-memory retry (9. above) ----------------------------------------------- */
/* Give-backs that returned memory, every device: a call that failed before
 * one of them ended is retried even when its own give-back finds nothing
 * left (the other thread's memory went back just after its failure). */
static atomic_ullong oom_give_backs;

uint64_t ps_route_oom_epoch(void) { return atomic_load_explicit(&oom_give_backs, memory_order_acquire); }

/* An allocation on device d found no memory after this process's own
 * give-back: asks the neighbour processes (neighbours.c; with
 * global.neighbour_release on, never inside the shim, holding no lock).
 * True when the allocation is worth making once more: they gave memory
 * back, or a give-back of this process ended since `epoch` (another
 * thread's: its neighbours' memory came just after this one's failure). */
static bool neighbours_gave(int d, uint64_t wanted, uint64_t epoch)
{
    if (!ps_global->neighbour_release || ps_in_shim || !atomic_load_explicit(&ps_active, memory_order_relaxed))
        return false;
    uint64_t given = ps_neighbours_ask(d, wanted);
    if (given)
        atomic_fetch_add_explicit(&oom_give_backs, 1, memory_order_acq_rel);
    return given || ps_route_oom_epoch() != epoch;
}

int ps_give_back_enter_device(int d, ps_device_state_t **dev_out)
{
    if (d < 0 || d >= PS_MAX_DEVICES || atomic_load_explicit(&ps_devices[d].state, memory_order_acquire) != PS_DEVICE_READY)
        return PS_EUPSTREAM;
    ps_device_state_t *dev = &ps_devices[d];
    ps_gpu_ops_t *gpu = __atomic_load_n(&dev->gpu, __ATOMIC_ACQUIRE);
    if (!gpu || !__atomic_load_n(&dev->stack, __ATOMIC_ACQUIRE))
        return PS_EUPSTREAM;
    ps_in_shim++;
    int open = ps_gpu_ops_cuda_give_back_enter(gpu);
    if (open != PS_OK) {
        ps_in_shim--;
        return open;
    }
    *dev_out = dev;
    return PS_OK;
}

void ps_give_back_exit_device(void)
{
    ps_gpu_ops_cuda_give_back_leave();
    ps_in_shim--;
}

/* The pool's own trim on device d (nothing when no stack was built there,
 * or while a stream capture is open): the bytes it gave back. */
static uint64_t trim_for_oom(int d, const char *api)
{
    ps_device_state_t *dev;
    int open = ps_give_back_enter_device(d, &dev);
    if (open != PS_OK) {
        if (open == PS_EBUSY) {
            ps_stats_count_oom(d, PS_OOM_SKIPPED_CAPTURE, 1);
            ps_info("device %d: %s ran out of memory while a stream capture is open: the pool's free memory "
                    "stays (a device synchronize would invalidate the capture)", d, api);
        }
        return 0;
    }
    ps_stack_t *stack = __atomic_load_n(&dev->stack, __ATOMIC_ACQUIRE);
    ps_resource_info_t before = {0}, after = {0};
    ps_query(stack->top, &before);
    ps_trim(stack->top);
    ps_query(stack->top, &after);
    ps_give_back_exit_device();
    uint64_t given = before.bytes_reserved > after.bytes_reserved ? before.bytes_reserved - after.bytes_reserved : 0;
    if (given) {
        ps_stats_count_oom(d, PS_OOM_GIVEN_BACK, given);
        atomic_fetch_add_explicit(&oom_give_backs, 1, memory_order_acq_rel);
    }
    return given;
}

bool ps_route_oom_give_back(int *device, uint64_t epoch, const char *api, bool *asked)
{
    *asked = false;
    if (ps_in_shim || !ps_shim_ensure_init() || !ps_global->oom_retry || *device < -1)
        return false; /* (a program that only ever called cuMemCreate meets the shim here first) */
    CUdevice current = -1;
    if (*device == -1 && (ps_real.cuCtxGetDevice(&current) != CUDA_SUCCESS || current < 0))
        return false; /* no context: nothing of ours can be in the way */
    int d = *device == -1 ? current : *device;
    *device = d;
    if (d >= PS_MAX_DEVICES)
        return false;
    uint64_t given = trim_for_oom(d, api);
    bool retry = given || ps_route_oom_epoch() != epoch;
    char b[32];
    const char *next = retry                          ? ", retrying it once"
                       : ps_global->neighbour_release ? ", asking the neighbours"
                                                      : ", nothing to retry with";
    if (atomic_load_explicit(&ps_devices[d].state, memory_order_acquire) == PS_DEVICE_READY)
        ps_info("device %d: %s ran out of memory: the pool gave back %s%s", d, api,
                ps_format_bytes(b, sizeof b, given), next);
    if (!retry) {
        *asked = true;
        retry = neighbours_gave(d, 0, epoch); /* (it says what they gave) */
    }
    return retry;
}

bool ps_route_oom_ask_neighbours(int device, uint64_t epoch)
{
    if (device < 0 || device >= PS_MAX_DEVICES)
        return false;
    return neighbours_gave(device, 0, epoch);
}

void ps_route_oom_retried(int device, const char *api, bool succeeded)
{
    ps_stats_count_oom(device, succeeded ? PS_OOM_SUCCEEDED : PS_OOM_FAILED, 1);
    if (!succeeded)
        ps_info("device %d: %s ran out of memory again after the give-back", device, api);
}

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

/* Drops device d's stack: its context died. No CUDA call on anything of
 * it. Requires devices_lock; the device must have been READY. */
static void drop_device(ps_device_state_t *dev, const char *api)
{
    int d = dev->device;
    ps_stack_t *stack = dev->stack;
    ps_gpu_ops_t *gpu = dev->gpu;
    atomic_store(&dev->state, PS_DEVICE_UNBUILT);
    ps_gpu_ops_cuda_mark_dead(gpu);
    ps_gpu_ops_cuda_forget_context(dev->ctx);
    atomic_fetch_add(&dev->generation, 1);
    atomic_fetch_add(&context_epoch, 1);
    uint64_t count = 0, bytes = 0;
    ps_registry_drop_device(d, &count, &bytes);
    ps_slab_drop_device(d);
    atomic_fetch_and(&pool_shared, ~(1ull << d)); /* the context's pools died with it */
    if (atomic_load(&block_ids_given))
        forget_block_id(0); /* (every device's: ids are given again on the next query) */
    if (ps_nvtx_on)
        ps_nvtx_drop_device(d);
    ps_resource_info_t info = {0};
    ps_query(stack->top, &info);
    if (stack->log)
        ps_log_flush(stack->log); /* (a file write) the new stack's log starts the file again */
    dev->dropped.bytes_reserved += info.bytes_reserved;
    dev->dropped.bytes_in_use += info.bytes_in_use;
    dev->dropped.bytes_pending += info.bytes_pending;
    dev->dropped.upstream_allocs += info.upstream_allocs;
    dev->dropped.upstream_frees += info.upstream_frees;
    dev->dropped.fences_recorded += info.fences_recorded;
    dev->dropped.fence_waits += info.fence_waits;
    if (info.peak_bytes_reserved > dev->dropped.peak_bytes_reserved)
        dev->dropped.peak_bytes_reserved = info.peak_bytes_reserved;
    ps_resource_t *host_pool = dev->host_pool;
    ps_stack_t *host_stack = dev->host_stack;
    if (host_pool) {
        if (host_stack->log)
            ps_log_flush(host_stack->log);
        ps_resource_info_t hinfo = {0};
        ps_query(host_pool, &hinfo);
        dev->dropped_host.bytes_reserved += hinfo.bytes_reserved;
        dev->dropped_host.upstream_allocs += hinfo.upstream_allocs;
        dev->dropped_host.upstream_frees += hinfo.upstream_frees;
        dev->dropped_host.fences_recorded += hinfo.fences_recorded;
        dev->dropped_host.fence_waits += hinfo.fence_waits;
        dev->dropped_host.pending_waits += hinfo.pending_waits;
        if (hinfo.peak_bytes_reserved > dev->dropped_host.peak_bytes_reserved)
            dev->dropped_host.peak_bytes_reserved = hinfo.peak_bytes_reserved;
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

CUresult ps_context_reset(CUdevice device, ps_cuDevicePrimaryCtxReset_fn real, const char *api)
{
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    if (device < 0 || device >= PS_MAX_DEVICES)
        return real(device);
    ps_device_state_t *dev = &ps_devices[device];
    pthread_mutex_lock(&devices_lock);
    if (atomic_load(&dev->state) != PS_DEVICE_READY) { /* no stack: nothing of ours in the context */
        CUresult r = real(device);
        pthread_mutex_unlock(&devices_lock);
        return r;
    }
    /* no new user of the stack while the context goes away: allocations on
     * this device wait for the lock, then build in the new context */
    atomic_store(&dev->state, PS_DEVICE_UNBUILT);
    atomic_fetch_add(&context_epoch, 1); /* cached answers are looked up again */
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
    open_gate(dev, died);
    if (died) {
        drop_device(dev, api);
        /* "resetting the primary context does not release it": whoever
         * retained it releases its usage, which is safe after a reset */
        release_ours(dev);
    }
    pthread_mutex_unlock(&devices_lock);
    return r;
}

CUresult ps_context_release(CUdevice device, ps_cuDevicePrimaryCtxRelease_fn real, const char *api)
{
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    if (device < 0 || device >= PS_MAX_DEVICES)
        return real(device);
    ps_device_state_t *dev = &ps_devices[device];
    pthread_mutex_lock(&devices_lock);
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
    if (ready)
        open_gate(dev, died);
    if (died)
        drop_device(dev, api);
    pthread_mutex_unlock(&devices_lock);
    return r;
}

CUresult ps_context_destroy(CUcontext ctx, ps_cuCtxDestroy_fn real, const char *api)
{
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&devices_lock);
    bool ours[PS_MAX_DEVICES] = {false}; /* devices whose stack lives in ctx: gates closed around the call */
    for (int d = 0; d < PS_MAX_DEVICES && ctx; d++)
        if (atomic_load(&ps_devices[d].state) == PS_DEVICE_READY && ps_devices[d].ctx == ctx) {
            ours[d] = true;
            ps_gpu_ops_cuda_close(ps_devices[d].gpu);
        }
    CUresult r = real(ctx);
    for (int d = 0; d < PS_MAX_DEVICES; d++)
        if (ours[d])
            open_gate(&ps_devices[d], r == CUDA_SUCCESS);
    if (r == CUDA_SUCCESS && ctx) {
        for (int d = 0; d < PS_MAX_DEVICES; d++) {
            ps_device_state_t *dev = &ps_devices[d];
            if (ours[d]) {
                drop_device(dev, api);
                dev->holds_ref = 0;
            }
        }
        /* a non-primary context: its streams are gone, its handle may come back */
        ps_gpu_ops_cuda_forget_context(ctx);
        for (size_t i = 0; i < warned_count; i++)
            if (warned_ctx[i] == ctx) {
                warned_ctx[i] = warned_ctx[--warned_count];
                break;
            }
        atomic_fetch_add(&context_epoch, 1);
    }
    pthread_mutex_unlock(&devices_lock);
    return r;
}

CUresult ps_context_set_flags(CUdevice device, unsigned int flags, ps_cuDevicePrimaryCtxSetFlags_fn real,
                              const char *api)
{
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    if (device < 0 || device >= PS_MAX_DEVICES)
        return real(device, flags);
    ps_device_state_t *dev = &ps_devices[device];
    pthread_mutex_lock(&devices_lock);
    bool ready = atomic_load(&dev->state) == PS_DEVICE_READY;
    if (ready)
        ps_gpu_ops_cuda_close(dev->gpu); /* a driver may make the context again (see ps_context_check) */
    CUresult r = real(device, flags);
    bool died = ready && r == CUDA_SUCCESS && !context_alive(dev);
    if (ready)
        open_gate(dev, died);
    if (died) {
        drop_device(dev, api);
        settle_ref(dev);
    }
    pthread_mutex_unlock(&devices_lock);
    return r;
}

void ps_context_check(const char *api)
{
    if (ps_real_load_driver() != PS_OK)
        return;
    pthread_mutex_lock(&devices_lock);
    for (int d = 0; d < PS_MAX_DEVICES; d++) {
        ps_device_state_t *dev = &ps_devices[d];
        if (atomic_load(&dev->state) == PS_DEVICE_READY && !context_alive(dev)) {
            drop_device(dev, api);
            settle_ref(dev);
        }
    }
    pthread_mutex_unlock(&devices_lock);
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
        ps_stack_t *stack = __atomic_load_n(&dev->stack, __ATOMIC_ACQUIRE);
        if (atomic_load(&dev->state) == PS_DEVICE_READY && stack->log)
            if (ps_log_flush(stack->log) != PS_OK)
                rc = PS_EUPSTREAM;
        ps_stack_t *host = dev->host_stack;
        if (atomic_load(&dev->state) == PS_DEVICE_READY && host && host->log)
            if (ps_log_flush(host->log) != PS_OK)
                rc = PS_EUPSTREAM;
    }
    return rc;
}
