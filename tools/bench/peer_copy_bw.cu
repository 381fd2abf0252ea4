/* peer_copy_bw: copy bandwidth between two devices of 256 MiB buffers from
 * cudaMalloc (pooled under the shim), device 0 current: cudaMemcpy Default
 * 0->1 and 1->0, cudaMemcpyPeer, cudaMemcpyAsync on a blocking stream;
 * best of 20 copies each, in GB/s.
 *   peer_copy_bw [peer]   peer: enable peer access both ways first
 * tools/bench/multigpu.sh runs it natively and under the shim in alternated
 * rounds and prints the ratios. */
#include <cstdio>
#include <cuda_runtime.h>
#include <cstring>
#include <ctime>

static double now_s()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int count = 0;
    cudaGetDeviceCount(&count);
    if (count < 2) {
        printf("peer_copy_bw: SKIP (needs 2 GPUs)\n");
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "peer")) {
        for (int d = 0; d < 2; d++) {
            cudaSetDevice(d);
            if (cudaDeviceEnablePeerAccess(1 - d, 0) != cudaSuccess) {
                printf("peer_copy_bw: SKIP (no peer access between devices 0 and 1)\n");
                return 0;
            }
        }
    }
    const size_t n = 256u << 20;
    void *a0, *b1;
    cudaSetDevice(1);
    if (cudaMalloc(&b1, n))
        return 1;
    cudaSetDevice(0);
    if (cudaMalloc(&a0, n))
        return 1;
    cudaStream_t s;
    cudaStreamCreate(&s);
    const char *names[4] = {"Default 0->1", "Default 1->0", "Peer 0->1", "Async 0->1"};
    for (int k = 0; k < 4; k++) {
        double best = 1e9;
        for (int i = 0; i < 21; i++) {
            cudaDeviceSynchronize();
            double t0 = now_s();
            if (k == 0) cudaMemcpy(b1, a0, n, cudaMemcpyDefault);
            if (k == 1) cudaMemcpy(a0, b1, n, cudaMemcpyDefault);
            if (k == 2) cudaMemcpyPeer(b1, 1, a0, 0, n);
            if (k == 3) cudaMemcpyAsync(b1, a0, n, cudaMemcpyDefault, s);
            cudaDeviceSynchronize();
            cudaSetDevice(1);
            cudaDeviceSynchronize();
            cudaSetDevice(0);
            double t = now_s() - t0;
            if (i && t < best)
                best = t;
        }
        printf("peer_copy_bw: %s %.1f GB/s\n", names[k], n / best / 1e9);
    }
    printf("peer_copy_bw: last error %s\n", cudaGetErrorName(cudaGetLastError()));
    return 0;
}
