/* poolshim ab: runs a command without and with the shim and compares.
 *
 * Algorithm:
 *   1. Variants: the baseline (no shim) and one per --config (or the
 *      default config when none is given).
 *   2. For run 1..N, for each variant in turn (alternating, so drift in
 *      the machine hits every variant alike): fork, set the environment,
 *      exec the command with its stdout/stderr sent to a file in a
 *      private temporary directory; time fork -> wait on the monotonic
 *      clock.
 *        baseline: CUDA_INJECTION64_PATH = libpoolshim_cupti.so,
 *                  POOLSHIM_CUPTI_OUT = DIR/cupti-V-R-%p.json (every allocation
 *                  call counted and timed by CUPTI);
 *        configs:  LD_PRELOAD += libpoolshim.so, POOLSHIM_CONFIG,
 *                  POOLSHIM_STATS=json, POOLSHIM_STATS_FILE = DIR/stats-V-R-%p.json,
 *                  and the CUPTI library too (what still reaches CUDA).
 *   3. Read the JSON files (one per process that loaded CUDA; %p = pid)
 *      and add them up into an ab_results_t, keeping each process's shim
 *      statistics (stats_table.c reads them: rank from the report); render
 *      (ab_report.c: per-rank rows under a launcher).
 *   4. --plot: the first config's first run also writes POOLSHIM_LOG; it is
 *      drawn like `poolshim plot` (reserved from a simulated replay).
 * Progress goes to stderr only when stderr is a terminal. The temporary
 * directory is removed at the end (kept with --keep).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../core/common.h"
#include "ab_report.h"
#include "cli.h"
#include "replay.h"
#include "reserved_log.h"
#include "sim_stack.h"

static const char ab_usage[] =
    "usage: poolshim ab [options] -- COMMAND [ARGS...]\n"
    "\n"
    "Runs COMMAND N times without the shim (baseline, timed by the CUPTI library\n"
    "libpoolshim_cupti.so) and N times with each configuration, alternating, and prints\n"
    "wall time, allocation calls, time inside them, calls that still reached CUDA and\n"
    "peak memory, with ratios against the baseline.\n"
    "Over a launcher (torchrun, mpirun, srun), every process it starts reports, and\n"
    "each variant gets a row per rank and a total.\n"
    "\n"
    "options:\n"
    "  -n, --runs N         runs per variant (default 3)\n"
    "  -c, --config FILE    a configuration to compare (repeatable; default: the default\n"
    "                       config)\n"
    "  -j, --json           print JSON instead of the table\n"
    "  -p, --plot FILE      memory over time of the first configuration's first run (SVG)\n"
    "      --no-cupti       do not load the CUPTI library (wall time only for the baseline)\n"
    "      --keep           keep the temporary directory with every run's output\n"
    "      --render FILE    re-render saved 'ab --json' results (no command is run)\n"
    "  -h, --help           this text\n"
    "\n"
    "environment: POOLSHIM_LIB, POOLSHIM_CUPTI_LIB override where the libraries are found.\n"
    "exit status: 0 when every run exited 0, 1 otherwise.\n";

/* Everything one ab session needs to start runs. */
typedef struct ab_session {
    char shim_library[PATH_MAX];  /* libpoolshim.so */
    char cupti_library[PATH_MAX]; /* libpoolshim_cupti.so, "" when not used */
    char directory[PATH_MAX];     /* private temporary directory */
    char log_path[PATH_MAX + 32]; /* POOLSHIM_LOG of the plotted run, "" without --plot */
    char **command;               /* argv of the command */
    int progress;                 /* stderr is a terminal */
} ab_session_t;

static void shell_quote_command(char *out, size_t outsize, char **command)
{
    size_t n = 0;
    out[0] = '\0';
    for (char **arg = command; *arg && n + 4 < outsize; arg++) {
        int plain = **arg && strspn(*arg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                          "-_./=:,+@%") == strlen(*arg);
        n += (size_t)snprintf(out + n, outsize - n, plain ? "%s%s" : "%s'%s'", arg == command ? "" : " ", *arg);
    }
    if (n >= outsize)
        memcpy(out + outsize - 4, "...", 4);
}

static json_t *read_json_file(const char *path)
{
    char *text;
    if (cli_read_file(path, &text, NULL) != 0)
        return NULL;
    json_t *value = NULL;
    char err[256];
    /* the shim may print the object on one line after other text: start at the first '{' */
    const char *start = strchr(text, '{');
    if (!start || !(value = cli_json_parse(start, err, sizeof err)))
        fprintf(stderr, "poolshim: warning: ab: %s: not JSON (%s)\n", path, start ? err : "empty");
    free(text);
    return value;
}

/* Adds every report file DIR/PREFIX*.json of one run (one per process);
 * the shim's are read like `poolshim stats` reads them and kept per process. */
static void add_reports(const char *directory, const char *prefix, ab_run_t *run, int shim)
{
    DIR *dir = opendir(directory);
    if (!dir)
        return;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (strncmp(entry->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", directory, entry->d_name);
        if (shim) {
            stats_job_t job = {0};
            char err[PATH_MAX + 512];
            if (stats_job_read_file(&job, path, err, sizeof err) != 0)
                fprintf(stderr, "poolshim: warning: ab: %s\n", err);
            else if (ab_run_add_process(run, &job.processes[0]) != 0)
                fprintf(stderr, "poolshim: warning: ab: %s: out of memory\n", path);
            stats_job_free(&job);
            continue;
        }
        json_t *report = read_json_file(path);
        if (report && ab_run_add_cupti_report(run, report) != 0)
            fprintf(stderr, "poolshim: warning: ab: %s: not a CUPTI report\n", path);
        json_decref(report);
    }
    closedir(dir);
}

/* Runs the command once for `variant`; fills run. */
static int run_once(const ab_session_t *session, const ab_variant_t *variant, size_t variant_index,
                    size_t run_index, int write_log, ab_run_t *run)
{
    /* one report per process: %p (pid) lets every process of the run write its own */
    char cupti_prefix[64], stats_prefix[64], cupti_out[PATH_MAX + 128], stats_out[PATH_MAX + 128];
    char output[PATH_MAX + 64];
    snprintf(cupti_prefix, sizeof cupti_prefix, "cupti-%zu-%zu-", variant_index, run_index);
    snprintf(stats_prefix, sizeof stats_prefix, "stats-%zu-%zu-", variant_index, run_index);
    snprintf(cupti_out, sizeof cupti_out, "%s/%s%%p.json", session->directory, cupti_prefix);
    snprintf(stats_out, sizeof stats_out, "%s/%s%%p.json", session->directory, stats_prefix);
    snprintf(output, sizeof output, "%s/output-%zu-%zu.txt", session->directory, variant_index, run_index);
    memset(run, 0, sizeof *run);

    fflush(NULL);
    uint64_t start = ps_now_ns();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "poolshim: error: ab: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        int fd = open(output, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        if (session->cupti_library[0]) {
            setenv("CUDA_INJECTION64_PATH", session->cupti_library, 1);
            setenv("POOLSHIM_CUPTI_OUT", cupti_out, 1);
        }
        if (!variant->is_baseline) {
            cli_preload_append(session->shim_library);
            if (variant->config[0])
                setenv("POOLSHIM_CONFIG", variant->config, 1);
            setenv("POOLSHIM_STATS", "json", 1);
            setenv("POOLSHIM_STATS_FILE", stats_out, 1);
            if (write_log)
                setenv("POOLSHIM_LOG", session->log_path, 1);
        }
        execvp(session->command[0], session->command);
        fprintf(stderr, "poolshim: error: ab: cannot execute '%s': %s\n", session->command[0], strerror(errno));
        _exit(errno == ENOENT ? CLI_EXIT_NOT_FOUND : CLI_EXIT_CANNOT_EXECUTE);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    run->wall_s = (double)(ps_now_ns() - start) / 1e9;
    run->exit_code = cli_exit_code_of(status);

    add_reports(session->directory, cupti_prefix, run, 0);
    if (!variant->is_baseline)
        add_reports(session->directory, stats_prefix, run, 1);
    if (run->exit_code == CLI_EXIT_NOT_FOUND || run->exit_code == CLI_EXIT_CANNOT_EXECUTE) {
        char *text;
        if (cli_read_file(output, &text, NULL) == 0) {
            if (strstr(text, "poolshim: error: ab: cannot execute")) {
                fputs(text, stderr);
                free(text);
                return -1;
            }
            free(text);
        }
    }
    return 0;
}

static int render_saved(const char *path, int json)
{
    char *text, err[256];
    if (cli_read_file(path, &text, NULL) != 0) {
        fprintf(stderr, "poolshim: error: ab: cannot read %s: %s\n", path, strerror(errno));
        return CLI_EXIT_FAILURE;
    }
    ab_results_t *results = calloc(1, sizeof *results);
    int rc = results ? ab_results_parse(text, results, err, sizeof err) : -1;
    free(text);
    if (rc != 0) {
        fprintf(stderr, "poolshim: error: ab: %s: %s\n", path, results ? err : "out of memory");
        free(results);
        return CLI_EXIT_FAILURE;
    }
    if (json)
        ab_print_json(stdout, results);
    else
        ab_print_table(stdout, results);
    ab_results_free(results);
    free(results);
    return CLI_EXIT_OK;
}

/* Why the CUPTI library is missing: a variable naming no file, a build that
 * made one (it is not where this executable looks), or a build without it. */
static void warn_no_cupti(void)
{
    const char *given = getenv("POOLSHIM_CUPTI_LIB");
    char dir[PATH_MAX] = "?";
    cli_self_dir(dir, sizeof dir);
    if (given && *given)
        fprintf(stderr, "poolshim: warning: ab: POOLSHIM_CUPTI_LIB=%s is not a file", given);
    else if (PS_CUPTI_BUILT)
        fprintf(stderr, "poolshim: warning: ab: libpoolshim_cupti.so, built with this poolshim, is neither in %s "
                        "nor in %s/../lib (set POOLSHIM_CUPTI_LIB)", dir, dir);
    else
        fprintf(stderr, "poolshim: warning: ab: this poolshim was built without libpoolshim_cupti.so (the CUDA "
                        "toolkit's CUPTI, cupti.h and libcupti.so, was not found when it was built)");
    fprintf(stderr, ": the baseline gets wall time only\n");
}

/* The session's libraries and its private directory (with plotting, where
 * the first stack's log goes); nonzero (said) when they cannot be had. */
static int open_session(ab_session_t *session, char **command, int use_cupti, int plot)
{
    memset(session, 0, sizeof *session);
    session->command = command;
    session->progress = isatty(2);
    if (cli_find_library("libpoolshim.so", "POOLSHIM_LIB", session->shim_library, sizeof session->shim_library) != 0) {
        fprintf(stderr, "poolshim: error: ab: cannot find libpoolshim.so (set POOLSHIM_LIB)\n");
        return -1;
    }
    if (use_cupti && cli_find_library("libpoolshim_cupti.so", "POOLSHIM_CUPTI_LIB", session->cupti_library,
                                      sizeof session->cupti_library) != 0) {
        warn_no_cupti();
        session->cupti_library[0] = '\0';
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(session->directory, sizeof session->directory, "%s/poolshim-ab-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(session->directory)) {
        fprintf(stderr, "poolshim: error: ab: cannot create a temporary directory: %s\n", strerror(errno));
        return -1;
    }
    if (plot)
        snprintf(session->log_path, sizeof session->log_path, "%s/plot-log.csv", session->directory);
    return 0;
}

/* The baseline, then one variant per configuration (the default one without any). */
static void add_variants(ab_results_t *results, const char *const *configs, size_t config_count)
{
    ab_variant_t *baseline = &results->variants[results->variant_count++];
    snprintf(baseline->name, sizeof baseline->name, "baseline");
    baseline->is_baseline = 1;
    for (size_t i = 0; i < (config_count ? config_count : 1); i++) {
        ab_variant_t *v = &results->variants[results->variant_count++];
        sim_stack_name(config_count ? configs[i] : NULL, v->name, sizeof v->name);
        if (config_count) {
            char *resolved = realpath(configs[i], NULL);
            snprintf(v->config, sizeof v->config, "%s", resolved ? resolved : configs[i]);
            free(resolved);
        }
    }
}

/* `runs` rounds, each variant once in turn; with plotting the first
 * stack's first run writes the allocation log. CLI_EXIT_OK, or
 * CLI_EXIT_FAILURE when a run could not be made. */
static int run_rounds(ab_session_t *session, ab_results_t *results, long runs, int plot)
{
    int exit_code = CLI_EXIT_OK;
    for (long r = 0; r < runs && exit_code != CLI_EXIT_FAILURE; r++) {
        for (size_t v = 0; v < results->variant_count; v++) {
            ab_variant_t *variant = &results->variants[v];
            if (session->progress)
                fprintf(stderr, "\rpoolshim ab: run %ld/%ld: %-20s", r + 1, runs, variant->name);
            ab_run_t *run = &variant->runs[variant->run_count];
            if (run_once(session, variant, v, (size_t)r, plot && v == 1 && r == 0, run) != 0) {
                exit_code = CLI_EXIT_FAILURE;
                break;
            }
            variant->run_count++;
            if (session->progress) {
                char t[32];
                fprintf(stderr, " %s (exit %d)   ", cli_format_seconds(t, sizeof t, run->wall_s), run->exit_code);
            }
        }
    }
    if (session->progress)
        fprintf(stderr, "\r%70s\r", "");
    return exit_code;
}

/* --plot: the first stack's run, replayed from its log and drawn with the
 * reserved bytes it recorded; nonzero when that failed. */
static int plot_first_stack(const ab_session_t *session, const ab_results_t *results, const char *plot_path)
{
    memlog_t log;
    if (access(session->log_path, R_OK) != 0) {
        fprintf(stderr, "poolshim: error: ab: the shim wrote no allocation log, nothing to plot\n");
        return -1;
    }
    if (memlog_read(session->log_path, &log) != 0)
        return -1;
    char title[2200];
    snprintf(title, sizeof title, "Memory over time: %s", results->command);
    const char *config = results->variants[1].config[0] ? results->variants[1].config : NULL;
    reserved_log_t recorded; /* the shim wrote its companion beside the log */
    int have_recorded = reserved_log_read(session->log_path, &log, &recorded);
    int failed = have_recorded < 0 || replay_plot(&log, results->variants[1].name, config, (uint64_t)1 << 40, 0,
                                                  have_recorded ? &recorded : NULL, title, plot_path) != 0;
    reserved_log_free(&recorded);
    memlog_free(&log);
    return failed ? -1 : 0;
}

#ifndef PS_CUPTI_BUILT
#define PS_CUPTI_BUILT 0 /* (mk/tools.mk: 1 when this build made libpoolshim_cupti.so) */
#endif


int ps_cmd_ab(int argc, char **argv)
{
    enum { OPT_NO_CUPTI = 1000, OPT_KEEP, OPT_RENDER };
    static const struct option long_options[] = {
        {"runs", required_argument, NULL, 'n'},   {"config", required_argument, NULL, 'c'},
        {"json", no_argument, NULL, 'j'},         {"plot", required_argument, NULL, 'p'},
        {"no-cupti", no_argument, NULL, OPT_NO_CUPTI}, {"keep", no_argument, NULL, OPT_KEEP},
        {"render", required_argument, NULL, OPT_RENDER}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *configs[AB_MAX_VARIANTS - 1];
    size_t config_count = 0;
    const char *plot_path = NULL, *render = NULL;
    long runs = 3;
    int json = 0, use_cupti = 1, keep = 0;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "+:n:c:jp:h", long_options, NULL)) != -1) {
        int no_value = c == 'n' || c == 'c' || c == 'p' || c == OPT_RENDER
                           ? cli_value_is_double_dash("ab", argc, argv, optarg)
                           : 0;
        if (no_value)
            return no_value;
        switch (c) {
        case 'n':
            if (cli_parse_int(optarg, 1, AB_MAX_RUNS, &runs) != 0)
                return cli_usage_error("ab", "--runs wants 1..%d, not '%s'", AB_MAX_RUNS, optarg);
            break;
        case 'c':
            if (config_count == AB_MAX_VARIANTS - 1)
                return cli_usage_error("ab", "at most %d --config", AB_MAX_VARIANTS - 1);
            configs[config_count++] = optarg;
            break;
        case 'j': json = 1; break;
        case 'p': plot_path = optarg; break;
        case OPT_NO_CUPTI: use_cupti = 0; break;
        case OPT_KEEP: keep = 1; break;
        case OPT_RENDER: render = optarg; break;
        case 'h': fputs(ab_usage, stdout); return CLI_EXIT_OK;
        case ':': return cli_usage_error("ab", "option '%s' needs a value", argv[optind - 1]);
        default: return cli_usage_error("ab", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (render) {
        if (optind < argc)
            return cli_usage_error("ab", "--render takes no command");
        return render_saved(render, json);
    }
    if (optind >= argc || strcmp(argv[optind - 1], "--") != 0) {
        if (optind < argc)
            return cli_usage_error("ab", "put '--' before the command ('poolshim ab -- %s ...')", argv[optind]);
        return cli_usage_error("ab", "no command given (poolshim ab [options] -- COMMAND ...)");
    }

    /* every configuration as the shim will read it, before any run */
    for (size_t i = 0; i < (config_count ? config_count : 1); i++)
        if (cli_check_config("ab", config_count ? configs[i] : NULL, 0) != 0)
            return CLI_EXIT_FAILURE;

    ab_session_t session;
    if (open_session(&session, argv + optind, use_cupti, plot_path != NULL) != 0)
        return CLI_EXIT_FAILURE;
    ab_results_t *results = calloc(1, sizeof *results);
    if (!results) {
        cli_remove_directory(session.directory);
        return CLI_EXIT_FAILURE;
    }
    shell_quote_command(results->command, sizeof results->command, session.command);
    add_variants(results, configs, config_count);
    int exit_code = run_rounds(&session, results, runs, plot_path != NULL);
    if (exit_code == CLI_EXIT_OK) {
        if (json)
            ab_print_json(stdout, results);
        else
            ab_print_table(stdout, results);
        for (size_t v = 0; v < results->variant_count; v++)
            for (size_t r = 0; r < results->variants[v].run_count; r++)
                if (results->variants[v].runs[r].exit_code != 0)
                    exit_code = CLI_EXIT_FAILURE;
        if (plot_path && plot_first_stack(&session, results, plot_path) != 0)
            exit_code = CLI_EXIT_FAILURE;
    }
    if (keep)
        fprintf(stderr, "poolshim: ab: runs' output and statistics kept in %s\n", session.directory);
    else
        cli_remove_directory(session.directory);
    ab_results_free(results);
    free(results);
    return exit_code;
}
