/* A fake libcudart.so.13 that reaches the driver the way the real runtime
 * does: dlopen("libcuda.so.1"), dlsym(h, "cuGetProcAddress_v2"), then every
 * driver function through cuGetProcAddress_v2. Its exports are versioned
 * libcudart.so.13 like the real ones (tests/shim/fake_cudart.map). Lazy
 * initialisation on the first call: cuInit, the primary context of the
 * current device retained (once per device, like the real runtime) and
 * made current. cudaDeviceReset resets the current device's primary
 * context through cuDevicePrimaryCtxReset, as the real one does (traced:
 * cuCtxGetCurrent, cuCtxGetApiVersion, cuDevicePrimaryCtxReset); the next
 * call retains it again.
 *
 * Process life, as the real runtime: its initialisation registers its
 * teardown with atexit(), so at exit it runs before the handlers
 * registered earlier (a shim that initialised first) and after those
 * registered later. From the teardown on, every entry point answers
 * cudaErrorCudartUnloading without reaching the driver, and the fake
 * driver counts any call it still gets. In a fork() child of a process that
 * initialised it, the runtime asks the driver (which refuses) and answers
 * cudaErrorInitializationError, without taking its own lock. */

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../../shim/cuda_abi.h"

#define EXPORT __attribute__((visibility("default")))

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static struct {
    CUresult (*init)(unsigned);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free_)(CUdeviceptr);
    CUresult (*alloc_managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*alloc_async_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*free_async_ptsz)(CUdeviceptr, CUstream);
    CUresult (*get_info)(size_t *, size_t *);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*get_current)(CUcontext *);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*ipc)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*ipc_open)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*ipc_close)(CUdeviceptr);
    CUresult (*reset)(CUdevice);
    CUresult (*set_flags)(CUdevice, unsigned);
    CUresult (*host_alloc)(void **, size_t, unsigned);
    CUresult (*free_host)(void *);
    CUresult (*host_get_flags)(unsigned *, void *);
    CUresult (*host_get_device_pointer)(CUdeviceptr *, void *, unsigned);
    CUresult (*host_register)(void *, size_t, unsigned);
    CUresult (*host_unregister)(void *);
} drv;
static atomic_int device_retained[8]; /* 1 while the runtime holds the device's primary context */
static pthread_mutex_t retain_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static __thread int current_device;
static int init_ok;
static atomic_int unloading; /* the teardown at exit ran */
static atomic_int forked;    /* a fork() child of an initialised process */
static void (*driver_torn_down)(void); /* the fake driver's fake_cuda_runtime_torn_down */

#define cudaErrorCudartUnloading 4

static void teardown_at_exit(void)
{
    atomic_store(&unloading, 1);
    if (driver_torn_down)
        driver_torn_down();
}

static void child_after_fork(void) { atomic_store(&forked, 1); }

static void *get(gpa_fn gpa, const char *name, int version, cuuint64_t flags)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = 1;
    if (gpa(name, &fn, version, flags, &st) != CUDA_SUCCESS || st != 0)
        return NULL;
    return fn;
}

static void load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa)
        return;
    drv.init = get(gpa, "cuInit", 2000, 0);
    drv.alloc = get(gpa, "cuMemAlloc", 3020, 0);
    drv.free_ = get(gpa, "cuMemFree", 3020, 0);
    drv.alloc_managed = get(gpa, "cuMemAllocManaged", 6000, 0);
    drv.alloc_async = get(gpa, "cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    drv.alloc_async_ptsz = get(gpa, "cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    drv.free_async = get(gpa, "cuMemFreeAsync", 11020, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    drv.free_async_ptsz = get(gpa, "cuMemFreeAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    drv.get_info = get(gpa, "cuMemGetInfo", 3020, 0);
    drv.retain = get(gpa, "cuDevicePrimaryCtxRetain", 7000, 0);
    drv.set_current = get(gpa, "cuCtxSetCurrent", 4000, 0);
    drv.get_current = get(gpa, "cuCtxGetCurrent", 4000, 0);
    drv.stream_create = get(gpa, "cuStreamCreate", 2000, 0);
    drv.stream_destroy = get(gpa, "cuStreamDestroy", 4000, 0);
    drv.ipc = get(gpa, "cuIpcGetMemHandle", 4010, 0);
    drv.ipc_open = get(gpa, "cuIpcOpenMemHandle", 11000, 0);
    drv.ipc_close = get(gpa, "cuIpcCloseMemHandle", 4010, 0);
    drv.reset = get(gpa, "cuDevicePrimaryCtxReset", 11000, 0);
    drv.set_flags = get(gpa, "cuDevicePrimaryCtxSetFlags", 11000, 0);
    drv.host_alloc = get(gpa, "cuMemHostAlloc", 3020, 0);
    drv.free_host = get(gpa, "cuMemFreeHost", 3020, 0);
    drv.host_get_flags = get(gpa, "cuMemHostGetFlags", 3020, 0);
    drv.host_get_device_pointer = get(gpa, "cuMemHostGetDevicePointer", 3020, 0);
    drv.host_register = get(gpa, "cuMemHostRegister", 6050, 0);
    drv.host_unregister = get(gpa, "cuMemHostUnregister", 4000, 0);
    init_ok = drv.init && drv.init(0) == CUDA_SUCCESS;
    driver_torn_down = (void (*)(void))dlsym(h, "fake_cuda_runtime_torn_down");
    atexit(teardown_at_exit);
    pthread_atfork(NULL, NULL, child_after_fork);
}

/* The primary context of device d, retained by the runtime once. */
static cudaError_t primary_of(int d, CUcontext *c)
{
    static CUcontext handle[8];
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&retain_lock);
    if (!atomic_load(&device_retained[d])) {
        r = drv.retain(&handle[d], d);
        if (r == CUDA_SUCCESS)
            atomic_store(&device_retained[d], 1);
    }
    *c = handle[d];
    pthread_mutex_unlock(&retain_lock);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

static cudaError_t lazy_init(void)
{
    if (atomic_load(&unloading))
        return cudaErrorCudartUnloading;
    pthread_once(&once, load);
    if (!init_ok)
        return 3;
    CUcontext c = NULL;
    if (atomic_load(&forked)) {
        drv.get_current(&c); /* the driver refuses in the child */
        return 3;
    }
    drv.get_current(&c);
    if (!c || !atomic_load(&device_retained[current_device])) {
        if (primary_of(current_device, &c) != cudaSuccess)
            return 3;
        drv.set_current(c);
    }
    return cudaSuccess;
}

static cudaError_t err(CUresult r)
{
    if (r == CUDA_ERROR_NOT_INITIALIZED)
        return 3; /* cudaErrorInitializationError */
    if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED || r == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
        return (cudaError_t)r; /* cudaErrorHostMemory*Registered: the same numbers */
    return r == CUDA_SUCCESS ? cudaSuccess : r == CUDA_ERROR_OUT_OF_MEMORY ? cudaErrorMemoryAllocation : cudaErrorInvalidValue;
}

EXPORT cudaError_t cudaSetDevice(int d)
{
    if (atomic_load(&unloading))
        return cudaErrorCudartUnloading;
    current_device = d;
    pthread_once(&once, load);
    CUcontext c;
    if (primary_of(d, &c) != cudaSuccess)
        return cudaErrorInvalidValue;
    drv.set_current(c);
    return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceReset(void)
{
    if (atomic_load(&unloading))
        return cudaErrorCudartUnloading;
    pthread_once(&once, load);
    if (!init_ok || !drv.reset)
        return 3;
    CUcontext c = NULL;
    drv.get_current(&c); /* (as the real one: the current context stays named) */
    CUresult r = drv.reset(current_device);
    atomic_store(&device_retained[current_device], 0);
    return err(r);
}
EXPORT cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
    pthread_once(&once, load);
    if (!init_ok || !drv.set_flags)
        return 3;
    return err(drv.set_flags(current_device, flags));
}
EXPORT cudaError_t cudaMalloc(void **p, size_t n)
{
    cudaError_t e = lazy_init();
    if (e)
        return e;
    if (!n) {
        *p = NULL;
        return cudaSuccess;
    }
    return err(drv.alloc((CUdeviceptr *)p, n));
}
/* managed memory: cuMemAllocManaged, freed by cudaFree (cuMemFree), as the real runtime */
EXPORT cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int flags)
{
    cudaError_t e = lazy_init();
    if (e)
        return e;
    return err(drv.alloc_managed((CUdeviceptr *)p, n, flags));
}
EXPORT cudaError_t cudaFree(void *p)
{
    cudaError_t e = lazy_init();
    if (e || !p)
        return e;
    return err(drv.free_((CUdeviceptr)(uintptr_t)p));
}
/* pinned host memory: through cuMemHostAlloc/cuMemFreeHost, as the real runtime */
EXPORT cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    cudaError_t e = lazy_init();
    if (e)
        return e;
    return err(drv.host_alloc(p, n, flags));
}
EXPORT cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }
EXPORT cudaError_t cudaHostGetFlags(unsigned int *flags, void *p)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.host_get_flags(flags, p));
}
EXPORT cudaError_t cudaHostGetDevicePointer(void **d, void *p, unsigned int flags)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.host_get_device_pointer((CUdeviceptr *)d, p, flags));
}
EXPORT cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.host_register(p, n, flags));
}
EXPORT cudaError_t cudaHostUnregister(void *p)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.host_unregister(p));
}
EXPORT cudaError_t cudaFreeHost(void *p)
{
    cudaError_t e = lazy_init();
    if (e || !p)
        return e;
    return err(drv.free_host(p));
}
EXPORT cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.alloc_async((CUdeviceptr *)p, n, s));
}
EXPORT cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.alloc_async_ptsz((CUdeviceptr *)p, n, s));
}
EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.free_async((CUdeviceptr)(uintptr_t)p, s));
}
EXPORT cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.free_async_ptsz((CUdeviceptr)(uintptr_t)p, s));
}
EXPORT cudaError_t cudaMemGetInfo(size_t *f, size_t *t)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.get_info(f, t));
}
EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.stream_create(s, flags));
}
EXPORT cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int prio)
{
    (void)prio;
    return cudaStreamCreateWithFlags(s, flags);
}
EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.stream_destroy(s));
}
EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.ipc((CUipcMemHandle *)h, (CUdeviceptr)(uintptr_t)p));
}
EXPORT cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags)
{
    cudaError_t e = lazy_init();
    CUipcMemHandle dh;
    memcpy(&dh, &h, sizeof dh);
    return e ? e : err(drv.ipc_open((CUdeviceptr *)p, dh, flags));
}
EXPORT cudaError_t cudaIpcCloseMemHandle(void *p)
{
    cudaError_t e = lazy_init();
    return e ? e : err(drv.ipc_close((CUdeviceptr)(uintptr_t)p));
}
EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *st)
{
    (void)s;
    *st = 0;
    return cudaSuccess;
}
