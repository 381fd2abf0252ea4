/* Reader of the companion LOG.reserved.csv (see reserved_log.h).
 *
 * Algorithm:
 *   1. Build the companion's name (ps_log_reserved_path, as the writer
 *      does); absent -> 0: the log is read without it.
 *   2. Parse it as CSV with the log reader's rules: the header names the
 *      columns, every later non-empty line must have them all, numbers are
 *      decimal, times HH:MM:SS.ffffff.
 *   3. Each time becomes seconds since the log's first event: time of day
 *      minus log->start_s, plus 24 h when it is more than 12 h before it
 *      (midnight passed), clamped at 0 (the start row precedes the first
 *      event).
 * Guarantees: the first bad line stops with FILE:LINE; memory is freed on
 * error; an old log without a companion reads as before.
 */
#include "reserved_log.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/adaptors.h"
#include "cli.h"

enum { COL_TIME, COL_RESERVED, COL_PEAK, COL_COUNT };
static const char *const column_names[COL_COUNT] = {"Time", "Reserved", "Peak"};
#define RESERVED_MAX_FIELDS 16

static int bad(const char *path, unsigned line, const char *what)
{
    fprintf(stderr, "poolshim: error: %s:%u: %s\n", path, line, what);
    return -1;
}

static int parse_u64(const char *text, uint64_t *out)
{
    if (!isdigit((unsigned char)*text))
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

/* HH:MM:SS.ffffff -> seconds of the day. */
static int parse_time_of_day(const char *text, double *out)
{
    unsigned h, m, s;
    int used = 0;
    if (sscanf(text, "%2u:%2u:%2u%n", &h, &m, &s, &used) != 3 || h > 23 || m > 59 || s > 60)
        return -1;
    double fraction = 0;
    if (text[used] == '.' || text[used] == ':') {
        const char *digits = text + used + 1;
        size_t n = strspn(digits, "0123456789");
        if (!n || n > 9 || digits[n])
            return -1;
        fraction = strtod(digits, NULL);
        for (size_t i = 0; i < n; i++)
            fraction /= 10;
    } else if (text[used]) {
        return -1;
    }
    *out = h * 3600.0 + m * 60.0 + s + fraction;
    return 0;
}

void reserved_log_free(reserved_log_t *r)
{
    if (!r)
        return;
    free(r->points);
    r->points = NULL;
    r->count = 0;
}

int reserved_log_read(const char *log_path, const memlog_t *log, reserved_log_t *out)
{
    memset(out, 0, sizeof *out);
    if (ps_log_reserved_path(log_path, out->path, sizeof out->path) != PS_OK)
        return 0;
    struct stat st;
    if (stat(out->path, &st) != 0)
        return 0; /* step 1: an old log, or one RMM wrote */
    if (!log->has_time || log->device_count > 1) {
        fprintf(stderr, "poolshim: warning: %s: ignored: %s\n", out->path,
                !log->has_time ? "the log has no Time column to line its rows up with"
                               : "the log has several devices (the shim writes one log per device)");
        return 0;
    }
    char *text;
    size_t length;
    if (cli_read_file(out->path, &text, &length) != 0) {
        fprintf(stderr, "poolshim: error: cannot read %s: %s\n", out->path, strerror(errno));
        return -1;
    }
    out->device = log->device_count ? log->devices[0] : 0;
    int column[COL_COUNT] = {-1, -1, -1}, needed = 0, status = 0, have_header = 0;
    size_t capacity = 0;
    unsigned line_number = 0;
    for (char *at = text, *next; at && *at && status == 0; at = next) {
        line_number++;
        next = strchr(at, '\n');
        if (next)
            *next++ = '\0';
        char *fields[RESERVED_MAX_FIELDS];
        char *content = at;
        while (isspace((unsigned char)*content))
            content++;
        if (!*content)
            continue;
        int count = cli_split_csv(content, fields, RESERVED_MAX_FIELDS);
        if (count < 0) {
            status = bad(out->path, line_number, "too many columns");
            break;
        }
        if (!have_header) {
            needed = cli_csv_columns(fields, count, column_names, COL_COUNT, column);
            if (column[COL_TIME] < 0 || column[COL_RESERVED] < 0) {
                status = bad(out->path, line_number, "not a reserved-bytes file: the header must name Time and "
                                                     "Reserved (Time,Action,Bytes,Reserved,Peak)");
                break;
            }
            have_header = 1;
            continue;
        }
        if (count < needed) {
            status = bad(out->path, line_number, "fewer fields than the header names (truncated line?)");
            break;
        }
        double when;
        uint64_t reserved, peak = 0;
        if (parse_time_of_day(fields[column[COL_TIME]], &when) != 0) {
            status = bad(out->path, line_number, "bad time (HH:MM:SS.ffffff)");
        } else if (parse_u64(fields[column[COL_RESERVED]], &reserved) != 0) {
            status = bad(out->path, line_number, "bad Reserved (bytes)");
        } else if (column[COL_PEAK] >= 0 && parse_u64(fields[column[COL_PEAK]], &peak) != 0) {
            status = bad(out->path, line_number, "bad Peak (bytes)");
        }
        if (status != 0)
            break;
        double relative = when - log->start_s;
        if (relative < -12 * 3600.0)
            relative += 24 * 3600.0; /* step 3: midnight passed since the first event */
        if (relative < 0)
            relative = 0;
        if (out->count == capacity) {
            size_t grown = capacity ? capacity * 2 : 256;
            reserved_point_t *points = realloc(out->points, grown * sizeof *points);
            if (!points) {
                status = bad(out->path, line_number, "out of memory");
                break;
            }
            out->points = points;
            capacity = grown;
        }
        out->points[out->count++] = (reserved_point_t){relative, reserved};
        if (reserved > out->peak)
            out->peak = reserved;
        if (peak > out->peak)
            out->peak = peak;
    }
    free(text);
    if (status == 0 && !have_header)
        status = bad(out->path, 1, "empty file (no header line)");
    if (status != 0) {
        reserved_log_free(out);
        return -1;
    }
    return 1;
}
