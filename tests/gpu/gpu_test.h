/* Shared helpers of the GPU test programs (tests/gpu/*.cu).
 *
 * Every program checks its own data on the host and exits:
 *   0  everything verified,
 *   1  a CUDA call failed unexpectedly or the program is misused,
 *   3  data corruption was detected (hazard tests: the thing we guard against).
 * Messages start with the program's name; the last line says OK or FAIL.
 * Patterns are a cheap hash of (byte index, seed), so any foreign write or
 * stale read shows up as a mismatch. */
#ifndef POOLSHIM_GPU_TEST_H
#define POOLSHIM_GPU_TEST_H

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXIT_CUDA_ERROR 1
#define EXIT_CORRUPTION 3

/* Abort the test (exit 1) when a CUDA runtime call does not return success. */
#define CK(call)                                                              \
    do {                                                                      \
        cudaError_t ck_status_ = (call);                                      \
        if (ck_status_ != cudaSuccess) {                                      \
            fprintf(stderr, "FAIL %s:%d: %s returned %d (%s)\n", __FILE__,   \
                    __LINE__, #call, (int)ck_status_,                         \
                    cudaGetErrorName(ck_status_));                            \
            exit(EXIT_CUDA_ERROR);                                            \
        }                                                                     \
    } while (0)

#ifdef __cuda_cuda_h__
/* The same for a driver API call, and the descriptors of the virtual memory
 * API (programs that include <cuda.h> first). */
#define CU_CK(call)                                                           \
    do {                                                                      \
        CUresult ck_result_ = (call);                                         \
        if (ck_result_ != CUDA_SUCCESS) {                                     \
            fprintf(stderr, "FAIL %s:%d: %s returned %d\n", __FILE__,         \
                    __LINE__, #call, (int)ck_result_);                        \
            exit(EXIT_CUDA_ERROR);                                            \
        }                                                                     \
    } while (0)

/* Pinned physical memory on device `device`, as cuMemCreate takes it. */
static inline CUmemAllocationProp gpu_test_device_memory(int device)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

/* Read-write access for device `device`, as cuMemSetAccess takes it. */
static inline CUmemAccessDesc gpu_test_device_access(int device)
{
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return access;
}
#endif

/* Abort the test (exit 1) when a condition about behaviour does not hold. */
#define EXPECT(cond, ...)                                                     \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "FAIL %s:%d: expected %s: ", __FILE__, __LINE__,  \
                    #cond);                                                   \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            exit(EXIT_CUDA_ERROR);                                            \
        }                                                                     \
    } while (0)

/* The byte every pattern puts at index i for a seed (host and device agree). */
__host__ __device__ static inline uint8_t pattern_byte(size_t i, uint32_t seed)
{
    uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) ^ seed * 40503u;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    return (uint8_t)(x ^ (x >> 8) ^ (x >> 16));
}

/* Writes the pattern of seed into bytes [0, n) of p (grid-stride loop). */
__global__ void fill_pattern_kernel(uint8_t *p, size_t n, uint32_t seed)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = pattern_byte(i, seed);
}

/* Adds to *mismatches the number of bytes of p that differ from the pattern. */
__global__ void count_mismatches_kernel(const uint8_t *p, size_t n, uint32_t seed,
                                        unsigned long long *mismatches)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned long long bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        bad += p[i] != pattern_byte(i, seed);
    if (bad)
        atomicAdd(mismatches, bad);
}

/* Blocks for a grid-stride kernel over n elements (at most 1024). */
static inline unsigned blocks_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 1024 ? 1024 : b);
}

static inline void fill_pattern(void *p, size_t n, uint32_t seed, cudaStream_t stream)
{
    fill_pattern_kernel<<<blocks_for(n), 256, 0, stream>>>((uint8_t *)p, n, seed);
    CK(cudaGetLastError());
}

static inline void count_mismatches(const void *p, size_t n, uint32_t seed,
                                    unsigned long long *mismatches, cudaStream_t stream)
{
    count_mismatches_kernel<<<blocks_for(n), 256, 0, stream>>>((const uint8_t *)p, n,
                                                               seed, mismatches);
    CK(cudaGetLastError());
}

/* Copies up to `window` bytes from the start and the end of p to the host and
 * compares them with the pattern; returns the number of differing bytes. */
static inline size_t host_verify_ends(const void *p, size_t n, uint32_t seed, size_t window)
{
    size_t head = n < window ? n : window;
    size_t tail_start = n > window ? n - window : 0;
    if (tail_start < head)
        tail_start = head;
    uint8_t *host = (uint8_t *)malloc(window > 0 ? window : 1);
    size_t bad = 0;
    CK(cudaMemcpy(host, p, head, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < head; i++)
        bad += host[i] != pattern_byte(i, seed);
    if (tail_start < n) {
        CK(cudaMemcpy(host, (const uint8_t *)p + tail_start, n - tail_start,
                      cudaMemcpyDeviceToHost));
        for (size_t i = tail_start; i < n; i++)
            bad += host[i - tail_start] != pattern_byte(i, seed);
    }
    free(host);
    return bad;
}

/* Line-buffered stdout, so a crash still leaves every finished step's line
 * in the log (output to a file is otherwise block-buffered). */
__attribute__((unused)) static int stdout_line_buffered = setvbuf(stdout, NULL, _IOLBF, 0);

/* Nanoseconds of the monotonic host clock. */
static inline double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* 1 when libpoolshim.so is preloaded and interposing, else 0. */
static inline int poolshim_is_active(void)
{
    int (*active)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "poolshim_active");
    return active ? active() : 0;
}

/* Device-side wall clock (ns), for kernels that must run a given time. */
__device__ static inline unsigned long long device_clock_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Spins the calling thread for about `ns` nanoseconds. */
__device__ static inline void spin_for_ns(unsigned long long ns)
{
    unsigned long long start = device_clock_ns();
    while (device_clock_ns() - start < ns) {
    }
}

#endif
