/* Files and directories the library writes where another user of the
 * machine may reach them (core/safe_file.c): the statistics file, the
 * allocation logs, and the per-user private directory that holds the
 * neighbours' registry and the live pages. */
#ifndef PS_SAFE_FILE_H
#define PS_SAFE_FILE_H

#include <stdbool.h>
#include <stddef.h>

#define PS_SAFE_PATH_MAX 4096

/* A file being written: made under a temporary name, then given its name. */
typedef struct ps_safe_file {
    int fd;                               /* the open file, -1 when none */
    bool direct;                          /* an existing character device (/dev/null, a terminal) written as
                                             it is: nothing to rename */
    char path[PS_SAFE_PATH_MAX];          /* the name it gets */
    char temporary[PS_SAFE_PATH_MAX];     /* where it is written until ps_safe_file_commit ("" when direct) */
} ps_safe_file_t;

/* Opens a new file for writing that becomes `path` at ps_safe_file_commit.
 * `path` must be absent, a regular file of this user (replaced, never
 * written through) or a character device (opened as it is); anything else
 * (a symbolic link, a FIFO, a socket, a directory, a file of another user)
 * is refused. The file is made at `temporary` (NULL: `path` followed by a
 * random suffix; given: whatever is there is removed first, for names in a
 * private directory) with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600 whatever
 * the umask; nothing is ever opened that could block.
 * PS_OK; else PS_EINVAL (refused) or PS_EUPSTREAM (the system failed),
 * with a short reason in why[] ("it is a symbolic link (never followed)",
 * "Permission denied"). */
int ps_safe_file_create(ps_safe_file_t *f, const char *path, const char *temporary, char *why, size_t why_size);
/* Gives the file its name (rename), checking `path` once more as above;
 * the descriptor stays open. PS_OK, or PS_EINVAL with why[] set (the
 * temporary file is removed). */
int ps_safe_file_commit(ps_safe_file_t *f, char *why, size_t why_size);
/* Closes the file; a file not committed is removed. */
void ps_safe_file_close(ps_safe_file_t *f);

/* The private directory of this user, where its processes under the shim
 * meet (the neighbours' registry, live pages):
 *   1. $XDG_RUNTIME_DIR/poolshim when XDG_RUNTIME_DIR is an absolute path to
 *      a directory of this user with no group or other permission (the
 *      system makes it at login, /run/user/<uid>: no one else can take it);
 *   2. else /dev/shm/poolshim-<uid> (the system's temporary directory,
 *      $TMPDIR or /tmp, where /dev/shm is missing).
 * *home gets the one this process uses; *other the second of them when the
 * first is used (its processes started without XDG_RUNTIME_DIR, as batch
 * jobs often are), else "". */
void ps_safe_dir_paths(char *home, size_t home_size, char *other, size_t other_size);
/* Whether `dir` may be trusted: a directory (not a link) of this user with
 * no group or other permission. With `make` an absent one is made (0700).
 * PS_OK; else PS_EINVAL with one line in why[] saying what is wrong and
 * how to fix it. */
int ps_safe_dir_check(const char *dir, bool make, char *why, size_t why_size);

#endif
