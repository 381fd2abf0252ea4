// The demo program of `make demo`: an allocation-heavy CUDA program of the
// kind poolshim is for. Each step allocates a few buffers with cudaMalloc,
// runs a kernel over them, checks a result and frees them again, as code
// that allocates per operation does. Built with plain nvcc (static cudart),
// so running it under the shim exercises the driver door.
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cuda_runtime.h>

__global__ void axpy(const float *x, float *y, float a, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i];
}

#define CK(call)                                                                    \
    do {                                                                            \
        cudaError_t e_ = (call);                                                    \
        if (e_ != cudaSuccess) {                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 2000;
    auto t0 = std::chrono::steady_clock::now();
    double checksum = 0;
    for (int s = 0; s < steps; s++) {
        size_t n = 1024 + (size_t)(s * 7919 % 65536) * 16; // 4 KiB .. 4 MiB of floats
        float *x, *y, *out;
        CK(cudaMalloc(&x, n * sizeof(float)));
        CK(cudaMalloc(&y, n * sizeof(float)));
        CK(cudaMalloc(&out, sizeof(float)));
        CK(cudaMemset(x, 0, n * sizeof(float)));
        CK(cudaMemset(y, 0, n * sizeof(float)));
        axpy<<<(unsigned)((n + 255) / 256), 256>>>(x, y, 2.0f, n);
        CK(cudaMemcpy(out, y + n - 1, sizeof(float), cudaMemcpyDeviceToDevice));
        float host = -1;
        CK(cudaMemcpy(&host, out, sizeof(float), cudaMemcpyDeviceToHost));
        if (host != 0.0f) {
            fprintf(stderr, "step %d: wrong result %f\n", s, host);
            return 1;
        }
        checksum += host;
        CK(cudaFree(out));
        CK(cudaFree(y));
        CK(cudaFree(x));
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("alloc_churn: %d steps, %d cudaMalloc+cudaFree pairs, %.3f s (%.1f us per step), results verified\n",
           steps, steps * 3, secs, secs * 1e6 / steps);
    return checksum == 0 ? 0 : 1;
}
