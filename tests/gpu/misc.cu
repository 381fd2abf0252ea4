/* misc — edge cases of the allocation API, natively and under the shim.
 *
 * Steps:
 *   1. cudaFree(NULL) as the very first CUDA call succeeds.
 *   2. Bad frees (a stack address, a double free, a pointer into the middle
 *      of a block) return cudaErrorInvalidValue, and later calls still work.
 *   3. cudaMemGetInfo is sane (0 < free <= total).
 *   4. cudaIpcGetMemHandle on a suballocated pointer: --expect-ipc=ok natively
 *      (a real allocation) and under the expandable pool (the shim's own
 *      handle, tests/gpu/ipc.cu opens it in another process), =error under
 *      the chunked pool (a legacy handle would map the whole slab in the
 *      peer), =any to only print it.
 *   5. cuMemGetAddressRange on a pointer in the middle of a block returns the
 *      block's own base (through -lcuda and through the runtime's entry point).
 *   5b. Pointer queries (context, range, device, cudaPointerGetAttributes) of a
 *      block in the middle of the pool answer as for a cudaMalloc allocation,
 *      and cuMemRetainAllocationHandle refuses it.
 *   6. Out of memory: a request larger than the device returns
 *      cudaErrorMemoryAllocation; 1 GiB blocks until the device is full end
 *      with cudaErrorMemoryAllocation; after freeing them, allocations work.
 *   7. 8 host threads allocate, write, verify and free at once; half of each
 *      thread's blocks are freed by another thread.
 * Exit 0 only if every expectation held. */
#include "gpu_test.h"

#include <cuda.h>

#include <atomic>
#include <cstdarg>
#include <thread>
#include <vector>

static int failures = 0;

static void check(bool ok, const char *what, const char *detail_format, ...)
    __attribute__((format(printf, 3, 4)));
static void check(bool ok, const char *what, const char *detail_format, ...)
{
    char detail[256];
    va_list args;
    va_start(args, detail_format);
    vsnprintf(detail, sizeof detail, detail_format, args);
    va_end(args);
    printf("misc %s: %s (%s)\n", what, ok ? "ok" : "FAIL", detail);
    failures += !ok;
}

static void expect_invalid_free(void *p, const char *what)
{
    cudaError_t status = cudaFree(p);
    cudaError_t last = cudaGetLastError(); /* clear it, as a program would */
    check(status == cudaErrorInvalidValue, what, "cudaFree(%p) returned %s, last error %s", p,
          cudaGetErrorName(status), cudaGetErrorName(last));
}

static void still_works(const char *after)
{
    void *p = nullptr;
    const size_t n = 3u << 20;
    cudaError_t status = cudaMalloc(&p, n);
    if (status != cudaSuccess) {
        check(false, "works after", "%s: cudaMalloc returned %s", after, cudaGetErrorName(status));
        return;
    }
    fill_pattern(p, n, 31, 0);
    size_t bad = host_verify_ends(p, n, 31, n);
    CK(cudaFree(p));
    char what[96];
    snprintf(what, sizeof what, "works after %s", after);
    check(bad == 0, what, "%zu bad bytes", bad);
}

static void bad_frees(void)
{
    int on_stack[64];
    expect_invalid_free(on_stack, "cudaFree of a stack address");
    still_works("a stack-address free");

    void *a = nullptr, *keep = nullptr;
    CK(cudaMalloc(&keep, 4096)); /* so a is not alone in its slab */
    CK(cudaMalloc(&a, 1u << 20));
    expect_invalid_free((char *)a + 256, "cudaFree of a pointer into the middle of a block");
    fill_pattern(a, 1u << 20, 5, 0);
    size_t bad = host_verify_ends(a, 1u << 20, 5, 1u << 20);
    check(bad == 0, "block intact after a middle free", "%zu bad bytes", bad);
    CK(cudaFree(a));
    expect_invalid_free(a, "double cudaFree");
    still_works("a double free");
    CK(cudaFree(keep));
}

static void memory_info(void)
{
    size_t free_bytes = 0, total_bytes = 0;
    CK(cudaMemGetInfo(&free_bytes, &total_bytes));
    check(free_bytes > 0 && free_bytes <= total_bytes && total_bytes >= (1ull << 30),
          "cudaMemGetInfo", "free %zu MiB of %zu MiB", free_bytes >> 20, total_bytes >> 20);
    void *p = nullptr;
    CK(cudaMalloc(&p, 512u << 20));
    size_t free_after = 0, total_after = 0;
    CK(cudaMemGetInfo(&free_after, &total_after));
    check(free_after <= total_after && total_after == total_bytes, "cudaMemGetInfo with 512 MiB live",
          "free %zu MiB of %zu MiB", free_after >> 20, total_after >> 20);
    CK(cudaFree(p));
}

static void ipc_handle(const char *expect)
{
    void *first = nullptr, *second = nullptr;
    CK(cudaMalloc(&first, 1u << 20));
    CK(cudaMalloc(&second, 1u << 20));
    cudaIpcMemHandle_t handle;
    cudaError_t status = cudaIpcGetMemHandle(&handle, second);
    cudaGetLastError();
    bool ok = !strcmp(expect, "any") || (!strcmp(expect, "ok") && status == cudaSuccess) ||
              (!strcmp(expect, "error") && status != cudaSuccess);
    check(ok, "cudaIpcGetMemHandle on an allocation", "returned %s, expected %s",
          cudaGetErrorName(status), expect);
    CK(cudaFree(second));
    CK(cudaFree(first));
}

typedef CUresult (*address_range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);

static void address_range_with(address_range_fn range, const char *how)
{
    void *blocks[3] = {nullptr, nullptr, nullptr};
    const size_t sizes[3] = {1000, 70000, 3u << 20};
    for (int i = 0; i < 3; i++)
        CK(cudaMalloc(&blocks[i], sizes[i]));
    for (int i = 0; i < 3; i++) {
        CUdeviceptr base = 0;
        size_t size = 0;
        CUresult status = range(&base, &size, (CUdeviceptr)blocks[i] + sizes[i] / 2);
        char what[128];
        snprintf(what, sizeof what, "cuMemGetAddressRange (%s) of block %d", how, i);
        check(status == CUDA_SUCCESS && base == (CUdeviceptr)blocks[i] && size >= sizes[i] &&
                  size <= sizes[i] + (2u << 20),
              what, "status %d, base %p for block %p, size %zu for %zu requested", (int)status,
              (void *)base, blocks[i], size, sizes[i]);
    }
    for (int i = 0; i < 3; i++)
        CK(cudaFree(blocks[i]));
}

static void address_range(void)
{
    address_range_with(cuMemGetAddressRange, "linked -lcuda");
    void *entry = nullptr;
    cudaDriverEntryPointQueryResult found;
    CK(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &entry, 12000, cudaEnableDefault, &found));
    EXPECT(found == cudaDriverEntryPointSuccess && entry, "the runtime found cuMemGetAddressRange");
    address_range_with((address_range_fn)entry, "runtime entry point");
}

/* 5b. pointer queries of a block in the middle of the pool answer as for a
 * cudaMalloc allocation: its context, its range, its device; its physical
 * handle cannot be retained (cuMemRetainAllocationHandle: invalid value for
 * cudaMalloc and cudaMallocAsync memory natively, H200, CUDA 13.0) */
static void pointer_attributes(const char *expect_ipc)
{
    void *before = nullptr, *block = nullptr;
    const size_t n = (5u << 20) + 333;
    CK(cudaMalloc(&before, 1000));
    CK(cudaMalloc(&block, n));
    CUcontext current = nullptr, owner = nullptr;
    CK((cudaError_t)cuCtxGetCurrent(&current));
    CUdeviceptr inside = (CUdeviceptr)block + n / 2, start = 0;
    size_t size = 0;
    int ordinal = -1;
    CUresult r1 = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, inside);
    CUresult r2 = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inside);
    CUresult r3 = cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inside);
    CUresult r4 = cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, inside);
    int device = -1;
    CK(cudaGetDevice(&device));
    check(r1 == CUDA_SUCCESS && owner == current, "pointer attribute context", "status %d, %p, current %p", (int)r1,
          (void *)owner, (void *)current);
    check(r2 == CUDA_SUCCESS && r3 == CUDA_SUCCESS && start == (CUdeviceptr)block && size >= n && size <= n + (2u << 20),
          "pointer attribute range", "status %d/%d, start %+lld from the block, size %zu for %zu", (int)r2, (int)r3,
          (long long)(start - (CUdeviceptr)block), size, n);
    check(r4 == CUDA_SUCCESS && ordinal == device, "pointer attribute device", "status %d, %d", (int)r4, ordinal);
    CUpointer_attribute which[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_CONTEXT};
    start = 0, owner = nullptr;
    void *data[2] = {&start, &owner};
    CUresult r5 = cuPointerGetAttributes(2, which, data, inside);
    check(r5 == CUDA_SUCCESS && start == (CUdeviceptr)block && owner == current, "cuPointerGetAttributes",
          "status %d, start %+lld", (int)r5, (long long)(start - (CUdeviceptr)block));
    cudaPointerAttributes attributes = {};
    cudaError_t r6 = cudaPointerGetAttributes(&attributes, (void *)inside);
    check(r6 == cudaSuccess && attributes.type == cudaMemoryTypeDevice && attributes.device == device,
          "cudaPointerGetAttributes", "%s, type %d, device %d", cudaGetErrorName(r6), (int)attributes.type,
          attributes.device);
    CUmemGenericAllocationHandle handle = 0;
    CUresult r7 = cuMemRetainAllocationHandle(&handle, (void *)inside);
    check(r7 == CUDA_ERROR_INVALID_VALUE, "cuMemRetainAllocationHandle refused", "status %d", (int)r7);
    if (r7 == CUDA_SUCCESS)
        cuMemRelease(handle);
    unsigned long long id = 0, id_before = 0, id_inside = 0, id_again = 0;
    CK((cudaError_t)cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)block));
    CK((cudaError_t)cuPointerGetAttribute(&id_inside, CU_POINTER_ATTRIBUTE_BUFFER_ID, inside));
    CK((cudaError_t)cuPointerGetAttribute(&id_before, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)before));
    int legacy = -1;
    CK((cudaError_t)cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, inside));
    if (strcmp(expect_ipc, "any"))
        check(legacy == !strcmp(expect_ipc, "ok"), "pointer attribute legacy IPC", "%d with --expect-ipc=%s", legacy,
              expect_ipc);
    CK(cudaFree(block));
    void *again = nullptr;
    CK(cudaMalloc(&again, n));
    CK((cudaError_t)cuPointerGetAttribute(&id_again, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)again));
    check(id == id_inside && id != id_before && id_again != id, "pointer attribute buffer id",
          "%llu, inside %llu, the block before %llu, the next block (%s address) %llu", id, id_inside, id_before,
          again == block ? "same" : "other", id_again);
    CK(cudaFree(again));
    CK(cudaFree(before));
}

static void out_of_memory(void)
{
    size_t free_bytes = 0, total_bytes = 0;
    CK(cudaMemGetInfo(&free_bytes, &total_bytes));
    void *p = nullptr;
    cudaError_t status = cudaMalloc(&p, total_bytes * 2);
    cudaGetLastError();
    check(status == cudaErrorMemoryAllocation && p == nullptr, "allocating twice the device",
          "returned %s", cudaGetErrorName(status));
    still_works("an oversized request");

    std::vector<void *> held;
    const size_t gib = 1ull << 30;
    size_t limit = total_bytes / gib + 8;
    status = cudaSuccess;
    while (held.size() < limit) {
        void *block = nullptr;
        status = cudaMalloc(&block, gib);
        if (status != cudaSuccess)
            break;
        held.push_back(block);
    }
    cudaGetLastError();
    check(status == cudaErrorMemoryAllocation, "filling the device with 1 GiB blocks",
          "%zu blocks, then %s", held.size(), cudaGetErrorName(status));
    if (!held.empty()) { /* the last block is usable while the device is full */
        fill_pattern(held.back(), gib, 99, 0);
        size_t bad = host_verify_ends(held.back(), gib, 99, 1u << 20);
        check(bad == 0, "data in the last block of a full device", "%zu bad bytes", bad);
    }
    for (void *block : held)
        CK(cudaFree(block));
    still_works("filling the device");
    void *big = nullptr;
    status = cudaMalloc(&big, 4 * gib);
    check(status == cudaSuccess, "4 GiB after freeing everything", "%s", cudaGetErrorName(status));
    if (status == cudaSuccess)
        CK(cudaFree(big));
}

static void threads_at_once(void)
{
    const int thread_count = 8, per_thread = 64, iterations = 300;
    std::vector<void *> handoff(thread_count * per_thread, nullptr);
    std::vector<size_t> handoff_size(thread_count * per_thread, 0);
    std::atomic<int> ready{0}, bad_total{0}, errors{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < thread_count; t++) {
        threads.emplace_back([&, t]() {
            if (cudaSetDevice(0) != cudaSuccess) {
                errors++;
                return;
            }
            cudaStream_t s;
            CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            unsigned long long *counter = nullptr;
            CK(cudaMalloc((void **)&counter, sizeof *counter));
            CK(cudaMemsetAsync(counter, 0, sizeof *counter, s));
            uint32_t rng = 12345u + t;
            void *ring[8] = {nullptr};
            size_t ring_size[8] = {0};
            uint32_t ring_seed[8] = {0};
            for (int it = 0; it < iterations; it++) {
                int slot = it % 8;
                if (ring[slot]) {
                    count_mismatches(ring[slot], ring_size[slot], ring_seed[slot], counter, s);
                    CK(cudaStreamSynchronize(s));
                    CK(cudaFree(ring[slot]));
                }
                rng = rng * 1664525u + 1013904223u;
                ring_size[slot] = 1 + (rng >> 8) % (1u << 20);
                if (cudaMalloc(&ring[slot], ring_size[slot]) != cudaSuccess) {
                    errors++;
                    ring[slot] = nullptr;
                    continue;
                }
                ring_seed[slot] = (uint32_t)(t * 100000 + it);
                fill_pattern(ring[slot], ring_size[slot], ring_seed[slot], s);
            }
            for (int slot = 0; slot < 8; slot++)
                if (ring[slot]) {
                    count_mismatches(ring[slot], ring_size[slot], ring_seed[slot], counter, s);
                    CK(cudaStreamSynchronize(s));
                    CK(cudaFree(ring[slot]));
                }
            /* hand blocks to the next thread, which verifies and frees them */
            for (int i = 0; i < per_thread; i++) {
                size_t n = 256 + 4096 * (size_t)i;
                CK(cudaMalloc(&handoff[t * per_thread + i], n));
                handoff_size[t * per_thread + i] = n;
                fill_pattern(handoff[t * per_thread + i], n, (uint32_t)(7000 + t * per_thread + i), s);
            }
            CK(cudaStreamSynchronize(s));
            ready++;
            while (ready.load() < thread_count)
                std::this_thread::yield();
            int from = (t + 1) % thread_count;
            for (int i = 0; i < per_thread; i++) {
                int k = from * per_thread + i;
                count_mismatches(handoff[k], handoff_size[k], (uint32_t)(7000 + k), counter, s);
                CK(cudaStreamSynchronize(s));
                CK(cudaFree(handoff[k]));
            }
            unsigned long long bad = 0;
            CK(cudaMemcpy(&bad, counter, sizeof bad, cudaMemcpyDeviceToHost));
            bad_total += (int)bad;
            CK(cudaFree(counter));
            CK(cudaStreamDestroy(s));
        });
    }
    for (std::thread &th : threads)
        th.join();
    check(bad_total.load() == 0 && errors.load() == 0, "8 threads allocating, verifying, freeing",
          "%d bad bytes, %d failed calls", bad_total.load(), errors.load());
}

int main(int argc, char **argv)
{
    const char *expect_ipc = "any";
    bool skip_oom = false;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--expect-ipc=", 13))
            expect_ipc = argv[i] + 13;
        else if (!strcmp(argv[i], "--no-oom"))
            skip_oom = true;
        else {
            fprintf(stderr, "usage: misc [--expect-ipc=ok|error|any] [--no-oom]\n");
            return EXIT_CUDA_ERROR;
        }
    }
    cudaError_t first = cudaFree(nullptr);
    check(first == cudaSuccess, "cudaFree(NULL) as the first call", "%s", cudaGetErrorName(first));
    printf("misc: poolshim %s\n", poolshim_is_active() ? "active" : "not active");
    bad_frees();
    memory_info();
    ipc_handle(expect_ipc);
    address_range();
    pointer_attributes(expect_ipc);
    if (!skip_oom)
        out_of_memory();
    threads_at_once();
    if (failures) {
        printf("misc: FAIL (%d checks)\n", failures);
        return EXIT_CUDA_ERROR;
    }
    printf("misc: OK\n");
    return 0;
}
