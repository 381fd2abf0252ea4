/* poolshim stats: the shim's JSON statistics of one job, merged.
 *
 * Algorithm:
 *   1. Each argument is a file, a directory (every *.json in it that is the
 *      shim's statistics; other JSON reports there are skipped) or a glob
 *      pattern the shell did not expand ('out/stats_*.json').
 *   2. Each file becomes one row (stats_table.c): its devices summed.
 *   3. Rows are ordered by node, rank, then pid; with several nodes each
 *      node's total follows its rows; the job's total comes last; --json
 *      prints the same as JSON.
 * The first unreadable or malformed file stops with its name (and line,
 * column from jansson) and exit status 1.
 */
#include <getopt.h>
#include <glob.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "stats_table.h"

static const char stats_usage[] =
    "usage: poolshim stats [options] FILE|DIRECTORY|'PATTERN'...\n"
    "\n"
    "Merges the shim's JSON statistics (POOLSHIM_STATS=json) of the processes of one job\n"
    "into one table: one row per file (its rank, from the report or the file name), then\n"
    "the total: allocation calls, time in them, peak requested and reserved bytes and their\n"
    "ratio, barriers, and pinned host memory when used. Files of several nodes: a node\n"
    "column and a total per node. A DIRECTORY stands for every *.json in it that holds the\n"
    "shim's statistics. Write one file per process with POOLSHIM_STATS_FILE=out/stats_%r.json\n"
    "(%r = rank, %p = pid; under Slurm %j, %s, %h = job, step, node).\n"
    "\n"
    "options:\n"
    "  -j, --json    print JSON instead of the table\n"
    "  -h, --help    this text\n"
    "\n"
    "exit status: 1 when a file cannot be read or is not the shim's statistics.\n";

/* Reads one argument into the job; prints the error and returns -1. */
static int read_argument(stats_job_t *job, const char *argument)
{
    char err[4400];
    struct stat st;
    if (stat(argument, &st) != 0 && strpbrk(argument, "*?[")) {
        glob_t matches;
        int rc = glob(argument, 0, NULL, &matches);
        if (rc == GLOB_NOMATCH) {
            fprintf(stderr,
                    "poolshim: error: stats: %s: no file matches (a process that made no CUDA allocation "
                    "writes none)\n",
                    argument);
            return -1;
        }
        for (size_t i = 0; rc == 0 && i < matches.gl_pathc; i++)
            if (read_argument(job, matches.gl_pathv[i]) != 0)
                rc = -1;
        globfree(&matches);
        return rc == 0 ? 0 : -1;
    }
    if (stat(argument, &st) == 0 && S_ISDIR(st.st_mode)) {
        size_t found = 0;
        if (stats_job_read_directory(job, argument, "", 1, &found, err, sizeof err) != 0) {
            fprintf(stderr, "poolshim: error: stats: %s\n", err);
            return -1;
        }
        if (!found) {
            fprintf(stderr,
                    "poolshim: error: stats: %s: no *.json file with the shim's statistics (a process that "
                    "made no CUDA allocation writes none)\n",
                    argument);
            return -1;
        }
        return 0;
    }
    if (stats_job_read_file(job, argument, err, sizeof err) != 0) {
        fprintf(stderr, "poolshim: error: stats: %s\n", err);
        return -1;
    }
    return 0;
}

int ps_cmd_stats(int argc, char **argv)
{
    static const struct option long_options[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int json = 0;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":jh", long_options, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'h': fputs(stats_usage, stdout); return CLI_EXIT_OK;
        default: return cli_usage_error("stats", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return cli_usage_error("stats", "no statistics file given (poolshim stats FILE...)");
    stats_job_t job = {0};
    for (int i = optind; i < argc; i++) {
        if (read_argument(&job, argv[i]) != 0) {
            stats_job_free(&job);
            return CLI_EXIT_FAILURE;
        }
    }
    stats_job_sort(&job);
    if (json)
        stats_print_json(stdout, &job);
    else
        stats_print_table(stdout, &job);
    stats_job_free(&job);
    return CLI_EXIT_OK;
}
