/* The shim's own statistics: calls by function and door, passthrough and
 * invalid frees, bytes requested, time inside the shim. Counters live per
 * thread and are summed at exit; byte counters and timing only when
 * statistics are enabled (per thread too; times are sampled, see below).
 * The exit report adds what each device's stack says about itself
 * (reserved bytes, upstream calls, fences). */
#ifndef PS_SHIM_STATS_H
#define PS_SHIM_STATS_H

#include <stdint.h>
#include <stdio.h>

#include "common.h"

extern int ps_stats_enabled; /* 1: count bytes and time calls */

typedef struct ps_shim_stats {
    uint64_t calls[PS_CALL_COUNT];   /* intercepted calls served, by function */
    uint64_t doors[2];               /* by door: runtime, driver */
    uint64_t failures;               /* allocations that returned an error */
    uint64_t alloc_ns, free_ns;      /* time inside the shim, estimated from sampled calls (stats on only) */
    int64_t requested_current;       /* bytes asked for and not freed */
    int64_t requested_peak;          /* maximum of requested_current */
    uint64_t requested_total;        /* sum of bytes asked for */
} ps_shim_stats_t;

void ps_stats_init(int enabled);

/* Time inside the shim is sampled: each thread times one call in
 * PS_STATS_SAMPLE_EVERY of each kind (its first, then every 64th), with a
 * countdown of its own per kind, so alternating allocations and frees do
 * not bias it. The report's times are estimates: per thread, device and
 * kind, the mean of the timed calls times the number of calls (stats.c). */
#define PS_STATS_SAMPLE_EVERY 64
enum { PS_STATS_TIME_ALLOCATE, PS_STATS_TIME_FREE, PS_STATS_TIME_HOST_ALLOCATE, PS_STATS_TIME_HOST_FREE,
       PS_STATS_TIME_KINDS };
extern PS_TLS uint32_t ps_stats_countdown[PS_STATS_TIME_KINDS]; /* calls of each kind until the next timed one */

/* The clock at the start of a call of `kind` when statistics are on and this
 * call is one to time; 0 otherwise (router.c passes it to the count). */
static inline uint64_t ps_stats_clock_start(int kind)
{
    if (PS_LIKELY(!ps_stats_enabled))
        return 0;
    uint32_t left = ps_stats_countdown[kind];
    if (PS_LIKELY(left != 0)) {
        ps_stats_countdown[kind] = left - 1;
        return 0;
    }
    ps_stats_countdown[kind] = PS_STATS_SAMPLE_EVERY - 1;
    return ps_now_ns();
}

/* Counting a call served (router.c, on every allocation and free);
 * `clock_start` is ps_stats_clock_start's answer for the call. The usual
 * case, statistics off and the call a success, is one relaxed add to this
 * thread's own counter, inline; the rest (the thread's first call,
 * failures, bytes and time) is done by the _all functions, which write
 * this thread's counters only (a shared atomic only when a thread's
 * unflushed bytes pass 4 MiB: stats.c). */
void ps_stats_count_allocate_all(int device, int call, int door, size_t size, int status, uint64_t clock_start);
void ps_stats_count_free_all(int device, int call, int door, size_t size, uint64_t clock_start);
/* This thread's calls[device][call] counters (stats.c), NULL before its
 * first counted call. Only this thread writes them; readers sum every
 * thread's block with relaxed loads. */
extern PS_TLS uint64_t (*ps_stats_my_calls)[PS_CALL_COUNT];
#define PS_STATS_BUMP(field, n) \
    __atomic_store_n(&(field), __atomic_load_n(&(field), __ATOMIC_RELAXED) + (n), __ATOMIC_RELAXED)

static inline void ps_stats_count_allocate(int device, int call, int door, size_t size, int status,
                                           uint64_t clock_start)
{
    uint64_t(*calls)[PS_CALL_COUNT] = ps_stats_my_calls;
    if (PS_LIKELY(calls && status == PS_OK && !ps_stats_enabled))
        PS_STATS_BUMP(calls[device][call], 1);
    else
        ps_stats_count_allocate_all(device, call, door, size, status, clock_start);
}

static inline void ps_stats_count_free(int device, int call, int door, size_t size, uint64_t clock_start)
{
    uint64_t(*calls)[PS_CALL_COUNT] = ps_stats_my_calls;
    if (PS_LIKELY(calls && !ps_stats_enabled))
        PS_STATS_BUMP(calls[device][call], 1);
    else
        ps_stats_count_free_all(device, call, door, size, clock_start);
}

void ps_stats_count_passthrough(int device);
/* Statistics of a dropped stack: its live allocations' bytes are gone. */
void ps_stats_count_dropped(int device, uint64_t bytes);
/* Counts a free of a foreign pointer that CUDA itself refused (a stack
 * address, say): bad pointers are counted whoever answers them. */
void ps_stats_count_foreign_invalid(void);
void ps_stats_count_invalid(int call);
/* IPC of pooled blocks (router.c): handles of ours handed out, opened here,
 * and requests refused (export or open); in the report when nonzero. */
enum { PS_IPC_EXPORTED = 0, PS_IPC_OPENED, PS_IPC_REFUSED, PS_IPC_COUNT };
void ps_stats_count_ipc(int what);
/* The out-of-memory retry (oom.c, ps_route_oom_give_back) on `device`:
 * bytes the stack gave back for it, retries that then succeeded or failed,
 * give-backs left out because a stream capture was open. Rare: process-wide
 * atomics; in the JSON report always, in the text report when nonzero. */
enum { PS_OOM_GIVEN_BACK = 0, PS_OOM_SUCCEEDED, PS_OOM_FAILED, PS_OOM_SKIPPED_CAPTURE, PS_OOM_COUNT };
void ps_stats_count_oom(int device, int what, uint64_t n);
/* Memory given back while the program runs (shim/give.c, shim/neighbours.c)
 * on `device`: bytes the decay gave back from the device pool and from the
 * pinned host pool, bytes given to neighbours that asked; requests this
 * process sent to its neighbours, answers it got, and the bytes they said
 * they gave. Rare: process-wide atomics; in the JSON report always, in the
 * text report when nonzero. */
enum {
    PS_GIVE_DECAY = 0,
    PS_GIVE_DECAY_HOST,
    PS_GIVE_TO_NEIGHBOURS,
    PS_GIVE_ASKED,
    PS_GIVE_ANSWERS,
    PS_GIVE_FROM_NEIGHBOURS,
    PS_GIVE_COUNT
};
void ps_stats_count_give(int device, int what, uint64_t n);
/* Host time spent inside the GPU-ops table's slow entries, per device
 * (gpu_ops_cuda.c pushes it; the report shows it as "cuda_time"): what a
 * program's time in cudaMalloc went to. Counted only while statistics are
 * on (two clock reads per entry); kept across resets (indexed by device,
 * not table). Process-wide atomics. */
enum {
    PS_OP_TIME_BARRIER, /* barrier */
    PS_OP_TIME_WAIT,    /* host waits: barrier_wait, fence_wait, device_synchronize */
    PS_OP_TIME_MAP,     /* vm_map, vm_map_handle, host_vm_map */
    PS_OP_TIME_UNMAP,   /* vm_unmap, vm_unmap_keep */
    PS_OP_TIME_CHUNK,   /* mem_alloc, mem_free (chunks and direct allocations) */
    PS_OP_TIME_KINDS
};
void ps_stats_count_cuda_time(int device, int kind, uint64_t ns);
/* Sums the counters of device `device` over all threads. */
void ps_stats_snapshot(int device, ps_shim_stats_t *out);
uint64_t ps_stats_passthrough_total(void);
/* Writes the whole report (all devices) as text or JSON. */
void ps_stats_write(FILE *f, int json);
/* The process's place in its job as JSON members, each followed by ", ":
 * "rank", "local_rank", "node" (whole numbers, when the launcher set them),
 * "hostname", and "job", "step" (strings, under Slurm); config.h's
 * ps_job_place says which variables. */
void ps_stats_write_place(FILE *f);
/* The JSON report while the program runs (the live page, poolshim_stats_json):
 * ps_stats_write under the devices' report lock, since a context reset
 * writes what the report reads. */
void ps_stats_write_now(FILE *f);
/* At exit: report, flush logs, leak report. Touches memory and files only.
 * True when this is the process's own exit (not a forked child's), after
 * which the hints may follow (hints.h). */
bool ps_stats_report_at_exit(void);
void ps_stats_atfork_child(void);
/* Device allocations the shim served (cudaMalloc, cudaMallocAsync,
 * cuMemAlloc, cuMemAllocAsync), all devices and threads; kept with
 * statistics off too. */
uint64_t ps_stats_allocations_total(void);
/* In a forked child of a process that built stacks: the exit report does
 * nothing (the stacks' locks may be held, the figures are the parent's). */
void ps_stats_forget_at_exit(void);

#endif
