/* CPU micro-benchmark of the core pool (make bench-core).
 *
 * 1. Hot path: median ns per allocate+free pair of one size (256 B, 1 MiB,
 *    256 MiB) on a simulated upstream, for the default pool (free_sync
 *    barrier, thread cache on), the same without its thread cache
 *    (thread_cache 0), free_sync none, free_sync event (fences
 *    auto-complete, as on an idle GPU), and a stream-ordered pair on the
 *    default pool with and without the thread cache.
 * 2. DESIGN.md's random workload: 20,000 steps, srand(42); allocate
 *    1 + rand() % (4 << 20) bytes when fewer than 16 are live or (fewer
 *    than 512 and rand() & 1), else free a random live one; then free the
 *    rest. ns per operation (allocations + frees), median of 50 runs.
 * 3. Thread scaling, for the default stack (a pool with default options:
 *    free_sync barrier, thread cache on, expandable over a fake device with
 *    virtual memory, as on a real GPU), the same pool without its thread
 *    cache, and the arena (default options): N threads (1, 2, 4, 8, 16)
 *    each do SCALING_PAIRS allocate+free pairs of mixed sizes (256 B ..
 *    1 MiB), once with PS_STREAM_NONE (cudaMalloc style) and once each
 *    thread on its own fake stream handle (stream ordered). Aggregate pairs per second of N threads over one thread's,
 *    median of SCALING_REPEATS runs; ns per pair for one thread. Scaling
 *    cannot show above the number of online CPUs, printed beside.
 * Arguments pick sections (`bench_core scaling`; default all three);
 * BENCH_CORE_ROWS (a substring of a scaling row's name) and
 * BENCH_CORE_REPEATS (fewer runs per thread count) shorten the scaling part.
 */
#include "../sim/fake_gpu.h"
#include "../../core/pool.h"
#include "../../core/upstream.h"

#include "../../core/arena.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROUNDS 51           /* timed rounds per measurement (median taken) */
#define PAIRS_PER_ROUND 20000 /* allocate+free pairs in one round */
#define RANDOM_RUNS 50      /* runs of the random workload */
#define SCALING_PAIRS 300000 /* allocate+free pairs per thread in one scaling run */
#define SCALING_REPEATS 7   /* scaling runs per thread count (median taken; BENCH_CORE_REPEATS lowers it) */
#define SCALING_MAX_THREADS 16 /* largest thread count measured */

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

static void stack_open(bench_stack_t *s, ps_free_sync_t policy, int thread_cache)
{
    ps_fake_gpu_options_t host = {.capacity = 0, .backed = 0, .auto_complete = 1};
    int status = ps_fake_gpu_create(&host, &s->gpu);
    if (status == PS_OK)
        status = ps_cuda_resource_create("cuda", s->gpu, &s->upstream);
    ps_pool_options_t o;
    ps_pool_options_default(&o);
    o.free_sync = policy;
    if (!thread_cache)
        o.thread_cache = 0;
    if (status == PS_OK)
        status = ps_pool_create("bench", s->upstream, s->gpu, &o, &s->pool);
    if (status != PS_OK)
        die("create", status);
}

static void stack_close(bench_stack_t *s)
{
    ps_destroy(s->pool);
    ps_destroy(s->upstream);
    ps_fake_gpu_destroy(s->gpu);
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
static double hot_pair_ns(ps_free_sync_t policy, int thread_cache, size_t size, ps_stream_t stream,
                          double *best)
{
    bench_stack_t s;
    stack_open(&s, policy, thread_cache);
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

static void random_row(const char *name, ps_free_sync_t policy, int thread_cache)
{
    bench_stack_t s;
    stack_open(&s, policy, thread_cache);
    double runs[RANDOM_RUNS];
    double cold = random_workload_ns(s.pool);
    for (int i = 0; i < RANDOM_RUNS; i++)
        runs[i] = random_workload_ns(s.pool);
    ps_resource_info_t info = {0};
    ps_query(s.pool, &info);
    printf("random 20k ops, %-17s %8.1f ns/op median of %d (first run %.1f); peak reserved %llu MiB, %llu chunks\n",
           name, median(runs, RANDOM_RUNS), RANDOM_RUNS, cold,
           (unsigned long long)(info.peak_bytes_reserved >> 20), (unsigned long long)info.upstream_allocs);
    stack_close(&s);
}

static void hot_section(void);

/* ---- Thread scaling ---- */

/* Mixed sizes (256 B .. 1 MiB, the small ones most often, as tensors of a
 * training step), each thread walking them from its own offset. */
static const size_t mixed_sizes[] = {256, 4096, 1024, 65536, 512, 16384, 2048, 300, 8192, 40000, 768, 32768,
                                     262144, 256, 1048576, 131072};
#define MIXED_SIZES (sizeof mixed_sizes / sizeof mixed_sizes[0])

typedef struct scaling_run {
    ps_resource_t *resource;     /* the allocator measured */
    int stream_ordered;          /* 1: each thread on its own stream; 0: PS_STREAM_NONE */
    pthread_barrier_t start;     /* releases every thread at once (each then reads the clock) */
} scaling_run_t;

typedef struct scaling_thread {
    scaling_run_t *run;          /* what this thread measures */
    int index;                   /* 0..threads-1: size offset and stream handle */
    pthread_t id;                /* its pthread */
    uint64_t start_ns, end_ns;   /* when its first pair began and its last ended */
} scaling_thread_t;

static void *scaling_worker(void *arg)
{
    scaling_thread_t *t = arg;
    ps_resource_t *r = t->run->resource;
    ps_stream_t stream = t->run->stream_ordered ? (ps_stream_t)(0x1000 + 0x100 * (uintptr_t)t->index)
                                                : PS_STREAM_NONE;
    pthread_barrier_wait(&t->run->start);
    t->start_ns = ps_now_ns();
    for (int i = 0; i < SCALING_PAIRS; i++) {
        size_t size = mixed_sizes[(size_t)(i + t->index) % MIXED_SIZES];
        void *p;
        int status = ps_allocate(r, size, stream, &p);
        if (status != PS_OK)
            die("allocate", status);
        ps_deallocate(r, p, size, stream);
    }
    t->end_ns = ps_now_ns();
    return NULL;
}

/* One run of `threads` threads; returns aggregate pairs per second, over
 * the span from the first thread's start to the last one's end (each
 * thread reads the clock itself: the releasing thread may be descheduled
 * after the barrier while the workers already run). */
static double scaling_run_pairs_per_s(ps_resource_t *resource, int stream_ordered, int threads)
{
    scaling_run_t run = {.resource = resource, .stream_ordered = stream_ordered};
    scaling_thread_t t[SCALING_MAX_THREADS];
    pthread_barrier_init(&run.start, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        t[i] = (scaling_thread_t){.run = &run, .index = i};
        if (pthread_create(&t[i].id, NULL, scaling_worker, &t[i]) != 0)
            die("pthread_create", PS_ENOMEM);
    }
    pthread_barrier_wait(&run.start);
    uint64_t first_start = UINT64_MAX, last_end = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i].id, NULL);
        first_start = t[i].start_ns < first_start ? t[i].start_ns : first_start;
        last_end = t[i].end_ns > last_end ? t[i].end_ns : last_end;
    }
    uint64_t elapsed = last_end - first_start;
    pthread_barrier_destroy(&run.start);
    return (double)threads * SCALING_PAIRS * 1e9 / (double)(elapsed ? elapsed : 1);
}

/* Prints one row: ns per pair of one thread, then `threads N: X.Xx of one
 * thread` per thread count. Thread counts are interleaved within each
 * repetition so drift on the machine hits them alike. */
static void scaling_row(const char *name, ps_resource_t *resource, int stream_ordered, long cpus)
{
    const char *only = getenv("BENCH_CORE_ROWS"); /* a substring of the row names to run */
    if (only && !strstr(name, only))
        return;
    const char *repeats_env = getenv("BENCH_CORE_REPEATS");
    int repeats = repeats_env ? atoi(repeats_env) : SCALING_REPEATS;
    if (repeats < 1 || repeats > SCALING_REPEATS)
        repeats = SCALING_REPEATS;
    static const int counts[] = {1, 2, 4, 8, 16};
    enum { COUNTS = sizeof counts / sizeof counts[0] };
    double rate[COUNTS][SCALING_REPEATS];
    scaling_run_pairs_per_s(resource, stream_ordered, SCALING_MAX_THREADS); /* warm up: growth, arenas */
    uint64_t barriers[COUNTS] = {0}; /* issued during the runs of each thread count */
    for (int repeat = 0; repeat < repeats; repeat++)
        for (int c = 0; c < COUNTS; c++) {
            ps_resource_info_t before = {0}, after = {0};
            ps_query(resource, &before);
            rate[c][repeat] = scaling_run_pairs_per_s(resource, stream_ordered, counts[c]);
            ps_query(resource, &after);
            barriers[c] += after.barriers - before.barriers;
        }
    double one = median(rate[0], repeats);
    /* barriers per 1000 pairs: each costs 0.5-17 us on a GPU and next to
     * nothing here, so their rate is what a GPU would add */
#define PER_1000(c) (1000.0 * (double)barriers[c] / ((double)counts[c] * SCALING_PAIRS * repeats))
    printf("%s: 1 thread %.1f ns per pair (%.2f barriers per 1000 pairs)\n", name, 1e9 / one, PER_1000(0));
    for (int c = 1; c < COUNTS; c++) {
        double ratio = median(rate[c], repeats) / one;
        double low = rate[c][0] / one, high = rate[c][repeats - 1] / one; /* sorted by median() */
        printf("  threads %d: %.1fx of one thread (runs %.1f-%.1fx; %ld online CPUs; %.2f barriers per 1000 "
               "pairs)\n", counts[c], ratio, low, high, cpus, PER_1000(c));
    }
#undef PER_1000
    uint64_t hits, misses, asked;
    int cudafree = ps_pool_thread_cache_counters(resource, &hits, &misses, &asked);
    if (hits + misses)
        printf("  thread caches so far: %.1f%% of allocations served, %llu barriers asked; cudaFree'd blocks "
               "cached: %s\n", 100.0 * (double)hits / (double)(hits + misses), (unsigned long long)asked,
               cudafree ? "yes (the lock was found contended)" : "no");
}

static void scaling_section(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    double load = -1; /* other work on the machine skews every ratio: say how much there was */
    getloadavg(&load, 1);
    printf("thread scaling: %d allocate+free pairs of mixed sizes (256 B..1 MiB) per thread,\n"
           "aggregate pairs/s of N threads over one thread's, median of %d; %ld online CPUs\n"
           "(no scaling can show above that many threads); load average %.1f before\n",
           SCALING_PAIRS, SCALING_REPEATS, cpus, load);

    /* The default stack: as on a real GPU (virtual memory, so the pool is expandable). */
    ps_fake_gpu_options_t host = {.capacity = 80 * PS_GiB, .backed = 0, .auto_complete = 1, .virtual_memory = 1};
    ps_gpu_ops_t *gpu;
    ps_resource_t *upstream, *pool, *uncached, *arena;
    int status = ps_fake_gpu_create(&host, &gpu);
    if (status == PS_OK)
        status = ps_cuda_resource_create("cuda", gpu, &upstream);
    ps_pool_options_t pool_options;
    ps_pool_options_default(&pool_options);
    if (status == PS_OK)
        status = ps_pool_create("pool", upstream, gpu, &pool_options, &pool);
    if (status == PS_OK && (pool_options.free_sync != PS_FREE_SYNC_BARRIER || !ps_pool_is_expandable(pool) ||
                            !pool_options.thread_cache))
        die("default pool is not barrier + expandable + thread cache", PS_EINVAL);
    pool_options.thread_cache = 0;
    if (status == PS_OK)
        status = ps_pool_create("uncached", upstream, gpu, &pool_options, &uncached);
    ps_arena_options_t arena_options;
    ps_arena_options_default(&arena_options);
    if (status == PS_OK)
        status = ps_arena_create("arena", upstream, gpu, &arena_options, &arena);
    if (status != PS_OK)
        die("create", status);

    scaling_row("pool (default), cudaMalloc-style (PS_STREAM_NONE)", pool, 0, cpus);
    scaling_row("pool (default), stream-ordered (a stream per thread)", pool, 1, cpus);
    scaling_row("pool, thread_cache 0, cudaMalloc-style (PS_STREAM_NONE)", uncached, 0, cpus);
    scaling_row("pool, thread_cache 0, stream-ordered (a stream per thread)", uncached, 1, cpus);
    scaling_row("arena, cudaMalloc-style (PS_STREAM_NONE)", arena, 0, cpus);
    scaling_row("arena, stream-ordered (a stream per thread)", arena, 1, cpus);

    ps_destroy(arena);
    ps_destroy(uncached);
    ps_destroy(pool);
    ps_destroy(upstream);
    ps_fake_gpu_destroy(gpu);
}

/* bench_core [hot] [random] [scaling]: the sections named (default: all). */
int main(int argc, char **argv)
{
    int hot = argc < 2, random = argc < 2, scaling = argc < 2;
    for (int i = 1; i < argc; i++) {
        hot |= !strcmp(argv[i], "hot");
        random |= !strcmp(argv[i], "random");
        scaling |= !strcmp(argv[i], "scaling");
    }
    if (!hot && !random && !scaling) {
        fprintf(stderr, "usage: bench_core [hot] [random] [scaling]\n");
        return 2;
    }
    if (hot)
        hot_section();
    if (random) {
        random_row("barrier (default)", PS_FREE_SYNC_BARRIER, 1);
        random_row("barrier, no cache", PS_FREE_SYNC_BARRIER, 0);
        random_row("none", PS_FREE_SYNC_NONE, 1);
        random_row("event", PS_FREE_SYNC_EVENT, 0);
    }
    if (scaling)
        scaling_section();
    return 0;
}

static void hot_section(void)
{
    static const size_t sizes[] = {256, PS_MiB, 256 * PS_MiB};
    static const char *const size_names[] = {"256 B", "1 MiB", "256 MiB"};
    printf("poolshim core pool, simulated upstream, one thread;\n"
           "median ns per allocate+free pair of %d rounds (fastest round)\n", ROUNDS);
    static const struct {
        const char *name;       /* column title */
        ps_free_sync_t policy;  /* free_sync */
        int thread_cache;       /* 1: the default thread cache; 0: off */
        ps_stream_t stream;     /* PS_STREAM_NONE or a stream handle */
    } columns[] = {
        {"barrier (default)", PS_FREE_SYNC_BARRIER, 1, PS_STREAM_NONE},
        {"barrier, no cache", PS_FREE_SYNC_BARRIER, 0, PS_STREAM_NONE},
        {"none", PS_FREE_SYNC_NONE, 1, PS_STREAM_NONE},
        {"event", PS_FREE_SYNC_EVENT, 0, PS_STREAM_NONE},
        {"stream (default)", PS_FREE_SYNC_BARRIER, 1, (ps_stream_t)0x100},
        {"stream, no cache", PS_FREE_SYNC_BARRIER, 0, (ps_stream_t)0x100},
    };
    enum { COLUMNS = sizeof columns / sizeof columns[0] };
    printf("%-8s", "size");
    for (int c = 0; c < COLUMNS; c++)
        printf(" %20s", columns[c].name);
    printf("\n");
    for (int i = 0; i < 3; i++) {
        printf("%-8s", size_names[i]);
        for (int c = 0; c < COLUMNS; c++) {
            double best;
            double ns = hot_pair_ns(columns[c].policy, columns[c].thread_cache, sizes[i], columns[c].stream, &best);
            printf(" %8.1f ns (%6.1f)", ns, best);
        }
        printf("\n");
    }
}
