/* `lowp quantize` (quantize a 2-D float32 .npy array with one of lowp's scaling kinds into
 * element codes and scales) and `lowp dequantize` (decode them back to float32). Both go
 * through the public API only: lowp_quantize, lowp_dequantize, lowp_qtensor_nbytes,
 * lowp_qtensor_scale_shape.
 *
 * Files written by `lowp quantize ... IN.npy OUT`:
 *   OUT.data.npy       uint8 [R, C] codes of the rowwise copy ([R, ceil(C/2)] for e2m1: two
 *                      codes per byte, element 2i in the low nibble)
 *   OUT.scale.npy      its scales in lowp's canonical layout: uint8 E8M0 codes (mx32,
 *                      block32x32), uint8 E4M3 block scale codes (nv16, nv16x16) or float32
 *                      scale_inv (tensor, row, block128, block128x128)
 *   OUT.tensor_scale.npy  nv16, nv16x16: the float32 tensor decode scale D, shape (1,)
 *   OUT.col.data.npy   the columnwise copy: X^T [C, R] quantized along R (--axis col|both)
 *   OUT.col.scale.npy  its scales (and OUT.col.tensor_scale.npy)
 *   OUT.json           the metadata `lowp dequantize` reads back, written last (atomically,
 *                      after any old OUT.json is removed), with a 64-bit FNV-1a hash of each
 *                      array's bytes ("row_data_fnv1a64", ...): dequantize refuses codes and
 *                      scales that are not the set this JSON describes
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_common.h"
#include "io/json.h"
#include "lowp/lowp.h"
#include "npy.h"

static const char QUANT_USAGE[] =
    "usage: lowp quantize --format e4m3|e5m2|e2m1|nvfp4\n"
    "                     --scaling tensor|row|mx32|block128|block128x128|block32x32|nv16|\n"
    "                               nv16x16\n"
    "                     [--scale-mode rceil|floor|ceil|even] [--pow2 | --no-pow2] [--eps X]\n"
    "                     [--axis row|col|both] [--threads N] IN.npy OUT\n"
    "\n"
    "Quantize a 2-D float32 .npy array X [R, C] as lowp_quantize does (docs/numerics.md 3-4b).\n"
    "Writes OUT.data.npy (uint8 element codes [R, C]; e2m1 packed two per byte along the row,\n"
    "element 2i in the low nibble) and OUT.scale.npy (scales in lowp's canonical layout: uint8\n"
    "E8M0 codes for mx32 and block32x32, uint8 E4M3 codes for nv16 and nv16x16, float32\n"
    "scale_inv for the others; nv16 and nv16x16 add OUT.tensor_scale.npy, the float32 tensor\n"
    "decode scale, shape (1,)) for the rowwise copy; OUT.col.* for the columnwise copy (X^T\n"
    "[C, R] quantized along R); and OUT.json with the metadata.\n"
    "\n"
    "  --format F        element format: e4m3, e5m2, or e2m1 (mx32, nv16, nv16x16 only);\n"
    "                    nvfp4 is e2m1 with --scaling nv16 unless another nv kind is given\n"
    "  --scaling K       scaling kind (one scale per tensor, per row, per 1x32 block with E8M0\n"
    "                    scales, per 1x128 block, per 128x128 tile, per 32x32 tile with E8M0,\n"
    "                    NVFP4: per 1x16 block or 16x16 tile with E4M3, and a tensor scale)\n"
    "  --scale-mode M    mx32/block32x32: how the E8M0 scale is derived from the block amax;\n"
    "                    default rceil for mx32, floor for block32x32\n"
    "  --pow2, --no-pow2 binary32 kinds: round scales down to powers of two (default: on for\n"
    "                    row, off for the others)\n"
    "  --eps X           binary32 kinds: floor of the amax (default 0)\n"
    "  --axis A          row (default): the rowwise copy; col: the columnwise copy only;\n"
    "                    both: the two copies from one read\n"
    "  --threads N       threads to use, 0 to 256; 0 (default) uses every core\n"
    "\n"
    "Exit status: 0 success, 2 bad usage or bad input file, 1 any other failure.\n";

static const char DEQUANT_USAGE[] =
    "usage: lowp dequantize [--axis row|col] OUT OUT.npy\n"
    "\n"
    "Decode the files `lowp quantize ... OUT` wrote (OUT.json, OUT[.col].data.npy,\n"
    "OUT[.col].scale.npy) into a float32 .npy array of the input's shape [R, C].\n"
    "\n"
    "  --axis row        decode the rowwise copy (the default when it was written)\n"
    "  --axis col        decode the columnwise copy, transposed back to [R, C] (the default\n"
    "                    when only it was written)\n"
    "\n"
    "The codes and scales must be the set OUT.json describes (their hashes are in it), and\n"
    "binary32 scales finite and positive, as lowp quantize writes them.\n"
    "\n"
    "Exit status: 0 success, 2 bad usage or bad input file, 1 any other failure.\n";

static const char *const QCMD = "quantize", *const DCMD = "dequantize";

enum { AXIS_ROW = 1, AXIS_COL = 2, AXIS_BOTH = 3 };

static const char *axis_name(int axis) {
    return axis == AXIS_ROW ? "row" : axis == AXIS_COL ? "col" : "both";
}

static int parse_axis(const char *s, int allow_both, int *out) {
    if (strcmp(s, "row") == 0)
        *out = AXIS_ROW;
    else if (strcmp(s, "col") == 0)
        *out = AXIS_COL;
    else if (allow_both && strcmp(s, "both") == 0)
        *out = AXIS_BOTH;
    else
        return 0;
    return 1;
}

static const char *mode_name(lowp_scale_mode m) {
    switch (m) {
    case LOWP_SCALE_MODE_RCEIL: return "rceil";
    case LOWP_SCALE_MODE_FLOOR: return "floor";
    case LOWP_SCALE_MODE_CEIL: return "ceil";
    case LOWP_SCALE_MODE_EVEN: return "even";
    default: return "default";
    }
}

/* The eight quantization kinds (not "none", lowp's name for an unscaled GEMM operand). */
static int parse_scaling(const char *s, lowp_scaling *out) {
    static const char *const kinds[] = {"tensor",       "row",        "mx32", "block128",
                                        "block128x128", "block32x32", "nv16", "nv16x16"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(s, kinds[i]) == 0) return lowp_scaling_from_name(s, out) == LOWP_OK;
    return 0;
}

static int parse_elem_format(const char *s, lowp_format *out) {
    return lowp_format_from_name(s, out) == LOWP_OK &&
           (*out == LOWP_FORMAT_E4M3 || *out == LOWP_FORMAT_E5M2 || *out == LOWP_FORMAT_E2M1);
}

static int is_e8m0_kind(lowp_scaling s) {
    return s == LOWP_SCALING_MX32 || s == LOWP_SCALING_BLOCK32X32;
}

/* NVFP4: E4M3 block scales and a binary32 tensor scale after them (section 4b). */
static int is_nv_kind(lowp_scaling s) {
    return s == LOWP_SCALING_NV16 || s == LOWP_SCALING_NV16X16;
}

/* 64-bit FNV-1a of an array's bytes: what OUT.json records to bind the set of files. */
static uint64_t fnv1a64(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* ---- lowp quantize ---- */

typedef struct quant_opts {
    const char *format, *scaling, *scale_mode, *axis;
    int pow2, no_pow2;
    float eps;
    int32_t threads;
} quant_opts;

static const lowp_cli_opt QUANT_OPTS[] = {
    LOWP_CLI_STR("--format", quant_opts, format),
    LOWP_CLI_STR("--scaling", quant_opts, scaling),
    LOWP_CLI_STR("--scale-mode", quant_opts, scale_mode),
    LOWP_CLI_FLAG("--pow2", quant_opts, pow2),
    LOWP_CLI_FLAG("--no-pow2", quant_opts, no_pow2),
    LOWP_CLI_FLOAT("--eps", quant_opts, eps, 0),
    LOWP_CLI_STR("--axis", quant_opts, axis),
    LOWP_CLI_I32("--threads", quant_opts, threads, 0, LOWP_MAX_THREADS),
};

typedef struct quant_args {
    lowp_format format;
    lowp_scaling scaling;
    lowp_quant_cfg cfg;
    int axis;
    const char *in, *out;
} quant_args;

/* The option values, each checked; then the combinations. -1: fine; else the exit status. */
static int interpret_quant_opts(const lowp_cli_args *p, const quant_opts *o, quant_args *a) {
    if (!o->format)
        return lowp_cli_fail(QCMD, 2,
                             "missing --format e4m3|e5m2|e2m1|nvfp4 (see `lowp quantize --help`)");
    const int nvfp4 = strcmp(o->format, "nvfp4") == 0;
    if (nvfp4)
        a->format = LOWP_FORMAT_E2M1;
    else if (!parse_elem_format(o->format, &a->format))
        return lowp_cli_fail(QCMD, 2, "--format: '%s' is not e4m3, e5m2, e2m1 or nvfp4", o->format);
    if (!o->scaling && nvfp4)
        a->scaling = LOWP_SCALING_NV16;
    else if (!o->scaling)
        return lowp_cli_fail(QCMD, 2, "missing --scaling KIND (see `lowp quantize --help`)");
    else if (!parse_scaling(o->scaling, &a->scaling))
        return lowp_cli_fail(QCMD, 2,
                             "--scaling: '%s' is not tensor, row, mx32, block128, block128x128, "
                             "block32x32, nv16 or nv16x16",
                             o->scaling);
    if (nvfp4 && !is_nv_kind(a->scaling))
        return lowp_cli_fail(QCMD, 2, "--format nvfp4 needs --scaling nv16 or nv16x16 (not %s)",
                             lowp_scaling_name(a->scaling));
    if (o->scale_mode && (lowp_scale_mode_from_name(o->scale_mode, &a->cfg.scale_mode) != LOWP_OK ||
                          a->cfg.scale_mode == LOWP_SCALE_MODE_DEFAULT))
        return lowp_cli_fail(QCMD, 2, "--scale-mode: '%s' is not rceil, floor, ceil or even",
                             o->scale_mode);
    if (o->pow2 && o->no_pow2)
        return lowp_cli_fail(QCMD, 2, "give only one of --pow2 and --no-pow2");
    if (o->pow2 || o->no_pow2) a->cfg.pow2_scales = o->pow2;
    const int have_eps = lowp_cli_given(p, "--eps");
    if (have_eps) a->cfg.eps = o->eps;
    a->cfg.threads = o->threads;
    if (o->axis && !parse_axis(o->axis, 1, &a->axis))
        return lowp_cli_fail(QCMD, 2, "--axis: '%s' is not row, col or both", o->axis);
    if (a->format == LOWP_FORMAT_E2M1 && a->scaling != LOWP_SCALING_MX32 && !is_nv_kind(a->scaling))
        return lowp_cli_fail(QCMD, 2,
                             "--format e2m1 needs --scaling mx32, nv16 or nv16x16 (not %s)",
                             lowp_scaling_name(a->scaling));
    if (is_nv_kind(a->scaling) && a->format != LOWP_FORMAT_E2M1)
        return lowp_cli_fail(QCMD, 2, "--scaling %s needs --format e2m1 (or nvfp4), not %s",
                             lowp_scaling_name(a->scaling), o->format);
    if ((is_e8m0_kind(a->scaling) || is_nv_kind(a->scaling)) && (o->pow2 || o->no_pow2 || have_eps))
        return lowp_cli_fail(QCMD, 2,
                             "--pow2, --no-pow2 and --eps apply to binary32 scales (tensor, row, "
                             "block128, block128x128), not %s",
                             lowp_scaling_name(a->scaling));
    if (!is_e8m0_kind(a->scaling) && o->scale_mode)
        return lowp_cli_fail(QCMD, 2,
                             "--scale-mode applies to E8M0 scales (mx32, block32x32), not %s",
                             lowp_scaling_name(a->scaling));
    return -1;
}

static int parse_quant_args(int argc, char **argv, quant_args *a) {
    quant_opts o;
    memset(&o, 0, sizeof o);
    lowp_cli_args p = {
        QCMD, QUANT_USAGE, QUANT_OPTS, (int) (sizeof QUANT_OPTS / sizeof QUANT_OPTS[0]),
        &o,   {0},         {0},        0};
    int rc = lowp_cli_parse(&p, argc, argv);
    if (rc >= 0) return rc;
    memset(a, 0, sizeof *a);
    lowp_quant_cfg_init(&a->cfg);
    a->axis = AXIS_ROW;
    if ((rc = interpret_quant_opts(&p, &o, a)) >= 0) return rc;
    if (p.npos > 2)
        return lowp_cli_fail(QCMD, 2, "too many arguments: '%s' (expected IN.npy OUT)", p.pos[2]);
    if (p.npos != 2)
        return lowp_cli_fail(QCMD, 2, "expected IN.npy and OUT (got %d arguments)", p.npos);
    a->in = p.pos[0];
    a->out = p.pos[1];
    return -1;
}

/* One quantized copy: its qtensor and buffers. */
typedef struct qcopy {
    lowp_qtensor q;
    int64_t srows, scols;
    int e8m0;
    int byte_scales; /* uint8 scale codes: E8M0 or E4M3 (nv16, nv16x16) */
    int nv;          /* nv16, nv16x16: the tensor decode scale follows at ts_off */
    size_t data_bytes, scale_bytes, ts_off;
} qcopy;

/* Bytes of the canonical block scales (OUT.scale.npy), without an NVFP4 tensor scale. */
static size_t block_scale_bytes(const qcopy *c) {
    return (size_t) c->srows * (size_t) c->scols * (c->byte_scales ? 1u : 4u);
}

static int alloc_copy(qcopy *c, lowp_format f, lowp_scaling s, int64_t rows, int64_t cols) {
    memset(c, 0, sizeof *c);
    c->q.format = f;
    c->q.scaling = s;
    c->q.rows = rows;
    c->q.cols = cols;
    c->q.device = LOWP_DEVICE_HOST;
    const lowp_scaling_traits *kt;
    if (lowp_qtensor_nbytes(&c->q, &c->data_bytes, &c->scale_bytes) != LOWP_OK ||
        lowp_qtensor_scale_shape(&c->q, &c->srows, &c->scols, &c->e8m0) != LOWP_OK ||
        lowp_scaling_get(s, &kt) != LOWP_OK)
        return 0;
    c->byte_scales = c->e8m0 || kt->scale_format == LOWP_FORMAT_E4M3;
    c->nv = kt->tensor_scale;
    if (c->nv && lowp_qtensor_tensor_scale_offset(&c->q, &c->ts_off) != LOWP_OK) return 0;
    c->q.data = malloc(c->data_bytes + 1);
    c->q.scales = calloc(c->scale_bytes + 1, 1); /* the padding before a tensor scale is 0 */
    return c->q.data && c->q.scales;
}

static void free_copy(qcopy *c) {
    free(c->q.data);
    free(c->q.scales);
    c->q.data = c->q.scales = NULL;
}

/* OUT + tag + suffix, e.g. "out" ".col" ".data.npy". */
static char *file_of(const char *out, const char *tag, const char *suffix) {
    char *base = lowp_cli_join(out, tag);
    char *p = base ? lowp_cli_join(base, suffix) : NULL;
    free(base);
    return p;
}

/* The NVFP4 tensor decode scale of a copy. */
static float tensor_scale_of(const qcopy *c) {
    float g;
    memcpy(&g, (const uint8_t *) c->q.scales + c->ts_off, sizeof g);
    return g;
}

static int write_copy(const char *out, const char *tag, const qcopy *c) {
    char err[1024];
    char *dpath = file_of(out, tag, ".data.npy"), *spath = file_of(out, tag, ".scale.npy");
    char *tpath = c->nv ? file_of(out, tag, ".tensor_scale.npy") : NULL;
    int rc = 0;
    size_t rb;
    lowp_row_nbytes(c->q.format, c->q.cols, &rb);
    int64_t dshape[2] = {c->q.rows, (int64_t) rb};
    int64_t sshape[2] = {c->srows, c->scols}, tshape[1] = {1};
    const float g = c->nv ? tensor_scale_of(c) : 0.0f;
    if (!dpath || !spath || (c->nv && !tpath))
        rc = lowp_cli_fail(QCMD, 1, "out of memory");
    else if (lowp_npy_write(dpath, LOWP_NPY_U1, 2, dshape, c->q.data, err, sizeof err) != LOWP_OK ||
             lowp_npy_write(spath, c->byte_scales ? LOWP_NPY_U1 : LOWP_NPY_F4, 2, sshape,
                            c->q.scales, err, sizeof err) != LOWP_OK ||
             (c->nv &&
              lowp_npy_write(tpath, LOWP_NPY_F4, 1, tshape, &g, err, sizeof err) != LOWP_OK))
        rc = lowp_cli_fail(QCMD, 1, "%s", err);
    free(dpath);
    free(spath);
    free(tpath);
    return rc;
}

static void json_hashes(FILE *f, const char *axis, const qcopy *c) {
    fprintf(f, "  \"%s_data_fnv1a64\": \"%016llx\",\n", axis,
            (unsigned long long) fnv1a64(c->q.data, c->data_bytes));
    fprintf(f, "  \"%s_scale_fnv1a64\": \"%016llx\",\n", axis,
            (unsigned long long) fnv1a64(c->q.scales, block_scale_bytes(c)));
    if (c->nv) {
        const float g = tensor_scale_of(c);
        fprintf(f, "  \"%s_tensor_scale_fnv1a64\": \"%016llx\",\n", axis,
                (unsigned long long) fnv1a64(&g, sizeof g));
    }
}

/* OUT.json, last, through OUT.json.tmp, fsync and rename. */
static int write_json(const quant_args *a, int64_t rows, int64_t cols, const qcopy *row,
                      const qcopy *col) {
    char *path = lowp_cli_join(a->out, ".json"), *tmp = lowp_cli_join(a->out, ".json.tmp");
    int rc = 0;
    FILE *f = path && tmp ? fopen(tmp, "w") : NULL;
    if (!f) {
        rc = path && tmp ? lowp_cli_fail(QCMD, 1, "%s: cannot write: %s", tmp, strerror(errno))
                         : lowp_cli_fail(QCMD, 1, "out of memory");
        goto done;
    }
    const lowp_format_traits *t;
    lowp_format_get(a->format, &t);
    lowp_scale_mode mode = a->cfg.scale_mode;
    if (mode == LOWP_SCALE_MODE_DEFAULT)
        mode =
            a->scaling == LOWP_SCALING_BLOCK32X32 ? LOWP_SCALE_MODE_FLOOR : LOWP_SCALE_MODE_RCEIL;
    const int pow2 = a->cfg.pow2_scales < 0 ? a->scaling == LOWP_SCALING_ROW : a->cfg.pow2_scales;
    const int e8 = is_e8m0_kind(a->scaling), nv = is_nv_kind(a->scaling);
    fprintf(f, "{\n");
    fprintf(f, "  \"format\": \"%s\",\n", t->name);
    fprintf(f, "  \"scaling\": \"%s\",\n", lowp_scaling_name(a->scaling));
    if (nv)
        fprintf(f, "  \"scale_mode\": null,\n  \"pow2\": null,\n  \"eps\": null,\n");
    else if (e8)
        fprintf(f, "  \"scale_mode\": \"%s\",\n  \"pow2\": null,\n  \"eps\": null,\n",
                mode_name(mode));
    else
        fprintf(f, "  \"scale_mode\": null,\n  \"pow2\": %s,\n  \"eps\": %.9g,\n",
                pow2 ? "true" : "false", (double) a->cfg.eps);
    fprintf(f, "  \"rows\": %lld,\n  \"cols\": %lld,\n", (long long) rows, (long long) cols);
    fprintf(f, "  \"axis\": \"%s\",\n", axis_name(a->axis));
    fprintf(f, "  \"scale_dtype\": \"%s\",\n", e8 || nv ? "uint8" : "float32");
    if (a->axis & AXIS_ROW) json_hashes(f, "row", row);
    if (a->axis & AXIS_COL) json_hashes(f, "col", col);
    fprintf(f, "  \"lowp_version\": \"%s\"\n}\n", lowp_version());
    int ok = fflush(f) == 0 && !ferror(f) && fsync(fileno(f)) == 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        rc = lowp_cli_fail(QCMD, 1, "%s: cannot write: %s", path, strerror(errno));
    }
done:
    free(path);
    free(tmp);
    return rc;
}

static int run_quantize(const quant_args *a) {
    char err[1024];
    lowp_npy in;
    lowp_status st = lowp_npy_read(a->in, LOWP_NPY_F4, &in, err, sizeof err);
    if (st != LOWP_OK) return lowp_cli_fail(QCMD, st == LOWP_ERR_OUT_OF_MEMORY ? 1 : 2, "%s", err);
    int rc = 0;
    qcopy row, col;
    memset(&row, 0, sizeof row);
    memset(&col, 0, sizeof col);
    const int64_t R = in.ndim == 2 ? in.shape[0] : 0, C = in.ndim == 2 ? in.shape[1] : 0;
    if (in.ndim != 2) {
        rc = lowp_cli_fail(QCMD, 2, "%s: a 2-D array is needed (this one has %d dimensions)", a->in,
                           in.ndim);
        goto done;
    }
    if (R == 0 || C == 0) {
        rc = lowp_cli_fail(QCMD, 2, "%s: shape (%lld, %lld) is empty", a->in, (long long) R,
                           (long long) C);
        goto done;
    }
    if (((a->axis & AXIS_ROW) && !alloc_copy(&row, a->format, a->scaling, R, C)) ||
        ((a->axis & AXIS_COL) && !alloc_copy(&col, a->format, a->scaling, C, R))) {
        rc = lowp_cli_fail(QCMD, 1, "cannot allocate the outputs for a %lld x %lld array: %s",
                           (long long) R, (long long) C, lowp_last_error());
        goto done;
    }
    lowp_tensor x = {LOWP_FORMAT_F32, R, C, in.data, LOWP_DEVICE_HOST};
    st = lowp_quantize(&x, (a->axis & AXIS_ROW) ? &row.q : NULL,
                       (a->axis & AXIS_COL) ? &col.q : NULL, &a->cfg);
    if (st != LOWP_OK) {
        rc = lowp_cli_lib_fail(QCMD, st);
        goto done;
    }
    /* The old metadata goes first: until the new JSON is in place, the set is incomplete and
     * dequantize refuses it instead of mixing new codes with an old description. */
    char *json = lowp_cli_join(a->out, ".json");
    if (json) remove(json);
    free(json);
    if ((a->axis & AXIS_ROW) && (rc = write_copy(a->out, "", &row)) != 0) goto done;
    if ((a->axis & AXIS_COL) && (rc = write_copy(a->out, ".col", &col)) != 0) goto done;
    rc = write_json(a, R, C, &row, &col);
done:
    free_copy(&row);
    free_copy(&col);
    lowp_npy_free(&in);
    return rc;
}

int lowp_cli_quantize(int argc, char **argv) {
    quant_args a;
    int rc = parse_quant_args(argc, argv, &a);
    if (rc >= 0) return rc;
    return run_quantize(&a);
}

/* ---- lowp dequantize ---- */

/* What OUT.json says, and the copy to decode. */
typedef struct deq_meta {
    char *jpath;
    lowp_format format;
    lowp_scaling scaling;
    int written, axis;
    int64_t R, C;
    uint64_t data_hash, scale_hash, ts_hash; /* ts_hash: nv16, nv16x16's tensor scale */
} deq_meta;

static int json_hash(const char *text, const char *key, uint64_t *out) {
    char v[24], *end;
    if (!lowp_json_find(text, key, v, sizeof v) || strlen(v) != 16) return 0;
    *out = (uint64_t) strtoull(v, &end, 16);
    return *end == '\0';
}

/* Reads and checks OUT.json. -1: fine; else the exit status. */
static int read_meta(const char *prefix, int axis, deq_meta *m) {
    char err[1024];
    if (!(m->jpath = lowp_cli_join(prefix, ".json")))
        return lowp_cli_fail(DCMD, 1, "out of memory");
    char *text = lowp_cli_read_text(m->jpath, 65536, err, sizeof err);
    if (!text) return lowp_cli_fail(DCMD, 2, "%s", err);
    char fname[32] = "", sname[32] = "", aname[16] = "";
    int rc = -1;
    if (!lowp_json_find(text, "format", fname, sizeof fname) ||
        !lowp_json_find(text, "scaling", sname, sizeof sname) ||
        !lowp_json_find(text, "axis", aname, sizeof aname) ||
        !lowp_cli_json_int(text, "rows", &m->R) || !lowp_cli_json_int(text, "cols", &m->C)) {
        rc = lowp_cli_fail(DCMD, 2,
                           "%s: not a lowp quantize metadata file (format, scaling, axis, rows or "
                           "cols missing)",
                           m->jpath);
    } else if (!parse_elem_format(fname, &m->format) || !parse_scaling(sname, &m->scaling) ||
               !parse_axis(aname, 1, &m->written) || m->R <= 0 || m->C <= 0) {
        rc = lowp_cli_fail(DCMD, 2,
                           "%s: bad metadata (format '%s', scaling '%s', axis '%s', rows %lld, "
                           "cols %lld)",
                           m->jpath, fname, sname, aname, (long long) m->R, (long long) m->C);
    } else {
        m->axis = axis ? axis : (m->written & AXIS_ROW) ? AXIS_ROW : AXIS_COL;
        const char *tag = m->axis == AXIS_COL ? "col" : "row";
        char dk[32], sk[32];
        snprintf(dk, sizeof dk, "%s_data_fnv1a64", tag);
        snprintf(sk, sizeof sk, "%s_scale_fnv1a64", tag);
        if (!(m->written & m->axis))
            rc = lowp_cli_fail(DCMD, 2, "%s: the %s copy was not written (lowp quantize --axis %s)",
                               m->jpath, axis_name(m->axis), axis_name(m->written));
        else if (!json_hash(text, dk, &m->data_hash) || !json_hash(text, sk, &m->scale_hash))
            rc = lowp_cli_fail(DCMD, 2, "%s: the hashes %s and %s of the files are missing",
                               m->jpath, dk, sk);
        snprintf(sk, sizeof sk, "%s_tensor_scale_fnv1a64", tag);
        if (rc < 0 && is_nv_kind(m->scaling) && !json_hash(text, sk, &m->ts_hash))
            rc = lowp_cli_fail(DCMD, 2, "%s: the hash %s of the tensor scale is missing", m->jpath,
                               sk);
    }
    free(text);
    return rc;
}

/* The codes and scales of the copy: shapes and dtypes as the metadata says, the very arrays it
 * describes (hashes), binary32 scales finite and positive. */
/* nv16, nv16x16: the scales buffer lowp_dequantize reads, *buf (malloc'd): the block scale
 * codes s, zero padding, then the tensor decode scale of OUT[.col].tensor_scale.npy (the one
 * the metadata describes, finite and positive). -1: fine; else the exit status. */
static int nv_scales(const char *prefix, const deq_meta *m, const lowp_qtensor *q,
                     const lowp_npy *s, uint8_t **buf) {
    char *tpath = file_of(prefix, m->axis == AXIS_COL ? ".col" : "", ".tensor_scale.npy");
    char err[1024];
    lowp_npy t;
    memset(&t, 0, sizeof t);
    size_t sb = 0, off = 0;
    int rc = -1;
    lowp_status st = LOWP_OK;
    if (!tpath)
        rc = lowp_cli_fail(DCMD, 1, "out of memory");
    else if ((st = lowp_npy_read(tpath, LOWP_NPY_F4, &t, err, sizeof err)) != LOWP_OK)
        rc = lowp_cli_fail(DCMD, st == LOWP_ERR_OUT_OF_MEMORY ? 1 : 2, "%s", err);
    else if (t.ndim != 1 || t.shape[0] != 1)
        rc = lowp_cli_fail(DCMD, 2, "%s: expected shape (1,) float32 (the tensor scale)", tpath);
    else if (fnv1a64(t.data, t.nbytes) != m->ts_hash)
        rc = lowp_cli_fail(DCMD, 2, "%s: not the tensor scale %s describes (hash differs)", tpath,
                           m->jpath);
    else if (!(*(const float *) t.data > 0.0f) || isinf(*(const float *) t.data))
        rc = lowp_cli_fail(DCMD, 2,
                           "%s: the tensor scale is %g; lowp quantize writes a finite "
                           "positive one",
                           tpath, (double) *(const float *) t.data);
    else if (lowp_qtensor_nbytes(q, NULL, &sb) != LOWP_OK ||
             lowp_qtensor_tensor_scale_offset(q, &off) != LOWP_OK)
        rc = lowp_cli_fail(DCMD, 2, "%s: %s", m->jpath, lowp_last_error());
    else if (!(*buf = calloc(sb + 1, 1)))
        rc = lowp_cli_fail(DCMD, 1, "out of memory");
    if (rc < 0) {
        memcpy(*buf, s->data, s->nbytes);
        memcpy(*buf + off, t.data, sizeof(float));
    }
    lowp_npy_free(&t);
    free(tpath);
    return rc;
}

static int read_copy(const char *prefix, const deq_meta *m, lowp_qtensor *q, lowp_npy *d,
                     lowp_npy *s, uint8_t **nvbuf) {
    const char *tag = m->axis == AXIS_COL ? ".col" : "";
    char *dpath = file_of(prefix, tag, ".data.npy"), *spath = file_of(prefix, tag, ".scale.npy");
    char err[1024];
    int rc = -1;
    int64_t sr = 0, sc = 0;
    int e8 = 0;
    const int nv = is_nv_kind(m->scaling);
    size_t rb = 0;
    lowp_qtensor shape = {m->format,
                          m->scaling,
                          m->axis == AXIS_COL ? m->C : m->R,
                          m->axis == AXIS_COL ? m->R : m->C,
                          NULL,
                          NULL,
                          LOWP_DEVICE_HOST,
                          NULL,
                          0};
    *q = shape;
    lowp_status st = LOWP_OK;
    const int shape_ok = lowp_qtensor_scale_shape(q, &sr, &sc, &e8) == LOWP_OK &&
                         lowp_row_nbytes(m->format, q->cols, &rb) == LOWP_OK;
    const int bytes = e8 || nv; /* uint8 scale codes: E8M0 or E4M3 */
    if (!dpath || !spath) {
        rc = lowp_cli_fail(DCMD, 1, "out of memory");
    } else if (!shape_ok) {
        rc = lowp_cli_fail(DCMD, 2, "%s: %s", m->jpath, lowp_last_error());
    } else if ((st = lowp_npy_read(dpath, LOWP_NPY_U1, d, err, sizeof err)) != LOWP_OK ||
               (st = lowp_npy_read(spath, bytes ? LOWP_NPY_U1 : LOWP_NPY_F4, s, err, sizeof err)) !=
                   LOWP_OK) {
        rc = lowp_cli_fail(DCMD, st == LOWP_ERR_OUT_OF_MEMORY ? 1 : 2, "%s", err);
    } else if (d->ndim != 2 || d->shape[0] != q->rows || d->shape[1] != (int64_t) rb) {
        rc =
            lowp_cli_fail(DCMD, 2, "%s: shape does not match %s: expected (%lld, %lld) uint8 codes",
                          dpath, m->jpath, (long long) q->rows, (long long) rb);
    } else if (s->ndim != 2 || s->shape[0] != sr || s->shape[1] != sc) {
        rc = lowp_cli_fail(DCMD, 2, "%s: shape does not match %s: expected (%lld, %lld) %s scales",
                           spath, m->jpath, (long long) sr, (long long) sc,
                           bytes ? "uint8" : "float32");
    } else if (fnv1a64(d->data, d->nbytes) != m->data_hash) {
        rc = lowp_cli_fail(DCMD, 2, "%s: not the codes %s describes (hash differs)", dpath,
                           m->jpath);
    } else if (fnv1a64(s->data, s->nbytes) != m->scale_hash) {
        rc = lowp_cli_fail(DCMD, 2, "%s: not the scales %s describes (hash differs)", spath,
                           m->jpath);
    } else if (!bytes) {
        const float *v = s->data;
        for (size_t i = 0; i < s->count && rc < 0; i++)
            if (!(v[i] > 0.0f) || isinf(v[i]))
                rc = lowp_cli_fail(DCMD, 2,
                                   "%s: scale %zu is %g; lowp quantize writes finite positive "
                                   "scales only",
                                   spath, i, (double) v[i]);
    }
    if (rc < 0 && nv) rc = nv_scales(prefix, m, q, s, nvbuf);
    q->data = d->data;
    q->scales = *nvbuf ? (void *) *nvbuf : s->data;
    free(dpath);
    free(spath);
    return rc;
}

/* Decode, transpose a columnwise copy back to [R, C], write OUT.npy. */
static int decode_copy(const deq_meta *m, const lowp_qtensor *q, const char *outpath) {
    const size_t n = (size_t) m->R * (size_t) m->C;
    float *out = malloc(n * sizeof *out + 1), *tr = NULL;
    if (!out) return lowp_cli_fail(DCMD, 1, "out of memory for %zu elements", n);
    lowp_tensor t = {LOWP_FORMAT_F32, q->rows, q->cols, out, LOWP_DEVICE_HOST};
    lowp_status st = lowp_dequantize(q, &t);
    int rc = st == LOWP_OK ? -1 : lowp_cli_lib_fail(DCMD, st);
    const float *result = out;
    if (rc < 0 && m->axis == AXIS_COL) { /* [C, R] back to [R, C] */
        if (!(tr = malloc(n * sizeof *tr + 1))) {
            rc = lowp_cli_fail(DCMD, 1, "out of memory for %zu elements", n);
        } else {
            for (int64_t i = 0; i < m->C; i++)
                for (int64_t j = 0; j < m->R; j++)
                    tr[(size_t) j * (size_t) m->C + (size_t) i] =
                        out[(size_t) i * (size_t) m->R + (size_t) j];
            result = tr;
        }
    }
    if (rc < 0) {
        char err[1024];
        int64_t shape[2] = {m->R, m->C};
        rc = lowp_npy_write(outpath, LOWP_NPY_F4, 2, shape, result, err, sizeof err) == LOWP_OK
                 ? 0
                 : lowp_cli_fail(DCMD, 1, "%s", err);
    }
    free(tr);
    free(out);
    return rc;
}

static int run_dequantize(const char *prefix, const char *outpath, int axis) {
    deq_meta m;
    memset(&m, 0, sizeof m);
    lowp_npy d, s;
    memset(&d, 0, sizeof d);
    memset(&s, 0, sizeof s);
    lowp_qtensor q;
    uint8_t *nvbuf = NULL;
    int rc = read_meta(prefix, axis, &m);
    if (rc < 0) rc = read_copy(prefix, &m, &q, &d, &s, &nvbuf);
    if (rc < 0) rc = decode_copy(&m, &q, outpath);
    free(nvbuf);
    lowp_npy_free(&d);
    lowp_npy_free(&s);
    free(m.jpath);
    return rc;
}

typedef struct deq_opts {
    const char *axis;
} deq_opts;

int lowp_cli_dequantize(int argc, char **argv) {
    static const lowp_cli_opt opts[] = {LOWP_CLI_STR("--axis", deq_opts, axis)};
    deq_opts o = {NULL};
    lowp_cli_args p = {DCMD, DEQUANT_USAGE, opts, 1, &o, {0}, {0}, 0};
    int rc = lowp_cli_parse(&p, argc, argv);
    if (rc >= 0) return rc;
    int axis = 0;
    if (o.axis && !parse_axis(o.axis, 0, &axis))
        return lowp_cli_fail(DCMD, 2, "--axis: '%s' is not row or col", o.axis);
    if (p.npos > 2)
        return lowp_cli_fail(DCMD, 2, "too many arguments: '%s' (expected OUT OUT.npy)", p.pos[2]);
    if (p.npos != 2)
        return lowp_cli_fail(DCMD, 2,
                             "expected OUT (the prefix given to lowp quantize) and OUT.npy (got %d "
                             "arguments)",
                             p.npos);
    return run_dequantize(p.pos[0], p.pos[1], axis);
}
