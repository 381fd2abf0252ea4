/* A GPU-ops table with no GPU: the CPU tests' device and the simulated
 * device of `poolshim replay --simulate`.
 *
 * Memory: with `backed` the upstream returns real host memory (tests may
 * write to it); without, it hands out addresses from a simulated address
 * space (nothing is mapped, so a simulated 80 GiB device costs nothing).
 * Either way `capacity` bounds the bytes outstanding, like a device.
 *
 * Fences are fake: each records a sequence number; a fence completes when
 * the test says so (ps_host_ops_complete_*), or at once in auto-complete
 * mode, or, with a GPU lag, once a simulated clock has passed the fence's
 * recording time plus the lag (a GPU that runs `lag_ns` behind the host).
 * stream_wait_fence is recorded so tests can assert it happened.
 * Thread-safe.
 */
#ifndef PS_HOST_OPS_H
#define PS_HOST_OPS_H

#include "gpu_ops.h"

typedef struct ps_host_ops_options {
    size_t capacity;           /* device size in bytes (0 = unlimited) */
    int backed;                /* 1: real host memory, 0: simulated addresses */
    size_t upstream_alignment; /* alignment of upstream blocks (default 2 MiB, like cuMemAlloc for big blocks) */
    int auto_complete;         /* 1: fences complete as soon as they are recorded */
    int virtual_memory;        /* 1: offer the vm_* entries (an expandable pool can be built) */
    size_t vm_granularity;     /* their granularity (default 2 MiB, like an H100) */
    uint64_t lag_ns;           /* > 0: a fence completes lag_ns of simulated clock after it was
                                  recorded (ps_host_ops_set_clock); overrides auto_complete */
} ps_host_ops_options_t;

/* Creates the table; *out is owned by the caller (ps_host_ops_destroy). */
int ps_host_ops_create(const ps_host_ops_options_t *opts, ps_gpu_ops_t **out);
void ps_host_ops_destroy(ps_gpu_ops_t *ops);

/* Fence control. Fences are numbered 1, 2, 3... in recording order. */
uint64_t ps_host_ops_fences_recorded(ps_gpu_ops_t *ops);        /* how many so far */
void ps_host_ops_complete_upto(ps_gpu_ops_t *ops, uint64_t seq); /* fences 1..seq are done */
void ps_host_ops_complete_all(ps_gpu_ops_t *ops);
void ps_host_ops_set_auto_complete(ps_gpu_ops_t *ops, int on);
/* The simulated clock (ns; starts at 0), used when options.lag_ns > 0: a
 * fence records the clock when it is recorded and is complete once the
 * clock reaches that time + lag_ns (fence_wait, device_synchronize and
 * ps_host_ops_complete_* complete fences as before, without moving the
 * clock). The clock never goes back: an earlier `now_ns` is ignored. */
void ps_host_ops_set_clock(ps_gpu_ops_t *ops, uint64_t now_ns);
uint64_t ps_host_ops_stream_waits(ps_gpu_ops_t *ops);            /* stream_wait_fence calls */
uint64_t ps_host_ops_fence_waits(ps_gpu_ops_t *ops);             /* host fence_wait calls */
uint64_t ps_host_ops_device_syncs(ps_gpu_ops_t *ops);            /* device_synchronize calls */
/* Fences recorded on `stream` (PS_STREAM_NONE counts the all-streams
 * fences), and stream_wait_fence calls that made `stream` wait. */
uint64_t ps_host_ops_fences_on_stream(ps_gpu_ops_t *ops, ps_stream_t stream);
uint64_t ps_host_ops_waits_on_stream(ps_gpu_ops_t *ops, ps_stream_t stream);

/* Barriers: how many were issued; while blocked, barrier returns PS_EBUSY
 * (as when a stream capture is open). A barrier completes no fence: the
 * fake GPU keeps lagging, which is the point. */
uint64_t ps_host_ops_barriers(ps_gpu_ops_t *ops);
void ps_host_ops_block_barriers(ps_gpu_ops_t *ops, int blocked);

/* Virtual memory: calls, and unmaps made while some fence was still
 * incomplete (the GPU might still touch the range: must stay 0). */
uint64_t ps_host_ops_vm_maps(ps_gpu_ops_t *ops);
uint64_t ps_host_ops_vm_unmaps(ps_gpu_ops_t *ops);
uint64_t ps_host_ops_unsafe_unmaps(ps_gpu_ops_t *ops);

/* Upstream accounting and fault injection (vm_map counts as an allocation:
 * it uses the device's capacity and the same failure plan). */
uint64_t ps_host_ops_bytes_outstanding(ps_gpu_ops_t *ops);
uint64_t ps_host_ops_upstream_allocs(ps_gpu_ops_t *ops);  /* successful mem_alloc calls */
/* The next mem_alloc calls fail with PS_ENOMEM: fail_after = how many succeed first,
 * fail_count = how many then fail (0 = stop injecting). */
void ps_host_ops_inject_failure(ps_gpu_ops_t *ops, uint64_t fail_after, uint64_t fail_count);

#endif
