/* Helpers shared by the GEMM tests (test_gemm.c, test_gemm_fast.c): an operand, its random
 * float input and its quantized copy. */
#ifndef LOWP_GEMM_TESTUTIL_H
#define LOWP_GEMM_TESTUTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowp/lowp.h"
#include "testutil.h"

typedef struct operand {
    lowp_qtensor q;
    float *src; /* the unquantized input [rows, cols] */
} operand;

/* An operand whose input is a random Gaussian [rows, cols], each row scaled by 2^(spread u)
 * with u uniform in [-1/2, 1/2) (so rows differ); nothing quantized yet. */
static inline operand operand_gauss(int64_t rows, int64_t cols, float spread) {
    operand o;
    memset(&o, 0, sizeof o);
    o.src = malloc(sizeof(float) * (size_t) (rows * cols + 1));
    for (int64_t r = 0; r < rows; r++) {
        float rs = powf(2.0f, spread * (float) (urand() - 0.5));
        for (int64_t c = 0; c < cols; c++) o.src[r * cols + c] = gauss() * rs;
    }
    o.q.rows = rows;
    o.q.cols = cols;
    return o;
}

/* Quantize (or, with LOWP_SCALING_NONE, cast) the input into o->q, whose data and scales are
 * allocated with data_slack and scale_slack bytes to spare (no scales buffer when that is 0
 * bytes). */
static inline void operand_quantize(operand *o, lowp_format fmt, lowp_scaling sc, size_t data_slack,
                                    size_t scale_slack) {
    const int64_t rows = o->q.rows, cols = o->q.cols;
    o->q.format = fmt;
    o->q.scaling = sc;
    o->q.device = LOWP_DEVICE_HOST;
    size_t db, sb;
    CHECK(lowp_qtensor_nbytes(&o->q, &db, &sb) == LOWP_OK);
    o->q.data = malloc(db + data_slack);
    o->q.scales = sb + scale_slack ? malloc(sb + scale_slack) : NULL;
    lowp_tensor x = {LOWP_FORMAT_F32, rows, cols, o->src, LOWP_DEVICE_HOST};
    if (sc == LOWP_SCALING_NONE) {
        lowp_tensor dst = {fmt, rows, cols, o->q.data, LOWP_DEVICE_HOST};
        CHECK(lowp_cast(&x, &dst, NULL) == LOWP_OK);
    } else {
        CHECKF(lowp_quantize(&x, &o->q, NULL, NULL) == LOWP_OK, "%s", lowp_last_error());
    }
}

static inline void operand_drop(operand *o) {
    free(o->src);
    free(o->q.data);
    free(o->q.scales);
}

#endif
