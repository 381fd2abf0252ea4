/* release_threshold — cudaDeviceSynchronize gives pooled memory back.
 *
 * Holds one 256 MiB block, allocates and frees 4 GiB more in 16 blocks,
 * then calls cudaDeviceSynchronize and reads the device's real free memory
 * (run with global.meminfo=device so cudaMemGetInfo is not the pool's
 * answer). `released` (pool option release_threshold=0, and natively,
 * where cudaFree returns memory at once): the 4 GiB are back. `kept`
 * (no threshold, the default): the pool still holds them. The held
 * block's content is checked after the release (nothing it held moved).
 * Exit 0: as expected; 3: the memory was not where expected; 1: error. */
#include "gpu_test.h"

#include <string.h>

int main(int argc, char **argv)
{
    int expect_released = argc > 1 && strcmp(argv[1], "released") == 0;
    const size_t piece = 256ull << 20;
    size_t free0 = 0, total = 0, free1 = 0;
    void *held = nullptr;
    CK(cudaMalloc(&held, piece));
    fill_pattern(held, piece, 7, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemGetInfo(&free0, &total));
    void *blocks[16];
    for (int i = 0; i < 16; i++) {
        CK(cudaMalloc(&blocks[i], piece));
        fill_pattern(blocks[i], piece, (uint32_t)i, 0);
    }
    for (int i = 0; i < 16; i++)
        CK(cudaFree(blocks[i]));
    CK(cudaDeviceSynchronize());
    CK(cudaMemGetInfo(&free1, &total));
    unsigned long long *bad = nullptr, wrong = 0;
    CK(cudaMalloc((void **)&bad, sizeof *bad));
    CK(cudaMemset(bad, 0, sizeof *bad));
    count_mismatches(held, piece, 7, bad, 0);
    CK(cudaMemcpy(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost));
    CK(cudaFree(bad));
    CK(cudaFree(held));
    double kept_gib = ((double)free0 - (double)free1) / 1073741824.0;
    printf("release_threshold: after 4 GiB freed and cudaDeviceSynchronize, %.2f GiB still held beyond "
           "before (expect %s); %llu bytes wrong in the held block\n",
           kept_gib, expect_released ? "released" : "kept", wrong);
    if (wrong)
        return 3;
    int released = kept_gib < 0.5;
    int kept = kept_gib > 3.5;
    return (expect_released ? released : kept) ? 0 : 3;
}
