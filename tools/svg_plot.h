/* Memory-over-time charts as self-contained SVG (no scripts, no external
 * fonts or images), written by our own code.
 * Return rule: 0 or -1 (with a message printed).
 */
#ifndef PS_TOOLS_SVG_PLOT_H
#define PS_TOOLS_SVG_PLOT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct plot_series {
    char name[96];       /* legend text */
    const double *x;     /* x values (seconds, or event numbers), non-decreasing */
    const uint64_t *y;   /* bytes */
    size_t count;        /* points */
    int dashed;          /* draw dashed (e.g. requested under reserved) */
} plot_series_t;

typedef struct plot_spec {
    const char *title;         /* first line of the title */
    const char *subtitle;      /* second line (config, log name), may be NULL */
    int x_is_time;             /* 1: x in seconds; 0: x is the event number */
    const plot_series_t *series; /* lines to draw */
    size_t series_count;       /* number of lines */
} plot_spec_t;

/* Writes the chart (960x540 px). */
int svg_plot_write(FILE *f, const plot_spec_t *spec);
/* Writes it to `path` ("-" = stdout). */
int svg_plot_file(const char *path, const plot_spec_t *spec);

/* A "nice" tick step (1, 2 or 5 times a power of ten) so that `range`
 * is covered by about `target` ticks. */
double plot_nice_step(double range, int target);

#endif
