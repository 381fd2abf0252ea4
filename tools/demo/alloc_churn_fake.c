/* alloc_churn_fake: the allocation pattern of alloc_churn.cu without a GPU,
 * for `make demo` on a machine without one. Each step allocates the same
 * three buffers (4 KiB to 4 MiB, and 4 bytes) with cudaMalloc and frees
 * them, against the fake CUDA runtime of the shim tests (tests/shim: host
 * memory behind the CUDA API), so `poolshim ab` can run it natively and
 * under the shim. No kernel runs and the buffers are not touched.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int cudaMalloc(void **pointer, size_t size); /* cudaError_t: 0 is cudaSuccess */
int cudaFree(void *pointer);

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 2000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int s = 0; s < steps; s++) {
        size_t n = 1024 + (size_t)(s * 7919 % 65536) * 16; /* floats, as alloc_churn.cu */
        void *x, *y, *out;
        if (cudaMalloc(&x, n * sizeof(float)) || cudaMalloc(&y, n * sizeof(float)) || cudaMalloc(&out, sizeof(float))) {
            fprintf(stderr, "alloc_churn_fake: step %d: cudaMalloc failed\n", s);
            return 1;
        }
        if (cudaFree(out) || cudaFree(y) || cudaFree(x)) {
            fprintf(stderr, "alloc_churn_fake: step %d: cudaFree failed\n", s);
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("alloc_churn_fake: %d steps, %d cudaMalloc+cudaFree pairs, %.3f s\n", steps, steps * 3, secs);
    return 0;
}
