/* Replay of an allocation log on the real GPU, through the shim's real
 * stack (`poolshim replay LOG` without --simulate).
 *
 * The CLI does not build the shim's stack in-process: it runs itself again
 * as a small replay driver (the hidden subcommand `replay-gpu-driver`)
 * under LD_PRELOAD=libpoolshim.so, exactly as a program runs under
 * `poolshim run`, so every call takes the path a real program's call
 * takes (hooks, router, registry, stack, the real driver below).
 * Return rule: 0, or -1 after printing "poolshim: error: ...".
 */
#ifndef PS_TOOLS_REPLAY_GPU_H
#define PS_TOOLS_REPLAY_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What one GPU replay of one device measured. */
typedef struct replay_gpu_result {
    char stack[128];             /* "default", the config's base name, or "native" */
    int device;                  /* the log's device = the CUDA device replayed on */
    uint64_t allocations;        /* allocate events replayed */
    uint64_t frees;              /* frees replayed */
    uint64_t failures;           /* allocations the device refused */
    unsigned first_failure_line; /* the log line of the first of them */
    uint64_t first_failure_size; /* and its size */
    double alloc_median_ns;      /* per-call times (the driver's clock around each call) */
    double alloc_p99_ns;
    double free_median_ns;
    double free_p99_ns;
    uint64_t peak_requested;     /* the log's allocations that were served */
    int have_shim_stats;         /* the shim wrote its statistics */
    uint64_t shim_reserved_peak; /* then: bytes.reserved_peak of the shim's stack */
    uint64_t device_used_peak;   /* peak of (total - free) from cuMemGetInfo, less what was used at start */
    uint64_t device_total;       /* the device's memory */
    uint64_t gpu_lag_ns;         /* the bound of --gpu-lag (0: no GPU work between calls) */
    uint64_t lag_kernels;        /* spin kernels launched */
    uint64_t lag_waits;          /* host waits that kept the GPU within the bound */
    double gpu_work_s;           /* spin time enqueued (the log's gaps) */
    double wall_s;               /* the replay loop's wall time */
    /* filled by the caller: */
    uint64_t simulated_peak;     /* the same stack's peak reserved on a simulated device */
    int have_recorded;           /* the log's companion exists */
    uint64_t recorded_peak;      /* then: what the recorded program's GPU held */
} replay_gpu_result_t;

/* Replays `log_path`'s events of `device` on the GPU: under the shim with
 * `config` (NULL: the default config; the environment's POOLSHIM_* are
 * cleared so replays are reproducible), or natively (no shim) when
 * `native` is set. `gpu_lag_ns` > 0: before each event a spin kernel of
 * the log's time gap since the previous event runs on the legacy stream,
 * and the host waits whenever the GPU falls more than gpu_lag_ns of log
 * time behind (so the GPU lags as in the recorded program). */
int replay_gpu_run(const char *log_path, const char *config, int native, int device, uint64_t gpu_lag_ns,
                   replay_gpu_result_t *out);

/* True when libcuda.so.1 can be loaded here (nothing is initialised, so a
 * fork stays safe); else 0 after printing "poolshim: error: replay on the
 * GPU: no GPU here (...); replay on a simulated device with --simulate SIZE". */
bool replay_gpu_driver_present(void);

/* The driver (argv: replay-gpu-driver LOG DEVICE GPU_LAG_NS RESULT.json). */
int replay_gpu_driver_main(int argc, char **argv);

/* The PTX of the spin kernel `ps_spin(u64 ns)` (loaded with cuModuleLoadData). */
extern const char replay_gpu_spin_ptx[];

/* Rendering (pure). */
void replay_gpu_print_text(FILE *f, const char *log_name, const replay_gpu_result_t *results, size_t count);
void replay_gpu_print_json(FILE *f, const char *log_name, const replay_gpu_result_t *results, size_t count);

#endif
