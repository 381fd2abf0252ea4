/* Per-thread caches of freed blocks in front of a pool (core/pool.c), so
 * that threads allocate and free without meeting on the pool's lock.
 * core/thread_cache.c opens with the algorithm; this header is its
 * contract with the pool that owns the caches.
 *
 * Guarantees:
 *  - a block freed with PS_STREAM_NONE or PS_STREAM_PER_THREAD (cudaFree
 *    semantics) is handed out again only after a barrier of the owner's
 *    reuse family that began after its free completed (its stamp is
 *    ps_reuse_family_stamp at the free, ps_reuse_family_covers decides),
 *    or at once when the cache was created `immediate` (free_sync none);
 *  - a block freed on stream s is handed out at once to an allocation on
 *    s by the same thread, to anything else only after such a barrier;
 *  - misses are refilled only while at least two threads have a cache in
 *    the set (see thread_cache.c, step 5);
 *  - a thread's cache holds at most cap_bytes; when its cudaFree'd blocks
 *    wait for a barrier and it has seen enough frees since the last one, a
 *    miss asks the owner for a barrier (barrier_fn, without any cache lock);
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
#include "reuse.h"

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

/* Called without any lock: the owner issues a barrier unless one already
 * covers a block tagged `tag` (ps_reuse_family_covers); returns 1 when such
 * a barrier completed, 0 when none could be had (a stream capture). It must
 * not take the owner's lock: threads asking at once share one barrier. */
typedef int (*ps_tcache_barrier_fn)(void *owner, uint64_t tag);

/* What the caches did (statistics). */
typedef struct ps_tcache_counters {
    uint64_t hits;           /* allocations served by a thread's cache */
    uint64_t misses;         /* allocations that went on to the pool (from threads with a cache) */
    uint64_t barriers_asked; /* barriers the caches asked the pool for */
} ps_tcache_counters_t;

typedef struct ps_tcache ps_tcache_t;

/* The part of a set the pool reads inline on its hot path (the first
 * member of every set; the rest is private to thread_cache.c). */
typedef struct ps_tcache_hot {
    size_t max_block;   /* largest block cached (cap / 4) */
    int immediate;      /* 1: free_sync none, cudaFree'd blocks are ready at once */
    int always_engaged; /* test hook (ps_tcache_always_engage) */
    atomic_int threads; /* threads with a cache in the set */
    atomic_int cudafree; /* 1: cudaFree'd blocks are cached too (ps_tcache_cache_cudafree) */
    /* on a line of its own: written by the owner under its lock, read by a
     * take that found only blocks waiting for a barrier */
    _Alignas(64) _Atomic uint64_t owner_ready; /* the owner's ready bytes when it last unlocked */
} ps_tcache_hot_t;

/* Owner's lock held, before unlocking: how many bytes it could hand out
 * without a barrier or growth (a hint for the caches: when it is below a
 * request, a take whose bin holds freed blocks asks for a barrier instead
 * of going to the owner, which would need one anyway). */
static inline void ps_tcache_note_owner_ready(ps_tcache_t *set, uint64_t bytes)
{
    ps_tcache_hot_t *hot = (ps_tcache_hot_t *)set;
    if (atomic_load_explicit(&hot->owner_ready, memory_order_relaxed) != bytes)
        atomic_store_explicit(&hot->owner_ready, bytes, memory_order_relaxed);
}

/* cudaFree'd blocks up to this size are always cached (under free_sync
 * barrier too): their place costs the pool next to nothing, and a
 * cudaMalloc/cudaFree cycle of small blocks then skips the pool's lock
 * (replay of the PyTorch transformer, conv net and MLP logs: peak reserved
 * unchanged with 256 B to 4 KiB; 1.04x -> 1.10x on the transformer from
 * 64 KiB on). */
#define PS_TCACHE_SMALL 4096

/* Whether a cudaFree'd block of `size` bytes is cached: always under
 * free_sync none (it is ready at once); under the barrier when it is small,
 * or once the owner saw its lock contended (ps_tcache_cache_cudafree). A
 * cached block pins its place in the pool: the blocks around it cannot
 * merge through it, and where the pool's lock is not contended that costs
 * memory for no gain (the transformer log: 1.04x to 1.10x reserved/requested
 * with caches of 16 KiB to 4 MiB for every size, depending on where blocks
 * land). Stream-ordered frees are always cached. */
static inline bool ps_tcache_caches_cudafree(const ps_tcache_t *set, size_t size)
{
    const ps_tcache_hot_t *hot = (const ps_tcache_hot_t *)set;
    return size <= PS_TCACHE_SMALL ||
           atomic_load_explicit(&((ps_tcache_hot_t *)hot)->cudafree, memory_order_relaxed);
}

/* From now on cudaFree'd blocks are cached too (the owner calls it when
 * threads meet on its lock; it stays so). */
void ps_tcache_cache_cudafree(ps_tcache_t *set);

/* ps_tcache_put's answer when it did not cache the block. */
#define PS_TCACHE_DECLINED 1

/* Creates the set of caches of one pool. `cap_bytes`: most bytes one
 * thread's cache holds (blocks above cap_bytes / 4 are never cached);
 * `immediate`: frees are reusable at once (free_sync none); `family`: the
 * owner's barrier numbers (a cached block is stamped with them);
 * `owner_lock`: the pool's lock; `give_back_locked`: how blocks return to
 * the pool; `barrier`: how a cache asks for a barrier. */
int ps_tcache_create(size_t cap_bytes, int immediate, ps_reuse_family_t *family, ps_lock_t *owner_lock,
                     ps_tcache_give_back_fn give_back_locked, ps_tcache_barrier_fn barrier, void *owner,
                     ps_tcache_t **out);

/* Destroys the set without giving anything back (the pool is going away,
 * its memory with it); threads' caches are detached and freed by their
 * threads later. No CUDA call. */
void ps_tcache_destroy(ps_tcache_t *set);

/* Hot path, no owner lock. Takes a cached block of exactly `size` bytes
 * usable by an allocation on `stream`: true and *out, or false. */
bool ps_tcache_take(ps_tcache_t *set, size_t size, ps_stream_t stream, void **out);

/* Owner's lock held: as ps_tcache_take for the calling thread, but never
 * asks for a barrier (the owner just issued one). */
int ps_tcache_take_owner_locked(ps_tcache_t *set, size_t size, ps_stream_t stream, void **out);

/* Whether the calling thread's cache holds freed (not ready) blocks of
 * exactly `size` bytes, which a barrier would let it reuse. */
bool ps_tcache_holds_freed(ps_tcache_t *set, size_t size);

/* Hot path, no owner lock. Caches a block freed on `stream`: returns
 * PS_OK (cached; it may have pushed older blocks back to the pool under
 * the owner's lock), PS_EINVAL (already cached by this thread: a double
 * free), or PS_TCACHE_DECLINED (not cached: too big, or no cache; the caller frees
 * it to the pool itself). Must not be called with the owner's lock held. */
int ps_tcache_put(ps_tcache_t *set, void *ptr, size_t size, ps_stream_t stream);

/* The largest block a cache keeps (the pool checks it before calling in). */
size_t ps_tcache_max_block(const ps_tcache_t *set);

/* Owner's lock held: how many more blocks of `size` the calling thread's
 * cache would take as ready refills (0 when none, and always 0 while
 * fewer than two threads have a cache). */
size_t ps_tcache_refill_room_locked(ps_tcache_t *set, size_t size);

/* Owner's lock held: adds `count` ready blocks of `size` bytes (taken from
 * the pool as in use) to the calling thread's cache; count must not exceed
 * what ps_tcache_refill_room_locked returned. */
void ps_tcache_refill_locked(ps_tcache_t *set, size_t size, const uintptr_t *addrs, size_t count);

/* Owner's lock held: empties every thread's cache through give_back_locked.
 * Returns the number of blocks given back. */
size_t ps_tcache_drain_all_locked(ps_tcache_t *set);

/* Owner's lock held: bytes cached in all threads, split by readiness
 * (walks every cache's blocks: for queries, not for hot paths). */
void ps_tcache_bytes_locked(ps_tcache_t *set, uint64_t *ready, uint64_t *pending);

/* Bytes cached in all threads, ready or not, read without any cache lock
 * (a snapshot: each cache's count as its thread last wrote it). */
uint64_t ps_tcache_bytes_total(ps_tcache_t *set);

/* Sums the counters of every cache, live or gone (takes the list lock). */
void ps_tcache_counters(ps_tcache_t *set, ps_tcache_counters_t *out);

/* Test hook: refill and cache cudaFree'd blocks even while only one
 * thread uses the pool and its lock was never contended. */
void ps_tcache_always_engage(ps_tcache_t *set);

/* Gives the calling thread's caches back to their pools now (what thread
 * exit does; tests call it to model a thread's end). */
void ps_tcache_thread_exit(void);

#endif
