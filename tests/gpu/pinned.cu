/* pinned: the pinned host pool's contract (cudaHostAlloc / cudaFreeHost).
 *
 *   pinned hazard  each round: a kernel spins on a non-blocking stream (or the
 *                  legacy stream), then an async copy reads pinned block A into
 *                  device memory (H2D) or writes device data into A (D2H);
 *                  cudaFreeHost(A); cudaHostAlloc(B) of the same size; the host
 *                  writes B at once. The copy must deliver A's bytes (H2D), and
 *                  B must keep what the host wrote (D2H). Natively cudaFreeHost
 *                  synchronizes; under the shim B may be A only after the GPU
 *                  passed a fence recorded after the free. Prints "overlap
 *                  yes|no" per round (run.sh's expect_detect counts them); exit 3
 *                  on corruption. Then mapped memory: cudaHostGetDevicePointer
 *                  and cudaPointerGetAttributes on an interior pointer of a
 *                  block, a kernel writing through the device pointer, and
 *                  cudaHostGetFlags / cudaHostRegister / cudaHostUnregister
 *                  of the block (printed; the last must fail).
 *   pinned timing  one line: cudaHostAlloc+cudaFreeHost pair at 1 MiB and 64 MiB,
 *                  median and mean (the mean carries the pairs that record
 *                  or wait for a fence: under the shim one 1 MiB pair in ~8,
 *                  host.grow_budget_min). A warm-up of 200 pairs first (the
 *                  pinned pool reaches its floor, 16 MiB, natively the
 *                  driver warms up). `pinned timing N` takes N pairs at
 *                  1 MiB (default 2000; 64 MiB: N / 100, at least 20).
 */
#include "gpu_test.h"

#include <algorithm>
#include <vector>

static __global__ void spin_kernel(unsigned long long ns) { spin_for_ns(ns); }

static __global__ void write_through(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = pattern_byte(i, seed);
}

static void host_fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pattern_byte(i, seed);
}

static size_t host_mismatches(const uint8_t *p, size_t n, uint32_t seed)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += p[i] != pattern_byte(i, seed);
    return bad;
}

static int overlaps(const void *a, const void *b, size_t n)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + n && y < x + n;
}

static int hazard(void)
{
    const size_t n = 8u << 20;
    cudaStream_t nonblocking;
    CK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
    uint8_t *device = NULL;
    CK(cudaMalloc((void **)&device, n));
    std::vector<uint8_t> check(n);
    size_t corrupted = 0;
    for (int round = 0; round < 8; round++) {
        int h2d = round % 2 == 0;
        cudaStream_t s = round % 4 < 2 ? nonblocking : (cudaStream_t)0;
        uint32_t seed_a = 100 + round, seed_b = 200 + round, seed_dev = 300 + round;
        uint8_t *a = NULL, *b = NULL;
        CK(cudaHostAlloc((void **)&a, n, cudaHostAllocDefault));
        host_fill(a, n, seed_a);
        if (!h2d) {
            write_through<<<256, 256, 0, s>>>(device, n, seed_dev);
            CK(cudaGetLastError());
        }
        spin_kernel<<<1, 1, 0, s>>>(150ull * 1000 * 1000); /* the copy starts 150 ms from now */
        CK(cudaGetLastError());
        if (h2d)
            CK(cudaMemcpyAsync(device, a, n, cudaMemcpyHostToDevice, s));
        else
            CK(cudaMemcpyAsync(a, device, n, cudaMemcpyDeviceToHost, s));
        CK(cudaFreeHost(a));
        CK(cudaHostAlloc((void **)&b, n, cudaHostAllocDefault));
        host_fill(b, n, seed_b); /* the host writes the reused block at once */
        printf("pinned: round %d %s on %s stream: overlap %s\n", round, h2d ? "H2D" : "D2H",
               s ? "a non-blocking" : "the legacy", overlaps(a, b, n) ? "yes" : "no");
        CK(cudaStreamSynchronize(s));
        size_t bad;
        if (h2d) {
            CK(cudaMemcpy(check.data(), device, n, cudaMemcpyDeviceToHost));
            bad = host_mismatches(check.data(), n, seed_a); /* the copy must have read A's bytes */
        } else {
            bad = host_mismatches(b, n, seed_b); /* the copy must not have landed in B */
        }
        if (bad)
            printf("pinned: round %d: %zu corrupted bytes\n", round, bad);
        corrupted += bad;
        CK(cudaFreeHost(b));
    }
    CK(cudaFree(device));
    CK(cudaStreamDestroy(nonblocking));
    if (corrupted) {
        printf("pinned: FAIL: %zu corrupted bytes\n", corrupted);
        return EXIT_CORRUPTION;
    }

    /* mapped memory: an interior pointer answers as natively */
    uint8_t *p = NULL, *dp = NULL, *dq = NULL;
    const size_t off = 12288, m = 1u << 20;
    CK(cudaHostAlloc((void **)&p, m, cudaHostAllocMapped | cudaHostAllocPortable));
    CK(cudaHostGetDevicePointer((void **)&dp, p, 0));
    CK(cudaHostGetDevicePointer((void **)&dq, p + off, 0));
    EXPECT(dq == dp + off, "device pointer of an interior pointer (%p vs %p + %zu)", (void *)dq, (void *)dp, off);
    cudaPointerAttributes attr;
    CK(cudaPointerGetAttributes(&attr, p + off));
    printf("pinned: attributes of p+%zu: type %d, hostPointer %p (p+off %p), devicePointer %p\n", off, (int)attr.type,
           attr.hostPointer, (void *)(p + off), attr.devicePointer);
    EXPECT(attr.type == cudaMemoryTypeHost, "pinned memory (type %d)", (int)attr.type);
    EXPECT(attr.devicePointer == (void *)dq, "devicePointer %p, expected %p", attr.devicePointer, (void *)dq);
    write_through<<<64, 256>>>(dq, m - off, 7);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    EXPECT(host_mismatches(p + off, m - off, 7) == 0, "a kernel wrote through the mapped pointer");
    /* the flags, a registration over the block and an unregistration answer
     * as for cudaHostAlloc memory (under the shim, for a block of the host
     * range too: the shim answers for pooled blocks itself) */
    unsigned flags = 0;
    CK(cudaHostGetFlags(&flags, p + off));
    const unsigned asked = cudaHostAllocMapped | cudaHostAllocPortable;
    EXPECT((flags & asked) == asked, "cudaHostGetFlags of p+off: %#x, expected portable|mapped", flags);
    /* natively (H100, CUDA 13.0, 2026-11-23) a registration inside or over
     * cudaHostAlloc memory, and its unregistration, are "invalid value", not
     * "already registered" / "not registered"; the shim answers the same */
    cudaError_t reg = cudaHostRegister(p + off, 4096, cudaHostRegisterDefault);
    cudaError_t reg_whole = cudaHostRegister(p, m, cudaHostRegisterDefault);
    EXPECT(reg == cudaErrorInvalidValue, "cudaHostRegister inside a pinned block: %s", cudaGetErrorName(reg));
    cudaError_t unreg = cudaHostUnregister(p);
    cudaError_t unreg_inside = cudaHostUnregister(p + off);
    printf("pinned: cudaHostGetFlags %#x, cudaHostRegister inside the block %s, of the whole block %s, "
           "cudaHostUnregister of it %s, of an interior pointer %s\n",
           flags, cudaGetErrorName(reg), cudaGetErrorName(reg_whole), cudaGetErrorName(unreg),
           cudaGetErrorName(unreg_inside));
    EXPECT(reg_whole == cudaErrorInvalidValue,
           "cudaHostRegister of the whole block: %s", cudaGetErrorName(reg_whole));
    EXPECT(unreg == cudaErrorInvalidValue && unreg_inside == cudaErrorInvalidValue,
           "cudaHostUnregister of allocated pinned memory: %s, inside it: %s", cudaGetErrorName(unreg),
           cudaGetErrorName(unreg_inside));
    EXPECT(unreg != cudaSuccess, "cudaHostUnregister of allocated pinned memory must fail");
    (void)cudaGetLastError(); /* the expected failures are not sticky: clear them */
    CK(cudaFreeHost(p));
    printf("pinned: OK (shim %s)\n", poolshim_is_active() ? "active" : "inactive");
    return 0;
}

/* `iterations` pairs of `n` bytes: the median pair and the mean (total
 * time over pairs), in us. */
static double median_pair_us(size_t n, int iterations, double *mean_us)
{
    std::vector<double> t;
    double total0 = now_ns();
    for (int i = 0; i < iterations; i++) {
        void *p = NULL;
        double t0 = now_ns();
        CK(cudaHostAlloc(&p, n, cudaHostAllocDefault));
        CK(cudaFreeHost(p));
        t.push_back((now_ns() - t0) / 1e3);
    }
    if (mean_us)
        *mean_us = (now_ns() - total0) / 1e3 / iterations;
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static int timing(int pairs)
{
    CK(cudaFree(0));
    median_pair_us(1u << 20, 200, NULL); /* warm-up */
    double small_mean, large_mean;
    double small = median_pair_us(1u << 20, pairs, &small_mean);
    int large_pairs = pairs / 100 > 20 ? pairs / 100 : 20;
    median_pair_us(64u << 20, 3, NULL);
    double large = median_pair_us(64u << 20, large_pairs, &large_mean);
    printf("pinned timing: cudaHostAlloc+cudaFreeHost pair 1 MiB %.2f us (mean %.3f us over %d), 64 MiB %.2f us "
           "(mean %.3f us over %d) (shim %s)\n",
           small, small_mean, pairs, large, large_mean, large_pairs, poolshim_is_active() ? "active" : "inactive");
    return 0;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "hazard";
    if (!strcmp(what, "hazard"))
        return hazard();
    if (!strcmp(what, "timing"))
        return timing(argc > 2 ? atoi(argv[2]) : 2000);
    fprintf(stderr, "pinned: unknown mode %s (hazard or timing)\n", what);
    return EXIT_CUDA_ERROR;
}
