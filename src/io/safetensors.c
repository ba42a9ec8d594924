/* The safetensors file format (trainer.h): a writer that builds the JSON header and writes
 * the file atomically, and a strict reader.
 *
 * The reader parses the header with a small recursive-descent JSON parser of its own rather
 * than trusting any part of the file: checkpoints come from disks that fill up, copies that
 * stop half way and hands that edit them, and every such file must end in a one-line error,
 * never in a read out of bounds. The tests feed it thousands of mutated files.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "io/fileio.h"
#include "io/json.h"
#include "lowp/safetensors.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c writes tensor bytes as they are in memory: a little-endian host is assumed"
#endif

/* The reference implementation refuses headers above 100 MB; so do we. */
#define ST_HEADER_MAX 100000000ull
#define ST_ALIGN      8

static const struct {
    const char *name;
    size_t size;
} DTYPES[LOWP_ST_DTYPE_COUNT] = {
    [LOWP_ST_BOOL] = {"BOOL", 1},       [LOWP_ST_U8] = {"U8", 1},
    [LOWP_ST_I8] = {"I8", 1},           [LOWP_ST_F8_E4M3] = {"F8_E4M3", 1},
    [LOWP_ST_F8_E5M2] = {"F8_E5M2", 1}, [LOWP_ST_F8_E8M0] = {"F8_E8M0", 1},
    [LOWP_ST_U16] = {"U16", 2},         [LOWP_ST_I16] = {"I16", 2},
    [LOWP_ST_F16] = {"F16", 2},         [LOWP_ST_BF16] = {"BF16", 2},
    [LOWP_ST_U32] = {"U32", 4},         [LOWP_ST_I32] = {"I32", 4},
    [LOWP_ST_F32] = {"F32", 4},         [LOWP_ST_U64] = {"U64", 8},
    [LOWP_ST_I64] = {"I64", 8},         [LOWP_ST_F64] = {"F64", 8},
};

const char *lowp_st_dtype_name(lowp_st_dtype dtype) {
    if ((int) dtype < 0 || dtype >= LOWP_ST_DTYPE_COUNT) return "?";
    return DTYPES[dtype].name;
}

size_t lowp_st_dtype_size(lowp_st_dtype dtype) {
    if ((int) dtype < 0 || dtype >= LOWP_ST_DTYPE_COUNT) return 0;
    return DTYPES[dtype].size;
}

static lowp_status shape_nbytes(const char *fn, const char *name, lowp_st_dtype dtype, int32_t ndim,
                                const int64_t *shape, size_t *out) {
    if ((int) dtype < 0 || dtype >= LOWP_ST_DTYPE_COUNT)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: tensor '%s': dtype (%d) is not a lowp_st_dtype",
                         fn, name, (int) dtype);
    if (ndim < 0 || ndim > LOWP_ST_MAX_DIMS)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: tensor '%s': ndim (%d) is not in [0, %d]", fn,
                         name, (int) ndim, LOWP_ST_MAX_DIMS);
    uint64_t total = DTYPES[dtype].size;
    for (int32_t i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: tensor '%s': shape[%d] (%lld) < 0", fn,
                             name, (int) i, (long long) shape[i]);
        uint64_t d = (uint64_t) shape[i];
        if (d != 0 && total > (uint64_t) SIZE_MAX / d)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: tensor '%s': size overflows", fn, name);
        total *= d;
    }
    *out = (size_t) total;
    return LOWP_OK;
}

lowp_status lowp_st_tensor_nbytes(const lowp_st_tensor *t, size_t *out) {
    LOWP_CHECK_PTR("lowp_st_tensor_nbytes", t);
    LOWP_CHECK_PTR("lowp_st_tensor_nbytes", out);
    return shape_nbytes("lowp_st_tensor_nbytes", t->name ? t->name : "(null)", t->dtype, t->ndim,
                        t->shape, out);
}

/* ---- UTF-8 ---- */

static int utf8_valid(const char *s) {
    const unsigned char *p = (const unsigned char *) s;
    size_t n = strlen(s);
    while (n) {
        size_t k = lowp_json_utf8_seq(p, n);
        if (!k) return 0;
        p += k;
        n -= k;
    }
    return 1;
}

/* ---- Writer ---- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) {
    sb_put(b, s, strlen(s));
}

static void sb_json_string(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char) *p;
            sb_put(b, esc, 2);
        } else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *) p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static lowp_status write_all(int fd, const void *data, size_t n, const char *path) {
    const char *p = data;
    while (n > 0) {
        size_t chunk = n > ((size_t) 1 << 30) ? ((size_t) 1 << 30) : n;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return lowp_fail(LOWP_ERR_IO, "lowp_safetensors_write: writing %s: %s", path,
                             strerror(errno));
        }
        p += w;
        n -= (size_t) w;
    }
    return LOWP_OK;
}

/* fsync the directory that holds `path`, so that the rename itself is durable. Filesystems
 * that cannot sync a directory (EINVAL) are accepted: there is nothing more to do there. */
static lowp_status sync_dir(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) {
        strcpy(dir, ".");
    } else if (slash == path) {
        strcpy(dir, "/");
    } else {
        size_t n = (size_t) (slash - path);
        if (n >= sizeof dir) return LOWP_OK;
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return LOWP_OK;
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0 && err != EINVAL && err != EROFS)
        return lowp_fail(LOWP_ERR_IO, "lowp_safetensors_write: fsync of directory %s: %s", dir,
                         strerror(err));
    return LOWP_OK;
}

static lowp_status check_write_args(const lowp_st_tensor *tensors, int32_t n,
                                    const lowp_st_meta *meta, int32_t nmeta) {
    const char *fn = "lowp_safetensors_write";
    if (n < 0) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: n (%d) < 0", fn, (int) n);
    if (nmeta < 0) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: nmeta (%d) < 0", fn, (int) nmeta);
    if (n > 0 && !tensors) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: tensors is NULL", fn);
    if (nmeta > 0 && !meta) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: meta is NULL", fn);
    for (int32_t i = 0; i < n; i++) {
        const lowp_st_tensor *t = &tensors[i];
        if (!t->name || !t->name[0])
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: tensors[%d].name is empty", fn, (int) i);
        if (strcmp(t->name, "__metadata__") == 0 || !utf8_valid(t->name))
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: tensors[%d].name is reserved or not UTF-8",
                             fn, (int) i);
        size_t nb;
        lowp_status st = shape_nbytes(fn, t->name, t->dtype, t->ndim, t->shape, &nb);
        if (st != LOWP_OK) return st;
        if (nb > 0 && !t->data)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: tensor '%s': data is NULL", fn, t->name);
        for (int32_t j = 0; j < i; j++)
            if (strcmp(tensors[j].name, t->name) == 0)
                return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: tensor name '%s' appears twice", fn,
                                 t->name);
    }
    for (int32_t i = 0; i < nmeta; i++) {
        if (!meta[i].key || !meta[i].value)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: meta[%d] has a NULL key or value", fn,
                             (int) i);
        if (!utf8_valid(meta[i].key) || !utf8_valid(meta[i].value))
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: meta['%s'] is not UTF-8", fn, meta[i].key);
        for (int32_t j = 0; j < i; j++)
            if (strcmp(meta[j].key, meta[i].key) == 0)
                return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: metadata key '%s' appears twice", fn,
                                 meta[i].key);
    }
    return LOWP_OK;
}

lowp_status lowp_safetensors_write(const char *path, const lowp_st_tensor *tensors, int32_t n,
                                   const lowp_st_meta *meta, int32_t nmeta) {
    const char *fn = "lowp_safetensors_write";
    LOWP_CHECK_PTR(fn, path);
    lowp_status st = check_write_args(tensors, n, meta, nmeta);
    if (st != LOWP_OK) return st;

    sbuf h = {0};
    sb_str(&h, "{");
    int first = 1;
    if (nmeta > 0) {
        sb_str(&h, "\"__metadata__\":{");
        for (int32_t i = 0; i < nmeta; i++) {
            if (i) sb_str(&h, ",");
            sb_json_string(&h, meta[i].key);
            sb_str(&h, ":");
            sb_json_string(&h, meta[i].value);
        }
        sb_str(&h, "}");
        first = 0;
    }
    uint64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        const lowp_st_tensor *t = &tensors[i];
        size_t nb;
        shape_nbytes(fn, t->name, t->dtype, t->ndim, t->shape, &nb);
        char num[64];
        if (!first) sb_str(&h, ",");
        first = 0;
        sb_json_string(&h, t->name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, DTYPES[t->dtype].name);
        sb_str(&h, "\",\"shape\":[");
        for (int32_t d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long) t->shape[d]);
            sb_str(&h, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long) off,
                 (unsigned long long) (off + nb));
        sb_str(&h, num);
        off += nb;
    }
    sb_str(&h, "}");
    /* Pad with spaces (allowed after the JSON) so that the data starts 8-byte aligned. */
    while (!h.oom && (8 + h.len) % ST_ALIGN != 0) sb_str(&h, " ");
    if (h.oom) {
        free(h.p);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: no memory for the header of %s", fn, path);
    }

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) {
        free(h.p);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = lowp_fail(LOWP_ERR_IO, "%s: cannot create %s: %s", fn, tmp, strerror(errno));
        free(h.p);
        free(tmp);
        return st;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char) ((uint64_t) h.len >> (8 * i));
    st = write_all(fd, len8, 8, tmp);
    if (st == LOWP_OK) st = write_all(fd, h.p, h.len, tmp);
    for (int32_t i = 0; i < n && st == LOWP_OK; i++) {
        size_t nb;
        shape_nbytes(fn, tensors[i].name, tensors[i].dtype, tensors[i].ndim, tensors[i].shape, &nb);
        if (nb) st = write_all(fd, tensors[i].data, nb, tmp);
    }
    free(h.p);
    if (st == LOWP_OK && fsync(fd) != 0)
        st = lowp_fail(LOWP_ERR_IO, "%s: fsync of %s: %s", fn, tmp, strerror(errno));
    if (close(fd) != 0 && st == LOWP_OK)
        st = lowp_fail(LOWP_ERR_IO, "%s: closing %s: %s", fn, tmp, strerror(errno));
    if (st == LOWP_OK) {
        if (rename(tmp, path) != 0)
            st = lowp_fail(LOWP_ERR_IO, "%s: cannot rename %s to %s: %s", fn, tmp, path,
                           strerror(errno));
    }
    if (st != LOWP_OK) {
        unlink(tmp);
        free(tmp);
        return st;
    }
    free(tmp);
    return sync_dir(path);
}

/* ---- Reader ---- */

typedef struct st_entry {
    char *name;
    lowp_st_dtype dtype;
    int32_t ndim;
    int64_t shape[LOWP_ST_MAX_DIMS];
    uint64_t begin, end;
    int seen_dtype, seen_shape, seen_offsets;
} st_entry;

struct lowp_safetensors {
    unsigned char *buf; /* the whole file */
    size_t len;
    const unsigned char *data; /* the data section */
    size_t data_len;
    st_entry *t; /* sorted by begin (the order of the data section) */
    int32_t nt, cap_t;
    int32_t *by_name; /* indices of t sorted by name */
    char **mkey, **mval;
    int32_t *mkey_sorted;
    int32_t nm, cap_m;
    int seen_meta;
};

/* The header's JSON cursor (io/json.h) and the file it fills. */
typedef struct jparser {
    lowp_json j;
    lowp_safetensors *f;
} jparser;

static lowp_status jfail(jparser *p, const char *what) {
    return lowp_json_fail(&p->j, what);
}
static void jws(jparser *p) {
    lowp_json_ws(&p->j);
}
static int jpeek(jparser *p, unsigned char c) {
    return lowp_json_peek(&p->j, c);
}
static int jeat(jparser *p, unsigned char c) {
    return lowp_json_eat(&p->j, c);
}
static lowp_status jstring(jparser *p, char **out) {
    return lowp_json_string(&p->j, out);
}

static lowp_status parse_metadata(jparser *p) {
    lowp_safetensors *f = p->f;
    if (f->seen_meta) return jfail(p, "\"__metadata__\" appears twice");
    f->seen_meta = 1;
    if (!jeat(p, '{')) return jfail(p, "\"__metadata__\" is not an object");
    if (jeat(p, '}')) return LOWP_OK;
    for (;;) {
        char *key = NULL, *val = NULL;
        lowp_status st = jstring(p, &key);
        if (st != LOWP_OK) return st;
        if (!jeat(p, ':')) {
            free(key);
            return jfail(p, "expected ':'");
        }
        if (!jpeek(p, '"')) {
            free(key);
            return jfail(p, "a metadata value is not a string");
        }
        if ((st = jstring(p, &val)) != LOWP_OK) {
            free(key);
            return st;
        }
        if (f->nm == f->cap_m) {
            int32_t cap = f->cap_m ? 2 * f->cap_m : 16;
            char **k2 = realloc(f->mkey, (size_t) cap * sizeof *k2);
            if (k2) f->mkey = k2;
            char **v2 = k2 ? realloc(f->mval, (size_t) cap * sizeof *v2) : NULL;
            if (v2) f->mval = v2;
            if (!k2 || !v2) {
                free(key);
                free(val);
                return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_safetensors_read: out of memory");
            }
            f->cap_m = cap;
        }
        f->mkey[f->nm] = key;
        f->mval[f->nm] = val;
        f->nm++;
        if (jeat(p, ',')) continue;
        if (jeat(p, '}')) return LOWP_OK;
        return jfail(p, "expected ',' or '}' in \"__metadata__\"");
    }
}

static lowp_status parse_entry(jparser *p, st_entry *e) {
    if (!jeat(p, '{')) return jfail(p, "a tensor entry is not an object");
    if (jeat(p, '}')) return jfail(p, "empty tensor entry");
    for (;;) {
        char *key = NULL;
        lowp_status st = jstring(p, &key);
        if (st != LOWP_OK) return st;
        if (!jeat(p, ':')) {
            free(key);
            return jfail(p, "expected ':'");
        }
        if (strcmp(key, "dtype") == 0) {
            free(key);
            if (e->seen_dtype) return jfail(p, "\"dtype\" appears twice");
            e->seen_dtype = 1;
            char *name = NULL;
            if (!jpeek(p, '"')) return jfail(p, "\"dtype\" is not a string");
            if ((st = jstring(p, &name)) != LOWP_OK) return st;
            int found = -1;
            for (int d = 0; d < LOWP_ST_DTYPE_COUNT; d++)
                if (strcmp(name, DTYPES[d].name) == 0) found = d;
            if (found < 0) {
                st = lowp_fail(LOWP_ERR_CORRUPT,
                               "lowp_safetensors_read: %s: tensor '%s' has unknown dtype '%.32s'",
                               p->j.src, e->name, name);
                free(name);
                return st;
            }
            free(name);
            e->dtype = (lowp_st_dtype) found;
        } else if (strcmp(key, "shape") == 0) {
            free(key);
            if (e->seen_shape) return jfail(p, "\"shape\" appears twice");
            e->seen_shape = 1;
            if (!jeat(p, '[')) return jfail(p, "\"shape\" is not an array");
            if (!jeat(p, ']')) {
                for (;;) {
                    uint64_t d;
                    if ((st = lowp_json_uint(&p->j, &d)) != LOWP_OK) return st;
                    if (e->ndim == LOWP_ST_MAX_DIMS)
                        return lowp_fail(LOWP_ERR_CORRUPT,
                                         "lowp_safetensors_read: %s: tensor '%s' has more than "
                                         "%d dimensions",
                                         p->j.src, e->name, LOWP_ST_MAX_DIMS);
                    if (d > (uint64_t) INT64_MAX) return jfail(p, "dimension too large");
                    e->shape[e->ndim++] = (int64_t) d;
                    if (jeat(p, ',')) continue;
                    if (jeat(p, ']')) break;
                    return jfail(p, "expected ',' or ']' in \"shape\"");
                }
            }
        } else if (strcmp(key, "data_offsets") == 0) {
            free(key);
            if (e->seen_offsets) return jfail(p, "\"data_offsets\" appears twice");
            e->seen_offsets = 1;
            if (!jeat(p, '[')) return jfail(p, "\"data_offsets\" is not an array");
            if ((st = lowp_json_uint(&p->j, &e->begin)) != LOWP_OK) return st;
            if (!jeat(p, ',')) return jfail(p, "\"data_offsets\" needs two integers");
            if ((st = lowp_json_uint(&p->j, &e->end)) != LOWP_OK) return st;
            if (!jeat(p, ']')) return jfail(p, "\"data_offsets\" needs exactly two integers");
        } else {
            free(key);
            if ((st = lowp_json_skip(&p->j, 1)) != LOWP_OK) return st;
        }
        if (jeat(p, ',')) continue;
        if (jeat(p, '}')) break;
        return jfail(p, "expected ',' or '}' in a tensor entry");
    }
    if (!e->seen_dtype || !e->seen_shape || !e->seen_offsets)
        return lowp_fail(LOWP_ERR_CORRUPT, "lowp_safetensors_read: %s: tensor '%s' lacks \"%s\"",
                         p->j.src, e->name,
                         !e->seen_dtype   ? "dtype"
                         : !e->seen_shape ? "shape"
                                          : "data_offsets");
    return LOWP_OK;
}

static lowp_status parse_header(jparser *p) {
    lowp_safetensors *f = p->f;
    jws(p);
    if (p->j.i != 0 || !jeat(p, '{')) return jfail(p, "the header does not start with '{'");
    if (!jeat(p, '}')) {
        for (;;) {
            char *name = NULL;
            lowp_status st = jstring(p, &name);
            if (st != LOWP_OK) return st;
            if (!jeat(p, ':')) {
                free(name);
                return jfail(p, "expected ':'");
            }
            if (strcmp(name, "__metadata__") == 0) {
                free(name);
                if ((st = parse_metadata(p)) != LOWP_OK) return st;
            } else {
                if (!name[0]) {
                    free(name);
                    return jfail(p, "empty tensor name");
                }
                if (f->nt == f->cap_t) {
                    int32_t cap = f->cap_t ? 2 * f->cap_t : 16;
                    st_entry *t2 = realloc(f->t, (size_t) cap * sizeof *t2);
                    if (!t2) {
                        free(name);
                        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY,
                                         "lowp_safetensors_read: out of memory");
                    }
                    f->t = t2;
                    f->cap_t = cap;
                }
                st_entry *e = &f->t[f->nt++];
                memset(e, 0, sizeof *e);
                e->name = name;
                if ((st = parse_entry(p, e)) != LOWP_OK) return st;
            }
            if (jeat(p, ',')) continue;
            if (jeat(p, '}')) break;
            return jfail(p, "expected ',' or '}' at the top level");
        }
    }
    jws(p);
    if (p->j.i != p->j.n) return jfail(p, "bytes after the JSON object");
    return LOWP_OK;
}

static _Thread_local const lowp_safetensors *g_sort_file; /* qsort takes no context in C11 */

static int cmp_begin(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(g_sort_file->t[*(const int32_t *) a].name,
                  g_sort_file->t[*(const int32_t *) b].name);
}

static int cmp_mkey(const void *a, const void *b) {
    return strcmp(g_sort_file->mkey[*(const int32_t *) a], g_sort_file->mkey[*(const int32_t *) b]);
}

/* Sizes, offsets, coverage and unique names; builds the sorted indices. */
static lowp_status validate(lowp_safetensors *f, const char *src) {
    const char *fn = "lowp_safetensors_read";
    for (int32_t i = 0; i < f->nt; i++) {
        st_entry *e = &f->t[i];
        size_t nb;
        if (shape_nbytes(fn, e->name, e->dtype, e->ndim, e->shape, &nb) != LOWP_OK)
            return lowp_fail(LOWP_ERR_CORRUPT, "%s: %s: tensor '%s' has an impossible shape", fn,
                             src, e->name);
        if (e->end < e->begin || e->end > f->data_len)
            return lowp_fail(LOWP_ERR_CORRUPT,
                             "%s: %s: tensor '%s' has data_offsets [%llu, %llu] outside the data "
                             "section (%zu bytes; the file may be truncated)",
                             fn, src, e->name, (unsigned long long) e->begin,
                             (unsigned long long) e->end, f->data_len);
        if (e->end - e->begin != (uint64_t) nb)
            return lowp_fail(LOWP_ERR_CORRUPT,
                             "%s: %s: tensor '%s' (%s, %zu bytes by its shape) has data_offsets "
                             "[%llu, %llu] (%llu bytes)",
                             fn, src, e->name, DTYPES[e->dtype].name, nb,
                             (unsigned long long) e->begin, (unsigned long long) e->end,
                             (unsigned long long) (e->end - e->begin));
    }
    if (f->nt > 1) qsort(f->t, (size_t) f->nt, sizeof *f->t, cmp_begin);
    uint64_t at = 0;
    for (int32_t i = 0; i < f->nt; i++) {
        if (f->t[i].begin != at)
            return lowp_fail(LOWP_ERR_CORRUPT,
                             "%s: %s: tensor '%s' starts at data offset %llu, expected %llu "
                             "(tensors overlap or leave a gap)",
                             fn, src, f->t[i].name, (unsigned long long) f->t[i].begin,
                             (unsigned long long) at);
        at = f->t[i].end;
    }
    if (at != f->data_len)
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "%s: %s: the tensors end at data offset %llu but the data section has "
                         "%zu bytes",
                         fn, src, (unsigned long long) at, f->data_len);
    f->by_name = malloc((size_t) (f->nt ? f->nt : 1) * sizeof *f->by_name);
    f->mkey_sorted = malloc((size_t) (f->nm ? f->nm : 1) * sizeof *f->mkey_sorted);
    if (!f->by_name || !f->mkey_sorted)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (int32_t i = 0; i < f->nt; i++) f->by_name[i] = i;
    for (int32_t i = 0; i < f->nm; i++) f->mkey_sorted[i] = i;
    g_sort_file = f;
    if (f->nt > 1) qsort(f->by_name, (size_t) f->nt, sizeof *f->by_name, cmp_name);
    if (f->nm > 1) qsort(f->mkey_sorted, (size_t) f->nm, sizeof *f->mkey_sorted, cmp_mkey);
    g_sort_file = NULL;
    for (int32_t i = 1; i < f->nt; i++)
        if (strcmp(f->t[f->by_name[i]].name, f->t[f->by_name[i - 1]].name) == 0)
            return lowp_fail(LOWP_ERR_CORRUPT, "%s: %s: tensor '%s' appears twice", fn, src,
                             f->t[f->by_name[i]].name);
    for (int32_t i = 1; i < f->nm; i++)
        if (strcmp(f->mkey[f->mkey_sorted[i]], f->mkey[f->mkey_sorted[i - 1]]) == 0)
            return lowp_fail(LOWP_ERR_CORRUPT, "%s: %s: metadata key '%s' appears twice", fn, src,
                             f->mkey[f->mkey_sorted[i]]);
    return LOWP_OK;
}

void lowp_safetensors_free(lowp_safetensors *f) {
    if (!f) return;
    for (int32_t i = 0; i < f->nt; i++) free(f->t[i].name);
    for (int32_t i = 0; i < f->nm; i++) {
        free(f->mkey[i]);
        free(f->mval[i]);
    }
    free(f->t);
    free(f->mkey);
    free(f->mval);
    free(f->by_name);
    free(f->mkey_sorted);
    free(f->buf);
    free(f);
}

/* Takes ownership of buf. */
static lowp_status parse_owned(unsigned char *buf, size_t len, const char *src,
                               lowp_safetensors **out) {
    const char *fn = "lowp_safetensors_read";
    lowp_safetensors *f = calloc(1, sizeof *f);
    if (!f) {
        free(buf);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    f->buf = buf;
    f->len = len;
    if (len < 8) {
        lowp_safetensors_free(f);
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "%s: %s: %zu bytes, too short for a safetensors file (8-byte header "
                         "length first)",
                         fn, src, len);
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > ST_HEADER_MAX || hlen > len - 8 || hlen < 2) {
        lowp_safetensors_free(f);
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "%s: %s: header length %llu does not fit the file (%zu bytes; at most "
                         "%llu allowed): truncated or not a safetensors file",
                         fn, src, (unsigned long long) hlen, len, ST_HEADER_MAX);
    }
    jparser p = {{buf + 8, (size_t) hlen, 0, "lowp_safetensors_read", src, "header"}, f};
    lowp_status st = parse_header(&p);
    if (st == LOWP_OK) {
        f->data = buf + 8 + hlen;
        f->data_len = len - 8 - (size_t) hlen;
        st = validate(f, src);
    }
    if (st != LOWP_OK) {
        lowp_safetensors_free(f);
        return st;
    }
    *out = f;
    return LOWP_OK;
}

lowp_status lowp_safetensors_parse(const void *bytes, size_t len, lowp_safetensors **out) {
    LOWP_CHECK_PTR("lowp_safetensors_parse", out);
    *out = NULL;
    if (len > 0) LOWP_CHECK_PTR("lowp_safetensors_parse", bytes);
    unsigned char *buf = malloc(len ? len : 1);
    if (!buf) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_safetensors_parse: out of memory");
    if (len) memcpy(buf, bytes, len);
    return parse_owned(buf, len, "<memory>", out);
}

lowp_status lowp_safetensors_read(const char *path, lowp_safetensors **out) {
    const char *fn = "lowp_safetensors_read";
    LOWP_CHECK_PTR(fn, path);
    LOWP_CHECK_PTR(fn, out);
    *out = NULL;
    unsigned char *buf;
    size_t len;
    lowp_status st = lowp_file_read_all(fn, path, &buf, &len);
    if (st != LOWP_OK) return st;
    return parse_owned(buf, len, path, out);
}

lowp_status lowp_safetensors_count(const lowp_safetensors *f, int32_t *tensors, int32_t *meta) {
    LOWP_CHECK_PTR("lowp_safetensors_count", f);
    if (tensors) *tensors = f->nt;
    if (meta) *meta = f->nm;
    return LOWP_OK;
}

static void fill(const lowp_safetensors *f, const st_entry *e, lowp_st_tensor *out) {
    memset(out, 0, sizeof *out);
    out->name = e->name;
    out->dtype = e->dtype;
    out->ndim = e->ndim;
    memcpy(out->shape, e->shape, sizeof e->shape);
    out->data = f->data + e->begin;
}

lowp_status lowp_safetensors_tensor(const lowp_safetensors *f, int32_t i, lowp_st_tensor *out) {
    LOWP_CHECK_PTR("lowp_safetensors_tensor", f);
    LOWP_CHECK_PTR("lowp_safetensors_tensor", out);
    if (i < 0 || i >= f->nt)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_safetensors_tensor: i (%d) not in [0, %d)",
                         (int) i, (int) f->nt);
    fill(f, &f->t[i], out);
    return LOWP_OK;
}

lowp_status lowp_safetensors_find(const lowp_safetensors *f, const char *name,
                                  lowp_st_tensor *out) {
    LOWP_CHECK_PTR("lowp_safetensors_find", f);
    LOWP_CHECK_PTR("lowp_safetensors_find", name);
    LOWP_CHECK_PTR("lowp_safetensors_find", out);
    int32_t lo = 0, hi = f->nt;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->t[f->by_name[mid]].name, name);
        if (c == 0) {
            fill(f, &f->t[f->by_name[mid]], out);
            return LOWP_OK;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lowp_fail(LOWP_ERR_NOT_FOUND, "lowp_safetensors_find: no tensor '%s'", name);
}

lowp_status lowp_safetensors_meta_at(const lowp_safetensors *f, int32_t i, const char **key,
                                     const char **value) {
    LOWP_CHECK_PTR("lowp_safetensors_meta_at", f);
    if (i < 0 || i >= f->nm)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_safetensors_meta_at: i (%d) not in [0, %d)",
                         (int) i, (int) f->nm);
    if (key) *key = f->mkey[i];
    if (value) *value = f->mval[i];
    return LOWP_OK;
}

lowp_status lowp_safetensors_meta(const lowp_safetensors *f, const char *key, const char **value) {
    LOWP_CHECK_PTR("lowp_safetensors_meta", f);
    LOWP_CHECK_PTR("lowp_safetensors_meta", key);
    LOWP_CHECK_PTR("lowp_safetensors_meta", value);
    int32_t lo = 0, hi = f->nm;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->mkey[f->mkey_sorted[mid]], key);
        if (c == 0) {
            *value = f->mval[f->mkey_sorted[mid]];
            return LOWP_OK;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lowp_fail(LOWP_ERR_NOT_FOUND, "lowp_safetensors_meta: no metadata key '%s'", key);
}
