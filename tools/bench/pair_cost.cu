/* pair_cost: ns per cudaMalloc+cudaFree pair of one size (best of 5 runs of
 * N pairs, host clock), and with a third argument the raw cost of the CUDA
 * calls a barrier makes (core/reuse.c, shim/gpu_ops_cuda.c step 4), natively:
 *   nvcc -O2 -o pair_cost tools/bench/pair_cost.cu -lcuda
 *   ./pair_cost 16777216 20000 raw                  # native, with call costs
 * Each run also prints the runtime's entry floor: a pair of calls that allocate
 * nothing (cudaMalloc of 0 bytes, cudaFree(NULL)).
 *   LD_PRELOAD=build/libpoolshim.so ./pair_cost 16777216 200000
 * H100 (2026-11-23): cudaEventRecord on the legacy stream 524-598 ns,
 * cudaStreamWaitEvent 261-306 ns, cudaEventQuery of a completed event
 * 304-309 ns, cuCtxGetCurrent 13-15 ns. A pair that needs a barrier (pending
 * memory is the only fit) cannot cost less than one event record. */
#include <cuda_runtime.h>
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <ctime>
static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(int argc, char **argv) {
    size_t size = argc > 1 ? strtoull(argv[1], 0, 0) : 256;
    int n = argc > 2 ? atoi(argv[2]) : 200000;
    cudaFree(0);
    void *p;
    for (int i = 0; i < 1000; i++) { cudaMalloc(&p, size); cudaFree(p); }
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        for (int i = 0; i < n; i++) { cudaMalloc(&p, size); cudaFree(p); }
        double per = (now() - t0) / n; if (per < best) best = per;
        printf("size %zu rep %d: %.1f ns/pair\n", size, rep, per);
    }
    printf("size %zu best %.1f ns/pair\n", size, best);
    /* The runtime's own cost per call pair, no memory involved: cudaMalloc of 0
     * bytes (success and NULL, no driver allocation) and cudaFree(NULL). In a
     * static-cudart program no interposer runs inside it, so it is a floor under
     * any interposed pair there (tools/gpu_session.sh floor). */
    best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        for (int i = 0; i < 200000; i++) { cudaMalloc(&p, 0); cudaFree(nullptr); }
        double per = (now() - t0) / 200000; if (per < best) best = per;
    }
    printf("entry floor (cudaMalloc of 0 B + cudaFree(NULL)) best %.1f ns/pair\n", best);
    if (argc > 3) {
        cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        double t0 = now();
        for (int i = 0; i < n; i++) cudaEventRecord(e, 0);
        printf("cudaEventRecord(legacy): %.1f ns\n", (now() - t0) / n);
        cudaDeviceSynchronize();
        t0 = now();
        for (int i = 0; i < n; i++) cudaEventQuery(e);
        printf("cudaEventQuery(done): %.1f ns\n", (now() - t0) / n);
        cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        t0 = now();
        for (int i = 0; i < n; i++) cudaStreamWaitEvent(s, e, 0);
        printf("cudaStreamWaitEvent: %.1f ns\n", (now() - t0) / n);
        CUcontext c; t0 = now();
        for (int i = 0; i < n; i++) cuCtxGetCurrent(&c);
        printf("cuCtxGetCurrent: %.1f ns\n", (now() - t0) / n);
    }
    return 0;
}
