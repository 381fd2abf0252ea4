/* A program linked to libcudart.so (the fake one), calling the runtime API
 * like PyTorch or CuPy would. argv[1] picks the scenario; exit 0 = passed.
 * It checks its own data and, through the fake driver's counters, what
 * really reached CUDA. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prog_common.h"

extern cudaError_t cudaMalloc(void **, size_t);
extern cudaError_t cudaFree(void *);
extern cudaError_t cudaMallocAsync(void **, size_t, cudaStream_t);
extern cudaError_t cudaMallocAsync_ptsz(void **, size_t, cudaStream_t);
extern cudaError_t cudaFreeAsync(void *, cudaStream_t);
extern cudaError_t cudaFreeAsync_ptsz(void *, cudaStream_t);
extern cudaError_t cudaMemGetInfo(size_t *, size_t *);
extern cudaError_t cudaStreamCreateWithFlags(cudaStream_t *, unsigned int);
extern cudaError_t cudaStreamCreate(cudaStream_t *);
extern cudaError_t cudaStreamDestroy(cudaStream_t);
extern cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *, void *);
extern cudaError_t cudaSetDevice(int);
extern cudaError_t cudaDeviceReset(void);
extern cudaError_t cudaSetDeviceFlags(unsigned int);
extern cudaError_t cudaHostAlloc(void **, size_t, unsigned int);
extern cudaError_t cudaMallocHost(void **, size_t);
extern cudaError_t cudaFreeHost(void *);
extern cudaError_t cudaHostGetFlags(unsigned int *, void *);
extern cudaError_t cudaHostGetDevicePointer(void **, void *, unsigned int);
extern cudaError_t cudaHostRegister(void *, size_t, unsigned int);
extern cudaError_t cudaHostUnregister(void *);
extern cudaError_t cudaMallocManaged(void **, size_t, unsigned int);

#define N 400

static void basic(void)
{
    static void *p[N];
    static size_t size[N];
    unsigned long before = fake()->mem_alloc;
    for (int i = 0; i < N; i++) {
        size[i] = 1 + (size_t)(i * 7919) % (1 << 20);
        CHECK(cudaMalloc(&p[i], size[i]) == cudaSuccess, "cudaMalloc %d", i);
        CHECK(((uintptr_t)p[i] & 255) == 0, "pointer %p not 256-aligned", p[i]);
        fill(p[i], size[i], (unsigned)i);
    }
    for (int i = 0; i < N; i++)
        CHECK(intact(p[i], size[i], (unsigned)i), "allocation %d overwritten (overlap)", i);
    unsigned long reached = fake()->mem_alloc - before;
    if (shim_active())
        CHECK(reached < 20, "%lu allocations reached the driver: the pool should serve them", reached);
    else
        CHECK(reached == N, "%lu of %d allocations reached the driver", reached, N);
    for (int i = 0; i < N; i += 2)
        CHECK(cudaFree(p[i]) == cudaSuccess, "cudaFree %d", i);
    for (int i = 0; i < N; i += 2) { /* reuse after free: still no overlap with the live ones */
        CHECK(cudaMalloc(&p[i], size[i]) == cudaSuccess, "re-cudaMalloc %d", i);
        fill(p[i], size[i], (unsigned)i);
    }
    for (int i = 0; i < N; i++) {
        CHECK(intact(p[i], size[i], (unsigned)i), "allocation %d overwritten after reuse", i);
        CHECK(cudaFree(p[i]) == cudaSuccess, "final cudaFree %d", i);
    }
    void *z = (void *)1;
    CHECK(cudaMalloc(&z, 0) == cudaSuccess, "cudaMalloc(0)");
    CHECK(cudaFree(NULL) == cudaSuccess, "cudaFree(NULL)");
}

static void errors(void)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4096) == cudaSuccess, "cudaMalloc");
    CHECK(cudaFree((char *)p + 256) == cudaErrorInvalidValue, "free of an interior pointer must be invalid");
    CHECK(cudaFree(p) == cudaSuccess, "free");
    unsigned long bad_before = fake()->bad_free;
    CHECK(cudaFree(p) == cudaErrorInvalidValue, "double free must be invalid");
    if (shim_active())
        CHECK(fake()->bad_free == bad_before, "a double free of pooled memory must not reach the driver");
    int on_stack;
    CHECK(cudaFree(&on_stack) != cudaSuccess, "free of a stack address must fail");
    void *q = NULL;
    CHECK(cudaMalloc(&q, 4096) == cudaSuccess && q, "allocation after bad frees");
    fill(q, 4096, 5);
    CHECK(intact(q, 4096, 5), "data");
    CHECK(cudaFree(q) == cudaSuccess, "free after bad frees");
}

static void async(void)
{
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess, "stream");
    unsigned long async_before = fake()->mem_alloc_async + fake()->mem_alloc_async_ptsz;
    void *a, *b, *c, *d;
    CHECK(cudaMallocAsync(&a, 1000, s1) == cudaSuccess, "async s1");
    CHECK(cudaMallocAsync(&b, 3000, 0) == cudaSuccess, "async legacy");
    CHECK(cudaMallocAsync_ptsz(&c, 5000, 0) == cudaSuccess, "async ptsz");
    fill(a, 1000, 1), fill(b, 3000, 2), fill(c, 5000, 3);
    CHECK(intact(a, 1000, 1) && intact(b, 3000, 2) && intact(c, 5000, 3), "async data");
    CHECK(cudaFreeAsync(a, s1) == cudaSuccess, "free async s1");
    CHECK(cudaMallocAsync(&d, 1000, s2) == cudaSuccess, "async s2 after free on s1");
    fill(d, 1000, 4);
    CHECK(intact(b, 3000, 2) && intact(c, 5000, 3), "async data after cross-stream reuse");
    CHECK(cudaFreeAsync(b, 0) == cudaSuccess, "free async legacy");
    CHECK(cudaFreeAsync_ptsz(c, 0) == cudaSuccess, "free async ptsz");
    CHECK(cudaFree(d) == cudaSuccess, "cudaFree of an async allocation");
    unsigned long reached = fake()->mem_alloc_async + fake()->mem_alloc_async_ptsz - async_before;
    if (shim_active())
        CHECK(reached == 0, "%lu async allocations reached the driver", reached);
    else
        CHECK(reached == 4, "%lu async allocations reached the driver", reached);
    CHECK(cudaStreamDestroy(s1) == cudaSuccess && cudaStreamDestroy(s2) == cudaSuccess, "destroy");
}

static void ipc(void)
{
    void *p;
    cudaIpcMemHandle_t h;
    CHECK(cudaMalloc(&p, 1 << 20) == cudaSuccess, "cudaMalloc");
    cudaError_t e = cudaIpcGetMemHandle(&h, p);
    if (shim_active())
        CHECK(e == cudaErrorInvalidValue, "IPC export of a pooled pointer must be refused (got %d)", e);
    else
        CHECK(e == cudaSuccess, "IPC export natively (got %d)", e);
    cudaFree(p);
}

static void meminfo(void)
{
    size_t f1, t1, f2, t2;
    void *p;
    CHECK(cudaMemGetInfo(&f1, &t1) == cudaSuccess, "meminfo");
    CHECK(cudaMalloc(&p, 1 << 20) == cudaSuccess, "cudaMalloc");
    CHECK(cudaFree(p) == cudaSuccess, "cudaFree");
    CHECK(cudaMemGetInfo(&f2, &t2) == cudaSuccess, "meminfo");
    CHECK(t1 == t2 && f2 <= t2, "sane totals");
    if (shim_active() && !getenv("POOLSHIM_OPTIONS"))
        CHECK(f2 >= f1 - (1 << 20) && f2 <= f1, "meminfo=pool counts the pool's free memory (%zu vs %zu)", f2, f1);
}

static void *thread_body(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *p[16] = {0};
    size_t n[16] = {0};
    unsigned tag[16] = {0}; /* the pattern each live block was filled with */
    for (int step = 0; step < 20000; step++) {
        int k = (int)(rand_r(&seed) % 16);
        if (p[k]) {
            if (!intact(p[k], n[k], tag[k]))
                __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
            if (cudaFree(p[k]) != cudaSuccess)
                __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
            p[k] = NULL;
        } else {
            n[k] = 1 + rand_r(&seed) % 65536;
            if (cudaMalloc(&p[k], n[k]) != cudaSuccess) {
                __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
                p[k] = NULL;
                continue;
            }
            tag[k] = (unsigned)step * 16 + (unsigned)k;
            fill(p[k], n[k], tag[k]);
        }
    }
    for (int k = 0; k < 16; k++)
        if (p[k])
            cudaFree(p[k]);
    return NULL;
}

static void threads(void)
{
    pthread_t t[8];
    for (uintptr_t i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, thread_body, (void *)(i * 1000 + 1));
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
}

static void oom(void)
{
    /* FAKE_CUDA_MEMORY bounds the device; allocate until it fails */
    void *p[512];
    int n = 0;
    cudaError_t e = cudaSuccess;
    while (n < 512 && (e = cudaMalloc(&p[n], 8 << 20)) == cudaSuccess)
        n++;
    CHECK(e == cudaErrorMemoryAllocation, "out of memory must be cudaErrorMemoryAllocation (got %d after %d)", e, n);
    CHECK(n > 0 && n < 512, "some allocations fit (%d)", n);
    for (int i = 0; i < n; i += 2)
        CHECK(cudaFree(p[i]) == cudaSuccess, "free");
    void *q;
    CHECK(cudaMalloc(&q, 8 << 20) == cudaSuccess, "allocation after OOM and frees");
    cudaFree(q);
    for (int i = 1; i < n; i += 2)
        cudaFree(p[i]);
}

/* ---- process life: fork, exit, signals ---- */
static atomic_int stop_churn;

/* Allocates and frees random sizes, checking its live blocks, until told
 * to stop; thread 0 allocates stream-ordered on a non-blocking stream. With
 * `tolerate` set (exit races), failed calls are not counted. */
typedef struct churn_args {
    unsigned seed;  /* rand_r seed; 0: the stream-ordered thread */
    int tolerate;   /* errors allowed (the process is exiting under it) */
} churn_args_t;

static void *churn(void *arg)
{
    churn_args_t *a = arg;
    unsigned seed = a->seed + 1;
    cudaStream_t s = NULL;
    if (a->seed == 0 && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess && !a->tolerate)
        __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
    void *p[8] = {0};
    size_t n[8] = {0};
    unsigned tag[8] = {0};
    for (unsigned step = 0; !atomic_load(&stop_churn); step++) {
        int k = (int)(rand_r(&seed) % 8);
        if (p[k]) {
            int bad = !intact(p[k], n[k], tag[k]);
            bad |= (s ? cudaFreeAsync(p[k], s) : cudaFree(p[k])) != cudaSuccess;
            if (bad && !a->tolerate)
                __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
            p[k] = NULL;
        } else {
            n[k] = 1 + rand_r(&seed) % 100000;
            if ((s ? cudaMallocAsync(&p[k], n[k], s) : cudaMalloc(&p[k], n[k])) != cudaSuccess) {
                if (!a->tolerate)
                    __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
                p[k] = NULL;
                continue;
            }
            tag[k] = step * 8 + (unsigned)k;
            fill(p[k], n[k], tag[k]);
        }
    }
    for (int k = 0; k < 8; k++)
        if (p[k])
            cudaFree(p[k]);
    if (s)
        cudaStreamDestroy(s);
    return NULL;
}

#define CHURNERS 4
static pthread_t churners[CHURNERS];
static churn_args_t churn_args[CHURNERS];
static void start_churn(int tolerate)
{
    for (int i = 0; i < CHURNERS; i++) {
        churn_args[i] = (churn_args_t){(unsigned)i, tolerate};
        pthread_create(&churners[i], NULL, churn, &churn_args[i]);
    }
}
static void stop_churn_threads(void)
{
    atomic_store(&stop_churn, 1);
    for (int i = 0; i < CHURNERS; i++)
        pthread_join(churners[i], NULL);
}

/* Driver functions as the program would have them (through the libcuda
 * handle: the shim's hooks under the shim). */
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static struct {
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*primary_reset)(CUdevice);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_release)(CUdevice);
} drv;
static void look_up_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    gpa_fn gpa = h ? (gpa_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    CHECK(gpa != NULL, "cuGetProcAddress_v2");
    if (!gpa)
        return;
    CUdriverProcAddressQueryResult st;
    gpa("cuMemAlloc", (void **)&drv.mem_alloc, 3020, 0, &st);
    gpa("cuStreamDestroy", (void **)&drv.stream_destroy, 4000, 0, &st);
    gpa("cuDevicePrimaryCtxReset", (void **)&drv.primary_reset, 11000, 0, &st);
    gpa("cuCtxGetCurrent", (void **)&drv.ctx_get_current, 4000, 0, &st);
    gpa("cuDevicePrimaryCtxRetain", (void **)&drv.primary_retain, 7000, 0, &st);
    gpa("cuDevicePrimaryCtxRelease", (void **)&drv.primary_release, 11000, 0, &st);
    CHECK(drv.mem_alloc && drv.stream_destroy && drv.primary_reset && drv.ctx_get_current && drv.primary_retain &&
              drv.primary_release,
          "driver functions");
}

/* ---- the out-of-memory retry ----
 * Memory the program frees stays in the pool; a call the shim does not
 * serve must still get it, as natively: on CUDA's first "out of memory" the
 * shim gives the pool's free memory back and retries the call once. Run
 * with FAKE_CUDA_MEMORY=268435456 (256 MiB): the program cudaMallocs 200 MiB
 * in 8 MiB blocks and frees them all, then takes the same bytes through
 * calls the shim leaves to CUDA. */
#define RETRY_BLOCK ((size_t)8 << 20)
#define RETRY_BLOCKS 25
static struct {
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*begin_capture)(CUstream, CUstreamCaptureMode);
    CUresult (*end_capture)(CUstream, void **);
} vmm;

/* The virtual-memory calls through cuGetProcAddress, as NCCL and PyTorch's
 * expandable segments get them (the shim's hooks under the shim). */
static void look_up_vmm(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    gpa_fn gpa = h ? (gpa_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    CHECK(gpa != NULL, "cuGetProcAddress_v2");
    if (!gpa)
        return;
    CUdriverProcAddressQueryResult st;
    gpa("cuMemCreate", (void **)&vmm.create, 12000, 0, &st);
    gpa("cuMemRelease", (void **)&vmm.release, 12000, 0, &st);
    gpa("cuMemAddressReserve", (void **)&vmm.reserve, 12000, 0, &st);
    gpa("cuMemAddressFree", (void **)&vmm.address_free, 12000, 0, &st);
    gpa("cuMemMap", (void **)&vmm.map, 12000, 0, &st);
    gpa("cuMemUnmap", (void **)&vmm.unmap, 12000, 0, &st);
    gpa("cuMemSetAccess", (void **)&vmm.set_access, 12000, 0, &st);
    gpa("cuStreamBeginCapture", (void **)&vmm.begin_capture, 12000, 0, &st);
    gpa("cuStreamEndCapture", (void **)&vmm.end_capture, 12000, 0, &st);
    CHECK(vmm.create && vmm.release && vmm.reserve && vmm.address_free && vmm.map && vmm.unmap && vmm.set_access &&
              vmm.begin_capture && vmm.end_capture,
          "virtual-memory and capture functions");
}

/* cudaMallocs RETRY_BLOCKS blocks of RETRY_BLOCK bytes and frees them all. */
static void malloc_and_free_all(const char *round)
{
    void *p[RETRY_BLOCKS];
    for (int i = 0; i < RETRY_BLOCKS; i++)
        CHECK(cudaMalloc(&p[i], RETRY_BLOCK) == cudaSuccess, "%s: cudaMalloc %d of %d", round, i, RETRY_BLOCKS);
    for (int i = 0; i < RETRY_BLOCKS; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess, "%s: cudaFree %d", round, i);
}

static const CUmemAllocationProp device0_prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                                 .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};

/* The same bytes as RETRY_BLOCKS handles of physical memory, as NCCL takes
 * them: created, mapped into one reserved range, made accessible, written
 * and read back, then unmapped and released. `capture`: a stream captures
 * meanwhile (oom_retry_capture): the create that finds no memory must keep
 * CUDA's "out of memory" (the shim may not synchronize the device then); the
 * capture is ended and that create made again, which must then succeed. */
static void create_the_same_bytes(CUstream capture)
{
    CUdeviceptr range = 0;
    CHECK(vmm.reserve(&range, RETRY_BLOCKS * RETRY_BLOCK, 0, 0, 0) == CUDA_SUCCESS, "cuMemAddressReserve");
    CUmemGenericAllocationHandle h[RETRY_BLOCKS];
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    int refused_in_capture = 0;
    for (int i = 0; i < RETRY_BLOCKS && !failures; i++) {
        CUresult r = vmm.create(&h[i], RETRY_BLOCK, &device0_prop, 0);
        if (capture && r == CUDA_ERROR_OUT_OF_MEMORY && !refused_in_capture) {
            refused_in_capture = 1;
            CHECK(fake()->sync_in_capture == 0, "the device was synchronized during the capture: it would die of it");
            CHECK(vmm.end_capture(capture, NULL) == CUDA_SUCCESS, "end the capture");
            r = vmm.create(&h[i], RETRY_BLOCK, &device0_prop, 0);
        }
        CHECK(r == CUDA_SUCCESS, "cuMemCreate %d of %d (%zu MiB) returned %d (2: out of memory)", i, RETRY_BLOCKS,
              RETRY_BLOCK >> 20, r);
        if (r != CUDA_SUCCESS)
            return;
        CUdeviceptr at = range + (CUdeviceptr)i * RETRY_BLOCK;
        CHECK(vmm.map(at, RETRY_BLOCK, 0, h[i], 0) == CUDA_SUCCESS, "cuMemMap %d", i);
        CHECK(vmm.set_access(at, RETRY_BLOCK, &access, 1) == CUDA_SUCCESS, "cuMemSetAccess %d", i);
        fill((void *)(uintptr_t)at, RETRY_BLOCK, (unsigned)i);
    }
    if (capture && !refused_in_capture) { /* the pool's memory came while the capture was open */
        CHECK(fake()->sync_in_capture == 0, "the device was synchronized during the capture: it would die of it");
        CHECK(refused_in_capture, "no create met an out-of-memory answer during the capture");
        CHECK(vmm.end_capture(capture, NULL) == CUDA_SUCCESS, "end the capture");
    }
    for (int i = 0; i < RETRY_BLOCKS; i++) {
        CUdeviceptr at = range + (CUdeviceptr)i * RETRY_BLOCK;
        CHECK(intact((void *)(uintptr_t)at, RETRY_BLOCK, (unsigned)i), "handle %d's bytes", i);
        CHECK(vmm.unmap(at, RETRY_BLOCK) == CUDA_SUCCESS && vmm.release(h[i]) == CUDA_SUCCESS, "unmap, release %d", i);
    }
    CHECK(vmm.address_free(range, RETRY_BLOCKS * RETRY_BLOCK) == CUDA_SUCCESS, "cuMemAddressFree");
}

/* cuMemCreate (FAKE_CUDA_VMM=1 only: the fake has no virtual memory
 * otherwise) and then cudaMallocManaged of the bytes cudaFree gave back. */
static void oom_retry(void)
{
    malloc_and_free_all("round 1");
    look_up_vmm();
    const char *vmm_on = getenv("FAKE_CUDA_VMM");
    if (vmm_on && *vmm_on == '1' && !failures) {
        create_the_same_bytes(NULL);
        malloc_and_free_all("round 2");
    }
    void *m[RETRY_BLOCKS];
    for (int i = 0; i < RETRY_BLOCKS && !failures; i++) {
        cudaError_t e = cudaMallocManaged(&m[i], RETRY_BLOCK, CU_MEM_ATTACH_GLOBAL);
        CHECK(e == cudaSuccess, "cudaMallocManaged %d of %d returned %d (2: out of memory)", i, RETRY_BLOCKS, e);
        if (e != cudaSuccess)
            return;
        fill(m[i], RETRY_BLOCK, (unsigned)i + 100);
    }
    for (int i = 0; i < RETRY_BLOCKS && !failures; i++) {
        CHECK(intact(m[i], RETRY_BLOCK, (unsigned)i + 100), "managed block %d's bytes", i);
        CHECK(cudaFree(m[i]) == cudaSuccess, "cudaFree of managed block %d", i);
    }
}

/* The same with a capture open on a non-blocking stream when the pool's
 * memory is needed (FAKE_CUDA_VMM=1, under the shim only: natively the
 * first create already succeeds). */
static void oom_retry_capture(void)
{
    malloc_and_free_all("before the capture");
    look_up_vmm();
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(!failures && vmm.begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "begin a capture");
    if (!failures)
        create_the_same_bytes(s);
    CHECK(cudaStreamDestroy(s) == cudaSuccess, "stream destroy");
}

/* A thread-local capture is open on stream s while another thread frees
 * pooled memory (as the capturing thread itself may not call cudaFree): a
 * block made on s freed on stream t (the arena makes the block's owner
 * stream s wait for t), then blocks freed by cudaFree (under free_sync
 * device the stacks synchronize at a free). CUDA invalidates a capture whose
 * stream waits on outside work or whose context is synchronized, by
 * whatever thread: the fake must see neither, every free succeeds, and the
 * memory serves again once the capture ended. */
#define CAPTURE_BLOCKS 16
static struct {
    cudaStream_t t;
    void *on_s, *p[CAPTURE_BLOCKS];
} in_capture;

static void *free_during_capture(void *unused)
{
    (void)unused;
    CHECK(cudaFreeAsync(in_capture.on_s, in_capture.t) == cudaSuccess, "cudaFreeAsync on t of a block made on s");
    for (int i = 0; i < CAPTURE_BLOCKS; i++)
        CHECK(cudaFree(in_capture.p[i]) == cudaSuccess, "cudaFree %d during the capture", i);
    return NULL;
}

static void sync_in_capture(void)
{
    cudaStream_t s;
    void **p = in_capture.p;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream s");
    CHECK(cudaStreamCreateWithFlags(&in_capture.t, cudaStreamNonBlocking) == cudaSuccess, "stream t");
    CHECK(cudaMallocAsync(&in_capture.on_s, 64 << 10, s) == cudaSuccess, "cudaMallocAsync on s");
    for (int i = 0; i < CAPTURE_BLOCKS; i++) {
        CHECK(cudaMalloc(&p[i], 1 << 20) == cudaSuccess, "cudaMalloc %d", i);
        fill(p[i], 1 << 20, (unsigned)i);
    }
    look_up_vmm(); /* (libcuda is loaded now) */
    if (failures)
        return;
    CHECK(vmm.begin_capture((CUstream)s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS,
          "begin a capture on s");
    pthread_t other;
    CHECK(pthread_create(&other, NULL, free_during_capture, NULL) == 0 && pthread_join(other, NULL) == 0,
          "the freeing thread");
    CHECK(fake()->wait_in_capture == 0, "the capturing stream was made to wait: the capture would die of it");
    CHECK(fake()->sync_in_capture == 0, "the device was synchronized during the capture: it would die of it");
    CHECK(vmm.end_capture((CUstream)s, NULL) == CUDA_SUCCESS, "end the capture");
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < CAPTURE_BLOCKS; i++) {
            CHECK(cudaMalloc(&p[i], 1 << 20) == cudaSuccess, "cudaMalloc %d after the capture", i);
            fill(p[i], 1 << 20, (unsigned)i + 100);
        }
        for (int i = 0; i < CAPTURE_BLOCKS; i++) {
            CHECK(intact(p[i], 1 << 20, (unsigned)i + 100), "block %d after the capture", i);
            CHECK(cudaFree(p[i]) == cudaSuccess, "cudaFree %d after the capture", i);
        }
    }
    CHECK(cudaStreamDestroy(in_capture.t) == cudaSuccess, "stream t destroy");
    CHECK(cudaStreamDestroy(s) == cudaSuccess, "stream s destroy");
}

/* In the child: CUDA cannot be used in the child of a process that
 * initialised it; the shim must pass every call through (whatever another
 * thread of the parent held at the fork) so that CUDA answers as it would
 * natively (the fake: "not initialised"), and exit cleanly. Returns a bit
 * set of what went wrong (0: all good). */
static int child_after_fork(void *parent_block, cudaStream_t parent_stream)
{
    alarm(10); /* a deadlock becomes SIGALRM, not a hung test */
    int bad = 0;
    if (shim_active())
        bad |= 1; /* the shim passes through in the child */
    unsigned long before = fake()->child_calls;
    void *p = NULL;
    if (cudaMalloc(&p, 4096) != 3) /* cudaErrorInitializationError, CUDA's own answer */
        bad |= 2;
    if (fake()->child_calls == before)
        bad |= 4; /* the allocation reached CUDA */
    if (cudaFree(parent_block) != 3)
        bad |= 8; /* a pooled block of the parent: to CUDA as well, not into the parent's pool */
    before = fake()->child_calls;
    CUdeviceptr d = 0;
    if (drv.mem_alloc(&d, 4096) != CUDA_ERROR_NOT_INITIALIZED || fake()->child_calls == before)
        bad |= 16; /* the driver door passes through too */
    /* the hooks that do bookkeeping beside the call: a stream destroyed,
     * a context reset (the parent's stacks, whose locks another thread
     * may have held at the fork, must be left alone) */
    if (drv.stream_destroy((CUstream)parent_stream) != CUDA_ERROR_NOT_INITIALIZED)
        bad |= 32;
    if (drv.primary_reset(0) != CUDA_ERROR_NOT_INITIALIZED)
        bad |= 64;
    return bad;
}

/* fork() 50 times while 4 threads allocate and free (one stream-ordered).
 * Each child checks child_after_fork and exits with exit(), running the
 * atexit handlers (with statistics on, the exit report must not take a lock
 * of the parent's stacks); the parent goes on, its data intact. */
static void forks(void)
{
    void *warm;
    CHECK(cudaMalloc(&warm, 4096) == cudaSuccess, "cudaMalloc before fork");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    look_up_driver();
    if (failures)
        return;
    start_churn(0);
    for (int i = 0; i < 50; i++) {
        pid_t pid = fork();
        if (pid == 0)
            exit(child_after_fork(warm, s)); /* exit(): the handlers run */
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: %s %d", i,
              WIFEXITED(status) ? "exit status (bits of child_after_fork)" : "killed by signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        usleep(200);
    }
    stop_churn_threads();
    fill(warm, 4096, 77);
    CHECK(intact(warm, 4096, 77), "parent's block");
    CHECK(cudaFree(warm) == cudaSuccess, "cudaFree after forks");
    CHECK(cudaStreamDestroy(s) == cudaSuccess, "stream destroy after forks");
    void *p;
    CHECK(cudaMalloc(&p, 1 << 20) == cudaSuccess && cudaFree(p) == cudaSuccess, "the parent goes on");
}

/* Returns from main with live blocks, pending frees (FAKE_CUDA_EVENTS_PENDING
 * keeps them pending), stream-ordered blocks and a pinned block: the exit
 * report runs after the runtime's teardown and must read memory only (the
 * fake driver prints "calls after the runtime was torn down" otherwise). */
static void exit_live(void)
{
    static void *p[200];
    for (int i = 0; i < 200; i++) {
        CHECK(cudaMalloc(&p[i], 1000 + (size_t)i * 512) == cudaSuccess, "cudaMalloc %d", i);
        fill(p[i], 1000 + (size_t)i * 512, (unsigned)i);
    }
    for (int i = 0; i < 200; i += 2)
        CHECK(cudaFree(p[i]) == cudaSuccess, "cudaFree %d", i);
    cudaStream_t s;
    void *a, *b, *h;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(cudaMallocAsync(&a, 5000, s) == cudaSuccess && cudaMallocAsync(&b, 7000, s) == cudaSuccess, "async");
    CHECK(cudaFreeAsync(a, s) == cudaSuccess, "free async");
    CHECK(cudaHostAlloc(&h, 4096, 0) == cudaSuccess, "pinned");
}

/* exit() from another thread while 4 threads allocate and free: the
 * report prints, nothing hangs, and the exit status is exit()'s. */
static void *exit_soon(void *arg)
{
    (void)arg;
    usleep(50 * 1000);
    exit(finish("exit_thread"));
}
static void exit_thread(void)
{
    alarm(30); /* a hang becomes SIGALRM, not a hung test */
    void *live;
    CHECK(cudaMalloc(&live, 4096) == cudaSuccess, "cudaMalloc");
    start_churn(1);
    pthread_t t;
    pthread_create(&t, NULL, exit_soon, NULL);
    pthread_join(t, NULL); /* never returns: exit() ends the process */
}

/* A driver call made by the program itself after the runtime's teardown
 * (an atexit handler registered before CUDA was first used runs after the
 * teardown): the fake driver must count it. The negative control of
 * exit_live. */
static void late_call(void)
{
    CUcontext c;
    drv.ctx_get_current(&c);
}
static void exit_late_call(void)
{
    atexit(late_call);
    void *p;
    CHECK(cudaMalloc(&p, 4096) == cudaSuccess, "cudaMalloc");
    look_up_driver();
}

/* SIGALRM every 20 µs (setitimer) while the main thread and 2 others
 * allocate, fill, check and free: the handler only counts. No deadlock, no
 * failed call, no overwritten block; with statistics on, the exit report
 * must show 150000 cudaMalloc and 150000 cudaFree, nothing outstanding. */
static atomic_int ticks;
static void on_alarm(int sig)
{
    (void)sig;
    atomic_fetch_add_explicit(&ticks, 1, memory_order_relaxed);
}
static void *alloc_loop(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < 50000; i++) {
        void *p;
        size_t n = 1 + rand_r(&seed) % 20000;
        if (cudaMalloc(&p, n) != cudaSuccess) {
            __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
            continue;
        }
        fill(p, n, (unsigned)i);
        if (!intact(p, n, (unsigned)i) || cudaFree(p) != cudaSuccess)
            __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}
static void *watchdog(void *arg)
{
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alrm, NULL); /* (a signal would cut its sleep short) */
    sleep((unsigned)(uintptr_t)arg);
    fprintf(stderr, "FAIL: still running after %u s (deadlock?)\n", (unsigned)(uintptr_t)arg);
    _exit(3);
}
static void signals(void)
{
    pthread_t dog; /* (SIGALRM is taken: a thread stands watch instead of alarm()) */
    pthread_create(&dog, NULL, watchdog, (void *)(uintptr_t)60);
    pthread_detach(dog);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 20}, {0, 20}};
    setitimer(ITIMER_REAL, &every, NULL);
    pthread_t t[2];
    for (uintptr_t i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, alloc_loop, (void *)(i + 11));
    alloc_loop((void *)(uintptr_t)5);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    CHECK(atomic_load(&ticks) >= 1000, "only %d signals arrived", atomic_load(&ticks));
    printf("signals: %d\n", atomic_load(&ticks));
}

static void devices(void)
{
    void *a, *b;
    CHECK(cudaSetDevice(1) == cudaSuccess, "set device 1");
    CHECK(cudaMalloc(&b, 4096) == cudaSuccess, "malloc on device 1");
    CHECK(cudaSetDevice(0) == cudaSuccess, "set device 0");
    CHECK(cudaMalloc(&a, 4096) == cudaSuccess, "malloc on device 0");
    CHECK(cudaFree(b) == cudaSuccess, "free of a device-1 pointer with device 0 current");
    CHECK(cudaFree(a) == cudaSuccess, "free device 0");
}

/* ---- context lifecycle ---- */
/* Allocates n blocks, fills them and checks them: the pool after a reset
 * hands out memory of the new context. */
static void use_fresh_memory(int n, unsigned seed, const char *when)
{
    void *p[64];
    size_t size[64];
    for (int i = 0; i < n && i < 64; i++) {
        size[i] = 1000 + (size_t)i * 3000;
        CHECK(cudaMalloc(&p[i], size[i]) == cudaSuccess, "%s: cudaMalloc %d", when, i);
        fill(p[i], size[i], seed + (unsigned)i);
    }
    for (int i = 0; i < n && i < 64; i++) {
        CHECK(intact(p[i], size[i], seed + (unsigned)i), "%s: block %d overwritten", when, i);
        CHECK(cudaFree(p[i]) == cudaSuccess, "%s: cudaFree %d", when, i);
    }
}

/* Live blocks, pending frees, a tracked non-blocking stream with async
 * blocks (live and freed), then cudaDeviceReset: the shim must drop all of
 * it without one CUDA call on the dead context, hand out new memory, and
 * pass a stale pointer's free to CUDA. */
static void reset(void)
{
    void *live_blocks[20], *stale = NULL;
    for (int i = 0; i < 20; i++)
        CHECK(cudaMalloc(&live_blocks[i], 4096 + (size_t)i * 100) == cudaSuccess, "cudaMalloc %d", i);
    for (int i = 0; i < 20; i += 2) /* pending frees (FAKE_CUDA_EVENTS_PENDING keeps them pending) */
        CHECK(cudaFree(live_blocks[i]) == cudaSuccess, "cudaFree %d", i);
    stale = live_blocks[1];
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    void *a1, *a2;
    CHECK(cudaMallocAsync(&a1, 5000, s) == cudaSuccess && cudaMallocAsync(&a2, 7000, s) == cudaSuccess, "async");
    CHECK(cudaFreeAsync(a1, s) == cudaSuccess, "free async");
    unsigned long dead_before = fake()->dead_calls;
    CHECK(cudaDeviceReset() == cudaSuccess, "cudaDeviceReset");
    CHECK(fake()->ctx_destroyed >= 1, "the reset destroyed the context");
    CHECK(fake()->bytes_outstanding == 0, "%lu device bytes survived the reset", fake()->bytes_outstanding);

    use_fresh_memory(30, 100, "after reset");
    for (int cycle = 0; cycle < 50; cycle++) {
        void *p;
        CHECK(cudaMalloc(&p, 1 << 16) == cudaSuccess, "cycle %d", cycle);
        memset(p, cycle, 1 << 16);
        CHECK(cudaFree(p) == cudaSuccess, "cycle %d free", cycle);
    }
    /* the freed stream's blocks and the dead stream: nothing of it is used */
    void *b;
    CHECK(cudaMallocAsync(&b, 5000, 0) == cudaSuccess, "async on the legacy stream after reset");
    fill(b, 5000, 9);
    CHECK(intact(b, 5000, 9), "async data after reset");
    CHECK(cudaFreeAsync(b, 0) == cudaSuccess, "free async after reset");
    /* a pointer from before the reset: what CUDA says natively */
    cudaError_t e = cudaFree(stale);
    CHECK(e == cudaErrorInvalidValue, "stale cudaFree returned %d (CUDA's own answer expected)", e);
    CHECK(fake()->dead_calls == dead_before, "%lu calls on objects of the dead context",
          fake()->dead_calls - dead_before);
}

/* 100 resets with allocations between them: device blocks (some freed)
 * and a 3 MiB pinned block live at each reset; nothing survives a reset
 * (with FAKE_CUDA_VMM=1: the device range and the pinned host range, given
 * back before it), and device memory must not grow. */
static void reset_loop(void)
{
    unsigned long most = 0;
    for (int round = 0; round < 100; round++) {
        void *p[8];
        for (int i = 0; i < 8; i++) {
            CHECK(cudaMalloc(&p[i], (size_t)(i + 1) << 14) == cudaSuccess, "round %d malloc %d", round, i);
            fill(p[i], (size_t)(i + 1) << 14, (unsigned)(round + i));
        }
        for (int i = 0; i < 8; i++)
            CHECK(intact(p[i], (size_t)(i + 1) << 14, (unsigned)(round + i)), "round %d block %d", round, i);
        for (int i = 0; i < 8; i += 2)
            CHECK(cudaFree(p[i]) == cudaSuccess, "round %d free %d", round, i);
        void *pinned = NULL; /* live at the reset: it goes with the context (slab or host range) */
        CHECK(cudaHostAlloc(&pinned, (size_t)3 << 20, 0) == cudaSuccess, "round %d pinned", round);
        if (pinned)
            fill(pinned, (size_t)3 << 20, (unsigned)round);
        if (fake()->bytes_outstanding > most)
            most = fake()->bytes_outstanding;
        CHECK(cudaDeviceReset() == cudaSuccess, "reset %d", round);
        CHECK(fake()->bytes_outstanding == 0, "round %d: %lu bytes survive a reset", round, fake()->bytes_outstanding);
    }
    CHECK(most <= (64u << 20), "at most %lu bytes reserved at once (grows with resets?)", most);
    CHECK(fake()->dead_calls == 0, "%lu calls on dead objects", fake()->dead_calls);
}

/* Device 1 allocates and checks its data on 4 threads while the main
 * thread allocates on device 0 and resets it, again and again. */
static atomic_int stop_other;
static void *other_device(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    CHECK(cudaSetDevice(1) == cudaSuccess, "set device 1");
    while (!atomic_load(&stop_other)) {
        void *p;
        size_t n = 1 + rand_r(&seed) % 100000;
        if (cudaMalloc(&p, n) != cudaSuccess) {
            __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
            continue;
        }
        fill(p, n, seed);
        if (!intact(p, n, seed) || cudaFree(p) != cudaSuccess)
            __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}
static void reset_threads(void)
{
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, other_device, (void *)(i + 7));
    CHECK(cudaSetDevice(0) == cudaSuccess, "set device 0");
    for (int round = 0; round < 200; round++) {
        use_fresh_memory(4, (unsigned)round, "device 0 between resets");
        CHECK(cudaDeviceReset() == cudaSuccess, "reset %d", round);
    }
    atomic_store(&stop_other, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK(fake()->dead_calls == 0, "%lu calls on dead objects", fake()->dead_calls);
}

/* The very first CUDA call is a reset; then allocate, reset, exit. */
static void reset_first(void)
{
    CHECK(cudaDeviceReset() == cudaSuccess, "reset as the first call");
    use_fresh_memory(5, 1, "after a first reset");
    CHECK(cudaDeviceReset() == cudaSuccess, "reset before exit");
    CHECK(fake()->dead_calls == 0, "%lu calls on dead objects", fake()->dead_calls);
}

/* cudaSetDeviceFlags that recreates the context (FAKE_CUDA_SETFLAGS_RECREATES=1). */
static void set_flags(void)
{
    void *p;
    CHECK(cudaMalloc(&p, 4096) == cudaSuccess, "malloc");
    CHECK(cudaSetDeviceFlags(4) == cudaSuccess, "cudaSetDeviceFlags");
    use_fresh_memory(10, 3, "after cudaSetDeviceFlags");
    CHECK(fake()->dead_calls == 0, "%lu calls on dead objects", fake()->dead_calls);
}

/* cudaHostGetFlags, cudaHostGetDevicePointer, cudaHostRegister and
 * cudaHostUnregister of pinned block q (n bytes) answer as CUDA does for
 * cuMemHostAlloc memory, at its start and inside it: the flags (pooled:
 * portable|mapped, what every pooled block is; natively what was asked,
 * 0 here), device pointer = host pointer, "already registered", "not
 * registered". The fake driver answers only for cuMemHostAlloc memory, so
 * a block of the host range passes only if the shim answers itself. */
static void pinned_queries(void *q, size_t n, int pooled, const char *what)
{
    unsigned flags = 99;
    CHECK(cudaHostGetFlags(&flags, q) == cudaSuccess, "%s: cudaHostGetFlags", what);
    CHECK(flags == (pooled ? 3u : 0u), "%s: flags %u", what, flags);
    flags = 99;
    CHECK(cudaHostGetFlags(&flags, (char *)q + n - 1) == cudaSuccess && flags == (pooled ? 3u : 0u),
          "%s: cudaHostGetFlags of the last byte (%u)", what, flags);
    void *d = NULL;
    CHECK(cudaHostGetDevicePointer(&d, (char *)q + n / 2, 0) == cudaSuccess && d == (char *)q + n / 2,
          "%s: cudaHostGetDevicePointer inside the block", what);
    CHECK(cudaHostGetDevicePointer(&d, q, 1) == cudaErrorInvalidValue, "%s: its flags must be 0", what);
    CHECK(cudaHostRegister(q, n, 0) == cudaErrorInvalidValue, "%s: cudaHostRegister", what);
    CHECK(cudaHostRegister((char *)q + n / 2, 4096, 0) == cudaErrorInvalidValue,
          "%s: cudaHostRegister from inside", what);
    CHECK(cudaHostUnregister(q) == cudaErrorInvalidValue, "%s: cudaHostUnregister", what);
}

/* Pinned host memory through the runtime door: cudaHostAlloc (every pooled
 * flag), cudaMallocHost, cudaFreeHost; write-combined passes through; a
 * double free and an interior pointer are "invalid value"; cudaFree of a
 * pinned block too; a foreign pointer reaches the driver. */
static void pinned(void)
{
    static void *p[64];
    static const unsigned flag_cases[] = {0, 1, 2, 3}; /* default, portable, mapped, portable|mapped */
    const char *options = getenv("POOLSHIM_OPTIONS");
    int pooled = shim_active() && !(options && strstr(options, "host.enable=0"));
    /* one host range of host-located cuMemCreate pieces: the default where
     * the driver has virtual memory with host locations (FAKE_CUDA_VMM=1,
     * not FAKE_CUDA_VMM_NO_HOST), unless host.expandable=0 */
    const char *vmm = getenv("FAKE_CUDA_VMM"), *no_host = getenv("FAKE_CUDA_VMM_NO_HOST");
    int expandable = pooled && vmm && *vmm == '1' && !(no_host && *no_host == '1') &&
                     !(options && strstr(options, "host.expandable=0"));
    unsigned long before = fake()->host_alloc, slab_flags = 0, pieces = fake()->vm_created_host;
    unsigned long host_access = fake()->vm_access_host, device_access = fake()->vm_access_device;
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 64; i++) {
            size_t n = 4096 + (size_t)i * 1000;
            cudaError_t e = i % 5 == 4 ? cudaMallocHost(&p[i], n) : cudaHostAlloc(&p[i], n, flag_cases[i % 4]);
            CHECK(e == cudaSuccess, "pinned alloc %d", i);
            if (!round && !i)
                slab_flags = fake()->host_alloc_flags;
            fill(p[i], n, (unsigned)(i + round));
        }
        for (int i = 0; i < 64; i++)
            CHECK(intact(p[i], 4096 + (size_t)i * 1000, (unsigned)(i + round)), "pinned block %d overwritten", i);
        for (int i = 0; i < 64; i++)
            CHECK(cudaFreeHost(p[i]) == cudaSuccess, "cudaFreeHost %d", i);
    }
    unsigned long reached = fake()->host_alloc - before;
    pieces = fake()->vm_created_host - pieces;
    if (expandable) {
        CHECK(reached == 0, "%lu pinned allocations reached cuMemHostAlloc: the host range should serve them", reached);
        CHECK(pieces > 0 && pieces < 10, "%lu host pieces created", pieces);
        CHECK(fake()->vm_access_host - host_access == pieces, "each piece readable by the host (%lu grants)",
              fake()->vm_access_host - host_access);
        CHECK(fake()->vm_access_device - device_access >= pieces, "and by the device (%lu grants)",
              fake()->vm_access_device - device_access);
        /* a block that spans two pieces of the range: one block, one free */
        void *big = NULL;
        CHECK(cudaHostAlloc(&big, (size_t)5 << 20, 0) == cudaSuccess, "a 5 MiB pinned block");
        if (big) {
            fill(big, (size_t)5 << 20, 77);
            CHECK(intact(big, (size_t)5 << 20, 77), "5 MiB block across pieces");
            pinned_queries(big, (size_t)5 << 20, 1, "a block across pieces");
            CHECK(cudaFreeHost((char *)big + (3 << 20)) == cudaErrorInvalidValue, "interior pointer past a piece");
            CHECK(cudaFreeHost(big) == cudaSuccess, "free the 5 MiB block");
        }
    } else if (pooled) {
        CHECK(pieces == 0, "%lu host pieces created: slabs expected", pieces);
        CHECK(reached < 10, "%lu pinned allocations reached the driver: the host pool should serve them", reached);
        CHECK(slab_flags == 3, "pooled slabs are portable|mapped (%lu)", slab_flags);
    } else {
        CHECK(reached == 256, "%lu of 256 pinned allocations reached the driver", reached);
    }
    /* write-combined: passed through to CUDA, and freed there */
    void *wc = NULL;
    before = fake()->host_alloc;
    CHECK(cudaHostAlloc(&wc, 8192, 4) == cudaSuccess, "write-combined");
    CHECK(fake()->host_alloc == before + 1, "write-combined memory must come from CUDA itself");
    CHECK(fake()->host_alloc_flags == 4, "with its flags (%lu)", fake()->host_alloc_flags);
    unsigned long freed = fake()->host_free;
    CHECK(cudaFreeHost(wc) == cudaSuccess, "free write-combined (a foreign pointer)");
    CHECK(fake()->host_free == freed + 1, "the foreign pointer reached cuMemFreeHost");
    {
        void *q = NULL, *plain = malloc(8192);
        CHECK(cudaHostAlloc(&q, 4096, 0) == cudaSuccess, "alloc");
        pinned_queries(q, 4096, pooled, "a pinned block");
        /* memory of the program's own: registered and unregistered by CUDA */
        CHECK(cudaHostRegister(plain, 8192, 0) == cudaSuccess, "cudaHostRegister of malloc'd memory");
        CHECK(cudaHostUnregister(plain) == cudaSuccess, "cudaHostUnregister of it");
        free(plain);
        CHECK(cudaFreeHost(q) == cudaSuccess, "free");
    }
    if (pooled) {
        void *q;
        CHECK(cudaHostAlloc(&q, 4096, 0) == cudaSuccess, "alloc");
        CHECK(cudaFreeHost((char *)q + 256) == cudaErrorInvalidValue, "interior pointer");
        CHECK(cudaFree(q) == cudaErrorInvalidValue, "cudaFree of pinned memory");
        void *d;
        CHECK(cudaMalloc(&d, 4096) == cudaSuccess, "device alloc");
        CHECK(cudaFreeHost(d) == cudaErrorInvalidValue, "cudaFreeHost of device memory");
        CHECK(cudaFree(d) == cudaSuccess, "device free");
        CHECK(cudaFreeHost(q) == cudaSuccess, "free");
        CHECK(cudaFreeHost(q) == cudaErrorInvalidValue, "double free");
    }
    CHECK(cudaFreeHost(NULL) == cudaSuccess, "cudaFreeHost(NULL)");
}

/* The [host] adaptors end to end (run with POOLSHIM_OPTIONS naming
 * host.limit=1MiB): two 512 KiB blocks fit the limit, one byte more is
 * refused with cudaErrorMemoryAllocation, a freed block's bytes count again, and one
 * block stays live for the track adaptor's leak report at exit. Without the
 * limit (native, or host.limit unset) every call succeeds. */
static void pinned_adaptors(void)
{
    const char *options = getenv("POOLSHIM_OPTIONS");
    int limited = shim_active() && options && strstr(options, "host.limit=1MiB");
    static void *a, *b, *c, *kept;
    CHECK(cudaHostAlloc(&a, 512 << 10, 0) == cudaSuccess, "512 KiB");
    CHECK(cudaMallocHost(&b, 512 << 10) == cudaSuccess, "another 512 KiB");
    cudaError_t e = cudaHostAlloc(&c, 1, 0);
    if (limited) {
        CHECK(e == cudaErrorMemoryAllocation, "one byte past host.limit: %d", (int)e);
    } else {
        CHECK(e == cudaSuccess, "no limit: %d", (int)e);
        CHECK(cudaFreeHost(c) == cudaSuccess, "free");
    }
    CHECK(cudaFreeHost(a) == cudaSuccess, "free a");
    CHECK(cudaHostAlloc(&kept, 4000, 0) == cudaSuccess, "freed bytes count again");
    CHECK(cudaFreeHost(b) == cudaSuccess, "free b");
    /* `kept` stays live: a leak for the track adaptor */
}

/* debug.nvtx against the fake NVTX tool (tests/shim/fake_nvtx.c, loaded by
 * NVTX through NVTX_INJECTION64_PATH): each block is a region of exactly the
 * bytes asked for, inside a registered heap, from allocation to free; with
 * the option off (argv[2] = "off") the shim registers nothing. */
static void nvtx(const char *mode)
{
    const char *path = getenv("NVTX_INJECTION64_PATH");
    CHECK(path != NULL, "NVTX_INJECTION64_PATH names the fake tool");
    if (!path)
        return;
    void *tool = dlopen(path, RTLD_NOW);
    CHECK(tool != NULL, "dlopen %s: %s", path, dlerror());
    if (!tool)
        return;
    size_t (*region_size)(const void *) = (size_t (*)(const void *))dlsym(tool, "fake_nvtx_region_size");
    int (*in_heap)(const void *) = (int (*)(const void *))dlsym(tool, "fake_nvtx_in_heap");
    size_t (*live_regions)(void) = (size_t (*)(void))dlsym(tool, "fake_nvtx_live_regions");
    size_t (*heaps)(void) = (size_t (*)(void))dlsym(tool, "fake_nvtx_heaps_registered");
    long (*errors_seen)(void) = (long (*)(void))dlsym(tool, "fake_nvtx_errors");
    int on = strcmp(mode, "off") != 0;
    /* a reset takes the pool's memory with the context: no heap may stay (first,
     * before any barrier made an event the fake driver would not free at the reset) */
    size_t (*live_heaps)(void) = (size_t (*)(void))dlsym(tool, "fake_nvtx_live_heaps");
    void *r = NULL;
    CHECK(cudaMalloc(&r, 3000) == cudaSuccess, "cudaMalloc before the reset");
    if (on)
        CHECK(live_heaps() > 0 && region_size(r) == 3000, "a live block before the reset");
    CHECK(cudaDeviceReset() == cudaSuccess, "cudaDeviceReset");
    CHECK(live_heaps() == 0, "%zu heaps left after the reset", live_heaps());
    CHECK(cudaMalloc(&r, 3000) == cudaSuccess, "cudaMalloc after the reset");
    if (on)
        CHECK(region_size(r) == 3000 && in_heap(r), "the new stack registers again");
    CHECK(cudaFree(r) == cudaSuccess, "free after the reset");
    CHECK(live_regions() == 0, "the freed block is no region");
    static const size_t sizes[] = {1000, 769, 4, 256, (64u << 20) + 3, 12345};
    enum { COUNT = sizeof sizes / sizeof sizes[0] };
    void *p[COUNT];
    for (int i = 0; i < COUNT; i++) {
        CHECK(cudaMalloc(&p[i], sizes[i]) == cudaSuccess, "cudaMalloc %zu", sizes[i]);
        fill(p[i], sizes[i], (unsigned)i);
    }
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, 1) == cudaSuccess, "stream");
    void *q = NULL;
    CHECK(cudaMallocAsync(&q, 5000, s) == cudaSuccess, "cudaMallocAsync");
    for (int i = 0; i < COUNT; i++) {
        if (on) {
            CHECK(region_size(p[i]) == sizes[i], "block %d: region of %zu bytes, asked %zu", i, region_size(p[i]),
                  sizes[i]);
            CHECK(in_heap(p[i]), "block %d lies in a registered heap", i);
        } else {
            CHECK(region_size(p[i]) == 0 && !in_heap(p[i]), "option off: block %d not registered", i);
        }
    }
    if (on)
        CHECK(region_size(q) == 5000, "stream-ordered block: region of %zu bytes", region_size(q));
    CHECK(live_regions() == (on ? COUNT + 1u : 0u), "%zu live regions", live_regions());
    CHECK(cudaFree(p[0]) == cudaSuccess && cudaFree(p[4]) == cudaSuccess, "free two");
    CHECK(cudaFreeAsync(q, s) == cudaSuccess, "cudaFreeAsync");
    CHECK(region_size(p[0]) == 0 && region_size(p[4]) == 0 && region_size(q) == 0, "freed blocks are no regions");
    if (on)
        CHECK(region_size(p[1]) == sizes[1], "a live neighbour keeps its region");
    CHECK(cudaFree(p[0]) == cudaErrorInvalidValue, "double free refused");
    for (int i = 0; i < COUNT; i++) /* reuse: registered again with the new size */
        if (i == 0 || i == 4) {
            CHECK(cudaMalloc(&p[i], sizes[i] / 2 + 1) == cudaSuccess, "re-cudaMalloc %d", i);
            if (on)
                CHECK(region_size(p[i]) == sizes[i] / 2 + 1, "reused block %d: %zu bytes", i, region_size(p[i]));
        }
    for (int i = 0; i < COUNT; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess, "final free %d", i);
    CHECK(cudaStreamDestroy(s) == cudaSuccess, "stream destroy");
    CHECK(live_regions() == 0, "%zu regions left after every free", live_regions());
    CHECK(on ? heaps() > 0 : heaps() == 0, "%zu heaps registered", heaps());
    CHECK(errors_seen() == 0, "the tool saw %ld rule breaks", errors_seen());
}

/* debug.nvtx_ranges against the fake NVTX tool: growth, a barrier and the
 * decay's release each show as a range of their kind, every range closes,
 * with the decay's release coming from the give-back thread. With the option
 * off (argv[2] = "off") no range at all. Run with POOLSHIM_DECAY_MS small
 * and barrier_floor = 0. */
static void nvtx_ranges(const char *mode)
{
    const char *path = getenv("NVTX_INJECTION64_PATH");
    CHECK(path != NULL, "NVTX_INJECTION64_PATH names the fake tool");
    void *tool = path ? dlopen(path, RTLD_NOW) : NULL;
    CHECK(tool != NULL, "dlopen %s", path ? path : "(unset)");
    if (!tool)
        return;
    size_t (*ranges)(const char *) = (size_t (*)(const char *))dlsym(tool, "fake_nvtx_ranges");
    int (*open_ranges)(void) = (int (*)(void))dlsym(tool, "fake_nvtx_open_ranges");
    long (*errors_seen)(void) = (long (*)(void))dlsym(tool, "fake_nvtx_errors");
    void (*print_ranges)(FILE *) = (void (*)(FILE *))dlsym(tool, "fake_nvtx_print_ranges");
    int on = strcmp(mode, "off") != 0;
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, 64u << 20) == cudaSuccess, "cudaMalloc 64 MiB");
    fill(a, 64u << 20, 1);
    size_t grew = ranges("grow: ");
    CHECK(on ? grew > 0 : grew == 0, "%zu growth ranges after the first cudaMalloc", grew);
    CHECK(cudaFree(a) == cudaSuccess, "cudaFree");
    CHECK(cudaMalloc(&b, 64u << 20) == cudaSuccess, "cudaMalloc again: a barrier first");
    CHECK(on ? ranges("barrier") > 0 : ranges("barrier") == 0, "%zu barrier ranges", ranges("barrier"));
    CHECK(ranges("release: ") == 0, "nothing released while the block is in use");
    CHECK(cudaFree(b) == cudaSuccess, "cudaFree again");
    for (int i = 0; i < 300 && on && (ranges("release: ") == 0 || open_ranges() != 0); i++)
        usleep(10000); /* the decay (POOLSHIM_DECAY_MS) gives the idle pool back */
    CHECK(on ? ranges("release: ") > 0 : ranges("") == 0, "%zu release ranges, %zu in all", ranges("release: "),
          ranges(""));
    CHECK(open_ranges() == 0, "%d ranges left open", open_ranges());
    CHECK(errors_seen() == 0, "the tool saw %ld rule breaks", errors_seen());
    if (failures)
        print_ranges(stderr);
}

/* debug.guard through the shim (the fake driver's cuMemsetD8Async and
 * cuMemcpyDtoH work on host memory): argv[2] "overflow" writes one byte
 * past a block (the shim reports it, the test runner checks the text),
 * "clean" stays inside every block. Blocks keep their contents. */
static void guard(const char *mode)
{
    void *p[8];
    for (int i = 0; i < 8; i++) {
        CHECK(cudaMalloc(&p[i], 1000 + (size_t)i) == cudaSuccess, "cudaMalloc");
        fill(p[i], 1000 + (size_t)i, (unsigned)i);
    }
    if (!strcmp(mode, "overflow"))
        ((unsigned char *)p[3])[1003] = 0; /* one byte past block 3 */
    for (int i = 0; i < 8; i++) {
        CHECK(intact(p[i], 1000 + (size_t)i, (unsigned)i), "block %d intact", i);
        CHECK(cudaFree(p[i]) == cudaSuccess, "cudaFree %d", i);
    }
    fprintf(stderr, "guard: block 3 was %p\n", p[3]);
}

/* Remap on growth over the fake driver's virtual memory (FAKE_CUDA_VMM=1):
 * A is freed, a small allocation's eager barrier releases it, then a block
 * larger than anything free grows the pool past a kept separator, and the
 * remap wants A's pieces. Whether it synchronizes depends on whether the
 * barrier's event has completed (FAKE_CUDA_EVENTS_PENDING): test_shim.c
 * reads remap_syncs and remaps_idle from the exit statistics. */
static void remap(void)
{
    void *a, *separator, *small, *big;
    CHECK(cudaMalloc(&a, 64u << 20) == cudaSuccess, "cudaMalloc A");
    CHECK(cudaMalloc(&separator, 2u << 20) == cudaSuccess, "cudaMalloc separator");
    CHECK(cudaFree(a) == cudaSuccess, "cudaFree A");
    CHECK(cudaMalloc(&small, 1u << 20) == cudaSuccess, "cudaMalloc small");
    CHECK(cudaMalloc(&big, 96u << 20) == cudaSuccess, "cudaMalloc big");
    CHECK(cudaFree(big) == cudaSuccess, "cudaFree big");
    CHECK(cudaFree(small) == cudaSuccess, "cudaFree small");
    CHECK(cudaFree(separator) == cudaSuccess, "cudaFree separator");
}

/* remap's lending, then a reset while the lent addresses are still mapped
 * (FAKE_CUDA_EVENTS_PENDING: their barrier never passes): the reset gives
 * every piece back once (a handle mapped at two addresses is released
 * once: the fake frees it at its release, so twice is a double free) and
 * the device holds nothing after it. */
static void remap_reset(void)
{
    void *a, *separator, *small, *big;
    CHECK(cudaMalloc(&a, 64u << 20) == cudaSuccess, "cudaMalloc A");
    CHECK(cudaMalloc(&separator, 2u << 20) == cudaSuccess, "cudaMalloc separator");
    CHECK(cudaFree(a) == cudaSuccess, "cudaFree A");
    CHECK(cudaMalloc(&small, 1u << 20) == cudaSuccess, "cudaMalloc small");
    CHECK(cudaMalloc(&big, 96u << 20) == cudaSuccess, "cudaMalloc big");
    fill(big, 96u << 20, 5);
    CHECK(intact(big, 96u << 20, 5), "big holds what was written");
    /* lent, not waited for: nothing was unmapped, and more was mapped than created */
    CHECK(fake()->vm_unmapped == 0, "%lu pieces unmapped before the reset (a remap that waited)",
          fake()->vm_unmapped);
    unsigned long created = fake()->vm_created, released = fake()->vm_released;
    CHECK(released == 0, "%lu pieces released before the reset", released);
    CHECK(cudaDeviceReset() == cudaSuccess, "cudaDeviceReset");
    CHECK(fake()->bytes_outstanding == 0, "%lu device bytes survived the reset", fake()->bytes_outstanding);
    CHECK(fake()->vm_released == created, "%lu releases for %lu pieces (each exactly once)", fake()->vm_released,
          created);
    printf("remap_reset: %lu pieces released once by the reset\n", created);
    use_fresh_memory(10, 77, "after reset");
}

/* `rounds` times cudaFree(*a), then a 64 MiB request only that block fits:
 * with POOLSHIM_OPTIONS barrier_floor=0 each is a barrier, not a growth. */
static void free_and_take_back(void **a, int rounds)
{
    for (int round = 0; round < rounds; round++) {
        CHECK(cudaFree(*a) == cudaSuccess, "cudaFree (%d)", round);
        CHECK(cudaMalloc(a, 64u << 20) == cudaSuccess, "cudaMalloc (%d)", round);
    }
}

/* Barriers with 4 live non-blocking streams the program gives no work:
 * `rounds` times cudaFree(A), then a request only A fits (with
 * POOLSHIM_OPTIONS barrier_floor=0 the pool issues a barrier rather than
 * grow). Prints what reached the fake driver meanwhile, as "NAME:
 * records=.. waits=.. queries=.."; test_shim.c sets those beside the
 * barriers counted in the statistics (shim/gpu_ops_cuda.c, 4. b: an idle
 * stream gets no event record). barrier_streams: one round; barrier_lagging:
 * 6, where each barrier makes the streams wait for its E, so that while E
 * stays pending (FAKE_CUDA_EVENTS_PENDING) they are busy and the next
 * barrier joins them. */
static void barrier_rounds(const char *name, int rounds)
{
    cudaStream_t s[4];
    for (int i = 0; i < 4; i++)
        CHECK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking) == cudaSuccess, "stream %d", i);
    void *a;
    CHECK(cudaMalloc(&a, 64u << 20) == cudaSuccess, "cudaMalloc");
    unsigned long records = fake()->event_record, waits = fake()->stream_wait, queries = fake()->stream_query;
    free_and_take_back(&a, rounds);
    printf("%s: records=%lu waits=%lu queries=%lu\n", name, fake()->event_record - records,
           fake()->stream_wait - waits, fake()->stream_query - queries);
    CHECK(cudaFree(a) == cudaSuccess, "cudaFree");
    for (int i = 0; i < 4; i++)
        CHECK(cudaStreamDestroy(s[i]) == cudaSuccess, "stream destroy %d", i);
}

/* A non-blocking stream destroyed through the driver's unversioned
 * cuStreamDestroy, fetched by `door` (gpa: cuGetProcAddress at version
 * 3020, as a binary built before CUDA 4.0 gets it; dlsym: by name from
 * the libcuda handle), then barriers (run with barrier_floor=0): none may
 * touch the dead stream (the fake counts calls on dead objects). */
static void stream_destroy_v1(const char *door)
{
    cudaStream_t kept, gone;
    CHECK(cudaStreamCreateWithFlags(&kept, cudaStreamNonBlocking) == cudaSuccess, "stream kept");
    CHECK(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking) == cudaSuccess, "stream destroyed");
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CUresult (*destroy)(CUstream) = NULL;
    if (h && !strcmp(door, "dlsym")) {
        destroy = (CUresult(*)(CUstream))dlsym(h, "cuStreamDestroy");
    } else if (h) {
        gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
        CUdriverProcAddressQueryResult st;
        if (gpa)
            gpa("cuStreamDestroy", (void **)&destroy, 3020, 0, &st);
    }
    CHECK(destroy != NULL, "cuStreamDestroy by %s", door);
    if (!destroy)
        return;
    CHECK(destroy((CUstream)gone) == CUDA_SUCCESS, "cuStreamDestroy (v1)");
    unsigned long dead_before = fake()->dead_calls, barriers_before = fake()->event_record;
    void *a;
    CHECK(cudaMalloc(&a, 64u << 20) == cudaSuccess, "cudaMalloc");
    free_and_take_back(&a, 4);
    CHECK(fake()->event_record > barriers_before, "no barrier was issued");
    CHECK(fake()->dead_calls == dead_before, "%lu calls on the destroyed stream", fake()->dead_calls - dead_before);
    CHECK(cudaFree(a) == cudaSuccess, "cudaFree");
    CHECK(cudaStreamDestroy(kept) == cudaSuccess, "stream destroy");
    printf("stream_destroy_v1 %s: ok\n", door);
}

/* The eager barrier's trigger (core/reuse.c, 6b): 256 MiB held, 128 MiB
 * made and freed (ready memory), then 16 pairs of 17 MiB (above the thread
 * caches' 16 MiB). `mode` none: the program uses the legacy stream alone,
 * the barriers join nothing and one comes once barrier_floor (32 MiB) is
 * pending; busy: a non-blocking stream with work in flight
 * (FAKE_CUDA_STREAMS_BUSY=1), joined by every barrier; blocking: a blocking
 * stream, which the barrier's event on the legacy stream joins when it is
 * busy (FAKE_CUDA_STREAMS_BUSY=1) and not when idle. Joined, the share of
 * the reserve (barrier_pending_percent) must pass too.
 * test_shim.c compares the barriers in the statistics. */
static void eager_quiet(const char *mode)
{
    cudaStream_t s = NULL;
    if (!strcmp(mode, "busy"))
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "non-blocking stream");
    else if (!strcmp(mode, "blocking"))
        CHECK(cudaStreamCreate(&s) == cudaSuccess, "blocking stream");
    void *hold, *warm, *p;
    CHECK(cudaMalloc(&hold, 256u << 20) == cudaSuccess, "cudaMalloc 256 MiB");
    CHECK(cudaMalloc(&warm, 128u << 20) == cudaSuccess, "cudaMalloc 128 MiB");
    CHECK(cudaFree(warm) == cudaSuccess, "cudaFree 128 MiB");
    for (int i = 0; i < 16; i++) {
        CHECK(cudaMalloc(&p, 17u << 20) == cudaSuccess, "cudaMalloc 17 MiB (%d)", i);
        CHECK(cudaFree(p) == cudaSuccess, "cudaFree 17 MiB (%d)", i);
    }
    CHECK(cudaFree(hold) == cudaSuccess, "cudaFree 256 MiB");
    if (s)
        CHECK(cudaStreamDestroy(s) == cudaSuccess, "stream destroy");
}

/* A non-blocking stream made while a release of the primary context is
 * inside the driver (the shim's gate of its GPU-ops table is closed: the
 * context might be dying) owes its wait for the last barrier: the shim
 * makes it when the release returns with the context alive (an extra
 * reference keeps it), never while the gate is closed. Run with
 * FAKE_CUDA_LIFECYCLE_DELAY_US=500000; prints the stream waits made while
 * the release was inside and after it returned. */
static void *release_primary(void *arg)
{
    (void)arg;
    CHECK(drv.primary_release(0) == CUDA_SUCCESS, "cuDevicePrimaryCtxRelease");
    return NULL;
}

static void gate_stream(void)
{
    void *a, *b;
    CHECK(cudaMalloc(&a, 64u << 20) == cudaSuccess, "cudaMalloc A");
    look_up_driver(); /* (the runtime has loaded the driver now) */
    CHECK(cudaFree(a) == cudaSuccess, "cudaFree A");
    CHECK(cudaMalloc(&b, 64u << 20) == cudaSuccess, "cudaMalloc B (a barrier)");
    CUcontext ctx;
    CHECK(drv.primary_retain(&ctx, 0) == CUDA_SUCCESS, "cuDevicePrimaryCtxRetain"); /* the release leaves it alive */
    pthread_t t;
    pthread_create(&t, NULL, release_primary, NULL);
    for (int i = 0; i < 5000 && !__atomic_load_n(&fake()->lifecycle_delays, __ATOMIC_ACQUIRE); i++)
        usleep(1000); /* until the release is inside the driver */
    unsigned long waits = fake()->stream_wait;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    unsigned long during = fake()->stream_wait - waits;
    pthread_join(t, NULL);
    printf("gate_stream: during=%lu after=%lu\n", during, fake()->stream_wait - waits);
    CHECK(cudaFree(b) == cudaSuccess, "cudaFree B");
    CHECK(cudaStreamDestroy(s) == cudaSuccess, "stream destroy");
}

/* 8 threads allocate and free known sizes, device and pinned, and each
 * leaves one block of each live (test_shim.c checks the exact sums and the
 * peak's bound in the statistics). Thread i: 400 rounds of 4 blocks of
 * 1000 + 4096 i bytes, 100 rounds of 2 pinned blocks of 64 KiB + i. */
#define STATS_THREADS 8
static void *stats_thread_body(void *arg)
{
    size_t i = (size_t)(uintptr_t)arg, n = 1000 + 4096 * i, h = (64 << 10) + i;
    void *p[4], *q[2];
    for (int round = 0; round < 400; round++) {
        for (int k = 0; k < 4; k++)
            CHECK(cudaMalloc(&p[k], n) == cudaSuccess, "cudaMalloc");
        for (int k = round == 399 ? 1 : 0; k < 4; k++)
            CHECK(cudaFree(p[k]) == cudaSuccess, "cudaFree");
    }
    for (int round = 0; round < 100; round++) {
        for (int k = 0; k < 2; k++)
            CHECK(cudaHostAlloc(&q[k], h, 0) == cudaSuccess, "cudaHostAlloc");
        for (int k = round == 99 ? 1 : 0; k < 2; k++)
            CHECK(cudaFreeHost(q[k]) == cudaSuccess, "cudaFreeHost");
    }
    return NULL; /* p[0] and q[0] stay live */
}

static void stats_threads(void)
{
    pthread_t t[STATS_THREADS];
    for (uintptr_t i = 0; i < STATS_THREADS; i++)
        pthread_create(&t[i], NULL, stats_thread_body, (void *)i);
    for (int i = 0; i < STATS_THREADS; i++)
        pthread_join(t[i], NULL);
}

/* poolshim_version() of the preloaded library (found as a program would,
 * with dlsym), printed as "poolshim_version() = X"; one allocation so the
 * exit report has a device. Natively the symbol is absent. */
/* The stack is built where the context is made: cudaFree(NULL) (the
 * runtime's lazy init retains the primary context), then a marker on
 * stderr, then the first allocation. The test finds the verbose "stack
 * ready" line before the marker. */
static void context_first(void)
{
    CHECK(cudaFree(NULL) == cudaSuccess, "cudaFree(NULL) makes the context");
    fprintf(stderr, "context_first: context made, no allocation yet\n");
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4096) == cudaSuccess, "cudaMalloc");
    CHECK(cudaFree(p) == cudaSuccess, "cudaFree");
}

static void version(void)
{
    const char *(*get)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "poolshim_version");
    CHECK(!get == !shim_active(), "poolshim_version is exported exactly when the shim is loaded");
    const char *v = get ? get() : NULL;
    CHECK(!get || (v && *v), "a version string");
    printf("poolshim_version() = %s\n", v ? v : "(absent)");
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4096) == cudaSuccess, "cudaMalloc");
    CHECK(cudaFree(p) == cudaSuccess, "cudaFree");
}

/* poolshim_stats_json() of the preloaded library (found with dlsym, as a
 * Python loop finds it with ctypes): with three 1 MiB blocks held it prints
 * "stats_json held: {...}", after their frees "stats_json freed: {...}";
 * checks the snprintf rule (the length alone for a NULL buffer, a cut copy
 * NUL-terminated, the length returned either way). Natively the symbol is
 * absent: "stats_json: (absent)". */
static void print_stats_json(long (*get)(char *, size_t), const char *label)
{
    long length = get(NULL, 0);
    CHECK(length > 2, "poolshim_stats_json(NULL, 0) gives the length");
    char *text = malloc((size_t)length + 1);
    CHECK(text && get(text, (size_t)length + 1) == length, "the whole object in length + 1 bytes");
    CHECK(strlen(text) == (size_t)length && text[0] == '{' && text[length - 1] == '}', "one JSON object");
    char cut[16];
    memset(cut, 'x', sizeof cut);
    CHECK(get(cut, sizeof cut) == length, "a cut copy still returns the whole length");
    CHECK(strlen(cut) == sizeof cut - 1 && !strncmp(cut, text, sizeof cut - 1), "the cut copy is its start");
    printf("stats_json %s: %s\n", label, text);
    free(text);
}

static void stats_json(void)
{
    long (*get)(char *, size_t) = (long (*)(char *, size_t))dlsym(RTLD_DEFAULT, "poolshim_stats_json");
    CHECK(!get == !shim_active(), "poolshim_stats_json is exported exactly when the shim is loaded");
    void *p[3] = {0};
    for (int i = 0; i < 3; i++)
        CHECK(cudaMalloc(&p[i], 1 << 20) == cudaSuccess, "cudaMalloc");
    if (get)
        print_stats_json(get, "held");
    else
        printf("stats_json: (absent)\n");
    for (int i = 0; i < 3; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess, "cudaFree");
    if (get)
        print_stats_json(get, "freed");
}

/* A framework's CUDA library in the process: FAKE_FRAMEWORK_LIB, when set,
 * names a shared object to load (named as PyTorch's or CuPy's,
 * tests/shim/shim.mk), kept loaded until exit; then argv[2] (default 4)
 * cudaMalloc/cudaFree pairs. The shim's exit hint (shim/hints.c) reads the
 * loaded objects' names. */
static void framework(const char *pairs)
{
    const char *lib = getenv("FAKE_FRAMEWORK_LIB");
    if (lib && *lib)
        CHECK(dlopen(lib, RTLD_NOW) != NULL, "dlopen %s: %s", lib, dlerror());
    int n = atoi(pairs);
    for (int i = 0; i < n; i++) {
        void *p = NULL;
        CHECK(cudaMalloc(&p, 4096 + (size_t)i) == cudaSuccess, "cudaMalloc %d", i);
        CHECK(cudaFree(p) == cudaSuccess, "cudaFree %d", i);
    }
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "basic";
    if (!strcmp(what, "basic")) basic();
    else if (!strcmp(what, "errors")) errors();
    else if (!strcmp(what, "pinned")) pinned();
    else if (!strcmp(what, "pinned_adaptors")) pinned_adaptors();
    else if (!strcmp(what, "async")) async();
    else if (!strcmp(what, "ipc")) ipc();
    else if (!strcmp(what, "meminfo")) meminfo();
    else if (!strcmp(what, "remap")) remap();
    else if (!strcmp(what, "remap_reset")) remap_reset();
    else if (!strcmp(what, "threads")) threads();
    else if (!strcmp(what, "stats_threads")) stats_threads();
    else if (!strcmp(what, "barrier_streams")) barrier_rounds("barrier_streams", 1);
    else if (!strcmp(what, "barrier_lagging")) barrier_rounds("barrier_lagging", 6);
    else if (!strcmp(what, "stream_destroy_v1")) stream_destroy_v1(argc > 2 ? argv[2] : "gpa");
    else if (!strcmp(what, "eager_quiet")) eager_quiet(argc > 2 ? argv[2] : "none");
    else if (!strcmp(what, "gate_stream")) gate_stream();
    else if (!strcmp(what, "oom")) oom();
    else if (!strcmp(what, "oom_retry")) oom_retry();
    else if (!strcmp(what, "oom_retry_capture")) oom_retry_capture();
    else if (!strcmp(what, "sync_in_capture")) sync_in_capture();
    else if (!strcmp(what, "devices")) devices();
    else if (!strcmp(what, "forks")) forks();
    else if (!strcmp(what, "exit_live")) exit_live();
    else if (!strcmp(what, "exit_thread")) exit_thread();
    else if (!strcmp(what, "exit_late_call")) exit_late_call();
    else if (!strcmp(what, "signals")) signals();
    else if (!strcmp(what, "reset")) reset();
    else if (!strcmp(what, "reset_loop")) reset_loop();
    else if (!strcmp(what, "reset_threads")) reset_threads();
    else if (!strcmp(what, "reset_first")) reset_first();
    else if (!strcmp(what, "set_flags")) set_flags();
    else if (!strcmp(what, "nvtx")) nvtx(argc > 2 ? argv[2] : "on");
    else if (!strcmp(what, "nvtx_ranges")) nvtx_ranges(argc > 2 ? argv[2] : "on");
    else if (!strcmp(what, "guard")) guard(argc > 2 ? argv[2] : "clean");
    else if (!strcmp(what, "version")) version();
    else if (!strcmp(what, "stats_json")) stats_json();
    else if (!strcmp(what, "context_first")) context_first();
    else if (!strcmp(what, "framework")) framework(argc > 2 ? argv[2] : "4");
    else { fprintf(stderr, "unknown scenario %s\n", what); return 2; }
    return finish(what);
}
