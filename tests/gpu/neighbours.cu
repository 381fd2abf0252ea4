/* neighbours — a second program gets the memory the first one freed (memory goes back).
 *
 *   neighbours give DIR           cudaMalloc 80% of the card (at most 95% of what
 *       is free at the start) in 64 MiB blocks, fill them, free them all; write
 *       DIR/ready; then sleep until DIR/release exists (at most 300 s).
 *   neighbours take DIR [RETRY_S] wait for DIR/ready (at most 120 s), then
 *       cudaMalloc the same 80% of the card in 64 MiB blocks, fill and check
 *       them; a cudaMalloc that runs out of memory is tried again every 50 ms
 *       for up to RETRY_S seconds (default 0: never; a program beside a shimmed
 *       neighbour without the shim waits for the neighbour's decay). Prints
 *       "RESULT neighbours take ..." with the blocks, slowest_ms (the slowest
 *       cudaMalloc, retries included), waited_ms (all calls over 50 ms) and
 *       came_after_free_ms (from give's last cudaFree to the end of the last
 *       such call: when the memory came); writes DIR/release.
 * Natively the memory `give` freed is the device's again at once. Under the
 * shim it stays in give's pool: a shimmed `take` gets it by asking its
 * neighbour (global.neighbour_release, shim/neighbours.c) within 1 s; with that
 * off (and the decay off) it must run out of memory: the negative control. An
 * unshimmed `take` gets it once give's decay (global.decay_ms) gave it back.
 * Exit 0: all allocated and verified; 1: an unexpected CUDA error; 2: out of
 * memory (what the control must show); 3: wrong bytes. */
#include <sys/stat.h>
#include <unistd.h>

#include "gpu_test.h"

#define EXIT_OUT_OF_MEMORY 2
static const size_t block = 64ull << 20;

static bool exists(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

/* DIR/name, holding `value` (give's ready: the CLOCK_MONOTONIC ns of its
 * last cudaFree, one clock for every process of the machine). */
static void signal_file(const char *dir, const char *name, double value)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%.0f\n", value);
        fclose(f);
    }
}

static double read_value(const char *dir, const char *name)
{
    char path[4096];
    double value = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%lf", &value) != 1)
            value = 0;
        fclose(f);
    }
    return value;
}

static bool wait_for(const char *dir, const char *name, int seconds)
{
    for (int i = 0; i < seconds * 100; i++) {
        if (exists(dir, name))
            return true;
        usleep(10000);
    }
    return false;
}

/* 80% of the card in blocks, never more than 95% of what is free now. */
static size_t blocks_wanted(void)
{
    size_t free_bytes = 0, total = 0;
    CK(cudaMemGetInfo(&free_bytes, &total));
    size_t want = total / 10 * 8, most = free_bytes / 100 * 95;
    return (want < most ? want : most) / block;
}

static int give(const char *dir)
{
    CK(cudaFree(0));
    size_t count = blocks_wanted();
    void **p = (void **)calloc(count, sizeof *p);
    for (size_t i = 0; i < count; i++) {
        cudaError_t e = cudaMalloc(&p[i], block);
        EXPECT(e == cudaSuccess, "give: cudaMalloc %zu of %zu: %s", i, count, cudaGetErrorName(e));
        fill_pattern(p[i], block, (uint32_t)i, 0);
    }
    CK(cudaDeviceSynchronize());
    for (size_t i = 0; i < count; i++)
        CK(cudaFree(p[i]));
    double freed_at = now_ns();
    free(p);
    printf("neighbours give: %zu blocks of 64 MiB (%.1f GiB) allocated, filled and freed (shim %s)\n", count,
           (double)(count * block) / (1 << 30), poolshim_is_active() ? "active" : "inactive");
    signal_file(dir, "ready", freed_at);
    if (!wait_for(dir, "release", 300))
        fprintf(stderr, "neighbours give: no release within 300 s\n");
    printf("neighbours give: OK\n");
    return 0;
}

static int take(const char *dir, double retry_s)
{
    size_t free_before = 0, total = 0;
    CK(cudaFree(0));
    size_t count = 0;
    CK(cudaMemGetInfo(&free_before, &total));
    count = total / 10 * 8 / block; /* the 80% give took, whatever is free now */
    if (!wait_for(dir, "ready", 120)) {
        fprintf(stderr, "neighbours take: the first program did not get ready\n");
        signal_file(dir, "release", 0);
        return EXIT_CUDA_ERROR;
    }
    double freed_at = read_value(dir, "ready");
    CK(cudaMemGetInfo(&free_before, &total));
    void **p = (void **)calloc(count, sizeof *p);
    double began = now_ns(), slowest = 0, retrying = 0, last_came = began;
    int status = 0;
    size_t got = 0;
    for (; got < count; got++) {
        double t = now_ns();
        cudaError_t e = cudaMalloc(&p[got], block);
        while (e == cudaErrorMemoryAllocation && now_ns() - t < retry_s * 1e9) {
            cudaGetLastError();
            usleep(50000);
            e = cudaMalloc(&p[got], block);
        }
        double took = now_ns() - t;
        slowest = took > slowest ? took : slowest;
        if (took > 50e6) { /* (a retry loop, or a long wait inside the call) */
            retrying += took;
            last_came = now_ns();
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            printf("neighbours take: cudaMalloc %zu of %zu (64 MiB) returned %s after %.1f ms: %s\n", got, count,
                   cudaGetErrorName(e), took / 1e6, e == cudaErrorMemoryAllocation ? "out of memory" : "error");
            status = e == cudaErrorMemoryAllocation ? EXIT_OUT_OF_MEMORY : EXIT_CUDA_ERROR;
            break;
        }
        fill_pattern(p[got], block, (uint32_t)got + 7, 0);
    }
    if (!status) {
        unsigned long long *counter = NULL, wrong = 0;
        CK(cudaMalloc(&counter, sizeof *counter));
        CK(cudaMemset(counter, 0, sizeof *counter));
        for (size_t i = 0; i < got; i++)
            count_mismatches(p[i], block, (uint32_t)i + 7, counter, 0);
        CK(cudaMemcpy(&wrong, counter, sizeof wrong, cudaMemcpyDeviceToHost));
        CK(cudaFree(counter));
        if (wrong) {
            printf("neighbours take: %llu wrong bytes\n", wrong);
            status = EXIT_CORRUPTION;
        }
    }
    printf("RESULT neighbours take: %zu of %zu blocks (%.1f of %.1f GiB), free at the start %.1f GiB, in %.1f ms, "
           "slowest_ms=%.1f waited_ms=%.1f came_after_free_ms=%.1f (shim %s)\n",
           got, count, (double)(got * block) / (1 << 30), (double)(count * block) / (1 << 30),
           (double)free_before / (1 << 30), (now_ns() - began) / 1e6, slowest / 1e6, retrying / 1e6,
           freed_at > 0 ? (last_came - freed_at) / 1e6 : -1.0, poolshim_is_active() ? "active" : "inactive");
    for (size_t i = 0; i < got; i++)
        CK(cudaFree(p[i]));
    free(p);
    signal_file(dir, "release", 0);
    printf("neighbours take: %s\n", status ? "FAIL" : "OK");
    return status;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "give") == 0)
        return give(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "take") == 0)
        return take(argv[2], argc > 3 ? atof(argv[3]) : 0);
    fprintf(stderr, "usage: neighbours give DIR | take DIR [RETRY_S]\n");
    return EXIT_CUDA_ERROR;
}
