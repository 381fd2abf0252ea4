/* arena: a suballocator built for many threads (core/arena.h), after the
 * design of RMM's arena_memory_resource.
 *
 * This file is the recipe: the resource table (allocate, free, trim,
 * query, destroy, a stream's destruction, create) and defragmentation.
 * Each ingredient has a file of its own that opens with its algorithm;
 * core/arena_internal.h holds the types and the calls between them:
 *   core/arena_global.c  the global arena: chunks from the upstream, runs
 *                        of superblocks handed out by best fit, the page
 *                        table
 *   core/arena_local.c   the local arenas, one per thread and one per
 *                        stream: size classes, superblocks cut into
 *                        blocks, cudaFree'd blocks in two segments, the
 *                        thread floor, finding a stream's arena
 *   core/arena_large.c   requests above half a superblock: runs of whole
 *                        superblocks, their deferred frees and eager barrier
 *
 * Algorithm:
 *  1. allocate(size) (size 0 counts as 1): up to superblock_size/2 a block
 *     of a size class in a local arena, the calling thread's
 *     (PS_STREAM_NONE) or the stream's (core/arena_local.c); above that a
 *     run of whole superblocks (core/arena_large.c). Both take
 *     superblocks from the global arena (core/arena_global.c).
 *  2. free(ptr): the page table finds the span from the address alone,
 *     from any thread. A large block goes back through core/arena_large.c.
 *     A small one is checked under its arena's lock (looked up again if
 *     its superblock changed hands meanwhile; not handed out: PS_EINVAL):
 *     freed on the stream of its stream arena it is reusable at once; on
 *     another stream the owner stream first waits (stream_wait_fence) for
 *     a fence recorded at the free (core/reuse.c's handoff; refused
 *     because a capture is open, the block is deferred as a cudaFree'd
 *     one instead); with PS_STREAM_NONE it follows
 *     free_sync: deferred under barrier and event (core/arena_local.c,
 *     through core/reuse.c), after a device synchronize under device, at
 *     once under none. The per-thread default stream is one handle for a
 *     stream per thread: its allocations and frees go as PS_STREAM_NONE's
 *     (ps_reuse_list_stream), never to a stream arena of that handle.
 *  3. stream_destroyed(s): one fence ("retire fence") is recorded on s
 *     while its handle is still valid, and s's arena is *retired*: it
 *     forgets s (stream NONE: later frees of its blocks follow free_sync
 *     like a thread arena's, and no fence or stream wait names s again).
 *     Its free blocks count as pending and none of its superblocks goes
 *     back to the global arena until the retire fence completed (trim
 *     polls it, defragment under pressure host-waits for it). The next new
 *     stream reuses the retired arena as is (core/arena_local.c). Free
 *     spans fenced on s are marked as fenced on "some other stream" (a
 *     new stream may reuse the handle value). So arenas number at most the
 *     live streams (plus threads), however many streams come and go, and a
 *     destroy costs O(size classes), not O(free blocks).
 *  4. On failure the arena defragments — every arena releases its pending
 *     blocks (one barrier for the family, else it closes and waits for
 *     its epochs) and returns its empty superblocks, the global arena gives
 *     wholly free chunks back to the upstream — and retries once. If that
 *     fails too it warns with the fragmentation (largest free run vs all
 *     free bytes) and returns PS_ENOMEM. trim() is the same without the
 *     host waits.
 * Why 2 MiB superblocks: the GPU's large-page granularity and cuMemAlloc's
 * alignment for large blocks, so superblocks never straddle device pages;
 * small enough that a thread holding one superblock per size class it uses
 * keeps little memory idle, large enough that classes up to 1 MiB fit two
 * blocks or more and superblock traffic on the global lock stays rare.
 * Guarantees: pointers aligned to `alignment`; no block freed under
 * BARRIER or EVENT reused before a barrier begun after its free or a fence
 * recorded after its free completed; bad or double frees return PS_EINVAL
 * and change nothing; PS_ENOMEM leaves it usable. Replayed figures are in
 * docs/benchmarks.md ("The arena's design choices").
 * Limits: device addresses must lie below 2^48 (true of CUDA's UVA); the
 * resource must not be destroyed while other threads still use it.
 */
#include "arena_internal.h"

static _Atomic uint64_t next_resource_id; /* ids handed out (arena_resource_t.id) */

void ps_arena_options_default(ps_arena_options_t *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->superblock_size = 2 * PS_MiB;
    opts->alignment = 256;
    opts->free_sync = PS_FREE_SYNC_BARRIER;
    opts->thread_floor = 16 * PS_MiB;
}

/* ---- defragmentation ------------------------------------------------- */

/* Every arena closes its open epoch, reclaims completed ones and gives
 * back its empty superblocks; with `wait`, epochs and fences are waited
 * for first (memory pressure). Then free chunks go back
 * to the upstream. No lock held on entry. */
static void defragment(arena_resource_t *a, int wait)
{
    pthread_rwlock_rdlock(&a->arenas_lock);
    for (arena_t *ar = a->arenas; ar; ar = ar->next) {
        pthread_mutex_lock(&ar->lock);
        ps_reuse_reclaim_pressure(&ar->reuse[0], wait);
        ps_reuse_reclaim_pressure(&ar->reuse[1], wait);
        if (arena_retire_fence_done(ar, wait))
            arena_release_empty(ar, 0);
        pthread_mutex_unlock(&ar->lock);
    }
    pthread_rwlock_unlock(&a->arenas_lock);
    pthread_mutex_lock(&a->global_lock);
    ps_reuse_reclaim_pressure(&a->large_reuse, wait);
    for (span_t *s = a->free_spans; s;) {
        if (s->fence && (wait || a->gpu->fence_query(a->gpu->ctx, s->fence) == PS_OK)) {
            if (wait) {
                a->gpu->fence_wait(a->gpu->ctx, s->fence);
                atomic_fetch_add_explicit(&a->waits, 1, memory_order_relaxed);
            }
            arena_unfence(a, s);
            s = a->free_spans; /* the list changed: rescan */
            continue;
        }
        s = s->next;
    }
    arena_release_free_chunks(a);
    pthread_mutex_unlock(&a->global_lock);
}

/* ---- the vtable ------------------------------------------------------ */

/* Sums the bytes handed out and pending over every arena. No lock held. */
static void usage(arena_resource_t *a, uint64_t *in_use, uint64_t *pending)
{
    *in_use = *pending = 0;
    pthread_rwlock_rdlock(&a->arenas_lock);
    for (arena_t *ar = a->arenas; ar; ar = ar->next) {
        pthread_mutex_lock(&ar->lock);
        *in_use += ar->in_use;
        *pending += ar->pending + arena_pending(ar);
        pthread_mutex_unlock(&ar->lock);
    }
    pthread_rwlock_unlock(&a->arenas_lock);
    pthread_mutex_lock(&a->global_lock);
    *in_use += a->large_in_use;
    *pending += a->large_reuse.bytes_pending;
    pthread_mutex_unlock(&a->global_lock);
}

static void warn_fragmentation(arena_resource_t *a, size_t size)
{
    pthread_mutex_lock(&a->global_lock);
    uint64_t largest = 0;
    for (span_t *s = a->free_spans; s; s = s->next)
        if (!s->fence && (s->pages << a->shift) > largest)
            largest = s->pages << a->shift;
    uint64_t reserved = a->reserved;
    pthread_mutex_unlock(&a->global_lock);
    uint64_t in_use, pending;
    usage(a, &in_use, &pending);
    uint64_t used = in_use + pending;
    uint64_t free_bytes = reserved > used ? reserved - used : 0;
    char b1[32], b2[32], b3[32], b4[32];
    ps_warning("arena '%s': out of memory for %s: largest free run %s of %s free (%s reserved)%s",
               a->base.name, ps_format_bytes(b1, sizeof b1, size),
               ps_format_bytes(b2, sizeof b2, largest), ps_format_bytes(b3, sizeof b3, free_bytes),
               ps_format_bytes(b4, sizeof b4, reserved),
               free_bytes > largest ? ": fragmented" : "");
}

static int arena_res_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    arena_resource_t *a = (arena_resource_t *)r;
    stream = ps_reuse_list_stream(stream); /* (the per-thread default stream: the cudaFree way) */
    if (size == 0)
        size = 1;
    if (size > SIZE_MAX - a->opts.superblock_size)
        return PS_ENOMEM;
    int status = arena_try_allocate(a, size, stream, out);
    if (status == PS_ENOMEM) {
        defragment(a, 1);
        status = arena_try_allocate(a, size, stream, out);
        if (status == PS_ENOMEM)
            warn_fragmentation(a, size);
    }
    return status;
}

static int arena_res_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    arena_resource_t *a = (arena_resource_t *)r;
    stream = ps_reuse_list_stream(stream);
    for (;;) {
        span_t *s = lookup(a, (uintptr_t)ptr);
        if (!s)
            return PS_EINVAL;
        arena_t *ar = atomic_load_explicit(&s->owner, memory_order_acquire);
        if (!ar)
            return arena_large_deallocate(a, s, ptr, stream);
        pthread_mutex_lock(&ar->lock);
        if (atomic_load_explicit(&s->owner, memory_order_relaxed) != ar ||
            lookup(a, (uintptr_t)ptr) != s) {
            pthread_mutex_unlock(&ar->lock); /* it moved: look again */
            continue;
        }
        uintptr_t offset = (uintptr_t)ptr - s->base;
        uint32_t i = (uint32_t)(offset / s->block_size);
        if (offset % s->block_size || i >= s->block_count ||
            !(s->in_use[i / 64] & ((uint64_t)1 << (i % 64)))) {
            pthread_mutex_unlock(&ar->lock);
            return PS_EINVAL;
        }
        int status = PS_OK;
        int ordered_here = stream != PS_STREAM_NONE && ar->stream != PS_STREAM_NONE;
        int defer = !ordered_here && ps_reuse_defers(&ar->reuse[0]);
        if (ordered_here && stream != ar->stream) {
            /* the owner stream waits for the freeing stream's work (reuse's handoff) */
            uint64_t fences = 0;
            status = ps_reuse_stream_handoff(a->gpu, stream, ar->stream, &fences, NULL);
            if (fences)
                atomic_fetch_add_explicit(&a->fences, fences, memory_order_relaxed);
        } else if (!ordered_here && !defer && a->opts.free_sync == PS_FREE_SYNC_DEVICE) {
            status = a->gpu->device_synchronize(a->gpu->ctx);
        }
        if (status == PS_EBUSY) /* the owner stream or another captures: the block waits in the reuse state */
            defer = 1;
        if (defer) {
            status = arena_defer(ar, (uintptr_t)ptr, s->block_size);
            if (status == PS_OK) {
                s->in_use[i / 64] &= ~((uint64_t)1 << (i % 64));
                ar->in_use -= s->block_size;
            }
            pthread_mutex_unlock(&ar->lock);
            return status;
        }
        if (status == PS_OK) {
            size_t bytes = s->block_size;
            s->in_use[i / 64] &= ~((uint64_t)1 << (i % 64));
            arena_block_return(ar, s, i);
            ar->in_use -= bytes;
        }
        pthread_mutex_unlock(&ar->lock);
        return status;
    }
}

static int arena_res_trim(ps_resource_t *r)
{
    defragment((arena_resource_t *)r, 0);
    return PS_OK;
}

static void arena_res_query(ps_resource_t *r, ps_resource_info_t *info)
{
    arena_resource_t *a = (arena_resource_t *)r;
    pthread_mutex_lock(&a->global_lock);
    info->bytes_reserved = a->reserved;
    info->peak_bytes_reserved = a->peak_reserved;
    info->upstream_allocs = a->upstream_allocs;
    info->upstream_frees = a->upstream_frees;
    for (span_t *s = a->free_spans; s; s = s->next)
        if (!s->fence && (s->pages << a->shift) > info->largest_free_block)
            info->largest_free_block = s->pages << a->shift;
    pthread_mutex_unlock(&a->global_lock);
    usage(a, &info->bytes_in_use, &info->bytes_pending);
    uint64_t used = info->bytes_in_use + info->bytes_pending;
    info->bytes_free = info->bytes_reserved > used ? info->bytes_reserved - used : 0;
    info->fences_recorded = atomic_load(&a->fences);
    info->fence_waits = atomic_load(&a->waits);
    pthread_rwlock_rdlock(&a->arenas_lock);
    for (arena_t *ar = a->arenas; ar; ar = ar->next) {
        pthread_mutex_lock(&ar->lock);
        for (int i = 0; i < 2; i++) {
            info->fences_recorded += ar->reuse[i].fences_recorded;
            info->fence_waits += ar->reuse[i].fence_waits;
            info->barriers += ar->reuse[i].barriers;
        }
        pthread_mutex_unlock(&ar->lock);
    }
    pthread_rwlock_unlock(&a->arenas_lock);
    pthread_mutex_lock(&a->global_lock);
    info->fences_recorded += a->large_reuse.fences_recorded;
    info->fence_waits += a->large_reuse.fence_waits;
    info->barriers += a->large_reuse.barriers;
    pthread_mutex_unlock(&a->global_lock);
}

static void arena_res_destroy(ps_resource_t *r)
{
    arena_resource_t *a = (arena_resource_t *)r;
    pthread_key_delete(a->key);
    for (arena_t *ar = a->arenas; ar;) {
        arena_t *next = ar->next;
        ps_reuse_destroy(&ar->reuse[0]);
        ps_reuse_destroy(&ar->reuse[1]);
        if (ar->retire_fence)
            a->gpu->fence_release(a->gpu->ctx, ar->retire_fence);
        pthread_mutex_destroy(&ar->lock);
        free(ar->avail);
        free(ar);
        ar = next;
    }
    ps_reuse_destroy(&a->large_reuse);
    for (chunk_t *c = a->chunks; c;) {
        chunk_t *next = c->next;
        ps_deallocate(a->base.upstream, c->memory, c->bytes, PS_STREAM_NONE);
        free(c);
        c = next;
    }
    for (span_t *s = a->all_spans; s;) {
        span_t *next = s->all_next;
        if (s->fence && s->kind == SPAN_FREE)
            a->gpu->fence_release(a->gpu->ctx, s->fence);
        free(s->free_stack);
        free(s->in_use);
        free(s);
        s = next;
    }
    for (size_t l = 0; l < a->leaf_count; l++)
        free(atomic_load(&a->page_table[l]));
    free(a->page_table);
    pthread_rwlock_destroy(&a->arenas_lock);
    pthread_mutex_destroy(&a->global_lock);
    free(a);
}

/* The program is about to destroy `stream` (see step 7). */
static void arena_res_stream_destroyed(ps_resource_t *r, ps_stream_t stream)
{
    arena_resource_t *a = (arena_resource_t *)r;
    if (!ps_reuse_stream_ordered(stream)) /* no arena of its own */
        return;
    pthread_rwlock_wrlock(&a->arenas_lock);
    arena_t *ar = a->arenas;
    while (ar && (ar->retired || ar->stream != stream))
        ar = ar->next;
    if (ar) {
        pthread_mutex_lock(&ar->lock);
        uint64_t free_bytes = 0;
        for (unsigned c = 0; c < a->class_count; c++)
            for (span_t *s = ar->avail[c]; s; s = s->next)
                free_bytes += (uint64_t)s->free_top * s->block_size;
        ps_fence_t *fence = NULL;
        if (free_bytes && a->gpu->fence_record(a->gpu->ctx, stream, &fence) == PS_OK) {
            atomic_fetch_add_explicit(&a->fences, 1, memory_order_relaxed);
            ar->retire_fence = fence;
            ar->retired_free = free_bytes;
            ar->pending += free_bytes;
        } else if (free_bytes) {
            /* no fence: wait for the whole device; the free blocks are
             * then safe for every stream as they are */
            a->gpu->device_synchronize(a->gpu->ctx);
        }
        ar->stream = PS_STREAM_NONE;
        ar->retired = 1;
        if (!ar->retire_fence)
            arena_release_empty(ar, 0);
        pthread_mutex_unlock(&ar->lock);
    }
    pthread_rwlock_unlock(&a->arenas_lock);
    /* a span fenced on `stream` is waited for by every taker from now on */
    pthread_mutex_lock(&a->global_lock);
    for (span_t *s = a->free_spans; s; s = s->next)
        if (s->fence && s->fence_stream == stream)
            s->fence_stream = PS_STREAM_NONE;
    pthread_mutex_unlock(&a->global_lock);
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
    arena_resource_t *a = line_calloc(sizeof *a); /* its locks on lines of their own */
    if (!a)
        return PS_ENOMEM;
    a->base.ops = &arena_ops;
    a->base.name = name ? name : "arena";
    a->base.upstream = upstream;
    a->gpu = gpu;
    a->opts = o;
    a->id = atomic_fetch_add(&next_resource_id, 1) + 1;
    arena_large_init(a);
    a->shift = log2_floor(o.superblock_size);
    a->small_max = o.superblock_size / 2;
    a->class_count = arena_class_of(a, a->small_max) + 1;
    a->leaf_count = (size_t)1 << (ADDRESS_BITS - a->shift - LEAF_BITS);
    a->page_table = calloc(a->leaf_count, sizeof *a->page_table);
    if (!a->page_table || pthread_key_create(&a->key, arena_thread_exit) != 0) {
        free(a->page_table);
        free(a);
        return PS_ENOMEM;
    }
    pthread_rwlock_init(&a->arenas_lock, NULL);
    pthread_mutex_init(&a->global_lock, NULL);
    if (o.initial_size) {
        size_t pages = ps_align_up(o.initial_size, o.superblock_size) >> a->shift;
        pthread_mutex_lock(&a->global_lock);
        int status = pages ? arena_grow(a, pages) : PS_ENOMEM;
        pthread_mutex_unlock(&a->global_lock);
        if (status != PS_OK) {
            ps_error("arena '%s': cannot reserve the initial %zu bytes", a->base.name, o.initial_size);
            a->base.ops->destroy(&a->base);
            return PS_ENOMEM;
        }
    }
    *out = &a->base;
    return PS_OK;
}
