/* The coalescing pool: a general-purpose suballocator over an upstream
 * resource. core/pool.c opens with its algorithm and names the files that
 * hold each of its concepts (pool_lists.c, pool_caches.c, pool_streams.c,
 * pool_growth.c, pool_expandable.c, pool_decay.c, pool_check.c;
 * core/pool_internal.h declares what they share); this header is its
 * contract.
 *
 * Guarantees:
 *  - every pointer is aligned to `alignment` (>= 256, a power of two);
 *  - allocate/free cost O(1) in the number of free blocks (TLSF: two-level
 *    segregated free lists with bitmaps); metadata lives on the host only;
 *  - blocks never merge across separate upstream chunks; an expandable
 *    pool is one growing range, so they merge across growth;
 *  - under free_sync = barrier (the default), a block freed with
 *    PS_STREAM_NONE is never handed out again until a barrier issued after
 *    its free (gpu_ops.h: all later GPU work ordered after all earlier
 *    work) or, when no barrier can be had, a fence recorded after its free
 *    has completed; under free_sync = event, only the latter; a block
 *    freed on stream s is reused at once by
 *    allocations on s, and by another stream only after that stream waits
 *    (stream_wait_fence) on a fence recorded on s after the free;
 *  - with a growth bound (pending_wait_bytes / pending_wait_percent), the
 *    pool grows while blocks wait for their fences only as long as the
 *    pending bytes stay within the bound; past it, it host-waits the oldest
 *    epoch (counted in pending_waits);
 *  - out of memory returns PS_ENOMEM with the pool unchanged, after giving
 *    wholly free chunks back to the upstream and retrying once;
 *  - with thread_cache, the same reuse rules hold for blocks parked in a
 *    thread's cache (core/thread_cache.h), and every cache is drained back
 *    into the pool before it grows, on trim and when a stream is destroyed.
 */
#ifndef PS_POOL_H
#define PS_POOL_H

#include "gpu_ops.h"
#include "resource.h"
#include "reuse.h" /* ps_free_sync_t: the reuse policy after cudaFree */

typedef struct ps_pool_options {
    size_t initial_size;  /* bytes taken from upstream at creation; 0 = none until first use */
    size_t maximum_size;  /* cap on bytes reserved from upstream; 0 = no cap */
    size_t min_chunk;     /* smallest growth step (default 8 MiB: peak reserved stays close to what programs use; see docs/benchmarks.md) */
    size_t max_chunk;     /* largest growth step unless one request needs more (default 1 GiB) */
    unsigned growth_percent; /* a growth step is this % of what is already reserved (default 12) */
    size_t alignment;     /* alignment of every pointer, power of two >= 256 (default 256) */
    ps_free_sync_t free_sync; /* policy for frees with PS_STREAM_NONE */
    uint64_t epoch_wait_ns;   /* before growing, poll a just-closed epoch this long (default 50 us,
                                 about what one upstream allocation costs) */
    int expandable;           /* 1 (default): when the GPU-ops table has virtual memory, one
                                 reserved address range mapped piece by piece as the pool grows
                                 (blocks merge across growth; free pieces can be unmapped from the
                                 middle); 0: chunks from the upstream */
    size_t expandable_reserve; /* address space reserved per range; 0 (default) = twice the device */
    size_t expandable_piece;  /* bytes per piece (default 2 MiB, rounded up to the device's
                                 granularity): the unit of addresses and accounting */
    int expandable_map_first; /* 1 (default): the range's first piece is mapped when the pool is
                                 made (the shim makes it at the context's creation), so a
                                 program's first small cudaMalloc maps nothing; best effort (a
                                 failure leaves it to the first growth); 0: the first growth */
    size_t expandable_run_min; /* a growth of at least this many bytes maps one physical run
                                 (one create, map and access call); smaller ones piece by piece.
                                 A run goes back only whole. 0 = always piece by piece */
    size_t expandable_setup_run_min; /* until the pool's first free, a growth for a request of at least
                                 this many bytes maps one run too (default 16 MiB; 0 = off): the
                                 buffers a program makes at its start (weights, peer and
                                 communication buffers) then copy at native speed; mapped apart
                                 from free blocks (pool_expandable.c) */
    unsigned barrier_pending_percent; /* free_sync barrier: an allocation issues a barrier once pending
                                 bytes exceed this % of reserved bytes (default 3; 0 = only when
                                 nothing fits). Lower: less memory, more barriers */
    size_t small_from_back;   /* requests of at most this many bytes are cut from the back of a
                                 free block, larger ones from the front (default 1 MiB; 0 = all
                                 from the front) */
    int remap;                /* expandable, free_sync barrier: before mapping new pieces, issue a
                                 barrier, synchronize the device and unmap as many whole free
                                 pieces elsewhere in the range, so mapped bytes stay the same where
                                 enough are free (default 1; 0 = off); see remap_turnover_percent */
    unsigned remap_turnover_percent; /* remap only once barriers have released this % of the
                                 reserved bytes since the last remap (default 100): each costs a
                                 device synchronize, and one per step of a loop would be too many */
    int remap_lend;           /* remap of pieces a kernel may still use: map their memory a second
                                 time where the growth needs it at once, and unmap the old
                                 addresses once the barrier that released them passed (default 1);
                                 0: wait on the host for that barrier first */
    unsigned remap_slack_percent; /* a remap that would wait on the host for the GPU grows instead
                                 while reserved bytes after the growth stay within this % above the
                                 most bytes in use seen at a growth (default 0: always wait) */
    size_t pending_wait_bytes; /* growth bound (0 with pending_wait_percent 0 = off, the default):
                                 before growing, while pending bytes exceed
                                 max(pending_wait_bytes, pending_wait_percent % of reserved),
                                 host-wait the oldest epoch instead (the pinned host pool: its
                                 blocks cannot be released by a barrier) */
    unsigned pending_wait_percent; /* see pending_wait_bytes (0 = off) */
    uint64_t release_threshold; /* when the program synchronizes the device and more than this
                                 many bytes are reserved, free memory goes back to the upstream
                                 (whole chunks; expandable: whole free pieces) until at most this
                                 many are; UINT64_MAX (default) = keep all, as before */
    int release_before_grow;  /* chunks only: before growing, give every wholly free ready chunk
                                 back to the upstream (0, the default: only under memory pressure).
                                 The pinned host pool: its chunks cannot merge, and a fresh chunk
                                 of the size now needed wastes less than keeping stranded ones */
    unsigned grow_budget_percent; /* expandable only (0 = off, the default): before growing past
                                 this % of the most bytes in use seen at a growth, host-wait pending
                                 blocks (counted in pending_waits), then unmap free pieces until the
                                 growth fits (the pinned pool's host range: holes between live
                                 blocks go back instead of stranding memory; under free_sync event
                                 without a device synchronize, as every ready block's fence has
                                 completed) */
    size_t grow_budget_min;   /* with grow_budget_percent (0 = none, the default; the pinned pool's
                                 host range: 16 MiB): the budget is at least this many bytes. While
                                 reserved + request fit in it, the pool grows instead of waiting for
                                 pending blocks (no epoch spin, no growth bound) and records a fence
                                 only when none is outstanding; at it, a free records the open
                                 batch's fence once it holds half the memory not in use: a program
                                 that frees and takes back small blocks pays one fence per several
                                 pairs instead of one per pair or two (core/pool_growth.c, step 4) */
    size_t chunk_granule;     /* chunks are multiples of this (0 = 2 MiB, cuMemAlloc's granularity;
                                 the pinned pool: 64 KiB, host pages are small) */
    size_t barrier_floor;     /* free_sync barrier (default 32 MiB; 0 = off): while reserved + a
                                 request fit in it, the pool grows instead of issuing a barrier,
                                 and near it (reserved <= 2x) the eager barrier waits until half
                                 of it is pending: a small program that frees and takes back
                                 blocks pays one barrier per many pairs instead of one per pair
                                 or two, for at most this many bytes (core/pool.c, step B) */
    size_t thread_cache;      /* bytes of freed blocks each thread may keep in its own cache in
                                 front of the pool (core/thread_cache.c; blocks up to a quarter of
                                 it); default 16 MiB; 0 = off. Used with free_sync barrier and none
                                 only (event and device bypass it; the pinned host pool is off). The cache path
                                 trusts the pointer it is given, as the shim's registry has checked it */
} ps_pool_options_t;

/* Fills *opts with the defaults above. */
void ps_pool_options_default(ps_pool_options_t *opts);

/* Creates a pool over `upstream`, using `gpu` for fences (gpu may be NULL
 * only when free_sync is NONE and no stream-ordered calls are made).
 * Returns PS_EINVAL for bad options, PS_ENOMEM if initial_size cannot be
 * reserved. */
int ps_pool_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                   const ps_pool_options_t *opts, ps_resource_t **out);

/* Whether the pool ended up expandable (options.expandable and the GPU
 * has virtual memory). */
int ps_pool_is_expandable(ps_resource_t *pool);

/* Test hook: bytes held in the threads' caches (thread_cache), all
 * threads together. */
uint64_t ps_pool_thread_cache_bytes(ps_resource_t *pool);

/* Test hook: the thread caches keep cudaFree'd blocks and refill misses
 * even while one thread uses the pool (core/thread_cache.c, step 5). */
void ps_pool_thread_cache_always_engage(ps_resource_t *pool);

/* Test hook: `count` acquisitions of the pool's lock found it held, as
 * when threads meet on it (the hot paths count them in a window of 4096;
 * 1 in 16 turns cudaFree caching on, core/thread_cache.h). */
void ps_pool_note_lock_contention(ps_resource_t *pool, uint32_t count);

/* What the thread caches did so far (all zero without caches); returns
 * whether they keep cudaFree'd blocks (the lock was found contended). */
int ps_pool_thread_cache_counters(ps_resource_t *pool, uint64_t *hits, uint64_t *misses,
                                  uint64_t *barriers_asked);

/* What the reserved bytes hold at one moment (ps_pool_layout): where the
 * overhead of reserved over in-use goes. An analysis aid (poolshim replay
 * --breakdown); it walks every block, so keep it off hot paths. */
typedef struct ps_pool_layout {
    uint64_t reserved;        /* bytes taken from the upstream (expandable: mapped) */
    uint64_t in_use;          /* used blocks (blocks in the threads' caches included) */
    uint64_t ready_free;      /* free in the ready list or parked in the quick cache */
    uint64_t largest_ready;   /* the largest run of ready free bytes */
    uint64_t pending;         /* cudaFree'd, waiting for a barrier or fence */
    uint64_t stream_free;     /* free in stream-ordered lists */
    uint64_t ready_whole_pieces; /* expandable: ready free bytes in pieces holding nothing else */
    uint64_t idle_whole_pieces;  /* expandable: bytes in pieces holding only free or pending blocks */
    uint64_t unmapped_holes;  /* expandable: unmapped bytes below a range's highest mapped piece */
    uint64_t small_in_use;    /* used blocks of at most small_from_back bytes */
} ps_pool_layout_t;

/* Fills *out for `pool`. PS_EINVAL when `pool` is not a pool. */
int ps_pool_layout(ps_resource_t *pool, ps_pool_layout_t *out);

/* Debug aid and test hook: checks every invariant of the pool's metadata
 * (free lists match blocks, neighbours linked, no two adjacent free blocks
 * of one owner, accounting sums). Returns PS_OK or PS_EINVAL and prints
 * the first violation. */
int ps_pool_check(ps_resource_t *pool);

/* Test hook (the negative control of tests/unit/test_pool_remap.c): with
 * `on`, remap treats every ready block as idle, as if it never asked
 * whether the barrier that released it has passed. Process-wide. */
void ps_pool_test_skip_idle_check(int on);
/* Test hook (the negative control of tests/gpu/remap_idle.cu, through
 * POOLSHIM_TEST_RETURN_LENT=1): with `on`, a growth that lent pieces
 * (remap_lend) unmaps their old addresses at once, under any kernel that
 * still uses them. Process-wide. */
void ps_pool_test_return_lent_at_once(int on);

/* The decay's estimate of how long giving memory back takes, in
 * nanoseconds per run or chunk (core/pool_decay.c, 8.): the tests set it;
 * 0 turns the early start off. The default is where every process starts. */
void ps_pool_decay_set_release_rate(uint64_t ns_per_run);
uint64_t ps_pool_decay_release_rate_default(void);

#endif
