/* lowp_quantize: the AVX-512 kernels (or, on CPUs without AVX-512 and under
 * LOWP_CPU_DISABLE=avx512, the AVX2 kernel) against the scalar reference, bit for bit, through
 * the public API (cfg.path = LOWP_KERNEL_PATH_REFERENCE vs LOWP_KERNEL_PATH_AVX512 or _AVX2; the
 * AVX2 kernel has no E2M1, whose cases it skips).
 *
 * Every scaling kind, element format, scale mode (E8M0 kinds) or pow2/eps setting (binary32
 * kinds), orientation (rowwise, columnwise, both from one call) and input format (F32, BF16)
 * is run on awkward shapes (1x1 up to 256x4096: tails in both dimensions, odd E2M1 rows) at
 * 1 and 2 threads. Inputs mix block magnitudes from binary32 subnormals to 2^124 (scale codes
 * clamped at both ends), zero blocks and tiles with both signs of zero, subnormals, values
 * just above fmax and at the rounding ties near it, FLT_MAX, and NaN/Inf in some regions only,
 * so that poisoned and clean blocks sit side by side. Output buffers are pre-filled with
 * different garbage for each path, so a byte either path forgets to write (an E2M1 pad
 * nibble, a tail) shows up. A separate sweep checks the vectorized E8M0 scale rule on amax bit
 * patterns across every exponent. LOWP_TEST_QUICK=1 keeps only the small shapes.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "lowp/lowp.h"
#include "cpu/cpu.h"
#include "lowp/quant.h"
#include "testutil.h"

static int g_quick;
static int g_runs;                                        /* quantize calls compared */
static lowp_kernel_path g_path = LOWP_KERNEL_PATH_AVX512; /* the fast kernel under test */
static const char *g_path_name = "avx512";

/* ---- inputs ---- */

/* A random value whose magnitude is around 2^e. */
static float around(int e) {
    int ee = e + (int) rnd_below(7) - 3;
    if (ee > 124) ee = 124;
    float m = 1.0f + (float) rnd_below(1u << 23) * 0x1p-23f;
    float v = ldexpf(m, ee);
    return rnd_below(2) ? -v : v;
}

/* Input [R, C] as binary32. `specials` adds NaN/Inf in the 128x128 regions whose
 * (row tile + col tile) % 3 == 0, so clean blocks remain next to poisoned ones. */
static void gen(float *x, int64_t R, int64_t C, int specials) {
    static const float near_max[] = {448.0f,   449.0f,   464.0f,   465.0f, 480.0f, 57344.0f,
                                     61440.0f, 61441.0f, 65536.0f, 6.0f,   6.5f,   7.0f};
    const int64_t nbc = (C + 31) / 32;
    for (int64_t r = 0; r < R; r++) {
        for (int64_t b = 0; b < nbc; b++) {
            /* block magnitude: mostly moderate, sometimes subnormal-tiny or huge */
            uint32_t pick = rnd_below(20);
            int e = pick < 16   ? (int) rnd_below(41) - 20
                    : pick < 18 ? -149 + (int) rnd_below(30)
                                : 100 + (int) rnd_below(25);
            int zero_block = (r % 5 == 2 && b % 3 == 1) || ((r / 32) % 4 == 1 && b % 4 == 2);
            for (int64_t c = 32 * b; c < C && c < 32 * b + 32; c++) {
                float v;
                uint32_t s = rnd_below(1000);
                if (zero_block)
                    v = rnd_below(2) ? 0.0f : -0.0f;
                else if (s < 10)
                    v = rnd_below(2) ? 0.0f : -0.0f;
                else if (s < 20)
                    v = u2f((rnd_below(2) << 31) | (1u + rnd_below(0x7FFFFF)));
                else if (s < 26)
                    v = near_max[rnd_below(sizeof near_max / sizeof near_max[0])];
                else if (s < 28)
                    v = rnd_below(2) ? 3.0e38f : -3.4028235e38f;
                else
                    v = around(e);
                if (specials && ((r / 128 + c / 128) % 3 == 0) && rnd_below(300) == 0) {
                    uint32_t k = rnd_below(4);
                    v = k == 0   ? INFINITY
                        : k == 1 ? -INFINITY
                        : k == 2 ? u2f(0x7FC00000u | rnd_below(0x400000))
                                 : u2f(0xFFC00001u);
                }
                x[r * C + c] = v;
            }
        }
    }
}

/* ---- one comparison ---- */

typedef struct outs {
    uint8_t *rd, *rs, *cd, *cs;
    void *mem[4];
    size_t rdb, rsb, cdb, csb;
} outs;

/* `mis` bytes past a 64-byte boundary: 0 lets large outputs take the non-temporal stores,
 * 1 forces the kernels' unaligned stores. */
static uint8_t *alloc_at(void **mem, size_t n, int mis) {
    *mem = aligned_alloc(64, (n + 64 + 63) / 64 * 64);
    return (uint8_t *) *mem + mis;
}

static void outs_alloc(outs *o, const lowp_qtensor *row, const lowp_qtensor *col, int mis) {
    memset(o, 0, sizeof *o);
    if (row) lowp_qtensor_nbytes(row, &o->rdb, &o->rsb);
    if (col) lowp_qtensor_nbytes(col, &o->cdb, &o->csb);
    o->rd = alloc_at(&o->mem[0], o->rdb, mis);
    o->rs = alloc_at(&o->mem[1], o->rsb, 0);
    o->cd = alloc_at(&o->mem[2], o->cdb, mis);
    o->cs = alloc_at(&o->mem[3], o->csb, 0);
}
static void outs_free(outs *o) {
    for (int i = 0; i < 4; i++) free(o->mem[i]);
}

typedef struct qcase {
    lowp_scaling scaling;
    lowp_format ef;
    lowp_scale_mode mode;
    int pow2;
    float eps;
    float scale; /* TENSOR: > 0 means cfg.scale */
    int orient;  /* 1 row, 2 col, 3 both */
} qcase;

static lowp_status run(const lowp_tensor *x, const qcase *q, lowp_kernel_path path, int threads,
                       outs *o, int fill, float *amax) {
    lowp_qtensor row = {q->ef, q->scaling,       x->rows, x->cols, o->rd,
                        o->rs, LOWP_DEVICE_HOST, NULL,    0};
    lowp_qtensor col = {q->ef, q->scaling,       x->cols, x->rows, o->cd,
                        o->cs, LOWP_DEVICE_HOST, NULL,    0};
    memset(o->rd, fill, o->rdb);
    memset(o->rs, fill, o->rsb);
    memset(o->cd, fill, o->cdb);
    memset(o->cs, fill, o->csb);
    lowp_quant_cfg cfg;
    lowp_quant_cfg_init(&cfg);
    cfg.scale_mode = q->mode;
    cfg.pow2_scales = q->pow2;
    cfg.eps = q->eps;
    cfg.scale = q->scale > 0 ? &q->scale : NULL;
    cfg.amax_out = q->scaling == LOWP_SCALING_TENSOR ? amax : NULL;
    cfg.threads = threads;
    cfg.path = path;
    return lowp_quantize(x, q->orient & 1 ? &row : NULL, q->orient & 2 ? &col : NULL, &cfg);
}

static const char *fname(lowp_format f) {
    const lowp_format_traits *t = NULL;
    lowp_format_get(f, &t);
    return t ? t->name : "?";
}

/* First differing byte, or -1. */
static long first_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return (long) i;
    return -1;
}

static int g_fail_reports;
static int g_mis; /* output misalignment for check_case */

static void compare(const char *what, const qcase *q, const lowp_tensor *x, int threads,
                    const uint8_t *ref, const uint8_t *fast, size_t n) {
    long d = first_diff(ref, fast, n);
    CHECKF(d < 0,
           "%s differs at byte %ld (ref 0x%02X, %s 0x%02X): %s %s mode %d pow2 %d eps %g "
           "scale %g orient %d, x %s %lldx%lld, threads %d, misaligned %d",
           what, d, d >= 0 ? ref[d] : 0, g_path_name, d >= 0 ? fast[d] : 0,
           lowp_scaling_name(q->scaling), fname(q->ef), (int) q->mode, q->pow2, (double) q->eps,
           (double) q->scale, q->orient, fname(x->format), (long long) x->rows, (long long) x->cols,
           threads, g_mis);
    if (d >= 0 && ++g_fail_reports > 30) {
        fprintf(stderr, "too many failures, stopping\n");
        exit(testutil_finish());
    }
}

static void check_case(const lowp_tensor *x, const qcase *q) {
    if (g_path == LOWP_KERNEL_PATH_AVX2 && q->ef == LOWP_FORMAT_E2M1) return; /* no such kernel */
    lowp_qtensor row = {q->ef, q->scaling, x->rows, x->cols, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    lowp_qtensor col = {q->ef, q->scaling, x->cols, x->rows, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    outs ro, fo;
    outs_alloc(&ro, &row, &col, 0);
    outs_alloc(&fo, &row, &col, g_mis);
    float amax_ref = -1.0f;
    lowp_status st = run(x, q, LOWP_KERNEL_PATH_REFERENCE, 2, &ro, 0xA5, &amax_ref);
    CHECKF(st == LOWP_OK, "reference: %s", lowp_last_error());
    for (int threads = 1; threads <= 2; threads++) {
        float amax_fast = -2.0f;
        st = run(x, q, g_path, threads, &fo, 0x5A, &amax_fast);
        CHECKF(st == LOWP_OK, "%s: %s", g_path_name, lowp_last_error());
        g_runs++;
        if (q->orient & 1) {
            compare("row codes", q, x, threads, ro.rd, fo.rd, ro.rdb);
            compare("row scales", q, x, threads, ro.rs, fo.rs, ro.rsb);
        }
        if (q->orient & 2) {
            compare("col codes", q, x, threads, ro.cd, fo.cd, ro.cdb);
            compare("col scales", q, x, threads, ro.cs, fo.cs, ro.csb);
        }
        if (q->scaling == LOWP_SCALING_TENSOR)
            CHECKF(f2u(amax_ref) == f2u(amax_fast) ||
                       (amax_ref != amax_ref && amax_fast != amax_fast),
                   "tensor amax %g vs %g", (double) amax_ref, (double) amax_fast);
    }
    outs_free(&ro);
    outs_free(&fo);
}

/* Every kind, format and setting on one input. `light` keeps one setting per kind. */
static void check_input(const lowp_tensor *x, int light) {
    static const lowp_scale_mode modes[] = {LOWP_SCALE_MODE_RCEIL, LOWP_SCALE_MODE_FLOOR,
                                            LOWP_SCALE_MODE_CEIL, LOWP_SCALE_MODE_EVEN};
    static const struct {
        int pow2;
        float eps;
    } fp[] = {{-1, 0.0f}, {1, 0.0f}, {0, 1e-3f}};
    for (int s = LOWP_SCALING_TENSOR; s <= LOWP_SCALING_BLOCK32X32; s++) {
        const lowp_scaling sc = (lowp_scaling) s;
        const int e8 = sc == LOWP_SCALING_MX32 || sc == LOWP_SCALING_BLOCK32X32;
        const int nf = sc == LOWP_SCALING_MX32 ? 3 : 2;
        for (int fi = 0; fi < nf; fi++) {
            const lowp_format ef = fi == 0   ? LOWP_FORMAT_E4M3
                                   : fi == 1 ? LOWP_FORMAT_E5M2
                                             : LOWP_FORMAT_E2M1;
            const int nset = light ? 1 : e8 ? 4 : sc == LOWP_SCALING_TENSOR ? 5 : 3;
            for (int k = 0; k < nset; k++) {
                for (int orient = 1; orient <= 3; orient++) {
                    qcase q = {sc, ef, LOWP_SCALE_MODE_DEFAULT, -1, 0.0f, 0.0f, orient};
                    if (e8) {
                        q.mode = light ? LOWP_SCALE_MODE_DEFAULT : modes[k];
                    } else if (k < 3) {
                        q.pow2 = fp[k].pow2;
                        q.eps = fp[k].eps;
                    } else {
                        q.scale = k == 3 ? 1.0f : 3.7f; /* delayed scaling: a given scale */
                    }
                    check_case(x, &q);
                }
            }
        }
    }
}

/* Binary32 input f as the tensor of format xf (BF16: the top half of each pattern). */
static void *as_format(const float *f, size_t n, lowp_format xf) {
    if (xf == LOWP_FORMAT_F32) {
        float *d = malloc(n * 4 + 4);
        memcpy(d, f, n * 4);
        return d;
    }
    uint16_t *d = malloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) d[i] = (uint16_t) (f2u(f[i]) >> 16);
    return d;
}

static void test_shapes(void) {
    /* 33x8300: rows wider than the tile kinds' whole-row chunks (TILES_MAX_CW) */
    static const int64_t shapes[][2] = {{1, 1},     {3, 31},      {33, 65},    {129, 257},
                                        {128, 128}, {1000, 1030}, {256, 4096}, {33, 8300}};
    const int nshapes = (int) (sizeof shapes / sizeof shapes[0]);
    for (int si = 0; si < nshapes; si++) {
        const int64_t R = shapes[si][0], C = shapes[si][1];
        const int big = R * C > 100000;
        if (g_quick && big) continue;
        float *f = malloc((size_t) (R * C) * sizeof *f);
        for (int variant = big ? 1 : 0; variant <= 1; variant++) {
            gen(f, R, C, variant);
            for (int xi = 0; xi < 2; xi++) {
                const lowp_format xf = xi ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
                void *data = as_format(f, (size_t) (R * C), xf);
                lowp_tensor x = {xf, R, C, data, LOWP_DEVICE_HOST};
                check_input(&x, big);
                free(data);
            }
        }
        free(f);
        printf("shape %lldx%lld done (%d comparisons so far)\n", (long long) R, (long long) C,
               g_runs);
        fflush(stdout);
    }
}

/* The vectorized E8M0 rule: one 1x32 block per amax pattern (the block's other elements are
 * smaller), swept over every exponent with the mantissas where the modes change their answer,
 * plus random patterns; MX32 rowwise and BLOCK32X32 (its tiles reduce through another path). */
static void test_e8m0_sweep(void) {
    static const uint32_t mant[] = {0x000000, 0x000001, 0x0FFFFF, 0x100000, 0x1FFFFF, 0x200000,
                                    0x200001, 0x3FFFFF, 0x400000, 0x400001, 0x5FFFFF, 0x600000,
                                    0x6FFFFF, 0x700000, 0x7FFFFE, 0x7FFFFF};
    const int nm = (int) (sizeof mant / sizeof mant[0]);
    const int64_t nrand = g_quick ? 2048 : 16384;
    const int64_t R = 255 * nm + nrand + 3, C = 32;
    float *f = malloc((size_t) (R * C) * sizeof *f);
    int64_t r = 0;
    for (uint32_t e = 0; e < 255; e++)
        for (int k = 0; k < nm; k++, r++) f[r * C] = u2f(e << 23 | mant[k]);
    for (int64_t i = 0; i < nrand; i++, r++)
        f[r * C] = u2f((uint32_t) (rnd64() >> 33) % 0x7F800000u);
    f[r++ * C] = INFINITY;
    f[r++ * C] = NAN;
    f[r++ * C] = 0.0f;
    for (r = 0; r < R; r++) {
        const float a = f[r * C];
        if (rnd_below(2)) f[r * C] = -a;
        for (int64_t c = 1; c < C; c++) /* smaller magnitudes, never above |a| */
            f[r * C + c] = isfinite(a) ? a * ((float) rnd_below(1u << 20) * 0x1p-20f) : 1.0f;
        /* move the maximum to a random column */
        const int64_t p = rnd_below(32);
        const float t = f[r * C + p];
        f[r * C + p] = f[r * C];
        f[r * C] = t;
    }
    static const lowp_scale_mode modes[] = {LOWP_SCALE_MODE_RCEIL, LOWP_SCALE_MODE_FLOOR,
                                            LOWP_SCALE_MODE_CEIL, LOWP_SCALE_MODE_EVEN};
    /* BF16 too: its kernels switch encoders on the scale codes (huge amax patterns) */
    for (int xi = 0; xi < 2; xi++) {
        const lowp_format xf = xi ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
        void *data = as_format(f, (size_t) (R * C), xf);
        lowp_tensor x = {xf, R, C, data, LOWP_DEVICE_HOST};
        for (int fi = 0; fi < 3; fi++)
            for (int m = 0; m < 4; m++) {
                const lowp_format ef = fi == 0   ? LOWP_FORMAT_E4M3
                                       : fi == 1 ? LOWP_FORMAT_E5M2
                                                 : LOWP_FORMAT_E2M1;
                qcase q = {LOWP_SCALING_MX32, ef, modes[m], -1, 0.0f, 0.0f, 1};
                check_case(&x, &q);
                if (fi < 2) {
                    q.scaling = LOWP_SCALING_BLOCK32X32;
                    check_case(&x, &q);
                }
            }
        free(data);
    }
    free(f);
}

/* The vectorized binary32 rule of BLOCK128 rowwise (16 blocks of a row per vector): one amax
 * pattern per 1x128 block, rows of 19 blocks (a full group of 16 and a tail of 3), swept over
 * every exponent with a few mantissas, subnormals, 0, Inf, NaN and random patterns, with pow2
 * on and off and an eps below and above many of the maxima. */
static void test_fp32_rule_sweep(void) {
    static const uint32_t mant[] = {0x000000, 0x000001, 0x3FFFFF, 0x400000, 0x7FFFFF};
    const int nm = (int) (sizeof mant / sizeof mant[0]);
    const int64_t nrand = g_quick ? 1024 : 8192, per = 19, C = 128 * per;
    const int64_t nblk = 255 * nm + nrand + 3, R = (nblk + per - 1) / per;
    float *a = calloc((size_t) (R * per), sizeof *a);
    int64_t n = 0;
    for (uint32_t e = 0; e < 255; e++)
        for (int k = 0; k < nm; k++) a[n++] = u2f(e << 23 | mant[k]);
    for (int64_t i = 0; i < nrand; i++) a[n++] = u2f((uint32_t) (rnd64() >> 33) % 0x7F800000u);
    a[n++] = INFINITY;
    a[n++] = NAN;
    a[n++] = 0.0f; /* the rest of the last row: zero blocks too */
    float *f = malloc((size_t) (R * C) * sizeof *f);
    for (int64_t b = 0; b < R * per; b++) {
        float *blk = f + b * 128;
        const float v = a[b];
        for (int c = 0; c < 128; c++) /* smaller magnitudes, never above |v| */
            blk[c] = isfinite(v) ? v * ((float) rnd_below(1u << 20) * 0x1p-20f) : 1.0f;
        blk[rnd_below(128)] = rnd_below(2) ? -v : v;
    }
    static const struct {
        int pow2;
        float eps;
    } fp[] = {{0, 0.0f}, {1, 0.0f}, {0, 1e-30f}, {1, 1e-3f}};
    for (int xi = 0; xi < 2; xi++) {
        const lowp_format xf = xi ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
        void *data = as_format(f, (size_t) (R * C), xf);
        lowp_tensor x = {xf, R, C, data, LOWP_DEVICE_HOST};
        for (int fi = 0; fi < 2; fi++)
            for (int k = 0; k < 4; k++) {
                qcase q = {LOWP_SCALING_BLOCK128,
                           fi ? LOWP_FORMAT_E5M2 : LOWP_FORMAT_E4M3,
                           LOWP_SCALE_MODE_DEFAULT,
                           fp[k].pow2,
                           fp[k].eps,
                           0.0f,
                           1};
                check_case(&x, &q);
            }
        free(data);
    }
    free(a);
    free(f);
}

/* Binary32 scales applied as a factor moved by a power of two (enc16_fsub): elements whose
 * scaled values sit within a few ulps of the target's rounding ties, in its subnormal range
 * (where the product is a binary32 subnormal and the kernel must not round twice), at its
 * smallest normal, in mid range and just below fmax. Each 1x128 block's first element fixes
 * its amax, so its scale fmax / amax is not a power of two; the rest are ties / scale, nudged.
 * BLOCK128, BLOCK128X128, ROW and TENSOR rowwise and columnwise, F32 and BF16 input; once with
 * six block maxima, once with one for all blocks (then the tensor's scale is the blocks').
 * The E8M0 kinds (MX32, BLOCK32X32) too, with 1x32 blocks whose maxima are fmax 2^k (their
 * power-of-two factors make products of binary32 input subnormal as well). */
static void test_fsub_ties(void) {
    static const double amaxes[] = {448.0 / 1.3, 0.37, 3.1e-3, 57344.0 / 3.7, 1.0e4, 2.5e-6};
    const int64_t R = 128, C = 128 * 6;
    float *f = malloc((size_t) (R * C) * sizeof *f);
    static const int pows[] = {-3, 0, 5, -20, 9, -40};
    for (int set = 0; set < 6; set++) {
        const int fi = set & 1, one = set >> 1 == 1, e8 = set >> 1 == 2;
        const int64_t bw = e8 ? 32 : 128; /* block width */
        const lowp_format ef = fi ? LOWP_FORMAT_E5M2 : LOWP_FORMAT_E4M3;
        const int m = fi ? 2 : 3, emin = fi ? -14 : -6; /* mantissa bits, smallest normal */
        const double fmax = fi ? 57344.0 : 448.0;
        for (int64_t r = 0; r < R; r++)
            for (int64_t b = 0; b < C / bw; b++) {
                const double amax = e8 ? ldexp(fmax, pows[b % 6]) : amaxes[one ? 0 : (r + b) % 6];
                const double s = fmax / amax;
                float *blk = f + r * C + bw * b;
                blk[0] = (float) (r % 2 ? -amax : amax);
                for (int c = 1; c < bw; c++) {
                    /* the binade of the scaled value: subnormal, smallest normal, any, top */
                    const uint32_t w = rnd_below(4);
                    const int e = w == 0   ? emin - 1 - (int) rnd_below(4)
                                  : w == 1 ? emin
                                  : w == 2 ? emin + (int) rnd_below(8)
                                           : (int) floor(log2(fmax));
                    const int qe = (e < emin ? emin : e) - m; /* the quantum's exponent */
                    const double lo = e < emin ? 0.0 : ldexp(1.0, e);
                    const double k = floor(lo / ldexp(1.0, qe)) + (double) rnd_below(1u << m);
                    double y = (k + 0.5) * ldexp(1.0, qe); /* a tie */
                    if (y > fmax) y = fmax - ldexp(0.5, qe);
                    float v = (float) (y / s);
                    for (int n = (int) rnd_below(5) - 2; n != 0; n += n > 0 ? -1 : 1)
                        v = nextafterf(v, n > 0 ? INFINITY : 0.0f);
                    blk[c] = rnd_below(2) ? -v : v;
                }
            }
        for (int xi = 0; xi < 2; xi++) {
            const lowp_format xf = xi ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
            void *data = as_format(f, (size_t) (R * C), xf);
            lowp_tensor x = {xf, R, C, data, LOWP_DEVICE_HOST};
            static const lowp_scaling kinds[2][4] = {{LOWP_SCALING_BLOCK128,
                                                      LOWP_SCALING_BLOCK128X128, LOWP_SCALING_ROW,
                                                      LOWP_SCALING_TENSOR},
                                                     {LOWP_SCALING_MX32, LOWP_SCALING_BLOCK32X32,
                                                      LOWP_SCALING_MX32, LOWP_SCALING_BLOCK32X32}};
            for (int k = 0; k < 4; k++)
                for (int orient = 1; orient <= 3; orient++) {
                    qcase q = {kinds[e8][k], ef,    LOWP_SCALE_MODE_DEFAULT, e8 ? -1 : 0, 0.0f,
                               0.0f,         orient};
                    if (e8 && k >= 2) /* the other mode of each: MX32 FLOOR, 32x32 RCEIL */
                        q.mode = k == 2 ? LOWP_SCALE_MODE_FLOOR : LOWP_SCALE_MODE_RCEIL;
                    check_case(&x, &q);
                }
            free(data);
        }
    }
    free(f);
}

/* gen's R x C input (with specials), as F32 and as BF16, through the cases k of cases[0, n)
 * whose bit k is set in `which`. */
static void check_gen(int64_t R, int64_t C, const qcase *cases, size_t n, unsigned which) {
    float *f = malloc((size_t) (R * C) * sizeof *f);
    gen(f, R, C, 1);
    for (int xi = 0; xi < 2; xi++) {
        const lowp_format xf = xi ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
        void *data = as_format(f, (size_t) (R * C), xf);
        lowp_tensor x = {xf, R, C, data, LOWP_DEVICE_HOST};
        for (size_t k = 0; k < n; k++)
            if (which >> k & 1) check_case(&x, &cases[k]);
        free(data);
    }
    free(f);
}

/* Dual-axis outputs of 256 KiB and more, 64-byte aligned, are written with non-temporal stores
 * (test_shapes' 256x4096 takes them too), and so are the byte encoder's rowwise copies of the
 * block kinds from 4 MiB (BF16 input here: 8 MiB); the same shape misaligned by one byte takes
 * the ordinary stores. The common training kinds only. */
static void test_large(void) {
    static const qcase cases[] = {
        {LOWP_SCALING_MX32, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_RCEIL, -1, 0.0f, 0.0f, 3},
        {LOWP_SCALING_MX32, LOWP_FORMAT_E5M2, LOWP_SCALE_MODE_FLOOR, -1, 0.0f, 0.0f, 1},
        {LOWP_SCALING_MX32, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_EVEN, -1, 0.0f, 0.0f, 2},
        {LOWP_SCALING_MX32, LOWP_FORMAT_E2M1, LOWP_SCALE_MODE_RCEIL, -1, 0.0f, 0.0f, 3},
        {LOWP_SCALING_BLOCK32X32, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_DEFAULT, -1, 0.0f, 0.0f, 3},
        {LOWP_SCALING_BLOCK128X128, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_DEFAULT, -1, 0.0f, 0.0f, 1},
        {LOWP_SCALING_BLOCK128, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_DEFAULT, -1, 0.0f, 0.0f, 1},
        {LOWP_SCALING_ROW, LOWP_FORMAT_E5M2, LOWP_SCALE_MODE_DEFAULT, -1, 0.0f, 0.0f, 1},
        {LOWP_SCALING_TENSOR, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_DEFAULT, -1, 0.0f, 0.0f, 1},
    };
    for (g_mis = 0; g_mis <= 1; g_mis++) /* misaligned: MX32 E4M3 and the block kinds */
        check_gen(2048, 4096, cases, sizeof cases / sizeof cases[0], g_mis ? 0x71u : ~0u);
    g_mis = 0;
}

/* Columnwise copies of at least 256 KiB whose rows are not whole 64-byte lines: the
 * binary32-scale kinds (ROW, TENSOR, BLOCK128) complete each column's lines across 64-row
 * pieces (col_carry in col_store64). 2080 rows: the last band is short, and on two threads
 * the second thread's rows start inside a line (ROW and TENSOR: row 1040); 2048 rows with the
 * outputs one byte off alignment: every band whole, so the carries are emptied at the end of
 * the rows. gen's NaN, Inf, tiny and zero blocks; F32 and BF16 input. */
static void test_unaligned_rows(void) {
    static const qcase cases[] = {
        {LOWP_SCALING_ROW, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_DEFAULT, -1, 0.0f, 0.0f, 3},
        {LOWP_SCALING_ROW, LOWP_FORMAT_E5M2, LOWP_SCALE_MODE_DEFAULT, -1, 0.0f, 0.0f, 2},
        {LOWP_SCALING_TENSOR, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_DEFAULT, -1, 0.0f, 0.0f, 3},
        {LOWP_SCALING_TENSOR, LOWP_FORMAT_E5M2, LOWP_SCALE_MODE_DEFAULT, -1, 0.0f, 0.0f, 2},
        {LOWP_SCALING_BLOCK128, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_DEFAULT, -1, 0.0f, 0.0f, 3},
    };
    for (g_mis = 0; g_mis <= 1; g_mis++)
        check_gen(g_mis ? 2048 : 2080, 200, cases, sizeof cases / sizeof cases[0], ~0u);
    g_mis = 0;
}

/* The dual-axis byte encoder's band path on ordinary data, where nearly every tile takes it
 * (gen's tiny, huge and zero blocks send many tiles to the fallback): each 32-element run of a
 * row in one of 8 binades, random signs and mantissas, so that under FLOOR and EVEN a block's
 * largest values often exceed the format's maximum and are clipped; `tall` adds a block of
 * Inf, one of values below the byte encoder's smallest scale and a column block of them,
 * whose tiles take the fallback inside the band path. BF16 input, MX32 E4M3 and E5M2, every
 * mode; orientations from o0 to 3. */
static void band_case(int64_t R, int64_t C, int tall, int o0) {
    float *f = malloc((size_t) (R * C) * sizeof *f);
    int e = 0;
    for (int64_t i = 0; i < R * C; i++) {
        if (i % 32 == 0) e = (int) rnd_below(8) - 7;             /* the binade of this run of 32 */
        const float m = 1.0f + (float) rnd_below(128) * 0x1p-7f; /* BF16-exact */
        f[i] = (rnd_below(2) ? -1.0f : 1.0f) * ldexpf(m, e);
    }
    if (tall) {
        f[2100 * C + 600] = INFINITY;         /* the tile of rows 2048-2111, columns 576-639 */
        for (int64_t r = 2976; r < 3008; r++) /* rows 2944-3007, columns 128-191 */
            for (int64_t c = 128; c < 160; c++) f[r * C + c] = ldexpf(1.0f, -125);
        /* a column block alone (its rows' blocks are ordinary): rows 3200-3263, columns
         * 640-703, found only when the tile's codes begin */
        for (int64_t r = 3200; r < 3232; r++) f[r * C + 700] = ldexpf(1.0f, -125);
    }
    void *data = as_format(f, (size_t) (R * C), LOWP_FORMAT_BF16);
    lowp_tensor x = {LOWP_FORMAT_BF16, R, C, data, LOWP_DEVICE_HOST};
    static const lowp_scale_mode modes[] = {LOWP_SCALE_MODE_RCEIL, LOWP_SCALE_MODE_FLOOR,
                                            LOWP_SCALE_MODE_CEIL, LOWP_SCALE_MODE_EVEN};
    for (int fi = 0; fi < 2; fi++)
        for (int m = 0; m < 4; m++)
            for (int orient = o0; orient <= 3; orient++) {
                const qcase q = {LOWP_SCALING_MX32,
                                 fi ? LOWP_FORMAT_E5M2 : LOWP_FORMAT_E4M3,
                                 modes[m],
                                 -1,
                                 0.0f,
                                 0.0f,
                                 orient};
                check_case(&x, &q);
            }
    free(data);
    free(f);
}

/* The band path's shapes, in 64-row super-bands with the column scales staged in groups of
 * 64 blocks (2048 rows). 320x1100: five super-bands on one thread, three and two on two (rows
 * 0-191 and 192-319, so the second thread's group starts at its block 6); chunks of 512, 512
 * and 64 columns, 12 edge columns; every orientation. 4320x1100, the columnwise copies: on
 * one thread three groups, the last of 6 blocks (rows 4096-4287; the last 32 rows by
 * mx_tile32); on two threads rows 0-2175 and 2176-4319, so that a group ends inside the first
 * thread's rows and the next starts inside the second's; two tiles take the fallback, whose
 * column scales are copied into the staging. */
static void test_band_path(void) {
    band_case(320, 1100, 0, 1);
    band_case(4320, 1100, 1, 2);
}

/* The band path without the column-scale staging (more than SC_STAGE_MAX_BYTES of it: 65,600
 * columns, a multiple of 64): on two threads its 256-row super-bands (rows 0-127 and 128-191,
 * short of 256), with the column scales stored directly. */
static void test_band_unstaged(void) {
    band_case(192, 65600, 0, 3);
}

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
/* The fast encoders need subnormal products: with FTZ and DAZ set on the calling thread the
 * kernels must fall back and still equal the reference (run on one thread, so that the
 * kernel runs where the MXCSR was changed). Inputs without binary32 subnormals, whose scaled
 * values reach the targets' subnormals (binary32 normals, which FTZ keeps): MX32 (enc16_sub)
 * and BLOCK128 (enc16_fsub, where a flushed product would lose those codes), BF16 and F32
 * input (MX32 on F32 input takes enc16_fsub too). */
static void test_mxcsr(void) {
    const int64_t R = 64, C = 256;
    float *f = malloc((size_t) (R * C) * sizeof *f);
    for (int64_t i = 0; i < R * C; i++) f[i] = around((int) rnd_below(21) - 10);
    static const qcase cases[] = {
        {LOWP_SCALING_MX32, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_RCEIL, -1, 0.0f, 0.0f, 3},
        {LOWP_SCALING_BLOCK128, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_DEFAULT, 0, 0.0f, 0.0f, 3},
    };
    for (int k = 0; k < 4; k++) {
        const qcase q = cases[k % 2];
        const lowp_format xf = k < 2 ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
        void *data = as_format(f, (size_t) (R * C), xf);
        lowp_tensor x = {xf, R, C, data, LOWP_DEVICE_HOST};
        lowp_qtensor row = {q.ef, q.scaling, R, C, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
        lowp_qtensor col = {q.ef, q.scaling, C, R, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
        outs ro, fo;
        outs_alloc(&ro, &row, &col, 0);
        outs_alloc(&fo, &row, &col, 0);
        float amax;
        /* FTZ and DAZ; then, for the AVX2 kernel, rounding toward zero and upward (its encoder
         * rounds with a binary32 add where the MXCSR rounds to nearest, and must not elsewhere;
         * the AVX-512 kernels are not held to directed rounding modes here) */
        static const unsigned modes[] = {0x8040u, 0x6000u, 0x4000u};
        static const char *what[][2] = {{"row codes (FTZ/DAZ)", "col codes (FTZ/DAZ)"},
                                        {"row codes (RC toward 0)", "col codes (RC toward 0)"},
                                        {"row codes (RC up)", "col codes (RC up)"}};
        for (int mi = 0; mi < (g_path == LOWP_KERNEL_PATH_AVX2 ? 3 : 1); mi++) {
            const unsigned csr = _mm_getcsr();
            _mm_setcsr((csr & ~0x6000u) | modes[mi]);
            CHECK(run(&x, &q, LOWP_KERNEL_PATH_REFERENCE, 1, &ro, 0xA5, &amax) == LOWP_OK);
            CHECK(run(&x, &q, g_path, 1, &fo, 0x5A, &amax) == LOWP_OK);
            _mm_setcsr(csr);
            compare(what[mi][0], &q, &x, 1, ro.rd, fo.rd, ro.rdb);
            compare(what[mi][1], &q, &x, 1, ro.cd, fo.cd, ro.cdb);
        }
        outs_free(&ro);
        outs_free(&fo);
        free(data);
    }
    free(f);
}
#else
static void test_mxcsr(void) {}
#endif

/* lowp_quantize_grouped with both outputs (the experts' inputs of the training layer): the
 * rowwise copy and the grouped columnwise copy (format ef, kind sc, groups offs) from one call,
 * on the fast kernels (one read of x where they take the job) and on the reference path,
 * against the reference's two separate calls, lowp_quantize (rowwise) and lowp_quantize_grouped
 * without row_out, bit for bit, with different garbage in each run's buffers. Tokens past
 * offs[G-1] and E2M1 take the one-after-the-other route, with the same bytes. */
static void check_grouped_dual(const lowp_tensor *x, lowp_format ef, lowp_scaling sc,
                               const int32_t *offs, int32_t G, int threads) {
    const int64_t M = x->rows, K = x->cols;
    lowp_qtensor q = {ef, sc, K, M, NULL, NULL, LOWP_DEVICE_HOST, (int32_t *) offs, G};
    lowp_qtensor r = {ef, sc, M, K, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    size_t n[4];
    CHECK(lowp_qtensor_nbytes(&q, &n[0], &n[1]) == LOWP_OK);
    CHECK(lowp_qtensor_nbytes(&r, &n[2], &n[3]) == LOWP_OK);
    uint8_t *buf[3][4];
    for (int pi = 0; pi < 3; pi++) { /* separate reference calls, one call AUTO, REFERENCE */
        for (int b = 0; b < 4; b++) {
            buf[pi][b] = malloc(n[b] + 1);
            memset(buf[pi][b], 0x5A + 0x4B * pi, n[b] + 1);
        }
        q.data = buf[pi][0], q.scales = buf[pi][1], r.data = buf[pi][2], r.scales = buf[pi][3];
        lowp_quant_cfg cfg;
        lowp_quant_cfg_init(&cfg);
        cfg.threads = threads;
        cfg.path = pi == 1 ? LOWP_KERNEL_PATH_AUTO : LOWP_KERNEL_PATH_REFERENCE;
        if (pi) {
            CHECKF(lowp_quantize_grouped(x, &r, &q, &cfg) == LOWP_OK, "grouped dual: %s",
                   lowp_last_error());
        } else {
            CHECK(lowp_quantize(x, &r, NULL, &cfg) == LOWP_OK);
            CHECK(lowp_quantize_grouped(x, NULL, &q, &cfg) == LOWP_OK);
        }
    }
    for (int pi = 1; pi < 3; pi++) {
        long d[4];
        for (int b = 0; b < 4; b++) d[b] = first_diff(buf[0][b], buf[pi][b], n[b]);
        CHECKF(d[0] < 0 && d[1] < 0 && d[2] < 0 && d[3] < 0,
               "grouped dual %lldx%lld %s %s threads %d path %s: first diffs: col codes %ld, col "
               "scales %ld, row codes %ld, row scales %ld",
               (long long) M, (long long) K, fname(ef),
               sc == LOWP_SCALING_MX32 ? "mx32" : "block128", threads,
               pi == 1 ? "auto" : "reference", d[0], d[1], d[2], d[3]);
    }
    for (int pi = 0; pi < 3; pi++)
        for (int b = 0; b < 4; b++) free(buf[pi][b]);
    g_runs++;
}

/* lowp_quantize_grouped: the AVX-512 path (each group quantized as an ungrouped job, then
 * copied into the group's spans) against the reference, bit for bit: groups that are empty,
 * shorter than a block, not a multiple of one, or aligned; tokens past offs[G-1]; every format
 * (E2M1 falls back to the reference), both kinds, F32 and BF16 inputs, 1 and 2 threads; and
 * each case through check_grouped_dual. */
static void test_grouped(void) {
    static const struct {
        int64_t M, K;
        int32_t G;
        int32_t offs[6];
    } cases[] = {
        {1, 1, 1, {1}},
        {50, 3, 3, {0, 33, 40}},
        {300, 65, 4, {64, 64, 190, 250}},
        {1536, 128, 6, {190, 380, 380, 700, 1024, 1530}},
        {700, 160, 5, {129, 257, 300, 301, 700}},
        {250, 65, 4, {64, 64, 190, 250}},
        {900, 96, 2, {31, 900}},
        /* spans of at least 256 KiB starting at 0, 900 and 1830 (the last two inside a
         * line): the band path's carried column lines (col_carry), with fallback tiles */
        {3000, 330, 3, {900, 1830, 3000}},
    };
    static const lowp_format efs[] = {LOWP_FORMAT_E4M3, LOWP_FORMAT_E5M2, LOWP_FORMAT_E2M1};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t M = cases[ci].M, K = cases[ci].K;
        float *f = malloc((size_t) (M * K) * sizeof *f);
        gen(f, M, K, 1);
        for (int xi = 0; xi < 2; xi++) {
            const lowp_format xf = xi ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
            void *data = as_format(f, (size_t) (M * K), xf);
            lowp_tensor x = {xf, M, K, data, LOWP_DEVICE_HOST};
            for (int si = 0; si < 2; si++)
                for (size_t ei = 0; ei < sizeof efs / sizeof efs[0]; ei++) {
                    const lowp_scaling sc = si ? LOWP_SCALING_BLOCK128 : LOWP_SCALING_MX32;
                    if (sc == LOWP_SCALING_BLOCK128 && efs[ei] == LOWP_FORMAT_E2M1) continue;
                    lowp_qtensor q = {
                        efs[ei],        sc,         K, M, NULL, NULL, LOWP_DEVICE_HOST,
                        cases[ci].offs, cases[ci].G};
                    size_t db, sb;
                    CHECK(lowp_qtensor_nbytes(&q, &db, &sb) == LOWP_OK);
                    uint8_t *d[2], *s2[2];
                    for (int pi = 0; pi < 2; pi++) {
                        d[pi] = malloc(db + 1);
                        s2[pi] = malloc(sb + 1);
                    }
                    for (int threads = 1; threads <= 2; threads++) {
                        for (int pi = 0; pi < 2; pi++) {
                            /* different garbage per path: a byte left unwritten shows up */
                            memset(d[pi], pi ? 0xA5 : 0x5A, db + 1);
                            memset(s2[pi], pi ? 0xA5 : 0x5A, sb + 1);
                            lowp_quant_cfg cfg;
                            lowp_quant_cfg_init(&cfg);
                            cfg.threads = threads;
                            cfg.path = pi ? LOWP_KERNEL_PATH_AUTO : LOWP_KERNEL_PATH_REFERENCE;
                            q.data = d[pi];
                            q.scales = s2[pi];
                            CHECKF(lowp_quantize_grouped(&x, NULL, &q, &cfg) == LOWP_OK,
                                   "grouped: %s", lowp_last_error());
                        }
                        long dd = first_diff(d[0], d[1], db), ds = first_diff(s2[0], s2[1], sb);
                        CHECKF(dd < 0 && ds < 0,
                               "grouped %lldx%lld %s %s x%s threads %d: first code diff %ld, "
                               "first scale diff %ld",
                               (long long) M, (long long) K, fname(efs[ei]),
                               si ? "block128" : "mx32", xi ? "bf16" : "f32", threads, dd, ds);
                        g_runs++;
                        check_grouped_dual(&x, efs[ei], sc, cases[ci].offs, cases[ci].G, threads);
                    }
                    for (int pi = 0; pi < 2; pi++) {
                        free(d[pi]);
                        free(s2[pi]);
                    }
                }
            free(data);
        }
        free(f);
    }
}

/* Returns 1 when `path` can run lowp_quantize here; prints why not otherwise. */
static int path_available(lowp_kernel_path path) {
    float v = 1.0f;
    uint8_t code = 0, scale = 0;
    lowp_tensor x = {LOWP_FORMAT_F32, 1, 1, &v, LOWP_DEVICE_HOST};
    lowp_qtensor row = {LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 1,    1, &code,
                        &scale,           LOWP_DEVICE_HOST,  NULL, 0};
    lowp_quant_cfg cfg;
    lowp_quant_cfg_init(&cfg);
    cfg.path = path;
    lowp_status st = lowp_quantize(&x, &row, NULL, &cfg);
    if (st == LOWP_ERR_UNSUPPORTED) {
        printf("%s unsupported here (%s)\n",
               path == LOWP_KERNEL_PATH_AVX2 ? "LOWP_KERNEL_PATH_AVX2" : "LOWP_KERNEL_PATH_AVX512",
               lowp_last_error());
        return 0;
    }
    CHECKF(st == LOWP_OK, "probe: %s", lowp_last_error());
    return st == LOWP_OK;
}

int main(void) {
    tu_seed(0x243F6A8885A308D3ull);
    g_quick = testutil_quick();
    if (!path_available(LOWP_KERNEL_PATH_AVX512)) {
        if (!path_available(LOWP_KERNEL_PATH_AVX2)) {
            printf("skip: no fast quantization kernel here\n");
            return testutil_finish();
        }
        g_path = LOWP_KERNEL_PATH_AVX2;
        g_path_name = "avx2";
        printf("testing the AVX2 kernel\n");
    }
    test_e8m0_sweep();
    test_fp32_rule_sweep();
    test_fsub_ties();
    printf("e8m0 sweep done (%d comparisons)\n", g_runs);
    test_shapes();
    test_band_path();
    printf("band path done (%d comparisons so far)\n", g_runs);
    test_grouped();
    printf("grouped done (%d comparisons so far)\n", g_runs);
    test_mxcsr();
    if (!g_quick) {
        test_large();
        test_unaligned_rows();
        test_band_unstaged();
        printf("large (non-temporal) cases done (%d comparisons)\n", g_runs);
    }
    printf("%d quantize calls compared with the reference\n", g_runs);
    return testutil_finish();
}
