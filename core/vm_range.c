/* A reserved address range mapped piece by piece (core/vm_range.h).
 *
 * Algorithm
 *  1. create: piece = max(requested piece, device granularity) rounded up
 *     to the granularity; size rounded up to a piece; vm_reserve; one
 *     handle slot per piece (0 = unmapped).
 *  2. map(addr, length): every piece must be unmapped; vm_map each (its
 *     own physical allocation, so it can later be given back alone). On a
 *     failure, unmap the pieces mapped by this call, back to front.
 *  3. unmap(addr, length): vm_unmap each piece front to back, stopping at
 *     the first failure; report how far it got.
 *  4. destroy: unmap what is mapped, release the reservation.
 *  5. lend(addr, length): the handles of mapped pieces go to a stash while
 *     the pieces stay mapped (marked lent); map_kept maps those handles a
 *     second time elsewhere (the same physical memory at two addresses).
 *     unlend unmaps the lent pieces without freeing their memory
 *     (vm_unmap_keep); destroy does the same for those still lent.
 * Guarantees: mapped_bytes == (pieces mapped - pieces lent) * piece,
 * lent_bytes == pieces lent * piece; a failed map leaves the range as it
 * was.
 */
#include "vm_range.h"

#include <stdlib.h>

int ps_vm_range_create(const ps_gpu_ops_t *gpu, size_t size, size_t piece, ps_vm_range_t **out)
{
    if (!gpu || !gpu->vm_reserve || !gpu->vm_map || !gpu->vm_unmap || !gpu->vm_granularity)
        return PS_EUNSUPPORTED;
    size_t granularity = gpu->vm_granularity(gpu->ctx);
    if (!granularity)
        return PS_EUNSUPPORTED;
    piece = ps_align_up(piece > granularity ? piece : granularity, granularity);
    size = ps_align_up(size, piece);
    if (!piece || !size)
        return PS_EINVAL;
    ps_vm_range_t *range = calloc(1, sizeof *range);
    if (!range)
        return PS_ENOMEM;
    range->handles = calloc(size / piece, sizeof *range->handles);
    range->lent = calloc(size / piece, sizeof *range->lent);
    if (!range->handles || !range->lent) {
        free(range->handles);
        free(range->lent);
        free(range);
        return PS_ENOMEM;
    }
    void *base;
    int status = gpu->vm_reserve(gpu->ctx, size, &base);
    if (status != PS_OK) {
        free(range->handles);
        free(range->lent);
        free(range);
        return status;
    }
    range->gpu = gpu;
    range->base = (uintptr_t)base;
    range->size = size;
    range->piece = piece;
    *out = range;
    return PS_OK;
}

static inline size_t piece_index(const ps_vm_range_t *range, uintptr_t addr)
{
    return (addr - range->base) / range->piece;
}

static int unlend_piece(ps_vm_range_t *range, size_t index);

static int unmap_piece(ps_vm_range_t *range, size_t index)
{
    const ps_gpu_ops_t *gpu = range->gpu;
    int status = gpu->vm_unmap(gpu->ctx, (void *)(range->base + index * range->piece), range->piece,
                               range->handles[index]);
    if (status == PS_OK) {
        range->handles[index] = 0;
        range->mapped_bytes -= range->piece;
        range->unmaps++;
    }
    return status;
}

void ps_vm_range_destroy(ps_vm_range_t *range)
{
    if (!range)
        return;
    for (size_t i = 0; i < range->size / range->piece; i++)
        if (range->lent[i])
            unlend_piece(range, i);
        else if (range->handles[i])
            unmap_piece(range, i);
    if (range->gpu->vm_release)
        range->gpu->vm_release(range->gpu->ctx, (void *)range->base, range->size);
    free(range->handles);
    free(range->lent);
    free(range);
}

int ps_vm_range_unmap(ps_vm_range_t *range, uintptr_t addr, size_t length, size_t *done)
{
    size_t first = piece_index(range, addr), end = piece_index(range, addr + length);
    *done = 0;
    for (size_t i = first; i < end; i++) {
        int status = unmap_piece(range, i);
        if (status != PS_OK)
            return status;
        *done += range->piece;
    }
    return PS_OK;
}

static int stash_reserve(ps_vm_stash_t *stash)
{
    if (stash->count < stash->capacity)
        return PS_OK;
    size_t capacity = stash->capacity ? 2 * stash->capacity : 64;
    uint64_t *handles = realloc(stash->handles, capacity * sizeof *handles);
    if (!handles)
        return PS_ENOMEM;
    stash->handles = handles;
    stash->capacity = capacity;
    return PS_OK;
}

/* Unmaps piece `index` keeping its memory in `stash` (room reserved). */
static int keep_piece(ps_vm_range_t *range, size_t index, ps_vm_stash_t *stash)
{
    const ps_gpu_ops_t *gpu = range->gpu;
    int status = gpu->vm_unmap_keep(gpu->ctx, (void *)(range->base + index * range->piece), range->piece,
                                    range->handles[index]);
    if (status == PS_OK) {
        stash->handles[stash->count++] = range->handles[index];
        range->handles[index] = 0;
        range->mapped_bytes -= range->piece;
        range->unmaps++;
    }
    return status;
}

int ps_vm_range_unmap_keep(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash,
                           size_t *done)
{
    const ps_gpu_ops_t *gpu = range->gpu;
    if (!gpu->vm_unmap_keep || !gpu->vm_map_handle || !gpu->vm_drop)
        return ps_vm_range_unmap(range, addr, length, done);
    size_t first = piece_index(range, addr), end = piece_index(range, addr + length);
    *done = 0;
    for (size_t i = first; i < end; i++) {
        int status = stash_reserve(stash) == PS_OK ? keep_piece(range, i, stash) : unmap_piece(range, i);
        if (status != PS_OK)
            return status;
        *done += range->piece;
    }
    return PS_OK;
}

/* Maps the pieces of [addr, addr + length), taking memory from `stash`
 * first (NULL or empty: creates every piece). */
static int map_pieces(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash)
{
    const ps_gpu_ops_t *gpu = range->gpu;
    size_t first = piece_index(range, addr), end = piece_index(range, addr + length);
    for (size_t i = first; i < end; i++)
        if (range->handles[i])
            return PS_EINVAL;
    size_t from_stash = 0; /* the first pieces come from the stash */
    for (size_t i = first; i < end; i++) {
        void *at = (void *)(range->base + i * range->piece);
        uint64_t handle = 0;
        int status;
        if (stash && stash->count && gpu->vm_map_handle) {
            handle = stash->handles[stash->count - 1];
            status = gpu->vm_map_handle(gpu->ctx, at, range->piece, handle);
            if (status == PS_OK) {
                stash->count--;
                from_stash++;
            }
        } else {
            status = gpu->vm_map(gpu->ctx, at, range->piece, &handle);
            if (status == PS_OK && !handle)
                status = PS_EUPSTREAM; /* 0 means "unmapped" here */
        }
        if (status != PS_OK) {
            while (i-- > first) /* undo this call: kept pieces go back to the stash (room: they left it) */
                if (i - first >= from_stash || keep_piece(range, i, stash) != PS_OK)
                    unmap_piece(range, i);
            return status;
        }
        range->handles[i] = handle;
        range->mapped_bytes += range->piece;
        range->maps++;
    }
    return PS_OK;
}

int ps_vm_range_map(ps_vm_range_t *range, uintptr_t addr, size_t length)
{
    return map_pieces(range, addr, length, NULL);
}

int ps_vm_range_map_kept(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash)
{
    return map_pieces(range, addr, length, stash);
}

void ps_vm_stash_drop(const ps_gpu_ops_t *gpu, ps_vm_stash_t *stash)
{
    while (stash->count)
        gpu->vm_drop(gpu->ctx, stash->handles[--stash->count]);
}

void ps_vm_stash_free(ps_vm_stash_t *stash)
{
    free(stash->handles);
    *stash = (ps_vm_stash_t){0};
}

int ps_vm_range_lend(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash)
{
    size_t first = piece_index(range, addr), end = piece_index(range, addr + length);
    for (size_t i = first; i < end; i++)
        if (!range->handles[i] || range->lent[i])
            return PS_EINVAL;
    for (size_t i = first; i < end; i++)
        if (stash_reserve(stash) != PS_OK) { /* give back what this call lent */
            while (i-- > first) {
                stash->count--;
                range->lent[i] = 0;
                range->mapped_bytes += range->piece;
                range->lent_bytes -= range->piece;
            }
            return PS_ENOMEM;
        } else {
            stash->handles[stash->count++] = range->handles[i];
            range->lent[i] = 1;
            range->mapped_bytes -= range->piece;
            range->lent_bytes += range->piece;
        }
    return PS_OK;
}

static int unlend_piece(ps_vm_range_t *range, size_t index)
{
    const ps_gpu_ops_t *gpu = range->gpu;
    int status = gpu->vm_unmap_keep(gpu->ctx, (void *)(range->base + index * range->piece), range->piece,
                                    range->handles[index]);
    if (status == PS_OK) {
        range->handles[index] = 0;
        range->lent[index] = 0;
        range->lent_bytes -= range->piece;
        range->unmaps++;
    }
    return status;
}

int ps_vm_range_unlend(ps_vm_range_t *range, uintptr_t addr, size_t length, size_t *done)
{
    size_t first = piece_index(range, addr), end = piece_index(range, addr + length);
    *done = 0;
    for (size_t i = first; i < end; i++)
        if (!range->lent[i])
            return PS_EINVAL;
    for (size_t i = first; i < end; i++) {
        int status = unlend_piece(range, i);
        if (status != PS_OK)
            return status;
        *done += range->piece;
    }
    return PS_OK;
}

void ps_vm_range_take_back(ps_vm_range_t *range, uintptr_t addr, size_t length)
{
    for (size_t i = piece_index(range, addr), end = piece_index(range, addr + length); i < end; i++)
        if (range->lent[i]) {
            range->lent[i] = 0;
            range->mapped_bytes += range->piece;
            range->lent_bytes -= range->piece;
        }
}

int ps_vm_range_is_lent(const ps_vm_range_t *range, uintptr_t addr, size_t length)
{
    for (size_t i = piece_index(range, addr), end = piece_index(range, addr + length); i < end; i++)
        if (!range->lent[i])
            return 0;
    return 1;
}

int ps_vm_range_is_mapped(const ps_vm_range_t *range, uintptr_t addr, size_t length)
{
    for (size_t i = piece_index(range, addr), end = piece_index(range, addr + length); i < end; i++)
        if (!range->handles[i])
            return 0;
    return 1;
}
