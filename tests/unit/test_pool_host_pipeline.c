/* The pinned pool against the 1.15x target on the CuPy copy pipeline
 * (tools/bench/pinned/cupy_pipeline.py), modelled on the CPU
 * (tests/unit/host_pipeline_model.h: random buffers of 256 KiB..24 MiB, up
 * to 8 copies in flight, each buffer freed once its copy is done, a GPU
 * that lags the host).
 *
 * What the model shows about the default [host] pool (chunks): 1.35x-1.74x
 * peak reserved over peak requested (the H100 run: 1.32x), with a host
 * wait on every second or third step. At the reserved peak nothing is
 * pending (the growth bound has just waited for it): 25-54 MiB are free
 * but in holes smaller than the request, between and inside slabs. Blocks
 * that merge across growth do not change that (one expandable range
 * without giving memory back: 1.31x-1.70x): with four or five live buffers
 * of random sizes up to 24 MiB, the holes between live buffers are as big
 * as the buffers. What helps is giving free memory back from the middle
 * before growing. */
#include "host_pipeline_model.h"

#define SEEDS 3

static void log_result(const char *what, unsigned depth, uint64_t seed, const pipeline_result_t *r)
{
    char text[96];
    snprintf(text, sizeof text, "%s, depth %u, seed %llu", what, depth, (unsigned long long)seed);
    pipeline_log(text, r);
}

Test(pool_host_pipeline, default_pool_misses_the_target_by_fragmentation_not_by_pending_blocks)
{
    ps_config_t *cfg = pipeline_config("");
    pipeline_params_t p = pipeline_defaults();
    double worst = 0;
    for (unsigned depth = 2; depth <= 8; depth *= 2) {
        p.depth = depth;
        for (uint64_t seed = 4321; seed < 4321 + SEEDS; seed++) {
            p.seed = seed;
            pipeline_result_t r = pipeline_run(cfg, NULL, &p);
            log_result("default [host]", depth, seed, &r);
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
    ps_config_t *cfg = pipeline_config("");
    pipeline_params_t p = pipeline_defaults();
    p.virtual_memory = 1;
    p.vm_granularity = 64 << 10;
    ps_pool_options_t o;
    ps_host_pool_options(&ps_config_global(cfg)->host, &o);
    o.expandable = 1; /* one range on the fake device's vm_*, nothing given back before growing */
    o.expandable_piece = 1 << 20;
    o.release_before_grow = 0;
    double best = 10;
    for (uint64_t seed = 4321; seed < 4321 + SEEDS; seed++) {
        p.seed = seed;
        pipeline_result_t r = pipeline_run(cfg, &o, &p);
        log_result("one range, merging, nothing given back", p.depth, seed, &r);
        if (pipeline_ratio(&r) < best)
            best = pipeline_ratio(&r);
    }
    cr_assert_gt(best, 1.25, "best %.3fx", best);
    ps_config_free(cfg);
}
