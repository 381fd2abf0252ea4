/* A program linked to libcudart.so (the fake one), calling the runtime API
 * like PyTorch or CuPy would. argv[1] picks the scenario; exit 0 = passed.
 * It checks its own data and, through the fake driver's counters, what
 * really reached CUDA. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
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
extern cudaError_t cudaStreamDestroy(cudaStream_t);
extern cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *, void *);
extern cudaError_t cudaSetDevice(int);
extern cudaError_t cudaDeviceReset(void);
extern cudaError_t cudaSetDeviceFlags(unsigned int);
extern cudaError_t cudaHostAlloc(void **, size_t, unsigned int);
extern cudaError_t cudaMallocHost(void **, size_t);
extern cudaError_t cudaFreeHost(void *);

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

static atomic_int stop_churn;

static void *churn(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop_churn)) {
        void *p;
        if (cudaMalloc(&p, 4096) == cudaSuccess)
            cudaFree(p);
    }
    return NULL;
}

/* fork() while another thread allocates. CUDA itself cannot be used in
 * the child of a process that initialised it (the fake driver's own lock
 * may be held too), so the child only does what such children do: asks
 * the shim (which must now pass through) and exits, with its atexit
 * handlers — with statistics on, the exit report must not take a lock of
 * the parent's stacks that another thread held at the fork. */
static void forks(void)
{
    void *warm;
    CHECK(cudaMalloc(&warm, 4096) == cudaSuccess, "cudaMalloc before fork");
    pthread_t t;
    pthread_create(&t, NULL, churn, NULL);
    for (int i = 0; i < 20; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(10); /* a deadlock becomes SIGALRM, not a hung test */
            exit(shim_active() ? 1 : 0); /* passthrough in the child; exit() runs the handlers */
        }
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %#x", i, status);
    }
    atomic_store(&stop_churn, 1);
    pthread_join(t, NULL);
    CHECK(cudaFree(warm) == cudaSuccess, "cudaFree after forks");
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

/* ---- context lifecycle (issue 13) ---- */
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

/* 100 resets with allocations between them: device memory must not grow. */
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
    unsigned long before = fake()->host_alloc, slab_flags = 0;
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
    if (pooled) {
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

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "basic";
    if (!strcmp(what, "basic")) basic();
    else if (!strcmp(what, "errors")) errors();
    else if (!strcmp(what, "pinned")) pinned();
    else if (!strcmp(what, "async")) async();
    else if (!strcmp(what, "ipc")) ipc();
    else if (!strcmp(what, "meminfo")) meminfo();
    else if (!strcmp(what, "threads")) threads();
    else if (!strcmp(what, "oom")) oom();
    else if (!strcmp(what, "devices")) devices();
    else if (!strcmp(what, "forks")) forks();
    else if (!strcmp(what, "reset")) reset();
    else if (!strcmp(what, "reset_loop")) reset_loop();
    else if (!strcmp(what, "reset_threads")) reset_threads();
    else if (!strcmp(what, "reset_first")) reset_first();
    else if (!strcmp(what, "set_flags")) set_flags();
    else { fprintf(stderr, "unknown scenario %s\n", what); return 2; }
    return finish(what);
}
