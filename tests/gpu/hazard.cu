/* hazard — the safety contract of cudaFree.
 *
 * Native cudaFree waits for the device, so a range freed while a kernel still
 * uses it is never handed out before the kernel ends. A pool that reuses the
 * range at once breaks that. This program builds exactly that race:
 *   1. A kernel on stream s1 writes every byte of buffer A with pattern PA,
 *      spins ~SPIN_MS, reads A back (counting bytes that are no longer PA into
 *      a separate result counter) and writes PA again at its very end.
 *   2. Without any synchronization the host calls cudaFree(A), cudaMalloc(B)
 *      of the same size, and at once writes B from stream s2 (a memset, a
 *      kernel or an async copy, by round).
 *   3. After a device-wide sync: the kernel's counter must be 0 (nobody wrote
 *      A while it ran) and B must hold exactly what s2 wrote (the kernel's
 *      last write did not land in B).
 * If B overlaps A and the pool did not wait, both checks fail.
 *
 * Variants (argv[1]): nonblocking (s1, s2 created cudaStreamNonBlocking),
 * blocking (two ordinary streams: not ordered with each other), legacy (both
 * on the legacy default stream: always ordered), threads (4 host threads; build
 * with --default-stream per-thread: s1 is each thread's default stream),
 * newstream (s2 is a non-blocking stream created after the free: it must
 * wait for the last barrier), graph (B is written by a graph, captured on
 * another stream beforehand... no: captured after the malloc and launched on
 * a non-blocking s2), threads16 (16 host threads, each with its own
 * non-blocking s1 and s2), threads16cache (as threads16, and between
 * cudaFree(A) and cudaMalloc(B) each thread frees a 64 MiB block and makes
 * a small allocation: under the shim the big free passes the pool's barrier
 * trigger, so a barrier is issued after A's free and A is handed out again
 * as B: B == A must then be safe because of that barrier alone; written for
 * the per-thread caches when they held cudaFree'd blocks, which they no
 * longer do under the barrier, so it now covers the pool's own path),
 * threads16churn (as threads16, and between cudaFree(A) and cudaMalloc(B)
 * each thread makes 1100 cudaMalloc/cudaFree pairs of 512 B: its thread
 * cache, which keeps small cudaFree'd blocks, asks for a barrier after 512
 * frees, which releases A, so the 256 B round's B == A comes from the
 * cache and is safe because of that barrier alone).
 * Every round prints whether B == A (the allocator reused the address).
 * Exit 0: verified; 3: corruption detected; 1: error. */
#include "gpu_test.h"

#include <thread>
#include <vector>

static const unsigned long long SPIN_NS = 120ull * 1000 * 1000;
static const size_t ROUND_SIZES[] = {256, 65536, 16u << 20};
static const int ROUNDS = 3;

/* Step 1: write A, spin, count what changed, write A again at the end. */
__global__ void spin_and_guard_kernel(uint8_t *a, size_t n, uint32_t seed,
                                      unsigned long long *changed_bytes)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t i = first; i < n; i += stride)
        a[i] = pattern_byte(i, seed);
    spin_for_ns(SPIN_NS);
    unsigned long long changed = 0;
    for (size_t i = first; i < n; i += stride)
        changed += ((volatile uint8_t *)a)[i] != pattern_byte(i, seed);
    if (changed)
        atomicAdd(changed_bytes, changed);
    for (size_t i = first; i < n; i += stride)
        a[i] = pattern_byte(i, seed);
}

__global__ void set_bytes_kernel(uint8_t *p, size_t n, uint8_t value)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = value;
}

struct round_result {
    bool reused;                  /* B == A */
    bool overlapped;              /* [B, B+n) intersects [A, A+n) */
    unsigned long long changed;   /* bytes of A changed under the kernel */
    size_t b_wrong;               /* bytes of B that are not what s2 wrote */
};

enum write_kind { WRITE_BY_ROUND, WRITE_NEW_STREAM, WRITE_GRAPH };

/* What happens between cudaFree(A) and cudaMalloc(B) (threads16cache,
 * threads16churn). */
enum { PROVOKE_NONE, PROVOKE_BIG_FREE, PROVOKE_CHURN };
static const int CHURN_PAIRS = 1100;  /* > 2 x the 512 frees after which a thread cache asks for a barrier */
static const size_t CHURN_SIZE = 512; /* small (always cached), and not a round size: A stays in its bin */

/* One race of steps 1-3; s1/s2 may be 0 (the default stream of the build). */
static round_result race_once(size_t n, int round, cudaStream_t s1, cudaStream_t s2,
                              unsigned long long *changed_dev, uint8_t *pinned_source,
                              write_kind how = WRITE_BY_ROUND, int provoke = PROVOKE_NONE)
{
    const uint8_t b_value = (uint8_t)(0xA0 + round);
    void *a = nullptr, *b = nullptr;
    CK(cudaMemsetAsync(changed_dev, 0, sizeof *changed_dev, s1));
    CK(cudaMalloc(&a, n));
    CK(cudaDeviceSynchronize()); /* A is fully allocated and idle */
    int prop_sms = 0;
    CK(cudaDeviceGetAttribute(&prop_sms, cudaDevAttrMultiProcessorCount, 0));
    size_t threads = (n + 3) / 4;
    unsigned blocks = (unsigned)((threads + 255) / 256);
    if (blocks > (unsigned)prop_sms)
        blocks = (unsigned)prop_sms; /* leave room on each SM for s2's work */
    spin_and_guard_kernel<<<blocks, 256, 0, s1>>>((uint8_t *)a, n, 0x5eed + round, changed_dev);
    CK(cudaGetLastError());
    CK(cudaFree(a)); /* step 2: no sync before the free */
    if (provoke == PROVOKE_BIG_FREE) { /* pending bytes pass the barrier trigger; the next allocation issues one */
        void *big = nullptr, *small = nullptr;
        CK(cudaMalloc(&big, 64u << 20));
        CK(cudaFree(big));
        CK(cudaMalloc(&small, 768));
        CK(cudaFree(small));
    } else if (provoke == PROVOKE_CHURN) { /* a thread cache asks for a barrier (after 512 frees) */
        for (int i = 0; i < CHURN_PAIRS; i++) {
            void *x = nullptr;
            CK(cudaMalloc(&x, CHURN_SIZE));
            CK(cudaFree(x));
        }
    }
    CK(cudaMalloc(&b, n));
    cudaStream_t fresh = 0;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (how == WRITE_NEW_STREAM) { /* (c) a stream born after the free */
        CK(cudaStreamCreateWithFlags(&fresh, cudaStreamNonBlocking));
        set_bytes_kernel<<<blocks_for(n), 256, 0, fresh>>>((uint8_t *)b, n, b_value);
        CK(cudaGetLastError());
    } else if (how == WRITE_GRAPH) { /* (f) a graph launch */
        cudaStream_t capture;
        CK(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
        CK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeRelaxed));
        set_bytes_kernel<<<blocks_for(n), 256, 0, capture>>>((uint8_t *)b, n, b_value);
        CK(cudaStreamEndCapture(capture, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaGraphLaunch(exec, s2));
        CK(cudaStreamDestroy(capture));
    } else switch (round % 3) {
    case 0:
        CK(cudaMemsetAsync(b, b_value, n, s2));
        break;
    case 1:
        set_bytes_kernel<<<blocks_for(n), 256, 0, s2>>>((uint8_t *)b, n, b_value);
        CK(cudaGetLastError());
        break;
    default:
        memset(pinned_source, b_value, n);
        CK(cudaMemcpyAsync(b, pinned_source, n, cudaMemcpyHostToDevice, s2));
        break;
    }
    CK(cudaDeviceSynchronize()); /* step 3 */
    if (fresh)
        CK(cudaStreamDestroy(fresh));
    if (exec) {
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
    }
    round_result r;
    r.reused = a == b;
    r.overlapped = (uintptr_t)b < (uintptr_t)a + n && (uintptr_t)a < (uintptr_t)b + n;
    CK(cudaMemcpy(&r.changed, changed_dev, sizeof r.changed, cudaMemcpyDeviceToHost));
    uint8_t *host = (uint8_t *)malloc(n);
    CK(cudaMemcpy(host, b, n, cudaMemcpyDeviceToHost));
    r.b_wrong = 0;
    for (size_t i = 0; i < n; i++)
        r.b_wrong += host[i] != b_value;
    free(host);
    CK(cudaFree(b));
    return r;
}

static int report(const char *variant, int thread, size_t n, int round, const round_result &r)
{
    bool corrupt = r.changed != 0 || r.b_wrong != 0;
    printf("hazard %s thread %d round %d size %zu: B==A %s (overlap %s), bytes of A changed under the kernel %llu, bytes of B wrong %zu: %s\n",
           variant, thread, round, n, r.reused ? "yes" : "no", r.overlapped ? "yes" : "no",
           r.changed, r.b_wrong, corrupt ? "CORRUPTED" : "ok");
    return corrupt;
}

static int run_variant(const char *variant)
{
    write_kind how = !strcmp(variant, "newstream") ? WRITE_NEW_STREAM
                     : !strcmp(variant, "graph")   ? WRITE_GRAPH
                                                   : WRITE_BY_ROUND;
    unsigned long long *changed_dev = nullptr;
    uint8_t *pinned = nullptr;
    CK(cudaMalloc((void **)&changed_dev, sizeof *changed_dev));
    CK(cudaMallocHost((void **)&pinned, 16u << 20));
    cudaStream_t s1 = 0, s2 = 0;
    bool own_streams = strcmp(variant, "legacy") != 0;
    if (own_streams) {
        unsigned flags = strcmp(variant, "blocking") == 0 ? cudaStreamDefault : cudaStreamNonBlocking;
        CK(cudaStreamCreateWithFlags(&s1, flags));
        CK(cudaStreamCreateWithFlags(&s2, flags));
    }
    int corrupt = 0, reused = 0;
    for (int round = 0; round < ROUNDS; round++) {
        size_t n = ROUND_SIZES[round % 3];
        round_result r = race_once(n, round, s1, s2, changed_dev, pinned, how);
        corrupt += report(variant, 0, n, round, r);
        reused += r.overlapped;
    }
    if (own_streams) {
        CK(cudaStreamDestroy(s1));
        CK(cudaStreamDestroy(s2));
    }
    CK(cudaFreeHost(pinned));
    CK(cudaFree(changed_dev));
    printf("hazard %s: %d of %d rounds reused A's range, %d corrupted\n", variant, reused, ROUNDS, corrupt);
    return corrupt;
}

/* Each thread races on its own default stream (per-thread when built with
 * --default-stream per-thread) against its own non-blocking s2. */
static int run_threads(int thread_count, bool own_s1, int provoke = PROVOKE_NONE)
{
    std::vector<int> corrupt(thread_count, 0), reused(thread_count, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < thread_count; t++) {
        threads.emplace_back([t, own_s1, provoke, &corrupt, &reused]() {
            CK(cudaSetDevice(0));
            unsigned long long *changed_dev = nullptr;
            uint8_t *pinned = nullptr;
            CK(cudaMalloc((void **)&changed_dev, sizeof *changed_dev));
            CK(cudaMallocHost((void **)&pinned, 16u << 20));
            cudaStream_t s1 = 0, s2;
            if (own_s1)
                CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
            CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
            for (int round = 0; round < ROUNDS; round++) {
                size_t n = ROUND_SIZES[(round + t) % 3];
                round_result r = race_once(n, round, s1, s2, changed_dev, pinned, WRITE_BY_ROUND, provoke);
                corrupt[t] += report("threads", t, n, round, r);
                reused[t] += r.overlapped;
            }
            CK(cudaStreamDestroy(s2));
            if (s1)
                CK(cudaStreamDestroy(s1));
            CK(cudaFreeHost(pinned));
            CK(cudaFree(changed_dev));
        });
    }
    for (std::thread &th : threads)
        th.join();
    int total_corrupt = 0, total_reused = 0;
    for (int t = 0; t < thread_count; t++) {
        total_corrupt += corrupt[t];
        total_reused += reused[t];
    }
    printf("hazard threads: %d of %d rounds reused a freed range, %d corrupted\n", total_reused,
           ROUNDS * thread_count, total_corrupt);
    return total_corrupt;
}

int main(int argc, char **argv)
{
    const char *variant = argc > 1 ? argv[1] : "nonblocking";
    int corrupt;
    if (strcmp(variant, "threads") == 0)
        corrupt = run_threads(4, false);
    else if (strcmp(variant, "threads16") == 0)
        corrupt = run_threads(16, true);
    else if (strcmp(variant, "threads16cache") == 0)
        corrupt = run_threads(16, true, PROVOKE_BIG_FREE);
    else if (strcmp(variant, "threads16churn") == 0)
        corrupt = run_threads(16, true, PROVOKE_CHURN);
    else if (!strcmp(variant, "nonblocking") || !strcmp(variant, "blocking") || !strcmp(variant, "legacy") ||
             !strcmp(variant, "newstream") || !strcmp(variant, "graph"))
        corrupt = run_variant(variant);
    else {
        fprintf(stderr, "usage: hazard nonblocking|blocking|legacy|threads|threads16|threads16cache|threads16churn|newstream|graph\n");
        return EXIT_CUDA_ERROR;
    }
    if (corrupt) {
        printf("hazard %s: CORRUPTION DETECTED\n", variant);
        return EXIT_CORRUPTION;
    }
    printf("hazard %s: OK\n", variant);
    return 0;
}
