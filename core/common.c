/* Shared helpers: status names, the one message path, byte formatting,
 * the monotonic clock, a process's start time. */
#include "common.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int ps_verbosity = PS_MSG_WARNING;
static int message_fd = 2; /* stderr unless ps_message_set_fd */

const char *ps_status_name(int status)
{
    switch (status) {
    case PS_OK: return "success";
    case PS_ENOMEM: return "out of memory";
    case PS_EINVAL: return "invalid argument";
    case PS_EUPSTREAM: return "upstream (CUDA) failure";
    case PS_ENOTREADY: return "not ready";
    case PS_ECONFIG: return "invalid configuration";
    case PS_EUNSUPPORTED: return "not supported";
    case PS_EBUSY: return "not possible now (a stream capture is open)";
    case PS_ECAPTURE: return "prohibited while a stream capture is open";
    default: return "unknown status";
    }
}

void ps_message_set_fd(int fd) { message_fd = fd; }

void ps_vmessage(int level, const char *fmt, va_list ap)
{
    static const char *const names[] = {"error", "warning", "info", "debug"};
    if (level > ps_verbosity)
        return;
    char buf[1024]; /* on the stack: no allocation, safe at exit and in hooks */
    int n = snprintf(buf, sizeof buf, "poolshim: %s: ", names[level < 0 ? 0 : level > 3 ? 3 : level]);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    if (len == 0 || buf[len - 1] != '\n')
        buf[len++] = '\n';
    /* one write() so lines of several threads do not interleave */
    ssize_t w = write(message_fd, buf, len);
    (void)w;
}

void ps_message(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ps_vmessage(level, fmt, ap);
    va_end(ap);
}

char *ps_format_bytes(char *buf, size_t bufsize, uint64_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, bufsize, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, bufsize, "%.*f %s", v < 10 ? 2 : v < 100 ? 1 : 0, v, units[u]);
    return buf;
}

uint64_t ps_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One spin-wait step: tells the CPU this is a spin loop (on x86, `pause`
 * lets the sibling hyperthread run and avoids a memory-order flush when the
 * lock is released). */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#endif
}

void ps_lock_slow(ps_lock_t *lock)
{
    /* A short spin first (critical sections are short: the holder usually
     * leaves within a few hundred nanoseconds), reading before trying. */
    for (int spins = 0; spins < 100; spins++) {
        cpu_relax();
        if (!__atomic_load_n(&lock->held, __ATOMIC_RELAXED) && ps_lock_try(lock))
            return;
    }
    /* Then sleep: mark the lock "held, maybe sleepers" (2), and sleep while
     * it stays so. Whoever takes it through here leaves it at 2, so its
     * unlock wakes the next sleeper (at worst one needless wake). */
    while (__atomic_exchange_n(&lock->held, 2, __ATOMIC_ACQUIRE) != 0)
        syscall(SYS_futex, &lock->held, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void ps_spin_slow(ps_spin_t *lock)
{
    for (int spins = 0;; spins++) {
        if (spins < 100)
            cpu_relax();
        else
            sched_yield(); /* the holder may be descheduled */
        if (!__atomic_load_n(&lock->held, __ATOMIC_RELAXED) && ps_spin_try(lock))
            return;
    }
}

void ps_lock_wake(ps_lock_t *lock) { syscall(SYS_futex, &lock->held, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0); }

unsigned long long ps_process_start(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* (the command may hold spaces and parentheses) */
    if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X')
        return 0;
    p += 2; /* field 3 */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}
