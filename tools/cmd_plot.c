/* poolshim plot: memory over time of an allocation log, as SVG.
 *
 * Algorithm:
 *   1. Read the log (FILE:LINE errors as for replay).
 *   2. Per device: replay its events over the stack (the default, or
 *      --config) on a simulated device (--simulate, default 1 TiB),
 *      collecting requested and reserved bytes after every event. An
 *      allocation the device refuses is not drawn (requested bytes are
 *      what was served, tools/replay.c); the subtitle and a warning say so. If the stack cannot be built (a build without
 *      the pool), requested bytes alone are drawn and the subtitle says
 *      "reserved unknown".
 *   3. When the log has its companion LOG.reserved.csv (written by the
 *      shim's log adaptor, tools/reserved_log.h), draw what the recorded
 *      program's GPU really held as a third curve, "reserved on the GPU
 *      (recorded)", as steps at the recorded times.
 *   4. Write the chart: x is the log's time in seconds (the event number
 *      when the log has no Time column), y in binary units. The replayed
 *      curve is labelled "(simulated)": it is what the stack would reserve
 *      on the simulated device, not what the program's GPU held; a GPU lag
 *      (--gpu-lag) is named in the title and the subtitle.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../config/config.h"
#include "cli.h"
#include "replay.h"
#include "reserved_log.h"
#include "sim_stack.h"
#include "svg_plot.h"

#define PLOT_MAX_DEVICES 4 /* series pairs drawn; more devices are listed as omitted */

static const char plot_usage[] =
    "usage: poolshim plot LOG.csv -o memory.svg [options]\n"
    "\n"
    "Draws memory over time from an allocation log (RMM CSV format): bytes requested by\n"
    "the program and bytes a stack reserves for them (replayed on a simulated device),\n"
    "per device, as a self-contained SVG; and, when the shim wrote the log (its companion\n"
    "LOG.reserved.csv exists), the bytes the recorded program's GPU really held.\n"
    "\n"
    "options:\n"
    "  -o, --output FILE    the SVG to write ('-' = stdout; required)\n"
    "  -t, --title TEXT     chart title (default: the log's name)\n"
    "  -c, --config FILE    stack whose reserved bytes are drawn (default config if omitted)\n"
    "  -s, --simulate SIZE  capacity of the simulated device (default 1TiB)\n"
    "  -g, --gpu-lag TIME   the simulated GPU lags the host by TIME (e.g. 5ms), in log time\n"
    "  -h, --help           this text\n";

/* The recorded reserved bytes as a series (step 3), held from its last
 * change to `log_end` when that is later; its points in *xs and *ys (owned
 * by the caller, set even when out of memory: -1). */
static int recorded_series(const reserved_log_t *recorded, double log_end, plot_series_t *s, double **xs,
                           uint64_t **ys)
{
    double *x = *xs = malloc((recorded->count + 1) * sizeof *x); /* + the log's end */
    uint64_t *y = *ys = malloc((recorded->count + 1) * sizeof *y);
    if (!x || !y)
        return -1;
    s->x = x;
    s->y = y;
    for (size_t i = 0; i < recorded->count; i++) {
        x[i] = recorded->points[i].time_s;
        y[i] = recorded->points[i].reserved;
    }
    size_t count = recorded->count;
    if (log_end > x[count - 1]) {
        x[count] = log_end;
        y[count] = y[count - 1];
        count++;
    }
    snprintf(s->name, sizeof s->name, "reserved on the GPU (recorded)");
    s->count = count;
    return 0;
}

/* The plot's subtitle (the log, the stack replayed or NULL, the lag, the
 * allocations the simulated device of `capacity` refused (`refused`, also
 * warned), the recorded peak, devices left out) and its default title. */
static void plot_titles(const memlog_t *log, const char *log_name, int devices, uint64_t gpu_lag_ns, uint64_t capacity,
                        uint64_t refused, const reserved_log_t *recorded, const char *stack_name, char *subtitle,
                        size_t subtitle_size, char *title, size_t title_size)
{
    const char *base = strrchr(log_name, '/');
    base = base ? base + 1 : log_name;
    char omitted[64] = "";
    if (log->device_count > devices)
        snprintf(omitted, sizeof omitted, "; %d more devices not drawn", log->device_count - devices);
    char lag[64] = "", lag_text[32];
    if (gpu_lag_ns)
        snprintf(lag, sizeof lag, " (GPU lag %s)",
                 cli_format_seconds(lag_text, sizeof lag_text, (double)gpu_lag_ns / 1e9));
    char refused_text[128] = "", capacity_text[32];
    if (refused) {
        cli_format_bytes(capacity_text, sizeof capacity_text, capacity);
        snprintf(refused_text, sizeof refused_text, "; %llu allocation%s refused on %s, not drawn",
                 (unsigned long long)refused, refused == 1 ? "" : "s", capacity_text);
        fprintf(stderr, "poolshim: warning: plot: %llu allocation%s of the log refused on the simulated device "
                        "of %s: not drawn (replay shows where)\n",
                (unsigned long long)refused, refused == 1 ? "" : "s", capacity_text);
    }
    char real[160] = "", peak_text[32];
    if (recorded && recorded->count)
        snprintf(real, sizeof real, "; recorded on the GPU: peak %s",
                 cli_format_bytes(peak_text, sizeof peak_text, recorded->peak));
    if (stack_name)
        snprintf(subtitle, subtitle_size,
                 "%s, %zu events; simulated = replay over stack '%s' on a simulated device%s%s%s%s", base,
                 log->count, stack_name, lag, refused_text, real, omitted);
    else
        snprintf(subtitle, subtitle_size, "%s, %zu events; simulated reserved unknown (no stack to replay on)%s%s",
                 base, log->count, real, omitted);
    snprintf(title, title_size, "Memory over time: %s%s", base, lag);
}

int replay_plot(const memlog_t *log, const char *log_name, const char *config, uint64_t capacity,
                uint64_t gpu_lag_ns, const reserved_log_t *recorded, const char *title, const char *path)
{
    int devices = log->device_count < PLOT_MAX_DEVICES ? log->device_count : PLOT_MAX_DEVICES;
    replay_stats_t stats[PLOT_MAX_DEVICES];
    plot_series_t series[2 * PLOT_MAX_DEVICES + 1];
    double *recorded_x = NULL;
    uint64_t *recorded_y = NULL;
    double *xs[PLOT_MAX_DEVICES] = {NULL};
    uint64_t *requested[PLOT_MAX_DEVICES] = {NULL}, *reserved[PLOT_MAX_DEVICES] = {NULL};
    size_t series_count = 0;
    int have_reserved = 1, status = 0;
    char stack_name[128] = "";
    memset(stats, 0, sizeof stats);
    memset(series, 0, sizeof series);

    for (int d = 0; d < devices && status == 0; d++) {
        sim_stack_t sim;
        int built = have_reserved && sim_stack_create(config, log->devices[d], capacity, gpu_lag_ns, &sim) == PS_OK;
        if (!built && have_reserved) {
            fprintf(stderr, "poolshim: warning: plot: no stack to replay on; drawing requested bytes only\n");
            have_reserved = 0;
        }
        if (built)
            snprintf(stack_name, sizeof stack_name, "%s", sim.name);
        status = replay_run(log, log->devices[d], built ? sim.top : NULL, built ? sim.gpu : NULL, 1, &stats[d]);
        if (built)
            sim_stack_destroy(&sim);
        if (status != 0)
            break;
        size_t n = stats[d].sample_count;
        xs[d] = malloc((n ? n : 1) * sizeof *xs[d]);
        requested[d] = malloc((n ? n : 1) * sizeof *requested[d]);
        reserved[d] = malloc((n ? n : 1) * sizeof *reserved[d]);
        if (!xs[d] || !requested[d] || !reserved[d]) {
            status = -1;
            break;
        }
        for (size_t i = 0; i < n; i++) {
            xs[d][i] = stats[d].samples[i].time_s;
            requested[d][i] = stats[d].samples[i].requested;
            reserved[d][i] = stats[d].samples[i].reserved;
        }
        const char *suffix = log->device_count > 1 ? " (device " : "";
        if (have_reserved) {
            plot_series_t *s = &series[series_count++];
            if (*suffix)
                snprintf(s->name, sizeof s->name, "reserved by %s, simulated%s%d)", stack_name, suffix,
                         log->devices[d]);
            else
                snprintf(s->name, sizeof s->name, "reserved by %s (simulated)", stack_name);
            s->x = xs[d];
            s->y = reserved[d];
            s->count = n;
        }
        plot_series_t *s = &series[series_count++];
        if (*suffix)
            snprintf(s->name, sizeof s->name, "requested%s%d)", suffix, log->devices[d]);
        else
            snprintf(s->name, sizeof s->name, "requested by the program");
        s->x = xs[d];
        s->y = requested[d];
        s->count = n;
        s->dashed = have_reserved;
    }
    if (status == 0 && recorded && recorded->count) { /* step 3 */
        /* what the GPU held stays held until the log's end, not until its last change */
        double log_end = 0;
        for (int d = 0; d < devices; d++)
            if (stats[d].sample_count && xs[d][stats[d].sample_count - 1] > log_end)
                log_end = xs[d][stats[d].sample_count - 1];
        status = recorded_series(recorded, log_end, &series[series_count], &recorded_x, &recorded_y);
        series_count += status == 0;
    }
    if (status == 0) {
        char subtitle[512], default_title[256];
        uint64_t refused = 0;
        for (int d = 0; d < devices; d++)
            refused += stats[d].failures;
        plot_titles(log, log_name, devices, gpu_lag_ns, capacity, refused, recorded, have_reserved ? stack_name : NULL,
                    subtitle, sizeof subtitle, default_title, sizeof default_title);
        plot_spec_t spec = {title ? title : default_title, subtitle, log->has_time, series, series_count};
        status = svg_plot_file(path, &spec);
    } else {
        fprintf(stderr, "poolshim: error: plot: out of memory\n");
    }
    free(recorded_x);
    free(recorded_y);
    for (int d = 0; d < devices; d++) {
        replay_stats_free(&stats[d]);
        free(xs[d]);
        free(requested[d]);
        free(reserved[d]);
    }
    return status;
}

int ps_cmd_plot(int argc, char **argv)
{
    static const struct option long_options[] = {
        {"output", required_argument, NULL, 'o'}, {"title", required_argument, NULL, 't'},
        {"config", required_argument, NULL, 'c'}, {"simulate", required_argument, NULL, 's'},
        {"gpu-lag", required_argument, NULL, 'g'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *output = NULL, *title = NULL, *config = NULL, *why;
    uint64_t capacity = (uint64_t)1 << 40, gpu_lag_ns = 0;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":o:t:c:s:g:h", long_options, NULL)) != -1) {
        switch (c) {
        case 'o': output = optarg; break;
        case 't': title = optarg; break;
        case 'c': config = optarg; break;
        case 's':
            if (ps_parse_size(optarg, &capacity, NULL) != PS_OK || capacity == 0) /* the config's parser */
                return cli_usage_error("plot", "--simulate wants a size such as 80GiB, not '%s'", optarg);
            break;
        case 'g':
            if (cli_parse_duration(optarg, &gpu_lag_ns, &why) != 0)
                return cli_usage_error("plot", "--gpu-lag wants a duration such as 5ms or 200us, not '%s' (%s)",
                                       optarg, why);
            break;
        case 'h': fputs(plot_usage, stdout); return CLI_EXIT_OK;
        case ':': return cli_usage_error("plot", "option '%s' needs a value", argv[optind - 1]);
        default: return cli_usage_error("plot", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return cli_usage_error("plot", "no log given (poolshim plot LOG.csv -o memory.svg)");
    if (argc - optind > 1)
        return cli_usage_error("plot", "one log at a time ('%s' is extra)", argv[optind + 1]);
    if (!output)
        return cli_usage_error("plot", "say where the SVG goes with -o FILE");
    if (config && cli_check_config("plot", config, 1) != 0) /* not a plot without its stack */
        return CLI_EXIT_FAILURE;
    memlog_t log;
    if (memlog_read(argv[optind], &log) != 0)
        return CLI_EXIT_FAILURE;
    if (gpu_lag_ns && !log.has_time) {
        fprintf(stderr, "poolshim: error: %s: --gpu-lag needs the log's Time column\n", argv[optind]);
        memlog_free(&log);
        return CLI_EXIT_FAILURE;
    }
    reserved_log_t recorded;
    int have_recorded = reserved_log_read(argv[optind], &log, &recorded);
    if (have_recorded < 0) {
        memlog_free(&log);
        return CLI_EXIT_FAILURE;
    }
    int rc = replay_plot(&log, argv[optind], config, capacity, gpu_lag_ns, have_recorded ? &recorded : NULL, title,
                         output);
    reserved_log_free(&recorded);
    memlog_free(&log);
    return rc == 0 ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
}
