/* CPU micro-benchmark of the arena's multi-thread scaling.
 *
 *   bench_arena PAIRS THREADS...      e.g. bench_arena 1000000 1 2 4 8 16
 *
 * For each thread count T, T threads each run PAIRS allocate+free pairs
 * against one arena over a simulated device (no memory is touched): sizes
 * 256 B .. 64 KiB drawn from a fixed sequence, 16 blocks live per thread,
 * and one free in 8 is of a block another thread allocated (cross-thread
 * frees, handed over through a per-thread mailbox). free_sync = none so
 * the figure is the allocator's own cost (the fence path is measured by
 * the GPU benchmarks). Prints pairs per second in total and per thread.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/arena.h"
#include "../../core/upstream.h"

#define LIVE 16      /* blocks each thread keeps live */
#define MAILBOX 64   /* cross-thread hand-over slots per thread */

/* A minimal `cuda` upstream over a simulated address space, so the bench
 * needs nothing beside the core library. */
typedef struct sim_upstream {
    ps_resource_t base;        /* vtable first */
    pthread_mutex_t lock;      /* guards next */
    uintptr_t next;            /* next address */
} sim_upstream_t;

static int sim_alloc(ps_resource_t *r, size_t size, ps_stream_t s, void **out)
{
    sim_upstream_t *u = (sim_upstream_t *)r;
    pthread_mutex_lock(&u->lock);
    *out = (void *)u->next;
    u->next += ps_align_up(size, 2 * PS_MiB);
    pthread_mutex_unlock(&u->lock);
    return PS_OK;
}
static int sim_free(ps_resource_t *r, void *p, size_t size, ps_stream_t s) { return PS_OK; }
static void sim_destroy(ps_resource_t *r) { (void)r; }
static const ps_resource_ops_t sim_ops = {"simulated", sim_alloc, sim_free, NULL, NULL, sim_destroy};

static int fake_fence_record(void *ctx, ps_stream_t s, ps_fence_t **out) { *out = (ps_fence_t *)ctx; return PS_OK; }
static int fake_fence_ok(void *ctx, ps_fence_t *f) { return PS_OK; }
static void fake_fence_release(void *ctx, ps_fence_t *f) {}
static int fake_stream_wait(void *ctx, ps_stream_t s, ps_fence_t *f) { return PS_OK; }
static int fake_sync(void *ctx) { return PS_OK; }

typedef struct mailbox {
    pthread_mutex_t lock;      /* guards the slots */
    void *ptr[MAILBOX];        /* blocks to free */
    size_t size[MAILBOX];      /* their sizes */
    int count;                 /* used slots */
} mailbox_t;

typedef struct worker {
    ps_resource_t *arena;      /* shared */
    mailbox_t *boxes;          /* one per thread */
    int id, threads;           /* who, of how many */
    long pairs;                /* to run */
    pthread_barrier_t *start;  /* all start together */
    int errors;                /* failed calls */
} worker_t;

/* 0: no cross-thread frees (BENCH_ARENA_CROSS=0), to see the pure scaling */
static int cross_thread = 1;

static double now_s(void) { return (double)ps_now_ns() / 1e9; }

static void *work(void *p)
{
    worker_t *w = p;
    void *live[LIVE] = {0};
    size_t sizes[LIVE] = {0};
    unsigned seed = 12345u + (unsigned)w->id;
    pthread_barrier_wait(w->start);
    for (long i = 0; i < w->pairs; i++) {
        int k = (int)(i % LIVE);
        if (live[k]) {
            mailbox_t *to = &w->boxes[(w->id + 1) % w->threads];
            if (w->threads > 1 && cross_thread && i % 8 == 0) {
                pthread_mutex_lock(&to->lock);
                if (to->count < MAILBOX) {
                    to->ptr[to->count] = live[k];
                    to->size[to->count++] = sizes[k];
                    live[k] = NULL;
                }
                pthread_mutex_unlock(&to->lock);
            }
            if (live[k] && ps_deallocate(w->arena, live[k], sizes[k], PS_STREAM_NONE) != PS_OK)
                w->errors++;
        }
        mailbox_t *mine = &w->boxes[w->id];
        if (i % 8 == 4) {
            pthread_mutex_lock(&mine->lock);
            while (mine->count) {
                mine->count--;
                if (ps_deallocate(w->arena, mine->ptr[mine->count], mine->size[mine->count], PS_STREAM_NONE) != PS_OK)
                    w->errors++;
            }
            pthread_mutex_unlock(&mine->lock);
        }
        seed = seed * 1103515245u + 12345u;
        sizes[k] = (size_t)256 << ((seed >> 16) % 9); /* 256 B .. 64 KiB */
        if (ps_allocate(w->arena, sizes[k], PS_STREAM_NONE, &live[k]) != PS_OK) {
            w->errors++;
            live[k] = NULL;
        }
    }
    for (int k = 0; k < LIVE; k++)
        if (live[k])
            ps_deallocate(w->arena, live[k], sizes[k], PS_STREAM_NONE);
    return NULL;
}

int main(int argc, char **argv)
{
    long pairs = argc > 1 ? atol(argv[1]) : 1000000;
    const char *cross = getenv("BENCH_ARENA_CROSS");
    cross_thread = !cross || atoi(cross) != 0;
    static char fence_token;
    ps_gpu_ops_t gpu = {.ctx = &fence_token, .device = -1, .fence_record = fake_fence_record,
                        .fence_query = fake_fence_ok, .fence_wait = fake_fence_ok,
                        .fence_release = fake_fence_release, .stream_wait_fence = fake_stream_wait,
                        .device_synchronize = fake_sync};
    printf("arena scaling: %ld allocate+free pairs per thread, 256 B..64 KiB, %s\n", pairs,
           cross_thread ? "1/8 freed by another thread" : "no cross-thread frees");
    printf("%8s %16s %20s %12s\n", "threads", "pairs/s total", "pairs/s per thread", "ns/pair");
    for (int a = 2; a < argc || a == 2; a++) {
        int threads = argc > a ? atoi(argv[a]) : 1;
        if (threads < 1)
            continue;
        sim_upstream_t up = {.base = {.ops = &sim_ops, .name = "simulated"}, .next = (uintptr_t)1 << 40};
        pthread_mutex_init(&up.lock, NULL);
        ps_arena_options_t o;
        ps_arena_options_default(&o);
        o.free_sync = PS_FREE_SYNC_NONE;
        ps_resource_t *arena;
        if (ps_arena_create("bench", &up.base, &gpu, &o, &arena) != PS_OK)
            return 1;
        mailbox_t *boxes = calloc((size_t)threads, sizeof *boxes);
        worker_t *w = calloc((size_t)threads, sizeof *w);
        pthread_t *t = calloc((size_t)threads, sizeof *t);
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
        for (int i = 0; i < threads; i++) {
            pthread_mutex_init(&boxes[i].lock, NULL);
            w[i] = (worker_t){.arena = arena, .boxes = boxes, .id = i, .threads = threads, .pairs = pairs, .start = &start};
            pthread_create(&t[i], NULL, work, &w[i]);
        }
        pthread_barrier_wait(&start);
        double t0 = now_s();
        int errors = 0;
        for (int i = 0; i < threads; i++) {
            pthread_join(t[i], NULL);
            errors += w[i].errors;
        }
        double secs = now_s() - t0;
        for (int i = 0; i < threads; i++) /* leftovers in mailboxes */
            while (boxes[i].count) {
                boxes[i].count--;
                ps_deallocate(arena, boxes[i].ptr[boxes[i].count], boxes[i].size[boxes[i].count], PS_STREAM_NONE);
            }
        double total = (double)pairs * threads / secs;
        printf("%8d %16.0f %20.0f %12.1f%s\n", threads, total, total / threads, 1e9 / (total / threads),
               errors ? "  ERRORS" : "");
        ps_resource_info_t info = {0};
        ps_query(arena, &info);
        if (info.bytes_in_use != 0)
            printf("  leak: %llu bytes still in use\n", (unsigned long long)info.bytes_in_use);
        ps_destroy(arena);
        pthread_barrier_destroy(&start);
        free(boxes);
        free(w);
        free(t);
        if (errors)
            return 1;
    }
    return 0;
}
