/* Helpers shared by the poolshim subcommands: finding the shipped
 * libraries, LD_PRELOAD handling, exit codes, size parsing, human units,
 * JSON string writing and reading (over jansson).
 *
 * Library lookup (cli_find_library):
 *   1. an explicit environment variable (POOLSHIM_LIB, POOLSHIM_CUPTI_LIB);
 *   2. beside the executable (build/libpoolshim.so next to build/poolshim);
 *   3. ../lib/ relative to the executable (PREFIX/bin -> PREFIX/lib).
 * LD_PRELOAD is extended, never replaced: other preloads stay in front
 * and ours is appended once.
 */
#include "cli.h"
#include "../config/config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

int cli_self_dir(char *out, size_t outsize)
{
    char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0)
        return -1;
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    if ((size_t)snprintf(out, outsize, "%s", path) >= outsize)
        return -1;
    return 0;
}

static int is_regular_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int cli_find_library(const char *file_name, const char *env_name, char *out, size_t outsize)
{
    const char *explicit_path = env_name ? getenv(env_name) : NULL;
    if (explicit_path && *explicit_path) {
        if (!is_regular_file(explicit_path))
            return -1;
        char *resolved = realpath(explicit_path, NULL);
        int ok = resolved && (size_t)snprintf(out, outsize, "%s", resolved) < outsize;
        free(resolved);
        return ok ? 0 : -1;
    }
    char dir[PATH_MAX];
    if (cli_self_dir(dir, sizeof dir) != 0)
        return -1;
    const char *const relative[] = {"", "/../lib"};
    for (size_t i = 0; i < sizeof relative / sizeof relative[0]; i++) {
        char candidate[PATH_MAX + 64];
        snprintf(candidate, sizeof candidate, "%s%s/%s", dir, relative[i], file_name);
        if (is_regular_file(candidate)) {
            char *resolved = realpath(candidate, NULL);
            int ok = resolved && (size_t)snprintf(out, outsize, "%s", resolved) < outsize;
            free(resolved);
            return ok ? 0 : -1;
        }
    }
    return -1;
}

int cli_preload_append(const char *library)
{
    const char *current = getenv("LD_PRELOAD");
    if (!current || !*current)
        return setenv("LD_PRELOAD", library, 1) == 0 ? 0 : -1;
    /* already there? (entries are separated by ':' or spaces) */
    size_t len = strlen(library);
    for (const char *p = current; (p = strstr(p, library)) != NULL; p += len) {
        int starts = p == current || p[-1] == ':' || p[-1] == ' ';
        int ends = p[len] == '\0' || p[len] == ':' || p[len] == ' ';
        if (starts && ends)
            return 0;
    }
    size_t size = strlen(current) + len + 2;
    char *joined = malloc(size);
    if (!joined)
        return -1;
    snprintf(joined, size, "%s:%s", current, library);
    int rc = setenv("LD_PRELOAD", joined, 1);
    free(joined);
    return rc == 0 ? 0 : -1;
}

int cli_exit_code_of(int wait_status)
{
    if (WIFEXITED(wait_status))
        return WEXITSTATUS(wait_status);
    if (WIFSIGNALED(wait_status))
        return 128 + WTERMSIG(wait_status);
    return CLI_EXIT_FAILURE;
}

char *cli_format_bytes(char *buf, size_t bufsize, uint64_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1024.0 && unit < 5) {
        value /= 1024.0;
        unit++;
    }
    if (unit == 0)
        snprintf(buf, bufsize, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, bufsize, "%.2f %s", value, units[unit]);
    return buf;
}

char *cli_format_seconds(char *buf, size_t bufsize, double seconds)
{
    static const char *const units[] = {"ns", "us", "ms", "s"};
    if (!(seconds > 0)) {
        snprintf(buf, bufsize, "0 s");
        return buf;
    }
    double value = seconds * 1e9;
    int unit = 0;
    while (unit < 3 && value >= 999.5) {
        value /= 1000;
        unit++;
    }
    /* three significant digits, fixed (no exponent, trailing zeros kept: 57.0 s) */
    int decimals = unit == 0 || value >= 99.95 ? 0 : value >= 9.995 ? 1 : 2;
    snprintf(buf, bufsize, "%.*f %s", decimals, value, units[unit]);
    return buf;
}

char *cli_format_count(char *buf, size_t bufsize, uint64_t count)
{
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%llu", (unsigned long long)count);
    size_t out = 0;
    for (int i = 0; i < n && out + 2 < bufsize; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            buf[out++] = ',';
        buf[out++] = digits[i];
    }
    buf[out] = '\0';
    return buf;
}

int cli_parse_int(const char *text, long lo, long hi, long *value)
{
    if (!text || !*text || strspn(text, "0123456789") != strlen(text))
        return -1; /* (strtol alone takes spaces, a sign and an empty rest) */
    errno = 0;
    char *end;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *value = v;
    return 0;
}

int cli_parse_duration(const char *text, uint64_t *ns, const char **why)
{
    static const struct {
        const char *name; /* unit as written */
        double scale;     /* nanoseconds per unit */
    } units[] = {{"ns", 1}, {"us", 1e3}, {"\xc2\xb5s", 1e3} /* µs in UTF-8 */, {"ms", 1e6}, {"s", 1e9}};
    const char *reason = "not a number";
    const char *p = text ? text : "";
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '-')
        reason = "durations cannot be negative";
    if (isdigit((unsigned char)*p) || (*p == '.' && isdigit((unsigned char)p[1]))) {
        char *end;
        double value = strtod(p, &end); /* digits and a fraction only: checked above and below */
        const char *digits_end = p + strspn(p, "0123456789.");
        const char *dot = memchr(p, '.', (size_t)(digits_end - p));
        if (end != digits_end) {
            reason = "not a number";
        } else if (dot && !isdigit((unsigned char)dot[1])) {
            reason = "a '.' must be followed by digits";
        } else {
            while (*end == ' ' || *end == '\t')
                end++;
            size_t unit_len = strcspn(end, " \t");
            const char *after = end + unit_len;
            while (*after == ' ' || *after == '\t')
                after++;
            double scale = 0;
            for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
                if (unit_len == strlen(units[i].name) && !strncmp(end, units[i].name, unit_len))
                    scale = units[i].scale;
            if (*after)
                reason = "unexpected characters after the unit";
            else if (!unit_len && value == 0)
                scale = 1;
            else if (!unit_len)
                reason = "give a unit (ns, us, ms, s)";
            else if (!scale)
                reason = "unknown unit (ns, us, ms, s)";
            if (scale && !*after) {
                double total = value * scale + 0.5;
                if (total >= 18446744073709551615.0) {
                    reason = "too large";
                } else {
                    *ns = (uint64_t)total;
                    return 0;
                }
            }
        }
    }
    if (why)
        *why = reason;
    return -1;
}

int cli_usage_error(const char *command, const char *fmt, ...)
{
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    fprintf(stderr, "poolshim: error: %s: %s\n(see 'poolshim %s --help')\n", command, message, command);
    return CLI_EXIT_USAGE;
}

int cli_value_is_double_dash(const char *command, int argc, char **argv, const char *value)
{
    if (!value || strcmp(value, "--") != 0)
        return 0;
    /* `-c --`: the option is the word before; `--log=--`: the word itself */
    const char *option = optind >= 2 && optind - 1 < argc && argv[optind - 1] == value ? argv[optind - 2]
                                                                                       : argv[optind - 1];
    return cli_usage_error(command, "option '%s' needs a value, not '--'", option);
}

/* The directory of a log or statistics file (its %p, %r, %d expanded) must
 * exist and be writable: the shim opens the file only at the first
 * allocation, too late to say so. */
static int check_output_directory(const char *command, const char *what, const char *pattern)
{
    char path[PATH_MAX], dir[PATH_MAX];
    if (ps_expand_path(pattern, 0, path, sizeof path) != PS_OK)
        snprintf(path, sizeof path, "%s", pattern);
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    struct stat st;
    const char *why = NULL;
    if (stat(dir, &st) != 0)
        why = strerror(errno);
    else if (!S_ISDIR(st.st_mode))
        why = "not a directory";
    else if (access(dir, W_OK | X_OK) != 0)
        why = "not writable";
    if (!why)
        return 0;
    fprintf(stderr, "poolshim: error: %s: %s `%s`: its directory `%s`: %s\n", command, what, pattern, dir, why);
    return CLI_EXIT_FAILURE;
}

int cli_check_config(const char *command, const char *file, int no_env)
{
    ps_config_input_t in = {.file = file, .options = no_env ? "" : NULL, .no_env = no_env};
    ps_config_t *cfg = NULL;
    int rc = ps_config_load(&in, &cfg);
    if (!cfg) {
        fprintf(stderr, "poolshim: error: %s: cannot load the configuration: %s\n", command, ps_status_name(rc));
        return CLI_EXIT_FAILURE;
    }
    if (rc != PS_OK) {
        ps_config_print_errors(cfg, stderr);
        fprintf(stderr, "poolshim: error: %s: %zu error(s) in the configuration; nothing was started\n", command,
                ps_config_error_count(cfg));
        ps_config_free(cfg);
        return CLI_EXIT_FAILURE;
    }
    const ps_global_config_t *g = ps_config_global(cfg);
    int failed = 0;
    if (!no_env && g->log_file[0])
        failed = check_output_directory(command, "log file", g->log_file);
    if (!failed && !no_env && g->stats_file[0])
        failed = check_output_directory(command, "statistics file", g->stats_file);
    ps_config_free(cfg);
    return failed;
}

/* Length of the well-formed UTF-8 sequence at s (1-4), or 0. */
static size_t utf8_sequence(const unsigned char *s)
{
    size_t n = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
                           : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    if ((n == 3 && s[0] == 0xE0 && s[1] < 0xA0) || (n == 3 && s[0] == 0xED && s[1] >= 0xA0) || /* overlong, surrogate */
        (n == 4 && s[0] == 0xF0 && s[1] < 0x90) || (n == 4 && s[0] == 0xF4 && s[1] >= 0x90))  /* overlong, > U+10FFFF */
        return 0;
    return n;
}

void cli_json_string(FILE *f, const char *text)
{
    /* jansson writes the literal; it takes UTF-8 only, so each byte that is
     * not part of a well-formed sequence becomes U+FFFD first */
    size_t len = strlen(text);
    char *valid = malloc(3 * len + 1);
    size_t n = 0;
    for (const unsigned char *s = (const unsigned char *)text; valid && *s;) {
        size_t k = utf8_sequence(s);
        if (k) {
            memcpy(valid + n, s, k);
            n += k;
            s += k;
        } else {
            memcpy(valid + n, "\xEF\xBF\xBD", 3);
            n += 3;
            s++;
        }
    }
    json_t *string = valid ? json_stringn(valid, n) : NULL;
    char *literal = string ? json_dumps(string, JSON_ENCODE_ANY) : NULL;
    fputs(literal ? literal : "\"\"", f);
    free(literal);
    json_decref(string);
    free(valid);
}

void cli_json_u64_or_null(FILE *f, int known, uint64_t value)
{
    if (known)
        fprintf(f, "%llu", (unsigned long long)value);
    else
        fprintf(f, "null");
}

json_t *cli_json_parse(const char *text, char *err, size_t errsize)
{
    json_error_t error;
    json_t *root = json_loads(text, 0, &error);
    if (!root)
        snprintf(err, errsize, "line %d, column %d: %s", error.line, error.column, error.text);
    return root;
}

json_t *cli_json_at(const json_t *object, const char *path)
{
    char key[128];
    json_t *value = (json_t *)object;
    while (value && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof key)
            return NULL;
        memcpy(key, path, n);
        key[n] = '\0';
        value = json_object_get(value, key); /* NULL when value is not an object */
        path += n + (dot ? 1 : 0);
    }
    return value;
}

uint64_t cli_json_u64(const json_t *object, const char *path, uint64_t fallback)
{
    const json_t *v = cli_json_at(object, path);
    if (json_is_integer(v))
        return json_integer_value(v) <= 0 ? 0 : (uint64_t)json_integer_value(v);
    if (!json_is_real(v))
        return fallback;
    double d = json_real_value(v);
    if (d <= 0)
        return 0;
    return d >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)d;
}

double cli_json_double(const json_t *object, const char *path, double fallback)
{
    const json_t *v = cli_json_at(object, path);
    return json_is_number(v) ? json_number_value(v) : fallback;
}

const char *cli_json_str(const json_t *object, const char *path, const char *fallback)
{
    const json_t *v = cli_json_at(object, path);
    return json_is_string(v) ? json_string_value(v) : fallback;
}

int cli_split_csv(char *line, char **fields, int max)
{
    int n = 0;
    for (char *start = line;;) {
        char *comma = strchr(start, ',');
        if (comma)
            *comma = '\0';
        while (isspace((unsigned char)*start))
            start++;
        char *end = start + strlen(start);
        while (end > start && isspace((unsigned char)end[-1]))
            *--end = '\0';
        if (n == max)
            return -1;
        fields[n++] = start;
        if (!comma)
            return n;
        start = comma + 1;
    }
}

int cli_csv_columns(char *const *fields, int count, const char *const *names, int name_count, int *column)
{
    for (int f = 0; f < count; f++)
        for (int c = 0; c < name_count; c++)
            if (!strcasecmp(fields[f], names[c]) && column[c] < 0)
                column[c] = f;
    int needed = 0;
    for (int c = 0; c < name_count; c++)
        if (column[c] + 1 > needed)
            needed = column[c] + 1;
    return needed;
}

int cli_read_file(const char *path, char **text, size_t *length)
{
    /* zlib would open a directory and fail at the first read ("broken gzip data") */
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        errno = EISDIR;
        return -1;
    }
    /* zlib reads plain files as they are and gzip files decompressed */
    gzFile f = gzopen(path, "rb");
    if (!f)
        return -1;
    gzbuffer(f, 1 << 17);
    size_t capacity = 1 << 16, used = 0;
    char *buf = malloc(capacity);
    int read_error = 0;
    while (buf) {
        size_t room = capacity - used - 1;
        int n = gzread(f, buf + used, room > (1u << 30) ? (1u << 30) : (unsigned)room);
        if (n < 0) {
            int zerr = 0;
            const char *why = gzerror(f, &zerr);
            fprintf(stderr, "poolshim: error: %s: broken gzip data (zlib: %s)\n", path, why ? why : "?");
            read_error = 1;
            break;
        }
        used += (size_t)n;
        if (used + 1 < capacity)
            break;
        char *bigger = realloc(buf, capacity * 2);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        capacity *= 2;
    }
    int failed = read_error || !buf;
    gzclose(f);
    if (failed) {
        errno = read_error ? EIO : ENOMEM;
        free(buf);
        return -1;
    }
    buf[used] = '\0';
    *text = buf;
    if (length)
        *length = used;
    return 0;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double cli_median(double *values, size_t n)
{
    if (n == 0)
        return 0;
    qsort(values, n, sizeof *values, compare_doubles);
    return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

void cli_remove_directory(const char *path)
{
    DIR *dir = opendir(path);
    if (!dir)
        return;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (!strcmp(entry->d_name, ".") || !strcmp(entry->d_name, ".."))
            continue;
        char file[PATH_MAX + 256];
        snprintf(file, sizeof file, "%s/%s", path, entry->d_name);
        unlink(file);
    }
    closedir(dir);
    rmdir(path);
}
