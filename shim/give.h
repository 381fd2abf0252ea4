/* Giving memory back now (shim/give.c): what the give-back thread's ticks,
 * a neighbour's request and the out-of-memory retry call. */
#ifndef PS_SHIM_GIVE_H
#define PS_SHIM_GIVE_H

#include <stdint.h>

#include "devices.h"

/* Enters device d to give memory back (give.c; the out-of-memory
 * retry of shim/oom.c and ps_give_back_device): its stack is ready, the
 * shim's own calls pass through (ps_in_shim) and its GPU-ops table's
 * give-back gate is held (refused while a stream capture is open in the
 * context: PS_EBUSY; no capture begins until the exit). PS_OK: *dev is the
 * device; the caller gives back, then calls ps_give_back_exit_device().
 * Any other answer holds nothing (PS_EUPSTREAM: no ready stack there). */
int ps_give_back_enter_device(int d, ps_device_state_t **dev);
void ps_give_back_exit_device(void);

/* Gives back free memory of device d's stacks (device and pinned host)
 * that the GPU has provably finished with: with decay_ns > 0 what the
 * program has not needed for that long (core/pool_decay.c), with 0 every
 * free byte proven idle now (a neighbour asks); want > 0: about that many
 * bytes at most (0: no bound). Never synchronizes the device, never waits
 * for a pool lock. *refused (may be NULL) = 1 when a
 * stream capture was open on the device (nothing given). Returns the bytes
 * of device memory given back. */
uint64_t ps_give_back_device(int d, uint64_t now_ns, uint64_t decay_ns, uint64_t want, int *refused);

#endif
