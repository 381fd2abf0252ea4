/* The pool's blocks and free lists: descriptors, the chunks they tile,
 * TLSF lists per owner, splitting and merging (core/pool_lists.h).
 *
 * Algorithm
 *  1. A block is a host-side descriptor: device memory is never read, so
 *     there are no in-band headers. Descriptors live in one array by
 *     32-bit index, recycled through a free list; a caller reserves the
 *     descriptors it may take before it changes anything
 *     (pool_lists_reserve_descriptors), so taking one never allocates.
 *  2. Free blocks sit in TLSF lists (two-level segregated fit) of an
 *     owner: first level floor(log2(size - 1)), second level the next
 *     SL_LOG2 (5) bits, 32 classes per power of two, one bitmap bit per
 *     non-empty list. Listing by size - 1 puts a whole power-of-two chunk
 *     and that chunk less one small block in one class, so the hot
 *     split/merge cycle leaves the lists alone.
 *  3. Find, good fit: the head of the request's own class if it is big
 *     enough, else the head of the first non-empty class whose every block
 *     fits (ctz on the bitmaps).
 *  4. Take: the request is cut off the free block's front, or, for at most
 *     small_from_back bytes, off its back (small blocks gather at the ends
 *     of free runs and stop splitting large ones), unless less than one
 *     alignment unit would be left; the free rest keeps its descriptor
 *     and, while its class is unchanged, its list position.
 *  5. Release: a block joins an owner's lists merged with the free physical
 *     neighbours of that owner; a neighbour absorbs it in place, keeping
 *     the newest free stamp and the highest idle generation.
 *  6. Counts: in use, free (parked blocks included), reserved (bytes with
 *     memory behind them) and the upstream calls that changed it.
 * Guarantees: blocks tile their chunk exactly and never merge across
 * chunks; adjacent free blocks of one owner are always merged; find, take
 * and release are O(1) in the number of free blocks; a failed reservation
 * changes nothing.
 */
#include "pool_lists.h"

#include <stdlib.h>
#include <string.h>

/* ---- making and unmaking ----------------------------------------------- */

/* An empty owner, or NULL (host out of memory). */
static pool_owner_t *owner_new(void)
{
    pool_owner_t *owner = malloc(sizeof *owner);
    if (!owner)
        return NULL;
    memset(owner, 0, sizeof *owner);
    memset(owner->heads, 0xff, sizeof owner->heads); /* NIL */
    return owner;
}

int pool_lists_init(pool_lists_t *lists, size_t alignment, size_t small_from_back)
{
    memset(lists, 0, sizeof *lists);
    lists->recycled_head = NIL;
    lists->alignment = alignment;
    lists->small_from_back = small_from_back;
    lists->owners_capacity = 8;
    lists->owners = calloc(lists->owners_capacity, sizeof *lists->owners);
    int status = lists->owners ? PS_OK : PS_ENOMEM;
    if (status == PS_OK && !(lists->owners[OWNER_READY] = owner_new()))
        status = PS_ENOMEM;
    if (status == PS_OK) {
        lists->owners_count = 1;
        status = ps_ptr_map_init(&lists->in_use, 1024);
    }
    if (status != PS_OK && !lists->in_use.slots)
        ps_ptr_map_init(&lists->in_use, 16); /* so destroy has something to free */
    return status;
}

void pool_lists_destroy(pool_lists_t *lists)
{
    for (uint32_t o = 0; o < lists->owners_count; o++)
        free(lists->owners[o]);
    free(lists->owners);
    free(lists->chunks);
    free(lists->blocks);
    ps_ptr_map_free(&lists->in_use);
}

int pool_lists_add_owner(pool_lists_t *lists, uint32_t *out)
{
    if (lists->owners_count == lists->owners_capacity) {
        uint32_t capacity = lists->owners_capacity * 2;
        pool_owner_t **bigger = realloc(lists->owners, capacity * sizeof *bigger);
        if (!bigger)
            return PS_ENOMEM;
        lists->owners = bigger;
        lists->owners_capacity = capacity;
    }
    pool_owner_t *owner = owner_new();
    if (!owner)
        return PS_ENOMEM;
    *out = lists->owners_count++;
    lists->owners[*out] = owner;
    return PS_OK;
}

/* ---- descriptors ------------------------------------------------------- */

/* Doubles the descriptor array (1024 at first). */
static int grow_descriptors(pool_lists_t *lists)
{
    uint32_t capacity = lists->blocks_capacity ? lists->blocks_capacity * 2 : 1024;
    if (capacity <= lists->blocks_capacity || capacity >= NIL)
        return PS_ENOMEM;
    pool_block_t *bigger = realloc(lists->blocks, (size_t)capacity * sizeof *bigger);
    if (!bigger)
        return PS_ENOMEM;
    lists->blocks = bigger;
    lists->blocks_capacity = capacity;
    return PS_OK;
}

int pool_lists_reserve_descriptors(pool_lists_t *lists, uint32_t count)
{
    if (lists->recycled_count + (lists->blocks_capacity - lists->blocks_used) >= count)
        return PS_OK;
    return grow_descriptors(lists);
}

/* ---- chunks ------------------------------------------------------------ */

int pool_lists_chunk_slot(pool_lists_t *lists, uint32_t *slot)
{
    uint32_t s = 0;
    while (s < lists->chunks_count && lists->chunks[s].base)
        s++;
    if (s == lists->chunks_capacity) {
        uint32_t capacity = lists->chunks_capacity ? lists->chunks_capacity * 2 : 16;
        pool_chunk_t *bigger = realloc(lists->chunks, capacity * sizeof *bigger);
        if (!bigger)
            return PS_ENOMEM;
        lists->chunks = bigger;
        lists->chunks_capacity = capacity;
    }
    *slot = s;
    return PS_OK;
}

uint32_t pool_lists_add_chunk(pool_lists_t *lists, uint32_t slot, const pool_chunk_t *chunk)
{
    uint32_t index = pool_lists_take_descriptor(lists);
    pool_block_t *b = &lists->blocks[index];
    b->addr = chunk->addr;
    b->size = chunk->size;
    b->free_stamp = 0;
    b->idle_gen = IDLE_NOW; /* fresh memory, or none behind it */
    b->prev_phys = b->next_phys = NIL;
    b->chunk = slot;
    b->owner = OWNER_READY;
    lists->chunks[slot] = *chunk;
    lists->chunks[slot].first_block = index;
    if (slot == lists->chunks_count)
        lists->chunks_count++;
    return index;
}

void pool_lists_drop_chunk(pool_lists_t *lists, uint32_t slot)
{
    pool_chunk_t *chunk = &lists->chunks[slot];
    pool_lists_remove(lists, chunk->first_block);
    pool_lists_recycle_descriptor(lists, chunk->first_block);
    pool_lists_count_return(lists, chunk->size, 1);
    chunk->base = NULL;
}

void pool_lists_trim_chunks(pool_lists_t *lists)
{
    while (lists->chunks_count && !lists->chunks[lists->chunks_count - 1].base)
        lists->chunks_count--;
}

/* ---- blocks ------------------------------------------------------------ */

/* Free block `into` absorbs the stamp and idle generation of a block merged into it. */
static inline void absorb_marks(pool_block_t *into, uint64_t stamp, uint64_t idle)
{
    if (stamp > into->free_stamp)
        into->free_stamp = stamp;
    if (idle > into->idle_gen)
        into->idle_gen = idle;
}

uint32_t pool_lists_release(pool_lists_t *lists, uint32_t index, uint32_t owner_index, uint64_t stamp,
                            uint64_t idle)
{
    pool_block_t *b = &lists->blocks[index];
    uint32_t prev = b->prev_phys, next = b->next_phys;
    bool merge_prev = prev != NIL && lists->blocks[prev].state == BLOCK_FREE && lists->blocks[prev].owner == owner_index;
    bool merge_next = next != NIL && lists->blocks[next].state == BLOCK_FREE && lists->blocks[next].owner == owner_index;
    if (merge_prev) {
        pool_block_t *p = &lists->blocks[prev];
        size_t size = p->size + b->size;
        uint32_t after = b->next_phys;
        absorb_marks(p, stamp, idle);
        if (merge_next) {
            pool_block_t *n = &lists->blocks[next];
            size += n->size;
            after = n->next_phys;
            absorb_marks(p, n->free_stamp, n->idle_gen);
            pool_lists_remove(lists, next);
            pool_lists_recycle_descriptor(lists, next);
        }
        p->next_phys = after;
        if (after != NIL)
            lists->blocks[after].prev_phys = prev;
        pool_lists_recycle_descriptor(lists, index);
        pool_lists_resize(lists, prev, p->addr, size);
        return prev;
    } else if (merge_next) {
        pool_block_t *n = &lists->blocks[next];
        absorb_marks(n, stamp, idle);
        n->prev_phys = prev;
        if (prev != NIL)
            lists->blocks[prev].next_phys = next;
        else
            lists->chunks[b->chunk].first_block = next;
        uintptr_t addr = b->addr;
        size_t size = b->size + n->size;
        pool_lists_recycle_descriptor(lists, index);
        pool_lists_resize(lists, next, addr, size);
        return next;
    }
    b->free_stamp = stamp;
    b->idle_gen = idle;
    pool_lists_insert(lists, owner_index, index);
    return index;
}

uint32_t pool_lists_split(pool_lists_t *lists, uint32_t index, uintptr_t at)
{
    uint32_t back = pool_lists_take_descriptor(lists);
    pool_block_t *b = &lists->blocks[index], *n = &lists->blocks[back];
    *n = *b;
    n->addr = at;
    n->size = b->addr + b->size - at;
    n->prev_phys = index;
    if (b->next_phys != NIL)
        lists->blocks[b->next_phys].prev_phys = back;
    b->next_phys = back;
    b->size = at - b->addr;
    return back;
}

/* ---- the largest free block -------------------------------------------- */

uint64_t pool_lists_ready_run(const pool_lists_t *lists, uint32_t index)
{
    const pool_block_t *blocks = lists->blocks;
    while (blocks[index].prev_phys != NIL && ready_or_parked(&blocks[blocks[index].prev_phys]))
        index = blocks[index].prev_phys;
    uint64_t run = 0;
    for (; index != NIL && ready_or_parked(&blocks[index]); index = blocks[index].next_phys)
        run += blocks[index].size;
    return run;
}

uint64_t pool_lists_largest_listed(const pool_lists_t *lists)
{
    uint64_t largest = 0;
    for (uint32_t o = 0; o < lists->owners_count; o++) {
        const pool_owner_t *owner = lists->owners[o];
        if (!owner->fl_bitmap)
            continue;
        unsigned fl = 63u - (unsigned)__builtin_clzll(owner->fl_bitmap);
        unsigned sl = 31u - (unsigned)__builtin_clz(owner->sl_bitmap[fl]);
        for (uint32_t index = owner->heads[fl][sl]; index != NIL; index = lists->blocks[index].next_free)
            if (lists->blocks[index].size > largest)
                largest = lists->blocks[index].size;
    }
    return largest;
}
