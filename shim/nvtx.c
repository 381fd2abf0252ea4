/* NVTX memory annotations: compute-sanitizer sees the pool's blocks.
 *
 * Without them, memcheck knows only the memory the shim took from CUDA (a
 * chunk, a mapped piece of the expandable range): a kernel that writes past
 * its block into the next one, or into a block already freed, writes into
 * that chunk and is not reported. With debug.nvtx = on (POOLSHIM_NVTX=1,
 * `poolshim run --sanitize`) the shim tells the tool what it does, the way
 * NVIDIA's NVTX API for Compute Sanitizer expects a suballocator to:
 *
 * 1. Each piece of device memory the shim takes from CUDA (cuMemAlloc
 *    chunk, cuMemAllocManaged slab, each cuMemMap'd piece of an expandable
 *    range) is registered as a heap of usage SUB_ALLOCATOR
 *    (nvtxMemHeapRegister) in the domain "poolshim": the tool then treats
 *    it as not accessible until regions are registered in it.
 * 2. Each block handed to the program is registered as a region
 *    (nvtxMemRegionsRegister) of exactly the bytes asked for, in the heap
 *    that holds it; a block that spans two mapped pieces is registered as
 *    one region per piece. Alignment padding stays outside every region,
 *    so a one-element overflow is reported even when it stays inside the
 *    block's rounded size.
 * 3. A free unregisters the block's regions (nvtxMemRegionsUnregister)
 *    before the pool takes it back: a later access is a use after free.
 * 4. When memory goes back to CUDA (cuMemFree, cuMemUnmap) its heap is
 *    unregistered (which drops any region still in it); when a context
 *    dies, every heap of its device is forgotten.
 * NVTX calls run with ps_in_shim raised: a CUDA call the tool makes from
 * inside them passes straight through, like the shim's own.
 * Heaps are kept in an array sorted by address under one lock; it is
 * touched only when the option is on. Off (the default), the callers test
 * ps_nvtx_on and call nothing here: no cost but one predictable branch.
 *
 * NVTX v3 is header-only (CUDA's include/nvtx3): the first call looks for
 * a tool through NVTX_INJECTION64_PATH, which compute-sanitizer sets; with
 * no tool attached every call returns at once. The shim gains no library
 * dependency. Built without the headers (PS_NO_NVTX), turning the option on
 * prints one warning and does nothing.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "nvtx.h"

int ps_nvtx_on;

#ifdef PS_NO_NVTX

void ps_nvtx_enable(void)
{
    ps_warning("debug.nvtx: this build has no NVTX headers (CUDA's include/nvtx3); the option does nothing");
}
void ps_nvtx_heap_add(void *base, size_t size, int device) { (void)base, (void)size, (void)device; }
void ps_nvtx_heap_remove(void *base) { (void)base; }
void ps_nvtx_region_add(void *ptr, size_t size) { (void)ptr, (void)size; }
void ps_nvtx_region_remove(void *ptr, size_t size) { (void)ptr, (void)size; }
void ps_nvtx_drop_device(int device) { (void)device; }
size_t ps_nvtx_heap_count(void) { return 0; }

#else

#include <nvtx3/nvToolsExtMem.h>

typedef struct heap {
    uintptr_t base;             /* first byte */
    size_t size;                /* bytes */
    int device;                 /* device whose memory it is */
    nvtxMemHeapHandle_t handle; /* the tool's handle (NULL-like without a tool: never used then) */
} heap_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static heap_t *heaps;          /* sorted by base, disjoint */
static size_t heap_count;      /* entries in use */
static size_t heap_capacity;   /* entries allocated */
static nvtxDomainHandle_t domain; /* "poolshim", created on first use (lock held) */

void ps_nvtx_enable(void)
{
    ps_nvtx_on = 1;
}

static nvtxDomainHandle_t get_domain(void) /* lock held */
{
    if (!domain)
        domain = nvtxDomainCreateA("poolshim");
    return domain;
}

/* Index of the first heap whose end is above `addr` (lock held). */
static size_t first_ending_after(uintptr_t addr)
{
    size_t lo = 0, hi = heap_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (heaps[mid].base + heaps[mid].size <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void ps_nvtx_heap_add(void *base, size_t size, int device)
{
    if (!base || !size)
        return;
    pthread_mutex_lock(&lock);
    if (heap_count == heap_capacity) {
        size_t cap = heap_capacity ? 2 * heap_capacity : 64;
        heap_t *grown = realloc(heaps, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&lock);
            ps_warning("debug.nvtx: out of host memory; a chunk of device %d is not shown to the tool", device);
            return;
        }
        heaps = grown;
        heap_capacity = cap;
    }
    nvtxMemVirtualRangeDesc_t range = {size, base};
    nvtxMemHeapDesc_t desc;
    memset(&desc, 0, sizeof desc);
    desc.extCompatID = NVTX_EXT_COMPATID_MEM;
    desc.structSize = sizeof desc;
    desc.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
    desc.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    desc.typeSpecificDescSize = sizeof range;
    desc.typeSpecificDesc = &range;
    ps_in_shim++; /* whatever the tool calls in CUDA is not the program's */
    nvtxMemHeapHandle_t h = nvtxMemHeapRegister(get_domain(), &desc);
    ps_in_shim--;
    size_t i = first_ending_after((uintptr_t)base);
    memmove(&heaps[i + 1], &heaps[i], (heap_count - i) * sizeof *heaps);
    heaps[i] = (heap_t){(uintptr_t)base, size, device, h};
    heap_count++;
    pthread_mutex_unlock(&lock);
}

static void remove_at(size_t i) /* lock held */
{
    ps_in_shim++;
    nvtxMemHeapUnregister(get_domain(), heaps[i].handle);
    ps_in_shim--;
    memmove(&heaps[i], &heaps[i + 1], (heap_count - i - 1) * sizeof *heaps);
    heap_count--;
}

void ps_nvtx_heap_remove(void *base)
{
    pthread_mutex_lock(&lock);
    size_t i = first_ending_after((uintptr_t)base);
    if (i < heap_count && heaps[i].base == (uintptr_t)base)
        remove_at(i);
    pthread_mutex_unlock(&lock);
}

void ps_nvtx_drop_device(int device)
{
    pthread_mutex_lock(&lock);
    for (size_t i = heap_count; i-- > 0;)
        if (heaps[i].device == device)
            remove_at(i);
    pthread_mutex_unlock(&lock);
}

enum { REGIONS_REMOVE = 0, REGIONS_ADD = 1 }; /* what regions does */

/* Registers (REGIONS_ADD) or unregisters the parts of [ptr, ptr + size) that
 * lie in our heaps, one region per heap (2. and 3. above). */
static void regions(void *ptr, size_t size, int what)
{
    if (!ptr || !size)
        return; /* a size-0 block may not be dereferenced: nothing to show */
    uintptr_t start = (uintptr_t)ptr, end = start + size;
    ps_in_shim++; /* whatever the tool calls in CUDA is not the program's */
    pthread_mutex_lock(&lock);
    for (size_t i = first_ending_after(start); i < heap_count && heaps[i].base < end; i++) {
        uintptr_t lo = start > heaps[i].base ? start : heaps[i].base;
        uintptr_t hi = end < heaps[i].base + heaps[i].size ? end : heaps[i].base + heaps[i].size;
        if (what == REGIONS_ADD) {
            nvtxMemVirtualRangeDesc_t range = {hi - lo, (const void *)lo};
            nvtxMemRegionsRegisterBatch_t batch;
            memset(&batch, 0, sizeof batch);
            batch.extCompatID = NVTX_EXT_COMPATID_MEM;
            batch.structSize = sizeof batch;
            batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
            batch.heap = heaps[i].handle;
            batch.regionCount = 1;
            batch.regionDescElementSize = sizeof range;
            batch.regionDescElements = &range;
            nvtxMemRegionsRegister(get_domain(), &batch);
        } else {
            nvtxMemRegionRef_t ref;
            ref.pointer = (const void *)lo;
            nvtxMemRegionsUnregisterBatch_t batch;
            memset(&batch, 0, sizeof batch);
            batch.extCompatID = NVTX_EXT_COMPATID_MEM;
            batch.structSize = sizeof batch;
            batch.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
            batch.refCount = 1;
            batch.refElementSize = sizeof ref;
            batch.refElements = &ref;
            nvtxMemRegionsUnregister(get_domain(), &batch);
        }
    }
    pthread_mutex_unlock(&lock);
    ps_in_shim--;
}

void ps_nvtx_region_add(void *ptr, size_t size)
{
    regions(ptr, size, REGIONS_ADD);
}

void ps_nvtx_region_remove(void *ptr, size_t size)
{
    regions(ptr, size, REGIONS_REMOVE);
}

size_t ps_nvtx_heap_count(void)
{
    pthread_mutex_lock(&lock);
    size_t n = heap_count;
    pthread_mutex_unlock(&lock);
    return n;
}

#endif
