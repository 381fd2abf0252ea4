/* The pool's blocks and free lists (core/pool.c, steps 1 and 2): block
 * descriptors, TLSF lists, splitting and merging. The types, and the
 * helpers every allocation and free runs (inline), are in
 * core/pool_internal.h under "pool_lists.c".
 *
 * Algorithm
 *  1. A block is a host-side descriptor (address, size, physical prev/next
 *     in its chunk, free-list links, state, owner, chunk): device memory is
 *     never read, so there are no in-band headers. Descriptors live in one
 *     array addressed by 32-bit index, recycled through a free list; a
 *     caller reserves the descriptors it may take before it changes
 *     anything (pool_reserve_descriptors_locked), so taking one never
 *     allocates.
 *  2. Free blocks sit in TLSF lists (two-level segregated fit) of an
 *     owner: first level floor(log2(size - 1)), second level the next
 *     SL_LOG2 (5) bits, 32 classes per power of two, one bitmap bit per
 *     non-empty list. Listing by size - 1 puts a whole power-of-two chunk
 *     and that chunk less one small block in one class, so the hot
 *     split/merge cycle leaves the lists alone.
 *  3. Find (pool_list_find), good fit: the head of the request's own class
 *     if it is big enough, else the head of the first non-empty class whose
 *     every block fits (ctz on the bitmaps).
 *  4. Take (pool_take_block): the request is cut off the free block's
 *     front, or, for at most small_from_back bytes, off its back (small
 *     blocks gather at the ends of free runs and stop splitting large
 *     ones), unless less than one alignment unit would be left; the free
 *     rest keeps its descriptor and, while its class is unchanged, its
 *     list position.
 *  5. Release (pool_release_block): a block joins an owner's lists merged
 *     with the free physical neighbours of that owner; a neighbour absorbs
 *     it in place, keeping the newest free stamp and the highest idle
 *     generation.
 *  6. Largest free block (query, layout): the biggest block of the highest
 *     non-empty class of each owner, and the run each parked block forms
 *     with its ready and parked neighbours.
 * Guarantees: blocks tile their chunk exactly and never merge across
 * chunks; adjacent free blocks of one owner are always merged; find, take
 * and release are O(1) in the number of free blocks; a failed reservation
 * changes nothing.
 */
#include "pool_internal.h"

#include <stdlib.h>

/* ---- descriptors ------------------------------------------------------- */

/* Doubles the descriptor array (1024 at first). */
static int grow_descriptors_locked(pool_t *pool, uint32_t count)
{
    uint32_t capacity = pool->blocks_capacity ? pool->blocks_capacity * 2 : 1024;
    if (capacity <= pool->blocks_capacity || capacity >= NIL)
        return PS_ENOMEM;
    pool_block_t *bigger = realloc(pool->blocks, (size_t)capacity * sizeof *bigger);
    if (!bigger)
        return PS_ENOMEM;
    pool->blocks = bigger;
    pool->blocks_capacity = capacity;
    return PS_OK;
}

/* Makes sure `count` descriptors can be taken without allocating. */
int pool_reserve_descriptors_locked(pool_t *pool, uint32_t count)
{
    if (pool->recycled_count + (pool->blocks_capacity - pool->blocks_used) >= count)
        return PS_OK;
    return grow_descriptors_locked(pool, count);
}

/* ---- blocks ------------------------------------------------------------ */

/* Puts block `index` (not in any list) into `owner_index`'s lists with
 * stamp `stamp` and idle generation `idle`, merging with free physical
 * neighbours of the same owner; a neighbour absorbs it in place (the
 * merged block keeps the newest stamp and the highest idle generation).
 * Returns the index of the free block that now holds it. */
uint32_t pool_release_block(pool_t *pool, uint32_t index, uint32_t owner_index, uint64_t stamp, uint64_t idle)
{
    pool_block_t *b = &pool->blocks[index];
    uint32_t prev = b->prev_phys, next = b->next_phys;
    int merge_prev = prev != NIL && pool->blocks[prev].state == BLOCK_FREE && pool->blocks[prev].owner == owner_index;
    int merge_next = next != NIL && pool->blocks[next].state == BLOCK_FREE && pool->blocks[next].owner == owner_index;
    if (merge_prev) {
        pool_block_t *p = &pool->blocks[prev];
        size_t size = p->size + b->size;
        uint32_t after = b->next_phys;
        if (stamp > p->free_stamp)
            p->free_stamp = stamp;
        if (idle > p->idle_gen)
            p->idle_gen = idle;
        if (merge_next) {
            pool_block_t *n = &pool->blocks[next];
            size += n->size;
            after = n->next_phys;
            if (n->free_stamp > p->free_stamp)
                p->free_stamp = n->free_stamp;
            if (n->idle_gen > p->idle_gen)
                p->idle_gen = n->idle_gen;
            pool_list_remove(pool, next);
            pool_recycle_descriptor(pool, next);
        }
        p->next_phys = after;
        if (after != NIL)
            pool->blocks[after].prev_phys = prev;
        pool_recycle_descriptor(pool, index);
        pool_free_block_resize(pool, prev, p->addr, size);
        return prev;
    } else if (merge_next) {
        pool_block_t *n = &pool->blocks[next];
        if (stamp > n->free_stamp)
            n->free_stamp = stamp;
        if (idle > n->idle_gen)
            n->idle_gen = idle;
        n->prev_phys = prev;
        if (prev != NIL)
            pool->blocks[prev].next_phys = next;
        else
            pool->chunks[b->chunk].first_block = next;
        uintptr_t addr = b->addr;
        size_t size = b->size + n->size;
        pool_recycle_descriptor(pool, index);
        pool_free_block_resize(pool, next, addr, size);
        return next;
    }
    b->free_stamp = stamp;
    b->idle_gen = idle;
    pool_list_insert(pool, owner_index, index);
    return index;
}

/* ---- the largest free block -------------------------------------------- */

/* Bytes of the run of ready or parked blocks that `index` belongs to. */
static uint64_t ready_run_of(const pool_t *pool, uint32_t index)
{
    while (pool->blocks[index].prev_phys != NIL && ready_or_parked(&pool->blocks[pool->blocks[index].prev_phys]))
        index = pool->blocks[index].prev_phys;
    uint64_t run = 0;
    for (; index != NIL && ready_or_parked(&pool->blocks[index]); index = pool->blocks[index].next_phys)
        run += pool->blocks[index].size;
    return run;
}

/* The largest block an allocation could get without growing: the biggest
 * listed block, or the run a parked block would form with its ready and
 * parked neighbours once the quick cache is flushed. */
uint64_t pool_largest_free_locked(const pool_t *pool)
{
    uint64_t largest = 0;
    for (uint32_t parked = pool->stack_head; parked != NIL; parked = pool->blocks[parked].next_free) {
        if (pool->blocks[parked].prev_phys != NIL && pool->blocks[pool->blocks[parked].prev_phys].state == BLOCK_CACHED)
            continue; /* its run is counted from a parked block before it */
        uint64_t run = ready_run_of(pool, parked);
        if (run > largest)
            largest = run;
    }
    for (uint32_t mask = pool->quick_mask; mask; mask &= mask - 1) {
        uint64_t run = ready_run_of(pool, pool->quick[__builtin_ctz(mask)]);
        if (run > largest)
            largest = run;
    }
    for (uint32_t o = 0; o < pool->owners_count; o++) {
        const pool_owner_t *owner = pool->owners[o];
        if (!owner->fl_bitmap)
            continue;
        unsigned fl = 63u - (unsigned)__builtin_clzll(owner->fl_bitmap);
        unsigned sl = 31u - (unsigned)__builtin_clz(owner->sl_bitmap[fl]);
        for (uint32_t index = owner->heads[fl][sl]; index != NIL; index = pool->blocks[index].next_free)
            if (pool->blocks[index].size > largest)
                largest = pool->blocks[index].size;
    }
    return largest;
}
