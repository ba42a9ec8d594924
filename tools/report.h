/* The report of `lowp compare`: a markdown file with the settings and a table per recipe
 * (validation loss, tokens/s, GFLOP/s), and a hand-written SVG plot of validation loss
 * against step, one line per recipe.
 *
 *   report_run runs[2] = {...};            // one per recipe, filled while training
 *   report_info info = {...};              // what was trained, on what
 *   char err[512];
 *   if (report_write("out/compare", &info, runs, 2, err, sizeof err) != 0)
 *       fprintf(stderr, "lowp compare: %s\n", err);
 */
#ifndef LOWP_TOOLS_REPORT_H
#define LOWP_TOOLS_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct report_run {
    const char *recipe;
    int32_t points;         /* evaluations */
    const int64_t *steps;   /* [points] the step of each evaluation */
    const float *val_loss;  /* [points] */
    float final_train_loss; /* the last update's loss */
    double tokens_per_s;    /* median over updates */
    double gflops;          /* achieved: FLOPs per token x tokens/s / 1e9 */
    double seconds;         /* wall time of the run, evaluations included */
    int64_t skipped;        /* updates skipped for a non-finite gradient */
    const char *wrapped;    /* e.g. "26 of 31 parameters wrapped (mxfp8 x 20, block_fp8 x 6)" */
} report_run;

typedef struct report_info {
    const char *config; /* "tiny (dim 64, 2 layers, ...)" */
    const char *data;   /* "built-in (26291 bytes, vocab 60)" */
    int32_t steps, batch, seq_len, accum, threads;
    float lr, min_lr;
    int32_t warmup;
    uint64_t seed;
    const char *command; /* the command line, for reproducing */
} report_info;

/* Creates `dir` (and its parents) and writes dir/report.md and dir/val_loss.svg. Returns 0, or
 * -1 with one line in err. */
int report_write(const char *dir, const report_info *info, const report_run *runs, int nruns,
                 char *err, size_t err_size);

/* The SVG alone, to a stream. */
void report_svg(FILE *f, const report_run *runs, int nruns);

#endif
