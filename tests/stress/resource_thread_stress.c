/* Threaded stress of every resource of the family, outside Criterion, so
 * it can run under ThreadSanitizer (Criterion aborts under TSan: "Could not
 * initialize inheritable arena", Snaipe/Criterion#274).
 *
 *   make test-stress SANITIZE=thread
 *
 * For each stack (fixed_size, binning, arena, limit/stats/track/log over
 * arena, pool, binning over pool): 4 threads allocate blocks over real host memory, fill them with
 * their id, check the pattern before freeing, and hand a quarter of their
 * blocks to the next thread to free. Then, per stack, 4 threads each churn
 * through streams of their own (allocate and free on the stream, destroy
 * it) while they also use cudaMalloc-style calls, so stream_destroyed runs
 * concurrently with allocation. Exits 1 on any failure.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../core/adaptors.h"
#include "../../core/arena.h"
#include "../../core/binning.h"
#include "../../core/fixed_size.h"
#include "../../tools/sim/fake_gpu.h"
#include "../../core/pool.h"
#include "../../core/upstream.h"

enum { THREADS = 4, ROUNDS = 1500, LIVE = 16, MAILBOX = 256 };

typedef struct shared {
    ps_resource_t *top;            /* the stack */
    size_t max;                    /* largest request */
    pthread_mutex_t lock[THREADS]; /* guards each mailbox */
    void *box[THREADS][MAILBOX];   /* blocks for thread i to free */
    size_t box_size[THREADS][MAILBOX]; /* their sizes */
    int box_count[THREADS];        /* entries */
    int failures;                  /* under lock[0] */
} shared_t;

typedef struct worker { shared_t *sh; int id; } worker_t;

static void fail(shared_t *sh)
{
    pthread_mutex_lock(&sh->lock[0]);
    sh->failures++;
    pthread_mutex_unlock(&sh->lock[0]);
}

static void drain(shared_t *sh, int id)
{
    pthread_mutex_lock(&sh->lock[id]);
    while (sh->box_count[id]) {
        int n = --sh->box_count[id];
        if (ps_deallocate(sh->top, sh->box[id][n], sh->box_size[id][n], PS_STREAM_NONE) != PS_OK)
            fail(sh);
    }
    pthread_mutex_unlock(&sh->lock[id]);
}

static void *work(void *p)
{
    worker_t *w = p;
    shared_t *sh = w->sh;
    unsigned seed = 99u * (unsigned)(w->id + 1);
    void *live[LIVE] = {0};
    size_t size[LIVE] = {0};
    for (int r = 0; r < ROUNDS; r++) {
        int k = r % LIVE;
        if (live[k]) {
            for (size_t b = 0; b < size[k]; b += 97)
                if (((unsigned char *)live[k])[b] != (unsigned char)(w->id + 1))
                    fail(sh);
            int next = (w->id + 1) % THREADS;
            int handed = 0;
            if (r % 4 == 0) {
                pthread_mutex_lock(&sh->lock[next]);
                if (sh->box_count[next] < MAILBOX) {
                    sh->box[next][sh->box_count[next]] = live[k];
                    sh->box_size[next][sh->box_count[next]++] = size[k];
                    handed = 1;
                }
                pthread_mutex_unlock(&sh->lock[next]);
            }
            if (!handed && ps_deallocate(sh->top, live[k], size[k], PS_STREAM_NONE) != PS_OK)
                fail(sh);
            live[k] = NULL;
        }
        if (r % 8 == 3)
            drain(sh, w->id);
        size[k] = 1 + (size_t)rand_r(&seed) % ((size_t)2 << (rand_r(&seed) % 22)); /* log-uniform */
        if (size[k] > sh->max)
            size[k] = sh->max;
        if (ps_allocate(sh->top, size[k], PS_STREAM_NONE, &live[k]) != PS_OK) {
            fail(sh);
            live[k] = NULL;
            continue;
        }
        memset(live[k], w->id + 1, size[k]);
    }
    for (int k = 0; k < LIVE; k++)
        if (live[k] && ps_deallocate(sh->top, live[k], size[k], PS_STREAM_NONE) != PS_OK)
            fail(sh);
    return NULL;
}

/* One thread's stream churn: STREAM_ROUNDS streams of its own, each used
 * for a few blocks and then destroyed. */
enum { STREAM_ROUNDS = 200 };

static void *churn(void *p)
{
    worker_t *w = p;
    shared_t *sh = w->sh;
    unsigned seed = 7u * (unsigned)(w->id + 1);
    void *kept = NULL;
    size_t kept_size = 0;
    for (int r = 0; r < STREAM_ROUNDS; r++) {
        ps_stream_t s = (ps_stream_t)(0x100000 + ((uintptr_t)w->id << 16) + (uintptr_t)r * 64);
        void *b[4];
        size_t size[4];
        for (int i = 0; i < 4; i++) {
            size_t cap = sh->max < 16384 ? sh->max : 16384; /* stay cheap under TSan */
            size[i] = 1 + (size_t)rand_r(&seed) % cap;
            if (ps_allocate(sh->top, size[i], s, &b[i]) != PS_OK) {
                fail(sh);
                b[i] = NULL;
                continue;
            }
            memset(b[i], w->id + 1, size[i]);
        }
        for (int i = 0; i < 3; i++)
            if (b[i] && ps_deallocate(sh->top, b[i], size[i], s) != PS_OK)
                fail(sh);
        /* the last block outlives its stream, freed with cudaFree next round */
        if (kept && ps_deallocate(sh->top, kept, kept_size, PS_STREAM_NONE) != PS_OK)
            fail(sh);
        kept = b[3];
        kept_size = size[3];
        ps_stream_destroyed(sh->top, s);
        void *n;
        if (ps_allocate(sh->top, 1000, PS_STREAM_NONE, &n) != PS_OK ||
            ps_deallocate(sh->top, n, 1000, PS_STREAM_NONE) != PS_OK)
            fail(sh);
    }
    if (kept && ps_deallocate(sh->top, kept, kept_size, PS_STREAM_NONE) != PS_OK)
        fail(sh);
    return NULL;
}

static int run(const char *name, ps_resource_t *top, size_t max)
{
    static shared_t sh;
    memset(&sh, 0, sizeof sh);
    sh.top = top;
    sh.max = max;
    for (int i = 0; i < THREADS; i++)
        pthread_mutex_init(&sh.lock[i], NULL);
    pthread_t t[THREADS];
    worker_t w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker_t){&sh, i};
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++)
        drain(&sh, i);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, churn, &w[i]);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    ps_resource_info_t info = {0};
    ps_query(top, &info);
    printf("%-22s %s (in use after: %llu, reserved %llu, upstream calls %llu)\n", name,
           sh.failures || info.bytes_in_use ? "FAILED" : "ok", (unsigned long long)info.bytes_in_use,
           (unsigned long long)info.bytes_reserved, (unsigned long long)info.upstream_allocs);
    fflush(stdout);
    return sh.failures || info.bytes_in_use;
}

int main(void)
{
    ps_fake_gpu_options_t h = {.backed = 1, .auto_complete = 1};
    ps_gpu_ops_t *gpu;
    ps_resource_t *up, *fs, *fs2, *bins, *arena, *adaptor;
    int bad = 0;
    if (ps_fake_gpu_create(&h, &gpu) != PS_OK || ps_cuda_resource_create("cuda", gpu, &up) != PS_OK)
        return 1;
    ps_fixed_size_options_t fo;
    ps_fixed_size_options_default(&fo);
    fo.block_size = 4096;
    ps_fixed_size_create("fixed", up, gpu, &fo, &fs);
    bad |= run("fixed_size", fs, 4096);
    fo.block_size = 512;
    ps_fixed_size_create("fixed512", up, gpu, &fo, &fs2);
    ps_arena_create("arena", up, gpu, NULL, &arena);
    ps_bin_t b[2] = {{512, fs2}, {4096, fs}};
    ps_binning_create("binning", b, 2, arena, &bins);
    bad |= run("binning", bins, 128 * 1024);
    bad |= run("arena", arena, 3 * PS_MiB);
    ps_limit_create("limit", arena, (size_t)1 << 40, &adaptor);
    bad |= run("limit_over_arena", adaptor, 64 * 1024);
    ps_destroy(adaptor);
    ps_stats_create("stats", arena, &adaptor);
    bad |= run("stats_over_arena", adaptor, 64 * 1024);
    ps_destroy(adaptor);
    ps_track_create("track", arena, 4, &adaptor);
    bad |= run("track_over_arena", adaptor, 64 * 1024);
    ps_destroy(adaptor);
    char path[64];
    snprintf(path, sizeof path, "/tmp/poolshim-stress-%d.csv", (int)getpid());
    ps_log_create("log", arena, path, &adaptor);
    bad |= run("log_over_arena", adaptor, 64 * 1024);
    ps_destroy(adaptor);
    unlink(path);
    ps_resource_t *pool, *pfs[2], *pbins;
    ps_pool_create("pool", up, gpu, NULL, &pool);
    bad |= run("pool", pool, 3 * PS_MiB);
    fo.block_size = 512;
    ps_fixed_size_create("pool512", pool, gpu, &fo, &pfs[0]);
    fo.block_size = 4096;
    ps_fixed_size_create("pool4096", pool, gpu, &fo, &pfs[1]);
    ps_bin_t pb[2] = {{512, pfs[0]}, {4096, pfs[1]}};
    ps_binning_create("binning_pool", pb, 2, pool, &pbins);
    bad |= run("binning_over_pool", pbins, 128 * 1024);
    ps_destroy(pbins);
    ps_destroy(pfs[1]);
    ps_destroy(pfs[0]);
    ps_destroy(pool);
    ps_destroy(bins);
    ps_destroy(arena);
    ps_destroy(fs2);
    ps_destroy(fs);
    ps_destroy(up);
    ps_fake_gpu_destroy(gpu);
    return bad;
}
