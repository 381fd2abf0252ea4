/* The fake device's sharing entries (ipc_*), as shim/ipc.c uses them: a
 * piece exported from one table and mapped by another holds the same
 * bytes; a pooled block of the expandable pool is covered by pieces that
 * follow each other; failures leave nothing mapped. */
#include "../../tools/sim/fake_gpu.h"
#include "../../core/pool.h"
#include "../../core/upstream.h"

#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#define PIECE (2 * PS_MiB)

static ps_gpu_ops_t *shareable_device(void)
{
    ps_gpu_ops_t *gpu;
    ps_fake_gpu_options_t o = {.backed = 1, .virtual_memory = 1, .shareable = 1, .auto_complete = 1};
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    cr_assert(gpu->ipc_export && gpu->ipc_reserve && gpu->ipc_release && gpu->ipc_map && gpu->ipc_unmap);
    return gpu;
}

Test(fake_gpu_ipc, only_a_shareable_backed_device_offers_the_entries)
{
    ps_gpu_ops_t *gpu;
    ps_fake_gpu_options_t o = {.backed = 1, .virtual_memory = 1};
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    cr_expect_null(gpu->ipc_export);
    cr_expect_null(gpu->ipc_map);
    ps_fake_gpu_destroy(gpu);
    o = (ps_fake_gpu_options_t){.virtual_memory = 1, .shareable = 1}; /* simulated: nothing to share */
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    cr_expect_null(gpu->ipc_export);
    ps_fake_gpu_destroy(gpu);
}

Test(fake_gpu_ipc, an_exported_piece_maps_the_same_bytes_in_another_table)
{
    ps_gpu_ops_t *a = shareable_device(), *b = shareable_device();
    void *range;
    uint64_t h1, h2;
    cr_assert_eq(a->vm_reserve(a->ctx, 4 * PIECE, &range), PS_OK);
    char *base = range;
    cr_assert_eq(a->vm_map(a->ctx, base, PIECE, &h1), PS_OK);
    cr_assert_eq(a->vm_map(a->ctx, base + PIECE, PIECE, &h2), PS_OK);
    memset(base + PIECE, 0x5a, PIECE);

    uintptr_t start;
    size_t size;
    int fd = -1;
    cr_assert_eq(a->ipc_export(a->ctx, (uintptr_t)base + PIECE + 1000, &start, &size, &fd), PS_OK);
    cr_expect_eq(start, (uintptr_t)base + PIECE, "the piece holding the address");
    cr_expect_eq(size, PIECE);
    cr_assert_geq(fd, 0);
    cr_expect_eq(a->ipc_export(a->ctx, (uintptr_t)base + 2 * PIECE, &start, &size, NULL), PS_EINVAL,
                 "an address in no mapped piece");

    void *other;
    uint64_t handle;
    cr_assert_eq(b->ipc_reserve(b->ctx, PIECE, &other), PS_OK);
    cr_assert_eq(b->ipc_map(b->ctx, other, PIECE, fd, &handle), PS_OK);
    close(fd); /* the mapping keeps the memory */
    cr_expect_eq(ps_fake_gpu_ipc_mapped(b), 1);
    unsigned char *seen = other;
    cr_expect_eq(seen[0], 0x5a);
    cr_expect_eq(seen[PIECE - 1], 0x5a);
    seen[77] = 0x11; /* written through the import */
    cr_expect_eq((unsigned char)base[PIECE + 77], 0x11, "the exporter sees the importer's write");

    cr_expect_eq(b->ipc_unmap(b->ctx, other, PIECE / 2, handle), PS_EINVAL, "not what was mapped");
    cr_assert_eq(b->ipc_unmap(b->ctx, other, PIECE, handle), PS_OK);
    cr_expect_eq(ps_fake_gpu_ipc_mapped(b), 0);
    b->ipc_release(b->ctx, other, PIECE);

    cr_assert_eq(a->vm_unmap(a->ctx, base + PIECE, PIECE, h2), PS_OK);
    cr_expect_eq(a->ipc_export(a->ctx, (uintptr_t)base + PIECE, &start, &size, NULL), PS_EINVAL,
                 "an unmapped piece is no longer exported");
    cr_assert_eq(a->vm_unmap(a->ctx, base, PIECE, h1), PS_OK);
    a->vm_release(a->ctx, range, 4 * PIECE);
    cr_expect_eq(ps_fake_gpu_live_vm_ranges(a), 0);
    cr_expect_eq(ps_fake_gpu_live_vm_ranges(b), 0);
    ps_fake_gpu_destroy(a);
    ps_fake_gpu_destroy(b);
}

Test(fake_gpu_ipc, failures_are_planned_and_leave_nothing_mapped)
{
    ps_gpu_ops_t *a = shareable_device(), *b = shareable_device();
    void *range, *other;
    uint64_t h, handle = 0;
    cr_assert_eq(a->vm_reserve(a->ctx, PIECE, &range), PS_OK);
    cr_assert_eq(a->vm_map(a->ctx, range, PIECE, &h), PS_OK);
    uintptr_t start;
    size_t size;
    int fd = -1;
    cr_assert_eq(ps_fake_gpu_fail_call(a, PS_FAKE_OP_IPC_EXPORT, 1, 0), PS_OK);
    cr_expect_eq(a->ipc_export(a->ctx, (uintptr_t)range, &start, &size, &fd), PS_EUPSTREAM);
    cr_expect_eq(fd, -1, "a failed export gives no descriptor");
    cr_assert_eq(a->ipc_export(a->ctx, (uintptr_t)range, &start, &size, &fd), PS_OK);
    cr_expect_eq(ps_fake_gpu_calls(a, PS_FAKE_OP_IPC_EXPORT), 2);

    cr_assert_eq(b->ipc_reserve(b->ctx, PIECE, &other), PS_OK);
    cr_assert_eq(ps_fake_gpu_fail_call(b, PS_FAKE_OP_IPC_MAP, 1, 0), PS_OK);
    cr_expect_eq(b->ipc_map(b->ctx, other, PIECE, fd, &handle), PS_EUPSTREAM);
    cr_expect_eq(ps_fake_gpu_ipc_mapped(b), 0, "nothing mapped after a failure");
    cr_expect_eq(b->ipc_map(b->ctx, other, 2 * PIECE, fd, &handle), PS_EINVAL, "larger than the exported piece");
    cr_assert_eq(b->ipc_map(b->ctx, other, PIECE, fd, &handle), PS_OK);
    cr_expect_eq(ps_fake_gpu_faults_fired(b, NULL, NULL), 1);
    close(fd);
    cr_assert_eq(b->ipc_unmap(b->ctx, other, PIECE, handle), PS_OK);
    b->ipc_release(b->ctx, other, PIECE);
    cr_assert_eq(a->vm_unmap(a->ctx, range, PIECE, h), PS_OK);
    a->vm_release(a->ctx, range, PIECE);
    ps_fake_gpu_destroy(a);
    ps_fake_gpu_destroy(b);
}

/* What shim/ipc.c does with a pooled block: walk the pieces under it (they
 * follow each other), map them back to back elsewhere: the block's bytes
 * are at the same offset there. */
Test(fake_gpu_ipc, a_block_of_the_expandable_pool_is_covered_by_consecutive_pieces)
{
    ps_gpu_ops_t *a = shareable_device(), *b = shareable_device();
    ps_pool_options_t o;
    ps_pool_options_default(&o);
    o.expandable = 1;
    o.free_sync = PS_FREE_SYNC_NONE;
    o.expandable_reserve = 64 * PS_MiB;
    o.expandable_piece = PIECE;
    ps_resource_t *up, *pool;
    cr_assert_eq(ps_cuda_resource_create("up", a, &up), PS_OK);
    cr_assert_eq(ps_pool_create("pool", up, a, &o, &pool), PS_OK);
    cr_assert(ps_pool_is_expandable(pool));
    void *small, *block;
    const size_t size = 5 * PS_MiB + 4096;
    cr_assert_eq(ps_allocate(pool, 3000, PS_STREAM_NONE, &small), PS_OK); /* so the block starts inside a piece */
    cr_assert_eq(ps_allocate(pool, size, PS_STREAM_NONE, &block), PS_OK);
    for (size_t i = 0; i < size; i += 4096)
        ((unsigned char *)block)[i] = (unsigned char)(i / 4096 + 3);

    uintptr_t first, at, s;
    size_t piece;
    cr_assert_eq(a->ipc_export(a->ctx, (uintptr_t)block, &first, &piece, NULL), PS_OK);
    size_t pieces = 0;
    for (at = first; at < (uintptr_t)block + size; at += piece, pieces++) {
        cr_assert_eq(a->ipc_export(a->ctx, at, &s, &piece, NULL), PS_OK, "piece %zu mapped", pieces);
        cr_assert_eq(s, at, "piece %zu follows the one before", pieces);
    }
    size_t mapped = at - first, offset = (uintptr_t)block - first;
    cr_expect_geq(pieces, 3);

    void *other;
    cr_assert_eq(b->ipc_reserve(b->ctx, mapped, &other), PS_OK);
    uint64_t handles[64];
    cr_assert_leq(pieces, 64);
    at = first;
    for (size_t i = 0; i < pieces; i++) {
        int fd;
        cr_assert_eq(a->ipc_export(a->ctx, at, &s, &piece, &fd), PS_OK);
        cr_assert_eq(b->ipc_map(b->ctx, (char *)other + (at - first), piece, fd, &handles[i]), PS_OK);
        close(fd);
        at += piece;
    }
    unsigned char *seen = (unsigned char *)other + offset;
    for (size_t i = 0; i < size; i += 4096)
        cr_assert_eq(seen[i], (unsigned char)(i / 4096 + 3), "byte %zu of the block", i);
    at = first;
    for (size_t i = 0; i < pieces; i++, at += piece)
        cr_assert_eq(b->ipc_unmap(b->ctx, (char *)other + (at - first), piece, handles[i]), PS_OK);
    b->ipc_release(b->ctx, other, mapped);
    cr_assert_eq(ps_deallocate(pool, block, size, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(pool, small, 3000, PS_STREAM_NONE), PS_OK);
    ps_destroy(pool);
    ps_destroy(up);
    ps_fake_gpu_destroy(a);
    ps_fake_gpu_destroy(b);
}
