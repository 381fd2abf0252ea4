/* Replaying an allocation log against a resource, and rendering results.
 * Return rule: 0 or -1 (out of memory); refusals by the stack are counted
 * as failures, not returned.
 */
#ifndef PS_TOOLS_REPLAY_H
#define PS_TOOLS_REPLAY_H

#include <stdio.h>

#include "../core/gpu_ops.h"
#include "../core/pool.h"
#include "../core/resource.h"
#include "memlog.h"

/* One point of memory over time (after an event). */
typedef struct replay_sample {
    double time_s;      /* log time of the event (or its index when the log has no times) */
    uint64_t requested; /* bytes the program had allocated */
    uint64_t reserved;  /* bytes the stack held from the device (0 when no stack) */
} replay_sample_t;

/* What one replay measured. */
typedef struct replay_stats {
    char stack[128];              /* stack name ("default", config base name, or "" when none) */
    int device;                   /* device whose events were replayed */
    uint64_t events;              /* events of this device in the log */
    uint64_t allocations;         /* allocate events replayed */
    uint64_t frees;               /* free events replayed */
    uint64_t failures;            /* allocations the stack refused (not in the requested bytes) */
    unsigned first_failure_line;  /* the log line of the first of them */
    uint64_t first_failure_size;  /* and its size */
    uint64_t logged_failures;     /* "allocate failure" lines (not replayed) */
    uint64_t unknown_frees;       /* frees of pointers not live in the log (skipped) */
    uint64_t double_allocations;  /* allocations of a pointer still live in the log */
    unsigned first_problem_line;  /* line of the first unknown free / double allocation */
    uint64_t alloc_ns;            /* time inside allocate calls */
    uint64_t free_ns;             /* time inside deallocate calls */
    uint64_t peak_requested;      /* max bytes live: the log's allocations the stack served */
    uint64_t peak_reserved;       /* max bytes the stack reserved */
    uint64_t free_at_peak;        /* reserved - in use when requested peaked */
    uint64_t largest_free_at_peak;/* largest free block then */
    double fragmentation;         /* 1 - largest_free / free at the requested peak */
    ps_resource_info_t counters;  /* the stack's counters after the last event (core/resource.h):
                                     upstream allocations, barriers, remaps... */
    uint64_t upstream_allocs_quarters[4]; /* upstream allocations during each quarter of the device's
                                     events: a loop that settled makes none after its warm-up (an
                                     expandable pool's are piece maps) */
    uint64_t wait_ns;             /* simulated host time in those waits (with a GPU lag) */
    uint64_t wait_as_sync_ns;     /* what device synchronizes at those moments would have taken */
    uint64_t sync_ns;             /* simulated host time in device synchronizes */
    uint64_t device_syncs;        /* device synchronizes the stack made (simulated device only) */
    int has_layout;               /* breakdown asked and the stack holds a pool: at_peak is set */
    ps_pool_layout_t at_peak;     /* the pool's layout when reserved last reached its peak */
    double duration_s;            /* log time from the first to the last event */
    int has_recorded;             /* the log's companion (LOG.reserved.csv) covers this device */
    uint64_t recorded_peak_reserved; /* then: the peak the recorded program's GPU really held */
    replay_sample_t *samples;     /* memory over time (when asked), one per event */
    size_t sample_count;          /* entries in samples */
    uint32_t *alloc_call_ns;      /* when asked (call_times): each timed allocate, ns (saturated) */
    uint32_t *free_call_ns;       /* ... and each timed free; allocations / frees entries */
} replay_stats_t;

/* What a replay does besides calling the stack (replay_run_with). */
typedef struct replay_options {
    ps_gpu_ops_t *sim_gpu;   /* the simulated device under the stack, or NULL (see replay_run) */
    int want_samples;        /* keep memory over time in samples */
    int call_times;          /* keep every call's time in alloc_call_ns / free_call_ns */
    int breakdown;           /* take the pool's layout (ps_pool_layout) at each new peak reserved */
    int threads;             /* make each logged thread's calls on a host thread of its own, one at a
                                time in log order (a baton: per-thread arenas and caches see the
                                program's threads); 0: every call on the calling thread */
    /* Called before each event of the device, outside the timed calls (the
     * GPU replay launches its lag kernels and samples device memory here);
     * may be NULL. */
    void (*before_event)(void *context, const memlog_event_t *event);
    void *context;           /* passed to before_event */
} replay_options_t;

/* Replays the events of `device` in log order on one thread, mapping
 * logged pointers to replayed ones. `top` may be NULL: then only the
 * log's own figures (requested) are computed. `sim_gpu`, when not NULL,
 * is the simulated device (tools/sim/fake_gpu.h) under `top`: before each event
 * its clock is moved to the event's log time (ns since the first event),
 * so a lagging simulated GPU completes fences in the log's time. */
int replay_run(const memlog_t *log, int device, ps_resource_t *top, ps_gpu_ops_t *sim_gpu,
               int want_samples, replay_stats_t *out);
/* The same with every option (replay_run is replay_run_with with sim_gpu
 * and want_samples only). */
int replay_run_with(const memlog_t *log, int device, ps_resource_t *top, const replay_options_t *options,
                    replay_stats_t *out);
/* The q-quantile (0..1, nearest rank) of n call times; 0 when n is 0.
 * `values` is reordered. */
double replay_quantile_ns(uint32_t *values, size_t n, double q);
void replay_stats_free(replay_stats_t *stats);

/* Renders results (pure: output depends only on the arguments).
 * `gpu_lag_ns` is the simulated GPU's lag (0: fences complete at once),
 * `busy_streams` the busy streams each simulated barrier joined (0: none).
 * When any result has_recorded, the table gains a "recorded peak" column
 * (what the program's GPU really held, beside the simulated peak) and the
 * JSON a "recorded_peak_reserved" (null where unknown). */
void replay_print_text(FILE *f, const char *log_name, const memlog_t *log, uint64_t capacity,
                       uint64_t gpu_lag_ns, unsigned busy_streams, const replay_stats_t *results, size_t count);
/* One "FAILED: device D, stack S: N allocations refused, the first at line
 * L (SIZE); ..." line per result whose stack refused an allocation the log
 * says was served; returns how many results had one. */
size_t replay_print_failures(FILE *f, const replay_stats_t *results, size_t count);
/* Opens result `index` of a replay's JSON "results" list, as both replays
 * (this one and replay_gpu.h's) write it: a comma from the second on, then
 * `{"device": D, "stack": "S"`; the caller writes the rest and the '}'. */
void replay_json_result_open(FILE *f, size_t index, int device, const char *stack);
void replay_print_json(FILE *f, const char *log_name, const memlog_t *log, uint64_t capacity,
                       uint64_t gpu_lag_ns, unsigned busy_streams, const replay_stats_t *results, size_t count);


/* ---- tools/cmd_plot.c ---- */
/* Draws memory over time of `log` to an SVG at `path`: requested bytes per
 * device from the log, and reserved bytes from a replay over the stack of
 * `config` (NULL = default) on a simulated device of `capacity` bytes whose
 * GPU lags by `gpu_lag_ns` (named in the title and subtitle when > 0). When
 * that stack cannot be built the chart shows requested bytes only and says
 * so. `recorded` (NULL: none), the log's companion (tools/reserved_log.h),
 * adds the curve of what the recorded program's GPU really held. Returns 0
 * or -1. */
struct reserved_log;
int replay_plot(const memlog_t *log, const char *log_name, const char *config, uint64_t capacity,
                uint64_t gpu_lag_ns, const struct reserved_log *recorded, const char *title, const char *path);

#endif
