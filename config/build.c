/* ps_config_build_stack: turns the validated definitions into resources
 * for one device.
 *
 * Steps:
 *   1. refuse a config that has errors (PS_ECONFIG);
 *   2. pick the root: the resource of [device.N], else of [device.*];
 *   3. if any resource reachable from the root sizes itself in percent,
 *      ask gpu->mem_get_info for the device's TOTAL memory once, resolve
 *      the percentages, and check limits against initial sizes again;
 *   4. create resources depth-first, upstream before its users (a binning's
 *      bins and fallback before the binning); a resource used by several
 *      parents is created once per device; implicit bins (bins = SIZE)
 *      become fixed_size resources over the binning's upstream;
 *   5. put the global adaptors on top: stats when global.stats != off,
 *      then log when global.log_file is set;
 *   6. on any failure destroy what was created, in reverse order, print one
 *      error naming the resource, and return the constructor's status
 *      (PS_ENOMEM, PS_EUNSUPPORTED) or PS_ECONFIG.
 * Guarantees: nothing leaks on failure; every created resource appears once
 * in stack->all, upstream first; the stack owns the names it gave them.
 *
 * Options of a pool, arena or fixed_size (ps_config_pool_options...): the
 * core's defaults, then every key whose row in config/keys.def lands in
 * them, its value or else the row's default (test_config_keys.c checks the
 * two defaults agree); unset free_sync is global.free_sync.
 *
 * The pinned host stack of a device (ps_config_build_host_stack), from
 * [host] alone:
 *   1. the upstream `pinned` (cuMemHostAlloc slabs) and the pool `host` over
 *      it; with host.expandable (default: auto) the pool works on one host
 *      range instead, through a GPU-ops table whose vm_* entries map
 *      host-located cuMemCreate pieces (core/host_vm.h), where the device's
 *      table offers them and, when host.expandable is unset, debug.nvtx is
 *      off; else slabs (a warning only when host.expandable = 1 asked);
 *   2. the adaptors [host] asks for, bottom to top: host.limit, host.track,
 *      host.stats (when global.stats != off), host.log (without %d, devices
 *      after 0 get ".N" appended, as global.log_file);
 *   3. on failure, as step 6 above.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "../core/host_vm.h"

const ps_config_constructors_t ps_core_constructors = {
    .pool = ps_pool_create,
    .arena = ps_arena_create,
    .fixed_size = ps_fixed_size_create,
    .binning = ps_binning_create,
    .cuda = ps_cuda_resource_create,
    .async = ps_async_resource_create,
    .managed = ps_managed_resource_create,
    .limit = ps_limit_create,
    .stats = ps_stats_create,
    .track = ps_track_create,
    .log = ps_log_create,
    .guard = ps_guard_create,
};

/* The stack with what only the builder needs to know. */
typedef struct stack_private {
    ps_stack_t stack;              /* the public part (first member) */
    ps_resource_type_t *types;     /* type of all[i] */
    char **names;                  /* names given to the resources (freed after them) */
    size_t name_count;             /* entries in names */
    size_t capacity;               /* room in all/types/names */
    ps_gpu_ops_t *host_vm;         /* host.expandable: the host range's table (core/host_vm.h), or NULL */
} stack_private_t;

/* State of one build. */
typedef struct builder {
    const ps_config_t *cfg;                 /* the definitions */
    int device;                             /* device being built */
    const ps_gpu_ops_t *gpu;                /* its GPU ops */
    const ps_config_constructors_t *ctors;  /* what creates resources */
    uint64_t total_bytes;                   /* device memory, when percentages need it */
    ps_resource_t **created;                /* per def: the resource built for it, or NULL */
    stack_private_t *sp;                    /* what is being built */
    int status;                             /* first failure */
} builder_t;

/* Every key that lands in the options of `type` (config/keys.def: the
 * `lands` of its row): its value, else its default, into its field. */
static void apply_keys(const ps_resource_def_t *def, ps_resource_type_t type, uint64_t total_bytes, void *opts)
{
    for (int k = 0; k < PS_KEY_COUNT; k++) {
        const ps_field_t *field = ps_key_field(k, type);
        if (field)
            ps_field_store(opts, field,
                           def->values[k].set ? ps_value_bytes(&def->values[k], total_bytes)
                                              : ps_key_info[k].default_value);
    }
}

void ps_config_pool_options(const ps_config_t *cfg, const ps_resource_def_t *def,
                            uint64_t total_bytes, ps_pool_options_t *opts)
{
    memset(opts, 0, sizeof *opts);
    ps_pool_options_default(opts); /* the fields no key sets */
    apply_keys(def, PS_TYPE_POOL, total_bytes, opts);
    if (!def->values[PS_KEY_EXPANDABLE].set && cfg->global.debug.nvtx)
        opts->expandable = 0; /* compute-sanitizer refuses NVTX heaps over cuMemMap'd pieces
                                 ("nvtxMemHeapRegister failed: parameters invalid", CUDA 13.0) */
    if (!def->values[PS_KEY_FREE_SYNC].set)
        opts->free_sync = cfg->global.free_sync;
}

void ps_config_arena_options(const ps_config_t *cfg, const ps_resource_def_t *def,
                             uint64_t total_bytes, ps_arena_options_t *opts)
{
    memset(opts, 0, sizeof *opts);
    ps_arena_options_default(opts);
    apply_keys(def, PS_TYPE_ARENA, total_bytes, opts);
    if (!def->values[PS_KEY_FREE_SYNC].set)
        opts->free_sync = cfg->global.free_sync;
}

void ps_config_fixed_size_options(const ps_config_t *cfg, const ps_resource_def_t *def,
                                  ps_fixed_size_options_t *opts)
{
    memset(opts, 0, sizeof *opts);
    ps_fixed_size_options_default(opts);
    apply_keys(def, PS_TYPE_FIXED_SIZE, 0, opts);
    if (!def->values[PS_KEY_FREE_SYNC].set)
        opts->free_sync = cfg->global.free_sync;
}

void ps_host_pool_options(const ps_host_config_t *host, ps_pool_options_t *out)
{
    ps_pool_options_default(out);
    out->min_chunk = host->min_chunk;
    out->max_chunk = host->max_chunk;
    out->growth_percent = host->growth_percent;
    out->maximum_size = host->maximum_size;
    out->free_sync = host->free_sync;
    out->epoch_wait_ns = host->epoch_wait_us * 1000;
    out->thread_cache = 0; /* pinned host memory: the host writes it, a barrier does not order that */
    /* host.expandable: the pool's expandable mode over a host range (the
     * builder gives it the table of core/host_vm.h where the driver can;
     * auto (-1) and on (1) both ask for it); else chunks */
    out->expandable = host->expandable != 0;
    out->expandable_reserve = PS_HOST_EXPANDABLE_RESERVE;
    out->expandable_piece = host->expandable_piece;
    out->expandable_run_min = 0; /* a run per piece: the growth budget gives pieces back often */
    out->expandable_setup_run_min = 0;
    out->expandable_map_first = 0; /* (pinned host memory only as the program asks) */
    out->grow_budget_percent = host->expandable != 0 ? host->grow_budget_percent : 0;
    out->grow_budget_min = out->grow_budget_percent ? host->grow_budget_min : 0;
    out->barrier_pending_percent = 0;
    out->pending_wait_bytes = host->pending_wait_bytes;
    out->pending_wait_percent = host->pending_wait_percent;
    out->release_before_grow = host->release_before_grow;
    out->chunk_granule = PS_HOST_CHUNK_GRANULE;
}

/* Keeps a name alive as long as the stack. */
static const char *own_name(builder_t *b, const char *name)
{
    char *copy = strdup(name);
    if (!copy) {
        b->status = PS_ENOMEM;
        return NULL;
    }
    b->sp->names[b->sp->name_count++] = copy;
    return copy;
}

/* Expands a log file pattern for `device`: %p, %r, %d; without %d in the
 * pattern, devices after 0 get ".N" appended (one file per device). */
static int log_path(const char *pattern, int device, char *path, size_t size)
{
    int rc = ps_expand_path(pattern, device < 0 ? 0 : device, path, size);
    if (rc == PS_OK && device > 0 && !strstr(pattern, "%d")) {
        size_t len = strlen(path);
        if (snprintf(path + len, size - len, ".%d", device) >= (int)(size - len))
            rc = PS_EINVAL;
    }
    return rc;
}

static void push(builder_t *b, ps_resource_t *r, ps_resource_type_t type)
{
    ps_stack_t *s = &b->sp->stack;
    s->all[s->count] = r;
    b->sp->types[s->count] = type;
    s->count++;
}

/* Reports a failed constructor and records the status. */
static void failed(builder_t *b, const char *name, ps_resource_type_t type, const ps_origin_t *origin,
                   int status)
{
    char where[PS_PATH_MAX + 32];
    if (origin && origin->kind != PS_ORIGIN_NONE)
        ps_origin_format(origin, where, sizeof where);
    else
        snprintf(where, sizeof where, "built in");
    ps_error("device %d: cannot create resource `%s` (type %s, %s): %s%s", b->device, name,
             ps_type_names[type], where, ps_status_name(status),
             status == PS_EUNSUPPORTED ? " (the device or its driver lacks what this type needs)" : "");
    b->status = status;
}

static ps_resource_t *build_def(builder_t *b, int index);

/* Creates the implicit fixed_size of one bin. */
static ps_resource_t *build_implicit_bin(builder_t *b, const ps_resource_def_t *def,
                                         const ps_bin_def_t *bin, ps_resource_t *upstream)
{
    char label[160];
    snprintf(label, sizeof label, "%s.bin%llu", def->name, (unsigned long long)bin->max_size);
    const char *name = own_name(b, label);
    if (!name)
        return NULL;
    ps_fixed_size_options_t opts; /* the binning's blocks_per_batch and free_sync */
    ps_config_fixed_size_options(b->cfg, def, &opts);
    opts.block_size = (size_t)bin->max_size;
    ps_resource_t *r = NULL;
    int rc = b->ctors->fixed_size(name, upstream, b->gpu, &opts, &r);
    if (rc != PS_OK || !r) {
        failed(b, name, PS_TYPE_FIXED_SIZE, &def->values[PS_KEY_BINS].origin, rc != PS_OK ? rc : PS_EUPSTREAM);
        return NULL;
    }
    push(b, r, PS_TYPE_FIXED_SIZE);
    return r;
}

static ps_resource_t *build_def(builder_t *b, int index);

/* What a builder below returns when it failed and already said why (a
 * member that failed, a size or path that does not work out). */
#define ALREADY_SAID 1

static int build_pool(builder_t *b, const ps_resource_def_t *def, const char *name, ps_resource_t *upstream,
                      ps_resource_t **r)
{
    const ps_value_t *v = def->values;
    ps_pool_options_t opts;
    ps_config_pool_options(b->cfg, def, b->total_bytes, &opts);
    int rc = b->ctors->pool(name, upstream, b->gpu, &opts, r);
    if (rc == PS_OK && *r && b->ctors == &ps_core_constructors && v[PS_KEY_UPSTREAM].set &&
        b->cfg->defs[def->upstream].type != PS_TYPE_CUDA && !v[PS_KEY_EXPANDABLE].set && ps_pool_is_expandable(*r))
        /* (it takes its memory from its upstream only where the device
         * lacks virtual memory management; `upstream = cuda`, the
         * implicit one written out, is device memory either way) */
        ps_warning("pool '%s': its upstream '%s' is not used: the pool maps its own memory into one range "
                   "(expandable, the default where the device can); set expandable = 0 in [resource.%s] to "
                   "grow in chunks from '%s'",
                   def->name, b->cfg->defs[def->upstream].name, def->name, b->cfg->defs[def->upstream].name);
    return rc;
}

/* Its bins (named, or made for it) and its fallback, then the binning. */
static int build_binning(builder_t *b, const ps_resource_def_t *def, const char *name, ps_resource_t *upstream,
                         ps_resource_t **r)
{
    ps_bin_t *bins = calloc(def->bin_count ? def->bin_count : 1, sizeof *bins);
    if (!bins)
        return PS_ENOMEM;
    int rc = PS_OK;
    for (size_t i = 0; i < def->bin_count && rc == PS_OK; i++) {
        const ps_bin_def_t *bin = &def->bins[i];
        bins[i].max_size = (size_t)bin->max_size;
        bins[i].resource =
            bin->resource >= 0 ? build_def(b, bin->resource) : build_implicit_bin(b, def, bin, upstream);
        rc = bins[i].resource ? PS_OK : ALREADY_SAID;
    }
    ps_resource_t *fallback = rc == PS_OK ? build_def(b, def->fallback) : NULL;
    if (rc == PS_OK)
        rc = fallback ? b->ctors->binning(name, bins, def->bin_count, fallback, r) : ALREADY_SAID;
    free(bins);
    return rc;
}

/* The resources sized or named per device: limit, async, log. */
static int build_sized(builder_t *b, const ps_resource_def_t *def, const char *name, ps_resource_t *upstream,
                       ps_resource_t **r)
{
    const ps_value_t *v = def->values;
    if (def->type == PS_TYPE_ASYNC) {
        /* unset: max, keep everything cached, as the peers were measured */
        uint64_t threshold = v[PS_KEY_RELEASE_THRESHOLD].set
                                 ? ps_value_bytes(&v[PS_KEY_RELEASE_THRESHOLD], b->total_bytes)
                                 : ps_key_info[PS_KEY_RELEASE_THRESHOLD].default_value;
        return b->ctors->async(name, b->gpu, threshold, r);
    }
    if (def->type == PS_TYPE_LIMIT) {
        uint64_t limit = ps_value_bytes(&v[PS_KEY_LIMIT], b->total_bytes);
        if (limit == 0) {
            ps_error("device %d: the limit of `%s` comes to 0 bytes on this device", b->device, name);
            b->status = PS_ECONFIG;
            return ALREADY_SAID;
        }
        return b->ctors->limit(name, upstream, (size_t)limit, r);
    }
    char path[PS_PATH_MAX]; /* PS_TYPE_LOG */
    if (ps_expand_path(v[PS_KEY_FILE].text, b->device, path, sizeof path) != PS_OK) {
        ps_error("device %d: cannot expand the log file name `%s` of `%s`", b->device, v[PS_KEY_FILE].text, name);
        b->status = PS_ECONFIG;
        return ALREADY_SAID;
    }
    return b->ctors->log(name, upstream, path, r);
}

static ps_resource_t *build_def(builder_t *b, int index)
{
    if (b->created[index])
        return b->created[index];
    const ps_resource_def_t *def = &b->cfg->defs[index];
    const ps_value_t *v = def->values;
    ps_resource_t *upstream = NULL;
    if (def->upstream >= 0 && !(upstream = build_def(b, def->upstream)))
        return NULL;
    const char *name = own_name(b, def->name);
    if (!name)
        return NULL;
    ps_resource_t *r = NULL;
    int rc = PS_OK;
    switch (def->type) {
    case PS_TYPE_POOL: rc = build_pool(b, def, name, upstream, &r); break;
    case PS_TYPE_ARENA: {
        ps_arena_options_t opts;
        ps_config_arena_options(b->cfg, def, b->total_bytes, &opts);
        rc = b->ctors->arena(name, upstream, b->gpu, &opts, &r);
        break;
    }
    case PS_TYPE_FIXED_SIZE: {
        ps_fixed_size_options_t opts;
        ps_config_fixed_size_options(b->cfg, def, &opts);
        rc = b->ctors->fixed_size(name, upstream, b->gpu, &opts, &r);
        break;
    }
    case PS_TYPE_BINNING: rc = build_binning(b, def, name, upstream, &r); break;
    case PS_TYPE_CUDA: rc = b->ctors->cuda(name, b->gpu, &r); break;
    case PS_TYPE_MANAGED: rc = b->ctors->managed(name, b->gpu, &r); break;
    case PS_TYPE_ASYNC:
    case PS_TYPE_LIMIT:
    case PS_TYPE_LOG: rc = build_sized(b, def, name, upstream, &r); break;
    case PS_TYPE_STATS: rc = b->ctors->stats(name, upstream, &r); break;
    case PS_TYPE_TRACK: rc = b->ctors->track(name, upstream, (unsigned)v[PS_KEY_STACK_DEPTH].number, &r); break;
    default: rc = PS_ECONFIG; break;
    }
    if (rc == ALREADY_SAID)
        return NULL;
    if (rc != PS_OK || !r) {
        failed(b, name, def->type, def->values[PS_KEY_TYPE].set ? &v[PS_KEY_TYPE].origin : &def->origin,
               rc != PS_OK ? rc : PS_EUPSTREAM);
        return NULL;
    }
    push(b, r, def->type);
    b->created[index] = r;
    return r;
}

/* Marks what the root reaches; returns 1 if any of it is sized in percent. */
static int reach(const ps_config_t *cfg, int index, char *seen, size_t *implicit_bins)
{
    if (index < 0 || seen[index])
        return 0;
    seen[index] = 1;
    const ps_resource_def_t *def = &cfg->defs[index];
    int pct = 0;
    for (int k = 0; k < PS_KEY_COUNT; k++)
        pct |= def->values[k].set && def->values[k].is_percent;
    pct |= reach(cfg, def->upstream, seen, implicit_bins);
    pct |= reach(cfg, def->fallback, seen, implicit_bins);
    for (size_t i = 0; i < def->bin_count; i++) {
        if (def->bins[i].resource < 0)
            (*implicit_bins)++;
        pct |= reach(cfg, def->bins[i].resource, seen, implicit_bins);
    }
    return pct;
}

/* Prints the limit problems that only the device's size reveals. */
static void report_to_log(void *ctx, const ps_origin_t *origin, const char *message)
{
    char where[PS_PATH_MAX + 32];
    ps_error("device %d: %s: %s", *(const int *)ctx, ps_origin_format(origin, where, sizeof where), message);
}

static void destroy_private(stack_private_t *sp)
{
    if (!sp)
        return;
    for (size_t i = sp->stack.count; i > 0; i--)
        ps_destroy(sp->stack.all[i - 1]);
    for (size_t i = 0; i < sp->name_count; i++)
        free(sp->names[i]);
    free(sp->names);
    free(sp->types);
    free(sp->stack.all);
    ps_host_vm_destroy(sp->host_vm); /* after the pool that mapped through it */
    free(sp);
}

/* Sizes in percent of device memory: the device's size into *total, and
 * the limits only it reveals (`seen`: the definitions the stack reaches).
 * PS_ECONFIG (said) when it is unknown or a limit does not fit. */
static int device_size(const ps_config_t *cfg, int device, const ps_gpu_ops_t *gpu, const char *seen,
                       uint64_t *total)
{
    size_t free_bytes = 0, bytes = 0;
    int rc = gpu && gpu->mem_get_info ? gpu->mem_get_info(gpu->ctx, &free_bytes, &bytes) : PS_EUNSUPPORTED;
    if (rc != PS_OK || bytes == 0) {
        ps_error("device %d: sizes are given in %% of device memory, but the device's size is unknown (%s)", device,
                 ps_status_name(rc != PS_OK ? rc : PS_EUPSTREAM));
        return PS_ECONFIG;
    }
    *total = bytes;
    return ps_config_check_limits(cfg, bytes, seen, report_to_log, &device) > 0 ? PS_ECONFIG : PS_OK;
}

/* The adaptors [global] puts over the configured stack `top`: red zones
 * (debug.guard) under stats and log (which then count what the program
 * asked for). NULL when one could not be made (said). */
static ps_resource_t *add_global_adaptors(builder_t *b, ps_resource_t *top)
{
    const ps_global_config_t *g = &b->cfg->global;
    if (top && g->debug.guard) {
        ps_resource_t *track = NULL, *r = NULL;
        for (size_t i = b->sp->stack.count; i > 0 && !track; i--)
            if (b->sp->types[i - 1] == PS_TYPE_TRACK)
                track = b->sp->stack.all[i - 1];
        const char *name = own_name(b, "guard");
        int (*guard)(const char *, ps_resource_t *, const ps_gpu_ops_t *, size_t, ps_resource_t *,
                     ps_resource_t **) = b->ctors->guard ? b->ctors->guard : ps_guard_create;
        int rc = name ? guard(name, top, b->gpu, g->debug.guard, track, &r) : PS_ENOMEM;
        if (rc == PS_OK && r) {
            push(b, r, PS_TYPE_LIMIT); /* an adaptor the stack lists; no kind of its own there */
            top = r;
        } else {
            ps_error("device %d: cannot create the guard adaptor (debug.guard): %s%s", b->device, ps_status_name(rc),
                     rc == PS_EUNSUPPORTED ? " (this device's GPU-ops table cannot fill and read device memory)" : "");
            b->status = rc ? rc : PS_EUPSTREAM;
            top = NULL;
        }
    }
    if (top && g->stats != PS_STATS_OFF) {
        ps_resource_t *r = NULL;
        const char *name = own_name(b, "stats");
        int rc = name ? b->ctors->stats(name, top, &r) : PS_ENOMEM;
        if (rc == PS_OK && r) {
            push(b, r, PS_TYPE_STATS);
            top = r;
        } else {
            failed(b, "stats", PS_TYPE_STATS, &b->cfg->global_origin[PS_GKEY_STATS], rc ? rc : PS_EUPSTREAM);
            top = NULL;
        }
    }
    if (top && g->log_file[0]) {
        char path[PS_PATH_MAX];
        ps_resource_t *r = NULL;
        int rc = log_path(g->log_file, b->device, path, sizeof path);
        const char *name = rc == PS_OK ? own_name(b, "log") : NULL;
        if (rc == PS_OK && name)
            rc = b->ctors->log(name, top, path, &r);
        if (rc == PS_OK && name && r) {
            push(b, r, PS_TYPE_LOG);
            top = r;
        } else {
            failed(b, "log", PS_TYPE_LOG, &b->cfg->global_origin[PS_GKEY_LOG_FILE],
                   rc != PS_OK ? rc : name ? PS_EUPSTREAM : PS_ENOMEM);
            top = NULL;
        }
    }
    return top;
}

int ps_config_build_stack_with(const ps_config_t *cfg, int device, const ps_gpu_ops_t *gpu,
                               const ps_config_constructors_t *ctors, ps_stack_t **out)
{
    if (!cfg || !out || !ctors)
        return PS_EINVAL;
    if (cfg->error_count) {
        ps_error("device %d: the configuration has %zu error(s); no stack built", device, cfg->error_count);
        return PS_ECONFIG;
    }
    const ps_device_def_t *dev = ps_config_device(cfg, device);
    if (!dev || dev->resource < 0) {
        ps_error("device %d: no [device.%d] or [device.*] section names a resource", device, device);
        return PS_ECONFIG;
    }
    char *seen = calloc(cfg->def_count + 1, 1);
    ps_resource_t **created = calloc(cfg->def_count + 1, sizeof *created);
    stack_private_t *sp = calloc(1, sizeof *sp);
    if (!seen || !created || !sp) {
        free(seen);
        free(created);
        free(sp);
        return PS_ENOMEM;
    }
    size_t implicit_bins = 0;
    int needs_total = reach(cfg, dev->resource, seen, &implicit_bins);
    size_t reachable = 0;
    for (size_t i = 0; i < cfg->def_count; i++)
        reachable += seen[i];

    builder_t b = {cfg, device, gpu, ctors, 0, created, sp, PS_OK};
    int status = needs_total ? device_size(cfg, device, gpu, seen, &b.total_bytes) : PS_OK;
    free(seen);
    if (status != PS_OK) {
        free(created);
        free(sp);
        return status;
    }
    sp->capacity = reachable + implicit_bins + 3; /* + guard, stats, log */
    sp->stack.all = calloc(sp->capacity, sizeof *sp->stack.all);
    sp->types = calloc(sp->capacity, sizeof *sp->types);
    sp->names = calloc(sp->capacity + 1, sizeof *sp->names);
    if (!sp->stack.all || !sp->types || !sp->names) {
        free(created);
        destroy_private(sp);
        return PS_ENOMEM;
    }

    ps_resource_t *top = build_def(&b, dev->resource);
    if (top)
        top = add_global_adaptors(&b, top);
    free(created);
    if (!top) {
        status = b.status;
        destroy_private(sp);
        return status == PS_ENOMEM || status == PS_EUNSUPPORTED ? status : PS_ECONFIG;
    }
    ps_stack_t *s = &sp->stack;
    s->top = top;
    for (size_t i = s->count; i > 0; i--) { /* the topmost adaptor of each kind */
        ps_resource_type_t t = sp->types[i - 1];
        if (t == PS_TYPE_STATS && !s->stats)
            s->stats = s->all[i - 1];
        if (t == PS_TYPE_TRACK && !s->track)
            s->track = s->all[i - 1];
        if (t == PS_TYPE_LOG && !s->log)
            s->log = s->all[i - 1];
    }
    *out = s;
    return PS_OK;
}

int ps_config_build_host_stack(const ps_config_t *cfg, int device, const ps_gpu_ops_t *gpu, unsigned flags,
                               const ps_pool_options_t *pool_options, ps_stack_t **out)
{
    if (!cfg || !gpu || !out)
        return PS_EINVAL;
    if (cfg->error_count)
        return PS_ECONFIG;
    const ps_host_config_t *h = &cfg->global.host;
    stack_private_t *sp = calloc(1, sizeof *sp);
    if (!sp)
        return PS_ENOMEM;
    sp->capacity = 6; /* pinned, host, limit, track, stats, log */
    sp->stack.all = calloc(sp->capacity, sizeof *sp->stack.all);
    sp->types = calloc(sp->capacity, sizeof *sp->types);
    sp->names = calloc(sp->capacity + 1, sizeof *sp->names);
    if (!sp->stack.all || !sp->types || !sp->names) {
        destroy_private(sp);
        return PS_ENOMEM;
    }
    builder_t b = {cfg, device, gpu, &ps_core_constructors, 0, NULL, sp, PS_OK};
    ps_stack_t *s = &sp->stack;
    ps_pool_options_t opts;
    if (pool_options)
        opts = *pool_options;
    else
        ps_host_pool_options(h, &opts);
    ps_resource_t *r = NULL, *top = NULL;
    /* (the names are literals: nothing for the stack to own) */
    const ps_gpu_ops_t *pool_gpu = gpu;
    if (opts.expandable) {
        /* the pool's expandable mode over one range of host-located
         * cuMemCreate pieces (core/host_vm.h) where the driver can; else
         * slabs. Unset (auto) under debug.nvtx: slabs, as for device
         * pools (compute-sanitizer runs stay on the mechanism known to work) */
        int vm = h->expandable < 0 && cfg->global.debug.nvtx ? PS_EUNSUPPORTED : ps_host_vm_create(gpu, &sp->host_vm);
        if (vm == PS_OK) {
            pool_gpu = sp->host_vm;
            ps_info("device %d: pinned pool: one host range of cuMemCreate pieces (host.expandable)", device);
        } else if (h->expandable > 0) {
            ps_warning("device %d: host.expandable: this driver cannot map pinned host memory into one range "
                       "(cuMemCreate with a host location; %s); pinned slabs instead", device, ps_status_name(vm));
        } else {
            ps_info("device %d: pinned pool: slabs (%s)", device,
                    cfg->global.debug.nvtx ? "debug.nvtx on and host.expandable unset"
                                           : "the driver cannot map pinned host memory into one range");
        }
        if (vm != PS_OK) {
            opts.expandable = 0; /* never the device's own vm_* under a pinned pool */
            opts.grow_budget_percent = 0;
            opts.grow_budget_min = 0;
        }
    }
    int rc = ps_host_resource_create("pinned", gpu, flags, &r);
    if (rc == PS_OK) {
        push(&b, r, PS_TYPE_CUDA); /* (a leaf; no adaptor type) */
        rc = ps_pool_create("host", r, pool_gpu, &opts, &top);
        if (rc == PS_OK)
            push(&b, top, PS_TYPE_POOL);
    }
    if (rc == PS_OK && h->limit) {
        if ((rc = ps_limit_create("host.limit", top, h->limit, &r)) == PS_OK)
            push(&b, top = r, PS_TYPE_LIMIT);
    }
    if (rc == PS_OK && h->track) {
        if ((rc = ps_track_create("host.track", top, h->stack_depth, &r)) == PS_OK) {
            push(&b, top = r, PS_TYPE_TRACK);
            s->track = r;
        }
    }
    if (rc == PS_OK && cfg->global.stats != PS_STATS_OFF) {
        if ((rc = ps_stats_create("host.stats", top, &r)) == PS_OK) {
            push(&b, top = r, PS_TYPE_STATS);
            s->stats = r;
        }
    }
    if (rc == PS_OK && h->log_file[0]) {
        char path[PS_PATH_MAX];
        if ((rc = log_path(h->log_file, device, path, sizeof path)) == PS_OK &&
            (rc = ps_log_create("host.log", top, path, &r)) == PS_OK) {
            push(&b, top = r, PS_TYPE_LOG);
            s->log = r;
        } else {
            ps_error("device %d: cannot open the pinned memory log `%s` ([host] log_file)", device, h->log_file);
        }
    }
    if (rc != PS_OK) {
        destroy_private(sp);
        return rc == PS_EINVAL ? PS_ECONFIG : rc;
    }
    s->top = top;
    *out = s;
    return PS_OK;
}

int ps_config_build_stack(const ps_config_t *cfg, int device, const ps_gpu_ops_t *gpu,
                          ps_stack_t **out)
{
    return ps_config_build_stack_with(cfg, device, gpu, &ps_core_constructors, out);
}

void ps_stack_destroy(ps_stack_t *stack)
{
    destroy_private((stack_private_t *)stack);
}
