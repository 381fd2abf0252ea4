/* vmm_layout_bw: does the way a buffer's physical memory is cut change its
 * copy and kernel bandwidth? Natively (no shim), 256 MiB buffers on device 0
 * (and device 1 when there are two with peer access), in each layout:
 *   native    cudaMalloc
 *   pieces2   128 physical allocations of 2 MiB, one cuMemMap each (the
 *             expandable pool's pieces); pieces4/8/16 the same with larger ones
 *   one       one physical allocation, one cuMemMap (a run)
 * Access for every device once over the whole range. For each layout: a
 * device-to-device cudaMemcpy on device 0, a copy kernel on device 0, and with
 * two devices a cudaMemcpyPeer 0->1; best of 10 copies per round, ROUNDS (4)
 * rounds alternating the layouts, medians printed with the ratio to native.
 * Also asks whether cuMemMap maps part of a physical allocation (a nonzero
 * offset), which would let pieces of one allocation move alone: the CUDA 13.0
 * driver 580 answers CUDA_ERROR_NOT_SUPPORTED (801; H200, 2026-11-27).
 * Used for the piece-size trade-off in docs/design.md ("Several GPUs").
 * Build: nvcc -O2 -o vmm_layout_bw vmm_layout_bw.cu -lcuda */
#include <cuda.h>
#include <algorithm>
#include <vector>

#include "gpu_test.h" /* now_ns, CU_CK */

static const size_t kSize = 256u << 20;

static double now_s() { return now_ns() * 1e-9; }

struct Buf {
    CUdeviceptr ptr = 0;
    std::vector<CUmemGenericAllocationHandle> handles;
    bool vm = false;
    double make_ms = 0;
};

static int g_ndev = 1;

static Buf make(int dev, const char *layout)
{
    Buf b;
    cudaSetDevice(dev);
    double t0 = now_s();
    if (!strcmp(layout, "native")) {
        cudaMalloc((void **)&b.ptr, kSize);
        b.make_ms = (now_s() - t0) * 1e3;
        return b;
    }
    b.vm = true;
    CUmemAllocationProp prop = gpu_test_device_memory(dev);
    CU_CK(cuMemAddressReserve(&b.ptr, kSize, 0, 0, 0));
    size_t piece = 2u << 20;
    bool one_handle = false;
    if (!strcmp(layout, "pieces4")) piece = 4u << 20;
    if (!strcmp(layout, "pieces8")) piece = 8u << 20;
    if (!strcmp(layout, "pieces16")) piece = 16u << 20;
    if (!strcmp(layout, "one")) one_handle = true;
    if (one_handle) {
        CUmemGenericAllocationHandle h;
        CU_CK(cuMemCreate(&h, kSize, &prop, 0));
        b.handles.push_back(h);
        CU_CK(cuMemMap(b.ptr, kSize, 0, h, 0));
    } else {
        for (size_t off = 0; off < kSize; off += piece) {
            CUmemGenericAllocationHandle h;
            CU_CK(cuMemCreate(&h, piece, &prop, 0));
            CU_CK(cuMemMap(b.ptr + off, piece, 0, h, 0));
            b.handles.push_back(h);
        }
    }
    CUmemAccessDesc acc[8] = {};
    for (int d = 0; d < g_ndev; d++)
        acc[d] = gpu_test_device_access(d);
    CU_CK(cuMemSetAccess(b.ptr, kSize, acc, g_ndev));
    b.make_ms = (now_s() - t0) * 1e3;
    return b;
}

static void drop(Buf &b)
{
    if (!b.vm) {
        cudaFree((void *)b.ptr);
        return;
    }
    cudaDeviceSynchronize();
    size_t piece = kSize / b.handles.size();
    for (size_t i = 0; i < b.handles.size(); i++)
        CU_CK(cuMemUnmap(b.ptr + i * piece, piece));
    for (auto h : b.handles)
        CU_CK(cuMemRelease(h));
    CU_CK(cuMemAddressFree(b.ptr, kSize));
}

__global__ void copy_kernel(const float4 *a, float4 *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        b[i] = a[i];
}

static double best_gbs(int kind, Buf &a0, Buf &b0, Buf &b1)
{
    double best = 1e9;
    for (int i = 0; i < 11; i++) {
        cudaSetDevice(0);
        cudaDeviceSynchronize();
        double t0 = now_s();
        if (kind == 0)
            cudaMemcpy((void *)b0.ptr, (void *)a0.ptr, kSize, cudaMemcpyDeviceToDevice);
        else if (kind == 1)
            copy_kernel<<<1056, 512>>>((const float4 *)a0.ptr, (float4 *)b0.ptr, kSize / 16);
        else
            cudaMemcpyPeer((void *)b1.ptr, 1, (void *)a0.ptr, 0, kSize);
        cudaDeviceSynchronize();
        if (kind == 2) {
            cudaSetDevice(1);
            cudaDeviceSynchronize();
            cudaSetDevice(0);
        }
        double t = now_s() - t0;
        if (i && t < best)
            best = t;
    }
    return kSize / best / 1e9;
}

/* Does cuMemMap take a nonzero offset into a physical allocation? */
static void offset_map_check()
{
    CUmemAllocationProp prop = gpu_test_device_memory(0);
    const size_t piece = 2u << 20;
    CUmemGenericAllocationHandle h;
    CUdeviceptr p;
    CU_CK(cuMemCreate(&h, 4 * piece, &prop, 0));
    CU_CK(cuMemAddressReserve(&p, piece, 0, 0, 0));
    CUresult r = cuMemMap(p, piece, piece, h, 0);
    printf("vmm_layout_bw: cuMemMap at offset 2 MiB into a 8 MiB allocation: %d%s\n", (int)r,
           r == CUDA_SUCCESS ? " (supported)" : "");
    if (r == CUDA_SUCCESS)
        CU_CK(cuMemUnmap(p, piece));
    CU_CK(cuMemAddressFree(p, piece));
    CU_CK(cuMemRelease(h));
}

int main()
{
    cudaFree(0);
    int count = 0;
    cudaGetDeviceCount(&count);
    bool peer = false;
    if (count >= 2) {
        int can01 = 0, can10 = 0;
        cudaDeviceCanAccessPeer(&can01, 0, 1);
        cudaDeviceCanAccessPeer(&can10, 1, 0);
        if (can01 && can10) {
            cudaSetDevice(0);
            cudaDeviceEnablePeerAccess(1, 0);
            cudaSetDevice(1);
            cudaDeviceEnablePeerAccess(0, 0);
            cudaSetDevice(0);
            peer = true;
            g_ndev = 2;
        }
    }
    const char *env = getenv("ROUNDS");
    int rounds = env ? atoi(env) : 4;
    const char *layouts[] = {"native", "pieces2", "pieces4", "pieces8", "pieces16", "one"};
    const int nl = sizeof layouts / sizeof *layouts, nk = peer ? 3 : 2;
    const char *kinds[] = {"memcpy d2d", "copy kernel", "memcpy peer 0->1"};
    std::vector<double> res[6][3], make_ms[6];
    for (int r = 0; r < rounds; r++)
        for (int l = 0; l < nl; l++) {
            Buf a0 = make(0, layouts[l]), b0 = make(0, layouts[l]), b1;
            make_ms[l].push_back(a0.make_ms);
            if (peer)
                b1 = make(1, layouts[l]);
            cudaSetDevice(0);
            cudaMemset((void *)a0.ptr, 1, kSize);
            for (int k = 0; k < nk; k++)
                res[l][k].push_back(best_gbs(k, a0, b0, b1));
            drop(a0);
            drop(b0);
            if (peer)
                drop(b1);
        }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        size_t n = v.size();
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    };
    for (int k = 0; k < nk; k++) {
        double base = median(res[0][k]);
        printf("vmm_layout_bw: %-17s", kinds[k]);
        for (int l = 0; l < nl; l++)
            printf("  %s %.1f (%.3f)", layouts[l], median(res[l][k]), median(res[l][k]) / base);
        printf("  GB/s, median of %d rounds\n", rounds);
    }
    printf("vmm_layout_bw: make 256 MiB (ms, median)");
    for (int l = 0; l < nl; l++)
        printf("  %s %.2f", layouts[l], median(make_ms[l]));
    printf("\n");
    offset_map_check();
    printf("vmm_layout_bw: devices %d, peer %s, last error %s\n", count, peer ? "yes" : "no",
           cudaGetErrorName(cudaGetLastError()));
    return 0;
}
