/* A shared machine: what another local user (or a careless one) can do to a
 * program under the shim, and what it must not achieve (docs/security.md).
 * Each attack is run against the shim over the fake CUDA:
 *
 *   files       statistics and log files: links, FIFOs, others' files, umask
 *   registry    the private directory and the entries in it
 *   neighbours  silent neighbours: the wait they cost, the holder still asked
 *   top         pages with terminal escapes, a page with 5,000 devices
 *   ipc         silent connections, a squatted socket name, a crafted handle
 *   users       the same with two throw-away users (root only: made before the
 *               tests and removed after; otherwise each test skips saying so)
 *
 * fs.protected_symlinks, protected_regular and protected_fifos (the kernel's
 * own guards in sticky world-writable directories) would hide an attack
 * planted there, so the tests that must fail without the shim's fix plant
 * theirs in directories those guards do not cover; the sticky-directory
 * tests stand beside them as the scene a user meets. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char output[1 << 20];

/* ---- running the test programs -------------------------------------------------- */
/* The shell command that runs `prog args` from the build's shimtest folder
 * under the shim, with `env` prepended and `before` (shell words, such as
 * "umask 000;") in front. */
static void command(char *cmd, size_t size, const char *before, const char *env, const char *prog_and_args)
{
    const char *build = getenv("POOLSHIM_BUILD");
    const char *prefix = getenv("POOLSHIM_PRELOAD_PREFIX");
    cr_assert(build, "POOLSHIM_BUILD must name the build folder (make test-shim sets it)");
    char abs_build[1024];
    cr_assert(realpath(build, abs_build), "%s", build);
    snprintf(cmd, size, "%s env -u XDG_RUNTIME_DIR LD_LIBRARY_PATH=%s/fake LD_PRELOAD=\"%s%s%s/libpoolshim.so\" %s %s/shimtest/%s",
             before ? before : "", abs_build, prefix && *prefix ? prefix : "", prefix && *prefix ? " " : "", abs_build,
             env ? env : "", abs_build, prog_and_args);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Runs a shell command; its exit status, stdout+stderr in `output`. */
static int shell(const char *cmd)
{
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    cr_assert(p, "cannot run %s", full);
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Runs `prog args` under the shim (command() above). */
static int run(const char *before, const char *env, const char *prog_and_args)
{
    char cmd[4096];
    command(cmd, sizeof cmd, before, env, prog_and_args);
    return shell(cmd);
}

/* Starts a shell command in the background, its output in the file `out`;
 * returns its pid (the program's own: sh execs it). */
static pid_t start_background(const char *cmd, const char *out)
{
    char full[8192];
    snprintf(full, sizeof full, "exec %s > %s 2>&1", cmd, out);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Waits up to `seconds` for `pid` to end; its status, or -1 (then killed). */
static int wait_end(pid_t pid, double seconds)
{
    int status = 0;
    for (double until = now_s() + seconds; now_s() < until;) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(5000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Waits up to `seconds` for `path`; false also when `pid` ended first. */
static bool wait_for_file(const char *path, pid_t pid, double seconds)
{
    for (double until = now_s() + seconds; now_s() < until;) {
        if (exists(path))
            return true;
        if (pid > 0 && waitpid(pid, NULL, WNOHANG) == pid)
            return false;
        usleep(5000);
    }
    return false;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* The file's first bytes (NUL-ended) into buf; "" when it cannot be read. */
static const char *read_text(const char *path, char *buf, size_t size)
{
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return buf;
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* A temporary folder of the test (mode 0700 unless changed). */
static char scene[64];
static void scene_init(void)
{
    snprintf(scene, sizeof scene, "/tmp/ps_security_XXXXXX");
    cr_assert_not_null(mkdtemp(scene));
}
static void scene_cleanup(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", scene);
    cr_expect_eq(system(cmd), 0);
}

/* Field 22 of /proc/<pid>/stat (0: gone). */
static unsigned long long start_of(pid_t pid)
{
    char path[64], buf[1024] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    read_text(path, buf, sizeof buf);
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    p += 2;
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

static unsigned long long own_pid_namespace(void)
{
    struct stat st;
    cr_assert_eq(stat("/proc/self/ns/pid", &st), 0);
    return (unsigned long long)st.st_ino;
}

/* ---- files: the statistics file and the logs -------------------------------------- */
#define PRECIOUS "precious bytes of this user\n"

/* A run whose statistics go to `stats_file` (refused): the target keeps its
 * bytes, the refusal says why, and the report comes on stderr instead. */
static void expect_statistics_refused(const char *stats_file, const char *precious, const char *why)
{
    char env[1024], buf[256];
    snprintf(env, sizeof env, "POOLSHIM_STATS=json POOLSHIM_STATS_FILE=%s", stats_file);
    int rc = run(NULL, env, "prog_runtime basic");
    cr_expect_eq(rc, 0, "%s", output);
    cr_expect_str_eq(read_text(precious, buf, sizeof buf), PRECIOUS, "the target was written");
    cr_expect(strstr(output, "cannot write statistics to") && strstr(output, why), "%s", output);
    cr_expect(strstr(output, "{\"poolshim\": 1"), "the report is printed instead:\n%s", output);
}

Test(files, a_statistics_file_that_is_a_link_is_refused_and_its_target_untouched)
{
    scene_init();
    char precious[128], link_path[128];
    snprintf(precious, sizeof precious, "%s/precious", scene);
    snprintf(link_path, sizeof link_path, "%s/stats.json", scene);
    write_text(precious, PRECIOUS);
    cr_assert_eq(symlink(precious, link_path), 0);
    expect_statistics_refused(link_path, precious, "symbolic link");
    scene_cleanup();
}

/* The name carries the pid (%p): links planted for the next 2,000 pids. */
Test(files, links_planted_for_the_next_pids_redirect_no_report)
{
    scene_init();
    char precious[128], path[160], buf[64] = "";
    snprintf(precious, sizeof precious, "%s/precious", scene);
    write_text(precious, PRECIOUS);
    long last = strtol(read_text("/proc/sys/kernel/ns_last_pid", buf, sizeof buf), NULL, 10);
    long pid_max = strtol(read_text("/proc/sys/kernel/pid_max", buf, sizeof buf), NULL, 10);
    cr_assert(last > 0 && pid_max > 0);
    for (long i = 1; i <= 2000; i++) {
        snprintf(path, sizeof path, "%s/stats_%ld.json", scene, (last + i) % pid_max);
        cr_assert_eq(symlink(precious, path), 0, "%s", path);
    }
    snprintf(path, sizeof path, "%s/stats_%%p.json", scene);
    expect_statistics_refused(path, precious, "symbolic link");
    const char *pid = strstr(output, "\"pid\": ");
    long got = pid ? strtol(pid + 7, NULL, 10) : -1;
    cr_expect((got - last + pid_max) % pid_max >= 1 && (got - last + pid_max) % pid_max <= 2000,
              "the program's pid %ld fell outside the planted links (after %ld)", got, last);
    scene_cleanup();
}

Test(files, a_log_file_that_is_a_link_is_refused_and_its_target_untouched)
{
    scene_init();
    char precious[128], env[512], buf[256];
    snprintf(precious, sizeof precious, "%s/precious", scene);
    write_text(precious, PRECIOUS);
    char link_path[128];
    snprintf(link_path, sizeof link_path, "%s/log.csv", scene);
    cr_assert_eq(symlink(precious, link_path), 0);
    snprintf(env, sizeof env, "POOLSHIM_LOG=%s", link_path);
    int rc = run(NULL, env, "prog_runtime basic");
    cr_expect_neq(rc, 0, "the stack cannot be built without its log:\n%s", output);
    cr_expect(strstr(output, "log: cannot open") && strstr(output, "symbolic link"), "%s", output);
    cr_expect_str_eq(read_text(precious, buf, sizeof buf), PRECIOUS, "the target was written");
    /* the companion file (PATH.reserved.csv) a link: the log goes on without it */
    snprintf(link_path, sizeof link_path, "%s/log2.csv.reserved.csv", scene);
    cr_assert_eq(symlink(precious, link_path), 0);
    snprintf(env, sizeof env, "POOLSHIM_LOG=%s/log2.csv", scene);
    rc = run(NULL, env, "prog_runtime basic");
    cr_expect_eq(rc, 0, "%s", output);
    cr_expect(strstr(output, "log2.csv.reserved.csv") && strstr(output, "symbolic link"), "%s", output);
    cr_expect_str_eq(read_text(precious, buf, sizeof buf), PRECIOUS, "the target was written");
    scene_cleanup();
}

/* Under umask 000 the statistics file and the logs are still 0600. */
Test(files, statistics_and_logs_are_0600_whatever_the_umask)
{
    scene_init();
    char env[512], path[160];
    snprintf(env, sizeof env, "POOLSHIM_STATS=json POOLSHIM_STATS_FILE=%s/stats.json POOLSHIM_LOG=%s/log.csv", scene,
             scene);
    int rc = run("umask 000;", env, "prog_runtime basic");
    cr_expect_eq(rc, 0, "%s", output);
    const char *names[] = {"stats.json", "log.csv", "log.csv.reserved.csv"};
    for (int i = 0; i < 3; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", scene, names[i]);
        cr_expect(lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0600, "%s: mode %o", path,
                  lstat(path, &st) == 0 ? st.st_mode & 07777 : 0);
    }
    cr_expect(!strstr(output, ".tmp"), "no temporary file named:\n%s", output);
    DIR *d = opendir(scene);
    int files = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        files += e->d_name[0] != '.';
    if (d)
        closedir(d);
    cr_expect_eq(files, 3, "no temporary file is left");
    scene_cleanup();
}

/* A file of another user that anyone may write, in a directory anyone may
 * write (no sticky bit, so the kernel's protected_regular does not apply). */
Test(files, a_statistics_file_of_another_user_is_refused)
{
    if (geteuid() != 0)
        cr_skip_test("only root can give a file to another user");
    scene_init();
    cr_assert_eq(chmod(scene, 0777), 0);
    char theirs[128];
    snprintf(theirs, sizeof theirs, "%s/stats.json", scene);
    write_text(theirs, PRECIOUS);
    cr_assert_eq(chown(theirs, 65534, 65534), 0);
    cr_assert_eq(chmod(theirs, 0666), 0);
    expect_statistics_refused(theirs, theirs, "another user (uid 65534)");
    scene_cleanup();
}

/* A FIFO where the statistics file goes: refused at once, never opened. */
Test(files, a_fifo_as_the_statistics_file_does_not_hang_the_exit, .timeout = 30)
{
    scene_init();
    char fifo[128], cmd[4096], env[512], out[160];
    snprintf(fifo, sizeof fifo, "%s/stats.json", scene);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    snprintf(env, sizeof env, "POOLSHIM_STATS=json POOLSHIM_STATS_FILE=%s", fifo);
    command(cmd, sizeof cmd, NULL, env, "prog_runtime basic");
    snprintf(out, sizeof out, "%s/out.txt", scene);
    int rc = wait_end(start_background(cmd, out), 10);
    cr_expect_eq(rc, 0, "the program did not end within 10 s (rc %d)", rc);
    scene_cleanup();
}

/* ---- registry: the private directory and its entries ------------------------------- */
/* FIFOs where a process writes its registry entry and its live page (under
 * their temporary names N.new and N.stats.new, planted before its first
 * allocation: `prog_neighbours hold` waits for SCENE/go): an open for
 * writing would wait for a reader for ever, and the give-back thread with
 * it, and the exit that joins that thread. The process must register,
 * publish, and end at once, leaving nothing. */
Test(registry, fifos_at_the_entries_temporary_names_do_not_hang_the_exit, .timeout = 60)
{
    scene_init();
    char registry_dir[128], name[128], path[300], buf[8192], env[512], cmd[4096], args[256], out[160];
    snprintf(registry_dir, sizeof registry_dir, "%s/registry", scene);
    cr_assert_eq(mkdir(registry_dir, 0700), 0);
    snprintf(path, sizeof path, "%s/wait_go", scene);
    write_text(path, "");
    snprintf(env, sizeof env, "POOLSHIM_TEST_NEIGHBOURS_DIR=%s POOLSHIM_DECAY_MS=0", registry_dir);
    snprintf(args, sizeof args, "prog_neighbours hold %s 4", scene);
    command(cmd, sizeof cmd, NULL, env, args);
    snprintf(out, sizeof out, "%s/holder.txt", scene);
    pid_t pid = start_background(cmd, out);
    unsigned long long start = start_of(pid);
    cr_assert(start, "the program did not start");
    snprintf(name, sizeof name, "p%d-%llu-%llu", (int)pid, start, own_pid_namespace());
    const char *suffixes[] = {".new", ".stats.new"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s%s", registry_dir, name, suffixes[i]);
        cr_assert_eq(mkfifo(path, 0600), 0, "%s", path);
    }
    snprintf(path, sizeof path, "%s/go", scene);
    write_text(path, "");
    snprintf(path, sizeof path, "%s/%s.stats", registry_dir, name);
    bool published = wait_for_file(path, pid, 10);
    snprintf(path, sizeof path, "%s/release", scene);
    write_text(path, "");
    int rc = wait_end(pid, 10);
    read_text(out, buf, sizeof buf);
    cr_expect(published, "no live page within 10 s:\n%s", buf);
    cr_expect_eq(rc, 0, "the program did not end well within 10 s (rc %d):\n%s", rc, buf);
    DIR *d = opendir(registry_dir);
    for (struct dirent *e; d && (e = readdir(d));)
        cr_expect(e->d_name[0] == '.', "%s/%s left", registry_dir, e->d_name);
    if (d)
        closedir(d);
    scene_cleanup();
}

/* $XDG_RUNTIME_DIR (made by the system for this user alone) holds the
 * registry when it is private; one that others may enter is not used. */
Test(registry, it_lives_in_xdg_runtime_dir_when_that_is_private)
{
    scene_init();
    char env[512], expected[256];
    snprintf(env, sizeof env, "XDG_RUNTIME_DIR=%s POOLSHIM_VERBOSE=3", scene);
    cr_assert_eq(run(NULL, env, "prog_runtime basic"), 0, "%s", output);
    snprintf(expected, sizeof expected, "GPU(s) as %s/poolshim/p", scene);
    cr_expect(strstr(output, expected), "expected '%s' in:\n%s", expected, output);
    struct stat st;
    snprintf(expected, sizeof expected, "%s/poolshim", scene);
    cr_expect(lstat(expected, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700, "%s", expected);
    cr_assert_eq(chmod(scene, 0755), 0);
    cr_assert_eq(run(NULL, env, "prog_runtime basic"), 0, "%s", output);
    snprintf(expected, sizeof expected, "GPU(s) as /dev/shm/poolshim-%u/p", (unsigned)geteuid());
    cr_expect(strstr(output, expected), "expected '%s' in:\n%s", expected, output);
    scene_cleanup();
}

/* ---- neighbours: silent ones cost one wait, and the holder is still asked ---------- */
/* Two programs share one fake GPU of 256 MiB (the capacity file charges
 * both); the decay is off, so only a neighbour can give memory back. */
#define HOOD_ENV "FAKE_CUDA_MEMORY=268435456 POOLSHIM_DECAY_MS=0 POOLSHIM_STATS=json POOLSHIM_VERBOSE=2 " \
                 "POOLSHIM_OPTIONS=global.neighbour_wait_ms=500"
static char registry[200]; /* the registry of the test (POOLSHIM_TEST_NEIGHBOURS_DIR) */
static char hood_env[1024];

/* The registry on tmpfs (/dev/shm) when there is one, else in the scene. */
static void hood_init(void)
{
    scene_init();
    struct stat st;
    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(registry, sizeof registry, "/dev/shm/ps_security_XXXXXX");
        cr_assert_not_null(mkdtemp(registry));
    } else {
        snprintf(registry, sizeof registry, "%s/registry", scene);
        cr_assert_eq(mkdir(registry, 0700), 0);
    }
    snprintf(hood_env, sizeof hood_env, HOOD_ENV " FAKE_CUDA_SHARED_CAPACITY_FILE=%s/capacity POOLSHIM_TEST_NEIGHBOURS_DIR=%s",
             scene, registry);
}

static void hood_cleanup(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", registry);
    cr_expect_eq(system(cmd), 0);
    scene_cleanup();
}

/* The fake GPU's UUID as the registry writes it. */
static void fake_uuid(char *out, size_t size)
{
    cr_assert_eq(run(NULL, hood_env, "prog_neighbours uuid"), 0, "%s", output);
    const char *u = strstr(output, "GPU-");
    cr_assert(u, "%s", output);
    snprintf(out, size, "%.40s", u);
}

/* `count` live neighbours that never answer: entries of other pid
 * namespaces (judged by their socket alone) whose sockets this test binds
 * and never reads. Their fds go to fds[]. */
static void fabricate_silent(int count, const char *uuid, int *fds)
{
    unsigned long long ns = own_pid_namespace();
    for (int i = 0; i < count; i++) {
        char name[80], path[300];
        snprintf(name, sizeof name, "p%d-%llu-%llu", (int)getpid(), start_of(getpid()), ns + 1000 + (unsigned)i);
        snprintf(path, sizeof path, "%s/%s.gpus", registry, name);
        char text[128];
        snprintf(text, sizeof text, "poolshim neighbours 1\n%s\n", uuid);
        write_text(path, text);
        cr_assert_eq(chmod(path, 0600), 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        cr_assert_lt((size_t)snprintf(a.sun_path, sizeof a.sun_path, "%s/%s.sock", registry, name), sizeof a.sun_path);
        fds[i] = socket(AF_UNIX, SOCK_DGRAM, 0);
        cr_assert_geq(fds[i], 0);
        cr_assert_eq(bind(fds[i], (struct sockaddr *)&a, sizeof a), 0, "%s", a.sun_path);
    }
}

/* The milliseconds of `prog_neighbours fail`'s call i (-1: not printed). */
static double fail_ms(int i)
{
    char marker[64];
    snprintf(marker, sizeof marker, "fail: call %d returned ", i);
    const char *at = strstr(output, marker);
    at = at ? strstr(at, " after ") : NULL;
    return at ? strtod(at + 7, NULL) : -1;
}

/* 20 silent neighbours: the first failing allocation waits for them (500 ms),
 * the next ones do not (each is remembered as silent for 30 s, however many
 * there are). */
Test(neighbours, twenty_silent_neighbours_cost_only_the_first_out_of_memory_a_wait, .timeout = 60)
{
    hood_init();
    char uuid[48], args[256];
    fake_uuid(uuid, sizeof uuid);
    int fds[20];
    fabricate_silent(20, uuid, fds);
    snprintf(args, sizeof args, "prog_neighbours fail %s 3", scene);
    int rc = run(NULL, hood_env, args);
    cr_expect_eq(rc, 0, "%s", output);
    cr_expect(fail_ms(0) >= 450, "the first ask waits for the silent ones (%.1f ms):\n%s", fail_ms(0), output);
    cr_expect(fail_ms(1) >= 0 && fail_ms(1) < 250, "the second waits %.1f ms:\n%s", fail_ms(1), output);
    cr_expect(fail_ms(2) >= 0 && fail_ms(2) < 250, "the third waits %.1f ms:\n%s", fail_ms(2), output);
    for (int i = 0; i < 20; i++)
        close(fds[i]);
    hood_cleanup();
}

/* Whether the registry's directory lists newer names first (tmpfs did, in
 * some kernels; others list them in the order made). */
static bool newest_listed_first(void)
{
    char first[300], second[300];
    snprintf(first, sizeof first, "%s/probe-1", registry);
    snprintf(second, sizeof second, "%s/probe-2", registry);
    write_text(first, "");
    write_text(second, "");
    bool newest = false, seen = false;
    DIR *d = opendir(registry);
    for (struct dirent *e; d && !seen && (e = readdir(d));)
        if (!strncmp(e->d_name, "probe-", 6)) {
            newest = e->d_name[6] == '2';
            seen = true;
        }
    if (d)
        closedir(d);
    unlink(first);
    unlink(second);
    return newest;
}

/* 300 neighbours that never read fill the asker's socket (each request
 * waits in a receiver's queue, charged to the sender): the one that holds
 * the memory is listed after them, and must still be asked. */
Test(neighbours, three_hundred_silent_neighbours_and_the_holder_is_still_asked, .timeout = 60)
{
    hood_init();
    char uuid[48], args[256], out[160], release[160];
    fake_uuid(uuid, sizeof uuid);
    static int fds[300];
    bool newest_first = newest_listed_first();
    if (!newest_first)
        fabricate_silent(300, uuid, fds);
    snprintf(args, sizeof args, "prog_neighbours give %s", scene);
    char cmd[4096], ready[160];
    command(cmd, sizeof cmd, NULL, hood_env, args);
    snprintf(out, sizeof out, "%s/holder.txt", scene);
    pid_t holder = start_background(cmd, out);
    snprintf(ready, sizeof ready, "%s/ready", scene);
    cr_assert(wait_for_file(ready, holder, 10), "the holder did not get ready");
    if (newest_first)
        fabricate_silent(300, uuid, fds);
    snprintf(args, sizeof args, "prog_neighbours take %s", scene);
    int rc = run(NULL, hood_env, args);
    snprintf(release, sizeof release, "%s/release", scene);
    write_text(release, "");
    int holder_rc = wait_end(holder, 10);
    char buf[65536];
    cr_expect_eq(rc, 0, "the taker did not get the holder's memory:\n%s\nholder:\n%s", output,
                 read_text(out, buf, sizeof buf));
    cr_expect(strstr(output, "take: 25 of 25 blocks"), "%s", output);
    cr_expect_eq(holder_rc, 0);
    for (int i = 0; i < 300; i++)
        close(fds[i]);
    hood_cleanup();
}

/* A process started with XDG_RUNTIME_DIR registers there; one started
 * without it (a batch job) in /dev/shm/poolshim-<uid>. The first still
 * asks the second: an asker looks in both. */
Test(neighbours, an_asker_in_xdg_runtime_dir_finds_a_neighbour_registered_without_it, .timeout = 60)
{
    scene_init();
    char env[1024], args[256], cmd[4096], out[160], ready[160], release[160], shared[64], runtime[160];
    snprintf(runtime, sizeof runtime, "%s/runtime", scene);
    cr_assert_eq(mkdir(runtime, 0700), 0);
    snprintf(shared, sizeof shared, "/dev/shm/poolshim-%u", (unsigned)geteuid());
    snprintf(env, sizeof env, HOOD_ENV " FAKE_CUDA_SHARED_CAPACITY_FILE=%s/capacity", scene);
    snprintf(args, sizeof args, "prog_neighbours give %s", scene);
    command(cmd, sizeof cmd, NULL, env, args);
    snprintf(out, sizeof out, "%s/holder.txt", scene);
    pid_t holder = start_background(cmd, out);
    snprintf(ready, sizeof ready, "%s/ready", scene);
    cr_assert(wait_for_file(ready, holder, 10), "the holder did not get ready");
    char entry[400] = "";
    for (double until = now_s() + 5; !entry[0] && now_s() < until; usleep(5000)) {
        DIR *d = opendir(shared);
        char prefix[32];
        snprintf(prefix, sizeof prefix, "p%d-", (int)holder);
        for (struct dirent *e; d && (e = readdir(d));)
            if (!strncmp(e->d_name, prefix, strlen(prefix)) && strstr(e->d_name, ".gpus"))
                snprintf(entry, sizeof entry, "%s/%s", shared, e->d_name);
        if (d)
            closedir(d);
    }
    cr_assert(entry[0], "the holder registered nowhere in %s", shared);
    snprintf(env, sizeof env, HOOD_ENV " FAKE_CUDA_SHARED_CAPACITY_FILE=%s/capacity XDG_RUNTIME_DIR=%s", scene, runtime);
    snprintf(args, sizeof args, "prog_neighbours take %s", scene);
    int rc = run(NULL, env, args);
    snprintf(release, sizeof release, "%s/release", scene);
    write_text(release, "");
    cr_expect_eq(wait_end(holder, 10), 0);
    cr_expect_eq(rc, 0, "%s", output);
    cr_expect(strstr(output, "take: 25 of 25 blocks"), "%s", output);
    snprintf(runtime, sizeof runtime, "%s/runtime/poolshim", scene);
    struct stat st;
    cr_expect(lstat(runtime, &st) == 0 && S_ISDIR(st.st_mode), "the taker's registry is %s", runtime);
    scene_cleanup();
}

/* ---- top: what a page may carry --------------------------------------------------- */
/* Runs `poolshim top ARGS`; stdout in `output`. */
static int run_top(const char *args)
{
    const char *cli = getenv("POOLSHIM_CLI");
    cr_assert(cli, "POOLSHIM_CLI must be set (make test-shim sets it)");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s top %s 2>/dev/null", cli, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A live page of process `pid` (alive: its start time is read) in the
 * registry: `command` as JSON string contents, `devices` devices. */
static void fabricate_page(pid_t pid, const char *command_json, int devices)
{
    char path[300];
    unsigned long long start = start_of(pid), ns = own_pid_namespace();
    snprintf(path, sizeof path, "%s/p%d-%llu-%llu.stats", registry, (int)pid, start, ns);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fprintf(f, "{\"poolshim_live\": 1, \"live\": 1, \"pid\": %d, \"start\": %llu, \"pidns\": %llu, \"rank\": null, "
               "\"command\": \"%s\", \"time\": 1.0, \"monotonic_ns\": 1, \"period_ms\": 500, "
               "\"report\": {\"poolshim\": 1, \"pid\": %d, \"devices\": [",
            (int)pid, start, ns, command_json, (int)pid);
    for (int d = 0; d < devices; d++)
        fprintf(f, "%s{\"device\": %d, \"calls\": {\"cudaMalloc\": 7}, \"bytes\": {\"reserved_current\": %d}}",
                d ? ", " : "", d, 4242 + (int)pid % 1000);
    fprintf(f, "]}}\n");
    fclose(f);
    cr_assert_eq(chmod(path, 0600), 0);
}

/* The first terminal control in `text` (C0 but newline, DEL, C1 as UTF-8, a
 * bidirectional override, or a JSON escape of one of them); NULL when none. */
static const char *first_control(const char *text)
{
    for (const unsigned char *s = (const unsigned char *)text; *s; s++) {
        if ((*s < 0x20 && *s != '\n') || *s == 0x7f || (s[0] == 0xC2 && s[1] >= 0x80 && s[1] < 0xA0) ||
            (s[0] == 0xE2 && s[1] == 0x80 && s[2] >= 0xAA && s[2] <= 0xAE))
            return (const char *)s;
        if (s[0] == '\\' && s[1] == 'u' && (!strncmp((const char *)s + 2, "00", 2) || !strncmp((const char *)s + 2, "202", 3)))
            return (const char *)s;
    }
    return NULL;
}

/* A command with an OSC title, a screen clear, C1's CSI, DEL, a carriage
 * return and a right-to-left override: '?' in the table, the JSON and the
 * Prometheus labels alike. */
Test(top, no_control_character_reaches_any_output, .timeout = 30)
{
    hood_init();
    fabricate_page(getpid(), "evil\\u001b]0;owned\\u0007\\u001b[2J\\u009b31m\\u007f\\r\\u202etxt.exe end", 1);
    const char *modes[] = {"--once", "--json", "--prometheus"};
    for (int i = 0; i < 3; i++) {
        char args[256];
        snprintf(args, sizeof args, "%s --dir %s", modes[i], registry);
        cr_assert_eq(run_top(args), 0, "%s", output);
        cr_expect(strstr(output, "evil?]0;owned??[2J?31m??") && strstr(output, "?txt.exe end"), "%s: %s", modes[i],
                  output);
        const char *control = first_control(output);
        cr_expect(!control, "%s: a control character at offset %ld:\n%s", modes[i], control ? (long)(control - output) : 0,
                  output);
    }
    hood_cleanup();
}

/* One page claims 5,000 devices: it gets at most 64 rows (the most devices
 * the shim serves), and the other process is still listed. The big page is
 * placed where the directory lists it first. */
Test(top, a_page_with_5000_devices_hides_no_other_process, .timeout = 30)
{
    hood_init();
    pid_t other = fork();
    cr_assert_geq(other, 0);
    if (other == 0) {
        sleep(30);
        _exit(0);
    }
    bool newest_first = newest_listed_first();
    if (!newest_first)
        fabricate_page(getpid(), "big", 5000);
    fabricate_page(other, "small", 1);
    if (newest_first)
        fabricate_page(getpid(), "big", 5000);
    char args[256];
    snprintf(args, sizeof args, "--json --dir %s", registry);
    int rc = run_top(args);
    kill(other, SIGKILL);
    waitpid(other, NULL, 0);
    cr_assert_eq(rc, 0, "%s", output);
    char pid_text[64];
    snprintf(pid_text, sizeof pid_text, "{\"pid\": %d, ", (int)other);
    cr_expect(strstr(output, pid_text), "the small page's process is not listed");
    int rows = 0;
    for (const char *at = output; (at = strstr(at, "{\"device\": ")); at++)
        rows++;
    cr_expect_eq(rows, 64 + 1, "rows listed: %d", rows);
    hood_cleanup();
}

/* With XDG_RUNTIME_DIR, top lists the pages there and those of processes
 * started without it (in /dev/shm/poolshim-<uid>). */
Test(top, it_reads_xdg_runtime_dir_and_the_shared_directory, .timeout = 30)
{
    scene_init();
    char runtime[128], shared[64], mine[300], theirs[300];
    snprintf(runtime, sizeof runtime, "%s/runtime", scene);
    cr_assert_eq(mkdir(runtime, 0700), 0);
    snprintf(registry, sizeof registry, "%s/poolshim", runtime);
    cr_assert_eq(mkdir(registry, 0700), 0);
    pid_t other = fork();
    cr_assert_geq(other, 0);
    if (other == 0) {
        sleep(30);
        _exit(0);
    }
    fabricate_page(getpid(), "in the runtime directory", 1);
    snprintf(mine, sizeof mine, "%s/p%d-%llu-%llu.stats", registry, (int)getpid(), start_of(getpid()), own_pid_namespace());
    snprintf(shared, sizeof shared, "/dev/shm/poolshim-%u", (unsigned)geteuid());
    mkdir(shared, 0700);
    snprintf(registry, sizeof registry, "%s", shared);
    fabricate_page(other, "in the shared directory", 1);
    snprintf(theirs, sizeof theirs, "%s/p%d-%llu-%llu.stats", shared, (int)other, start_of(other), own_pid_namespace());
    const char *cli = getenv("POOLSHIM_CLI");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "env XDG_RUNTIME_DIR=%s %s top --json", runtime, cli);
    int rc = shell(cmd);
    unlink(theirs);
    kill(other, SIGKILL);
    waitpid(other, NULL, 0);
    cr_expect_eq(rc, 0, "%s", output);
    cr_expect(strstr(output, "in the runtime directory") && strstr(output, "in the shared directory"), "%s", output);
    cr_expect(exists(mine), "%s", mine);
    scene_cleanup();
}

/* ---- ipc: the exporter's socket and the handle ----------------------------------------- */
/* The block's size a handle names (bytes 32-39, little-endian), in decimal. */
static const char *handle_size(const char *hex, char *out, size_t size)
{
    unsigned long long bytes = 0;
    for (int i = 7; i >= 0; i--) {
        unsigned v = 0;
        cr_assert_eq(sscanf(hex + 2 * (32 + i), "%2x", &v), 1);
        bytes = bytes << 8 | v;
    }
    snprintf(out, size, "%llu", bytes);
    return out;
}

/* `before` runs the victim's programs (a setpriv prefix, or "" for this user). */
static const char *victim_prefix = "";

/* Starts `prog_ipc export SCENE` in the background (SCENE/wait_go first
 * when `wait_go`); returns its pid. */
static pid_t start_exporter(bool wait_go)
{
    char env[512], args[256], cmd[4096], out[160], path[160];
    if (wait_go) {
        snprintf(path, sizeof path, "%s/wait_go", scene);
        write_text(path, "");
    }
    snprintf(env, sizeof env, "FAKE_CUDA_VMM=1 POOLSHIM_TEST_NEIGHBOURS_DIR=%s/registry", scene);
    snprintf(args, sizeof args, "prog_ipc export %s", scene);
    command(cmd, sizeof cmd, victim_prefix, env, args);
    snprintf(out, sizeof out, "%s/exporter.txt", scene);
    return start_background(cmd, out);
}

/* Waits for the exporter's handle (hex, 128 digits) into hex[129]. */
static void exporter_handle(pid_t exporter, char *hex)
{
    char path[160], buf[8192];
    snprintf(path, sizeof path, "%s/ready", scene);
    bool ready = wait_for_file(path, exporter, 10);
    snprintf(path, sizeof path, "%s/exporter.txt", scene);
    cr_assert(ready, "the exporter did not get ready:\n%s", read_text(path, buf, sizeof buf));
    snprintf(path, sizeof path, "%s/handle", scene);
    read_text(path, buf, sizeof buf);
    cr_assert_geq(strlen(buf), 128, "%s", buf);
    memcpy(hex, buf, 128);
    hex[128] = 0;
}

/* Lets the exporter end; its exit status. */
static int end_exporter(pid_t exporter, bool written)
{
    char path[160];
    if (written) {
        snprintf(path, sizeof path, "%s/written", scene);
        write_text(path, "");
    }
    snprintf(path, sizeof path, "%s/release", scene);
    write_text(path, "");
    return wait_end(exporter, 10);
}

/* The abstract name (without its '@') of the listening socket whose name
 * says it serves `pid`, found the way anyone on the machine can:
 * /proc/net/unix lists every abstract socket's name. */
static bool exporter_socket(pid_t pid, char *name, size_t size)
{
    char line[512], pid_text[32];
    snprintf(pid_text, sizeof pid_text, ".%d", (int)pid);
    FILE *f = fopen("/proc/net/unix", "r");
    cr_assert_not_null(f);
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        char flags[32], path[256] = "";
        if (sscanf(line, "%*s %*s %*s %31s %*s %*s %*s %255s", flags, path) != 2 || strcmp(flags, "00010000") ||
            strncmp(path, "@poolshim-ipc.", 14))
            continue;
        char *at = strstr(path + 13, pid_text); /* ".<pid>" as a whole field */
        if (at && (at[strlen(pid_text)] == '.' || !at[strlen(pid_text)]) && strlen(path) <= size) {
            memcpy(name, path + 1, strlen(path));
            found = true;
        }
    }
    fclose(f);
    return found;
}

static socklen_t abstract_address(struct sockaddr_un *a, const char *name)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strlen(name);
    cr_assert_lt(n + 1, sizeof a->sun_path);
    memcpy(a->sun_path + 1, name, n);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* Connects to the abstract socket `name` and sends nothing; the fd. */
static int connect_silently(const char *name)
{
    struct sockaddr_un a;
    socklen_t len = abstract_address(&a, name);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, len) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Runs `prog_ipc ROLE HEX SIZE` as the victim; its exit status, and the
 * seconds it took in *took. */
static int open_handle(const char *role, const char *hex, double *took)
{
    char env[256], args[512];
    snprintf(env, sizeof env, "FAKE_CUDA_VMM=1 POOLSHIM_TEST_NEIGHBOURS_DIR=%s/registry", scene);
    char size[32];
    snprintf(args, sizeof args, "prog_ipc %s %s %s", role, hex, handle_size(hex, size, sizeof size));
    double t = now_s();
    int rc = run(victim_prefix, env, args);
    if (took)
        *took = now_s() - t;
    return rc;
}

/* Three connections to the exporter's socket that never send their request
 * delay no one: the exporter waits for their requests while it serves
 * others, and an open takes well under a second. */
static void expect_silent_connections_delay_no_open(int (*connect_three)(const char *name))
{
    pid_t exporter = start_exporter(false);
    char hex[129], name[128];
    exporter_handle(exporter, hex);
    cr_assert(exporter_socket(exporter, name, sizeof name), "no listening socket of %d in /proc/net/unix", (int)exporter);
    int held = connect_three(name);
    cr_assert_geq(held, 0, "cannot connect to @%s", name);
    double took = 0;
    int rc = open_handle("open", hex, &took);
    cr_expect_eq(rc, 0, "the open failed:\n%s", output);
    cr_expect_lt(took, 1.5, "the open took %.2f s:\n%s", took, output);
    cr_expect_eq(end_exporter(exporter, true), 0, "the exporter did not end well");
}

static int silent_fds[3];
static int connect_three_here(const char *name)
{
    for (int i = 0; i < 3; i++)
        if ((silent_fds[i] = connect_silently(name)) < 0)
            return -1;
    return 0;
}

Test(ipc, silent_connections_of_this_user_delay_no_open, .timeout = 60)
{
    scene_init();
    expect_silent_connections_delay_no_open(connect_three_here);
    for (int i = 0; i < 3; i++)
        close(silent_fds[i]);
    scene_cleanup();
}

/* The exporter ended; another process of this user binds its socket's name
 * and listens. The importer sees (SO_PEERCRED) that the socket is not the
 * exporter's and sends nothing: the listener never receives the token. */
static int squat(const char *name)
{
    struct sockaddr_un a;
    socklen_t len = abstract_address(&a, name);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, len) != 0 || listen(fd, 8) != 0)
        return -1;
    return fd;
}

/* Accepts on `listener` for up to `seconds` and reads what comes within a
 * second of each connection; the bytes received in all, -1: no connection. */
static long listen_for_requests(int listener, double seconds)
{
    long bytes = -1;
    for (double until = now_s() + seconds; now_s() < until;) {
        struct pollfd p = {listener, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int c = accept(listener, NULL, NULL);
        if (c < 0)
            continue;
        bytes = bytes < 0 ? 0 : bytes;
        struct timeval t = {1, 0};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
        char buf[256];
        ssize_t n = recv(c, buf, sizeof buf, 0);
        bytes += n > 0 ? n : 0;
        close(c);
    }
    return bytes;
}

Test(ipc, a_name_taken_after_the_exporter_ended_gets_no_token, .timeout = 60)
{
    scene_init();
    pid_t exporter = start_exporter(false);
    char hex[129], name[128], cmd[4096], env[256], args[512], out[160], buf[8192];
    exporter_handle(exporter, hex);
    cr_assert(exporter_socket(exporter, name, sizeof name), "no listening socket of %d", (int)exporter);
    cr_assert_eq(end_exporter(exporter, false), 0);
    int listener = squat(name);
    cr_assert_geq(listener, 0, "cannot bind @%s", name);
    snprintf(env, sizeof env, "FAKE_CUDA_VMM=1 POOLSHIM_TEST_NEIGHBOURS_DIR=%s/registry", scene);
    char size[32];
    snprintf(args, sizeof args, "prog_ipc open_refused %s %s", hex, handle_size(hex, size, sizeof size));
    command(cmd, sizeof cmd, victim_prefix, env, args);
    snprintf(out, sizeof out, "%s/importer.txt", scene);
    pid_t importer = start_background(cmd, out);
    long bytes = listen_for_requests(listener, 2);
    int rc = wait_end(importer, 15);
    read_text(out, buf, sizeof buf);
    cr_expect_eq(rc, 0, "the open was not refused:\n%s", buf);
    cr_expect_leq(bytes, 0, "the squatter received %ld bytes (the request with its token)", bytes);
    cr_expect(strstr(buf, "held by process") && strstr(buf, "nothing was sent"), "%s", buf);
    close(listener);
    scene_cleanup();
}

/* The name an exporter's socket gets is drawn at random, so no one can take
 * it first: the first name tried (POOLSHIM_TEST_IPC_NAME) and the name
 * format 1 used (@poolshim-ipc.<uid>.<pid>) are both bound before the
 * export; the export and an open still work. */
Test(ipc, names_bound_before_the_first_export_do_not_stop_it, .timeout = 60)
{
    scene_init();
    setenv("POOLSHIM_TEST_IPC_NAME", "5eed5eed", 1);
    pid_t exporter = start_exporter(true);
    char first[128], old[128], hex[129], path[160];
    snprintf(first, sizeof first, "poolshim-ipc.%d.5eed5eed", (int)exporter);
    snprintf(old, sizeof old, "poolshim-ipc.%u.%d", (unsigned)geteuid(), (int)exporter);
    int taken[2] = {squat(first), squat(old)};
    cr_assert(taken[0] >= 0 && taken[1] >= 0, "cannot bind the names");
    snprintf(path, sizeof path, "%s/go", scene);
    write_text(path, "");
    exporter_handle(exporter, hex);
    double took;
    int rc = open_handle("open", hex, &took);
    cr_expect_eq(rc, 0, "%s", output);
    cr_expect_eq(end_exporter(exporter, true), 0, "the exporter did not end well");
    close(taken[0]);
    close(taken[1]);
    unsetenv("POOLSHIM_TEST_IPC_NAME");
    scene_cleanup();
}

/* A handle whose offset + size wraps around 2^64 (a valid checksum): the
 * sum passes a check written as offset + size <= mapped, and the open would
 * return an address outside what it mapped. Refused; no crash. */
static uint32_t fnv1a(const unsigned char *p, size_t n)
{
    uint32_t x = 2166136261u;
    for (size_t i = 0; i < n; i++)
        x = (x ^ p[i]) * 16777619u;
    return x;
}

Test(ipc, a_handle_whose_offset_and_size_wrap_is_refused, .timeout = 60)
{
    scene_init();
    pid_t exporter = start_exporter(false);
    char hex[129], crafted[129];
    exporter_handle(exporter, hex);
    unsigned char h[64];
    for (int i = 0; i < 64; i++) {
        unsigned v;
        cr_assert_eq(sscanf(hex + 2 * i, "%2x", &v), 1);
        h[i] = (unsigned char)v;
    }
    uint64_t size, offset;
    memcpy(&size, h + 32, 8);
    offset = (uint64_t)0 - size; /* offset + size = 2^64: 0 */
    memcpy(h + 40, &offset, 8);
    uint32_t check = fnv1a(h, 60);
    memcpy(h + 60, &check, 4);
    for (int i = 0; i < 64; i++)
        sprintf(crafted + 2 * i, "%02x", h[i]);
    int rc = open_handle("open_refused", crafted, NULL);
    cr_expect_eq(rc, 0, "the crafted handle was not refused:\n%s", output);
    cr_expect(strstr(output, "damaged or forged"), "%s", output);
    cr_expect_eq(end_exporter(exporter, false), 0);
    scene_cleanup();
}

/* ---- users: the same attacks from another user -------------------------------------- */
/* Two throw-away users, made before the tests when run as root (useradd)
 * and removed after (userdel); their names and ids reach the tests in
 * POOLSHIM_TEST_VICTIM and POOLSHIM_TEST_ATTACKER ("name uid gid"). Users
 * left by a run that was killed are removed first. */
#define USER_PREFIX_VICTIM "ps-victim-"
#define USER_PREFIX_ATTACKER "ps-attacker-"

static void remove_user(const char *name)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "userdel -f %s >/dev/null 2>&1", name);
    if (system(cmd) != 0)
        fprintf(stderr, "test_security: could not remove the user %s\n", name);
}

static bool make_user(const char *prefix, const char *variable)
{
    char name[64], cmd[256], value[128];
    snprintf(name, sizeof name, "%s%d", prefix, (int)getpid());
    snprintf(cmd, sizeof cmd, "useradd --system --no-create-home --user-group --shell /usr/sbin/nologin %s >/dev/null 2>&1",
             name);
    struct passwd *pw = system(cmd) == 0 ? getpwnam(name) : NULL;
    if (!pw)
        return false;
    snprintf(value, sizeof value, "%s %u %u", name, (unsigned)pw->pw_uid, (unsigned)pw->pw_gid);
    setenv(variable, value, 1);
    return true;
}

/* Users of the names above whose run (the pid in the name) is gone. */
static void remove_stale_users(void)
{
    setpwent();
    char stale[64][64];
    int count = 0;
    for (struct passwd *pw; count < 64 && (pw = getpwent());) {
        const char *prefix = !strncmp(pw->pw_name, USER_PREFIX_VICTIM, strlen(USER_PREFIX_VICTIM)) ? USER_PREFIX_VICTIM
                             : !strncmp(pw->pw_name, USER_PREFIX_ATTACKER, strlen(USER_PREFIX_ATTACKER)) ? USER_PREFIX_ATTACKER
                                                                                                    : NULL;
        if (prefix && kill(atoi(pw->pw_name + strlen(prefix)), 0) != 0 && errno == ESRCH)
            snprintf(stale[count++], sizeof stale[0], "%s", pw->pw_name);
    }
    endpwent();
    for (int i = 0; i < count; i++)
        remove_user(stale[i]);
}

ReportHook(PRE_ALL)(struct criterion_test_set *set)
{
    (void)set;
    unsetenv("POOLSHIM_TEST_VICTIM");
    unsetenv("POOLSHIM_TEST_ATTACKER");
    if (geteuid() != 0) {
        fprintf(stderr, "test_security: the users tests are skipped: they need root to make two throw-away users\n");
        return;
    }
    remove_stale_users();
    if (!make_user(USER_PREFIX_VICTIM, "POOLSHIM_TEST_VICTIM") ||
        !make_user(USER_PREFIX_ATTACKER, "POOLSHIM_TEST_ATTACKER"))
        fprintf(stderr, "test_security: the users tests are skipped: useradd failed\n");
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    (void)stats;
    const char *variables[] = {"POOLSHIM_TEST_VICTIM", "POOLSHIM_TEST_ATTACKER"};
    for (int i = 0; i < 2; i++) {
        char name[64];
        const char *value = getenv(variables[i]);
        if (value && sscanf(value, "%63s", name) == 1) {
            char cmd[128];
            unsigned uid = 0;
            sscanf(value, "%*s %u", &uid);
            snprintf(cmd, sizeof cmd, "rm -rf /dev/shm/poolshim-%u", uid);
            if (uid && system(cmd) != 0)
                fprintf(stderr, "test_security: could not remove /dev/shm/poolshim-%u\n", uid);
            remove_user(name);
        }
    }
}

typedef struct user {
    char name[64];
    unsigned uid, gid;
} user_t;

/* The victim and the attacker, or the test is skipped (saying why once, above). */
static void users(user_t *victim, user_t *attacker)
{
    const char *v = getenv("POOLSHIM_TEST_VICTIM"), *a = getenv("POOLSHIM_TEST_ATTACKER");
    if (!v || !a || sscanf(v, "%63s %u %u", victim->name, &victim->uid, &victim->gid) != 3 ||
        sscanf(a, "%63s %u %u", attacker->name, &attacker->uid, &attacker->gid) != 3)
        cr_skip_test("needs root and useradd (two throw-away users)");
}

/* The scene, given to the victim; the victim's programs run through setpriv. */
static char victim_prefix_buf[128];
static void victim_scene(const user_t *victim)
{
    scene_init();
    cr_assert_eq(chown(scene, victim->uid, victim->gid), 0);
    snprintf(victim_prefix_buf, sizeof victim_prefix_buf, "setpriv --reuid=%u --regid=%u --clear-groups --",
             victim->uid, victim->gid);
    victim_prefix = victim_prefix_buf;
}

/* Becomes `u` (in a child process, which ends with the test's process). */
static void become(const user_t *u)
{
    if (setgroups(0, NULL) != 0 || setresgid(u->gid, u->gid, u->gid) != 0 || setresuid(u->uid, u->uid, u->uid) != 0)
        _exit(120);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* (after the change of user, which clears it) */
}

/* Runs `attack(name)` as the attacker in a child process that stays until
 * killed; its first result (an int) comes back through a pipe. */
static pid_t attack_as(const user_t *attacker, int (*attack)(const char *), const char *name, int *result)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(p[0]);
        become(attacker);
        int r = attack(name);
        if (write(p[1], &r, sizeof r) != (ssize_t)sizeof r)
            _exit(121);
        for (;;)
            pause();
    }
    close(p[1]);
    struct pollfd w = {p[0], POLLIN, 0};
    *result = -999;
    if (poll(&w, 1, 10000) == 1 && read(p[0], result, sizeof *result) != (ssize_t)sizeof *result)
        *result = -998;
    close(p[0]);
    return pid;
}

static void end_attack(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Another user's connections: three silent ones and one that sends a
 * request. The exporter closes each at once (within a second) and nothing
 * is read or answered: 0, else -1 (no connection), -2 (an answer came),
 * -3 (still open after a second). */
static int connect_as_stranger(const char *name)
{
    if (connect_three_here(name) != 0)
        return -1;
    int asking = connect_silently(name);
    if (asking < 0)
        return -1;
    unsigned char request[24] = "PSHMIPC\x02";
    request[8] = 1; /* (export id 1, token 0) */
    send(asking, request, sizeof request, MSG_NOSIGNAL); /* (fails when the exporter already closed it) */
    int fds[4] = {silent_fds[0], silent_fds[1], silent_fds[2], asking};
    for (int i = 0; i < 4; i++) {
        struct pollfd p = {fds[i], POLLIN, 0};
        if (poll(&p, 1, 1000) != 1)
            return -3;
        char buf[64];
        if (recv(fds[i], buf, sizeof buf, MSG_DONTWAIT) > 0)
            return -2;
    }
    return 0;
}

static int attacker_pid_for_connections;
static int connect_as_attacker(const char *name)
{
    static user_t victim, attacker;
    users(&victim, &attacker);
    int result;
    attacker_pid_for_connections = attack_as(&attacker, connect_as_stranger, name, &result);
    cr_expect_eq(result, 0, "the attacker's connections: %s",
                 result == -2 ? "a request was answered" : result == -3 ? "still open after a second" : "failed");
    return result == -1 ? -1 : 0;
}

Test(users, another_users_connections_are_closed_unread_and_delay_no_open, .timeout = 60)
{
    user_t victim, attacker;
    users(&victim, &attacker);
    victim_scene(&victim);
    expect_silent_connections_delay_no_open(connect_as_attacker);
    end_attack(attacker_pid_for_connections);
    scene_cleanup();
}

/* The exporter ended; another user binds its name and listens: the
 * victim's importer sends it nothing. */
Test(users, a_name_taken_by_another_user_gets_no_token, .timeout = 60)
{
    user_t victim, attacker;
    users(&victim, &attacker);
    victim_scene(&victim);
    pid_t exporter = start_exporter(false);
    char hex[129], name[128], cmd[4096], env[256], args[512], out[160], buf[8192];
    exporter_handle(exporter, hex);
    cr_assert(exporter_socket(exporter, name, sizeof name), "no listening socket of %d", (int)exporter);
    cr_assert_eq(end_exporter(exporter, false), 0);
    snprintf(env, sizeof env, "FAKE_CUDA_VMM=1 POOLSHIM_TEST_NEIGHBOURS_DIR=%s/registry", scene);
    char size[32];
    snprintf(args, sizeof args, "prog_ipc open_refused %s %s", hex, handle_size(hex, size, sizeof size));
    command(cmd, sizeof cmd, victim_prefix, env, args);
    snprintf(out, sizeof out, "%s/importer.txt", scene);
    /* the attacker binds first, then the importer comes within its 3 s of listening */
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t squatter = fork();
    cr_assert_geq(squatter, 0);
    if (squatter == 0) {
        close(p[0]);
        become(&attacker);
        int listener = squat(name);
        int ready = listener >= 0 ? 1 : -1;
        if (write(p[1], &ready, sizeof ready) != (ssize_t)sizeof ready || listener < 0)
            _exit(1);
        int bytes = (int)listen_for_requests(listener, 3);
        _exit(bytes < 0 ? 0 : bytes > 100 ? 100 : bytes);
    }
    close(p[1]);
    int ready = 0;
    cr_assert(read(p[0], &ready, sizeof ready) == (ssize_t)sizeof ready && ready == 1, "the attacker cannot bind @%s", name);
    close(p[0]);
    pid_t importer = start_background(cmd, out);
    int rc = wait_end(importer, 15), status = 0;
    waitpid(squatter, &status, 0);
    read_text(out, buf, sizeof buf);
    cr_expect_eq(rc, 0, "the open was not refused:\n%s", buf);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the attacker received %d bytes (the request with its token)",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    char why[64];
    snprintf(why, sizeof why, "another user (uid %u)", attacker.uid);
    cr_expect(strstr(buf, why) && strstr(buf, "nothing was sent"), "%s", buf);
    scene_cleanup();
}

/* Links planted by another user for the victim's next pids in a sticky
 * world-writable directory (as /tmp), pointing at the victim's own file.
 * Where fs.protected_symlinks is 1 the kernel itself refuses to follow
 * them; the shim refuses them either way (files/ above is the test that
 * fails without its fix whatever the sysctl says). */
static int plant_links(const char *arg)
{
    char sticky[128], target[256], buf[64] = "";
    if (sscanf(arg, "%127s %255s", sticky, target) != 2)
        return -1;
    long last = strtol(read_text("/proc/sys/kernel/ns_last_pid", buf, sizeof buf), NULL, 10);
    long pid_max = strtol(read_text("/proc/sys/kernel/pid_max", buf, sizeof buf), NULL, 10);
    int planted = 0;
    for (long i = 1; i <= 2000; i++) {
        char path[300];
        snprintf(path, sizeof path, "%s/stats_%ld.json", sticky, (last + i) % pid_max);
        planted += symlink(target, path) == 0;
    }
    return planted;
}

Test(users, links_planted_by_another_user_in_a_sticky_directory, .timeout = 60)
{
    user_t victim, attacker;
    users(&victim, &attacker);
    victim_scene(&victim);
    char sticky[128], precious[160], arg[300], env[300], buf[256];
    snprintf(sticky, sizeof sticky, "%s/shared", scene);
    cr_assert_eq(mkdir(sticky, 0777), 0);
    cr_assert_eq(chmod(sticky, 01777), 0);
    cr_assert_eq(chown(sticky, 0, 0), 0);
    cr_assert_eq(chmod(scene, 0755), 0);
    snprintf(precious, sizeof precious, "%s/precious", scene);
    write_text(precious, PRECIOUS);
    cr_assert_eq(chown(precious, victim.uid, victim.gid), 0);
    snprintf(arg, sizeof arg, "%s %s", sticky, precious);
    int planted;
    pid_t planter = attack_as(&attacker, plant_links, arg, &planted);
    end_attack(planter);
    cr_assert_eq(planted, 2000);
    snprintf(env, sizeof env, "POOLSHIM_STATS=json POOLSHIM_STATS_FILE=%s/stats_%%p.json", sticky);
    int rc = run(victim_prefix, env, "prog_runtime basic");
    cr_expect_eq(rc, 0, "%s", output);
    cr_expect_str_eq(read_text(precious, buf, sizeof buf), PRECIOUS, "the victim's file was written");
    cr_expect(strstr(output, "cannot write statistics to"), "%s", output);
    scene_cleanup();
}

/* Another user takes /dev/shm/poolshim-<victim's uid> first. With a private
 * XDG_RUNTIME_DIR the victim's registry is there and works; without one the
 * victim is told in one line how to fix it. */
static int take_directory(const char *dir)
{
    return mkdir(dir, 0700);
}

Test(users, a_registry_directory_taken_by_another_user, .timeout = 60)
{
    user_t victim, attacker;
    users(&victim, &attacker);
    victim_scene(&victim);
    char taken[64], runtime[128], env[300], expected[256];
    snprintf(taken, sizeof taken, "/dev/shm/poolshim-%u", victim.uid);
    int made;
    pid_t taker = attack_as(&attacker, take_directory, taken, &made);
    end_attack(taker);
    cr_assert_eq(made, 0, "the attacker could not make %s", taken);
    snprintf(runtime, sizeof runtime, "%s/runtime", scene);
    cr_assert_eq(mkdir(runtime, 0700), 0);
    cr_assert_eq(chown(runtime, victim.uid, victim.gid), 0);
    snprintf(env, sizeof env, "XDG_RUNTIME_DIR=%s POOLSHIM_VERBOSE=3", runtime);
    int rc = run(victim_prefix, env, "prog_runtime basic");
    cr_expect_eq(rc, 0, "%s", output);
    snprintf(expected, sizeof expected, "GPU(s) as %s/poolshim/p", runtime);
    cr_expect(strstr(output, expected) && !strstr(output, "not a private directory"), "%s", output);
    rc = run(victim_prefix, "POOLSHIM_VERBOSE=2", "prog_runtime basic");
    cr_expect_eq(rc, 0, "%s", output);
    const char *line = strstr(output, "is not a private directory of this user");
    cr_expect(line && strstr(line, "to fix it") && strstr(line, "XDG_RUNTIME_DIR") &&
                  strchr(line, '\n') > strstr(line, "XDG_RUNTIME_DIR"),
              "%s", output);
    rmdir(taken);
    scene_cleanup();
}
