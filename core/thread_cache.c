/* Per-thread caches of freed blocks in front of a pool (core/thread_cache.h),
 * as tcmalloc's and mimalloc's: a thread's common allocate/free touches only
 * its own cache, so threads do not serialize on the pool's lock. Algorithm:
 *  1. A *set* belongs to one pool; each thread that frees to (or refills
 *     from) the pool gets a *cache* in it: BINS bins hashed by block size, a
 *     bin holding one size (a stack of up to READY_DEPTH ready blocks and a
 *     list of freed ones, oldest first, from a table of ENTRIES); at most
 *     cap_bytes, blocks above cap_bytes / 4 never cached. Its spinlock is
 *     taken by its thread on every call, by others only to drain it.
 *  2. A freed block carries a *tag*: its pool's reuse family stamp at the
 *     free (core/reuse.h). Once the family issued a barrier numbered above
 *     the tag, all later GPU work runs after the free (docs/design.md,
 *     "Reuse after cudaFree: the barrier"); the pool's barriers and the
 *     caches' count alike. Tags never decrease along a bin's list.
 *  3. take(size, stream): the newest freed block if this thread freed it on
 *     the same stream (reuse on s is ordered by s); else a ready block; else
 *     the oldest freed block if a barrier covers it. When that one still
 *     waits, the cache asks for a barrier (barrier_fn, no pool lock: threads
 *     asking at once share one) if it holds BARRIER_AFTER frees since the
 *     newest barrier it saw (BARRIER_AFTER_FULL when 3/4 full), or the pool
 *     had fewer ready bytes than the request at its last unlock
 *     (ps_tcache_note_owner_ready; under its barrier floor the pool reports
 *     no shortage: it would grow). Miss: the pool serves it under its lock
 *     and may refill the bin with a few ready blocks of that size.
 *  4. put(ptr, size, stream): onto its bin's freed list (free_sync none: its
 *     stack). No free entry, a bin of another size, or the byte cap evicts
 *     the oldest blocks, given back in one batch under the pool's lock after
 *     the cache lock is dropped, as the pool's own frees would place them.
 *  5. Cached: stream-ordered frees always; cudaFree'd blocks up to
 *     PS_TCACHE_SMALL, bigger ones once the pool saw its lock contended
 *     (ps_tcache_cache_cudafree). Refills only while two or more threads
 *     use the pool.
 *  6. Before the pool would grow, a cache of the calling thread holding
 *     freed blocks of the size asked serves after a barrier
 *     (ps_tcache_holds_freed, ps_tcache_take_owner_locked); otherwise every
 *     cache is drained (also on trim and when a stream is destroyed). A
 *     thread's exit gives its caches back; a pool's destruction orphans them.
 * Memory: at most cap_bytes per thread. Guarantees: thread_cache.h.
 */
#include "thread_cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define BINS 64            /* bins per cache (a power of two) */
#define READY_DEPTH 8      /* ready blocks per bin (refills, free_sync none) */
#define ENTRIES 1024       /* freed blocks one cache keeps, in all its bins (< NONE) */
#define BARRIER_AFTER 512  /* frees since the last barrier after which a waiting miss asks for one */
#define BARRIER_AFTER_FULL 16 /* ... or this many once the cache is 3/4 full (else its next puts push
                                 waiting blocks to the pool, and its takes miss until the pool's barrier) */
#define REFILL_MAX 8       /* ready blocks one miss may bring into a bin */
#define REFILL_BYTES (16 * 1024) /* one refill brings at most this many bytes: refills of bigger
                                     blocks scattered small holes over the pool (replay of the
                                     PyTorch transformer log: 1.10x reserved/requested with 128 KiB) */
#define SETS_PER_THREAD 16 /* caches one thread keeps (pools it uses at once) */
#define EVICT_MAX 64       /* blocks evicted by one put at most */
#define NONE 0xFFFFu       /* no entry */
/* initial-exec TLS, as the shim's (it is preloaded, never dlopened late) */
#define TC_TLS __thread __attribute__((tls_model("initial-exec")))

typedef struct entry {
    uintptr_t addr;     /* block address */
    ps_stream_t stream; /* the stream it was freed on (PS_STREAM_NONE: cudaFree) */
    uint64_t tag;       /* the family's stamp at the free (ps_reuse_family_stamp) */
    uint16_t newer;     /* the next newer entry of its bin (NONE: the newest); unused entries: the next unused */
    uint16_t older;     /* the next older entry of its bin (NONE: the oldest) */
} entry_t;

/* One size's blocks: a stack of ready ones and a list of freed ones,
 * oldest first, whose tags therefore never decrease: whether any freed
 * block is reusable by everybody is one look at the oldest. */
typedef struct bin {
    size_t size;                  /* size of every block (while the bin holds any) */
    uint32_t ready_count;         /* blocks in ready[] */
    uint32_t freed_count;         /* blocks in the freed list */
    uint16_t oldest, newest;      /* ends of the freed list (NONE when empty) */
    uintptr_t ready[READY_DEPTH]; /* ready blocks, a stack */
} bin_t;

typedef struct cache {
    ps_spin_t lock;               /* guards everything below but the list links (its thread takes it on every operation) */
    ps_tcache_t *set;             /* its set (fixed at creation) */
    int orphaned;                 /* 1: the set was destroyed or detached it (atomic access) */
    atomic_int refs;              /* the thread's and the set's references */
    struct cache *next, *prev;    /* the set's list (under the set's list lock) */
    _Atomic uint64_t bytes;       /* bytes cached (written under the lock; read without it by
                                     take, as a hint that the cache is empty) */
    uint64_t seen_issued;         /* the family's newest barrier when the count below restarted */
    uint32_t frees_since;         /* freed blocks put since then (the barrier request trigger) */
    uint64_t hits, misses;        /* takes served / not served (statistics) */
    uint16_t unused;              /* first unused entry (NONE: all in use) */
    bin_t bins[BINS];             /* the bins */
    entry_t entries[ENTRIES];     /* freed blocks of every bin, and the unused ones */
} cache_t;

struct ps_tcache {
    ps_tcache_hot_t hot;          /* read inline by the pool (first member) */
    size_t cap;                   /* most bytes per cache */
    ps_lock_t *owner_lock;        /* the pool's lock */
    ps_tcache_give_back_fn give_back_locked; /* returns blocks to the pool */
    ps_tcache_barrier_fn barrier; /* asks the pool for a barrier (NULL: immediate sets) */
    void *owner;                  /* the pool */
    ps_lock_t list_lock;          /* guards the list of caches */
    cache_t *head;                /* the caches */
    ps_reuse_family_t *family;    /* the owner's barrier numbers (tags, coverage) */
    _Alignas(64) _Atomic uint64_t requested; /* barriers the caches asked for (statistics; its own
                                     line: the fields above are read by every take and put) */
    uint64_t gone_hits, gone_misses; /* counts of caches that left (under list_lock) */
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
static inline bin_t *bin_of(cache_t *c, size_t size)
{
    return &c->bins[(uint32_t)((uint64_t)(size >> 8) * 0x9E3779B97F4A7C15ull >> 58) & (BINS - 1)];
}
static inline uint64_t issued_now(ps_tcache_t *set)
{
    return atomic_load_explicit(&set->family->issued, memory_order_acquire);
}
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

/* Whether cache_of makes this thread's cache when it has none. */
enum { FIND_CACHE = 0, CREATE_CACHE = 1 };

static cache_t *cache_new(ps_tcache_t *set)
{
    cache_t *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    memset(c, 0, offsetof(cache_t, entries));
    for (uint32_t i = 0; i < BINS; i++)
        c->bins[i].oldest = c->bins[i].newest = NONE;
    for (uint32_t i = 0; i < ENTRIES; i++)
        c->entries[i].newer = (uint16_t)(i + 1 < ENTRIES ? i + 1 : NONE);
    c->unused = 0;
    c->lock = (ps_spin_t)PS_SPIN_INIT;
    c->set = set;
    c->seen_issued = issued_now(set);
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

/* ---- the freed lists (cache lock held) ---------------------------------- */

static inline uint32_t bin_blocks(const bin_t *b) { return b->ready_count + b->freed_count; }
static inline entry_t *oldest_of(cache_t *c, const bin_t *b) { return &c->entries[b->oldest]; }
static inline entry_t *newest_of(cache_t *c, const bin_t *b) { return &c->entries[b->newest]; }

/* Appends a freed block as the newest of b; an unused entry must exist. */
static inline void freed_push(cache_t *c, bin_t *b, uintptr_t addr, ps_stream_t stream, uint64_t tag)
{
    uint16_t i = c->unused;
    entry_t *e = &c->entries[i];
    c->unused = e->newer;
    *e = (entry_t){addr, stream, tag, NONE, b->newest};
    if (b->newest != NONE)
        c->entries[b->newest].newer = i;
    else
        b->oldest = i;
    b->newest = i;
    b->freed_count++;
    bytes_add(c, (int64_t)b->size);
}

/* Unlinks entry i of b and returns it to the unused ones. */
static inline entry_t freed_remove(cache_t *c, bin_t *b, uint16_t i)
{
    entry_t e = c->entries[i];
    if (e.older != NONE)
        c->entries[e.older].newer = e.newer;
    else
        b->oldest = e.newer;
    if (e.newer != NONE)
        c->entries[e.newer].older = e.older;
    else
        b->newest = e.older;
    c->entries[i].newer = c->unused;
    c->unused = i;
    b->freed_count--;
    bytes_add(c, -(int64_t)b->size);
    return e;
}

/* Moves up to `n` blocks of b into out[]: freed ones oldest first, then
 * ready ones. */
static size_t bin_evict(cache_t *c, bin_t *b, uint32_t n, uint64_t issued, ps_tcache_block_t *out)
{
    size_t k = 0;
    while (k < n && b->freed_count) {
        entry_t e = freed_remove(c, b, b->oldest);
        out[k++] = (ps_tcache_block_t){e.addr, b->size, e.stream, issued > e.tag};
    }
    while (k < n && b->ready_count) {
        out[k++] = (ps_tcache_block_t){b->ready[--b->ready_count], b->size, PS_STREAM_NONE, 1};
        bytes_add(c, -(int64_t)b->size);
    }
    return k;
}

/* Moves the `n` oldest ready blocks of b into out[]. */
static size_t bin_evict_ready(cache_t *c, bin_t *b, uint32_t n, ps_tcache_block_t *out)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = (ps_tcache_block_t){b->ready[i], b->size, PS_STREAM_NONE, 1};
    b->ready_count -= n;
    memmove(b->ready, b->ready + n, b->ready_count * sizeof b->ready[0]);
    bytes_add(c, -(int64_t)((uint64_t)n * b->size));
    return n;
}

/* The trigger count restarts once a newer barrier was issued. */
static inline void notice_barriers(cache_t *c, uint64_t issued)
{
    if (c->seen_issued != issued) {
        c->seen_issued = issued;
        c->frees_since = 0;
    }
}

/* ---- take / put (hot path) ---------------------------------------------- */

/* One look in the bin of `size`; *ask (set when nothing was taken): the
 * tag of the oldest freed block when a barrier should be asked for. */
static inline int take_locked(ps_tcache_t *set, cache_t *c, size_t size, ps_stream_t stream, void **out,
                              uint64_t *ask)
{
    bin_t *b = bin_of(c, size);
    if (!bin_blocks(b) || b->size != size)
        return 0;
    if (ps_reuse_stream_ordered(stream) && b->freed_count && newest_of(c, b)->stream == stream) {
        *out = (void *)freed_remove(c, b, b->newest).addr; /* s reuses its own newest free */
        return 1;
    }
    if (b->ready_count) {
        *out = (void *)b->ready[--b->ready_count];
        bytes_add(c, -(int64_t)size);
        return 1;
    }
    if (!b->freed_count)
        return 0;
    uint64_t issued = issued_now(set);
    uint64_t tag = oldest_of(c, b)->tag;
    if (issued > tag) {
        *out = (void *)freed_remove(c, b, b->oldest).addr; /* a barrier was issued after its free */
        return 1;
    }
    notice_barriers(c, issued);
    if (set->barrier && (c->frees_since >= BARRIER_AFTER ||
                         (bytes_of(c) >= set->cap / 4 * 3 && c->frees_since >= BARRIER_AFTER_FULL) ||
                         atomic_load_explicit(&set->hot.owner_ready, memory_order_relaxed) < size)) {
        c->frees_since = 0; /* (granted or refused, the count restarts) */
        *ask = tag + 1;     /* (0 means "no request") */
    }
    return 0;
}

bool ps_tcache_take(ps_tcache_t *set, size_t size, ps_stream_t stream, void **out)
{
    if (size > set->hot.max_block)
        return 0;
    cache_t *c = cache_of(set, FIND_CACHE);
    if (!c || !bytes_of(c))
        return 0; /* (a drain may empty it meanwhile: the check under the lock decides) */
    uint64_t ask = 0;
    ps_spin_lock(&c->lock);
    int hit = take_locked(set, c, size, stream, out, &ask);
    ps_spin_unlock(&c->lock);
    if (!hit && ask) {
        atomic_fetch_add_explicit(&set->requested, 1, memory_order_relaxed);
        if (set->barrier(set->owner, ask - 1)) { /* (the owner's lock: the cache lock is not held) */
            ps_spin_lock(&c->lock);
            hit = take_locked(set, c, size, stream, out, &ask);
            ps_spin_unlock(&c->lock);
        }
    }
    c->hits += (uint64_t)hit; /* (only this thread writes them; readers tolerate a stale value) */
    c->misses += (uint64_t)!hit;
    return hit;
}

int ps_tcache_take_owner_locked(ps_tcache_t *set, size_t size, ps_stream_t stream, void **out)
{
    if (size > set->hot.max_block)
        return 0;
    cache_t *c = cache_of(set, FIND_CACHE);
    if (!c || !bytes_of(c))
        return 0;
    uint64_t ask = 0; /* (never acted on: the caller holds the owner's lock) */
    ps_spin_lock(&c->lock);
    int hit = take_locked(set, c, size, stream, out, &ask);
    ps_spin_unlock(&c->lock);
    c->hits += (uint64_t)hit;
    return hit;
}

bool ps_tcache_holds_freed(ps_tcache_t *set, size_t size)
{
    if (size > set->hot.max_block)
        return 0;
    cache_t *c = cache_of(set, FIND_CACHE);
    if (!c || !bytes_of(c))
        return 0;
    ps_spin_lock(&c->lock);
    bin_t *b = bin_of(c, size);
    int holds = b->size == size && b->freed_count;
    ps_spin_unlock(&c->lock);
    return holds;
}

static int put_in(ps_tcache_t *set, cache_t *c, void *ptr, size_t size, ps_stream_t stream);

int ps_tcache_put(ps_tcache_t *set, void *ptr, size_t size, ps_stream_t stream)
{
    if (size > set->hot.max_block)
        return PS_TCACHE_DECLINED;
    cache_t *c = cache_of(set, CREATE_CACHE); /* (also counts this thread as one using the pool) */
    if (!c || (!ps_reuse_stream_ordered(stream) && !ps_tcache_caches_cudafree(set, size)))
        return PS_TCACHE_DECLINED; /* the pool keeps it (see ps_tcache_caches_cudafree) */
    return put_in(set, c, ptr, size, stream);
}

/* Evicts from the bins after b (then b itself) until `fits` holds or out[]
 * is full; returns the new count in out[]. */
#define EVICT_UNTIL(fits)                                                                       \
    for (uint32_t k = 1; !(fits) && k <= BINS && n < EVICT_MAX; k++) {                           \
        bin_t *o = &c->bins[((uint32_t)(b - c->bins) + k) & (BINS - 1)];                         \
        while (bin_blocks(o) && !(fits) && n < EVICT_MAX)                                        \
            n += bin_evict(c, o, 1, issued, evicted + n);                                        \
    }

/* The body of put (kept out of line: the declining path above stays cheap). */
static __attribute__((noinline)) int put_in(ps_tcache_t *set, cache_t *c, void *ptr, size_t size,
                                            ps_stream_t stream)
{
    ps_tcache_block_t evicted[EVICT_MAX];
    size_t n = 0;
    int status = PS_OK;
    uintptr_t addr = (uintptr_t)ptr;
    ps_spin_lock(&c->lock);
    bin_t *b = bin_of(c, size);
    uint64_t issued = issued_now(set);
    if (bin_blocks(b) && b->size != size) {
        n += bin_evict(c, b, EVICT_MAX, issued, evicted + n); /* the bin changes size */
        if (bin_blocks(b)) {
            status = PS_TCACHE_DECLINED; /* (more than one batch of the old size: the next puts go on) */
            goto out;
        }
    } else if ((b->ready_count && b->ready[b->ready_count - 1] == addr) ||
               (b->freed_count && newest_of(c, b)->addr == addr)) {
        goto double_free; /* the block freed last, freed again (the shim's registry catches the rest) */
    }
    int ready_at_once = set->hot.immediate && !ps_reuse_stream_ordered(stream); /* free_sync none, a cudaFree */
    if (ready_at_once && b->ready_count == READY_DEPTH) {
        n += bin_evict_ready(c, b, READY_DEPTH / 2, evicted + n);
    } else if (!ready_at_once && c->unused == NONE) {
        uint32_t quarter = b->freed_count / 4 + 1; /* the oldest quarter of this bin makes room */
        if (quarter > EVICT_MAX / 2)
            quarter = EVICT_MAX / 2;
        n += bin_evict(c, b, quarter < EVICT_MAX - n ? quarter : (uint32_t)(EVICT_MAX - n), issued, evicted + n);
        EVICT_UNTIL(c->unused != NONE)
    }
    EVICT_UNTIL(bytes_of(c) + size <= set->cap) /* the byte cap */
    if (bytes_of(c) + size > set->cap || (!ready_at_once && c->unused == NONE)) {
        status = PS_TCACHE_DECLINED;
    } else {
        b->size = size;
        if (ready_at_once) {
            b->ready[b->ready_count++] = addr;
            bytes_add(c, (int64_t)size);
        } else {
            freed_push(c, b, addr, stream, ps_reuse_family_stamp(set->family));
            notice_barriers(c, issued);
            c->frees_since++;
        }
    }
out:
    ps_spin_unlock(&c->lock);
    if (n) {
        ps_lock(set->owner_lock);
        set->give_back_locked(set->owner, evicted, n);
        ps_unlock(set->owner_lock);
    }
    return status;
double_free:
    ps_spin_unlock(&c->lock);
    return PS_EINVAL;
}

size_t ps_tcache_max_block(const ps_tcache_t *set) { return set->hot.max_block; }

/* ---- refills (owner's lock held) -----------------------------------------
 * Only the calling thread touches its own cache outside the owner's lock
 * (drains, queries and thread exits of other threads take the owner's
 * lock first), so under the owner's lock its bins are read and written
 * without the cache lock. */

size_t ps_tcache_refill_room_locked(ps_tcache_t *set, size_t size)
{
    if (size > set->hot.max_block || !engaged(set))
        return 0;
    cache_t *c = cache_of(set, CREATE_CACHE);
    if (!c || is_orphaned(c))
        return 0;
    bin_t *b = bin_of(c, size);
    if (bin_blocks(b) && b->size != size)
        return 0;
    size_t room = READY_DEPTH - b->ready_count;
    size_t budget = REFILL_BYTES / size;
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
    cache_t *c = cache_of(set, CREATE_CACHE);
    ps_spin_lock(&c->lock); /* (uncontended; keeps the rule "bins change under the cache lock" simple) */
    bin_t *b = bin_of(c, size);
    b->size = size;
    for (size_t i = 0; i < count; i++)
        b->ready[b->ready_count++] = addrs[i];
    bytes_add(c, (int64_t)(size * count));
    ps_spin_unlock(&c->lock);
}

/* ---- draining (owner's lock held) ----------------------------------------- */

/* Owner's lock and c's lock held: gives every entry of c back. */
static size_t cache_give_back_all_locked(ps_tcache_t *set, cache_t *c)
{
    size_t total = 0;
    uint64_t issued = issued_now(set);
    ps_tcache_block_t blocks[EVICT_MAX];
    for (uint32_t i = 0; i < BINS; i++) {
        bin_t *b = &c->bins[i];
        while (bin_blocks(b)) {
            size_t n = bin_evict(c, b, EVICT_MAX, issued, blocks);
            set->give_back_locked(set->owner, blocks, n);
            total += n;
        }
    }
    return total;
}

size_t ps_tcache_drain_all_locked(ps_tcache_t *set)
{
    size_t total = 0;
    ps_lock(&set->list_lock);
    for (cache_t *c = set->head; c; c = c->next) {
        ps_spin_lock(&c->lock);
        if (bytes_of(c))
            total += cache_give_back_all_locked(set, c);
        ps_spin_unlock(&c->lock);
    }
    ps_unlock(&set->list_lock);
    return total;
}

void ps_tcache_bytes_locked(ps_tcache_t *set, uint64_t *ready, uint64_t *pending)
{
    uint64_t r = 0, p = 0;
    uint64_t issued = issued_now(set);
    ps_lock(&set->list_lock);
    for (cache_t *c = set->head; c; c = c->next) {
        ps_spin_lock(&c->lock);
        for (uint32_t i = 0; i < BINS; i++) {
            bin_t *b = &c->bins[i];
            r += (uint64_t)b->ready_count * b->size;
            for (uint16_t j = b->oldest; j != NONE; j = c->entries[j].newer) {
                if (issued > c->entries[j].tag)
                    r += b->size;
                else
                    p += b->size;
            }
        }
        ps_spin_unlock(&c->lock);
    }
    ps_unlock(&set->list_lock);
    *ready = r;
    *pending = p;
}

void ps_tcache_counters(ps_tcache_t *set, ps_tcache_counters_t *out)
{
    ps_lock(&set->list_lock);
    out->hits = set->gone_hits;
    out->misses = set->gone_misses;
    for (cache_t *c = set->head; c; c = c->next) {
        out->hits += __atomic_load_n(&c->hits, __ATOMIC_RELAXED);
        out->misses += __atomic_load_n(&c->misses, __ATOMIC_RELAXED);
    }
    ps_unlock(&set->list_lock);
    out->barriers_asked = atomic_load_explicit(&set->requested, memory_order_relaxed);
}

uint64_t ps_tcache_bytes_total(ps_tcache_t *set)
{
    uint64_t total = 0;
    ps_lock(&set->list_lock);
    for (cache_t *c = set->head; c; c = c->next)
        total += bytes_of(c);
    ps_unlock(&set->list_lock);
    return total;
}

/* ---- life ------------------------------------------------------------------ */

int ps_tcache_create(size_t cap_bytes, int immediate, ps_reuse_family_t *family, ps_lock_t *owner_lock,
                     ps_tcache_give_back_fn give_back_locked, ps_tcache_barrier_fn barrier, void *owner,
                     ps_tcache_t **out)
{
    if (!cap_bytes || !family || !owner_lock || !give_back_locked || !out)
        return PS_EINVAL;
    pthread_once(&key_once, key_init);
    ps_tcache_t *set = aligned_alloc(_Alignof(ps_tcache_t), (sizeof *set + 63) / 64 * 64); /* (cache-line fields) */
    if (!set)
        return PS_ENOMEM;
    memset(set, 0, sizeof *set);
    set->cap = cap_bytes;
    set->hot.max_block = cap_bytes / 4;
    set->hot.immediate = immediate;
    atomic_init(&set->hot.cudafree, immediate);
    set->owner_lock = owner_lock;
    set->give_back_locked = give_back_locked;
    set->barrier = immediate ? NULL : barrier;
    set->owner = owner;
    set->list_lock = (ps_lock_t)PS_LOCK_INIT;
    set->family = family;
    atomic_init(&set->hot.owner_ready, UINT64_MAX);
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
        ps_spin_lock(&c->lock);
        __atomic_store_n(&c->orphaned, 1, __ATOMIC_RELEASE);
        ps_spin_unlock(&c->lock);
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
            ps_spin_lock(&c->lock);
            cache_give_back_all_locked(set, c);
            set->gone_hits += c->hits;
            set->gone_misses += c->misses;
            if (c->prev)
                c->prev->next = c->next;
            else
                set->head = c->next;
            if (c->next)
                c->next->prev = c->prev;
            __atomic_store_n(&c->orphaned, 1, __ATOMIC_RELEASE);
            atomic_fetch_sub(&set->hot.threads, 1);
            ps_spin_unlock(&c->lock);
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

void ps_tcache_always_engage(ps_tcache_t *set)
{
    set->hot.always_engaged = 1;
    ps_tcache_cache_cudafree(set);
}

void ps_tcache_cache_cudafree(ps_tcache_t *set) { atomic_store_explicit(&set->hot.cudafree, 1, memory_order_relaxed); }

void ps_tcache_thread_exit(void)
{
    thread_caches_t *t = tls_caches;
    if (!t)
        return;
    pthread_setspecific(thread_key, NULL);
    thread_exit(t);
}
