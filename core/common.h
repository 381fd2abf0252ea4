/* poolshim: things every layer shares — status codes, stream handles, the
 * message path, size helpers.
 *
 * THE RETURN RULE (one rule for the whole code base):
 *   functions that can fail return an int status: PS_OK (0) on success, a
 *   negative PS_E* code otherwise. Output values go through pointer
 *   arguments, which are left untouched on failure. Predicates (is, has,
 *   whether something happened) return bool; counts return the count.
 *   Nothing aborts on a runtime error; asserts guard only internal
 *   invariants.
 *
 * Naming: public API poolshim_*, internals ps_*, types ps_x_t, macros PS_*.
 * core/ never includes a CUDA header: streams and events are opaque here.
 */
#ifndef PS_COMMON_H
#define PS_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Status codes (the return rule above). */
enum {
    PS_OK = 0,
    PS_ENOMEM = -1,      /* out of memory: the request cannot be served now */
    PS_EINVAL = -2,      /* bad argument: unknown pointer, double free, bad size */
    PS_EUPSTREAM = -3,   /* the upstream (CUDA) failed in a way that is not OOM */
    PS_ENOTREADY = -4,   /* an event/fence has not completed yet (not an error) */
    PS_ECONFIG = -5,     /* invalid configuration */
    PS_EUNSUPPORTED = -6, /* the operation is not available on this resource */
    PS_EBUSY = -7,        /* not possible right now (e.g. a stream capture is open); nothing changed */
    PS_ECAPTURE = -8      /* prohibited while a stream capture is open, as CUDA answers (stream capture unsupported) */
};

/* Human-readable name of a status code ("out of memory", ...). */
const char *ps_status_name(int status);

/* A stream, as CUDA's CUstream/cudaStream_t, carried opaquely. Value 0 is
 * the legacy default stream (as for cudaMallocAsync(p, n, 0)). */
typedef uintptr_t ps_stream_t;

/* Not a stream: the allocation/free is not stream-ordered (cudaMalloc /
 * cudaFree). Its memory must be safe for every stream; the free goes
 * through the pool's free_sync policy. */
#define PS_STREAM_NONE ((ps_stream_t)UINTPTR_MAX)

/* CUDA's special stream handles, repeated here without the header. */
#define PS_STREAM_LEGACY ((ps_stream_t)0x1)     /* CU_STREAM_LEGACY */
#define PS_STREAM_PER_THREAD ((ps_stream_t)0x2) /* CU_STREAM_PER_THREAD */

/* ---- sizes ---------------------------------------------------------- */
#define PS_KiB ((size_t)1 << 10)
#define PS_MiB ((size_t)1 << 20)
#define PS_GiB ((size_t)1 << 30)
#define PS_TiB ((size_t)1 << 40)

/* Round up to a multiple of a power of two; returns 0 on overflow. */
static inline size_t ps_align_up(size_t n, size_t alignment)
{
    size_t r = (n + alignment - 1) & ~(alignment - 1);
    return r < n ? 0 : r;
}
static inline int ps_is_pow2(size_t x) { return x && !(x & (x - 1)); }

/* Formats a byte count with binary units ("1.5 MiB") into buf; returns buf. */
char *ps_format_bytes(char *buf, size_t bufsize, uint64_t bytes);

/* Monotonic clock in nanoseconds. */
uint64_t ps_now_ns(void);

/* Field 22 of /proc/<pid>/stat: when the process started (clock ticks after
 * boot); 0 when it is gone or a zombie. With the pid it names a process
 * for good (a reused pid has another start). */
unsigned long long ps_process_start(int pid);

/* ---- locks ------------------------------------------------------------ */
/* A small lock for hot paths whose critical sections are short: one
 * compare-and-swap when free; a waiter spins briefly, then sleeps in the
 * kernel (a futex; the three-state mutex of Drepper's "Futexes Are
 * Tricky"), and an unlock wakes one sleeper only when there is one. Costs a
 * tenth of a pthread mutex lock+unlock when uncontended. Waiters sleep
 * rather than yield: threads that yield in a loop on a contended lock spend
 * their time in sched_yield and make no progress (docs/benchmarks.md). */
typedef struct ps_lock {
    int held; /* 0 free, 1 held, 2 held and a thread may sleep on it; __atomic builtins */
} ps_lock_t;
#define PS_LOCK_INIT {0}
void ps_lock_slow(ps_lock_t *lock);
void ps_lock_wake(ps_lock_t *lock);
/* Takes the lock if it is free; true when taken. */
static inline bool ps_lock_try(ps_lock_t *lock)
{
    int expected = 0;
    return __atomic_compare_exchange_n(&lock->held, &expected, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}
static inline void ps_lock(ps_lock_t *lock)
{
    if (__builtin_expect(ps_lock_try(lock), 1))
        return;
    ps_lock_slow(lock);
}
static inline void ps_unlock(ps_lock_t *lock)
{
    if (__builtin_expect(__atomic_exchange_n(&lock->held, 0, __ATOMIC_RELEASE) == 2, 0))
        ps_lock_wake(lock);
}

/* A spinlock for a structure its owner thread locks on every operation
 * and other threads only rarely (a thread's cache, a thread's registry
 * table): unlocking is a plain release store, where ps_unlock needs an
 * atomic exchange to learn of sleepers, which costs as much as the lock
 * itself (a 256 B cudaMalloc+cudaFree pair takes four such locks). A
 * waiter spins, then yields: never use it where threads meet often (see
 * ps_lock's note on yielding). */
typedef struct ps_spin {
    int held; /* 0 free, 1 held; __atomic builtins */
} ps_spin_t;
#define PS_SPIN_INIT {0}
static inline int ps_spin_try(ps_spin_t *lock)
{
    return !__atomic_exchange_n(&lock->held, 1, __ATOMIC_ACQUIRE);
}
void ps_spin_slow(ps_spin_t *lock);
static inline void ps_spin_lock(ps_spin_t *lock)
{
    if (__builtin_expect(ps_spin_try(lock), 1))
        return;
    ps_spin_slow(lock);
}
static inline void ps_spin_unlock(ps_spin_t *lock) { __atomic_store_n(&lock->held, 0, __ATOMIC_RELEASE); }

/* ---- messages -------------------------------------------------------- */
/* One message path for the whole library: every line goes to stderr (or the
 * file set with ps_message_set_fd) with the prefix "poolshim: <level>: ".
 * Never allocates (formats into a stack buffer), so it is safe in hooks,
 * at exit and after fork. */
enum { PS_MSG_ERROR = 0, PS_MSG_WARNING = 1, PS_MSG_INFO = 2, PS_MSG_DEBUG = 3 };

/* Messages above this level are dropped (default PS_MSG_WARNING). */
extern int ps_verbosity;

void ps_message(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ps_vmessage(int level, const char *fmt, va_list ap);
void ps_message_set_fd(int fd);

#define ps_error(...) ps_message(PS_MSG_ERROR, __VA_ARGS__)
#define ps_warning(...) ps_message(PS_MSG_WARNING, __VA_ARGS__)
#define ps_info(...) ps_message(PS_MSG_INFO, __VA_ARGS__)
#define ps_debug(...) ps_message(PS_MSG_DEBUG, __VA_ARGS__)

#endif
