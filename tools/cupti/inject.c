/* libpoolshim_cupti.so: an allocation profiler that CUDA loads by itself
 * through CUDA_INJECTION64_PATH, used by `poolshim ab` to time the
 * baseline (no shim) and to see what still reaches CUDA under the shim.
 *
 * Algorithm:
 *   1. CUDA calls InitializeInjection() at cuInit. We subscribe one CUPTI
 *      callback and enable it for the runtime CBIDs cudaMalloc, cudaFree,
 *      cudaMallocAsync(_ptsz), cudaFreeAsync(_ptsz) and the driver CBIDs
 *      cuMemAlloc_v2, cuMemFree_v2, cuMemAllocAsync(_ptsz),
 *      cuMemFreeAsync(_ptsz), and register an atexit writer.
 *   2. On API enter we store the monotonic time in the callback's
 *      correlationData slot (CUPTI keeps it per call and thread); on exit
 *      we add exit - enter to the call's counters (atomics, no lock).
 *   3. A runtime call runs driver calls inside it. A thread-local depth
 *      counter marks "inside a runtime callback"; driver callbacks seen at
 *      depth > 0 are not counted, so each program call is counted once.
 *   4. Successful allocations record pointer -> size in an open-addressing
 *      hash table (one mutex, taken only on those calls); frees look the
 *      size up, so bytes outstanding and their peak are exact.
 *   5. At exit the counters are written as one JSON object to the file
 *      named by POOLSHIM_CUPTI_OUT (%p = pid), else to stderr. Nothing
 *      calls CUDA at exit.
 *
 * Guarantees: thread-safe; adds two clock reads and a few atomics per
 * allocation call; never changes the program's results (a failure inside
 * the profiler only loses statistics).
 */
#include <cupti.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PS_EXPORT __attribute__((visibility("default")))

/* The calls we watch, in the order of the JSON output. */
enum watched_call {
    CALL_CUDA_MALLOC, CALL_CUDA_FREE, CALL_CUDA_MALLOC_ASYNC, CALL_CUDA_FREE_ASYNC,
    CALL_CU_MEM_ALLOC, CALL_CU_MEM_FREE, CALL_CU_MEM_ALLOC_ASYNC, CALL_CU_MEM_FREE_ASYNC,
    CALL_COUNT
};
static const char *const call_names[CALL_COUNT] = {
    "cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync",
    "cuMemAlloc", "cuMemFree", "cuMemAllocAsync", "cuMemFreeAsync",
};

/* Counters of one watched call. */
typedef struct call_counter {
    atomic_uint_fast64_t calls;    /* completed calls */
    atomic_uint_fast64_t time_ns;  /* summed enter->exit time */
    atomic_uint_fast64_t failures; /* calls that returned an error */
} call_counter_t;

/* One slot of the pointer -> size table. */
typedef struct pointer_slot {
    uintptr_t pointer; /* 0 = empty, UINTPTR_MAX = deleted */
    size_t size;       /* bytes the allocation asked for */
} pointer_slot_t;

/* All state of the profiler. */
static struct {
    call_counter_t counters[CALL_COUNT]; /* per watched call */
    uint64_t start_ns;                   /* when InitializeInjection ran */
    pthread_mutex_t table_lock;          /* guards the pointer table and byte counters */
    pointer_slot_t *table;               /* open addressing, capacity a power of two */
    size_t table_capacity;               /* slots in table */
    size_t table_used;                   /* live + deleted slots */
    uint64_t bytes_current;              /* bytes allocated and not yet freed */
    uint64_t bytes_peak;                 /* maximum of bytes_current */
    uint64_t bytes_total;                /* bytes allocated over the run */
    atomic_ullong driver_calls;          /* successful driver-level allocation calls, nested ones
                                            included: what really reached the driver */
    CUpti_SubscriberHandle subscriber;   /* our CUPTI subscription */
    int initialized;                     /* InitializeInjection ran once */
} profiler = {.table_lock = PTHREAD_MUTEX_INITIALIZER};

/* Depth of runtime callbacks on this thread (driver calls inside are not counted). */
static __thread int runtime_depth;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static size_t slot_of(uintptr_t pointer, size_t capacity)
{
    uint64_t h = (uint64_t)pointer * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (capacity - 1);
}

/* Inserts without growing; the caller holds table_lock and made room. */
static void table_put_locked(pointer_slot_t *table, size_t capacity, uintptr_t pointer, size_t size)
{
    size_t i = slot_of(pointer, capacity);
    while (table[i].pointer != 0 && table[i].pointer != UINTPTR_MAX && table[i].pointer != pointer)
        i = (i + 1) & (capacity - 1);
    table[i].pointer = pointer;
    table[i].size = size;
}

/* Records an allocation; the caller holds table_lock. */
static void record_allocation_locked(uintptr_t pointer, size_t size)
{
    if ((profiler.table_used + 1) * 2 > profiler.table_capacity) {
        size_t capacity = profiler.table_capacity ? profiler.table_capacity * 2 : 4096;
        pointer_slot_t *table = calloc(capacity, sizeof *table);
        if (!table)
            return; /* statistics only: lose this one rather than fail the program */
        size_t used = 0;
        for (size_t i = 0; i < profiler.table_capacity; i++)
            if (profiler.table[i].pointer != 0 && profiler.table[i].pointer != UINTPTR_MAX) {
                table_put_locked(table, capacity, profiler.table[i].pointer, profiler.table[i].size);
                used++;
            }
        free(profiler.table);
        profiler.table = table;
        profiler.table_capacity = capacity;
        profiler.table_used = used;
    }
    table_put_locked(profiler.table, profiler.table_capacity, pointer, size);
    profiler.table_used++;
    profiler.bytes_current += size;
    profiler.bytes_total += size;
    if (profiler.bytes_current > profiler.bytes_peak)
        profiler.bytes_peak = profiler.bytes_current;
}

/* Records a free; unknown pointers (allocated before injection) are ignored. */
static void record_free_locked(uintptr_t pointer)
{
    if (!profiler.table_capacity || pointer == 0)
        return;
    size_t i = slot_of(pointer, profiler.table_capacity);
    while (profiler.table[i].pointer != 0) {
        if (profiler.table[i].pointer == pointer) {
            profiler.bytes_current -= profiler.table[i].size;
            profiler.table[i].pointer = UINTPTR_MAX;
            return;
        }
        i = (i + 1) & (profiler.table_capacity - 1);
    }
}

/* Classifies a callback: which watched call, whether it allocates, and
 * where its pointer and size are. Returns -1 for calls we do not watch. */
static int classify(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *params,
                    void ***out_pointer, uintptr_t *freed_pointer, size_t *size)
{
    *out_pointer = NULL;
    *freed_pointer = 0;
    *size = 0;
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
        switch (cbid) {
        case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020: {
            const cudaMalloc_v3020_params *p = params;
            *out_pointer = p->devPtr;
            *size = p->size;
            return CALL_CUDA_MALLOC;
        }
        case CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020:
            *freed_pointer = (uintptr_t)((const cudaFree_v3020_params *)params)->devPtr;
            return CALL_CUDA_FREE;
        case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020: {
            const cudaMallocAsync_v11020_params *p = params; /* same layout as _ptsz */
            *out_pointer = p->devPtr;
            *size = p->size;
            return CALL_CUDA_MALLOC_ASYNC;
        }
        case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020:
            *freed_pointer = (uintptr_t)((const cudaFreeAsync_v11020_params *)params)->devPtr;
            return CALL_CUDA_FREE_ASYNC;
        default:
            return -1;
        }
    }
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
        switch (cbid) {
        case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2: {
            const cuMemAlloc_v2_params *p = params;
            *out_pointer = (void **)p->dptr;
            *size = p->bytesize;
            return CALL_CU_MEM_ALLOC;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
            *freed_pointer = (uintptr_t)((const cuMemFree_v2_params *)params)->dptr;
            return CALL_CU_MEM_FREE;
        case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync:
        case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz: {
            const cuMemAllocAsync_params *p = params; /* same layout as _ptsz */
            *out_pointer = (void **)p->dptr;
            *size = p->bytesize;
            return CALL_CU_MEM_ALLOC_ASYNC;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync:
        case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz:
            *freed_pointer = (uintptr_t)((const cuMemFreeAsync_params *)params)->dptr;
            return CALL_CU_MEM_FREE_ASYNC;
        default:
            return -1;
        }
    }
    return -1;
}

static void CUPTIAPI on_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const void *cbdata_opaque)
{
    (void)userdata;
    const CUpti_CallbackData *cbdata = cbdata_opaque;
    void **out_pointer;
    uintptr_t freed_pointer;
    size_t size;
    int call = classify(domain, cbid, cbdata->functionParams, &out_pointer, &freed_pointer, &size);
    if (call < 0)
        return;
    int is_runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;

    if (cbdata->callbackSite == CUPTI_API_ENTER) {
        if (is_runtime)
            runtime_depth++;
        else if (runtime_depth > 0)
            return; /* a driver call made by a runtime call we already time */
        *cbdata->correlationData = now_ns();
        return;
    }

    /* CUPTI_API_EXIT */
    uint64_t end = now_ns();
    if (!is_runtime && (!cbdata->functionReturnValue || *(const int *)cbdata->functionReturnValue == 0))
        atomic_fetch_add(&profiler.driver_calls, 1); /* under the shim, static cudart's runtime
                                                        calls are served without reaching here */
    if (is_runtime) {
        if (runtime_depth > 0)
            runtime_depth--;
    } else if (runtime_depth > 0) {
        return;
    }
    uint64_t start = *cbdata->correlationData;
    call_counter_t *counter = &profiler.counters[call];
    atomic_fetch_add(&counter->calls, 1);
    atomic_fetch_add(&counter->time_ns, start && end > start ? end - start : 0);
    int status = cbdata->functionReturnValue ? *(const int *)cbdata->functionReturnValue : 0;
    if (status != 0) {
        atomic_fetch_add(&counter->failures, 1);
        return;
    }
    pthread_mutex_lock(&profiler.table_lock);
    if (out_pointer) {
        uintptr_t pointer = 0;
        memcpy(&pointer, out_pointer, sizeof pointer); /* void* and CUdeviceptr are both 64-bit */
        if (pointer)
            record_allocation_locked(pointer, size);
    } else {
        record_free_locked(freed_pointer);
    }
    pthread_mutex_unlock(&profiler.table_lock);
}

/* Expands %p in the output path. */
static void output_path(char *out, size_t outsize)
{
    const char *pattern = getenv("POOLSHIM_CUPTI_OUT");
    out[0] = '\0';
    if (!pattern || !*pattern)
        return;
    size_t n = 0;
    for (const char *c = pattern; *c && n + 24 < outsize; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            n += (size_t)snprintf(out + n, outsize - n, "%ld", (long)getpid());
            c++;
        } else {
            out[n++] = *c;
        }
    }
    out[n] = '\0';
}

static void write_report(void)
{
    char path[4096];
    output_path(path, sizeof path);
    FILE *f = path[0] ? fopen(path, "w") : stderr;
    if (!f) {
        fprintf(stderr, "poolshim: error: cupti: cannot write %s\n", path);
        return;
    }
    uint64_t alloc_calls = 0, free_calls = 0, alloc_ns = 0, free_ns = 0, failures = 0;
    fprintf(f, "{\"poolshim_cupti\": 1, \"pid\": %ld, \"wall_ns\": %llu, \"calls\": {", (long)getpid(),
            (unsigned long long)(now_ns() - profiler.start_ns));
    for (int i = 0; i < CALL_COUNT; i++)
        fprintf(f, "%s\"%s\": %llu", i ? ", " : "", call_names[i],
                (unsigned long long)atomic_load(&profiler.counters[i].calls));
    fprintf(f, "}, \"time_ns\": {");
    for (int i = 0; i < CALL_COUNT; i++) {
        uint64_t calls = atomic_load(&profiler.counters[i].calls);
        uint64_t ns = atomic_load(&profiler.counters[i].time_ns);
        failures += atomic_load(&profiler.counters[i].failures);
        fprintf(f, "%s\"%s\": %llu", i ? ", " : "", call_names[i], (unsigned long long)ns);
        int is_free = (i % 2) == 1; /* names alternate allocate, free */
        if (is_free) {
            free_calls += calls;
            free_ns += ns;
        } else {
            alloc_calls += calls;
            alloc_ns += ns;
        }
    }
    pthread_mutex_lock(&profiler.table_lock);
    fprintf(f,
            "}, \"alloc_calls\": %llu, \"free_calls\": %llu, \"alloc_time_ns\": %llu, "
            "\"free_time_ns\": %llu, \"failures\": %llu, \"driver_calls\": %llu, "
            "\"bytes\": {\"current\": %llu, \"peak\": %llu, \"total\": %llu}}\n",
            (unsigned long long)alloc_calls, (unsigned long long)free_calls,
            (unsigned long long)alloc_ns, (unsigned long long)free_ns,
            (unsigned long long)failures, (unsigned long long)atomic_load(&profiler.driver_calls),
            (unsigned long long)profiler.bytes_current,
            (unsigned long long)profiler.bytes_peak, (unsigned long long)profiler.bytes_total);
    pthread_mutex_unlock(&profiler.table_lock);
    if (f != stderr)
        fclose(f);
}

static int enable(CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
    return cuptiEnableCallback(1, profiler.subscriber, domain, cbid) == CUPTI_SUCCESS ? 0 : -1;
}

/* Entry point CUDA calls when it loads us through CUDA_INJECTION64_PATH. */
PS_EXPORT int InitializeInjection(void)
{
    if (profiler.initialized)
        return 1;
    profiler.initialized = 1;
    profiler.start_ns = now_ns();
    if (cuptiSubscribe(&profiler.subscriber, (CUpti_CallbackFunc)on_callback, NULL) != CUPTI_SUCCESS) {
        fprintf(stderr, "poolshim: error: cupti: cuptiSubscribe failed (another profiler attached?)\n");
        return 0;
    }
    static const CUpti_CallbackId runtime_ids[] = {
        CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020,
        CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020,
        CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020,
        CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020,
        CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020,
        CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020,
    };
    static const CUpti_CallbackId driver_ids[] = {
        CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2,
        CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
        CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync,
        CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz,
        CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync,
        CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz,
    };
    int failed = 0;
    for (size_t i = 0; i < sizeof runtime_ids / sizeof runtime_ids[0]; i++)
        failed |= enable(CUPTI_CB_DOMAIN_RUNTIME_API, runtime_ids[i]);
    for (size_t i = 0; i < sizeof driver_ids / sizeof driver_ids[0]; i++)
        failed |= enable(CUPTI_CB_DOMAIN_DRIVER_API, driver_ids[i]);
    if (failed)
        fprintf(stderr, "poolshim: warning: cupti: some callbacks could not be enabled\n");
    atexit(write_report);
    return 1;
}
