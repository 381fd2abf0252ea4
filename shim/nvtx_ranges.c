/* NVTX ranges around the shim's own slow CUDA work (debug.nvtx_ranges):
 * an Nsight Systems timeline then shows where allocation time went.
 *
 * 1. When a device's GPU-ops table is made (router.c, build_device) and the
 *    option is on, ps_nvtx_ranges_wrap replaces the table's slow entries
 *    by wrappers; the original table is kept in an append-only list looked
 *    up by the table's ctx (a handful of entries: one per device, and one
 *    more per context reset).
 * 2. Each wrapper pushes a range in the domain "poolshim" around the real
 *    call, on the calling thread, named by what it does and its size:
 *        grow: map 1 GiB (cuMemCreate + cuMemMap + access)   category grow
 *        grow: access 1 GiB (cuMemSetAccess)                  category grow
 *        grow: chunk 64 MiB (cuMemAlloc)                      category grow
 *        remap: map 2 MiB (cuMemMap of a kept handle)         category remap
 *        release: unmap 2 MiB (cuMemUnmap + cuMemRelease)     category release
 *        barrier                                              category barrier
 *        wait: barrier / wait: fence / wait: device synchronize  category wait
 *    A call that fails adds a mark "... failed: <status>" inside its range.
 *    What the give-back thread releases shows on that thread's row; what an
 *    allocation takes shows on the thread that asked.
 * 3. Cheap, frequent entries (fence records, stream waits, queries) are not
 *    wrapped: they are no slow work, and a range per allocation would bury
 *    the ones that matter.
 * Off (the default), nothing is wrapped: no cost at all. On, each wrapped
 * call costs a lookup over the list and a push and a pop (with no tool
 * attached, NVTX returns at once). NVTX calls run with ps_in_shim raised, as
 * in nvtx.c. Built without the NVTX headers (PS_NO_NVTX), turning the option
 * on prints one warning and wraps nothing.
 */
#include <stdatomic.h>
#include <stdio.h>

#include "nvtx.h"

#ifdef PS_NO_NVTX

void ps_nvtx_ranges_wrap(ps_gpu_ops_t *gpu)
{
    (void)gpu;
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1))
        ps_warning("debug.nvtx_ranges: this build has no NVTX headers (CUDA's include/nvtx3); the option does "
                   "nothing");
}

#else

#include <nvtx3/nvToolsExt.h>

enum { CATEGORY_GROW = 1, CATEGORY_REMAP, CATEGORY_RELEASE, CATEGORY_BARRIER, CATEGORY_WAIT };
static const struct {
    const char *name; /* shown by Nsight Systems as the range's category */
    uint32_t color;   /* ARGB */
} categories[] = {
    [CATEGORY_GROW] = {"grow", 0xFF2E7D32},       [CATEGORY_REMAP] = {"remap", 0xFF1565C0},
    [CATEGORY_RELEASE] = {"release", 0xFFEF6C00}, [CATEGORY_BARRIER] = {"barrier", 0xFF6A1B9A},
    [CATEGORY_WAIT] = {"wait", 0xFFC62828},
};

#define MAX_TABLES 256
static ps_gpu_ops_t originals[MAX_TABLES]; /* the tables as made, before wrapping (append-only) */
static atomic_int table_count;            /* entries of originals published */
static pthread_mutex_t append_lock = PTHREAD_MUTEX_INITIALIZER;
static nvtxDomainHandle_t domain;         /* "poolshim", made by the first wrap (append_lock) */

/* The original table of a wrapped table's ctx (every wrapper's first step). */
static const ps_gpu_ops_t *original(void *ctx)
{
    int n = atomic_load_explicit(&table_count, memory_order_acquire);
    for (int i = n - 1; i >= 0; i--)
        if (originals[i].ctx == ctx)
            return &originals[i];
    return NULL; /* not reached: only tables listed here point at the wrappers */
}

/* An event's attributes with an ASCII message (the range's or the mark's). */
static nvtxEventAttributes_t attributes(const char *message)
{
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = message;
    return a;
}

static void push(int category, const char *fmt, size_t bytes)
{
    char size[32], message[128];
    ps_format_bytes(size, sizeof size, bytes);
    snprintf(message, sizeof message, fmt, size);
    nvtxEventAttributes_t a = attributes(message);
    a.category = (uint32_t)category;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = categories[category].color;
    ps_in_shim++;
    nvtxDomainRangePushEx(domain, &a);
    ps_in_shim--;
}

/* Closes the range; a failed call first leaves a mark in it. */
static int pop(int rc, const char *what)
{
    ps_in_shim++;
    if (rc != PS_OK) {
        char message[128];
        snprintf(message, sizeof message, "%s failed: %s", what, ps_status_name(rc));
        nvtxEventAttributes_t a = attributes(message);
        nvtxDomainMarkEx(domain, &a);
    }
    nvtxDomainRangePop(domain);
    ps_in_shim--;
    return rc;
}

/* One wrapper per entry: push, the original call, pop. */
static int mem_alloc(void *ctx, size_t size, void **out)
{
    push(CATEGORY_GROW, "grow: chunk %s (cuMemAlloc)", size);
    return pop(original(ctx)->mem_alloc(ctx, size, out), "cuMemAlloc");
}
static int mem_free(void *ctx, void *ptr, size_t size)
{
    push(CATEGORY_RELEASE, "release: chunk %s (cuMemFree)", size);
    return pop(original(ctx)->mem_free(ctx, ptr, size), "cuMemFree");
}
static int mem_alloc_managed(void *ctx, size_t size, void **out)
{
    push(CATEGORY_GROW, "grow: managed slab %s (cuMemAllocManaged)", size);
    return pop(original(ctx)->mem_alloc_managed(ctx, size, out), "cuMemAllocManaged");
}
static int vm_reserve(void *ctx, size_t size, void **out)
{
    push(CATEGORY_GROW, "grow: reserve %s of addresses (cuMemAddressReserve)", size);
    return pop(original(ctx)->vm_reserve(ctx, size, out), "cuMemAddressReserve");
}
static void vm_release(void *ctx, void *addr, size_t size)
{
    push(CATEGORY_RELEASE, "release: %s of addresses (cuMemAddressFree)", size);
    original(ctx)->vm_release(ctx, addr, size);
    pop(PS_OK, NULL);
}
static int vm_map(void *ctx, void *addr, size_t size, uint64_t *handle)
{
    push(CATEGORY_GROW, "grow: map %s (cuMemCreate + cuMemMap + access)", size);
    return pop(original(ctx)->vm_map(ctx, addr, size, handle), "map");
}
static int vm_map_bare(void *ctx, void *addr, size_t size, uint64_t *handle)
{
    push(CATEGORY_GROW, "grow: map %s (cuMemCreate + cuMemMap)", size);
    return pop(original(ctx)->vm_map_bare(ctx, addr, size, handle), "map");
}
static int vm_access(void *ctx, void *addr, size_t size)
{
    push(CATEGORY_GROW, "grow: access %s (cuMemSetAccess)", size);
    return pop(original(ctx)->vm_access(ctx, addr, size), "cuMemSetAccess");
}
static int vm_map_handle(void *ctx, void *addr, size_t size, uint64_t handle)
{
    push(CATEGORY_REMAP, "remap: map %s (cuMemMap of a kept handle + access)", size);
    return pop(original(ctx)->vm_map_handle(ctx, addr, size, handle), "remap");
}
static int vm_map_handle_bare(void *ctx, void *addr, size_t size, uint64_t handle)
{
    push(CATEGORY_REMAP, "remap: map %s (cuMemMap of a kept handle)", size);
    return pop(original(ctx)->vm_map_handle_bare(ctx, addr, size, handle), "remap");
}
static int vm_unmap(void *ctx, void *addr, size_t size, uint64_t handle)
{
    push(CATEGORY_RELEASE, "release: unmap %s (cuMemUnmap + cuMemRelease)", size);
    return pop(original(ctx)->vm_unmap(ctx, addr, size, handle), "unmap");
}
static int vm_unmap_keep(void *ctx, void *addr, size_t size, uint64_t handle)
{
    push(CATEGORY_REMAP, "remap: unmap %s, handle kept (cuMemUnmap)", size);
    return pop(original(ctx)->vm_unmap_keep(ctx, addr, size, handle), "unmap");
}
static void vm_drop(void *ctx, uint64_t handle)
{
    push(CATEGORY_RELEASE, "release: a kept handle (cuMemRelease)", 0);
    original(ctx)->vm_drop(ctx, handle);
    pop(PS_OK, NULL);
}
static int host_alloc(void *ctx, size_t size, unsigned flags, void **out)
{
    push(CATEGORY_GROW, "grow: pinned slab %s (cuMemHostAlloc)", size);
    return pop(original(ctx)->host_alloc(ctx, size, flags, out), "cuMemHostAlloc");
}
static int host_free(void *ctx, void *ptr, size_t size)
{
    push(CATEGORY_RELEASE, "release: pinned slab %s (cuMemFreeHost)", size);
    return pop(original(ctx)->host_free(ctx, ptr, size), "cuMemFreeHost");
}
static int host_vm_map(void *ctx, void *addr, size_t size, uint64_t *handle)
{
    push(CATEGORY_GROW, "grow: map pinned %s (cuMemCreate + cuMemMap + access)", size);
    return pop(original(ctx)->host_vm_map(ctx, addr, size, handle), "map");
}
static int barrier(void *ctx)
{
    push(CATEGORY_BARRIER, "barrier", 0);
    return pop(original(ctx)->barrier(ctx), "barrier");
}
static int barrier_wait(void *ctx, uint64_t generation)
{
    push(CATEGORY_WAIT, "wait: barrier", 0);
    return pop(original(ctx)->barrier_wait(ctx, generation), "barrier wait");
}
static int fence_wait(void *ctx, ps_fence_t *fence)
{
    push(CATEGORY_WAIT, "wait: fence", 0);
    return pop(original(ctx)->fence_wait(ctx, fence), "fence wait");
}
static int device_synchronize(void *ctx)
{
    push(CATEGORY_WAIT, "wait: device synchronize", 0);
    return pop(original(ctx)->device_synchronize(ctx), "cuCtxSynchronize");
}

/* Points each present entry at its wrapper (absent ones stay NULL: callers
 * test them). */
#define WRAP(entry)                                                                                                    \
    if (gpu->entry)                                                                                                    \
        gpu->entry = entry;

void ps_nvtx_ranges_wrap(ps_gpu_ops_t *gpu)
{
    pthread_mutex_lock(&append_lock);
    int n = atomic_load_explicit(&table_count, memory_order_relaxed);
    if (n == MAX_TABLES) {
        pthread_mutex_unlock(&append_lock);
        ps_warning("debug.nvtx_ranges: more than %d device tables (context resets); device %d gets no ranges",
                   MAX_TABLES, gpu->device);
        return;
    }
    if (!domain) {
        ps_in_shim++;
        domain = nvtxDomainCreateA("poolshim");
        for (size_t c = 1; c < sizeof categories / sizeof categories[0]; c++)
            nvtxDomainNameCategoryA(domain, (uint32_t)c, categories[c].name);
        ps_in_shim--;
    }
    originals[n] = *gpu;
    atomic_store_explicit(&table_count, n + 1, memory_order_release);
    pthread_mutex_unlock(&append_lock);
    WRAP(mem_alloc)
    WRAP(mem_free)
    WRAP(mem_alloc_managed)
    WRAP(vm_reserve)
    WRAP(vm_release)
    WRAP(vm_map)
    WRAP(vm_map_bare)
    WRAP(vm_access)
    WRAP(vm_map_handle)
    WRAP(vm_map_handle_bare)
    WRAP(vm_unmap)
    WRAP(vm_unmap_keep)
    WRAP(vm_drop)
    WRAP(host_alloc)
    WRAP(host_free)
    WRAP(host_vm_map)
    WRAP(barrier)
    WRAP(barrier_wait)
    WRAP(fence_wait)
    WRAP(device_synchronize)
}

#endif
