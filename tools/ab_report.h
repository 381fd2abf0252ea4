/* Results of `poolshim ab` and their rendering. The rendering is a pure
 * function of an ab_results_t, so it is tested on the CPU from recorded
 * inputs (tests/data/cli/ab_*.json -> ab_*.txt); the same JSON that
 * `ab --json` prints can be read back (ab_results_parse) and re-rendered
 * with `poolshim ab --render FILE`.
 * Return rule: 0 or -1 (message in err).
 */
#ifndef PS_TOOLS_AB_REPORT_H
#define PS_TOOLS_AB_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "stats_table.h"

#define AB_MAX_RUNS 100
#define AB_MAX_VARIANTS 9

/* One run of the command. */
typedef struct ab_run {
    double wall_s;              /* wall time of the whole process */
    int exit_code;              /* its exit code (128+signal when killed) */
    int have_cupti;             /* the CUPTI library wrote its report */
    uint64_t cuda_calls;        /* allocation calls the program made, as CUPTI saw them (allocs + frees) */
    uint64_t cuda_reached;      /* driver-level allocation calls: what really reached CUDA */
    uint64_t cuda_time_ns;      /* time inside them */
    uint64_t cuda_peak_bytes;   /* peak bytes outstanding at CUDA */
    int have_shim;              /* the shim wrote its statistics */
    uint64_t shim_calls;        /* allocation calls the shim intercepted (allocs + frees) */
    uint64_t shim_time_ns;      /* time inside the shim's allocate + free */
    uint64_t requested_peak;    /* peak bytes the program held (shim) */
    uint64_t reserved_peak;     /* peak bytes the shim's stacks reserved */
    uint64_t upstream_calls;    /* upstream allocs + frees of the shim's stacks */
    uint64_t shim_failures;     /* failed allocations seen by the shim */
    stats_job_t processes;      /* the shim's report of each process, in rank order (ab_run_add_process;
                                   freed by ab_results_free) */
} ab_run_t;

/* One configuration: the baseline (no shim) or a shim config. */
typedef struct ab_variant {
    char name[64];              /* "baseline", "default" or the config's base name */
    char config[1024];          /* config path ("" for baseline and default) */
    int is_baseline;            /* 1: the program ran without the shim */
    size_t run_count;           /* entries in runs */
    ab_run_t runs[AB_MAX_RUNS]; /* in the order they ran */
} ab_variant_t;

typedef struct ab_results {
    char command[2048];                   /* the command line, shell-quoted for display */
    size_t variant_count;                 /* entries in variants; variants[0] is the baseline */
    ab_variant_t variants[AB_MAX_VARIANTS];
} ab_results_t;

/* Medians over the runs of one variant (what the table shows). */
typedef struct ab_summary {
    double wall_median, wall_min, wall_max; /* seconds */
    int have_calls;             /* calls/time are known */
    double calls;               /* allocation calls the program made */
    double alloc_time_s;        /* time inside allocation calls */
    double share;               /* alloc_time_s / wall_median */
    int have_cuda;              /* CUPTI counted calls reaching CUDA */
    double cuda_calls;          /* calls that reached CUDA */
    int have_peak;              /* peak memory is known */
    double peak_reserved;       /* bytes */
    size_t failed_runs;         /* runs whose exit code was not 0 */
} ab_summary_t;

void ab_summarize(const ab_variant_t *variant, ab_summary_t *out);

/* Medians over the runs of one process of a variant (its i-th in rank order
 * in every run that had more than i), or of the runs' totals. */
typedef struct ab_process_summary {
    long rank;                  /* the launcher's rank (from the first run), -1 when unknown or the total */
    long pid;                   /* the process id in the first run, -1 when unknown or the total */
    double calls;               /* allocation calls the shim intercepted */
    double time_s;              /* time inside the shim's allocate + free */
    double requested_peak;      /* peak bytes the program held (a sum of peaks in the total) */
    double reserved_peak;       /* peak bytes the stacks reserved (a sum of peaks in the total) */
} ab_process_summary_t;

/* The most processes one run of the variant had (0: no shim report). */
size_t ab_variant_process_count(const ab_variant_t *variant);
/* Fills rows[0 .. ab_variant_process_count) and the total (peaks summed
 * over the processes, as stats_job_total does); returns the row count. */
size_t ab_summarize_processes(const ab_variant_t *variant, ab_process_summary_t *rows,
                              ab_process_summary_t *total);

/* The table a person pastes into a bug report. */
void ab_print_table(FILE *f, const ab_results_t *results);
/* Everything, for scripts (readable by ab_results_parse). */
void ab_print_json(FILE *f, const ab_results_t *results);

/* Reads `ab --json` output (free with ab_results_free). */
int ab_results_parse(const char *text, ab_results_t *out, char *err, size_t errsize);

/* Add to a run the shim's exit statistics (POOLSHIM_STATS=json) or the
 * CUPTI library's report of one process (a run may have several
 * processes: counts and times add up, peaks add up to an upper bound);
 * 0, or -1 when the document is not one (run unchanged). */
int ab_run_add_shim_stats(ab_run_t *run, const json_t *stats);
int ab_run_add_cupti_report(ab_run_t *run, const json_t *report);
/* Adds one process (read by stats_table.c) to a run's sums and keeps it in
 * run->processes (kept in rank order); -1 when out of memory. */
int ab_run_add_process(ab_run_t *run, const stats_process_t *process);

/* Frees what the runs hold (their processes), not the struct itself. */
void ab_results_free(ab_results_t *results);

#endif
