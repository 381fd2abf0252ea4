/* The options source: POOLSHIM_OPTIONS="section.key=value,..." read into
 * the settings store at the OPTIONS layer, item by item. A value may be
 * quoted ("a,b"); every malformed item (no '=', no section, an empty item,
 * a trailing comma, an unclosed quote) is an error naming its item number,
 * and the items after it are still read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

/* Steps *p over the ',' that ends an item. Returns 1, or 0 when the text
 * ends there or right after the comma (then "ends with a comma" is
 * reported for the whole variable): no item follows. */
static int next_item(ps_config_t *cfg, const ps_origin_t *whole, const char **p)
{
    if (**p == '\0')
        return 0;
    (*p)++; /* skip ',' */
    if (**p == '\0') {
        ps_config_add_error(cfg, whole, "ends with a comma");
        return 0;
    }
    return 1;
}

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
            if (!next_item(cfg, &whole, &p))
                break;
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
        if (!next_item(cfg, &whole, &p))
            break;
    }
    free(buf);
}
