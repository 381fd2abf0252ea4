/* config/keys.def, the one table of every key: its rows agree with the
 * core's defaults, with what loading and building make of them, and with
 * docs/config.md.
 *
 * docs/config.md is compared this way: the [global], [host] and [debug]
 * tables keep their hand-written meaning column, and their key, default
 * and short-form columns must equal the rows (a row of the docs may name
 * two keys, "`min_chunk` / `max_chunk`", with two defaults); the
 * Environment table names each short form with the key it sets; the type
 * table lists only keys each type takes, % marking those that accept a
 * percentage; the table of every resource key is generated whole (make
 * config-doc) and must equal ps_doc_resource_table's lines. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../config/config_internal.h"
#include "../../tools/cli.h" /* cli_read_file */

/* ---- the table against the core and the loader ------------------------------ */

/* The row's default, stored into the core's default options, changes nothing. */
static void expect_core_default(const char *what, const void *core, size_t size, const ps_field_t *field,
                                const ps_key_info_t *info)
{
    char copy[1024];
    cr_assert_leq(size, sizeof copy);
    memcpy(copy, core, size);
    ps_field_store(copy, field, info->default_value);
    cr_expect(memcmp(copy, core, size) == 0, "%s: keys.def says %s = %llu, the core's default differs (%llu)", what,
              info->name, (unsigned long long)info->default_value, (unsigned long long)ps_field_load(core, field));
}

Test(config_keys, the_rows_defaults_equal_ps_pool_options_default)
{
    ps_pool_options_t pool;
    memset(&pool, 0, sizeof pool);
    ps_pool_options_default(&pool);
    int fields = 0;
    for (int k = 0; k < PS_KEY_COUNT; k++) {
        if (!ps_key_info[k].pool.size)
            continue;
        expect_core_default("pool", &pool, sizeof pool, &ps_key_info[k].pool, &ps_key_info[k]);
        fields++;
    }
    cr_expect_geq(fields, 20, "the pool's options come from the table");
}

Test(config_keys, the_rows_defaults_equal_the_arena_and_fixed_size_defaults)
{
    ps_arena_options_t arena;
    ps_fixed_size_options_t fixed;
    ps_arena_options_default(&arena);
    ps_fixed_size_options_default(&fixed);
    for (int k = 0; k < PS_KEY_COUNT; k++) {
        if (ps_key_info[k].arena.size)
            expect_core_default("arena", &arena, sizeof arena, &ps_key_info[k].arena, &ps_key_info[k]);
        if (ps_key_info[k].fixed_size.size)
            expect_core_default("fixed_size", &fixed, sizeof fixed, &ps_key_info[k].fixed_size, &ps_key_info[k]);
    }
}

/* What the builder gives an empty pool section is the core's default (the
 * global free_sync, barrier, is the core's too). */
Test(config_keys, an_empty_pool_gets_the_core_defaults)
{
    ps_config_input_t in = {.no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load_text("[resource.p]\ntype = pool\n[device.*]\nresource = p\n", "t.ini", &in, &cfg),
                 PS_OK);
    ps_pool_options_t built, core;
    ps_config_pool_options(cfg, &cfg->defs[ps_config_def_index(cfg, "p")], 0, &built);
    ps_pool_options_default(&core);
    for (int k = 0; k < PS_KEY_COUNT; k++)
        if (ps_key_info[k].pool.size)
            cr_expect_eq(ps_field_load(&built, &ps_key_info[k].pool), ps_field_load(&core, &ps_key_info[k].pool),
                         "%s", ps_key_info[k].name);
    cr_expect_eq(built.free_sync, core.free_sync);
    cr_expect_eq(built.epoch_wait_ns, core.epoch_wait_ns);
    cr_expect_eq(built.chunk_granule, core.chunk_granule, "a field no key sets keeps the core's default");
    ps_config_free(cfg);
}

/* A value set in a file reaches its field, scaled where the row says so. */
Test(config_keys, a_value_lands_in_the_field_its_row_names)
{
    ps_config_input_t in = {.no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load_text("[resource.p]\ntype = pool\nepoch_wait_us = 7\nremap_lend = 0\n"
                                     "barrier_floor = 4MiB\n[device.*]\nresource = p\n",
                                     "t.ini", &in, &cfg),
                 PS_OK);
    ps_pool_options_t built;
    ps_config_pool_options(cfg, &cfg->defs[ps_config_def_index(cfg, "p")], 0, &built);
    cr_expect_eq(built.epoch_wait_ns, 7000);
    cr_expect_eq(built.remap_lend, 0);
    cr_expect_eq(built.barrier_floor, 4 * PS_MiB);
    ps_config_free(cfg);
}

/* Nothing set: every [global], [host] and [debug] value is its row's default. */
Test(config_keys, settings_start_from_their_rows_defaults)
{
    ps_config_input_t in = {.no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load_text("", "empty.ini", &in, &cfg), PS_OK);
    for (int s = 0; s < PS_SECTION_COUNT; s++)
        for (int k = 0; k < ps_sections[s].count; k++) {
            const ps_setting_info_t *info = &ps_sections[s].keys[k];
            if (info->kind == PS_VALUE_PATH || info->kind == PS_VALUE_PATH_NO_DEVICE)
                cr_expect_str_empty((const char *)&cfg->global + info->field.offset, "%s", info->name);
            else
                cr_expect_eq(ps_field_load(&cfg->global, &info->field), info->default_value, "[%s] %s",
                             ps_sections[s].name, info->name);
        }
    cr_expect_eq(cfg->global.host.expandable, -1, "an unset BOOL_AUTO");
    cr_expect_eq(cfg->global.decay_ms, 5000);
    ps_config_free(cfg);
}

Test(config_keys, names_are_unique_and_follow_the_rows)
{
    for (int k = 0; k < PS_KEY_COUNT; k++) {
        cr_expect_str_eq(ps_key_names[k], ps_key_info[k].name);
        cr_expect_neq(ps_key_info[k].types, 0, "%s is taken by some type", ps_key_info[k].name);
        cr_expect_not_null(ps_key_info[k].expect);
        cr_expect_not_null(ps_key_info[k].help);
        for (int j = 0; j < k; j++)
            cr_expect_str_neq(ps_key_names[j], ps_key_names[k]);
    }
    cr_expect_null(ps_key_names[PS_KEY_COUNT]);
    for (int s = 0; s < PS_SECTION_COUNT; s++) {
        const ps_section_info_t *sec = &ps_sections[s];
        for (int k = 0; k < sec->count; k++) {
            cr_expect_str_eq(sec->names[k], sec->keys[k].name);
            cr_expect_not_null(sec->keys[k].help);
            for (int j = 0; j < k; j++)
                cr_expect_str_neq(sec->names[j], sec->names[k]);
        }
        cr_expect_null(sec->names[sec->count]);
    }
    cr_expect_str_eq(ps_debug_key_names[PS_DKEY_NVTX_RANGES], "nvtx_ranges");
    cr_expect_str_eq(ps_sections[PS_SECTION_DEBUG].keys[PS_DKEY_NVTX_RANGES].env, "POOLSHIM_NVTX_RANGES");
}

Test(config_keys, the_mask_has_a_bit_for_every_key)
{
    cr_expect_geq(sizeof(ps_key_mask_t) * 8, (size_t)PS_KEY_COUNT);
    ps_key_mask_t all = 0;
    for (int t = 0; t < PS_TYPE_COUNT; t++) {
        ps_key_mask_t keys = ps_type_keys((ps_resource_type_t)t);
        cr_expect(keys & PS_KEY_BIT(PS_KEY_TYPE), "every type takes `type`");
        all |= keys;
    }
    cr_expect_eq(all, PS_KEY_COUNT == 64 ? ~(ps_key_mask_t)0 : PS_KEY_BIT(PS_KEY_COUNT) - 1,
                 "every key belongs to some type");
    cr_expect(ps_type_keys(PS_TYPE_POOL) & PS_KEY_BIT(PS_KEY_BARRIER_FLOOR), "the 31st key is a pool's");
    cr_expect(ps_type_keys(PS_TYPE_ARENA) & PS_KEY_BIT(PS_KEY_THREAD_FLOOR), "the 32nd key is an arena's");
    cr_expect_eq(ps_type_keys(PS_TYPE_CUDA), PS_KEY_BIT(PS_KEY_TYPE));
}

Test(config_keys, short_forms_are_distinct_poolshim_variables)
{
    const char *seen[64];
    int n = 0;
    for (int s = 0; s < PS_SECTION_COUNT; s++)
        for (int k = 0; k < ps_sections[s].count; k++) {
            const char *env = ps_sections[s].keys[k].env;
            if (!env)
                continue;
            cr_expect_eq(strncmp(env, "POOLSHIM_", 9), 0, "%s", env);
            for (int j = 0; j < n; j++)
                cr_expect_str_neq(seen[j], env);
            seen[n++] = env;
        }
    cr_expect_geq(n, 11);
}

/* ---- docs/config.md ------------------------------------------------------------ */

static char *docs_text(void)
{
    const char *data = getenv("POOLSHIM_TEST_DATA");
    cr_assert_not_null(data, "POOLSHIM_TEST_DATA must be set (make test-unit sets it)");
    char path[4096];
    snprintf(path, sizeof path, "%s/../../docs/config.md", data);
    char *text = NULL;
    cr_assert_eq(cli_read_file(path, &text, NULL), 0, "cannot read %s", path);
    return text;
}

#define MAX_CELLS 8
#define MAX_ROWS 64

/* A markdown table: rows of cells, trimmed (a '|' after '\' stays in its cell). */
typedef struct doc_table {
    char cell[MAX_ROWS][MAX_CELLS][2048];
    int cells[MAX_ROWS];
    int rows; /* the header is row 0; the |---| line is skipped */
} doc_table_t;

static void trim(char *s)
{
    size_t len = strlen(s), start = strspn(s, " ");
    while (len > start && s[len - 1] == ' ')
        len--;
    memmove(s, s + start, len - start);
    s[len - start] = '\0';
}

/* The first table after the line `heading`. */
static doc_table_t *read_table(const char *text, const char *heading)
{
    const char *at = strstr(text, heading);
    cr_assert_not_null(at, "docs/config.md has no `%s`", heading);
    at = strstr(at, "\n|");
    cr_assert_not_null(at, "no table after `%s`", heading);
    doc_table_t *t = calloc(1, sizeof *t);
    for (const char *line = at + 1; *line == '|' && t->rows < MAX_ROWS;) {
        const char *end = strchr(line, '\n');
        if (!end)
            end = line + strlen(line);
        if (strncmp(line, "|---", 4) != 0) {
            int c = 0;
            size_t n = 0;
            for (const char *p = line + 1; p < end && c < MAX_CELLS; p++) {
                if (*p == '|' && p[-1] != '\\') {
                    t->cell[t->rows][c][n] = '\0';
                    trim(t->cell[t->rows][c]);
                    c++;
                    n = 0;
                } else if (n + 1 < sizeof t->cell[0][0]) {
                    t->cell[t->rows][c][n++] = *p;
                }
            }
            t->cells[t->rows++] = c;
        }
        line = *end ? end + 1 : end;
    }
    return t;
}

static int column(const doc_table_t *t, const char *name)
{
    for (int c = 0; c < t->cells[0]; c++)
        if (strcmp(t->cell[0][c], name) == 0)
            return c;
    cr_assert_fail("no column `%s`", name);
    return -1;
}

/* Splits "`a` / `b`" at " / " into at most `max` parts (in place). */
static int split_slash(char *cell, char **parts, int max)
{
    int n = 0;
    char *p = cell;
    while (n < max) {
        parts[n++] = p;
        char *next = strstr(p, " / ");
        if (!next)
            break;
        *next = '\0';
        p = next + 3;
    }
    return n;
}

static void check_section_table(const char *text, ps_section_t section)
{
    const ps_section_info_t *sec = &ps_sections[section];
    char heading[64];
    snprintf(heading, sizeof heading, "### `[%s]`", sec->name);
    doc_table_t *t = read_table(text, heading);
    int key_col = column(t, "key"), default_col = column(t, "default"), env_col = -1;
    for (int c = 0; c < t->cells[0]; c++)
        if (strcmp(t->cell[0][c], "short form") == 0)
            env_col = c;
    int documented[64] = {0};
    for (int r = 1; r < t->rows; r++) {
        char *keys[2], *defaults[2];
        int nk = split_slash(t->cell[r][key_col], keys, 2);
        int nd = split_slash(t->cell[r][default_col], defaults, 2);
        cr_expect_eq(nk, nd, "[%s] row %d: as many defaults as keys", sec->name, r);
        for (int i = 0; i < nk && i < nd; i++) {
            char name[128];
            cr_assert_eq(sscanf(keys[i], "`%127[^`]`", name), 1, "[%s] row %d: `%s`", sec->name, r, keys[i]);
            int k = 0;
            while (k < sec->count && strcmp(sec->names[k], name) != 0)
                k++;
            cr_expect_lt(k, sec->count, "docs/config.md documents [%s] %s, which keys.def does not have", sec->name,
                         name);
            if (k == sec->count)
                continue;
            documented[k]++;
            char want[256];
            ps_doc_setting_default(&sec->keys[k], want, sizeof want);
            cr_expect_str_eq(defaults[i], want, "[%s] %s: docs/config.md's default is not keys.def's", sec->name,
                             name);
            if (env_col >= 0) {
                char variable[128] = "";
                if (sec->keys[k].env)
                    cr_expect_eq(sscanf(t->cell[r][env_col], "`%127[^=`]", variable), 1, "[%s] %s", sec->name, name);
                cr_expect_str_eq(variable, sec->keys[k].env ? sec->keys[k].env : "",
                                 "[%s] %s: docs/config.md's short form is not keys.def's", sec->name, name);
            }
        }
    }
    for (int k = 0; k < sec->count; k++)
        cr_expect_eq(documented[k], 1, "[%s] %s: documented %d times in docs/config.md's table", sec->name,
                     sec->names[k], documented[k]);
    free(t);
}

Test(config_keys, docs_global_host_and_debug_tables_match_the_rows)
{
    char *text = docs_text();
    for (int s = 0; s < PS_SECTION_COUNT; s++)
        check_section_table(text, (ps_section_t)s);
    free(text);
}

/* Every short form is in the Environment table with the key it sets, and
 * every variable there that sets a key of a section is that key's. */
Test(config_keys, docs_environment_table_names_every_short_form)
{
    char *text = docs_text();
    doc_table_t *t = read_table(text, "## Environment");
    int found[PS_SECTION_COUNT][64] = {{0}};
    for (int r = 1; r < t->rows; r++) {
        char variable[128], section[32], key[64];
        if (sscanf(t->cell[r][0], "`%127[^=`]", variable) != 1 ||
            sscanf(t->cell[r][1], "`%31[a-z].%63[a-z_]`", section, key) != 2)
            continue;
        for (int s = 0; s < PS_SECTION_COUNT; s++) {
            if (strcmp(section, ps_sections[s].name) != 0)
                continue;
            int k = ps_parse_word(key, ps_sections[s].names);
            cr_expect_geq(k, 0, "%s sets %s.%s, which keys.def does not have", variable, section, key);
            if (k < 0)
                continue;
            cr_expect_str_eq(ps_sections[s].keys[k].env ? ps_sections[s].keys[k].env : "(none)", variable,
                             "docs/config.md: %s sets %s.%s; keys.def disagrees", variable, section, key);
            found[s][k]++;
        }
    }
    for (int s = 0; s < PS_SECTION_COUNT; s++)
        for (int k = 0; k < ps_sections[s].count; k++)
            if (ps_sections[s].keys[k].env)
                cr_expect_eq(found[s][k], 1, "%s (%s.%s) is not in docs/config.md's Environment table",
                             ps_sections[s].keys[k].env, ps_sections[s].name, ps_sections[s].names[k]);
    free(t);
    free(text);
}

/* The type table: each key listed is one the type takes; % where it takes
 * a percentage (its notes in parentheses and after ';' are prose). */
Test(config_keys, docs_type_table_lists_keys_the_type_takes)
{
    char *text = docs_text();
    doc_table_t *t = read_table(text, "### `[resource.NAME]`");
    int types = 0;
    for (int r = 1; r < t->rows; r++) {
        char type[64];
        cr_assert_eq(sscanf(t->cell[r][0], "`%63[^`]`", type), 1);
        int ti = ps_parse_word(type, ps_type_names);
        cr_assert_geq(ti, 0, "docs/config.md: unknown type %s", type);
        types++;
        char list[2048] = "";
        size_t n = 0;
        int depth = 0;
        for (const char *p = t->cell[r][2]; *p && !(depth == 0 && *p == ';'); p++) {
            depth += *p == '(' ? 1 : *p == ')' ? -1 : 0;
            if (depth == 0 && *p != ')' && n + 1 < sizeof list)
                list[n++] = *p;
        }
        list[n] = '\0';
        for (const char *p = strchr(list, '`'); p; p = strchr(p, '`')) {
            char key[64];
            if (sscanf(p, "`%63[^`]`", key) != 1)
                break;
            const char *after = strchr(p + 1, '`') + 1;
            int k = ps_parse_word(key, ps_key_names);
            cr_expect_geq(k, 0, "docs/config.md: type %s lists `%s`, not a key", type, key);
            if (k >= 0) {
                cr_expect(ps_type_keys((ps_resource_type_t)ti) & PS_KEY_BIT(k), "docs/config.md: %s does not take %s",
                          type, key);
                int percent = ps_key_info[k].kind == PS_VALUE_SIZE_PCT || ps_key_info[k].kind == PS_VALUE_THRESHOLD;
                cr_expect_eq(*after == '%', percent, "docs/config.md: %s's `%s`%s", type, key,
                             percent ? " takes a percentage: mark it %" : " takes no percentage");
            }
            p = after;
        }
    }
    cr_expect_eq(types, PS_TYPE_COUNT);
    free(t);
    free(text);
}

/* The generated table of every resource key, as make config-doc writes it. */
Test(config_keys, docs_resource_key_table_is_the_generated_one)
{
    char *text = docs_text();
    char *want = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&want, &size);
    ps_doc_resource_table(m);
    fclose(m);
    const char *begin = strstr(text, PS_DOC_BEGIN);
    cr_assert_not_null(begin, "docs/config.md lacks the generated table (run make config-doc)");
    const char *end = strstr(begin, PS_DOC_END);
    cr_assert_not_null(end);
    end += strlen(PS_DOC_END) + 1;
    /* the first line that differs, for the message */
    const char *a = begin, *b = want;
    while (a < end && *b && *a == *b) {
        a++;
        b++;
    }
    const char *line = a;
    while (line > begin && line[-1] != '\n')
        line--;
    cr_expect(a == end && !*b,
              "docs/config.md's resource key table differs from config/keys.def (run make config-doc) at:\n%.*s",
              (int)strcspn(line, "\n"), line);
    free(want);
    free(text);
}
