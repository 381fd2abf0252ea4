/* Memory into and out of the pool (core/pool_growth.h): growth by chunks,
 * the bounds on growth, and giving memory back. An expandable pool maps
 * and unmaps through core/pool_expandable.c; the front decides when.
 *
 * Algorithm
 *  1. Chunks (expandable = 0, or no virtual memory), never past
 *     maximum_size: one chunk of max(request rounded up to chunk_granule
 *     (2 MiB), clamp(reserved * growth_percent / 100, min_chunk,
 *     max_chunk)) bytes, halved down to the request while the upstream
 *     refuses. A new chunk is one ready free block of fresh (idle) memory.
 *  2. Growth bound (pending_wait_bytes / pending_wait_percent, off by
 *     default; the pinned host pool): the front host-waits epochs while
 *     more bytes are pending than max(pending_wait_bytes,
 *     pending_wait_percent % of reserved), so growth while the GPU lags
 *     stays bounded.
 *  3. Growth budget (grow_budget_percent, expandable; the pinned pool's
 *     host range): a growth must leave at most that % of the most bytes in
 *     use seen at a growth (in use + need) reserved; over it, the front
 *     host-waits pending blocks and then gives free pieces back (holes
 *     between live blocks before the rest) until reserved + need fits.
 *  4. Budget floor (grow_budget_min, with the growth budget under
 *     free_sync event): the budget is never below it. A pinned block is
 *     reused only after a fence recorded after its free completed, so near
 *     a bare budget every other free/alloc pair would record a fence and
 *     spin on it; pool_growth_floor tells the epochs where reserved stands
 *     (core/pool_streams.c amortizes their fences there).
 *  5. Giving back (out of memory, trim, release_threshold): wholly free
 *     ready chunks go to the upstream; in a range, after a device
 *     synchronize, every whole run inside a ready free block is unmapped.
 *     The decay's give-back takes only memory the GPU has provably
 *     finished with, idle at the newest barrier it passed, and never
 *     synchronizes.
 * Guarantees: reserved never passes maximum_size; growth by a chunk leaves
 * the pool as it was when the upstream refuses; memory goes back only when
 * no kernel can still touch it (a device synchronize, a passed barrier
 * that released it, or, in the pinned range, a completed fence); a chunk
 * the upstream refuses back stays in the pool.
 */
#include "pool_growth.h"

#include <stdlib.h>

void pool_growth_init(pool_growth_t *growth, const ps_pool_options_t *options, const ps_gpu_ops_t *gpu,
                      ps_resource_t *upstream, const char *name)
{
    *growth = (pool_growth_t){options, gpu, upstream, name, 0};
}

void pool_growth_destroy(pool_growth_t *growth, pool_lists_t *lists)
{
    for (uint32_t slot = 0; slot < lists->chunks_count; slot++)
        if (lists->chunks[slot].range)
            ps_vm_range_destroy(lists->chunks[slot].range);
        else if (lists->chunks[slot].base)
            ps_deallocate(growth->upstream, lists->chunks[slot].base, lists->chunks[slot].base_size, PS_STREAM_NONE);
}

/* ---- chunks ------------------------------------------------------------ */

int pool_growth_add_chunk(pool_growth_t *growth, pool_lists_t *lists, size_t chunk_size, size_t need,
                          uint32_t *grown)
{
    uint32_t slot;
    if (pool_lists_chunk_slot(lists, &slot) != PS_OK)
        return PS_ENOMEM;
    void *base;
    int status = ps_allocate(growth->upstream, chunk_size, PS_STREAM_NONE, &base);
    if (status != PS_OK)
        return status;
    size_t alignment = growth->options->alignment;
    uintptr_t addr = ((uintptr_t)base + alignment - 1) & ~(uintptr_t)(alignment - 1);
    size_t usable = (chunk_size - (addr - (uintptr_t)base)) & ~(alignment - 1);
    if (addr - (uintptr_t)base >= chunk_size || usable < need) {
        ps_deallocate(growth->upstream, base, chunk_size, PS_STREAM_NONE);
        return PS_ENOMEM; /* the upstream's alignment is too small for this request */
    }
    uint32_t index = pool_lists_add_chunk(lists, slot, &(pool_chunk_t){base, chunk_size, addr, usable, NIL, NULL});
    pool_lists_insert(lists, OWNER_READY, index); /* fresh memory */
    pool_lists_count_growth(lists, usable, 1);
    *grown = index;
    return PS_OK;
}

int pool_growth_add_chunk_for(pool_growth_t *growth, pool_lists_t *lists, size_t need, uint32_t *grown)
{
    const ps_pool_options_t *o = growth->options;
    uint64_t reserved = lists->bytes_reserved;
    size_t step = (size_t)(reserved / 100 * o->growth_percent + reserved % 100 * o->growth_percent / 100);
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
        size_t room = reserved >= o->maximum_size ? 0 : o->maximum_size - reserved;
        room &= ~(o->alignment - 1);
        if (room < need)
            return PS_ENOMEM;
        if (chunk_size > room)
            chunk_size = room;
    }
    for (;;) {
        int status = pool_growth_add_chunk(growth, lists, chunk_size, need, grown);
        if (status == PS_OK || chunk_size == need)
            return status;
        size_t half = ps_align_up(chunk_size / 2, o->alignment);
        chunk_size = half > need ? half : need;
    }
}

/* ---- the growth bound, the growth budget and its floor ----------------- */

uint64_t pool_growth_pending_bound(const pool_growth_t *growth, const pool_lists_t *lists)
{
    uint64_t share = lists->bytes_reserved / 100 * growth->options->pending_wait_percent;
    return share > growth->options->pending_wait_bytes ? share : growth->options->pending_wait_bytes;
}

bool pool_growth_over_budget(pool_growth_t *growth, const pool_lists_t *lists, size_t need, uint64_t *keep)
{
    const ps_pool_options_t *o = growth->options;
    uint64_t high = lists->bytes_in_use + need;
    if (high > growth->in_use_high)
        growth->in_use_high = high;
    uint64_t budget = growth->in_use_high / 100 * o->grow_budget_percent +
                      growth->in_use_high % 100 * o->grow_budget_percent / 100;
    if (budget < o->grow_budget_min) /* the floor */
        budget = o->grow_budget_min;
    *keep = budget > need ? budget - need : 0;
    return lists->bytes_reserved > *keep;
}

pool_budget_floor_t pool_growth_floor(const pool_growth_t *growth, const pool_expandable_t *vm,
                                      const pool_lists_t *lists, size_t need)
{
    const ps_pool_options_t *o = growth->options;
    if (!(o->grow_budget_min && vm->on && o->grow_budget_percent && o->free_sync == PS_FREE_SYNC_EVENT &&
          growth->gpu && lists->bytes_reserved <= o->grow_budget_min))
        return POOL_FLOOR_NONE;
    return need <= o->grow_budget_min - lists->bytes_reserved ? POOL_FLOOR_UNDER : POOL_FLOOR_AT;
}

/* ---- giving memory back ------------------------------------------------ */

/* What a chunk the upstream refuses back makes said (give_chunk_back). */
typedef enum refusal {
    REFUSAL_WARNS, /* a warning (the chunk is kept) */
    REFUSAL_QUIET  /* nothing: a later tick tries again */
} refusal_t;

/* Gives chunk `slot` (not a range) back to the upstream when it is one
 * ready free block idle at `passed` (IDLE_NEVER: the device was
 * synchronized); a refusal keeps it. */
static void give_chunk_back(pool_growth_t *growth, pool_lists_t *lists, uint32_t slot, uint64_t passed,
                            refusal_t refusal)
{
    pool_chunk_t *chunk = &lists->chunks[slot];
    const pool_block_t *b = &lists->blocks[chunk->first_block];
    if (b->state != BLOCK_FREE || b->owner != OWNER_READY || b->next_phys != NIL ||
        (passed != IDLE_NEVER && b->idle_gen > passed))
        return;
    if (ps_deallocate(growth->upstream, chunk->base, chunk->base_size, PS_STREAM_NONE) != PS_OK) {
        if (refusal == REFUSAL_WARNS)
            ps_warning("pool '%s': the upstream refused a chunk back; keeping it", growth->name);
        return;
    }
    pool_lists_drop_chunk(lists, slot);
}

void pool_growth_release_free(pool_growth_t *growth, pool_expandable_t *vm, pool_lists_t *lists, uint64_t keep)
{
    for (uint32_t slot = 0; slot < lists->chunks_count && lists->bytes_reserved > keep; slot++)
        if (lists->chunks[slot].base && !lists->chunks[slot].range)
            give_chunk_back(growth, lists, slot, IDLE_NEVER, REFUSAL_WARNS);
    pool_lists_trim_chunks(lists);
    if (vm->on)
        pool_expandable_unmap_free_pieces(vm, lists, keep);
}

/* The lent addresses idle at `passed` go first (a piece is unmapped only
 * after its lent twin); then wholly free chunks and whole runs inside
 * ready free blocks whose idle generation is at most `passed`. */
uint64_t pool_growth_release_idle(pool_growth_t *growth, pool_expandable_t *vm, pool_lists_t *lists, uint64_t keep,
                                  uint64_t passed)
{
    uint64_t before = lists->bytes_reserved;
    if (vm->lent_head != NIL && !pool_expandable_return_lent(vm, lists, passed))
        passed = IDLE_NOW; /* a twin stayed mapped: only memory idle now (never lent) may go */
    for (uint32_t slot = 0; slot < lists->chunks_count && lists->bytes_reserved > keep; slot++) {
        pool_chunk_t *chunk = &lists->chunks[slot];
        if (!chunk->base)
            continue;
        if (!chunk->range) { /* a chunk goes back whole, when wholly free and idle */
            give_chunk_back(growth, lists, slot, passed, REFUSAL_QUIET);
            continue;
        }
        for (uint32_t index = chunk->first_block, next; index != NIL && lists->bytes_reserved > keep; index = next) {
            next = lists->blocks[index].next_phys;
            uintptr_t lo, hi;
            if (lists->blocks[index].idle_gen > passed ||
                !pool_expandable_whole_pieces(lists, chunk->range, index, &lo, &hi))
                continue;
            hi = pool_expandable_runs_for(chunk->range, lo, hi, lists->bytes_reserved - keep); /* no more than needed */
            if (pool_lists_reserve_descriptors(lists, 2) != PS_OK)
                break;
            pool_expandable_unmap_block_pieces(vm, lists, slot, index, lo, hi, NULL, &next);
        }
    }
    pool_lists_trim_chunks(lists);
    return before - lists->bytes_reserved;
}
