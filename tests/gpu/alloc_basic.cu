/* alloc_basic — many allocations of many sizes, written and read back.
 *
 * Built three ways by run.sh: plain nvcc (static cudart: the shim sees these
 * calls through its driver door), `-cudart shared` (runtime door), and
 * -DUSE_DRIVER_API -lcuda (the program itself calls cuMemAlloc/cuMemFree and
 * cuMemAllocAsync/cuMemFreeAsync).
 *
 * Steps:
 *   1. The first CUDA call is an allocation (the shim's lazy init path).
 *   2. Rounds: allocate one buffer of each size in SIZES, check alignment
 *      (256 B) and that no two ranges overlap, fill each with its own pattern,
 *      verify every byte on the device and the ends on the host, free in a
 *      shuffled order.
 *   3. Churn: 3000 random allocate/free steps over up to 64 live buffers;
 *      every buffer is verified before it is freed.
 *   4. Stream-ordered: cudaMallocAsync / cudaFreeAsync (or the driver twins) on
 *      a non-blocking stream and on the legacy stream, with kernels in flight.
 * Exit 0 only if every byte matched. */
#include "gpu_test.h"

#include <algorithm>
#include <random>
#include <vector>

#ifdef USE_DRIVER_API
#include <cuda.h>
#define API_NAME "driver"
static void check_driver(CUresult status, const char *what, int line)
{
    if (status != CUDA_SUCCESS) {
        const char *name = "?";
        cuGetErrorName(status, &name);
        fprintf(stderr, "FAIL alloc_basic.cu:%d: %s returned %d (%s)\n", line, what,
                (int)status, name);
        exit(EXIT_CUDA_ERROR);
    }
}
#define CKD(call) check_driver((call), #call, __LINE__)
static void device_alloc(void **p, size_t n)
{
    CUdeviceptr d = 0;
    CKD(cuMemAlloc(&d, n));
    *p = (void *)d;
}
static void device_free(void *p) { CKD(cuMemFree((CUdeviceptr)p)); }
static void device_alloc_async(void **p, size_t n, cudaStream_t s)
{
    CUdeviceptr d = 0;
    CKD(cuMemAllocAsync(&d, n, (CUstream)s));
    *p = (void *)d;
}
static void device_free_async(void *p, cudaStream_t s)
{
    CKD(cuMemFreeAsync((CUdeviceptr)p, (CUstream)s));
}
#else
#define API_NAME "runtime"
static void device_alloc(void **p, size_t n) { CK(cudaMalloc(p, n)); }
static void device_free(void *p) { CK(cudaFree(p)); }
static void device_alloc_async(void **p, size_t n, cudaStream_t s)
{
    CK(cudaMallocAsync(p, n, s));
}
static void device_free_async(void *p, cudaStream_t s) { CK(cudaFreeAsync(p, s)); }
#endif

static const size_t SIZES[] = {1,           7,          255,          256,
                               257,         4095,       4096,         65539,
                               1 << 20,     (3 << 20) + 5, 16 << 20,  (64 << 20) + 1,
                               256 << 20};
static const int SIZE_COUNT = sizeof(SIZES) / sizeof(SIZES[0]);

struct live_buffer {
    void *ptr;      /* device address */
    size_t size;    /* bytes requested */
    uint32_t seed;  /* pattern written into it */
};

static unsigned long long *mismatches; /* device counter of bad bytes */

static unsigned long long read_and_reset_mismatches(void)
{
    unsigned long long host = 0;
    CK(cudaMemcpy(&host, mismatches, sizeof host, cudaMemcpyDeviceToHost));
    CK(cudaMemset(mismatches, 0, sizeof host));
    return host;
}

static void verify_buffer(const live_buffer &b, const char *phase)
{
    count_mismatches(b.ptr, b.size, b.seed, mismatches, 0);
    unsigned long long bad = read_and_reset_mismatches();
    size_t host_bad = host_verify_ends(b.ptr, b.size, b.seed, 4096);
    if (bad || host_bad) {
        fprintf(stderr, "FAIL alloc_basic: %s: buffer %p (%zu B) has %llu bad bytes on the device, %zu at its ends on the host\n",
                phase, b.ptr, b.size, bad, host_bad);
        exit(EXIT_CORRUPTION);
    }
}

static void rounds_of_every_size(std::mt19937 &rng)
{
    for (int round = 0; round < 3; round++) {
        std::vector<live_buffer> live;
        for (int i = 0; i < SIZE_COUNT; i++) {
            live_buffer b = {nullptr, SIZES[i], (uint32_t)(round * 100 + i)};
            device_alloc(&b.ptr, b.size);
            EXPECT(b.ptr != nullptr, "size %zu", b.size);
            EXPECT((uintptr_t)b.ptr % 256 == 0, "256-byte alignment, got %p for %zu B", b.ptr, b.size);
            live.push_back(b);
        }
        std::vector<live_buffer> sorted = live;
        std::sort(sorted.begin(), sorted.end(),
                  [](const live_buffer &a, const live_buffer &b) { return a.ptr < b.ptr; });
        for (size_t i = 1; i < sorted.size(); i++)
            EXPECT((uintptr_t)sorted[i - 1].ptr + sorted[i - 1].size <= (uintptr_t)sorted[i].ptr,
                   "disjoint ranges: %p+%zu overlaps %p", sorted[i - 1].ptr, sorted[i - 1].size,
                   sorted[i].ptr);
        for (const live_buffer &b : live)
            fill_pattern(b.ptr, b.size, b.seed, 0);
        for (const live_buffer &b : live)
            verify_buffer(b, "rounds");
        std::shuffle(live.begin(), live.end(), rng);
        for (const live_buffer &b : live)
            device_free(b.ptr);
    }
}

static void churn(std::mt19937 &rng)
{
    std::vector<live_buffer> live;
    uint32_t seed = 1000;
    for (int step = 0; step < 3000; step++) {
        bool allocate = live.size() < 4 || (live.size() < 64 && (rng() & 1));
        if (allocate) {
            live_buffer b = {nullptr, SIZES[rng() % (SIZE_COUNT - 2)], seed++};
            if (rng() % 4 == 0)
                b.size = 1 + rng() % (1 << 20);
            device_alloc(&b.ptr, b.size);
            EXPECT((uintptr_t)b.ptr % 256 == 0, "256-byte alignment, got %p", b.ptr);
            fill_pattern(b.ptr, b.size, b.seed, 0);
            live.push_back(b);
        } else {
            size_t victim = rng() % live.size();
            count_mismatches(live[victim].ptr, live[victim].size, live[victim].seed, mismatches, 0);
            device_free(live[victim].ptr);
            live[victim] = live.back();
            live.pop_back();
        }
    }
    for (const live_buffer &b : live) {
        verify_buffer(b, "churn");
        device_free(b.ptr);
    }
    unsigned long long bad = read_and_reset_mismatches();
    if (bad) {
        fprintf(stderr, "FAIL alloc_basic: churn: %llu bad bytes in buffers checked before their free\n", bad);
        exit(EXIT_CORRUPTION);
    }
}

static void stream_ordered(cudaStream_t stream, const char *label)
{
    std::vector<live_buffer> blocks;
    for (int i = 0; i < 64; i++) {
        live_buffer b = {nullptr, SIZES[i % (SIZE_COUNT - 1)], (uint32_t)(5000 + i)};
        device_alloc_async(&b.ptr, b.size, stream);
        EXPECT((uintptr_t)b.ptr % 256 == 0, "256-byte alignment, got %p", b.ptr);
        fill_pattern(b.ptr, b.size, b.seed, stream);
        count_mismatches(b.ptr, b.size, b.seed, mismatches, stream);
        if (i % 2)
            device_free_async(b.ptr, stream); /* reuse while kernels are in flight */
        else
            blocks.push_back(b);
    }
    CK(cudaStreamSynchronize(stream));
    for (const live_buffer &b : blocks)
        verify_buffer(b, label);
    for (const live_buffer &b : blocks)
        device_free_async(b.ptr, stream);
    CK(cudaStreamSynchronize(stream));
    unsigned long long bad = read_and_reset_mismatches();
    if (bad) {
        fprintf(stderr, "FAIL alloc_basic: %s: %llu bad bytes\n", label, bad);
        exit(EXIT_CORRUPTION);
    }
}

int main(void)
{
    std::mt19937 rng(42);
#ifdef USE_DRIVER_API
    CK(cudaSetDevice(0)); /* the driver API needs the primary context current */
    CK(cudaFree(0));
#endif
    void *first = nullptr;
    device_alloc(&first, 1000); /* step 1: maybe the first CUDA call of all */
    CK(cudaMalloc((void **)&mismatches, sizeof *mismatches));
    CK(cudaMemset(mismatches, 0, sizeof *mismatches));
    live_buffer first_buffer = {first, 1000, 7};
    fill_pattern(first, 1000, 7, 0);
    verify_buffer(first_buffer, "first");

    rounds_of_every_size(rng);
    churn(rng);

    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    stream_ordered(stream, "async on a non-blocking stream");
    stream_ordered(0, "async on the legacy stream");
    CK(cudaStreamDestroy(stream));

    device_free(first);
    CK(cudaFree(mismatches));
    CK(cudaDeviceSynchronize());
    printf("alloc_basic (%s API): OK\n", API_NAME);
    return 0;
}
