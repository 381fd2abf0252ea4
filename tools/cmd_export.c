/* poolshim export: an allocation log in the formats of two viewers people
 * already use: PyTorch's memory_viz (a snapshot pickle) and Perfetto /
 * chrome://tracing (Trace Event Format JSON).
 *
 * The log (tools/memlog.h) records what the program asked for: allocations,
 * frees and failed allocations with their pointer, size, stream and time.
 * It records neither call stacks nor barriers; what the stack held from the
 * device is in its companion LOG.reserved.csv (tools/reserved_log.h) when
 * the shim wrote the log.
 *
 * Algorithm (memory_viz, --memory-viz FILE):
 *   1. Per device (all of the log's, or --device), walk its events in log
 *      order keeping the live allocations in a hash table (pointer ->
 *      size, stream). The pickle is the dict torch.cuda.memory._snapshot()
 *      returns: "device_traces", a list indexed by device number, and
 *      "segments".
 *   2. An allocation becomes `segment_alloc` then `alloc`; a free
 *      `free_requested`, `free_completed` then `segment_free` (size: the
 *      allocation's, else the logged one); a failed allocation `oom`
 *      (device_free 0: the log does not know it). Every event has addr,
 *      size, stream, time_us (log time since its first event; the event's
 *      index without a Time column) and frames (empty: no stacks in logs).
 *   3. Segments: the log knows no segment addresses (the companion has
 *      totals only), so every allocation is modelled as its own segment, as
 *      PyTorch's own snapshot looks with caching off. The segments are the
 *      allocations live at the end, each with one active_allocated block.
 *      memory_viz's "Allocator State History" replays the trace backwards
 *      from them, which needs every block inside a segment at every step:
 *      hence the segment events of step 2.
 * Algorithm (Perfetto, --perfetto FILE):
 *   4. Per device: replay its events (tools/replay.h) for the requested
 *      bytes after each event; one process per device (pid = device + 1,
 *      named by "M" metadata events), a counter ("C") "requested" at each
 *      change, instant events ("i") for failed allocations.
 *   5. Reserved bytes: the companion's rows when the log has one ("reserved
 *      (recorded)", a "growth" instant at each rise); otherwise what the
 *      default stack would reserve on a simulated device, as `plot` draws
 *      it ("reserved (simulated)", "growth (simulated)" instants).
 *   6. Timestamps in microseconds since the log's first event.
 * Guarantees: a file that cannot be written is an error naming it, and a
 * partly written output is removed; the log's events are never reordered.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "memlog.h"
#include "pickle_writer.h"
#include "replay.h"
#include "reserved_log.h"
#include "sim_stack.h"

#define EXPORT_SMALL_SEGMENT (1u << 20) /* PyTorch's small pool holds blocks up to 1 MiB */
#define EXPORT_SIM_CAPACITY ((uint64_t)1 << 40) /* simulated device: never refuses, as plot's */

static const char export_usage[] =
    "usage: poolshim export LOG.csv --memory-viz OUT.pickle [--perfetto OUT.json] [--device N]\n"
    "       poolshim export LOG.csv --perfetto OUT.json [--device N]\n"
    "\n"
    "Writes an allocation log (RMM CSV format, gzip read as is) for two viewers:\n"
    "  --memory-viz FILE  a PyTorch memory snapshot (pickle): open it at\n"
    "                     https://pytorch.org/memory_viz (drag and drop) or with\n"
    "                     python -m torch.cuda._memory_viz trace_plot FILE -o out.html\n"
    "  --perfetto FILE    a Trace Event Format JSON: requested and reserved bytes per device\n"
    "                     as counters, failures and growth as instants; open it at\n"
    "                     https://ui.perfetto.dev or chrome://tracing\n"
    "\n"
    "options:\n"
    "  -m, --memory-viz FILE  the snapshot to write ('-' = stdout)\n"
    "  -p, --perfetto FILE    the trace to write ('-' = stdout)\n"
    "  -d, --device N         only device N of a log with several (default: all)\n"
    "  -h, --help             this text\n";

/* ---- live allocations: an open-addressing table keyed by pointer ---- */

typedef struct live_slot {
    uint64_t pointer; /* the logged pointer */
    uint64_t size;    /* its allocation's size */
    uint64_t stream;  /* its allocation's stream */
    int used;         /* the slot has held this pointer */
    int live;         /* allocated and not yet freed */
} live_slot_t;

typedef struct live_table {
    live_slot_t *slots; /* capacity entries */
    size_t capacity;    /* a power of two, at least twice the distinct pointers */
} live_table_t;

static int live_table_init(live_table_t *t, size_t events)
{
    t->capacity = 16;
    while (t->capacity < 2 * events + 2)
        t->capacity *= 2;
    t->slots = calloc(t->capacity, sizeof *t->slots);
    return t->slots ? 0 : -1;
}

/* The slot of `pointer`: the one holding it, else the empty one it goes in.
 * Freed slots keep their pointer, so the table never needs deletion. */
static live_slot_t *live_table_slot(live_table_t *t, uint64_t pointer)
{
    size_t i = (size_t)((pointer >> 8) * 0x9E3779B97F4A7C15ull) & (t->capacity - 1);
    while (t->slots[i].used && t->slots[i].pointer != pointer)
        i = (i + 1) & (t->capacity - 1);
    return &t->slots[i];
}

/* ---- output files ---- */

static FILE *open_output(const char *path)
{
    if (!strcmp(path, "-"))
        return stdout;
    FILE *f = fopen(path, "wb");
    if (!f)
        fprintf(stderr, "poolshim: error: export: cannot write %s: %s\n", path, strerror(errno));
    return f;
}

/* Closes `f`; on failure (failed true, or the close fails) prints why and
 * removes the partial file. Returns 0 or -1. */
static int close_output(const char *path, FILE *f, int failed)
{
    int saved = errno;
    if (f == stdout)
        return fflush(f) == 0 && !failed ? 0 : -1;
    if (fclose(f) != 0 && !failed) {
        failed = 1;
        saved = errno;
    }
    if (failed) {
        fprintf(stderr, "poolshim: error: export: cannot write %s: %s\n", path,
                saved ? strerror(saved) : "write failed");
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) /* never a device such as /dev/full */
            unlink(path);
        return -1;
    }
    return 0;
}

/* Seconds as microseconds, kept to the nanosecond (no 99999.99999854 for 0.1 s). */
static double microseconds(double seconds) { return round(seconds * 1e9) / 1e3; }

/* Log time of an event in microseconds (its index without a Time column). */
static double event_time_us(const memlog_t *log, size_t index)
{
    return log->has_time ? microseconds(log->events[index].time_s) : (double)index;
}

static int selected(int device, int only_device) { return only_device < 0 || device == only_device; }

/* ---- memory_viz ---- */

/* A live allocation at the log's end: a segment of the snapshot (step 3). */
typedef struct end_block {
    int device;      /* the log's device */
    uint64_t address; /* the logged pointer */
    uint64_t size;   /* bytes */
    uint64_t stream; /* its stream */
} end_block_t;

static int compare_end_blocks(const void *a, const void *b)
{
    const end_block_t *x = a, *y = b;
    if (x->device != y->device)
        return x->device < y->device ? -1 : 1;
    return x->address < y->address ? -1 : x->address > y->address;
}

/* One trace entry (step 2). */
static void trace_event(pickle_writer_t *w, const char *action, uint64_t address, uint64_t size, uint64_t stream,
                        double time_us)
{
    pickle_dict_begin(w);
    pickle_key_string(w, "action", action);
    if (!strcmp(action, "oom"))
        pickle_key_uint(w, "device_free", 0); /* unknown to the log */
    else
        pickle_key_uint(w, "addr", address);
    pickle_key_uint(w, "size", size);
    pickle_key_uint(w, "stream", stream);
    pickle_key_int(w, "time_us", (int64_t)llround(time_us));
    pickle_string(w, "frames");
    pickle_list_begin(w);
    pickle_list_end(w);
    pickle_dict_end(w);
}

/* Writes device d's trace (steps 1-2) and appends its live allocations at
 * the end to *ends. */
static int memory_viz_trace(pickle_writer_t *w, const memlog_t *log, int device, end_block_t **ends,
                            size_t *end_count)
{
    live_table_t table;
    if (live_table_init(&table, log->count) != 0)
        return -1;
    pickle_list_begin(w);
    for (size_t i = 0; i < log->count; i++) {
        const memlog_event_t *e = &log->events[i];
        if (e->device != device)
            continue;
        double when = event_time_us(log, i);
        if (e->action == MEMLOG_ALLOCATE_FAILURE) {
            trace_event(w, "oom", 0, e->size, e->stream, when);
            continue;
        }
        live_slot_t *slot = live_table_slot(&table, e->pointer);
        if (e->action == MEMLOG_ALLOCATE) {
            if (slot->used && slot->live) { /* the log lost a free: the old block goes first */
                trace_event(w, "free_requested", e->pointer, slot->size, slot->stream, when);
                trace_event(w, "free_completed", e->pointer, slot->size, slot->stream, when);
                trace_event(w, "segment_free", e->pointer, slot->size, slot->stream, when);
            }
            *slot = (live_slot_t){e->pointer, e->size, e->stream, 1, 1};
            trace_event(w, "segment_alloc", e->pointer, e->size, e->stream, when);
            trace_event(w, "alloc", e->pointer, e->size, e->stream, when);
        } else {
            uint64_t size = slot->used && slot->live ? slot->size : e->size;
            uint64_t stream = slot->used && slot->live ? slot->stream : e->stream;
            trace_event(w, "free_requested", e->pointer, size, stream, when);
            trace_event(w, "free_completed", e->pointer, size, stream, when);
            trace_event(w, "segment_free", e->pointer, size, stream, when);
            if (slot->used)
                slot->live = 0;
        }
    }
    pickle_list_end(w);
    size_t live = 0;
    for (size_t i = 0; i < table.capacity; i++)
        live += table.slots[i].used && table.slots[i].live;
    end_block_t *grown = realloc(*ends, (*end_count + live + 1) * sizeof *grown);
    if (!grown) {
        free(table.slots);
        return -1;
    }
    *ends = grown;
    for (size_t i = 0; i < table.capacity; i++)
        if (table.slots[i].used && table.slots[i].live)
            (*ends)[(*end_count)++] =
                (end_block_t){device, table.slots[i].pointer, table.slots[i].size, table.slots[i].stream};
    free(table.slots);
    return 0;
}

/* One segment holding one active block (step 3). */
static void memory_viz_segment(pickle_writer_t *w, const end_block_t *b)
{
    pickle_dict_begin(w);
    pickle_key_int(w, "device", b->device);
    pickle_key_uint(w, "address", b->address);
    pickle_key_uint(w, "total_size", b->size);
    pickle_key_uint(w, "allocated_size", b->size);
    pickle_key_uint(w, "active_size", b->size);
    pickle_key_uint(w, "requested_size", b->size);
    pickle_key_uint(w, "stream", b->stream);
    pickle_key_string(w, "segment_type", b->size <= EXPORT_SMALL_SEGMENT ? "small" : "large");
    pickle_key_bool(w, "is_expandable", 0);
    pickle_string(w, "frames");
    pickle_list_begin(w);
    pickle_list_end(w);
    pickle_string(w, "blocks");
    pickle_list_begin(w);
    pickle_dict_begin(w);
    pickle_key_uint(w, "address", b->address);
    pickle_key_uint(w, "size", b->size);
    pickle_key_uint(w, "requested_size", b->size);
    pickle_key_string(w, "state", "active_allocated");
    pickle_string(w, "frames");
    pickle_list_begin(w);
    pickle_list_end(w);
    pickle_dict_end(w);
    pickle_list_end(w);
    pickle_dict_end(w);
}

static int export_memory_viz(const memlog_t *log, int only_device, const char *path)
{
    int last_device = -1;
    for (int d = 0; d < log->device_count; d++)
        if (selected(log->devices[d], only_device) && log->devices[d] > last_device)
            last_device = log->devices[d];
    FILE *f = open_output(path);
    if (!f)
        return -1;
    pickle_writer_t w;
    pickle_begin(&w, f);
    pickle_dict_begin(&w);
    pickle_string(&w, "device_traces");
    pickle_list_begin(&w); /* indexed by device number: devices without events get [] */
    end_block_t *ends = NULL;
    size_t end_count = 0;
    int status = 0;
    for (int device = 0; device <= last_device && status == 0; device++) {
        int in_log = 0;
        for (int d = 0; d < log->device_count; d++)
            in_log |= log->devices[d] == device;
        if (in_log && selected(device, only_device)) {
            status = memory_viz_trace(&w, log, device, &ends, &end_count);
        } else {
            pickle_list_begin(&w);
            pickle_list_end(&w);
        }
    }
    pickle_list_end(&w);
    if (status == 0) {
        qsort(ends, end_count, sizeof *ends, compare_end_blocks);
        pickle_string(&w, "segments");
        pickle_list_begin(&w);
        for (size_t i = 0; i < end_count; i++)
            memory_viz_segment(&w, &ends[i]);
        pickle_list_end(&w);
        pickle_string(&w, "allocator_settings");
        pickle_dict_begin(&w);
        pickle_dict_end(&w);
        pickle_dict_end(&w);
    }
    free(ends);
    if (status != 0) {
        fprintf(stderr, "poolshim: error: export: out of memory\n");
        close_output(path, f, 1);
        return -1;
    }
    int failed = pickle_end(&w) != 0;
    errno = failed ? (ferror(f) ? EIO : 0) : 0;
    return close_output(path, f, failed);
}

/* ---- Perfetto ---- */

static json_t *trace_metadata(const char *name, int pid, int tid, const char *key, json_t *value)
{
    return json_pack("{s:s, s:s, s:i, s:i, s:{s:o}}", "name", name, "ph", "M", "pid", pid, "tid", tid, "args",
                     key, value);
}

static json_t *trace_counter(const char *name, int pid, double ts, uint64_t bytes)
{
    return json_pack("{s:s, s:s, s:i, s:i, s:f, s:{s:I}}", "name", name, "ph", "C", "pid", pid, "tid", 0, "ts", ts,
                     "args", "bytes", (json_int_t)bytes);
}

/* An instant event on the device's process; args is stolen. */
static json_t *trace_instant(const char *name, int pid, double ts, json_t *args)
{
    return json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:o}", "name", name, "ph", "i", "s", "p", "pid", pid, "tid",
                     0, "ts", ts, "args", args);
}

/* Steps 4-5 for one device; events are appended to `events`. */
static int perfetto_device(json_t *events, const memlog_t *log, int device, const reserved_log_t *recorded,
                           const char *log_name)
{
    int pid = device + 1;
    char process_name[256];
    snprintf(process_name, sizeof process_name, "GPU %d (poolshim log %s)", device, log_name);
    json_array_append_new(events, trace_metadata("process_name", pid, 0, "name", json_string(process_name)));
    json_array_append_new(events, trace_metadata("process_sort_index", pid, 0, "sort_index", json_integer(device)));
    json_array_append_new(events, trace_metadata("thread_name", pid, 0, "name", json_string("allocations")));

    sim_stack_t sim;
    int simulate = !recorded;
    if (simulate && sim_stack_create(NULL, device, EXPORT_SIM_CAPACITY, 0, &sim) != PS_OK) {
        fprintf(stderr, "poolshim: warning: export: no stack to replay on; the trace has requested bytes only\n");
        simulate = 0;
    }
    replay_stats_t stats;
    memset(&stats, 0, sizeof stats);
    int status = replay_run(log, device, simulate ? sim.top : NULL, simulate ? sim.gpu : NULL, 1, &stats);
    if (simulate)
        sim_stack_destroy(&sim);
    if (status != 0) {
        replay_stats_free(&stats);
        return -1;
    }
    uint64_t last_requested = 0, last_reserved = 0;
    size_t sample = 0;
    for (size_t i = 0; i < log->count && sample < stats.sample_count; i++) {
        const memlog_event_t *e = &log->events[i];
        if (e->device != device)
            continue;
        const replay_sample_t *s = &stats.samples[sample++];
        double ts = event_time_us(log, i);
        if (sample == 1 || s->requested != last_requested)
            json_array_append_new(events, trace_counter("requested", pid, ts, s->requested));
        if (e->action == MEMLOG_ALLOCATE_FAILURE)
            json_array_append_new(events, trace_instant("allocate failure", pid, ts,
                                                        json_pack("{s:I, s:I, s:I}", "size", (json_int_t)e->size,
                                                                  "stream", (json_int_t)e->stream, "requested",
                                                                  (json_int_t)s->requested)));
        if (simulate && (sample == 1 || s->reserved != last_reserved)) {
            json_array_append_new(events, trace_counter("reserved (simulated)", pid, ts, s->reserved));
            if (s->reserved > last_reserved)
                json_array_append_new(events,
                                      trace_instant("growth (simulated)", pid, ts,
                                                    json_pack("{s:I, s:I}", "bytes",
                                                              (json_int_t)(s->reserved - last_reserved), "reserved",
                                                              (json_int_t)s->reserved)));
        }
        last_requested = s->requested;
        last_reserved = s->reserved;
    }
    replay_stats_free(&stats);
    if (recorded && recorded->device == device) { /* step 5: what the GPU really held */
        uint64_t previous = 0;
        for (size_t i = 0; i < recorded->count; i++) {
            const reserved_point_t *p = &recorded->points[i];
            double ts = microseconds(p->time_s);
            json_array_append_new(events, trace_counter("reserved (recorded)", pid, ts, p->reserved));
            if (p->reserved > previous)
                json_array_append_new(events, trace_instant("growth", pid, ts,
                                                            json_pack("{s:I, s:I}", "bytes",
                                                                      (json_int_t)(p->reserved - previous),
                                                                      "reserved", (json_int_t)p->reserved)));
            previous = p->reserved;
        }
    }
    return 0;
}

static int export_perfetto(const memlog_t *log, int only_device, const reserved_log_t *recorded,
                           const char *log_path, const char *path)
{
    json_t *events = json_array();
    const char *log_name = strrchr(log_path, '/') ? strrchr(log_path, '/') + 1 : log_path;
    int status = events ? 0 : -1;
    for (int d = 0; d < log->device_count && status == 0; d++)
        if (selected(log->devices[d], only_device))
            status = perfetto_device(events, log, log->devices[d], recorded, log_name);
    if (status != 0) {
        json_decref(events);
        fprintf(stderr, "poolshim: error: export: %s: the replay for the trace failed\n", log_path);
        return -1;
    }
    json_t *root = json_pack("{s:o, s:s, s:{s:s, s:s, s:s, s:s}}", "traceEvents", events, "displayTimeUnit", "ms",
                             "otherData", "source", log_path, "producer", "poolshim export",
                             "reserved",
                             recorded ? "recorded (LOG.reserved.csv)"
                                      : "simulated (the default stack on a simulated device)",
                             "time", log->has_time ? "microseconds since the log's first event"
                                                   : "the event's index (the log has no Time column)");
    if (!root) {
        fprintf(stderr, "poolshim: error: export: out of memory\n");
        return -1;
    }
    FILE *f = open_output(path);
    if (!f) {
        json_decref(root);
        return -1;
    }
    errno = 0;
    int failed = json_dumpf(root, f, JSON_COMPACT) != 0 || fputc('\n', f) == EOF;
    json_decref(root);
    return close_output(path, f, failed);
}

/* ---- command ---- */

int ps_cmd_export(int argc, char **argv)
{
    static const struct option long_options[] = {
        {"memory-viz", required_argument, NULL, 'm'}, {"perfetto", required_argument, NULL, 'p'},
        {"device", required_argument, NULL, 'd'},     {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *memory_viz = NULL, *perfetto = NULL;
    int only_device = -1;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":m:p:d:h", long_options, NULL)) != -1) {
        switch (c) {
        case 'm': memory_viz = optarg; break;
        case 'p': perfetto = optarg; break;
        case 'd': {
            long v;
            if (cli_parse_int(optarg, 0, 1023, &v) != 0)
                return cli_usage_error("export", "--device wants a device number such as 0, not '%s'", optarg);
            only_device = (int)v;
            break;
        }
        case 'h': fputs(export_usage, stdout); return CLI_EXIT_OK;
        case ':': return cli_usage_error("export", "option '%s' needs a value", argv[optind - 1]);
        default: return cli_usage_error("export", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return cli_usage_error("export", "no log given (poolshim export LOG.csv --memory-viz OUT.pickle)");
    if (argc - optind > 1)
        return cli_usage_error("export", "one log at a time ('%s' is extra)", argv[optind + 1]);
    if (!memory_viz && !perfetto)
        return cli_usage_error("export", "say what to write: --memory-viz FILE and/or --perfetto FILE");
    if (memory_viz && perfetto && !strcmp(memory_viz, "-") && !strcmp(perfetto, "-"))
        return cli_usage_error("export", "only one of --memory-viz and --perfetto can go to stdout");
    const char *log_path = argv[optind];
    memlog_t log;
    if (memlog_read(log_path, &log) != 0)
        return CLI_EXIT_FAILURE;
    int status = 0;
    if (only_device >= 0) {
        int found = 0;
        for (int d = 0; d < log.device_count; d++)
            found |= log.devices[d] == only_device;
        if (!found) {
            char list[256] = "";
            for (int d = 0; d < log.device_count; d++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", d ? ", " : "", log.devices[d]);
            fprintf(stderr, "poolshim: error: export: %s has no events of device %d (its devices: %s)\n", log_path,
                    only_device, log.device_count ? list : "none");
            status = -1;
        }
    }
    if (status == 0 && memory_viz)
        status = export_memory_viz(&log, only_device, memory_viz);
    if (status == 0 && perfetto) {
        reserved_log_t recorded;
        int have_recorded = reserved_log_read(log_path, &log, &recorded);
        if (have_recorded < 0)
            status = -1;
        else
            status = export_perfetto(&log, only_device, have_recorded ? &recorded : NULL, log_path, perfetto);
        if (have_recorded > 0)
            reserved_log_free(&recorded);
    }
    memlog_free(&log);
    return status == 0 ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
}
