/* binning: routes requests by size (core/binning.h).
 *
 * Algorithm:
 *  1. The bins are copied at creation, sorted by max_size (strictly
 *     increasing, checked).
 *  2. allocate(size) binary-searches the first bin with max_size >= size
 *     and forwards to its resource; above the last bin it forwards to the
 *     fallback (PS_EINVAL when there is none).
 *  3. deallocate(ptr, size) routes by the same size, so the block returns
 *     to the resource that served it (the shim's registry keeps sizes).
 *  4. stream_destroyed goes to every distinct bin resource and to the
 *     fallback (each of them may keep per-stream state).
 *  5. query sums the distinct members; a member whose upstream chain
 *     reaches another member (fixed_size bins over the pool that is also
 *     the fallback) has its reserved bytes counted once, as the other's
 *     bytes in use, not twice.
 * Delegated: reuse after cudaFree (free_sync) belongs to its members —
 * fixed_size bins and the fallback — which follow core/reuse.c, so binning
 * gets the barrier and its fallback with no code of its own.
 * Guarantees: no state of its own beyond the bin table (read-only after
 * creation), so it is as thread-safe as its bins.
 */
#include "binning.h"

#include <stdlib.h>
#include <string.h>

typedef struct binning {
    ps_resource_t base;      /* vtable first; upstream = the fallback */
    ps_bin_t *bins;          /* sorted by max_size */
    size_t bin_count;        /* entries in bins */
} binning_t;

/* The resource serving `size`, or NULL if none. */
static ps_resource_t *route(const binning_t *b, size_t size)
{
    size_t lo = 0, hi = b->bin_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (b->bins[mid].max_size < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < b->bin_count ? b->bins[lo].resource : b->base.upstream;
}

static int binning_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    ps_resource_t *target = route((binning_t *)r, size);
    return target ? ps_allocate(target, size, stream, out) : PS_EINVAL;
}

static int binning_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    ps_resource_t *target = route((binning_t *)r, size);
    return target ? ps_deallocate(target, ptr, size, stream) : PS_EINVAL;
}

static int binning_trim(ps_resource_t *r)
{
    binning_t *b = (binning_t *)r;
    int status = PS_OK;
    for (size_t i = 0; i < b->bin_count; i++) {
        int s = ps_trim(b->bins[i].resource);
        if (s != PS_OK)
            status = s;
    }
    if (b->base.upstream) {
        int s = ps_trim(b->base.upstream);
        if (s != PS_OK)
            status = s;
    }
    return status;
}

/* Member i: bin i's resource, or (i == bin_count) the fallback. */
static ps_resource_t *member(const binning_t *b, size_t i)
{
    return i < b->bin_count ? b->bins[i].resource : b->base.upstream;
}

/* Whether member i is the same resource as an earlier member. */
static int repeated(const binning_t *b, size_t i)
{
    for (size_t j = 0; j < i; j++)
        if (member(b, j) == member(b, i))
            return 1;
    return 0;
}

/* The member that `res` takes its memory from (directly or through
 * adaptors), or SIZE_MAX when none: e.g. fixed_size bins over the pool
 * that is also the fallback. */
static size_t nested_in(const binning_t *b, const ps_resource_t *res)
{
    size_t n = b->bin_count + (b->base.upstream != NULL);
    for (const ps_resource_t *up = res->upstream; up; up = up->upstream)
        for (size_t j = 0; j < n; j++)
            if (member(b, j) == up)
                return j;
    return SIZE_MAX;
}

/* Sums what the distinct bins and the fallback report. A member that takes
 * its memory from another member (step 5) counts its free and pending
 * bytes, but its reserved bytes are the other's bytes in use, not new
 * memory: they are taken off that member's bytes in use, and its upstream
 * traffic is internal. */
static void binning_query(ps_resource_t *r, ps_resource_info_t *info)
{
    binning_t *b = (binning_t *)r;
    size_t n = b->bin_count + (b->base.upstream != NULL);
    uint64_t nested_reserved = 0;
    for (size_t i = 0; i < n; i++) {
        if (repeated(b, i))
            continue;
        ps_resource_t *res = member(b, i);
        ps_resource_info_t one = {0};
        ps_query(res, &one);
        int nested = nested_in(b, res) != SIZE_MAX;
        info->bytes_in_use += one.bytes_in_use;
        if (nested) {
            nested_reserved += one.bytes_reserved;
        } else {
            info->bytes_reserved += one.bytes_reserved;
            info->peak_bytes_reserved += one.peak_bytes_reserved;
            info->upstream_allocs += one.upstream_allocs;
            info->upstream_frees += one.upstream_frees;
        }
        info->bytes_free += one.bytes_free;
        info->bytes_pending += one.bytes_pending;
        if (one.largest_free_block > info->largest_free_block)
            info->largest_free_block = one.largest_free_block;
        info->fences_recorded += one.fences_recorded;
        info->fence_waits += one.fence_waits;
        info->barriers += one.barriers;
        if (!nested)
            info->expandable += one.expandable;
    }
    info->bytes_in_use = info->bytes_in_use > nested_reserved ? info->bytes_in_use - nested_reserved : 0;
}

/* Tells every distinct bin resource and the fallback that `stream` dies. */
static void binning_stream_destroyed(ps_resource_t *r, ps_stream_t stream)
{
    binning_t *b = (binning_t *)r;
    size_t n = b->bin_count + (b->base.upstream != NULL);
    for (size_t i = 0; i < n; i++) {
        if (!repeated(b, i))
            ps_stream_destroyed(member(b, i), stream);
    }
}

/* Passes a device synchronize to every distinct bin resource and the fallback. */
static void binning_device_synchronized(ps_resource_t *r)
{
    binning_t *b = (binning_t *)r;
    size_t n = b->bin_count + (b->base.upstream != NULL);
    for (size_t i = 0; i < n; i++) {
        if (!repeated(b, i))
            ps_device_synchronized(member(b, i));
    }
}

/* Passes the decay to every distinct bin resource and the fallback. */
static uint64_t binning_decay(ps_resource_t *r, uint64_t now_ns, uint64_t decay_ns, uint64_t want)
{
    binning_t *b = (binning_t *)r;
    size_t n = b->bin_count + (b->base.upstream != NULL);
    uint64_t given = 0;
    for (size_t i = 0; i < n && !(want && given >= want); i++)
        if (!repeated(b, i))
            given += ps_decay(member(b, i), now_ns, decay_ns, want ? want - given : 0);
    return given;
}

static void binning_destroy(ps_resource_t *r)
{
    binning_t *b = (binning_t *)r;
    free(b->bins);
    free(b);
}

static const ps_resource_ops_t binning_ops = {
    .type_name = "binning",
    .allocate = binning_allocate,
    .deallocate = binning_deallocate,
    .trim = binning_trim,
    .query = binning_query,
    .destroy = binning_destroy,
    .stream_destroyed = binning_stream_destroyed,
    .device_synchronized = binning_device_synchronized,
    .decay = binning_decay,
};

int ps_binning_create(const char *name, const ps_bin_t *bins, size_t bin_count,
                      ps_resource_t *fallback, ps_resource_t **out)
{
    if (!out || (bin_count && !bins) || (!bin_count && !fallback))
        return PS_EINVAL;
    for (size_t i = 0; i < bin_count; i++) {
        if (!bins[i].resource || (i > 0 && bins[i].max_size <= bins[i - 1].max_size)) {
            ps_error("binning: bins must have a resource and strictly increasing max_size "
                     "(bin %zu)", i);
            return PS_EINVAL;
        }
    }
    binning_t *b = calloc(1, sizeof *b);
    ps_bin_t *copy = bin_count ? malloc(bin_count * sizeof *copy) : NULL;
    if (!b || (bin_count && !copy)) {
        free(b);
        free(copy);
        return PS_ENOMEM;
    }
    if (bin_count)
        memcpy(copy, bins, bin_count * sizeof *copy);
    ps_resource_init(&b->base, &binning_ops, name, fallback);
    b->bins = copy;
    b->bin_count = bin_count;
    *out = &b->base;
    return PS_OK;
}
