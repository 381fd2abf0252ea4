/* Giving memory back now (shim/give.h): a device entered inside its
 * GPU-ops table's give-back gate (no stream capture open or beginning
 * meanwhile), then its pools' decay asked for what the GPU has provably
 * finished with. Used by the give-back thread's ticks, a neighbour's
 * request and the out-of-memory retry. */
#include <stdatomic.h>

#include "../core/resource.h"
#include "devices.h"
#include "give.h"
#include "gpu_ops_cuda.h"
#include "stats.h"

/* Entering a device to give memory back (give.h): the gate of its
 * GPU-ops table that keeps stream captures out meanwhile. */
int ps_give_back_enter_device(int d, ps_device_state_t **dev_out)
{
    if (d < 0 || d >= PS_MAX_DEVICES || atomic_load_explicit(&ps_device(d)->state, memory_order_acquire) != PS_DEVICE_READY)
        return PS_EUPSTREAM;
    ps_device_state_t *dev = ps_device(d);
    ps_gpu_ops_t *gpu = __atomic_load_n(&dev->gpu, __ATOMIC_ACQUIRE);
    if (!gpu || !__atomic_load_n(&dev->stack, __ATOMIC_ACQUIRE))
        return PS_EUPSTREAM;
    ps_in_shim++;
    int open = ps_gpu_ops_cuda_give_back_enter(gpu);
    if (open != PS_OK) {
        ps_in_shim--;
        return open;
    }
    *dev_out = dev;
    return PS_OK;
}

void ps_give_back_exit_device(void)
{
    ps_gpu_ops_cuda_give_back_leave();
    ps_in_shim--;
}

uint64_t ps_give_back_device(int d, uint64_t now, uint64_t decay_ns, uint64_t want, int *refused)
{
    if (refused)
        *refused = 0;
    if (ps_process_exiting())
        return 0;
    ps_device_state_t *dev;
    int open = ps_give_back_enter_device(d, &dev);
    if (open != PS_OK) {
        if (refused)
            *refused = open == PS_EBUSY;
        return 0;
    }
    ps_stack_t *stack = __atomic_load_n(&dev->stack, __ATOMIC_ACQUIRE);
    uint64_t given = ps_decay(stack->top, now, decay_ns, want);
    ps_resource_t *host = __atomic_load_n(&dev->host_pool, __ATOMIC_ACQUIRE);
    uint64_t host_given = host && !(want && given >= want) ? ps_decay(host, now, decay_ns, want ? want - given : 0) : 0;
    ps_give_back_exit_device();
    if (given)
        ps_stats_count_give(d, decay_ns ? PS_GIVE_DECAY : PS_GIVE_TO_NEIGHBOURS, given);
    if (host_given)
        ps_stats_count_give(d, PS_GIVE_DECAY_HOST, host_given);
    if (given || host_given) {
        char a[32], b[32];
        ps_debug("device %d: gave back %s of device memory and %s of pinned memory (%s)", d,
                 ps_format_bytes(a, sizeof a, given), ps_format_bytes(b, sizeof b, host_given),
                 decay_ns ? "decay" : "a neighbour asked");
    }
    return given;
}

