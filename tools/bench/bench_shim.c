/* CPU benchmark of the whole shim (make bench-shim): hooks, router,
 * registry, statistics and the default stack, over the fake CUDA of
 * tests/shim (host memory, no GPU). It is psbench's `pairs`, `random`,
 * `threads` and `threads_mixed` (tools/bench/psbench.cu) through the
 * runtime door of a shared-cudart program, minus the real driver: what the
 * shim itself costs per call and how that cost scales with threads, on any
 * machine. Run it under LD_PRELOAD=build/libpoolshim.so with the fake
 * libcudart/libcuda first on LD_LIBRARY_PATH (the make target does both),
 * and once without the preload for the fake runtime's own cost.
 *
 *   bench_shim [pairs] [random] [threads] [threads_mixed]     (default: all)
 *
 * 1. pairs: one thread, cudaMalloc+cudaFree of 256 B, 64 KiB, 1 MiB and
 *    16 MiB; batches of 2000 pairs, the median and the fastest batch in ns
 *    per pair.
 * 2. random: DESIGN.md's random workload (20,000 steps, srand(42), sizes
 *    1 + rand() % (4 << 20), at most 512 live), ns per step, median of 20.
 * 3. threads: 1, 2, 4, 8, 16 threads doing 256 B cudaMalloc/cudaFree pairs
 *    for 0.2 s each; ns per pair of all threads and the throughput as a
 *    multiple of one thread's.
 * 4. threads_mixed: the same with psbench's mixed sizes (256 B .. 1 MiB),
 *    every other pair stream-ordered on the thread's own non-blocking
 *    stream (cudaMallocAsync/cudaFreeAsync).
 * The fake driver's calls are cheap, so the shim's share is larger here
 * than on a GPU; no ratio can pass the number of online CPUs (printed). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../shim/cuda_abi.h"

/* The runtime entry points of the fake libcudart (the shim interposes them). */
extern cudaError_t cudaMalloc(void **p, size_t n);
extern cudaError_t cudaFree(void *p);
extern cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s);
extern cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
extern cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
extern cudaError_t cudaStreamDestroy(cudaStream_t s);
extern cudaError_t cudaSetDevice(int d);

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_shim: %s failed (%d)\n", what, (int)e);
        exit(1);
    }
}

/* ---- pairs ---- */
#define BATCH 2000
#define BATCHES 101
static void pairs(void)
{
    static const size_t sizes[] = {256, 64 << 10, 1 << 20, 16 << 20};
    static const char *const names[] = {"256 B", "64 KiB", "1 MiB", "16 MiB"};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        double ns[BATCHES];
        for (int b = 0; b < BATCHES; b++) {
            uint64_t t0 = now_ns();
            for (int i = 0; i < BATCH; i++) {
                void *p;
                check(cudaMalloc(&p, sizes[s]), "cudaMalloc");
                check(cudaFree(p), "cudaFree");
            }
            ns[b] = (double)(now_ns() - t0) / BATCH;
        }
        qsort(ns, BATCHES, sizeof ns[0], cmp_double);
        printf("pairs %-7s %8.1f ns per cudaMalloc+cudaFree pair (fastest batch %.1f)\n", names[s],
               ns[BATCHES / 2], ns[0]);
    }
}

/* ---- random ---- */
#define RANDOM_STEPS 20000
#define RANDOM_RUNS 21
static void random_workload(void)
{
    static void *live[512];
    double ns[RANDOM_RUNS];
    for (int r = 0; r < RANDOM_RUNS; r++) {
        srand(42);
        int count = 0;
        uint64_t t0 = now_ns();
        for (int step = 0; step < RANDOM_STEPS; step++) {
            if (count < 16 || (count < 512 && (rand() & 1))) {
                check(cudaMalloc(&live[count], 1 + (size_t)rand() % (4u << 20)), "cudaMalloc");
                count++;
            } else {
                int i = rand() % count;
                check(cudaFree(live[i]), "cudaFree");
                live[i] = live[--count];
            }
        }
        while (count)
            check(cudaFree(live[--count]), "cudaFree");
        ns[r] = (double)(now_ns() - t0) / RANDOM_STEPS;
    }
    qsort(ns, RANDOM_RUNS, sizeof ns[0], cmp_double);
    printf("random 20k steps %8.1f ns per step (fastest run %.1f)\n", ns[RANDOM_RUNS / 2], ns[0]);
}

/* ---- threads ---- */
static const size_t mixed_sizes[] = {256, 4096, 1024, 65536, 512, 16384, 2048, 300,
                                     8192, 40000, 768, 32768, 262144, 256, 1048576, 131072};
#define MIXED (sizeof mixed_sizes / sizeof mixed_sizes[0])

typedef struct run {
    int mixed;           /* 0: 256 B cudaMalloc pairs; 1: mixed sizes, every other pair stream-ordered */
    atomic_int ready;    /* threads warmed up */
    atomic_int go, stop; /* start and stop flags */
} run_t;

typedef struct worker {
    run_t *run;
    int index;           /* offset into the mixed sizes */
    long pairs;          /* pairs done */
    pthread_t id;
} worker_t;

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    run_t *run = w->run;
    check(cudaSetDevice(0), "cudaSetDevice");
    cudaStream_t stream = NULL;
    if (run->mixed)
        check(cudaStreamCreateWithFlags(&stream, 1 /* cudaStreamNonBlocking */), "cudaStreamCreateWithFlags");
    long done = 0;
    int started = 0;
    for (;;) {
        if (!started) {
            if (done >= 32) { /* warmed up: wait for the others */
                atomic_fetch_add(&run->ready, 1);
                while (!atomic_load(&run->go))
                    ;
                started = 1;
                done = 0;
            }
        } else if (atomic_load_explicit(&run->stop, memory_order_relaxed)) {
            break;
        }
        for (int k = 0; k < (int)MIXED; k++) {
            void *p;
            if (!run->mixed) {
                check(cudaMalloc(&p, 256), "cudaMalloc");
                check(cudaFree(p), "cudaFree");
            } else if (k & 1) {
                size_t size = mixed_sizes[(size_t)(k + w->index) % MIXED];
                check(cudaMallocAsync(&p, size, stream), "cudaMallocAsync");
                check(cudaFreeAsync(p, stream), "cudaFreeAsync");
            } else {
                size_t size = mixed_sizes[(size_t)(k + w->index) % MIXED];
                check(cudaMalloc(&p, size), "cudaMalloc");
                check(cudaFree(p), "cudaFree");
            }
        }
        done += MIXED;
    }
    w->pairs = done;
    if (stream)
        check(cudaStreamDestroy(stream), "cudaStreamDestroy");
    return NULL;
}

static void threads(int mixed)
{
    static const int counts[] = {1, 2, 4, 8, 16};
    double one = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        int n = counts[c];
        run_t run = {.mixed = mixed};
        worker_t w[16];
        for (int i = 0; i < n; i++) {
            w[i] = (worker_t){.run = &run, .index = i};
            pthread_create(&w[i].id, NULL, worker_main, &w[i]);
        }
        while (atomic_load(&run.ready) < n)
            usleep(100);
        uint64_t t0 = now_ns();
        atomic_store(&run.go, 1);
        usleep(200000);
        atomic_store(&run.stop, 1);
        uint64_t elapsed = now_ns() - t0;
        long total = 0;
        for (int i = 0; i < n; i++) {
            pthread_join(w[i].id, NULL);
            total += w[i].pairs;
        }
        double rate = (double)total * 1e9 / (double)elapsed;
        if (n == 1)
            one = rate;
        printf("%s %2d threads %8.1f ns per pair of all threads, %.1fx of one thread (%ld online CPUs)\n",
               mixed ? "threads_mixed" : "threads", n, 1e9 / rate, rate / one, cpus);
    }
}

int main(int argc, char **argv)
{
    int all = argc < 2;
    void *p;
    check(cudaMalloc(&p, 256), "first cudaMalloc"); /* lazy init of the runtime and the shim */
    check(cudaFree(p), "first cudaFree");
    for (int i = 1; i < argc || all; i++) {
        const char *what = all ? NULL : argv[i];
        if (all || !strcmp(what, "pairs"))
            pairs();
        if (all || !strcmp(what, "random"))
            random_workload();
        if (all || !strcmp(what, "threads"))
            threads(0);
        if (all || !strcmp(what, "threads_mixed"))
            threads(1);
        if (all)
            break;
    }
    return 0;
}
