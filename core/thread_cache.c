/* Per-thread caches of freed blocks in front of a pool (core/thread_cache.h),
 * in the style of tcmalloc's and mimalloc's thread caches: the common
 * allocate/free of a thread touches only its own cache, so threads do not
 * serialize on the pool's lock.
 *
 * Algorithm
 *  1. A *set* belongs to one pool. Each thread that frees to (or refills
 *     from) the pool gets a *cache* in the set: BINS bins chosen by a hash
 *     of the block size; a bin holds blocks of exactly one size, a stack of
 *     up to READY_DEPTH ready ones and a ring of up to FREED_DEPTH freed
 *     ones (oldest first), at most cap_bytes in all; blocks above
 *     cap_bytes / 4 are never cached. The cache has its own spinlock, taken
 *     by its thread on every operation (uncontended: other threads take it
 *     only to drain it, rarely), and the set keeps the list of its caches.
 *  2. Every freed block carries a *tag*: the set's barrier ticket counter
 *     read (sequentially consistent) at the free (ready blocks need none:
 *     refills from the pool's ready list, frees under free_sync none). The
 *     pool takes a ticket (counter + 1) before a barrier's first CUDA call
 *     and publishes it as `done` (release) after the barrier succeeded. A
 *     block with tag t < done was freed before the increment that produced
 *     a completed barrier's ticket, so that barrier was issued after the
 *     free: all GPU work issued later runs after all work issued before the
 *     free (DESIGN.md, "Reuse after cudaFree: the barrier"). A refused
 *     barrier (stream capture) never publishes, so nothing depends on it.
 *     Tags never decrease along the ring.
 *  3. take(size, stream), in the bin of `size`: the newest freed block if
 *     it was freed by this thread on the same (stream-ordered) stream s
 *     (the RMM rule: reuse on s is ordered by s); else a ready block; else
 *     the oldest freed block if its tag < done. Miss: the pool serves it
 *     under its lock and may refill the bin with a few ready blocks of the
 *     same size taken at the same time (one lock for several allocations).
 *  4. put(ptr, size, stream): onto its bin's ring (free_sync none: its
 *     stack); freed blocks a barrier released move to the stack while it
 *     has room. A full ring, a bin of another size, or the byte cap evicts
 *     the oldest blocks; they go back to the pool in one batch under its
 *     lock, after the cache lock is dropped (ready ones to the ready list,
 *     the others as the pool's own cudaFree or stream-ordered frees would).
 *  5. Under free_sync barrier cudaFree'd blocks are not cached (the pool's
 *     barrier trigger does not see them, and a cached one waits for a
 *     barrier nobody issues: measured 40x slower pairs on the GPU, see
 *     ps_tcache_caches_cudafree) and misses of cudaMalloc-style calls are not
 *     refilled; stream-ordered frees and free_sync none are cached (they
 *     come back at once). The test hook ps_tcache_always_engage caches them
 *     anyway, to test the barrier-ticket rule.
 *  6. The pool drains every cache (under its lock) right before it would
 *     grow (so before OOM too), on trim and when a stream is destroyed; a
 *     thread's exit gives its caches back (pthread key destructor); a pool's
 *     destruction orphans the caches (their threads free them). A cache's
 *     memory is held by two references, its thread's and its set's.
 * Guarantees: see thread_cache.h. Cached bytes are exact in
 * ps_tcache_bytes_locked.
 */
#include "thread_cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define BINS 64            /* bins per cache (a power of two) */
#define READY_DEPTH 8      /* ready blocks per bin (refills, released frees) */
#define FREED_DEPTH 16     /* freed blocks waiting for a barrier (or their stream) per bin */
#define REFILL_MAX 8       /* ready blocks one miss may bring into a bin */
#define REFILL_SHARE 64    /* one refill brings at most cap / REFILL_SHARE bytes (16 KiB of a 1 MiB cache):
                              refills of bigger blocks scattered small holes over the pool (replay of
                              the PyTorch transformer log: 1.10x reserved/requested with cap / 8) */
#define SETS_PER_THREAD 16 /* caches one thread keeps (pools it uses at once) */
#define EVICT_MAX 64       /* blocks evicted by one put at most */
/* initial-exec TLS, as the shim's (it is preloaded, never dlopened late) */
#define TC_TLS __thread __attribute__((tls_model("initial-exec")))

typedef struct entry {
    uintptr_t addr;     /* block address */
    ps_stream_t stream; /* the stream it was freed on (PS_STREAM_NONE: cudaFree) */
    uint64_t tag;       /* the ticket counter at the free */
} entry_t;

/* One size's blocks: a stack of ready ones and a ring of freed ones,
 * oldest first, whose tags therefore never decrease: whether any freed
 * block is reusable by everybody is one look at the oldest. */
typedef struct bin {
    size_t size;                  /* size of every block (while the bin holds any) */
    uint32_t ready_count;         /* blocks in ready[] */
    uint32_t freed_head;          /* ring index of the oldest freed block */
    uint32_t freed_count;         /* blocks in freed[] */
    uintptr_t ready[READY_DEPTH]; /* ready blocks, a stack */
    entry_t freed[FREED_DEPTH];   /* freed blocks, a ring */
} bin_t;

typedef struct cache {
    ps_lock_t lock;               /* guards everything below but the list links */
    ps_tcache_t *set;             /* its set (fixed at creation) */
    int orphaned;                 /* 1: the set was destroyed or detached it (atomic access) */
    atomic_int refs;              /* the thread's and the set's references */
    struct cache *next, *prev;    /* the set's list (under the set's list lock) */
    _Atomic uint64_t bytes;       /* bytes cached (written under the lock; read without it by
                                     take, as a hint that the cache is empty) */
    bin_t bins[BINS];             /* the bins */
} cache_t;

struct ps_tcache {
    ps_tcache_hot_t hot;          /* read inline by the pool (first member) */
    size_t cap;                   /* most bytes per cache */
    ps_lock_t *owner_lock;        /* the pool's lock */
    ps_tcache_give_back_fn give_back_locked; /* returns blocks to the pool */
    void *owner;                  /* the pool */
    ps_lock_t list_lock;          /* guards the list of caches */
    cache_t *head;                /* the caches */
    _Atomic uint64_t issued;      /* barrier tickets taken (starts at 1) */
    _Atomic uint64_t done;        /* ticket of the newest completed barrier (starts at 1) */
    struct ps_tcache *next_live;  /* live sets (under sets_lock) */
};

typedef struct thread_caches {
    cache_t *caches[SETS_PER_THREAD]; /* this thread's caches, NULL = free slot */
} thread_caches_t;

static pthread_mutex_t sets_lock = PTHREAD_MUTEX_INITIALIZER; /* guards live_sets */
static ps_tcache_t *live_sets;      /* every set not destroyed yet */
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t thread_key;    /* destructor: thread_exit */
static TC_TLS thread_caches_t *tls_caches; /* this thread's caches */
static TC_TLS cache_t *tls_last;    /* the cache used last (hot path shortcut) */

static void thread_exit(void *arg);
static void atfork_child(void) { pthread_mutex_init(&sets_lock, NULL); }
static void key_init(void)
{
    pthread_key_create(&thread_key, thread_exit);
    pthread_atfork(NULL, NULL, atfork_child);
}

static inline int is_orphaned(cache_t *c) { return __atomic_load_n(&c->orphaned, __ATOMIC_ACQUIRE); }
static inline int is_stream_ordered(ps_stream_t s) { return s != PS_STREAM_NONE && s != PS_STREAM_PER_THREAD; }
static inline bin_t *bin_of(cache_t *c, size_t size)
{
    return &c->bins[(uint32_t)((uint64_t)(size >> 8) * 0x9E3779B97F4A7C15ull >> 58) & (BINS - 1)];
}
static inline uint64_t done_now(ps_tcache_t *set) { return atomic_load_explicit(&set->done, memory_order_acquire); }
/* Refills (blocks of the ready list put in a thread's cache ahead of its
 * next allocations) only while two or more threads use the pool, or a test
 * engaged the set. */
static inline int engaged(ps_tcache_t *set)
{
    return set->hot.always_engaged || atomic_load_explicit(&set->hot.threads, memory_order_relaxed) > 1;
}

static void cache_unref(cache_t *c)
{
    if (atomic_fetch_sub(&c->refs, 1) == 1)
        free(c);
}

static inline uint64_t bytes_of(cache_t *c) { return atomic_load_explicit(&c->bytes, memory_order_relaxed); }
/* Cache lock held. */
static inline void bytes_add(cache_t *c, int64_t delta)
{
    atomic_store_explicit(&c->bytes, bytes_of(c) + (uint64_t)delta, memory_order_relaxed);
}

/* ---- finding the calling thread's cache ------------------------------- */

static cache_t *cache_new(ps_tcache_t *set)
{
    cache_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->lock = (ps_lock_t)PS_LOCK_INIT;
    c->set = set;
    atomic_init(&c->refs, 2);
    atomic_fetch_add(&set->hot.threads, 1);
    ps_lock(&set->list_lock);
    c->next = set->head;
    if (set->head)
        set->head->prev = c;
    set->head = c;
    ps_unlock(&set->list_lock);
    return c;
}

static cache_t *cache_lookup_slow(ps_tcache_t *set, int create)
{
    thread_caches_t *t = tls_caches;
    if (!t) {
        if (!create)
            return NULL;
        pthread_once(&key_once, key_init);
        t = calloc(1, sizeof *t);
        if (!t)
            return NULL;
        if (pthread_setspecific(thread_key, t) != 0) {
            free(t);
            return NULL;
        }
        tls_caches = t;
    }
    int free_slot = -1;
    for (int i = 0; i < SETS_PER_THREAD; i++) {
        cache_t *c = t->caches[i];
        if (c && is_orphaned(c)) { /* its pool is gone */
            t->caches[i] = NULL;
            if (tls_last == c)
                tls_last = NULL;
            cache_unref(c);
            c = NULL;
        }
        if (!c) {
            if (free_slot < 0)
                free_slot = i;
            continue;
        }
        if (c->set == set)
            return tls_last = c;
    }
    if (!create || free_slot < 0)
        return NULL;
    cache_t *c = cache_new(set);
    if (!c)
        return NULL;
    t->caches[free_slot] = c;
    return tls_last = c;
}

static inline cache_t *cache_of(ps_tcache_t *set, int create)
{
    cache_t *c = tls_last;
    if (__builtin_expect(c && c->set == set && !is_orphaned(c), 1))
        return c;
    return cache_lookup_slow(set, create);
}

/* ---- entries ------------------------------------------------------------ */

static inline uint32_t bin_blocks(const bin_t *b) { return b->ready_count + b->freed_count; }
static inline entry_t *freed_at(bin_t *b, uint32_t i) { return &b->freed[(b->freed_head + i) % FREED_DEPTH]; }

/* Cache lock held: the oldest freed block leaves the ring. */
static inline entry_t freed_pop_oldest(cache_t *c, bin_t *b)
{
    entry_t e = b->freed[b->freed_head];
    b->freed_head = (b->freed_head + 1) % FREED_DEPTH;
    b->freed_count--;
    bytes_add(c, -(int64_t)b->size);
    return e;
}

/* Cache lock held: moves up to `n` blocks of b into out[]: freed ones
 * oldest first, then ready ones. */
static size_t bin_evict(cache_t *c, bin_t *b, uint32_t n, uint64_t done, ps_tcache_block_t *out)
{
    size_t k = 0;
    while (k < n && b->freed_count) {
        entry_t e = freed_pop_oldest(c, b);
        out[k++] = (ps_tcache_block_t){e.addr, b->size, e.stream, e.tag < done};
    }
    while (k < n && b->ready_count) {
        out[k++] = (ps_tcache_block_t){b->ready[--b->ready_count], b->size, PS_STREAM_NONE, 1};
        bytes_add(c, -(int64_t)b->size);
    }
    return k;
}

/* Cache lock held: moves the `n` oldest ready blocks of b into out[]. */
static size_t bin_evict_ready(cache_t *c, bin_t *b, uint32_t n, ps_tcache_block_t *out)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = (ps_tcache_block_t){b->ready[i], b->size, PS_STREAM_NONE, 1};
    b->ready_count -= n;
    memmove(b->ready, b->ready + n, b->ready_count * sizeof b->ready[0]);
    bytes_add(c, -(int64_t)((uint64_t)n * b->size));
    return n;
}

int ps_tcache_take(ps_tcache_t *set, size_t size, ps_stream_t stream, void **out)
{
    if (size > set->hot.max_block)
        return 0;
    cache_t *c = cache_of(set, 0);
    if (!c || !bytes_of(c))
        return 0; /* (a drain may empty it meanwhile: the check under the lock decides) */
    int hit = 1;
    ps_lock(&c->lock);
    bin_t *b = bin_of(c, size);
    if (!bin_blocks(b) || b->size != size) {
        hit = 0;
    } else if (is_stream_ordered(stream) && b->freed_count &&
               freed_at(b, b->freed_count - 1)->stream == stream) {
        *out = (void *)freed_at(b, b->freed_count - 1)->addr; /* s reuses its own newest free */
        b->freed_count--;
        bytes_add(c, -(int64_t)size);
    } else if (b->ready_count) {
        *out = (void *)b->ready[--b->ready_count];
        bytes_add(c, -(int64_t)size);
    } else if (b->freed_count && b->freed[b->freed_head].tag < done_now(set)) {
        *out = (void *)freed_pop_oldest(c, b).addr; /* a barrier was issued after its free */
    } else {
        hit = 0;
    }
    ps_unlock(&c->lock);
    return hit;
}

static int put_in(ps_tcache_t *set, cache_t *c, void *ptr, size_t size, ps_stream_t stream);

int ps_tcache_put(ps_tcache_t *set, void *ptr, size_t size, ps_stream_t stream)
{
    if (size > set->hot.max_block)
        return PS_TCACHE_DECLINED;
    cache_t *c = cache_of(set, 1); /* (also counts this thread as one using the pool) */
    if (!c || (!is_stream_ordered(stream) && !ps_tcache_caches_cudafree(set)))
        return PS_TCACHE_DECLINED; /* under the barrier a cudaFree'd block waits in the pool */
    return put_in(set, c, ptr, size, stream);
}

/* The body of put (kept out of line: the declining path above stays cheap). */
static __attribute__((noinline)) int put_in(ps_tcache_t *set, cache_t *c, void *ptr, size_t size,
                                            ps_stream_t stream)
{
    ps_tcache_block_t evicted[EVICT_MAX];
    size_t n = 0;
    int status = PS_OK;
    uintptr_t addr = (uintptr_t)ptr;
    ps_lock(&c->lock);
    bin_t *b = bin_of(c, size);
    uint64_t done = done_now(set);
    if (bin_blocks(b) && b->size != size) {
        n += bin_evict(c, b, bin_blocks(b), done, evicted + n); /* the bin changes size */
    } else if ((b->ready_count && b->ready[b->ready_count - 1] == addr) ||
               (b->freed_count && freed_at(b, b->freed_count - 1)->addr == addr)) {
        goto double_free; /* the block freed last, freed again (the shim's registry catches the rest) */
    }
    /* released freed blocks move to the ready stack while it has room */
    while (b->freed_count && b->ready_count < READY_DEPTH && b->freed[b->freed_head].tag < done) {
        b->ready[b->ready_count++] = freed_pop_oldest(c, b).addr;
        bytes_add(c, (int64_t)size); /* (freed_pop_oldest subtracted it) */
    }
    int ready_at_once = set->hot.immediate && !is_stream_ordered(stream); /* free_sync none, a cudaFree */
    if (ready_at_once && b->ready_count == READY_DEPTH)
        n += bin_evict_ready(c, b, READY_DEPTH / 2, evicted + n);
    else if (!ready_at_once && b->freed_count == FREED_DEPTH)
        n += bin_evict(c, b, FREED_DEPTH / 2, done, evicted + n);
    /* the byte cap: evict from other bins, from the next one on */
    for (uint32_t k = 1; bytes_of(c) + size > set->cap && k < BINS && n < EVICT_MAX; k++) {
        bin_t *o = &c->bins[((uint32_t)(b - c->bins) + k) & (BINS - 1)];
        while (bin_blocks(o) && bytes_of(c) + size > set->cap && n < EVICT_MAX)
            n += bin_evict(c, o, 1, done, evicted + n);
    }
    if (bytes_of(c) + size > set->cap) {
        status = PS_TCACHE_DECLINED;
    } else {
        b->size = size;
        if (ready_at_once)
            b->ready[b->ready_count++] = addr;
        else
            *freed_at(b, b->freed_count++) = (entry_t){addr, stream, atomic_load(&set->issued)};
        bytes_add(c, (int64_t)size);
    }
    ps_unlock(&c->lock);
    if (n) {
        ps_lock(set->owner_lock);
        set->give_back_locked(set->owner, evicted, n);
        ps_unlock(set->owner_lock);
    }
    return status;
double_free:
    ps_unlock(&c->lock);
    return PS_EINVAL;
}

size_t ps_tcache_max_block(const ps_tcache_t *set) { return set->hot.max_block; }
void ps_tcache_register_thread(ps_tcache_t *set) { cache_of(set, 1); }

/* ---- refills (owner's lock held) -----------------------------------------
 * Only the calling thread touches its own cache outside the owner's lock
 * (drains, queries and thread exits of other threads take the owner's
 * lock first), so under the owner's lock its bins are read and written
 * without the cache lock. */

size_t ps_tcache_refill_room_locked(ps_tcache_t *set, size_t size)
{
    if (size > set->hot.max_block)
        return 0;
    cache_t *c = cache_of(set, 1); /* (also counts this thread as one using the pool) */
    if (!c || is_orphaned(c) || !engaged(set))
        return 0;
    bin_t *b = bin_of(c, size);
    if (bin_blocks(b) && b->size != size)
        return 0;
    size_t room = READY_DEPTH - b->ready_count;
    size_t budget = set->cap / REFILL_SHARE / size;
    uint64_t bytes = bytes_of(c);
    size_t left = bytes < set->cap ? (set->cap - bytes) / size : 0;
    if (room > REFILL_MAX)
        room = REFILL_MAX;
    if (room > budget)
        room = budget;
    return room < left ? room : left;
}

void ps_tcache_refill_locked(ps_tcache_t *set, size_t size, const uintptr_t *addrs, size_t count)
{
    cache_t *c = cache_of(set, 1);
    ps_lock(&c->lock); /* (uncontended; keeps the rule "bins change under the cache lock" simple) */
    bin_t *b = bin_of(c, size);
    b->size = size;
    for (size_t i = 0; i < count; i++)
        b->ready[b->ready_count++] = addrs[i];
    bytes_add(c, (int64_t)(size * count));
    ps_unlock(&c->lock);
}

/* ---- draining (owner's lock held) ----------------------------------------- */

/* Owner's lock and c's lock held: gives every entry of c back. */
static size_t cache_give_back_all_locked(ps_tcache_t *set, cache_t *c)
{
    size_t total = 0;
    uint64_t done = done_now(set);
    ps_tcache_block_t blocks[READY_DEPTH + FREED_DEPTH];
    for (uint32_t i = 0; i < BINS; i++) {
        bin_t *b = &c->bins[i];
        if (!bin_blocks(b))
            continue;
        size_t n = bin_evict(c, b, bin_blocks(b), done, blocks);
        set->give_back_locked(set->owner, blocks, n);
        total += n;
    }
    return total;
}

size_t ps_tcache_drain_all_locked(ps_tcache_t *set)
{
    size_t total = 0;
    ps_lock(&set->list_lock);
    for (cache_t *c = set->head; c; c = c->next) {
        ps_lock(&c->lock);
        if (bytes_of(c))
            total += cache_give_back_all_locked(set, c);
        ps_unlock(&c->lock);
    }
    ps_unlock(&set->list_lock);
    return total;
}

void ps_tcache_bytes_locked(ps_tcache_t *set, uint64_t *ready, uint64_t *pending)
{
    uint64_t r = 0, p = 0;
    uint64_t done = done_now(set);
    ps_lock(&set->list_lock);
    for (cache_t *c = set->head; c; c = c->next) {
        ps_lock(&c->lock);
        for (uint32_t i = 0; i < BINS; i++) {
            bin_t *b = &c->bins[i];
            r += (uint64_t)b->ready_count * b->size;
            for (uint32_t j = 0; j < b->freed_count; j++) {
                if (freed_at(b, j)->tag < done)
                    r += b->size;
                else
                    p += b->size;
            }
        }
        ps_unlock(&c->lock);
    }
    ps_unlock(&set->list_lock);
    *ready = r;
    *pending = p;
}

uint64_t ps_tcache_barrier_begin(ps_tcache_t *set)
{
    return atomic_fetch_add(&set->issued, 1) + 1;
}

void ps_tcache_barrier_done(ps_tcache_t *set, uint64_t ticket)
{
    if (ticket > atomic_load_explicit(&set->done, memory_order_relaxed))
        atomic_store_explicit(&set->done, ticket, memory_order_release);
}

/* ---- life ------------------------------------------------------------------ */

int ps_tcache_create(size_t cap_bytes, int immediate, ps_lock_t *owner_lock,
                     ps_tcache_give_back_fn give_back_locked, void *owner, ps_tcache_t **out)
{
    if (!cap_bytes || !owner_lock || !give_back_locked || !out)
        return PS_EINVAL;
    pthread_once(&key_once, key_init);
    ps_tcache_t *set = calloc(1, sizeof *set);
    if (!set)
        return PS_ENOMEM;
    set->cap = cap_bytes;
    set->hot.max_block = cap_bytes / 4;
    set->hot.immediate = immediate;
    set->owner_lock = owner_lock;
    set->give_back_locked = give_back_locked;
    set->owner = owner;
    set->list_lock = (ps_lock_t)PS_LOCK_INIT;
    atomic_init(&set->issued, 1);
    atomic_init(&set->done, 1);
    pthread_mutex_lock(&sets_lock);
    set->next_live = live_sets;
    live_sets = set;
    pthread_mutex_unlock(&sets_lock);
    *out = set;
    return PS_OK;
}

void ps_tcache_destroy(ps_tcache_t *set)
{
    if (!set)
        return;
    pthread_mutex_lock(&sets_lock);
    for (ps_tcache_t **p = &live_sets; *p; p = &(*p)->next_live)
        if (*p == set) {
            *p = set->next_live;
            break;
        }
    pthread_mutex_unlock(&sets_lock);
    ps_lock(&set->list_lock);
    cache_t *c = set->head;
    set->head = NULL;
    ps_unlock(&set->list_lock);
    while (c) {
        cache_t *next = c->next;
        ps_lock(&c->lock);
        __atomic_store_n(&c->orphaned, 1, __ATOMIC_RELEASE);
        ps_unlock(&c->lock);
        cache_unref(c);
        c = next;
    }
    free(set);
}

/* The thread is ending: each of its caches goes back to its pool (when
 * that pool still lives) and is detached from its set. */
static void thread_exit(void *arg)
{
    thread_caches_t *t = arg;
    if (!t)
        return;
    for (int i = 0; i < SETS_PER_THREAD; i++) {
        cache_t *c = t->caches[i];
        if (!c)
            continue;
        t->caches[i] = NULL;
        pthread_mutex_lock(&sets_lock);
        ps_tcache_t *set = live_sets;
        while (set && set != c->set)
            set = set->next_live;
        if (set && !is_orphaned(c)) {
            ps_lock(set->owner_lock);
            ps_lock(&set->list_lock);
            ps_lock(&c->lock);
            cache_give_back_all_locked(set, c);
            if (c->prev)
                c->prev->next = c->next;
            else
                set->head = c->next;
            if (c->next)
                c->next->prev = c->prev;
            __atomic_store_n(&c->orphaned, 1, __ATOMIC_RELEASE);
            atomic_fetch_sub(&set->hot.threads, 1);
            ps_unlock(&c->lock);
            ps_unlock(&set->list_lock);
            ps_unlock(set->owner_lock);
            cache_unref(c); /* the set's reference */
        }
        pthread_mutex_unlock(&sets_lock);
        cache_unref(c); /* the thread's */
    }
    free(t);
    if (tls_caches == t) {
        tls_caches = NULL;
        tls_last = NULL;
    }
}

void ps_tcache_always_engage(ps_tcache_t *set) { set->hot.always_engaged = 1; }

void ps_tcache_thread_exit(void)
{
    thread_caches_t *t = tls_caches;
    if (!t)
        return;
    pthread_setspecific(thread_key, NULL);
    thread_exit(t);
}
