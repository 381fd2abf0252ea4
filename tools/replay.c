/* Replay of an allocation log (see replay.h).
 *
 * Algorithm:
 *   1. Walk the events of one device in file order on one thread (the
 *      log's order is the order the program's calls completed; replaying
 *      several threads concurrently would not reproduce it either).
 *   2. allocate: time ps_allocate(size, logged stream); remember
 *      logged pointer -> (replayed pointer, size, stream) in a hash map.
 *      A refusal is counted as a failure (the first one's line and size
 *      kept) and its later free is skipped.
 *   3. free: look the logged pointer up, time ps_deallocate with the
 *      allocation's size and stream. Frees of unknown pointers are
 *      skipped and counted (logs cut at the start have them).
 *   4. requested bytes are the log's allocations the stack served (all of
 *      them without a stack): a refused one is not live, as in the program
 *      whose call failed; each time they reach a new peak the stack is
 *      queried for free and largest-free bytes, giving fragmentation at
 *      the peak.
 *   5. At the end everything still live is freed (not timed).
 * With options->threads, each logged thread's calls run on a host thread
 * of its own (created at its first event): the walk hands one call at a
 * time to that thread and waits for it (a baton, as PyTorch's main and
 * autograd threads take turns), so per-thread state in the stack (the
 * arena's thread arenas, the pool's thread caches) sees the program's
 * threads; the order stays the log's. The final frees of step 5 run on
 * the walking thread.
 * With a simulated device given, its clock is moved to each event's log
 * time before the event (a lagging simulated GPU completes its fences in
 * the log's time; without a Time column the clock stays at 0).
 * Guarantees: the stack sees only valid calls (never a free of a pointer
 * it did not return); times include one clock read (~20 ns) per call.
 */
#include "replay.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sim/fake_gpu.h"
#include "cli.h"

/* One live allocation of the replay. */
typedef struct live_entry {
    uint64_t logged;    /* pointer in the log; 0 = empty slot, UINT64_MAX = deleted */
    void *replayed;     /* pointer from the stack, NULL when the stack refused */
    uint64_t size;      /* bytes asked for */
    uint64_t stream;    /* stream it was allocated on */
    int counted;        /* 1: its size is in the requested bytes (served, or no stack) */
} live_entry_t;

/* Open-addressing map from logged pointer to live_entry_t. */
typedef struct live_map {
    live_entry_t *slots; /* capacity entries */
    size_t capacity;     /* power of two */
    size_t used;         /* live + deleted */
} live_map_t;

/* The stream a logged event is replayed on. The log adaptor writes a
 * cudaMalloc/cudaFree (PS_STREAM_NONE) as stream 0x0, as RMM logs its
 * default stream, so 0x0 replays as cudaMalloc/cudaFree: the policy under
 * test then decides when a freed block may be reused, as it did in the
 * recorded program. (Replaying it as a stream-ordered call on the legacy
 * stream hid what the free policy costs: 1.01x instead of the GPU's 1.8x
 * on a PyTorch transformer log.) */
static ps_stream_t replay_stream(uint64_t logged)
{
    return logged == 0 ? PS_STREAM_NONE : (ps_stream_t)logged;
}

static size_t map_slot(uint64_t key, size_t capacity)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (capacity - 1);
}

static live_entry_t *map_find(live_map_t *map, uint64_t key)
{
    if (!map->capacity)
        return NULL;
    for (size_t i = map_slot(key, map->capacity);; i = (i + 1) & (map->capacity - 1)) {
        if (map->slots[i].logged == key)
            return &map->slots[i];
        if (map->slots[i].logged == 0)
            return NULL;
    }
}

static int map_insert(live_map_t *map, const live_entry_t *entry)
{
    if ((map->used + 1) * 2 > map->capacity) {
        size_t capacity = map->capacity ? map->capacity * 2 : 1024;
        live_entry_t *slots = calloc(capacity, sizeof *slots);
        if (!slots)
            return -1;
        size_t used = 0;
        for (size_t i = 0; i < map->capacity; i++) {
            live_entry_t *e = &map->slots[i];
            if (e->logged == 0 || e->logged == UINT64_MAX)
                continue;
            size_t j = map_slot(e->logged, capacity);
            while (slots[j].logged)
                j = (j + 1) & (capacity - 1);
            slots[j] = *e;
            used++;
        }
        free(map->slots);
        map->slots = slots;
        map->capacity = capacity;
        map->used = used;
    }
    size_t i = map_slot(entry->logged, map->capacity);
    while (map->slots[i].logged != 0 && map->slots[i].logged != UINT64_MAX)
        i = (i + 1) & (map->capacity - 1);
    if (map->slots[i].logged == 0)
        map->used++;
    map->slots[i] = *entry;
    return 0;
}

/* Pointer 0 is a legal logged value (size-0 allocations may log it), so keys are
 * shifted by one; memlog rejects the two largest pointers, so keys never hit
 * the empty (0) or deleted (UINT64_MAX) marks. */
static uint64_t key_of(uint64_t pointer) { return pointer + 1; }

static uint32_t saturate_ns(uint64_t ns) { return ns > UINT32_MAX ? UINT32_MAX : (uint32_t)ns; }

/* ---- the baton (options->threads) ---- */

#define MAX_REPLAY_THREADS 64

typedef struct replay_call {
    int is_free;          /* 1: ps_deallocate, 0: ps_allocate */
    ps_resource_t *top;   /* the stack */
    size_t size;          /* bytes */
    ps_stream_t stream;   /* stream */
    void *ptr;            /* free: the pointer; allocate: the result */
    int rc;               /* the call's status */
    uint64_t took;        /* its time in ns */
} replay_call_t;

typedef struct baton {
    pthread_mutex_t lock;               /* guards everything below */
    pthread_cond_t turn;                /* `holder` changed */
    int holder;                         /* index of the thread that runs now; -1: the walker */
    int quit;                           /* the workers exit */
    replay_call_t call;                 /* the call handed over */
    size_t count;                       /* workers started */
    uint64_t logged[MAX_REPLAY_THREADS];/* their logged thread ids */
    pthread_t threads[MAX_REPLAY_THREADS]; /* their host threads */
} baton_t;

typedef struct worker_arg {
    baton_t *baton; /* shared */
    int index;      /* this worker */
} worker_arg_t;

static void run_call(replay_call_t *c)
{
    uint64_t start = ps_now_ns();
    if (c->is_free)
        c->rc = ps_deallocate(c->top, c->ptr, c->size, c->stream);
    else
        c->rc = ps_allocate(c->top, c->size, c->stream, &c->ptr);
    c->took = ps_now_ns() - start;
}

static void *worker_main(void *p)
{
    worker_arg_t *arg = p;
    baton_t *b = arg->baton;
    int me = arg->index;
    free(arg);
    pthread_mutex_lock(&b->lock);
    for (;;) {
        while (b->holder != me && !b->quit)
            pthread_cond_wait(&b->turn, &b->lock);
        if (b->quit)
            break;
        run_call(&b->call);
        b->holder = -1;
        pthread_cond_broadcast(&b->turn);
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

/* Runs `c` on the host thread of logged thread `thread` (started at its
 * first call), or here when there is no baton or no room for another
 * thread. */
static void call_on(baton_t *b, uint64_t thread, replay_call_t *c)
{
    if (!b) {
        run_call(c);
        return;
    }
    int index = -1;
    for (size_t i = 0; i < b->count; i++)
        if (b->logged[i] == thread)
            index = (int)i;
    if (index < 0 && b->count < MAX_REPLAY_THREADS) {
        worker_arg_t *arg = malloc(sizeof *arg);
        if (arg) {
            *arg = (worker_arg_t){b, (int)b->count};
            if (pthread_create(&b->threads[b->count], NULL, worker_main, arg) == 0) {
                b->logged[b->count] = thread;
                index = (int)b->count++;
            } else {
                free(arg);
            }
        }
    }
    if (index < 0) {
        run_call(c);
        return;
    }
    pthread_mutex_lock(&b->lock);
    b->call = *c;
    b->holder = index;
    pthread_cond_broadcast(&b->turn);
    while (b->holder != -1)
        pthread_cond_wait(&b->turn, &b->lock);
    *c = b->call;
    pthread_mutex_unlock(&b->lock);
}

static void baton_finish(baton_t *b)
{
    pthread_mutex_lock(&b->lock);
    b->quit = 1;
    pthread_cond_broadcast(&b->turn);
    pthread_mutex_unlock(&b->lock);
    for (size_t i = 0; i < b->count; i++)
        pthread_join(b->threads[i], NULL);
    pthread_cond_destroy(&b->turn);
    pthread_mutex_destroy(&b->lock);
}

static void free_entry(ps_resource_t *top, live_entry_t *entry, replay_stats_t *s, int timed, baton_t *baton,
                       uint64_t thread)
{
    if (entry->replayed && top) {
        replay_call_t c = {1, top, (size_t)entry->size, replay_stream(entry->stream), entry->replayed, 0, 0};
        call_on(timed ? baton : NULL, thread, &c);
        if (timed) {
            uint64_t took = c.took;
            s->free_ns += took;
            if (s->free_call_ns)
                s->free_call_ns[s->frees] = saturate_ns(took);
        }
    }
    entry->logged = UINT64_MAX;
}

static int compare_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

double replay_quantile_ns(uint32_t *values, size_t n, double q)
{
    if (!n)
        return 0;
    qsort(values, n, sizeof *values, compare_u32);
    size_t rank = (size_t)(q * (double)n + 0.999999); /* nearest rank, 1-based */
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return values[rank - 1];
}

void replay_stats_free(replay_stats_t *stats)
{
    if (!stats)
        return;
    free(stats->samples);
    free(stats->alloc_call_ns);
    free(stats->free_call_ns);
    stats->samples = NULL;
    stats->alloc_call_ns = stats->free_call_ns = NULL;
    stats->sample_count = 0;
}

int replay_run(const memlog_t *log, int device, ps_resource_t *top, ps_gpu_ops_t *sim_gpu,
               int want_samples, replay_stats_t *out)
{
    replay_options_t options = {.sim_gpu = sim_gpu, .want_samples = want_samples};
    return replay_run_with(log, device, top, &options, out);
}

/* The first pool in `top`'s stack (top, then its upstreams), or NULL. */
static ps_resource_t *stack_pool(ps_resource_t *top)
{
    ps_pool_layout_t layout;
    for (ps_resource_t *r = top; r; r = r->upstream)
        if (ps_pool_layout(r, &layout) == PS_OK)
            return r;
    return NULL;
}

/* One replay as it goes (replay_run_with). */
typedef struct run_state {
    const memlog_t *log;              /* the log */
    ps_resource_t *top;               /* the stack, or NULL (no stack: the requested bytes alone) */
    ps_resource_t *pool;              /* --breakdown: the pool whose layout is taken at peaks, or NULL */
    const replay_options_t *options;  /* what else to do */
    replay_stats_t s;                 /* what it measured so far */
    live_map_t map;                   /* logged pointer -> replayed block */
    baton_t *baton;                   /* --threads: the calls' host threads, or NULL */
    uint64_t requested;               /* bytes live per the log */
    uint64_t last_reserved;           /* the stack's reserved bytes after the last event */
    size_t events;                    /* the device's events in the log */
    size_t sample_capacity;           /* entries allocated in s.samples */
} run_state_t;

/* An allocate event: replayed (timed), its entry kept; a pointer still
 * live in the log is taken as freed first. -1: out of memory. */
static int replay_allocate(run_state_t *st, const memlog_event_t *e)
{
    replay_stats_t *s = &st->s;
    live_entry_t *old = map_find(&st->map, key_of(e->pointer));
    if (old) { /* the log lost a free: treat the old block as freed */
        s->double_allocations++;
        if (!s->first_problem_line)
            s->first_problem_line = e->line;
        if (old->counted)
            st->requested -= old->size;
        free_entry(st->top, old, s, 0, NULL, 0);
    }
    live_entry_t entry = {key_of(e->pointer), NULL, e->size, e->stream, 1};
    if (st->top) {
        replay_call_t c = {0, st->top, (size_t)e->size, replay_stream(e->stream), NULL, 0, 0};
        call_on(st->baton, e->thread, &c);
        entry.replayed = c.rc == PS_OK ? c.ptr : NULL;
        s->alloc_ns += c.took;
        if (s->alloc_call_ns)
            s->alloc_call_ns[s->allocations] = saturate_ns(c.took);
        if (c.rc != PS_OK) {
            entry.counted = 0;
            if (!s->failures++) {
                s->first_failure_line = e->line;
                s->first_failure_size = e->size;
            }
        }
    }
    s->allocations++;
    if (map_insert(&st->map, &entry) != 0) {
        if (entry.replayed)
            ps_deallocate(st->top, entry.replayed, (size_t)entry.size, replay_stream(entry.stream));
        return -1;
    }
    if (entry.counted)
        st->requested += e->size;
    if (st->requested > s->peak_requested) {
        s->peak_requested = st->requested;
        if (st->top) {
            ps_resource_info_t info;
            memset(&info, 0, sizeof info);
            ps_query(st->top, &info);
            s->free_at_peak = info.bytes_reserved > info.bytes_in_use ? info.bytes_reserved - info.bytes_in_use : 0;
            s->largest_free_at_peak = info.largest_free_block;
        }
    }
    return 0;
}

/* A free event: the live entry's block freed (timed); an unknown pointer
 * is counted. */
static void replay_free(run_state_t *st, const memlog_event_t *e)
{
    replay_stats_t *s = &st->s;
    live_entry_t *entry = map_find(&st->map, key_of(e->pointer));
    if (!entry) {
        s->unknown_frees++;
        if (!s->first_problem_line)
            s->first_problem_line = e->line;
        return;
    }
    if (entry->counted)
        st->requested -= entry->size;
    free_entry(st->top, entry, s, 1, st->baton, e->thread);
    s->frees++;
}

/* After each event: the stack's counters and peaks, the simulated
 * device's waits, the sample. -1: out of memory. */
static int after_event(run_state_t *st, const memlog_event_t *e)
{
    replay_stats_t *s = &st->s;
    if (st->top) {
        ps_resource_info_t info;
        memset(&info, 0, sizeof info);
        ps_query(st->top, &info);
        st->last_reserved = info.bytes_reserved;
        if (info.bytes_reserved > s->peak_reserved) {
            s->peak_reserved = info.bytes_reserved;
            if (st->pool)
                ps_pool_layout(st->pool, &s->at_peak);
        }
        if (info.peak_bytes_reserved > s->peak_reserved)
            s->peak_reserved = info.peak_bytes_reserved;
        /* the quarter this event falls in gets what the stack took since the last one */
        size_t quarter = st->events ? (size_t)((s->events - 1) * 4 / st->events) : 0;
        s->upstream_allocs_quarters[quarter < 4 ? quarter : 3] += info.upstream_allocs - s->counters.upstream_allocs;
        s->counters = info;
    }
    ps_gpu_ops_t *sim_gpu = st->options->sim_gpu;
    if (sim_gpu) {
        s->device_syncs = ps_fake_gpu_device_syncs(sim_gpu);
        s->wait_ns = ps_fake_gpu_barrier_wait_ns(sim_gpu);
        s->wait_as_sync_ns = ps_fake_gpu_wait_instead_sync_ns(sim_gpu);
        s->sync_ns = ps_fake_gpu_device_sync_ns(sim_gpu);
    }
    if (!st->options->want_samples)
        return 0;
    if (s->sample_count == st->sample_capacity) {
        size_t grown = st->sample_capacity ? st->sample_capacity * 2 : 1024;
        replay_sample_t *samples = realloc(s->samples, grown * sizeof *samples);
        if (!samples)
            return -1;
        s->samples = samples;
        st->sample_capacity = grown;
    }
    replay_sample_t *sample = &s->samples[s->sample_count++];
    sample->time_s = st->log->has_time ? e->time_s : (double)s->events;
    sample->requested = st->requested;
    sample->reserved = st->last_reserved;
    return 0;
}

int replay_run_with(const memlog_t *log, int device, ps_resource_t *top, const replay_options_t *options,
                    replay_stats_t *out)
{
    run_state_t st = {.log = log, .top = top, .options = options};
    replay_stats_t *s = &st.s;
    s->device = device;
    for (size_t i = 0; i < log->count; i++)
        st.events += log->events[i].device == device;
    if (options->call_times) {
        s->alloc_call_ns = malloc((st.events ? st.events : 1) * sizeof *s->alloc_call_ns);
        s->free_call_ns = malloc((st.events ? st.events : 1) * sizeof *s->free_call_ns);
        if (!s->alloc_call_ns || !s->free_call_ns) {
            replay_stats_free(s);
            fprintf(stderr, "poolshim: error: replay: out of memory\n");
            return -1;
        }
    }
    if (top)
        snprintf(s->stack, sizeof s->stack, "%s", top->name ? top->name : top->ops->type_name);
    st.pool = options->breakdown ? stack_pool(top) : NULL;
    s->has_layout = st.pool != NULL;
    baton_t baton;
    if (options->threads) {
        memset(&baton, 0, sizeof baton);
        pthread_mutex_init(&baton.lock, NULL);
        pthread_cond_init(&baton.turn, NULL);
        baton.holder = -1;
        st.baton = &baton;
    }
    double first_time = -1, last_time = 0;
    int status = 0;
    for (size_t i = 0; i < log->count && status == 0; i++) {
        const memlog_event_t *e = &log->events[i];
        if (e->device != device)
            continue;
        s->events++;
        if (first_time < 0)
            first_time = e->time_s;
        last_time = e->time_s;
        if (options->sim_gpu && log->has_time)
            ps_fake_gpu_set_clock(options->sim_gpu, (uint64_t)(e->time_s * 1e9 + 0.5));
        if (options->before_event)
            options->before_event(options->context, e);
        if (e->action == MEMLOG_ALLOCATE_FAILURE)
            s->logged_failures++;
        else if (e->action == MEMLOG_ALLOCATE)
            status = replay_allocate(&st, e);
        else
            replay_free(&st, e);
        if (status == 0)
            status = after_event(&st, e);
    }
    for (size_t i = 0; i < st.map.capacity; i++)
        if (st.map.slots[i].logged != 0 && st.map.slots[i].logged != UINT64_MAX)
            free_entry(top, &st.map.slots[i], s, 0, NULL, 0);
    free(st.map.slots);
    if (st.baton)
        baton_finish(st.baton);
    s->duration_s = first_time < 0 ? 0 : last_time - first_time;
    s->fragmentation = s->free_at_peak ? 1.0 - (double)s->largest_free_at_peak / (double)s->free_at_peak : 0;
    if (s->fragmentation < 0)
        s->fragmentation = 0;
    if (status != 0) {
        fprintf(stderr, "poolshim: error: replay: out of memory\n");
        replay_stats_free(s);
        return -1;
    }
    *out = *s;
    return 0;
}

/* ---- rendering ------------------------------------------------------ */

size_t replay_print_failures(FILE *f, const replay_stats_t *results, size_t count)
{
    size_t failed = 0;
    for (size_t i = 0; i < count; i++) {
        const replay_stats_t *r = &results[i];
        if (!r->failures)
            continue;
        char size[32];
        fprintf(f, "FAILED: device %d, stack %s: %llu allocation%s refused, the first at line %u (%s); the "
                   "program would have seen cudaErrorMemoryAllocation there, and the peaks count only what was "
                   "served\n",
                r->device, r->stack, (unsigned long long)r->failures, r->failures == 1 ? "" : "s",
                r->first_failure_line, cli_format_bytes(size, sizeof size, r->first_failure_size));
        failed++;
    }
    return failed;
}

static double per_op_ns(uint64_t ns, uint64_t ops) { return ops ? (double)ns / (double)ops : 0; }

static double per_1000(uint64_t n, uint64_t allocations)
{
    return allocations ? 1000.0 * (double)n / (double)allocations : 0;
}

/* --breakdown: where the reserved bytes were at the peak, and the GPU calls
 * that cost overlap. */
static void print_layout_text(FILE *f, const replay_stats_t *r)
{
    const ps_pool_layout_t *l = &r->at_peak;
    const ps_resource_info_t *counts = &r->counters;
    char a[32], b[32], c[32], d[32], e[32];
    fprintf(f, "device %d at peak reserved %s: in use %s (%.2f%% of it), ready free %s (largest %s)", r->device,
            cli_format_bytes(a, sizeof a, l->reserved), cli_format_bytes(b, sizeof b, l->in_use),
            l->reserved ? 100.0 * (double)l->in_use / (double)l->reserved : 0,
            cli_format_bytes(c, sizeof c, l->ready_free), cli_format_bytes(d, sizeof d, l->largest_ready));
    fprintf(f, ", pending %s, stream free %s\n", cli_format_bytes(a, sizeof a, l->pending),
            cli_format_bytes(b, sizeof b, l->stream_free));
    fprintf(f, "  ready free in whole pieces %s, in partly used pieces %s; whole pieces free after a barrier %s; "
               "unmapped holes %s; small blocks in use %s\n",
            cli_format_bytes(a, sizeof a, l->ready_whole_pieces),
            cli_format_bytes(b, sizeof b, l->ready_free - l->ready_whole_pieces),
            cli_format_bytes(c, sizeof c, l->idle_whole_pieces), cli_format_bytes(d, sizeof d, l->unmapped_holes),
            cli_format_bytes(e, sizeof e, l->small_in_use));
    fprintf(f, "  barriers %llu (%.1f per 1000 allocations), device synchronizes %llu (%.2f per 1000), "
               "remaps without one %llu, remaps that waited for one barrier instead %llu\n",
            (unsigned long long)counts->barriers, per_1000(counts->barriers, r->allocations),
            (unsigned long long)r->device_syncs, per_1000(r->device_syncs, r->allocations),
            (unsigned long long)counts->remaps_idle, (unsigned long long)counts->remap_waits);
    if (counts->remaps_lent)
        fprintf(f, "  remaps that lent busy pieces' memory instead of a wait: %llu\n",
                (unsigned long long)counts->remaps_lent);
    if (counts->remaps_slack)
        fprintf(f, "  growths within remap_slack_percent instead of a remap's wait: %llu\n",
                (unsigned long long)counts->remaps_slack);
    if (r->wait_ns || r->sync_ns || r->wait_as_sync_ns)
        fprintf(f, "  host blocked (GPU lag): %.2f ms in barrier waits (device synchronizes there: %.2f ms), "
                   "%.2f ms in device synchronizes\n",
                (double)r->wait_ns / 1e6, (double)r->wait_as_sync_ns / 1e6, (double)r->sync_ns / 1e6);
}

void replay_print_text(FILE *f, const char *log_name, const memlog_t *log, uint64_t capacity,
                       uint64_t gpu_lag_ns, unsigned busy_streams, const replay_stats_t *results, size_t count)
{
    char a[32], b[32], c[32];
    uint64_t allocations = 0, frees = 0, failures = 0;
    for (size_t i = 0; i < log->count; i++) {
        allocations += log->events[i].action == MEMLOG_ALLOCATE;
        frees += log->events[i].action == MEMLOG_FREE;
        failures += log->events[i].action == MEMLOG_ALLOCATE_FAILURE;
    }
    fprintf(f, "log: %s: %s events (%s allocate, %s free, %llu logged failures), %zu thread%s, "
               "%d device%s\n",
            log_name, cli_format_count(a, sizeof a, log->count), cli_format_count(b, sizeof b, allocations),
            cli_format_count(c, sizeof c, frees), (unsigned long long)failures, log->threads,
            log->threads == 1 ? "" : "s", log->device_count, log->device_count == 1 ? "" : "s");
    if (capacity && gpu_lag_ns)
        fprintf(f, "simulated device: %s (unbacked; GPU lag %s: a fence completes that long after it was "
                   "recorded, in log time)\n",
                cli_format_bytes(a, sizeof a, capacity), cli_format_seconds(b, sizeof b, (double)gpu_lag_ns / 1e9));
    else if (capacity)
        fprintf(f, "simulated device: %s (unbacked, fences complete at once)\n",
                cli_format_bytes(a, sizeof a, capacity));
    if (capacity && busy_streams)
        fprintf(f, "simulated barriers: each joins %u busy stream%s (the eager barrier waits for the share of "
                   "the reserve)\n",
                busy_streams, busy_streams == 1 ? "" : "s");
    int recorded = 0;
    for (size_t i = 0; i < count; i++)
        recorded |= results[i].has_recorded;
    fprintf(f, "\n%-6s  %-16s  %10s  %10s  %14s  %14s  %8s  %14s  %8s  %9s", "device", "stack",
            "alloc/op", "free/op", "peak requested", "peak reserved", "overhead", "fragmentation",
            "failures", "upstream");
    fprintf(f, recorded ? "  %14s  %18s\n" : "\n", "recorded peak", "recorded/requested");
    for (size_t i = 0; i < count; i++) {
        const replay_stats_t *r = &results[i];
        char alloc_op[32], free_op[32], requested[32], reserved[32], overhead[32], frag[32];
        cli_format_seconds(alloc_op, sizeof alloc_op, per_op_ns(r->alloc_ns, r->allocations) / 1e9);
        cli_format_seconds(free_op, sizeof free_op, per_op_ns(r->free_ns, r->frees) / 1e9);
        cli_format_bytes(requested, sizeof requested, r->peak_requested);
        cli_format_bytes(reserved, sizeof reserved, r->peak_reserved);
        if (r->peak_requested)
            snprintf(overhead, sizeof overhead, "%.2fx", (double)r->peak_reserved / (double)r->peak_requested);
        else
            snprintf(overhead, sizeof overhead, "-");
        snprintf(frag, sizeof frag, "%.1f%% of free", r->fragmentation * 100); /* of the free bytes */
        fprintf(f, "%-6d  %-16s  %10s  %10s  %14s  %14s  %8s  %14s  %8llu  %9llu", r->device,
                r->stack, alloc_op, free_op, requested, reserved, overhead, frag,
                (unsigned long long)r->failures, (unsigned long long)r->counters.upstream_allocs);
        if (recorded && r->has_recorded) {
            char real[32], real_overhead[32] = "-";
            if (r->peak_requested)
                snprintf(real_overhead, sizeof real_overhead, "%.2fx",
                         (double)r->recorded_peak_reserved / (double)r->peak_requested);
            fprintf(f, "  %14s  %18s", cli_format_bytes(real, sizeof real, r->recorded_peak_reserved), real_overhead);
        } else if (recorded) {
            fprintf(f, "  %14s  %18s", "-", "-");
        }
        fputc('\n', f);
    }
    for (size_t i = 0; i < count; i++) {
        const replay_stats_t *r = &results[i];
        if (r->unknown_frees || r->double_allocations)
            fprintf(f, "note: device %d: %llu frees of unknown pointers and %llu allocations of live "
                       "pointers were skipped (first at line %u)\n",
                    r->device, (unsigned long long)r->unknown_frees,
                    (unsigned long long)r->double_allocations, r->first_problem_line);
    }
    replay_print_failures(f, results, count);
    for (size_t i = 0; i < count; i++)
        if (results[i].has_layout)
            print_layout_text(f, &results[i]);
    fprintf(f, "\noverhead = peak reserved / peak requested; fragmentation = the share of the free bytes "
               "(reserved, not in use) outside the largest free block, at the requested peak\n");
    if (recorded)
        fprintf(f, "recorded peak = what the recorded program's GPU really held at most (the log's companion "
                   "LOG.reserved.csv, written by the shim); recorded/requested = recorded peak / peak requested\n");
}

void replay_json_result_open(FILE *f, size_t index, int device, const char *stack)
{
    fprintf(f, "%s\n  {\"device\": %d, \"stack\": ", index ? "," : "", device);
    cli_json_string(f, stack);
}

/* , "key": value */
static void json_u64_member(FILE *f, const char *key, uint64_t value)
{
    fprintf(f, ", \"%s\": %llu", key, (unsigned long long)value);
}

void replay_print_json(FILE *f, const char *log_name, const memlog_t *log, uint64_t capacity,
                       uint64_t gpu_lag_ns, unsigned busy_streams, const replay_stats_t *results, size_t count)
{
    fprintf(f, "{\"poolshim_replay\": 1, \"log\": ");
    cli_json_string(f, log_name);
    fprintf(f, ", \"events\": %zu, \"threads\": %zu, \"simulated_capacity\": %llu, \"gpu_lag_ns\": %llu, "
               "\"busy_streams\": %u, \"results\": [",
            log->count, log->threads, (unsigned long long)capacity, (unsigned long long)gpu_lag_ns, busy_streams);
    for (size_t i = 0; i < count; i++) {
        const replay_stats_t *r = &results[i];
        replay_json_result_open(f, i, r->device, r->stack);
        const struct {
            const char *key;
            uint64_t value;
        } events[] = {{"events", r->events},
                      {"allocations", r->allocations},
                      {"frees", r->frees},
                      {"failures", r->failures},
                      {"logged_failures", r->logged_failures},
                      {"unknown_frees", r->unknown_frees},
                      {"double_allocations", r->double_allocations}};
        for (size_t e = 0; e < sizeof events / sizeof events[0]; e++)
            json_u64_member(f, events[e].key, events[e].value);
        fprintf(f, ", \"alloc_ns_per_op\": %.1f, \"free_ns_per_op\": %.1f", per_op_ns(r->alloc_ns, r->allocations),
                per_op_ns(r->free_ns, r->frees));
        json_u64_member(f, "peak_requested", r->peak_requested);
        json_u64_member(f, "peak_reserved", r->peak_reserved);
        json_u64_member(f, "free_at_peak", r->free_at_peak);
        json_u64_member(f, "largest_free_at_peak", r->largest_free_at_peak);
        fprintf(f, ", \"fragmentation\": %.4f, \"duration_s\": %.6f, \"first_failure_line\": ", r->fragmentation,
                r->duration_s);
        cli_json_u64_or_null(f, r->failures != 0, r->first_failure_line);
        fprintf(f, ", \"first_failure_size\": ");
        cli_json_u64_or_null(f, r->failures != 0, r->first_failure_size);
        fprintf(f, ", \"recorded_peak_reserved\": ");
        cli_json_u64_or_null(f, r->has_recorded, r->recorded_peak_reserved);
        fprintf(f, ", \"upstream_allocs_quarters\": [%llu, %llu, %llu, %llu]",
                (unsigned long long)r->upstream_allocs_quarters[0], (unsigned long long)r->upstream_allocs_quarters[1],
                (unsigned long long)r->upstream_allocs_quarters[2], (unsigned long long)r->upstream_allocs_quarters[3]);
        json_u64_member(f, "device_syncs", r->device_syncs);
        /* the stack's counts (core/resource.h), named by their fields */
        for (int c = 0; c < PS_COUNTER_COUNT; c++)
            if (ps_resource_counters[c].unit == PS_UNIT_COUNT)
                json_u64_member(f, ps_resource_counters[c].field,
                                ps_resource_counter_value(&r->counters, &ps_resource_counters[c]));
        json_u64_member(f, "barrier_wait_ns", r->wait_ns);
        if (r->has_layout) {
            const ps_pool_layout_t *l = &r->at_peak;
            fprintf(f, ", \"at_peak_reserved\": {\"reserved\": %llu, \"in_use\": %llu, \"ready_free\": %llu, "
                       "\"largest_ready\": %llu, \"pending\": %llu, \"stream_free\": %llu, "
                       "\"ready_whole_pieces\": %llu, \"idle_whole_pieces\": %llu, \"unmapped_holes\": %llu, "
                       "\"small_in_use\": %llu}",
                    (unsigned long long)l->reserved, (unsigned long long)l->in_use,
                    (unsigned long long)l->ready_free, (unsigned long long)l->largest_ready,
                    (unsigned long long)l->pending, (unsigned long long)l->stream_free,
                    (unsigned long long)l->ready_whole_pieces, (unsigned long long)l->idle_whole_pieces,
                    (unsigned long long)l->unmapped_holes, (unsigned long long)l->small_in_use);
        }
        fputc('}', f);
    }
    fprintf(f, "\n]}\n");
}
