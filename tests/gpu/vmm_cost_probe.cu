/* vmm_cost_probe: what each virtual-memory call costs the first time in a
 * process, natively (no shim): cuMemAddressReserve of twice the device,
 * cuMemCreate / cuMemMap / cuMemSetAccess of 2 MiB and of 1 GiB, access for
 * this device alone and for every peer-capable device, and the first
 * cudaMallocAsync of 1 GiB. Prints one line per call with microseconds.
 * Used to find where the expandable pool's first growth spends its time
 * (docs/design.md, "Runs"). Build: nvcc -O2 -o vmm_cost_probe vmm_cost_probe.cu -lcuda */
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <ctime>

static double now_us()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

#define TIME(label, call)                                                                            \
    do {                                                                                             \
        double t0 = now_us();                                                                        \
        CUresult r_ = (call);                                                                        \
        printf("vmm_cost_probe: %-44s %10.1f us%s\n", label, now_us() - t0, r_ ? " (FAILED)" : "");  \
    } while (0)

int main(int argc, char **argv)
{
    cudaFree(0);
    int count = 0;
    cudaGetDeviceCount(&count);
    size_t free_b, total_b;
    cudaMemGetInfo(&free_b, &total_b);
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemAccessDesc access[8];
    int n_access = 0;
    for (int d = 0; d < count && d < 8; d++) {
        int can = d == 0;
        if (d)
            cuDeviceCanAccessPeer(&can, 0, d);
        if (can)
            access[n_access++] = {{CU_MEM_LOCATION_TYPE_DEVICE, d}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    }
    const size_t two = 2ull << 20, gib = 1ull << 30;
    CUdeviceptr base;
    TIME("cuMemAddressReserve(2 x device)", cuMemAddressReserve(&base, 2 * total_b / gib * gib + 2 * gib, 0, 0, 0));
    CUmemGenericAllocationHandle h[8];
    TIME("cuMemCreate(2 MiB) first", cuMemCreate(&h[0], two, &prop, 0));
    TIME("cuMemMap(2 MiB) first", cuMemMap(base, two, 0, h[0], 0));
    TIME("cuMemSetAccess(2 MiB, this device) first", cuMemSetAccess(base, two, access, 1));
    TIME("cuMemCreate(2 MiB) second", cuMemCreate(&h[1], two, &prop, 0));
    TIME("cuMemMap(2 MiB) second", cuMemMap(base + two, two, 0, h[1], 0));
    TIME("cuMemSetAccess(2 MiB, this device) second", cuMemSetAccess(base + two, two, access, 1));
    if (n_access > 1) {
        TIME("cuMemSetAccess(2 MiB, every peer) first", cuMemSetAccess(base + two, two, access, n_access));
        TIME("cuMemCreate(2 MiB) third", cuMemCreate(&h[2], two, &prop, 0));
        TIME("cuMemMap(2 MiB) third", cuMemMap(base + 2 * two, two, 0, h[2], 0));
        TIME("cuMemSetAccess(2 MiB, every peer) second", cuMemSetAccess(base + 2 * two, two, access, n_access));
    }
    CUdeviceptr big = base + gib;
    TIME("cuMemCreate(1 GiB)", cuMemCreate(&h[3], gib, &prop, 0));
    TIME("cuMemMap(1 GiB)", cuMemMap(big, gib, 0, h[3], 0));
    TIME("cuMemSetAccess(1 GiB, this device)", cuMemSetAccess(big, gib, access, 1));
    if (n_access > 1) {
        TIME("cuMemSetAccess(1 GiB, every peer)", cuMemSetAccess(big, gib, access, n_access));
        CUdeviceptr big2 = base + 2 * gib;
        TIME("cuMemCreate(1 GiB) second", cuMemCreate(&h[4], gib, &prop, 0));
        TIME("cuMemMap(1 GiB) second", cuMemMap(big2, gib, 0, h[4], 0));
        TIME("cuMemSetAccess(1 GiB, every peer) at once", cuMemSetAccess(big2, gib, access, n_access));
    }
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    TIME("cuMemCreate(1 GiB, not exportable)", cuMemCreate(&h[5], gib, &prop, 0));
    void *p = nullptr;
    double t0 = now_us();
    cudaError_t e = cudaMallocAsync(&p, gib, 0);
    cudaStreamSynchronize(0);
    printf("vmm_cost_probe: %-44s %10.1f us%s\n", "cudaMallocAsync(1 GiB) first + sync", now_us() - t0,
           e ? " (FAILED)" : "");
    t0 = now_us();
    e = cudaMalloc(&p, gib);
    printf("vmm_cost_probe: %-44s %10.1f us%s\n", "cudaMalloc(1 GiB)", now_us() - t0, e ? " (FAILED)" : "");
    return 0;
}
