/* Parked blocks: freed blocks the pool holds unmerged in front of its
 * lists, counted as free (core/pool.c, steps 3, 4 and 6): the quick cache,
 * the size stack, and the pool's side of the thread caches
 * (core/thread_cache.c), with the lock-contention count that decides what
 * those caches keep. What every allocation and free runs (take, park,
 * pool_lock, the refill check) is inline in core/pool_internal.h under
 * "pool_caches.c".
 *
 * Algorithm
 *  1. Quick cache (free_sync none): a free to the ready list parks the
 *     block in one of QUICK_SLOTS slots chosen by its size, evicting (into
 *     the lists) the block parked there before; an allocation of exactly
 *     that size takes it back without touching the lists.
 *  2. Size stack: blocks a barrier or a completed fence releases
 *     (pool_release_pending), in a pool of at most twice barrier_floor, or
 *     of at most small_from_back bytes in a pool of any size, are parked
 *     unmerged on a stack of one size, up to STACK_MAX (a floor's worth of
 *     32 KiB blocks, which one barrier in a pool at the floor releases),
 *     linked newest first; an allocation of exactly that size pops one
 *     (a loop of small temporary blocks beside a loaded model: 64 KiB pair
 *     1,377 -> 921 instructions; newest first for big blocks in big pools
 *     cost the PyTorch replays 4-8 MiB of peak, small ones cost nothing).
 *     A released block or a request of another size first merges the
 *     stack into the lists: at most one size waits unmerged. Only
 *     released blocks enter: the reuse rule is the ready list's.
 *  3. Every slow path, trim and check merges both into the lists first
 *     (pool_quick_flush_locked).
 *  4. Thread caches (options.thread_cache, free_sync barrier or none):
 *     allocate tries the calling thread's cache before it takes the pool's
 *     lock and free parks the block there; cached blocks stay used here
 *     (the in-use map keeps them) and count as free or pending in query.
 *     a. Barriers: the pool's and the caches' are numbered in one reuse
 *        family (pool->family): a cached cudaFree'd block is reusable once
 *        a barrier begun after its free was issued. A cache's request
 *        (pool_tcache_barrier) issues one without the pool's lock, one
 *        thread at a time, and the pool's epochs it covers are released at
 *        the pool's next poll.
 *     b. A locked allocation refills the thread's bin with a few ready
 *        blocks of its size (pool_tcache_refill_locked) and tells the
 *        caches how many bytes are ready, their hint for asking a barrier.
 *     c. Blocks come back through pool_tcache_give_back_locked: ready ones
 *        to the ready list, the others as their free would have gone.
 *     d. Before the pool grows, every cache is drained
 *        (pool_tcache_drain_locked); while threads contend, caches holding
 *        at most a quarter of the reserved bytes stay and the pool grows
 *        instead. At out of memory (step e), on trim and on
 *        stream_destroyed they come back whatever they hold.
 *  5. Contention: pool_lock counts the acquisitions that found the lock
 *     held; once threads met on it in 1 of LOCK_CONTENDED_SHARE
 *     acquisitions of a window of LOCK_WINDOW, the caches keep cudaFree'd
 *     blocks of every size too (core/thread_cache.h).
 * Guarantees: a parked block is free in every count (bytes_free,
 * largest_free_block) and goes only to a request of exactly its size; a
 * cached block is handed out only as its free allows (after a barrier
 * begun after a cudaFree; on its stream after a stream-ordered free);
 * parked and cached blocks never cause an out-of-memory error, and cached
 * ones cause growth only while threads contend, by at most what the caches
 * hold.
 */
#include "pool_internal.h"

#include <stdatomic.h>

/* ---- quick cache and size stack ---------------------------------------- */

/* Parks block `index`, released with idle generation `idle`, on the size
 * stack (the caller emptied a stack of another size). */
static inline void stack_push(pool_t *pool, uint32_t index, uint64_t idle)
{
    pool_lists_park(&pool->lists, index, idle);
    pool->lists.blocks[index].next_free = pool->stack_head;
    pool->stack_head = index;
    pool->stack_count++;
    pool->stack_size = pool->lists.blocks[index].size;
}

/* Merges the size stack into the ready list. */
void pool_stack_flush_locked(pool_t *pool)
{
    while (pool->stack_head != NIL) {
        uint32_t index = pool->stack_head;
        pool->stack_head = pool->lists.blocks[index].next_free;
        pool_lists_unpark(&pool->lists, index);
    }
    pool->stack_count = 0;
}

/* Merges every parked block, the size stack's and the quick cache's, into
 * the ready list. */
void pool_quick_flush_locked(pool_t *pool)
{
    pool_stack_flush_locked(pool);
    while (pool->quick_mask) {
        uint32_t slot = (uint32_t)__builtin_ctz(pool->quick_mask);
        uint32_t index = pool->quick[slot];
        pool->quick_mask &= pool->quick_mask - 1;
        pool->quick[slot] = NIL;
        pool_lists_unpark(&pool->lists, index);
    }
}

/* The largest block an allocation could get without growing: the biggest
 * listed block, or the run a parked block would form with its ready and
 * parked neighbours once parked blocks are merged. */
uint64_t pool_largest_free_locked(const pool_t *pool)
{
    const pool_lists_t *lists = &pool->lists;
    uint64_t largest = pool_lists_largest_listed(lists);
    for (uint32_t parked = pool->stack_head; parked != NIL; parked = lists->blocks[parked].next_free) {
        uint32_t below = lists->blocks[parked].prev_phys;
        if (below != NIL && lists->blocks[below].state == BLOCK_CACHED)
            continue; /* its run is counted from a parked block before it */
        uint64_t run = pool_lists_ready_run(lists, parked);
        if (run > largest)
            largest = run;
    }
    for (uint32_t mask = pool->quick_mask; mask; mask &= mask - 1) {
        uint64_t run = pool_lists_ready_run(lists, pool->quick[__builtin_ctz(mask)]);
        if (run > largest)
            largest = run;
    }
    return largest;
}

/* The reuse state's release callback: a barrier or fence covers the
 * block, it joins the size stack (step 2) or the ready list (idle as the
 * reuse state says). */
void pool_release_pending(void *owner, uint64_t item)
{
    pool_t *pool = owner;
    uint32_t index = (uint32_t)item;
    size_t size = pool->lists.blocks[index].size;
    if (pool->stack_count && size != pool->stack_size)
        pool_stack_flush_locked(pool); /* one size at a time */
    if (pool->stack_count < STACK_MAX &&
        (size <= pool->options.small_from_back || pool->lists.bytes_reserved <= 2 * (uint64_t)pool->options.barrier_floor))
        stack_push(pool, index, pool_streams_release_idle(&pool->streams));
    else
        pool_lists_release(&pool->lists, index, OWNER_READY, 0, pool_streams_release_idle(&pool->streams));
}

/* ---- thread caches (core/thread_cache.c) ------------------------------- */

/* The thread caches give blocks back: each is still a used block here. A
 * ready one (a barrier covered its free) joins the ready list; the others
 * take the path their free would have taken without the cache. Idle
 * generation of a ready one under free_sync barrier: a refill keeps the
 * one it had in the ready list (pool_take_block copies it), and a freed block
 * a barrier covered was covered by a barrier issued by now, so the max of
 * its descriptor's and the newest barrier's number is never too early;
 * otherwise (free_sync none: a kernel may still use it) IDLE_NEVER. */
void pool_tcache_give_back_locked(void *owner, const ps_tcache_block_t *blocks, size_t count)
{
    pool_t *pool = owner;
    const ps_gpu_ops_t *gpu = pool->gpu;
    uint64_t newest = IDLE_NEVER;
    if (pool->options.free_sync == PS_FREE_SYNC_BARRIER && gpu && gpu->barrier_generation && gpu->barrier_passed)
        newest = gpu->barrier_generation(gpu->ctx);
    for (size_t i = 0; i < count; i++) {
        uint32_t index, stream_owner;
        if (!pool_lists_unuse(&pool->lists, blocks[i].addr, &index))
            continue; /* cannot happen: cached blocks stay in the in-use map */
        if (blocks[i].ready)
            pool_lists_release(&pool->lists, index, OWNER_READY, 0,
                          pool->lists.blocks[index].idle_gen > newest ? pool->lists.blocks[index].idle_gen : newest);
        else if (ps_reuse_stream_ordered(blocks[i].stream) &&
                 pool_streams_owner_of(&pool->streams, &pool->lists, blocks[i].stream, &stream_owner) == PS_OK)
            pool_streams_free_on(&pool->streams, &pool->lists, index, stream_owner);
        else if (pool_streams_defer(&pool->streams, &pool->lists, index) != PS_OK) { /* cannot happen short of host OOM and a dead device */
            pool_lists_reuse(&pool->lists, blocks[i].addr, index);
        }
    }
}

/* After an allocation of `need` bytes served from the lists: a few more
 * blocks of that size from the ready list go to the calling thread's cache,
 * so its next allocations of that size skip the lock. Never grows. */
void pool_tcache_refill_room_locked(pool_t *pool, size_t need, size_t room)
{
    uintptr_t addrs[8];
    size_t count = 0;
    if (room > 8)
        room = 8;
    if (pool_lists_reserve_descriptors(&pool->lists, (uint32_t)room + 1) != PS_OK ||
        ps_ptr_map_reserve(&pool->lists.in_use, room) != PS_OK)
        return;
    while (count < room) {
        uint32_t index = pool_lists_find_ready(&pool->lists, need);
        if (index == NIL)
            break;
        addrs[count++] = pool->lists.blocks[pool_lists_take(&pool->lists, index, need)].addr;
    }
    if (count)
        ps_tcache_refill_locked(pool->tcache, need, addrs, count);
}

/* A thread's cache asks for a barrier (core/thread_cache.c, step 3): its
 * oldest cudaFree'd block, tagged `tag`, waits for one. No lock held, and
 * the pool's lock is not taken: the barrier is numbered in pool->family,
 * and the pool's epochs it covers are released at the pool's next poll
 * (ps_reuse_poll). Threads asking at once queue on barrier_lock and most
 * find the barrier of the thread ahead covers their block (barriers issued
 * under the pool's lock made every allocation wait: docs/benchmarks.md,
 * "The pool's design choices"). */
int pool_tcache_barrier(void *owner, uint64_t tag)
{
    pool_t *pool = owner;
    return pool_streams_cache_barrier(&pool->streams, tag);
}

/* Before the pool grows: every thread's cached blocks come back (drained
 * cudaFree'd ones may need a barrier); PS_OK when the request could then
 * be served. Not earlier in the slow path: with many threads the slow path
 * is common (nothing ready until the next barrier), and emptying every
 * cache there undid the caches (docs/benchmarks.md, "The pool's design
 * choices"). */
int pool_tcache_drain_locked(pool_t *pool, size_t need, int stream_allocation, int force, void **out)
{
    if (!pool->tcache)
        return PS_ENOMEM;
    /* the calling thread cached freed blocks of this size: a barrier lets
     * its own cache serve, and the caches keep what they hold (a thread
     * cycling one size through a small pool otherwise emptied its cache at
     * every barrier) */
    if (!stream_allocation && pool->gpu && pool->options.free_sync == PS_FREE_SYNC_BARRIER &&
        ps_tcache_holds_freed(pool->tcache, need) && pool_barrier_locked(pool) &&
        ps_tcache_take_owner_locked(pool->tcache, need, PS_STREAM_NONE, out))
        return PS_OK;
    if (!force && ps_tcache_caches_cudafree(pool->tcache, SIZE_MAX)) {
        /* threads contend for the lock (the caches keep every size):
         * caches holding at most a quarter of what the pool reserved stay
         * where they are: the pool grows instead (by at most what they
         * hold, a bounded overhead: cap bytes per thread), and the other
         * threads keep serving from them: emptying every cache whenever the
         * pool ran dry cut what the caches served (docs/benchmarks.md,
         * "The pool's design choices"). Without contention they are
         * drained. At OOM (step e) they come back whatever they hold. */
        if (ps_tcache_bytes_total(pool->tcache) * 4 <= pool->lists.bytes_reserved)
            return PS_ENOMEM;
    }
    if (!ps_tcache_drain_all_locked(pool->tcache))
        return PS_ENOMEM;
    if (pool_try_ready_locked(pool, need, out) == PS_OK)
        return PS_OK;
    if (pool->gpu && pool->options.free_sync == PS_FREE_SYNC_BARRIER && pool_streams_anything_pending(&pool->streams, &pool->lists) &&
        pool_barrier_locked(pool) && pool_try_ready_locked(pool, need, out) == PS_OK)
        return PS_OK;
    return PS_ENOMEM;
}

/* Lock held: `count` more acquisitions found the lock held (pool_lock). */
void pool_note_contention_locked(pool_t *pool, uint32_t count)
{
    pool->locks_contended += count;
    if (pool->tcache && pool->locks_contended * LOCK_CONTENDED_SHARE >= LOCK_WINDOW &&
        !ps_tcache_caches_cudafree(pool->tcache, SIZE_MAX)) {
        ps_tcache_cache_cudafree(pool->tcache);
        ps_debug("pool '%s': threads meet on its lock; their caches keep cudaFree'd blocks from now on",
                 pool->base.name);
    }
}

uint64_t ps_pool_thread_cache_bytes(ps_resource_t *r)
{
    pool_t *pool = (pool_t *)r;
    uint64_t ready = 0, pending = 0;
    if (r->ops != &pool_ops || !pool->tcache)
        return 0;
    ps_lock(&pool->lock);
    ps_tcache_bytes_locked(pool->tcache, &ready, &pending);
    ps_unlock(&pool->lock);
    return ready + pending;
}

int ps_pool_thread_cache_counters(ps_resource_t *r, uint64_t *hits, uint64_t *misses, uint64_t *barriers_asked)
{
    pool_t *pool = (pool_t *)r;
    ps_tcache_counters_t c = {0};
    if (r->ops == &pool_ops && pool->tcache)
        ps_tcache_counters(pool->tcache, &c);
    *hits = c.hits;
    *misses = c.misses;
    *barriers_asked = c.barriers_asked;
    return r->ops == &pool_ops && pool->tcache && ps_tcache_caches_cudafree(pool->tcache, SIZE_MAX);
}

void ps_pool_note_lock_contention(ps_resource_t *r, uint32_t count)
{
    pool_t *pool = (pool_t *)r;
    if (r->ops != &pool_ops)
        return;
    ps_lock(&pool->lock);
    pool_note_contention_locked(pool, count);
    ps_unlock(&pool->lock);
}

void ps_pool_thread_cache_always_engage(ps_resource_t *r)
{
    if (r->ops == &pool_ops && ((pool_t *)r)->tcache)
        ps_tcache_always_engage(((pool_t *)r)->tcache);
}
