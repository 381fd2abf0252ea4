/* Shared set-up of the arena tests: a fake device (tools/sim/fake_gpu.c), the
 * `cuda` upstream over it, and an arena over that. */
#ifndef PS_TEST_ARENA_FIXTURE_H
#define PS_TEST_ARENA_FIXTURE_H

#include "../../core/arena.h"
#include "../../tools/sim/fake_gpu.h"
#include "../../core/upstream.h"

#include <criterion/criterion.h>

typedef struct arena_fixture {
    ps_gpu_ops_t *gpu;    /* the fake device */
    ps_resource_t *up;    /* the `cuda` upstream over it */
    ps_resource_t *arena; /* the arena under test */
} arena_fixture_t;

/* The device as `host` says, the arena with `opts` (NULL: the defaults). */
static inline void arena_fixture_open(arena_fixture_t *f, const ps_fake_gpu_options_t *host,
                                      const ps_arena_options_t *opts)
{
    cr_assert_eq(ps_fake_gpu_create(host, &f->gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f->gpu, &f->up), PS_OK);
    cr_assert_eq(ps_arena_create("arena", f->up, f->gpu, opts, &f->arena), PS_OK);
}

static inline void arena_fixture_close(arena_fixture_t *f)
{
    ps_destroy(f->arena);
    ps_destroy(f->up);
    ps_fake_gpu_destroy(f->gpu);
}

static inline ps_resource_info_t arena_info(ps_resource_t *r)
{
    ps_resource_info_t i = {0};
    ps_query(r, &i);
    return i;
}

#endif
