/* The arena's thread floor (core/arena_local.c, step 6): while threads meet in
 * the arena, a thread's arena takes superblocks instead of issuing a
 * barrier as long as its cudaFree'd blocks pending stay under
 * thread_floor; one thread, or threads taking turns, issue a barrier at
 * every miss as before. Every loop here is judged: no block comes back
 * before a barrier issued after its free. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#include "arena_fixture.h"


static void open_arena(arena_fixture_t *f, size_t thread_floor)
{
    ps_fake_gpu_options_t h = {0}; /* fences complete only when told; barriers counted */
    ps_arena_options_t o;
    ps_arena_options_default(&o);
    cr_assert_eq(o.free_sync, PS_FREE_SYNC_BARRIER);
    o.thread_floor = thread_floor;
    arena_fixture_open(f, &h, &o);
}

static void close_arena(arena_fixture_t *f) { arena_fixture_close(f); }

static uint64_t peak_reserved(ps_resource_t *r) { return arena_info(r).peak_bytes_reserved; }

/* The judge of one thread's 1 MiB cudaMalloc/cudaFree loop: the
 * device's barrier count when each block was freed. */
enum { SEEN = 256 };
typedef struct judge {
    uintptr_t freed_addr[SEEN]; /* blocks freed and not yet seen again */
    uint64_t freed_at[SEEN];    /* ps_fake_gpu_barriers when each was freed */
} judge_t;

/* `pairs` 1 MiB pairs (two blocks per 2 MiB superblock: each miss finds
 * the other freed). Returns the barriers issued meanwhile (by anyone). */
static uint64_t mib_pairs(arena_fixture_t *f, judge_t *j, int pairs)
{
    uint64_t before = ps_fake_gpu_barriers(f->gpu);
    for (int k = 0; k < pairs; k++) {
        void *p;
        cr_assert_eq(ps_allocate(f->arena, PS_MiB, PS_STREAM_NONE, &p), PS_OK);
        for (int i = 0; i < SEEN; i++)
            if (j->freed_addr[i] == (uintptr_t)p) {
                cr_assert_gt(ps_fake_gpu_barriers(f->gpu), j->freed_at[i],
                             "pair %d: a block came back without a barrier issued after its free", k);
                j->freed_addr[i] = 0;
            }
        int slot = 0;
        while (slot < SEEN && j->freed_addr[slot])
            slot++;
        cr_assert_lt(slot, SEEN, "more than %d blocks pending", SEEN);
        j->freed_addr[slot] = (uintptr_t)p;
        j->freed_at[slot] = ps_fake_gpu_barriers(f->gpu);
        cr_assert_eq(ps_deallocate(f->arena, p, PS_MiB, PS_STREAM_NONE), PS_OK);
    }
    return ps_fake_gpu_barriers(f->gpu) - before;
}

/* One thread: a barrier at every miss, as before (the floor is for threads). */
Test(arena_thread_floor, one_thread_issues_a_barrier_at_every_miss_as_before)
{
    arena_fixture_t f;
    open_arena(&f, 16 * PS_MiB);
    judge_t j = {0};
    const int pairs = 2000;
    uint64_t barriers = mib_pairs(&f, &j, pairs);
    cr_assert_geq(barriers * 3, (uint64_t)pairs, "%llu barriers for %d pairs", (unsigned long long)barriers, pairs);
    cr_assert_leq(peak_reserved(f.arena), 16 * PS_MiB, "the first chunk only");
    close_arena(&f);
}

/* ---- two threads taking turns (PyTorch: forward, then backward) ---- */
typedef struct turns {
    arena_fixture_t *f;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int turn;        /* whose turn: 0 or 1 */
    int rounds;      /* runs of pairs each thread does */
    int run;         /* pairs per run */
    uint64_t barriers[2];
} turns_t;

typedef struct turn_arg {
    turns_t *t;
    int me;
} turn_arg_t;

static void *take_turns(void *p)
{
    turn_arg_t *arg = p;
    turns_t *t = arg->t;
    judge_t j = {0};
    for (int r = 0; r < t->rounds; r++) {
        pthread_mutex_lock(&t->lock);
        while (t->turn != arg->me)
            pthread_cond_wait(&t->changed, &t->lock);
        pthread_mutex_unlock(&t->lock);
        t->barriers[arg->me] += mib_pairs(t->f, &j, t->run);
        pthread_mutex_lock(&t->lock);
        t->turn ^= 1;
        pthread_cond_broadcast(&t->changed);
        pthread_mutex_unlock(&t->lock);
    }
    return NULL;
}

/* Two threads hold arenas but never run in it at once: they keep their
 * barriers (replayed that way, the PyTorch MLP log went from 224 to 288
 * MiB when the floor counted threads alone). Fails when the floor is
 * applied on the thread count without threads meeting. */
Test(arena_thread_floor, threads_taking_turns_issue_a_barrier_at_every_miss_as_before)
{
    arena_fixture_t f;
    open_arena(&f, 16 * PS_MiB);
    turns_t t = {.f = &f, .rounds = 20, .run = 50};
    pthread_mutex_init(&t.lock, NULL);
    pthread_cond_init(&t.changed, NULL);
    pthread_t id[2];
    turn_arg_t args[2] = {{&t, 0}, {&t, 1}};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&id[i], NULL, take_turns, &args[i]), 0);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_join(id[i], NULL), 0);
    const uint64_t pairs = 2ull * t.rounds * t.run;
    uint64_t barriers = t.barriers[0] + t.barriers[1];
    cr_log_info("taking turns: %llu barriers for %llu pairs, peak reserved %llu MiB", (unsigned long long)barriers,
                (unsigned long long)pairs, (unsigned long long)(peak_reserved(f.arena) >> 20));
    cr_assert_geq(barriers * 3, pairs, "%llu barriers for %llu pairs", (unsigned long long)barriers,
                  (unsigned long long)pairs);
    cr_assert_leq(peak_reserved(f.arena), 16 * PS_MiB, "no growth past the first chunk");
    pthread_cond_destroy(&t.changed);
    pthread_mutex_destroy(&t.lock);
    close_arena(&f);
}

/* ---- two threads in the arena at once ---- */
typedef struct spinner {
    ps_resource_t *arena;
    atomic_long pairs; /* done so far */
    atomic_int stop;
} spinner_t;

/* 256 B cudaMalloc/cudaFree pairs until told to stop: a thread inside the
 * arena most of the time. */
static void *spin_pairs(void *p)
{
    spinner_t *s = p;
    while (!atomic_load(&s->stop)) {
        void *b;
        cr_assert_eq(ps_allocate(s->arena, 256, PS_STREAM_NONE, &b), PS_OK);
        cr_assert_eq(ps_deallocate(s->arena, b, 256, PS_STREAM_NONE), PS_OK);
        atomic_fetch_add(&s->pairs, 1);
    }
    return NULL;
}

/* Runs the 1 MiB loop beside a spinning thread, with thread floor
 * `floor`: warms up until the threads met (a run of 64 pairs paying at
 * most 8 barriers, while the spinner runs too; at most 20 s: the suite
 * runs tests in parallel on few CPUs; `floor` 0: 2000 pairs), then
 * returns the barriers of `pairs` more pairs and the peak reserved. */
static void meet_loop(size_t floor, int pairs, uint64_t *barriers, uint64_t *peak)
{
    arena_fixture_t f;
    open_arena(&f, floor);
    spinner_t s = {.arena = f.arena};
    pthread_t id;
    cr_assert_eq(pthread_create(&id, NULL, spin_pairs, &s), 0);
    judge_t j = {0};
    while (atomic_load(&s.pairs) == 0)
        sched_yield();
    int met = 0;
    time_t give_up = time(NULL) + 20;
    for (int run = 0; !met && (floor ? time(NULL) < give_up : run < 32); run++) {
        long spun = atomic_load(&s.pairs);
        met = mib_pairs(&f, &j, 64) <= 8 && atomic_load(&s.pairs) > spun;
        if (!met)
            sched_yield();
    }
    if (floor)
        cr_assert(met, "the threads never met in the arena");
    *barriers = mib_pairs(&f, &j, pairs);
    atomic_store(&s.stop, 1);
    cr_assert_eq(pthread_join(id, NULL), 0);
    *peak = peak_reserved(f.arena);
    close_arena(&f);
}

/* The rule: below the floor the arena takes superblocks, so one barrier
 * serves ~floor's worth of frees, and reserved stays within the floor.
 * Fails when the floor is not checked (the arena grows at every miss) and
 * when blocks come back without a barrier after their free (the judge). */
Test(arena_thread_floor, threads_in_the_arena_at_once_grow_below_the_floor_with_one_barrier_per_many_pairs)
{
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < 2)
        cr_skip_test("one CPU: threads meet in the arena only when one is preempted holding its lock");
    const int pairs = 2000;
    uint64_t barriers, peak;
    meet_loop(8 * PS_MiB, pairs, &barriers, &peak);
    cr_log_info("floor 8 MiB: %llu barriers for %d pairs, peak reserved %llu MiB", (unsigned long long)barriers, pairs,
                (unsigned long long)(peak >> 20));
    /* 1 MiB pending per pair: one barrier per ~8 pairs (the other
     * thread's barriers release this one's blocks too) */
    cr_assert_leq(barriers * 5, (uint64_t)pairs, "%llu barriers for %d pairs", (unsigned long long)barriers, pairs);
    cr_assert_geq(barriers * 16, (uint64_t)pairs, "the floor bounds the pending bytes: only %llu barriers",
                  (unsigned long long)barriers);
    cr_assert_leq(peak, 32 * PS_MiB, "the floor bounds the growth: %llu MiB", (unsigned long long)(peak >> 20));

    meet_loop(0, pairs, &barriers, &peak); /* thread_floor 0: a barrier at every miss */
    cr_assert_geq(barriers * 3, (uint64_t)pairs, "floor 0: %llu barriers for %d pairs", (unsigned long long)barriers,
                  pairs);
}
