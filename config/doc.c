/* docs/config.md's key tables, from config/keys.def.
 *
 * The tables of [global], [host] and [debug] in docs/config.md keep their
 * hand-written prose: there the key, default and short-form columns must
 * agree with keys.def (tests/unit/test_config_keys.c reads them). The table
 * of every resource key is generated whole: `make config-doc` writes it
 * between the PS_DOC_BEGIN and PS_DOC_END lines, and the test compares it
 * line by line. ps_doc_tables prints every table, one-line help as meaning.
 *
 * A default is written as the docs write values: the value in backquotes
 * with its note after it ("`0` (off)"), a note alone without them ("none",
 * "required").
 */
#include <stdio.h>
#include <string.h>

#include "config_internal.h"

/* "0 (off)" -> "`0` (off)", "(stderr)" -> "stderr", "2MiB" -> "`2MiB`". */
static char *doc_form(const char *text, char *buf, size_t size)
{
    size_t len = strlen(text);
    const char *note = strstr(text, " (");
    if (text[0] == '(' && len >= 2 && text[len - 1] == ')')
        snprintf(buf, size, "%.*s", (int)(len - 2), text + 1);
    else if (note)
        snprintf(buf, size, "`%.*s`%s", (int)(note - text), text, note);
    else
        snprintf(buf, size, "`%s`", text);
    return buf;
}

char *ps_doc_setting_default(const ps_setting_info_t *info, char *buf, size_t size)
{
    char text[256];
    if (info->kind == PS_VALUE_BOOL_AUTO && (int64_t)info->default_value < 0) {
        snprintf(buf, size, "unset (auto)");
        return buf;
    }
    ps_value_text(info->kind, info->default_value, "", info->words, info->shown, 1, text, sizeof text);
    return doc_form(text, buf, size);
}

char *ps_doc_key_default(const ps_key_info_t *info, char *buf, size_t size)
{
    char text[256];
    if (info->kind == PS_VALUE_FREE_SYNC) { /* a resource's free_sync: the global one */
        snprintf(buf, size, "`global.free_sync`");
        return buf;
    }
    ps_value_text(info->kind, info->default_value, "", NULL, info->shown, 1, text, sizeof text);
    return doc_form(text, buf, size);
}

/* "pool, arena", or "all". */
static void type_list(uint32_t types, char *buf, size_t size)
{
    buf[0] = '\0';
    if (types == PS_T_ALL) {
        snprintf(buf, size, "all");
        return;
    }
    for (int t = 0; t < PS_TYPE_COUNT; t++)
        if (types & (1u << t))
            snprintf(buf + strlen(buf), size - strlen(buf), "%s%s", buf[0] ? ", " : "", ps_type_names[t]);
}

void ps_doc_resource_table(FILE *f)
{
    char types[256], value[256];
    fprintf(f, "%s\n", PS_DOC_BEGIN);
    fprintf(f, "| key | types | default | meaning |\n|---|---|---|---|\n");
    for (int k = 0; k < PS_KEY_COUNT; k++) {
        const ps_key_info_t *info = &ps_key_info[k];
        int percent = info->kind == PS_VALUE_SIZE_PCT || info->kind == PS_VALUE_THRESHOLD;
        type_list(info->types, types, sizeof types);
        fprintf(f, "| `%s`%s | %s | %s | %s |\n", info->name, percent ? "%" : "", types,
                ps_doc_key_default(info, value, sizeof value), info->help);
    }
    fprintf(f, "%s\n", PS_DOC_END);
}

void ps_doc_tables(FILE *f)
{
    char value[256];
    for (int section = 0; section < PS_SECTION_COUNT; section++) {
        const ps_section_info_t *sec = &ps_sections[section];
        fprintf(f, "### `[%s]`\n\n| key | default | short form | meaning |\n|---|---|---|---|\n", sec->name);
        for (int k = 0; k < sec->count; k++) {
            const ps_setting_info_t *info = &sec->keys[k];
            fprintf(f, "| `%s` | %s | %s%s%s | %s |\n", info->name, ps_doc_setting_default(info, value, sizeof value),
                    info->env ? "`" : "—", info->env ? info->env : "", info->env ? "`" : "", info->help);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "### `[resource.NAME]`\n\n");
    ps_doc_resource_table(f);
}
