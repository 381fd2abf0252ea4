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

static int context_scenarios(gpa_fn gpa, const char *what);
static int capture_global_scenario(gpa_fn gpa, CUresult (*alloc)(CUdeviceptr *, size_t),
                                   CUresult (*mfree)(CUdeviceptr));

/* Pinned host memory through the driver door (hooks handed out by
 * cuGetProcAddress): cuMemHostAlloc, cuMemAllocHost, cuMemFreeHost. */
static int pinned_scenario(gpa_fn gpa)
{
    CUdriverProcAddressQueryResult st;
    CUresult (*host_alloc)(void **, size_t, unsigned) = NULL;
    CUresult (*alloc_host)(void **, size_t) = NULL;
    CUresult (*free_host)(void *) = NULL;
    CHECK(gpa("cuMemHostAlloc", (void **)&host_alloc, 13000, 0, &st) == CUDA_SUCCESS, "cuMemHostAlloc");
    CHECK(gpa("cuMemAllocHost", (void **)&alloc_host, 13000, 0, &st) == CUDA_SUCCESS, "cuMemAllocHost");
    CHECK(gpa("cuMemFreeHost", (void **)&free_host, 13000, 0, &st) == CUDA_SUCCESS, "cuMemFreeHost");
    CUresult (*get_flags)(unsigned *, void *) = NULL;
    CUresult (*get_device_pointer)(CUdeviceptr *, void *, unsigned) = NULL;
    CUresult (*host_register)(void *, size_t, unsigned) = NULL;
    CUresult (*host_unregister)(void *) = NULL;
    CHECK(gpa("cuMemHostGetFlags", (void **)&get_flags, 13000, 0, &st) == CUDA_SUCCESS, "cuMemHostGetFlags");
    CHECK(gpa("cuMemHostGetDevicePointer", (void **)&get_device_pointer, 13000, 0, &st) == CUDA_SUCCESS,
          "cuMemHostGetDevicePointer");
    CHECK(gpa("cuMemHostRegister", (void **)&host_register, 13000, 0, &st) == CUDA_SUCCESS, "cuMemHostRegister");
    CHECK(gpa("cuMemHostUnregister", (void **)&host_unregister, 13000, 0, &st) == CUDA_SUCCESS, "cuMemHostUnregister");
    if (failures)
        return finish("pinned");
    unsigned long before = fake()->host_alloc;
    void *p[40];
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < 40; i++) {
            size_t n = 1000 + (size_t)i * 3000;
            CUresult r = i & 1 ? alloc_host(&p[i], n) : host_alloc(&p[i], n, (unsigned)(i % 4) & 3u);
            CHECK(r == CUDA_SUCCESS, "pinned alloc %d", i);
            fill(p[i], n, (unsigned)i * 3 + (unsigned)round);
        }
        for (int i = 0; i < 40; i++)
            CHECK(intact(p[i], 1000 + (size_t)i * 3000, (unsigned)i * 3 + (unsigned)round), "block %d overwritten", i);
        for (int i = 0; i < 40; i++)
            CHECK(free_host(p[i]) == CUDA_SUCCESS, "cuMemFreeHost %d", i);
    }
    unsigned long reached = fake()->host_alloc - before;
    /* queries of a pinned block (3 MiB: across pieces of the host range)
     * answer as for cuMemHostAlloc memory; the fake driver answers only for
     * that, so blocks of the range pass only if the shim answers */
    void *b = NULL;
    size_t n = (size_t)3 << 20;
    CHECK(host_alloc(&b, n, 0) == CUDA_SUCCESS, "a 3 MiB pinned block");
    unsigned flags = 99;
    CHECK(get_flags(&flags, (char *)b + n - 1) == CUDA_SUCCESS && flags == (shim_active() ? 3u : 0u),
          "cuMemHostGetFlags (%u)", flags);
    CUdeviceptr d = 0;
    CHECK(get_device_pointer(&d, (char *)b + (2 << 20), 0) == CUDA_SUCCESS && d == (CUdeviceptr)(uintptr_t)b + (2 << 20),
          "cuMemHostGetDevicePointer inside the block");
    CHECK(get_device_pointer(&d, b, 2) == CUDA_ERROR_INVALID_VALUE, "its flags must be 0");
    CHECK(host_register(b, n, 0) == CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister of pinned memory");
    CHECK(host_unregister(b) == CUDA_ERROR_INVALID_VALUE, "cuMemHostUnregister of allocated memory");
    CHECK(free_host(b) == CUDA_SUCCESS, "free the 3 MiB block");
    if (shim_active()) {
        CHECK(reached < 10, "%lu pinned allocations reached the driver", reached);
        void *q;
        CHECK(host_alloc(&q, 4096, 0) == CUDA_SUCCESS, "alloc");
        CHECK(free_host((char *)q + 512) == CUDA_ERROR_INVALID_VALUE, "interior pointer");
        CHECK(free_host(q) == CUDA_SUCCESS, "free");
        CHECK(free_host(q) == CUDA_ERROR_INVALID_VALUE, "double free");
    } else {
        CHECK(reached == 200, "%lu of 200 pinned allocations reached the driver", reached);
    }
    void *wc;
    before = fake()->host_alloc;
    CHECK(host_alloc(&wc, 4096, 4) == CUDA_SUCCESS && fake()->host_alloc == before + 1, "write-combined passes through");
    CHECK(free_host(wc) == CUDA_SUCCESS, "foreign free");
    return finish("pinned");
}

/* Device 1's pooled memory copied with device 0 current (both ways, the
 * unified cuMemcpy too), FAKE_CUDA_VMM=1 FAKE_CUDA_DEVICES=2: the copies
 * must be accepted (the fake refuses a device a mapping does not name) and,
 * under the shim, each is ordered with device 1's legacy stream: two event
 * records and two waits (copy_order.c); a copy within device 0 is not.
 * `chunks`: the pool uses chunks (no peer capability), nothing is ordered. */
static int cross_copy_scenario(gpa_fn gpa, CUresult (*retain)(CUcontext *, CUdevice), CUresult (*set)(CUcontext),
                               CUresult (*alloc)(CUdeviceptr *, size_t), CUresult (*mfree)(CUdeviceptr), int chunks)
{
    CUdriverProcAddressQueryResult st;
    CUresult (*htod)(CUdeviceptr, const void *, size_t) = NULL;
    CUresult (*dtoh)(void *, CUdeviceptr, size_t) = NULL;
    CUresult (*copy)(CUdeviceptr, CUdeviceptr, size_t) = NULL;
    CHECK(gpa("cuMemcpyHtoD", (void **)&htod, 13000, 0, &st) == CUDA_SUCCESS, "cuMemcpyHtoD");
    CHECK(gpa("cuMemcpyDtoH", (void **)&dtoh, 13000, 0, &st) == CUDA_SUCCESS, "cuMemcpyDtoH");
    CHECK(gpa("cuMemcpy", (void **)&copy, 13000, 0, &st) == CUDA_SUCCESS, "cuMemcpy");
    CUcontext ctx0, ctx1;
    CHECK(retain(&ctx0, 0) == CUDA_SUCCESS && retain(&ctx1, 1) == CUDA_SUCCESS, "two contexts");
    if (failures)
        return finish("cross_copy");
    const size_t n = (3u << 20) + 4097;
    CUdeviceptr b1 = 0, a0 = 0;
    CHECK(set(ctx1) == CUDA_SUCCESS && alloc(&b1, n) == CUDA_SUCCESS, "device 1 block");
    CHECK(set(ctx0) == CUDA_SUCCESS && alloc(&a0, n) == CUDA_SUCCESS, "device 0 block");
    unsigned char *host = malloc(n), *back = malloc(n);
    fill(host, n, 5);
    int active = shim_active();
    unsigned long rec = fake()->event_record, waits = fake()->stream_wait;
    CHECK(htod(b1, host, n) == CUDA_SUCCESS, "device 0 current: HtoD into device 1's block refused (%lu refusals)",
          fake()->copy_refused);
    CHECK(copy(a0, b1, n) == CUDA_SUCCESS, "device 0 current: cuMemcpy from device 1's block refused");
    memset(back, 0, n);
    CHECK(dtoh(back, b1, n) == CUDA_SUCCESS && intact(back, n, 5), "device 0 current: DtoH of device 1's block");
    unsigned long cross_rec = fake()->event_record - rec, cross_waits = fake()->stream_wait - waits;
    unsigned long want = active && !chunks ? 6 : 0;
    CHECK(cross_rec == want && cross_waits == want,
          "three copies of device 1's memory not ordered with device 1: %lu records, %lu waits (want %lu, %lu)",
          cross_rec, cross_waits, want, want);
    rec = fake()->event_record, waits = fake()->stream_wait;
    memset(back, 0, n);
    CHECK(dtoh(back, a0, n) == CUDA_SUCCESS && intact(back, n, 5), "device 0's own block");
    CHECK(fake()->event_record == rec && fake()->stream_wait == waits, "a copy within device 0 was ordered too");
    printf("cross_copy: %lu records, %lu waits for 3 cross-device copies\n", cross_rec, cross_waits);
    CHECK(mfree(a0) == CUDA_SUCCESS, "free a0");
    CHECK(set(ctx1) == CUDA_SUCCESS && mfree(b1) == CUDA_SUCCESS, "free b1");
    free(host);
    free(back);
    return finish("cross_copy");
}

/* Two devices, FAKE_CUDA_VMM=1 FAKE_CUDA_DEVICES=2, the second not used at
 * first: device 0's mappings name device 0 alone (a program that uses one
 * GPU of several pays for no other). Then a context the shim builds no
 * stack for (cuCtxCreate) on device 1 copies device 0's block: granted at
 * that copy (copy_order.c), it runs; then device 1's primary context and a
 * block there, which names device 0 from the start. */
static int lazy_grant_scenario(gpa_fn gpa, CUresult (*retain)(CUcontext *, CUdevice), CUresult (*set)(CUcontext),
                               CUresult (*alloc)(CUdeviceptr *, size_t), CUresult (*mfree)(CUdeviceptr))
{
    CUdriverProcAddressQueryResult st;
    CUresult (*htod)(CUdeviceptr, const void *, size_t) = NULL;
    CUresult (*dtoh)(void *, CUdeviceptr, size_t) = NULL;
    CHECK(gpa("cuMemcpyHtoD", (void **)&htod, 13000, 0, &st) == CUDA_SUCCESS, "cuMemcpyHtoD");
    CHECK(gpa("cuMemcpyDtoH", (void **)&dtoh, 13000, 0, &st) == CUDA_SUCCESS, "cuMemcpyDtoH");
    CUcontext ctx0, ctx1;
    CHECK(retain(&ctx0, 0) == CUDA_SUCCESS && set(ctx0) == CUDA_SUCCESS, "device 0's context");
    if (failures)
        return finish("lazy_grant");
    const size_t n = (5u << 20) + 4097;
    unsigned char *host = malloc(n), *back = malloc(n);
    fill(host, n, 9);
    CUdeviceptr a0 = 0, b1 = 0;
    unsigned long other = fake()->vm_access_other;
    CHECK(alloc(&a0, n) == CUDA_SUCCESS && htod(a0, host, n) == CUDA_SUCCESS, "device 0 block");
    CHECK(fake()->vm_access_other == other, "device 0's mappings named another device (%lu descriptors)",
          fake()->vm_access_other - other);
    CUresult (*create)(CUcontext *, unsigned, CUdevice) = NULL;
    CUcontext own1;
    CHECK(gpa("cuCtxCreate", (void **)&create, 13000, 0, &st) == CUDA_SUCCESS && create(&own1, 0, 1) == CUDA_SUCCESS &&
              set(own1) == CUDA_SUCCESS,
          "a context of the program's own on device 1");
    memset(back, 0, n);
    CHECK(dtoh(back, a0, n) == CUDA_SUCCESS && intact(back, n, 9),
          "device 1 current: DtoH of device 0's block refused (%lu refusals)", fake()->copy_refused);
    unsigned long granted = fake()->vm_access_other - other;
    CHECK(retain(&ctx1, 1) == CUDA_SUCCESS && set(ctx1) == CUDA_SUCCESS, "device 1's primary context");
    CHECK(alloc(&b1, n) == CUDA_SUCCESS, "device 1 block");
    CHECK(set(ctx0) == CUDA_SUCCESS && htod(b1, host, n) == CUDA_SUCCESS, "device 0 current: HtoD into device 1's block");
    memset(back, 0, n);
    CHECK(dtoh(back, b1, n) == CUDA_SUCCESS && intact(back, n, 9), "device 0 current: DtoH of device 1's block");
    printf("lazy_grant: %lu grants to device 1 at the first copy\n", granted);
    CHECK(mfree(a0) == CUDA_SUCCESS, "free a0");
    CHECK(set(ctx1) == CUDA_SUCCESS && mfree(b1) == CUDA_SUCCESS, "free b1");
    free(host);
    free(back);
    return finish("lazy_grant");
}

/* Pointer queries of a block in the middle of the pool (FAKE_CUDA_VMM=1:
 * mapped memory under the shim): answered as for cuMemAlloc memory, natively
 * and under the shim alike: the block's context and range, from its base
 * and from inside, one at a time and together, and no retained handle. */
static int attributes_scenario(gpa_fn gpa, CUresult (*retain)(CUcontext *, CUdevice), CUresult (*set)(CUcontext),
                               CUresult (*alloc)(CUdeviceptr *, size_t), CUresult (*mfree)(CUdeviceptr), int chunks)
{
    CUdriverProcAddressQueryResult st;
    CUresult (*attr)(void *, int, CUdeviceptr) = NULL;
    CUresult (*attrs)(unsigned, int *, void **, CUdeviceptr) = NULL;
    CUresult (*retain_handle)(CUmemGenericAllocationHandle *, void *) = NULL;
    CHECK(gpa("cuPointerGetAttribute", (void **)&attr, 13000, 0, &st) == CUDA_SUCCESS, "cuPointerGetAttribute");
    CHECK(gpa("cuPointerGetAttributes", (void **)&attrs, 13000, 0, &st) == CUDA_SUCCESS, "cuPointerGetAttributes");
    CHECK(gpa("cuMemRetainAllocationHandle", (void **)&retain_handle, 13000, 0, &st) == CUDA_SUCCESS,
          "cuMemRetainAllocationHandle");
    CUcontext ctx;
    CHECK(retain(&ctx, 0) == CUDA_SUCCESS && set(ctx) == CUDA_SUCCESS, "context");
    if (failures)
        return finish("attributes");
    CUdeviceptr before = 0, block = 0;
    const size_t n = (3u << 20) + 123;
    CHECK(alloc(&before, 4096) == CUDA_SUCCESS && alloc(&block, n) == CUDA_SUCCESS, "blocks");
    for (int inside = 0; inside < 2; inside++) {
        CUdeviceptr p = block + (inside ? n - 1 : 0), start = 0;
        size_t size = 0;
        CUcontext owner = NULL;
        CHECK(attr(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p) == CUDA_SUCCESS && owner == ctx,
              "context of the block (%s): %p, want %p", inside ? "inside" : "base", (void *)owner, (void *)ctx);
        CHECK(attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) == CUDA_SUCCESS && start == block,
              "range start (%s): %+lld from the block", inside ? "inside" : "base", (long long)(start - block));
        CHECK(attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) == CUDA_SUCCESS && size == n, "range size %zu, want %zu",
              size, n);
        int which[3] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_CONTEXT,
                        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
        size = 0, start = 0, owner = NULL;
        void *data[3] = {&size, &owner, &start};
        CHECK(attrs(3, which, data, p) == CUDA_SUCCESS && size == n && owner == ctx && start == block,
              "cuPointerGetAttributes: size %zu start %+lld", size, (long long)(start - block));
    }
    CUmemGenericAllocationHandle h = 0;
    CHECK(retain_handle(&h, (void *)(uintptr_t)(block + 4096)) == CUDA_ERROR_INVALID_VALUE,
          "a block's physical handle was retained");
    /* buffer ids: one per allocation, the same from inside, new for the next
     * block at the same address; legacy IPC as for cuMemAlloc memory (not
     * over chunks: the shim cannot export those); no handle types */
    unsigned long long id_before = 0, id = 0, id_inside = 0, id_again = 0, types = 7;
    int legacy = -1;
    CHECK(attr(&id_before, CU_POINTER_ATTRIBUTE_BUFFER_ID, before) == CUDA_SUCCESS &&
              attr(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, block) == CUDA_SUCCESS &&
              attr(&id_inside, CU_POINTER_ATTRIBUTE_BUFFER_ID, block + n - 1) == CUDA_SUCCESS,
          "buffer ids");
    CHECK(id != id_before && id == id_inside, "buffer id %llu of the block, %llu inside, %llu of the one before", id,
          id_inside, id_before);
    CHECK(attr(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, block + 5) == CUDA_SUCCESS &&
              legacy == (chunks ? 0 : 1),
          "legacy IPC capable: %d", legacy);
    CHECK(attr(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, block) == CUDA_SUCCESS && types == 0,
          "allowed handle types %llu", types);
    CHECK(mfree(block) == CUDA_SUCCESS, "free");
    CUdeviceptr again = 0;
    CHECK(alloc(&again, n) == CUDA_SUCCESS, "again");
    CHECK(attr(&id_again, CU_POINTER_ATTRIBUTE_BUFFER_ID, again) == CUDA_SUCCESS && id_again != id,
          "the next block (%s address) kept the buffer id %llu", again == block ? "same" : "other", id);
    CHECK(mfree(again) == CUDA_SUCCESS && mfree(before) == CUDA_SUCCESS, "frees");
    return finish("attributes");
}

int main(int argc, char **argv)
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
    if (argc > 1 && !strcmp(argv[1], "pinned")) {
        CHECK(init(0) == CUDA_SUCCESS, "cuInit");
        CUcontext pctx;
        CHECK(retain(&pctx, 0) == CUDA_SUCCESS && set(pctx) == CUDA_SUCCESS, "context");
        return pinned_scenario(gpa);
    }
    if (argc > 1 && !strcmp(argv[1], "attributes")) {
        CHECK(init(0) == CUDA_SUCCESS, "cuInit");
        return attributes_scenario(gpa, retain, set, alloc, mfree, argc > 2 && !strcmp(argv[2], "chunks"));
    }
    if (argc > 1 && !strcmp(argv[1], "cross_copy")) {
        CHECK(init(0) == CUDA_SUCCESS, "cuInit");
        return cross_copy_scenario(gpa, retain, set, alloc, mfree, argc > 2 && !strcmp(argv[2], "chunks"));
    }
    if (argc > 1 && !strcmp(argv[1], "lazy_grant")) {
        CHECK(init(0) == CUDA_SUCCESS, "cuInit");
        return lazy_grant_scenario(gpa, retain, set, alloc, mfree);
    }
    if (argc > 1 && !strcmp(argv[1], "capture_global")) {
        CUcontext pctx;
        CHECK(init(0) == CUDA_SUCCESS && retain(&pctx, 0) == CUDA_SUCCESS && set(pctx) == CUDA_SUCCESS, "context");
        return capture_global_scenario(gpa, alloc, mfree);
    }
    if (argc > 1) {
        CHECK(init(0) == CUDA_SUCCESS, "cuInit");
        return context_scenarios(gpa, argv[1]);
    }
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

/* ---- a global-mode capture is open ----
 * CUDA prohibits cuMemAlloc/cuMemFree (cudaMalloc/cudaFree) on a thread
 * whose capture mode is not relaxed while a global-mode capture is open:
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the block stays allocated. The
 * shim must answer the same, natively and through the shim alike, even when
 * its pool could serve the request without CUDA (the blocks freed before
 * the capture are pending or free in the pool); in relaxed mode both work. */
static int capture_global_scenario(gpa_fn gpa, CUresult (*alloc)(CUdeviceptr *, size_t),
                                   CUresult (*mfree)(CUdeviceptr))
{
    CUdriverProcAddressQueryResult st;
    CUresult (*stream_create)(CUstream *, unsigned) = NULL;
    CUresult (*stream_destroy)(CUstream) = NULL;
    CUresult (*begin)(CUstream, CUstreamCaptureMode) = NULL;
    CUresult (*end)(CUstream, void **) = NULL;
    CUresult (*exchange)(CUstreamCaptureMode *) = NULL;
    CHECK(gpa("cuStreamCreate", (void **)&stream_create, 13000, 0, &st) == CUDA_SUCCESS, "cuStreamCreate");
    CHECK(gpa("cuStreamDestroy", (void **)&stream_destroy, 13000, 0, &st) == CUDA_SUCCESS, "cuStreamDestroy");
    CHECK(gpa("cuStreamBeginCapture", (void **)&begin, 13000, 0, &st) == CUDA_SUCCESS, "cuStreamBeginCapture");
    CHECK(gpa("cuStreamEndCapture", (void **)&end, 13000, 0, &st) == CUDA_SUCCESS, "cuStreamEndCapture");
    CHECK(gpa("cuThreadExchangeStreamCaptureMode", (void **)&exchange, 13000, 0, &st) == CUDA_SUCCESS, "exchange");
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) = NULL;
    CUresult (*free_async)(CUdeviceptr, CUstream) = NULL;
    CHECK(gpa("cuMemAllocAsync", (void **)&alloc_async, 13000, 0, &st) == CUDA_SUCCESS, "cuMemAllocAsync");
    CHECK(gpa("cuMemFreeAsync", (void **)&free_async, 13000, 0, &st) == CUDA_SUCCESS, "cuMemFreeAsync");
    if (failures)
        return finish("capture_global");
    CUdeviceptr keep, p[8], q = 0;
    CHECK(alloc(&keep, 4096) == CUDA_SUCCESS, "alloc before the capture");
    for (int i = 0; i < 8; i++) /* churn: the pool holds free and pending blocks of this size */
        CHECK(alloc(&p[i], 4096) == CUDA_SUCCESS, "alloc %d", i);
    for (int i = 0; i < 8; i++)
        CHECK(mfree(p[i]) == CUDA_SUCCESS, "free %d", i);
    CUstream s;
    CHECK(stream_create(&s, 0) == CUDA_SUCCESS, "stream");
    CHECK(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS, "begin a global capture");
    /* stream-ordered calls on the capturing stream are CUDA's (graph memory
     * nodes), and must not make the shim ask CUDA with an unsafe call of its
     * own: on the capturing thread that call would invalidate the capture */
    CUdeviceptr node = 0;
    unsigned long refused_before = fake()->unsafe_refused;
    CHECK(alloc_async(&node, 4096, s) == CUDA_SUCCESS, "cuMemAllocAsync inside the capture");
    CHECK(free_async(node, s) == CUDA_SUCCESS, "cuMemFreeAsync inside the capture");
    CHECK(fake()->unsafe_refused == refused_before, "%lu unsafe calls during stream-ordered calls in the capture",
          fake()->unsafe_refused - refused_before);
    CHECK(mfree(keep) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemFree during a global capture");
    CHECK(alloc(&q, 4096) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemAlloc during a global capture");
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK(exchange(&mode) == CUDA_SUCCESS && mode == CU_STREAM_CAPTURE_MODE_GLOBAL, "relaxed mode");
    CHECK(alloc(&q, 4096) == CUDA_SUCCESS, "cuMemAlloc in relaxed mode");
    CHECK(mfree(q) == CUDA_SUCCESS, "cuMemFree in relaxed mode");
    CHECK(exchange(&mode) == CUDA_SUCCESS, "global mode again");
    CHECK(end(s, NULL) == CUDA_SUCCESS, "end the capture");
    /* the stream goes before the next cudaFree: the shim must not ask CUDA
     * about the dead handle (on the GPU that crashed inside libcuda) */
    unsigned long dead_before = fake()->dead_calls;
    CHECK(stream_destroy(s) == CUDA_SUCCESS, "destroy");
    CHECK(mfree(keep) == CUDA_SUCCESS, "the block survived the refused free");
    CHECK(alloc(&q, 4096) == CUDA_SUCCESS && mfree(q) == CUDA_SUCCESS, "allowed again after the capture");
    CHECK(fake()->dead_calls == dead_before, "%lu calls on the destroyed stream", fake()->dead_calls - dead_before);
    return finish("capture_global");
}

/* ---- context lifecycle through the driver API ---- */
static CUresult (*retain_fn)(CUcontext *, CUdevice);
static CUresult (*release_fn)(CUdevice);
static CUresult (*reset_fn)(CUdevice);
static CUresult (*set_fn)(CUcontext);
static CUresult (*alloc_fn)(CUdeviceptr *, size_t);
static CUresult (*free_fn)(CUdeviceptr);
static CUresult (*create_fn)(CUcontext *, unsigned, CUdevice);
static CUresult (*destroy_fn)(CUcontext);

/* Allocates, fills, checks and frees n blocks in the current context. */
static void use_memory(int n, unsigned seed, const char *when)
{
    CUdeviceptr p[32];
    for (int i = 0; i < n && i < 32; i++) {
        CHECK(alloc_fn(&p[i], 2000 + (size_t)i * 512) == CUDA_SUCCESS, "%s: alloc %d", when, i);
        fill((void *)(uintptr_t)p[i], 2000 + (size_t)i * 512, seed + (unsigned)i);
    }
    for (int i = 0; i < n && i < 32; i++) {
        CHECK(intact((void *)(uintptr_t)p[i], 2000 + (size_t)i * 512, seed + (unsigned)i), "%s: data %d", when, i);
        CHECK(free_fn(p[i]) == CUDA_SUCCESS, "%s: free %d", when, i);
    }
}

static int context_scenarios(gpa_fn gpa, const char *what)
{
    CUdriverProcAddressQueryResult st;
    CHECK(gpa("cuDevicePrimaryCtxRetain", (void **)&retain_fn, 13000, 0, &st) == 0, "retain");
    CHECK(gpa("cuDevicePrimaryCtxRelease", (void **)&release_fn, 13000, 0, &st) == 0, "release");
    CHECK(gpa("cuDevicePrimaryCtxReset", (void **)&reset_fn, 13000, 0, &st) == 0, "reset");
    CHECK(gpa("cuCtxSetCurrent", (void **)&set_fn, 13000, 0, &st) == 0, "set");
    CHECK(gpa("cuMemAlloc", (void **)&alloc_fn, 13000, 0, &st) == 0, "alloc");
    CHECK(gpa("cuMemFree", (void **)&free_fn, 13000, 0, &st) == 0, "free");
    CHECK(gpa("cuCtxCreate", (void **)&create_fn, 13000, 0, &st) == 0, "create");
    CHECK(gpa("cuCtxDestroy", (void **)&destroy_fn, 13000, 0, &st) == 0, "destroy");
    if (failures)
        return finish(what);
    CUcontext ctx;
    CHECK(retain_fn(&ctx, 0) == CUDA_SUCCESS && set_fn(ctx) == CUDA_SUCCESS, "primary context");
    CUdeviceptr stale;
    CHECK(alloc_fn(&stale, 4096) == CUDA_SUCCESS, "alloc before");
    use_memory(10, 1, "before");
    unsigned long destroyed = fake()->ctx_destroyed;
    if (!strcmp(what, "release")) {
        /* a second reference: releasing it keeps the context (and the pool) */
        CUcontext again;
        CHECK(retain_fn(&again, 0) == CUDA_SUCCESS && again == ctx, "second retain");
        CHECK(release_fn(0) == CUDA_SUCCESS, "release of the second reference");
        CHECK(fake()->ctx_destroyed == destroyed, "the context must survive while referenced");
        CUdeviceptr kept;
        CHECK(alloc_fn(&kept, 100) == CUDA_SUCCESS && free_fn(kept) == CUDA_SUCCESS, "still usable");
        CHECK(release_fn(0) == CUDA_SUCCESS, "release of the last reference");
    } else if (!strcmp(what, "primary_reset")) {
        CHECK(reset_fn(0) == CUDA_SUCCESS, "cuDevicePrimaryCtxReset");
        /* "resetting the primary context does not release it": release our usage */
        CHECK(release_fn(0) == CUDA_SUCCESS, "release after the reset");
    } else if (!strcmp(what, "ctx_create")) {
        /* non-primary contexts pass through (a warning once per context) */
        for (int round = 0; round < 2; round++) {
            CUcontext created;
            CHECK(create_fn(&created, 0, 0) == CUDA_SUCCESS, "cuCtxCreate");
            unsigned long before = fake()->mem_alloc;
            use_memory(5, 10, "in a created context");
            CHECK(fake()->mem_alloc - before == 5, "%lu of 5 allocations reached the driver (pass through)",
                  fake()->mem_alloc - before);
            CHECK(destroy_fn(created) == CUDA_SUCCESS, "cuCtxDestroy");
            CHECK(set_fn(ctx) == CUDA_SUCCESS, "primary current again");
            use_memory(5, 20, "primary after a created context");
        }
        CHECK(free_fn(stale) == CUDA_SUCCESS, "free in the primary context");
        CHECK(fake()->dead_calls == 0, "%lu calls on dead objects", fake()->dead_calls);
        return finish(what);
    } else {
        fprintf(stderr, "unknown scenario %s\n", what);
        return 2;
    }
    CHECK(fake()->ctx_destroyed == destroyed + 1, "the context died");
    CHECK(fake()->bytes_outstanding == 0, "%lu bytes survive", fake()->bytes_outstanding);
    /* without a reference the driver refuses, under the shim too */
    CUdeviceptr none;
    CHECK(alloc_fn(&none, 100) != CUDA_SUCCESS, "allocation in a dead context must fail as natively");
    CHECK(retain_fn(&ctx, 0) == CUDA_SUCCESS && set_fn(ctx) == CUDA_SUCCESS, "retain again");
    unsigned long dead_before = fake()->dead_calls;
    use_memory(20, 5, "after");
    CHECK(free_fn(stale) == CUDA_ERROR_INVALID_VALUE, "a stale free gets CUDA's answer");
    CHECK(fake()->dead_calls == dead_before, "%lu calls on dead objects by the shim", fake()->dead_calls - dead_before);
    CHECK(release_fn(0) == CUDA_SUCCESS, "release at the end");
    return finish(what);
}
