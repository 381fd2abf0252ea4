/* capture_threads — a stream capture on one thread survives cudaMalloc /
 * cudaFree churn on another thread, as natively.
 *
 *   capture_threads MODE [nonblocking]
 *
 * Thread A captures a *blocking* stream (MODE: relaxed or threadlocal
 * capture mode) for ~300 ms, launching kernels into the capture. Thread B
 * meanwhile allocates, runs a kernel on its own non-blocking stream, frees
 * and allocates again, over and over: under the shim that asks for
 * barriers and fences, which must not touch the legacy stream while A's
 * blocking stream captures (recording there ends A's capture with
 * cudaErrorStreamCaptureInvalidated). Then A ends the capture (must
 * succeed), launches the graph and checks its result; B checks its data.
 * With `nonblocking` A's stream is non-blocking and A made a block on it
 * (cudaMallocAsync) before the capture, which B frees first on its own
 * stream: a stack that made A's stream wait for B's (the arena's owner
 * stream), or that synchronized the device at a free (free_sync device),
 * would end A's capture the same way (the GPU soak's thread-local captures
 * died of the second). Exit 0: both fine; 3: wrong data; 1: a CUDA error
 * (the capture failed). */
#include "gpu_test.h"

#include <atomic>
#include <chrono>
#include <thread>

__global__ void add_one(unsigned *p, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] += 1;
}

int main(int argc, char **argv)
{
    const char *mode_name = argc > 1 ? argv[1] : "relaxed";
    bool nonblocking = argc > 2 && strcmp(argv[2], "nonblocking") == 0;
    cudaStreamCaptureMode mode = strcmp(mode_name, "threadlocal") == 0 ? cudaStreamCaptureModeThreadLocal
                                                                       : cudaStreamCaptureModeRelaxed;
    const size_t n = 1 << 20;
    unsigned *buf = nullptr;
    CK(cudaMalloc((void **)&buf, n * sizeof *buf));
    CK(cudaMemset(buf, 0, n * sizeof *buf));
    CK(cudaDeviceSynchronize());
    cudaStream_t cs;
    /* blocking: the legacy stream must not be touched while it captures */
    CK(cudaStreamCreateWithFlags(&cs, nonblocking ? cudaStreamNonBlocking : cudaStreamDefault));
    void *on_cs = nullptr; /* a block of A's stream that B frees during the capture */
    if (nonblocking) {
        CK(cudaMallocAsync(&on_cs, 64 << 10, cs));
        fill_pattern(on_cs, 64 << 10, 7, cs);
        CK(cudaStreamSynchronize(cs));
    }
    std::atomic<int> capturing{0}, done{0};
    unsigned long long b_wrong = 0;
    int b_rounds = 0;
    std::thread b([&]() {
        CK(cudaSetDevice(0));
        cudaStream_t s;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        while (!capturing.load())
            std::this_thread::yield();
        if (on_cs)
            CK(cudaFreeAsync(on_cs, s));
        unsigned long long *counter = nullptr;
        CK(cudaMalloc((void **)&counter, sizeof *counter));
        while (!done.load()) {
            for (int k = 0; k < 16; k++) {
                void *p = nullptr;
                size_t bytes = (size_t)(1 + (k * 7 + b_rounds) % 16) << 20;
                CK(cudaMalloc(&p, bytes));
                fill_pattern(p, bytes, (uint32_t)(b_rounds * 16 + k), s);
                CK(cudaMemsetAsync(counter, 0, sizeof *counter, s));
                count_mismatches(p, bytes, (uint32_t)(b_rounds * 16 + k), counter, s);
                unsigned long long wrong = 0;
                CK(cudaMemcpyAsync(&wrong, counter, sizeof wrong, cudaMemcpyDeviceToHost, s));
                CK(cudaStreamSynchronize(s));
                b_wrong += wrong;
                CK(cudaFree(p));
            }
            b_rounds++;
        }
        CK(cudaFree(counter));
        CK(cudaStreamDestroy(s));
    });
    CK(cudaStreamBeginCapture(cs, mode));
    capturing = 1;
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    int launched = 0;
    while (std::chrono::steady_clock::now() < until) {
        add_one<<<(unsigned)((n + 255) / 256), 256, 0, cs>>>(buf, n);
        launched++;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    cudaGraph_t graph = nullptr;
    cudaError_t end = cudaStreamEndCapture(cs, &graph);
    done = 1;
    b.join();
    printf("capture_threads %s%s: thread B made %d rounds of 16 alloc/kernel/free; capture of %d kernels ended with %s\n",
           mode_name, nonblocking ? " nonblocking" : "", b_rounds, launched, cudaGetErrorName(end));
    if (end != cudaSuccess)
        return EXIT_CUDA_ERROR;
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, cs));
    CK(cudaStreamSynchronize(cs));
    unsigned first = 0, last = 0;
    CK(cudaMemcpy(&first, buf, sizeof first, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&last, buf + n - 1, sizeof last, cudaMemcpyDeviceToHost));
    printf("capture_threads %s: graph result %u/%u (expected %d), thread B wrong bytes %llu\n", mode_name, first,
           last, launched, b_wrong);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(cs));
    CK(cudaFree(buf));
    if (first != (unsigned)launched || last != (unsigned)launched || b_wrong) {
        printf("capture_threads %s: CORRUPTION\n", mode_name);
        return EXIT_CORRUPTION;
    }
    printf("capture_threads %s: OK\n", mode_name);
    return 0;
}
