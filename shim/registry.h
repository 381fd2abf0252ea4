/* The registry (shim/registry.c): device pointer -> its allocation record
 * (a sharded hash, no global lock), and the slabs the shim took from CUDA.
 * Calls nothing of the shim. */
#ifndef PS_SHIM_REGISTRY_H
#define PS_SHIM_REGISTRY_H

#include "allocation.h"
#include "common.h"

void ps_registry_init(void);
/* Inserts (PS_ENOMEM if the table cannot grow). */
int ps_registry_insert(const ps_allocation_t *a);
/* Removes `ptr` and copies its record to *out; PS_EINVAL when absent.
 * Atomic: of two threads freeing the same pointer only one gets PS_OK. */
int ps_registry_remove(uintptr_t ptr, ps_allocation_t *out);
/* Copies the record of exactly `ptr`; PS_EINVAL when absent. */
int ps_registry_find(uintptr_t ptr, ps_allocation_t *out);
/* Finds the live allocation containing `addr` (slow: scans; rare paths only). */
int ps_registry_find_containing(uintptr_t addr, ps_allocation_t *out);
size_t ps_registry_count(void);
/* Removes every allocation of `device` (its context died with them; no
 * CUDA call). Adds how many and their bytes to *count and *bytes. */
void ps_registry_drop_device(int device, uint64_t *count, uint64_t *bytes);
/* Slabs: memory the shim took from upstream, and for which device. */
void ps_slab_add(uintptr_t base, size_t size, int device);
void ps_slab_remove(uintptr_t base);
bool ps_slab_contains(uintptr_t addr);
/* Device memory was mapped (cuMemMap) into the slab holding `addr`: marks it,
 * and sets its device's bit in ps_slab_mapped_devices() (never cleared). */
void ps_slab_mark_mapped(uintptr_t addr);
/* The device of the marked slab holding `addr`, or -1 (not ours, a chunk, a host range). */
int ps_slab_mapped_device(uintptr_t addr);
/* Bit D: some slab of device D holds mapped device memory (no lock). */
uint64_t ps_slab_mapped_devices(void);
/* Forgets every slab of `device` (its context died; no CUDA call). */
void ps_slab_drop_device(int device);
/* fork(): lock everything before, unlock in the parent, reset in the child. */
void ps_registry_atfork_prepare(void);
void ps_registry_atfork_parent(void);
void ps_registry_atfork_child(void);

#endif
