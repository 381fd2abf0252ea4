/* cross_device_probe: what CUDA itself does, natively and without the shim,
 * when memory of one device is copied while another device is current, for
 * cudaMalloc memory and for memory mapped with the virtual memory API
 * (cuMemCreate + cuMemMap, what the expandable pool hands out). Needs two
 * GPUs (prints SKIP with one). The answers decide how the shim makes pooled
 * memory behave as cudaMalloc memory across devices (docs/design.md,
 * "Several GPUs").
 *
 *   cross_device_probe
 *
 * For each kind of buffer B on device 1 (cudaMalloc; mapped with access for
 * device 1 only; mapped with access for devices 0 and 1):
 *  1. accepted: with device 0 current, cudaMemcpy D2H, H2D, D2D (from a
 *     device-0 buffer, DeviceToDevice and Default), cudaMemcpyPeer: the
 *     error codes;
 *  2. ordered before: device 1 runs a 300 ms spin kernel, then a fill of B;
 *     with device 0 current and no synchronize, cudaMemcpy D2H of B: the
 *     bytes that are not the fill's (natively 0 if a copy waits for the
 *     memory's device);
 *  3. ordered after: device 0 runs a 300 ms spin kernel, then
 *     cudaMemcpy(B, A on device 0, Default); at once a kernel on device 1
 *     counts B's bytes that are not A's (0 if the copy is ordered before
 *     device 1's later work), and how long the host waited in cudaMemcpy;
 *  4. pointer attributes of B (cuPointerGetAttribute) and
 *     cuMemRetainAllocationHandle, printed.
 * Exit 0 when every call it could make ran; the findings are the output. */
#include "gpu_test.h"

#include <cuda.h>

__global__ void spin_kernel(long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

static double now_s()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static long long cycles_for_ms(int device, double ms)
{
    int khz = 0;
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
    return (long long)(khz * ms);
}

enum kind { MALLOC, MAPPED_OWN, MAPPED_ALL, KINDS };
static const char *kind_name[KINDS] = {"cudaMalloc", "mapped, access device 1 only", "mapped, access devices 0+1"};

typedef struct buffer {
    void *p;
    size_t reserved;
    CUmemGenericAllocationHandle handle;
} buffer_t;

static const char *cu_name(CUresult r)
{
    const char *s = nullptr;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

static buffer_t make(enum kind k, size_t n)
{
    buffer_t b = {nullptr, 0, 0};
    CK(cudaSetDevice(1));
    if (k == MALLOC) {
        CK(cudaMalloc(&b.p, n));
        return b;
    }
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    size_t g = 0;
    cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    b.reserved = (n + g - 1) / g * g;
    CUdeviceptr base = 0;
    CUresult r = cuMemAddressReserve(&base, b.reserved, 0, 0, 0);
    if (r == CUDA_SUCCESS)
        r = cuMemCreate(&b.handle, b.reserved, &prop, 0);
    if (r == CUDA_SUCCESS)
        r = cuMemMap(base, b.reserved, 0, b.handle, 0);
    CUmemAccessDesc access[2] = {{{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
                                 {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
    if (r == CUDA_SUCCESS)
        r = cuMemSetAccess(base, b.reserved, access, k == MAPPED_ALL ? 2 : 1);
    if (r != CUDA_SUCCESS) {
        printf("cross_device_probe: mapping failed: %s\n", cu_name(r));
        exit(EXIT_CUDA_ERROR);
    }
    b.p = (void *)base;
    return b;
}

static void drop(enum kind k, buffer_t b)
{
    CK(cudaSetDevice(1));
    CK(cudaDeviceSynchronize());
    if (k == MALLOC) {
        CK(cudaFree(b.p));
        return;
    }
    cuMemUnmap((CUdeviceptr)b.p, b.reserved);
    cuMemRelease(b.handle);
    cuMemAddressFree((CUdeviceptr)b.p, b.reserved);
}

static void attributes(enum kind k, const buffer_t &b)
{
    CUdeviceptr p = (CUdeviceptr)b.p + 4096;
    CUcontext ctx = nullptr;
    int ordinal = -1, legacy_ipc = -1, mapped = -1;
    unsigned type = 0;
    unsigned long long id = 0, access = 0, handle_types = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    CUmemoryPool pool = nullptr;
    CUresult rc[10];
    rc[0] = cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p);
    rc[1] = cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
    rc[2] = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
    rc[3] = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
    rc[4] = cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
    rc[5] = cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
    rc[6] = cuPointerGetAttribute(&legacy_ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p);
    rc[7] = cuPointerGetAttribute(&handle_types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p);
    rc[8] = cuPointerGetAttribute(&access, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, p);
    rc[9] = cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, p);
    CUresult rpool = cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p);
    printf("cross_device_probe: [%s] attributes at base+4096: context %p (%s) ordinal %d (%s) type %u (%s) "
           "range +%lld size %zu (%s/%s) buffer_id %llu (%s) legacy_ipc %d (%s) handle_types %llu (%s) "
           "access %llu (%s) mapped %d (%s) mempool %p (%s)\n",
           kind_name[k], (void *)ctx, cu_name(rc[0]), ordinal, cu_name(rc[1]), type, cu_name(rc[2]),
           (long long)start - (long long)(CUdeviceptr)b.p, size, cu_name(rc[3]), cu_name(rc[4]), id,
           cu_name(rc[5]), legacy_ipc, cu_name(rc[6]), handle_types, cu_name(rc[7]), access, cu_name(rc[8]),
           mapped, cu_name(rc[9]), (void *)pool, cu_name(rpool));
    CUdeviceptr rstart = 0;
    size_t rsize = 0;
    CUresult rr = cuMemGetAddressRange(&rstart, &rsize, p);
    CUmemGenericAllocationHandle h = 0;
    CUresult rh = cuMemRetainAllocationHandle(&h, (void *)p);
    printf("cross_device_probe: [%s] cuMemGetAddressRange +%lld %zu (%s); cuMemRetainAllocationHandle %s\n",
           kind_name[k], (long long)rstart - (long long)(CUdeviceptr)b.p, rsize, cu_name(rr), cu_name(rh));
    if (rh == CUDA_SUCCESS)
        cuMemRelease(h);
}

int main(void)
{
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    if (count < 2) {
        printf("cross_device_probe: SKIP (needs 2 GPUs, %d)\n", count);
        return 0;
    }
    int can01 = 0, can10 = 0;
    CK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    printf("cross_device_probe: peer capable 0->1 %d, 1->0 %d\n", can01, can10);
    const size_t n = 96u << 20;
    void *a0 = nullptr, *host = nullptr;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&a0, n));
    fill_pattern(a0, n, 7, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMallocHost(&host, n));
    CK(cudaSetDevice(1));
    CK(cudaFree(0));
    for (int k = 0; k < KINDS; k++) {
        buffer_t b = make((enum kind)k, n);
        /* 1. accepted? */
        CK(cudaSetDevice(0));
        cudaError_t e[5];
        e[0] = cudaMemcpy(host, b.p, n, cudaMemcpyDeviceToHost);
        e[1] = cudaMemcpy(b.p, host, n, cudaMemcpyHostToDevice);
        e[2] = cudaMemcpy(b.p, a0, n, cudaMemcpyDeviceToDevice);
        e[3] = cudaMemcpy(b.p, a0, n, cudaMemcpyDefault);
        e[4] = cudaMemcpyPeer(b.p, 1, a0, 0, n);
        cudaGetLastError();
        printf("cross_device_probe: [%s] device 0 current: D2H %s, H2D %s, D2D %s, Default %s, Peer %s\n",
               kind_name[k], cudaGetErrorName(e[0]), cudaGetErrorName(e[1]), cudaGetErrorName(e[2]),
               cudaGetErrorName(e[3]), cudaGetErrorName(e[4]));
        CK(cudaDeviceSynchronize());
        CK(cudaSetDevice(1));
        CK(cudaDeviceSynchronize());
        if (e[0] == cudaSuccess) {
            /* 2. ordered before: device 1 spins then fills B; device 0 copies B to the host */
            CK(cudaSetDevice(1));
            fill_pattern(b.p, n, 1, 0);
            CK(cudaDeviceSynchronize());
            spin_kernel<<<1, 1>>>(cycles_for_ms(1, 300));
            fill_pattern(b.p, n, 2, 0);
            CK(cudaSetDevice(0));
            double t0 = now_s();
            cudaError_t r = cudaMemcpy(host, b.p, n, cudaMemcpyDeviceToHost);
            double waited = now_s() - t0;
            size_t wrong = host_verify_ends(host, n, 2, n / 2);
            printf("cross_device_probe: [%s] ordered before: D2H with device 0 current behind device 1's "
                   "spin+fill: %s, waited %.0f ms, %zu bytes not the fill's\n",
                   kind_name[k], cudaGetErrorName(r), waited * 1e3, wrong);
            CK(cudaSetDevice(1));
            CK(cudaDeviceSynchronize());
        }
        if (e[3] == cudaSuccess) {
            /* 3. ordered after: device 0 spins, then copies A into B; device 1 checks at once */
            CK(cudaSetDevice(1));
            fill_pattern(b.p, n, 3, 0);
            CK(cudaDeviceSynchronize());
            CK(cudaSetDevice(0));
            spin_kernel<<<1, 1>>>(cycles_for_ms(0, 300));
            double t0 = now_s();
            cudaError_t r = cudaMemcpy(b.p, a0, n, cudaMemcpyDefault);
            double waited = now_s() - t0;
            CK(cudaSetDevice(1));
            unsigned long long *counter = nullptr, wrong = 0;
            CK(cudaMalloc((void **)&counter, sizeof *counter));
            CK(cudaMemset(counter, 0, sizeof *counter));
            count_mismatches(b.p, n, 7, counter, 0);
            CK(cudaMemcpy(&wrong, counter, sizeof wrong, cudaMemcpyDeviceToHost));
            CK(cudaFree(counter));
            printf("cross_device_probe: [%s] ordered after: Default copy into B with device 0 current behind "
                   "its spin: %s, waited %.0f ms; a device-1 kernel right after saw %llu bytes not A's\n",
                   kind_name[k], cudaGetErrorName(r), waited * 1e3, wrong);
            CK(cudaSetDevice(0));
            CK(cudaDeviceSynchronize());
            /* 3b. the same with a non-blocking stream of device 0 (cudaMemcpyAsync) */
            CK(cudaSetDevice(1));
            fill_pattern(b.p, n, 3, 0);
            CK(cudaDeviceSynchronize());
            CK(cudaSetDevice(0));
            cudaStream_t s;
            CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            spin_kernel<<<1, 1, 0, s>>>(cycles_for_ms(0, 300));
            r = cudaMemcpyAsync(b.p, a0, n, cudaMemcpyDefault, s);
            CK(cudaSetDevice(1));
            CK(cudaMalloc((void **)&counter, sizeof *counter));
            CK(cudaMemset(counter, 0, sizeof *counter));
            count_mismatches(b.p, n, 7, counter, 0);
            CK(cudaMemcpy(&wrong, counter, sizeof wrong, cudaMemcpyDeviceToHost));
            CK(cudaFree(counter));
            printf("cross_device_probe: [%s] ordered after (async, non-blocking stream of device 0): %s; "
                   "device-1 kernel right after saw %llu bytes not A's\n",
                   kind_name[k], cudaGetErrorName(r), wrong);
            CK(cudaSetDevice(0));
            CK(cudaStreamSynchronize(s));
            CK(cudaStreamDestroy(s));
        }
        attributes((enum kind)k, b);
        drop((enum kind)k, b);
    }
    /* the same attributes for a cudaMallocAsync block of device 1 */
    CK(cudaSetDevice(1));
    void *pa = nullptr;
    CK(cudaMallocAsync(&pa, n, 0));
    CK(cudaStreamSynchronize(0));
    buffer_t ba = {pa, 0, 0};
    kind_name[0] = "cudaMallocAsync";
    attributes(MALLOC, ba);
    CK(cudaFreeAsync(pa, 0));
    CK(cudaDeviceSynchronize());
    printf("cross_device_probe: done\n");
    return 0;
}
