/* The coalescing pool: a general-purpose suballocator over an upstream
 * resource. core/pool.c, its front, opens with its algorithm and the map
 * of its layers, each a file with its own state (pool_caches, pool_streams,
 * pool_growth, pool_expandable, pool_lists; the decay's policy in
 * pool_decay; the checker in pool_check); this header is its contract and
 * core/pool_options.h its options.
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
#include "pool_options.h" /* ps_pool_options_t: every option and its default */


/* Fills *opts with the defaults (core/pool_options.h). */
void ps_pool_options_default(ps_pool_options_t *opts);

/* Creates a pool over `upstream`, using `gpu` for fences (gpu may be NULL
 * only when free_sync is NONE and no stream-ordered calls are made).
 * Returns PS_EINVAL for bad options, PS_ENOMEM if initial_size cannot be
 * reserved. */
int ps_pool_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                   const ps_pool_options_t *opts, ps_resource_t **out);

/* Whether the pool ended up expandable (options.expandable and the GPU
 * has virtual memory). */
bool ps_pool_is_expandable(ps_resource_t *pool);

/* Test hook: bytes held in the threads' caches (thread_cache), all
 * threads together. */
uint64_t ps_pool_thread_cache_bytes(ps_resource_t *pool);

/* Test hook: the thread caches keep cudaFree'd blocks and refill misses
 * even while one thread uses the pool (core/thread_cache.c). */
void ps_pool_thread_cache_always_engage(ps_resource_t *pool);

/* Test hook: `count` acquisitions of the pool's lock found it held, as
 * when threads meet on it (the hot paths count them in a window of 4096;
 * 1 in 16 turns cudaFree caching on, core/thread_cache.h). */
void ps_pool_note_lock_contention(ps_resource_t *pool, uint32_t count);

/* What the thread caches did so far (all zero without caches); returns
 * whether they keep cudaFree'd blocks (the lock was found contended). */
bool ps_pool_thread_cache_counters(ps_resource_t *pool, uint64_t *hits, uint64_t *misses,
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
 * nanoseconds per run or chunk (core/pool_decay.c, the early start): the tests set it;
 * 0 turns the early start off. The default is where every process starts. */
void ps_pool_decay_set_release_rate(uint64_t ns_per_run);
uint64_t ps_pool_decay_release_rate_default(void);

#endif
