/* `poolshim --version` (and `version`, `-V`) print "poolshim X" where X is
 * the content of the file VERSION (`make test-unit` names it in
 * POOLSHIM_TEST_VERSION_FILE), and the help text mentions it. Starts the real
 * CLI (POOLSHIM_CLI), as tests/unit/test_cli.c does. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static const char *version_file_content(void)
{
    static char version[64];
    const char *path = getenv("POOLSHIM_TEST_VERSION_FILE");
    FILE *f = fopen(path && *path ? path : "VERSION", "r");
    cr_assert(f, "cannot read the VERSION file (POOLSHIM_TEST_VERSION_FILE=%s)", path ? path : "");
    cr_assert(fgets(version, sizeof version, f), "VERSION is empty");
    fclose(f);
    version[strcspn(version, "\r\n")] = 0;
    cr_assert(version[0], "VERSION is empty");
    return version;
}

/* Runs `POOLSHIM_CLI args` with stderr kept apart; returns the exit status,
 * stdout in out and stderr's size in err_bytes. */
static int run_cli(const char *args, char *out, size_t size, size_t *err_bytes)
{
    const char *cli = getenv("POOLSHIM_CLI");
    char err_path[] = "/tmp/poolshim-version-err-XXXXXX";
    int fd = mkstemp(err_path);
    cr_assert(fd >= 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>%s", cli && *cli ? cli : "build/poolshim", args, err_path);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = 0;
    int st = pclose(p);
    FILE *e = fdopen(fd, "r");
    fseek(e, 0, SEEK_END);
    *err_bytes = (size_t)ftell(e);
    fclose(e);
    remove(err_path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Test(version_cli, every_spelling_prints_the_version_file)
{
    char want[128], out[4096];
    snprintf(want, sizeof want, "poolshim %s\n", version_file_content());
    const char *spellings[] = {"--version", "version", "-V"};
    for (size_t i = 0; i < sizeof spellings / sizeof spellings[0]; i++) {
        size_t err_bytes = 0;
        int rc = run_cli(spellings[i], out, sizeof out, &err_bytes);
        cr_expect_eq(rc, 0, "poolshim %s exited %d", spellings[i], rc);
        cr_expect_str_eq(out, want, "poolshim %s", spellings[i]);
        cr_expect_eq(err_bytes, 0, "poolshim %s wrote to stderr", spellings[i]);
    }
}

Test(version_cli, help_names_the_version_command)
{
    char out[8192];
    size_t err_bytes = 0;
    cr_expect_eq(run_cli("--help", out, sizeof out, &err_bytes), 0);
    cr_expect(strstr(out, "--version"), "--help mentions --version:\n%s", out);
}
