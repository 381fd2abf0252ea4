/* Live statistics: every process under the shim publishes its figures while
 * it runs, for `poolshim top` (tools/cmd_top.c) to read.
 *
 * 1. Who and when: the give-back thread (shim/give_back.c) every
 *    PS_LIVE_PERIOD_MS (500 ms) between its decay ticks and neighbour
 *    requests; never an allocating thread, so the allocation path pays
 *    nothing (the figures are the per-thread counters the statistics keep
 *    anyway, summed by the reader as the exit report sums them).
 * 2. What: one JSON document, {"poolshim_live": 1, "live": 1, "pid", "start"
 *    (field 22 of /proc/self/stat), "pidns", the place in the job ("rank",
 *    "local_rank", "node", "hostname", "job", "step": ps_stats_write_place;
 *    absent when unknown), "command" (/proc/self/cmdline, arguments joined
 *    by spaces, at most COMMAND_MAX bytes), "time" (seconds since the epoch), "monotonic_ns"
 *    (CLOCK_MONOTONIC, one clock for every process of the machine: rates
 *    between two pages), "period_ms", "report": the exit report's JSON as
 *    ps_stats_write writes it, so the figures are the same}.
 * 3. Where: the neighbours' registry (shim/neighbours.c: one private
 *    directory per user, entries named p<pid>-<start>-<pidns>), as N.stats,
 *    written to N.stats.new and renamed: a reader sees a whole page or the
 *    one before. Whatever is at N.stats.new is removed first and the page
 *    made with O_EXCL (core/safe_file.c), so a FIFO or link there is never
 *    opened. With neighbour_release off or a refused directory nothing
 *    is published (said once at info level).
 * 4. Gone: at exit (the thread's stop removes it); a process killed before
 *    leaves it, and readers (poolshim top, a neighbour's ask) remove the page
 *    of a process that is gone or whose pid now has another start time.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../config/config.h"
#include "../core/safe_file.h"
#include "devices.h"
#include "live.h"
#include "neighbours.h"
#include "stats.h"

#define COMMAND_MAX 256 /* bytes of the command line kept (before escaping) */

/* The page's state (the give-back thread only). */
static struct {
    int decided;                   /* 1 once the first publish looked for the registry */
    int usable;                    /* 1: there is a registry to publish in */
    char page[PS_PATH_MAX];        /* DIR/N.stats */
    char temporary[PS_PATH_MAX];   /* DIR/N.stats.new */
    char command[COMMAND_MAX * 6 + 1]; /* the command line as a JSON string's contents */
    ps_safe_file_t file;           /* the page being written */
} live;

/* Appends byte string s (n bytes) to out as JSON string contents: valid
 * UTF-8 is kept, control characters escaped, any other byte written as '?'. */
static void json_escape(char *out, size_t size, const unsigned char *s, size_t n)
{
    size_t used = 0;
    for (size_t i = 0; i < n && used + 7 < size;) {
        unsigned char c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        int valid = len > 0 && i + len <= n && !(len == 2 && c < 0xc2);
        for (size_t k = 1; valid && k < len; k++)
            valid = (s[i + k] & 0xc0) == 0x80;
        if (!valid) {
            out[used++] = '?';
            i++;
        } else if (len > 1) {
            memcpy(out + used, s + i, len);
            used += len;
            i += len;
        } else if (c == '"' || c == '\\') {
            out[used++] = '\\';
            out[used++] = (char)c;
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            used += (size_t)snprintf(out + used, size - used, "\\u%04x", c);
            i++;
        } else {
            out[used++] = (char)c;
            i++;
        }
    }
    out[used] = 0;
}

/* The command line, its arguments joined by spaces, escaped. */
static void read_command(void)
{
    unsigned char raw[COMMAND_MAX];
    ssize_t n = -1;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        n = read(fd, raw, sizeof raw);
        close(fd);
    }
    if (n <= 0) {
        snprintf(live.command, sizeof live.command, "?");
        return;
    }
    while (n > 0 && raw[n - 1] == 0)
        n--;
    for (ssize_t i = 0; i < n; i++)
        if (raw[i] == 0)
            raw[i] = ' ';
    json_escape(live.command, sizeof live.command, raw, (size_t)n);
}

static void decide(void)
{
    live.decided = 1;
    const char *dir, *name;
    if (!ps_neighbours_registry(&dir, &name)) {
        const ps_global_config_t *g = ps_global_config();
        ps_info("live statistics: not published (%s)",
                g && !g->neighbour_release ? "global.neighbour_release is off: no registry"
                                           : "the registry directory cannot be used");
        return;
    }
    int a = snprintf(live.page, sizeof live.page, "%s/%s.stats", dir, name);
    int b = snprintf(live.temporary, sizeof live.temporary, "%s/%s.stats.new", dir, name);
    if (a <= 0 || b <= 0 || (size_t)b >= sizeof live.temporary) {
        ps_info("live statistics: not published (the registry's path is too long)");
        return;
    }
    read_command();
    live.usable = 1;
    ps_debug("live statistics: published every %d ms in %s", PS_LIVE_PERIOD_MS, live.page);
}

bool ps_live_publish(void)
{
    if (!live.decided)
        decide();
    if (!live.usable)
        return false;
    char why[128];
    FILE *f = NULL;
    if (ps_safe_file_create(&live.file, live.page, live.temporary, why, sizeof why) == PS_OK)
        f = fdopen(live.file.fd, "w");
    if (!f) {
        ps_safe_file_close(&live.file);
        return true; /* (the registry went away: try at the next period) */
    }
    struct timespec wall, mono;
    clock_gettime(CLOCK_REALTIME, &wall);
    clock_gettime(CLOCK_MONOTONIC, &mono);
    const char *dir, *name;
    unsigned long long start = 0, pidns = 0;
    if (ps_neighbours_registry(&dir, &name))
        sscanf(name, "p%*d-%llu-%llu", &start, &pidns);
    fprintf(f, "{\"poolshim_live\": 1, \"live\": 1, \"pid\": %d, \"start\": %llu, \"pidns\": %llu, ", (int)getpid(),
            start, pidns);
    ps_stats_write_place(f);
    fprintf(f, "\"command\": \"%s\", \"time\": %lld.%03ld, \"monotonic_ns\": %llu, \"period_ms\": %d, \"report\": ",
            live.command, (long long)wall.tv_sec, wall.tv_nsec / 1000000,
            (unsigned long long)mono.tv_sec * 1000000000ull + (unsigned long long)mono.tv_nsec, PS_LIVE_PERIOD_MS);
    ps_stats_write_now(f); /* (ends with "\n") */
    fprintf(f, "}\n");
    if (fflush(f) == 0 && !ferror(f))
        ps_safe_file_commit(&live.file, why, sizeof why); /* (else removed by the close) */
    fclose(f);
    live.file.fd = -1; /* (closed with f) */
    ps_safe_file_close(&live.file);
    return true;
}

void ps_live_remove(void)
{
    if (!live.usable)
        return;
    unlink(live.page);
    unlink(live.temporary);
}
