/* arena_global: the arena's global arena (core/arena_global.h), the layer
 * below the local arenas and the large blocks.
 *
 * Algorithm:
 *  1. Memory comes from the upstream in chunks: at least 8 superblocks or
 *     1/8 of what is reserved, rounded down to a power of two (a power of
 *     two is a whole number of every power-of-two request up to its size),
 *     at most CHUNK_MAX_SUPERBLOCKS, or the request alone when it is bigger
 *     or that fails. A chunk is cut into superblocks aligned to their size.
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
 *  4. A page table (two levels: leaves of 2^ARENA_LEAF_BITS slots made once
 *     per chunk, read without a lock) maps address >> log2(superblock_size)
 *     to the span holding it, so a free finds its superblock in O(1) from
 *     any thread.
 * Guarantees: a span is on the free list or held by exactly one taker; a
 * fenced span is handed out only after its fence completed or the taker's
 * stream waits for it; every chunk goes back to the upstream whole, at
 * destroy at the latest; reserved never passes maximum_size.
 */
#include "arena_global.h"

#include "reuse.h"

/* One upstream allocation. */
typedef struct chunk {
    void *memory;         /* as the upstream returned it */
    size_t bytes;         /* as asked of the upstream */
    uintptr_t first;      /* first superblock-aligned address */
    size_t pages;         /* superblocks in it */
    struct chunk *next;   /* all chunks */
} chunk_t;

/* The largest growth step, in superblocks, unless the request is larger
 * (256 MiB with 2 MiB superblocks): a chunk of 1/8 of a large reserve kept
 * a hole beside the few large blocks it held that no run of another chunk
 * could join. */
#define CHUNK_MAX_SUPERBLOCKS 128

/* Which neighbour of a span free_neighbour looks at. */
typedef enum side { SIDE_BEFORE = 0, SIDE_AFTER } side_t;

int arena_global_init(arena_global_t *g, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                      size_t superblock_size, size_t maximum_size)
{
    g->upstream = upstream;
    g->gpu = gpu;
    g->superblock_size = superblock_size;
    g->maximum_size = maximum_size;
    g->shift = arena_log2_floor(superblock_size);
    g->leaf_count = (size_t)1 << (ARENA_ADDRESS_BITS - g->shift - ARENA_LEAF_BITS);
    g->page_table = calloc(g->leaf_count, sizeof *g->page_table);
    if (!g->page_table)
        return PS_ENOMEM;
    pthread_mutex_init(&g->lock, NULL);
    return PS_OK;
}

/* ---- page table (arena_global_lookup is in core/arena_global.h) ------- */

/* Points pages [base, base + pages) at `span`. Lock held; the leaves
 * exist (made by map_chunk). */
static void set_pages(arena_global_t *g, uintptr_t base, size_t pages, span_t *span)
{
    size_t page = base >> g->shift;
    for (size_t i = 0; i < pages; i++, page++) {
        span_slot_t *slots =
            atomic_load_explicit(&g->page_table[page >> ARENA_LEAF_BITS], memory_order_relaxed);
        atomic_store_explicit(&slots[page & ((1u << ARENA_LEAF_BITS) - 1)], span, memory_order_release);
    }
}

/* Makes the leaves for a chunk. Lock held. */
static int map_chunk(arena_global_t *g, uintptr_t first, size_t pages)
{
    size_t first_leaf = (first >> g->shift) >> ARENA_LEAF_BITS;
    size_t last_leaf = (((first >> g->shift) + pages - 1) >> ARENA_LEAF_BITS);
    if (last_leaf >= g->leaf_count)
        return PS_EUPSTREAM;
    for (size_t l = first_leaf; l <= last_leaf; l++) {
        if (atomic_load_explicit(&g->page_table[l], memory_order_relaxed))
            continue;
        span_slot_t *slots = calloc((size_t)1 << ARENA_LEAF_BITS, sizeof *slots);
        if (!slots)
            return PS_ENOMEM;
        atomic_store_explicit(&g->page_table[l], slots, memory_order_release);
    }
    return PS_OK;
}

/* ---- spans (lock held) ------------------------------------------------ */

/* A zeroed span struct, from the spares when there is one (its block
 * arrays kept for the next small owner). NULL: no host memory. */
static span_t *span_new(arena_global_t *g)
{
    span_t *s = g->spare_spans;
    if (s) {
        g->spare_spans = s->next;
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
    s = arena_line_calloc(sizeof *s);
    if (!s)
        return NULL;
    s->all_next = g->all_spans;
    g->all_spans = s;
    return s;
}

static void span_retire(arena_global_t *g, span_t *s)
{
    s->next = g->spare_spans;
    g->spare_spans = s;
}

static void free_list_unlink(arena_global_t *g, span_t *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        g->free_spans = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

static void free_list_push(arena_global_t *g, span_t *s)
{
    s->prev = NULL;
    s->next = g->free_spans;
    if (g->free_spans)
        g->free_spans->prev = s;
    g->free_spans = s;
}

/* A free, unfenced neighbour of `s` in the same chunk, or NULL. */
static span_t *free_neighbour(arena_global_t *g, span_t *s, side_t side)
{
    uintptr_t at = side == SIDE_AFTER ? s->base + (s->pages << g->shift) : s->base - 1;
    if (side == SIDE_BEFORE && s->base == s->chunk->first)
        return NULL;
    if (side == SIDE_AFTER && at >= s->chunk->first + (s->chunk->pages << g->shift))
        return NULL;
    span_t *n = arena_global_lookup(g, at);
    return n && n->kind == SPAN_FREE && !n->fence && n->chunk == s->chunk ? n : NULL;
}

/* Joins `later` into `earlier`, the free span just before it in the same
 * chunk; `later` is retired. Returns `earlier`. */
static span_t *join_spans(arena_global_t *g, span_t *earlier, span_t *later)
{
    set_pages(g, later->base, later->pages, earlier);
    earlier->pages += later->pages;
    span_retire(g, later);
    return earlier;
}

void arena_global_put_locked(arena_global_t *g, span_t *s, ps_fence_t *fence, ps_stream_t fence_stream)
{
    s->kind = SPAN_FREE;
    atomic_store_explicit(&s->owner, NULL, memory_order_release);
    s->fence = fence;
    s->fence_stream = fence_stream;
    s->linked = false;
    if (!fence) {
        span_t *left = free_neighbour(g, s, SIDE_BEFORE);
        if (left) {
            free_list_unlink(g, left);
            s = join_spans(g, left, s);
        }
        span_t *right = free_neighbour(g, s, SIDE_AFTER);
        if (right) {
            free_list_unlink(g, right);
            join_spans(g, s, right);
        }
    }
    free_list_push(g, s);
}

/* Clears the fence of a free span and coalesces it. Lock held. */
static void unfence(arena_global_t *g, span_t *s)
{
    g->gpu->fence_release(g->gpu->ctx, s->fence);
    s->fence = NULL;
    free_list_unlink(g, s);
    arena_global_put_locked(g, s, NULL, 0);
}

/* ---- growth and giving chunks back (lock held) ------------------------ */

/* The size of the next chunk for a request of `pages` superblocks (rule 1),
 * within maximum_size; 0: no room for the request. */
static size_t chunk_step(const arena_global_t *g, size_t pages)
{
    size_t sb = g->superblock_size;
    size_t need = pages * sb;
    size_t step = g->reserved / 8 > 8 * sb ? ps_align_up(g->reserved / 8, sb) : 8 * sb;
    step = (size_t)1 << arena_log2_floor(step);
    if (step > (size_t)CHUNK_MAX_SUPERBLOCKS * sb)
        step = (size_t)CHUNK_MAX_SUPERBLOCKS * sb;
    if (step < need)
        step = need;
    if (g->maximum_size) {
        size_t room = g->maximum_size > g->reserved ? g->maximum_size - g->reserved : 0;
        if (step > room)
            step = room - room % sb;
        if (step < need)
            return 0;
    }
    return step;
}

/* Registers the `bytes` at `mem` from the upstream as a chunk whose
 * superblocks form one free span. PS_ENOMEM (nothing changed, the memory
 * still the caller's): fewer than `pages` superblocks in it, or no host
 * memory. */
static int add_chunk(arena_global_t *g, void *mem, size_t bytes, size_t pages)
{
    size_t sb = g->superblock_size;
    uintptr_t first = ps_align_up((uintptr_t)mem, sb);
    size_t usable = first - (uintptr_t)mem < bytes ? ((uintptr_t)mem + bytes - first) / sb : 0;
    chunk_t *c = usable >= pages ? calloc(1, sizeof *c) : NULL;
    span_t *s = c ? span_new(g) : NULL;
    if (!s || map_chunk(g, first, usable) != PS_OK) {
        if (s)
            span_retire(g, s);
        free(c);
        return PS_ENOMEM;
    }
    *c = (chunk_t){.memory = mem, .bytes = bytes, .first = first, .pages = usable, .next = g->chunks};
    g->chunks = c;
    s->base = first;
    s->pages = usable;
    s->chunk = c;
    set_pages(g, first, usable, s);
    arena_global_put_locked(g, s, NULL, 0);
    g->reserved += bytes;
    if (g->reserved > g->peak_reserved)
        g->peak_reserved = g->reserved;
    g->upstream_allocs++;
    return PS_OK;
}

/* Takes one chunk from the upstream big enough for `pages` superblocks:
 * the step of rule 1, else the request alone, else the request and one
 * superblock more (room to align). */
static int grow(arena_global_t *g, size_t pages)
{
    size_t sb = g->superblock_size;
    size_t need = pages * sb;
    size_t step = chunk_step(g, pages);
    if (!step)
        return PS_ENOMEM;
    size_t tries[3] = {step, need, need + sb};
    int status = PS_ENOMEM;
    for (int t = 0; t < 3; t++) {
        if (t > 0 && tries[t] == tries[t - 1])
            continue;
        if (t == 2 && g->maximum_size && g->reserved + tries[t] > g->maximum_size)
            break;
        void *mem;
        status = ps_allocate(g->upstream, tries[t], PS_STREAM_NONE, &mem);
        if (status == PS_ENOMEM)
            continue;
        if (status != PS_OK)
            return status;
        status = add_chunk(g, mem, tries[t], pages);
        if (status == PS_OK)
            return PS_OK;
        ps_deallocate(g->upstream, mem, tries[t], PS_STREAM_NONE);
    }
    return status;
}

int arena_global_reserve(arena_global_t *g, size_t bytes)
{
    size_t pages = ps_align_up(bytes, g->superblock_size) >> g->shift;
    arena_global_lock(g);
    int status = pages ? grow(g, pages) : PS_ENOMEM;
    arena_global_unlock(g);
    return status;
}

/* Gives wholly free, unfenced chunks back to the upstream. */
static void release_free_chunks(arena_global_t *g)
{
    chunk_t **link = &g->chunks;
    while (*link) {
        chunk_t *c = *link;
        span_t *s = arena_global_lookup(g, c->first);
        if (s && s->kind == SPAN_FREE && !s->fence && s->base == c->first && s->pages == c->pages &&
            ps_deallocate(g->upstream, c->memory, c->bytes, PS_STREAM_NONE) == PS_OK) {
            free_list_unlink(g, s);
            set_pages(g, c->first, c->pages, NULL);
            span_retire(g, s);
            g->reserved -= c->bytes;
            g->upstream_frees++;
            *link = c->next;
            free(c);
            continue;
        }
        link = &c->next;
    }
}

/* ---- taking spans ----------------------------------------------------- */

/* Cuts `pages` superblocks off the back of free span `s` (more pages than
 * that) and returns them as a span of their own (NULL: no host memory). */
static span_t *split_tail(arena_global_t *g, span_t *s, size_t pages)
{
    span_t *tail = span_new(g);
    if (!tail)
        return NULL;
    s->pages -= pages;
    tail->base = s->base + (s->pages << g->shift);
    tail->pages = pages;
    tail->chunk = s->chunk;
    set_pages(g, tail->base, pages, tail);
    return tail;
}

/* Rule 3 over the free list as it is: an exact run off the list in *out,
 * else the best fit in *best (left on the list; NULL: none). A completed
 * fence is dropped on the way (the span may merge: the scan starts over). */
static void find_fit(arena_global_t *g, size_t pages, ps_stream_t taker, span_t **out, span_t **best)
{
    *out = *best = NULL;
    span_t *s = g->free_spans;
    while (s) {
        span_t *next = s->next;
        if (s->fence) {
            if (g->gpu->fence_query(g->gpu->ctx, s->fence) == PS_OK) {
                unfence(g, s); /* may merge; rescan from the head */
                *best = NULL;
                s = g->free_spans;
                continue;
            } else if (taker != PS_STREAM_NONE && s->pages == pages) {
                if (taker != s->fence_stream &&
                    ps_reuse_fence_handoff(g->gpu, s->fence, taker, NULL) != PS_OK) {
                    s = next;
                    continue;
                }
                g->gpu->fence_release(g->gpu->ctx, s->fence);
                s->fence = NULL;
            } else {
                s = next;
                continue;
            }
        }
        if (s->pages == pages) {
            free_list_unlink(g, s);
            *out = s;
            return;
        }
        if (s->pages > pages &&
            (!*best || s->pages < (*best)->pages || (s->pages == (*best)->pages && s->base < (*best)->base)))
            *best = s;
        s = next;
    }
}

int arena_global_take_locked(arena_global_t *g, size_t pages, ps_stream_t taker, arena_growth_t growth,
                             span_t **out)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        span_t *exact, *best;
        find_fit(g, pages, taker, &exact, &best);
        if (exact) {
            *out = exact;
            return PS_OK;
        }
        if (best) {
            span_t *tail = split_tail(g, best, pages);
            if (!tail)
                return PS_ENOMEM;
            *out = tail;
            return PS_OK;
        }
        if (attempt == 0) {
            if (growth == ARENA_NO_GROWTH)
                return PS_ENOMEM;
            /* every wholly free chunk is smaller than the request (or it
             * would have served it), and runs never merge across chunks:
             * kept, they strand memory beside the new chunk. Like trim, no
             * wait: a chunk is wholly free only once every block in it was
             * released */
            release_free_chunks(g);
            int status = grow(g, pages);
            if (status != PS_OK)
                return status;
        }
    }
    return PS_ENOMEM;
}

/* ---- defragmentation, streams, figures, destroy ----------------------- */

void arena_global_reclaim(arena_global_t *g, arena_wait_t wait)
{
    arena_global_lock(g);
    for (span_t *s = g->free_spans; s;) {
        if (s->fence && (wait == ARENA_HOST_WAIT || g->gpu->fence_query(g->gpu->ctx, s->fence) == PS_OK)) {
            if (wait == ARENA_HOST_WAIT) {
                g->gpu->fence_wait(g->gpu->ctx, s->fence);
                g->fence_waits++;
            }
            unfence(g, s);
            s = g->free_spans; /* the list changed: rescan */
            continue;
        }
        s = s->next;
    }
    release_free_chunks(g);
    arena_global_unlock(g);
}

void arena_global_stream_destroyed(arena_global_t *g, ps_stream_t stream)
{
    arena_global_lock(g);
    for (span_t *s = g->free_spans; s; s = s->next)
        if (s->fence && s->fence_stream == stream)
            s->fence_stream = PS_STREAM_NONE;
    arena_global_unlock(g);
}

arena_global_figures_t arena_global_figures(arena_global_t *g)
{
    arena_global_lock(g);
    arena_global_figures_t f = {.reserved = g->reserved,
                                .peak_reserved = g->peak_reserved,
                                .upstream_allocs = g->upstream_allocs,
                                .upstream_frees = g->upstream_frees,
                                .fence_waits = g->fence_waits};
    for (span_t *s = g->free_spans; s; s = s->next)
        if (!s->fence && (s->pages << g->shift) > f.largest_free)
            f.largest_free = s->pages << g->shift;
    arena_global_unlock(g);
    return f;
}

void arena_global_destroy(arena_global_t *g)
{
    for (chunk_t *c = g->chunks; c;) {
        chunk_t *next = c->next;
        ps_deallocate(g->upstream, c->memory, c->bytes, PS_STREAM_NONE);
        free(c);
        c = next;
    }
    for (span_t *s = g->all_spans; s;) {
        span_t *next = s->all_next;
        if (s->fence && s->kind == SPAN_FREE)
            g->gpu->fence_release(g->gpu->ctx, s->fence);
        free(s->free_stack);
        free(s->in_use);
        free(s);
        s = next;
    }
    for (size_t l = 0; l < g->leaf_count; l++)
        free(atomic_load(&g->page_table[l]));
    free(g->page_table);
    pthread_mutex_destroy(&g->lock);
}
