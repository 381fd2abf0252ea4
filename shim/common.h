/* What every file of the shim shares: attributes, the device bound, the
 * guard against routing the shim's own calls, the process-wide state
 * (active, exiting, the configuration) and the vocabulary of calls and
 * doors. Messages (ps_error, ps_warning, ps_info, ps_debug) are
 * core/common.h's. No function of a shim file is declared here: each
 * module has its own header, and a file includes the headers of the
 * modules it may call, so its include lines show the layering.
 *
 *   hooks_runtime.c  exported cudaMalloc & co. (programs linked to libcudart.so)
 *   hooks_driver.c   cuMemAlloc_v2 & co., exported and handed out by
 *                    cuGetProcAddress (static cudart, driver-API programs)
 *   hooks_dlsym.c    dlsym override: hands out our hooks for hooked names
 *   hooks_context.c  cudaDeviceReset, cuDevicePrimaryCtxReset/Release, cuCtxDestroy...
 *   hooks_copy.c     copies and memsets, ordered across devices (copy_order.c)
 *   hook_table.c     the table of hooked names (hooks.h; lists the entry points, calls none)
 *   router.c         init, allocate/free routing, pinned memory, IPC and
 *                    pointers of ours, streams on their way to the GPU-ops table
 *   devices.c        the device table, building stacks, the current device,
 *                    context lifecycle, fork   (router.c, devices.c and oom.c
 *   oom.c            the out-of-memory retry    are the router: router.h, and
 *                                               router_internal.h between them)
 *   copy_order.c     copies of pooled mapped memory across devices (copy_order.h)
 *   registry.c       device pointer -> owner (registry.h; the record: allocation.h)
 *   ipc.c            IPC handles of pooled blocks: export table, service thread, imports
 *   gpu_ops_cuda.c   the GPU-ops table of core/ over the real driver: memory,
 *                    fences, barriers, the gate that keeps calls out of a dying context
 *   gpu_ops_cuda_streams.c  its stream tracking, capture gate, peer access
 *   gpu_ops_cuda_vm.c  its virtual-memory entries (the three: gpu_ops_cuda.h,
 *                    and gpu_ops_cuda_internal.h between them)
 *   real.c           the real CUDA functions, found without going through us (real.h)
 *   give_back.c      the give-back thread: the decay, neighbours' requests, the live page
 *   neighbours.c     asking and answering the other processes on a GPU
 *   live.c           the live page for `poolshim top`
 *   stats.c          the shim's counters and exit report; hints.c its hints
 *   nvtx.c, nvtx_ranges.c  NVTX heaps, regions and ranges (nvtx.h)
 *   test_switches.c  the POOLSHIM_TEST_* switches, read once at load
 *
 * Calls go one way:
 *
 *   hooks_*.c                                        (entry points)
 *        |    hook_table.c lists them for dlsym and cuGetProcAddress (a table, no calls)
 *        v
 *   router.c devices.c oom.c    copy_order.c         (decide)
 *        v                      (and core/'s stacks, which call the GPU-ops table)
 *   gpu_ops_cuda*.c   registry.c   ipc.c   give_back.c -> neighbours.c, live.c
 *        v                                           (do)
 *   registry.c   real.c
 *
 * A hook includes router.h, real.h, hooks.h (and copy_order.h, stats.h);
 * never another hook file, the GPU-ops table or the registry. The GPU-ops
 * files include registry.h, real.h and the leaves; ipc.c calls the GPU-ops
 * table it is given (core/gpu_ops.h); registry.c and real.c include nothing
 * of the shim but common.h. stats.c, hints.c and nvtx*.c are leaves any of
 * them may call, and call nothing: the exit report reads the device table
 * (devices.h: data, no call), and the GPU-ops table pushes its time into
 * the statistics. give_back.c and neighbours.c answer each other (the
 * give-back thread serves requests; a request gives back through it); the
 * router starts and stops the thread. Calls back up happen only through
 * CUDA (the real runtime entering our driver hooks), and ps_in_shim passes
 * them straight through.
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
