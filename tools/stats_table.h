/* The shim's exit statistics of one job, merged: one row per process (per
 * rank under a launcher), a total per node when there are several, and the
 * job's total. Read by `poolshim stats FILE...`,
 * by `poolshim run --stats` (one file per process, %p) and by `poolshim ab`
 * (which adds a run's processes up). The rendering is a pure function of a
 * stats_job_t, so it is tested on the CPU from recorded files
 * (tests/data/cli/stats_*.json).
 * Return rule: 0 or -1 (message in err).
 */
#ifndef PS_TOOLS_STATS_TABLE_H
#define PS_TOOLS_STATS_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

/* One process's report, summed over its devices. */
typedef struct stats_process {
    char file[1024];              /* the file it was read from ("" when none) */
    long rank;                    /* the launcher's rank (report, else file name), -1 when unknown */
    long pid;                     /* the process id, -1 when unknown */
    long local_rank;              /* its rank on its node ("local_rank"), -1 when unknown */
    long node;                    /* its node's index in the job ("node"), -1 when unknown */
    char hostname[64];            /* the node it ran on ("hostname"), "" when unknown (an older report) */
    char job[64];                 /* the Slurm job ("job"), "" when none */
    char step[32];                /* the Slurm step ("step"), "" when none */
    size_t devices;               /* devices in the report */
    uint64_t calls;               /* device allocation + free calls the shim served (both doors) */
    uint64_t time_ns;             /* time inside the shim's allocate + free */
    uint64_t requested_peak;      /* peak bytes the program held, summed over devices */
    uint64_t reserved_peak;       /* peak bytes the stacks reserved, summed over devices */
    uint64_t barriers;            /* GPU-side barriers issued by the stacks */
    uint64_t upstream_calls;      /* upstream allocs + frees of the stacks */
    uint64_t failures;            /* allocations that returned an error */
    int have_cuda_time;           /* the report has "cuda_time" (since 2026-11-25; older ones do not) */
    uint64_t barrier_ns;          /* host time inside the stacks' barriers (cuda_time.barrier) */
    uint64_t vm_ns;               /* ... inside mapping and unmapping pieces (cuda_time.map + unmap) */
    int have_host;                /* pinned host memory was used (calls or reserved bytes) */
    uint64_t host_calls;          /* pinned host allocation + free calls */
    uint64_t host_time_ns;        /* time inside them */
    uint64_t host_requested_peak; /* peak pinned bytes the program held, summed over devices */
    uint64_t host_reserved_peak;  /* peak pinned bytes the host pools reserved, summed */
} stats_process_t;

/* The processes of one job. */
typedef struct stats_job {
    size_t count;                 /* entries in processes */
    size_t capacity;              /* allocated entries */
    stats_process_t *processes;   /* in the order read; stats_job_sort orders them by rank */
} stats_job_t;

/* Fills `out` from one parsed report ({"poolshim": 1, "devices": [...]});
 * -1 when the document is not the shim's statistics. `file` may be NULL. */
int stats_process_from_json(const json_t *stats, const char *file, stats_process_t *out);

/* The rank a file name tells ("stats_rank3.json", "rank-3.json"), or -1. */
long stats_rank_from_file_name(const char *path);

/* Appends a copy of one process (-1: out of memory). */
int stats_job_add(stats_job_t *job, const stats_process_t *p);

/* Reads one statistics file into the job. Errors in err: "PATH: cannot
 * read: why", "PATH:LINE:COLUMN: what" (jansson), "PATH: not poolshim
 * statistics". */
int stats_job_read_file(stats_job_t *job, const char *path, char *err, size_t errsize);

/* Reads every DIR/PREFIX*.json (PREFIX "" for all), in name order. Files
 * that are JSON but not the shim's statistics are skipped when
 * skip_foreign is set (a directory may hold other reports), else errors.
 * *found counts the files read. */
int stats_job_read_directory(stats_job_t *job, const char *directory, const char *prefix, int skip_foreign,
                             size_t *found, char *err, size_t errsize);

/* Orders by node (host names in natural order, "node9" before "node10";
 * unknown last), then rank (known ranks first), then pid, then file name. */
void stats_job_sort(stats_job_t *job);

/* Sums over the processes: counts, times and peaks add up (the summed peak
 * is an upper bound of the job's: processes may peak at different times);
 * rank and pid are -1. */
void stats_job_total(const stats_job_t *job, stats_process_t *total);
/* The same over `count` processes from `first`; the host name is kept when
 * they all share it. */
void stats_sum(const stats_process_t *first, size_t count, stats_process_t *total);
/* Distinct hosts among the processes (an unknown host counts as one). */
size_t stats_job_nodes(const stats_job_t *job);

/* The note printed under a summed total (the table's, and `poolshim ab`'s). */
#define STATS_SUMMED_PEAKS_NOTE \
    "peaks are summed over the processes: what the job held at most (exact when they peaked together)"

/* The table (one row per process, then the total when there are several).
 * Processes of several nodes: a node column, each node's rows followed by
 * that node's total, then the job's total. Call stats_job_sort first. */
void stats_print_table(FILE *f, const stats_job_t *job);
/* The same as JSON: {"poolshim_stats": 1, "processes": [...], "nodes":
 * [{"hostname": H|null, "processes": N, counters...}], "total": {...}}. */
void stats_print_json(FILE *f, const stats_job_t *job);

/* One process as an element of stats_print_json's "processes":
 * {"file": ..., "rank": R|null, "pid": P|null, "local_rank": L|null,
 * "node": N|null, "hostname": H|null, "job": J|null, "step": S|null,
 * "devices": ..., "calls": ...}. */
void stats_print_process_json(FILE *f, const stats_process_t *p);
/* Reads such an element back; -1 when it has no "calls". */
int stats_process_from_row_json(const json_t *row, stats_process_t *out);

void stats_job_free(stats_job_t *job);

#endif
