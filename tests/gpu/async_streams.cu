/* async_streams — stream-ordered allocation across streams and in graphs.
 *
 * Steps:
 *   1. Four non-blocking streams, 200 iterations each: cudaMallocAsync, a
 *      fill kernel, a check kernel, cudaFreeAsync, all on that stream, so
 *      blocks are reused while other streams' kernels are in flight.
 *   2. Cross-stream reuse with a dependency: a slow kernel on s1 writes X and
 *      checks it; cudaFreeAsync(X, s1); event on s1; s2 waits on it; then
 *      cudaMallocAsync(Y, s2) (may legally reuse X) and s2 writes Y.
 *   3. Cross-stream without a dependency: the same, but s2 does not wait;
 *      the allocator must not give s2 X's range while s1's kernel runs
 *      (or must order s2 after it). Both X's check and Y's data are verified.
 *   4. A CUDA graph captured on a stream: cudaMallocAsync, fill, check,
 *      cudaFreeAsync; instantiated once and replayed 5 times, each verified.
 * Exit 0 only if every check counted zero bad bytes. */
#include "gpu_test.h"

#include <vector>

/* Writes the pattern, spins, counts bytes that changed, writes it again. */
__global__ void slow_guard_kernel(uint8_t *p, size_t n, uint32_t seed, unsigned long long spin_ns,
                                  unsigned long long *changed)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t i = first; i < n; i += stride)
        p[i] = pattern_byte(i, seed);
    spin_for_ns(spin_ns);
    unsigned long long bad = 0;
    for (size_t i = first; i < n; i += stride)
        bad += ((volatile uint8_t *)p)[i] != pattern_byte(i, seed);
    if (bad)
        atomicAdd(changed, bad);
    for (size_t i = first; i < n; i += stride)
        p[i] = pattern_byte(i, seed);
}

static unsigned long long take(unsigned long long *counter)
{
    unsigned long long host = 0;
    CK(cudaMemcpy(&host, counter, sizeof host, cudaMemcpyDeviceToHost));
    CK(cudaMemset(counter, 0, sizeof host));
    return host;
}

static int failures = 0;

static void expect_zero(unsigned long long bad, const char *what)
{
    printf("async_streams %s: %llu bad bytes: %s\n", what, bad, bad ? "FAIL" : "ok");
    failures += bad != 0;
}

static void many_streams(unsigned long long *counter)
{
    const int stream_count = 4, iterations = 200;
    cudaStream_t streams[stream_count];
    for (int s = 0; s < stream_count; s++)
        CK(cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking));
    for (int it = 0; it < iterations; it++) {
        for (int s = 0; s < stream_count; s++) {
            size_t n = (size_t)1 << (8 + (it * 7 + s * 3) % 15); /* 256 B .. 4 MiB */
            n += (it % 3) * 17;
            void *p = nullptr;
            CK(cudaMallocAsync(&p, n, streams[s]));
            EXPECT((uintptr_t)p % 256 == 0, "alignment, got %p", p);
            uint32_t seed = (uint32_t)(it * 16 + s);
            fill_pattern(p, n, seed, streams[s]);
            count_mismatches(p, n, seed, counter, streams[s]);
            CK(cudaFreeAsync(p, streams[s]));
        }
    }
    for (int s = 0; s < stream_count; s++) {
        CK(cudaStreamSynchronize(streams[s]));
        CK(cudaStreamDestroy(streams[s]));
    }
    expect_zero(take(counter), "four streams x 200 iterations");
}

static void cross_stream(unsigned long long *counter, bool with_dependency)
{
    const size_t n = 8u << 20;
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    int reused = 0;
    for (int round = 0; round < 3; round++) {
        void *x = nullptr, *y = nullptr;
        CK(cudaMallocAsync(&x, n, s1));
        int sms = 0;
        CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        slow_guard_kernel<<<sms, 256, 0, s1>>>((uint8_t *)x, n, 77 + round, 50ull * 1000 * 1000, counter);
        CK(cudaGetLastError());
        CK(cudaFreeAsync(x, s1));
        if (with_dependency) {
            cudaEvent_t freed;
            CK(cudaEventCreateWithFlags(&freed, cudaEventDisableTiming));
            CK(cudaEventRecord(freed, s1));
            CK(cudaStreamWaitEvent(s2, freed, 0));
            CK(cudaEventDestroy(freed));
        }
        CK(cudaMallocAsync(&y, n, s2));
        reused += x == y;
        fill_pattern(y, n, 900 + round, s2);
        CK(cudaDeviceSynchronize());
        size_t bad_y = host_verify_ends(y, n, 900 + round, n / 2);
        CK(cudaFreeAsync(y, s2));
        CK(cudaStreamSynchronize(s2));
        unsigned long long bad = take(counter) + bad_y;
        char what[160];
        snprintf(what, sizeof what, "cross-stream %s dependency round %d (Y==X %s)",
                 with_dependency ? "with" : "without", round, x == y ? "yes" : "no");
        expect_zero(bad, what);
    }
    printf("async_streams cross-stream %s dependency: %d of 3 rounds reused X\n",
           with_dependency ? "with" : "without", reused);
    CK(cudaStreamDestroy(s1));
    CK(cudaStreamDestroy(s2));
}

static void graph_replay(unsigned long long *counter)
{
    const size_t n = (2u << 20) + 100;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    void *p = nullptr;
    CK(cudaMallocAsync(&p, n, s));
    fill_pattern(p, n, 4242, s);
    count_mismatches(p, n, 4242, counter, s);
    void *q = nullptr; /* a second block inside the graph, after the first is freed */
    CK(cudaFreeAsync(p, s));
    CK(cudaMallocAsync(&q, n / 2, s));
    fill_pattern(q, n / 2, 4343, s);
    count_mismatches(q, n / 2, 4343, counter, s);
    CK(cudaFreeAsync(q, s));
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 5; replay++) {
        CK(cudaGraphLaunch(exec, s));
        CK(cudaStreamSynchronize(s));
        char what[64];
        snprintf(what, sizeof what, "graph replay %d", replay);
        expect_zero(take(counter), what);
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(s));
}

int main(void)
{
    unsigned long long *counter = nullptr;
    CK(cudaMalloc((void **)&counter, sizeof *counter));
    CK(cudaMemset(counter, 0, sizeof *counter));
    many_streams(counter);
    cross_stream(counter, true);
    cross_stream(counter, false);
    graph_replay(counter);
    CK(cudaFree(counter));
    if (failures) {
        printf("async_streams: FAIL (%d checks found bad bytes)\n", failures);
        return EXIT_CORRUPTION;
    }
    printf("async_streams: OK\n");
    return 0;
}
