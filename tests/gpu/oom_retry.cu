/* oom_retry — memory freed to the pool serves allocations the shim leaves to CUDA.
 *
 * 1. cudaMalloc 80% of the device (at most 95% of what is free at the start) in
 *    64 MiB blocks, fill them, free them all: natively the memory is the
 *    device's again, under the shim it stays in the pool.
 * 2. The same bytes as 64 MiB cuMemCreate handles on the device, each mapped
 *    into one reserved range and made accessible (as NCCL, JAX/XLA and
 *    PyTorch's expandable segments take memory); a kernel fills the range, a
 *    second counts wrong bytes; then everything is unmapped and released.
 *    cuMemCreate is the one libcuda exports (`direct`, the program links
 *    -lcuda) or the one the runtime hands out (`entry`,
 *    cudaGetDriverEntryPointByVersion, as NCCL and PyTorch get it).
 * 3. cudaMalloc and free the 80% again, then cudaMallocManaged of the same
 *    bytes in 64 MiB blocks, filled on the device and checked.
 * Under the shim step 2 runs out of memory unless the pool gives back its free
 * memory when CUDA first says so (global.oom_retry, the default); with
 * POOLSHIM_OPTIONS=global.oom_retry=0 it must fail: the negative control.
 * cudaMallocManaged allocates lazily, so it may never be refused: its pages
 * then compete with the pool's memory on the device (the touch's time is
 * printed, natively and under the shim).
 * Exit 0: all verified; 1: an unexpected CUDA error; 2: out of memory in step 2
 * or 3 (what the control must show); 3: wrong bytes. */
#include <cuda.h>

#include "gpu_test.h"

#define EXIT_OUT_OF_MEMORY 2
static const size_t block = 64ull << 20;

/* Aborts (exit 1) when a driver call does not succeed. */
#define CU(call)                                                                                \
    do {                                                                                        \
        CUresult cu_status_ = (call);                                                           \
        if (cu_status_ != CUDA_SUCCESS) {                                                       \
            const char *name_ = NULL;                                                           \
            cuGetErrorName(cu_status_, &name_);                                                 \
            fprintf(stderr, "FAIL %s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #call,    \
                    (int)cu_status_, name_ ? name_ : "?");                                      \
            exit(EXIT_CUDA_ERROR);                                                              \
        }                                                                                       \
    } while (0)

/* The wrong bytes of [p, p + n) against the pattern of `seed` (a kernel counts them). */
static unsigned long long wrong_bytes(const void *p, size_t n, uint32_t seed, unsigned long long *counter)
{
    unsigned long long wrong = 0;
    CK(cudaMemset(counter, 0, sizeof *counter));
    count_mismatches(p, n, seed, counter, 0);
    CK(cudaMemcpy(&wrong, counter, sizeof wrong, cudaMemcpyDeviceToHost));
    return wrong;
}

/* Step 1 (and 3's first half): `count` blocks cudaMalloc'd, filled, all freed. */
static void malloc_fill_free(size_t count, const char *when)
{
    void **p = (void **)calloc(count, sizeof *p);
    for (size_t i = 0; i < count; i++) {
        cudaError_t e = cudaMalloc(&p[i], block);
        EXPECT(e == cudaSuccess, "%s: cudaMalloc %zu of %zu: %s", when, i, count, cudaGetErrorName(e));
        fill_pattern(p[i], block, (uint32_t)i, 0);
    }
    CK(cudaDeviceSynchronize());
    for (size_t i = 0; i < count; i++)
        CK(cudaFree(p[i]));
    free(p);
}

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);

/* Step 2: `count` handles of `block` bytes on `device`, mapped, written, checked, released. */
static int create_the_same_bytes(create_fn create, int device, size_t count, unsigned long long *counter)
{
    CUmemAllocationProp prop = gpu_test_device_memory(device);
    size_t granularity = 0;
    CU(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    EXPECT(block % granularity == 0, "64 MiB is a multiple of the granularity (%zu)", granularity);
    size_t total = count * block;
    CUdeviceptr range = 0;
    CU(cuMemAddressReserve(&range, total, 0, 0, 0));
    CUmemGenericAllocationHandle *h = (CUmemGenericAllocationHandle *)calloc(count, sizeof *h);
    double start = now_ns();
    for (size_t i = 0; i < count; i++) {
        CUresult r = create(&h[i], block, &prop, 0);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            printf("oom_retry: cuMemCreate %zu of %zu (64 MiB): out of memory (%.1f of %.1f GiB created)\n", i,
                   count, (double)(i * block) / 1073741824.0, (double)total / 1073741824.0);
            printf("oom_retry: FAIL (out of memory)\n");
            exit(EXIT_OUT_OF_MEMORY);
        }
        CU(r);
        CU(cuMemMap(range + i * block, block, 0, h[i], 0));
    }
    CUmemAccessDesc access = gpu_test_device_access(device);
    CU(cuMemSetAccess(range, total, &access, 1));
    double created_ms = (now_ns() - start) / 1e6;
    fill_pattern((void *)range, total, 11, 0);
    unsigned long long wrong = wrong_bytes((const void *)range, total, 11, counter);
    printf("oom_retry: %zu cuMemCreate handles of 64 MiB (%.1f GiB) created and mapped in %.0f ms, %llu bytes "
           "wrong\n",
           count, (double)total / 1073741824.0, created_ms, wrong);
    CU(cuMemUnmap(range, total));
    for (size_t i = 0; i < count; i++)
        CU(cuMemRelease(h[i]));
    CU(cuMemAddressFree(range, total));
    free(h);
    return wrong ? EXIT_CORRUPTION : 0;
}

/* Step 3: the same bytes through cudaMallocManaged, touched and checked on the device. */
static int managed_the_same_bytes(size_t count, unsigned long long *counter)
{
    void **m = (void **)calloc(count, sizeof *m);
    double start = now_ns();
    for (size_t i = 0; i < count; i++) {
        cudaError_t e = cudaMallocManaged(&m[i], block, cudaMemAttachGlobal);
        if (e == cudaErrorMemoryAllocation) {
            printf("oom_retry: cudaMallocManaged %zu of %zu (64 MiB): out of memory\n", i, count);
            printf("oom_retry: FAIL (out of memory)\n");
            exit(EXIT_OUT_OF_MEMORY);
        }
        CK(e);
        fill_pattern(m[i], block, (uint32_t)i + 100, 0);
    }
    unsigned long long wrong = 0;
    for (size_t i = 0; i < count; i++)
        wrong += wrong_bytes(m[i], block, (uint32_t)i + 100, counter);
    printf("oom_retry: %zu cudaMallocManaged blocks of 64 MiB (%.1f GiB) touched and checked on the device in "
           "%.0f ms, %llu bytes wrong\n",
           count, (double)(count * block) / 1073741824.0, (now_ns() - start) / 1e6, wrong);
    for (size_t i = 0; i < count; i++)
        CK(cudaFree(m[i]));
    free(m);
    return wrong ? EXIT_CORRUPTION : 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "direct";
    EXPECT(!strcmp(mode, "direct") || !strcmp(mode, "entry"), "mode direct or entry, not %s", mode);
    int device = 0;
    CK(cudaSetDevice(device));
    CK(cudaFree(0));
    size_t free_bytes = 0, total_bytes = 0;
    CK(cudaMemGetInfo(&free_bytes, &total_bytes));
    size_t want = total_bytes / 10 * 8, room = free_bytes / 100 * 95;
    size_t count = (want < room ? want : room) / block;
    printf("oom_retry: %s, shim %s: %zu blocks of 64 MiB (%.1f GiB of %.1f GiB, %.1f GiB free)\n", mode,
           poolshim_is_active() ? "active" : "inactive", count, (double)(count * block) / 1073741824.0,
           (double)total_bytes / 1073741824.0, (double)free_bytes / 1073741824.0);
    create_fn create = cuMemCreate;
    if (!strcmp(mode, "entry")) {
        cudaDriverEntryPointQueryResult found;
        CK(cudaGetDriverEntryPointByVersion("cuMemCreate", (void **)&create, 12000, cudaEnableDefault, &found));
        EXPECT(found == cudaDriverEntryPointSuccess && create, "cuMemCreate through the runtime");
    }
    unsigned long long *counter = nullptr;
    CK(cudaMalloc((void **)&counter, sizeof *counter));
    malloc_fill_free(count, "step 1");
    int rc = create_the_same_bytes(create, device, count, counter);
    if (rc == 0) {
        malloc_fill_free(count, "step 3");
        rc = managed_the_same_bytes(count, counter);
    }
    CK(cudaFree(counter));
    printf("oom_retry: %s\n", rc == 0 ? "OK" : "FAIL (wrong bytes)");
    return rc;
}
