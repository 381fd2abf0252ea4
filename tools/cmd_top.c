/* poolshim top: what every process of this user under the shim holds,
 * requests and spends in allocation, now, per device.
 *
 * Algorithm:
 *   1. The registry directory ($XDG_RUNTIME_DIR/poolshim where the system
 *      made a private runtime directory, else /dev/shm/poolshim-<uid>, as
 *      the shim chooses it: core/safe_file.c; --dir another) must be a
 *      directory of this user with no group or other permission, as the
 *      shim requires (shim/neighbours.c); otherwise exit 1. A missing one
 *      means no process. Without --dir the second candidate is read too
 *      when it is private (processes started without XDG_RUNTIME_DIR).
 *   2. Every p<pid>-<start>-<pidns>.stats in it is a process's live page
 *      (shim/live.c, rewritten every 500 ms by rename). A page of a process
 *      that is gone, or whose pid now has another start time (the same
 *      rules as the neighbours'), is removed with the process's other
 *      registry entries and not shown; a page another user could have
 *      written is ignored.
 *   3. Each page's "report" is the exit report's JSON: one row per device,
 *      at most DEVICES_PER_PAGE_MAX of one page (so a page cannot crowd out
 *      the others). The command and the job are made printable: every
 *      control character (C0, DEL, C1), bidirectional override and byte
 *      that is not UTF-8 becomes '?', so no output carries a terminal
 *      escape. Allocations per second come from two readings of the same
 *      process and device (the previous one is kept): --once and --json read
 *      the pages, wait one page period (the longest `period_ms`, 500 ms, and
 *      a margin) for the next pages, and read again; the terminal view has
 *      rates from its second refresh on.
 *   4. Shown as a table refreshed every second in the terminal (ANSI
 *      escapes, no curses; q quits, s changes the sort column; the terminal
 *      is restored at exit and on SIGINT/SIGTERM/SIGHUP), or once: a table
 *      (--once), JSON (--json) or Prometheus' text format (--prometheus);
 *      or Prometheus' format into node_exporter's textfile directory every
 *      --interval seconds (--textfile; prom_textfile.c), of this user or,
 *      for root, of every user (--all-users).
 * It reads files only: no CUDA call, no GPU needed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "../core/common.h"
#include "../core/resource.h"
#include "../core/safe_file.h"
#include "cli.h"
#include "prom_textfile.h"

static const char top_usage[] =
    "usage: poolshim top [--once | --json | --prometheus] [--dir DIR]\n"
    "       poolshim top --prometheus --textfile PATH [--interval N] [--once] [--all-users] [--dir DIR]\n"
    "\n"
    "Shows every process of this user under the shim on this machine, per device: pid,\n"
    "rank, requested and reserved bytes now, their ratio, peak reserved, allocations per\n"
    "second, time in allocation calls, barriers, pieces mapped, bytes given back, command.\n"
    "Each process publishes these every 500 ms (global.neighbour_release on; requested\n"
    "bytes and times need global.stats). Reads files only: no GPU needed.\n"
    "\n"
    "In a terminal the view refreshes every second: q quits, s changes the sort column.\n"
    "\n"
    "options:\n"
    "  --once        print the table once (no terminal escapes), after reading every\n"
    "                process's page twice, 0.65 s apart, for ALLOC/S\n"
    "  -j, --json    print one JSON document (read as --once does)\n"
    "  --prometheus  print Prometheus' text exposition format (textfile collector)\n"
    "  --textfile PATH  write it to node_exporter's textfile directory PATH (as\n"
    "                poolshim.prom; or to PATH itself when it ends in .prom), atomically,\n"
    "                every --interval seconds (default 15) until stopped, then remove it\n"
    "  --all-users   (root) every user's processes: each user's registry in the\n"
    "                directory --dir names (default /dev/shm), read as that user\n"
    "  --dir DIR     the registry directory (default $XDG_RUNTIME_DIR/poolshim when the system\n"
    "                made a private runtime directory, and /dev/shm/poolshim-<uid>)\n"
    "  -h, --help    this text\n"
    "\n"
    "exit status: 1 when the directory is not a private directory of this user.\n";

#define COMMAND_CHARS 256
#define DEVICES_PER_PAGE_MAX 64 /* rows of one page: the shim serves at most 64 devices (PS_MAX_DEVICES) */
#define ROWS_MAX (1 << 20)      /* rows in all */
#define PAGE_PERIOD_MAX_MS 2000 /* the longest wait for a second reading */
#define PAGE_MARGIN_MS 150      /* beyond a page's period: its writer's lateness */

/* One process's figures on one device, as its page says. */
typedef struct top_row {
    int pid;                    /* the process (in its pid namespace) */
    unsigned long long start;   /* its start time (field 22 of /proc/<pid>/stat) */
    long rank;                  /* the launcher's rank, -1 when none */
    char command[COMMAND_CHARS]; /* its command line */
    char job[64];               /* its Slurm job ("job" of the page), "" when none */
    char user[64];              /* its user's name (the registry's owner), or the uid */
    double time;                /* when the page was written (seconds since the epoch) */
    uint64_t monotonic_ns;      /* the same on CLOCK_MONOTONIC */
    int period_ms;              /* how often the process rewrites its page */
    int device;                 /* the device ordinal in that process */
    uint64_t requested;         /* bytes asked for and not freed (stats on) */
    uint64_t requested_peak;    /* the most of them */
    uint64_t allocations;       /* device allocation calls served */
    uint64_t failures;          /* allocations that failed */
    uint64_t time_ns;           /* time inside the allocation and free calls (stats on; estimated) */
    uint64_t counters[PS_COUNTER_COUNT]; /* its stack's counters (core/resource.h) that the report has */
    uint64_t given_back;        /* bytes given back while running: decay and neighbours */
    uint64_t oom_retries;       /* allocations beside the pool retried after running out of memory */
    double rate;                /* allocations per second since the last reading, <0: unknown */
} top_row_t;

/* The previous reading of a process's device (for rates). */
typedef struct top_reading {
    int pid, device;
    unsigned long long start;
    uint64_t allocations, monotonic_ns;
} top_reading_t;

static top_row_t *rows;          /* this reading's rows */
static int row_count;            /* rows used */
static int row_capacity;         /* rows allocated */
static top_reading_t *previous;  /* the reading before (for rates) */
static int previous_count;       /* readings used */
static int previous_capacity;    /* readings allocated */

/* ---- 1. the directory ------------------------------------------------------ */
/* The directory that holds every user's registry in the shared place,
 * /dev/shm (--all-users). */
static void shared_parent(char *out, size_t size)
{
    char home[PS_SAFE_PATH_MAX], other[PS_SAFE_PATH_MAX];
    ps_safe_dir_paths(home, sizeof home, other, sizeof other);
    snprintf(out, size, "%s", other[0] ? other : home);
    *strrchr(out, '/') = 0;
}

/* 1 usable, 0 absent (no process), -1 refused (printed). */
static int check_directory(const char *dir)
{
    struct stat st;
    char why[512];
    if (lstat(dir, &st) != 0 && errno == ENOENT)
        return 0;
    if (ps_safe_dir_check(dir, false, why, sizeof why) != PS_OK) {
        fprintf(stderr, "poolshim: error: top: %s: its pages are not trusted\n", why);
        return -1;
    }
    return 1;
}

/* ---- 2. pages, and whether their process lives ----------------------------- */
static unsigned long long own_pid_namespace(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long long)st.st_ino : 0;
}

/* For a process of another pid namespace: whether someone is bound to its
 * request socket (1), nobody (0: dead), or it cannot be told (1). */
static int socket_alive(const char *dir, const char *name)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path, sizeof a.sun_path, "%s/%s.sock", dir, name);
    struct stat st;
    if (n <= 0 || (size_t)n >= sizeof a.sun_path)
        return 1;
    if (lstat(a.sun_path, &st) != 0)
        return 0;
    int probe = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (probe < 0)
        return 1;
    int alive = connect(probe, (struct sockaddr *)&a, sizeof a) == 0 || (errno != ECONNREFUSED && errno != ENOENT);
    close(probe);
    return alive;
}

/* Removes a dead process's entries: its page and its neighbours' entry. */
static void remove_dead(const char *dir, const char *name)
{
    static const char *const suffixes[] = {".stats", ".gpus", ".sock"};
    char path[4200];
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        snprintf(path, sizeof path, "%s/%s%s", dir, name, suffixes[i]);
        unlink(path);
    }
}

/* Reads a page this user wrote (a regular file nobody else may write);
 * NULL otherwise. */
static char *read_page(int dir_fd, const char *file)
{
    int fd = openat(dir_fd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    struct stat st;
    char *text = NULL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022) &&
        st.st_size > 0 && st.st_size < (16 << 20)) {
        text = malloc((size_t)st.st_size + 1);
        ssize_t n = text ? read(fd, text, (size_t)st.st_size) : -1;
        if (n <= 0) {
            free(text);
            text = NULL;
        } else {
            text[n] = 0;
        }
    }
    close(fd);
    return text;
}

/* Allocations per second of a process's device since its previous reading. */
static double rate_of(const top_row_t *r)
{
    for (int i = 0; i < previous_count; i++) {
        const top_reading_t *p = &previous[i];
        if (p->pid == r->pid && p->start == r->start && p->device == r->device) {
            if (r->monotonic_ns <= p->monotonic_ns || r->allocations < p->allocations)
                return -1; /* (the same page again: no new reading) */
            return (double)(r->allocations - p->allocations) * 1e9 / (double)(r->monotonic_ns - p->monotonic_ns);
        }
    }
    return -1;
}

/* `text` made printable into out[size] (3. above): '?' for every control
 * character, bidirectional override or byte that is not UTF-8; a sequence
 * is never cut. */
static void printable(char *out, size_t size, const char *text)
{
    size_t used = 0;
    for (const unsigned char *s = (const unsigned char *)text; *s && used + 1 < size;) {
        size_t n = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
                                : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
        for (size_t i = 1; i < n; i++)
            if ((s[i] & 0xC0) != 0x80)
                n = 0;
        bool control = n == 1 && (s[0] < 0x20 || s[0] == 0x7f);
        control |= n == 2 && s[0] == 0xC2 && s[1] < 0xA0;                                   /* C1: U+0080-U+009F */
        control |= n == 3 && s[0] == 0xE2 && ((s[1] == 0x80 && s[2] >= 0xAA && s[2] <= 0xAE) || /* U+202A-U+202E */
                                              (s[1] == 0x81 && s[2] >= 0xA6 && s[2] <= 0xA9));  /* U+2066-U+2069 */
        if (n == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0)))
            n = 0; /* (overlong, surrogate) */
        if (n == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90)))
            n = 0; /* (overlong, above U+10FFFF) */
        if (!n || control) {
            out[used++] = '?';
            s += n ? n : 1;
        } else if (used + n < size) {
            memcpy(out + used, s, n);
            used += n;
            s += n;
        } else {
            break;
        }
    }
    out[used] = 0;
}

/* One more row (NULL when there is no room). */
static top_row_t *new_row(void)
{
    if (row_count == row_capacity) {
        int capacity = row_capacity ? row_capacity * 2 : 256;
        top_row_t *bigger = capacity <= ROWS_MAX ? realloc(rows, (size_t)capacity * sizeof *bigger) : NULL;
        if (!bigger)
            return NULL;
        rows = bigger;
        row_capacity = capacity;
    }
    return &rows[row_count++];
}

/* A page's rows (at most DEVICES_PER_PAGE_MAX); skipped silently when it is
 * not a live page. */
static void add_page(const char *text, int pid, unsigned long long start)
{
    char err[256];
    json_t *page = cli_json_parse(text, err, sizeof err);
    if (!page)
        return;
    json_t *devices = cli_json_at(page, "report.devices");
    if (cli_json_u64(page, "live", 0) != 1 || !json_is_array(devices)) {
        json_decref(page);
        return;
    }
    json_t *rank = cli_json_at(page, "rank");
    size_t i;
    json_t *d;
    json_array_foreach(devices, i, d) {
        top_row_t *r = i < DEVICES_PER_PAGE_MAX ? new_row() : NULL;
        if (!r)
            break;
        memset(r, 0, sizeof *r);
        r->pid = pid;
        r->start = start;
        r->rank = json_is_integer(rank) ? (long)json_integer_value(rank) : -1;
        printable(r->command, sizeof r->command, cli_json_str(page, "command", "?"));
        printable(r->job, sizeof r->job, cli_json_str(page, "job", ""));
        const struct passwd *user = getpwuid(geteuid()); /* (--all-users reads each registry as its owner) */
        if (user)
            snprintf(r->user, sizeof r->user, "%s", user->pw_name);
        else
            snprintf(r->user, sizeof r->user, "%u", (unsigned)geteuid());
        r->time = cli_json_double(page, "time", 0);
        r->monotonic_ns = cli_json_u64(page, "monotonic_ns", 0);
        r->period_ms = (int)cli_json_u64(page, "period_ms", 0);
        r->device = (int)cli_json_u64(d, "device", 0);
        r->requested = cli_json_u64(d, "bytes.requested_current", 0);
        r->requested_peak = cli_json_u64(d, "bytes.requested_peak", 0);
        for (int c = 0; c < PS_COUNTER_COUNT; c++)
            if (ps_resource_counters[c].json)
                r->counters[c] = cli_json_u64(d, ps_resource_counters[c].json, 0);
        r->allocations = cli_json_u64(d, "calls.cudaMalloc", 0) + cli_json_u64(d, "calls.cudaMallocAsync", 0) +
                         cli_json_u64(d, "calls.cuMemAlloc", 0) + cli_json_u64(d, "calls.cuMemAllocAsync", 0);
        r->failures = cli_json_u64(d, "failures", 0);
        r->time_ns = cli_json_u64(d, "time_ns.allocate", 0) + cli_json_u64(d, "time_ns.free", 0);
        r->given_back = cli_json_u64(d, "give_back.decay", 0) + cli_json_u64(d, "give_back.decay_host", 0) +
                        cli_json_u64(d, "give_back.to_neighbours", 0);
        r->oom_retries = cli_json_u64(d, "oom_retry.succeeded", 0) + cli_json_u64(d, "oom_retry.failed", 0);
        r->rate = rate_of(r);
    }
    json_decref(page);
}

/* Starts a reading: the rows so far become the readings before (rates). */
static void start_reading(void)
{
    if (row_count > previous_capacity) {
        top_reading_t *bigger = realloc(previous, (size_t)row_count * sizeof *bigger);
        if (bigger) {
            previous = bigger;
            previous_capacity = row_count;
        }
    }
    previous_count = 0;
    for (int i = 0; i < row_count && i < previous_capacity; i++)
        previous[previous_count++] = (top_reading_t){rows[i].pid, rows[i].device, rows[i].start,
                                                     rows[i].allocations, rows[i].monotonic_ns};
    row_count = 0;
}

/* Adds every live page of `dir` to rows[] (stale ones removed). */
static void add_pages(const char *dir, void *unused)
{
    (void)unused;
    DIR *d = opendir(dir);
    if (!d)
        return;
    unsigned long long own_ns = own_pid_namespace();
    for (struct dirent *e; (e = readdir(d));) {
        int pid, used = 0;
        unsigned long long start, ns;
        if (e->d_name[0] != 'p' || sscanf(e->d_name, "p%d-%llu-%llu.stats%n", &pid, &start, &ns, &used) != 3 ||
            e->d_name[used] || used <= 6)
            continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", used - 6, e->d_name); /* (without ".stats") */
        int dead = ns == own_ns ? ps_process_start(pid) != start : !socket_alive(dir, name);
        if (dead) {
            remove_dead(dir, name);
            continue;
        }
        char *text = read_page(dirfd(d), e->d_name);
        if (text)
            add_page(text, pid, start);
        free(text);
    }
    closedir(d);
}

/* The second directory read (1. above; "" for none). */
static char other_dir[PS_SAFE_PATH_MAX];

/* Adds the pages of the second directory while it is private. */
static void add_other_pages(void)
{
    char why[512];
    if (other_dir[0] && ps_safe_dir_check(other_dir, false, why, sizeof why) == PS_OK)
        add_pages(other_dir, NULL);
}

/* Reads every live page of `dir` (and of the second directory) into
 * rows[]; keeps the readings before. */
static void read_pages(const char *dir)
{
    start_reading();
    add_pages(dir, NULL);
    add_other_pages();
}

/* The pages read twice, one page period apart, so that every process that
 * still runs has a rate (--once, --json). */
static void read_pages_for_rates(const char *dir)
{
    read_pages(dir);
    int period_ms = 0;
    for (int i = 0; i < row_count; i++)
        if (rows[i].period_ms > period_ms)
            period_ms = rows[i].period_ms;
    if (!row_count)
        return;
    if (period_ms <= 0 || period_ms > PAGE_PERIOD_MAX_MS)
        period_ms = PAGE_PERIOD_MAX_MS;
    struct timespec wait = {0, (long)(period_ms + PAGE_MARGIN_MS) * 1000000L};
    while (wait.tv_nsec >= 1000000000L) {
        wait.tv_sec++;
        wait.tv_nsec -= 1000000000L;
    }
    while (nanosleep(&wait, &wait) != 0 && errno == EINTR)
        ;
    read_pages(dir);
}

/* ---- 3. order ---------------------------------------------------------------- */
enum { SORT_RESERVED, SORT_REQUESTED, SORT_PEAK, SORT_RATE, SORT_TIME, SORT_PID, SORT_COUNT };
static const char *const sort_names[SORT_COUNT] = {"reserved", "requested", "peak reserved", "allocations/s",
                                                   "allocation time", "pid"};
static int sort_by = SORT_RESERVED;

static int compare_u64(uint64_t a, uint64_t b) { return a > b ? -1 : a < b; } /* (larger first) */

static int compare_rows(const void *pa, const void *pb);

/* Orders rows[] by sort_by (qsort must not be given a NULL array, even empty). */
static void sort_rows(void)
{
    if (row_count > 1)
        qsort(rows, (size_t)row_count, sizeof rows[0], compare_rows);
}

static int compare_rows(const void *pa, const void *pb)
{
    const top_row_t *a = pa, *b = pb;
    int c = 0;
    switch (sort_by) {
    case SORT_RESERVED:
        c = compare_u64(a->counters[PS_COUNTER_bytes_reserved], b->counters[PS_COUNTER_bytes_reserved]);
        break;
    case SORT_REQUESTED: c = compare_u64(a->requested, b->requested); break;
    case SORT_PEAK:
        c = compare_u64(a->counters[PS_COUNTER_peak_bytes_reserved], b->counters[PS_COUNTER_peak_bytes_reserved]);
        break;
    case SORT_RATE: c = a->rate > b->rate ? -1 : a->rate < b->rate; break;
    case SORT_TIME: c = compare_u64(a->time_ns, b->time_ns); break;
    default: break;
    }
    if (!c)
        c = a->pid != b->pid ? (a->pid < b->pid ? -1 : 1) : (a->device > b->device) - (a->device < b->device);
    return c;
}

/* ---- 4. output --------------------------------------------------------------- */
static const char no_process_text[] =
    "no process under poolshim is running (a process shows here while it runs, with "
    "global.neighbour_release on)";

static const char header_format[] = "%7s %4s %3s %10s %10s %7s %10s %9s %10s %8s %7s %10s  %s";

/* One row as a line of the table (no newline). */
static void format_row(char *out, size_t size, const top_row_t *r)
{
    char rank[24] = "-", requested[32], reserved[32], ratio[32] = "-", peak[32], rate[32] = "-", time_text[32],
         barriers[32], maps[32], given[32], pid[24], device[24];
    if (r->rank >= 0)
        snprintf(rank, sizeof rank, "%ld", r->rank);
    if (r->requested)
        snprintf(ratio, sizeof ratio, "%.2fx", (double)r->counters[PS_COUNTER_bytes_reserved] / (double)r->requested);
    if (r->rate >= 0)
        snprintf(rate, sizeof rate, "%.0f", r->rate);
    snprintf(pid, sizeof pid, "%d", r->pid);
    snprintf(device, sizeof device, "%d", r->device);
    snprintf(out, size, header_format, pid, rank, device, cli_format_bytes(requested, sizeof requested, r->requested),
             cli_format_bytes(reserved, sizeof reserved, r->counters[PS_COUNTER_bytes_reserved]), ratio,
             cli_format_bytes(peak, sizeof peak, r->counters[PS_COUNTER_peak_bytes_reserved]), rate,
             cli_format_seconds(time_text, sizeof time_text, (double)r->time_ns / 1e9),
             cli_format_count(barriers, sizeof barriers, r->counters[PS_COUNTER_barriers]),
             cli_format_count(maps, sizeof maps, r->counters[PS_COUNTER_upstream_allocs]),
             cli_format_bytes(given, sizeof given, r->given_back), r->command);
}

static void format_header(char *out, size_t size)
{
    snprintf(out, size, header_format, "PID", "RANK", "DEV", "REQUESTED", "RESERVED", "RES/REQ", "PEAK RES",
             "ALLOC/S", "ALLOC TIME", "BARRIERS", "MAPS", "GIVEN BACK", "COMMAND");
}

static int process_count(void)
{
    int n = 0;
    for (int i = 0; i < row_count; i++)
        n += i == 0 || rows[i].pid != rows[i - 1].pid || rows[i].start != rows[i - 1].start;
    return n;
}

static void print_table(FILE *f)
{
    char line[1024];
    format_header(line, sizeof line);
    fprintf(f, "%s\n", line);
    for (int i = 0; i < row_count; i++) {
        format_row(line, sizeof line, &rows[i]);
        fprintf(f, "%s\n", line);
    }
}

static void print_json(FILE *f, const char *dir)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    fprintf(f, "{\"poolshim_top\": 1, \"directory\": ");
    cli_json_string(f, dir);
    fprintf(f, ", \"time\": %lld.%03ld, \"processes\": [", (long long)now.tv_sec, now.tv_nsec / 1000000);
    for (int i = 0; i < row_count; i++) {
        const top_row_t *r = &rows[i];
        int first_of_process = i == 0 || r->pid != rows[i - 1].pid || r->start != rows[i - 1].start;
        if (first_of_process) {
            fprintf(f, "%s\n  {\"pid\": %d, \"start\": %llu, \"rank\": ", i ? "]}," : "", r->pid, r->start);
            if (r->rank >= 0)
                fprintf(f, "%ld", r->rank);
            else
                fprintf(f, "null");
            fprintf(f, ", \"command\": ");
            cli_json_string(f, r->command);
            fprintf(f, ", \"time\": %.3f, \"devices\": [", r->time);
        }
        fprintf(f,
                "%s{\"device\": %d, \"requested_current\": %llu, \"requested_peak\": %llu, \"reserved_current\": %llu, "
                "\"reserved_peak\": %llu, \"reserved_ratio\": ",
                first_of_process ? "" : ", ", r->device, (unsigned long long)r->requested,
                (unsigned long long)r->requested_peak, (unsigned long long)r->counters[PS_COUNTER_bytes_reserved],
                (unsigned long long)r->counters[PS_COUNTER_peak_bytes_reserved]);
        if (r->requested)
            fprintf(f, "%.4f", (double)r->counters[PS_COUNTER_bytes_reserved] / (double)r->requested);
        else
            fprintf(f, "null");
        fprintf(f, ", \"allocations\": %llu, \"allocations_per_second\": ", (unsigned long long)r->allocations);
        if (r->rate >= 0)
            fprintf(f, "%.1f", r->rate);
        else
            fprintf(f, "null");
        fprintf(f, ", \"failures\": %llu, \"time_ns\": %llu, \"barriers\": %llu, \"maps\": %llu, \"given_back\": %llu}",
                (unsigned long long)r->failures, (unsigned long long)r->time_ns,
                (unsigned long long)r->counters[PS_COUNTER_barriers],
                (unsigned long long)r->counters[PS_COUNTER_upstream_allocs], (unsigned long long)r->given_back);
    }
    fprintf(f, "%s]}\n", row_count ? "]}\n" : "");
}

/* The shim's own metrics in print_prometheus; the stack's counters follow. */
#define SHIM_METRICS 7

/* A Prometheus label value: backslash, quote and newline escaped. */
static void prometheus_label(FILE *f, const char *text)
{
    for (const char *c = text; *c; c++) {
        if (*c == '\\' || *c == '"')
            fprintf(f, "\\%c", *c);
        else if (*c == '\n')
            fputs("\\n", f);
        else
            fputc(*c, f);
    }
}

/* One metric: its HELP and TYPE (a name ending in _total is a counter),
 * then one sample per row; `field` picks the value (print_prometheus). */
static void prometheus_metric(FILE *f, const char *name, const char *help, int field)
{
    size_t length = strlen(name);
    int counter = length > 6 && !strcmp(name + length - 6, "_total");
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, counter ? "counter" : "gauge");
    for (int i = 0; i < row_count; i++) {
        const top_row_t *r = &rows[i];
        fprintf(f, "%s{pid=\"%d\",device=\"%d\",rank=\"", name, r->pid, r->device);
        if (r->rank >= 0)
            fprintf(f, "%ld", r->rank);
        fprintf(f, "\",jobid=\"");
        prometheus_label(f, r->job);
        fprintf(f, "\",user=\"");
        prometheus_label(f, r->user);
        fprintf(f, "\",command=\"");
        prometheus_label(f, r->command);
        fprintf(f, "\"} ");
        switch (field) {
        case 0: fprintf(f, "%llu\n", (unsigned long long)r->requested); break;
        case 1: fprintf(f, "%llu\n", (unsigned long long)r->requested_peak); break;
        case 2: fprintf(f, "%llu\n", (unsigned long long)r->allocations); break;
        case 3: fprintf(f, "%llu\n", (unsigned long long)r->failures); break;
        case 4: fprintf(f, "%.9f\n", (double)r->time_ns / 1e9); break;
        case 5: fprintf(f, "%llu\n", (unsigned long long)r->given_back); break;
        case 6: fprintf(f, "%llu\n", (unsigned long long)r->oom_retries); break;
        default: fprintf(f, "%llu\n", (unsigned long long)r->counters[field - SHIM_METRICS]); break;
        }
    }
}

/* The shim's own metrics, then the stack's counters that name one
 * (core/resource.h). */
static void print_prometheus(FILE *f)
{
    static const struct {
        const char *name, *help;
    } metrics[SHIM_METRICS] = {
        {"poolshim_requested_bytes", "Bytes the program asked for and has not freed (needs global.stats)."},
        {"poolshim_requested_peak_bytes", "The most bytes the program had asked for at once (needs global.stats)."},
        {"poolshim_allocations_total", "Device allocation calls the shim served."},
        {"poolshim_allocation_failures_total", "Device allocations that failed."},
        {"poolshim_allocation_seconds_total",
         "Time inside the shim's allocation and free calls, estimated from sampled calls (needs global.stats)."},
        {"poolshim_given_back_bytes_total", "Bytes given back to the device while running (decay and neighbours)."},
        {"poolshim_oom_retries_total",
         "Allocations beside the pool that ran out of device memory and were retried after a give-back."},
    };
    for (int m = 0; m < SHIM_METRICS; m++)
        prometheus_metric(f, metrics[m].name, metrics[m].help, m);
    for (int c = 0; c < PS_COUNTER_COUNT; c++)
        if (ps_resource_counters[c].prometheus)
            prometheus_metric(f, ps_resource_counters[c].prometheus, ps_resource_counters[c].doc, SHIM_METRICS + c);
}

/* ---- the textfile service (prom_textfile.c) ----------------------------------- */
static int all_users;

/* Adds the pages of a registry the directory rules (1.) accept. */
static void add_checked_pages(const char *dir, void *unused)
{
    if (check_directory(dir) > 0)
        add_pages(dir, unused);
}

/* One reading of this user's registry, or every user's, in Prometheus' format. */
static void render_prometheus(FILE *f, void *dir)
{
    start_reading();
    char err[4400];
    if (!all_users) {
        add_checked_pages(dir, NULL);
        add_other_pages();
    } else if (prom_each_user_directory(dir, add_checked_pages, NULL, err, sizeof err) != 0)
        fprintf(stderr, "poolshim: warning: top: %s\n", err);
    sort_rows();
    print_prometheus(f);
}

/* ---- the interactive view ---------------------------------------------------- */
static struct termios saved_terminal;
static int terminal_changed;
static volatile sig_atomic_t quit_signal, resized;

static void restore_terminal(void)
{
    if (!terminal_changed)
        return;
    terminal_changed = 0;
    fputs("\033[?25h\033[?1049l", stdout); /* cursor back, main screen back */
    fflush(stdout);
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_terminal);
}

static void on_quit(int sig) { quit_signal = sig; }
static void on_resize(int sig) { (void)sig; resized = 1; }

static void draw(const char *dir)
{
    struct winsize ws = {0};
    int width = 160, height = 40;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
        width = ws.ws_col;
        height = ws.ws_row;
    }
    char line[1024], clock_text[16];
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(clock_text, sizeof clock_text, "%H:%M:%S", &tm);
    fputs("\033[H", stdout);
    snprintf(line, sizeof line, "poolshim top - %s - %d process%s, %d row%s - %s - sort: %s (s: next, q: quit)",
             clock_text, process_count(), process_count() == 1 ? "" : "es", row_count, row_count == 1 ? "" : "s", dir,
             sort_names[sort_by]);
    printf("%.*s\033[K\n\033[K\n", width, line);
    format_header(line, sizeof line);
    printf("\033[7m%-*.*s\033[0m\033[K\n", width, width, line);
    for (int i = 0; i < row_count && i < height - 4; i++) {
        format_row(line, sizeof line, &rows[i]);
        printf("%.*s\033[K\n", width, line);
    }
    if (!row_count)
        printf("%s\033[K\n", no_process_text);
    fputs("\033[J", stdout);
    fflush(stdout);
}

static int interactive(const char *dir)
{
    if (tcgetattr(STDIN_FILENO, &saved_terminal) != 0) {
        fprintf(stderr, "poolshim: error: top: the standard input is not a terminal (use --once)\n");
        return CLI_EXIT_FAILURE;
    }
    struct sigaction quit = {.sa_handler = on_quit}, resize = {.sa_handler = on_resize};
    sigemptyset(&quit.sa_mask);
    sigemptyset(&resize.sa_mask);
    sigaction(SIGINT, &quit, NULL);
    sigaction(SIGTERM, &quit, NULL);
    sigaction(SIGHUP, &quit, NULL);
    sigaction(SIGWINCH, &resize, NULL);
    struct termios raw = saved_terminal;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    terminal_changed = 1;
    atexit(restore_terminal);
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw);
    fputs("\033[?1049h\033[?25l\033[2J", stdout); /* the other screen, no cursor */
    struct timespec next = {0, 0};
    while (!quit_signal) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > next.tv_sec || (now.tv_sec == next.tv_sec && now.tv_nsec >= next.tv_nsec)) {
            read_pages(dir);
            sort_rows();
            draw(dir);
            next = now;
            next.tv_sec += 1;
        } else if (resized) {
            resized = 0;
            draw(dir);
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        long wait_ms = (long)(next.tv_sec - now.tv_sec) * 1000 + (next.tv_nsec - now.tv_nsec) / 1000000;
        struct pollfd p = {STDIN_FILENO, POLLIN, 0};
        if (poll(&p, 1, wait_ms > 0 ? (int)wait_ms : 0) <= 0)
            continue;
        char key;
        if (read(STDIN_FILENO, &key, 1) != 1)
            continue;
        if (key == 'q' || key == 'Q')
            break;
        if (key == 's' || key == 'S') {
            sort_by = (sort_by + 1) % SORT_COUNT;
            sort_rows();
            draw(dir);
        }
    }
    restore_terminal();
    return CLI_EXIT_OK;
}

int ps_cmd_top(int argc, char **argv)
{
    enum { OPT_ONCE = 1000, OPT_PROMETHEUS, OPT_DIR, OPT_TEXTFILE, OPT_INTERVAL, OPT_ALL_USERS };
    static const struct option options[] = {
        {"once", no_argument, NULL, OPT_ONCE},       {"json", no_argument, NULL, 'j'},
        {"prometheus", no_argument, NULL, OPT_PROMETHEUS}, {"dir", required_argument, NULL, OPT_DIR},
        {"textfile", required_argument, NULL, OPT_TEXTFILE}, {"interval", required_argument, NULL, OPT_INTERVAL},
        {"all-users", no_argument, NULL, OPT_ALL_USERS},
        {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0},
    };
    int once = 0, json = 0, prometheus = 0, c;
    char dir[4096] = "", textfile[4096] = "";
    long interval = 15;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":jh", options, NULL)) != -1) {
        switch (c) {
        case OPT_ONCE: once = 1; break;
        case 'j': json = 1; break;
        case OPT_PROMETHEUS: prometheus = 1; break;
        case OPT_DIR:
            if (cli_value_is_double_dash("top", argc, argv, optarg))
                return CLI_EXIT_USAGE;
            snprintf(dir, sizeof dir, "%s", optarg);
            break;
        case OPT_TEXTFILE: {
            char err[4200];
            if (cli_value_is_double_dash("top", argc, argv, optarg))
                return CLI_EXIT_USAGE;
            if (prom_textfile_path(optarg, textfile, sizeof textfile, err, sizeof err) != 0)
                return cli_usage_error("top", "--textfile %s", err);
            break;
        }
        case OPT_INTERVAL:
            if (cli_parse_int(optarg, 1, 86400, &interval) != 0)
                return cli_usage_error("top", "--interval: '%s' is not a whole number of seconds from 1 to 86400",
                                       optarg);
            break;
        case OPT_ALL_USERS: all_users = 1; break;
        case 'h': fputs(top_usage, stdout); return CLI_EXIT_OK;
        case ':': return cli_usage_error("top", "option '%s' needs a value", argv[optind - 1]);
        default: return cli_usage_error("top", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("top", "unexpected argument '%s'", argv[optind]);
    if (json + prometheus > 1)
        return cli_usage_error("top", "--json and --prometheus exclude each other");
    if ((textfile[0] || all_users) && !prometheus)
        return cli_usage_error("top", "--textfile and --all-users go with --prometheus");
    if (all_users && !dir[0])
        shared_parent(dir, sizeof dir);
    if (!dir[0])
        ps_safe_dir_paths(dir, sizeof dir, other_dir, sizeof other_dir);
    struct stat st;
    char why[512];
    if (other_dir[0] && lstat(other_dir, &st) == 0 && ps_safe_dir_check(other_dir, false, why, sizeof why) != PS_OK) {
        fprintf(stderr, "poolshim: warning: top: %s: its pages are not trusted\n", why);
        other_dir[0] = 0;
    }
    if (textfile[0])
        return prom_textfile_serve(textfile, (unsigned)interval, once, render_prometheus, dir) == 0
                   ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
    if (all_users) {
        render_prometheus(stdout, dir);
        return CLI_EXIT_OK;
    }
    int usable = check_directory(dir);
    if (usable < 0)
        return CLI_EXIT_FAILURE;
    if (!once && !json && !prometheus && isatty(STDOUT_FILENO) && isatty(STDIN_FILENO))
        return interactive(dir);
    if (prometheus)
        read_pages(dir); /* (counters: Prometheus' rate() makes the rates) */
    else
        read_pages_for_rates(dir);
    if (json)
        sort_by = SORT_PID; /* (a process's devices together) */
    sort_rows();
    if (json)
        print_json(stdout, dir);
    else if (prometheus)
        print_prometheus(stdout);
    else if (!row_count)
        printf("%s\n", no_process_text);
    else
        print_table(stdout);
    return CLI_EXIT_OK;
}
