/* first_malloc: the cost of growth as a fresh process sees it.
 *   first_malloc SIZE_GIB [warm]  one cudaMalloc of SIZE_GIB GiB after the context
 *                              exists (cudaFree(0)), then its cudaFree; warm: after a
 *                              256 B cudaMalloc + cudaFree, so the growth is timed
 *                              without the process's first allocation call
 *   first_malloc fill [N]      cudaMalloc 1 GiB blocks until N (default: until the
 *                              first failure, leaving 2 GiB), then free them all
 * Prints one line: "first_malloc: <what> <ms> ms" (host wall time of the
 * allocation calls alone), and "first_malloc: ... fill N blocks" for a fill.
 * A kernel writes every byte of the first and last block and the sum is checked,
 * so a mapping that is not usable shows as an error, not as a fast number.
 * tools/bench/growth.sh runs it natively and under each stack in alternated
 * rounds and prints the ratios (the target: growth at native speed). */
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

static double now_ms()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

__global__ void fill_words(unsigned *p, size_t n, unsigned v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

__global__ void count_words(const unsigned *p, size_t n, unsigned v, unsigned long long *bad)
{
    unsigned long long mine = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        mine += p[i] != v;
    if (mine)
        atomicAdd(bad, mine);
}

static int check(void *p, size_t bytes, unsigned v)
{
    unsigned long long *bad, host = 0;
    if (cudaMalloc(&bad, sizeof *bad) != cudaSuccess)
        return 1;
    cudaMemset(bad, 0, sizeof *bad);
    fill_words<<<1024, 256>>>((unsigned *)p, bytes / 4, v);
    count_words<<<1024, 256>>>((const unsigned *)p, bytes / 4, v, bad);
    cudaMemcpy(&host, bad, sizeof host, cudaMemcpyDeviceToHost);
    cudaFree(bad);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess || host) {
        printf("first_malloc: FAIL %s, %llu wrong words\n", cudaGetErrorString(e), host);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: first_malloc SIZE_GIB | fill [N]\n");
        return 2;
    }
    cudaFree(0);
    const size_t gib = 1ull << 30;
    if (strcmp(argv[1], "fill")) {
        size_t bytes = (size_t)(atof(argv[1]) * gib);
        void *p = nullptr;
        if (argc > 2 && !strcmp(argv[2], "warm") &&
            (cudaMalloc(&p, 256) != cudaSuccess || cudaFree(p) != cudaSuccess)) {
            printf("first_malloc: FAIL the warm-up pair\n");
            return 1;
        }
        double t0 = now_ms();
        cudaError_t e = cudaMalloc(&p, bytes);
        double t1 = now_ms();
        if (e != cudaSuccess) {
            printf("first_malloc: FAIL cudaMalloc %s: %s\n", argv[1], cudaGetErrorString(e));
            return 1;
        }
        if (check(p, bytes, 0x5a5a5a5a))
            return 1;
        double t2 = now_ms();
        cudaFree(p);
        double t3 = now_ms();
        printf("first_malloc: %s GiB%s %.3f ms (free %.3f ms)\n", argv[1], argc > 2 ? " warm" : "", t1 - t0,
               t3 - t2);
        return 0;
    }
    size_t limit = argc > 2 ? strtoull(argv[2], nullptr, 10) : 1000000;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    size_t room = total_b / gib > 2 ? total_b / gib - 2 : 0; /* the device's size, less 2 GiB */
    if (limit > room)
        limit = room;
    void **blocks = (void **)calloc(limit ? limit : 1, sizeof *blocks);
    size_t n = 0;
    double t0 = now_ms();
    while (n < limit && cudaMalloc(&blocks[n], gib) == cudaSuccess)
        n++;
    double t1 = now_ms();
    cudaGetLastError();
    if (!n || check(blocks[0], gib, 1) || check(blocks[n - 1], gib, 2))
        return 1;
    double t2 = now_ms();
    for (size_t i = 0; i < n; i++)
        cudaFree(blocks[i]);
    double t3 = now_ms();
    printf("first_malloc: fill %zu blocks %.3f ms (free %.3f ms)\n", n, t1 - t0, t3 - t2);
    free(blocks);
    return 0;
}
