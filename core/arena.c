/* arena: a suballocator built for many threads (core/arena.h), after the
 * design of RMM's arena_memory_resource. This file is its front: the
 * resource table and defragmentation, over three layers that each own
 * their state, called one way (front -> local -> global; front -> large ->
 * global), answering with returned values:
 *   core/arena_local.c   one arena per thread and per stream: size
 *                        classes, superblocks cut into blocks, deferred
 *                        frees, the thread floor
 *   core/arena_large.c   requests above half a superblock: runs of whole
 *                        superblocks, their deferred frees, eager barrier
 *   core/arena_global.c  chunks from the upstream, free runs of
 *                        superblocks by best fit, the page table
 *
 * Algorithm:
 *  1. allocate(size) (size 0 counts as 1): up to superblock_size/2 a block
 *     of the calling thread's arena (PS_STREAM_NONE) or the stream's;
 *     above that a run of whole superblocks. The per-thread default
 *     stream's calls go as PS_STREAM_NONE's (ps_reuse_list_stream).
 *  2. free(ptr): the page table finds the span from the address alone,
 *     from any thread; a span without an owner is a large block, else the
 *     owner checks the block under its lock (it looks again when the
 *     superblock changed hands meanwhile).
 *  3. stream_destroyed(s): s's arena is retired (it serves the next new
 *     stream once s's last work is behind), and free spans fenced on s are
 *     marked as fenced on some other stream (the handle may come back).
 *  4. On failure the arena defragments: every reuse state releases what it
 *     can (one barrier for the family, else its epochs closed and waited
 *     for), every arena gives back its empty superblocks, the global arena
 *     drops completed fences (waiting for the others) and gives wholly
 *     free chunks back to the upstream; then it retries once. If that
 *     fails too it warns with the fragmentation (largest free run against
 *     all free bytes) and returns PS_ENOMEM. trim() is the same without
 *     the host waits.
 * Guarantees: pointers aligned to `alignment`; no block freed under
 * BARRIER or EVENT reused before a barrier begun after its free or a fence
 * recorded after its free completed; bad or double frees return PS_EINVAL
 * and change nothing; PS_ENOMEM leaves it usable. Limits: device addresses
 * below 2^48 (true of CUDA's UVA); no destroy while threads still use it.
 */
#include "arena.h"
#include "arena_large.h"
#include "arena_local.h"

/* The resource: the three layers and what they share. */
typedef struct arena_resource {
    ps_resource_t base;         /* vtable first */
    ps_arena_options_t opts;    /* effective options */
    arena_locals_t locals;      /* thread and stream arenas */
    arena_global_t global;      /* chunks, free runs, page table */
    arena_large_t large;        /* requests above half a superblock (under the global lock) */
    ps_reuse_family_t family;   /* barrier numbers shared by every reuse state of the arena */
} arena_resource_t;

void ps_arena_options_default(ps_arena_options_t *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->superblock_size = 2 * PS_MiB;
    opts->alignment = 256;
    opts->free_sync = PS_FREE_SYNC_BARRIER;
    opts->thread_floor = 16 * PS_MiB;
}

/* Step 4 without the retry: every layer gives back what it can
 * (ARENA_HOST_WAIT: waiting for fences and epochs). No lock held. */
static void defragment(arena_resource_t *a, arena_wait_t wait)
{
    arena_local_reclaim(&a->locals, wait);
    arena_large_reclaim(&a->large, wait);
    arena_global_reclaim(&a->global, wait);
}

static int try_allocate(arena_resource_t *a, size_t size, ps_stream_t stream, void **out)
{
    if (size > a->locals.small_max)
        return arena_large_allocate(&a->large, size, stream, out);
    return arena_local_allocate(&a->locals, size, stream, out);
}

static void warn_fragmentation(arena_resource_t *a, size_t size)
{
    arena_global_figures_t g = arena_global_figures(&a->global);
    arena_local_figures_t local = arena_local_figures(&a->locals);
    arena_large_figures_t large = arena_large_figures(&a->large);
    uint64_t used = local.in_use + local.pending + large.in_use + large.pending;
    uint64_t free_bytes = g.reserved > used ? g.reserved - used : 0;
    char b1[32], b2[32], b3[32], b4[32];
    ps_warning("arena '%s': out of memory for %s: largest free run %s of %s free (%s reserved)%s",
               a->base.name, ps_format_bytes(b1, sizeof b1, size),
               ps_format_bytes(b2, sizeof b2, g.largest_free), ps_format_bytes(b3, sizeof b3, free_bytes),
               ps_format_bytes(b4, sizeof b4, g.reserved), free_bytes > g.largest_free ? ": fragmented" : "");
}

static int arena_res_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    arena_resource_t *a = (arena_resource_t *)r;
    stream = ps_reuse_list_stream(stream); /* (the per-thread default stream: the cudaFree way) */
    if (size == 0)
        size = 1;
    if (size > SIZE_MAX - a->opts.superblock_size)
        return PS_ENOMEM;
    int status = try_allocate(a, size, stream, out);
    if (status == PS_ENOMEM) {
        defragment(a, ARENA_HOST_WAIT);
        status = try_allocate(a, size, stream, out);
        if (status == PS_ENOMEM)
            warn_fragmentation(a, size);
    }
    return status;
}

static int arena_res_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    (void)size;
    arena_resource_t *a = (arena_resource_t *)r;
    stream = ps_reuse_list_stream(stream);
    int status = arena_local_deallocate(&a->locals, ptr, stream);
    if (status == ARENA_NOT_LOCAL)
        status = arena_large_deallocate(&a->large, ptr, stream);
    return status;
}

static int arena_res_trim(ps_resource_t *r)
{
    defragment((arena_resource_t *)r, ARENA_POLL);
    return PS_OK;
}

static void arena_res_query(ps_resource_t *r, ps_resource_info_t *info)
{
    arena_resource_t *a = (arena_resource_t *)r;
    arena_global_figures_t g = arena_global_figures(&a->global);
    arena_local_figures_t local = arena_local_figures(&a->locals);
    arena_large_figures_t large = arena_large_figures(&a->large);
    info->bytes_reserved = g.reserved;
    info->peak_bytes_reserved = g.peak_reserved;
    info->upstream_allocs = g.upstream_allocs;
    info->upstream_frees = g.upstream_frees;
    if (g.largest_free > info->largest_free_block)
        info->largest_free_block = g.largest_free;
    info->bytes_in_use = local.in_use + large.in_use;
    info->bytes_pending = local.pending + large.pending;
    uint64_t used = info->bytes_in_use + info->bytes_pending;
    info->bytes_free = info->bytes_reserved > used ? info->bytes_reserved - used : 0;
    info->fences_recorded = local.fences_recorded + large.fences_recorded;
    info->fence_waits = g.fence_waits + local.fence_waits + large.fence_waits;
    info->barriers += local.barriers + large.barriers;
}

static void arena_res_destroy(ps_resource_t *r)
{
    arena_resource_t *a = (arena_resource_t *)r;
    arena_locals_destroy(&a->locals);
    arena_large_destroy(&a->large);
    arena_global_destroy(&a->global);
    free(a);
}

/* The program is about to destroy `stream` (step 3). */
static void arena_res_stream_destroyed(ps_resource_t *r, ps_stream_t stream)
{
    arena_resource_t *a = (arena_resource_t *)r;
    if (!ps_reuse_stream_ordered(stream)) /* no arena of its own */
        return;
    arena_local_stream_destroyed(&a->locals, stream);
    arena_global_stream_destroyed(&a->global, stream);
}

static const ps_resource_ops_t arena_ops = {
    .type_name = "arena",
    .allocate = arena_res_allocate,
    .deallocate = arena_res_deallocate,
    .trim = arena_res_trim,
    .query = arena_res_query,
    .destroy = arena_res_destroy,
    .stream_destroyed = arena_res_stream_destroyed,
};

int ps_arena_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                    const ps_arena_options_t *opts, ps_resource_t **out)
{
    ps_arena_options_t o;
    if (opts)
        o = *opts;
    else
        ps_arena_options_default(&o);
    if (!upstream || !out || !gpu || !ps_is_pow2(o.alignment) || o.alignment < 256 ||
        !ps_is_pow2(o.superblock_size) || o.superblock_size < 64 * PS_KiB ||
        o.superblock_size < 8 * o.alignment) {
        ps_error("arena: invalid options (needs an upstream and a GPU-ops table; alignment a "
                 "power of two >= 256; superblock_size a power of two >= 64 KiB and >= 8 x alignment)");
        return PS_EINVAL;
    }
    arena_resource_t *a = arena_line_calloc(sizeof *a); /* its locks on lines of their own */
    if (!a)
        return PS_ENOMEM;
    a->base.ops = &arena_ops;
    a->base.name = name ? name : "arena";
    a->base.upstream = upstream;
    a->opts = o;
    if (arena_global_init(&a->global, upstream, gpu, o.superblock_size, o.maximum_size) != PS_OK) {
        free(a);
        return PS_ENOMEM;
    }
    if (arena_locals_init(&a->locals, &a->global, gpu, &a->family, o.free_sync, o.alignment,
                          o.thread_floor) != PS_OK) {
        arena_global_destroy(&a->global);
        free(a);
        return PS_ENOMEM;
    }
    arena_large_init(&a->large, &a->global, gpu, o.free_sync, &a->family);
    if (o.initial_size && arena_global_reserve(&a->global, o.initial_size) != PS_OK) {
        ps_error("arena '%s': cannot reserve the initial %zu bytes", a->base.name, o.initial_size);
        a->base.ops->destroy(&a->base);
        return PS_ENOMEM;
    }
    *out = &a->base;
    return PS_OK;
}
