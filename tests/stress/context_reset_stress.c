/* Context resets racing with allocations, under the shim and the fake CUDA
 * of tests/shim (built with TSan by `make test-all`; Criterion cannot run
 * under TSan). The program re-executes itself with LD_PRELOAD=libpoolshim.so.
 *   - 3 threads allocate on device 1, fill and check their blocks: a reset
 *     of device 0 must not disturb them (exit 1 on any failure);
 *   - 1 thread allocates and frees on device 0 while the main thread resets
 *     device 0 again and again: that race is the program's, so errors are
 *     allowed there, but no crash, no data race in the shim, and never a
 *     call on an object of a destroyed context (the fake driver counts them);
 *   - 1 thread reads the statistics (poolshim_stats_json, as a program's
 *     loop would between steps) all the while: each read is one whole JSON
 *     object, whatever the resets and allocations do meanwhile.
 * It runs twice, in children: over chunked pools, then over virtual memory
 * (FAKE_CUDA_VMM=1), which every reset unmaps and releases. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../shim/prog_common.h"

extern cudaError_t cudaMalloc(void **, size_t);
extern cudaError_t cudaFree(void *);
extern cudaError_t cudaSetDevice(int);
extern cudaError_t cudaDeviceReset(void);

static atomic_int stop;
static atomic_int other_device_failures;

static void *other_device(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    if (cudaSetDevice(1) != cudaSuccess)
        atomic_fetch_add(&other_device_failures, 1);
    while (!atomic_load(&stop)) {
        void *p;
        size_t n = 1 + rand_r(&seed) % 50000;
        if (cudaMalloc(&p, n) != cudaSuccess) {
            atomic_fetch_add(&other_device_failures, 1);
            continue;
        }
        fill(p, n, seed);
        if (!intact(p, n, seed) || cudaFree(p) != cudaSuccess)
            atomic_fetch_add(&other_device_failures, 1);
    }
    return NULL;
}

static void *same_device(void *arg)
{
    (void)arg;
    cudaSetDevice(0);
    while (!atomic_load(&stop)) {
        void *p;
        if (cudaMalloc(&p, 4096) == cudaSuccess)
            cudaFree(p); /* memory never touched: it may belong to a context being reset */
    }
    return NULL;
}

static atomic_int reports, bad_reports;

static void *reporter(void *arg)
{
    (void)arg;
    long (*get)(char *, size_t) = (long (*)(char *, size_t))dlsym(RTLD_DEFAULT, "poolshim_stats_json");
    static char text[1 << 16];
    while (!atomic_load(&stop)) {
        long length = get ? get(text, sizeof text) : -1;
        if (length <= 0 || (size_t)length >= sizeof text || strlen(text) != (size_t)length || text[0] != '{' ||
            text[length - 1] != '}' || !strstr(text, "\"devices\": ["))
            atomic_fetch_add(&bad_reports, 1);
        atomic_fetch_add(&reports, 1);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!dlsym(RTLD_DEFAULT, "poolshim_active")) {
        setenv("LD_PRELOAD", PS_BUILD_DIR "/libpoolshim.so", 1);
        setenv("LD_LIBRARY_PATH", PS_BUILD_DIR "/fake", 1); /* the fake libcuda.so.1, dlopened by the fake runtime */
        /* every event and stream call sleeps first: a reset lands inside the
         * shim's barrier often (without the gate of shim/gpu_ops_cuda.c,
         * 10., nearly every run saw a call on a destroyed context) */
        setenv("FAKE_CUDA_OBJECT_DELAY_US", "100", 0);
        /* twice: chunked pools, then pools over virtual memory, which each
         * reset gives back (ps_gpu_ops_cuda_release_vm) */
        int failed = 0;
        for (int vmm = 0; vmm < 2; vmm++) {
            setenv("FAKE_CUDA_VMM", vmm ? "1" : "0", 1);
            pid_t child = fork();
            if (child == 0) {
                execv("/proc/self/exe", argv);
                perror("execv");
                _exit(1);
            }
            int status = 0;
            if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "context_reset_stress: the run with FAKE_CUDA_VMM=%d failed\n", vmm);
                failed = 1;
            }
        }
        return failed;
    }
    if (!shim_active()) {
        fprintf(stderr, "context_reset_stress: the shim is not active\n");
        return 1;
    }
    pthread_t t[5];
    for (uintptr_t i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, other_device, (void *)(i + 1));
    pthread_create(&t[3], NULL, same_device, NULL);
    pthread_create(&t[4], NULL, reporter, NULL);
    cudaSetDevice(0);
    for (int round = 0; round < 300; round++) {
        void *p;
        if (cudaMalloc(&p, 1000) == cudaSuccess)
            cudaFree(p);
        if (cudaDeviceReset() != cudaSuccess)
            failures++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 5; i++)
        pthread_join(t[i], NULL);
    CHECK(atomic_load(&reports) > 0 && atomic_load(&bad_reports) == 0, "%d of %d statistics reads were not one object",
          atomic_load(&bad_reports), atomic_load(&reports));
    CHECK(atomic_load(&other_device_failures) == 0, "%d failures on device 1", atomic_load(&other_device_failures));
    CHECK(fake()->dead_calls == 0, "%lu calls on objects of a destroyed context", fake()->dead_calls);
    return finish("context_reset_stress");
}
