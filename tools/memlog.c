/* Reader of RMM-format allocation logs (see memlog.h).
 *
 * Algorithm:
 *   1. The first non-empty line is the header: split on commas, trim, and
 *      map the known column names (case-insensitive) to their positions.
 *   2. Every later non-empty line is split the same way; it must have at
 *      least as many fields as the highest required column; each field is
 *      parsed strictly (the whole field must be a number / known action).
 *   3. Times become seconds since the first event.
 * Guarantees: the first bad line stops reading with "FILE:LINE: what is
 * wrong" (a truncated last line is such a line); memory is freed on error;
 * no input, however broken, makes it read out of bounds.
 */
#include "memlog.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

#define MEMLOG_MAX_FIELDS 32

enum { COL_THREAD, COL_TIME, COL_ACTION, COL_POINTER, COL_SIZE, COL_STREAM, COL_DEVICE, COL_COUNT };
static const char *const column_names[COL_COUNT] = {"Thread", "Time", "Action", "Pointer",
                                                    "Size", "Stream", "Device"};

/* Decimal or 0x-hex, the whole field. */
static int parse_number(const char *text, uint64_t *out)
{
    if (!*text || *text == '-' || *text == '+')
        return -1;
    errno = 0;
    char *end;
    int hex = text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
    unsigned long long v = strtoull(text, &end, hex ? 16 : 10);
    if (errno || *end || (hex && !text[2]))
        return -1;
    *out = v;
    return 0;
}

/* HH:MM:SS.ffffff, HH:MM:SS:ffffff or plain seconds. */
static int parse_time(const char *text, double *seconds)
{
    unsigned hours, minutes, secs;
    char separator;
    int consumed = 0;
    if (sscanf(text, "%2u:%2u:%2u%c%n", &hours, &minutes, &secs, &separator, &consumed) == 4 &&
        (separator == '.' || separator == ':') && hours < 24 && minutes < 60 && secs < 61) {
        const char *fraction = text + consumed;
        size_t digits = strspn(fraction, "0123456789");
        if (digits == 0 || digits > 9 || fraction[digits])
            return -1;
        double f = strtod(fraction, NULL);
        for (size_t i = 0; i < digits; i++)
            f /= 10;
        *seconds = hours * 3600.0 + minutes * 60.0 + secs + f;
        return 0;
    }
    if (sscanf(text, "%2u:%2u:%2u%n", &hours, &minutes, &secs, &consumed) == 3 && !text[consumed] &&
        hours < 24 && minutes < 60 && secs < 61) {
        *seconds = hours * 3600.0 + minutes * 60.0 + secs;
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || v < 0)
        return -1;
    *seconds = v;
    return 0;
}

static int parse_action(const char *text, memlog_action_t *out)
{
    if (!strcasecmp(text, "allocate"))
        *out = MEMLOG_ALLOCATE;
    else if (!strcasecmp(text, "free"))
        *out = MEMLOG_FREE;
    else if (!strcasecmp(text, "allocate failure") || !strcasecmp(text, "allocate_failure"))
        *out = MEMLOG_ALLOCATE_FAILURE;
    else
        return -1;
    return 0;
}

static int bad_line(const char *name, unsigned line, const char *what, const char *field)
{
    if (field)
        fprintf(stderr, "poolshim: error: %s:%u: %s: '%.60s'\n", name, line, what, field);
    else
        fprintf(stderr, "poolshim: error: %s:%u: %s\n", name, line, what);
    return -1;
}

void memlog_free(memlog_t *log)
{
    if (!log)
        return;
    free(log->events);
    memset(log, 0, sizeof *log);
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* One data line's fields into *e (its time as logged); -1 (said) at the
 * first field that does not parse. */
static int parse_event(char **fields, const int *column, const char *name, unsigned line_number, memlog_event_t *e)
{
    memset(e, 0, sizeof *e);
    e->line = line_number;
    uint64_t device = 0;
    if (parse_action(fields[column[COL_ACTION]], &e->action) != 0)
        return bad_line(name, line_number, "unknown action (allocate, free, allocate failure)",
                        fields[column[COL_ACTION]]);
    if (parse_number(fields[column[COL_POINTER]], &e->pointer) != 0 || e->pointer >= UINT64_MAX - 1)
        return bad_line(name, line_number, "bad pointer", fields[column[COL_POINTER]]);
    if (parse_number(fields[column[COL_SIZE]], &e->size) != 0)
        return bad_line(name, line_number, "bad size", fields[column[COL_SIZE]]);
    if (column[COL_STREAM] >= 0 && parse_number(fields[column[COL_STREAM]], &e->stream) != 0)
        return bad_line(name, line_number, "bad stream", fields[column[COL_STREAM]]);
    if (column[COL_THREAD] >= 0 && parse_number(fields[column[COL_THREAD]], &e->thread) != 0)
        return bad_line(name, line_number, "bad thread id", fields[column[COL_THREAD]]);
    if (column[COL_DEVICE] >= 0 && (parse_number(fields[column[COL_DEVICE]], &device) != 0 || device > 1023))
        return bad_line(name, line_number, "bad device", fields[column[COL_DEVICE]]);
    if (column[COL_TIME] >= 0 && parse_time(fields[column[COL_TIME]], &e->time_s) != 0)
        return bad_line(name, line_number, "bad time (HH:MM:SS.ffffff)", fields[column[COL_TIME]]);
    e->device = (int)device;
    return 0;
}

/* Appends `e` (its device joins the log's list); -1 (said) past 64
 * devices or out of memory. */
static int append_event(memlog_t *log, const memlog_event_t *e, size_t *capacity, const char *name)
{
    int known = 0;
    for (int d = 0; d < log->device_count; d++)
        known |= log->devices[d] == e->device;
    if (!known) {
        if (log->device_count == (int)(sizeof log->devices / sizeof log->devices[0]))
            return bad_line(name, e->line, "more than 64 devices", NULL);
        log->devices[log->device_count++] = e->device;
    }
    if (log->count == *capacity) {
        size_t grown = *capacity ? *capacity * 2 : 1024;
        memlog_event_t *events = realloc(log->events, grown * sizeof *events);
        if (!events)
            return bad_line(name, e->line, "out of memory", NULL);
        log->events = events;
        *capacity = grown;
    }
    log->events[log->count++] = *e;
    return 0;
}

/* The distinct threads of the log (left 0 when out of memory). */
static void count_threads(memlog_t *log)
{
    uint64_t *ids = log->count ? malloc(log->count * sizeof *ids) : NULL;
    if (!ids)
        return;
    for (size_t i = 0; i < log->count; i++)
        ids[i] = log->events[i].thread;
    qsort(ids, log->count, sizeof *ids, compare_u64);
    log->threads = 1;
    for (size_t i = 1; i < log->count; i++)
        log->threads += ids[i] != ids[i - 1];
    free(ids);
}

int memlog_parse(const char *text, size_t length, const char *name, memlog_t *out)
{
    memlog_t log;
    memset(&log, 0, sizeof log);
    int column[COL_COUNT];
    for (int i = 0; i < COL_COUNT; i++)
        column[i] = -1;
    int needed_fields = 0; /* fields a data line must have */
    int have_header = 0;
    size_t capacity = 0;
    double first_time = 0, day_offset = 0, previous_time = 0;
    char *line = NULL;
    unsigned line_number = 0;
    const char *at = text, *end = text + length;
    int status = 0;

    while (at < end && status == 0) {
        const char *newline = memchr(at, '\n', (size_t)(end - at));
        size_t n = newline ? (size_t)(newline - at) : (size_t)(end - at);
        line_number++;
        free(line);
        line = malloc(n + 1);
        if (!line) {
            status = bad_line(name, line_number, "out of memory", NULL);
            break;
        }
        memcpy(line, at, n);
        line[n] = '\0';
        at += n + (newline ? 1 : 0);
        if (memchr(line, '\0', n)) {
            status = bad_line(name, line_number, "binary data (NUL byte) in the log", NULL);
            break;
        }
        char *content = line;
        while (isspace((unsigned char)*content))
            content++;
        if (!*content)
            continue;

        char *fields[MEMLOG_MAX_FIELDS];
        int count = cli_split_csv(content, fields, MEMLOG_MAX_FIELDS);
        if (count < 0) {
            status = bad_line(name, line_number, "too many columns", NULL);
            break;
        }
        if (!have_header) {
            needed_fields = cli_csv_columns(fields, count, column_names, COL_COUNT, column);
            if (column[COL_ACTION] < 0 || column[COL_POINTER] < 0 || column[COL_SIZE] < 0) {
                status = bad_line(name, line_number,
                                  "not an allocation log: the header must name the columns "
                                  "Action, Pointer and Size (RMM format: "
                                  "Thread,Time,Action,Pointer,Size,Stream)",
                                  NULL);
                break;
            }
            log.has_time = column[COL_TIME] >= 0;
            have_header = 1;
            continue;
        }
        if (count < needed_fields) {
            char what[96];
            snprintf(what, sizeof what, "%d fields, the header has %d (truncated line?)", count,
                     needed_fields);
            status = bad_line(name, line_number, what, NULL);
            break;
        }
        memlog_event_t e;
        status = parse_event(fields, column, name, line_number, &e);
        if (status != 0)
            break;
        if (log.has_time) {
            if (log.count == 0) {
                first_time = e.time_s;
                log.start_s = e.time_s;
            } else if (e.time_s + day_offset < previous_time - 12 * 3600.0) {
                day_offset += 24 * 3600.0; /* the program ran past midnight */
            }
            e.time_s += day_offset;
            previous_time = e.time_s;
            e.time_s -= first_time;
            if (e.time_s < 0)
                e.time_s = 0; /* threads may log slightly out of order */
        }
        status = append_event(&log, &e, &capacity, name);
    }
    free(line);
    if (status == 0 && !have_header)
        status = bad_line(name, line_number ? line_number : 1, "empty log (no header line)", NULL);
    if (status != 0) {
        memlog_free(&log);
        return -1;
    }
    count_threads(&log);
    *out = log;
    return 0;
}

int memlog_read(const char *path, memlog_t *out)
{
    char *text;
    size_t length;
    if (cli_read_file(path, &text, &length) != 0) {
        if (errno == EISDIR)
            fprintf(stderr, "poolshim: error: %s: is a directory (give a log file)\n", path);
        else
            fprintf(stderr, "poolshim: error: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = memlog_parse(text, length, path, out);
    free(text);
    return rc;
}
