/* copy_calls: the copies a program makes between two markers, for
 * tools/prof/copy_calls.sh, which prints the driver (cuMemcpy*) functions
 * each runtime copy reaches. One copy of each kind the runtime offers:
 * H2D, D2H, D2D and Default through cudaMemcpy, the same through
 * cudaMemcpyAsync on a stream, 2D, 3D, peer (sync and async). */
#include <cstdio>
#include <cuda_runtime.h>

extern "C" __attribute__((noinline)) void copies_begin(void) { asm volatile(""); }
extern "C" __attribute__((noinline)) void copies_end(void) { asm volatile(""); }
extern "C" __attribute__((noinline)) void mark(const char *what) { asm volatile("" ::"r"(what)); }

int main(void)
{
    const size_t n = 1 << 20;
    void *a = nullptr, *b = nullptr, *h = nullptr;
    cudaStream_t s;
    if (cudaMalloc(&a, n) || cudaMalloc(&b, n) || cudaMallocHost(&h, n) || cudaStreamCreate(&s))
        return 1;
    int count = 0;
    cudaGetDeviceCount(&count);
    copies_begin();
    mark("cudaMemcpy H2D");
    cudaMemcpy(a, h, n, cudaMemcpyHostToDevice);
    mark("cudaMemcpy D2H");
    cudaMemcpy(h, a, n, cudaMemcpyDeviceToHost);
    mark("cudaMemcpy D2D");
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    mark("cudaMemcpy Default");
    cudaMemcpy(b, a, n, cudaMemcpyDefault);
    mark("cudaMemcpyAsync H2D");
    cudaMemcpyAsync(a, h, n, cudaMemcpyHostToDevice, s);
    mark("cudaMemcpyAsync D2H");
    cudaMemcpyAsync(h, a, n, cudaMemcpyDeviceToHost, s);
    mark("cudaMemcpyAsync D2D");
    cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s);
    mark("cudaMemcpyAsync Default");
    cudaMemcpyAsync(b, a, n, cudaMemcpyDefault, s);
    mark("cudaMemcpy2D D2D");
    cudaMemcpy2D(b, 1024, a, 1024, 512, 64, cudaMemcpyDeviceToDevice);
    mark("cudaMemcpy2DAsync D2H");
    cudaMemcpy2DAsync(h, 1024, a, 1024, 512, 64, cudaMemcpyDeviceToHost, s);
    mark("cudaMemcpy3D D2D");
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(a, 1024, 1024, 16);
    p.dstPtr = make_cudaPitchedPtr(b, 1024, 1024, 16);
    p.extent = make_cudaExtent(512, 16, 4);
    p.kind = cudaMemcpyDeviceToDevice;
    cudaMemcpy3D(&p);
    mark("cudaMemcpy3DAsync D2D");
    cudaMemcpy3DAsync(&p, s);
    mark("cudaMemcpyPeer");
    cudaMemcpyPeer(b, 0, a, 0, n);
    mark("cudaMemcpyPeerAsync");
    cudaMemcpyPeerAsync(b, 0, a, 0, n, s);
    mark("cudaMemset");
    cudaMemset(a, 0, n);
    mark("end");
    cudaStreamSynchronize(s);
    copies_end();
    printf("copy_calls: done (%d devices, last error %s)\n", count, cudaGetErrorName(cudaGetLastError()));
    return 0;
}
