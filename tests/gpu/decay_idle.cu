/* decay_idle: a program that takes most of the card, frees everything and
 * idles must hold no more than natively once the decay time has passed
 * (global.decay_ms): what the GPU holds for this process is read from NVML
 * (nvmlDeviceGetComputeRunningProcesses, dlopen'd), not from
 * cudaMemGetInfo, which the shim answers.
 *   decay_idle [WAIT_MS]   (default 8000: the 5000 ms default decay and its ticks)
 * 1. cudaFree(0); the process's NVML usage is the baseline (context).
 * 2. cudaMalloc 80% of the free memory in 64 MiB blocks; a kernel writes
 *    the first and last; all freed; no synchronize, no further CUDA call.
 * 3. Polls NVML every 100 ms for up to WAIT_MS; passes once the usage is
 *    at most baseline + 2 MiB, and prints how long that took.
 * Natively the memory is back at once. Under the shim with the decay off
 * (POOLSHIM_DECAY_MS=0) it stays in the pool: the expected failure that
 * shows the test can fail. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unistd.h>
#include <vector>

typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId, computeInstanceId;
} nvml_process_t;
typedef int (*nvml_init_t)(void);
typedef int (*nvml_handle_t)(unsigned, void **);
typedef int (*nvml_procs_t)(void *, unsigned *, nvml_process_t *);

static nvml_procs_t procs;
static void *nvml_dev;

static long long used_by_me()
{
    nvml_process_t list[256];
    unsigned n = 256;
    if (procs(nvml_dev, &n, list) != 0)
        return -1;
    for (unsigned i = 0; i < n; i++)
        if (list[i].pid == (unsigned)getpid())
            return (long long)list[i].usedGpuMemory;
    return 0;
}

static double now_ms()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

__global__ void touch(char *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = 1;
}

int main(int argc, char **argv)
{
    long wait_ms = argc > 1 ? atol(argv[1]) : 8000;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    nvml_init_t init = lib ? (nvml_init_t)dlsym(lib, "nvmlInit_v2") : nullptr;
    nvml_handle_t handle = lib ? (nvml_handle_t)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2") : nullptr;
    procs = lib ? (nvml_procs_t)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3") : nullptr;
    if (!init || !handle || !procs || init() != 0) {
        printf("decay_idle: SKIP (no NVML)\n");
        return 0;
    }
    cudaFree(0);
    int dev = 0;
    cudaGetDevice(&dev);
    if (handle((unsigned)dev, &nvml_dev) != 0) { /* (ordinal = NVML index without CUDA_VISIBLE_DEVICES) */
        printf("decay_idle: SKIP (no NVML handle)\n");
        return 0;
    }
    long long base = used_by_me();
    size_t free_b, total_b;
    cudaMemGetInfo(&free_b, &total_b);
    const size_t block = 64ull << 20;
    std::vector<void *> blocks;
    for (size_t n = free_b / 10 * 8 / block; blocks.size() < n;) {
        void *p;
        if (cudaMalloc(&p, block) != cudaSuccess) {
            printf("decay_idle: FAIL cudaMalloc %zu of %zu\n", blocks.size(), n);
            return 1;
        }
        blocks.push_back(p);
    }
    touch<<<256, 256>>>((char *)blocks.front(), block);
    touch<<<256, 256>>>((char *)blocks.back(), block);
    for (void *p : blocks)
        cudaFree(p);
    long long held = used_by_me();
    double t0 = now_ms();
    long long now = held;
    while (now_ms() - t0 < wait_ms) {
        now = used_by_me();
        if (now >= 0 && now <= base + (2ll << 20))
            break;
        usleep(100000);
    }
    double took = now_ms() - t0;
    printf("decay_idle: %zu x 64 MiB freed; NVML: baseline %lld MiB, right after the frees %lld MiB, after %.0f ms "
           "%lld MiB\n",
           blocks.size(), base >> 20, held >> 20, took, now >> 20);
    if (now < 0 || now > base + (2ll << 20)) {
        printf("decay_idle: FAIL the process still holds %lld MiB more than its baseline after %ld ms\n",
               (now - base) >> 20, wait_ms);
        return 1;
    }
    printf("decay_idle: PASS\n");
    return 0;
}
