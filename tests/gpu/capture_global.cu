/* capture_global — cudaMalloc / cudaFree on one thread while another thread
 * captures a stream in *global* mode: the shim must answer exactly as CUDA
 * does natively.
 *
 * In cudaStreamCaptureModeGlobal, CUDA prohibits "potentially unsafe" calls
 * (cudaMalloc, cudaFree, ...) on every thread whose own capture mode is not
 * relaxed while the capture is open: they return
 * cudaErrorStreamCaptureUnsupported. A thread that switched itself to
 * relaxed mode (cudaThreadExchangeStreamCaptureMode) may call them. A pool
 * that serves cudaMalloc from memory it holds would answer cudaSuccess; one
 * that grows through the real cuMemAlloc would pass on an error CUDA never
 * gives (the arena returned cudaErrorInvalidValue).
 *
 * Thread A (argv[1]: blocking or nonblocking, the captured stream) begins a
 * global-mode capture and launches kernels into it. Meanwhile thread B (its
 * own mode: global, the default) frees a block allocated before the capture
 * and mallocs (while frees and barriers happen: B freed and allocated
 * before, so the shim has pending blocks and wants a barrier), then switches
 * itself to relaxed mode and mallocs and frees again. A ends the capture;
 * when it survived, the graph runs and its result is checked.
 *
 * It prints one line
 *   capture_global MODE RESULT free=E1 malloc=E2 relaxed_malloc=E3 relaxed_free=E4 end=E5
 * with the error name of each call, which tests/gpu/run.sh compares between
 * the native run and the runs under the shim (pool, arena): they must be
 * the same line. Exit 0: the calls behaved as they did (whatever CUDA said)
 * and the graph, when it survived, computed the right result; 3: wrong
 * result; 1: a CUDA error outside the calls under test. */
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

__global__ void touch(uint8_t *p, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = (uint8_t)i;
}

int main(int argc, char **argv)
{
    const char *kind = argc > 1 ? argv[1] : "blocking";
    const bool nonblocking = strcmp(kind, "nonblocking") == 0;
    const size_t n = 1 << 20, block = 4 << 20;
    unsigned *buf = nullptr;
    CK(cudaMalloc((void **)&buf, n * sizeof *buf));
    CK(cudaMemset(buf, 0, n * sizeof *buf));
    CK(cudaDeviceSynchronize());

    std::atomic<int> capturing{0}, b_done{0}; /* A's capture is open; B made its calls */
    std::atomic<int> b_ready{0};               /* B's churn before the capture is done */
    cudaError_t e_free = cudaSuccess, e_malloc = cudaSuccess, e_relaxed_malloc = cudaSuccess,
                e_relaxed_free = cudaSuccess;
    std::thread b([&]() {
        CK(cudaSetDevice(0));
        cudaStream_t s;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        /* before the capture: churn, so that blocks are pending (freed while
         * kernels may still run) and the shim wants a barrier for the next
         * cudaMalloc of this size */
        void *keep = nullptr;
        CK(cudaMalloc(&keep, block));
        for (int i = 0; i < 8; i++) {
            void *p = nullptr;
            CK(cudaMalloc(&p, block));
            touch<<<(unsigned)((block + 255) / 256), 256, 0, s>>>((uint8_t *)p, block);
            CK(cudaFree(p));
        }
        b_ready = 1; /* only now may A begin: a global capture prohibits these calls */
        while (!capturing.load())
            std::this_thread::yield();
        /* global mode (this thread's default): prohibited while A captures */
        e_free = cudaFree(keep);
        void *p = nullptr;
        e_malloc = cudaMalloc(&p, block);
        if (e_malloc == cudaSuccess)
            (void)cudaFree(p); /* as unsafe as the malloc: both runs do it alike */
        /* relaxed mode: allowed */
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        CK(cudaThreadExchangeStreamCaptureMode(&mode));
        e_relaxed_malloc = cudaMalloc(&p, block);
        e_relaxed_free = e_relaxed_malloc == cudaSuccess ? cudaFree(p) : cudaSuccess;
        CK(cudaThreadExchangeStreamCaptureMode(&mode));
        b_done = 1;
        while (capturing.load()) /* no more calls until A ended the capture */
            std::this_thread::yield();
        if (e_free != cudaSuccess) /* the block is still ours */
            CK(cudaFree(keep));
        CK(cudaStreamSynchronize(s));
        CK(cudaStreamDestroy(s));
    });

    cudaStream_t cs;
    if (nonblocking)
        CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    else
        CK(cudaStreamCreate(&cs));
    while (!b_ready.load())
        std::this_thread::yield();
    CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    int launched = 0;
    /* kernels before and after B's calls; a launch into a capture that B's
     * calls invalidated fails, and is not counted */
    auto launch = [&]() {
        add_one<<<(unsigned)((n + 255) / 256), 256, 0, cs>>>(buf, n);
        if (cudaGetLastError() == cudaSuccess)
            launched++;
    };
    for (int i = 0; i < 4; i++)
        launch();
    capturing = 1;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!b_done.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 0; i < 4; i++)
        launch();
    cudaGraph_t graph = nullptr;
    cudaError_t end = cudaStreamEndCapture(cs, &graph);
    (void)cudaGetLastError();
    capturing = 0;
    if (!b_done.load()) {
        fprintf(stderr, "FAIL: thread B never finished its calls\n");
        return EXIT_CUDA_ERROR;
    }
    b.join();
    printf("capture_global %s RESULT free=%s malloc=%s relaxed_malloc=%s relaxed_free=%s end=%s\n", kind,
           cudaGetErrorName(e_free), cudaGetErrorName(e_malloc), cudaGetErrorName(e_relaxed_malloc),
           cudaGetErrorName(e_relaxed_free), cudaGetErrorName(end));
    int status = 0;
    if (end == cudaSuccess && graph) {
        cudaGraphExec_t exec;
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaGraphLaunch(exec, cs));
        CK(cudaStreamSynchronize(cs));
        unsigned first = 0, last = 0;
        CK(cudaMemcpy(&first, buf, sizeof first, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&last, buf + n - 1, sizeof last, cudaMemcpyDeviceToHost));
        printf("capture_global %s: graph of %d kernels, result %u/%u\n", kind, launched, first, last);
        if (first != (unsigned)launched || last != (unsigned)launched)
            status = EXIT_CORRUPTION;
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
    } else {
        printf("capture_global %s: the capture did not survive (%s)\n", kind, cudaGetErrorName(end));
        if (graph)
            cudaGraphDestroy(graph);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaStreamDestroy(cs));
    CK(cudaFree(buf));
    printf("capture_global %s: %s\n", kind, status ? "CORRUPTION" : "OK");
    return status;
}
