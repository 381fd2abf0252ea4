/* The resource interface: one small vtable that every suballocator
 * (pool, arena, fixed_size, binning), every upstream (cuda, async, managed,
 * host) and every adaptor (limit, stats, track, log) implements, so that
 * stacks are built by chaining resources, as in RMM.
 *
 * A resource is a struct whose first member is a ps_resource_t. Resources
 * are thread-safe unless their header says otherwise.
 *
 * Streams: `stream` is PS_STREAM_NONE for cudaMalloc/cudaFree (memory safe
 * for every stream, the free goes through the free_sync policy), or a
 * stream handle for cudaMallocAsync/cudaFreeAsync (stream-ordered).
 * deallocate receives the same size and stream kind the block was
 * allocated with (the shim's registry remembers them).
 *
 * Return rule: PS_OK or a negative PS_E* (core/common.h). On any error the
 * resource's state is as it was before the call.
 */
#ifndef PS_RESOURCE_H
#define PS_RESOURCE_H

#include "common.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct ps_resource ps_resource_t;

/* What a resource can say about itself: its counters, one row each, from
 * which ps_resource_info_t, the statistics reports (shim/stats.c, the stats
 * adaptor's core/stats.c), replay's JSON (tools/replay.c) and `poolshim top
 * --prometheus` are made. Adaptors add what they know and forward the rest
 * from their upstream.
 *   X(FIELD, UNIT, JSON, TEXT, SHOWN, PROMETHEUS, DOC)
 *   FIELD       the member of ps_resource_info_t, and its key where a report names counters by
 *               field (replay's JSON, the stats adaptor's)
 *   UNIT        BYTES (held now, or a peak), COUNT (events since the resource was made) or
 *               FLAG (a count reported as 0 or 1)
 *   JSON        its key in a device of the statistics report; "group.key" is key inside the
 *               object group; NULL: not there
 *   TEXT        the words after its number on the text report's counts line; NULL: not there
 *   SHOWN       ALWAYS on that line, or NONZERO: only when it is not 0
 *   PROMETHEUS  its metric in `poolshim top --prometheus` (a COUNT's ends in _total); NULL: none
 *   DOC         what it holds (the metric's help) */
#define PS_RESOURCE_COUNTERS(X)                                                                              \
    X(bytes_reserved, BYTES, "bytes.reserved_current", NULL, ALWAYS, "poolshim_reserved_bytes",              \
      "Bytes the stack holds from CUDA: taken from the upstream and not yet given back.")                    \
    X(peak_bytes_reserved, BYTES, "bytes.reserved_peak", NULL, ALWAYS, "poolshim_reserved_peak_bytes",       \
      "The most bytes the stack held from CUDA.")                                                             \
    X(bytes_in_use, BYTES, "bytes.in_use", NULL, ALWAYS, NULL,                                                \
      "Bytes handed out and not yet freed, as rounded by the resource.")                                     \
    X(bytes_pending, BYTES, "bytes.pending", NULL, ALWAYS, NULL,                                              \
      "Bytes freed and waiting for a fence before reuse.")                                                    \
    X(bytes_free, BYTES, NULL, NULL, ALWAYS, NULL, "Bytes reserved, free and reusable now.")                 \
    X(largest_free_block, BYTES, NULL, NULL, ALWAYS, NULL, "The largest block allocatable without growing.") \
    X(upstream_allocs, COUNT, "upstream.allocs", NULL, ALWAYS, "poolshim_maps_total",                         \
      "Calls that took memory from the upstream: pieces mapped or chunks allocated from CUDA; "              \
      "rising in a steady loop means churn.")                                                                 \
    X(upstream_frees, COUNT, "upstream.frees", NULL, ALWAYS, NULL,                                            \
      "Calls that gave memory back to the upstream.")                                                         \
    X(fences_recorded, COUNT, "fences.recorded", "recorded", ALWAYS, NULL,                                    \
      "Fences recorded by the free policies.")                                                                \
    X(fence_waits, COUNT, "fences.waits", "host waits", ALWAYS, NULL,                                         \
      "Host waits on a fence (memory pressure).")                                                             \
    X(barriers, COUNT, "barriers", "barriers", ALWAYS, "poolshim_barriers_total",                             \
      "Device-wide GPU barriers that released pending blocks.")                                               \
    X(remap_syncs, COUNT, "remap_syncs", "device synchronizes to move free pieces (remap)", NONZERO, NULL,    \
      "Device synchronizes before moving free memory to a growth (pool remap).")                              \
    X(remaps_idle, COUNT, "remaps_idle", "remaps of idle pieces without one", NONZERO, NULL,                  \
      "Remaps that moved idle free memory without a device synchronize.")                                     \
    X(remap_waits, COUNT, "remap_waits", "remaps that waited for one barrier instead", NONZERO, NULL,         \
      "Remaps that waited (host) for the one barrier that released the pieces.")                              \
    X(remaps_lent, COUNT, "remaps_lent", "remaps that lent busy pieces instead of a wait", NONZERO, NULL,     \
      "Remaps that lent busy pieces' memory to the growth instead of a wait (remap_lend).")                   \
    X(remaps_slack, COUNT, "remaps_slack", "growths within remap_slack_percent instead of a wait", NONZERO,   \
      NULL, "Remaps left out, the pool grown within remap_slack_percent instead of a wait.")                  \
    X(expandable, FLAG, "expandable", NULL, ALWAYS, NULL,                                                     \
      "Resources backed by an expandable (virtual memory) range.")                                            \
    X(pending_waits, COUNT, "bound_waits", NULL, ALWAYS, NULL,                                                \
      "Host waits because pending bytes passed the growth bound.")

typedef struct ps_resource_info {
#define PS_COUNTER_FIELD(field, ...) uint64_t field;
    PS_RESOURCE_COUNTERS(PS_COUNTER_FIELD)
#undef PS_COUNTER_FIELD
} ps_resource_info_t;

/* The counters' indices: PS_COUNTER_bytes_reserved, ... */
typedef enum ps_counter_id {
#define PS_COUNTER_ID(field, ...) PS_COUNTER_##field,
    PS_RESOURCE_COUNTERS(PS_COUNTER_ID)
#undef PS_COUNTER_ID
    PS_COUNTER_COUNT
} ps_counter_id_t;

/* One row of the table, for the code that walks it (core/resource.c). */
typedef struct ps_resource_counter {
    const char *field;      /* FIELD, as a string */
    enum { PS_UNIT_BYTES, PS_UNIT_COUNT, PS_UNIT_FLAG } unit; /* UNIT */
    const char *json;       /* JSON, or NULL */
    const char *text;       /* TEXT, or NULL */
    bool shown_always;      /* SHOWN is ALWAYS */
    const char *prometheus; /* PROMETHEUS, or NULL */
    const char *doc;        /* DOC */
    size_t offset;          /* offsetof(ps_resource_info_t, FIELD) */
} ps_resource_counter_t;
extern const ps_resource_counter_t ps_resource_counters[PS_COUNTER_COUNT];

/* The value of counter `c` in `info`. */
static inline uint64_t ps_resource_counter_value(const ps_resource_info_t *info, const ps_resource_counter_t *c)
{
    return *(const uint64_t *)((const char *)info + c->offset);
}

typedef struct ps_resource_ops {
    const char *type_name; /* "pool", "arena", "limit", ... */

    /* Allocates `size` bytes (size 0 is allowed and returns a unique,
     * aligned, non-NULL pointer that may not be dereferenced). */
    int (*allocate)(ps_resource_t *r, size_t size, ps_stream_t stream, void **out);

    /* Frees a pointer this resource returned. A pointer it does not own,
     * or one already freed, returns PS_EINVAL and changes nothing. */
    int (*deallocate)(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream);

    /* Gives cached memory back to the upstream. NULL: forward to the
     * upstream (adaptors) or nothing cached. */
    int (*trim)(ps_resource_t *r);

    /* Fills *info (zeroed by the caller); may be NULL. */
    void (*query)(ps_resource_t *r, ps_resource_info_t *info);

    /* Releases everything, including memory still handed out. It does not
     * destroy the upstream (the owner of the stack does that). */
    void (*destroy)(ps_resource_t *r);

    /* The program is about to destroy `stream` (still valid during this
     * call): stop keeping anything keyed by it. Blocks freed on it must be
     * retired under a fence recorded on it now, never touched through the
     * dead handle later. NULL: forward to the upstream (adaptors). */
    void (*stream_destroyed)(ps_resource_t *r, ps_stream_t stream);
    /* The program just synchronized the device (cudaDeviceSynchronize):
     * a moment to give memory back (the pool's release_threshold). NULL:
     * forward to the upstream (adaptors) or nothing to do. */
    void (*device_synchronized)(ps_resource_t *r);
    /* A moment to give back free memory the program has not needed for
     * decay_ns (the pool's decay, core/pool_decay.c), called from a thread
     * of the shim's own: only memory the GPU has provably finished with,
     * never a device synchronize or a host wait, and a resource whose lock
     * is busy skips it. decay_ns 0: every free byte proven idle now (a
     * neighbour process asks). want > 0: give back no more than about that
     * many bytes (0: no bound). Returns the bytes given back. NULL: forward
     * to the upstream (adaptors) or nothing to give. */
    uint64_t (*decay)(ps_resource_t *r, uint64_t now_ns, uint64_t decay_ns, uint64_t want);
} ps_resource_ops_t;

struct ps_resource {
    const ps_resource_ops_t *ops; /* the vtable */
    const char *name;             /* the name from the config ("main"), or the type name */
    ps_resource_t *upstream;      /* the resource this one takes memory from, or NULL */
};

/* An adaptor's vtable: its own allocate, deallocate and destroy; trim,
 * query and the rest are the upstream's (NULL entries forward). */
#define PS_ADAPTOR_OPS(type, allocate_fn, deallocate_fn, destroy_fn) \
    {.type_name = (type), .allocate = (allocate_fn), .deallocate = (deallocate_fn), .destroy = (destroy_fn)}

/* The start of every adaptor's create (core/resource.c): PS_EINVAL
 * without an upstream or `out`, PS_ENOMEM; PS_OK with *self = `size`
 * zeroed bytes (aligned to `align` bytes; 0: malloc's alignment, freed
 * with free()) that begin with the ps_resource_t, initialised with `ops`,
 * `name` and `upstream`. *out is left to the caller, once the adaptor is
 * whole. */
int ps_adaptor_start(size_t size, size_t align, const ps_resource_ops_t *ops, const char *name,
                     ps_resource_t *upstream, ps_resource_t **out, void **self);

/* Fills the part every resource starts with: its vtable, its name (the
 * config's, or else the type name) and its upstream (NULL for none). */
static inline void ps_resource_init(ps_resource_t *r, const ps_resource_ops_t *ops, const char *name,
                                    ps_resource_t *upstream)
{
    r->ops = ops;
    r->name = name ? name : ops->type_name;
    r->upstream = upstream;
}

static inline int ps_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    return r->ops->allocate(r, size, stream, out);
}
static inline int ps_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    return r->ops->deallocate(r, ptr, size, stream);
}
static inline int ps_trim(ps_resource_t *r)
{
    if (r->ops->trim)
        return r->ops->trim(r);
    return r->upstream ? ps_trim(r->upstream) : PS_OK;
}
static inline void ps_query(ps_resource_t *r, ps_resource_info_t *info)
{
    if (r->ops->query)
        r->ops->query(r, info);
    else if (r->upstream)
        ps_query(r->upstream, info);
}
static inline void ps_stream_destroyed(ps_resource_t *r, ps_stream_t stream)
{
    if (r->ops->stream_destroyed)
        r->ops->stream_destroyed(r, stream);
    else if (r->upstream)
        ps_stream_destroyed(r->upstream, stream);
}
static inline void ps_device_synchronized(ps_resource_t *r)
{
    if (r->ops->device_synchronized)
        r->ops->device_synchronized(r);
    else if (r->upstream)
        ps_device_synchronized(r->upstream);
}
static inline uint64_t ps_decay(ps_resource_t *r, uint64_t now_ns, uint64_t decay_ns, uint64_t want)
{
    if (r->ops->decay)
        return r->ops->decay(r, now_ns, decay_ns, want);
    return r->upstream ? ps_decay(r->upstream, now_ns, decay_ns, want) : 0;
}
static inline void ps_destroy(ps_resource_t *r)
{
    if (r)
        r->ops->destroy(r);
}

#endif
