/* arena_local: the local arenas, one per thread and one per stream (the
 * small requests of core/arena.c, step 1; types in core/arena_internal.h).
 *
 * Algorithm:
 *  1. Every thread has its own arena (thread-local through a pthread key,
 *     registered in the resource's list, orphaned at thread exit by the
 *     key's destructor and adopted by the next new thread). Every stream
 *     used by cudaMallocAsync has its own arena too, found through a
 *     per-thread hint (the last few streams' arenas, keyed by the
 *     resource's id) checked under the arena's lock — it must still serve
 *     that stream — and only on a miss through the list under its read
 *     lock. A destroyed stream's arena (retired, core/arena.c step 3)
 *     serves the next new stream, which first waits on the GPU for the
 *     retire fence if it has not completed (core/reuse.c's fence handoff;
 *     a host wait if that fails).
 *  2. An arena owns superblocks, each cut into blocks of one size class
 *     (256 B steps up to 1 KiB, then four classes per power of two, so at
 *     most 25% is lost to rounding), with a host-side stack of free block
 *     indices and a bitmap of blocks handed out. Allocation and free
 *     inside a superblock are O(1) under the arena's own lock: threads
 *     contend only when one frees another's block or when they take or
 *     return superblocks (global lock).
 *  3. A superblock whose blocks are all free goes back to the global arena
 *     (with a fence on the stream, from a stream arena), unless it is its
 *     arena's last one of its class (kept to avoid ping-pong on alloc/free
 *     loops; trim and defragment return it too).
 *  4. cudaFree'd blocks (free_sync barrier or event) wait in core/reuse.c,
 *     which owns the rule (epochs, fences, the barrier and its fallback,
 *     pending bytes); every arena's reuse states and the large blocks'
 *     are one *family*: a barrier issued by one releases, at the others'
 *     next poll, what they deferred before it began. An arena defers into
 *     two segments (two reuse states): under BARRIER, once a barrier of
 *     the family has begun since the current segment's last free, later
 *     frees join the other (empty) segment, so that barrier alone covers
 *     the older one.
 *  5. A miss (no free block of the class) with blocks pending first polls
 *     (completed epochs, another arena's barrier), then reclaims before
 *     taking a superblock: one barrier (every pending block free at once,
 *     no host wait) or — refused because a stream capture is open, or
 *     EVENT — close the epoch with one fence_record(PS_STREAM_NONE) and
 *     poll (never a host wait on that path).
 *  6. The thread floor: once threads have met in the arena (a miss found
 *     another arena's lock held, MEET_HITS times in a window of
 *     MEET_WINDOW misses; sticky) and while two or more threads hold
 *     arenas, a thread's arena whose pending bytes are under thread_floor
 *     takes a superblock at a miss instead of a barrier (the decision is
 *     core/reuse.c's ps_reuse_barrier_worth, its grow_floor). Whichever
 *     arena reaches its floor first issues one, and it releases what every
 *     arena deferred before it began. One thread, and threads that take turns (PyTorch's
 *     main and autograd threads), keep a barrier at every miss.
 * Guarantees: a thread's arena grows past what it would without the floor
 * by at most thread_floor plus one superblock, so the growth is bounded by
 * threads x thread_floor; arenas number at most the threads plus the live
 * streams; a block freed on another stream than its arena's is handed out
 * only after its owner stream waited for that stream's work.
 */
#include "arena_internal.h"

/* ---- size classes ---------------------------------------------------- */

/* Class of a request of `size` bytes (1 <= size <= small_max). */
unsigned arena_class_of(const arena_resource_t *a, size_t size)
{
    size_t unit = a->opts.alignment;
    if (size <= 4 * unit)
        return (unsigned)((size + unit - 1) / unit - 1);
    unsigned k = log2_floor(size - 1);
    size_t step = ((size_t)1 << k) / 4;
    size_t m = (size + step - 1) / step; /* 5..8 */
    return 4 + (k - log2_floor(4 * unit)) * 4 + (unsigned)(m - 5);
}

static size_t class_size(const arena_resource_t *a, unsigned c)
{
    size_t unit = a->opts.alignment;
    if (c < 4)
        return (c + 1) * unit;
    unsigned j = c - 4;
    unsigned k = log2_floor(4 * unit) + j / 4;
    return (5 + j % 4) * (((size_t)1 << k) / 4);
}

/* ---- superblocks inside an arena (arena lock held) -------------------- */

static void avail_link(arena_t *ar, span_t *s)
{
    s->prev = NULL;
    s->next = ar->avail[s->size_class];
    if (s->next)
        s->next->prev = s;
    ar->avail[s->size_class] = s;
    s->linked = 1;
}

static void avail_unlink(arena_t *ar, span_t *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        ar->avail[s->size_class] = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    s->linked = 0;
}

/* Gives an empty superblock back to the global arena. Arena lock held. */
static void release_superblock(arena_t *ar, span_t *s)
{
    arena_resource_t *a = ar->parent;
    avail_unlink(ar, s);
    ps_fence_t *fence = NULL;
    if (ar->stream != PS_STREAM_NONE &&
        a->gpu->fence_record(a->gpu->ctx, ar->stream, &fence) == PS_OK)
        atomic_fetch_add_explicit(&a->fences, 1, memory_order_relaxed);
    pthread_mutex_lock(&a->global_lock);
    arena_global_put(a, s, fence, ar->stream);
    pthread_mutex_unlock(&a->global_lock);
}

/* Releases every empty superblock of the arena (keep_one: but the last of
 * its class). Arena lock held. */
void arena_release_empty(arena_t *ar, int keep_one)
{
    for (unsigned c = 0; c < ar->parent->class_count; c++) {
        span_t *s = ar->avail[c];
        while (s) {
            span_t *next = s->next;
            if (s->used == 0 && !(keep_one && ar->avail[c] == s && !next))
                release_superblock(ar, s);
            s = next;
        }
    }
}

/* Whether the arena's retire fence (if any) is behind us; with `wait`,
 * host-waits for it. Drops the fence once complete. Arena lock held. */
int arena_retire_fence_done(arena_t *ar, int wait)
{
    arena_resource_t *a = ar->parent;
    if (!ar->retire_fence)
        return 1;
    if (wait) {
        a->gpu->fence_wait(a->gpu->ctx, ar->retire_fence);
        atomic_fetch_add_explicit(&a->waits, 1, memory_order_relaxed);
    } else if (a->gpu->fence_query(a->gpu->ctx, ar->retire_fence) != PS_OK) {
        return 0;
    }
    a->gpu->fence_release(a->gpu->ctx, ar->retire_fence);
    ar->retire_fence = NULL;
    ar->pending -= ar->retired_free;
    ar->retired_free = 0;
    return 1;
}

/* A block is free again (its bit already cleared). Arena lock held. */
void arena_block_return(arena_t *ar, span_t *s, uint32_t index)
{
    s->free_stack[s->free_top++] = index;
    s->used--;
    if (!s->linked)
        avail_link(ar, s);
    if (s->used == 0 && (ar->orphaned || ar->retired || ar->avail[s->size_class] != s || s->next) &&
        arena_retire_fence_done(ar, 0))
        release_superblock(ar, s);
}

/* The reuse state's release callback (arena lock held): a barrier or a
 * fence covers the block at address `item`; it is free again. */
static void release_pending_block(void *ctx, uint64_t item)
{
    arena_t *ar = ctx;
    span_t *s = lookup(ar->parent, (uintptr_t)item);
    arena_block_return(ar, s, (uint32_t)(((uintptr_t)item - s->base) / s->block_size));
}

/* ---- deferred frees in two segments (arena lock held) ----------------- */

/* A block freed with PS_STREAM_NONE waits (free_sync barrier or event).
 * A reuse state's open epoch is released by a barrier only when the
 * barrier began after its *last* free; an arena that frees between every
 * two allocations never saw that happen, so each thread issued its own
 * barriers (16 threads: 16 barriers where one covers all, each one 2N+1
 * CUDA calls under the GPU-ops stream lock). So under free_sync barrier,
 * once a barrier of the family has begun since the segment's last free,
 * later frees join the other segment (when it is empty): the older one is
 * then covered by that barrier alone, whoever issued it. */
int arena_defer(arena_t *ar, uintptr_t ptr, uint64_t bytes)
{
    ps_reuse_t *r = &ar->reuse[ar->deferring];
    ps_reuse_t *other = &ar->reuse[ar->deferring ^ 1];
    if (r->free_sync == PS_FREE_SYNC_BARRIER && r->open.count && !other->bytes_pending &&
        ps_reuse_family_stamp(r->family) != r->open.stamp) {
        ar->deferring ^= 1;
        r = other;
    }
    return ps_reuse_defer(r, ptr, bytes);
}

/* The reclaim rule (core/reuse.c, 5) over both segments: poll both; then
 * one barrier releases the first and, polled again, the second (deferred
 * before it began); refused or under EVENT, each closes and polls its
 * epoch. Returns 1 when anything was released. */
static int arena_reclaim(arena_t *ar)
{
    int released = 0;
    for (int i = 0; i < 2; i++)
        if (ar->reuse[i].bytes_pending)
            released |= ps_reuse_reclaim(&ar->reuse[i]);
    return released;
}

/* Threads meet when one of them, at a miss, finds another arena's lock
 * held: two threads are inside the arena at once. MEET_HITS such misses
 * within MEET_WINDOW make it sticky. Threads that take turns (PyTorch: the
 * main thread waits while the autograd thread runs backward) never meet,
 * and keep a barrier at every miss (growing there instead costs memory:
 * docs/benchmarks.md, "The arena's design choices"). */
#define MEET_HITS 8
#define MEET_WINDOW 256

/* Whether threads met (see above); looks once more when they have not
 * yet. Arena lock held: the list's lock and the other arenas' locks are
 * only tried (never waited for: the order is list, then arena). */
static int threads_meet(arena_t *ar)
{
    arena_resource_t *a = ar->parent;
    if (atomic_load_explicit(&a->threads_met, memory_order_relaxed))
        return 1;
    if (pthread_rwlock_tryrdlock(&a->arenas_lock) != 0)
        return 0;
    int met = 0;
    for (arena_t *o = a->arenas; o && !met; o = o->next) {
        if (o == ar)
            continue;
        if (pthread_mutex_trylock(&o->lock) != 0)
            met = 1; /* held by a thread inside the arena now */
        else
            pthread_mutex_unlock(&o->lock);
    }
    pthread_rwlock_unlock(&a->arenas_lock);
    if (met && atomic_fetch_add_explicit(&a->meet_hits, 1, memory_order_relaxed) + 1 >= MEET_HITS)
        atomic_store_explicit(&a->threads_met, 1, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&a->meet_checks, 1, memory_order_relaxed) + 1 >= MEET_WINDOW) {
        atomic_store_explicit(&a->meet_checks, 0, memory_order_relaxed);
        atomic_store_explicit(&a->meet_hits, 0, memory_order_relaxed);
    }
    return atomic_load_explicit(&a->threads_met, memory_order_relaxed);
}

/* The thread floor (step 6): whether a thread's arena that found no free
 * block of its class, with cudaFree'd blocks pending that no barrier
 * covers yet, takes a superblock instead of issuing a barrier. Only under
 * free_sync barrier, only while two or more threads hold arenas and
 * threads have met in the arena (one thread, or threads taking turns,
 * issue their barrier as before); then core/reuse.c decides
 * (ps_reuse_barrier_worth: grow while its pending bytes stay under
 * thread_floor): each thread's arena holds at most thread_floor (plus the
 * superblock taken) more than it would, so the growth is bounded by
 * threads x thread_floor, and each barrier, issued by whichever arena
 * reaches its floor first, releases what every arena deferred before it
 * began (the segments). Whether threads met is asked last: it counts the
 * misses that look. Arena lock held. */
static int grows_instead_of_barrier(arena_t *ar)
{
    arena_resource_t *a = ar->parent;
    if (a->opts.free_sync != PS_FREE_SYNC_BARRIER || ar->stream != PS_STREAM_NONE ||
        atomic_load_explicit(&a->thread_arenas, memory_order_relaxed) < 2)
        return 0;
    ps_reuse_barrier_case_t miss = {.miss = 1, .pending = arena_pending(ar),
                                    .grow_floor = a->opts.thread_floor};
    return ps_reuse_barrier_worth(&miss) == PS_REUSE_GROW && threads_meet(ar);
}

/* Turns a span just taken from the global arena into a superblock of class c. */
static int carve(arena_t *ar, span_t *s, unsigned c)
{
    arena_resource_t *a = ar->parent;
    size_t bs = class_size(a, c);
    uint32_t count = (uint32_t)(a->opts.superblock_size / bs);
    if (s->stack_capacity < count) {
        uint32_t *stack = realloc(s->free_stack, count * sizeof *stack);
        if (!stack)
            return PS_ENOMEM;
        s->free_stack = stack;
        uint64_t *bits = realloc(s->in_use, ((count + 63) / 64) * sizeof *bits);
        if (!bits)
            return PS_ENOMEM;
        s->in_use = bits;
        s->stack_capacity = count;
    }
    memset(s->in_use, 0, ((count + 63) / 64) * sizeof *s->in_use);
    for (uint32_t i = 0; i < count; i++)
        s->free_stack[i] = count - 1 - i; /* lowest address first */
    s->free_top = count;
    s->block_count = count;
    s->block_size = bs;
    s->size_class = c;
    s->used = 0;
    s->kind = SPAN_SMALL;
    atomic_store_explicit(&s->owner, ar, memory_order_release);
    avail_link(ar, s);
    return PS_OK;
}

/* arena_allocate's answer when the arena no longer serves the stream. */
#define ARENA_STALE 1

/* Allocates a small block in `ar` (arena lock taken inside); `stream`: the
 * stream it must serve (PS_STREAM_NONE: a thread arena), else ARENA_STALE. */
static int arena_allocate(arena_t *ar, ps_stream_t stream, unsigned c, void **out)
{
    arena_resource_t *a = ar->parent;
    pthread_mutex_lock(&ar->lock);
    if (ar->stream != stream) {
        pthread_mutex_unlock(&ar->lock);
        return ARENA_STALE;
    }
    span_t *s = ar->avail[c];
    if (!s && arena_pending(ar)) {
        /* before taking a superblock: what completed epochs or a barrier
         * of another arena released, then one barrier (or, refused or
         * under EVENT, close the epochs and poll them) */
        ps_reuse_poll(&ar->reuse[0]);
        ps_reuse_poll(&ar->reuse[1]);
        s = ar->avail[c];
        if (!s && arena_pending(ar) && !grows_instead_of_barrier(ar)) {
            arena_reclaim(ar);
            s = ar->avail[c];
        }
    }
    if (!s) {
        pthread_mutex_lock(&a->global_lock);
        span_t *taken;
        int status = arena_global_take(a, 1, ar->stream, 1, &taken);
        if (status == PS_OK) {
            taken->kind = SPAN_SMALL;
            status = carve(ar, taken, c);
            if (status != PS_OK)
                arena_global_put(a, taken, NULL, 0);
        }
        pthread_mutex_unlock(&a->global_lock);
        if (status != PS_OK) {
            pthread_mutex_unlock(&ar->lock);
            return status;
        }
        s = ar->avail[c];
    }
    uint32_t i = s->free_stack[--s->free_top];
    s->in_use[i / 64] |= (uint64_t)1 << (i % 64);
    s->used++;
    if (s->free_top == 0)
        avail_unlink(ar, s);
    ar->in_use += s->block_size;
    *out = (void *)(s->base + (size_t)i * s->block_size);
    pthread_mutex_unlock(&ar->lock);
    return PS_OK;
}

/* ---- the arenas list ------------------------------------------------- */

static arena_t *arena_new(arena_resource_t *a, ps_stream_t stream)
{
    arena_t *ar = line_calloc(sizeof *ar);
    if (!ar)
        return NULL;
    ar->avail = calloc(a->class_count, sizeof *ar->avail);
    if (!ar->avail) {
        free(ar);
        return NULL;
    }
    pthread_mutex_init(&ar->lock, NULL);
    for (int i = 0; i < 2; i++)
        ps_reuse_init(&ar->reuse[i], a->gpu, a->opts.free_sync, 0, &a->family, release_pending_block, ar);
    ar->parent = a;
    ar->stream = stream;
    return ar;
}

/* The pthread key's destructor: the thread exited; its arena becomes an
 * orphan (adopted by the next new thread) and gives back what is empty. */
void arena_thread_exit(void *value)
{
    arena_t *ar = value;
    pthread_mutex_lock(&ar->lock);
    ar->orphaned = 1;
    atomic_fetch_sub_explicit(&ar->parent->thread_arenas, 1, memory_order_relaxed);
    for (int i = 0; i < 2; i++) {
        if (ar->reuse[i].open.count)
            ps_reuse_close(&ar->reuse[i]);
        ps_reuse_poll(&ar->reuse[i]);
    }
    arena_release_empty(ar, 0);
    pthread_mutex_unlock(&ar->lock);
}

static arena_t *thread_arena(arena_resource_t *a)
{
    arena_t *ar = pthread_getspecific(a->key);
    if (ar)
        return ar;
    pthread_rwlock_wrlock(&a->arenas_lock);
    for (arena_t *o = a->arenas; o && !ar; o = o->next) {
        pthread_mutex_lock(&o->lock);
        if (o->orphaned) {
            o->orphaned = 0;
            ar = o;
        }
        pthread_mutex_unlock(&o->lock);
    }
    if (!ar) {
        ar = arena_new(a, PS_STREAM_NONE);
        if (ar) {
            ar->next = a->arenas;
            a->arenas = ar;
        }
    }
    if (ar)
        atomic_fetch_add_explicit(&a->thread_arenas, 1, memory_order_relaxed);
    pthread_rwlock_unlock(&a->arenas_lock);
    if (ar && pthread_setspecific(a->key, ar) != 0) {
        pthread_mutex_lock(&ar->lock);
        ar->orphaned = 1;
        atomic_fetch_sub_explicit(&a->thread_arenas, 1, memory_order_relaxed);
        pthread_mutex_unlock(&ar->lock);
        return NULL;
    }
    return ar;
}

/* Each thread remembers the arenas of the last few streams it used
 * (resource id, stream) -> arena, so a stream-ordered call finds its
 * arena without the list's read lock (one cache line written by every
 * thread on every call). A hint is only a guess: arenas are never freed
 * before their resource, and an id is never reused, so the arena it names
 * exists; the caller checks under the arena's lock that it still serves
 * the stream (a destroyed stream's arena is retired or serves another). */
#define STREAM_HINTS 4
typedef struct stream_hint {
    uint64_t resource;   /* arena_resource_t.id; 0: empty */
    ps_stream_t stream;  /* the stream */
    arena_t *arena;      /* its arena when last looked up */
} stream_hint_t;
static __thread __attribute__((tls_model("initial-exec"))) stream_hint_t stream_hints[STREAM_HINTS];

static arena_t *stream_hint_find(const arena_resource_t *a, ps_stream_t stream)
{
    for (int i = 0; i < STREAM_HINTS; i++)
        if (stream_hints[i].resource == a->id && stream_hints[i].stream == stream)
            return stream_hints[i].arena;
    return NULL;
}

/* Remembers stream -> ar, most recent first. */
static void stream_hint_store(const arena_resource_t *a, ps_stream_t stream, arena_t *ar)
{
    int i = 0;
    while (i < STREAM_HINTS - 1 && !(stream_hints[i].resource == a->id && stream_hints[i].stream == stream))
        i++;
    for (; i > 0; i--)
        stream_hints[i] = stream_hints[i - 1];
    stream_hints[0] = (stream_hint_t){.resource = a->id, .stream = stream, .arena = ar};
}

/* The arena serving `stream` (created or reused on first use). */
static arena_t *stream_arena(arena_resource_t *a, ps_stream_t stream)
{
    pthread_rwlock_rdlock(&a->arenas_lock);
    arena_t *ar = a->arenas;
    while (ar && ar->stream != stream)
        ar = ar->next;
    pthread_rwlock_unlock(&a->arenas_lock);
    if (ar)
        return ar;
    pthread_rwlock_wrlock(&a->arenas_lock);
    for (ar = a->arenas; ar && ar->stream != stream;)
        ar = ar->next;
    for (arena_t *o = a->arenas; o && !ar; o = o->next) {
        pthread_mutex_lock(&o->lock);
        if (o->retired) { /* a destroyed stream's arena: reuse it */
            if (o->retire_fence && !arena_retire_fence_done(o, 0)) {
                /* the new stream runs after the dead stream's last work */
                if (ps_reuse_fence_handoff(a->gpu, o->retire_fence, stream, NULL) == PS_OK) {
                    a->gpu->fence_release(a->gpu->ctx, o->retire_fence);
                    o->retire_fence = NULL;
                    o->pending -= o->retired_free;
                    o->retired_free = 0;
                } else {
                    arena_retire_fence_done(o, 1);
                }
            }
            o->retired = 0;
            o->stream = stream;
            ar = o;
        }
        pthread_mutex_unlock(&o->lock);
    }
    if (!ar) {
        ar = arena_new(a, stream);
        if (ar) {
            ar->next = a->arenas;
            a->arenas = ar;
        }
    }
    pthread_rwlock_unlock(&a->arenas_lock);
    return ar;
}


/* ---- allocation: a thread's or a stream's arena ----------------------- */

int arena_try_allocate(arena_resource_t *a, size_t size, ps_stream_t stream, void **out)
{
    if (size > a->small_max)
        return arena_large_allocate(a, size, stream, out);
    unsigned c = arena_class_of(a, size);
    if (stream == PS_STREAM_NONE) {
        arena_t *ar = thread_arena(a);
        return ar ? arena_allocate(ar, PS_STREAM_NONE, c, out) : PS_ENOMEM;
    }
    arena_t *ar = stream_hint_find(a, stream);
    int status = ar ? arena_allocate(ar, stream, c, out) : ARENA_STALE;
    while (status == ARENA_STALE) { /* no hint, or its stream was destroyed since */
        ar = stream_arena(a, stream);
        if (!ar)
            return PS_ENOMEM;
        stream_hint_store(a, stream, ar);
        status = arena_allocate(ar, stream, c, out);
    }
    return status;
}
