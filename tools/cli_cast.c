/* `lowp cast` (encode a float32 .npy array into element codes, or decode codes back to
 * float32) and `lowp demo` (a short printed tour of the formats and of stochastic rounding).
 * Both go through the public API only: lowp_cast for arrays, lowp_encode/lowp_decode for the
 * demo's single values. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_common.h"
#include "lowp/lowp.h"
#include "npy.h"

#define CAST_FORMATS "e4m3, e5m2, e2m1, e8m0, bf16, f16"

static const char CAST_USAGE[] =
    "usage: lowp cast --to FMT [--saturate satfinite|nonsat] [--round rne|sr] [--seed N]\n"
    "                 [--offset N] [--threads N] IN.npy OUT.npy\n"
    "       lowp cast --from FMT [--threads N] IN.npy OUT.npy\n"
    "\n"
    "Encode a float32 .npy array (any shape, C order) into element codes of FMT, or decode\n"
    "codes of FMT back to float32. FMT is one of " CAST_FORMATS ".\n"
    "Codes are uint8, one per element (e2m1 in the low nibble), or uint16 for bf16 and f16;\n"
    "the output has the shape of the input.\n"
    "\n"
    "  --to FMT          encode IN (float32) into codes of FMT\n"
    "  --from FMT        decode IN (codes of FMT) into float32\n"
    "  --saturate MODE   satfinite: overflow and +-Inf become +-fmax; nonsat: Inf where the\n"
    "                    format has it, else NaN. Default: nonsat for bf16 and f16 (IEEE, as\n"
    "                    torch's .to()), satfinite for the 8- and 4-bit formats and e8m0\n"
    "  --round MODE      rne (default, round to nearest even) or sr (stochastic, needs --seed)\n"
    "  --seed N          SR: the Philox seed\n"
    "  --offset N        SR: Philox word of element 0 (default 0); element i uses word N + i\n"
    "  --threads N       threads to use, 0 to 256; 0 (default) uses every core\n"
    "\n"
    "Exit status: 0 success, 2 bad usage or bad input file, 1 any other failure.\n";

/* The six formats `lowp cast` converts to and from (not f32). */
static int parse_format(const char *name, lowp_format *out) {
    lowp_format f;
    if (lowp_format_from_name(name, &f) != LOWP_OK || f == LOWP_FORMAT_F32) return 0;
    *out = f;
    return 1;
}

typedef struct cast_args {
    int encode; /* 1: --to, 0: --from */
    lowp_format format;
    lowp_cast_cfg cfg;
    int have_to, have_from, have_saturate, have_round, have_seed, have_offset, have_threads;
    const char *in, *out;
} cast_args;

typedef struct cast_opts {
    const char *to, *from, *saturate, *round;
    uint64_t seed, offset;
    int32_t threads;
} cast_opts;

static const lowp_cli_opt CAST_OPTS[] = {
    LOWP_CLI_STR("--to", cast_opts, to),
    LOWP_CLI_STR("--from", cast_opts, from),
    LOWP_CLI_STR("--saturate", cast_opts, saturate),
    LOWP_CLI_STR("--round", cast_opts, round),
    LOWP_CLI_U64("--seed", cast_opts, seed),
    LOWP_CLI_U64("--offset", cast_opts, offset),
    LOWP_CLI_I32("--threads", cast_opts, threads, 0, LOWP_MAX_THREADS),
};

/* Returns -1 when the arguments are fine, else the exit status (0 after --help). */
static int parse_cast_args(int argc, char **argv, cast_args *a) {
    memset(a, 0, sizeof *a);
    lowp_cast_cfg_init(&a->cfg);
    cast_opts o;
    memset(&o, 0, sizeof o);
    lowp_cli_args p = {
        "cast", CAST_USAGE, CAST_OPTS, (int) (sizeof CAST_OPTS / sizeof CAST_OPTS[0]),
        &o,     {0},        {0},       0};
    int rc = lowp_cli_parse(&p, argc, argv);
    if (rc >= 0) return rc;
    a->have_to = o.to != NULL;
    a->have_from = o.from != NULL;
    a->have_saturate = o.saturate != NULL;
    a->have_round = o.round != NULL;
    a->have_seed = lowp_cli_given(&p, "--seed");
    a->have_offset = lowp_cli_given(&p, "--offset");
    a->have_threads = lowp_cli_given(&p, "--threads");
    const char *fmt = o.to ? o.to : o.from;
    if (fmt && !parse_format(fmt, &a->format))
        return lowp_cli_fail("cast", 2, "%s: unknown format '%s' (use one of " CAST_FORMATS ")",
                             o.to ? "--to" : "--from", fmt);
    if (o.saturate) {
        if (strcmp(o.saturate, "satfinite") == 0)
            a->cfg.overflow = LOWP_OVERFLOW_SATFINITE;
        else if (strcmp(o.saturate, "nonsat") == 0)
            a->cfg.overflow = LOWP_OVERFLOW_NONSAT;
        else
            return lowp_cli_fail("cast", 2, "--saturate: '%s' is not satfinite or nonsat",
                                 o.saturate);
    }
    if (o.round) {
        if (strcmp(o.round, "rne") == 0)
            a->cfg.rounding = LOWP_ROUNDING_RNE;
        else if (strcmp(o.round, "sr") == 0)
            a->cfg.rounding = LOWP_ROUNDING_SR;
        else
            return lowp_cli_fail("cast", 2, "--round: '%s' is not rne or sr", o.round);
    }
    a->cfg.seed = o.seed;
    a->cfg.offset = o.offset;
    a->cfg.threads = o.threads;
    const int npos = p.npos;
    const char *const *pos = p.pos;
    if (npos > 2)
        return lowp_cli_fail("cast", 2, "too many files: '%s' (expected IN.npy OUT.npy)", pos[2]);
    if (a->have_to == a->have_from)
        return lowp_cli_fail("cast", 2, "%s",
                             a->have_to ? "give only one of --to and --from"
                                        : "missing --to FMT or --from FMT (see `lowp cast "
                                          "--help`)");
    a->encode = a->have_to;
    if (!a->encode && (a->have_saturate || a->have_round || a->have_seed || a->have_offset))
        return lowp_cli_fail("cast", 2,
                             "--saturate, --round, --seed and --offset apply to --to only "
                             "(decoding is exact)");
    if (a->cfg.rounding == LOWP_ROUNDING_SR && !a->have_seed)
        return lowp_cli_fail("cast", 2, "--round sr needs --seed N");
    if (a->cfg.rounding != LOWP_ROUNDING_SR && (a->have_seed || a->have_offset))
        return lowp_cli_fail("cast", 2, "--seed and --offset only apply with --round sr");
    if (a->cfg.rounding == LOWP_ROUNDING_SR) {
        const lowp_format_traits *t;
        lowp_format_get(a->format, &t);
        if (!t->encode_sr)
            return lowp_cli_fail("cast", 2,
                                 "--round sr is not defined for %s (a power-of-two scale format)",
                                 t->name);
    }
    if (npos != 2)
        return lowp_cli_fail("cast", 2, "expected two files, IN.npy OUT.npy (got %d)", npos);
    a->in = pos[0];
    a->out = pos[1];
    return -1;
}

/* Exit status of a failed npy call: input problems are the user's (2), the rest are 1. */
static int npy_failure(lowp_status st, const char *msg, int is_input) {
    lowp_cli_error("cast", "%s", msg);
    return is_input && st != LOWP_ERR_OUT_OF_MEMORY ? 2 : 1;
}

static int cast_failure(void) {
    lowp_cli_error("cast", "%s", lowp_last_error());
    return 1;
}

static int run_encode(const cast_args *a) {
    char err[768];
    lowp_npy in;
    lowp_status st = lowp_npy_read(a->in, LOWP_NPY_F4, &in, err, sizeof err);
    if (st != LOWP_OK) return npy_failure(st, err, 1);
    const lowp_format_traits *t;
    lowp_format_get(a->format, &t);
    size_t n = in.count;
    size_t code_bytes = t->bits == 16 ? 2 : 1;
    uint8_t *codes = malloc(n * code_bytes + 1);
    uint8_t *packed = t->bits == 4 ? malloc(n / 2 + 1) : NULL;
    int rc = 0;
    if (!codes || (t->bits == 4 && !packed)) {
        lowp_cli_error("cast", "out of memory for %zu elements", n);
        rc = 1;
        goto done;
    }
    lowp_tensor src = {LOWP_FORMAT_F32, 1, (int64_t) n, in.data, LOWP_DEVICE_HOST};
    lowp_tensor dst = {a->format, 1, (int64_t) n, packed ? (void *) packed : (void *) codes,
                       LOWP_DEVICE_HOST};
    if (lowp_cast(&src, &dst, &a->cfg) != LOWP_OK) {
        rc = cast_failure();
        goto done;
    }
    if (packed && lowp_fp4_unpack(packed, n, codes) != LOWP_OK) {
        rc = cast_failure();
        goto done;
    }
    st = lowp_npy_write(a->out, code_bytes == 2 ? LOWP_NPY_U2 : LOWP_NPY_U1, in.ndim, in.shape,
                        codes, err, sizeof err);
    if (st != LOWP_OK) rc = npy_failure(st, err, 0);
done:
    free(packed);
    free(codes);
    lowp_npy_free(&in);
    return rc;
}

static int run_decode(const cast_args *a) {
    char err[768];
    const lowp_format_traits *t;
    lowp_format_get(a->format, &t);
    lowp_npy in;
    lowp_status st =
        lowp_npy_read(a->in, t->bits == 16 ? LOWP_NPY_U2 : LOWP_NPY_U1, &in, err, sizeof err);
    if (st != LOWP_OK) {
        /* Say which format wanted that dtype. */
        if (st == LOWP_ERR_UNSUPPORTED && strstr(err, ": dtype is "))
            lowp_cli_error("cast", "%s (codes of %s)", err, t->name);
        else
            lowp_cli_error("cast", "%s", err);
        return st == LOWP_ERR_OUT_OF_MEMORY ? 1 : 2;
    }
    size_t n = in.count;
    if (n > (SIZE_MAX - 1) / sizeof(float)) {
        lowp_cli_error("cast", "%s: %zu elements are too many", a->in, n);
        lowp_npy_free(&in);
        return 1;
    }
    float *out = malloc(n * sizeof(float) + 1);
    uint8_t *packed = t->bits == 4 ? malloc(n / 2 + 1) : NULL;
    int rc = 0;
    if (!out || (t->bits == 4 && !packed)) {
        lowp_cli_error("cast", "out of memory for %zu elements", n);
        rc = 1;
        goto done;
    }
    if (packed) {
        const uint8_t *c = in.data;
        for (size_t i = 0; i < n; i++) {
            if (c[i] > 15) {
                lowp_cli_error("cast",
                               "%s: element %zu is %u, not an e2m1 code (0 to 15, one per byte)",
                               a->in, i, (unsigned) c[i]);
                rc = 2;
                goto done;
            }
        }
        lowp_fp4_pack(c, n, packed);
    }
    lowp_tensor src = {a->format, 1, (int64_t) n, packed ? (void *) packed : in.data,
                       LOWP_DEVICE_HOST};
    lowp_tensor dst = {LOWP_FORMAT_F32, 1, (int64_t) n, out, LOWP_DEVICE_HOST};
    if (lowp_cast(&src, &dst, &a->cfg) != LOWP_OK) {
        rc = cast_failure();
        goto done;
    }
    st = lowp_npy_write(a->out, LOWP_NPY_F4, in.ndim, in.shape, out, err, sizeof err);
    if (st != LOWP_OK) rc = npy_failure(st, err, 0);
done:
    free(packed);
    free(out);
    lowp_npy_free(&in);
    return rc;
}

int lowp_cli_cast(int argc, char **argv) {
    cast_args a;
    int rc = parse_cast_args(argc, argv, &a);
    if (rc >= 0) return rc;
    return a.encode ? run_encode(&a) : run_decode(&a);
}

/* ---- lowp demo ---- */

/* A value for the demo tables: "NaN", "Inf", "-Inf" or %.*g. */
static const char *show(float v, int digits, char *buf, size_t size) {
    if (isnan(v))
        snprintf(buf, size, "NaN");
    else if (isinf(v))
        snprintf(buf, size, v > 0 ? "Inf" : "-Inf");
    else
        snprintf(buf, size, "%.*g", digits, (double) v);
    return buf;
}

static int demo_cell(lowp_format f, float x, lowp_overflow ov, int digits, int width) {
    const lowp_format_traits *t;
    uint32_t code;
    float back;
    char vb[32];
    if (lowp_format_get(f, &t) != LOWP_OK || lowp_encode(f, x, ov, &code) != LOWP_OK ||
        lowp_decode(f, code, &back) != LOWP_OK)
        return -1;
    int hex = t->bits == 16 ? 4 : t->bits == 4 ? 1 : 2;
    int pad = width > hex + 3 ? width - hex - 3 : 0; /* 0 in the last column: no trailing blanks */
    printf(" | 0x%0*X %-*s", hex, (unsigned) code, pad, show(back, digits, vb, sizeof vb));
    return 0;
}

static int demo_table(const lowp_format *fmts, int nf, const float *xs, const char *const *labels,
                      int nx, int digits, int width) {
    printf("%10s", "input");
    for (int j = 0; j < nf; j++) {
        const lowp_format_traits *t;
        lowp_format_get(fmts[j], &t);
        printf(" | %-*s", j + 1 < nf ? width : 0, t->name);
    }
    printf("\n");
    for (int i = 0; i < nx; i++) {
        printf("%10s", labels[i]);
        for (int j = 0; j < nf; j++)
            if (demo_cell(fmts[j], xs[i], LOWP_OVERFLOW_SATFINITE, digits,
                          j + 1 < nf ? width : 0) != 0)
                return -1;
        printf("\n");
    }
    return 0;
}

static int demo_code(lowp_format f, float x, lowp_overflow ov, uint32_t *code, float *back) {
    if (lowp_encode(f, x, ov, code) != LOWP_OK) return -1;
    return lowp_decode(f, *code, back) == LOWP_OK ? 0 : -1;
}

static int demo_sr(void) {
    enum { N = 100000 };
    const float x = 0.3f;
    uint32_t c_rne, c_lo, c_hi;
    float v_rne, v_lo, v_hi;
    if (demo_code(LOWP_FORMAT_E4M3, x, LOWP_OVERFLOW_SATFINITE, &c_rne, &v_rne) != 0) return -1;
    /* Positive E4M3 codes are ordered like their values: the other neighbour is one code away. */
    c_lo = v_rne > x ? c_rne - 1 : c_rne;
    c_hi = c_lo + 1;
    if (lowp_decode(LOWP_FORMAT_E4M3, c_lo, &v_lo) != LOWP_OK ||
        lowp_decode(LOWP_FORMAT_E4M3, c_hi, &v_hi) != LOWP_OK)
        return -1;
    float *xs = malloc(N * sizeof *xs);
    uint8_t *codes = malloc(N);
    if (!xs || !codes) {
        free(xs);
        free(codes);
        return -1;
    }
    for (int i = 0; i < N; i++) xs[i] = x;
    lowp_cast_cfg cfg;
    lowp_cast_cfg_init(&cfg);
    cfg.rounding = LOWP_ROUNDING_SR;
    cfg.seed = 2024;
    lowp_tensor src = {LOWP_FORMAT_F32, 1, N, xs, LOWP_DEVICE_HOST};
    lowp_tensor dst = {LOWP_FORMAT_E4M3, 1, N, codes, LOWP_DEVICE_HOST};
    int rc = lowp_cast(&src, &dst, &cfg) == LOWP_OK ? 0 : -1;
    if (rc == 0) {
        long up = 0, other = 0;
        for (int i = 0; i < N; i++) {
            if (codes[i] == c_hi)
                up++;
            else if (codes[i] != c_lo)
                other++;
        }
        double mean = ((double) up * v_hi + (double) (N - up) * v_lo) / N;
        double p = ((double) x - v_lo) / ((double) v_hi - v_lo);
        printf("\nStochastic rounding (lowp_cast with Philox seed %llu): x = %.7g lies between the "
               "e4m3\nneighbours %g (0x%02X) and %g (0x%02X).\n",
               (unsigned long long) cfg.seed, (double) x, (double) v_lo, (unsigned) c_lo,
               (double) v_hi, (unsigned) c_hi);
        printf("  RNE: every element becomes %g, an error of %+.3g each.\n", (double) v_rne,
               (double) v_rne - (double) x);
        printf("  SR over %d elements: %.2f%% rounded up (expected %.2f%%), mean %.6g (error "
               "%+.2g).\n",
               N, 100.0 * (double) up / N, 100.0 * p, mean, mean - (double) x);
        if (other) printf("  (%ld elements got neither neighbour: a bug)\n", other);
    }
    free(xs);
    free(codes);
    return rc;
}

int lowp_cli_demo(int argc, char **argv) {
    if (argc > 1) {
        if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
            puts("usage: lowp demo\nPrint a few values in every element format, and a stochastic "
                 "rounding example.");
            return 0;
        }
        lowp_cli_error("demo", "unexpected argument '%s' (lowp demo takes none)", argv[1]);
        return 2;
    }
    static const char *const labels[] = {"0.1", "1",    "3.14159", "-250", "448",
                                         "480", "1e-3", "60000",   "Inf",  "NaN"};
    const float xs[] = {0.1f,   1.0f,  3.14159f, -250.0f,  448.0f,
                        480.0f, 1e-3f, 60000.0f, INFINITY, NAN};
    const int nx = (int) (sizeof xs / sizeof xs[0]);
    const lowp_format narrow[] = {LOWP_FORMAT_E4M3, LOWP_FORMAT_E5M2, LOWP_FORMAT_E2M1,
                                  LOWP_FORMAT_E8M0};
    const lowp_format wide[] = {LOWP_FORMAT_BF16, LOWP_FORMAT_F16};

    printf("lowp %s demo: binary32 -> code -> binary32, round to nearest even, satfinite\n\n",
           lowp_version());
    if (demo_table(narrow, 4, xs, labels, nx, 7, 17) != 0) goto fail;
    printf("\n");
    if (demo_table(wide, 2, xs, labels, nx, 8, 20) != 0) goto fail;

    uint32_t c1, c2, c3;
    float v1, v2, v3;
    char b1[32], b2[32], b3[32];
    if (demo_code(LOWP_FORMAT_E4M3, 480.0f, LOWP_OVERFLOW_NONSAT, &c1, &v1) != 0 ||
        demo_code(LOWP_FORMAT_E4M3, 464.0f, LOWP_OVERFLOW_NONSAT, &c2, &v2) != 0 ||
        demo_code(LOWP_FORMAT_E5M2, 61440.0f, LOWP_OVERFLOW_NONSAT, &c3, &v3) != 0)
        goto fail;
    printf("\nnonsat (on request) keeps overflow visible: 480 -> e4m3 0x%02X (%s), but the tie\n"
           "464 -> e4m3 0x%02X (%s, to even); 61440 -> e5m2 0x%02X (%s, to even).\n"
           "e8m0 is unsigned (zero and negatives are NaN 0xFF); e2m1 NaN encodes as 0.\n",
           (unsigned) c1, show(v1, 5, b1, sizeof b1), (unsigned) c2, show(v2, 5, b2, sizeof b2),
           (unsigned) c3, show(v3, 5, b3, sizeof b3));
    if (demo_sr() != 0) goto fail;
    return 0;
fail:
    lowp_cli_error("demo", "%s", lowp_last_error());
    return 1;
}
