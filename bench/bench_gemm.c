/* `lowp bench gemm`: GEMM throughput of lowp's kernels beside oneDNN and OpenBLAS.
 *
 * Side by side in one run, on 1 and 2 threads, at M=N=K=2048 and M=4096 K=1024 N=4096: lowp
 * BF16, MXFP8 (E4M3, 1x32 E8M0 scales), BLOCK128 (A 1x128, B 128x128 binary32 scales),
 * BLOCK32x32 (A MX 1x32, B 32x32 E8M0 tiles) and F32; oneDNN's BF16 matmul (F32 output) and
 * OpenBLAS SGEMM when they were found at build time. Then the grouped MXFP8 GEMM (8 experts,
 * uneven groups of 4096 tokens, K=1024, N=2048) beside oneDNN's dense BF16 matmul of the same
 * FLOPs. Operands are quantized once, outside the timed region; each repetition times one GEMM
 * right after an untimed one of the same kernel, the kernels' repetitions are interleaved (the
 * machines this runs on are shared and noisy) and the median is reported, as GFLOP/s = 2*M*N*K /
 * time and as a ratio to oneDNN BF16. The oneDNN is the one CMake found (LOWP_ONEDNN_ROOT, else the
 * system's; 2.x and 3.x C APIs); the table's header and each JSON row name the version this
 * process runs (dnnl_version()).
 *
 * OpenBLAS is loaded with dlopen after OPENBLAS_CORETYPE=SkylakeX (on CPUs with AVX-512F) and
 * OPENBLAS_THREAD_TIMEOUT=4 are put in the environment (unless already set): OpenBLAS reads
 * them once, when it is loaded, and picks its AVX2 kernels on AMD cores without the first;
 * the second stops its idle threads from spinning into the next kernel's timing. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cli.h"
#include "lowp/lowp.h"
#include "lowp/gemm.h"

#ifdef LOWP_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef LOWP_OPENBLAS_LIB
#include <dlfcn.h>
#endif

#define DEFAULT_REPS 9
#define NGROUPS      8

static void usage(FILE *f) {
    fprintf(f,
            "usage: lowp bench gemm [--json] [--reps N] [--quick] [--shape MxNxK] [--clock cpu]\n"
            "  --reps N   timed repetitions per kernel, interleaved (default %d)\n"
            "  --quick    smaller shapes (M=N=K=1024; M=2048 K=512 N=2048; grouped 2048 tokens,\n"
            "             K=512, N=1024) and 3 repetitions unless --reps is given\n"
            "  --shape MxNxK  this dense shape only (for example a training step's GEMM,\n"
            "             2048x1152x384), instead of the default shapes\n"
            "  --json     one JSON object per line instead of the table\n"
            "  --clock cpu  time the calling thread's CPU time instead of the wall clock, on 1\n"
            "             thread only (every kernel then runs on the calling thread): on a shared\n"
            "             machine it leaves out the time other processes hold the core\n"
            "GFLOP/s = 2*M*N*K / median time of one GEMM (F32 output), each timed right after an\n"
            "untimed one of the same kernel, on 1 and 2 threads; each kernel is compared with\n"
            "oneDNN's BF16 matmul on the same shape and threads.\n",
            DEFAULT_REPS);
}

typedef enum kernel_id {
    K_BF16,
    K_MXFP8,
    K_B128,
    K_B32,
    K_NVFP4,
    K_MXFP4,
    K_F32,
    K_DNNL,
    K_OPENBLAS,
    K_GROUPED,
    K_COUNT
} kernel_id;

static const char *const KERNEL_NAMES[K_COUNT] = {
    "lowp_bf16",  "lowp_mxfp8", "lowp_block128", "lowp_block32x32", "lowp_nvfp4",
    "lowp_mxfp4", "lowp_f32",   "onednn_bf16",   "openblas_sgemm",  "lowp_grouped_mxfp8"};

/* ---- peers ---- */

#ifdef LOWP_HAVE_DNNL
typedef struct dnnl_mm {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t prim[2]; /* created for 1 and 2 threads */
    dnnl_memory_t ma, mb, mc;
    int ok;
} dnnl_mm;

/* C[M,N] (f32) = A[M,K] (bf16) . B[N,K]^T (bf16): B is oneDNN's [K,N] weights in "ba". */
static int dnnl_setup(dnnl_mm *d, int64_t m, int64_t n, int64_t k, void *a, void *b, float *c) {
    memset(d, 0, sizeof *d);
    if (dnnl_engine_create(&d->eng, dnnl_cpu, 0) != dnnl_success) return -1;
    if (dnnl_stream_create(&d->stream, d->eng, dnnl_stream_default_flags) != dnnl_success)
        return -1;
    dnnl_dims_t da = {m, k}, db = {k, n}, dc = {m, n};
#if DNNL_VERSION_MAJOR >= 3 /* memory descriptors are handles; one call makes the matmul's pd */
    dnnl_memory_desc_t ad = NULL, bd = NULL, cd = NULL;
    int bad = dnnl_memory_desc_create_with_tag(&ad, 2, da, dnnl_bf16, dnnl_ab) != dnnl_success ||
              dnnl_memory_desc_create_with_tag(&bd, 2, db, dnnl_bf16, dnnl_ba) != dnnl_success ||
              dnnl_memory_desc_create_with_tag(&cd, 2, dc, dnnl_f32, dnnl_ab) != dnnl_success;
#define LOWP_DNNL_MD(x) (x)
#else
    dnnl_memory_desc_t ad, bd, cd;
    dnnl_memory_desc_init_by_tag(&ad, 2, da, dnnl_bf16, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&bd, 2, db, dnnl_bf16, dnnl_ba);
    dnnl_memory_desc_init_by_tag(&cd, 2, dc, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t md;
    int bad = dnnl_matmul_desc_init(&md, &ad, &bd, NULL, &cd) != dnnl_success;
#define LOWP_DNNL_MD(x) (&(x))
#endif
    for (int t = 0; t < 2 && !bad; t++) {
        /* oneDNN sizes a primitive's scratch for the threads it will run on. */
        omp_set_num_threads(t + 1);
        dnnl_primitive_desc_t pd;
#if DNNL_VERSION_MAJOR >= 3
        bad =
            dnnl_matmul_primitive_desc_create(&pd, d->eng, ad, bd, NULL, cd, NULL) != dnnl_success;
#else
        bad = dnnl_primitive_desc_create(&pd, &md, NULL, d->eng, NULL) != dnnl_success;
#endif
        if (bad) break;
        bad = dnnl_primitive_create(&d->prim[t], pd) != dnnl_success;
        dnnl_primitive_desc_destroy(pd);
    }
    bad = bad || dnnl_memory_create(&d->ma, LOWP_DNNL_MD(ad), d->eng, a) != dnnl_success ||
          dnnl_memory_create(&d->mb, LOWP_DNNL_MD(bd), d->eng, b) != dnnl_success ||
          dnnl_memory_create(&d->mc, LOWP_DNNL_MD(cd), d->eng, c) != dnnl_success;
#if DNNL_VERSION_MAJOR >= 3
    dnnl_memory_desc_destroy(ad), dnnl_memory_desc_destroy(bd), dnnl_memory_desc_destroy(cd);
#endif
    d->ok = !bad;
    return bad ? -1 : 0;
}

/* "oneDNN v2.6.3 (OpenMP)": the version of the library this process runs, which may differ
 * from the headers it was built with. */
static const char *dnnl_label(void) {
    static char buf[96];
    const dnnl_version_t *v = dnnl_version();
    const char *rt = v->cpu_runtime == DNNL_RUNTIME_OMP    ? "OpenMP"
                     : v->cpu_runtime == DNNL_RUNTIME_TBB  ? "TBB"
                     : v->cpu_runtime == DNNL_RUNTIME_SEQ  ? "sequential"
                     : v->cpu_runtime == DNNL_RUNTIME_SYCL ? "SYCL"
                                                           : "other runtime";
    snprintf(buf, sizeof buf, "oneDNN v%d.%d.%d (%s)", v->major, v->minor, v->patch, rt);
    return buf;
}

static int dnnl_run(dnnl_mm *d, int threads) {
    omp_set_num_threads(threads);
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, d->ma}, {DNNL_ARG_WEIGHTS, d->mb}, {DNNL_ARG_DST, d->mc}};
    if (dnnl_primitive_execute(d->prim[threads - 1], d->stream, 3, args) != dnnl_success) return -1;
    return dnnl_stream_wait(d->stream) == dnnl_success ? 0 : -1;
}

static void dnnl_free(dnnl_mm *d) {
    if (d->ma) dnnl_memory_destroy(d->ma);
    if (d->mb) dnnl_memory_destroy(d->mb);
    if (d->mc) dnnl_memory_destroy(d->mc);
    for (int t = 0; t < 2; t++)
        if (d->prim[t]) dnnl_primitive_destroy(d->prim[t]);
    if (d->stream) dnnl_stream_destroy(d->stream);
    if (d->eng) dnnl_engine_destroy(d->eng);
}
#endif

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *,
                         int, float, float *, int);
typedef void (*set_threads_fn)(int);
static sgemm_fn g_sgemm;
static set_threads_fn g_blas_threads;
static const char *g_blas_why = "OpenBLAS was not found at build time (libopenblas-dev)";

static void load_openblas(int have_avx512) {
#ifdef LOWP_OPENBLAS_LIB
    if (have_avx512) setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
    setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);
    void *h = dlopen(LOWP_OPENBLAS_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        g_blas_why = "OpenBLAS could not be loaded (" LOWP_OPENBLAS_LIB ")";
        return;
    }
    g_sgemm = (sgemm_fn) (uintptr_t) dlsym(h, "cblas_sgemm");
    g_blas_threads = (set_threads_fn) (uintptr_t) dlsym(h, "openblas_set_num_threads");
    if (!g_sgemm || !g_blas_threads) {
        g_sgemm = NULL;
        g_blas_why = "OpenBLAS lacks cblas_sgemm or openblas_set_num_threads";
    }
#else
    (void) have_avx512;
#endif
}

/* ---- operands ---- */

typedef struct problem {
    int64_t m, n, k;
    int grouped;
    int32_t offs[NGROUPS];
    float *af, *bf, *c;
    uint16_t *abf, *bbf;
    lowp_qtensor a_bf16, b_bf16, a_f32, b_f32;
    lowp_qtensor a_mx, b_mx, a_b128, b_w128, b_b32;
    lowp_qtensor a_nv, b_nv, a_mx4, b_mx4; /* NVFP4 (nv16 x nv16x16 weight), MXFP4 */
    lowp_qtensor b_grp[NGROUPS];
    void *bufs[32];
    int nbufs;
#ifdef LOWP_HAVE_DNNL
    dnnl_mm dnnl;
#endif
} problem;

static void *palloc(problem *p, size_t bytes) {
    void *v = lowp_bench_alloc(bytes);
    if (v) p->bufs[p->nbufs++] = v;
    return v;
}

/* Values about N(0, 1) (sum of uniforms), deterministic. */
static void fill(float *x, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        float s = 0;
        for (int t = 0; t < 4; t++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            s += (float) (seed >> 40) * (1.0f / 16777216.0f);
        }
        x[i] = (s - 2.0f) * 1.7320508f;
    }
}

static int quantize(problem *p, lowp_qtensor *q, lowp_format f, lowp_scaling s, const float *x,
                    int64_t rows, int64_t cols) {
    memset(q, 0, sizeof *q);
    q->format = f;
    q->scaling = s;
    q->rows = rows;
    q->cols = cols;
    q->device = LOWP_DEVICE_HOST;
    size_t db, sb;
    if (lowp_qtensor_nbytes(q, &db, &sb) != LOWP_OK) return -1;
    q->data = palloc(p, db);
    q->scales = palloc(p, sb ? sb : 64);
    if (!q->data || !q->scales) return -1;
    lowp_tensor t = {LOWP_FORMAT_F32, rows, cols, (void *) x, LOWP_DEVICE_HOST};
    lowp_status st = lowp_quantize(&t, q, NULL, NULL);
    if (st != LOWP_OK) {
        fprintf(stderr, "lowp bench gemm: lowp_quantize failed: %s: %s\n", lowp_status_str(st),
                lowp_last_error());
        return -1;
    }
    return 0;
}

static lowp_qtensor plain(lowp_format f, int64_t rows, int64_t cols, void *data) {
    lowp_qtensor q = {f, LOWP_SCALING_NONE, rows, cols, data, NULL, LOWP_DEVICE_HOST, NULL, 0};
    return q;
}

static int to_bf16(const float *x, uint16_t *y, int64_t rows, int64_t cols) {
    lowp_tensor s = {LOWP_FORMAT_F32, rows, cols, (void *) x, LOWP_DEVICE_HOST};
    lowp_tensor d = {LOWP_FORMAT_BF16, rows, cols, y, LOWP_DEVICE_HOST};
    return lowp_cast(&s, &d, NULL) == LOWP_OK ? 0 : -1;
}

/* Dense problem (grouped = 0) or grouped MXFP8 (m tokens, NGROUPS experts of [n, k]). */
static int setup(problem *p, int64_t m, int64_t n, int64_t k, int grouped) {
    memset(p, 0, sizeof *p);
    p->m = m;
    p->n = n;
    p->k = k;
    p->grouped = grouped;
    const int64_t bn = grouped ? NGROUPS * n : n;
    p->af = palloc(p, sizeof(float) * (size_t) (m * k));
    p->bf = palloc(p, sizeof(float) * (size_t) (bn * k));
    p->c = palloc(p, sizeof(float) * (size_t) (m * n));
    p->abf = palloc(p, 2 * (size_t) (m * k));
    p->bbf = palloc(p, 2 * (size_t) (n * k));
    if (!p->af || !p->bf || !p->c || !p->abf || !p->bbf) return -1;
    fill(p->af, (size_t) (m * k), 1);
    fill(p->bf, (size_t) (bn * k), 2);
    if (to_bf16(p->af, p->abf, m, k) || to_bf16(p->bf, p->bbf, n, k)) return -1;
    p->a_bf16 = plain(LOWP_FORMAT_BF16, m, k, p->abf);
    p->b_bf16 = plain(LOWP_FORMAT_BF16, n, k, p->bbf);
    if (quantize(p, &p->a_mx, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, p->af, m, k)) return -1;
    if (grouped) {
        /* Uneven expert loads, in eighths of the tokens: 1, 2, 1, 1.5, 0.5, 0.5, 1, 0.5. */
        static const int eighths2[NGROUPS] = {2, 4, 2, 3, 1, 1, 2, 1};
        int64_t end = 0;
        for (int g = 0; g < NGROUPS; g++) {
            end += m * eighths2[g] / 16;
            p->offs[g] = (int32_t) (g == NGROUPS - 1 ? m : end);
        }
        lowp_qtensor all;
        if (quantize(p, &all, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, p->bf, bn, k)) return -1;
        const int64_t sc = (k + 31) / 32;
        for (int g = 0; g < NGROUPS; g++) {
            p->b_grp[g] = all;
            p->b_grp[g].rows = n;
            p->b_grp[g].data = (uint8_t *) all.data + (size_t) (g * n * k);
            p->b_grp[g].scales = (uint8_t *) all.scales + (size_t) (g * n * sc);
        }
    } else {
        p->a_f32 = plain(LOWP_FORMAT_F32, m, k, p->af);
        p->b_f32 = plain(LOWP_FORMAT_F32, n, k, p->bf);
        if (quantize(p, &p->b_mx, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, p->bf, n, k) ||
            quantize(p, &p->a_b128, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128, p->af, m, k) ||
            quantize(p, &p->b_w128, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128X128, p->bf, n, k) ||
            quantize(p, &p->b_b32, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK32X32, p->bf, n, k) ||
            quantize(p, &p->a_nv, LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, p->af, m, k) ||
            quantize(p, &p->b_nv, LOWP_FORMAT_E2M1, LOWP_SCALING_NV16X16, p->bf, n, k) ||
            quantize(p, &p->a_mx4, LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, p->af, m, k) ||
            quantize(p, &p->b_mx4, LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, p->bf, n, k))
            return -1;
    }
#ifdef LOWP_HAVE_DNNL
    if (dnnl_setup(&p->dnnl, m, n, k, p->abf, p->bbf, p->c) != 0)
        fprintf(stderr, "lowp bench gemm: oneDNN matmul setup failed; skipping it\n");
#endif
    return 0;
}

static void teardown(problem *p) {
#ifdef LOWP_HAVE_DNNL
    dnnl_free(&p->dnnl);
#endif
    for (int i = 0; i < p->nbufs; i++) lowp_bench_free(p->bufs[i]);
    p->nbufs = 0;
}

static int available(const problem *p, kernel_id k) {
    if (p->grouped) {
        if (k == K_GROUPED) return 1;
#ifdef LOWP_HAVE_DNNL
        if (k == K_DNNL) return p->dnnl.ok;
#endif
        return 0;
    }
    switch (k) {
    case K_GROUPED: return 0;
    case K_DNNL:
#ifdef LOWP_HAVE_DNNL
        return p->dnnl.ok;
#else
        return 0;
#endif
    case K_OPENBLAS: return g_sgemm != NULL;
    default: return 1;
    }
}

/* One GEMM; returns 0, or -1 after printing why. */
static int run_once(problem *p, kernel_id k, int threads) {
    lowp_gemm_cfg cfg;
    lowp_gemm_cfg_init(&cfg);
    cfg.threads = threads;
    lowp_tensor c = {LOWP_FORMAT_F32, p->m, p->n, p->c, LOWP_DEVICE_HOST};
    lowp_status st = LOWP_OK;
    switch (k) {
    case K_BF16: st = lowp_gemm(&p->a_bf16, &p->b_bf16, &c, &cfg); break;
    case K_MXFP8: st = lowp_gemm(&p->a_mx, &p->b_mx, &c, &cfg); break;
    case K_B128: st = lowp_gemm(&p->a_b128, &p->b_w128, &c, &cfg); break;
    case K_B32: st = lowp_gemm(&p->a_mx, &p->b_b32, &c, &cfg); break;
    case K_NVFP4: st = lowp_gemm(&p->a_nv, &p->b_nv, &c, &cfg); break;
    case K_MXFP4: st = lowp_gemm(&p->a_mx4, &p->b_mx4, &c, &cfg); break;
    case K_F32: st = lowp_gemm(&p->a_f32, &p->b_f32, &c, &cfg); break;
    case K_GROUPED: st = lowp_grouped_gemm(&p->a_mx, p->b_grp, p->offs, NGROUPS, &c, &cfg); break;
    case K_DNNL:
#ifdef LOWP_HAVE_DNNL
        if (dnnl_run(&p->dnnl, threads) != 0) {
            fprintf(stderr, "lowp bench gemm: oneDNN matmul failed\n");
            return -1;
        }
#endif
        return 0;
    case K_OPENBLAS:
        g_blas_threads(threads);
        /* Row-major C = A . B^T: 101 CblasRowMajor, 111 NoTrans, 112 Trans. */
        g_sgemm(101, 111, 112, (int) p->m, (int) p->n, (int) p->k, 1.0f, p->af, (int) p->k, p->bf,
                (int) p->k, 0.0f, p->c, (int) p->n);
        return 0;
    default: return -1;
    }
    if (st != LOWP_OK) {
        fprintf(stderr, "lowp bench gemm: %s failed: %s: %s\n", KERNEL_NAMES[k],
                lowp_status_str(st), lowp_last_error());
        return -1;
    }
    return 0;
}

typedef struct result {
    kernel_id k;
    int64_t m, n, k_dim;
    int grouped, threads;
    double seconds, gflops, ratio; /* ratio to onednn_bf16 (0: none) */
} result;

/* The calling thread's CPU time, seconds (--clock cpu). */
static double thread_cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

static double (*g_clock)(void) = lowp_bench_now;

/* Time every available kernel of p on `threads`, interleaved; append to res. */
static int measure(problem *p, int threads, int reps, result *res, int *nres) {
    double *t[K_COUNT] = {0};
    int status = -1;
    for (int k = 0; k < K_COUNT; k++) {
        if (!available(p, (kernel_id) k)) continue;
        t[k] = malloc(sizeof(double) * (size_t) reps);
        if (!t[k]) goto out;
        if (run_once(p, (kernel_id) k, threads)) goto out; /* warm-up */
    }
    /* Each timed GEMM follows an untimed one of the same kernel, so that none is timed cold
     * from the kernel before it. On an AMX machine the first kernel of a round (lowp_bf16,
     * after OpenBLAS, lowp_f32 and oneDNN) measured 3.2-3.5 ms against 1.6 ms for the same
     * GEMM (2048x1152x384, one thread) with those three left out or with this warm-up. */
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < K_COUNT; k++) {
            if (!t[k]) continue;
            if (run_once(p, (kernel_id) k, threads)) goto out;
            double t0 = g_clock();
            if (run_once(p, (kernel_id) k, threads)) goto out;
            t[k][r] = g_clock() - t0;
        }
    const double flops = 2.0 * (double) p->m * (double) p->n * (double) p->k;
    double ref = 0;
    const int first = *nres;
    for (int k = 0; k < K_COUNT; k++) {
        if (!t[k]) continue;
        double med = lowp_bench_median(t[k], (size_t) reps);
        result *x = &res[(*nres)++];
        *x = (result){(kernel_id) k,
                      p->m,
                      p->n,
                      p->k,
                      p->grouped,
                      threads,
                      med,
                      med > 0 ? flops / med * 1e-9 : 0,
                      0};
        if (k == K_DNNL) ref = x->gflops;
    }
    for (int i = first; i < *nres; i++) res[i].ratio = ref > 0 ? res[i].gflops / ref : 0;
    status = 0;
out:
    for (int k = 0; k < K_COUNT; k++) free(t[k]);
    return status;
}

static void emit_json(const result *r, int reps) {
    lowp_bench_json j;
    lowp_bench_json_begin(&j);
    lowp_bench_json_str(&j, "bench", "gemm");
    lowp_bench_json_str(&j, "kernel", KERNEL_NAMES[r->k]);
    lowp_bench_json_int(&j, "m", r->m);
    lowp_bench_json_int(&j, "n", r->n);
    lowp_bench_json_int(&j, "k", r->k_dim);
    lowp_bench_json_int(&j, "groups", r->grouped ? NGROUPS : 0);
    lowp_bench_json_int(&j, "threads", r->threads);
    lowp_bench_json_int(&j, "reps", reps);
    lowp_bench_json_num(&j, "seconds", r->seconds);
    lowp_bench_json_num(&j, "gflops", r->gflops);
    if (r->ratio > 0) lowp_bench_json_num(&j, "ratio_to_onednn_bf16", r->ratio);
#ifdef LOWP_HAVE_DNNL
    if (r->ratio > 0 || r->k == K_DNNL) lowp_bench_json_str(&j, "onednn", dnnl_label());
#endif
    lowp_bench_json_end(&j, stdout);
}

/* "MxNxK" into out[0..2] (each 1..65536); -1 when it is not one. */
static int parse_shape(const char *s, int64_t out[3]) {
    for (int i = 0; i < 3; i++) {
        if (*s < '0' || *s > '9') return -1; /* no sign, no spaces (strtoll takes both) */
        char *end;
        errno = 0;
        const long long v = strtoll(s, &end, 10);
        if (end == s || errno != 0 || v < 1 || v > 65536) return -1;
        if (i < 2 && *end != 'x') return -1;
        if (i == 2 && *end != '\0') return -1;
        out[i] = v;
        s = end + 1;
    }
    return 0;
}

int lowp_bench_gemm(int argc, char **argv) {
    int json = 0, reps = 0, quick = 0;
    int64_t only[3] = {0, 0, 0}; /* --shape: M, N, K */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--quick") == 0) {
            quick = 1;
        } else if (strcmp(a, "--clock") == 0) {
            if (i + 1 >= argc || strcmp(argv[i + 1], "cpu") != 0) {
                fprintf(stderr, "lowp bench gemm: --clock takes cpu (the default is the wall "
                                "clock)\n");
                return 2;
            }
            g_clock = thread_cpu_now;
            i++;
        } else if (strcmp(a, "--shape") == 0) {
            if (i + 1 >= argc || parse_shape(argv[i + 1], only) != 0) {
                fprintf(stderr, "lowp bench gemm: --shape needs MxNxK, three integers in "
                                "1..65536 (for example 2048x1152x384)\n");
                return 2;
            }
            i++;
        } else if (strcmp(a, "--reps") == 0) {
            if (i + 1 >= argc || lowp_bench_parse_int(argv[i + 1], &reps) != 0 || reps > 10000) {
                fprintf(stderr, "lowp bench gemm: --reps needs an integer in 1..10000\n");
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "lowp bench gemm: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (reps == 0) reps = quick ? 3 : DEFAULT_REPS;

    lowp_caps caps;
    memset(&caps, 0, sizeof caps);
    lowp_device_caps(LOWP_DEVICE_HOST, &caps);
    load_openblas((caps.flags & LOWP_CAP_AVX512F) != 0);

    const int64_t shapes[3][3] = {{2048, 2048, 2048}, {4096, 4096, 1024}, {4096, 2048, 1024}};
    const int64_t qshapes[3][3] = {{1024, 1024, 1024}, {2048, 2048, 512}, {2048, 1024, 512}};
    result res[3 * 2 * K_COUNT];
    int nres = 0, status = 1;
    const int nshapes = only[0] > 0 ? 1 : 3;
    for (int s = 0; s < nshapes; s++) {
        const int64_t *sh = only[0] > 0 ? only : quick ? qshapes[s] : shapes[s];
        problem p;
        if (setup(&p, sh[0], sh[1], sh[2], nshapes == 3 && s == 2) != 0) {
            fprintf(stderr, "lowp bench gemm: out of memory or setup failed for %lldx%lldx%lld\n",
                    (long long) sh[0], (long long) sh[1], (long long) sh[2]);
            teardown(&p);
            return 1;
        }
        for (int threads = 1; threads <= (g_clock == lowp_bench_now ? 2 : 1); threads++)
            if (measure(&p, threads, reps, res, &nres) != 0) {
                teardown(&p);
                return 1;
            }
        teardown(&p);
    }

    if (json) {
        /* The table says it in its header; JSON consumers hear it on stderr. */
#ifndef LOWP_HAVE_DNNL
        fprintf(stderr, "lowp bench gemm: peer missing: oneDNN was not found at build time "
                        "(libdnnl-dev; `make bench` installs it): no onednn_bf16 rows\n");
#endif
        if (!g_sgemm)
            fprintf(stderr, "lowp bench gemm: peer missing: %s: no openblas_sgemm rows\n",
                    g_blas_why);
        for (int i = 0; i < nres; i++) emit_json(&res[i], reps);
        return 0;
    }
    char cpu[160];
    snprintf(cpu, sizeof cpu, "%s", caps.name);
    printf("lowp bench gemm on %s, pages %s (from 4 MiB): median of %d interleaved runs per "
           "kernel (%s), each after an untimed one, F32 output;\n"
           "GFLOP/s = 2*M*N*K / time; ratio = GFLOP/s / oneDNN BF16's on the same shape and "
           "threads\n(grouped: %d experts, uneven groups; oneDNN runs the dense GEMM of the same "
           "FLOPs)\n",
           cpu, lowp_bench_pages(), reps,
           g_clock == lowp_bench_now ? "wall clock" : "CPU time of the calling thread, 1 thread",
           NGROUPS);
#ifdef LOWP_HAVE_DNNL
    printf("onednn_bf16 (the ratios' peer): %s, BF16 matmul, F32 output\n", dnnl_label());
#else
    printf("peer missing: oneDNN was not found at build time (libdnnl-dev; `make bench` installs "
           "it): no ratios\n");
#endif
    if (!g_sgemm) printf("peer missing: %s\n", g_blas_why);
    printf("\n%-20s %-18s %7s %10s %9s %9s\n", "kernel", "M x N x K", "threads", "ms", "GFLOP/s",
           "vs oneDNN");
    for (int i = 0; i < nres; i++) {
        const result *r = &res[i];
        char shape[64];
        snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long) r->m, (long long) r->n,
                 (long long) r->k_dim);
        printf("%-20s %-18s %7d %10.2f %9.1f", KERNEL_NAMES[r->k], shape, r->threads,
               r->seconds * 1e3, r->gflops);
        if (r->ratio > 0) printf(" %9.2f", r->ratio);
        printf("\n");
        if (i + 1 < nres && res[i + 1].threads != r->threads) printf("\n");
    }
    status = 0;
    return status;
}
