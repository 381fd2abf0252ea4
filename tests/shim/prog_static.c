/* A program that reaches the driver exactly like a statically linked cudart
 * (what plain `nvcc` produces): dlopen("libcuda.so.1"), dlsym the entry
 * cuGetProcAddress_v2, then ask it for each function by name, cudaVersion
 * and flags. Built twice: binding dlsym@GLIBC_2.34 (default) and, with
 * -DOLD_DLSYM, dlsym@GLIBC_2.2.5 as programs built on older glibc do. */
#include <stdint.h>

#include "prog_common.h"

#ifdef OLD_DLSYM
__asm__(".symver dlsym, dlsym@GLIBC_2.2.5");
#endif

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen libcuda.so.1: %s", dlerror());
    if (!h)
        return finish("static");
    gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    CHECK(gpa != NULL, "cuGetProcAddress_v2");
    CUdriverProcAddressQueryResult st = 99;
    void *fn = (void *)1;

    /* status must be filled truthfully, also for names we do not hook */
    CHECK(gpa("cuNoSuchFunction", &fn, 13000, 0, &st) == CUDA_ERROR_NOT_FOUND, "unknown symbol");
    CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "symbolStatus %d", st);

    CUresult (*init)(unsigned) = NULL;
    CUresult (*retain)(CUcontext *, CUdevice) = NULL;
    CUresult (*set)(CUcontext) = NULL;
    CUresult (*alloc)(CUdeviceptr *, size_t) = NULL;
    CUresult (*mfree)(CUdeviceptr) = NULL;
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) = NULL;
    CUresult (*alloc_async_ptsz)(CUdeviceptr *, size_t, CUstream) = NULL;
    CUresult (*free_async)(CUdeviceptr, CUstream) = NULL;
    CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr) = NULL;
    CHECK(gpa("cuInit", (void **)&init, 13000, 0, &st) == CUDA_SUCCESS && st == 0, "cuInit");
    CHECK(gpa("cuDevicePrimaryCtxRetain", (void **)&retain, 13000, 0, &st) == CUDA_SUCCESS, "retain");
    CHECK(gpa("cuCtxSetCurrent", (void **)&set, 13000, 0, &st) == CUDA_SUCCESS, "set");
    CHECK(gpa("cuMemAlloc", (void **)&alloc, 3020, 0, &st) == CUDA_SUCCESS, "cuMemAlloc");
    CHECK(gpa("cuMemFree", (void **)&mfree, 3020, 0, &st) == CUDA_SUCCESS, "cuMemFree");
    CHECK(gpa("cuMemAllocAsync", (void **)&alloc_async, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st) == 0, "async");
    CHECK(gpa("cuMemAllocAsync", (void **)&alloc_async_ptsz, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
              &st) == 0, "async ptsz");
    CHECK(gpa("cuMemFreeAsync", (void **)&free_async, 12000, 0, &st) == 0, "free async");
    CHECK(gpa("cuMemGetAddressRange", (void **)&range, 3020, 0, &st) == 0, "range");
    if (failures)
        return finish("static");
    CHECK(alloc_async != alloc_async_ptsz, "legacy and per-thread variants must differ");

    CUcontext ctx;
    CHECK(init(0) == CUDA_SUCCESS && retain(&ctx, 0) == CUDA_SUCCESS && set(ctx) == CUDA_SUCCESS, "context");
    unsigned long before = fake()->mem_alloc, async_before = fake()->mem_alloc_async, ptsz_before = fake()->mem_alloc_async_ptsz;
    CUdeviceptr p[100];
    for (int i = 0; i < 100; i++) {
        CHECK(alloc(&p[i], 3000) == CUDA_SUCCESS, "alloc %d", i);
        fill((void *)(uintptr_t)p[i], 3000, (unsigned)i);
    }
    for (int i = 0; i < 100; i++)
        CHECK(intact((void *)(uintptr_t)p[i], 3000, (unsigned)i), "data %d", i);
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK(range(&base, &size, p[7] + 100) == CUDA_SUCCESS && base == p[7] && size >= 3000,
          "cuMemGetAddressRange answers for the allocation (base %llx size %zu)", base, size);
    CHECK(mfree(p[3] + 256) == CUDA_ERROR_INVALID_VALUE, "interior free");
    for (int i = 0; i < 100; i++)
        CHECK(mfree(p[i]) == CUDA_SUCCESS, "free %d", i);
    CHECK(mfree(p[0]) == CUDA_ERROR_INVALID_VALUE, "double free");
    CUdeviceptr a, b;
    CHECK(alloc_async(&a, 5000, NULL) == CUDA_SUCCESS, "alloc async");
    CHECK(alloc_async_ptsz(&b, 5000, NULL) == CUDA_SUCCESS, "alloc async ptsz");
    CHECK(free_async(a, NULL) == CUDA_SUCCESS && free_async(b, NULL) == CUDA_SUCCESS, "free async");
    unsigned long reached = fake()->mem_alloc - before;
    if (shim_active()) {
        CHECK(reached < 5, "%lu allocations reached the driver", reached);
        CHECK(fake()->mem_alloc_async == async_before && fake()->mem_alloc_async_ptsz == ptsz_before,
              "async allocations must be served by the pool");
    } else {
        CHECK(reached == 102, "%lu allocations reached the driver natively", reached);
        CHECK(fake()->mem_alloc_async_ptsz == ptsz_before + 1, "per-thread variant natively");
    }
    return finish("static");
}
