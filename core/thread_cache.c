/* Per-thread caches of freed blocks in front of a pool (core/thread_cache.h),
 * in the style of tcmalloc's and mimalloc's thread caches: the common
 * allocate/free of a thread touches only its own cache, so threads do not
 * serialize on the pool's lock.
 *
 * Algorithm
 *  1. A *set* belongs to one pool. Each thread that frees to (or refills
 *     from) the pool gets a *cache* in the set: BINS bins chosen by a hash
 *     of the block size, each holding up to BIN_DEPTH blocks of exactly one
 *     size (oldest first), at most cap_bytes in all; blocks above
 *     cap_bytes / 4 are never cached. The cache has its own spinlock, taken
 *     by its thread on every operation (uncontended: other threads take it
 *     only to drain it, rarely), and the set keeps the list of its caches.
 *  2. Every entry carries a *tag*: 0 = ready for anything (a refill from
 *     the pool's ready list, or any free under free_sync none), else the
 *     set's barrier ticket counter read (sequentially consistent) at the
 *     free. The pool takes a ticket (counter + 1) before a barrier's first
 *     CUDA call and publishes it as `done` (release) after the barrier
 *     succeeded. An entry with tag t < done was freed before the increment
 *     that produced a completed barrier's ticket, so that barrier was
 *     issued after the free: all GPU work issued later runs after all work
 *     issued before the free (DESIGN.md, "Reuse after cudaFree: the
 *     barrier"). A refused barrier (stream capture) never publishes, so
 *     nothing depends on it.
 *  3. take(size, stream): in the bin of `size`, the newest entry usable by
 *     the request: tag < done, or freed on the same (stream-ordered)
 *     stream s by this thread (the RMM rule: reuse on s is ordered by s).
 *     Miss: the pool serves it under its lock and may refill this bin with
 *     a few ready blocks of the same size taken at the same time (one lock
 *     for several allocations).
 *  4. put(ptr, size, stream): appended to its bin. A full bin, a bin of
 *     another size, or the byte cap evicts the oldest entries; they go back
 *     to the pool in one batch under its lock, after the cache lock is
 *     dropped (ready ones to the ready list, the others as the pool's own
 *     cudaFree or stream-ordered frees would).
 *  5. The pool drains every cache (under its lock) before it grows, on its
 *     OOM path, on trim and when a stream is destroyed; a thread's exit
 *     gives its caches back (pthread key destructor); a pool's destruction
 *     orphans the caches (their threads free them). A cache's memory is
 *     held by two references, its thread's and its set's.
 * Guarantees: see thread_cache.h. Cached bytes are exact in
 * ps_tcache_bytes_locked; ps_tcache_pending_estimate is an upper bound
 * good enough to trigger barriers.
 */
#include "thread_cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define BINS 64            /* bins per cache (a power of two) */
#define BIN_DEPTH 16       /* blocks per bin */
#define REFILL_MAX 8       /* ready blocks one miss may bring into a bin */
#define SETS_PER_THREAD 16 /* caches one thread keeps (pools it uses at once) */
#define EVICT_MAX 64       /* blocks evicted by one put at most */
#define TAG_READY 0        /* an entry reusable by anything */
/* initial-exec TLS, as the shim's (it is preloaded, never dlopened late) */
#define TC_TLS __thread __attribute__((tls_model("initial-exec")))

typedef struct entry {
    uintptr_t addr;     /* block address */
    ps_stream_t stream; /* the stream it was freed on (PS_STREAM_NONE: cudaFree) */
    uint64_t tag;       /* TAG_READY or the ticket counter at the free */
} entry_t;

typedef struct bin {
    size_t size;            /* size of every entry (meaningful while count > 0) */
    uint32_t count;         /* entries used, oldest first */
    entry_t e[BIN_DEPTH];   /* the entries */
} bin_t;

typedef struct cache {
    ps_lock_t lock;               /* guards everything below but the list links */
    ps_tcache_t *set;             /* its set (fixed at creation) */
    int orphaned;                 /* 1: the set was destroyed or detached it (atomic access) */
    atomic_int refs;              /* the thread's and the set's references */
    struct cache *next, *prev;    /* the set's list (under the set's list lock) */
    uint64_t bytes;               /* bytes cached */
    _Atomic uint64_t pending_bytes; /* bytes of tagged entries, an estimate (see pending_estimate) */
    _Atomic uint64_t newest_tag;  /* tag of the newest tagged put */
    bin_t bins[BINS];             /* the bins */
} cache_t;

struct ps_tcache {
    size_t cap;                   /* most bytes per cache */
    size_t max_block;             /* largest block cached */
    int immediate;                /* 1: every free is ready at once (free_sync none) */
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

static void cache_unref(cache_t *c)
{
    if (atomic_fetch_sub(&c->refs, 1) == 1)
        free(c);
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

/* Cache lock held: removes entry i of bin b. */
static inline void bin_remove(cache_t *c, bin_t *b, uint32_t i)
{
    uint64_t tag = b->e[i].tag;
    b->count--;
    if (i < b->count)
        memmove(&b->e[i], &b->e[i + 1], (b->count - i) * sizeof b->e[0]);
    c->bytes -= b->size;
    if (tag != TAG_READY) {
        uint64_t p = atomic_load_explicit(&c->pending_bytes, memory_order_relaxed);
        atomic_store_explicit(&c->pending_bytes, p > b->size ? p - b->size : 0, memory_order_relaxed);
    }
}

/* Cache lock held: moves the oldest `n` entries of b into out[]. */
static size_t bin_evict(cache_t *c, bin_t *b, uint32_t n, uint64_t done, ps_tcache_block_t *out)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = (ps_tcache_block_t){b->e[i].addr, b->size, b->e[i].stream, b->e[i].tag < done};
    for (uint32_t i = 0; i < n; i++)
        bin_remove(c, b, 0);
    return n;
}

int ps_tcache_take(ps_tcache_t *set, size_t size, ps_stream_t stream, void **out)
{
    cache_t *c = cache_of(set, 0);
    if (!c)
        return 0;
    ps_lock(&c->lock);
    bin_t *b = bin_of(c, size);
    if (b->count && b->size == size) {
        uint64_t done = done_now(set);
        int ordered = is_stream_ordered(stream);
        for (uint32_t i = b->count; i-- > 0;) {
            entry_t *e = &b->e[i];
            if (e->tag < done || (ordered && e->stream == stream)) {
                *out = (void *)e->addr;
                bin_remove(c, b, i);
                ps_unlock(&c->lock);
                return 1;
            }
        }
    }
    ps_unlock(&c->lock);
    return 0;
}

int ps_tcache_put(ps_tcache_t *set, void *ptr, size_t size, ps_stream_t stream)
{
    if (size > set->max_block)
        return PS_TCACHE_DECLINED;
    cache_t *c = cache_of(set, 1);
    if (!c)
        return PS_TCACHE_DECLINED;
    ps_tcache_block_t evicted[EVICT_MAX];
    size_t n = 0;
    int status = PS_OK;
    ps_lock(&c->lock);
    bin_t *b = bin_of(c, size);
    uint64_t done = done_now(set);
    if (b->count && b->size != size) {
        n += bin_evict(c, b, b->count, done, evicted + n); /* the bin changes size */
    } else {
        for (uint32_t i = 0; i < b->count; i++)
            if (b->e[i].addr == (uintptr_t)ptr) {
                ps_unlock(&c->lock);
                return PS_EINVAL;
            }
        if (b->count == BIN_DEPTH)
            n += bin_evict(c, b, BIN_DEPTH / 2, done, evicted + n);
    }
    /* the byte cap: evict the oldest entries of other bins, from the next one on */
    for (uint32_t k = 1; c->bytes + size > set->cap && k < BINS; k++) {
        bin_t *o = &c->bins[((uint32_t)(b - c->bins) + k) & (BINS - 1)];
        while (o->count && c->bytes + size > set->cap && n < EVICT_MAX)
            n += bin_evict(c, o, 1, done, evicted + n);
    }
    if (c->bytes + size > set->cap) {
        status = PS_TCACHE_DECLINED;
    } else {
        uint64_t tag = set->immediate ? TAG_READY : atomic_load(&set->issued);
        b->size = size;
        b->e[b->count++] = (entry_t){(uintptr_t)ptr, stream, tag};
        c->bytes += size;
        if (tag != TAG_READY) {
            uint64_t p = atomic_load_explicit(&c->pending_bytes, memory_order_relaxed);
            if (atomic_load_explicit(&c->newest_tag, memory_order_relaxed) < done)
                p = 0; /* every older tagged entry is ready now */
            atomic_store_explicit(&c->pending_bytes, p + size, memory_order_relaxed);
            atomic_store_explicit(&c->newest_tag, tag, memory_order_relaxed);
        }
    }
    ps_unlock(&c->lock);
    if (n) {
        ps_lock(set->owner_lock);
        set->give_back_locked(set->owner, evicted, n);
        ps_unlock(set->owner_lock);
    }
    return status;
}

/* ---- refills (owner's lock held) ----------------------------------------- */

size_t ps_tcache_refill_room_locked(ps_tcache_t *set, size_t size)
{
    if (size > set->max_block)
        return 0;
    cache_t *c = cache_of(set, 1);
    if (!c)
        return 0;
    size_t room = 0;
    ps_lock(&c->lock);
    bin_t *b = bin_of(c, size);
    if (!b->count || b->size == size) {
        room = BIN_DEPTH / 2 > b->count ? BIN_DEPTH / 2 - b->count : 0; /* leave room for frees */
        if (room > REFILL_MAX)
            room = REFILL_MAX;
        size_t budget = set->cap / 8 / size; /* refills stay a small part of the cap */
        size_t left = c->bytes < set->cap ? (set->cap - c->bytes) / size : 0;
        if (room > budget)
            room = budget;
        if (room > left)
            room = left;
    }
    ps_unlock(&c->lock);
    return room;
}

void ps_tcache_refill_locked(ps_tcache_t *set, size_t size, const uintptr_t *addrs, size_t count)
{
    cache_t *c = cache_of(set, 1);
    ps_lock(&c->lock);
    bin_t *b = bin_of(c, size);
    b->size = size;
    for (size_t i = 0; i < count; i++)
        b->e[b->count++] = (entry_t){addrs[i], PS_STREAM_NONE, TAG_READY};
    c->bytes += size * count;
    ps_unlock(&c->lock);
}

/* ---- draining (owner's lock held) ----------------------------------------- */

/* Owner's lock and c's lock held: gives every entry of c back. */
static size_t cache_give_back_all_locked(ps_tcache_t *set, cache_t *c)
{
    size_t total = 0;
    uint64_t done = done_now(set);
    ps_tcache_block_t blocks[BIN_DEPTH];
    for (uint32_t i = 0; i < BINS; i++) {
        bin_t *b = &c->bins[i];
        if (!b->count)
            continue;
        size_t n = bin_evict(c, b, b->count, done, blocks);
        set->give_back_locked(set->owner, blocks, n);
        total += n;
    }
    atomic_store_explicit(&c->pending_bytes, 0, memory_order_relaxed);
    return total;
}

size_t ps_tcache_drain_all_locked(ps_tcache_t *set)
{
    size_t total = 0;
    ps_lock(&set->list_lock);
    for (cache_t *c = set->head; c; c = c->next) {
        ps_lock(&c->lock);
        if (c->bytes)
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
        for (uint32_t i = 0; i < BINS; i++)
            for (uint32_t j = 0; j < c->bins[i].count; j++) {
                if (c->bins[i].e[j].tag < done)
                    r += c->bins[i].size;
                else
                    p += c->bins[i].size;
            }
        ps_unlock(&c->lock);
    }
    ps_unlock(&set->list_lock);
    *ready = r;
    *pending = p;
}

uint64_t ps_tcache_pending_estimate(ps_tcache_t *set)
{
    uint64_t total = 0;
    uint64_t done = done_now(set);
    ps_lock(&set->list_lock);
    for (cache_t *c = set->head; c; c = c->next)
        if (atomic_load_explicit(&c->newest_tag, memory_order_relaxed) >= done)
            total += atomic_load_explicit(&c->pending_bytes, memory_order_relaxed);
    ps_unlock(&set->list_lock);
    return total;
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
    set->max_block = cap_bytes / 4;
    set->immediate = immediate;
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

void ps_tcache_thread_exit(void)
{
    thread_caches_t *t = tls_caches;
    if (!t)
        return;
    pthread_setspecific(thread_key, NULL);
    thread_exit(t);
}
