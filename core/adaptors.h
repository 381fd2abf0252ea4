/* Adaptors: resources that wrap another resource (their upstream) and add
 * one behaviour. Each forwards allocate/deallocate/trim to the upstream.
 *   limit  caps bytes outstanding; past it, PS_ENOMEM and one log line
 *   stats  current/peak/total bytes and counts, requested vs reserved
 *          (per-thread counts; peaks within a bound; sampled times)
 *   track  outstanding allocations (size, stream, time, optional call
 *          stack) and a leak report grouped by call site
 *   log    every allocate/free/failure as CSV in RMM's format
 *   guard  red zones after each block, checked at free (debug.guard)
 */
#ifndef PS_ADAPTORS_H
#define PS_ADAPTORS_H

#include <stdio.h>

#include "gpu_ops.h"
#include "resource.h"

/* ---- limit ---- */
int ps_limit_create(const char *name, ps_resource_t *upstream, size_t limit_bytes,
                    ps_resource_t **out);

/* ---- stats ---- */
/* The statistics, as an X-macro: name, meaning. Every counter has current,
 * peak and total where that makes sense. */
#define PS_STATS_COUNTERS(X)                                                  \
    X(bytes_requested, "bytes asked for by the program")                     \
    X(bytes_allocated, "bytes handed out after rounding by the resource")    \
    X(allocations, "live allocations")
typedef struct ps_counter {
    int64_t current; /* now */
    int64_t peak;    /* maximum of current */
    int64_t total;   /* sum of all increments */
} ps_counter_t;
typedef struct ps_stats {
#define PS_STATS_FIELD(name, doc) ps_counter_t name;
    PS_STATS_COUNTERS(PS_STATS_FIELD)
#undef PS_STATS_FIELD
    uint64_t frees;             /* deallocations */
    uint64_t failures;          /* allocations that failed */
    uint64_t alloc_ns;          /* time spent in allocate (estimated from sampled calls) */
    uint64_t free_ns;           /* time spent in deallocate (estimated from sampled calls) */
    ps_resource_info_t upstream;/* what the upstream stack reports (reserved...) */
} ps_stats_t;
/* Each thread counts in its own slot; sums, peaks and the sampled times are
 * explained at the top of core/stats.c. */
int ps_stats_create(const char *name, ps_resource_t *upstream, ps_resource_t **out);
/* Whether stats adaptors read the clock (one call in 64 of each kind and
 * thread) for alloc_ns/free_ns; on by default. The shim turns it off: its
 * router times every call once, for its own report. Process-wide. */
void ps_stats_time_adaptors(int on);
/* Copies the current figures (thread-safe). */
void ps_stats_get(ps_resource_t *stats_adaptor, ps_stats_t *out);
/* Writes the figures of one device as a text table or JSON object. */
void ps_stats_write_text(FILE *f, int device, const ps_stats_t *s);
void ps_stats_write_json(FILE *f, int device, const ps_stats_t *s);

/* ---- track ---- */
/* stack_depth: frames recorded per allocation (0 = none, at most 64).
 * The report names an executable's functions only if it was linked with
 * -rdynamic (dladdr); shared libraries are named either way. */
int ps_track_create(const char *name, ps_resource_t *upstream, unsigned stack_depth,
                    ps_resource_t **out);
/* Writes the leak report (allocations never freed, grouped by call site);
 * returns the number of leaked allocations. Reads memory only. */
size_t ps_track_report(ps_resource_t *track_adaptor, FILE *f);
/* Writes the call stack recorded for the live allocation `ptr` (the
 * program's frames, one a line, as in the report); true, or false when
 * `ptr` is not tracked. */
bool ps_track_write_site(ps_resource_t *track_adaptor, const void *ptr, FILE *f);

/* ---- log ---- */
/* Writes RMM's CSV (header "Thread,Time,Action,Pointer,Size,Stream") to
 * `path`; buffered; flushed at ps_log_flush and destroy. Lines look like
 * "4242,23:41:07.123456,allocate,0x7f3a40000000,1024,0x0"; actions are
 * allocate, free, allocate failure (pointer 0x0); PS_STREAM_NONE is logged
 * as stream 0x0. Returns PS_ECONFIG when the file cannot be opened. */
int ps_log_create(const char *name, ps_resource_t *upstream, const char *path,
                  ps_resource_t **out);
int ps_log_flush(ps_resource_t *log_adaptor);
/* The companion file beside the log, PATH.reserved.csv (header
 * "Time,Action,Bytes,Reserved,Peak"; actions start, grow, release, end):
 * what the stack under the log really held from the device over time,
 * one row per change (core/log.c, docs/cli.md). A companion that cannot be
 * opened is warned about; the log goes on without it. */
#define PS_LOG_RESERVED_SUFFIX ".reserved.csv"
#define PS_LOG_PATH_MAX 4096
/* Writes PATH + PS_LOG_RESERVED_SUFFIX into out; PS_EINVAL when too long. */
int ps_log_reserved_path(const char *log_path, char *out, size_t outsize);

/* ---- guard ---- */
/* The byte every red zone is filled with. */
#define PS_GUARD_BYTE 0xA5
/* `bytes` of red zone after every block, filled with gpu->memset_d8 at
 * allocate and read back with gpu->copy_to_host at free (both required:
 * PS_EUNSUPPORTED otherwise); an overwrite is reported with ps_error, with
 * the allocation site when `track` (a track adaptor below, or NULL) knows
 * the block. Synchronizes at every free (core/guard.c). */
int ps_guard_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu, size_t bytes,
                    ps_resource_t *track, ps_resource_t **out);
typedef struct ps_guard_counts {
    uint64_t checked;     /* frees whose red zone was compared */
    uint64_t overwritten; /* of those, red zones found changed (each reported) */
    uint64_t unchecked;   /* frees whose red zone could not be read back */
} ps_guard_counts_t;
void ps_guard_get(ps_resource_t *guard_adaptor, ps_guard_counts_t *out);

#endif
