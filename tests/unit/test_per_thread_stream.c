/* The per-thread default stream (PS_STREAM_PER_THREAD, cudaStreamPerThread
 * and every _ptsz entry point) is one handle that names a different stream
 * on every thread. A resource that kept a free list per stream handle would
 * hand a block one thread freed on its stream to another thread's stream,
 * with nothing ordering the two: a kernel of the first may still use it.
 * So every resource takes such a block back the cudaFree way (an epoch, a
 * fence or a barrier over every stream), as the pool always did
 * (core/pool.c). Here, over the fake GPU whose fences complete only when the
 * test says: a block freed on the per-thread stream is not handed out again
 * on the per-thread stream unless something orders the two uses: its fence
 * completed (none does here) or a barrier was issued after the free (a
 * barrier orders every later GPU call after every earlier one). */
#include <criterion/criterion.h>

#include "../../core/arena.h"
#include "../../core/fixed_size.h"
#include "../../tools/sim/fake_gpu.h"
#include "../../core/pool.h"
#include "../../core/upstream.h"

typedef struct {
    ps_gpu_ops_t *gpu;        /* fake device: fences wait for the test */
    ps_resource_t *upstream;  /* cuda upstream over it */
    ps_resource_t *resource;  /* under test */
} per_thread_fixture_t;

static void open_fixture(per_thread_fixture_t *f)
{
    ps_fake_gpu_options_t h = {.capacity = 1ull << 32};
    cr_assert_eq(ps_fake_gpu_create(&h, &f->gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f->gpu, &f->upstream), PS_OK);
}

static void close_fixture(per_thread_fixture_t *f)
{
    ps_fake_gpu_complete_all(f->gpu);
    ps_destroy(f->resource);
    ps_destroy(f->upstream);
    ps_fake_gpu_destroy(f->gpu);
}

/* Frees a block on the per-thread stream, asks for the same size on it
 * again (what another thread would do), and says whether the freed block
 * came back with nothing ordering the two uses (no fence completed, no
 * barrier since the free). */
static int reused_before_its_fence(per_thread_fixture_t *f, size_t size)
{
    void *first = NULL, *again = NULL;
    cr_assert_eq(ps_allocate(f->resource, size, PS_STREAM_PER_THREAD, &first), PS_OK);
    cr_assert_eq(ps_deallocate(f->resource, first, size, PS_STREAM_PER_THREAD), PS_OK);
    uint64_t barriers = ps_fake_gpu_barriers(f->gpu);
    cr_assert_eq(ps_allocate(f->resource, size, PS_STREAM_PER_THREAD, &again), PS_OK);
    int reused = again == first && ps_fake_gpu_barriers(f->gpu) == barriers;
    cr_assert_eq(ps_deallocate(f->resource, again, size, PS_STREAM_PER_THREAD), PS_OK);
    return reused;
}

Test(per_thread_stream, fixed_size_does_not_hand_a_block_to_another_threads_stream)
{
    per_thread_fixture_t f;
    open_fixture(&f);
    ps_fixed_size_options_t o;
    ps_fixed_size_options_default(&o);
    o.block_size = 1 << 20;
    cr_assert_eq(ps_fixed_size_create("fixed", f.upstream, f.gpu, &o, &f.resource), PS_OK);
    cr_expect_not(reused_before_its_fence(&f, 1 << 20), "fixed_size reused a per-thread-stream block at once");
    close_fixture(&f);
}

Test(per_thread_stream, the_arena_does_not_hand_a_block_to_another_threads_stream)
{
    per_thread_fixture_t f;
    open_fixture(&f);
    ps_arena_options_t o;
    ps_arena_options_default(&o);
    cr_assert_eq(ps_arena_create("arena", f.upstream, f.gpu, &o, &f.resource), PS_OK);
    cr_expect_not(reused_before_its_fence(&f, 4096), "the arena reused a small per-thread-stream block at once");
    cr_expect_not(reused_before_its_fence(&f, 64 << 20), "the arena reused a large per-thread-stream block at once");
    close_fixture(&f);
}

Test(per_thread_stream, the_pool_does_not_hand_a_block_to_another_threads_stream)
{
    per_thread_fixture_t f;
    open_fixture(&f);
    ps_pool_options_t o;
    ps_pool_options_default(&o);
    o.thread_cache = 0; /* (the thread cache is per thread: it may keep a block for the same thread) */
    cr_assert_eq(ps_pool_create("pool", f.upstream, f.gpu, &o, &f.resource), PS_OK);
    cr_expect_not(reused_before_its_fence(&f, 1 << 20), "the pool reused a per-thread-stream block at once");
    close_fixture(&f);
}
