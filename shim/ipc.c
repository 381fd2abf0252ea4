/* CUDA IPC of pooled memory between two processes under the shim.
 *
 * A pooled block is a suballocation: cudaIpcGetMemHandle on it would give
 * a legacy handle for the whole slab (or fail on mapped memory), so the
 * peer would map the wrong bytes. The expandable pool's memory is made of
 * pieces mapped by cuMemCreate + cuMemMap, created exportable as POSIX file
 * descriptors (shim/gpu_ops_cuda.c, 6.). We hand out a handle of our own
 * inside the 64-byte cudaIpcMemHandle_t, and the peer's shim asks us for
 * the pieces' descriptors over a Unix socket.
 *
 * Algorithm
 *  1. Export (cudaIpcGetMemHandle/cuIpcGetMemHandle of a live pooled block,
 *     the router finds the block): walk the pieces that cover the block
 *     (ipc_export without a descriptor: each piece's start and size; they
 *     must follow each other), export the first once to prove the memory is
 *     exportable (else PS_EUNSUPPORTED: the router refuses as before), start
 *     the service thread on first use, and keep an export entry: a fresh id
 *     (never reused in this process), a random token, the block, its pieces.
 *     The handle (shim/ipc_wire.h): magic, our pid, id, token, block size,
 *     offset of the block in its first piece, bytes and number of pieces,
 *     the service socket's random name, checksum. The same block exported
 *     again gives the same handle.
 *  2. Free: the router calls ps_ipc_forget for every free while an export
 *     is live; the entry goes, so a stale handle (block freed, perhaps
 *     reused) is refused by the exporter with a clear error.
 *  3. Service thread (exporter): an abstract Unix socket, SOCK_SEQPACKET,
 *     @poolshim-ipc.<pid>.<name>, the name 32 random bits (another is drawn
 *     while the name is taken), so no one can bind it before us. It polls
 *     the socket and every connection waiting for its request. A connection
 *     of another user (SO_PEERCRED, read right after accept) is closed
 *     before anything is read; one of this user has REQUEST_BUDGET_MS to
 *     send its request and then waits for no one (at most PENDING_MAX wait,
 *     the oldest goes first). Per connection one request {id, token} of a
 *     live entry: the pieces are exported now, sent 64 descriptors per
 *     message (SCM_RIGHTS, with their sizes; each send waits at most
 *     SEND_TIMEOUT_MS) and closed here. Under exports_lock, so a free of
 *     that block waits until they are sent. SCM_RIGHTS works
 *     whichever process is the parent; pidfd_getfd (PyTorch's way) needs
 *     ptrace rights, which Yama's ptrace_scope=1 gives a parent over its
 *     child but not a child over its parent.
 *  4. Open (cudaIpcOpenMemHandle/cuIpcOpenMemHandle with our magic, the
 *     router picks the current device's GPU-ops table): the handle's fields
 *     are checked first (shim/ipc_wire.c: in bounds, without overflow); a
 *     handle already open here gains a reference and gives the same
 *     pointer. Else connect to the exporter's socket and check who holds
 *     it (SO_PEERCRED): this user, and the handle's pid where the exporter
 *     is in our pid namespace; anyone else (a name taken after the exporter
 *     ended) gets nothing, not even the request with its token. Then send
 *     the request, reserve `mapped` bytes (ipc_reserve), and map each
 *     received descriptor after the previous one (ipc_map: import, map,
 *     access for this device), closing each descriptor once mapped; each
 *     reply is checked against the handle before anything of it is mapped
 *     (ps_ipc_reply_check); the pointer returned is reserve + offset: the
 *     exported block. On any failure everything mapped is unmapped and the
 *     range released.
 *  5. Close: the last reference synchronizes the device (kernels may still
 *     read the range), unmaps every piece and releases the range. The
 *     physical memory lives on while the exporter still maps it
 *     (cuMemRelease semantics), so as natively the exporter must not free a
 *     block another process still uses.
 *  6. Handles not ours (another magic) pass through to CUDA; a process
 *     without the shim gets CUDA's own error for our handle, never bytes.
 * Guarantees: nothing another user sends is read, and no token is sent to
 * another user's socket; a silent connection delays no other; every field
 * another process sends is bounded before it is used (docs/security.md).
 * Thread-safe: exports_lock guards the export entries, imports_lock the
 * imports (held across an import: opens are rare).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "../core/ptr_map.h"
#include "ipc.h"
#include "ipc_wire.h"
#include "test_switches.h"

#define BATCH PS_IPC_BATCH
#define SOCKET_TIMEOUT_S 10      /* an importer waits this long for the exporter's replies */
#define PENDING_MAX 32           /* connections of this user waiting for their request */
#define REQUEST_BUDGET_MS 2000   /* how long such a connection may wait to send it */
#define SEND_TIMEOUT_MS 2000     /* how long one reply may wait for the importer to read */
#define NAME_ATTEMPTS 16         /* random names tried for the service socket */

typedef ps_ipc_handle_t ipc_handle_t;
typedef ps_ipc_request_t request_t;
typedef ps_ipc_reply_t reply_t;
enum { REPLY_OK = PS_IPC_REPLY_OK, REPLY_STALE = PS_IPC_REPLY_STALE, REPLY_BAD_TOKEN = PS_IPC_REPLY_BAD_TOKEN,
       REPLY_EXPORT_FAILED = PS_IPC_REPLY_EXPORT_FAILED, REPLY_EXITING = PS_IPC_REPLY_EXITING };

/* One exported block (exporter). */
typedef struct export_entry {
    ipc_handle_t handle;      /* what cudaIpcGetMemHandle gave out */
    uintptr_t block;          /* the block */
    const ps_gpu_ops_t *gpu;  /* the GPU-ops table of its device (dead after a reset: exports fail) */
    struct export_entry *next; /* list link */
} export_entry_t;

/* One opened handle (importer). */
typedef struct import_entry {
    uint32_t pid;             /* exporter */
    uint32_t name;            /* its socket's name */
    uint64_t id;              /* its export id */
    uintptr_t base;           /* the reserved range */
    size_t mapped;            /* its bytes */
    uintptr_t block;          /* base + offset: the pointer handed out */
    size_t size;              /* the block's bytes */
    unsigned refs;            /* opens not yet closed */
    const ps_gpu_ops_t *gpu;  /* the table it was mapped through */
    size_t count;             /* pieces mapped */
    uint64_t *handles;        /* per piece: ipc_map's handle */
    size_t *sizes;            /* per piece: its bytes */
    struct import_entry *next; /* list link */
} import_entry_t;

atomic_int ps_ipc_exports;                       /* live export entries */
static pthread_mutex_t exports_lock = PTHREAD_MUTEX_INITIALIZER;
static export_entry_t *exports;                  /* live export entries */
static ps_ptr_map_t exports_by_block;            /* block -> its entry (exports_lock) */
static uint64_t next_id;                         /* last export id given (exports_lock) */
static int listen_fd = -1;                       /* the service socket, once started (exports_lock) */
static uint32_t service_name;                    /* its random name (exports_lock) */
static pthread_mutex_t imports_lock = PTHREAD_MUTEX_INITIALIZER;
static import_entry_t *imports;                  /* opened handles */

/* The abstract socket address of an exporter (pid, name). */
static socklen_t socket_address(struct sockaddr_un *a, uint32_t pid, uint32_t name)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "poolshim-ipc.%u.%08x", pid, name);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* ---- 3. the service thread ----------------------------------------------------------- */
static void send_status(int fd, int status)
{
    reply_t r = {.status = status};
    send(fd, &r, sizeof r, MSG_NOSIGNAL);
}

/* Sends the pieces of `e`, BATCH at a time. exports_lock held. */
static void send_pieces(int fd, const export_entry_t *e)
{
    const ps_gpu_ops_t *gpu = e->gpu;
    uintptr_t at = e->block - e->handle.offset;
    uint32_t total = e->handle.pieces;
    for (uint32_t first = 0; first < total;) {
        reply_t r = {.status = REPLY_OK, .first = first, .total = total};
        int fds[BATCH];
        uint32_t n = 0;
        int ok = 1;
        for (; n < BATCH && first + n < total; n++) {
            uintptr_t start;
            size_t size;
            int rc = gpu->ipc_export(gpu->ctx, at, &start, &size, &fds[n]);
            if (rc == PS_OK && start != at) { /* the pieces changed under a live block: never send those */
                close(fds[n]);
                rc = PS_EINVAL;
            }
            if (rc != PS_OK) {
                ok = 0;
                break;
            }
            r.sizes[n] = size;
            at += size;
        }
        if (!ok) {
            for (uint32_t i = 0; i < n; i++)
                close(fds[i]);
            send_status(fd, REPLY_EXPORT_FAILED);
            return;
        }
        r.count = n;
        char control[CMSG_SPACE(sizeof fds)];
        memset(control, 0, sizeof control);
        struct iovec iov = {&r, sizeof r};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                           .msg_controllen = CMSG_SPACE(n * sizeof(int))};
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(n * sizeof(int));
        memcpy(CMSG_DATA(c), fds, n * sizeof(int));
        ssize_t sent = sendmsg(fd, &m, MSG_NOSIGNAL);
        for (uint32_t i = 0; i < n; i++) /* the kernel gave the peer its own copies */
            close(fds[i]);
        if (sent != (ssize_t)sizeof r)
            return;
        first += n;
    }
}

/* Serves the request waiting on connection `fd` (of this user). */
static void serve(int fd)
{
    unsigned char bytes[sizeof(request_t) + 1]; /* (one more: a longer message is no request) */
    request_t q;
    ssize_t got = recv(fd, bytes, sizeof bytes, MSG_DONTWAIT);
    if (got < 0 || !ps_ipc_request_read(bytes, (size_t)got, &q))
        return;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    struct timeval timeout = {SEND_TIMEOUT_MS / 1000, SEND_TIMEOUT_MS % 1000 * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    if (ps_process_exiting()) { /* no CUDA call once exit() began */
        send_status(fd, REPLY_EXITING);
        return;
    }
    pthread_mutex_lock(&exports_lock);
    export_entry_t *e = exports;
    while (e && e->handle.id != q.id)
        e = e->next;
    if (!e)
        send_status(fd, REPLY_STALE);
    else if (e->handle.token != q.token)
        send_status(fd, REPLY_BAD_TOKEN);
    else
        send_pieces(fd, e);
    pthread_mutex_unlock(&exports_lock);
}

/* A connection of this user waiting for its request. */
typedef struct pending {
    int fd;          /* the connection */
    uint64_t since;  /* when it was accepted (ps_now_ns) */
} pending_t;

/* Accepts every connection waiting: another user's is closed unread, one of
 * this user joins pending[] (the oldest closed when it is full). */
static void accept_all(int listener, pending_t *pending, int *count)
{
    for (;;) {
        int c = accept4(listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                usleep(1000); /* (out of descriptors: the connection waits, and poll would report it at once) */
            return;
        }
        struct ucred peer;
        socklen_t len = sizeof peer;
        if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != geteuid()) {
            close(c); /* another user: nothing read, nothing answered */
            continue;
        }
        if (*count == PENDING_MAX) {
            close(pending[0].fd);
            memmove(pending, pending + 1, (size_t)(PENDING_MAX - 1) * sizeof *pending);
            (*count)--;
        }
        pending[(*count)++] = (pending_t){c, ps_now_ns()};
    }
}

static void *service_main(void *arg)
{
    int listener = (int)(intptr_t)arg;
    pending_t pending[PENDING_MAX];
    int count = 0;
    for (;;) {
        struct pollfd p[PENDING_MAX + 1];
        p[0] = (struct pollfd){listener, POLLIN, 0};
        for (int i = 0; i < count; i++)
            p[i + 1] = (struct pollfd){pending[i].fd, POLLIN, 0};
        uint64_t now = ps_now_ns(), budget = (uint64_t)REQUEST_BUDGET_MS * 1000000u;
        int wait_ms = -1;
        if (count) /* until the oldest connection's budget is spent */
            wait_ms = now - pending[0].since >= budget ? 0 : (int)((budget - (now - pending[0].since)) / 1000000u + 1);
        int ready = poll(p, (nfds_t)count + 1, wait_ms);
        if (ready < 0 && errno != EINTR)
            usleep(1000);
        if (p[0].revents & POLLNVAL)
            return NULL; /* closed (a fork child never runs this thread) */
        now = ps_now_ns();
        int kept = 0;
        for (int i = 0; i < count; i++) {
            bool spoke = ready > 0 && p[i + 1].revents;
            if (spoke)
                serve(pending[i].fd);
            if (spoke || now - pending[i].since >= budget)
                close(pending[i].fd);
            else
                pending[kept++] = pending[i];
        }
        count = kept;
        if (ready > 0 && (p[0].revents & POLLIN))
            accept_all(listener, pending, &count);
    }
}

/* The next name to try for the service socket: random (the test switch
 * gives the first one). */
static uint32_t draw_name(int attempt)
{
    uint32_t name = 0;
    if (attempt == 0 && ps_test.ipc_name)
        return (uint32_t)strtoul(ps_test.ipc_name, NULL, 16);
    if (getrandom(&name, sizeof name, GRND_NONBLOCK) != (ssize_t)sizeof name)
        name = (uint32_t)(ps_now_ns() * 0x9E3779B97F4A7C15ull >> 32) ^ (uint32_t)attempt;
    return name;
}

/* Starts the service thread once. exports_lock held. */
static int start_service(void)
{
    if (listen_fd >= 0)
        return PS_OK;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return PS_EUPSTREAM;
    struct sockaddr_un a;
    uint32_t name = 0;
    int rc = -1;
    for (int attempt = 0; attempt < NAME_ATTEMPTS && rc != 0; attempt++) {
        name = draw_name(attempt);
        socklen_t len = socket_address(&a, (uint32_t)getpid(), name);
        rc = bind(fd, (struct sockaddr *)&a, len);
        if (rc != 0 && errno != EADDRINUSE)
            break;
        if (rc != 0)
            ps_debug("IPC: the socket name @%s is taken: drawing another", a.sun_path + 1);
    }
    if (rc != 0 || listen(fd, 64) != 0) {
        ps_error("IPC: cannot open the service socket @%s: %s", a.sun_path + 1, strerror(errno));
        close(fd);
        return PS_EUPSTREAM;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    rc = pthread_create(&t, &attr, service_main, (void *)(intptr_t)fd);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        close(fd);
        return PS_EUPSTREAM;
    }
    listen_fd = fd;
    service_name = name;
    return PS_OK;
}

/* ---- 1. export, 2. forget ------------------------------------------------------------- */
int ps_ipc_export(const ps_gpu_ops_t *gpu, uintptr_t block, size_t size, void *out)
{
    if (!gpu || !gpu->ipc_export || !size)
        return PS_EUNSUPPORTED;
    pthread_mutex_lock(&exports_lock);
    uint64_t found;
    if (exports_by_block.slots && ps_ptr_map_get(&exports_by_block, block, &found)) {
        memcpy(out, &((export_entry_t *)(uintptr_t)found)->handle, sizeof(ipc_handle_t));
        pthread_mutex_unlock(&exports_lock);
        return PS_OK;
    }
    /* the pieces under the block, one after the other */
    uintptr_t start = 0, at = 0;
    size_t piece = 0;
    int rc = gpu->ipc_export(gpu->ctx, block, &start, &piece, NULL);
    uint32_t pieces = 0;
    for (at = start; rc == PS_OK && at < block + size; at += piece, pieces++) {
        uintptr_t s;
        rc = gpu->ipc_export(gpu->ctx, at, &s, &piece, NULL);
        if (rc == PS_OK && s != at)
            rc = PS_EUNSUPPORTED;
    }
    int fd = -1;
    if (rc == PS_OK) /* exportable at all? (memory created without the fd handle type is not) */
        rc = gpu->ipc_export(gpu->ctx, start, &start, &piece, &fd);
    if (fd >= 0)
        close(fd);
    if (rc != PS_OK) {
        pthread_mutex_unlock(&exports_lock);
        return PS_EUNSUPPORTED;
    }
    export_entry_t *e = calloc(1, sizeof *e);
    if (!e || (!exports_by_block.slots && ps_ptr_map_init(&exports_by_block, 16) != PS_OK) ||
        ps_ptr_map_reserve(&exports_by_block, 1) != PS_OK || start_service() != PS_OK) {
        free(e);
        pthread_mutex_unlock(&exports_lock);
        return PS_EUPSTREAM;
    }
    ipc_handle_t *h = &e->handle;
    memcpy(h->magic, PS_IPC_MAGIC, 8);
    h->pid = (uint32_t)getpid();
    h->name = service_name;
    h->pieces = pieces;
    h->id = ++next_id;
    if (getrandom(&h->token, sizeof h->token, 0) != (ssize_t)sizeof h->token)
        h->token = (uint64_t)ps_now_ns() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)e;
    h->size = size;
    h->offset = block - start;
    h->mapped = at - start;
    h->check = ps_ipc_checksum(h);
    e->block = block;
    e->gpu = gpu;
    e->next = exports;
    exports = e;
    ps_ptr_map_put(&exports_by_block, block, (uint64_t)(uintptr_t)e);
    atomic_fetch_add(&ps_ipc_exports, 1);
    memcpy(out, h, sizeof *h);
    pthread_mutex_unlock(&exports_lock);
    ps_debug("IPC: exported block %p (%zu bytes, %u pieces) as id %llu", (void *)block, size, pieces,
             (unsigned long long)h->id);
    return PS_OK;
}

void ps_ipc_forget(uintptr_t block)
{
    pthread_mutex_lock(&exports_lock);
    uint64_t found;
    if (exports_by_block.slots && ps_ptr_map_remove(&exports_by_block, block, &found)) {
        export_entry_t *e = (export_entry_t *)(uintptr_t)found, **link = &exports;
        while (*link != e)
            link = &(*link)->next;
        *link = e->next;
        free(e);
        atomic_fetch_sub(&ps_ipc_exports, 1);
    }
    pthread_mutex_unlock(&exports_lock);
}

/* ---- 4. open, 5. close ---------------------------------------------------------------- */
/* Whether `h` is one of this process's live exports (a pid alone could be
 * another PID namespace's). */
static bool exported_here(const ipc_handle_t *h)
{
    bool found = false;
    pthread_mutex_lock(&exports_lock);
    for (export_entry_t *e = exports; e && !found; e = e->next)
        found = e->handle.id == h->id && e->handle.token == h->token && e->handle.name == h->name;
    pthread_mutex_unlock(&exports_lock);
    return found;
}

/* Unmaps the first `count` pieces of `e` and releases its range. */
static void unmap_import(import_entry_t *e, size_t count)
{
    uintptr_t at = e->base;
    for (size_t i = 0; i < count; i++) {
        e->gpu->ipc_unmap(e->gpu->ctx, (void *)at, e->sizes[i], e->handles[i]);
        at += e->sizes[i];
    }
    e->gpu->ipc_release(e->gpu->ctx, (void *)e->base, e->mapped);
}

/* Receives every piece of `h` on `fd` and maps it into `e` (reserved).
 * Returns PS_OK or an error with *why set. */
static int receive_pieces(int fd, const ipc_handle_t *h, import_entry_t *e, const char **why)
{
    ps_ipc_receive_t state = {.pieces = h->pieces, .mapped = e->mapped};
    /* test only (POOLSHIM_TEST_IPC_SKEW=1): piece i is mapped where piece
     * i + 1 belongs (pieces are of one size), so the bytes are wrong but in
     * range: the GPU test's negative control must see it */
    int skew = ps_test.ipc_skew && h->pieces > 1;
    if (skew)
        ps_warning("POOLSHIM_TEST_IPC_SKEW=1: opened IPC blocks get their pieces in the wrong order (a test "
                   "switch, never for real work)");
    while (e->count < h->pieces) {
        reply_t r;
        char control[CMSG_SPACE(BATCH * sizeof(int))];
        struct iovec iov = {&r, sizeof r};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
        ssize_t got = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
        int received_errno = errno;
        int fds[BATCH], nfds = 0, extra = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); got >= 0 && c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                for (int i = 0; i < n; i++) {
                    int passed;
                    memcpy(&passed, CMSG_DATA(c) + (size_t)i * sizeof(int), sizeof passed);
                    if (nfds < BATCH)
                        fds[nfds++] = passed;
                    else {
                        close(passed); /* (more than a reply may carry: refused below) */
                        extra++;
                    }
                }
            }
        int rc = PS_OK, status;
        if (got < 0) {
            *why = received_errno == EAGAIN || received_errno == EWOULDBLOCK ? "the exporter did not answer in time"
                                                                             : "the exporter's connection failed";
            rc = PS_EUPSTREAM;
        } else if (got == 0) {
            *why = "the exporter closed the connection";
            rc = PS_EUPSTREAM;
        } else if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || extra) {
            *why = "the exporter's pieces do not match the handle";
            rc = PS_EINVAL;
        } else if ((*why = ps_ipc_reply_check(&state, &r, got, nfds, &status))) {
            rc = status == REPLY_EXPORT_FAILED || status == REPLY_EXITING ? PS_EUPSTREAM : PS_EINVAL;
        } else if (skew && (e->mapped % h->pieces || r.sizes[0] != e->mapped / h->pieces)) {
            *why = "POOLSHIM_TEST_IPC_SKEW needs pieces of one size";
            rc = PS_EINVAL;
        }
        for (int i = 0; i < nfds; i++) {
            if (rc == PS_OK) {
                size_t at = skew ? (e->count + 1) % h->pieces * r.sizes[i] : state.cursor;
                rc = e->gpu->ipc_map(e->gpu->ctx, (void *)(e->base + at), r.sizes[i], fds[i], &e->handles[e->count]);
                if (rc != PS_OK)
                    *why = "importing or mapping a piece failed (cuMemImportFromShareableHandle, cuMemMap or "
                           "cuMemSetAccess)";
                else {
                    e->sizes[e->count++] = r.sizes[i];
                    state.cursor += r.sizes[i];
                    state.have++;
                }
            }
            close(fds[i]);
        }
        if (rc != PS_OK)
            return rc;
    }
    return PS_OK;
}

/* Whether process `pid` (as this process sees it) is in our pid namespace:
 * then the pid a handle names is the one the kernel reports. */
static bool same_pid_namespace(pid_t pid)
{
    char path[64];
    struct stat ours, theirs;
    snprintf(path, sizeof path, "/proc/%d/ns/pid", (int)pid);
    return pid > 0 && stat("/proc/self/ns/pid", &ours) == 0 && stat(path, &theirs) == 0 && ours.st_ino == theirs.st_ino &&
           ours.st_dev == theirs.st_dev;
}

/* Whether the process at the other end of `fd` may be the exporter of `h`:
 * this user, and the handle's pid when it is in our pid namespace. NULL
 * when it may, else why not (in why_buf). */
static const char *check_exporter(int fd, const ipc_handle_t *h, char *why_buf, size_t size)
{
    struct ucred peer;
    socklen_t len = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0)
        return "the exporter's credentials cannot be read (SO_PEERCRED)";
    if (peer.uid != geteuid()) {
        snprintf(why_buf, size,
                 "the exporter's socket is held by another user (uid %u): the exporter ended and its name was taken; "
                 "nothing was sent to it",
                 (unsigned)peer.uid);
        return why_buf;
    }
    if ((uint32_t)peer.pid != h->pid && same_pid_namespace(peer.pid)) {
        snprintf(why_buf, size,
                 "the exporter's socket is held by process %d, not %u: the exporter ended and its name was taken; "
                 "nothing was sent to it",
                 (int)peer.pid, h->pid);
        return why_buf;
    }
    return NULL;
}

int ps_ipc_open(const char *api, const ps_gpu_ops_t *gpu, const void *handle, void **out)
{
    ipc_handle_t h;
    const char *wrong = ps_ipc_handle_read(handle, &h);
    if (wrong) {
        ps_error("%s: a poolshim IPC handle that is damaged or forged (%s); refused", api, wrong);
        return PS_EINVAL;
    }
    if (h.pid == (uint32_t)getpid() && exported_here(&h)) {
        ps_error("%s: this handle was exported by this same process (block id %llu); as natively, a process "
                 "cannot open its own IPC handle: use the pointer itself",
                 api, (unsigned long long)h.id);
        return PS_EINVAL;
    }
    pthread_mutex_lock(&imports_lock);
    for (import_entry_t *e = imports; e; e = e->next)
        if (e->pid == h.pid && e->name == h.name && e->id == h.id) {
            e->refs++;
            *out = (void *)e->block;
            pthread_mutex_unlock(&imports_lock);
            return PS_OK;
        }
    if (!gpu || !gpu->ipc_map) {
        pthread_mutex_unlock(&imports_lock);
        ps_error("%s: a handle to pooled memory of process %u, but it cannot be imported here: %s; refused", api,
                 h.pid,
                 gpu ? "this device lacks CUDA virtual memory with POSIX file descriptor handles, or global.ipc is off"
                     : "no primary context served by poolshim is current (or the shim passes this process through)");
        return PS_EUNSUPPORTED;
    }
    const char *why = NULL;
    char why_buf[256];
    int rc = PS_OK;
    import_entry_t *e = calloc(1, sizeof *e);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (!e || !(e->handles = calloc(h.pieces, sizeof *e->handles)) || !(e->sizes = calloc(h.pieces, sizeof *e->sizes)) ||
        fd < 0) {
        why = "out of host memory or descriptors";
        rc = PS_ENOMEM;
    }
    if (rc == PS_OK) {
        struct timeval timeout = {SOCKET_TIMEOUT_S, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
        struct sockaddr_un a;
        socklen_t len = socket_address(&a, h.pid, h.name);
        request_t q = {.id = h.id, .token = h.token};
        memcpy(q.magic, PS_IPC_MAGIC, 8);
        if (connect(fd, (struct sockaddr *)&a, len) != 0) {
            why = "cannot reach the exporting process (it exited, or runs in another network namespace)";
            rc = PS_EINVAL;
        } else if ((why = check_exporter(fd, &h, why_buf, sizeof why_buf))) {
            rc = PS_EINVAL;
        } else if (send(fd, &q, sizeof q, MSG_NOSIGNAL) != (ssize_t)sizeof q) {
            why = "cannot send the request to the exporting process";
            rc = PS_EUPSTREAM;
        }
    }
    void *base = NULL;
    if (rc == PS_OK && (rc = gpu->ipc_reserve(gpu->ctx, h.mapped, &base)) != PS_OK)
        why = "cannot reserve address space (cuMemAddressReserve)";
    if (rc == PS_OK) {
        e->pid = h.pid;
        e->name = h.name;
        e->id = h.id;
        e->base = (uintptr_t)base;
        e->mapped = h.mapped;
        e->block = e->base + h.offset;
        e->size = h.size;
        e->gpu = gpu;
        e->refs = 1;
        rc = receive_pieces(fd, &h, e, &why);
        if (rc != PS_OK)
            unmap_import(e, e->count);
    }
    if (fd >= 0)
        close(fd);
    if (rc != PS_OK) {
        pthread_mutex_unlock(&imports_lock);
        ps_error("%s: cannot open the poolshim IPC handle of block id %llu of process %u (%llu bytes): %s; refused",
                 api, (unsigned long long)h.id, h.pid, (unsigned long long)h.size, why ? why : "error");
        if (e) {
            free(e->handles);
            free(e->sizes);
            free(e);
        }
        return rc;
    }
    e->next = imports;
    imports = e;
    *out = (void *)e->block;
    pthread_mutex_unlock(&imports_lock);
    ps_debug("IPC: opened block id %llu of process %u at %p (%zu pieces)", (unsigned long long)h.id, h.pid,
             (void *)e->block, e->count);
    return PS_OK;
}

bool ps_ipc_close(uintptr_t ptr, int *status)
{
    pthread_mutex_lock(&imports_lock);
    import_entry_t **link = &imports;
    while (*link && (*link)->block != ptr)
        link = &(*link)->next;
    import_entry_t *e = *link;
    if (!e) {
        pthread_mutex_unlock(&imports_lock);
        return false;
    }
    *status = PS_OK;
    if (--e->refs == 0) {
        *link = e->next;
        if (e->gpu->device_synchronize) /* kernels may still read the range */
            e->gpu->device_synchronize(e->gpu->ctx);
        unmap_import(e, e->count);
        free(e->handles);
        free(e->sizes);
        free(e);
    }
    pthread_mutex_unlock(&imports_lock);
    return true;
}

bool ps_ipc_import_range(uintptr_t addr, uintptr_t *base, size_t *size)
{
    bool found = false;
    pthread_mutex_lock(&imports_lock);
    for (import_entry_t *e = imports; e && !found; e = e->next)
        if (addr >= e->block && addr - e->block < e->size) {
            *base = e->block;
            *size = e->size;
            found = true;
        }
    pthread_mutex_unlock(&imports_lock);
    return found;
}

void ps_ipc_atfork_child(void)
{
    /* the service thread did not come along: a child never serves the
     * parent's exports (it passes CUDA calls through anyway) */
    pthread_mutex_init(&exports_lock, NULL);
    pthread_mutex_init(&imports_lock, NULL);
    if (listen_fd >= 0)
        close(listen_fd);
    listen_fd = -1;
    exports = NULL; /* (the parent's entries, left to the parent) */
    memset(&exports_by_block, 0, sizeof exports_by_block);
    atomic_store(&ps_ipc_exports, 0);
    imports = NULL;
}
