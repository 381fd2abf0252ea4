/* The shim's statistics (shim/stats.h).
 *
 * 1. Each thread owns a block of counters (calls by device and function,
 *    failures, time; the door follows from the function), created on its first counted call and linked
 *    into a global list. A thread only ever writes its own block, with
 *    relaxed atomic stores: no shared cache line on the hot path. The
 *    common count (a served call, statistics off) is inline in stats.h,
 *    through a thread-local pointer to the block's call counters.
 * 2. When a thread exits, its counts are added to a `retired` block and its
 *    block is freed.
 * 3. Bytes requested (statistics on): each thread keeps its share per
 *    device (current, total) in its block too. The peak needs one view
 *    across threads: a thread adds its unflushed bytes to the device's
 *    shared current with one fetch_add once they reach FLUSH_BYTES in
 *    either direction, and raises the shared peak to (shared current before
 *    the add) + (the highest it held unflushed since its last flush). A
 *    reader takes the larger of that peak and the shared current plus
 *    every thread's highest unflushed part: exact with one thread
 *    allocating, within (threads + 1) x FLUSH_BYTES with more (the same
 *    rule as core/stats.c; docs/design.md, "Statistics"). Current and
 *    total are exact sums.
 * 3b. Time: the router times one call in PS_STATS_SAMPLE_EVERY per thread
 *    and kind (stats.h); each block keeps the timed calls' time and number
 *    per device, and a reader estimates the block's time as their mean
 *    times its calls of that kind (a device whose calls were never timed
 *    takes the mean of the thread's other devices).
 * 4. IPC counters (exported, opened, refused) and the out-of-memory retry's
 *    (bytes given back, retries succeeded and failed, give-backs skipped)
 *    are rare: process-wide atomics.
 * 5. The exit report reads memory only: no CUDA call after the runtime may
 *    have been torn down.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/adaptors.h"
#include "../core/safe_file.h"
#include "devices.h"
#include "poolshim.h"
#include "stats.h"

int ps_stats_enabled;

#define FLUSH_BYTES ((int64_t)4 << 20) /* unflushed bytes a thread may hold (3) */

/* One thread's share of the bytes requested from one device; only the
 * thread writes it. In a sum (sum_all, `retired`) high - flushed is the sum
 * of the threads' highest unflushed parts. */
typedef struct byte_share {
    int64_t current; /* bytes it asked for minus bytes it freed */
    int64_t total;   /* bytes it asked for */
    int64_t flushed; /* the part of current already in the shared current */
    int64_t high;    /* the highest current since its last flush */
} byte_share_t;

/* Time of one kind of call on one device (3b). In a live thread's block:
 * the timed calls; in `retired` and sums: `ns` is the estimate, `samples` 0. */
typedef struct time_share {
    uint64_t ns;      /* time of the timed calls (an estimate in sums) */
    uint64_t samples; /* calls timed */
} time_share_t;

enum { TIME_ALLOCATE, TIME_FREE, TIME_HOST, TIME_KINDS }; /* what the report shows apart */

typedef struct thread_counters {
    struct thread_counters *next, *prev;      /* links in the live list */
    uint64_t calls[PS_MAX_DEVICES][PS_CALL_COUNT];
    uint64_t failures[PS_MAX_DEVICES];
    time_share_t time[PS_MAX_DEVICES][TIME_KINDS]; /* allocate, free, pinned host calls */
    byte_share_t requested[PS_MAX_DEVICES];   /* device memory asked for */
    byte_share_t host_requested[PS_MAX_DEVICES]; /* pinned host memory asked for */
    uint64_t passthrough;                     /* calls forwarded to CUDA untouched */
    uint64_t invalid;                         /* bad frees answered with "invalid value" */
} thread_counters_t;

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static thread_counters_t *live;    /* blocks of running threads */
static thread_counters_t retired;  /* sums of exited threads */
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static PS_TLS thread_counters_t *mine;
PS_TLS uint64_t (*ps_stats_my_calls)[PS_CALL_COUNT]; /* mine->calls, for stats.h's inline counting */
PS_TLS uint32_t ps_stats_countdown[PS_STATS_TIME_KINDS]; /* stats.h: 0, so a thread's first call is timed */

/* What the threads share of a device's requested bytes: written at flushes. */
typedef struct byte_counters {
    atomic_llong current;   /* the sum of every thread's flushed part */
    atomic_llong peak;      /* the highest value seen at a flush */
} byte_counters_t;
static byte_counters_t bytes[PS_MAX_DEVICES];
static byte_counters_t host_bytes[PS_MAX_DEVICES]; /* pinned host memory, apart from device bytes */
static atomic_ullong ipc_counts[PS_IPC_COUNT];     /* IPC handles exported, opened, refused */
static atomic_ullong oom_counts[PS_MAX_DEVICES][PS_OOM_COUNT]; /* the out-of-memory retry, per device */
static atomic_ullong give_counts[PS_MAX_DEVICES][PS_GIVE_COUNT]; /* decay and neighbours, per device */

/* Is `call` one of the pinned host memory calls? */
static int is_host_call(int call) { return call >= PS_CALL_CUDA_HOST_ALLOC; }
/* The door of a device call: cuda* runtime, cu* driver. */
static int door_of_call(int call)
{
    return call >= PS_CALL_CU_MEM_ALLOC && call <= PS_CALL_CU_MEM_FREE_ASYNC ? PS_DOOR_DRIVER : PS_DOOR_RUNTIME;
}

#define BUMP(field, n) PS_STATS_BUMP(field, n)
#define READ(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)
#define STORE(field, v) __atomic_store_n(&(field), (v), __ATOMIC_RELAXED)

/* The kind of time (3b) a call's time counts in. */
static int time_kind(int call) { return is_host_call(call) ? TIME_HOST : (call & 1) ? TIME_FREE : TIME_ALLOCATE; }

static void add_share(byte_share_t *dst, const byte_share_t *src)
{
    dst->current += READ(src->current);
    dst->total += READ(src->total);
    dst->high += READ(src->high) - READ(src->flushed);
}

/* Adds src's counts into dst (a sum or `retired`, read by this thread
 * only); src's sampled times become estimates (3b), a sum's stay as they are. */
static void add_into(thread_counters_t *dst, thread_counters_t *src)
{
    uint64_t kind_calls[PS_MAX_DEVICES][TIME_KINDS] = {{0}};
    uint64_t all_ns[TIME_KINDS] = {0}, all_samples[TIME_KINDS] = {0};
    for (int d = 0; d < PS_MAX_DEVICES; d++) {
        for (int c = 0; c < PS_CALL_COUNT; c++) {
            uint64_t n = READ(src->calls[d][c]);
            dst->calls[d][c] += n;
            kind_calls[d][time_kind(c)] += n;
        }
        dst->failures[d] += READ(src->failures[d]);
        for (int k = 0; k < TIME_KINDS; k++) {
            all_ns[k] += READ(src->time[d][k].ns);
            all_samples[k] += READ(src->time[d][k].samples);
        }
        add_share(&dst->requested[d], &src->requested[d]);
        add_share(&dst->host_requested[d], &src->host_requested[d]);
    }
    for (int d = 0; d < PS_MAX_DEVICES; d++)
        for (int k = 0; k < TIME_KINDS; k++) {
            uint64_t ns = READ(src->time[d][k].ns), samples = READ(src->time[d][k].samples);
            if (!samples && all_samples[k] && kind_calls[d][k]) { /* none of this device's calls was timed */
                ns = all_ns[k];
                samples = all_samples[k];
            }
            if (samples) /* a live thread's timed calls: the estimate; else it is one already */
                ns = (uint64_t)((double)ns / (double)samples * (double)kind_calls[d][k] + 0.5);
            dst->time[d][k].ns += ns;
        }
    dst->passthrough += READ(src->passthrough);
    dst->invalid += READ(src->invalid);
}

static void flush(byte_share_t *share, byte_counters_t *shared);

static void thread_exit(void *p)
{
    thread_counters_t *t = p;
    for (int d = 0; d < PS_MAX_DEVICES; d++) { /* its unflushed bytes: `retired` keeps none */
        if (t->requested[d].current != t->requested[d].flushed || t->requested[d].high != t->requested[d].flushed)
            flush(&t->requested[d], &bytes[d]);
        if (t->host_requested[d].current != t->host_requested[d].flushed ||
            t->host_requested[d].high != t->host_requested[d].flushed)
            flush(&t->host_requested[d], &host_bytes[d]);
    }
    pthread_mutex_lock(&list_lock);
    add_into(&retired, t);
    if (t->prev)
        t->prev->next = t->next;
    else
        live = t->next;
    if (t->next)
        t->next->prev = t->prev;
    pthread_mutex_unlock(&list_lock);
    mine = NULL;
    ps_stats_my_calls = NULL;
    free(t);
}

static void make_key(void) { pthread_key_create(&exit_key, thread_exit); }

static thread_counters_t *counters(void)
{
    if (PS_LIKELY(mine != NULL))
        return mine;
    pthread_once(&key_once, make_key);
    thread_counters_t *t = calloc(1, sizeof *t);
    if (!t)
        return &retired; /* out of host memory: count (racily) into the shared block */
    pthread_mutex_lock(&list_lock);
    t->next = live;
    if (live)
        live->prev = t;
    live = t;
    pthread_mutex_unlock(&list_lock);
    pthread_setspecific(exit_key, t);
    mine = t;
    ps_stats_my_calls = t->calls;
    return t;
}

void ps_stats_init(int enabled)
{
    ps_stats_enabled = enabled;
    ps_stats_time_adaptors(0); /* the router times each call once (3b); the stats adaptors below need not */
}

/* Adds the share's unflushed bytes to the shared current and raises the
 * peak (3): the one atomic read-modify-write of byte counting. */
static PS_COLD void flush(byte_share_t *share, byte_counters_t *shared)
{
    int64_t current = share->current, high = share->high, flushed = share->flushed;
    STORE(share->flushed, current);
    STORE(share->high, current);
    long long before = atomic_fetch_add_explicit(&shared->current, current - flushed, memory_order_relaxed);
    long long peak = atomic_load_explicit(&shared->peak, memory_order_relaxed);
    long long candidate = before + (high - flushed);
    while (candidate > peak && !atomic_compare_exchange_weak_explicit(&shared->peak, &peak, candidate,
                                                                      memory_order_relaxed, memory_order_relaxed))
        ;
}

/* Counts `delta` requested bytes in this thread's share (written only by
 * this thread: relaxed stores, no read-modify-write). */
static inline void share_add(byte_share_t *share, byte_counters_t *shared, int64_t delta, int up)
{
    int64_t now = share->current + delta;
    STORE(share->current, now);
    if (up) {
        BUMP(share->total, delta);
        if (now > share->high)
            STORE(share->high, now);
    }
    /* |now - flushed| >= FLUSH_BYTES, in one comparison */
    if (PS_UNLIKELY((uint64_t)(now - share->flushed + FLUSH_BYTES - 1) > (uint64_t)(2 * FLUSH_BYTES - 2)))
        flush(share, shared);
}

/* Counts the time of a timed call (clock_start != 0), stats.h. */
static inline void sample(thread_counters_t *t, int device, int call, uint64_t clock_start)
{
    if (PS_UNLIKELY(clock_start != 0) && t != &retired) {
        time_share_t *time = &t->time[device][time_kind(call)];
        BUMP(time->ns, ps_now_ns() - clock_start);
        BUMP(time->samples, 1);
    }
}

void ps_stats_count_allocate_all(int device, int call, int door, size_t size, int status, uint64_t clock_start)
{
    thread_counters_t *t = counters();
    BUMP(t->calls[device][call], 1);
    if (status != PS_OK)
        BUMP(t->failures[device], 1);
    if (!ps_stats_enabled)
        return;
    sample(t, device, call, clock_start);
    if (status == PS_OK) {
        if (is_host_call(call))
            share_add(&t->host_requested[device], &host_bytes[device], (int64_t)size, 1);
        else
            share_add(&t->requested[device], &bytes[device], (int64_t)size, 1);
    }
}

void ps_stats_count_free_all(int device, int call, int door, size_t size, uint64_t clock_start)
{
    thread_counters_t *t = counters();
    BUMP(t->calls[device][call], 1);
    if (!ps_stats_enabled)
        return;
    sample(t, device, call, clock_start);
    if (is_host_call(call))
        share_add(&t->host_requested[device], &host_bytes[device], -(int64_t)size, 0);
    else
        share_add(&t->requested[device], &bytes[device], -(int64_t)size, 0);
}

void ps_stats_count_dropped(int device, uint64_t dropped_bytes)
{
    if (ps_stats_enabled && dropped_bytes)
        share_add(&counters()->requested[device], &bytes[device], -(int64_t)dropped_bytes, 0);
}

void ps_stats_count_passthrough(int device)
{
    (void)device;
    BUMP(counters()->passthrough, 1);
}

void ps_stats_count_invalid(int call)
{
    thread_counters_t *t = counters();
    uint64_t n = READ(t->invalid);
    BUMP(t->invalid, 1);
    if (n < 10)
        ps_warning("%s of a pointer inside poolshim's memory that is not a live allocation "
                   "(double free, or a pointer into the middle of a block): answered \"invalid value\"",
                   call == PS_CALL_CU_MEM_FREE || call == PS_CALL_CU_MEM_FREE_ASYNC ? "cuMemFree"
                   : call == PS_CALL_CUDA_FREE_HOST                                ? "cudaFreeHost"
                   : call == PS_CALL_CU_MEM_FREE_HOST                              ? "cuMemFreeHost"
                                                                                   : "cudaFree");
}

void ps_stats_count_ipc(int what)
{
    if (what >= 0 && what < PS_IPC_COUNT)
        atomic_fetch_add_explicit(&ipc_counts[what], 1, memory_order_relaxed);
}

void ps_stats_count_give(int device, int what, uint64_t n)
{
    if (device >= 0 && device < PS_MAX_DEVICES && what >= 0 && what < PS_GIVE_COUNT)
        atomic_fetch_add_explicit(&give_counts[device][what], n, memory_order_relaxed);
}

void ps_stats_count_oom(int device, int what, uint64_t n)
{
    if (device >= 0 && device < PS_MAX_DEVICES && what >= 0 && what < PS_OOM_COUNT)
        atomic_fetch_add_explicit(&oom_counts[device][what], n, memory_order_relaxed);
}

void ps_stats_count_foreign_invalid(void)
{
    thread_counters_t *t = counters();
    BUMP(t->invalid, 1);
}

static void sum_all(thread_counters_t *sum)
{
    memset(sum, 0, sizeof *sum);
    pthread_mutex_lock(&list_lock);
    add_into(sum, &retired);
    for (thread_counters_t *t = live; t; t = t->next)
        add_into(sum, t);
    pthread_mutex_unlock(&list_lock);
}

/* The peak of a sum of shares (3): the shared peak, or the shared current
 * plus the threads' highest unflushed parts when that is more. */
static int64_t requested_peak_of(const byte_share_t *sum, byte_counters_t *shared)
{
    int64_t peak = atomic_load(&shared->peak), unflushed_high = atomic_load(&shared->current) + sum->high;
    return unflushed_high > peak ? unflushed_high : peak;
}

static void snapshot_from(const thread_counters_t *sum, int d, ps_shim_stats_t *out)
{
    memset(out, 0, sizeof *out);
    memcpy(out->calls, sum->calls[d], sizeof out->calls);
    /* the door is known from the function: cuda* runtime, cu* driver */
    for (int c = 0; c < PS_CALL_CUDA_HOST_ALLOC; c++) /* device calls; pinned host calls apart */
        out->doors[door_of_call(c)] += out->calls[c];
    out->failures = sum->failures[d];
    out->alloc_ns = sum->time[d][TIME_ALLOCATE].ns;
    out->free_ns = sum->time[d][TIME_FREE].ns;
    out->requested_current = sum->requested[d].current;
    out->requested_peak = requested_peak_of(&sum->requested[d], &bytes[d]);
    out->requested_total = (uint64_t)sum->requested[d].total;
}

void ps_stats_snapshot(int device, ps_shim_stats_t *out)
{
    static thread_counters_t sum; /* large: not on the stack */
    static pthread_mutex_t sum_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&sum_lock);
    sum_all(&sum);
    snapshot_from(&sum, device, out);
    pthread_mutex_unlock(&sum_lock);
}

uint64_t ps_stats_allocations_total(void)
{
    static thread_counters_t sum;
    sum_all(&sum);
    uint64_t n = 0;
    for (int d = 0; d < PS_MAX_DEVICES; d++)
        for (int c = 0; c < PS_CALL_CUDA_HOST_ALLOC; c += 2) /* the allocate calls (even); pinned host apart */
            n += sum.calls[d][c];
    return n;
}

uint64_t ps_stats_passthrough_total(void)
{
    static thread_counters_t sum;
    sum_all(&sum);
    return sum.passthrough;
}

static const char *const call_names[PS_CALL_COUNT] = {
    "cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync",
    "cuMemAlloc", "cuMemFree", "cuMemAllocAsync", "cuMemFreeAsync",
    "cudaHostAlloc", "cudaFreeHost", "cuMemHostAlloc", "cuMemFreeHost",
};

/* The slow GPU-ops entries whose host time is reported (PS_OP_TIME_*, stats.h). */
static const char *const op_time_names[PS_OP_TIME_KINDS] = {"barrier", "wait", "map", "unmap", "chunk"};

/* ---- host time in the GPU-ops table's slow entries (pushed by gpu_ops_cuda.c) ---------- */
static _Atomic uint64_t op_time_ns[PS_MAX_DEVICES][PS_OP_TIME_KINDS];
static _Atomic uint64_t op_time_calls[PS_MAX_DEVICES][PS_OP_TIME_KINDS];

void ps_stats_count_cuda_time(int device, int kind, uint64_t ns)
{
    if (device < 0 || device >= PS_MAX_DEVICES)
        return;
    atomic_fetch_add_explicit(&op_time_ns[device][kind], ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&op_time_calls[device][kind], 1, memory_order_relaxed);
}

static void cuda_times(int device, uint64_t ns[PS_OP_TIME_KINDS], uint64_t calls[PS_OP_TIME_KINDS])
{
    for (int k = 0; k < PS_OP_TIME_KINDS; k++) {
        int ok = device >= 0 && device < PS_MAX_DEVICES;
        ns[k] = ok ? atomic_load_explicit(&op_time_ns[device][k], memory_order_relaxed) : 0;
        calls[k] = ok ? atomic_load_explicit(&op_time_calls[device][k], memory_order_relaxed) : 0;
    }
}

/* ---- the exit report (ps_stats_write) ---------------------------------- */

/* Writes the members of one JSON object; a member "group.key" goes into the
 * object "group", opened at its first member and closed at the first
 * member outside it (or by json_end). */
typedef struct json_writer {
    FILE *f;
    bool started;   /* a member was written at the top */
    char group[24]; /* the open group, "" for none */
    bool in_group;  /* a member was written in it */
} json_writer_t;

static void json_end(json_writer_t *j)
{
    if (j->group[0])
        fputc('}', j->f);
    j->group[0] = '\0';
}

/* Writes the separator, the group when it opens and the key of `path`: the
 * value comes next. */
static void json_key(json_writer_t *j, const char *path)
{
    const char *dot = strchr(path, '.');
    int group_length = dot ? (int)(dot - path) : 0;
    if (j->group[0] && (!dot || strncmp(j->group, path, (size_t)group_length) || j->group[group_length]))
        json_end(j);
    if (dot && !j->group[0]) {
        fprintf(j->f, "%s\"%.*s\": {", j->started ? ", " : "", group_length, path);
        snprintf(j->group, sizeof j->group, "%.*s", group_length, path);
        j->started = true;
        j->in_group = false;
    }
    bool *written = dot ? &j->in_group : &j->started;
    fprintf(j->f, "%s\"%s\": ", *written ? ", " : "", dot ? dot + 1 : path);
    *written = true;
}

static void json_u64(json_writer_t *j, const char *path, uint64_t value)
{
    json_key(j, path);
    fprintf(j->f, "%llu", (unsigned long long)value);
}

static void json_i64(json_writer_t *j, const char *path, int64_t value)
{
    json_key(j, path);
    fprintf(j->f, "%lld", (long long)value);
}

/* "group.key" into `path`, then the value. */
static void json_u64_in(json_writer_t *j, const char *group, const char *key, uint64_t value)
{
    char path[64];
    snprintf(path, sizeof path, "%s.%s", group, key);
    json_u64(j, path, value);
}

/* The resource counters that have a JSON key (core/resource.h). In the
 * pinned pool's object, which is about bytes, the "bytes" group is the
 * object itself. */
static void json_counters(json_writer_t *j, const ps_resource_info_t *info, bool bytes_at_top)
{
    for (int c = 0; c < PS_COUNTER_COUNT; c++) {
        const ps_resource_counter_t *counter = &ps_resource_counters[c];
        const char *path = counter->json;
        if (!path)
            continue;
        if (bytes_at_top && !strncmp(path, "bytes.", 6))
            path += 6;
        uint64_t value = ps_resource_counter_value(info, counter);
        json_u64(j, path, counter->unit == PS_UNIT_FLAG ? value != 0 : value);
    }
}

/* The text report's counts line: each counter with words (core/resource.h)
 * that is always shown or is not 0. */
static void text_counters(FILE *f, const char *prefix, const ps_resource_info_t *info)
{
    fputs(prefix, f);
    int shown = 0;
    for (int c = 0; c < PS_COUNTER_COUNT; c++) {
        const ps_resource_counter_t *counter = &ps_resource_counters[c];
        uint64_t value = ps_resource_counter_value(info, counter);
        if (counter->text && (value || counter->shown_always))
            fprintf(f, "%s %llu %s", shown++ ? "," : "", (unsigned long long)value, counter->text);
    }
    fputc('\n', f);
}

/* Adds what the pools dropped with earlier contexts did (lifecycle.c) to the
 * totals of `info` (memory only: their bytes went with the context). */
static void add_dropped_totals(ps_resource_info_t *info, const ps_resource_info_t *gone)
{
    info->upstream_allocs += gone->upstream_allocs;
    info->upstream_frees += gone->upstream_frees;
    info->fences_recorded += gone->fences_recorded;
    info->fence_waits += gone->fence_waits;
    info->pending_waits += gone->pending_waits;
    if (gone->peak_bytes_reserved > info->peak_bytes_reserved)
        info->peak_bytes_reserved = gone->peak_bytes_reserved;
}

/* What the report says of one device. */
typedef struct device_report {
    int device;                   /* its ordinal */
    ps_device_state_t *dev;       /* its state */
    const char *stack;            /* the configured top's name, "dropped" or "none" */
    ps_shim_stats_t calls;        /* the shim's counts */
    ps_resource_info_t info;      /* its stack's counters, with the dropped stacks' totals */
    ps_resource_info_t host_info; /* the same of its pinned host pool */
    ps_stats_t host_stats;        /* the pinned stack's stats adaptor (global.stats on) */
    uint64_t host_calls;          /* pinned host calls */
    uint64_t host_ns;             /* time in them */
    int64_t host_requested_current, host_requested_peak; /* pinned bytes asked for: now, the most */
    uint64_t host_requested_total; /* all pinned bytes asked for */
} device_report_t;

/* The name of the top of the stack the configuration gave the device
 * ([device.N] resource = NAME): the global stats and log adaptors that the
 * builder puts above it are not part of it (they would make every device
 * read "stats"). */
static const char *configured_top_name(const ps_stack_t *stack)
{
    const ps_global_config_t *g = ps_global_config();
    size_t top = stack->count;
    if (top > 0 && g && g->log_file[0] && stack->all[top - 1] == stack->log)
        top--;
    if (top > 0 && g && g->stats != PS_STATS_OFF && stack->all[top - 1] == stack->stats)
        top--;
    const ps_resource_t *r = top > 0 ? stack->all[top - 1] : stack->top;
    return r->name ? r->name : r->ops->type_name;
}

/* Gathers device d's figures from the summed thread counters and its stacks. */
static void gather(const thread_counters_t *sum, int d, device_report_t *r)
{
    memset(r, 0, sizeof *r);
    ps_device_state_t *dev = ps_device(d);
    r->device = d;
    r->dev = dev;
    r->stack = "none";
    snapshot_from(sum, d, &r->calls);
    bool ready = atomic_load(&dev->state) == PS_DEVICE_READY;
    if (ready) {
        ps_query(dev->stack->top, &r->info);
        /* an expandable pool under an adaptor that keeps its own figures (fixed_size) */
        for (size_t i = 0; !r->info.expandable && i < dev->stack->count; i++)
            r->info.expandable = (uint64_t)ps_pool_is_expandable(dev->stack->all[i]);
        r->stack = configured_top_name(dev->stack);
    } else if (dev->resets) {
        r->stack = "dropped";
    }
    add_dropped_totals(&r->info, &dev->dropped);
    ps_resource_t *pool = __atomic_load_n(&dev->host_pool, __ATOMIC_ACQUIRE);
    if (ready && pool)
        ps_query(pool, &r->host_info);
    add_dropped_totals(&r->host_info, &dev->dropped_host);
    ps_stack_t *host = dev->host_stack;
    if (ready && host && host->stats)
        ps_stats_get(host->stats, &r->host_stats);
    for (int c = PS_CALL_CUDA_HOST_ALLOC; c < PS_CALL_COUNT; c++)
        r->host_calls += r->calls.calls[c];
    r->host_ns = sum->time[d][TIME_HOST].ns;
    r->host_requested_current = sum->host_requested[d].current;
    r->host_requested_peak = requested_peak_of(&sum->host_requested[d], &host_bytes[d]);
    r->host_requested_total = (uint64_t)sum->host_requested[d].total;
}

static int device_used(const thread_counters_t *sum, int d)
{
    if (atomic_load(&ps_device(d)->state) == PS_DEVICE_READY || ps_device(d)->resets)
        return 1;
    for (int c = 0; c < PS_CALL_COUNT; c++)
        if (sum->calls[d][c])
            return 1;
    return 0;
}

/* Every barrier the device's table issued (pools, arenas, thread caches)
 * and how many of them joined no busy stream; 0 when the table does not
 * count them. */
static int barrier_totals(const ps_gpu_ops_t *gpu, uint64_t *issued, uint64_t *quiet)
{
    if (!gpu || !gpu->barrier_generation || !gpu->barriers_quiet)
        return 0;
    *issued = gpu->barrier_generation(gpu->ctx);
    *quiet = gpu->barriers_quiet(gpu->ctx);
    return 1;
}

static const char *const oom_names[PS_OOM_COUNT] = {"given_back", "succeeded", "failed", "skipped_capture"};
static const char *const give_names[PS_GIVE_COUNT] = {"decay", "decay_host", "to_neighbours",
                                                      "neighbour_requests", "neighbour_answers", "from_neighbours"};

/* The pinned host pool's object. */
static void write_host_json(FILE *f, const device_report_t *r)
{
    json_writer_t j = {f};
    fprintf(f, ", \"host\": {");
    json_u64(&j, "enabled", ps_global_config() && ps_global_config()->host.enable);
    json_u64(&j, "calls", r->host_calls);
    json_u64(&j, "time_ns", r->host_ns);
    json_i64(&j, "requested_current", r->host_requested_current);
    json_i64(&j, "requested_peak", r->host_requested_peak);
    json_u64(&j, "requested_total", r->host_requested_total);
    json_counters(&j, &r->host_info, true);
    json_u64(&j, "failures", r->host_stats.failures);
    json_i64(&j, "live_peak", r->host_stats.allocations.peak);
    fputc('}', f);
}

static void write_device_json(FILE *f, const device_report_t *r, bool first)
{
    const ps_shim_stats_t *s = &r->calls;
    const ps_device_state_t *dev = r->dev;
    int d = r->device;
    json_writer_t j = {f, true};
    fprintf(f, "%s{\"device\": %d, \"stack\": \"%s\"", first ? "" : ", ", d, r->stack);
    for (int c = 0; c < PS_CALL_COUNT; c++)
        json_u64_in(&j, "calls", call_names[c], s->calls[c]);
    json_u64(&j, "doors.runtime", s->doors[0]);
    json_u64(&j, "doors.driver", s->doors[1]);
    json_u64(&j, "failures", s->failures);
    json_u64(&j, "time_ns.allocate", s->alloc_ns);
    json_u64(&j, "time_ns.free", s->free_ns);
    json_i64(&j, "bytes.requested_current", s->requested_current);
    json_i64(&j, "bytes.requested_peak", s->requested_peak);
    json_u64(&j, "bytes.requested_total", s->requested_total);
    json_counters(&j, &r->info, false);
    json_u64(&j, "resets.count", dev->resets);
    json_u64(&j, "resets.dropped_allocations", dev->dropped_allocations);
    json_u64(&j, "resets.dropped_bytes", dev->dropped_bytes);
    json_u64(&j, "resets.dropped_reserved", dev->dropped.bytes_reserved);
    /* busy streams the newest barrier joined: non-blocking ones it made the legacy stream
     * wait for, blocking ones it found busy (core/gpu_ops.h barrier_joined); 0 = a quiet barrier */
    const ps_gpu_ops_t *gpu = __atomic_load_n(&dev->gpu, __ATOMIC_ACQUIRE);
    if (gpu && gpu->barrier_joined)
        json_u64(&j, "barrier_joins", gpu->barrier_joined(gpu->ctx));
    uint64_t issued, quiet;
    if (barrier_totals(gpu, &issued, &quiet)) {
        json_u64(&j, "barriers_issued", issued);
        json_u64(&j, "barriers_quiet", quiet);
    }
    for (int k = 0; k < PS_OOM_COUNT; k++)
        json_u64_in(&j, "oom_retry", oom_names[k], atomic_load(&oom_counts[d][k]));
    for (int k = 0; k < PS_GIVE_COUNT; k++)
        json_u64_in(&j, "give_back", give_names[k], atomic_load(&give_counts[d][k]));
    if (ps_stats_enabled) {
        uint64_t ns[PS_OP_TIME_KINDS], calls[PS_OP_TIME_KINDS];
        cuda_times(d, ns, calls);
        for (int k = 0; k < PS_OP_TIME_KINDS; k++) {
            char path[64];
            snprintf(path, sizeof path, "cuda_time.%s", op_time_names[k]);
            json_key(&j, path);
            fprintf(f, "{\"calls\": %llu, \"ns\": %llu}", (unsigned long long)calls[k], (unsigned long long)ns[k]);
        }
    }
    json_end(&j);
    write_host_json(f, r);
    fputc('}', f);
}

/* The pinned host pool's lines, when it was used. */
static void write_host_text(FILE *f, const device_report_t *r)
{
    const ps_resource_info_t *info = &r->host_info;
    if (!r->host_calls && !info->upstream_allocs)
        return;
    char b1[32], b2[32], b3[32];
    fprintf(f, "poolshim:   pinned     %llu calls, requested peak %s, reserved peak %s now %s (upstream: %llu allocs, "
               "%llu frees)\n",
            (unsigned long long)r->host_calls, ps_format_bytes(b1, sizeof b1, (uint64_t)r->host_requested_peak),
            ps_format_bytes(b2, sizeof b2, info->peak_bytes_reserved),
            ps_format_bytes(b3, sizeof b3, info->bytes_reserved), (unsigned long long)info->upstream_allocs,
            (unsigned long long)info->upstream_frees);
    fprintf(f, "poolshim:   pinned     %llu fences, %llu host waits (%llu because pending bytes passed the growth bound)\n",
            (unsigned long long)info->fences_recorded, (unsigned long long)info->fence_waits,
            (unsigned long long)info->pending_waits);
    if (r->host_stats.failures)
        fprintf(f, "poolshim:   pinned     %llu allocations failed (out of memory, [host] limit or maximum_size)\n",
                (unsigned long long)r->host_stats.failures);
}

/* The line on the out-of-memory retry of device d, when it happened
 * (global.oom_retry; oom.c, ps_route_oom_give_back). */
static void write_oom_retry_text(FILE *f, int d)
{
    uint64_t given = atomic_load(&oom_counts[d][PS_OOM_GIVEN_BACK]),
             succeeded = atomic_load(&oom_counts[d][PS_OOM_SUCCEEDED]),
             failed = atomic_load(&oom_counts[d][PS_OOM_FAILED]),
             skipped = atomic_load(&oom_counts[d][PS_OOM_SKIPPED_CAPTURE]);
    if (!given && !succeeded && !failed && !skipped)
        return;
    char b[32];
    fprintf(f, "poolshim:   oom retry  %s given back to CUDA allocations the pool does not serve; retried %llu "
               "(%llu succeeded, %llu failed)",
            ps_format_bytes(b, sizeof b, given), (unsigned long long)(succeeded + failed),
            (unsigned long long)succeeded, (unsigned long long)failed);
    if (skipped)
        fprintf(f, "; %llu not retried: a stream capture was open", (unsigned long long)skipped);
    fputc('\n', f);
}

/* The line on memory given back while the program ran (decay,
 * neighbours), when any was. */
static void write_give_text(FILE *f, int d)
{
    uint64_t v[PS_GIVE_COUNT], any = 0;
    for (int k = 0; k < PS_GIVE_COUNT; k++)
        any |= v[k] = atomic_load(&give_counts[d][k]);
    if (!any)
        return;
    char a[32], b[32], c[32], e[32];
    fprintf(f, "poolshim:   given back %s by the decay (pinned %s), %s to neighbours; asked neighbours %llu times, "
               "%llu answers, %s from them\n",
            ps_format_bytes(a, sizeof a, v[PS_GIVE_DECAY]), ps_format_bytes(b, sizeof b, v[PS_GIVE_DECAY_HOST]),
            ps_format_bytes(c, sizeof c, v[PS_GIVE_TO_NEIGHBOURS]), (unsigned long long)v[PS_GIVE_ASKED],
            (unsigned long long)v[PS_GIVE_ANSWERS], ps_format_bytes(e, sizeof e, v[PS_GIVE_FROM_NEIGHBOURS]));
}

/* The calls' lines: by door and function; with statistics on, bytes asked
 * for and time in the shim and in CUDA. */
static void write_calls_text(FILE *f, const device_report_t *r)
{
    const ps_shim_stats_t *s = &r->calls;
    char b1[32], b2[32], b3[32];
    fprintf(f, "poolshim: device %d (stack: %s)\n", r->device, r->stack);
    fprintf(f, "poolshim:   calls      runtime %llu  driver %llu  failures %llu\n", (unsigned long long)s->doors[0],
            (unsigned long long)s->doors[1], (unsigned long long)s->failures);
    for (int c = 0; c < PS_CALL_COUNT; c++)
        if (s->calls[c])
            fprintf(f, "poolshim:     %-16s %llu\n", call_names[c], (unsigned long long)s->calls[c]);
    if (!ps_stats_enabled)
        return;
    uint64_t n = s->doors[0] + s->doors[1], shim_ns = s->alloc_ns + s->free_ns;
    fprintf(f, "poolshim:   requested  peak %s  total %s  outstanding %s\n",
            ps_format_bytes(b1, sizeof b1, (uint64_t)s->requested_peak),
            ps_format_bytes(b2, sizeof b2, s->requested_total),
            ps_format_bytes(b3, sizeof b3, (uint64_t)(s->requested_current > 0 ? s->requested_current : 0)));
    fprintf(f, "poolshim:   time       %.3f ms in the shim (%.0f ns per call)\n", (double)shim_ns / 1e6,
            n ? (double)shim_ns / (double)n : 0.0);
    uint64_t ns[PS_OP_TIME_KINDS], calls[PS_OP_TIME_KINDS];
    cuda_times(r->device, ns, calls);
    fprintf(f, "poolshim:   in CUDA   ");
    for (int k = 0; k < PS_OP_TIME_KINDS; k++)
        fprintf(f, " %s %.3f ms (%llu)", op_time_names[k], (double)ns[k] / 1e6, (unsigned long long)calls[k]);
    fputc('\n', f);
}

static void write_device_text(FILE *f, const device_report_t *r)
{
    const ps_resource_info_t *info = &r->info;
    const ps_device_state_t *dev = r->dev;
    char b1[32], b2[32];
    write_calls_text(f, r);
    fprintf(f, "poolshim:   reserved   peak %s  now %s  (upstream: %llu allocs, %llu frees)\n",
            ps_format_bytes(b1, sizeof b1, info->peak_bytes_reserved),
            ps_format_bytes(b2, sizeof b2, info->bytes_reserved), (unsigned long long)info->upstream_allocs,
            (unsigned long long)info->upstream_frees);
    text_counters(f, "poolshim:   fences    ", info);
    uint64_t issued, quiet;
    if (barrier_totals(__atomic_load_n(&dev->gpu, __ATOMIC_ACQUIRE), &issued, &quiet) && issued)
        fprintf(f, "poolshim:   barriers   %llu issued on the device, %llu quiet (joined no busy stream)\n",
                (unsigned long long)issued, (unsigned long long)quiet);
    fprintf(f, "poolshim:   memory     %s\n",
            info->expandable ? "expandable (one virtual-memory range per pool, mapped as it grows)"
                             : "chunks from cuMemAlloc");
    if (dev->resets)
        fprintf(f, "poolshim:   resets     %u (the context died under the stack: %llu live allocations, %s, "
                   "and %s reserved went with it)\n",
                dev->resets, (unsigned long long)dev->dropped_allocations,
                ps_format_bytes(b1, sizeof b1, dev->dropped_bytes),
                ps_format_bytes(b2, sizeof b2, dev->dropped.bytes_reserved));
    write_oom_retry_text(f, r->device);
    write_give_text(f, r->device);
    write_host_text(f, r);
}

/* A launcher's number as a JSON member "key": N, when it is a whole number. */
static void write_number(FILE *f, const char *key, const char *text)
{
    char *end = NULL;
    long value = *text ? strtol(text, &end, 10) : -1;
    if (*text && end != text && !*end && value >= 0)
        fprintf(f, "\"%s\": %ld, ", key, value);
}

void ps_stats_write_place(FILE *f)
{
    ps_job_place_t place;
    ps_job_place(&place);
    write_number(f, "rank", place.rank);
    write_number(f, "local_rank", place.local_rank);
    write_number(f, "node", place.node);
    fprintf(f, "\"hostname\": \"%s\", ", place.host); /* (safe words: nothing to escape) */
    if (place.job[0])
        fprintf(f, "\"job\": \"%s\", ", place.job);
    if (place.step[0])
        fprintf(f, "\"step\": \"%s\", ", place.step);
}

/* The process's part before the devices. */
static void write_process_json(FILE *f, const thread_counters_t *sum)
{
    fprintf(f, "{\"poolshim\": 1, \"pid\": %d, \"version\": \"%s\", ", (int)getpid(), poolshim_version());
    ps_stats_write_place(f);
    fprintf(f, "\"passthrough\": %llu, \"invalid_frees\": %llu, ", (unsigned long long)sum->passthrough,
            (unsigned long long)sum->invalid);
    fprintf(f, "\"ipc\": {\"exported\": %llu, \"opened\": %llu, \"refused\": %llu}, \"devices\": [",
            (unsigned long long)atomic_load(&ipc_counts[PS_IPC_EXPORTED]),
            (unsigned long long)atomic_load(&ipc_counts[PS_IPC_OPENED]),
            (unsigned long long)atomic_load(&ipc_counts[PS_IPC_REFUSED]));
}

/* The process's lines after the devices. */
static void write_process_text_end(FILE *f, const thread_counters_t *sum)
{
    fprintf(f, "poolshim: passthrough calls %llu, invalid frees %llu\n", (unsigned long long)sum->passthrough,
            (unsigned long long)sum->invalid);
    unsigned long long exported = atomic_load(&ipc_counts[PS_IPC_EXPORTED]),
                       opened = atomic_load(&ipc_counts[PS_IPC_OPENED]),
                       refused = atomic_load(&ipc_counts[PS_IPC_REFUSED]);
    if (exported || opened || refused)
        fprintf(f, "poolshim: IPC handles exported %llu, opened %llu, refused %llu\n", exported, opened, refused);
}

void ps_stats_write(FILE *f, int json)
{
    static thread_counters_t sum;        /* large: not on the stack */
    static device_report_t report;       /* the same */
    static pthread_mutex_t sum_lock = PTHREAD_MUTEX_INITIALIZER; /* the exit report, the live page (shim/live.c) */
    pthread_mutex_lock(&sum_lock);
    sum_all(&sum);
    if (json)
        write_process_json(f, &sum);
    else
        fprintf(f, "poolshim: statistics of pid %d (poolshim %s)\n", (int)getpid(), poolshim_version());
    bool first = true;
    for (int d = 0; d < PS_MAX_DEVICES; d++) {
        if (!device_used(&sum, d))
            continue;
        gather(&sum, d, &report);
        if (json)
            write_device_json(f, &report, first);
        else
            write_device_text(f, &report);
        first = false;
    }
    if (json)
        fprintf(f, "]}\n");
    else
        write_process_text_end(f, &sum);
    fflush(f);
    pthread_mutex_unlock(&sum_lock);
}

static int report_disabled; /* set in a forked child: see ps_stats_forget_at_exit */
static int forked_child;    /* set in every forked child: no hints (ps_stats_report_at_exit's answer) */

void ps_stats_forget_at_exit(void) { report_disabled = 1; }

static void write_report_at_exit(void);

bool ps_stats_report_at_exit(void)
{
    if (report_disabled)
        return false;
    for (int d = 0; d < PS_MAX_DEVICES; d++) {
        ps_device_state_t *dev = ps_device(d);
        if (atomic_load(&dev->state) != PS_DEVICE_READY)
            continue;
        if (dev->stack->log)
            ps_log_flush(dev->stack->log);
        if (dev->stack->track)
            ps_track_report(dev->stack->track, stderr);
        if (dev->host_stack && dev->host_stack->log)
            ps_log_flush(dev->host_stack->log);
        if (dev->host_stack && dev->host_stack->track)
            ps_track_report(dev->host_stack->track, stderr);
    }
    if (ps_global_config() && ps_global_config()->stats != PS_STATS_OFF)
        write_report_at_exit();
    return !forked_child;
}

/* The statistics report at exit, to stderr or global.stats_file: written
 * to a new file of mode 0600 and renamed over the name, which must be
 * absent, a regular file of this user or a character device
 * (core/safe_file.c); else refused with a warning, and printed here. */
static void write_report_at_exit(void)
{
    const ps_global_config_t *g = ps_global_config();
    FILE *f = stderr;
    char path[PS_PATH_MAX], why[128] = "";
    static ps_safe_file_t file; /* (8 KiB: not on the stack of a thread at exit) */
    bool to_file = false;
    if (g->stats_file[0] && ps_expand_path(g->stats_file, -1, path, sizeof path) == PS_OK) {
        if (ps_safe_file_create(&file, path, NULL, why, sizeof why) == PS_OK && (f = fdopen(file.fd, "w")))
            to_file = true;
        else
            ps_safe_file_close(&file);
        if (!to_file) {
            ps_warning("cannot write statistics to %s (%s): printing them here", path, why[0] ? why : strerror(errno));
            f = stderr;
        }
    }
    ps_stats_write(f, g->stats == PS_STATS_JSON);
    if (!to_file)
        return;
    if (fflush(f) != 0 || ferror(f))
        ps_warning("cannot write statistics to %s (%s)", path, strerror(errno));
    else if (ps_safe_file_commit(&file, why, sizeof why) != PS_OK)
        ps_warning("cannot write statistics to %s (%s)", path, why);
    fclose(f); /* (the descriptor goes with it) */
    file.fd = -1;
    ps_safe_file_close(&file); /* (removes the new file when it was not committed) */
}

void ps_stats_write_now(FILE *f)
{
    ps_devices_report_begin(); /* (a context reset writes what the report reads) */
    ps_stats_write(f, 1);
    ps_devices_report_end();
}

/* poolshim_stats_json (shim/poolshim.h): the report as the live page writes
 * it (ps_stats_write_now), into the caller's buffer. Memory only, no CUDA
 * call (5. above). */
PS_EXPORT long poolshim_stats_json(char *buf, size_t size)
{
    char *text = NULL;
    size_t length = 0;
    FILE *f = open_memstream(&text, &length);
    if (!f)
        return PS_ENOMEM;
    ps_stats_write_now(f);
    if (fclose(f) != 0 || !text) {
        free(text);
        return PS_ENOMEM;
    }
    if (length && text[length - 1] == '\n')
        text[--length] = '\0'; /* one JSON object, no line end */
    if (buf && size) {
        size_t n = length < size - 1 ? length : size - 1;
        memcpy(buf, text, n);
        buf[n] = '\0';
    }
    free(text);
    return (long)length;
}

void ps_stats_atfork_child(void)
{
    forked_child = 1;
    pthread_mutex_init(&list_lock, NULL);
}
