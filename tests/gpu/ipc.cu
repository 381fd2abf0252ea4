/* ipc — CUDA IPC of a cudaMalloc'ed block between two processes, natively
 * and under the shim (where the block is a suballocation of the pool).
 *
 * Steps (the parent):
 *   1. cudaMalloc a small block, then a big one (37 MiB + 12345 bytes: one
 *      physical allocation, a setup run, or 19 pieces of the expandable
 *      pool with expandable_setup_run_min = 0, tests/gpu/run.sh 5b), write a pattern (seed 11) on the GPU.
 *   2. cudaIpcGetMemHandle of the big block (timed). --expect=refused: it
 *      must fail (the chunked pool, global.ipc=0): print PASS and stop.
 *      cuMemGetAddressRange inside it gives the block (what PyTorch uses to
 *      find the offset it sends with the handle).
 *   3. fork+exec this program as `child` (LD_PRELOAD is inherited, so the
 *      child runs under the shim too): it opens the handle (timed), counts
 *      mismatches against seed 11 on the GPU, checks cuMemGetAddressRange of
 *      the opened pointer, writes seed 12, closes the handle. Exit 3 when
 *      the bytes were wrong.
 *   4. The parent counts mismatches against seed 12: the child's writes must
 *      be in its block.
 *   5. Under the shim: opening its own handle fails; after cudaFree and a new
 *      cudaMalloc of the same size, a child opening the old handle must be
 *      refused (stale handle).
 * Exit 0: all held; 3: wrong bytes (the negative control,
 * POOLSHIM_TEST_IPC_SKEW=1, makes the shim's import map the block's pieces
 * out of order, and this must exit 3; it needs a block of several pieces,
 * so run.sh turns setup runs off for it); 1: anything else. */
#include "gpu_test.h"

#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIG ((size_t)37 << 20) + 12345

static double export_us;

static void to_hex(const cudaIpcMemHandle_t *h, char *out)
{
    for (int i = 0; i < 64; i++)
        sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static void from_hex(const char *s, cudaIpcMemHandle_t *h)
{
    EXPECT(strlen(s) == 128, "a 128-digit handle");
    for (int i = 0; i < 64; i++) {
        unsigned v;
        EXPECT(sscanf(s + 2 * i, "%2x", &v) == 1, "hex digits");
        h->reserved[i] = (char)v;
    }
}

static unsigned long long mismatches(const void *p, size_t n, uint32_t seed)
{
    unsigned long long *count;
    CK(cudaMalloc(&count, sizeof *count));
    CK(cudaMemset(count, 0, sizeof *count));
    count_mismatches(p, n, seed, count, 0);
    unsigned long long host = 0;
    CK(cudaMemcpy(&host, count, sizeof host, cudaMemcpyDeviceToHost));
    CK(cudaFree(count));
    return host;
}

/* Runs this program as `role HEX`; returns its exit status. */
static int spawn(const char *role, const cudaIpcMemHandle_t *h)
{
    char hex[129];
    to_hex(h, hex);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("POOLSHIM_STATS", "0", 1); /* the parent's statistics are the ones checked */
        execl("/proc/self/exe", "ipc", role, hex, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int child(const char *hex, int stale)
{
    cudaIpcMemHandle_t h;
    from_hex(hex, &h);
    CK(cudaSetDevice(0));
    void *p = nullptr;
    double t0 = now_ns();
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    double t1 = now_ns();
    if (stale) {
        cudaGetLastError();
        EXPECT(e != cudaSuccess, "a handle of a freed block is refused (got a pointer %p)", p);
        printf("ipc child: stale handle refused (%s)\n", cudaGetErrorName(e));
        return 0;
    }
    CK(e);
    printf("ipc child: opened %zu bytes at %p in %.1f us\n", (size_t)BIG, p, (t1 - t0) / 1e3);
    printf("RESULT ipc_child open_us=%.1f\n", (t1 - t0) / 1e3); /* the IPC round trip: connect, request, map */
    unsigned long long bad = mismatches(p, BIG, 11);
    CUdeviceptr base = 0;
    size_t size = 0;
    EXPECT(cuMemGetAddressRange(&base, &size, (CUdeviceptr)p + 100) == CUDA_SUCCESS, "cuMemGetAddressRange");
    printf("ipc child: cuMemGetAddressRange -> base %s the opened pointer, %zu bytes\n",
           base == (CUdeviceptr)p ? "is" : "is NOT", size);
    if (bad) {
        printf("ipc child: FAIL %llu of %zu bytes differ from the exporter's pattern\n", bad, (size_t)BIG);
        return EXIT_CORRUPTION;
    }
    EXPECT(base == (CUdeviceptr)p && size >= BIG, "the opened block's range (%zu bytes)", size);
    fill_pattern(p, BIG, 12, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaIpcCloseMemHandle(p));
    printf("ipc child: verified, wrote seed 12, closed\n");
    return 0;
}

static int parent(const char *expect)
{
    int shim = poolshim_is_active();
    void *small = nullptr, *big = nullptr;
    CK(cudaMalloc(&small, 3000));
    CK(cudaMalloc(&big, BIG));
    fill_pattern(big, BIG, 11, 0);
    CK(cudaDeviceSynchronize());

    cudaIpcMemHandle_t h;
    double t0 = now_ns();
    cudaError_t e = cudaIpcGetMemHandle(&h, big);
    export_us = (now_ns() - t0) / 1e3;
    if (!strcmp(expect, "refused")) {
        cudaGetLastError();
        EXPECT(e != cudaSuccess, "cudaIpcGetMemHandle of a pooled block is refused here");
        printf("ipc: PASS refused as expected (%s)\n", cudaGetErrorName(e));
        return 0;
    }
    CK(e);
    CUdeviceptr base = 0;
    size_t size = 0;
    EXPECT(cuMemGetAddressRange(&base, &size, (CUdeviceptr)big + 100) == CUDA_SUCCESS && base == (CUdeviceptr)big,
           "the exporter's cuMemGetAddressRange gives the block");
    printf("ipc: exported %zu bytes (shim %s) in %.1f us\n", (size_t)BIG, shim ? "active" : "inactive", export_us);

    int rc = spawn("child", &h);
    if (rc != 0) {
        printf("ipc: FAIL the child exited %d\n", rc);
        return rc == EXIT_CORRUPTION ? EXIT_CORRUPTION : 1;
    }
    unsigned long long bad = mismatches(big, BIG, 12);
    if (bad) {
        printf("ipc: FAIL %llu bytes of the block are not the child's pattern\n", bad);
        return EXIT_CORRUPTION;
    }
    printf("ipc: PASS the child read the block and its writes are in it\n");

    if (shim) {
        void *own = nullptr;
        e = cudaIpcOpenMemHandle(&own, h, cudaIpcMemLazyEnablePeerAccess);
        cudaGetLastError();
        EXPECT(e != cudaSuccess, "a process cannot open its own handle");
        CK(cudaFree(big));
        void *again = nullptr;
        CK(cudaMalloc(&again, BIG));
        rc = spawn("stale", &h);
        EXPECT(rc == 0, "the stale handle was refused in the child (exit %d)", rc);
        printf("ipc: PASS own handle and stale handle refused (new block %s the old address)\n",
               again == big ? "at" : "not at");
        CK(cudaFree(again));
    } else {
        CK(cudaFree(big));
    }
    CK(cudaFree(small));
    printf("RESULT ipc export_us=%.1f\n", export_us);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "child"))
        return child(argv[2], 0);
    if (argc == 3 && !strcmp(argv[1], "stale"))
        return child(argv[2], 1);
    const char *expect = "ok";
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--expect=", 9))
            expect = argv[i] + 9;
        else {
            fprintf(stderr, "usage: ipc [--expect=ok|refused]\n");
            return 1;
        }
    int rc = parent(expect);
    printf("ipc: %s\n", rc == 0 ? "OK" : "FAIL");
    return rc;
}
