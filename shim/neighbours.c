/* Neighbours: the processes of one user under poolshim that share a GPU
 * give each other the free memory of their pools. A process whose
 * allocation would fail for lack of memory asks the others, waits a
 * bounded time for their answers, and is made once more (router.c).
 *
 * The registry: one private directory per user (core/safe_file.c):
 * $XDG_RUNTIME_DIR/poolshim where the system made a runtime directory for
 * the user, else /dev/shm/poolshim-<uid> (the system's temporary directory
 * when /dev/shm is missing; POOLSHIM_TEST_NEIGHBOURS_DIR in tests). A
 * process registers in the first; an asker also looks in the second when
 * it is private too (processes started without XDG_RUNTIME_DIR, as batch
 * jobs often are, register there). A process is named by its pid,
 * its start time (field 22 of /proc/<pid>/stat: a reused pid has another)
 * and its pid namespace (st_ino of /proc/self/ns/pid), N = p<pid>-<start>-<ns>:
 *   N.sock  its request socket (Unix datagrams);
 *   N.gpus  "poolshim neighbours 1", then the UUID of every GPU it sees
 *           (cuDeviceGetUuid: ordinals differ between processes with
 *           CUDA_VISIBLE_DEVICES, UUIDs do not), one a line; written under
 *           another name and renamed, so a reader sees it whole.
 *   N.stats its live statistics (shim/live.c, read by `poolshim top`).
 *
 * Trust: nothing another user writes is believed. The directory must be a
 * directory (not a link) owned by this user with no group or other
 * permission; otherwise the process warns once, in one line that says how
 * to fix it, and neither asks nor answers. Files are written under a fixed
 * temporary name that is removed first and made with O_EXCL, so nothing
 * found there (a FIFO, a link) is ever opened. Entries must be this user's (a regular file without group or
 * other write permission, a socket), and every datagram must carry the
 * kernel's credentials (SO_PASSCRED) of this user. A message has one fixed
 * size, a magic number and a version.
 *
 * 1. Open (the give-back thread's start, once the first stack was built;
 *    nothing with neighbour_release off): binds N.sock, then writes N.gpus.
 *    Close (at exit, after the thread was joined): removes N.gpus, then
 *    N.sock. A process killed before leaves both: see 3.
 * 2. Ask (ps_neighbours_ask, the program's thread whose allocation failed,
 *    holding no lock of the shim): binds a reply socket of its own,
 *    a<pid>-<start>-<ns>-<tid>.sock, and sends a request {magic, version,
 *    pid, request number, GPU UUID, bytes wanted, its wait} to every other
 *    entry that lists the GPU: first those that gave memory lately (the
 *    latest first), then those not heard of, then those silent lately
 *    (4. below). A datagram waits in its receiver's queue charged to the
 *    sender's socket, so a few hundred neighbours that do not read fill it:
 *    then a fresh reply socket, a<...>-<tid>.<k>.sock, carries the rest
 *    (a silent neighbour whose own queue is full is passed over). It then
 *    waits for answers {the number, bytes
 *    given} until every neighbour asked has answered, the bytes wanted were
 *    given, or global.neighbour_wait_ms passed, whichever comes first:
 *    never longer. Returns the bytes the neighbours said they gave.
 * 3. Dead entries are ignored and removed by every asker's scan: a process
 *    of our pid namespace that is gone or has another start time (a
 *    forked child may still hold its socket), or a socket nobody is bound
 *    to any more (connect refused). Entries of another pid namespace (a
 *    container sharing /dev/shm) are judged by their socket only.
 * 4. A neighbour that did not answer in time (stopped, busy) is still asked
 *    for the next 30 s, but not waited for: a program that keeps running out
 *    of memory does not pay the whole wait each time. Every neighbour asked
 *    is remembered (silent until, last answer), however many there are.
 * 5. Serve (the give-back thread, on a readable socket; never once exit
 *    began): each request is checked, its GPU found among this process's
 *    devices by UUID, and ps_give_back_device(d, now, 0) gives every free
 *    byte the GPU has provably finished with (no device synchronize, no wait
 *    for a pool lock; nothing while a capture is open). Freed blocks that
 *    wait for a barrier the give-back records itself (free_sync barrier)
 *    are idle a few microseconds later, so while the device's newest
 *    barrier has not passed it tries again after 1, 2, 4 ... 16 ms, for up
 *    to half the asker's wait (at most 2 s). Then it answers with the bytes
 *    given (0 for a GPU it does not serve, so the asker need not wait).
 *    POOLSHIM_TEST_NEIGHBOURS_ONE_ATTEMPT=1 (tests only) tries once: the
 *    negative control of that loop.
 * Guarantees: an asker waits at most neighbour_wait_ms; a neighbour gives
 * only memory no kernel may still touch and never blocks its own
 * allocating threads; no message of another user is acted on.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../core/gpu_ops.h"
#include "../core/safe_file.h"
#include "devices.h"
#include "give.h"
#include "neighbours.h"
#include "real.h"
#include "stats.h"
#include "test_switches.h"

#define MESSAGE_MAGIC 0x424e5350u /* "PSNB" */
#define MESSAGE_VERSION 1
enum { MESSAGE_REQUEST = 1, MESSAGE_ANSWER = 2 };
#define ENTRY_HEADER "poolshim neighbours 1\n"
#define SILENT_NS (30ull * 1000000000ull) /* 4. above */
#define REMEMBERED_NS (600ull * 1000000000ull) /* how long a neighbour's last answer is remembered */
#define REPLY_SOCKETS_MAX 16 /* reply sockets of one ask (2. above: each carries a few hundred requests) */
#define SERVE_BUDGET_MAX_MS 2000
#define NAME_MAX_CHARS 96 /* room for an entry's name (a<pid>-<start>-<ns>-<tid>.<k>.sock is the longest) */

/* One datagram, request or answer (fixed size: anything else is dropped). */
typedef struct message {
    uint32_t magic;   /* MESSAGE_MAGIC */
    uint16_t version; /* MESSAGE_VERSION */
    uint16_t kind;    /* MESSAGE_REQUEST or MESSAGE_ANSWER */
    uint32_t pid;     /* the sender's pid (in its namespace) */
    uint32_t number;  /* the request's number; its answer repeats it */
    uint8_t uuid[16]; /* the GPU */
    uint64_t bytes;   /* request: bytes wanted (0: any); answer: bytes given back */
    uint32_t wait_ms; /* request: how long the asker waits for answers */
    uint32_t refused; /* answer: 1 when a stream capture kept the memory */
} message_t;

/* This process in the registry. */
static struct {
    pthread_once_t once;    /* the directory is checked once */
    int usable;             /* 1: the directory is ours and private (set once, under `once`) */
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* the registry directory */
    char other[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* the second one an asker looks in ("": none) */
    int pid;                /* getpid() when checked */
    unsigned long long start; /* our start time (field 22 of /proc/self/stat) */
    unsigned long long ns;  /* our pid namespace (st_ino of /proc/self/ns/pid; 0: unknown) */
    char name[64];          /* p<pid>-<start>-<ns> */
} self = {.once = PTHREAD_ONCE_INIT};

/* The serving side (give-back thread; open/close run before and after it). */
static atomic_int serving_fd = -1; /* the request socket, or -1 */
static int served_count;           /* devices listed in our entry */
static uint8_t served_uuid[PS_MAX_DEVICES][16]; /* their UUIDs, by ordinal */
static bool served_known[PS_MAX_DEVICES];       /* whether that ordinal's UUID is known */

/* 2. and 4. above: what the asks learnt of each neighbour asked. */
typedef struct known {
    int pid;                   /* the neighbour (in its pid namespace) */
    unsigned long long start;  /* its start time */
    unsigned long long ns;     /* its pid namespace */
    uint64_t silent_until_ns;  /* not waited for before this (0: never silent) */
    uint64_t gave_ns;          /* when it last answered with memory (0: never) */
} known_t;
static pthread_mutex_t known_lock = PTHREAD_MUTEX_INITIALIZER;
static known_t *known;      /* one per neighbour asked lately (known_lock) */
static size_t known_count;  /* entries used */
static size_t known_capacity; /* entries allocated */

static atomic_uint next_number = 1; /* request numbers */

static unsigned long long pid_namespace(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long long)st.st_ino : 0;
}

/* dir/name+suffix into *path (false: too long for a socket address). */
static bool path_in(char *path, size_t size, const char *dir, const char *name, const char *suffix)
{
    int n = snprintf(path, size, "%s/%s%s", dir, name, suffix);
    return n > 0 && (size_t)n < size;
}

/* The same in this process's own registry directory. */
static bool entry_path(char *path, size_t size, const char *name, const char *suffix)
{
    return path_in(path, size, self.dir, name, suffix);
}

/* The directory: chosen (core/safe_file.c), made if absent (0700), and
 * trusted only when it is a directory of this user with no group or other
 * permission. */
static void check_directory(void)
{
    self.pid = getpid();
    self.start = ps_process_start(self.pid);
    self.ns = pid_namespace();
    snprintf(self.name, sizeof self.name, "p%d-%llu-%llu", self.pid, self.start, self.ns);
    const char *test_dir = ps_test.neighbours_dir;
    char home[PS_SAFE_PATH_MAX], other[PS_SAFE_PATH_MAX], why[512];
    if (test_dir && *test_dir) {
        snprintf(home, sizeof home, "%s", test_dir);
        other[0] = 0;
    } else {
        ps_safe_dir_paths(home, sizeof home, other, sizeof other);
    }
    size_t n = strlen(home);
    if (n < sizeof self.dir)
        memcpy(self.dir, home, n + 1);
    char longest[NAME_MAX_CHARS]; /* our longest name: a reply socket of a thread with the largest tid */
    int longest_size = snprintf(longest, sizeof longest, "a%d-%llu-%llu-%d.%d.sock", self.pid, self.start, self.ns,
                                4194304, REPLY_SOCKETS_MAX);
    if (!n || n + 1 + (size_t)longest_size >= sizeof self.dir || !self.start) {
        ps_warning("neighbours: no registry (%s): memory is neither asked of nor given to other processes",
                   self.start ? "its directory's name is too long for a socket address" : "no /proc/self/stat");
        return;
    }
    if (ps_safe_dir_check(self.dir, true, why, sizeof why) != PS_OK) {
        ps_warning("neighbours: %s: memory is neither asked of nor given to other processes", why);
        return;
    }
    if (other[0] && strlen(other) + 1 + (size_t)longest_size < sizeof self.other)
        memcpy(self.other, other, strlen(other) + 1);
    self.usable = 1;
}

/* Whether a second registry directory may be read now (it is never made). */
static bool registry_private(const char *dir)
{
    struct stat st;
    return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 077);
}

static bool registry_usable(void)
{
    pthread_once(&self.once, check_directory);
    return self.usable;
}

bool ps_neighbours_registry(const char **dir, const char **name)
{
    const ps_global_config_t *g = ps_global_config();
    if (!g || !g->neighbour_release || !registry_usable())
        return false;
    *dir = self.dir;
    *name = self.name;
    return true;
}

/* The UUID of device ordinal d (cuDeviceGetUuid_v2: a MIG instance's own). */
static bool device_uuid(int d, uint8_t out[16])
{
    CUuuid u;
    CUresult r = ps_real.cuDeviceGetUuid_v2   ? ps_real.cuDeviceGetUuid_v2(&u, d)
                 : ps_real.cuDeviceGetUuid ? ps_real.cuDeviceGetUuid(&u, d)
                                           : CUDA_ERROR_NOT_FOUND;
    if (r != CUDA_SUCCESS)
        return false;
    memcpy(out, u.bytes, 16);
    return true;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi writes it. */
static void uuid_text(const uint8_t u[16], char out[41])
{
    snprintf(out, 41, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* A datagram socket bound at `path` (an old file there is removed first),
 * receiving the sender's credentials with every message; -1 on failure. */
static int bound_socket(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    unlink(path);
    if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Receives one message: its size, the sender's address and uid (-1 when the
 * kernel gave no credentials); -1 with errno when none is waiting. */
static ssize_t receive(int fd, message_t *m, struct sockaddr_un *from, socklen_t *from_size, long *uid)
{
    union {
        char bytes[CMSG_SPACE(sizeof(struct ucred))];
        struct cmsghdr align;
    } control;
    struct iovec io = {m, sizeof *m};
    struct msghdr h = {.msg_name = from, .msg_namelen = from ? sizeof *from : 0, .msg_iov = &io,
                       .msg_iovlen = 1, .msg_control = control.bytes, .msg_controllen = sizeof control.bytes};
    ssize_t n = recvmsg(fd, &h, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    *uid = -1;
    if (n < 0)
        return n;
    if (from_size)
        *from_size = h.msg_namelen;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
            c->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
            struct ucred cred;
            memcpy(&cred, CMSG_DATA(c), sizeof cred);
            *uid = (long)cred.uid;
        } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) { /* never wanted: closed */
            size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; i++) {
                int passed;
                memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof passed);
                close(passed);
            }
        }
    return n;
}

static bool message_valid(const message_t *m, ssize_t size, long uid, int kind)
{
    return size == (ssize_t)sizeof *m && uid == (long)geteuid() && m->magic == MESSAGE_MAGIC &&
           m->version == MESSAGE_VERSION && m->kind == kind;
}

/* ---- 1. open and close ----------------------------------------------------------- */
int ps_neighbours_open(void)
{
    const ps_global_config_t *g = ps_global_config();
    if (!g || !g->neighbour_release || atomic_load(&serving_fd) >= 0 || !registry_usable())
        return PS_EUNSUPPORTED;
    int count = 0;
    if (!ps_real.cuDeviceGetCount || ps_real.cuDeviceGetCount(&count) != CUDA_SUCCESS)
        return PS_EUPSTREAM;
    char text[64 + PS_MAX_DEVICES * 42];
    size_t used = (size_t)snprintf(text, sizeof text, "%s", ENTRY_HEADER);
    served_count = count < PS_MAX_DEVICES ? count : PS_MAX_DEVICES;
    for (int d = 0; d < served_count; d++) {
        served_known[d] = device_uuid(d, served_uuid[d]);
        if (served_known[d]) {
            char u[41];
            uuid_text(served_uuid[d], u);
            used += (size_t)snprintf(text + used, sizeof text - used, "%s\n", u);
        }
    }
    char sock[sizeof self.dir], entry[sizeof self.dir], temporary[sizeof self.dir];
    if (!entry_path(sock, sizeof sock, self.name, ".sock") || !entry_path(entry, sizeof entry, self.name, ".gpus") ||
        !entry_path(temporary, sizeof temporary, self.name, ".new"))
        return PS_EINVAL;
    if (ps_test.neighbours_one_attempt)
        ps_warning("POOLSHIM_TEST_NEIGHBOURS_ONE_ATTEMPT=1: a neighbour's request gets one give-back, memory "
                   "behind a barrier the GPU has not passed yet stays (a test switch)");
    int fd = bound_socket(sock);
    if (fd >= 0)
        chmod(sock, 0600);
    if (fd < 0) {
        ps_warning("neighbours: cannot bind %s (%s): other processes cannot ask this one for memory", sock,
                   strerror(errno));
        return PS_EUPSTREAM;
    }
    static ps_safe_file_t file; /* (8 KiB: not on the stack) */
    char why[128] = "";
    bool written = ps_safe_file_create(&file, entry, temporary, why, sizeof why) == PS_OK;
    if (written && write(file.fd, text, used) != (ssize_t)used) {
        snprintf(why, sizeof why, "%s", strerror(errno));
        written = false;
    }
    written = written && ps_safe_file_commit(&file, why, sizeof why) == PS_OK;
    ps_safe_file_close(&file);
    if (!written) {
        ps_warning("neighbours: cannot write %s (%s): other processes cannot ask this one for memory", entry, why);
        close(fd);
        unlink(sock);
        return PS_EUPSTREAM;
    }
    atomic_store(&serving_fd, fd);
    ps_debug("neighbours: serving %d GPU(s) as %s/%s", served_count, self.dir, self.name);
    return PS_OK;
}

void ps_neighbours_close(void)
{
    int fd = atomic_exchange(&serving_fd, -1);
    if (fd < 0)
        return;
    char path[sizeof self.dir];
    if (entry_path(path, sizeof path, self.name, ".gpus"))
        unlink(path); /* first: no one finds us from now on */
    if (entry_path(path, sizeof path, self.name, ".sock"))
        unlink(path);
    close(fd);
}

int ps_neighbours_fd(void) { return atomic_load(&serving_fd); }

/* ---- 5. serve ------------------------------------------------------------------------- */
/* Whether the newest barrier of device d's table (issued before this call)
 * has passed: then every block a barrier made idle is idle now. Also true
 * when the table keeps no barriers (free_sync event or none). */
static bool newest_barrier_passed(ps_gpu_ops_t *gpu, uint64_t *generation)
{
    *generation = gpu && gpu->barrier_generation ? gpu->barrier_generation(gpu->ctx) : 0;
    if (!*generation || !gpu->barrier_passed)
        return true;
    ps_in_shim++;
    bool passed = gpu->barrier_passed(gpu->ctx, *generation) == PS_OK;
    ps_in_shim--;
    return passed;
}

/* The least a request is given when that much is free: unmapping is the
 * slow part (tens of microseconds per piece), so a request for one block
 * must not wait for a whole card to be unmapped (seconds for 100 GiB),
 * nor should an asker that needs many blocks ask once per block. */
#define GIVE_MIN (4ull << 30)

/* One request's give-back on device d (5. above): about `want` bytes
 * (at least GIVE_MIN), or everything idle when want is 0. */
static uint64_t give_for_request(int d, uint64_t want, uint64_t budget_ns, int *refused)
{
    if (want && want < GIVE_MIN)
        want = GIVE_MIN;
    uint64_t began = ps_now_ns(), given = 0;
    unsigned pause_ms = 1;
    for (;;) {
        ps_gpu_ops_t *gpu = __atomic_load_n(&ps_device(d)->gpu, __ATOMIC_ACQUIRE);
        uint64_t generation, after;
        bool passed = newest_barrier_passed(gpu, &generation);
        given += ps_give_back_device(d, ps_now_ns(), 0, want ? want - given : 0, refused);
        if (*refused || ps_process_exiting() || (want && given >= want))
            break;
        after = gpu && gpu->barrier_generation ? gpu->barrier_generation(gpu->ctx) : 0;
        if ((passed && after == generation) || ps_test.neighbours_one_attempt)
            break; /* every barrier had passed and none was issued since: all idle memory went */
        if (ps_now_ns() - began + pause_ms * 1000000ull > budget_ns)
            break;
        struct timespec pause = {0, (long)pause_ms * 1000000L};
        nanosleep(&pause, NULL);
        pause_ms = pause_ms < 16 ? pause_ms * 2 : 16;
    }
    return given;
}

void ps_neighbours_serve(void)
{
    int fd = atomic_load(&serving_fd);
    for (int served = 0; fd >= 0 && served < 64 && !ps_process_exiting(); served++) {
        message_t m;
        struct sockaddr_un from;
        socklen_t from_size = 0;
        long uid;
        ssize_t n = receive(fd, &m, &from, &from_size, &uid);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return; /* (EAGAIN: none left) */
        }
        if (!message_valid(&m, n, uid, MESSAGE_REQUEST) || from_size <= sizeof(sa_family_t) || !from.sun_path[0])
            continue; /* not ours, or no address to answer (an unbound or abstract socket) */
        message_t answer = {.magic = MESSAGE_MAGIC, .version = MESSAGE_VERSION, .kind = MESSAGE_ANSWER,
                            .pid = (uint32_t)self.pid, .number = m.number};
        memcpy(answer.uuid, m.uuid, 16);
        int d = -1;
        for (int i = 0; i < served_count && d < 0; i++)
            if (served_known[i] && memcmp(served_uuid[i], m.uuid, 16) == 0)
                d = i;
        if (d >= 0) {
            uint64_t budget_ms = m.wait_ms / 2 < SERVE_BUDGET_MAX_MS ? m.wait_ms / 2 : SERVE_BUDGET_MAX_MS;
            int refused = 0;
            uint64_t began = ps_now_ns();
            answer.bytes = give_for_request(d, m.bytes, budget_ms * 1000000ull, &refused);
            answer.refused = (uint32_t)refused;
            char b[32];
            ps_info("device %d: process %u ran out of memory on this GPU: gave back %s in %.1f ms%s", d, m.pid,
                    ps_format_bytes(b, sizeof b, answer.bytes), (double)(ps_now_ns() - began) / 1e6,
                    refused ? " (a stream capture is open: nothing)" : "");
        }
        if (ps_process_exiting())
            return;
        sendto(fd, &answer, sizeof answer, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&from, from_size);
    }
}

/* ---- 2. ask ----------------------------------------------------------------------------- */
/* One neighbour to ask in this ask. */
typedef struct asked {
    int pid;
    unsigned long long start, ns;
    const char *dir; /* the registry directory of its entry (self.dir or self.other) */
    char name[NAME_MAX_CHARS]; /* its entry, p<pid>-<start>-<ns> */
    int rank;      /* the order it is asked in (2. above): 0 gave lately, 1 not heard of, 2 silent lately */
    uint64_t gave_ns; /* when it last gave memory (rank 0: the latest first) */
    bool sent;     /* the request went out */
    bool awaited;  /* its answer is waited for (4. above: not when it was silent lately) */
    bool answered; /* its answer came */
} asked_t;

/* The slot of a neighbour in known[], or known_count. known_lock held. */
static size_t known_find(int pid, unsigned long long start, unsigned long long ns)
{
    size_t i = 0;
    while (i < known_count && !(known[i].pid == pid && known[i].start == start && known[i].ns == ns))
        i++;
    return i;
}

/* The slot of a neighbour, made when absent (NULL: out of host memory).
 * Entries neither silent nor heard of lately go first. known_lock held. */
static known_t *known_slot(const asked_t *a, uint64_t now)
{
    size_t i = known_find(a->pid, a->start, a->ns);
    if (i < known_count)
        return &known[i];
    for (size_t k = 0; k < known_count;) {
        if (known[k].silent_until_ns <= now && known[k].gave_ns + REMEMBERED_NS <= now)
            known[k] = known[--known_count];
        else
            k++;
    }
    if (known_count == known_capacity) {
        size_t capacity = known_capacity ? known_capacity * 2 : 64;
        known_t *bigger = realloc(known, capacity * sizeof *bigger);
        if (!bigger)
            return NULL;
        known = bigger;
        known_capacity = capacity;
    }
    known[known_count] = (known_t){.pid = a->pid, .start = a->start, .ns = a->ns};
    return &known[known_count++];
}

/* What the asks before learnt of `a`: its rank and whether it is awaited. */
static void recall(asked_t *a, uint64_t now)
{
    pthread_mutex_lock(&known_lock);
    size_t i = known_find(a->pid, a->start, a->ns);
    const known_t *k = i < known_count ? &known[i] : NULL;
    bool silent = k && k->silent_until_ns > now;
    a->gave_ns = k ? k->gave_ns : 0;
    a->rank = silent ? 2 : a->gave_ns && a->gave_ns + REMEMBERED_NS > now ? 0 : 1;
    a->awaited = !silent;
    pthread_mutex_unlock(&known_lock);
}

/* Remembers what this ask learnt of `a`: silent until `silent_until`
 * (0: it answered), or that it gave memory now. */
static void remember(const asked_t *a, uint64_t now, uint64_t silent_until, bool gave)
{
    pthread_mutex_lock(&known_lock);
    known_t *k = known_slot(a, now);
    if (k) {
        k->silent_until_ns = silent_until;
        if (gave)
            k->gave_ns = now;
    }
    pthread_mutex_unlock(&known_lock);
}

static int compare_asked(const void *pa, const void *pb)
{
    const asked_t *a = pa, *b = pb;
    if (a->rank != b->rank)
        return a->rank < b->rank ? -1 : 1;
    return a->gave_ns > b->gave_ns ? -1 : a->gave_ns < b->gave_ns; /* (the latest giver first) */
}

/* Removes a dead process's entry (3. above) from `dir`. */
static void remove_entry(const char *dir, const char *name_without_suffix)
{
    char path[sizeof self.dir];
    if (path_in(path, sizeof path, dir, name_without_suffix, ".gpus"))
        unlink(path);
    if (path_in(path, sizeof path, dir, name_without_suffix, ".sock"))
        unlink(path);
    if (path_in(path, sizeof path, dir, name_without_suffix, ".stats"))
        unlink(path); /* its live statistics (shim/live.c) */
    ps_debug("neighbours: removed the entry of a process that ended (%s)", name_without_suffix);
}

/* Whether an entry file of this user lists `uuid` (false for anything
 * another user could have written). */
static bool entry_lists(int dir_fd, const char *file, const char *uuid)
{
    int fd = openat(dir_fd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return false;
    struct stat st;
    char text[64 + PS_MAX_DEVICES * 42];
    ssize_t n = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022))
        n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n < (ssize_t)strlen(ENTRY_HEADER))
        return false;
    text[n] = 0;
    if (strncmp(text, ENTRY_HEADER, strlen(ENTRY_HEADER)) != 0)
        return false;
    for (char *line = text + strlen(ENTRY_HEADER); *line;) {
        char *end = strchr(line, '\n');
        if (!end)
            break;
        if ((size_t)(end - line) == strlen(uuid) && strncmp(line, uuid, (size_t)(end - line)) == 0)
            return true;
        line = end + 1;
    }
    return false;
}

/* Whether a socket of this user is at `path` with someone bound to it:
 * 1 yes, 0 nobody (connect refused or gone: dead), -1 not to be trusted. */
static int socket_alive(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return 0;
    if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid())
        return -1;
    int probe = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (probe < 0)
        return 1; /* (cannot tell: assume alive) */
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int alive = connect(probe, (struct sockaddr *)&a, sizeof a) == 0 || (errno != ECONNREFUSED && errno != ENOENT);
    close(probe);
    return alive;
}

/* Whether `name` is a reply socket of an ask, a<pid>-<start>-<ns>-<tid>.sock
 * or a<pid>-<start>-<ns>-<tid>.<k>.sock; *pid its process. */
static bool reply_socket_name(const char *name, int *pid)
{
    int tid, k, used = 0;
    unsigned long long start, ns;
    if (name[0] != 'a' || sscanf(name, "a%d-%llu-%llu-%d%n", pid, &start, &ns, &tid, &used) != 4)
        return false;
    const char *rest = name + used;
    if (!strcmp(rest, ".sock"))
        return true;
    used = 0;
    return sscanf(rest, ".%d.sock%n", &k, &used) == 1 && !rest[used];
}

/* Adds to *asked every live neighbour in `dir` whose entry lists `uuid`,
 * removing dead entries on the way. */
static void scan_directory(const char *dir, const char *uuid, asked_t **asked, size_t *count, size_t *capacity,
                           uint64_t now)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        int pid, used = 0;
        unsigned long long start, ns;
        char name[NAME_MAX_CHARS], path[sizeof self.dir];
        if (reply_socket_name(e->d_name, &pid)) {
            if (pid != self.pid && path_in(path, sizeof path, dir, e->d_name, "") && socket_alive(path) == 0)
                unlink(path); /* another asker's reply socket, left by a process that ended */
            continue;
        }
        if (e->d_name[0] != 'p' || sscanf(e->d_name, "p%d-%llu-%llu.gpus%n", &pid, &start, &ns, &used) != 3 ||
            e->d_name[used] || (size_t)used >= sizeof name)
            continue;
        snprintf(name, sizeof name, "%.*s", used - 5, e->d_name); /* (without ".gpus") */
        if (pid == self.pid && start == self.start && ns == self.ns)
            continue; /* ourselves */
        if (ns == self.ns && ps_process_start(pid) != start) {
            remove_entry(dir, name); /* gone, or the pid is another process's now */
            continue;
        }
        if (!entry_lists(dirfd(d), e->d_name, uuid) || !path_in(path, sizeof path, dir, name, ".sock"))
            continue;
        int alive = socket_alive(path);
        if (alive == 0)
            remove_entry(dir, name);
        if (alive != 1)
            continue;
        if (*count == *capacity) {
            size_t more = *capacity ? *capacity * 2 : 64;
            asked_t *bigger = realloc(*asked, more * sizeof *bigger);
            if (!bigger)
                break;
            *asked = bigger;
            *capacity = more;
        }
        asked_t *a = &(*asked)[(*count)++];
        *a = (asked_t){.pid = pid, .start = start, .ns = ns, .dir = dir};
        memcpy(a->name, name, sizeof name);
        recall(a, now);
    }
    closedir(d);
}

/* The reply sockets of one ask (2. above). */
typedef struct replies {
    int fd[REPLY_SOCKETS_MAX];                          /* bound sockets */
    char path[REPLY_SOCKETS_MAX][sizeof self.dir];      /* where */
    int count;                                          /* how many */
} replies_t;

/* Binds one more reply socket; false when none can be. */
static bool add_reply_socket(replies_t *r, long tid)
{
    if (r->count == REPLY_SOCKETS_MAX)
        return false;
    char name[NAME_MAX_CHARS];
    if (r->count == 0)
        snprintf(name, sizeof name, "a%d-%llu-%llu-%ld.sock", self.pid, self.start, self.ns, tid);
    else
        snprintf(name, sizeof name, "a%d-%llu-%llu-%ld.%d.sock", self.pid, self.start, self.ns, tid, r->count);
    if (!entry_path(r->path[r->count], sizeof r->path[r->count], name, ""))
        return false;
    int fd = bound_socket(r->path[r->count]);
    if (fd < 0)
        return false;
    r->fd[r->count++] = fd;
    return true;
}

/* Sends `request` to `a`; on a full queue of the last reply socket a fresh
 * one takes the rest (not for a silent neighbour: its own queue is likely
 * the full one). Returns whether it was sent; *dead when nobody is bound. */
static bool send_request(replies_t *r, const message_t *request, const asked_t *a, long tid, bool *dead)
{
    struct sockaddr_un to = {.sun_family = AF_UNIX};
    *dead = false;
    if (!path_in(to.sun_path, sizeof to.sun_path, a->dir, a->name, ".sock"))
        return false;
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = r->fd[r->count - 1];
        if (sendto(fd, request, sizeof *request, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&to, sizeof to) ==
            (ssize_t)sizeof *request)
            return true;
        if (errno == ECONNREFUSED || errno == ENOENT) {
            *dead = true;
            return false;
        }
        if ((errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS) || a->rank == 2 || attempt ||
            !add_reply_socket(r, tid))
            return false;
    }
    return false;
}

uint64_t ps_neighbours_ask(int device, uint64_t wanted)
{
    const ps_global_config_t *g = ps_global_config();
    if (!g || !g->neighbour_release || ps_in_shim || device < 0 || device >= PS_MAX_DEVICES ||
        ps_process_exiting() || !registry_usable())
        return 0;
    message_t request = {.magic = MESSAGE_MAGIC, .version = MESSAGE_VERSION, .kind = MESSAGE_REQUEST,
                         .pid = (uint32_t)self.pid, .number = atomic_fetch_add(&next_number, 1), .bytes = wanted,
                         .wait_ms = (uint32_t)ps_global_config()->neighbour_wait_ms};
    if (!device_uuid(device, request.uuid))
        return 0;
    long tid = (long)syscall(SYS_gettid);
    replies_t *r = calloc(1, sizeof *r);
    if (!r || !add_reply_socket(r, tid)) {
        ps_info("device %d: cannot ask the neighbours for memory (%s in %s)", device,
                r ? strerror(errno) : "out of host memory", self.dir);
        free(r);
        return 0;
    }
    uint64_t began = ps_now_ns(), deadline = began + ps_global_config()->neighbour_wait_ms * 1000000ull;
    char uuid[41];
    uuid_text(request.uuid, uuid);
    asked_t *asked = NULL;
    size_t asked_count = 0, capacity = 0;
    scan_directory(self.dir, uuid, &asked, &asked_count, &capacity, began);
    if (self.other[0] && registry_private(self.other))
        scan_directory(self.other, uuid, &asked, &asked_count, &capacity, began);
    if (asked_count > 1)
        qsort(asked, asked_count, sizeof *asked, compare_asked);
    int sent = 0, awaited = 0, answers = 0;
    for (size_t i = 0; i < asked_count; i++) {
        bool dead;
        asked[i].sent = send_request(r, &request, &asked[i], tid, &dead);
        if (dead)
            remove_entry(asked[i].dir, asked[i].name);
        asked[i].awaited = asked[i].awaited && asked[i].sent;
        sent += asked[i].sent;
        awaited += asked[i].awaited;
    }
    uint64_t given = 0;
    struct pollfd p[REPLY_SOCKETS_MAX];
    for (int k = 0; k < r->count; k++)
        p[k] = (struct pollfd){r->fd[k], POLLIN, 0};
    while (awaited > 0 && !(wanted && given >= wanted)) {
        uint64_t now = ps_now_ns();
        if (now >= deadline)
            break;
        int ready = poll(p, (nfds_t)r->count, (int)((deadline - now + 999999) / 1000000));
        if (ready < 0 && errno != EINTR)
            break;
        for (int k = 0; k < r->count; k++) {
            message_t m;
            long uid;
            ssize_t n;
            while ((n = receive(r->fd[k], &m, NULL, NULL, &uid)) >= 0) {
                if (!message_valid(&m, n, uid, MESSAGE_ANSWER) || m.number != request.number ||
                    memcmp(m.uuid, request.uuid, 16) != 0)
                    continue; /* another user's, or a late answer to an earlier ask */
                answers++;
                given += m.bytes;
                for (size_t i = 0; i < asked_count; i++)
                    if (asked[i].sent && asked[i].pid == (int)m.pid && !asked[i].answered) {
                        asked[i].answered = true;
                        awaited -= asked[i].awaited;
                        remember(&asked[i], ps_now_ns(), 0, m.bytes > 0);
                        break;
                    }
            }
        }
    }
    for (int k = 0; k < r->count; k++) {
        close(r->fd[k]);
        unlink(r->path[k]);
    }
    int silent_now = 0;
    for (size_t i = 0; i < asked_count; i++)
        if (asked[i].awaited && !asked[i].answered && !(wanted && given >= wanted)) {
            remember(&asked[i], ps_now_ns(), ps_now_ns() + SILENT_NS, false);
            silent_now++;
        }
    if (sent) {
        ps_stats_count_give(device, PS_GIVE_ASKED, (uint64_t)sent);
        ps_stats_count_give(device, PS_GIVE_ANSWERS, (uint64_t)answers);
        ps_stats_count_give(device, PS_GIVE_FROM_NEIGHBOURS, given);
        char b[32];
        ps_info("device %d: out of memory: asked %d neighbour process(es) on this GPU, %d answered in %.1f ms, "
                "giving back %s%s", device, sent, answers, (double)(ps_now_ns() - began) / 1e6,
                ps_format_bytes(b, sizeof b, given),
                silent_now ? " (the silent ones are not waited for in the next 30 s)" : "");
    }
    if ((size_t)sent < asked_count)
        ps_info("device %d: %zu neighbour process(es) could not be sent a request (their queues are full)", device,
                asked_count - (size_t)sent);
    free(asked);
    free(r);
    return given;
}
