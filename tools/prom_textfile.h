/* Prometheus' node_exporter textfile collector, fed by `poolshim top
 * --textfile` (prom_textfile.c). Return rule: 0, or -1 with the reason in
 * err (or printed, for the service). */
#ifndef PS_TOOLS_PROM_TEXTFILE_H
#define PS_TOOLS_PROM_TEXTFILE_H

#include <stddef.h>
#include <stdio.h>

/* Prints one reading in Prometheus' text format (refreshing it first). */
typedef void (*prom_render_fn)(FILE *f, void *arg);
/* Reads one registry directory, with the effective uid of its owner. */
typedef void (*prom_read_fn)(const char *directory, void *arg);

/* The file `--textfile PATH` names: PATH itself when it ends in ".prom",
 * else PATH/poolshim.prom. */
int prom_textfile_path(const char *path, char *out, size_t size, char *err, size_t errsize);

/* Writes render's output to `file` atomically: a temporary file beside it
 * (".NAME.PID.tmp", never read by the collector), flushed, synced and
 * renamed over `file`, mode 0644 (the collector may run as another user). */
int prom_textfile_write(const char *file, prom_render_fn render, void *arg, char *err, size_t errsize);

/* Writes once (once != 0), or every interval_s seconds until SIGINT,
 * SIGTERM or SIGHUP, then removes `file`. A first write that fails ends
 * it (-1, printed); later failures are printed and the next tick tries
 * again. */
int prom_textfile_serve(const char *file, unsigned interval_s, int once, prom_render_fn render, void *arg);

/* For every PARENT/poolshim-<uid> directory owned by <uid>, calls
 * read_directory(), with the effective uid switched to <uid> (and back), so
 * the reader's own-user trust rules hold for each user. Needs root;
 * -1 (err) when the switch is refused or PARENT cannot be read. */
int prom_each_user_directory(const char *parent, prom_read_fn read_directory, void *arg, char *err, size_t errsize);

#endif
