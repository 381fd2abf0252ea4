/* Runs (core/vm_range.h, options expandable_run_min and
 * expandable_setup_run_min): a growth of at least run_min bytes, or before
 * the pool's first free one for a request of at least setup_run_min, maps
 * one physical allocation instead of one per piece; a
 * run goes back only whole, and remap and trim never cut one. The fake
 * device (tools/sim/fake_gpu.c) refuses an unmap whose size is not that of the
 * mapping, as CUDA refuses a cuMemUnmap of part of a mapping. */
#include "pool_fixture.h"

#include <stdlib.h>
#include <string.h>

/* An expandable pool over a fake device with virtual memory (2 MiB
 * granularity), run_min and expandable_setup_run_min as given, no remap
 * unless asked. */
static void open_runs_pool_setup(pool_fixture_t *f, size_t run_min, size_t setup_run_min, int remap, size_t capacity)
{
    ps_pool_options_t o = small_pool_options();
    o.expandable_run_min = run_min;
    o.expandable_setup_run_min = setup_run_min;
    o.remap = remap;
    o.remap_lend = remap;
    fixture_open_on(f, (ps_fake_gpu_options_t){.virtual_memory = 1, .capacity = capacity}, &o);
    cr_assert(ps_pool_is_expandable(f->pool));
}

/* The same without setup runs (the tests of run_min alone). */
static void open_runs_pool(pool_fixture_t *f, size_t run_min, int remap, size_t capacity)
{
    open_runs_pool_setup(f, run_min, 0, remap, capacity);
}

Test(pool_runs, a_large_growth_is_one_physical_allocation)
{
    pool_fixture_t f;
    open_runs_pool(&f, PS_GiB, 1, 0);
    uint64_t maps = ps_fake_gpu_vm_maps(f.gpu);
    void *big, *small;
    cr_assert_eq(ps_allocate(f.pool, 8 * PS_GiB, PS_STREAM_NONE, &big), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), maps + 1, "8 GiB in one create + map + access, not 4096");
    cr_assert_eq(fixture_info(f.pool).upstream_allocs, 1, "the statistics count runs mapped");
    cr_assert_eq(ps_allocate(f.pool, 3 * PS_MiB, PS_STREAM_NONE, &small), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), maps + 3, "below run_min: piece by piece (2 pieces)");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, big, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, small, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, until_the_first_free_a_setup_sized_request_is_one_run)
{
    /* expandable_setup_run_min: what a program makes before its first free
     * (weights, peer buffers) is one physical allocation from 64 MiB up;
     * after the first free the loop's growths map pieces again, which
     * remap can move */
    pool_fixture_t f;
    open_runs_pool_setup(&f, PS_GiB, 64 * PS_MiB, 1, 0);
    void *a, *b, *small, *c;
    uint64_t maps = ps_fake_gpu_vm_maps(f.gpu);
    cr_assert_eq(ps_allocate(f.pool, 96 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), maps + 1, "96 MiB before any free: one run, not 48 pieces");
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), maps + 2, "64 MiB (the threshold itself): one run");
    cr_assert_eq(ps_allocate(f.pool, 8 * PS_MiB, PS_STREAM_NONE, &small), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), maps + 6, "below the threshold: piece by piece (4 pieces)");
    cr_assert_eq(ps_deallocate(f.pool, small, 0, PS_STREAM_NONE), PS_OK);
    maps = ps_fake_gpu_vm_maps(f.gpu);
    cr_assert_eq(ps_allocate(f.pool, 96 * PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    uint64_t grown = ps_fake_gpu_vm_maps(f.gpu) - maps;
    cr_assert(grown >= 40, "after the first free, 96 MiB maps pieces again (%llu maps)", (unsigned long long)grown);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, b, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, c, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

/* Whether `p` is the first byte of one physical allocation of `size`
 * bytes (the fake's ipc_export names the mapping that holds an address). */
static int one_allocation(pool_fixture_t *f, void *p, size_t size)
{
    uintptr_t start = 0;
    size_t mapped = 0;
    return f->gpu->ipc_export(f->gpu->ctx, (uintptr_t)p, &start, &mapped, NULL) == PS_OK &&
           start == (uintptr_t)p && mapped == size;
}

Test(pool_runs, a_setup_buffer_beside_a_small_block_is_one_allocation_from_its_first_byte)
{
    /* a copy pays for every allocation it crosses, an IPC export sends
     * every piece, and a handle names one allocation: a 32 MiB buffer made
     * after a small one is not cut from the small one's piece (joined, it
     * started in that piece's free tail and spanned two allocations) */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    fixture_open_on(&f, (ps_fake_gpu_options_t){.virtual_memory = 1, .backed = 1, .shareable = 1, .capacity = 256 * PS_MiB}, &o);
    void *flag, *a, *b;
    cr_assert_eq(ps_allocate(f.pool, 256, PS_STREAM_NONE, &flag), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 32 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert(one_allocation(&f, a, 32 * PS_MiB), "the first buffer is one allocation from its first byte");
    cr_assert_eq(ps_allocate(f.pool, 40 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert(one_allocation(&f, b, 40 * PS_MiB), "the second too");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 74 * PS_MiB, "the flag's piece and the two runs");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, b, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, flag, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, near_a_full_device_a_run_alone_that_does_not_fit_joins_the_free_tail)
{
    /* 32 MiB of device: the flag's piece and a 31 MiB request's run apart
     * would be 34 MiB; joined to the flag's free tail, 30 MiB more fit */
    pool_fixture_t f;
    open_runs_pool_setup(&f, PS_GiB, 16 * PS_MiB, 0, 32 * PS_MiB);
    void *flag, *a;
    cr_assert_eq(ps_allocate(f.pool, 256, PS_STREAM_NONE, &flag), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 31 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 32 * PS_MiB, "the whole device, the tail joined");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, flag, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, the_first_piece_is_mapped_with_the_pool)
{
    /* expandable_map_first: a program's first small allocation maps
     * nothing; a setup buffer after it is still one allocation of its own */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.expandable_map_first = 1;
    fixture_open_on(&f, (ps_fake_gpu_options_t){.virtual_memory = 1, .backed = 1, .shareable = 1}, &o);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), 1, "one piece mapped when the pool was made");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 2 * PS_MiB);
    void *small, *big;
    cr_assert_eq(ps_allocate(f.pool, 400 * 1024, PS_STREAM_NONE, &small), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), 1, "the first small allocation maps nothing");
    cr_assert_eq(ps_allocate(f.pool, 32 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    cr_assert(one_allocation(&f, big, 32 * PS_MiB), "a setup buffer apart from the first piece");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, small, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, big, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, a_first_piece_that_cannot_be_mapped_is_left_to_the_first_growth)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.expandable_map_first = 1;
    cr_assert_eq(ps_fake_gpu_create(&(ps_fake_gpu_options_t){.virtual_memory = 1}, &f.gpu), PS_OK);
    cr_assert_eq(ps_fake_gpu_fail_call(f.gpu, PS_FAKE_OP_VM_MAP, 1, PS_ENOMEM), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK, "the pool is made all the same");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0);
    void *p;
    cr_assert_eq(ps_allocate(f.pool, 256, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 2 * PS_MiB, "the first growth mapped it");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, p, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, setup_runs_off_maps_piece_by_piece)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.expandable_setup_run_min = 0;
    fixture_open_on(&f, (ps_fake_gpu_options_t){.virtual_memory = 1}, &o);
    uint64_t maps = ps_fake_gpu_vm_maps(f.gpu);
    void *a;
    cr_assert_eq(ps_allocate(f.pool, 96 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), maps + 48, "0: 96 MiB in 48 pieces");
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, a_large_request_beside_a_free_tail_is_one_run)
{
    /* a small block first leaves a free tail in its piece; the 1 GiB
     * request is one run all the same (piece by piece the 1 GiB - 2 MiB
     * the tail lacked was 511 maps, 25.8 ms on an H200 against 0.45 ms),
     * and a run of its own: joining the tail would save less than an
     * eighth of it, and apart the block is one physical allocation */
    pool_fixture_t f;
    open_runs_pool(&f, PS_GiB, 1, 0);
    void *small, *big;
    cr_assert_eq(ps_allocate(f.pool, 256, PS_STREAM_NONE, &small), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, small, 0, PS_STREAM_NONE), PS_OK);
    uint64_t maps = ps_fake_gpu_vm_maps(f.gpu);
    cr_assert_eq(ps_allocate(f.pool, PS_GiB, PS_STREAM_NONE, &big), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), maps + 1, "one create + map + access for the 1 GiB");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, PS_GiB + 2 * PS_MiB, "the run beside the free piece, not joined");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, big, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, the_range_is_reserved_with_the_pool_and_a_failed_reservation_waits_for_the_first_growth)
{
    /* the first range is reserved when the pool is made (not by its first
     * growth); when that fails the pool is made anyway, still expandable,
     * and its first growth reserves the range (one more try); when that
     * fails too, the allocation answers "out of memory" and nothing is held */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    fixture_open_on(&f, (ps_fake_gpu_options_t){.virtual_memory = 1}, &o);
    cr_assert_eq(ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_RESERVE), 1, "reserved with the pool");
    cr_assert_eq(ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_MAP), 0, "nothing mapped");
    void *p;
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_RESERVE), 1, "the first growth reserved nothing more");
    cr_assert_eq(ps_deallocate(f.pool, p, 0, PS_STREAM_NONE), PS_OK);
    ps_destroy(f.pool);

    /* the reservation at creation fails: the first growth reserves */
    cr_assert_eq(ps_fake_gpu_fail_call(f.gpu, PS_FAKE_OP_VM_RESERVE, 2, PS_ENOMEM), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    cr_assert(ps_pool_is_expandable(f.pool));
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_RESERVE), 3, "reserved by the first growth");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, p, 0, PS_STREAM_NONE), PS_OK);
    ps_destroy(f.pool);

    /* every reservation fails (the one at creation, the growth's and the
     * pool's retry after out of memory): out of memory, nothing reserved
     * or mapped, and the next try works */
    cr_assert_eq(ps_fake_gpu_fail_call(f.gpu, PS_FAKE_OP_VM_RESERVE, 4, PS_ENOMEM), PS_OK);
    cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    cr_assert_eq(ps_fake_gpu_fail_call(f.gpu, PS_FAKE_OP_VM_RESERVE, 5, PS_ENOMEM), PS_OK);
    cr_assert_eq(ps_fake_gpu_fail_call(f.gpu, PS_FAKE_OP_VM_RESERVE, 6, PS_ENOMEM), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &p), PS_ENOMEM);
    cr_assert_eq(ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_RESERVE), 6);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0);
    cr_assert_eq(ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_MAP), 2, "no map since the first pool's");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, p, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, run_min_zero_maps_piece_by_piece)
{
    /* the negative control of the test above: without runs the same
     * growth is 4096 pieces */
    pool_fixture_t f;
    open_runs_pool(&f, 0, 1, 0);
    uint64_t maps = ps_fake_gpu_vm_maps(f.gpu);
    void *big;
    cr_assert_eq(ps_allocate(f.pool, 8 * PS_GiB, PS_STREAM_NONE, &big), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), maps + 4096);
    cr_assert_eq(ps_deallocate(f.pool, big, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, a_run_goes_back_only_when_wholly_free)
{
    pool_fixture_t f;
    open_runs_pool(&f, 64 * PS_MiB, 0, 0);
    void *a, *x;
    cr_assert_eq(ps_allocate(f.pool, 128 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, a, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &x), PS_OK);
    cr_assert_eq(x, a, "cut from the run's front");
    uint64_t unmaps = ps_fake_gpu_vm_unmaps(f.gpu);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_unmaps(f.gpu), unmaps, "the run holds a live block: nothing goes back");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 128 * PS_MiB);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 128 * PS_MiB);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, x, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_unmaps(f.gpu), unmaps + 1, "then the whole run in one unmap");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 0);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, a_free_block_over_part_of_a_run_gives_back_the_whole_runs_inside)
{
    /* the lower run holds a live 1 MiB block at its front; the free block
     * after it covers the rest of that run and all of the other: trim
     * unmaps the other alone
     * (cutting at piece bounds instead, the unmap of part of run 1 is
     * refused and nothing goes back) */
    pool_fixture_t f;
    open_runs_pool(&f, 64 * PS_MiB, 0, 0);
    void *r1, *r2, *x;
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &r1), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &r2), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), 2);
    cr_assert_eq(ps_deallocate(f.pool, r1, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, r2, 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, PS_MiB, PS_STREAM_NONE, &x), PS_OK);
    cr_assert_eq(x, r1 < r2 ? r1 : r2, "at the front of the free block: the lower run (each run was mapped alone)");
    uint64_t unmaps = ps_fake_gpu_vm_unmaps(f.gpu);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_unmaps(f.gpu), unmaps + 1, "run 2 went back in one unmap");
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 64 * PS_MiB, "the lower run stays: it holds x");
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 64 * PS_MiB);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, x, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, pieces_beside_a_run_still_go_back_alone)
{
    /* small growths stay pieces: a free piece between live ones goes back
     * from the middle even when a run lies beside it */
    pool_fixture_t f;
    open_runs_pool(&f, 64 * PS_MiB, 0, 0);
    void *p[3], *big;
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ps_allocate(f.pool, 2 * PS_MiB, PS_STREAM_NONE, &p[i]), PS_OK);
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, p[1], 0, PS_STREAM_NONE), PS_OK);
    uint64_t unmaps = ps_fake_gpu_vm_unmaps(f.gpu);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_unmaps(f.gpu), unmaps + 1);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 68 * PS_MiB);
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, p[0], 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, p[2], 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.pool, big, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

/* A random workload of small and large requests with remap and lending on
 * and trims in between: after every step the pool's checker (unmapped and
 * lent blocks never cut a run) passes, the fake never saw an unmap of
 * part of a mapping (it would have refused it: a leak at close), and no
 * unmap came before the GPU was done with the blocks freed there (the
 * fake's precise judge, fed every free; its coarse one, any fence still
 * incomplete, failed the waiting variant on 23 of 30 seeds where the
 * precise one fails none; with ps_pool_test_skip_idle_check it fails
 * every seed of both variants). */
static void random_runs_steps(int lend, unsigned seed, int steps);

static void random_runs(int lend, unsigned seed)
{
    random_runs_steps(lend, seed, 4000);
}

static void random_runs_steps(int lend, unsigned seed, int steps)
{
    pool_fixture_t f;
    open_runs_pool(&f, 16 * PS_MiB, 1, 0);
    if (!lend) {
        ps_destroy(f.pool);
        ps_pool_options_t o = small_pool_options();
        o.expandable_run_min = 16 * PS_MiB;
        o.remap_lend = 0;
        cr_assert_eq(ps_pool_create("test", f.upstream, f.gpu, &o, &f.pool), PS_OK);
    }
    enum { LIVE = 48 };
    void *live[LIVE] = {0};
    size_t sizes[LIVE] = {0};
    srand(seed);
    for (int step = 0; step < steps; step++) {
        int i = rand() % LIVE;
        if (live[i]) {
            /* the fake judges each unmap by the frees of its granules (an
             * unmap is unsafe while no barrier or fence issued after such a
             * free has completed) */
            cr_assert_eq(ps_fake_gpu_note_free(f.gpu, live[i], sizes[i]), PS_OK);
            cr_assert_eq(ps_deallocate(f.pool, live[i], 0, PS_STREAM_NONE), PS_OK);
            live[i] = NULL;
        } else {
            size_t size = rand() % 4 ? (size_t)(rand() % 4096 + 1) * 1024 : (size_t)(rand() % 96 + 1) * PS_MiB;
            cr_assert_eq(ps_allocate(f.pool, size, PS_STREAM_NONE, &live[i]), PS_OK, "step %d", step);
            sizes[i] = size;
        }
        if (step % 97 == 0)
            cr_assert_eq(ps_trim(f.pool), PS_OK);
        cr_assert_eq(ps_pool_check(f.pool), PS_OK, "step %d", step);
    }
    ps_resource_info_t info = fixture_info(f.pool);
    cr_log_info("runs random (lend %d): %llu runs mapped, remaps %llu idle, %llu lent, %llu waits, %llu syncs", lend,
                (unsigned long long)info.upstream_allocs, (unsigned long long)info.remaps_idle,
                (unsigned long long)info.remaps_lent, (unsigned long long)info.remap_waits,
                (unsigned long long)info.remap_syncs);
    cr_assert_gt(info.remaps_idle + info.remaps_lent + info.remap_waits + info.remap_syncs, 0,
                 "the workload moved free runs to a growth");
    for (int i = 0; i < LIVE; i++)
        if (live[i])
            cr_assert_eq(ps_deallocate(f.pool, live[i], 0, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_trim(f.pool), PS_OK);
    cr_assert_eq(fixture_info(f.pool).bytes_reserved, 0, "every run went back");
    cr_assert_eq(ps_fake_gpu_unsafe_unmaps(f.gpu), 0);
    fixture_close(&f);
}

Test(pool_runs, random_workload_with_remap_never_cuts_a_run) { random_runs(0, 7); }
Test(pool_runs, random_workload_with_lending_never_cuts_a_run) { random_runs(1, 11); }

/* A growth mapped alone (a run: plan_alone_locked) into an unmapped hole
 * just below a ready free block leaves a piece of the hole unmapped
 * between the two, so that the new memory does not merge with the free
 * block; the hole then has an unmapped rest on both sides. The pool once
 * kept only the rest below, so the unmapped gap joined the new block and
 * the free block above it, and could be handed out (the checker refuses
 * a free block over unmapped pieces). 52 of 150 seeds of this workload did
 * that; these are a few of them, each checked at every step. */
Test(pool_runs, a_run_mapped_alone_below_a_free_block_keeps_the_gap_unmapped)
{
    static const unsigned seeds[] = {1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 13, 14};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++)
        random_runs_steps(0, seeds[i], 1500);
}

Test(pool_runs, a_growth_of_many_pieces_gives_access_once)
{
    /* below run_min a growth maps a run per piece, bare, and makes them
     * accessible with one call (an access call costs ~100 us whatever it
     * covers); the fake keeps bare memory PROT_NONE, so the write below
     * faults if the call is missing */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.expandable_setup_run_min = 0; /* (pieces, as after the first free) */
    fixture_open_on(&f, (ps_fake_gpu_options_t){.virtual_memory = 1, .backed = 1, .capacity = 512 * PS_MiB}, &o);
    uint64_t maps = ps_fake_gpu_vm_maps(f.gpu), calls = ps_fake_gpu_vm_access_calls(f.gpu);
    void *p;
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_maps(f.gpu), maps + 32, "32 pieces");
    cr_assert_eq(ps_fake_gpu_vm_access_calls(f.gpu), calls + 1, "one access call for all of them");
    cr_assert_eq(ps_fake_gpu_vm_bare_bytes(f.gpu), 0, "nothing left without access");
    memset(p, 0x5a, 64 * PS_MiB);
    cr_assert_eq(((unsigned char *)p)[64 * PS_MiB - 1], 0x5a);
    cr_assert_eq(ps_deallocate(f.pool, p, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, without_a_batch_access_each_piece_gets_its_own)
{
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    fixture_open_on(&f, (ps_fake_gpu_options_t){.virtual_memory = 1, .backed = 1, .no_vm_access = 1, .capacity = 512 * PS_MiB}, &o);
    void *p;
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_fake_gpu_vm_access_calls(f.gpu), 0);
    memset(p, 0x5a, 64 * PS_MiB);
    cr_assert_eq(ps_deallocate(f.pool, p, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}

Test(pool_runs, a_failed_access_call_leaves_nothing_mapped)
{
    /* the 33rd vm_map-counted call of a 32-piece growth is its access
     * call: it fails, the growth unmaps its bare pieces, and the pool's
     * retry maps them again with access */
    pool_fixture_t f;
    ps_pool_options_t o = small_pool_options();
    o.expandable_setup_run_min = 0; /* (pieces, as after the first free) */
    fixture_open_on(&f, (ps_fake_gpu_options_t){.virtual_memory = 1, .backed = 1, .capacity = 512 * PS_MiB}, &o);
    uint64_t before = ps_fake_gpu_calls(f.gpu, PS_FAKE_OP_VM_MAP), unmaps = ps_fake_gpu_vm_unmaps(f.gpu);
    cr_assert_eq(ps_fake_gpu_fail_call(f.gpu, PS_FAKE_OP_VM_MAP, before + 33, PS_EUPSTREAM), PS_OK);
    void *p;
    cr_assert_eq(ps_allocate(f.pool, 64 * PS_MiB, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(ps_fake_gpu_faults_fired(f.gpu, NULL, NULL), 1, "the access call failed once");
    cr_assert_eq(ps_fake_gpu_vm_unmaps(f.gpu), unmaps + 32, "the failed growth's 32 bare pieces were unmapped");
    cr_assert_eq(ps_fake_gpu_vm_access_calls(f.gpu), 1, "the retry gave access");
    cr_assert_eq(ps_fake_gpu_vm_bare_bytes(f.gpu), 0);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 64 * PS_MiB, "nothing leaked");
    cr_assert_eq(ps_pool_check(f.pool), PS_OK);
    memset(p, 1, 64 * PS_MiB);
    cr_assert_eq(ps_deallocate(f.pool, p, 0, PS_STREAM_NONE), PS_OK);
    fixture_close(&f);
}
