/* The poolshim command: subcommands and the helpers they share.
 *
 * Exit codes (every subcommand):
 *   0    success
 *   1    the work failed (bad log, stack cannot be built, a command that
 *        could not be profiled)
 *   2    usage error (unknown option, missing `--`, bad value)
 *   126  the command was found but could not be executed (run)
 *   127  the command was not found (run)
 *   N    `run` passes the child's exit status through; 128+signal when the
 *        child was killed by a signal (the shell's convention).
 * Messages go to stderr as "poolshim: error: ..." (the core's message path).
 */
#ifndef PS_CLI_H
#define PS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_FAILURE = 1,
    CLI_EXIT_USAGE = 2,
    CLI_EXIT_CANNOT_EXECUTE = 126,
    CLI_EXIT_NOT_FOUND = 127,
};

/* Subcommands: argv[0] is the subcommand's name; each returns an exit code. */
int ps_cmd_run(int argc, char **argv);
int ps_cmd_ab(int argc, char **argv);
int ps_cmd_replay(int argc, char **argv);
int ps_cmd_plot(int argc, char **argv);
int ps_cmd_stats(int argc, char **argv);
int ps_cmd_config(int argc, char **argv);
int ps_cmd_top(int argc, char **argv);
int ps_cmd_export(int argc, char **argv);

/* ---- tools/cli_util.c ---- */

/* Path of the running executable's directory ("/x/build"). */
int cli_self_dir(char *out, size_t outsize);

/* Finds a library shipped with poolshim, in order: the environment variable
 * `env_name` (if set and non-empty), beside the executable, ../lib/ relative
 * to it (after `make install`). Returns 0 and the absolute path, or -1. */
int cli_find_library(const char *file_name, const char *env_name, char *out, size_t outsize);

/* Sets LD_PRELOAD so that `library` is loaded, appended after what the
 * environment already preloads (never replacing it, never twice). */
int cli_preload_append(const char *library);

/* Turns a waitpid status into a shell-style exit code (128+signal). */
int cli_exit_code_of(int wait_status);


/* Human units: "1.50 GiB" (binary), "12.3 ms" (seconds given as double),
 * "1,234,567" (thousands separators). Return buf. */
char *cli_format_bytes(char *buf, size_t bufsize, uint64_t bytes);
char *cli_format_seconds(char *buf, size_t bufsize, double seconds);
char *cli_format_count(char *buf, size_t bufsize, uint64_t count);

/* Durations for options: a number (fraction allowed) and a unit, ns, us,
 * µs, ms or s ("5ms", "200us", "1.5 s"); "0" needs no unit. Returns 0 and
 * the nanoseconds (rounded to nearest), or -1 on a malformed, negative or
 * too large (> ~584 years) value, with why a short reason. */
int cli_parse_duration(const char *text, uint64_t *ns, const char **why);

/* Whole numbers for options (--runs, --device, --busy-streams): decimal
 * digits only, no sign, no spaces, within [lo, hi] (lo >= 0). Returns 0 and
 * the value, or -1 (the caller names the option and its range). */
int cli_parse_int(const char *text, long lo, long hi, long *value);

/* Usage errors: prints "poolshim: error: CMD: MESSAGE" and a hint to
 * --help; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *command, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* An option that needs a value was given `--` (`run -c -- prog`): prints a
 * usage error naming the option and returns CLI_EXIT_USAGE; else 0. Call
 * right after getopt_long returned an option with a required value. */
int cli_value_is_double_dash(const char *command, int argc, char **argv, const char *value);

/* What the shim will read, checked before anything is started: loads the
 * configuration with the library's own code (`file`, else $POOLSHIM_CONFIG
 * and the usual files; then POOLSHIM_OPTIONS and the short forms, unless
 * no_env), prints every error, and, for a program to be run (!no_env),
 * checks that the directory of global.log_file and global.stats_file
 * exists and is writable. Returns 0, or CLI_EXIT_FAILURE after printing why. */
int cli_check_config(const char *command, const char *file, int no_env);

/* Writes `text` as a JSON string literal (quoted, escaped). */
void cli_json_string(FILE *f, const char *text);
/* Writes `value` as a JSON number, or null when it is not `known`. */
void cli_json_u64_or_null(FILE *f, int known, uint64_t value);

/* Reading JSON (the shim's statistics, the CUPTI report, saved `ab --json`)
 * goes through jansson, linked statically into the CLI. jansson keeps
 * integers as long long: a document holding an integer above 2^63-1 does
 * not parse ("too big integer"). */
/* Parses a whole document (an object or an array, nothing after it). On
 * error writes "line L, column C: what" into err and returns NULL.
 * Release the result with json_decref(). */
json_t *cli_json_parse(const char *text, char *err, size_t errsize);
/* Member by dotted path ("bytes.reserved_peak"), or NULL. */
json_t *cli_json_at(const json_t *object, const char *path);
/* Number at path as uint64 (exact for integers; negative numbers give 0) /
 * as double, or `fallback` when absent or not a number. */
uint64_t cli_json_u64(const json_t *object, const char *path, uint64_t fallback);
double cli_json_double(const json_t *object, const char *path, double fallback);
/* String at path, or `fallback`. */
const char *cli_json_str(const json_t *object, const char *path, const char *fallback);

/* Reads a whole file into a NUL-terminated buffer (free() it); -1 with
 * errno = EISDIR for a directory. */
int cli_read_file(const char *path, char **text, size_t *length);
/* Removes a directory of plain files (the per-process stats of run and ab). */
void cli_remove_directory(const char *path);
/* Splits a CSV line (modified in place) at commas into at most `max`
 * fields, blanks trimmed; returns the count, or -1 when there are more. */
int cli_split_csv(char *line, char **fields, int max);
/* Reads a CSV header (its `count` fields, from cli_split_csv): column[c]
 * becomes the index of the first field named names[c] (case-insensitive),
 * and stays as it was (-1) for a name not there. Returns how many fields a
 * data line needs to hold every column found. */
int cli_csv_columns(char *const *fields, int count, const char *const *names, int name_count, int *column);

/* Median / minimum / maximum of n doubles (n > 0; values is reordered). */
double cli_median(double *values, size_t n);

#endif
