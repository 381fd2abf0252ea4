/* The pinned pool against the 1.15x target on the CuPy copy pipeline
 * (tools/bench/pinned/cupy_pipeline.py), modelled on the CPU
 * (tests/unit/host_pipeline_model.h: random buffers of 256 KiB..24 MiB, up
 * to 8 copies in flight, each buffer freed once its copy is done, a GPU
 * that lags the host).
 *
 * What the model shows about the slab pool (host.expandable = 0, or a
 * driver that cannot map host pieces): 1.35x-1.74x
 * peak reserved over peak requested (the H100 run: 1.32x), with a host
 * wait on every second or third step. At the reserved peak little or
 * nothing is pending (0-4 MiB: the growth bound has just waited for it):
 * 24-54 MiB are free but in holes smaller than the request. Blocks
 * that merge across growth do not change that (one host range without
 * giving memory back: 1.30x-1.61x): with four or five live buffers
 * of random sizes up to 24 MiB, the holes between live buffers are as big
 * as the buffers. What helps is giving free memory back from the middle
 * before growing: host.expandable (core/host_vm.h) with its growth budget,
 * which is the default stack now wherever the driver can (the last tests). */
#include "host_pipeline_model.h"

#define SEEDS 3

static void log_result(const char *what, unsigned depth, uint64_t seed, const pipeline_result_t *r)
{
    char text[96];
    snprintf(text, sizeof text, "%s, depth %u, seed %llu", what, depth, (unsigned long long)seed);
    pipeline_log(text, r);
}

Test(pool_host_pipeline, slab_pool_misses_the_target_by_fragmentation_not_by_pending_blocks)
{
    ps_config_t *cfg = pipeline_config("host.expandable=0");
    pipeline_params_t p = pipeline_defaults();
    double worst = 0;
    for (unsigned depth = 2; depth <= 8; depth *= 2) {
        p.depth = depth;
        for (uint64_t seed = 4321; seed < 4321 + SEEDS; seed++) {
            p.seed = seed;
            pipeline_result_t r = pipeline_run(cfg, NULL, &p);
            log_result("host.expandable=0", depth, seed, &r);
            cr_assert_not(r.expandable);
            cr_assert_leq(r.pending_at_peak, r.reserved_peak / 10, "pending blocks are not the cause here");
            cr_assert_geq(r.free_at_peak, r.reserved_peak / 5, "free but stranded memory is");
            if (pipeline_ratio(&r) > worst)
                worst = pipeline_ratio(&r);
        }
    }
    cr_assert_gt(worst, 1.25, "the model no longer reproduces the H100's 1.32x (worst %.3fx)", worst);
    ps_config_free(cfg);
}

Test(pool_host_pipeline, merging_across_growth_alone_does_not_help)
{
    /* one host range (host.expandable), nothing given back before growing */
    ps_config_t *cfg = pipeline_config("host.expandable=1,host.grow_budget_percent=0");
    pipeline_params_t p = pipeline_defaults();
    double best = 10;
    for (unsigned depth = 2; depth <= 8; depth *= 2) {
        p.depth = depth;
        for (uint64_t seed = 4321; seed < 4321 + SEEDS; seed++) {
            p.seed = seed;
            pipeline_result_t r = pipeline_run(cfg, NULL, &p);
            log_result("one host range, merging, nothing given back", depth, seed, &r);
            if (pipeline_ratio(&r) < best)
                best = pipeline_ratio(&r);
        }
    }
    cr_assert_gt(best, 1.25, "best %.3fx", best);
    ps_config_free(cfg);
}

/* The default [host] stack (host.expandable auto: the one host range
 * where the driver can, with its default budget of 110 %): pending blocks
 * are waited for, then free pieces go back, holes first, before the range
 * grows past 110 % of the most bytes in use. 1.01-1.11x at every depth
 * and seed; the price is host waits (on 52-64 % of the steps instead of
 * 31-52 %) and pieces mapped again (121-264 pieces of 2 MiB, each charged
 * as cuMemHostAlloc's pinning time, which is more than the 0.55 ms the
 * H100 measured for cuMemCreate + cuMemMap of a host piece, and an unmap
 * that synchronizes): the modelled run takes 7-38 % longer than with
 * slabs. */
Test(pool_host_pipeline, default_pinned_stack_meets_the_target)
{
    ps_config_t *cfg = pipeline_config("");
    ps_config_t *slabs = pipeline_config("host.expandable=0");
    pipeline_params_t p = pipeline_defaults();
    double worst = 0;
    for (unsigned depth = 2; depth <= 8; depth *= 2) {
        p.depth = depth;
        for (uint64_t seed = 4321; seed < 4321 + SEEDS; seed++) {
            p.seed = seed;
            pipeline_result_t r = pipeline_run(cfg, NULL, &p), before = pipeline_run(slabs, NULL, &p);
            log_result("default [host]", depth, seed, &r);
            cr_assert(r.expandable, "the default stack is the host range where the driver can");
            cr_assert_leq(pipeline_ratio(&r), 1.15, "depth %u seed %llu: %.3fx reserved/requested", depth,
                          (unsigned long long)seed, pipeline_ratio(&r));
            cr_assert_lt(r.bound_waits, p.steps * 3 / 4, "depth %u: %llu host waits in %u steps", depth,
                         (unsigned long long)r.bound_waits, p.steps);
            cr_assert_lt(r.wall_ns, before.wall_ns * 3 / 2, "depth %u: %.0f ms against %.0f ms with slabs", depth,
                         r.wall_ns / 1e6, before.wall_ns / 1e6);
            if (pipeline_ratio(&r) > worst)
                worst = pipeline_ratio(&r);
        }
    }
    cr_log_info("default [host] stack on the CuPy pipeline model: worst %.3fx reserved/requested (target 1.15x)",
                worst);
    ps_config_free(slabs);
    ps_config_free(cfg);
}

/* Without host-located pieces (a driver before CUDA 12.2, or no virtual
 * memory) the default stack is slabs. */
Test(pool_host_pipeline, default_stack_without_host_pieces_is_slabs)
{
    ps_config_t *cfg = pipeline_config("");
    pipeline_params_t p = pipeline_defaults();
    p.no_host_vm = 1;
    pipeline_result_t r = pipeline_run(cfg, NULL, &p);
    log_result("default [host], no host pieces", p.depth, p.seed, &r);
    cr_assert_not(r.expandable);
    cr_assert_eq(r.slabs_taken > 0, 1, "slabs were taken");
    ps_config_free(cfg);
}
