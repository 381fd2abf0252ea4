/* The INI source: a file (or the embedded default.ini) read into the
 * settings store through libinih (ini_parse_stream) with our own line
 * reader. The reader counts lines (Debian builds inih without
 * INI_HANDLER_LINENO), strips leading blanks (so indented lines are never
 * taken for inih's multi-line continuations), rejects lines longer than
 * inih's buffer instead of letting inih split them, and checks each line's
 * syntax the way inih will, so EVERY syntax error is reported with its
 * line, not only the first one inih returns. It also records where each
 * [section] header is, so that errors about a section can point at it.
 */
#include <ctype.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

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
    ps_setting_t *n = ps_config_grow(cfg, cfg->headers, &cfg->header_cap, cfg->header_count, sizeof *n);
    if (!n)
        return;
    cfg->headers = n;
    ps_setting_t *h = &cfg->headers[cfg->header_count];
    h->section = ps_config_strdup(cfg, section);
    h->key = NULL;
    h->value = NULL;
    h->origin = (ps_origin_t){st->kind, st->source, st->line};
    h->layer = st->layer;
    if (h->section)
        cfg->header_count++;
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

void ps_config_read_ini(ps_config_t *cfg, const char *text, size_t len, ps_origin_kind_t kind,
                        const char *source, int layer)
{
    ini_reader_state_t st = {cfg, text, text + len, 0, kind, ps_config_intern(cfg, source),
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
