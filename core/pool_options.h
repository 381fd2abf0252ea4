/* The pool's options (core/pool.h makes a pool with them): one struct that
 * every layer of the pool reads and none writes once the pool is made;
 * ps_pool_options_default (core/pool.c) fills the defaults named here. */
#ifndef PS_POOL_OPTIONS_H
#define PS_POOL_OPTIONS_H

#include "reuse.h" /* ps_free_sync_t: the reuse policy after cudaFree */

#include <stddef.h>
#include <stdint.h>

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
    size_t expandable_piece;  /* bytes per piece (default 8 MiB, rounded up to the device's
                                 granularity): the unit of addresses and accounting */
    int expandable_map_first; /* 1 (default): the range's first piece is mapped when the pool is
                                 made (the shim makes it at the context's creation), so a
                                 program's first small cudaMalloc maps nothing; best effort (a
                                 failure leaves it to the first growth); 0: the first growth */
    size_t expandable_run_min; /* a growth of at least this many bytes maps one physical run
                                 (one create, map and access call); smaller ones piece by piece.
                                 A run goes back only whole. 0 = always piece by piece */
    size_t expandable_setup_run_min; /* until the pool's first free, a growth for a request of at least
                                 this many bytes maps one run too (default 0 = off): the
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
                                 pairs instead of one per pair or two (core/pool_growth.c, the budget floor) */
    size_t chunk_granule;     /* chunks are multiples of this (0 = 2 MiB, cuMemAlloc's granularity;
                                 the pinned pool: 64 KiB, host pages are small) */
    size_t barrier_floor;     /* free_sync barrier (default 32 MiB; 0 = off): while reserved + a
                                 request fit in it, the pool grows instead of issuing a barrier,
                                 and near it (reserved <= 2x) the eager barrier waits until half
                                 of it is pending: a small program that frees and takes back
                                 blocks pays one barrier per many pairs instead of one per pair
                                 or two, for at most this many bytes (core/pool.c) */
    size_t thread_cache;      /* bytes of freed blocks each thread may keep in its own cache in
                                 front of the pool (core/thread_cache.c; blocks up to a quarter of
                                 it); default 16 MiB; 0 = off. Used with free_sync barrier and none
                                 only (event and device bypass it; the pinned host pool is off). The cache path
                                 trusts the pointer it is given, as the shim's registry has checked it */
} ps_pool_options_t;

#endif
