/* remap_idle — remap on growth must not unmap memory a running kernel uses.
 *
 * The expandable pool's remap (core/pool.c step c) unmaps whole free pieces
 * elsewhere in its range when it must grow. A freed block is ready after a
 * barrier, which orders LATER work only: a kernel issued before the free
 * may still run, and cuMemUnmap does not wait for it. The pool therefore
 * unmaps without a device synchronize only pieces whose releasing barrier
 * has passed on the GPU (barrier_passed); for others it waits on the host
 * for the barrier that released them (barrier_wait).
 *
 * busy (default): a kernel writes block A and reads it back for about 1.5 s;
 *   meanwhile the host frees A, allocates 1 MiB (the pool's eager barrier
 *   releases A) and then a block B larger than anything free (growth:
 *   remap wants A's pieces). The kernel must neither fault (A unmapped under
 *   it: cudaErrorIllegalAddress at the next synchronize) nor read back
 *   anything but what it wrote; B must hold what is written to it.
 *   Under the shim run.sh expects remap_waits>0 (the remap waited for A's
 *   barrier), and with POOLSHIM_TEST_ASSUME_IDLE=1 (every barrier counts as
 *   passed) or POOLSHIM_TEST_WAIT_RETURNS=1 (the wait returns at once) the
 *   same program must detect the fault: the negative controls.
 * idle: the kernel on A finishes (event synchronize), A is freed, the
 *   eager barrier releases it, the host sleeps 20 ms (the barrier's event
 *   completes), then B grows: the remap moves A's pieces with no device
 *   synchronize (run.sh expects remaps_idle>0 remap_syncs==0).
 * Natively cudaFree synchronizes, so both modes pass without the shim.
 * Exit 0: all checked; 3: a fault or wrong bytes (the hazard); 1: error. */
#include "gpu_test.h"

#include <unistd.h>

__device__ static inline unsigned long long global_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Writes A's pattern for pass p, reads its own bytes back, counts mismatches;
 * passes until budget_ns of GPU time went by. */
__global__ void spin_write_kernel(uint8_t *a, size_t n, unsigned long long budget_ns, unsigned long long *bad,
                                  unsigned long long *passes)
{
    unsigned long long start = global_ns();
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long wrong = 0;
    uint32_t pass = 0;
    do {
        for (size_t i = first; i < n; i += stride)
            a[i] = pattern_byte(i, 1000 + pass);
        for (size_t i = first; i < n; i += stride)
            wrong += a[i] != pattern_byte(i, 1000 + pass);
        pass++;
    } while (global_ns() - start < budget_ns);
    if (wrong)
        atomicAdd(bad, wrong);
    if (first == 0)
        *passes = pass;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "busy";
    int idle = strcmp(mode, "idle") == 0;
    if (!idle && strcmp(mode, "busy") != 0) {
        fprintf(stderr, "usage: remap_idle [busy|idle]\n");
        return EXIT_CUDA_ERROR;
    }
    const size_t a_size = 256ull << 20, b_size = 384ull << 20;
    unsigned long long *counters = nullptr; /* [0] wrong bytes seen by the kernel, [1] its passes */
    CK(cudaMalloc((void **)&counters, 2 * sizeof *counters));
    CK(cudaMemset(counters, 0, 2 * sizeof *counters));
    uint8_t *a = nullptr;
    void *separator = nullptr, *small = nullptr, *b = nullptr;
    CK(cudaMalloc((void **)&a, a_size));
    /* kept: A's hole is not next to the range's end. 64 MiB, more than the
     * pool's piece (8 MiB by default), so it cannot sit in the rest of A's
     * last piece and A's hole ends at a piece boundary it does not cross. */
    CK(cudaMalloc(&separator, 64u << 20));
    CK(cudaDeviceSynchronize());

    unsigned long long budget = idle ? 50000000ull : 1500000000ull;
    cudaEvent_t done;
    CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    spin_write_kernel<<<264, 512>>>(a, a_size, budget, &counters[0], &counters[1]);
    CK(cudaGetLastError());
    CK(cudaEventRecord(done, 0));
    if (idle)
        CK(cudaEventSynchronize(done)); /* the kernel is over before A is freed */
    double t0 = now_s();
    CK(cudaFree(a));
    CK(cudaMalloc(&small, 1u << 20)); /* the eager barrier releases A */
    if (idle)
        usleep(20000); /* its event completes on the idle GPU */
    double t1 = now_s();
    cudaError_t grown = cudaMalloc(&b, b_size); /* growth: remap wants A's pieces */
    double t2 = now_s();
    int kernel_running = cudaEventQuery(done) == cudaErrorNotReady;
    if (grown != cudaSuccess) {
        printf("remap_idle %s: cudaMalloc of B failed: %s\n", mode, cudaGetErrorString(grown));
        return grown == cudaErrorIllegalAddress || grown == cudaErrorLaunchFailure ? EXIT_CORRUPTION : EXIT_CUDA_ERROR;
    }
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    printf("remap_idle %s: free+1 MiB %.3f ms, growth %.3f ms (the kernel %s when it returned); B %s A's range\n",
           mode, (t1 - t0) * 1e3, (t2 - t1) * 1e3, kernel_running ? "still ran" : "had finished",
           b0 < a0 + a_size && a0 < b0 + b_size ? "overlaps" : "is outside");
    cudaError_t synced = cudaDeviceSynchronize();
    if (synced != cudaSuccess) {
        printf("remap_idle %s: the kernel on A failed: %s (A was unmapped under it)\nFAIL\n", mode,
               cudaGetErrorString(synced));
        return EXIT_CORRUPTION;
    }
    unsigned long long host_counters[2] = {0, 0};
    CK(cudaMemcpy(host_counters, counters, sizeof host_counters, cudaMemcpyDeviceToHost));
    printf("remap_idle %s: the kernel made %llu passes over A, %llu bytes read back wrong\n", mode, host_counters[1],
           host_counters[0]);
    /* B holds what is written to it */
    unsigned long long *bad = &counters[0];
    CK(cudaMemset(bad, 0, sizeof *bad));
    fill_pattern(b, b_size, 77, 0);
    count_mismatches(b, b_size, 77, bad, 0);
    unsigned long long b_wrong = 0;
    CK(cudaMemcpy(&b_wrong, bad, sizeof b_wrong, cudaMemcpyDeviceToHost));
    CK(cudaFree(b));
    CK(cudaFree(small));
    CK(cudaFree(separator));
    CK(cudaFree(counters));
    CK(cudaEventDestroy(done));
    if (host_counters[0] || b_wrong) {
        printf("remap_idle %s: %llu wrong bytes in A, %llu in B\nFAIL\n", mode, host_counters[0], b_wrong);
        return EXIT_CORRUPTION;
    }
    printf("remap_idle %s: OK\n", mode);
    return 0;
}
