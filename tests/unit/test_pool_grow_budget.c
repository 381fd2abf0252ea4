/* grow_budget_percent: an expandable pool gives free pieces back (holes
 * between live blocks first) and waits for pending blocks before it grows
 * past that % of the most bytes in use (the pinned pool's host range,
 * host.expandable). Each test fails with the budget off (0). */
#include "pool_fixture.h"

#define PIECE ((size_t)64 << 10)

typedef struct budget_pool {
    ps_gpu_ops_t *gpu;
    ps_resource_t *upstream, *pool;
} budget_pool_t;

/* An expandable pool on the fake device's vm_* (64 KiB pieces), free_sync
 * event; fences complete only when the test says so. */
static budget_pool_t open_pool(unsigned budget)
{
    budget_pool_t b;
    ps_fake_gpu_options_t ho = {.virtual_memory = 1, .vm_granularity = PIECE};
    cr_assert_eq(ps_fake_gpu_create(&ho, &b.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", b.gpu, &b.upstream), PS_OK);
    ps_pool_options_t o = small_pool_options();
    o.free_sync = PS_FREE_SYNC_EVENT;
    o.expandable = 1;
    o.expandable_piece = PIECE;
    o.expandable_reserve = 256 * PS_MiB;
    o.grow_budget_percent = budget;
    cr_assert_eq(ps_pool_create("budget", b.upstream, b.gpu, &o, &b.pool), PS_OK);
    cr_assert(ps_pool_is_expandable(b.pool));
    return b;
}

static void close_pool(budget_pool_t *b)
{
    cr_assert_eq(ps_pool_check(b->pool), PS_OK);
    ps_destroy(b->pool);
    ps_destroy(b->upstream);
    ps_fake_gpu_destroy(b->gpu);
}

/* A 4 MiB hole between two live blocks, then a 5 MiB request: with the
 * budget the hole's pieces go back before the pool maps 5 MiB more. */
static uint64_t reserved_after_hole_and_bigger_request(unsigned budget, uint64_t *unmaps)
{
    budget_pool_t b = open_pool(budget);
    void *a, *hole, *c, *d;
    cr_assert_eq(ps_allocate(b.pool, 1 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(b.pool, 4 * PS_MiB, PS_STREAM_NONE, &hole), PS_OK);
    cr_assert_eq(ps_allocate(b.pool, 1 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(ps_deallocate(b.pool, hole, 4 * PS_MiB, PS_STREAM_NONE), PS_OK);
    ps_fake_gpu_complete_all(b.gpu); /* the hole is ready: only its size keeps it from serving */
    cr_assert_eq(ps_allocate(b.pool, 5 * PS_MiB, PS_STREAM_NONE, &d), PS_OK);
    ps_resource_info_t info = fixture_info(b.pool);
    *unmaps = ps_fake_gpu_vm_unmaps(b.gpu);
    cr_assert_eq(ps_deallocate(b.pool, a, 1 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(b.pool, c, 1 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(b.pool, d, 5 * PS_MiB, PS_STREAM_NONE), PS_OK);
    close_pool(&b);
    return info.bytes_reserved;
}

Test(pool_grow_budget, a_hole_between_live_blocks_goes_back_before_the_pool_grows)
{
    uint64_t unmaps = 0;
    uint64_t with = reserved_after_hole_and_bigger_request(100, &unmaps);
    cr_assert_eq(with, 7 * PS_MiB, "1 + 1 + 5 MiB in use, nothing else reserved (got %llu)",
                 (unsigned long long)with);
    cr_assert_eq(unmaps, 4 * PS_MiB / PIECE, "the hole's pieces were unmapped");
    uint64_t without = reserved_after_hole_and_bigger_request(0, &unmaps);
    cr_assert_eq(without, 11 * PS_MiB, "budget off: the hole stays, 5 MiB more (got %llu)",
                 (unsigned long long)without);
    cr_assert_eq(unmaps, 0);
}

Test(pool_grow_budget, within_the_budget_nothing_goes_back)
{
    budget_pool_t b = open_pool(200);
    void *a, *hole, *c, *d;
    cr_assert_eq(ps_allocate(b.pool, 1 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(b.pool, 4 * PS_MiB, PS_STREAM_NONE, &hole), PS_OK);
    cr_assert_eq(ps_allocate(b.pool, 1 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(ps_deallocate(b.pool, hole, 4 * PS_MiB, PS_STREAM_NONE), PS_OK);
    ps_fake_gpu_complete_all(b.gpu);
    cr_assert_eq(ps_allocate(b.pool, 5 * PS_MiB, PS_STREAM_NONE, &d), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_unmaps(b.gpu), 0, "11 MiB <= 200 %% of 7 MiB: the hole stays for later");
    cr_assert_eq(fixture_info(b.pool).bytes_reserved, 11 * PS_MiB);
    cr_assert_eq(ps_deallocate(b.pool, a, 1 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(b.pool, c, 1 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(b.pool, d, 5 * PS_MiB, PS_STREAM_NONE), PS_OK);
    close_pool(&b);
}

/* A freed block whose fence has not completed would have to be stranded
 * beside new memory; with the budget the pool waits for it instead (one
 * host wait, counted), then reuses it. */
static ps_resource_info_t reuse_of_a_pending_block(unsigned budget, uint64_t *waits)
{
    budget_pool_t b = open_pool(budget);
    void *a, *c, *d;
    cr_assert_eq(ps_allocate(b.pool, 4 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(b.pool, 4 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(ps_deallocate(b.pool, a, 4 * PS_MiB, PS_STREAM_NONE), PS_OK); /* pending: the GPU lags */
    cr_assert_eq(ps_allocate(b.pool, 4 * PS_MiB, PS_STREAM_NONE, &d), PS_OK);
    ps_resource_info_t info = fixture_info(b.pool);
    *waits = ps_fake_gpu_fence_waits(b.gpu);
    cr_assert_eq(ps_deallocate(b.pool, c, 4 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(b.pool, d, 4 * PS_MiB, PS_STREAM_NONE), PS_OK);
    close_pool(&b);
    return info;
}

Test(pool_grow_budget, a_pending_block_is_waited_for_rather_than_stranded)
{
    uint64_t waits = 0;
    ps_resource_info_t with = reuse_of_a_pending_block(110, &waits);
    cr_assert_eq(with.bytes_reserved, 8 * PS_MiB, "the pending block served the request");
    cr_assert_eq(with.pending_waits, 1);
    cr_assert_eq(waits, 1, "one host wait");
    ps_resource_info_t without = reuse_of_a_pending_block(0, &waits);
    cr_assert_eq(without.bytes_reserved, 12 * PS_MiB, "budget off: the pool grew beside the pending block");
    cr_assert_eq(without.pending_waits, 0);
    cr_assert_eq(waits, 0);
}
