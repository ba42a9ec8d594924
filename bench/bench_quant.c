/* `lowp bench quant`: throughput of lowp_quantize beside memcpy.
 *
 * Quantizes one BF16 input (default 8192x4096, 64 MiB: twice a 32 MiB L3; --input f32 for the
 * trainer's binary32 activations) to E4M3 with the training kinds: MXFP8 rowwise, MXFP8
 * dual-axis (rowwise and columnwise copies from one call), BLOCK128 rowwise, BLOCK128x128 and
 * BLOCK32x32 (one copy: the tile kinds serve both GEMMs from it), and the dual-axis forms of
 * BLOCK128, rowwise (ROW) and tensorwise (TENSOR) scaling, on 1 and 2 threads. Bandwidth is (bytes
 * read + bytes written) / median time, the written bytes being codes plus scales. The memcpy
 * baseline copies the input (B bytes read, B written) and is timed in the same rounds: every round
 * runs memcpy and then each kernel once, so that the noise of a shared machine hits all of them
 * alike, and the medians of many such short rounds are reported.
 *
 * --fp4 measures the E2M1 kinds instead: NVFP4 (nv16 rowwise and dual-axis, nv16x16) and MXFP4
 * (mx32 rowwise and dual-axis); --clock cpu times the calling thread's CPU time on one thread
 * (for a shared, loaded machine).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cli.h"
#include "lowp/lowp.h"

#define DEFAULT_ROWS 8192
#define DEFAULT_COLS 4096
#define DEFAULT_REPS 21
#define NKERNELS     8

static void usage(FILE *f) {
    fprintf(f,
            "usage: lowp bench quant [--json] [--rows R --cols C] [--reps N]\n"
            "                        [--path auto|reference|avx512|avx2] [--input bf16|f32]\n"
            "                        [--fp4] [--clock cpu]\n"
            "  --rows R, --cols C  shape of the input (default %dx%d)\n"
            "  --input F    the input's format, bf16 (default) or f32\n"
            "  --reps N     timed rounds; each runs memcpy and every kernel once (default %d)\n"
            "  --path P     the kernel path to measure (default auto)\n"
            "  --json       one JSON object per line instead of the table\n"
            "  --fp4        the E2M1 kinds instead: nvfp4_row, nvfp4_dual, nvfp4_16x16 (nv16x16),\n"
            "               mxfp4_row, mxfp4_dual (mx32)\n"
            "  --clock cpu  the calling thread's CPU time instead of the wall clock, 1 thread\n"
            "Kernels (E4M3 elements): mxfp8_row, mxfp8_dual (row + col copies), block128_row,\n"
            "block128x128, block32x32, block128_dual, row_dual, tensor_dual. Bandwidth is (bytes "
            "read + bytes written) / median time\n"
            "on 1 and 2 threads, beside a memcpy of the input timed in the same rounds.\n",
            DEFAULT_ROWS, DEFAULT_COLS, DEFAULT_REPS);
}

typedef struct kernel_def {
    const char *name;
    lowp_scaling scaling;
    int col; /* also the columnwise copy */
} kernel_def;

static const kernel_def KERNELS[NKERNELS] = {
    {"mxfp8_row", LOWP_SCALING_MX32, 0},        {"mxfp8_dual", LOWP_SCALING_MX32, 1},
    {"block128_row", LOWP_SCALING_BLOCK128, 0}, {"block128x128", LOWP_SCALING_BLOCK128X128, 0},
    {"block32x32", LOWP_SCALING_BLOCK32X32, 0}, {"block128_dual", LOWP_SCALING_BLOCK128, 1},
    {"row_dual", LOWP_SCALING_ROW, 1},          {"tensor_dual", LOWP_SCALING_TENSOR, 1},
};

#define NFP4 5
static const kernel_def FP4_KERNELS[NFP4] = {
    {"nvfp4_row", LOWP_SCALING_NV16, 0},      {"nvfp4_dual", LOWP_SCALING_NV16, 1},
    {"nvfp4_16x16", LOWP_SCALING_NV16X16, 0}, {"mxfp4_row", LOWP_SCALING_MX32, 0},
    {"mxfp4_dual", LOWP_SCALING_MX32, 1},
};

/* The kernel set measured (KERNELS, or FP4_KERNELS with --fp4), its size and element format. */
static const kernel_def *g_kern = KERNELS;
static int g_nkern = NKERNELS;
static lowp_format g_efmt = LOWP_FORMAT_E4M3;

/* The calling thread's CPU time, seconds (--clock cpu). */
static double thread_cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

static double (*g_clock)(void) = lowp_bench_now;

/* Kernels a forced --path refused (LOWP_ERR_UNSUPPORTED in the warm-up): reported as n/a. */
static int g_skip[NKERNELS];

typedef struct kernel_run {
    lowp_qtensor row, col;
    size_t bytes; /* read + written per call */
} kernel_run;

static int quant_once(const lowp_tensor *x, kernel_run *k, int col, const lowp_quant_cfg *cfg) {
    lowp_status st = lowp_quantize(x, &k->row, col ? &k->col : NULL, cfg);
    if (st != LOWP_OK) {
        fprintf(stderr, "lowp bench quant: lowp_quantize failed: %s: %s\n", lowp_status_str(st),
                lowp_last_error());
        return -1;
    }
    return 0;
}

static int parse_dim(const char *opt, const char *v, int64_t *out) {
    int n;
    if (lowp_bench_parse_int(v, &n) != 0 || n > (1 << 20)) {
        fprintf(stderr, "lowp bench quant: %s '%s' is not an integer in 1..1048576\n", opt, v);
        return -1;
    }
    *out = n;
    return 0;
}

static void emit_json(const char *kernel, const char *input, int threads, int64_t rows,
                      int64_t cols, size_t bytes, int reps, const char *path, double seconds,
                      double gbps, double ratio) {
    lowp_bench_json j;
    lowp_bench_json_begin(&j);
    lowp_bench_json_str(&j, "bench", "quant");
    lowp_bench_json_str(&j, "kernel", kernel);
    lowp_bench_json_str(&j, "input", input);
    lowp_bench_json_int(&j, "threads", threads);
    lowp_bench_json_int(&j, "rows", (long long) rows);
    lowp_bench_json_int(&j, "cols", (long long) cols);
    lowp_bench_json_int(&j, "bytes", (long long) bytes);
    lowp_bench_json_int(&j, "reps", reps);
    lowp_bench_json_str(&j, "pages", lowp_bench_pages());
    lowp_bench_json_num(&j, "seconds", seconds);
    lowp_bench_json_num(&j, "gbps", gbps);
    if (ratio > 0) {
        lowp_bench_json_str(&j, "path", path);
        lowp_bench_json_num(&j, "ratio_to_memcpy", ratio);
    }
    lowp_bench_json_end(&j, stdout);
}

typedef struct quant_opts {
    int json, reps, f32; /* f32: binary32 input */
    int64_t rows, cols;
    lowp_kernel_path path;
} quant_opts;

/* The command line into o: 0 to run, 1 when --help was printed, 2 on bad usage. */
static int parse_args(int argc, char **argv, quant_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--fp4") == 0) {
            g_kern = FP4_KERNELS;
            g_nkern = NFP4;
            g_efmt = LOWP_FORMAT_E2M1;
        } else if (strcmp(a, "--clock") == 0) {
            if (i + 1 >= argc || strcmp(argv[i + 1], "cpu") != 0) {
                fprintf(stderr, "lowp bench quant: --clock takes cpu (the default is the wall "
                                "clock)\n");
                return 2;
            }
            i++;
            g_clock = thread_cpu_now;
        } else if (strcmp(a, "--rows") == 0 || strcmp(a, "--cols") == 0 ||
                   strcmp(a, "--reps") == 0 || strcmp(a, "--path") == 0 ||
                   strcmp(a, "--input") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "lowp bench quant: %s needs a value (see --help)\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (strcmp(a, "--rows") == 0) {
                if (parse_dim(a, v, &o->rows)) return 2;
            } else if (strcmp(a, "--cols") == 0) {
                if (parse_dim(a, v, &o->cols)) return 2;
            } else if (strcmp(a, "--reps") == 0) {
                if (lowp_bench_parse_int(v, &o->reps) != 0 || o->reps > 100000) {
                    fprintf(stderr,
                            "lowp bench quant: --reps '%s' is not an integer in 1..100000\n", v);
                    return 2;
                }
            } else if (strcmp(a, "--input") == 0) {
                if (strcmp(v, "bf16") != 0 && strcmp(v, "f32") != 0) {
                    fprintf(stderr, "lowp bench quant: --input '%s' is not one of bf16, f32\n", v);
                    return 2;
                }
                o->f32 = strcmp(v, "f32") == 0;
            } else if (lowp_bench_parse_path(v, &o->path) != 0) {
                fprintf(stderr,
                        "lowp bench quant: --path '%s' is not one of auto, reference, avx512\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "lowp bench quant: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    return 0;
}

/* Every kernel's output descriptors and buffers for a rows x cols input, and the bytes one
 * call moves (input read, codes and scales written). -1 on failure (message printed). */
static int alloc_outputs(kernel_run *kr, int64_t rows, int64_t cols, size_t in_bytes) {
    for (int k = 0; k < g_nkern; k++) {
        kernel_run *r = &kr[k];
        const lowp_qtensor proto = {g_efmt, g_kern[k].scaling, rows, cols, NULL,
                                    NULL,   LOWP_DEVICE_HOST,  NULL, 0};
        r->row = proto;
        r->col = proto;
        r->col.rows = cols;
        r->col.cols = rows;
        r->bytes = in_bytes;
        for (int c = 0; c <= g_kern[k].col; c++) {
            lowp_qtensor *q = c ? &r->col : &r->row;
            size_t db, sb;
            if (lowp_qtensor_nbytes(q, &db, &sb) != LOWP_OK) {
                fprintf(stderr, "lowp bench quant: %s\n", lowp_last_error());
                return -1;
            }
            q->data = lowp_bench_alloc(db);
            q->scales = lowp_bench_alloc(sb);
            if (!q->data || !q->scales) {
                fprintf(stderr, "lowp bench quant: out of memory for the outputs\n");
                return -1;
            }
            r->bytes += db + sb;
        }
    }
    return 0;
}

/* BF16 values with block magnitudes varying over a few binades, so that scales differ from
 * block to block (the kernels are branch-free: the mix only matters for realism); f32: the
 * same values as binary32 with random low mantissa bits. */
static void fill_input(void *x, size_t n, int f32) {
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t e = 120u + ((uint32_t) (i / 32) * 0x9E3779B1u >> 29); /* 2^-7 .. 2^0 */
        const uint32_t h = (uint32_t) (s >> 63) << 15 | e << 7 | (uint32_t) ((s >> 40) & 0x7F);
        if (f32)
            ((uint32_t *) x)[i] = h << 16 | (uint32_t) ((s >> 20) & 0xFFFF);
        else
            ((uint16_t *) x)[i] = (uint16_t) h;
    }
}

/* med [NKERNELS + 1]: median seconds of memcpy (0) and each kernel on `threads`, over reps
 * rounds that each run memcpy and then every kernel once. times: reps x (NKERNELS + 1). */
static int time_rounds(const lowp_tensor *xt, void *mdst, size_t in_bytes, kernel_run *kr,
                       lowp_quant_cfg *cfg, int threads, int reps, double *times, double *med) {
    cfg->threads = threads;
    /* Warm-up: thread pool started, code and TLB entries hot. */
    lowp_bench_memcpy(mdst, xt->data, in_bytes, threads);
    for (int k = 0; k < g_nkern; k++) {
        const lowp_status st =
            lowp_quantize(xt, &kr[k].row, g_kern[k].col ? &kr[k].col : NULL, cfg);
        if (st == LOWP_ERR_UNSUPPORTED && cfg->path != LOWP_PATH_AUTO && !g_skip[k]) {
            fprintf(stderr, "lowp bench quant: %s: n/a (%s)\n", g_kern[k].name, lowp_last_error());
            g_skip[k] = 1;
        } else if (st != LOWP_OK && !g_skip[k] && quant_once(xt, &kr[k], g_kern[k].col, cfg)) {
            return -1;
        }
    }
    for (int r = 0; r < reps; r++) {
        double t0 = g_clock();
        lowp_bench_memcpy(mdst, xt->data, in_bytes, threads);
        double t1 = g_clock();
        times[r] = t1 - t0;
        for (int k = 0; k < g_nkern; k++) {
            if (g_skip[k]) continue;
            t0 = g_clock();
            if (quant_once(xt, &kr[k], g_kern[k].col, cfg)) return -1;
            t1 = g_clock();
            times[(size_t) (k + 1) * (size_t) reps + (size_t) r] = t1 - t0;
        }
    }
    for (int k = 0; k <= g_nkern; k++)
        med[k] = k && g_skip[k - 1]
                     ? 0
                     : lowp_bench_median(times + (size_t) k * (size_t) reps, (size_t) reps);
    return 0;
}

/* The table (or JSON lines) of one thread count's medians. */
static void report(const quant_opts *o, const char *path_name, int threads, const double *med,
                   const kernel_run *kr, size_t in_bytes) {
    const double mgbps = med[0] > 0 ? 2.0 * (double) in_bytes / med[0] / 1e9 : 0;
    for (int k = 0; k <= g_nkern; k++) {
        const char *name = k ? g_kern[k - 1].name : "memcpy";
        const size_t bytes = k ? kr[k - 1].bytes : 2 * in_bytes;
        const double sec = med[k], gbps = sec > 0 ? (double) bytes / sec / 1e9 : 0;
        const double ratio = k && mgbps > 0 ? gbps / mgbps : 0;
        if (k && g_skip[k - 1]) {
            if (!o->json) printf("%-14s %7d %10s\n", name, threads, "n/a");
        } else if (o->json) {
            emit_json(name, o->f32 ? "f32" : "bf16", threads, o->rows, o->cols, bytes, o->reps,
                      path_name, sec, gbps, ratio);
        } else {
            printf("%-14s %7d %10.1f %10.3f %9.2f", name, threads, (double) bytes / 1e6, sec * 1e3,
                   gbps);
            if (k) printf(" %10.2f", ratio);
            printf("\n");
        }
    }
}

int lowp_bench_quant(int argc, char **argv) {
    quant_opts o = {0, DEFAULT_REPS, 0, DEFAULT_ROWS, DEFAULT_COLS, LOWP_PATH_AUTO};
    const int pr = parse_args(argc, argv, &o);
    if (pr) return pr == 1 ? 0 : pr;
    const char *path_name = lowp_bench_path_name(o.path);
    const size_t n = (size_t) o.rows * (size_t) o.cols, in_bytes = (o.f32 ? 4 : 2) * n;
    int status = 1;
    void *x = lowp_bench_alloc(in_bytes);
    uint8_t *mdst = lowp_bench_alloc(in_bytes);
    kernel_run kr[NKERNELS];
    memset(kr, 0, sizeof kr);
    double *times = malloc(sizeof(double) * (size_t) o.reps * (NKERNELS + 1)); /* >= g_nkern */
    if (!x || !mdst || !times) {
        fprintf(stderr, "lowp bench quant: out of memory for a %lldx%lld input\n",
                (long long) o.rows, (long long) o.cols);
        goto out;
    }
    if (alloc_outputs(kr, o.rows, o.cols, in_bytes)) goto out;
    fill_input(x, n, o.f32);
    lowp_tensor xt = {o.f32 ? LOWP_FORMAT_F32 : LOWP_FORMAT_BF16, o.rows, o.cols, x,
                      LOWP_DEVICE_HOST};
    lowp_quant_cfg cfg;
    lowp_quant_cfg_init(&cfg);
    cfg.path = o.path;
    double med[2][NKERNELS + 1]; /* [threads-1][0: memcpy, 1..: kernels] */
    const int nthreads = g_clock == lowp_bench_now ? 2 : 1;
    for (int ti = 0; ti < nthreads; ti++)
        if (time_rounds(&xt, mdst, in_bytes, kr, &cfg, ti + 1, o.reps, times, med[ti])) goto out;
    if (!o.json) {
        printf("lowp bench quant: %lldx%lld %s -> %s, path %s, pages %s (from 4 MiB),\n"
               "median of %d rounds (memcpy of the %.1f MiB input, then each kernel), %s\n\n",
               (long long) o.rows, (long long) o.cols, o.f32 ? "f32" : "bf16",
               g_efmt == LOWP_FORMAT_E2M1 ? "e2m1" : "e4m3", path_name, lowp_bench_pages(), o.reps,
               (double) in_bytes / (1 << 20),
               g_clock == lowp_bench_now ? "wall clock" : "CPU time of the calling thread");
        printf("%-14s %7s %10s %10s %9s %10s\n", "kernel", "threads", "MB moved", "ms", "GB/s",
               "vs memcpy");
    }
    for (int ti = 0; ti < nthreads; ti++) report(&o, path_name, ti + 1, med[ti], kr, in_bytes);
    status = 0;
out:
    for (int k = 0; k < NKERNELS; k++) {
        lowp_bench_free(kr[k].row.data);
        lowp_bench_free(kr[k].row.scales);
        lowp_bench_free(kr[k].col.data);
        lowp_bench_free(kr[k].col.scales);
    }
    free(times);
    lowp_bench_free(x);
    lowp_bench_free(mdst);
    return status;
}
