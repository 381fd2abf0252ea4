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
 * 3. Bytes requested (current, peak) need one global view: per-device
 *    atomics, updated only when statistics are enabled.
 * 4. IPC counters (exported, opened, refused) are rare: process-wide atomics.
 * 5. The exit report reads memory only: no CUDA call after the runtime may
 *    have been torn down.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/adaptors.h"
#include "stats.h"

int ps_stats_enabled;

typedef struct thread_counters {
    struct thread_counters *next, *prev;      /* links in the live list */
    uint64_t calls[PS_MAX_DEVICES][PS_CALL_COUNT];
    uint64_t failures[PS_MAX_DEVICES];
    uint64_t alloc_ns[PS_MAX_DEVICES];
    uint64_t free_ns[PS_MAX_DEVICES];
    uint64_t host_ns[PS_MAX_DEVICES];         /* time in pinned host calls */
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

typedef struct byte_counters {
    atomic_llong current;   /* bytes requested and not freed */
    atomic_llong peak;      /* maximum of current */
    atomic_ullong total;    /* sum of requests */
} byte_counters_t;
static byte_counters_t bytes[PS_MAX_DEVICES];
static byte_counters_t host_bytes[PS_MAX_DEVICES]; /* pinned host memory, apart from device bytes */
static atomic_ullong ipc_counts[PS_IPC_COUNT];     /* IPC handles exported, opened, refused */

/* Is `call` one of the pinned host memory calls? */
static int is_host_call(int call) { return call >= PS_CALL_CUDA_HOST_ALLOC; }
/* The door of a device call: cuda* runtime, cu* driver. */
static int door_of_call(int call)
{
    return call >= PS_CALL_CU_MEM_ALLOC && call <= PS_CALL_CU_MEM_FREE_ASYNC ? PS_DOOR_DRIVER : PS_DOOR_RUNTIME;
}

#define BUMP(field, n) PS_STATS_BUMP(field, n)
#define READ(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)

static void add_into(thread_counters_t *dst, thread_counters_t *src)
{
    for (int d = 0; d < PS_MAX_DEVICES; d++) {
        for (int c = 0; c < PS_CALL_COUNT; c++)
            dst->calls[d][c] += READ(src->calls[d][c]);
        dst->failures[d] += READ(src->failures[d]);
        dst->alloc_ns[d] += READ(src->alloc_ns[d]);
        dst->free_ns[d] += READ(src->free_ns[d]);
        dst->host_ns[d] += READ(src->host_ns[d]);
    }
    dst->passthrough += READ(src->passthrough);
    dst->invalid += READ(src->invalid);
}

static void thread_exit(void *p)
{
    thread_counters_t *t = p;
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

void ps_stats_init(int enabled) { ps_stats_enabled = enabled; }

static void bytes_add_to(byte_counters_t *b, int64_t delta)
{
    long long now = atomic_fetch_add_explicit(&b->current, delta, memory_order_relaxed) + delta;
    if (delta > 0) {
        atomic_fetch_add_explicit(&b->total, (unsigned long long)delta, memory_order_relaxed);
        long long peak = atomic_load_explicit(&b->peak, memory_order_relaxed);
        while (now > peak && !atomic_compare_exchange_weak_explicit(&b->peak, &peak, now, memory_order_relaxed,
                                                                    memory_order_relaxed))
            ;
    }
}

static void bytes_add(int device, int64_t delta) { bytes_add_to(&bytes[device], delta); }

void ps_stats_count_allocate_all(int device, int call, int door, size_t size, int status, uint64_t ns)
{
    thread_counters_t *t = counters();
    BUMP(t->calls[device][call], 1);
    if (status != PS_OK)
        BUMP(t->failures[device], 1);
    if (ps_stats_enabled && is_host_call(call)) {
        BUMP(t->host_ns[device], ns);
        if (status == PS_OK)
            bytes_add_to(&host_bytes[device], (int64_t)size);
    } else if (ps_stats_enabled) {
        BUMP(t->alloc_ns[device], ns);
        if (status == PS_OK)
            bytes_add(device, (int64_t)size);
    }
}

void ps_stats_count_free_all(int device, int call, int door, size_t size, uint64_t ns)
{
    thread_counters_t *t = counters();
    BUMP(t->calls[device][call], 1);
    if (ps_stats_enabled && is_host_call(call)) {
        BUMP(t->host_ns[device], ns);
        bytes_add_to(&host_bytes[device], -(int64_t)size);
    } else if (ps_stats_enabled) {
        BUMP(t->free_ns[device], ns);
        bytes_add(device, -(int64_t)size);
    }
}

void ps_stats_count_dropped(int device, uint64_t dropped_bytes)
{
    if (ps_stats_enabled && dropped_bytes)
        bytes_add(device, -(int64_t)dropped_bytes);
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

static void snapshot_from(const thread_counters_t *sum, int d, ps_shim_stats_t *out)
{
    memset(out, 0, sizeof *out);
    memcpy(out->calls, sum->calls[d], sizeof out->calls);
    /* the door is known from the function: cuda* runtime, cu* driver */
    for (int c = 0; c < PS_CALL_CUDA_HOST_ALLOC; c++) /* device calls; pinned host calls apart */
        out->doors[door_of_call(c)] += out->calls[c];
    out->failures = sum->failures[d];
    out->alloc_ns = sum->alloc_ns[d];
    out->free_ns = sum->free_ns[d];
    out->requested_current = atomic_load(&bytes[d].current);
    out->requested_peak = atomic_load(&bytes[d].peak);
    out->requested_total = atomic_load(&bytes[d].total);
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

/* The pinned host pool of device d, now and dropped with earlier contexts. */
static void host_pool_info(const ps_device_state_t *dev, ps_resource_info_t *info)
{
    ps_resource_t *pool = __atomic_load_n(&dev->host_pool, __ATOMIC_ACQUIRE);
    if (atomic_load(&dev->state) == PS_DEVICE_READY && pool)
        ps_query(pool, info);
    const ps_resource_info_t *gone = &dev->dropped_host;
    info->upstream_allocs += gone->upstream_allocs;
    info->upstream_frees += gone->upstream_frees;
    info->fences_recorded += gone->fences_recorded;
    info->fence_waits += gone->fence_waits;
    info->pending_waits += gone->pending_waits;
    if (gone->peak_bytes_reserved > info->peak_bytes_reserved)
        info->peak_bytes_reserved = gone->peak_bytes_reserved;
}

/* The pinned host pool's part of the report (JSON object, or text lines). */
static void write_host(FILE *f, int json, const ps_device_state_t *dev, const ps_shim_stats_t *s, uint64_t host_ns)
{
    ps_resource_info_t info = {0};
    host_pool_info(dev, &info);
    const byte_counters_t *hb = &host_bytes[dev->device];
    /* the host stack's stats adaptor (global.stats on): failed allocations, live blocks */
    ps_stats_t st = {0};
    ps_stack_t *host = dev->host_stack;
    if (atomic_load(&dev->state) == PS_DEVICE_READY && host && host->stats)
        ps_stats_get(host->stats, &st);
    uint64_t calls = 0;
    for (int c = PS_CALL_CUDA_HOST_ALLOC; c < PS_CALL_COUNT; c++)
        calls += s->calls[c];
    if (json) {
        fprintf(f,
                ", \"host\": {\"enabled\": %d, \"calls\": %llu, \"time_ns\": %llu, "
                "\"requested_current\": %lld, \"requested_peak\": %lld, \"requested_total\": %llu, "
                "\"reserved_current\": %llu, \"reserved_peak\": %llu, \"in_use\": %llu, \"pending\": %llu, "
                "\"upstream\": {\"allocs\": %llu, \"frees\": %llu}, \"fences\": {\"recorded\": %llu, "
                "\"waits\": %llu}, \"bound_waits\": %llu, \"failures\": %llu, \"live_peak\": %lld}",
                ps_global && ps_global->host.enable, (unsigned long long)calls, (unsigned long long)host_ns,
                (long long)atomic_load(&hb->current), (long long)atomic_load(&hb->peak),
                (unsigned long long)atomic_load(&hb->total), (unsigned long long)info.bytes_reserved,
                (unsigned long long)info.peak_bytes_reserved, (unsigned long long)info.bytes_in_use,
                (unsigned long long)info.bytes_pending, (unsigned long long)info.upstream_allocs,
                (unsigned long long)info.upstream_frees, (unsigned long long)info.fences_recorded,
                (unsigned long long)info.fence_waits, (unsigned long long)info.pending_waits,
                (unsigned long long)st.failures, (long long)st.allocations.peak);
        return;
    }
    if (!calls && !info.upstream_allocs)
        return;
    char b1[32], b2[32], b3[32];
    fprintf(f, "poolshim:   pinned     %llu calls, requested peak %s, reserved peak %s now %s (upstream: %llu allocs, "
               "%llu frees)\n",
            (unsigned long long)calls, ps_format_bytes(b1, sizeof b1, (uint64_t)atomic_load(&hb->peak)),
            ps_format_bytes(b2, sizeof b2, info.peak_bytes_reserved), ps_format_bytes(b3, sizeof b3, info.bytes_reserved),
            (unsigned long long)info.upstream_allocs, (unsigned long long)info.upstream_frees);
    fprintf(f, "poolshim:   pinned     %llu fences, %llu host waits (%llu because pending bytes passed the growth bound)\n",
            (unsigned long long)info.fences_recorded, (unsigned long long)info.fence_waits,
            (unsigned long long)info.pending_waits);
    if (st.failures)
        fprintf(f, "poolshim:   pinned     %llu allocations failed (out of memory, [host] limit or maximum_size)\n",
                (unsigned long long)st.failures);
}

/* The name of the top of the stack the configuration gave the device
 * ([device.N] resource = NAME): the global stats and log adaptors that the
 * builder puts above it are not part of it (they would make every device
 * read "stats"). */
static const char *configured_top_name(const ps_stack_t *stack)
{
    size_t top = stack->count;
    if (top > 0 && ps_global && ps_global->log_file[0] && stack->all[top - 1] == stack->log)
        top--;
    if (top > 0 && ps_global && ps_global->stats != PS_STATS_OFF && stack->all[top - 1] == stack->stats)
        top--;
    const ps_resource_t *r = top > 0 ? stack->all[top - 1] : stack->top;
    return r->name ? r->name : r->ops->type_name;
}

static int device_used(const thread_counters_t *sum, int d)
{
    if (atomic_load(&ps_devices[d].state) == PS_DEVICE_READY || ps_devices[d].resets)
        return 1;
    for (int c = 0; c < PS_CALL_COUNT; c++)
        if (sum->calls[d][c])
            return 1;
    return 0;
}

void ps_stats_write(FILE *f, int json)
{
    static thread_counters_t sum;
    sum_all(&sum);
    char b1[32], b2[32], b3[32];
    if (json) {
        fprintf(f, "{\"poolshim\": 1, \"pid\": %d, ", (int)getpid());
        /* the launcher's rank (as %r reads it), when one is set and numeric */
        const char *rank = ps_env_rank();
        char *end = NULL;
        long rank_value = rank ? strtol(rank, &end, 10) : -1;
        if (rank && end != rank && !*end && rank_value >= 0)
            fprintf(f, "\"rank\": %ld, ", rank_value);
        fprintf(f, "\"passthrough\": %llu, \"invalid_frees\": %llu, ", (unsigned long long)sum.passthrough,
                (unsigned long long)sum.invalid);
        fprintf(f, "\"ipc\": {\"exported\": %llu, \"opened\": %llu, \"refused\": %llu}, \"devices\": [",
                (unsigned long long)atomic_load(&ipc_counts[PS_IPC_EXPORTED]),
                (unsigned long long)atomic_load(&ipc_counts[PS_IPC_OPENED]),
                (unsigned long long)atomic_load(&ipc_counts[PS_IPC_REFUSED]));
    }
    int first = 1;
    for (int d = 0; d < PS_MAX_DEVICES; d++) {
        if (!device_used(&sum, d))
            continue;
        ps_shim_stats_t s;
        snapshot_from(&sum, d, &s);
        ps_resource_info_t info = {0};
        ps_device_state_t *dev = &ps_devices[d];
        const char *stack = "none";
        if (atomic_load(&dev->state) == PS_DEVICE_READY) {
            ps_query(dev->stack->top, &info);
            /* an expandable pool under an adaptor that keeps its own figures (fixed_size) */
            for (size_t r = 0; !info.expandable && r < dev->stack->count; r++)
                info.expandable = (uint64_t)ps_pool_is_expandable(dev->stack->all[r]);
            stack = configured_top_name(dev->stack);
        } else if (dev->resets) {
            stack = "dropped";
        }
        /* stacks dropped with their context count in the totals (memory only) */
        const ps_resource_info_t *gone = &dev->dropped;
        info.upstream_allocs += gone->upstream_allocs;
        info.upstream_frees += gone->upstream_frees;
        info.fences_recorded += gone->fences_recorded;
        info.fence_waits += gone->fence_waits;
        if (gone->peak_bytes_reserved > info.peak_bytes_reserved)
            info.peak_bytes_reserved = gone->peak_bytes_reserved;
        if (json) {
            fprintf(f, "%s{\"device\": %d, \"stack\": \"%s\", \"calls\": {", first ? "" : ", ", d, stack);
            for (int c = 0; c < PS_CALL_COUNT; c++)
                fprintf(f, "%s\"%s\": %llu", c ? ", " : "", call_names[c], (unsigned long long)s.calls[c]);
            fprintf(f,
                    "}, \"doors\": {\"runtime\": %llu, \"driver\": %llu}, \"failures\": %llu, "
                    "\"time_ns\": {\"allocate\": %llu, \"free\": %llu}, "
                    "\"bytes\": {\"requested_current\": %lld, \"requested_peak\": %lld, \"requested_total\": %llu, "
                    "\"reserved_current\": %llu, \"reserved_peak\": %llu, \"in_use\": %llu, \"pending\": %llu}, "
                    "\"upstream\": {\"allocs\": %llu, \"frees\": %llu}, "
                    "\"fences\": {\"recorded\": %llu, \"waits\": %llu}, \"barriers\": %llu, "
                    "\"remap_syncs\": %llu, \"remaps_idle\": %llu, \"remap_waits\": %llu, \"expandable\": %llu, "
                    "\"resets\": {\"count\": %u, \"dropped_allocations\": %llu, \"dropped_bytes\": %llu, "
                    "\"dropped_reserved\": %llu}",
                    (unsigned long long)s.doors[0], (unsigned long long)s.doors[1], (unsigned long long)s.failures,
                    (unsigned long long)s.alloc_ns, (unsigned long long)s.free_ns, (long long)s.requested_current,
                    (long long)s.requested_peak, (unsigned long long)s.requested_total,
                    (unsigned long long)info.bytes_reserved, (unsigned long long)info.peak_bytes_reserved,
                    (unsigned long long)info.bytes_in_use, (unsigned long long)info.bytes_pending,
                    (unsigned long long)info.upstream_allocs, (unsigned long long)info.upstream_frees,
                    (unsigned long long)info.fences_recorded, (unsigned long long)info.fence_waits,
                    (unsigned long long)info.barriers, (unsigned long long)info.remap_syncs,
                    (unsigned long long)info.remaps_idle, (unsigned long long)info.remap_waits,
                    (unsigned long long)(info.expandable != 0), dev->resets,
                    (unsigned long long)dev->dropped_allocations, (unsigned long long)dev->dropped_bytes,
                    (unsigned long long)gone->bytes_reserved);
            write_host(f, 1, dev, &s, sum.host_ns[d]);
            fprintf(f, "}");
        } else {
            uint64_t n = s.doors[0] + s.doors[1];
            fprintf(f, "poolshim: device %d (stack: %s)\n", d, stack);
            fprintf(f, "poolshim:   calls      runtime %llu  driver %llu  failures %llu\n",
                    (unsigned long long)s.doors[0], (unsigned long long)s.doors[1], (unsigned long long)s.failures);
            for (int c = 0; c < PS_CALL_COUNT; c++)
                if (s.calls[c])
                    fprintf(f, "poolshim:     %-16s %llu\n", call_names[c], (unsigned long long)s.calls[c]);
            if (ps_stats_enabled) {
                fprintf(f, "poolshim:   requested  peak %s  total %s  outstanding %s\n",
                        ps_format_bytes(b1, sizeof b1, (uint64_t)s.requested_peak),
                        ps_format_bytes(b2, sizeof b2, s.requested_total),
                        ps_format_bytes(b3, sizeof b3, (uint64_t)(s.requested_current > 0 ? s.requested_current : 0)));
                fprintf(f, "poolshim:   time       %.3f ms in the shim (%.0f ns per call)\n",
                        (double)(s.alloc_ns + s.free_ns) / 1e6,
                        n ? (double)(s.alloc_ns + s.free_ns) / (double)n : 0.0);
            }
            fprintf(f, "poolshim:   reserved   peak %s  now %s  (upstream: %llu allocs, %llu frees)\n",
                    ps_format_bytes(b1, sizeof b1, info.peak_bytes_reserved),
                    ps_format_bytes(b2, sizeof b2, info.bytes_reserved), (unsigned long long)info.upstream_allocs,
                    (unsigned long long)info.upstream_frees);
            fprintf(f, "poolshim:   fences     %llu recorded, %llu host waits, %llu barriers",
                    (unsigned long long)info.fences_recorded, (unsigned long long)info.fence_waits,
                    (unsigned long long)info.barriers);
            if (info.remap_syncs)
                fprintf(f, ", %llu device synchronizes to move free pieces (remap)",
                        (unsigned long long)info.remap_syncs);
            if (info.remaps_idle)
                fprintf(f, ", %llu remaps of idle pieces without one", (unsigned long long)info.remaps_idle);
            if (info.remap_waits)
                fprintf(f, ", %llu remaps that waited for one barrier instead", (unsigned long long)info.remap_waits);
            fputc('\n', f);
            fprintf(f, "poolshim:   memory     %s\n",
                    info.expandable ? "expandable (one virtual-memory range per pool, mapped as it grows)"
                                    : "chunks from cuMemAlloc");
            if (dev->resets)
                fprintf(f, "poolshim:   resets     %u (the context died under the stack: %llu live allocations, %s, "
                           "and %s reserved went with it)\n",
                        dev->resets, (unsigned long long)dev->dropped_allocations,
                        ps_format_bytes(b1, sizeof b1, dev->dropped_bytes),
                        ps_format_bytes(b2, sizeof b2, gone->bytes_reserved));
            write_host(f, 0, dev, &s, sum.host_ns[d]);
        }
        first = 0;
    }
    if (json)
        fprintf(f, "]}\n");
    else {
        fprintf(f, "poolshim: passthrough calls %llu, invalid frees %llu\n", (unsigned long long)sum.passthrough,
                (unsigned long long)sum.invalid);
        unsigned long long exported = atomic_load(&ipc_counts[PS_IPC_EXPORTED]),
                           opened = atomic_load(&ipc_counts[PS_IPC_OPENED]),
                           refused = atomic_load(&ipc_counts[PS_IPC_REFUSED]);
        if (exported || opened || refused)
            fprintf(f, "poolshim: IPC handles exported %llu, opened %llu, refused %llu\n", exported, opened, refused);
    }
    fflush(f);
}

static int report_disabled; /* set in a forked child: see ps_stats_forget_at_exit */

void ps_stats_forget_at_exit(void) { report_disabled = 1; }

void ps_stats_report_at_exit(void)
{
    if (report_disabled)
        return;
    for (int d = 0; d < PS_MAX_DEVICES; d++) {
        ps_device_state_t *dev = &ps_devices[d];
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
    if (!ps_global || ps_global->stats == PS_STATS_OFF)
        return;
    FILE *f = stderr;
    char path[PS_PATH_MAX];
    if (ps_global->stats_file[0] && ps_expand_path(ps_global->stats_file, -1, path, sizeof path) == PS_OK) {
        f = fopen(path, "w");
        if (!f) {
            ps_warning("cannot write statistics to %s: printing them here", path);
            f = stderr;
        }
    }
    ps_stats_write(f, ps_global->stats == PS_STATS_JSON);
    if (f != stderr)
        fclose(f);
}

void ps_stats_atfork_child(void)
{
    pthread_mutex_init(&list_lock, NULL);
}
