/* The fake device: memory, capacity, failure injection, fences, counters. */
#include "../../tools/sim/fake_gpu.h"
#include "../../core/upstream.h"

#include <criterion/criterion.h>
#include <string.h>

Test(fake_gpu, backed_memory_is_writable_and_aligned)
{
    ps_gpu_ops_t *gpu;
    ps_fake_gpu_options_t o = {.backed = 1};
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    void *p;
    cr_assert_eq(gpu->mem_alloc(gpu->ctx, 3000, &p), PS_OK);
    cr_assert_eq((uintptr_t)p % (2 * PS_MiB), 0);
    memset(p, 0xab, 3000);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 2 * PS_MiB);
    cr_assert_eq(gpu->mem_free(gpu->ctx, p, 3000), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 0);
    ps_fake_gpu_destroy(gpu);
}

Test(fake_gpu, simulated_memory_respects_capacity_and_reuses_the_top)
{
    ps_gpu_ops_t *gpu;
    ps_fake_gpu_options_t o = {.capacity = 4 * PS_GiB};
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    void *a, *b, *c;
    cr_assert_eq(gpu->mem_alloc(gpu->ctx, 3 * PS_GiB, &a), PS_OK);
    cr_assert_eq(gpu->mem_alloc(gpu->ctx, 2 * PS_GiB, &b), PS_ENOMEM);
    cr_assert_eq(gpu->mem_alloc(gpu->ctx, PS_GiB, &b), PS_OK);
    cr_assert_eq((uintptr_t)b, (uintptr_t)a + 3 * PS_GiB);
    cr_assert_eq(gpu->mem_free(gpu->ctx, b, PS_GiB), PS_OK);
    cr_assert_eq(gpu->mem_alloc(gpu->ctx, PS_GiB, &c), PS_OK);
    cr_assert_eq(c, b, "a range freed at the top is reused");
    cr_assert_eq(gpu->mem_free(gpu->ctx, (char *)c + 256, 1), PS_EINVAL);
    cr_assert_eq(gpu->mem_free(gpu->ctx, c, 1), PS_OK);
    cr_assert_eq(gpu->mem_free(gpu->ctx, c, 1), PS_EINVAL, "double free is refused");
    cr_assert_eq(gpu->mem_free(gpu->ctx, a, 1), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 0);
    cr_assert_eq(ps_fake_gpu_upstream_allocs(gpu), 3);
    ps_fake_gpu_destroy(gpu);
}

Test(fake_gpu, injected_failures_hit_the_planned_calls)
{
    ps_gpu_ops_t *gpu;
    cr_assert_eq(ps_fake_gpu_create(NULL, &gpu), PS_OK);
    ps_fake_gpu_inject_failure(gpu, 2, 2);
    void *p[5];
    int expect[5] = {PS_OK, PS_OK, PS_ENOMEM, PS_ENOMEM, PS_OK};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(gpu->mem_alloc(gpu->ctx, 256, &p[i]), expect[i], "call %d", i);
    for (int i = 0; i < 5; i++)
        if (expect[i] == PS_OK)
            cr_assert_eq(gpu->mem_free(gpu->ctx, p[i], 256), PS_OK);
    ps_fake_gpu_destroy(gpu);
}

Test(fake_gpu, fences_complete_when_the_test_says)
{
    ps_gpu_ops_t *gpu;
    cr_assert_eq(ps_fake_gpu_create(NULL, &gpu), PS_OK);
    ps_fence_t *f1, *f2, *f3;
    cr_assert_eq(gpu->fence_record(gpu->ctx, PS_STREAM_NONE, &f1), PS_OK);
    cr_assert_eq(gpu->fence_record(gpu->ctx, 0x100, &f2), PS_OK);
    cr_assert_eq(gpu->fence_record(gpu->ctx, 0x100, &f3), PS_OK);
    cr_assert_eq(ps_fake_gpu_fences_recorded(gpu), 3);
    cr_assert_eq(gpu->fence_query(gpu->ctx, f1), PS_ENOTREADY);
    ps_fake_gpu_complete_upto(gpu, 1);
    cr_assert_eq(gpu->fence_query(gpu->ctx, f1), PS_OK);
    cr_assert_eq(gpu->fence_query(gpu->ctx, f2), PS_ENOTREADY);
    cr_assert_eq(gpu->fence_wait(gpu->ctx, f3), PS_OK);
    cr_assert_eq(ps_fake_gpu_fence_waits(gpu), 1);
    cr_assert_eq(gpu->fence_query(gpu->ctx, f3), PS_OK, "a waited fence is complete");
    cr_assert_eq(gpu->fence_query(gpu->ctx, f2), PS_ENOTREADY, "waiting one fence completes only it");
    cr_assert_eq(gpu->fence_wait(gpu->ctx, f1), PS_OK);
    cr_assert_eq(ps_fake_gpu_fence_waits(gpu), 1, "waiting a complete fence is not counted");
    cr_assert_eq(gpu->stream_wait_fence(gpu->ctx, 0x200, f2), PS_OK);
    cr_assert_eq(ps_fake_gpu_stream_waits(gpu), 1);
    cr_assert_eq(gpu->device_synchronize(gpu->ctx), PS_OK);
    cr_assert_eq(ps_fake_gpu_device_syncs(gpu), 1);
    cr_assert_eq(gpu->fence_query(gpu->ctx, f2), PS_OK, "device sync completes every fence");
    gpu->fence_release(gpu->ctx, f1);
    gpu->fence_release(gpu->ctx, f2);
    gpu->fence_release(gpu->ctx, f3);
    ps_fake_gpu_set_auto_complete(gpu, 1);
    ps_fence_t *f4;
    cr_assert_eq(gpu->fence_record(gpu->ctx, PS_STREAM_NONE, &f4), PS_OK);
    cr_assert_eq(gpu->fence_query(gpu->ctx, f4), PS_OK, "auto-complete");
    gpu->fence_release(gpu->ctx, f4);
    cr_assert_eq(ps_fake_gpu_fences_recorded(gpu), 4);
    ps_fake_gpu_destroy(gpu);
}

Test(upstream, cuda_resource_tracks_pointers_and_refuses_unknown_ones)
{
    ps_gpu_ops_t *gpu;
    ps_resource_t *cuda;
    cr_assert_eq(ps_fake_gpu_create(NULL, &gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create(NULL, gpu, &cuda), PS_OK);
    void *a, *b, *z1, *z2;
    cr_assert_eq(ps_allocate(cuda, PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(cuda, 3 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_allocate(cuda, 0, PS_STREAM_NONE, &z1), PS_OK);
    cr_assert_eq(ps_allocate(cuda, 0, PS_STREAM_NONE, &z2), PS_OK);
    cr_assert(z1 && z2 && z1 != z2, "size 0 gives unique pointers");
    ps_resource_info_t info = {0};
    ps_query(cuda, &info);
    cr_assert_eq(info.bytes_reserved, 4 * PS_MiB + 512);
    cr_assert_eq(info.upstream_allocs, 4);
    cr_assert_eq(ps_deallocate(cuda, (char *)a + 256, PS_MiB, PS_STREAM_NONE), PS_EINVAL);
    cr_assert_eq(ps_deallocate(cuda, a, PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(cuda, a, PS_MiB, PS_STREAM_NONE), PS_EINVAL);
    memset(&info, 0, sizeof info);
    ps_query(cuda, &info);
    cr_assert_eq(info.bytes_reserved, 3 * PS_MiB + 512);
    cr_assert_eq(info.peak_bytes_reserved, 4 * PS_MiB + 512);
    cr_assert_eq(info.upstream_frees, 1);
    ps_destroy(cuda); /* frees b, z1, z2 */
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 0);
    ps_fake_gpu_destroy(gpu);
}

Test(upstream, async_and_managed_resources_allocate_through_their_calls)
{
    ps_gpu_ops_t *gpu;
    ps_resource_t *async, *managed;
    cr_assert_eq(ps_fake_gpu_create(NULL, &gpu), PS_OK);
    cr_assert_eq(ps_async_resource_create("a", gpu, UINT64_MAX, &async), PS_OK);
    cr_assert_eq(ps_managed_resource_create("m", gpu, &managed), PS_OK);
    void *a, *m;
    cr_assert_eq(ps_allocate(async, 1000, 0x100, &a), PS_OK);
    cr_assert_eq(ps_allocate(managed, 1000, PS_STREAM_NONE, &m), PS_OK);
    cr_assert_eq(ps_fake_gpu_upstream_allocs(gpu), 2);
    cr_assert_eq(ps_deallocate(managed, a, 1000, PS_STREAM_NONE), PS_EINVAL, "not its pointer");
    cr_assert_eq(ps_deallocate(async, a, 1000, 0x100), PS_OK);
    cr_assert_eq(ps_deallocate(managed, m, 1000, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 0);
    ps_destroy(async);
    ps_destroy(managed);
    ps_fake_gpu_destroy(gpu);
}

Test(upstream, async_cudafree_orders_after_every_stream_and_cudamalloc_waits)
{
    /* CUDA's pool frees in stream order: a cudaFree through the async
     * upstream must make the legacy stream wait for all streams first, and
     * a cudaMalloc must be complete on the GPU before it returns */
    ps_gpu_ops_t *gpu;
    ps_resource_t *async;
    cr_assert_eq(ps_fake_gpu_create(NULL, &gpu), PS_OK);
    cr_assert_eq(ps_async_resource_create("a", gpu, UINT64_MAX, &async), PS_OK);
    void *a, *s;
    cr_assert_eq(ps_allocate(async, 1000, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_fake_gpu_fence_waits(gpu), 1, "a cudaMalloc waits until the legacy stream passed it");
    cr_assert_eq(ps_deallocate(async, a, 1000, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_fake_gpu_stream_waits(gpu), 1, "the legacy stream waits for every stream before the free");
    cr_assert_eq(ps_allocate(async, 1000, 0x100, &s), PS_OK);
    cr_assert_eq(ps_deallocate(async, s, 1000, 0x100), PS_OK);
    cr_assert_eq(ps_fake_gpu_fence_waits(gpu), 1, "stream-ordered calls wait for nothing");
    cr_assert_eq(ps_fake_gpu_stream_waits(gpu), 1, "stream-ordered calls wait for nothing");
    ps_destroy(async);
    ps_fake_gpu_destroy(gpu);
}

Test(upstream, async_cudafree_without_a_fence_is_deferred_not_synchronized)
{
    /* a capture open somewhere refuses the fence; a device synchronize
     * would invalidate that capture, so the free waits for the next call
     * that can record a fence (the GPU soak caught the synchronize) */
    ps_gpu_ops_t *gpu;
    ps_resource_t *async;
    cr_assert_eq(ps_fake_gpu_create(NULL, &gpu), PS_OK);
    cr_assert_eq(ps_async_resource_create("a", gpu, UINT64_MAX, &async), PS_OK);
    void *a, *b;
    cr_assert_eq(ps_allocate(async, 1000, PS_STREAM_NONE, &a), PS_OK);
    uint64_t held = ps_fake_gpu_bytes_outstanding(gpu);
    cr_assert_gt(held, 0);
    uint64_t records = ps_fake_gpu_calls(gpu, PS_FAKE_OP_FENCE_RECORD);
    uint64_t syncs = ps_fake_gpu_calls(gpu, PS_FAKE_OP_DEVICE_SYNCHRONIZE);
    cr_assert_eq(ps_fake_gpu_fail_call(gpu, PS_FAKE_OP_FENCE_RECORD, records + 1, PS_EUPSTREAM), PS_OK);
    cr_assert_eq(ps_deallocate(async, a, 1000, PS_STREAM_NONE), PS_OK, "the program's free succeeds");
    cr_assert_eq(ps_fake_gpu_calls(gpu, PS_FAKE_OP_DEVICE_SYNCHRONIZE), syncs, "no device synchronize");
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), held, "deferred, not freed yet");
    ps_resource_info_t info = {0};
    ps_query(async, &info);
    cr_assert_eq(info.bytes_in_use, 0);
    cr_assert_eq(info.bytes_pending, 1000);
    cr_assert_eq(ps_deallocate(async, a, 1000, PS_STREAM_NONE), PS_EINVAL, "a deferred block is freed once");
    cr_assert_eq(ps_allocate(async, 1000, PS_STREAM_NONE, &b), PS_OK, "the next call records a fence");
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), held, "the deferred block went back: only b is held");
    memset(&info, 0, sizeof info);
    ps_query(async, &info);
    cr_assert_eq(info.bytes_pending, 0);
    cr_assert_eq(info.bytes_in_use, 1000);
    cr_assert_eq(ps_deallocate(async, b, 1000, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(gpu), 0);
    ps_destroy(async);
    ps_fake_gpu_destroy(gpu);
}

Test(upstream, allocation_failure_is_reported_and_not_counted)
{
    ps_gpu_ops_t *gpu;
    ps_resource_t *cuda;
    ps_fake_gpu_options_t o = {.capacity = 4 * PS_MiB};
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create(NULL, gpu, &cuda), PS_OK);
    void *p;
    cr_assert_eq(ps_allocate(cuda, 8 * PS_MiB, PS_STREAM_NONE, &p), PS_ENOMEM);
    ps_resource_info_t info = {0};
    ps_query(cuda, &info);
    cr_assert_eq(info.bytes_reserved, 0);
    cr_assert_eq(info.upstream_allocs, 0);
    ps_destroy(cuda);
    ps_fake_gpu_destroy(gpu);
}

/* ---- core/ptr_map.h (the map under the pool, the upstreams and this fake) */
#include "../../core/ptr_map.h"

Test(ptr_map, matches_a_reference_array_under_random_puts_and_removes)
{
    enum { KEYS = 4096 };
    static uint64_t reference[KEYS]; /* 0 = absent, else value */
    ps_ptr_map_t map;
    cr_assert_eq(ps_ptr_map_init(&map, 4), PS_OK);
    unsigned seed = 99;
    size_t present = 0;
    for (int step = 0; step < 200000; step++) {
        unsigned k = (unsigned)rand_r(&seed) % KEYS;
        uintptr_t key = 0x400000000000ull + (uintptr_t)k * 256; /* aligned like device pointers */
        uint64_t value;
        if (rand_r(&seed) % 3) {
            cr_assert_eq(ps_ptr_map_reserve(&map, 1), PS_OK);
            present += reference[k] == 0;
            reference[k] = (uint64_t)step + 1;
            ps_ptr_map_put(&map, key, reference[k]);
        } else {
            int removed = ps_ptr_map_remove(&map, key, &value);
            cr_assert_eq(removed, reference[k] != 0, "step %d key %u", step, k);
            if (removed) {
                cr_assert_eq(value, reference[k]);
                reference[k] = 0;
                present--;
            }
        }
        cr_assert_eq(map.count, present);
        cr_assert(map.count * 2 <= map.capacity, "the table stays at most half full");
        if (step % 1000 == 0)
            for (unsigned i = 0; i < KEYS; i++) {
                int found = ps_ptr_map_get(&map, 0x400000000000ull + (uintptr_t)i * 256, &value);
                cr_assert_eq(found, reference[i] != 0, "step %d key %u", step, i);
                if (found)
                    cr_assert_eq(value, reference[i]);
            }
    }
    ps_ptr_map_free(&map);
}

Test(fake_gpu, lagging_gpu_completes_a_fence_lag_after_it_was_recorded)
{
    ps_gpu_ops_t *gpu;
    ps_fake_gpu_options_t o = {.auto_complete = 1, .lag_ns = 5000000}; /* the lag overrides auto_complete */
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    ps_fence_t *early, *late;
    ps_fake_gpu_set_clock(gpu, 1000);
    cr_assert_eq(gpu->fence_record(gpu->ctx, PS_STREAM_NONE, &early), PS_OK);
    ps_fake_gpu_set_clock(gpu, 2000000);
    cr_assert_eq(gpu->fence_record(gpu->ctx, 0x100, &late), PS_OK);
    ps_fake_gpu_set_clock(gpu, 1000 + 5000000 - 1);
    cr_assert_eq(gpu->fence_query(gpu->ctx, early), PS_ENOTREADY, "1 ns before the lag has passed");
    ps_fake_gpu_set_clock(gpu, 10); /* the clock never goes back */
    ps_fake_gpu_set_clock(gpu, 1000 + 5000000);
    cr_assert_eq(gpu->fence_query(gpu->ctx, early), PS_OK, "complete once the lag has passed");
    cr_assert_eq(gpu->fence_query(gpu->ctx, late), PS_ENOTREADY, "a later fence completes later");
    cr_assert_eq(gpu->fence_wait(gpu->ctx, late), PS_OK);
    cr_assert_eq(ps_fake_gpu_fence_waits(gpu), 1, "the host waited for the lagging GPU");
    cr_assert_eq(gpu->fence_query(gpu->ctx, late), PS_OK, "a waited fence is complete");
    ps_fake_gpu_set_clock(gpu, 7000000);
    cr_assert_eq(gpu->fence_query(gpu->ctx, late), PS_OK);
    gpu->fence_release(gpu->ctx, early);
    gpu->fence_release(gpu->ctx, late);
    ps_fake_gpu_destroy(gpu);
}

Test(fake_gpu, without_a_lag_the_clock_changes_nothing)
{
    ps_gpu_ops_t *gpu;
    ps_fake_gpu_options_t o = {.auto_complete = 0};
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    ps_fence_t *f;
    cr_assert_eq(gpu->fence_record(gpu->ctx, PS_STREAM_NONE, &f), PS_OK);
    ps_fake_gpu_set_clock(gpu, UINT64_MAX);
    cr_assert_eq(gpu->fence_query(gpu->ctx, f), PS_ENOTREADY, "only the test completes fences");
    gpu->fence_release(gpu->ctx, f);
    ps_fake_gpu_destroy(gpu);
}

Test(fake_gpu, barriers_are_numbered_and_pass_like_fences)
{
    ps_gpu_ops_t *gpu;
    ps_fake_gpu_options_t o = {0};
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    cr_assert_eq(gpu->barrier_generation(gpu->ctx), 0);
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 0), PS_OK, "before any barrier: always passed");
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 1), PS_EINVAL, "never issued");
    for (int i = 0; i < 3; i++)
        cr_assert_eq(gpu->barrier(gpu->ctx), PS_OK);
    cr_assert_eq(gpu->barrier_generation(gpu->ctx), 3);
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 1), PS_ENOTREADY, "only the test completes barriers");
    ps_fake_gpu_complete_barriers_upto(gpu, 2);
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 2), PS_OK);
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 3), PS_ENOTREADY);
    cr_assert_eq(gpu->device_synchronize(gpu->ctx), PS_OK);
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 3), PS_OK, "a device synchronize passes every barrier");
    cr_assert_eq(gpu->barrier(gpu->ctx), PS_OK);
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 4), PS_ENOTREADY);
    ps_fake_gpu_assume_barriers_passed(gpu, 1);
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 4), PS_OK, "the test hook lies");
    ps_fake_gpu_assume_barriers_passed(gpu, 0);
    cr_assert_eq(ps_fake_gpu_fail_call(gpu, PS_FAKE_OP_BARRIER_PASSED,
                                       ps_fake_gpu_calls(gpu, PS_FAKE_OP_BARRIER_PASSED) + 1, 0), PS_OK);
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 0), PS_EUPSTREAM, "a failed query");
    ps_fake_gpu_set_auto_complete(gpu, 1);
    cr_assert_eq(gpu->barrier(gpu->ctx), PS_OK);
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 5), PS_OK, "auto-complete: at once");
    ps_fake_gpu_destroy(gpu);
}

Test(fake_gpu, a_lagging_gpu_passes_a_barrier_lag_after_it_was_issued_and_remembers_eight)
{
    ps_gpu_ops_t *gpu;
    ps_fake_gpu_options_t o = {.lag_ns = 1000};
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    for (uint64_t n = 1; n <= 20; n++) { /* barrier n at clock 100 n */
        ps_fake_gpu_set_clock(gpu, 100 * n);
        cr_assert_eq(gpu->barrier(gpu->ctx), PS_OK);
    }
    ps_fake_gpu_set_clock(gpu, 100 * 15 + 1000);
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 15), PS_OK);
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 16), PS_ENOTREADY, "issued later, passes later");
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 2), PS_OK, "older than the ring: as the oldest remembered (13)");
    ps_fake_gpu_destroy(gpu);
    /* the oldest remembered one has not passed: neither has an older one */
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    for (uint64_t n = 1; n <= 20; n++) {
        ps_fake_gpu_set_clock(gpu, 100 * n);
        cr_assert_eq(gpu->barrier(gpu->ctx), PS_OK);
    }
    ps_fake_gpu_set_clock(gpu, 100 * 12 + 1000); /* barrier 12 passed, 13 (the oldest of the ring) not */
    cr_assert_eq(gpu->barrier_passed(gpu->ctx, 2), PS_ENOTREADY, "unknown: answered as the ring's oldest");
    ps_fake_gpu_destroy(gpu);
}

/* The real-time event model (event_latency_ns): a fence completes a real
 * latency after it was recorded; fence_wait spins until then. */
Test(fake_gpu, real_time_events_complete_a_latency_after_recording)
{
    ps_gpu_ops_t *gpu;
    ps_fake_gpu_options_t o = {.event_latency_ns = 2000000, .event_record_ns = 1000, .event_query_ns = 1000};
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    uint64_t t0 = ps_now_ns();
    ps_fence_t *f;
    cr_assert_eq(gpu->fence_record(gpu->ctx, PS_STREAM_NONE, &f), PS_OK);
    cr_assert_geq(ps_now_ns() - t0, 1000, "recording costs event_record_ns");
    if (ps_now_ns() - t0 < 1000000) /* (a slow machine may take the whole latency here) */
        cr_assert_eq(gpu->fence_query(gpu->ctx, f), PS_ENOTREADY);
    cr_assert_eq(gpu->fence_wait(gpu->ctx, f), PS_OK);
    cr_assert_geq(ps_now_ns() - t0, 2000000, "the wait lasted until the latency passed");
    cr_assert_eq(gpu->fence_query(gpu->ctx, f), PS_OK);
    gpu->fence_release(gpu->ctx, f);
    ps_fake_gpu_destroy(gpu);
}

/* The reuse judge: a mark passes once the table answered that a fence
 * recorded after it passed (query or wait), or the device synchronized;
 * completing fences by hand counts only once asked; barriers never do. */
Test(fake_gpu, the_reuse_judge_needs_a_fence_after_the_mark_answered_passed)
{
    ps_gpu_ops_t *gpu;
    ps_fake_gpu_options_t o = {0};
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    ps_fence_t *before, *after, *later;
    cr_assert_eq(gpu->fence_record(gpu->ctx, PS_STREAM_NONE, &before), PS_OK);
    ps_fake_gpu_mark_t mark = ps_fake_gpu_mark(gpu);
    cr_assert_eq(gpu->fence_query(gpu->ctx, before), PS_ENOTREADY);
    ps_fake_gpu_complete_upto(gpu, 1);
    cr_assert_eq(gpu->fence_query(gpu->ctx, before), PS_OK);
    cr_assert_not(ps_fake_gpu_passed_since(gpu, mark), "a fence recorded before the mark does not count");
    cr_assert_eq(gpu->fence_record(gpu->ctx, PS_STREAM_NONE, &after), PS_OK);
    cr_assert_eq(gpu->barrier(gpu->ctx), PS_OK);
    ps_fake_gpu_complete_all(gpu);
    cr_assert_not(ps_fake_gpu_passed_since(gpu, mark), "nobody asked yet; a barrier never counts");
    cr_assert_eq(gpu->fence_query(gpu->ctx, after), PS_OK);
    cr_assert(ps_fake_gpu_passed_since(gpu, mark));
    mark = ps_fake_gpu_mark(gpu);
    cr_assert_eq(gpu->fence_record(gpu->ctx, PS_STREAM_NONE, &later), PS_OK);
    cr_assert_eq(gpu->fence_wait(gpu->ctx, later), PS_OK);
    cr_assert(ps_fake_gpu_passed_since(gpu, mark), "a host wait counts");
    mark = ps_fake_gpu_mark(gpu);
    cr_assert_eq(gpu->device_synchronize(gpu->ctx), PS_OK);
    cr_assert(ps_fake_gpu_passed_since(gpu, mark), "a device synchronize counts");
    gpu->fence_release(gpu->ctx, before);
    gpu->fence_release(gpu->ctx, after);
    gpu->fence_release(gpu->ctx, later);
    ps_fake_gpu_destroy(gpu);
}

Test(fake_gpu, maps_take_whole_granules_and_a_kept_handle_of_its_size)
{
    ps_gpu_ops_t *gpu;
    ps_fake_gpu_options_t o = {.virtual_memory = 1, .host_vm_granularity = 4 * PS_MiB};
    cr_assert_eq(ps_fake_gpu_create(&o, &gpu), PS_OK);
    void *range;
    uint64_t handle = 0;
    char *at;
    cr_assert_eq(gpu->vm_reserve(gpu->ctx, 16 * PS_MiB, &range), PS_OK);
    at = range;
    cr_expect_eq(gpu->vm_map(gpu->ctx, at, PS_MiB, &handle), PS_EINVAL, "half a granule");
    cr_expect_eq(gpu->vm_map(gpu->ctx, at + PS_MiB, 2 * PS_MiB, &handle), PS_EINVAL, "off a granule");
    cr_expect_eq(gpu->host_vm_map(gpu->ctx, at, 2 * PS_MiB, &handle), PS_EINVAL, "half a host granule");
    cr_expect_eq(ps_fake_gpu_vm_maps(gpu), 0);
    cr_expect_eq(ps_fake_gpu_bytes_outstanding(gpu), 0, "a refused map takes no capacity");
    cr_assert_eq(gpu->host_vm_map(gpu->ctx, at + 4 * PS_MiB, 4 * PS_MiB, &handle), PS_OK);
    cr_expect_eq(ps_fake_gpu_host_vm_maps(gpu), 1);
    cr_assert_eq(gpu->vm_map(gpu->ctx, at, 2 * PS_MiB, &handle), PS_OK);
    cr_assert_eq(gpu->vm_unmap_keep(gpu->ctx, at, 2 * PS_MiB, handle), PS_OK);
    cr_expect_eq(gpu->vm_map_handle(gpu->ctx, at + 8 * PS_MiB, 4 * PS_MiB, handle), PS_EINVAL, "not its size");
    cr_expect_eq(gpu->vm_map_handle(gpu->ctx, at + 9 * PS_MiB, 2 * PS_MiB, handle), PS_EINVAL, "off a granule");
    cr_expect_eq(gpu->vm_map_handle(gpu->ctx, at + 8 * PS_MiB, 2 * PS_MiB, handle), PS_OK);
    cr_expect_eq(ps_fake_gpu_vm_maps_kept(gpu), 1);
    cr_expect_eq(ps_fake_gpu_calls(gpu, PS_FAKE_OP_VM_MAP), 6, "refused calls are counted too");
    cr_expect_eq(ps_fake_gpu_bytes_outstanding(gpu), 6 * PS_MiB);
    ps_fake_gpu_destroy(gpu);
}
