/* idle_barrier: what one barrier costs the host with many non-blocking streams,
 * on an idle GPU and on a busy one (shim/gpu_ops_cuda.c, step 4 b: a stream
 * query costs ~1.3 us on an H100 while the whole GPU is idle, ~0.2 us while any
 * stream is busy). N non-blocking streams are created; then K pairs of
 * cudaMalloc+cudaFree of 4 MiB (above the thread caches), which under the shim
 * with resource.main.barrier_floor=0 issue one barrier each; with `busy` a
 * kernel spins on the first stream for the whole loop. Prints ns per pair.
 *   nvcc -O2 -o idle_barrier tools/bench/idle_barrier.cu
 *   POOLSHIM_OPTIONS=resource.main.barrier_floor=0 LD_PRELOAD=build/libpoolshim.so \
 *       ./idle_barrier 128 2000 [busy]
 * (tools/gpu_session.sh idlequery; the numbers (H100, 2026-11-25): docs/design.md, after "a
 * stream that cuStreamQuery finds idle needs no b") */
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "bench_gpu.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "idle_barrier: %s: %s\n", #x, cudaGetErrorString(e_));                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 128;
    int k = argc > 2 ? atoi(argv[2]) : 2000;
    bool busy = argc > 3 && !strcmp(argv[3], "busy");
    CK(cudaFree(0));
    std::vector<cudaStream_t> streams(n);
    for (auto &s : streams)
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *p;
    for (int i = 0; i < 50; i++) { /* warm-up: the pool reaches its size */
        CK(cudaMalloc(&p, 4 << 20));
        CK(cudaFree(p));
    }
    CK(cudaDeviceSynchronize());
    if (busy) /* ~2 s at ~2 GHz: longer than the loop */
        spin<<<1, 1, 0, streams[0]>>>(4000000000ll);
    double t0 = now_ns();
    for (int i = 0; i < k; i++) {
        CK(cudaMalloc(&p, 4 << 20));
        CK(cudaFree(p));
    }
    double per = (now_ns() - t0) / k;
    printf("idle_barrier: %d streams, %s GPU: %.0f ns per 4 MiB pair\n", n, busy ? "busy" : "idle", per);
    CK(cudaDeviceSynchronize());
    for (auto &s : streams)
        CK(cudaStreamDestroy(s));
    return 0;
}
