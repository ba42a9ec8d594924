/* The markdown report and the SVG plot of `lowp compare` (report.h).
 *
 * The SVG is written by hand (no plotting library is available on the machines this runs on,
 * and the plot is simple): a frame, ticks at 1-2-5 steps with grid lines, one polyline with
 * point markers per recipe, and a legend. Non-finite losses break a line rather than bend it
 * off the chart.
 */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Colours that stay apart for the colour-blind (Okabe and Ito's palette). */
static const char *const COLORS[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                     "#E69F00", "#56B4E9", "#000000", "#F0E442"};
#define NCOLORS ((int) (sizeof COLORS / sizeof COLORS[0]))

#define SVG_W      820
#define SVG_H      480
#define PLOT_LEFT  72
#define PLOT_TOP   48
#define PLOT_RIGHT 600
#define PLOT_BOT   410

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A tick spacing of 1, 2 or 5 times a power of ten giving about `want` intervals. */
static double nice_step(double range, int want) {
    if (!(range > 0)) return 1.0;
    double raw = range / want;
    double p = pow(10.0, floor(log10(raw)));
    double m = raw / p;
    return (m < 1.5 ? 1.0 : m < 3.5 ? 2.0 : m < 7.5 ? 5.0 : 10.0) * p;
}

/* Tick labels with as many decimals as the spacing needs. */
static void fmt_tick(char *buf, size_t n, double v, double step) {
    int dec = step >= 1 ? 0 : (int) ceil(-log10(step) - 1e-9);
    if (dec > 6) dec = 6;
    snprintf(buf, n, "%.*f", dec, fabs(v) < step * 1e-9 ? 0.0 : v);
}

/* The plot's axes: x from 0 to x1, y from y0 to y1, ticks every xstep and ystep; pw x ph
 * pixels. */
typedef struct svg_axes {
    double x1, y0, y1, xstep, ystep, pw, ph;
} svg_axes;

static double px(const svg_axes *ax, double x) {
    return PLOT_LEFT + x / ax->x1 * ax->pw;
}
static double py(const svg_axes *ax, double y) {
    return PLOT_BOT - (y - ax->y0) / (ax->y1 - ax->y0) * ax->ph;
}

/* Axes that hold every step and every finite loss, on round ticks. */
static void svg_scale(const report_run *runs, int nruns, svg_axes *ax) {
    double xmax = 1, ymin = INFINITY, ymax = -INFINITY;
    for (int r = 0; r < nruns; r++)
        for (int i = 0; i < runs[r].points; i++) {
            if ((double) runs[r].steps[i] > xmax) xmax = (double) runs[r].steps[i];
            double y = runs[r].val_loss[i];
            if (isfinite(y)) {
                if (y < ymin) ymin = y;
                if (y > ymax) ymax = y;
            }
        }
    if (!(ymin <= ymax)) ymin = 0, ymax = 1;
    if (ymax - ymin < 1e-6) ymin -= 0.5, ymax += 0.5;
    ax->ystep = nice_step(ymax - ymin, 6);
    ax->y0 = floor(ymin / ax->ystep) * ax->ystep, ax->y1 = ceil(ymax / ax->ystep) * ax->ystep;
    ax->xstep = nice_step(xmax, 8);
    ax->x1 = ceil(xmax / ax->xstep) * ax->xstep;
    ax->pw = PLOT_RIGHT - PLOT_LEFT, ax->ph = PLOT_BOT - PLOT_TOP;
}

/* The header, the grid, the tick labels, the axis titles and the frame. */
static void svg_frame(FILE *f, const svg_axes *ax) {
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n"
            "<text x=\"%d\" y=\"28\" font-size=\"16\" text-anchor=\"middle\">"
            "Validation loss against step</text>\n",
            SVG_W, SVG_H, SVG_W, SVG_H, SVG_W, SVG_H, (PLOT_LEFT + PLOT_RIGHT) / 2);
    /* Grid and ticks. */
    fprintf(f, "<g stroke=\"#dddddd\" stroke-width=\"1\">\n");
    for (double y = ax->y0; y <= ax->y1 + ax->ystep * 1e-6; y += ax->ystep)
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", PLOT_LEFT, py(ax, y),
                PLOT_RIGHT, py(ax, y));
    for (double x = 0; x <= ax->x1 + ax->xstep * 1e-6; x += ax->xstep)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", px(ax, x), PLOT_TOP,
                px(ax, x), PLOT_BOT);
    fprintf(f, "</g>\n<g fill=\"#333333\">\n");
    char lab[32];
    for (double y = ax->y0; y <= ax->y1 + ax->ystep * 1e-6; y += ax->ystep) {
        fmt_tick(lab, sizeof lab, y, ax->ystep);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", PLOT_LEFT - 8,
                py(ax, y) + 4, lab);
    }
    for (double x = 0; x <= ax->x1 + ax->xstep * 1e-6; x += ax->xstep) {
        fmt_tick(lab, sizeof lab, x, ax->xstep);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", px(ax, x),
                PLOT_BOT + 18, lab);
    }
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n"
            "<text x=\"18\" y=\"%d\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 18 %d)\">validation loss (nats/char)</text>\n</g>\n",
            (PLOT_LEFT + PLOT_RIGHT) / 2, PLOT_BOT + 42, (PLOT_TOP + PLOT_BOT) / 2,
            (PLOT_TOP + PLOT_BOT) / 2);
    fprintf(
        f,
        "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333333\"/>\n",
        PLOT_LEFT, PLOT_TOP, PLOT_RIGHT - PLOT_LEFT, PLOT_BOT - PLOT_TOP);
}

/* One line per recipe, broken at non-finite points, with a dot at each point. */
static void svg_lines(FILE *f, const report_run *runs, int nruns, const svg_axes *ax) {
    for (int r = 0; r < nruns; r++) {
        const char *col = COLORS[r % NCOLORS];
        fprintf(f, "<g class=\"recipe\" data-recipe=\"");
        xml_text(f, runs[r].recipe);
        fprintf(f, "\">\n");
        int open = 0;
        for (int i = 0; i < runs[r].points; i++) {
            double y = runs[r].val_loss[i];
            if (!isfinite(y)) {
                if (open) fprintf(f, "\"/>\n");
                open = 0;
                continue;
            }
            if (!open)
                fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                        col);
            fprintf(f, "%s%.1f,%.1f", open ? " " : "", px(ax, (double) runs[r].steps[i]),
                    py(ax, y));
            open = 1;
        }
        if (open) fprintf(f, "\"/>\n");
        for (int i = 0; i < runs[r].points; i++) {
            double y = runs[r].val_loss[i];
            if (isfinite(y))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n",
                        px(ax, (double) runs[r].steps[i]), py(ax, y), col);
        }
        fprintf(f, "</g>\n");
    }
}

/* Legend: colour, recipe, last validation loss and tokens/s. */
static void svg_legend(FILE *f, const report_run *runs, int nruns) {
    const int lx = PLOT_RIGHT + 20;
    fprintf(f, "<g font-size=\"12\">\n<text x=\"%d\" y=\"%d\" font-weight=\"bold\">recipe</text>\n",
            lx, PLOT_TOP + 4);
    for (int r = 0; r < nruns; r++) {
        const int y = PLOT_TOP + 26 + 36 * r;
        fprintf(
            f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>\n",
            lx, y - 4, lx + 22, y - 4, COLORS[r % NCOLORS]);
        fprintf(f, "<text x=\"%d\" y=\"%d\">", lx + 30, y);
        xml_text(f, runs[r].recipe);
        float last = runs[r].points ? runs[r].val_loss[runs[r].points - 1] : NAN;
        fprintf(f, "</text>\n<text x=\"%d\" y=\"%d\" fill=\"#555555\" font-size=\"11\">", lx + 30,
                y + 15);
        if (isfinite(last)) fprintf(f, "val %.3f, ", (double) last);
        fprintf(f, "%.0f tok/s</text>\n", runs[r].tokens_per_s);
    }
    fprintf(f, "</g>\n");
}

void report_svg(FILE *f, const report_run *runs, int nruns) {
    svg_axes ax;
    svg_scale(runs, nruns, &ax);
    svg_frame(f, &ax);
    svg_lines(f, runs, nruns, &ax);
    svg_legend(f, runs, nruns);
    fprintf(f, "</svg>\n");
}

/* mkdir -p. */
static int make_dirs(const char *dir, char *err, size_t err_size) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int) sizeof path) {
        snprintf(err, err_size, "%s: path too long", dir);
        return -1;
    }
    for (char *p = path + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                snprintf(err, err_size, "cannot create directory %s: %s", path, strerror(errno));
                return -1;
            }
            *p = c;
            if (c == '\0') break;
        }
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(err, err_size, "%s is not a directory", dir);
        return -1;
    }
    return 0;
}

static void md_loss(FILE *f, float v) {
    if (isfinite(v))
        fprintf(f, " %.4f |", (double) v);
    else
        fprintf(f, " - |");
}

static float best_of(const report_run *r) {
    float b = INFINITY;
    for (int i = 0; i < r->points; i++)
        if (isfinite(r->val_loss[i]) && r->val_loss[i] < b) b = r->val_loss[i];
    return b;
}

static void write_md(FILE *f, const report_info *in, const report_run *runs, int nruns) {
    fprintf(f, "# lowp compare: validation loss and throughput per recipe\n\n");
    fprintf(f, "| setting | value |\n| --- | --- |\n");
    fprintf(f, "| model | %s |\n| data | %s |\n", in->config, in->data);
    fprintf(f, "| updates | %d (warm-up %d, lr %.3g -> %.3g cosine) |\n", (int) in->steps,
            (int) in->warmup, (double) in->lr, (double) in->min_lr);
    fprintf(f, "| tokens per update | %d x %d x %d (batch x sequence x accumulation) |\n",
            (int) in->batch, (int) in->seq_len, (int) in->accum);
    fprintf(f, "| seed | %llu |\n| threads | %d |\n", (unsigned long long) in->seed,
            (int) in->threads);
    if (in->command) fprintf(f, "| command | `%s` |\n", in->command);
    fprintf(f, "\n## Results\n\n");
    fprintf(f, "| recipe | final val loss | best val loss | final train loss | tokens/s | "
               "GFLOP/s | time (s) | skipped updates |\n");
    fprintf(f, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int r = 0; r < nruns; r++) {
        const report_run *x = &runs[r];
        fprintf(f, "| %s |", x->recipe);
        md_loss(f, x->points ? x->val_loss[x->points - 1] : NAN);
        md_loss(f, best_of(x));
        md_loss(f, x->final_train_loss);
        fprintf(f, " %.0f | %.2f | %.1f | %lld |\n", x->tokens_per_s, x->gflops, x->seconds,
                (long long) x->skipped);
    }
    fprintf(f, "\n![validation loss against step](val_loss.svg)\n\n");
    fprintf(f, "Validation loss is the mean cross-entropy (nats per character) over the same "
               "held-out batches at every evaluation (the last 10%% of the text). Tokens/s is the "
               "median over updates of tokens / update time (forward, backward and optimizer; "
               "evaluation excluded); GFLOP/s counts 6 x active parameters per token plus "
               "attention.\n\n");
    int any_wrapped = 0;
    for (int r = 0; r < nruns; r++) any_wrapped |= runs[r].wrapped != NULL;
    if (any_wrapped) {
        fprintf(f, "## What each recipe wrapped\n\n");
        for (int r = 0; r < nruns; r++)
            if (runs[r].wrapped) fprintf(f, "- **%s**: %s\n", runs[r].recipe, runs[r].wrapped);
        fprintf(f, "\n");
    }
    /* The curves as numbers: every step any run evaluated. */
    fprintf(f, "## Validation loss by step\n\n| step |");
    for (int r = 0; r < nruns; r++) fprintf(f, " %s |", runs[r].recipe);
    fprintf(f, "\n| ---: |");
    for (int r = 0; r < nruns; r++) fprintf(f, " ---: |");
    fprintf(f, "\n");
    int64_t last = -1;
    for (;;) {
        int64_t next = INT64_MAX;
        for (int r = 0; r < nruns; r++)
            for (int i = 0; i < runs[r].points; i++)
                if (runs[r].steps[i] > last && runs[r].steps[i] < next) next = runs[r].steps[i];
        if (next == INT64_MAX) break;
        fprintf(f, "| %lld |", (long long) next);
        for (int r = 0; r < nruns; r++) {
            float v = NAN;
            for (int i = 0; i < runs[r].points; i++)
                if (runs[r].steps[i] == next) v = runs[r].val_loss[i];
            md_loss(f, v);
        }
        fprintf(f, "\n");
        last = next;
    }
}

int report_write(const char *dir, const report_info *info, const report_run *runs, int nruns,
                 char *err, size_t err_size) {
    if (make_dirs(dir, err, err_size) != 0) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/val_loss.svg", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, err_size, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    report_svg(f, runs, nruns);
    if (fclose(f) != 0) {
        snprintf(err, err_size, "writing %s failed: %s", path, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/report.md", dir);
    f = fopen(path, "w");
    if (!f) {
        snprintf(err, err_size, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    write_md(f, info, runs, nruns);
    if (fclose(f) != 0) {
        snprintf(err, err_size, "writing %s failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
