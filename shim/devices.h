/* The device table (shim/devices.c keeps it): one state per device, its
 * stack, GPU-ops table and pinned pool, and what its dropped stacks took,
 * and the devices lock. Written by the device lifecycle (lifecycle.c);
 * read as data by the router, the exit report (stats.c), the live page,
 * the give-back thread, the neighbours and the copy ordering. It calls
 * nothing of the shim. */
#ifndef PS_SHIM_DEVICES_H
#define PS_SHIM_DEVICES_H

#include "common.h"

/* A device's state: its stack, built on first use, dropped when its
 * context dies (reset, last release, destroy) and built again on the next
 * allocation. A dropped stack is never freed (another thread may still
 * hold it); its GPU-ops table is dead, so it makes no CUDA call. */
enum { PS_DEVICE_UNBUILT = 0, PS_DEVICE_READY, PS_DEVICE_FAILED };
typedef struct ps_device_state {
    atomic_int state;       /* PS_DEVICE_UNBUILT / READY / FAILED (then calls pass through) */
    int device;             /* ordinal */
    CUcontext ctx;          /* its primary context, the only one we serve */
    ps_gpu_ops_t *gpu;      /* the GPU-ops table over that context (atomic loads: a reset replaces it) */
    ps_stack_t *stack;      /* the resource stack from the config (atomic loads: a reset replaces it) */
    ps_resource_t *host_pool; /* the top of the pinned host stack ([host]: the pool and its adaptors), or
                                 NULL (atomic loads: a reset replaces it; pinned memory dies with the context) */
    ps_stack_t *host_stack;   /* that stack (its log, track and stats adaptors), or NULL */
    atomic_uint generation; /* +1 at each drop; allocations carry it, a stale one is not ours any more */
    int holds_ref;          /* 1 while we hold a reference on the primary context (devices lock) */
    int has_ctx_id;         /* 1 when ctx_id is known (cuCtxGetId, CUDA 12+) */
    unsigned long long ctx_id; /* the context's unique id when the stack was built */
    /* what the drops took with them (devices lock; read by the exit report) */
    unsigned resets;                /* contexts that died under a stack */
    uint64_t dropped_allocations;   /* live allocations they took */
    uint64_t dropped_bytes;         /* bytes requested by those */
    ps_resource_info_t dropped;     /* the dropped stacks' own figures, summed (peak: max) */
    ps_resource_info_t dropped_host; /* the same for the dropped host pools */
} ps_device_state_t;

/* Device d's state, 0 <= d < PS_MAX_DEVICES (inline: the free path asks). */
extern ps_device_state_t ps_devices_table[PS_MAX_DEVICES]; /* read through ps_device() only */
static inline ps_device_state_t *ps_device(int d) { return &ps_devices_table[d]; }

/* The devices lock: guards building and dropping stacks and what the drops
 * keep. Lock order: the devices lock, then the streams lock, then the
 * registry's. ps_devices_lock_reinit: in a forked child. */
void ps_devices_lock(void);
void ps_devices_unlock(void);
bool ps_devices_trylock(void);
void ps_devices_lock_reinit(void);
/* Hold the devices lock around a report written while the program runs (a
 * context reset changes what the report reads). Not at exit. */
void ps_devices_report_begin(void);
void ps_devices_report_end(void);

#endif
