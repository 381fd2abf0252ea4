/* Runs the shim's test programs (tests/shim/prog_*.c) over the fake CUDA
 * libraries, natively and under LD_PRELOAD=libpoolshim.so, and checks that
 * each scenario passes and that the shim really interposed. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char output[65536];

/* The shell command that runs `prog args` from the build's shimtest folder
 * with `env` prepended (preloading the shim when `preload` is set). */
static void command(char *cmd, size_t size, int preload, const char *env, const char *prog_and_args)
{
    const char *build = getenv("POOLSHIM_BUILD");
    const char *prefix = getenv("POOLSHIM_PRELOAD_PREFIX");
    cr_assert(build, "POOLSHIM_BUILD must name the build folder (make test-shim sets it)");
    snprintf(cmd, size, "env LD_LIBRARY_PATH=%s/fake %s%s%s%s%s %s %s/shimtest/%s", build,
             preload ? "LD_PRELOAD=\"" : "", preload && prefix && *prefix ? prefix : "",
             preload && prefix && *prefix ? " " : "", preload ? build : "", preload ? "/libpoolshim.so\"" : "",
             env ? env : "", build, prog_and_args);
}

/* Runs `prog args` (command() above); returns the exit status and keeps
 * stdout+stderr in `output`. */
static int run(int preload, const char *env, const char *prog_and_args)
{
    char cmd[4096];
    command(cmd, sizeof cmd - 8, preload, env, prog_and_args);
    strcat(cmd, " 2>&1");
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void expect_pass(int preload, const char *env, const char *prog, const char *active)
{
    int rc = run(preload, env, prog);
    cr_expect_eq(rc, 0, "%s (%s) exited %d:\n%s", prog, preload ? "shim" : "native", rc, output);
    cr_expect(strstr(output, active) != NULL, "%s: expected '%s' in:\n%s", prog, active, output);
}

/* Reads the statistics file a run wrote to `path` into json (NUL-ended),
 * then removes it; fails the test when there is none. */
static void take_report(const char *path, char *json, size_t size)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "no statistics written to %s; output:\n%s", path, output);
    size_t n = fread(json, 1, size - 1, f);
    json[n] = 0;
    fclose(f);
    remove(path);
}

#define SCENARIO(name)                                                                   \
    Test(runtime_door, name##_native) { expect_pass(0, NULL, "prog_runtime " #name, "shim inactive"); } \
    Test(runtime_door, name##_through_shim) { expect_pass(1, NULL, "prog_runtime " #name, "shim active"); }

SCENARIO(basic)
SCENARIO(errors)
SCENARIO(async)
SCENARIO(ipc)
SCENARIO(meminfo)
SCENARIO(devices)
SCENARIO(pinned)

/* Per-device stacks ([device.0] a pool, [device.1] an arena under a limit):
 * the exit report names each device's configured stack, not the global
 * stats and log adaptors put on top of every stack (which made every
 * device read "stats"); the multi-GPU suite checks the names on two GPUs. */
#define PER_DEVICE_OPTIONS                                                                                 \
    "POOLSHIM_OPTIONS=resource.dev0pool.type=pool,resource.dev1arena.type=arena,resource.dev1cap.type=limit," \
    "resource.dev1cap.limit=64MiB,resource.dev1cap.upstream=dev1arena,device.0.resource=dev0pool,"            \
    "device.1.resource=dev1cap"
Test(runtime_door, per_device_stacks_are_named_in_the_report)
{
    char log[128], env[1024];
    snprintf(log, sizeof log, "/tmp/poolshim-stacks-%d.csv", getpid());
    expect_pass(1, PER_DEVICE_OPTIONS " POOLSHIM_STATS=json", "prog_runtime devices", "shim active");
    cr_expect(strstr(output, "{\"device\": 0, \"stack\": \"dev0pool\""), "device 0's stack:\n%s", output);
    cr_expect(strstr(output, "{\"device\": 1, \"stack\": \"dev1cap\""), "device 1's stack:\n%s", output);
    snprintf(env, sizeof env, "%s POOLSHIM_STATS=text POOLSHIM_LOG=%s", PER_DEVICE_OPTIONS, log);
    expect_pass(1, env, "prog_runtime devices", "shim active");
    cr_expect(strstr(output, "poolshim: device 0 (stack: dev0pool)"), "with a log adaptor too:\n%s", output);
    cr_expect(strstr(output, "poolshim: device 1 (stack: dev1cap)"), "with a log adaptor too:\n%s", output);
    remove(log);
    snprintf(log + strlen(log), sizeof log - strlen(log), ".1");
    remove(log);
}

/* ---- several devices: copies of pooled (mapped) memory with another device current ---- */
#define TWO_VMM_DEVICES "FAKE_CUDA_VMM=1 FAKE_CUDA_DEVICES=2"
Test(multi_device, copies_with_the_other_device_current_native)
{
    expect_pass(0, TWO_VMM_DEVICES, "prog_static cross_copy", "shim inactive");
}
Test(multi_device, copies_with_the_other_device_current_are_granted_and_ordered)
{
    expect_pass(1, TWO_VMM_DEVICES, "prog_static cross_copy", "shim active");
    cr_expect(strstr(output, "cross_copy: 6 records, 6 waits"), "ordered:\n%s", output);
}
/* negative controls: without the grant the fake refuses the copies; without
 * the ordering the scenario sees no records and waits */
Test(multi_device, negative_control_no_grant_refuses_the_copies)
{
    int rc = run(1, TWO_VMM_DEVICES " POOLSHIM_TEST_SKIP_PEER_GRANT=1", "prog_static cross_copy");
    cr_expect(rc != 0 && strstr(output, "HtoD into device 1's block refused"), "rc %d:\n%s", rc, output);
}
Test(multi_device, negative_control_no_ordering_is_caught)
{
    int rc = run(1, TWO_VMM_DEVICES " POOLSHIM_TEST_SKIP_COPY_ORDER=1", "prog_static cross_copy");
    cr_expect(rc != 0 && strstr(output, "not ordered with device 1"), "rc %d:\n%s", rc, output);
}
/* a program that uses one device of two names no other in its mappings; the
 * second is granted when it first copies the first's memory (copy_order.c),
 * and named from the start in its own; without the grant the copy fails */
Test(multi_device, the_second_device_is_granted_when_it_comes_in_use_native)
{
    expect_pass(0, TWO_VMM_DEVICES, "prog_static lazy_grant", "shim inactive");
}
Test(multi_device, the_second_device_is_granted_when_it_comes_in_use)
{
    expect_pass(1, TWO_VMM_DEVICES, "prog_static lazy_grant", "shim active");
    cr_expect(strstr(output, "lazy_grant: ") && !strstr(output, "lazy_grant: 0 grants"), "granted at the copy:\n%s",
              output);
}
Test(multi_device, negative_control_no_grant_refuses_the_second_device)
{
    int rc = run(1, TWO_VMM_DEVICES " POOLSHIM_TEST_SKIP_PEER_GRANT=1", "prog_static lazy_grant");
    cr_expect(rc != 0 && strstr(output, "DtoH of device 0's block refused"), "rc %d:\n%s", rc, output);
}
/* a device another cannot reach (no peer capability) gets chunks: copies work as natively */
Test(multi_device, without_peer_capability_the_pool_uses_chunks)
{
    expect_pass(1, TWO_VMM_DEVICES " FAKE_CUDA_NO_PEER=1 POOLSHIM_VERBOSE=2", "prog_static cross_copy chunks", "shim active");
    cr_expect(strstr(output, "cannot reach its memory"), "said why:\n%s", output);
    cr_expect(strstr(output, "cross_copy: 0 records, 0 waits"), "chunks need no ordering:\n%s", output);
}

/* pointer queries of a pooled block answer as for cuMemAlloc memory (the
 * native run is the reference: the same checks pass over plain memory) */
Test(multi_device, pointer_attributes_native) { expect_pass(0, "FAKE_CUDA_VMM=1", "prog_static attributes", "shim inactive"); }
Test(multi_device, pointer_attributes_of_a_pooled_block)
{
    expect_pass(1, "FAKE_CUDA_VMM=1", "prog_static attributes", "shim active");
}
Test(multi_device, pointer_attributes_of_a_chunked_block)
{
    expect_pass(1, "POOLSHIM_OPTIONS=resource.main.expandable=0", "prog_static attributes chunks", "shim active");
}

/* ---- IPC of pooled memory (tests/shim/prog_ipc.c) ------------------------------ */
Test(ipc, two_processes_share_a_pooled_block)
{
    expect_pass(1, "FAKE_CUDA_VMM=1", "prog_ipc share", "shim active");
    cr_expect(strstr(output, "stale handle") != NULL, "the stale handle's error names it:\n%s", output);
    cr_expect(strstr(output, "cannot open its own IPC handle") != NULL, "own handle refused with why:\n%s", output);
}

Test(ipc, counted_in_each_process_exit_report)
{
    expect_pass(1, "FAKE_CUDA_VMM=1 POOLSHIM_STATS=json", "prog_ipc share", "shim active");
    /* the exporter: 5 cudaIpcGetMemHandle calls, its own and a damaged handle
     * refused (driver handles pass through, uncounted); the importer opens
     * twice; the stale open is refused */
    cr_expect(strstr(output, "\"ipc\": {\"exported\": 5, \"opened\": 0, \"refused\": 2}") != NULL, "exporter:\n%s", output);
    cr_expect(strstr(output, "\"ipc\": {\"exported\": 0, \"opened\": 2, \"refused\": 0}") != NULL, "importer:\n%s", output);
    cr_expect(strstr(output, "\"ipc\": {\"exported\": 0, \"opened\": 0, \"refused\": 1}") != NULL, "stale:\n%s", output);
    expect_pass(1, "POOLSHIM_STATS=text", "prog_ipc refused", "shim active");
    cr_expect(strstr(output, "poolshim: IPC handles exported 0, opened 0, refused 1") != NULL, "text:\n%s", output);
}

/* Negative control: the test switch maps the pieces out of order in the
 * importer; the share scenario must notice (wrong bytes both ways). */
Test(ipc, negative_control_pieces_out_of_order_are_caught)
{
    int rc = run(1, "FAKE_CUDA_VMM=1 POOLSHIM_TEST_IPC_SKEW=1", "prog_ipc share");
    cr_expect_neq(rc, 0, "the share scenario passed with the pieces out of order:\n%s", output);
    cr_expect(strstr(output, "the exporter's pattern") != NULL, "the importer saw wrong bytes:\n%s", output);
}

Test(ipc, refused_over_the_chunked_pool)
{
    expect_pass(1, NULL, "prog_ipc refused", "shim active");
    cr_expect(strstr(output, "cannot be exported") != NULL, "says why:\n%s", output);
}

Test(ipc, refused_with_ipc_off) { expect_pass(1, "FAKE_CUDA_VMM=1 POOLSHIM_OPTIONS=global.ipc=0", "prog_ipc refused", "shim active"); }

Test(ipc, refused_without_posix_fd_handles)
{
    expect_pass(1, "FAKE_CUDA_VMM=1 FAKE_CUDA_VMM_NO_FD=1", "prog_ipc refused", "shim active");
}

Test(ipc, refused_when_cumemcreate_refuses_exportable_memory)
{
    expect_pass(1, "FAKE_CUDA_VMM=1 FAKE_CUDA_VMM_REFUSE_FD=1", "prog_ipc refused", "shim active");
    cr_expect(strstr(output, "cuMemCreate refused memory exportable") != NULL, "warns once:\n%s", output);
}

Test(ipc, direct_allocations_export_natively)
{
    expect_pass(1, "FAKE_CUDA_VMM=1 POOLSHIM_OPTIONS=global.direct_min_size=1MiB", "prog_ipc refused", "shim active");
}

Test(ipc, native_export_without_the_shim) { expect_pass(0, "FAKE_CUDA_VMM=1", "prog_ipc refused", "shim inactive"); }

Test(runtime_door, pinned_host_pool_off_passes_everything_through)
{
    expect_pass(1, "POOLSHIM_OPTIONS=host.enable=0", "prog_runtime pinned", "shim active");
}

Test(runtime_door, pinned_with_lagging_events_and_a_tiny_bound)
{
    expect_pass(1, "FAKE_CUDA_EVENTS_PENDING=3 POOLSHIM_OPTIONS=host.pending_wait_bytes=0,host.pending_wait_percent=1",
                "prog_runtime pinned", "shim active");
}

/* host.expandable (default: auto): with virtual memory and host locations
 * (FAKE_CUDA_VMM=1) pinned blocks come from one range of host-located
 * cuMemCreate pieces that the host and the device may access; no
 * cuMemHostAlloc at all. host.expandable=0, or a driver without host
 * locations, keeps slabs; so does debug.nvtx unless host.expandable=1. */
Test(runtime_door, pinned_from_the_default_host_range)
{
    expect_pass(1, "FAKE_CUDA_VMM=1", "prog_runtime pinned", "shim active");
}

Test(runtime_door, pinned_host_range_on_two_devices)
{
    expect_pass(1, "FAKE_CUDA_VMM=1 FAKE_CUDA_DEVICES=2", "prog_runtime pinned", "shim active");
}

Test(runtime_door, pinned_host_range_skips_a_device_that_refuses_access)
{
    expect_pass(1, "FAKE_CUDA_VMM=1 FAKE_CUDA_DEVICES=2 FAKE_CUDA_REFUSE_ACCESS=1", "prog_runtime pinned",
                "shim active");
    const char *said = strstr(output, "device 1 refuses access to pinned memory");
    cr_expect(said != NULL, "the refusal is named:\n%s", output);
    cr_expect(said && !strstr(said + 1, "device 1 refuses access to pinned memory"), "once:\n%s", output);
}

Test(runtime_door, pinned_slabs_with_expandable_off)
{
    expect_pass(1, "FAKE_CUDA_VMM=1 POOLSHIM_OPTIONS=host.expandable=0", "prog_runtime pinned", "shim active");
}

Test(runtime_door, pinned_slabs_without_host_locations)
{
    expect_pass(1, "FAKE_CUDA_VMM=1 FAKE_CUDA_VMM_NO_HOST=1", "prog_runtime pinned", "shim active");
    cr_expect(!strstr(output, "host.expandable"), "falling back is silent:\n%s", output);
    expect_pass(1, "FAKE_CUDA_VMM=1 FAKE_CUDA_VMM_NO_HOST=1 POOLSHIM_OPTIONS=host.expandable=1", "prog_runtime pinned",
                "shim active");
    cr_expect(strstr(output, "host.expandable: this driver cannot map pinned host memory"), "asked for: a warning:\n%s",
              output);
}

Test(runtime_door, pinned_figures_in_the_exit_report)
{
    expect_pass(1, "POOLSHIM_STATS=json", "prog_runtime pinned", "\"host\": {\"enabled\": 1");
    expect_pass(1, "POOLSHIM_STATS=text", "prog_runtime pinned", "poolshim:   pinned ");
}

/* [host] adaptors through the shim: the limit refuses (the program checks
 * it), the track adaptor reports the block left live, the stats adaptor
 * counts the refusal, the log adaptor writes every pinned call */
Test(runtime_door, pinned_adaptors_limit_track_stats_log)
{
    char dir[] = "/tmp/ps_shim_host_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char env[1024], path[256];
    snprintf(path, sizeof path, "%s/pinned.csv", dir);
    snprintf(env, sizeof env, "POOLSHIM_STATS=json POOLSHIM_OPTIONS=host.limit=1MiB,host.track=yes,host.log_file=%s",
             path);
    expect_pass(1, env, "prog_runtime pinned_adaptors", "shim active");
    cr_expect(strstr(output, "track 'host.track': 1 allocation (3.91 KiB) never freed"), "%s", output);
    cr_expect(strstr(output, "\"bound_waits\": 0, \"failures\": 1, \"live_peak\": 2}"), "%s", output);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no pinned log at %s", path);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    int allocs = 0, frees = 0, failures = 0;
    for (char *p = text; (p = strstr(p, ",allocate,")); p++)
        allocs++;
    for (char *p = text; (p = strstr(p, ",free,")); p++)
        frees++;
    for (char *p = text; (p = strstr(p, ",allocate failure,")); p++)
        failures++;
    cr_expect_eq(allocs, 3, "3 pinned allocations logged:\n%s", text);
    cr_expect_eq(frees, 2, "2 pinned frees logged:\n%s", text);
    cr_expect_eq(failures, 1, "the refusal logged:\n%s", text);
    cr_expect(strstr(text, ",524288,0x0\n") && strstr(text, ",4000,0x0\n"), "sizes logged:\n%s", text);
    unlink(path);
    rmdir(dir);
    /* negative control: the same program without the limit must see every call succeed */
    expect_pass(1, "POOLSHIM_OPTIONS=host.track=yes", "prog_runtime pinned_adaptors", "shim active");
    cr_expect(strstr(output, "track 'host.track': 1 allocation") != NULL, "%s", output);
    expect_pass(0, NULL, "prog_runtime pinned_adaptors", "shim inactive");
}

Test(driver_door, pinned_native) { expect_pass(0, NULL, "prog_static pinned", "shim inactive"); }
Test(driver_door, pinned_through_shim) { expect_pass(1, NULL, "prog_static pinned", "shim active"); }
Test(driver_door, pinned_from_the_host_range) { expect_pass(1, "FAKE_CUDA_VMM=1", "prog_static pinned", "shim active"); }

Test(runtime_door, threads_native) { expect_pass(0, NULL, "prog_runtime threads", "shim inactive"); }
Test(runtime_door, threads_through_shim) { expect_pass(1, NULL, "prog_runtime threads", "shim active"); }

/* ---- process life: fork, exit, signals ---------------------------------------- */
/* (No Criterion .timeout here: under load its timer leaks 48 bytes that
 * LeakSanitizer reports at the runner's exit. The programs stand watch
 * themselves: alarm() in each child and in exit_thread, a watchdog thread in
 * signals.) */
/* 50 forks while 4 threads allocate and free (one stream-ordered): each
 * child finds the shim passing through, and CUDA's own answer ("not
 * initialised" in a child of an initialised process) for cudaMalloc,
 * cudaFree of a parent's pooled block, cuMemAlloc, cuStreamDestroy and
 * cuDevicePrimaryCtxReset (the calls reached the fake driver), and exits
 * through its atexit handlers within 10 s; the parent goes on. */
Test(life, fork_while_four_threads_allocate_leaves_the_child_passing_through)
{
    /* LeakSanitizer cannot stop the other threads in a forked child and
     * then fails or hangs at its exit ("Running thread ... was not
     * suspended"), with or without the shim: leak checks off here */
    expect_pass(0, "ASAN_OPTIONS=detect_leaks=0", "prog_runtime forks", "shim inactive");
    expect_pass(1, "ASAN_OPTIONS=detect_leaks=0", "prog_runtime forks", "shim active");
    expect_pass(1, "ASAN_OPTIONS=detect_leaks=0 POOLSHIM_STATS=text", "prog_runtime forks", "shim active");
}

/* How many driver calls came after the runtime's teardown at exit (the
 * fake driver prints it when nonzero). */
static unsigned long calls_after_teardown(void)
{
    const char *p = strstr(output, "fake libcuda: ");
    while (p && !strstr(p, "calls after the runtime was torn down"))
        p = strstr(p + 1, "fake libcuda: ");
    if (!p)
        return 0;
    unsigned long n = strtoul(p + strlen("fake libcuda: "), NULL, 10);
    return strncmp(strchr(p + strlen("fake libcuda: "), ' '), " calls after the runtime", 24) == 0 ? n : 0;
}

/* Return from main with live blocks, pending frees, stream-ordered blocks
 * and a pinned block: the exit report prints, and no CUDA call comes after
 * the runtime's teardown. */
Test(life, exit_with_live_blocks_and_pending_frees_reports_from_memory)
{
    char env[512];
    const char *with[] = {"POOLSHIM_STATS=text", "POOLSHIM_STATS=json", "POOLSHIM_STATS=text POOLSHIM_LOG=%s"};
    const char *report[] = {"poolshim: device 0 (stack:", "{\"poolshim\": 1", "poolshim: device 0 (stack:"};
    char log[128];
    snprintf(log, sizeof log, "/tmp/poolshim-exit-%d.csv", getpid());
    expect_pass(0, "FAKE_CUDA_EVENTS_PENDING=3", "prog_runtime exit_live", "shim inactive");
    cr_expect_eq(calls_after_teardown(), 0, "native:\n%s", output);
    for (size_t i = 0; i < sizeof with / sizeof with[0]; i++) {
        snprintf(env, sizeof env, "FAKE_CUDA_EVENTS_PENDING=3 ");
        snprintf(env + strlen(env), sizeof env - strlen(env), with[i], log);
        expect_pass(1, env, "prog_runtime exit_live", "shim active");
        cr_expect(strstr(output, report[i]), "%s: no exit report in:\n%s", env, output);
        cr_expect_eq(calls_after_teardown(), 0, "%s: CUDA calls after the runtime's teardown:\n%s", env, output);
    }
    FILE *f = fopen(log, "r");
    cr_expect(f, "the log was not flushed at exit (%s)", log);
    if (f)
        fclose(f);
    remove(log);
}

/* The negative control: a driver call the program itself makes from an
 * atexit handler that runs after the runtime's teardown is counted. */
Test(life, a_call_after_the_runtime_teardown_is_seen)
{
    expect_pass(0, NULL, "prog_runtime exit_late_call", "shim inactive");
    cr_expect_eq(calls_after_teardown(), 1, "native:\n%s", output);
    expect_pass(1, "POOLSHIM_STATS=text", "prog_runtime exit_late_call", "shim active");
    cr_expect_eq(calls_after_teardown(), 1, "shim:\n%s", output);
}

/* exit() from a fifth thread while 4 threads allocate and free: the report
 * prints, the status is exit()'s, and the shim starts no CUDA call once
 * exit began (before that: 20471 calls after the teardown). A call already
 * inside the shim at that moment may finish after it: a few calls per
 * thread at most. */
Test(life, exit_from_another_thread_while_threads_allocate)
{
    for (int round = 0; round < 5; round++) {
        expect_pass(0, NULL, "prog_runtime exit_thread", "shim inactive");
        expect_pass(1, "POOLSHIM_STATS=text", "prog_runtime exit_thread", "shim active");
        cr_expect(strstr(output, "poolshim: device 0 (stack:"), "no exit report in:\n%s", output);
        cr_expect_leq(calls_after_teardown(), 64, "CUDA calls after the runtime's teardown:\n%s", output);
        expect_pass(1, "POOLSHIM_STATS=json", "prog_runtime exit_thread", "shim active");
        cr_expect(strstr(output, "{\"poolshim\": 1"), "no exit report in:\n%s", output);
        cr_expect_leq(calls_after_teardown(), 64, "CUDA calls after the runtime's teardown:\n%s", output);
    }
}

/* SIGALRM every 20 µs while 3 threads allocate, fill, check and free (the
 * handler only counts): no deadlock, no failed call, no overwritten
 * block, and the statistics add up. */
Test(life, signal_storm_during_allocations)
{
    expect_pass(0, NULL, "prog_runtime signals", "shim inactive");
    expect_pass(1, "POOLSHIM_STATS=json", "prog_runtime signals", "shim active");
    cr_expect(strstr(output, "\"cudaMalloc\": 150000"), "150000 cudaMalloc in:\n%s", output);
    cr_expect(strstr(output, "\"cudaFree\": 150000"), "150000 cudaFree in:\n%s", output);
    cr_expect(strstr(output, "\"requested_current\": 0"), "nothing outstanding in:\n%s", output);
    cr_expect(strstr(output, "\"in_use\": 0"), "nothing in use in:\n%s", output);
}

/* Statistics counted per thread (shim/stats.c): with 8 threads done, the
 * calls and bytes are exact sums, the peaks within their bound (8 blocks
 * live at least; at most 4 of every thread at once, plus (threads + 1)
 * flush thresholds of 4 MiB), and the time an estimate from sampled calls. */
static long long json_after(const char *from, const char *key)
{
    const char *at = strstr(from, key);
    return at ? strtoll(at + strlen(key), NULL, 10) : -1;
}

Test(stats, per_thread_counts_add_up_and_peaks_stay_in_their_bound)
{
    expect_pass(1, "POOLSHIM_STATS=json", "prog_runtime stats_threads", "shim active");
    long long live = 0, total = 0, most = 0, host_live = 0, host_total = 0;
    for (int i = 0; i < 8; i++) {
        long long n = 1000 + 4096 * i, h = (64 << 10) + i;
        live += n;
        total += 1600 * n;
        most += 4 * n;
        host_live += h;
        host_total += 200 * h;
    }
    const char *json = strstr(output, "{\"poolshim\": 1");
    cr_assert_not_null(json, "no report in:\n%s", output);
    cr_expect_eq(json_after(json, "\"cudaMalloc\": "), 8 * 1600, "%s", json);
    cr_expect_eq(json_after(json, "\"cudaFree\": "), 8 * 1600 - 8, "%s", json);
    cr_expect_eq(json_after(json, "\"requested_current\": "), live, "%s", json);
    cr_expect_eq(json_after(json, "\"requested_total\": "), total, "%s", json);
    long long peak = json_after(json, "\"requested_peak\": "), bound = 9LL * (4 << 20);
    cr_expect(peak >= live && peak <= most + bound, "peak %lld outside [%lld, %lld]", peak, live, most + bound);
    cr_expect_gt(json_after(json, "\"allocate\": "), 0, "the sampled time estimate: %s", json);
    const char *host = strstr(json, "\"host\": {");
    cr_assert_not_null(host, "%s", json);
    cr_expect_eq(json_after(host, "\"calls\": "), 8 * 400 - 8, "%s", host);
    cr_expect_eq(json_after(host, "\"requested_current\": "), host_live, "%s", host);
    cr_expect_eq(json_after(host, "\"requested_total\": "), host_total, "%s", host);
    long long host_peak = json_after(host, "\"requested_peak\": ");
    cr_expect(host_peak >= host_live && host_peak <= 2 * host_live + bound, "pinned peak %lld", host_peak);
    cr_expect_gt(json_after(host, "\"time_ns\": "), 0, "%s", host);
}

Test(runtime_door, out_of_memory_returns_error_and_pool_stays_usable)
{
    expect_pass(0, "FAKE_CUDA_MEMORY=268435456", "prog_runtime oom", "shim inactive");
    expect_pass(1, "FAKE_CUDA_MEMORY=268435456", "prog_runtime oom", "shim active");
}

/* ---- the out-of-memory retry (shim/oom.c) ---------------------------------------
 * prog_runtime oom_retry: 200 MiB of a 256 MiB device cudaMalloc'd and freed,
 * then the same bytes through cuMemCreate (NCCL's way, mapped and written)
 * and through cudaMallocManaged. Natively the freed memory is the device's
 * again; under the shim each must get the pool's free memory on CUDA's first
 * "out of memory", and the statistics count it. */
#define OOM_RETRY_VMM "FAKE_CUDA_VMM=1 FAKE_CUDA_MEMORY=268435456"
#define OOM_RETRY_CHUNKS "FAKE_CUDA_MEMORY=268435456"
Test(oom_retry, native_allocations_beside_the_pool_get_the_freed_memory)
{
    expect_pass(0, OOM_RETRY_VMM, "prog_runtime oom_retry", "shim inactive");
}
Test(oom_retry, cumemcreate_and_managed_get_the_pools_free_memory)
{
    expect_pass(1, OOM_RETRY_VMM " POOLSHIM_STATS=json", "prog_runtime oom_retry", "shim active");
    const char *retry = strstr(output, "\"oom_retry\": ");
    cr_assert(retry, "no oom_retry in the report:\n%s", output);
    cr_expect_geq(json_after(retry, "\"given_back\": "), 2 * 200LL << 20, "both gave the 200 MiB back:\n%s", retry);
    cr_expect_eq(json_after(retry, "\"succeeded\": "), 2, "%s", retry);
    cr_expect_eq(json_after(retry, "\"failed\": "), 0, "%s", retry);
    cr_expect_eq(json_after(retry, "\"skipped_capture\": "), 0, "%s", retry);
    expect_pass(1, OOM_RETRY_VMM " POOLSHIM_STATS=text", "prog_runtime oom_retry", "shim active");
    cr_expect(strstr(output, "poolshim:   oom retry  400 MiB given back to CUDA allocations the pool does not serve; "
                             "retried 2 (2 succeeded, 0 failed)"),
              "the text report's line:\n%s", output);
}
Test(oom_retry, managed_gets_the_free_chunks)
{
    expect_pass(1, OOM_RETRY_CHUNKS " POOLSHIM_STATS=json", "prog_runtime oom_retry", "shim active");
    const char *retry = strstr(output, "\"oom_retry\": ");
    cr_assert(retry, "no oom_retry in the report:\n%s", output);
    cr_expect_geq(json_after(retry, "\"given_back\": "), 200LL << 20, "%s", retry);
    cr_expect_eq(json_after(retry, "\"succeeded\": "), 1, "%s", retry);
}
/* negative controls: with the retry off the same programs fail as they do on
 * a GPU without the retry, so the tests above can fail */
Test(oom_retry, negative_control_off_cumemcreate_runs_out_of_memory)
{
    int rc = run(1, OOM_RETRY_VMM " POOLSHIM_OPTIONS=global.oom_retry=0", "prog_runtime oom_retry");
    cr_expect(rc != 0 && strstr(output, "cuMemCreate 7 of 25 (8 MiB) returned 2"), "rc %d:\n%s", rc, output);
}
Test(oom_retry, negative_control_off_managed_runs_out_of_memory)
{
    int rc = run(1, OOM_RETRY_CHUNKS " POOLSHIM_OPTIONS=global.oom_retry=0", "prog_runtime oom_retry");
    cr_expect(rc != 0 && strstr(output, "cudaMallocManaged 0 of 25 returned 2"), "rc %d:\n%s", rc, output);
}
/* prog_runtime oom_retry_capture (under the shim only: natively nothing runs
 * out): a capture is open on a non-blocking stream when cuMemCreate needs the
 * pool's memory. The shim must not give it back then (the trim's device
 * synchronize would invalidate the capture): the create keeps CUDA's "out of
 * memory" and the fake saw no synchronize during the capture; once the
 * capture ended, the create succeeds. */
Test(oom_retry, an_open_capture_keeps_the_pools_memory_and_the_capture)
{
    expect_pass(1, OOM_RETRY_VMM " POOLSHIM_STATS=json", "prog_runtime oom_retry_capture", "shim active");
    const char *retry = strstr(output, "\"oom_retry\": ");
    cr_assert(retry, "no oom_retry in the report:\n%s", output);
    cr_expect_eq(json_after(retry, "\"skipped_capture\": "), 1, "%s", retry);
    cr_expect_eq(json_after(retry, "\"succeeded\": "), 1, "%s", retry);
}
/* negative control: with the capture checks switched off the shim gives the
 * memory back inside the capture, and the scenario sees the synchronize */
Test(oom_retry, negative_control_ignoring_captures_synchronizes_inside_the_capture)
{
    int rc = run(1, OOM_RETRY_VMM " POOLSHIM_TEST_IGNORE_CAPTURES=1", "prog_runtime oom_retry_capture");
    cr_expect(rc != 0 && strstr(output, "the device was synchronized during the capture"), "rc %d:\n%s", rc, output);
}

/* prog_runtime sync_in_capture: a thread-local capture is open on one stream
 * while another thread frees pooled memory, across streams and by cudaFree.
 * No stack may synchronize the context or make the capturing stream wait
 * (CUDA would invalidate the capture: the GPU soak's thread-local captures
 * died of the pool's synchronize on another thread); the frees wait in the
 * reuse state instead, and serve again after the capture. */
static const char *const sync_in_capture_stacks[] = {
    "POOLSHIM_FREE_SYNC=device",
    "POOLSHIM_FREE_SYNC=device POOLSHIM_OPTIONS=resource.main.expandable=0",
    "POOLSHIM_RESOURCE=arena",
    "POOLSHIM_RESOURCE=arena POOLSHIM_FREE_SYNC=device",
    "POOLSHIM_RESOURCE=binning POOLSHIM_FREE_SYNC=device",
    "POOLSHIM_RESOURCE=fixed_size POOLSHIM_FREE_SYNC=device POOLSHIM_OPTIONS=resource.main.block_size=1MiB",
    NULL,
};
Test(captures, no_stack_synchronizes_or_waits_into_another_threads_capture)
{
    expect_pass(0, NULL, "prog_runtime sync_in_capture", "shim inactive");
    for (int i = 0; sync_in_capture_stacks[i]; i++)
        expect_pass(1, sync_in_capture_stacks[i], "prog_runtime sync_in_capture", "shim active");
}
/* negative controls: with the capture checks switched off, the pool
 * synchronizes at the free and the arena makes the capturing owner wait */
Test(captures, negative_control_ignoring_captures_synchronizes_or_waits)
{
    int rc = run(1, "POOLSHIM_FREE_SYNC=device POOLSHIM_TEST_IGNORE_CAPTURES=1", "prog_runtime sync_in_capture");
    cr_expect(rc != 0 && strstr(output, "the device was synchronized during the capture"), "rc %d:\n%s", rc, output);
    /* CUDA refuses that synchronize: the free fails, and says why (not "a bad pointer") */
    cr_expect(strstr(output, "the pool could not take the block back (a CUDA error") &&
                  !strstr(output, "not a live allocation"),
              "%s", output);
    rc = run(1, "POOLSHIM_RESOURCE=arena POOLSHIM_TEST_IGNORE_CAPTURES=1", "prog_runtime sync_in_capture");
    cr_expect(rc != 0 && strstr(output, "the capturing stream was made to wait"), "rc %d:\n%s", rc, output);
}

/* ---- neighbours (shim/neighbours.c) -------------------------------------------
 * Two programs share one fake GPU of 256 MiB (FAKE_CUDA_SHARED_CAPACITY_FILE:
 * the allocations of both are charged to one file): A (`prog_neighbours
 * give`) cudaMallocs 80% in 8 MiB blocks, frees it all and idles; then B
 * (`take`) cudaMallocs 80%. Natively B gets what A freed; under the shim A's
 * pool keeps it unless B asks A for it. The decay is off
 * (POOLSHIM_DECAY_MS=0): only the neighbours can give it. */
#define NEIGHBOURS_ENV "FAKE_CUDA_MEMORY=268435456 POOLSHIM_DECAY_MS=0 POOLSHIM_STATS=json POOLSHIM_VERBOSE=2"
static struct {
    char dir[64];          /* a temporary folder: the capacity file, A's signals and output */
    char registry[128];    /* the registry folder the programs are given ("": the default one) */
    char env[1024];        /* what every program of the test gets */
    pid_t a;               /* A, in the background, or 0 */
    char a_output[65536];  /* A's output once it ended */
} hood; /* (one per test: Criterion runs each test in a process of its own) */

static int file_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* The temporary folder; with `private_registry` the programs use DIR/registry
 * (POOLSHIM_TEST_NEIGHBOURS_DIR), else the default /dev/shm/poolshim-<uid>. */
static void hood_init(int private_registry, const char *more_env)
{
    snprintf(hood.dir, sizeof hood.dir, "/tmp/ps_neighbours_XXXXXX");
    cr_assert_not_null(mkdtemp(hood.dir));
    hood.registry[0] = 0;
    if (private_registry)
        snprintf(hood.registry, sizeof hood.registry, "%s/registry", hood.dir);
    snprintf(hood.env, sizeof hood.env, NEIGHBOURS_ENV " FAKE_CUDA_SHARED_CAPACITY_FILE=%s/capacity %s%s %s", hood.dir,
             private_registry ? "POOLSHIM_TEST_NEIGHBOURS_DIR=" : "", hood.registry, more_env ? more_env : "");
    char path[128];
    snprintf(path, sizeof path, "%s/wait_ready", hood.dir); /* B waits for A's "ready" */
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fclose(f);
}

static void hood_cleanup(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", hood.dir);
    cr_expect_eq(system(cmd), 0);
}

/* Starts `prog args` (command() above) in the background, its output in
 * the file `out`; returns its pid (the program's own: sh execs it). */
static pid_t start_background(int preload, const char *env, const char *prog_and_args, const char *out)
{
    char cmd[4096], full[4400];
    command(cmd, sizeof cmd, preload, env, prog_and_args);
    snprintf(full, sizeof full, "exec %s > %s 2>&1", cmd, out);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Waits up to `seconds` for `path` to exist; false also when `pid` ended first. */
static bool wait_for_file(const char *path, pid_t pid, int seconds)
{
    for (int i = 0; i < seconds * 200; i++) {
        if (file_exists(path))
            return true;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return false;
        usleep(5000);
    }
    return false;
}

/* A program in the background, `prog_neighbours give SIGNALS [DEVICE]`, under
 * the shim when `preload`; returns once it freed its memory (SIGNALS/ready). */
static pid_t start_giver(int preload, const char *env, const char *signals, const char *device, const char *out)
{
    char args[256], all_env[2048], ready[256];
    snprintf(args, sizeof args, "prog_neighbours give %s %s", signals, device ? device : "");
    snprintf(all_env, sizeof all_env, "%s %s", hood.env, env ? env : "");
    pid_t pid = start_background(preload, all_env, args, out);
    snprintf(ready, sizeof ready, "%s/ready", signals);
    cr_assert(wait_for_file(ready, pid, 10), "%s did not get ready (see %s)", args, out);
    return pid;
}

static void start_a(int preload, const char *env, const char *device)
{
    char out[128];
    snprintf(out, sizeof out, "%s/a.txt", hood.dir);
    hood.a = start_giver(preload, env, hood.dir, device, out);
}

/* B in the foreground: `prog_neighbours ROLE DIR [DEVICE]` (take or create);
 * its exit status, its output in `output`. */
static int run_b(int preload, const char *env, const char *role, const char *device)
{
    char args[256], all_env[2048];
    snprintf(args, sizeof args, "prog_neighbours %s %s %s", role, hood.dir, device ? device : "");
    snprintf(all_env, sizeof all_env, "%s %s", hood.env, env ? env : "");
    return run(preload, all_env, args);
}

/* Lets A end (it idles until DIR/release, which B made), its output in hood.a_output. */
static void end_a(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/release", hood.dir);
    FILE *f = fopen(path, "w");
    if (f)
        fclose(f);
    int status = -1, ended = 0;
    for (int i = 0; i < 2000 && !ended; i++) {
        ended = waitpid(hood.a, &status, WNOHANG) == hood.a;
        if (!ended)
            usleep(5000);
    }
    if (!ended) {
        kill(hood.a, SIGKILL);
        waitpid(hood.a, &status, 0);
    }
    snprintf(path, sizeof path, "%s/a.txt", hood.dir);
    f = fopen(path, "r");
    size_t n = f ? fread(hood.a_output, 1, sizeof hood.a_output - 1, f) : 0;
    hood.a_output[n] = 0;
    if (f)
        fclose(f);
    cr_expect(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0, "A did not end well:\n%s", hood.a_output);
    hood.a = 0;
}

/* A figure of the first device's "give_back" in a JSON report (-1: none). */
static long long give_back(const char *report, const char *key)
{
    const char *g = strstr(report, "\"give_back\": ");
    return g ? json_after(g, key) : -1;
}

/* The milliseconds printed after `marker` (-1: no such text). */
static double ms_after(const char *text, const char *marker)
{
    const char *at = strstr(text, marker);
    return at ? strtod(at + strlen(marker), NULL) : -1;
}

/* This process's start time (field 22 of /proc/self/stat). */
static unsigned long long own_start(void)
{
    char buf[1024] = "";
    FILE *f = fopen("/proc/self/stat", "r");
    cr_assert_not_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')') + 2;
    for (int field = 3; field < 22; field++)
        p = strchr(p, ' ') + 1;
    return strtoull(p, NULL, 10);
}

static unsigned long long own_pid_namespace(void)
{
    struct stat st;
    cr_assert_eq(stat("/proc/self/ns/pid", &st), 0);
    return (unsigned long long)st.st_ino;
}

/* The fake GPU's UUID as the registry writes it (the programs' device 0). */
static void fake_uuid(char *out, size_t size)
{
    cr_assert_eq(run(0, hood.env, "prog_neighbours uuid"), 0, "%s", output);
    cr_assert(strncmp(output, "GPU-", 4) == 0, "%s", output);
    snprintf(out, size, "%.40s", output);
}

/* The address of a socket `name``suffix` in the registry. */
static void socket_address(struct sockaddr_un *a, const char *name, const char *suffix)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strlen(hood.registry) + 1 + strlen(name) + strlen(suffix);
    cr_assert_lt(n, sizeof a->sun_path, "%s/%s%s: too long for a socket", hood.registry, name, suffix);
    memcpy(a->sun_path, hood.registry, strlen(hood.registry));
    a->sun_path[strlen(hood.registry)] = '/';
    memcpy(a->sun_path + strlen(hood.registry) + 1, name, strlen(name));
    memcpy(a->sun_path + strlen(hood.registry) + 1 + strlen(name), suffix, strlen(suffix));
}

/* A registry entry as a process would leave it: NAME.gpus listing `uuid`
 * and NAME.sock, a socket that nobody is bound to any more (`live` 0) or
 * one bound and kept by this test, which never answers (returns its fd). */
static int fabricate_entry(const char *name, const char *uuid, int live)
{
    char path[256];
    mkdir(hood.registry, 0700); /* (A registers nothing in some tests) */
    snprintf(path, sizeof path, "%s/%s.gpus", hood.registry, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fprintf(f, "poolshim neighbours 1\n%s\n", uuid);
    fclose(f);
    chmod(path, 0600);
    struct sockaddr_un a;
    socket_address(&a, name, ".sock");
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0, "bind %s", a.sun_path);
    if (!live) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A pid no process has now (a child that ended). */
static pid_t pid_of_the_dead(void)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0);
    return pid;
}

Test(neighbours, native_the_second_program_gets_the_freed_memory)
{
    hood_init(1, NULL);
    start_a(0, NULL, NULL);
    int rc = run_b(0, NULL, "take", NULL);
    end_a();
    cr_expect_eq(rc, 0, "%s", output);
    cr_expect(strstr(output, "take: 25 of 25 blocks"), "%s", output);
    hood_cleanup();
}

/* (the default registry, /dev/shm/poolshim-<uid>: other tests' programs may
 * be there too, on GPUs of other UUIDs) */
Test(neighbours, a_shimmed_neighbour_gives_its_free_memory_within_a_second)
{
    hood_init(0, NULL);
    start_a(1, NULL, NULL);
    int rc = run_b(1, NULL, "take", NULL);
    end_a();
    cr_expect_eq(rc, 0, "B:\n%s\nA:\n%s", output, hood.a_output);
    cr_expect(strstr(output, "take: 25 of 25 blocks"), "%s", output);
    double slowest = ms_after(output, "(the slowest ");
    cr_expect(slowest >= 0 && slowest < 1000, "the slowest cudaMalloc took %.1f ms:\n%s", slowest, output);
    long long given = give_back(hood.a_output, "\"to_neighbours\": ");
    cr_expect_geq(given, 150LL << 20, "A gave %lld bytes to its neighbour:\n%s", given, hood.a_output);
    cr_expect_eq(give_back(output, "\"neighbour_requests\": "), 1, "%s", output);
    cr_expect_eq(give_back(output, "\"neighbour_answers\": "), 1, "%s", output);
    cr_expect_eq(give_back(output, "\"from_neighbours\": "), given, "B heard what A gave:\n%s", output);
    hood_cleanup();
}

/* negative controls: B that does not ask, and A that does not answer (with
 * neighbour_release off a process neither asks nor registers), run out of
 * memory as they do on a GPU without neighbours */
Test(neighbours, negative_control_off_the_second_program_runs_out_of_memory)
{
    hood_init(1, NULL);
    start_a(1, NULL, NULL);
    int rc = run_b(1, "POOLSHIM_OPTIONS=global.neighbour_release=0", "take", NULL);
    end_a();
    cr_expect(rc != 0 && strstr(output, "returned 2 (2: out of memory)"), "rc %d:\n%s", rc, output);
    cr_expect_eq(give_back(output, "\"neighbour_requests\": "), 0, "%s", output);
    cr_expect_eq(give_back(hood.a_output, "\"to_neighbours\": "), 0, "%s", hood.a_output);
    hood_cleanup();
}

Test(neighbours, negative_control_a_neighbour_with_it_off_gives_nothing)
{
    hood_init(1, NULL);
    start_a(1, "POOLSHIM_OPTIONS=global.neighbour_release=0", NULL);
    int rc = run_b(1, NULL, "take", NULL);
    end_a();
    cr_expect(rc != 0 && strstr(output, "returned 2 (2: out of memory)"), "rc %d:\n%s", rc, output);
    cr_expect_eq(give_back(output, "\"neighbour_requests\": "), 0, "A is not in the registry:\n%s", output);
    hood_cleanup();
}

/* The out-of-memory retry of a call the shim leaves to CUDA (shim/oom.c)
 * asks the neighbours too, also in a process that built no stack (one that
 * only ever calls cuMemCreate, as JAX or NCCL may). Its counters are in no
 * report (no device of its has a stack): its log line says it. */
Test(neighbours, cumemcreate_without_a_stack_gets_a_neighbours_memory)
{
    hood_init(1, "FAKE_CUDA_VMM=1");
    start_a(1, NULL, NULL);
    int rc = run_b(1, NULL, "create", NULL);
    end_a();
    cr_expect_eq(rc, 0, "B:\n%s\nA:\n%s", output, hood.a_output);
    cr_expect(strstr(output, "create: 25 of 25 handles"), "%s", output);
    cr_expect(strstr(output, "asked 1 neighbour process(es) on this GPU, 1 answered"), "%s", output);
    cr_expect_geq(give_back(hood.a_output, "\"to_neighbours\": "), 150LL << 20, "%s", hood.a_output);
    hood_cleanup();
}
Test(neighbours, negative_control_cumemcreate_without_asking_runs_out_of_memory)
{
    hood_init(1, "FAKE_CUDA_VMM=1");
    start_a(1, NULL, NULL);
    int rc = run_b(1, "POOLSHIM_OPTIONS=global.neighbour_release=0", "create", NULL);
    end_a();
    cr_expect(rc != 0 && strstr(output, "returned 2 (2: out of memory)"), "rc %d:\n%s", rc, output);
    hood_cleanup();
}

/* A call beside the pool in a process whose own pool gives back something,
 * but not enough: the retry after that give-back runs out again, and the
 * neighbours are asked then (one 60% cuMemCreate: B's pool holds 32 MiB, A
 * holds 80% of the device). The negative control: without neighbour
 * release B keeps CUDA's error. */
Test(neighbours, a_give_back_that_is_not_enough_asks_the_neighbours)
{
    hood_init(1, "FAKE_CUDA_VMM=1");
    start_a(1, NULL, NULL);
    int rc = run_b(1, NULL, "create_big", NULL);
    end_a();
    cr_expect_eq(rc, 0, "B:\n%s\nA:\n%s", output, hood.a_output);
    cr_expect(strstr(output, "MiB returned 0 (2: out of memory)") && strstr(output, "gave back 32.0 MiB, retrying it once"),
              "%s", output);
    cr_expect_geq(give_back(hood.a_output, "\"to_neighbours\": "), 100LL << 20, "%s", hood.a_output);
    hood_cleanup();
}
Test(neighbours, negative_control_a_give_back_that_is_not_enough_without_asking)
{
    hood_init(1, "FAKE_CUDA_VMM=1");
    start_a(1, NULL, NULL);
    int rc = run_b(1, "POOLSHIM_OPTIONS=global.neighbour_release=0", "create_big", NULL);
    end_a();
    cr_expect(rc != 0 && strstr(output, "returned 2 (2: out of memory)"), "rc %d:\n%s", rc, output);
    hood_cleanup();
}

/* Entries of processes that ended: a shimmed program killed with SIGKILL
 * (its entry and socket left behind; the fake driver frees its memory), an
 * entry whose pid no process has (and a reply socket of it), and one whose
 * pid is alive but started at another time (a reused pid; its socket is
 * bound, so only the start time tells). None is asked (B sends exactly one
 * request, to A), and B's scan removes them all. */
Test(neighbours, dead_entries_are_ignored_and_removed)
{
    hood_init(1, NULL);
    char killed_dir[128], killed_out[160], uuid[48], gone[128], reused[128], path[256];
    snprintf(killed_dir, sizeof killed_dir, "%s/killed", hood.dir);
    cr_assert_eq(mkdir(killed_dir, 0700), 0);
    snprintf(killed_out, sizeof killed_out, "%s/out.txt", killed_dir);
    pid_t killed = start_giver(1, NULL, killed_dir, NULL, killed_out);
    kill(killed, SIGKILL);
    waitpid(killed, NULL, 0);
    fake_uuid(uuid, sizeof uuid);
    unsigned long long ns = own_pid_namespace();
    snprintf(gone, sizeof gone, "p%d-%llu-%llu", (int)pid_of_the_dead(), 12345ull, ns);
    fabricate_entry(gone, uuid, 0);
    snprintf(reused, sizeof reused, "p%d-%llu-%llu", (int)getpid(), own_start() + 1, ns);
    int bound = fabricate_entry(reused, uuid, 1);
    char reply[128];
    snprintf(reply, sizeof reply, "a%d-%llu-%llu-%d.sock", (int)pid_of_the_dead(), 777ull, ns, 4242);
    struct sockaddr_un a;
    socket_address(&a, reply, "");
    int stale = socket(AF_UNIX, SOCK_DGRAM, 0);
    cr_assert_eq(bind(stale, (struct sockaddr *)&a, sizeof a), 0);
    close(stale);
    char killed_entry[256] = "";
    DIR *d = opendir(hood.registry);
    for (struct dirent *e; d && (e = readdir(d));) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "p%d-", (int)killed);
        if (!strncmp(e->d_name, prefix, strlen(prefix)) && strstr(e->d_name, ".gpus"))
            snprintf(killed_entry, sizeof killed_entry, "%s/%.*s", hood.registry,
                     (int)(strlen(e->d_name) - 5), e->d_name);
    }
    if (d)
        closedir(d);
    cr_assert(killed_entry[0], "the killed program left no entry in %s", hood.registry);

    start_a(1, NULL, NULL);
    int rc = run_b(1, NULL, "take", NULL);
    end_a();
    cr_expect_eq(rc, 0, "B:\n%s\nA:\n%s", output, hood.a_output);
    cr_expect_eq(give_back(output, "\"neighbour_requests\": "), 1, "only A was asked:\n%s", output);
    cr_expect_eq(give_back(output, "\"neighbour_answers\": "), 1, "%s", output);
    cr_expect_geq(give_back(hood.a_output, "\"to_neighbours\": "), 150LL << 20, "%s", hood.a_output);
    const char *names[] = {gone, reused, killed_entry};
    for (int i = 0; i < 3; i++) {
        const char *name = names[i];
        for (int k = 0; k < 2; k++) {
            if (name[0] == '/')
                snprintf(path, sizeof path, "%s%s", name, k ? ".sock" : ".gpus");
            else
                snprintf(path, sizeof path, "%s/%s%s", hood.registry, name, k ? ".sock" : ".gpus");
            cr_expect(!file_exists(path), "%s was not removed", path);
        }
    }
    cr_expect(!file_exists(a.sun_path), "%s was not removed", a.sun_path);
    close(bound);
    hood_cleanup();
}

/* A neighbour that cannot give: A keeps its memory (neighbour_release off,
 * not registered); the registry holds a dead process's entry and a reused
 * pid's (its socket bound by this test, never answering). B's allocation
 * fails at once, not after its wait of 500 ms. */
#define WAIT_500 "POOLSHIM_OPTIONS=global.neighbour_wait_ms=500"
Test(neighbours, dead_entries_do_not_delay_a_failing_allocation)
{
    hood_init(1, NULL);
    start_a(1, "POOLSHIM_OPTIONS=global.neighbour_release=0", NULL);
    char uuid[48], name[128];
    fake_uuid(uuid, sizeof uuid);
    unsigned long long ns = own_pid_namespace();
    snprintf(name, sizeof name, "p%d-%llu-%llu", (int)pid_of_the_dead(), 12345ull, ns);
    fabricate_entry(name, uuid, 0);
    snprintf(name, sizeof name, "p%d-%llu-%llu", (int)getpid(), own_start() + 1, ns);
    int bound = fabricate_entry(name, uuid, 1);
    int rc = run_b(1, WAIT_500, "take", NULL);
    end_a();
    double took = ms_after(output, ") after ");
    cr_expect(rc != 0 && strstr(output, "returned 2 (2: out of memory)"), "rc %d:\n%s", rc, output);
    cr_expect(took >= 0 && took < 250, "the failing cudaMalloc took %.1f ms:\n%s", took, output);
    cr_expect_eq(give_back(output, "\"neighbour_requests\": "), 0, "%s", output);
    close(bound);
    hood_cleanup();
}
/* negative control: the same entry with this test's true start time is a
 * live neighbour that never answers: B waits its 500 ms for it */
Test(neighbours, negative_control_a_silent_live_neighbour_delays_by_the_wait)
{
    hood_init(1, NULL);
    start_a(1, "POOLSHIM_OPTIONS=global.neighbour_release=0", NULL);
    char uuid[48], name[128];
    fake_uuid(uuid, sizeof uuid);
    snprintf(name, sizeof name, "p%d-%llu-%llu", (int)getpid(), own_start(), own_pid_namespace());
    int bound = fabricate_entry(name, uuid, 1);
    int rc = run_b(1, WAIT_500, "take", NULL);
    end_a();
    double took = ms_after(output, ") after ");
    cr_expect(rc != 0 && strstr(output, "returned 2 (2: out of memory)"), "rc %d:\n%s", rc, output);
    cr_expect(took >= 480 && took < 1500, "the failing cudaMalloc took %.1f ms:\n%s", took, output);
    cr_expect_eq(give_back(output, "\"neighbour_requests\": "), 1, "%s", output);
    cr_expect_eq(give_back(output, "\"neighbour_answers\": "), 0, "%s", output);
    close(bound);
    hood_cleanup();
}

/* Nothing another user could write is trusted: a registry directory that
 * others may write into (mode 0777) is refused with a warning by both
 * programs, and then no one registers and no one asks: B runs out of memory
 * (the tests above are the reference: with a private directory it gets A's). */
static void expect_registry_refused(const char *why)
{
    start_a(1, NULL, NULL);
    int rc = run_b(1, NULL, "take", NULL);
    end_a();
    cr_expect(rc != 0 && strstr(output, "returned 2 (2: out of memory)"), "rc %d:\n%s", rc, output);
    cr_expect(strstr(output, "is not a private directory of this user") && strstr(output, why), "B warns:\n%s", output);
    cr_expect(strstr(hood.a_output, "is not a private directory of this user"), "A warns:\n%s", hood.a_output);
    cr_expect_eq(give_back(output, "\"neighbour_requests\": "), 0, "%s", output);
    cr_expect_eq(give_back(hood.a_output, "\"to_neighbours\": "), 0, "%s", hood.a_output);
    DIR *d = opendir(hood.registry);
    for (struct dirent *e; d && (e = readdir(d));)
        cr_expect(e->d_name[0] == '.', "%s registered in a refused directory", e->d_name);
    if (d)
        closedir(d);
}
Test(neighbours, a_registry_others_may_write_is_refused)
{
    hood_init(1, NULL);
    cr_assert_eq(mkdir(hood.registry, 0777), 0);
    cr_assert_eq(chmod(hood.registry, 0777), 0);
    expect_registry_refused("mode 777");
    hood_cleanup();
}
Test(neighbours, a_registry_of_another_user_is_refused)
{
    if (geteuid() != 0)
        cr_skip_test("only root can give a directory to another user");
    hood_init(1, NULL);
    cr_assert_eq(mkdir(hood.registry, 0700), 0);
    cr_assert_eq(chown(hood.registry, 65534, 65534), 0);
    expect_registry_refused("owner 65534");
    hood_cleanup();
}
/* an entry of another user inside the private directory is not asked */
Test(neighbours, an_entry_of_another_user_is_not_asked)
{
    if (geteuid() != 0)
        cr_skip_test("only root can give a file to another user");
    hood_init(1, NULL);
    start_a(1, NULL, NULL);
    int changed = 0;
    DIR *d = opendir(hood.registry);
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", hood.registry, e->d_name);
        if (e->d_name[0] == 'p' && strstr(e->d_name, ".gpus"))
            changed += chown(path, 65534, 65534) == 0;
    }
    if (d)
        closedir(d);
    cr_expect_eq(changed, 1, "A's entry");
    int rc = run_b(1, NULL, "take", NULL);
    end_a();
    cr_expect(rc != 0 && strstr(output, "returned 2 (2: out of memory)"), "rc %d:\n%s", rc, output);
    cr_expect_eq(give_back(output, "\"neighbour_requests\": "), 0, "%s", output);
    hood_cleanup();
}

/* GPUs are named by UUID: A allocates on its device 1, B (as if run with
 * CUDA_VISIBLE_DEVICES=1: FAKE_CUDA_FIRST_DEVICE=1) on its device 0, the
 * same GPU; A gives from its device 1. */
Test(neighbours, the_gpu_is_found_by_uuid_not_by_ordinal)
{
    hood_init(1, "FAKE_CUDA_DEVICES=2");
    start_a(1, NULL, "1");
    int rc = run_b(1, "FAKE_CUDA_FIRST_DEVICE=1", "take", "0");
    end_a();
    cr_expect_eq(rc, 0, "B:\n%s\nA:\n%s", output, hood.a_output);
    const char *device1 = strstr(hood.a_output, "{\"device\": 1");
    cr_assert_not_null(device1, "%s", hood.a_output);
    cr_expect_geq(give_back(device1, "\"to_neighbours\": "), 150LL << 20, "%s", device1);
    hood_cleanup();
}
/* negative control: B on its device 0 without the shift is another GPU
 * (physical 0, which A sees but never used): A gives nothing from its device
 * 1, and B starves (the fake's capacity is one for all its devices) */
Test(neighbours, negative_control_another_gpu_gets_nothing)
{
    hood_init(1, "FAKE_CUDA_DEVICES=2");
    start_a(1, NULL, "1");
    int rc = run_b(1, NULL, "take", "0");
    end_a();
    cr_expect(rc != 0 && strstr(output, "returned 2 (2: out of memory)"), "rc %d:\n%s", rc, output);
    cr_expect_eq(give_back(output, "\"from_neighbours\": "), 0, "%s", output);
    const char *device1 = strstr(hood.a_output, "{\"device\": 1");
    cr_assert_not_null(device1, "%s", hood.a_output);
    cr_expect_eq(give_back(device1, "\"to_neighbours\": "), 0, "%s", device1);
    hood_cleanup();
}

/* A process leaves the registry when it exits, also one with stacks on two
 * devices (the give-back thread used to be forgotten at the second stack,
 * then neither stopped nor joined, and the entry stayed: 2 files) */
Test(neighbours, an_exiting_process_leaves_the_registry)
{
    hood_init(1, NULL);
    char env[1200];
    snprintf(env, sizeof env, "%s", hood.env);
    expect_pass(1, env, "prog_runtime devices", "shim active");
    expect_pass(1, env, "prog_runtime basic", "shim active");
    int left = 0;
    DIR *d = opendir(hood.registry);
    cr_assert_not_null(d, "no registry at %s", hood.registry);
    for (struct dirent *e; (e = readdir(d));)
        left += e->d_name[0] != '.';
    closedir(d);
    cr_expect_eq(left, 0, "%d files left in %s", left, hood.registry);
    hood_cleanup();
}

/* A's freed blocks wait for a barrier its give-back records, and the fake
 * GPU passes it only at the fourth query (FAKE_CUDA_EVENTS_PENDING=3; a real
 * GPU takes microseconds): A tries again until it passed, then answers. */
Test(neighbours, memory_behind_a_barrier_is_given_once_it_passed)
{
    hood_init(1, NULL);
    start_a(1, "FAKE_CUDA_EVENTS_PENDING=3", NULL);
    int rc = run_b(1, NULL, "take", NULL);
    end_a();
    cr_expect_eq(rc, 0, "B:\n%s\nA:\n%s", output, hood.a_output);
    cr_expect_geq(give_back(hood.a_output, "\"to_neighbours\": "), 150LL << 20, "%s", hood.a_output);
    hood_cleanup();
}
/* negative control: with one give-back per request the memory stays */
Test(neighbours, negative_control_one_attempt_keeps_the_memory_behind_the_barrier)
{
    hood_init(1, NULL);
    start_a(1, "FAKE_CUDA_EVENTS_PENDING=3 POOLSHIM_TEST_NEIGHBOURS_ONE_ATTEMPT=1", NULL);
    int rc = run_b(1, NULL, "take", NULL);
    end_a();
    cr_expect(rc != 0 && strstr(output, "returned 2 (2: out of memory)"), "rc %d:\n%s", rc, output);
    cr_expect_eq(give_back(hood.a_output, "\"to_neighbours\": "), 0, "%s", hood.a_output);
    cr_expect_eq(give_back(output, "\"neighbour_answers\": "), 1, "A answered (nothing):\n%s", output);
    hood_cleanup();
}

/* ---- live statistics and `poolshim top` (shim/live.c, tools/cmd_top.c) ------- */
/*
 * Processes under the shim publish their figures in the registry every
 * 500 ms (DIR/registry here: POOLSHIM_TEST_NEIGHBOURS_DIR); `poolshim top`
 * reads them. The programs idle while top reads, so its figures must be
 * those of their exit reports (the decay is off: nothing moves). */

/* Runs `poolshim top ARGS`: stdout in `output`, stderr in `top_errors`. */
static char top_errors[8192];
static int run_top(const char *args)
{
    const char *cli = getenv("POOLSHIM_CLI");
    cr_assert(cli, "POOLSHIM_CLI must be set (make test-shim sets it)");
    char cmd[2048], err_path[160];
    snprintf(err_path, sizeof err_path, "%s/top.err", hood.dir);
    snprintf(cmd, sizeof cmd, "%s top %s 2>%s", cli, args, err_path);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int st = pclose(p);
    FILE *e = fopen(err_path, "r");
    n = e ? fread(top_errors, 1, sizeof top_errors - 1, e) : 0;
    top_errors[n] = 0;
    if (e)
        fclose(e);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A program holding N/2 blocks of 1 MiB + 1000 bytes, in the background
 * (`prog_neighbours hold`), its signals in DIR/NAME, output in DIR/NAME.txt. */
static pid_t start_holder(const char *name, int n, const char *env)
{
    char signals[160], out[200], args[256], all_env[2048], ready[200];
    snprintf(signals, sizeof signals, "%s/%s", hood.dir, name);
    cr_assert_eq(mkdir(signals, 0700), 0);
    snprintf(out, sizeof out, "%s.txt", signals);
    snprintf(args, sizeof args, "prog_neighbours hold %s %d", signals, n);
    snprintf(all_env, sizeof all_env, "%s %s", hood.env, env ? env : "");
    pid_t pid = start_background(1, all_env, args, out);
    snprintf(ready, sizeof ready, "%s/ready", signals);
    cr_assert(wait_for_file(ready, pid, 10), "%s did not get ready (see %s)", args, out);
    return pid;
}

/* Lets the holder NAME end; its output (the exit report) into `into`. */
static void end_holder(const char *name, pid_t pid, char *into, size_t size)
{
    char path[200];
    snprintf(path, sizeof path, "%s/%s/release", hood.dir, name);
    FILE *f = fopen(path, "w");
    if (f)
        fclose(f);
    int status = -1;
    bool ended = false;
    for (int i = 0; i < 2000 && !ended; i++) {
        ended = waitpid(pid, &status, WNOHANG) == pid;
        if (!ended)
            usleep(5000);
    }
    if (!ended) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    snprintf(path, sizeof path, "%s/%s.txt", hood.dir, name);
    f = fopen(path, "r");
    size_t n = f ? fread(into, 1, size - 1, f) : 0;
    into[n] = 0;
    if (f)
        fclose(f);
    cr_expect(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s did not end well:\n%s", name, into);
}

/* The process `pid` in top's JSON (NULL: not listed). */
static const char *top_process(const char *json, pid_t pid)
{
    char key[48];
    snprintf(key, sizeof key, "{\"pid\": %d, ", (int)pid);
    return strstr(json, key);
}

/* Top's figure `key` of a process against its exit report's `report_key`. */
static void expect_same(const char *process, const char *key, const char *report, const char *report_key)
{
    long long in_top = json_after(process, key), at_exit = json_after(report, report_key);
    cr_expect(in_top >= 0 && in_top == at_exit, "%s: top %lld, exit report %s %lld\n%s\n%s", key, in_top, report_key,
              at_exit, process, report);
}

/* A live page as the shim writes it, of process p<pid>-<start>-<ns> (its
 * name returned in `name`), reserving `reserved` bytes on device 0. */
static void fabricate_page(pid_t pid, char *name, size_t size, unsigned long long reserved)
{
    mkdir(hood.registry, 0700);
    snprintf(name, size, "p%d-%llu-%llu", (int)pid, own_start(), own_pid_namespace());
    char path[300];
    snprintf(path, sizeof path, "%s/%s.stats", hood.registry, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fprintf(f, "{\"poolshim_live\": 1, \"live\": 1, \"pid\": %d, \"start\": %llu, \"pidns\": %llu, \"rank\": null, "
               "\"command\": \"fabricated \\\"page\\\"\", \"time\": 1.0, \"monotonic_ns\": 1, \"period_ms\": 500, "
               "\"report\": {\"poolshim\": 1, \"pid\": %d, \"devices\": [{\"device\": 0, \"calls\": {\"cudaMalloc\": 7}, "
               "\"bytes\": {\"requested_current\": 5, \"reserved_current\": %llu}, "
               "\"oom_retry\": {\"succeeded\": 2, \"failed\": 1}}]}}\n",
            (int)pid, own_start(), own_pid_namespace(), (int)pid, reserved);
    fclose(f);
    chmod(path, 0600);
}

/* Waits (up to 10 s) until process `pid` has published a page written after
 * `after` (seconds since the epoch): its figures are those of its idle time. */
static void wait_for_fresh_page(pid_t pid, double after)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "p%d-", (int)pid);
    double written = 0;
    for (int i = 0; i < 1000 && written <= after; i++) {
        DIR *d = opendir(hood.registry);
        for (struct dirent *e; d && (e = readdir(d));) {
            size_t n = strlen(e->d_name);
            if (strncmp(e->d_name, prefix, strlen(prefix)) || n < 6 || strcmp(e->d_name + n - 6, ".stats"))
                continue;
            char path[400], text[512] = "";
            snprintf(path, sizeof path, "%s/%s", hood.registry, e->d_name);
            FILE *f = fopen(path, "r");
            size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
            text[got] = 0;
            if (f)
                fclose(f);
            const char *t = strstr(text, "\"time\": ");
            written = t ? strtod(t + 8, NULL) : 0;
        }
        if (d)
            closedir(d);
        if (written <= after)
            usleep(10000);
    }
    cr_assert_gt(written, after, "no page of %d written after it got ready", (int)pid);
}

static double wall_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* (a) two programs on one fake GPU, each idling with blocks it holds (A 4,
 * B 8 of 1 MiB + 1000 bytes; each freed as many); top lists both with the
 * figures their exit reports give. */
static void expect_top_matches_exit_reports(const char *env, int listed)
{
    hood_init(1, env);
    pid_t a = start_holder("a", 8, NULL);
    pid_t b = start_holder("b", 16, "RANK=5");
    if (listed) {
        double ready = wall_now();
        wait_for_fresh_page(a, ready);
        wait_for_fresh_page(b, ready);
    } else {
        usleep(800 * 1000); /* (more than a period: a page would be there) */
    }
    char cmd[256];
    static char top_json[65536], a_report[65536], b_report[65536];
    snprintf(cmd, sizeof cmd, "--once --json --dir %s", hood.registry);
    int rc = run_top(cmd);
    snprintf(top_json, sizeof top_json, "%s", output);
    end_holder("a", a, a_report, sizeof a_report);
    end_holder("b", b, b_report, sizeof b_report);
    cr_expect_eq(rc, 0, "top: %d\n%s%s", rc, output, top_errors);
    const char *in_a = top_process(top_json, a), *in_b = top_process(top_json, b);
    if (!listed) {
        cr_expect(!in_a && !in_b, "listed without publishing:\n%s", top_json);
        cr_expect(strstr(top_json, "\"processes\": []"), "%s", top_json);
        hood_cleanup();
        return;
    }
    cr_assert(in_a && in_b, "A (%d) and B (%d) in:\n%s", (int)a, (int)b, top_json);
    const char *reports[2] = {a_report, b_report}, *processes[2] = {in_a, in_b};
    for (int i = 0; i < 2; i++) {
        const char *report = strstr(reports[i], "{\"poolshim\": 1");
        cr_assert(report, "no exit report:\n%s", reports[i]);
        expect_same(processes[i], "\"requested_current\": ", report, "\"requested_current\": ");
        expect_same(processes[i], "\"requested_peak\": ", report, "\"requested_peak\": ");
        expect_same(processes[i], "\"reserved_current\": ", report, "\"reserved_current\": ");
        expect_same(processes[i], "\"reserved_peak\": ", report, "\"reserved_peak\": ");
        expect_same(processes[i], "\"allocations\": ", report, "\"cudaMalloc\": ");
        expect_same(processes[i], "\"barriers\": ", report, "\"barriers\": ");
        expect_same(processes[i], "\"maps\": ", report, "\"upstream\": {\"allocs\": ");
        long long time_ns = json_after(processes[i], "\"time_ns\": ");
        cr_expect_eq(time_ns, json_after(report, "\"allocate\": ") + json_after(report, "\"free\": "), "%s\n%s",
                     processes[i], report);
    }
    cr_expect_eq(json_after(in_b, "\"requested_current\": "), 8 * ((1 << 20) + 1000), "%s", in_b);
    cr_expect_eq(json_after(in_a, "\"requested_current\": "), 4 * ((1 << 20) + 1000), "%s", in_a);
    cr_expect_geq(json_after(in_a, "\"maps\": "), 1, "a holder's pool mapped memory:\n%s", in_a);
    cr_expect(strstr(in_a, "\"rank\": null"), "%s", in_a);
    cr_expect_eq(json_after(in_b, "\"rank\": "), 5, "%s", in_b);
    cr_expect(strstr(in_b, "\"command\": \"") && strstr(in_b, "prog_neighbours hold "), "%s", in_b);
    /* both left at exit */
    DIR *d = opendir(hood.registry);
    for (struct dirent *e; d && (e = readdir(d));)
        cr_expect(!strstr(e->d_name, ".stats"), "%s left behind", e->d_name);
    if (d)
        closedir(d);
    hood_cleanup();
}

Test(live, top_lists_every_process_with_its_exit_report_figures, .timeout = 30)
{
    expect_top_matches_exit_reports(NULL, 1);
}

Test(live, negative_control_without_the_registry_top_finds_no_process, .timeout = 30)
{
    expect_top_matches_exit_reports("POOLSHIM_OPTIONS=global.neighbour_release=0", 0);
}

/* A program that allocates while top reads once: ALLOC/S has a rate (the
 * one-shot views read every page twice, a page period apart), in the
 * table, the JSON; with nothing running, one line says so. */
Test(live, top_once_shows_the_allocation_rate_of_a_running_loop, .timeout = 30)
{
    hood_init(1, NULL);
    char cmd[256], signals[160], out[200], ready[200], release[200];
    snprintf(cmd, sizeof cmd, "--once --dir %s", hood.registry);
    int rc = run_top(cmd);
    cr_expect_eq(rc, 0, "%s%s", output, top_errors);
    cr_expect_str_eq(output, "no process under poolshim is running (a process shows here while it runs, with "
                             "global.neighbour_release on)\n", "nothing running: one line");

    snprintf(signals, sizeof signals, "%s/churn", hood.dir);
    cr_assert_eq(mkdir(signals, 0700), 0);
    snprintf(out, sizeof out, "%s.txt", signals);
    char args[256];
    snprintf(args, sizeof args, "prog_neighbours churn %s", signals);
    pid_t pid = start_background(1, hood.env, args, out);
    snprintf(ready, sizeof ready, "%s/ready", signals);
    cr_assert(wait_for_file(ready, pid, 10), "the loop did not get ready (see %s)", out);
    wait_for_fresh_page(pid, wall_now());

    static char table[65536];
    rc = run_top(cmd);
    snprintf(table, sizeof table, "%s", output);
    snprintf(cmd, sizeof cmd, "--json --dir %s", hood.registry);
    run_top(cmd);
    snprintf(release, sizeof release, "%s/release", signals);
    FILE *f = fopen(release, "w");
    if (f)
        fclose(f);
    int status = -1;
    waitpid(pid, &status, 0);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the loop ended badly");

    const char *process = top_process(output, pid);
    cr_assert(process, "the loop (%d) in:\n%s", (int)pid, output);
    const char *rate = strstr(process, "\"allocations_per_second\": ");
    cr_assert(rate, "%s", process);
    double per_second = strtod(rate + 26, NULL);
    cr_expect(strncmp(rate + 26, "null", 4) != 0 && per_second > 50 && per_second < 2000,
              "a loop of a pair a millisecond: %.1f/s\n%s", per_second, process);

    const char *header = strstr(table, "ALLOC/S");
    char pid_text[24];
    snprintf(pid_text, sizeof pid_text, "\n%7d ", (int)pid);
    const char *row = strstr(table, pid_text);
    cr_assert(header && row, "a header and the loop's row:\n%s", table);
    size_t end = (size_t)(header - table) + 7; /* the column is right-aligned, 9 wide */
    char cell[16];
    snprintf(cell, sizeof cell, "%.9s", row + 1 + end - 9);
    long shown = strtol(cell, NULL, 10);
    cr_expect(shown > 50, "ALLOC/S shows a rate, got '%s':\n%s", cell, table);
    hood_cleanup();
}

/* (b) the page of a pid that is gone, and a killed program's leftover, are
 * not listed and are removed; the control: the same page with a live pid
 * (this test's own) is listed. */
Test(live, stale_pages_are_not_listed_and_are_removed, .timeout = 30)
{
    hood_init(1, NULL);
    char dead[96], alive[96], path[300], cmd[256];
    fabricate_page(pid_of_the_dead(), dead, sizeof dead, 1234567);
    snprintf(path, sizeof path, "%s/%s.gpus", hood.registry, dead);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fclose(f);
    fabricate_page(getpid(), alive, sizeof alive, 7654321);
    pid_t killed = start_holder("k", 4, NULL);
    wait_for_fresh_page(killed, 0);
    kill(killed, SIGKILL);
    waitpid(killed, NULL, 0);
    char killed_page[400];
    DIR *d = opendir(hood.registry);
    killed_page[0] = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "p%d-", (int)killed);
        if (!strncmp(e->d_name, prefix, strlen(prefix)) && strstr(e->d_name, ".stats"))
            snprintf(killed_page, sizeof killed_page, "%s/%s", hood.registry, e->d_name);
    }
    if (d)
        closedir(d);
    cr_assert(killed_page[0], "the killed program left no page");
    snprintf(cmd, sizeof cmd, "--once --json --dir %s", hood.registry);
    int rc = run_top(cmd);
    cr_expect_eq(rc, 0, "%s%s", output, top_errors);
    cr_expect(top_process(output, getpid()) && strstr(output, "\"reserved_current\": 7654321"),
              "the live page is listed:\n%s", output);
    cr_expect(!strstr(output, "1234567"), "the dead pid's page is listed:\n%s", output);
    cr_expect(!top_process(output, killed), "the killed program is listed:\n%s", output);
    snprintf(path, sizeof path, "%s/%s.stats", hood.registry, dead);
    cr_expect(!file_exists(path), "%s stays", path);
    snprintf(path, sizeof path, "%s/%s.gpus", hood.registry, dead);
    cr_expect(!file_exists(path), "%s stays", path);
    cr_expect(!file_exists(killed_page), "%s stays", killed_page);
    snprintf(path, sizeof path, "%s/%s.stats", hood.registry, alive);
    cr_expect(file_exists(path), "the live page %s was removed", path);
    hood_cleanup();
}

/* (c) a registry others may write is refused: exit 1, a message, nothing
 * on stdout; the control: the same directory made private is read. */
Test(live, a_registry_others_may_write_is_refused_by_top)
{
    hood_init(1, NULL);
    char name[96], cmd[256];
    fabricate_page(getpid(), name, sizeof name, 4242);
    cr_assert_eq(chmod(hood.registry, 0777), 0);
    snprintf(cmd, sizeof cmd, "--once --json --dir %s", hood.registry);
    int rc = run_top(cmd);
    cr_expect_eq(rc, 1, "rc %d:\n%s%s", rc, output, top_errors);
    cr_expect(strstr(top_errors, "is not a private directory of this user") && strstr(top_errors, "mode 777"), "%s",
              top_errors);
    cr_expect_eq(output[0], 0, "%s", output);
    cr_assert_eq(chmod(hood.registry, 0700), 0); /* the control */
    rc = run_top(cmd);
    cr_expect_eq(rc, 0, "rc %d:\n%s%s", rc, output, top_errors);
    cr_expect(strstr(output, "\"reserved_current\": 4242"), "%s", output);
    hood_cleanup();
}

/* Whether `text` is well-formed Prometheus text exposition (HELP, then TYPE,
 * then that metric's samples `name{label="value",...} number`); NULL when
 * it is, else the first bad line. */
static const char *prometheus_problem(const char *text, int *samples)
{
    static char bad[512];
    char metric[128] = "", type[16] = "";
    int help_seen = 0;
    *samples = 0;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        if (!end)
            return "the last line has no newline";
        char l[4096];
        snprintf(l, sizeof l, "%.*s", (int)(end - line), line);
        line = end + 1;
        snprintf(bad, sizeof bad, "%.500s", l);
        char name[128], rest[4000];
        if (!strncmp(l, "# HELP ", 7)) {
            if (sscanf(l + 7, "%127s %3999[^\n]", name, rest) != 2)
                return bad;
            snprintf(metric, sizeof metric, "%s", name);
            help_seen = 1;
            type[0] = 0;
            continue;
        }
        if (!strncmp(l, "# TYPE ", 7)) {
            if (sscanf(l + 7, "%127s %15s", name, type) != 2 || strcmp(name, metric) || !help_seen ||
                (strcmp(type, "gauge") && strcmp(type, "counter")))
                return bad;
            continue;
        }
        /* a sample */
        const char *c = l;
        size_t n = strspn(c, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:");
        if (!n || (c[0] >= '0' && c[0] <= '9') || n != strlen(metric) || strncmp(c, metric, n) || !type[0])
            return bad;
        if (!strcmp(type, "counter") && (n < 6 || strncmp(c + n - 6, "_total", 6)))
            return bad;
        c += n;
        if (*c == '{') {
            c++;
            while (*c != '}') {
                size_t k = strspn(c, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
                if (!k || c[k] != '=' || c[k + 1] != '"')
                    return bad;
                c += k + 2;
                while (*c && *c != '"') {
                    if (*c == '\\') {
                        if (c[1] != '\\' && c[1] != '"' && c[1] != 'n')
                            return bad;
                        c++;
                    }
                    c++;
                }
                if (*c != '"')
                    return bad;
                c++;
                if (*c == ',')
                    c++;
                else if (*c != '}')
                    return bad;
            }
            c++;
        }
        if (*c != ' ')
            return bad;
        char *number_end;
        strtod(c + 1, &number_end);
        if (number_end == c + 1 || *number_end)
            return bad;
        (*samples)++;
    }
    return NULL;
}

/* (d) --prometheus: every line well-formed, the program's reserved bytes
 * those of its exit report; the control: the checker refuses broken lines. */
Test(live, prometheus_output_is_well_formed, .timeout = 30)
{
    hood_init(1, NULL);
    char name[96], cmd[256];
    fabricate_page(getpid(), name, sizeof name, 99); /* (its command holds quotes: escaped) */
    pid_t b = start_holder("b", 6, "RANK=2 SLURM_JOB_ID=4242");
    wait_for_fresh_page(b, wall_now());
    snprintf(cmd, sizeof cmd, "--prometheus --dir %s", hood.registry);
    int rc = run_top(cmd), samples = 0;
    char text[65536];
    snprintf(text, sizeof text, "%s", output);
    static char report[65536];
    end_holder("b", b, report, sizeof report);
    cr_expect_eq(rc, 0, "%s%s", text, top_errors);
    const char *problem = prometheus_problem(text, &samples);
    cr_expect(!problem, "bad line: %s\nin:\n%s", problem, text);
    cr_expect_geq(samples, 10 * 2, "%s", text);
    char sample[512];
    const struct passwd *me = getpwuid(geteuid());
    snprintf(sample, sizeof sample,
             "poolshim_reserved_bytes{pid=\"%d\",device=\"0\",rank=\"2\",jobid=\"4242\",user=\"%s\",command=\"", (int)b,
             me ? me->pw_name : "?");
    const char *at = strstr(text, sample);
    cr_assert(at, "no %s in:\n%s", sample, text);
    long long reserved = strtoll(strchr(at, '}') + 2, NULL, 10);
    cr_expect_eq(reserved, json_after(report, "\"reserved_current\": "), "%s\n%s", text, report);
    cr_expect(strstr(text, "command=\"fabricated \\\"page\\\"\"} 99"), "%s", text);
    snprintf(sample, sizeof sample, "poolshim_oom_retries_total{pid=\"%d\",", (int)getpid());
    at = strstr(text, sample);
    cr_expect(at && strstr(at, "\"} 3\n") == strchr(at, '}') - 1, "out-of-memory retries: 2 + 1:\n%s", text);
    /* the control: the checker finds what is wrong */
    int n;
    cr_expect(prometheus_problem("# HELP a x\n# TYPE a gauge\na{pid=\"1\"} \n", &n), "an empty value passed");
    cr_expect(prometheus_problem("# HELP a x\n# TYPE a gauge\nb 1\n", &n), "another metric's sample passed");
    cr_expect(prometheus_problem("# HELP a_total x\n# TYPE a_total counter\na_total{pid=1} 1\n", &n),
              "an unquoted label passed");
    cr_expect(prometheus_problem("# TYPE a gauge\na 1\n", &n), "TYPE without HELP passed");
    cr_expect(!prometheus_problem("# HELP a x\n# TYPE a gauge\na{b=\"\\\"\"} 1.5\n", &n), "a good one refused");
    hood_cleanup();
}

/* Reads the file `path` into `into` (NUL-ended; "" when absent). */
static void slurp_into(const char *path, char *into, size_t size)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(into, 1, size - 1, f) : 0;
    into[n] = 0;
    if (f)
        fclose(f);
}

/* (d2) --textfile: the service writes node_exporter's file every second,
 * whole (well-formed, mode 0644, no temporary file left beside it), with
 * the holder's job; the holder's series go once it ends; SIGTERM ends the
 * service, which removes its file. --once writes it and keeps it. */
Test(live, textfile_service_writes_whole_files_and_removes_its_own, .timeout = 40)
{
    hood_init(1, NULL);
    char textdir[160], file[200], cmd[1024], text[65536], sample[128];
    snprintf(textdir, sizeof textdir, "%s/textfile", hood.dir);
    cr_assert_eq(mkdir(textdir, 0755), 0);
    snprintf(file, sizeof file, "%s/poolshim.prom", textdir);
    pid_t b = start_holder("b", 6, "RANK=1 SLURM_JOB_ID=77");
    wait_for_fresh_page(b, wall_now());
    snprintf(cmd, sizeof cmd, "exec %s top --prometheus --textfile %s --interval 1 --dir %s", getenv("POOLSHIM_CLI"),
             textdir, hood.registry);
    pid_t service = fork();
    cr_assert_geq(service, 0);
    if (service == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    snprintf(sample, sizeof sample, "poolshim_reserved_bytes{pid=\"%d\",device=\"0\",rank=\"1\",jobid=\"77\",", (int)b);
    bool seen = false;
    for (int i = 0; i < 50 && !seen; i++) {
        usleep(100 * 1000);
        slurp_into(file, text, sizeof text);
        seen = strstr(text, sample) != NULL;
    }
    cr_expect(seen, "no %s in %s:\n%s", sample, file, text);
    int samples = 0;
    const char *problem = prometheus_problem(text, &samples);
    cr_expect(!problem, "bad line: %s\nin:\n%s", problem, text);
    struct stat st;
    cr_expect(stat(file, &st) == 0 && (st.st_mode & 0777) == 0644, "mode %o", (unsigned)(st.st_mode & 0777));
    int entries = 0;
    DIR *d = opendir(textdir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            entries++;
    if (d)
        closedir(d);
    cr_expect_eq(entries, 1, "only poolshim.prom in %s (no temporary file)", textdir);
    static char report[65536];
    end_holder("b", b, report, sizeof report);
    bool gone = false;
    for (int i = 0; i < 50 && !gone; i++) {
        usleep(100 * 1000);
        slurp_into(file, text, sizeof text);
        gone = text[0] && !strstr(text, sample);
    }
    cr_expect(gone, "the ended holder is still in %s:\n%s", file, text);
    cr_expect(strstr(text, "# TYPE poolshim_reserved_bytes gauge\n"), "HELP and TYPE stay:\n%s", text);
    kill(service, SIGTERM);
    int status = -1;
    waitpid(service, &status, 0);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the service's status %d", status);
    cr_expect(access(file, F_OK) != 0, "SIGTERM: the service removed %s", file);
    snprintf(cmd, sizeof cmd, "--prometheus --once --textfile %s/once.prom --dir %s", textdir, hood.registry);
    cr_expect_eq(run_top(cmd), 0, "%s", top_errors);
    snprintf(file, sizeof file, "%s/once.prom", textdir);
    slurp_into(file, text, sizeof text);
    cr_expect(strstr(text, "# HELP poolshim_reserved_bytes "), "--once --textfile wrote %s:\n%s", file, text);
    hood_cleanup();
}

/* (e) the interactive view inside tmux: a header and the program's row on
 * the screen, `s` changes the sort, `q` ends it and the terminal is as
 * before (main screen, cursor shown, canonical mode with echo). The
 * control: without `q` it is still running. */
static int tmux(const char *server, const char *args, char *out, size_t size)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "TERM=xterm-256color tmux -L %s %s 2>&1", server, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = out ? fread(out, 1, size - 1, p) : 0;
    if (out)
        out[n] = 0;
    else {
        char sink[4096];
        while (fread(sink, 1, sizeof sink, p) > 0) {
        }
    }
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(live, the_interactive_view_in_tmux_shows_rows_and_restores_the_terminal, .timeout = 30)
{
    if (system("tmux -V >/dev/null 2>&1") != 0)
        cr_skip_test("no tmux");
    hood_init(1, NULL);
    pid_t b = start_holder("b", 6, NULL);
    wait_for_fresh_page(b, wall_now());
    char server[64], args[2048], screen[16384], pid_text[32];
    snprintf(server, sizeof server, "poolshim_live_%d", (int)getpid());
    snprintf(args, sizeof args,
             "new-session -d -s top -x 160 -y 40 \"%s top --dir %s; echo exited \\$?; stty -a | tr ' ' '\\n' | "
             "grep -x -e -icanon -e icanon -e echo -e -echo | tr '\\n' ' '; echo; sleep 20\"",
             getenv("POOLSHIM_CLI"), hood.registry);
    cr_assert_eq(tmux(server, args, screen, sizeof screen), 0, "%s", screen);
    snprintf(pid_text, sizeof pid_text, " %d ", (int)b);
    bool shown = false;
    for (int i = 0; i < 40 && !shown; i++) { /* (up to 4 s) */
        usleep(100 * 1000);
        tmux(server, "capture-pane -p -t top", screen, sizeof screen);
        shown = strstr(screen, "poolshim top - ") && strstr(screen, "REQUESTED") && strstr(screen, pid_text);
    }
    cr_expect(shown, "the view:\n%s", screen);
    cr_expect(strstr(screen, "sort: reserved"), "%s", screen);
    char state[256];
    tmux(server, "display -p -t top '#{alternate_on} #{cursor_flag}'", state, sizeof state);
    cr_expect(!strncmp(state, "1 0", 3), "while it runs: other screen, no cursor: %s", state);
    tmux(server, "send-keys -t top s", NULL, 0);
    bool sorted = false;
    for (int i = 0; i < 20 && !sorted; i++) {
        usleep(50 * 1000);
        tmux(server, "capture-pane -p -t top", screen, sizeof screen);
        sorted = strstr(screen, "sort: requested") != NULL;
    }
    cr_expect(sorted, "s did not change the sort:\n%s", screen);
    /* the control: still running before q */
    usleep(300 * 1000);
    tmux(server, "capture-pane -p -t top", screen, sizeof screen);
    cr_expect(!strstr(screen, "exited"), "it ended by itself:\n%s", screen);
    tmux(server, "send-keys -t top q", NULL, 0);
    bool ended = false;
    for (int i = 0; i < 40 && !ended; i++) {
        usleep(50 * 1000);
        tmux(server, "capture-pane -p -t top", screen, sizeof screen);
        ended = strstr(screen, "exited 0") != NULL;
    }
    usleep(200 * 1000);
    tmux(server, "capture-pane -p -t top", screen, sizeof screen);
    tmux(server, "display -p -t top '#{alternate_on} #{cursor_flag}'", state, sizeof state);
    tmux(server, "kill-server", NULL, 0);
    static char report[65536];
    end_holder("b", b, report, sizeof report);
    cr_expect(ended, "q did not end it:\n%s", screen);
    cr_expect(!strstr(screen, "REQUESTED"), "the table stays on the main screen:\n%s", screen);
    cr_expect(strstr(screen, "icanon") && !strstr(screen, "-icanon") && strstr(screen, "echo") &&
                  !strstr(screen, "-echo"),
              "the terminal's mode is not restored:\n%s", screen);
    cr_expect(!strncmp(state, "0 1", 3), "after q: main screen, cursor shown: %s", state);
    hood_cleanup();
}

Test(runtime_door, free_sync_policies_all_pass)
{
    expect_pass(1, "POOLSHIM_FREE_SYNC=device", "prog_runtime basic", "shim active");
    expect_pass(1, "POOLSHIM_FREE_SYNC=none", "prog_runtime basic", "shim active");
    expect_pass(1, "FAKE_CUDA_EVENTS_PENDING=3", "prog_runtime basic", "shim active");
}

Test(driver_door, static_cudart_style_native) { expect_pass(0, NULL, "prog_static", "shim inactive"); }
/* cuMemAlloc/cuMemFree while a global-mode capture is open: the shim answers
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED as the driver does (pool and arena,
 * which could serve from memory they hold), and serves them in relaxed mode */
Test(driver_door, global_capture_native) { expect_pass(0, NULL, "prog_static capture_global", "shim inactive"); }
Test(driver_door, global_capture_pool) { expect_pass(1, NULL, "prog_static capture_global", "shim active"); }
Test(driver_door, global_capture_arena)
{
    expect_pass(1, "POOLSHIM_RESOURCE=arena", "prog_static capture_global", "shim active");
}
Test(driver_door, static_cudart_style_through_shim) { expect_pass(1, NULL, "prog_static", "shim active"); }
Test(driver_door, old_glibc_dlsym_version_through_shim)
{
    expect_pass(1, NULL, "prog_static_old_dlsym", "shim active");
}

Test(dlsym, rtld_next_stays_relative_to_the_caller)
{
    const char *build = getenv("POOLSHIM_BUILD");
    const char *prefix = getenv("POOLSHIM_PRELOAD_PREFIX");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "env LD_PRELOAD=\"%s %s/libpoolshim.so %s/shimtest/libwrapnext.so\" %s/shimtest/prog_rtld_next 2>&1",
             prefix ? prefix : "", build, build, build);
    FILE *p = popen(cmd, "r");
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int st = pclose(p);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "RTLD_NEXT through our dlsym:\n%s", output);
}

Test(life, disable_makes_a_pure_passthrough)
{
    expect_pass(1, "POOLSHIM_DISABLE=1", "prog_runtime basic", "shim inactive");
    expect_pass(1, "POOLSHIM_DISABLE=1", "prog_static", "shim inactive");
}

/* POOLSHIM_DISABLE never stops a program: 0/false/no/off and an empty value
 * (a script's `export POOLSHIM_DISABLE=$X` with X unset) keep the shim on;
 * 1/true/yes/on turn it off; anything else turns it off with one warning
 * naming the variable, since the user reached for the off switch. */
Test(life, disable_accepts_every_boolean_spelling)
{
    static const char *const off[] = {"0", "false", "FALSE", "no", "off", "Off", "", "' '"};
    static const char *const on[] = {"1", "true", "Yes", "on"};
    char env[128];
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        snprintf(env, sizeof env, "POOLSHIM_DISABLE=%s", off[i]);
        expect_pass(1, env, "prog_runtime basic", "shim active");
        cr_expect(!strstr(output, "poolshim: error") && !strstr(output, "poolshim: warning"),
                  "%s: no message:\n%s", env, output);
    }
    for (size_t i = 0; i < sizeof on / sizeof on[0]; i++) {
        snprintf(env, sizeof env, "POOLSHIM_DISABLE=%s", on[i]);
        expect_pass(1, env, "prog_runtime basic", "shim inactive");
    }
    static const char *const unclear[] = {"maybe", "2", "disable"};
    for (size_t i = 0; i < sizeof unclear / sizeof unclear[0]; i++) {
        snprintf(env, sizeof env, "POOLSHIM_DISABLE=%s", unclear[i]);
        expect_pass(1, env, "prog_runtime basic", "shim inactive");
        expect_pass(1, env, "prog_static", "shim inactive");
        char warning[160];
        snprintf(warning, sizeof warning, "poolshim: warning: POOLSHIM_DISABLE=%s: not one of 1/0, true/false, "
                 "yes/no or on/off; taken as 1", unclear[i]);
        const char *first = strstr(output, warning);
        cr_expect(first, "one warning naming the variable:\n%s", output);
        cr_expect(first && !strstr(first + 1, "poolshim: warning: POOLSHIM_DISABLE"), "one warning only:\n%s", output);
        cr_expect(!strstr(output, "poolshim: error"), "no error:\n%s", output);
    }
    run(1, "POOLSHIM_TRACE_LOOKUPS=perhaps", "prog_runtime basic");
    cr_expect(strstr(output, "POOLSHIM_TRACE_LOOKUPS=perhaps: expected 1/0, true/false, yes/no or on/off"),
              "POOLSHIM_TRACE_LOOKUPS is read by the same parser:\n%s", output);
}

/* A misspelled variable gets one warning naming the closest known one. */
Test(life, misspelled_variable_gets_one_warning)
{
    expect_pass(1, "POOLSHIM_STAT=json", "prog_runtime basic", "shim active");
    const char *w = strstr(output, "poolshim: warning: POOLSHIM_STAT: not a poolshim variable, ignored (did you mean POOLSHIM_STATS?)");
    cr_expect(w, "a warning with the nearest name:\n%s", output);
    cr_expect(w && !strstr(w + 20, "POOLSHIM_STAT:"), "only one:\n%s", output);
    expect_pass(1, "POOLSHIM_TEST_WHATEVER=1", "prog_runtime basic", "shim active");
    cr_expect(!strstr(output, "not a poolshim variable"), "test variables are not warned about:\n%s", output);
}

/* A stack that cannot be built (here: its log file cannot be created) is
 * handled by on_error like a bad configuration: exit by default, no
 * program run without the pool and without the log it asked for. */
Test(life, on_error_applies_when_a_stack_cannot_be_built)
{
    int rc = run(1, "POOLSHIM_LOG=/nonexistent/x.csv", "prog_runtime basic");
    cr_expect_eq(rc, 1, "on_error=exit stops the program:\n%s", output);
    cr_expect(strstr(output, "/nonexistent/x.csv"), "the error names the file:\n%s", output);
    cr_expect(strstr(output, "POOLSHIM_ON_ERROR=passthrough"), "the error says how to run without the pool:\n%s",
              output);
    cr_expect(!strstr(output, "basic ("), "the program stopped at its first allocation:\n%s", output);
    /* passthrough: the program runs to its end, its device without the pool
     * (prog_runtime basic then says the pool served nothing) */
    rc = run(1, "POOLSHIM_LOG=/nonexistent/x.csv POOLSHIM_ON_ERROR=passthrough", "prog_runtime basic");
    cr_expect(strstr(output, "passing its calls through"), "%s", output);
    cr_expect(strstr(output, "basic ("), "on_error=passthrough runs the program to its end:\n%s", output);
}

Test(life, stats_json_counts_each_door)
{
    char env[512];
    snprintf(env, sizeof env, "POOLSHIM_STATS=json POOLSHIM_STATS_FILE=/tmp/poolshim-test-%d.json", getpid());
    expect_pass(1, env, "prog_runtime basic", "shim active");
    char path[128];
    snprintf(path, sizeof path, "/tmp/poolshim-test-%d.json", getpid());
    char json[8192];
    take_report(path, json, sizeof json);
    cr_expect(strstr(json, "\"cudaMalloc\": 600"), "400 + 200 cudaMalloc calls expected in %s", json);
    cr_expect(strstr(json, "\"cudaFree\": 600"), "600 cudaFree calls expected in %s", json);
    cr_expect(strstr(json, "\"driver\": 0"), "no driver-door calls expected (routed once) in %s", json);

    snprintf(env, sizeof env, "POOLSHIM_STATS=json POOLSHIM_STATS_FILE=/tmp/poolshim-test-%d.json", getpid());
    expect_pass(1, env, "prog_static", "shim active");
    take_report(path, json, sizeof json);
    cr_expect(strstr(json, "\"runtime\": 0"), "static program: only the driver door, in %s", json);
    cr_expect(strstr(json, "\"cuMemAlloc\": 100"), "100 cuMemAlloc calls in %s", json);
}

/* Under Slurm the statistics file is named by job, step, node and rank
 * (%j, %s, %h, %r) and the report says where the process ran: rank, local
 * rank, node index, host, job and step, from Slurm's variables. */
Test(life, stats_file_and_report_name_the_slurm_job_step_node_and_rank)
{
    char env[512], path[160], json[8192];
    snprintf(env, sizeof env,
             "SLURM_JOB_ID=4242 SLURM_STEP_ID=3 SLURM_PROCID=5 SLURM_LOCALID=1 SLURM_NODEID=2 "
             "SLURMD_NODENAME=gpu-node7 POOLSHIM_STATS=json POOLSHIM_STATS_FILE=/tmp/poolshim-%d_%%j.%%s_%%h_rank%%r.json",
             getpid());
    expect_pass(1, env, "prog_runtime basic", "shim active");
    snprintf(path, sizeof path, "/tmp/poolshim-%d_4242.3_gpu-node7_rank5.json", getpid());
    take_report(path, json, sizeof json);
    cr_expect(strstr(json, "\"rank\": 5, \"local_rank\": 1, \"node\": 2, \"hostname\": \"gpu-node7\", \"job\": \"4242\", "
                           "\"step\": \"3\", "),
              "the place in the job, in %s", json);
    cr_expect(strstr(json, "\"cudaMalloc\": 600"), "%s", json);
}

Test(life, bad_config_stops_before_the_first_allocation)
{
    int rc = run(1, "POOLSHIM_OPTIONS=global.free_sync=sometimes", "prog_runtime basic");
    cr_expect_neq(rc, 0, "a bad config must stop the program:\n%s", output);
    cr_expect(strstr(output, "free_sync"), "the error names the key:\n%s", output);
    rc = run(1, "POOLSHIM_OPTIONS=global.free_sync=sometimes POOLSHIM_ON_ERROR=passthrough", "prog_runtime basic");
    cr_expect_eq(rc, 0, "on_error=passthrough runs without the pool:\n%s", output);
    cr_expect(strstr(output, "shim inactive"), "%s", output);
}

/* ---- context lifecycle ---------------------------------------------------------- */
/* Passes natively and under the shim, and the fake driver saw no call on an
 * object of a destroyed context (it says so at exit otherwise). */
static void expect_clean(const char *env, const char *prog)
{
    expect_pass(0, env, prog, "shim inactive");
    expect_pass(1, env, prog, "shim active");
    cr_expect(strstr(output, "destroyed context") == NULL, "%s: calls on dead objects:\n%s", prog, output);
}

Test(context, reset_drops_live_pending_and_stream_blocks_and_allocates_again)
{
    expect_clean(NULL, "prog_runtime reset");
    expect_clean("FAKE_CUDA_EVENTS_PENDING=3", "prog_runtime reset");
    expect_clean("POOLSHIM_FREE_SYNC=none", "prog_runtime reset");
}

Test(context, reset_works_for_every_resource_type)
{
    const char *types[] = {"pool", "arena", "binning", "async", "cuda"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char env[128];
        snprintf(env, sizeof env, "POOLSHIM_RESOURCE=%s FAKE_CUDA_EVENTS_PENDING=2", types[i]);
        expect_clean(env, "prog_runtime reset");
    }
}

Test(context, hundred_resets_do_not_grow_device_memory) { expect_clean(NULL, "prog_runtime reset_loop"); }
Test(context, hundred_resets_give_back_mapped_device_and_pinned_pieces)
{
    expect_clean("FAKE_CUDA_VMM=1", "prog_runtime reset_loop");
}

Test(context, reset_does_not_disturb_threads_on_another_device)
{
    expect_clean(NULL, "prog_runtime reset_threads");
}

Test(context, reset_as_first_call_and_before_exit_stays_clean)
{
    expect_clean("POOLSHIM_STATS=text", "prog_runtime reset_first");
    cr_expect(strstr(output, "resets     1"), "the exit report counts the reset:\n%s", output);
}

Test(context, set_device_flags_that_recreate_the_context)
{
    expect_clean("FAKE_CUDA_SETFLAGS_RECREATES=1", "prog_runtime set_flags");
}

Test(context, a_stream_made_while_a_release_is_inside_the_driver_waits_once_it_returns)
{
    expect_clean("FAKE_CUDA_LIFECYCLE_DELAY_US=500000", "prog_runtime gate_stream");
    cr_expect(strstr(output, "gate_stream: during=0 after=1"),
              "no wait while the gate is closed, one for the last barrier once it opens:\n%s", output);
}

Test(context, driver_release_of_the_last_reference) { expect_clean(NULL, "prog_static release"); }
Test(context, driver_primary_ctx_reset) { expect_clean(NULL, "prog_static primary_reset"); }

Test(context, created_contexts_pass_through_with_one_warning_each)
{
    expect_clean(NULL, "prog_static ctx_create");
    int warnings = 0;
    for (const char *p = output; (p = strstr(p, "is not the device's primary context")); p++)
        warnings++;
    cr_expect_eq(warnings, 2, "one warning per created context (2), got %d:\n%s", warnings, output);
}

Test(context, stats_json_reports_resets_and_what_they_dropped)
{
    char env[512], path[128];
    snprintf(path, sizeof path, "/tmp/poolshim-reset-%d.json", getpid());
    snprintf(env, sizeof env, "POOLSHIM_STATS=json POOLSHIM_STATS_FILE=%s", path);
    expect_pass(1, env, "prog_runtime reset", "shim active");
    char json[8192];
    take_report(path, json, sizeof json);
    cr_expect(strstr(json, "\"resets\": {\"count\": 1, \"dropped_allocations\": 11"),
              "one reset, 11 live allocations dropped (10 blocks + 1 async), in %s", json);
}

/* ---- make demo without a GPU (tools/demo) ------------------------------------- */

/* The probe says in one line what is missing, and nothing when a driver
 * with a device answers (here the fake one). */
Test(demo, the_probe_names_a_missing_driver_and_passes_a_present_one)
{
    const char *build = getenv("POOLSHIM_BUILD"), *prefix = getenv("POOLSHIM_PRELOAD_PREFIX");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/demo/gpu_probe libcuda_absent.so.1 2>&1", build);
    FILE *p = popen(cmd, "r");
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int st = pclose(p);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s", output);
    cr_expect_str_eq(output, "no NVIDIA driver (libcuda_absent.so.1 cannot be loaded)\n");
    /* (an ASan-built fake driver loads behind the ASan runtime) */
    snprintf(cmd, sizeof cmd, "env LD_PRELOAD=%s LD_LIBRARY_PATH=%s/fake %s/demo/gpu_probe 2>&1", prefix ? prefix : "",
             build, build);
    p = popen(cmd, "r");
    n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    st = pclose(p);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the fake driver has devices:\n%s", output);
    cr_expect_str_eq(output, "", "nothing said when there is a GPU");
}

/* What `make demo` shows without a GPU: the reason in one line, a replay
 * of a shipped log against the default pool and no pool, a plot, an A/B
 * table over the fake CUDA, and the command for a GPU machine; exit 0. */
Test(demo, without_a_gpu_it_shows_a_replay_a_plot_and_an_ab_table, .timeout = 120)
{
    const char *build = getenv("POOLSHIM_BUILD"), *prefix = getenv("POOLSHIM_PRELOAD_PREFIX");
    char cmd[2048], svg[512];
    snprintf(svg, sizeof svg, "%s/demo/memory.svg", build);
    remove(svg);
    /* (an ASan-built shim is preloaded behind the ASan runtime, as run_cli does) */
    snprintf(cmd, sizeof cmd, "env LD_PRELOAD=%s tools/demo/no_gpu.sh %s 'no NVIDIA driver (a test)' 2>&1",
             prefix ? prefix : "", build);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int st = pclose(p);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit %d:\n%s", st, output);
    const char *first = "make demo: no NVIDIA driver (a test): showing poolshim on a recorded allocation log and "
                        "on a fake GPU instead\n";
    cr_expect(strncmp(output, first, strlen(first)) == 0, "the reason first, in one line:\n%s", output);
    const char *pool = strstr(output, "\n0       default_pool "), *none = strstr(output, "\n0       no_pool ");
    cr_expect(pool && none, "the replay's two rows:\n%s", output);
    cr_expect(none && strstr(none, " 79696\n"), "no pool: every allocation reached CUDA:\n%s", output);
    cr_expect(!strstr(output, "FAILED"), "%s", output);
    char line[600];
    snprintf(line, sizeof line, "plot: %s (requested by the program, reserved by the pool)", svg);
    cr_expect(strstr(output, line), "%s", output);
    FILE *f = fopen(svg, "r");
    char head[6] = "";
    cr_expect(f && fread(head, 1, 5, f) == 5 && !strcmp(head, "<?xml"), "an SVG at %s", svg);
    if (f)
        fclose(f);
    const char *baseline = strstr(output, "\nbaseline "), *shim = strstr(output, "\ndefault ");
    cr_expect(baseline && shim && strstr(shim, " 12,000 "), "the A/B table, 12,000 calls under the shim:\n%s",
              output);
    cr_expect(strstr(output, "the same 'make demo' builds\ntools/demo/alloc_churn.cu with nvcc"),
              "the GPU command last:\n%s", output);
}

/* ---- several processes: `poolshim run` over a launcher ----------------------- */

/* Runs `poolshim run ARGS` with the fake CUDA and the shim of this build;
 * keeps stderr (where the statistics go) in `output`, drops stdout. */
static int run_cli(const char *args)
{
    const char *build = getenv("POOLSHIM_BUILD"), *cli = getenv("POOLSHIM_CLI");
    const char *prefix = getenv("POOLSHIM_PRELOAD_PREFIX");
    cr_assert(build && cli, "POOLSHIM_BUILD and POOLSHIM_CLI must be set (make test-shim sets them)");
    char cmd[4096];
    /* an ASan-built shim is preloaded behind the ASan runtime: the CLI appends it */
    snprintf(cmd, sizeof cmd, "env LD_LIBRARY_PATH=%s/fake POOLSHIM_LIB=%s/libpoolshim.so LD_PRELOAD=%s %s run %s 2>&1 >/dev/null",
             build, build, prefix ? prefix : "", cli, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Test(launcher, run_stats_gives_one_row_per_rank_and_the_total)
{
    const char *build = getenv("POOLSHIM_BUILD"), *data = getenv("POOLSHIM_TEST_DATA");
    cr_assert(data, "POOLSHIM_TEST_DATA must be set (make test-shim sets it)");
    char args[2048];
    /* tests/data/cli/fake_launcher.sh starts the program twice, with RANK=0 and RANK=1 */
    snprintf(args, sizeof args, "--stats=json -- %s/cli/fake_launcher.sh %s/shimtest/prog_runtime basic", data, build);
    int rc = run_cli(args);
    cr_expect_eq(rc, 0, "exit %d:\n%s", rc, output);
    /* prog_runtime basic: 600 cudaMalloc + 600 cudaFree per process */
    cr_expect(strstr(output, "\"rank\": 0,") && strstr(output, "\"rank\": 1,"), "both ranks, from the shim's report:\n%s",
              output);
    cr_expect(strstr(output, "\"total\": {\"processes\": 2, \"devices\": 2, \"calls\": 2400,"),
              "the total adds both processes up:\n%s", output);

    snprintf(args, sizeof args, "--stats -- %s/cli/fake_launcher.sh %s/shimtest/prog_runtime basic", data, build);
    rc = run_cli(args);
    cr_expect_eq(rc, 0, "exit %d:\n%s", rc, output);
    cr_expect(strstr(output, "poolshim stats: 2 processes"), "the table:\n%s", output);
    cr_expect(strstr(output, "\n0 ") && strstr(output, "\n1 "), "a row per rank:\n%s", output);
    cr_expect(strstr(output, "\ntotal ") && strstr(output, " 2,400 "), "the total row:\n%s", output);

    /* a failing rank: its status comes through, the statistics are still printed */
    snprintf(args, sizeof args, "--stats -- %s/cli/fake_launcher.sh /bin/sh -c '%s/shimtest/prog_runtime basic; exit 5'",
             data, build);
    rc = run_cli(args);
    cr_expect_eq(rc, 5, "the launcher's exit status, got %d:\n%s", rc, output);
    cr_expect(strstr(output, "poolshim stats: 2 processes"), "the table:\n%s", output);
}

Test(launcher, run_stats_json_of_one_process_is_the_shims_own_report)
{
    const char *build = getenv("POOLSHIM_BUILD");
    char args[1024];
    snprintf(args, sizeof args, "--stats=json -- env RANK=3 %s/shimtest/prog_runtime basic", build);
    int rc = run_cli(args);
    cr_expect_eq(rc, 0, "exit %d:\n%s", rc, output);
    cr_expect(strncmp(output, "{\"poolshim\": 1, \"pid\": ", 23) == 0 && strstr(output, "\"rank\": 3, "),
              "the shim's report, verbatim, with the rank:\n%s", output);
    cr_expect(!strstr(output, "poolshim_stats"), "no merged table for one process:\n%s", output);
}

/* Runs `env ENV /bin/true` under the shim of this build; keeps stdout and
 * stderr in `output`. */
static int run_true(const char *env)
{
    const char *build = getenv("POOLSHIM_BUILD"), *prefix = getenv("POOLSHIM_PRELOAD_PREFIX");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "env LD_PRELOAD=\"%s%s%s/libpoolshim.so\" %s /bin/true 2>&1", prefix ? prefix : "",
             prefix && *prefix ? " " : "", build, env);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Statistics asked for, and the program never allocated through CUDA: a
 * line says so (poolshim run, or the shim itself when the report goes to
 * stderr); with a statistics file nothing is written, and nothing said. */
Test(launcher, no_cuda_allocation_seen_is_said_not_silent)
{
    int rc = run_cli("--stats -- /bin/true");
    cr_expect_eq(rc, 0, "exit %d:\n%s", rc, output);
    cr_expect(strstr(output, "poolshim: run: no CUDA allocation seen: no process of '/bin/true' allocated GPU "
                             "memory through CUDA"), "run --stats says so:\n%s", output);
    rc = run_cli("--stats=json -- /bin/sh -c 'exit 4'");
    cr_expect_eq(rc, 4, "the command's status, got %d:\n%s", rc, output);
    cr_expect(strstr(output, "no CUDA allocation seen: no process of '/bin/sh'"), "with json too:\n%s", output);

    rc = run_true("POOLSHIM_STATS=text");
    cr_expect_eq(rc, 0);
    cr_expect(strstr(output, "poolshim: warning: statistics: no CUDA allocation seen in true (pid "),
              "the shim says so on stderr:\n%s", output);
    run_true("POOLSHIM_OPTIONS=global.stats=json");
    cr_expect(strstr(output, "no CUDA allocation seen in true"), "stats set through POOLSHIM_OPTIONS:\n%s", output);
    run_true("POOLSHIM_STATS=0");
    cr_expect_eq(output[0], '\0', "statistics off: nothing:\n%s", output);
    run_true("POOLSHIM_STATS=text POOLSHIM_VERBOSE=0");
    cr_expect_eq(output[0], '\0', "verbosity 0: nothing:\n%s", output);
    char path[256], env[512];
    snprintf(path, sizeof path, "/tmp/poolshim_nothing_seen_%d.json", (int)getpid());
    snprintf(env, sizeof env, "POOLSHIM_STATS=json POOLSHIM_STATS_FILE=%s", path);
    run_true(env);
    cr_expect_eq(output[0], '\0', "a statistics file: nothing said:\n%s", output);
    cr_expect_neq(access(path, F_OK), 0, "and no file written");

    rc = run(1, "POOLSHIM_STATS=text", "prog_runtime basic");
    cr_expect_eq(rc, 0, "%s", output);
    cr_expect(!strstr(output, "no CUDA allocation seen"), "a program that allocated gets its report:\n%s", output);
}

/* Runs `poolshim ab ARGS` like run_cli; keeps stdout (the table or JSON)
 * and stderr together in `output`. */
static int run_ab(const char *args)
{
    const char *build = getenv("POOLSHIM_BUILD"), *cli = getenv("POOLSHIM_CLI");
    const char *prefix = getenv("POOLSHIM_PRELOAD_PREFIX");
    cr_assert(build && cli, "POOLSHIM_BUILD and POOLSHIM_CLI must be set (make test-shim sets them)");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "env LD_LIBRARY_PATH=%s/fake POOLSHIM_LIB=%s/libpoolshim.so LD_PRELOAD=%s %s ab %s 2>&1",
             build, build, prefix ? prefix : "", cli, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Test(launcher, ab_gives_a_row_per_rank_and_the_total_under_the_variant)
{
    const char *build = getenv("POOLSHIM_BUILD"), *data = getenv("POOLSHIM_TEST_DATA");
    cr_assert(data, "POOLSHIM_TEST_DATA must be set (make test-shim sets it)");
    char args[2048];
    /* two processes, rank 0 and rank 1, each 600 cudaMalloc + 600 cudaFree */
    snprintf(args, sizeof args, "--runs 1 --no-cupti -- %s/cli/fake_launcher.sh %s/shimtest/prog_runtime basic", data,
             build);
    int rc = run_ab(args);
    cr_expect_eq(rc, 0, "exit %d:\n%s", rc, output);
    const char *variant = strstr(output, "\ndefault ");
    cr_assert(variant, "the default config's row:\n%s", output);
    cr_expect(strstr(variant, " 2,400 "), "the variant's row adds both processes up:\n%s", output);
    const char *rank0 = strstr(variant, "\n  rank 0 "), *rank1 = strstr(variant, "\n  rank 1 ");
    const char *total = strstr(variant, "\n  total ");
    cr_assert(rank0 && rank1 && total && rank0 < rank1 && rank1 < total, "rank rows, then the total:\n%s", output);
    cr_expect(strstr(rank0, " 1,200 ") < rank1 && strstr(rank1, " 1,200 ") < total, "each rank's calls:\n%s", output);
    cr_expect(strstr(total, " 2,400 ") && strstr(total, "peak requested ") && strstr(total, "reserved/requested "),
              "the total row:\n%s", output);
    cr_expect(strstr(output, "peaks are summed over the processes"), "the note on summed peaks:\n%s", output);
    cr_expect(!strstr(output, "\n  rank ") || strstr(output, "\n  rank ") > variant, "no rows under the baseline");

    snprintf(args, sizeof args, "--runs 1 --no-cupti --json -- %s/cli/fake_launcher.sh %s/shimtest/prog_runtime basic",
             data, build);
    rc = run_ab(args);
    cr_expect_eq(rc, 0, "exit %d:\n%s", rc, output);
    /* the summary: a row per rank (medians over the runs) and the total, after the variant's own figures */
    const char *summary = strstr(output, "\"summary\": {\"wall_s\"");
    summary = summary ? strstr(summary + 1, "\"summary\": {\"wall_s\"") : NULL;
    cr_assert(summary, "the shim variant's summary:\n%s", output);
    const char *json_rank0 = strstr(summary, "{\"rank\": 0, \"pid\": "), *json_rank1 = strstr(summary, "{\"rank\": 1, \"pid\": ");
    cr_assert(json_rank0 && json_rank1, "a summary per rank:\n%s", output);
    cr_expect(strstr(json_rank0, "\"calls\": 1200, ") && strstr(json_rank1, "\"calls\": 1200, "), "%s", output);
    cr_expect(strstr(json_rank0, "\"reserved_ratio\": 1.") || strstr(json_rank0, "\"reserved_ratio\": 2."),
              "reserved/requested:\n%s", output);
    cr_expect(strstr(summary, "\"processes_total\": {\"processes\": 2, \"rank\": null, \"pid\": null, "
                              "\"calls\": 2400, "),
              "the total:\n%s", output);
    cr_expect(strstr(summary, "\"note\": \"peaks are summed over the processes"), "the note:\n%s", output);
    /* each run keeps its processes (the shim's figures per rank) */
    const char *kept = strstr(output, "\"processes\": [\n      {\"file\": ");
    cr_expect(kept && kept < summary && strstr(kept, "\"rank\": 0, ") && strstr(kept, "\"rank\": 1, "),
              "the run's processes:\n%s", output);

    /* one process: no rows under the variant, the JSON as before */
    snprintf(args, sizeof args, "--runs 1 --no-cupti -- %s/shimtest/prog_runtime basic", build);
    rc = run_ab(args);
    cr_expect_eq(rc, 0, "exit %d:\n%s", rc, output);
    cr_expect(!strstr(output, "\n  rank ") && !strstr(output, "\n  total ") && !strstr(output, "summed"),
              "one process, no breakdown:\n%s", output);
}

/* ---- `poolshim replay` on the "GPU": the fake driver, through the shim ------------- */

/* Runs `[env] poolshim replay ARGS` with the fake CUDA and the shim of this
 * build; keeps stdout and stderr together in `output`. */
static int run_replay(const char *env, const char *args)
{
    const char *build = getenv("POOLSHIM_BUILD"), *cli = getenv("POOLSHIM_CLI");
    const char *prefix = getenv("POOLSHIM_PRELOAD_PREFIX");
    cr_assert(build && cli, "POOLSHIM_BUILD and POOLSHIM_CLI must be set (make test-shim sets them)");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "env LD_LIBRARY_PATH=%s/fake POOLSHIM_LIB=%s/libpoolshim.so LD_PRELOAD=%s %s %s replay %s 2>&1",
             build, build, prefix ? prefix : "", env ? env : "", cli, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The number after "KEY": in `from` (the replay's JSON), or -1. */
static double json_number(const char *from, const char *key)
{
    char pattern[128];
    snprintf(pattern, sizeof pattern, "\"%s\": ", key);
    const char *at = from ? strstr(from, pattern) : NULL;
    if (!at || !strncmp(at + strlen(pattern), "null", 4))
        return -1;
    return strtod(at + strlen(pattern), NULL);
}

Test(replay_gpu, replays_a_shim_log_through_the_shim_and_natively)
{
    const char *build = getenv("POOLSHIM_BUILD");
    char log[256], companion[300], args[1024];
    snprintf(log, sizeof log, "/tmp/poolshim-replay-gpu-%d.csv", (int)getpid());
    snprintf(companion, sizeof companion, "%s.reserved.csv", log);
    /* record: prog_runtime basic (600 cudaMalloc + 600 cudaFree, one thread) under the default stack */
    char env[512];
    snprintf(env, sizeof env, "POOLSHIM_LOG=%s", log);
    cr_assert_eq(run(1, env, "prog_runtime basic"), 0, "%s", output);
    FILE *f = fopen(companion, "r");
    cr_assert_not_null(f, "the shim wrote the companion %s", companion);
    fclose(f);

    snprintf(args, sizeof args, "%s --native --json", log);
    int rc = run_replay(NULL, args);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, output);
    const char *native = strstr(output, "\"stack\": \"native\""), *shim = strstr(output, "\"stack\": \"default\"");
    cr_assert(native && shim && native < shim, "a native row, then the default stack's:\n%s", output);
    cr_expect_eq(json_number(native, "allocations"), 600, "%s", output);
    cr_expect_eq(json_number(native, "frees"), 600);
    cr_expect_eq(json_number(shim, "allocations"), 600);
    cr_expect_eq(json_number(shim, "failures"), 0);
    cr_expect_eq(json_number(native, "reserved_peak"), -1, "no shim, no shim statistics: null");
    double requested = json_number(shim, "peak_requested"), reserved = json_number(shim, "reserved_peak");
    double recorded = json_number(shim, "recorded_peak_reserved"), used = json_number(shim, "device_used_peak");
    cr_expect_gt(requested, 0);
    cr_expect_geq(reserved, requested, "the shim's stack holds at least what is live:\n%s", output);
    /* the same stack, the same calls in the same order, the same (fake) driver: the replay
     * reserves exactly what the recorded run reserved */
    cr_expect_eq(reserved, recorded, "replayed %.0f vs recorded %.0f:\n%s", reserved, recorded, output);
    cr_expect_eq(used, reserved, "the device's used memory is the shim's reservation:\n%s", output);
    cr_expect_gt(json_number(shim, "alloc_median_ns"), 0);
    cr_expect_geq(json_number(shim, "alloc_p99_ns"), json_number(shim, "alloc_median_ns"));
    cr_expect_gt(json_number(shim, "simulated_peak_reserved"), 0, "the simulated peak beside");

    snprintf(args, sizeof args, "%s", log);
    rc = run_replay(NULL, args);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, output);
    cr_expect(strstr(output, "alloc p50") && strstr(output, "alloc p99") && strstr(output, "simulated") &&
                  strstr(output, "recorded") && strstr(output, "\n0       default "),
              "the table:\n%s", output);
    unlink(log);
    unlink(companion);
    (void)build;
}

/* tests/data/logs/recorded.csv: 6 events 100 ms apart (the first at 0). */
Test(replay_gpu, gpu_lag_spins_the_log_gaps_and_bounds_how_far_the_gpu_falls_behind)
{
    const char *data = getenv("POOLSHIM_TEST_DATA");
    cr_assert(data, "POOLSHIM_TEST_DATA must be set (make test-shim sets it)");
    char args[1024];
    snprintf(args, sizeof args, "%s/logs/recorded.csv --gpu-lag 1ms --json", data);
    int rc = run_replay(NULL, args);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, output);
    cr_expect_eq(json_number(output, "lag_kernels"), 5, "one kernel per gap:\n%s", output);
    double work_error = json_number(output, "gpu_work_s") - 0.4999;
    cr_expect(work_error < 1e-6 && work_error > -1e-6, "the gaps add up to the log's 499.9 ms:\n%s",
              output);
    cr_expect_eq(json_number(output, "lag_waits"), 0, "a GPU that is always done needs no wait:\n%s", output);

    /* a GPU that never finishes on its own: each event waits for the previous kernel (100 ms > 1 ms) */
    rc = run_replay("FAKE_CUDA_EVENTS_PENDING=1000000", args);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, output);
    cr_expect_eq(json_number(output, "lag_waits"), 4, "the host waited to stay within 1 ms:\n%s", output);
    /* ... unless the bound is wider than the whole log */
    snprintf(args, sizeof args, "%s/logs/recorded.csv --gpu-lag 1s --json", data);
    rc = run_replay("FAKE_CUDA_EVENTS_PENDING=1000000", args);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, output);
    cr_expect_eq(json_number(output, "lag_waits"), 0, "within 1 s, no wait:\n%s", output);
}

/* debug.nvtx: the blocks reach an NVTX tool (the fake one) as regions inside
 * heaps, with the expandable range and with chunks; nothing when off. */
static void expect_nvtx(const char *env, const char *mode, const char *scenario)
{
    const char *build = getenv("POOLSHIM_BUILD");
    char tool[1024], full[2048];
    snprintf(tool, sizeof tool, "%s/fake/libfake_nvtx.so", build);
    if (access(tool, F_OK) != 0)
        cr_skip_test("built without the NVTX headers");
    snprintf(full, sizeof full, "NVTX_INJECTION64_PATH=%s %s", tool, env);
    char prog[64];
    snprintf(prog, sizeof prog, "prog_runtime %s %s", scenario, mode);
    int rc = run(1, full, prog);
    cr_expect_eq(rc, 0, "%s exited %d:\n%s", prog, rc, output);
    cr_expect(strstr(output, "shim active") != NULL, "%s", output);
}
Test(nvtx, blocks_are_regions_in_expandable_heaps)
{
    expect_nvtx("POOLSHIM_NVTX=1 POOLSHIM_OPTIONS=resource.main.expandable=1", "on", "nvtx");
}
Test(nvtx, blocks_are_regions_in_chunk_heaps)
{
    expect_nvtx("POOLSHIM_OPTIONS=debug.nvtx=on,resource.main.expandable=0", "on", "nvtx");
}
Test(nvtx, every_stack_type_registers_its_blocks)
{
    static const char *types[] = {"arena", "binning"}; /* binning: fixed_size bins over a pool */
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char env[128];
        snprintf(env, sizeof env, "POOLSHIM_NVTX=1 POOLSHIM_RESOURCE=%s", types[i]);
        expect_nvtx(env, "on", "nvtx");
    }
}
Test(nvtx, nothing_is_registered_when_off)
{
    expect_nvtx("", "off", "nvtx");
}

/* debug.nvtx_ranges: growth, a barrier and the decay's release reach the
 * tool as ranges that all close; none when off. */
Test(nvtx, ranges_show_growth_barriers_and_releases)
{
    expect_nvtx("POOLSHIM_NVTX_RANGES=1 POOLSHIM_DECAY_MS=40 POOLSHIM_OPTIONS=resource.main.barrier_floor=0",
                "on", "nvtx_ranges"); /* chunks (the fake driver's default) */
    expect_nvtx("POOLSHIM_NVTX_RANGES=1 POOLSHIM_DECAY_MS=40 "
                "POOLSHIM_OPTIONS=resource.main.barrier_floor=0,resource.main.expandable=1",
                "on", "nvtx_ranges"); /* the expandable range: maps and unmaps */
}
Test(nvtx, no_range_when_ranges_are_off)
{
    expect_nvtx("POOLSHIM_DECAY_MS=40 POOLSHIM_OPTIONS=resource.main.barrier_floor=0", "off", "nvtx_ranges");
}

/* debug.guard through the shim's real GPU-ops table (over the fake driver):
 * an overflow of one byte is reported with the block; a clean run and the
 * same overflow without the option report nothing. */
Test(guard, one_byte_overflow_is_reported_with_the_block)
{
    int rc = run(1, "POOLSHIM_GUARD=64", "prog_runtime guard overflow");
    cr_expect_eq(rc, 0, "%s", output);
    const char *at = strstr(output, "guard: block 3 was ");
    cr_assert(at, "%s", output);
    char block[64], expected[256];
    sscanf(at + strlen("guard: block 3 was "), "%63s", block);
    snprintf(expected, sizeof expected,
             "poolshim: error: guard: block %s (1003 bytes, cudaMalloc): 1 of the 64 red-zone bytes after it were "
             "overwritten, the first at +0 past its end", block);
    cr_expect(strstr(output, expected), "expected\n%s\nin\n%s", expected, output);
    cr_expect_eq(strstr(output, "red-zone") ? strstr(strstr(output, "red-zone") + 1, "red-zone") : NULL, NULL,
                 "one report only: %s", output);
}
Test(guard, clean_program_and_option_off_report_nothing)
{
    int rc = run(1, "POOLSHIM_GUARD=64", "prog_runtime guard clean");
    cr_expect_eq(rc, 0, "%s", output);
    cr_expect_null(strstr(output, "red-zone"), "%s", output);
    rc = run(1, NULL, "prog_runtime guard overflow");
    cr_expect_eq(rc, 0, "%s", output);
    cr_expect_null(strstr(output, "red-zone"), "without debug.guard the overflow goes unseen: %s", output);
}

/* ---- a barrier's calls per live stream (shim/gpu_ops_cuda.c, 4. b and d) ---- */
/* prog_runtime barrier_streams: 4 non-blocking streams, one cudaFree'd block
 * reused through a barrier. Idle streams (the fake's default) are asked once
 * each and get no event record: the barrier records only its own event and
 * makes each stream wait for it. Busy ones (FAKE_CUDA_STREAMS_BUSY=1) each
 * get a record and a legacy-stream wait besides. */
/* Runs prog_runtime `what` (barrier_streams, barrier_lagging) under `env`
 * with barrier_floor 0 and the statistics in JSON, and reads the calls it
 * printed. */
static void run_barrier_rounds(const char *env, const char *what, unsigned long *records, unsigned long *waits,
                               unsigned long *queries)
{
    char full[256], prog[64], label[64];
    snprintf(full, sizeof full, "%s POOLSHIM_STATS=json POOLSHIM_OPTIONS=resource.main.barrier_floor=0", env);
    snprintf(prog, sizeof prog, "prog_runtime %s", what);
    expect_pass(1, full, prog, "shim active");
    snprintf(label, sizeof label, "%s: ", what);
    const char *line = strstr(output, label);
    cr_assert(line && sscanf(line + strlen(label), "records=%lu waits=%lu queries=%lu", records, waits, queries) == 3,
              "%s", output);
}

static void expect_barrier_calls(const char *busy, unsigned long queries_per, unsigned long records_per,
                                 unsigned long waits_per)
{
    unsigned long records = 0, waits = 0, queries = 0;
    run_barrier_rounds(busy, "barrier_streams", &records, &waits, &queries);
    double barriers = json_number(output, "barriers");
    cr_assert_geq(barriers, 1, "the reuse of A must have issued a barrier:\n%s", output);
    unsigned long n = (unsigned long)barriers;
    cr_expect_eq(queries, queries_per * n, "%s: queries %lu for %lu barriers", busy, queries, n);
    cr_expect_eq(records, records_per * n, "%s: records %lu for %lu barriers", busy, records, n);
    cr_expect_eq(waits, waits_per * n, "%s: waits %lu for %lu barriers", busy, waits, n);
    /* the host time of each barrier is counted (stats "cuda_time", shim/stats.c) */
    const char *timed = strstr(output, "\"cuda_time\": {\"barrier\": ");
    cr_assert_not_null(timed, "%s", output);
    cr_expect_eq(json_number(timed, "calls"), barriers, "cuda_time.barrier.calls:\n%s", output);
    cr_expect_gt(json_number(timed, "ns"), 0, "cuda_time.barrier.ns:\n%s", output);
}
Test(barrier, idle_streams_get_no_event_record) { expect_barrier_calls("FAKE_CUDA_STREAMS_BUSY=0", 4, 1, 4); }
Test(barrier, busy_streams_each_get_a_record_and_a_wait_besides) { expect_barrier_calls("FAKE_CUDA_STREAMS_BUSY=1", 4, 5, 8); }
/* the measurement switch of tools/bench/torch_mem/ddp.sh: no join, so busy streams
 * are neither asked nor recorded (the GPU suite's hazard control catches it) */
Test(barrier, no_join_switch_leaves_busy_streams_out)
{
    expect_barrier_calls("FAKE_CUDA_STREAMS_BUSY=1 POOLSHIM_TEST_BARRIER_NO_JOIN=1", 0, 1, 4);
}

/* prog_runtime barrier_lagging: 4 streams without work of their own, a
 * barrier per pair. Each barrier makes them wait for its E (4. d). With E
 * done at once, every barrier finds each stream idle (4 queries, E's
 * record, 4 waits). With E left pending (the host ahead of the GPU) that
 * wait is work not yet done: from the second barrier on each stream reads
 * busy and is joined (a record and a legacy-stream wait besides), and the
 * barriers count as joining 4 streams (not quiet, core/reuse.c 6b), as on
 * an H200 for the 32 streams PyTorch's conv-net process hardly uses. */
static void expect_lagging_barriers(const char *env, int pending)
{
    unsigned long records = 0, waits = 0, queries = 0;
    run_barrier_rounds(env, "barrier_lagging", &records, &waits, &queries);
    unsigned long n = (unsigned long)json_number(output, "barriers");
    cr_assert_geq(n, 3, "a barrier per pair expected:\n%s", output);
    cr_expect_eq(queries, 4 * n, "%s: stream queries %lu for %lu barriers", env, queries, n);
    cr_expect_eq(records, pending ? 1 + 5 * (n - 1) : n, "%s: records %lu for %lu barriers", env, records, n);
    cr_expect_eq(waits, pending ? 4 + 8 * (n - 1) : 4 * n, "%s: waits %lu for %lu barriers", env, waits, n);
    cr_expect_eq(json_number(output, "barrier_joins"), pending ? 4 : 0, "%s: barrier_joins:\n%s", env, output);
    /* every barrier the table issued, and the quiet ones: with E pending only the first */
    double issued = json_number(output, "barriers_issued"), quiet = json_number(output, "barriers_quiet");
    cr_expect_geq(issued, (double)n, "%s: barriers_issued:\n%s", env, output);
    cr_expect_eq(quiet, pending ? 1 : issued, "%s: barriers_quiet %.0f of %.0f:\n%s", env, quiet, issued, output);
}
Test(barrier, streams_waiting_for_a_pending_barrier_are_busy_and_joined)
{
    expect_lagging_barriers("FAKE_CUDA_EVENTS_PENDING=1000000", 1);
}
Test(barrier, streams_whose_barrier_wait_is_done_are_idle) { expect_lagging_barriers("", 0); }

/* The unversioned cuStreamDestroy, by cuGetProcAddress below version 4000
 * and by dlsym: the shim forgets the stream, so no barrier touches it. */
Test(barrier, a_stream_destroyed_by_the_unversioned_entry_is_forgotten)
{
    expect_pass(1, "POOLSHIM_OPTIONS=resource.main.barrier_floor=0", "prog_runtime stream_destroy_v1 gpa",
                "stream_destroy_v1 gpa: ok");
    expect_pass(1, "POOLSHIM_OPTIONS=resource.main.barrier_floor=0", "prog_runtime stream_destroy_v1 dlsym",
                "stream_destroy_v1 dlsym: ok");
}

/* ---- the eager barrier follows what barriers join (gpu_ops barrier_joined) ---- */
/* prog_runtime eager_quiet: the same 16 pairs of 17 MiB issue a barrier per
 * ~2 pairs while barriers join no stream, and only once the share of the
 * reserve is pending while they join a busy non-blocking stream or the
 * program made a blocking one (the negative controls of each other). */
static double eager_barriers(const char *env, const char *mode, double joins)
{
    char cmd[128], full[512];
    snprintf(cmd, sizeof cmd, "prog_runtime eager_quiet %s", mode);
    snprintf(full, sizeof full, "%s POOLSHIM_STATS=json POOLSHIM_OPTIONS=resource.main.barrier_pending_percent=40", env);
    expect_pass(1, full, cmd, "shim active");
    cr_expect_eq(json_number(output, "barrier_joins"), joins, "%s: the statistics' barrier_joins:\n%s", mode, output);
    return json_number(output, "barriers");
}

Test(barrier, eager_barriers_skip_the_share_only_while_they_join_no_stream)
{
    double quiet = eager_barriers("", "none", 0);
    double busy = eager_barriers("FAKE_CUDA_STREAMS_BUSY=1", "busy", 1);
    double blocking = eager_barriers("FAKE_CUDA_STREAMS_BUSY=1", "blocking", 1);
    double idle_blocking = eager_barriers("", "blocking", 0);
    cr_log_info("barriers: quiet %.0f, busy stream %.0f, busy blocking stream %.0f, idle blocking stream %.0f", quiet,
                busy, blocking, idle_blocking);
    cr_expect_geq(quiet, 6, "legacy stream only: a barrier per ~2 pairs of 17 MiB, got %.0f", quiet);
    cr_expect_geq(quiet, 2 * busy, "a busy non-blocking stream: the share applies (%.0f vs %.0f)", busy, quiet);
    cr_expect_geq(quiet, 2 * blocking, "a busy blocking stream: the share applies (%.0f vs %.0f)", blocking, quiet);
    cr_expect_eq(idle_blocking, quiet, "an idle blocking stream (cuBLASLt's) joins nothing: %.0f vs %.0f", idle_blocking,
                 quiet);
}

/* ---- remap of idle pieces (shim/gpu_ops_cuda.c: barrier numbers, barrier_passed) ---- */
/* prog_runtime remap over the fake driver's virtual memory: with the barrier
 * events completed (the fake's events complete at once) the remap moves A's
 * pieces with no wait; while they stay pending (FAKE_CUDA_EVENTS_PENDING:
 * every query answers not ready that many times) it waits for the barrier
 * that released them (cuEventSynchronize of its event, barrier_wait), or,
 * with the barriers skipped (no event to wait for), synchronizes. */
/* lend: remap_lend (the default 1; 0: the host waits for busy pieces).
 * The scenario's first block (64 MiB, made before any free) must be pieces:
 * as a setup run (expandable_setup_run_min) the small block cut from its
 * back would pin it, and nothing would move. */
#define REMAP_PIECES "resource.main.expandable_setup_run_min=0"
static void expect_remap_as(const char *env, int lend, double syncs, double idle, double waits, double lent)
{
    char full[512];
    snprintf(full, sizeof full,
             "FAKE_CUDA_VMM=1 POOLSHIM_STATS=json "
             "POOLSHIM_OPTIONS=resource.main.expandable=1,resource.main.remap_lend=%d," REMAP_PIECES " %s",
             lend, env);
    expect_pass(1, full, "prog_runtime remap", "shim active");
    cr_expect_eq(json_number(output, "remap_syncs"), syncs, "%s:\n%s", env, output);
    cr_expect_eq(json_number(output, "remaps_idle"), idle, "%s:\n%s", env, output);
    cr_expect_eq(json_number(output, "remap_waits"), waits, "%s:\n%s", env, output);
    cr_expect_eq(json_number(output, "remaps_lent"), lent, "%s:\n%s", env, output);
}
static void expect_remap_waits(const char *env, double syncs, double idle, double waits)
{
    expect_remap_as(env, 0, syncs, idle, waits, 0);
}
static void expect_remap(const char *env, double syncs, double idle)
{
    char full[512];
    snprintf(full, sizeof full,
             "FAKE_CUDA_VMM=1 POOLSHIM_STATS=json POOLSHIM_OPTIONS=resource.main.expandable=1," REMAP_PIECES " %s", env);
    expect_pass(1, full, "prog_runtime remap", "shim active");
    cr_expect_eq(json_number(output, "remap_syncs"), syncs, "%s:\n%s", env, output);
    cr_expect_eq(json_number(output, "remaps_idle"), idle, "%s:\n%s", env, output);
}
Test(remap, pieces_of_a_passed_barrier_move_without_a_synchronize) { expect_remap("", 0, 1); }
Test(remap, pieces_of_a_pending_barrier_wait_for_that_barrier)
{
    expect_remap_waits("FAKE_CUDA_EVENTS_PENDING=1000000", 0, 0, 1);
}
Test(remap, pieces_of_a_pending_barrier_lend_their_memory_without_a_wait)
{
    /* remap_lend (the default): the growth maps the busy pieces' memory a
     * second time; the shim's vm_map_handle of a mapped handle (cuMemMap) */
    expect_remap_as("FAKE_CUDA_EVENTS_PENDING=1000000", 1, 0, 0, 0, 1);
}
Test(remap, a_reset_gives_back_lent_memory_once)
{
    /* (the exit statistics are the new context's: the program checks the
     * fake driver's counters around the reset itself) */
    expect_pass(1, "FAKE_CUDA_VMM=1 FAKE_CUDA_EVENTS_PENDING=1000000 POOLSHIM_OPTIONS=" REMAP_PIECES,
                "prog_runtime remap_reset", "shim active");
    cr_expect(strstr(output, "released once by the reset"), "%s", output);
}
Test(remap, with_barriers_skipped_there_is_nothing_to_wait_for_so_it_synchronizes)
{
    expect_remap_waits("FAKE_CUDA_EVENTS_PENDING=1000000 POOLSHIM_TEST_SKIP_BARRIER=1", 1, 0, 0);
}
Test(remap, the_assume_idle_switch_skips_the_synchronize)
{
    /* the negative control of tests/gpu/remap_idle.cu, on the fake driver */
    expect_remap("FAKE_CUDA_EVENTS_PENDING=1000000 POOLSHIM_TEST_ASSUME_IDLE=1", 0, 1);
}

/* The version, from the file VERSION (`make test-shim` names it in
 * POOLSHIM_TEST_VERSION_FILE): poolshim_version() of the preloaded library, the
 * JSON report's "version", the text report's first line and the verbose
 * start-up line all carry it. */
static const char *expected_version(void)
{
    static char version[64];
    const char *path = getenv("POOLSHIM_TEST_VERSION_FILE");
    FILE *f = fopen(path && *path ? path : "VERSION", "r");
    cr_assert(f, "cannot read the VERSION file (POOLSHIM_TEST_VERSION_FILE=%s)", path ? path : "");
    cr_assert(fgets(version, sizeof version, f), "VERSION is empty");
    fclose(f);
    version[strcspn(version, " \t\r\n")] = 0;
    cr_assert(version[0], "VERSION is empty");
    return version;
}

/* The stack is built when the program's runtime makes the primary context
 * (cuDevicePrimaryCtxRetain, found through cuGetProcAddress as the real
 * runtime does), not by the first allocation: a fresh process's first
 * cudaMalloc no longer pays for it (H200: 0.3-0.6 ms of a 1 GiB one). */
Test(context, the_stack_is_built_where_the_context_is_made)
{
    expect_pass(1, "POOLSHIM_VERBOSE=2", "prog_runtime context_first", "shim active");
    const char *ready = strstr(output, "device 0: stack ready");
    const char *marker = strstr(output, "context_first: context made, no allocation yet");
    cr_assert(ready && marker, "%s", output);
    cr_expect(ready < marker, "the stack is ready before the first allocation:\n%s", output);
    cr_expect_null(strstr(ready + 1, "device 0: stack ready"), "built once:\n%s", output);
}

/* poolshim_stats_json (shim/poolshim.h): a program reads the exit report's
 * JSON while it runs; with three 1 MiB blocks held it counts three
 * cudaMallocs and 3 MiB requested, after the frees three cudaFrees and
 * nothing requested (prog_runtime checks the buffer rules itself). */
Test(stats_json, a_program_reads_its_statistics_while_it_runs)
{
    expect_pass(0, NULL, "prog_runtime stats_json", "shim inactive");
    cr_expect(strstr(output, "stats_json: (absent)"), "natively there is no poolshim_stats_json:\n%s", output);
    expect_pass(1, "POOLSHIM_STATS=json POOLSHIM_STATS_FILE=/dev/null", "prog_runtime stats_json", "shim active");
    const char *held = strstr(output, "stats_json held: {\"poolshim\": 1, ");
    const char *freed = strstr(output, "stats_json freed: {\"poolshim\": 1, ");
    cr_assert(held && freed && held < freed, "two reports, held then freed:\n%s", output);
    const char *held_end = strchr(held, '\n');
    const char *calls = strstr(held, "\"cudaMalloc\": 3, \"cudaFree\": 0, ");
    const char *bytes = strstr(held, "\"requested_current\": 3145728, ");
    cr_expect(calls && calls < held_end && bytes && bytes < held_end, "held: 3 cudaMalloc, 0 cudaFree, 3 MiB:\n%s", output);
    calls = strstr(freed, "\"cudaMalloc\": 3, \"cudaFree\": 3, ");
    bytes = strstr(freed, "\"requested_current\": 0, ");
    cr_expect(calls && bytes && calls < strchr(freed, '\n') && bytes < strchr(freed, '\n'),
              "freed: 3 cudaFree, nothing requested:\n%s", output);
}

Test(version, poolshim_version_and_the_reports_carry_the_version_file)
{
    const char *v = expected_version();
    char want[128], env[512], path[128];
    expect_pass(0, NULL, "prog_runtime version", "shim inactive");
    cr_expect(strstr(output, "poolshim_version() = (absent)"), "natively there is no poolshim_version:\n%s", output);

    snprintf(path, sizeof path, "/tmp/poolshim-version-%d.json", getpid());
    snprintf(env, sizeof env, "POOLSHIM_STATS=json POOLSHIM_STATS_FILE=%s POOLSHIM_VERBOSE=2", path);
    expect_pass(1, env, "prog_runtime version", "shim active");
    snprintf(want, sizeof want, "poolshim_version() = %s\n", v);
    cr_expect(strstr(output, want), "expected '%s' in:\n%s", want, output);
    const char *info = strstr(output, "active (pid ");
    snprintf(want, sizeof want, ", version %s): ", v);
    cr_expect(info && strstr(info, want) && strstr(info, want) < strchr(info, '\n'),
              "the verbose start-up line names version %s:\n%s", v, output);
    char json[8192];
    take_report(path, json, sizeof json);
    snprintf(want, sizeof want, ", \"version\": \"%s\", ", v);
    cr_expect(!strncmp(json, "{\"poolshim\": 1, \"pid\": ", 23) && strstr(json, want) && strstr(json, want) < strstr(json, "\"devices\""),
              "a top-level '%s' after the pid:\n%s", want, json);

    expect_pass(1, "POOLSHIM_STATS=text", "prog_runtime version", "shim active");
    snprintf(want, sizeof want, "(poolshim %s)\n", v);
    const char *header = strstr(output, "poolshim: statistics of pid ");
    cr_expect(header && strstr(header, want) && strstr(header, want) < strchr(header, '\n'),
              "the text report's first line names poolshim %s:\n%s", v, output);
    cr_expect(header && strstr(header, "poolshim: device 0 (stack:") > header, "the header comes first:\n%s", output);
}

/* ---- exit hints: a framework's own cache keeps its memory from the shim (shim/hints.c) ---- */
#define TORCH_HINT "poolshim: warning: PyTorch's caching allocator was on, so poolshim served only "
#define CUPY_HINT "poolshim: warning: CuPy was loaded and poolshim served only "

static int occurrences(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* prog_runtime framework with `lib` (a file of the build's fake folder, or
 * NULL) loaded, `pairs` cudaMalloc/cudaFree pairs and `env` besides */
static void run_framework(int preload, const char *lib, const char *env, int pairs, const char *active)
{
    char vars[1024], prog[64];
    snprintf(vars, sizeof vars, "%s%s%s%s", lib ? "FAKE_FRAMEWORK_LIB=" : "", lib ? getenv("POOLSHIM_BUILD") : "",
             lib ? lib : "", env ? env : "");
    snprintf(prog, sizeof prog, "prog_runtime framework %d", pairs);
    expect_pass(preload, vars, prog, active);
}

Test(hints, pytorch_with_its_cache_on_gets_one_hint_at_exit)
{
    run_framework(1, "/fake/libc10_cuda.so", NULL, 4, "shim active");
    cr_expect_eq(occurrences(output, TORCH_HINT "4 allocations (its cache holds the memory); run with "
                                     "PYTORCH_NO_CUDA_MEMORY_CACHING=1 to let poolshim serve PyTorch\n"),
                 1, "one hint:\n%s", output);
    cr_expect_eq(occurrences(output, CUPY_HINT), 0, "no CuPy hint:\n%s", output);
    run_framework(1, "/fake/libc10_cuda.so", " PYTORCH_NO_CUDA_MEMORY_CACHING=0 POOLSHIM_STATS=text", 4, "shim active");
    cr_expect_eq(occurrences(output, TORCH_HINT "4 allocations"), 1, "=0 leaves the cache on:\n%s", output);
    const char *report = strstr(output, "poolshim: statistics of pid ");
    cr_expect(report && strstr(output, TORCH_HINT) > report, "the hint comes after the report:\n%s", output);
}

Test(hints, pytorch_with_its_cache_off_gets_none)
{
    run_framework(1, "/fake/libc10_cuda.so", " PYTORCH_NO_CUDA_MEMORY_CACHING=1", 4, "shim active");
    cr_expect_eq(occurrences(output, TORCH_HINT), 0, "no hint with the cache off:\n%s", output);
    run_framework(1, "/fake/libc10_cuda.so", " PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync", 4, "shim active");
    cr_expect_eq(occurrences(output, TORCH_HINT), 0, "no hint with the cudaMallocAsync backend:\n%s", output);
}

Test(hints, cupy_with_few_allocations_gets_one_hint)
{
    run_framework(1, "/fake/cupy/cuda/memory.so", NULL, 4, "shim active");
    cr_expect_eq(occurrences(output, CUPY_HINT "4 allocations: CuPy's memory pool may be on; "
                                    "cupy.cuda.set_allocator(None) lets poolshim serve it\n"),
                 1, "one hint:\n%s", output);
    cr_expect_eq(occurrences(output, TORCH_HINT), 0, "no PyTorch hint:\n%s", output);
}

Test(hints, cupy_with_many_allocations_gets_none)
{
    run_framework(1, "/fake/cupy/cuda/memory.so", NULL, 100, "shim active");
    cr_expect_eq(occurrences(output, CUPY_HINT), 0, "the shim served CuPy:\n%s", output);
}

Test(hints, nothing_loaded_gets_none)
{
    run_framework(1, NULL, NULL, 4, "shim active");
    cr_expect(!strstr(output, TORCH_HINT) && !strstr(output, CUPY_HINT), "no framework, no hint:\n%s", output);
}

Test(hints, verbose_0_disable_and_native_get_none)
{
    run_framework(1, "/fake/libc10_cuda.so", " POOLSHIM_VERBOSE=0", 4, "shim active");
    cr_expect_eq(occurrences(output, TORCH_HINT), 0, "POOLSHIM_VERBOSE=0 silences it:\n%s", output);
    run_framework(1, "/fake/cupy/cuda/memory.so", " POOLSHIM_VERBOSE=0", 4, "shim active");
    cr_expect_eq(occurrences(output, CUPY_HINT), 0, "POOLSHIM_VERBOSE=0 silences it:\n%s", output);
    run_framework(1, "/fake/libc10_cuda.so", " POOLSHIM_DISABLE=1", 4, "shim inactive");
    cr_expect_eq(occurrences(output, TORCH_HINT), 0, "disabled: nothing:\n%s", output);
    run_framework(0, "/fake/libc10_cuda.so", NULL, 4, "shim inactive");
    cr_expect_eq(occurrences(output, TORCH_HINT), 0, "natively: nothing:\n%s", output);
}

/* The torch door (shim/hooks_torch.c), loaded with dlopen as PyTorch's
 * CUDAPluggableAllocator loads it, no LD_PRELOAD: a freed tensor's block comes
 * back after a barrier; the barrier makes the streams the door was told of
 * wait (by an allocation on them, or by record_stream: it fails when
 * record_stream is ignored, POOLSHIM_TEST_TORCH_NO_JOIN: tried) and no other;
 * a thread with no current context allocates (fails without the context step:
 * tried); the statistics count the calls as cuMemAllocAsync. */
static void expect_torch_door(const char *env, const char *what)
{
    char args[1024];
    snprintf(args, sizeof args, "prog_torch %s/libpoolshim.so %s", getenv("POOLSHIM_BUILD"), what);
    char expect[64];
    snprintf(expect, sizeof expect, "OK %s (door active)", what);
    expect_pass(0, env, args, expect);
}
#define FLOOR_0                                                                                            \
    "POOLSHIM_OPTIONS=resource.main.barrier_floor=0,resource.main.thread_cache=0,"                             \
    "resource.main.expandable_map_first=0 FAKE_CUDA_VMM=1"
Test(torch_door, a_freed_tensor_comes_back_after_a_barrier) { expect_torch_door(FLOOR_0, "reuse"); }
Test(torch_door, the_barrier_waits_for_the_streams_the_door_was_told_of) { expect_torch_door(FLOOR_0, "streams"); }
Test(torch_door, the_negative_control_ignoring_record_stream_is_caught)
{
    char args[1024];
    snprintf(args, sizeof args, "prog_torch %s/libpoolshim.so streams", getenv("POOLSHIM_BUILD"));
    int rc = run(0, FLOOR_0 " POOLSHIM_TEST_TORCH_NO_JOIN=1", args);
    cr_expect_neq(rc, 0, "the streams scenario passed with record_stream ignored:\n%s", output);
    cr_expect(strstr(output, "the barrier made the side and the recorded stream wait (1 waits)"), "%s", output);
}
Test(torch_door, the_statistics_count_the_door) { expect_torch_door(NULL, "counts"); }
Test(torch_door, a_thread_without_a_context_allocates) { expect_torch_door(NULL, "thread"); }
