/* Rendering and reading of `poolshim ab` results (see ab_report.h).
 *
 * Which figure comes from where (per run, then the median over runs):
 *   calls, time in calls   baseline: the CUPTI report (every call reached
 *                          CUDA); shim: the shim's own statistics (calls
 *                          it intercepted, time in its allocate/free)
 *   reached CUDA           the CUPTI report in both cases (under the shim:
 *                          pool growth); without CUPTI, the shim's
 *                          upstream calls
 *   peak reserved          baseline: CUPTI's peak outstanding bytes; shim:
 *                          bytes.reserved_peak summed over devices
 * Ratios compare each configuration with the baseline's medians.
 * Under a launcher (several processes per run) each shim variant's row is
 * followed by one row per process (rank order, medians over the runs) and
 * their total; the summed peaks are an upper bound (stats_table.c).
 * Guarantees: the output depends only on the results struct; missing
 * figures print as "-", never as 0.
 */
#include "ab_report.h"

#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "stats_table.h"

static double median_of(const ab_variant_t *v, double (*get)(const ab_run_t *), int (*has)(const ab_run_t *),
                        int *found)
{
    double values[AB_MAX_RUNS];
    size_t n = 0;
    for (size_t i = 0; i < v->run_count; i++)
        if (!has || has(&v->runs[i]))
            values[n++] = get(&v->runs[i]);
    *found = n > 0;
    return cli_median(values, n);
}

static double get_wall(const ab_run_t *r) { return r->wall_s; }
static int has_cupti(const ab_run_t *r) { return r->have_cupti; }
static int has_shim(const ab_run_t *r) { return r->have_shim; }
static int has_cuda_or_shim(const ab_run_t *r) { return r->have_cupti || r->have_shim; }
static double get_cuda_calls(const ab_run_t *r) { return (double)r->cuda_calls; }
static double get_cuda_time(const ab_run_t *r) { return (double)r->cuda_time_ns / 1e9; }
static double get_cuda_peak(const ab_run_t *r) { return (double)r->cuda_peak_bytes; }
static double get_shim_calls(const ab_run_t *r) { return (double)r->shim_calls; }
static double get_shim_time(const ab_run_t *r) { return (double)r->shim_time_ns / 1e9; }
static double get_reserved(const ab_run_t *r) { return (double)r->reserved_peak; }
static double get_reached(const ab_run_t *r)
{
    return r->have_cupti ? (double)r->cuda_reached : (double)r->upstream_calls;
}

void ab_summarize(const ab_variant_t *v, ab_summary_t *out)
{
    ab_summary_t s;
    memset(&s, 0, sizeof s);
    int found;
    s.wall_median = median_of(v, get_wall, NULL, &found);
    s.wall_min = s.wall_max = v->run_count ? v->runs[0].wall_s : 0;
    for (size_t i = 0; i < v->run_count; i++) {
        if (v->runs[i].wall_s < s.wall_min)
            s.wall_min = v->runs[i].wall_s;
        if (v->runs[i].wall_s > s.wall_max)
            s.wall_max = v->runs[i].wall_s;
        s.failed_runs += v->runs[i].exit_code != 0;
    }
    if (v->is_baseline) {
        s.calls = median_of(v, get_cuda_calls, has_cupti, &s.have_calls);
        s.alloc_time_s = median_of(v, get_cuda_time, has_cupti, &found);
        s.cuda_calls = s.calls;
        s.have_cuda = s.have_calls;
        s.peak_reserved = median_of(v, get_cuda_peak, has_cupti, &s.have_peak);
    } else {
        s.calls = median_of(v, get_shim_calls, has_shim, &s.have_calls);
        s.alloc_time_s = median_of(v, get_shim_time, has_shim, &found);
        s.cuda_calls = median_of(v, get_reached, has_cuda_or_shim, &s.have_cuda);
        s.peak_reserved = median_of(v, get_reserved, has_shim, &s.have_peak);
    }
    s.share = s.have_calls && s.wall_median > 0 ? s.alloc_time_s / s.wall_median : 0;
    *out = s;
}

size_t ab_variant_process_count(const ab_variant_t *v)
{
    size_t most = 0;
    for (size_t i = 0; i < v->run_count; i++)
        if (v->runs[i].processes.count > most)
            most = v->runs[i].processes.count;
    return most;
}

size_t ab_summarize_processes(const ab_variant_t *v, ab_process_summary_t *rows, ab_process_summary_t *total)
{
    size_t count = ab_variant_process_count(v);
    double calls[AB_MAX_RUNS], time_s[AB_MAX_RUNS], requested[AB_MAX_RUNS], reserved[AB_MAX_RUNS];
    for (size_t i = 0; i <= count; i++) { /* i == count: the total */
        ab_process_summary_t *out = i < count ? &rows[i] : total;
        memset(out, 0, sizeof *out);
        out->rank = out->pid = -1;
        size_t n = 0;
        for (size_t r = 0; r < v->run_count; r++) {
            const stats_job_t *job = &v->runs[r].processes;
            if (job->count == 0 || (i < count && job->count <= i))
                continue;
            stats_process_t p;
            if (i < count)
                p = job->processes[i];
            else
                stats_job_total(job, &p);
            if (n == 0) {
                out->rank = p.rank;
                out->pid = p.pid;
            }
            calls[n] = (double)p.calls;
            time_s[n] = (double)p.time_ns / 1e9;
            requested[n] = (double)p.requested_peak;
            reserved[n] = (double)p.reserved_peak;
            n++;
        }
        out->calls = cli_median(calls, n);
        out->time_s = cli_median(time_s, n);
        out->requested_peak = cli_median(requested, n);
        out->reserved_peak = cli_median(reserved, n);
    }
    return count;
}

/* The label of a per-process row: "  rank 3", else "  pid 1234", else "  process 2". */
static void process_label(char *buf, size_t size, const ab_process_summary_t *p, size_t index)
{
    if (p->rank >= 0)
        snprintf(buf, size, "  rank %ld", p->rank);
    else if (p->pid >= 0)
        snprintf(buf, size, "  pid %ld", p->pid);
    else
        snprintf(buf, size, "  process %zu", index + 1);
}

/* reserved / requested as "1.25x", or "-" when nothing was requested. */
static char *format_reserved_ratio(char *buf, size_t size, double reserved, double requested)
{
    if (requested > 0)
        snprintf(buf, size, "%.2fx", reserved / requested);
    else
        snprintf(buf, size, "-");
    return buf;
}

/* The rows under a variant's row: one per process, then the total. */
static void print_process_rows(FILE *f, const ab_variant_t *v, int name_width)
{
    size_t count = ab_variant_process_count(v);
    ab_process_summary_t *rows = calloc(count, sizeof *rows), total;
    if (!rows)
        return;
    ab_summarize_processes(v, rows, &total);
    for (size_t i = 0; i <= count; i++) {
        const ab_process_summary_t *p = i < count ? &rows[i] : &total;
        char label[64], a[40], b[40], c[40], d[40], e[40];
        if (i < count)
            process_label(label, sizeof label, p, i);
        else
            snprintf(label, sizeof label, "  total");
        fprintf(f, "%-*s  %11s %10s %10s  %13s %11s %7s  %13s  %14s  peak requested %s, reserved/requested %s\n",
                name_width, label, "", "", "", cli_format_count(a, sizeof a, (uint64_t)(p->calls + 0.5)),
                cli_format_seconds(b, sizeof b, p->time_s), "", "",
                cli_format_bytes(c, sizeof c, (uint64_t)(p->reserved_peak + 0.5)),
                cli_format_bytes(d, sizeof d, (uint64_t)(p->requested_peak + 0.5)),
                format_reserved_ratio(e, sizeof e, p->reserved_peak, p->requested_peak));
    }
    free(rows);
}

/* "10x faster" / "1.25x slower" / "same" (within 0.5%) for old -> new. */
static void speed_ratio(char *buf, size_t size, double old_value, double new_value, const char *better,
                        const char *worse)
{
    if (old_value <= 0 || new_value <= 0)
        snprintf(buf, size, "n/a");
    else if (new_value / old_value > 0.995 && new_value / old_value < 1.005)
        snprintf(buf, size, "same");
    else {
        double ratio = new_value <= old_value ? old_value / new_value : new_value / old_value;
        snprintf(buf, size, "%.*fx %s", ratio >= 100 ? 0 : ratio >= 10 ? 1 : 2, ratio,
                 new_value <= old_value ? better : worse);
    }
}

void ab_print_table(FILE *f, const ab_results_t *results)
{
    char a[40], b[40], c[40], d[40], e[40], g[40], h[40];
    size_t runs = results->variant_count ? results->variants[0].run_count : 0;
    fprintf(f, "poolshim ab: %s\n(%zu run%s each, alternating; medians; times are wall clock)\n\n",
            results->command, runs, runs == 1 ? "" : "s");
    int name_width = 8;
    for (size_t i = 0; i < results->variant_count; i++) {
        int n = (int)strlen(results->variants[i].name);
        if (n > name_width)
            name_width = n;
        size_t processes = ab_variant_process_count(&results->variants[i]);
        if (processes > 1) {
            ab_process_summary_t *rows = calloc(processes, sizeof *rows), total;
            if (rows) {
                ab_summarize_processes(&results->variants[i], rows, &total);
                for (size_t k = 0; k < processes; k++) {
                    char label[64];
                    process_label(label, sizeof label, &rows[k], k);
                    if ((int)strlen(label) > name_width)
                        name_width = (int)strlen(label);
                }
                free(rows);
            }
        }
    }
    fprintf(f, "%-*s  %11s %10s %10s  %13s %11s %7s  %13s  %14s\n", name_width, "", "wall median", "min", "max",
            "alloc calls", "in calls", "share", "reached CUDA", "peak reserved");
    ab_summary_t summaries[AB_MAX_VARIANTS];
    for (size_t i = 0; i < results->variant_count; i++) {
        const ab_variant_t *v = &results->variants[i];
        ab_summary_t *s = &summaries[i];
        ab_summarize(v, s);
        char share[16];
        if (s->have_calls)
            snprintf(share, sizeof share, "%.1f%%", s->share * 100);
        else
            snprintf(share, sizeof share, "-");
        fprintf(f, "%-*s  %11s %10s %10s  %13s %11s %7s  %13s  %14s\n", name_width, v->name,
                cli_format_seconds(a, sizeof a, s->wall_median), cli_format_seconds(b, sizeof b, s->wall_min),
                cli_format_seconds(c, sizeof c, s->wall_max),
                s->have_calls ? cli_format_count(d, sizeof d, (uint64_t)(s->calls + 0.5)) : "-",
                s->have_calls ? cli_format_seconds(e, sizeof e, s->alloc_time_s) : "-", share,
                s->have_cuda ? cli_format_count(g, sizeof g, (uint64_t)(s->cuda_calls + 0.5)) : "-",
                s->have_peak ? cli_format_bytes(h, sizeof h, (uint64_t)(s->peak_reserved + 0.5)) : "-");
        if (ab_variant_process_count(v) > 1)
            print_process_rows(f, v, name_width);
    }
    if (results->variant_count && results->variants[0].is_baseline) {
        const ab_summary_t *base = &summaries[0];
        if (results->variant_count > 1)
            fprintf(f, "\n");
        for (size_t i = 1; i < results->variant_count; i++) {
            const ab_summary_t *s = &summaries[i];
            /* several runs each whose [min, max] overlap: the medians differ by noise */
            int overlap = base->wall_max > base->wall_min && s->wall_max > s->wall_min &&
                          s->wall_min <= base->wall_max && base->wall_min <= s->wall_max;
            if (overlap)
                snprintf(c, sizeof c, "same: the runs' ranges overlap");
            else
                speed_ratio(c, sizeof c, base->wall_median, s->wall_median, "faster", "slower");
            fprintf(f, "%s vs baseline: total %s -> %s (%s)", results->variants[i].name,
                    cli_format_seconds(a, sizeof a, base->wall_median),
                    cli_format_seconds(b, sizeof b, s->wall_median), c);
            if (base->have_calls && s->have_calls)
                fprintf(f, "; time in malloc/free %s -> %s (%s)",
                        cli_format_seconds(d, sizeof d, base->alloc_time_s),
                        cli_format_seconds(e, sizeof e, s->alloc_time_s),
                        (speed_ratio(g, sizeof g, base->alloc_time_s, s->alloc_time_s, "less", "more"), g));
            if (base->have_peak && s->have_peak && base->peak_reserved > 0)
                fprintf(f, "; peak reserved %s -> %s (%.2fx)",
                        cli_format_bytes(d, sizeof d, (uint64_t)base->peak_reserved),
                        cli_format_bytes(e, sizeof e, (uint64_t)s->peak_reserved),
                        s->peak_reserved / base->peak_reserved);
            fprintf(f, "\n");
        }
    }
    int notes = 0, several = 0;
    for (size_t i = 0; i < results->variant_count; i++)
        several |= ab_variant_process_count(&results->variants[i]) > 1;
    if (several)
        fprintf(f, "%snote: rows under a variant: its processes (medians over the runs) and their total; %s\n",
                notes++ ? "" : "\n", STATS_SUMMED_PEAKS_NOTE);
    for (size_t i = 0; i < results->variant_count; i++) {
        const ab_variant_t *v = &results->variants[i];
        for (size_t r = 0; r < v->run_count; r++) {
            if (v->runs[r].exit_code != 0)
                fprintf(f, "%swarning: %s run %zu exited with status %d\n", notes++ ? "" : "\n", v->name,
                        r + 1, v->runs[r].exit_code);
        }
        if (!v->is_baseline && !summaries[i].have_calls && v->run_count)
            fprintf(f, "%snote: %s: the shim wrote no statistics (not loaded, or the program made no "
                       "CUDA allocation)\n", notes++ ? "" : "\n", v->name);
        if (v->is_baseline && !summaries[i].have_calls && v->run_count)
            fprintf(f, "%snote: baseline: no CUPTI report (libpoolshim_cupti.so missing or CUDA never "
                       "initialised): wall time only\n", notes++ ? "" : "\n");
    }
}

static void print_run_json(FILE *f, const ab_run_t *r)
{
    fprintf(f, "{\"wall_s\": %.6f, \"exit_code\": %d, \"cupti\": ", r->wall_s, r->exit_code);
    if (r->have_cupti)
        fprintf(f, "{\"calls\": %llu, \"reached\": %llu, \"time_ns\": %llu, \"peak_bytes\": %llu}",
                (unsigned long long)r->cuda_calls, (unsigned long long)r->cuda_reached,
                (unsigned long long)r->cuda_time_ns,
                (unsigned long long)r->cuda_peak_bytes);
    else
        fprintf(f, "null");
    fprintf(f, ", \"shim\": ");
    if (r->have_shim)
        fprintf(f, "{\"calls\": %llu, \"time_ns\": %llu, \"requested_peak\": %llu, \"reserved_peak\": %llu, "
                   "\"upstream_calls\": %llu, \"failures\": %llu}",
                (unsigned long long)r->shim_calls, (unsigned long long)r->shim_time_ns,
                (unsigned long long)r->requested_peak, (unsigned long long)r->reserved_peak,
                (unsigned long long)r->upstream_calls, (unsigned long long)r->shim_failures);
    else
        fprintf(f, "null");
    if (r->processes.count > 1) { /* one process: its figures are the run's, printed above */
        fprintf(f, ", \"processes\": [");
        for (size_t i = 0; i < r->processes.count; i++) {
            fprintf(f, "%s\n      ", i ? "," : "");
            stats_print_process_json(f, &r->processes.processes[i]);
        }
        fprintf(f, "]");
    }
    fprintf(f, "}");
}

static void print_process_summary_json(FILE *f, const ab_process_summary_t *p)
{
    fprintf(f, p->rank >= 0 ? "\"rank\": %ld, " : "\"rank\": null, ", p->rank);
    fprintf(f, p->pid >= 0 ? "\"pid\": %ld, " : "\"pid\": null, ", p->pid);
    fprintf(f, "\"calls\": %.0f, \"time_s\": %.9f, \"requested_peak\": %.0f, \"reserved_peak\": %.0f, "
               "\"reserved_ratio\": ",
            p->calls, p->time_s, p->requested_peak, p->reserved_peak);
    if (p->requested_peak > 0)
        fprintf(f, "%.4f", p->reserved_peak / p->requested_peak);
    else
        fprintf(f, "null");
}

/* The summary's per-process medians and their total (several processes only). */
static void print_processes_json(FILE *f, const ab_variant_t *v)
{
    size_t count = ab_variant_process_count(v);
    ab_process_summary_t *rows = count > 1 ? calloc(count, sizeof *rows) : NULL, total;
    if (!rows)
        return;
    ab_summarize_processes(v, rows, &total);
    fprintf(f, ",\n     \"processes\": [");
    for (size_t i = 0; i < count; i++) {
        fprintf(f, "%s\n      {", i ? "," : "");
        print_process_summary_json(f, &rows[i]);
        fprintf(f, "}");
    }
    fprintf(f, "],\n     \"processes_total\": {\"processes\": %zu, ", count);
    print_process_summary_json(f, &total);
    fprintf(f, ", \"note\": \"%s\"}", STATS_SUMMED_PEAKS_NOTE);
    free(rows);
}

void ab_print_json(FILE *f, const ab_results_t *results)
{
    fprintf(f, "{\"poolshim_ab\": 1, \"command\": ");
    cli_json_string(f, results->command);
    fprintf(f, ", \"variants\": [");
    ab_summary_t base;
    memset(&base, 0, sizeof base);
    for (size_t i = 0; i < results->variant_count; i++) {
        const ab_variant_t *v = &results->variants[i];
        ab_summary_t s;
        ab_summarize(v, &s);
        if (i == 0)
            base = s;
        fprintf(f, "%s\n  {\"name\": ", i ? "," : "");
        cli_json_string(f, v->name);
        fprintf(f, ", \"config\": ");
        cli_json_string(f, v->config);
        fprintf(f, ", \"baseline\": %s, \"runs\": [", v->is_baseline ? "true" : "false");
        for (size_t r = 0; r < v->run_count; r++) {
            fprintf(f, "%s\n    ", r ? "," : "");
            print_run_json(f, &v->runs[r]);
        }
        fprintf(f, "],\n   \"summary\": {\"wall_s\": {\"median\": %.6f, \"min\": %.6f, \"max\": %.6f}, "
                   "\"failed_runs\": %zu",
                s.wall_median, s.wall_min, s.wall_max, s.failed_runs);
        if (s.have_calls)
            fprintf(f, ", \"alloc_calls\": %.0f, \"alloc_time_s\": %.9f, \"alloc_share\": %.6f", s.calls,
                    s.alloc_time_s, s.share);
        if (s.have_cuda)
            fprintf(f, ", \"reached_cuda\": %.0f", s.cuda_calls);
        if (s.have_peak)
            fprintf(f, ", \"peak_reserved\": %.0f", s.peak_reserved);
        if (!v->is_baseline && results->variants[0].is_baseline) {
            if (s.wall_median > 0)
                fprintf(f, ", \"speedup\": %.4f", base.wall_median / s.wall_median);
            if (base.have_calls && s.have_calls && s.alloc_time_s > 0)
                fprintf(f, ", \"alloc_time_ratio\": %.4f", base.alloc_time_s / s.alloc_time_s);
            if (base.have_peak && s.have_peak && base.peak_reserved > 0)
                fprintf(f, ", \"peak_ratio\": %.4f", s.peak_reserved / base.peak_reserved);
        }
        print_processes_json(f, v);
        fprintf(f, "}}");
    }
    fprintf(f, "\n]}\n");
}

static void add_to_sums(ab_run_t *run, const stats_process_t *process)
{
    run->have_shim = 1; /* adds to what is there: one report per process of the run */
    run->shim_calls += process->calls;
    run->shim_time_ns += process->time_ns;
    run->requested_peak += process->requested_peak;
    run->reserved_peak += process->reserved_peak;
    run->upstream_calls += process->upstream_calls;
    run->shim_failures += process->failures;
}

int ab_run_add_shim_stats(ab_run_t *run, const json_t *stats)
{
    stats_process_t process; /* the report's devices summed, as `poolshim stats` reads it */
    if (stats_process_from_json(stats, NULL, &process) != 0)
        return -1;
    add_to_sums(run, &process);
    return 0;
}

int ab_run_add_process(ab_run_t *run, const stats_process_t *process)
{
    if (stats_job_add(&run->processes, process) != 0)
        return -1;
    stats_job_sort(&run->processes);
    add_to_sums(run, process);
    return 0;
}

void ab_results_free(ab_results_t *results)
{
    for (size_t v = 0; v < results->variant_count; v++)
        for (size_t r = 0; r < results->variants[v].run_count; r++)
            stats_job_free(&results->variants[v].runs[r].processes);
}

int ab_run_add_cupti_report(ab_run_t *run, const json_t *report)
{
    if (!json_object_get(report, "poolshim_cupti"))
        return -1;
    run->have_cupti = 1; /* adds, like ab_run_add_shim_stats */
    uint64_t calls = cli_json_u64(report, "alloc_calls", 0) + cli_json_u64(report, "free_calls", 0);
    run->cuda_calls += calls;
    /* reports without driver_calls (older libraries) count every call as reaching CUDA */
    run->cuda_reached += json_object_get(report, "driver_calls") ? cli_json_u64(report, "driver_calls", 0) : calls;
    run->cuda_time_ns += cli_json_u64(report, "alloc_time_ns", 0) + cli_json_u64(report, "free_time_ns", 0);
    run->cuda_peak_bytes += cli_json_u64(report, "bytes.peak", 0);
    return 0;
}

static int parse_run(const json_t *j, ab_run_t *r)
{
    memset(r, 0, sizeof *r);
    const json_t *wall = json_object_get(j, "wall_s");
    if (!json_is_number(wall))
        return -1;
    r->wall_s = json_number_value(wall);
    r->exit_code = (int)cli_json_double(j, "exit_code", 0);
    const json_t *cupti = json_object_get(j, "cupti");
    if (json_is_object(cupti)) {
        r->have_cupti = 1;
        r->cuda_calls = cli_json_u64(cupti, "calls", 0);
        r->cuda_reached = json_object_get(cupti, "reached") ? cli_json_u64(cupti, "reached", 0) : r->cuda_calls;
        r->cuda_time_ns = cli_json_u64(cupti, "time_ns", 0);
        r->cuda_peak_bytes = cli_json_u64(cupti, "peak_bytes", 0);
    }
    const json_t *shim = json_object_get(j, "shim");
    if (json_is_object(shim)) {
        r->have_shim = 1;
        r->shim_calls = cli_json_u64(shim, "calls", 0);
        r->shim_time_ns = cli_json_u64(shim, "time_ns", 0);
        r->requested_peak = cli_json_u64(shim, "requested_peak", 0);
        r->reserved_peak = cli_json_u64(shim, "reserved_peak", 0);
        r->upstream_calls = cli_json_u64(shim, "upstream_calls", 0);
        r->shim_failures = cli_json_u64(shim, "failures", 0);
    }
    const json_t *processes = json_object_get(j, "processes");
    for (size_t i = 0; i < json_array_size(processes); i++) {
        stats_process_t p;
        if (stats_process_from_row_json(json_array_get(processes, i), &p) != 0 ||
            stats_job_add(&r->processes, &p) != 0)
            return -1;
    }
    return 0;
}

int ab_results_parse(const char *text, ab_results_t *out, char *err, size_t errsize)
{
    json_t *root = cli_json_parse(text, err, errsize);
    if (!root)
        return -1;
    const json_t *variants = json_object_get(root, "variants");
    int status = 0;
    if (!json_object_get(root, "poolshim_ab") || !json_is_array(variants)) {
        snprintf(err, errsize, "not a 'poolshim ab --json' document");
        status = -1;
    } else if (json_array_size(variants) > AB_MAX_VARIANTS) {
        snprintf(err, errsize, "more than %d variants", AB_MAX_VARIANTS);
        status = -1;
    }
    ab_results_t *r = status == 0 ? calloc(1, sizeof *r) : NULL;
    if (status == 0 && !r) {
        snprintf(err, errsize, "out of memory");
        status = -1;
    }
    if (status == 0) {
        snprintf(r->command, sizeof r->command, "%s", cli_json_str(root, "command", ""));
        for (size_t i = 0; i < json_array_size(variants) && status == 0; i++) {
            const json_t *jv = json_array_get(variants, i);
            ab_variant_t *v = &r->variants[r->variant_count++];
            snprintf(v->name, sizeof v->name, "%s", cli_json_str(jv, "name", "?"));
            snprintf(v->config, sizeof v->config, "%s", cli_json_str(jv, "config", ""));
            v->is_baseline = json_is_true(json_object_get(jv, "baseline"));
            const json_t *runs = json_object_get(jv, "runs");
            if (!json_is_array(runs) || json_array_size(runs) > AB_MAX_RUNS) {
                snprintf(err, errsize, "variant %zu: 'runs' missing or longer than %d", i + 1, AB_MAX_RUNS);
                status = -1;
                break;
            }
            for (size_t k = 0; k < json_array_size(runs); k++) {
                if (parse_run(json_array_get(runs, k), &v->runs[v->run_count++]) != 0) {
                    snprintf(err, errsize, "variant %zu, run %zu: no wall_s, or a bad process", i + 1, k + 1);
                    status = -1;
                    break;
                }
            }
        }
        if (status == 0)
            *out = *r;
        else
            ab_results_free(r);
        free(r);
    }
    json_decref(root);
    return status;
}
