/* pinned_vmm_probe: whether pinned host memory made with the virtual memory
 * API (cuMemCreate with a host location, pieces mapped side by side into
 * one reserved range) behaves as pinned memory, checked natively. The
 * earlier probe (pinned_probe.cu) refuted one host range page-locked piece
 * by piece with cudaHostRegister: a cudaMemcpyAsync spanning two
 * registrations fails with cudaErrorInvalidValue on CUDA 13.0. If this one
 * passes, a pinned pool can grow in place like the device pool does.
 *
 *   pinned_vmm_probe [PIECES]   (default 16 pieces of the host granularity)
 *
 *  0. cuMemCreate (CU_MEM_LOCATION_TYPE_HOST, then HOST_NUMA 0), granularity,
 *     cuMemAddressReserve + cuMemMap of every piece, cuMemSetAccess for the
 *     device and for the host: which calls CUDA accepts;
 *  1. the host writes and reads the whole range (a SIGSEGV is caught);
 *  2. correctness across piece boundaries: H2D and D2H cudaMemcpyAsync of
 *     the whole range and of an odd window straddling a boundary;
 *  3. pinned, not staged: a D2H copy queued behind a 300 ms spin kernel
 *     returns at once (malloc'd memory: must block, the control);
 *  4. a kernel reads and writes the range through its own address;
 *  5. bandwidth against cudaHostAlloc (GB/s, best of 5), cudaPointerGetAttributes;
 *  6. costs: create+map+access of one piece, unmap+release.
 * Exit 0 when 0-4 hold, 1 when a call or check fails, 3 on wrong bytes. */
#include "gpu_test.h"

#include <cuda.h>
#include <setjmp.h>
#include <signal.h>
#include <vector>

static sigjmp_buf segv_jump;
static void on_segv(int sig) { siglongjmp(segv_jump, 1); }

__global__ void spin_kernel(long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

__global__ void add_one(uint8_t *p, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = (uint8_t)(p[i] + 1);
}

static double now_s()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int failures = 0;
static void check(const char *name, bool ok, const char *detail = "")
{
    printf("pinned_vmm_probe: %s: %s%s%s\n", name, ok ? "ok" : "FAIL", *detail ? " " : "", detail);
    failures += !ok;
}

/* Host writes then reads every byte; returns false on a SIGSEGV. */
static bool host_touch(uint8_t *p, size_t n, uint32_t seed)
{
    struct sigaction sa = {}, old_segv, old_bus;
    sa.sa_handler = on_segv;
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    bool ok = true;
    if (sigsetjmp(segv_jump, 1) == 0) {
        for (size_t i = 0; i < n; i++)
            p[i] = pattern_byte(i, seed);
        for (size_t i = 0; i < n; i++)
            if (p[i] != pattern_byte(i, seed)) {
                ok = false;
                break;
            }
    } else {
        ok = false;
    }
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    return ok;
}

static size_t host_mismatches(const uint8_t *p, size_t n, uint32_t seed)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += p[i] != pattern_byte(i, seed);
    return bad;
}

int main(int argc, char **argv)
{
    int pieces = argc > 1 ? atoi(argv[1]) : 16;
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    CUdevice dev;
    cuDeviceGet(&dev, 0);
    char line[256];

    /* 0. which location type cuMemCreate takes for host memory */
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    const CUmemLocationType types[] = {CU_MEM_LOCATION_TYPE_HOST, CU_MEM_LOCATION_TYPE_HOST_NUMA};
    const char *type_names[] = {"HOST", "HOST_NUMA 0"};
    size_t gran = 0;
    int chosen = -1;
    for (int t = 0; t < 2 && chosen < 0; t++) {
        prop.location.type = types[t];
        prop.location.id = 0;
        CUresult r = cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
        CUmemGenericAllocationHandle h;
        CUresult c = r == CUDA_SUCCESS ? cuMemCreate(&h, gran, &prop, 0) : r;
        snprintf(line, sizeof line, "(granularity %d -> %zu B, create %d)", (int)r, gran, (int)c);
        check(type_names[t], c == CUDA_SUCCESS, line);
        if (c == CUDA_SUCCESS) {
            cuMemRelease(h);
            chosen = t;
        }
    }
    if (chosen < 0) {
        printf("pinned_vmm_probe: FAIL (no host location accepted)\n");
        return 1;
    }
    size_t piece = gran, total = piece * pieces;
    CUdeviceptr base;
    CUresult r = cuMemAddressReserve(&base, total, 0, 0, 0);
    check("reserve", r == CUDA_SUCCESS);
    std::vector<CUmemGenericAllocationHandle> handles(pieces);
    double t0 = now_s();
    bool mapped = true;
    for (int i = 0; i < pieces && mapped; i++) {
        mapped = cuMemCreate(&handles[i], piece, &prop, 0) == CUDA_SUCCESS &&
                 cuMemMap(base + i * piece, piece, 0, handles[i], 0) == CUDA_SUCCESS;
    }
    double create_map = (now_s() - t0) / pieces;
    check("create+map every piece", mapped);
    CUmemAccessDesc access[2] = {};
    access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[0].location.id = 0;
    access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access[1].location = prop.location;
    access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    t0 = now_s();
    CUresult dev_access = cuMemSetAccess(base, total, &access[0], 1);
    CUresult host_access = cuMemSetAccess(base, total, &access[1], 1);
    double set_access = now_s() - t0;
    snprintf(line, sizeof line, "(device %d, host %d)", (int)dev_access, (int)host_access);
    check("set access", dev_access == CUDA_SUCCESS && host_access == CUDA_SUCCESS, line);
    if (!mapped || dev_access != CUDA_SUCCESS) {
        printf("pinned_vmm_probe: FAIL\n");
        return 1;
    }
    uint8_t *h = (uint8_t *)base;

    /* 1. the host reads and writes it */
    bool host_ok = host_touch(h, total, 1);
    check("host writes and reads the whole range", host_ok);
    if (!host_ok) {
        printf("pinned_vmm_probe: FAIL\n");
        return 1;
    }

    /* 2. copies across piece boundaries */
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint8_t *d;
    CK(cudaMalloc(&d, total));
    cudaError_t e1 = cudaMemcpyAsync(d, h, total, cudaMemcpyHostToDevice, s);
    CK(cudaStreamSynchronize(s));
    unsigned long long *bad_d;
    CK(cudaMalloc(&bad_d, sizeof *bad_d));
    CK(cudaMemset(bad_d, 0, sizeof *bad_d));
    count_mismatches_kernel<<<blocks_for(total), 256>>>(d, total, 1, bad_d);
    unsigned long long bad = 0;
    CK(cudaMemcpy(&bad, bad_d, sizeof bad, cudaMemcpyDeviceToHost));
    snprintf(line, sizeof line, "(%s, %llu wrong bytes)", cudaGetErrorName(e1), bad);
    check("H2D whole range", e1 == cudaSuccess && bad == 0, line);
    fill_pattern_kernel<<<blocks_for(total), 256>>>(d, total, 2);
    CK(cudaDeviceSynchronize());
    memset(h, 0, total);
    cudaError_t e2 = cudaMemcpyAsync(h, d, total, cudaMemcpyDeviceToHost, s);
    CK(cudaStreamSynchronize(s));
    size_t hbad = host_mismatches(h, total, 2);
    snprintf(line, sizeof line, "(%s, %zu wrong bytes)", cudaGetErrorName(e2), hbad);
    check("D2H whole range", e2 == cudaSuccess && hbad == 0, line);
    size_t off = piece - 12345, len = 3 * 12345 + 3;
    memset(h, 0, total);
    cudaError_t e3 = cudaMemcpyAsync(h + off, d + off, len, cudaMemcpyDeviceToHost, s);
    CK(cudaStreamSynchronize(s));
    size_t wbad = 0;
    for (size_t i = off; i < off + len; i++)
        wbad += h[i] != pattern_byte(i, 2);
    snprintf(line, sizeof line, "(%s, %zu wrong bytes)", cudaGetErrorName(e3), wbad);
    check("odd window across a boundary", e3 == cudaSuccess && wbad == 0, line);
    if (hbad || bad || wbad)
        return 3;

    /* 3. asynchronous (pinned) rather than staged: behind a 300 ms spin */
    int clock_khz = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    long long spin = (long long)clock_khz * 300;
    std::vector<uint8_t> pageable(total);
    double returned[2];
    uint8_t *targets[2] = {h, pageable.data()};
    for (int k = 0; k < 2; k++) {
        spin_kernel<<<1, 1, 0, s>>>(spin);
        double a = now_s();
        CK(cudaMemcpyAsync(targets[k], d, total, cudaMemcpyDeviceToHost, s));
        returned[k] = now_s() - a;
        CK(cudaStreamSynchronize(s));
    }
    snprintf(line, sizeof line, "(returned after %.1f ms; malloc'd control %.1f ms)", returned[0] * 1e3,
             returned[1] * 1e3);
    check("D2H behind a 300 ms kernel returns at once", returned[0] < 0.05 && returned[1] > 0.2, line);

    /* 4. a kernel uses the range through its own address */
    host_touch(h, total, 5);
    add_one<<<blocks_for(total), 256, 0, s>>>(h, total);
    cudaError_t e4 = cudaStreamSynchronize(s);
    size_t kbad = 0;
    if (e4 == cudaSuccess)
        for (size_t i = 0; i < total; i++)
            kbad += h[i] != (uint8_t)(pattern_byte(i, 5) + 1);
    snprintf(line, sizeof line, "(%s, %zu wrong bytes)", cudaGetErrorName(e4), kbad);
    check("kernel reads and writes it", e4 == cudaSuccess && kbad == 0, line);

    /* 5. attributes and bandwidth */
    cudaPointerAttributes attr;
    cudaError_t ea = cudaPointerGetAttributes(&attr, h + piece + 7);
    printf("pinned_vmm_probe: cudaPointerGetAttributes: %s type %d device %d devicePointer %s hostPointer %s\n",
           cudaGetErrorName(ea), (int)attr.type, attr.device, attr.devicePointer == h + piece + 7 ? "same" : "other",
           attr.hostPointer == h + piece + 7 ? "same" : "other");
    uint8_t *ha;
    CK(cudaHostAlloc(&ha, total, 0));
    const char *names[2] = {"vmm host range", "cudaHostAlloc"};
    uint8_t *srcs[2] = {h, ha};
    for (int k = 0; k < 2; k++) {
        double best_h2d = 1e9, best_d2h = 1e9;
        for (int rep = 0; rep < 5; rep++) {
            double a = now_s();
            CK(cudaMemcpyAsync(d, srcs[k], total, cudaMemcpyHostToDevice, s));
            CK(cudaStreamSynchronize(s));
            double b = now_s();
            CK(cudaMemcpyAsync(srcs[k], d, total, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
            double c = now_s();
            best_h2d = std::min(best_h2d, b - a);
            best_d2h = std::min(best_d2h, c - b);
        }
        printf("pinned_vmm_probe: bandwidth %s: H2D %.1f GB/s, D2H %.1f GB/s (%zu MiB)\n", names[k],
               total / best_h2d / 1e9, total / best_d2h / 1e9, total >> 20);
    }
    CK(cudaFreeHost(ha));

    /* 6. costs */
    t0 = now_s();
    for (int i = 0; i < pieces; i++)
        cuMemUnmap(base + i * piece, piece);
    double unmap = (now_s() - t0) / pieces;
    t0 = now_s();
    for (int i = 0; i < pieces; i++)
        cuMemRelease(handles[i]);
    double release = (now_s() - t0) / pieces;
    printf("pinned_vmm_probe: costs per %zu KiB piece: create+map %.1f us, set access (whole range) %.1f us, "
           "unmap %.1f us, release %.1f us\n",
           piece >> 10, create_map * 1e6, set_access * 1e6, unmap * 1e6, release * 1e6);
    cuMemAddressFree(base, total);
    printf("pinned_vmm_probe: %s\n", failures ? "FAIL" : "OK");
    return failures ? 1 : 0;
}
