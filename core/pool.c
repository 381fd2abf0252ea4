/* The coalescing pool (core/pool.h): a TLSF suballocator with host-side
 * block descriptors, cudaFree epochs, per-stream free lists, and either
 * chunks from an upstream or an expandable virtual-memory range. This file
 * is its front: allocate, free, trim, query, create, and the slow path's
 * ladder. It holds one of each layer (core/pool_internal.h); each layer
 * owns its state in its own file, and calls go one way, down:
 *   pool_caches.c      parked blocks (quick cache, size stack) and the
 *                      blocks the threads' caches take and give back
 *   pool_streams.c     cudaFree epochs, stream lists, fences, barriers
 *   pool_growth.c      chunks, the growth bound and budget, giving back
 *   pool_expandable.c  the range: growth in place, remap, lending
 *   pool_lists.c       descriptors, chunks, TLSF lists, split and merge
 *   pool_decay.c       the decay's policy, which the front informs and asks
 * What flows back up is a returned value; callbacks that core/reuse.c and
 * core/thread_cache.c make are the front's and forward down.
 *
 * Algorithm
 *  1. allocate(size), rounded up to the alignment: the calling thread's
 *     cache first, without the lock. Under it: an eager barrier once
 *     pending bytes pile up; then the stream's own lists (stream-ordered),
 *     the size stack and the quick cache (exact size), the ready list
 *     (good fit), a steal from another stream; the thread's cache refilled.
 *  2. Nothing fits: the ladder, each rung retrying the ready list. Merge
 *     the parked blocks; reclaim without a wait (completed epochs, one
 *     barrier, or below the barrier floor none: grow); the threads' caches
 *     back; the growth bound and budget; grow; reclaim with waits (host
 *     waits on the oldest epochs, every stream list); every cache back,
 *     free memory given back, grow once more; else PS_ENOMEM.
 *  3. free(ptr): the in-use map finds the block (absent: PS_EINVAL). On a
 *     stream: its stream's lists at once. cudaFree: the thread's cache, or
 *     the open epoch (event, barrier), the quick cache (none), or after a
 *     device synchronize (device). No CUDA call under event and barrier.
 *  4. trim, and a device synchronize above release_threshold: every epoch
 *     and stream list waited, free memory given back. The decay's tick
 *     gives back what its policy does not keep, idle memory only.
 * Guarantees: every address and size is a multiple of the alignment; a
 * freed block is handed out again only as its layer's reuse rule allows;
 * errors change nothing; out of memory comes only after every rung; one
 * lock per pool (most calls of a thread with a cache take only its own). */
#include "pool_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- the lock and the threads' caches ---------------------------------- */

/* Lock held: `count` more acquisitions found the lock held. Once threads
 * met on it in 1 of LOCK_WINDOW / LOCK_CONTENDED_SHARE acquisitions of a
 * window, the threads' caches keep cudaFree'd blocks of every size too
 * (core/thread_cache.h). */
#define LOCK_WINDOW 4096
#define LOCK_CONTENDED_SHARE 16
static void note_contention_locked(pool_t *pool, uint32_t count)
{
    pool->locks_contended += count;
    if (pool->tcache && pool->locks_contended * LOCK_CONTENDED_SHARE >= LOCK_WINDOW &&
        !ps_tcache_caches_cudafree(pool->tcache, SIZE_MAX)) {
        ps_tcache_cache_cudafree(pool->tcache);
        ps_debug("pool '%s': threads meet on its lock; their caches keep cudaFree'd blocks from now on",
                 pool->base.name);
    }
}

/* The hot paths take the lock here: while the threads' caches keep no
 * cudaFree'd blocks, it counts how often the lock was found held. */
static inline void pool_lock(pool_t *pool)
{
    if (__builtin_expect(ps_lock_try(&pool->lock), 1)) {
        if (pool->tcache && ++pool->locks_taken == LOCK_WINDOW)
            pool->locks_taken = pool->locks_contended = 0;
        return;
    }
    ps_lock_slow(&pool->lock);
    note_contention_locked(pool, 1);
}

/* After a locked allocation of `need` (<= tcache_max_block) bytes: a few
 * more blocks of that size go to the calling thread's cache. */
static inline __attribute__((always_inline)) void tcache_refill_locked(pool_t *pool, size_t need)
{
    size_t room = ps_tcache_refill_room_locked(pool->tcache, need);
    if (room)
        pool_caches_refill(&pool->lists, pool->tcache, need, room);
}

/* The threads' caches' callbacks (core/thread_cache.h): blocks come back;
 * a thread asks for a barrier (without the pool's lock). */
static void tcache_give_back_locked(void *owner, const ps_tcache_block_t *blocks, size_t count)
{
    pool_t *pool = owner;
    pool_caches_give_back(&pool->caches, &pool->streams, &pool->lists, blocks, count);
}

static int tcache_barrier(void *owner, uint64_t tag)
{
    pool_t *pool = owner;
    return pool_streams_cache_barrier(&pool->streams, tag);
}

/* ---- the ready list ---------------------------------------------------- */

/* Takes a block of `need` bytes from the ready list. */
static int pool_try_ready_locked(pool_t *pool, size_t need, void **out)
{
    uint32_t index = pool_caches_take_stacked(&pool->caches, &pool->lists, need); /* a barrier just released them */
    if (index != NIL) {
        *out = (void *)pool->lists.blocks[index].addr;
        return PS_OK;
    }
    index = pool_lists_find_ready(&pool->lists, need);
    if (index == NIL)
        return PS_ENOMEM;
    *out = (void *)pool->lists.blocks[pool_lists_take(&pool->lists, index, need)].addr;
    return PS_OK;
}

/* Takes `need` bytes from `grown`, the ready block growth produced (it is
 * big enough; taking it directly avoids the good-fit search, which may
 * skip a fitting block of the request's own class). */
static inline int take_grown_locked(pool_t *pool, uint32_t grown, size_t need, void **out)
{
    if (pool->lists.blocks[grown].size < need)
        return pool_try_ready_locked(pool, need, out);
    *out = (void *)pool->lists.blocks[pool_lists_take(&pool->lists, grown, need)].addr;
    return PS_OK;
}

/* ---- the barrier -------------------------------------------------------- */

/* One device-wide barrier (core/pool_streams.c): every pending block joins
 * the ready list, and the bytes it released earn remap credit. false: refused
 * (a capture is open), nothing changed. */
static bool pool_barrier_locked(pool_t *pool)
{
    uint64_t released;
    if (!pool_streams_barrier(&pool->streams, &pool->lists, &released))
        return false;
    pool_expandable_earn(&pool->range, &pool->lists, released);
    return true;
}

/* ---- the barrier floor (free_sync barrier) ----------------------------- */

/* The barrier floor (options.barrier_floor, free_sync barrier): while
 * reserved + a request fit in it, a miss grows instead of issuing a
 * barrier (a barrier per pair or two made a 1 MiB cudaMalloc/cudaFree pair
 * cost four times a small one: docs/benchmarks.md, "The pool's design
 * choices"). */
static inline uint64_t barrier_floor_locked(const pool_t *pool)
{
    uint64_t floor = pool->options.barrier_floor;
    /* threads with caches: each may hold `thread_cache` bytes the pool
     * must back; without room for them a fresh pool served many threads
     * with a barrier every few pairs */
    int threads = pool->tcache ? atomic_load_explicit(&((ps_tcache_hot_t *)pool->tcache)->threads,
                                                      memory_order_relaxed) : 0;
    if (floor && threads > 1)
        floor += (uint64_t)threads * (pool->tcache_max_block * 4);
    return floor;
}

/* The pool's question to core/reuse.c's barrier decision
 * (ps_reuse_barrier_worth): at a miss for `request` bytes, grow while
 * reserved + request fit in the floor; the eager trigger,
 * once pending bytes pass barrier_pending_percent of reserved (and
 * PS_REUSE_EAGER_FLOOR), waits until the floor (options.barrier_floor) is
 * pending, in a pool of any size, so one barrier releases many blocks (a
 * 1 MiB free/take loop: one barrier per 32 pairs); with threads (the floor
 * grown by their caches) a pool of at most twice that floor waits for half
 * of it. */
static inline ps_reuse_barrier_call_t barrier_call_locked(const pool_t *pool, pool_barrier_ask_t ask,
                                                          uint64_t request)
{
    return pool_streams_barrier_call(&pool->streams, ask, request, pool->lists.bytes_reserved,
                                     barrier_floor_locked(pool));
}

/* Below the barrier floor a miss for `need` bytes grows instead of
 * issuing a barrier. */
static inline bool below_barrier_floor_locked(const pool_t *pool, size_t need)
{
    return barrier_call_locked(pool, POOL_BARRIER_AT_MISS, need) == PS_REUSE_GROW;
}

/* What the caches are told the pool can serve without a barrier
 * (ps_tcache_note_owner_ready): its ready bytes, or everything while it is
 * below the barrier floor, where a miss makes it grow, not issue one
 * (told only the ready bytes, the caches of a fresh pool asked for a
 * barrier on most misses and the pool stayed far below its floor). */
static inline uint64_t owner_ready_hint_locked(const pool_t *pool)
{
    if (pool->options.free_sync == PS_FREE_SYNC_BARRIER && below_barrier_floor_locked(pool, pool->tcache_max_block))
        return UINT64_MAX;
    return pool->lists.owners[OWNER_READY]->free_bytes;
}

/* ---- growth's bounds ---------------------------------------------------- */

/* Where reserved + `need` stand against the budget floor (grow_budget_min). */
static inline pool_budget_floor_t floor_locked(const pool_t *pool, size_t need)
{
    return pool_growth_floor(&pool->growth, &pool->range, &pool->lists, need);
}

/* Merges the parked blocks and gives free memory back until at most
 * `keep` bytes are reserved (core/pool_growth.c). */
static void release_free_locked(pool_t *pool, uint64_t keep)
{
    pool_caches_flush(&pool->caches, &pool->lists);
    pool_growth_release_free(&pool->growth, &pool->range, &pool->lists, keep);
}

/* Host-waits the oldest epochs one by one, after closing the open one,
 * trying the ready list after each; with `bounded`, only while more bytes
 * are pending than the growth bound allows. Each wait is counted in
 * pending_waits. PS_OK: served. */
static int wait_epochs_locked(pool_t *pool, size_t need, bool bounded, void **out)
{
    pool_streams_close_or_sync(&pool->streams);
    if (pool_try_ready_locked(pool, need, out) == PS_OK) /* the fallback may have freed blocks */
        return PS_OK;
    while (pool_streams_closed(&pool->streams) &&
           (!bounded || pool_streams_pending(&pool->streams) > pool_growth_pending_bound(&pool->growth, &pool->lists))) {
        pool_streams_wait_oldest(&pool->streams);
        pool->pending_waits++;
        if (pool_try_ready_locked(pool, need, out) == PS_OK)
            return PS_OK;
    }
    return PS_ENOMEM;
}

/* The growth bound: while more bytes are pending than it allows, host-wait
 * the oldest epoch and retry. PS_OK: served from released blocks;
 * PS_ENOMEM: go on and grow. */
static int wait_over_bound_locked(pool_t *pool, size_t need, void **out)
{
    if (pool_streams_pending(&pool->streams) <= pool_growth_pending_bound(&pool->growth, &pool->lists))
        return PS_ENOMEM;
    return wait_epochs_locked(pool, need, true, out);
}

/* The growth budget (grow_budget_percent): over it, first host-wait
 * pending blocks, oldest epoch first, retrying after each (a freed block
 * that serves is cheaper than pieces given back and mapped again); then
 * give free pieces back, holes between live blocks before the rest, until
 * reserved + need fits. PS_OK: served from released blocks; PS_ENOMEM: go
 * on and grow. */
static int fit_budget_locked(pool_t *pool, size_t need, void **out)
{
    uint64_t keep;
    if (!pool_growth_over_budget(&pool->growth, &pool->lists, need, &keep))
        return PS_ENOMEM;
    if (pool->gpu && pool_streams_pending(&pool->streams) && wait_epochs_locked(pool, need, false, out) == PS_OK)
        return PS_OK;
    release_free_locked(pool, keep);
    return PS_ENOMEM;
}

/* ---- the threads' caches come back ------------------------------------- */

/* How much of the threads' caches comes back before the pool grows. */
typedef enum drain {
    DRAIN_UNLESS_CONTENDED, /* while threads contend, caches holding at most a quarter of reserved stay */
    DRAIN_ALL               /* every cache, whatever it holds (out of memory) */
} drain_t;

/* Before the pool grows: every thread's cached blocks come back (drained
 * cudaFree'd ones may need a barrier); PS_OK when the request could then
 * be served. Not earlier in the slow path: with many threads the slow path
 * is common (nothing ready until the next barrier), and emptying every
 * cache there undid the caches. */
static int drain_caches_locked(pool_t *pool, size_t need, bool stream_allocation, drain_t how, void **out)
{
    if (!pool->tcache)
        return PS_ENOMEM;
    bool barriers = pool->gpu && pool->options.free_sync == PS_FREE_SYNC_BARRIER;
    /* the calling thread cached freed blocks of this size: a barrier lets
     * its own cache serve, and the caches keep what they hold (a thread
     * cycling one size through a small pool otherwise emptied its cache at
     * every barrier) */
    if (!stream_allocation && barriers && ps_tcache_holds_freed(pool->tcache, need) && pool_barrier_locked(pool) &&
        ps_tcache_take_owner_locked(pool->tcache, need, PS_STREAM_NONE, out))
        return PS_OK;
    /* threads contend for the lock (the caches keep every size): caches
     * holding at most a quarter of what the pool reserved stay where they
     * are, the pool grows instead (by at most what they hold), and the
     * other threads keep serving from them */
    if (how == DRAIN_UNLESS_CONTENDED && ps_tcache_caches_cudafree(pool->tcache, SIZE_MAX) &&
        ps_tcache_bytes_total(pool->tcache) * 4 <= pool->lists.bytes_reserved)
        return PS_ENOMEM;
    if (!ps_tcache_drain_all_locked(pool->tcache))
        return PS_ENOMEM;
    if (pool_try_ready_locked(pool, need, out) == PS_OK)
        return PS_OK;
    if (barriers && pool_streams_anything_pending(&pool->streams, &pool->lists) && pool_barrier_locked(pool) &&
        pool_try_ready_locked(pool, need, out) == PS_OK)
        return PS_OK;
    return PS_ENOMEM;
}

/* ---- growth ------------------------------------------------------------ */

/* One growth of the range: the remap it may begin with wants a barrier,
 * which the front issues; *lent: it lent pieces and failed. */
static int grow_range_once_locked(pool_t *pool, size_t need, uint32_t *grown, bool *lent)
{
    pool_range_growth_t g;
    *lent = false;
    int status = pool_expandable_begin(&pool->range, &pool->lists, need, &g);
    if (status != PS_OK)
        return status;
    bool barrier = g.wants_barrier && pool_barrier_locked(pool);
    return pool_expandable_finish(&pool->range, &pool->lists, &g, barrier, grown, lent);
}

/* Maps the fewest new pieces that give a ready block of at least `need`
 * bytes, *grown = the block. A growth that lent pieces and failed (its
 * lent blocks taken back) is tried once more without lending; when the
 * failure was not for lack of memory, the driver would not map memory
 * twice: the pool stops lending (it waits, as with remap_lend 0) and says
 * so once. Needs two reserved descriptors. */
static int grow_range_locked(pool_t *pool, size_t need, uint32_t *grown)
{
    bool lent;
    int status = grow_range_once_locked(pool, need, grown, &lent);
    if (status == PS_OK || !lent)
        return status;
    bool refused = status != PS_ENOMEM;
    pool_expandable_refuse_lending(&pool->range, true); /* for the second try */
    status = grow_range_once_locked(pool, need, grown, &lent);
    pool_expandable_refuse_lending(&pool->range, refused);
    if (refused)
        ps_warning("pool '%s': mapping memory at a second address failed; remap waits for the GPU from now on "
                   "(as with remap_lend = 0)",
                   pool->base.name);
    return status;
}

/* Grows for `need` bytes: the range, or one chunk; *grown = the ready
 * block that now fits. */
static int grow_locked(pool_t *pool, size_t need, uint32_t *grown)
{
    if (pool->range.on)
        return grow_range_locked(pool, need, grown);
    return pool_growth_add_chunk_for(&pool->growth, &pool->lists, need, grown);
}

/* expandable_map_first: the range's first piece is mapped when the pool
 * is made, a free ready block, so that a program's first small cudaMalloc
 * maps nothing. Best effort: a failure leaves it to the first growth. */
static void map_first_piece_locked(pool_t *pool)
{
    uint32_t grown;
    size_t piece = pool_expandable_first_piece(&pool->range, &pool->lists);
    if (piece)
        (void)grow_range_locked(pool, piece, &grown);
}

/* ---- allocate / deallocate --------------------------------------------- */

/* Reclaims without a host wait: completed epochs and (a cudaMalloc)
 * stream lists fenced already; then one barrier when anything is pending
 * (below the barrier floor none: *grow_first, the pool grows and the
 * threads' caches stay), or, when none can be had (a capture is open, or
 * free_sync event), the open epoch closed and polled briefly; then (a
 * cudaMalloc) a fence recorded on each stream list. Each retries the
 * ready list. PS_OK: served. */
static int reclaim_without_wait_locked(pool_t *pool, size_t need, bool stream_allocation, bool *grow_first,
                                       void **out)
{
    int released = pool_streams_poll_epochs(&pool->streams);
    if (!stream_allocation)
        released += pool_streams_poll(&pool->streams, &pool->lists, POOL_POLL_QUERY);
    if (released && pool_try_ready_locked(pool, need, out) == PS_OK)
        return PS_OK;
    bool barrier = pool->options.free_sync == PS_FREE_SYNC_BARRIER;
    if (barrier && below_barrier_floor_locked(pool, need)) {
        *grow_first = true;
    } else if (barrier && pool_streams_anything_pending(&pool->streams, &pool->lists) && pool_barrier_locked(pool)) {
        if (pool_try_ready_locked(pool, need, out) == PS_OK)
            return PS_OK;
    } else if (pool_streams_close_and_poll(&pool->streams, floor_locked(pool, need)) &&
               pool_try_ready_locked(pool, need, out) == PS_OK) {
        return PS_OK;
    }
    if (!stream_allocation && pool_streams_poll(&pool->streams, &pool->lists, POOL_POLL_RECORD) &&
        pool_try_ready_locked(pool, need, out) == PS_OK)
        return PS_OK;
    return PS_ENOMEM;
}

/* Before a growth: the growth bound (host-wait epochs while too much is
 * pending), then, for chunks, release_before_grow (every wholly free ready
 * chunk goes back: kept, they would only strand memory, as chunks never
 * merge), or, for the range, the growth budget. PS_OK: waiting served. */
static int within_growth_bounds_locked(pool_t *pool, size_t need, void **out)
{
    const ps_pool_options_t *o = &pool->options;
    if (pool->gpu && (o->pending_wait_bytes || o->pending_wait_percent) &&
        floor_locked(pool, need) != POOL_FLOOR_UNDER && wait_over_bound_locked(pool, need, out) == PS_OK)
        return PS_OK;
    if (o->release_before_grow && !pool->range.on)
        release_free_locked(pool, 0);
    else if (o->grow_budget_percent && pool->range.on && fit_budget_locked(pool, need, out) == PS_OK)
        return PS_OK;
    return PS_ENOMEM;
}

/* Memory pressure, the growth failed: a barrier (one refused earlier,
 * while a capture was open, may be possible now), then host waits for the
 * oldest epochs one by one, then every stream list waited and merged into
 * the ready list. Each retries the ready list. PS_OK: served. */
static int reclaim_waiting_locked(pool_t *pool, size_t need, void **out)
{
    if (pool->options.free_sync == PS_FREE_SYNC_BARRIER && pool_streams_anything_pending(&pool->streams, &pool->lists) &&
        pool_barrier_locked(pool) && pool_try_ready_locked(pool, need, out) == PS_OK)
        return PS_OK;
    pool_streams_close_or_sync(&pool->streams);
    if (pool_try_ready_locked(pool, need, out) == PS_OK) /* the fallback may have freed blocks */
        return PS_OK;
    while (pool_streams_wait_oldest(&pool->streams))
        if (pool_try_ready_locked(pool, need, out) == PS_OK)
            return PS_OK;
    if (pool_streams_poll(&pool->streams, &pool->lists, POOL_POLL_WAIT) +
            pool_streams_poll(&pool->streams, &pool->lists, POOL_POLL_WAIT) &&
        pool_try_ready_locked(pool, need, out) == PS_OK)
        return PS_OK;
    return PS_ENOMEM;
}

/* The slow path's ladder, when nothing ready fits `need` bytes
 * (`stream_allocation`: a stream-ordered request, whose own and stolen
 * lists were tried already): parked blocks merged; reclaiming without a
 * wait; the threads' caches back; the growth's bounds; a growth; reclaiming
 * with waits; every cache back, free memory given back, one more growth;
 * else out of memory. */
static int allocate_slow_locked(pool_t *pool, size_t need, bool stream_allocation, void **out)
{
    bool grow_first = false; /* below the barrier floor: grow, no barrier, the caches stay */
    uint32_t grown;
    pool_caches_flush(&pool->caches, &pool->lists); /* parked blocks may coalesce into a fit */
    if (pool_try_ready_locked(pool, need, out) == PS_OK)
        return PS_OK;
    if (pool->gpu && reclaim_without_wait_locked(pool, need, stream_allocation, &grow_first, out) == PS_OK)
        return PS_OK;
    if (!grow_first && drain_caches_locked(pool, need, stream_allocation, DRAIN_UNLESS_CONTENDED, out) == PS_OK)
        return PS_OK;
    if (within_growth_bounds_locked(pool, need, out) == PS_OK)
        return PS_OK;
    if (grow_locked(pool, need, &grown) == PS_OK)
        return take_grown_locked(pool, grown, need, out);
    if (pool->gpu && reclaim_waiting_locked(pool, need, out) == PS_OK)
        return PS_OK;
    if (drain_caches_locked(pool, need, stream_allocation, DRAIN_ALL, out) == PS_OK)
        return PS_OK;
    release_free_locked(pool, 0);
    if (grow_locked(pool, need, &grown) == PS_OK)
        return take_grown_locked(pool, grown, need, out);
    return PS_ENOMEM;
}

/* free_sync barrier: once pending bytes pile up past
 * barrier_pending_percent of reserved (and the floors), one barrier
 * releases them before the allocation: blocks freed since the last
 * barrier cannot be reused, so new allocations would scatter into other
 * holes. The percentage is asked inline first, the floors only once it
 * passed; a thread cache's barrier may have covered them already, and the
 * poll releases those. */
static inline void eager_barrier_locked(pool_t *pool)
{
    uint64_t reserved = pool->lists.bytes_reserved;
    if (__builtin_expect(pool->eager_barrier, 0) && pool_streams_pending_piles_up(&pool->streams, reserved) &&
        barrier_call_locked(pool, POOL_BARRIER_EAGER, 0) == PS_REUSE_BARRIER &&
        (!pool_streams_poll_epochs(&pool->streams) || pool_streams_pending_piles_up(&pool->streams, reserved))) {
        pool_caches_flush(&pool->caches, &pool->lists);
        pool_barrier_locked(pool);
    }
}

static int pool_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    pool_t *pool = (pool_t *)r;
    size_t need = size ? ps_align_up(size, pool->options.alignment) : pool->options.alignment;
    if (!need)
        return PS_ENOMEM;
    bool stream_ordered = ps_reuse_stream_ordered(stream);
    if (stream_ordered && !pool->gpu)
        return PS_EUNSUPPORTED;
    if (need <= pool->tcache_max_block && (stream_ordered || ps_tcache_caches_cudafree(pool->tcache, need)) &&
        ps_tcache_take(pool->tcache, need, stream, out))
        return PS_OK;
    pool_lock(pool);
    eager_barrier_locked(pool);
    int status = pool_lists_reserve_descriptors(&pool->lists, 2);
    if (status == PS_OK)
        status = ps_ptr_map_reserve(&pool->lists.in_use, 1);
    uint32_t owner = OWNER_READY;
    if (status == PS_OK && stream_ordered && pool_streams_owner_of(&pool->streams, &pool->lists, stream, &owner) != PS_OK)
        owner = OWNER_READY; /* no list for this stream: serve it as a cudaMalloc would be */
    if (status != PS_OK) {
        ps_unlock(&pool->lock);
        return status;
    }
    uint32_t index = NIL;
    if (owner != OWNER_READY)
        index = pool_lists_find(&pool->lists, pool->lists.owners[owner], need);
    if (index == NIL) {
        uint32_t parked = pool_caches_take_stacked(&pool->caches, &pool->lists, need);
        if (parked == NIL)
            parked = pool_caches_take_quick(&pool->caches, &pool->lists, need);
        if (parked != NIL) {
            *out = (void *)pool->lists.blocks[parked].addr;
            if (need <= pool->tcache_max_block)
                tcache_refill_locked(pool, need);
            pool_decay_note(&pool->decay, pool->lists.bytes_in_use);
            ps_unlock(&pool->lock);
            return PS_OK;
        }
        index = pool_lists_find_ready(&pool->lists, need);
    }
    if (index == NIL && owner != OWNER_READY && pool_streams_steal(&pool->streams, &pool->lists, owner, need))
        index = pool_lists_find(&pool->lists, pool->lists.owners[owner], need);
    if (index != NIL) {
        *out = (void *)pool->lists.blocks[pool_lists_take(&pool->lists, index, need)].addr;
    } else {
        status = allocate_slow_locked(pool, need, owner != OWNER_READY, out);
    }
    if (status == PS_OK && need <= pool->tcache_max_block)
        tcache_refill_locked(pool, need);
    if (pool->tcache)
        ps_tcache_note_owner_ready(pool->tcache, owner_ready_hint_locked(pool));
    pool_decay_note(&pool->decay, pool->lists.bytes_in_use);
    ps_unlock(&pool->lock);
    return status;
}

static int pool_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    pool_t *pool = (pool_t *)r;
    pool_expandable_note_free(&pool->range); /* (setup runs end here) */
    bool stream_ordered = ps_reuse_stream_ordered(stream);
    if (stream_ordered && !pool->gpu)
        return PS_EUNSUPPORTED;
    size_t need = size ? ps_align_up(size, pool->options.alignment) : pool->options.alignment;
    if (need <= pool->tcache_max_block) {
        int cached = ps_tcache_put(pool->tcache, ptr, need, stream);
        if (cached != PS_TCACHE_DECLINED)
            return cached;
    }
    bool defer = pool_streams_defers(&pool->streams) || stream_ordered;
    if (!stream_ordered && pool->options.free_sync == PS_FREE_SYNC_DEVICE) {
        int status = pool->gpu->device_synchronize(pool->gpu->ctx);
        if (status == PS_EBUSY)
            defer = true; /* a stream capture is open: the block waits for a fence instead */
        else if (status != PS_OK)
            return status;
    }
    pool_lock(pool);
    uint32_t index;
    if (!pool_lists_unuse(&pool->lists, (uintptr_t)ptr, &index)) {
        ps_unlock(&pool->lock);
        return PS_EINVAL;
    }
    uint32_t owner;
    int status = PS_OK;
    if (stream_ordered && pool_streams_owner_of(&pool->streams, &pool->lists, stream, &owner) == PS_OK)
        pool_streams_free_on(&pool->streams, &pool->lists, index, owner);
    else if (defer) { /* no list for the stream: the safe path */
        size_t freed = pool->lists.blocks[index].size;
        status = pool_streams_defer(&pool->streams, &pool->lists, index);
        if (status == PS_OK && pool->options.grow_budget_min)
            pool_streams_fence_batch(&pool->streams, &pool->lists, floor_locked(pool, freed));
    } else
        pool_caches_park_quick(&pool->caches, &pool->lists, index);
    if (status != PS_OK) /* nothing changed: the block is still in use */
        pool_lists_reuse(&pool->lists, (uintptr_t)ptr, index);
    ps_unlock(&pool->lock);
    return status;
}

/* The program synchronized the device: above release_threshold, wait for
 * what is pending (the device is idle, so at once) and give free memory
 * back down to the threshold. Memory freed by another thread since the
 * program's synchronize is covered by the fences flush_all waits on. */
static void pool_device_synchronized(ps_resource_t *r)
{
    pool_t *pool = (pool_t *)r;
    if (pool->options.release_threshold == UINT64_MAX)
        return;
    ps_lock(&pool->lock);
    if (pool->lists.bytes_reserved > pool->options.release_threshold) {
        pool_streams_flush(&pool->streams, &pool->lists);
        release_free_locked(pool, pool->options.release_threshold);
    }
    ps_unlock(&pool->lock);
}

static int pool_trim(ps_resource_t *r)
{
    pool_t *pool = (pool_t *)r;
    ps_lock(&pool->lock);
    if (pool->tcache)
        ps_tcache_drain_all_locked(pool->tcache);
    pool_streams_flush(&pool->streams, &pool->lists);
    release_free_locked(pool, 0);
    ps_unlock(&pool->lock);
    return PS_OK;
}

/* ---- query and destroy ------------------------------------------------- */

static void pool_query(ps_resource_t *r, ps_resource_info_t *info)
{
    pool_t *pool = (pool_t *)r;
    ps_lock(&pool->lock);
    uint64_t cached_ready = 0, cached_pending = 0; /* cached blocks are used in the metadata, free to the program */
    if (pool->tcache)
        ps_tcache_bytes_locked(pool->tcache, &cached_ready, &cached_pending);
    info->bytes_in_use += pool->lists.bytes_in_use - cached_ready - cached_pending;
    info->bytes_reserved += pool->lists.bytes_reserved;
    info->peak_bytes_reserved += pool->lists.peak_bytes_reserved;
    info->bytes_free += pool->lists.bytes_free + cached_ready;
    info->bytes_pending += cached_pending;
    uint64_t largest = pool_lists_largest_listed(&pool->lists), parked = pool_caches_largest_parked(&pool->caches, &pool->lists);
    if (parked > largest)
        largest = parked;
    if (largest > info->largest_free_block)
        info->largest_free_block = largest;
    info->upstream_allocs += pool->lists.upstream_allocs;
    info->upstream_frees += pool->lists.upstream_frees;
    pool_streams_add_counters(&pool->streams, info);
    info->pending_waits += pool->pending_waits;
    pool_expandable_add_counters(&pool->range, info);
    ps_unlock(&pool->lock);
}

/* ---- the decay --------------------------------------------------------- */

/* The most one step of the decay gives back before the lock is let go
 * (~1000 pieces of unmapping): a whole card's give-back in one go would
 * hold the pool for seconds. */
#define DECAY_STEP (2 * PS_GiB)

/* Pending memory made ready without a wait: a barrier (refused while a
 * capture is open), or (free_sync event) the open epoch closed and
 * completed fences polled. */
static void ready_pending_locked(pool_t *pool)
{
    if (pool->options.free_sync == PS_FREE_SYNC_BARRIER) {
        if (pool_streams_pending(&pool->streams))
            pool_barrier_locked(pool);
    } else if (pool->options.free_sync == PS_FREE_SYNC_EVENT) {
        pool_streams_close_open_and_poll(&pool->streams);
    }
}

/* Gives free memory back down to `target` reserved bytes, DECAY_STEP at a
 * time: only what the newest passed barrier proved idle, no synchronize
 * and no wait (core/pool_growth.c); parked blocks merged first, and (an
 * idle pool) the threads' caches drained. The lock is let go between
 * steps; if an allocating thread took it meanwhile, the rest waits for a
 * later tick. Returns the bytes given back, the lock let go. */
static uint64_t give_back_idle_locked(pool_t *pool, uint64_t target, bool idle)
{
    uint64_t given = 0;
    ready_pending_locked(pool);
    pool_caches_flush(&pool->caches, &pool->lists);
    if (idle && pool->tcache)
        ps_tcache_drain_all_locked(pool->tcache);
    uint64_t passed = pool_newest_passed(pool->gpu);
    for (;;) {
        pool_lists_t *lists = &pool->lists;
        uint64_t step = lists->bytes_reserved > target + DECAY_STEP ? lists->bytes_reserved - DECAY_STEP : target;
        uint64_t started = ps_now_ns(), frees = lists->upstream_frees;
        uint64_t g = pool_growth_release_idle(&pool->growth, &pool->range, lists, step, passed);
        pool_decay_measure(lists->upstream_frees - frees, g, ps_now_ns() - started);
        given += g;
        if (!g || lists->bytes_reserved <= target)
            break;
        ps_unlock(&pool->lock);
        if (!ps_lock_try(&pool->lock))
            return given; /* an allocating thread came: the rest at a later tick */
    }
    ps_unlock(&pool->lock);
    return given;
}

/* The resource's decay entry (core/resource.h): a tick of the give-back
 * thread (decay_ns > 0), or a neighbour asking for about `want` bytes
 * (decay_ns 0). The lock is only tried: a busy pool skips the tick. */
static uint64_t pool_give_back_unneeded(ps_resource_t *r, uint64_t now_ns, uint64_t decay_ns, uint64_t want)
{
    pool_t *pool = (pool_t *)r;
    if (!pool->gpu || !ps_lock_try(&pool->lock))
        return 0;
    const pool_lists_t *lists = &pool->lists;
    if (decay_ns && pool_decay_quiet(&pool->decay, lists->blocks_taken) && pool_streams_pending(&pool->streams))
        ready_pending_locked(pool); /* its barrier will have passed when the window ends */
    pool_decay_view_t view = {lists->bytes_in_use, lists->bytes_reserved, lists->blocks_taken,
                              lists->upstream_allocs > lists->upstream_frees
                                  ? lists->upstream_allocs - lists->upstream_frees : 0};
    bool idle;
    uint64_t target = pool_decay_tick(&pool->decay, now_ns, decay_ns, &view, want, &idle);
    if (lists->bytes_reserved <= target) {
        ps_unlock(&pool->lock);
        return 0;
    }
    return give_back_idle_locked(pool, target, idle);
}

/* The program is destroying `stream`: the threads' caches come back
 * first (blocks cached on it join its list), then its list is retired
 * (core/pool_streams.c). */
static void pool_stream_destroyed(ps_resource_t *r, ps_stream_t stream)
{
    pool_t *pool = (pool_t *)r;
    if (!ps_reuse_stream_ordered(stream) || stream == PS_STREAM_LEGACY || stream == 0)
        return;
    ps_lock(&pool->lock);
    if (pool->tcache)
        ps_tcache_drain_all_locked(pool->tcache);
    pool_streams_destroyed(&pool->streams, &pool->lists, stream);
    ps_unlock(&pool->lock);
}

static void pool_destroy(ps_resource_t *r)
{
    pool_t *pool = (pool_t *)r;
    pool_streams_destroy(&pool->streams, pool->lists.owners_count);
    ps_tcache_destroy(pool->tcache); /* its blocks die with the chunks below */
    pool_expandable_destroy(&pool->range);
    pool_growth_destroy(&pool->growth, &pool->lists);
    pool_lists_destroy(&pool->lists);
    free(pool);
}

const ps_resource_ops_t pool_ops = {"pool", pool_allocate, pool_deallocate, pool_trim,
                                           pool_query, pool_destroy, pool_stream_destroyed,
                                           pool_device_synchronized, pool_give_back_unneeded};

/* ---- creation ---------------------------------------------------------- */

/* The initial reservation: one chunk of exactly that size, or (expandable)
 * that much mapped at the start of the range. */
static int grow_or_add_initial_locked(pool_t *pool, size_t initial, uint32_t *grown)
{
    if (pool->range.on)
        return grow_range_locked(pool, initial, grown);
    return pool_growth_add_chunk(&pool->growth, &pool->lists, initial, initial, grown);
}

bool ps_pool_is_expandable(ps_resource_t *r)
{
    return r && r->ops == &pool_ops && ((pool_t *)r)->range.on;
}

void ps_pool_options_default(ps_pool_options_t *opts)
{
    *opts = (ps_pool_options_t){
        .initial_size = 0,
        .maximum_size = 0,
        .min_chunk = 8 * PS_MiB,
        .max_chunk = PS_GiB,
        .growth_percent = 12,
        .alignment = MIN_ALIGNMENT,
        .free_sync = PS_FREE_SYNC_BARRIER,
        .epoch_wait_ns = 50000,
        .expandable = 1,
        .expandable_reserve = 0,
        .expandable_piece = 8 * PS_MiB,
        .expandable_map_first = 1,
        .expandable_run_min = PS_GiB,
        .expandable_setup_run_min = 0,
        .barrier_pending_percent = PS_REUSE_BARRIER_PENDING_PERCENT,
        .small_from_back = PS_MiB,
        .release_threshold = UINT64_MAX,
        .thread_cache = 16 * PS_MiB,
        .barrier_floor = 32 * PS_MiB,
        .remap = 1,
        .remap_turnover_percent = 100,
        .remap_lend = 1,
    };
}

/* PS_EINVAL, said for all but a bad chunk_granule, when options `o` of
 * pool `name` cannot make a pool over `gpu`. */
static int check_options(const char *name, const ps_pool_options_t *o, const ps_gpu_ops_t *gpu)
{
    if (o->chunk_granule && !ps_is_pow2(o->chunk_granule))
        return PS_EINVAL;
    if (!ps_is_pow2(o->alignment) || o->alignment < MIN_ALIGNMENT) {
        ps_error("pool '%s': alignment %zu is not a power of two >= %d", name, o->alignment, MIN_ALIGNMENT);
        return PS_EINVAL;
    }
    if (o->min_chunk > o->max_chunk || o->free_sync > PS_FREE_SYNC_BARRIER ||
        (o->maximum_size && o->initial_size > o->maximum_size)) {
        ps_error("pool '%s': bad options (min_chunk > max_chunk, initial_size > maximum_size, or "
                 "unknown free_sync)", name);
        return PS_EINVAL;
    }
    if (!gpu && o->free_sync != PS_FREE_SYNC_NONE) {
        ps_error("pool '%s': free_sync event/device needs the GPU-ops table", name);
        return PS_EINVAL;
    }
    return PS_OK;
}

int ps_pool_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                   const ps_pool_options_t *opts, ps_resource_t **out)
{
    ps_pool_options_t o;
    if (opts)
        o = *opts;
    else
        ps_pool_options_default(&o);
    if (!upstream || !out)
        return PS_EINVAL;
    int status = check_options(name ? name : "pool", &o, gpu);
    if (status != PS_OK)
        return status;
    pool_t *pool = aligned_alloc(_Alignof(pool_t), ps_align_up(sizeof *pool, _Alignof(pool_t))); /* (cache-line fields) */
    if (!pool)
        return PS_ENOMEM;
    memset(pool, 0, sizeof *pool);
    ps_resource_init(&pool->base, &pool_ops, name, upstream);
    pool->options = o;
    pool->gpu = gpu;
    pool_caches_init(&pool->caches, &pool->options, gpu, &pool->lists, &pool->streams);
    pool->eager_barrier = o.free_sync == PS_FREE_SYNC_BARRIER && o.barrier_pending_percent && gpu && gpu->barrier;
    pool_expandable_init(&pool->range, &pool->options, gpu, pool->base.name);
    pool_growth_init(&pool->growth, &pool->options, gpu, upstream, pool->base.name);
    /* (what the epochs release goes to the caches: the size stack or the ready list) */
    status = pool_streams_init(&pool->streams, &pool->options, gpu, pool_caches_release_pending, &pool->caches);
    int lists_status = pool_lists_init(&pool->lists, o.alignment, o.small_from_back); /* (destroy needs it made) */
    if (status == PS_OK)
        status = lists_status;
    if (status == PS_OK)
        status = pool_lists_reserve_descriptors(&pool->lists, 2);
    pool->lock = (ps_lock_t)PS_LOCK_INIT;
    if (status == PS_OK && o.thread_cache && gpu &&
        (o.free_sync == PS_FREE_SYNC_BARRIER || o.free_sync == PS_FREE_SYNC_NONE))
        status = ps_tcache_create(o.thread_cache, o.free_sync == PS_FREE_SYNC_NONE, &pool->streams.family, &pool->lock,
                                  tcache_give_back_locked, tcache_barrier, pool, &pool->tcache);
    if (pool->tcache)
        pool->tcache_max_block = ps_tcache_max_block(pool->tcache);
    if (status == PS_OK)
        pool_expandable_reserve_first_range(&pool->range, &pool->lists); /* (no lock yet: the pool is not shared) */
    if (status == PS_OK && o.expandable_map_first && !o.initial_size)
        map_first_piece_locked(pool);
    if (status == PS_OK && o.initial_size) {
        size_t initial = ps_align_up(o.initial_size, o.alignment);
        uint32_t grown;
        status = initial ? grow_or_add_initial_locked(pool, initial, &grown) : PS_ENOMEM;
    }
    if (status != PS_OK) {
        pool_destroy(&pool->base);
        return status;
    }
    *out = &pool->base;
    return PS_OK;
}

/* ---- test hooks (core/pool.h) ------------------------------------------ */

void ps_pool_test_skip_idle_check(int on)
{
    pool_expandable_test_skip_idle_check(on);
}

void ps_pool_test_return_lent_at_once(int on)
{
    pool_expandable_test_return_lent_at_once(on);
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

bool ps_pool_thread_cache_counters(ps_resource_t *r, uint64_t *hits, uint64_t *misses, uint64_t *barriers_asked)
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
    note_contention_locked(pool, count);
    ps_unlock(&pool->lock);
}

void ps_pool_thread_cache_always_engage(ps_resource_t *r)
{
    if (r->ops == &pool_ops && ((pool_t *)r)->tcache)
        ps_tcache_always_engage(((pool_t *)r)->tcache);
}

void ps_pool_decay_set_release_rate(uint64_t ns_per_run)
{
    pool_decay_set_rate(ns_per_run);
}

uint64_t ps_pool_decay_release_rate_default(void)
{
    return pool_decay_rate_default();
}
