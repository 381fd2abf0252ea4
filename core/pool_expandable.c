/* The expandable range (core/pool.c, steps 3c and 3e, through
 * core/pool_growth.c): an expandable pool is one chunk over a range of
 * virtual addresses (core/vm_range.c) that grows in place, moves free
 * pieces to where a growth needs them (remap), and lends busy ones.
 *
 * Algorithm
 *  1. Expandable range: tiled by blocks like a chunk; the parts not backed
 *     by memory are UNMAPPED blocks (never listed; at first one block
 *     covers the whole range). A growth picks the unmapped block that
 *     needs the fewest new bytes: map just enough of its front (to join a
 *     ready free block below), of its back (to join one above), or all of
 *     it, in whole pieces; the new memory merges with its free neighbours,
 *     so growth leaves no hole. When no unmapped block can serve, reserve
 *     another range. The first range is reserved when the pool is created
 *     (the shim builds its stacks when a primary context is retained), so
 *     a fresh process's first cudaMalloc does not pay for the reservation.
 *  2. Remap (options.remap, free_sync barrier): when whole free pieces lie
 *     elsewhere in the range (not in the ready blocks the growth joins),
 *     issue a barrier (refused while a stream capture is open: then no
 *     remap). If every block whose pieces the remap takes (top of the
 *     range down, up to as many bytes as the growth maps) is idle — its
 *     idle generation, the barrier that released it, has passed on the GPU
 *     (gpu->barrier_passed, asked once per remap for the newest passed
 *     barrier) — unmap them at once; otherwise lend them (step 6,
 *     remap_lend, the default), or (remap_lend 0) wait on the host for the
 *     newest barrier that released one of them (gpu->barrier_wait, a
 *     cuEventSynchronize: the work queued after that barrier keeps the GPU
 *     busy), and only when one of them was not released by a barrier
 *     (IDLE_NEVER) or the wait fails, synchronize the device (a ready block
 *     may have been freed while a kernel still used it; unmapping does not
 *     wait). Then plan again (a hole may now serve): the growth keeps the
 *     mapped total instead of adding to it. Moved pieces keep their
 *     physical memory where the GPU allows (pool->stash).
 *  3. Idle generations: fence completed, device synchronized or fresh
 *     memory 0; released by barrier g: g; unknown (steal, stream-ordered
 *     free, free_sync none) UINT64_MAX; merges take the max, splits keep it.
 *  4. Each remap spends a credit; a burst of REMAP_BURST is allowed, then
 *     one more per remap_turnover_percent % of reserved bytes that barriers
 *     released (pool_remap_earn_locked): a loop that would remap at every
 *     step grows instead once the burst is spent.
 *  5. Remap slack (remap_slack_percent, default 0 = off): a remap whose
 *     pieces are not idle yet (step 2 would wait on the host) is left out,
 *     and the pool grows, while reserved after the growth stays within that
 *     share above the most bytes in use plus the need seen at any growth;
 *     no credit is spent. The wait drains the GPU's queue; the slack trades
 *     memory for it. (Checked before lending: with a slack the pool grows
 *     instead of lending.)
 *  6. Lending (remap_lend, default 1; the GPU must map a handle twice:
 *     vm_map_handle on a mapped handle): pieces that are not idle move
 *     without a host wait. ps_vm_range_lend hands their handles to the
 *     stash while they stay mapped; the growth maps them a second time
 *     (vm_map_handle) where it needs them; the old addresses become a LENT
 *     block (in the lent list, keeping the idle generation of the block
 *     they were cut from). Safe as reuse in place is: the new addresses
 *     are handed out now, and everything issued from now on is ordered
 *     after the barrier that released the pieces; a kernel issued before
 *     it goes on using the old addresses, which stay mapped. A LENT block
 *     is unmapped (vm_unmap_keep: the memory lives on where it serves;
 *     then UNMAPPED, merged) once its barrier passed: at the next growth,
 *     before it plans (one newest_passed query, which the remap reuses),
 *     before a remap unmaps pieces idle at the same barrier (their lent
 *     twins are older; an address that goes there makes the growth plan
 *     again: settle_lent_locked), and at a trim (after a device
 *     synchronize, before any other unmap). A piece whose lent
 *     twin could not be unmapped is never unmapped itself (the pool would
 *     count memory the twin still holds). Lent addresses hold no memory
 *     of their own: reserved counts each piece once, where it serves. A
 *     growth that fails to map takes its lent blocks back as free blocks
 *     and is tried again without lending; a failure other than "out of
 *     memory" (a driver that will not map memory twice) ends lending for
 *     that pool, with a warning.
 *  7. Giving back (core/pool_growth.c, step 5): the lent addresses first,
 *     then every whole run inside a ready free block is unmapped, leaving
 *     an UNMAPPED block there (merged with unmapped neighbours). The device
 *     is synchronized first (a ready block may have been freed while a
 *     kernel still used it), except for blocks of the pinned range that a
 *     completed fence released.
 * Guarantees: growth leaves no hole (new memory merges with its free
 * neighbours); a piece is unmapped or moved only when no kernel can still
 * touch it (idle at a passed barrier, after a device synchronize, or, in
 * the pinned range, fenced), or lent while it stays mapped at its old
 * address until its barrier passed; a run is unmapped, moved and lent only
 * whole; reserved counts every piece once, where it serves.
 */
#include "pool_internal.h"

#include <stdlib.h>
#include <string.h>

/* Test hook (ps_pool_test_skip_idle_check): remap treats every ready
 * block as idle, as if the check were missing (negative control). */
static _Atomic int pool_test_skip_idle_check;

void ps_pool_test_skip_idle_check(int on)
{
    atomic_store(&pool_test_skip_idle_check, on);
}

/* Test hook (ps_pool_test_return_lent_at_once): lent addresses are
 * unmapped right after the growth that lent them (negative control). */
static _Atomic int pool_test_return_lent_at_once;

void ps_pool_test_return_lent_at_once(int on)
{
    atomic_store(&pool_test_return_lent_at_once, on);
}

/* Remap's credit (remap_wanted_locked): it starts at REMAP_BURST remaps;
 * `released` bytes of cudaFree'd memory that a barrier released earn
 * released / (remap_turnover_percent % of reserved) more, up to
 * REMAP_BURST (remap_turnover_percent 0: no bound). Called on the barrier
 * path only. */
void pool_remap_earn_locked(pool_t *pool, uint64_t released)
{
    uint64_t per_remap = pool->lists.bytes_reserved / 100 * pool->options.remap_turnover_percent;
    uint64_t cap = (uint64_t)REMAP_BURST * REMAP_CREDIT_UNIT;
    if (!per_remap || pool->remap_credit >= cap) {
        pool->remap_credit = cap;
        return;
    }
    uint64_t earned = released / per_remap >= REMAP_BURST ? cap : released * REMAP_CREDIT_UNIT / per_remap;
    pool->remap_credit = pool->remap_credit + earned > cap ? cap : pool->remap_credit + earned;
}


/* ---- expandable ranges ------------------------------------------------- */

/* The unmapped and the lent lists: blocks of one state linked by
 * prev_free/next_free from *head, their sizes summed in *bytes. */
static void state_list_insert(pool_t *pool, uint32_t *head, uint64_t *bytes, uint8_t state, uint32_t index)
{
    pool_block_t *b = &pool->lists.blocks[index];
    b->state = state;
    b->prev_free = NIL;
    b->next_free = *head;
    if (*head != NIL)
        pool->lists.blocks[*head].prev_free = index;
    *head = index;
    *bytes += b->size;
}

static void state_list_remove(pool_t *pool, uint32_t *head, uint64_t *bytes, uint32_t index)
{
    pool_block_t *b = &pool->lists.blocks[index];
    if (b->prev_free != NIL)
        pool->lists.blocks[b->prev_free].next_free = b->next_free;
    else
        *head = b->next_free;
    if (b->next_free != NIL)
        pool->lists.blocks[b->next_free].prev_free = b->prev_free;
    *bytes -= b->size;
}

static void unmapped_insert(pool_t *pool, uint32_t index)
{
    state_list_insert(pool, &pool->unmapped_head, &pool->bytes_unmapped, BLOCK_UNMAPPED, index);
}

static void unmapped_remove(pool_t *pool, uint32_t index)
{
    state_list_remove(pool, &pool->unmapped_head, &pool->bytes_unmapped, index);
}

/* Unmapped block `index` absorbs unmapped physical neighbours (or is
 * absorbed by the one below); returns the block that remains. */
static uint32_t unmapped_merge(pool_t *pool, uint32_t index)
{
    uint32_t prev = pool->lists.blocks[index].prev_phys;
    if (prev != NIL && pool->lists.blocks[prev].state == BLOCK_UNMAPPED) {
        unmapped_remove(pool, index);
        unmapped_remove(pool, prev);
        pool_block_t *p = &pool->lists.blocks[prev], *b = &pool->lists.blocks[index];
        p->size += b->size;
        p->next_phys = b->next_phys;
        if (b->next_phys != NIL)
            pool->lists.blocks[b->next_phys].prev_phys = prev;
        pool_lists_recycle_descriptor(&pool->lists, index);
        unmapped_insert(pool, prev);
        index = prev;
    }
    uint32_t next = pool->lists.blocks[index].next_phys;
    if (next != NIL && pool->lists.blocks[next].state == BLOCK_UNMAPPED) {
        unmapped_remove(pool, index);
        unmapped_remove(pool, next);
        pool_block_t *b = &pool->lists.blocks[index], *n = &pool->lists.blocks[next];
        b->size += n->size;
        b->next_phys = n->next_phys;
        if (n->next_phys != NIL)
            pool->lists.blocks[n->next_phys].prev_phys = index;
        pool_lists_recycle_descriptor(&pool->lists, next);
        unmapped_insert(pool, index);
    }
    return index;
}

/* Reserves one more range of address space, as a chunk made of one
 * unmapped block. */
static int add_range_locked(pool_t *pool, size_t need)
{
    const ps_pool_options_t *o = &pool->options;
    size_t size = o->expandable_reserve;
    if (!size) {
        size_t free_bytes = 0, total = 0;
        if (pool->gpu->mem_get_info(pool->gpu->ctx, &free_bytes, &total) != PS_OK || !total)
            total = 32 * PS_GiB;
        size = total > PS_TiB / 2 ? PS_TiB : 2 * total;
    }
    if (size < need)
        size = need;
    uint32_t slot;
    if (pool_lists_chunk_slot(&pool->lists, &slot) != PS_OK)
        return PS_ENOMEM;
    ps_vm_range_t *range;
    int status = ps_vm_range_create(pool->gpu, size, o->expandable_piece, &range);
    if (status != PS_OK)
        return status;
    uint32_t index = pool_lists_add_chunk(
        &pool->lists, slot, &(pool_chunk_t){(void *)range->base, range->size, range->base, range->size, NIL, range});
    unmapped_insert(pool, index); /* nothing behind it */
    return PS_OK;
}

void pool_reserve_first_range_locked(pool_t *pool)
{
    if (pool->expandable && !pool->lists.chunks_count)
        (void)add_range_locked(pool, 0);
}

/* expandable_map_first: the first piece of the range reserved at creation
 * is mapped then too, a free ready block, so that a program's first small
 * cudaMalloc maps nothing (NVIDIA's matrixMul sample: 578 us in its
 * allocation calls under the pool against 261 us natively, 150 us with
 * the piece mapped at creation; H200, 2026-11-27, poolshim ab). Best
 * effort: a failure leaves it to the first growth. A request for a run of
 * its own is mapped apart from it (plan_growth_locked). */
void pool_map_first_piece_locked(pool_t *pool)
{
    uint32_t grown;
    if (pool->expandable && pool->lists.chunks_count && !pool->lists.bytes_reserved &&
        pool_lists_reserve_descriptors(&pool->lists, 2) == PS_OK)
        (void)pool_grow_expandable_locked(pool, pool->lists.chunks[0].range->piece, &grown);
}

/* The size of block `index` if it is free in the ready list, else 0. */
static inline size_t ready_size(const pool_t *pool, uint32_t index)
{
    if (index == NIL)
        return 0;
    const pool_block_t *b = &pool->lists.blocks[index];
    return b->state == BLOCK_FREE && b->owner == OWNER_READY ? b->size : 0;
}

/* A growth of an expandable pool: map [start, start + length) of unmapped
 * block `block`. */
typedef struct growth_plan {
    uint32_t block;   /* the unmapped block, or NIL: none can serve */
    uintptr_t start;  /* first address to map */
    size_t length;    /* bytes to map (whole pieces) */
    int alone;        /* 1: apart from any free block (plan_alone_locked) */
} growth_plan_t;

/* A growth that maps its request as one run of its own (run_wanted):
 * the back of an unmapped block, away from any ready free block, so the
 * new memory merges with nothing and the block is that one physical
 * allocation from its first byte: a copy crosses one allocation, an IPC
 * export sends one piece, and the block is what a handle could name
 * (communication libraries register a buffer by the handle at its start;
 * the shim refuses cuMemRetainAllocationHandle for every block today,
 * docs/design.md "Several GPUs" 5.). The lowest such block; NIL when none
 * is big enough. */
static growth_plan_t plan_alone_locked(const pool_t *pool, size_t need)
{
    growth_plan_t best = {NIL, 0, SIZE_MAX};
    for (uint32_t u = pool->unmapped_head; u != NIL; u = pool->lists.blocks[u].next_free) {
        const pool_block_t *b = &pool->lists.blocks[u];
        size_t piece = pool->lists.chunks[b->chunk].range->piece, length = ps_align_up(need, piece);
        size_t gap = ready_size(pool, b->next_phys) ? piece : 0; /* (unmapped, between the two) */
        if (b->size < length + gap)
            continue;
        uintptr_t start = b->addr + b->size - gap - length;
        if (start == b->addr && ready_size(pool, b->prev_phys))
            continue; /* it would join the ready block below */
        if (best.block == NIL || b->addr < pool->lists.blocks[best.block].addr)
            best = (growth_plan_t){u, start, length, 1};
    }
    return best;
}

/* The unmapped block that needs the fewest new pieces to give a ready
 * block of at least `need` bytes (front to join a ready block below, back
 * to join one above, or all of it). */
static growth_plan_t plan_joined_locked(const pool_t *pool, size_t need)
{
    growth_plan_t best = {NIL, 0, SIZE_MAX};
    for (uint32_t u = pool->unmapped_head; u != NIL; u = pool->lists.blocks[u].next_free) {
        const pool_block_t *b = &pool->lists.blocks[u];
        size_t piece = pool->lists.chunks[b->chunk].range->piece;
        size_t below = ready_size(pool, b->prev_phys), above = ready_size(pool, b->next_phys);
        if (below + b->size + above < need)
            continue;
        /* below, above < need: the request did not fit in them */
        size_t front = ps_align_up(need - below, piece), back = ps_align_up(need - above, piece);
        growth_plan_t plan = {u, b->addr, b->size};
        if (front && front <= b->size && front <= back)
            plan.length = front;
        else if (back && back <= b->size)
            plan = (growth_plan_t){u, b->addr + b->size - back, back};
        if (plan.length < best.length ||
            (plan.length == best.length && b->addr < pool->lists.blocks[best.block].addr))
            best = plan;
    }
    return best;
}

/* Whether a growth for a request of `need` bytes that maps `bytes` (0:
 * not planned yet) maps its new memory as one run (one create, map and
 * access call) rather than a run per piece. A run goes back, and moves in
 * a remap, only whole, so runs are for what a loop does not move (replay of
 * the committed PyTorch logs, docs/design.md "Runs": one run per growth
 * took the transformer from 1.006x to 1.056x reserved/requested, runs from
 * 256 MiB up 1.036x, from 1 GiB up nothing):
 *  - the map, or the request, is at least expandable_run_min: the request
 *    counts too, since a growth maps only what its free neighbour lacks
 *    (a 1 GiB cudaMalloc after a 256 B one mapped 1 GiB - 2 MiB as 511
 *    pieces, 25.8 ms against 0.45 ms for one run; H200, 2026-11-27,
 *    tools/bench/first_malloc.cu warm); the first 32 GiB cudaMalloc is one
 *    create + map + access instead of 16,384 of each;
 *  - setup: nothing was freed to the pool yet and the request is at least
 *    expandable_setup_run_min. What a program makes before its first free
 *    it mostly keeps (weights, workspaces, peer and communication
 *    buffers); in one piece its copies run at native speed (the copy
 *    engine pays ~0.45 us per physical allocation it crosses: 256 MiB
 *    peer copies 0.94-0.97x native in 2 MiB pieces). The loop's growths,
 *    after the first free, stay pieces, which remap can move. */
static int run_wanted(const pool_t *pool, size_t need, size_t bytes)
{
    const ps_pool_options_t *o = &pool->options;
    if (o->expandable_run_min && (need >= o->expandable_run_min || bytes >= o->expandable_run_min))
        return 1;
    return o->expandable_setup_run_min && need >= o->expandable_setup_run_min &&
           !atomic_load_explicit(&pool->freed, memory_order_relaxed);
}

/* Step c, expandable: plan_joined_locked; a growth whose request run_wanted
 * maps as one run goes alone (plan_alone_locked) when joining a free
 * neighbour would save less than an eighth of the request (before the
 * first free, a piece's free tail at most). A plan alone that finds no
 * memory is tried joined (grow_expandable_once_locked): near a full device
 * the tail may be what makes it fit. */
static growth_plan_t plan_growth_locked(const pool_t *pool, size_t need)
{
    growth_plan_t joined = plan_joined_locked(pool, need);
    if (!run_wanted(pool, need, 0))
        return joined;
    growth_plan_t alone = plan_alone_locked(pool, need);
    if (alone.block == NIL || (joined.block != NIL && alone.length > joined.length + need / 8))
        return joined;
    return alone;
}

/* Lent blocks (remap_lend): still mapped, their memory serving a growth
 * elsewhere, until the barrier idle_gen passed. */
static void lent_insert(pool_t *pool, uint32_t index)
{
    state_list_insert(pool, &pool->lent_head, &pool->bytes_lent, BLOCK_LENT, index);
}

static void lent_remove(pool_t *pool, uint32_t index)
{
    state_list_remove(pool, &pool->lent_head, &pool->bytes_lent, index);
}

/* Cuts [lo, lo + length) out of block `index` (taken out of its list by
 * the caller): the rest on each side, if any, goes to `keep_rest` (its
 * list); returns the block of the cut-out part (in no list, same state and
 * idle generation; `index` itself when nothing lies below lo). Needs two
 * reserved descriptors. */
static uint32_t cut_span_locked(pool_t *pool, uint32_t index, uintptr_t lo, size_t length,
                                void (*keep_rest)(pool_t *, uint32_t))
{
    const pool_block_t *b = &pool->lists.blocks[index];
    uintptr_t end = b->addr + b->size;
    uint32_t span = index;
    if (lo > b->addr) {
        span = pool_lists_split(&pool->lists, index, lo);
        keep_rest(pool, index);
    }
    if (lo + length < end)
        keep_rest(pool, pool_lists_split(&pool->lists, span, lo + length));
    return span;
}

static void ready_insert(pool_t *pool, uint32_t index)
{
    pool_lists_insert(&pool->lists, OWNER_READY, index);
}

/* Cuts [lo, lo + length) out of ready free block `index` (in the ready
 * list): the free rest on both sides goes back to the ready list; returns
 * the block of the cut-out part (in no list, same idle generation). Needs
 * two reserved descriptors. */
static uint32_t cut_out_locked(pool_t *pool, uint32_t index, uintptr_t lo, size_t length)
{
    pool_lists_remove(&pool->lists, index);
    return cut_span_locked(pool, index, lo, length, ready_insert);
}

/* Unmaps the whole pieces of ready free block `index` (of expandable chunk
 * `slot`) in [lo, hi), leaving an UNMAPPED block there (merged with
 * unmapped neighbours) and the free rest on both sides in the ready list.
 * The caller has synchronized the device and reserved two descriptors.
 * Returns the bytes unmapped (fewer than asked when a vm_unmap failed: the
 * rest stays mapped and free); *after = the block after the hole (NIL: none). */
size_t pool_unmap_block_pieces_locked(pool_t *pool, uint32_t slot, uint32_t index, uintptr_t lo, uintptr_t hi,
                                        ps_vm_stash_t *stash, uint32_t *after)
{
    *after = pool->lists.blocks[index].next_phys;
    ps_vm_range_t *range = pool->lists.chunks[slot].range;
    size_t done = 0;
    uint64_t unmaps = range->unmaps;
    if (stash)
        ps_vm_range_unmap_keep(range, lo, hi - lo, stash, &done);
    else
        ps_vm_range_unmap(range, lo, hi - lo, &done);
    if (!done)
        return 0;
    uint32_t hole = cut_out_locked(pool, index, lo, done);
    unmapped_insert(pool, hole);
    *after = pool->lists.blocks[unmapped_merge(pool, hole)].next_phys;
    pool_lists_count_return(&pool->lists, done, range->unmaps - unmaps);
    return done;
}

/* Lends the whole pieces of ready free block `index` in [lo, hi) to
 * pool->stash (ps_vm_range_lend: they stay mapped), leaving a LENT block
 * there with the block's idle generation. Two reserved descriptors.
 * Returns the bytes lent (0 when the stash could not grow). */
static size_t lend_block_pieces_locked(pool_t *pool, uint32_t slot, uint32_t index, uintptr_t lo, uintptr_t hi)
{
    if (ps_vm_range_lend(pool->lists.chunks[slot].range, lo, hi - lo, &pool->stash) != PS_OK)
        return 0;
    lent_insert(pool, cut_out_locked(pool, index, lo, hi - lo));
    pool_lists_count_return(&pool->lists, hi - lo, 0); /* counted where the memory serves next */
    return hi - lo;
}

/* Unmaps the lent blocks whose barrier `passed` has passed (IDLE_NEVER:
 * the device was synchronized, all of them): their memory lives on where
 * it was lent; the addresses become UNMAPPED (merged), ready for growth. A
 * failed unmap leaves the rest of that block lent, for a later try.
 * Returns 1 when none of those is left: a piece whose memory was lent may
 * then be unmapped (and its memory freed) where it serves now. Its lent
 * address was released by an older barrier than the one that released
 * the piece, so the caller that found the piece idle at `passed` passes
 * the same `passed` here first; were a lent address left mapped, the
 * unmap would free nothing and the pool would count memory it no longer
 * holds. */
int pool_return_lent_locked(pool_t *pool, uint64_t passed)
{
    int left = 0;
    for (uint32_t index = pool->lent_head, next; index != NIL; index = next) {
        next = pool->lists.blocks[index].next_free;
        pool_block_t *b = &pool->lists.blocks[index];
        if (passed != IDLE_NEVER && b->idle_gen > passed &&
            !atomic_load_explicit(&pool_test_skip_idle_check, memory_order_relaxed))
            continue;
        ps_vm_range_t *range = pool->lists.chunks[b->chunk].range;
        size_t done = 0;
        if (pool_lists_reserve_descriptors(&pool->lists, 2) != PS_OK)
            return 0;
        uint64_t unmaps = range->unmaps;
        ps_vm_range_unlend(range, b->addr, b->size, &done);
        left |= done < b->size;
        if (!done)
            continue;
        lent_remove(pool, index);
        if (done < b->size) { /* the front went: it becomes unmapped, the rest stays lent */
            uint32_t rest = pool_lists_split(&pool->lists, index, b->addr + done);
            lent_insert(pool, rest);
        }
        unmapped_insert(pool, index);
        unmapped_merge(pool, index);
        pool_lists_count_return(&pool->lists, 0, range->unmaps - unmaps); /* (lent addresses hold no memory) */
    }
    return !left;
}

/* The whole runs inside ready free block `index` of `range`, as [*lo, *hi)
 * (a run is unmapped or lent whole: core/vm_range.h). */
int pool_whole_pieces_of(const pool_t *pool, const ps_vm_range_t *range, uint32_t index, uintptr_t *lo,
                           uintptr_t *hi)
{
    const pool_block_t *b = &pool->lists.blocks[index];
    if (b->state != BLOCK_FREE || b->owner != OWNER_READY)
        return 0;
    *lo = b->addr;
    *hi = b->addr + b->size;
    return ps_vm_range_whole_runs(range, lo, hi);
}

/* [lo, hi) (whole runs) cut to the runs that give back `want` bytes and no
 * more than a run beyond: the new hi. */
uintptr_t pool_runs_for(const ps_vm_range_t *range, uintptr_t lo, uintptr_t hi, uint64_t want)
{
    if (hi - lo <= want)
        return hi;
    uintptr_t end = ps_vm_range_boundary_up(range, lo + want);
    return end < hi ? end : hi;
}

/* Whether a growth of an expandable pool may first move free pieces
 * (options.remap, free_sync barrier): a remap credit is left
 * (remap_earn_locked). A program whose every step needs a block the layout
 * of that step lacks would otherwise pay a device synchronize per step to
 * keep the mapped total (replay of the MLP log with barrier_pending_percent
 * 1: 37 per 1000 allocations, one per step, each after 10 % of reserved
 * turned over); one plain growth instead gives the layout the room it
 * lacks. */
static int remap_wanted_locked(const pool_t *pool)
{
    const ps_pool_options_t *o = &pool->options;
    if (!o->remap || o->free_sync != PS_FREE_SYNC_BARRIER || !pool->gpu->device_synchronize)
        return 0;
    return pool->remap_credit >= REMAP_CREDIT_UNIT;
}

/* The last block of chunk `slot` (in address order). */
static uint32_t last_block_locked(const pool_t *pool, uint32_t slot)
{
    uint32_t index = pool->lists.chunks[slot].first_block;
    while (pool->lists.blocks[index].next_phys != NIL)
        index = pool->lists.blocks[index].next_phys;
    return index;
}

/* Whether ready free block `index` of chunk `slot` may give pieces to
 * `plan`: not one of the blocks next to the planned block, which the
 * growth joins, and idle once barrier `passed` has passed (IDLE_NEVER: the
 * device was synchronized, every block is idle); [*lo, *hi) = its whole
 * pieces. */
static int spare_pieces_of(const pool_t *pool, const growth_plan_t *plan, uint32_t slot, uint32_t index,
                           uint64_t passed, uintptr_t *lo, uintptr_t *hi)
{
    const pool_block_t *planned = &pool->lists.blocks[plan->block];
    return index != planned->prev_phys && index != planned->next_phys &&
           (passed == IDLE_NEVER || pool->lists.blocks[index].idle_gen <= passed ||
            atomic_load_explicit(&pool_test_skip_idle_check, memory_order_relaxed)) &&
           pool_whole_pieces_of(pool, pool->lists.chunks[slot].range, index, lo, hi);
}

/* The newest barrier the GPU has passed (IDLE_NOW: none known): a ready
 * block with idle_gen <= it is idle. At most PS_BARRIER_RING
 * barrier_passed calls, newest first (an older barrier than the ring
 * remembers has passed once the oldest remembered one has); a failed call
 * counts as not passed. */
uint64_t pool_newest_passed_locked(const pool_t *pool)
{
    const ps_gpu_ops_t *gpu = pool->gpu;
    if (!gpu->barrier_generation || !gpu->barrier_passed)
        return IDLE_NOW;
    uint64_t newest = gpu->barrier_generation(gpu->ctx);
    for (uint64_t g = newest; g > 0 && newest - g < PS_BARRIER_RING; g--)
        if (gpu->barrier_passed(gpu->ctx, g) == PS_OK)
            return g;
    return IDLE_NOW;
}

/* The barrier that must have passed for every block that
 * unmap_for_growth_locked(plan) would take pieces from to be idle: the
 * newest idle generation among them (IDLE_NEVER: one of them is not known
 * to become idle by any barrier; a device synchronize is needed). */
static uint64_t choice_idle_generation_locked(const pool_t *pool, const growth_plan_t *plan)
{
    size_t taken = 0;
    uint64_t newest = IDLE_NOW;
    for (uint32_t slot = pool->lists.chunks_count; slot-- > 0 && taken < plan->length;) {
        if (!pool->lists.chunks[slot].base || !pool->lists.chunks[slot].range)
            continue;
        for (uint32_t index = last_block_locked(pool, slot); index != NIL && taken < plan->length;
             index = pool->lists.blocks[index].prev_phys) {
            uintptr_t lo, hi;
            if (!spare_pieces_of(pool, plan, slot, index, IDLE_NEVER, &lo, &hi))
                continue;
            if (hi - lo > plan->length - taken && /* as unmap_for_growth_locked cuts it */
                (lo = ps_vm_range_boundary_up(pool->lists.chunks[slot].range, hi - (plan->length - taken))) >= hi)
                continue;
            if (pool->lists.blocks[index].idle_gen > newest)
                newest = pool->lists.blocks[index].idle_gen;
            taken += hi - lo;
        }
    }
    return newest;
}

/* Whether every block that unmap_for_growth_locked(plan) would take
 * pieces from (top of each range down, up to plan->length bytes) is idle
 * once barrier `passed` has passed (IDLE_NEVER: the device was
 * synchronized). */
static int choice_is_idle_locked(const pool_t *pool, const growth_plan_t *plan, uint64_t passed)
{
    return passed == IDLE_NEVER || atomic_load_explicit(&pool_test_skip_idle_check, memory_order_relaxed) ||
           choice_idle_generation_locked(pool, plan) <= passed;
}

/* Whether any whole free piece could move to `plan` (remap); `passed` as
 * in spare_pieces_of. */
static int has_spare_pieces_locked(const pool_t *pool, const growth_plan_t *plan, uint64_t passed)
{
    for (uint32_t slot = 0; slot < pool->lists.chunks_count; slot++) {
        if (!pool->lists.chunks[slot].base || !pool->lists.chunks[slot].range)
            continue;
        for (uint32_t index = pool->lists.chunks[slot].first_block; index != NIL; index = pool->lists.blocks[index].next_phys) {
            uintptr_t lo, hi;
            if (spare_pieces_of(pool, plan, slot, index, passed, &lo, &hi))
                return 1;
        }
    }
    return 0;
}

/* Remap on growth: unmaps up to plan->length bytes of spare whole free
 * pieces, from the top of each range down (replay of the PyTorch logs: a
 * little better than bottom up, largest or smallest first; all within
 * 0.1 %), so the growth keeps the mapped total instead of adding to it.
 * The caller made sure no kernel can still touch them: they are idle
 * (choice_is_idle_locked) or the device was synchronized (a ready block
 * may have been freed while a kernel still used it, and unmapping does not
 * wait). Their physical memory is kept in pool->stash where the GPU
 * allows (vm_unmap_keep), for the growth to map again instead of a release
 * and a create per piece. Returns the bytes unmapped; on a failure it
 * stops, leaving the pool consistent. Keeps two descriptors reserved for
 * the growth. */
static size_t unmap_for_growth_locked(pool_t *pool, const growth_plan_t *plan)
{
    size_t unmapped = 0;
    for (uint32_t slot = pool->lists.chunks_count; slot-- > 0 && unmapped < plan->length;) {
        ps_vm_range_t *range = pool->lists.chunks[slot].range;
        if (!pool->lists.chunks[slot].base || !range)
            continue;
        for (uint32_t index = last_block_locked(pool, slot), prev; index != NIL && unmapped < plan->length;
             index = prev) {
            prev = pool->lists.blocks[index].prev_phys; /* stays valid: the hole merges into it, never it away */
            uintptr_t lo, hi;
            if (!spare_pieces_of(pool, plan, slot, index, IDLE_NEVER, &lo, &hi))
                continue;
            if (hi - lo > plan->length - unmapped && /* the top runs, no more than the growth maps */
                (lo = ps_vm_range_boundary_up(range, hi - (plan->length - unmapped))) >= hi)
                continue;
            if (pool_lists_reserve_descriptors(&pool->lists, 4) != PS_OK)
                return unmapped;
            uint32_t after;
            size_t done = pool_unmap_block_pieces_locked(pool, slot, index, lo, hi, &pool->stash, &after);
            unmapped += done;
            if (done < hi - lo)
                return unmapped;
        }
    }
    return unmapped;
}

/* A growth that lent pieces failed to map: the blocks lent since
 * `lent_before` (the head of the lent list then) are free ready blocks
 * again, and their handles leave the stash (they are still mapped where
 * they were; nothing was freed). */
static void take_back_lent_locked(pool_t *pool, uint32_t lent_before)
{
    while (pool->lent_head != lent_before && pool->lent_head != NIL) {
        uint32_t index = pool->lent_head;
        pool_block_t *b = &pool->lists.blocks[index];
        ps_vm_range_t *range = pool->lists.chunks[b->chunk].range;
        size_t runs = ps_vm_range_take_back(range, b->addr, b->size);
        pool->stash.count = pool->stash.count > runs ? pool->stash.count - runs : 0;
        lent_remove(pool, index);
        pool_lists_count_growth(&pool->lists, b->size, 0); /* (below the peak: it was counted before) */
        pool_lists_release(&pool->lists, index, OWNER_READY, 0, b->idle_gen);
    }
}

/* Remap by lending (remap_lend): takes up to plan->length bytes of spare
 * whole free pieces, as unmap_for_growth_locked chooses them, except
 * blocks whose idle generation is unknown (IDLE_NEVER), and lends them
 * to pool->stash (they stay mapped: a kernel issued before their release
 * may still touch them). The growth maps their memory a second time. That
 * is as safe as handing the blocks out in place: everything issued from
 * now on is ordered after the barrier that released them. Their old
 * addresses are unmapped once that barrier passed (pool_return_lent_locked).
 * Returns the bytes lent. */
static size_t lend_for_growth_locked(pool_t *pool, const growth_plan_t *plan)
{
    size_t lent = 0;
    for (uint32_t slot = pool->lists.chunks_count; slot-- > 0 && lent < plan->length;) {
        ps_vm_range_t *range = pool->lists.chunks[slot].range;
        if (!pool->lists.chunks[slot].base || !range)
            continue;
        for (uint32_t index = last_block_locked(pool, slot), prev; index != NIL && lent < plan->length;
             index = prev) {
            prev = pool->lists.blocks[index].prev_phys; /* stays valid: a lent block never merges */
            uintptr_t lo, hi;
            if (!spare_pieces_of(pool, plan, slot, index, IDLE_NEVER - 1, &lo, &hi))
                continue;
            if (hi - lo > plan->length - lent && /* the top runs, no more than the growth maps */
                (lo = ps_vm_range_boundary_up(range, hi - (plan->length - lent))) >= hi)
                continue;
            if (pool_lists_reserve_descriptors(&pool->lists, 4) != PS_OK)
                return lent;
            size_t done = lend_block_pieces_locked(pool, slot, index, lo, hi);
            if (!done)
                return lent;
            lent += done;
        }
    }
    return lent;
}

/* Whether remap may lend (remap_lend and the GPU maps memory twice). */
static int lend_possible_locked(const pool_t *pool)
{
    const ps_gpu_ops_t *gpu = pool->gpu;
    return pool->options.remap_lend && !pool->lend_refused && gpu->vm_map_handle && gpu->vm_unmap_keep &&
           gpu->vm_drop;
}

/* pool_newest_passed_locked not asked yet (remap_for_growth_locked asks it). */
#define PASSED_UNKNOWN (IDLE_NEVER - 1)

/* pool_return_lent_locked(passed) in the middle of a remap: an address that
 * goes may merge with the unmapped block `plan` grows into, so the growth
 * is planned again (its block and neighbours may be others now; the caller
 * checks that the pieces the new plan takes are idle). Returns as
 * pool_return_lent_locked. */
static int settle_lent_locked(pool_t *pool, uint64_t passed, growth_plan_t *plan, size_t need)
{
    uint64_t lent = pool->bytes_lent;
    int settled = pool_return_lent_locked(pool, passed);
    if (pool->bytes_lent != lent)
        *plan = plan_growth_locked(pool, need);
    return settled && plan->block != NIL;
}

/* Whether the growth of `plan` keeps reserved within remap_slack_percent
 * above the most bytes in use seen at a growth (5. above). */
static int within_slack_locked(const pool_t *pool, const growth_plan_t *plan)
{
    unsigned slack = pool->options.remap_slack_percent;
    return slack && pool->lists.bytes_reserved + plan->length <=
                        pool->peak_need_in_use + pool->peak_need_in_use / 100 * slack;
}

/* Remap: spare pieces exist and a barrier can be issued now (one is
 * refused while a stream capture is open, which a device synchronize
 * would invalidate; it also releases what is pending). When every block
 * the usual choice takes pieces from is idle (its releasing barrier has
 * passed on the GPU: nothing issued before it can touch it; the newest
 * passed barrier is asked once, pool_newest_passed_locked), the pieces move
 * with no device synchronize; otherwise the device is synchronized first,
 * as before. Either way the same pieces move: the layout and the peaks are
 * what they were. Replay (docs/benchmarks.md), transformer log with a
 * 2-5 ms GPU lag: moving idle pieces first, synchronizing only for the
 * rest, saved a few more synchronizes but reserved one piece more;
 * mapping new memory instead of synchronizing for busy pieces never
 * synchronizes but reserved 1.03-1.05x instead of 1.006x. When they are
 * not idle, they are lent instead where remap_lend allows (*lend = 1: the
 * caller lends them once the final plan is known, lend_for_growth_locked):
 * no host wait, the same memory. Returns 1 when pieces moved, the device
 * was synchronized for them, or they are to be lent: one remap credit
 * spent. */
static int remap_for_growth_locked(pool_t *pool, growth_plan_t *plan, size_t need, uint64_t passed, int *lend)
{
    *lend = 0;
    if (!remap_wanted_locked(pool) || !has_spare_pieces_locked(pool, plan, IDLE_NEVER) ||
        !pool_barrier_release_locked(pool))
        return 0;
    const ps_gpu_ops_t *gpu = pool->gpu;
    uint64_t needed;
    if (passed == PASSED_UNKNOWN)
        passed = pool_newest_passed_locked(pool);
    if (choice_is_idle_locked(pool, plan, passed)) {
        /* (lent addresses idle at `passed` went before the plan was made:
         * one is left here only if its unmap failed then) */
        if (!settle_lent_locked(pool, passed, plan, need) || !choice_is_idle_locked(pool, plan, passed) ||
            !unmap_for_growth_locked(pool, plan))
            return 0;
        pool->remaps_idle++;
    } else if (within_slack_locked(pool, plan)) {
        pool->remaps_slack++; /* no credit spent: nothing moved */
        return 0;
    } else if (lend_possible_locked(pool) && has_spare_pieces_locked(pool, plan, IDLE_NEVER - 1)) {
        *lend = 1; /* (counted once lent) */
    } else if (gpu->barrier_wait && (needed = choice_idle_generation_locked(pool, plan)) != IDLE_NEVER &&
               gpu->barrier_wait(gpu->ctx, needed) == PS_OK) {
        /* wait for the one barrier that released them: the GPU keeps the
         * work queued after it (a synchronize would drain the queue) */
        pool->remap_waits++;
        if (settle_lent_locked(pool, needed, plan, need) && choice_idle_generation_locked(pool, plan) <= needed)
            unmap_for_growth_locked(pool, plan);
    } else {
        if (gpu->device_synchronize(gpu->ctx) != PS_OK)
            return 0;
        pool->remap_syncs++;
        if (settle_lent_locked(pool, IDLE_NEVER, plan, need))
            unmap_for_growth_locked(pool, plan);
    }
    pool->remap_credit -= REMAP_CREDIT_UNIT;
    return 1;
}

/* Maps `plan` for a request of `need` bytes (run_wanted says whether in one
 * run) and cuts it out of its unmapped block as a ready free block (merged
 * with its free neighbours); *grown = that block. Reserves the
 * descriptors it and the caller's take need. */
static int map_planned_locked(pool_t *pool, const growth_plan_t *plan, size_t need, uint32_t *grown)
{
    const ps_pool_options_t *o = &pool->options;
    if (o->maximum_size && pool->lists.bytes_reserved + plan->length > o->maximum_size)
        return PS_ENOMEM;
    /* two cuts here (a plan alone with a gap has a rest on both sides)
     * and the caller's take of the grown block: three, before anything
     * changes */
    if (pool_lists_reserve_descriptors(&pool->lists, 3) != PS_OK)
        return PS_ENOMEM;
    ps_vm_range_t *range = pool->lists.chunks[pool->lists.blocks[plan->block].chunk].range;
    uint64_t maps = range->maps;
    int status =
        ps_vm_range_map_kept(range, plan->start, plan->length, &pool->stash, run_wanted(pool, need, plan->length));
    if (status != PS_OK)
        return status;
    unmapped_remove(pool, plan->block);
    /* the unmapped rests stay unmapped: above (a front plan, or the gap a
     * plan alone keeps below a ready block), below (a back plan, or a plan
     * alone), or both (a plan alone with a gap: keeping only the rest below
     * once gave the gap to the new block and so to the free block above) */
    uint32_t mapped = cut_span_locked(pool, plan->block, plan->start, plan->length, unmapped_insert);
    pool_lists_count_growth(&pool->lists, plan->length, range->maps - maps);
    *grown = pool_lists_release(&pool->lists, mapped, OWNER_READY, 0, IDLE_NOW); /* fresh memory; a neighbour's generation wins */
    return PS_OK;
}

static int grow_expandable_once_locked(pool_t *pool, size_t need, uint32_t *grown, int *lent);

/* Step c, expandable: maps the fewest new pieces that give a ready block
 * of at least `need` bytes (reserving another range when no unmapped
 * block can serve); with remap, first moves free pieces there. *grown =
 * the block. Needs two reserved descriptors. A growth that lent pieces
 * and failed (its lent blocks taken back) is tried once more without
 * lending; when the failure was not for lack of memory, the driver would
 * not map memory twice: the pool stops lending (it waits, as with
 * remap_lend 0) and says so once. */
int pool_grow_expandable_locked(pool_t *pool, size_t need, uint32_t *grown)
{
    int lent = 0;
    int status = grow_expandable_once_locked(pool, need, grown, &lent);
    if (status == PS_OK || !lent)
        return status;
    int refused = status != PS_ENOMEM;
    pool->lend_refused = 1; /* for the second try */
    status = grow_expandable_once_locked(pool, need, grown, &lent);
    pool->lend_refused = refused;
    if (refused)
        ps_warning("pool '%s': mapping memory at a second address failed; remap waits for the GPU from now on "
                   "(as with remap_lend = 0)",
                   pool->base.name);
    return status;
}

/* One try of pool_grow_expandable_locked; *lent = 1 when it lent pieces
 * and failed (they were taken back). */
static int grow_expandable_once_locked(pool_t *pool, size_t need, uint32_t *grown, int *lent)
{
    *lent = 0;
    if (pool->lists.bytes_in_use + need > pool->peak_need_in_use)
        pool->peak_need_in_use = pool->lists.bytes_in_use + need;
    uint64_t passed = PASSED_UNKNOWN;
    if (pool->lent_head != NIL) { /* lent addresses whose barrier passed may serve this growth */
        passed = pool_newest_passed_locked(pool);
        pool_return_lent_locked(pool, passed);
    }
    growth_plan_t plan = plan_growth_locked(pool, need);
    if (plan.block == NIL) {
        int status = add_range_locked(pool, need);
        if (status != PS_OK)
            return status == PS_EUNSUPPORTED ? PS_ENOMEM : status;
        plan = plan_growth_locked(pool, need);
        if (plan.block == NIL)
            return PS_ENOMEM;
    }
    uint32_t lent_before = pool->lent_head;
    int lend;
    if (remap_for_growth_locked(pool, &plan, need, passed, &lend)) {
        /* the barrier's blocks and the holes may serve better; the old
         * plan still can (its block and neighbours were left alone) */
        plan = plan_growth_locked(pool, need);
        if (lend)
            lend_for_growth_locked(pool, &plan);
    }
    int status = map_planned_locked(pool, &plan, need, grown); /* (the stash's pieces first) */
    if (status == PS_ENOMEM && plan.alone && pool->lent_head == lent_before && !pool->stash.count) {
        plan = plan_joined_locked(pool, need);
        if (plan.block != NIL)
            status = map_planned_locked(pool, &plan, need, grown);
    }
    if (status != PS_OK && pool->lent_head != lent_before) {
        take_back_lent_locked(pool, lent_before); /* (their handles leave the stash: not dropped) */
        *lent = 1;
    } else if (pool->lent_head != lent_before) {
        pool->remaps_lent++;
        if (atomic_load_explicit(&pool_test_return_lent_at_once, memory_order_relaxed))
            pool_return_lent_locked(pool, IDLE_NEVER); /* the broken variant the GPU test must catch */
    }
    ps_vm_stash_drop(pool->gpu, &pool->stash);           /* what the growth did not need */
    return status;
}

/* Step e, expandable: unmaps every whole piece inside a ready free block.
 * The device is synchronized first: unmapping does not wait for kernels
 * still using the range, and a ready block may have been freed while one
 * ran (a barrier orders later work, not earlier work). Not with a growth
 * budget under free_sync event (the pinned pool's host range, which gives
 * pieces back often): there a block is ready only once a fence recorded
 * after its free completed (idle now), unless a failed host wait released
 * it (idle unknown: synchronized first, as above). */
void pool_unmap_free_pieces_locked(pool_t *pool, uint64_t keep)
{
    int synchronized = 0;
    /* lent addresses go first (idle once the device is synchronized): a
     * piece whose memory they hold is unmapped only after them */
    if (pool->lent_head != NIL) {
        if (pool->gpu->device_synchronize(pool->gpu->ctx) != PS_OK || !pool_return_lent_locked(pool, IDLE_NEVER))
            return;
        synchronized = 1;
    }
    for (uint32_t slot = 0; slot < pool->lists.chunks_count && pool->lists.bytes_reserved > keep; slot++) {
        ps_vm_range_t *range = pool->lists.chunks[slot].range;
        if (!pool->lists.chunks[slot].base || !range)
            continue;
        for (uint32_t index = pool->lists.chunks[slot].first_block, next; index != NIL && pool->lists.bytes_reserved > keep;
             index = next) {
            next = pool->lists.blocks[index].next_phys;
            uintptr_t lo, hi;
            if (!pool_whole_pieces_of(pool, range, index, &lo, &hi))
                continue;
            hi = pool_runs_for(range, lo, hi, pool->lists.bytes_reserved - keep); /* no more than needed */
            if (pool_lists_reserve_descriptors(&pool->lists, 2) != PS_OK)
                continue;
            /* a block released by a failed host wait (idle unknown) needs
             * the synchronize even there */
            int fenced = pool->options.free_sync == PS_FREE_SYNC_EVENT && pool->options.grow_budget_percent &&
                         pool->lists.blocks[index].idle_gen == IDLE_NOW;
            if (!synchronized && !fenced) {
                if (pool->gpu->device_synchronize(pool->gpu->ctx) != PS_OK)
                    return;
                synchronized = 1;
            }
            pool_unmap_block_pieces_locked(pool, slot, index, lo, hi, NULL, &next);
        }
    }
}
