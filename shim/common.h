/* What every file of the shim shares: attributes, the device bound, the
 * guard against routing the shim's own calls, the process's state
 * (process.h) and the vocabulary of calls and doors. Messages are
 * core/common.h's. Each module has its own header; a file includes the
 * headers of the modules it may call, so its include lines show the
 * layering. Calls go one way, down this list:
 *
 *   hooks_*.c        entry points: runtime (cudaMalloc & co.), driver
 *                    (cuMemAlloc_v2 & co., cuGetProcAddress), dlsym, context
 *                    lifecycle, copies, the torch door; hook_table.c lists
 *                    them for dlsym and cuGetProcAddress (a table, no calls)
 *   router.c, oom.c  init; allocate/free routing, pinned memory, IPC and
 *                    pointers of ours, streams; the out-of-memory retry
 *   copy_order.c     copies of pooled mapped memory across devices
 *   lifecycle.c      building a device's stack, the current device, context
 *                    death (one sequence), fork, exit_begins
 *   give_back.c      the give-back thread: decay ticks, neighbours' requests
 *   live.c           the live page for `poolshim top`, published by that thread
 *   neighbours.c     asking and answering the other processes on a GPU
 *   give.c           giving a device's free memory back now
 *   ipc.c            IPC handles of pooled blocks: export table, service, imports
 *   gpu_ops_cuda*.c  the GPU-ops table of core/ over the real driver: memory,
 *                    fences, barriers, the gate; streams and captures
 *                    (_streams.c); virtual memory and peers (_vm.c)
 *   stats.c, hints.c the counters and exit report; the hints after it
 *   nvtx*.c          NVTX heaps, regions and ranges
 *   registry.c       device pointer -> owner, slabs
 *   devices.c        the device table and the devices lock (data, no calls)
 *   process.c        the process's state: active, exiting, the configuration
 *   real.c           the real CUDA functions, found without going through us
 *
 * Calls back up happen only through CUDA (the real runtime entering our
 * driver hooks), and ps_in_shim passes them straight through; what a
 * module above keeps per device it forgets through a function it gives the
 * lifecycle (ps_lifecycle_on_drop).
 */
#ifndef PS_SHIM_COMMON_H
#define PS_SHIM_COMMON_H

#include <stdatomic.h>
#include <stdbool.h>

#include "../config/config.h"
#include "../core/common.h"
#include "../core/gpu_ops.h"
#include "../core/resource.h"
#include "cuda_abi.h"

#define PS_EXPORT __attribute__((visibility("default")))
#define PS_TLS __thread __attribute__((tls_model("initial-exec")))
#define PS_LIKELY(x) __builtin_expect(!!(x), 1)
#define PS_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* A rare path kept out of a hot function, so that it saves fewer registers. */
#define PS_COLD __attribute__((noinline, cold))

#define PS_MAX_DEVICES 64

/* ---- the guard (real.c): calls made by the shim are never routed again ---- */
/* Nonzero while this thread runs inside the shim (a real runtime call made
 * by the shim re-enters our driver hooks: they must pass straight through). */
extern PS_TLS int ps_in_shim;

/* ---- the process (router.c's init keeps them) ---- */
enum { PS_DOOR_RUNTIME = 0, PS_DOOR_DRIVER = 1 };
enum {
    PS_CALL_CUDA_MALLOC, PS_CALL_CUDA_FREE, PS_CALL_CUDA_MALLOC_ASYNC, PS_CALL_CUDA_FREE_ASYNC,
    PS_CALL_CU_MEM_ALLOC, PS_CALL_CU_MEM_FREE, PS_CALL_CU_MEM_ALLOC_ASYNC, PS_CALL_CU_MEM_FREE_ASYNC,
    /* pinned host memory (the host pool); cudaMallocHost counts as cudaHostAlloc,
     * cuMemAllocHost as cuMemHostAlloc */
    PS_CALL_CUDA_HOST_ALLOC, PS_CALL_CUDA_FREE_HOST, PS_CALL_CU_MEM_HOST_ALLOC, PS_CALL_CU_MEM_FREE_HOST,
    PS_CALL_COUNT
};

#include "process.h" /* the process's state: active, exiting, the configuration */

#endif
