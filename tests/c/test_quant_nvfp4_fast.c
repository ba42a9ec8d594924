/* NVFP4 quantization (nv16, nv16x16; docs/numerics.md section 4b): the fast kernel (AVX-512,
 * or AVX2 under LOWP_CPU_DISABLE=avx512 or on CPUs without AVX-512) against the scalar
 * reference, byte for byte through the public API (cfg.path forced: a path that refuses the job
 * fails the test): codes, block scales and the tensor scale after them.
 *
 * Rowwise, columnwise and both copies from one call, F32 and BF16 input, 1 and 2 threads, on
 * shapes with tails in both dimensions (1x1, 15, 16, 17, 33 columns, rows not a multiple of
 * 16). Inputs: zero blocks of both signs of zero, binary32 subnormals, block maxima placed at
 * and one or two ulps around every E4M3 code boundary (the midpoints between neighbouring
 * codes, 2^-10 and the 448 saturation) of bamax * (S / 6), tensor amax at 2688 * 2^k and a few
 * ulps away (k from -140 to 100: S down to FLT_MAX), NaN and Inf blocks beside clean ones (S
 * forced to 1, block codes saturating at 0x7E). Grouped columnwise copies (lowp_quantize_grouped,
 * with and without the rowwise copy) with empty groups, groups shorter than a block, odd group
 * starts (a byte shared by two groups) and tokens past offs[G-1]. Output buffers are filled with
 * different garbage per path so a byte one of them forgets shows up. On the AVX-512 path all
 * of it again with stochastic rounding, for several seeds and offsets (test_sr).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cpu/host.h"
#include "lowp/cpu_path.h"
#include "lowp/lowp.h"
#include "lowp/quant.h"
#include "testutil.h"

static lowp_kernel_path g_path = LOWP_KERNEL_PATH_AVX512;
static const char *g_name = "avx512";
static int g_runs, g_reports;
/* Stochastic rounding (cfg.rounding SR with this seed and offset) when g_sr is set. */
static int g_sr;
static uint64_t g_seed, g_offset;

static void set_rounding(lowp_quant_cfg *cfg) {
    cfg->rounding = g_sr ? LOWP_ROUNDING_SR : LOWP_ROUNDING_RNE;
    cfg->seed = g_seed;
    cfg->offset = g_offset;
}

/* E4M3 code c's value (c < 0x7F). */
static double e4m3_value(int c) {
    int e = c >> 3, m = c & 7;
    return e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m, -9);
}

/* A block maximum whose scaled value bamax * (S / 6) lies at or beside a code boundary. */
static float boundary_bamax(float S) {
    const int c = (int) rnd_below(0x7E);
    double v = (e4m3_value(c) + e4m3_value(c + 1)) / 2; /* the tie between codes c and c+1 */
    const uint32_t k = rnd_below(8);
    if (k == 0) v = ldexp(1.0, -10);
    if (k == 1) v = 448.0;
    float b = (float) (v / ((double) S / 6.0));
    const int d = (int) rnd_below(5) - 2; /* -2 .. 2 ulps */
    return u2f(f2u(b) + (uint32_t) d);
}

/* Input [R, C] as binary32. Tensor amax 2688 * 2^k (+- ulps); blocks of 16 along the rows of
 * many kinds. specials: NaN and Inf in a few blocks. */
static void gen(float *x, int64_t R, int64_t C, int k, int specials) {
    const float amax = u2f(f2u(ldexpf(2688.0f, k)) + (uint32_t) ((int) rnd_below(5) - 2));
    const float S = 2688.0f / amax;
    for (int64_t r = 0; r < R; r++)
        for (int64_t c0 = 0; c0 < C; c0 += 16) {
            const uint32_t kind = rnd_below(10);
            const float bmax = kind < 5 ? boundary_bamax(S) : ldexpf(amax, -(int) rnd_below(30));
            for (int64_t c = c0; c < C && c < c0 + 16; c++) {
                float v;
                const uint32_t s = rnd_below(16);
                if (kind == 5)
                    v = rnd_below(2) ? 0.0f : -0.0f;
                else if (kind == 6)
                    v = u2f((rnd_below(2) << 31) | (1u + rnd_below(0x7FFFFF)));
                else if (s == 0)
                    v = bmax;
                else if (s == 1)
                    v = rnd_below(2) ? 0.0f : -0.0f;
                else
                    v = bmax * (float) urand() * (rnd_below(2) ? 1.0f : -1.0f);
                if (fabsf(v) > amax) v = copysignf(amax, v);
                x[r * C + c] = v;
            }
        }
    if (R * C > 0) x[rnd_below((uint32_t) (R * C))] = rnd_below(2) ? amax : -amax;
    if (specials && R * C > 1) {
        const int n = 1 + (int) rnd_below(3);
        for (int i = 0; i < n; i++) {
            const uint32_t k2 = rnd_below(4);
            x[rnd_below((uint32_t) (R * C))] = k2 == 0   ? INFINITY
                                               : k2 == 1 ? -INFINITY
                                               : k2 == 2 ? u2f(0x7FC00000u | rnd_below(0x400000))
                                                         : u2f(0xFFC00001u);
        }
    }
}

/* Binary32 f as the tensor data of format xf (BF16: the top half of each pattern). */
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

static long first_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return (long) i;
    return -1;
}

/* buf[path][0..3]: row codes, row scales, col codes, col scales. */
typedef struct bufs {
    uint8_t *b[2][4];
    size_t n[4];
} bufs;

static void bufs_alloc(bufs *o, const lowp_qtensor *row, const lowp_qtensor *col) {
    lowp_qtensor_nbytes(row, &o->n[0], &o->n[1]);
    lowp_qtensor_nbytes(col, &o->n[2], &o->n[3]);
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < 4; i++) o->b[p][i] = malloc(o->n[i] + 1);
}

static void bufs_free(bufs *o) {
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < 4; i++) free(o->b[p][i]);
}

/* The padding between a copy's block scales and its tensor scale is written by neither path:
 * the reference's garbage is copied over the fast path's there. */
static void same_pad(const lowp_qtensor *q, const uint8_t *ref, uint8_t *fast) {
    int64_t sr, sc;
    size_t off;
    if (q->scaling == LOWP_SCALING_MX32) return; /* no tensor scale */
    CHECK_OK(lowp_qtensor_scale_shape(q, &sr, &sc, NULL));
    CHECK_OK(lowp_qtensor_tensor_scale_offset(q, &off));
    if ((size_t) (sr * sc) < off) memcpy(fast + sr * sc, ref + sr * sc, off - (size_t) (sr * sc));
}

static void report(const char *what, long d, const uint8_t *ref, const uint8_t *fast,
                   const char *ctx) {
    CHECKF(d < 0, "%s differs at byte %ld (ref 0x%02X, %s 0x%02X): %s", what, d,
           d >= 0 ? ref[d] : 0, g_name, d >= 0 ? fast[d] : 0, ctx);
    if (d >= 0 && ++g_reports > 30) {
        fprintf(stderr, "too many failures, stopping\n");
        exit(testutil_finish());
    }
}

/* One kind and orientation (1 row, 2 col, 3 both) on x: reference vs the fast path. */
static void check_case(const lowp_tensor *x, lowp_scaling sc, int orient, int threads) {
    lowp_qtensor row = {LOWP_FORMAT_E2M1, sc,   x->rows, x->cols, NULL, NULL,
                        LOWP_DEVICE_HOST, NULL, 0};
    lowp_qtensor col = {LOWP_FORMAT_E2M1, sc,   x->cols, x->rows, NULL, NULL,
                        LOWP_DEVICE_HOST, NULL, 0};
    bufs o;
    bufs_alloc(&o, &row, &col);
    for (int p = 0; p < 2; p++) {
        for (int i = 0; i < 4; i++) memset(o.b[p][i], p ? 0x5A : 0xA5, o.n[i] + 1);
        row.data = o.b[p][0], row.scales = o.b[p][1], col.data = o.b[p][2], col.scales = o.b[p][3];
        lowp_quant_cfg cfg;
        lowp_quant_cfg_init(&cfg);
        cfg.threads = p ? threads : 1;
        cfg.path = p ? g_path : LOWP_KERNEL_PATH_REFERENCE;
        set_rounding(&cfg);
        lowp_status st = lowp_quantize(x, orient & 1 ? &row : NULL, orient & 2 ? &col : NULL, &cfg);
        CHECKF(st == LOWP_OK, "%s path: %s", p ? g_name : "reference", lowp_last_error());
    }
    same_pad(&row, o.b[0][1], o.b[1][1]);
    same_pad(&col, o.b[0][3], o.b[1][3]);
    char ctx[160];
    snprintf(ctx, sizeof ctx,
             "%s orient %d, x %s %lldx%lld, threads %d, sr %d seed %llu offset %llu",
             sc == LOWP_SCALING_NV16   ? "nv16"
             : sc == LOWP_SCALING_MX32 ? "mx32"
                                       : "nv16x16",
             orient, x->format == LOWP_FORMAT_F32 ? "f32" : "bf16", (long long) x->rows,
             (long long) x->cols, threads, g_sr, (unsigned long long) g_seed,
             (unsigned long long) g_offset);
    static const char *what[4] = {"row codes", "row scales", "col codes", "col scales"};
    for (int i = 0; i < 4; i++)
        if (orient & (i < 2 ? 1 : 2))
            report(what[i], first_diff(o.b[0][i], o.b[1][i], o.n[i]), o.b[0][i], o.b[1][i], ctx);
    g_runs++;
    bufs_free(&o);
}

static void check_all(const float *f, int64_t R, int64_t C) {
    for (int xi = 0; xi < 2; xi++) {
        const lowp_format xf = xi ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
        void *data = as_format(f, (size_t) (R * C), xf);
        lowp_tensor x = {xf, R, C, data, LOWP_DEVICE_HOST};
        for (int s = 0; s < 2; s++)
            for (int orient = 1; orient <= 3; orient++)
                for (int threads = 1; threads <= 2; threads++)
                    check_case(&x, s ? LOWP_SCALING_NV16X16 : LOWP_SCALING_NV16, orient, threads);
        free(data);
    }
}

static void test_shapes(void) {
    static const int64_t shapes[][2] = {{1, 1},    {1, 15},    {3, 16},   {5, 17},
                                        {17, 33},  {16, 16},   {31, 47},  {33, 271},
                                        {40, 300}, {100, 513}, {64, 256}, {129, 1030}};
    static const int ks[] = {0, -1, 1, 7, -20, 40, 100, -120, -140};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
            for (int specials = 0; specials < 2; specials++) {
                const int64_t R = shapes[si][0], C = shapes[si][1];
                if (R * C > 20000 && ki > 2) continue;
                float *f = malloc((size_t) (R * C) * sizeof *f);
                gen(f, R, C, ks[ki], specials);
                check_all(f, R, C);
                free(f);
            }
}

/* Whole tensors of one kind: zeros (S = 1), subnormals only (S = FLT_MAX), one Inf or NaN
 * among ordinary values (S forced to 1: block codes saturate at 0x7E). */
static void test_special_tensors(void) {
    const int64_t R = 37, C = 49;
    float *f = malloc((size_t) (R * C) * sizeof *f);
    for (int t = 0; t < 5; t++) {
        for (int64_t i = 0; i < R * C; i++) {
            const float g = (float) (urand() * 4000.0 - 2000.0);
            f[i] = t == 0   ? (i % 3 ? 0.0f : -0.0f)
                   : t == 1 ? u2f((uint32_t) (i % 2) << 31 | (1u + rnd_below(0x7FFFFF)))
                            : g;
        }
        if (t == 2) f[R * C / 2] = INFINITY;
        if (t == 3) f[17] = -NAN;
        if (t == 4) f[0] = -FLT_MAX;
        check_all(f, R, C);
    }
    free(f);
}

/* lowp_quantize_grouped (nv16) on the fast path vs the reference, with and without the
 * rowwise copy. */
static void check_grouped(const lowp_tensor *x, const int32_t *offs, int32_t G, int threads,
                          int with_row) {
    const int64_t M = x->rows, K = x->cols;
    lowp_qtensor q = {LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, K, M, NULL, NULL,
                      LOWP_DEVICE_HOST, (int32_t *) offs,  G};
    lowp_qtensor r = {
        LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, M, K, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    bufs o;
    bufs_alloc(&o, &r, &q);
    for (int p = 0; p < 2; p++) {
        for (int i = 0; i < 4; i++) memset(o.b[p][i], p ? 0x5A : 0xA5, o.n[i] + 1);
        r.data = o.b[p][0], r.scales = o.b[p][1], q.data = o.b[p][2], q.scales = o.b[p][3];
        lowp_quant_cfg cfg;
        lowp_quant_cfg_init(&cfg);
        cfg.threads = p ? threads : 1;
        cfg.path = p ? g_path : LOWP_KERNEL_PATH_REFERENCE;
        set_rounding(&cfg);
        lowp_status st = lowp_quantize_grouped(x, with_row ? &r : NULL, &q, &cfg);
        CHECKF(st == LOWP_OK, "grouped, %s path: %s", p ? g_name : "reference", lowp_last_error());
    }
    same_pad(&r, o.b[0][1], o.b[1][1]);
    same_pad(&q, o.b[0][3], o.b[1][3]);
    char ctx[160];
    snprintf(ctx, sizeof ctx, "grouped %lldx%lld x %s G %d last %d, threads %d, row %d",
             (long long) M, (long long) K, x->format == LOWP_FORMAT_F32 ? "f32" : "bf16", G,
             offs[G - 1], threads, with_row);
    static const char *what[4] = {"row codes", "row scales", "col codes", "col scales"};
    for (int i = with_row ? 0 : 2; i < 4; i++)
        report(what[i], first_diff(o.b[0][i], o.b[1][i], o.n[i]), o.b[0][i], o.b[1][i], ctx);
    g_runs++;
    bufs_free(&o);
}

static void test_grouped(void) {
    static const struct {
        int64_t M, K;
        int32_t G;
        int32_t offs[6];
    } cases[] = {
        {1, 1, 1, {1}},
        {50, 3, 3, {0, 33, 40}},
        {41, 17, 4, {1, 2, 19, 41}},
        {300, 65, 4, {64, 64, 190, 250}},
        {120, 33, 6, {0, 7, 7, 23, 56, 119}},
        {700, 160, 5, {129, 257, 300, 301, 700}},
        {96, 31, 2, {0, 0}},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t M = cases[ci].M, K = cases[ci].K;
        float *f = malloc((size_t) (M * K) * sizeof *f);
        for (int specials = 0; specials < 2; specials++) {
            gen(f, M, K, (int) ci * 5 - 10, specials);
            for (int xi = 0; xi < 2; xi++) {
                const lowp_format xf = xi ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
                void *data = as_format(f, (size_t) (M * K), xf);
                lowp_tensor x = {xf, M, K, data, LOWP_DEVICE_HOST};
                for (int threads = 1; threads <= 2; threads++)
                    for (int with_row = 0; with_row < 2; with_row++)
                        check_grouped(&x, cases[ci].offs, cases[ci].G, threads, with_row);
                free(data);
            }
        }
        free(f);
    }
}

/* MX32 with E2M1 elements under SR (its own AVX-512 kernel): rowwise, columnwise and both, on
 * shapes with partial blocks in both dimensions and bands of 64 rows, NaN and Inf blocks. */
static void test_sr_mx32(void) {
    static const int64_t shapes[][2] = {{1, 1},   {5, 33},    {32, 32},
                                        {70, 97}, {129, 300}, {200, 513}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t R = shapes[si][0], C = shapes[si][1];
        float *f = malloc((size_t) (R * C) * sizeof *f);
        gen(f, R, C, (int) si * 3 - 6, (int) si & 1);
        for (int xi = 0; xi < 2; xi++) {
            const lowp_format xf = xi ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
            void *data = as_format(f, (size_t) (R * C), xf);
            lowp_tensor x = {xf, R, C, data, LOWP_DEVICE_HOST};
            for (int orient = 1; orient <= 3; orient++)
                for (int threads = 1; threads <= 2; threads++)
                    check_case(&x, LOWP_SCALING_MX32, orient, threads);
            free(data);
        }
        free(f);
    }
}

/* Stochastic rounding (issue 38): the same comparisons with cfg.rounding SR, for seeds and
 * offsets that are and are not multiples of 4 (a block's 16 words then span 5 Philox blocks),
 * one of them 6 words below Philox block 2^32 (the counter's carry into its high word inside
 * a block's window) and one whose block index has high bits set. The AVX2 path takes no SR
 * job (the reference does). */
static void test_sr(void) {
    static const uint64_t so[][2] = {{0, 0},
                                     {1, 3},
                                     {0x0123456789ABCDEFull, 1},
                                     {42, 0xFFFFFFFFull * 4 - 2},
                                     {7, 0x00000005FFFFFFF6ull},
                                     {0xFFFFFFFFFFFFFFFFull, 0x3FFFFFFFFFFF0001ull}};
    g_sr = 1;
    for (size_t i = 0; i < sizeof so / sizeof so[0]; i++) {
        g_seed = so[i][0];
        g_offset = so[i][1];
        test_shapes();
        test_special_tensors();
        test_grouped();
        test_sr_mx32();
    }
    g_sr = 0;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
/* The MXCSR of the calling thread (both paths on one thread): FTZ and DAZ, rounding toward
 * zero, and upward. The kernels' products, factor division and block scale multiply round as
 * the reference's scalar operations do under any MXCSR; only the encoders' own rounding is
 * pinned to nearest even, as the reference's integer encoders are. */
static void test_mxcsr(void) {
    static const unsigned modes[] = {0x8040u, 0x6000u, 0x4000u};
    const int64_t R = 33, C = 70;
    float *f = malloc((size_t) (R * C) * sizeof *f);
    for (int mi = 0; mi < 3; mi++) {
        gen(f, R, C, mi == 0 ? -130 : 3 * mi, 1); /* -130: blocks of binary32 subnormals */
        for (int xi = 0; xi < 2; xi++) {
            const lowp_format xf = xi ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
            void *data = as_format(f, (size_t) (R * C), xf);
            lowp_tensor x = {xf, R, C, data, LOWP_DEVICE_HOST};
            for (int s = 0; s < 2; s++) {
                const unsigned csr = _mm_getcsr();
                _mm_setcsr((csr & ~0x6000u) | modes[mi]);
                for (int orient = 1; orient <= 3; orient++)
                    check_case(&x, s ? LOWP_SCALING_NV16X16 : LOWP_SCALING_NV16, orient, 1);
                _mm_setcsr(csr);
            }
            free(data);
        }
    }
    free(f);
}
#else
static void test_mxcsr(void) {}
#endif

/* Whether `path` takes an NV16 job here (unsupported: prints why). */
static int path_available(lowp_kernel_path path) {
    float v[16] = {1.0f};
    uint8_t code[8], scale[8];
    lowp_tensor x = {LOWP_FORMAT_F32, 1, 16, v, LOWP_DEVICE_HOST};
    lowp_qtensor row = {
        LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, 1, 16, code, scale, LOWP_DEVICE_HOST, NULL, 0};
    lowp_quant_cfg cfg;
    lowp_quant_cfg_init(&cfg);
    cfg.path = path;
    lowp_status st = lowp_quantize(&x, &row, NULL, &cfg);
    if (st != LOWP_OK) printf("path %d: %s\n", (int) path, lowp_last_error());
    return st == LOWP_OK;
}

int main(void) {
    tu_seed(0x9E3779B97F4A7C15ull);
    const uint32_t avx2 = LOWP_CAP_AVX2 | LOWP_CAP_FMA;
    if (!lowp_cpu_has_avx512()) {
        g_path = LOWP_KERNEL_PATH_AVX2;
        g_name = "avx2";
    }
    if (!path_available(g_path)) {
        /* a CPU with neither kernel's instructions; a refusal on one that has them fails */
        CHECKF((lowp_cpu_caps()->flags & avx2) != avx2, "the %s path refuses NVFP4", g_name);
        return testutil_finish();
    }
    printf("testing the %s kernel\n", g_name);
    test_shapes();
    test_special_tensors();
    test_grouped(); /* RNE here on both paths; under SR (test_sr) on the AVX-512 one only */
    if (g_path == LOWP_KERNEL_PATH_AVX512) test_sr();
    test_mxcsr();
    printf("%d quantize calls compared with the reference\n", g_runs);
    return testutil_finish();
}
