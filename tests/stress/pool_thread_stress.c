/* Eight threads allocate and free at random on one pool (cudaMalloc-style
 * and stream-ordered calls, real host memory), each writing its tag into
 * the blocks it owns and checking it at free; then ps_pool_check and a
 * full trim. A plain program, not a Criterion test, because Criterion
 * cannot start under ThreadSanitizer (Snaipe/Criterion#274): run it with
 * `make pool-thread-stress` (builds with SANITIZE=thread). Exit 0 = clean. */
#include "../../tools/sim/fake_gpu.h"
#include "../../core/pool.h"
#include "../../core/upstream.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 8
#define SLOTS 32

typedef struct worker {
    ps_resource_t *pool; /* shared pool */
    unsigned seed;       /* rand_r state */
    uint64_t tag;        /* written into every block this thread owns */
    int failures;        /* corrupted blocks or failed calls */
} worker_t;

static void *run_worker(void *arg)
{
    worker_t *w = arg;
    void *live[SLOTS] = {0};
    size_t sizes[SLOTS] = {0};
    ps_stream_t stream = (ps_stream_t)(0x10000 + w->tag * 0x100);
    uint64_t end = ps_now_ns() + 1000000000ull;
    while (ps_now_ns() < end) {
        for (int i = 0; i < 64; i++) {
            int slot = rand_r(&w->seed) % SLOTS;
            ps_stream_t s = (slot & 1) ? stream : PS_STREAM_NONE;
            if (live[slot]) {
                uint64_t *words = live[slot];
                if (words[0] != w->tag || words[sizes[slot] / 8 - 1] != w->tag)
                    w->failures++;
                if (ps_deallocate(w->pool, live[slot], sizes[slot], s) != PS_OK)
                    w->failures++;
                live[slot] = NULL;
            } else {
                sizes[slot] = 8 * (1 + (size_t)rand_r(&w->seed) % 8192);
                if (ps_allocate(w->pool, sizes[slot], s, &live[slot]) != PS_OK) {
                    w->failures++;
                    continue;
                }
                uint64_t *words = live[slot];
                words[0] = words[sizes[slot] / 8 - 1] = w->tag;
            }
        }
    }
    for (int slot = 0; slot < SLOTS; slot++)
        if (live[slot])
            ps_deallocate(w->pool, live[slot], sizes[slot], (slot & 1) ? stream : PS_STREAM_NONE);
    return NULL;
}

int main(void)
{
    ps_gpu_ops_t *gpu;
    ps_resource_t *upstream, *pool;
    ps_fake_gpu_options_t host = {.backed = 1, .auto_complete = 1};
    ps_pool_options_t options;
    ps_pool_options_default(&options);
    options.min_chunk = 2 * PS_MiB;
    if (ps_fake_gpu_create(&host, &gpu) != PS_OK || ps_cuda_resource_create("cuda", gpu, &upstream) != PS_OK ||
        ps_pool_create("stress", upstream, gpu, &options, &pool) != PS_OK) {
        fprintf(stderr, "pool_thread_stress: setup failed\n");
        return 1;
    }
    pthread_t threads[THREADS];
    worker_t workers[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (worker_t){pool, 1234u + (unsigned)i, (uint64_t)i + 1, 0};
        pthread_create(&threads[i], NULL, run_worker, &workers[i]);
    }
    int failures = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        failures += workers[i].failures;
    }
    int check = ps_pool_check(pool);
    ps_trim(pool);
    uint64_t left = ps_fake_gpu_bytes_outstanding(gpu);
    ps_destroy(pool);
    ps_destroy(upstream);
    ps_fake_gpu_destroy(gpu);
    printf("pool_thread_stress: %d failures, check %s, %llu bytes left after trim\n", failures,
           check == PS_OK ? "ok" : "FAILED", (unsigned long long)left);
    return failures || check != PS_OK || left ? 1 : 0;
}
