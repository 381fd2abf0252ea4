/* arena: a suballocator built for many threads (core/arena.h), after the
 * design of RMM's arena_memory_resource.
 *
 * Algorithm:
 *  1. The global arena (core/arena_global.c) takes memory from the
 *     upstream in chunks (power-of-two sizes, at most 128 superblocks unless
 *     a request is bigger), cuts them into superblocks of superblock_size
 *     bytes aligned to their size, keeps free runs of superblocks ("spans")
 *     on one list and hands out runs by best fit; wholly free chunks go
 *     back to the upstream before it grows. (First fit, 1/8-of-reserve
 *     chunks and no giving back reserved 2.27x and 2.93x the peak
 *     requested on PyTorch transformer and conv net logs; now 1.16x and
 *     1.12x, single-thread replay.)
 *  2. A page table (two levels, lock-free reads; lookup() in
 *     core/arena_internal.h) maps address >> log2(superblock_size) to the
 *     span holding it, so a free finds its superblock in O(1) from the
 *     address alone, from any thread.
 *  3. Every thread has its own arena (thread-local through a pthread key,
 *     registered in a list, orphaned at thread exit by the key's
 *     destructor and adopted by the next new thread); every stream used by
 *     cudaMallocAsync has its own arena too, found through a per-thread
 *     hint (the last few streams' arenas, keyed by the resource's id)
 *     checked under the arena's lock — it must still serve that stream —
 *     and only on a miss through the list under its read lock (that lock
 *     on every stream-ordered call serialized threads_mixed: 16 threads
 *     wrote one cache line per call). An arena owns superblocks,
 *     each cut into blocks of one size class (256 B steps up to 1 KiB, then
 *     four classes per power of two, so at most 25% is lost to rounding),
 *     with a host-side stack of free block indices and a bitmap of blocks
 *     handed out. Allocation and free inside a superblock are O(1) under
 *     the arena's own lock: threads contend only when one frees another's
 *     block or when they take or return superblocks (global lock).
 *  4. Requests above superblock_size/2 take whole superblocks straight from
 *     the global arena (rounded up to a superblock multiple). Under
 *     free_sync barrier, once cudaFree'd large blocks pass 3 % of the
 *     reserve (and 1 MiB), a large request first issues one barrier (the
 *     pool's eager barrier), so that they serve the next requests instead
 *     of those cutting other runs.
 *  5. A superblock whose blocks are all free goes back to the global arena,
 *     unless it is its arena's last one of its class (kept to avoid
 *     ping-pong on alloc/free loops; trim and defragment return it too).
 *  6. Frees with PS_STREAM_NONE follow free_sync through core/reuse.c,
 *     which owns the rule for every resource (epochs, fences, the barrier
 *     and its fallback, pending bytes): each arena has a reuse state, the
 *     large blocks one more, all of one *family* (a barrier issued by one
 *     releases, at the others' next poll, what they deferred before it).
 *     An arena defers into two segments (two reuse states): under BARRIER,
 *     once a barrier of the family has begun since the current segment's
 *     last free, later frees join the other (empty) segment, so that
 *     barrier alone covers the older one (one open epoch always held a
 *     free younger than any barrier, and each of 16 threads issued its own
 *     barriers — 2N+1 CUDA calls under the GPU-ops stream lock each: no
 *     scaling on threads_mixed).
 *     The thread floor (issue 18): once threads have met in the arena (a
 *     miss found another arena's lock held, 8 times in a window of 256
 *     misses; sticky) and while two or more threads hold arenas, a thread's
 *     arena whose pending bytes are under thread_floor (default 16 MiB)
 *     takes a superblock at a miss instead of issuing a barrier; whichever
 *     arena reaches its floor first issues one, and it releases what every
 *     arena deferred before it began. Growth is bounded by threads x
 *     thread_floor. One thread, and threads that take turns (PyTorch's
 *     main and autograd threads), keep a barrier at every miss.
 *     Under BARRIER (the default) and EVENT the block is deferred; when an
 *     arena finds no free block of the class (or a large request no free
 *     span) it reclaims before taking memory it would not otherwise need:
 *     what completed epochs or another arena's barrier released (a poll),
 *     then one GPU barrier (every pending block free at
 *     once, no host wait), or — barrier refused because a stream capture
 *     is open, or EVENT — close the epoch with one
 *     fence_record(PS_STREAM_NONE) and poll (never a host wait on that
 *     path). Blocks freed on the
 *     stream of their stream arena are reusable at once; freed on
 *     another stream, the owner stream first waits (stream_wait_fence) for a
 *     fence recorded at the free. A superblock leaving a stream arena
 *     carries a fence on that stream; a thread arena takes it only once the
 *     fence completed, another stream after stream_wait_fence.
 *  7. stream_destroyed(s): one fence ("retire fence") is recorded on s
 *     while its handle is still valid, and s's arena is *retired*: it
 *     forgets s (stream NONE: later frees of its blocks follow free_sync
 *     like a thread arena's, and no fence or stream wait names s again).
 *     Its free blocks count as pending and none of its superblocks goes
 *     back to the global arena until the retire fence completed (trim
 *     polls it, defragment under pressure host-waits for it). The next new
 *     stream reuses the retired arena as is: if the fence is not complete
 *     yet, the new stream first waits for it on the GPU
 *     (stream_wait_fence(new, retire fence); a host wait if that fails).
 *     Free spans fenced on s are marked as fenced on "some other stream"
 *     (a new stream may reuse the handle value). So arenas number at most
 *     the live streams (plus threads), however many streams come and go,
 *     and a destroy costs O(size classes), not O(free blocks).
 *  8. On failure the arena defragments — every arena releases its pending
 *     blocks (one barrier for the family, else it closes and waits for
 *     its epochs) and returns its empty superblocks, the global arena gives
 *     wholly free chunks back to the upstream — and retries once. If that
 *     fails too it warns with the fragmentation (largest free run vs all
 *     free bytes) and returns PS_ENOMEM.
 * Why 2 MiB superblocks: the GPU's large-page granularity and cuMemAlloc's
 * alignment for large blocks, so superblocks never straddle device pages;
 * small enough that a thread holding one superblock per size class it uses
 * keeps little memory idle, large enough that classes up to 1 MiB fit two
 * blocks or more and superblock traffic on the global lock stays rare.
 * Guarantees: pointers aligned to `alignment`; no block freed under
 * BARRIER or EVENT reused before a barrier begun after its free or a fence
 * recorded after its free completed; bad or double
 * frees return PS_EINVAL and change nothing; PS_ENOMEM leaves it usable.
 * Limits: device addresses must lie below 2^48 (true of CUDA's UVA); the
 * resource must not be destroyed while other threads still use it.
 */
#include "arena_internal.h"

void ps_arena_options_default(ps_arena_options_t *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->superblock_size = 2 * PS_MiB;
    opts->alignment = 256;
    opts->free_sync = PS_FREE_SYNC_BARRIER;
    opts->thread_floor = 16 * PS_MiB;
}

/* ---- size classes ---------------------------------------------------- */

/* Class of a request of `size` bytes (1 <= size <= small_max). */
static unsigned class_of(const arena_resource_t *a, size_t size)
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
static void release_empty(arena_t *ar, int keep_one)
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
static int retire_fence_done(arena_t *ar, int wait)
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
static void block_return(arena_t *ar, span_t *s, uint32_t index)
{
    s->free_stack[s->free_top++] = index;
    s->used--;
    if (!s->linked)
        avail_link(ar, s);
    if (s->used == 0 && (ar->orphaned || ar->retired || ar->avail[s->size_class] != s || s->next) &&
        retire_fence_done(ar, 0))
        release_superblock(ar, s);
}

/* The reuse state's release callback (arena lock held): a barrier or a
 * fence covers the block at address `item`; it is free again. */
static void release_pending_block(void *ctx, uint64_t item)
{
    arena_t *ar = ctx;
    span_t *s = lookup(ar->parent, (uintptr_t)item);
    block_return(ar, s, (uint32_t)(((uintptr_t)item - s->base) / s->block_size));
}

/* ---- deferred frees in two segments (arena lock held) ----------------- */

/* Bytes of the arena's cudaFree'd blocks waiting for a barrier or fence. */
static uint64_t arena_pending(const arena_t *ar)
{
    return ar->reuse[0].bytes_pending + ar->reuse[1].bytes_pending;
}

/* A block freed with PS_STREAM_NONE waits (free_sync barrier or event).
 * A reuse state's open epoch is released by a barrier only when the
 * barrier began after its *last* free; an arena that frees between every
 * two allocations never saw that happen, so each thread issued its own
 * barriers (16 threads: 16 barriers where one covers all, each one 2N+1
 * CUDA calls under the GPU-ops stream lock). So under free_sync barrier,
 * once a barrier of the family has begun since the segment's last free,
 * later frees join the other segment (when it is empty): the older one is
 * then covered by that barrier alone, whoever issued it. */
static int arena_defer(arena_t *ar, uintptr_t ptr, uint64_t bytes)
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
 * and keep a barrier at every miss (replayed on two threads taking turns,
 * growing at every miss took the MLP log from 224 to 288 MiB). */
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
 * issue their barrier as before), and only while its pending bytes stay
 * under thread_floor: each thread's arena holds at most thread_floor
 * (plus the superblock taken) more than it would, so the growth is
 * bounded by threads x thread_floor, and each barrier, issued by whichever
 * arena reaches its floor first, releases what every arena deferred
 * before it began (the segments). Arena lock held. */
static int grows_instead_of_barrier(arena_t *ar)
{
    arena_resource_t *a = ar->parent;
    return a->opts.free_sync == PS_FREE_SYNC_BARRIER && ar->stream == PS_STREAM_NONE &&
           arena_pending(ar) < a->opts.thread_floor &&
           atomic_load_explicit(&a->thread_arenas, memory_order_relaxed) >= 2 && threads_meet(ar);
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
static void thread_arena_exit(void *value)
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
    release_empty(ar, 0);
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
static _Atomic uint64_t next_resource_id; /* ids handed out */

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
            if (o->retire_fence && !retire_fence_done(o, 0)) {
                /* the new stream runs after the dead stream's last work */
                if (a->gpu->stream_wait_fence(a->gpu->ctx, stream, o->retire_fence) == PS_OK) {
                    a->gpu->fence_release(a->gpu->ctx, o->retire_fence);
                    o->retire_fence = NULL;
                    o->pending -= o->retired_free;
                    o->retired_free = 0;
                } else {
                    retire_fence_done(o, 1);
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

/* ---- large blocks (global lock) --------------------------------------- */

/* The large blocks' eager barrier (free_sync barrier): issued before a
 * large request once their pending bytes pass this % of the reserve (and
 * PS_REUSE_EAGER_FLOOR), not only when no run fits: while they wait, the
 * requests they could serve cut other runs. The pool's default
 * (barrier_pending_percent); replay of the conv net log with best fit:
 * 6.12 -> 4.32 GiB reserved, the transformer 5.66 -> 5.78. */
#define LARGE_BARRIER_PERCENT 3

/* large_reuse's release callback (global lock held): the span at `item`
 * is free. */
static void release_pending_large(void *ctx, uint64_t item)
{
    arena_resource_t *a = ctx;
    arena_global_put(a, lookup(a, (uintptr_t)item), NULL, 0);
}

static int large_allocate(arena_resource_t *a, size_t size, ps_stream_t stream, void **out)
{
    size_t pages = (size + a->opts.superblock_size - 1) >> a->shift;
    pthread_mutex_lock(&a->global_lock);
    span_t *s = NULL;
    /* the eager barrier (LARGE_BARRIER_PERCENT); then what is free, then
     * what completed fences free, then grow */
    ps_reuse_poll(&a->large_reuse);
    if (ps_reuse_wants_barrier(&a->large_reuse, a->reserved))
        ps_reuse_barrier(&a->large_reuse);
    int status = arena_global_take(a, pages, stream, 0, &s);
    if (status == PS_ENOMEM && a->large_reuse.bytes_pending && ps_reuse_reclaim(&a->large_reuse))
        status = arena_global_take(a, pages, stream, 0, &s); /* after a barrier, or epochs that completed */
    if (status == PS_ENOMEM)
        status = arena_global_take(a, pages, stream, 1, &s);
    if (status == PS_OK) {
        s->kind = SPAN_LARGE;
        s->block_size = pages << a->shift;
        a->large_in_use += s->block_size;
        *out = (void *)s->base;
    }
    pthread_mutex_unlock(&a->global_lock);
    return status;
}

static int large_deallocate(arena_resource_t *a, span_t *s, void *ptr, ps_stream_t stream)
{
    pthread_mutex_lock(&a->global_lock);
    if (lookup(a, (uintptr_t)ptr) != s || s->kind != SPAN_LARGE || s->base != (uintptr_t)ptr) {
        pthread_mutex_unlock(&a->global_lock);
        return PS_EINVAL;
    }
    int status = PS_OK;
    uint64_t bytes = s->block_size;
    if (stream != PS_STREAM_NONE) {
        ps_fence_t *fence = NULL;
        if (a->gpu->fence_record(a->gpu->ctx, stream, &fence) == PS_OK) {
            atomic_fetch_add_explicit(&a->fences, 1, memory_order_relaxed);
            arena_global_put(a, s, fence, stream);
        } else {
            status = PS_EUPSTREAM;
        }
    } else if (ps_reuse_defers(&a->large_reuse)) {
        status = ps_reuse_defer(&a->large_reuse, s->base, bytes);
        if (status == PS_OK)
            s->kind = SPAN_PENDING_LARGE;
    } else {
        if (a->opts.free_sync == PS_FREE_SYNC_DEVICE)
            status = a->gpu->device_synchronize(a->gpu->ctx);
        if (status == PS_OK)
            arena_global_put(a, s, NULL, 0);
    }
    if (status == PS_OK)
        a->large_in_use -= bytes;
    pthread_mutex_unlock(&a->global_lock);
    return status;
}

/* ---- defragmentation ------------------------------------------------- */

/* Defragmentation's reclaim of one reuse state: what a barrier of the
 * family already covers; then one barrier (free_sync barrier; the other
 * states find it covered); refused or under EVENT, close the open epoch
 * and poll, or with `wait` host-wait, every closed epoch. */
static void reclaim_for_defragment(ps_reuse_t *r, int wait)
{
    ps_reuse_poll(r);
    if (!r->bytes_pending || ps_reuse_barrier(r))
        return;
    if (r->open.count)
        ps_reuse_close(r);
    if (wait)
        while (ps_reuse_wait_oldest(r))
            ;
    ps_reuse_poll(r);
}

/* Every arena closes its open epoch, reclaims completed ones and gives
 * back its empty superblocks; with `wait`, epochs and fences are waited
 * for first (memory pressure). Then free chunks go back
 * to the upstream. No lock held on entry. */
static void defragment(arena_resource_t *a, int wait)
{
    pthread_rwlock_rdlock(&a->arenas_lock);
    for (arena_t *ar = a->arenas; ar; ar = ar->next) {
        pthread_mutex_lock(&ar->lock);
        reclaim_for_defragment(&ar->reuse[0], wait);
        reclaim_for_defragment(&ar->reuse[1], wait);
        if (retire_fence_done(ar, wait))
            release_empty(ar, 0);
        pthread_mutex_unlock(&ar->lock);
    }
    pthread_rwlock_unlock(&a->arenas_lock);
    pthread_mutex_lock(&a->global_lock);
    reclaim_for_defragment(&a->large_reuse, wait);
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

static int try_allocate(arena_resource_t *a, size_t size, ps_stream_t stream, void **out)
{
    if (size > a->small_max)
        return large_allocate(a, size, stream, out);
    unsigned c = class_of(a, size);
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
    if (size == 0)
        size = 1;
    if (size > SIZE_MAX - a->opts.superblock_size)
        return PS_ENOMEM;
    int status = try_allocate(a, size, stream, out);
    if (status == PS_ENOMEM) {
        defragment(a, 1);
        status = try_allocate(a, size, stream, out);
        if (status == PS_ENOMEM)
            warn_fragmentation(a, size);
    }
    return status;
}

static int arena_res_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    arena_resource_t *a = (arena_resource_t *)r;
    for (;;) {
        span_t *s = lookup(a, (uintptr_t)ptr);
        if (!s)
            return PS_EINVAL;
        arena_t *ar = atomic_load_explicit(&s->owner, memory_order_acquire);
        if (!ar)
            return large_deallocate(a, s, ptr, stream);
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
        if (ordered_here && stream != ar->stream) {
            /* the owner stream waits for the freeing stream's work */
            ps_fence_t *fence;
            status = a->gpu->fence_record(a->gpu->ctx, stream, &fence);
            if (status == PS_OK) {
                atomic_fetch_add_explicit(&a->fences, 1, memory_order_relaxed);
                status = a->gpu->stream_wait_fence(a->gpu->ctx, ar->stream, fence);
                a->gpu->fence_release(a->gpu->ctx, fence);
            }
        } else if (!ordered_here && ps_reuse_defers(&ar->reuse[0])) {
            status = arena_defer(ar, (uintptr_t)ptr, s->block_size);
            if (status == PS_OK) {
                s->in_use[i / 64] &= ~((uint64_t)1 << (i % 64));
                ar->in_use -= s->block_size;
            }
            pthread_mutex_unlock(&ar->lock);
            return status;
        } else if (!ordered_here && a->opts.free_sync == PS_FREE_SYNC_DEVICE) {
            status = a->gpu->device_synchronize(a->gpu->ctx);
        }
        if (status == PS_OK) {
            size_t bytes = s->block_size;
            s->in_use[i / 64] &= ~((uint64_t)1 << (i % 64));
            block_return(ar, s, i);
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
    if (stream == PS_STREAM_NONE)
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
            release_empty(ar, 0);
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
    ps_reuse_init(&a->large_reuse, gpu, o.free_sync, LARGE_BARRIER_PERCENT, &a->family, release_pending_large, a);
    a->shift = log2_floor(o.superblock_size);
    a->small_max = o.superblock_size / 2;
    a->class_count = class_of(a, a->small_max) + 1;
    a->leaf_count = (size_t)1 << (ADDRESS_BITS - a->shift - LEAF_BITS);
    a->page_table = calloc(a->leaf_count, sizeof *a->page_table);
    if (!a->page_table || pthread_key_create(&a->key, thread_arena_exit) != 0) {
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
