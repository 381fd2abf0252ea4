/* Loading the configuration: the settings store, the INI reader, the
 * POOLSHIM_OPTIONS reader, and validation.
 *
 * Algorithm:
 *   1. Every source writes raw settings (section, key, text, origin,
 *      layer) into one store. A later layer replaces the value of an
 *      earlier one; a key set twice in one file is an error.
 *   2. INI files go through libinih (ini_parse_stream) with our own line
 *      reader: the reader counts lines (Debian builds inih without
 *      INI_HANDLER_LINENO), strips leading blanks (so indented lines are
 *      never taken for inih's multi-line continuations), rejects lines
 *      longer than inih's buffer instead of letting inih split them, and
 *      checks each line's syntax the way inih will, so EVERY syntax error
 *      is reported with its line, not only the first one inih returns.
 *   3. Validation walks the merged store once: [global] keys, then every
 *      [resource.NAME] (type first, then its keys), then [device.N] /
 *      [device.*]; then it resolves names (upstream, fallback, bins,
 *      device resource), finds upstream cycles, and checks sizes against
 *      each other (maximum vs initial, chunk bounds, bin order, limits).
 *   4. Every error is recorded as "WHERE: MESSAGE" and validation goes on,
 *      so one run shows all of them. Unknown words get a suggestion.
 * Guarantees: no error stops the walk; nothing here touches CUDA; if
 * memory runs out, the config says so (one error) rather than crashing.
 */
#include <ctype.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

/* ---- names ------------------------------------------------------------------ */
const char *const ps_type_names[PS_TYPE_COUNT + 1] = {
    "pool", "arena", "fixed_size", "binning", "cuda", "async", "managed",
    "limit", "stats", "track", "log", NULL};

const char *const ps_key_names[PS_KEY_COUNT + 1] = {
    "type", "upstream", "initial_size", "maximum_size", "min_chunk", "max_chunk",
    "growth_percent", "alignment", "free_sync", "epoch_wait_us", "superblock_size",
    "block_size", "blocks_per_batch", "bins", "fallback", "release_threshold", "limit",
    "stack_depth", "file", NULL};

const char *const ps_global_key_names[PS_GKEY_COUNT + 1] = {
    "verbosity", "stats", "stats_file", "log_file", "free_sync", "meminfo", "on_error",
    "direct_min_size", "disable", NULL};

static const char *const free_sync_words[] = {"event", "device", "none", NULL};
static const char *const verbosity_words[] = {"error", "warning", "info", "debug", NULL};
static const char *const stats_words[] = {"off", "text", "json", NULL};
static const char *const meminfo_words[] = {"pool", "device", NULL};
static const char *const on_error_words[] = {"exit", "passthrough", NULL};

#define BIT(k) (1u << (k))
uint32_t ps_type_keys(ps_resource_type_t type)
{
    const uint32_t sub = BIT(PS_KEY_TYPE) | BIT(PS_KEY_UPSTREAM) | BIT(PS_KEY_ALIGNMENT) |
                         BIT(PS_KEY_FREE_SYNC);
    switch (type) {
    case PS_TYPE_POOL:
        return sub | BIT(PS_KEY_INITIAL_SIZE) | BIT(PS_KEY_MAXIMUM_SIZE) | BIT(PS_KEY_MIN_CHUNK) |
               BIT(PS_KEY_MAX_CHUNK) | BIT(PS_KEY_GROWTH_PERCENT) | BIT(PS_KEY_EPOCH_WAIT_US);
    case PS_TYPE_ARENA:
        return sub | BIT(PS_KEY_INITIAL_SIZE) | BIT(PS_KEY_MAXIMUM_SIZE) |
               BIT(PS_KEY_SUPERBLOCK_SIZE);
    case PS_TYPE_FIXED_SIZE: return sub | BIT(PS_KEY_BLOCK_SIZE) | BIT(PS_KEY_BLOCKS_PER_BATCH);
    case PS_TYPE_BINNING:
        return BIT(PS_KEY_TYPE) | BIT(PS_KEY_UPSTREAM) | BIT(PS_KEY_BINS) | BIT(PS_KEY_FALLBACK) |
               BIT(PS_KEY_BLOCKS_PER_BATCH) | BIT(PS_KEY_FREE_SYNC);
    case PS_TYPE_CUDA:
    case PS_TYPE_MANAGED: return BIT(PS_KEY_TYPE);
    case PS_TYPE_ASYNC: return BIT(PS_KEY_TYPE) | BIT(PS_KEY_RELEASE_THRESHOLD);
    case PS_TYPE_LIMIT: return BIT(PS_KEY_TYPE) | BIT(PS_KEY_UPSTREAM) | BIT(PS_KEY_LIMIT);
    case PS_TYPE_STATS: return BIT(PS_KEY_TYPE) | BIT(PS_KEY_UPSTREAM);
    case PS_TYPE_TRACK: return BIT(PS_KEY_TYPE) | BIT(PS_KEY_UPSTREAM) | BIT(PS_KEY_STACK_DEPTH);
    case PS_TYPE_LOG: return BIT(PS_KEY_TYPE) | BIT(PS_KEY_UPSTREAM) | BIT(PS_KEY_FILE);
    default: return 0;
    }
}

int ps_type_is_leaf(ps_resource_type_t type)
{
    return type == PS_TYPE_CUDA || type == PS_TYPE_ASYNC || type == PS_TYPE_MANAGED;
}

int ps_type_is_adaptor(ps_resource_type_t type)
{
    return type == PS_TYPE_LIMIT || type == PS_TYPE_STATS || type == PS_TYPE_TRACK ||
           type == PS_TYPE_LOG;
}

/* How a resource key's text is read. */
typedef enum value_kind {
    VK_NAME,      /* a resource name */
    VK_SIZE,      /* bytes */
    VK_SIZE_PCT,  /* bytes or % of device memory */
    VK_ALIGN,     /* bytes, a power of two >= 256 */
    VK_COUNT,     /* whole number */
    VK_FREE_SYNC, /* event|device|none */
    VK_BINS,      /* list of SIZE or NAME:SIZE */
    VK_PATH,      /* file-name pattern with %p %r %d */
    VK_THRESHOLD, /* size, % or max */
    VK_TYPE       /* a type name */
} value_kind_t;

static const struct key_info {
    value_kind_t kind;  /* how to read it */
    int nonzero;        /* 1: zero is not allowed */
    uint64_t max;       /* VK_COUNT: the largest value */
    const char *expect; /* what a good value looks like, for messages */
} key_info[PS_KEY_COUNT] = {
    [PS_KEY_TYPE] = {VK_TYPE, 0, 0, "pool, arena, fixed_size, binning, cuda, async, managed, limit, stats, track or log"},
    [PS_KEY_UPSTREAM] = {VK_NAME, 0, 0, "the NAME of a [resource.NAME] section, or cuda, async, managed"},
    [PS_KEY_INITIAL_SIZE] = {VK_SIZE_PCT, 0, 0, "a size such as 1GiB, or a percentage of device memory such as 50%"},
    [PS_KEY_MAXIMUM_SIZE] = {VK_SIZE_PCT, 0, 0, "a size such as 64GiB, or a percentage of device memory such as 90%; 0 = no cap"},
    [PS_KEY_MIN_CHUNK] = {VK_SIZE, 1, 0, "a size above zero such as 32MiB"},
    [PS_KEY_MAX_CHUNK] = {VK_SIZE, 1, 0, "a size above zero such as 1GiB"},
    [PS_KEY_GROWTH_PERCENT] = {VK_COUNT, 0, 1000, "a whole number of percent from 0 to 1000"},
    [PS_KEY_ALIGNMENT] = {VK_ALIGN, 1, 0, "a power of two of at least 256 bytes"},
    [PS_KEY_FREE_SYNC] = {VK_FREE_SYNC, 0, 0, "event, device or none"},
    [PS_KEY_EPOCH_WAIT_US] = {VK_COUNT, 0, 10000000, "a whole number of microseconds from 0 to 10000000"},
    [PS_KEY_SUPERBLOCK_SIZE] = {VK_SIZE, 1, 0, "a size above zero such as 2MiB"},
    [PS_KEY_BLOCK_SIZE] = {VK_SIZE, 1, 0, "a size above zero such as 4KiB"},
    [PS_KEY_BLOCKS_PER_BATCH] = {VK_COUNT, 1, 1u << 24, "a whole number from 1 to 16777216"},
    [PS_KEY_BINS] = {VK_BINS, 1, 0, "a comma list of sizes (256, 1KiB, 4KiB) or NAME:SIZE pairs"},
    [PS_KEY_FALLBACK] = {VK_NAME, 0, 0, "the NAME of a [resource.NAME] section"},
    [PS_KEY_RELEASE_THRESHOLD] = {VK_THRESHOLD, 0, 0, "a size, a percentage of device memory, or max"},
    [PS_KEY_LIMIT] = {VK_SIZE_PCT, 1, 0, "a size above zero such as 8GiB, or a percentage of device memory such as 50%"},
    [PS_KEY_STACK_DEPTH] = {VK_COUNT, 0, 64, "a whole number of frames from 0 to 64"},
    [PS_KEY_FILE] = {VK_PATH, 1, 0, "a file name; %p = pid, %r = rank, %d = device, %% = %"},
};

/* ---- memory helpers ------------------------------------------------------------ */
static void *grow(ps_config_t *cfg, void *array, size_t *cap, size_t count, size_t elem)
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

static char *dup_string(ps_config_t *cfg, const char *s)
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
    char **n = grow(cfg, cfg->strings, &cfg->string_cap, cfg->string_count, sizeof *n);
    if (!n)
        return "?";
    cfg->strings = n;
    char *d = dup_string(cfg, s);
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
    char **n = grow(cfg, cfg->errors, &cap, cfg->error_count, sizeof *n);
    if (n)
        cfg->errors = n;
    size_t cap2 = cfg->error_cap;
    uint64_t *order = grow(cfg, cfg->error_order, &cap2, cfg->error_count, sizeof *order);
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
        char *v = dup_string(cfg, value);
        if (!v)
            return;
        free(s->value);
        s->value = v;
        s->origin = *origin;
        s->layer = layer;
        return;
    }
    ps_setting_t *n = grow(cfg, cfg->settings, &cfg->setting_cap, cfg->setting_count, sizeof *n);
    if (!n)
        return;
    cfg->settings = n;
    ps_setting_t *e = &cfg->settings[cfg->setting_count];
    e->section = dup_string(cfg, section);
    e->key = dup_string(cfg, key);
    e->value = dup_string(cfg, value);
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

/* ---- INI reading --------------------------------------------------------------- */
/* What our line reader and handler share. */
typedef struct ini_reader_state {
    ps_config_t *cfg;     /* where settings and errors go */
    const char *pos;      /* next unread byte of the text */
    const char *end;      /* end of the text */
    int line;             /* number of the line last handed to inih */
    ps_origin_kind_t kind;/* embedded or file */
    const char *source;   /* interned file name */
    int layer;            /* layer of every setting read */
    int last_error_line;  /* last line on which the reader recorded a syntax error */
} ini_reader_state_t;

/* inih's find_chars_or_comment: first of `chars` or an inline ';' comment
 * preceded by a blank. */
static const char *find_chars_or_comment(const char *s, const char *chars)
{
    int was_space = 0;
    while (*s && (!chars || !strchr(chars, *s)) && !(was_space && *s == ';')) {
        was_space = isspace((unsigned char)*s);
        s++;
    }
    return s;
}

static void syntax_error(ini_reader_state_t *st, const char *fmt, const char *text)
{
    ps_origin_t o = {st->kind, st->source, st->line};
    char shown[64];
    snprintf(shown, sizeof shown, "%.40s%s", text, strlen(text) > 40 ? "..." : "");
    ps_config_add_error(st->cfg, &o, fmt, shown);
    st->last_error_line = st->line;
}

/* Remembers where a [section] header is, so errors about the section can
 * point at it (inih does not call the handler for headers). */
static void record_header(ini_reader_state_t *st, const char *name, size_t len)
{
    ps_config_t *cfg = st->cfg;
    char section[INI_MAX_LINE + 1];
    snprintf(section, sizeof section, "%.*s", (int)len, name);
    if (len >= 49) { /* inih keeps 49 characters of a section name and cuts the rest silently */
        ps_origin_t o = {st->kind, st->source, st->line};
        ps_config_add_error(cfg, &o, "section name `%.40s...` is too long (at most 48 characters)", section);
        return;
    }
    for (size_t i = 0; i < cfg->header_count; i++)
        if (cfg->headers[i].layer == st->layer && strcmp(cfg->headers[i].section, section) == 0)
            return; /* a section may be opened again: the first header counts */
    ps_setting_t *n = grow(cfg, cfg->headers, &cfg->header_cap, cfg->header_count, sizeof *n);
    if (!n)
        return;
    cfg->headers = n;
    ps_setting_t *h = &cfg->headers[cfg->header_count];
    h->section = dup_string(cfg, section);
    h->key = NULL;
    h->value = NULL;
    h->origin = (ps_origin_t){st->kind, st->source, st->line};
    h->layer = st->layer;
    if (h->section)
        cfg->header_count++;
}

/* Where section `section` was opened: its header in the most important
 * source that has one, else the origin of `fallback`. */
static const ps_origin_t *section_origin(const ps_config_t *cfg, const char *section,
                                         const ps_origin_t *fallback)
{
    const ps_setting_t *best = NULL;
    for (size_t i = 0; i < cfg->header_count; i++)
        if (strcmp(cfg->headers[i].section, section) == 0 && (!best || cfg->headers[i].layer > best->layer))
            best = &cfg->headers[i];
    return best ? &best->origin : fallback;
}

/* The line reader given to ini_parse_stream: one line per call. */
static char *ini_read_line(char *str, int num, void *stream)
{
    ini_reader_state_t *st = stream;
    if (st->pos >= st->end)
        return NULL;
    const char *nl = memchr(st->pos, '\n', (size_t)(st->end - st->pos));
    const char *stop = nl ? nl : st->end;
    const char *start = st->pos;
    st->pos = nl ? nl + 1 : st->end;
    st->line++;
    if (st->line == 1 && stop - start >= 3 && memcmp(start, "\xEF\xBB\xBF", 3) == 0)
        start += 3; /* UTF-8 byte-order mark */
    while (start < stop && (*start == ' ' || *start == '\t'))
        start++;
    size_t len = (size_t)(stop - start);
    if (len > 0 && start[len - 1] == '\r')
        len--;
    if (memchr(start, '\0', len)) {
        syntax_error(st, "the line holds a NUL byte%s", "");
        str[0] = '\0';
        return str;
    }
    if (len + 1 > (size_t)num || len > INI_MAX_LINE) { /* the second: our copy below */
        ps_origin_t o = {st->kind, st->source, st->line};
        ps_config_add_error(st->cfg, &o, "line too long (%zu characters; at most %d)", len,
                            num - 1 < INI_MAX_LINE ? num - 1 : INI_MAX_LINE);
        st->last_error_line = st->line;
        str[0] = '\0';
        return str;
    }
    memcpy(str, start, len);
    str[len] = '\0';

    /* Check the syntax as inih will read it (see ini.c: comment, section, name=value). */
    char copy[INI_MAX_LINE + 1];
    memcpy(copy, str, len + 1);
    char *t = ps_trim_blanks(copy);
    if (*t == '\0' || strchr(INI_START_COMMENT_PREFIXES, *t))
        return str;
    if (*t == '[') {
        const char *close = find_chars_or_comment(t + 1, "]");
        if (*close != ']')
            syntax_error(st, "section header `%s` has no closing `]`", t);
        else
            record_header(st, t + 1, (size_t)(close - t - 1));
        return str;
    }
    const char *sep = find_chars_or_comment(t, "=:");
    if (*sep != '=' && *sep != ':')
        syntax_error(st, "expected `key = value`, `[section]` or a comment, not `%s`", t);
    return str;
}

static int ini_store_setting(void *user, const char *section, const char *name, const char *value)
{
    ini_reader_state_t *st = user;
    ps_origin_t o = {st->kind, st->source, st->line};
    /* inih copies names into 50-byte buffers and cuts longer ones silently */
    if (strlen(section) >= 49)
        return 1; /* reported at its header (record_header) */
    if (strlen(name) >= 49) {
        ps_config_add_error(st->cfg, &o, "key `%.40s...` is too long (at most 48 characters)", name);
        return 1;
    }
    if (*name == '\0') {
        ps_config_add_error(st->cfg, &o, "missing key name before `=`");
        return 1;
    }
    if (*section == '\0') {
        ps_config_add_error(st->cfg, &o,
                            "`%s` is outside any section (put [global], [resource.NAME] or [device.N] above it)",
                            name);
        return 1;
    }
    ps_config_set(st->cfg, section, name, value, &o, st->layer);
    return 1; /* errors are ours to collect; never make inih stop */
}

void ps_config_read_ini(ps_config_t *cfg, const char *text, ps_origin_kind_t kind,
                        const char *source, int layer)
{
    ini_reader_state_t st = {cfg, text, text + strlen(text), 0, kind, ps_config_intern(cfg, source),
                             layer, 0};
    int rc = ini_parse_stream(ini_read_line, &st, ini_store_setting, &st);
    if (rc > 0 && rc != st.last_error_line) {
        /* inih found an error our reader did not foresee: report it plainly */
        int found = 0;
        char prefix[64];
        snprintf(prefix, sizeof prefix, ":%d: ", rc);
        for (size_t i = 0; i < cfg->error_count && !found; i++)
            found = strstr(cfg->errors[i], prefix) != NULL;
        if (!found) {
            ps_origin_t o = {kind, st.source, rc};
            ps_config_add_error(cfg, &o, "syntax error");
        }
    } else if (rc < 0) {
        cfg->out_of_memory = 1;
    }
}

/* ---- POOLSHIM_OPTIONS ---------------------------------------------------------- */
void ps_config_read_options(ps_config_t *cfg, const char *text)
{
    const char *var = ps_config_intern(cfg, "POOLSHIM_OPTIONS");
    ps_origin_t whole = {PS_ORIGIN_ENV, var, 0};
    size_t len = strlen(text);
    char *buf = malloc(len + 1);
    if (!buf) {
        cfg->out_of_memory = 1;
        return;
    }
    const char *p = text;
    int item = 0;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '\0') {
        free(buf);
        return; /* empty: nothing to do */
    }
    for (;;) {
        item++;
        ps_origin_t o = {PS_ORIGIN_ENV, var, item};
        /* key part: up to '=' or ',' */
        size_t k = 0;
        while (*p && *p != '=' && *p != ',')
            buf[k++] = *p++;
        buf[k] = '\0';
        char *key = ps_trim_blanks(buf);
        if (*p != '=') {
            if (*key == '\0' && *p == ',')
                ps_config_add_error(cfg, &o, "empty item (two commas in a row?)");
            else if (*key == '\0')
                ps_config_add_error(cfg, &whole, "ends with a comma");
            else
                ps_config_add_error(cfg, &o, "`%s`: missing '=' (expected section.key=value, e.g. global.stats=json)", key);
            if (*p == '\0')
                break;
            p++; /* skip ',' */
            if (*p == '\0') {
                ps_config_add_error(cfg, &whole, "ends with a comma");
                break;
            }
            continue;
        }
        p++; /* skip '=' */
        char *value = buf + k + 1;
        size_t v = 0;
        int bad_quote = 0;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '"') {
            p++;
            while (*p && *p != '"')
                value[v++] = *p++;
            if (*p != '"')
                bad_quote = 1;
            else
                p++;
            while (*p == ' ' || *p == '\t')
                p++;
            if (!bad_quote && *p && *p != ',')
                bad_quote = 2;
            while (*p && *p != ',')
                p++;
        } else {
            while (*p && *p != ',')
                value[v++] = *p++;
        }
        value[v] = '\0';
        char *dot = strrchr(key, '.');
        if (bad_quote == 1)
            ps_config_add_error(cfg, &o, "`%s`: the value's opening '\"' has no closing '\"'", key);
        else if (bad_quote == 2)
            ps_config_add_error(cfg, &o, "`%s`: unexpected text after the closing '\"'", key);
        else if (*key == '\0')
            ps_config_add_error(cfg, &o, "missing key before '=' (expected section.key=value)");
        else if (!dot || dot == key || dot[1] == '\0')
            ps_config_add_error(cfg, &o,
                                "`%s`: missing section (expected section.key=value, e.g. global.stats=json)",
                                key);
        else {
            *dot = '\0';
            ps_config_set(cfg, ps_trim_blanks(key), ps_trim_blanks(dot + 1), bad_quote ? "" : ps_trim_blanks(value), &o,
                          PS_LAYER_OPTIONS);
        }
        if (*p == '\0')
            break;
        p++; /* skip ',' */
        if (*p == '\0') {
            ps_config_add_error(cfg, &whole, "ends with a comma");
            break;
        }
    }
    free(buf);
}

/* ---- validation ---------------------------------------------------------------- */
int ps_config_def_index(const ps_config_t *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->def_count; i++)
        if (strcmp(cfg->defs[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int add_def(ps_config_t *cfg, const char *name, const ps_origin_t *origin)
{
    ps_resource_def_t *n = grow(cfg, cfg->defs, &cfg->def_cap, cfg->def_count, sizeof *n);
    if (!n)
        return -1;
    cfg->defs = n;
    ps_resource_def_t *d = &cfg->defs[cfg->def_count];
    memset(d, 0, sizeof *d);
    d->name = dup_string(cfg, name);
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

/* "bad value `x` for `key` in [section]: why (expected ...)" */
static void bad_value(ps_config_t *cfg, const ps_setting_t *s, const char *why, const char *expect)
{
    ps_config_add_error(cfg, &s->origin, "bad value `%s` for `%s` in [%s]: %s (expected %s)",
                        s->value, s->key, s->section, why, expect);
}

static void validate_global(ps_config_t *cfg, const ps_setting_t *s)
{
    ps_global_config_t *g = &cfg->global;
    int key = ps_parse_word(s->key, ps_global_key_names);
    if (key < 0 || strcmp(s->key, ps_global_key_names[key]) != 0) {
        const char *near = ps_nearest_word(s->key, ps_global_key_names);
        if (near)
            ps_config_add_error(cfg, &s->origin, "unknown key `%s` in [global] (did you mean `%s`?)",
                                s->key, near);
        else
            ps_config_add_error(cfg, &s->origin, "unknown key `%s` in [global] (known keys: verbosity, stats, stats_file, log_file, free_sync, meminfo, on_error, direct_min_size, disable)",
                                s->key);
        return;
    }
    char why[128] = "";
    uint64_t n;
    int w, b;
    switch ((ps_global_key_t)key) {
    case PS_GKEY_VERBOSITY:
        if ((w = ps_parse_word(s->value, verbosity_words)) >= 0)
            g->verbosity = w;
        else if (ps_parse_uint(s->value, 3, &n, why, sizeof why) == PS_OK)
            g->verbosity = (int)n;
        else
            return bad_value(cfg, s, "not a verbosity", "0-3 or error, warning, info, debug");
        break;
    case PS_GKEY_STATS:
        if ((w = ps_parse_word(s->value, stats_words)) >= 0)
            g->stats = (ps_stats_mode_t)w;
        else if (ps_parse_bool(s->value, &b) == PS_OK)
            g->stats = b ? PS_STATS_TEXT : PS_STATS_OFF;
        else
            return bad_value(cfg, s, "not a statistics mode", "off, text or json (or 0/1)");
        break;
    case PS_GKEY_STATS_FILE:
    case PS_GKEY_LOG_FILE: {
        int is_log = key == PS_GKEY_LOG_FILE;
        if (ps_check_path_pattern(s->value, is_log, why, sizeof why) != PS_OK)
            return bad_value(cfg, s, why, is_log ? "a file name; %p = pid, %r = rank, %d = device"
                                                 : "a file name; %p = pid, %r = rank");
        if (strlen(s->value) >= PS_PATH_MAX)
            return bad_value(cfg, s, "too long", "a file name shorter than 4096 bytes");
        snprintf(is_log ? g->log_file : g->stats_file, PS_PATH_MAX, "%s", s->value);
        break;
    }
    case PS_GKEY_FREE_SYNC:
        if ((w = ps_parse_word(s->value, free_sync_words)) < 0)
            return bad_value(cfg, s, "not a policy", "event, device or none");
        g->free_sync = (ps_free_sync_t)w;
        break;
    case PS_GKEY_MEMINFO:
        if ((w = ps_parse_word(s->value, meminfo_words)) < 0)
            return bad_value(cfg, s, "not a meminfo mode", "pool or device");
        g->meminfo = (ps_meminfo_t)w;
        break;
    case PS_GKEY_ON_ERROR:
        if ((w = ps_parse_word(s->value, on_error_words)) < 0)
            return bad_value(cfg, s, "not an error policy", "exit or passthrough");
        g->on_error = (ps_on_error_t)w;
        break;
    case PS_GKEY_DIRECT_MIN_SIZE: {
        uint64_t bytes;
        double pct;
        int is_pct;
        if (ps_parse_size_ex(s->value, 0, &bytes, &pct, &is_pct, why, sizeof why) != PS_OK)
            return bad_value(cfg, s, why, "a size such as 256MiB; 0 = off");
        g->direct_min_size = (size_t)bytes;
        break;
    }
    case PS_GKEY_DISABLE:
        if (ps_parse_bool(s->value, &b) != PS_OK)
            return bad_value(cfg, s, "not a boolean", "1, true, yes, on, 0, false, no or off");
        g->disable = b;
        break;
    default: break;
    }
    cfg->global_origin[key] = s->origin;
}

/* Parses a binning `bins` list into def->bins (names resolved later). */
static void parse_bins(ps_config_t *cfg, ps_resource_def_t *def, const ps_setting_t *s)
{
    const char *expect = key_info[PS_KEY_BINS].expect;
    char *copy = dup_string(cfg, s->value);
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
        } else if (ps_parse_size_ex(size_text, 0, &bytes, &pct, &is_pct, reason, sizeof reason) != PS_OK) {
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
            bins[n].name = dup_string(cfg, name);
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
        uint32_t mask = def->type < PS_TYPE_COUNT ? ps_type_keys(def->type) : ~0u;
        for (int k = 0; k < PS_KEY_COUNT; k++)
            if (mask & BIT(k))
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
    if (!(ps_type_keys(def->type) & BIT(key))) {
        if (s->layer < type_layer)
            return; /* set for the type an earlier source gave; a later source changed the type */
        if (key == PS_KEY_UPSTREAM && ps_type_is_leaf(def->type)) {
            ps_config_add_error(cfg, &s->origin,
                                "[%s] is of type %s, which takes memory from the device and has no upstream",
                                s->section, ps_type_names[def->type]);
            return;
        }
        char list[512] = "";
        uint32_t mask = ps_type_keys(def->type) & ~BIT(PS_KEY_TYPE);
        for (int k = 0; k < PS_KEY_COUNT; k++)
            if (mask & BIT(k))
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", *list ? ", " : "",
                         ps_key_names[k]);
        ps_config_add_error(cfg, &s->origin, "key `%s` does not apply to type %s in [%s] (%s takes %s)",
                            s->key, ps_type_names[def->type], s->section, ps_type_names[def->type],
                            *list ? list : "no keys");
        return;
    }
    const struct key_info *info = &key_info[key];
    ps_value_t *v = &def->values[key];
    ps_value_t parsed = {1, s->origin, ps_config_intern(cfg, s->value), 0, 0, 0};
    char why[160] = "";
    switch (info->kind) {
    case VK_NAME:
        if (!valid_name(s->value))
            return bad_value(cfg, s, "not a resource name", "letters, digits, '_' or '-'");
        break;
    case VK_SIZE:
    case VK_SIZE_PCT:
    case VK_ALIGN:
    case VK_THRESHOLD:
        if (info->kind == VK_THRESHOLD && (strcasecmp(s->value, "max") == 0)) {
            parsed.number = UINT64_MAX;
            break;
        }
        if (ps_parse_size_ex(s->value, info->kind == VK_SIZE_PCT || info->kind == VK_THRESHOLD,
                             &parsed.number, &parsed.percent, &parsed.is_percent, why,
                             sizeof why) != PS_OK)
            return bad_value(cfg, s, why, info->expect);
        if (info->nonzero && (parsed.is_percent ? parsed.percent <= 0 : parsed.number == 0))
            return bad_value(cfg, s, "zero is not allowed", info->expect);
        if (info->kind == VK_ALIGN && (!ps_is_pow2(parsed.number) || parsed.number < 256))
            return bad_value(cfg, s,
                             ps_is_pow2(parsed.number) ? "below 256 (cudaMalloc guarantees 256)"
                                                       : "not a power of two",
                             info->expect);
        break;
    case VK_COUNT:
        if (ps_parse_uint(s->value, info->max, &parsed.number, why, sizeof why) != PS_OK)
            return bad_value(cfg, s, why, info->expect);
        if (info->nonzero && parsed.number == 0)
            return bad_value(cfg, s, "zero is not allowed", info->expect);
        break;
    case VK_FREE_SYNC: {
        int w = ps_parse_word(s->value, free_sync_words);
        if (w < 0)
            return bad_value(cfg, s, "not a policy", info->expect);
        parsed.number = (uint64_t)w;
        break;
    }
    case VK_BINS: parse_bins(cfg, def, s); break;
    case VK_PATH:
        if (!*s->value)
            return bad_value(cfg, s, "empty file name", info->expect);
        if (ps_check_path_pattern(s->value, 1, why, sizeof why) != PS_OK)
            return bad_value(cfg, s, why, info->expect);
        if (strlen(s->value) >= PS_PATH_MAX)
            return bad_value(cfg, s, "too long", info->expect);
        break;
    case VK_TYPE: break;
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
        const ps_origin_t *where = section_origin(cfg, s->section, &s->origin);
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
                                    section, key_info[PS_KEY_TYPE].expect);
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
                    ps_config_add_error(cfg, section_origin(cfg, s->section, &s->origin),
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
        ps_device_def_t *n = grow(cfg, cfg->devices, &cfg->device_cap, cfg->device_count, sizeof *n);
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
    static const char *const sections[] = {"global", "resource", "device", NULL};
    for (size_t i = 0; i < cfg->header_count + cfg->setting_count; i++) {
        const ps_setting_t *s = i < cfg->header_count ? &cfg->headers[i] : &cfg->settings[i - cfg->header_count];
        if (strcmp(s->section, "global") == 0 || strncmp(s->section, "resource.", 9) == 0 ||
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
        const ps_origin_t *where = section_origin(cfg, s->section, &s->origin);
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

static void resolve_references(ps_config_t *cfg)
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

static void find_cycles(ps_config_t *cfg)
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
    memset(g, 0, sizeof *g);
    g->verbosity = 1;
    g->stats = PS_STATS_OFF;
    g->free_sync = PS_FREE_SYNC_EVENT;
    g->meminfo = PS_MEMINFO_POOL;
    g->on_error = PS_ON_ERROR_EXIT;
    for (size_t i = 0; i < cfg->setting_count; i++)
        if (strcmp(cfg->settings[i].section, "global") == 0)
            validate_global(cfg, &cfg->settings[i]);
    check_sections(cfg);
    validate_resources(cfg);
    validate_devices(cfg);
    resolve_references(cfg);
    find_cycles(cfg);
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
