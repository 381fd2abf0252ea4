/* A fake libcuda.so.1 over host memory, for the shim's CPU tests.
 *
 * It behaves like the driver where the shim depends on it: contexts are
 * per thread (primary context per device), memory is real host memory
 * (so test programs can write and verify it), cuMemFree of an unknown
 * pointer fails, cuGetProcAddress_v2 resolves names by cudaVersion and
 * flags (per-thread default stream -> the _ptsz variants), events complete
 * when queried unless FAKE_CUDA_EVENTS_PENDING=N makes each event report
 * "not ready" N times first. fake_cuda_counters() lets tests see what
 * really reached the "driver" (e.g. that an allocation was routed once).
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../shim/cuda_abi.h"
#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEV 4
#define MAX_LIVE 65536

struct CUctx_st { int device; };
struct CUevent_st { atomic_int pending; };
struct CUstream_st { unsigned flags; CUcontext ctx; int capturing; };

static struct CUctx_st primary[MAX_DEV] = {{0}, {1}, {2}, {3}};
static __thread CUcontext current;
static __thread CUcontext stack_saved[16];
static __thread int stack_depth;
static int initialised;
static fake_cuda_counters_t counters;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct { uintptr_t ptr; size_t size; } live[MAX_LIVE];
static size_t outstanding;

#define TOTAL_MEMORY ((size_t)4 << 30) /* the fake device's size */

EXPORT fake_cuda_counters_t *fake_cuda_counters(void) { return &counters; }

static int device_count(void)
{
    const char *n = getenv("FAKE_CUDA_DEVICES");
    int d = n ? atoi(n) : 2;
    return d < 1 ? 1 : d > MAX_DEV ? MAX_DEV : d;
}

EXPORT CUresult cuInit(unsigned int flags)
{
    (void)flags;
    initialised = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n)
{
    *n = device_count();
    return CUDA_SUCCESS;
}

static CUresult do_alloc(CUdeviceptr *p, size_t size)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!size)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    size_t limit = getenv("FAKE_CUDA_MEMORY") ? strtoull(getenv("FAKE_CUDA_MEMORY"), NULL, 0) : TOTAL_MEMORY;
    if (outstanding + size > limit) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t align = size >= (2u << 20) ? (2u << 20) : 512;
    void *m = aligned_alloc(align, (size + align - 1) / align * align);
    if (!m) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t i = 0;
    while (i < MAX_LIVE && live[i].ptr)
        i++;
    if (i == MAX_LIVE) {
        free(m);
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    live[i].ptr = (uintptr_t)m;
    live[i].size = size;
    outstanding += size;
    counters.mem_alloc++;
    pthread_mutex_unlock(&lock);
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

static CUresult do_free(CUdeviceptr p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_LIVE; i++)
        if (live[i].ptr == (uintptr_t)p) {
            outstanding -= live[i].size;
            live[i].ptr = 0;
            counters.mem_free++;
            pthread_mutex_unlock(&lock);
            free((void *)(uintptr_t)p);
            return CUDA_SUCCESS;
        }
    counters.bad_free++;
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) { return do_alloc(p, size); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return do_free(p); }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags)
{
    (void)flags;
    return do_alloc(p, size);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s)
{
    (void)s;
    counters.mem_alloc_async++;
    return do_alloc(p, size);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream s)
{
    (void)s;
    counters.mem_alloc_async_ptsz++;
    return do_alloc(p, size);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    (void)s;
    return do_free(p);
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    (void)s;
    return do_free(p);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    pthread_mutex_lock(&lock);
    *free_bytes = TOTAL_MEMORY - outstanding;
    *total = TOTAL_MEMORY;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_LIVE; i++)
        if (live[i].ptr && p >= live[i].ptr && p - live[i].ptr < live[i].size) {
            if (base)
                *base = live[i].ptr;
            if (size)
                *size = live[i].size;
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
    CUdeviceptr base;
    if (cuMemGetAddressRange_v2(&base, NULL, p) != CUDA_SUCCESS || base != p)
        return CUDA_ERROR_INVALID_VALUE;
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &p, sizeof p);
    return CUDA_SUCCESS;
}

/* contexts */
EXPORT CUresult cuCtxGetCurrent(CUcontext *c)
{
    *c = current;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
    current = c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = current->device;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c)
{
    if (stack_depth == 16)
        return CUDA_ERROR_INVALID_VALUE;
    stack_saved[stack_depth++] = current;
    current = c;
    counters.ctx_push++;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
    if (!stack_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (c)
        *c = current;
    current = stack_saved[--stack_depth];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void)
{
    counters.ctx_sync++;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= device_count())
        return CUDA_ERROR_INVALID_VALUE;
    *c = &primary[d];
    return CUDA_SUCCESS;
}

/* events and streams */
EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    (void)flags;
    *e = calloc(1, sizeof **e);
    return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
    if (s && (uintptr_t)s > 2 && s->capturing)
        return CUDA_ERROR_NOT_SUPPORTED;
    const char *p = getenv("FAKE_CUDA_EVENTS_PENDING");
    atomic_store(&e->pending, p ? atoi(p) : 0);
    counters.event_record++;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventQuery(CUevent e)
{
    counters.event_query++;
    if (atomic_load(&e->pending) > 0) {
        atomic_fetch_sub(&e->pending, 1);
        return CUDA_ERROR_NOT_READY;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventSynchronize(CUevent e)
{
    atomic_store(&e->pending, 0);
    counters.event_sync++;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    free(e);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f)
{
    (void)s, (void)e, (void)f;
    counters.stream_wait++;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int prio)
{
    (void)prio;
    *s = calloc(1, sizeof **s);
    (*s)->flags = flags;
    (*s)->ctx = current;
    counters.stream_create++;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) { return cuStreamCreateWithPriority(s, flags, 0); }
EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    free(s);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *c)
{
    *c = (uintptr_t)s > 2 ? s->ctx : current;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
    *st = (uintptr_t)s > 2 && s->capturing ? 1 : 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st) { return cuStreamIsCapturing(s, st); }
EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *m)
{
    (void)m;
    return CUDA_SUCCESS;
}
/* test control: mark a stream as being captured into a graph */
EXPORT void fake_cuda_set_capturing(CUstream s, int on) { s->capturing = on; }

/* cuGetProcAddress: names resolved like the driver, by version and flags */
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);

static const struct { const char *name; void *fn; int min_version; } table[] = {
    {"cuInit", (void *)cuInit, 2000},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount, 2000},
    {"cuMemAlloc", (void *)cuMemAlloc_v2, 3020},
    {"cuMemFree", (void *)cuMemFree_v2, 3020},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged, 6000},
    {"cuMemGetInfo", (void *)cuMemGetInfo_v2, 3020},
    {"cuMemGetAddressRange", (void *)cuMemGetAddressRange_v2, 3020},
    {"cuIpcGetMemHandle", (void *)cuIpcGetMemHandle, 4010},
    {"cuCtxGetCurrent", (void *)cuCtxGetCurrent, 4000},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent, 4000},
    {"cuCtxGetDevice", (void *)cuCtxGetDevice, 2000},
    {"cuCtxPushCurrent", (void *)cuCtxPushCurrent_v2, 4000},
    {"cuCtxPopCurrent", (void *)cuCtxPopCurrent_v2, 4000},
    {"cuCtxSynchronize", (void *)cuCtxSynchronize, 2000},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain, 7000},
    {"cuEventCreate", (void *)cuEventCreate, 2000},
    {"cuEventRecord", (void *)cuEventRecord, 2000},
    {"cuEventQuery", (void *)cuEventQuery, 2000},
    {"cuEventSynchronize", (void *)cuEventSynchronize, 2000},
    {"cuEventDestroy", (void *)cuEventDestroy_v2, 4000},
    {"cuStreamWaitEvent", (void *)cuStreamWaitEvent, 3020},
    {"cuStreamCreate", (void *)cuStreamCreate, 2000},
    {"cuStreamCreateWithPriority", (void *)cuStreamCreateWithPriority, 5050},
    {"cuStreamDestroy", (void *)cuStreamDestroy_v2, 4000},
    {"cuStreamGetCtx", (void *)cuStreamGetCtx, 9020},
    {"cuThreadExchangeStreamCaptureMode", (void *)cuThreadExchangeStreamCaptureMode, 10010},
    {"cuGetProcAddress", (void *)cuGetProcAddress_v2, 12000},
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    counters.get_proc_address++;
    int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    void *fn = NULL;
    if (strcmp(symbol, "cuMemAllocAsync") == 0 && version >= 11020)
        fn = ptds ? (void *)cuMemAllocAsync_ptsz : (void *)cuMemAllocAsync;
    else if (strcmp(symbol, "cuMemFreeAsync") == 0 && version >= 11020)
        fn = ptds ? (void *)cuMemFreeAsync_ptsz : (void *)cuMemFreeAsync;
    else if (strcmp(symbol, "cuStreamIsCapturing") == 0 && version >= 10000)
        fn = ptds ? (void *)cuStreamIsCapturing_ptsz : (void *)cuStreamIsCapturing;
    else
        for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
            if (strcmp(table[i].name, symbol) == 0 && version >= table[i].min_version)
                fn = table[i].fn;
    if (status)
        *status = fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *pfn = fn;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
