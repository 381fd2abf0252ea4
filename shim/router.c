/* The router: the one place both doors end in. (The current device and the
 * context lifecycle are shim/lifecycle.c's; the out-of-memory retry of 9.
 * and 10., shim/oom.c's; shim/router_internal.h is what router.c and oom.c
 * share.)
 *
 * 1. Lazy init on the first intercepted call (never in a constructor):
 *    load libcuda and the configuration, register the exit report and the
 *    fork handlers. A bad configuration stops the program
 *    (on_error=exit) or turns the shim into a passthrough.
 * 2. Allocation: the current context decides the device (lifecycle.c: its
 *    stack built on first use with its context current; with no context
 *    current through the runtime door, the real runtime makes it, as it
 *    would have; only primary contexts are served).
 * 3. Every pointer handed out is recorded in the registry with its size,
 *    stream and door; a free looks it up (no context query), removes it
 *    atomically and gives it back to the device's stack (with debug.nvtx,
 *    the block is an NVTX region from its registration to its free).
 * 4. A pointer not in the registry goes to the real free, unless it lies
 *    inside memory the shim took from CUDA: then it is a double free or an
 *    interior pointer, answered "invalid value", the pool untouched.
 * 5. Counters are per thread and summed at exit (stats.h).
 * 6. Exit: from exit_begins on (lifecycle.c, before the CUDA runtime's
 *    teardown) allocations pass through and a free of one of our blocks
 *    forgets it: no CUDA call once the runtime may be gone. The exit
 *    report (registered here, so it runs after the teardown) reads memory.
 * 7. A dead context's stack is dropped by lifecycle.c; a free of a pointer
 *    from before finds no entry (or a stale generation) and goes to the
 *    real free, as natively.
 * 8. IPC: handles of live pooled blocks go to ipc.c with the block's
 *    GPU-ops table; a free forgets the block's export while any is live.
 * 9. Out-of-memory retry (global.oom_retry): an allocation beside the pool
 *    (hooks_driver.c) that runs out of memory is made once more after its
 *    device's stack gave back what the GPU is done with; not while a
 *    stream capture is open on the device (oom.c).
 * 10. Neighbours (global.neighbour_release): when memory is still short,
 *    the other processes of this user on the same GPU are asked to give
 *    theirs back (neighbours.c), from the failing thread, holding no lock.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/adaptors.h"
#include "../core/ptr_map.h"
#include "../core/resource.h"
#include "gpu_ops_cuda.h"
#include "hints.h"
#include "ipc.h"
#include "nvtx.h"
#include "poolshim.h"
#include "registry.h"
#include "router_internal.h"
#include "stats.h"

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static ps_global_config_t passthrough_global; /* used when the config failed */

/* global.direct_min_size, SIZE_MAX when off: one comparison per allocation. */
static size_t direct_min = SIZE_MAX;

static void forget_device(int d);

/* At exit (registered by the init, before the CUDA runtime registers its
 * teardown, so it runs after it): the report, then the hints (the
 * process's own exit only). */
static void report_at_exit(void)
{
    if (ps_stats_report_at_exit())
        ps_hints_at_exit();
}

static void init_once_body(void)
{
    ps_process_set_config(NULL, &passthrough_global);
    if (ps_process_disabled_early()) {
        ps_process_set_active(0);
        return;
    }
    if (ps_real_load_driver() != PS_OK) {
        ps_process_set_active(0);
        return;
    }
    uint64_t t0 = ps_now_ns();
    ps_config_t *config = NULL;
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
        ps_process_set_config(config, &passthrough_global);
        ps_process_set_active(0);
        return;
    }
    const ps_global_config_t *g = ps_config_global(config);
    ps_process_set_config(config, g);
    ps_verbosity = g->verbosity;
    if (g->direct_min_size)
        direct_min = g->direct_min_size;
    if (g->disable) {
        ps_process_set_active(0);
        return;
    }
    ps_stats_init(g->stats != PS_STATS_OFF);
    if (g->debug.nvtx)
        ps_nvtx_enable();
    ps_lifecycle_on_drop(forget_device);
    pthread_atfork(ps_lifecycle_atfork_prepare, ps_lifecycle_atfork_parent, ps_lifecycle_atfork_child);
    atexit(report_at_exit);
    ps_info("active (pid %d, version %s): set up in %.0f us, free_sync=%s, stats=%s", (int)getpid(),
            poolshim_version(), (ps_now_ns() - t0) / 1e3,
            g->free_sync == PS_FREE_SYNC_EVENT     ? "event"
            : g->free_sync == PS_FREE_SYNC_DEVICE  ? "device"
            : g->free_sync == PS_FREE_SYNC_BARRIER ? "barrier"
                                                   : "none",
            g->stats == PS_STATS_OFF ? "off" : g->stats == PS_STATS_TEXT ? "text" : "json");
    ps_process_set_active(1);
}

/* Statistics asked for on stderr, and the process never reached the shim
 * (no CUDA allocation, no context): one line says so instead of silence.
 * The configuration is read only when a variable could have turned the
 * statistics on; a forked child stays quiet (its parent speaks). With a
 * statistics file nothing is written (docs/config.md, global.stats_file). */
__attribute__((destructor)) static void report_no_cuda_seen(void)
{
    if (ps_process_initialised() || ps_process_disabled_early() || getpid() != ps_process_loaded_in())
        return;
    if (!getenv("POOLSHIM_STATS") && !getenv("POOLSHIM_OPTIONS") && !getenv("POOLSHIM_CONFIG"))
        return;
    ps_config_t *cfg = NULL;
    if (ps_config_load(NULL, &cfg) == PS_OK) {
        const ps_global_config_t *g = ps_config_global(cfg);
        ps_verbosity = g->verbosity;
        if (g->stats != PS_STATS_OFF && !g->stats_file[0] && !g->disable)
            ps_warning("statistics: no CUDA allocation seen in %s (pid %d): nothing to report",
                       program_invocation_short_name, (int)getpid());
    }
    ps_config_free(cfg);
}

/* ps_shim_ensure_init (router.h) before the first initialisation finished. */
int ps_shim_init(void)
{
    pthread_once(&init_once, init_once_body);
    ps_process_set_initialised();
    return ps_process_active();
}

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

/* Device d's context died (lifecycle.c, drop_device; registered with
 * ps_lifecycle_on_drop by the init): its pools went with it, and buffer
 * ids are given again on the next query (every device's). */
static void forget_device(int d)
{
    atomic_fetch_and(&pool_shared, ~(1ull << d)); /* the context's pools died with it */
    if (atomic_load(&block_ids_given))
        forget_block_id(0); /* (every device's: ids are given again on the next query) */
}

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
        int first_peer = -1;
        for (size_t i = 0; i < count; i++)
            if (map[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE && map[i].location.id != d && map[i].flags != 0) {
                /* the blocks served before keep the stack's access: the device given access is in use */
                ps_gpu_ops_cuda_device_in_use(d);
                ps_gpu_ops_cuda_device_in_use(map[i].location.id);
                if (first_peer < 0)
                    first_peer = map[i].location.id;
            }
        if (first_peer >= 0 && !(atomic_fetch_or(&pool_shared, 1ull << d) >> d & 1))
            ps_info("device %d: its memory pool gives device %d access: its stream-ordered allocations go to "
                    "CUDA's pool from now on, with that access",
                    d, first_peer);
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

ps_route_t ps_route_allocate(int call, int door, size_t size, ps_stream_t stream, void **out,
                             int *status)
{
    if (PS_UNLIKELY(!ps_shim_ensure_init()))
        return PS_ROUTE_PASSTHROUGH;
    ps_device_state_t *dev = ps_devices_current(door);
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
    if (PS_UNLIKELY(rc == PS_ENOMEM) && ps_route_neighbours_gave(dev->device, size, ps_route_oom_epoch()))
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

/* A live block the stack could not take back (a CUDA error while it
 * ordered the free after the GPU's work, or no host memory): it stays
 * allocated, and the program is told why, not that its pointer was bad. */
static void warn_free_failed(int call, int status)
{
    static atomic_int warned;
    if (atomic_fetch_add_explicit(&warned, 1, memory_order_relaxed) < 10)
        ps_warning("%s: the pool could not take the block back (%s): it stays allocated",
                   call == PS_CALL_CU_MEM_FREE || call == PS_CALL_CU_MEM_FREE_ASYNC ? "cuMemFree" : "cudaFree",
                   status == PS_ENOMEM ? "no host memory for its bookkeeping"
                                       : "a CUDA error while ordering the free after the GPU's work");
}

ps_route_t ps_route_free(int call, int door, void *ptr, ps_stream_t stream, int *status)
{
    if (!ptr)
        return PS_ROUTE_PASSTHROUGH;
    if (PS_UNLIKELY(!ps_shim_ensure_init()))
        return ps_process_exiting() ? free_while_exiting((uintptr_t)ptr, status) : PS_ROUTE_PASSTHROUGH;
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
    if (PS_UNLIKELY(ps_ipc_exporting()))
        ps_ipc_forget(a.ptr); /* a handle made for it is stale from now on */
    if (PS_UNLIKELY(atomic_load_explicit(&block_ids_given, memory_order_relaxed)))
        forget_block_id(a.ptr); /* the next block here is another buffer */
    ps_device_state_t *dev = ps_device(a.device);
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
        if (rc == PS_EINVAL)
            ps_stats_count_invalid(call);
        else
            warn_free_failed(call, rc);
        rc = rc == PS_ENOMEM ? PS_ENOMEM : PS_EINVAL;
    }
    ps_stats_count_free(a.device, call, door, a.size, clock_start);
    *status = rc;
    return PS_ROUTE_DONE;
}

/* ---- pinned host memory ---------------------------------------------------------------- */
ps_route_t ps_route_host_alloc(int call, int door, size_t size, unsigned flags, void **out, int *status)
{
    const unsigned pooled_flags = PS_HOST_POOL_FLAGS;
    if (!size || (flags & ~pooled_flags) || PS_UNLIKELY(!ps_shim_ensure_init()) || !ps_global_config()->host.enable)
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
        return ps_process_exiting() ? free_while_exiting((uintptr_t)ptr, status) : PS_ROUTE_PASSTHROUGH;
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
    ps_device_state_t *dev = ps_device(a.device);
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
    return a.host && a.generation == atomic_load_explicit(&ps_device(a.device)->generation, memory_order_acquire);
}

bool ps_route_pinned_block(uintptr_t addr, size_t size, unsigned *flags)
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
    if (!ps_shim_ensure_init() || ps_global_config()->meminfo != PS_MEMINFO_POOL)
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
    ps_device_state_t *dev = ps_device(a.device);
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

bool ps_route_ipc_capable(const ps_allocation_t *a)
{
    ps_gpu_ops_t *gpu = __atomic_load_n(&ps_device(a->device)->gpu, __ATOMIC_ACQUIRE);
    const ps_global_config_t *g = ps_global_config();
    return g && g->ipc && gpu && gpu->ipc_export && ps_slab_mapped_device(a->ptr) == a->device;
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
    if (stream && (uintptr_t)stream > (uintptr_t)PS_STREAM_PER_THREAD && !ps_process_exiting()) {
        ps_in_shim++;
        for (int d = 0; d < PS_MAX_DEVICES; d++)
            if (atomic_load_explicit(&ps_device(d)->state, memory_order_acquire) == PS_DEVICE_READY)
                ps_stream_destroyed(ps_device(d)->stack->top, (ps_stream_t)stream);
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

void ps_route_device_synchronized(void)
{
    if (!ps_process_initialised() || ps_process_disabled_early())
        return;
    CUdevice d = -1;
    if (ps_real.cuCtxGetDevice(&d) != CUDA_SUCCESS || d < 0 || d >= PS_MAX_DEVICES ||
        atomic_load_explicit(&ps_device(d)->state, memory_order_acquire) != PS_DEVICE_READY)
        return; /* nothing built on this device: nothing to give back */
    ps_device_state_t *dev = ps_current_device(PS_DOOR_DRIVER);
    if (dev)
        ps_device_synchronized(__atomic_load_n(&dev->stack, __ATOMIC_ACQUIRE)->top);
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
        ps_device_state_t *dev = ps_device(d);
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
