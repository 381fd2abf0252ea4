/* The Slurm SPANK plugin: `srun --poolshim[=CONFIG]` (and `sbatch`,
 * `salloc`, `#SBATCH --poolshim`) preloads libpoolshim.so into the job's
 * tasks with that configuration.
 *
 * 1. Options, registered in every context (so sbatch and salloc know them):
 *    --poolshim[=CONFIG] and --poolshim-stats=DIR (which implies --poolshim).
 * 2. At submission (srun, sbatch, salloc) the configuration the tasks will
 *    read is checked by running `poolshim config --check [CONFIG]` in the
 *    submitter's environment (so POOLSHIM_OPTIONS is checked too): in
 *    --poolshim's callback, whose failure ends the command before the job
 *    is submitted (a plugin marked optional in plugstack.conf too); for
 *    --poolshim-stats alone, once the options are read (init_post_opt,
 *    whose failure counts only for a required plugin). A refusal prints the
 *    checker's messages; a checker that cannot run is a warning.
 * 3. On the node (slurmstepd's user_init, as the user, in the job's working
 *    directory), for a job that asked and no other: LD_PRELOAD gets the
 *    library (first, once), POOLSHIM_CONFIG the absolute CONFIG (or the
 *    site's config= when the job set none), and with a statistics directory
 *    POOLSHIM_STATS=json and POOLSHIM_STATS_FILE=DIR/poolshim_%j.%s_%h_rank%r.json,
 *    one file per task (the shim expands job, step, host and rank).
 * 4. plugstack.conf arguments: config=PATH (what --poolshim without CONFIG
 *    uses), stats=DIR (the statistics directory of every job with
 *    --poolshim), library=PATH (default: ../libpoolshim.so beside this
 *    plugin), cli=PATH (default: ../../bin/poolshim, else ../poolshim).
 * It links nothing of poolshim and keeps no state beyond the job's options:
 * it is loaded into srun, sbatch, salloc, slurmd and slurmstepd.
 * Return rule: 0 or -1, as SPANK wants (SPANK's own calls: ESPANK_*).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(poolshim, 1);

extern char **environ;

#define CHECK_SECONDS 20   /* the longest the configuration check may take */
#define CHECK_OUTPUT 8192  /* bytes of the checker's messages kept */
#define STATS_FILE_NAME "poolshim_%j.%s_%h_rank%r.json"

/* What this job asked for, and the site's defaults. */
static struct {
    int asked;                  /* --poolshim or --poolshim-stats was given */
    int config_option;          /* --poolshim was given (its callback checked the configuration) */
    char config[PATH_MAX];      /* --poolshim=CONFIG ("" when bare) */
    char stats[PATH_MAX];       /* --poolshim-stats=DIR ("" when none) */
    char site_config[PATH_MAX]; /* plugstack.conf config= */
    char site_stats[PATH_MAX];  /* plugstack.conf stats= */
    char library[PATH_MAX];     /* plugstack.conf library=, else beside the plugin */
    char cli[PATH_MAX];         /* plugstack.conf cli=, else found beside the plugin */
} job;

/* This plugin's directory ("" when it cannot be told). */
static void plugin_directory(char *out, size_t size)
{
    Dl_info info;
    out[0] = 0;
    if (dladdr((void *)plugin_directory, &info) && info.dli_fname) {
        char path[PATH_MAX];
        if (realpath(info.dli_fname, path)) {
            char *slash = strrchr(path, '/');
            if (slash) {
                *slash = 0;
                snprintf(out, size, "%s", path);
            }
        }
    }
}

/* Copies a value into a PATH_MAX field; -1 when it does not fit. */
static int set_path(char *field, const char *value, const char *what)
{
    if (strlen(value) >= PATH_MAX) {
        slurm_error("poolshim: %s is longer than %d bytes", what, PATH_MAX - 1);
        return -1;
    }
    snprintf(field, PATH_MAX, "%s", value);
    return 0;
}

/* ---- 2. the check at submission ------------------------------------------ */

/* Runs `cli config --check [file]` with the caller's environment; 0 valid,
 * 1 refused (its messages in out), -1 it could not run (why in out). */
static int run_check(const char *file, char *out, size_t size)
{
    int pipe_fds[2];
    out[0] = 0;
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
        snprintf(out, size, "pipe: %s", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    char *argv[] = {job.cli, "config", "--check", (char *)file, NULL};
    if (!file)
        argv[3] = NULL;
    pid_t pid;
    int rc = posix_spawn(&pid, job.cli, &actions, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(pipe_fds[1]);
    if (rc != 0) {
        close(pipe_fds[0]);
        snprintf(out, size, "cannot run %s: %s", job.cli, strerror(rc));
        return -1;
    }
    size_t used = 0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int timed_out = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left_ms = CHECK_SECONDS * 1000L - ((now.tv_sec - start.tv_sec) * 1000L +
                                                (now.tv_nsec - start.tv_nsec) / 1000000L);
        if (left_ms <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p = {pipe_fds[0], POLLIN, 0};
        int ready = poll(&p, 1, (int)left_ms);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            continue;
        char buf[1024];
        ssize_t n = read(pipe_fds[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        size_t keep = (size_t)n < size - 1 - used ? (size_t)n : size - 1 - used;
        memcpy(out + used, buf, keep);
        used += keep;
    }
    out[used] = 0;
    close(pipe_fds[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int status = 0;
    pid_t waited;
    while ((waited = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    while (used > 0 && out[used - 1] == '\n')
        out[--used] = 0;
    if (waited != pid) { /* (reaped by the host program's own handler: no status to trust) */
        snprintf(out, size, "the status of %s config --check was lost", job.cli);
        return -1;
    }
    if (timed_out) {
        snprintf(out, size, "%s config --check did not answer within %d s", job.cli, CHECK_SECONDS);
        return -1;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 1)
        return 1;
    if (!used)
        snprintf(out, size, "%s config --check ended with status %d", job.cli,
                 WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    return -1;
}

/* Checks what the tasks will read: CONFIG, else $POOLSHIM_CONFIG, else the
 * site's config=. -1 (printed) refuses the option. */
static int check_at_submission(void)
{
    const char *file = job.config[0] ? job.config : NULL, *named = "--poolshim=";
    if (!file && !getenv("POOLSHIM_CONFIG") && job.site_config[0]) {
        file = job.site_config;
        named = "plugstack.conf's config=";
    }
    if (file && access(file, R_OK) != 0) {
        slurm_error("poolshim: %s%s: cannot read the configuration: %s; the job is not submitted", named, file,
                    strerror(errno));
        return -1;
    }
    char messages[CHECK_OUTPUT];
    int rc = run_check(file, messages, sizeof messages);
    if (rc == 0)
        return 0;
    if (rc < 0) {
        slurm_info("poolshim: warning: the configuration was not checked (%s; set cli= in plugstack.conf)",
                   messages);
        return 0;
    }
    slurm_error("poolshim: %s%s: the configuration is invalid; the job is not submitted:\n%s",
                file ? named : "--poolshim", file ? file : "", messages);
    return -1;
}

/* ---- 1. the options ------------------------------------------------------- */

enum { OPT_POOLSHIM = 1, OPT_STATS = 2 };

static int option(int which, const char *value, int remote)
{
    job.asked = 1;
    /* sbatch passes a bare option on to the job's steps as "(null)" */
    if (value && !strcmp(value, "(null)"))
        value = NULL;
    if (which == OPT_STATS) {
        if (!value || !*value) {
            slurm_error("poolshim: --poolshim-stats needs a directory");
            return -1;
        }
        if (strchr(value, '%')) {
            slurm_error("poolshim: --poolshim-stats=%s: a directory without %% (the file names carry job, step, "
                        "node and rank)", value);
            return -1;
        }
        return set_path(job.stats, value, "--poolshim-stats");
    }
    if (value && set_path(job.config, value, "--poolshim's CONFIG") != 0)
        return -1;
    job.config_option = 1;
    /* (a failed option stops srun and sbatch whether the plugin is required or optional) */
    return remote ? 0 : check_at_submission();
}

static struct spank_option options[] = {
    {"poolshim", "[CONFIG]",
     "Run the tasks under poolshim (libpoolshim.so preloaded), with the configuration file CONFIG when given "
     "(checked at submission).",
     2, OPT_POOLSHIM, option},
    {"poolshim-stats", "DIR",
     "Under poolshim, write each task's statistics to DIR/poolshim_JOB.STEP_HOST_rankRANK.json "
     "(merge them with `poolshim stats DIR`).",
     1, OPT_STATS, option},
    SPANK_OPTIONS_TABLE_END,
};

/* ---- 4. plugstack.conf ---------------------------------------------------- */

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    char here[PATH_MAX - 32];
    plugin_directory(here, sizeof here);
    for (int i = 0; i < ac; i++) {
        int rc = 0;
        if (!strncmp(av[i], "config=", 7))
            rc = set_path(job.site_config, av[i] + 7, "config=");
        else if (!strncmp(av[i], "stats=", 6))
            rc = set_path(job.site_stats, av[i] + 6, "stats=");
        else if (!strncmp(av[i], "library=", 8))
            rc = set_path(job.library, av[i] + 8, "library=");
        else if (!strncmp(av[i], "cli=", 4))
            rc = set_path(job.cli, av[i] + 4, "cli=");
        else {
            slurm_error("poolshim: plugstack.conf: unknown argument '%s' (expected config=, stats=, library=, cli=)",
                        av[i]);
            rc = -1;
        }
        if (rc != 0)
            return -1;
    }
    if (!job.library[0] && here[0])
        snprintf(job.library, sizeof job.library, "%s/../libpoolshim.so", here);
    if (!job.cli[0] && here[0]) {
        snprintf(job.cli, sizeof job.cli, "%s/../../bin/poolshim", here);
        if (access(job.cli, X_OK) != 0) /* (the build tree: build/slurm/ beside build/poolshim) */
            snprintf(job.cli, sizeof job.cli, "%s/../poolshim", here);
    }
    for (struct spank_option *o = options; o->name; o++)
        if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
            slurm_error("poolshim: cannot register --%s", o->name);
            return -1;
        }
    return 0;
}

/* After the options: the check, where the job is submitted. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    (void)sp;
    (void)ac;
    (void)av;
    spank_context_t where = spank_context();
    if (!job.asked || job.config_option || (where != S_CTX_LOCAL && where != S_CTX_ALLOCATOR))
        return 0;
    return check_at_submission(); /* (--poolshim-stats alone) */
}

/* ---- 3. the tasks' environment -------------------------------------------- */

/* mkdir -p for an absolute path; 0 or -1 (errno). */
static int make_directories(const char *path)
{
    char partial[PATH_MAX];
    snprintf(partial, sizeof partial, "%s", path);
    for (char *p = partial + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char saved = *p;
            *p = 0;
            if (mkdir(partial, 0777) != 0 && errno != EEXIST)
                return -1;
            *p = saved;
            if (!saved)
                break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* An absolute form of `path` (relative to the job's working directory). */
static int absolute(const char *path, char *out, size_t size)
{
    if (path[0] == '/') {
        snprintf(out, size, "%s", path);
        return 0;
    }
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return -1;
    if ((size_t)snprintf(out, size, "%s/%s", cwd, path) >= size) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

/* Whether the colon/space-separated list holds `item`. */
static int list_holds(const char *list, const char *item)
{
    size_t n = strlen(item);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ": ");
        if (len == n && !strncmp(p, item, n))
            return 1;
        p += len;
        p += strspn(p, ": ");
    }
    return 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (!job.asked || !spank_remote(sp))
        return 0;
    char library[PATH_MAX], value[2 * PATH_MAX + 64], old[PATH_MAX];
    if (!realpath(job.library, library) || access(library, R_OK) != 0) {
        slurm_error("poolshim: the library %s cannot be read on this node (library= in plugstack.conf): %s",
                    job.library, strerror(errno));
        return -1;
    }
    if (spank_getenv(sp, "LD_PRELOAD", old, sizeof old) == ESPANK_SUCCESS && old[0]) {
        if (!list_holds(old, library)) {
            snprintf(value, sizeof value, "%s:%s", library, old);
            spank_setenv(sp, "LD_PRELOAD", value, 1);
        }
    } else {
        spank_setenv(sp, "LD_PRELOAD", library, 1);
    }
    const char *config = job.config[0] ? job.config : NULL;
    if (!config && spank_getenv(sp, "POOLSHIM_CONFIG", old, sizeof old) != ESPANK_SUCCESS && job.site_config[0])
        config = job.site_config;
    if (config) {
        if (absolute(config, value, sizeof value) != 0) {
            slurm_error("poolshim: --poolshim=%s: %s", config, strerror(errno));
            return -1;
        }
        spank_setenv(sp, "POOLSHIM_CONFIG", value, 1);
    }
    const char *stats = job.stats[0] ? job.stats : job.site_stats[0] ? job.site_stats : NULL;
    if (stats) {
        char directory[PATH_MAX];
        if (absolute(stats, directory, sizeof directory) != 0 || make_directories(directory) != 0) {
            slurm_error("poolshim: --poolshim-stats=%s: cannot make the directory: %s", stats, strerror(errno));
            return -1;
        }
        snprintf(value, sizeof value, "%s/%s", directory, STATS_FILE_NAME);
        spank_setenv(sp, "POOLSHIM_STATS", "json", 1);
        spank_setenv(sp, "POOLSHIM_STATS_FILE", value, 1);
    }
    return 0;
}
