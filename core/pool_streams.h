/* The pool's stream lists and barriers (core/pool_streams.c): the
 * cudaFree epochs (core/reuse.c's state), an owner of the lists per
 * stream with its lazy fence, and what moves blocks from one owner to
 * another: stealing, fences, the barrier, a destroyed stream, a flush.
 * Above the growth layer (it reads its budget floor) and the lists; it
 * calls nothing above. Blocks that epochs release go to the release
 * callback the front gives (core/reuse.h). Every function expects the
 * pool's lock held, but pool_streams_cache_barrier. */
#ifndef POOLSHIM_POOL_STREAMS_H
#define POOLSHIM_POOL_STREAMS_H

#include "gpu_ops.h"
#include "pool_growth.h"
#include "pool_lists.h"
#include "pool_options.h"
#include "ptr_map.h"
#include "resource.h"
#include "reuse.h"

#include <stdatomic.h>
#include <stdbool.h>

/* The stream side of an owner of the lists. */
typedef struct pool_stream_owner {
    ps_stream_t stream;   /* the stream (PS_STREAM_NONE for the ready list and dead owners) */
    ps_fence_t *fence;    /* lazily recorded fence on `stream` (for cudaMalloc), or NULL */
    uint64_t fence_stamp; /* it covers blocks with free_stamp <= this */
} pool_stream_owner_t;

typedef struct pool_streams {
    const ps_pool_options_t *options; /* the pool's */
    const ps_gpu_ops_t *gpu;          /* fences and stream waits (NULL: free_sync none only) */
    ps_reuse_t reuse;                 /* cudaFree'd blocks (state PENDING) until a barrier or fence */
    pool_stream_owner_t *owners;      /* per owner of the lists: its stream and fence */
    uint32_t owners_capacity;         /* length of owners[] */
    ps_ptr_map_t by_stream;           /* stream -> owner index */
    uint32_t *dead;                   /* owner indices of destroyed streams, reusable */
    uint32_t dead_count;              /* entries in dead */
    ps_stream_t last_stream;          /* one-entry cache of by_stream ... */
    uint32_t last_owner;              /* ... and its owner */
    uint64_t free_counter;            /* stamps stream-list frees */
    uint64_t fences_recorded;         /* fences recorded for stream lists (epochs: reuse's) */
    uint64_t fence_waits;             /* host waits on stream lists (epochs: reuse's) */
    /* read by every cache operation, written only by barriers: a line of its own */
    _Alignas(64) ps_reuse_family_t family; /* barrier numbers of the epochs and the thread caches (lock-free) */
    _Alignas(64) ps_lock_t barrier_lock;   /* one thread cache's barrier at a time (the others share it) */
    _Atomic uint64_t cache_barriers;       /* barriers issued for thread caches */
} pool_streams_t;

/* How stream lists are polled for a cudaMalloc (pool_streams_poll). */
typedef enum pool_poll {
    POOL_POLL_QUERY,  /* query the fences recorded already */
    POOL_POLL_RECORD, /* record a fence on lists that have none, then query */
    POOL_POLL_WAIT    /* record where none is, then host-wait each (memory pressure) */
} pool_poll_t;

/* Epochs whose released blocks go to `release(owner, index)`. */
int pool_streams_init(pool_streams_t *streams, const ps_pool_options_t *options, const ps_gpu_ops_t *gpu,
                      ps_reuse_release_fn release, void *owner);
/* Releases the epochs' and the lists' fences; `owners` owners were made. */
void pool_streams_destroy(pool_streams_t *streams, uint32_t owners);
/* The owner index of `stream` (a stream-ordered call), made on first use. */
int pool_streams_owner_of(pool_streams_t *streams, pool_lists_t *lists, ps_stream_t stream, uint32_t *out);
/* Used block `index` freed stream-ordered joins owner `owner`'s lists at once. */
static inline void pool_streams_free_on(pool_streams_t *streams, pool_lists_t *lists, uint32_t index,
                                        uint32_t owner)
{
    pool_lists_release(lists, index, owner, ++streams->free_counter, IDLE_NEVER);
}
/* pool_streams_defer's way when the epoch list has no room: block `index`
 * is reused after a device synchronize. */
int pool_streams_defer_synced(pool_streams_t *streams, pool_lists_t *lists, uint32_t index);
/* Used block `index`, freed by cudaFree, waits in the open epoch (state
 * pending: it neither merges nor is handed out). On host OOM for the
 * epoch list it is reused after a device synchronize instead. */
static inline int pool_streams_defer(pool_streams_t *streams, pool_lists_t *lists, uint32_t index)
{
    pool_block_t *b = &lists->blocks[index];
    b->state = BLOCK_PENDING;
    if (ps_reuse_defer(&streams->reuse, index, b->size) == PS_OK)
        return PS_OK;
    return pool_streams_defer_synced(streams, lists, index);
}
/* For a cudaMalloc: stream lists whose fence completed move to the ready
 * list. Returns how many lists moved. */
int pool_streams_poll(pool_streams_t *streams, pool_lists_t *lists, pool_poll_t how);
/* For an allocation on stream owner `to`: steals the list of another
 * stream that holds a block of `size` bytes (a fence on that stream now,
 * `to`'s stream waits for it). true when blocks moved. */
bool pool_streams_steal(pool_streams_t *streams, pool_lists_t *lists, uint32_t to, size_t size);
/* Something is pending: epochs or other streams' lists. */
bool pool_streams_anything_pending(const pool_streams_t *streams, const pool_lists_t *lists);
/* One device-wide barrier; issued, every pending block (epochs, every
 * stream's list) joins the ready list, idle once it passed, and true;
 * *released = the epochs' bytes it released. Refused (a capture is open):
 * false, nothing changed. */
bool pool_streams_barrier(pool_streams_t *streams, pool_lists_t *lists, uint64_t *released);
/* Closes and host-waits every epoch and every stream list: afterwards all
 * free memory is in the ready list. */
void pool_streams_flush(pool_streams_t *streams, pool_lists_t *lists);
/* Closes the open epoch and polls it for up to epoch_wait_ns, amortized
 * near the budget floor (`floor` for the request). Returns the epochs released. */
int pool_streams_close_and_poll(pool_streams_t *streams, pool_budget_floor_t floor);
/* After a block joined the open epoch (`floor` for its size): at the
 * floor, the open epoch is closed once it holds half of what is not in use. */
void pool_streams_fence_batch(pool_streams_t *streams, const pool_lists_t *lists, pool_budget_floor_t floor);
/* The program is destroying `stream`: its blocks are retired as a closed
 * epoch and its owner is reused. */
void pool_streams_destroyed(pool_streams_t *streams, pool_lists_t *lists, ps_stream_t stream);
/* A thread cache's barrier for its block tagged `tag`, without the pool's
 * lock: true when a barrier covers the tag. */
bool pool_streams_cache_barrier(pool_streams_t *streams, uint64_t tag);
/* The decay's idle tick under free_sync event: the open epoch is closed
 * and completed fences polled, no wait. */
void pool_streams_close_open_and_poll(pool_streams_t *streams);
/* Adds the pending bytes, fences, host waits and barriers to *info. */
void pool_streams_add_counters(const pool_streams_t *streams, ps_resource_info_t *info);

/* ---- inline: the epochs, for the front's ladder ------------------------ */

/* Bytes waiting in epochs. */
static inline uint64_t pool_streams_pending(const pool_streams_t *streams)
{
    return streams->reuse.bytes_pending;
}

/* The idle generation of blocks the epochs release now (their release callback). */
static inline uint64_t pool_streams_release_idle(const pool_streams_t *streams)
{
    return streams->reuse.release_idle;
}

/* A cudaFree waits in an epoch (free_sync event or barrier). */
static inline bool pool_streams_defers(const pool_streams_t *streams)
{
    return ps_reuse_defers(&streams->reuse);
}

/* The eager barrier's percentage passed (the floors are asked apart). */
static inline bool pool_streams_pending_piles_up(const pool_streams_t *streams, uint64_t reserved)
{
    return ps_reuse_wants_barrier(&streams->reuse, reserved);
}

/* When a barrier is asked about (pool_streams_barrier_call). */
typedef enum pool_barrier_ask {
    POOL_BARRIER_EAGER,  /* an allocation that may still be served: pending memory piles up */
    POOL_BARRIER_AT_MISS /* nothing free fits the request: grow or a barrier */
} pool_barrier_ask_t;

/* The barrier decision (core/reuse.h) for this pool holding `reserved`
 * bytes, its floor `reserve_floor`: at a miss for `request` bytes, or the
 * eager trigger. */
static inline ps_reuse_barrier_call_t pool_streams_barrier_call(const pool_streams_t *streams,
                                                                pool_barrier_ask_t ask, uint64_t request,
                                                                uint64_t reserved, uint64_t reserve_floor)
{
    ps_reuse_barrier_case_t c = {
        .miss = ask == POOL_BARRIER_AT_MISS,
        .reserved = reserved,
        .pending = streams->reuse.bytes_pending,
        .request = request,
        .percent = ps_reuse_eager_percent(&streams->reuse),
        .quiet = ps_reuse_quiet(&streams->reuse),
        .reserve_floor = reserve_floor,
        .pending_floor = streams->options->barrier_floor,
    };
    return ps_reuse_barrier_worth(&c);
}

/* Completed epochs release their blocks; returns how many. */
static inline int pool_streams_poll_epochs(pool_streams_t *streams)
{
    return ps_reuse_poll(&streams->reuse);
}

/* Closes the open epoch (a device synchronize when no fence can be had). */
static inline void pool_streams_close_or_sync(pool_streams_t *streams)
{
    ps_reuse_close_or_sync(&streams->reuse);
}

/* Closed epochs not released yet. */
static inline uint32_t pool_streams_closed(const pool_streams_t *streams)
{
    return streams->reuse.closed_count;
}

/* Host-waits the oldest closed epoch; false when there is none. */
static inline bool pool_streams_wait_oldest(pool_streams_t *streams)
{
    return ps_reuse_wait_oldest(&streams->reuse);
}

#endif
