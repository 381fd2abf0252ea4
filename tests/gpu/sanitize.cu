/* Bugs inside the pool that compute-sanitizer can only see with debug.nvtx
 * (shim/nvtx.c), and what guard mode (debug.guard, core/guard.c) reports.
 *
 *   sanitize overflow   block A of 1000 floats (4000 bytes: the pool rounds
 *                       it to 4096, so 96 bytes of A's own block follow
 *                       it), then B; a kernel writes A[0..1000]: one
 *                       element past what was asked for, into memory that
 *                       is mapped under every stack (natively memcheck
 *                       knows the 4000 bytes and reports it; under the
 *                       shim only with debug.nvtx or debug.guard). With
 *                       4096 bytes the write would land in whatever
 *                       follows A: B (no tool can tell), or unmapped
 *                       space at a piece's end (small blocks are cut from
 *                       the back of free memory), a crash
 *   sanitize uaf        A and B; cudaFree(A); a kernel writes A[0]
 *                       (A's range stays in the pool, pending or free)
 *   sanitize clean      the same allocations, every access inside its
 *                       block, both doors' sync and stream-ordered calls
 *   sanitize overflow_async   the overflow on a cudaMallocAsync block
 *
 * The program does not judge itself (memcheck or the shim does): it exits 0
 * unless a CUDA call fails, and prints "block A <pointer>" so that the
 * guard's report can be matched to the block. tests/gpu/run.sh runs it
 * under `compute-sanitizer --tool memcheck` with and without the option and
 * reads the ERROR SUMMARY, and under POOLSHIM_GUARD for guard mode. */
#include "gpu_test.h"

__global__ void write_range(float *p, size_t from, size_t to, float value)
{
    size_t i = from + (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < to)
        p[i] = value;
}

static const size_t N = 1000; /* floats in A: 4000 bytes, padded to 4096 by the pool's alignment */

static void overflow(bool async)
{
    float *a = NULL, *b = NULL;
    cudaStream_t s = 0;
    if (async) {
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CK(cudaMallocAsync((void **)&a, N * sizeof(float), s));
        CK(cudaMallocAsync((void **)&b, N * sizeof(float), s));
    } else {
        CK(cudaMalloc((void **)&a, N * sizeof(float)));
        CK(cudaMalloc((void **)&b, N * sizeof(float)));
    }
    printf("block A %p (%zu bytes), block B %p\n", (void *)a, N * sizeof(float), (void *)b);
    write_range<<<(N + 1 + 255) / 256, 256, 0, s>>>(a, 0, N + 1, 1.0f); /* one element too many */
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    if (async) {
        CK(cudaFreeAsync(a, s));
        CK(cudaFreeAsync(b, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaStreamDestroy(s));
    } else {
        CK(cudaFree(a));
        CK(cudaFree(b));
    }
}

static void use_after_free(void)
{
    float *a = NULL, *b = NULL;
    CK(cudaMalloc((void **)&a, N * sizeof(float)));
    CK(cudaMalloc((void **)&b, N * sizeof(float)));
    printf("block A %p (%zu bytes), block B %p\n", (void *)a, N * sizeof(float), (void *)b);
    write_range<<<(N + 255) / 256, 256>>>(a, 0, N, 1.0f);
    CK(cudaGetLastError());
    CK(cudaFree(a));
    write_range<<<1, 32>>>(a, 0, 1, 2.0f); /* A was freed */
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaFree(b));
}

static void clean(void)
{
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *blocks[16];
    size_t counts[16];
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 16; i++) {
            counts[i] = 1 + (size_t)(i * 977 + round * 131) % 50000;
            if (i % 2)
                CK(cudaMallocAsync((void **)&blocks[i], counts[i] * sizeof(float), s));
            else
                CK(cudaMalloc((void **)&blocks[i], counts[i] * sizeof(float)));
            write_range<<<blocks_for(counts[i]), 256, 0, i % 2 ? s : 0>>>(blocks[i], 0, counts[i], (float)i);
            CK(cudaGetLastError());
        }
        CK(cudaDeviceSynchronize());
        for (int i = 0; i < 16; i++)
            if (i % 2)
                CK(cudaFreeAsync(blocks[i], s));
            else
                CK(cudaFree(blocks[i]));
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "clean";
    CK(cudaFree(0));
    if (!strcmp(mode, "overflow"))
        overflow(false);
    else if (!strcmp(mode, "overflow_async"))
        overflow(true);
    else if (!strcmp(mode, "uaf"))
        use_after_free();
    else if (!strcmp(mode, "clean"))
        clean();
    else {
        fprintf(stderr, "sanitize: unknown mode %s (overflow, overflow_async, uaf, clean)\n", mode);
        return EXIT_CUDA_ERROR;
    }
    printf("sanitize %s: OK (the verdict is the sanitizer's or the guard's)\n", mode);
    return 0;
}
