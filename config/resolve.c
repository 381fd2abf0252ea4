/* Reference resolution: resource names (upstream, fallback, bins, the
 * resource of a device section) turned into def indices, each missing one
 * reported with the nearest defined name; the keys a type cannot do
 * without (an adaptor's upstream, a binning's fallback and bins, a log's
 * file, a limit's limit); then cycle detection over the resource graph
 * (edges: upstream, fallback, bins) by depth-first search with three
 * colours, each cycle reported once as "a -> b -> a".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

int ps_config_def_index(const ps_config_t *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->def_count; i++)
        if (strcmp(cfg->defs[i].name, name) == 0)
            return (int)i;
    return -1;
}

const ps_device_def_t *ps_config_device(const ps_config_t *cfg, int device)
{
    const ps_device_def_t *any = NULL, *exact = NULL;
    for (size_t i = 0; i < cfg->device_count; i++) {
        if (cfg->devices[i].device == device && device >= 0)
            exact = &cfg->devices[i];
        if (cfg->devices[i].device == -1)
            any = &cfg->devices[i];
    }
    return exact ? exact : any;
}

/* Resolves a name reference; reports it when missing. Returns the index or -1. */
static int resolve(ps_config_t *cfg, const ps_resource_def_t *from, const char *name,
                   const ps_origin_t *origin, const char *role)
{
    int r = ps_config_def_index(cfg, name);
    if (r >= 0)
        return r;
    const char *names[64];
    size_t k = 0;
    for (size_t d = 0; d < cfg->def_count && k < 63; d++)
        names[k++] = cfg->defs[d].name;
    names[k] = NULL;
    const char *near = ps_nearest_word(name, names);
    ps_config_add_error(cfg, origin, "%s `%s` of [resource.%s] is not defined%s%s%s", role, name,
                        from->name, near ? " (did you mean `" : "", near ? near : "",
                        near ? "`?)" : " (add a [resource.NAME] section)");
    return -1;
}

void ps_config_resolve_references(ps_config_t *cfg)
{
    int cuda = ps_config_def_index(cfg, "cuda");
    for (size_t d = 0; d < cfg->def_count; d++) {
        ps_resource_def_t *def = &cfg->defs[d];
        if (def->type >= PS_TYPE_COUNT)
            continue;
        ps_value_t *up = &def->values[PS_KEY_UPSTREAM];
        char section[128];
        snprintf(section, sizeof section, "resource.%s", def->name);
        if (ps_type_is_leaf(def->type)) {
            /* an upstream key was reported with the keys */
        } else if (up->set) {
            def->upstream = resolve(cfg, def, up->text, &up->origin, "upstream");
        } else if (ps_type_is_adaptor(def->type)) {
            ps_config_add_error(cfg, &def->values[PS_KEY_TYPE].origin,
                                "[%s] is a %s adaptor and needs `upstream = NAME` (the resource it wraps)",
                                section, ps_type_names[def->type]);
        } else {
            def->upstream = cuda; /* suballocators default to the implicit cuda upstream */
        }
        if (def->type == PS_TYPE_BINNING) {
            ps_value_t *fb = &def->values[PS_KEY_FALLBACK];
            if (fb->set)
                def->fallback = resolve(cfg, def, fb->text, &fb->origin, "fallback");
            else
                ps_config_add_error(cfg, &def->values[PS_KEY_TYPE].origin,
                                    "[%s] is a binning resource and needs `fallback = NAME` (for requests above the last bin)",
                                    section);
            if (!def->values[PS_KEY_BINS].set && !ps_config_find(cfg, section, "bins"))
                ps_config_add_error(cfg, &def->values[PS_KEY_TYPE].origin,
                                    "[%s] is a binning resource and needs `bins = SIZE, SIZE, ...`", section);
            for (size_t b = 0; b < def->bin_count; b++) {
                ps_bin_def_t *bin = &def->bins[b];
                if (!*bin->name)
                    continue;
                bin->resource = resolve(cfg, def, bin->name, &def->values[PS_KEY_BINS].origin, "bin resource");
                if (bin->resource < 0)
                    continue;
                const ps_resource_def_t *r = &cfg->defs[bin->resource];
                if (r->type == PS_TYPE_FIXED_SIZE && r->values[PS_KEY_BLOCK_SIZE].set &&
                    r->values[PS_KEY_BLOCK_SIZE].number < bin->max_size) {
                    char a[32], bb[32];
                    ps_config_add_error(cfg, &def->values[PS_KEY_BINS].origin,
                                        "bin %zu of [%s] takes requests up to %s, but its fixed_size `%s` has block_size %s",
                                        b + 1, section, ps_format_bytes(a, sizeof a, bin->max_size), r->name,
                                        ps_format_bytes(bb, sizeof bb, r->values[PS_KEY_BLOCK_SIZE].number));
                }
            }
        }
        if (def->type == PS_TYPE_LOG && !def->values[PS_KEY_FILE].set &&
            !ps_config_find(cfg, section, "file"))
            ps_config_add_error(cfg, &def->values[PS_KEY_TYPE].origin,
                                "[%s] is a log adaptor and needs `file = PATH` (%%p pid, %%r rank, %%d device)",
                                section);
        if (def->type == PS_TYPE_LIMIT && !def->values[PS_KEY_LIMIT].set &&
            !ps_config_find(cfg, section, "limit"))
            ps_config_add_error(cfg, &def->values[PS_KEY_TYPE].origin,
                                "[%s] is a limit adaptor and needs `limit = SIZE` (or a percentage)", section);
    }
}

/* Edges of the resource graph: upstream, fallback, bins. */
static size_t edges_of(const ps_resource_def_t *def, int *out, size_t max)
{
    size_t n = 0;
    if (def->upstream >= 0 && n < max)
        out[n++] = def->upstream;
    if (def->fallback >= 0 && n < max)
        out[n++] = def->fallback;
    for (size_t b = 0; b < def->bin_count && n < max; b++)
        if (def->bins[b].resource >= 0)
            out[n++] = def->bins[b].resource;
    return n;
}

static void find_cycles_from(ps_config_t *cfg, int d, int *color, int *path, size_t depth)
{
    color[d] = 1; /* on the current path */
    path[depth] = d;
    int next[66];
    size_t n = edges_of(&cfg->defs[d], next, 66);
    for (size_t i = 0; i < n; i++) {
        int e = next[i];
        if (color[e] == 1) {
            char text[1024] = "";
            size_t start = 0;
            while (path[start] != e)
                start++;
            for (size_t k = start; k <= depth; k++)
                snprintf(text + strlen(text), sizeof text - strlen(text), "%s -> ",
                         cfg->defs[path[k]].name);
            snprintf(text + strlen(text), sizeof text - strlen(text), "%s", cfg->defs[e].name);
            const ps_resource_def_t *first = &cfg->defs[path[start]];
            const ps_origin_t *o = first->values[PS_KEY_UPSTREAM].set ? &first->values[PS_KEY_UPSTREAM].origin
                                                                        : &first->origin;
            ps_config_add_error(cfg, o, "upstream cycle: %s (a resource cannot take memory from itself)", text);
        } else if (color[e] == 0) {
            find_cycles_from(cfg, e, color, path, depth + 1);
        }
    }
    color[d] = 2; /* done */
}

void ps_config_find_cycles(ps_config_t *cfg)
{
    int *color = calloc(cfg->def_count + 1, sizeof *color);
    int *path = calloc(cfg->def_count + 1, sizeof *path);
    if (!color || !path) {
        cfg->out_of_memory = 1;
    } else {
        for (size_t d = 0; d < cfg->def_count; d++)
            if (color[d] == 0)
                find_cycles_from(cfg, (int)d, color, path, 0);
    }
    free(color);
    free(path);
}
