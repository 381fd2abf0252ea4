/* vmm_alias_probe: what a remap's calls cost, natively (no shim), on 64
 * pieces of 2 MiB: cuMemCreate; cuMemMap at range A (no access yet) and one
 * cuMemSetAccess over A; cuMemMap of the same handles at range B while A
 * still maps them (an alias, what remap_lend does) and one access call;
 * cuMemUnmap of A piece by piece (the lent addresses going); then cuMemUnmap
 * of B and cuMemMap at C of handles mapped nowhere (a remap after a wait).
 * Prints microseconds per piece for each step, and the access calls' time.
 * Build: nvcc -O2 -o vmm_alias_probe vmm_alias_probe.cu -lcuda */
#include <cuda.h>
#include <vector>

#include "gpu_test.h" /* now_ns */

static double now_us() { return now_ns() * 1e-3; }

int main()
{
    cudaFree(0);
    const int n = 64;
    const size_t piece = 2u << 20;
    CUmemAllocationProp prop = gpu_test_device_memory(0);
    CUmemAccessDesc acc = gpu_test_device_access(0);
    CUdeviceptr a, b, c;
    cuMemAddressReserve(&a, n * piece, 0, 0, 0);
    cuMemAddressReserve(&b, n * piece, 0, 0, 0);
    cuMemAddressReserve(&c, n * piece, 0, 0, 0);
    std::vector<CUmemGenericAllocationHandle> h(n);
    /* the n handles mapped one per piece at `base`, or unmapped from there */
    auto map_all = [&](CUdeviceptr base) {
        for (int i = 0; i < n; i++)
            cuMemMap(base + i * piece, piece, 0, h[i], 0);
    };
    auto unmap_all = [&](CUdeviceptr base) {
        for (int i = 0; i < n; i++)
            cuMemUnmap(base + i * piece, piece);
    };
    for (int round = 0; round < 3; round++) {
        double t0 = now_us();
        for (int i = 0; i < n; i++)
            cuMemCreate(&h[i], piece, &prop, 0);
        double t1 = now_us();
        map_all(a);
        double t2 = now_us();
        cuMemSetAccess(a, n * piece, &acc, 1);
        double t3 = now_us();
        cudaMemset((void *)a, 1, n * piece);
        cudaDeviceSynchronize();
        double t4 = now_us();
        map_all(b);
        double t5 = now_us();
        cuMemSetAccess(b, n * piece, &acc, 1);
        double t6 = now_us();
        unmap_all(a);
        double t7 = now_us();
        unmap_all(b);
        double t8 = now_us();
        map_all(c);
        double t9 = now_us();
        cuMemSetAccess(c, n * piece, &acc, 1);
        double t10 = now_us();
        cudaError_t e = cudaMemset((void *)c, 2, n * piece);
        cudaDeviceSynchronize();
        double t11 = now_us();
        unmap_all(c);
        double t12 = now_us();
        for (int i = 0; i < n; i++)
            cuMemRelease(h[i]);
        double t13 = now_us();
        printf("vmm_alias_probe: round %d, us per piece: create %.1f, map %.1f, access(all) %.1f us; "
               "alias map %.1f, access(all) %.1f us; unmap of the first mapping %.1f; unmap of the alias %.1f; "
               "map of a handle mapped nowhere %.1f, access(all) %.1f us; unmap %.1f; release %.1f (%s)\n",
               round, (t1 - t0) / n, (t2 - t1) / n, t3 - t2, (t5 - t4) / n, t6 - t5, (t7 - t6) / n, (t8 - t7) / n,
               (t9 - t8) / n, t10 - t9, (t12 - t11) / n, (t13 - t12) / n, cudaGetErrorName(e));
    }
    return 0;
}
