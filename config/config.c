/* STUB (temporary, replaced by the configuration work): just enough of
 * config/config.h for the shim to run — a pool over `cuda` per device,
 * a few short-form environment variables. */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/adaptors.h"
#include "../core/upstream.h"

struct ps_config {
    ps_global_config_t global;
    int errors;
};

int ps_config_load(const ps_config_input_t *in, ps_config_t **out)
{
    ps_config_t *c = calloc(1, sizeof *c);
    if (!c)
        return PS_ENOMEM;
    c->global.verbosity = 1;
    const char *v;
    if ((v = getenv("POOLSHIM_STATS")))
        c->global.stats = !strcmp(v, "json") ? PS_STATS_JSON : strcmp(v, "0") ? PS_STATS_TEXT : PS_STATS_OFF;
    if ((v = getenv("POOLSHIM_STATS_FILE")))
        strncpy(c->global.stats_file, v, sizeof c->global.stats_file - 1);
    if ((v = getenv("POOLSHIM_FREE_SYNC")))
        c->global.free_sync = !strcmp(v, "device") ? PS_FREE_SYNC_DEVICE : !strcmp(v, "none") ? PS_FREE_SYNC_NONE : PS_FREE_SYNC_EVENT;
    if ((v = getenv("POOLSHIM_ON_ERROR")) && !strcmp(v, "passthrough"))
        c->global.on_error = PS_ON_ERROR_PASSTHROUGH;
    if ((v = getenv("POOLSHIM_VERBOSE")))
        c->global.verbosity = atoi(v);
    if ((v = getenv("POOLSHIM_OPTIONS")) && strstr(v, "free_sync=") &&
        !strstr(v, "=event") && !strstr(v, "=device") && !strstr(v, "=none"))
        c->errors++;
    *out = c;
    return c->errors ? PS_ECONFIG : PS_OK;
}
void ps_config_free(ps_config_t *cfg) { free(cfg); }
const ps_global_config_t *ps_config_global(const ps_config_t *cfg) { return &cfg->global; }
size_t ps_config_error_count(const ps_config_t *cfg) { return (size_t)cfg->errors; }
void ps_config_print_errors(const ps_config_t *cfg, FILE *f)
{
    if (cfg->errors)
        fprintf(f, "poolshim: error: POOLSHIM_OPTIONS: bad value for global.free_sync\n");
}
void ps_config_print(const ps_config_t *cfg, FILE *f, int device) { (void)cfg, (void)f, (void)device; }

int ps_config_build_stack(const ps_config_t *cfg, int device, const ps_gpu_ops_t *gpu, ps_stack_t **out)
{
    ps_stack_t *s = calloc(1, sizeof *s);
    s->all = calloc(2, sizeof *s->all);
    ps_resource_t *up = NULL, *pool = NULL;
    int rc = ps_cuda_resource_create("cuda", gpu, &up);
    if (rc != PS_OK)
        return rc;
    ps_pool_options_t o;
    ps_pool_options_default(&o);
    o.free_sync = cfg->global.free_sync;
    rc = ps_pool_create("main", up, gpu, &o, &pool);
    if (rc != PS_OK)
        return rc;
    s->all[0] = up, s->all[1] = pool, s->count = 2, s->top = pool;
    *out = s;
    return PS_OK;
}
void ps_stack_destroy(ps_stack_t *stack) { (void)stack; }
int ps_expand_path(const char *pattern, int device, char *out, size_t outsize)
{
    (void)device;
    snprintf(out, outsize, "%s", pattern);
    return PS_OK;
}
