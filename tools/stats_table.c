/* Merging the shim's exit statistics of several processes (stats_table.h).
 *
 * 1. Each file is one process's report (POOLSHIM_STATS=json): a document
 *    {"poolshim": 1, "pid": P, "rank": R (when a launcher set one),
 *    "devices": [...]}. Its devices are summed into one row.
 * 2. The rank comes from the report, else from the file name ("rank3");
 *    the node from the report's "hostname". Rows are ordered by node, then
 *    rank, then pid, then file name, so the output does not depend on the
 *    order a directory lists its files.
 * 3. Each node's total (when there are several nodes) and the job's total
 *    add their rows up. Peaks add up too: the sum is what the job held at
 *    most, exact only when the processes peaked together (true of
 *    data-parallel ranks doing the same steps, not in general).
 * Guarantees: the output depends only on the job; missing figures print as
 * "-" (a ratio over nothing), never as 0.
 */
#include "stats_table.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

/* The device calls of the report (the pinned host calls are counted apart). */
static const char *const device_calls[] = {"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync",
                                           "cuMemAlloc", "cuMemFree", "cuMemAllocAsync", "cuMemFreeAsync"};

long stats_rank_from_file_name(const char *path)
{
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    for (const char *p = name; (p = strcasestr(p, "rank")) != NULL; p += 4) {
        const char *digits = p + 4;
        if (*digits == '-' || *digits == '_' || *digits == '.' || *digits == '=')
            digits++;
        if (*digits < '0' || *digits > '9')
            continue;
        char *end;
        long rank = strtol(digits, &end, 10);
        if (end - digits <= 9)
            return rank;
    }
    return -1;
}

/* A non-negative integer member, or -1. */
static long integer_or_unknown(const json_t *object, const char *key)
{
    const json_t *v = json_object_get(object, key);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (long)json_integer_value(v) : -1;
}

/* A string member, or "" (copied into out). */
static void string_or_empty(const json_t *object, const char *key, char *out, size_t size)
{
    const json_t *v = json_object_get(object, key);
    snprintf(out, size, "%s", json_is_string(v) ? json_string_value(v) : "");
}

/* Where the process ran: local rank, node, host, job, step. */
static void read_place(const json_t *object, stats_process_t *p)
{
    p->local_rank = integer_or_unknown(object, "local_rank");
    p->node = integer_or_unknown(object, "node");
    string_or_empty(object, "hostname", p->hostname, sizeof p->hostname);
    string_or_empty(object, "job", p->job, sizeof p->job);
    string_or_empty(object, "step", p->step, sizeof p->step);
}

int stats_process_from_json(const json_t *stats, const char *file, stats_process_t *out)
{
    const json_t *devices = json_object_get(stats, "devices");
    if (!json_is_object(stats) || !json_object_get(stats, "poolshim") || !json_is_array(devices))
        return -1;
    stats_process_t p;
    memset(&p, 0, sizeof p);
    snprintf(p.file, sizeof p.file, "%s", file ? file : "");
    p.pid = integer_or_unknown(stats, "pid");
    p.rank = integer_or_unknown(stats, "rank");
    read_place(stats, &p);
    if (p.rank < 0 && file)
        p.rank = stats_rank_from_file_name(file);
    p.devices = json_array_size(devices);
    p.have_cuda_time = p.devices > 0;
    for (size_t d = 0; d < p.devices; d++) {
        const json_t *dev = json_array_get(devices, d);
        if (json_is_object(json_object_get(dev, "cuda_time"))) {
            p.barrier_ns += cli_json_u64(dev, "cuda_time.barrier.ns", 0);
            p.vm_ns += cli_json_u64(dev, "cuda_time.map.ns", 0) + cli_json_u64(dev, "cuda_time.unmap.ns", 0);
        } else {
            p.have_cuda_time = 0;
        }
        for (size_t i = 0; i < sizeof device_calls / sizeof device_calls[0]; i++) {
            char path[64];
            snprintf(path, sizeof path, "calls.%s", device_calls[i]);
            p.calls += cli_json_u64(dev, path, 0);
        }
        p.time_ns += cli_json_u64(dev, "time_ns.allocate", 0) + cli_json_u64(dev, "time_ns.free", 0);
        p.requested_peak += cli_json_u64(dev, "bytes.requested_peak", 0);
        p.reserved_peak += cli_json_u64(dev, "bytes.reserved_peak", 0);
        p.barriers += cli_json_u64(dev, "barriers", 0);
        p.upstream_calls += cli_json_u64(dev, "upstream.allocs", 0) + cli_json_u64(dev, "upstream.frees", 0);
        p.failures += cli_json_u64(dev, "failures", 0);
        const json_t *host = json_object_get(dev, "host");
        if (json_is_object(host)) {
            uint64_t calls = cli_json_u64(host, "calls", 0), reserved = cli_json_u64(host, "reserved_peak", 0);
            p.have_host |= calls > 0 || reserved > 0;
            p.host_calls += calls;
            p.host_time_ns += cli_json_u64(host, "time_ns", 0);
            p.host_requested_peak += cli_json_u64(host, "requested_peak", 0);
            p.host_reserved_peak += reserved;
        }
    }
    *out = p;
    return 0;
}

int stats_job_add(stats_job_t *job, const stats_process_t *p)
{
    if (job->count == job->capacity) {
        size_t capacity = job->capacity ? 2 * job->capacity : 8;
        stats_process_t *bigger = realloc(job->processes, capacity * sizeof *bigger);
        if (!bigger)
            return -1;
        job->processes = bigger;
        job->capacity = capacity;
    }
    job->processes[job->count++] = *p;
    return 0;
}

/* Reads and parses one file: 0, 1 when it is JSON but not the shim's
 * statistics, -1 on any other error (message in err). */
static int read_one(stats_job_t *job, const char *path, char *err, size_t errsize)
{
    char *text;
    if (cli_read_file(path, &text, NULL) != 0) {
        snprintf(err, errsize, "%s: cannot read: %s", path, strerror(errno));
        return -1;
    }
    json_error_t error;
    json_t *root = json_loads(text, 0, &error);
    free(text);
    if (!root) {
        snprintf(err, errsize, "%s:%d:%d: %s", path, error.line, error.column, error.text);
        return -1;
    }
    stats_process_t p;
    int rc = stats_process_from_json(root, path, &p);
    json_decref(root);
    if (rc != 0) {
        snprintf(err, errsize, "%s: not poolshim statistics (no \"poolshim\" and \"devices\"; written with "
                               "POOLSHIM_STATS=json?)", path);
        return 1;
    }
    if (stats_job_add(job, &p) != 0) {
        snprintf(err, errsize, "%s: out of memory", path);
        return -1;
    }
    return 0;
}

int stats_job_read_file(stats_job_t *job, const char *path, char *err, size_t errsize)
{
    return read_one(job, path, err, errsize) == 0 ? 0 : -1;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int stats_job_read_directory(stats_job_t *job, const char *directory, const char *prefix, int skip_foreign,
                             size_t *found, char *err, size_t errsize)
{
    *found = 0;
    DIR *dir = opendir(directory);
    if (!dir) {
        snprintf(err, errsize, "%s: cannot read: %s", directory, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t count = 0, capacity = 0;
    int status = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        size_t n = strlen(entry->d_name);
        if (strncmp(entry->d_name, prefix, strlen(prefix)) != 0 || n < 5 || strcmp(entry->d_name + n - 5, ".json"))
            continue;
        if (count == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            char **bigger = realloc(names, capacity * sizeof *names);
            if (!bigger) {
                status = -1;
                break;
            }
            names = bigger;
        }
        if (!(names[count] = strdup(entry->d_name))) {
            status = -1;
            break;
        }
        count++;
    }
    closedir(dir);
    if (status != 0)
        snprintf(err, errsize, "%s: out of memory", directory);
    if (count)
        qsort(names, count, sizeof *names, compare_names);
    for (size_t i = 0; i < count && status == 0; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s%s%s", directory, directory[strlen(directory) - 1] == '/' ? "" : "/",
                 names[i]);
        int rc = read_one(job, path, err, errsize);
        if (rc == 0)
            (*found)++;
        else if (rc < 0 || !skip_foreign)
            status = -1;
    }
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
    return status;
}

/* Hosts in natural order (strverscmp: "node9" before "node10"), unknown last. */
static int compare_hosts(const char *a, const char *b)
{
    if (!*a != !*b)
        return *a ? -1 : 1;
    return strverscmp(a, b);
}

static int compare_processes(const void *a, const void *b)
{
    const stats_process_t *x = a, *y = b;
    int by_host = compare_hosts(x->hostname, y->hostname);
    if (by_host)
        return by_host;
    if ((x->rank < 0) != (y->rank < 0))
        return x->rank < 0 ? 1 : -1;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    return strcmp(x->file, y->file);
}

void stats_job_sort(stats_job_t *job)
{
    if (job->count > 1)
        qsort(job->processes, job->count, sizeof *job->processes, compare_processes);
}

size_t stats_job_nodes(const stats_job_t *job)
{
    size_t nodes = 0;
    for (size_t i = 0; i < job->count; i++) {
        size_t j = 0;
        while (j < i && strcmp(job->processes[j].hostname, job->processes[i].hostname))
            j++;
        nodes += j == i;
    }
    return nodes;
}

void stats_job_total(const stats_job_t *job, stats_process_t *total)
{
    stats_sum(job->processes, job->count, total);
}

void stats_sum(const stats_process_t *first, size_t count, stats_process_t *total)
{
    stats_process_t t;
    memset(&t, 0, sizeof t);
    t.rank = t.pid = t.local_rank = t.node = -1;
    t.have_cuda_time = count > 0;
    if (count)
        snprintf(t.hostname, sizeof t.hostname, "%s", first->hostname);
    for (size_t i = 0; i < count; i++) {
        const stats_process_t *p = &first[i];
        if (strcmp(t.hostname, p->hostname))
            t.hostname[0] = 0;
        t.devices += p->devices;
        t.calls += p->calls;
        t.time_ns += p->time_ns;
        t.requested_peak += p->requested_peak;
        t.reserved_peak += p->reserved_peak;
        t.barriers += p->barriers;
        t.upstream_calls += p->upstream_calls;
        t.failures += p->failures;
        t.have_cuda_time &= p->have_cuda_time; /* a total of what every process reported, or none */
        t.barrier_ns += p->barrier_ns;
        t.vm_ns += p->vm_ns;
        t.have_host |= p->have_host;
        t.host_calls += p->host_calls;
        t.host_time_ns += p->host_time_ns;
        t.host_requested_peak += p->host_requested_peak;
        t.host_reserved_peak += p->host_reserved_peak;
    }
    *total = t;
}

/* reserved / requested as "1.25x", or "-" when nothing was requested. */
static char *format_ratio(char *buf, size_t size, uint64_t reserved, uint64_t requested)
{
    if (requested)
        snprintf(buf, size, "%.2fx", (double)reserved / (double)requested);
    else
        snprintf(buf, size, "-");
    return buf;
}

/* A time in seconds, or "-" when the report did not have it. */
static char *format_known_seconds(char *buf, size_t size, int known, uint64_t ns)
{
    if (known)
        return cli_format_seconds(buf, size, (double)ns / 1e9);
    snprintf(buf, size, "-");
    return buf;
}

/* One row; `node` is the node column's text (NULL: no node column, one node). */
static void print_row(FILE *f, int node_width, const char *node, const char *rank, const char *pid,
                      const stats_process_t *p, int host, const char *file)
{
    char a[40], b[40], c[40], d[40], e[40], g[40], h[40], k[40], m[40], n[40], o[40];
    if (node)
        fprintf(f, "%-*s ", node_width, node);
    fprintf(f, "%-6s %8s %7zu %13s %11s %15s %15s %9s %9s %11s %11s", rank, pid, p->devices,
            cli_format_count(a, sizeof a, p->calls), cli_format_seconds(b, sizeof b, (double)p->time_ns / 1e9),
            cli_format_bytes(c, sizeof c, p->requested_peak), cli_format_bytes(d, sizeof d, p->reserved_peak),
            format_ratio(e, sizeof e, p->reserved_peak, p->requested_peak),
            cli_format_count(g, sizeof g, p->barriers),
            format_known_seconds(n, sizeof n, p->have_cuda_time, p->barrier_ns),
            format_known_seconds(o, sizeof o, p->have_cuda_time, p->vm_ns));
    if (host)
        fprintf(f, " %13s %15s %15s", cli_format_count(h, sizeof h, p->host_calls),
                cli_format_bytes(k, sizeof k, p->host_requested_peak),
                cli_format_bytes(m, sizeof m, p->host_reserved_peak));
    fprintf(f, "%s%s\n", *file ? "  " : "", file);
}

/* A process's host as the node column shows it. */
static const char *node_name(const stats_process_t *p) { return p->hostname[0] ? p->hostname : "-"; }

void stats_print_table(FILE *f, const stats_job_t *job)
{
    stats_process_t total;
    stats_job_total(job, &total);
    int host = total.have_host;
    size_t nodes = stats_job_nodes(job);
    int width = 5; /* ("total") */
    for (size_t i = 0; nodes > 1 && i < job->count; i++)
        if ((int)strlen(node_name(&job->processes[i])) > width)
            width = (int)strlen(node_name(&job->processes[i]));
    fprintf(f, "poolshim stats: %zu process%s", job->count, job->count == 1 ? "" : "es");
    if (nodes > 1)
        fprintf(f, " on %zu nodes", nodes);
    fprintf(f, "\n\n");
    if (nodes > 1)
        fprintf(f, "%-*s ", width, "node");
    fprintf(f, "%-6s %8s %7s %13s %11s %15s %15s %9s %9s %11s %11s", "rank", "pid", "devices", "alloc calls",
            "in calls", "peak requested", "peak reserved", "res/req", "barriers", "in barriers", "in maps");
    if (host)
        fprintf(f, " %13s %15s %15s", "pinned calls", "pinned req.", "pinned res.");
    fprintf(f, "  file\n");
    size_t node_first = 0;
    for (size_t i = 0; i < job->count; i++) {
        const stats_process_t *p = &job->processes[i];
        char rank[24], pid[24];
        snprintf(rank, sizeof rank, p->rank >= 0 ? "%ld" : "-", p->rank);
        snprintf(pid, sizeof pid, p->pid >= 0 ? "%ld" : "-", p->pid);
        print_row(f, width, nodes > 1 ? node_name(p) : NULL, rank, pid, p, host, p->file);
        int node_ends = i + 1 == job->count || strcmp(p->hostname, job->processes[i + 1].hostname);
        if (nodes > 1 && node_ends) {
            stats_process_t node_total;
            stats_sum(&job->processes[node_first], i + 1 - node_first, &node_total);
            print_row(f, width, node_name(p), "total", "", &node_total, host, "");
            node_first = i + 1;
        }
    }
    if (job->count > 1) {
        print_row(f, width, nodes > 1 ? "total" : NULL, nodes > 1 ? "" : "total", "", &total, host, "");
        fprintf(f, "\n%s\n", STATS_SUMMED_PEAKS_NOTE);
    }
}

static void print_counters_json(FILE *f, const stats_process_t *p)
{
    fprintf(f, "\"devices\": %zu, \"calls\": %llu, \"time_ns\": %llu, \"requested_peak\": %llu, "
               "\"reserved_peak\": %llu, \"reserved_ratio\": ",
            p->devices, (unsigned long long)p->calls, (unsigned long long)p->time_ns,
            (unsigned long long)p->requested_peak, (unsigned long long)p->reserved_peak);
    if (p->requested_peak)
        fprintf(f, "%.4f", (double)p->reserved_peak / (double)p->requested_peak);
    else
        fprintf(f, "null");
    fprintf(f, ", \"barriers\": %llu, \"upstream_calls\": %llu, \"failures\": %llu, ",
            (unsigned long long)p->barriers, (unsigned long long)p->upstream_calls,
            (unsigned long long)p->failures);
    if (p->have_cuda_time)
        fprintf(f, "\"barrier_ns\": %llu, \"vm_ns\": %llu, ", (unsigned long long)p->barrier_ns,
                (unsigned long long)p->vm_ns);
    else
        fprintf(f, "\"barrier_ns\": null, \"vm_ns\": null, ");
    fprintf(f, "\"host\": ");
    if (p->have_host)
        fprintf(f, "{\"calls\": %llu, \"time_ns\": %llu, \"requested_peak\": %llu, \"reserved_peak\": %llu}",
                (unsigned long long)p->host_calls, (unsigned long long)p->host_time_ns,
                (unsigned long long)p->host_requested_peak, (unsigned long long)p->host_reserved_peak);
    else
        fprintf(f, "null");
}

/* ", "key": "text"" or ", "key": null" when text is "". */
static void print_string_or_null(FILE *f, const char *key, const char *text)
{
    fprintf(f, ", \"%s\": ", key);
    if (*text)
        cli_json_string(f, text);
    else
        fprintf(f, "null");
}

void stats_print_process_json(FILE *f, const stats_process_t *p)
{
    fprintf(f, "{\"file\": ");
    cli_json_string(f, p->file);
    fprintf(f, p->rank >= 0 ? ", \"rank\": %ld" : ", \"rank\": null", p->rank);
    fprintf(f, p->pid >= 0 ? ", \"pid\": %ld" : ", \"pid\": null", p->pid);
    fprintf(f, p->local_rank >= 0 ? ", \"local_rank\": %ld" : ", \"local_rank\": null", p->local_rank);
    fprintf(f, p->node >= 0 ? ", \"node\": %ld" : ", \"node\": null", p->node);
    print_string_or_null(f, "hostname", p->hostname);
    print_string_or_null(f, "job", p->job);
    print_string_or_null(f, "step", p->step);
    fprintf(f, ", ");
    print_counters_json(f, p);
    fprintf(f, "}");
}

int stats_process_from_row_json(const json_t *row, stats_process_t *out)
{
    if (!json_is_object(row) || !json_object_get(row, "calls"))
        return -1;
    stats_process_t p;
    memset(&p, 0, sizeof p);
    snprintf(p.file, sizeof p.file, "%s", cli_json_str(row, "file", ""));
    p.rank = integer_or_unknown(row, "rank");
    p.pid = integer_or_unknown(row, "pid");
    read_place(row, &p);
    p.devices = (size_t)cli_json_u64(row, "devices", 0);
    p.calls = cli_json_u64(row, "calls", 0);
    p.time_ns = cli_json_u64(row, "time_ns", 0);
    p.requested_peak = cli_json_u64(row, "requested_peak", 0);
    p.reserved_peak = cli_json_u64(row, "reserved_peak", 0);
    p.barriers = cli_json_u64(row, "barriers", 0);
    p.upstream_calls = cli_json_u64(row, "upstream_calls", 0);
    p.failures = cli_json_u64(row, "failures", 0);
    p.have_cuda_time = json_is_integer(json_object_get(row, "barrier_ns"));
    p.barrier_ns = cli_json_u64(row, "barrier_ns", 0);
    p.vm_ns = cli_json_u64(row, "vm_ns", 0);
    const json_t *host = json_object_get(row, "host");
    if (json_is_object(host)) {
        p.have_host = 1;
        p.host_calls = cli_json_u64(host, "calls", 0);
        p.host_time_ns = cli_json_u64(host, "time_ns", 0);
        p.host_requested_peak = cli_json_u64(host, "requested_peak", 0);
        p.host_reserved_peak = cli_json_u64(host, "reserved_peak", 0);
    }
    *out = p;
    return 0;
}

void stats_print_json(FILE *f, const stats_job_t *job)
{
    fprintf(f, "{\"poolshim_stats\": 1, \"processes\": [");
    for (size_t i = 0; i < job->count; i++) {
        fprintf(f, "%s\n  ", i ? "," : "");
        stats_print_process_json(f, &job->processes[i]);
    }
    fprintf(f, "\n ],\n \"nodes\": [");
    for (size_t first = 0, i = 0; i < job->count; i++) {
        if (i + 1 < job->count && !strcmp(job->processes[i].hostname, job->processes[i + 1].hostname))
            continue;
        stats_process_t node_total;
        stats_sum(&job->processes[first], i + 1 - first, &node_total);
        fprintf(f, "%s\n  {\"hostname\": ", first ? "," : "");
        if (node_total.hostname[0])
            cli_json_string(f, node_total.hostname);
        else
            fprintf(f, "null");
        fprintf(f, ", \"processes\": %zu, ", i + 1 - first);
        print_counters_json(f, &node_total);
        fprintf(f, "}");
        first = i + 1;
    }
    stats_process_t total;
    stats_job_total(job, &total);
    fprintf(f, "\n ],\n \"total\": {\"processes\": %zu, ", job->count);
    print_counters_json(f, &total);
    fprintf(f, "}}\n");
}

void stats_job_free(stats_job_t *job)
{
    free(job->processes);
    memset(job, 0, sizeof *job);
}
