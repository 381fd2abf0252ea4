/* poolshim run: runs a command with libpoolshim.so preloaded.
 *
 * Algorithm:
 *   1. Parse options up to `--` (required: everything after it is the
 *      command, so the command's own options never reach us).
 *   2. Find libpoolshim.so ($POOLSHIM_LIB, beside this executable, or
 *      ../lib/ after `make install`); append it to LD_PRELOAD.
 *   3. Set POOLSHIM_CONFIG (--config), POOLSHIM_OPTIONS (the -o values
 *      joined with commas, after any POOLSHIM_OPTIONS already set) and
 *      POOLSHIM_STATS (--stats). --sanitize sets POOLSHIM_NVTX=1 (the
 *      shim shows every block to the tool as an NVTX region) and puts
 *      `compute-sanitizer --tool memcheck --nvtx yes --` before the command
 *      ($POOLSHIM_SANITIZER, else compute-sanitizer on PATH, else
 *      $CUDA_HOME/bin, else /usr/local/cuda/bin).
 *   4. execvp the command: it replaces this process, so its exit status,
 *      signals and terminal are the command's own (no fork, no wait).
 *      A command that cannot be executed exits 127 (not found) or 126.
 *   With --stats and no --stats-file the command may be a launcher
 *   (torchrun, mpirun, srun) whose processes would all print or write one
 *   report: instead, every process writes its own JSON file
 *   (POOLSHIM_STATS_FILE = DIR/stats_%p.json in a private temporary
 *   directory), the command runs as a child (SIGTERM and SIGHUP are passed
 *   on to it; SIGINT and SIGQUIT reach it from the terminal), and at its
 *   exit the files are read back and printed to stderr as one table, a row
 *   per process (rank) and a total (stats_table.c); one process with
 *   --stats=json gets its report as the shim wrote it; no file at all from
 *   a command that exited by itself (no process made a CUDA allocation)
 *   gets one line saying so. The exit status is still the command's.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "stats_table.h"

static const char run_usage[] =
    "usage: poolshim run [options] -- COMMAND [ARGS...]\n"
    "\n"
    "Runs COMMAND with libpoolshim.so preloaded (appended to LD_PRELOAD).\n"
    "The exit status is COMMAND's (128+N when it is killed by signal N).\n"
    "\n"
    "options:\n"
    "  -c, --config FILE      configuration file (sets POOLSHIM_CONFIG)\n"
    "  -o, --option KEY=VAL   one setting, e.g. -o global.free_sync=none (repeatable;\n"
    "                         joined into POOLSHIM_OPTIONS)\n"
    "  -s, --stats[=FORMAT]   print statistics at exit: text (default) or json; every\n"
    "                         process (all ranks under torchrun, mpirun, srun) writes its\n"
    "                         own, and one table follows: a row per rank and the total\n"
    "      --stats-file PATH  write the statistics there instead (%p = pid, %r = rank);\n"
    "                         merge them later with 'poolshim stats'\n"
    "      --log PATH         write the allocation log (RMM CSV format)\n"
    "      --sanitize         run COMMAND under compute-sanitizer --tool memcheck with\n"
    "                         debug.nvtx on: overflows into a neighbouring block and uses\n"
    "                         after free inside the pool are reported\n"
    "  -n, --dry-run          print the environment and command instead of running it\n"
    "  -h, --help             this text\n"
    "\n"
    "environment: POOLSHIM_LIB overrides where libpoolshim.so is found; POOLSHIM_SANITIZER\n"
    "where compute-sanitizer is.\n";

/* compute-sanitizer for --sanitize: $POOLSHIM_SANITIZER, PATH, $CUDA_HOME/bin,
 * /usr/local/cuda/bin. Returns 0 and the path in `out`, or -1. */
static int find_sanitizer(char *out, size_t size)
{
    const char *given = getenv("POOLSHIM_SANITIZER");
    if (given && *given) {
        snprintf(out, size, "%s", given);
        return access(out, X_OK) == 0 ? 0 : -1;
    }
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(out, size, "%.*s/compute-sanitizer", (int)n, path);
        if (n && access(out, X_OK) == 0)
            return 0;
        path += n + (path[n] == ':');
    }
    const char *home = getenv("CUDA_HOME");
    if (home && *home) {
        snprintf(out, size, "%s/bin/compute-sanitizer", home);
        if (access(out, X_OK) == 0)
            return 0;
    }
    snprintf(out, size, "/usr/local/cuda/bin/compute-sanitizer");
    return access(out, X_OK) == 0 ? 0 : -1;
}

/* Appends "key=value" to the comma-joined option list. */
static int append_option(char **joined, const char *option)
{
    if (!strchr(option, '=') || option[0] == '=')
        return -1;
    size_t old = *joined ? strlen(*joined) : 0;
    char *bigger = realloc(*joined, old + strlen(option) + 2);
    if (!bigger)
        return -1;
    if (old)
        bigger[old++] = ',';
    strcpy(bigger + old, option);
    *joined = bigger;
    return 0;
}

/* The child under --stats: passes on what is sent to poolshim itself. */
static volatile sig_atomic_t child_pid;

static void forward_signal(int signal_number)
{
    if (child_pid > 0)
        kill((pid_t)child_pid, signal_number);
}

/* Prints what the processes wrote into `directory` (one stats_*.json each).
 * None written by a command that exited by itself (`exited`: not killed,
 * not unable to start): no process of `command` reached the shim, and one
 * line says so. */
static void print_merged_stats(const char *directory, int json, const char *command, bool exited)
{
    stats_job_t job = {0};
    char err[4400];
    size_t found = 0;
    if (stats_job_read_directory(&job, directory, "stats_", 0, &found, err, sizeof err) != 0)
        fprintf(stderr, "poolshim: warning: run: %s\n", err);
    stats_job_sort(&job);
    if (job.count == 1 && json) {
        char *text; /* one process: its report as the shim wrote it */
        if (cli_read_file(job.processes[0].file, &text, NULL) == 0) {
            fputs(text, stderr);
            free(text);
        }
    } else if (job.count) {
        for (size_t i = 0; i < job.count; i++)
            job.processes[i].file[0] = '\0'; /* removed with the directory: not worth a column */
        fprintf(stderr, "\n");
        if (json)
            stats_print_json(stderr, &job);
        else
            stats_print_table(stderr, &job);
    } else if (!found && exited) {
        fprintf(stderr, "poolshim: run: no CUDA allocation seen: no process of '%s' allocated GPU memory "
                        "through CUDA, so there are no statistics\n", command);
    }
    stats_job_free(&job);
}

/* Runs the command as a child and waits; returns its exit code. */
static int run_and_wait(char **command)
{
    struct sigaction ignore = {.sa_handler = SIG_IGN}, forward = {.sa_handler = forward_signal}, old[4];
    static const int signals[4] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP};
    sigemptyset(&ignore.sa_mask);
    sigemptyset(&forward.sa_mask);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "poolshim: error: run: fork: %s\n", strerror(errno));
        return CLI_EXIT_FAILURE;
    }
    if (pid == 0) {
        execvp(command[0], command);
        int error = errno;
        fprintf(stderr, "poolshim: error: run: cannot execute '%s': %s\n", command[0], strerror(error));
        _exit(error == ENOENT ? CLI_EXIT_NOT_FOUND : CLI_EXIT_CANNOT_EXECUTE);
    }
    child_pid = pid;
    for (int i = 0; i < 4; i++)
        sigaction(signals[i], i < 2 ? &ignore : &forward, &old[i]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    for (int i = 0; i < 4; i++)
        sigaction(signals[i], &old[i], NULL);
    child_pid = 0;
    return cli_exit_code_of(status);
}

/* What `poolshim run` was asked. */
typedef struct run_args {
    const char *config, *stats, *stats_file, *log_path; /* --config, --stats, --stats-file, --log */
    char *options;   /* POOLSHIM_OPTIONS: the environment's, then each -o (owned) */
    int dry_run;     /* --dry-run */
    int sanitize;    /* --sanitize */
    char **command;  /* the command after -- */
    const char *program; /* its first word (the command even under --sanitize) */
    size_t command_count; /* its words */
} run_args_t;

/* Parses the options; -1 when the command is to run, else the exit code
 * (args->options freed). */
static int parse_run_args(int argc, char **argv, run_args_t *args)
{
    static const struct option long_options[] = {
        {"config", required_argument, NULL, 'c'},
        {"option", required_argument, NULL, 'o'},
        {"stats", optional_argument, NULL, 's'},
        {"stats-file", required_argument, NULL, 'F'},
        {"log", required_argument, NULL, 'L'},
        {"dry-run", no_argument, NULL, 'n'},
        {"sanitize", no_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *existing = getenv("POOLSHIM_OPTIONS");
    *args = (run_args_t){.options = existing && *existing ? strdup(existing) : NULL};
    opterr = 0;
    optind = 1;
    int c, code = -1;
    while (code < 0 && (c = getopt_long(argc, argv, "+:c:o:s::nh", long_options, NULL)) != -1) {
        int no_value = c == 'c' || c == 'o' || c == 'F' || c == 'L'
                           ? cli_value_is_double_dash("run", argc, argv, optarg)
                           : 0;
        if (no_value) {
            code = no_value;
            break;
        }
        switch (c) {
        case 'c': args->config = optarg; break;
        case 'o':
            if (append_option(&args->options, optarg) != 0)
                code = cli_usage_error("run", "-o wants KEY=VALUE, got '%s'", optarg);
            break;
        case 's':
            args->stats = optarg ? optarg : "text";
            if (strcmp(args->stats, "text") && strcmp(args->stats, "json") && strcmp(args->stats, "1"))
                code = cli_usage_error("run", "--stats is text or json, not '%s'", args->stats);
            break;
        case 'F': args->stats_file = optarg; break;
        case 'L': args->log_path = optarg; break;
        case 'n': args->dry_run = 1; break;
        case 'S': args->sanitize = 1; break;
        case 'h':
            fputs(run_usage, stdout);
            code = CLI_EXIT_OK;
            break;
        case ':': code = cli_usage_error("run", "option '%s' needs a value", argv[optind - 1]); break;
        default: code = cli_usage_error("run", "unknown option '%s'", argv[optind - 1]); break;
        }
    }
    if (code < 0 && optind < argc && strcmp(argv[optind - 1], "--") != 0)
        code = cli_usage_error("run", "put '--' before the command ('poolshim run -- %s ...')", argv[optind]);
    else if (code < 0 && optind >= argc)
        code = cli_usage_error("run", "no command given (poolshim run [options] -- COMMAND ...)");
    if (code >= 0) {
        free(args->options);
        args->options = NULL;
    }
    args->command = argv + optind;
    args->program = optind < argc ? argv[optind] : NULL;
    args->command_count = optind < argc ? (size_t)(argc - optind) : 0;
    return code;
}

/* --sanitize: compute-sanitizer's memcheck (with NVTX) before the command,
 * in *sanitized (freed by the caller), `sanitizer` its path. -1, or the
 * exit code. */
static int sanitize_command(run_args_t *args, char *sanitizer, size_t size, char ***sanitized)
{
    if (find_sanitizer(sanitizer, size) != 0) {
        fprintf(stderr, "poolshim: error: run: --sanitize: cannot find compute-sanitizer (looked at "
                        "$POOLSHIM_SANITIZER, PATH, $CUDA_HOME/bin and /usr/local/cuda/bin)\n");
        return CLI_EXIT_NOT_FOUND;
    }
    static const char *const prefix[] = {"--tool", "memcheck", "--nvtx", "yes", "--"};
    size_t count = args->command_count, extra = 1 + sizeof prefix / sizeof prefix[0];
    char **line = calloc(count + extra + 1, sizeof *line);
    if (!line) {
        fprintf(stderr, "poolshim: error: run: out of memory\n");
        return CLI_EXIT_FAILURE;
    }
    line[0] = sanitizer;
    for (size_t i = 0; i + 1 < extra; i++)
        line[1 + i] = (char *)prefix[i];
    memcpy(line + extra, args->command, count * sizeof *args->command);
    args->command = *sanitized = line;
    return -1;
}

/* The environment the shim reads: LD_PRELOAD and the POOLSHIM_* the
 * options set. Nonzero when a setenv failed. */
static int set_run_environment(const run_args_t *args, const char *library)
{
    int failed = cli_preload_append(library) != 0;
    if (args->config)
        failed |= setenv("POOLSHIM_CONFIG", args->config, 1) != 0;
    if (args->options)
        failed |= setenv("POOLSHIM_OPTIONS", args->options, 1) != 0;
    if (args->stats)
        failed |= setenv("POOLSHIM_STATS", args->stats, 1) != 0;
    if (args->stats_file)
        failed |= setenv("POOLSHIM_STATS_FILE", args->stats_file, 1) != 0;
    if (args->log_path)
        failed |= setenv("POOLSHIM_LOG", args->log_path, 1) != 0;
    if (args->sanitize)
        failed |= setenv("POOLSHIM_NVTX", "1", 1) != 0;
    return failed;
}

/* --dry-run: the environment and the command, as they would be run. */
static int print_dry_run(char **command)
{
    const char *names[] = {"LD_PRELOAD", "POOLSHIM_CONFIG", "POOLSHIM_OPTIONS", "POOLSHIM_STATS",
                           "POOLSHIM_STATS_FILE", "POOLSHIM_LOG", "POOLSHIM_NVTX"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (getenv(names[i]))
            printf("%s=%s\n", names[i], getenv(names[i]));
    for (char **arg = command; *arg; arg++)
        printf("%s%s", arg == command ? "" : " ", *arg);
    printf("\n");
    return CLI_EXIT_OK;
}

/* Runs the command: in place (exec), or, merging the statistics of every
 * process (--stats alone, `directory`), as a child; `program` is the
 * user's command (compute-sanitizer's aside). */
static int run_command(char **command, const char *program, const char *directory, const char *stats)
{
    if (directory) {
        int exit_code = run_and_wait(command);
        print_merged_stats(directory, !strcmp(stats, "json"), program, exit_code < CLI_EXIT_CANNOT_EXECUTE);
        cli_remove_directory(directory);
        return exit_code;
    }
    fflush(NULL);
    execvp(command[0], command);
    int error = errno;
    fprintf(stderr, "poolshim: error: run: cannot execute '%s': %s\n", command[0], strerror(error));
    return error == ENOENT ? CLI_EXIT_NOT_FOUND : CLI_EXIT_CANNOT_EXECUTE;
}

int ps_cmd_run(int argc, char **argv)
{
    run_args_t args;
    int code = parse_run_args(argc, argv, &args);
    if (code >= 0)
        return code;
    char sanitizer[PATH_MAX], library[PATH_MAX];
    char **sanitized = NULL; /* compute-sanitizer's arguments, then the command */
    if (args.sanitize && (code = sanitize_command(&args, sanitizer, sizeof sanitizer, &sanitized)) >= 0) {
        free(args.options);
        return code;
    }
    if (cli_find_library("libpoolshim.so", "POOLSHIM_LIB", library, sizeof library) != 0) {
        free(args.options);
        free(sanitized);
        fprintf(stderr, "poolshim: error: run: cannot find libpoolshim.so (looked at $POOLSHIM_LIB, "
                        "beside the poolshim executable and in ../lib/); set POOLSHIM_LIB\n");
        return CLI_EXIT_FAILURE;
    }
    int failed = set_run_environment(&args, library);
    free(args.options);
    /* what the shim will read, checked now rather than at the first cudaMalloc */
    int invalid = !failed ? cli_check_config("run", NULL, 0) : 0;
    if (invalid) {
        free(sanitized);
        return invalid;
    }
    /* --stats alone: one JSON file per process, merged at the end */
    int merge = args.stats && !args.stats_file;
    char directory[PATH_MAX], pattern[PATH_MAX + 32];
    if (merge) {
        const char *tmp = getenv("TMPDIR");
        snprintf(directory, sizeof directory, "%s/poolshim-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!args.dry_run && !mkdtemp(directory)) {
            free(sanitized);
            fprintf(stderr, "poolshim: error: run: cannot create a temporary directory: %s\n", strerror(errno));
            return CLI_EXIT_FAILURE;
        }
        snprintf(pattern, sizeof pattern, "%s/stats_%%p.json", directory);
        failed |= setenv("POOLSHIM_STATS", "json", 1) != 0;
        failed |= setenv("POOLSHIM_STATS_FILE", pattern, 1) != 0;
    }
    if (failed) {
        fprintf(stderr, "poolshim: error: run: cannot set the environment: %s\n", strerror(errno));
        if (merge && !args.dry_run)
            cli_remove_directory(directory);
        code = CLI_EXIT_FAILURE;
    } else {
        code = args.dry_run ? print_dry_run(args.command)
                            : run_command(args.command, args.program, merge ? directory : NULL, args.stats);
    }
    free(sanitized);
    return code;
}
