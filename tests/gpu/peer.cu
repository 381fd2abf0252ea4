/* peer — memory of one GPU read and written by a kernel on another, after
 * cudaDeviceEnablePeerAccess, as natively.
 *
 * Memory that the expandable pool maps with cuMemMap is not made
 * peer-accessible by cudaDeviceEnablePeerAccess: the shim must grant the
 * peer access on every mapping, existing and later. This allocates on
 * device 1, enables access from device 0, reads and writes it from a kernel
 * on device 0 (also memory device 1's pool maps after the enable), and
 * checks every byte. Needs two GPUs (prints SKIP otherwise).
 * Exit 0: verified; 3: wrong bytes; 1: a CUDA error (an illegal address
 * when the access was not granted). */
#include "gpu_test.h"

static unsigned long long mismatches_from(int device, const void *p, size_t n, uint32_t seed)
{
    CK(cudaSetDevice(device));
    unsigned long long *counter = nullptr, wrong = 0;
    CK(cudaMalloc((void **)&counter, sizeof *counter));
    CK(cudaMemset(counter, 0, sizeof *counter));
    count_mismatches(p, n, seed, counter, 0);
    CK(cudaMemcpy(&wrong, counter, sizeof wrong, cudaMemcpyDeviceToHost));
    CK(cudaFree(counter));
    return wrong;
}

int main(void)
{
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    int can = 0;
    if (count >= 2)
        CK(cudaDeviceCanAccessPeer(&can, 0, 1));
    if (count < 2 || !can) {
        printf("peer: SKIP (%d GPU(s), peer access %s)\n", count, can ? "possible" : "not possible");
        return 0;
    }
    const size_t n = 64u << 20;
    void *before = nullptr, *after = nullptr;
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&before, n)); /* mapped before access is granted */
    fill_pattern(before, n, 11, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaSetDevice(0));
    CK(cudaDeviceEnablePeerAccess(1, 0));
    unsigned long long wrong = mismatches_from(0, before, n, 11);
    printf("peer: device 0 read %zu MiB of device 1 allocated before the enable: %llu wrong\n", n >> 20, wrong);
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&after, 4 * n)); /* mapped after */
    CK(cudaDeviceSynchronize());
    CK(cudaSetDevice(0));
    fill_pattern(after, 4 * n, 12, 0); /* device 0 writes device 1's memory */
    CK(cudaDeviceSynchronize());
    unsigned long long wrong_after = mismatches_from(1, after, 4 * n, 12);
    wrong_after += mismatches_from(0, after, 4 * n, 12);
    printf("peer: device 0 wrote and both read %zu MiB of device 1 allocated after the enable: %llu wrong\n",
           (4 * n) >> 20, wrong_after);
    CK(cudaSetDevice(1));
    CK(cudaFree(before));
    CK(cudaFree(after));
    if (wrong || wrong_after) {
        printf("peer: CORRUPTION\n");
        return EXIT_CORRUPTION;
    }
    printf("peer: OK\n");
    return 0;
}
