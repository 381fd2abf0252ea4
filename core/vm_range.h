/* A reserved range of device address space into which physical memory is
 * mapped piece by piece: the backing of the expandable pool (core/pool_expandable.c).
 *
 * The range is reserved once (vm_reserve, nothing mapped) and cut into
 * *pieces* of equal size (a multiple of the device's granularity). Each
 * piece is mapped (vm_map: its own physical allocation) or not. Mapping
 * and unmapping work on whole pieces, so memory can be given back from the
 * middle of the range without moving anything, and mapped again later.
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
    uint64_t *handles;       /* per piece: its vm_map handle, 0 = not mapped */
    uint8_t *lent;           /* per piece: 1 = still mapped, but its memory is lent: it serves
                                at another address (ps_vm_range_lend), not counted here */
    size_t lent_bytes;       /* bytes of lent pieces */
    size_t mapped_bytes;     /* bytes mapped now */
    uint64_t maps;           /* successful vm_map calls */
    uint64_t unmaps;         /* successful vm_unmap calls */
} ps_vm_range_t;

/* Reserves `size` bytes (rounded up to `piece`; piece rounded up to the
 * device granularity). PS_EUNSUPPORTED when `gpu` has no virtual memory. */
int ps_vm_range_create(const ps_gpu_ops_t *gpu, size_t size, size_t piece, ps_vm_range_t **out);

/* Unmaps every piece still mapped and releases the range. */
void ps_vm_range_destroy(ps_vm_range_t *range);

/* Maps the pieces of [addr, addr + length) (piece-aligned, inside the
 * range, none mapped yet: PS_EINVAL otherwise). On error the pieces this
 * call mapped are unmapped again and the range is as before. */
int ps_vm_range_map(ps_vm_range_t *range, uintptr_t addr, size_t length);

/* Unmaps the pieces of [addr, addr + length) (piece-aligned, all mapped),
 * front to back. *done receives the bytes unmapped from the front: all of
 * them on PS_OK, fewer when a call failed (the rest stays mapped). */
int ps_vm_range_unmap(ps_vm_range_t *range, uintptr_t addr, size_t length, size_t *done);

/* Physical pieces unmapped with their memory kept (the pool's remap), to
 * be mapped again elsewhere (gpu vm_map_handle) instead of a release and
 * a create per piece. */
typedef struct ps_vm_stash {
    uint64_t *handles; /* kept handles, each one piece */
    size_t count;      /* handles in use */
    size_t capacity;   /* handles allocated */
} ps_vm_stash_t;

/* As ps_vm_range_unmap, but each piece's memory goes to `stash` when the
 * gpu offers vm_unmap_keep (else, or when the stash cannot grow, it is
 * released as by ps_vm_range_unmap). */
int ps_vm_range_unmap_keep(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash,
                           size_t *done);
/* As ps_vm_range_map, taking pieces from `stash` first (vm_map_handle).
 * On error the range is as before and the stash holds what it held. */
int ps_vm_range_map_kept(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash);
/* Frees the memory of every piece left in `stash` (vm_drop); keeps the array. */
void ps_vm_stash_drop(const ps_gpu_ops_t *gpu, ps_vm_stash_t *stash);
/* Frees the array (the stash must be empty). */
void ps_vm_stash_free(ps_vm_stash_t *stash);

/* Lends the memory of the mapped pieces of [addr, addr + length) to the
 * stash without unmapping them (no call to the GPU): map_kept then maps
 * each handle a second time where a growth needs it (vm_map_handle), while
 * a kernel that still uses the old addresses goes on undisturbed. The
 * pieces stay mapped here, lent (not in mapped_bytes), until
 * ps_vm_range_unlend. PS_ENOMEM when the stash cannot grow (nothing lent). */
int ps_vm_range_lend(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash);
/* Unmaps the lent pieces of [addr, addr + length) (vm_unmap_keep: their
 * memory lives on where it was lent), front to back; *done as in
 * ps_vm_range_unmap. The caller makes sure no kernel still uses them. */
int ps_vm_range_unlend(ps_vm_range_t *range, uintptr_t addr, size_t length, size_t *done);
/* Takes back the lent pieces of [addr, addr + length) as if never lent
 * (no call to the GPU: they are still mapped here); the caller removes
 * their handles from the stash it lent them to. */
void ps_vm_range_take_back(ps_vm_range_t *range, uintptr_t addr, size_t length);
/* Whether every piece of [addr, addr + length) is lent. */
int ps_vm_range_is_lent(const ps_vm_range_t *range, uintptr_t addr, size_t length);

/* Whether every piece of [addr, addr + length) is mapped (lent ones too). */
int ps_vm_range_is_mapped(const ps_vm_range_t *range, uintptr_t addr, size_t length);

#endif
