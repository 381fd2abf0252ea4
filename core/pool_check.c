/* The pool's invariant checker (ps_pool_check) and its layout report
 * (ps_pool_layout): read-only walks over the pool's descriptors, kept out
 * of the allocate/free recipe (core/pool.c). The checker is what the tests
 * call after every step; it states every invariant the pool keeps and
 * refuses the first one that fails, naming it and the block.
 */
#include "pool_internal.h"

#include <string.h>

/* ---- layout (ps_pool_layout) ------------------------------------------- */

/* Bytes of `range` inside [lo, hi) that could go back: its whole runs
 * (a run goes back only whole, core/vm_range.h). */
static uint64_t whole_pieces(const ps_vm_range_t *range, uintptr_t lo, uintptr_t hi)
{
    return ps_vm_range_whole_runs(range, &lo, &hi) ? hi - lo : 0;
}

/* Adds what the blocks of expandable chunk `chunk` hold by piece to *out:
 * runs of ready free blocks, runs of blocks that are free or pending, and
 * the unmapped bytes below the highest mapped one. */
static void layout_range_locked(const pool_t *pool, const pool_chunk_t *chunk, ps_pool_layout_t *out)
{
    uintptr_t ready_start = 0, idle_start = 0;
    int in_ready = 0, in_idle = 0;
    uint64_t unmapped_below = 0;
    for (uint32_t index = chunk->first_block; index != NIL; index = pool->lists.blocks[index].next_phys) {
        const pool_block_t *b = &pool->lists.blocks[index];
        int ready = ready_or_parked(b), idle = b->state == BLOCK_FREE || b->state == BLOCK_CACHED ||
                                                b->state == BLOCK_PENDING;
        if (in_ready && !ready)
            out->ready_whole_pieces += whole_pieces(chunk->range, ready_start, b->addr);
        if (in_idle && !idle)
            out->idle_whole_pieces += whole_pieces(chunk->range, idle_start, b->addr);
        if (ready && !in_ready)
            ready_start = b->addr;
        if (idle && !in_idle)
            idle_start = b->addr;
        in_ready = ready;
        in_idle = idle;
        if (b->state == BLOCK_UNMAPPED)
            unmapped_below += b->size;
        else {
            out->unmapped_holes += unmapped_below;
            unmapped_below = 0;
        }
    }
    uintptr_t end = chunk->addr + chunk->size;
    if (in_ready)
        out->ready_whole_pieces += whole_pieces(chunk->range, ready_start, end);
    if (in_idle)
        out->idle_whole_pieces += whole_pieces(chunk->range, idle_start, end);
}

int ps_pool_layout(ps_resource_t *r, ps_pool_layout_t *out)
{
    if (!r || r->ops != &pool_ops || !out)
        return PS_EINVAL;
    pool_t *pool = (pool_t *)r;
    memset(out, 0, sizeof *out);
    ps_lock(&pool->lock);
    out->reserved = pool->lists.bytes_reserved;
    out->in_use = pool->lists.bytes_in_use;
    out->ready_free = pool->lists.owners[OWNER_READY]->free_bytes;
    const pool_caches_t *caches = &pool->caches;
    for (uint32_t mask = caches->quick_mask; mask; mask &= mask - 1)
        out->ready_free += pool->lists.blocks[caches->quick[__builtin_ctz(mask)]].size;
    out->ready_free += (uint64_t)caches->stack_count * caches->stack_size;
    out->pending = pool->streams.reuse.bytes_pending;
    out->stream_free = pool->lists.bytes_free - out->ready_free;
    uint64_t listed = pool_lists_largest_listed(&pool->lists), parked = pool_caches_largest_parked(caches, &pool->lists);
    out->largest_ready = listed > parked ? listed : parked;
    for (uint32_t slot = 0; slot < pool->lists.chunks_count; slot++) {
        const pool_chunk_t *chunk = &pool->lists.chunks[slot];
        if (!chunk->base)
            continue;
        if (chunk->range)
            layout_range_locked(pool, chunk, out);
        for (uint32_t index = chunk->first_block; index != NIL; index = pool->lists.blocks[index].next_phys)
            if (pool->lists.blocks[index].state == BLOCK_USED && pool->lists.blocks[index].size <= pool->options.small_from_back)
                out->small_in_use += pool->lists.blocks[index].size;
    }
    ps_unlock(&pool->lock);
    return PS_OK;
}

/* ---- invariant check --------------------------------------------------- */

#define CHECK(cond, name, fmt, ...)                                   \
    do {                                                              \
        if (!(cond)) {                                                \
            ps_error("pool check '%s': " fmt, name, ##__VA_ARGS__);   \
            return PS_EINVAL;                                         \
        }                                                             \
    } while (0)

/* Counts what the epochs hold (check_locked). */
typedef struct epoch_visit {
    const pool_t *pool;    /* the pool checked */
    uint64_t blocks;       /* blocks listed */
    uint64_t bytes;        /* their bytes */
    uint64_t not_pending;  /* listed blocks whose state is not pending */
} epoch_visit_t;

static void epoch_visit(void *ctx, uint64_t item)
{
    epoch_visit_t *v = ctx;
    const pool_block_t *b = &v->pool->lists.blocks[item];
    v->blocks++;
    v->bytes += b->size;
    v->not_pending += b->state != BLOCK_PENDING;
}

/* The unmapped or the lent list from `head`: `count` blocks, all in `state`. */
static int check_state_list(const pool_t *pool, uint32_t head, uint8_t state, uint64_t count, const char *what)
{
    const char *n = pool->base.name;
    uint64_t linked = 0;
    for (uint32_t index = head; index != NIL; index = pool->lists.blocks[index].next_free) {
        CHECK(pool->lists.blocks[index].state == state, n, "%s list: block %u is not %s", what, index, what);
        CHECK(++linked <= count, n, "the %s list loops or holds strangers", what);
    }
    CHECK(linked == count, n, "%llu %s blocks, %llu in the list", (unsigned long long)count, what,
          (unsigned long long)linked);
    return PS_OK;
}

static int check_locked(pool_t *pool)
{
    size_t alignment = pool->options.alignment;
    uint64_t used = 0, freeb = 0, pending = 0, reserved = 0, used_blocks = 0, free_blocks = 0,
             pending_blocks = 0, cached_blocks = 0, unmapped = 0, unmapped_blocks = 0, lent = 0, lent_blocks = 0;
    const char *n = pool->base.name;
    for (uint32_t slot = 0; slot < pool->lists.chunks_count; slot++) {
        pool_chunk_t *chunk = &pool->lists.chunks[slot];
        if (!chunk->base)
            continue;
        reserved += chunk->range ? chunk->range->mapped_bytes : chunk->size;
        uintptr_t expect = chunk->addr;
        uint32_t prev = NIL;
        for (uint32_t index = chunk->first_block; index != NIL; index = pool->lists.blocks[index].next_phys) {
            CHECK(index < pool->lists.blocks_used, n, "chunk %u: block index %u out of range", slot, index);
            pool_block_t *b = &pool->lists.blocks[index];
            CHECK(b->addr == expect, n, "chunk %u: block %u at %#lx, expected %#lx", slot, index,
                  (unsigned long)b->addr, (unsigned long)expect);
            CHECK(b->prev_phys == prev, n, "block %u: prev_phys %u, expected %u", index, b->prev_phys, prev);
            CHECK(b->chunk == slot, n, "block %u: chunk %u, expected %u", index, b->chunk, slot);
            CHECK(b->size && b->size % alignment == 0 && b->addr % alignment == 0, n,
                  "block %u: size %zu / address not aligned to %zu", index, b->size, alignment);
            if (chunk->range && b->state == BLOCK_LENT)
                CHECK(ps_vm_range_is_lent(chunk->range, b->addr, b->size), n, "lent block %u is not wholly lent", index);
            else if (chunk->range && b->state != BLOCK_UNMAPPED)
                CHECK(!ps_vm_range_is_lent(chunk->range, b->addr - (b->addr - chunk->range->base) % chunk->range->piece,
                                           chunk->range->piece) &&
                          ps_vm_range_is_mapped(chunk->range, b->addr - (b->addr - chunk->range->base) % chunk->range->piece,
                                            ps_align_up(b->addr + b->size - chunk->range->base, chunk->range->piece) -
                                                (b->addr - chunk->range->base) / chunk->range->piece * chunk->range->piece),
                      n, "block %u (state %u) is not wholly mapped", index, b->state);
            switch (b->state) {
            case BLOCK_FREE:
                freeb += b->size;
                free_blocks++;
                CHECK(b->owner < pool->lists.owners_count, n, "block %u: bad owner %u", index, b->owner);
                if (prev != NIL)
                    CHECK(!(pool->lists.blocks[prev].state == BLOCK_FREE && pool->lists.blocks[prev].owner == b->owner), n,
                          "blocks %u and %u: adjacent free blocks of one owner not coalesced", prev, index);
                break;
            case BLOCK_USED: {
                used += b->size;
                used_blocks++;
                uint64_t mapped;
                CHECK(ps_ptr_map_get(&pool->lists.in_use, b->addr, &mapped) && mapped == index, n,
                      "used block %u not in the in-use map", index);
                break;
            }
            case BLOCK_PENDING:
                pending += b->size;
                pending_blocks++;
                break;
            case BLOCK_CACHED:
                freeb += b->size;
                cached_blocks++;
                CHECK(pool->caches.quick[pool_caches_quick_slot(&pool->caches, b->size)] == index || (pool->caches.stack_count && b->size == pool->caches.stack_size),
                      n, "cached block %u not in its slot nor of the stack's size", index);
                break;
            case BLOCK_UNMAPPED:
                CHECK(chunk->range, n, "block %u: unmapped outside an expandable range", index);
                CHECK((b->addr - chunk->range->base) % chunk->range->piece == 0 && b->size % chunk->range->piece == 0,
                      n, "unmapped block %u is not made of whole pieces", index);
                CHECK(ps_vm_range_boundary_down(chunk->range, b->addr) == b->addr &&
                          ps_vm_range_boundary_down(chunk->range, b->addr + b->size) == b->addr + b->size,
                      n, "unmapped block %u cuts a run", index);
                CHECK(prev == NIL || pool->lists.blocks[prev].state != BLOCK_UNMAPPED, n,
                      "unmapped blocks %u and %u not merged", prev, index);
                unmapped += b->size;
                unmapped_blocks++;
                break;
            case BLOCK_LENT:
                CHECK(chunk->range, n, "block %u: lent outside an expandable range", index);
                CHECK((b->addr - chunk->range->base) % chunk->range->piece == 0 && b->size % chunk->range->piece == 0,
                      n, "lent block %u is not made of whole pieces", index);
                CHECK(ps_vm_range_boundary_down(chunk->range, b->addr) == b->addr &&
                          ps_vm_range_boundary_down(chunk->range, b->addr + b->size) == b->addr + b->size,
                      n, "lent block %u cuts a run", index);
                lent += b->size;
                lent_blocks++;
                break;
            default: CHECK(0, n, "block %u: state %u in a chunk", index, b->state);
            }
            expect = b->addr + b->size;
            prev = index;
        }
        CHECK(expect == chunk->addr + chunk->size, n, "chunk %u: blocks end at %#lx, chunk at %#lx", slot,
              (unsigned long)expect, (unsigned long)(chunk->addr + chunk->size));
    }
    CHECK(reserved == pool->lists.bytes_reserved, n, "reserved %llu, chunks sum %llu",
          (unsigned long long)pool->lists.bytes_reserved, (unsigned long long)reserved);
    CHECK(used == pool->lists.bytes_in_use, n, "in use %llu, blocks sum %llu", (unsigned long long)pool->lists.bytes_in_use,
          (unsigned long long)used);
    CHECK(freeb == pool->lists.bytes_free, n, "free %llu, blocks sum %llu", (unsigned long long)pool->lists.bytes_free,
          (unsigned long long)freeb);
    CHECK(pending == pool->streams.reuse.bytes_pending, n, "pending %llu, blocks sum %llu",
          (unsigned long long)pool->streams.reuse.bytes_pending, (unsigned long long)pending);
    CHECK(reserved == used + freeb + pending, n, "reserved != in use + free + pending");
    CHECK(unmapped == pool->range.bytes_unmapped, n, "unmapped %llu, blocks sum %llu",
          (unsigned long long)pool->range.bytes_unmapped, (unsigned long long)unmapped);
    CHECK(lent == pool->range.bytes_lent, n, "lent %llu, blocks sum %llu", (unsigned long long)pool->range.bytes_lent,
          (unsigned long long)lent);
    if (check_state_list(pool, pool->range.lent_head, BLOCK_LENT, lent_blocks, "lent") != PS_OK ||
        check_state_list(pool, pool->range.unmapped_head, BLOCK_UNMAPPED, unmapped_blocks, "unmapped") != PS_OK)
        return PS_EINVAL;
    CHECK(used_blocks == pool->lists.in_use.count, n, "%llu used blocks, %zu in the map",
          (unsigned long long)used_blocks, pool->lists.in_use.count);
    /* free lists */
    uint64_t listed = 0;
    for (uint32_t o = 0; o < pool->lists.owners_count; o++) {
        pool_owner_t *owner = pool->lists.owners[o];
        uint64_t owner_bytes = 0, owner_blocks = 0;
        for (unsigned fl = 0; fl < FL_COUNT; fl++) {
            CHECK(!!(owner->fl_bitmap & (1ull << fl)) == !!owner->sl_bitmap[fl], n,
                  "owner %u: first-level bit %u disagrees with its second level", o, fl);
            for (unsigned sl = 0; sl < SL_COUNT; sl++) {
                uint32_t head = owner->heads[fl][sl];
                CHECK(!!(owner->sl_bitmap[fl] & (1u << sl)) == (head != NIL), n,
                      "owner %u: bitmap bit (%u,%u) disagrees with its list", o, fl, sl);
                uint32_t prev = NIL;
                for (uint32_t index = head; index != NIL; index = pool->lists.blocks[index].next_free) {
                    pool_block_t *b = &pool->lists.blocks[index];
                    unsigned bf, bs;
                    CHECK(b->state == BLOCK_FREE && b->owner == o, n, "owner %u list: block %u not free/its own", o,
                          index);
                    size_class(b->size, &bf, &bs);
                    CHECK(bf == fl && bs == sl, n, "block %u of size %zu in the wrong class", index, b->size);
                    CHECK(b->prev_free == prev, n, "block %u: prev_free broken", index);
                    CHECK(++owner_blocks <= free_blocks, n, "owner %u: a free list loops", o);
                    owner_bytes += b->size;
                    prev = index;
                }
            }
        }
        CHECK(owner_bytes == owner->free_bytes && owner_blocks == owner->free_blocks, n,
              "owner %u: counters disagree with its lists", o);
        listed += owner_blocks;
    }
    uint64_t parked = 0;
    for (uint32_t slot = 0; slot < QUICK_SLOTS; slot++)
        parked += pool->caches.quick[slot] != NIL;
    uint64_t stacked = 0;
    for (uint32_t index = pool->caches.stack_head; index != NIL && stacked <= STACK_MAX; index = pool->lists.blocks[index].next_free) {
        CHECK(pool->lists.blocks[index].state == BLOCK_CACHED && pool->lists.blocks[index].size == pool->caches.stack_size, n,
              "stacked block %u: state %d, size %llu of %llu", index, (int)pool->lists.blocks[index].state,
              (unsigned long long)pool->lists.blocks[index].size, (unsigned long long)pool->caches.stack_size);
        stacked++;
    }
    CHECK(stacked == pool->caches.stack_count, n, "%llu stacked blocks, count %u", (unsigned long long)stacked,
          pool->caches.stack_count);
    parked += stacked;
    CHECK(parked == cached_blocks, n, "%llu parked blocks, %llu cached in chunks", (unsigned long long)parked,
          (unsigned long long)cached_blocks);
    CHECK(listed == free_blocks, n, "%llu free blocks in chunks, %llu in lists", (unsigned long long)free_blocks,
          (unsigned long long)listed);
    /* epochs (core/reuse.c): every listed block pending, listed once */
    epoch_visit_t visit = {pool, 0, 0, 0};
    CHECK(ps_reuse_visit(&pool->streams.reuse, epoch_visit, &visit) == PS_OK, n, "epoch bytes disagree with pending");
    CHECK(!visit.not_pending, n, "%llu epoch blocks not pending", (unsigned long long)visit.not_pending);
    CHECK(visit.bytes == pending, n, "epochs hold %llu bytes, pending blocks %llu",
          (unsigned long long)visit.bytes, (unsigned long long)pending);
    CHECK(visit.blocks == pending_blocks, n, "%llu pending blocks, %llu in epochs", (unsigned long long)pending_blocks,
          (unsigned long long)visit.blocks);
    return PS_OK;
}

int ps_pool_check(ps_resource_t *r)
{
    if (!r || r->ops != &pool_ops)
        return PS_EINVAL;
    pool_t *pool = (pool_t *)r;
    ps_lock(&pool->lock);
    int status = check_locked(pool);
    ps_unlock(&pool->lock);
    return status;
}
