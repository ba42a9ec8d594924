/* `lowp gemm`: quantize two float32 .npy operands with one of lowp's scaling kinds and multiply
 * them with lowp_gemm (or lowp_grouped_gemm, split-M, with --offs), through the public API. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_common.h"
#include "lowp/lowp.h"
#include "npy.h"

static const char GEMM_USAGE[] =
    "usage: lowp gemm --format FMT --scaling KIND [--scale-mode M] [--b-format FMT]\n"
    "                 [--b-scaling KIND] [--offs OFFS.npy] [--threads N] A.npy B.npy OUT.npy\n"
    "\n"
    "C = A . B^T from the quantized operands: A float32 [M, K], B float32 [N, K] (or [G, N, K]\n"
    "with --offs), both quantized along K as lowp_quantize does, multiplied by lowp_gemm; OUT is\n"
    "float32 [M, N].\n"
    "\n"
    "  --format FMT      A's element format: e4m3, e5m2, e2m1 (mx32, nv16, nv16x16), or f32 /\n"
    "                    bf16 with --scaling none (the unquantized baselines)\n"
    "  --scaling KIND    A's scaling: none, tensor, row, mx32, block128, nv16 (NVFP4)\n"
    "  --scale-mode M    mx32 and block32x32: rceil (default for mx32), floor (default for\n"
    "                    block32x32), ceil or even\n"
    "  --b-format FMT    B's element format (default: A's)\n"
    "  --b-scaling KIND  B's scaling (default: A's; block128x128 for block128). The pairs\n"
    "                    lowp_gemm multiplies: none x none, tensor x tensor, row x row,\n"
    "                    mx32 x mx32, block128 x block128x128, block128 x block128,\n"
    "                    mx32 x block32x32, nv16 or nv16x16 x nv16 or nv16x16 (e2m1)\n"
    "  --offs OFFS.npy   grouped (MoE, split-M): int32 [G] cumulative row ends of A; B is\n"
    "                    [G, N, K] and group g's rows [offs[g-1], offs[g]) use B[g]; rows past\n"
    "                    offs[G-1] are 0 in OUT\n"
    "  --threads N       threads to use; 0 (default) uses every core\n"
    "\n"
    "Exit status: 0 success, 2 bad usage or bad input file, 1 any other failure.\n";

typedef struct gemm_opts {
    const char *format, *scaling, *scale_mode, *b_format, *b_scaling, *offs;
    int32_t threads;
} gemm_opts;

static const lowp_cli_opt GEMM_OPTS[] = {
    LOWP_CLI_STR("--format", gemm_opts, format),
    LOWP_CLI_STR("--scaling", gemm_opts, scaling),
    LOWP_CLI_STR("--scale-mode", gemm_opts, scale_mode),
    LOWP_CLI_STR("--b-format", gemm_opts, b_format),
    LOWP_CLI_STR("--b-scaling", gemm_opts, b_scaling),
    LOWP_CLI_STR("--offs", gemm_opts, offs),
    LOWP_CLI_I32("--threads", gemm_opts, threads, 0, LOWP_MAX_THREADS),
};

/* The resolved operand settings. */
typedef struct operand_spec {
    lowp_format format;
    lowp_scaling scaling;
} operand_spec;

typedef struct gemm_args {
    operand_spec a, b;
    lowp_quant_cfg qcfg;
    lowp_gemm_cfg gcfg;
    const char *a_path, *b_path, *out_path, *offs_path;
} gemm_args;

static const char *const CMD = "gemm";

static int parse_spec(const char *fmt_opt, const char *fmt, const char *kind_opt, const char *kind,
                      operand_spec *out) {
    if (lowp_format_from_name(fmt, &out->format) != LOWP_OK ||
        (out->format != LOWP_FORMAT_E4M3 && out->format != LOWP_FORMAT_E5M2 &&
         out->format != LOWP_FORMAT_E2M1 && out->format != LOWP_FORMAT_F32 &&
         out->format != LOWP_FORMAT_BF16))
        return lowp_cli_fail(CMD, 2, "%s: '%s' is not e4m3, e5m2, e2m1, f32 or bf16", fmt_opt, fmt);
    if (lowp_scaling_from_name(kind, &out->scaling) != LOWP_OK)
        return lowp_cli_fail(
            CMD, 2,
            "%s: '%s' is not none, tensor, row, mx32, block128, block128x128, block32x32, nv16 or "
            "nv16x16",
            kind_opt, kind);
    const int plain = out->format == LOWP_FORMAT_F32 || out->format == LOWP_FORMAT_BF16;
    if (plain != (out->scaling == LOWP_SCALING_NONE))
        return lowp_cli_fail(CMD, 2, "%s %s goes with %s none only (and none with f32 or bf16)",
                             fmt_opt, fmt, kind_opt);
    return -1;
}

/* -1: go on; else the exit status. */
static int parse_gemm_args(int argc, char **argv, gemm_args *g) {
    gemm_opts o;
    memset(&o, 0, sizeof o);
    lowp_cli_args a = {CMD, GEMM_USAGE, GEMM_OPTS, (int) (sizeof GEMM_OPTS / sizeof GEMM_OPTS[0]),
                       &o,  {0},        {0},       0};
    int rc = lowp_cli_parse(&a, argc, argv);
    if (rc >= 0) return rc;
    memset(g, 0, sizeof *g);
    if (!o.format || !o.scaling)
        return lowp_cli_fail(CMD, 2,
                             "missing --format FMT and --scaling KIND (see `lowp gemm --help`)");
    if ((rc = parse_spec("--format", o.format, "--scaling", o.scaling, &g->a)) >= 0) return rc;
    const char *bk = o.b_scaling
                         ? o.b_scaling
                         : (g->a.scaling == LOWP_SCALING_BLOCK128 ? "block128x128" : o.scaling);
    if ((rc = parse_spec("--b-format", o.b_format ? o.b_format : o.format, "--b-scaling", bk,
                         &g->b)) >= 0)
        return rc;
    lowp_quant_cfg_init(&g->qcfg);
    g->qcfg.threads = o.threads;
    if (o.scale_mode && (lowp_scale_mode_from_name(o.scale_mode, &g->qcfg.scale_mode) != LOWP_OK ||
                         g->qcfg.scale_mode == LOWP_SCALE_MODE_DEFAULT))
        return lowp_cli_fail(CMD, 2, "--scale-mode: '%s' is not rceil, floor, ceil or even",
                             o.scale_mode);
    lowp_gemm_cfg_init(&g->gcfg);
    g->gcfg.threads = o.threads;
    if (a.npos != 3)
        return lowp_cli_fail(CMD, 2, "expected A.npy B.npy OUT.npy (got %d arguments)", a.npos);
    g->a_path = a.pos[0];
    g->b_path = a.pos[1];
    g->out_path = a.pos[2];
    g->offs_path = o.offs;
    return -1;
}

/* One operand: its descriptor and buffers (plain operands are cast to their format). */
typedef struct operand {
    lowp_qtensor q;
} operand;

static void operand_free(operand *op) {
    free(op->q.data);
    free(op->q.scales);
    memset(op, 0, sizeof *op);
}

/* Quantize (or cast) x[rows, cols] into op. Returns -1 or the exit status. */
static int make_operand(const operand_spec *s, const lowp_quant_cfg *qc, const float *x,
                        int64_t rows, int64_t cols, operand *op) {
    memset(op, 0, sizeof *op);
    lowp_qtensor *q = &op->q;
    q->format = s->format;
    q->scaling = s->scaling;
    q->rows = rows;
    q->cols = cols;
    q->device = LOWP_DEVICE_HOST;
    size_t db = 0, sb = 0;
    lowp_status st = lowp_qtensor_nbytes(q, &db, &sb);
    if (st != LOWP_OK) return lowp_cli_lib_fail(CMD, st);
    q->data = malloc(db + 1);
    q->scales = sb ? malloc(sb) : NULL;
    if (!q->data || (sb && !q->scales))
        return lowp_cli_fail(CMD, 1, "out of memory for a %lld x %lld operand", (long long) rows,
                             (long long) cols);
    lowp_tensor t = {LOWP_FORMAT_F32, rows, cols, (void *) x, LOWP_DEVICE_HOST};
    if (s->scaling == LOWP_SCALING_NONE) {
        lowp_tensor d = {s->format, rows, cols, q->data, LOWP_DEVICE_HOST};
        st = lowp_cast(&t, &d, NULL);
    } else {
        lowp_quant_cfg c = *qc;
        if (s->scaling != LOWP_SCALING_MX32 && s->scaling != LOWP_SCALING_BLOCK32X32)
            c.scale_mode = LOWP_SCALE_MODE_DEFAULT;
        st = lowp_quantize(&t, q, NULL, &c);
    }
    return st == LOWP_OK ? -1 : lowp_cli_lib_fail(CMD, st);
}

/* The inputs: A 2-D, B 2-D (or 3-D with offs), offs int32 [G]. */
typedef struct gemm_inputs {
    lowp_npy a, b, offs;
    int64_t M, K, N, G;
} gemm_inputs;

static int read_inputs(const gemm_args *g, gemm_inputs *in) {
    char err[1024];
    lowp_status st = lowp_npy_read(g->a_path, LOWP_NPY_F4, &in->a, err, sizeof err);
    if (st == LOWP_OK) st = lowp_npy_read(g->b_path, LOWP_NPY_F4, &in->b, err, sizeof err);
    if (st == LOWP_OK && g->offs_path)
        st = lowp_npy_read(g->offs_path, LOWP_NPY_I4, &in->offs, err, sizeof err);
    if (st != LOWP_OK) return lowp_cli_fail(CMD, st == LOWP_ERR_OUT_OF_MEMORY ? 1 : 2, "%s", err);
    if (in->a.ndim != 2)
        return lowp_cli_fail(CMD, 2, "%s: A must be 2-D [M, K] (it has %d dimensions)", g->a_path,
                             in->a.ndim);
    in->M = in->a.shape[0];
    in->K = in->a.shape[1];
    const int grouped = g->offs_path != NULL;
    if (in->b.ndim != (grouped ? 3 : 2))
        return lowp_cli_fail(CMD, 2, "%s: B must be %s (it has %d dimensions)", g->b_path,
                             grouped ? "3-D [G, N, K] with --offs" : "2-D [N, K]", in->b.ndim);
    in->G = grouped ? in->b.shape[0] : 1;
    in->N = in->b.shape[grouped ? 1 : 0];
    if (in->b.shape[grouped ? 2 : 1] != in->K)
        return lowp_cli_fail(CMD, 2, "%s: K (%lld) != A's K (%lld)", g->b_path,
                             (long long) in->b.shape[grouped ? 2 : 1], (long long) in->K);
    if (in->M == 0 || in->K == 0 || in->N == 0 || in->G == 0)
        return lowp_cli_fail(CMD, 2, "empty operands: A (%lld, %lld), B N = %lld, G = %lld",
                             (long long) in->M, (long long) in->K, (long long) in->N,
                             (long long) in->G);
    if (grouped && (in->offs.ndim != 1 || in->offs.shape[0] != in->G))
        return lowp_cli_fail(CMD, 2, "%s: offs must be int32 [G] with G = %lld (B's groups)",
                             g->offs_path, (long long) in->G);
    return -1;
}

static int run_gemm(const gemm_args *g) {
    gemm_inputs in;
    memset(&in, 0, sizeof in);
    operand a, *b = NULL;
    memset(&a, 0, sizeof a);
    float *c = NULL;
    int rc = read_inputs(g, &in);
    if (rc < 0) rc = make_operand(&g->a, &g->qcfg, in.a.data, in.M, in.K, &a);
    if (rc < 0 && !(b = calloc((size_t) in.G, sizeof *b)))
        rc = lowp_cli_fail(CMD, 1, "out of memory");
    for (int64_t i = 0; rc < 0 && i < in.G; i++)
        rc = make_operand(&g->b, &g->qcfg, (const float *) in.b.data + i * in.N * in.K, in.N, in.K,
                          &b[i]);
    if (rc < 0 && !(c = calloc((size_t) (in.M * in.N) + 1, sizeof *c)))
        rc = lowp_cli_fail(CMD, 1, "out of memory for C [%lld, %lld]", (long long) in.M,
                           (long long) in.N);
    if (rc < 0) {
        lowp_tensor ct = {LOWP_FORMAT_F32, in.M, in.N, c, LOWP_DEVICE_HOST};
        lowp_qtensor *bq = malloc((size_t) in.G * sizeof *bq);
        lowp_status st = LOWP_ERR_OUT_OF_MEMORY;
        if (bq) {
            for (int64_t i = 0; i < in.G; i++) bq[i] = b[i].q;
            st = g->offs_path
                     ? lowp_grouped_gemm(&a.q, bq, in.offs.data, (int32_t) in.G, &ct, &g->gcfg)
                     : lowp_gemm(&a.q, bq, &ct, &g->gcfg);
        }
        free(bq);
        if (st != LOWP_OK) rc = lowp_cli_lib_fail(CMD, st);
    }
    if (rc < 0) {
        char err[1024];
        int64_t shape[2] = {in.M, in.N};
        rc = lowp_npy_write(g->out_path, LOWP_NPY_F4, 2, shape, c, err, sizeof err) == LOWP_OK
                 ? 0
                 : lowp_cli_fail(CMD, 1, "%s", err);
    }
    free(c);
    for (int64_t i = 0; b && i < in.G; i++) operand_free(&b[i]);
    free(b);
    operand_free(&a);
    lowp_npy_free(&in.a);
    lowp_npy_free(&in.b);
    lowp_npy_free(&in.offs);
    return rc;
}

int lowp_cli_gemm(int argc, char **argv) {
    gemm_args g;
    int rc = parse_gemm_args(argc, argv, &g);
    return rc >= 0 ? rc : run_gemm(&g);
}
