/* Validation: turns the merged settings store into the validated [global],
 * resource definitions and device sections, recording every error.
 *
 * Steps (ps_config_validate):
 *   1. [global], [host] and [debug]: the defaults of config/keys.def, then
 *      each key read by the kind of its row, checked, stored in its field;
 *   2. unknown sections;
 *   3. every [resource.NAME] becomes a def (type first, then its keys);
 *      the predefined leaves cuda, async and managed exist without one;
 *   4. [device.N] / [device.*];
 *   5. names and cycles (resolve.c);
 *   6. sizes against each other (maximum vs initial, chunk bounds, limits);
 *   7. the errors sorted by place: embedded, file by line, environment.
 * Every error is recorded as "WHERE: MESSAGE" and the walk goes on, so one
 * run shows all of them; unknown words get a suggestion.
 * Guarantees: no error stops the walk; nothing here touches CUDA; if
 * memory runs out, the config says so (one error) rather than crashing.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

static int add_def(ps_config_t *cfg, const char *name, const ps_origin_t *origin)
{
    ps_resource_def_t *n = ps_config_grow(cfg, cfg->defs, &cfg->def_cap, cfg->def_count, sizeof *n);
    if (!n)
        return -1;
    cfg->defs = n;
    ps_resource_def_t *d = &cfg->defs[cfg->def_count];
    memset(d, 0, sizeof *d);
    d->name = ps_config_strdup(cfg, name);
    if (!d->name)
        return -1;
    d->type = PS_TYPE_COUNT; /* unknown until its `type` is read */
    d->origin = *origin;
    d->upstream = -1;
    d->fallback = -1;
    return (int)cfg->def_count++;
}

static int valid_name(const char *name)
{
    if (!*name)
        return 0;
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-')
            return 0;
    return 1;
}

/* No device or host has 256 TiB of memory: a larger size is a typo (or
 * 2^64 - 1 meaning "no cap", which is 0 in every key that has a cap), and
 * refusing it keeps sums and products of sizes far from overflow. */
#define CONFIG_SIZE_MAX ((uint64_t)256 << 40)

/* ps_parse_size_ex for a configuration value, bounded by CONFIG_SIZE_MAX. */
static int config_size(const char *text, int allow_percent, uint64_t *bytes, double *percent, int *is_percent,
                       char *why, size_t why_size)
{
    int rc = ps_parse_size_ex(text, allow_percent, bytes, percent, is_percent, why, why_size);
    if ((rc != PS_OK && why && strncmp(why, "too large", 9) == 0) ||
        (rc == PS_OK && !*is_percent && *bytes > CONFIG_SIZE_MAX)) {
        if (why)
            snprintf(why, why_size, "too large (at most 256TiB)");
        return PS_EINVAL;
    }
    return rc;
}

/* "bad value `x` for `key` in [section]: why (expected ...)" */
static void bad_value(ps_config_t *cfg, const ps_setting_t *s, const char *why, const char *expect)
{
    ps_config_add_error(cfg, &s->origin, "bad value `%s` for `%s` in [%s]: %s (expected %s)",
                        s->value, s->key, s->section, why, expect);
}

/* A boolean that is none of the spellings; a short-form variable
 * (POOLSHIM_NVTX=maybe) is named with its value, as the shim's early
 * reads of booleans name theirs (ps_env_bool). */
static void bad_bool(ps_config_t *cfg, const ps_setting_t *s)
{
    if (s->origin.kind == PS_ORIGIN_ENV && s->origin.line == 0 && s->origin.source) {
        char named[PS_PATH_MAX];
        snprintf(named, sizeof named, "%s=%s", s->origin.source, s->value);
        ps_origin_t o = {PS_ORIGIN_ENV, ps_config_intern(cfg, named), 0};
        ps_config_add_error(cfg, &o, "expected " PS_BOOL_EXPECTED);
        return;
    }
    bad_value(cfg, s, "not a boolean", PS_EXPECT_BOOL);
}

/* The off switch never stops a program: an empty value is no value (the
 * shim stays on, as for `export POOLSHIM_DISABLE=$X` with X unset), and a
 * value that is no boolean turns the shim off with one warning, since the
 * user reached for the switch. Returns the value to store. */
static int disable_not_boolean(ps_config_t *cfg, const ps_setting_t *s)
{
    if (strspn(s->value, " \t") == strlen(s->value))
        return 0;
    char where[PS_PATH_MAX + 64], place[PS_PATH_MAX + 64];
    if (s->origin.kind == PS_ORIGIN_ENV && s->origin.line == 0 && s->origin.source)
        snprintf(where, sizeof where, "%s=%s", s->origin.source, s->value);
    else
        snprintf(where, sizeof where, "%s: disable = %s", ps_origin_format(&s->origin, place, sizeof place),
                 s->value);
    ps_config_add_warning(cfg, "%s: not one of " PS_BOOL_EXPECTED "; taken as 1: every call passes through "
                          "to CUDA (0 keeps the shim on)", where);
    return 1;
}

/* One key of [global], [host] or [debug], read by the kind of its row in
 * config/keys.def, checked, and stored in its field of ps_global_config_t. */
static void validate_setting(ps_config_t *cfg, ps_section_t section, const ps_setting_t *s)
{
    const ps_section_info_t *sec = &ps_sections[section];
    int key = ps_parse_word(s->key, sec->names);
    if (key < 0 || strcmp(s->key, sec->names[key]) != 0) {
        const char *near = ps_nearest_word(s->key, sec->names);
        if (near) {
            ps_config_add_error(cfg, &s->origin, "unknown key `%s` in [%s] (did you mean `%s`?)", s->key,
                                sec->name, near);
        } else {
            char known[1024] = "";
            for (int k = 0; k < sec->count; k++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "",
                         sec->names[k]);
            ps_config_add_error(cfg, &s->origin, "unknown key `%s` in [%s] (known keys: %s)", s->key, sec->name,
                                known);
        }
        return;
    }
    const ps_setting_info_t *info = &sec->keys[key];
    const char *const *words = info->kind == PS_VALUE_FREE_SYNC ? ps_free_sync_words : info->words;
    char why[128] = "";
    uint64_t value = 0;
    double pct;
    int is_pct, w, b;
    switch (info->kind) {
    case PS_VALUE_BOOL:
    case PS_VALUE_BOOL_AUTO:
        if (section == PS_SECTION_GLOBAL && key == PS_GKEY_DISABLE && ps_parse_bool(s->value, &b) != PS_OK)
            b = disable_not_boolean(cfg, s);
        else if (ps_parse_bool(s->value, &b) != PS_OK)
            return bad_bool(cfg, s);
        value = (uint64_t)b;
        break;
    case PS_VALUE_WORD:
    case PS_VALUE_FREE_SYNC:
    case PS_VALUE_WORD_OR_NUMBER:
    case PS_VALUE_WORD_OR_BOOL:
        if ((w = ps_parse_word(s->value, words)) >= 0)
            value = (uint64_t)w;
        else if (info->kind == PS_VALUE_WORD_OR_NUMBER && ps_parse_uint(s->value, info->max, &value, why, sizeof why) == PS_OK)
            break;
        else if (info->kind == PS_VALUE_WORD_OR_BOOL && ps_parse_bool(s->value, &b) == PS_OK)
            value = (uint64_t)b;
        else
            return bad_value(cfg, s, info->why, info->expect);
        break;
    case PS_VALUE_SIZE:
        if (config_size(s->value, 0, &value, &pct, &is_pct, why, sizeof why) != PS_OK)
            return bad_value(cfg, s, why, info->expect);
        break;
    case PS_VALUE_NUMBER:
        if (ps_parse_uint(s->value, info->max, &value, why, sizeof why) != PS_OK)
            return bad_value(cfg, s, why, info->expect);
        break;
    case PS_VALUE_PATH:
    case PS_VALUE_PATH_NO_DEVICE:
        if (ps_check_path_pattern(s->value, info->kind == PS_VALUE_PATH, why, sizeof why) != PS_OK)
            return bad_value(cfg, s, why, info->expect);
        if (strlen(s->value) >= PS_PATH_MAX)
            return bad_value(cfg, s, "too long", "a file name shorter than 4096 bytes");
        snprintf((char *)&cfg->global + info->field.offset, info->field.size, "%s", s->value);
        ps_section_origins(cfg, section)[key] = s->origin;
        return;
    default: return;
    }
    const char *expect = info->expect;
    const char *refused = info->check ? info->check(value, &expect) : NULL;
    if (refused)
        return bad_value(cfg, s, refused, expect);
    ps_field_store(&cfg->global, &info->field, value);
    ps_section_origins(cfg, section)[key] = s->origin;
}

/* Parses a binning `bins` list into def->bins (names resolved later). */
static void parse_bins(ps_config_t *cfg, ps_resource_def_t *def, const ps_setting_t *s)
{
    const char *expect = ps_key_info[PS_KEY_BINS].expect;
    char *copy = ps_config_strdup(cfg, s->value);
    if (!copy)
        return;
    size_t count = 1;
    for (const char *p = copy; *p; p++)
        count += *p == ',';
    ps_bin_def_t *bins = calloc(count, sizeof *bins);
    if (!bins) {
        cfg->out_of_memory = 1;
        free(copy);
        return;
    }
    size_t n = 0;
    int ok = 1;
    char *item = copy;
    for (size_t i = 0; i < count && ok; i++) {
        char *comma = strchr(item, ',');
        if (comma)
            *comma = '\0';
        char *t = ps_trim_blanks(item);
        char *colon = strchr(t, ':');
        const char *size_text = t;
        const char *name = "";
        if (colon) {
            *colon = '\0';
            name = ps_trim_blanks(t);
            size_text = colon + 1;
            if (!valid_name(name)) {
                char why[128];
                snprintf(why, sizeof why, "bin %zu: `%s` is not a resource name", i + 1, name);
                bad_value(cfg, s, why, expect);
                ok = 0;
                break;
            }
        }
        uint64_t bytes = 0;
        double pct;
        int is_pct;
        char why[160], reason[128];
        if (*ps_trim_blanks((char *)size_text) == '\0') {
            snprintf(why, sizeof why, "bin %zu is empty", i + 1);
            bad_value(cfg, s, why, expect);
            ok = 0;
        } else if (config_size(size_text, 0, &bytes, &pct, &is_pct, reason, sizeof reason) != PS_OK) {
            snprintf(why, sizeof why, "bin %zu `%s`: %s", i + 1, ps_trim_blanks((char *)size_text), reason);
            bad_value(cfg, s, why, expect);
            ok = 0;
        } else if (bytes == 0) {
            snprintf(why, sizeof why, "bin %zu has size zero", i + 1);
            bad_value(cfg, s, why, expect);
            ok = 0;
        } else {
            bins[n].max_size = bytes;
            bins[n].resource = -1;
            bins[n].name = ps_config_strdup(cfg, name);
            n++;
        }
        item = comma ? comma + 1 : item + strlen(item);
    }
    free(copy);
    if (ok) {
        for (size_t i = 1; i < n && ok; i++) {
            if (bins[i].max_size <= bins[i - 1].max_size) {
                char a[32], b[32];
                ps_format_bytes(a, sizeof a, bins[i].max_size);
                ps_format_bytes(b, sizeof b, bins[i - 1].max_size);
                ps_config_add_error(cfg, &s->origin,
                                    "bins of [%s] must be sorted by size, strictly increasing: bin %zu (%s) %s bin %zu (%s)",
                                    s->section, i + 1, a,
                                    bins[i].max_size == bins[i - 1].max_size ? "overlaps" : "is below",
                                    i, b);
                ok = 0;
            }
        }
    }
    if (!ok) {
        for (size_t i = 0; i < n; i++)
            free(bins[i].name);
        free(bins);
        return;
    }
    def->bins = bins;
    def->bin_count = n;
}

static void validate_resource_key(ps_config_t *cfg, ps_resource_def_t *def, const ps_setting_t *s,
                                  int type_layer)
{
    int key = ps_parse_word(s->key, ps_key_names);
    if (key < 0 || strcmp(s->key, ps_key_names[key]) != 0) {
        /* suggest among the keys of this type first */
        const char *words[PS_KEY_COUNT + 1];
        size_t n = 0;
        ps_key_mask_t mask = def->type < PS_TYPE_COUNT ? ps_type_keys(def->type) : ~(ps_key_mask_t)0;
        for (int k = 0; k < PS_KEY_COUNT; k++)
            if (mask & PS_KEY_BIT(k))
                words[n++] = ps_key_names[k];
        words[n] = NULL;
        const char *near = ps_nearest_word(s->key, words);
        if (!near)
            near = ps_nearest_word(s->key, ps_key_names);
        if (near)
            ps_config_add_error(cfg, &s->origin, "unknown key `%s` in [%s] (did you mean `%s`?)",
                                s->key, s->section, near);
        else
            ps_config_add_error(cfg, &s->origin, "unknown key `%s` in [%s]", s->key, s->section);
        return;
    }
    if (key == PS_KEY_TYPE)
        return;
    if (def->type >= PS_TYPE_COUNT)
        return; /* the type is wrong: already reported */
    if (!(ps_type_keys(def->type) & PS_KEY_BIT(key))) {
        if (s->layer < type_layer)
            return; /* set for the type an earlier source gave; a later source changed the type */
        if (key == PS_KEY_UPSTREAM && ps_type_is_leaf(def->type)) {
            ps_config_add_error(cfg, &s->origin,
                                "[%s] is of type %s, which takes memory from the device and has no upstream",
                                s->section, ps_type_names[def->type]);
            return;
        }
        char list[512] = "";
        ps_key_mask_t mask = ps_type_keys(def->type) & ~PS_KEY_BIT(PS_KEY_TYPE);
        for (int k = 0; k < PS_KEY_COUNT; k++)
            if (mask & PS_KEY_BIT(k))
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", *list ? ", " : "",
                         ps_key_names[k]);
        ps_config_add_error(cfg, &s->origin, "key `%s` does not apply to type %s in [%s] (%s takes %s)",
                            s->key, ps_type_names[def->type], s->section, ps_type_names[def->type],
                            *list ? list : "no keys");
        return;
    }
    const ps_key_info_t *info = &ps_key_info[key];
    ps_value_t *v = &def->values[key];
    ps_value_t parsed = {1, s->origin, ps_config_intern(cfg, s->value), 0, 0, 0};
    char why[160] = "";
    switch (info->kind) {
    case PS_VALUE_NAME:
        if (!valid_name(s->value))
            return bad_value(cfg, s, "not a resource name", "letters, digits, '_' or '-'");
        break;
    case PS_VALUE_SIZE:
    case PS_VALUE_SIZE_PCT:
    case PS_VALUE_ALIGN:
    case PS_VALUE_THRESHOLD:
        if (info->kind == PS_VALUE_THRESHOLD && (strcasecmp(s->value, "max") == 0)) {
            parsed.number = UINT64_MAX;
            break;
        }
        if (config_size(s->value, info->kind == PS_VALUE_SIZE_PCT || info->kind == PS_VALUE_THRESHOLD,
                        &parsed.number, &parsed.percent, &parsed.is_percent, why, sizeof why) != PS_OK)
            return bad_value(cfg, s, why, info->expect);
        if (info->nonzero && (parsed.is_percent ? parsed.percent <= 0 : parsed.number == 0))
            return bad_value(cfg, s, "zero is not allowed", info->expect);
        if (info->kind == PS_VALUE_ALIGN && (!ps_is_pow2(parsed.number) || parsed.number < 256))
            return bad_value(cfg, s,
                             ps_is_pow2(parsed.number) ? "below 256 (cudaMalloc guarantees 256)"
                                                       : "not a power of two",
                             info->expect);
        break;
    case PS_VALUE_NUMBER:
        if (ps_parse_uint(s->value, info->max, &parsed.number, why, sizeof why) != PS_OK)
            return bad_value(cfg, s, why, info->expect);
        if (info->nonzero && parsed.number == 0)
            return bad_value(cfg, s, "zero is not allowed", info->expect);
        break;
    case PS_VALUE_FREE_SYNC: {
        int w = ps_parse_word(s->value, ps_free_sync_words);
        if (w < 0)
            return bad_value(cfg, s, "not a policy", info->expect);
        parsed.number = (uint64_t)w;
        break;
    }
    case PS_VALUE_BINS: parse_bins(cfg, def, s); break;
    case PS_VALUE_PATH:
        if (!*s->value)
            return bad_value(cfg, s, "empty file name", info->expect);
        if (ps_check_path_pattern(s->value, 1, why, sizeof why) != PS_OK)
            return bad_value(cfg, s, why, info->expect);
        if (strlen(s->value) >= PS_PATH_MAX)
            return bad_value(cfg, s, "too long", info->expect);
        break;
    default: break; /* the type (read first), and kinds only [global], [host], [debug] keys have */
    }
    *v = parsed;
}

/* The predefined leaves that need no section. */
static const ps_resource_type_t predefined_types[] = {PS_TYPE_CUDA, PS_TYPE_ASYNC, PS_TYPE_MANAGED};

static void validate_resources(ps_config_t *cfg)
{
    /* 1. every [resource.NAME] section becomes a def, in order of first appearance */
    for (size_t i = 0; i < cfg->header_count + cfg->setting_count; i++) {
        const ps_setting_t *s = i < cfg->header_count ? &cfg->headers[i] : &cfg->settings[i - cfg->header_count];
        if (strncmp(s->section, "resource.", 9) != 0)
            continue;
        const char *name = s->section + 9;
        if (ps_config_def_index(cfg, name) >= 0)
            continue;
        const ps_origin_t *where = ps_config_section_origin(cfg, s->section, &s->origin);
        if (!valid_name(name)) {
            ps_config_add_error(cfg, where, "bad resource name in [%s] (use letters, digits, '_' and '-')",
                                s->section);
            /* still create it so its keys are not reported again as unknown sections */
        }
        add_def(cfg, name, where);
    }
    /* 2. types */
    size_t section_defs = cfg->def_count;
    for (size_t d = 0; d < section_defs; d++) {
        ps_resource_def_t *def = &cfg->defs[d];
        char section[128];
        snprintf(section, sizeof section, "resource.%s", def->name);
        const ps_setting_t *t = ps_config_find(cfg, section, "type");
        int predefined = -1;
        for (size_t p = 0; p < 3; p++)
            if (strcmp(def->name, ps_type_names[predefined_types[p]]) == 0)
                predefined = (int)predefined_types[p];
        if (!t) {
            if (predefined >= 0) {
                def->type = (ps_resource_type_t)predefined;
                def->predefined = 1;
                continue;
            }
            ps_config_add_error(cfg, &def->origin,
                                "[%s] has no `type` (expected type = pool, arena, fixed_size, binning, cuda, async, managed, limit, stats, track or log)",
                                section);
            continue;
        }
        int type = ps_parse_word(t->value, ps_type_names);
        if (type < 0) {
            const char *near = ps_nearest_word(t->value, ps_type_names);
            if (near)
                ps_config_add_error(cfg, &t->origin, "unknown type `%s` in [%s] (did you mean `%s`?)",
                                    t->value, section, near);
            else
                ps_config_add_error(cfg, &t->origin, "unknown type `%s` in [%s] (expected %s)", t->value,
                                    section, ps_key_info[PS_KEY_TYPE].expect);
            continue;
        }
        if (predefined >= 0 && type != predefined) {
            ps_config_add_error(cfg, &t->origin,
                                "the name `%s` is reserved for the built-in resource of type %s; give this %s another name",
                                def->name, def->name, ps_type_names[type]);
            continue;
        }
        def->type = (ps_resource_type_t)type;
        def->values[PS_KEY_TYPE] = (ps_value_t){1, t->origin, ps_config_intern(cfg, t->value), (uint64_t)type, 0, 0};
    }
    /* 3. keys */
    for (size_t i = 0; i < cfg->setting_count; i++) {
        const ps_setting_t *s = &cfg->settings[i];
        if (strncmp(s->section, "resource.", 9) != 0)
            continue;
        int d = ps_config_def_index(cfg, s->section + 9);
        if (d < 0)
            continue;
        ps_resource_def_t *def = &cfg->defs[d];
        int type_layer = def->values[PS_KEY_TYPE].set ? 0 : -1;
        if (type_layer == 0) {
            const ps_setting_t *t = ps_config_find(cfg, s->section, "type");
            type_layer = t ? t->layer : 0;
        }
        validate_resource_key(cfg, def, s, type_layer);
    }
    /* 4. the predefined leaves exist even without a section */
    for (size_t p = 0; p < 3; p++) {
        const char *name = ps_type_names[predefined_types[p]];
        if (ps_config_def_index(cfg, name) >= 0)
            continue;
        ps_origin_t none = {PS_ORIGIN_NONE, NULL, 0};
        int d = add_def(cfg, name, &none);
        if (d >= 0) {
            cfg->defs[d].type = predefined_types[p];
            cfg->defs[d].predefined = 1;
        }
    }
}

static void validate_devices(ps_config_t *cfg)
{
    for (size_t i = 0; i < cfg->setting_count; i++) {
        const ps_setting_t *s = &cfg->settings[i];
        if (strncmp(s->section, "device.", 7) != 0)
            continue;
        const char *index = s->section + 7;
        int device = -1;
        if (strcmp(index, "*") != 0) {
            uint64_t n;
            char why[64];
            if (ps_parse_uint(index, 1023, &n, why, sizeof why) != PS_OK || strchr(index, ' ')) {
                int reported = 0;
                for (size_t j = 0; j < i && !reported; j++)
                    reported = strcmp(cfg->settings[j].section, s->section) == 0;
                if (!reported)
                    ps_config_add_error(cfg, ps_config_section_origin(cfg, s->section, &s->origin),
                                        "device index `%s` in [%s] is not a number (expected [device.N] with N = 0, 1, ..., or [device.*])",
                                        index, s->section);
                continue;
            }
            device = (int)n;
        }
        if (strcmp(s->key, "resource") != 0) {
            static const char *const words[] = {"resource", NULL};
            const char *near = ps_nearest_word(s->key, words);
            ps_config_add_error(cfg, &s->origin, "unknown key `%s` in [%s] (%s)", s->key, s->section,
                                near ? "did you mean `resource`?" : "the only key is `resource`");
            continue;
        }
        ps_device_def_t *n = ps_config_grow(cfg, cfg->devices, &cfg->device_cap, cfg->device_count, sizeof *n);
        if (!n)
            return;
        cfg->devices = n;
        int r = ps_config_def_index(cfg, s->value);
        if (r < 0) {
            const char *names[64];
            size_t k = 0;
            for (size_t d = 0; d < cfg->def_count && k < 63; d++)
                names[k++] = cfg->defs[d].name;
            names[k] = NULL;
            const char *near = ps_nearest_word(s->value, names);
            ps_config_add_error(cfg, &s->origin, "[%s] uses resource `%s`, which is not defined%s%s%s",
                                s->section, s->value, near ? " (did you mean `" : "", near ? near : "",
                                near ? "`?)" : " (add a [resource.NAME] section)");
        }
        cfg->devices[cfg->device_count++] = (ps_device_def_t){device, r, s->origin};
    }
}

static void check_sections(ps_config_t *cfg)
{
    static const char *const sections[] = {"global", "resource", "device", "host", "debug", NULL};
    for (size_t i = 0; i < cfg->header_count + cfg->setting_count; i++) {
        const ps_setting_t *s = i < cfg->header_count ? &cfg->headers[i] : &cfg->settings[i - cfg->header_count];
        if (strcmp(s->section, "global") == 0 || strcmp(s->section, "host") == 0 ||
            strcmp(s->section, "debug") == 0 || strncmp(s->section, "resource.", 9) == 0 ||
            strncmp(s->section, "device.", 7) == 0)
            continue;
        /* report each unknown section once, at its header when it has one */
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++) {
            const ps_setting_t *o = j < cfg->header_count ? &cfg->headers[j] : &cfg->settings[j - cfg->header_count];
            seen = strcmp(o->section, s->section) == 0;
        }
        if (seen)
            continue;
        const ps_origin_t *where = ps_config_section_origin(cfg, s->section, &s->origin);
        char head[64];
        snprintf(head, sizeof head, "%.*s", (int)strcspn(s->section, "."), s->section);
        const char *near = ps_nearest_word(head, sections);
        const char *rest = s->section + strlen(head);
        if (near && strcmp(near, "global") == 0)
            ps_config_add_error(cfg, where, "unknown section [%s] (did you mean [global]?)", s->section);
        else if (near && *rest == '.')
            ps_config_add_error(cfg, where, "unknown section [%s] (did you mean [%s%s]?)", s->section, near,
                                rest);
        else if (near && strcmp(near, "resource") == 0)
            ps_config_add_error(cfg, where, "unknown section [%s] (did you mean [resource.NAME]?)",
                                s->section);
        else if (near)
            ps_config_add_error(cfg, where, "unknown section [%s] (did you mean [device.N] or [device.*]?)",
                                s->section);
        else
            ps_config_add_error(cfg, where,
                                "unknown section [%s] (expected [global], [resource.NAME], [device.N] or [device.*])",
                                s->section);
    }
}

uint64_t ps_value_bytes(const ps_value_t *v, uint64_t total_bytes)
{
    if (!v->set)
        return 0;
    if (!v->is_percent)
        return v->number;
    return (uint64_t)((double)total_bytes * v->percent / 100.0);
}

/* Compares two size values; returns 1 when a < b is known (both bytes, both
 * percentages, or total known). */
static int known_below(const ps_value_t *a, const ps_value_t *b, uint64_t total)
{
    if (a->is_percent == b->is_percent)
        return a->is_percent ? a->percent < b->percent : a->number < b->number;
    if (total == 0)
        return 0;
    return ps_value_bytes(a, total) < ps_value_bytes(b, total);
}

static void check_sizes(ps_config_t *cfg)
{
    for (size_t d = 0; d < cfg->def_count; d++) {
        ps_resource_def_t *def = &cfg->defs[d];
        const ps_value_t *init = &def->values[PS_KEY_INITIAL_SIZE];
        const ps_value_t *max = &def->values[PS_KEY_MAXIMUM_SIZE];
        if (init->set && max->set && !(max->is_percent ? max->percent == 0 : max->number == 0) &&
            known_below(max, init, 0))
            ps_config_add_error(cfg, &max->origin,
                                "maximum_size `%s` of [resource.%s] is below its initial_size `%s`", max->text,
                                def->name, init->text);
        const ps_value_t *lo = &def->values[PS_KEY_MIN_CHUNK], *hi = &def->values[PS_KEY_MAX_CHUNK];
        if (lo->set && hi->set && hi->number < lo->number)
            ps_config_add_error(cfg, &hi->origin, "max_chunk `%s` of [resource.%s] is below its min_chunk `%s`",
                                hi->text, def->name, lo->text);
    }
}

int ps_config_check_limits(const ps_config_t *cfg, uint64_t total_bytes, const char *only,
                           ps_config_report_t report, void *ctx)
{
    int problems = 0;
    for (size_t d = 0; d < cfg->def_count; d++) {
        const ps_resource_def_t *lim = &cfg->defs[d];
        if (lim->type != PS_TYPE_LIMIT || !lim->values[PS_KEY_LIMIT].set || (only && !only[d]))
            continue;
        const ps_value_t *limit = &lim->values[PS_KEY_LIMIT];
        /* every pool/arena in a straight chain with the limit, below it
         * (dir 0) or above it (dir 1), through other adaptors */
        for (int dir = 0; dir < 2; dir++) {
            int cur = (int)d;
            for (size_t steps = 0; steps <= cfg->def_count; steps++) {
                int next = -1;
                if (dir == 0) {
                    next = cfg->defs[cur].upstream;
                } else {
                    for (size_t k = 0; k < cfg->def_count && next < 0; k++)
                        if (cfg->defs[k].upstream == cur)
                            next = (int)k;
                }
                if (next < 0)
                    break;
                const ps_resource_def_t *r = &cfg->defs[next];
                if (r->type == PS_TYPE_POOL || r->type == PS_TYPE_ARENA) {
                    const ps_value_t *init = &r->values[PS_KEY_INITIAL_SIZE];
                    int mixed = init->is_percent != limit->is_percent;
                    /* one kind: checked at load; mixed: once the device's size is known */
                    if (init->set && (total_bytes > 0) == mixed && known_below(limit, init, total_bytes)) {
                        char message[512];
                        snprintf(message, sizeof message,
                                 "limit `%s` of [resource.%s] is below the initial_size `%s` of %s [resource.%s] (%s)",
                                 limit->text, lim->name, init->text, ps_type_names[r->type], r->name,
                                 dir == 0 ? "the pool could never reserve it"
                                          : "the pool would reserve more than the limit lets the program use");
                        report(ctx, &limit->origin, message);
                        problems++;
                    }
                    break;
                }
                if (!ps_type_is_adaptor(r->type))
                    break;
                cur = next;
            }
        }
    }
    return problems;
}

static void report_to_config(void *ctx, const ps_origin_t *origin, const char *message)
{
    ps_config_add_error(ctx, origin, "%s", message);
}

void ps_config_validate(ps_config_t *cfg)
{
    ps_global_config_t *g = &cfg->global;
    memset(g, 0, sizeof *g); /* (file names: none) */
    for (int section = 0; section < PS_SECTION_COUNT; section++)
        for (int k = 0; k < ps_sections[section].count; k++)
            ps_field_store(g, &ps_sections[section].keys[k].field, ps_sections[section].keys[k].default_value);
    for (size_t i = 0; i < cfg->setting_count; i++)
        for (int section = 0; section < PS_SECTION_COUNT; section++)
            if (strcmp(cfg->settings[i].section, ps_sections[section].name) == 0)
                validate_setting(cfg, (ps_section_t)section, &cfg->settings[i]);
    if (g->host.min_chunk > g->host.max_chunk)
        ps_config_add_error(cfg, NULL, "[host] min_chunk is larger than max_chunk");
    if (g->host.stack_depth && !g->host.track)
        ps_config_add_error(cfg, NULL, "[host] stack_depth is set but track is off (set track = yes)");
    check_sections(cfg);
    validate_resources(cfg);
    validate_devices(cfg);
    ps_config_resolve_references(cfg);
    ps_config_find_cycles(cfg);
    check_sizes(cfg);
    ps_config_check_limits(cfg, 0, NULL, report_to_config, cfg);
    if (cfg->out_of_memory)
        ps_config_add_error(cfg, NULL, "out of memory while reading the configuration");
    /* in reading order: embedded, file by line, environment; stable (insertion sort: few errors) */
    for (size_t i = 1; i < cfg->error_count; i++) {
        char *text = cfg->errors[i];
        uint64_t key = cfg->error_order[i];
        size_t j = i;
        for (; j > 0 && cfg->error_order[j - 1] > key; j--) {
            cfg->errors[j] = cfg->errors[j - 1];
            cfg->error_order[j] = cfg->error_order[j - 1];
        }
        cfg->errors[j] = text;
        cfg->error_order[j] = key;
    }
}
