/* The settings store: every raw value as a source gave it (section, key,
 * text, origin, layer), merged key by key, a later layer replacing an
 * earlier one; a key set twice in one file is an error. Also what every
 * part of loading shares: the config's allocation helpers (which note
 * running out of memory instead of failing), interned strings, origins
 * and the error list ("WHERE: MESSAGE", sorted later by place).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

/* ---- memory helpers ------------------------------------------------------------ */
void *ps_config_grow(ps_config_t *cfg, void *array, size_t *cap, size_t count, size_t elem)
{
    if (count < *cap)
        return array;
    size_t ncap = *cap ? *cap * 2 : 16;
    void *n = realloc(array, ncap * elem);
    if (!n) {
        cfg->out_of_memory = 1;
        return NULL;
    }
    *cap = ncap;
    return n;
}

char *ps_config_strdup(ps_config_t *cfg, const char *s)
{
    char *d = strdup(s ? s : "");
    if (!d)
        cfg->out_of_memory = 1;
    return d;
}

const char *ps_config_intern(ps_config_t *cfg, const char *s)
{
    if (!s)
        return NULL;
    for (size_t i = 0; i < cfg->string_count; i++)
        if (strcmp(cfg->strings[i], s) == 0)
            return cfg->strings[i];
    char **n = ps_config_grow(cfg, cfg->strings, &cfg->string_cap, cfg->string_count, sizeof *n);
    if (!n)
        return "?";
    cfg->strings = n;
    char *d = ps_config_strdup(cfg, s);
    if (!d)
        return "?";
    cfg->strings[cfg->string_count++] = d;
    return d;
}

char *ps_origin_format(const ps_origin_t *origin, char *buf, size_t size)
{
    if (!origin) {
        snprintf(buf, size, "config");
        return buf;
    }
    switch (origin->kind) {
    case PS_ORIGIN_NONE: snprintf(buf, size, "default"); break;
    case PS_ORIGIN_EMBEDDED: snprintf(buf, size, "default.ini:%d", origin->line); break;
    case PS_ORIGIN_FILE:
        if (origin->line > 0)
            snprintf(buf, size, "%s:%d", origin->source, origin->line);
        else
            snprintf(buf, size, "%s", origin->source);
        break;
    case PS_ORIGIN_ENV:
        if (origin->line > 0)
            snprintf(buf, size, "%s item %d", origin->source, origin->line);
        else
            snprintf(buf, size, "%s", origin->source);
        break;
    }
    return buf;
}

void ps_config_add_error(ps_config_t *cfg, const ps_origin_t *origin, const char *fmt, ...)
{
    char where[PS_PATH_MAX + 64], message[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    ps_origin_format(origin, where, sizeof where);
    size_t len = strlen(where) + strlen(message) + 3;
    char *line = malloc(len);
    size_t cap = cfg->error_cap;
    char **n = ps_config_grow(cfg, cfg->errors, &cap, cfg->error_count, sizeof *n);
    if (n)
        cfg->errors = n;
    size_t cap2 = cfg->error_cap;
    uint64_t *order = ps_config_grow(cfg, cfg->error_order, &cap2, cfg->error_count, sizeof *order);
    if (order)
        cfg->error_order = order;
    if (!line || !n || !order) {
        free(line);
        cfg->out_of_memory = 1;
        return;
    }
    cfg->error_cap = cap;
    snprintf(line, len, "%s: %s", where, message);
    /* sorted later by where they are: embedded, file (by line), environment */
    cfg->error_order[cfg->error_count] =
        origin ? ((uint64_t)origin->kind << 32) | (uint32_t)origin->line : 0;
    cfg->errors[cfg->error_count++] = line;
}

void ps_config_add_warning(ps_config_t *cfg, const char *fmt, ...)
{
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    char **n = realloc(cfg->warnings, (cfg->warning_count + 1) * sizeof *n);
    char *copy = strdup(message);
    if (n)
        cfg->warnings = n;
    if (!n || !copy) {
        free(copy);
        cfg->out_of_memory = 1;
        return;
    }
    cfg->warnings[cfg->warning_count++] = copy;
}

/* ---- the store ----------------------------------------------------------------- */
const ps_setting_t *ps_config_find(const ps_config_t *cfg, const char *section, const char *key)
{
    for (size_t i = 0; i < cfg->setting_count; i++)
        if (strcmp(cfg->settings[i].section, section) == 0 && strcmp(cfg->settings[i].key, key) == 0)
            return &cfg->settings[i];
    return NULL;
}

void ps_config_set(ps_config_t *cfg, const char *section, const char *key, const char *value,
                   const ps_origin_t *origin, int layer)
{
    ps_setting_t *s = (ps_setting_t *)ps_config_find(cfg, section, key);
    if (s) {
        if (s->layer == layer && origin->kind != PS_ORIGIN_ENV && s->origin.kind == origin->kind &&
            s->origin.source == origin->source) {
            ps_config_add_error(cfg, origin, "`%s` is set twice in [%s] (first at line %d)", key,
                                section, s->origin.line);
            return;
        }
        if (s->layer > layer)
            return; /* a later layer already set it */
        char *v = ps_config_strdup(cfg, value);
        if (!v)
            return;
        free(s->value);
        s->value = v;
        s->origin = *origin;
        s->layer = layer;
        return;
    }
    ps_setting_t *n = ps_config_grow(cfg, cfg->settings, &cfg->setting_cap, cfg->setting_count, sizeof *n);
    if (!n)
        return;
    cfg->settings = n;
    ps_setting_t *e = &cfg->settings[cfg->setting_count];
    e->section = ps_config_strdup(cfg, section);
    e->key = ps_config_strdup(cfg, key);
    e->value = ps_config_strdup(cfg, value);
    e->origin = *origin;
    e->layer = layer;
    if (!e->section || !e->key || !e->value) {
        free(e->section);
        free(e->key);
        free(e->value);
        return;
    }
    cfg->setting_count++;
}

/* Where section `section` was opened: its header in the most important
 * source that has one, else the origin of `fallback`. */
const ps_origin_t *ps_config_section_origin(const ps_config_t *cfg, const char *section,
                                            const ps_origin_t *fallback)
{
    const ps_setting_t *best = NULL;
    for (size_t i = 0; i < cfg->header_count; i++)
        if (strcmp(cfg->headers[i].section, section) == 0 && (!best || cfg->headers[i].layer > best->layer))
            best = &cfg->headers[i];
    return best ? &best->origin : fallback;
}
