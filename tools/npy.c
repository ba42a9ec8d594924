/* NumPy .npy reader and writer for the `lowp` tool (see npy.h).
 *
 * The header is a Python dict literal, e.g. {'descr': '<f4', 'fortran_order': False,
 * 'shape': (3, 4), } padded with spaces and a newline. It is parsed by a small tokenizer that
 * carries an end pointer everywhere, so a malformed or truncated header can never make it read
 * past the bytes it was given. Sizes are multiplied with overflow checks, and the data length
 * is checked against the shape before (for regular files) and after reading.
 */
#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tools/npy.c assumes a little-endian host"
#endif

#define NPY_MAGIC      "\x93NUMPY"
#define NPY_MAGIC_LEN  6
#define NPY_MAX_HEADER (1u << 20) /* refuse absurd header lengths before allocating */
#define NPY_ALIGN      64         /* NumPy pads preamble + header to a multiple of 64 */

static const struct {
    const char *descr, *name;
    size_t itemsize;
} g_dtypes[LOWP_NPY_DTYPE_COUNT] = {
    [LOWP_NPY_F4] = {"<f4", "float32", 4},
    [LOWP_NPY_U1] = {"|u1", "uint8", 1},
    [LOWP_NPY_U2] = {"<u2", "uint16", 2},
    [LOWP_NPY_I4] = {"<i4", "int32", 4},
};

const char *lowp_npy_descr(lowp_npy_dtype dtype) {
    return (unsigned) dtype < LOWP_NPY_DTYPE_COUNT ? g_dtypes[dtype].descr : "?";
}
const char *lowp_npy_dtype_name(lowp_npy_dtype dtype) {
    return (unsigned) dtype < LOWP_NPY_DTYPE_COUNT ? g_dtypes[dtype].name : "?";
}
size_t lowp_npy_itemsize(lowp_npy_dtype dtype) {
    return (unsigned) dtype < LOWP_NPY_DTYPE_COUNT ? g_dtypes[dtype].itemsize : 0;
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static lowp_status
fail(lowp_status st, char *err, size_t err_size, const char *fmt, ...) {
    if (err && err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return st;
}

int lowp_npy_count(int ndim, const int64_t *shape, size_t itemsize, size_t *count) {
    if (ndim < 0 || ndim > LOWP_NPY_MAX_DIMS || (ndim > 0 && !shape)) return -1;
    size_t n = 1;
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if ((uint64_t) shape[i] > SIZE_MAX) return -1;
        if (shape[i] == 0) zero = 1;
    }
    if (zero) {
        *count = 0;
        return 0;
    }
    for (int i = 0; i < ndim; i++) {
        size_t d = (size_t) shape[i];
        if (n > SIZE_MAX / d) return -1;
        n *= d;
    }
    if (itemsize && n > SIZE_MAX / itemsize) return -1;
    if (n > (size_t) INT64_MAX) return -1;
    *count = n;
    return 0;
}

void lowp_npy_free(lowp_npy *a) {
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ---- header parsing ---- */

typedef struct cursor {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int accept(cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

static int accept_word(cursor *c, const char *w) {
    size_t n = strlen(w);
    skip_ws(c);
    if ((size_t) (c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

/* A quoted Python string without escapes; copied (truncated) into out[0 .. out_size-1]. */
static int parse_string(cursor *c, char *out, size_t out_size) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\') return 0;
        if (n + 1 < out_size) out[n++] = *c->p;
        c->p++;
    }
    if (c->p >= c->end) return 0;
    c->p++;
    out[n] = '\0';
    return 1;
}

/* Copy `s` into out with non-printable bytes as \xNN, so messages stay on one line. */
static const char *printable(const char *s, char *out, size_t out_size) {
    size_t n = 0;
    for (; *s && n + 5 < out_size; s++) {
        unsigned char ch = (unsigned char) *s;
        if (ch >= 0x20 && ch < 0x7F)
            out[n++] = (char) ch;
        else
            n += (size_t) snprintf(out + n, out_size - n, "\\x%02X", ch);
    }
    out[n] = '\0';
    return out;
}

/* A NumPy-style name of any dtype string, for messages: '<f8' -> "float64". */
static void describe_descr(const char *descr, char *out, size_t out_size) {
    const char *s = descr;
    if (*s == '<' || *s == '>' || *s == '|' || *s == '=') s++;
    char kind = *s;
    char *endp = (char *) s;
    long size = s[0] ? strtol(s + 1, &endp, 10) : 0;
    int sized = s[0] && s[1] >= '0' && s[1] <= '9' && *endp == '\0' && size > 0 && size <= 64;
    const char *base = NULL;
    switch (kind) {
    case 'f': base = "float"; break;
    case 'i': base = "int"; break;
    case 'u': base = "uint"; break;
    case 'c': base = "complex"; break;
    default: break;
    }
    const char *be = descr[0] == '>' && sized && size > 1 ? "big-endian " : "";
    if (base && sized)
        snprintf(out, out_size, "%s%s%ld", be, base, size * 8);
    else if (kind == 'b' && sized && size == 1)
        snprintf(out, out_size, "bool");
    else if (kind == 'U')
        snprintf(out, out_size, "unicode string");
    else if (kind == 'S' || kind == 'a')
        snprintf(out, out_size, "bytes");
    else if (kind == 'O')
        snprintf(out, out_size, "Python object");
    else if (kind == 'M')
        snprintf(out, out_size, "datetime64");
    else if (kind == 'm')
        snprintf(out, out_size, "timedelta64");
    else if (kind == 'V')
        snprintf(out, out_size, "void");
    else
        snprintf(out, out_size, "unknown dtype");
}

/* Map a dtype string to a supported dtype; -1 if it is not one (or has the wrong byte order). */
static int match_descr(const char *descr) {
    char order = '=';
    const char *s = descr;
    if (*s == '<' || *s == '>' || *s == '|' || *s == '=') order = *s++;
    for (int d = 0; d < LOWP_NPY_DTYPE_COUNT; d++) {
        const char *want = g_dtypes[d].descr + 1; /* "f4", "u1", ... */
        if (strcmp(s, want) != 0) continue;
        if (g_dtypes[d].itemsize == 1) return d; /* byte order is meaningless */
        if (order == '<' || order == '=') return d;
        return -1; /* '>' big-endian, '|' not-applicable on a multi-byte type */
    }
    return -1;
}

static int parse_shape(cursor *c, lowp_npy *out, const char *name, char *err, size_t err_size,
                       lowp_status *st) {
    if (!accept(c, '(')) {
        *st = fail(LOWP_ERR_CORRUPT, err, err_size,
                   "%s: malformed .npy header: 'shape' is not a tuple", name);
        return 0;
    }
    out->ndim = 0;
    for (;;) {
        if (accept(c, ')')) return 1;
        skip_ws(c);
        if (c->p < c->end && *c->p == '-') {
            *st = fail(LOWP_ERR_CORRUPT, err, err_size,
                       "%s: malformed .npy header: negative dimension in 'shape'", name);
            return 0;
        }
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') {
            *st = fail(LOWP_ERR_CORRUPT, err, err_size,
                       "%s: malformed .npy header: 'shape' holds something other than integers",
                       name);
            return 0;
        }
        int64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            int digit = *c->p - '0';
            if (v > (INT64_MAX - digit) / 10) {
                *st =
                    fail(LOWP_ERR_CORRUPT, err, err_size,
                         "%s: malformed .npy header: a dimension of 'shape' overflows int64", name);
                return 0;
            }
            v = v * 10 + digit;
            c->p++;
        }
        if (c->p < c->end && (*c->p == 'L' || *c->p == 'l')) c->p++; /* Python 2 long */
        if (out->ndim == LOWP_NPY_MAX_DIMS) {
            *st = fail(LOWP_ERR_CORRUPT, err, err_size,
                       "%s: malformed .npy header: 'shape' has more than %d dimensions", name,
                       LOWP_NPY_MAX_DIMS);
            return 0;
        }
        out->shape[out->ndim++] = v;
        if (accept(c, ',')) continue;
        if (accept(c, ')')) return 1;
        *st = fail(LOWP_ERR_CORRUPT, err, err_size, "%s: malformed .npy header: bad 'shape' tuple",
                   name);
        return 0;
    }
}

/* The magic, the version and the header's length: *pre, the preamble's bytes, and *hlen. */
static lowp_status read_preamble(const uint8_t *buf, size_t len, const char *name, size_t *pre_out,
                                 size_t *hlen_out, char *err, size_t err_size) {
    if (!buf || len < NPY_MAGIC_LEN || memcmp(buf, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
        return fail(LOWP_ERR_CORRUPT, err, err_size, "%s: not an .npy file (no \\x93NUMPY magic)",
                    name);
    if (len < 8)
        return fail(LOWP_ERR_CORRUPT, err, err_size, "%s: truncated .npy preamble (%zu bytes)",
                    name, len);
    unsigned major = buf[6], minor = buf[7];
    if (major < 1 || major > 3 || minor != 0)
        return fail(LOWP_ERR_CORRUPT, err, err_size,
                    "%s: unsupported .npy format version %u.%u (1.0, 2.0 and 3.0 are read)", name,
                    major, minor);
    const size_t pre = major == 1 ? 10 : 12;
    if (len < pre)
        return fail(LOWP_ERR_CORRUPT, err, err_size, "%s: truncated .npy preamble (%zu bytes)",
                    name, len);
    const size_t hlen = major == 1 ? (size_t) buf[8] | (size_t) buf[9] << 8
                                   : (size_t) buf[8] | (size_t) buf[9] << 8 |
                                         (size_t) buf[10] << 16 | (size_t) buf[11] << 24;
    if (hlen > NPY_MAX_HEADER)
        return fail(LOWP_ERR_CORRUPT, err, err_size,
                    "%s: .npy header length %zu is larger than the %u bytes allowed", name, hlen,
                    NPY_MAX_HEADER);
    if (len - pre < hlen)
        return fail(LOWP_ERR_CORRUPT, err, err_size,
                    "%s: truncated .npy header: it needs %zu bytes, the file has %zu", name,
                    pre + hlen, len);

    *pre_out = pre;
    *hlen_out = hlen;
    return LOWP_OK;
}

/* The header's dict: 'descr' into descr[0 .. descr_size-1], 'fortran_order' into *fortran,
 * 'shape' into out, each exactly once, nothing else, nothing after the closing '}'. */
static lowp_status parse_dict(cursor c, const char *name, char *descr, size_t descr_size,
                              int *fortran, lowp_npy *out, char *err, size_t err_size) {
    int have_descr = 0, have_fortran = 0, have_shape = 0;
    char shown[256];
    lowp_status st = LOWP_OK;
    if (!accept(&c, '{'))
        return fail(LOWP_ERR_CORRUPT, err, err_size, "%s: malformed .npy header: no '{'", name);
    for (;;) {
        if (accept(&c, '}')) break;
        char key[32];
        if (!parse_string(&c, key, sizeof key) || !accept(&c, ':'))
            return fail(LOWP_ERR_CORRUPT, err, err_size,
                        "%s: malformed .npy header: expected 'key': value", name);
        if (strcmp(key, "descr") == 0 && !have_descr) {
            if (!parse_string(&c, descr, descr_size)) {
                skip_ws(&c);
                if (c.p < c.end && *c.p == '[')
                    return fail(LOWP_ERR_UNSUPPORTED, err, err_size,
                                "%s: dtype is a structured dtype; only simple dtypes are read",
                                name);
                return fail(LOWP_ERR_CORRUPT, err, err_size,
                            "%s: malformed .npy header: 'descr' is not a string", name);
            }
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
            if (accept_word(&c, "True"))
                *fortran = 1;
            else if (accept_word(&c, "False"))
                *fortran = 0;
            else
                return fail(LOWP_ERR_CORRUPT, err, err_size,
                            "%s: malformed .npy header: 'fortran_order' is not True or False",
                            name);
            have_fortran = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if (!parse_shape(&c, out, name, err, err_size, &st)) return st;
            have_shape = 1;
        } else {
            return fail(LOWP_ERR_CORRUPT, err, err_size,
                        "%s: malformed .npy header: unexpected or repeated key '%s'", name,
                        printable(key, shown, sizeof shown));
        }
        if (accept(&c, ',')) continue;
        if (accept(&c, '}')) break;
        return fail(LOWP_ERR_CORRUPT, err, err_size,
                    "%s: malformed .npy header: expected ',' or '}'", name);
    }
    skip_ws(&c);
    if (c.p != c.end)
        return fail(LOWP_ERR_CORRUPT, err, err_size,
                    "%s: malformed .npy header: characters after the closing '}'", name);
    if (!have_descr || !have_fortran || !have_shape)
        return fail(LOWP_ERR_CORRUPT, err, err_size, "%s: malformed .npy header: missing '%s'",
                    name,
                    !have_descr     ? "descr"
                    : !have_fortran ? "fortran_order"
                                    : "shape");
    return LOWP_OK;
}

/* The dtype of descr, if it is one read (and the one wanted), in C order. */
static lowp_status check_dtype(const char *descr, int fortran, lowp_npy_dtype want,
                               const char *name, lowp_npy *out, char *err, size_t err_size) {
    char shown[256];
    int d = match_descr(descr);
    if (d < 0 || (want != LOWP_NPY_ANY && d != (int) want)) {
        char what[64], expected[128];
        describe_descr(descr, what, sizeof what);
        if (want != LOWP_NPY_ANY)
            snprintf(expected, sizeof expected, "'%s' (%s)", g_dtypes[want].descr,
                     g_dtypes[want].name);
        else
            snprintf(expected, sizeof expected, "one of '<f4', '|u1', '<u2', '<i4'");
        return fail(LOWP_ERR_UNSUPPORTED, err, err_size, "%s: dtype is '%s' (%s), expected %s",
                    name, printable(descr, shown, sizeof shown), what, expected);
    }
    if (fortran)
        return fail(LOWP_ERR_UNSUPPORTED, err, err_size,
                    "%s: array is in Fortran order; only C order is read "
                    "(save np.ascontiguousarray(x))",
                    name);
    out->dtype = (lowp_npy_dtype) d;
    if (lowp_npy_count(out->ndim, out->shape, g_dtypes[d].itemsize, &out->count) != 0)
        return fail(LOWP_ERR_CORRUPT, err, err_size,
                    "%s: the .npy shape has more elements than fit in memory", name);
    out->nbytes = out->count * g_dtypes[d].itemsize;
    return LOWP_OK;
}

lowp_status lowp_npy_parse_header(const uint8_t *buf, size_t len, const char *name,
                                  lowp_npy_dtype want, lowp_npy *out, size_t *header_bytes,
                                  char *err, size_t err_size) {
    memset(out, 0, sizeof *out);
    size_t pre = 0, hlen = 0;
    lowp_status st = read_preamble(buf, len, name, &pre, &hlen, err, err_size);
    if (st != LOWP_OK) return st;
    cursor c = {(const char *) buf + pre, (const char *) buf + pre + hlen};
    char descr[64] = "";
    int fortran = 0;
    if ((st = parse_dict(c, name, descr, sizeof descr, &fortran, out, err, err_size)) != LOWP_OK)
        return st;
    if ((st = check_dtype(descr, fortran, want, name, out, err, err_size)) != LOWP_OK) return st;
    *header_bytes = pre + hlen;
    return LOWP_OK;
}

/* "(3, 4)", "(5,)" or "()", shortened with "..." if it does not fit. */
static const char *shape_str(const lowp_npy *a, char *buf, size_t size) {
    size_t n = (size_t) snprintf(buf, size, "(");
    for (int i = 0; i < a->ndim && n < size; i++)
        n += (size_t) snprintf(buf + n, size - n, i ? ", %lld" : "%lld", (long long) a->shape[i]);
    if (n < size) n += (size_t) snprintf(buf + n, size - n, a->ndim == 1 ? ",)" : ")");
    if (n >= size && size > 4) memcpy(buf + size - 4, "...", 4);
    return buf;
}

/* ---- reading ---- */

/* Read up to n bytes; returns how many were read (short only at EOF or on error). */
static size_t read_full(FILE *f, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        size_t chunk = n - got > ((size_t) 1 << 30) ? (size_t) 1 << 30 : n - got;
        size_t r = fread((uint8_t *) buf + got, 1, chunk, f);
        got += r;
        if (r < chunk) break;
    }
    return got;
}

/* The data bytes: one allocation of `n` for a regular file (its size was checked); from a pipe
 * or a device, whose length is unknown, a buffer that grows as data arrives, so a header that
 * declares more than the stream holds ends as truncated data (exit 2), not as a failed
 * allocation of the declared size. 0 when out of memory. */
static int read_data(FILE *f, size_t n, int regular, void **out, size_t *got) {
    size_t cap = regular || n < ((size_t) 1 << 20) ? n : (size_t) 1 << 20;
    uint8_t *buf = malloc(cap > 0 ? cap : 1);
    if (!buf) return 0;
    size_t have = read_full(f, buf, cap);
    while (have == cap && cap < n) {
        size_t next = cap > n / 2 ? n : 2 * cap;
        uint8_t *grown = realloc(buf, next);
        if (!grown) {
            free(buf);
            return 0;
        }
        buf = grown;
        have += read_full(f, buf + have, next - have);
        cap = next;
    }
    *out = buf;
    *got = have;
    return 1;
}

lowp_status lowp_npy_read(const char *path, lowp_npy_dtype want, lowp_npy *out, char *err,
                          size_t err_size) {
    if (!out) return fail(LOWP_ERR_INVALID_ARG, err, err_size, "lowp_npy_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return fail(LOWP_ERR_INVALID_ARG, err, err_size, "lowp_npy_read: path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f) return fail(LOWP_ERR_IO, err, err_size, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    int have_stat = fstat(fileno(f), &sb) == 0;
    if (have_stat && S_ISDIR(sb.st_mode)) {
        fclose(f);
        return fail(LOWP_ERR_IO, err, err_size, "%s: is a directory", path);
    }
    int regular = have_stat && S_ISREG(sb.st_mode);

    /* The preamble says how long the header is; with a bad magic, version or an absurd length
     * the parser gets just the preamble bytes and reports what is wrong. A valid header is at
     * least 2 bytes ("{}"), so total >= 12 >= npre and no data byte is consumed here. */
    uint8_t pre[12];
    size_t npre = read_full(f, pre, sizeof pre);
    size_t total = npre;
    if (npre >= 10 && memcmp(pre, NPY_MAGIC, NPY_MAGIC_LEN) == 0 && pre[7] == 0 &&
        (pre[6] == 1 || (pre[6] >= 2 && pre[6] <= 3 && npre == 12))) {
        size_t hlen = pre[6] == 1 ? (size_t) pre[8] | (size_t) pre[9] << 8
                                  : (size_t) pre[8] | (size_t) pre[9] << 8 |
                                        (size_t) pre[10] << 16 | (size_t) pre[11] << 24;
        size_t p = pre[6] == 1 ? 10 : 12;
        if (hlen <= NPY_MAX_HEADER && p + hlen > npre) total = p + hlen;
    }
    uint8_t *hbuf = malloc(total > 0 ? total : 1);
    if (!hbuf) {
        fclose(f);
        return fail(LOWP_ERR_OUT_OF_MEMORY, err, err_size, "%s: out of memory for the header",
                    path);
    }
    memcpy(hbuf, pre, npre);
    size_t have = npre + read_full(f, hbuf + npre, total - npre);
    if (ferror(f)) {
        int saved = errno;
        free(hbuf);
        fclose(f);
        return fail(LOWP_ERR_IO, err, err_size, "%s: read error: %s", path, strerror(saved));
    }
    lowp_npy probe;
    size_t hdr = 0;
    lowp_status st = lowp_npy_parse_header(hbuf, have, path, want, &probe, &hdr, err, err_size);
    free(hbuf);
    if (st != LOWP_OK) {
        fclose(f);
        return st;
    }
    /* For a regular file the data length is known before allocating anything. */
    if (regular && sb.st_size >= 0) {
        uint64_t fsize = (uint64_t) sb.st_size;
        uint64_t data = fsize >= hdr ? fsize - hdr : 0;
        if (data != (uint64_t) probe.nbytes) {
            fclose(f);
            char sh[128];
            return fail(LOWP_ERR_CORRUPT, err, err_size,
                        "%s: %s data: shape %s of '%s' needs %zu bytes after the %zu-byte header, "
                        "the file has %llu",
                        path, data < probe.nbytes ? "truncated" : "unexpected trailing",
                        shape_str(&probe, sh, sizeof sh), g_dtypes[probe.dtype].descr, probe.nbytes,
                        hdr, (unsigned long long) data);
        }
    }
    void *data = NULL;
    size_t got = 0;
    if (!read_data(f, probe.nbytes, regular, &data, &got)) {
        fclose(f);
        return fail(LOWP_ERR_OUT_OF_MEMORY, err, err_size, "%s: cannot allocate %zu bytes", path,
                    probe.nbytes);
    }
    int extra = got == probe.nbytes && fgetc(f) != EOF;
    int ioerr = ferror(f);
    fclose(f);
    if (ioerr || got != probe.nbytes || extra) {
        free(data);
        if (ioerr)
            return fail(LOWP_ERR_IO, err, err_size, "%s: read error: %s", path, strerror(errno));
        char sh[128];
        return fail(LOWP_ERR_CORRUPT, err, err_size,
                    "%s: %s data: shape %s of '%s' needs %zu bytes after the %zu-byte header, the "
                    "file has %s%zu",
                    path, extra ? "unexpected trailing" : "truncated",
                    shape_str(&probe, sh, sizeof sh), g_dtypes[probe.dtype].descr, probe.nbytes,
                    hdr, extra ? "more than " : "", got);
    }
    *out = probe;
    out->data = data;
    return LOWP_OK;
}

/* ---- writing ---- */

lowp_status lowp_npy_write(const char *path, lowp_npy_dtype dtype, int ndim, const int64_t *shape,
                           const void *data, char *err, size_t err_size) {
    if (!path) return fail(LOWP_ERR_INVALID_ARG, err, err_size, "lowp_npy_write: path is NULL");
    if ((unsigned) dtype >= LOWP_NPY_DTYPE_COUNT)
        return fail(LOWP_ERR_INVALID_ARG, err, err_size, "%s: dtype (%d) is not an .npy dtype",
                    path, (int) dtype);
    size_t count;
    if (lowp_npy_count(ndim, shape, g_dtypes[dtype].itemsize, &count) != 0)
        return fail(LOWP_ERR_INVALID_ARG, err, err_size, "%s: bad shape (%d dimensions)", path,
                    ndim);
    size_t nbytes = count * g_dtypes[dtype].itemsize;
    if (nbytes && !data) return fail(LOWP_ERR_INVALID_ARG, err, err_size, "%s: data is NULL", path);

    /* Header: the dict, padded with spaces to a multiple of 64 bytes with the preamble, '\n'. */
    size_t cap = 128 + (size_t) ndim * 24 + NPY_ALIGN;
    char *h = malloc(cap);
    if (!h) return fail(LOWP_ERR_OUT_OF_MEMORY, err, err_size, "%s: out of memory", path);
    size_t n = (size_t) snprintf(h, cap, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                                 g_dtypes[dtype].descr);
    for (int i = 0; i < ndim; i++)
        n += (size_t) snprintf(h + n, cap - n, i ? ", %lld" : "%lld", (long long) shape[i]);
    n += (size_t) snprintf(h + n, cap - n, ndim == 1 ? ",), }" : "), }");
    size_t pre = n + 1 > 65535 - NPY_ALIGN ? 12 : 10; /* version 2.0 only for huge headers */
    size_t total = pre + n + 1;
    size_t pad = (NPY_ALIGN - total % NPY_ALIGN) % NPY_ALIGN;
    memset(h + n, ' ', pad);
    n += pad;
    h[n++] = '\n';
    uint8_t preamble[12];
    memcpy(preamble, NPY_MAGIC, NPY_MAGIC_LEN);
    preamble[6] = pre == 10 ? 1 : 2;
    preamble[7] = 0;
    for (size_t i = 0; i < pre - 8; i++) preamble[8 + i] = (uint8_t) (n >> (8 * i));

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) {
        free(h);
        return fail(LOWP_ERR_OUT_OF_MEMORY, err, err_size, "%s: out of memory", path);
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    lowp_status st = LOWP_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = fail(LOWP_ERR_IO, err, err_size, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    int ok = fwrite(preamble, 1, pre, f) == pre && fwrite(h, 1, n, f) == n;
    for (size_t off = 0; ok && off < nbytes;) {
        size_t chunk = nbytes - off > ((size_t) 1 << 30) ? (size_t) 1 << 30 : nbytes - off;
        ok = fwrite((const uint8_t *) data + off, 1, chunk, f) == chunk;
        off += chunk;
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    if (fclose(f) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        remove(tmp);
        st = fail(LOWP_ERR_IO, err, err_size, "%s: write error: %s", tmp, strerror(saved));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        saved = errno;
        remove(tmp);
        st = fail(LOWP_ERR_IO, err, err_size, "%s: cannot rename %s over it: %s", path, tmp,
                  strerror(saved));
    }
done:
    free(tmp);
    free(h);
    return st;
}
