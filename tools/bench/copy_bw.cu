/* copy_bw: device-to-device copy bandwidth of cudaMalloc buffers on one
 * device, as a program sees it natively or under the shim (where each
 * buffer is a pooled block): for 64 MiB, 256 MiB and 1 GiB, a fresh pair of
 * buffers, cudaMemcpy DeviceToDevice and a copy kernel, best of 11 each,
 * GB/s. Under the expandable pool a buffer below expandable_run_min is made
 * of 2 MiB physical pieces, and the copy engine pays for every piece it
 * crosses (tests/gpu/vmm_layout_bw.cu measured the layouts natively); the
 * kernel does not. tools/gpu_session.sh copybw runs it natively and per
 * configuration in alternated rounds and prints the ratios.
 * Build: nvcc -O2 -o copy_bw copy_bw.cu */
#include <cstdio>
#include <cuda_runtime.h>

#include "bench_gpu.h" /* now_ns */

__global__ void copy_kernel(const float4 *a, float4 *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        b[i] = a[i];
}

int main()
{
    const size_t sizes[] = {64u << 20, 256u << 20, 1u << 30};
    for (size_t n : sizes) {
        void *a, *b;
        if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) {
            printf("copy_bw: FAIL cudaMalloc %zu MiB\n", n >> 20);
            return 1;
        }
        cudaMemset(a, 1, n);
        for (int kind = 0; kind < 2; kind++) {
            double best = 1e9;
            for (int i = 0; i < 11; i++) {
                cudaDeviceSynchronize();
                double t0 = now_ns();
                if (kind == 0)
                    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
                else
                    copy_kernel<<<1056, 512>>>((const float4 *)a, (float4 *)b, n / 16);
                cudaDeviceSynchronize();
                double t = (now_ns() - t0) * 1e-9;
                if (i && t < best)
                    best = t;
            }
            printf("copy_bw: %s %zu MiB %.1f GB/s\n", kind ? "kernel" : "memcpy", n >> 20, n / best / 1e9);
        }
        cudaFree(a);
        cudaFree(b);
    }
    cudaError_t e = cudaGetLastError();
    printf("copy_bw: last error %s\n", cudaGetErrorName(e));
    return e == cudaSuccess ? 0 : 1;
}
