/* The fake device's per-stream view of fences and stream waits, which the
 * destroyed-stream tests rely on. */
#include <criterion/criterion.h>

#include "../../tools/sim/fake_gpu.h"

Test(fake_gpu, counts_fences_and_waits_per_stream)
{
    ps_gpu_ops_t *gpu;
    cr_assert_eq(ps_fake_gpu_create(NULL, &gpu), PS_OK);
    const ps_stream_t s1 = 0x1000, s2 = 0x2000;
    ps_fence_t *f1, *f2, *f3;
    cr_assert_eq(gpu->fence_record(gpu->ctx, s1, &f1), PS_OK);
    cr_assert_eq(gpu->fence_record(gpu->ctx, s1, &f2), PS_OK);
    cr_assert_eq(gpu->fence_record(gpu->ctx, PS_STREAM_NONE, &f3), PS_OK);
    cr_assert_eq(gpu->stream_wait_fence(gpu->ctx, s2, f1), PS_OK);
    cr_assert_eq(ps_fake_gpu_fences_on_stream(gpu, s1), 2);
    cr_assert_eq(ps_fake_gpu_fences_on_stream(gpu, s2), 0);
    cr_assert_eq(ps_fake_gpu_fences_on_stream(gpu, PS_STREAM_NONE), 1);
    cr_assert_eq(ps_fake_gpu_fences_on_stream(gpu, 0), 0, "stream 0 is not PS_STREAM_NONE");
    cr_assert_eq(ps_fake_gpu_waits_on_stream(gpu, s2), 1, "the waiting stream is counted");
    cr_assert_eq(ps_fake_gpu_waits_on_stream(gpu, s1), 0, "not the stream the fence was recorded on");
    cr_assert_eq(ps_fake_gpu_fences_recorded(gpu), 3);
    gpu->fence_release(gpu->ctx, f1);
    gpu->fence_release(gpu->ctx, f2);
    gpu->fence_release(gpu->ctx, f3);
    ps_fake_gpu_destroy(gpu);
}
