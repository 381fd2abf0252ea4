/* Replay on the real GPU (tools/replay_gpu.h).
 *
 * Parent (replay_gpu_run), per stack and device (after replay_gpu_driver_present
 * said libcuda.so.1 can be loaded here: "no GPU here" comes first):
 *   1. Make a private temporary directory; run this executable again as
 *      `poolshim replay-gpu-driver LOG DEVICE LAG RESULT` with the shim
 *      preloaded (LD_PRELOAD += libpoolshim.so, found as `run` finds it),
 *      every POOLSHIM_* variable of the environment cleared, then
 *      POOLSHIM_CONFIG (the stack), POOLSHIM_OPTIONS=global.meminfo=device
 *      (cuMemGetInfo must report the device, not the pool), POOLSHIM_STATS
 *      =json and POOLSHIM_STATS_FILE in the directory. `native` runs the
 *      driver without the shim (plain cuMemAlloc / cuMemFree).
 *   2. Wait; read the driver's result (JSON) and the shim's statistics
 *      (bytes.reserved_peak: what the stack really reserved); remove the
 *      directory.
 * Driver (replay_gpu_driver_main), in the child:
 *   1. dlopen libcuda.so.1 (absent: "no GPU here", exit 1), cuInit, make the
 *      device's primary context current, note the device's used memory.
 *   2. Replay the device's events in log order on one thread with the
 *      replay engine (tools/replay.c) over a resource whose allocate and
 *      free are the driver's cuMemAlloc_v2 / cuMemFree_v2 (logged stream 0,
 *      a cudaMalloc) or cuMemAllocAsync / cuMemFreeAsync on a stream made
 *      for each logged stream handle; under the shim these are its hooks
 *      (its dlsym hands them out). Each call is timed with the host clock.
 *   3. Before each event (outside the timed call): with a GPU lag, launch
 *      the spin kernel for the log's time since the previous event on the
 *      legacy stream (gaps under 2 us are carried to the next), record an
 *      event, and wait for the oldest events while the GPU is more than
 *      the lag behind in log time; sample cuMemGetInfo every 256 events
 *      and after any allocation slower than 20 us (a growth).
 *   4. Synchronize, sample once more, write the result, exit (the shim
 *      writes its statistics at exit).
 * Guarantees: the CLI needs no GPU, no CUDA library at build time and none
 * at run time unless a GPU replay is asked for; every failure names what
 * failed ("cuInit: error 100").
 */
#include "replay_gpu.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../core/resource.h"
#include "../shim/cuda_abi.h"
#include "cli.h"
#include "memlog.h"
#include "replay.h"
#include "stats_table.h"

extern char **environ;

typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;

/* The spin kernel: busy-waits on %globaltimer for its argument's nanoseconds.
 * Checked with ptxas (sm_75, sm_90) by the unit tests where the toolkit is. */
const char replay_gpu_spin_ptx[] =
    ".version 7.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry ps_spin(.param .u64 ps_spin_ns)\n"
    "{\n"
    "    .reg .pred  %p<2>;\n"
    "    .reg .b64   %rd<6>;\n"
    "    ld.param.u64    %rd1, [ps_spin_ns];\n"
    "    mov.u64         %rd2, %globaltimer;\n"
    "LOOP:\n"
    "    mov.u64         %rd3, %globaltimer;\n"
    "    sub.s64         %rd4, %rd3, %rd2;\n"
    "    setp.lt.u64     %p1, %rd4, %rd1;\n"
    "    @%p1 bra        LOOP;\n"
    "    ret;\n"
    "}\n";

/* ---- the driver -------------------------------------------------------- */

/* The driver functions the replay uses (dlsym on libcuda.so.1). */
typedef struct cuda_api {
    CUresult (*init)(unsigned flags);
    CUresult (*device_get_count)(int *count);
    CUresult (*primary_retain)(CUcontext *ctx, CUdevice device);
    CUresult (*ctx_set_current)(CUcontext ctx);
    CUresult (*ctx_synchronize)(void);
    CUresult (*mem_alloc)(CUdeviceptr *ptr, size_t size);
    CUresult (*mem_free)(CUdeviceptr ptr);
    CUresult (*mem_alloc_async)(CUdeviceptr *ptr, size_t size, CUstream stream);
    CUresult (*mem_free_async)(CUdeviceptr ptr, CUstream stream);
    CUresult (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
    CUresult (*stream_create)(CUstream *stream, unsigned flags);
    CUresult (*event_create)(CUevent *event, unsigned flags);
    CUresult (*event_record)(CUevent event, CUstream stream);
    CUresult (*event_query)(CUevent event);
    CUresult (*event_synchronize)(CUevent event);
    CUresult (*module_load_data)(CUmodule *module, const void *image);
    CUresult (*module_get_function)(CUfunction *function, CUmodule module, const char *name);
    CUresult (*launch_kernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shared, CUstream stream, void **params, void **extra);
} cuda_api_t;

#define LAG_RING 1024        /* events in flight for the lag bound */
#define LAG_MIN_SPIN_NS 2000 /* shorter gaps are carried to the next spin */
#define SAMPLE_EVERY 256     /* cuMemGetInfo every this many events */
#define SLOW_CALL_NS 20000   /* and after an allocation this slow (a growth) */
#define MAX_STREAMS 256      /* distinct logged stream handles */

/* A resource over the driver's allocation calls, and the replay's GPU state. */
typedef struct driver_replay {
    ps_resource_t base;              /* the resource the replay engine calls (first member) */
    cuda_api_t cu;                   /* the driver */
    uint64_t logged[MAX_STREAMS];    /* logged stream handles seen */
    CUstream streams[MAX_STREAMS];   /* the stream made for each */
    size_t stream_count;             /* entries used */
    uint64_t last_alloc_ns;          /* duration of the last allocate */
    uint64_t events_seen;            /* events so far */
    uint64_t used_at_start;          /* total - free before the replay */
    uint64_t used_peak;              /* highest total - free seen */
    uint64_t total;                  /* device memory */
    uint64_t lag_ns;                 /* the lag bound (0: no GPU work) */
    CUfunction spin;                 /* the spin kernel */
    CUevent ring[LAG_RING];          /* events after each spin, oldest at ring_head */
    double ring_time[LAG_RING];      /* the log time each one stands for */
    size_t ring_head, ring_count;    /* the ring's window */
    double previous_time;            /* log time of the previous event */
    double carried_s;                /* gap time not yet spun */
    uint64_t kernels, waits;         /* spin kernels launched, host waits for the bound */
    double gpu_work_s;               /* spin time enqueued */
    int failed;                      /* a CUDA call of the lag machinery failed (reported once) */
} driver_replay_t;

static int driver_error(const char *what, CUresult rc)
{
    fprintf(stderr, "poolshim: error: replay on the GPU: %s: CUDA error %d\n", what, rc);
    return -1;
}

static CUstream stream_for(driver_replay_t *d, ps_stream_t stream)
{
    if (stream == PS_STREAM_LEGACY || stream == PS_STREAM_PER_THREAD)
        return (CUstream)stream;
    for (size_t i = 0; i < d->stream_count; i++)
        if (d->logged[i] == (uint64_t)stream)
            return d->streams[i];
    CUstream made = NULL;
    if (d->stream_count == MAX_STREAMS || d->cu.stream_create(&made, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        return NULL; /* the legacy stream: ordered with everything */
    d->logged[d->stream_count] = (uint64_t)stream;
    d->streams[d->stream_count++] = made;
    return made;
}

static int driver_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    driver_replay_t *d = (driver_replay_t *)r;
    uint64_t start = ps_now_ns();
    CUdeviceptr ptr = 0;
    CUresult rc = stream == PS_STREAM_NONE || !d->cu.mem_alloc_async
                      ? d->cu.mem_alloc(&ptr, size)
                      : d->cu.mem_alloc_async(&ptr, size, stream_for(d, stream));
    d->last_alloc_ns = ps_now_ns() - start;
    if (rc != CUDA_SUCCESS)
        return PS_ENOMEM;
    *out = (void *)(uintptr_t)ptr;
    return PS_OK;
}

static int driver_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    driver_replay_t *d = (driver_replay_t *)r;
    CUresult rc = stream == PS_STREAM_NONE || !d->cu.mem_free_async
                      ? d->cu.mem_free((CUdeviceptr)(uintptr_t)ptr)
                      : d->cu.mem_free_async((CUdeviceptr)(uintptr_t)ptr, stream_for(d, stream));
    return rc == CUDA_SUCCESS ? PS_OK : PS_EINVAL;
}

static void driver_destroy(ps_resource_t *r) { (void)r; }

static const ps_resource_ops_t driver_ops = {
    .type_name = "cuda-driver",
    .allocate = driver_allocate,
    .deallocate = driver_deallocate,
    .destroy = driver_destroy,
};

static void sample_memory(driver_replay_t *d)
{
    size_t free_bytes = 0, total = 0;
    if (d->cu.mem_get_info(&free_bytes, &total) != CUDA_SUCCESS || total < free_bytes)
        return;
    d->total = total;
    if (total - free_bytes > d->used_peak)
        d->used_peak = total - free_bytes;
}

/* Step 3: GPU work for the gap, the lag bound, memory samples. */
static void before_event(void *context, const memlog_event_t *e)
{
    driver_replay_t *d = context;
    if (d->events_seen && (d->events_seen % SAMPLE_EVERY == 0 || d->last_alloc_ns > SLOW_CALL_NS))
        sample_memory(d);
    d->last_alloc_ns = 0;
    double gap = d->events_seen ? e->time_s - d->previous_time : 0;
    d->events_seen++;
    d->previous_time = e->time_s;
    if (!d->lag_ns || d->failed)
        return;
    if (gap > 0)
        d->carried_s += gap;
    if (d->carried_s * 1e9 < LAG_MIN_SPIN_NS)
        return;
    unsigned long long ns = (unsigned long long)(d->carried_s * 1e9);
    void *params[] = {&ns};
    CUresult rc = d->cu.launch_kernel(d->spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
    if (rc != CUDA_SUCCESS) {
        d->failed = 1;
        driver_error("cuLaunchKernel (the lag kernel)", rc);
        return;
    }
    d->kernels++;
    d->gpu_work_s += d->carried_s;
    d->carried_s = 0;
    if (d->ring_count == LAG_RING) { /* full: wait for the oldest */
        d->cu.event_synchronize(d->ring[d->ring_head]);
        d->waits++;
        d->ring_head = (d->ring_head + 1) % LAG_RING;
        d->ring_count--;
    }
    size_t slot = (d->ring_head + d->ring_count) % LAG_RING;
    if ((rc = d->cu.event_record(d->ring[slot], NULL)) != CUDA_SUCCESS) {
        d->failed = 1;
        driver_error("cuEventRecord", rc);
        return;
    }
    d->ring_time[slot] = e->time_s;
    d->ring_count++;
    double bound_s = (double)d->lag_ns / 1e9;
    while (d->ring_count) {
        CUevent oldest = d->ring[d->ring_head];
        if (d->cu.event_query(oldest) != CUDA_SUCCESS) {
            if (d->ring_time[d->ring_head] >= e->time_s - bound_s)
                break; /* the GPU is within the bound */
            d->cu.event_synchronize(oldest);
            d->waits++;
        }
        d->ring_head = (d->ring_head + 1) % LAG_RING;
        d->ring_count--;
    }
}

static void no_driver_here(void)
{
    fprintf(stderr, "poolshim: error: replay on the GPU: no GPU here (cannot load libcuda.so.1: %s); "
                    "replay on a simulated device with --simulate SIZE\n", dlerror());
}

bool replay_gpu_driver_present(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL); /* no CUDA call: fork stays safe */
    if (!lib) {
        no_driver_here();
        return 0;
    }
    dlclose(lib);
    return 1;
}

static int load_api(cuda_api_t *cu, int want_lag)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        no_driver_here();
        return -1;
    }
    struct { void **slot; const char *name; int needed; } symbols[] = {
        {(void **)&cu->init, "cuInit", 1},
        {(void **)&cu->device_get_count, "cuDeviceGetCount", 1},
        {(void **)&cu->primary_retain, "cuDevicePrimaryCtxRetain", 1},
        {(void **)&cu->ctx_set_current, "cuCtxSetCurrent", 1},
        {(void **)&cu->ctx_synchronize, "cuCtxSynchronize", 1},
        {(void **)&cu->mem_alloc, "cuMemAlloc_v2", 1},
        {(void **)&cu->mem_free, "cuMemFree_v2", 1},
        {(void **)&cu->mem_alloc_async, "cuMemAllocAsync", 0},
        {(void **)&cu->mem_free_async, "cuMemFreeAsync", 0},
        {(void **)&cu->mem_get_info, "cuMemGetInfo_v2", 1},
        {(void **)&cu->stream_create, "cuStreamCreate", 1},
        {(void **)&cu->event_create, "cuEventCreate", want_lag},
        {(void **)&cu->event_record, "cuEventRecord", want_lag},
        {(void **)&cu->event_query, "cuEventQuery", want_lag},
        {(void **)&cu->event_synchronize, "cuEventSynchronize", want_lag},
        {(void **)&cu->module_load_data, "cuModuleLoadData", want_lag},
        {(void **)&cu->module_get_function, "cuModuleGetFunction", want_lag},
        {(void **)&cu->launch_kernel, "cuLaunchKernel", want_lag},
    };
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        *symbols[i].slot = dlsym(lib, symbols[i].name); /* the shim's hooks for the allocation calls */
        if (!*symbols[i].slot && symbols[i].needed) {
            fprintf(stderr, "poolshim: error: replay on the GPU: libcuda.so.1 has no %s%s\n", symbols[i].name,
                    want_lag ? " (--gpu-lag needs it)" : "");
            return -1;
        }
    }
    return 0;
}

int replay_gpu_driver_main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "poolshim: error: replay-gpu-driver: internal command (LOG DEVICE GPU_LAG_NS RESULT)\n");
        return CLI_EXIT_USAGE;
    }
    const char *log_path = argv[1], *result_path = argv[4];
    int device = atoi(argv[2]);
    static driver_replay_t d; /* large (the ring); one per process */
    memset(&d, 0, sizeof d);
    d.lag_ns = strtoull(argv[3], NULL, 10);
    d.base.ops = &driver_ops;
    d.base.name = "cuda-driver";
    memlog_t log;
    if (memlog_read(log_path, &log) != 0)
        return CLI_EXIT_FAILURE;
    int status = load_api(&d.cu, d.lag_ns > 0) == 0 ? 0 : -1;
    CUresult rc;
    int count = 0;
    CUcontext ctx = NULL;
    if (status == 0 && (rc = d.cu.init(0)) != CUDA_SUCCESS)
        status = driver_error(rc == 100 ? "cuInit: no CUDA device here (use --simulate SIZE)" : "cuInit", rc);
    if (status == 0 && (rc = d.cu.device_get_count(&count)) != CUDA_SUCCESS)
        status = driver_error("cuDeviceGetCount", rc);
    if (status == 0 && device >= count) {
        fprintf(stderr, "poolshim: error: replay on the GPU: the log's device %d is not here (%d device%s)\n", device,
                count, count == 1 ? "" : "s");
        status = -1;
    }
    if (status == 0 && (rc = d.cu.primary_retain(&ctx, device)) != CUDA_SUCCESS)
        status = driver_error("cuDevicePrimaryCtxRetain", rc);
    if (status == 0 && (rc = d.cu.ctx_set_current(ctx)) != CUDA_SUCCESS)
        status = driver_error("cuCtxSetCurrent", rc);
    if (status == 0 && d.lag_ns) {
        CUmodule module;
        if ((rc = d.cu.module_load_data(&module, replay_gpu_spin_ptx)) != CUDA_SUCCESS)
            status = driver_error("cuModuleLoadData (the lag kernel's PTX)", rc);
        else if ((rc = d.cu.module_get_function(&d.spin, module, "ps_spin")) != CUDA_SUCCESS)
            status = driver_error("cuModuleGetFunction", rc);
        for (size_t i = 0; status == 0 && i < LAG_RING; i++)
            if ((rc = d.cu.event_create(&d.ring[i], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
                status = driver_error("cuEventCreate", rc);
    }
    if (status == 0) {
        d.cu.ctx_synchronize();
        sample_memory(&d);
        d.used_at_start = d.used_peak;
    }
    replay_stats_t stats;
    memset(&stats, 0, sizeof stats);
    double wall_s = 0;
    if (status == 0) {
        replay_options_t options = {.call_times = 1, .before_event = before_event, .context = &d};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        status = replay_run_with(&log, device, &d.base, &options, &stats);
        d.cu.ctx_synchronize();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        wall_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        sample_memory(&d);
    }
    if (status == 0 && d.failed)
        status = -1;
    if (status == 0) {
        FILE *f = fopen(result_path, "w");
        if (!f) {
            fprintf(stderr, "poolshim: error: replay-gpu-driver: cannot write %s: %s\n", result_path, strerror(errno));
            status = -1;
        } else {
            fprintf(f,
                    "{\"allocations\": %llu, \"frees\": %llu, \"failures\": %llu, \"alloc_median_ns\": %.0f, "
                    "\"alloc_p99_ns\": %.0f, \"free_median_ns\": %.0f, \"free_p99_ns\": %.0f, "
                    "\"peak_requested\": %llu, \"device_used_peak\": %llu, \"device_total\": %llu, "
                    "\"lag_kernels\": %llu, \"lag_waits\": %llu, \"gpu_work_s\": %.6f, \"wall_s\": %.6f, "
                    "\"first_failure_line\": %u, \"first_failure_size\": %llu}\n",
                    (unsigned long long)stats.allocations, (unsigned long long)stats.frees,
                    (unsigned long long)stats.failures,
                    replay_quantile_ns(stats.alloc_call_ns, stats.allocations, 0.5),
                    replay_quantile_ns(stats.alloc_call_ns, stats.allocations, 0.99),
                    replay_quantile_ns(stats.free_call_ns, stats.frees, 0.5),
                    replay_quantile_ns(stats.free_call_ns, stats.frees, 0.99),
                    (unsigned long long)stats.peak_requested,
                    (unsigned long long)(d.used_peak > d.used_at_start ? d.used_peak - d.used_at_start : 0),
                    (unsigned long long)d.total, (unsigned long long)d.kernels, (unsigned long long)d.waits,
                    d.gpu_work_s, wall_s, stats.first_failure_line, (unsigned long long)stats.first_failure_size);
            if (fclose(f) != 0)
                status = -1;
        }
    }
    replay_stats_free(&stats);
    memlog_free(&log);
    return status == 0 ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
}

/* ---- the parent -------------------------------------------------------- */

/* The driver's result document into `out`: each member by the field's name. */
static void read_result(const json_t *doc, replay_gpu_result_t *out)
{
#define COUNT(field) {#field, offsetof(replay_gpu_result_t, field)}
    static const struct {
        const char *key;
        size_t at;
    } counts[] = {COUNT(allocations), COUNT(frees), COUNT(failures), COUNT(first_failure_size),
                  COUNT(peak_requested), COUNT(device_used_peak), COUNT(device_total), COUNT(lag_kernels),
                  COUNT(lag_waits)},
      seconds[] = {COUNT(alloc_median_ns), COUNT(alloc_p99_ns), COUNT(free_median_ns), COUNT(free_p99_ns),
                   COUNT(gpu_work_s), COUNT(wall_s)};
#undef COUNT
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        *(uint64_t *)((char *)out + counts[i].at) = cli_json_u64(doc, counts[i].key, 0);
    for (size_t i = 0; i < sizeof seconds / sizeof seconds[0]; i++)
        *(double *)((char *)out + seconds[i].at) = cli_json_double(doc, seconds[i].key, 0);
    out->first_failure_line = (unsigned)cli_json_u64(doc, "first_failure_line", 0);
}

/* Unsets every POOLSHIM_* variable (step 1: the stack is the config's). */
static void clear_poolshim_environment(void)
{
    for (;;) {
        char name[256] = "";
        for (char **e = environ; e && *e; e++)
            if (!strncmp(*e, "POOLSHIM_", 9) && strncmp(*e, "POOLSHIM_LIB=", 13)) {
                const char *eq = strchr(*e, '=');
                snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - *e) : (int)strlen(*e), *e);
                break;
            }
        if (!name[0])
            return;
        unsetenv(name);
    }
}

static void remove_directory(const char *path)
{
    DIR *dir = opendir(path);
    if (dir) {
        struct dirent *entry;
        while ((entry = readdir(dir))) {
            if (!strcmp(entry->d_name, ".") || !strcmp(entry->d_name, ".."))
                continue;
            char file[PATH_MAX];
            snprintf(file, sizeof file, "%s/%s", path, entry->d_name);
            unlink(file);
        }
        closedir(dir);
    }
    rmdir(path);
}

int replay_gpu_run(const char *log_path, const char *config, int native, int device, uint64_t gpu_lag_ns,
                   replay_gpu_result_t *out)
{
    memset(out, 0, sizeof *out);
    out->device = device;
    out->gpu_lag_ns = gpu_lag_ns;
    char library[PATH_MAX] = "", self[PATH_MAX];
    if (!native && cli_find_library("libpoolshim.so", "POOLSHIM_LIB", library, sizeof library) != 0) {
        fprintf(stderr, "poolshim: error: replay: cannot find libpoolshim.so (set POOLSHIM_LIB)\n");
        return -1;
    }
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "poolshim: error: replay: cannot find this executable: %s\n", strerror(errno));
        return -1;
    }
    self[n] = '\0';
    char directory[] = "/tmp/poolshim-replay-XXXXXX";
    if (!mkdtemp(directory)) {
        fprintf(stderr, "poolshim: error: replay: cannot make a temporary directory: %s\n", strerror(errno));
        return -1;
    }
    char result_path[PATH_MAX], stats_path[PATH_MAX], device_text[16], lag_text[32];
    snprintf(result_path, sizeof result_path, "%s/result.json", directory);
    snprintf(stats_path, sizeof stats_path, "%s/stats.json", directory);
    snprintf(device_text, sizeof device_text, "%d", device);
    snprintf(lag_text, sizeof lag_text, "%llu", (unsigned long long)gpu_lag_ns);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "poolshim: error: replay: fork: %s\n", strerror(errno));
        remove_directory(directory);
        return -1;
    }
    if (pid == 0) {
        clear_poolshim_environment();
        if (!native) {
            if (config)
                setenv("POOLSHIM_CONFIG", config, 1);
            setenv("POOLSHIM_OPTIONS", "global.meminfo=device", 1);
            setenv("POOLSHIM_STATS", "json", 1);
            setenv("POOLSHIM_STATS_FILE", stats_path, 1);
            cli_preload_append(library);
        }
        char *args[] = {"poolshim", "replay-gpu-driver", (char *)log_path, device_text, lag_text, result_path, NULL};
        execv(self, args);
        fprintf(stderr, "poolshim: error: replay: cannot run %s: %s\n", self, strerror(errno));
        _exit(CLI_EXIT_CANNOT_EXECUTE);
    }
    int wait_status;
    while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR)
        ;
    int status = cli_exit_code_of(wait_status) == 0 ? 0 : -1;
    if (status != 0 && WIFSIGNALED(wait_status))
        fprintf(stderr, "poolshim: error: replay on the GPU: the driver was killed by signal %d\n",
                WTERMSIG(wait_status));
    char *text = NULL;
    if (status == 0 && cli_read_file(result_path, &text, NULL) != 0) {
        fprintf(stderr, "poolshim: error: replay on the GPU: the driver wrote no result\n");
        status = -1;
    }
    if (status == 0) {
        char err[256];
        json_t *doc = cli_json_parse(text, err, sizeof err);
        if (!doc) {
            fprintf(stderr, "poolshim: error: replay on the GPU: bad result: %s\n", err);
            status = -1;
        } else {
            read_result(doc, out);
            json_decref(doc);
        }
    }
    free(text);
    if (status == 0 && !native) {
        stats_job_t job = {0};
        char err[512];
        if (stats_job_read_file(&job, stats_path, err, sizeof err) == 0 && job.count == 1) {
            out->have_shim_stats = 1;
            out->shim_reserved_peak = job.processes[0].reserved_peak;
        } else {
            fprintf(stderr, "poolshim: warning: replay on the GPU: no statistics from the shim (%s)\n", err);
        }
        free(job.processes);
    }
    remove_directory(directory);
    return status;
}

/* ---- rendering --------------------------------------------------------- */

static char *bytes_or_dash(char *buf, size_t size, int known, uint64_t bytes)
{
    if (!known)
        return snprintf(buf, size, "-"), buf;
    return cli_format_bytes(buf, size, bytes);
}

void replay_gpu_print_text(FILE *f, const char *log_name, const replay_gpu_result_t *results, size_t count)
{
    char a[32], b[32], c[32], w[32];
    fprintf(f, "log: %s, replayed on the GPU through each stack (one thread, log order)\n", log_name);
    if (count) {
        const replay_gpu_result_t *r = &results[0];
        if (r->gpu_lag_ns)
            fprintf(f, "GPU lag: a spin kernel of the log's time gaps before each call; the host waits when the "
                       "GPU is more than %s behind (%s kernels, %s of GPU work, %s host waits)\n",
                    cli_format_seconds(a, sizeof a, (double)r->gpu_lag_ns / 1e9),
                    cli_format_count(b, sizeof b, r->lag_kernels), cli_format_seconds(c, sizeof c, r->gpu_work_s),
                    cli_format_count(w, sizeof w, r->lag_waits));
        else
            fprintf(f, "GPU lag: none (the GPU is idle between calls; see --gpu-lag)\n");
    }
    fprintf(f, "\n%-6s  %-12s  %9s  %9s  %9s  %9s  %14s  %14s  %14s  %14s  %14s  %8s  %8s\n", "device", "stack",
            "alloc p50", "alloc p99", "free p50", "free p99", "peak requested", "reserved", "device used",
            "simulated", "recorded", "failures", "wall");
    for (size_t i = 0; i < count; i++) {
        const replay_gpu_result_t *r = &results[i];
        char t[4][32], requested[32], reserved[32], used[32], simulated[32], recorded[32], wall[32];
        cli_format_seconds(t[0], sizeof t[0], r->alloc_median_ns / 1e9);
        cli_format_seconds(t[1], sizeof t[1], r->alloc_p99_ns / 1e9);
        cli_format_seconds(t[2], sizeof t[2], r->free_median_ns / 1e9);
        cli_format_seconds(t[3], sizeof t[3], r->free_p99_ns / 1e9);
        fprintf(f, "%-6d  %-12s  %9s  %9s  %9s  %9s  %14s  %14s  %14s  %14s  %14s  %8llu  %8s\n", r->device, r->stack,
                t[0], t[1], t[2], t[3], cli_format_bytes(requested, sizeof requested, r->peak_requested),
                bytes_or_dash(reserved, sizeof reserved, r->have_shim_stats, r->shim_reserved_peak),
                cli_format_bytes(used, sizeof used, r->device_used_peak),
                bytes_or_dash(simulated, sizeof simulated, r->simulated_peak > 0, r->simulated_peak),
                bytes_or_dash(recorded, sizeof recorded, r->have_recorded, r->recorded_peak),
                (unsigned long long)r->failures, cli_format_seconds(wall, sizeof wall, r->wall_s));
    }
    for (size_t i = 0; i < count; i++) {
        const replay_gpu_result_t *r = &results[i];
        if (r->failures)
            fprintf(f, "FAILED: device %d, stack %s: %llu allocation%s refused on the GPU, the first at line %u "
                       "(%s); the peaks count only what was served\n",
                    r->device, r->stack, (unsigned long long)r->failures, r->failures == 1 ? "" : "s",
                    r->first_failure_line, cli_format_bytes(a, sizeof a, r->first_failure_size));
    }
    fprintf(f, "\nreserved = the shim's peak reserved bytes (its statistics); device used = peak of cuMemGetInfo's "
               "used bytes during the replay, less those used before it (sampled); simulated = the same stack "
               "replayed on a simulated device; recorded = what the recorded program's GPU held (LOG.reserved.csv)\n");
}

void replay_gpu_print_json(FILE *f, const char *log_name, const replay_gpu_result_t *results, size_t count)
{
    fprintf(f, "{\"poolshim_replay_gpu\": 1, \"log\": ");
    cli_json_string(f, log_name);
    fprintf(f, ", \"results\": [");
    for (size_t i = 0; i < count; i++) {
        const replay_gpu_result_t *r = &results[i];
        replay_json_result_open(f, i, r->device, r->stack);
        fprintf(f,
                ", \"allocations\": %llu, \"frees\": %llu, \"failures\": %llu, \"alloc_median_ns\": %.0f, "
                "\"alloc_p99_ns\": %.0f, \"free_median_ns\": %.0f, \"free_p99_ns\": %.0f, \"peak_requested\": %llu, "
                "\"reserved_peak\": ",
                (unsigned long long)r->allocations, (unsigned long long)r->frees, (unsigned long long)r->failures,
                r->alloc_median_ns, r->alloc_p99_ns, r->free_median_ns, r->free_p99_ns,
                (unsigned long long)r->peak_requested);
        cli_json_u64_or_null(f, r->have_shim_stats, r->shim_reserved_peak);
        fprintf(f, ", \"device_used_peak\": %llu, \"device_total\": %llu, \"simulated_peak_reserved\": %llu, "
                   "\"recorded_peak_reserved\": ",
                (unsigned long long)r->device_used_peak, (unsigned long long)r->device_total,
                (unsigned long long)r->simulated_peak);
        cli_json_u64_or_null(f, r->have_recorded, r->recorded_peak);
        fprintf(f, ", \"gpu_lag_ns\": %llu, \"lag_kernels\": %llu, \"lag_waits\": %llu, \"gpu_work_s\": %.6f, "
                   "\"wall_s\": %.6f}",
                (unsigned long long)r->gpu_lag_ns, (unsigned long long)r->lag_kernels,
                (unsigned long long)r->lag_waits, r->gpu_work_s, r->wall_s);
    }
    fprintf(f, "\n]}\n");
}
