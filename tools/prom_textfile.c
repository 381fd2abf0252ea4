/* The textfile service of `poolshim top --prometheus --textfile PATH`
 * (prom_textfile.h): node_exporter's textfile collector serves every *.prom
 * file of its directory with the node's own metrics.
 *
 * 1. A write renders one reading into DIR/.NAME.PID.tmp, flushes and syncs
 *    it, and renames it over DIR/NAME: the collector reads the whole of one
 *    reading or the whole of the one before, never a part (it reads only
 *    *.prom, so the temporary file is never read).
 * 2. The service writes every interval until SIGINT, SIGTERM or SIGHUP,
 *    then removes its file: a stopped service leaves no figures that look
 *    live.
 * 3. All users (root): each PARENT/poolshim-<uid> directory owned by <uid>
 *    is read with the effective uid of its owner, so the reader's rules (a
 *    private directory of that user, pages only that user could write) hold
 *    for every user; the effective uid is the caller's again before the
 *    file is written.
 */
#include "prom_textfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int prom_textfile_path(const char *path, char *out, size_t size, char *err, size_t errsize)
{
    size_t n = strlen(path);
    int fits;
    if (n > 5 && !strcmp(path + n - 5, ".prom"))
        fits = (size_t)snprintf(out, size, "%s", path) < size;
    else
        fits = (size_t)snprintf(out, size, "%s%spoolshim.prom", path, n && path[n - 1] == '/' ? "" : "/") < size;
    if (!fits)
        snprintf(err, errsize, "%s: the path is too long", path);
    return fits ? 0 : -1;
}

int prom_textfile_write(const char *file, prom_render_fn render, void *arg, char *err, size_t errsize)
{
    char temporary[4200];
    const char *slash = strrchr(file, '/');
    int dir_length = slash ? (int)(slash - file + 1) : 0;
    snprintf(temporary, sizeof temporary, "%.*s.%s.%ld.tmp", dir_length, file, file + dir_length, (long)getpid());
    int fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        snprintf(err, errsize, "%s: %s", temporary, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    fchmod(fd, 0644); /* (whatever the umask) */
    render(f, arg);
    int failed = fflush(f) != 0 || ferror(f) || fsync(fd) != 0;
    int saved = errno;
    if (fclose(f) != 0 && !failed) {
        failed = 1;
        saved = errno;
    }
    if (!failed && rename(temporary, file) != 0) {
        failed = 1;
        saved = errno;
    }
    if (failed) {
        unlink(temporary);
        snprintf(err, errsize, "%s: %s", file, strerror(saved));
        return -1;
    }
    return 0;
}

static volatile sig_atomic_t stop_signal;
static void on_stop(int sig) { stop_signal = sig; }

int prom_textfile_serve(const char *file, unsigned interval_s, int once, prom_render_fn render, void *arg)
{
    char err[4400];
    if (prom_textfile_write(file, render, arg, err, sizeof err) != 0) {
        fprintf(stderr, "poolshim: error: top: %s\n", err);
        return -1;
    }
    if (once)
        return 0;
    struct sigaction stop = {.sa_handler = on_stop}; /* (no SA_RESTART: the sleep ends at a signal) */
    sigemptyset(&stop.sa_mask);
    sigaction(SIGINT, &stop, NULL);
    sigaction(SIGTERM, &stop, NULL);
    sigaction(SIGHUP, &stop, NULL);
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    int failing = 0;
    while (!stop_signal) {
        next.tv_sec += interval_s;
        while (!stop_signal && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR) {
        }
        if (stop_signal)
            break;
        if (prom_textfile_write(file, render, arg, err, sizeof err) != 0) {
            if (!failing)
                fprintf(stderr, "poolshim: warning: top: %s (trying again every %u s)\n", err, interval_s);
            failing = 1;
        } else {
            failing = 0;
        }
    }
    unlink(file);
    return 0;
}

int prom_each_user_directory(const char *parent, prom_read_fn read_directory, void *arg, char *err, size_t errsize)
{
    uid_t self = geteuid();
    DIR *d = opendir(parent);
    if (!d) {
        snprintf(err, errsize, "%s: %s", parent, strerror(errno));
        return -1;
    }
    int status = 0;
    for (struct dirent *e; status == 0 && (e = readdir(d));) {
        unsigned long uid;
        int used = 0;
        if (strncmp(e->d_name, "poolshim-", 9) || sscanf(e->d_name + 9, "%lu%n", &uid, &used) != 1 ||
            e->d_name[9 + used] || e->d_name[9] < '0' || e->d_name[9] > '9')
            continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != (uid_t)uid)
            continue; /* (not that user's own: the reader would refuse it too) */
        if ((uid_t)uid != self && seteuid((uid_t)uid) != 0) {
            snprintf(err, errsize, "cannot read %s as its owner (uid %lu): %s (every user's processes need root)",
                     path, uid, strerror(errno));
            status = -1;
            break;
        }
        read_directory(path, arg);
        if ((uid_t)uid != self && seteuid(self) != 0) {
            snprintf(err, errsize, "cannot become uid %u again: %s", (unsigned)self, strerror(errno));
            closedir(d);
            abort(); /* (never write the file with another user's rights) */
        }
    }
    closedir(d);
    return status;
}
