/* The shim's own statistics: calls by function and door, passthrough and
 * invalid frees, bytes requested, time inside the shim. Counters live per
 * thread and are summed at exit; byte counters and timing only when
 * statistics are enabled. The exit report adds what each device's stack
 * says about itself (reserved bytes, upstream calls, fences). */
#ifndef PS_SHIM_STATS_H
#define PS_SHIM_STATS_H

#include <stdint.h>
#include <stdio.h>

#include "shim.h"

extern int ps_stats_enabled; /* 1: count bytes and time calls */

typedef struct ps_shim_stats {
    uint64_t calls[PS_CALL_COUNT];   /* intercepted calls served, by function */
    uint64_t doors[2];               /* by door: runtime, driver */
    uint64_t failures;               /* allocations that returned an error */
    uint64_t alloc_ns, free_ns;      /* time inside the shim (stats enabled only) */
    int64_t requested_current;       /* bytes asked for and not freed */
    int64_t requested_peak;          /* maximum of requested_current */
    uint64_t requested_total;        /* sum of bytes asked for */
} ps_shim_stats_t;

void ps_stats_init(int enabled);

/* Counting a call served (router.c, on every allocation and free). The
 * usual case, statistics off and the call a success, is one relaxed
 * add to this thread's own counter, inline; the rest (the thread's first
 * call, failures, bytes and time) is done by the _all functions. */
void ps_stats_count_allocate_all(int device, int call, int door, size_t size, int status, uint64_t ns);
void ps_stats_count_free_all(int device, int call, int door, size_t size, uint64_t ns);
/* This thread's calls[device][call] counters (stats.c), NULL before its
 * first counted call. Only this thread writes them; readers sum every
 * thread's block with relaxed loads. */
extern PS_TLS uint64_t (*ps_stats_my_calls)[PS_CALL_COUNT];
#define PS_STATS_BUMP(field, n) \
    __atomic_store_n(&(field), __atomic_load_n(&(field), __ATOMIC_RELAXED) + (n), __ATOMIC_RELAXED)

static inline void ps_stats_count_allocate(int device, int call, int door, size_t size, int status, uint64_t ns)
{
    uint64_t(*calls)[PS_CALL_COUNT] = ps_stats_my_calls;
    if (PS_LIKELY(calls && status == PS_OK && !ps_stats_enabled))
        PS_STATS_BUMP(calls[device][call], 1);
    else
        ps_stats_count_allocate_all(device, call, door, size, status, ns);
}

static inline void ps_stats_count_free(int device, int call, int door, size_t size, uint64_t ns)
{
    uint64_t(*calls)[PS_CALL_COUNT] = ps_stats_my_calls;
    if (PS_LIKELY(calls && !ps_stats_enabled))
        PS_STATS_BUMP(calls[device][call], 1);
    else
        ps_stats_count_free_all(device, call, door, size, ns);
}

void ps_stats_count_passthrough(int device);
void ps_stats_count_invalid(int call);
/* IPC of pooled blocks (router.c): handles of ours handed out, opened here,
 * and requests refused (export or open); in the report when nonzero. */
enum { PS_IPC_EXPORTED = 0, PS_IPC_OPENED, PS_IPC_REFUSED, PS_IPC_COUNT };
void ps_stats_count_ipc(int what);
/* Sums the counters of device `device` over all threads. */
void ps_stats_snapshot(int device, ps_shim_stats_t *out);
uint64_t ps_stats_passthrough_total(void);
/* Writes the whole report (all devices) as text or JSON. */
void ps_stats_write(FILE *f, int json);
/* atexit: report, flush logs, leak report. Touches memory and files only. */
void ps_stats_report_at_exit(void);
void ps_stats_atfork_child(void);
/* In a forked child of a process that built stacks: the exit report does
 * nothing (the stacks' locks may be held, the figures are the parent's). */
void ps_stats_forget_at_exit(void);

#endif
