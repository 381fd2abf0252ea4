/* log adaptor: every allocate, free and failed allocate as one CSV line in
 * RMM's logging_resource_adaptor format (core/adaptors.h), so RMM's
 * REPLAY_BENCHMARK and `poolshim replay` read our logs:
 *
 *   Thread,Time,Action,Pointer,Size,Stream
 *   12345,23:41:07.123456,allocate,0x7f3a40000000,1024,0x0
 *
 * Thread is the OS thread id, Time the wall clock (local time, as spdlog's
 * "%H:%M:%S.%f"), Action one of `allocate`, `free`, `allocate failure`
 * (pointer 0x0), Pointer and Stream in 0x hex, Size in bytes. A cudaMalloc/
 * cudaFree (PS_STREAM_NONE) is logged on stream 0x0, as RMM logs its
 * default stream.
 *
 * Algorithm: lines are formatted on the caller's stack, then appended to an
 * in-memory buffer under a mutex; the buffer is written out (one write per
 * buffer) when it fills, at ps_log_flush and at destroy.
 * Guarantees: thread-safe; lines never interleave; the header is written
 * at creation.
 */
#include "adaptors.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LOG_BUFFER_BYTES (256 * 1024) /* flushed when full */
#define LOG_HEADER "Thread,Time,Action,Pointer,Size,Stream\n"

typedef struct log_adaptor {
    ps_resource_t base;   /* vtable first */
    int fd;               /* the CSV file */
    pthread_mutex_t lock; /* guards the buffer and fd writes */
    char *buffer;         /* lines not yet written */
    size_t used;          /* bytes in buffer */
    int write_failed;     /* a write failed once (warned) */
} log_adaptor_t;

/* Writes the buffer out. Lock held. */
static int flush_locked(log_adaptor_t *l)
{
    size_t done = 0;
    while (done < l->used) {
        ssize_t w = write(l->fd, l->buffer + done, l->used - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (!l->write_failed)
                ps_warning("log '%s': cannot write the event log: %s", l->base.name, strerror(errno));
            l->write_failed = 1;
            l->used = 0;
            return PS_EUPSTREAM;
        }
        done += (size_t)w;
    }
    l->used = 0;
    return PS_OK;
}

static void log_event(log_adaptor_t *l, const char *action, void *ptr, size_t size, ps_stream_t stream)
{
    char line[160];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    uintptr_t shown_stream = stream == PS_STREAM_NONE ? 0 : stream;
    int n = snprintf(line, sizeof line, "%ld,%02d:%02d:%02d.%06ld,%s,0x%lx,%zu,0x%lx\n",
                     (long)syscall(SYS_gettid), tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000,
                     action, (unsigned long)(uintptr_t)ptr, size, (unsigned long)shown_stream);
    if (n <= 0 || (size_t)n >= sizeof line)
        return;
    pthread_mutex_lock(&l->lock);
    if (l->used + (size_t)n > LOG_BUFFER_BYTES)
        flush_locked(l);
    memcpy(l->buffer + l->used, line, (size_t)n);
    l->used += (size_t)n;
    pthread_mutex_unlock(&l->lock);
}

static int log_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    int status = ps_allocate(r->upstream, size, stream, out);
    log_event((log_adaptor_t *)r, status == PS_OK ? "allocate" : "allocate failure",
              status == PS_OK ? *out : NULL, size, stream);
    return status;
}

static int log_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    /* logged before the upstream call, as RMM does: the pointer may be
     * handed out again (and logged by another thread) right after */
    log_event((log_adaptor_t *)r, "free", ptr, size, stream);
    return ps_deallocate(r->upstream, ptr, size, stream);
}

static int log_trim(ps_resource_t *r) { return ps_trim(r->upstream); }

int ps_log_flush(ps_resource_t *log_adaptor)
{
    log_adaptor_t *l = (log_adaptor_t *)log_adaptor;
    pthread_mutex_lock(&l->lock);
    int status = flush_locked(l);
    pthread_mutex_unlock(&l->lock);
    return status;
}

static void log_destroy(ps_resource_t *r)
{
    log_adaptor_t *l = (log_adaptor_t *)r;
    ps_log_flush(r);
    close(l->fd);
    pthread_mutex_destroy(&l->lock);
    free(l->buffer);
    free(l);
}

static const ps_resource_ops_t log_ops = {
    .type_name = "log",
    .allocate = log_allocate,
    .deallocate = log_deallocate,
    .trim = log_trim,
    .query = NULL, /* the upstream's figures */
    .destroy = log_destroy,
};

int ps_log_create(const char *name, ps_resource_t *upstream, const char *path, ps_resource_t **out)
{
    if (!upstream || !out || !path || !*path)
        return PS_EINVAL;
    log_adaptor_t *l = calloc(1, sizeof *l);
    char *buffer = malloc(LOG_BUFFER_BYTES);
    if (!l || !buffer) {
        free(l);
        free(buffer);
        return PS_ENOMEM;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        ps_error("log: cannot open '%s': %s", path, strerror(errno));
        free(l);
        free(buffer);
        return PS_ECONFIG;
    }
    l->base.ops = &log_ops;
    l->base.name = name ? name : "log";
    l->base.upstream = upstream;
    l->fd = fd;
    l->buffer = buffer;
    pthread_mutex_init(&l->lock, NULL);
    memcpy(l->buffer, LOG_HEADER, sizeof LOG_HEADER - 1);
    l->used = sizeof LOG_HEADER - 1;
    *out = &l->base;
    return PS_OK;
}
