/* A reserved address range mapped in runs of pieces (core/vm_range.h).
 *
 * Algorithm
 *  1. create: piece = max(requested piece, device granularity) rounded up
 *     to the granularity; size rounded up to a piece; vm_reserve; per
 *     piece a handle slot (0 = unmapped) and a run mark (run[]: > 0 first
 *     piece of a run of that many pieces, < 0 inside one, 0 unmapped).
 *  2. map(addr, length, one_run): every piece must be unmapped. From the
 *     front: while the top of the stash holds a run that fits in what is
 *     left, map it there (vm_map_handle: the same memory); then the rest:
 *     one run (one vm_map: create + map + access) when the owner asks for
 *     one (the rule is the pool's: core/pool_expandable.c, run_wanted),
 *     else one run per piece. When the map is
 *     more than one run and the GPU offers it, every run is mapped bare
 *     and one vm_access covers them all (an access call's fixed cost is
 *     paid once; tests/gpu/vmm_alias_probe.cu, docs/benchmarks.md). On a
 *     failure, the runs this call mapped go back, back to front (kept ones
 *     to the stash, in their old order).
 *  3. unmap(addr, length): the span must be whole runs; vm_unmap each run
 *     front to back, stopping at the first failure; report how far it got.
 *  4. whole_runs(lo, hi): lo moves up to the end of the run it cuts, hi
 *     down to the start of the run it cuts (O(1) each: run[] gives the
 *     start of a run from any of its pieces).
 *  5. destroy: unmap (or unlend) every run, release the reservation.
 *  6. lend(addr, length): the handles of its runs go to the stash while the
 *     runs stay mapped (marked lent, per piece); map_kept maps those
 *     handles a second time elsewhere (the same physical memory at two
 *     addresses). unlend unmaps the lent runs without freeing their memory
 *     (vm_unmap_keep); destroy does the same for those still lent.
 * Guarantees: mapped_bytes == (pieces mapped - pieces lent) * piece,
 * lent_bytes == pieces lent * piece; a run is mapped, unmapped and lent
 * whole; a failed map leaves the range and the stash as they were.
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
    if (!piece || !size || size / piece > INT32_MAX)
        return PS_EINVAL;
    ps_vm_range_t *range = calloc(1, sizeof *range);
    if (!range)
        return PS_ENOMEM;
    range->handles = calloc(size / piece, sizeof *range->handles);
    range->run = calloc(size / piece, sizeof *range->run);
    range->lent = calloc(size / piece, sizeof *range->lent);
    if (!range->handles || !range->run || !range->lent) {
        free(range->handles);
        free(range->run);
        free(range->lent);
        free(range);
        return PS_ENOMEM;
    }
    void *base;
    int status = gpu->vm_reserve(gpu->ctx, size, &base);
    if (status != PS_OK) {
        free(range->handles);
        free(range->run);
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

static inline void *piece_addr(const ps_vm_range_t *range, size_t index)
{
    return (void *)(range->base + index * range->piece);
}

/* Records run [first, first + pieces) as mapped with `handle`. */
static void set_run(ps_vm_range_t *range, size_t first, size_t pieces, uint64_t handle)
{
    for (size_t i = 0; i < pieces; i++) {
        range->handles[first + i] = handle;
        range->run[first + i] = i ? -(int32_t)i : (int32_t)pieces;
    }
}

static void clear_run(ps_vm_range_t *range, size_t first, size_t pieces)
{
    for (size_t i = 0; i < pieces; i++) {
        range->handles[first + i] = 0;
        range->run[first + i] = 0;
        range->lent[first + i] = 0;
    }
}

uintptr_t ps_vm_range_boundary_up(const ps_vm_range_t *range, uintptr_t addr)
{
    size_t i = piece_index(range, range->base + ps_align_up(addr - range->base, range->piece));
    if (i < range->size / range->piece && range->run[i] < 0) { /* inside a run: its end */
        size_t first = i + range->run[i];
        i = first + (size_t)range->run[first];
    }
    return range->base + i * range->piece;
}

uintptr_t ps_vm_range_boundary_down(const ps_vm_range_t *range, uintptr_t addr)
{
    size_t i = piece_index(range, addr);
    if (i < range->size / range->piece && range->run[i] < 0) /* inside a run: its start */
        i += range->run[i];
    return range->base + i * range->piece;
}

bool ps_vm_range_whole_runs(const ps_vm_range_t *range, uintptr_t *lo, uintptr_t *hi)
{
    if (*hi <= *lo)
        return 0;
    uintptr_t a = ps_vm_range_boundary_up(range, *lo), b = ps_vm_range_boundary_down(range, *hi);
    *lo = a;
    *hi = b > a ? b : a;
    return b > a;
}

/* Whether [first, end) is whole runs, every piece mapped (lent or not as `lent`). */
static int whole_mapped_runs(const ps_vm_range_t *range, size_t first, size_t end, int lent)
{
    if (first >= end || range->run[first] <= 0 || (end < range->size / range->piece && range->run[end] < 0))
        return 0;
    for (size_t i = first; i < end; i++)
        if (!range->handles[i] || range->lent[i] != lent)
            return 0;
    return 1;
}

static int unlend_run(ps_vm_range_t *range, size_t first);

/* vm_unmap of the run starting at piece `first` (its memory freed). */
static int unmap_run(ps_vm_range_t *range, size_t first)
{
    const ps_gpu_ops_t *gpu = range->gpu;
    size_t pieces = (size_t)range->run[first];
    int status = gpu->vm_unmap(gpu->ctx, piece_addr(range, first), pieces * range->piece, range->handles[first]);
    if (status == PS_OK) {
        clear_run(range, first, pieces);
        range->mapped_bytes -= pieces * range->piece;
        range->unmaps++;
    }
    return status;
}

void ps_vm_range_destroy(ps_vm_range_t *range)
{
    if (!range)
        return;
    for (size_t i = 0, n = range->size / range->piece; i < n;) {
        size_t pieces = range->run[i] > 0 ? (size_t)range->run[i] : 1;
        if (range->run[i] > 0) {
            if (range->lent[i])
                unlend_run(range, i);
            else
                unmap_run(range, i);
        }
        i += pieces;
    }
    if (range->gpu->vm_release)
        range->gpu->vm_release(range->gpu->ctx, (void *)range->base, range->size);
    free(range->handles);
    free(range->run);
    free(range->lent);
    free(range);
}

int ps_vm_range_unmap(ps_vm_range_t *range, uintptr_t addr, size_t length, size_t *done)
{
    size_t first = piece_index(range, addr), end = piece_index(range, addr + length);
    *done = 0;
    if (!whole_mapped_runs(range, first, end, 0))
        return PS_EINVAL;
    for (size_t i = first; i < end;) {
        size_t pieces = (size_t)range->run[i];
        int status = unmap_run(range, i);
        if (status != PS_OK)
            return status;
        *done += pieces * range->piece;
        i += pieces;
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
    uint32_t *pieces = realloc(stash->pieces, capacity * sizeof *pieces);
    if (!pieces)
        return PS_ENOMEM; /* (handles grew: harmless, capacity unchanged) */
    stash->pieces = pieces;
    stash->capacity = capacity;
    return PS_OK;
}

static void stash_push(ps_vm_stash_t *stash, uint64_t handle, size_t pieces)
{
    stash->handles[stash->count] = handle;
    stash->pieces[stash->count++] = (uint32_t)pieces;
}

/* Unmaps the run starting at piece `first`, keeping its memory in `stash`
 * (room reserved). */
static int keep_run(ps_vm_range_t *range, size_t first, ps_vm_stash_t *stash)
{
    const ps_gpu_ops_t *gpu = range->gpu;
    size_t pieces = (size_t)range->run[first];
    uint64_t handle = range->handles[first];
    int status = gpu->vm_unmap_keep(gpu->ctx, piece_addr(range, first), pieces * range->piece, handle);
    if (status == PS_OK) {
        stash_push(stash, handle, pieces);
        clear_run(range, first, pieces);
        range->mapped_bytes -= pieces * range->piece;
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
    if (!whole_mapped_runs(range, first, end, 0))
        return PS_EINVAL;
    for (size_t i = first; i < end;) {
        size_t pieces = (size_t)range->run[i];
        int status = stash_reserve(stash) == PS_OK ? keep_run(range, i, stash) : unmap_run(range, i);
        if (status != PS_OK)
            return status;
        *done += pieces * range->piece;
        i += pieces;
    }
    return PS_OK;
}

int ps_vm_range_map_kept(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash,
                         int one_run)
{
    const ps_gpu_ops_t *gpu = range->gpu;
    size_t first = piece_index(range, addr), end = piece_index(range, addr + length);
    if (first >= end || end > range->size / range->piece)
        return PS_EINVAL;
    for (size_t i = first; i < end; i++)
        if (range->handles[i])
            return PS_EINVAL;
    size_t run_pieces = one_run ? end - first : 1; /* new memory: one run, or piece by piece */
    size_t kept_end = first; /* runs before this piece came from the stash */
    size_t i = first;
    int status = PS_OK;
    /* more than one run: map them bare, then one access call for all */
    int bare = run_pieces < end - first && gpu->vm_map_bare && gpu->vm_map_handle_bare && gpu->vm_access;
    while (i < end) {
        uint64_t handle = 0;
        size_t pieces;
        int kept = stash && stash->count && gpu->vm_map_handle && stash->pieces[stash->count - 1] <= end - i;
        if (kept) {
            pieces = stash->pieces[stash->count - 1];
            handle = stash->handles[stash->count - 1];
            status = (bare ? gpu->vm_map_handle_bare : gpu->vm_map_handle)(gpu->ctx, piece_addr(range, i),
                                                                           pieces * range->piece, handle);
            if (status == PS_OK)
                stash->count--;
        } else {
            pieces = end - i < run_pieces ? end - i : run_pieces;
            status = (bare ? gpu->vm_map_bare : gpu->vm_map)(gpu->ctx, piece_addr(range, i), pieces * range->piece,
                                                             &handle);
            if (status == PS_OK && !handle)
                status = PS_EUPSTREAM; /* 0 means "unmapped" here */
        }
        if (status != PS_OK)
            break;
        set_run(range, i, pieces, handle);
        range->mapped_bytes += pieces * range->piece;
        range->maps++;
        i += pieces;
        if (kept)
            kept_end = i;
    }
    if (status == PS_OK && bare)
        status = gpu->vm_access(gpu->ctx, piece_addr(range, first), (end - first) * range->piece);
    if (status == PS_OK)
        return PS_OK;
    /* undo, back to front: kept runs go back to the stash (room: they left
     * it), in the order they came from it */
    while (i > first) {
        size_t start = i - 1;
        if (range->run[start] < 0)
            start += range->run[start];
        if (start >= kept_end || stash_reserve(stash) != PS_OK || keep_run(range, start, stash) != PS_OK)
            unmap_run(range, start);
        i = start;
    }
    return status;
}

void ps_vm_stash_drop(const ps_gpu_ops_t *gpu, ps_vm_stash_t *stash)
{
    while (stash->count)
        gpu->vm_drop(gpu->ctx, stash->handles[--stash->count]);
}

void ps_vm_stash_free(ps_vm_stash_t *stash)
{
    free(stash->handles);
    free(stash->pieces);
    *stash = (ps_vm_stash_t){0};
}

int ps_vm_range_lend(ps_vm_range_t *range, uintptr_t addr, size_t length, ps_vm_stash_t *stash)
{
    size_t first = piece_index(range, addr), end = piece_index(range, addr + length);
    if (!whole_mapped_runs(range, first, end, 0))
        return PS_EINVAL;
    size_t pushed = 0;
    for (size_t i = first; i < end; i += (size_t)range->run[i]) {
        if (stash_reserve(stash) != PS_OK) { /* give back what this call lent */
            stash->count -= pushed;
            for (size_t k = first; k < i; k++)
                range->lent[k] = 0;
            range->mapped_bytes += (i - first) * range->piece;
            range->lent_bytes -= (i - first) * range->piece;
            return PS_ENOMEM;
        }
        size_t pieces = (size_t)range->run[i];
        stash_push(stash, range->handles[i], pieces);
        pushed++;
        for (size_t k = i; k < i + pieces; k++)
            range->lent[k] = 1;
        range->mapped_bytes -= pieces * range->piece;
        range->lent_bytes += pieces * range->piece;
    }
    return PS_OK;
}

/* vm_unmap_keep of the lent run starting at piece `first`: its memory lives
 * on where it was lent. */
static int unlend_run(ps_vm_range_t *range, size_t first)
{
    const ps_gpu_ops_t *gpu = range->gpu;
    size_t pieces = (size_t)range->run[first];
    int status = gpu->vm_unmap_keep(gpu->ctx, piece_addr(range, first), pieces * range->piece, range->handles[first]);
    if (status == PS_OK) {
        clear_run(range, first, pieces);
        range->lent_bytes -= pieces * range->piece;
        range->unmaps++;
    }
    return status;
}

int ps_vm_range_unlend(ps_vm_range_t *range, uintptr_t addr, size_t length, size_t *done)
{
    size_t first = piece_index(range, addr), end = piece_index(range, addr + length);
    *done = 0;
    if (!whole_mapped_runs(range, first, end, 1))
        return PS_EINVAL;
    for (size_t i = first; i < end;) {
        size_t pieces = (size_t)range->run[i];
        int status = unlend_run(range, i);
        if (status != PS_OK)
            return status;
        *done += pieces * range->piece;
        i += pieces;
    }
    return PS_OK;
}

size_t ps_vm_range_take_back(ps_vm_range_t *range, uintptr_t addr, size_t length)
{
    size_t runs = 0;
    for (size_t i = piece_index(range, addr), end = piece_index(range, addr + length); i < end; i++)
        if (range->lent[i]) {
            runs += range->run[i] > 0;
            range->lent[i] = 0;
            range->mapped_bytes += range->piece;
            range->lent_bytes -= range->piece;
        }
    return runs;
}

bool ps_vm_range_is_lent(const ps_vm_range_t *range, uintptr_t addr, size_t length)
{
    for (size_t i = piece_index(range, addr), end = piece_index(range, addr + length); i < end; i++)
        if (!range->lent[i])
            return 0;
    return 1;
}

bool ps_vm_range_is_mapped(const ps_vm_range_t *range, uintptr_t addr, size_t length)
{
    for (size_t i = piece_index(range, addr), end = piece_index(range, addr + length); i < end; i++)
        if (!range->handles[i])
            return 0;
    return 1;
}
