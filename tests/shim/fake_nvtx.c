/* A fake NVTX tool (what compute-sanitizer is to NVTX) for the shim's CPU
 * tests: loaded through NVTX_INJECTION64_PATH like the real one, it takes
 * the memory extension's heap and region calls and keeps a model of them,
 * checking what a sanitizer relies on:
 *   - heaps never overlap, and are unregistered by the handle they got;
 *   - a region lies inside the heap it was registered in and overlaps no
 *     live region; unregistering names a live region by its pointer;
 *   - unregistering a heap drops the regions still in it.
 * It also takes the core module's domain ranges (debug.nvtx_ranges): each
 * push is recorded with its message and category; a pop with no range open
 * on its thread is an error.
 * Every broken rule counts one error (and is printed). The test program
 * reads the model through the fake_nvtx_* functions below (dlopen the
 * same path with RTLD_NOLOAD). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>

#define MAX_HEAPS 4096
#define MAX_REGIONS 65536

typedef struct { uintptr_t base; size_t size; int live; } fake_heap_t;
typedef struct { uintptr_t ptr; size_t size; size_t heap; int live; } fake_region_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static fake_heap_t heaps[MAX_HEAPS];
static size_t heaps_used;
static fake_region_t regions[MAX_REGIONS];
static size_t regions_used;
static long errors;

#define ERROR(...)                                                                 \
    do {                                                                           \
        fprintf(stderr, "fake_nvtx: error: " __VA_ARGS__);                         \
        fprintf(stderr, "\n");                                                     \
        errors++;                                                                  \
    } while (0)

static nvtxMemHeapHandle_t heap_register(nvtxDomainHandle_t domain __attribute__((unused)), nvtxMemHeapDesc_t const *desc)
{
    pthread_mutex_lock(&lock);
    const nvtxMemVirtualRangeDesc_t *r = desc->typeSpecificDesc;
    if (desc->usage != NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR || desc->type != NVTX_MEM_TYPE_VIRTUAL_ADDRESS ||
        desc->typeSpecificDescSize != sizeof *r)
        ERROR("heap of usage %u type %u", desc->usage, desc->type);
    uintptr_t base = (uintptr_t)r->ptr;
    for (size_t i = 0; i < heaps_used; i++)
        if (heaps[i].live && base < heaps[i].base + heaps[i].size && heaps[i].base < base + r->size)
            ERROR("heap %#lx+%zu overlaps a live heap", (unsigned long)base, r->size);
    nvtxMemHeapHandle_t h = NULL;
    if (heaps_used < MAX_HEAPS) {
        heaps[heaps_used] = (fake_heap_t){base, r->size, 1};
        h = (nvtxMemHeapHandle_t)(uintptr_t)(++heaps_used); /* index + 1 */
    }
    pthread_mutex_unlock(&lock);
    return h;
}

static void heap_unregister(nvtxDomainHandle_t domain __attribute__((unused)), nvtxMemHeapHandle_t heap)
{
    pthread_mutex_lock(&lock);
    size_t i = (size_t)(uintptr_t)heap;
    if (i == 0 || i > heaps_used || !heaps[i - 1].live) {
        ERROR("unregister of an unknown heap %zu", i);
    } else {
        heaps[i - 1].live = 0;
        for (size_t k = 0; k < regions_used; k++)
            if (regions[k].live && regions[k].heap == i - 1)
                regions[k].live = 0;
    }
    pthread_mutex_unlock(&lock);
}

static void regions_register(nvtxDomainHandle_t domain __attribute__((unused)), nvtxMemRegionsRegisterBatch_t const *b)
{
    pthread_mutex_lock(&lock);
    size_t h = (size_t)(uintptr_t)b->heap;
    const nvtxMemVirtualRangeDesc_t *r = b->regionDescElements;
    for (size_t n = 0; n < b->regionCount; n++) {
        uintptr_t p = (uintptr_t)r[n].ptr;
        if (h == 0 || h > heaps_used || !heaps[h - 1].live) {
            ERROR("region %#lx in an unknown heap", (unsigned long)p);
            continue;
        }
        const fake_heap_t *heap = &heaps[h - 1];
        if (p < heap->base || p + r[n].size > heap->base + heap->size)
            ERROR("region %#lx+%zu outside its heap %#lx+%zu", (unsigned long)p, r[n].size,
                  (unsigned long)heap->base, heap->size);
        for (size_t k = 0; k < regions_used; k++)
            if (regions[k].live && p < regions[k].ptr + regions[k].size && regions[k].ptr < p + r[n].size)
                ERROR("region %#lx+%zu overlaps the live region %#lx+%zu", (unsigned long)p, r[n].size,
                      (unsigned long)regions[k].ptr, regions[k].size);
        if (regions_used < MAX_REGIONS)
            regions[regions_used++] = (fake_region_t){p, r[n].size, h - 1, 1};
    }
    pthread_mutex_unlock(&lock);
}

static void regions_unregister(nvtxDomainHandle_t domain __attribute__((unused)), nvtxMemRegionsUnregisterBatch_t const *b)
{
    pthread_mutex_lock(&lock);
    if (b->refType != NVTX_MEM_REGION_REF_TYPE_POINTER)
        ERROR("unregister by reference type %u", b->refType);
    for (size_t n = 0; n < b->refCount; n++) {
        uintptr_t p = (uintptr_t)b->refElements[n].pointer;
        int found = 0;
        for (size_t k = 0; k < regions_used && !found; k++)
            if (regions[k].live && regions[k].ptr == p)
                regions[k].live = 0, found = 1;
        if (!found)
            ERROR("unregister of %#lx, which is no live region", (unsigned long)p);
    }
    pthread_mutex_unlock(&lock);
}

/* ---- the core module: domains and ranges --------------------------------- */
#define MAX_RANGES 65536
typedef struct { char message[128]; uint32_t category; uint64_t ns; } fake_range_t; /* ns: its time, once popped */
static fake_range_t ranges[MAX_RANGES];
static size_t ranges_used, marks_used;
static __thread int depth; /* ranges open on this thread */
static int open_ranges;    /* over every thread (lock) */
#define MAX_DEPTH 16
static __thread struct { uint64_t at_ns; uint32_t category; size_t index; } open_stack[MAX_DEPTH]; /* this thread's open ranges */
static uint64_t category_ns[8]; /* time inside the ranges of each category (lock) */

static uint64_t clock_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static nvtxDomainHandle_t domain_create(const char *name __attribute__((unused)))
{
    static int one_domain;
    return (nvtxDomainHandle_t)&one_domain;
}
static void name_category(nvtxDomainHandle_t domain __attribute__((unused)), uint32_t c __attribute__((unused)),
                          const char *name __attribute__((unused)))
{
}
static int range_push(nvtxDomainHandle_t domain __attribute__((unused)), const nvtxEventAttributes_t *a)
{
    pthread_mutex_lock(&lock);
    size_t index = ranges_used < MAX_RANGES ? ranges_used : MAX_RANGES; /* MAX_RANGES: not kept */
    if (ranges_used < MAX_RANGES) {
        fake_range_t *r = &ranges[ranges_used++];
        snprintf(r->message, sizeof r->message, "%s",
                 a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii ? a->message.ascii : "");
        r->category = a->category;
    }
    open_ranges++;
    pthread_mutex_unlock(&lock);
    if (depth < MAX_DEPTH) {
        open_stack[depth].at_ns = clock_ns();
        open_stack[depth].category = a->category < 8 ? a->category : 0;
        open_stack[depth].index = index;
    }
    return depth++;
}
static int range_pop(nvtxDomainHandle_t domain __attribute__((unused)))
{
    pthread_mutex_lock(&lock);
    if (depth == 0)
        ERROR("a range popped with none open on its thread");
    else {
        depth--;
        open_ranges--;
        if (depth < MAX_DEPTH) {
            uint64_t ns = clock_ns() - open_stack[depth].at_ns;
            category_ns[open_stack[depth].category] += ns;
            if (open_stack[depth].index < MAX_RANGES)
                ranges[open_stack[depth].index].ns = ns;
        }
    }
    pthread_mutex_unlock(&lock);
    return depth;
}
static void mark(nvtxDomainHandle_t domain __attribute__((unused)), const nvtxEventAttributes_t *a __attribute__((unused)))
{
    pthread_mutex_lock(&lock);
    marks_used++;
    pthread_mutex_unlock(&lock);
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table)
{
    const NvtxExportTableCallbacks *callbacks = (const NvtxExportTableCallbacks *)get_export_table(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    if (!callbacks || !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) ||
        size <= NVTX_CBID_CORE2_DomainCreateA)
        return 0;
    *table[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)domain_create;
    *table[NVTX_CBID_CORE2_DomainNameCategoryA] = (NvtxFunctionPointer)name_category;
    *table[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)range_push;
    *table[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)range_pop;
    *table[NVTX_CBID_CORE2_DomainMarkEx] = (NvtxFunctionPointer)mark;
    return 1;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtxExtension(nvtxExtModuleInfo_t *info)
{
    if (info->moduleId != NVTX_EXT_MODULEID_MEM || info->segmentsCount < 1)
        return 1; /* other modules: leave their calls no-ops */
    intptr_t *slots = info->segments[0].functionSlots;
    slots[NVTX3EXT_CBID_nvtxMemHeapRegister] = (intptr_t)heap_register;
    slots[NVTX3EXT_CBID_nvtxMemHeapUnregister] = (intptr_t)heap_unregister;
    slots[NVTX3EXT_CBID_nvtxMemRegionsRegister] = (intptr_t)regions_register;
    slots[NVTX3EXT_CBID_nvtxMemRegionsUnregister] = (intptr_t)regions_unregister;
    return 1;
}

/* ---- what the test program reads ---------------------------------------- */
/* Bytes of the live region starting at `ptr` (0: none). A block that spans
 * two heaps (mapped pieces) is one region per heap: the parts that continue
 * exactly at the end of a heap are added. */
__attribute__((visibility("default"))) size_t fake_nvtx_region_size(const void *ptr)
{
    pthread_mutex_lock(&lock);
    size_t size = 0;
    uintptr_t at = (uintptr_t)ptr;
    for (int more = 1; more;) {
        more = 0;
        for (size_t k = 0; k < regions_used; k++)
            if (regions[k].live && regions[k].ptr == at && (at == (uintptr_t)ptr || size)) {
                size += regions[k].size;
                at += regions[k].size;
                const fake_heap_t *h = &heaps[regions[k].heap];
                more = at == h->base + h->size; /* the block may go on in the next heap */
                break;
            }
    }
    pthread_mutex_unlock(&lock);
    return size;
}

/* Whether `ptr` lies in a live heap. */
__attribute__((visibility("default"))) int fake_nvtx_in_heap(const void *ptr)
{
    pthread_mutex_lock(&lock);
    int in = 0;
    for (size_t i = 0; i < heaps_used && !in; i++)
        in = heaps[i].live && (uintptr_t)ptr >= heaps[i].base && (uintptr_t)ptr < heaps[i].base + heaps[i].size;
    pthread_mutex_unlock(&lock);
    return in;
}

__attribute__((visibility("default"))) size_t fake_nvtx_live_regions(void)
{
    pthread_mutex_lock(&lock);
    size_t n = 0;
    for (size_t k = 0; k < regions_used; k++)
        n += regions[k].live;
    pthread_mutex_unlock(&lock);
    return n;
}

__attribute__((visibility("default"))) size_t fake_nvtx_live_heaps(void)
{
    pthread_mutex_lock(&lock);
    size_t n = 0;
    for (size_t i = 0; i < heaps_used; i++)
        n += heaps[i].live;
    pthread_mutex_unlock(&lock);
    return n;
}

__attribute__((visibility("default"))) size_t fake_nvtx_heaps_registered(void)
{
    return heaps_used;
}

__attribute__((visibility("default"))) long fake_nvtx_errors(void)
{
    return errors;
}

/* Ranges pushed whose message starts with `prefix` ("" : all). */
__attribute__((visibility("default"))) size_t fake_nvtx_ranges(const char *prefix)
{
    pthread_mutex_lock(&lock);
    size_t n = 0;
    for (size_t k = 0; k < ranges_used; k++)
        n += strncmp(ranges[k].message, prefix, strlen(prefix)) == 0;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Ranges pushed and not popped, over every thread. */
__attribute__((visibility("default"))) int fake_nvtx_open_ranges(void)
{
    pthread_mutex_lock(&lock);
    int n = open_ranges;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Prints every range (a failed test shows what the tool saw). */
__attribute__((visibility("default"))) void fake_nvtx_print_ranges(FILE *f)
{
    pthread_mutex_lock(&lock);
    for (size_t k = 0; k < ranges_used; k++)
        fprintf(f, "fake_nvtx: range %zu: [%u] %s\n", k, ranges[k].category, ranges[k].message);
    fprintf(f, "fake_nvtx: %zu marks\n", marks_used);
    pthread_mutex_unlock(&lock);
}

/* FAKE_NVTX_SUMMARY=1: one line at exit with the ranges by category and the
 * rule breaks, for a program that cannot read the model itself (a PyTorch
 * loop on the GPU machine: tests/gpu/live_views.py). */
__attribute__((destructor)) static void print_summary(void)
{
    const char *want = getenv("FAKE_NVTX_SUMMARY");
    if (!want || *want != '1')
        return;
    size_t by_category[8] = {0};
    pthread_mutex_lock(&lock);
    for (size_t k = 0; k < ranges_used; k++)
        by_category[ranges[k].category < 8 ? ranges[k].category : 0]++;
    fprintf(stderr,
            "fake_nvtx: summary: ranges %zu: grow %zu remap %zu release %zu barrier %zu wait %zu; marks %zu; "
            "open %d; errors %ld\n",
            ranges_used, by_category[1], by_category[2], by_category[3], by_category[4], by_category[5], marks_used,
            open_ranges, errors);
    fprintf(stderr, "fake_nvtx: time in ranges (us): grow %.1f remap %.1f release %.1f barrier %.1f wait %.1f\n",
            category_ns[1] / 1e3, category_ns[2] / 1e3, category_ns[3] / 1e3, category_ns[4] / 1e3,
            category_ns[5] / 1e3);
    for (size_t k = 0; k < ranges_used && k < 12; k++)
        fprintf(stderr, "fake_nvtx: range %zu: %s (%.1f us)\n", k, ranges[k].message, ranges[k].ns / 1e3);
    pthread_mutex_unlock(&lock);
}
