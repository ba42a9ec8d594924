/* `lowp quantize` (quantize a 2-D float32 .npy array with one of lowp's scaling kinds into
 * element codes and scales) and `lowp dequantize` (decode them back to float32). Both go
 * through the public API only: lowp_quantize, lowp_dequantize, lowp_qtensor_nbytes,
 * lowp_qtensor_scale_shape.
 *
 * Files written by `lowp quantize ... IN.npy OUT`:
 *   OUT.data.npy       uint8 [R, C] codes of the rowwise copy ([R, ceil(C/2)] for e2m1: two
 *                      codes per byte, element 2i in the low nibble)
 *   OUT.scale.npy      its scales in lowp's canonical layout: uint8 E8M0 codes (mx32,
 *                      block32x32) or float32 scale_inv (tensor, row, block128, block128x128)
 *   OUT.col.data.npy   the columnwise copy: X^T [C, R] quantized along R (--axis col|both)
 *   OUT.col.scale.npy  its scales
 *   OUT.json           the metadata `lowp dequantize` reads back
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lowp/lowp.h"
#include "npy.h"

static const char QUANT_USAGE[] =
    "usage: lowp quantize --format e4m3|e5m2|e2m1\n"
    "                     --scaling tensor|row|mx32|block128|block128x128|block32x32\n"
    "                     [--scale-mode rceil|floor|ceil|even] [--pow2 | --no-pow2] [--eps X]\n"
    "                     [--axis row|col|both] [--threads N] IN.npy OUT\n"
    "\n"
    "Quantize a 2-D float32 .npy array X [R, C] as lowp_quantize does (NUMERICS.md sections 3-4).\n"
    "Writes OUT.data.npy (uint8 element codes [R, C]; e2m1 packed two per byte along the row,\n"
    "element 2i in the low nibble) and OUT.scale.npy (scales in lowp's canonical layout: uint8\n"
    "E8M0 codes for mx32 and block32x32, float32 scale_inv for the others) for the rowwise copy;\n"
    "OUT.col.data.npy and OUT.col.scale.npy for the columnwise copy (X^T [C, R] quantized along\n"
    "R); and OUT.json with the metadata.\n"
    "\n"
    "  --format F        element format: e4m3, e5m2, or e2m1 (mx32 only)\n"
    "  --scaling K       scaling kind (one scale per tensor, per row, per 1x32 block with E8M0\n"
    "                    scales, per 1x128 block, per 128x128 tile, per 32x32 tile with E8M0)\n"
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
    "Exit status: 0 success, 2 bad usage or bad input file, 1 any other failure.\n";

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
say(const char *cmd, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "lowp %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return status;
}

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

static int parse_threads(const char *s, int32_t *out) {
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    errno = 0;
    unsigned long v = strtoul(s, NULL, 10);
    if (errno == ERANGE || v > LOWP_MAX_THREADS) return 0;
    *out = (int32_t) v;
    return 1;
}

static const char *mode_name(lowp_scale_mode m) {
    switch (m) {
    case LOWP_SCALE_RCEIL: return "rceil";
    case LOWP_SCALE_FLOOR: return "floor";
    case LOWP_SCALE_CEIL: return "ceil";
    case LOWP_SCALE_EVEN: return "even";
    default: return "default";
    }
}

/* The six quantization kinds (not "none", lowp's name for an unscaled GEMM operand). */
static int parse_scaling(const char *s, lowp_scaling *out) {
    static const char *const kinds[] = {"tensor",   "row",          "mx32",
                                        "block128", "block128x128", "block32x32"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(s, kinds[i]) == 0) return lowp_scaling_from_name(s, out) == LOWP_OK;
    return 0;
}

static int is_e8m0_kind(lowp_scaling s) {
    return s == LOWP_SCALING_MX32 || s == LOWP_SCALING_BLOCK32X32;
}

/* "PREFIX" + "SUFFIX" in a malloc'd string. */
static char *join(const char *prefix, const char *suffix) {
    size_t a = strlen(prefix), b = strlen(suffix);
    char *s = malloc(a + b + 1);
    if (s) {
        memcpy(s, prefix, a);
        memcpy(s + a, suffix, b + 1);
    }
    return s;
}

/* Option parsing shared by both commands: --name VALUE or --name=VALUE, flags without a value,
 * "--" ends the options. Returns the option index in `names` (value in *val), -1 for a
 * positional argument (in *val), or -2 after printing an error. */
typedef struct opt_state {
    int i, argc, options_done;
    char **argv;
} opt_state;

static int next_opt(const char *cmd, opt_state *o, const char *const *names, const int *takes_value,
                    int n, const char **val) {
    const char *arg = o->argv[o->i];
    if (o->options_done || arg[0] != '-' || arg[1] == '\0') {
        *val = arg;
        return -1;
    }
    if (strcmp(arg, "--") == 0) {
        o->options_done = 1;
        return -3;
    }
    const char *eq = strchr(arg, '=');
    size_t nlen = eq ? (size_t) (eq - arg) : strlen(arg);
    for (int k = 0; k < n; k++) {
        if (strlen(names[k]) != nlen || strncmp(arg, names[k], nlen) != 0) continue;
        if (!takes_value[k]) {
            if (eq) {
                say(cmd, 2, "%s takes no value", names[k]);
                return -2;
            }
            *val = NULL;
            return k;
        }
        if (eq)
            *val = eq + 1;
        else if (o->i + 1 < o->argc)
            *val = o->argv[++o->i];
        else {
            say(cmd, 2, "%s needs a value", names[k]);
            return -2;
        }
        return k;
    }
    say(cmd, 2, "unknown option '%.*s' (see `lowp %s --help`)", (int) nlen, arg, cmd);
    return -2;
}

/* ---- lowp quantize ---- */

typedef struct quant_args {
    lowp_format format;
    lowp_scaling scaling;
    lowp_quant_cfg cfg;
    int axis;
    int have_mode, have_pow2, have_eps;
    const char *in, *out;
} quant_args;

/* -1: fine; else the exit status. */
static int parse_quant_args(int argc, char **argv, quant_args *a) {
    const char *cmd = "quantize";
    static const char *const names[] = {"--format",  "--scaling", "--scale-mode", "--pow2",
                                        "--no-pow2", "--eps",     "--axis",       "--threads",
                                        "--help",    "-h"};
    static const int takes[] = {1, 1, 1, 0, 0, 1, 1, 1, 0, 0};
    const int n = (int) (sizeof takes / sizeof takes[0]);
    int seen[10] = {0};
    memset(a, 0, sizeof *a);
    lowp_quant_cfg_init(&a->cfg);
    a->axis = AXIS_ROW;
    const char *pos[2];
    int npos = 0;
    opt_state o = {1, argc, 0, argv};
    for (; o.i < argc; o.i++) {
        const char *val;
        int k = next_opt(cmd, &o, names, takes, n, &val);
        if (k == -2) return 2;
        if (k == -3) continue;
        if (k == -1) {
            if (npos == 2)
                return say(cmd, 2, "too many arguments: '%s' (expected IN.npy OUT)", val);
            pos[npos++] = val;
            continue;
        }
        if (k >= 8) {
            fputs(QUANT_USAGE, stdout);
            return 0;
        }
        if (seen[k]) return say(cmd, 2, "%s given twice", names[k]);
        seen[k] = 1;
        switch (k) {
        case 0: {
            lowp_format f;
            if (lowp_format_from_name(val, &f) != LOWP_OK ||
                (f != LOWP_FORMAT_E4M3 && f != LOWP_FORMAT_E5M2 && f != LOWP_FORMAT_E2M1))
                return say(cmd, 2, "--format: '%s' is not e4m3, e5m2 or e2m1", val);
            a->format = f;
            break;
        }
        case 1:
            if (!parse_scaling(val, &a->scaling))
                return say(cmd, 2,
                           "--scaling: '%s' is not tensor, row, mx32, block128, block128x128 or "
                           "block32x32",
                           val);
            break;
        case 2:
            if (lowp_scale_mode_from_name(val, &a->cfg.scale_mode) != LOWP_OK ||
                a->cfg.scale_mode == LOWP_SCALE_DEFAULT)
                return say(cmd, 2, "--scale-mode: '%s' is not rceil, floor, ceil or even", val);
            a->have_mode = 1;
            break;
        case 3:
        case 4:
            if (seen[3] && seen[4]) return say(cmd, 2, "give only one of --pow2 and --no-pow2");
            a->cfg.pow2_scales = k == 3;
            a->have_pow2 = 1;
            break;
        case 5: {
            char *end;
            errno = 0;
            float e = strtof(val, &end);
            if (!*val || *end || errno == ERANGE || !(e >= 0.0f) || isinf(e))
                return say(cmd, 2, "--eps: '%s' is not a finite number >= 0", val);
            a->cfg.eps = e;
            a->have_eps = 1;
            break;
        }
        case 6:
            if (!parse_axis(val, 1, &a->axis))
                return say(cmd, 2, "--axis: '%s' is not row, col or both", val);
            break;
        default:
            if (!parse_threads(val, &a->cfg.threads))
                return say(cmd, 2, "--threads: '%s' is not a thread count (0 to %d)", val,
                           LOWP_MAX_THREADS);
            break;
        }
    }
    if (!seen[0])
        return say(cmd, 2, "missing --format e4m3|e5m2|e2m1 (see `lowp quantize --help`)");
    if (!seen[1]) return say(cmd, 2, "missing --scaling KIND (see `lowp quantize --help`)");
    if (a->format == LOWP_FORMAT_E2M1 && a->scaling != LOWP_SCALING_MX32)
        return say(cmd, 2, "--format e2m1 needs --scaling mx32 (not %s)",
                   lowp_scaling_name(a->scaling));
    if (is_e8m0_kind(a->scaling) && (a->have_pow2 || a->have_eps))
        return say(cmd, 2,
                   "--pow2, --no-pow2 and --eps apply to binary32 scales (tensor, row, "
                   "block128, block128x128), not %s",
                   lowp_scaling_name(a->scaling));
    if (!is_e8m0_kind(a->scaling) && a->have_mode)
        return say(cmd, 2, "--scale-mode applies to E8M0 scales (mx32, block32x32), not %s",
                   lowp_scaling_name(a->scaling));
    if (npos != 2) return say(cmd, 2, "expected IN.npy and OUT (got %d arguments)", npos);
    a->in = pos[0];
    a->out = pos[1];
    return -1;
}

/* One quantized copy: its qtensor and buffers. */
typedef struct qcopy {
    lowp_qtensor q;
    int64_t srows, scols;
    int e8m0;
    size_t data_bytes, scale_bytes;
} qcopy;

static int alloc_copy(qcopy *c, lowp_format f, lowp_scaling s, int64_t rows, int64_t cols) {
    memset(c, 0, sizeof *c);
    c->q.format = f;
    c->q.scaling = s;
    c->q.rows = rows;
    c->q.cols = cols;
    c->q.device = LOWP_DEVICE_HOST;
    if (lowp_qtensor_nbytes(&c->q, &c->data_bytes, &c->scale_bytes) != LOWP_OK ||
        lowp_qtensor_scale_shape(&c->q, &c->srows, &c->scols, &c->e8m0) != LOWP_OK)
        return 0;
    c->q.data = malloc(c->data_bytes + 1);
    c->q.scales = malloc(c->scale_bytes + 1);
    return c->q.data && c->q.scales;
}

static void free_copy(qcopy *c) {
    free(c->q.data);
    free(c->q.scales);
    c->q.data = c->q.scales = NULL;
}

static int write_copy(const char *cmd, const char *out, const char *tag, const qcopy *c) {
    char err[1024];
    char *dp = join(out, tag), *dpath = NULL, *spath = NULL;
    int rc = 0;
    if (!dp) return say(cmd, 1, "out of memory");
    dpath = join(dp, ".data.npy");
    spath = join(dp, ".scale.npy");
    free(dp);
    if (!dpath || !spath) {
        rc = say(cmd, 1, "out of memory");
        goto done;
    }
    size_t rb;
    lowp_row_nbytes(c->q.format, c->q.cols, &rb);
    int64_t dshape[2] = {c->q.rows, (int64_t) rb};
    int64_t sshape[2] = {c->srows, c->scols};
    if (lowp_npy_write(dpath, LOWP_NPY_U1, 2, dshape, c->q.data, err, sizeof err) != LOWP_OK ||
        lowp_npy_write(spath, c->e8m0 ? LOWP_NPY_U1 : LOWP_NPY_F4, 2, sshape, c->q.scales, err,
                       sizeof err) != LOWP_OK)
        rc = say(cmd, 1, "%s", err);
done:
    free(dpath);
    free(spath);
    return rc;
}

static int write_json(const char *cmd, const quant_args *a, int64_t rows, int64_t cols) {
    char *path = join(a->out, ".json"), *tmp = join(a->out, ".json.tmp");
    int rc = 0;
    if (!path || !tmp) {
        rc = say(cmd, 1, "out of memory");
        goto done;
    }
    const lowp_format_traits *t;
    lowp_format_get(a->format, &t);
    lowp_scale_mode mode = a->cfg.scale_mode;
    if (mode == LOWP_SCALE_DEFAULT)
        mode = a->scaling == LOWP_SCALING_BLOCK32X32 ? LOWP_SCALE_FLOOR : LOWP_SCALE_RCEIL;
    int pow2 = a->cfg.pow2_scales < 0 ? a->scaling == LOWP_SCALING_ROW : a->cfg.pow2_scales;
    int e8 = is_e8m0_kind(a->scaling);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        rc = say(cmd, 1, "%s: cannot write: %s", tmp, strerror(errno));
        goto done;
    }
    fprintf(f, "{\n");
    fprintf(f, "  \"format\": \"%s\",\n", t->name);
    fprintf(f, "  \"scaling\": \"%s\",\n", lowp_scaling_name(a->scaling));
    if (e8)
        fprintf(f, "  \"scale_mode\": \"%s\",\n", mode_name(mode));
    else
        fprintf(f, "  \"scale_mode\": null,\n");
    if (e8)
        fprintf(f, "  \"pow2\": null,\n  \"eps\": null,\n");
    else
        fprintf(f, "  \"pow2\": %s,\n  \"eps\": %.9g,\n", pow2 ? "true" : "false",
                (double) a->cfg.eps);
    fprintf(f, "  \"rows\": %lld,\n  \"cols\": %lld,\n", (long long) rows, (long long) cols);
    fprintf(f, "  \"axis\": \"%s\",\n", axis_name(a->axis));
    fprintf(f, "  \"scale_dtype\": \"%s\",\n", e8 ? "uint8" : "float32");
    fprintf(f, "  \"lowp_version\": \"%s\"\n}\n", lowp_version());
    if (fflush(f) != 0 || ferror(f)) {
        fclose(f);
        remove(tmp);
        rc = say(cmd, 1, "%s: write failed: %s", tmp, strerror(errno));
        goto done;
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        rc = say(cmd, 1, "%s: cannot write: %s", path, strerror(errno));
    }
done:
    free(path);
    free(tmp);
    return rc;
}

static int run_quantize(const quant_args *a) {
    const char *cmd = "quantize";
    char err[1024];
    lowp_npy in;
    lowp_status st = lowp_npy_read(a->in, LOWP_NPY_F4, &in, err, sizeof err);
    if (st != LOWP_OK) return say(cmd, st == LOWP_ERR_OUT_OF_MEMORY ? 1 : 2, "%s", err);
    int rc = 0;
    qcopy row, col;
    memset(&row, 0, sizeof row);
    memset(&col, 0, sizeof col);
    if (in.ndim != 2) {
        rc = say(cmd, 2, "%s: a 2-D array is needed (this one has %d dimensions)", a->in, in.ndim);
        goto done;
    }
    const int64_t R = in.shape[0], C = in.shape[1];
    if (R == 0 || C == 0) {
        rc = say(cmd, 2, "%s: shape (%lld, %lld) is empty", a->in, (long long) R, (long long) C);
        goto done;
    }
    if (((a->axis & AXIS_ROW) && !alloc_copy(&row, a->format, a->scaling, R, C)) ||
        ((a->axis & AXIS_COL) && !alloc_copy(&col, a->format, a->scaling, C, R))) {
        rc = say(cmd, 1, "cannot allocate the outputs for a %lld x %lld array: %s", (long long) R,
                 (long long) C, lowp_last_error());
        goto done;
    }
    lowp_tensor x = {LOWP_FORMAT_F32, R, C, in.data, LOWP_DEVICE_HOST};
    st = lowp_quantize(&x, (a->axis & AXIS_ROW) ? &row.q : NULL,
                       (a->axis & AXIS_COL) ? &col.q : NULL, &a->cfg);
    if (st != LOWP_OK) {
        rc = say(cmd, st == LOWP_ERR_INVALID_ARG || st == LOWP_ERR_UNSUPPORTED ? 2 : 1, "%s",
                 lowp_last_error());
        goto done;
    }
    if ((a->axis & AXIS_ROW) && (rc = write_copy(cmd, a->out, "", &row)) != 0) goto done;
    if ((a->axis & AXIS_COL) && (rc = write_copy(cmd, a->out, ".col", &col)) != 0) goto done;
    rc = write_json(cmd, a, R, C);
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

/* A minimal reader for the flat JSON object write_json produces: the value of "key" as a
 * string (quotes removed) or a bare token (number, true, false, null). Returns 0 if absent. */
static int json_value(const char *text, const char *key, char *out, size_t size) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(text, pat);
    if (!p) return 0;
    p += strlen(pat);
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p++ != ':') return 0;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    size_t n = 0;
    if (*p == '"') {
        p++;
        while (*p && *p != '"' && n + 1 < size) out[n++] = *p++;
        if (*p != '"') return 0;
    } else {
        while (*p && *p != ',' && *p != '}' && *p != '\n' && *p != ' ' && n + 1 < size)
            out[n++] = *p++;
    }
    out[n] = '\0';
    return n > 0;
}

static int json_int(const char *text, const char *key, int64_t *out) {
    char v[64], *end;
    if (!json_value(text, key, v, sizeof v)) return 0;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end || errno == ERANGE || x < 0) return 0;
    *out = x;
    return 1;
}

static char *read_text(const char *path, char *err, size_t err_size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(65536 + 1);
    size_t n = buf ? fread(buf, 1, 65536, f) : 0;
    int big = buf && n == 65536 && fgetc(f) != EOF;
    fclose(f);
    if (!buf) {
        snprintf(err, err_size, "%s: out of memory", path);
        return NULL;
    }
    if (big) {
        free(buf);
        snprintf(err, err_size, "%s: too large for a lowp quantize metadata file", path);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

static int run_dequantize(const char *prefix, const char *outpath, int axis) {
    const char *cmd = "dequantize";
    char err[1024];
    int rc = 0;
    char *jpath = join(prefix, ".json"), *dpath = NULL, *spath = NULL, *text = NULL;
    float *out = NULL, *tr = NULL;
    lowp_npy d, s;
    memset(&d, 0, sizeof d);
    memset(&s, 0, sizeof s);
    if (!jpath) return say(cmd, 1, "out of memory");
    text = read_text(jpath, err, sizeof err);
    if (!text) {
        rc = say(cmd, 2, "%s", err);
        goto done;
    }
    char fname[32], sname[32], aname[16];
    int64_t R, C;
    lowp_format format;
    lowp_scaling scaling;
    int written;
    if (!json_value(text, "format", fname, sizeof fname) ||
        !json_value(text, "scaling", sname, sizeof sname) ||
        !json_value(text, "axis", aname, sizeof aname) || !json_int(text, "rows", &R) ||
        !json_int(text, "cols", &C)) {
        rc = say(cmd, 2,
                 "%s: not a lowp quantize metadata file (format, scaling, axis, rows or "
                 "cols missing)",
                 jpath);
        goto done;
    }
    if (lowp_format_from_name(fname, &format) != LOWP_OK ||
        (format != LOWP_FORMAT_E4M3 && format != LOWP_FORMAT_E5M2 && format != LOWP_FORMAT_E2M1) ||
        !parse_scaling(sname, &scaling) || !parse_axis(aname, 1, &written) || R <= 0 || C <= 0) {
        rc = say(cmd, 2,
                 "%s: bad metadata (format '%s', scaling '%s', axis '%s', rows %lld, cols "
                 "%lld)",
                 jpath, fname, sname, aname, (long long) R, (long long) C);
        goto done;
    }
    if (axis == 0) axis = (written & AXIS_ROW) ? AXIS_ROW : AXIS_COL;
    if (!(written & axis)) {
        rc = say(cmd, 2, "%s: the %s copy was not written (lowp quantize --axis %s)", jpath,
                 axis_name(axis), axis_name(written));
        goto done;
    }
    const char *tag = axis == AXIS_COL ? ".col" : "";
    char *base = join(prefix, tag);
    if (base) {
        dpath = join(base, ".data.npy");
        spath = join(base, ".scale.npy");
        free(base);
    }
    if (!dpath || !spath) {
        rc = say(cmd, 1, "out of memory");
        goto done;
    }
    lowp_qtensor q = {format, scaling, axis == AXIS_COL ? C : R, axis == AXIS_COL ? R : C,
                      NULL,   NULL,    LOWP_DEVICE_HOST,         NULL,
                      0};
    int64_t sr, sc;
    int e8;
    size_t rb;
    if (lowp_qtensor_scale_shape(&q, &sr, &sc, &e8) != LOWP_OK ||
        lowp_row_nbytes(format, q.cols, &rb) != LOWP_OK) {
        rc = say(cmd, 2, "%s: %s", jpath, lowp_last_error());
        goto done;
    }
    lowp_status st = lowp_npy_read(dpath, LOWP_NPY_U1, &d, err, sizeof err);
    if (st == LOWP_OK)
        st = lowp_npy_read(spath, e8 ? LOWP_NPY_U1 : LOWP_NPY_F4, &s, err, sizeof err);
    if (st != LOWP_OK) {
        rc = say(cmd, st == LOWP_ERR_OUT_OF_MEMORY ? 1 : 2, "%s", err);
        goto done;
    }
    if (d.ndim != 2 || d.shape[0] != q.rows || d.shape[1] != (int64_t) rb) {
        rc = say(cmd, 2, "%s: shape does not match %s: expected (%lld, %lld) uint8 codes", dpath,
                 jpath, (long long) q.rows, (long long) rb);
        goto done;
    }
    if (s.ndim != 2 || s.shape[0] != sr || s.shape[1] != sc) {
        rc = say(cmd, 2, "%s: shape does not match %s: expected (%lld, %lld) %s scales", spath,
                 jpath, (long long) sr, (long long) sc, e8 ? "uint8" : "float32");
        goto done;
    }
    q.data = d.data;
    q.scales = s.data;
    size_t n = (size_t) R * (size_t) C;
    out = malloc(n * sizeof *out + 1);
    if (!out) {
        rc = say(cmd, 1, "out of memory for %zu elements", n);
        goto done;
    }
    lowp_tensor t = {LOWP_FORMAT_F32, q.rows, q.cols, out, LOWP_DEVICE_HOST};
    st = lowp_dequantize(&q, &t);
    if (st != LOWP_OK) {
        rc = say(cmd, st == LOWP_ERR_INVALID_ARG || st == LOWP_ERR_UNSUPPORTED ? 2 : 1, "%s",
                 lowp_last_error());
        goto done;
    }
    const float *result = out;
    if (axis == AXIS_COL) { /* [C, R] back to [R, C] */
        tr = malloc(n * sizeof *tr + 1);
        if (!tr) {
            rc = say(cmd, 1, "out of memory for %zu elements", n);
            goto done;
        }
        for (int64_t i = 0; i < C; i++)
            for (int64_t j = 0; j < R; j++)
                tr[(size_t) j * (size_t) C + (size_t) i] =
                    out[(size_t) i * (size_t) R + (size_t) j];
        result = tr;
    }
    int64_t shape[2] = {R, C};
    if (lowp_npy_write(outpath, LOWP_NPY_F4, 2, shape, result, err, sizeof err) != LOWP_OK)
        rc = say(cmd, 1, "%s", err);
done:
    free(tr);
    free(out);
    lowp_npy_free(&d);
    lowp_npy_free(&s);
    free(text);
    free(jpath);
    free(dpath);
    free(spath);
    return rc;
}

int lowp_cli_dequantize(int argc, char **argv) {
    const char *cmd = "dequantize";
    static const char *const names[] = {"--axis", "--help", "-h"};
    static const int takes[] = {1, 0, 0};
    int axis = 0, seen_axis = 0;
    const char *pos[2];
    int npos = 0;
    opt_state o = {1, argc, 0, argv};
    for (; o.i < argc; o.i++) {
        const char *val;
        int k = next_opt(cmd, &o, names, takes, 3, &val);
        if (k == -2) return 2;
        if (k == -3) continue;
        if (k == -1) {
            if (npos == 2)
                return say(cmd, 2, "too many arguments: '%s' (expected OUT OUT.npy)", val);
            pos[npos++] = val;
            continue;
        }
        if (k >= 1) {
            fputs(DEQUANT_USAGE, stdout);
            return 0;
        }
        if (seen_axis++) return say(cmd, 2, "--axis given twice");
        if (!parse_axis(val, 0, &axis)) return say(cmd, 2, "--axis: '%s' is not row or col", val);
    }
    if (npos != 2)
        return say(cmd, 2,
                   "expected OUT (the prefix given to lowp quantize) and OUT.npy (got %d "
                   "arguments)",
                   npos);
    return run_dequantize(pos[0], pos[1], axis);
}
