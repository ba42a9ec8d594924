/* `lowp bench cast`: bulk-conversion throughput of lowp_cast beside memcpy.
 *
 * Measures F32 -> E4M3 and BF16 -> E4M3 (satfinite, RNE) on arrays well beyond the caches,
 * on 1 and 2 threads, as GB/s of (bytes read + bytes written). Each kernel is compared with a
 * memcpy that moves the same number of bytes counted the same way (a memcpy of B bytes reads
 * B and writes B), timed in the same run: kernel and memcpy repetitions are interleaved and
 * the median is reported, because the machines this runs on are shared and noisy.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cli.h"
#include "lowp/lowp.h"

#define DEFAULT_ELEMS ((size_t) 32 << 20) /* 128 MiB of F32 input: 4x a 32 MiB L3 */
#define DEFAULT_REPS  21

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: lowp bench cast [--json] [--size N] [--reps N]\n"
        "                       [--path auto|reference|avx512|avx2]\n"
        "  --size N     elements per array (default 32M); suffixes k, M, G (x1024); a trailing\n"
        "               B (\"256MB\", \"1GiB\") gives the size of the F32 input in bytes\n"
        "  --reps N     timed repetitions per kernel, interleaved with memcpy (default %d)\n"
        "  --path P     the kernel path to measure (default auto)\n"
        "  --json       one JSON object per line instead of the table\n"
        "Bandwidth is (bytes read + bytes written) / median time, on 1 and 2 threads; each\n"
        "kernel is compared with a memcpy moving the same number of bytes.\n",
        DEFAULT_REPS);
}

typedef struct run_result {
    const char *kernel;
    int threads;
    size_t bytes; /* read + written per run */
    double seconds;
    double gbps;
} run_result;

/* One lowp_cast of n elements; returns 0 or prints the error. */
static int cast_once(lowp_format sf, const void *src, void *dst, size_t n,
                     const lowp_cast_cfg *cfg) {
    lowp_tensor s = {sf, 1, (int64_t) n, (void *) src, LOWP_DEVICE_HOST};
    lowp_tensor d = {LOWP_FORMAT_E4M3, 1, (int64_t) n, dst, LOWP_DEVICE_HOST};
    lowp_status st = lowp_cast(&s, &d, cfg);
    if (st != LOWP_OK) {
        fprintf(stderr, "lowp bench cast: lowp_cast failed: %s: %s\n", lowp_status_str(st),
                lowp_last_error());
        return -1;
    }
    return 0;
}

static void emit_json(const run_result *r, size_t elems, int reps, const char *path,
                      double memcpy_gbps) {
    lowp_bench_json j;
    lowp_bench_json_begin(&j);
    lowp_bench_json_str(&j, "bench", "cast");
    lowp_bench_json_str(&j, "kernel", r->kernel);
    lowp_bench_json_int(&j, "threads", r->threads);
    lowp_bench_json_int(&j, "elems", (long long) elems);
    lowp_bench_json_int(&j, "bytes", (long long) r->bytes);
    lowp_bench_json_int(&j, "reps", reps);
    lowp_bench_json_num(&j, "seconds", r->seconds);
    lowp_bench_json_num(&j, "gbps", r->gbps);
    if (memcpy_gbps > 0) {
        lowp_bench_json_str(&j, "path", path);
        lowp_bench_json_num(&j, "ratio_to_memcpy", r->gbps / memcpy_gbps);
    }
    lowp_bench_json_end(&j, stdout);
}

typedef struct cast_opts {
    int json, reps;
    size_t elems;
    lowp_kernel_path path;
} cast_opts;

/* The options; returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, cast_opts *o) {
    int json = 0, reps = DEFAULT_REPS;
    size_t elems = DEFAULT_ELEMS;
    lowp_kernel_path path = LOWP_KERNEL_PATH_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--size") == 0 || strcmp(a, "--reps") == 0 ||
                   strcmp(a, "--path") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "lowp bench cast: %s needs a value (see --help)\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (strcmp(a, "--size") == 0) {
                size_t s;
                int bytes;
                if (lowp_bench_parse_size(v, &s, &bytes) != 0 || (bytes ? s / 4 : s) < 1 ||
                    (bytes ? s / 4 : s) > ((size_t) 1 << 34)) {
                    fprintf(stderr,
                            "lowp bench cast: --size '%s' is not a size between 1 element and "
                            "16G elements (e.g. 1000000, 64M, 256MiB)\n",
                            v);
                    return 2;
                }
                elems = bytes ? s / 4 : s;
            } else if (strcmp(a, "--reps") == 0) {
                if (lowp_bench_parse_int(v, &reps) != 0 || reps > 100000) {
                    fprintf(stderr, "lowp bench cast: --reps '%s' is not an integer in 1..100000\n",
                            v);
                    return 2;
                }
            } else if (lowp_bench_parse_path(v, &path) != 0) {
                fprintf(stderr,
                        "lowp bench cast: --path '%s' is not one of auto, reference, avx512\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "lowp bench cast: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }

    *o = (cast_opts){json, reps, elems, path};
    return -1;
}

/* Inputs: x spread over E4M3's range and a little beyond (some saturate, some are subnormal;
 * the kernels are branch-free, so the mix only matters for realism), xb = x in BF16. */
static int fill_inputs(float *x, uint16_t *xb, size_t elems) {
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < elems; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float) ((int32_t) (s >> 32)) * (1.0f / 4194304.0f); /* about +-512 */
    }
    lowp_tensor s32 = {LOWP_FORMAT_F32, 1, (int64_t) elems, x, LOWP_DEVICE_HOST};
    lowp_tensor s16 = {LOWP_FORMAT_BF16, 1, (int64_t) elems, xb, LOWP_DEVICE_HOST};
    lowp_status st = lowp_cast(&s32, &s16, NULL);
    if (st != LOWP_OK) {
        fprintf(stderr, "lowp bench cast: lowp_cast to bf16 failed: %s: %s\n", lowp_status_str(st),
                lowp_last_error());
        return -1;
    }
    return 0;
}

/* Buffers of one run. F32 kernel: reads 4n, writes n. BF16 kernel: reads 2n, writes n. The
 * memcpy baselines copy half of that each (B read + B written). */
typedef struct cast_bufs {
    size_t elems, f32_rw, bf16_rw;
    float *x;
    uint16_t *xb;
    uint8_t *q, *mdst;
    double *t; /* [4][reps] */
} cast_bufs;

/* On `threads` threads, reps rounds of memcpy / f32 cast / memcpy / bf16 cast, interleaved;
 * res[0..3] get their medians. */
static int measure(const cast_bufs *b, int reps, lowp_kernel_path path, int threads,
                   run_result res[4]) {
    lowp_cast_cfg cfg;
    lowp_cast_cfg_init(&cfg);
    cfg.path = path;
    cfg.threads = threads;
    double *t_mf = b->t, *t_f32 = b->t + reps, *t_mb = b->t + 2 * reps, *t_bf = b->t + 3 * reps;
    /* Warm-up: thread pools started, code and TLB entries hot. */
    if (cast_once(LOWP_FORMAT_F32, b->x, b->q, b->elems, &cfg) ||
        cast_once(LOWP_FORMAT_BF16, b->xb, b->q, b->elems, &cfg))
        return -1;
    lowp_bench_memcpy(b->mdst, b->x, b->f32_rw / 2, threads);
    for (int r = 0; r < reps; r++) {
        double t0 = lowp_bench_now();
        lowp_bench_memcpy(b->mdst, b->x, b->f32_rw / 2, threads);
        double t1 = lowp_bench_now();
        if (cast_once(LOWP_FORMAT_F32, b->x, b->q, b->elems, &cfg)) return -1;
        double t2 = lowp_bench_now();
        lowp_bench_memcpy(b->mdst, b->x, b->bf16_rw / 2, threads);
        double t3 = lowp_bench_now();
        if (cast_once(LOWP_FORMAT_BF16, b->xb, b->q, b->elems, &cfg)) return -1;
        double t4 = lowp_bench_now();
        t_mf[r] = t1 - t0;
        t_f32[r] = t2 - t1;
        t_mb[r] = t3 - t2;
        t_bf[r] = t4 - t3;
    }
    const char *names[4] = {"memcpy", "f32->e4m3", "memcpy", "bf16->e4m3"};
    double *times[4] = {t_mf, t_f32, t_mb, t_bf};
    size_t bytes[4] = {b->f32_rw / 2 * 2, b->f32_rw, b->bf16_rw / 2 * 2, b->bf16_rw};
    for (int k = 0; k < 4; k++) {
        double med = lowp_bench_median(times[k], (size_t) reps);
        res[k] = (run_result){names[k], threads, bytes[k], med,
                              med > 0 ? (double) bytes[k] / med / 1e9 : 0};
    }
    return 0;
}

static void report(const cast_opts *o, run_result res[2][4]) {
    const char *path_name = lowp_bench_path_name(o->path);
    if (o->json) {
        for (int ti = 0; ti < 2; ti++)
            for (int k = 0; k < 4; k++)
                emit_json(&res[ti][k], o->elems, o->reps, path_name,
                          k % 2 ? res[ti][k - 1].gbps : 0.0);
        return;
    }
    printf("lowp bench cast: %zu elements (%.1f MiB of f32), satfinite RNE, path %s, pages %s "
           "(from 4 MiB),\n"
           "median of %d repetitions interleaved with memcpy of the same byte count\n\n",
           o->elems, (double) o->elems * 4 / (1 << 20), path_name, lowp_bench_pages(), o->reps);
    printf("%-12s %7s %12s %10s %9s %10s\n", "kernel", "threads", "MB moved", "ms", "GB/s",
           "vs memcpy");
    for (int ti = 0; ti < 2; ti++)
        for (int k = 0; k < 4; k++) {
            const run_result *r = &res[ti][k];
            printf("%-12s %7d %12.1f %10.3f %9.2f", r->kernel, r->threads, (double) r->bytes / 1e6,
                   r->seconds * 1e3, r->gbps);
            if (k % 2) printf(" %10.2f", r->gbps / res[ti][k - 1].gbps);
            printf("\n");
        }
}

int lowp_bench_cast(int argc, char **argv) {
    cast_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    const size_t elems = o.elems;
    cast_bufs b = {elems, 5 * elems, 3 * elems, NULL, NULL, NULL, NULL, NULL};
    b.x = lowp_bench_alloc(4 * elems);
    b.xb = lowp_bench_alloc(2 * elems);
    b.q = lowp_bench_alloc(elems);
    b.mdst = lowp_bench_alloc(b.f32_rw / 2 + 64);
    b.t = malloc(sizeof(double) * (size_t) o.reps * 4);
    int status = 1;
    if (!b.x || !b.xb || !b.q || !b.mdst || !b.t) {
        fprintf(stderr, "lowp bench cast: out of memory for %zu elements (%.0f MiB)\n", elems,
                (double) (4 * elems + 2 * elems + elems + b.f32_rw / 2) / (1 << 20));
        goto out;
    }
    if (fill_inputs(b.x, b.xb, elems)) goto out;
    run_result res[2][4];
    for (int ti = 0; ti < 2; ti++)
        if (measure(&b, o.reps, o.path, ti + 1, res[ti])) goto out;
    report(&o, res);
    status = 0;
out:
    free(b.t);
    lowp_bench_free(b.x);
    lowp_bench_free(b.xb);
    lowp_bench_free(b.q);
    lowp_bench_free(b.mdst);
    return status;
}
