/* arena_global: the arena's global arena (core/arena.c steps 1, 2 and the
 * large blocks' runs of step 4; types in core/arena_internal.h).
 *
 * Algorithm:
 *  1. Memory comes from the upstream in chunks: at least 8 superblocks or
 *     1/8 of what is reserved, rounded down to a power of two (a power of
 *     two is a whole number of every power-of-two request up to its size),
 *     at most 128 superblocks, or the request alone when it is bigger or
 *     that fails. A chunk is cut into superblocks aligned to their size.
 *  2. Free runs of superblocks ("spans") are kept on one list; neighbours
 *     of one chunk coalesce, runs never merge across chunks (each chunk
 *     goes back to the upstream whole). A span may carry a fence (it left a
 *     stream arena): it is taken only once the fence completed, or by
 *     another stream after a stream wait on it (core/reuse.c's fence
 *     handoff; the fence is released once the wait succeeded).
 *  3. A request for n superblocks takes an exact run at once, else the
 *     smallest run that holds it (best fit, lowest address on a tie), cut
 *     from its back. When nothing fits, wholly free chunks (each smaller
 *     than the request, or it would have fitted) go back to the upstream
 *     first, then one chunk is taken.
 *  4. A page table (two levels: leaves of 2^LEAF_BITS slots made once per
 *     chunk, read without a lock) maps address >> log2(superblock_size) to
 *     the span holding it, so a free finds its superblock in O(1) from any
 *     thread.
 * Everything here runs under the resource's global lock.
 */
#include "arena_internal.h"

/* ---- page table (lookup() is in core/arena_internal.h) ---------------- */

/* Points pages [base, base + pages) at `span`. Global lock held; the
 * leaves exist (made by map_chunk). */
static void set_pages(arena_resource_t *a, uintptr_t base, size_t pages, span_t *span)
{
    size_t page = base >> a->shift;
    for (size_t i = 0; i < pages; i++, page++) {
        span_slot_t *slots = atomic_load_explicit(&a->page_table[page >> LEAF_BITS], memory_order_relaxed);
        atomic_store_explicit(&slots[page & ((1u << LEAF_BITS) - 1)], span, memory_order_release);
    }
}

/* Makes the leaves for a chunk. Global lock held. */
static int map_chunk(arena_resource_t *a, uintptr_t first, size_t pages)
{
    size_t first_leaf = (first >> a->shift) >> LEAF_BITS;
    size_t last_leaf = (((first >> a->shift) + pages - 1) >> LEAF_BITS);
    if (last_leaf >= a->leaf_count)
        return PS_EUPSTREAM;
    for (size_t l = first_leaf; l <= last_leaf; l++) {
        if (atomic_load_explicit(&a->page_table[l], memory_order_relaxed))
            continue;
        span_slot_t *slots = calloc((size_t)1 << LEAF_BITS, sizeof *slots);
        if (!slots)
            return PS_ENOMEM;
        atomic_store_explicit(&a->page_table[l], slots, memory_order_release);
    }
    return PS_OK;
}

/* ---- spans (global lock held) ---------------------------------------- */

static span_t *span_new(arena_resource_t *a)
{
    span_t *s = a->spare_spans;
    if (s) {
        a->spare_spans = s->next;
        uint32_t *stack = s->free_stack;
        uint32_t cap = s->stack_capacity;
        uint64_t *bits = s->in_use;
        span_t *all_next = s->all_next;
        memset(s, 0, sizeof *s);
        s->free_stack = stack;
        s->stack_capacity = cap;
        s->in_use = bits;
        s->all_next = all_next;
        return s;
    }
    s = line_calloc(sizeof *s);
    if (!s)
        return NULL;
    s->all_next = a->all_spans;
    a->all_spans = s;
    return s;
}

static void span_retire(arena_resource_t *a, span_t *s)
{
    s->next = a->spare_spans;
    a->spare_spans = s;
}

static void free_list_unlink(arena_resource_t *a, span_t *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        a->free_spans = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

static void free_list_push(arena_resource_t *a, span_t *s)
{
    s->prev = NULL;
    s->next = a->free_spans;
    if (a->free_spans)
        a->free_spans->prev = s;
    a->free_spans = s;
}

/* A free, unfenced neighbour of `s` in the same chunk, or NULL. */
static span_t *free_neighbour(arena_resource_t *a, span_t *s, int after)
{
    uintptr_t at = after ? s->base + (s->pages << a->shift) : s->base - 1;
    if (!after && s->base == s->chunk->first)
        return NULL;
    if (after && at >= s->chunk->first + (s->chunk->pages << a->shift))
        return NULL;
    span_t *n = lookup(a, at);
    return n && n->kind == SPAN_FREE && !n->fence && n->chunk == s->chunk ? n : NULL;
}

/* Joins `later` into `earlier`, the free span just before it in the same
 * chunk; `later` is retired. Returns `earlier`. */
static span_t *join_spans(arena_resource_t *a, span_t *earlier, span_t *later)
{
    set_pages(a, later->base, later->pages, earlier);
    earlier->pages += later->pages;
    span_retire(a, later);
    return earlier;
}

/* Returns a span to the global free list, coalescing unfenced neighbours. */
void arena_global_put(arena_resource_t *a, span_t *s, ps_fence_t *fence, ps_stream_t fence_stream)
{
    s->kind = SPAN_FREE;
    atomic_store_explicit(&s->owner, NULL, memory_order_release);
    s->fence = fence;
    s->fence_stream = fence_stream;
    s->linked = 0;
    if (!fence) {
        span_t *left = free_neighbour(a, s, 0);
        if (left) {
            free_list_unlink(a, left);
            s = join_spans(a, left, s);
        }
        span_t *right = free_neighbour(a, s, 1);
        if (right) {
            free_list_unlink(a, right);
            join_spans(a, s, right);
        }
    }
    free_list_push(a, s);
}

/* Clears the fence of a free span and coalesces it. */
void arena_unfence(arena_resource_t *a, span_t *s)
{
    a->gpu->fence_release(a->gpu->ctx, s->fence);
    s->fence = NULL;
    free_list_unlink(a, s);
    arena_global_put(a, s, NULL, 0);
}

/* The largest growth step, in superblocks, unless the request is larger
 * (256 MiB with 2 MiB superblocks). */
#define CHUNK_MAX_SUPERBLOCKS 128

/* Takes one chunk from the upstream big enough for `pages` superblocks. */
int arena_grow(arena_resource_t *a, size_t pages)
{
    size_t sb = a->opts.superblock_size;
    size_t need = pages * sb;
    size_t step = a->reserved / 8 > 8 * sb ? ps_align_up(a->reserved / 8, sb) : 8 * sb;
    /* a power of two: spans never merge across chunks, so a chunk that is
     * not a whole number of the requests that fill it keeps a hole each
     * (1 GiB blocks reached 127 of the 139 an H200 holds); a power of two
     * is a whole number of every power-of-two request up to its size */
    step = (size_t)1 << log2_floor(step);
    /* at most CHUNK_MAX_SUPERBLOCKS: a chunk of 1/8 of a large reserve
     * (512 MiB - 1 GiB) kept a hole beside the few large blocks it held
     * that no run of another chunk could join (replay of the transformer
     * log, with best fit, the eager barrier and free chunks given back
     * before growth: 5.04 -> 4.65 GiB reserved for 4.00 GiB requested) */
    if (step > (size_t)CHUNK_MAX_SUPERBLOCKS * sb)
        step = (size_t)CHUNK_MAX_SUPERBLOCKS * sb;
    if (step < need)
        step = need;
    if (a->opts.maximum_size) {
        size_t room = a->opts.maximum_size > a->reserved ? a->opts.maximum_size - a->reserved : 0;
        if (step > room)
            step = room - room % sb;
        if (step < need)
            return PS_ENOMEM;
    }
    size_t tries[3] = {step, need, need + sb};
    int status = PS_ENOMEM;
    for (int t = 0; t < 3; t++) {
        if (t > 0 && tries[t] == tries[t - 1])
            continue;
        if (t == 2 && a->opts.maximum_size && a->reserved + tries[t] > a->opts.maximum_size)
            break;
        void *mem;
        status = ps_allocate(a->base.upstream, tries[t], PS_STREAM_NONE, &mem);
        if (status == PS_ENOMEM)
            continue;
        if (status != PS_OK)
            return status;
        uintptr_t first = ps_align_up((uintptr_t)mem, sb);
        size_t usable = first - (uintptr_t)mem < tries[t] ? ((uintptr_t)mem + tries[t] - first) / sb : 0;
        chunk_t *c = usable >= pages ? calloc(1, sizeof *c) : NULL;
        span_t *s = c ? span_new(a) : NULL;
        if (!s || map_chunk(a, first, usable) != PS_OK) {
            if (s)
                span_retire(a, s);
            free(c);
            ps_deallocate(a->base.upstream, mem, tries[t], PS_STREAM_NONE);
            status = PS_ENOMEM;
            continue;
        }
        *c = (chunk_t){.memory = mem, .bytes = tries[t], .first = first, .pages = usable, .next = a->chunks};
        a->chunks = c;
        s->base = first;
        s->pages = usable;
        s->chunk = c;
        set_pages(a, first, usable, s);
        arena_global_put(a, s, NULL, 0);
        a->reserved += tries[t];
        if (a->reserved > a->peak_reserved)
            a->peak_reserved = a->reserved;
        a->upstream_allocs++;
        return PS_OK;
    }
    return status;
}

/* Cuts `pages` superblocks off the back of free span `s` (more pages than
 * that) and returns them as a span of their own (NULL: no host memory). */
static span_t *split_tail(arena_resource_t *a, span_t *s, size_t pages)
{
    span_t *tail = span_new(a);
    if (!tail)
        return NULL;
    s->pages -= pages;
    tail->base = s->base + (s->pages << a->shift);
    tail->pages = pages;
    tail->chunk = s->chunk;
    set_pages(a, tail->base, pages, tail);
    return tail;
}

/* Takes `pages` superblocks for `taker` (a stream, or PS_STREAM_NONE),
 * growing when nothing fits and `may_grow`. Best fit: an exact run at
 * once, else the smallest free run that holds them (lowest address on a
 * tie). The first fit it replaced took whatever run the list (last freed
 * first) offered, so large requests cut the runs that the next larger one
 * needed, and every such miss grew a new chunk (runs never merge across
 * chunks): replay of a PyTorch transformer log 9.10 GiB reserved for
 * 4.00 GiB requested, 5.66 GiB with best fit. Global lock held. */
int arena_global_take(arena_resource_t *a, size_t pages, ps_stream_t taker, int may_grow, span_t **out)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        span_t *best = NULL;
        span_t *s = a->free_spans;
        while (s) {
            span_t *next = s->next;
            if (s->fence) {
                if (a->gpu->fence_query(a->gpu->ctx, s->fence) == PS_OK) {
                    arena_unfence(a, s); /* may merge; rescan from the head */
                    best = NULL;
                    s = a->free_spans;
                    continue;
                } else if (taker != PS_STREAM_NONE && s->pages == pages) {
                    if (taker != s->fence_stream &&
                        ps_reuse_fence_handoff(a->gpu, s->fence, taker, NULL) != PS_OK) {
                        s = next;
                        continue;
                    }
                    a->gpu->fence_release(a->gpu->ctx, s->fence);
                    s->fence = NULL;
                } else {
                    s = next;
                    continue;
                }
            }
            if (s->pages == pages) {
                free_list_unlink(a, s);
                *out = s;
                return PS_OK;
            }
            if (s->pages > pages &&
                (!best || s->pages < best->pages || (s->pages == best->pages && s->base < best->base)))
                best = s;
            s = next;
        }
        if (best) {
            span_t *tail = split_tail(a, best, pages);
            if (!tail)
                return PS_ENOMEM;
            *out = tail;
            return PS_OK;
        }
        if (attempt == 0) {
            if (!may_grow)
                return PS_ENOMEM;
            /* every wholly free chunk is smaller than the request (or it
             * would have served it), and runs never merge across chunks:
             * kept, they strand memory beside the new chunk (replays with
             * best fit and the eager barrier: transformer 5.78 -> 5.04
             * GiB, conv net 4.32 -> 3.50). Like trim, no wait: a chunk is
             * wholly free only once every block in it was released */
            arena_release_free_chunks(a);
            int status = arena_grow(a, pages);
            if (status != PS_OK)
                return status;
        }
    }
    return PS_ENOMEM;
}

/* ---- giving chunks back --------------------------------------------- */

/* Gives wholly free, unfenced chunks back to the upstream. Global lock held. */
void arena_release_free_chunks(arena_resource_t *a)
{
    chunk_t **link = &a->chunks;
    while (*link) {
        chunk_t *c = *link;
        span_t *s = lookup(a, c->first);
        if (s && s->kind == SPAN_FREE && !s->fence && s->base == c->first && s->pages == c->pages &&
            ps_deallocate(a->base.upstream, c->memory, c->bytes, PS_STREAM_NONE) == PS_OK) {
            free_list_unlink(a, s);
            set_pages(a, c->first, c->pages, NULL);
            span_retire(a, s);
            a->reserved -= c->bytes;
            a->upstream_frees++;
            *link = c->next;
            free(c);
            continue;
        }
        link = &c->next;
    }
}
