/* What the router's three files share: shim/router.c (init, routing),
 * shim/devices.c (device states, context lifecycle) and shim/oom.c (the
 * out-of-memory retry). No other file includes it. */
#ifndef PS_SHIM_ROUTER_INTERNAL_H
#define PS_SHIM_ROUTER_INTERNAL_H

#include <pthread.h>

#include "router.h"

/* ---- router.c ---- */
/* Device d's context died (devices.c, drop_device): forgets what the
 * routing keeps per context (the pool's access, the buffer ids). */
void ps_route_device_dropped(int d);

/* ---- oom.c ---- */
/* An allocation on device d found no memory after this process's own
 * give-back: asks the neighbours (10. of router.c); true when it is worth
 * making once more. */
bool ps_route_neighbours_gave(int d, uint64_t wanted, uint64_t epoch);

/* ---- devices.c ---- */
/* Guards building and dropping stacks (and what the drops keep). Lock
 * order: the devices lock, then the streams lock, then the registry's. */
extern pthread_mutex_t ps_devices_lock;
/* fork() handlers (registered by the router's init). */
void ps_devices_atfork_prepare(void);
void ps_devices_atfork_parent(void);
void ps_devices_atfork_child(void);

/* This thread's last answer of ps_current_device: one struct, so the hot
 * path's check reads one cache line of thread-local storage. */
typedef struct last_context {
    CUcontext ctx;             /* last context seen on this thread (NULL: none yet) */
    ps_device_state_t *device; /* its device state (NULL: pass through) */
    unsigned epoch;            /* ps_devices_epoch when ctx was looked up */
} last_context_t;
extern PS_TLS last_context_t ps_devices_last;
/* +1 whenever a context died (any device, any kind): every thread's cached
 * context -> device answer is then looked up again (handles are reused). */
extern atomic_uint ps_devices_epoch;
/* ps_devices_current when this thread's last answer does not hold. */
PS_COLD ps_device_state_t *ps_devices_look_up(int door, CUresult got, CUcontext ctx);

/* The hot path of ps_current_device: the one CUDA call that says which
 * context is current (it can change under us in ways we do not see:
 * cudaSetDevice inside the runtime, cuCtxSetCurrent, push/pop), then this
 * thread's last answer if it is still good: same context, and no context
 * died since (ps_devices_epoch; a reset keeps the handle). */
static inline ps_device_state_t *ps_devices_current(int door)
{
    CUcontext ctx = NULL;
    CUresult got = ps_real.cuCtxGetCurrent(&ctx);
    if (PS_LIKELY(got == CUDA_SUCCESS && ctx && ctx == ps_devices_last.ctx &&
                  atomic_load_explicit(&ps_devices_epoch, memory_order_acquire) == ps_devices_last.epoch))
        return ps_devices_last.device;
    return ps_devices_look_up(door, got, ctx);
}

#endif
