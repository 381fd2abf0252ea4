/* The pinned pool against the 1.15x target, on the CPU: the allocation
 * pattern of tools/bench/pinned/torch_loader.py with PyTorch's host cache
 * off, replayed over the fake device with a GPU that lags the host (fences
 * complete `lag` batches after they are recorded).
 *
 * Model: batch i at host time i * 10 ms asks for one image batch
 * (b * 150528 bytes: b samples of 3x224x224 uint8) and its labels (b * 8
 * bytes); PyTorch frees a batch's two blocks once its copy ran on the GPU,
 * `lag` batches later (it waits for the copy's event before cudaFreeHost);
 * the pool's fence for that free completes another `lag` batches later (it
 * covers all work queued at the free, like native cudaFreeHost's device
 * synchronization). b = 64 always (a DataLoader with a fixed batch size),
 * or a seeded random 16..128 ("varied").
 *
 * What the old [host] defaults (64 MiB / 50% growth bound, 8 MiB and 12%
 * growth steps, idle slabs kept) did: 2.7x-4.4x peak reserved over peak
 * requested with fixed batches; the new defaults (4 MiB / 10% bound, slabs
 * of the request rounded to 64 KiB, at least 2 MiB, idle slabs given back
 * before growing) stay within 1.15x from lag 2 on. Varied batches do not
 * reach 1.15x: slabs never merge, and free space is stranded beside live
 * blocks (1.35-1.49x here, against 2.6-4.4x before). */
#include "pool_fixture.h"

#include <stdlib.h>
#include <string.h>

#include "../../config/config.h"
#include "../../core/host_vm.h"

#define BATCHES 300
#define HOST_STEP_NS 10000000ull /* 10 ms of host time per batch */
#define SAMPLE_BYTES 150528u     /* 3 x 224 x 224 uint8 */

typedef struct model_result {
    uint64_t requested_peak;  /* most bytes the program held at once */
    uint64_t reserved_peak;   /* most pinned bytes the pool held at once */
    uint64_t upstream_allocs; /* slabs taken (each a cudaHostAlloc on the GPU) */
    uint64_t bound_waits;     /* host waits the growth bound made */
} model_result_t;

typedef struct live_block {
    void *ptr;
    size_t size;
    uint64_t free_at_ns; /* when the program frees it */
} live_block_t;

static unsigned next_random(unsigned *state)
{
    *state = *state * 1103515245u + 12345u;
    return (*state >> 16) & 0x7fff;
}

static model_result_t run_model(const ps_pool_options_t *options, unsigned lag, int varied)
{
    ps_fake_gpu_options_t ho = {.backed = 0, .lag_ns = (uint64_t)lag * HOST_STEP_NS, .virtual_memory = options->expandable};
    ps_gpu_ops_t *gpu;
    cr_assert_eq(ps_fake_gpu_create(&ho, &gpu), PS_OK);
    ps_resource_t *upstream, *pool;
    cr_assert_eq(ps_host_resource_create("pinned", gpu, PS_HOST_ALLOC_PORTABLE | PS_HOST_ALLOC_MAPPED, &upstream),
                 PS_OK);
    ps_pool_options_t o = *options;
    o.epoch_wait_ns = 0; /* the simulated clock does not move while the pool polls */
    ps_gpu_ops_t *host_range = NULL; /* host.expandable: the pool works on a host range */
    if (o.expandable)
        cr_assert_eq(ps_host_vm_create(gpu, &host_range), PS_OK);
    cr_assert_eq(ps_pool_create("host", upstream, host_range ? host_range : gpu, &o, &pool), PS_OK);
    static live_block_t live[2 * BATCHES];
    size_t live_count = 0;
    uint64_t requested = 0;
    model_result_t r = {0};
    unsigned seed = 1234;
    for (unsigned i = 0; i < BATCHES; i++) {
        uint64_t now = (uint64_t)i * HOST_STEP_NS;
        ps_fake_gpu_set_clock(gpu, now);
        for (size_t k = 0; k < live_count;) { /* the batches whose copies ran */
            if (live[k].free_at_ns <= now) {
                cr_assert_eq(ps_deallocate(pool, live[k].ptr, live[k].size, PS_STREAM_NONE), PS_OK);
                requested -= live[k].size;
                live[k] = live[--live_count];
            } else {
                k++;
            }
        }
        size_t samples = varied ? 16 + next_random(&seed) % 113 : 64;
        size_t sizes[2] = {samples * SAMPLE_BYTES, samples * 8};
        for (int s = 0; s < 2; s++) {
            void *p = NULL;
            cr_assert_eq(ps_allocate(pool, sizes[s], PS_STREAM_NONE, &p), PS_OK);
            live[live_count++] = (live_block_t){p, sizes[s], now + (uint64_t)lag * HOST_STEP_NS};
            requested += sizes[s];
            if (requested > r.requested_peak)
                r.requested_peak = requested;
        }
    }
    for (size_t k = 0; k < live_count; k++)
        cr_assert_eq(ps_deallocate(pool, live[k].ptr, live[k].size, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_pool_check(pool), PS_OK);
    ps_resource_info_t info = {0};
    ps_query(pool, &info);
    r.reserved_peak = info.peak_bytes_reserved;
    r.upstream_allocs = info.upstream_allocs;
    r.bound_waits = info.pending_waits;
    ps_destroy(pool);
    ps_destroy(upstream);
    ps_host_vm_destroy(host_range);
    ps_fake_gpu_destroy(gpu);
    return r;
}

/* The pool options of [host] as the default configuration gives them. */
static ps_pool_options_t host_defaults(void)
{
    char *env[] = {NULL};
    ps_config_input_t in = {.options = "", .environ = env, .no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load(&in, &cfg), PS_OK);
    ps_pool_options_t o;
    ps_host_pool_options(&ps_config_global(cfg)->host, &o);
    ps_config_free(cfg);
    return o;
}

/* The [host] defaults with host.expandable = 0 (slabs; also what a driver
 * that cannot map pinned pieces into one range gets). */
static ps_pool_options_t slab_defaults(void)
{
    ps_pool_options_t o = host_defaults();
    o.expandable = 0;
    o.grow_budget_percent = 0;
    return o;
}

/* The slab defaults before they were tuned (the negative control). */
static ps_pool_options_t old_defaults(void)
{
    ps_pool_options_t o = slab_defaults();
    o.min_chunk = 8 * PS_MiB;
    o.growth_percent = 12;
    o.pending_wait_bytes = 64 * PS_MiB;
    o.pending_wait_percent = 50;
    o.release_before_grow = 0;
    o.chunk_granule = 0;
    return o;
}

static double ratio(model_result_t r)
{
    return (double)r.reserved_peak / (double)r.requested_peak;
}

Test(pool_host_model, slabs_with_fixed_batches_stay_within_the_target_from_lag_2)
{
    ps_pool_options_t o = slab_defaults();
    for (unsigned lag = 2; lag <= 16; lag *= 2) {
        model_result_t r = run_model(&o, lag, 0);
        cr_log_info("fixed batches, lag %u: requested peak %.1f MiB, reserved peak %.1f MiB (%.3fx), %llu slabs, "
                    "%llu bound waits",
                    lag, r.requested_peak / 1048576.0, r.reserved_peak / 1048576.0, ratio(r),
                    (unsigned long long)r.upstream_allocs, (unsigned long long)r.bound_waits);
        cr_assert_leq(ratio(r), 1.15, "lag %u: %.3fx", lag, ratio(r));
        cr_assert_leq(r.upstream_allocs, 2 * lag + 8, "lag %u: %llu slabs: the pool must reuse, not re-pin", lag,
                      (unsigned long long)r.upstream_allocs);
    }
}

Test(pool_host_model, old_defaults_held_several_times_what_was_asked)
{
    ps_pool_options_t o = old_defaults();
    for (unsigned lag = 2; lag <= 16; lag *= 2) {
        model_result_t r = run_model(&o, lag, 0);
        cr_log_info("fixed batches, old defaults, lag %u: %.3fx (%llu slabs, %llu bound waits)", lag, ratio(r),
                    (unsigned long long)r.upstream_allocs, (unsigned long long)r.bound_waits);
        cr_assert_geq(ratio(r), 2.0, "lag %u: %.3fx (the control must show the old waste)", lag, ratio(r));
    }
}

Test(pool_host_model, slabs_with_varied_batches_improve_but_miss_the_target)
{
    ps_pool_options_t now = slab_defaults(), before = old_defaults();
    for (unsigned lag = 2; lag <= 16; lag *= 2) {
        model_result_t r = run_model(&now, lag, 1), old = run_model(&before, lag, 1);
        cr_log_info("varied batches, lag %u: %.3fx (%llu slabs, %llu bound waits); old defaults %.3fx", lag,
                    ratio(r), (unsigned long long)r.upstream_allocs, (unsigned long long)r.bound_waits, ratio(old));
        cr_assert_leq(ratio(r), 1.7, "lag %u: %.3fx", lag, ratio(r));
        cr_assert_lt(ratio(r), ratio(old), "lag %u: %.3fx is no better than the old %.3fx", lag, ratio(r),
                     ratio(old));
    }
}

/* The default: host.expandable (auto: on where the driver can) is one
 * host range; before growing past 110 % of the most bytes in use, pending
 * blocks are waited for and free pieces given back:
 * both DataLoader patterns stay within the target, varied batches
 * 1.05-1.10x where slabs give 1.35-1.49x (bound waits 214/161/121/75
 * against 136/126/91/98 at lag 2/4/8/16); fixed batches 1.088x at every
 * lag, where slabs give 1.11/1.05/1.03/1.08x (the budget's 10 %; the same
 * waits). */
Test(pool_host_model, default_host_range_keeps_both_patterns_within_the_target)
{
    ps_pool_options_t o = host_defaults(), slabs = slab_defaults();
    cr_assert_eq(o.expandable, 1, "the default asks for the host range");
    for (int varied = 0; varied <= 1; varied++) {
        for (unsigned lag = 2; lag <= 16; lag *= 2) {
            model_result_t r = run_model(&o, lag, varied), before = run_model(&slabs, lag, varied);
            cr_log_info("%s batches, lag %u, host.expandable: %.3fx (%llu pieces mapped, %llu bound waits); slabs "
                        "%.3fx (%llu bound waits)",
                        varied ? "varied" : "fixed", lag, ratio(r), (unsigned long long)r.upstream_allocs,
                        (unsigned long long)r.bound_waits, ratio(before), (unsigned long long)before.bound_waits);
            cr_assert_leq(ratio(r), 1.15, "lag %u: %.3fx", lag, ratio(r));
            if (varied) /* fixed batches: 1.088x throughout, slabs 1.03-1.11x (the budget's 10 %) */
                cr_assert_lt(ratio(r), ratio(before), "lag %u: %.3fx is no better than slabs' %.3fx", lag, ratio(r),
                             ratio(before));
            cr_assert_leq(r.bound_waits, before.bound_waits * 3 / 2 + 10, "lag %u: %llu bound waits against %llu",
                          lag, (unsigned long long)r.bound_waits, (unsigned long long)before.bound_waits);
        }
    }
}
