/* SVG line charts of memory over time (see svg_plot.h).
 *
 * Algorithm:
 *   1. Find the x and y ranges over all series; y starts at 0.
 *   2. Pick the byte unit by the maximum (B, KiB, ... EiB) and nice
 *      ticks (1/2/5 x 10^k) in that unit for y, and in seconds (or events)
 *      for x; the axis ends at the first tick at or above the maximum.
 *   3. Memory is piecewise constant, so each series is a step line. More
 *      than 4000 points are reduced to 2000 x-buckets keeping each
 *      bucket's maximum and last value, so peaks survive and the file stays
 *      small.
 *   4. Title, axis labels with units, grid, legend (the y axis leaves
 *      room above the data for it); text is XML-escaped and kept inside
 *      the picture: an x label that would pass its right edge ends at the
 *      edge, a subtitle too long for the width is squeezed to it.
 */
#include "svg_plot.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define PLOT_WIDTH 960
#define PLOT_HEIGHT 540
#define MARGIN_LEFT 90
#define MARGIN_RIGHT 30
#define MARGIN_TOP 70
#define MARGIN_BOTTOM 60
#define MAX_POINTS 4000
#define BUCKETS 2000
/* The widest glyph of the 12-pixel tick labels (DejaVu Sans digits are
 * 0.64 em) and the average of the 13-pixel subtitle, in pixels: what keeps
 * text inside the picture. */
#define TICK_CHAR_PX 7.7
#define SUBTITLE_CHAR_PX 7.0

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                      "#9467bd", "#8c564b", "#e377c2", "#17becf"};

double plot_nice_step(double range, int target)
{
    if (!(range > 0) || target < 1)
        return 1;
    double raw = range / target;
    double magnitude = pow(10, floor(log10(raw)));
    double fraction = raw / magnitude;
    double nice = fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10;
    return nice * magnitude;
}

static void xml_text(FILE *f, const char *text)
{
    for (const char *c = text; *c; c++) {
        switch (*c) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*c >= 0x20 || *c == '\t')
                fputc(*c, f);
        }
    }
}

/* Tick label without trailing zeros ("0.5", "2", "1.25"). */
static void tick_label(char *buf, size_t size, double value, double step)
{
    /* as many decimals as the step needs (0.0000005 s steps of a log shorter
     * than 10 us included), so that neighbouring labels always differ */
    int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (decimals > 15)
        decimals = 15;
    snprintf(buf, size, "%.*f", decimals, fabs(value) < step * 1e-6 ? 0.0 : value);
}

/* The chart's scales (1. and 2.). */
typedef struct axes {
    double x_min, x_axis_max, x_step; /* x: from, to (a tick), between ticks */
    double divisor;                   /* bytes per unit of the y axis */
    int unit;                         /* index in units[] */
    double y_axis_max, y_step;        /* y in units: to (a tick), between ticks */
    double legend_height;             /* the legend's box */
} axes_t;

/* up to EiB: 2^64 bytes is 16 EiB, so labels stay within four digits */
static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
static const double plot_w = PLOT_WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
static const double plot_h = PLOT_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;

static double px_of(const axes_t *a, double x)
{
    return MARGIN_LEFT + (x - a->x_min) / (a->x_axis_max - a->x_min) * plot_w;
}
static double py_of(const axes_t *a, uint64_t bytes)
{
    return MARGIN_TOP + plot_h - ((double)bytes / a->divisor) / a->y_axis_max * plot_h;
}

static void compute_axes(const plot_spec_t *spec, axes_t *a)
{
    double x_min = INFINITY, x_max = -INFINITY;
    uint64_t y_max = 0;
    for (size_t s = 0; s < spec->series_count; s++)
        for (size_t i = 0; i < spec->series[s].count; i++) {
            double x = spec->series[s].x[i];
            if (x < x_min)
                x_min = x;
            if (x > x_max)
                x_max = x;
            if (spec->series[s].y[i] > y_max)
                y_max = spec->series[s].y[i];
        }
    if (!(x_min <= x_max)) {
        x_min = 0;
        x_max = 1;
    }
    if (!spec->x_is_time || x_min > 0)
        x_min = 0; /* memory charts start at the program's start */
    if (x_max <= x_min)
        x_max = x_min + 1;
    a->unit = 0;
    a->divisor = 1;
    while (a->unit < 6 && (double)y_max >= a->divisor * 1024) {
        a->divisor *= 1024;
        a->unit++;
    }
    /* headroom so the legend (top left) never covers a line */
    a->legend_height = 10 + 20.0 * (double)spec->series_count;
    const double free_fraction = 1 - (a->legend_height + 24) / (PLOT_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM);
    double y_top_units = (double)y_max / a->divisor / (free_fraction > 0.3 ? free_fraction : 0.3);
    a->y_step = plot_nice_step(y_top_units > 0 ? y_top_units : 1, 6);
    a->y_axis_max = ceil(y_top_units / a->y_step - 1e-9) * a->y_step;
    if (a->y_axis_max <= 0)
        a->y_axis_max = a->y_step;
    a->x_min = x_min;
    a->x_step = plot_nice_step(x_max - x_min, 8);
    a->x_axis_max = x_min + ceil((x_max - x_min) / a->x_step - 1e-9) * a->x_step;
}

/* The document's head, the titles, the grid with its ticks, the frame and the axes' names. */
static void write_frame(FILE *f, const plot_spec_t *spec, const axes_t *a)
{
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
            PLOT_WIDTH, PLOT_HEIGHT, PLOT_WIDTH, PLOT_HEIGHT);
    fprintf(f, "<title>");
    xml_text(f, spec->title ? spec->title : "memory over time");
    fprintf(f, "</title>\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"28\" font-size=\"18\" text-anchor=\"middle\" font-weight=\"bold\">",
            PLOT_WIDTH / 2);
    xml_text(f, spec->title ? spec->title : "memory over time");
    fprintf(f, "</text>\n");
    if (spec->subtitle) {
        double width = SUBTITLE_CHAR_PX * (double)strlen(spec->subtitle);
        char fit[96] = "";
        if (width > PLOT_WIDTH - 20)
            snprintf(fit, sizeof fit, " textLength=\"%d\" lengthAdjust=\"spacingAndGlyphs\"", PLOT_WIDTH - 20);
        fprintf(f, "<text x=\"%d\" y=\"50\" font-size=\"13\" text-anchor=\"middle\" fill=\"#444\"%s>",
                PLOT_WIDTH / 2, fit);
        xml_text(f, spec->subtitle);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "<g font-size=\"12\" fill=\"#333\">\n");
    char label[64];
    for (double v = 0; v <= a->y_axis_max + a->y_step * 1e-6; v += a->y_step) {
        double py = MARGIN_TOP + plot_h - v / a->y_axis_max * plot_h;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", MARGIN_LEFT,
                py, MARGIN_LEFT + plot_w, py);
        tick_label(label, sizeof label, v, a->y_step);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", MARGIN_LEFT - 8, py + 4,
                label);
    }
    for (double v = a->x_min; v <= a->x_axis_max + a->x_step * 1e-6; v += a->x_step) {
        double px = px_of(a, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", px, MARGIN_TOP,
                px, MARGIN_TOP + plot_h);
        tick_label(label, sizeof label, v, a->x_step);
        double half = TICK_CHAR_PX * (double)strlen(label) / 2;
        if (px + half > PLOT_WIDTH - 2) /* (the last label of a long one: it ends at the edge) */
            fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", PLOT_WIDTH - 2,
                    MARGIN_TOP + plot_h + 18, label);
        else
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px,
                    MARGIN_TOP + plot_h + 18, label);
    }
    fprintf(f, "</g>\n");
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#333\"/>\n",
            MARGIN_LEFT, MARGIN_TOP, plot_w, plot_h);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\">%s</text>\n",
            MARGIN_LEFT + plot_w / 2, PLOT_HEIGHT - 15, spec->x_is_time ? "time (s)" : "event number");
    fprintf(f, "<text x=\"20\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\" "
               "transform=\"rotate(-90 20 %.1f)\">memory (%s)</text>\n",
            MARGIN_TOP + plot_h / 2, MARGIN_TOP + plot_h / 2, units[a->unit]);
}

/* One series as a step line (3.), the `index`th colour. */
static void write_series(FILE *f, const plot_series_t *series, size_t index, const axes_t *a)
{
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s points=\"",
            palette[index % (sizeof palette / sizeof palette[0])], series->dashed ? " stroke-dasharray=\"6 4\"" : "");
    double previous_y = py_of(a, 0);
    fprintf(f, "%.1f,%.1f", px_of(a, a->x_min), previous_y);
    if (series->count <= MAX_POINTS) {
        for (size_t i = 0; i < series->count; i++) {
            double px = px_of(a, series->x[i]), py = py_of(a, series->y[i]);
            fprintf(f, " %.1f,%.1f %.1f,%.1f", px, previous_y, px, py);
            previous_y = py;
        }
    } else {
        size_t i = 0;
        double width = (a->x_axis_max - a->x_min) / BUCKETS;
        while (i < series->count) {
            long bucket = (long)((series->x[i] - a->x_min) / width);
            double bucket_end = a->x_min + (double)(bucket + 1) * width;
            uint64_t highest = series->y[i], last = series->y[i];
            double x_first = series->x[i];
            do { /* at least one point per bucket, so this always advances */
                if (series->y[i] > highest)
                    highest = series->y[i];
                last = series->y[i];
                i++;
            } while (i < series->count && series->x[i] < bucket_end);
            double px = px_of(a, x_first);
            fprintf(f, " %.1f,%.1f %.1f,%.1f %.1f,%.1f", px, previous_y, px, py_of(a, highest),
                    px_of(a, bucket_end > a->x_axis_max ? a->x_axis_max : bucket_end), py_of(a, last));
            previous_y = py_of(a, last);
        }
    }
    double last_x = series->x[series->count - 1];
    fprintf(f, " %.1f,%.1f\"/>\n", px_of(a, last_x), previous_y);
}

static void write_legend(FILE *f, const plot_spec_t *spec, const axes_t *a)
{
    double legend_x = MARGIN_LEFT + 12, legend_y = MARGIN_TOP + 12;
    size_t longest = 0;
    for (size_t s = 0; s < spec->series_count; s++)
        if (strlen(spec->series[s].name) > longest)
            longest = strlen(spec->series[s].name);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.0f\" height=\"%.0f\" fill=\"white\" "
               "fill-opacity=\"0.85\" stroke=\"#999\"/>\n",
            legend_x, legend_y, 60 + 7.0 * (double)longest, a->legend_height);
    for (size_t s = 0; s < spec->series_count; s++) {
        double y = legend_y + 18 + 20.0 * (double)s;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"%s/>\n",
                legend_x + 10, y - 4, legend_x + 40, y - 4, palette[s % (sizeof palette / sizeof palette[0])],
                spec->series[s].dashed ? " stroke-dasharray=\"6 4\"" : "");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">", legend_x + 48, y);
        xml_text(f, spec->series[s].name);
        fprintf(f, "</text>\n");
    }
}

int svg_plot_write(FILE *f, const plot_spec_t *spec)
{
    axes_t axes;
    compute_axes(spec, &axes);
    write_frame(f, spec, &axes);
    for (size_t s = 0; s < spec->series_count; s++)
        if (spec->series[s].count)
            write_series(f, &spec->series[s], s, &axes);
    write_legend(f, spec, &axes);
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}

int svg_plot_file(const char *path, const plot_spec_t *spec)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;
    if (!f) {
        fprintf(stderr, "poolshim: error: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = svg_plot_write(f, spec);
    if (f != stdout && fclose(f) != 0)
        rc = -1;
    if (rc != 0)
        fprintf(stderr, "poolshim: error: writing %s failed\n", path);
    return rc;
}
