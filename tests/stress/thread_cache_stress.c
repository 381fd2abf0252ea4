/* The thread caches under contention (core/thread_cache.c): 16 threads at
 * a time allocate and free at random on one pool with a small thread cache
 * (cudaMalloc-style and stream-ordered calls, real host memory, each thread
 * writing its tag into the blocks it owns and checking it at free: a block
 * handed to two threads at once shows as a wrong tag). Workers are short
 * lived: each generation ends (its thread's exit gives its caches back)
 * and destroys its stream (the pool drains every cache), while a trimmer
 * thread trims the pool (drains again) and the others keep running.
 * Afterwards ps_pool_check, a full trim, nothing outstanding.
 * A plain program (Criterion cannot start under ThreadSanitizer): run it
 * with `make test-stress SANITIZE=thread` (part of make test-all). Exit 0 = clean. */
#include "../../tools/sim/fake_gpu.h"
#include "../../core/pool.h"
#include "../../core/upstream.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 16      /* workers alive at once */
#define GENERATIONS 6   /* worker threads started per slot, one after another */
#define SLOTS 24        /* live blocks per worker */
#define STEPS 20000     /* allocate-or-free steps per worker */

typedef struct worker {
    ps_resource_t *pool; /* shared pool */
    unsigned seed;       /* rand_r state */
    uint64_t tag;        /* written into every block this thread owns */
    int failures;        /* corrupted blocks or failed calls */
} worker_t;

static atomic_int running = 1; /* the trimmer runs while workers do */

static void *run_worker(void *arg)
{
    worker_t *w = arg;
    void *live[SLOTS] = {0};
    size_t sizes[SLOTS] = {0};
    ps_stream_t stream = (ps_stream_t)(0x100000 + w->tag * 0x100);
    for (int step = 0; step < STEPS; step++) {
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
            /* a few sizes (cache hits) and some odd ones (bins change size) */
            sizes[slot] = (rand_r(&w->seed) & 3) ? (size_t)256 << (rand_r(&w->seed) % 8)
                                                 : 8 * (1 + (size_t)rand_r(&w->seed) % 8192);
            if (ps_allocate(w->pool, sizes[slot], s, &live[slot]) != PS_OK) {
                w->failures++;
                continue;
            }
            uint64_t *words = live[slot];
            words[0] = words[sizes[slot] / 8 - 1] = w->tag;
        }
    }
    for (int slot = 0; slot < SLOTS; slot++)
        if (live[slot] && ps_deallocate(w->pool, live[slot], sizes[slot], (slot & 1) ? stream : PS_STREAM_NONE))
            w->failures++;
    ps_stream_destroyed(w->pool, stream); /* the program destroys its stream: every cache is drained */
    return NULL;                          /* the thread's exit gives its caches back */
}

static void *run_trimmer(void *arg)
{
    ps_resource_t *pool = arg;
    while (atomic_load(&running)) {
        ps_trim(pool);
        ps_resource_info_t info = {0};
        ps_query(pool, &info); /* walks every cache under the locks */
        for (volatile int spin = 0; spin < 20000; spin++)
            ;
    }
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
    options.thread_cache = 256 * PS_KiB; /* small: evictions and the cap happen often */
    if (ps_fake_gpu_create(&host, &gpu) != PS_OK || ps_cuda_resource_create("cuda", gpu, &upstream) != PS_OK ||
        ps_pool_create("stress", upstream, gpu, &options, &pool) != PS_OK) {
        fprintf(stderr, "thread_cache_stress: setup failed\n");
        return 1;
    }
    pthread_t trimmer;
    pthread_create(&trimmer, NULL, run_trimmer, pool);
    pthread_t threads[THREADS];
    worker_t workers[THREADS][GENERATIONS];
    int failures = 0;
    for (int g = 0; g < GENERATIONS; g++) {
        for (int i = 0; i < THREADS; i++) {
            workers[i][g] = (worker_t){pool, 77u * (unsigned)g + (unsigned)i, (uint64_t)(g * THREADS + i) + 1, 0};
            pthread_create(&threads[i], NULL, run_worker, &workers[i][g]);
        }
        for (int i = 0; i < THREADS; i++) {
            pthread_join(threads[i], NULL);
            failures += workers[i][g].failures;
        }
    }
    atomic_store(&running, 0);
    pthread_join(trimmer, NULL);
    uint64_t cached = ps_pool_thread_cache_bytes(pool);
    int check = ps_pool_check(pool);
    ps_trim(pool);
    ps_resource_info_t info = {0};
    ps_query(pool, &info);
    uint64_t left = ps_fake_gpu_bytes_outstanding(gpu);
    ps_destroy(pool);
    ps_destroy(upstream);
    ps_fake_gpu_destroy(gpu);
    printf("thread_cache_stress: %d failures, %llu bytes still cached after every thread exited, check %s, "
           "%llu bytes in use, %llu bytes left after trim\n",
           failures, (unsigned long long)cached, check == PS_OK ? "ok" : "FAILED",
           (unsigned long long)info.bytes_in_use, (unsigned long long)left);
    return failures || cached || check != PS_OK || info.bytes_in_use || left ? 1 : 0;
}
