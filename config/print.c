/* ps_config_print: the effective configuration of one device, as a tree.
 *
 * Steps:
 *   1. print [global], every key with its value and origin;
 *   2. print the device's stack top first: the global adaptors (log, stats),
 *      then the device's resource, then, indented, its upstream (and a
 *      binning's bins and fallback), down to the leaves;
 *   3. every key of a resource's type is shown: a set one as written with
 *      file:line (or the environment variable), an unset one with the
 *      value the builder would use and "(default)". Percentages stay
 *      percentages: no device is asked.
 * A resource shared by two parents is printed in full once, then as
 * "(shown above)".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

static void print_line(FILE *f, int indent, const char *key, const char *value,
                       const ps_origin_t *origin, const char *note)
{
    char where[PS_PATH_MAX + 32];
    int width = indent + 2 + 18;
    int n = fprintf(f, "%*s  %-18s = %s", indent, "", key, value);
    int pad = width + 20 - n;
    fprintf(f, "%*s  (%s%s)\n", pad > 0 ? pad : 0, "", note ? note : "",
            ps_origin_format(origin, where, sizeof where));
}

static void print_global(const ps_config_t *cfg, FILE *f)
{
    const ps_global_config_t *g = &cfg->global;
    char value[PS_PATH_MAX + 8];
    fprintf(f, "[global]\n");
    for (int k = 0; k < PS_GKEY_COUNT; k++) {
        switch ((ps_global_key_t)k) {
        case PS_GKEY_VERBOSITY: snprintf(value, sizeof value, "%d", g->verbosity); break;
        case PS_GKEY_STATS: snprintf(value, sizeof value, "%s", ps_stats_words[g->stats]); break;
        case PS_GKEY_STATS_FILE: snprintf(value, sizeof value, "%s", g->stats_file[0] ? g->stats_file : "(stderr)"); break;
        case PS_GKEY_LOG_FILE: snprintf(value, sizeof value, "%s", g->log_file[0] ? g->log_file : "(none)"); break;
        case PS_GKEY_FREE_SYNC: snprintf(value, sizeof value, "%s", ps_free_sync_words[g->free_sync]); break;
        case PS_GKEY_MEMINFO: snprintf(value, sizeof value, "%s", ps_meminfo_words[g->meminfo]); break;
        case PS_GKEY_ON_ERROR: snprintf(value, sizeof value, "%s", ps_on_error_words[g->on_error]); break;
        case PS_GKEY_DIRECT_MIN_SIZE:
            if (g->direct_min_size)
                ps_format_bytes(value, sizeof value, g->direct_min_size);
            else
                snprintf(value, sizeof value, "0 (off)");
            break;
        case PS_GKEY_DISABLE: snprintf(value, sizeof value, "%s", g->disable ? "yes" : "no"); break;
        case PS_GKEY_IPC: snprintf(value, sizeof value, "%s", g->ipc ? "yes" : "no"); break;
        case PS_GKEY_OOM_RETRY: snprintf(value, sizeof value, "%s", g->oom_retry ? "yes" : "no"); break;
        case PS_GKEY_DECAY_MS:
            snprintf(value, sizeof value, g->decay_ms ? "%llu" : "0 (off)", (unsigned long long)g->decay_ms);
            break;
        case PS_GKEY_NEIGHBOUR_RELEASE: snprintf(value, sizeof value, "%s", g->neighbour_release ? "yes" : "no"); break;
        case PS_GKEY_NEIGHBOUR_WAIT_MS: snprintf(value, sizeof value, "%llu", (unsigned long long)g->neighbour_wait_ms); break;
        default: value[0] = '\0'; break;
        }
        print_line(f, 0, ps_global_key_names[k], value, &cfg->global_origin[k], NULL);
    }
}

/* [host]: the pinned host pool, each value with where it came from (the
 * settings store's entry for host.KEY, else the default). */
static void print_host(const ps_config_t *cfg, FILE *f)
{
    const ps_host_config_t *h = &cfg->global.host;
    char value[PS_PATH_MAX];
    fprintf(f, "\n[host]\n");
    for (int k = 0; k < PS_HKEY_COUNT; k++) {
        switch ((ps_host_key_t)k) {
        case PS_HKEY_ENABLE: snprintf(value, sizeof value, "%s", h->enable ? "yes" : "no"); break;
        case PS_HKEY_MIN_CHUNK: ps_format_bytes(value, sizeof value, h->min_chunk); break;
        case PS_HKEY_MAX_CHUNK: ps_format_bytes(value, sizeof value, h->max_chunk); break;
        case PS_HKEY_GROWTH_PERCENT: snprintf(value, sizeof value, "%u", h->growth_percent); break;
        case PS_HKEY_MAXIMUM_SIZE:
            if (h->maximum_size)
                ps_format_bytes(value, sizeof value, h->maximum_size);
            else
                snprintf(value, sizeof value, "0 (no cap)");
            break;
        case PS_HKEY_PENDING_WAIT_BYTES: ps_format_bytes(value, sizeof value, h->pending_wait_bytes); break;
        case PS_HKEY_PENDING_WAIT_PERCENT: snprintf(value, sizeof value, "%u", h->pending_wait_percent); break;
        case PS_HKEY_FREE_SYNC: snprintf(value, sizeof value, "%s", ps_free_sync_words[h->free_sync]); break;
        case PS_HKEY_EPOCH_WAIT_US: snprintf(value, sizeof value, "%llu", (unsigned long long)h->epoch_wait_us); break;
        case PS_HKEY_RELEASE_BEFORE_GROW: snprintf(value, sizeof value, "%s", h->release_before_grow ? "yes" : "no"); break;
        case PS_HKEY_LIMIT:
            if (h->limit)
                ps_format_bytes(value, sizeof value, h->limit);
            else
                snprintf(value, sizeof value, "0 (none)");
            break;
        case PS_HKEY_TRACK: snprintf(value, sizeof value, "%s", h->track ? "yes" : "no"); break;
        case PS_HKEY_STACK_DEPTH: snprintf(value, sizeof value, "%u", h->stack_depth); break;
        case PS_HKEY_LOG_FILE: snprintf(value, sizeof value, "%s", h->log_file[0] ? h->log_file : "(none)"); break;
        case PS_HKEY_EXPANDABLE:
            snprintf(value, sizeof value, "%s",
                     h->expandable < 0 ? "auto (one host range where the driver can, else slabs)"
                                       : h->expandable ? "yes" : "no");
            break;
        case PS_HKEY_EXPANDABLE_PIECE: ps_format_bytes(value, sizeof value, h->expandable_piece); break;
        case PS_HKEY_GROW_BUDGET_PERCENT: snprintf(value, sizeof value, "%u", h->grow_budget_percent); break;
        case PS_HKEY_GROW_BUDGET_MIN:
            if (h->grow_budget_min)
                ps_format_bytes(value, sizeof value, h->grow_budget_min);
            else
                snprintf(value, sizeof value, "0 (none)");
            break;
        default: value[0] = '\0'; break;
        }
        static const ps_origin_t unset = {PS_ORIGIN_NONE, NULL, 0};
        const ps_origin_t *origin = &unset;
        for (size_t i = 0; i < cfg->setting_count; i++)
            if (strcmp(cfg->settings[i].section, "host") == 0 && strcmp(cfg->settings[i].key, ps_host_key_names[k]) == 0)
                origin = &cfg->settings[i].origin;
        print_line(f, 0, ps_host_key_names[k], value, origin, NULL);
    }
}

/* [debug]: NVTX registration and guard mode, each with its origin. */
static void print_debug(const ps_config_t *cfg, FILE *f)
{
    const ps_debug_config_t *d = &cfg->global.debug;
    char value[64];
    fprintf(f, "\n[debug]\n");
    for (int k = 0; k < PS_DKEY_COUNT; k++) {
        switch ((ps_debug_key_t)k) {
        case PS_DKEY_NVTX: snprintf(value, sizeof value, "%s", d->nvtx ? "on" : "off"); break;
        case PS_DKEY_NVTX_RANGES: snprintf(value, sizeof value, "%s", d->nvtx_ranges ? "on" : "off"); break;
        case PS_DKEY_GUARD:
            if (d->guard)
                ps_format_bytes(value, sizeof value, d->guard);
            else
                snprintf(value, sizeof value, "0 (off)");
            break;
        default: value[0] = '\0'; break;
        }
        static const ps_origin_t unset = {PS_ORIGIN_NONE, NULL, 0};
        const ps_origin_t *origin = &unset;
        for (size_t i = 0; i < cfg->setting_count; i++)
            if (strcmp(cfg->settings[i].section, "debug") == 0 && strcmp(cfg->settings[i].key, ps_debug_key_names[k]) == 0)
                origin = &cfg->settings[i].origin;
        print_line(f, 0, ps_debug_key_names[k], value, origin, NULL);
    }
}

/* The value the builder uses for an unset key. */
static void default_text(const ps_config_t *cfg, const ps_resource_def_t *def, int key, char *buf,
                         size_t size)
{
    ps_pool_options_t pool;
    ps_arena_options_t arena;
    ps_fixed_size_options_t fixed;
    ps_config_pool_options(cfg, def, 0, &pool);
    ps_config_arena_options(cfg, def, 0, &arena);
    ps_config_fixed_size_options(cfg, def, &fixed);
    uint64_t bytes = 0;
    int is_bytes = 1;
    switch (key) {
    case PS_KEY_UPSTREAM:
        snprintf(buf, size, "%s", def->upstream >= 0 ? cfg->defs[def->upstream].name : "(none)");
        return;
    case PS_KEY_INITIAL_SIZE: bytes = def->type == PS_TYPE_ARENA ? arena.initial_size : pool.initial_size; break;
    case PS_KEY_MAXIMUM_SIZE:
        bytes = def->type == PS_TYPE_ARENA ? arena.maximum_size : pool.maximum_size;
        if (!bytes) {
            snprintf(buf, size, "0 (no cap)");
            return;
        }
        break;
    case PS_KEY_MIN_CHUNK: bytes = pool.min_chunk; break;
    case PS_KEY_MAX_CHUNK: bytes = pool.max_chunk; break;
    case PS_KEY_SUPERBLOCK_SIZE: bytes = arena.superblock_size; break;
    case PS_KEY_BLOCK_SIZE: bytes = fixed.block_size; break;
    case PS_KEY_ALIGNMENT:
        bytes = def->type == PS_TYPE_ARENA ? arena.alignment
                : def->type == PS_TYPE_FIXED_SIZE ? fixed.alignment : pool.alignment;
        break;
    case PS_KEY_GROWTH_PERCENT: snprintf(buf, size, "%u", pool.growth_percent); return;
    case PS_KEY_EPOCH_WAIT_US: snprintf(buf, size, "%llu", (unsigned long long)(pool.epoch_wait_ns / 1000)); return;
    case PS_KEY_EXPANDABLE: snprintf(buf, size, "%d (when the device has virtual memory)", pool.expandable); return;
    case PS_KEY_EXPANDABLE_RESERVE:
        if (!pool.expandable_reserve) {
            snprintf(buf, size, "0 (twice the device)");
            return;
        }
        bytes = pool.expandable_reserve;
        break;
    case PS_KEY_EXPANDABLE_PIECE: bytes = pool.expandable_piece; break;
    case PS_KEY_EXPANDABLE_RUN_MIN:
        if (!pool.expandable_run_min) {
            snprintf(buf, size, "0 (always piece by piece)");
            return;
        }
        bytes = pool.expandable_run_min;
        break;
    case PS_KEY_SMALL_FROM_BACK: bytes = pool.small_from_back; break;
    case PS_KEY_THREAD_CACHE: bytes = pool.thread_cache; break;
    case PS_KEY_BARRIER_PENDING_PERCENT: snprintf(buf, size, "%u", pool.barrier_pending_percent); return;
    case PS_KEY_REMAP: snprintf(buf, size, "%d", pool.remap); return;
    case PS_KEY_REMAP_TURNOVER_PERCENT: snprintf(buf, size, "%u", pool.remap_turnover_percent); return;
    case PS_KEY_REMAP_SLACK_PERCENT: snprintf(buf, size, "%u", pool.remap_slack_percent); return;
    case PS_KEY_REMAP_LEND: snprintf(buf, size, "%d", pool.remap_lend); return;
    case PS_KEY_BARRIER_FLOOR: bytes = pool.barrier_floor; break;
    case PS_KEY_THREAD_FLOOR: bytes = arena.thread_floor; break;
    case PS_KEY_BLOCKS_PER_BATCH: snprintf(buf, size, "%zu", fixed.blocks_per_batch); return;
    case PS_KEY_FREE_SYNC: snprintf(buf, size, "%s", ps_free_sync_words[cfg->global.free_sync]); return;
    case PS_KEY_RELEASE_THRESHOLD: snprintf(buf, size, "max (keep all)"); return;
    case PS_KEY_STACK_DEPTH: snprintf(buf, size, "0"); return;
    default: is_bytes = 0; break;
    }
    if (is_bytes)
        ps_format_bytes(buf, size, bytes);
    else
        snprintf(buf, size, "(unset)");
}

static void print_def(const ps_config_t *cfg, FILE *f, int index, int indent, char *shown);

static void print_child(const ps_config_t *cfg, FILE *f, int index, int indent, const char *role,
                        char *shown)
{
    fprintf(f, "%*s  %s:\n", indent, "", role);
    print_def(cfg, f, index, indent + 4, shown);
}

static void print_def(const ps_config_t *cfg, FILE *f, int index, int indent, char *shown)
{
    const ps_resource_def_t *def = &cfg->defs[index];
    char where[PS_PATH_MAX + 32];
    if (def->predefined && !def->values[PS_KEY_TYPE].set)
        snprintf(where, sizeof where, "built in");
    else
        ps_origin_format(def->values[PS_KEY_TYPE].set ? &def->values[PS_KEY_TYPE].origin : &def->origin,
                         where, sizeof where);
    fprintf(f, "%*s`-- [resource.%s] type = %s  (%s)%s\n", indent, "", def->name,
            def->type < PS_TYPE_COUNT ? ps_type_names[def->type] : "?", where,
            shown[index] ? "  (shown above)" : "");
    if (shown[index])
        return;
    shown[index] = 1;
    int inner = indent + 4;
    uint32_t keys = def->type < PS_TYPE_COUNT ? ps_type_keys(def->type) : 0;
    for (int k = 0; k < PS_KEY_COUNT; k++) {
        if (k == PS_KEY_TYPE || k == PS_KEY_UPSTREAM || k == PS_KEY_FALLBACK || !(keys & (1u << k)))
            continue;
        const ps_value_t *v = &def->values[k];
        if (v->set) {
            print_line(f, inner, ps_key_names[k], v->text, &v->origin,
                       v->is_percent ? "of device memory, " : NULL);
        } else if (k == PS_KEY_FREE_SYNC) {
            print_line(f, inner, ps_key_names[k], ps_free_sync_words[cfg->global.free_sync],
                       &cfg->global_origin[PS_GKEY_FREE_SYNC], "global.free_sync, ");
        } else if (k != PS_KEY_BINS && k != PS_KEY_FILE && k != PS_KEY_LIMIT) {
            char value[64];
            ps_origin_t none = {PS_ORIGIN_NONE, NULL, 0};
            default_text(cfg, def, k, value, sizeof value);
            print_line(f, inner, ps_key_names[k], value, &none, NULL);
        }
    }
    for (size_t b = 0; b < def->bin_count; b++) {
        char role[96], size[32];
        ps_format_bytes(size, sizeof size, def->bins[b].max_size);
        snprintf(role, sizeof role, "bin %zu (up to %s)", b + 1, size);
        if (def->bins[b].resource >= 0) {
            print_child(cfg, f, def->bins[b].resource, inner, role, shown);
        } else {
            fprintf(f, "%*s  %s: fixed_size, block_size = %s, over the upstream below\n", inner, "", role,
                    size);
        }
    }
    if (def->fallback >= 0)
        print_child(cfg, f, def->fallback, inner, "fallback", shown);
    if (def->upstream >= 0)
        print_child(cfg, f, def->upstream,
                    inner, def->values[PS_KEY_UPSTREAM].set ? "upstream" : "upstream (implicit)", shown);
}

void ps_config_print(const ps_config_t *cfg, FILE *f, int device)
{
    if (!cfg || !f)
        return;
    print_global(cfg, f);
    print_host(cfg, f);
    print_debug(cfg, f);
    const ps_device_def_t *dev = ps_config_device(cfg, device);
    char where[PS_PATH_MAX + 32];
    if (device < 0)
        fprintf(f, "\n[device.*]");
    else
        fprintf(f, "\n[device.%d]", device);
    if (!dev || dev->resource < 0) {
        fprintf(f, " has no resource\n");
        return;
    }
    fprintf(f, " resource = %s  (%s%s)\n", cfg->defs[dev->resource].name,
            dev->device < 0 && device >= 0 ? "from [device.*], " : "",
            ps_origin_format(&dev->origin, where, sizeof where));
    fprintf(f, "stack, top first:\n");
    int indent = 0;
    if (cfg->global.log_file[0]) {
        fprintf(f, "%*s`-- log adaptor, file = %s  (global.log_file, %s)\n", indent, "",
                cfg->global.log_file,
                ps_origin_format(&cfg->global_origin[PS_GKEY_LOG_FILE], where, sizeof where));
        indent += 4;
    }
    if (cfg->global.stats != PS_STATS_OFF) {
        fprintf(f, "%*s`-- stats adaptor, %s at exit  (global.stats, %s)\n", indent, "",
                ps_stats_words[cfg->global.stats],
                ps_origin_format(&cfg->global_origin[PS_GKEY_STATS], where, sizeof where));
        indent += 4;
    }
    char shown[1024];
    char *seen = shown;
    char *heap = NULL;
    if (cfg->def_count > sizeof shown) {
        heap = calloc(cfg->def_count, 1);
        if (!heap)
            return;
        seen = heap;
    } else {
        memset(shown, 0, sizeof shown);
    }
    print_def(cfg, f, dev->resource, indent, seen);
    free(heap);
}
