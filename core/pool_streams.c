/* Stream-ordered free lists, the cudaFreeAsync model (core/pool.c, steps
 * 3 and 4): an owner per stream with TLSF lists of its own, and what moves
 * blocks from one owner to another: stealing, fences, the barrier, a
 * destroyed stream, a flush. (The cudaFree rule, epochs, is core/reuse.c's.)
 *
 * Algorithm
 *  1. A stream used by cudaMallocAsync/cudaFreeAsync gets an owner on first
 *     use: an owner of the lists (core/pool_lists.h), found through a stream -> owner map
 *     behind a one-entry cache; owners of destroyed streams are reused. The
 *     legacy default stream's two handles share one owner. The per-thread
 *     default stream (PS_STREAM_PER_THREAD) gets none: one handle names
 *     another stream on every thread, so its allocations and frees take
 *     the cudaFree path (epochs), whose fence on the legacy stream covers
 *     the blocking per-thread streams.
 *  2. A free on stream s joins s's lists at once, stamped with the pool's
 *     free counter, merging with free neighbours of s only.
 *  3. Steal: an allocation on s that neither s's lists nor the ready list
 *     can serve takes the lists of a stream t that holds a fitting block,
 *     through core/reuse.c's handoff (step 10): a fence recorded on t now,
 *     s waits for it on the GPU, and t's blocks move to s.
 *  4. Poll (a cudaMalloc that nothing ready fits): each stream list gets one
 *     lazily recorded fence; once it completed (queried, or host-waited
 *     under memory pressure: reuse's fence handoff to PS_STREAM_NONE), the
 *     blocks freed before it move to the ready list.
 *  5. Barrier (free_sync barrier, step B): one device-wide barrier
 *     (core/reuse.c) releases every epoch and moves every stream's blocks
 *     to the ready list, idle once that barrier has passed; the lazy fences
 *     are released.
 *  6. A destroyed stream: while its handle is still valid, its blocks are
 *     retired as a closed epoch under a fence recorded on every stream (a
 *     device synchronize without one); its owner is then reused, and the
 *     dead handle never reaches a fence again.
 *  7. Flush (trim, release_threshold): every epoch and every stream list is
 *     closed and host-waited; all free memory ends in the ready list.
 * Guarantees: a block freed on stream s goes to another stream only after
 * that stream waits on a fence recorded on s after the free, and to a
 * cudaMalloc only after such a fence completed (conservative: a block freed
 * before a fence that merges with one freed after it waits for a later
 * fence); moving a stream's blocks is O(its blocks), off the hot path.
 */
#include "pool_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- owners ------------------------------------------------------------ */

/* The owner index of `stream`, created on first use. */
int pool_owner_of_stream_locked(pool_t *pool, ps_stream_t stream, uint32_t *out)
{
    if (stream == PS_STREAM_LEGACY)
        stream = 0; /* both handles name the legacy default stream */
    if (stream == pool->last_stream) {
        *out = pool->last_owner;
        return PS_OK;
    }
    uint64_t found;
    if (!ps_ptr_map_get(&pool->stream_owners, stream, &found)) {
        if (pool->lists.owners_count >= MAX_OWNERS)
            return PS_ENOMEM;
        if (pool->lists.owners_count == pool->stream_side_capacity) {
            uint32_t capacity = pool->stream_side_capacity * 2;
            pool_stream_owner_t *bigger = realloc(pool->stream_side, capacity * sizeof *bigger);
            if (!bigger)
                return PS_ENOMEM;
            pool->stream_side = bigger;
            pool->stream_side_capacity = capacity;
        }
        if (ps_ptr_map_reserve(&pool->stream_owners, 1) != PS_OK)
            return PS_ENOMEM;
        if (pool->dead_count) { /* an owner of a destroyed stream: empty, no fence */
            found = pool->dead_owners[--pool->dead_count];
        } else {
            uint32_t index;
            if (pool_lists_add_owner(&pool->lists, &index) != PS_OK)
                return PS_ENOMEM;
            found = index;
        }
        pool->stream_side[found] = (pool_stream_owner_t){stream, NULL, 0};
        ps_ptr_map_put(&pool->stream_owners, stream, found);
    }
    pool->last_stream = stream;
    pool->last_owner = (uint32_t)found;
    *out = (uint32_t)found;
    return PS_OK;
}

/* Moves `from`'s free blocks with free_stamp <= max_stamp into `to`'s
 * lists (stamp `new_stamp`, idle generation `idle`), coalescing there. */
static void owner_move_blocks(pool_t *pool, uint32_t from, uint32_t to, uint64_t max_stamp,
                              uint64_t new_stamp, uint64_t idle)
{
    pool_owner_t *owner = pool->lists.owners[from];
    uint64_t fl_map = owner->fl_bitmap;
    while (fl_map) {
        unsigned fl = (unsigned)__builtin_ctzll(fl_map);
        fl_map &= fl_map - 1;
        uint32_t sl_map = owner->sl_bitmap[fl];
        while (sl_map) {
            unsigned sl = (unsigned)__builtin_ctz(sl_map);
            sl_map &= sl_map - 1;
            for (uint32_t index = owner->heads[fl][sl], next; index != NIL; index = next) {
                next = pool->lists.blocks[index].next_free;
                if (pool->lists.blocks[index].free_stamp > max_stamp)
                    continue;
                pool_lists_remove(&pool->lists, index);
                pool_lists_release(&pool->lists, index, to, new_stamp, idle);
            }
        }
    }
}

/* ---- fences and stealing ----------------------------------------------- */

/* For a cudaMalloc: stream lists whose fence completed move to the ready
 * list. record: record a fence on lists that have none; wait: host-wait it
 * (memory pressure). Returns how many lists moved. */
int pool_poll_stream_lists_locked(pool_t *pool, int record, int wait)
{
    int moved = 0;
    for (uint32_t o = 1; o < pool->lists.owners_count; o++) {
        pool_stream_owner_t *side = &pool->stream_side[o];
        if (!pool->lists.owners[o]->free_blocks)
            continue;
        if (!side->fence) {
            if (!record || pool->gpu->fence_record(pool->gpu->ctx, side->stream, &side->fence) != PS_OK)
                continue;
            pool->fences_recorded++;
            side->fence_stamp = pool->free_counter;
        }
        int status = wait ? ps_reuse_fence_handoff(pool->gpu, side->fence, PS_STREAM_NONE, &pool->fence_waits)
                          : pool->gpu->fence_query(pool->gpu->ctx, side->fence);
        if (status != PS_OK)
            continue;
        owner_move_blocks(pool, o, OWNER_READY, side->fence_stamp, 0, IDLE_NOW); /* the fence completed */
        pool->gpu->fence_release(pool->gpu->ctx, side->fence);
        side->fence = NULL;
        moved++;
    }
    return moved;
}

/* For an allocation on stream owner `to`: steals the list of another
 * stream that has a fitting block (reuse's handoff: a fence on that stream
 * now, `to`'s stream waits for it; refused or failed, the next stream is
 * tried). Returns 1 if blocks moved. */
int pool_steal_stream_list_locked(pool_t *pool, uint32_t to, size_t size)
{
    for (uint32_t o = 1; o < pool->lists.owners_count; o++) {
        if (o == to || pool_lists_find(&pool->lists, pool->lists.owners[o], size) == NIL)
            continue;
        if (ps_reuse_stream_handoff(pool->gpu, pool->stream_side[o].stream, pool->stream_side[to].stream,
                                    &pool->fences_recorded, NULL) != PS_OK)
            continue;
        owner_move_blocks(pool, o, to, UINT64_MAX, ++pool->free_counter, IDLE_NEVER);
        return 1;
    }
    return 0;
}

/* ---- the barrier (free_sync barrier) ----------------------------------- */

/* Whether a barrier could help before growing: something is pending
 * (epochs, other streams' lists). Even when pending and ready memory
 * together are smaller than the request, releasing them first lets the
 * growth merge with them instead of leaving them as holes (test
 * pool_barrier/growth_merges_with_blocks_a_barrier_released); a barrier
 * costs a microsecond or a few, a growth more. */
int pool_anything_pending_locked(const pool_t *pool)
{
    if (pool->reuse.bytes_pending)
        return 1;
    for (uint32_t o = 1; o < pool->lists.owners_count; o++)
        if (pool->lists.owners[o]->free_bytes)
            return 1;
    return 0;
}

/* Step B: one device-wide barrier; on success every pending block (closed
 * and open epochs, every stream's list) joins the ready list. Returns 1
 * when the barrier was issued. */
int pool_barrier_release_locked(pool_t *pool)
{
    const ps_gpu_ops_t *gpu = pool->gpu;
    uint64_t pending = pool->reuse.bytes_pending;
    /* (numbered in pool->family: cached blocks freed before it are ready too) */
    if (!ps_reuse_barrier(&pool->reuse)) /* refused: epochs stay, the caller goes on with them */
        return 0;
    pool_expandable_earn(&pool->range, &pool->lists, pending);
    for (uint32_t o = 1; o < pool->lists.owners_count; o++) {
        if (pool->lists.owners[o]->free_blocks) /* idle once this barrier passed */
            owner_move_blocks(pool, o, OWNER_READY, UINT64_MAX, 0, pool->reuse.release_idle);
        pool_stream_owner_t *side = &pool->stream_side[o];
        if (side->fence) {
            gpu->fence_release(gpu->ctx, side->fence);
            side->fence = NULL;
        }
    }
    return 1;
}

/* ---- epochs near the budget floor -------------------------------------- */

/* Closes the open epoch and polls its fence for up to epoch_wait_ns, with
 * the budget floor's amortization (core/pool_growth.c): under the floor
 * (`floor`, for the request) a new fence is recorded only when none is
 * outstanding, and not polled (the pool grows meanwhile); at the floor
 * with a fence outstanding, that older fence is polled rather than a newer
 * one recorded. Returns how many epochs were released. */
int pool_close_and_poll_locked(pool_t *pool, pool_budget_floor_t floor)
{
    ps_reuse_t *r = &pool->reuse;
    if (floor == POOL_FLOOR_NONE)
        return ps_reuse_close_and_poll(r, pool->options.epoch_wait_ns);
    if (floor == POOL_FLOOR_UNDER) {
        if (!r->closed_count && r->open.count)
            ps_reuse_close(r); /* runs on the GPU while the pool grows */
        return 0;
    }
    if (!r->closed_count)
        return ps_reuse_close_and_poll(r, pool->options.epoch_wait_ns);
    const ps_gpu_ops_t *gpu = pool->gpu;
    ps_fence_t *oldest = r->closed[r->closed_head].fence;
    if (gpu->fence_query(gpu->ctx, oldest) != PS_OK && pool->options.epoch_wait_ns) {
        uint64_t deadline = ps_now_ns() + pool->options.epoch_wait_ns;
        while (gpu->fence_query(gpu->ctx, oldest) != PS_OK && ps_now_ns() < deadline)
            ;
    }
    return ps_reuse_poll(r);
}

/* After a block joined the open epoch, `floor` standing for its size: at
 * the floor (another such block could not grow the pool), once the open
 * epoch holds half of the memory not in use, close it: its fence passes
 * on the GPU while the other half serves, so the next exhaustion usually
 * finds it passed, and batches settle at half the floor. (A closed epoch
 * may still be listed: its fence has often passed, but nobody polls on
 * the free path.) */
void pool_fence_batch_locked(pool_t *pool, pool_budget_floor_t floor)
{
    ps_reuse_t *r = &pool->reuse;
    if (floor != POOL_FLOOR_AT)
        return;
    if (r->open.bytes * 2 >= pool->lists.bytes_reserved - pool->lists.bytes_in_use)
        ps_reuse_close(r); /* no fence: the next exhaustion closes it as before */
}

/* ---- flush and destroyed streams --------------------------------------- */

/* Closes and host-waits every epoch and every stream list; afterwards all
 * free memory is in the ready list. */
void pool_flush_all_locked(pool_t *pool)
{
    if (!pool->gpu)
        return;
    ps_reuse_flush(&pool->reuse);
    for (int round = 0; round < 2; round++) /* the 2nd round covers blocks freed after an old lazy fence */
        pool_poll_stream_lists_locked(pool, 1, 1);
}

/* The program is destroying `stream`. Its free list must never be reached
 * through the dead handle again (a fence recorded on a destroyed stream
 * crashes the driver). While the handle is still valid, its blocks are
 * retired as a closed epoch under a fence recorded now on every stream
 * (they become ready once the stream's work is done); then the owner is
 * recycled for the next new stream. Without a fence: synchronize. */
void pool_stream_destroyed(ps_resource_t *r, ps_stream_t stream)
{
    pool_t *pool = (pool_t *)r;
    if (!ps_reuse_stream_ordered(stream) || stream == PS_STREAM_LEGACY || stream == 0)
        return;
    ps_lock(&pool->lock);
    if (pool->tcache)
        ps_tcache_drain_all_locked(pool->tcache); /* blocks cached on `stream` join its list first */
    uint64_t found;
    if (!ps_ptr_map_remove(&pool->stream_owners, stream, &found)) {
        ps_unlock(&pool->lock);
        return;
    }
    if (pool->last_stream == stream)
        pool->last_stream = PS_STREAM_NONE;
    uint32_t o = (uint32_t)found;
    pool_owner_t *owner = pool->lists.owners[o];
    pool_stream_owner_t *side = &pool->stream_side[o];
    if (owner->free_blocks) {
        /* gather the stream's blocks as pending, in a side list */
        ps_reuse_list_t retired = {0};
        int synced = 0;
        while (owner->fl_bitmap) {
            unsigned fl = (unsigned)__builtin_ctzll(owner->fl_bitmap);
            unsigned sl = (unsigned)__builtin_ctz(owner->sl_bitmap[fl]);
            uint32_t index = owner->heads[fl][sl];
            pool_lists_remove(&pool->lists, index);
            pool->lists.blocks[index].state = BLOCK_PENDING;
            if (ps_reuse_list_push(&retired, index, pool->lists.blocks[index].size) != PS_OK) {
                /* no host memory for the list: this block is safe after a device sync */
                synced = synced || pool->gpu->device_synchronize(pool->gpu->ctx) == PS_OK;
                pool_lists_release(&pool->lists, index, OWNER_READY, 0, synced ? IDLE_NOW : IDLE_NEVER);
            }
        }
        /* one fence on every stream, this one included (it is still
         * tracked, and the legacy stream covers blocking streams); without
         * one, a device synchronize */
        ps_reuse_retire(&pool->reuse, &retired, PS_STREAM_NONE);
    }
    if (side->fence) {
        pool->gpu->fence_release(pool->gpu->ctx, side->fence);
        side->fence = NULL;
    }
    side->stream = PS_STREAM_NONE;
    uint32_t *grown = realloc(pool->dead_owners, (pool->dead_count + 1) * sizeof *grown);
    if (grown) { /* without room the owner is simply never reused */
        pool->dead_owners = grown;
        pool->dead_owners[pool->dead_count++] = o;
    }
    ps_unlock(&pool->lock);
}
