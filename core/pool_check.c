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

/* What the blocks of every chunk add up to (check_chunks). */
typedef struct tally {
    uint64_t used, free, pending, reserved, unmapped, lent;                   /* bytes */
    uint64_t used_blocks, free_blocks, pending_blocks, cached_blocks, unmapped_blocks, lent_blocks;
} tally_t;

/* Block `index` of range chunk `chunk` is mapped as its state says: a lent
 * block wholly lent, any other but an unmapped one wholly mapped and not
 * lent. */
static int check_mapping(const pool_t *pool, const pool_chunk_t *chunk, uint32_t index)
{
    const pool_block_t *b = &pool->lists.blocks[index];
    const ps_vm_range_t *range = chunk->range;
    const char *n = pool->base.name;
    if (b->state == BLOCK_LENT) {
        CHECK(ps_vm_range_is_lent(range, b->addr, b->size), n, "lent block %u is not wholly lent", index);
    } else if (b->state != BLOCK_UNMAPPED) {
        uintptr_t first = b->addr - (b->addr - range->base) % range->piece;
        size_t span = ps_align_up(b->addr + b->size - range->base, range->piece) -
                      (b->addr - range->base) / range->piece * range->piece;
        CHECK(!ps_vm_range_is_lent(range, first, range->piece) && ps_vm_range_is_mapped(range, first, span), n,
              "block %u (state %u) is not wholly mapped", index, b->state);
    }
    return PS_OK;
}

/* An unmapped or lent block (`what`) of range chunk `chunk`: whole pieces,
 * cutting no run. */
static int check_pieces(const pool_t *pool, const pool_chunk_t *chunk, uint32_t index, const char *what)
{
    const pool_block_t *b = &pool->lists.blocks[index];
    const char *n = pool->base.name;
    CHECK(chunk->range, n, "block %u: %s outside an expandable range", index, what);
    CHECK((b->addr - chunk->range->base) % chunk->range->piece == 0 && b->size % chunk->range->piece == 0, n,
          "%s block %u is not made of whole pieces", what, index);
    CHECK(ps_vm_range_boundary_down(chunk->range, b->addr) == b->addr &&
              ps_vm_range_boundary_down(chunk->range, b->addr + b->size) == b->addr + b->size,
          n, "%s block %u cuts a run", what, index);
    return PS_OK;
}

/* Block `index` (after `prev`, NIL: first) of chunk `chunk`, by its state,
 * added to *t. */
static int check_block(const pool_t *pool, const pool_chunk_t *chunk, uint32_t index, uint32_t prev, tally_t *t)
{
    const pool_block_t *b = &pool->lists.blocks[index];
    const pool_caches_t *caches = &pool->caches;
    const char *n = pool->base.name;
    switch (b->state) {
    case BLOCK_FREE:
        t->free += b->size;
        t->free_blocks++;
        CHECK(b->owner < pool->lists.owners_count, n, "block %u: bad owner %u", index, b->owner);
        if (prev != NIL)
            CHECK(!(pool->lists.blocks[prev].state == BLOCK_FREE && pool->lists.blocks[prev].owner == b->owner), n,
                  "blocks %u and %u: adjacent free blocks of one owner not coalesced", prev, index);
        break;
    case BLOCK_USED: {
        t->used += b->size;
        t->used_blocks++;
        uint64_t mapped;
        CHECK(ps_ptr_map_get(&pool->lists.in_use, b->addr, &mapped) && mapped == index, n,
              "used block %u not in the in-use map", index);
        break;
    }
    case BLOCK_PENDING:
        t->pending += b->size;
        t->pending_blocks++;
        break;
    case BLOCK_CACHED:
        t->free += b->size;
        t->cached_blocks++;
        CHECK(caches->quick[pool_caches_quick_slot(caches, b->size)] == index ||
                  (caches->stack_count && b->size == caches->stack_size),
              n, "cached block %u not in its slot nor of the stack's size", index);
        break;
    case BLOCK_UNMAPPED:
        if (check_pieces(pool, chunk, index, "unmapped") != PS_OK)
            return PS_EINVAL;
        CHECK(prev == NIL || pool->lists.blocks[prev].state != BLOCK_UNMAPPED, n,
              "unmapped blocks %u and %u not merged", prev, index);
        t->unmapped += b->size;
        t->unmapped_blocks++;
        break;
    case BLOCK_LENT:
        if (check_pieces(pool, chunk, index, "lent") != PS_OK)
            return PS_EINVAL;
        t->lent += b->size;
        t->lent_blocks++;
        break;
    default: CHECK(0, n, "block %u: state %u in a chunk", index, b->state);
    }
    return PS_OK;
}

/* Every chunk is tiled exactly by its blocks, each consistent with its
 * state; *t = what they add up to. */
static int check_chunks(const pool_t *pool, tally_t *t)
{
    size_t alignment = pool->options.alignment;
    const char *n = pool->base.name;
    for (uint32_t slot = 0; slot < pool->lists.chunks_count; slot++) {
        const pool_chunk_t *chunk = &pool->lists.chunks[slot];
        if (!chunk->base)
            continue;
        t->reserved += chunk->range ? chunk->range->mapped_bytes : chunk->size;
        uintptr_t expect = chunk->addr;
        uint32_t prev = NIL;
        for (uint32_t index = chunk->first_block; index != NIL; index = pool->lists.blocks[index].next_phys) {
            CHECK(index < pool->lists.blocks_used, n, "chunk %u: block index %u out of range", slot, index);
            const pool_block_t *b = &pool->lists.blocks[index];
            CHECK(b->addr == expect, n, "chunk %u: block %u at %#lx, expected %#lx", slot, index,
                  (unsigned long)b->addr, (unsigned long)expect);
            CHECK(b->prev_phys == prev, n, "block %u: prev_phys %u, expected %u", index, b->prev_phys, prev);
            CHECK(b->chunk == slot, n, "block %u: chunk %u, expected %u", index, b->chunk, slot);
            CHECK(b->size && b->size % alignment == 0 && b->addr % alignment == 0, n,
                  "block %u: size %zu / address not aligned to %zu", index, b->size, alignment);
            if ((chunk->range && check_mapping(pool, chunk, index) != PS_OK) ||
                check_block(pool, chunk, index, prev, t) != PS_OK)
                return PS_EINVAL;
            expect = b->addr + b->size;
            prev = index;
        }
        CHECK(expect == chunk->addr + chunk->size, n, "chunk %u: blocks end at %#lx, chunk at %#lx", slot,
              (unsigned long)expect, (unsigned long)(chunk->addr + chunk->size));
    }
    return PS_OK;
}

/* The layers' counts agree with what the blocks add up to. */
static int check_counts(const pool_t *pool, const tally_t *t)
{
    const pool_lists_t *lists = &pool->lists;
    const char *n = pool->base.name;
    uint64_t pending = pool->streams.reuse.bytes_pending;
    CHECK(t->reserved == lists->bytes_reserved, n, "reserved %llu, chunks sum %llu",
          (unsigned long long)lists->bytes_reserved, (unsigned long long)t->reserved);
    CHECK(t->used == lists->bytes_in_use, n, "in use %llu, blocks sum %llu", (unsigned long long)lists->bytes_in_use,
          (unsigned long long)t->used);
    CHECK(t->free == lists->bytes_free, n, "free %llu, blocks sum %llu", (unsigned long long)lists->bytes_free,
          (unsigned long long)t->free);
    CHECK(t->pending == pending, n, "pending %llu, blocks sum %llu", (unsigned long long)pending,
          (unsigned long long)t->pending);
    CHECK(t->reserved == t->used + t->free + t->pending, n, "reserved != in use + free + pending");
    CHECK(t->unmapped == pool->range.bytes_unmapped, n, "unmapped %llu, blocks sum %llu",
          (unsigned long long)pool->range.bytes_unmapped, (unsigned long long)t->unmapped);
    CHECK(t->lent == pool->range.bytes_lent, n, "lent %llu, blocks sum %llu", (unsigned long long)pool->range.bytes_lent,
          (unsigned long long)t->lent);
    if (check_state_list(pool, pool->range.lent_head, BLOCK_LENT, t->lent_blocks, "lent") != PS_OK ||
        check_state_list(pool, pool->range.unmapped_head, BLOCK_UNMAPPED, t->unmapped_blocks, "unmapped") != PS_OK)
        return PS_EINVAL;
    CHECK(t->used_blocks == lists->in_use.count, n, "%llu used blocks, %zu in the map",
          (unsigned long long)t->used_blocks, lists->in_use.count);
    return PS_OK;
}

/* Every owner's TLSF lists: bitmaps, classes, links and counters; they
 * hold exactly the free blocks of the chunks. */
static int check_free_lists(const pool_t *pool, const tally_t *t)
{
    const pool_lists_t *lists = &pool->lists;
    const char *n = pool->base.name;
    uint64_t listed = 0;
    for (uint32_t o = 0; o < lists->owners_count; o++) {
        const pool_owner_t *owner = lists->owners[o];
        uint64_t owner_bytes = 0, owner_blocks = 0;
        for (unsigned fl = 0; fl < FL_COUNT; fl++) {
            CHECK(!!(owner->fl_bitmap & (1ull << fl)) == !!owner->sl_bitmap[fl], n,
                  "owner %u: first-level bit %u disagrees with its second level", o, fl);
            for (unsigned sl = 0; sl < SL_COUNT; sl++) {
                uint32_t head = owner->heads[fl][sl];
                CHECK(!!(owner->sl_bitmap[fl] & (1u << sl)) == (head != NIL), n,
                      "owner %u: bitmap bit (%u,%u) disagrees with its list", o, fl, sl);
                uint32_t prev = NIL;
                for (uint32_t index = head; index != NIL; index = lists->blocks[index].next_free) {
                    const pool_block_t *b = &lists->blocks[index];
                    unsigned bf, bs;
                    CHECK(b->state == BLOCK_FREE && b->owner == o, n, "owner %u list: block %u not free/its own", o,
                          index);
                    size_class(b->size, &bf, &bs);
                    CHECK(bf == fl && bs == sl, n, "block %u of size %zu in the wrong class", index, b->size);
                    CHECK(b->prev_free == prev, n, "block %u: prev_free broken", index);
                    CHECK(++owner_blocks <= t->free_blocks, n, "owner %u: a free list loops", o);
                    owner_bytes += b->size;
                    prev = index;
                }
            }
        }
        CHECK(owner_bytes == owner->free_bytes && owner_blocks == owner->free_blocks, n,
              "owner %u: counters disagree with its lists", o);
        listed += owner_blocks;
    }
    CHECK(listed == t->free_blocks, n, "%llu free blocks in chunks, %llu in lists",
          (unsigned long long)t->free_blocks, (unsigned long long)listed);
    return PS_OK;
}

/* The quick cache and the size stack hold exactly the cached blocks. */
static int check_parked(const pool_t *pool, const tally_t *t)
{
    const pool_caches_t *caches = &pool->caches;
    const pool_block_t *blocks = pool->lists.blocks;
    const char *n = pool->base.name;
    uint64_t parked = 0, stacked = 0;
    for (uint32_t slot = 0; slot < QUICK_SLOTS; slot++)
        parked += caches->quick[slot] != NIL;
    for (uint32_t index = caches->stack_head; index != NIL && stacked <= STACK_MAX; index = blocks[index].next_free) {
        CHECK(blocks[index].state == BLOCK_CACHED && blocks[index].size == caches->stack_size, n,
              "stacked block %u: state %d, size %llu of %llu", index, (int)blocks[index].state,
              (unsigned long long)blocks[index].size, (unsigned long long)caches->stack_size);
        stacked++;
    }
    CHECK(stacked == caches->stack_count, n, "%llu stacked blocks, count %u", (unsigned long long)stacked,
          caches->stack_count);
    parked += stacked;
    CHECK(parked == t->cached_blocks, n, "%llu parked blocks, %llu cached in chunks", (unsigned long long)parked,
          (unsigned long long)t->cached_blocks);
    return PS_OK;
}

/* The epochs (core/reuse.c) list every pending block, once. */
static int check_epochs(const pool_t *pool, const tally_t *t)
{
    const char *n = pool->base.name;
    epoch_visit_t visit = {pool, 0, 0, 0};
    CHECK(ps_reuse_visit(&pool->streams.reuse, epoch_visit, &visit) == PS_OK, n, "epoch bytes disagree with pending");
    CHECK(!visit.not_pending, n, "%llu epoch blocks not pending", (unsigned long long)visit.not_pending);
    CHECK(visit.bytes == t->pending, n, "epochs hold %llu bytes, pending blocks %llu", (unsigned long long)visit.bytes,
          (unsigned long long)t->pending);
    CHECK(visit.blocks == t->pending_blocks, n, "%llu pending blocks, %llu in epochs",
          (unsigned long long)t->pending_blocks, (unsigned long long)visit.blocks);
    return PS_OK;
}

static int check_locked(const pool_t *pool)
{
    tally_t t = {0};
    if (check_chunks(pool, &t) != PS_OK || check_counts(pool, &t) != PS_OK || check_free_lists(pool, &t) != PS_OK ||
        check_parked(pool, &t) != PS_OK || check_epochs(pool, &t) != PS_OK)
        return PS_EINVAL;
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
