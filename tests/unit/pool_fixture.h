/* Shared set-up of the pool tests: a fake device (tools/sim/fake_gpu.c), the
 * `cuda` upstream over it, and a pool over that. */
#ifndef PS_TEST_POOL_FIXTURE_H
#define PS_TEST_POOL_FIXTURE_H

#include "../../tools/sim/fake_gpu.h"
#include "../../core/pool.h"
#include "../../core/upstream.h"

#include <criterion/criterion.h>

typedef struct pool_fixture {
    ps_gpu_ops_t *gpu;       /* the fake device */
    ps_resource_t *upstream; /* cuda upstream over it */
    ps_resource_t *pool;     /* the pool under test */
} pool_fixture_t;

/* A pool with `opts` over a fake device with `host`'s options. */
static inline void fixture_open_on(pool_fixture_t *f, ps_fake_gpu_options_t host, const ps_pool_options_t *opts)
{
    cr_assert_eq(ps_fake_gpu_create(&host, &f->gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f->gpu, &f->upstream), PS_OK);
    cr_assert_eq(ps_pool_create("test", f->upstream, f->gpu, opts, &f->pool), PS_OK);
}

/* backed: real host memory; capacity: device bytes (0 = unlimited). */
static inline void fixture_open(pool_fixture_t *f, int backed, size_t capacity, const ps_pool_options_t *opts)
{
    fixture_open_on(f, (ps_fake_gpu_options_t){.capacity = capacity, .backed = backed}, opts);
}

/* Destroys everything and checks the device got every byte back. */
static inline void fixture_close(pool_fixture_t *f)
{
    ps_destroy(f->pool);
    ps_destroy(f->upstream);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f->gpu), 0, "the fake device still has bytes outstanding");
    ps_fake_gpu_destroy(f->gpu);
}

static inline ps_resource_info_t fixture_info(ps_resource_t *r)
{
    ps_resource_info_t info = {0};
    ps_query(r, &info);
    return info;
}

/* Options for small deterministic tests: no epoch spin, small chunks,
 * every request cut from the front of its block, no thread cache. */
static inline ps_pool_options_t small_pool_options(void)
{
    ps_pool_options_t o;
    ps_pool_options_default(&o);
    o.min_chunk = 2 * PS_MiB;
    o.max_chunk = 64 * PS_MiB;
    o.epoch_wait_ns = 0;
    o.small_from_back = 0; /* tests that check addresses expect front cuts */
    o.thread_cache = 0;    /* the pool's own lists and checks; test_thread_cache.c covers the cache */
    o.barrier_floor = 0;   /* barriers where the tests expect them; test_pool_barrier.c covers the floor */
    o.expandable_map_first = 0; /* maps where the tests expect them; test_pool_runs.c covers it */
    o.expandable_piece = 2 * PS_MiB;          /* the layouts the tests draw are in 2 MiB pieces */
    o.expandable_setup_run_min = 16 * PS_MiB; /* and their setup runs from 16 MiB (test_pool_runs.c) */
    return o;
}

#endif
