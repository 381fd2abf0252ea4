/* sampler: a sampling profiler to LD_PRELOAD where perf is missing (a GPU
 * machine in a container often has none).
 *
 *   LD_PRELOAD=build/libpoolshim.so:build/sampler.so SAMPLER_OUT=samples.txt PROGRAM ARGS
 *   python3 tools/prof/resolve.py samples.txt build/libpoolshim.so PROGRAM   # here, per function
 *
 * Algorithm
 *  1. At load: a POSIX timer on CLOCK_MONOTONIC (hrtimer-based, so every
 *     SAMPLER_US microseconds, default 20; ITIMER_PROF ticks only at the
 *     kernel's HZ) delivers SIGPROF to the thread that loaded the library
 *     (the main thread: profile single-threaded loops). SAMPLER_MODE=process
 *     instead samples every thread by process CPU time (ITIMER_PROF: at the
 *     kernel's tick, 4 ms at HZ=250, so run for seconds).
 *  2. The handler stores the interrupted instruction pointer in a fixed
 *     array (no allocation, async-signal-safe).
 *  3. At exit: each sample becomes "object+0xOFFSET" (or its exported
 *     symbol, from dladdr), counted, written to SAMPLER_OUT (default
 *     stderr), most frequent first. resolve.py maps offsets to function
 *     names with nm of local copies of the objects (libcuda's internals
 *     stay one line per library).
 * The handler costs a few microseconds per sample: the profiled loop runs
 * slower, the split between functions is what it shows. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define MAX_SAMPLES (1u << 22)
#define MAX_NAMES 8192

static uintptr_t samples[MAX_SAMPLES];
static atomic_uint sample_count;
static timer_t timer;

static void on_sample(int sig, siginfo_t *info, void *context)
{
    (void)sig;
    (void)info;
    unsigned i = atomic_fetch_add_explicit(&sample_count, 1, memory_order_relaxed);
    if (i < MAX_SAMPLES)
        samples[i] = (uintptr_t)((ucontext_t *)context)->uc_mcontext.gregs[REG_RIP];
}

__attribute__((constructor)) static void sampler_start(void)
{
    struct sigaction sa = {0};
    sa.sa_sigaction = on_sample;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    long us = getenv("SAMPLER_US") ? atol(getenv("SAMPLER_US")) : 20;
    if (getenv("SAMPLER_MODE") && !strcmp(getenv("SAMPLER_MODE"), "process")) {
        struct itimerval every = {{0, 1000}, {0, 1000}};
        setitimer(ITIMER_PROF, &every, NULL);
        return;
    }
    struct sigevent sev = {0};
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGPROF;
    sev._sigev_un._tid = gettid();
    if (timer_create(CLOCK_MONOTONIC, &sev, &timer) != 0)
        return;
    struct itimerspec period = {{us / 1000000, us % 1000000 * 1000}, {us / 1000000, us % 1000000 * 1000}};
    timer_settime(timer, 0, &period, NULL);
}

typedef struct {
    char name[200];
    unsigned count;
} named_count_t;

static int by_count(const void *a, const void *b)
{
    unsigned x = ((const named_count_t *)a)->count, y = ((const named_count_t *)b)->count;
    return (x < y) - (x > y);
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

__attribute__((destructor)) static void sampler_stop(void)
{
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    if (timer)
        timer_delete(timer);
    unsigned n = atomic_load(&sample_count);
    if (n > MAX_SAMPLES)
        n = MAX_SAMPLES;
    static named_count_t names[MAX_NAMES];
    unsigned used = 0;
    for (unsigned i = 0; i < n; i++) {
        Dl_info info;
        char name[200] = "?";
        if (dladdr((void *)samples[i], &info) && info.dli_sname)
            snprintf(name, sizeof name, "%s (%s)", info.dli_sname, base_name(info.dli_fname));
        else if (dladdr((void *)samples[i], &info))
            snprintf(name, sizeof name, "%s+0x%lx", base_name(info.dli_fname),
                     (unsigned long)(samples[i] - (uintptr_t)info.dli_fbase));
        unsigned j = 0;
        while (j < used && strcmp(names[j].name, name))
            j++;
        if (j == used) {
            if (used == MAX_NAMES)
                continue;
            strcpy(names[used].name, name);
            names[used++].count = 0;
        }
        names[j].count++;
    }
    qsort(names, used, sizeof names[0], by_count);
    FILE *out = getenv("SAMPLER_OUT") ? fopen(getenv("SAMPLER_OUT"), "w") : NULL;
    if (!out)
        out = stderr;
    fprintf(out, "sampler: %u samples\n", n);
    for (unsigned j = 0; j < used; j++)
        fprintf(out, "%6.2f%% %6u  %s\n", 100.0 * names[j].count / (n ? n : 1), names[j].count, names[j].name);
    if (out != stderr)
        fclose(out);
}
