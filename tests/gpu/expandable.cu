/* expandable — what one growing virtual-memory range buys.
 *
 * Fills the device with 1 GiB blocks until cudaMalloc fails, frees every
 * other one, then asks for one block of a third of the device — more than
 * any freed hole. Natively that works (the driver maps pages anywhere). A
 * pool of separate chunks cannot join the holes; the expandable pool
 * unmaps the free pieces and maps them again where the big block goes.
 * The big block is filled and checked, and so are the blocks still held
 * (nothing was moved or lost).
 * Exit 0: the big allocation worked and every byte checked; 2: the big
 * allocation failed (printed, so the chunked pool's row can show it);
 * 1: error. */
#include "gpu_test.h"

#include <vector>

int main(void)
{
    size_t free_bytes = 0, total = 0;
    CK(cudaMemGetInfo(&free_bytes, &total));
    const size_t block = 1ull << 30;
    std::vector<void *> blocks;
    for (;;) {
        void *p = nullptr;
        cudaError_t e = cudaMalloc(&p, block);
        if (e != cudaSuccess) {
            cudaGetLastError(); /* clear the OOM */
            break;
        }
        fill_pattern(p, block, (uint32_t)blocks.size(), 0);
        blocks.push_back(p);
    }
    CK(cudaDeviceSynchronize());
    printf("expandable: filled the device with %zu blocks of 1 GiB (device %.1f GiB)\n", blocks.size(),
           total / 1073741824.0);
    for (size_t i = 0; i < blocks.size(); i += 2) {
        CK(cudaFree(blocks[i]));
        blocks[i] = nullptr;
    }
    size_t big = (total / 3) & ~((size_t)(2u << 20) - 1);
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, big);
    if (e != cudaSuccess) {
        printf("expandable: cudaMalloc of %.1f GiB after freeing every other block: %s\n", big / 1073741824.0,
               cudaGetErrorString(e));
        return 2;
    }
    unsigned long long *bad = nullptr;
    CK(cudaMalloc((void **)&bad, sizeof *bad));
    CK(cudaMemset(bad, 0, sizeof *bad));
    fill_pattern(p, big, 77, 0);
    count_mismatches(p, big, 77, bad, 0);
    for (size_t i = 1; i < blocks.size(); i += 2)
        count_mismatches(blocks[i], block, (uint32_t)i, bad, 0);
    unsigned long long wrong = 0;
    CK(cudaMemcpy(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost));
    printf("expandable: cudaMalloc of %.1f GiB worked; %llu bytes wrong in it and in the blocks still held\n",
           big / 1073741824.0, wrong);
    CK(cudaFree(p));
    CK(cudaFree(bad));
    for (void *q : blocks)
        if (q)
            CK(cudaFree(q));
    return wrong ? EXIT_CORRUPTION : 0;
}
