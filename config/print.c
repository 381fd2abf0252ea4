/* ps_config_print: the effective configuration of one device, as a tree.
 *
 * Steps:
 *   1. print [global], every key with its value and origin;
 *   2. print the device's stack top first: the global adaptors (log, stats),
 *      then the device's resource, then, indented, its upstream (and a
 *      binning's bins and fallback), down to the leaves;
 *   3. every key of a resource's type is shown: a set one with file:line
 *      (or the environment variable), an unset one with the value the
 *      builder would use and "(default)". Sizes read as everywhere else
 *      (2.00 MiB); percentages stay percentages: no device is asked.
 * A resource shared by two parents is printed in full once, then as
 * "(shown above)".
 */
#include <stdbool.h>
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

/* A size as docs/config.md writes it: 0, 256, 64KiB, 2MiB, 1GiB. */
static void doc_size(char *buf, size_t size, uint64_t bytes)
{
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    for (int u = 0; u < 4; u++) {
        uint64_t unit = (uint64_t)1 << (10 * (4 - u));
        if (bytes && bytes % unit == 0) {
            snprintf(buf, size, "%llu%s", (unsigned long long)(bytes / unit), units[u]);
            return;
        }
    }
    snprintf(buf, size, "%llu", (unsigned long long)bytes);
}

char *ps_value_text(ps_value_kind_t kind, uint64_t value, const char *text, const char *const *words,
                    const char *shown, int doc, char *buf, size_t size)
{
    char plain[PS_PATH_MAX + 8];
    int special = value == 0;
    switch (kind) {
    case PS_VALUE_BOOL:
    case PS_VALUE_BOOL_AUTO:
        special = kind == PS_VALUE_BOOL_AUTO ? (int64_t)value < 0 : 0;
        snprintf(plain, sizeof plain, "%s", words ? words[value != 0] : value ? "1" : "0");
        break;
    case PS_VALUE_WORD:
    case PS_VALUE_WORD_OR_BOOL:
    case PS_VALUE_FREE_SYNC:
        snprintf(plain, sizeof plain, "%s", (kind == PS_VALUE_FREE_SYNC ? ps_free_sync_words : words)[value]);
        break;
    case PS_VALUE_SIZE:
    case PS_VALUE_SIZE_PCT:
    case PS_VALUE_ALIGN:
    case PS_VALUE_THRESHOLD:
        if (kind == PS_VALUE_THRESHOLD) {
            special = value == UINT64_MAX;
            if (special) {
                snprintf(plain, sizeof plain, "max");
                break;
            }
        }
        if (doc)
            doc_size(plain, sizeof plain, value);
        else
            ps_format_bytes(plain, sizeof plain, value);
        break;
    case PS_VALUE_NUMBER:
    case PS_VALUE_WORD_OR_NUMBER: snprintf(plain, sizeof plain, "%llu", (unsigned long long)value); break;
    default: /* names, file names, bins, types: the text */
        special = !text || !*text;
        snprintf(plain, sizeof plain, "%s", text ? text : "");
        break;
    }
    if (shown && strstr(shown, "%s"))
        snprintf(buf, size, shown, plain);
    else
        snprintf(buf, size, "%s", shown && special ? shown : plain);
    return buf;
}

static bool is_size(ps_value_kind_t kind)
{
    return kind == PS_VALUE_SIZE || kind == PS_VALUE_SIZE_PCT || kind == PS_VALUE_ALIGN ||
           kind == PS_VALUE_THRESHOLD;
}

/* [global], [host] or [debug]: every key with its value and origin. */
static void print_section(const ps_config_t *cfg, FILE *f, ps_section_t section)
{
    const ps_section_info_t *sec = &ps_sections[section];
    const ps_origin_t *origins = ps_section_origins((ps_config_t *)cfg, section);
    char value[PS_PATH_MAX + 8];
    fprintf(f, "%s[%s]\n", section == PS_SECTION_GLOBAL ? "" : "\n", sec->name);
    for (int k = 0; k < sec->count; k++) {
        const ps_setting_info_t *info = &sec->keys[k];
        const char *text = (const char *)&cfg->global + info->field.offset;
        ps_value_text(info->kind, ps_field_load(&cfg->global, &info->field), text, info->words, info->shown, 0,
                      value, sizeof value);
        print_line(f, 0, info->name, value, &origins[k], NULL);
    }
}

/* The value the builder uses for an unset key: the option it lands in, as
 * the builder fills it (ps_config_pool_options...), else its default. */
static void default_text(const ps_config_t *cfg, const ps_resource_def_t *def, int key, char *buf,
                         size_t size)
{
    ps_pool_options_t pool;
    ps_arena_options_t arena;
    ps_fixed_size_options_t fixed;
    const void *opts = NULL;
    if (def->type == PS_TYPE_POOL)
        ps_config_pool_options(cfg, def, 0, &pool), opts = &pool;
    else if (def->type == PS_TYPE_ARENA)
        ps_config_arena_options(cfg, def, 0, &arena), opts = &arena;
    else if (def->type == PS_TYPE_FIXED_SIZE)
        ps_config_fixed_size_options(cfg, def, &fixed), opts = &fixed;
    const ps_key_info_t *info = &ps_key_info[key];
    const ps_field_t *field = ps_key_field(key, def->type);
    uint64_t value = field ? ps_field_load(opts, field) : info->default_value;
    ps_value_text(info->kind, value, "(unset)", NULL, info->shown, 0, buf, size);
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
    ps_key_mask_t keys = def->type < PS_TYPE_COUNT ? ps_type_keys(def->type) : 0;
    for (int k = 0; k < PS_KEY_COUNT; k++) {
        if (k == PS_KEY_TYPE || k == PS_KEY_UPSTREAM || k == PS_KEY_FALLBACK || !(keys & PS_KEY_BIT(k)))
            continue;
        const ps_value_t *v = &def->values[k];
        if (v->set && is_size(ps_key_info[k].kind) && !v->is_percent) {
            char value[64];
            ps_value_text(ps_key_info[k].kind, v->number, v->text, NULL, ps_key_info[k].shown, 0, value, sizeof value);
            print_line(f, inner, ps_key_names[k], value, &v->origin, NULL);
        } else if (v->set) {
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
    for (int section = 0; section < PS_SECTION_COUNT; section++)
        print_section(cfg, f, (ps_section_t)section);
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
