/* Two programs on one shared fake GPU (FAKE_CUDA_SHARED_CAPACITY_FILE,
 * FAKE_CUDA_MEMORY bytes in all), for the neighbours' tests
 * (tests/shim/test_shim.c, suite neighbours; shim/neighbours.c):
 *
 *   prog_neighbours give DIR [DEVICE]   cudaMallocs 80% of the device in 8 MiB
 *       blocks, frees them all, says so by creating DIR/ready, then idles
 *       until DIR/release exists (at most 30 s) and exits.
 *   prog_neighbours take DIR [DEVICE]   waits for DIR/ready (if DIR/wait_ready
 *       exists), then cudaMallocs 80% of the device in 8 MiB blocks, timing
 *       every call; prints "take: N of N blocks in T ms (the slowest S ms)"
 *       or the call that failed and how long it took; frees them, creates
 *       DIR/release and exits 0 only when every block was allocated.
 *   prog_neighbours create DIR          as take, through cuMemCreate handles
 *       (looked up with cuGetProcAddress, as NCCL and PyTorch's expandable
 *       segments do; FAKE_CUDA_VMM=1), without any cudaMalloc before: the
 *       shim's out-of-memory retry, in a process that built no stack.
 *   prog_neighbours create_big DIR      cudaMallocs 4 blocks and frees them
 *       (its own pool then holds 32 MiB), then asks cuMemCreate for 60% of
 *       the device in one handle: its pool's give-back is not enough, the
 *       neighbours' is; prints "create_big: ..." and exits 0 when it got it.
 *   prog_neighbours hold DIR N          cudaMallocs N blocks of 1 MiB + 1000 bytes and
 *       frees every other one, says so by creating DIR/ready, then idles until
 *       DIR/release exists and exits holding the rest (the live statistics'
 *       tests: the exit report counts them as requested now). With
 *       DIR/wait_go it first waits for DIR/go (a test plants files first).
 *   prog_neighbours fail DIR N          N cudaMallocs of twice the device, each
 *       failing after the neighbours were asked; prints "fail: call I
 *       returned E after T ms" for each (the silent neighbours' tests).
 *   prog_neighbours uuid [DEVICE]       prints the device's UUID as the
 *       registry writes it (tests fabricate entries with it).
 *
 * Natively the memory `give` freed is the device's again and `take` gets it;
 * under the shim it stays in give's pool unless the neighbours give it. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "prog_common.h"

extern cudaError_t cudaMalloc(void **, size_t);
extern cudaError_t cudaFree(void *);
extern cudaError_t cudaSetDevice(int);

#define BLOCK ((size_t)8 << 20)
#define BLOCKS_MAX 1024

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* 80% of the device, in BLOCK-sized blocks. */
static int blocks(void)
{
    const char *m = getenv("FAKE_CUDA_MEMORY");
    unsigned long long bytes = m ? strtoull(m, NULL, 0) : 4ull << 30;
    int n = (int)(bytes * 8 / 10 / BLOCK);
    return n < BLOCKS_MAX ? n : BLOCKS_MAX;
}

static int exists(const char *dir, const char *name)
{
    char path[512];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

static void signal_file(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
    }
}

/* Waits up to `seconds` for dir/name; 1 when it came. */
static int wait_for(const char *dir, const char *name, int seconds)
{
    for (int i = 0; i < seconds * 100; i++) {
        if (exists(dir, name))
            return 1;
        usleep(10000);
    }
    return 0;
}

/* Under the shim with the neighbours on, waits (at most 5 s) until this
 * process's registry entry exists: the give-back thread makes it just after
 * the first stack (shim/give_back.c), and a test that signals "ready" must
 * be findable by then. Not for a registry the shim refuses (another owner,
 * or group or other permissions: the tests of that case). */
static void wait_registered(void)
{
    const char *dir = getenv("POOLSHIM_TEST_NEIGHBOURS_DIR"), *preload = getenv("LD_PRELOAD");
    const char *options = getenv("POOLSHIM_OPTIONS");
    if (!dir || !preload || !strstr(preload, "poolshim") || (options && strstr(options, "neighbour_release=0")))
        return;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "p%d-", (int)getpid());
    for (int i = 0; i < 1000; i++) {
        struct stat st; /* (the shim makes the directory itself, on the same thread, just before) */
        if (stat(dir, &st) == 0 && (st.st_uid != geteuid() || (st.st_mode & 077)))
            return; /* refused by the shim: no entry will come */
        DIR *d = opendir(dir);
        int found = 0;
        for (struct dirent *e; d && (e = readdir(d)) && !found;)
            found = !strncmp(e->d_name, prefix, strlen(prefix)) && strstr(e->d_name, ".gpus");
        if (d)
            closedir(d);
        if (found)
            return;
        usleep(5000);
    }
    CHECK(0, "no registry entry of pid %d in %s after 5 s", (int)getpid(), dir);
}

static void give(const char *dir)
{
    static void *p[BLOCKS_MAX];
    int n = blocks();
    for (int i = 0; i < n; i++)
        CHECK(cudaMalloc(&p[i], BLOCK) == cudaSuccess, "give: cudaMalloc %d of %d", i, n);
    for (int i = 0; i < n; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess, "give: cudaFree %d", i);
    printf("give: %d blocks of 8 MiB allocated and freed\n", n);
    fflush(stdout);
    wait_registered();
    signal_file(dir, "ready");
    CHECK(wait_for(dir, "release", 30), "give: no release within 30 s");
}

static void take(const char *dir)
{
    static void *p[BLOCKS_MAX];
    if (exists(dir, "wait_ready"))
        CHECK(wait_for(dir, "ready", 10), "take: the other program did not get ready within 10 s");
    int n = blocks(), got = 0;
    double began = now_ms(), slowest = 0;
    for (; got < n; got++) {
        double t = now_ms();
        cudaError_t e = cudaMalloc(&p[got], BLOCK);
        double took = now_ms() - t;
        slowest = took > slowest ? took : slowest;
        if (e != cudaSuccess) {
            printf("take: cudaMalloc %d of %d (8 MiB) returned %d (2: out of memory) after %.1f ms\n", got, n, e, took);
            CHECK(e == cudaSuccess, "take: block %d of %d", got, n);
            break;
        }
        memset(p[got], got, 4096); /* the memory is there */
    }
    if (got == n)
        printf("take: %d of %d blocks in %.1f ms (the slowest %.1f ms)\n", got, n, now_ms() - began, slowest);
    fflush(stdout);
    for (int i = 0; i < got; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess, "take: cudaFree %d", i);
    signal_file(dir, "release");
}

static void hold(const char *dir, int n)
{
    static void *p[BLOCKS_MAX];
    if (exists(dir, "wait_go"))
        CHECK(wait_for(dir, "go", 10), "hold: no go within 10 s");
    for (int i = 0; i < n && i < BLOCKS_MAX; i++)
        CHECK(cudaMalloc(&p[i], (1 << 20) + 1000) == cudaSuccess, "hold: cudaMalloc %d of %d", i, n);
    for (int i = 0; i < n && i < BLOCKS_MAX; i += 2)
        CHECK(cudaFree(p[i]) == cudaSuccess, "hold: cudaFree %d", i);
    printf("hold: %d blocks allocated, %d held\n", n, n / 2);
    fflush(stdout);
    wait_registered();
    signal_file(dir, "ready");
    CHECK(wait_for(dir, "release", 30), "hold: no release within 30 s");
}

/* A loop that allocates while `poolshim top` watches: a 4 KiB cudaMalloc
 * and cudaFree every millisecond or so until DIR/release (at most 30 s). */
static void churn(const char *dir)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4096) == cudaSuccess && cudaFree(p) == cudaSuccess, "churn: the first pair");
    wait_registered();
    signal_file(dir, "ready");
    long pairs = 1;
    for (double began = now_ms(); !exists(dir, "release") && now_ms() - began < 30000; pairs++) {
        CHECK(cudaMalloc(&p, 4096) == cudaSuccess, "churn: cudaMalloc %ld", pairs);
        CHECK(cudaFree(p) == cudaSuccess, "churn: cudaFree %ld", pairs);
        usleep(1000);
    }
    printf("churn: %ld pairs\n", pairs);
}

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void create_handles(const char *dir)
{
    static CUmemGenericAllocationHandle h[BLOCKS_MAX];
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long) = NULL;
    CUresult (*release)(CUmemGenericAllocationHandle) = NULL;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    gpa_fn gpa = lib ? (gpa_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    CUresult (*init)(unsigned) = lib ? (CUresult(*)(unsigned))dlsym(lib, "cuInit") : NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa) {
        gpa("cuMemCreate", (void **)&create, 12000, 0, &st);
        gpa("cuMemRelease", (void **)&release, 12000, 0, &st);
    }
    CHECK(init && create && release && init(0) == CUDA_SUCCESS, "cuInit, cuMemCreate and cuMemRelease");
    if (failures)
        return;
    if (exists(dir, "wait_ready"))
        CHECK(wait_for(dir, "ready", 10), "create: the other program did not get ready within 10 s");
    const CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    int n = blocks(), got = 0;
    double began = now_ms(), slowest = 0;
    for (; got < n; got++) {
        double t = now_ms();
        CUresult r = create(&h[got], BLOCK, &prop, 0);
        double took = now_ms() - t;
        slowest = took > slowest ? took : slowest;
        if (r != CUDA_SUCCESS) {
            printf("create: cuMemCreate %d of %d (8 MiB) returned %d (2: out of memory) after %.1f ms\n", got, n, r,
                   took);
            CHECK(r == CUDA_SUCCESS, "create: handle %d of %d", got, n);
            break;
        }
    }
    if (got == n)
        printf("create: %d of %d handles in %.1f ms (the slowest %.1f ms)\n", got, n, now_ms() - began, slowest);
    fflush(stdout);
    for (int i = 0; i < got; i++)
        CHECK(release(h[i]) == CUDA_SUCCESS, "create: cuMemRelease %d", i);
    signal_file(dir, "release");
}

static void create_big(const char *dir)
{
    void *p[4];
    for (int i = 0; i < 4; i++)
        CHECK(cudaMalloc(&p[i], BLOCK) == cudaSuccess, "create_big: cudaMalloc %d", i);
    for (int i = 0; i < 4; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess, "create_big: cudaFree %d", i);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long) = NULL;
    CUresult (*release)(CUmemGenericAllocationHandle) = NULL;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    gpa_fn gpa = lib ? (gpa_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa) {
        gpa("cuMemCreate", (void **)&create, 12000, 0, &st);
        gpa("cuMemRelease", (void **)&release, 12000, 0, &st);
    }
    CHECK(create && release, "cuMemCreate and cuMemRelease");
    if (failures)
        return;
    const char *m = getenv("FAKE_CUDA_MEMORY");
    unsigned long long bytes = m ? strtoull(m, NULL, 0) : 4ull << 30;
    size_t size = (size_t)(bytes * 6 / 10) / BLOCK * BLOCK;
    const CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    CUmemGenericAllocationHandle h;
    CUresult r = create(&h, size, &prop, 0);
    printf("create_big: cuMemCreate of %zu MiB returned %d (2: out of memory)\n", size >> 20, r);
    fflush(stdout);
    CHECK(r == CUDA_SUCCESS, "create_big: one handle of 60%% of the device");
    if (r == CUDA_SUCCESS)
        CHECK(release(h) == CUDA_SUCCESS, "create_big: cuMemRelease");
    signal_file(dir, "release");
}

static void fail(int n)
{
    const char *m = getenv("FAKE_CUDA_MEMORY");
    size_t too_big = (m ? (size_t)strtoull(m, NULL, 0) : (size_t)4 << 30) * 2;
    for (int i = 0; i < n; i++) {
        void *p = NULL;
        double t = now_ms();
        cudaError_t e = cudaMalloc(&p, too_big);
        printf("fail: call %d returned %d after %.1f ms\n", i, e, now_ms() - t);
        CHECK(e != cudaSuccess, "fail: twice the device was allocated");
        if (e == cudaSuccess)
            cudaFree(p);
    }
    fflush(stdout);
}

static void uuid(void)
{
    CUresult (*init)(unsigned) = NULL;
    CUresult (*get)(CUuuid *, CUdevice) = NULL;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h) {
        init = (CUresult(*)(unsigned))dlsym(h, "cuInit");
        get = (CUresult(*)(CUuuid *, CUdevice))dlsym(h, "cuDeviceGetUuid_v2");
    }
    CUuuid u;
    CHECK(init && get && init(0) == CUDA_SUCCESS && get(&u, 0) == CUDA_SUCCESS, "cuDeviceGetUuid_v2");
    if (failures)
        return;
    const unsigned char *b = (const unsigned char *)u.bytes;
    printf("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", b[0], b[1], b[2], b[3], b[4],
           b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

int main(int argc, char **argv)
{
    alarm(60); /* a hang becomes SIGALRM, not a stuck test */
    const char *what = argc > 1 ? argv[1] : "";
    if (argc > 3 && strcmp(what, "uuid") != 0 && strcmp(what, "hold") != 0 && strcmp(what, "fail") != 0)
        CHECK(cudaSetDevice(atoi(argv[3])) == cudaSuccess, "cudaSetDevice(%s)", argv[3]);
    if (!strcmp(what, "give") && argc > 2)
        give(argv[2]);
    else if (!strcmp(what, "take") && argc > 2)
        take(argv[2]);
    else if (!strcmp(what, "create") && argc > 2)
        create_handles(argv[2]);
    else if (!strcmp(what, "create_big") && argc > 2)
        create_big(argv[2]);
    else if (!strcmp(what, "hold") && argc > 3)
        hold(argv[2], atoi(argv[3]));
    else if (!strcmp(what, "churn") && argc > 2)
        churn(argv[2]);
    else if (!strcmp(what, "fail") && argc > 3)
        fail(atoi(argv[3]));
    else if (!strcmp(what, "uuid"))
        uuid();
    else {
        fprintf(stderr, "usage: prog_neighbours give|take DIR [DEVICE] | create DIR | hold DIR N | churn DIR | fail DIR N | uuid\n");
        return 2;
    }
    return finish(what);
}
