/* Stream lists and barriers (core/pool_streams.h): the cudaFree epochs
 * (core/reuse.c's rule), the cudaFreeAsync model of an owner per stream,
 * and what moves blocks from one owner to another.
 *
 * Algorithm
 *  1. A stream used by cudaMallocAsync/cudaFreeAsync gets an owner of the
 *     lists on first use, found through a stream -> owner map behind a
 *     one-entry cache; owners of destroyed streams are reused. The legacy
 *     default stream's two handles share one owner. The per-thread default
 *     stream gets none: one handle names another stream on every thread,
 *     so its allocations and frees take the cudaFree path (epochs), whose
 *     fence on the legacy stream covers the blocking per-thread streams.
 *  2. A free on stream s joins s's lists at once, stamped with a free
 *     counter, merging with free neighbours of s only. A cudaFree joins
 *     the open epoch (pending: it neither merges nor is handed out).
 *  3. Steal: an allocation on s that neither s's lists nor the ready list
 *     can serve takes the lists of a stream t that holds a fitting block,
 *     through core/reuse.c's handoff: a fence recorded on t now, s waits
 *     for it on the GPU, and t's blocks move to s.
 *  4. Poll (a cudaMalloc that nothing ready fits): each stream list gets one
 *     lazily recorded fence; once it completed (queried, or host-waited
 *     under memory pressure), the blocks freed before it move to the ready
 *     list.
 *  5. Barrier (free_sync barrier): one device-wide barrier releases every
 *     epoch and moves every stream's blocks to the ready list, idle once
 *     it has passed. A thread cache's barrier is numbered in the same
 *     family, issued without the pool's lock, one thread at a time.
 *  6. Near the budget floor (core/pool_growth.c) the epochs' fences are
 *     amortized: under it one is recorded only when none is outstanding;
 *     at it the older one is polled, and a free closes the open epoch once
 *     it holds half of what is not in use.
 *  7. A destroyed stream's blocks are retired as a closed epoch under a
 *     fence recorded while its handle is still valid; its owner is reused.
 * Guarantees: a block freed on stream s goes to another stream only after
 * that stream waits on a fence recorded on s after the free, and to a
 * cudaMalloc only after such a fence completed (a block merged with one
 * freed after that fence waits for a later one); a cudaFree'd block is
 * handed out only after a barrier or a completed fence covers its free;
 * moving a stream's blocks is O(its blocks).
 */
#include "pool_streams.h"

#include <stdlib.h>
#include <string.h>

int pool_streams_init(pool_streams_t *streams, const ps_pool_options_t *options, const ps_gpu_ops_t *gpu,
                      ps_reuse_release_fn release, void *owner)
{
    memset(streams, 0, sizeof *streams);
    streams->options = options;
    streams->gpu = gpu;
    streams->last_stream = PS_STREAM_NONE;
    streams->barrier_lock = (ps_lock_t)PS_LOCK_INIT;
    ps_reuse_init(&streams->reuse, gpu, options->free_sync, options->barrier_pending_percent, &streams->family,
                  release, owner);
    streams->owners_capacity = 8;
    streams->owners = calloc(streams->owners_capacity, sizeof *streams->owners);
    if (!streams->owners)
        return PS_ENOMEM;
    streams->owners[OWNER_READY].stream = PS_STREAM_NONE;
    return ps_ptr_map_init(&streams->by_stream, 16);
}

void pool_streams_destroy(pool_streams_t *streams, uint32_t owners)
{
    ps_reuse_destroy(&streams->reuse);
    if (streams->gpu && streams->owners)
        for (uint32_t o = 0; o < owners; o++)
            if (streams->owners[o].fence)
                streams->gpu->fence_release(streams->gpu->ctx, streams->owners[o].fence);
    free(streams->owners);
    free(streams->dead);
    ps_ptr_map_free(&streams->by_stream);
}

void pool_streams_add_counters(const pool_streams_t *streams, ps_resource_info_t *info)
{
    info->bytes_pending += streams->reuse.bytes_pending;
    info->fences_recorded += streams->fences_recorded + streams->reuse.fences_recorded;
    info->fence_waits += streams->fence_waits + streams->reuse.fence_waits;
    info->barriers += streams->reuse.barriers + atomic_load_explicit(&streams->cache_barriers, memory_order_relaxed);
}

/* ---- owners ------------------------------------------------------------ */

int pool_streams_owner_of(pool_streams_t *streams, pool_lists_t *lists, ps_stream_t stream, uint32_t *out)
{
    if (stream == PS_STREAM_LEGACY)
        stream = 0; /* both handles name the legacy default stream */
    if (stream == streams->last_stream) {
        *out = streams->last_owner;
        return PS_OK;
    }
    uint64_t found;
    if (!ps_ptr_map_get(&streams->by_stream, stream, &found)) {
        if (lists->owners_count >= MAX_OWNERS)
            return PS_ENOMEM;
        if (lists->owners_count == streams->owners_capacity) {
            uint32_t capacity = streams->owners_capacity * 2;
            pool_stream_owner_t *bigger = realloc(streams->owners, capacity * sizeof *bigger);
            if (!bigger)
                return PS_ENOMEM;
            streams->owners = bigger;
            streams->owners_capacity = capacity;
        }
        if (ps_ptr_map_reserve(&streams->by_stream, 1) != PS_OK)
            return PS_ENOMEM;
        if (streams->dead_count) { /* an owner of a destroyed stream: empty, no fence */
            found = streams->dead[--streams->dead_count];
        } else {
            uint32_t index;
            if (pool_lists_add_owner(lists, &index) != PS_OK)
                return PS_ENOMEM;
            found = index;
        }
        streams->owners[found] = (pool_stream_owner_t){stream, NULL, 0};
        ps_ptr_map_put(&streams->by_stream, stream, found);
    }
    streams->last_stream = stream;
    streams->last_owner = (uint32_t)found;
    *out = (uint32_t)found;
    return PS_OK;
}

/* Moves `from`'s free blocks with free_stamp <= max_stamp into `to`'s
 * lists (stamp `new_stamp`, idle generation `idle`), coalescing there. */
static void owner_move_blocks(pool_lists_t *lists, uint32_t from, uint32_t to, uint64_t max_stamp,
                              uint64_t new_stamp, uint64_t idle)
{
    pool_owner_t *owner = lists->owners[from];
    uint64_t fl_map = owner->fl_bitmap;
    while (fl_map) {
        unsigned fl = (unsigned)__builtin_ctzll(fl_map);
        fl_map &= fl_map - 1;
        uint32_t sl_map = owner->sl_bitmap[fl];
        while (sl_map) {
            unsigned sl = (unsigned)__builtin_ctz(sl_map);
            sl_map &= sl_map - 1;
            for (uint32_t index = owner->heads[fl][sl], next; index != NIL; index = next) {
                next = lists->blocks[index].next_free;
                if (lists->blocks[index].free_stamp > max_stamp)
                    continue;
                pool_lists_remove(lists, index);
                pool_lists_release(lists, index, to, new_stamp, idle);
            }
        }
    }
}

/* ---- epochs ------------------------------------------------------------ */

int pool_streams_defer_synced(pool_streams_t *streams, pool_lists_t *lists, uint32_t index)
{
    int status = streams->gpu->device_synchronize(streams->gpu->ctx);
    if (status != PS_OK) {
        lists->blocks[index].state = BLOCK_USED;
        return status;
    }
    pool_lists_release(lists, index, OWNER_READY, 0, IDLE_NOW);
    return PS_OK;
}

int pool_streams_close_and_poll(pool_streams_t *streams, pool_budget_floor_t floor)
{
    ps_reuse_t *r = &streams->reuse;
    uint64_t wait_ns = streams->options->epoch_wait_ns;
    if (floor == POOL_FLOOR_NONE)
        return ps_reuse_close_and_poll(r, wait_ns);
    if (floor == POOL_FLOOR_UNDER) {
        if (!r->closed_count && r->open.count)
            ps_reuse_close(r); /* runs on the GPU while the pool grows */
        return 0;
    }
    if (!r->closed_count)
        return ps_reuse_close_and_poll(r, wait_ns);
    const ps_gpu_ops_t *gpu = streams->gpu;
    ps_fence_t *oldest = r->closed[r->closed_head].fence;
    if (gpu->fence_query(gpu->ctx, oldest) != PS_OK && wait_ns) {
        uint64_t deadline = ps_now_ns() + wait_ns;
        while (gpu->fence_query(gpu->ctx, oldest) != PS_OK && ps_now_ns() < deadline)
            ;
    }
    return ps_reuse_poll(r);
}

/* Its fence passes on the GPU while the other half serves, so the next
 * exhaustion usually finds it passed. (A closed epoch may still be
 * listed: its fence has often passed, but nobody polls on the free path.) */
void pool_streams_fence_batch(pool_streams_t *streams, const pool_lists_t *lists, pool_budget_floor_t floor)
{
    ps_reuse_t *r = &streams->reuse;
    if (floor != POOL_FLOOR_AT)
        return;
    if (r->open.bytes * 2 >= lists->bytes_reserved - lists->bytes_in_use)
        ps_reuse_close(r); /* no fence: the next exhaustion closes it as before */
}

void pool_streams_close_open_and_poll(pool_streams_t *streams)
{
    if (streams->reuse.open.count)
        ps_reuse_close(&streams->reuse);
    ps_reuse_poll(&streams->reuse);
}

/* ---- fences and stealing ----------------------------------------------- */

int pool_streams_poll(pool_streams_t *streams, pool_lists_t *lists, pool_poll_t how)
{
    const ps_gpu_ops_t *gpu = streams->gpu;
    int moved = 0;
    for (uint32_t o = 1; o < lists->owners_count; o++) {
        pool_stream_owner_t *side = &streams->owners[o];
        if (!lists->owners[o]->free_blocks)
            continue;
        if (!side->fence) {
            if (how == POOL_POLL_QUERY || gpu->fence_record(gpu->ctx, side->stream, &side->fence) != PS_OK)
                continue;
            streams->fences_recorded++;
            side->fence_stamp = streams->free_counter;
        }
        int status = how == POOL_POLL_WAIT
                         ? ps_reuse_fence_handoff(gpu, side->fence, PS_STREAM_NONE, &streams->fence_waits)
                         : gpu->fence_query(gpu->ctx, side->fence);
        if (status != PS_OK)
            continue;
        owner_move_blocks(lists, o, OWNER_READY, side->fence_stamp, 0, IDLE_NOW); /* the fence completed */
        gpu->fence_release(gpu->ctx, side->fence);
        side->fence = NULL;
        moved++;
    }
    return moved;
}

/* Refused or failed, the next stream is tried. */
bool pool_streams_steal(pool_streams_t *streams, pool_lists_t *lists, uint32_t to, size_t size)
{
    for (uint32_t o = 1; o < lists->owners_count; o++) {
        if (o == to || pool_lists_find(lists, lists->owners[o], size) == NIL)
            continue;
        if (ps_reuse_stream_handoff(streams->gpu, streams->owners[o].stream, streams->owners[to].stream,
                                    &streams->fences_recorded, NULL) != PS_OK)
            continue;
        owner_move_blocks(lists, o, to, UINT64_MAX, ++streams->free_counter, IDLE_NEVER);
        return true;
    }
    return false;
}

/* ---- the barrier (free_sync barrier) ----------------------------------- */

/* Even when pending and ready memory together are smaller than a request,
 * releasing them first lets a growth merge with them instead of leaving
 * them as holes; a barrier costs less than a growth. */
bool pool_streams_anything_pending(const pool_streams_t *streams, const pool_lists_t *lists)
{
    if (streams->reuse.bytes_pending)
        return true;
    for (uint32_t o = 1; o < lists->owners_count; o++)
        if (lists->owners[o]->free_bytes)
            return true;
    return false;
}

bool pool_streams_barrier(pool_streams_t *streams, pool_lists_t *lists, uint64_t *released)
{
    const ps_gpu_ops_t *gpu = streams->gpu;
    *released = streams->reuse.bytes_pending;
    /* (numbered in the family: cached blocks freed before it are ready too) */
    if (ps_reuse_barrier(&streams->reuse) != PS_OK) /* refused: epochs stay, the caller goes on with them */
        return false;
    for (uint32_t o = 1; o < lists->owners_count; o++) {
        if (lists->owners[o]->free_blocks) /* idle once this barrier passed */
            owner_move_blocks(lists, o, OWNER_READY, UINT64_MAX, 0, streams->reuse.release_idle);
        pool_stream_owner_t *side = &streams->owners[o];
        if (side->fence) {
            gpu->fence_release(gpu->ctx, side->fence);
            side->fence = NULL;
        }
    }
    return true;
}

/* The thread's oldest cudaFree'd block, tagged `tag`, waits for a barrier.
 * Numbered in the family, the pool's epochs it covers are released at the
 * pool's next poll. Threads asking at once queue on barrier_lock and most
 * find the barrier of the thread ahead covers their block (barriers issued
 * under the pool's lock made every allocation wait). */
bool pool_streams_cache_barrier(pool_streams_t *streams, uint64_t tag)
{
    if (ps_reuse_family_covers(&streams->family, tag))
        return true;
    if (!streams->gpu || streams->options->free_sync != PS_FREE_SYNC_BARRIER)
        return false;
    ps_lock(&streams->barrier_lock);
    bool released = ps_reuse_family_covers(&streams->family, tag);
    if (!released && ps_reuse_family_barrier(&streams->family, streams->gpu) == PS_OK) {
        atomic_fetch_add_explicit(&streams->cache_barriers, 1, memory_order_relaxed);
        released = true;
    }
    ps_unlock(&streams->barrier_lock);
    return released;
}

/* ---- flush and destroyed streams --------------------------------------- */

void pool_streams_flush(pool_streams_t *streams, pool_lists_t *lists)
{
    if (!streams->gpu)
        return;
    ps_reuse_flush(&streams->reuse);
    for (int round = 0; round < 2; round++) /* the 2nd round covers blocks freed after an old lazy fence */
        pool_streams_poll(streams, lists, POOL_POLL_WAIT);
}

/* Retires owner `o`'s free blocks as pending, in a side list, under one
 * fence on every stream, this one included (it is still tracked, and the
 * legacy stream covers blocking streams); without a fence, a device
 * synchronize. */
static void retire_owner_blocks(pool_streams_t *streams, pool_lists_t *lists, uint32_t o)
{
    pool_owner_t *owner = lists->owners[o];
    ps_reuse_list_t retired = {0};
    bool synced = false;
    while (owner->fl_bitmap) {
        unsigned fl = (unsigned)__builtin_ctzll(owner->fl_bitmap);
        unsigned sl = (unsigned)__builtin_ctz(owner->sl_bitmap[fl]);
        uint32_t index = owner->heads[fl][sl];
        pool_lists_remove(lists, index);
        lists->blocks[index].state = BLOCK_PENDING;
        if (ps_reuse_list_push(&retired, index, lists->blocks[index].size) != PS_OK) {
            /* no host memory for the list: this block is safe after a device sync */
            synced = synced || streams->gpu->device_synchronize(streams->gpu->ctx) == PS_OK;
            pool_lists_release(lists, index, OWNER_READY, 0, synced ? IDLE_NOW : IDLE_NEVER);
        }
    }
    ps_reuse_retire(&streams->reuse, &retired, PS_STREAM_NONE);
}

/* Its free list must never be reached through the dead handle again (a
 * fence recorded on a destroyed stream crashes the driver). While the
 * handle is still valid, its blocks are retired under a fence recorded now
 * (they become ready once the stream's work is done); then the owner is
 * recycled for the next new stream. */
void pool_streams_destroyed(pool_streams_t *streams, pool_lists_t *lists, ps_stream_t stream)
{
    uint64_t found;
    if (!ps_ptr_map_remove(&streams->by_stream, stream, &found))
        return;
    if (streams->last_stream == stream)
        streams->last_stream = PS_STREAM_NONE;
    uint32_t o = (uint32_t)found;
    pool_stream_owner_t *side = &streams->owners[o];
    if (lists->owners[o]->free_blocks)
        retire_owner_blocks(streams, lists, o);
    if (side->fence) {
        streams->gpu->fence_release(streams->gpu->ctx, side->fence);
        side->fence = NULL;
    }
    side->stream = PS_STREAM_NONE;
    uint32_t *grown = realloc(streams->dead, (streams->dead_count + 1) * sizeof *grown);
    if (grown) { /* without room the owner is simply never reused */
        streams->dead = grown;
        streams->dead[streams->dead_count++] = o;
    }
}
