/* Shared helpers of the `lowp bench ...` benchmarks: a monotonic clock, medians, sizes with
 * suffixes on the command line, page-touched aligned buffers, a multi-threaded memcpy
 * baseline, and one-object-per-line JSON output. Benchmarks report bandwidth as
 * (bytes read + bytes written) / time, and compare with memcpy counted the same way. */
#ifndef LOWP_BENCH_UTIL_H
#define LOWP_BENCH_UTIL_H

#include <stddef.h>

#include "lowp/cast.h"
#include <stdio.h>

/* Seconds on a monotonic clock. */
double lowp_bench_now(void);

/* Median of v[0..n-1] (sorts v in place); 0 for n == 0. */
double lowp_bench_median(double *v, size_t n);

/* Parses a count with an optional binary suffix k/K, m/M, g/G (x1024^1..3) and an optional
 * trailing 'B' or "iB" that marks a byte count: "1000", "64M", "256MiB", "1GB".
 * Returns 0 on success, -1 if s is not such a number or overflows. */
int lowp_bench_parse_size(const char *s, size_t *value, int *is_bytes);

/* Parses a positive int ("25"); returns 0 on success, -1 otherwise. */
int lowp_bench_parse_int(const char *s, int *out);

/* A 64-byte aligned buffer from lowp_malloc on the host (so on huge pages from 4 MiB up, like
 * the library's own buffers), its pages already mapped (written once), so that page faults
 * are not timed. NULL if out of memory; release with lowp_bench_free. */
void *lowp_bench_alloc(size_t bytes);
void lowp_bench_free(void *p);

/* The pages lowp_bench_alloc's large buffers get: "2M" (transparent huge pages, advised), "4K"
 * (LOWP_HUGEPAGES=0, or no transparent huge pages on this system), for the reports. */
const char *lowp_bench_pages(void);

/* memcpy of `bytes` split into `threads` contiguous parts copied by OpenMP threads. */
void lowp_bench_memcpy(void *dst, const void *src, size_t bytes, int threads);

/* One JSON object on one line:
 *   lowp_bench_json j;
 *   lowp_bench_json_begin(&j);
 *   lowp_bench_json_str(&j, "kernel", "memcpy");
 *   lowp_bench_json_num(&j, "gbps", 21.5);
 *   lowp_bench_json_end(&j, stdout);        // {"kernel": "memcpy", "gbps": 21.5}
 * Keys and string values are escaped; a line longer than the buffer is cut at a field. */
typedef struct lowp_bench_json {
    char buf[1024];
    size_t len;
    int fields;
} lowp_bench_json;

void lowp_bench_json_begin(lowp_bench_json *j);
void lowp_bench_json_str(lowp_bench_json *j, const char *key, const char *value);
void lowp_bench_json_num(lowp_bench_json *j, const char *key, double value);
void lowp_bench_json_int(lowp_bench_json *j, const char *key, long long value);
void lowp_bench_json_end(lowp_bench_json *j, FILE *out);

/* --path auto|reference|avx512|avx2: 0 on success. */
int lowp_bench_parse_path(const char *v, lowp_kernel_path *out);
/* The kernel path a cast or quantize with `path` runs, for the record: AUTO resolves as the
 * CPU dispatchers do (AVX-512 F/BW/VL/DQ present -> "auto:avx512"). */
const char *lowp_bench_path_name(lowp_kernel_path path);

#endif
