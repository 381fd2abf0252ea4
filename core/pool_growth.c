/* Memory into and out of the pool (core/pool.c, steps 3c, 3e and 5): the
 * chunk table, growth by chunks, the bounds on growth, and giving memory
 * back. An expandable pool grows and unmaps through core/pool_expandable.c.
 *
 * Algorithm
 *  1. Growth (pool_grow_locked), never past maximum_size: an expandable
 *     pool maps what its range lacks (core/pool_expandable.c); otherwise
 *     one chunk of max(request rounded up to chunk_granule (2 MiB),
 *     clamp(reserved * growth_percent / 100, min_chunk, max_chunk)) bytes,
 *     halved down to the request while the upstream refuses. A new chunk
 *     is one ready free block of fresh (idle) memory.
 *  2. Growth bound (pending_wait_bytes / pending_wait_percent, off by
 *     default; the pinned host pool): while more bytes are pending than
 *     max(pending_wait_bytes, pending_wait_percent % of reserved), close
 *     the open epoch and host-wait the oldest, retrying after each: growth
 *     while the GPU lags stays bounded.
 *  3. Growth budget (grow_budget_percent, expandable; the pinned pool's
 *     host range): a growth must leave at most that % of the most bytes in
 *     use seen at a growth (in use + need) reserved. Over it, first
 *     host-wait pending blocks, oldest epoch first, retrying after each (a
 *     freed block that serves is cheaper than pieces given back and mapped
 *     again); then unmap free pieces, holes between live blocks before the
 *     rest, until reserved + need fits: merging alone leaves holes between
 *     live blocks as big as the blocks when few large ones live.
 *  4. Budget floor (grow_budget_min, with the growth budget under free_sync
 *     event; the pinned pool: 16 MiB): the budget is never below it, and
 *     near it the fences are amortized. A pinned block is reused only after
 *     a fence recorded after its free has completed (polled or host-waited,
 *     never a barrier), so with R bytes not in use and blocks of b bytes a
 *     free/alloc loop needs at least one fence per R / b pairs; at the bare
 *     budget (R = one 2 MiB piece for one live 1 MiB block) every second
 *     pair recorded a fence and spun on it.
 *     a. Under the floor (reserved + request fit in it): no growth bound
 *        and no spin on a just-closed epoch; the open epoch is closed
 *        (recorded) only when no fence is outstanding, and the pool grows.
 *        Pieces stay mapped, so the floor is reached once.
 *     b. At the floor with a fence outstanding, an exhaustion polls that
 *        older fence (for up to epoch_wait_ns) rather than recording and
 *        spinning on a newer one; without one, as before.
 *     c. At the floor, a free closes the open epoch once it holds half of
 *        the memory not in use (pool_fence_batch_locked): that fence passes
 *        on the GPU while the other half serves, so the next exhaustion
 *        usually finds it passed (one query, no spin), and batches settle
 *        at half the floor whatever they were.
 *     Over the floor nothing changes (budget waits, giving pieces back); a
 *     program holding more than the floor / 1.1 never sees it.
 *  5. Giving back (out of memory, trim, release_threshold:
 *     pool_release_free_chunks_locked): wholly free ready chunks go to the
 *     upstream; in a range, after a device synchronize, every whole run
 *     inside a ready free block is unmapped, leaving an UNMAPPED block. The
 *     decay's give-back (pool_release_idle_locked) takes only memory the
 *     GPU has provably finished with, idle at the newest barrier it passed,
 *     and never synchronizes.
 * Guarantees: reserved never passes maximum_size; growth by a chunk leaves
 * the pool as it was when the upstream refuses; memory goes back only when
 * no kernel can still touch it (a device synchronize, a passed barrier
 * that released it, or, in the pinned range, a completed fence); a chunk
 * the upstream refuses back stays in the pool.
 */
#include "pool_internal.h"

#include <stdlib.h>

/* ---- chunks ------------------------------------------------------------ */

/* Takes one chunk of `chunk_size` bytes from the upstream into the ready
 * list; *grown = its block. Needs one reserved descriptor. */
int pool_add_chunk_locked(pool_t *pool, size_t chunk_size, size_t need, uint32_t *grown)
{
    uint32_t slot;
    if (pool_lists_chunk_slot(&pool->lists, &slot) != PS_OK)
        return PS_ENOMEM;
    void *base;
    int status = ps_allocate(pool->base.upstream, chunk_size, PS_STREAM_NONE, &base);
    if (status != PS_OK)
        return status;
    size_t alignment = pool->options.alignment;
    uintptr_t addr = ((uintptr_t)base + alignment - 1) & ~(uintptr_t)(alignment - 1);
    size_t usable = (chunk_size - (addr - (uintptr_t)base)) & ~(alignment - 1);
    if (addr - (uintptr_t)base >= chunk_size || usable < need) {
        ps_deallocate(pool->base.upstream, base, chunk_size, PS_STREAM_NONE);
        return PS_ENOMEM; /* the upstream's alignment is too small for this request */
    }
    uint32_t index = pool_lists_add_chunk(&pool->lists, slot, &(pool_chunk_t){base, chunk_size, addr, usable, NIL, NULL});
    pool_lists_insert(&pool->lists, OWNER_READY, index); /* fresh memory */
    pool_lists_count_growth(&pool->lists, usable, 1);
    *grown = index;
    return PS_OK;
}

/* Step c: grows by one chunk big enough for `need` bytes, or (expandable)
 * maps what is missing; *grown = the ready block that now fits. */
int pool_grow_chunks_locked(pool_t *pool, size_t need, uint32_t *grown)
{
    const ps_pool_options_t *o = &pool->options;
    size_t step = (size_t)(pool->lists.bytes_reserved / 100 * o->growth_percent +
                           pool->lists.bytes_reserved % 100 * o->growth_percent / 100);
    if (step < o->min_chunk)
        step = o->min_chunk;
    if (step > o->max_chunk)
        step = o->max_chunk;
    size_t chunk_size = ps_align_up(need, o->chunk_granule ? o->chunk_granule : GROWTH_GRANULE);
    if (!chunk_size)
        return PS_ENOMEM;
    if (chunk_size < step)
        chunk_size = step;
    chunk_size = ps_align_up(chunk_size, o->alignment);
    if (o->maximum_size) {
        size_t room = pool->lists.bytes_reserved >= o->maximum_size ? 0 : o->maximum_size - pool->lists.bytes_reserved;
        room &= ~(o->alignment - 1);
        if (room < need)
            return PS_ENOMEM;
        if (chunk_size > room)
            chunk_size = room;
    }
    for (;;) {
        int status = pool_add_chunk_locked(pool, chunk_size, need, grown);
        if (status == PS_OK || chunk_size == need)
            return status;
        size_t half = ps_align_up(chunk_size / 2, o->alignment);
        chunk_size = half > need ? half : need;
    }
}

/* ---- the growth bound and the growth budget ---------------------------- */

/* The growth bound allowed now: max(pending_wait_bytes, pending_wait_percent % of reserved). */
static uint64_t pending_bound_locked(const pool_t *pool)
{
    uint64_t share = pool->lists.bytes_reserved / 100 * pool->options.pending_wait_percent;
    return share > pool->options.pending_wait_bytes ? share : pool->options.pending_wait_bytes;
}

/* Step c's bound: while more bytes are pending than the bound allows,
 * host-wait the oldest epoch and retry. PS_OK: served from released
 * blocks; PS_ENOMEM: go on and grow. */
int pool_wait_pending_over_bound_locked(pool_t *pool, size_t need, void **out)
{
    if (pool->reuse.bytes_pending <= pending_bound_locked(pool))
        return PS_ENOMEM;
    ps_reuse_close_or_sync(&pool->reuse);
    if (pool_try_ready_locked(pool, need, out) == PS_OK) /* the fallback may have freed blocks */
        return PS_OK;
    while (pool->reuse.closed_count && pool->reuse.bytes_pending > pending_bound_locked(pool)) {
        ps_reuse_wait_oldest(&pool->reuse);
        pool->pending_waits++;
        if (pool_try_ready_locked(pool, need, out) == PS_OK)
            return PS_OK;
    }
    return PS_ENOMEM;
}

/* Step c, grow_budget_percent (expandable): the growth must leave at most
 * budget = grow_budget_percent % of the most bytes in use seen at a growth
 * (in use now + need included) reserved. Over it, first host-wait pending
 * blocks, oldest epoch first (counted in pending_waits), retrying after
 * each: a freed block may serve the request, which is cheaper than giving
 * pieces back and mapping new ones (docs/benchmarks.md, "The pool's design
 * choices"); then unmap free pieces, holes between live blocks before the
 * rest, until reserved + need fits. PS_OK: served from released blocks;
 * PS_ENOMEM: go on and grow. */
int pool_fit_budget_locked(pool_t *pool, size_t need, void **out)
{
    uint64_t high = pool->lists.bytes_in_use + need;
    if (high > pool->in_use_high)
        pool->in_use_high = high;
    uint64_t budget = pool->in_use_high / 100 * pool->options.grow_budget_percent +
                      pool->in_use_high % 100 * pool->options.grow_budget_percent / 100;
    if (budget < pool->options.grow_budget_min) /* the floor (step 4) */
        budget = pool->options.grow_budget_min;
    uint64_t keep = budget > need ? budget - need : 0;
    if (pool->lists.bytes_reserved <= keep)
        return PS_ENOMEM;
    if (pool->gpu && pool->reuse.bytes_pending) {
        ps_reuse_close_or_sync(&pool->reuse);
        if (pool_try_ready_locked(pool, need, out) == PS_OK)
            return PS_OK;
        while (pool->reuse.closed_count) {
            ps_reuse_wait_oldest(&pool->reuse);
            pool->pending_waits++;
            if (pool_try_ready_locked(pool, need, out) == PS_OK)
                return PS_OK;
        }
    }
    pool_release_free_chunks_locked(pool, keep);
    return PS_ENOMEM;
}

/* ---- the budget floor (step 4) ----------------------------------------- */

/* Step 4: the floor is on (grow_budget_min, over the growth budget of a
 * range whose blocks wait for fences) and no more than it is reserved. */
static int pool_at_budget_min_locked(const pool_t *pool)
{
    return pool->options.grow_budget_min && pool->range.on && pool->options.grow_budget_percent &&
           pool->options.free_sync == PS_FREE_SYNC_EVENT && pool->gpu &&
           pool->lists.bytes_reserved <= pool->options.grow_budget_min;
}

/* Step 4: ... and reserved + `need` fit in it. */
int pool_under_budget_min_locked(const pool_t *pool, size_t need)
{
    return pool_at_budget_min_locked(pool) && need <= pool->options.grow_budget_min - pool->lists.bytes_reserved;
}

/* Step b of core/pool.c (close the open epoch and poll its fence for up to
 * epoch_wait_ns), with the floor's amortization (step 4): under the floor
 * a new fence is recorded only when none is outstanding, and not polled
 * (the pool grows meanwhile); at the floor with a fence outstanding, that
 * older fence is polled rather than a newer one recorded. Returns how many
 * epochs were released. */
int pool_close_and_poll_locked(pool_t *pool, size_t need)
{
    ps_reuse_t *r = &pool->reuse;
    if (!pool_at_budget_min_locked(pool))
        return ps_reuse_close_and_poll(r, pool->options.epoch_wait_ns);
    if (pool_under_budget_min_locked(pool, need)) {
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

/* Step 4c, after a block of `freed` bytes joined the open epoch: at the
 * floor (another such block could not grow the pool), once the open epoch
 * holds half of the memory not in use, close it: its fence passes on the
 * GPU while the other half serves. (A closed epoch may still be listed:
 * its fence has often passed, but nobody polls on the free path.) */
void pool_fence_batch_locked(pool_t *pool, size_t freed)
{
    ps_reuse_t *r = &pool->reuse;
    if (!pool_at_budget_min_locked(pool) || pool_under_budget_min_locked(pool, freed))
        return;
    if (r->open.bytes * 2 >= pool->lists.bytes_reserved - pool->lists.bytes_in_use)
        ps_reuse_close(r); /* no fence: the next exhaustion closes it as before */
}

/* ---- giving memory back ------------------------------------------------ */

/* Gives chunk `slot` (not a range) back to the upstream when it is one
 * ready free block idle at `passed` (IDLE_NEVER: the device was
 * synchronized); a refusal keeps it, said with a warning when `warn`. */
static void give_chunk_back_locked(pool_t *pool, uint32_t slot, uint64_t passed, int warn)
{
    pool_chunk_t *chunk = &pool->lists.chunks[slot];
    uint32_t index = chunk->first_block;
    pool_block_t *b = &pool->lists.blocks[index];
    if (b->state != BLOCK_FREE || b->owner != OWNER_READY || b->next_phys != NIL ||
        (passed != IDLE_NEVER && b->idle_gen > passed))
        return;
    if (ps_deallocate(pool->base.upstream, chunk->base, chunk->base_size, PS_STREAM_NONE) != PS_OK) {
        if (warn)
            ps_warning("pool '%s': the upstream refused a chunk back; keeping it", pool->base.name);
        return;
    }
    pool_lists_drop_chunk(&pool->lists, slot);
}

/* Gives wholly free chunks of the ready list back to the upstream (and,
 * expandable, unmaps free pieces) until at most `keep` bytes are reserved. */
void pool_release_free_chunks_locked(pool_t *pool, uint64_t keep)
{
    pool_quick_flush_locked(pool);
    for (uint32_t slot = 0; slot < pool->lists.chunks_count && pool->lists.bytes_reserved > keep; slot++)
        if (pool->lists.chunks[slot].base && !pool->lists.chunks[slot].range)
            give_chunk_back_locked(pool, slot, IDLE_NEVER, 1);
    pool_lists_trim_chunks(&pool->lists);
    if (pool->range.on)
        pool_expandable_unmap_free_pieces(&pool->range, &pool->lists, keep);
}

/* The decay's give-back (core/pool_decay.c): like
 * pool_release_free_chunks_locked down to `keep` reserved bytes, but only
 * memory the GPU has provably finished with, with no device synchronize:
 * wholly free chunks and whole runs inside ready free blocks whose idle
 * generation is at most `passed` (the newest barrier the GPU passed), and
 * first the lent addresses idle at `passed` (a piece is unmapped only
 * after its lent twin: core/pool_expandable.c, step 6). Returns the bytes
 * given back. */
uint64_t pool_release_idle_locked(pool_t *pool, uint64_t keep, uint64_t passed)
{
    uint64_t before = pool->lists.bytes_reserved;
    if (pool->range.lent_head != NIL && !pool_expandable_return_lent(&pool->range, &pool->lists, passed))
        passed = IDLE_NOW; /* a twin stayed mapped: only memory idle now (never lent) may go */
    for (uint32_t slot = 0; slot < pool->lists.chunks_count && pool->lists.bytes_reserved > keep; slot++) {
        pool_chunk_t *chunk = &pool->lists.chunks[slot];
        if (!chunk->base)
            continue;
        if (!chunk->range) { /* a chunk goes back whole, when wholly free and idle */
            give_chunk_back_locked(pool, slot, passed, 0);
            continue;
        }
        for (uint32_t index = chunk->first_block, next; index != NIL && pool->lists.bytes_reserved > keep; index = next) {
            next = pool->lists.blocks[index].next_phys;
            uintptr_t lo, hi;
            if (pool->lists.blocks[index].idle_gen > passed || !pool_expandable_whole_pieces(&pool->lists, chunk->range, index, &lo, &hi))
                continue;
            hi = pool_expandable_runs_for(chunk->range, lo, hi, pool->lists.bytes_reserved - keep); /* no more than needed */
            if (pool_lists_reserve_descriptors(&pool->lists, 2) != PS_OK)
                break;
            pool_expandable_unmap_block_pieces(&pool->range, &pool->lists, slot, index, lo, hi, NULL, &next);
        }
    }
    pool_lists_trim_chunks(&pool->lists);
    return before - pool->lists.bytes_reserved;
}
