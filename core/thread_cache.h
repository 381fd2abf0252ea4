/* Per-thread caches of freed blocks in front of a pool (core/pool.c), so
 * that threads allocate and free without meeting on the pool's lock.
 * core/thread_cache.c opens with the algorithm; this header is its
 * contract with the pool that owns the caches.
 *
 * Guarantees:
 *  - a block freed with PS_STREAM_NONE or PS_STREAM_PER_THREAD (cudaFree
 *    semantics) is handed out again only after a barrier that was issued
 *    after its free completed (ps_tcache_barrier_begin/done), or at once
 *    when the cache was created `immediate` (free_sync none);
 *  - a block freed on stream s is handed out at once to an allocation on
 *    s by the same thread, to anything else only after such a barrier;
 *  - cudaFree'd blocks (free_sync barrier) are cached, and misses refilled,
 *    only while at least two threads have a cache in the set (see
 *    thread_cache.c, step 5);
 *  - cached blocks stay "in use" in the pool's metadata until they are
 *    given back through give_back_locked (the pool subtracts
 *    ps_tcache_bytes from its in-use figure: they count as free/pending);
 *  - the cache path trusts the pointer and size it is given (the shim's
 *    registry validates every free before the pool sees it); it refuses a
 *    pointer freed again right after its free by the same thread (PS_EINVAL).
 * Lock order: the set's registry lock (thread exit), the owner's lock,
 * the set's list lock, one cache's lock. The hot path takes only the
 * calling thread's cache lock.
 */
#ifndef PS_THREAD_CACHE_H
#define PS_THREAD_CACHE_H

#include "common.h"

#include <stdatomic.h>

/* A block given back to the owner. */
typedef struct ps_tcache_block {
    uintptr_t addr;     /* the block's address */
    size_t size;        /* its size (as the pool rounded it) */
    ps_stream_t stream; /* PS_STREAM_NONE/PER_THREAD: freed as cudaFree; else the stream it was freed on */
    int ready;          /* 1: a barrier covered its free (or immediate): reusable by anything */
} ps_tcache_block_t;

/* Called with the owner's lock held: the owner takes the blocks back. */
typedef void (*ps_tcache_give_back_fn)(void *owner, const ps_tcache_block_t *blocks, size_t count);

typedef struct ps_tcache ps_tcache_t;

/* The part of a set the pool reads inline on its hot path (the first
 * member of every set; the rest is private to thread_cache.c). */
typedef struct ps_tcache_hot {
    size_t max_block;   /* largest block cached (cap / 4) */
    int immediate;      /* 1: free_sync none, cudaFree'd blocks are ready at once */
    int always_engaged; /* test hook (ps_tcache_always_engage) */
    atomic_int threads; /* threads with a cache in the set */
} ps_tcache_hot_t;

/* Whether cudaFree'd blocks are cached: only under free_sync none (ready
 * at once). Under the barrier a cached cudaFree'd block waits for a barrier
 * the pool does not know it needs: on the GPU (H100, psbench threads_mixed,
 * two threads alive, 16 non-blocking streams) nearly every allocation then
 * missed, drained the caches and paid a barrier, 17.2 us per pair against
 * 0.42 us without the cache; the rule that engaged it with two threads is
 * kept for tests (ps_tcache_always_engage) until the pool counts cached
 * blocks in its barrier trigger. Stream-ordered frees are always cached. */
static inline int ps_tcache_caches_cudafree(const ps_tcache_t *set)
{
    const ps_tcache_hot_t *hot = (const ps_tcache_hot_t *)set;
    return hot->immediate || hot->always_engaged;
}

/* ps_tcache_put's answer when it did not cache the block. */
#define PS_TCACHE_DECLINED 1

/* Creates the set of caches of one pool. `cap_bytes`: most bytes one
 * thread's cache holds (blocks above cap_bytes / 4 are never cached);
 * `immediate`: frees are reusable at once (free_sync none); `owner_lock`:
 * the pool's lock; `give_back_locked`: how blocks return to the pool. */
int ps_tcache_create(size_t cap_bytes, int immediate, ps_lock_t *owner_lock,
                     ps_tcache_give_back_fn give_back_locked, void *owner, ps_tcache_t **out);

/* Destroys the set without giving anything back (the pool is going away,
 * its memory with it); threads' caches are detached and freed by their
 * threads later. No CUDA call. */
void ps_tcache_destroy(ps_tcache_t *set);

/* Hot path, no owner lock. Takes a cached block of exactly `size` bytes
 * usable by an allocation on `stream`: returns 1 and *out, or 0. */
int ps_tcache_take(ps_tcache_t *set, size_t size, ps_stream_t stream, void **out);

/* Hot path, no owner lock. Caches a block freed on `stream`: returns
 * PS_OK (cached; it may have pushed older blocks back to the pool under
 * the owner's lock), PS_EINVAL (already cached by this thread: a double
 * free), or PS_TCACHE_DECLINED (not cached: too big, or no cache; the caller frees
 * it to the pool itself). Must not be called with the owner's lock held. */
int ps_tcache_put(ps_tcache_t *set, void *ptr, size_t size, ps_stream_t stream);

/* The largest block a cache keeps (the pool checks it before calling in). */
size_t ps_tcache_max_block(const ps_tcache_t *set);

/* Counts the calling thread as one using the pool (gives it a cache in the
 * set); the pool calls it once per thread, from its locked allocation. */
void ps_tcache_register_thread(ps_tcache_t *set);

/* Owner's lock held: how many more blocks of `size` the calling thread's
 * cache would take as ready refills (0 when none). Also counts the calling
 * thread as one using the pool. */
size_t ps_tcache_refill_room_locked(ps_tcache_t *set, size_t size);

/* Owner's lock held: adds `count` ready blocks of `size` bytes (taken from
 * the pool as in use) to the calling thread's cache; count must not exceed
 * what ps_tcache_refill_room_locked returned. */
void ps_tcache_refill_locked(ps_tcache_t *set, size_t size, const uintptr_t *addrs, size_t count);

/* Owner's lock held: empties every thread's cache through give_back_locked.
 * Returns the number of blocks given back. */
size_t ps_tcache_drain_all_locked(ps_tcache_t *set);

/* Owner's lock held: bytes cached in all threads, split by readiness. */
void ps_tcache_bytes_locked(ps_tcache_t *set, uint64_t *ready, uint64_t *pending);

/* Barrier bookkeeping: begin returns a ticket, taken before the barrier's
 * first CUDA call; done(ticket) after it succeeded. Barriers are
 * serialized by the owner's lock. */
uint64_t ps_tcache_barrier_begin(ps_tcache_t *set);
void ps_tcache_barrier_done(ps_tcache_t *set, uint64_t ticket);

/* Test hook: cache cudaFree'd blocks and refill even while only one thread
 * uses the pool (normally only from the second thread on). */
void ps_tcache_always_engage(ps_tcache_t *set);

/* Gives the calling thread's caches back to their pools now (what thread
 * exit does; tests call it to model a thread's end). */
void ps_tcache_thread_exit(void);

#endif
