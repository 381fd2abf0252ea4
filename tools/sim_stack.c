/* Stacks over the simulated device (see sim_stack.h).
 *
 * Algorithm:
 *   1. Create a host-ops table: unbacked (no memory is touched, so an
 *      80 GiB device costs nothing), capacity bytes, fences auto-complete
 *      (the simulated GPU has always finished its work: replay measures
 *      the allocator, not kernel overlap), or, with a GPU lag, complete
 *      that long after they were recorded, in the log's time (the replay
 *      moves the device's clock to each event's timestamp).
 *   2. Load the config (the file, or the embedded default; the process
 *      environment is ignored so replays are reproducible) and build the
 *      stack for the device.
 */
#include "sim_stack.h"

#include <stdio.h>
#include <string.h>

#include "sim/fake_gpu.h"

void sim_stack_name(const char *config_path, char *out, size_t outsize)
{
    if (!config_path) {
        snprintf(out, outsize, "default");
        return;
    }
    const char *base = strrchr(config_path, '/');
    base = base ? base + 1 : config_path;
    size_t n = strlen(base);
    if (n > 4 && !strcmp(base + n - 4, ".ini"))
        n -= 4;
    snprintf(out, outsize, "%.*s", (int)n, base);
}

void sim_stack_destroy(sim_stack_t *sim)
{
    if (!sim)
        return;
    if (sim->stack)
        ps_stack_destroy(sim->stack);
    if (sim->config)
        ps_config_free(sim->config);
    if (sim->gpu)
        ps_fake_gpu_destroy(sim->gpu);
    memset(sim, 0, sizeof *sim);
}

int sim_stack_create(const char *config_path, int device, uint64_t capacity, uint64_t gpu_lag_ns,
                     sim_stack_t *out)
{
    sim_stack_t sim;
    memset(&sim, 0, sizeof sim);
    sim_stack_name(config_path, sim.name, sizeof sim.name);
    ps_fake_gpu_options_t host = {.capacity = (size_t)capacity, .backed = 0,
                                  .upstream_alignment = 2 * PS_MiB, .auto_complete = 1,
                                  .virtual_memory = 1, .vm_granularity = 2 * PS_MiB,
                                  .lag_ns = gpu_lag_ns};
    int rc = ps_fake_gpu_create(&host, &sim.gpu);
    if (rc != PS_OK) {
        fprintf(stderr, "poolshim: error: cannot create the simulated device: %s\n", ps_status_name(rc));
        return rc;
    }
    ps_config_input_t input = {.file = config_path, .options = "", .environ = NULL, .no_env = 1};
    rc = ps_config_load(&input, &sim.config);
    if (rc != PS_OK) {
        fprintf(stderr, "poolshim: error: %s: invalid configuration\n", config_path ? config_path : "(default)");
        if (sim.config)
            ps_config_print_errors(sim.config, stderr);
        sim_stack_destroy(&sim);
        return rc;
    }
    rc = ps_config_build_stack(sim.config, device, sim.gpu, &sim.stack);
    if (rc != PS_OK) {
        fprintf(stderr, "poolshim: error: %s: cannot build the stack of device %d: %s\n",
                config_path ? config_path : "(default)", device, ps_status_name(rc));
        sim_stack_destroy(&sim);
        return rc;
    }
    sim.top = sim.stack->top;
    *out = sim;
    return PS_OK;
}
