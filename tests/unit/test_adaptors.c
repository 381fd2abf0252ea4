/* limit, stats, track and log adaptors over an arena. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../core/adaptors.h"
#include "../../core/arena.h"
#include "../../tools/sim/fake_gpu.h"
#include "../../core/upstream.h"

typedef struct stack {
    ps_gpu_ops_t *gpu;     /* fake device */
    ps_resource_t *up;     /* `cuda` upstream */
    ps_resource_t *arena;  /* the allocator */
} stack_t_;

static void base_make(stack_t_ *s)
{
    ps_fake_gpu_options_t h = {.auto_complete = 1};
    cr_assert_eq(ps_fake_gpu_create(&h, &s->gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", s->gpu, &s->up), PS_OK);
    cr_assert_eq(ps_arena_create("arena", s->up, s->gpu, NULL, &s->arena), PS_OK);
}

static void base_unmake(stack_t_ *s)
{
    ps_destroy(s->arena);
    ps_destroy(s->up);
    ps_fake_gpu_destroy(s->gpu);
}

static char *slurp(FILE *f)
{
    fflush(f);
    rewind(f);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    return buf;
}

/* ---- limit ---- */
Test(limit, allows_exactly_the_limit_and_refuses_one_byte_more)
{
    stack_t_ s;
    base_make(&s);
    ps_resource_t *l;
    cr_assert_eq(ps_limit_create("cap", s.arena, 1000, &l), PS_OK);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(l, 600, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(l, 400, PS_STREAM_NONE, &b), PS_OK, "exactly the limit fits");
    FILE *tmp = tmpfile();
    ps_message_set_fd(fileno(tmp));
    int status = ps_allocate(l, 1, PS_STREAM_NONE, &c);
    ps_message_set_fd(2);
    cr_assert_eq(status, PS_ENOMEM);
    char *text = slurp(tmp);
    cr_assert(strstr(text, "poolshim: warning: limit 'cap'"), "got: %s", text);
    cr_assert(strstr(text, "(1000 bytes)"), "names the limit: %s", text);
    cr_assert_eq(strchr(text, '\n'), strrchr(text, '\n'), "one line: %s", text);
    ps_resource_info_t info = {0};
    ps_query(l, &info);
    cr_assert_eq(info.bytes_in_use, 768 + 512, "the refused request reached nothing");
    /* state unchanged: freeing 400 makes room for 400, not 401 */
    cr_assert_eq(ps_deallocate(l, b, 400, PS_STREAM_NONE), PS_OK);
    ps_verbosity = -1;
    cr_assert_eq(ps_allocate(l, 401, PS_STREAM_NONE, &c), PS_ENOMEM);
    cr_assert_eq(ps_allocate(l, 400, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(ps_deallocate(l, a, 600, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(l, c, 400, PS_STREAM_NONE), PS_OK);
    fclose(tmp);
    ps_destroy(l);
    base_unmake(&s);
}

/* ---- stats ---- */
Test(stats, counts_current_peak_and_total_after_a_known_sequence)
{
    stack_t_ s;
    base_make(&s);
    ps_resource_t *st;
    cr_assert_eq(ps_stats_create("stats", s.arena, &st), PS_OK);
    void *a, *b, *c, *d;
    cr_assert_eq(ps_allocate(st, 100, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(st, 200, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_allocate(st, 300, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(ps_deallocate(st, b, 200, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(st, 50, PS_STREAM_NONE, &d), PS_OK);
    cr_assert_eq(ps_deallocate(st, (char *)a + 1, 100, PS_STREAM_NONE), PS_EINVAL, "bad free not counted");
    ps_stats_t x;
    ps_stats_get(st, &x);
    cr_assert_eq(x.bytes_requested.current, 450);
    cr_assert_eq(x.bytes_requested.peak, 600);
    cr_assert_eq(x.bytes_requested.total, 650);
    cr_assert_eq(x.bytes_allocated.current, 256 + 512 + 256);
    cr_assert_eq(x.allocations.current, 3);
    cr_assert_eq(x.allocations.peak, 3);
    cr_assert_eq(x.allocations.total, 4);
    cr_assert_eq(x.frees, 1);
    cr_assert_eq(x.upstream.bytes_in_use, 256 + 512 + 256, "the arena's rounding, via its query");
    cr_assert_eq(x.upstream.bytes_reserved, 16 * PS_MiB);

    FILE *tmp = tmpfile();
    ps_stats_write_json(tmp, 3, &x);
    char *json = slurp(tmp);
    cr_assert(strstr(json, "{\"device\": 3, \"bytes_requested\": {\"current\": 450, \"peak\": 600, \"total\": 650}"), "%s", json);
    cr_assert(strstr(json, "\"allocations\": {\"current\": 3, \"peak\": 3, \"total\": 4}"), "%s", json);
    cr_assert(strstr(json, "\"bytes_reserved\": 16777216"), "%s", json);
    fclose(tmp);
    tmp = tmpfile();
    ps_stats_write_text(tmp, 3, &x);
    char *text = slurp(tmp);
    cr_assert(strstr(text, "device 3"), "%s", text);
    cr_assert(strstr(text, "  bytes_requested             450 B          600 B          650 B\n"), "%s", text);
    cr_assert(strstr(text, "16.0 MiB"), "%s", text);
    fclose(tmp);
    ps_destroy(st);
    base_unmake(&s);
}

/* Threads count in slots of their own (core/stats.c): the sums are exact
 * once they stopped, threads that exited leave their counts behind, and the
 * peak is within (threads + 1) flush thresholds of the true one. */
#define STATS_THREADS 8
#define STATS_ROUNDS 200
typedef struct stats_worker {
    ps_resource_t *stats; /* the adaptor under test */
    size_t size;          /* this thread's block size */
} stats_worker_t;

static void *stats_worker(void *arg)
{
    stats_worker_t *w = arg;
    void *p[4];
    for (int round = 0; round < STATS_ROUNDS; round++) {
        for (int i = 0; i < 4; i++)
            cr_assert_eq(ps_allocate(w->stats, w->size, PS_STREAM_NONE, &p[i]), PS_OK);
        for (int i = 0; i < 3; i++) /* one of the four stays until the end */
            cr_assert_eq(ps_deallocate(w->stats, p[i], w->size, PS_STREAM_NONE), PS_OK);
        if (round == STATS_ROUNDS - 1)
            break;
        cr_assert_eq(ps_deallocate(w->stats, p[3], w->size, PS_STREAM_NONE), PS_OK);
    }
    return p[3];
}

Test(stats, sums_of_many_threads_are_exact_and_the_peak_within_its_bound)
{
    stack_t_ s;
    base_make(&s);
    ps_resource_t *st;
    cr_assert_eq(ps_stats_create("stats", s.arena, &st), PS_OK);
    pthread_t threads[STATS_THREADS];
    stats_worker_t work[STATS_THREADS];
    void *left[STATS_THREADS];
    int64_t live_bytes = 0, total_bytes = 0, allocated_bytes = 0;
    for (int i = 0; i < STATS_THREADS; i++) {
        work[i] = (stats_worker_t){.stats = st, .size = 1000 + 4096 * (size_t)i};
        live_bytes += (int64_t)work[i].size;
        total_bytes += 4 * STATS_ROUNDS * (int64_t)work[i].size;
        allocated_bytes += (int64_t)ps_align_up(work[i].size, 256);
        cr_assert_eq(pthread_create(&threads[i], NULL, stats_worker, &work[i]), 0);
    }
    for (int i = 0; i < STATS_THREADS; i++)
        cr_assert_eq(pthread_join(threads[i], &left[i]), 0); /* the threads are gone: their slots stay */
    ps_stats_t x;
    ps_stats_get(st, &x);
    cr_assert_eq(x.allocations.current, STATS_THREADS);
    cr_assert_eq(x.allocations.total, 4 * STATS_ROUNDS * STATS_THREADS);
    cr_assert_eq(x.frees, (4 * STATS_ROUNDS - 1) * STATS_THREADS);
    cr_assert_eq(x.bytes_requested.current, live_bytes);
    cr_assert_eq(x.bytes_requested.total, total_bytes);
    cr_assert_eq(x.bytes_allocated.current, allocated_bytes);
    /* the true peak lies between 4 blocks of every thread at once and 4
     * blocks of each; (threads + 1) thresholds of 4 MiB either side */
    int64_t most = 4 * (total_bytes / (4 * STATS_ROUNDS)), bound = (STATS_THREADS + 1) * ((int64_t)4 << 20);
    cr_assert_geq(x.bytes_requested.peak, live_bytes, "%lld", (long long)x.bytes_requested.peak);
    cr_assert_leq(x.bytes_requested.peak, most + bound, "%lld", (long long)x.bytes_requested.peak);
    cr_assert_geq(x.allocations.peak, STATS_THREADS);
    cr_assert_leq(x.allocations.peak, 4 * STATS_THREADS + (STATS_THREADS + 1) * 64);
    /* a new thread takes over a slot: nothing counted twice or lost */
    cr_assert_eq(pthread_create(&threads[0], NULL, stats_worker, &work[0]), 0);
    void *again;
    cr_assert_eq(pthread_join(threads[0], &again), 0);
    ps_stats_get(st, &x);
    cr_assert_eq(x.allocations.current, STATS_THREADS + 1);
    cr_assert_eq(x.allocations.total, 4 * STATS_ROUNDS * (STATS_THREADS + 1));
    cr_assert_eq(ps_deallocate(st, again, work[0].size, PS_STREAM_NONE), PS_OK);
    for (int i = 0; i < STATS_THREADS; i++)
        cr_assert_eq(ps_deallocate(st, left[i], work[i].size, PS_STREAM_NONE), PS_OK);
    ps_stats_get(st, &x);
    cr_assert_eq(x.bytes_requested.current, 0);
    cr_assert_eq(x.bytes_allocated.current, 0);
    cr_assert_eq(x.allocations.current, 0);
    ps_destroy(st);
    base_unmake(&s);
}

Test(stats, one_thread_keeps_the_exact_peak_across_flushes)
{
    stack_t_ s;
    base_make(&s);
    ps_resource_t *st;
    cr_assert_eq(ps_stats_create("stats", s.arena, &st), PS_OK);
    /* 3 MiB, then 5 MiB (past the flush threshold), free all, then 2 MiB:
     * the peak is 8 MiB whichever of them were flushed */
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(st, 3 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(st, 5 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_deallocate(st, a, 3 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(st, b, 5 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(st, 2 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    for (int i = 0; i < 100; i++) { /* small pairs: 99 allocations at most, never flushed */
        void *p;
        cr_assert_eq(ps_allocate(st, 1000, PS_STREAM_NONE, &p), PS_OK);
        cr_assert_eq(ps_deallocate(st, p, 1000, PS_STREAM_NONE), PS_OK);
    }
    ps_stats_t x;
    ps_stats_get(st, &x);
    cr_assert_eq(x.bytes_requested.peak, (int64_t)(8 * PS_MiB));
    cr_assert_eq(x.bytes_requested.current, (int64_t)(2 * PS_MiB));
    cr_assert_eq(x.allocations.peak, 2);
    cr_assert_eq(x.allocations.total, 103);
    cr_assert_eq(ps_deallocate(st, c, 2 * PS_MiB, PS_STREAM_NONE), PS_OK);
    ps_destroy(st);
    base_unmake(&s);
}

Test(stats, times_are_sampled_estimates_and_can_be_switched_off)
{
    stack_t_ s;
    base_make(&s);
    ps_resource_t *st;
    cr_assert_eq(ps_stats_create("stats", s.arena, &st), PS_OK);
    for (int i = 0; i < 1000; i++) {
        void *p;
        cr_assert_eq(ps_allocate(st, 512, PS_STREAM_NONE, &p), PS_OK);
        cr_assert_eq(ps_deallocate(st, p, 512, PS_STREAM_NONE), PS_OK);
    }
    ps_stats_t x;
    ps_stats_get(st, &x);
    cr_assert_gt(x.alloc_ns, 0, "16 of the 1000 allocations were timed, the total estimated from them");
    cr_assert_gt(x.free_ns, 0);
    ps_destroy(st);
    ps_stats_time_adaptors(0);
    cr_assert_eq(ps_stats_create("stats", s.arena, &st), PS_OK);
    for (int i = 0; i < 100; i++) {
        void *p;
        cr_assert_eq(ps_allocate(st, 512, PS_STREAM_NONE, &p), PS_OK);
        cr_assert_eq(ps_deallocate(st, p, 512, PS_STREAM_NONE), PS_OK);
    }
    ps_stats_get(st, &x);
    ps_stats_time_adaptors(1);
    cr_assert_eq(x.alloc_ns, 0, "no clock read");
    cr_assert_eq(x.allocations.total, 100, "still counted");
    ps_destroy(st);
    base_unmake(&s);
}

/* ---- track ---- */
/* Exported (and kept out of line) so dladdr can name it in the report. */
__attribute__((visibility("default"), noinline)) void *planted_leak_site(ps_resource_t *r, size_t size)
{
    void *p = NULL;
    cr_assert_eq(ps_allocate(r, size, PS_STREAM_NONE, &p), PS_OK);
    __asm__ volatile("" ::: "memory"); /* not a tail call: keep this frame */
    return p;
}

Test(track, reports_a_planted_leak_with_its_call_site)
{
    stack_t_ s;
    base_make(&s);
    ps_resource_t *t;
    cr_assert_eq(ps_track_create("track", s.arena, 8, &t), PS_OK);
    void *freed, *leaked[2];
    cr_assert_eq(ps_allocate(t, 4096, PS_STREAM_NONE, &freed), PS_OK);
    volatile int times = 2; /* not unrolled: one call site, twice */
    for (int i = 0; i < times; i++)
        leaked[i] = planted_leak_site(t, i ? 3000 : 1000);
    cr_assert_eq(ps_deallocate(t, freed, 4096, PS_STREAM_NONE), PS_OK);
    FILE *tmp = tmpfile();
    size_t leaks = ps_track_report(t, tmp);
    char *text = slurp(tmp);
    cr_assert_eq(leaks, 2);
    cr_assert(strstr(text, "2 allocations (3.91 KiB) never freed, from 1 call site\n"), "%s", text);
    cr_assert(strstr(text, "2 allocations, 3.91 KiB, at:\n    #0 planted_leak_site+0x"), "grouped by call site: %s", text);
    fclose(tmp);
    cr_assert_eq(ps_deallocate(t, leaked[0], 1000, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(t, leaked[1], 3000, PS_STREAM_NONE), PS_OK);
    tmp = tmpfile();
    cr_assert_eq(ps_track_report(t, tmp), 0);
    cr_assert(strstr(slurp(tmp), "no leaks"));
    fclose(tmp);
    ps_destroy(t);
    base_unmake(&s);
}

/* ---- log ---- */
typedef struct event {
    const char *action; /* allocate / free / allocate failure */
    uintptr_t ptr;      /* pointer */
    size_t size;        /* bytes */
    uintptr_t stream;   /* as logged */
} event_t;

Test(log, file_parses_back_to_the_same_events)
{
    stack_t_ s;
    base_make(&s);
    ps_resource_t *cap, *lg;
    cr_assert_eq(ps_limit_create("cap", s.arena, 1 << 20, &cap), PS_OK);
    char path[64];
    snprintf(path, sizeof path, "/tmp/poolshim-log-%d.csv", (int)getpid());
    cr_assert_eq(ps_log_create("log", cap, path, &lg), PS_OK);
    event_t want[6];
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(lg, 1000, PS_STREAM_NONE, &a), PS_OK);
    want[0] = (event_t){"allocate", (uintptr_t)a, 1000, 0};
    cr_assert_eq(ps_allocate(lg, 77, 0xabc0, &b), PS_OK);
    want[1] = (event_t){"allocate", (uintptr_t)b, 77, 0xabc0};
    ps_verbosity = -1;
    cr_assert_eq(ps_allocate(lg, 2 << 20, PS_STREAM_NONE, &c), PS_ENOMEM);
    want[2] = (event_t){"allocate failure", 0, 2 << 20, 0};
    cr_assert_eq(ps_deallocate(lg, b, 77, 0xabc0), PS_OK);
    want[3] = (event_t){"free", (uintptr_t)b, 77, 0xabc0};
    cr_assert_eq(ps_deallocate(lg, a, 1000, PS_STREAM_NONE), PS_OK);
    want[4] = (event_t){"free", (uintptr_t)a, 1000, 0};
    cr_assert_eq(ps_log_flush(lg), PS_OK);

    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    char line[256];
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert_str_eq(line, "Thread,Time,Action,Pointer,Size,Stream\n");
    int n = 0;
    long tid0 = 0;
    while (fgets(line, sizeof line, f)) {
        long tid;
        int hh, mm, ss;
        char micro[16], action[32];
        unsigned long ptr, stream;
        size_t size;
        int fields = sscanf(line, "%ld,%d:%d:%d.%6[0-9],%31[^,],0x%lx,%zu,0x%lx", &tid, &hh, &mm, &ss,
                            micro, action, &ptr, &size, &stream);
        cr_assert_eq(fields, 9, "line %d: %s", n, line);
        cr_assert_eq(strlen(micro), 6, "microseconds: %s", line);
        cr_assert(hh < 24 && mm < 60 && ss < 61);
        cr_assert_lt(n, 5, "more lines than events");
        cr_assert_str_eq(action, want[n].action);
        cr_assert_eq(ptr, want[n].ptr, "line %d", n);
        cr_assert_eq(size, want[n].size);
        cr_assert_eq(stream, want[n].stream);
        if (n == 0)
            tid0 = tid;
        cr_assert_eq(tid, tid0, "one thread");
        cr_assert_gt(tid, 0);
        n++;
    }
    cr_assert_eq(n, 5);
    fclose(f);
    ps_destroy(lg);
    ps_destroy(cap);
    unlink(path);
    char companion[128];
    cr_assert_eq(ps_log_reserved_path(path, companion, sizeof companion), PS_OK);
    unlink(companion);
    base_unmake(&s);
}

Test(log, destroy_flushes_what_is_buffered)
{
    stack_t_ s;
    base_make(&s);
    ps_resource_t *lg;
    char path[64];
    snprintf(path, sizeof path, "/tmp/poolshim-log2-%d.csv", (int)getpid());
    cr_assert_eq(ps_log_create("log", s.arena, path, &lg), PS_OK);
    for (int i = 0; i < 5000; i++) { /* more than the buffer holds */
        void *p;
        cr_assert_eq(ps_allocate(lg, 512, PS_STREAM_NONE, &p), PS_OK);
        cr_assert_eq(ps_deallocate(lg, p, 512, PS_STREAM_NONE), PS_OK);
    }
    ps_destroy(lg);
    FILE *f = fopen(path, "r");
    char line[256];
    int lines = 0;
    while (fgets(line, sizeof line, f))
        lines++;
    fclose(f);
    cr_assert_eq(lines, 1 + 10000);
    unlink(path);
    char companion[128];
    cr_assert_eq(ps_log_reserved_path(path, companion, sizeof companion), PS_OK);
    unlink(companion);
    base_unmake(&s);
}

/* Reads PATH.reserved.csv into rows; returns the count. */
typedef struct reserved_row {
    char action[16];        /* start, grow, release, end */
    unsigned long long bytes, reserved, peak;
} reserved_row_t;

static int read_reserved(const char *log_path, reserved_row_t *rows, int max)
{
    char path[128];
    cr_assert_eq(ps_log_reserved_path(log_path, path, sizeof path), PS_OK);
    cr_assert_str_eq(path + strlen(log_path), ".reserved.csv");
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no companion file %s", path);
    char line[256];
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert_str_eq(line, "Time,Action,Bytes,Reserved,Peak\n");
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        int hh, mm, ss;
        char micro[16];
        cr_assert_lt(n, max, "more rows than expected");
        int fields = sscanf(line, "%d:%d:%d.%6[0-9],%15[^,],%llu,%llu,%llu", &hh, &mm, &ss, micro, rows[n].action,
                            &rows[n].bytes, &rows[n].reserved, &rows[n].peak);
        cr_assert_eq(fields, 8, "row %d: %s", n, line);
        n++;
    }
    fclose(f);
    unlink(path);
    return n;
}

Test(log, companion_file_records_every_growth_and_release_of_the_stack_below)
{
    stack_t_ s;
    base_make(&s);
    ps_resource_t *lg;
    char path[64];
    snprintf(path, sizeof path, "/tmp/poolshim-log3-%d.csv", (int)getpid());
    /* over the `cuda` upstream every allocate and free is one device call */
    cr_assert_eq(ps_log_create("log", s.up, path, &lg), PS_OK);
    void *a, *b;
    cr_assert_eq(ps_allocate(lg, 1000, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(lg, 3000, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_deallocate(lg, a, 1000, PS_STREAM_NONE), PS_OK);
    ps_destroy(lg); /* b stays live: the end row gives its 3000 bytes back */
    reserved_row_t rows[8];
    int n = read_reserved(path, rows, 8);
    cr_assert_eq(n, 5);
    const reserved_row_t want[5] = {{"start", 0, 0, 0},        {"grow", 1000, 1000, 1000}, {"grow", 3000, 4000, 4000},
                                    {"release", 1000, 3000, 4000}, {"end", 3000, 0, 4000}};
    for (int i = 0; i < n; i++) {
        cr_expect_str_eq(rows[i].action, want[i].action, "row %d", i);
        cr_expect_eq(rows[i].bytes, want[i].bytes, "row %d bytes", i);
        cr_expect_eq(rows[i].reserved, want[i].reserved, "row %d reserved", i);
        cr_expect_eq(rows[i].peak, want[i].peak, "row %d peak", i);
    }
    unlink(path);
    base_unmake(&s);
}

Test(log, companion_file_stays_quiet_while_the_allocator_reuses_its_memory)
{
    stack_t_ s;
    base_make(&s);
    ps_resource_t *lg;
    char path[64];
    snprintf(path, sizeof path, "/tmp/poolshim-log4-%d.csv", (int)getpid());
    cr_assert_eq(ps_log_create("log", s.arena, path, &lg), PS_OK);
    for (int i = 0; i < 5000; i++) {
        void *p;
        cr_assert_eq(ps_allocate(lg, 512, PS_STREAM_NONE, &p), PS_OK);
        cr_assert_eq(ps_deallocate(lg, p, 512, PS_STREAM_NONE), PS_OK);
    }
    ps_resource_info_t info = {0};
    ps_query(s.arena, &info);
    cr_assert_gt(info.bytes_reserved, 0);
    ps_destroy(lg);
    reserved_row_t rows[16];
    int n = read_reserved(path, rows, 16);
    cr_assert_geq(n, 3, "start, at least one growth, end");
    cr_expect_lt(n, 10, "10000 calls served from the arena's memory write a row only when it grows");
    cr_expect_str_eq(rows[0].action, "start");
    cr_expect_str_eq(rows[1].action, "grow");
    cr_expect_eq(rows[n - 2].reserved, info.bytes_reserved, "the last level is what the arena holds");
    cr_expect_str_eq(rows[n - 1].action, "end");
    cr_expect_eq(rows[n - 1].reserved, 0);
    cr_expect_eq(rows[n - 1].peak, info.peak_bytes_reserved);
    unlink(path);
    base_unmake(&s);
}
