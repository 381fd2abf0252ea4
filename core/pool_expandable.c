/* The expandable range (core/pool_expandable.h): an expandable pool is one
 * chunk over a range of virtual addresses (core/vm_range.c) that grows in
 * place, moves free pieces to where a growth needs them (remap), and lends
 * busy ones.
 *
 * Algorithm
 *  1. The range is tiled by blocks like a chunk; its parts with no memory
 *     behind them are UNMAPPED blocks (at first one block covers it). A
 *     growth picks the unmapped block that needs the fewest new bytes: map
 *     just enough of its front (to join a ready free block below), of its
 *     back (to join one above), or all of it, in whole pieces; the new
 *     memory merges with its free neighbours. A request big enough for a
 *     run of its own (expandable_run_min; before the first free,
 *     expandable_setup_run_min) is mapped as one run, apart from free
 *     blocks. When no unmapped block can serve, another range is reserved.
 *  2. Idle generations: every free block carries the number of the barrier
 *     that released it (0: idle now; UINT64_MAX: unknown); merges take the
 *     max. A block is idle once the GPU passed that barrier.
 *  3. Remap (free_sync barrier, within a credit earned by turnover): when
 *     whole free pieces lie elsewhere, the growth asks for a barrier; then
 *     the pieces it needs, top of the range down, are unmapped keeping
 *     their memory (the stash) and mapped where it grows, so the mapped
 *     total stays the same. Idle pieces move at once; busy ones are lent
 *     (remap_lend), or, without lending, the host waits for the barrier
 *     that released them, or the device is synchronized. remap_slack_percent
 *     grows instead of waiting while reserved stays within that share.
 *  4. Lending: busy pieces' memory is mapped a second time where the growth
 *     needs it; their old addresses stay mapped as a LENT block until the
 *     barrier that released them passed, then are unmapped (at the next
 *     growth, before it plans, or at a trim after a synchronize). A growth
 *     that fails takes its lent blocks back; a driver that will not map
 *     memory twice ends lending for the pool.
 *  5. Giving back: lent addresses first, then every whole run inside a
 *     ready free block, after a device synchronize (or, in the pinned
 *     range, for blocks a completed fence released).
 * Guarantees: growth leaves no hole; a piece is unmapped or moved only
 * when no kernel can still touch it, or lent while its old address stays
 * mapped until its barrier passed; a run is unmapped, moved and lent only
 * whole; reserved counts every piece once, where it serves.
 */
#include "pool_expandable.h"

#include <stdlib.h>
#include <string.h>

/* Test hooks: remap treats every ready block as idle; lent addresses are
 * unmapped right after the growth that lent them (negative controls). */
static _Atomic int test_skip_idle_check;
static _Atomic int test_return_lent_at_once;

void pool_expandable_test_skip_idle_check(bool on)
{
    atomic_store(&test_skip_idle_check, on);
}

void pool_expandable_test_return_lent_at_once(bool on)
{
    atomic_store(&test_return_lent_at_once, on);
}

static inline bool skip_idle_check(void)
{
    return atomic_load_explicit(&test_skip_idle_check, memory_order_relaxed);
}

/* pool_newest_passed not asked yet (remap_for_growth asks it). */
#define PASSED_UNKNOWN (IDLE_NEVER - 1)

void pool_expandable_init(pool_expandable_t *vm, const ps_pool_options_t *options, const ps_gpu_ops_t *gpu,
                          const char *name)
{
    memset(vm, 0, sizeof *vm);
    vm->options = options;
    vm->gpu = gpu;
    vm->name = name;
    vm->on = options->expandable && gpu && gpu->vm_reserve && gpu->vm_map && gpu->vm_unmap && gpu->vm_granularity;
    vm->unmapped_head = NIL;
    vm->lent_head = NIL;
    vm->remap_credit = (uint64_t)REMAP_BURST * REMAP_CREDIT_UNIT;
}

void pool_expandable_destroy(pool_expandable_t *vm)
{
    ps_vm_stash_free(&vm->stash); /* (empty: every growth drops what it kept) */
}

void pool_expandable_add_counters(const pool_expandable_t *vm, ps_resource_info_t *info)
{
    info->remap_syncs += vm->remap_syncs;
    info->remaps_idle += vm->remaps_idle;
    info->remap_waits += vm->remap_waits;
    info->remaps_slack += vm->remaps_slack;
    info->remaps_lent += vm->remaps_lent;
    info->expandable += (uint64_t)vm->on;
}

/* Remap's credit: it starts at REMAP_BURST remaps; `released` bytes of
 * cudaFree'd memory that a barrier released earn released /
 * (remap_turnover_percent % of reserved) more, up to REMAP_BURST
 * (remap_turnover_percent 0: no bound). */
void pool_expandable_earn(pool_expandable_t *vm, const pool_lists_t *lists, uint64_t released)
{
    uint64_t per_remap = lists->bytes_reserved / 100 * vm->options->remap_turnover_percent;
    uint64_t cap = (uint64_t)REMAP_BURST * REMAP_CREDIT_UNIT;
    if (!per_remap || vm->remap_credit >= cap) {
        vm->remap_credit = cap;
        return;
    }
    uint64_t earned = released / per_remap >= REMAP_BURST ? cap : released * REMAP_CREDIT_UNIT / per_remap;
    vm->remap_credit = vm->remap_credit + earned > cap ? cap : vm->remap_credit + earned;
}

/* ---- the unmapped and the lent lists ----------------------------------- */

/* Blocks of one state linked by prev_free/next_free from *head, their
 * sizes summed in *bytes. */
static void state_list_insert(pool_lists_t *lists, uint32_t *head, uint64_t *bytes, uint8_t state, uint32_t index)
{
    pool_block_t *b = &lists->blocks[index];
    b->state = state;
    b->prev_free = NIL;
    b->next_free = *head;
    if (*head != NIL)
        lists->blocks[*head].prev_free = index;
    *head = index;
    *bytes += b->size;
}

static void state_list_remove(pool_lists_t *lists, uint32_t *head, uint64_t *bytes, uint32_t index)
{
    pool_block_t *b = &lists->blocks[index];
    if (b->prev_free != NIL)
        lists->blocks[b->prev_free].next_free = b->next_free;
    else
        *head = b->next_free;
    if (b->next_free != NIL)
        lists->blocks[b->next_free].prev_free = b->prev_free;
    *bytes -= b->size;
}

static void unmapped_insert(pool_expandable_t *vm, pool_lists_t *lists, uint32_t index)
{
    state_list_insert(lists, &vm->unmapped_head, &vm->bytes_unmapped, BLOCK_UNMAPPED, index);
}

static void unmapped_remove(pool_expandable_t *vm, pool_lists_t *lists, uint32_t index)
{
    state_list_remove(lists, &vm->unmapped_head, &vm->bytes_unmapped, index);
}

/* Lent blocks: still mapped, their memory serving a growth elsewhere,
 * until the barrier idle_gen passed. */
static void lent_insert(pool_expandable_t *vm, pool_lists_t *lists, uint32_t index)
{
    state_list_insert(lists, &vm->lent_head, &vm->bytes_lent, BLOCK_LENT, index);
}

static void lent_remove(pool_expandable_t *vm, pool_lists_t *lists, uint32_t index)
{
    state_list_remove(lists, &vm->lent_head, &vm->bytes_lent, index);
}

/* Unmapped block `index` absorbs unmapped physical neighbours (or is
 * absorbed by the one below); returns the block that remains. */
static uint32_t unmapped_merge(pool_expandable_t *vm, pool_lists_t *lists, uint32_t index)
{
    uint32_t prev = lists->blocks[index].prev_phys;
    if (prev != NIL && lists->blocks[prev].state == BLOCK_UNMAPPED) {
        unmapped_remove(vm, lists, index);
        unmapped_remove(vm, lists, prev);
        pool_block_t *p = &lists->blocks[prev], *b = &lists->blocks[index];
        p->size += b->size;
        p->next_phys = b->next_phys;
        if (b->next_phys != NIL)
            lists->blocks[b->next_phys].prev_phys = prev;
        pool_lists_recycle_descriptor(lists, index);
        unmapped_insert(vm, lists, prev);
        index = prev;
    }
    uint32_t next = lists->blocks[index].next_phys;
    if (next != NIL && lists->blocks[next].state == BLOCK_UNMAPPED) {
        unmapped_remove(vm, lists, index);
        unmapped_remove(vm, lists, next);
        pool_block_t *b = &lists->blocks[index], *n = &lists->blocks[next];
        b->size += n->size;
        b->next_phys = n->next_phys;
        if (n->next_phys != NIL)
            lists->blocks[n->next_phys].prev_phys = index;
        pool_lists_recycle_descriptor(lists, next);
        unmapped_insert(vm, lists, index);
    }
    return index;
}

/* Where the rest of a cut block goes (cut_span). */
typedef enum rest_goes {
    REST_UNMAPPED, /* to the unmapped list */
    REST_READY     /* to the ready list */
} rest_goes_t;

static void keep_rest(pool_expandable_t *vm, pool_lists_t *lists, rest_goes_t where, uint32_t index)
{
    if (where == REST_UNMAPPED)
        unmapped_insert(vm, lists, index);
    else
        pool_lists_insert(lists, OWNER_READY, index);
}

/* Cuts [lo, lo + length) out of block `index` (taken out of its list by
 * the caller): the rest on each side, if any, goes where `where` says;
 * returns the block of the cut-out part (in no list, same state and idle
 * generation; `index` itself when nothing lies below lo). Needs two
 * reserved descriptors. */
static uint32_t cut_span(pool_expandable_t *vm, pool_lists_t *lists, uint32_t index, uintptr_t lo, size_t length,
                         rest_goes_t where)
{
    const pool_block_t *b = &lists->blocks[index];
    uintptr_t end = b->addr + b->size;
    uint32_t span = index;
    if (lo > b->addr) {
        span = pool_lists_split(lists, index, lo);
        keep_rest(vm, lists, where, index);
    }
    if (lo + length < end)
        keep_rest(vm, lists, where, pool_lists_split(lists, span, lo + length));
    return span;
}

/* Cuts [lo, lo + length) out of ready free block `index` (in the ready
 * list): the free rest on both sides goes back to the ready list; returns
 * the block of the cut-out part (in no list, same idle generation). Needs
 * two reserved descriptors. */
static uint32_t cut_out(pool_expandable_t *vm, pool_lists_t *lists, uint32_t index, uintptr_t lo, size_t length)
{
    pool_lists_remove(lists, index);
    return cut_span(vm, lists, index, lo, length, REST_READY);
}

/* ---- ranges ------------------------------------------------------------ */

/* Reserves one more range of address space, as a chunk made of one
 * unmapped block. */
static int add_range(pool_expandable_t *vm, pool_lists_t *lists, size_t need)
{
    const ps_pool_options_t *o = vm->options;
    size_t size = o->expandable_reserve;
    if (!size) {
        size_t free_bytes = 0, total = 0;
        if (vm->gpu->mem_get_info(vm->gpu->ctx, &free_bytes, &total) != PS_OK || !total)
            total = 32 * PS_GiB;
        size = total > PS_TiB / 2 ? PS_TiB : 2 * total;
    }
    if (size < need)
        size = need;
    uint32_t slot;
    if (pool_lists_chunk_slot(lists, &slot) != PS_OK)
        return PS_ENOMEM;
    ps_vm_range_t *range;
    int status = ps_vm_range_create(vm->gpu, size, o->expandable_piece, &range);
    if (status != PS_OK)
        return status;
    uint32_t index = pool_lists_add_chunk(
        lists, slot, &(pool_chunk_t){(void *)range->base, range->size, range->base, range->size, NIL, range});
    unmapped_insert(vm, lists, index); /* nothing behind it */
    return PS_OK;
}

void pool_expandable_reserve_first_range(pool_expandable_t *vm, pool_lists_t *lists)
{
    if (vm->on && !lists->chunks_count)
        (void)add_range(vm, lists, 0);
}

/* expandable_map_first: the first piece of the range reserved at creation
 * is mapped then too, a free ready block, so that a program's first small
 * cudaMalloc maps nothing. A request for a run of its own is mapped apart
 * from it (plan_growth). */
size_t pool_expandable_first_piece(const pool_expandable_t *vm, pool_lists_t *lists)
{
    if (vm->on && lists->chunks_count && !lists->bytes_reserved && pool_lists_reserve_descriptors(lists, 2) == PS_OK)
        return lists->chunks[0].range->piece;
    return 0;
}

/* ---- planning a growth ------------------------------------------------- */

/* The size of block `index` if it is free in the ready list, else 0. */
static inline size_t ready_size(const pool_lists_t *lists, uint32_t index)
{
    if (index == NIL)
        return 0;
    const pool_block_t *b = &lists->blocks[index];
    return b->state == BLOCK_FREE && b->owner == OWNER_READY ? b->size : 0;
}

/* A growth that maps its request as one run of its own (run_wanted): the
 * back of an unmapped block, away from any ready free block, so the new
 * memory merges with nothing and the block is that one physical
 * allocation from its first byte (a copy crosses one allocation, an IPC
 * export sends one piece, and the block is what a handle could name). The
 * lowest such block; NIL when none is big enough. */
static pool_growth_plan_t plan_alone(const pool_expandable_t *vm, const pool_lists_t *lists, size_t need)
{
    pool_growth_plan_t best = {NIL, 0, SIZE_MAX, false};
    for (uint32_t u = vm->unmapped_head; u != NIL; u = lists->blocks[u].next_free) {
        const pool_block_t *b = &lists->blocks[u];
        size_t piece = lists->chunks[b->chunk].range->piece, length = ps_align_up(need, piece);
        size_t gap = ready_size(lists, b->next_phys) ? piece : 0; /* (unmapped, between the two) */
        if (b->size < length + gap)
            continue;
        uintptr_t start = b->addr + b->size - gap - length;
        if (start == b->addr && ready_size(lists, b->prev_phys))
            continue; /* it would join the ready block below */
        if (best.block == NIL || b->addr < lists->blocks[best.block].addr)
            best = (pool_growth_plan_t){u, start, length, true};
    }
    return best;
}

/* The unmapped block that needs the fewest new pieces to give a ready
 * block of at least `need` bytes (front to join a ready block below, back
 * to join one above, or all of it). */
static pool_growth_plan_t plan_joined(const pool_expandable_t *vm, const pool_lists_t *lists, size_t need)
{
    pool_growth_plan_t best = {NIL, 0, SIZE_MAX, false};
    for (uint32_t u = vm->unmapped_head; u != NIL; u = lists->blocks[u].next_free) {
        const pool_block_t *b = &lists->blocks[u];
        size_t piece = lists->chunks[b->chunk].range->piece;
        size_t below = ready_size(lists, b->prev_phys), above = ready_size(lists, b->next_phys);
        if (below + b->size + above < need)
            continue;
        /* below, above < need: the request did not fit in them */
        size_t front = ps_align_up(need - below, piece), back = ps_align_up(need - above, piece);
        pool_growth_plan_t plan = {u, b->addr, b->size, false};
        if (front && front <= b->size && front <= back)
            plan.length = front;
        else if (back && back <= b->size)
            plan = (pool_growth_plan_t){u, b->addr + b->size - back, back, false};
        if (plan.length < best.length ||
            (plan.length == best.length && b->addr < lists->blocks[best.block].addr))
            best = plan;
    }
    return best;
}

/* Whether a growth for a request of `need` bytes that maps `bytes` (0:
 * not planned yet) maps its new memory as one run (one create, map and
 * access call) rather than a run per piece. A run goes back, and moves in
 * a remap, only whole, so runs are for what a loop does not move:
 *  - the map, or the request, is at least expandable_run_min (the request
 *    counts too: a growth maps only what its free neighbour lacks);
 *  - setup: nothing was freed to the pool yet and the request is at least
 *    expandable_setup_run_min. What a program makes before its first free
 *    it mostly keeps (weights, workspaces, peer and communication
 *    buffers), and in one piece its copies run at native speed; the
 *    loop's growths, after the first free, stay pieces, which remap can
 *    move. */
static bool run_wanted(const pool_expandable_t *vm, size_t need, size_t bytes)
{
    const ps_pool_options_t *o = vm->options;
    if (o->expandable_run_min && (need >= o->expandable_run_min || bytes >= o->expandable_run_min))
        return true;
    return o->expandable_setup_run_min && need >= o->expandable_setup_run_min &&
           !atomic_load_explicit(&vm->freed, memory_order_relaxed);
}

/* plan_joined; a growth whose request run_wanted maps as one run goes
 * alone (plan_alone) when joining a free neighbour would save less than an
 * eighth of the request (before the first free, a piece's free tail at
 * most). A plan alone that finds no memory is tried joined
 * (pool_expandable_finish): near a full device the tail may be what makes
 * it fit. */
static pool_growth_plan_t plan_growth(const pool_expandable_t *vm, const pool_lists_t *lists, size_t need)
{
    pool_growth_plan_t joined = plan_joined(vm, lists, need);
    if (!run_wanted(vm, need, 0))
        return joined;
    pool_growth_plan_t alone = plan_alone(vm, lists, need);
    if (alone.block == NIL || (joined.block != NIL && alone.length > joined.length + need / 8))
        return joined;
    return alone;
}

/* ---- unmapping and lending whole pieces -------------------------------- */

bool pool_expandable_whole_pieces(const pool_lists_t *lists, const ps_vm_range_t *range, uint32_t index,
                                  uintptr_t *lo, uintptr_t *hi)
{
    const pool_block_t *b = &lists->blocks[index];
    if (b->state != BLOCK_FREE || b->owner != OWNER_READY)
        return false;
    *lo = b->addr;
    *hi = b->addr + b->size;
    return ps_vm_range_whole_runs(range, lo, hi);
}

uintptr_t pool_expandable_runs_for(const ps_vm_range_t *range, uintptr_t lo, uintptr_t hi, uint64_t want)
{
    if (hi - lo <= want)
        return hi;
    uintptr_t end = ps_vm_range_boundary_up(range, lo + want);
    return end < hi ? end : hi;
}

/* Leaves an UNMAPPED block there (merged with unmapped neighbours) and the
 * free rest on both sides in the ready list. Fewer bytes than asked when
 * a vm_unmap failed: the rest stays mapped and free. */
size_t pool_expandable_unmap_block_pieces(pool_expandable_t *vm, pool_lists_t *lists, uint32_t slot,
                                          uint32_t index, uintptr_t lo, uintptr_t hi, ps_vm_stash_t *stash,
                                          uint32_t *after)
{
    *after = lists->blocks[index].next_phys;
    ps_vm_range_t *range = lists->chunks[slot].range;
    size_t done = 0;
    uint64_t unmaps = range->unmaps;
    if (stash)
        ps_vm_range_unmap_keep(range, lo, hi - lo, stash, &done);
    else
        ps_vm_range_unmap(range, lo, hi - lo, &done);
    if (!done)
        return 0;
    uint32_t hole = cut_out(vm, lists, index, lo, done);
    unmapped_insert(vm, lists, hole);
    *after = lists->blocks[unmapped_merge(vm, lists, hole)].next_phys;
    pool_lists_count_return(lists, done, range->unmaps - unmaps);
    return done;
}

/* Lends the whole pieces of ready free block `index` in [lo, hi) to the
 * stash (ps_vm_range_lend: they stay mapped), leaving a LENT block there
 * with the block's idle generation. Two reserved descriptors. Returns the
 * bytes lent (0 when the stash could not grow). */
static size_t lend_block_pieces(pool_expandable_t *vm, pool_lists_t *lists, uint32_t slot, uint32_t index,
                                uintptr_t lo, uintptr_t hi)
{
    if (ps_vm_range_lend(lists->chunks[slot].range, lo, hi - lo, &vm->stash) != PS_OK)
        return 0;
    lent_insert(vm, lists, cut_out(vm, lists, index, lo, hi - lo));
    pool_lists_count_return(lists, hi - lo, 0); /* counted where the memory serves next */
    return hi - lo;
}

/* The lent blocks whose barrier `passed` has passed: their memory lives on
 * where it was lent; the addresses become UNMAPPED (merged), ready for
 * growth. A failed unmap leaves the rest of that block lent, for a later
 * try. A piece whose memory was lent may be unmapped (and its memory
 * freed) where it serves now only once its lent address is gone; that
 * address was released by an older barrier than the piece, so the caller
 * that found the piece idle at `passed` passes the same `passed` here
 * first (were a lent address left mapped, the unmap would free nothing
 * and the pool would count memory it no longer holds). */
bool pool_expandable_return_lent(pool_expandable_t *vm, pool_lists_t *lists, uint64_t passed)
{
    bool left = false;
    for (uint32_t index = vm->lent_head, next; index != NIL; index = next) {
        next = lists->blocks[index].next_free;
        pool_block_t *b = &lists->blocks[index];
        if (passed != IDLE_NEVER && b->idle_gen > passed && !skip_idle_check())
            continue;
        ps_vm_range_t *range = lists->chunks[b->chunk].range;
        size_t done = 0;
        if (pool_lists_reserve_descriptors(lists, 2) != PS_OK)
            return false;
        uint64_t unmaps = range->unmaps;
        ps_vm_range_unlend(range, b->addr, b->size, &done);
        left |= done < b->size;
        if (!done)
            continue;
        lent_remove(vm, lists, index);
        if (done < b->size) { /* the front went: it becomes unmapped, the rest stays lent */
            uint32_t rest = pool_lists_split(lists, index, b->addr + done);
            lent_insert(vm, lists, rest);
        }
        unmapped_insert(vm, lists, index);
        unmapped_merge(vm, lists, index);
        pool_lists_count_return(lists, 0, range->unmaps - unmaps); /* (lent addresses hold no memory) */
    }
    return !left;
}

/* A growth that lent pieces failed to map: the blocks lent since
 * `lent_before` (the head of the lent list then) are free ready blocks
 * again, and their handles leave the stash (they are still mapped where
 * they were; nothing was freed). */
static void take_back_lent(pool_expandable_t *vm, pool_lists_t *lists, uint32_t lent_before)
{
    while (vm->lent_head != lent_before && vm->lent_head != NIL) {
        uint32_t index = vm->lent_head;
        pool_block_t *b = &lists->blocks[index];
        ps_vm_range_t *range = lists->chunks[b->chunk].range;
        size_t runs = ps_vm_range_take_back(range, b->addr, b->size);
        vm->stash.count = vm->stash.count > runs ? vm->stash.count - runs : 0;
        lent_remove(vm, lists, index);
        pool_lists_count_growth(lists, b->size, 0); /* (below the peak: it was counted before) */
        pool_lists_release(lists, index, OWNER_READY, 0, b->idle_gen);
    }
}

/* ---- remap ------------------------------------------------------------- */

/* Whether a growth may first move free pieces (options.remap, free_sync
 * barrier): a remap credit is left (pool_expandable_earn). A program whose
 * every step needs a block the layout of that step lacks would otherwise
 * pay a device synchronize per step to keep the mapped total; one plain
 * growth instead gives the layout the room it lacks. */
static bool remap_wanted(const pool_expandable_t *vm)
{
    const ps_pool_options_t *o = vm->options;
    if (!o->remap || o->free_sync != PS_FREE_SYNC_BARRIER || !vm->gpu->device_synchronize)
        return false;
    return vm->remap_credit >= REMAP_CREDIT_UNIT;
}

/* The last block of chunk `slot` (in address order). */
static uint32_t last_block(const pool_lists_t *lists, uint32_t slot)
{
    uint32_t index = lists->chunks[slot].first_block;
    while (lists->blocks[index].next_phys != NIL)
        index = lists->blocks[index].next_phys;
    return index;
}

/* Whether ready free block `index` of chunk `slot` may give pieces to
 * `plan`: not one of the blocks next to the planned block, which the
 * growth joins, and idle once barrier `passed` has passed (IDLE_NEVER: the
 * device was synchronized, every block is idle); [*lo, *hi) = its whole
 * pieces. */
static bool spare_pieces_of(const pool_lists_t *lists, const pool_growth_plan_t *plan, uint32_t slot,
                            uint32_t index, uint64_t passed, uintptr_t *lo, uintptr_t *hi)
{
    const pool_block_t *planned = &lists->blocks[plan->block];
    return index != planned->prev_phys && index != planned->next_phys &&
           (passed == IDLE_NEVER || lists->blocks[index].idle_gen <= passed || skip_idle_check()) &&
           pool_expandable_whole_pieces(lists, lists->chunks[slot].range, index, lo, hi);
}

/* At most PS_BARRIER_RING barrier_passed calls, newest first (an older
 * barrier than the ring remembers has passed once the oldest remembered
 * one has); a failed call counts as not passed. */
uint64_t pool_newest_passed(const ps_gpu_ops_t *gpu)
{
    if (!gpu->barrier_generation || !gpu->barrier_passed)
        return IDLE_NOW;
    uint64_t newest = gpu->barrier_generation(gpu->ctx);
    for (uint64_t g = newest; g > 0 && newest - g < PS_BARRIER_RING; g--)
        if (gpu->barrier_passed(gpu->ctx, g) == PS_OK)
            return g;
    return IDLE_NOW;
}

/* The barrier that must have passed for every block that
 * unmap_for_growth(plan) would take pieces from to be idle: the newest
 * idle generation among them (IDLE_NEVER: one of them is not known to
 * become idle by any barrier; a device synchronize is needed). */
static uint64_t choice_idle_generation(const pool_lists_t *lists, const pool_growth_plan_t *plan)
{
    size_t taken = 0;
    uint64_t newest = IDLE_NOW;
    for (uint32_t slot = lists->chunks_count; slot-- > 0 && taken < plan->length;) {
        if (!lists->chunks[slot].base || !lists->chunks[slot].range)
            continue;
        for (uint32_t index = last_block(lists, slot); index != NIL && taken < plan->length;
             index = lists->blocks[index].prev_phys) {
            uintptr_t lo, hi;
            if (!spare_pieces_of(lists, plan, slot, index, IDLE_NEVER, &lo, &hi))
                continue;
            if (hi - lo > plan->length - taken && /* as unmap_for_growth cuts it */
                (lo = ps_vm_range_boundary_up(lists->chunks[slot].range, hi - (plan->length - taken))) >= hi)
                continue;
            if (lists->blocks[index].idle_gen > newest)
                newest = lists->blocks[index].idle_gen;
            taken += hi - lo;
        }
    }
    return newest;
}

/* Whether every block that unmap_for_growth(plan) would take pieces from
 * (top of each range down, up to plan->length bytes) is idle once barrier
 * `passed` has passed (IDLE_NEVER: the device was synchronized). */
static bool choice_is_idle(const pool_lists_t *lists, const pool_growth_plan_t *plan, uint64_t passed)
{
    return passed == IDLE_NEVER || skip_idle_check() || choice_idle_generation(lists, plan) <= passed;
}

/* Whether any whole free piece could move to `plan`; `passed` as in
 * spare_pieces_of. */
static bool has_spare_pieces(const pool_lists_t *lists, const pool_growth_plan_t *plan, uint64_t passed)
{
    for (uint32_t slot = 0; slot < lists->chunks_count; slot++) {
        if (!lists->chunks[slot].base || !lists->chunks[slot].range)
            continue;
        for (uint32_t index = lists->chunks[slot].first_block; index != NIL; index = lists->blocks[index].next_phys) {
            uintptr_t lo, hi;
            if (spare_pieces_of(lists, plan, slot, index, passed, &lo, &hi))
                return true;
        }
    }
    return false;
}

/* Unmaps up to plan->length bytes of spare whole free pieces, from the top
 * of each range down, so the growth keeps the mapped total instead of
 * adding to it. The caller made sure no kernel can still touch them: they
 * are idle (choice_is_idle) or the device was synchronized (a ready block
 * may have been freed while a kernel still used it, and unmapping does not
 * wait). Their physical memory is kept in the stash where the GPU allows
 * (vm_unmap_keep), for the growth to map again instead of a release and a
 * create per piece. Returns the bytes unmapped; on a failure it stops,
 * leaving the pool consistent. Keeps two descriptors reserved for the
 * growth. */
static size_t unmap_for_growth(pool_expandable_t *vm, pool_lists_t *lists, const pool_growth_plan_t *plan)
{
    size_t unmapped = 0;
    for (uint32_t slot = lists->chunks_count; slot-- > 0 && unmapped < plan->length;) {
        ps_vm_range_t *range = lists->chunks[slot].range;
        if (!lists->chunks[slot].base || !range)
            continue;
        for (uint32_t index = last_block(lists, slot), prev; index != NIL && unmapped < plan->length;
             index = prev) {
            prev = lists->blocks[index].prev_phys; /* stays valid: the hole merges into it, never it away */
            uintptr_t lo, hi;
            if (!spare_pieces_of(lists, plan, slot, index, IDLE_NEVER, &lo, &hi))
                continue;
            if (hi - lo > plan->length - unmapped && /* the top runs, no more than the growth maps */
                (lo = ps_vm_range_boundary_up(range, hi - (plan->length - unmapped))) >= hi)
                continue;
            if (pool_lists_reserve_descriptors(lists, 4) != PS_OK)
                return unmapped;
            uint32_t after;
            size_t done = pool_expandable_unmap_block_pieces(vm, lists, slot, index, lo, hi, &vm->stash, &after);
            unmapped += done;
            if (done < hi - lo)
                return unmapped;
        }
    }
    return unmapped;
}

/* Remap by lending (remap_lend): takes up to plan->length bytes of spare
 * whole free pieces, as unmap_for_growth chooses them, except blocks whose
 * idle generation is unknown (IDLE_NEVER), and lends them to the stash
 * (they stay mapped: a kernel issued before their release may still touch
 * them). The growth maps their memory a second time. That is as safe as
 * handing the blocks out in place: everything issued from now on is
 * ordered after the barrier that released them. Their old addresses are
 * unmapped once that barrier passed (pool_expandable_return_lent). Returns
 * the bytes lent. */
static size_t lend_for_growth(pool_expandable_t *vm, pool_lists_t *lists, const pool_growth_plan_t *plan)
{
    size_t lent = 0;
    for (uint32_t slot = lists->chunks_count; slot-- > 0 && lent < plan->length;) {
        ps_vm_range_t *range = lists->chunks[slot].range;
        if (!lists->chunks[slot].base || !range)
            continue;
        for (uint32_t index = last_block(lists, slot), prev; index != NIL && lent < plan->length; index = prev) {
            prev = lists->blocks[index].prev_phys; /* stays valid: a lent block never merges */
            uintptr_t lo, hi;
            if (!spare_pieces_of(lists, plan, slot, index, IDLE_NEVER - 1, &lo, &hi))
                continue;
            if (hi - lo > plan->length - lent && /* the top runs, no more than the growth maps */
                (lo = ps_vm_range_boundary_up(range, hi - (plan->length - lent))) >= hi)
                continue;
            if (pool_lists_reserve_descriptors(lists, 4) != PS_OK)
                return lent;
            size_t done = lend_block_pieces(vm, lists, slot, index, lo, hi);
            if (!done)
                return lent;
            lent += done;
        }
    }
    return lent;
}

/* Whether remap may lend (remap_lend and the GPU maps memory twice). */
static bool lend_possible(const pool_expandable_t *vm)
{
    const ps_gpu_ops_t *gpu = vm->gpu;
    return vm->options->remap_lend && !vm->lend_refused && gpu->vm_map_handle && gpu->vm_unmap_keep && gpu->vm_drop;
}

/* pool_expandable_return_lent(passed) in the middle of a remap: an address
 * that goes may merge with the unmapped block `plan` grows into, so the
 * growth is planned again (its block and neighbours may be others now;
 * the caller checks that the pieces the new plan takes are idle). Returns
 * as pool_expandable_return_lent, and false when no plan is left. */
static bool settle_lent(pool_expandable_t *vm, pool_lists_t *lists, uint64_t passed, pool_growth_plan_t *plan,
                        size_t need)
{
    uint64_t lent = vm->bytes_lent;
    bool settled = pool_expandable_return_lent(vm, lists, passed);
    if (vm->bytes_lent != lent)
        *plan = plan_growth(vm, lists, need);
    return settled && plan->block != NIL;
}

/* Whether the growth of `plan` keeps reserved within remap_slack_percent
 * above the most bytes in use seen at a growth. */
static bool within_slack(const pool_expandable_t *vm, const pool_lists_t *lists, const pool_growth_plan_t *plan)
{
    unsigned slack = vm->options->remap_slack_percent;
    return slack && lists->bytes_reserved + plan->length <= vm->peak_need_in_use + vm->peak_need_in_use / 100 * slack;
}

/* How the pieces of a remap move (remap_for_growth). */
typedef enum remap_way {
    REMAP_NONE, /* nothing moved and no credit spent */
    REMAP_DONE, /* pieces moved, or the device was synchronized for them */
    REMAP_LEND  /* the pieces are busy: lend them once the final plan is known */
} remap_way_t;

/* After the barrier the growth asked for: when every block the usual
 * choice takes pieces from is idle (its releasing barrier has passed on
 * the GPU; the newest passed barrier is asked once), the pieces move with
 * no device synchronize. Otherwise, within remap_slack_percent the pool
 * grows instead; else the busy pieces are lent (remap_lend), or the host
 * waits for the one barrier that released them (the GPU keeps the work
 * queued after it, where a synchronize would drain the queue), or, when
 * one of them was released by no barrier, the device is synchronized.
 * Either way the same pieces move. A remap that moves, synchronizes or
 * lends spends a credit. */
static remap_way_t remap_for_growth(pool_expandable_t *vm, pool_lists_t *lists, pool_range_growth_t *g)
{
    const ps_gpu_ops_t *gpu = vm->gpu;
    pool_growth_plan_t *plan = &g->plan;
    uint64_t needed, passed = g->passed;
    remap_way_t way = REMAP_DONE;
    if (passed == PASSED_UNKNOWN)
        passed = pool_newest_passed(gpu);
    if (choice_is_idle(lists, plan, passed)) {
        /* (lent addresses idle at `passed` went before the plan was made:
         * one is left here only if its unmap failed then) */
        if (!settle_lent(vm, lists, passed, plan, g->need) || !choice_is_idle(lists, plan, passed) ||
            !unmap_for_growth(vm, lists, plan))
            return REMAP_NONE;
        vm->remaps_idle++;
    } else if (within_slack(vm, lists, plan)) {
        vm->remaps_slack++; /* no credit spent: nothing moved */
        return REMAP_NONE;
    } else if (lend_possible(vm) && has_spare_pieces(lists, plan, IDLE_NEVER - 1)) {
        way = REMAP_LEND; /* (counted once lent) */
    } else if (gpu->barrier_wait && (needed = choice_idle_generation(lists, plan)) != IDLE_NEVER &&
               gpu->barrier_wait(gpu->ctx, needed) == PS_OK) {
        vm->remap_waits++;
        if (settle_lent(vm, lists, needed, plan, g->need) && choice_idle_generation(lists, plan) <= needed)
            unmap_for_growth(vm, lists, plan);
    } else {
        if (gpu->device_synchronize(gpu->ctx) != PS_OK)
            return REMAP_NONE;
        vm->remap_syncs++;
        if (settle_lent(vm, lists, IDLE_NEVER, plan, g->need))
            unmap_for_growth(vm, lists, plan);
    }
    vm->remap_credit -= REMAP_CREDIT_UNIT;
    return way;
}

/* ---- growth ------------------------------------------------------------ */

/* Maps `plan` for a request of `need` bytes (run_wanted says whether in
 * one run) and cuts it out of its unmapped block as a ready free block
 * (merged with its free neighbours); *grown = that block. Reserves the
 * descriptors it and the caller's take need. */
static int map_planned(pool_expandable_t *vm, pool_lists_t *lists, const pool_growth_plan_t *plan, size_t need,
                       uint32_t *grown)
{
    const ps_pool_options_t *o = vm->options;
    if (o->maximum_size && lists->bytes_reserved + plan->length > o->maximum_size)
        return PS_ENOMEM;
    /* two cuts here (a plan alone with a gap has a rest on both sides)
     * and the caller's take of the grown block: three, before anything
     * changes */
    if (pool_lists_reserve_descriptors(lists, 3) != PS_OK)
        return PS_ENOMEM;
    ps_vm_range_t *range = lists->chunks[lists->blocks[plan->block].chunk].range;
    uint64_t maps = range->maps;
    int status = ps_vm_range_map_kept(range, plan->start, plan->length, &vm->stash,
                                      run_wanted(vm, need, plan->length));
    if (status != PS_OK)
        return status;
    unmapped_remove(vm, lists, plan->block);
    /* the unmapped rests stay unmapped: above (a front plan, or the gap a
     * plan alone keeps below a ready block), below (a back plan, or a plan
     * alone), or both (a plan alone with a gap: its gap stays unmapped,
     * not given to the new block and so to the free block above) */
    uint32_t mapped = cut_span(vm, lists, plan->block, plan->start, plan->length, REST_UNMAPPED);
    pool_lists_count_growth(lists, plan->length, range->maps - maps);
    *grown = pool_lists_release(lists, mapped, OWNER_READY, 0, IDLE_NOW); /* fresh memory; a neighbour's generation wins */
    return PS_OK;
}

int pool_expandable_begin(pool_expandable_t *vm, pool_lists_t *lists, size_t need, pool_range_growth_t *g)
{
    *g = (pool_range_growth_t){need, {NIL, 0, SIZE_MAX, false}, PASSED_UNKNOWN, NIL, false};
    if (lists->bytes_in_use + need > vm->peak_need_in_use)
        vm->peak_need_in_use = lists->bytes_in_use + need;
    if (vm->lent_head != NIL) { /* lent addresses whose barrier passed may serve this growth */
        g->passed = pool_newest_passed(vm->gpu);
        pool_expandable_return_lent(vm, lists, g->passed);
    }
    g->plan = plan_growth(vm, lists, need);
    if (g->plan.block == NIL) {
        int status = add_range(vm, lists, need);
        if (status != PS_OK)
            return status == PS_EUNSUPPORTED ? PS_ENOMEM : status;
        g->plan = plan_growth(vm, lists, need);
        if (g->plan.block == NIL)
            return PS_ENOMEM;
    }
    g->lent_before = vm->lent_head;
    g->wants_barrier = remap_wanted(vm) && has_spare_pieces(lists, &g->plan, IDLE_NEVER);
    return PS_OK;
}

int pool_expandable_finish(pool_expandable_t *vm, pool_lists_t *lists, pool_range_growth_t *g, bool barrier,
                           uint32_t *grown, bool *lent)
{
    *lent = false;
    remap_way_t way = barrier ? remap_for_growth(vm, lists, g) : REMAP_NONE;
    if (way != REMAP_NONE) {
        /* the barrier's blocks and the holes may serve better; the old
         * plan still can (its block and neighbours were left alone) */
        g->plan = plan_growth(vm, lists, g->need);
        if (way == REMAP_LEND)
            lend_for_growth(vm, lists, &g->plan);
    }
    int status = map_planned(vm, lists, &g->plan, g->need, grown); /* (the stash's pieces first) */
    if (status == PS_ENOMEM && g->plan.alone && vm->lent_head == g->lent_before && !vm->stash.count) {
        g->plan = plan_joined(vm, lists, g->need);
        if (g->plan.block != NIL)
            status = map_planned(vm, lists, &g->plan, g->need, grown);
    }
    if (status != PS_OK && vm->lent_head != g->lent_before) {
        take_back_lent(vm, lists, g->lent_before); /* (their handles leave the stash: not dropped) */
        *lent = true;
    } else if (vm->lent_head != g->lent_before) {
        vm->remaps_lent++;
        if (atomic_load_explicit(&test_return_lent_at_once, memory_order_relaxed))
            pool_expandable_return_lent(vm, lists, IDLE_NEVER); /* the broken variant the GPU test must catch */
    }
    ps_vm_stash_drop(vm->gpu, &vm->stash); /* what the growth did not need */
    return status;
}

/* ---- giving memory back ------------------------------------------------ */

/* The device is synchronized first: unmapping does not wait for kernels
 * still using the range, and a ready block may have been freed while one
 * ran (a barrier orders later work, not earlier work). Not with a growth
 * budget under free_sync event (the pinned pool's host range, which gives
 * pieces back often): there a block is ready only once a fence recorded
 * after its free completed (idle now), unless a failed host wait released
 * it (idle unknown: synchronized first, as above). */
void pool_expandable_unmap_free_pieces(pool_expandable_t *vm, pool_lists_t *lists, uint64_t keep)
{
    bool synchronized = false;
    /* lent addresses go first (idle once the device is synchronized): a
     * piece whose memory they hold is unmapped only after them */
    if (vm->lent_head != NIL) {
        if (vm->gpu->device_synchronize(vm->gpu->ctx) != PS_OK || !pool_expandable_return_lent(vm, lists, IDLE_NEVER))
            return;
        synchronized = true;
    }
    for (uint32_t slot = 0; slot < lists->chunks_count && lists->bytes_reserved > keep; slot++) {
        ps_vm_range_t *range = lists->chunks[slot].range;
        if (!lists->chunks[slot].base || !range)
            continue;
        for (uint32_t index = lists->chunks[slot].first_block, next; index != NIL && lists->bytes_reserved > keep;
             index = next) {
            next = lists->blocks[index].next_phys;
            uintptr_t lo, hi;
            if (!pool_expandable_whole_pieces(lists, range, index, &lo, &hi))
                continue;
            hi = pool_expandable_runs_for(range, lo, hi, lists->bytes_reserved - keep); /* no more than needed */
            if (pool_lists_reserve_descriptors(lists, 2) != PS_OK)
                continue;
            /* a block released by a failed host wait (idle unknown) needs
             * the synchronize even there */
            bool fenced = vm->options->free_sync == PS_FREE_SYNC_EVENT && vm->options->grow_budget_percent &&
                          lists->blocks[index].idle_gen == IDLE_NOW;
            if (!synchronized && !fenced) {
                if (vm->gpu->device_synchronize(vm->gpu->ctx) != PS_OK)
                    return;
                synchronized = true;
            }
            pool_expandable_unmap_block_pieces(vm, lists, slot, index, lo, hi, NULL, &next);
        }
    }
}
