/* The fast CPU GEMM kernels (AVX-512 SGEMM, the blocked BF16 driver on its VDPBF16PS, IEEE
 * binary32 and AMX micro-kernels, the AVX2 kernel) against the scalar reference
 * (docs/numerics.md section 6): for every operand pair and element format, relative Frobenius
 * error <= 1e-5 of ||C|| and NaN/Inf in exactly the reference's positions (the AVX2 kernel on
 * 8-bit and 4-bit elements: the reference's bits), on awkward shapes, with accumulate and BF16
 * output, on 1 and 2 threads, for split-M and split-K grouped GEMMs, with NaN/Inf inputs and blocks
 * of extreme scale. The AMX kernel also runs here under a scalar model of the tile instructions
 * (this file includes src/cpu/gemm_amx.c with LOWP_AMX_EMULATE), so its layouts are tested on
 * machines without AMX; the real one runs where AMX is granted. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/gemm_blk.h"
#include "lowp/lowp.h"
#include "lowp/gemm.h"
#include "gemm_testutil.h"
#include "testutil.h"

#define LOWP_AMX_EMULATE 1
#include "cpu/gemm_amx.c"

/* What to plant in an operand's float input before quantizing it. */
enum {
    SPICE_NONE = 0,
    SPICE_NANINF = 1,    /* a few NaN, +Inf, -Inf elements */
    SPICE_EXTREME = 2,   /* some 32-column blocks scaled by 1e-38, 1e-30, 1e-12 or 1e30 */
    SPICE_DENORM = 4,    /* plain BF16: some denormal elements */
    SPICE_TINY = 8,      /* every element scaled by 1e-20 (products near the denormals) */
    SPICE_SUBSCALE = 16, /* a few 32-column blocks scaled by 1e-38 (MX scale code 0, nonzero) */
};

static void spice(float *x, int64_t rows, int64_t cols, int how) {
    if (how & SPICE_TINY)
        for (int64_t i = 0; i < rows * cols; i++) x[i] *= 1e-20f;
    if (how & SPICE_EXTREME)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c0 = 0; c0 < cols; c0 += 32) {
                double u = urand();
                float s = u < 0.04   ? 1e-38f
                          : u < 0.08 ? 1e-30f
                          : u < 0.16 ? 1e30f
                          : u < 0.2  ? 1e-12f
                                     : 1.0f;
                for (int64_t c = c0; c < c0 + 32 && c < cols; c++) x[r * cols + c] *= s;
            }
    if (how & SPICE_SUBSCALE)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c0 = 0; c0 < cols; c0 += 32)
                if (urand() < 0.05)
                    for (int64_t c = c0; c < c0 + 32 && c < cols; c++) x[r * cols + c] *= 1e-38f;
    if (how & SPICE_DENORM)
        for (int64_t i = 0; i < rows * cols; i++)
            if (urand() < 0.05) x[i] = (float) (urand() - 0.5) * 1e-39f;
    if ((how & SPICE_NANINF) && rows * cols > 0) {
        const int n = 1 + (int) (rows * cols / 4000);
        for (int t = 0; t < n; t++) {
            int64_t i = (int64_t) (urand() * (double) (rows * cols));
            x[i] = t % 3 == 0 ? NAN : t % 3 == 1 ? INFINITY : -INFINITY;
        }
    }
}

static operand make(lowp_format fmt, lowp_scaling sc, int64_t rows, int64_t cols, int how) {
    operand o = operand_gauss(rows, cols, 6.0f);
    spice(o.src, rows, cols, how);
    operand_quantize(&o, fmt, sc, 64, 64);
    return o;
}

/* Plant raw special codes (NaN, and Inf for E5M2) with whatever scale their block has. */
static void poke_codes(operand *o) {
    const lowp_format f = o->q.format;
    if (f != LOWP_FORMAT_E4M3 && f != LOWP_FORMAT_E5M2) return;
    uint8_t *d = o->q.data;
    const int64_t n = o->q.rows * o->q.cols;
    for (int t = 0; t < 3 && n > 0; t++) {
        int64_t i = (int64_t) (urand() * (double) n);
        d[i] = f == LOWP_FORMAT_E4M3 ? 0x7F : (t == 0 ? 0x7E : t == 1 ? 0x7C : 0xFC);
    }
}

/* ---- comparison ---- */

static float c_at(const lowp_tensor *c, int64_t i) {
    if (c->format == LOWP_FORMAT_F32) return ((const float *) c->data)[i];
    return lowp_u2f((uint32_t) ((const uint16_t *) c->data)[i] << 16);
}

/* fast vs ref: NaN and +-Inf in the same places; relative Frobenius error of the finite rest
 * <= 1e-5 of ||ref||. For BF16 outputs, elements one BF16 step apart (a rounding boundary
 * between two binary32 sums that differ in the last bits) are allowed, up to 1%. */
static int compare(const char *what, const lowp_tensor *fast, const lowp_tensor *ref) {
    const int64_t n = ref->rows * ref->cols;
    double num = 0, den = 0;
    int64_t badpos = 0, flips = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        float f = c_at(fast, i), r = c_at(ref, i);
        if (isnan(r) || isnan(f) || isinf(r) || isinf(f)) {
            int same = (isnan(r) && isnan(f)) || (isinf(r) && isinf(f) && (r > 0) == (f > 0));
            if (!same) {
                if (first < 0) first = i;
                badpos++;
            }
            continue;
        }
        double d = (double) f - (double) r;
        if (ref->format == LOWP_FORMAT_BF16 && d != 0) {
            uint32_t uf = lowp_f2u(f) >> 16, ur = lowp_f2u(r) >> 16;
            if (uf + 1 == ur || ur + 1 == uf) {
                flips++;
                continue;
            }
        }
        num += d * d;
        den += (double) r * r;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = badpos == 0 && rel <= 1e-5 && flips * 100 <= n + 1;
    CHECKF(ok,
           "%s: rel err %.3g, %lld NaN/Inf mismatches (first at %lld: fast %g ref %g), %lld flips",
           what, rel, (long long) badpos, (long long) first,
           first >= 0 ? (double) c_at(fast, first) : 0.0,
           first >= 0 ? (double) c_at(ref, first) : 0.0, (long long) flips);
    return ok;
}

/* The AVX2 kernel on 8-bit and 4-bit elements sums as the reference does, and their products
 * are exact: every element that is not NaN has the reference's bits. */
static void check_bits(const char *what, const lowp_tensor *fast, const lowp_tensor *ref) {
    const int64_t n = ref->rows * ref->cols;
    int64_t diff = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        const float f = c_at(fast, i), r = c_at(ref, i);
        if ((isnan(f) && isnan(r)) || memcmp(&f, &r, sizeof f) == 0) continue;
        if (first < 0) first = i;
        diff++;
    }
    CHECKF(diff == 0, "%s: %lld elements differ from the reference's bits (first at %lld: %a %a)",
           what, (long long) diff, (long long) first, first >= 0 ? (double) c_at(fast, first) : 0.0,
           first >= 0 ? (double) c_at(ref, first) : 0.0);
}

static int narrow(lowp_format f) {
    return f != LOWP_FORMAT_F32 && f != LOWP_FORMAT_BF16;
}

/* ---- runners ---- */

typedef enum runner {
    RUN_AVX512,   /* lowp_cpu_gemm, path AVX512 */
    RUN_AMX,      /* lowp_cpu_gemm, path AMX */
    RUN_AMX_EMU,  /* the AMX kernel on the scalar tile model, one job */
    RUN_F32X,     /* the driver on the FMA micro-kernel (no AVX512_BF16), small B blocks */
    RUN_DP_SMALL, /* the driver on the VDPBF16PS micro-kernel, small B blocks, one job */
    RUN_AVX2,     /* lowp_cpu_gemm, path AVX2 */
} runner;

static const char *runner_name(runner r) {
    switch (r) {
    case RUN_AVX512: return "avx512";
    case RUN_AMX: return "amx";
    case RUN_AMX_EMU: return "amx-emu";
    case RUN_F32X: return "fma-small";
    case RUN_AVX2: return "avx2";
    default: return "dp-small";
    }
}

static int g_have_avx512, g_have_amx, g_have_bf16, g_have_avx2;

/* b_kn: b is given [K, N] (lowp_gemm_kn). */
static void job_of(lowp_gemm_job *j, const lowp_qtensor *a, const lowp_qtensor *b, int b_kn,
                   lowp_tensor *c, int accumulate) {
    memset(j, 0, sizeof *j);
    j->a = a;
    j->b = b;
    j->b_kn = b_kn;
    j->c = c;
    j->accumulate = accumulate;
    lowp_gemm_classify("test", a, b, &j->pair, &j->bk);
    j->m1 = a->rows;
    j->n1 = b_kn ? b->cols : b->rows;
    j->k1 = a->cols;
}

static float *ws_alloc(size_t floats) {
    return aligned_alloc(64, ((floats + 16) * sizeof(float) + 63) / 64 * 64);
}

static lowp_status run_kn(runner r, const lowp_qtensor *a, const lowp_qtensor *b, int b_kn,
                          lowp_tensor *c, int accumulate, int threads) {
    lowp_gemm_cfg cfg;
    lowp_gemm_cfg_init(&cfg);
    cfg.accumulate = accumulate;
    cfg.threads = threads;
    if (r == RUN_AVX512 || r == RUN_AMX || r == RUN_AVX2) {
        cfg.path = r == RUN_AVX512 ? LOWP_KERNEL_PATH_AVX512
                   : r == RUN_AMX  ? LOWP_KERNEL_PATH_AMX
                                   : LOWP_KERNEL_PATH_AVX2;
        return lowp_cpu_gemm(a, b, b_kn, c, &cfg);
    }
    lowp_gemm_job j;
    job_of(&j, a, b, b_kn, c, accumulate);
    if (r == RUN_AMX_EMU) {
        if (!lowp_cpu_gemm_amx_supports_emu(&j)) return LOWP_ERR_UNSUPPORTED;
        j.ws = ws_alloc(lowp_cpu_gemm_amx_ws_floats_emu(&j));
        lowp_cpu_gemm_amx_emu(&j);
    } else {
        /* 8 KiB of packed B per block: several column blocks even on small shapes; up to
         * 16 KiB in one block when that holds all the columns (whole_n_bytes). */
        lowp_gemm_blk_kernel k = {r == RUN_F32X ? lowp_gemm_micro_f32fma : lowp_gemm_micro_dpbf16,
                                  lowp_gemm_micro_f32x,
                                  4,
                                  8192,
                                  0,
                                  16384};
        if (!lowp_gemm_blk_supports(&j)) return LOWP_ERR_UNSUPPORTED;
        j.ws = ws_alloc(lowp_gemm_blk_ws_floats(&j, &k));
        lowp_gemm_blk_run(&j, &k);
    }
    free(j.ws);
    return LOWP_OK;
}

static lowp_status run(runner r, const lowp_qtensor *a, const lowp_qtensor *b, lowp_tensor *c,
                       int accumulate, int threads) {
    return run_kn(r, a, b, 0, c, accumulate, threads);
}

static int runner_ok(runner r, const lowp_qtensor *a) {
    switch (r) {
    case RUN_AVX512: return g_have_avx512;
    case RUN_AMX: return g_have_amx && a->format != LOWP_FORMAT_F32;
    case RUN_AMX_EMU: return g_have_avx512 && a->format != LOWP_FORMAT_F32;
    case RUN_F32X: return g_have_avx512 && a->format != LOWP_FORMAT_F32;
    case RUN_AVX2: return g_have_avx2;
    default: return g_have_avx512 && g_have_bf16 && a->format != LOWP_FORMAT_F32;
    }
}

/* An IEEE binary32 job has no AMX kernel (the tiles multiply BF16 only): the AMX path must
 * refuse it with LOWP_ERR_UNSUPPORTED and a message naming cfg.path, and leave C as it was. */
static void amx_refuses_f32(lowp_status st, const lowp_tensor *c, const lowp_tensor *before,
                            const char *what) {
    const size_t bytes = (size_t) (c->rows * c->cols) * (c->format == LOWP_FORMAT_F32 ? 4 : 2);
    CHECKF(st == LOWP_ERR_UNSUPPORTED && strstr(lowp_last_error(), "cfg.path") != NULL,
           "%s: the AMX path gave status %d (%s), not LOWP_ERR_UNSUPPORTED naming cfg.path", what,
           (int) st, lowp_last_error());
    CHECKF(memcmp(c->data, before->data, bytes) == 0, "%s: a refused AMX call changed C", what);
}

static void fill_c(lowp_tensor *c) {
    const int64_t n = c->rows * c->cols;
    for (int64_t i = 0; i < n; i++) {
        float v = gauss();
        if (c->format == LOWP_FORMAT_F32)
            ((float *) c->data)[i] = v;
        else
            ((uint16_t *) c->data)[i] = (uint16_t) (lowp_f2u(v) >> 16);
    }
}

static int g_cases;

/* One GEMM on every available runner against the reference. */
static void check_gemm(const char *name, const lowp_qtensor *a, const lowp_qtensor *b,
                       lowp_format cfmt, int accumulate, int threads, int emu) {
    const int64_t M = a->rows, N = b->rows;
    const size_t es = cfmt == LOWP_FORMAT_F32 ? 4 : 2;
    lowp_tensor init = {cfmt, M, N, malloc(es * (size_t) (M * N) + 4), LOWP_DEVICE_HOST};
    lowp_tensor ref = init, fast = init;
    ref.data = malloc(es * (size_t) (M * N) + 4);
    fast.data = malloc(es * (size_t) (M * N) + 4);
    fill_c(&init);
    memcpy(ref.data, init.data, es * (size_t) (M * N));
    lowp_gemm_cfg cfg;
    lowp_gemm_cfg_init(&cfg);
    cfg.accumulate = accumulate;
    cfg.path = LOWP_KERNEL_PATH_REFERENCE;
    CHECK(lowp_cpu_gemm(a, b, 0, &ref, &cfg) == LOWP_OK);
    for (runner r = RUN_AVX512; r <= RUN_AVX2; r++) {
        if (!runner_ok(r, a)) continue;
        if (r == RUN_AMX_EMU && !emu) continue;
        memcpy(fast.data, init.data, es * (size_t) (M * N));
        lowp_status st = run(r, a, b, &fast, accumulate, threads);
        char what[256];
        snprintf(what, sizeof what, "%s %s M=%lld N=%lld K=%lld acc=%d out=%s threads=%d", name,
                 runner_name(r), (long long) M, (long long) N, (long long) a->cols, accumulate,
                 cfmt == LOWP_FORMAT_F32 ? "f32" : "bf16", threads);
        CHECKF(st == LOWP_OK, "%s: %s", what, lowp_last_error());
        if (st == LOWP_OK) compare(what, &fast, &ref);
        if (st == LOWP_OK && r == RUN_AVX2 && narrow(a->format)) check_bits(what, &fast, &ref);
        g_cases++;
    }
    free(init.data);
    free(ref.data);
    free(fast.data);
}

/* ---- the pairs ---- */

typedef struct pair_spec {
    const char *name;
    lowp_format fa, fb;
    lowp_scaling sa, sb;
} pair_spec;

static const pair_spec PAIRS[] = {
    {"plain f32", LOWP_FORMAT_F32, LOWP_FORMAT_F32, LOWP_SCALING_NONE, LOWP_SCALING_NONE},
    {"plain bf16", LOWP_FORMAT_BF16, LOWP_FORMAT_BF16, LOWP_SCALING_NONE, LOWP_SCALING_NONE},
    {"tensor e4m3 x e4m3", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR,
     LOWP_SCALING_TENSOR},
    {"tensor e5m2 x e4m3", LOWP_FORMAT_E5M2, LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR,
     LOWP_SCALING_TENSOR},
    {"tensor e4m3 x e5m2", LOWP_FORMAT_E4M3, LOWP_FORMAT_E5M2, LOWP_SCALING_TENSOR,
     LOWP_SCALING_TENSOR},
    {"row e4m3 x e4m3", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_ROW, LOWP_SCALING_ROW},
    {"row e5m2 x e5m2", LOWP_FORMAT_E5M2, LOWP_FORMAT_E5M2, LOWP_SCALING_ROW, LOWP_SCALING_ROW},
    {"mx e4m3", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, LOWP_SCALING_MX32},
    {"mx e5m2", LOWP_FORMAT_E5M2, LOWP_FORMAT_E5M2, LOWP_SCALING_MX32, LOWP_SCALING_MX32},
    {"mx e2m1", LOWP_FORMAT_E2M1, LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, LOWP_SCALING_MX32},
    {"mx e4m3 x e2m1", LOWP_FORMAT_E4M3, LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, LOWP_SCALING_MX32},
    {"mx e2m1 x e5m2", LOWP_FORMAT_E2M1, LOWP_FORMAT_E5M2, LOWP_SCALING_MX32, LOWP_SCALING_MX32},
    {"mx e4m3 x b32 e4m3", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32,
     LOWP_SCALING_BLOCK32X32},
    {"mx e2m1 x b32 e5m2", LOWP_FORMAT_E2M1, LOWP_FORMAT_E5M2, LOWP_SCALING_MX32,
     LOWP_SCALING_BLOCK32X32},
    {"b128 e4m3 x w e4m3", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128,
     LOWP_SCALING_BLOCK128X128},
    {"b128 e5m2 x w e4m3", LOWP_FORMAT_E5M2, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128,
     LOWP_SCALING_BLOCK128X128},
    {"b128 e4m3 x b128 e4m3", LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128,
     LOWP_SCALING_BLOCK128},
    {"nv16 x nv16", LOWP_FORMAT_E2M1, LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, LOWP_SCALING_NV16},
    {"nv16 x nv16x16", LOWP_FORMAT_E2M1, LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, LOWP_SCALING_NV16X16},
    {"nv16x16 x nv16", LOWP_FORMAT_E2M1, LOWP_FORMAT_E2M1, LOWP_SCALING_NV16X16, LOWP_SCALING_NV16},
};
#define NPAIRS ((int) (sizeof PAIRS / sizeof PAIRS[0]))

static const int64_t DIMS[] = {1, 17, 33, 127, 129, 300};

/* Every dimension takes every value of DIMS across the shapes of a pair. */
static void shapes_for(int pi, int s, int64_t *M, int64_t *N, int64_t *K) {
    *M = DIMS[(s + pi) % 6];
    *N = DIMS[(2 * s + 1 + pi) % 6];
    *K = DIMS[(3 * s + 2 + 2 * pi) % 6 == 0 ? 5 : (3 * s + 2 + 2 * pi) % 6];
    if (s == 6) *K = DIMS[0];
}

static void test_pairs(void) {
    const int quick = testutil_quick();
    const int nshapes = quick ? 3 : 7;
    for (int pi = 0; pi < NPAIRS; pi++) {
        const pair_spec *p = &PAIRS[pi];
        for (int s = 0; s < nshapes; s++) {
            int64_t M, N, K;
            shapes_for(pi, s, &M, &N, &K);
            operand a = make(p->fa, p->sa, M, K, SPICE_NONE);
            operand b = make(p->fb, p->sb, N, K, SPICE_NONE);
            const int emu = M * N * K <= (quick ? 300000 : 3000000);
            check_gemm(p->name, &a.q, &b.q, LOWP_FORMAT_F32, s & 1, 1 + (s & 1), emu);
            check_gemm(p->name, &a.q, &b.q, LOWP_FORMAT_BF16, !(s & 1), 2 - (s & 1), 0);
            operand_drop(&a);
            operand_drop(&b);
        }
    }
}

/* NaN/Inf inputs and extreme-scale blocks, on both operands or one. */
static void test_specials(void) {
    const int quick = testutil_quick();
    const int64_t M = quick ? 65 : 129, N = quick ? 67 : 97, K = quick ? 161 : 300;
    for (int pi = 0; pi < NPAIRS; pi++) {
        const pair_spec *p = &PAIRS[pi];
        const int plain = p->sa == LOWP_SCALING_NONE;
        /* #5: scale-code-0 blocks with no NaN code beside them (#4 plants NaN codes, which
         * keep every strip they touch off the folded path), so that a strip's fold window
         * must see them. */
        const int hows[] = {SPICE_NANINF,
                            SPICE_EXTREME,
                            SPICE_EXTREME | SPICE_NANINF,
                            plain ? SPICE_DENORM : SPICE_EXTREME,
                            plain ? SPICE_TINY : SPICE_SUBSCALE,
                            plain ? SPICE_NONE : SPICE_SUBSCALE};
        for (int h = 0; h < 6; h++) {
            const int ha = hows[h], hb = h == 3 ? SPICE_NONE : hows[h];
            operand a = make(p->fa, p->sa, M, K, ha);
            operand b = make(p->fb, p->sb, N, K, hb);
            if (h == 4) {
                poke_codes(&a);
                poke_codes(&b);
            }
            char name[128];
            snprintf(name, sizeof name, "%s specials#%d", p->name, h);
            check_gemm(name, &a.q, &b.q, h & 1 ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32, h & 1,
                       1 + (h & 1), h < 2);
            operand_drop(&a);
            operand_drop(&b);
        }
    }
    /* Denormal plain BF16 against Inf: the fast kernels would read the denormal as zero and
     * give NaN (Inf * 0) where the reference gives Inf. */
    {
        operand a = make(LOWP_FORMAT_BF16, LOWP_SCALING_NONE, 33, 64, SPICE_NONE);
        operand b = make(LOWP_FORMAT_BF16, LOWP_SCALING_NONE, 17, 64, SPICE_NONE);
        uint16_t *ad = a.q.data, *bd = b.q.data;
        for (int k = 0; k < 64; k++) ad[5 * 64 + k] = 0x0001; /* row 5: all denormal */
        bd[3 * 64 + 10] = 0x7F80;                             /* B[3][10] = +Inf */
        check_gemm("plain bf16 denormal x inf", &a.q, &b.q, LOWP_FORMAT_F32, 0, 1, 1);
        operand_drop(&a);
        operand_drop(&b);
    }
}

/* offs[g] = the cumulative ends of groups of the given sizes; returns their total. */
static int64_t group_offs(const int32_t *sizes, int G, int32_t *offs) {
    int64_t M = 0;
    for (int g = 0; g < G; g++) offs[g] = (int32_t) (M += sizes[g]);
    return M;
}

/* Split-M grouped GEMM (MoE forward) of groups of the given sizes (G <= 7), for the pairs
 * PAIRS[picks[i]], against the reference kernel on one thread. */
static void grouped_case(const int32_t *sizes, int G, int64_t N, int64_t K, const int *picks,
                         int npicks) {
    int32_t offs[7];
    const int64_t M = group_offs(sizes, G, offs);
    const int64_t Mtot = M + 5; /* 5 rows past offs[G-1]: left untouched */
    for (int pi = 0; pi < npicks; pi++) {
        const pair_spec *p = &PAIRS[picks[pi]];
        operand a = make(p->fa, p->sa, Mtot, K, SPICE_NONE);
        operand b[7];
        lowp_qtensor bq[7];
        for (int g = 0; g < G; g++) {
            b[g] = make(p->fb, p->sb, N, K, g == 5 ? SPICE_EXTREME : SPICE_NONE);
            bq[g] = b[g].q;
        }
        for (int acc = 0; acc < 2; acc++) {
            const lowp_format cf = acc ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
            const size_t es = acc ? 2 : 4;
            lowp_tensor ref = {cf, Mtot, N, malloc(es * (size_t) (Mtot * N)), LOWP_DEVICE_HOST};
            lowp_tensor fast = ref;
            fast.data = malloc(es * (size_t) (Mtot * N));
            fill_c(&ref);
            lowp_gemm_cfg cfg;
            lowp_gemm_cfg_init(&cfg);
            cfg.accumulate = acc;
            for (int path = 0; path < 3; path++) {
                if (path == 0 && !g_have_avx512) continue;
                if (path == 1 && !g_have_amx) continue;
                if (path == 2 && !g_have_avx2) continue;
                memcpy(fast.data, ref.data, es * (size_t) (Mtot * N));
                lowp_tensor r2 = ref;
                r2.data = malloc(es * (size_t) (Mtot * N));
                memcpy(r2.data, ref.data, es * (size_t) (Mtot * N));
                cfg.path = LOWP_KERNEL_PATH_REFERENCE;
                cfg.threads = 1;
                CHECK(lowp_cpu_grouped_gemm(&a.q, bq, 0, offs, G, &r2, &cfg) == LOWP_OK);
                cfg.path = path == 0   ? LOWP_KERNEL_PATH_AVX512
                           : path == 1 ? LOWP_KERNEL_PATH_AMX
                                       : LOWP_KERNEL_PATH_AVX2;
                cfg.threads = 2 - acc;
                CHECK(lowp_cpu_grouped_gemm(&a.q, bq, 0, offs, G, &fast, &cfg) == LOWP_OK);
                char what[160];
                snprintf(what, sizeof what, "grouped %s %s acc=%d", p->name,
                         path == 0   ? "avx512"
                         : path == 1 ? "amx"
                                     : "avx2",
                         acc);
                compare(what, &fast, &r2);
                if (path == 2 && narrow(p->fa)) check_bits(what, &fast, &r2);
                /* Rows past offs[G-1] keep their old values. */
                CHECKF(memcmp((char *) fast.data + es * (size_t) (M * N),
                              (char *) ref.data + es * (size_t) (M * N), es * 5 * (size_t) N) == 0,
                       "%s: rows past the last group changed", what);
                free(r2.data);
                g_cases++;
            }
            free(ref.data);
            free(fast.data);
        }
        operand_drop(&a);
        for (int g = 0; g < G; g++) operand_drop(&b[g]);
    }
}

/* Empty groups and groups of 1, 31, 33 and 100 rows; then groups large enough for two
 * threads, the largest not first, so that the pieces run largest first (gemm.c's run_jobs)
 * in another order than the groups'. */
static void test_grouped(void) {
    const int32_t small[] = {0, 1, 31, 0, 33, 100, 0};
    const int picks[] = {1, 2, 7, 9, 12, 14, 17, 18};
    grouped_case(small, 7, 70, 129, picks, 8);
    const int32_t large[] = {700, 3, 0, 1200, 64, 333, 31};
    const int lpicks[] = {1, 7, 18};
    grouped_case(large, 7, 256, 96, lpicks, 3);
}

/* Split-K grouped GEMM (MoE weight gradient): k0 != 0, block offsets, short last blocks,
 * empty groups, odd group starts (E2M1 nibbles). */
/* One wgrad operand pair (a = dY^T [N, Mtot], b = X^T [K, Mtot]) on the fast paths against
 * the reference, into F32 and (accumulating) BF16. */
static void check_wgrad_pair(const lowp_qtensor *qa, const lowp_qtensor *qb, const int32_t *offs,
                             int G, int64_t N, int64_t K) {
    for (int acc = 0; acc < 2; acc++) {
        const lowp_format cf = acc ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
        const size_t es = acc ? 2 : 4, cn = (size_t) (G * N * K);
        lowp_tensor ref = {cf, G * N, K, malloc(es * cn), LOWP_DEVICE_HOST};
        lowp_tensor fast = ref;
        fast.data = malloc(es * cn);
        fill_c(&ref);
        memcpy(fast.data, ref.data, es * cn);
        lowp_gemm_cfg cfg;
        lowp_gemm_cfg_init(&cfg);
        cfg.accumulate = acc;
        cfg.path = LOWP_KERNEL_PATH_REFERENCE;
        CHECKF(lowp_cpu_grouped_gemm_wgrad(qa, qb, 0, offs, G, &ref, &cfg) == LOWP_OK, "%s",
               lowp_last_error());
        for (int path = 0; path < 3; path++) {
            if (path == 0 && !g_have_avx512) continue;
            if (path == 1 && !g_have_amx) continue;
            if (path == 2 && !g_have_avx2) continue;
            lowp_tensor f2 = fast;
            f2.data = malloc(es * cn);
            memcpy(f2.data, fast.data, es * cn);
            cfg.path = path == 0   ? LOWP_KERNEL_PATH_AVX512
                       : path == 1 ? LOWP_KERNEL_PATH_AMX
                                   : LOWP_KERNEL_PATH_AVX2;
            cfg.threads = 1 + acc;
            if (path == 1 && qa->format == LOWP_FORMAT_F32) {
                amx_refuses_f32(lowp_cpu_grouped_gemm_wgrad(qa, qb, 0, offs, G, &f2, &cfg), &f2,
                                &fast, "wgrad f32");
                free(f2.data);
                continue;
            }
            CHECKF(lowp_cpu_grouped_gemm_wgrad(qa, qb, 0, offs, G, &f2, &cfg) == LOWP_OK, "%s",
                   lowp_last_error());
            char what[160];
            snprintf(what, sizeof what, "wgrad %s %s %s acc=%d",
                     qa->format == LOWP_FORMAT_BF16   ? "bf16"
                     : qa->format == LOWP_FORMAT_F32  ? "f32"
                     : qa->format == LOWP_FORMAT_E4M3 ? "e4m3"
                     : qa->format == LOWP_FORMAT_E5M2 ? "e5m2"
                                                      : "e2m1",
                     lowp_scaling_name(qa->scaling),
                     path == 0   ? "avx512"
                     : path == 1 ? "amx"
                                 : "avx2",
                     acc);
            compare(what, &f2, &ref);
            if (path == 2 && narrow(qa->format)) check_bits(what, &f2, &ref);
            free(f2.data);
            g_cases++;
        }
        free(ref.data);
        free(fast.data);
    }
}

static void test_wgrad(void) {
    const int32_t sizes[] = {40, 0, 1, 33, 100, 31};
    const int G = (int) (sizeof sizes / sizeof sizes[0]);
    int32_t offs[6];
    const int64_t M = group_offs(sizes, G, offs);
    const int64_t Mtot = M + 3, N = 47, K = 65;
    const struct {
        lowp_format f;
        lowp_scaling s;
    } kinds[] = {{LOWP_FORMAT_BF16, LOWP_SCALING_NONE}, {LOWP_FORMAT_F32, LOWP_SCALING_NONE},
                 {LOWP_FORMAT_E4M3, LOWP_SCALING_MX32}, {LOWP_FORMAT_E2M1, LOWP_SCALING_MX32},
                 {LOWP_FORMAT_E5M2, LOWP_SCALING_MX32}, {LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128},
                 {LOWP_FORMAT_E2M1, LOWP_SCALING_NV16}};
    for (int ki = 0; ki < (int) (sizeof kinds / sizeof kinds[0]); ki++) {
        /* dY [Mtot, N] and X [Mtot, K] -> a = dY^T [N, Mtot], b = X^T [K, Mtot]. */
        float *dy = malloc(sizeof(float) * (size_t) (Mtot * N));
        float *xx = malloc(sizeof(float) * (size_t) (Mtot * K));
        for (int64_t i = 0; i < Mtot * N; i++) dy[i] = gauss();
        for (int64_t i = 0; i < Mtot * K; i++) xx[i] = gauss();
        if (ki == 1) spice(xx, Mtot, K, SPICE_EXTREME);
        lowp_qtensor qa = {kinds[ki].f, kinds[ki].s,      N,    Mtot, NULL,
                           NULL,        LOWP_DEVICE_HOST, NULL, 0};
        lowp_qtensor qb = {kinds[ki].f, kinds[ki].s,      K,    Mtot, NULL,
                           NULL,        LOWP_DEVICE_HOST, NULL, 0};
        lowp_tensor tdy = {LOWP_FORMAT_F32, Mtot, N, dy, LOWP_DEVICE_HOST};
        lowp_tensor tx = {LOWP_FORMAT_F32, Mtot, K, xx, LOWP_DEVICE_HOST};
        if (kinds[ki].s == LOWP_SCALING_NONE) {
            /* Plain: the transposes, cast to the format. */
            float *t = malloc(sizeof(float) * (size_t) (Mtot * (N > K ? N : K)));
            const size_t es = kinds[ki].f == LOWP_FORMAT_F32 ? 4 : 2;
            qa.data = malloc(es * (size_t) (N * Mtot));
            qb.data = malloc(es * (size_t) (K * Mtot));
            for (int64_t r = 0; r < N; r++)
                for (int64_t c = 0; c < Mtot; c++) t[r * Mtot + c] = dy[c * N + r];
            lowp_tensor s1 = {LOWP_FORMAT_F32, N, Mtot, t, LOWP_DEVICE_HOST};
            lowp_tensor d1 = {kinds[ki].f, N, Mtot, qa.data, LOWP_DEVICE_HOST};
            CHECK(lowp_cast(&s1, &d1, NULL) == LOWP_OK);
            for (int64_t r = 0; r < K; r++)
                for (int64_t c = 0; c < Mtot; c++) t[r * Mtot + c] = xx[c * K + r];
            lowp_tensor s2 = {LOWP_FORMAT_F32, K, Mtot, t, LOWP_DEVICE_HOST};
            lowp_tensor d2 = {kinds[ki].f, K, Mtot, qb.data, LOWP_DEVICE_HOST};
            CHECK(lowp_cast(&s2, &d2, NULL) == LOWP_OK);
            free(t);
        } else {
            qa.group_offs = qb.group_offs = offs;
            qa.groups = qb.groups = G;
            size_t db, sb;
            CHECK(lowp_qtensor_nbytes(&qa, &db, &sb) == LOWP_OK);
            qa.data = malloc(db + 64);
            qa.scales = malloc(sb + 64);
            CHECK(lowp_qtensor_nbytes(&qb, &db, &sb) == LOWP_OK);
            qb.data = malloc(db + 64);
            qb.scales = malloc(sb + 64);
            CHECKF(lowp_quantize_grouped(&tdy, NULL, &qa, NULL) == LOWP_OK, "%s",
                   lowp_last_error());
            CHECKF(lowp_quantize_grouped(&tx, NULL, &qb, NULL) == LOWP_OK, "%s", lowp_last_error());
        }
        check_wgrad_pair(&qa, &qb, offs, G, N, K);
        free(qa.data);
        free(qa.scales);
        free(qb.data);
        free(qb.scales);
        free(dy);
        free(xx);
    }
}

/* The split-K jobs on the emulated AMX kernel and the small-block driver: the same wgrad,
 * one job per group, against the reference job. */
static void test_wgrad_jobs(void) {
    const int32_t sizes[] = {7, 45, 0, 64};
    int64_t start = 0, blk = 0;
    const int64_t Mtot = 116, N = 33, K = 40;
    operand a = make(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, N, Mtot, SPICE_NONE);
    operand b = make(LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, K, Mtot, SPICE_NONE);
    /* Regroup the scales: quantize again per group so blocks restart at group starts. */
    int32_t offs[4];
    int64_t m = 0;
    for (int g = 0; g < 4; g++) offs[g] = (int32_t) (m += sizes[g]);
    lowp_qtensor qa = a.q, qb = b.q;
    qa.group_offs = qb.group_offs = offs;
    qa.groups = qb.groups = 4;
    size_t db, sb;
    lowp_qtensor_nbytes(&qa, &db, &sb);
    qa.scales = malloc(sb + 64);
    qa.data = malloc(db + 64);
    lowp_qtensor_nbytes(&qb, &db, &sb);
    qb.scales = malloc(sb + 64);
    qb.data = malloc(db + 64);
    float *ta = malloc(sizeof(float) * (size_t) (N * Mtot)),
          *tb = malloc(sizeof(float) * (size_t) (K * Mtot));
    for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < Mtot; c++) ta[c * N + r] = a.src[r * Mtot + c];
    for (int64_t r = 0; r < K; r++)
        for (int64_t c = 0; c < Mtot; c++) tb[c * K + r] = b.src[r * Mtot + c];
    lowp_tensor xa = {LOWP_FORMAT_F32, Mtot, N, ta, LOWP_DEVICE_HOST};
    lowp_tensor xb = {LOWP_FORMAT_F32, Mtot, K, tb, LOWP_DEVICE_HOST};
    CHECK(lowp_quantize_grouped(&xa, NULL, &qa, NULL) == LOWP_OK);
    CHECK(lowp_quantize_grouped(&xb, NULL, &qb, NULL) == LOWP_OK);
    for (int g = 0; g < 4; g++) {
        const int64_t end = offs[g];
        float *cr = calloc((size_t) (N * K), sizeof(float)), *cf = calloc((size_t) (N * K), 4);
        lowp_tensor ref = {LOWP_FORMAT_F32, N, K, cr, LOWP_DEVICE_HOST}, fast = ref;
        fast.data = cf;
        for (runner r = RUN_AMX_EMU; r <= RUN_AVX2; r++) {
            if (!runner_ok(r, &qa)) continue;
            lowp_gemm_job j;
            job_of(&j, &qa, &qb, 0, &ref, 0);
            j.k0 = start;
            j.k1 = end;
            j.a_blk = j.b_blk = blk;
            j.ws = ws_alloc(lowp_gemm_ref_ws_floats(&j));
            lowp_cpu_gemm_ref(&j);
            free(j.ws);
            j.c = &fast;
            lowp_gemm_blk_kernel k = {r == RUN_F32X ? lowp_gemm_micro_f32fma
                                                    : lowp_gemm_micro_dpbf16,
                                      lowp_gemm_micro_f32x,
                                      4,
                                      4096,
                                      0,
                                      0};
            if (r == RUN_AMX_EMU) {
                j.ws = ws_alloc(lowp_cpu_gemm_amx_ws_floats_emu(&j));
                lowp_cpu_gemm_amx_emu(&j);
            } else if (r == RUN_AVX2) {
                j.ws = ws_alloc(lowp_cpu_gemm_avx2_ws_floats(&j));
                lowp_cpu_gemm_avx2(&j);
            } else {
                j.ws = ws_alloc(lowp_gemm_blk_ws_floats(&j, &k));
                lowp_gemm_blk_run(&j, &k);
            }
            free(j.ws);
            char what[128];
            snprintf(what, sizeof what, "wgrad job g=%d k0=%lld %s", g, (long long) start,
                     runner_name(r));
            compare(what, &fast, &ref);
            if (r == RUN_AVX2) check_bits(what, &fast, &ref);
            g_cases++;
        }
        free(cr);
        free(cf);
        blk += (end - start + 31) / 32;
        start = end;
    }
    free(ta);
    free(tb);
    free(qa.data);
    free(qa.scales);
    free(qb.data);
    free(qb.scales);
    operand_drop(&a);
    operand_drop(&b);
}

/* A C of LOWP_GEMM_NT_BYTES or more (F32, no accumulate) is written with streaming stores (here
 * 16 MiB: far past the threshold, with M not a multiple of the tile in the full run). */
static void test_large_c(void) {
    const int64_t M = testutil_quick() ? 2048 : 2080, N = 2048, K = 40;
    const int pis[] = {0, 1, 7};
    for (int i = 0; i < 3; i++) {
        const pair_spec *p = &PAIRS[pis[i]];
        operand a = make(p->fa, p->sa, M, K, SPICE_NONE);
        operand b = make(p->fb, p->sb, N, K, SPICE_NONE);
        char name[96];
        snprintf(name, sizeof name, "%s large C", p->name);
        check_gemm(name, &a.q, &b.q, LOWP_FORMAT_F32, 0, 2, 0);
        operand_drop(&a);
        operand_drop(&b);
    }
}

/* ---- pieces along m on two threads ---- */

/* A GEMM the dispatcher cuts into four pieces along m (M much larger than N), on two threads:
 * a thread that runs two pieces finds the first one's packed B block in its workspace and uses
 * it (gemm_blk.c, the workspace tag). Against the reference, for the pair kinds with their own
 * packing (plain with the exact-kernel facts, tensor and row scales, MX with folding, a
 * 32x32-tile B, BLOCK128 scale panels). */
static void test_pieces_m(void) {
    const int64_t M = 2304, N = 160, K = 96;
    const int pis[] = {1, 2, 5, 7, 12, 14, 16, 18};
    for (size_t i = 0; i < sizeof pis / sizeof pis[0]; i++) {
        const pair_spec *p = &PAIRS[pis[i]];
        for (int how = 0; how < 2; how++) {
            operand a = make(p->fa, p->sa, M, K, how ? SPICE_EXTREME | SPICE_DENORM : SPICE_NONE);
            operand b = make(p->fb, p->sb, N, K, how ? SPICE_EXTREME | SPICE_DENORM : SPICE_NONE);
            char name[96];
            snprintf(name, sizeof name, "%s pieces along m%s", p->name,
                     how ? " (extreme blocks, denormals)" : "");
            check_gemm(name, &a.q, &b.q, LOWP_FORMAT_F32, how, 2, 0);
            operand_drop(&a);
            operand_drop(&b);
        }
    }
}

/* ---- b given [K, N] (lowp_gemm_kn) ---- */

/* The transpose of copy s ([K, N]) as a [N, K] copy, built here element by element: codes (or
 * plain elements) transposed, and the tile grid of the scales transposed. */
static lowp_qtensor transposed_copy(const lowp_qtensor *s) {
    lowp_qtensor t = *s;
    t.rows = s->cols;
    t.cols = s->rows;
    size_t db, sb;
    CHECK(lowp_qtensor_nbytes(&t, &db, &sb) == LOWP_OK);
    t.data = malloc(db + 64);
    t.scales = sb ? malloc(sb + 64) : NULL;
    const size_t es = s->format == LOWP_FORMAT_F32 ? 4 : s->format == LOWP_FORMAT_BF16 ? 2 : 1;
    for (int64_t k = 0; k < s->rows; k++)
        for (int64_t n = 0; n < s->cols; n++)
            memcpy((char *) t.data + es * (size_t) (n * s->rows + k),
                   (const char *) s->data + es * (size_t) (k * s->cols + n), es);
    if (s->scaling == LOWP_SCALING_TENSOR) memcpy(t.scales, s->scales, 4);
    if (s->scaling == LOWP_SCALING_BLOCK128X128 || s->scaling == LOWP_SCALING_BLOCK32X32) {
        int64_t sr, sc;
        int e8;
        CHECK(lowp_qtensor_scale_shape(s, &sr, &sc, &e8) == LOWP_OK);
        const size_t ss = e8 ? 1 : 4;
        for (int64_t i = 0; i < sr; i++)
            for (int64_t jj = 0; jj < sc; jj++)
                memcpy((char *) t.scales + ss * (size_t) (jj * sr + i),
                       (const char *) s->scales + ss * (size_t) (i * sc + jj), ss);
    }
    return t;
}

/* lowp_gemm_kn reads the stored copy where lowp_gemm reads a transposed one: on every runner
 * (the reference included) the two give the same bits, for every kind whose transposed copy
 * is the transpose of its copy (and that copy is what lowp_quantize's columnwise output is). */
static void test_kn(void) {
    const int quick = testutil_quick();
    const int picks[] = {0, 1, 2, 4, 12, 13, 14, 15};
    const int64_t shapes[][3] = {{33, 77, 300}, {1, 129, 161}, {70, 300, 33}, {129, 33, 129}};
    const int nshapes = quick ? 2 : 4;
    for (int pi = 0; pi < (int) (sizeof picks / sizeof picks[0]); pi++) {
        const pair_spec *p = &PAIRS[picks[pi]];
        const int plain = p->sb == LOWP_SCALING_NONE;
        for (int s = 0; s < nshapes; s++) {
            const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            const int how = s == 0   ? SPICE_NONE
                            : s == 1 ? SPICE_NANINF | SPICE_EXTREME
                            : s == 2 ? (plain ? SPICE_DENORM : SPICE_SUBSCALE)
                                     : SPICE_NONE;
            operand a = make(p->fa, p->sa, M, K, how);
            operand b = make(p->fb, p->sb, K, N, how); /* stored [K, N] */
            if (s == 3) { /* all-zero 32x32 tiles (scale code 0 that does not count) */
                for (int64_t k = 32; k < 64; k++)
                    for (int64_t n = 0; n < 32; n++) b.src[k * N + n] = 0.0f;
                free(b.q.data);
                free(b.q.scales);
                operand_quantize(&b, p->fb, p->sb, 64, 64);
            }
            lowp_qtensor bt = transposed_copy(&b.q);
            if (!plain) { /* the library's columnwise copy of the same input is that transpose */
                lowp_qtensor col = bt;
                size_t db, sb;
                CHECK(lowp_qtensor_nbytes(&col, &db, &sb) == LOWP_OK);
                col.data = malloc(db);
                col.scales = malloc(sb);
                lowp_tensor x = {LOWP_FORMAT_F32, K, N, b.src, LOWP_DEVICE_HOST};
                CHECKF(lowp_quantize(&x, NULL, &col, NULL) == LOWP_OK, "%s", lowp_last_error());
                CHECKF(memcmp(col.data, bt.data, db) == 0 && memcmp(col.scales, bt.scales, sb) == 0,
                       "kn %s K=%lld N=%lld: the columnwise copy is not the transposed copy",
                       p->name, (long long) K, (long long) N);
                free(col.data);
                free(col.scales);
            }
            for (int out = 0; out < 2; out++) {
                const lowp_format cf = out ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
                const size_t es = out ? 2 : 4, cb = es * (size_t) (M * N);
                lowp_tensor c0 = {cf, M, N, malloc(cb), LOWP_DEVICE_HOST}, c1 = c0, c2 = c0;
                c1.data = malloc(cb);
                c2.data = malloc(cb);
                fill_c(&c0);
                for (int r = -1; r <= RUN_AVX2; r++) { /* -1: the reference */
                    if (r >= 0 && !runner_ok((runner) r, &a.q)) continue;
                    memcpy(c1.data, c0.data, cb);
                    memcpy(c2.data, c0.data, cb);
                    lowp_status s1, s2;
                    if (r < 0) {
                        lowp_gemm_cfg cfg;
                        lowp_gemm_cfg_init(&cfg);
                        cfg.accumulate = out;
                        cfg.path = LOWP_KERNEL_PATH_REFERENCE;
                        s1 = lowp_cpu_gemm(&a.q, &bt, 0, &c1, &cfg);
                        s2 = lowp_cpu_gemm(&a.q, &b.q, 1, &c2, &cfg);
                    } else {
                        s1 = run_kn((runner) r, &a.q, &bt, 0, &c1, out, 1 + out);
                        s2 = run_kn((runner) r, &a.q, &b.q, 1, &c2, out, 1 + out);
                    }
                    CHECKF(s1 == LOWP_OK && s2 == LOWP_OK, "kn %s: %s", p->name, lowp_last_error());
                    CHECKF(memcmp(c1.data, c2.data, cb) == 0,
                           "kn %s %s M=%lld N=%lld K=%lld out=%s spice=%d: lowp_gemm_kn's bits "
                           "differ from lowp_gemm on the transposed copy",
                           p->name, r < 0 ? "reference" : runner_name((runner) r), (long long) M,
                           (long long) N, (long long) K, out ? "bf16" : "f32", how);
                    g_cases++;
                }
                free(c0.data);
                free(c1.data);
                free(c2.data);
            }
            free(bt.data);
            free(bt.scales);
            operand_drop(&a);
            operand_drop(&b);
        }
    }
}

/* lowp_grouped_gemm_wgrad with b = X given as stored [M, K]: the bits of the split-K GEMM on X's
 * transposed copy, on the reference and the fast paths, with empty and short groups. */
static void test_wgrad_kn(void) {
    const int32_t sizes[] = {40, 0, 1, 33, 100, 31};
    const int G = (int) (sizeof sizes / sizeof sizes[0]);
    int32_t offs[6];
    const int64_t M = group_offs(sizes, G, offs) + 3, N = 47, K = 65;
    const struct {
        lowp_format f;
        lowp_scaling s;
    } kinds[] = {{LOWP_FORMAT_BF16, LOWP_SCALING_NONE},
                 {LOWP_FORMAT_F32, LOWP_SCALING_NONE},
                 {LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR}};
    for (int ki = 0; ki < 3; ki++) {
        operand a = make(kinds[ki].f, kinds[ki].s, N, M, SPICE_NANINF);  /* dY^T [N, M] */
        operand x = make(kinds[ki].f, kinds[ki].s, M, K, SPICE_EXTREME); /* X [M, K] */
        lowp_qtensor xt = transposed_copy(&x.q);                         /* X^T [K, M] */
        for (int acc = 0; acc < 2; acc++) {
            const lowp_format cf = acc ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
            const size_t es = acc ? 2 : 4, cb = es * (size_t) (G * N * K);
            lowp_tensor c0 = {cf, G * N, K, malloc(cb), LOWP_DEVICE_HOST}, c1 = c0, c2 = c0;
            c1.data = malloc(cb);
            c2.data = malloc(cb);
            fill_c(&c0);
            for (int path = 0; path < 4; path++) {
                if (path == 1 && !g_have_avx512) continue;
                if (path == 2 && !g_have_amx) continue;
                if (path == 3 && !g_have_avx2) continue;
                lowp_gemm_cfg cfg;
                lowp_gemm_cfg_init(&cfg);
                cfg.accumulate = acc;
                cfg.threads = 1 + acc;
                cfg.path = path == 0   ? LOWP_KERNEL_PATH_REFERENCE
                           : path == 1 ? LOWP_KERNEL_PATH_AVX512
                           : path == 2 ? LOWP_KERNEL_PATH_AMX
                                       : LOWP_KERNEL_PATH_AVX2;
                memcpy(c1.data, c0.data, cb);
                memcpy(c2.data, c0.data, cb);
                if (path == 2 && kinds[ki].f == LOWP_FORMAT_F32) {
                    amx_refuses_f32(lowp_cpu_grouped_gemm_wgrad(&a.q, &xt, 0, offs, G, &c1, &cfg),
                                    &c1, &c0, "wgrad kn f32");
                    amx_refuses_f32(lowp_cpu_grouped_gemm_wgrad(&a.q, &x.q, 1, offs, G, &c2, &cfg),
                                    &c2, &c0, "wgrad kn f32 (b as [M, K])");
                    continue;
                }
                CHECKF(lowp_cpu_grouped_gemm_wgrad(&a.q, &xt, 0, offs, G, &c1, &cfg) == LOWP_OK &&
                           lowp_cpu_grouped_gemm_wgrad(&a.q, &x.q, 1, offs, G, &c2, &cfg) ==
                               LOWP_OK,
                       "%s", lowp_last_error());
                CHECKF(memcmp(c1.data, c2.data, cb) == 0,
                       "wgrad kn %s %s path %d acc=%d: the bits differ from X's transposed copy",
                       lowp_scaling_name(kinds[ki].s),
                       kinds[ki].f == LOWP_FORMAT_F32 ? "f32" : "bf16/e4m3", path, acc);
                g_cases++;
            }
            free(c0.data), free(c1.data), free(c2.data);
        }
        free(xt.data);
        free(xt.scales);
        operand_drop(&a);
        operand_drop(&x);
    }
}

/* MX operands built from raw codes: every pair of scale codes from 0 to 254 (and 0xFF) meets
 * elements that make block sums with many significant bits, some tiny (subnormal codes only):
 * where A's factor 2^(eA - 127) would make such a sum denormal and B's scales it back up, only
 * the exact product ldexpf(s, eA + eB - 254) has the reference's bits (the AVX2 kernel's
 * binary64 path). On every fast runner against the reference; the AVX2 kernel bit for bit. */
static void test_mx_scale_range(void) {
    static const uint8_t codes[] = {0, 1, 10, 32, 33, 60, 127, 200, 217, 218, 240, 254, 0xFF};
    const int nc = (int) sizeof codes;
    const int64_t M = nc * 2, N = nc * 2 + 3, K = 96; /* 3 blocks a row */
    const lowp_format fmts[] = {LOWP_FORMAT_E4M3, LOWP_FORMAT_E5M2, LOWP_FORMAT_E2M1};
    for (int fi = 0; fi < 3; fi++) {
        lowp_qtensor q[2];
        for (int o = 0; o < 2; o++) {
            const int64_t rows = o ? N : M;
            lowp_qtensor t = {fmts[fi], LOWP_SCALING_MX32, rows, K, NULL,
                              NULL,     LOWP_DEVICE_HOST,  NULL, 0};
            size_t db, sb;
            CHECK(lowp_qtensor_nbytes(&t, &db, &sb) == LOWP_OK);
            t.data = malloc(db);
            t.scales = malloc(sb);
            uint8_t *d = t.data, *sc = t.scales;
            for (int64_t r = 0; r < rows; r++) {
                const int small = (r / nc) % 2; /* the second half: subnormal codes only */
                for (int64_t k = 0; k < K / 2 && fmts[fi] == LOWP_FORMAT_E2M1; k++) {
                    /* MXFP4: any codes (E2M1 has no NaN); the second half +-0.5 and zeros */
                    const uint8_t by = (uint8_t) (urand() * 256.0);
                    d[r * K / 2 + k] = small ? (uint8_t) (by & 0x99) : by;
                }
                for (int64_t k = 0; k < K && fmts[fi] != LOWP_FORMAT_E2M1; k++) {
                    uint8_t c = (uint8_t) (urand() * (small ? 7 : 0x7E)) + 1; /* no NaN/Inf */
                    if (fmts[fi] == LOWP_FORMAT_E5M2 && !small) c = (uint8_t) (c % 0x7B + 1);
                    if (small && fmts[fi] == LOWP_FORMAT_E5M2) c = (uint8_t) (1 + c % 3);
                    d[r * K + k] = (uint8_t) (c | (urand() < 0.5 ? 0x80 : 0));
                }
                for (int64_t b = 0; b < K / 32; b++)
                    sc[r * (K / 32) + b] = codes[(r + (o ? 3 * b : b)) % nc];
            }
            q[o] = t;
        }
        for (int out = 0; out < 2; out++) {
            char name[64];
            snprintf(name, sizeof name, "mx scale codes %s",
                     fi == 2 ? "e2m1"
                     : fi    ? "e5m2"
                             : "e4m3");
            check_gemm(name, &q[0], &q[1], out ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32, out, 1, 1);
        }
        for (int o = 0; o < 2; o++) free(q[o].data), free(q[o].scales);
    }
}

/* MX tiles whose every block has one large scale code, so that the fast kernels' fold (all
 * scales applied once after the whole sum) is possible: where a block value or a partial sum
 * of the reference's sequence reaches 2^128, the reference gives Inf, or NaN where blocks of
 * opposite signs overflow, and the fast result must too (docs/numerics.md section 6). A's
 * blocks are positive, positive, negative, negative (or alternate) over K = 128; B is MX or
 * 32x32 blocks, every scale byte one code. */
static void test_mx_fold_overflow(void) {
    static const uint8_t pairs[][2] = {{254, 254}, {254, 127}, {200, 180},
                                       {190, 168}, {180, 150}, {127, 127}};
    const int64_t M = 40, N = 37, K = 128;
    const lowp_format fmts[] = {LOWP_FORMAT_E4M3, LOWP_FORMAT_E5M2};
    const lowp_scaling bsc[] = {LOWP_SCALING_MX32, LOWP_SCALING_BLOCK32X32};
    for (int fi = 0; fi < 2; fi++)
        for (int bi = 0; bi < 2; bi++)
            for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++) {
                lowp_qtensor q[2];
                for (int o = 0; o < 2; o++) {
                    const int64_t rows = o ? N : M;
                    lowp_qtensor t = {fmts[fi],
                                      o ? bsc[bi] : LOWP_SCALING_MX32,
                                      rows,
                                      K,
                                      NULL,
                                      NULL,
                                      LOWP_DEVICE_HOST,
                                      NULL,
                                      0};
                    size_t db, sb;
                    CHECK(lowp_qtensor_nbytes(&t, &db, &sb) == LOWP_OK);
                    t.data = malloc(db);
                    t.scales = malloc(sb);
                    memset(t.scales, pairs[pi][o], sb);
                    uint8_t *d = t.data;
                    for (int64_t r = 0; r < rows; r++)
                        for (int64_t k = 0; k < K; k++) {
                            uint8_t c = (uint8_t) (0x40 + urand() * 0x3A); /* finite, large */
                            const int64_t b = k / 32;
                            const int neg = o == 0 && (r % 2 ? b >= 2 : b % 2 == 1);
                            d[r * K + k] = (uint8_t) (c | (neg ? 0x80 : 0));
                        }
                    q[o] = t;
                }
                char name[96];
                snprintf(name, sizeof name, "mx fold overflow %s x %s codes %d %d",
                         fi ? "e5m2" : "e4m3", bi ? "b32" : "mx", pairs[pi][0], pairs[pi][1]);
                check_gemm(name, &q[0], &q[1], LOWP_FORMAT_F32, 0, 1, 1);
                for (int o = 0; o < 2; o++) free(q[o].data), free(q[o].scales);
            }
}

/* lowp_cpu_gemm_part (the attention core's per-head products on strided operands) against
 * lowp_gemm / lowp_gemm_kn of the same parts copied out contiguously, bit for bit (one thread),
 * both layouts of b, ranges that start inside the rows and end before them; C outside the
 * part stays as it was. */
static void test_part(void) {
    static const int64_t cases[][7] = {
        /* m, lda, ldb, n0, n1, k0, k1 */
        {37, 50, 45, 7, 40, 3, 47},
        {12, 64, 64, 0, 64, 16, 32},
        {130, 200, 300, 33, 161, 64, 128},
        {5, 9, 7, 2, 3, 0, 9},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t m = cases[ci][0], lda = cases[ci][1], ldb = cases[ci][2], n0 = cases[ci][3],
                      n1 = cases[ci][4], k0 = cases[ci][5], k1 = cases[ci][6];
        const int64_t N = n1 - n0, K = k1 - k0, ldc = ldb + 3;
        for (int kn = 0; kn < 2; kn++) {
            const int64_t brows = kn ? k1 + 2 : n1 + 1; /* b: [brows, ldb] */
            if (!kn && ldb < k1) continue;
            if (kn && ldb < n1) continue;
            float *a = malloc(sizeof(float) * (size_t) (m * lda));
            float *b = malloc(sizeof(float) * (size_t) (brows * ldb));
            float *c = malloc(sizeof(float) * (size_t) (m * ldc));
            float *ac = malloc(sizeof(float) * (size_t) (m * K));
            float *bc = malloc(sizeof(float) * (size_t) (N * K));
            float *cc = malloc(sizeof(float) * (size_t) (m * N));
            for (int64_t i = 0; i < m * lda; i++) a[i] = gauss();
            for (int64_t i = 0; i < brows * ldb; i++) b[i] = gauss();
            for (int64_t i = 0; i < m * ldc; i++) c[i] = -7.25f;
            for (int64_t i = 0; i < m; i++)
                for (int64_t k = 0; k < K; k++) ac[i * K + k] = a[i * lda + k0 + k];
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++)
                    bc[kn ? k * N + n : n * K + k] =
                        kn ? b[(k0 + k) * ldb + n0 + n] : b[(n0 + n) * ldb + k0 + k];
            lowp_qtensor qa = {
                LOWP_FORMAT_F32, LOWP_SCALING_NONE, m, lda, a, NULL, LOWP_DEVICE_HOST, NULL, 0};
            lowp_qtensor qb = {
                LOWP_FORMAT_F32, LOWP_SCALING_NONE, brows, ldb, b, NULL, LOWP_DEVICE_HOST, NULL, 0};
            lowp_tensor tc = {LOWP_FORMAT_F32, m, ldc, c, LOWP_DEVICE_HOST};
            CHECK(lowp_cpu_gemm_part(&qa, &qb, kn, &tc, m, n0, n1, k0, k1) == LOWP_OK);
            lowp_qtensor qac = {
                LOWP_FORMAT_F32, LOWP_SCALING_NONE, m, K, ac, NULL, LOWP_DEVICE_HOST, NULL, 0};
            lowp_qtensor qbc = {LOWP_FORMAT_F32,
                                LOWP_SCALING_NONE,
                                kn ? K : N,
                                kn ? N : K,
                                bc,
                                NULL,
                                LOWP_DEVICE_HOST,
                                NULL,
                                0};
            lowp_tensor tcc = {LOWP_FORMAT_F32, m, N, cc, LOWP_DEVICE_HOST};
            lowp_gemm_cfg cfg;
            lowp_gemm_cfg_init(&cfg);
            cfg.threads = 1;
            CHECK((kn ? lowp_gemm_kn(&qac, &qbc, &tcc, &cfg) : lowp_gemm(&qac, &qbc, &tcc, &cfg)) ==
                  LOWP_OK);
            int same = 1, outside = 1;
            for (int64_t i = 0; i < m; i++)
                for (int64_t n = 0; n < ldc; n++) {
                    const float got = c[i * ldc + n];
                    if (n >= n0 && n < n1)
                        same &= memcmp(&got, &cc[i * N + n - n0], sizeof got) == 0;
                    else
                        outside &= got == -7.25f;
                }
            CHECKF(
                same && outside,
                "gemm_part m %lld n [%lld, %lld) k [%lld, %lld) kn %d: same %d, C outside kept %d",
                (long long) m, (long long) n0, (long long) n1, (long long) k0, (long long) k1, kn,
                same, outside);
            g_cases++;
            free(a), free(b), free(c), free(ac), free(bc), free(cc);
        }
    }
}

/* lowp_cpu_sgp_pack / lowp_cpu_sgp_mul (the attention core's products on panels packed once)
 * against lowp_cpu_gemm_part on the same operands, bit for bit: both orientations of b, widths
 * that end inside a panel, row counts past one chunk of strips, contraction ranges that start
 * inside the panels, and operands with NaN/Inf, values whose products overflow, values whose
 * products are denormal, and large values in the first column of the range only (the exact
 * sequence where products could overflow). */
static void test_sgp(void) {
    static const int64_t cases[][7] = {
        /* m, n (b's extent), k (b's extent), n1, k0, k1, spice */
        {37, 45, 50, 45, 3, 47, 0}, {12, 64, 64, 64, 16, 32, 0},    {200, 256, 64, 200, 0, 64, 0},
        {5, 16, 9, 16, 0, 9, 0},    {130, 70, 300, 70, 64, 300, 0}, {49, 96, 96, 90, 7, 96, 1},
        {25, 40, 33, 40, 0, 33, 2}, {25, 40, 33, 33, 1, 33, 3},     {30, 40, 40, 40, 5, 40, 4},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t m = cases[ci][0], n = cases[ci][1], k = cases[ci][2], n1 = cases[ci][3],
                      k0 = cases[ci][4], k1 = cases[ci][5], spice = cases[ci][6];
        for (int kn = 0; kn < 2; kn++) {
            const int64_t lda = k + 5, ldb = (kn ? n : k) + 3, ldc = n1 + 2;
            const int64_t brows = kn ? k : n;
            float *a = malloc(sizeof(float) * (size_t) (m * lda));
            float *b = malloc(sizeof(float) * (size_t) (brows * ldb));
            float *c = malloc(sizeof(float) * (size_t) (m * ldc));
            float *cr = malloc(sizeof(float) * (size_t) (m * ldc));
            float *pk = aligned_alloc(64, (lowp_cpu_sgp_floats(n, k) + 15) / 16 * 64);
            for (int64_t i = 0; i < m * lda; i++) a[i] = gauss();
            for (int64_t i = 0; i < brows * ldb; i++) b[i] = gauss();
            if (spice == 1) { /* NaN, Inf, -Inf in a and b */
                a[3 * lda + k0 + 1] = NAN, a[(m - 1) * lda + k1 - 1] = INFINITY;
                b[2 * ldb + 5] = -INFINITY;
            } else if (spice == 2) { /* products that overflow in some rows */
                for (int64_t i = 0; i < lda; i++) a[7 * lda + i] *= 1e30f;
                for (int64_t i = 0; i < ldb; i++) b[ldb + i] *= 1e20f;
            } else if (spice == 4) { /* b's largest values at k = k0 only (exact sequence),
                                      * times small ones of a: products of ordinary size */
                for (int64_t j = 0; j < n; j++) b[kn ? k0 * ldb + j : j * ldb + k0] *= 1e37f;
                for (int64_t i = 0; i < m; i++) a[i * lda + k0] *= 1e-37f;
            } else if (spice == 3) { /* products among the denormals */
                for (int64_t i = 0; i < m * lda; i++) a[i] *= 1e-20f;
                for (int64_t i = 0; i < brows * ldb; i++) b[i] *= 1e-20f;
            }
            for (int64_t i = 0; i < m * ldc; i++) c[i] = cr[i] = -7.25f;
            lowp_cpu_sgp_pack(b, ldb, kn, n, k, pk);
            lowp_cpu_sgp_mul(a + k0, lda, m, pk, n, k, n1, k0, k1, c, ldc);
            lowp_qtensor qa = {
                LOWP_FORMAT_F32, LOWP_SCALING_NONE, m, lda, a, NULL, LOWP_DEVICE_HOST, NULL, 0};
            lowp_qtensor qb = {
                LOWP_FORMAT_F32, LOWP_SCALING_NONE, brows, ldb, b, NULL, LOWP_DEVICE_HOST, NULL, 0};
            lowp_tensor tc = {LOWP_FORMAT_F32, m, ldc, cr, LOWP_DEVICE_HOST};
            CHECK(lowp_cpu_gemm_part(&qa, &qb, kn, &tc, m, 0, n1, k0, k1) == LOWP_OK);
            int same = memcmp(c, cr, sizeof(float) * (size_t) (m * ldc)) == 0, nonfinite = 0;
            for (int64_t i = 0; i < m * ldc; i++) nonfinite += !isfinite(c[i]);
            CHECKF(same && (spice != 1 || nonfinite > 0) && (spice != 2 || nonfinite > 0),
                   "sgp m %lld n %lld k %lld n1 %lld k [%lld, %lld) kn %d spice %lld: same %d, "
                   "non-finite %d",
                   (long long) m, (long long) n, (long long) k, (long long) n1, (long long) k0,
                   (long long) k1, kn, (long long) spice, same, nonfinite);
            g_cases++;
            free(a), free(b), free(c), free(cr), free(pk);
        }
    }
}

/* ---- NVFP4 from raw codes ---- */

/* An NVFP4 operand [rows, cols] of random E2M1 codes (padding nibbles too) and random E4M3
 * block scale codes: mostly normal, and some of every special kind: 0x00 (a block that decodes
 * to zero), subnormal codes 0x01-0x07, the largest 0x7E, the NaN codes 0x7F and 0xFF (rare:
 * they make their whole row of C NaN), and negative codes; tensor decode scale d. */
static lowp_qtensor nv_raw(lowp_scaling sc, int64_t rows, int64_t cols, float d, int nan_ok) {
    lowp_qtensor q = {LOWP_FORMAT_E2M1, sc, rows, cols, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    size_t db, sb, off;
    CHECK(lowp_qtensor_nbytes(&q, &db, &sb) == LOWP_OK);
    CHECK(lowp_qtensor_tensor_scale_offset(&q, &off) == LOWP_OK);
    q.data = malloc(db + 64);
    q.scales = malloc(sb + 64);
    uint8_t *dd = q.data, *ss = q.scales;
    for (size_t i = 0; i < db; i++) dd[i] = (uint8_t) (urand() * 256.0);
    for (size_t i = 0; i < off; i++) {
        const double u = urand();
        ss[i] = u < 0.05               ? 0x00
                : u < 0.2              ? (uint8_t) (1 + urand() * 7)
                : u < 0.25             ? 0x7E
                : u < 0.3              ? (uint8_t) (0x80 | (uint8_t) (1 + urand() * 125))
                : u < 0.3015 && nan_ok ? (urand() < 0.5 ? 0x7F : 0xFF)
                                       : (uint8_t) (8 + urand() * 118);
    }
    memcpy(ss + off, &d, sizeof d);
    return q;
}

/* Raw-code NVFP4 operands on every runner against the reference: awkward M, N, K (K < 16,
 * K not a multiple of 16 or 32), subnormal, zero, negative and NaN block scale codes, and
 * tensor scales from a binary32 denormal to 2^40. */
static void test_nv_codes(void) {
    const int64_t shapes[][3] = {{1, 1, 1},    {3, 5, 15},    {17, 33, 16},   {33, 31, 47},
                                 {65, 40, 96}, {31, 70, 129}, {130, 33, 300}, {40, 64, 17}};
    /* (D_A, D_B): a binary32 denormal (S = FLT_MAX gives one) beside a large one, so that C
     * is not all denormal (where one rounding is a large relative error) */
    const float ds[][2] = {{1.0f, 1.0f},
                           {0x1p-20f, 1.0f / 2688.0f},
                           {0x1p-128f, 0x1p40f},
                           {0x1p40f, 0x1p-128f},
                           {1.0f / 2688.0f, 0x1p-20f}};
    const int quick = testutil_quick();
    for (int s = 0; s < (quick ? 5 : 8); s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int v = 0; v < 3; v++) {
            const lowp_scaling sa = v == 2 ? LOWP_SCALING_NV16X16 : LOWP_SCALING_NV16;
            const lowp_scaling sb = v == 1 ? LOWP_SCALING_NV16X16 : LOWP_SCALING_NV16;
            lowp_qtensor a = nv_raw(sa, M, K, ds[(s + v) % 5][0], v != 0);
            lowp_qtensor b = nv_raw(sb, N, K, ds[(s + v) % 5][1], v != 0);
            char name[96];
            snprintf(name, sizeof name, "nv raw codes %s x %s", lowp_scaling_name(sa),
                     lowp_scaling_name(sb));
            check_gemm(name, &a, &b, v == 1 ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32, v == 2,
                       1 + (v & 1), M * N * K <= 2000000);
            free(a.data), free(a.scales), free(b.data), free(b.scales);
        }
    }
}

/* An NV16X16 weight read as stored [K, N] (lowp_gemm with the KN layout) against its
 * columnwise copy [N, K] (the same codes and tile scales, transposed: lowp_quantize's dual
 * output), on every runner: identical bits, and the reference's result within tolerance. */
static void test_nv_kn(void) {
    const int64_t shapes[][3] = {{33, 77, 300}, {1, 129, 161}, {70, 300, 33}, {129, 33, 15}};
    for (int s = 0; s < 4; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        operand a = make(LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, M, K, s == 1 ? SPICE_NANINF : 0);
        operand w = operand_gauss(K, N, 6.0f); /* stored [K, N] */
        spice(w.src, K, N, s == 2 ? SPICE_EXTREME : 0);
        w.q.format = LOWP_FORMAT_E2M1;
        w.q.scaling = LOWP_SCALING_NV16X16;
        w.q.device = LOWP_DEVICE_HOST;
        lowp_qtensor col = w.q;
        col.rows = N, col.cols = K;
        size_t db, sb;
        CHECK(lowp_qtensor_nbytes(&w.q, &db, &sb) == LOWP_OK);
        w.q.data = malloc(db + 64), w.q.scales = malloc(sb + 64);
        CHECK(lowp_qtensor_nbytes(&col, &db, &sb) == LOWP_OK);
        col.data = malloc(db + 64), col.scales = malloc(sb + 64);
        lowp_tensor x = {LOWP_FORMAT_F32, K, N, w.src, LOWP_DEVICE_HOST};
        CHECKF(lowp_quantize(&x, &w.q, &col, NULL) == LOWP_OK, "%s", lowp_last_error());
        const size_t cb = 4 * (size_t) (M * N);
        lowp_tensor c0 = {LOWP_FORMAT_F32, M, N, malloc(cb), LOWP_DEVICE_HOST}, c1 = c0, c2 = c0;
        c1.data = malloc(cb);
        c2.data = malloc(cb);
        lowp_gemm_cfg cfg;
        lowp_gemm_cfg_init(&cfg);
        cfg.path = LOWP_KERNEL_PATH_REFERENCE;
        CHECK(lowp_cpu_gemm(&a.q, &col, 0, &c0, &cfg) == LOWP_OK);
        for (runner r = RUN_AVX512; r <= RUN_AVX2; r++) {
            if (!runner_ok(r, &a.q)) continue;
            const lowp_status s1 = run_kn(r, &a.q, &col, 0, &c1, 0, 2);
            const lowp_status s2 = run_kn(r, &a.q, &w.q, 1, &c2, 0, 2);
            char what[128];
            snprintf(what, sizeof what, "nv kn %s M=%lld N=%lld K=%lld", runner_name(r),
                     (long long) M, (long long) N, (long long) K);
            CHECKF(s1 == LOWP_OK && s2 == LOWP_OK, "%s: %s", what, lowp_last_error());
            CHECKF(memcmp(c1.data, c2.data, cb) == 0, "%s: [K, N] bits differ from [N, K]", what);
            compare(what, &c2, &c0);
            g_cases++;
        }
        free(c0.data), free(c1.data), free(c2.data);
        free(col.data), free(col.scales);
        operand_drop(&a);
        operand_drop(&w);
    }
}

int main(void) {
    tu_seed(0x243F6A8885A308D3ull);
    const uint32_t f = lowp_cpu_caps()->flags;
    g_have_avx512 = (f & LOWP_CAP_AVX512F) && (f & LOWP_CAP_AVX512BW) && (f & LOWP_CAP_AVX512VL);
    g_have_bf16 = (f & LOWP_CAP_AVX512_BF16) != 0;
    g_have_amx = g_have_avx512 && (f & LOWP_CAP_AMX_BF16) && (f & LOWP_CAP_AMX_PERMITTED);
    g_have_avx2 = (f & LOWP_CAP_AVX2) && (f & LOWP_CAP_FMA);
    if (!g_have_avx512 && !g_have_avx2) {
        printf("test_gemm_fast: skipped: neither AVX-512 F/BW/VL nor AVX2 and FMA on this CPU\n");
        return testutil_finish();
    }
    if (!g_have_avx512)
        printf("test_gemm_fast: no AVX-512 F/BW/VL: the AVX2 kernel only (the AVX-512 and AMX "
               "kernels, and the AMX model that runs on them, need it)\n");
    if (g_have_avx512 && !g_have_amx)
        printf(
            "test_gemm_fast: AMX not granted here: the AMX kernel runs on the tile model only\n");
    if (g_have_avx512 && !g_have_bf16)
        printf("test_gemm_fast: no AVX512_BF16: the VDPBF16PS micro-kernel is not tested\n");
    test_pairs();
    test_specials();
    test_grouped();
    test_wgrad();
    test_wgrad_jobs();
    test_large_c();
    test_pieces_m();
    test_kn();
    test_wgrad_kn();
    test_part();
    test_mx_scale_range();
    test_mx_fold_overflow();
    test_nv_codes();
    test_nv_kn();
    if (g_have_avx512) test_sgp();
    printf("test_gemm_fast: %d GEMM comparisons\n", g_cases);
    return testutil_finish();
}
