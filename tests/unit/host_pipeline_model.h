/* A CPU model of tools/bench/pinned/cupy_pipeline.py over the pinned host
 * stack the shim builds by default (ps_config_build_host_stack with the
 * default [host]), on the fake device in queue mode (tools/sim/fake_gpu.h): the
 * fake GPU runs the work the model queues, and a fence the pool records
 * completes when the GPU has finished everything queued before it, as a
 * CUDA event recorded on every stream does.
 *
 * Model of one step i (the script's default mode):
 *  1. size n_i uniform in 256 KiB .. 24 MiB (seeded; the script uses
 *     numpy's generator, this one splitmix64: same distribution, other
 *     numbers);
 *  2. while copies are in flight and (the oldest one's copy is done, or
 *     `depth` are in flight): the host waits for the oldest copy (event
 *     synchronize: the host clock moves to the copy's end) and frees its
 *     buffer (cudaFreeHost: the GPU is past that copy, but not past the
 *     work queued after it);
 *  3. allocate n_i (cudaHostAlloc); a host wait inside the pool (the
 *     growth bound) moves the host clock to when the GPU got there;
 *  4. the host fills the buffer (host_base_ns + n_i / host_bytes_per_us);
 *  5. the copy is queued on the GPU (start = max(GPU idle, host now),
 *     n_i / copy_bytes_per_us), then gpu_ns of spin and a short reduction.
 * At the end every buffer is freed once its copy is done.
 *
 * The timing defaults are the H100 run's (tools/bench/results/
 * 2026-11-23_h100_pinned_bench_slabs.txt): a step costs the GPU ~3.5 ms (3 ms of spin,
 * a 12 MiB copy at ~25 GB/s), the host ~1.6 ms, so with the pool out of
 * the way the GPU lags and `depth` copies are in flight. The fake device
 * offers virtual memory with host-located pieces (host_vm_map) unless
 * no_host_vm, so the default [host] stack is the one host range. */
#ifndef PS_TEST_HOST_PIPELINE_MODEL_H
#define PS_TEST_HOST_PIPELINE_MODEL_H

#include "../../config/config.h"
#include "../../tools/sim/fake_gpu.h"
#include "../../core/pool.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdint.h>
#include <string.h>

#define PIPELINE_MAX_STEPS 1000
#define PIPELINE_MIN_BYTES (256u << 10)
#define PIPELINE_MAX_BYTES (24u << 20)
/* cuMemHostAlloc on the H100 (docs/benchmarks.md): 1 MiB 1.18 ms, 64 MiB
 * 39.1 ms, so about 0.58 ms + 0.6 ms per MiB; cuMemFreeHost synchronizes. */
#define PIPELINE_PIN_NS 580000ull
#define PIPELINE_PIN_NS_PER_MIB 600000ull

typedef struct pipeline_params {
    unsigned steps;             /* buffers (the script: 300; --quick 100) */
    unsigned depth;             /* copies in flight at most (8) */
    uint64_t seed;              /* size generator seed */
    uint64_t gpu_ns;            /* GPU spin per step (3 ms) */
    uint64_t copy_bytes_per_us; /* host-to-device copy speed (25 GB/s) */
    uint64_t host_base_ns;      /* host time per step besides the fill (Python: 150 us) */
    uint64_t host_bytes_per_us; /* host fill speed (numpy into pinned memory: 8 GB/s) */
    int no_host_vm;             /* 1: the fake device cannot map host pieces (a driver without
                                   host-located cuMemCreate): the default stack takes slabs */
    size_t vm_granularity;      /* granularity of its pieces (0: 2 MiB, as measured on an H100) */
} pipeline_params_t;

typedef struct pipeline_result {
    uint64_t requested_peak; /* most bytes the program held at once */
    uint64_t reserved_peak;  /* most bytes the pool held */
    uint64_t chunks_peak;    /* slabs held at the reserved peak */
    uint64_t in_use_at_peak; /* at the reserved peak: bytes handed out */
    uint64_t free_at_peak;   /*   free (in slabs, not fitting the request) */
    uint64_t pending_at_peak; /*  freed, waiting for their fence */
    uint64_t slabs_taken;    /* upstream allocations (cudaHostAlloc calls) */
    uint64_t slabs_given;    /* upstream frees (cudaFreeHost calls) */
    uint64_t bound_waits;    /* host waits of the growth bound */
    uint64_t fence_waits;    /* host waits of the pool, all kinds */
    uint64_t wall_ns;        /* host time of the whole run */
    uint64_t wait_ns;        /* host time spent waiting inside the pool */
    int expandable;          /* the pool worked on one host range */
} pipeline_result_t;

static inline pipeline_params_t pipeline_defaults(void)
{
    return (pipeline_params_t){.steps = 300,
                               .depth = 8,
                               .seed = 4321,
                               .gpu_ns = 3000000,
                               .copy_bytes_per_us = 25000,
                               .host_base_ns = 150000,
                               .host_bytes_per_us = 8000};
}

static inline uint64_t pipeline_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The [host] configuration of a default run (no file, no environment),
 * with `options` (POOLSHIM_OPTIONS syntax, "" for none) on top. */
static inline ps_config_t *pipeline_config(const char *options)
{
    char *env[] = {NULL};
    ps_config_input_t in = {.options = options, .environ = env, .no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load(&in, &cfg), PS_OK, "options `%s`", options);
    return cfg;
}

typedef struct pipeline_copy {
    void *ptr;
    size_t size;
    uint64_t copy_end_ns; /* when the GPU finishes its copy */
} pipeline_copy_t;

/* Runs the pipeline over the host stack `cfg` builds (pool_options NULL:
 * [host]'s own, as the shim does). */
static inline pipeline_result_t pipeline_run(const ps_config_t *cfg, const ps_pool_options_t *pool_options,
                                             const pipeline_params_t *p)
{
    ps_fake_gpu_options_t ho = {.backed = 0,
                                .waits_move_clock = 1,
                                .pin_ns = PIPELINE_PIN_NS,
                                .pin_ns_per_mib = PIPELINE_PIN_NS_PER_MIB,
                                .unpin_synchronizes = 1,
                                .virtual_memory = 1,
                                .no_host_vm = p->no_host_vm,
                                .vm_granularity = p->vm_granularity};
    ps_gpu_ops_t *gpu;
    cr_assert_eq(ps_fake_gpu_create(&ho, &gpu), PS_OK);
    ps_stack_t *stack = NULL;
    cr_assert_eq(ps_config_build_host_stack(cfg, 0, gpu, PS_HOST_ALLOC_PORTABLE | PS_HOST_ALLOC_MAPPED,
                                            pool_options, &stack),
                 PS_OK);
    ps_resource_t *pool = stack->top;
    pipeline_result_t r = {0};
    pipeline_copy_t flight[PIPELINE_MAX_STEPS];
    size_t head = 0, count = 0;
    uint64_t now = 0, gpu_idle = 0, requested = 0, seed = p->seed;
    cr_assert_leq(p->steps, PIPELINE_MAX_STEPS);
    for (unsigned i = 0; i <= p->steps; i++) {
        int last = i == p->steps;
        while (count && (last || flight[head].copy_end_ns <= now || count >= p->depth)) {
            if (flight[head].copy_end_ns > now)
                now = flight[head].copy_end_ns; /* event synchronize */
            ps_fake_gpu_set_clock(gpu, now);
            cr_assert_eq(ps_deallocate(pool, flight[head].ptr, flight[head].size, PS_STREAM_NONE), PS_OK);
            requested -= flight[head].size;
            head++;
            count--;
        }
        if (last)
            break;
        size_t n = PIPELINE_MIN_BYTES + pipeline_random(&seed) % (PIPELINE_MAX_BYTES - PIPELINE_MIN_BYTES + 1);
        ps_fake_gpu_set_clock(gpu, now);
        ps_fake_gpu_set_gpu_busy_until(gpu, gpu_idle);
        void *ptr = NULL;
        cr_assert_eq(ps_allocate(pool, n, PS_STREAM_NONE, &ptr), PS_OK);
        uint64_t after = ps_fake_gpu_clock(gpu);
        if (after > now) {
            r.wait_ns += after - now;
            now = after;
        }
        requested += n;
        if (requested > r.requested_peak)
            r.requested_peak = requested;
        ps_resource_info_t info = {0};
        ps_query(pool, &info);
        if (info.bytes_reserved > r.reserved_peak) {
            r.reserved_peak = info.bytes_reserved;
            r.chunks_peak = info.upstream_allocs - info.upstream_frees;
            r.in_use_at_peak = info.bytes_in_use;
            r.free_at_peak = info.bytes_free;
            r.pending_at_peak = info.bytes_pending;
        }
        now += p->host_base_ns + n * 1000 / p->host_bytes_per_us; /* the host fills it */
        uint64_t start = gpu_idle > now ? gpu_idle : now;
        uint64_t copy_end = start + n * 1000 / p->copy_bytes_per_us;
        gpu_idle = copy_end + p->gpu_ns + 20000; /* spin, then the checksum */
        ps_fake_gpu_set_gpu_busy_until(gpu, gpu_idle);
        flight[head + count++] = (pipeline_copy_t){ptr, n, copy_end};
    }
    if (gpu_idle > now)
        now = gpu_idle;
    r.wall_ns = now;
    ps_resource_info_t info = {0};
    ps_query(pool, &info);
    r.slabs_taken = info.upstream_allocs;
    r.slabs_given = info.upstream_frees;
    r.bound_waits = info.pending_waits;
    r.fence_waits = ps_fake_gpu_fence_waits(gpu);
    for (ps_resource_t *q = pool; q; q = q->upstream)
        if (strcmp(q->name, "host") == 0) {
            cr_assert_eq(ps_pool_check(q), PS_OK);
            r.expandable = ps_pool_is_expandable(q);
        }
    ps_stack_destroy(stack);
    ps_fake_gpu_destroy(gpu);
    return r;
}

static inline double pipeline_ratio(const pipeline_result_t *r)
{
    return (double)r->reserved_peak / (double)r->requested_peak;
}

static inline void pipeline_log(const char *what, const pipeline_result_t *r)
{
    cr_log_info("%s: %s, requested peak %.1f MiB, reserved peak %.1f MiB (%.3fx; at it %llu slabs, in use %.1f, "
                "free %.1f, pending %.1f MiB); slabs taken %llu, given back %llu; bound waits %llu, fence waits "
                "%llu (%.0f ms of %.0f ms)",
                what, r->expandable ? "one host range" : "slabs", r->requested_peak / 1048576.0, r->reserved_peak / 1048576.0, pipeline_ratio(r),
                (unsigned long long)r->chunks_peak, r->in_use_at_peak / 1048576.0, r->free_at_peak / 1048576.0,
                r->pending_at_peak / 1048576.0, (unsigned long long)r->slabs_taken,
                (unsigned long long)r->slabs_given, (unsigned long long)r->bound_waits,
                (unsigned long long)r->fence_waits, r->wait_ns / 1e6, r->wall_ns / 1e6);
}

#endif
