/* A resource stack over the simulated device (tools/sim/fake_gpu.h: unbacked
 * addresses, bounded by a capacity, fences that complete at once, or a
 * given lag after they were recorded on a clock the replay advances), used by
 * `replay --simulate` and by `plot` to learn what a stack would reserve.
 * Return rule: PS_OK or a negative PS_E* (core/common.h), with a message
 * printed on error.
 */
#ifndef PS_TOOLS_SIM_STACK_H
#define PS_TOOLS_SIM_STACK_H

#include "../config/config.h"
#include "../core/gpu_ops.h"
#include "../core/resource.h"

typedef struct sim_stack {
    ps_gpu_ops_t *gpu;         /* the simulated device */
    ps_config_t *config;       /* loaded config */
    ps_stack_t *stack;         /* stack built from the config */
    ps_resource_t *top;        /* where to allocate */
    char name[128];            /* "default" or the config file's base name */
} sim_stack_t;

/* Builds the stack of `config_path` (NULL = the embedded default config)
 * for `device` on a simulated device of `capacity` bytes whose GPU lags the
 * host by `gpu_lag_ns` (0: fences complete at once; else a fence completes
 * gpu_lag_ns after it was recorded, on the clock the replay advances with
 * ps_fake_gpu_set_clock(sim.gpu, ...)). */
int sim_stack_create(const char *config_path, int device, uint64_t capacity, uint64_t gpu_lag_ns,
                     sim_stack_t *out);
void sim_stack_destroy(sim_stack_t *sim);

/* Short display name of a config path ("configs/arena.ini" -> "arena"). */
void sim_stack_name(const char *config_path, char *out, size_t outsize);

#endif
