/* Files and the private directory written where another user may reach them
 * (core/safe_file.c): links are never followed, FIFOs never opened, another
 * user's file never written, a created file is 0600 whatever the umask, a
 * directory is trusted only when it is private to this user. */
#include "../../core/common.h"
#include "../../core/safe_file.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/ps_safe_file_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static void expect_text(const char *path, const char *text)
{
    char buf[256] = "";
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    cr_expect_str_eq(buf, text, "%s", path);
}

/* Writes `text` to `path` through core/safe_file.c; the status of create, then commit. */
static int safe_write(const char *path, const char *temporary, const char *text, char *why, size_t why_size)
{
    ps_safe_file_t f;
    int rc = ps_safe_file_create(&f, path, temporary, why, why_size);
    if (rc == PS_OK) {
        cr_assert_eq(write(f.fd, text, strlen(text)), (ssize_t)strlen(text));
        rc = ps_safe_file_commit(&f, why, why_size);
    }
    ps_safe_file_close(&f);
    return rc;
}

/* Nothing but the names given is left in the directory (no temporary file). */
static void expect_only(int count)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq %d", dir, count);
    cr_expect_eq(system(cmd), 0, "%d files expected in %s", count, dir);
}

Test(safe_file, a_new_file_is_0600_whatever_the_umask)
{
    make_dir();
    char path[128], why[128];
    snprintf(path, sizeof path, "%s/stats.json", dir);
    umask(0);
    cr_assert_eq(safe_write(path, NULL, "report\n", why, sizeof why), PS_OK, "%s", why);
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0);
    cr_expect_eq(st.st_mode & 07777, 0600, "mode %o", st.st_mode & 07777);
    umask(0277); /* (even when the umask would take the owner's write permission) */
    cr_assert_eq(safe_write(path, NULL, "again\n", why, sizeof why), PS_OK, "%s", why);
    cr_assert_eq(lstat(path, &st), 0);
    cr_expect_eq(st.st_mode & 07777, 0600, "mode %o", st.st_mode & 07777);
    expect_text(path, "again\n");
    expect_only(1);
    remove_dir();
}

Test(safe_file, a_symbolic_link_is_refused_and_its_target_untouched)
{
    make_dir();
    char path[128], target[128], why[128] = "";
    snprintf(path, sizeof path, "%s/stats.json", dir);
    snprintf(target, sizeof target, "%s/precious", dir);
    write_text(target, "precious\n");
    cr_assert_eq(symlink(target, path), 0);
    cr_expect_eq(safe_write(path, NULL, "report\n", why, sizeof why), PS_EINVAL);
    cr_expect(strstr(why, "symbolic link"), "%s", why);
    expect_text(target, "precious\n");
    struct stat st;
    cr_expect(lstat(path, &st) == 0 && S_ISLNK(st.st_mode), "the link stays");
    cr_expect_eq(chmod(target, 0644), 0);
    expect_only(2);
    remove_dir();
}

/* A FIFO at the name would block an open for writing until a reader comes:
 * refused at once (an alarm fails the test instead of hanging it). */
Test(safe_file, a_fifo_is_refused_without_blocking, .timeout = 10)
{
    make_dir();
    char path[128], why[128] = "";
    snprintf(path, sizeof path, "%s/stats.json", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    alarm(5);
    cr_expect_eq(safe_write(path, NULL, "report\n", why, sizeof why), PS_EINVAL);
    cr_expect(strstr(why, "FIFO"), "%s", why);
    remove_dir();
}

/* A FIFO (or a link) at a private directory's fixed temporary name is
 * removed first, never opened. */
Test(safe_file, a_fifo_at_the_temporary_name_is_replaced, .timeout = 10)
{
    make_dir();
    char path[128], temporary[128], target[128], why[128] = "";
    snprintf(path, sizeof path, "%s/p1.stats", dir);
    snprintf(temporary, sizeof temporary, "%s/p1.stats.new", dir);
    cr_assert_eq(mkfifo(temporary, 0600), 0);
    alarm(5);
    cr_assert_eq(safe_write(path, temporary, "page\n", why, sizeof why), PS_OK, "%s", why);
    expect_text(path, "page\n");
    snprintf(target, sizeof target, "%s/precious", dir);
    write_text(target, "precious\n");
    cr_assert_eq(symlink(target, temporary), 0);
    cr_assert_eq(safe_write(path, temporary, "page 2\n", why, sizeof why), PS_OK, "%s", why);
    expect_text(path, "page 2\n");
    expect_text(target, "precious\n");
    expect_only(2);
    remove_dir();
}

/* A second hard link to another file: the name is replaced, the other file
 * keeps its bytes. */
Test(safe_file, a_file_of_this_user_is_replaced_not_written_through)
{
    make_dir();
    char path[128], other[128], why[128];
    snprintf(path, sizeof path, "%s/stats.json", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    write_text(other, "other\n");
    cr_assert_eq(link(other, path), 0);
    cr_assert_eq(safe_write(path, NULL, "report\n", why, sizeof why), PS_OK, "%s", why);
    expect_text(path, "report\n");
    expect_text(other, "other\n");
    remove_dir();
}

Test(safe_file, a_file_of_another_user_is_refused)
{
    if (geteuid() != 0)
        cr_skip_test("only root can give a file to another user");
    make_dir();
    char path[128], why[128] = "";
    snprintf(path, sizeof path, "%s/stats.json", dir);
    write_text(path, "theirs\n");
    cr_assert_eq(chown(path, 65534, 65534), 0);
    cr_assert_eq(chmod(path, 0666), 0);
    cr_expect_eq(safe_write(path, NULL, "report\n", why, sizeof why), PS_EINVAL);
    cr_expect(strstr(why, "another user (uid 65534)"), "%s", why);
    expect_text(path, "theirs\n");
    expect_only(1);
    remove_dir();
}

Test(safe_file, a_character_device_is_written_as_it_is)
{
    char why[128];
    ps_safe_file_t f;
    cr_assert_eq(ps_safe_file_create(&f, "/dev/null", NULL, why, sizeof why), PS_OK, "%s", why);
    cr_expect(f.direct);
    cr_expect_eq(write(f.fd, "x", 1), 1);
    cr_expect_eq(ps_safe_file_commit(&f, why, sizeof why), PS_OK);
    ps_safe_file_close(&f);
    struct stat st;
    cr_expect(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
}

Test(safe_file, a_directory_or_a_missing_folder_is_refused)
{
    make_dir();
    char path[128], why[128] = "";
    cr_expect_eq(safe_write(dir, NULL, "x", why, sizeof why), PS_EINVAL);
    cr_expect(strstr(why, "directory"), "%s", why);
    snprintf(path, sizeof path, "%s/missing/stats.json", dir);
    cr_expect_neq(safe_write(path, NULL, "x", why, sizeof why), PS_OK);
    cr_expect(strstr(why, "No such file"), "%s", why);
    remove_dir();
}

/* ---- the private directory ------------------------------------------------ */
Test(safe_dir, made_private_whatever_the_umask)
{
    make_dir();
    char path[128], why[512] = "";
    snprintf(path, sizeof path, "%s/registry", dir);
    umask(0777);
    cr_assert_eq(ps_safe_dir_check(path, true, why, sizeof why), PS_OK, "%s", why);
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0700, "mode %o", st.st_mode & 0777);
    cr_expect_eq(ps_safe_dir_check(path, false, why, sizeof why), PS_OK, "%s", why);
    remove_dir();
}

Test(safe_dir, an_open_directory_is_refused_with_how_to_fix_it_in_one_line)
{
    make_dir();
    char path[128], why[512] = "";
    snprintf(path, sizeof path, "%s/registry", dir);
    cr_assert_eq(mkdir(path, 0700), 0);
    cr_assert_eq(chmod(path, 0777), 0);
    cr_expect_eq(ps_safe_dir_check(path, true, why, sizeof why), PS_EINVAL);
    cr_expect(strstr(why, "is not a private directory of this user") && strstr(why, "mode 777") &&
                  strstr(why, "to fix it: chmod 700 ") && !strchr(why, '\n'),
              "%s", why);
    remove_dir();
}

Test(safe_dir, a_link_to_a_private_directory_is_refused)
{
    make_dir();
    char path[128], target[128], why[512] = "";
    snprintf(target, sizeof target, "%s/real", dir);
    snprintf(path, sizeof path, "%s/registry", dir);
    cr_assert_eq(mkdir(target, 0700), 0);
    cr_assert_eq(symlink(target, path), 0);
    cr_expect_eq(ps_safe_dir_check(path, true, why, sizeof why), PS_EINVAL);
    cr_expect(strstr(why, "a link") && strstr(why, "to fix it: remove "), "%s", why);
    remove_dir();
}

Test(safe_dir, another_users_directory_is_refused_naming_xdg_runtime_dir)
{
    if (geteuid() != 0)
        cr_skip_test("only root can give a directory to another user");
    make_dir();
    char path[128], why[512] = "";
    snprintf(path, sizeof path, "%s/registry", dir);
    cr_assert_eq(mkdir(path, 0700), 0);
    cr_assert_eq(chown(path, 65534, 65534), 0);
    cr_expect_eq(ps_safe_dir_check(path, true, why, sizeof why), PS_EINVAL);
    cr_expect(strstr(why, "owner 65534") && strstr(why, "XDG_RUNTIME_DIR"), "%s", why);
    remove_dir();
}

/* XDG_RUNTIME_DIR is used only when it is private to this user. */
Test(safe_dir, xdg_runtime_dir_first_when_it_is_private)
{
    make_dir();
    char home[256], other[256], expected[256], shared[64];
    snprintf(shared, sizeof shared, "/dev/shm/poolshim-%u", (unsigned)geteuid());
    cr_assert_eq(chmod(dir, 0700), 0);
    setenv("XDG_RUNTIME_DIR", dir, 1);
    ps_safe_dir_paths(home, sizeof home, other, sizeof other);
    snprintf(expected, sizeof expected, "%s/poolshim", dir);
    cr_expect_str_eq(home, expected);
    cr_expect_str_eq(other, shared);
    cr_assert_eq(chmod(dir, 0755), 0);
    ps_safe_dir_paths(home, sizeof home, other, sizeof other);
    cr_expect_str_eq(home, shared, "a runtime directory others may enter is not used");
    cr_expect_str_eq(other, "");
    setenv("XDG_RUNTIME_DIR", "relative/path", 1);
    ps_safe_dir_paths(home, sizeof home, other, sizeof other);
    cr_expect_str_eq(home, shared);
    unsetenv("XDG_RUNTIME_DIR");
    ps_safe_dir_paths(home, sizeof home, other, sizeof other);
    cr_expect_str_eq(home, shared);
    remove_dir();
}
