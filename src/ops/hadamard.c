/* lowp_hadamard16 (lowp/hadamard.h): argument checks and the host transform, one 16-element
 * block at a time in the order docs/numerics.md 4b states (sign flips, four butterfly stages,
 * the multiply by 1/4), so the bits do not depend on the thread count or the compiler's
 * vectorization (no FMA can form: every operation is a single add, subtract or multiply). */
#include <stdlib.h>

#include "lowp/hadamard.h"
#include "lowp/threads.h"
#include "core/philox.h"
#include "ops/alias.h"
#include "ops/ops_internal.h"

lowp_status lowp_hadamard_cfg_init(lowp_hadamard_cfg *cfg) {
    LOWP_CHECK_PTR("lowp_hadamard_cfg_init", cfg);
    memset(cfg, 0, sizeof *cfg);
    return LOWP_OK;
}

/* One block: y[0..15] from x[0..15] under the sign word w. */
static void block16(const float *x, uint32_t w, float *y) {
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = (w >> i) & 1u ? -x[i] : x[i];
    for (int h = 1; h < 16; h <<= 1)
        for (int i = 0; i < 16; i++)
            if ((i & h) == 0) {
                const float a = t[i], b = t[i + h];
                t[i] = a + b;
                t[i + h] = a - b;
            }
    for (int i = 0; i < 16; i++) y[i] = t[i] * 0.25f;
}

/* Columns [c0, c1) of one row (already widened into buf): whole blocks from c0 transformed,
 * the rest copied. */
static void span16(const float *buf, int64_t c0, int64_t c1, uint32_t w, float *y) {
    int64_t c = c0;
    for (; c + 16 <= c1; c += 16) block16(buf + c, w, y + c);
    for (; c < c1; c++) y[c] = buf[c];
}

/* The block of 16 rows at x (row pitch C) transformed down each column into y: block16's
 * operations in its order, 64 columns at a time. */
static void block16_cols(const float *x, int64_t C, uint32_t w, float *y) {
    float t[16][64];
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        const int64_t n = C - c0 < 64 ? C - c0 : 64;
        for (int i = 0; i < 16; i++)
            for (int64_t c = 0; c < n; c++) {
                const float v = x[i * C + c0 + c];
                t[i][c] = (w >> i) & 1u ? -v : v;
            }
        for (int h = 1; h < 16; h <<= 1)
            for (int i = 0; i < 16; i++)
                if ((i & h) == 0)
                    for (int64_t c = 0; c < n; c++) {
                        const float a = t[i][c], b = t[i + h][c];
                        t[i][c] = a + b;
                        t[i + h][c] = a - b;
                    }
        for (int i = 0; i < 16; i++)
            for (int64_t c = 0; c < n; c++) y[i * C + c0 + c] = t[i][c] * 0.25f;
    }
}

/* Rows [r0, r1) of x [., C] along the token axis: whole blocks of 16 from r0, the rest copied. */
static void tokens16(const float *x, int64_t C, int64_t r0, int64_t r1, uint32_t w, int nt,
                     float *y) {
    const int64_t nb = (r1 - r0) / 16, tail = r0 + 16 * nb;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && nb * 16 * C >= 65536)
    for (int64_t b = 0; b < nb; b++) {
        const size_t o = (size_t) (r0 + 16 * b) * (size_t) C;
        block16_cols(x + o, C, w, y + o);
    }
    if (r1 > tail)
        memcpy(y + (size_t) tail * (size_t) C, x + (size_t) tail * (size_t) C,
               (size_t) ((r1 - tail) * C) * sizeof *y);
}

void lowp_hadamard16_tokens(const float *x, int64_t T, int64_t C, const int32_t *go, int32_t G,
                            uint64_t seed, uint64_t offset, int32_t threads, float *y) {
    if (T == 0 || C == 0) return;
    const uint32_t w = lowp_philox_word(seed, offset);
    const int nt = (int) lowp_thread_count(threads);
    int64_t start = 0;
    for (int32_t g = 0; go && g < G; g++) {
        tokens16(x, C, start, go[g], w, nt, y);
        start = go[g];
    }
    if (!go) {
        tokens16(x, C, 0, T, w, nt, y);
        return;
    }
    if (start < T)
        memcpy(y + (size_t) start * (size_t) C, x + (size_t) start * (size_t) C,
               (size_t) ((T - start) * C) * sizeof *y);
}

static void row16(const lowp_tensor *x, int64_t r, const lowp_hadamard_cfg *cfg, uint32_t w,
                  float *buf, float *y) {
    const int64_t C = x->cols;
    const float *src;
    if (x->format == LOWP_FORMAT_BF16) {
        const uint16_t *b = (const uint16_t *) x->data + (size_t) r * (size_t) C;
        for (int64_t c = 0; c < C; c++) buf[c] = lowp_u2f((uint32_t) b[c] << 16);
        src = buf;
    } else {
        src = (const float *) x->data + (size_t) r * (size_t) C;
    }
    if (!cfg->group_offs) {
        span16(src, 0, C, w, y);
        return;
    }
    int64_t start = 0;
    for (int32_t g = 0; g < cfg->groups; g++) {
        span16(src, start, cfg->group_offs[g], w, y);
        start = cfg->group_offs[g];
    }
    for (int64_t c = start; c < C; c++) y[c] = src[c];
}

static lowp_status check_args(const char *fn, const lowp_tensor *x, const lowp_tensor *y,
                              const lowp_hadamard_cfg *cfg) {
    LOWP_CHECK_PTR(fn, x);
    LOWP_CHECK_PTR(fn, y);
    if (x->format != LOWP_FORMAT_F32 && x->format != LOWP_FORMAT_BF16)
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "%s: x.format (%d) is not f32 or bf16", fn,
                         (int) x->format);
    if (y->format != LOWP_FORMAT_F32)
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "%s: y.format (%d) is not f32", fn, (int) y->format);
    if (x->rows < 0 || x->cols < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: x shape (%lld x %lld) is negative", fn,
                         (long long) x->rows, (long long) x->cols);
    if (y->rows != x->rows || y->cols != x->cols)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: y shape (%lld x %lld) != x shape (%lld x %lld)",
                         fn, (long long) y->rows, (long long) y->cols, (long long) x->rows,
                         (long long) x->cols);
    if (x->device.type != LOWP_DEVICE_CPU || y->device.type != LOWP_DEVICE_CPU)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: x.device (%d:%d) or y.device (%d:%d) is not the host", fn,
                         x->device.type, x->device.index, y->device.type, y->device.index);
    if (x->rows * x->cols > 0 && (!x->data || !y->data))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.data is NULL", fn, x->data ? "y" : "x");
    lowp_status st = lowp_op_check_threads_path(fn, cfg->threads, LOWP_KERNEL_PATH_AUTO);
    if (st != LOWP_OK) return st;
    if (cfg->group_offs &&
        (st = lowp_check_offs(fn, cfg->group_offs, cfg->groups, x->cols, "x.cols")) != LOWP_OK) {
        lowp_error_append("(cfg.group_offs, cfg.groups)");
        return st;
    }
    if (!cfg->group_offs && cfg->groups != 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.groups (%d) is set but cfg.group_offs is NULL", fn, cfg->groups);
    lowp_span out = lowp_tensor_span(y, "y.data"), in = lowp_tensor_span(x, "x.data");
    return lowp_check_no_alias(fn, &out, 1, &in, 1);
}

lowp_status lowp_hadamard16(const lowp_tensor *x, lowp_tensor *y, const lowp_hadamard_cfg *cfg) {
    const char *fn = "lowp_hadamard16";
    lowp_hadamard_cfg defaults;
    if (!cfg) {
        lowp_hadamard_cfg_init(&defaults);
        cfg = &defaults;
    }
    lowp_status st = check_args(fn, x, y, cfg);
    if (st != LOWP_OK) return st;
    const int64_t R = x->rows, C = x->cols;
    if (R == 0 || C == 0) return LOWP_OK;
    const uint32_t w = lowp_philox_word(cfg->seed, cfg->offset);
    const int bf16 = x->format == LOWP_FORMAT_BF16;
    const int nt = (int) lowp_thread_count(cfg->threads);
    int failed = 0;
#pragma omp parallel num_threads(nt) if (nt > 1 && R * C >= 65536) reduction(| : failed)
    {
        float *buf = bf16 ? malloc((size_t) C * sizeof *buf) : NULL;
        if (bf16 && !buf) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++)
            if (!bf16 || buf) row16(x, r, cfg, w, buf, (float *) y->data + (size_t) r * (size_t) C);
        free(buf);
    }
    if (failed)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: a row buffer of %lld floats", fn,
                         (long long) C);
    return LOWP_OK;
}
