/* Allocation logs in RMM's CSV format, as written by RMM's
 * logging_resource_adaptor and by poolshim's log adaptor:
 *
 *   Thread,Time,Action,Pointer,Size,Stream
 *   140202,12:31:07.123456,allocate,0x7f3c00000000,1048576,0x0
 *   140202,12:31:07.123502,free,0x7f3c00000000,1048576,0x0
 *
 * Columns are found by their header name, in any order; extra columns are
 * ignored ("Device" is used when present, see below). Required: Action,
 * Pointer, Size. Actions: allocate, free, "allocate failure" (also
 * allocate_failure). Numbers are decimal or 0x-hex. Time is HH:MM:SS.ffffff
 * (or HH:MM:SS:ffffff, RMM's log_parser reading, or plain seconds);
 * a time that goes backwards by more than 12 h is taken as midnight passed.
 * Return rule: 0, or -1 after printing "poolshim: error: FILE:LINE: what".
 */
#ifndef PS_TOOLS_MEMLOG_H
#define PS_TOOLS_MEMLOG_H

#include <stddef.h>
#include <stdint.h>

typedef enum { MEMLOG_ALLOCATE, MEMLOG_FREE, MEMLOG_ALLOCATE_FAILURE } memlog_action_t;

typedef struct memlog_event {
    memlog_action_t action; /* what happened */
    uint64_t pointer;       /* the logged (original) pointer */
    uint64_t size;          /* bytes (of a free: as logged; replay uses the allocation's) */
    uint64_t stream;        /* logged stream handle (0 when the column is absent) */
    uint64_t thread;        /* logged thread id (0 when absent) */
    double time_s;          /* seconds since the first event (0 when there is no Time column) */
    int device;             /* Device column, else 0 */
    unsigned line;          /* line in the file, for messages */
} memlog_event_t;

typedef struct memlog {
    memlog_event_t *events; /* in file order */
    size_t count;           /* number of events */
    int has_time;           /* the log has a Time column */
    double start_s;         /* time of day of the first event, seconds (0 without a Time column) */
    int devices[64];        /* distinct devices, in order of appearance */
    int device_count;       /* entries in devices */
    size_t threads;         /* distinct thread ids */
} memlog_t;

/* Parses a whole log held in memory; `name` is used in messages. */
int memlog_parse(const char *text, size_t length, const char *name, memlog_t *out);
/* Reads and parses a file. */
int memlog_read(const char *path, memlog_t *out);
void memlog_free(memlog_t *log);

#endif
