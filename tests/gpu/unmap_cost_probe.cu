/* unmap_cost_probe: what giving back N adjacent 2 MiB pieces costs, natively
 * (no shim), three ways, each over a fresh set of N pieces mapped side by
 * side in one reserved range with access for this device:
 *   per piece   cuMemUnmap + cuMemRelease of each piece (what the pool's
 *               release does today, one piece at a time)
 *   one unmap   one cuMemUnmap over the whole run of pieces, then
 *               cuMemRelease of each handle
 *   unmap only  as "per piece" but handles released later (the release's
 *               share is the difference)
 * and, for scale, one 1 GiB piece unmapped and released. A kernel touches
 * every piece first (so the mappings are live in the GPU's page tables).
 * Prints "unmap_cost_probe: <way> N pieces: T us (T/N us a piece)".
 * Build: nvcc -O2 -o unmap_cost_probe unmap_cost_probe.cu -lcuda */
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

static double now_us()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

__global__ void touch(unsigned *p, size_t words)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (unsigned)i;
}

#define CHECK(call)                                                                                  \
    do {                                                                                             \
        CUresult r_ = (call);                                                                        \
        if (r_) {                                                                                    \
            printf("unmap_cost_probe: FAILED %s: %d\n", #call, (int)r_);                              \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static CUmemAllocationProp prop;
static CUmemAccessDesc access_desc;

static void map_run(CUdeviceptr at, size_t piece, int n, std::vector<CUmemGenericAllocationHandle> &h)
{
    h.resize(n);
    for (int i = 0; i < n; i++) {
        CHECK(cuMemCreate(&h[i], piece, &prop, 0));
        CHECK(cuMemMap(at + i * piece, piece, 0, h[i], 0));
    }
    CHECK(cuMemSetAccess(at, piece * n, &access_desc, 1));
    touch<<<256, 256>>>((unsigned *)at, piece * n / 4);
    cudaDeviceSynchronize();
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 512;
    cudaFree(0);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    access_desc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    const size_t piece = 2ull << 20, gib = 1ull << 30;
    CUdeviceptr base;
    CHECK(cuMemAddressReserve(&base, 4 * piece * n + 2 * gib, 0, 0, 0));
    std::vector<CUmemGenericAllocationHandle> h;
    for (int round = 0; round < 2; round++) {
        map_run(base, piece, n, h);
        double t0 = now_us();
        for (int i = 0; i < n; i++) {
            CHECK(cuMemUnmap(base + i * piece, piece));
            CHECK(cuMemRelease(h[i]));
        }
        double t = now_us() - t0;
        printf("unmap_cost_probe: round %d per piece  %d pieces: %9.1f us (%6.1f us a piece)\n", round, n, t, t / n);

        map_run(base, piece, n, h);
        t0 = now_us();
        CUresult whole = cuMemUnmap(base, piece * n);
        double t_unmap = now_us() - t0;
        if (whole) {
            printf("unmap_cost_probe: round %d one unmap  over %d pieces refused (%d)\n", round, n, (int)whole);
            for (int i = 0; i < n; i++)
                CHECK(cuMemUnmap(base + i * piece, piece));
        }
        for (int i = 0; i < n; i++)
            CHECK(cuMemRelease(h[i]));
        t = now_us() - t0;
        printf("unmap_cost_probe: round %d one unmap  %d pieces: %9.1f us (%6.1f us a piece; the unmap %.1f us)\n",
               round, n, t, t / n, t_unmap);

        map_run(base, piece, n, h);
        t0 = now_us();
        for (int i = 0; i < n; i++)
            CHECK(cuMemUnmap(base + i * piece, piece));
        t_unmap = now_us() - t0;
        for (int i = 0; i < n; i++)
            CHECK(cuMemRelease(h[i]));
        t = now_us() - t0;
        printf("unmap_cost_probe: round %d unmap only %d pieces: %9.1f us (%6.1f us a piece; releases %.1f us)\n",
               round, n, t_unmap, t_unmap / n, t - t_unmap);
    }
    map_run(base, gib, 1, h);
    double t0 = now_us();
    CHECK(cuMemUnmap(base, gib));
    CHECK(cuMemRelease(h[0]));
    printf("unmap_cost_probe: one 1 GiB piece: %.1f us\n", now_us() - t0);
    CHECK(cuMemAddressFree(base, 4 * piece * n + 2 * gib));
    return 0;
}
