/* log adaptor: every allocate, free and failed allocate as one CSV line in
 * RMM's logging_resource_adaptor format (core/adaptors.h), so RMM's
 * REPLAY_BENCHMARK and `poolshim replay` read our logs:
 *
 *   Thread,Time,Action,Pointer,Size,Stream
 *   12345,23:41:07.123456,allocate,0x7f3a40000000,1024,0x0
 *
 * Thread is the OS thread id, Time the wall clock (local, spdlog's
 * "%H:%M:%S.%f"), Action `allocate`, `free` or `allocate failure` (pointer
 * 0x0), Pointer and Stream in 0x hex, Size in bytes; a cudaMalloc/cudaFree
 * (PS_STREAM_NONE) is logged on stream 0x0, as RMM logs its default stream.
 *
 * The *companion file* PATH.reserved.csv records what the stack under it
 * really holds from the device (chunk allocations, expandable-range maps
 * and unmaps, memory given back), for `poolshim plot` and `replay`:
 *
 *   Time,Action,Bytes,Reserved,Peak
 *   23:41:07.123456,grow,8388608,8388608,8388608
 *
 * Action start (creation), grow, release, end (destroyed); Bytes the
 * change, Reserved the stack's bytes_reserved after it, Peak its
 * peak_bytes_reserved (shows a growth and release inside one call). A
 * separate file: RMM's parser throws on an action it does not know.
 *
 * Algorithm
 *  1. An event's line is formatted on the caller's stack, then appended to
 *     an in-memory buffer under a mutex; the buffer is written out (one
 *     write per buffer) when it fills, at ps_log_flush and at destroy.
 *  2. After every allocate, free and trim the stack below is queried
 *     (ps_query, one lock of the pool) under the companion's mutex; when
 *     its reserved bytes changed since the last row, a grow or release row
 *     is buffered (query and row under one mutex, so rows come in the
 *     order of the levels they report).
 * Guarantees: thread-safe; lines never interleave; the headers are written
 * at creation; the companion is best effort (a file that cannot be opened
 * is warned about once and the log goes on without it).
 */
#include "adaptors.h"
#include "safe_file.h"

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
#define RESERVED_BUFFER_BYTES (16 * 1024) /* companion rows are rare: one per growth or release */
#define RESERVED_HEADER "Time,Action,Bytes,Reserved,Peak\n"

/* One output file with its buffer. */
typedef struct log_file {
    int fd;               /* the file, or -1 (companion not open) */
    pthread_mutex_t lock; /* guards buffer, used and the file's writes (and `last_reserved`) */
    char *buffer;         /* lines not yet written */
    size_t capacity;      /* bytes buffer holds */
    size_t used;          /* bytes in buffer */
    int write_failed;     /* a write failed once (warned) */
} log_file_t;

typedef struct log_adaptor {
    ps_resource_t base;      /* vtable first */
    log_file_t events;       /* the CSV event log */
    log_file_t reserved;     /* the companion PATH.reserved.csv (fd -1 when it could not be opened) */
    uint64_t last_reserved;  /* reserved bytes of the last companion row (under reserved.lock) */
} log_adaptor_t;

/* Writes the buffer out. Lock held. */
static int flush_locked(log_adaptor_t *l, log_file_t *file)
{
    size_t done = 0;
    while (done < file->used) {
        ssize_t w = write(file->fd, file->buffer + done, file->used - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (!file->write_failed)
                ps_warning("log '%s': cannot write the %s: %s", l->base.name,
                           file == &l->events ? "event log" : "reserved-bytes companion file", strerror(errno));
            file->write_failed = 1;
            file->used = 0;
            return PS_EUPSTREAM;
        }
        done += (size_t)w;
    }
    file->used = 0;
    return PS_OK;
}

/* Appends one line. Lock held. */
static void append_locked(log_adaptor_t *l, log_file_t *file, const char *line, size_t n)
{
    if (file->used + n > file->capacity)
        flush_locked(l, file);
    memcpy(file->buffer + file->used, line, n);
    file->used += n;
}

/* "HH:MM:SS.ffffff" of now, local time, as spdlog writes it. */
static void format_time(char *out, size_t outsize)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    snprintf(out, outsize, "%02d:%02d:%02d.%06ld", tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000);
}

static void log_event(log_adaptor_t *l, const char *action, void *ptr, size_t size, ps_stream_t stream)
{
    char line[160], when[32];
    format_time(when, sizeof when);
    uintptr_t shown_stream = stream == PS_STREAM_NONE ? 0 : stream;
    int n = snprintf(line, sizeof line, "%ld,%s,%s,0x%lx,%zu,0x%lx\n", (long)syscall(SYS_gettid), when,
                     action, (unsigned long)(uintptr_t)ptr, size, (unsigned long)shown_stream);
    if (n <= 0 || (size_t)n >= sizeof line)
        return;
    pthread_mutex_lock(&l->events.lock);
    append_locked(l, &l->events, line, (size_t)n);
    pthread_mutex_unlock(&l->events.lock);
}

/* Step 2: a companion row when the stack's reserved bytes changed (always
 * for start and end, where `final_reserved` >= 0 replaces the query's
 * figure: at end the stack gives everything back). */
static void log_reserved(log_adaptor_t *l, const char *forced_action, int64_t final_reserved)
{
    if (l->reserved.fd < 0)
        return;
    pthread_mutex_lock(&l->reserved.lock);
    ps_resource_info_t info;
    memset(&info, 0, sizeof info);
    ps_query(l->base.upstream, &info);
    uint64_t now = final_reserved >= 0 ? (uint64_t)final_reserved : info.bytes_reserved;
    uint64_t peak = info.peak_bytes_reserved > info.bytes_reserved ? info.peak_bytes_reserved : info.bytes_reserved;
    if (forced_action || now != l->last_reserved) {
        const char *action = forced_action ? forced_action : now > l->last_reserved ? "grow" : "release";
        uint64_t change = now > l->last_reserved ? now - l->last_reserved : l->last_reserved - now;
        if (forced_action && !strcmp(forced_action, "start"))
            change = 0;
        char line[160], when[32];
        format_time(when, sizeof when);
        int n = snprintf(line, sizeof line, "%s,%s,%llu,%llu,%llu\n", when, action, (unsigned long long)change,
                         (unsigned long long)now, (unsigned long long)peak);
        if (n > 0 && (size_t)n < sizeof line)
            append_locked(l, &l->reserved, line, (size_t)n);
        l->last_reserved = now;
    }
    pthread_mutex_unlock(&l->reserved.lock);
}

static int log_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    int status = ps_allocate(r->upstream, size, stream, out);
    log_event((log_adaptor_t *)r, status == PS_OK ? "allocate" : "allocate failure",
              status == PS_OK ? *out : NULL, size, stream);
    log_reserved((log_adaptor_t *)r, NULL, -1);
    return status;
}

static int log_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    /* logged before the upstream call, as RMM does: the pointer may be
     * handed out again (and logged by another thread) right after */
    log_event((log_adaptor_t *)r, "free", ptr, size, stream);
    int status = ps_deallocate(r->upstream, ptr, size, stream);
    log_reserved((log_adaptor_t *)r, NULL, -1);
    return status;
}

static int log_trim(ps_resource_t *r)
{
    int status = ps_trim(r->upstream);
    log_reserved((log_adaptor_t *)r, NULL, -1);
    return status;
}

int ps_log_flush(ps_resource_t *log_adaptor)
{
    log_adaptor_t *l = (log_adaptor_t *)log_adaptor;
    pthread_mutex_lock(&l->events.lock);
    int status = flush_locked(l, &l->events);
    pthread_mutex_unlock(&l->events.lock);
    if (l->reserved.fd >= 0) {
        pthread_mutex_lock(&l->reserved.lock);
        flush_locked(l, &l->reserved); /* best effort: its failure is warned, not returned */
        pthread_mutex_unlock(&l->reserved.lock);
    }
    return status;
}

static void file_close(log_file_t *file)
{
    if (file->fd >= 0)
        close(file->fd);
    pthread_mutex_destroy(&file->lock);
    free(file->buffer);
}

static void log_destroy(ps_resource_t *r)
{
    log_adaptor_t *l = (log_adaptor_t *)r;
    log_reserved(l, "end", 0); /* the stack below is destroyed next and gives its memory back */
    ps_log_flush(r);
    file_close(&l->events);
    file_close(&l->reserved);
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

int ps_log_reserved_path(const char *log_path, char *out, size_t outsize)
{
    int n = snprintf(out, outsize, "%s%s", log_path, PS_LOG_RESERVED_SUFFIX);
    return n > 0 && (size_t)n < outsize ? PS_OK : PS_EINVAL;
}

/* Opens a new file at `path` (core/safe_file.c: never through a link, a FIFO
 * or another user's file; mode 0600) with a buffer that starts with
 * `header`. PS_ECONFIG with why[] set when the file cannot be made. */
static int file_open(log_file_t *file, const char *path, size_t capacity, const char *header, char *why,
                     size_t why_size)
{
    file->fd = -1;
    file->buffer = malloc(capacity);
    if (!file->buffer)
        return PS_ENOMEM;
    ps_safe_file_t f;
    if (ps_safe_file_create(&f, path, NULL, why, why_size) != PS_OK || ps_safe_file_commit(&f, why, why_size) != PS_OK) {
        ps_safe_file_close(&f);
        free(file->buffer);
        file->buffer = NULL;
        return PS_ECONFIG;
    }
    file->fd = f.fd; /* (committed: the descriptor is ours to keep) */
    file->capacity = capacity;
    pthread_mutex_init(&file->lock, NULL);
    file->used = strlen(header);
    memcpy(file->buffer, header, file->used);
    return PS_OK;
}

int ps_log_create(const char *name, ps_resource_t *upstream, const char *path, ps_resource_t **out)
{
    if (!upstream || !out || !path || !*path)
        return PS_EINVAL;
    log_adaptor_t *l = calloc(1, sizeof *l);
    if (!l)
        return PS_ENOMEM;
    char why[128] = "the name is too long";
    int rc = file_open(&l->events, path, LOG_BUFFER_BYTES, LOG_HEADER, why, sizeof why);
    if (rc != PS_OK) {
        if (rc == PS_ECONFIG)
            ps_error("log: cannot open '%s': %s", path, why);
        free(l);
        return rc;
    }
    ps_resource_init(&l->base, &log_ops, name, upstream);
    char companion[PS_LOG_PATH_MAX];
    if (ps_log_reserved_path(path, companion, sizeof companion) != PS_OK ||
        file_open(&l->reserved, companion, RESERVED_BUFFER_BYTES, RESERVED_HEADER, why, sizeof why) != PS_OK) {
        ps_warning("log: cannot open '%s%s' (%s): the log is written without the stack's reserved bytes",
                   path, PS_LOG_RESERVED_SUFFIX, why);
        pthread_mutex_init(&l->reserved.lock, NULL); /* file_close destroys it */
        l->reserved.fd = -1;
    }
    log_reserved(l, "start", -1); /* what the stack holds already (an initial_size) */
    *out = &l->base;
    return PS_OK;
}
