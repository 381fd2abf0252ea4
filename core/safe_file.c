/* Files and directories written where another user may reach them.
 *
 * A file (ps_safe_file_create, ps_safe_file_commit):
 *  1. The name is looked at without following it (lstat): absent or a
 *     regular file of this user goes on; a character device (/dev/null, a
 *     terminal) is opened as it is, O_NOFOLLOW and O_NONBLOCK, and checked
 *     again on the descriptor; anything else is refused.
 *  2. The content goes to a new file, made with O_CREAT|O_EXCL|O_NOFOLLOW
 *     (a link or a FIFO planted at that name fails the open instead of being
 *     followed or blocking) at mode 0600, set again with fchmod so the umask
 *     cannot widen or narrow it.
 *  3. The commit checks the name once more and renames the new file over
 *     it: rename replaces a name and never writes through it, so a link, or
 *     a second hard link to another file, is never written into.
 * Guarantees: no file is followed through a symbolic link, opened blocking,
 * or written when another user owns it; a created file is 0600; a reader of
 * the name sees the old file or the whole new one.
 *
 * The private directory (ps_safe_dir_paths, ps_safe_dir_check): its
 * candidates in order, and the check that it is a directory of this user
 * that no one else may enter; a refusal says in one line how to fix it.
 */
#include "safe_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

/* What `st` is, when it is not a file this user may replace. */
static const char *refusal(const struct stat *st, char *buf, size_t size)
{
    if (S_ISLNK(st->st_mode))
        return "it is a symbolic link (never followed)";
    if (S_ISFIFO(st->st_mode))
        return "it is a FIFO (never opened)";
    if (S_ISSOCK(st->st_mode))
        return "it is a socket";
    if (S_ISDIR(st->st_mode))
        return "it is a directory";
    if (S_ISBLK(st->st_mode))
        return "it is a block device";
    if (!S_ISREG(st->st_mode))
        return "it is not a regular file";
    if (st->st_uid != geteuid()) {
        snprintf(buf, size, "it is a file of another user (uid %u)", (unsigned)st->st_uid);
        return buf;
    }
    return NULL;
}

static void say(char *why, size_t why_size, const char *text)
{
    if (why && why_size)
        snprintf(why, why_size, "%s", text);
}

/* PS_OK when `path` is absent or may be replaced; 1 when it is a character
 * device to be written as it is; PS_EINVAL (why[] set) otherwise. */
static int check_name(const char *path, char *why, size_t why_size)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return PS_OK;
        say(why, why_size, strerror(errno));
        return PS_EUPSTREAM;
    }
    if (S_ISCHR(st.st_mode))
        return 1;
    char buf[64];
    const char *wrong = refusal(&st, buf, sizeof buf);
    if (wrong) {
        say(why, why_size, wrong);
        return PS_EINVAL;
    }
    return PS_OK;
}

static int open_device(ps_safe_file_t *f, char *why, size_t why_size)
{
    int fd = open(f->path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode)) {
        say(why, why_size, fd < 0 ? strerror(errno) : "not a character device any more");
        if (fd >= 0)
            close(fd);
        return fd < 0 ? PS_EUPSTREAM : PS_EINVAL;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK); /* (a terminal: whole writes) */
    f->fd = fd;
    f->direct = true;
    f->temporary[0] = 0;
    return PS_OK;
}

int ps_safe_file_create(ps_safe_file_t *f, const char *path, const char *temporary, char *why, size_t why_size)
{
    f->fd = -1;
    f->direct = false;
    f->temporary[0] = 0;
    int n = snprintf(f->path, sizeof f->path, "%s", path);
    if (n <= 0 || (size_t)n >= sizeof f->path - 16) {
        say(why, why_size, "the name is too long");
        return PS_EINVAL;
    }
    int rc = check_name(path, why, why_size);
    if (rc == 1)
        return open_device(f, why, why_size);
    if (rc != PS_OK)
        return rc;
    for (int attempt = 0; attempt < 16 && f->fd < 0; attempt++) {
        if (temporary) {
            if (attempt > 0)
                break;
            n = snprintf(f->temporary, sizeof f->temporary, "%s", temporary);
            if (n <= 0 || (size_t)n >= sizeof f->temporary) {
                say(why, why_size, "the name is too long");
                return PS_EINVAL;
            }
            unlink(f->temporary); /* (a private directory's own name: whatever is there is ours or garbage) */
        } else {
            uint32_t r;
            if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
                r = (uint32_t)(ps_now_ns() * 0x9E3779B97F4A7C15ull >> 32) ^ (uint32_t)getpid();
            snprintf(f->temporary, sizeof f->temporary, "%s.%08x.tmp", path, r);
        }
        f->fd = open(f->temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (f->fd < 0 && errno != EEXIST)
            break;
    }
    if (f->fd < 0) {
        say(why, why_size, strerror(errno));
        f->temporary[0] = 0;
        return PS_EUPSTREAM;
    }
    fchmod(f->fd, 0600); /* (the umask only narrows the mode open gave; 0600 exactly) */
    return PS_OK;
}

int ps_safe_file_commit(ps_safe_file_t *f, char *why, size_t why_size)
{
    if (f->direct)
        return PS_OK;
    if (!f->temporary[0]) {
        say(why, why_size, "already committed");
        return PS_EINVAL;
    }
    int rc = check_name(f->path, why, why_size);
    if (rc == 1) {
        say(why, why_size, "a character device appeared there");
        rc = PS_EINVAL;
    }
    if (rc == PS_OK && rename(f->temporary, f->path) != 0) {
        say(why, why_size, strerror(errno));
        rc = PS_EUPSTREAM;
    }
    if (rc != PS_OK)
        unlink(f->temporary);
    f->temporary[0] = 0;
    return rc;
}

void ps_safe_file_close(ps_safe_file_t *f)
{
    if (!f->direct && f->temporary[0])
        unlink(f->temporary);
    f->temporary[0] = 0;
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
}

/* ---- the private directory ------------------------------------------------ */
static bool private_directory(const char *dir)
{
    struct stat st;
    return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 077);
}

void ps_safe_dir_paths(char *home, size_t home_size, char *other, size_t other_size)
{
    char shared[PS_SAFE_PATH_MAX];
    struct stat st;
    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(shared, sizeof shared, "/dev/shm/poolshim-%u", (unsigned)geteuid());
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(shared, sizeof shared, "%s/poolshim-%u", tmp && *tmp == '/' ? tmp : "/tmp", (unsigned)geteuid());
    }
    const char *runtime = getenv("XDG_RUNTIME_DIR");
    if (runtime && runtime[0] == '/' && private_directory(runtime) &&
        strlen(runtime) + sizeof "/poolshim" <= home_size) {
        snprintf(home, home_size, "%s/poolshim", runtime);
        snprintf(other, other_size, "%s", shared);
    } else {
        snprintf(home, home_size, "%s", shared);
        if (other_size)
            other[0] = 0;
    }
}

int ps_safe_dir_check(const char *dir, bool make, char *why, size_t why_size)
{
    struct stat st;
    if (lstat(dir, &st) != 0) {
        if (errno != ENOENT || !make) {
            snprintf(why, why_size, "%s: %s", dir, strerror(errno));
            return PS_EINVAL;
        }
        if (mkdir(dir, 0700) == 0) {
            chmod(dir, 0700); /* (the umask may have taken this user's own permissions) */
        } else if (errno != EEXIST) {
            snprintf(why, why_size, "cannot make %s (%s)", dir, strerror(errno));
            return PS_EINVAL;
        }
        if (lstat(dir, &st) != 0) {
            snprintf(why, why_size, "%s: %s", dir, strerror(errno));
            return PS_EINVAL;
        }
    }
    if (S_ISDIR(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 077))
        return PS_OK;
    const char *what = S_ISDIR(st.st_mode) ? "a directory" : S_ISLNK(st.st_mode) ? "a link" : "not a directory";
    char fix[256];
    if (S_ISDIR(st.st_mode) && st.st_uid == geteuid())
        snprintf(fix, sizeof fix, "chmod 700 %s", dir);
    else if (st.st_uid == geteuid())
        snprintf(fix, sizeof fix, "remove %s", dir);
    else
        snprintf(fix, sizeof fix,
                 "have root or its owner remove it, or set XDG_RUNTIME_DIR to a private directory of yours "
                 "(/run/user/%u where the system makes one)",
                 (unsigned)geteuid());
    snprintf(why, why_size,
             "%s is not a private directory of this user (%s, owner %u, mode %03o; wanted a directory of %u, mode "
             "700); to fix it: %s",
             dir, what, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)geteuid(), fix);
    return PS_EINVAL;
}
