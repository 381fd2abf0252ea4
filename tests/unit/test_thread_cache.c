/* The per-thread caches in front of the pool (core/thread_cache.c): their
 * reuse rules (a cudaFree'd block only after a barrier issued after its
 * free, a stream-ordered one at once on its own stream), draining before
 * growth, on the OOM path, on trim and stream destruction, a thread's exit,
 * the byte cap, and exact statistics. The fake device's fences never
 * complete here: the lagging GPU, so only barriers release anything. */
#include "pool_fixture.h"

#include "../../core/thread_cache.h"

#include <pthread.h>

#define S (192 * PS_KiB) /* above cap/8 of a 1 MiB cache: no refills, so addresses are predictable */

static void open_cached(pool_fixture_t *f, ps_free_sync_t policy, unsigned barrier_percent, size_t capacity)
{
    ps_pool_options_t o = small_pool_options();
    o.free_sync = policy;
    o.thread_cache = PS_MiB;
    o.barrier_pending_percent = barrier_percent;
    fixture_open_on(f, (ps_fake_gpu_options_t){.capacity = capacity}, &o);
    ps_pool_thread_cache_always_engage(f->pool); /* as with two threads (see one_thread_alone_...) */
}

static void *alloc_ok(pool_fixture_t *f, size_t size, ps_stream_t stream)
{
    void *p = NULL;
    cr_assert_eq(ps_allocate(f->pool, size, stream, &p), PS_OK, "allocate %zu", size);
    return p;
}

/* A block above cap / 4 bypasses the cache: its cudaFree makes 1.5 MiB
 * pending in the pool itself, which passes the 3 % barrier trigger and its
 * 1 MiB floor. */
static void free_pending_big(pool_fixture_t *f)
{
    void *big = alloc_ok(f, 1536 * PS_KiB, PS_STREAM_NONE);
    cr_assert_eq(ps_deallocate(f->pool, big, 1536 * PS_KiB, PS_STREAM_NONE), PS_OK);
}

static void close_cached(pool_fixture_t *f)
{
    ps_tcache_thread_exit(); /* the test thread's caches go back before the pool goes */
    fixture_close(f);
}

Test(thread_cache, cudafree_block_is_reused_only_after_a_barrier_issued_after_its_free)
{
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_BARRIER, 3, 0);
    void *a = alloc_ok(&f, S, PS_STREAM_NONE);
    cr_assert_eq(ps_deallocate(f.pool, a, S, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), S, "the free went to the thread's cache");
    free_pending_big(&f); /* 1.5 MiB pending in the pool (> 3 % of reserved, > the floor) */
    uint64_t barriers = ps_fake_gpu_barriers(f.gpu);
    /* the next allocation misses the cache (no barrier since a's free),
     * then the pool issues one (its pending bytes passed 3 %) */
    void *b = alloc_ok(&f, S, PS_STREAM_NONE);
    cr_assert_neq(b, a, "a cudaFree'd block was handed out before any barrier");
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), barriers + 1, "the pool's pending bytes triggered a barrier");
    void *c = alloc_ok(&f, S, PS_STREAM_NONE);
    cr_assert_eq(c, a, "after the barrier the cached block is reused from the cache");
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), 0);
    cr_assert_eq(ps_deallocate(f.pool, b, S, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, c, S, PS_STREAM_NONE), PS_OK);
    close_cached(&f);
}

Test(thread_cache, a_refused_barrier_releases_nothing_from_the_cache)
{
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_BARRIER, 3, 0);
    void *a = alloc_ok(&f, S, PS_STREAM_NONE);
    cr_assert_eq(ps_deallocate(f.pool, a, S, PS_STREAM_NONE), PS_OK);
    free_pending_big(&f);
    ps_fake_gpu_block_barriers(f.gpu, 1); /* a stream capture is open */
    void *b = alloc_ok(&f, S, PS_STREAM_NONE);
    void *c = alloc_ok(&f, S, PS_STREAM_NONE);
    cr_assert(b != a && c != a, "a block whose barrier was refused was handed out");
    ps_fake_gpu_block_barriers(f.gpu, 0);
    void *d = alloc_ok(&f, S, PS_STREAM_NONE); /* misses, barrier now succeeds */
    void *e = alloc_ok(&f, S, PS_STREAM_NONE);
    cr_assert(d == a || e == a, "once a barrier went through, the block is reused");
    ps_deallocate(f.pool, b, S, PS_STREAM_NONE);
    ps_deallocate(f.pool, c, S, PS_STREAM_NONE);
    ps_deallocate(f.pool, d, S, PS_STREAM_NONE);
    ps_deallocate(f.pool, e, S, PS_STREAM_NONE);
    close_cached(&f);
}

Test(thread_cache, stream_ordered_block_is_reused_at_once_on_its_stream_only)
{
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_BARRIER, 0, 0); /* no eager barrier */
    ps_stream_t s = (ps_stream_t)0x1000, t = (ps_stream_t)0x2000;
    void *a = alloc_ok(&f, S, s);
    cr_assert_eq(ps_deallocate(f.pool, a, S, s), PS_OK);
    void *on_t = alloc_ok(&f, S, t);
    void *malloced = alloc_ok(&f, S, PS_STREAM_NONE);
    void *per_thread = alloc_ok(&f, S, PS_STREAM_PER_THREAD);
    cr_assert(on_t != a && malloced != a && per_thread != a,
              "another stream, a cudaMalloc or the per-thread stream got s's block without a barrier");
    uint64_t barriers = ps_fake_gpu_barriers(f.gpu);
    void *again = alloc_ok(&f, S, s);
    cr_assert_eq(again, a, "s reuses its own freed block at once");
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), barriers, "without a barrier");
    ps_deallocate(f.pool, on_t, S, t);
    ps_deallocate(f.pool, malloced, S, PS_STREAM_NONE);
    ps_deallocate(f.pool, per_thread, S, PS_STREAM_PER_THREAD);
    ps_deallocate(f.pool, again, S, s);
    close_cached(&f);
}

Test(thread_cache, every_cache_is_drained_before_the_pool_grows)
{
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_BARRIER, 0, 0);
    void *p[10];
    for (int i = 0; i < 10; i++)
        p[i] = alloc_ok(&f, S, PS_STREAM_NONE);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(ps_deallocate(f.pool, p[i], S, PS_STREAM_NONE), PS_OK);
    cr_assert_gt(ps_pool_thread_cache_bytes(f.pool), 0);
    uint64_t allocs = ps_fake_gpu_upstream_allocs(f.gpu);
    void *big = alloc_ok(&f, 2 * PS_MiB - 4 * PS_KiB, PS_STREAM_NONE); /* needs the whole chunk */
    cr_assert_eq(ps_fake_gpu_upstream_allocs(f.gpu), allocs, "the pool grew while threads cached its blocks");
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), 0);
    ps_deallocate(f.pool, big, 2 * PS_MiB - 4 * PS_KiB, PS_STREAM_NONE);
    close_cached(&f);
}

Test(thread_cache, the_oom_path_uses_cached_blocks)
{
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_NONE, 0, 2 * PS_MiB); /* the device holds one chunk */
    void *p[10];
    for (int i = 0; i < 10; i++)
        p[i] = alloc_ok(&f, S, PS_STREAM_NONE);
    for (int i = 0; i < 10; i++)
        ps_deallocate(f.pool, p[i], S, PS_STREAM_NONE);
    cr_assert_gt(ps_pool_thread_cache_bytes(f.pool), 0);
    void *big = NULL;
    cr_assert_eq(ps_allocate(f.pool, 2 * PS_MiB, PS_STREAM_NONE, &big), PS_OK,
                 "cached blocks made an allocation fail that the pool could serve");
    ps_deallocate(f.pool, big, 2 * PS_MiB, PS_STREAM_NONE);
    close_cached(&f);
}

Test(thread_cache, trim_and_stream_destruction_drain_the_caches)
{
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_BARRIER, 0, 0);
    ps_stream_t s = (ps_stream_t)0x1000;
    void *a = alloc_ok(&f, S, s);
    ps_deallocate(f.pool, a, S, s);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), S);
    ps_stream_destroyed(f.pool, s);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), 0, "a destroyed stream's blocks stayed cached");
    void *b = alloc_ok(&f, S, PS_STREAM_NONE);
    ps_deallocate(f.pool, b, S, PS_STREAM_NONE);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), S);
    ps_fake_gpu_complete_all(f.gpu);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), 0);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0, "trim gave everything back");
    close_cached(&f);
}

typedef struct exit_case {
    pool_fixture_t *f;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int freed, may_exit;
} exit_case_t;

static void *free_then_exit(void *arg)
{
    exit_case_t *c = arg;
    void *p = alloc_ok(c->f, S, PS_STREAM_NONE);
    ps_deallocate(c->f->pool, p, S, PS_STREAM_NONE);
    pthread_mutex_lock(&c->lock);
    c->freed = 1;
    pthread_cond_broadcast(&c->cond);
    while (!c->may_exit)
        pthread_cond_wait(&c->cond, &c->lock);
    pthread_mutex_unlock(&c->lock);
    return NULL; /* the thread's exit gives its cache back */
}

Test(thread_cache, a_threads_exit_returns_its_cached_blocks)
{
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_NONE, 0, 0);
    void *keep = alloc_ok(&f, S, PS_STREAM_NONE); /* makes the chunk exist */
    ps_deallocate(f.pool, keep, S, PS_STREAM_NONE);
    ps_tcache_thread_exit(); /* and back to the pool: the chunk is whole */
    cr_assert_eq(fixture_info(f.pool).largest_free_block, 2 * PS_MiB);
    exit_case_t c = {&f, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    pthread_t thread;
    pthread_create(&thread, NULL, free_then_exit, &c);
    pthread_mutex_lock(&c.lock);
    while (!c.freed)
        pthread_cond_wait(&c.cond, &c.lock);
    pthread_mutex_unlock(&c.lock);
    ps_resource_info_t alive = fixture_info(f.pool);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), S, "the other thread cached its free");
    cr_assert_lt(alive.largest_free_block, 2 * PS_MiB);
    cr_assert_eq(alive.bytes_in_use, 0, "cached bytes are not in use");
    pthread_mutex_lock(&c.lock);
    c.may_exit = 1;
    pthread_cond_broadcast(&c.cond);
    pthread_mutex_unlock(&c.lock);
    pthread_join(thread, NULL);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), 0, "the thread's exit left blocks cached");
    cr_assert_eq(fixture_info(f.pool).largest_free_block, 2 * PS_MiB, "its block merged back");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    close_cached(&f);
}

Test(thread_cache, the_cap_bounds_cached_bytes_and_big_blocks_bypass)
{
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_NONE, 0, 0);
    void *p[12];
    for (int i = 0; i < 12; i++) /* 12 x 64 KiB into different bins: 768 KiB, within 1 MiB */
        p[i] = alloc_ok(&f, (size_t)(i + 1) * 16 * PS_KiB, PS_STREAM_NONE);
    for (int i = 0; i < 12; i++)
        ps_deallocate(f.pool, p[i], (size_t)(i + 1) * 16 * PS_KiB, PS_STREAM_NONE);
    uint64_t cached = ps_pool_thread_cache_bytes(f.pool);
    cr_assert_gt(cached, 0);
    cr_assert_leq(cached, PS_MiB, "%llu bytes cached over a 1 MiB cap", (unsigned long long)cached);
    void *big = alloc_ok(&f, 512 * PS_KiB, PS_STREAM_NONE); /* above cap / 4 */
    ps_deallocate(f.pool, big, 512 * PS_KiB, PS_STREAM_NONE);
    cr_assert_leq(ps_pool_thread_cache_bytes(f.pool), cached, "a block above cap/4 was cached");
    close_cached(&f);
}

Test(thread_cache, statistics_count_cached_bytes_as_free_or_pending)
{
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_BARRIER, 0, 0);
    void *a = alloc_ok(&f, S, PS_STREAM_NONE);
    void *b = alloc_ok(&f, S, PS_STREAM_NONE);
    ps_deallocate(f.pool, a, S, PS_STREAM_NONE);
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_in_use, S, "only b is in use");
    cr_assert_eq(info.bytes_pending, S, "a waits for a barrier");
    cr_assert_eq(info.bytes_in_use + info.bytes_free + info.bytes_pending, info.bytes_reserved);
    ps_deallocate(f.pool, b, S, PS_STREAM_NONE);
    info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_in_use, 0);
    cr_assert_eq(info.bytes_in_use + info.bytes_free + info.bytes_pending, info.bytes_reserved);
    close_cached(&f);
}

Test(thread_cache, a_double_free_into_the_same_cache_is_refused)
{
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_NONE, 0, 0);
    void *a = alloc_ok(&f, S, PS_STREAM_NONE);
    cr_assert_eq(ps_deallocate(f.pool, a, S, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, S, PS_STREAM_NONE), PS_EINVAL);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), S, "the refused free changed nothing");
    close_cached(&f);
}

Test(thread_cache, a_miss_refills_small_sizes_from_the_ready_list)
{
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_BARRIER, 0, 0);
    void *a = alloc_ok(&f, 4096, PS_STREAM_NONE);
    uint64_t refilled = ps_pool_thread_cache_bytes(f.pool);
    cr_assert_gt(refilled, 0, "the miss brought ready blocks into the cache");
    void *b = alloc_ok(&f, 4096, PS_STREAM_NONE);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), refilled - 4096, "served from the cache");
    ps_resource_info_t info = fixture_info(f.pool);
    cr_assert_eq(info.bytes_in_use, 2 * 4096, "refilled blocks count as free, not in use");
    ps_deallocate(f.pool, a, 4096, PS_STREAM_NONE);
    ps_deallocate(f.pool, b, 4096, PS_STREAM_NONE);
    close_cached(&f);
}

static void *free_one_and_wait(void *arg)
{
    exit_case_t *c = arg;
    void *p = alloc_ok(c->f, S, PS_STREAM_NONE);
    ps_deallocate(c->f->pool, p, S, PS_STREAM_NONE); /* this thread now has a cache */
    pthread_mutex_lock(&c->lock);
    c->freed = 1;
    pthread_cond_broadcast(&c->cond);
    while (!c->may_exit)
        pthread_cond_wait(&c->cond, &c->lock);
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

Test(thread_cache, under_the_barrier_big_cudafree_blocks_go_to_the_pool_while_the_lock_is_quiet)
{
    /* a cached block pins its place in the pool (memory); above
     * PS_TCACHE_SMALL that is paid only when threads contend for the lock,
     * so with one thread or two quiet ones cudaFree'd blocks go to the pool;
     * stream-ordered ones are cached */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.thread_cache = PS_MiB; /* free_sync barrier, not engaged by the test hook */
    ps_fake_gpu_options_t host = {0};
    cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    ps_stream_t s = (ps_stream_t)0x1000;
    void *a = alloc_ok(&f, S, PS_STREAM_NONE);
    ps_deallocate(f.pool, a, S, PS_STREAM_NONE);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), 0, "one thread: a cudaFree'd block goes to the pool");
    void *b = alloc_ok(&f, S, s);
    ps_deallocate(f.pool, b, S, s);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), S, "a stream-ordered free is cached");
    exit_case_t c = {&f, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    pthread_t thread;
    pthread_create(&thread, NULL, free_one_and_wait, &c);
    pthread_mutex_lock(&c.lock);
    while (!c.freed)
        pthread_cond_wait(&c.cond, &c.lock);
    pthread_mutex_unlock(&c.lock);
    uint64_t before = ps_pool_thread_cache_bytes(f.pool);
    void *d = alloc_ok(&f, S, PS_STREAM_NONE);
    ps_deallocate(f.pool, d, S, PS_STREAM_NONE);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), before, "two threads: the cudaFree'd block goes to the pool too");
    pthread_mutex_lock(&c.lock);
    c.may_exit = 1;
    pthread_cond_broadcast(&c.cond);
    pthread_mutex_unlock(&c.lock);
    pthread_join(thread, NULL);
    close_cached(&f);
}

/* psbench's mixed sizes that a 1 MiB cache keeps (<= 256 KiB). */
static const size_t loop_sizes[] = {256, 4096, 1024, 65536, 512, 16384, 2048, 300, 8192, 40000, 768, 32768, 256};
#define LOOP_SIZES (sizeof loop_sizes / sizeof loop_sizes[0])

Test(thread_cache, a_cudafree_loop_stays_in_the_cache_with_a_barrier_per_hundreds_of_frees)
{
    /* Once cudaFree'd blocks are cached (the pool's lock was contended), a
     * thread's cudaMalloc/cudaFree cycle must not go back to the pool: its
     * cache asks for one barrier per BARRIER_AFTER frees (or cap / 2 bytes)
     * and reuses what that released. The first version of the caches paid
     * a barrier per allocation here (17 us per pair on an H100). The fake
     * GPU lags: only barriers release anything. */
    pool_fixture_t f;
    open_cached(&f, PS_FREE_SYNC_BARRIER, 3, 0);
    void *live[4];
    for (int i = 0; i < 4; i++) /* something in use, as in a program */
        live[i] = alloc_ok(&f, 4 * PS_MiB, PS_STREAM_NONE);
    struct {
        const size_t *sizes;
        size_t count;
        int pairs_per_barrier; /* at least */
    } loops[] = {{loop_sizes + 12, 1, 256}, {loop_sizes, LOOP_SIZES, 32}};
    for (int l = 0; l < 2; l++) { /* 256 B: BARRIER_AFTER frees; mixed (13 KiB average): cap / 2 bytes */
        const int pairs = 60000;
        uint64_t barriers = ps_fake_gpu_barriers(f.gpu), hits0, misses0, asked0;
        ps_pool_thread_cache_counters(f.pool, &hits0, &misses0, &asked0);
        for (int k = 0; k < pairs; k++) {
            size_t size = loops[l].sizes[k % loops[l].count];
            void *p = alloc_ok(&f, size, PS_STREAM_NONE);
            cr_assert_eq(ps_deallocate(f.pool, p, size, PS_STREAM_NONE), PS_OK);
        }
        barriers = ps_fake_gpu_barriers(f.gpu) - barriers;
        uint64_t hits, misses, asked;
        cr_assert(ps_pool_thread_cache_counters(f.pool, &hits, &misses, &asked));
        hits -= hits0;
        cr_assert_gt(hits, (uint64_t)pairs * 95 / 100, "loop %d: %llu of %d allocations served by the cache", l,
                     (unsigned long long)hits, pairs);
        cr_assert_lt(barriers * (uint64_t)loops[l].pairs_per_barrier, (uint64_t)pairs,
                     "loop %d: %llu barriers for %d pairs", l, (unsigned long long)barriers, pairs);
        cr_assert_gt(asked, asked0, "the cache asked for the barriers");
    }
    ps_resource_info_t info = {0};
    ps_query(f.pool, &info);
    cr_assert_leq(info.bytes_reserved, 18 * PS_MiB, "%llu bytes reserved for 16 MiB in use and a 1 MiB cache",
                  (unsigned long long)info.bytes_reserved);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    for (int i = 0; i < 4; i++)
        ps_deallocate(f.pool, live[i], 4 * PS_MiB, PS_STREAM_NONE);
    close_cached(&f);
}

typedef struct hammer {
    pool_fixture_t *f;
    atomic_int *stop;
    long pairs;
} hammer_t;

static void *hammer_pairs(void *arg)
{
    hammer_t *h = arg;
    while (!atomic_load(h->stop)) {
        for (int k = 0; k < 64; k++) {
            size_t size = loop_sizes[k % LOOP_SIZES];
            void *p = NULL;
            if (ps_allocate(h->f->pool, size, PS_STREAM_NONE, &p) != PS_OK ||
                ps_deallocate(h->f->pool, p, size, PS_STREAM_NONE) != PS_OK)
                abort();
        }
        h->pairs += 64;
    }
    ps_tcache_thread_exit();
    return NULL;
}

Test(thread_cache, a_contended_pool_lock_turns_cudafree_caching_on)
{
    /* Not engaged by the test hook: one thread alone keeps cudaFree'd
     * blocks above PS_TCACHE_SMALL in the pool (its lock is never found
     * held); 256 contended
     * acquisitions in a window of 4096 (what 16 threads on 16 CPUs cause
     * at once: bench_core on the GPU host) turn caching on, and 8 threads
     * then go through their caches with the reuse rule intact
     * (ps_pool_check, every block freed exactly once). */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.thread_cache = PS_MiB;
    ps_fake_gpu_options_t host = {0};
    cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    uint64_t hits, misses, asked;
    for (int k = 0; k < 20000; k++) {
        void *p = alloc_ok(&f, 8192, PS_STREAM_NONE);
        ps_deallocate(f.pool, p, 8192, PS_STREAM_NONE);
    }
    cr_assert_not(ps_pool_thread_cache_counters(f.pool, &hits, &misses, &asked),
                  "one thread alone turned cudaFree caching on");
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), 0, "an 8 KiB cudaFree'd block was cached before any contention");
    void *small = alloc_ok(&f, PS_TCACHE_SMALL, PS_STREAM_NONE);
    ps_deallocate(f.pool, small, PS_TCACHE_SMALL, PS_STREAM_NONE);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), PS_TCACHE_SMALL, "a small cudaFree'd block is always cached");
    ps_pool_note_lock_contention(f.pool, 255);
    cr_assert_not(ps_pool_thread_cache_counters(f.pool, &hits, &misses, &asked), "255 of 4096 turned it on");
    ps_pool_note_lock_contention(f.pool, 1);
    cr_assert(ps_pool_thread_cache_counters(f.pool, &hits, &misses, &asked), "256 of 4096 did not turn it on");
    atomic_int stop = 0;
    hammer_t h[8];
    pthread_t threads[8];
    for (int i = 0; i < 8; i++) {
        h[i] = (hammer_t){&f, &stop, 0};
        pthread_create(&threads[i], NULL, hammer_pairs, &h[i]);
    }
    struct timespec some = {0, 200 * 1000 * 1000};
    nanosleep(&some, NULL);
    atomic_store(&stop, 1);
    for (int i = 0; i < 8; i++)
        pthread_join(threads[i], NULL);
    ps_pool_thread_cache_counters(f.pool, &hits, &misses, &asked);
    cr_assert_gt(hits, misses, "%llu hits, %llu misses", (unsigned long long)hits, (unsigned long long)misses);
    cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), 0, "the threads' exits gave their caches back");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    ps_resource_info_t info = {0};
    ps_query(f.pool, &info);
    cr_assert_eq(info.bytes_in_use, 0);
    close_cached(&f);
}

/* A cache whose block waits while the pool has fewer ready bytes than
 * the request asks for a barrier itself, without the pool's lock (the
 * pool would need one anyway); a refused barrier hands nothing out. */
Test(thread_cache, a_cache_asks_its_own_barrier_when_the_pool_is_short_and_a_refused_one_releases_nothing)
{
    for (int refused = 0; refused < 2; refused++) {
        pool_fixture_t f;
        open_cached(&f, PS_FREE_SYNC_BARRIER, 0, 0); /* no eager barrier */
        void *live[10];
        for (int i = 0; i < 10; i++) /* ten 192 KiB blocks in the first 2 MiB: 128 KiB stay ready */
            live[i] = alloc_ok(&f, S, PS_STREAM_NONE);
        cr_assert_eq(fixture_info(f.pool).bytes_reserved, 2 * PS_MiB);
        void *a = live[0];
        cr_assert_eq(ps_deallocate(f.pool, a, S, PS_STREAM_NONE), PS_OK);
        cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), S, "a is cached, waiting for a barrier");
        uint64_t barriers = ps_fake_gpu_barriers(f.gpu), hits0, misses0, asked0, hits, misses, asked;
        ps_pool_thread_cache_counters(f.pool, &hits0, &misses0, &asked0);
        ps_fake_gpu_block_barriers(f.gpu, refused); /* refused: a stream capture is open */
        void *b = alloc_ok(&f, S, PS_STREAM_NONE);
        ps_pool_thread_cache_counters(f.pool, &hits, &misses, &asked);
        cr_assert_eq(asked, asked0 + 1, "the cache asked for a barrier");
        if (refused) {
            cr_assert_neq(b, a, "a block whose barrier was refused was handed out");
            cr_assert_eq(ps_fake_gpu_barriers(f.gpu), barriers, "no barrier went through");
        } else {
            cr_assert_eq(b, a, "the barrier the cache asked for released its block");
            cr_assert_eq(ps_fake_gpu_barriers(f.gpu), barriers + 1, "one barrier");
            cr_assert_eq(hits, hits0 + 1);
        }
        ps_fake_gpu_block_barriers(f.gpu, 0);
        cr_assert_eq(ps_deallocate(f.pool, b, S, PS_STREAM_NONE), PS_OK);
        for (int i = 1; i < 10; i++)
            cr_assert_eq(ps_deallocate(f.pool, live[i], S, PS_STREAM_NONE), PS_OK);
        cr_assert_eq(ps_pool_check(f.pool), PS_OK);
        close_cached(&f);
    }
}

Test(thread_cache, below_the_barrier_floor_a_short_pool_grows_and_the_cache_asks_no_barrier)
{
    /* The case above with a barrier floor (barrier_floor, 8 MiB): while the
     * pool is below it, a miss makes the pool grow rather than issue a
     * barrier, so the cache must not ask for one either (a fresh pool under
     * 16 threads asked a barrier per ~80 pairs, each a few CUDA calls per
     * stream). Past the floor (floor 0: always) it asks, as the test
     * above shows. */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.free_sync = PS_FREE_SYNC_BARRIER;
    o.thread_cache = PS_MiB;
    o.barrier_pending_percent = 0; /* no eager barrier */
    o.barrier_floor = 8 * PS_MiB;
    ps_fake_gpu_options_t host = {0};
    cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    ps_pool_thread_cache_always_engage(f.pool);
    void *live[10];
    int n = 0;
    for (; n < 10; n++) /* ten 192 KiB blocks in the first 2 MiB: 128 KiB stay ready */
        live[n] = alloc_ok(&f, S, PS_STREAM_NONE);
    void *a = live[0];
    cr_assert_eq(ps_deallocate(f.pool, a, S, PS_STREAM_NONE), PS_OK);
    uint64_t barriers = ps_fake_gpu_barriers(f.gpu), hits0, misses0, asked0, hits, misses, asked;
    ps_pool_thread_cache_counters(f.pool, &hits0, &misses0, &asked0);
    live[0] = alloc_ok(&f, S, PS_STREAM_NONE);
    ps_pool_thread_cache_counters(f.pool, &hits, &misses, &asked);
    cr_assert_neq(live[0], a, "a cudaFree'd block came back without a barrier");
    cr_assert_eq(asked, asked0, "below the floor the cache asked for a barrier");
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), barriers, "below the floor: no barrier");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 4 * PS_MiB, "the pool grew instead");
    for (int k = 0; k < n; k++)
        cr_assert_eq(ps_deallocate(f.pool, live[k], S, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    close_cached(&f);
}

Test(thread_cache, a_small_pool_releases_the_callers_cache_instead_of_draining_it)
{
    /* 64 KiB pairs through a pool of one 2 MiB piece: the cache fills the
     * pool with freed blocks before it would ask for a barrier itself, and
     * the pool runs dry. It then issues a barrier and the caller's own
     * cache serves (draining every cache into the pool at each barrier, as
     * the first version did, gave 0 hits in 20000 pairs). */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.thread_cache = 4 * PS_MiB; /* holds the whole 2 MiB pool without being 3/4 full: it never asks */
    ps_fake_gpu_options_t host = {0};
    cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    ps_pool_thread_cache_always_engage(f.pool);
    const int pairs = 20000;
    for (int k = 0; k < pairs; k++) {
        void *p = alloc_ok(&f, 64 * PS_KiB, PS_STREAM_NONE);
        cr_assert_eq(ps_deallocate(f.pool, p, 64 * PS_KiB, PS_STREAM_NONE), PS_OK);
    }
    uint64_t hits, misses, asked;
    ps_pool_thread_cache_counters(f.pool, &hits, &misses, &asked);
    cr_assert_gt(hits, (uint64_t)pairs * 9 / 10, "%llu hits of %d (%llu misses, %llu asked, %llu barriers)", (unsigned long long)hits, pairs, (unsigned long long)misses, (unsigned long long)asked, (unsigned long long)ps_fake_gpu_barriers(f.gpu));
    cr_assert_leq(fixture_info(f.pool).bytes_reserved, 2 * PS_MiB, "the pool did not grow");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    close_cached(&f);
}

Test(thread_cache, under_contention_small_caches_stay_when_the_pool_grows)
{
    /* Threads meet on the lock (cudaFree caching on): a growth leaves
     * caches holding at most a quarter of the reserved bytes where they are
     * (their threads keep serving from them); quiet, the same caches are
     * drained first (at OOM they come back in both cases:
     * the_oom_path_uses_cached_blocks). */
    for (int contended = 0; contended < 2; contended++) {
        pool_fixture_t f;
        ps_pool_options_t o = small_pool_options();
        o.thread_cache = PS_MiB;
        ps_fake_gpu_options_t host = {.capacity = 16 * PS_MiB};
        cr_assert_eq(ps_fake_gpu_create(&host, &f.gpu), PS_OK);
        cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
        cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
        if (contended)
            ps_pool_note_lock_contention(f.pool, 4096);
        void *live = alloc_ok(&f, 6 * PS_MiB, PS_STREAM_NONE); /* 8 MiB reserved */
        void *small[8];
        for (int i = 0; i < 8; i++)
            small[i] = alloc_ok(&f, PS_TCACHE_SMALL, PS_STREAM_NONE);
        for (int i = 0; i < 8; i++)
            cr_assert_eq(ps_deallocate(f.pool, small[i], PS_TCACHE_SMALL, PS_STREAM_NONE), PS_OK);
        uint64_t cached = ps_pool_thread_cache_bytes(f.pool);
        cr_assert_eq(cached, 8 * PS_TCACHE_SMALL);
        void *more = alloc_ok(&f, 3 * PS_MiB, PS_STREAM_NONE); /* does not fit: the pool grows */
        if (contended)
            cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), cached, "contended: the cache stayed");
        else
            cr_assert_eq(ps_pool_thread_cache_bytes(f.pool), 0, "quiet: drained before the growth");
        cr_assert_eq(ps_pool_check(f.pool), PS_OK);
        ps_deallocate(f.pool, more, 0, PS_STREAM_NONE);
        ps_deallocate(f.pool, live, 0, PS_STREAM_NONE);
        close_cached(&f);
    }
}
