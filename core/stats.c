/* stats adaptor: counts what passes through it (core/adaptors.h).
 *
 * Algorithm:
 *  1. Every thread counts in its own slot of the adaptor (found through a
 *     thread index, see 5): plain loads and relaxed stores to a cache line
 *     only that thread writes, no atomic read-modify-write. Readers sum
 *     all slots with relaxed loads: current and total of each counter, the
 *     frees and the failures are exact sums.
 *  2. Peaks need one current across threads. Each slot keeps, per counter
 *     of PS_STATS_COUNTERS, how much of its current it has added to the
 *     shared current (`flushed`) and the highest current it reached since
 *     (`high`). When its unflushed part reaches FLUSH_BYTES (bytes) or
 *     FLUSH_COUNT (allocations) in either direction, the thread adds it with
 *     one fetch_add and raises the shared peak to (shared current before the
 *     add) + (its highest unflushed part), a CAS only when that is higher. A
 *     reader takes the larger of the shared peak and the shared current plus
 *     every slot's highest unflushed part. One thread allocating: exact;
 *     n threads: off by less than (n + 1) thresholds (docs/design.md,
 *     "Statistics: what they cost and how exact they are").
 *  3. Time is sampled: each thread times one call in SAMPLE_EVERY of each
 *     kind (its first, then every SAMPLE_EVERY-th; allocate and deallocate
 *     count apart). Totals are estimates: per slot, the mean of the timed
 *     calls times the calls. ps_stats_time_adaptors(0) turns the clock off
 *     here (the shim times each call once, in its router).
 *  4. bytes_requested counts sizes as asked; bytes_allocated rounded to the
 *     256-byte granule every resource hands out at least (the exact
 *     rounding and the reserved bytes come from the upstream's query,
 *     copied into ps_stats_t.upstream by ps_stats_get).
 *  5. Thread index: each thread takes the smallest free index on its first
 *     counted call and gives it back at exit; a later thread takes over the
 *     slot with its counts. Slots come in chunks of 64, allocated when a
 *     thread of that range first counts. Past MAX_SLOTS threads at once (or
 *     out of host memory) a thread counts in one shared slot under a lock.
 *  6. ps_stats_write_text prints an aligned table with human units;
 *     ps_stats_write_json one JSON object per device. Both read memory only.
 * Guarantees: thread-safe; figures read after the counting threads stopped
 * are exact (peaks and times as in 2 and 3); figures read while threads run
 * are each a sum of recent values, not one atomic snapshot.
 */
#include "adaptors.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define GRANULE 256                    /* the smallest rounding of every resource */
#define SAMPLE_EVERY 64                /* one call in this many (per thread and kind) is timed; a power of 2 */
#define FLUSH_BYTES ((int64_t)4 << 20) /* unflushed bytes a thread may hold before adding them (2) */
#define FLUSH_COUNT 64                 /* unflushed allocations a thread may hold before adding them (2) */
#define CHUNK_SHIFT 6                  /* 64 slots a chunk */
#define CHUNK_SLOTS (1u << CHUNK_SHIFT)
#define CHUNKS 64                      /* so at most MAX_SLOTS threads count in slots of their own */
#define MAX_SLOTS (CHUNKS * CHUNK_SLOTS)
/* initial-exec TLS, as the shim's (it is preloaded, never dlopened late) */
#define STATS_TLS __thread __attribute__((tls_model("initial-exec")))
#define PS_STATS_LIKELY(x) __builtin_expect(!!(x), 1)
#define PS_STATS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define PS_COLD_FN __attribute__((noinline, cold))
#define STATS_ONE(name, doc) +1
#define COUNTERS (0 PS_STATS_COUNTERS(STATS_ONE)) /* counters in PS_STATS_COUNTERS */
#define LOAD(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)
#define STORE(field, v) __atomic_store_n(&(field), (v), __ATOMIC_RELAXED)

/* One thread's share of a counter; only the slot's owner writes it. */
typedef struct local_counter {
    int64_t current; /* its increments minus its decrements */
    int64_t total;   /* its increments */
    int64_t flushed; /* the part of current already in the shared current */
    int64_t high;    /* the highest current since the last flush */
} local_counter_t;

/* What the threads share of a counter: written only at flushes. */
typedef struct shared_counter {
    _Atomic int64_t current; /* the sum of every slot's flushed part */
    _Atomic int64_t peak;    /* the highest value seen at a flush */
} shared_counter_t;

/* One thread's counts (a chunk is an array of them, each on its own lines). */
typedef struct slot {
#define SLOT_FIELD(name, doc) local_counter_t name;
    PS_STATS_COUNTERS(SLOT_FIELD)
#undef SLOT_FIELD
    uint64_t frees;            /* deallocations */
    uint64_t failures;         /* failed allocations */
    uint64_t allocate_calls;   /* calls of allocate (the sampling phase, the estimate's count) */
    uint64_t free_calls;       /* calls of deallocate */
    uint64_t allocate_sampled_ns, allocate_samples; /* time and number of the timed allocate calls */
    uint64_t free_sampled_ns, free_samples;         /* the same for deallocate */
} __attribute__((aligned(64))) slot_t;

typedef struct stats {
    ps_resource_t base; /* vtable first */
#define SHARED_FIELD(name, doc) shared_counter_t name;
    PS_STATS_COUNTERS(SHARED_FIELD)
#undef SHARED_FIELD
    slot_t *_Atomic chunks[CHUNKS]; /* slots by thread index, a chunk allocated at first use */
    ps_lock_t overflow_lock;        /* guards `overflow` for the threads without a slot */
    slot_t overflow;                /* counts of threads past MAX_SLOTS or out of memory */
} stats_t;

static int time_calls = 1; /* ps_stats_time_adaptors */

void ps_stats_time_adaptors(int on) { __atomic_store_n(&time_calls, on, __ATOMIC_RELAXED); }

/* ---- thread index (5) ---- */
static pthread_mutex_t index_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the two below */
static uint32_t free_indexes[MAX_SLOTS]; /* indexes given back by exited threads, a stack */
static uint32_t free_count, next_index;  /* its depth; the next index never handed out */
static pthread_key_t index_key;          /* destructor: give_back_index */
static pthread_once_t index_once = PTHREAD_ONCE_INIT;
static STATS_TLS uint32_t thread_index;  /* this thread's index + 1; 0: none yet */

static void give_back_index(void *arg)
{
    uint32_t index = (uint32_t)(uintptr_t)arg - 1;
    pthread_mutex_lock(&index_lock);
    free_indexes[free_count++] = index;
    pthread_mutex_unlock(&index_lock);
    thread_index = 0;
}

static void index_child(void) { pthread_mutex_init(&index_lock, NULL); }

static void index_init(void)
{
    pthread_key_create(&index_key, give_back_index);
    pthread_atfork(NULL, NULL, index_child);
}

/* This thread's index + 1, taken now if it has none; 0 when all are taken. */
static uint32_t take_index(void)
{
    pthread_once(&index_once, index_init);
    uint32_t index = MAX_SLOTS;
    pthread_mutex_lock(&index_lock);
    if (free_count)
        index = free_indexes[--free_count];
    else if (next_index < MAX_SLOTS)
        index = next_index++;
    pthread_mutex_unlock(&index_lock);
    if (index == MAX_SLOTS)
        return 0;
    thread_index = index + 1;
    pthread_setspecific(index_key, (void *)(uintptr_t)(index + 1));
    return index + 1;
}

/* This thread's slot; NULL when it has none (then: the overflow slot, locked). */
static PS_COLD_FN slot_t *my_slot_slow(stats_t *s)
{
    uint32_t index = thread_index ? thread_index : take_index();
    if (!index)
        return NULL;
    index--;
    slot_t *_Atomic *chunk = &s->chunks[index >> CHUNK_SHIFT];
    slot_t *c = atomic_load_explicit(chunk, memory_order_acquire);
    if (!c) {
        slot_t *fresh = aligned_alloc(64, sizeof(slot_t) * CHUNK_SLOTS);
        if (!fresh)
            return NULL;
        memset(fresh, 0, sizeof(slot_t) * CHUNK_SLOTS);
        if (atomic_compare_exchange_strong_explicit(chunk, &c, fresh, memory_order_acq_rel, memory_order_acquire))
            c = fresh;
        else
            free(fresh); /* another thread of this chunk was first */
    }
    return &c[index & (CHUNK_SLOTS - 1)];
}

static inline slot_t *my_slot(stats_t *s)
{
    uint32_t index = thread_index;
    if (PS_STATS_LIKELY(index)) {
        slot_t *c = atomic_load_explicit(&s->chunks[(index - 1) >> CHUNK_SHIFT], memory_order_acquire);
        if (PS_STATS_LIKELY(c != NULL))
            return &c[(index - 1) & (CHUNK_SLOTS - 1)];
    }
    return my_slot_slow(s);
}

/* ---- counting (1, 2) ---- */
static void raise_peak(_Atomic int64_t *peak, int64_t value)
{
    int64_t seen = atomic_load_explicit(peak, memory_order_relaxed);
    while (value > seen &&
           !atomic_compare_exchange_weak_explicit(peak, &seen, value, memory_order_relaxed, memory_order_relaxed))
        ;
}

static PS_COLD_FN void flush(local_counter_t *l, shared_counter_t *g)
{
    int64_t current = l->current, high = l->high, flushed = l->flushed;
    STORE(l->flushed, current);
    STORE(l->high, current);
    int64_t before = atomic_fetch_add_explicit(&g->current, current - flushed, memory_order_relaxed);
    raise_peak(&g->peak, before + (high - flushed));
}

/* Inline in both callers, where `up` (delta >= 0: an allocation) is known. */
static inline __attribute__((always_inline)) void local_add(local_counter_t *l, shared_counter_t *g, int64_t delta,
                                                            int up, int64_t threshold)
{
    int64_t now = l->current + delta;
    STORE(l->current, now);
    if (up) {
        STORE(l->total, l->total + delta);
        if (now > l->high)
            STORE(l->high, now);
    }
    /* |now - flushed| >= threshold, in one comparison */
    if (PS_STATS_UNLIKELY((uint64_t)(now - l->flushed + threshold - 1) > (uint64_t)(2 * threshold - 2)))
        flush(l, g);
}

static inline __attribute__((always_inline)) void count(stats_t *s, slot_t *t, size_t size, int sign)
{
    int up = sign > 0;
    local_add(&t->bytes_requested, &s->bytes_requested, sign * (int64_t)size, up, FLUSH_BYTES);
    local_add(&t->bytes_allocated, &s->bytes_allocated, sign * (int64_t)ps_align_up(size ? size : 1, GRANULE), up,
              FLUSH_BYTES);
    local_add(&t->allocations, &s->allocations, sign, up, FLUSH_COUNT);
}

/* The clock when this call is one to time (3), else 0. */
static inline uint64_t start_clock(uint64_t *calls)
{
    uint64_t n = *calls;
    STORE(*calls, n + 1);
    if (PS_STATS_LIKELY((n & (SAMPLE_EVERY - 1)) != 0) || !__atomic_load_n(&time_calls, __ATOMIC_RELAXED))
        return 0;
    return ps_now_ns();
}

static inline void stop_clock(uint64_t t0, uint64_t *sampled_ns, uint64_t *samples)
{
    if (PS_STATS_UNLIKELY(t0 != 0)) {
        STORE(*sampled_ns, *sampled_ns + (ps_now_ns() - t0));
        STORE(*samples, *samples + 1);
    }
}

static int stats_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    stats_t *s = (stats_t *)r;
    slot_t *t = my_slot(s);
    if (PS_STATS_UNLIKELY(!t)) {
        ps_lock(&s->overflow_lock);
        uint64_t t0 = start_clock(&s->overflow.allocate_calls);
        ps_unlock(&s->overflow_lock);
        int status = ps_allocate(r->upstream, size, stream, out);
        ps_lock(&s->overflow_lock);
        stop_clock(t0, &s->overflow.allocate_sampled_ns, &s->overflow.allocate_samples);
        if (status == PS_OK)
            count(s, &s->overflow, size, 1);
        else
            STORE(s->overflow.failures, s->overflow.failures + 1);
        ps_unlock(&s->overflow_lock);
        return status;
    }
    uint64_t t0 = start_clock(&t->allocate_calls);
    int status = ps_allocate(r->upstream, size, stream, out);
    stop_clock(t0, &t->allocate_sampled_ns, &t->allocate_samples);
    if (PS_STATS_LIKELY(status == PS_OK))
        count(s, t, size, 1);
    else
        STORE(t->failures, t->failures + 1);
    return status;
}

static int stats_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    stats_t *s = (stats_t *)r;
    slot_t *t = my_slot(s);
    if (PS_STATS_UNLIKELY(!t)) {
        ps_lock(&s->overflow_lock);
        uint64_t t0 = start_clock(&s->overflow.free_calls);
        ps_unlock(&s->overflow_lock);
        int status = ps_deallocate(r->upstream, ptr, size, stream);
        ps_lock(&s->overflow_lock);
        stop_clock(t0, &s->overflow.free_sampled_ns, &s->overflow.free_samples);
        if (status == PS_OK) {
            count(s, &s->overflow, size, -1);
            STORE(s->overflow.frees, s->overflow.frees + 1);
        }
        ps_unlock(&s->overflow_lock);
        return status;
    }
    uint64_t t0 = start_clock(&t->free_calls);
    int status = ps_deallocate(r->upstream, ptr, size, stream);
    stop_clock(t0, &t->free_sampled_ns, &t->free_samples);
    if (PS_STATS_LIKELY(status == PS_OK)) {
        count(s, t, size, -1);
        STORE(t->frees, t->frees + 1);
    }
    return status;
}

static void stats_destroy(ps_resource_t *r)
{
    stats_t *s = (stats_t *)r;
    for (int c = 0; c < CHUNKS; c++)
        free(atomic_load(&s->chunks[c]));
    free(s);
}

static const ps_resource_ops_t stats_ops = PS_ADAPTOR_OPS("stats", stats_allocate, stats_deallocate, stats_destroy);

int ps_stats_create(const char *name, ps_resource_t *upstream, ps_resource_t **out)
{
    stats_t *s = NULL;
    int status = ps_adaptor_start(sizeof *s, 64, &stats_ops, name, upstream, out, (void **)&s);
    if (status == PS_OK)
        *out = &s->base;
    return status;
}

/* The time of `calls` calls estimated from `samples` timed ones (3). */
static uint64_t estimate(uint64_t sampled_ns, uint64_t samples, uint64_t calls)
{
    if (!samples)
        return 0;
    return (uint64_t)((double)sampled_ns / (double)samples * (double)calls + 0.5);
}

/* Adds one slot's figures to out; `rise` gathers the unflushed highs (2). */
static void add_slot(const slot_t *t, ps_stats_t *out, int64_t rise[COUNTERS])
{
    int i = 0;
#define STATS_ADD(name, doc)                                                   \
    out->name.current += LOAD(t->name.current);                                \
    out->name.total += LOAD(t->name.total);                                    \
    rise[i++] += LOAD(t->name.high) - LOAD(t->name.flushed);
    PS_STATS_COUNTERS(STATS_ADD)
#undef STATS_ADD
    out->frees += LOAD(t->frees);
    out->failures += LOAD(t->failures);
    out->alloc_ns += estimate(LOAD(t->allocate_sampled_ns), LOAD(t->allocate_samples), LOAD(t->allocate_calls));
    out->free_ns += estimate(LOAD(t->free_sampled_ns), LOAD(t->free_samples), LOAD(t->free_calls));
}

void ps_stats_get(ps_resource_t *stats_adaptor, ps_stats_t *out)
{
    stats_t *s = (stats_t *)stats_adaptor;
    memset(out, 0, sizeof *out);
    int64_t shared[COUNTERS], rise[COUNTERS] = {0};
    int i = 0;
#define STATS_SHARED(name, doc) shared[i++] = atomic_load(&s->name.current);
    PS_STATS_COUNTERS(STATS_SHARED)
#undef STATS_SHARED
    for (int c = 0; c < CHUNKS; c++) {
        const slot_t *chunk = atomic_load(&s->chunks[c]);
        for (unsigned k = 0; chunk && k < CHUNK_SLOTS; k++)
            add_slot(&chunk[k], out, rise);
    }
    ps_lock(&s->overflow_lock);
    add_slot(&s->overflow, out, rise);
    ps_unlock(&s->overflow_lock);
    i = 0;
#define STATS_PEAK(name, doc)                                                  \
    out->name.peak = atomic_load(&s->name.peak);                               \
    if (shared[i] + rise[i] > out->name.peak)                                  \
        out->name.peak = shared[i] + rise[i];                                  \
    i++;
    PS_STATS_COUNTERS(STATS_PEAK)
#undef STATS_PEAK
    ps_query(s->base.upstream, &out->upstream);
}

/* Byte counters print with units, count counters as plain numbers. */
static int is_bytes(const char *name) { return strncmp(name, "bytes", 5) == 0; }

static const char *fmt_value(char *buf, size_t n, const char *name, int64_t v)
{
    if (is_bytes(name))
        return ps_format_bytes(buf, n, v < 0 ? 0 : (uint64_t)v);
    snprintf(buf, n, "%" PRId64, v);
    return buf;
}

void ps_stats_write_text(FILE *f, int device, const ps_stats_t *s)
{
    char a[32], b[32], c[32];
    fprintf(f, "poolshim statistics, device %d\n", device);
    fprintf(f, "  %-18s %14s %14s %14s\n", "counter", "current", "peak", "total");
#define STATS_ROW(name, doc)                                                   \
    fprintf(f, "  %-18s %14s %14s %14s\n", #name,                              \
            fmt_value(a, sizeof a, #name, s->name.current),                    \
            fmt_value(b, sizeof b, #name, s->name.peak),                       \
            fmt_value(c, sizeof c, #name, s->name.total));
    PS_STATS_COUNTERS(STATS_ROW)
#undef STATS_ROW
    fprintf(f, "  %-18s %14" PRIu64 "\n", "frees", s->frees);
    fprintf(f, "  %-18s %14" PRIu64 "\n", "failures", s->failures);
    uint64_t allocs = (uint64_t)(s->allocations.total > 0 ? s->allocations.total : 0);
    fprintf(f, "  %-18s %11.1f ms %11.0f ns/call\n", "time in allocate", s->alloc_ns / 1e6,
            allocs ? (double)s->alloc_ns / (double)allocs : 0.0);
    fprintf(f, "  %-18s %11.1f ms %11.0f ns/call\n", "time in free", s->free_ns / 1e6,
            s->frees ? (double)s->free_ns / (double)s->frees : 0.0);
    fprintf(f, "  %-18s %14s %14s (current, peak)\n", "reserved", ps_format_bytes(a, sizeof a, s->upstream.bytes_reserved),
            ps_format_bytes(b, sizeof b, s->upstream.peak_bytes_reserved));
    fprintf(f, "  %-18s %14s\n", "in use (rounded)", ps_format_bytes(a, sizeof a, s->upstream.bytes_in_use));
    fprintf(f, "  %-18s %14s\n", "pending fences", ps_format_bytes(a, sizeof a, s->upstream.bytes_pending));
    fprintf(f, "  %-18s %14" PRIu64 "\n", "upstream allocs", s->upstream.upstream_allocs);
    fprintf(f, "  %-18s %14" PRIu64 "\n", "upstream frees", s->upstream.upstream_frees);
    fprintf(f, "  %-18s %14" PRIu64 "\n", "fences recorded", s->upstream.fences_recorded);
    fprintf(f, "  %-18s %14" PRIu64 "\n", "fence host waits", s->upstream.fence_waits);
}

void ps_stats_write_json(FILE *f, int device, const ps_stats_t *s)
{
    fprintf(f, "{\"device\": %d", device);
#define STATS_JSON(name, doc)                                                  \
    fprintf(f, ", \"%s\": {\"current\": %" PRId64 ", \"peak\": %" PRId64 ", \"total\": %" PRId64 "}", \
            #name, s->name.current, s->name.peak, s->name.total);
    PS_STATS_COUNTERS(STATS_JSON)
#undef STATS_JSON
    fprintf(f, ", \"frees\": %" PRIu64 ", \"failures\": %" PRIu64 ", \"alloc_ns\": %" PRIu64
               ", \"free_ns\": %" PRIu64,
            s->frees, s->failures, s->alloc_ns, s->free_ns);
    fprintf(f, ", \"upstream\": {");
    for (int c = 0; c < PS_COUNTER_COUNT; c++)
        fprintf(f, "%s\"%s\": %" PRIu64, c ? ", " : "", ps_resource_counters[c].field,
                ps_resource_counter_value(&s->upstream, &ps_resource_counters[c]));
    fprintf(f, "}}\n");
}
