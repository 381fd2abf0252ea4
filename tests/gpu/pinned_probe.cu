/* pinned_probe: what host.expandable (core/host_vm.h) relies on, checked
 * natively (no shim needed; under the shim it checks the same things).
 *
 * host.expandable reserves one host range (mmap PROT_NONE) and page-locks
 * pieces of it separately (cudaHostRegister PORTABLE | MAPPED, one call
 * per piece), so a pooled block may span several registrations. Unknown
 * before this probe: whether CUDA treats such a block as pinned memory.
 *
 *   pinned_probe [PIECE_MIB [PIECES]]   (default 2 MiB x 16 pieces)
 *
 *  1. correctness across piece boundaries: an H2D and a D2H
 *     cudaMemcpyAsync of the whole range (every boundary inside one copy),
 *     and of a 3-byte-odd window straddling one boundary, on a
 *     non-blocking stream; the bytes must match;
 *  2. pinned, not staged: a D2H cudaMemcpyAsync queued behind a 300 ms
 *     spin kernel returns at once for pinned memory; a staged (pageable)
 *     copy returns only after the kernel. Measured for the split range, one
 *     cudaHostRegister of the same size (control), malloc'd memory (must
 *     block: shows the test can fail), and H2D the same way;
 *  3. bandwidth: H2D and D2H of the whole split range against the same
 *     bytes registered once and cudaHostAlloc'd (GB/s, median of 5);
 *  4. mapped memory: cudaHostGetDevicePointer of each piece; the device
 *     addresses must be contiguous across pieces (a kernel reads a block
 *     through one device pointer), then a kernel writes the whole range
 *     through the first piece's device pointer; the host checks it;
 *     cudaPointerGetAttributes of an interior pointer of piece 2;
 *  5. costs: cudaHostRegister / cudaHostUnregister of one piece (median),
 *     cudaHostAlloc + cudaFreeHost of one piece, and whether
 *     cudaHostUnregister waits for the device (called behind a 300 ms spin
 *     on an unrelated stream).
 * Prints one line per check ("pinned_probe: NAME: ok|FAIL ...") and the
 * costs; exit 0 when 1, 2 and 4 hold (host.expandable may be turned on),
 * 1 when a CUDA call fails or a check fails, 3 on wrong bytes.
 */
#include "gpu_test.h"

#include <algorithm>
#include <cstdarg>
#include <sys/mman.h>
#include <vector>

static __global__ void spin_kernel(unsigned long long ns) { spin_for_ns(ns); }

static __global__ void write_through(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = pattern_byte(i, seed);
}

static void host_fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pattern_byte(i, seed);
}

static size_t host_mismatches(const uint8_t *p, size_t n, uint32_t seed)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += p[i] != pattern_byte(i, seed);
    return bad;
}

static int failures;
static int corrupted;

static void verdict(const char *name, bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("pinned_probe: %s: %s ", name, ok ? "ok" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    failures += !ok;
}

/* A host range of `pieces` pieces, each registered on its own (the layout
 * of host.expandable). */
struct split_range {
    uint8_t *base;
    size_t piece, pieces;
};

static split_range split_create(size_t piece, size_t pieces)
{
    size_t size = piece * pieces;
    void *p = mmap(NULL, size + piece, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    EXPECT(p != MAP_FAILED, "mmap of %zu bytes", size + piece);
    uint8_t *base = (uint8_t *)(((uintptr_t)p + piece - 1) / piece * piece); /* as host_vm aligns */
    for (size_t k = 0; k < pieces; k++) {
        uint8_t *at = base + k * piece;
        EXPECT(mmap(at, piece, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == at,
               "mmap fixed");
        CK(cudaHostRegister(at, piece, cudaHostRegisterPortable | cudaHostRegisterMapped));
    }
    return {base, piece, pieces};
}

static void split_destroy(split_range &r)
{
    for (size_t k = 0; k < r.pieces; k++)
        CK(cudaHostUnregister(r.base + k * r.piece));
    munmap(r.base, r.piece * r.pieces);
}

/* Host ms a D2H (or H2D) cudaMemcpyAsync call takes when queued behind a
 * `spin_ms` kernel on the same non-blocking stream. */
static double queued_copy_call_ms(uint8_t *host, uint8_t *dev, size_t n, bool d2h, cudaStream_t s, double spin_ms)
{
    CK(cudaStreamSynchronize(s));
    spin_kernel<<<1, 1, 0, s>>>((unsigned long long)(spin_ms * 1e6));
    CK(cudaGetLastError());
    double t0 = now_ns();
    if (d2h)
        CK(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, s));
    else
        CK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s));
    double ms = (now_ns() - t0) / 1e6;
    CK(cudaStreamSynchronize(s));
    return ms;
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* GB/s of a copy of n bytes (median of 5). */
static double bandwidth(uint8_t *host, uint8_t *dev, size_t n, bool d2h, cudaStream_t s)
{
    std::vector<double> gbs;
    for (int i = 0; i < 5; i++) {
        CK(cudaStreamSynchronize(s));
        double t0 = now_ns();
        if (d2h)
            CK(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, s));
        else
            CK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s));
        CK(cudaStreamSynchronize(s));
        gbs.push_back((double)n / (now_ns() - t0));
    }
    return median(gbs);
}

int main(int argc, char **argv)
{
    size_t piece = (argc > 1 ? strtoull(argv[1], NULL, 10) : 2) << 20;
    size_t pieces = argc > 2 ? strtoull(argv[2], NULL, 10) : 16;
    size_t n = piece * pieces;
    const double spin_ms = 300;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint8_t *dev = NULL;
    CK(cudaMalloc(&dev, n));
    split_range r = split_create(piece, pieces);
    printf("pinned_probe: %zu pieces of %zu MiB registered separately at %p (shim %s)\n", pieces, piece >> 20,
           (void *)r.base, poolshim_is_active() ? "active" : "not loaded");

    /* 1. correctness across boundaries */
    host_fill(r.base, n, 11);
    CK(cudaMemcpyAsync(dev, r.base, n, cudaMemcpyHostToDevice, s));
    memset(r.base, 0, n);
    CK(cudaMemcpyAsync(r.base, dev, n, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    size_t bad = host_mismatches(r.base, n, 11);
    corrupted += bad != 0;
    verdict("whole-range H2D + D2H across every boundary", bad == 0, "(%zu wrong bytes of %zu)", bad, n);
    size_t off = piece - 4097, len = 3 * 4096 + 3; /* straddles the first boundary, odd length */
    std::vector<uint8_t> ref(len);
    host_fill(ref.data(), len, 12);
    memcpy(r.base + off, ref.data(), len);
    CK(cudaMemsetAsync(dev, 0, n, s));
    CK(cudaMemcpyAsync(dev + 5, r.base + off, len, cudaMemcpyHostToDevice, s));
    memset(r.base + off, 0xEE, len);
    CK(cudaMemcpyAsync(r.base + off, dev + 5, len, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    bad = host_mismatches(r.base + off, len, 12);
    corrupted += bad != 0;
    verdict("odd window straddling a boundary", bad == 0, "(%zu wrong bytes of %zu)", bad, len);

    /* 2. pinned (async) or staged */
    uint8_t *once = NULL;
    once = (uint8_t *)aligned_alloc(piece, n);
    EXPECT(once, "aligned_alloc");
    memset(once, 0, n);
    uint8_t *pageable = (uint8_t *)malloc(n);
    memset(pageable, 0, n);
    double d2h_split = queued_copy_call_ms(r.base, dev, n, true, s, spin_ms);
    double h2d_split = queued_copy_call_ms(r.base, dev, n, false, s, spin_ms);
    double d2h_pageable = queued_copy_call_ms(pageable, dev, n, true, s, spin_ms);
    CK(cudaHostRegister(once, n, cudaHostRegisterPortable | cudaHostRegisterMapped));
    double d2h_once = queued_copy_call_ms(once, dev, n, true, s, spin_ms);
    printf("pinned_probe: a cudaMemcpyAsync call behind a %.0f ms kernel: D2H split %.2f ms, H2D split %.2f ms, "
           "D2H one registration %.2f ms, D2H pageable %.2f ms\n",
           spin_ms, d2h_split, h2d_split, d2h_once, d2h_pageable);
    verdict("the control blocks (pageable D2H waits for the kernel)", d2h_pageable > spin_ms / 2,
            "(%.2f ms)", d2h_pageable);
    verdict("one registration is async (control)", d2h_once < spin_ms / 10, "(%.2f ms)", d2h_once);
    verdict("split range D2H is async: a pinned DMA copy, not staged", d2h_split < spin_ms / 10, "(%.2f ms)",
            d2h_split);
    verdict("split range H2D is async", h2d_split < spin_ms / 10, "(%.2f ms)", h2d_split);

    /* 3. bandwidth */
    uint8_t *alloc = NULL;
    CK(cudaHostAlloc((void **)&alloc, n, cudaHostAllocPortable | cudaHostAllocMapped));
    double bw[3][2];
    uint8_t *hosts[3] = {r.base, once, alloc};
    for (int h = 0; h < 3; h++)
        for (int d = 0; d < 2; d++)
            bw[h][d] = bandwidth(hosts[h], dev, n, d == 1, s);
    printf("pinned_probe: bandwidth GB/s (H2D / D2H) of %zu MiB: split %.1f / %.1f, one registration %.1f / %.1f, "
           "cudaHostAlloc %.1f / %.1f\n",
           n >> 20, bw[0][0], bw[0][1], bw[1][0], bw[1][1], bw[2][0], bw[2][1]);
    verdict("split range copies at >= 80% of one registration's bandwidth",
            bw[0][0] >= 0.8 * bw[1][0] && bw[0][1] >= 0.8 * bw[1][1], "");
    CK(cudaFreeHost(alloc));
    CK(cudaHostUnregister(once));
    free(once);
    free(pageable);

    /* 4. mapped memory across pieces */
    uint8_t *first = NULL;
    CK(cudaHostGetDevicePointer((void **)&first, r.base, 0));
    bool contiguous = true;
    for (size_t k = 1; k < pieces; k++) {
        uint8_t *d = NULL;
        CK(cudaHostGetDevicePointer((void **)&d, r.base + k * piece, 0));
        contiguous &= d == first + k * piece;
    }
    printf("pinned_probe: device pointer of the range %p (host %p)\n", (void *)first, (void *)r.base);
    verdict("device addresses of the pieces are contiguous", contiguous, "");
    if (contiguous) {
        memset(r.base, 0, n);
        write_through<<<256, 256, 0, s>>>(first, n, 13);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        bad = host_mismatches(r.base, n, 13);
        corrupted += bad != 0;
        verdict("a kernel writes the whole range through one device pointer", bad == 0,
                "(%zu wrong bytes of %zu)", bad, n);
    }
    cudaPointerAttributes attr;
    CK(cudaPointerGetAttributes(&attr, r.base + piece + 100));
    verdict("cudaPointerGetAttributes of an interior pointer of piece 2", attr.type == cudaMemoryTypeHost &&
            (uint8_t *)attr.devicePointer == first + piece + 100, "(type %d, device %p)", (int)attr.type,
            attr.devicePointer);
    unsigned flags = 0;
    cudaError_t fe = cudaHostGetFlags(&flags, r.base + piece + 100);
    printf("pinned_probe: cudaHostGetFlags of a registered piece: %s, flags 0x%x (information: the shim answers "
           "for pooled blocks itself)\n", cudaGetErrorName(fe), flags);
    (void)cudaGetLastError();

    /* 5. costs */
    std::vector<double> reg, unreg, alloc_pair;
    for (int i = 0; i < 9; i++) {
        uint8_t *at = r.base; /* re-register piece 0 */
        double t0 = now_ns();
        CK(cudaHostUnregister(at));
        double t1 = now_ns();
        CK(cudaHostRegister(at, piece, cudaHostRegisterPortable | cudaHostRegisterMapped));
        double t2 = now_ns();
        unreg.push_back((t1 - t0) / 1e3);
        reg.push_back((t2 - t1) / 1e3);
        void *a = NULL;
        double t3 = now_ns();
        CK(cudaHostAlloc(&a, piece, cudaHostAllocPortable | cudaHostAllocMapped));
        CK(cudaFreeHost(a));
        alloc_pair.push_back((now_ns() - t3) / 1e3);
    }
    cudaStream_t other;
    CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    spin_kernel<<<1, 1, 0, other>>>((unsigned long long)(spin_ms * 1e6));
    CK(cudaGetLastError());
    double t0 = now_ns();
    CK(cudaHostUnregister(r.base + (pieces - 1) * piece));
    double unreg_busy = (now_ns() - t0) / 1e6;
    t0 = now_ns();
    CK(cudaHostRegister(r.base + (pieces - 1) * piece, piece, cudaHostRegisterPortable | cudaHostRegisterMapped));
    double reg_busy = (now_ns() - t0) / 1e6;
    CK(cudaStreamSynchronize(other));
    printf("pinned_probe: costs of one %zu MiB piece (median of 9): cudaHostRegister %.0f us, cudaHostUnregister "
           "%.0f us, cudaHostAlloc+cudaFreeHost %.0f us; behind a %.0f ms kernel on another stream: "
           "cudaHostUnregister %.2f ms (%s), cudaHostRegister %.2f ms\n",
           piece >> 20, median(reg), median(unreg), median(alloc_pair), spin_ms, unreg_busy,
           unreg_busy > spin_ms / 2 ? "waits for the device" : "does not wait", reg_busy);
    CK(cudaStreamDestroy(other));

    split_destroy(r);
    CK(cudaFree(dev));
    CK(cudaStreamDestroy(s));
    if (corrupted) {
        printf("pinned_probe: FAIL (wrong bytes)\n");
        return EXIT_CORRUPTION;
    }
    printf("pinned_probe: %s\n", failures ? "FAIL" : "OK");
    return failures ? EXIT_CUDA_ERROR : 0;
}
