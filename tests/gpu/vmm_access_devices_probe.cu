/* vmm_access_devices_probe: what mapped memory costs by the devices its
 * access names, natively (no shim). The shim's pool names every device that
 * can reach the owner in every mapping (docs/design.md, "Several GPUs"), so
 * a program that uses one GPU of several pays for the others; this measures
 * how much, to decide whether a grant made only once a second device is in
 * use is worth it. On device 0, for k = 1 .. the devices that can reach it
 * (device 0 and its first k - 1 peers), 3 rounds of 64 pieces of 2 MiB:
 *   create   cuMemCreate of each piece;
 *   map      cuMemMap of each piece, no access;
 *   access1  one cuMemSetAccess over all 64 pieces naming the k devices;
 *   accessN  (after unmapping and mapping again) one call per piece;
 *   unmap    cuMemUnmap + cuMemRelease of each piece.
 * Prints microseconds per piece; round 1 apart (the first call that names
 * a peer is slower: ~21 ms once on two H200s).
 * Build: nvcc -O2 -o vmm_access_devices_probe vmm_access_devices_probe.cu -lcuda */
#include <cuda.h>
#include <vector>

#include "gpu_test.h" /* now_ns, CU_CK, gpu_test_device_memory/_access */

static double now_us() { return now_ns() * 1e-3; }

int main()
{
    CK(cudaFree(0));
    int count = 0;
    CU_CK(cuDeviceGetCount(&count));
    std::vector<int> devices = {0};
    for (int p = 1; p < count; p++) {
        int can = 0;
        CU_CK(cuDeviceCanAccessPeer(&can, p, 0));
        if (can)
            devices.push_back(p);
    }
    for (size_t k = 1; k < devices.size(); k++) { /* the peers' contexts exist, as in a program that uses them */
        CK(cudaSetDevice(devices[k]));
        CK(cudaFree(0));
    }
    CK(cudaSetDevice(0));
    printf("vmm_access_devices_probe: %d device(s), %zu reach device 0\n", count, devices.size());
    const int n = 64;
    const size_t piece = 2u << 20;
    CUmemAllocationProp prop = gpu_test_device_memory(0);
    CUdeviceptr base;
    CU_CK(cuMemAddressReserve(&base, n * piece, 0, 0, 0));
    std::vector<CUmemGenericAllocationHandle> h(n);
    for (size_t k = 1; k <= devices.size(); k++) {
        std::vector<CUmemAccessDesc> acc(k);
        for (size_t i = 0; i < k; i++)
            acc[i] = gpu_test_device_access(devices[i]);
        for (int round = 1; round <= 3; round++) {
            double t0 = now_us();
            for (int i = 0; i < n; i++)
                CU_CK(cuMemCreate(&h[i], piece, &prop, 0));
            double t1 = now_us();
            for (int i = 0; i < n; i++)
                CU_CK(cuMemMap(base + i * piece, piece, 0, h[i], 0));
            double t2 = now_us();
            CU_CK(cuMemSetAccess(base, n * piece, acc.data(), k));
            double t3 = now_us();
            for (int i = 0; i < n; i++)
                CU_CK(cuMemUnmap(base + i * piece, piece));
            for (int i = 0; i < n; i++)
                CU_CK(cuMemMap(base + i * piece, piece, 0, h[i], 0));
            double t4 = now_us();
            for (int i = 0; i < n; i++)
                CU_CK(cuMemSetAccess(base + i * piece, piece, acc.data(), k));
            double t5 = now_us();
            for (int i = 0; i < n; i++) {
                CU_CK(cuMemUnmap(base + i * piece, piece));
                CU_CK(cuMemRelease(h[i]));
            }
            double t6 = now_us();
            printf("devices %zu round %d: create %.1f  map %.1f  access1 %.1f  accessN %.1f  unmap %.1f us/piece\n", k,
                   round, (t1 - t0) / n, (t2 - t1) / n, (t3 - t2) / n, (t5 - t4) / n, (t6 - t5) / n);
        }
    }
    CU_CK(cuMemAddressFree(base, n * piece));
    printf("vmm_access_devices_probe: OK\n");
    return 0;
}
