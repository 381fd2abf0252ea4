/* poolshim replay: replays an allocation log against one or more stacks.
 *
 * Algorithm:
 *   1. Read and check the whole log first (a bad line stops here with
 *      FILE:LINE, before any stack is built).
 *   2. For each stack (each --config, or the default) and each device of
 *      the log: build the stack over a fresh simulated device of --simulate
 *      bytes, replay that device's events in log order on one thread
 *      (tools/replay.c), destroy the stack.
 *   3. Print a table (or --json), optionally a memory-over-time plot.
 *   4. Exit 1 when a stack refused an allocation the log says was served:
 *      the replay did not reproduce the program (a "FAILED:" line in the
 *      table, "failures" in the JSON, one line on stderr).
 * --gpu-lag makes the simulated GPU lag the host: a fence completes that
 * long after it was recorded, in the log's time (the replay moves the
 * device's clock to each event's timestamp), so the cost of a free policy
 * that waits for fences (free_sync = event) shows as growth.
 * Without --simulate the log is replayed on the real GPU (tools/replay_gpu.c):
 * for each stack and device, this executable runs again as a replay driver
 * under LD_PRELOAD=libpoolshim.so, times every call, and reports per-call
 * medians and p99, the shim's real peak reserved and the device's used
 * memory, beside the same stack's simulated peak (replayed here on a
 * simulated device of the GPU's size) and the recorded peak (the log's
 * companion). --native adds a row without the shim. --gpu-lag there runs
 * a spin kernel of the log's time gaps before each call and keeps the GPU
 * at most that far behind. Where there is no GPU it stops with "no GPU here".
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../config/config.h"
#include "sim/fake_gpu.h"
#include "cli.h"
#include "replay.h"
#include "replay_gpu.h"
#include "reserved_log.h"
#include "sim_stack.h"

#define REPLAY_MAX_CONFIGS 16
#define REPLAY_DEFAULT_DEVICE (80ull << 30) /* `--simulate LOG` without a size: an 80 GiB device */

static const char replay_usage[] =
    "usage: poolshim replay LOG.csv [--simulate SIZE] [options]\n"
    "\n"
    "Replays an allocation log (RMM CSV format: Thread,Time,Action,Pointer,Size,Stream,\n"
    "as written by POOLSHIM_LOG or RMM's logging_resource_adaptor; gzip is read as is)\n"
    "against resource stacks, in log order on one thread, and reports time per operation,\n"
    "peak reserved vs peak requested, fragmentation at the peak and failures.\n"
    "Without --simulate: on the real GPU, through the shim (per-call median and p99,\n"
    "the shim's peak reserved and the device's used memory beside the simulated peak).\n"
    "\n"
    "options:\n"
    "  -c, --config FILE    stack to replay against (repeatable; default: the built-in\n"
    "                       default config)\n"
    "  -s, --simulate SIZE  replay on a simulated device of SIZE bytes (e.g. 80GiB):\n"
    "                       nothing is allocated, works anywhere; `--simulate LOG` (no\n"
    "                       size) takes an 80 GiB device\n"
    "  -g, --gpu-lag TIME   the GPU lags the host by TIME (e.g. 5ms, 200us), in the log's\n"
    "                       time (needs its Time column). Simulated: a fence completes\n"
    "                       TIME after it was recorded. On the GPU: a spin kernel of the\n"
    "                       log's time gap runs before each call and the host waits when\n"
    "                       the GPU is more than TIME behind. Default 0: no lag\n"
    "  -n, --native         on the GPU: also replay without the shim (cuMemAlloc/cuMemFree)\n"
    "  -j, --json           print JSON instead of the table\n"
    "  -T, --threads        simulated: make each logged thread's calls on a host thread of\n"
    "                       its own, one at a time in log order (threads take turns, as\n"
    "                       PyTorch's main and autograd threads do), so per-thread arenas\n"
    "                       and caches show in the peaks; default: all calls on one thread\n"
    "  -b, --breakdown      simulated: where the pool's reserved bytes were at the peak\n"
    "                       (in use, ready free, pending, free in whole pieces...) and\n"
    "                       barriers and device synchronizes per 1000 allocations\n"
    "  -J, --busy-streams N simulated: every barrier joins N busy streams, as on a GPU where\n"
    "                       the program's non-blocking streams have work in flight (the\n"
    "                       PyTorch conv-net process: 32); its barriers then wait for the\n"
    "                       share of the reserve (barrier_pending_percent) as there. Default\n"
    "                       0: barriers join nothing (quiet)\n"
    "  -p, --plot FILE      also write memory over time as SVG (first stack)\n"
    "  -t, --title TEXT     title of the plot\n"
    "  -h, --help           this text\n";

/* Step 4: exit status 1 when a stack refused an allocation the log says was
 * served (the table, or the JSON, says which and where first), with one line
 * on stderr so that a script's log shows why. */
static int refused(const replay_stats_t *results, size_t count)
{
    uint64_t failures = 0;
    for (size_t i = 0; i < count; i++)
        failures += results[i].failures;
    if (!failures)
        return CLI_EXIT_OK;
    fprintf(stderr, "poolshim: replay: %llu allocation%s of the log failed in the replay (exit status 1)\n",
            (unsigned long long)failures, failures == 1 ? "" : "s");
    return CLI_EXIT_FAILURE;
}

/* The simulated peak reserved of one stack on a device of `capacity` bytes
 * (0 when it cannot be built). */
static uint64_t simulated_peak(const memlog_t *log, const char *config, int device, uint64_t capacity,
                               uint64_t gpu_lag_ns)
{
    sim_stack_t sim;
    if (sim_stack_create(config, device, capacity, gpu_lag_ns, &sim) != PS_OK)
        return 0;
    replay_stats_t stats;
    uint64_t peak = 0;
    if (replay_run(log, device, sim.top, sim.gpu, 0, &stats) == 0) {
        peak = stats.peak_reserved;
        replay_stats_free(&stats);
    }
    sim_stack_destroy(&sim);
    return peak;
}

/* Without --simulate: each stack (and --native) on the GPU, per device. */
static int replay_on_gpu(const memlog_t *log, const char *log_path, const char *const *configs, size_t config_count,
                         int native, uint64_t gpu_lag_ns, const reserved_log_t *recorded, int json,
                         const char *plot_path, const char *title)
{
    if (!replay_gpu_driver_present())
        return CLI_EXIT_FAILURE;
    size_t stacks = (config_count ? config_count : 1) + (native ? 1 : 0);
    replay_gpu_result_t *results = calloc(stacks * (size_t)log->device_count + 1, sizeof *results);
    size_t count = 0;
    int exit_code = results ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
    for (size_t s = 0; s < stacks && exit_code == CLI_EXIT_OK; s++) {
        int is_native = native && s == 0;
        size_t config_index = s - (native ? 1 : 0);
        const char *config = is_native || !config_count ? NULL : configs[config_index];
        for (int d = 0; d < log->device_count && exit_code == CLI_EXIT_OK; d++) {
            replay_gpu_result_t *r = &results[count];
            if (replay_gpu_run(log_path, config, is_native, log->devices[d], gpu_lag_ns, r) != 0) {
                exit_code = CLI_EXIT_FAILURE;
                break;
            }
            if (is_native)
                snprintf(r->stack, sizeof r->stack, "native");
            else
                sim_stack_name(config, r->stack, sizeof r->stack);
            if (!is_native)
                r->simulated_peak = simulated_peak(log, config, log->devices[d],
                                                   r->device_total ? r->device_total : (uint64_t)1 << 40, gpu_lag_ns);
            if (recorded && recorded->device == r->device) {
                r->have_recorded = 1;
                r->recorded_peak = recorded->peak;
            }
            count++;
        }
    }
    if (exit_code == CLI_EXIT_OK) {
        if (json)
            replay_gpu_print_json(stdout, log_path, results, count);
        else
            replay_gpu_print_text(stdout, log_path, results, count);
        uint64_t failures = 0;
        for (size_t i = 0; i < count; i++)
            failures += results[i].failures;
        if (failures) {
            fprintf(stderr, "poolshim: replay: %llu allocation%s of the log failed on the GPU (exit status 1)\n",
                    (unsigned long long)failures, failures == 1 ? "" : "s");
            exit_code = CLI_EXIT_FAILURE;
        }
        if (plot_path && replay_plot(log, log_path, config_count ? configs[0] : NULL, (uint64_t)1 << 40, gpu_lag_ns,
                                     recorded, title, plot_path) != 0)
            exit_code = CLI_EXIT_FAILURE;
        else if (plot_path && !json)
            printf("plot: %s\n", plot_path);
    }
    free(results);
    return exit_code;
}

/* What `poolshim replay` was asked. */
typedef struct replay_args {
    const char *configs[REPLAY_MAX_CONFIGS]; /* --config, in order */
    size_t config_count;                     /* how many */
    const char *plot_path, *title, *log_path; /* --plot, --title, the log */
    uint64_t capacity, gpu_lag_ns;           /* --simulate's size, --gpu-lag */
    int json, simulate, native, breakdown, threads; /* --json, --simulate, --native, --breakdown, --threads */
    unsigned busy_streams;                   /* --busy-streams */
} replay_args_t;

/* Parses the options and the log's name; -1 when they make sense, else
 * the exit code. */
static int parse_replay_args(int argc, char **argv, replay_args_t *args)
{
    static const struct option long_options[] = {
        {"config", required_argument, NULL, 'c'}, {"simulate", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},         {"plot", required_argument, NULL, 'p'},
        {"title", required_argument, NULL, 't'},  {"gpu-lag", required_argument, NULL, 'g'},
        {"native", no_argument, NULL, 'n'},       {"help", no_argument, NULL, 'h'},
        {"breakdown", no_argument, NULL, 'b'},    {"threads", no_argument, NULL, 'T'},
        {"busy-streams", required_argument, NULL, 'J'},
        {NULL, 0, NULL, 0},
    };
    const char *why;
    const char *simulate_log = NULL; /* `--simulate LOG` (no size): the log, on REPLAY_DEFAULT_DEVICE */
    memset(args, 0, sizeof *args);
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":c:s:g:jp:t:nbTJ:h", long_options, NULL)) != -1) {
        switch (c) {
        case 'c':
            if (args->config_count == REPLAY_MAX_CONFIGS)
                return cli_usage_error("replay", "at most %d --config", REPLAY_MAX_CONFIGS);
            args->configs[args->config_count++] = optarg;
            break;
        case 's':
            /* the config's size parser */
            if (ps_parse_size(optarg, &args->capacity, NULL) != PS_OK || args->capacity == 0) {
                if (access(optarg, R_OK) != 0)
                    return cli_usage_error("replay", "--simulate wants a size such as 80GiB, not '%s'", optarg);
                /* `--simulate LOG`: the log, on a device of the default size */
                if (simulate_log)
                    return cli_usage_error("replay", "one log at a time ('%s' is extra)", optarg);
                simulate_log = optarg;
                args->capacity = REPLAY_DEFAULT_DEVICE;
            }
            args->simulate = 1;
            break;
        case 'g':
            if (cli_parse_duration(optarg, &args->gpu_lag_ns, &why) != 0)
                return cli_usage_error("replay", "--gpu-lag wants a duration such as 5ms or 200us, not '%s' (%s)",
                                       optarg, why);
            break;
        case 'j': args->json = 1; break;
        case 'n': args->native = 1; break;
        case 'b': args->breakdown = 1; break;
        case 'T': args->threads = 1; break;
        case 'J': {
            long n;
            if (cli_parse_int(optarg, 0, 1024, &n) != 0)
                return cli_usage_error("replay", "--busy-streams wants a count from 0 to 1024, not '%s'", optarg);
            args->busy_streams = (unsigned)n;
            break;
        }
        case 'p': args->plot_path = optarg; break;
        case 't': args->title = optarg; break;
        case 'h': fputs(replay_usage, stdout); return CLI_EXIT_OK;
        case ':': return cli_usage_error("replay", "option '%s' needs a value", argv[optind - 1]);
        default: return cli_usage_error("replay", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc && !simulate_log)
        return cli_usage_error("replay", "no log given (poolshim replay LOG.csv --simulate SIZE)");
    if (argc - optind > (simulate_log ? 0 : 1))
        return cli_usage_error("replay", "one log at a time ('%s' is extra)", argv[argc - 1]);
    args->log_path = simulate_log ? simulate_log : argv[optind];
    if (args->native && args->simulate)
        return cli_usage_error("replay", "--native replays on the GPU: leave out --simulate");
    if (args->busy_streams && !args->simulate)
        return cli_usage_error("replay", "--busy-streams is for the simulated device: add --simulate SIZE");
    return -1;
}

/* --simulate: each stack on a simulated device per device of the log,
 * printed; the exit code. */
static int replay_simulated(const replay_args_t *args, const memlog_t *log, const reserved_log_t *recorded)
{
    size_t stacks = args->config_count ? args->config_count : 1;
    size_t max_results = stacks * (size_t)log->device_count;
    replay_stats_t *results = calloc(max_results ? max_results : 1, sizeof *results);
    size_t result_count = 0;
    int exit_code = results ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
    for (size_t s = 0; s < stacks && exit_code == CLI_EXIT_OK; s++) {
        const char *config = args->config_count ? args->configs[s] : NULL;
        for (int d = 0; d < log->device_count && exit_code == CLI_EXIT_OK; d++) {
            sim_stack_t sim;
            if (sim_stack_create(config, log->devices[d], args->capacity, args->gpu_lag_ns, &sim) != PS_OK) {
                exit_code = CLI_EXIT_FAILURE;
                break;
            }
            /* (set after the stack is built: a pool starts quiet, as on a GPU whose table
             * has issued no barrier yet) */
            ps_fake_gpu_set_barrier_joins(sim.gpu, args->busy_streams);
            replay_stats_t *r = &results[result_count];
            replay_options_t options = {.sim_gpu = sim.gpu, .breakdown = args->breakdown, .threads = args->threads};
            if (replay_run_with(log, log->devices[d], sim.top, &options, r) != 0)
                exit_code = CLI_EXIT_FAILURE;
            else {
                snprintf(r->stack, sizeof r->stack, "%s", sim.name);
                if (recorded && recorded->device == r->device) {
                    r->has_recorded = 1;
                    r->recorded_peak_reserved = recorded->peak;
                }
                result_count++;
            }
            sim_stack_destroy(&sim);
        }
    }
    if (exit_code == CLI_EXIT_OK) {
        if (args->json)
            replay_print_json(stdout, args->log_path, log, args->capacity, args->gpu_lag_ns, args->busy_streams,
                              results, result_count);
        else
            replay_print_text(stdout, args->log_path, log, args->capacity, args->gpu_lag_ns, args->busy_streams,
                              results, result_count);
        exit_code = refused(results, result_count);
        if (args->plot_path &&
            replay_plot(log, args->log_path, args->config_count ? args->configs[0] : NULL, args->capacity,
                        args->gpu_lag_ns, recorded, args->title, args->plot_path) != 0)
            exit_code = CLI_EXIT_FAILURE;
        else if (args->plot_path && !args->json)
            printf("plot: %s\n", args->plot_path);
    }
    for (size_t i = 0; i < result_count; i++)
        replay_stats_free(&results[i]);
    free(results);
    return exit_code;
}

int ps_cmd_replay(int argc, char **argv)
{
    replay_args_t args;
    int code = parse_replay_args(argc, argv, &args);
    if (code >= 0)
        return code;
    memlog_t log;
    if (memlog_read(args.log_path, &log) != 0)
        return CLI_EXIT_FAILURE;
    if (args.gpu_lag_ns && !log.has_time) {
        fprintf(stderr, "poolshim: error: %s: --gpu-lag needs the log's Time column\n", args.log_path);
        memlog_free(&log);
        return CLI_EXIT_FAILURE;
    }
    reserved_log_t recorded;
    int have_recorded = reserved_log_read(args.log_path, &log, &recorded);
    if (have_recorded < 0) {
        memlog_free(&log);
        return CLI_EXIT_FAILURE;
    }
    if (args.simulate)
        code = replay_simulated(&args, &log, have_recorded ? &recorded : NULL);
    else
        code = replay_on_gpu(&log, args.log_path, args.configs, args.config_count, args.native, args.gpu_lag_ns,
                             have_recorded ? &recorded : NULL, args.json, args.plot_path, args.title);
    reserved_log_free(&recorded);
    memlog_free(&log);
    return code;
}
