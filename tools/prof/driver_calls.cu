/* driver_calls: which driver entry points a cudaMalloc+cudaFree pair reaches,
 * for tools/prof/driver_calls.sh (gdb breaks on every cu* function between the
 * two markers). Static cudart by default (nvcc's), shared with -cudart shared. */
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>

extern "C" __attribute__((noinline)) void pairs_begin(void) { asm volatile(""); }
extern "C" __attribute__((noinline)) void pairs_end(void) { asm volatile(""); }

int main(int argc, char **argv)
{
    size_t size = argc > 1 ? strtoull(argv[1], 0, 0) : 256;
    void *p;
    cudaFree(0);
    for (int i = 0; i < 100; i++) { /* warm: every lazy path taken */
        cudaMalloc(&p, size);
        cudaFree(p);
    }
    pairs_begin();
    for (int i = 0; i < 2; i++) {
        if (cudaMalloc(&p, size) != cudaSuccess || cudaFree(p) != cudaSuccess)
            return 1;
    }
    pairs_end();
    printf("driver_calls: done\n");
    return 0;
}
