/* CPU micro-benchmark of the core pool (make bench-core).
 *
 * 1. Hot path: median ns per allocate+free pair of one size (256 B, 1 MiB,
 *    256 MiB) on a simulated upstream, for free_sync none, free_sync event
 *    (fences auto-complete, as on an idle GPU) and a stream-ordered pair.
 * 2. DESIGN.md's random workload: 20,000 steps, srand(42); allocate
 *    1 + rand() % (4 << 20) bytes when fewer than 16 are live or (fewer
 *    than 512 and rand() & 1), else free a random live one; then free the
 *    rest. ns per operation (allocations + frees), median of 50 runs.
 */
#include "../../core/host_ops.h"
#include "../../core/pool.h"
#include "../../core/upstream.h"

#include <stdio.h>
#include <stdlib.h>

#define ROUNDS 51           /* timed rounds per measurement (median taken) */
#define PAIRS_PER_ROUND 20000 /* allocate+free pairs in one round */
#define RANDOM_RUNS 50      /* runs of the random workload */

typedef struct bench_stack {
    ps_gpu_ops_t *gpu;       /* simulated device */
    ps_resource_t *upstream; /* cuda upstream over it */
    ps_resource_t *pool;     /* the pool measured */
} bench_stack_t;

static void die(const char *what, int status)
{
    fprintf(stderr, "bench_core: %s: %s\n", what, ps_status_name(status));
    exit(1);
}

static void stack_open(bench_stack_t *s, ps_free_sync_t policy)
{
    ps_host_ops_options_t host = {.capacity = 0, .backed = 0, .auto_complete = 1};
    int status = ps_host_ops_create(&host, &s->gpu);
    if (status == PS_OK)
        status = ps_cuda_resource_create("cuda", s->gpu, &s->upstream);
    ps_pool_options_t o;
    ps_pool_options_default(&o);
    o.free_sync = policy;
    if (status == PS_OK)
        status = ps_pool_create("bench", s->upstream, s->gpu, &o, &s->pool);
    if (status != PS_OK)
        die("create", status);
}

static void stack_close(bench_stack_t *s)
{
    ps_destroy(s->pool);
    ps_destroy(s->upstream);
    ps_host_ops_destroy(s->gpu);
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *values, int count)
{
    qsort(values, (size_t)count, sizeof *values, compare_double);
    return values[count / 2];
}

/* Median ns per pair; *best gets the fastest round (noise shows as a gap). */
static double hot_pair_ns(ps_free_sync_t policy, size_t size, ps_stream_t stream, double *best)
{
    bench_stack_t s;
    stack_open(&s, policy);
    double per_round[ROUNDS];
    void *p;
    for (int i = 0; i < 1000; i++) { /* warm up: the pool grows once */
        int status = ps_allocate(s.pool, size, stream, &p);
        if (status != PS_OK)
            die("allocate", status);
        ps_deallocate(s.pool, p, size, stream);
    }
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t start = ps_now_ns();
        for (int i = 0; i < PAIRS_PER_ROUND; i++) {
            if (ps_allocate(s.pool, size, stream, &p) != PS_OK)
                die("allocate", PS_ENOMEM);
            ps_deallocate(s.pool, p, size, stream);
        }
        per_round[round] = (double)(ps_now_ns() - start) / PAIRS_PER_ROUND;
    }
    stack_close(&s);
    double result = median(per_round, ROUNDS);
    *best = per_round[0]; /* sorted by median() */
    return result;
}

/* One run of the random workload; returns ns per operation. */
static double random_workload_ns(ps_resource_t *pool)
{
    static void *live[512];
    static size_t sizes[512];
    int count = 0;
    long operations = 0;
    srand(42);
    uint64_t start = ps_now_ns();
    for (int step = 0; step < 20000; step++) {
        if (count < 16 || (count < 512 && (rand() & 1))) {
            size_t size = 1 + (size_t)rand() % (4 << 20);
            int status = ps_allocate(pool, size, PS_STREAM_NONE, &live[count]);
            if (status != PS_OK)
                die("allocate", status);
            sizes[count++] = size;
        } else {
            int i = rand() % count;
            ps_deallocate(pool, live[i], sizes[i], PS_STREAM_NONE);
            live[i] = live[--count];
            sizes[i] = sizes[count];
        }
        operations++;
    }
    while (count) {
        count--;
        ps_deallocate(pool, live[count], sizes[count], PS_STREAM_NONE);
        operations++;
    }
    return (double)(ps_now_ns() - start) / (double)operations;
}

static void random_row(const char *name, ps_free_sync_t policy)
{
    bench_stack_t s;
    stack_open(&s, policy);
    double runs[RANDOM_RUNS];
    double cold = random_workload_ns(s.pool);
    for (int i = 0; i < RANDOM_RUNS; i++)
        runs[i] = random_workload_ns(s.pool);
    ps_resource_info_t info = {0};
    ps_query(s.pool, &info);
    printf("random 20k ops, %-6s %8.1f ns/op median of %d (first run %.1f); peak reserved %llu MiB, %llu chunks\n",
           name, median(runs, RANDOM_RUNS), RANDOM_RUNS, cold,
           (unsigned long long)(info.peak_bytes_reserved >> 20), (unsigned long long)info.upstream_allocs);
    stack_close(&s);
}

int main(void)
{
    static const size_t sizes[] = {256, PS_MiB, 256 * PS_MiB};
    static const char *const size_names[] = {"256 B", "1 MiB", "256 MiB"};
    printf("poolshim core pool, simulated upstream, one thread;\n"
           "median ns per allocate+free pair of %d rounds (fastest round)\n", ROUNDS);
    printf("%-8s %22s %22s %22s\n", "size", "free_sync none", "free_sync event", "stream-ordered");
    for (int i = 0; i < 3; i++) {
        double best_none, best_event, best_stream;
        double none = hot_pair_ns(PS_FREE_SYNC_NONE, sizes[i], PS_STREAM_NONE, &best_none);
        double event = hot_pair_ns(PS_FREE_SYNC_EVENT, sizes[i], PS_STREAM_NONE, &best_event);
        double stream = hot_pair_ns(PS_FREE_SYNC_EVENT, sizes[i], (ps_stream_t)0x100, &best_stream);
        printf("%-8s %10.1f ns (%6.1f) %10.1f ns (%6.1f) %10.1f ns (%6.1f)\n", size_names[i], none, best_none,
               event, best_event, stream, best_stream);
    }
    random_row("none", PS_FREE_SYNC_NONE);
    random_row("event", PS_FREE_SYNC_EVENT);
    return 0;
}
