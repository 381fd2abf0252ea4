/* reuse: deferred reuse after cudaFree, and the handoff of a block freed on
 * one stream to another (core/reuse.h), for the pool, arena and fixed_size.
 * Algorithm
 *  1. defer: the block joins the open epoch, stamped with the family's
 *     barrier count (a barrier that starts later covers it). No CUDA call.
 *  2. close: one fence_record(PS_STREAM_NONE) (legacy stream plus every live
 *     non-blocking stream) closes the open epoch into the ring, oldest first.
 *  3. poll: releases closed epochs whose fence completed, and every epoch
 *     whose stamp a barrier of the family issued since covers.
 *  4. barrier: n = ++family.started, gpu->barrier (gpu_ops.h), then issued =
 *     max(issued, n): every deferred block is released, no host wait.
 *     Refused (PS_EBUSY: a capture it would touch) or failed: nothing is
 *     released; the caller goes on with epochs, never immediate reuse.
 *  5. reclaim (before growing): poll; still pending: one barrier, or close
 *     and poll. Never a host wait.
 *  6. ps_reuse_barrier_worth, the one decision for every resource:
 *     a. at a miss, grow instead while the reserve plus the request fit in
 *        reserve_floor (barrier_floor) or pending is under grow_floor
 *        (thread_floor); else a barrier;
 *     b. eager: pending above barrier_pending_percent of the reserve, above
 *        pending_floor and, in a reserve of at most twice reserve_floor,
 *        above half of that floor; once PS_REUSE_QUIET_RUN barriers in a row joined no busy
 *        stream, pending_floor alone (halved above twice reserve_floor).
 *  7. pressure: close (or synchronize), then host-wait epochs oldest first.
 *  8. retire: a destroyed stream's blocks become a closed epoch under a
 *     fence recorded on it while its handle is valid.
 *  9. release_idle tells the callback when released blocks are idle on the
 *     GPU: 0 after a completed fence or synchronize, g after barrier g has
 *     passed, UINT64_MAX unknown (the pool's remap unmaps idle memory).
 * 10. handoff(from, to), cudaFreeAsync's rule: reused at once on `from`;
 *     `to` takes it after a fence recorded on `from` after the free, waited
 *     on the GPU (a cudaMalloc host-waits). A refused wait orders nothing.
 * Guarantees: a deferred block is released only after a barrier begun after
 * its free was issued, a fence recorded after its free completed, or a
 * device synchronize; a block freed on one stream reaches another only once
 * that stream's later work follows a fence recorded after the free.
 * bytes_pending is the sum of every unreleased block. The resource's lock
 * guards the state (the family counters are atomic).
 */
#include "reuse.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

void ps_reuse_init(ps_reuse_t *r, const ps_gpu_ops_t *gpu, ps_free_sync_t free_sync,
                   unsigned barrier_pending_percent, ps_reuse_family_t *family,
                   ps_reuse_release_fn release, void *owner)
{
    memset(r, 0, sizeof *r);
    r->gpu = gpu;
    r->free_sync = free_sync;
    r->barrier_pending_percent = gpu && gpu->barrier ? barrier_pending_percent : 0;
    r->release = release;
    r->owner = owner;
    r->family = family ? family : &r->own_family;
    r->release_idle = PS_REUSE_IDLE_NEVER;
    /* 6b: until the family's first barrier, what the table says of its
     * newest one (nothing joined yet: quiet from the start); a state that
     * joins a family later (the arena's per-thread ones) leaves the count
     * its barriers made */
    if (atomic_load(&r->family->started) == 0)
        atomic_store_explicit(&r->family->quiet,
                              gpu && gpu->barrier_joined && gpu->barrier_joined(gpu->ctx) == 0 ? PS_REUSE_QUIET_RUN : 0,
                              memory_order_relaxed);
}

void ps_reuse_destroy(ps_reuse_t *r)
{
    for (uint32_t i = 0; i < r->closed_count; i++) {
        ps_reuse_epoch_t *e = &r->closed[(r->closed_head + i) % r->closed_capacity];
        r->gpu->fence_release(r->gpu->ctx, e->fence);
        free(e->list.items);
    }
    free(r->closed);
    free(r->open.items);
    free(r->spare.items);
    r->closed = NULL;
    r->open = r->spare = (ps_reuse_list_t){0};
    r->closed_count = r->closed_capacity = r->closed_head = 0;
    r->bytes_pending = 0;
}

int ps_reuse_list_push(ps_reuse_list_t *list, uint64_t item, uint64_t bytes)
{
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? list->capacity * 2 : 64;
        uint64_t *items = realloc(list->items, capacity * sizeof *items);
        if (!items)
            return PS_ENOMEM;
        list->items = items;
        list->capacity = capacity;
    }
    list->items[list->count++] = item;
    list->bytes += bytes;
    return PS_OK;
}

int ps_reuse_defer(ps_reuse_t *r, uint64_t item, uint64_t bytes)
{
    if (r->open.count == r->open.capacity && !r->open.items && r->spare.items) {
        r->open = r->spare; /* an emptied array from a released epoch */
        r->spare = (ps_reuse_list_t){0};
    }
    int status = ps_reuse_list_push(&r->open, item, bytes);
    if (status != PS_OK)
        return status;
    r->open.stamp = ps_reuse_family_stamp(r->family);
    r->bytes_pending += bytes;
    return PS_OK;
}

/* What release_list does with the list's array once it is empty. */
enum { FREE_ARRAY = 0, KEEP_ARRAY = 1 };

/* Releases every block of `list` (oldest first) and empties it; with
 * FREE_ARRAY its array goes (one is kept spare for reuse). */
static void release_list(ps_reuse_t *r, ps_reuse_list_t *list, int array)
{
    for (size_t i = 0; i < list->count; i++)
        r->release(r->owner, list->items[i]);
    r->bytes_pending -= list->bytes;
    if (array == KEEP_ARRAY) {
        list->count = 0;
        list->bytes = 0;
        return;
    }
    if (!r->spare.items && list->items) {
        r->spare = (ps_reuse_list_t){.items = list->items, .capacity = list->capacity};
    } else {
        free(list->items);
    }
    *list = (ps_reuse_list_t){0};
}

static void pop_oldest(ps_reuse_t *r)
{
    ps_reuse_epoch_t *e = &r->closed[r->closed_head];
    r->gpu->fence_release(r->gpu->ctx, e->fence);
    e->fence = NULL;
    release_list(r, &e->list, FREE_ARRAY);
    r->closed_head = (r->closed_head + 1) % r->closed_capacity;
    r->closed_count--;
}

/* Whether a barrier issued since covers a list stamped `stamp`. */
static inline int covered(const ps_reuse_t *r, const ps_reuse_list_t *list)
{
    return ps_reuse_family_covers(r->family, list->stamp);
}

int ps_reuse_poll(ps_reuse_t *r)
{
    int released = 0;
    while (r->closed_count) {
        ps_reuse_epoch_t *oldest = &r->closed[r->closed_head];
        int by_barrier = covered(r, &oldest->list);
        if (!by_barrier && r->gpu->fence_query(r->gpu->ctx, oldest->fence) != PS_OK)
            break;
        r->release_idle = by_barrier ? PS_REUSE_IDLE_NEVER : PS_REUSE_IDLE_NOW;
        pop_oldest(r);
        released++;
    }
    /* another state of the family issued a barrier: the open epoch too */
    if (r->family != &r->own_family && r->open.count && covered(r, &r->open)) {
        r->release_idle = PS_REUSE_IDLE_NEVER;
        release_list(r, &r->open, KEEP_ARRAY);
        released++;
    }
    return released;
}

/* Room for one more closed epoch. */
static int reserve_closed(ps_reuse_t *r)
{
    if (r->closed_count < r->closed_capacity)
        return PS_OK;
    uint32_t capacity = r->closed_capacity ? r->closed_capacity * 2 : 16;
    ps_reuse_epoch_t *ring = malloc((size_t)capacity * sizeof *ring);
    if (!ring)
        return PS_ENOMEM;
    for (uint32_t i = 0; i < r->closed_count; i++)
        ring[i] = r->closed[(r->closed_head + i) % r->closed_capacity];
    free(r->closed);
    r->closed = ring;
    r->closed_capacity = capacity;
    r->closed_head = 0;
    return PS_OK;
}

/* Appends `list` as a closed epoch under `fence`; the list is taken over. */
static void push_closed(ps_reuse_t *r, ps_fence_t *fence, ps_reuse_list_t *list)
{
    ps_reuse_epoch_t *slot = &r->closed[(r->closed_head + r->closed_count) % r->closed_capacity];
    slot->fence = fence;
    slot->list = *list;
    r->closed_count++;
    *list = (ps_reuse_list_t){0};
}

int ps_reuse_close(ps_reuse_t *r)
{
    if (r->open.count == 0)
        return PS_EINVAL;
    int status = reserve_closed(r);
    if (status != PS_OK)
        return status;
    ps_fence_t *fence;
    status = r->gpu->fence_record(r->gpu->ctx, PS_STREAM_NONE, &fence);
    if (status != PS_OK)
        return status;
    r->fences_recorded++;
    push_closed(r, fence, &r->open);
    return PS_OK;
}

int ps_reuse_close_and_poll(ps_reuse_t *r, uint64_t wait_ns)
{
    if (r->open.count == 0 || ps_reuse_close(r) != PS_OK)
        return 0;
    ps_fence_t *fence = r->closed[(r->closed_head + r->closed_count - 1) % r->closed_capacity].fence;
    if (r->gpu->fence_query(r->gpu->ctx, fence) != PS_OK && wait_ns) {
        uint64_t deadline = ps_now_ns() + wait_ns;
        while (r->gpu->fence_query(r->gpu->ctx, fence) != PS_OK && ps_now_ns() < deadline)
            ;
    }
    return ps_reuse_poll(r);
}

int ps_reuse_family_barrier(ps_reuse_family_t *family, const ps_gpu_ops_t *gpu)
{
    if (!gpu || !gpu->barrier)
        return PS_EUNSUPPORTED;
    uint64_t number = atomic_fetch_add(&family->started, 1) + 1; /* before the barrier's first CUDA call */
    int status = gpu->barrier(gpu->ctx);
    if (status != PS_OK)
        return status;
    /* 6b: whether the next eager barriers may skip the percentage (a table
     * that cannot tell counts as joining): one more quiet barrier in a row,
     * or none (racing barriers may lose a count: a heuristic, never safety) */
    int quiet = gpu->barrier_joined && gpu->barrier_joined(gpu->ctx) == 0;
    int run = atomic_load_explicit(&family->quiet, memory_order_relaxed);
    atomic_store_explicit(&family->quiet, quiet ? (run < PS_REUSE_QUIET_RUN ? run + 1 : run) : 0,
                          memory_order_relaxed);
    uint64_t seen = atomic_load(&family->issued);
    while (seen < number && !atomic_compare_exchange_weak(&family->issued, &seen, number))
        ;
    return PS_OK;
}

int ps_reuse_barrier(ps_reuse_t *r)
{
    const ps_gpu_ops_t *gpu = r->gpu;
    if (r->free_sync != PS_FREE_SYNC_BARRIER || !gpu || !gpu->barrier)
        return PS_EUNSUPPORTED;
    int status = ps_reuse_family_barrier(r->family, gpu);
    if (status != PS_OK) {
        r->barriers_refused++;
        return status;
    }
    r->barriers++;
    /* read after the barrier: its own number or a later barrier's, which
     * passes no earlier; 0 (a table that numbers no barrier) would read as
     * "idle now", so it counts as never known idle */
    uint64_t generation = gpu->barrier_generation && gpu->barrier_passed ? gpu->barrier_generation(gpu->ctx) : 0;
    r->release_idle = generation != 0 ? generation : PS_REUSE_IDLE_NEVER;
    while (r->closed_count)
        pop_oldest(r);
    release_list(r, &r->open, KEEP_ARRAY);
    return PS_OK;
}

ps_reuse_barrier_call_t ps_reuse_barrier_worth(const ps_reuse_barrier_case_t *c)
{
    if (c->miss) {
        /* 6a. under a floor: grow */
        if (c->reserve_floor && c->reserved <= c->reserve_floor && c->request <= c->reserve_floor - c->reserved)
            return PS_REUSE_GROW;
        if (c->pending < c->grow_floor)
            return PS_REUSE_GROW;
        return PS_REUSE_BARRIER;
    }
    /* 6b. the eager trigger: the percentage, then the floors */
    if (!ps_reuse_past_percent(c->pending, c->reserved, c->percent, c->quiet))
        return PS_REUSE_WAIT;
    /* quiet, in a reserve above twice reserve_floor: half the pending floor
     * (small pools, and so a free/take loop of 1 MiB blocks, keep it whole):
     * fewer pieces move for more, cheap, barriers (docs/design.md,
     * "Quiet barriers") */
    uint64_t pending_floor = c->pending_floor;
    if (c->quiet && c->reserve_floor && c->reserved > 2 * c->reserve_floor)
        pending_floor /= 2;
    if (c->pending < pending_floor)
        return PS_REUSE_WAIT;
    if (c->reserve_floor && c->reserved <= 2 * c->reserve_floor && c->pending * 2 < c->reserve_floor)
        return PS_REUSE_WAIT;
    return PS_REUSE_BARRIER;
}

bool ps_reuse_reclaim(ps_reuse_t *r)
{
    int released = ps_reuse_poll(r);
    if (!r->bytes_pending)
        return released > 0;
    if (ps_reuse_barrier(r) == PS_OK)
        return 1;
    if (r->open.count)
        ps_reuse_close(r);
    return released + ps_reuse_poll(r) > 0;
}

void ps_reuse_reclaim_pressure(ps_reuse_t *r, bool host_wait)
{
    ps_reuse_poll(r);
    if (!r->bytes_pending || ps_reuse_barrier(r) == PS_OK)
        return;
    if (r->open.count)
        ps_reuse_close(r);
    if (host_wait)
        while (ps_reuse_wait_oldest(r))
            ;
    ps_reuse_poll(r);
}

bool ps_reuse_wait_oldest(ps_reuse_t *r)
{
    if (!r->closed_count)
        return 0;
    int status = r->gpu->fence_wait(r->gpu->ctx, r->closed[r->closed_head].fence);
    r->fence_waits++;
    r->release_idle = status == PS_OK ? PS_REUSE_IDLE_NOW : PS_REUSE_IDLE_NEVER;
    pop_oldest(r);
    return 1;
}

void ps_reuse_close_or_sync(ps_reuse_t *r)
{
    if (r->open.count == 0 || ps_reuse_close(r) == PS_OK)
        return;
    if (r->gpu->device_synchronize(r->gpu->ctx) == PS_OK) {
        r->release_idle = PS_REUSE_IDLE_NOW;
        release_list(r, &r->open, KEEP_ARRAY);
    }
}

void ps_reuse_flush(ps_reuse_t *r)
{
    if (!r->gpu)
        return;
    ps_reuse_close_or_sync(r);
    while (ps_reuse_wait_oldest(r))
        ;
}

void ps_reuse_retire(ps_reuse_t *r, ps_reuse_list_t *list, ps_stream_t stream)
{
    if (!list->count) {
        free(list->items);
        *list = (ps_reuse_list_t){0};
        return;
    }
    r->bytes_pending += list->bytes;
    ps_fence_t *fence;
    if (r->gpu && reserve_closed(r) == PS_OK && r->gpu->fence_record(r->gpu->ctx, stream, &fence) == PS_OK) {
        r->fences_recorded++;
        list->stamp = ps_reuse_family_stamp(r->family);
        push_closed(r, fence, list);
        return;
    }
    /* no fence: wait for the whole device; then the blocks are safe */
    int synced = r->gpu && r->gpu->device_synchronize(r->gpu->ctx) == PS_OK;
    r->release_idle = synced ? PS_REUSE_IDLE_NOW : PS_REUSE_IDLE_NEVER;
    release_list(r, list, FREE_ARRAY);
}

int ps_reuse_visit(const ps_reuse_t *r, void (*visit)(void *ctx, uint64_t item), void *ctx)
{
    uint64_t bytes = 0;
    for (uint32_t e = 0; e <= r->closed_count; e++) {
        const ps_reuse_list_t *list = e < r->closed_count
                                          ? &r->closed[(r->closed_head + e) % r->closed_capacity].list
                                          : &r->open;
        for (size_t i = 0; i < list->count; i++)
            visit(ctx, list->items[i]);
        bytes += list->bytes;
    }
    return bytes == r->bytes_pending ? PS_OK : PS_EINVAL;
}

int ps_reuse_fence_handoff(const ps_gpu_ops_t *gpu, ps_fence_t *fence, ps_stream_t to, uint64_t *fence_waits)
{
    if (to != PS_STREAM_NONE)
        return gpu->stream_wait_fence(gpu->ctx, to, fence);
    int status = gpu->fence_wait(gpu->ctx, fence);
    if (fence_waits)
        (*fence_waits)++;
    return status;
}

int ps_reuse_stream_handoff(const ps_gpu_ops_t *gpu, ps_stream_t from, ps_stream_t to,
                            uint64_t *fences_recorded, uint64_t *fence_waits)
{
    ps_fence_t *fence;
    int status = gpu->fence_record(gpu->ctx, from, &fence);
    if (status != PS_OK)
        return status;
    if (fences_recorded)
        (*fences_recorded)++;
    status = ps_reuse_fence_handoff(gpu, fence, to, fence_waits);
    gpu->fence_release(gpu->ctx, fence);
    return status;
}
