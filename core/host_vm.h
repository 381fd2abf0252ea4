/* The pinned host pool's expandable range (host.expandable = 1): a
 * GPU-ops table whose virtual-memory entries (vm_*) work on host memory,
 * so the pool's expandable mode (core/pool.c) runs unchanged over pinned
 * memory: one reserved host address range, pieces of it page-locked as
 * the pool grows (blocks merge across growth) and unlocked again from the
 * middle when the pool gives memory back (grow_budget_percent).
 *
 *  vm_reserve: mmap(PROT_NONE, MAP_NORESERVE) of the range (aligned to
 *              its granularity); nothing is backed;
 *  vm_map:     mmap(MAP_FIXED, read/write) of the piece, then the device
 *              table's host_register (cuMemHostRegister_v2 PORTABLE |
 *              DEVICEMAP); on failure the piece goes back to PROT_NONE;
 *  vm_unmap:   host_unregister, then mmap(MAP_FIXED, PROT_NONE) over the
 *              piece (its pages go back to the kernel);
 *  vm_release: munmap.
 * Every other entry the pool uses (fences, stream waits, device
 * synchronize, barrier, mem_get_info) is forwarded to the device's table.
 *
 * UNVERIFIED ON A GPU: whether a cudaMemcpyAsync whose host range spans
 * two separately registered pieces is a pinned DMA copy (not a staged
 * pageable copy, not an error), and whether kernels may read mapped
 * blocks across piece boundaries: tests/gpu/pinned_probe.cu checks both.
 * That is why host.expandable is off by default.
 *
 * Return rule: PS_OK or a negative PS_E* (core/common.h).
 */
#ifndef PS_HOST_VM_H
#define PS_HOST_VM_H

#include "gpu_ops.h"

/* Creates the table over `device` (which must offer host_register and
 * host_unregister: PS_EUNSUPPORTED otherwise); pieces are registered with
 * `flags` (PS_HOST_ALLOC_*); `granularity` (a multiple of the page size,
 * 0 = 64 KiB) is the smallest piece. *out is owned by the caller. */
int ps_host_vm_create(const ps_gpu_ops_t *device, unsigned flags, size_t granularity, ps_gpu_ops_t **out);

/* Destroys the table (after the pool over it). */
void ps_host_vm_destroy(ps_gpu_ops_t *ops);

#endif
