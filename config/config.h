/* Configuration: embedded defaults < INI file < environment, turned into
 * one validated description, then into a resource stack per device.
 * config/ holds no CUDA: device sizes reach it through the GPU-ops table.
 * The grammar (sections, keys per type, values, variables) is in
 * docs/config.md.
 *
 * Sources, in order of precedence (later wins, key by key):
 *   1. the embedded default (config/default.ini, compiled in): a pool
 *      named `main` on every device;
 *   2. the INI file: ps_config_input_t.file, else $POOLSHIM_CONFIG, else
 *      $XDG_CONFIG_HOME/poolshim/poolshim.ini (or
 *      $HOME/.config/poolshim/poolshim.ini) when it exists. ./poolshim.ini
 *      is NOT read implicitly: the working directory of a program must not
 *      change how its memory is managed;
 *   3. POOLSHIM_OPTIONS="section.key=value,..." (a value with commas is
 *      quoted: resource.b.bins="256,1KiB");
 *   4. the short forms, each one key: POOLSHIM_RESOURCE (type of the
 *      resource [device.*] uses), and the short form of every key whose row
 *      in config/keys.def has one: POOLSHIM_STATS, POOLSHIM_STATS_FILE,
 *      POOLSHIM_LOG (global.log_file: a log adaptor on top of every stack),
 *      POOLSHIM_FREE_SYNC, POOLSHIM_VERBOSE, POOLSHIM_DISABLE,
 *      POOLSHIM_ON_ERROR, POOLSHIM_DECAY_MS; POOLSHIM_NVTX (debug.nvtx),
 *      POOLSHIM_GUARD (debug.guard), POOLSHIM_NVTX_RANGES (debug.nvtx_ranges).
 * Every value remembers where it came from (default / file:line / env var).
 * A later source that changes a resource's `type` drops the keys earlier
 * sources set for it that the new type does not have.
 *
 * Sizes: bytes, or with a unit B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB —
 * ALL binary (1 KB = 1024 B); fractions with a unit ("1.5GiB", rounded
 * down to a byte); where allowed, "50%" of the device's TOTAL memory,
 * resolved when the stack is built (gpu->mem_get_info).
 *
 * Return rule: PS_OK or a negative PS_E* (core/common.h).
 */
#ifndef PS_CONFIG_H
#define PS_CONFIG_H

#include <stdio.h>

#include "../core/gpu_ops.h"
#include "../core/pool.h"
#include "../core/resource.h"

typedef enum { PS_STATS_OFF = 0, PS_STATS_TEXT, PS_STATS_JSON } ps_stats_mode_t;
typedef enum { PS_MEMINFO_POOL = 0, PS_MEMINFO_DEVICE } ps_meminfo_t;
typedef enum { PS_ON_ERROR_EXIT = 0, PS_ON_ERROR_PASSTHROUGH } ps_on_error_t;

#define PS_PATH_MAX 4096

/* [host]: the pinned host memory pool (cudaMallocHost, cudaHostAlloc,
 * cuMemHostAlloc, cuMemAllocHost; freed by cudaFreeHost/cuMemFreeHost).
 * One pool per device, in its primary context, free_sync event with a
 * growth bound (docs/config.md, [host]). */
typedef struct ps_host_config {
    int enable;                    /* 1 (default): pool pinned host memory; 0: pass it through */
    size_t min_chunk;              /* smallest growth step (default 2 MiB) */
    size_t max_chunk;              /* largest growth step unless one request needs more (default 1 GiB) */
    unsigned growth_percent;       /* a growth step is this % of what is reserved (default 0: the request) */
    size_t maximum_size;           /* cap on pinned bytes reserved; 0 (default) = no cap */
    size_t pending_wait_bytes;     /* growth bound: grow while pending <= max(this, */
    unsigned pending_wait_percent; /*   this % of reserved), else host-wait the oldest
                                      fence (defaults 4 MiB and 10) */
    ps_free_sync_t free_sync;      /* event (default) or device; barrier and none are refused */
    uint64_t epoch_wait_us;        /* before growing, poll a just-closed epoch this long (default 50) */
    int release_before_grow;       /* 1 (default): give wholly free slabs back before growing */
    int expandable;                /* -1 (default): one reserved range of host-located cuMemCreate
                                      pieces where the driver can (core/host_vm.h), else slabs;
                                      1: the same, with a warning where it cannot; 0: slabs */
    size_t expandable_piece;       /* expandable: bytes per mapped piece (default 2 MiB) */
    unsigned grow_budget_percent;  /* expandable: before growing, unmap free pieces until reserved
                                      stays within this % of the most bytes in use (default 110) */
    size_t grow_budget_min;        /* expandable: the budget is at least this many bytes, and below it
                                      the pool grows rather than wait and amortizes its fences (one per
                                      several free/alloc pairs of small blocks; default 16 MiB, 0 = none) */
    /* adaptors over the pool (ps_config_build_host_stack), bottom to top */
    size_t limit;                  /* limit adaptor: cap on pinned bytes the program holds; 0 (default) = none */
    int track;                     /* 1: track adaptor (pinned leak report at exit); default 0 */
    unsigned stack_depth;          /* frames the track adaptor records per allocation (0-64, default 0) */
    char log_file[PS_PATH_MAX];    /* log adaptor: RMM-format CSV of pinned allocations ("" = none;
                                      %p, %r, %d expanded) */
} ps_host_config_t;

/* [debug]: checks for finding the program's memory bugs inside the pool
 * (docs/config.md, [debug]). Both off by default; both cost time. */
typedef struct ps_debug_config {
    int nvtx;     /* 1: register chunks as NVTX heaps and blocks as regions (compute-sanitizer) */
    int nvtx_ranges; /* 1: NVTX ranges around growth, maps, barriers, waits and releases */
    size_t guard; /* red-zone bytes after every block, filled at allocate, checked at free; 0 = off */
} ps_debug_config_t;

/* The largest red zone debug.guard accepts. */
#define PS_GUARD_MAX ((size_t)1 << 20)

/* [global]: settings of the whole process. */
typedef struct ps_global_config {
    int verbosity;              /* 0 errors, 1 warnings (default), 2 info, 3 debug */
    ps_stats_mode_t stats;      /* statistics printed at exit */
    char stats_file[PS_PATH_MAX]; /* where they go ("" = stderr); %p and %r expanded */
    char log_file[PS_PATH_MAX]; /* RMM-format CSV event log ("" = none); %p, %r, %d expanded */
    ps_free_sync_t free_sync;   /* policy of cudaFree: barrier (default), event, device, none */
    ps_meminfo_t meminfo;       /* what cudaMemGetInfo reports: pool (default) or device */
    ps_on_error_t on_error;     /* bad config: exit (default) or warn and pass through */
    size_t direct_min_size;     /* requests of at least this many bytes bypass the pool and go
                                   straight to CUDA (IPC-exportable); 0 = never */
    int disable;                /* 1: pure passthrough (POOLSHIM_DISABLE=1) */
    int ipc;                    /* 1 (default): the expandable pool maps memory exportable as file
                                   descriptors, so cudaIpcGetMemHandle works on its blocks (shim/ipc.c) */
    int oom_retry;              /* 1 (default): a CUDA allocation the shim does not serve (cuMemCreate,
                                   cuMemAllocManaged...) that runs out of memory is retried once after the
                                   pool gave its free memory back (shim/oom.c, ps_route_oom_give_back) */
    uint64_t decay_ms;          /* free memory not needed for this long goes back to the device from a
                                   thread of the shim's own (core/pool_decay.c, shim/give_back.c); 0 = off */
    int neighbour_release;      /* 1 (default): an allocation that runs out of memory asks the shimmed
                                   processes of this user on the same GPU to give back free memory
                                   (shim/neighbours.c), then is made once more */
    uint64_t neighbour_wait_ms; /* how long such an allocation waits for the neighbours' answers */
    ps_host_config_t host;      /* [host]: the pinned host pool */
    ps_debug_config_t debug;    /* [debug]: NVTX registration, guard mode */
} ps_global_config_t;

/* Pinned slabs are rounded up to this (host pages are small; cuMemAlloc's
 * 2 MiB would waste up to 2 MiB per slab). */
#define PS_HOST_CHUNK_GRANULE ((size_t)64 * 1024)
/* host.expandable: address space reserved per host range (cuMemAddressReserve:
 * it costs nothing until pieces are mapped; another range is added past it). */
#define PS_HOST_EXPANDABLE_RESERVE ((size_t)256 << 30)

/* The pool options of the pinned host pool described by `host`. */
void ps_host_pool_options(const ps_host_config_t *host, ps_pool_options_t *out);

typedef struct ps_config ps_config_t; /* opaque */

/* Where to read from; NULL fields mean "use the process environment". */
typedef struct ps_config_input {
    const char *file;     /* INI path; NULL = POOLSHIM_CONFIG / default places */
    const char *options;  /* POOLSHIM_OPTIONS text; NULL = getenv */
    char *const *environ; /* environment to read short forms from; NULL = process environ */
    int no_env;           /* 1: ignore the process environment entirely (tests) */
} ps_config_input_t;

/* Loads and validates. Returns PS_OK, or PS_ECONFIG with *out still set so
 * the caller can print every error (ps_config_print_errors). */
int ps_config_load(const ps_config_input_t *in, ps_config_t **out);
void ps_config_free(ps_config_t *cfg);

const ps_global_config_t *ps_config_global(const ps_config_t *cfg);

/* Errors found while loading: count, and all of them printed one a line as
 * "poolshim: error: WHERE: MESSAGE". WHERE is file:line, the environment
 * variable (POOLSHIM_OPTIONS item N), or the file name alone. */
size_t ps_config_error_count(const ps_config_t *cfg);
void ps_config_print_errors(const ps_config_t *cfg, FILE *f);
/* Warnings (not errors): one per POOLSHIM_* variable of the environment that
 * poolshim does not read, naming the closest known one. */
size_t ps_config_warning_count(const ps_config_t *cfg);
const char *ps_config_warning(const ps_config_t *cfg, size_t index);
/* "poolshim: warning: MESSAGE" lines, unless global.verbosity is 0. */
void ps_config_print_warnings(const ps_config_t *cfg, FILE *f);
/* Error `index` as "WHERE: MESSAGE" (no prefix), or NULL past the end. */
const char *ps_config_error(const ps_config_t *cfg, size_t index);
/* The user file that was read, or NULL when none was. */
const char *ps_config_file_path(const ps_config_t *cfg);

/* Prints the effective stack of `device` (-1 = the [device.*] default) as
 * a tree, every value with its origin. */
void ps_config_print(const ps_config_t *cfg, FILE *f, int device);

/* A built stack: the top resource and everything it owns. */
typedef struct ps_stack {
    ps_resource_t *top;       /* allocate/deallocate here */
    ps_resource_t *stats;     /* the stats adaptor, if the stack has one (else NULL) */
    ps_resource_t *track;     /* the track adaptor, if any */
    ps_resource_t *log;       /* the log adaptor, if any */
    ps_resource_t **all;      /* every resource, upstream first, destroyed in reverse */
    size_t count;             /* entries in `all` */
} ps_stack_t;

/* Builds the stack for `device` over `gpu` (sizes in % resolved with
 * gpu->mem_get_info): resources bottom-up, a resource shared by two
 * parents created once; a stats adaptor on top when global.stats != off,
 * then a log adaptor when global.log_file is set (without %d in the name,
 * devices after 0 get ".N" appended). stack->stats/track/log point at the
 * topmost adaptor of that kind. Returns PS_ECONFIG with a message printed
 * when the config cannot be built there, PS_ENOMEM when an initial size
 * cannot be reserved, PS_EUNSUPPORTED when a resource type has no
 * implementation in this build; on failure nothing is left allocated. */
int ps_config_build_stack(const ps_config_t *cfg, int device, const ps_gpu_ops_t *gpu,
                          ps_stack_t **out);
void ps_stack_destroy(ps_stack_t *stack);

/* Builds `device`'s pinned host stack from [host]: a pool (`pool_options`,
 * or NULL for [host]'s own) over host_alloc slabs with `flags`
 * (PS_HOST_ALLOC_*), then the adaptors [host] asks for, bottom to top:
 * limit (`limit`), track (`track`, `stack_depth`), stats (when
 * global.stats != off), log (`log_file`). stack->stats/track/log point at
 * them. PS_ECONFIG (message printed) when the log cannot be opened or the
 * config has errors; PS_ENOMEM; nothing left allocated on failure. */
int ps_config_build_host_stack(const ps_config_t *cfg, int device, const ps_gpu_ops_t *gpu, unsigned flags,
                               const ps_pool_options_t *pool_options, ps_stack_t **out);

/* ---- value parsers (also used by the tools) ---- */
/* "4096", "64KiB", "1.5G", "2 MiB" -> bytes. "50%" -> *percent = 50 and
 * *bytes untouched when percent != NULL. PS_EINVAL on malformed input. */
int ps_parse_size(const char *text, size_t *bytes, double *percent);
int ps_parse_bool(const char *text, int *value);
/* What every boolean accepts, in the words of its errors. */
#define PS_BOOL_EXPECTED "1/0, true/false, yes/no or on/off"
/* A boolean environment variable read before the configuration (from a
 * constructor: no allocation). Unset or empty: *value = 0, PS_OK. One of
 * the spellings ps_parse_bool takes: PS_OK. Anything else: *value = 0,
 * PS_EINVAL, and, when `report` is set, one error line
 * "poolshim: error: NAME=VALUE: expected 1/0, true/false, yes/no or on/off". */
int ps_env_bool(const char *name, int report, int *value);
/* Expands %p (pid), %r (rank from RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID,
 * PMI_RANK, LOCAL_RANK; "0" if none), %j (Slurm job, "0" if none), %s
 * (Slurm step, "0" if none), %h (ps_job_place's host), %d (device, when
 * device >= 0), %% . */
int ps_expand_path(const char *pattern, int device, char *out, size_t outsize);
/* The process's rank as the launcher set it (the first non-empty of the
 * variables %r reads), or NULL when none is set. */
const char *ps_env_rank(void);

/* Where the process runs in its job, as the launchers' variables say; ""
 * where none is set. Each is a safe word of a file name (letters, digits,
 * '.', '_', '+', '-'; any other byte '_'). */
typedef struct ps_job_place {
    char rank[24];       /* %r: RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID, PMI_RANK, LOCAL_RANK */
    char local_rank[24]; /* LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID */
    char node[24];       /* the node's index in the job: GROUP_RANK (torchrun), SLURM_NODEID */
    char job[64];        /* %j: SLURM_JOB_ID */
    char step[32];       /* %s: SLURM_STEP_ID; "batch" in a Slurm job without one (its batch script) */
    char host[64];       /* %h: SLURMD_NODENAME, else the host name up to its first dot (never "") */
} ps_job_place_t;
/* Fills `out` from the environment; no allocation. */
void ps_job_place(ps_job_place_t *out);

#endif
