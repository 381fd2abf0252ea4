/* The pinned host pool's expandable range (host.expandable, on by default
 * where the driver can): a GPU-ops table whose virtual-memory entries
 * (vm_*) map page-locked HOST memory, so the pool's expandable mode
 * (core/pool_expandable.c) runs unchanged over pinned memory: one reserved address
 * range, host-located physical pieces mapped side by side as the pool
 * grows (blocks merge across pieces) and unmapped again from the middle
 * when the pool gives memory back (grow_budget_percent).
 *
 *  vm_reserve: the device table's vm_reserve (cuMemAddressReserve);
 *  vm_map:     the device table's host_vm_map: cuMemCreate (PINNED,
 *              location HOST) + cuMemMap + cuMemSetAccess for the host
 *              and every device that accepts;
 *  vm_unmap:   the device table's vm_unmap (cuMemUnmap + cuMemRelease);
 *  vm_release: the device table's vm_release (cuMemAddressFree).
 * Every other entry the pool uses (fences, stream waits, device
 * synchronize, barrier, mem_get_info) is forwarded to the device's table.
 *
 * Such a range is pinned memory as one range (tests/gpu/pinned_vmm_probe.cu
 * checks it): cudaMemcpyAsync of the whole range and of a window across a
 * piece boundary is correct and asynchronous, at cudaHostAlloc's bandwidth;
 * kernels read and write it through the same address;
 * cudaPointerGetAttributes says host memory with devicePointer ==
 * hostPointer. Pieces registered one by one (mmap + cuMemHostRegister) are
 * not: a copy spanning two registrations is cudaErrorInvalidValue
 * (tests/gpu/pinned_probe.cu).
 *
 * Return rule: PS_OK or a negative PS_E* (core/common.h).
 */
#ifndef PS_HOST_VM_H
#define PS_HOST_VM_H

#include "gpu_ops.h"

/* Whether `device` can back a host range: it offers vm_reserve,
 * vm_release, vm_unmap, host_vm_granularity and host_vm_map, and its host
 * granularity is a power of two that divides its vm_granularity (the
 * alignment vm_reserve gives). */
bool ps_host_vm_supported(const ps_gpu_ops_t *device);

/* Creates the table over `device` (PS_EUNSUPPORTED unless
 * ps_host_vm_supported). Its granularity is the device's host
 * granularity. *out is owned by the caller. */
int ps_host_vm_create(const ps_gpu_ops_t *device, ps_gpu_ops_t **out);

/* Destroys the table (after the pool over it). */
void ps_host_vm_destroy(ps_gpu_ops_t *ops);

#endif
