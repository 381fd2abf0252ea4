/* The out-of-memory retry and the neighbours' give-back (router.c, 9.
 * and 10.): an allocation that CUDA or the pool could not serve is tried
 * once more after this process's pool, or its neighbours, gave memory back.
 * oom_give_backs counts the give-backs that returned memory, so that a call
 * that failed just before another thread's give-back ended is retried too. */
#include "../core/resource.h"
#include "give.h"
#include "neighbours.h"
#include "router_internal.h"
#include "stats.h"

/* ---- the out-of-memory retry (9. of router.c) ----------------------------------------------- */
/* Give-backs that returned memory, every device: a call that failed before
 * one of them ended is retried even when its own give-back finds nothing
 * left (the other thread's memory went back just after its failure). */
static atomic_ullong oom_give_backs;

uint64_t ps_route_oom_epoch(void) { return atomic_load_explicit(&oom_give_backs, memory_order_acquire); }

/* An allocation on device d found no memory after this process's own
 * give-back: asks the neighbour processes (neighbours.c; with
 * global.neighbour_release on, never inside the shim, holding no lock).
 * True when the allocation is worth making once more: they gave memory
 * back, or a give-back of this process ended since `epoch` (another
 * thread's: its neighbours' memory came just after this one's failure). */
bool ps_route_neighbours_gave(int d, uint64_t wanted, uint64_t epoch)
{
    if (!ps_global_config()->neighbour_release || ps_in_shim || !ps_process_active())
        return false;
    uint64_t given = ps_neighbours_ask(d, wanted);
    if (given)
        atomic_fetch_add_explicit(&oom_give_backs, 1, memory_order_acq_rel);
    return given || ps_route_oom_epoch() != epoch;
}

/* The pool's own trim on device d (nothing when no stack was built there,
 * or while a stream capture is open): the bytes it gave back. */
static uint64_t trim_for_oom(int d, const char *api)
{
    ps_device_state_t *dev;
    int open = ps_give_back_enter_device(d, &dev);
    if (open != PS_OK) {
        if (open == PS_EBUSY) {
            ps_stats_count_oom(d, PS_OOM_SKIPPED_CAPTURE, 1);
            ps_info("device %d: %s ran out of memory while a stream capture is open: the pool's free memory "
                    "stays (a device synchronize would invalidate the capture)", d, api);
        }
        return 0;
    }
    ps_stack_t *stack = __atomic_load_n(&dev->stack, __ATOMIC_ACQUIRE);
    ps_resource_info_t before = {0}, after = {0};
    ps_query(stack->top, &before);
    ps_trim(stack->top);
    ps_query(stack->top, &after);
    ps_give_back_exit_device();
    uint64_t given = before.bytes_reserved > after.bytes_reserved ? before.bytes_reserved - after.bytes_reserved : 0;
    if (given) {
        ps_stats_count_oom(d, PS_OOM_GIVEN_BACK, given);
        atomic_fetch_add_explicit(&oom_give_backs, 1, memory_order_acq_rel);
    }
    return given;
}

bool ps_route_oom_give_back(int *device, uint64_t epoch, const char *api, bool *asked)
{
    *asked = false;
    if (ps_in_shim || !ps_shim_ensure_init() || !ps_global_config()->oom_retry || *device < -1)
        return false; /* (a program that only ever called cuMemCreate meets the shim here first) */
    CUdevice current = -1;
    if (*device == -1 && (ps_real.cuCtxGetDevice(&current) != CUDA_SUCCESS || current < 0))
        return false; /* no context: nothing of ours can be in the way */
    int d = *device == -1 ? current : *device;
    *device = d;
    if (d >= PS_MAX_DEVICES)
        return false;
    uint64_t given = trim_for_oom(d, api);
    bool retry = given || ps_route_oom_epoch() != epoch;
    char b[32];
    const char *next = retry                          ? ", retrying it once"
                       : ps_global_config()->neighbour_release ? ", asking the neighbours"
                                                      : ", nothing to retry with";
    if (atomic_load_explicit(&ps_device(d)->state, memory_order_acquire) == PS_DEVICE_READY)
        ps_info("device %d: %s ran out of memory: the pool gave back %s%s", d, api,
                ps_format_bytes(b, sizeof b, given), next);
    if (!retry) {
        *asked = true;
        retry = ps_route_neighbours_gave(d, 0, epoch); /* (it says what they gave) */
    }
    return retry;
}

bool ps_route_oom_ask_neighbours(int device, uint64_t epoch)
{
    if (device < 0 || device >= PS_MAX_DEVICES)
        return false;
    return ps_route_neighbours_gave(device, 0, epoch);
}

void ps_route_oom_retried(int device, const char *api, bool succeeded)
{
    ps_stats_count_oom(device, succeeded ? PS_OOM_SUCCEEDED : PS_OOM_FAILED, 1);
    if (!succeeded)
        ps_info("device %d: %s ran out of memory again after the give-back", device, api);
}
