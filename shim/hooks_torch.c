/* The torch door: the functions PyTorch's CUDAPluggableAllocator calls by
 * name when python/poolshim/torch.py installs this library as PyTorch's
 * allocator (loaded by PyTorch; LD_PRELOAD not needed).
 *
 * 1. poolshim_torch_alloc(size, device, stream): `device` is current and
 *    `stream` is PyTorch's current stream on it. A stream-ordered
 *    allocation on `stream` through the driver door (counted as
 *    cuMemAllocAsync): the device's stack serves it, and later work on that
 *    stream may use the block at once. NULL when it fails (PyTorch then
 *    raises its out-of-memory error) and for size 0 (an empty tensor).
 * 2. poolshim_torch_free(ptr, size, device, stream): `stream` is the one the
 *    tensor was allocated on. A stream-ordered free on it (counted as
 *    cuMemFreeAsync): work issued later on that stream reuses the block with
 *    no barrier; another stream or a cudaMalloc gets it under the pool's
 *    rule for stream lists (a fence recorded on the stream after the free).
 *    Before the free, every other stream the tensor was recorded on (3.) is
 *    joined into `stream`: an event recorded on it, and `stream` made to
 *    wait for that event. So the block's next user on any stream runs after
 *    all the work those streams had at the free, as PyTorch's own allocator
 *    promises for Tensor.record_stream.
 * 3. poolshim_torch_record_stream(ptr, stream): Tensor.record_stream. When
 *    `stream` is not the block's allocation stream, the pair is kept in a
 *    small set (one lock); a free looks there only while it is not empty.
 *    If a pair finds no memory, every later free synchronizes the context
 *    first (always safe).
 * PyTorch allocates from threads of its own (autograd's, for one) on which
 * the runtime never made a context current: PyTorch asks cudaGetDevice
 * (0 on a fresh thread) and calls cudaSetDevice only to change it. The
 * door then makes `device`'s primary context current, as the runtime does
 * at its next call on that thread, when the runtime holds that context
 * (active); never one of its own.
 * While the shim passes calls through (off, exiting, a capturing stream),
 * 1 and 2 call the real cuMemAllocAsync / cuMemFreeAsync, as the hooks do.
 * Guarantee: a tensor's memory is handed out again only after the work
 * PyTorch ordered before its free, on every stream PyTorch named.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/types.h>

#include "real.h"
#include "router.h"
#include "test_switches.h"

/* ---- tensors recorded on other streams ----------------------------------- */
/* An open-addressing set of (pointer, stream) pairs hashed by pointer, so
 * the pairs of one pointer share its probe chain; ptr 0 is an empty slot,
 * ptr 1 a removed one. */
typedef struct mark {
    uintptr_t ptr;
    CUstream stream;
} mark_t;

#define MARK_REMOVED ((uintptr_t)1)

static pthread_mutex_t marks_lock = PTHREAD_MUTEX_INITIALIZER;
static mark_t *marks;          /* the slots */
static size_t marks_capacity;  /* slots, a power of two (0: none yet) */
static size_t marks_used;      /* slots holding a pair or a removed mark */
static _Atomic size_t marked;  /* pairs in the set (read without the lock) */
static atomic_bool marks_lost; /* a pair found no memory: every free synchronizes first */
static CUevent join_events[PS_MAX_DEVICES]; /* per device: recorded on a marked stream, waited for by the block's */

static size_t mark_slot(uintptr_t ptr, size_t capacity)
{
    return (size_t)((ptr >> 8) * 0x9E3779B97F4A7C15ull) & (capacity - 1);
}

/* Rebuilds the set at `capacity` slots, dropping removed marks; false when
 * memory runs out (the set is unchanged). marks_lock held. */
static bool marks_rebuild_locked(size_t capacity)
{
    mark_t *bigger = calloc(capacity, sizeof *bigger);
    if (!bigger)
        return false;
    for (size_t i = 0; i < marks_capacity; i++) {
        if (marks[i].ptr > MARK_REMOVED) {
            size_t s = mark_slot(marks[i].ptr, capacity);
            while (bigger[s].ptr)
                s = (s + 1) & (capacity - 1);
            bigger[s] = marks[i];
        }
    }
    free(marks);
    marks = bigger;
    marks_capacity = capacity;
    marks_used = atomic_load(&marked);
    return true;
}

/* Adds (ptr, stream) unless present; false when the set cannot grow. */
static bool mark_add(uintptr_t ptr, CUstream stream)
{
    bool ok = true;
    pthread_mutex_lock(&marks_lock);
    if ((marks_used + 1) * 2 > marks_capacity) {
        size_t capacity = marks_capacity ? marks_capacity : 64;
        while ((atomic_load(&marked) + 1) * 4 > capacity)
            capacity *= 2;
        ok = marks_rebuild_locked(capacity);
    }
    if (ok) {
        size_t s = mark_slot(ptr, marks_capacity), reuse = SIZE_MAX;
        bool present = false;
        for (; marks[s].ptr; s = (s + 1) & (marks_capacity - 1)) {
            if (marks[s].ptr == ptr && marks[s].stream == stream) {
                present = true;
                break;
            }
            if (marks[s].ptr == MARK_REMOVED && reuse == SIZE_MAX)
                reuse = s;
        }
        if (!present) {
            if (reuse != SIZE_MAX)
                s = reuse;
            else
                marks_used++;
            marks[s] = (mark_t){ptr, stream};
            atomic_fetch_add(&marked, 1);
        }
    }
    pthread_mutex_unlock(&marks_lock);
    return ok;
}

/* Removes the pairs of `ptr`, joining each marked stream into `stream`
 * (record an event of `device`, then wait) on the way; where that fails (an
 * event of another context), the marked stream is synchronized instead. */
static void marks_join(uintptr_t ptr, CUstream stream, int device)
{
    CUevent *event = device >= 0 && device < PS_MAX_DEVICES ? &join_events[device] : NULL;
    pthread_mutex_lock(&marks_lock);
    if (marks_capacity) {
        for (size_t s = mark_slot(ptr, marks_capacity); marks[s].ptr; s = (s + 1) & (marks_capacity - 1)) {
            if (marks[s].ptr != ptr)
                continue;
            bool joined = event && (*event || ps_real.cuEventCreate(event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) &&
                          ps_real.cuEventRecord(*event, marks[s].stream) == CUDA_SUCCESS &&
                          ps_real.cuStreamWaitEvent(stream, *event, 0) == CUDA_SUCCESS;
            if (!joined && ps_real.cuStreamSynchronize)
                (void)ps_real.cuStreamSynchronize(marks[s].stream); /* its work so far is done */
            marks[s].ptr = MARK_REMOVED;
            atomic_fetch_sub(&marked, 1);
        }
    }
    pthread_mutex_unlock(&marks_lock);
}

/* ---- the three functions ------------------------------------------------ */
/* Makes device's primary context current on a thread that has none, when
 * the runtime keeps it active (a retain and a release around the switch:
 * the runtime's own reference keeps it alive). */
static void ensure_context(int device)
{
    CUcontext ctx = NULL;
    if (!ps_real.cuCtxGetCurrent && ps_real_load_driver() != PS_OK)
        return;
    if (!ps_real.cuCtxGetCurrent || (ps_real.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx))
        return;
    unsigned flags = 0;
    int active = 0;
    ps_cuDevicePrimaryCtxRelease_fn release =
        ps_real.cuDevicePrimaryCtxRelease_v2 ? ps_real.cuDevicePrimaryCtxRelease_v2 : ps_real.cuDevicePrimaryCtxRelease;
    if (!ps_real.cuDevicePrimaryCtxGetState || !ps_real.cuDevicePrimaryCtxRetain || !ps_real.cuCtxSetCurrent ||
        !release || ps_real.cuDevicePrimaryCtxGetState(device, &flags, &active) != CUDA_SUCCESS || !active)
        return;
    if (ps_real.cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS)
        return;
    (void)ps_real.cuCtxSetCurrent(ctx);
    (void)release(device);
}

PS_EXPORT void *poolshim_torch_alloc(ssize_t size, int device, CUstream stream)
{
    if (size <= 0)
        return NULL;
    ensure_context(device);
    void *ptr = NULL;
    int status;
    if (ps_route_allocate_async(PS_CALL_CU_MEM_ALLOC_ASYNC, PS_DOOR_DRIVER, (size_t)size, stream, false, &ptr,
                                &status) == PS_ROUTE_DONE)
        return status == PS_OK ? ptr : NULL;
    if (!ps_real.cuMemAllocAsync && ps_real_load_driver() != PS_OK)
        return NULL;
    CUdeviceptr p = 0;
    if (!ps_real.cuMemAllocAsync || ps_real.cuMemAllocAsync(&p, (size_t)size, stream) != CUDA_SUCCESS)
        return NULL;
    return (void *)(uintptr_t)p;
}

PS_EXPORT void poolshim_torch_free(void *ptr, ssize_t size, int device, CUstream stream)
{
    (void)size;
    if (!ptr)
        return;
    if (PS_UNLIKELY(atomic_load_explicit(&marked, memory_order_relaxed)))
        marks_join((uintptr_t)ptr, stream, device);
    if (PS_UNLIKELY(atomic_load_explicit(&marks_lost, memory_order_relaxed)) && ps_real.cuCtxSynchronize)
        (void)ps_real.cuCtxSynchronize();
    int status;
    if (ps_route_free_async(PS_CALL_CU_MEM_FREE_ASYNC, PS_DOOR_DRIVER, ptr, stream, false, &status) ==
        PS_ROUTE_DONE)
        return;
    if (!ps_real.cuMemFreeAsync && ps_real_load_driver() != PS_OK)
        return;
    if (ps_real.cuMemFreeAsync)
        (void)ps_real.cuMemFreeAsync((CUdeviceptr)(uintptr_t)ptr, stream);
}

PS_EXPORT void poolshim_torch_record_stream(void *ptr, CUstream stream)
{
    ps_allocation_t a;
    if (!ptr || !ps_route_pooled_block((uintptr_t)ptr, &a) || a.ptr != (uintptr_t)ptr)
        return; /* not a pooled block: CUDA's own free orders it */
    if (a.stream == ps_stream_key(stream, false))
        return;
    if (PS_UNLIKELY(ps_test.torch_no_join)) { /* the negative control of tests/gpu/torch_door.py */
        static atomic_bool warned;
        if (!atomic_exchange(&warned, true))
            ps_warning("test switch: record_stream is ignored; memory another stream still uses may be reused");
        return;
    }
    if (!mark_add((uintptr_t)ptr, stream))
        atomic_store(&marks_lost, true);
}
