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
 *   3. Without a config loader in this build (config/config.c not yet
 *      merged) the default stack is a pool with default options over the
 *      `cuda` upstream; an explicit --config is then an error.
 * The core entry points are reached through weak references so the CLI
 * links while those modules are stubs (mk/tools.mk pulls them in with -u
 * once they exist).
 */
#include "sim_stack.h"

#include <stdio.h>
#include <string.h>

#include "../core/host_ops.h"
#include "../core/pool.h"
#include "../core/upstream.h"

#pragma weak ps_host_ops_create
#pragma weak ps_host_ops_destroy
#pragma weak ps_config_load
#pragma weak ps_config_free
#pragma weak ps_config_print_errors
#pragma weak ps_config_build_stack
#pragma weak ps_stack_destroy

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
    if (sim->stack && ps_stack_destroy)
        ps_stack_destroy(sim->stack);
    ps_destroy(sim->pool);
    ps_destroy(sim->upstream);
    if (sim->config && ps_config_free)
        ps_config_free(sim->config);
    if (sim->gpu && ps_host_ops_destroy)
        ps_host_ops_destroy(sim->gpu);
    memset(sim, 0, sizeof *sim);
}

int sim_stack_create(const char *config_path, int device, uint64_t capacity, uint64_t gpu_lag_ns,
                     sim_stack_t *out)
{
    sim_stack_t sim;
    memset(&sim, 0, sizeof sim);
    sim_stack_name(config_path, sim.name, sizeof sim.name);
    if (!ps_host_ops_create) {
        fprintf(stderr, "poolshim: error: this build has no simulated device (core/host_ops.c)\n");
        return PS_EUNSUPPORTED;
    }
    ps_host_ops_options_t host = {.capacity = (size_t)capacity, .backed = 0,
                                  .upstream_alignment = 2 * PS_MiB, .auto_complete = 1,
                                  .virtual_memory = 1, .vm_granularity = 2 * PS_MiB,
                                  .lag_ns = gpu_lag_ns};
    int rc = ps_host_ops_create(&host, &sim.gpu);
    if (rc != PS_OK) {
        fprintf(stderr, "poolshim: error: cannot create the simulated device: %s\n", ps_status_name(rc));
        return rc;
    }
    if (ps_config_load && ps_config_build_stack) {
        ps_config_input_t input = {.file = config_path, .options = "", .environ = NULL, .no_env = 1};
        rc = ps_config_load(&input, &sim.config);
        if (rc != PS_OK) {
            fprintf(stderr, "poolshim: error: %s: invalid configuration\n",
                    config_path ? config_path : "(default)");
            if (sim.config && ps_config_print_errors)
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
    if (config_path) {
        fprintf(stderr, "poolshim: error: %s: this build has no config loader (config/config.c)\n",
                config_path);
        sim_stack_destroy(&sim);
        return PS_EUNSUPPORTED;
    }
    ps_pool_options_t options;
    ps_pool_options_default(&options);
    rc = ps_cuda_resource_create("cuda", sim.gpu, &sim.upstream);
    if (rc == PS_OK)
        rc = ps_pool_create("main", sim.upstream, sim.gpu, &options, &sim.pool);
    if (rc != PS_OK) {
        fprintf(stderr, "poolshim: error: cannot build the default pool: %s\n", ps_status_name(rc));
        sim_stack_destroy(&sim);
        return rc;
    }
    sim.top = sim.pool;
    *out = sim;
    return PS_OK;
}
