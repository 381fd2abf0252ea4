/* A GPU-ops table with no GPU: the CPU tests' device and the simulated
 * device of `poolshim replay --simulate`.
 *
 * Memory: with `backed` the upstream returns real host memory (tests may
 * write to it); without, it hands out addresses from a simulated address
 * space (nothing is mapped, so a simulated 80 GiB device costs nothing).
 * Either way `capacity` bounds the bytes outstanding, like a device.
 *
 * Fences are fake: each records a sequence number; a fence completes when
 * the test says so (ps_fake_gpu_complete_*), or at once in auto-complete
 * mode, or, with a GPU lag, once a simulated clock has passed the fence's
 * recording time plus the lag (a GPU that runs `lag_ns` behind the host).
 * stream_wait_fence is recorded so tests can assert it happened.
 * Thread-safe.
 */
#ifndef PS_FAKE_GPU_H
#define PS_FAKE_GPU_H

#include "../../core/gpu_ops.h"

typedef struct ps_fake_gpu_options {
    size_t capacity;           /* device size in bytes (0 = unlimited) */
    int backed;                /* 1: real host memory, 0: simulated addresses */
    size_t upstream_alignment; /* alignment of upstream blocks (default 2 MiB, like cuMemAlloc for big blocks) */
    int auto_complete;         /* 1: fences complete as soon as they are recorded */
    int virtual_memory;        /* 1: offer the vm_* entries (an expandable pool can be built) */
    int no_vm_keep;            /* 1: without vm_unmap_keep / vm_map_handle / vm_drop (remap releases and creates) */
    int no_vm_access;          /* 1: without vm_map_bare / vm_map_handle_bare / vm_access (access one
                                  mapping at a time, in vm_map) */
    int no_vm_alias;           /* 1: vm_map_handle refuses (PS_EUPSTREAM) a handle mapped elsewhere: a driver
                                  that will not map memory twice */
    size_t vm_granularity;     /* their granularity (default 2 MiB, like an H100) */
    int no_host_vm;            /* 1 (with virtual_memory): without host_vm_granularity / host_vm_map
                                  (a driver that cannot place memory on the host) */
    size_t host_vm_granularity; /* host_vm_map's granularity (default: vm_granularity) */
    uint64_t lag_ns;           /* > 0: a fence completes lag_ns of simulated clock after it was
                                  recorded (ps_fake_gpu_set_clock); overrides auto_complete */
    int waits_move_clock;      /* 1 (with a lag or a GPU queue): fence_wait and device_synchronize
                                  move the simulated clock to when the GPU gets there, so a model
                                  sees what a host wait costs (ps_fake_gpu_clock) */
    uint64_t pin_ns;           /* with waits_move_clock: host_alloc and host_vm_map move the clock
                                  by pin_ns + pin_ns_per_mib per MiB (pinning pages costs time;
                                  cuMemHostAlloc on an H100: ~0.6 ms + 0.6 ms per MiB) */
    uint64_t pin_ns_per_mib;   /* see pin_ns */
    int unpin_synchronizes;    /* with waits_move_clock: host_free and a host piece's vm_unmap first wait
                                  for the GPU to be idle (cuMemFreeHost synchronizes the device) */
    int shareable;             /* 1 (with backed and virtual_memory): each vm_map piece is a memfd,
                                  and the ipc_* entries are offered: export gives a dup of it, and
                                  a table (of this or another process) maps it again */
    uint64_t event_latency_ns; /* > 0: a real-time event model (timing a pool's fence costs on the CPU):
                                  a fence completes once ps_now_ns() passes its recording time +
                                  this (an idle GPU's event latency); fence_wait spins until then.
                                  Not with lag_ns or auto_complete */
    uint64_t event_record_ns;  /* with event_latency_ns: fence_record spins this long (cudaEventRecord
                                  on an H100: ~550 ns) */
    uint64_t event_query_ns;   /* with event_latency_ns: fence_query spins this long (~300 ns) */
    unsigned barrier_joins;    /* what barrier_joined answers (busy streams the newest barrier joined; 0:
                                  a program on the legacy stream alone); ps_fake_gpu_set_barrier_joins */
} ps_fake_gpu_options_t;

/* Creates the table; *out is owned by the caller (ps_fake_gpu_destroy). */
int ps_fake_gpu_create(const ps_fake_gpu_options_t *opts, ps_gpu_ops_t **out);
void ps_fake_gpu_destroy(ps_gpu_ops_t *ops);

/* Fence control. Fences are numbered 1, 2, 3... in recording order. */
void ps_fake_gpu_complete_upto(ps_gpu_ops_t *ops, uint64_t seq); /* fences 1..seq are done */
void ps_fake_gpu_complete_all(ps_gpu_ops_t *ops);
void ps_fake_gpu_set_auto_complete(ps_gpu_ops_t *ops, int on);
/* The simulated clock (ns; starts at 0), used when options.lag_ns > 0: a
 * fence records the clock when it is recorded and is complete once the
 * clock reaches that time + lag_ns (fence_wait, device_synchronize and
 * ps_fake_gpu_complete_* complete fences as before, without moving the
 * clock). The clock never goes back: an earlier `now_ns` is ignored. */
void ps_fake_gpu_set_clock(ps_gpu_ops_t *ops, uint64_t now_ns);
/* Queue mode, for models of a pipeline: the GPU finishes the work queued
 * so far at `busy_until_ns` (the model moves it as it queues work). A
 * fence recorded from now on completes once the clock reaches
 * max(its recording time + lag_ns, busy_until_ns), like a CUDA event
 * recorded behind all queued work. */
void ps_fake_gpu_set_gpu_busy_until(ps_gpu_ops_t *ops, uint64_t busy_until_ns);
/* The judge of the pinned pool's reuse rule: take a mark when a block is
 * freed; passed_since says whether the table has since told its user that
 * the GPU passed a fence recorded after the mark (fence_query answered
 * done, or fence_wait returned, for a fence numbered above mark.fences;
 * test-completed fences count only once the user asked) or synchronized the
 * device. Barriers never count: the host writes a reused pinned block. */
typedef struct ps_fake_gpu_mark {
    uint64_t fences; /* fences recorded at the mark */
    uint64_t syncs;  /* device synchronizes at the mark */
} ps_fake_gpu_mark_t;
ps_fake_gpu_mark_t ps_fake_gpu_mark(ps_gpu_ops_t *ops);
int ps_fake_gpu_passed_since(ps_gpu_ops_t *ops, ps_fake_gpu_mark_t mark);
/* Fences recorded on `stream` (PS_STREAM_NONE counts the all-streams
 * fences), and stream_wait_fence calls that made `stream` wait. */
uint64_t ps_fake_gpu_fences_on_stream(ps_gpu_ops_t *ops, ps_stream_t stream);
uint64_t ps_fake_gpu_waits_on_stream(ps_gpu_ops_t *ops, ps_stream_t stream);

/* Barriers: while blocked, barrier returns PS_EBUSY (as when a stream
 * capture is open). A barrier completes no fence: the
 * fake GPU keeps lagging, which is the point. */
void ps_fake_gpu_block_barriers(ps_gpu_ops_t *ops, int blocked);
/* What barrier_joined answers from now on: the busy streams the newest
 * barrier joined (0 by default, as a program on the legacy stream alone). */
void ps_fake_gpu_set_barrier_joins(ps_gpu_ops_t *ops, unsigned joins);
/* Barriers are numbered 1, 2, 3... (ps_fake_gpu_barriers is the newest)
 * and pass (barrier_passed) in auto-complete mode at once, with a lag once
 * the clock reaches their issue time + lag, and always after
 * device_synchronize or ps_fake_gpu_complete_all. complete_barriers_upto:
 * barriers 1..generation have passed. assume_barriers_passed (a test hook,
 * the fake's POOLSHIM_TEST_ASSUME_IDLE): barrier_passed answers passed for
 * every barrier, whether the GPU got there or not. */
void ps_fake_gpu_complete_barriers_upto(ps_gpu_ops_t *ops, uint64_t generation);
void ps_fake_gpu_assume_barriers_passed(ps_gpu_ops_t *ops, int on);

/* A precise judge of unsafe unmaps, for tests that know when blocks were
 * freed: `size` bytes at `ptr` were freed by the program now (after the
 * GPU work that used them was issued). Once a device has noted a free, an
 * unmap counts as unsafe only when a granule in it was noted freed and no
 * fence or barrier recorded after that free has truly completed (by the
 * completed marks, a device synchronize or the clock; never by
 * ps_fake_gpu_assume_barriers_passed). Without notes an unmap counts as
 * unsafe while any fence is incomplete. PS_ENOMEM: not noted. */
int ps_fake_gpu_note_free(ps_gpu_ops_t *ops, const void *ptr, size_t size);

/* Injected failures (vm_map counts as an allocation: it uses the device's
 * capacity and the same failure plan). The next mem_alloc calls fail with PS_ENOMEM: fail_after = how many succeed first,
 * fail_count = how many then fail (0 = stop injecting). */
void ps_fake_gpu_inject_failure(ps_gpu_ops_t *ops, uint64_t fail_after, uint64_t fail_count);

/* ---- Fault plan: fail the Nth call of one entry, or of any entry ----
 *
 * Every entry of the table that can fail is counted (calls that fail
 * included, from ps_fake_gpu_create on) and can be made to fail:
 *   ps_fake_gpu_fail_call(ops, PS_FAKE_OP_FENCE_QUERY, 3, 0)
 *       the 3rd fence_query call since create fails;
 *   ps_fake_gpu_fail_call(ops, PS_FAKE_OP_ANY, 40, 0)
 *       the 40th call of any counted entry fails, whichever it is.
 * `nth` counts from create (1 = the first call), as ps_fake_gpu_calls
 * reports, so "count the calls of a clean run, then fail each one in
 * turn" is one counter. `status` is the error returned (a negative PS_E*),
 * or 0 for the entry's natural one: PS_ENOMEM for the allocating entries
 * (mem_alloc*, vm_reserve, vm_map, host_vm_map), PS_EUPSTREAM for the others (fence_query
 * answers it, never PS_ENOTREADY; give PS_EBUSY for a barrier that cannot
 * be issued). A failing call does nothing else: no memory is taken or
 * given back, no fence is recorded or completed, nothing is mapped or
 * unmapped, no barrier is counted. Up to PS_FAKE_FAULTS_MAX entries at
 * once; each fires once. The plan is independent of
 * ps_fake_gpu_inject_failure (both may fail a mem_alloc). */
typedef enum ps_fake_op {
    PS_FAKE_OP_MEM_ALLOC,          /* mem_alloc */
    PS_FAKE_OP_MEM_FREE,           /* mem_free */
    PS_FAKE_OP_MEM_ALLOC_ASYNC,    /* mem_alloc_async */
    PS_FAKE_OP_MEM_FREE_ASYNC,     /* mem_free_async */
    PS_FAKE_OP_MEM_ALLOC_MANAGED,  /* mem_alloc_managed */
    PS_FAKE_OP_MEM_GET_INFO,       /* mem_get_info */
    PS_FAKE_OP_FENCE_RECORD,       /* fence_record */
    PS_FAKE_OP_FENCE_QUERY,        /* fence_query */
    PS_FAKE_OP_FENCE_WAIT,         /* fence_wait */
    PS_FAKE_OP_STREAM_WAIT_FENCE,  /* stream_wait_fence */
    PS_FAKE_OP_DEVICE_SYNCHRONIZE, /* device_synchronize */
    PS_FAKE_OP_BARRIER,            /* barrier */
    PS_FAKE_OP_VM_RESERVE,         /* vm_reserve */
    PS_FAKE_OP_VM_MAP,             /* vm_map (also vm_map_handle and vm_access) */
    PS_FAKE_OP_VM_UNMAP,           /* vm_unmap (also vm_unmap_keep) */
    PS_FAKE_OP_HOST_ALLOC,         /* host_alloc (pinned host memory) */
    PS_FAKE_OP_MEMSET_D8,          /* memset_d8 (guard mode) */
    PS_FAKE_OP_COPY_TO_HOST,       /* copy_to_host (guard mode) */
    PS_FAKE_OP_IPC_EXPORT,         /* ipc_export (ipc_reserve counts as vm_reserve) */
    PS_FAKE_OP_IPC_MAP,            /* ipc_map */
    PS_FAKE_OP_HOST_VM_MAP,        /* host_vm_map (pinned host pieces; fails with PS_ENOMEM) */
    PS_FAKE_OP_BARRIER_PASSED,     /* barrier_passed (fails with PS_EUPSTREAM: "unknown") */
    PS_FAKE_OP_BARRIER_WAIT,       /* barrier_wait (fails with PS_EUPSTREAM) */
    PS_FAKE_OP_COUNT,              /* number of counted entries */
    PS_FAKE_OP_ANY = PS_FAKE_OP_COUNT /* every counted entry together */
} ps_fake_op_t;
#define PS_FAKE_FAULTS_MAX 8 /* plan entries pending at once */

/* The entry's name as in the table ("fence_query"; "any"). */
const char *ps_fake_gpu_op_name(ps_fake_op_t op);
/* Calls of `op` since create, failed ones included (PS_FAKE_OP_ANY: of all). */
uint64_t ps_fake_gpu_calls(ps_gpu_ops_t *ops, ps_fake_op_t op);
/* Adds "call number `nth` of `op` fails with `status`" (0: the natural
 * error) to the plan. PS_OK; PS_EINVAL for a bad op, nth 0 or a status
 * that is not an error; PS_ENOMEM when PS_FAKE_FAULTS_MAX are pending. */
int ps_fake_gpu_fail_call(ps_gpu_ops_t *ops, ps_fake_op_t op, uint64_t nth, int status);
/* Forgets the pending plan entries (not the counters). */
void ps_fake_gpu_clear_faults(ps_gpu_ops_t *ops);
/* How many calls the plan failed so far; *op and *call (may be NULL) get
 * the last one's entry and its number among that entry's calls. */
uint64_t ps_fake_gpu_faults_fired(ps_gpu_ops_t *ops, ps_fake_op_t *op, uint64_t *call);

/* ---- Counters: uint64_t ps_fake_gpu_NAME(ops), read under the lock ----
 * X(NAME, FIELD): the reader and the device's field it reads. */
#define PS_FAKE_GPU_COUNTERS(X)                                                                                  \
    X(fences_recorded, fences_recorded)     /* fences recorded so far (the newest one's number) */               \
    X(stream_waits, stream_waits)           /* stream_wait_fence calls */                                        \
    X(fence_waits, fence_waits)             /* host fence_wait calls that waited */                              \
    X(device_syncs, device_syncs)           /* device_synchronize calls */                                       \
    X(barriers, barriers)                   /* barriers issued (the newest one's number) */                      \
    X(barrier_waits, barrier_waits)         /* barrier_wait calls that waited */                                 \
    X(vm_maps, vm_maps)                     /* vm_map (and vm_map_handle, host_vm_map) calls that succeeded */   \
    X(vm_unmaps, vm_unmaps)                 /* vm_unmap and vm_unmap_keep calls that succeeded */                \
    X(unsafe_unmaps, unsafe_unmaps)         /* unmaps the GPU might still touch (see note_free): must be 0 */    \
    X(vm_maps_kept, vm_maps_kept)           /* vm_map_handle calls that mapped kept memory again */              \
    X(vm_kept_now, vm_kept.count)           /* handles unmapped and kept now (neither mapped nor dropped) */     \
    X(vm_aliases, vm_aliases)               /* vm_map_handle of memory still mapped elsewhere (lending) */       \
    X(vm_bare_bytes, vm_bare_bytes)         /* bytes mapped bare, not yet accessible: 0 between calls */         \
    X(vm_access_calls, vm_access_calls)     /* vm_access calls that succeeded */                                 \
    X(host_vm_maps, host_vm_maps)           /* host_vm_map calls that succeeded */                               \
    X(host_vm_unmaps, host_vm_unmaps)       /* vm_unmap calls that unmapped a host_vm_map piece */               \
    X(ipc_mapped, ipc_mapped.count)         /* pieces ipc_map mapped and ipc_unmap did not yet unmap */          \
    X(bytes_outstanding, bytes_outstanding) /* bytes taken from the capacity now */                              \
    X(upstream_allocs, upstream_allocs)     /* allocations that succeeded (mem_alloc* and host_alloc) */         \
    X(clock, clock_ns)                      /* the simulated clock (moves alone only with waits_move_clock) */   \
    X(barrier_wait_ns, barrier_wait_ns)     /* timed: simulated host time spent in barrier_wait */               \
    X(wait_instead_sync_ns, wait_instead_sync_ns) /* timed: what a device synchronize at each would spend */     \
    X(device_sync_ns, device_sync_ns)       /* timed: spent in device_synchronize (GPU done - clock) */          \
    X(live_fences, faults.live_fences)      /* fences recorded and not yet released */                           \
    X(live_vm_ranges, faults.live_vm_ranges) /* ranges reserved (vm_reserve) and not yet released */

#define PS_FAKE_GPU_COUNTER_READER(name, field) uint64_t ps_fake_gpu_##name(ps_gpu_ops_t *ops);
PS_FAKE_GPU_COUNTERS(PS_FAKE_GPU_COUNTER_READER)
#undef PS_FAKE_GPU_COUNTER_READER

#endif
