/* The device lifecycle (shim/lifecycle.c): a device's stack built on first
 * use or when its primary context is made live, dropped when the context
 * dies, left alone in a forked child; the process's exit. Called by the
 * router and the context hooks; it calls the modules below it, and what a
 * module above keeps per device it forgets through ps_lifecycle_on_drop. */
#ifndef PS_SHIM_LIFECYCLE_H
#define PS_SHIM_LIFECYCLE_H

#include "common.h"
#include "devices.h"
#include "real.h"

/* The flags of every pooled pinned block: slabs are cuMemHostAlloc'd with
 * them, and the host range's pieces are accessible from the host and every
 * device (device pointer = host pointer), which is what they promise. */
#define PS_HOST_POOL_FLAGS (PS_HOST_ALLOC_PORTABLE | PS_HOST_ALLOC_MAPPED)

/* The device state of the current context, building its stack on first
 * use; NULL when the call must pass through. */
ps_device_state_t *ps_current_device(int door);

/* Context lifecycle (the entry points are in hooks_context.c). Each calls
 * the real function (`real`, never NULL), returns its result, and drops
 * the stack of a device whose primary context died, without calling CUDA
 * on it. */
/* After a successful cuDevicePrimaryCtxRetain from outside the shim, the
 * shim initialised and active: builds the device's stack now if it has
 * none (the cost a fresh process's first allocation paid, moved to where
 * the context is made). */
void ps_context_retained(CUdevice device);
CUresult ps_context_reset(CUdevice device, ps_cuDevicePrimaryCtxReset_fn real, const char *api);
CUresult ps_context_release(CUdevice device, ps_cuDevicePrimaryCtxRelease_fn real, const char *api);
/* A context the program created (cuCtxCreate) or the primary one, destroyed. */
CUresult ps_context_destroy(CUcontext ctx, ps_cuCtxDestroy_fn real, const char *api);
/* New flags may make the primary context again (some drivers do). */
CUresult ps_context_set_flags(CUdevice device, unsigned int flags, ps_cuDevicePrimaryCtxSetFlags_fn real,
                              const char *api);
/* After a call that may have destroyed or recreated primary contexts
 * (cudaDeviceReset, cudaSetDeviceFlags, cuDevicePrimaryCtxSetFlags): drops
 * the stack of every device whose context is not the one it was built in. */
void ps_context_check(const char *api);

/* What the module above keeps per device and must forget when the
 * device's context dies (called from drop_device, devices lock held). */
void ps_lifecycle_on_drop(void (*forget)(int device));
/* fork() handlers (registered by the router's initialisation). */
void ps_lifecycle_atfork_prepare(void);
void ps_lifecycle_atfork_parent(void);
void ps_lifecycle_atfork_child(void);

/* This thread's last answer of ps_current_device: one struct, so the hot
 * path's check reads one cache line of thread-local storage. */
typedef struct last_context {
    CUcontext ctx;             /* last context seen on this thread (NULL: none yet) */
    ps_device_state_t *device; /* its device state (NULL: pass through) */
    unsigned epoch;            /* ps_lifecycle_epoch when ctx was looked up */
} last_context_t;
extern PS_TLS last_context_t ps_lifecycle_last; /* read by ps_devices_current only */
/* +1 whenever a context died (any device, any kind): every thread's cached
 * context -> device answer is then looked up again (handles are reused). */
extern atomic_uint ps_lifecycle_epoch; /* read by ps_devices_current only */
/* ps_devices_current when this thread's last answer does not hold. */
PS_COLD ps_device_state_t *ps_devices_look_up(int door, CUresult got, CUcontext ctx);

/* The hot path of ps_current_device: the one CUDA call that says which
 * context is current (it can change under us in ways we do not see:
 * cudaSetDevice inside the runtime, cuCtxSetCurrent, push/pop), then this
 * thread's last answer if it is still good: same context, and no context
 * died since (ps_lifecycle_epoch; a reset keeps the handle). */
static inline ps_device_state_t *ps_devices_current(int door)
{
    CUcontext ctx = NULL;
    CUresult got = ps_real.cuCtxGetCurrent(&ctx);
    if (PS_LIKELY(got == CUDA_SUCCESS && ctx && ctx == ps_lifecycle_last.ctx &&
                  atomic_load_explicit(&ps_lifecycle_epoch, memory_order_acquire) == ps_lifecycle_last.epoch))
        return ps_lifecycle_last.device;
    return ps_devices_look_up(door, got, ctx);
}

#endif
