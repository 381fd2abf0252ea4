/* The GPU-ops table: the only door from core/ to CUDA.
 *
 * Every algorithm in core/ reaches the device through one of these tables,
 * one table per device. The shim fills it with the real driver functions
 * (shim/gpu_ops_cuda.c); the CPU tests and `poolshim replay --simulate` fill
 * it with host memory or simulated addresses and fake fences whose
 * completion the test controls (tools/sim/fake_gpu.c).
 *
 * A *fence* is a point in GPU time: "everything enqueued so far on these
 * streams". It is how the free policies know that a freed block can no
 * longer be touched by a running kernel:
 *   - fence_record(ctx, stream)          one stream (cudaFreeAsync model)
 *   - fence_record(ctx, PS_STREAM_NONE)  every stream that could touch
 *     memory: the legacy default stream (which orders after every blocking
 *     stream, per-thread default streams included) plus each live
 *     non-blocking stream the shim knows of. This closes a cudaFree epoch.
 * Fences are recycled by the implementation (an event pool), so recording
 * one costs a few event records, not an event creation.
 *
 * A *barrier* (barrier below) is the GPU-side answer to cudaFree's
 * contract: it orders every piece of GPU work issued after it, on every
 * stream of the device, after every piece issued before it, without the
 * host waiting (events on each non-blocking stream joined on the legacy
 * stream, one event there, every non-blocking stream waits on it; streams
 * created later wait on it too). Afterwards every block freed before it
 * may be handed out at once (docs/design.md, "Reuse after cudaFree: the
 * barrier").
 *
 * Virtual memory (vm_*): one reserved address range per expandable pool,
 * into which physical memory is mapped piece by piece (core/vm_range.c).
 *
 * Return rule: PS_OK or a negative PS_E* code (core/common.h);
 * fence_query returns PS_OK when complete, PS_ENOTREADY when not yet.
 * All functions must be callable from any thread; the implementation makes
 * the right device/context current itself.
 */
#ifndef PS_GPU_OPS_H
#define PS_GPU_OPS_H

#include "common.h"

typedef struct ps_fence ps_fence_t; /* opaque, owned by the implementation */

typedef struct ps_gpu_ops {
    void *ctx;  /* implementation state (device, CUcontext, event pool...) */
    int device; /* device ordinal this table serves, or -1 when simulated */

    /* Device memory from the real allocator (cuMemAlloc_v2 / cuMemFree_v2,
     * never the intercepted ones). mem_alloc returns PS_ENOMEM when the
     * device is out of memory. */
    int (*mem_alloc)(void *ctx, size_t size, void **out);
    int (*mem_free)(void *ctx, void *ptr, size_t size);

    /* Stream-ordered upstream (cuMemAllocAsync on the device's default
     * mempool); may be NULL when not available. */
    int (*mem_alloc_async)(void *ctx, size_t size, ps_stream_t stream, void **out);
    int (*mem_free_async)(void *ctx, void *ptr, ps_stream_t stream);

    /* Managed memory (cuMemAllocManaged); may be NULL. */
    int (*mem_alloc_managed)(void *ctx, size_t size, void **out);

    /* Free and total bytes of the device (cuMemGetInfo_v2). */
    int (*mem_get_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);

    /* Fences (see above). fence_release returns the fence to the pool. */
    int (*fence_record)(void *ctx, ps_stream_t stream, ps_fence_t **out);
    int (*fence_query)(void *ctx, ps_fence_t *fence);
    int (*fence_wait)(void *ctx, ps_fence_t *fence);
    void (*fence_release)(void *ctx, ps_fence_t *fence);

    /* Make `stream` wait (on the GPU, not the host) for `fence`. PS_EBUSY:
     * `stream` is being captured (the wait would invalidate the capture),
     * nothing changed. */
    int (*stream_wait_fence)(void *ctx, ps_stream_t stream, ps_fence_t *fence);

    /* Host wait for the whole device (cuCtxSynchronize). PS_EBUSY: not now,
     * a stream capture is open in the context (a synchronize would
     * invalidate it), nothing was waited for; callers fall back as for a
     * refused barrier. */
    int (*device_synchronize)(void *ctx);

    /* Device-wide barrier (see above); may be NULL. PS_OK: done. PS_EBUSY:
     * not possible now (a stream capture is open that a barrier would
     * join or invalidate), nothing was ordered. Other errors: a CUDA
     * error; some streams may already wait, which costs overlap, never
     * safety, and the caller treats pending blocks as still pending. */
    int (*barrier)(void *ctx);

    /* How many busy streams the newest barrier of this table joined: those
     * it made the legacy stream wait for, and busy blocking streams, which
     * its event on the legacy stream joins by itself (may be NULL: not
     * known, read as some). 0: it joined none, so it cost an event record
     * and later work's waits, and took no overlap from any stream;
     * core/reuse.c then issues its eager barriers without waiting for a
     * share of the reserve (step 6b). */
    unsigned (*barrier_joined)(void *ctx);
    /* How many barriers of this table joined no busy stream, of all it
     * issued (statistics only; may be NULL: not counted). */
    uint64_t (*barriers_quiet)(void *ctx);

    /* Barrier numbers (may be NULL, both or neither): barriers of this
     * table are numbered 1, 2, 3... in the order they were issued (every
     * pool, arena and thread on the device counts in one sequence; 0
     * names "before any barrier" and has always passed).
     * barrier_generation: the number of the newest barrier issued so far.
     * barrier_passed: PS_OK once the GPU has finished every piece of work
     *   issued before barrier `generation` (its event E completed), so
     *   memory that nothing touched after that barrier is idle;
     *   PS_ENOTREADY when not yet. Non-blocking. Only the newest
     *   PS_BARRIER_RING barriers are asked individually: an older one has
     *   passed once the oldest remembered one has (E events complete in
     *   issue order, all on the legacy stream). Other errors: unknown,
     *   treat as not passed. A dead context has no work: passed.
     * barrier_wait (may be NULL): blocks the calling thread until barrier
     *   `generation` has passed (a host wait on its E, or on the oldest
     *   remembered E for an older one: never too early); PS_OK then. Work
     *   issued after that barrier goes on running, unlike a device
     *   synchronize. Any error: not known to have passed. */
    uint64_t (*barrier_generation)(void *ctx);
    int (*barrier_passed)(void *ctx, uint64_t generation);
    int (*barrier_wait)(void *ctx, uint64_t generation);

    /* Virtual memory; all NULL when the device cannot (no VMM support).
     * vm_granularity: the smallest piece that can be mapped (bytes).
     * vm_reserve: reserve `size` bytes of address space (nothing mapped).
     * vm_release: give a reserved range back (everything unmapped first).
     * vm_map: create `size` bytes of physical memory, map it at `addr`
     *   (inside a reserved range, a multiple of the granularity) and make
     *   it readable and writable by the device; *handle names it for
     *   vm_unmap. PS_ENOMEM when the device is full; nothing is left
     *   mapped on error.
     * vm_unmap: unmap `size` bytes at `addr` mapped by one vm_map call and
     *   free its physical memory. Unmapping does NOT wait for kernels that
     *   may still touch the range (measured by PyTorch's expandable
     *   segments too): the caller synchronizes the device first. */
    size_t (*vm_granularity)(void *ctx);
    int (*vm_reserve)(void *ctx, size_t size, void **out);
    void (*vm_release)(void *ctx, void *addr, size_t size);
    int (*vm_map)(void *ctx, void *addr, size_t size, uint64_t *handle);
    int (*vm_unmap)(void *ctx, void *addr, size_t size, uint64_t handle);
    /* Moving physical memory (the pool's remap); all three NULL when not
     * offered, and then vm_unmap + vm_map do the same, paying a release
     * and a create per piece moved.
     * vm_unmap_keep: as vm_unmap, but the physical memory stays allocated
     *   and `handle` stays valid for vm_map_handle or vm_drop.
     * vm_map_handle: maps such a kept handle at `addr` (as vm_map: inside a
     *   reserved range, access for the device and its peers). On error the
     *   handle stays kept.
     * vm_drop: frees a kept handle's physical memory. */
    int (*vm_unmap_keep)(void *ctx, void *addr, size_t size, uint64_t handle);
    int (*vm_map_handle)(void *ctx, void *addr, size_t size, uint64_t handle);
    void (*vm_drop)(void *ctx, uint64_t handle);
    /* Access for many mappings at once; all three NULL when not offered
     * (then vm_map and vm_map_handle give access one mapping at a time).
     * An access call has a fixed cost per call, larger than a create or a
     * map, and a cost per mapping it covers (tests/gpu/vmm_cost_probe.cu,
     * tests/gpu/vmm_alias_probe.cu; docs/benchmarks.md), so a growth of
     * many pieces maps them bare and gives access once: the fixed part is
     * paid once.
     * vm_map_bare, vm_map_handle_bare: as vm_map / vm_map_handle, but the
     *   memory is not accessible until vm_access covers it.
     * vm_access: makes [addr, addr + size) readable and writable by the
     *   device and the peers vm_map would name; the span may cover several
     *   mappings, all made already (PS_EINVAL otherwise). On error nothing
     *   is unmapped: the caller unmaps what it mapped bare. */
    int (*vm_map_bare)(void *ctx, void *addr, size_t size, uint64_t *handle);
    int (*vm_map_handle_bare)(void *ctx, void *addr, size_t size, uint64_t handle);
    int (*vm_access)(void *ctx, void *addr, size_t size);

    /* Sharing mapped memory with another process (shim/ipc.c); all NULL
     * when the device cannot (no virtual memory, no POSIX file descriptor
     * handles, or global.ipc = off). Memory vm_map creates is then
     * exportable.
     * ipc_export: the piece mapped by one vm_map call that contains
     *   `addr`: *start and *size; with `fd` non-NULL also a new file
     *   descriptor for its physical memory (the caller closes it).
     *   PS_EINVAL when `addr` is in no piece this table mapped.
     * ipc_reserve / ipc_release: address space for imported pieces, like
     *   vm_reserve / vm_release but not memory of this table's pools.
     * ipc_map: imports `fd` (physical memory of `size` bytes exported by
     *   another process's ipc_export; the fd stays the caller's), maps it
     *   at `addr` inside an ipc_reserve'd range and makes it readable and
     *   writable by the device; *handle names it for ipc_unmap. Nothing is
     *   left mapped or imported on error.
     * ipc_unmap: unmaps `size` bytes at `addr` and releases the import
     *   (the physical memory lives on while the exporter holds it). */
    int (*ipc_export)(void *ctx, uintptr_t addr, uintptr_t *start, size_t *size, int *fd);
    int (*ipc_reserve)(void *ctx, size_t size, void **out);
    void (*ipc_release)(void *ctx, void *addr, size_t size);
    int (*ipc_map)(void *ctx, void *addr, size_t size, int fd, uint64_t *handle);
    int (*ipc_unmap)(void *ctx, void *addr, size_t size, uint64_t handle);

    /* Page-locked host memory (the pinned host pool's upstream); NULL when
     * not available. host_alloc: cuMemHostAlloc (the real one) in this
     * table's context, `flags` are CU_MEMHOSTALLOC_* (PS_HOST_ALLOC_*
     * below, the same values as cudaHostAlloc's); PS_ENOMEM when it
     * cannot. host_free: cuMemFreeHost (which synchronizes the device). */
    int (*host_alloc)(void *ctx, size_t size, unsigned flags, void **out);
    int (*host_free)(void *ctx, void *ptr, size_t size);
    /* Page-locked host memory through the virtual memory API (the pinned
     * pool's expandable range, core/host_vm.c); both NULL when not
     * available (no virtual memory, or the driver cannot place physical
     * memory on the host). The range is reserved with vm_reserve and the
     * pieces are unmapped with vm_unmap, as device pieces are.
     * host_vm_granularity: the smallest host piece (bytes; a power of
     *   two; vm_reserve aligns ranges to vm_granularity only, so a caller
     *   needing more alignment checks).
     * host_vm_map: create `size` bytes of page-locked host memory
     *   (cuMemCreate, PINNED, location HOST), map it at `addr` (inside a
     *   vm_reserve'd range, a multiple of host_vm_granularity) and make it
     *   readable and writable by the host and by every device that accepts
     *   (cuMemSetAccess); *handle names it for vm_unmap. The host address
     *   is also the device address. PS_ENOMEM when the host cannot; nothing
     *   is left mapped or created on error. */
    size_t (*host_vm_granularity)(void *ctx);
    int (*host_vm_map)(void *ctx, void *addr, size_t size, uint64_t *handle);

    /* Debug (guard mode, core/guard.c); NULL when not available.
     * memset_d8: fill `bytes` device bytes at `ptr` with `value`
     *   (cuMemsetD8Async). stream PS_STREAM_NONE: on the legacy stream,
     *   and the host waits for it (cuStreamSynchronize); a stream: in that
     *   stream's order, no host wait.
     * copy_to_host: copy `bytes` device bytes at `src` to host `dst` after
     *   every earlier kernel that could write them has finished: stream
     *   PS_STREAM_NONE synchronizes the device (cuCtxSynchronize), a
     *   stream synchronizes that stream (cuStreamSynchronize); then
     *   cuMemcpyDtoH. */
    int (*memset_d8)(void *ctx, void *ptr, uint8_t value, size_t bytes, ps_stream_t stream);
    int (*copy_to_host)(void *ctx, void *dst, const void *src, size_t bytes, ps_stream_t stream);
} ps_gpu_ops_t;

/* How many of the newest barriers barrier_passed tells apart. */
#define PS_BARRIER_RING 8

/* The barrier whose event answers for barrier `generation` (<= `newest`,
 * the newest issued): itself while the ring remembers it, else the oldest
 * one the ring remembers, which passes later (barriers complete in issue
 * order): an answer late, never early. The real table and the fake both
 * ask it. */
static inline uint64_t ps_barrier_remembered(uint64_t newest, uint64_t generation)
{
    return newest - generation >= PS_BARRIER_RING ? newest - PS_BARRIER_RING + 1 : generation;
}

/* host_alloc flags: CU_MEMHOSTALLOC_PORTABLE, _DEVICEMAP, _WRITECOMBINED
 * (= cudaHostAllocPortable, cudaHostAllocMapped, cudaHostAllocWriteCombined). */
#define PS_HOST_ALLOC_PORTABLE 0x1u
#define PS_HOST_ALLOC_MAPPED 0x2u
#define PS_HOST_ALLOC_WRITE_COMBINED 0x4u

#endif
