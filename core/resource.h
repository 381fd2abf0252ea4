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

typedef struct ps_resource ps_resource_t;

/* What a resource can say about itself; every field in bytes or counts.
 * Adaptors add what they know and forward the rest from their upstream. */
typedef struct ps_resource_info {
    uint64_t bytes_in_use;        /* handed out and not yet freed (as rounded by the resource) */
    uint64_t bytes_reserved;      /* taken from the upstream and not yet given back */
    uint64_t peak_bytes_reserved; /* maximum of bytes_reserved */
    uint64_t bytes_free;          /* reserved, free and reusable now */
    uint64_t bytes_pending;       /* freed, waiting for a fence before reuse */
    uint64_t largest_free_block;  /* largest block allocatable without growing */
    uint64_t upstream_allocs;     /* calls that took memory from the upstream */
    uint64_t upstream_frees;      /* calls that gave memory back to the upstream */
    uint64_t fences_recorded;     /* fences recorded by the free policies */
    uint64_t fence_waits;         /* host waits on a fence (memory pressure) */
    uint64_t barriers;            /* device-wide GPU barriers that released pending blocks */
    uint64_t expandable;          /* resources backed by an expandable (virtual memory) range */
    uint64_t pending_waits;       /* host waits because pending bytes passed the growth bound */
    uint64_t remap_syncs;         /* device synchronizes before moving free memory to a growth (pool remap) */
    uint64_t remaps_idle;         /* remaps that moved idle free memory without a device synchronize */
    uint64_t remap_waits;         /* remaps that waited (host) for the one barrier that released the pieces */
    uint64_t remaps_slack;        /* remaps left out, the pool grown within remap_slack_percent instead of a wait */
    uint64_t remaps_lent;         /* remaps that lent busy pieces' memory to the growth instead of a wait */
} ps_resource_info_t;

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
