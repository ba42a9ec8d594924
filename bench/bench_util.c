/* Shared helpers of the `lowp bench ...` benchmarks (see bench_util.h). */
#include "bench_util.h"
#include "lowp/cpu_path.h"
#include "lowp/device.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double lowp_bench_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

double lowp_bench_median(double *v, size_t n) {
    if (n == 0) return 0.0;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int lowp_bench_parse_size(const char *s, size_t *value, int *is_bytes) {
    if (!s || !*s || *s == '-' || *s == '+') return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno == ERANGE) return -1;
    unsigned long long mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1ull << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1ull << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1ull << 30;
        end++;
        break;
    default: break;
    }
    int bytes = 0;
    if (strcmp(end, "B") == 0 || strcmp(end, "iB") == 0)
        bytes = 1;
    else if (*end != '\0')
        return -1;
    if (mul > 1 && v > ULLONG_MAX / mul) return -1;
    if (v * mul > SIZE_MAX) return -1;
    *value = (size_t) (v * mul);
    if (is_bytes) *is_bytes = bytes;
    return 0;
}

int lowp_bench_parse_int(const char *s, int *out) {
    if (!s || !*s) return -1;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || errno == ERANGE || v <= 0 || v > INT_MAX) return -1;
    *out = (int) v;
    return 0;
}

void *lowp_bench_alloc(size_t bytes) {
    /* The library's own host memory (huge pages from 4 MiB up, as its models and trainer get):
     * the kernels, and the memcpy and GEMM they are compared with, see the same pages. */
    void *p = NULL;
    if (lowp_malloc(LOWP_DEVICE_HOST, bytes, &p) != LOWP_OK) return NULL;
    /* Map every page now: a first touch inside a timed region would measure the kernel's
     * page-fault path, not the memory. */
    memset(p, 0, bytes);
    return p;
}

void lowp_bench_free(void *p) {
    lowp_free(LOWP_DEVICE_HOST, p);
}

const char *lowp_bench_pages(void) {
    const char *env = getenv("LOWP_HUGEPAGES");
    if (env && strcmp(env, "0") == 0) return "4K";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return "4K";
    char line[256] = {0};
    const int on = fgets(line, sizeof line, f) != NULL && strstr(line, "[never]") == NULL;
    fclose(f);
    return on ? "2M" : "4K";
}

void lowp_bench_memcpy(void *dst, const void *src, size_t bytes, int threads) {
    if (threads <= 1) {
        memcpy(dst, src, bytes);
        return;
    }
    /* Contiguous parts on 64-byte boundaries, like the cast dispatcher's chunks. */
    size_t per = (bytes / (size_t) threads + 63) & ~(size_t) 63;
#pragma omp parallel num_threads(threads)
    {
        size_t t = (size_t) omp_get_thread_num();
        size_t lo = t * per < bytes ? t * per : bytes;
        size_t hi = lo + per < bytes ? lo + per : bytes;
        if (t == (size_t) omp_get_num_threads() - 1) hi = bytes;
        memcpy((char *) dst + lo, (const char *) src + lo, hi - lo);
    }
}

/* Appends printf-style text if it fits; returns 0 if it did not (the line stays valid). */
static int json_put(lowp_bench_json *j, const char *text) {
    size_t n = strlen(text);
    if (j->len + n + 2 >= sizeof j->buf) return 0; /* room for the closing "}" */
    memcpy(j->buf + j->len, text, n + 1);
    j->len += n;
    return 1;
}

/* A JSON string literal of s into out (control characters, quotes and backslashes escaped). */
static void json_quote(const char *s, char *out, size_t cap) {
    size_t k = 0;
    if (cap < 3) return;
    out[k++] = '"';
    for (; *s && k + 8 < cap; s++) {
        unsigned char c = (unsigned char) *s;
        if (c == '"' || c == '\\') {
            out[k++] = '\\';
            out[k++] = (char) c;
        } else if (c < 0x20) {
            k += (size_t) snprintf(out + k, cap - k, "\\u%04x", c);
        } else {
            out[k++] = (char) c;
        }
    }
    out[k++] = '"';
    out[k] = '\0';
}

static void json_field(lowp_bench_json *j, const char *key, const char *value_text) {
    char qk[256], text[600];
    json_quote(key, qk, sizeof qk);
    snprintf(text, sizeof text, "%s%s: %s", j->fields ? ", " : "", qk, value_text);
    if (json_put(j, text)) j->fields++;
}

void lowp_bench_json_begin(lowp_bench_json *j) {
    j->len = 0;
    j->fields = 0;
    j->buf[0] = '\0';
    json_put(j, "{");
}

void lowp_bench_json_str(lowp_bench_json *j, const char *key, const char *value) {
    char qv[300];
    json_quote(value ? value : "", qv, sizeof qv);
    json_field(j, key, qv);
}

void lowp_bench_json_num(lowp_bench_json *j, const char *key, double value) {
    char t[64];
    if (isfinite(value))
        snprintf(t, sizeof t, "%.6g", value);
    else
        snprintf(t, sizeof t, "null"); /* JSON has no NaN or Inf */
    json_field(j, key, t);
}

void lowp_bench_json_int(lowp_bench_json *j, const char *key, long long value) {
    char t[32];
    snprintf(t, sizeof t, "%lld", value);
    json_field(j, key, t);
}

void lowp_bench_json_end(lowp_bench_json *j, FILE *out) {
    fprintf(out, "%s}\n", j->buf);
}

int lowp_bench_parse_path(const char *v, lowp_kernel_path *out) {
    if (strcmp(v, "auto") == 0)
        *out = LOWP_PATH_AUTO;
    else if (strcmp(v, "reference") == 0)
        *out = LOWP_PATH_REFERENCE;
    else if (strcmp(v, "avx512") == 0)
        *out = LOWP_PATH_AVX512;
    else if (strcmp(v, "avx2") == 0)
        *out = LOWP_KERNEL_PATH_AVX2;
    else
        return -1;
    return 0;
}

const char *lowp_bench_path_name(lowp_kernel_path path) {
    if (path == LOWP_PATH_REFERENCE) return "reference";
    if (path == LOWP_PATH_AVX512) return "avx512";
    if (path == LOWP_KERNEL_PATH_AVX2) return "avx2";
    const uint32_t need =
        LOWP_CAP_AVX512F | LOWP_CAP_AVX512BW | LOWP_CAP_AVX512VL | LOWP_CAP_AVX512DQ;
    lowp_caps caps;
    memset(&caps, 0, sizeof caps);
    lowp_device_caps(LOWP_DEVICE_HOST, &caps);
    return (caps.flags & need) == need ? "auto:avx512" : "auto:reference";
}
