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
 *
 * Contexts live and die like the driver's: a primary context is retained
 * and released (the last release destroys it), cuDevicePrimaryCtxReset
 * destroys it whatever the count (the references from before stay owed:
 * releasing them later is allowed and does not touch the new context, as
 * the driver documents), and the handle stays the same when it is
 * made again (as on the GPU). Destroying a context frees its memory and
 * kills its events and streams; any later call on a dead object returns
 * CUDA_ERROR_CONTEXT_IS_DESTROYED and is counted in `dead_calls` (printed
 * at exit when nonzero). cuCtxCreate makes non-primary contexts. With
 * FAKE_CUDA_SETFLAGS_RECREATES=1, cuDevicePrimaryCtxSetFlags on an active
 * primary context destroys and recreates it.
 * FAKE_CUDA_OBJECT_DELAY_US=N makes every call on an event or a stream
 * (and cuEventCreate) sleep N microseconds before it looks at its objects:
 * it widens the window in which a context may die under a caller that
 * already decided to call (tests/stress/context_reset_stress.c).
 * FAKE_CUDA_LIFECYCLE_DELAY_US=N makes cuDevicePrimaryCtxRelease and
 * cuDevicePrimaryCtxReset sleep N microseconds first (another thread acts
 * while the shim is inside them).
 *
 * Process life: in the child of a fork() after cuInit, every entry point
 * answers CUDA_ERROR_NOT_INITIALIZED without touching the parent's state
 * (CUDA cannot be used in such a child), counted in `child_calls`. The
 * fake libcudart's teardown at exit calls fake_cuda_runtime_torn_down();
 * every entry-point call after it is counted in `calls_after_teardown`
 * and printed at exit when nonzero.
 *
 * Virtual memory (only with FAKE_CUDA_VMM=1, so other tests keep the
 * chunked pool): the device reports VMM support and, unless
 * FAKE_CUDA_VMM_NO_FD=1, POSIX file descriptor handles (with
 * FAKE_CUDA_VMM_REFUSE_FD=1 it reports them but cuMemCreate refuses them). cuMemAddressReserve
 * takes inaccessible address space; cuMemCreate makes a memfd of the size;
 * cuMemMap maps it shared at the address, cuMemSetAccess opens it,
 * cuMemUnmap closes it again. cuMemExportToShareableHandle gives a dup of
 * the memfd (only when cuMemCreate asked for that handle type, as the driver
 * does) and cuMemImportFromShareableHandle takes one: so two processes
 * really share the bytes, as on a GPU. Legacy IPC: cuIpcGetMemHandle
 * writes the pointer and "FAKEIPC"; cuIpcOpenMemHandle answers such a
 * handle with that pointer (meaningful in the same process only) and
 * anything else with "invalid value"; both open and close are counted.
 *
 * A device shared by several processes (FAKE_CUDA_SHARED_CAPACITY_FILE=
 * path): every device allocation is charged to a table in that file, one
 * record per process, under flock; a charge that would take the live
 * processes' sum past FAKE_CUDA_MEMORY fails "out of memory", so two test
 * programs starve each other as on one GPU. A dead process's record no
 * longer counts (the driver frees its memory when it ends). cuMemGetInfo
 * answers from the table then. cuDeviceGetUuid(_v2): "FAKE", a group (the
 * shared file's name, else the process: unshared devices differ between
 * processes), and the physical device index: ordinal d is physical
 * FAKE_CUDA_FIRST_DEVICE + d (as CUDA_VISIBLE_DEVICES=N,... would make it).
 */
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../shim/cuda_abi.h"
#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))
#define CUDA_ERROR_INVALID_DEVICE 101
#define MAX_DEV 4
#define MAX_LIVE 65536

struct CUctx_st {
    int device;
    int is_primary;
    atomic_int refs;               /* primary: retains; created: 1 until destroyed */
    int stale_refs;                /* references from before a reset: their release does nothing */
    atomic_uint gen;               /* +1 each time it is destroyed */
    atomic_ullong id;              /* unique per incarnation (cuCtxGetId) */
    unsigned flags;                /* cuDevicePrimaryCtxSetFlags */
};
struct CUevent_st { atomic_int pending; CUcontext ctx; unsigned gen; struct CUevent_st *prev_live, *next_live; };
/* Events not destroyed by the program, kept reachable for leak checkers:
 * those of a destroyed context stay (the driver would have freed them; a
 * caller forgets them, and their handles must stay dead). Under `lock`. */
static struct CUevent_st *undestroyed_events;
/* waits_on: the event its last cuStreamWaitEvent named; the stream reads
 * busy (cuStreamQuery) while that event is pending, as a real stream whose
 * wait is not done (cleared when the event is destroyed; under `lock`). */
struct CUstream_st { unsigned flags; CUcontext ctx; int capturing; unsigned gen; int destroyed; struct CUstream_st *next_live; struct CUevent_st *waits_on; };
/* Streams not destroyed by the program, kept reachable for leak checkers:
 * those of a destroyed context stay (their handles must stay dead). */
static struct CUstream_st *undestroyed_streams;

static struct CUctx_st primary[MAX_DEV] = {{.device = 0, .is_primary = 1}, {.device = 1, .is_primary = 1},
                                           {.device = 2, .is_primary = 1}, {.device = 3, .is_primary = 1}};
static atomic_ullong next_ctx_id = 1;
static __thread CUcontext current;
static __thread CUcontext stack_saved[16];
static __thread int stack_depth;
static int initialised;
static fake_cuda_counters_t counters;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uintptr_t ptr;
    size_t size;
    CUcontext ctx;
    int host;             /* 1: from cuMemHostAlloc / cuMemAllocHost (pinned) */
    unsigned host_flags;  /* its CU_MEMHOSTALLOC_* flags */
    unsigned long long id; /* its buffer id (CU_POINTER_ATTRIBUTE_BUFFER_ID) */
} live[MAX_LIVE];
static unsigned long long next_buffer_id = 1; /* (under `lock`) */
static size_t outstanding;

#define TOTAL_MEMORY ((size_t)4 << 30) /* the fake device's size */

/* The device's size: FAKE_CUDA_MEMORY, else TOTAL_MEMORY. */
static size_t device_limit(void)
{
    const char *v = getenv("FAKE_CUDA_MEMORY");
    return v ? strtoull(v, NULL, 0) : TOTAL_MEMORY;
}

/* ---- a device shared by several processes (FAKE_CUDA_SHARED_CAPACITY_FILE) ---- */
#define SHARED_RECORDS 64
typedef struct shared_record {
    int32_t pid;        /* the process (0: a free record) */
    int32_t unused;
    uint64_t start;     /* its start time (/proc/PID/stat field 22): a reused pid is another process */
    uint64_t bytes;     /* device bytes it holds */
} shared_record_t;

/* Field 22 of /proc/PID/stat, 0 when the process is gone or a zombie. */
static uint64_t process_start(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X')
        return 0;
    p += 2; /* field 3 */
    for (int field = 3; field < 22 && p; field++)
        p = strchr(p, ' ') ? strchr(p, ' ') + 1 : NULL;
    return p ? strtoull(p, NULL, 10) : 0;
}

/* Adds `delta` bytes to this process's record (a charge fails, returning 0,
 * when the live processes' sum would pass the device's size); *used (may be
 * NULL) = the live processes' sum after it. 1 when there is no shared file. */
static int shared_charge(int64_t delta, uint64_t *used)
{
    static int fd = -1;
    static uint64_t my_start;
    const char *path = getenv("FAKE_CUDA_SHARED_CAPACITY_FILE");
    if (!path || !*path)
        return 1;
    if (fd < 0) {
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        my_start = process_start(getpid());
        if (fd < 0)
            return 0;
    }
    shared_record_t table[SHARED_RECORDS];
    flock(fd, LOCK_EX);
    memset(table, 0, sizeof table);
    ssize_t n = pread(fd, table, sizeof table, 0);
    (void)n;
    uint64_t sum = 0;
    shared_record_t *mine = NULL, *free_record = NULL;
    for (int i = 0; i < SHARED_RECORDS; i++) {
        shared_record_t *r = &table[i];
        if (r->pid == getpid() && r->start == my_start)
            mine = r;
        else if (r->pid && process_start(r->pid) != r->start)
            memset(r, 0, sizeof *r); /* it ended: its memory is the device's again */
        if (!r->pid && !free_record)
            free_record = r;
        sum += r->bytes;
    }
    int ok = 1;
    if (delta > 0 && sum + (uint64_t)delta > device_limit())
        ok = 0;
    else if (!mine && !free_record)
        ok = 0;
    else {
        if (!mine) {
            mine = free_record;
            *mine = (shared_record_t){.pid = getpid(), .start = my_start};
        }
        mine->bytes += (uint64_t)delta;
        sum += (uint64_t)delta;
    }
    if (pwrite(fd, table, sizeof table, 0) != (ssize_t)sizeof table)
        ok = 0;
    flock(fd, LOCK_UN);
    if (used)
        *used = sum;
    return ok;
}

/* Device bytes taken (`lock` held): 0 when the device is full. */
static int charge_locked(size_t size)
{
    if (outstanding + size > device_limit() || !shared_charge((int64_t)size, NULL))
        return 0;
    outstanding += size;
    counters.bytes_outstanding = outstanding;
    return 1;
}

/* Device bytes given back (`lock` held). */
static void uncharge_locked(size_t size)
{
    outstanding -= size;
    counters.bytes_outstanding = outstanding;
    shared_charge(-(int64_t)size, NULL);
}

EXPORT fake_cuda_counters_t *fake_cuda_counters(void) { return &counters; }

static atomic_int torn_down;    /* the runtime's exit teardown ran (fake_cuda_runtime_torn_down) */
static atomic_int forked_child; /* this process is a fork() child of one that called cuInit */

/* The fake libcudart's teardown at exit says so here: every driver call
 * from then on is counted in calls_after_teardown (printed at exit). */
EXPORT void fake_cuda_runtime_torn_down(void) { atomic_store(&torn_down, 1); }

static void child_after_fork(void) { atomic_store(&forked_child, 1); }

/* What the driver answers in the child of a process that initialised it:
 * CUDA cannot be used there. Nothing of the parent's state is touched (its
 * lock may have been held by another thread at the fork). */
static CUresult child_call(void)
{
    __atomic_fetch_add(&counters.child_calls, 1, __ATOMIC_RELAXED);
    return CUDA_ERROR_NOT_INITIALIZED;
}

/* The first line of every entry point. */
#define ENTER()                                                                          \
    do {                                                                                 \
        if (atomic_load_explicit(&torn_down, memory_order_relaxed))                      \
            __atomic_fetch_add(&counters.calls_after_teardown, 1, __ATOMIC_RELAXED);     \
        if (atomic_load_explicit(&forked_child, memory_order_relaxed))                   \
            return child_call();                                                         \
    } while (0)

__attribute__((destructor)) static void report_dead_calls(void)
{
    if (counters.dead_calls)
        fprintf(stderr, "fake libcuda: %lu calls on objects of a destroyed context\n", counters.dead_calls);
    unsigned long late = __atomic_load_n(&counters.calls_after_teardown, __ATOMIC_RELAXED);
    if (late)
        fprintf(stderr, "fake libcuda: %lu calls after the runtime was torn down\n", late);
    if (getenv("FAKE_CUDA_COUNTERS")) /* what a benchmark asked of the driver (tools/bench/bench_shim.c) */
        fprintf(stderr,
                "fake libcuda: mem_alloc %lu mem_free %lu event_record %lu event_query %lu event_sync %lu "
                "stream_wait %lu stream_query %lu ctx_push %lu ctx_sync %lu vm_created %lu\n",
                counters.mem_alloc, counters.mem_free, counters.event_record, counters.event_query,
                counters.event_sync, counters.stream_wait, counters.stream_query, counters.ctx_push,
                counters.ctx_sync, counters.vm_created);
}

static int ctx_alive(CUcontext c) { return c && atomic_load(&c->refs) > 0; }

/* FAKE_CUDA_OBJECT_DELAY_US (see the top). */
static void object_delay(void)
{
    static atomic_int delay_us = -1;
    int us = atomic_load_explicit(&delay_us, memory_order_relaxed);
    if (us < 0) {
        const char *v = getenv("FAKE_CUDA_OBJECT_DELAY_US");
        us = v ? atoi(v) : 0;
        atomic_store_explicit(&delay_us, us, memory_order_relaxed);
    }
    if (us > 0)
        usleep((useconds_t)us);
}

/* A call on something of a dead context (or a stale incarnation). */
static CUresult dead(void)
{
    __atomic_fetch_add(&counters.dead_calls, 1, __ATOMIC_RELAXED);
    return CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

/* Destroys context c: its memory is freed, its events and streams die. */
static void ctx_destroy(CUcontext c)
{
    pthread_mutex_lock(&lock);
    atomic_store(&c->refs, 0);
    atomic_fetch_add(&c->gen, 1);
    for (size_t i = 0; i < MAX_LIVE; i++)
        if (live[i].ptr && live[i].ctx == c) {
            uncharge_locked(live[i].size);
            free((void *)live[i].ptr);
            live[i].ptr = 0;
        }
    __atomic_fetch_add(&counters.ctx_destroyed, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&lock);
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, child_after_fork); }

static int device_count(void)
{
    const char *n = getenv("FAKE_CUDA_DEVICES");
    int d = n ? atoi(n) : 2;
    return d < 1 ? 1 : d > MAX_DEV ? MAX_DEV : d;
}

EXPORT CUresult cuInit(unsigned int flags)
{
    ENTER();
    (void)flags;
    static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
    pthread_once(&atfork_once, register_atfork);
    initialised = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n)
{
    ENTER();
    *n = device_count();
    return CUDA_SUCCESS;
}

/* The device's UUID (see the top): "FAKE", the group, the physical index. */
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice d)
{
    ENTER();
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!uuid || d < 0 || d >= device_count())
        return CUDA_ERROR_INVALID_DEVICE;
    const char *shared = getenv("FAKE_CUDA_SHARED_CAPACITY_FILE"), *first = getenv("FAKE_CUDA_FIRST_DEVICE");
    uint32_t group = 2166136261u; /* FNV-1a of the shared file's name, else of the pid */
    char own[32];
    snprintf(own, sizeof own, "pid %d", (int)getpid());
    for (const char *c = shared && *shared ? shared : own; *c; c++)
        group = (group ^ (unsigned char)*c) * 16777619u;
    uint32_t physical = (uint32_t)(d + (first ? atoi(first) : 0));
    memcpy(uuid->bytes, "FAKE", 4);
    memcpy(uuid->bytes + 4, &group, 4);
    memcpy(uuid->bytes + 8, &physical, 4);
    memset(uuid->bytes + 12, 0, 4);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice d) { return cuDeviceGetUuid_v2(uuid, d); }

/* Stream capture, as far as the shim needs it: global-mode captures open
 * (while one is, cuMemAlloc and cuMemFree answer
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED on every thread whose own mode is
 * not relaxed, as CUDA does), and each thread's capture mode. */
static int global_captures_open;
static __thread CUstreamCaptureMode thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static int unsafe_call_prohibited(void)
{
    int prohibited = __atomic_load_n(&global_captures_open, __ATOMIC_ACQUIRE) > 0 &&
                     thread_capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    if (prohibited)
        __atomic_fetch_add(&counters.unsafe_refused, 1, __ATOMIC_RELAXED);
    return prohibited;
}

/* stream_ordered: cuMemAllocAsync, allowed in a capture (a graph memory node) */
static CUresult do_alloc_kind(CUdeviceptr *p, size_t size, int stream_ordered)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!stream_ordered && unsafe_call_prohibited())
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx_alive(current))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED; /* (the program's own mistake, not a dead object's use) */
    if (!size)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    size_t i = 0;
    while (i < MAX_LIVE && live[i].ptr)
        i++;
    if (i == MAX_LIVE || !charge_locked(size)) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t align = size >= (2u << 20) ? (2u << 20) : 512;
    void *m = aligned_alloc(align, (size + align - 1) / align * align);
    if (!m) {
        uncharge_locked(size);
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    live[i].ptr = (uintptr_t)m;
    live[i].size = size;
    live[i].ctx = current;
    live[i].id = next_buffer_id++;
    live[i].host = 0;
    live[i].host_flags = 0;
    __atomic_fetch_add(&counters.mem_alloc, 1, __ATOMIC_RELAXED);
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
            uncharge_locked(live[i].size);
            live[i].ptr = 0;
            __atomic_fetch_add(&counters.mem_free, 1, __ATOMIC_RELAXED);
            pthread_mutex_unlock(&lock);
            free((void *)(uintptr_t)p);
            return CUDA_SUCCESS;
        }
    __atomic_fetch_add(&counters.bad_free, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult do_alloc(CUdeviceptr *p, size_t size) { return do_alloc_kind(p, size, 0); }

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) { ENTER(); return do_alloc(p, size); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    ENTER();
    return unsafe_call_prohibited() ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : do_free(p);
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags)
{
    ENTER();
    (void)flags;
    return do_alloc(p, size);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s)
{
    ENTER();
    (void)s;
    __atomic_fetch_add(&counters.mem_alloc_async, 1, __ATOMIC_RELAXED);
    return do_alloc_kind(p, size, 1);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream s)
{
    ENTER();
    (void)s;
    __atomic_fetch_add(&counters.mem_alloc_async_ptsz, 1, __ATOMIC_RELAXED);
    return do_alloc_kind(p, size, 1);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    ENTER();
    (void)s;
    return do_free(p);
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    ENTER();
    (void)s;
    return do_free(p);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    ENTER();
    pthread_mutex_lock(&lock);
    uint64_t used = 0;
    if (getenv("FAKE_CUDA_SHARED_CAPACITY_FILE") && shared_charge(0, &used)) { /* every process's bytes */
        *total = device_limit();
        *free_bytes = used < *total ? *total - used : 0;
    } else {
        *free_bytes = TOTAL_MEMORY - outstanding;
        *total = TOTAL_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    ENTER();
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
    ENTER();
    CUdeviceptr base;
    if (cuMemGetAddressRange_v2(&base, NULL, p) != CUDA_SUCCESS || base != p)
        return CUDA_ERROR_INVALID_VALUE;
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &p, sizeof p);
    memcpy(h->reserved + 8, "FAKEIPC", 8);
    return CUDA_SUCCESS;
}

static CUresult ipc_open(CUdeviceptr *p, CUipcMemHandle h)
{
    __atomic_fetch_add(&counters.ipc_open_native, 1, __ATOMIC_RELAXED);
    if (memcmp(h.reserved + 8, "FAKEIPC", 8) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(p, h.reserved, sizeof *p);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) { ENTER(); (void)flags; return ipc_open(p, h); }
EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) { ENTER(); (void)flags; return ipc_open(p, h); }
EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    ENTER();
    (void)p;
    __atomic_fetch_add(&counters.ipc_close_native, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

/* ---- virtual memory (FAKE_CUDA_VMM=1) ---- */
#define FAKE_GRANULARITY ((size_t)2 << 20)
typedef struct fake_vm_handle {
    int fd;        /* the memfd (created) or a dup of the imported descriptor */
    size_t size;   /* its bytes */
    int types;     /* requestedHandleTypes at cuMemCreate */
    int imported;  /* 1: from cuMemImportFromShareableHandle (not counted in outstanding) */
} fake_vm_handle_t;

static int env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v == '1';
}

EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice d)
{
    ENTER();
    (void)d;
    *value = 0;
    if (attribute == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
        *value = env_on("FAKE_CUDA_VMM");
    else if (attribute == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
        *value = env_on("FAKE_CUDA_VMM") && !env_on("FAKE_CUDA_VMM_NO_FD");
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option)
{
    ENTER();
    (void)option;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST && env_on("FAKE_CUDA_VMM_NO_HOST"))
        return CUDA_ERROR_INVALID_VALUE; /* a driver before host locations (CUDA 12.2) */
    *g = FAKE_GRANULARITY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags)
{
    ENTER();
    (void)addr;
    (void)flags;
    if (!size || size % FAKE_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > FAKE_GRANULARITY ? alignment : FAKE_GRANULARITY;
    char *m = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t start = ((uintptr_t)m + align - 1) / align * align;
    if (start > (uintptr_t)m)
        munmap(m, start - (uintptr_t)m);
    munmap((void *)(start + size), (uintptr_t)m + size + align - (start + size));
    *p = (CUdeviceptr)start;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
    ENTER();
    return munmap((void *)(uintptr_t)p, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
    ENTER();
    (void)flags;
    if (!env_on("FAKE_CUDA_VMM") || !size || size % FAKE_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    int on_host = prop->location.type == CU_MEM_LOCATION_TYPE_HOST;
    if (on_host && (env_on("FAKE_CUDA_VMM_NO_HOST") || prop->requestedHandleTypes))
        return CUDA_ERROR_INVALID_VALUE;
    if (!on_host && prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->requestedHandleTypes && (env_on("FAKE_CUDA_VMM_NO_FD") || env_on("FAKE_CUDA_VMM_REFUSE_FD")))
        return CUDA_ERROR_NOT_SUPPORTED; /* (REFUSE_FD: the attribute says yes, cuMemCreate says no, as in some containers) */
    pthread_mutex_lock(&lock);
    if (!charge_locked(size)) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    fake_vm_handle_t *v = calloc(1, sizeof *v);
    int fd = memfd_create("fake_cuda_vm", MFD_CLOEXEC);
    if (!v || fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        free(v);
        pthread_mutex_lock(&lock);
        uncharge_locked(size);
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    v->fd = fd;
    v->size = size;
    v->types = prop->requestedHandleTypes;
    __atomic_fetch_add(&counters.vm_created, 1, __ATOMIC_RELAXED);
    if (on_host)
        __atomic_fetch_add(&counters.vm_created_host, 1, __ATOMIC_RELAXED);
    if (v->types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        __atomic_fetch_add(&counters.vm_created_shareable, 1, __ATOMIC_RELAXED);
    *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    ENTER();
    fake_vm_handle_t *v = (fake_vm_handle_t *)(uintptr_t)h;
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    if (!v->imported) {
        pthread_mutex_lock(&lock);
        uncharge_locked(v->size);
        pthread_mutex_unlock(&lock);
    }
    close(v->fd); /* (a mapping keeps the memory, as the driver does) */
    free(v);
    __atomic_fetch_add(&counters.vm_released, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags)
{
    ENTER();
    (void)flags;
    fake_vm_handle_t *v = (fake_vm_handle_t *)(uintptr_t)h;
    if (!v || offset + size > v->size)
        return CUDA_ERROR_INVALID_VALUE;
    void *m = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, v->fd, (off_t)offset);
    return m == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* Who may reach mapped memory: cuMemSetAccess grants devices (and the
 * host) per range, cuMemUnmap takes it away; a copy or memset of mapped
 * memory made while a device is current that the newest grant covering the
 * address does not name fails with "invalid value", as the driver does
 * (cuMemAlloc memory is reachable from every device). Newest entry last. */
#define HOST_ACCESS (1ull << 63)
#define ACCESS_MAX 65536
typedef struct { uintptr_t start; size_t size; uint64_t mask; unsigned long long id; } access_entry_t;
static access_entry_t access_log[ACCESS_MAX];
static size_t access_count;
static void access_note(uintptr_t start, size_t size, uint64_t mask)
{
    pthread_mutex_lock(&lock);
    if (mask) /* cuMemSetAccess leaves the locations it does not name as they were */
        for (size_t i = access_count; i-- > 0;)
            if (start - access_log[i].start < access_log[i].size) {
                mask |= access_log[i].mask;
                break;
            }
    size_t kept = 0; /* drop entries the new one covers whole */
    for (size_t i = 0; i < access_count; i++)
        if (!(access_log[i].start >= start && access_log[i].start + access_log[i].size <= start + size))
            access_log[kept++] = access_log[i];
    access_count = kept;
    if (mask && access_count < ACCESS_MAX)
        access_log[access_count++] = (access_entry_t){start, size, mask, next_buffer_id++};
    pthread_mutex_unlock(&lock);
}
/* True when the current context's device may reach p (not mapped memory,
 * or mapped with access for it); counts a refusal. */
static int reachable(uintptr_t p)
{
    if (!p || !current)
        return 1;
    int ok = 1;
    pthread_mutex_lock(&lock);
    for (size_t i = access_count; i-- > 0;)
        if (p - access_log[i].start < access_log[i].size) {
            ok = (access_log[i].mask >> current->device & 1) != 0;
            break;
        }
    pthread_mutex_unlock(&lock);
    if (!ok)
        __atomic_fetch_add(&counters.copy_refused, 1, __ATOMIC_RELAXED);
    return ok;
}

/* Opens the pages (the fake has one kind of memory: host memory, which
 * backs host-located pieces too). Each descriptor must name the host
 * (location HOST, id 0) or a device of the process; FAKE_CUDA_REFUSE_ACCESS=N:
 * device N refuses (the whole call fails, as the driver does). */
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    ENTER();
    const char *refuse = getenv("FAKE_CUDA_REFUSE_ACCESS");
    unsigned long host = 0, devices = 0, other = 0;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].location.type == CU_MEM_LOCATION_TYPE_HOST && desc[i].location.id == 0)
            host++;
        else if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE && desc[i].location.id >= 0 &&
                 desc[i].location.id < device_count() && !(refuse && atoi(refuse) == desc[i].location.id)) {
            devices++;
            other += current && desc[i].location.id != current->device;
        } else
            return CUDA_ERROR_INVALID_DEVICE;
    }
    if (mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t mask = 0;
    for (size_t i = 0; i < count; i++)
        if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE)
            mask |= 1ull << desc[i].location.id;
        else
            mask |= HOST_ACCESS;
    access_note((uintptr_t)p, size, mask);
    __atomic_fetch_add(&counters.vm_access_host, host, __ATOMIC_RELAXED);
    __atomic_fetch_add(&counters.vm_access_device, devices, __ATOMIC_RELAXED);
    __atomic_fetch_add(&counters.vm_access_other, other, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
    ENTER();
    access_note((uintptr_t)p, size, 0);
    void *m = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                   -1, 0);
    if (m == MAP_FAILED)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&counters.vm_unmapped, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type,
                                             unsigned long long flags)
{
    ENTER();
    (void)flags;
    fake_vm_handle_t *v = (fake_vm_handle_t *)(uintptr_t)h;
    if (!v || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !(v->types & type))
        return CUDA_ERROR_INVALID_VALUE; /* not requested at cuMemCreate */
    int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)out = fd;
    __atomic_fetch_add(&counters.vm_exported, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type)
{
    ENTER();
    int fd = (int)(intptr_t)os;
    struct stat st;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fstat(fd, &st) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fake_vm_handle_t *v = calloc(1, sizeof *v);
    if (!v)
        return CUDA_ERROR_OUT_OF_MEMORY;
    v->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    v->size = (size_t)st.st_size;
    v->types = type;
    v->imported = 1;
    __atomic_fetch_add(&counters.vm_imported, 1, __ATOMIC_RELAXED);
    *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

/* contexts */
EXPORT CUresult cuCtxGetCurrent(CUcontext *c)
{
    ENTER();
    *c = current;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
    ENTER();
    current = c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
    ENTER();
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx_alive(current))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED; /* the thread still names the destroyed primary */
    *d = current->device;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c)
{
    ENTER();
    if (stack_depth == 16)
        return CUDA_ERROR_INVALID_VALUE;
    stack_saved[stack_depth++] = current;
    current = c;
    __atomic_fetch_add(&counters.ctx_push, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
    ENTER();
    if (!stack_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (c)
        *c = current;
    current = stack_saved[--stack_depth];
    return CUDA_SUCCESS;
}
static int stream_alive(CUstream s);
EXPORT CUresult cuCtxSynchronize(void)
{
    ENTER();
    if (current && !ctx_alive(current))
        return dead();
    __atomic_fetch_add(&counters.ctx_sync, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&lock); /* a capture of the context's dies of it in CUDA: counted, and refused as CUDA does */
    CUresult r = CUDA_SUCCESS;
    for (struct CUstream_st *s = undestroyed_streams; s; s = s->next_live)
        if (s->capturing && s->ctx == current && stream_alive(s)) {
            __atomic_fetch_add(&counters.sync_in_capture, 1, __ATOMIC_RELAXED);
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
            break;
        }
    pthread_mutex_unlock(&lock);
    return r;
}
/* Guard mode's fill and read-back: device memory is host memory here. */
EXPORT CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char value, size_t n, CUstream s __attribute__((unused)))
{
    ENTER();
    if (current && !ctx_alive(current))
        return dead();
    memset((void *)(uintptr_t)p, value, n);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    ENTER();
    if (current && !ctx_alive(current))
        return dead();
    if (!reachable(src))
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    __atomic_fetch_add(&counters.copies, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
/* Pointer queries as the driver answers them (H200, CUDA 13.0): cuMemAlloc
 * memory names its context and its allocation as the range; mapped memory
 * no context and its mapping (the cuMemSetAccess range) as the range. Its
 * physical handle can be retained (a handle only the fake knows: 1), the
 * allocation handle of cuMemAlloc memory cannot (invalid value). */
static CUresult pointer_range(uintptr_t p, uintptr_t *start, size_t *size, CUcontext *ctx, unsigned long long *id)
{
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_LIVE && r; i++)
        if (live[i].ptr && !live[i].host && p - live[i].ptr < live[i].size) {
            *start = live[i].ptr, *size = live[i].size, *ctx = live[i].ctx, *id = live[i].id;
            r = CUDA_SUCCESS;
        }
    for (size_t i = access_count; i-- > 0 && r;)
        if (p - access_log[i].start < access_log[i].size) {
            *start = access_log[i].start, *size = access_log[i].size, *ctx = NULL, *id = access_log[i].id;
            r = CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&lock);
    return r;
}
EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr p)
{
    ENTER();
    uintptr_t start;
    size_t size;
    CUcontext ctx;
    unsigned long long id;
    CUresult r = pointer_range(p, &start, &size, &ctx, &id);
    if (r != CUDA_SUCCESS)
        return r;
    if (attribute == CU_POINTER_ATTRIBUTE_CONTEXT)
        *(CUcontext *)data = ctx;
    else if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
        *(CUdeviceptr *)data = start;
    else if (attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE)
        *(size_t *)data = size;
    else if (attribute == CU_POINTER_ATTRIBUTE_BUFFER_ID)
        *(unsigned long long *)data = id;
    else if (attribute == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE)
        *(int *)data = ctx != NULL; /* cuMemAlloc memory: yes; mapped: no */
    else if (attribute == CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES)
        *(unsigned long long *)data = ctx ? 0 : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    else
        return CUDA_ERROR_INVALID_VALUE; /* (the fake knows no other) */
    return CUDA_SUCCESS;
}
EXPORT CUresult cuPointerGetAttributes(unsigned count, int *attributes, void **data, CUdeviceptr p)
{
    ENTER();
    for (unsigned i = 0; i < count; i++)
        if (data[i] && cuPointerGetAttribute(data[i], attributes[i], p) != CUDA_SUCCESS)
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
    ENTER();
    uintptr_t start;
    size_t size;
    CUcontext ctx;
    unsigned long long id;
    if (pointer_range((uintptr_t)addr, &start, &size, &ctx, &id) != CUDA_SUCCESS || ctx)
        return CUDA_ERROR_INVALID_VALUE;
    *h = 1;
    return CUDA_SUCCESS;
}

/* Copies (device memory is host memory here): refused when the current
 * device cannot reach a mapped side (reachable). */
static CUresult fake_copy(uintptr_t dst, uintptr_t src, size_t n, int dst_device, int src_device)
{
    if (current && !ctx_alive(current))
        return dead();
    if ((dst_device && !reachable(dst)) || (src_device && !reachable(src)))
        return CUDA_ERROR_INVALID_VALUE;
    memmove((void *)dst, (const void *)src, n);
    __atomic_fetch_add(&counters.copies, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { ENTER(); return fake_copy(dst, src, n, 1, 1); }
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    ENTER();
    return fake_copy(dst, (uintptr_t)src, n, 1, 0);
}
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    ENTER();
    return fake_copy(dst, src, n, 1, 1);
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    ENTER();
    if (!stream_alive(s))
        return dead();
    return fake_copy(dst, src, n, 1, 1);
}
EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    ENTER();
    if (dev < 0 || dev >= device_count() || peer < 0 || peer >= device_count())
        return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer && !env_on("FAKE_CUDA_NO_PEER");
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamGetFlags(CUstream s, unsigned *flags)
{
    ENTER();
    if (!stream_alive(s))
        return dead();
    *flags = s && (uintptr_t)s > 2 ? s->flags : 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s __attribute__((unused)))
{
    ENTER();
    if (current && !ctx_alive(current))
        return dead();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    ENTER();
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= device_count())
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (atomic_fetch_add(&primary[d].refs, 1) == 0)
        atomic_store(&primary[d].id, atomic_fetch_add(&next_ctx_id, 1)); /* made (again): a new context */
    pthread_mutex_unlock(&lock);
    *c = &primary[d];
    return CUDA_SUCCESS;
}
/* FAKE_CUDA_LIFECYCLE_DELAY_US (see the top). */
static void lifecycle_delay(void)
{
    const char *v = getenv("FAKE_CUDA_LIFECYCLE_DELAY_US");
    if (v && atoi(v) > 0) {
        __atomic_fetch_add(&counters.lifecycle_delays, 1, __ATOMIC_RELEASE);
        usleep((useconds_t)atoi(v));
    }
}

static CUresult primary_release(CUdevice d)
{
    lifecycle_delay();
    if (d < 0 || d >= device_count())
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (primary[d].stale_refs > 0) { /* "safe to release after a reset": it does not touch the new context */
        primary[d].stale_refs--;
        pthread_mutex_unlock(&lock);
        return CUDA_SUCCESS;
    }
    int was = atomic_load(&primary[d].refs);
    if (was > 0)
        atomic_store(&primary[d].refs, was - 1);
    pthread_mutex_unlock(&lock);
    if (was <= 0)
        return CUDA_ERROR_INVALID_CONTEXT; /* not retained */
    __atomic_fetch_add(&counters.ctx_release, 1, __ATOMIC_RELAXED);
    if (was == 1)
        ctx_destroy(&primary[d]);
    return CUDA_SUCCESS;
}
static CUresult primary_reset(CUdevice d)
{
    lifecycle_delay();
    if (d < 0 || d >= device_count())
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&counters.ctx_reset, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&lock);
    primary[d].stale_refs += atomic_load(&primary[d].refs); /* a reset does not release them */
    pthread_mutex_unlock(&lock);
    if (ctx_alive(&primary[d]))
        ctx_destroy(&primary[d]);
    return CUDA_SUCCESS;
}
static CUresult primary_set_flags(CUdevice d, unsigned flags)
{
    if (d < 0 || d >= device_count())
        return CUDA_ERROR_INVALID_VALUE;
    primary[d].flags = flags;
    const char *e = getenv("FAKE_CUDA_SETFLAGS_RECREATES");
    if (e && atoi(e) && ctx_alive(&primary[d])) {
        int refs = atomic_load(&primary[d].refs);
        ctx_destroy(&primary[d]);
        atomic_store(&primary[d].refs, refs);
        atomic_store(&primary[d].id, atomic_fetch_add(&next_ctx_id, 1));
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { ENTER(); return primary_release(d); }
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { ENTER(); return primary_release(d); }
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) { ENTER(); return primary_reset(d); }
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { ENTER(); return primary_reset(d); }
EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned f) { ENTER(); return primary_set_flags(d, f); }
EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned f) { ENTER(); return primary_set_flags(d, f); }
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active)
{
    ENTER();
    if (d < 0 || d >= device_count())
        return CUDA_ERROR_INVALID_VALUE;
    *flags = primary[d].flags;
    *active = ctx_alive(&primary[d]);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetId(CUcontext c, unsigned long long *id)
{
    ENTER();
    if (!c)
        c = current;
    if (!ctx_alive(c))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *id = atomic_load(&c->id);
    return CUDA_SUCCESS;
}
/* Non-primary contexts: never freed (the shim may compare handles), kept
 * reachable here for leak checkers, made current. */
static CUcontext created_contexts[256];
static atomic_int created_count;
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d)
{
    ENTER();
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= device_count())
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext n = calloc(1, sizeof *n);
    n->device = d;
    n->flags = flags;
    atomic_store(&n->refs, 1);
    atomic_store(&n->id, atomic_fetch_add(&next_ctx_id, 1));
    int slot = atomic_fetch_add(&created_count, 1);
    if (slot < 256)
        created_contexts[slot] = n;
    *c = n;
    current = n;
    return CUDA_SUCCESS;
}
static CUresult ctx_destroy_call(CUcontext c)
{
    if (!c || c->is_primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx_alive(c))
        return dead();
    ctx_destroy(c);
    if (current == c)
        current = stack_depth ? stack_saved[--stack_depth] : NULL;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxDestroy(CUcontext c) { ENTER(); return ctx_destroy_call(c); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) { ENTER(); return ctx_destroy_call(c); }

/* events and streams */
/* Is a stream handle (legacy/per-thread: the current context) alive? */
static int stream_alive(CUstream s)
{
    if ((uintptr_t)s <= 2)
        return !current || ctx_alive(current);
    return !s->destroyed && ctx_alive(s->ctx) && atomic_load(&s->ctx->gen) == s->gen;
}
static int event_alive(CUevent e) { return ctx_alive(e->ctx) && atomic_load(&e->ctx->gen) == e->gen; }

EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    ENTER();
    object_delay();
    (void)flags;
    if (current && !ctx_alive(current))
        return dead();
    *e = calloc(1, sizeof **e);
    if (!*e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    (*e)->ctx = current;
    (*e)->gen = current ? atomic_load(&current->gen) : 0;
    pthread_mutex_lock(&lock);
    (*e)->next_live = undestroyed_events;
    if (undestroyed_events)
        undestroyed_events->prev_live = *e;
    undestroyed_events = *e;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
    ENTER();
    object_delay();
    if (!event_alive(e) || !stream_alive(s))
        return dead();
    if (s && (uintptr_t)s > 2 && s->capturing)
        return CUDA_ERROR_NOT_SUPPORTED;
    const char *p = getenv("FAKE_CUDA_EVENTS_PENDING");
    atomic_store(&e->pending, p ? atoi(p) : 0);
    __atomic_fetch_add(&counters.event_record, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventQuery(CUevent e)
{
    ENTER();
    object_delay();
    if (!event_alive(e))
        return dead();
    __atomic_fetch_add(&counters.event_query, 1, __ATOMIC_RELAXED);
    if (atomic_load(&e->pending) > 0) {
        atomic_fetch_sub(&e->pending, 1);
        return CUDA_ERROR_NOT_READY;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventSynchronize(CUevent e)
{
    ENTER();
    object_delay();
    if (!event_alive(e))
        return dead();
    atomic_store(&e->pending, 0);
    __atomic_fetch_add(&counters.event_sync, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    ENTER();
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (e->prev_live)
        e->prev_live->next_live = e->next_live;
    else
        undestroyed_events = e->next_live;
    if (e->next_live)
        e->next_live->prev_live = e->prev_live;
    for (struct CUstream_st *s = undestroyed_streams; s; s = s->next_live)
        if (s->waits_on == e)
            s->waits_on = NULL;
    pthread_mutex_unlock(&lock);
    free(e);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f)
{
    ENTER();
    object_delay();
    (void)f;
    if (!event_alive(e) || !stream_alive(s))
        return dead();
    if ((uintptr_t)s > 2 && s->capturing)
        __atomic_fetch_add(&counters.wait_in_capture, 1, __ATOMIC_RELAXED);
    if ((uintptr_t)s > 2) {
        pthread_mutex_lock(&lock);
        s->waits_on = e;
        pthread_mutex_unlock(&lock);
    }
    __atomic_fetch_add(&counters.stream_wait, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
/* FAKE_CUDA_STREAMS_BUSY=1: every non-blocking stream has work in flight;
 * else a stream is busy while the event of its last wait is pending
 * (FAKE_CUDA_EVENTS_PENDING; the query does not count down that event). */
EXPORT CUresult cuStreamQuery(CUstream s)
{
    ENTER();
    object_delay();
    if (!stream_alive(s))
        return dead();
    __atomic_fetch_add(&counters.stream_query, 1, __ATOMIC_RELAXED);
    const char *busy = getenv("FAKE_CUDA_STREAMS_BUSY");
    if (busy && *busy == '1')
        return CUDA_ERROR_NOT_READY;
    int waiting = 0;
    if ((uintptr_t)s > 2) {
        pthread_mutex_lock(&lock);
        waiting = s->waits_on && atomic_load(&s->waits_on->pending) > 0;
        pthread_mutex_unlock(&lock);
    }
    return waiting ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int prio)
{
    ENTER();
    (void)prio;
    if (current && !ctx_alive(current))
        return dead();
    *s = calloc(1, sizeof **s);
    (*s)->flags = flags;
    (*s)->ctx = current;
    (*s)->gen = current ? atomic_load(&current->gen) : 0;
    pthread_mutex_lock(&lock);
    (*s)->next_live = undestroyed_streams;
    undestroyed_streams = *s;
    pthread_mutex_unlock(&lock);
    __atomic_fetch_add(&counters.stream_create, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) { ENTER(); return cuStreamCreateWithPriority(s, flags, 0); }
EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    ENTER();
    if (!stream_alive(s))
        return dead(); /* (kept: the handle is not reused, so tests can see it) */
    /* the handle stays (reachable, never reused) and reads as dead: a use of
     * a destroyed stream counts as a dead call (in CUDA it may crash) */
    s->destroyed = 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy(CUstream s) { ENTER(); return cuStreamDestroy_v2(s); }
EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *c)
{
    ENTER();
    *c = (uintptr_t)s > 2 ? s->ctx : current;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
    ENTER();
    if (!stream_alive(s))
        return dead();
    *st = (uintptr_t)s > 2 && s->capturing ? 1 : 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st) { ENTER(); return cuStreamIsCapturing(s, st); }
EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *m)
{
    ENTER();
    CUstreamCaptureMode old = thread_capture_mode;
    thread_capture_mode = *m;
    *m = old;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
    ENTER();
    if ((uintptr_t)s <= 2 || !stream_alive(s) || s->capturing)
        return CUDA_ERROR_INVALID_VALUE;
    s->capturing = mode == CU_STREAM_CAPTURE_MODE_GLOBAL ? 2 : 1;
    if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
        __atomic_fetch_add(&global_captures_open, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamEndCapture(CUstream s, void **graph)
{
    ENTER();
    if ((uintptr_t)s <= 2 || !stream_alive(s) || !s->capturing)
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capturing == 2)
        __atomic_fetch_sub(&global_captures_open, 1, __ATOMIC_RELEASE);
    s->capturing = 0;
    if (graph)
        *graph = NULL;
    return CUDA_SUCCESS;
}
/* Pinned host memory: the same host memory as device memory (one live
 * table), counted apart and marked, so the queries below answer for it. */
EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    ENTER();
    if (!pp)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = 0;
    CUresult r = do_alloc(&p, size);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&lock);
        for (size_t i = 0; i < MAX_LIVE; i++)
            if (live[i].ptr == (uintptr_t)p) {
                live[i].host = 1;
                live[i].host_flags = flags;
            }
        pthread_mutex_unlock(&lock);
        __atomic_fetch_add(&counters.host_alloc, 1, __ATOMIC_RELAXED);
        counters.host_alloc_flags = flags;
        *pp = (void *)(uintptr_t)p;
    }
    return r;
}

/* Whether `addr` is inside live cuMemHostAlloc memory; *flags its flags.
 * (Only that: the fake does not know what the driver answers for host
 * pieces of cuMemCreate, so it answers "invalid value" for them, and a
 * shim that let such queries through would be caught.) */
static int in_host_alloc(uintptr_t addr, unsigned *flags)
{
    int found = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_LIVE && !found; i++)
        if (live[i].ptr && live[i].host && addr >= live[i].ptr && addr - live[i].ptr < live[i].size) {
            found = 1;
            if (flags)
                *flags = live[i].host_flags;
        }
    pthread_mutex_unlock(&lock);
    return found;
}

EXPORT CUresult cuMemHostGetFlags(unsigned int *flags, void *p)
{
    ENTER();
    __atomic_fetch_add(&counters.host_queries, 1, __ATOMIC_RELAXED);
    unsigned f = 0;
    if (!flags || !in_host_alloc((uintptr_t)p, &f))
        return CUDA_ERROR_INVALID_VALUE;
    *flags = f;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int flags)
{
    ENTER();
    __atomic_fetch_add(&counters.host_queries, 1, __ATOMIC_RELAXED);
    if (!d || flags || !in_host_alloc((uintptr_t)p, NULL))
        return CUDA_ERROR_INVALID_VALUE;
    *d = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size) { ENTER(); return cuMemHostAlloc(pp, size, 0); }
EXPORT CUresult cuMemFreeHost(void *p)
{
    ENTER();
    CUresult r = do_free((CUdeviceptr)(uintptr_t)p);
    if (r == CUDA_SUCCESS)
        __atomic_fetch_add(&counters.host_free, 1, __ATOMIC_RELAXED);
    return r;
}

/* Page-locking memory the program mapped (host.expandable's pieces): the
 * fake pins nothing; it counts, and refuses an unregistration of a range
 * it never registered. */
#define FAKE_REGISTERED_MAX 4096
static uintptr_t registered[FAKE_REGISTERED_MAX]; /* starts of live registrations (0: free slot) */
static pthread_mutex_t registered_lock = PTHREAD_MUTEX_INITIALIZER;
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
    ENTER();
    if (!p || !size)
        return CUDA_ERROR_INVALID_VALUE;
    if (in_host_alloc((uintptr_t)p, NULL) || in_host_alloc((uintptr_t)p + size - 1, NULL))
        return CUDA_ERROR_INVALID_VALUE; /* what CUDA 13.0 answers inside cuMemHostAlloc memory */
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&registered_lock);
    for (int i = 0; i < FAKE_REGISTERED_MAX; i++)
        if (!registered[i]) {
            registered[i] = (uintptr_t)p;
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&registered_lock);
    if (r == CUDA_SUCCESS) {
        memset(p, 0, 1); /* the memory must be there, as pinning touches it */
        __atomic_fetch_add(&counters.host_register, 1, __ATOMIC_RELAXED);
        counters.host_register_flags = flags;
    }
    return r;
}
EXPORT CUresult cuMemHostUnregister(void *p)
{
    ENTER();
    if (in_host_alloc((uintptr_t)p, NULL))
        return CUDA_ERROR_INVALID_VALUE; /* as CUDA 13.0 for cuMemHostAlloc memory */
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&registered_lock);
    for (int i = 0; i < FAKE_REGISTERED_MAX; i++)
        if (p && registered[i] == (uintptr_t)p) {
            registered[i] = 0;
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&registered_lock);
    if (r == CUDA_SUCCESS)
        __atomic_fetch_add(&counters.host_unregister, 1, __ATOMIC_RELAXED);
    return r;
}

/* test control: mark a stream as being captured into a graph */
EXPORT void fake_cuda_set_capturing(CUstream s, int on) { s->capturing = on; }

/* Modules and launches, for `poolshim replay`'s lag kernel: a module is
 * "loaded" from any PTX text that defines an entry, a function exists when
 * the PTX names it, and a launch runs nothing (the fake GPU is always done;
 * FAKE_CUDA_EVENTS_PENDING makes it look busy). */
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    ENTER();
    if (!module || !image || !strstr((const char *)image, ".entry "))
        return CUDA_ERROR_INVALID_VALUE;
    *module = (CUmodule)strdup((const char *)image);
    return *module ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    ENTER();
    char entry[256];
    snprintf(entry, sizeof entry, ".entry %s(", name ? name : "");
    if (!function || !module || !name || !strstr((const char *)module, entry))
        return CUDA_ERROR_INVALID_VALUE;
    *function = (CUfunction)module;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, CUstream s, void **params, void **extra)
{
    ENTER();
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)extra;
    if (!f || !params || !stream_alive(s))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* cuGetProcAddress: names resolved like the driver, by version and flags */
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);

static const struct { const char *name; void *fn; int min_version; } table[] = {
    {"cuInit", (void *)cuInit, 2000},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount, 2000},
    {"cuDeviceGetUuid", (void *)cuDeviceGetUuid_v2, 11040},
    {"cuMemAlloc", (void *)cuMemAlloc_v2, 3020},
    {"cuMemFree", (void *)cuMemFree_v2, 3020},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged, 6000},
    {"cuMemHostAlloc", (void *)cuMemHostAlloc, 2020},
    {"cuMemAllocHost", (void *)cuMemAllocHost_v2, 3020},
    {"cuMemFreeHost", (void *)cuMemFreeHost, 2000},
    {"cuMemHostGetFlags", (void *)cuMemHostGetFlags, 2030},
    {"cuMemHostGetDevicePointer", (void *)cuMemHostGetDevicePointer_v2, 3020},
    {"cuMemHostRegister", (void *)cuMemHostRegister_v2, 6050},
    {"cuMemHostUnregister", (void *)cuMemHostUnregister, 4000},
    {"cuMemGetInfo", (void *)cuMemGetInfo_v2, 3020},
    {"cuMemGetAddressRange", (void *)cuMemGetAddressRange_v2, 3020},
    {"cuIpcGetMemHandle", (void *)cuIpcGetMemHandle, 4010},
    {"cuIpcCloseMemHandle", (void *)cuIpcCloseMemHandle, 4010},
    {"cuCtxGetCurrent", (void *)cuCtxGetCurrent, 4000},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent, 4000},
    {"cuCtxGetDevice", (void *)cuCtxGetDevice, 2000},
    {"cuCtxPushCurrent", (void *)cuCtxPushCurrent_v2, 4000},
    {"cuCtxPopCurrent", (void *)cuCtxPopCurrent_v2, 4000},
    {"cuCtxSynchronize", (void *)cuCtxSynchronize, 2000},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain, 7000},
    {"cuDevicePrimaryCtxGetState", (void *)cuDevicePrimaryCtxGetState, 7000},
    {"cuCtxGetId", (void *)cuCtxGetId, 12000},
    {"cuCtxCreate", (void *)cuCtxCreate_v2, 3020},
    {"cuCtxDestroy", (void *)cuCtxDestroy_v2, 4000},
    {"cuEventCreate", (void *)cuEventCreate, 2000},
    {"cuEventRecord", (void *)cuEventRecord, 2000},
    {"cuEventQuery", (void *)cuEventQuery, 2000},
    {"cuEventSynchronize", (void *)cuEventSynchronize, 2000},
    {"cuEventDestroy", (void *)cuEventDestroy_v2, 4000},
    {"cuStreamWaitEvent", (void *)cuStreamWaitEvent, 3020},
    {"cuStreamQuery", (void *)cuStreamQuery, 2000},
    {"cuStreamCreate", (void *)cuStreamCreate, 2000},
    {"cuStreamCreateWithPriority", (void *)cuStreamCreateWithPriority, 5050},
    {"cuStreamDestroy", (void *)cuStreamDestroy_v2, 4000},
    {"cuStreamGetCtx", (void *)cuStreamGetCtx, 9020},
    {"cuThreadExchangeStreamCaptureMode", (void *)cuThreadExchangeStreamCaptureMode, 10010},
    {"cuStreamBeginCapture", (void *)cuStreamBeginCapture_v2, 10010},
    {"cuStreamEndCapture", (void *)cuStreamEndCapture, 10000},
    {"cuGetProcAddress", (void *)cuGetProcAddress_v2, 12000},
    {"cuMemcpy", (void *)cuMemcpy, 4000},
    {"cuMemcpyAsync", (void *)cuMemcpyAsync, 4000},
    {"cuMemcpyHtoD", (void *)cuMemcpyHtoD_v2, 3020},
    {"cuMemcpyDtoH", (void *)cuMemcpyDtoH_v2, 3020},
    {"cuMemcpyDtoD", (void *)cuMemcpyDtoD_v2, 3020},
    {"cuDeviceCanAccessPeer", (void *)cuDeviceCanAccessPeer, 4000},
    {"cuStreamGetFlags", (void *)cuStreamGetFlags, 5050},
    {"cuPointerGetAttribute", (void *)cuPointerGetAttribute, 4000},
    {"cuPointerGetAttributes", (void *)cuPointerGetAttributes, 7000},
    {"cuMemRetainAllocationHandle", (void *)cuMemRetainAllocationHandle, 11000},
    {"cuMemAddressReserve", (void *)cuMemAddressReserve, 10020},
    {"cuMemAddressFree", (void *)cuMemAddressFree, 10020},
    {"cuMemCreate", (void *)cuMemCreate, 10020},
    {"cuMemRelease", (void *)cuMemRelease, 10020},
    {"cuMemMap", (void *)cuMemMap, 10020},
    {"cuMemUnmap", (void *)cuMemUnmap, 10020},
    {"cuMemSetAccess", (void *)cuMemSetAccess, 10020},
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    ENTER();
    __atomic_fetch_add(&counters.get_proc_address, 1, __ATOMIC_RELAXED);
    int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    void *fn = NULL;
    if (strcmp(symbol, "cuMemAllocAsync") == 0 && version >= 11020)
        fn = ptds ? (void *)cuMemAllocAsync_ptsz : (void *)cuMemAllocAsync;
    else if (strcmp(symbol, "cuMemFreeAsync") == 0 && version >= 11020)
        fn = ptds ? (void *)cuMemFreeAsync_ptsz : (void *)cuMemFreeAsync;
    else if (strcmp(symbol, "cuStreamDestroy") == 0 && version >= 2000)
        fn = version >= 4000 ? (void *)cuStreamDestroy_v2 : (void *)cuStreamDestroy;
    else if (strcmp(symbol, "cuDevicePrimaryCtxRelease") == 0 && version >= 7000)
        fn = version >= 11000 ? (void *)cuDevicePrimaryCtxRelease_v2 : (void *)cuDevicePrimaryCtxRelease;
    else if (strcmp(symbol, "cuDevicePrimaryCtxReset") == 0 && version >= 7000)
        fn = version >= 11000 ? (void *)cuDevicePrimaryCtxReset_v2 : (void *)cuDevicePrimaryCtxReset;
    else if (strcmp(symbol, "cuDevicePrimaryCtxSetFlags") == 0 && version >= 7000)
        fn = version >= 11000 ? (void *)cuDevicePrimaryCtxSetFlags_v2 : (void *)cuDevicePrimaryCtxSetFlags;
    else if (strcmp(symbol, "cuIpcOpenMemHandle") == 0 && version >= 4010)
        fn = version >= 11000 ? (void *)cuIpcOpenMemHandle_v2 : (void *)cuIpcOpenMemHandle;
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
    ENTER();
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
