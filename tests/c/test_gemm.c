/* The reference GEMM (docs/numerics.md section 6) against a float64 product of the dequantized
 * operands, for every operand pair on awkward shapes; grouped GEMMs against loops of single
 * GEMMs; SQNR against the float64 product of the unquantized inputs (the peer thresholds of
 * docs/numerics.md section 8); and bad arguments. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowp/lowp.h"
#include "lowp/gemm.h"
#include "gemm_testutil.h"
#include "testutil.h"

/* Quantize a random Gaussian [rows, cols] (per-row scale variation so rows differ). */
static operand make(lowp_format fmt, lowp_scaling sc, int64_t rows, int64_t cols, float spread) {
    operand o = operand_gauss(rows, cols, spread);
    operand_quantize(&o, fmt, sc, 1, 0);
    return o;
}

/* Dequantized operand as doubles. */
static double *deq(const operand *o) {
    const int64_t n = o->q.rows * o->q.cols;
    float *f = malloc(sizeof(float) * (size_t) (n + 1));
    if (o->q.scaling == LOWP_SCALING_NONE) {
        lowp_tensor src = {o->q.format, o->q.rows, o->q.cols, o->q.data, LOWP_DEVICE_HOST};
        lowp_tensor dst = {LOWP_FORMAT_F32, o->q.rows, o->q.cols, f, LOWP_DEVICE_HOST};
        CHECK(lowp_cast(&src, &dst, NULL) == LOWP_OK);
    } else {
        lowp_tensor dst = {LOWP_FORMAT_F32, o->q.rows, o->q.cols, f, LOWP_DEVICE_HOST};
        CHECKF(lowp_dequantize(&o->q, &dst) == LOWP_OK, "%s", lowp_last_error());
    }
    double *d = malloc(sizeof(double) * (size_t) (n + 1));
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
    free(f);
    return d;
}

/* out[M,N] = A[M,K] . B[N,K]^T in float64. */
static void gemm64(const double *a, const double *b, int64_t M, int64_t N, int64_t K, double *out) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += a[m * K + k] * b[n * K + k];
            out[m * N + n] = s;
        }
}

static double rel_err(const float *c, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = c[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct pair_case {
    const char *name;
    lowp_format fa, fb;
    lowp_scaling sa, sb;
    double sqnr_min; /* against the unquantized product; 0 = not checked */
} pair_case;

static const pair_case PAIRS[] = {
    {"f32", LOWP_FORMAT_F32, LOWP_FORMAT_F32, LOWP_SCALING_NONE, LOWP_SCALING_NONE, 100},
    {"bf16", LOWP_FORMAT_BF16, LOWP_FORMAT_BF16, LOWP_SCALING_NONE, LOWP_SCALING_NONE, 40},
    {"tensor e4m3", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR, LOWP_SCALING_TENSOR,
     0},
    {"tensor e5m2 x e4m3", LOWP_FORMAT_E5M2, LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR,
     LOWP_SCALING_TENSOR, 0},
    {"row e4m3", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_ROW, LOWP_SCALING_ROW, 25},
    {"mx32 e4m3", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, LOWP_SCALING_MX32, 27},
    {"mx32 e5m2", LOWP_FORMAT_E5M2, LOWP_FORMAT_E5M2, LOWP_SCALING_MX32, LOWP_SCALING_MX32, 0},
    {"mx32 e2m1", LOWP_FORMAT_E2M1, LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, LOWP_SCALING_MX32, 0},
    {"block128 x 128x128", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128,
     LOWP_SCALING_BLOCK128X128, 25},
    {"block128 x block128", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128,
     LOWP_SCALING_BLOCK128, 0},
    {"mx32 x block32x32", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32,
     LOWP_SCALING_BLOCK32X32, 17},
};
#define NPAIRS ((int) (sizeof PAIRS / sizeof PAIRS[0]))

static lowp_gemm_cfg ref_cfg(void) {
    lowp_gemm_cfg cfg;
    lowp_gemm_cfg_init(&cfg);
    cfg.path = LOWP_KERNEL_PATH_REFERENCE;
    return cfg;
}

/* Reference path vs float64 product of the dequantized operands. */
static void test_reference_accuracy(void) {
    const int64_t sizes[] = {1, 17, 33, 127, 129, 300, 1000};
    const int ns = testutil_quick() ? 5 : 7;
    int cases = 0;
    for (int p = 0; p < NPAIRS; p++) {
        for (int t = 0; t < 6; t++) {
            int64_t M = sizes[(p + t) % ns], N = sizes[(p + 2 * t + 1) % ns],
                    K = sizes[(3 * p + t + 2) % ns];
            if (M * N * K > 40000000) K = 129; /* keep the float64 oracle quick */
            operand a = make(PAIRS[p].fa, PAIRS[p].sa, M, K, 6.0f);
            operand b = make(PAIRS[p].fb, PAIRS[p].sb, N, K, 6.0f);
            double *da = deq(&a), *db = deq(&b), *ref = malloc(sizeof(double) * (size_t) (M * N));
            gemm64(da, db, M, N, K, ref);
            float *c = malloc(sizeof(float) * (size_t) (M * N));
            lowp_tensor ct = {LOWP_FORMAT_F32, M, N, c, LOWP_DEVICE_HOST};
            lowp_gemm_cfg cfg = ref_cfg();
            CHECKF(lowp_gemm(&a.q, &b.q, &ct, &cfg) == LOWP_OK, "%s: %s", PAIRS[p].name,
                   lowp_last_error());
            double e = rel_err(c, ref, M * N);
            CHECKF(e <= 1e-6, "%s %lldx%lldx%lld: relative error %.3g", PAIRS[p].name,
                   (long long) M, (long long) N, (long long) K, e);
            /* Accumulate adds onto what C holds; BF16 output is the RNE of the F32 result. */
            float *c2 = malloc(sizeof(float) * (size_t) (M * N));
            for (int64_t i = 0; i < M * N; i++) c2[i] = 1.0f;
            lowp_tensor ct2 = {LOWP_FORMAT_F32, M, N, c2, LOWP_DEVICE_HOST};
            cfg.accumulate = 1;
            CHECK(lowp_gemm(&a.q, &b.q, &ct2, &cfg) == LOWP_OK);
            int acc_ok = 1;
            for (int64_t i = 0; i < M * N; i++) acc_ok &= c2[i] == 1.0f + c[i];
            CHECKF(acc_ok, "%s: accumulate", PAIRS[p].name);
            uint16_t *cb = malloc(sizeof(uint16_t) * (size_t) (M * N));
            lowp_tensor ctb = {LOWP_FORMAT_BF16, M, N, cb, LOWP_DEVICE_HOST};
            cfg.accumulate = 0;
            CHECK(lowp_gemm(&a.q, &b.q, &ctb, &cfg) == LOWP_OK);
            int bf_ok = 1;
            for (int64_t i = 0; i < M * N; i++) {
                uint32_t code;
                lowp_encode(LOWP_FORMAT_BF16, c[i], LOWP_OVERFLOW_NONSAT, &code);
                bf_ok &= cb[i] == code;
            }
            CHECKF(bf_ok, "%s: bf16 output", PAIRS[p].name);
            free(c2);
            free(cb);
            free(c);
            free(ref);
            free(da);
            free(db);
            operand_drop(&a);
            operand_drop(&b);
            cases++;
        }
    }
    printf("reference accuracy: %d cases\n", cases);
}

/* SQNR of the quantized product against the float64 product of the unquantized inputs,
 * Gaussian 256x512x384 (M x K x N). */
static void test_sqnr(void) {
    const int64_t M = 256, K = 512, N = 384;
    for (int p = 0; p < NPAIRS; p++) {
        operand a = make(PAIRS[p].fa, PAIRS[p].sa, M, K, 0.0f);
        operand b = make(PAIRS[p].fb, PAIRS[p].sb, N, K, 0.0f);
        double *sa = malloc(sizeof(double) * (size_t) (M * K)),
               *sb = malloc(sizeof(double) * (size_t) (N * K)),
               *ref = malloc(sizeof(double) * (size_t) (M * N));
        for (int64_t i = 0; i < M * K; i++) sa[i] = a.src[i];
        for (int64_t i = 0; i < N * K; i++) sb[i] = b.src[i];
        gemm64(sa, sb, M, N, K, ref);
        float *c = malloc(sizeof(float) * (size_t) (M * N));
        lowp_tensor ct = {LOWP_FORMAT_F32, M, N, c, LOWP_DEVICE_HOST};
        CHECK(lowp_gemm(&a.q, &b.q, &ct, NULL) == LOWP_OK);
        double sqnr = -20.0 * log10(rel_err(c, ref, M * N));
        printf("SQNR %-22s %6.2f dB\n", PAIRS[p].name, sqnr);
        CHECKF(sqnr >= PAIRS[p].sqnr_min, "%s: SQNR %.2f dB < %.0f", PAIRS[p].name, sqnr,
               PAIRS[p].sqnr_min);
        free(c);
        free(ref);
        free(sa);
        free(sb);
        operand_drop(&a);
        operand_drop(&b);
    }
}

/* Split-M grouped GEMM equals a single GEMM per group (empty groups, 1, 31, 33, 100 rows). */
static void test_grouped(void) {
    const int32_t sizes[] = {0, 1, 31, 33, 0, 100, 7};
    enum { G = 7 };
    int32_t offs[G];
    int64_t M = 0;
    for (int g = 0; g < G; g++) offs[g] = (int32_t) (M += sizes[g]);
    const int64_t Mtot = M + 5; /* rows past offs[G-1] are left alone */
    const int64_t K = 97, N = 45;
    for (int p = 0; p < NPAIRS; p++) {
        operand a = make(PAIRS[p].fa, PAIRS[p].sa, Mtot, K, 4.0f);
        operand b[G];
        for (int g = 0; g < G; g++) b[g] = make(PAIRS[p].fb, PAIRS[p].sb, N, K, 4.0f);
        lowp_qtensor bq[G];
        for (int g = 0; g < G; g++) bq[g] = b[g].q;
        float *c = malloc(sizeof(float) * (size_t) (Mtot * N));
        for (int64_t i = 0; i < Mtot * N; i++) c[i] = -7.0f;
        lowp_tensor ct = {LOWP_FORMAT_F32, Mtot, N, c, LOWP_DEVICE_HOST};
        lowp_gemm_cfg cfg = ref_cfg();
        CHECKF(lowp_grouped_gemm(&a.q, bq, offs, G, &ct, &cfg) == LOWP_OK, "%s: %s", PAIRS[p].name,
               lowp_last_error());
        /* Each group on its own: requantizing the group's rows gives the same codes for the
         * row-local kinds; TENSOR and BLOCK128x128/32x32 A scales are not row-local, so build
         * the per-group A by slicing the quantized rows instead. */
        int ok = 1;
        int64_t start = 0;
        for (int g = 0; g < G; g++) {
            int64_t rows = offs[g] - start;
            if (rows > 0) {
                float *cg = malloc(sizeof(float) * (size_t) (rows * N));
                lowp_tensor cgt = {LOWP_FORMAT_F32, rows, N, cg, LOWP_DEVICE_HOST};
                lowp_qtensor ag = a.q;
                size_t rb;
                lowp_row_nbytes(a.q.format, K, &rb);
                ag.rows = rows;
                ag.data = (uint8_t *) a.q.data + (size_t) start * rb;
                if (a.q.scaling != LOWP_SCALING_TENSOR && a.q.scaling != LOWP_SCALING_NONE) {
                    int64_t sr, scn;
                    int e8;
                    lowp_qtensor_scale_shape(&a.q, &sr, &scn, &e8);
                    ag.scales = (uint8_t *) a.q.scales + (size_t) (start * scn) * (e8 ? 1 : 4);
                }
                CHECK(lowp_gemm(&ag, &bq[g], &cgt, &cfg) == LOWP_OK);
                ok &= memcmp(cg, c + start * N, sizeof(float) * (size_t) (rows * N)) == 0;
                free(cg);
            }
            start = offs[g];
        }
        for (int64_t i = M * N; i < Mtot * N; i++) ok &= c[i] == -7.0f;
        CHECKF(ok, "%s: grouped != per-group GEMMs", PAIRS[p].name);
        free(c);
        operand_drop(&a);
        for (int g = 0; g < G; g++) operand_drop(&b[g]);
    }
}

/* Split-K wgrad equals a GEMM per group over that group's tokens. */
static void test_wgrad(void) {
    const int32_t sizes[] = {33, 0, 1, 100, 31};
    enum { G = 5 };
    int32_t offs[G];
    int64_t T = 0;
    for (int g = 0; g < G; g++) offs[g] = (int32_t) (T += sizes[g]);
    const int64_t N = 19, K = 23;
    const struct {
        lowp_format f;
        lowp_scaling s;
    } kinds[] = {{LOWP_FORMAT_E4M3, LOWP_SCALING_MX32},
                 {LOWP_FORMAT_E2M1, LOWP_SCALING_MX32},
                 {LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128},
                 {LOWP_FORMAT_E5M2, LOWP_SCALING_ROW},
                 {LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR}};
    for (int kk = 0; kk < 5; kk++) {
        /* dY [T, N] and X [T, K]; the operands are their columnwise copies. */
        float *dy = malloc(sizeof(float) * (size_t) (T * N)),
              *x = malloc(sizeof(float) * (size_t) (T * K));
        for (int64_t i = 0; i < T * N; i++) dy[i] = gauss();
        for (int64_t i = 0; i < T * K; i++) x[i] = gauss();
        lowp_tensor dyt = {LOWP_FORMAT_F32, T, N, dy, LOWP_DEVICE_HOST};
        lowp_tensor xt = {LOWP_FORMAT_F32, T, K, x, LOWP_DEVICE_HOST};
        int grouped = kinds[kk].s == LOWP_SCALING_MX32 || kinds[kk].s == LOWP_SCALING_BLOCK128;
        lowp_qtensor a = {kinds[kk].f,           kinds[kk].s,    N, T, NULL, NULL, LOWP_DEVICE_HOST,
                          grouped ? offs : NULL, grouped ? G : 0};
        lowp_qtensor b = {kinds[kk].f,           kinds[kk].s,    K, T, NULL, NULL, LOWP_DEVICE_HOST,
                          grouped ? offs : NULL, grouped ? G : 0};
        size_t db, sb;
        lowp_qtensor_nbytes(&a, &db, &sb);
        a.data = malloc(db), a.scales = malloc(sb);
        lowp_qtensor_nbytes(&b, &db, &sb);
        b.data = malloc(db), b.scales = malloc(sb);
        if (grouped) {
            CHECKF(lowp_quantize_grouped(&dyt, NULL, &a, NULL) == LOWP_OK, "%s", lowp_last_error());
            CHECK(lowp_quantize_grouped(&xt, NULL, &b, NULL) == LOWP_OK);
        } else {
            CHECK(lowp_quantize(&dyt, NULL, &a, NULL) == LOWP_OK);
            CHECK(lowp_quantize(&xt, NULL, &b, NULL) == LOWP_OK);
        }
        float *c = malloc(sizeof(float) * (size_t) (G * N * K));
        lowp_tensor ct = {LOWP_FORMAT_F32, G * N, K, c, LOWP_DEVICE_HOST};
        lowp_gemm_cfg cfg = ref_cfg();
        cfg.split = LOWP_GROUPED_SPLIT_K; /* the one grouped entry, split-K */
        CHECKF(lowp_grouped_gemm(&a, &b, offs, G, &ct, &cfg) == LOWP_OK, "%s", lowp_last_error());
        /* Oracle: float64 sum over each group's tokens of the dequantized copies. */
        float *da = malloc(sizeof(float) * (size_t) (N * T)),
              *dbv = malloc(sizeof(float) * (size_t) (K * T));
        lowp_tensor dat = {LOWP_FORMAT_F32, N, T, da, LOWP_DEVICE_HOST};
        lowp_tensor dbt = {LOWP_FORMAT_F32, K, T, dbv, LOWP_DEVICE_HOST};
        CHECK(lowp_dequantize(&a, &dat) == LOWP_OK);
        CHECK(lowp_dequantize(&b, &dbt) == LOWP_OK);
        double num = 0, den = 0;
        int64_t start = 0;
        for (int g = 0; g < G; g++) {
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) {
                    double s = 0;
                    for (int64_t t = start; t < offs[g]; t++)
                        s += (double) da[n * T + t] * dbv[k * T + t];
                    double d = c[(g * N + n) * K + k] - s;
                    num += d * d;
                    den += s * s;
                }
            start = offs[g];
        }
        CHECKF(sqrt(num / den) <= 1e-6, "wgrad kind %d: relative error %.3g", kk, sqrt(num / den));
        /* The empty group's dW is exactly zero. */
        int zero = 1;
        for (int64_t i = 0; i < N * K; i++) zero &= c[1 * N * K + i] == 0.0f;
        CHECK(zero);
        free(da), free(dbv), free(c), free(dy), free(x);
        free(a.data), free(a.scales), free(b.data), free(b.scales);
    }
}

static void test_errors(void) {
    operand a = make(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 4, 64, 0);
    operand b = make(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 3, 64, 0);
    operand bt = make(LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR, 3, 64, 0);
    operand bk = make(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 3, 96, 0);
    float c[12] = {0};
    lowp_tensor ct = {LOWP_FORMAT_F32, 4, 3, c, LOWP_DEVICE_HOST};
    CHECK(lowp_gemm(&a.q, &b.q, &ct, NULL) == LOWP_OK);
    CHECK(lowp_gemm(&a.q, &bt.q, &ct, NULL) == LOWP_ERR_UNSUPPORTED);
    CHECK(strstr(lowp_last_error(), "mx32") && strstr(lowp_last_error(), "tensor"));
    CHECK(lowp_gemm(&a.q, &bk.q, &ct, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "a.cols (64) != b.cols (96)") != NULL);
    lowp_tensor bad = {LOWP_FORMAT_F32, 3, 4, c, LOWP_DEVICE_HOST};
    CHECK(lowp_gemm(&a.q, &b.q, &bad, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "c shape") != NULL);
    lowp_qtensor nod = a.q;
    nod.data = NULL;
    CHECK(lowp_gemm(&nod, &b.q, &ct, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "a.data is NULL") != NULL);
    CHECK(lowp_gemm(NULL, &b.q, &ct, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_gemm(&a.q, NULL, &ct, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_gemm(&a.q, &b.q, NULL, NULL) == LOWP_ERR_INVALID_ARG);
    int32_t offs[2] = {3, 2};
    lowp_qtensor bb[2] = {b.q, b.q};
    CHECK(lowp_grouped_gemm(&a.q, bb, offs, 2, &ct, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "offs[1] (2)") != NULL);
    offs[1] = 5;
    CHECK(lowp_grouped_gemm(&a.q, bb, offs, 2, &ct, NULL) == LOWP_ERR_INVALID_ARG);
    offs[1] = 4;
    CHECK(lowp_grouped_gemm(&a.q, bb, offs, 2, &ct, NULL) == LOWP_OK);
    CHECK(lowp_grouped_gemm(&a.q, bb, offs, 0, &ct, NULL) == LOWP_ERR_INVALID_ARG);
    /* A block-scaled wgrad operand that was not quantized per group is refused. */
    lowp_tensor wct = {LOWP_FORMAT_F32, 2 * 4, 3, c, LOWP_DEVICE_HOST};
    int32_t toffs[2] = {10, 64};
    CHECK(lowp_grouped_gemm_wgrad(&a.q, &b.q, toffs, 2, &wct, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "lowp_quantize_grouped") != NULL);
    lowp_gemm_cfg cfg;
    lowp_gemm_cfg_init(&cfg);
    cfg.path = (lowp_kernel_path) 9;
    CHECK(lowp_gemm(&a.q, &b.q, &ct, &cfg) == LOWP_ERR_INVALID_ARG);
    /* the layout and split fields: named when out of range; split-K is the grouped entry's */
    lowp_gemm_cfg_init(&cfg);
    CHECK(cfg.b_layout == LOWP_LAYOUT_NK && cfg.split == LOWP_GROUPED_SPLIT_M);
    cfg.b_layout = 2;
    CHECK_FAIL(lowp_gemm(&a.q, &b.q, &ct, &cfg), LOWP_ERR_INVALID_ARG, "cfg.b_layout (2)");
    CHECK_FAIL(lowp_grouped_gemm(&a.q, bb, offs, 2, &ct, &cfg), LOWP_ERR_INVALID_ARG,
               "lowp_grouped_gemm: cfg.b_layout (2) is not");
    cfg.b_layout = LOWP_LAYOUT_NK;
    cfg.split = -1;
    CHECK_FAIL(lowp_grouped_gemm(&a.q, bb, offs, 2, &ct, &cfg), LOWP_ERR_INVALID_ARG,
               "cfg.split (-1)");
    cfg.split = LOWP_GROUPED_SPLIT_K;
    CHECK_FAIL(lowp_gemm(&a.q, &b.q, &ct, &cfg), LOWP_ERR_INVALID_ARG,
               "lowp_gemm: cfg.split (1) is set; split-K runs in lowp_grouped_gemm");
    /* split-K through the one entry: the same checks as the twin above */
    CHECK_FAIL(lowp_grouped_gemm(&a.q, &b.q, toffs, 2, &wct, &cfg), LOWP_ERR_INVALID_ARG,
               "lowp_quantize_grouped");
    operand_drop(&a), operand_drop(&b), operand_drop(&bt), operand_drop(&bk);
}

/* lowp_gemm_kn and lowp_grouped_gemm_kn through the ops layer (default path and threads): the
 * bits of lowp_gemm and lowp_grouped_gemm on the library's columnwise copies of the same
 * inputs, and the errors that name what is wrong. */
static lowp_qtensor col_copy(const operand *o) {
    lowp_qtensor col = o->q;
    col.rows = o->q.cols;
    col.cols = o->q.rows;
    size_t db, sb;
    CHECK(lowp_qtensor_nbytes(&col, &db, &sb) == LOWP_OK);
    col.data = malloc(db);
    col.scales = malloc(sb);
    lowp_tensor x = {LOWP_FORMAT_F32, o->q.rows, o->q.cols, o->src, LOWP_DEVICE_HOST};
    CHECKF(lowp_quantize(&x, NULL, &col, NULL) == LOWP_OK, "%s", lowp_last_error());
    return col;
}

static void test_kn(void) {
    const struct {
        lowp_format fa;
        lowp_scaling sa, sb;
    } kinds[] = {{LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128, LOWP_SCALING_BLOCK128X128},
                 {LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, LOWP_SCALING_BLOCK32X32},
                 {LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR, LOWP_SCALING_TENSOR}};
    enum { G = 3 };
    const int32_t offs[G] = {40, 40, 300};
    const int64_t M = 300, K = 260, N = 150;
    for (int ki = 0; ki < 3; ki++) {
        operand a = make(kinds[ki].fa, kinds[ki].sa, M, K, 4.0f);
        operand b[G];
        lowp_qtensor bs[G], bc[G];
        for (int g = 0; g < G; g++) {
            b[g] = make(LOWP_FORMAT_E4M3, kinds[ki].sb, K, N, 4.0f); /* stored [K, N] */
            bs[g] = b[g].q;
            bc[g] = col_copy(&b[g]);
        }
        float *c1 = malloc(sizeof(float) * (size_t) (M * N)),
              *c2 = malloc(sizeof(float) * (size_t) (M * N));
        lowp_tensor t1 = {LOWP_FORMAT_F32, M, N, c1, LOWP_DEVICE_HOST}, t2 = t1;
        t2.data = c2;
        const char *name = lowp_scaling_name(kinds[ki].sb);
        CHECK_OK(lowp_gemm(&a.q, &bc[0], &t1, NULL));
        CHECK_OK(lowp_gemm_kn(&a.q, &bs[0], &t2, NULL));
        CHECKF(memcmp(c1, c2, sizeof(float) * (size_t) (M * N)) == 0,
               "lowp_gemm_kn %s != lowp_gemm on the columnwise copy", name);
        CHECK_OK(lowp_grouped_gemm(&a.q, bc, offs, G, &t1, NULL));
        CHECK_OK(lowp_grouped_gemm_kn(&a.q, bs, offs, G, &t2, NULL));
        CHECKF(memcmp(c1, c2, sizeof(float) * (size_t) (M * N)) == 0,
               "lowp_grouped_gemm_kn %s != lowp_grouped_gemm on the columnwise copies", name);
        /* the same through the layout flag: b_layout KN on the stored copies */
        lowp_gemm_cfg kn;
        lowp_gemm_cfg_init(&kn);
        kn.b_layout = LOWP_LAYOUT_KN;
        memset(c2, 0xff, sizeof(float) * (size_t) (M * N));
        CHECK_OK(lowp_grouped_gemm(&a.q, bs, offs, G, &t2, &kn));
        CHECKF(memcmp(c1, c2, sizeof(float) * (size_t) (M * N)) == 0,
               "lowp_grouped_gemm b_layout KN %s != NK on the columnwise copies", name);
        CHECK_OK(lowp_gemm(&a.q, &bc[0], &t1, NULL));
        memset(c2, 0xff, sizeof(float) * (size_t) (M * N));
        CHECK_OK(lowp_gemm(&a.q, &bs[0], &t2, &kn));
        CHECKF(memcmp(c1, c2, sizeof(float) * (size_t) (M * N)) == 0,
               "lowp_gemm b_layout KN %s != NK on the columnwise copy", name);
        if (ki == 0) { /* errors, on these operands */
            lowp_tensor bad = {LOWP_FORMAT_F32, M, K, c1, LOWP_DEVICE_HOST};
            CHECK_FAIL(lowp_gemm_kn(&a.q, &bs[0], &bad, NULL), LOWP_ERR_INVALID_ARG, "c shape");
            /* the [N, K] copy given as [K, N]: K does not match */
            CHECK_FAIL(lowp_gemm_kn(&a.q, &bc[0], &t2, NULL), LOWP_ERR_INVALID_ARG,
                       "a.cols (260) != b.rows (150)");
            lowp_qtensor other[G] = {bs[0], bc[1], bs[2]};
            CHECK_FAIL(lowp_grouped_gemm_kn(&a.q, other, offs, G, &t2, NULL), LOWP_ERR_INVALID_ARG,
                       "b[1] shape (150 x 260)");
            operand brow = make(LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128, K, N, 4.0f);
            CHECK_FAIL(lowp_gemm_kn(&a.q, &brow.q, &t2, NULL), LOWP_ERR_UNSUPPORTED,
                       "b.scaling (block128) runs along one axis");
            lowp_qtensor rows3[G] = {bs[0], bs[1], brow.q};
            CHECK_FAIL(lowp_grouped_gemm_kn(&a.q, rows3, offs, G, &t2, NULL), LOWP_ERR_UNSUPPORTED,
                       "b[2].scaling (block128)");
            operand_drop(&brow);
            /* the weight gradient's kn form refuses X's one-axis quantizations */
            operand dyt = make(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, N, M, 4.0f);
            operand xq = make(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, M, K, 4.0f);
            float *cw = malloc(sizeof(float) * (size_t) (G * N * K));
            lowp_tensor wt = {LOWP_FORMAT_F32, G * N, K, cw, LOWP_DEVICE_HOST};
            CHECK_FAIL(lowp_grouped_gemm_wgrad_kn(&dyt.q, &xq.q, offs, G, &wt, NULL),
                       LOWP_ERR_UNSUPPORTED, "b.scaling (mx32) is not none or tensor");
            free(cw);
            operand_drop(&dyt);
            operand_drop(&xq);
        }
        free(c1);
        free(c2);
        operand_drop(&a);
        for (int g = 0; g < G; g++) {
            operand_drop(&b[g]);
            free(bc[g].data);
            free(bc[g].scales);
        }
    }
}

int main(void) {
    tu_seed(0x9E3779B97F4A7C15ull);
    test_reference_accuracy();
    test_sqnr();
    test_grouped();
    test_wgrad();
    test_errors();
    test_kn();
    return testutil_finish();
}
