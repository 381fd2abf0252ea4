/* Parked blocks (core/pool_caches.h): freed blocks the pool holds
 * unmerged in front of its lists, counted as free, and the blocks the
 * threads' caches take and give back.
 *
 * Algorithm
 *  1. Quick cache (free_sync none): a free to the ready list parks the
 *     block in one of QUICK_SLOTS slots chosen by its size, evicting (into
 *     the lists) the block parked there before; an allocation of exactly
 *     that size takes it back without touching the lists.
 *  2. Size stack: blocks a barrier or a completed fence releases, in a pool
 *     of at most twice barrier_floor, or of at most small_from_back bytes
 *     in a pool of any size, are parked unmerged on a stack of one size, up
 *     to STACK_MAX (a floor's worth of 32 KiB blocks, which one barrier in
 *     a pool at the floor releases), newest first; an allocation of
 *     exactly that size pops one. A released block or a request of another
 *     size first merges the stack into the lists: at most one size waits
 *     unmerged. Newest first is kept from big blocks in big pools, where
 *     it would cost peak memory that good fit saves.
 *  3. Every slow path, trim and check merges both into the lists first.
 *  4. Thread caches: a locked allocation refills the thread's bin with a
 *     few ready blocks of its size; blocks come back as used blocks: ready
 *     ones (a barrier covered their free) to the ready list, idle at the
 *     newest barrier issued, the others as their free would have gone
 *     (their stream's list, or the open epoch).
 * Guarantees: a parked block is free in every count (bytes_free,
 * largest_free_block) and goes only to a request of exactly its size; a
 * block comes back from a thread cache only as its free allows; a refill
 * never grows the pool.
 */
#include "pool_caches.h"

void pool_caches_init(pool_caches_t *caches, const ps_pool_options_t *options, const ps_gpu_ops_t *gpu,
                      pool_lists_t *lists, const pool_streams_t *streams)
{
    caches->options = options;
    caches->gpu = gpu;
    caches->lists = lists;
    caches->streams = streams;
    caches->stack_small = options->small_from_back;
    caches->stack_reserved = 2 * (uint64_t)options->barrier_floor;
    for (uint32_t slot = 0; slot < QUICK_SLOTS; slot++)
        caches->quick[slot] = NIL;
    caches->quick_mask = 0;
    caches->stack_head = NIL;
    caches->stack_count = 0;
    caches->stack_size = 0;
    caches->alignment_log2 = (unsigned)__builtin_ctzll(options->alignment);
}

/* ---- the quick cache and the size stack -------------------------------- */

/* Parks block `index`, released with idle generation `idle`, on the size
 * stack (the caller emptied a stack of another size). */
static inline void stack_push(pool_caches_t *caches, pool_lists_t *lists, uint32_t index, uint64_t idle)
{
    pool_lists_park(lists, index, idle);
    lists->blocks[index].next_free = caches->stack_head;
    caches->stack_head = index;
    caches->stack_count++;
    caches->stack_size = lists->blocks[index].size;
}

void pool_caches_flush_stack(pool_caches_t *caches, pool_lists_t *lists)
{
    while (caches->stack_head != NIL) {
        uint32_t index = caches->stack_head;
        caches->stack_head = lists->blocks[index].next_free;
        pool_lists_unpark(lists, index);
    }
    caches->stack_count = 0;
}

void pool_caches_flush(pool_caches_t *caches, pool_lists_t *lists)
{
    pool_caches_flush_stack(caches, lists);
    while (caches->quick_mask) {
        uint32_t slot = (uint32_t)__builtin_ctz(caches->quick_mask);
        uint32_t index = caches->quick[slot];
        caches->quick_mask &= caches->quick_mask - 1;
        caches->quick[slot] = NIL;
        pool_lists_unpark(lists, index);
    }
}

void pool_caches_release_pending(void *owner, uint64_t item)
{
    pool_caches_t *caches = owner;
    pool_lists_t *lists = caches->lists;
    uint32_t index = (uint32_t)item;
    uint64_t idle = pool_streams_release_idle(caches->streams);
    size_t size = lists->blocks[index].size;
    if (caches->stack_count && size != caches->stack_size)
        pool_caches_flush_stack(caches, lists); /* one size at a time */
    if (caches->stack_count < STACK_MAX && (size <= caches->stack_small || lists->bytes_reserved <= caches->stack_reserved))
        stack_push(caches, lists, index, idle);
    else
        pool_lists_release(lists, index, OWNER_READY, 0, idle);
}

uint64_t pool_caches_largest_parked(const pool_caches_t *caches, const pool_lists_t *lists)
{
    uint64_t largest = 0;
    for (uint32_t parked = caches->stack_head; parked != NIL; parked = lists->blocks[parked].next_free) {
        uint32_t below = lists->blocks[parked].prev_phys;
        if (below != NIL && lists->blocks[below].state == BLOCK_CACHED)
            continue; /* its run is counted from a parked block before it */
        uint64_t run = pool_lists_ready_run(lists, parked);
        if (run > largest)
            largest = run;
    }
    for (uint32_t mask = caches->quick_mask; mask; mask &= mask - 1) {
        uint64_t run = pool_lists_ready_run(lists, caches->quick[__builtin_ctz(mask)]);
        if (run > largest)
            largest = run;
    }
    return largest;
}

/* ---- the threads' caches (core/thread_cache.c) ------------------------- */

void pool_caches_refill(pool_lists_t *lists, ps_tcache_t *tcache, size_t need, size_t room)
{
    uintptr_t addrs[8];
    size_t count = 0;
    if (room > 8)
        room = 8;
    if (pool_lists_reserve_descriptors(lists, (uint32_t)room + 1) != PS_OK ||
        ps_ptr_map_reserve(&lists->in_use, room) != PS_OK)
        return;
    while (count < room) {
        uint32_t index = pool_lists_find_ready(lists, need);
        if (index == NIL)
            break;
        addrs[count++] = lists->blocks[pool_lists_take(lists, index, need)].addr;
    }
    if (count)
        ps_tcache_refill_locked(tcache, need, addrs, count);
}

/* The idle generation of a ready one under free_sync barrier: a refill
 * kept the one it had in the ready list (pool_lists_take copies it), and a
 * freed block a barrier covered was covered by a barrier issued by now, so
 * the max of its descriptor's and the newest barrier's number is never too
 * early; otherwise (free_sync none: a kernel may still use it) IDLE_NEVER. */
void pool_caches_give_back(pool_caches_t *caches, pool_streams_t *streams, pool_lists_t *lists,
                           const ps_tcache_block_t *blocks, size_t count)
{
    const ps_gpu_ops_t *gpu = caches->gpu;
    uint64_t newest = IDLE_NEVER;
    if (caches->options->free_sync == PS_FREE_SYNC_BARRIER && gpu && gpu->barrier_generation && gpu->barrier_passed)
        newest = gpu->barrier_generation(gpu->ctx);
    for (size_t i = 0; i < count; i++) {
        uint32_t index, stream_owner;
        if (!pool_lists_unuse(lists, blocks[i].addr, &index))
            continue; /* cannot happen: cached blocks stay in the in-use map */
        uint64_t idle = lists->blocks[index].idle_gen > newest ? lists->blocks[index].idle_gen : newest;
        if (blocks[i].ready)
            pool_lists_release(lists, index, OWNER_READY, 0, idle);
        else if (ps_reuse_stream_ordered(blocks[i].stream) &&
                 pool_streams_owner_of(streams, lists, blocks[i].stream, &stream_owner) == PS_OK)
            pool_streams_free_on(streams, lists, index, stream_owner);
        else if (pool_streams_defer(streams, lists, index) != PS_OK) /* short of host OOM and a dead device */
            pool_lists_reuse(lists, blocks[i].addr, index);
    }
}
