/* context_reset — allocation across the death of a context (cudaDeviceReset,
 * a primary context reset or its last release),
 * natively and under the shim.
 *
 * `context_reset runtime` (the runtime API):
 *   1. allocate blocks, fill them, free half (pending frees), a non-blocking
 *      stream with a live and a freed cudaMallocAsync block; cudaDeviceReset;
 *   2. allocate again, fill and check every byte (kernel) and both ends (host);
 *   3. 50 cycles of cudaMalloc / cudaMemset / check / cudaFree;
 *   4. a pointer from before the reset is freed: its answer is printed (it is
 *      CUDA's own, natively and under the shim), the error is cleared;
 *   5. 100 rounds of allocate, fill, check, free half, cudaDeviceReset: the
 *      device memory in use at the same point of each round must not grow.
 * `context_reset driver` (the driver API, -lcuda; no runtime call at all):
 *   1. retain the primary context, allocate, fill, check;
 *      cuDevicePrimaryCtxRelease of the last reference: the context must be
 *      inactive afterwards (the shim must not keep it alive), and a new one
 *      must start with about as much free memory as the first; 50 cycles;
 *   2. live blocks, cuDevicePrimaryCtxReset, release of the old usage (as the
 *      driver documents), retain again, 50 cycles;
 *   3. a cuCtxCreate context: allocate, fill, check, free (under the shim
 *      these pass through), cuCtxDestroy, then the primary context again.
 * All sizes are at most 1 MiB, so a fixed_size stack of 1 MiB blocks serves
 * them. Exit 0 only if every expectation held. */
#include "gpu_test.h"

#include <cuda.h>

#define MAX_BLOCK ((size_t)1 << 20)

/* Abort the test (exit 1) when a driver call does not return CUDA_SUCCESS. */
#define CKD(call)                                                                         \
    do {                                                                                  \
        CUresult ckd_status_ = (call);                                                    \
        if (ckd_status_ != CUDA_SUCCESS) {                                                \
            const char *ckd_name_ = "?";                                                  \
            cuGetErrorName(ckd_status_, &ckd_name_);                                      \
            fprintf(stderr, "FAIL %s:%d: %s returned %d (%s)\n", __FILE__, __LINE__,     \
                    #call, (int)ckd_status_, ckd_name_);                                  \
            exit(EXIT_CUDA_ERROR);                                                        \
        }                                                                                 \
    } while (0)

/* Device bytes in use now (total - free, as the program sees it). */
static size_t used_bytes(void)
{
    size_t free_bytes = 0, total = 0;
    CK(cudaMemGetInfo(&free_bytes, &total));
    return total - free_bytes;
}

/* Fills p with the pattern of seed and checks every byte on the GPU and
 * both ends on the host; returns the number of bad bytes. */
static unsigned long long fill_and_check(void *p, size_t n, uint32_t seed, unsigned long long *counter)
{
    fill_pattern(p, n, seed, 0);
    CK(cudaMemset(counter, 0, sizeof *counter));
    count_mismatches(p, n, seed, counter, 0);
    unsigned long long bad = 0;
    CK(cudaMemcpy(&bad, counter, sizeof bad, cudaMemcpyDeviceToHost));
    return bad + host_verify_ends(p, n, seed, 4096);
}

static int runtime_mode(void)
{
    CK(cudaFree(0));
    /* 1. live blocks, pending frees, stream blocks, then the reset */
    void *before[8];
    for (int i = 0; i < 8; i++) {
        CK(cudaMalloc(&before[i], MAX_BLOCK - (size_t)i * 4096));
        fill_pattern(before[i], MAX_BLOCK - (size_t)i * 4096, 100 + i, 0);
    }
    for (int i = 0; i < 8; i += 2)
        CK(cudaFree(before[i]));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *async_live = nullptr, *async_freed = nullptr;
    CK(cudaMallocAsync(&async_live, 300000, s));
    CK(cudaMallocAsync(&async_freed, 200000, s));
    fill_pattern(async_live, 300000, 7, s);
    CK(cudaFreeAsync(async_freed, s));
    CK(cudaDeviceSynchronize());
    void *stale = before[1];
    CK(cudaDeviceReset());
    printf("context_reset runtime: reset with 4 live blocks, 4 pending frees and 2 stream blocks: ok\n");

    /* 2. allocate again, fill and check */
    unsigned long long *counter = nullptr;
    CK(cudaMalloc(&counter, sizeof *counter));
    unsigned long long bad = 0;
    for (int i = 0; i < 16; i++) {
        size_t n = MAX_BLOCK / 16 * (size_t)(i + 1);
        void *p = nullptr;
        CK(cudaMalloc(&p, n));
        bad += fill_and_check(p, n, 200 + i, counter);
        CK(cudaFree(p));
    }
    EXPECT(bad == 0, "%llu bad bytes in blocks allocated after the reset", bad);
    printf("context_reset runtime: 16 blocks after the reset filled and checked: ok\n");

    /* 3. 50 cycles of alloc / memset / check / free */
    uint8_t *host = (uint8_t *)malloc(MAX_BLOCK);
    for (int cycle = 0; cycle < 50; cycle++) {
        void *p = nullptr;
        CK(cudaMalloc(&p, MAX_BLOCK));
        CK(cudaMemset(p, cycle, MAX_BLOCK));
        CK(cudaMemcpy(host, p, MAX_BLOCK, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < MAX_BLOCK; i++)
            EXPECT(host[i] == (uint8_t)cycle, "cycle %d byte %zu is %u", cycle, i, host[i]);
        CK(cudaFree(p));
    }
    printf("context_reset runtime: 50 alloc/memset/free cycles after the reset: ok\n");

    /* 4. a pointer from before the reset: CUDA's own answer */
    cudaError_t stale_status = cudaFree(stale);
    cudaGetLastError();
    printf("context_reset runtime: cudaFree of a pointer from before the reset returned %s\n",
           cudaGetErrorName(stale_status));
    CK(cudaFree(counter));

    /* 5. 100 resets with allocations between them */
    size_t first_used = 0, most_used = 0;
    for (int round = 0; round < 100; round++) {
        CK(cudaMalloc(&counter, sizeof *counter));
        void *p[8];
        for (int i = 0; i < 8; i++) {
            CK(cudaMalloc(&p[i], MAX_BLOCK / 8 * (size_t)(i + 1)));
            fill_pattern(p[i], MAX_BLOCK / 8 * (size_t)(i + 1), round * 8 + i, 0);
        }
        bad = fill_and_check(p[round % 8], MAX_BLOCK / 8 * (size_t)(round % 8 + 1), 9000 + round, counter);
        EXPECT(bad == 0, "round %d: %llu bad bytes", round, bad);
        for (int i = 0; i < 8; i += 2)
            CK(cudaFree(p[i]));
        size_t used = used_bytes();
        if (round == 1)
            first_used = used;
        if (round >= 1 && used > most_used)
            most_used = used;
        CK(cudaDeviceReset());
    }
    printf("context_reset runtime: 100 resets: device memory in use %.1f MiB after round 1, at most %.1f MiB\n",
           first_used / 1048576.0, most_used / 1048576.0);
    EXPECT(most_used <= first_used + ((size_t)64 << 20),
           "memory in use grew across resets: %zu -> %zu bytes", first_used, most_used);
    free(host);
    printf("context_reset runtime: OK\n");
    return 0;
}

/* Allocates, fills (cuMemsetD8), checks on the host and frees n blocks in
 * the current context, through the driver API. */
static void driver_cycles(int n, int seed, const char *when)
{
    uint8_t *host = (uint8_t *)malloc(MAX_BLOCK);
    for (int i = 0; i < n; i++) {
        size_t size = MAX_BLOCK - (size_t)(i % 7) * 65536;
        CUdeviceptr p = 0;
        CKD(cuMemAlloc(&p, size));
        CKD(cuMemsetD8(p, (unsigned char)(seed + i), size));
        CKD(cuMemcpyDtoH(host, p, size));
        for (size_t k = 0; k < size; k++)
            EXPECT(host[k] == (uint8_t)(seed + i), "%s: block %d byte %zu is %u", when, i, k, host[k]);
        CKD(cuMemFree(p));
    }
    free(host);
    printf("context_reset driver: %d blocks %s: ok\n", n, when);
}

static size_t driver_free_bytes(void)
{
    size_t free_bytes = 0, total = 0;
    CKD(cuMemGetInfo(&free_bytes, &total));
    return free_bytes;
}

static int driver_mode(void)
{
    CKD(cuInit(0));
    CUdevice dev;
    CKD(cuDeviceGet(&dev, 0));
    CUcontext primary;
    CKD(cuDevicePrimaryCtxRetain(&primary, dev));
    CKD(cuCtxSetCurrent(primary));
    size_t fresh_free = driver_free_bytes();

    /* 1. cuDevicePrimaryCtxRelease of the last reference (first: the
     *    reference counts are plain before any reset) */
    CUdeviceptr live[4];
    for (int i = 0; i < 4; i++) {
        CKD(cuMemAlloc(&live[i], MAX_BLOCK));
        CKD(cuMemsetD8(live[i], 2, MAX_BLOCK));
    }
    driver_cycles(10, 10, "before the last cuDevicePrimaryCtxRelease");
    CKD(cuCtxSynchronize());
    CKD(cuDevicePrimaryCtxRelease(dev));
    unsigned flags = 0;
    int active = 1;
    CKD(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    EXPECT(active == 0, "the primary context is still active after the last release (someone kept a reference)");
    CKD(cuDevicePrimaryCtxRetain(&primary, dev));
    CKD(cuCtxSetCurrent(primary));
    size_t again_free = driver_free_bytes();
    printf("context_reset driver: free memory %.1f MiB in the first context, %.1f MiB in the one after release\n",
           fresh_free / 1048576.0, again_free / 1048576.0);
    EXPECT(again_free + ((size_t)64 << 20) >= fresh_free,
           "the released context's memory did not come back (%zu -> %zu free)", fresh_free, again_free);
    driver_cycles(50, 20, "after the last cuDevicePrimaryCtxRelease");

    /* 2. cuDevicePrimaryCtxReset with live blocks */
    for (int i = 0; i < 4; i++) {
        CKD(cuMemAlloc(&live[i], MAX_BLOCK));
        CKD(cuMemsetD8(live[i], 1, MAX_BLOCK));
    }
    CKD(cuCtxSynchronize());
    CKD(cuDevicePrimaryCtxReset(dev));
    /* "resetting the primary context does not release it": release our usage
     * (documented as safe after a reset), then take a new one */
    CUresult old_usage = cuDevicePrimaryCtxRelease(dev);
    printf("context_reset driver: release of the usage from before the reset returned %d\n", (int)old_usage);
    CKD(cuDevicePrimaryCtxRetain(&primary, dev));
    CKD(cuCtxSetCurrent(primary));
    driver_cycles(50, 30, "after cuDevicePrimaryCtxReset");

    /* 3. a cuCtxCreate context: its allocations pass through */
    CUcontext created;
#if CUDA_VERSION >= 13000
    CKD(cuCtxCreate(&created, nullptr, 0, dev));
#else
    CKD(cuCtxCreate(&created, 0, dev));
#endif
    driver_cycles(10, 40, "in a cuCtxCreate context");
    CKD(cuCtxDestroy(created));
    CKD(cuCtxSetCurrent(primary));
    driver_cycles(10, 50, "in the primary context after cuCtxDestroy");
    CKD(cuDevicePrimaryCtxRelease(dev));
    printf("context_reset driver: OK\n");
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "runtime";
    printf("context_reset %s: shim %s\n", mode, poolshim_is_active() ? "active" : "inactive");
    if (!strcmp(mode, "runtime"))
        return runtime_mode();
    if (!strcmp(mode, "driver"))
        return driver_mode();
    fprintf(stderr, "usage: context_reset runtime|driver\n");
    return EXIT_CUDA_ERROR;
}
