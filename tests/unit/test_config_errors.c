/* Every mistake gets a clear error: one fixture per error case in
 * tests/data/config/NAME.ini, the exact expected output of
 * ps_config_print_errors beside it in NAME.expected (@FILE@ stands for the
 * fixture's path). NAME.ini may be missing on purpose (missing_file). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../config/config_internal.h"
#include "../../tools/cli.h" /* cli_read_file */


/* Replaces every @FILE@ in text by path. */
static char *with_path(const char *text, const char *path)
{
    char *out = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&out, &size);
    for (const char *p = text; *p;) {
        const char *at = strstr(p, "@FILE@");
        if (!at) {
            fputs(p, m);
            break;
        }
        fwrite(p, 1, (size_t)(at - p), m);
        fputs(path, m);
        p = at + 6;
    }
    fclose(m);
    return out;
}

static const char *data_dir(void)
{
    const char *d = getenv("POOLSHIM_TEST_DATA");
    cr_assert_not_null(d, "POOLSHIM_TEST_DATA must be set (make test-unit sets it)");
    return d;
}

/* Loads one fixture; returns the printed errors (caller frees). */
static char *errors_of(const char *ini, int *rc, size_t *count)
{
    ps_config_input_t in = {.file = ini, .no_env = 1};
    ps_config_t *cfg = NULL;
    *rc = ps_config_load(&in, &cfg);
    cr_assert_not_null(cfg, "the config is returned even when invalid");
    char *out = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&out, &size);
    ps_config_print_errors(cfg, m);
    fclose(m);
    *count = ps_config_error_count(cfg);
    ps_config_free(cfg);
    return out;
}

Test(config_errors, every_fixture_prints_exactly_its_expected_errors)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/config", data_dir());
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s", dir);
    struct dirent *e;
    int fixtures = 0, failures = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 10 || strcmp(e->d_name + len - 9, ".expected") != 0)
            continue;
        char expected_path[8192], ini[8192];
        snprintf(expected_path, sizeof expected_path, "%s/%s", dir, e->d_name);
        snprintf(ini, sizeof ini, "%s/%.*s.ini", dir, (int)(len - 9), e->d_name);
        char *raw = NULL;
        cr_assert_eq(cli_read_file(expected_path, &raw, NULL), 0, "cannot read %s", expected_path);
        char *expected = with_path(raw, ini);
        int rc;
        size_t count;
        char *got = errors_of(ini, &rc, &count);
        size_t lines = 0;
        for (const char *p = expected; *p; p++)
            lines += *p == '\n';
        fixtures++;
        if (strcmp(got, expected) != 0 || rc != PS_ECONFIG || count != lines || lines == 0) {
            failures++;
            cr_log_error("%s: rc %d, %zu errors\n--- expected\n%s--- got\n%s", ini, rc, count, expected,
                         got);
        }
        free(got);
        free(expected);
        free(raw);
    }
    closedir(d);
    cr_assert_geq(fixtures, 30, "the fixtures were not found (only %d)", fixtures);
    cr_assert_eq(failures, 0, "%d of %d fixtures differ (see the log above)", failures, fixtures);
}

Test(config_errors, every_error_fixture_has_an_expected_file)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/config", data_dir());
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".ini") != 0)
            continue;
        char expected[8192];
        snprintf(expected, sizeof expected, "%s/%.*s.expected", dir, (int)(len - 4), e->d_name);
        FILE *f = fopen(expected, "r");
        cr_expect_not_null(f, "%s has no .expected file beside it", e->d_name);
        if (f)
            fclose(f);
    }
    closedir(d);
}

Test(config_errors, all_errors_are_collected_not_only_the_first)
{
    char ini[4096];
    snprintf(ini, sizeof ini, "%s/config/many_errors.ini", data_dir());
    int rc;
    size_t count;
    char *got = errors_of(ini, &rc, &count);
    cr_assert_eq(rc, PS_ECONFIG);
    cr_assert_geq(count, 5, "one error per mistake in the file, got:\n%s", got);
    free(got);
}

Test(config_errors, errors_name_the_place_key_value_and_expectation)
{
    const char *text = "[resource.main]\ntype = pool\n\ninitial_size = 12 parsecs\n";
    ps_config_input_t in = {.no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load_text(text, "mine.ini", &in, &cfg), PS_ECONFIG);
    cr_assert_eq(ps_config_error_count(cfg), 1);
    const char *e = ps_config_error(cfg, 0);
    cr_assert(strstr(e, "mine.ini:4: ") == e, "the place first: %s", e);
    cr_assert(strstr(e, "`initial_size`") && strstr(e, "`12 parsecs`") && strstr(e, "[resource.main]"),
              "key, value and section: %s", e);
    cr_assert(strstr(e, "(expected a size"), "what is expected: %s", e);
    ps_config_free(cfg);
}

Test(config_errors, a_valid_file_has_no_errors)
{
    const char *text = "[global]\nstats = json\n[resource.main]\ntype = arena\ninitial_size = 10%\n";
    ps_config_input_t in = {.no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load_text(text, "ok.ini", &in, &cfg), PS_OK);
    cr_assert_eq(ps_config_error_count(cfg), 0);
    cr_assert_eq(ps_config_global(cfg)->stats, PS_STATS_JSON);
    ps_config_free(cfg);
}

Test(config_errors, ini_syntax_quirks_are_handled)
{
    /* indented keys are keys (not inih continuations), ';' comments inline, ':' separates too,
     * CRLF line ends and a UTF-8 BOM are accepted */
    const char *text = "\xEF\xBB\xBF[resource.main]\r\n  type = pool\r\n"
                       "    initial_size = 1GiB ; a comment\r\n  min_chunk: 64MiB\r\n";
    ps_config_input_t in = {.no_env = 1};
    ps_config_t *cfg = NULL;
    int rc = ps_config_load_text(text, "quirks.ini", &in, &cfg);
    if (rc != PS_OK)
        ps_config_print_errors(cfg, stderr);
    cr_assert_eq(rc, PS_OK);
    int main_index = ps_config_def_index(cfg, "main");
    cr_assert_geq(main_index, 0);
    const ps_resource_def_t *def = &cfg->defs[main_index];
    cr_assert_eq(def->values[PS_KEY_INITIAL_SIZE].number, 1ull << 30);
    cr_assert_eq(def->values[PS_KEY_INITIAL_SIZE].origin.line, 3);
    cr_assert_eq(def->values[PS_KEY_MIN_CHUNK].number, 64ull << 20);
    ps_config_free(cfg);
}

Test(config_errors, a_cut_section_name_is_reported_not_truncated_silently)
{
    const char *text = "[resource.a_name_that_is_much_longer_than_inih_keeps_in_its_buffers]\ntype = pool\n";
    ps_config_input_t in = {.no_env = 1};
    ps_config_t *cfg = NULL;
    cr_assert_eq(ps_config_load_text(text, "long.ini", &in, &cfg), PS_ECONFIG);
    cr_assert_eq(ps_config_error_count(cfg), 1, "one error, at the header");
    cr_assert(strstr(ps_config_error(cfg, 0), "long.ini:1: section name"), "%s", ps_config_error(cfg, 0));
    cr_assert(strstr(ps_config_error(cfg, 0), "too long"), "%s", ps_config_error(cfg, 0));
    ps_config_free(cfg);
}
