/* A reserved range of device address space into which physical memory is
 * mapped as the pool grows: the backing of the expandable pool
 * (core/pool_expandable.c).
 *
 * The range is reserved once (vm_reserve, nothing mapped) and cut into
 * *pieces* of equal size (a multiple of the device's granularity): the
 * unit of addresses, planning and accounting. Physical memory comes in
 * *runs*: one physical allocation (vm_map) covering one or more adjacent
 * pieces. A map its owner asks to be one run is one (one create, one map,
 * one access call instead of one of each per piece: the pool's rule,
 * core/pool_expandable.c run_wanted); any other is a run per piece. A run
 * is mapped and unmapped whole,
 * so memory goes back from the middle of the range in whole runs: the
 * callers ask which part of a span is whole runs (ps_vm_range_whole_runs)
 * before they unmap or lend it.
 *
 * Not thread-safe: its owner (the pool) holds its lock around every call.
 * Return rule: PS_OK or a negative PS_E* (core/common.h).
 */
#ifndef PS_VM_RANGE_H
#define PS_VM_RANGE_H

#include "gpu_ops.h"

typedef struct ps_vm_range {
    const ps_gpu_ops_t *gpu; /* the vm_* entries used */
    uintptr_t base;          /* first address of the reserved range */
    size_t size;             /* bytes reserved (a multiple of piece) */
    size_t piece;            /* bytes per piece */
    uint64_t *handles;       /* per piece: the vm_map handle of its run, 0 = not mapped */
    int32_t *run;            /* per piece: > 0 the first piece of a run of that many pieces,
                                < 0 inside a run (-offset to its first piece), 0 not mapped */
    uint8_t *lent;           /* per piece: 1 = still mapped, but its memory is lent: it serves
                                at another address (ps_vm_range_lend), not counted here */
    size_t lent_bytes;       /* bytes of lent pieces */
    size_t mapped_bytes;     /* bytes mapped now */
    uint64_t maps;           /* runs mapped (vm_map and vm_map_handle calls) */
    uint64_t unmaps;         /* runs unmapped (vm_unmap and vm_unmap_keep calls) */
} ps_vm_range_t;

/* Reserves `size` bytes (rounded up to `piece`; piece rounded up to the
 * device granularity). PS_EUNSUPPORTED when `gpu` has no virtual memory. */
int ps_vm_range_create(const ps_gpu_ops_t *gpu, size_t size, size_t piece, ps_vm_range_t **out);

/* Unmaps every piece still mapped and releases the range. */
void ps_vm_range_destroy(ps_vm_range_t *range);

/* The whole runs inside [lo, hi) (piece-aligned or not): *lo moves up and
 * *hi down to the nearest run boundaries (an address no run crosses: a run
 * start, an unmapped piece, the range's ends). True when some remain
 * (*hi > *lo). Every span given to unmap, unmap_keep and lend must be
 * whole runs. */
bool ps_vm_range_whole_runs(const ps_vm_range_t *range, uintptr_t *lo, uintptr_t *hi);
/* The nearest run boundary at or above `addr` (rounded up to a piece). */
uintptr_t ps_vm_range_boundary_up(const ps_vm_range_t *range, uintptr_t addr);
/* The nearest run boundary at or below `addr` (rounded down to a piece). */
uintptr_t ps_vm_range_boundary_down(const ps_vm_range_t *range, uintptr_t addr);

/* Unmaps the runs of [addr, addr + length) (whole runs, all mapped:
 * PS_EINVAL otherwise), front to back. *done receives the bytes unmapped
 * from the front: all of them on PS_OK, fewer when a call failed (the rest
 * stays mapped). */
int ps_vm_range_unmap(ps_vm_range_t *range, uintptr_t addr, size_t length, size_t *done);

/* Runs unmapped with their memory kept (the pool's remap), to be mapped
 * again elsewhere (gpu vm_map_handle) instead of a release and a create.
 * A stack: map_kept takes from the top. */
typedef struct ps_vm_stash {
    uint64_t *handles; /* kept handles, each one run */
    uint32_t *pieces;  /* per handle: pieces in its run */
    size_t count;      /* handles in use */
    size_t capacity;   /* handles allocated */
} ps_vm_stash_t;

/* As ps_vm_range_unmap, but each run's memory goes to `stash` when the
 * gpu offers vm_unmap_keep (else, or when the stash cannot grow, it is
 * released as by ps_vm_range_unmap). */
int ps_vm_range_unmap_keep(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash,
                           size_t *done);
/* Maps the pieces of [addr, addr + length) (piece-aligned, inside the
 * range, none mapped yet: PS_EINVAL otherwise), taking runs from the top
 * of `stash` (NULL or empty: none) first (vm_map_handle) while the top run
 * fits in what is left to map; the rest is new memory, one run when
 * `one_run` is set (the owner's rule: core/pool_expandable.c, run_wanted),
 * else a run per piece. On error the runs this call mapped are unmapped
 * again (kept ones back to the stash): the range is as before and the
 * stash holds what it held. */
int ps_vm_range_map_kept(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash,
                         int one_run);
/* Frees the memory of every run left in `stash` (vm_drop); keeps the array. */
void ps_vm_stash_drop(const ps_gpu_ops_t *gpu, ps_vm_stash_t *stash);
/* Frees the array (the stash must be empty). */
void ps_vm_stash_free(ps_vm_stash_t *stash);

/* Lends the memory of the mapped runs of [addr, addr + length) (whole
 * runs) to the stash without unmapping them (no call to the GPU): map_kept
 * then maps each handle a second time where a growth needs it
 * (vm_map_handle), while a kernel that still uses the old addresses goes
 * on undisturbed. The pieces stay mapped here, lent (not in mapped_bytes),
 * until ps_vm_range_unlend. PS_ENOMEM when the stash cannot grow (nothing
 * lent). */
int ps_vm_range_lend(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash);
/* Unmaps the lent pieces of [addr, addr + length) (vm_unmap_keep: their
 * memory lives on where it was lent), front to back; *done as in
 * ps_vm_range_unmap. The caller makes sure no kernel still uses them. */
int ps_vm_range_unlend(ps_vm_range_t *range, uintptr_t addr, size_t length, size_t *done);
/* Takes back the lent pieces of [addr, addr + length) as if never lent
 * (no call to the GPU: they are still mapped here); the caller removes
 * their handles from the stash it lent them to. Returns how many runs
 * (stash entries) that is. */
size_t ps_vm_range_take_back(ps_vm_range_t *range, uintptr_t addr, size_t length);
/* Whether every piece of [addr, addr + length) is lent. */
bool ps_vm_range_is_lent(const ps_vm_range_t *range, uintptr_t addr, size_t length);

/* Whether every piece of [addr, addr + length) is mapped (lent ones too). */
bool ps_vm_range_is_mapped(const ps_vm_range_t *range, uintptr_t addr, size_t length);

#endif
