/* nccl_register: NCCL user-buffer registration of cudaMalloc memory, one
 * process driving two GPUs (ncclCommInitAll). On each device a small block
 * first (so the big one starts inside a mapped piece under the shim), then
 * a buffer of `MiB` MiB + 1028 floats (several pieces); each is registered
 * with ncclCommRegister, all-reduced (sum) in place and checked on the host
 * against the exact sum; the same again with the buffers not registered.
 * Built against the NCCL of the pip package nvidia-nccl-cu13 (run.sh finds
 * it); NCCL_NVLS_ENABLE=0 (NVLink SHARP off: not every GPU machine can set it up).
 *
 *   nccl_register [MiB]     (default 96)
 * Exit 0: the sums are right; 1: a CUDA or NCCL error; 3: a wrong sum. */
#include <nccl.h>
#include <vector>

#include "gpu_test.h"

#define NK(call)                                                                                   \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            printf("FAIL %s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #call, (int)r_,        \
                   ncclGetErrorString(r_));                                                        \
            exit(EXIT_CUDA_ERROR);                                                                 \
        }                                                                                          \
    } while (0)

__global__ void fill_rank(float *p, size_t n, int rank)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (float)((i % 1000) + 1000 * rank);
}

int main(int argc, char **argv)
{
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    if (count < 2) {
        printf("nccl_register: SKIP (needs 2 GPUs, %d)\n", count);
        return 0;
    }
    size_t mib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 96;
    const size_t n = mib * (1u << 20) / sizeof(float) + 1028;
    int devs[2] = {0, 1};
    ncclComm_t comm[2];
    NK(ncclCommInitAll(comm, 2, devs));
    void *small[2];
    float *buf[2];
    cudaStream_t stream[2];
    for (int r = 0; r < 2; r++) {
        CK(cudaSetDevice(r));
        CK(cudaMalloc(&small[r], 4096 + 256 * r));
        CK(cudaMalloc((void **)&buf[r], n * sizeof(float)));
        CK(cudaStreamCreate(&stream[r]));
    }
    int failures = 0;
    for (int registered = 1; registered >= 0; registered--) {
        void *handle[2] = {nullptr, nullptr};
        for (int r = 0; r < 2; r++) {
            CK(cudaSetDevice(r));
            fill_rank<<<1024, 256, 0, stream[r]>>>(buf[r], n, r);
            CK(cudaGetLastError());
            if (registered)
                NK(ncclCommRegister(comm[r], buf[r], n * sizeof(float), &handle[r]));
        }
        NK(ncclGroupStart());
        for (int r = 0; r < 2; r++)
            NK(ncclAllReduce(buf[r], buf[r], n, ncclFloat, ncclSum, comm[r], stream[r]));
        NK(ncclGroupEnd());
        for (int r = 0; r < 2; r++) {
            CK(cudaSetDevice(r));
            CK(cudaStreamSynchronize(stream[r]));
        }
        size_t wrong = 0;
        std::vector<float> host(n);
        for (int r = 0; r < 2; r++) {
            CK(cudaSetDevice(r));
            CK(cudaMemcpy(host.data(), buf[r], n * sizeof(float), cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < n; i++)
                wrong += host[i] != (float)(2 * (i % 1000) + 1000);
        }
        printf("nccl_register: all-reduce of %zu floats, buffers %s: %zu wrong elements\n", n,
               registered ? "registered" : "not registered", wrong);
        failures += wrong != 0;
        for (int r = 0; r < 2 && registered; r++)
            NK(ncclCommDeregister(comm[r], handle[r]));
    }
    for (int r = 0; r < 2; r++) {
        CK(cudaSetDevice(r));
        CK(cudaFree(buf[r]));
        CK(cudaFree(small[r]));
        CK(cudaStreamDestroy(stream[r]));
        ncclCommDestroy(comm[r]);
    }
    if (failures) {
        printf("nccl_register: CORRUPTION\n");
        return EXIT_CORRUPTION;
    }
    printf("nccl_register: OK\n");
    return 0;
}
