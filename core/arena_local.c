/* arena_local: the local arenas, one per thread and one per stream
 * (core/arena_local.h), between the arena's front and its global arena.
 *
 * Algorithm:
 *  1. Every thread has its own arena (a pthread key; orphaned at thread
 *     exit, adopted by the next new thread), and so has every stream used
 *     by cudaMallocAsync, found through a per-thread hint (the last few
 *     streams' arenas) checked under the arena's lock, else through the
 *     list under its read lock. A destroyed stream's arena is retired (a
 *     retire fence on the stream; its free blocks pending until that
 *     completed) and serves the next new stream, which first waits for the
 *     retire fence on the GPU (core/reuse.c's fence handoff; else the host).
 *  2. An arena owns superblocks, each cut into blocks of one size class
 *     (alignment steps up to 4 x alignment, then four classes per power of
 *     two, so at most 25% is lost to rounding), with a stack of free block
 *     indices and a bitmap of blocks handed out: allocation and free are
 *     O(1) under the arena's own lock.
 *  3. A superblock whose blocks are all free goes back to the global arena
 *     (fenced on the stream, from a stream arena), unless it is its arena's
 *     last one of its class (kept against ping-pong; trim returns it too).
 *  4. A free on its arena's stream is reusable at once; on another stream
 *     the owner stream first waits for the freeing stream's work
 *     (core/reuse.c's handoff; refused during a capture, it is deferred).
 *     With PS_STREAM_NONE it follows free_sync: deferred (barrier, event)
 *     in two segments, reuse states of one family with the large blocks
 *     (under BARRIER, once a barrier of the family began since the current
 *     segment's last free, later frees join the other, so that barrier
 *     alone covers the older one); after a device synchronize (device); at
 *     once (none).
 *  5. A miss with blocks pending polls, then reclaims (one barrier, or the
 *     epochs closed and polled) before taking a superblock. The thread
 *     floor: once threads have met in the arena (a miss found another
 *     arena's lock held MEET_HITS times in MEET_WINDOW misses; sticky) and
 *     while two or more threads hold arenas, a thread's arena with fewer
 *     than thread_floor bytes pending takes a superblock instead.
 * Guarantees: the floor lets a thread's arena grow by at most thread_floor
 * plus one superblock; arenas number at most the threads plus the live
 * streams; a block is handed out again only once its owner stream is
 * ordered after its free (same stream, stream wait, barrier, fence, sync).
 */
#include "arena_local.h"

/* ---- size classes ---------------------------------------------------- */

/* Class of a request of `size` bytes (1 <= size <= small_max). Inline:
 * it is on every allocation. */
static inline __attribute__((always_inline)) unsigned class_of(size_t unit, size_t size)
{
    if (size <= 4 * unit)
        return (unsigned)((size + unit - 1) / unit - 1);
    unsigned k = arena_log2_floor(size - 1);
    size_t step = ((size_t)1 << k) / 4;
    size_t m = (size + step - 1) / step; /* 5..8 */
    return 4 + (k - arena_log2_floor(4 * unit)) * 4 + (unsigned)(m - 5);
}

/* Bytes of a block of class c. */
static size_t class_size(size_t unit, unsigned c)
{
    if (c < 4)
        return (c + 1) * unit;
    unsigned j = c - 4;
    unsigned k = arena_log2_floor(4 * unit) + j / 4;
    return (5 + j % 4) * (((size_t)1 << k) / 4);
}

/* ---- superblocks inside an arena (arena lock held) -------------------- */

/* Whether release_empty keeps an arena's last superblock of a class. */
typedef enum keep { RELEASE_ALL = 0, KEEP_LAST } keep_t;

static void avail_link(local_arena_t *ar, span_t *s)
{
    s->prev = NULL;
    s->next = ar->avail[s->size_class];
    if (s->next)
        s->next->prev = s;
    ar->avail[s->size_class] = s;
    s->linked = true;
}

static void avail_unlink(local_arena_t *ar, span_t *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        ar->avail[s->size_class] = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    s->linked = false;
}

/* Gives an empty superblock back to the global arena. Arena lock held. */
static void release_superblock(local_arena_t *ar, span_t *s)
{
    arena_locals_t *l = ar->locals;
    avail_unlink(ar, s);
    ps_fence_t *fence = NULL;
    if (ar->stream != PS_STREAM_NONE &&
        l->gpu->fence_record(l->gpu->ctx, ar->stream, &fence) == PS_OK)
        atomic_fetch_add_explicit(&l->fences, 1, memory_order_relaxed);
    arena_global_lock(l->global);
    arena_global_put_locked(l->global, s, fence, ar->stream);
    arena_global_unlock(l->global);
}

/* Releases every empty superblock of the arena (KEEP_LAST: but the last
 * of its class). Arena lock held. */
static void release_empty(local_arena_t *ar, keep_t keep)
{
    for (unsigned c = 0; c < ar->locals->class_count; c++) {
        span_t *s = ar->avail[c];
        while (s) {
            span_t *next = s->next;
            if (s->used == 0 && !(keep == KEEP_LAST && ar->avail[c] == s && !next))
                release_superblock(ar, s);
            s = next;
        }
    }
}

/* The retire fence is behind us (or the new stream waits for it): it is
 * dropped and the free blocks it held count as free. Arena lock held. */
static void drop_retire_fence(local_arena_t *ar)
{
    const ps_gpu_ops_t *gpu = ar->locals->gpu;
    gpu->fence_release(gpu->ctx, ar->retire_fence);
    ar->retire_fence = NULL;
    ar->pending -= ar->retired_free;
    ar->retired_free = 0;
}

/* Whether the arena's retire fence (if any) is behind us; ARENA_HOST_WAIT:
 * host-waits for it. Drops the fence once complete. Arena lock held. */
static bool retire_fence_done(local_arena_t *ar, arena_wait_t wait)
{
    arena_locals_t *l = ar->locals;
    if (!ar->retire_fence)
        return true;
    if (wait == ARENA_HOST_WAIT) {
        l->gpu->fence_wait(l->gpu->ctx, ar->retire_fence);
        atomic_fetch_add_explicit(&l->waits, 1, memory_order_relaxed);
    } else if (l->gpu->fence_query(l->gpu->ctx, ar->retire_fence) != PS_OK) {
        return false;
    }
    drop_retire_fence(ar);
    return true;
}

/* A block is free again (its bit already cleared). Arena lock held. */
static void block_return(local_arena_t *ar, span_t *s, uint32_t index)
{
    s->free_stack[s->free_top++] = index;
    s->used--;
    if (!s->linked)
        avail_link(ar, s);
    if (s->used == 0 && (ar->orphaned || ar->retired || ar->avail[s->size_class] != s || s->next) &&
        retire_fence_done(ar, ARENA_POLL))
        release_superblock(ar, s);
}

/* The reuse state's release callback (arena lock held): a barrier or a
 * fence covers the block at address `item`; it is free again. */
static void release_pending_block(void *ctx, uint64_t item)
{
    local_arena_t *ar = ctx;
    span_t *s = arena_global_lookup(ar->locals->global, (uintptr_t)item);
    block_return(ar, s, (uint32_t)(((uintptr_t)item - s->base) / s->block_size));
}

/* ---- deferred frees in two segments (arena lock held) ----------------- */

/* Bytes of the arena's cudaFree'd blocks waiting for a barrier or fence. */
static uint64_t deferred_bytes(const local_arena_t *ar)
{
    return ar->reuse[0].bytes_pending + ar->reuse[1].bytes_pending;
}

/* A block freed with PS_STREAM_NONE waits (free_sync barrier or event).
 * A reuse state's open epoch is released by a barrier only when the
 * barrier began after its *last* free; an arena that frees between every
 * two allocations never sees that happen, so each thread would issue its
 * own barriers. So under free_sync barrier, once a barrier of the family
 * has begun since the segment's last free, later frees join the other
 * segment (when it is empty): the older one is then covered by that
 * barrier alone, whoever issued it. */
static int defer_block(local_arena_t *ar, uintptr_t ptr, uint64_t bytes)
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

/* The reclaim rule (core/reuse.c) over both segments: poll both; then one
 * barrier releases the first and, polled again, the second (deferred
 * before it began); refused or under EVENT, each closes and polls its
 * epoch. */
static void reclaim_segments(local_arena_t *ar)
{
    for (int i = 0; i < 2; i++)
        if (ar->reuse[i].bytes_pending)
            ps_reuse_reclaim(&ar->reuse[i]);
}

/* Threads meet when one of them, at a miss, finds another arena's lock
 * held: two threads are inside the arena at once. MEET_HITS such misses
 * within MEET_WINDOW make it sticky. Threads that take turns (PyTorch: the
 * main thread waits while the autograd thread runs backward) never meet,
 * and keep a barrier at every miss. */
#define MEET_HITS 8
#define MEET_WINDOW 256

/* Whether threads met (see above); looks once more when they have not
 * yet. Arena lock held: the list's lock and the other arenas' locks are
 * only tried (never waited for: the order is list, then arena). */
static bool threads_meet(local_arena_t *ar)
{
    arena_locals_t *l = ar->locals;
    if (atomic_load_explicit(&l->threads_met, memory_order_relaxed))
        return true;
    if (pthread_rwlock_tryrdlock(&l->lock) != 0)
        return false;
    bool met = false;
    for (local_arena_t *o = l->arenas; o && !met; o = o->next) {
        if (o == ar)
            continue;
        if (pthread_mutex_trylock(&o->lock) != 0)
            met = true; /* held by a thread inside the arena now */
        else
            pthread_mutex_unlock(&o->lock);
    }
    pthread_rwlock_unlock(&l->lock);
    if (met && atomic_fetch_add_explicit(&l->meet_hits, 1, memory_order_relaxed) + 1 >= MEET_HITS)
        atomic_store_explicit(&l->threads_met, true, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&l->meet_checks, 1, memory_order_relaxed) + 1 >= MEET_WINDOW) {
        atomic_store_explicit(&l->meet_checks, 0, memory_order_relaxed);
        atomic_store_explicit(&l->meet_hits, 0, memory_order_relaxed);
    }
    return atomic_load_explicit(&l->threads_met, memory_order_relaxed);
}

/* The thread floor (step 5): whether a thread's arena that found no free
 * block of its class, with cudaFree'd blocks pending that no barrier
 * covers yet, takes a superblock instead of issuing a barrier. Only under
 * free_sync barrier, only while two or more threads hold arenas and
 * threads have met in the arena; then core/reuse.c decides
 * (ps_reuse_barrier_worth: grow while the pending bytes stay under
 * thread_floor). Whether threads met is asked last: it counts the misses
 * that look. Arena lock held. */
static bool grows_instead_of_barrier(local_arena_t *ar)
{
    arena_locals_t *l = ar->locals;
    if (l->free_sync != PS_FREE_SYNC_BARRIER || ar->stream != PS_STREAM_NONE ||
        atomic_load_explicit(&l->thread_arenas, memory_order_relaxed) < 2)
        return false;
    ps_reuse_barrier_case_t miss = {.miss = 1, .pending = deferred_bytes(ar), .grow_floor = l->thread_floor};
    return ps_reuse_barrier_worth(&miss) == PS_REUSE_GROW && threads_meet(ar);
}

/* ---- allocation inside an arena --------------------------------------- */

/* Turns a span just taken from the global arena into a superblock of
 * class c. Arena lock and global lock held. */
static int carve(local_arena_t *ar, span_t *s, unsigned c)
{
    arena_locals_t *l = ar->locals;
    size_t bs = class_size(l->alignment, c);
    uint32_t count = (uint32_t)(l->superblock_size / bs);
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

/* A superblock of class c from the global arena for `ar`. Arena lock
 * held. */
static int take_superblock(local_arena_t *ar, unsigned c)
{
    arena_global_t *g = ar->locals->global;
    arena_global_lock(g);
    span_t *taken;
    int status = arena_global_take_locked(g, 1, ar->stream, ARENA_MAY_GROW, &taken);
    if (status == PS_OK) {
        taken->kind = SPAN_SMALL;
        status = carve(ar, taken, c);
        if (status != PS_OK)
            arena_global_put_locked(g, taken, NULL, 0);
    }
    arena_global_unlock(g);
    return status;
}

/* A miss: no free block of class c in `ar`. Before taking a superblock,
 * what completed epochs or a barrier of another arena released, then one
 * barrier (or, refused or under EVENT, the epochs closed and polled)
 * unless the thread floor says grow. PS_OK: ar->avail[c] has a free block.
 * Arena lock held. */
static int refill(local_arena_t *ar, unsigned c)
{
    if (deferred_bytes(ar)) {
        ps_reuse_poll(&ar->reuse[0]);
        ps_reuse_poll(&ar->reuse[1]);
        if (ar->avail[c])
            return PS_OK;
        if (deferred_bytes(ar) && !grows_instead_of_barrier(ar)) {
            reclaim_segments(ar);
            if (ar->avail[c])
                return PS_OK;
        }
    }
    return take_superblock(ar, c);
}

/* arena_allocate's answer when the arena no longer serves the stream. */
#define ARENA_STALE 1

/* Allocates a small block in `ar` (arena lock taken inside); `stream`: the
 * stream it must serve (PS_STREAM_NONE: a thread arena), else ARENA_STALE.
 * Inline: the hit is the hot path. */
static inline __attribute__((always_inline)) int arena_allocate(local_arena_t *ar, ps_stream_t stream,
                                                                 unsigned c, void **out)
{
    pthread_mutex_lock(&ar->lock);
    if (ar->stream != stream) {
        pthread_mutex_unlock(&ar->lock);
        return ARENA_STALE;
    }
    span_t *s = ar->avail[c];
    if (!s) {
        int status = refill(ar, c);
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

static local_arena_t *arena_new(arena_locals_t *l, ps_stream_t stream)
{
    local_arena_t *ar = arena_line_calloc(sizeof *ar);
    if (!ar)
        return NULL;
    ar->avail = calloc(l->class_count, sizeof *ar->avail);
    if (!ar->avail) {
        free(ar);
        return NULL;
    }
    pthread_mutex_init(&ar->lock, NULL);
    for (int i = 0; i < 2; i++)
        ps_reuse_init(&ar->reuse[i], l->gpu, l->free_sync, 0, l->family, release_pending_block, ar);
    ar->locals = l;
    ar->stream = stream;
    return ar;
}

/* The pthread key's destructor: the thread exited; its arena becomes an
 * orphan (adopted by the next new thread) and gives back what is empty. */
static void thread_exit(void *value)
{
    local_arena_t *ar = value;
    pthread_mutex_lock(&ar->lock);
    ar->orphaned = true;
    atomic_fetch_sub_explicit(&ar->locals->thread_arenas, 1, memory_order_relaxed);
    for (int i = 0; i < 2; i++) {
        if (ar->reuse[i].open.count)
            ps_reuse_close(&ar->reuse[i]);
        ps_reuse_poll(&ar->reuse[i]);
    }
    release_empty(ar, RELEASE_ALL);
    pthread_mutex_unlock(&ar->lock);
}

/* The calling thread's first call: an orphaned arena adopted, else a new
 * one, registered in the thread's key. NULL: no host memory. */
static local_arena_t *thread_arena_first(arena_locals_t *l)
{
    local_arena_t *ar = NULL;
    pthread_rwlock_wrlock(&l->lock);
    for (local_arena_t *o = l->arenas; o && !ar; o = o->next) {
        pthread_mutex_lock(&o->lock);
        if (o->orphaned) {
            o->orphaned = false;
            ar = o;
        }
        pthread_mutex_unlock(&o->lock);
    }
    if (!ar) {
        ar = arena_new(l, PS_STREAM_NONE);
        if (ar) {
            ar->next = l->arenas;
            l->arenas = ar;
        }
    }
    if (ar)
        atomic_fetch_add_explicit(&l->thread_arenas, 1, memory_order_relaxed);
    pthread_rwlock_unlock(&l->lock);
    if (ar && pthread_setspecific(l->key, ar) != 0) {
        pthread_mutex_lock(&ar->lock);
        ar->orphaned = true;
        atomic_fetch_sub_explicit(&l->thread_arenas, 1, memory_order_relaxed);
        pthread_mutex_unlock(&ar->lock);
        return NULL;
    }
    return ar;
}

/* Each thread remembers the arenas of the last few streams it used
 * (layer id, stream) -> arena, so a stream-ordered call finds its arena
 * without the list's read lock (one cache line written by every thread on
 * every call). A hint is only a guess: arenas are never freed before their
 * resource, and an id is never reused, so the arena it names exists; the
 * caller checks under the arena's lock that it still serves the stream (a
 * destroyed stream's arena is retired or serves another). */
#define STREAM_HINTS 4
typedef struct stream_hint {
    uint64_t locals;       /* arena_locals_t.id; 0: empty */
    ps_stream_t stream;    /* the stream */
    local_arena_t *arena;  /* its arena when last looked up */
} stream_hint_t;
static __thread __attribute__((tls_model("initial-exec"))) stream_hint_t stream_hints[STREAM_HINTS];

static _Atomic uint64_t next_locals_id; /* ids handed out (arena_locals_t.id) */

static local_arena_t *stream_hint_find(const arena_locals_t *l, ps_stream_t stream)
{
    for (int i = 0; i < STREAM_HINTS; i++)
        if (stream_hints[i].locals == l->id && stream_hints[i].stream == stream)
            return stream_hints[i].arena;
    return NULL;
}

/* Remembers stream -> ar, most recent first. */
static void stream_hint_store(const arena_locals_t *l, ps_stream_t stream, local_arena_t *ar)
{
    int i = 0;
    while (i < STREAM_HINTS - 1 && !(stream_hints[i].locals == l->id && stream_hints[i].stream == stream))
        i++;
    for (; i > 0; i--)
        stream_hints[i] = stream_hints[i - 1];
    stream_hints[0] = (stream_hint_t){.locals = l->id, .stream = stream, .arena = ar};
}

/* Arena `o` (retired, its lock held) now serves the new `stream`, which
 * runs after the dead stream's last work. */
static void adopt_retired(arena_locals_t *l, local_arena_t *o, ps_stream_t stream)
{
    if (o->retire_fence && !retire_fence_done(o, ARENA_POLL)) {
        if (ps_reuse_fence_handoff(l->gpu, o->retire_fence, stream, NULL) == PS_OK)
            drop_retire_fence(o);
        else
            retire_fence_done(o, ARENA_HOST_WAIT);
    }
    o->retired = false;
    o->stream = stream;
}

/* The arena serving `stream` (created or reused on first use). */
static local_arena_t *stream_arena(arena_locals_t *l, ps_stream_t stream)
{
    pthread_rwlock_rdlock(&l->lock);
    local_arena_t *ar = l->arenas;
    while (ar && ar->stream != stream)
        ar = ar->next;
    pthread_rwlock_unlock(&l->lock);
    if (ar)
        return ar;
    pthread_rwlock_wrlock(&l->lock);
    for (ar = l->arenas; ar && ar->stream != stream;)
        ar = ar->next;
    for (local_arena_t *o = l->arenas; o && !ar; o = o->next) {
        pthread_mutex_lock(&o->lock);
        if (o->retired) { /* a destroyed stream's arena: reuse it */
            adopt_retired(l, o, stream);
            ar = o;
        }
        pthread_mutex_unlock(&o->lock);
    }
    if (!ar) {
        ar = arena_new(l, stream);
        if (ar) {
            ar->next = l->arenas;
            l->arenas = ar;
        }
    }
    pthread_rwlock_unlock(&l->lock);
    return ar;
}

/* ---- the layer's calls ------------------------------------------------ */

int arena_locals_init(arena_locals_t *l, arena_global_t *global, const ps_gpu_ops_t *gpu,
                      ps_reuse_family_t *family, ps_free_sync_t free_sync, size_t alignment,
                      size_t thread_floor)
{
    l->global = global;
    l->gpu = gpu;
    l->family = family;
    l->free_sync = free_sync;
    l->alignment = alignment;
    l->superblock_size = global->superblock_size;
    l->thread_floor = thread_floor;
    l->small_max = l->superblock_size / 2;
    l->class_count = class_of(l->alignment, l->small_max) + 1;
    l->id = atomic_fetch_add(&next_locals_id, 1) + 1;
    if (pthread_key_create(&l->key, thread_exit) != 0)
        return PS_ENOMEM;
    pthread_rwlock_init(&l->lock, NULL);
    return PS_OK;
}

void arena_locals_destroy(arena_locals_t *l)
{
    pthread_key_delete(l->key);
    for (local_arena_t *ar = l->arenas; ar;) {
        local_arena_t *next = ar->next;
        ps_reuse_destroy(&ar->reuse[0]);
        ps_reuse_destroy(&ar->reuse[1]);
        if (ar->retire_fence)
            l->gpu->fence_release(l->gpu->ctx, ar->retire_fence);
        pthread_mutex_destroy(&ar->lock);
        free(ar->avail);
        free(ar);
        ar = next;
    }
    pthread_rwlock_destroy(&l->lock);
}

/* A block of class c for `stream` from its arena (found through the
 * thread's hints, else the list). */
static int stream_allocate(arena_locals_t *l, ps_stream_t stream, unsigned c, void **out)
{
    local_arena_t *ar = stream_hint_find(l, stream);
    int status = ar ? arena_allocate(ar, stream, c, out) : ARENA_STALE;
    while (status == ARENA_STALE) { /* no hint, or its stream was destroyed since */
        ar = stream_arena(l, stream);
        if (!ar)
            return PS_ENOMEM;
        stream_hint_store(l, stream, ar);
        status = arena_allocate(ar, stream, c, out);
    }
    return status;
}

int arena_local_allocate(arena_locals_t *l, size_t size, ps_stream_t stream, void **out)
{
    unsigned c = class_of(l->alignment, size);
    if (stream != PS_STREAM_NONE)
        return stream_allocate(l, stream, c, out);
    local_arena_t *ar = pthread_getspecific(l->key);
    if (!ar && !(ar = thread_arena_first(l)))
        return PS_ENOMEM;
    return arena_allocate(ar, PS_STREAM_NONE, c, out);
}

/* How a free of a block of `ar` on `stream` is ordered before the block's
 * reuse: PS_OK and *defer false: free it now; *defer true: it waits in the
 * arena's reuse state. Another status: nothing changed. Arena lock held. */
static int order_free(arena_locals_t *l, local_arena_t *ar, ps_stream_t stream, bool *defer)
{
    int status = PS_OK;
    bool ordered_here = stream != PS_STREAM_NONE && ar->stream != PS_STREAM_NONE;
    *defer = !ordered_here && ps_reuse_defers(&ar->reuse[0]);
    if (ordered_here && stream != ar->stream) {
        /* the owner stream waits for the freeing stream's work (reuse's handoff) */
        uint64_t fences = 0;
        status = ps_reuse_stream_handoff(l->gpu, stream, ar->stream, &fences, NULL);
        if (fences)
            atomic_fetch_add_explicit(&l->fences, fences, memory_order_relaxed);
    } else if (!ordered_here && !*defer && l->free_sync == PS_FREE_SYNC_DEVICE) {
        status = l->gpu->device_synchronize(l->gpu->ctx);
    }
    if (status == PS_EBUSY) { /* the owner stream or another captures: the block waits in the reuse state */
        *defer = true;
        status = PS_OK;
    }
    return status;
}

/* Frees `ptr` in span `s` of `ar` (arena lock held; the span still ar's).
 * PS_EINVAL (nothing changed): not a block handed out. */
static int free_block(arena_locals_t *l, local_arena_t *ar, span_t *s, void *ptr, ps_stream_t stream)
{
    uintptr_t offset = (uintptr_t)ptr - s->base;
    uint32_t i = (uint32_t)(offset / s->block_size);
    if (offset % s->block_size || i >= s->block_count || !(s->in_use[i / 64] & ((uint64_t)1 << (i % 64))))
        return PS_EINVAL;
    bool defer;
    int status = order_free(l, ar, stream, &defer);
    if (status == PS_OK && defer)
        status = defer_block(ar, (uintptr_t)ptr, s->block_size);
    if (status == PS_OK) {
        size_t bytes = s->block_size;
        s->in_use[i / 64] &= ~((uint64_t)1 << (i % 64));
        if (!defer)
            block_return(ar, s, i);
        ar->in_use -= bytes;
    }
    return status;
}

int arena_local_deallocate(arena_locals_t *l, void *ptr, ps_stream_t stream)
{
    for (;;) {
        span_t *s = arena_global_lookup(l->global, (uintptr_t)ptr);
        if (!s)
            return PS_EINVAL;
        local_arena_t *ar = atomic_load_explicit(&s->owner, memory_order_acquire);
        if (!ar)
            return ARENA_NOT_LOCAL;
        pthread_mutex_lock(&ar->lock);
        /* still ar's, and still the superblock of ptr: a span struct
         * released meanwhile may be ar's again, for another superblock */
        if (atomic_load_explicit(&s->owner, memory_order_relaxed) == ar &&
            ((uintptr_t)ptr & ~(uintptr_t)(l->superblock_size - 1)) == s->base) {
            int status = free_block(l, ar, s, ptr, stream);
            pthread_mutex_unlock(&ar->lock);
            return status;
        }
        pthread_mutex_unlock(&ar->lock); /* it changed hands meanwhile: look again */
    }
}

void arena_local_reclaim(arena_locals_t *l, arena_wait_t wait)
{
    pthread_rwlock_rdlock(&l->lock);
    for (local_arena_t *ar = l->arenas; ar; ar = ar->next) {
        pthread_mutex_lock(&ar->lock);
        ps_reuse_reclaim_pressure(&ar->reuse[0], wait == ARENA_HOST_WAIT);
        ps_reuse_reclaim_pressure(&ar->reuse[1], wait == ARENA_HOST_WAIT);
        if (retire_fence_done(ar, wait))
            release_empty(ar, RELEASE_ALL);
        pthread_mutex_unlock(&ar->lock);
    }
    pthread_rwlock_unlock(&l->lock);
}

/* One fence on `stream`, for the free blocks of its arena `ar` at its
 * destroy; without one, the device is synchronized and they are safe for
 * every stream as they are. Arena lock held. */
static void record_retire_fence(arena_locals_t *l, local_arena_t *ar, ps_stream_t stream)
{
    uint64_t free_bytes = 0;
    for (unsigned c = 0; c < l->class_count; c++)
        for (span_t *s = ar->avail[c]; s; s = s->next)
            free_bytes += (uint64_t)s->free_top * s->block_size;
    if (!free_bytes)
        return;
    ps_fence_t *fence = NULL;
    if (l->gpu->fence_record(l->gpu->ctx, stream, &fence) == PS_OK) {
        atomic_fetch_add_explicit(&l->fences, 1, memory_order_relaxed);
        ar->retire_fence = fence;
        ar->retired_free = free_bytes;
        ar->pending += free_bytes;
    } else {
        l->gpu->device_synchronize(l->gpu->ctx);
    }
}

void arena_local_stream_destroyed(arena_locals_t *l, ps_stream_t stream)
{
    pthread_rwlock_wrlock(&l->lock);
    local_arena_t *ar = l->arenas;
    while (ar && (ar->retired || ar->stream != stream))
        ar = ar->next;
    if (ar) {
        pthread_mutex_lock(&ar->lock);
        record_retire_fence(l, ar, stream);
        ar->stream = PS_STREAM_NONE;
        ar->retired = true;
        if (!ar->retire_fence)
            release_empty(ar, RELEASE_ALL);
        pthread_mutex_unlock(&ar->lock);
    }
    pthread_rwlock_unlock(&l->lock);
}

arena_local_figures_t arena_local_figures(arena_locals_t *l)
{
    arena_local_figures_t f = {.fences_recorded = atomic_load(&l->fences),
                               .fence_waits = atomic_load(&l->waits)};
    pthread_rwlock_rdlock(&l->lock);
    for (local_arena_t *ar = l->arenas; ar; ar = ar->next) {
        pthread_mutex_lock(&ar->lock);
        f.in_use += ar->in_use;
        f.pending += ar->pending + deferred_bytes(ar);
        for (int i = 0; i < 2; i++) {
            f.fences_recorded += ar->reuse[i].fences_recorded;
            f.fence_waits += ar->reuse[i].fence_waits;
            f.barriers += ar->reuse[i].barriers;
        }
        pthread_mutex_unlock(&ar->lock);
    }
    pthread_rwlock_unlock(&l->lock);
    return f;
}
