/* `poolshim export` and the pickle writer under it.
 *
 * The pickle writer's output is read back by Python's own pickle (python3
 * through popen); the memory_viz export is loaded by pickle and checked
 * against what memory_viz reads (tests/data/export/check_memory_viz.py holds the
 * checks, written from PyTorch's snapshot format); the Perfetto export is
 * parsed with jansson. Counts and peaks are compared with figures computed
 * here from the log itself. The CLI comes from POOLSHIM_CLI, data from
 * POOLSHIM_TEST_DATA, as in test_cli.c.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../tools/cli.h"
#include "../../tools/memlog.h"
#include "../../tools/pickle_writer.h"
#include "../../tools/reserved_log.h"

/* ---- helpers ------------------------------------------------------------ */

static const char *cli_path(void)
{
    const char *path = getenv("POOLSHIM_CLI");
    return path && *path ? path : "build/poolshim";
}

static const char *data_path(const char *relative)
{
    static char buf[4][1024];
    static int next;
    const char *dir = getenv("POOLSHIM_TEST_DATA");
    char *out = buf[next++ % 4];
    snprintf(out, sizeof buf[0], "%s/%s", dir && *dir ? dir : "tests/data", relative);
    return out;
}

/* Runs a shell command; returns its exit code and its stdout+stderr in *output (free it). */
static int run_shell(const char *command, char **output)
{
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", command);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p, "popen %s", command);
    size_t capacity = 4096, length = 0;
    char *text = malloc(capacity);
    size_t got;
    while ((got = fread(text + length, 1, capacity - length - 1, p)) > 0) {
        length += got;
        if (capacity - length < 2) {
            capacity *= 2;
            text = realloc(text, capacity);
        }
    }
    text[length] = '\0';
    int status = pclose(p);
    *output = text;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Runs `poolshim export ARGS` (one string, shell words). */
static int run_export(const char *args, char **output)
{
    char command[4096];
    snprintf(command, sizeof command, "'%s' export %s", cli_path(), args);
    return run_shell(command, output);
}

static void temp_path(char *out, size_t size, const char *suffix)
{
    static int next;
    snprintf(out, size, "/tmp/poolshim-export-%d-%d%s", (int)getpid(), next++, suffix);
}

/* Writes `text` to a fresh temporary file; its path goes in `out`. */
static void write_temp(char *out, size_t size, const char *suffix, const char *text)
{
    temp_path(out, size, suffix);
    FILE *f = fopen(out, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

static json_t *read_json_file(const char *path)
{
    char *text;
    size_t length;
    cr_assert_eq(cli_read_file(path, &text, &length), 0, "cannot read %s", path);
    char err[256];
    json_t *root = cli_json_parse(text, err, sizeof err);
    cr_assert_not_null(root, "%s does not parse: %s", path, err);
    free(text);
    return root;
}

/* What the log says, counted here without the exporter's code: events of
 * `device`, live allocations at the end and their bytes, the peak of
 * requested bytes (a free of an unknown pointer changes nothing, an
 * allocation over a live pointer frees it first). */
typedef struct log_figures {
    size_t allocations, frees, failures, live;
    uint64_t live_bytes, peak_requested;
} log_figures_t;

static log_figures_t count_log(const memlog_t *log, int device)
{
    log_figures_t f = {0};
    uint64_t *pointers = calloc(log->count + 1, sizeof *pointers), *sizes = calloc(log->count + 1, sizeof *sizes);
    size_t live = 0;
    uint64_t requested = 0;
    for (size_t i = 0; i < log->count; i++) {
        const memlog_event_t *e = &log->events[i];
        if (e->device != device)
            continue;
        if (e->action == MEMLOG_ALLOCATE_FAILURE) {
            f.failures++;
            continue;
        }
        size_t j = 0;
        while (j < live && pointers[j] != e->pointer)
            j++;
        if (j < live) { /* free it (or the lost free before a new allocation) */
            requested -= sizes[j];
            pointers[j] = pointers[live - 1];
            sizes[j] = sizes[live - 1];
            live--;
        }
        if (e->action == MEMLOG_ALLOCATE) {
            f.allocations++;
            pointers[live] = e->pointer;
            sizes[live++] = e->size;
            requested += e->size;
            if (requested > f.peak_requested)
                f.peak_requested = requested;
        } else {
            f.frees++;
        }
    }
    f.live = live;
    for (size_t j = 0; j < live; j++)
        f.live_bytes += sizes[j];
    free(pointers);
    free(sizes);
    return f;
}

/* ---- the pickle writer ---------------------------------------------------- */

Test(pickle_writer, round_trips_through_python_pickle)
{
    char path[256];
    temp_path(path, sizeof path, ".pickle");
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    pickle_writer_t w;
    pickle_begin(&w, f);
    pickle_dict_begin(&w);
    pickle_string(&w, "ints");
    pickle_list_begin(&w);
    const int64_t ints[] = {0, 1, 255, 256, 65535, 65536, -1, -128, -129, -256, INT32_MAX, INT32_MIN,
                            (int64_t)INT32_MAX + 1, (int64_t)INT32_MIN - 1, 0x7f0000100000, INT64_MAX, INT64_MIN};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        pickle_int(&w, ints[i]);
    pickle_list_end(&w);
    pickle_string(&w, "uints");
    pickle_list_begin(&w);
    pickle_uint(&w, (uint64_t)1 << 63);
    pickle_uint(&w, UINT64_MAX);
    pickle_uint(&w, 1099511627776ull);
    pickle_list_end(&w);
    pickle_key_string(&w, "text", "caf\xc3\xa9 \xe2\x86\x92 GPU");
    pickle_key_string(&w, "", "");
    char long_text[301];
    memset(long_text, 'x', 300);
    long_text[300] = '\0';
    pickle_key_string(&w, "long", long_text);
    pickle_string(&w, "floats");
    pickle_list_begin(&w);
    pickle_float(&w, 1.5);
    pickle_float(&w, -0.25);
    pickle_float(&w, 1e300);
    pickle_list_end(&w);
    pickle_key_bool(&w, "yes", 1);
    pickle_key_bool(&w, "no", 0);
    pickle_string(&w, "none");
    pickle_none(&w);
    pickle_string(&w, "empty");
    pickle_list_begin(&w);
    pickle_list_begin(&w);
    pickle_list_end(&w);
    pickle_dict_begin(&w);
    pickle_dict_end(&w);
    pickle_list_end(&w);
    pickle_dict_end(&w);
    cr_assert_eq(pickle_end(&w), 0);
    fclose(f);

    char command[1024], *out;
    snprintf(command, sizeof command,
             "python3 -c 'import pickle,sys; d=pickle.load(open(sys.argv[1],\"rb\")); "
             "d[\"long\"]=len(d[\"long\"]); print(repr(d))' %s",
             path);
    int rc = run_shell(command, &out);
    cr_assert_eq(rc, 0, "python3 failed: %s", out);
    const char *expected =
        "{'ints': [0, 1, 255, 256, 65535, 65536, -1, -128, -129, -256, 2147483647, -2147483648, 2147483648, "
        "-2147483649, 139637977776128, 9223372036854775807, -9223372036854775808], "
        "'uints': [9223372036854775808, 18446744073709551615, 1099511627776], "
        "'text': 'caf\xc3\xa9 \xe2\x86\x92 GPU', '': '', 'long': 300, 'floats': [1.5, -0.25, 1e+300], "
        "'yes': True, 'no': False, 'none': None, 'empty': [[], {}]}\n";
    cr_expect_str_eq(out, expected);
    free(out);
    unlink(path);
}

Test(pickle_writer, integers_take_the_smallest_opcode)
{
    char *buffer = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buffer, &size);
    pickle_writer_t w;
    pickle_begin(&w, f);
    pickle_list_begin(&w);
    pickle_int(&w, 7);           /* K 07 */
    pickle_int(&w, 300);         /* M 2c 01 */
    pickle_int(&w, -2);          /* J fe ff ff ff */
    pickle_int(&w, 1ll << 31);   /* LONG1 5: 00 00 00 80 00 (the sign byte) */
    pickle_int(&w, -(1ll << 40)); /* LONG1 6: 00 00 00 00 00 ff */
    pickle_list_end(&w);
    cr_assert_eq(pickle_end(&w), 0);
    fclose(f);
    const unsigned char expected[] = {0x80, 2, ']', '(', 'K', 7, 'M', 0x2c, 1, 'J', 0xfe, 0xff, 0xff, 0xff,
                                      0x8a, 5, 0, 0, 0, 0x80, 0, 0x8a, 6, 0, 0, 0, 0, 0, 0xff, 'e', '.'};
    cr_assert_eq(size, sizeof expected, "%zu bytes", size);
    cr_expect_eq(memcmp(buffer, expected, size), 0);
    free(buffer);
}

Test(pickle_writer, reports_unbalanced_containers_and_failed_writes)
{
    char *buffer = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buffer, &size);
    pickle_writer_t w;
    pickle_begin(&w, f);
    pickle_list_begin(&w);
    cr_expect_eq(pickle_end(&w), -1, "a list left open");
    pickle_begin(&w, f);
    pickle_dict_end(&w);
    cr_expect_eq(pickle_end(&w), -1, "an end without its begin");
    fclose(f);
    free(buffer);

    FILE *full = fopen("/dev/full", "w");
    cr_assert_not_null(full);
    pickle_begin(&w, full);
    pickle_string(&w, "no space left");
    cr_expect_eq(pickle_end(&w), -1, "a write to /dev/full fails");
    fclose(full);
}

/* ---- memory_viz ----------------------------------------------------------- */

/* Exports `log` (relative to the data dir) with extra args, checks it with
 * check_memory_viz.py and returns the checker's one-line JSON summary. */
static json_t *export_and_check(const char *log, const char *extra)
{
    char out_path[256], args[2048], *out;
    temp_path(out_path, sizeof out_path, ".pickle");
    snprintf(args, sizeof args, "'%s' --memory-viz '%s' %s", data_path(log), out_path, extra);
    int rc = run_export(args, &out);
    cr_assert_eq(rc, 0, "export %s exited %d: %s", log, rc, out);
    free(out);
    char command[2048];
    snprintf(command, sizeof command, "python3 '%s' '%s'", data_path("export/check_memory_viz.py"), out_path);
    rc = run_shell(command, &out);
    unlink(out_path);
    cr_assert_eq(rc, 0, "check_memory_viz.py on %s: %s", log, out);
    char err[256];
    const char *last_line = out;
    for (char *p = out; *p; p++)
        if (*p == '\n' && p[1])
            last_line = p + 1;
    json_t *summary = cli_json_parse(last_line, err, sizeof err);
    cr_assert_not_null(summary, "checker said: %s", out);
    json_t *problems = json_object_get(summary, "problems");
    cr_expect(json_is_array(problems) && json_array_size(problems) == 0, "%s: %s", log, out);
    free(out);
    return summary;
}

/* The summary's figures for device d agree with the log's own. */
static void expect_device_matches_log(json_t *summary, const memlog_t *log, int device, const char *name)
{
    char key[32];
    snprintf(key, sizeof key, "%d", device);
    json_t *d = json_object_get(json_object_get(summary, "devices"), key);
    cr_assert_not_null(d, "%s: device %d missing from the snapshot", name, device);
    log_figures_t f = count_log(log, device);
    cr_expect_eq(cli_json_u64(d, "alloc", 99), f.allocations, "%s device %d: %llu alloc events, %zu allocations",
                 name, device, (unsigned long long)cli_json_u64(d, "alloc", 99), f.allocations);
    cr_expect_eq(cli_json_u64(d, "free_completed", 99), f.frees + (cli_json_u64(d, "alloc", 0) - f.allocations));
    cr_expect_eq(cli_json_u64(d, "free_requested", 99), cli_json_u64(d, "free_completed", 98));
    cr_expect_eq(cli_json_u64(d, "oom", 99), f.failures, "%s device %d: oom events", name, device);
    cr_expect_eq(cli_json_u64(d, "segments", 99), f.live, "%s device %d: %llu segments, %zu live at the end", name,
                 device, (unsigned long long)cli_json_u64(d, "segments", 99), f.live);
    cr_expect_eq(cli_json_u64(d, "segment_bytes", 99), f.live_bytes, "%s device %d: bytes in segments", name, device);
    cr_expect_eq(cli_json_u64(d, "peak_active", 99), f.peak_requested, "%s device %d: peak of the trace", name,
                 device);
}

Test(export, memory_viz_snapshots_have_what_memory_viz_reads_and_match_the_log)
{
    const char *logs[] = {"logs/small.csv", "logs/rmm_format.csv", "logs/two_devices.csv",
                          "logs/h100_torch_mlp_uncached.csv.gz", "logs/recorded.csv"};
    for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
        memlog_t log;
        cr_assert_eq(memlog_read(data_path(logs[i]), &log), 0);
        json_t *summary = export_and_check(logs[i], "");
        int last = 0;
        for (int d = 0; d < log.device_count; d++) {
            expect_device_matches_log(summary, &log, log.devices[d], logs[i]);
            if (log.devices[d] > last)
                last = log.devices[d];
        }
        cr_expect_eq(cli_json_u64(summary, "device_traces", 0), (uint64_t)last + 1,
                     "%s: device_traces is indexed by device number", logs[i]);
        json_decref(summary);
        memlog_free(&log);
    }
}

Test(export, memory_viz_with_a_failure_and_live_blocks_at_the_end)
{
    char log_path[256];
    write_temp(log_path, sizeof log_path, ".csv",
               "Thread,Time,Action,Pointer,Size,Stream\n"
               "1,10:00:00.000000,allocate,0x7f0000000000,4096,0x0\n"
               "1,10:00:00.000500,allocate,0x7f0000200000,2097152,0x5a5a\n"
               "1,10:00:00.001000,allocate failure,0x0,1099511627776,0x0\n"
               "1,10:00:00.002000,free,0x7f0000000000,4096,0x0\n"
               "1,10:00:00.003000,free,0x7f00deadbeef,512,0x0\n" /* freed before the log began */
               "1,10:00:00.004000,allocate,0x7f0000000000,8192,0x0\n");
    char out_path[256], args[1024], command[1024], *out;
    temp_path(out_path, sizeof out_path, ".pickle");
    snprintf(args, sizeof args, "'%s' --memory-viz '%s'", log_path, out_path);
    cr_assert_eq(run_export(args, &out), 0, "%s", out);
    free(out);
    snprintf(command, sizeof command,
             "python3 -c 'import pickle,sys; s=pickle.load(open(sys.argv[1],\"rb\")); "
             "print([(g[\"address\"], g[\"total_size\"], g[\"stream\"], g[\"segment_type\"], "
             "[(b[\"size\"], b[\"state\"]) for b in g[\"blocks\"]]) for g in s[\"segments\"]]); "
             "print([(e[\"action\"], e[\"size\"], e[\"time_us\"]) for e in s[\"device_traces\"][0] "
             "if e[\"action\"] in (\"oom\", \"free_completed\")])' '%s'",
             out_path);
    int rc = run_shell(command, &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect_str_eq(out, "[(139637976727552, 8192, 0, 'small', [(8192, 'active_allocated')]), "
                          "(139637978824704, 2097152, 23130, 'large', [(2097152, 'active_allocated')])]\n"
                          "[('oom', 1099511627776, 1000), ('free_completed', 4096, 2000), "
                          "('free_completed', 512, 3000)]\n");
    free(out);
    unlink(out_path);
    unlink(log_path);
}

Test(export, device_option_keeps_one_device)
{
    memlog_t log;
    cr_assert_eq(memlog_read(data_path("logs/two_devices.csv"), &log), 0);
    json_t *summary = export_and_check("logs/two_devices.csv", "--device 1");
    cr_expect_eq(cli_json_u64(summary, "device_traces", 0), 2);
    expect_device_matches_log(summary, &log, 1, "two_devices.csv --device 1");
    cr_expect_eq(cli_json_u64(summary, "devices.0.alloc", 99), 0, "device 0 left out");
    cr_expect_eq(cli_json_u64(summary, "devices.0.segments", 99), 0);
    json_decref(summary);
    summary = export_and_check("logs/two_devices.csv", "--device 0");
    cr_expect_eq(cli_json_u64(summary, "device_traces", 0), 1);
    expect_device_matches_log(summary, &log, 0, "two_devices.csv --device 0");
    json_decref(summary);
    memlog_free(&log);

    char *out, args[1024];
    snprintf(args, sizeof args, "'%s' --memory-viz /dev/null --device 7", data_path("logs/two_devices.csv"));
    int rc = run_export(args, &out);
    cr_expect_eq(rc, 1, "a device the log lacks: exit %d", rc);
    cr_expect(strstr(out, "poolshim: error:") && strstr(out, "device 7") && strstr(out, "its devices: 1, 0"), "%s", out);
    free(out);
}

/* PyTorch's own helpers read the snapshot (where torch is installed). */
Test(export, torch_memory_viz_helpers_open_the_snapshot)
{
    char *out;
    if (run_shell("python3 -c 'import torch.cuda._memory_viz'", &out) != 0) {
        free(out);
        cr_skip_test("PyTorch is not installed here");
    }
    free(out);
    const char *logs[] = {"logs/small.csv", "logs/two_devices.csv", "logs/h100_torch_mlp_uncached.csv.gz"};
    for (size_t i = 0; i < 3; i++) {
        char out_path[256], args[1024], command[2048];
        temp_path(out_path, sizeof out_path, ".pickle");
        snprintf(args, sizeof args, "'%s' --memory-viz '%s'", data_path(logs[i]), out_path);
        cr_assert_eq(run_export(args, &out), 0, "%s", out);
        free(out);
        snprintf(command, sizeof command,
                 "python3 -c 'import pickle,sys; from torch.cuda import _memory_viz as v; "
                 "s=pickle.load(open(sys.argv[1],\"rb\")); "
                 "assert \"<html>\" in v.trace_plot(s); assert \"<html>\" in v.segment_plot(s); "
                 "v.segsum(s); v.trace(s); print(\"ok\")' '%s'",
                 out_path);
        int rc = run_shell(command, &out);
        cr_expect_eq(rc, 0, "%s: %s", logs[i], out);
        free(out);
        unlink(out_path);
    }
}

/* ---- Perfetto ---------------------------------------------------------------- */

/* Exports `log` as a trace and returns the parsed document. */
static json_t *export_perfetto(const char *log, const char *extra)
{
    char out_path[256], args[2048], *out;
    temp_path(out_path, sizeof out_path, ".json");
    snprintf(args, sizeof args, "'%s' --perfetto '%s' %s", log, out_path, extra);
    int rc = run_export(args, &out);
    cr_assert_eq(rc, 0, "export %s exited %d: %s", log, rc, out);
    free(out);
    json_t *root = read_json_file(out_path);
    unlink(out_path);
    return root;
}

/* Every event has the fields the Trace Event Format requires; returns the
 * highest value of counter `counter` on `pid` and counts instants `instant`. */
static uint64_t check_trace(json_t *root, int pid, const char *counter, const char *instant, size_t *instants)
{
    cr_expect_str_eq(cli_json_str(root, "displayTimeUnit", ""), "ms");
    json_t *events = json_object_get(root, "traceEvents");
    cr_assert(json_is_array(events) && json_array_size(events) > 0);
    uint64_t peak = 0;
    size_t index, counters = 0, names = 0;
    json_t *e;
    *instants = 0;
    double last_ts = -1;
    json_array_foreach(events, index, e) {
        const char *name = cli_json_str(e, "name", NULL), *ph = cli_json_str(e, "ph", NULL);
        cr_assert(name && ph && json_is_integer(json_object_get(e, "pid")), "event %zu lacks name/ph/pid", index);
        cr_expect(strchr("CiM", ph[0]) && !ph[1], "event %zu: ph '%s'", index, ph);
        cr_expect(json_is_object(json_object_get(e, "args")), "event %zu has no args", index);
        if (ph[0] != 'M')
            cr_expect(json_is_number(json_object_get(e, "ts")) && json_number_value(json_object_get(e, "ts")) >= 0,
                      "event %zu: ts", index);
        if (ph[0] == 'i')
            cr_expect_str_eq(cli_json_str(e, "s", ""), "p");
        if (json_integer_value(json_object_get(e, "pid")) != pid)
            continue;
        if (ph[0] == 'M' && !strcmp(name, "process_name"))
            names++;
        if (ph[0] == 'C' && !strcmp(name, counter)) {
            cr_expect(json_is_integer(cli_json_at(e, "args.bytes")), "counter %zu without args.bytes", index);
            uint64_t v = cli_json_u64(e, "args.bytes", 0);
            if (v > peak)
                peak = v;
            double ts = json_number_value(json_object_get(e, "ts"));
            cr_expect_geq(ts, last_ts, "counter %s goes back in time at event %zu", counter, index);
            last_ts = ts;
            counters++;
        }
        if (ph[0] == 'i' && !strcmp(name, instant))
            (*instants)++;
    }
    cr_expect_eq(names, 1, "pid %d: one process_name", pid);
    cr_expect_gt(counters, 0, "pid %d: no '%s' counter", pid, counter);
    return peak;
}

Test(export, perfetto_counters_peak_at_the_logs_peak_requested)
{
    const char *logs[] = {"logs/small.csv", "logs/two_devices.csv", "logs/h100_torch_mlp_uncached.csv.gz"};
    for (size_t i = 0; i < 3; i++) {
        memlog_t log;
        cr_assert_eq(memlog_read(data_path(logs[i]), &log), 0);
        json_t *root = export_perfetto(data_path(logs[i]), "");
        for (int d = 0; d < log.device_count; d++) {
            log_figures_t f = count_log(&log, log.devices[d]);
            size_t failures, growth;
            uint64_t peak = check_trace(root, log.devices[d] + 1, "requested", "allocate failure", &failures);
            cr_expect_eq(peak, f.peak_requested, "%s device %d: counter peak %llu, log peak %llu", logs[i],
                         log.devices[d], (unsigned long long)peak, (unsigned long long)f.peak_requested);
            cr_expect_eq(failures, f.failures, "%s device %d: failure instants", logs[i], log.devices[d]);
            uint64_t reserved = check_trace(root, log.devices[d] + 1, "reserved (simulated)", "growth (simulated)",
                                            &growth);
            cr_expect_geq(reserved, f.peak_requested, "%s: the stack reserves at least what was asked", logs[i]);
            cr_expect_gt(growth, 0);
        }
        json_decref(root);
        memlog_free(&log);
    }
}

Test(export, perfetto_reserved_comes_from_the_recorded_companion)
{
    const char *path = data_path("logs/recorded.csv");
    memlog_t log;
    cr_assert_eq(memlog_read(path, &log), 0);
    reserved_log_t recorded;
    cr_assert_eq(reserved_log_read(path, &log, &recorded), 1);
    json_t *root = export_perfetto(path, "");
    size_t growth = 0, failures;
    uint64_t peak = check_trace(root, 1, "reserved (recorded)", "growth", &growth);
    uint64_t highest = 0;
    size_t rises = 0;
    for (size_t i = 0; i < recorded.count; i++) {
        if (recorded.points[i].reserved > highest)
            highest = recorded.points[i].reserved;
        rises += recorded.points[i].reserved > (i ? recorded.points[i - 1].reserved : 0);
    }
    cr_expect_eq(peak, highest, "recorded reserved peak %llu vs %llu", (unsigned long long)peak,
                 (unsigned long long)highest);
    cr_expect_eq(growth, rises);
    cr_expect_eq(check_trace(root, 1, "requested", "allocate failure", &failures), count_log(&log, 0).peak_requested);
    cr_expect_str_eq(cli_json_str(root, "otherData.reserved", ""), "recorded (LOG.reserved.csv)");
    size_t index, simulated = 0;
    json_t *e;
    json_array_foreach(json_object_get(root, "traceEvents"), index, e)
        simulated += strstr(cli_json_str(e, "name", ""), "simulated") != NULL;
    cr_expect_eq(simulated, 0, "a recorded log gets no simulated curve");
    json_decref(root);
    reserved_log_free(&recorded);
    memlog_free(&log);
}

/* ---- bad input ------------------------------------------------------------------ */

Test(export, bad_input_is_a_clear_error_with_a_nonzero_exit)
{
    char *out, args[2048], json_path[256];
    write_temp(json_path, sizeof json_path, ".json", "{\"traceEvents\": []}\n");
    struct {
        const char *args; /* with %s for the data dir's small.csv where needed */
        int exit_code;
        const char *message;
    } cases[] = {
        {"/no/such/log.csv --memory-viz /tmp/x.pickle", 1, "/no/such/log.csv"},
        {"%s --memory-viz /no/such/dir/out.pickle", 1, "cannot write /no/such/dir/out.pickle"},
        {"%s --perfetto /no/such/dir/out.json", 1, "cannot write /no/such/dir/out.json"},
        {"%s --memory-viz /dev/full", 1, "cannot write /dev/full"},
        {"%s --perfetto /dev/full", 1, "cannot write /dev/full"},
        {"%s", 2, "--memory-viz FILE and/or --perfetto FILE"},
        {"%s --memory-viz", 2, "needs a value"},
        {"%s --perfetto out.json --device gpu0", 2, "--device wants a device number"},
        {"%s --perfetto - --memory-viz -", 2, "only one of"},
        {"--memory-viz /tmp/x.pickle", 2, "no log given"},
        {"%s --frobnicate", 2, "unknown option '--frobnicate'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, cases[i].args, data_path("logs/small.csv"));
        int rc = run_export(args, &out);
        cr_expect_eq(rc, cases[i].exit_code, "export %s exited %d: %s", args, rc, out);
        cr_expect(strstr(out, "poolshim: error:") && strstr(out, cases[i].message), "export %s said: %s", args, out);
        free(out);
    }
    /* a file in another format, and a broken log: FILE:LINE */
    snprintf(args, sizeof args, "'%s' --memory-viz /dev/null", json_path);
    int rc = run_export(args, &out);
    cr_expect_eq(rc, 1, "a JSON file as the log: exit %d", rc);
    cr_expect(strstr(out, "poolshim: error:") && strstr(out, json_path), "%s", out);
    free(out);
    snprintf(args, sizeof args, "'%s' --perfetto /dev/null", data_path("logs/bad/truncated.csv"));
    rc = run_export(args, &out);
    cr_expect_eq(rc, 1);
    cr_expect(strstr(out, "truncated.csv:"), "%s", out);
    free(out);
    unlink(json_path);

    rc = run_export("--help", &out);
    cr_expect_eq(rc, 0);
    cr_expect(strstr(out, "usage: poolshim export") && strstr(out, "ui.perfetto.dev"), "%s", out);
    free(out);
}
