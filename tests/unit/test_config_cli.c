/* `poolshim config`: --check exits 0 for a valid file and 1 printing every
 * error; without --check it prints the tree. Runs the CLI that
 * `make test-unit` names in POOLSHIM_CLI, with a clean environment. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* Runs the CLI with args; returns its exit status and its output in out. */
static int run_cli(const char *args, char *out, size_t size)
{
    const char *cli = getenv("POOLSHIM_CLI");
    const char *data = getenv("POOLSHIM_TEST_DATA");
    cr_assert_not_null(cli, "POOLSHIM_CLI must be set (make test-unit sets it)");
    cr_assert_not_null(data);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd %s/.. && env -i HOME=/nonexistent %s%s config %s 2>&1", data,
             cli[0] == '/' ? "" : "../", cli, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    cr_assert(WIFEXITED(status), "the CLI did not exit normally: %s", out);
    return WEXITSTATUS(status);
}

Test(config_cli, check_accepts_a_valid_file)
{
    char out[8192];
    cr_assert_eq(run_cli("--check --file ../config/examples/per_device.ini", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "configuration is valid"), "%s", out);
}

Test(config_cli, check_rejects_an_invalid_file_printing_every_error)
{
    char out[8192];
    cr_assert_eq(run_cli("--check --file data/config/many_errors.ini", out, sizeof out), 1, "%s", out);
    int lines = 0;
    for (const char *p = out; (p = strstr(p, "poolshim: error: data/config/many_errors.ini:")); p++)
        lines++;
    cr_assert_eq(lines, 5, "%s", out);
}

Test(config_cli, prints_the_stack_of_a_device)
{
    char out[16384];
    cr_assert_eq(run_cli("--file ../config/examples/per_device.ini --device 1", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "[device.1] resource = serve_cap"), "%s", out);
    cr_assert(strstr(out, "[resource.serve] type = arena"), "%s", out);
}

Test(config_cli, options_flag_and_bad_usage)
{
    char out[8192];
    cr_assert_eq(run_cli("--check --options global.stats=", out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "POOLSHIM_OPTIONS item 1: bad value `` for `stats`"), "%s", out);
    cr_assert_eq(run_cli("--device banana", out, sizeof out), 2, "%s", out);
    cr_assert_eq(run_cli("--frobnicate", out, sizeof out), 2, "%s", out);
}

Test(config_cli, check_takes_the_file_positionally)
{
    char out[8192];
    cr_assert_eq(run_cli("--check ../config/examples/per_device.ini", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "configuration is valid (../config/examples/per_device.ini)"), "%s", out);
    cr_assert_eq(run_cli("../config/examples/per_device.ini --check", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "configuration is valid"), "%s", out);
}

Test(config_cli, prints_a_positional_file)
{
    char out[16384];
    cr_assert_eq(run_cli("../config/examples/per_device.ini --device 1", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "[device.1] resource = serve_cap"), "%s", out);
    cr_assert(strstr(out, "[resource.serve] type = arena"), "%s", out);
}

Test(config_cli, positional_bad_file_prints_every_error)
{
    char out[8192];
    cr_assert_eq(run_cli("--check data/config/many_errors.ini", out, sizeof out), 1, "%s", out);
    int lines = 0;
    for (const char *p = out; (p = strstr(p, "poolshim: error: data/config/many_errors.ini:")); p++)
        lines++;
    cr_assert_eq(lines, 5, "%s", out);
    cr_assert(strstr(out, "poolshim: 5 error(s) in the configuration"), "%s", out);
}

Test(config_cli, positional_missing_file_says_it_cannot_be_read)
{
    char out[8192];
    cr_assert_eq(run_cli("--check data/config/no_such_file.ini", out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "poolshim: error: data/config/no_such_file.ini: cannot read the configuration file: "
                          "No such file or directory"),
              "%s", out);
    cr_assert_eq(run_cli("data/config/no_such_file.ini", out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "cannot read the configuration file"), "%s", out);
}

Test(config_cli, two_files_are_a_usage_error)
{
    char out[8192];
    cr_assert_eq(run_cli("a.ini b.ini", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "poolshim: error: config: one configuration file only (`a.ini`, then `b.ini`)"), "%s", out);
    cr_assert_eq(run_cli("--file a.ini b.ini", out, sizeof out), 2, "%s", out);
    cr_assert_eq(run_cli("a.ini --file b.ini", out, sizeof out), 2, "%s", out);
}


/* --check reads a stream: /dev/stdin on a pipe is neither seeked nor sized. */
Test(config_cli, check_reads_a_configuration_from_a_pipe)
{
    const char *cli = getenv("POOLSHIM_CLI");
    cr_assert_not_null(cli);
    char out_path[] = "/tmp/poolshim-stdin-XXXXXX";
    int fd = mkstemp(out_path);
    cr_assert_geq(fd, 0);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "env -i HOME=/nonexistent %s config --check /dev/stdin >%s 2>&1", cli, out_path);
    FILE *p = popen(cmd, "w");
    cr_assert_not_null(p);
    fputs("[global]\nstats = text\n", p);
    int status = pclose(p);
    char out[4096] = "";
    FILE *f = fdopen(fd, "r");
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    fclose(f);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit %d: %s", WEXITSTATUS(status), out);
    cr_expect(strstr(out, "configuration is valid (/dev/stdin)"), "%s", out);

    /* and an invalid one from a pipe names /dev/stdin:LINE */
    snprintf(cmd, sizeof cmd, "env -i HOME=/nonexistent %s config --check /dev/stdin >%s 2>&1", cli, out_path);
    p = popen(cmd, "w");
    cr_assert_not_null(p);
    fputs("[global]\nstats = xml\n", p);
    status = pclose(p);
    f = fopen(out_path, "r");
    n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    fclose(f);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 1, "%s", out);
    cr_expect(strstr(out, "/dev/stdin:2: bad value `xml`"), "%s", out);
    unlink(out_path);
}
