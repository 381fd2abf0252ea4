/* The companion file of an allocation log, LOG.reserved.csv, written by the
 * shim's log adaptor (core/log.c): what the stack really held from the
 * device over time, one row per change:
 *
 *   Time,Action,Bytes,Reserved,Peak
 *   23:41:07.123456,grow,8388608,8388608,8388608
 *
 * Actions start, grow, release, end; Reserved the bytes held after the
 * change, Peak the stack's peak so far. Columns are found by header name
 * (Time and Reserved required, Peak optional).
 * Return rule: 1 (read), 0 (no companion file: an old log, or one not
 * written by the shim), -1 after printing "poolshim: error: FILE:LINE: what".
 */
#ifndef PS_TOOLS_RESERVED_LOG_H
#define PS_TOOLS_RESERVED_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "memlog.h"

/* One recorded level. */
typedef struct reserved_point {
    double time_s;     /* seconds since the log's first event (clamped at 0) */
    uint64_t reserved; /* bytes held from the device after this row */
} reserved_point_t;

typedef struct reserved_log {
    char path[4096];          /* the companion file read */
    reserved_point_t *points; /* in file order */
    size_t count;             /* entries in points */
    uint64_t peak;            /* highest Reserved or Peak of any row */
    int device;               /* the log's device the rows belong to */
} reserved_log_t;

/* Reads LOG_PATH.reserved.csv when it exists and lines its times up with
 * `log` (whose start_s is the first event's time of day; a row more than
 * 12 h before it is taken as after midnight). The rows belong to the log's
 * only device: a log with several devices, or without a Time column, has
 * its companion ignored with a warning (returns 0). */
int reserved_log_read(const char *log_path, const memlog_t *log, reserved_log_t *out);
void reserved_log_free(reserved_log_t *r);

#endif
