/* stats adaptor: counts what passes through it (core/adaptors.h).
 *
 * Algorithm:
 *  1. Every counter of PS_STATS_COUNTERS is {current, peak, total} in
 *     atomics: current and total with fetch_add, peak with a CAS loop that
 *     only raises it. No lock, so the hot path adds a few atomic ops and two
 *     clock reads.
 *  2. bytes_requested counts sizes as asked; bytes_allocated counts them
 *     rounded to the 256-byte granule every resource hands out at least
 *     (the exact rounding and the reserved bytes come from the upstream's
 *     query, copied into ps_stats_t.upstream by ps_stats_get).
 *  3. ps_stats_write_text prints an aligned table with human units;
 *     ps_stats_write_json one JSON object per device. Both read memory only.
 * Guarantees: thread-safe; figures read while other threads run are each
 * exact but not one atomic snapshot.
 */
#include "adaptors.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define GRANULE 256 /* the smallest rounding of every resource */

typedef struct atomic_counter {
    _Atomic int64_t current; /* now */
    _Atomic int64_t peak;    /* maximum of current */
    _Atomic int64_t total;   /* sum of increments */
} atomic_counter_t;

typedef struct stats {
    ps_resource_t base; /* vtable first */
#define STATS_FIELD(name, doc) atomic_counter_t name;
    PS_STATS_COUNTERS(STATS_FIELD)
#undef STATS_FIELD
    _Atomic uint64_t frees;    /* deallocations */
    _Atomic uint64_t failures; /* failed allocations */
    _Atomic uint64_t alloc_ns; /* time in allocate */
    _Atomic uint64_t free_ns;  /* time in deallocate */
} stats_t;

static void counter_add(atomic_counter_t *c, int64_t delta)
{
    int64_t now = atomic_fetch_add_explicit(&c->current, delta, memory_order_relaxed) + delta;
    if (delta > 0) {
        atomic_fetch_add_explicit(&c->total, delta, memory_order_relaxed);
        int64_t peak = atomic_load_explicit(&c->peak, memory_order_relaxed);
        while (now > peak &&
               !atomic_compare_exchange_weak_explicit(&c->peak, &peak, now, memory_order_relaxed,
                                                      memory_order_relaxed))
            ;
    }
}

static int stats_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    stats_t *s = (stats_t *)r;
    uint64_t t0 = ps_now_ns();
    int status = ps_allocate(r->upstream, size, stream, out);
    if (status == PS_OK) {
        counter_add(&s->bytes_requested, (int64_t)size);
        counter_add(&s->bytes_allocated, (int64_t)ps_align_up(size ? size : 1, GRANULE));
        counter_add(&s->allocations, 1);
    } else {
        atomic_fetch_add_explicit(&s->failures, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&s->alloc_ns, ps_now_ns() - t0, memory_order_relaxed);
    return status;
}

static int stats_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    stats_t *s = (stats_t *)r;
    uint64_t t0 = ps_now_ns();
    int status = ps_deallocate(r->upstream, ptr, size, stream);
    if (status == PS_OK) {
        counter_add(&s->bytes_requested, -(int64_t)size);
        counter_add(&s->bytes_allocated, -(int64_t)ps_align_up(size ? size : 1, GRANULE));
        counter_add(&s->allocations, -1);
        atomic_fetch_add_explicit(&s->frees, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&s->free_ns, ps_now_ns() - t0, memory_order_relaxed);
    return status;
}

static int stats_trim(ps_resource_t *r) { return ps_trim(r->upstream); }
static void stats_destroy(ps_resource_t *r) { free(r); }

static const ps_resource_ops_t stats_ops = {
    .type_name = "stats",
    .allocate = stats_allocate,
    .deallocate = stats_deallocate,
    .trim = stats_trim,
    .query = NULL, /* the upstream's figures */
    .destroy = stats_destroy,
};

int ps_stats_create(const char *name, ps_resource_t *upstream, ps_resource_t **out)
{
    if (!upstream || !out)
        return PS_EINVAL;
    stats_t *s = calloc(1, sizeof *s);
    if (!s)
        return PS_ENOMEM;
    s->base.ops = &stats_ops;
    s->base.name = name ? name : "stats";
    s->base.upstream = upstream;
    *out = &s->base;
    return PS_OK;
}

void ps_stats_get(ps_resource_t *stats_adaptor, ps_stats_t *out)
{
    stats_t *s = (stats_t *)stats_adaptor;
    memset(out, 0, sizeof *out);
#define STATS_COPY(name, doc)                                                  \
    out->name.current = atomic_load(&s->name.current);                         \
    out->name.peak = atomic_load(&s->name.peak);                               \
    out->name.total = atomic_load(&s->name.total);
    PS_STATS_COUNTERS(STATS_COPY)
#undef STATS_COPY
    out->frees = atomic_load(&s->frees);
    out->failures = atomic_load(&s->failures);
    out->alloc_ns = atomic_load(&s->alloc_ns);
    out->free_ns = atomic_load(&s->free_ns);
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
    const ps_resource_info_t *u = &s->upstream;
    fprintf(f, ", \"upstream\": {\"bytes_in_use\": %" PRIu64 ", \"bytes_reserved\": %" PRIu64
               ", \"peak_bytes_reserved\": %" PRIu64 ", \"bytes_free\": %" PRIu64
               ", \"bytes_pending\": %" PRIu64 ", \"largest_free_block\": %" PRIu64
               ", \"upstream_allocs\": %" PRIu64 ", \"upstream_frees\": %" PRIu64
               ", \"fences_recorded\": %" PRIu64 ", \"fence_waits\": %" PRIu64 "}}\n",
            u->bytes_in_use, u->bytes_reserved, u->peak_bytes_reserved, u->bytes_free,
            u->bytes_pending, u->largest_free_block, u->upstream_allocs, u->upstream_frees,
            u->fences_recorded, u->fence_waits);
}
