/* multi_gpu — one process on two GPUs, as natively. Needs two GPUs: with
 * one, every case prints `multi_gpu: SKIP (...)` before its first allocation
 * and exits 0 (the suite records SKIP).
 *
 * Cases (argv[1]):
 *   cross        1. a block on each device, filled by a kernel of its device;
 *                2. cudaMemGetInfo of each device dropped by about the block
 *                   (not the other device's);
 *                3. each block read back and freed while the *other* device is
 *                   current; 4. the same sizes again on each device: each
 *                   device's free memory drops by about one block, not two (the
 *                   free went back to the block's own device and was reused).
 *   peer_before  device 1 is granted access to device 0 (cudaDeviceEnablePeerAccess)
 *                before device 0 allocated anything (its pool is built after
 *                the grant), then device 0 allocates; a kernel on device 1
 *                reads every byte and writes a block, device 0 checks it;
 *                then peer copies both ways (cudaMemcpyPeer, cudaMemcpyDefault).
 *   peer_after   device 0 allocates first, then device 1 is granted access,
 *                then device 0 allocates more (memory mapped before and after
 *                the grant); the same kernels and copies. (tests/gpu/peer.cu does the
 *                other direction: device 0 reading device 1.)
 *   copies       no peer access: cudaMemcpyPeer, cudaMemcpyPeerAsync and
 *                cudaMemcpy(cudaMemcpyDefault) between pooled blocks of the two
 *                devices, both ways; every byte checked by a kernel.
 *   order        copies of a device's pooled memory with the other device current,
 *                ordered as CUDA orders cudaMalloc memory (tests/gpu/cross_device_probe.cu):
 *                device 1 spins 300 ms then fills B; with device 0 current a cudaMemcpy
 *                D2H, a cudaMemcpy2D D2H and a cudaMemcpyAsync on the legacy stream of B
 *                must see the fill; device 0 spins, then cudaMemcpy(B, A, Default) and
 *                cudaMemset(B) with device 0 current: a device-1 kernel right after must
 *                see them; a cudaMallocAsync block of device 0 copied into device-1
 *                memory with cudaMemcpyAsync(Default) on a device-0 stream.
 *   mempool      cudaMemPoolSetAccess(default pool of device 0, device 1 read-write),
 *                cudaMallocAsync on device 0: a device-1 kernel reads it and writes it,
 *                device 0 checks; a cudaMemcpyAsync(Default) of it into device-1 memory
 *                (NVIDIA's stream-ordered P2P sample does the first).
 *   threads      16 threads, each alternating devices (cudaSetDevice) for 40
 *                rounds: allocates blocks of varied sizes, fills them on its own
 *                stream, checks every byte, frees half itself and hands the other
 *                half to the next thread, which checks and frees them with the
 *                block's *other* device current.
 *   stacks [LIMIT_MIB]   per-device stacks (tests/gpu/multi_gpu_stacks.ini): 4
 *                blocks of LIMIT/2 live on device 0 (a pool without a limit);
 *                on device 1 LIMIT/2, then 3*LIMIT/4 more. With LIMIT given
 *                (under the shim, device 1 behind a limit of LIMIT MiB) the
 *                second must fail with cudaErrorMemoryAllocation; without it
 *                (natively) it must succeed. Default LIMIT for sizes: 256.
 * Exit 0: verified; 1: a CUDA error or a broken expectation; 3: wrong bytes. */
#include <pthread.h>
#include <vector>

#include "gpu_test.h"

static const size_t MiB = 1u << 20;

/* The number of bytes of p (on `device`) that differ from the pattern of
 * seed, counted by a kernel of `device` (which may be another device than
 * the memory's, through peer access). */
static unsigned long long mismatches_on(int device, const void *p, size_t n, uint32_t seed, cudaStream_t stream = 0)
{
    CK(cudaSetDevice(device));
    unsigned long long *counter = nullptr, wrong = 0;
    CK(cudaMalloc((void **)&counter, sizeof *counter));
    CK(cudaMemsetAsync(counter, 0, sizeof *counter, stream));
    count_mismatches(p, n, seed, counter, stream);
    CK(cudaMemcpyAsync(&wrong, counter, sizeof wrong, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaFree(counter));
    return wrong;
}

/* Free bytes of `device` as cudaMemGetInfo reports them. */
static size_t free_on(int device)
{
    size_t free_bytes = 0, total = 0;
    CK(cudaSetDevice(device));
    CK(cudaDeviceSynchronize());
    CK(cudaMemGetInfo(&free_bytes, &total));
    EXPECT(free_bytes <= total, "free %zu <= total %zu on device %d", free_bytes, total, device);
    return free_bytes;
}

/* Two GPUs (and, when `peer` is set, device 1 able to reach device 0), or
 * prints SKIP and returns 0. */
static int two_gpus(const char *what, int peer)
{
    int count = 0, can = 0;
    CK(cudaGetDeviceCount(&count));
    if (count >= 2 && peer)
        CK(cudaDeviceCanAccessPeer(&can, 1, 0));
    if (count < 2 || (peer && !can)) {
        printf("multi_gpu: SKIP (%s: %d GPU(s)%s)\n", what, count,
               count >= 2 ? ", device 1 cannot access device 0" : ", needs 2");
        return 0;
    }
    return 1;
}

/* Creates each device's context and loads the test kernels there, so that
 * cudaMemGetInfo afterwards sees only the test's blocks change. */
static void warm_up(void)
{
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        unsigned long long *counter = nullptr;
        CK(cudaMalloc((void **)&counter, 256));
        fill_pattern(counter, 256, 1, 0);
        count_mismatches(counter, 8, 1, counter, 0);
        CK(cudaDeviceSynchronize());
        CK(cudaFree(counter));
    }
}

/* A drop of free memory of about `size`: at least size - 4 MiB (rounding of
 * the report), at most size + 96 MiB (page tables, a pool's mapping piece). */
static int about(long long drop, size_t size)
{
    return drop >= (long long)size - (long long)(4 * MiB) && drop <= (long long)(size + 96 * MiB);
}

static int cross(void)
{
    if (!two_gpus("cross", 0))
        return 0;
    const size_t n = 256 * MiB;
    warm_up();
    size_t base[2] = {free_on(0), free_on(1)};
    void *block[2];
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&block[d], n));
        fill_pattern(block[d], n, 100 + d, 0);
        CK(cudaDeviceSynchronize());
    }
    long long drop[2] = {(long long)base[0] - (long long)free_on(0), (long long)base[1] - (long long)free_on(1)};
    printf("multi_gpu: cross: free memory dropped by %lld MiB on device 0, %lld MiB on device 1 for %zu MiB each\n",
           drop[0] / (long long)MiB, drop[1] / (long long)MiB, n / MiB);
    EXPECT(about(drop[0], n) && about(drop[1], n), "each device's cudaMemGetInfo shows its own block");
    size_t wrong = 0;
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(1 - d)); /* read and free with the other device current */
        wrong += host_verify_ends(block[d], n, 100 + d, 1 * MiB);
        CK(cudaFree(block[d]));
    }
    /* the same again: a free that went to the wrong device, or was lost,
     * would leave the block's device short of memory (2 blocks' worth) */
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&block[d], n));
        fill_pattern(block[d], n, 200 + d, 0);
    }
    long long again[2] = {(long long)base[0] - (long long)free_on(0), (long long)base[1] - (long long)free_on(1)};
    printf("multi_gpu: cross: after freeing with the other device current and allocating again: %lld MiB, %lld MiB\n",
           again[0] / (long long)MiB, again[1] / (long long)MiB);
    EXPECT(about(again[0], n) && about(again[1], n), "the freed blocks went back to their own devices");
    for (int d = 0; d < 2; d++) {
        wrong += mismatches_on(d, block[d], n, 200 + d);
        CK(cudaSetDevice(1 - d));
        CK(cudaFree(block[d]));
    }
    if (wrong) {
        printf("multi_gpu: cross: CORRUPTION (%zu wrong bytes)\n", wrong);
        return EXIT_CORRUPTION;
    }
    printf("multi_gpu: cross: OK\n");
    return 0;
}

/* Device 1 reads and writes device-0 memory. `grant_first`: access granted
 * before device 0 allocated anything; else between two allocations. */
static int peer(int grant_first)
{
    const char *name = grant_first ? "peer_before" : "peer_after";
    if (!two_gpus(name, 1))
        return 0;
    const size_t small = 64 * MiB, large = 512 * MiB;
    void *early = nullptr, *late = nullptr;
    if (grant_first) {
        CK(cudaSetDevice(1));
        CK(cudaDeviceEnablePeerAccess(0, 0));
    } else {
        CK(cudaSetDevice(0));
        CK(cudaMalloc(&early, small)); /* mapped before the grant */
        fill_pattern(early, small, 31, 0);
        CK(cudaDeviceSynchronize());
        CK(cudaSetDevice(1));
        CK(cudaDeviceEnablePeerAccess(0, 0));
    }
    CK(cudaSetDevice(0));
    if (!early) {
        CK(cudaMalloc(&early, small));
        fill_pattern(early, small, 31, 0);
    }
    CK(cudaMalloc(&late, large)); /* the pool grows: mapped after the grant */
    fill_pattern(late, large, 32, 0);
    CK(cudaDeviceSynchronize());
    unsigned long long wrong = mismatches_on(1, early, small, 31) + mismatches_on(1, late, large, 32);
    printf("multi_gpu: %s: a kernel on device 1 read %zu MiB of device 0: %llu wrong\n", name, (small + large) / MiB,
           wrong);
    CK(cudaSetDevice(1));
    fill_pattern(late, large, 33, 0); /* device 1 writes device 0's memory */
    CK(cudaDeviceSynchronize());
    unsigned long long wrong_written = mismatches_on(0, late, large, 33);
    printf("multi_gpu: %s: device 1 wrote %zu MiB of device 0, device 0 read it: %llu wrong\n", name, large / MiB,
           wrong_written);
    /* copies with peer access on (the driver may copy peer to peer, which
     * needs the grant on mapped memory too): device 0 -> 1 and back */
    void *on1 = nullptr;
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&on1, small));
    CK(cudaMemcpyPeer(on1, 1, early, 0, small));
    unsigned long long wrong_copied = mismatches_on(1, on1, small, 31);
    fill_pattern(on1, small, 34, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpyPeer(late, 0, on1, 1, small));
    CK(cudaMemcpy((uint8_t *)late + small, on1, small, cudaMemcpyDefault));
    wrong_copied += mismatches_on(0, late, small, 34) + mismatches_on(0, (uint8_t *)late + small, small, 34);
    printf("multi_gpu: %s: peer copies of %zu MiB both ways with peer access on: %llu wrong\n", name, small / MiB,
           wrong_copied);
    wrong += wrong_copied;
    CK(cudaSetDevice(1)); /* freed with device 1 current */
    CK(cudaFree(on1));
    CK(cudaFree(early));
    CK(cudaFree(late));
    if (wrong || wrong_written) {
        printf("multi_gpu: %s: CORRUPTION\n", name);
        return EXIT_CORRUPTION;
    }
    printf("multi_gpu: %s: OK\n", name);
    return 0;
}

static int copies(void)
{
    if (!two_gpus("copies", 0))
        return 0;
    const size_t n = 96 * MiB + 4096 + 17; /* not a round size */
    void *a0, *b0, *a1, *b1;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&a0, n));
    CK(cudaMalloc(&b0, n));
    fill_pattern(a0, n, 41, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&a1, n));
    CK(cudaMalloc(&b1, n));
    fill_pattern(a1, n, 42, 0);
    CK(cudaDeviceSynchronize());
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CK(cudaMemcpyPeer(b1, 1, a0, 0, n));                       /* 0 -> 1, synchronous */
    CK(cudaMemcpyPeerAsync(b0, 0, a1, 1, n, stream));          /* 1 -> 0, on a stream of device 1 */
    CK(cudaStreamSynchronize(stream));
    unsigned long long wrong = mismatches_on(1, b1, n, 41) + mismatches_on(0, b0, n, 42);
    /* cudaMemcpyDefault (unified addressing) with device 0 current, both ways */
    CK(cudaSetDevice(0));
    fill_pattern(a0, n, 43, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(b1, a0, n, cudaMemcpyDefault));
    CK(cudaMemcpy(b0, a1, n, cudaMemcpyDefault));
    wrong += mismatches_on(1, b1, n, 43) + mismatches_on(0, b0, n, 42);
    printf("multi_gpu: copies: 4 peer copies of %zu bytes between pooled blocks: %llu wrong\n", n, wrong);
    CK(cudaSetDevice(1));
    CK(cudaStreamDestroy(stream));
    CK(cudaFree(a0));
    CK(cudaFree(b0));
    CK(cudaSetDevice(0));
    CK(cudaFree(a1));
    CK(cudaFree(b1));
    if (wrong) {
        printf("multi_gpu: copies: CORRUPTION\n");
        return EXIT_CORRUPTION;
    }
    printf("multi_gpu: copies: OK\n");
    return 0;
}

__global__ void spin_kernel(long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

/* Queues a 300 ms spin on `device`'s legacy stream. */
static void spin_300ms(int device)
{
    int khz = 0;
    CK(cudaSetDevice(device));
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
    spin_kernel<<<1, 1>>>((long long)khz * 300);
    CK(cudaGetLastError());
}

static int order(void)
{
    if (!two_gpus("order", 0))
        return 0;
    const size_t n = 96 * MiB + 4096 + 17;
    void *a0 = nullptr, *b1 = nullptr;
    uint8_t *host = nullptr;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&a0, n));
    fill_pattern(a0, n, 7, 0);
    CK(cudaMallocHost((void **)&host, n));
    CK(cudaDeviceSynchronize());
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&b1, n));
    fill_pattern(b1, n, 1, 0);
    CK(cudaDeviceSynchronize());
    unsigned long long wrong[6] = {0, 0, 0, 0, 0, 0};
    /* 1. device 1 writes B behind a spin; device 0 current reads it */
    spin_300ms(1);
    fill_pattern(b1, n, 2, 0);
    CK(cudaSetDevice(0));
    CK(cudaMemcpy(host, b1, n, cudaMemcpyDeviceToHost));
    wrong[0] = host_verify_ends(host, n, 2, n / 2);
    spin_300ms(1);
    fill_pattern(b1, n, 3, 0);
    CK(cudaSetDevice(0));
    const size_t pitch = 1 * MiB, rows = n / pitch;
    CK(cudaMemcpy2D(host, pitch, b1, pitch, pitch, rows, cudaMemcpyDeviceToHost));
    wrong[1] = host_verify_ends(host, rows * pitch, 3, rows * pitch / 2);
    spin_300ms(1);
    fill_pattern(b1, n, 4, 0);
    CK(cudaSetDevice(0));
    CK(cudaMemcpyAsync(host, b1, n, cudaMemcpyDefault, 0));
    CK(cudaStreamSynchronize(0));
    wrong[2] = host_verify_ends(host, n, 4, n / 2);
    /* 2. device 0 writes B behind a spin of its own; device 1 reads at once */
    spin_300ms(0);
    CK(cudaMemcpy(b1, a0, n, cudaMemcpyDefault));
    wrong[3] = mismatches_on(1, b1, n, 7);
    /* (cudaMemset of another device's cudaMalloc memory is refused natively:
     * invalid value, H200, CUDA 13.0; the shim lets it run, ordered) */
    spin_300ms(1);
    fill_pattern(b1, n, 5, 0);
    CK(cudaSetDevice(0));
    CK(cudaMemcpy(a0, b1, n, cudaMemcpyDeviceToDevice)); /* device 0 reads B behind device 1's fill */
    wrong[4] = mismatches_on(0, a0, n, 5);
    /* 3. a stream-ordered block of device 0 into device-1 memory */
    CK(cudaSetDevice(0));
    cudaStream_t s0;
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    void *async0 = nullptr;
    CK(cudaMallocAsync(&async0, n, s0));
    fill_pattern(async0, n, 9, s0);
    CK(cudaMemcpyAsync(b1, async0, n, cudaMemcpyDefault, s0));
    CK(cudaStreamSynchronize(s0));
    wrong[5] = mismatches_on(1, b1, n, 9);
    CK(cudaSetDevice(0));
    CK(cudaFreeAsync(async0, s0));
    CK(cudaStreamSynchronize(s0));
    CK(cudaStreamDestroy(s0));
    printf("multi_gpu: order: wrong bytes: D2H behind device 1 %llu, 2D %llu, async legacy %llu; Default copy "
           "before device 1's kernel %llu; D2D behind device 1 %llu; async block into device 1 %llu\n",
           wrong[0], wrong[1], wrong[2], wrong[3], wrong[4], wrong[5]);
    CK(cudaFree(a0));
    CK(cudaFreeHost(host));
    CK(cudaSetDevice(1));
    CK(cudaFree(b1));
    CK(cudaDeviceSynchronize());
    unsigned long long total = wrong[0] + wrong[1] + wrong[2] + wrong[3] + wrong[4] + wrong[5];
    if (total) {
        printf("multi_gpu: order: CORRUPTION\n");
        return EXIT_CORRUPTION;
    }
    printf("multi_gpu: order: OK\n");
    return 0;
}

static int mempool(void)
{
    if (!two_gpus("mempool", 1))
        return 0;
    const size_t n = 96 * MiB + 4096 + 17;
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    cudaMemAccessDesc desc = {};
    desc.location.type = cudaMemLocationTypeDevice;
    desc.location.id = 1;
    desc.flags = cudaMemAccessFlagsProtReadWrite;
    CK(cudaMemPoolSetAccess(pool, &desc, 1));
    CK(cudaSetDevice(0));
    cudaStream_t s0;
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    void *p = nullptr, *q = nullptr;
    CK(cudaMallocAsync(&p, n, s0));
    fill_pattern(p, n, 51, s0);
    CK(cudaStreamSynchronize(s0));
    unsigned long long wrong = mismatches_on(1, p, n, 51); /* device 1 reads device 0's pool memory */
    CK(cudaSetDevice(1));
    fill_pattern(p, n, 52, 0); /* and writes it */
    CK(cudaDeviceSynchronize());
    unsigned long long written = mismatches_on(0, p, n, 52);
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&q, n));
    CK(cudaSetDevice(0));
    CK(cudaMemcpyAsync(q, p, n, cudaMemcpyDefault, s0));
    CK(cudaStreamSynchronize(s0));
    unsigned long long copied = mismatches_on(1, q, n, 52);
    printf("multi_gpu: mempool: device 1 read %llu wrong, wrote %llu wrong, copy %llu wrong\n", wrong, written,
           copied);
    CK(cudaSetDevice(0));
    CK(cudaFreeAsync(p, s0));
    CK(cudaStreamSynchronize(s0));
    CK(cudaStreamDestroy(s0));
    CK(cudaSetDevice(1));
    CK(cudaFree(q));
    if (wrong || written || copied) {
        printf("multi_gpu: mempool: CORRUPTION\n");
        return EXIT_CORRUPTION;
    }
    printf("multi_gpu: mempool: OK\n");
    return 0;
}

/* ---- threads ---------------------------------------------------------------- */
enum { THREADS = 16, ROUNDS = 40, BLOCKS = 6 };

typedef struct handed_block {
    void *p;
    size_t size;
    uint32_t seed;
    int device;
} handed_block_t;

/* One mailbox per thread: blocks handed to it by the previous thread. */
static struct {
    pthread_mutex_t lock;
    std::vector<handed_block_t> blocks;
} mailbox[THREADS];
static unsigned long long thread_wrong, cross_frees, thread_frees;
static pthread_mutex_t totals_lock = PTHREAD_MUTEX_INITIALIZER;

/* Checks and frees the blocks in thread t's mailbox, each with its other
 * device current; returns the wrong bytes seen. */
static unsigned long long drain(int t, cudaStream_t stream[2], unsigned long long *crossed)
{
    std::vector<handed_block_t> mine;
    pthread_mutex_lock(&mailbox[t].lock);
    mine.swap(mailbox[t].blocks);
    pthread_mutex_unlock(&mailbox[t].lock);
    unsigned long long wrong = 0;
    for (const handed_block_t &b : mine) {
        wrong += mismatches_on(b.device, b.p, b.size, b.seed, stream[b.device]);
        CK(cudaSetDevice(1 - b.device));
        int current = -1;
        CK(cudaGetDevice(&current));
        EXPECT(current == 1 - b.device, "the other device is current at the free");
        CK(cudaFree(b.p));
        (*crossed)++;
    }
    return wrong;
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    cudaStream_t stream[2];
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        CK(cudaStreamCreateWithFlags(&stream[d], cudaStreamNonBlocking));
    }
    unsigned long long wrong = 0, crossed = 0, frees = 0;
    uint32_t rng = 12345u + (uint32_t)t * 7919u;
    for (int round = 0; round < ROUNDS; round++) {
        int d = (t + round) % 2;
        CK(cudaSetDevice(d));
        handed_block_t b[BLOCKS];
        for (int i = 0; i < BLOCKS; i++) {
            rng = rng * 1664525u + 1013904223u;
            b[i].size = 256 + (rng >> 8) % (8 * MiB);
            b[i].seed = (uint32_t)(t * 100000 + round * 100 + i);
            b[i].device = d;
            CK(cudaMalloc(&b[i].p, b[i].size));
            fill_pattern(b[i].p, b[i].size, b[i].seed, stream[d]);
        }
        for (int i = 0; i < BLOCKS; i++)
            wrong += mismatches_on(d, b[i].p, b[i].size, b[i].seed, stream[d]);
        for (int i = 0; i < BLOCKS; i++) {
            if (i % 2) { /* the next thread frees it, with the other device current */
                pthread_mutex_lock(&mailbox[(t + 1) % THREADS].lock);
                mailbox[(t + 1) % THREADS].blocks.push_back(b[i]);
                pthread_mutex_unlock(&mailbox[(t + 1) % THREADS].lock);
            } else {
                CK(cudaSetDevice(d));
                CK(cudaFree(b[i].p));
                frees++;
            }
        }
        wrong += drain(t, stream, &crossed);
    }
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        CK(cudaStreamDestroy(stream[d]));
    }
    pthread_mutex_lock(&totals_lock);
    thread_wrong += wrong;
    cross_frees += crossed;
    thread_frees += frees;
    pthread_mutex_unlock(&totals_lock);
    return nullptr;
}

static int threads(void)
{
    if (!two_gpus("threads", 0))
        return 0;
    for (int t = 0; t < THREADS; t++)
        pthread_mutex_init(&mailbox[t].lock, nullptr);
    pthread_t thread[THREADS];
    for (int t = 0; t < THREADS; t++)
        EXPECT(pthread_create(&thread[t], nullptr, thread_main, (void *)(intptr_t)t) == 0, "thread %d started", t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(thread[t], nullptr);
    /* what the last threads handed on after their successors finished */
    cudaStream_t stream[2] = {0, 0};
    unsigned long long left = 0;
    for (int t = 0; t < THREADS; t++)
        thread_wrong += drain(t, stream, &left);
    cross_frees += left;
    printf("multi_gpu: threads: %d threads x %d rounds: %llu frees on the block's device, %llu with the other device "
           "current, %llu wrong bytes\n",
           THREADS, ROUNDS, thread_frees, cross_frees, thread_wrong);
    EXPECT(cross_frees == (unsigned long long)THREADS * ROUNDS * (BLOCKS / 2),
           "every handed block was freed across devices (%llu)", cross_frees);
    if (thread_wrong) {
        printf("multi_gpu: threads: CORRUPTION\n");
        return EXIT_CORRUPTION;
    }
    printf("multi_gpu: threads: OK\n");
    return 0;
}

/* ---- stacks ----------------------------------------------------------------- */
static int stacks(int argc, char **argv)
{
    if (!two_gpus("stacks", 0))
        return 0;
    int expect_limit = argc > 2;
    size_t limit = (argc > 2 ? strtoull(argv[2], nullptr, 10) : 256) * MiB;
    EXPECT(limit >= 8 * MiB, "a limit of at least 8 MiB (got %zu bytes)", limit);
    void *on0[4], *first = nullptr, *second = nullptr;
    CK(cudaSetDevice(0));
    for (int i = 0; i < 4; i++) { /* device 0: twice the limit, live at once */
        CK(cudaMalloc(&on0[i], limit / 2));
        fill_pattern(on0[i], limit / 2, 50 + i, 0);
    }
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&first, limit / 2));
    fill_pattern(first, limit / 2, 60, 0);
    cudaError_t over = cudaMalloc(&second, limit / 4 * 3);
    printf("multi_gpu: stacks: device 0 holds %zu MiB; device 1 holds %zu MiB and asked %zu MiB more: %s\n",
           2 * limit / MiB, limit / 2 / MiB, limit / 4 * 3 / MiB, cudaGetErrorName(over));
    if (expect_limit)
        EXPECT(over == cudaErrorMemoryAllocation,
               "the limit of %zu MiB on device 1 refused the request (got %s): device 1's stack is not the configured one",
               limit / MiB, cudaGetErrorName(over));
    else
        EXPECT(over == cudaSuccess, "without a limit the request succeeds (got %s)", cudaGetErrorName(over));
    cudaGetLastError(); /* natively the refusal would be sticky in the last error */
    unsigned long long wrong = mismatches_on(1, first, limit / 2, 60);
    for (int i = 0; i < 4; i++)
        wrong += mismatches_on(0, on0[i], limit / 2, 50 + i);
    CK(cudaSetDevice(0)); /* device 1's blocks freed with device 0 current, and back */
    CK(cudaFree(first));
    if (second)
        CK(cudaFree(second));
    CK(cudaSetDevice(1));
    for (int i = 0; i < 4; i++)
        CK(cudaFree(on0[i]));
    if (wrong) {
        printf("multi_gpu: stacks: CORRUPTION\n");
        return EXIT_CORRUPTION;
    }
    printf("multi_gpu: stacks: OK\n");
    return 0;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    int rc;
    if (!strcmp(what, "cross")) rc = cross();
    else if (!strcmp(what, "peer_before")) rc = peer(1);
    else if (!strcmp(what, "peer_after")) rc = peer(0);
    else if (!strcmp(what, "copies")) rc = copies();
    else if (!strcmp(what, "order")) rc = order();
    else if (!strcmp(what, "mempool")) rc = mempool();
    else if (!strcmp(what, "threads")) rc = threads();
    else if (!strcmp(what, "stacks")) rc = stacks(argc, argv);
    else {
        fprintf(stderr, "usage: multi_gpu cross|peer_before|peer_after|copies|order|mempool|threads|stacks [LIMIT_MIB]\n");
        return 1;
    }
    return rc;
}
