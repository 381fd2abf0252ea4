/* reuse: deferred reuse after cudaFree, and the handoff of a block freed
 * on one stream to another, one policy for every resource that defers or
 * keeps stream-ordered lists (pool, arena, fixed_size; binning composes
 * them). core/reuse.c opens with the algorithm; this header is its
 * contract.
 *
 * A resource hands each block freed with PS_STREAM_NONE to ps_reuse_defer
 * (an opaque 64-bit item: a descriptor index, an address) and gets it back
 * through its release callback once no GPU work issued before the free can
 * still touch it: after a device-wide barrier (free_sync barrier) or after
 * a fence recorded after the free completed (free_sync event, and barrier
 * when no barrier can be had). The resource keeps its own lock; every
 * function here is called with it held ("_locked" is implied) and calls
 * the release callback under it.
 *
 * Return rule: functions returning int return PS_OK or a negative PS_E*
 * code, except those documented to return a count.
 */
#ifndef PS_REUSE_H
#define PS_REUSE_H

#include "gpu_ops.h"

#include <stdatomic.h>
#include <stdbool.h>

/* What a cudaFree (a free with PS_STREAM_NONE) waits for before its block
 * can be handed out again. */
typedef enum ps_free_sync {
    PS_FREE_SYNC_EVENT = 0, /* epochs closed by fences, polled, never blocks the hot path */
    PS_FREE_SYNC_DEVICE,    /* synchronize the device at the free, like native cudaFree */
    PS_FREE_SYNC_NONE,      /* reuse at once: trusts the program (one stream only) */
    PS_FREE_SYNC_BARRIER    /* (default) before growing, a GPU-side barrier makes every
                               pending block ready at once; no host wait */
} ps_free_sync_t;

/* Gives a block back to its resource: it may be handed out again. */
typedef void (*ps_reuse_release_fn)(void *owner, uint64_t item);

/* Barrier numbers shared by the reuse states of one resource (an arena's
 * per-thread states and its large blocks) and by whatever else defers
 * blocks on them (the pool's thread caches): a barrier issued by one of
 * them orders the blocks every other one deferred before it, and they
 * release them when they next poll. Lock-free. */
typedef struct ps_reuse_family {
    _Atomic uint64_t started; /* barriers begun (a defer stamps its block with this) */
    _Atomic uint64_t issued;  /* highest barrier number issued successfully */
    atomic_int quiet;         /* the newest barriers in a row that joined no busy stream (gpu->barrier_joined
                                 0), at most PS_REUSE_QUIET_RUN; 0 after one that joined */
} ps_reuse_family_t;

/* The stamp of a block freed now: any barrier issued later covers it
 * (sequentially consistent, paired with the increment in the barrier). */
static inline uint64_t ps_reuse_family_stamp(ps_reuse_family_t *family)
{
    return atomic_load(&family->started);
}

/* Whether a barrier issued since covers a block stamped `stamp`. */
static inline bool ps_reuse_family_covers(ps_reuse_family_t *family, uint64_t stamp)
{
    return atomic_load_explicit(&family->issued, memory_order_acquire) > stamp;
}

/* One device-wide barrier (gpu->barrier) numbered in `family`, without any
 * reuse state: every block stamped before it is covered once it returns
 * PS_OK; the states release theirs at their next poll. Needs no lock of
 * the resource (gpu->barrier is thread-safe; concurrent barriers publish
 * the highest number that succeeded). PS_EBUSY (a capture is open) or
 * another error: nothing is covered. */
int ps_reuse_family_barrier(ps_reuse_family_t *family, const ps_gpu_ops_t *gpu);

/* Blocks deferred together. */
typedef struct ps_reuse_list {
    uint64_t *items;   /* the resource's items, in free order */
    size_t count;      /* entries used */
    size_t capacity;   /* entries allocated */
    uint64_t bytes;    /* bytes they cover */
    uint64_t stamp;    /* family->started at the last defer: a barrier numbered above it covers all */
} ps_reuse_list_t;

/* A closed epoch: its blocks are reusable once `fence` completed. */
typedef struct ps_reuse_epoch {
    ps_fence_t *fence;    /* recorded after every free in `list` */
    ps_reuse_list_t list; /* the blocks */
} ps_reuse_epoch_t;

typedef struct ps_reuse {
    const ps_gpu_ops_t *gpu;       /* fences and barriers (NULL: free_sync none or device only) */
    ps_free_sync_t free_sync;      /* the policy */
    unsigned barrier_pending_percent; /* eager barrier trigger (ps_reuse_wants_barrier); 0 = off */
    ps_reuse_release_fn release;   /* hands a block back */
    void *owner;                   /* its first argument */
    ps_reuse_family_t *family;     /* barrier numbers (own_family unless shared) */
    ps_reuse_family_t own_family;  /* used when no family is shared */
    ps_reuse_list_t open;          /* deferred since the last close */
    ps_reuse_list_t spare;         /* an emptied list kept for the next open one (no realloc churn) */
    ps_reuse_epoch_t *closed;      /* ring of closed epochs, oldest at closed_head */
    uint32_t closed_capacity;      /* ring length */
    uint32_t closed_head;          /* index of the oldest */
    uint32_t closed_count;         /* closed epochs waiting for their fence */
    uint64_t bytes_pending;        /* bytes of every deferred block not yet released */
    uint64_t fences_recorded;      /* fences this state recorded */
    uint64_t fence_waits;          /* host waits this state did */
    uint64_t barriers;             /* barriers this state issued that released its blocks */
    uint64_t barriers_refused;     /* barriers refused (a capture open: PS_EBUSY) or failed */
    uint64_t release_idle;         /* while the release callback runs: the blocks' idle generation (see
                                      PS_REUSE_IDLE_* below) */
} ps_reuse_t;

/* Idle generations (release_idle): once gpu->barrier_passed says barrier
 * number g has passed, no GPU work issued before the release can touch a
 * block released with release_idle <= g. A completed fence or a device
 * synchronize: PS_REUSE_IDLE_NOW (0). A barrier: its number (or a later
 * one: gpu->barrier_generation read after it). Unknown (a barrier of the
 * family covered it, a failed wait, no barrier numbers): PS_REUSE_IDLE_NEVER. */
#define PS_REUSE_IDLE_NOW 0ull
#define PS_REUSE_IDLE_NEVER UINT64_MAX

/* Prepares *r. `family` NULL: its own. barrier_pending_percent: see
 * ps_reuse_wants_barrier. */
void ps_reuse_init(ps_reuse_t *r, const ps_gpu_ops_t *gpu, ps_free_sync_t free_sync,
                   unsigned barrier_pending_percent, ps_reuse_family_t *family,
                   ps_reuse_release_fn release, void *owner);
/* Releases every fence and array; deferred blocks are dropped, not released. */
void ps_reuse_destroy(ps_reuse_t *r);

/* Whether blocks freed with PS_STREAM_NONE wait here (event or barrier). */
static inline bool ps_reuse_defers(const ps_reuse_t *r)
{
    return r->free_sync == PS_FREE_SYNC_EVENT || r->free_sync == PS_FREE_SYNC_BARRIER;
}

/* A block of `bytes` was freed: it joins the open epoch. PS_ENOMEM (host
 * memory) leaves it with the caller. */
int ps_reuse_defer(ps_reuse_t *r, uint64_t item, uint64_t bytes);

/* Polls closed epochs oldest first (fence_query) and releases the
 * completed ones, and any epoch (open ones included) a barrier of the
 * family already covered. Returns how many epochs were released. */
int ps_reuse_poll(ps_reuse_t *r);

/* Closes the open epoch with one fence on every stream
 * (fence_record(PS_STREAM_NONE)). PS_EINVAL when it is empty; another
 * error (the epoch stays open) when no fence could be had. */
int ps_reuse_close(ps_reuse_t *r);

/* Closes the open epoch and polls the new fence for up to wait_ns, then
 * polls every epoch. Returns how many epochs were released (0 also when
 * nothing could be closed). */
int ps_reuse_close_and_poll(ps_reuse_t *r, uint64_t wait_ns);

/* free_sync barrier only: one device-wide barrier; PS_OK: it was issued
 * and every deferred block is released. PS_EUNSUPPORTED under another
 * free_sync or without a barrier entry; the barrier's error otherwise (a
 * capture open: PS_EBUSY, a CUDA error). On an error nothing was released:
 * the caller goes on with epochs. */
int ps_reuse_barrier(ps_reuse_t *r);

/* The rule every resource follows before it grows or takes memory it
 * would not otherwise need: poll; then, while something is pending, one
 * barrier (free_sync barrier) or, without one, close the open epoch and
 * poll it (never a host wait). True when anything was released. */
bool ps_reuse_reclaim(ps_reuse_t *r);
/* The same rule under memory pressure (the arena's defragmentation): when
 * the barrier is refused or under EVENT, the open epoch is closed and, with
 * `host_wait`, every closed epoch host-waited for before the last poll. */
void ps_reuse_reclaim_pressure(ps_reuse_t *r, bool host_wait);

/* The eager trigger's floor: fewer pending bytes never ask for an early
 * barrier (in a small pool, 3 % is one block: a 64 KiB cudaMalloc/cudaFree
 * pair in an empty pool would pay a barrier every time; a barrier still
 * comes before any growth). */
#define PS_REUSE_EAGER_FLOOR (1024 * 1024)

/* The eager trigger's default percentage of the reserve (the pool's
 * barrier_pending_percent, the arena's large blocks): pending bytes past it
 * are worth a barrier before an allocation. The only definition of it. */
#define PS_REUSE_BARRIER_PENDING_PERCENT 3

/* The eager trigger's percentage rule: `pending` bytes passed
 * PS_REUSE_EAGER_FLOOR and `percent` % of `reserved` (percent 0: off), or,
 * `quiet` (the newest barrier joined no busy stream), only the floor: such
 * a barrier costs an event record, while memory freed since the last one
 * cannot be reused and new blocks scatter (core/reuse.c, step 6b). */
static inline int ps_reuse_past_percent(uint64_t pending, uint64_t reserved, unsigned percent, int quiet)
{
    return percent && pending > PS_REUSE_EAGER_FLOOR && (quiet || pending * 100 > reserved * percent);
}

/* What ps_reuse_barrier_worth answers. */
typedef enum ps_reuse_barrier_call {
    PS_REUSE_WAIT = 0, /* no miss, and the pending bytes are not worth a barrier yet */
    PS_REUSE_GROW,     /* a miss under a floor: take fresh memory, no barrier */
    PS_REUSE_BARRIER   /* one barrier (at a miss: when anything is pending, before growing) */
} ps_reuse_barrier_call_t;

/* A resource's question under free_sync barrier: at a miss (nothing free
 * fits `request`), grow or issue a barrier? At an allocation that may still
 * be served (the eager trigger), issue one now or wait? A field that does
 * not apply is 0. */
typedef struct ps_reuse_barrier_case {
    int miss;               /* 1: nothing free fits `request`; 0: the eager trigger */
    uint64_t reserved;      /* bytes the resource (or the part asking) holds */
    uint64_t pending;       /* bytes a barrier would release */
    uint64_t request;       /* a miss: the bytes it needs */
    unsigned percent;       /* the eager trigger: pending must pass this % of reserved; 0 = off */
    int quiet;              /* the eager trigger: the newest barrier joined no busy stream, the
                               percentage does not apply (ps_reuse_quiet) */
    uint64_t reserve_floor; /* a miss grows while reserved + request fit in it; the eager trigger, in a
                               reserve of at most twice it, waits for half of it pending (the pool's
                               barrier_floor, grown by its threads' caches); 0 = none */
    uint64_t pending_floor; /* the eager trigger waits while fewer bytes are pending (the pool's
                               barrier_floor); 0 = none */
    uint64_t grow_floor;    /* a miss grows while fewer bytes are pending (the arena's thread_floor,
                               once threads met); 0 = none */
} ps_reuse_barrier_case_t;

/* The barrier decision of every resource (core/reuse.c, steps 5-6):
 *  a miss: GROW while reserved + request fit in reserve_floor, or while
 *     pending is under grow_floor; else BARRIER;
 *  the eager trigger: BARRIER once percent is set and pending passed both
 *     PS_REUSE_EAGER_FLOOR and (unless quiet) percent % of reserved, unless pending is
 *     under pending_floor or, in a reserve of at most twice reserve_floor,
 *     under half of it; else WAIT.
 * Pure arithmetic: no lock, no state. */
ps_reuse_barrier_call_t ps_reuse_barrier_worth(const ps_reuse_barrier_case_t *c);

/* The eager trigger's percentage of a reuse state: barrier_pending_percent
 * under free_sync barrier with a barrier entry, else 0 (off). */
static inline unsigned ps_reuse_eager_percent(const ps_reuse_t *r)
{
    return r->free_sync == PS_FREE_SYNC_BARRIER ? r->barrier_pending_percent : 0;
}

/* Quiet barriers in a row before the eager trigger drops the percentage: a
 * stream busy now and then (DDP's NCCL stream between collectives) must not
 * make one idle moment bring the next barriers, which would join it, sooner. */
#define PS_REUSE_QUIET_RUN 8

/* Whether the newest PS_REUSE_QUIET_RUN barriers of a reuse state's family
 * (the family's barriers; see ps_reuse_family_barrier) joined no busy stream. */
static inline bool ps_reuse_quiet(const ps_reuse_t *r)
{
    return atomic_load_explicit(&r->family->quiet, memory_order_relaxed) >= PS_REUSE_QUIET_RUN;
}

/* The eager trigger of a reuse state without floors (ps_reuse_barrier_worth
 * of that case, inline for the allocation path): whether its pending bytes
 * passed ps_reuse_eager_percent of `reserved` (unless quiet) and
 * PS_REUSE_EAGER_FLOOR. */
static inline bool ps_reuse_wants_barrier(const ps_reuse_t *r, uint64_t reserved)
{
    return ps_reuse_past_percent(r->bytes_pending, reserved, ps_reuse_eager_percent(r), ps_reuse_quiet(r));
}

/* Host-waits the oldest closed epoch and releases it. True when one
 * was released, false when none is closed. */
bool ps_reuse_wait_oldest(ps_reuse_t *r);

/* Memory pressure: closes the open epoch; when no fence can be had,
 * synchronizes the device and releases the open epoch's blocks at once. */
void ps_reuse_close_or_sync(ps_reuse_t *r);

/* Everything deferred is released: close_or_sync, then host-wait every
 * closed epoch. */
void ps_reuse_flush(ps_reuse_t *r);

/* Appends one item to a list of the caller's (for ps_reuse_retire). */
int ps_reuse_list_push(ps_reuse_list_t *list, uint64_t item, uint64_t bytes);

/* Blocks of a stream being destroyed: `list` (built with
 * ps_reuse_list_push; taken over and emptied) becomes a closed epoch under
 * a fence recorded on `stream` now (PS_STREAM_NONE: every stream); without
 * a fence the device is synchronized and they are released at once. */
void ps_reuse_retire(ps_reuse_t *r, ps_reuse_list_t *list, ps_stream_t stream);

/* Test hook for invariant checks: calls visit(ctx, item) for every
 * deferred block, and returns PS_OK when the per-epoch byte counts add up
 * to bytes_pending, PS_EINVAL otherwise. */
int ps_reuse_visit(const ps_reuse_t *r, void (*visit)(void *ctx, uint64_t item), void *ctx);

/* The stream-ordered handoff (core/reuse.c, step 10): a block freed on
 * stream `from` (cudaFreeAsync) goes to an allocation on stream `to`. One
 * fence is recorded on `from` now, after the free; `to` waits for it on
 * the GPU (stream_wait_fence), or, when `to` is PS_STREAM_NONE (a
 * cudaMalloc, or memory pressure), the host waits for it (fence_wait); the
 * fence is then released. Work issued on `to` afterwards runs after every
 * piece of work issued on `from` before the handoff, so the block may be
 * handed out at once. `from` and `to` are list streams
 * (ps_reuse_list_stream: never the per-thread default stream), and
 * different ones: the caller skips its own stream. Keeps no state; the
 * counters are the caller's (either may be NULL), guarded by its lock:
 * *fences_recorded grows by one when the fence was recorded, *fence_waits
 * by one for every host wait (failed or not). Returns PS_OK: ordered;
 * PS_EBUSY: a stream capture is open that the record or the wait would
 * invalidate (`to` is being captured, or the legacy stream cannot be
 * recorded on), nothing was ordered and the block must not move (the
 * arena defers it to its reuse state, the pool and fixed_size try another
 * stream); another error: no fence, or the wait failed, nothing ordered. */
int ps_reuse_stream_handoff(const ps_gpu_ops_t *gpu, ps_stream_t from, ps_stream_t to,
                            uint64_t *fences_recorded, uint64_t *fence_waits);

/* The second half of a handoff, for a fence recorded earlier (the pool's
 * lazy stream-list fences, the arena's fenced spans and retire fences):
 * `to` waits for `fence` on the GPU, or the host waits when `to` is
 * PS_STREAM_NONE (counted in *fence_waits, which may be NULL). The fence
 * stays the caller's: it releases it once the wait succeeded, and keeps
 * it (to query, or to wait for another way) when it did not. Returns as
 * ps_reuse_stream_handoff. */
int ps_reuse_fence_handoff(const ps_gpu_ops_t *gpu, ps_fence_t *fence, ps_stream_t to,
                           uint64_t *fence_waits);

/* The stream a block allocated or freed on `stream` is ordered by in a
 * resource's free lists. The per-thread default stream (PS_STREAM_PER_THREAD:
 * cudaStreamPerThread, the _ptsz entry points) is one handle that names a
 * different stream on every thread: a list kept for that handle would hand a
 * block one thread freed to another thread's stream with nothing ordering
 * the two. Such blocks go the cudaFree way (PS_STREAM_NONE: an epoch, a
 * fence or a barrier over every stream; per-thread streams are blocking
 * streams, which the legacy stream's fence covers). The one rule for every
 * resource: the pool and the thread caches ask ps_reuse_stream_ordered,
 * fixed_size and the arena map the stream at their entry points
 * (tests/unit/test_per_thread_stream.c). */
static inline ps_stream_t ps_reuse_list_stream(ps_stream_t stream)
{
    return stream == PS_STREAM_PER_THREAD ? PS_STREAM_NONE : stream;
}

/* Whether a block allocated or freed on `stream` uses that stream's own
 * list: not PS_STREAM_NONE, not the per-thread default stream (above). */
static inline bool ps_reuse_stream_ordered(ps_stream_t stream)
{
    return ps_reuse_list_stream(stream) != PS_STREAM_NONE;
}

#endif
