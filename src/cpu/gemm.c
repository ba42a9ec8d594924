/* CPU GEMM dispatcher: turns lowp_gemm, split-M and split-K grouped GEMMs into jobs over row
 * ranges, picks the kernel (AMX, AVX-512, AVX2 or the reference) and runs the jobs on the threads,
 * each with its own bounded workspace. Arguments were validated by src/ops/gemm.c. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "gemm_kernels.h"

typedef void (*gemm_kernel)(const lowp_gemm_job *);

static gemm_kernel pick(const lowp_gemm_job *j, lowp_kernel_path path, lowp_status *st) {
    lowp_cpu_kernel which;
    *st =
        lowp_cpu_pick_kernel("lowp_gemm", path, lowp_cpu_gemm_avx512_supports(j),
                             lowp_cpu_gemm_amx_supports(j), lowp_cpu_gemm_avx2_supports(j), &which);
    if (*st != LOWP_OK) return NULL;
    return which == LOWP_CPU_KERNEL_AMX      ? lowp_cpu_gemm_amx
           : which == LOWP_CPU_KERNEL_AVX512 ? lowp_cpu_gemm_avx512
           : which == LOWP_CPU_KERNEL_AVX2   ? lowp_cpu_gemm_avx2
                                             : lowp_cpu_gemm_ref;
}

static size_t ws_floats(gemm_kernel k, const lowp_gemm_job *j) {
    size_t n = lowp_gemm_ref_ws_floats(j);
    if (k == lowp_cpu_gemm_amx) {
        size_t m = lowp_cpu_gemm_amx_ws_floats(j);
        if (m > n) n = m;
    } else if (k == lowp_cpu_gemm_avx512) {
        size_t m = lowp_cpu_gemm_avx512_ws_floats(j);
        if (m > n) n = m;
    } else if (k == lowp_cpu_gemm_avx2) {
        size_t m = lowp_cpu_gemm_avx2_ws_floats(j);
        if (m > n) n = m;
    }
    return n;
}

#define LOWP_MAX_PIECES 256

/* A job's multiply-adds. */
static int64_t job_macs(const lowp_gemm_job *j) {
    const int64_t k = j->k1 - j->k0 > 0 ? j->k1 - j->k0 : 1;
    return (j->m1 - j->m0) * (j->n1 - j->n0) * k;
}

/* Run `count` jobs (each already complete but for its workspace) on up to `threads` threads. */
static lowp_status run_jobs(lowp_gemm_job *jobs, int64_t count, gemm_kernel kernel, int threads) {
    if (count <= 0) return LOWP_OK;
    if (threads > count) threads = (int) count;
    size_t per = 0;
    for (int64_t i = 0; i < count; i++) {
        size_t w = ws_floats(kernel, &jobs[i]);
        if (w > per) per = w;
    }
    per = (per + 15) & ~(size_t) 15; /* keep every thread's workspace 64-byte aligned */
    float *ws = NULL;
    lowp_gemm_pack_tag one = {0}; /* one thread's tag needs no allocation */
    lowp_gemm_pack_tag *tags = threads > 1 ? calloc((size_t) threads, sizeof *tags) : &one;
    const size_t ws_bytes = per * sizeof(float) * (size_t) threads;
    if (per) ws = lowp_host_alloc(ws_bytes); /* released into the cache of such blocks */
    if ((per && !ws) || !tags) {
        lowp_host_free(ws);
        if (tags != &one) free(tags);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_gemm: workspace of %zu bytes", ws_bytes);
    }
    if (threads <= 1) {
        /* No OpenMP region at all: even a serialized one costs a team setup, and the attention
         * core runs thousands of one-thread GEMMs an update from inside its own region. */
        for (int64_t i = 0; i < count; i++) {
            lowp_gemm_job j = jobs[i];
            j.ws = ws;
            j.tag = &one;
            kernel(&j);
        }
        lowp_host_free(ws);
        return LOWP_OK;
    }
    /* Largest pieces first (their multiply-adds; ties keep their order): with dynamic
     * scheduling the last pieces taken are the small ones, so the threads finish closer
     * together (the groups of a grouped GEMM differ by their token counts). Each piece writes
     * its own part of C, so the order changes no result. */
    int16_t order[LOWP_MAX_PIECES];
    const int sorted = count <= LOWP_MAX_PIECES;
    if (sorted) {
        for (int64_t i = 0; i < count; i++) {
            const int64_t w = job_macs(&jobs[i]);
            int64_t p = i;
            while (p > 0 && job_macs(&jobs[order[p - 1]]) < w) {
                order[p] = order[p - 1];
                p--;
            }
            order[p] = (int16_t) i;
        }
    }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t i = 0; i < count; i++) {
        lowp_gemm_job j = jobs[sorted ? order[i] : i];
        const int t = omp_get_thread_num();
        j.ws = ws ? ws + per * (size_t) t : NULL;
        j.tag = &tags[t];
        kernel(&j);
    }
    lowp_host_free(ws);
    free(tags);
    return LOWP_OK;
}

/* Below about 4M multiply-adds a second thread costs more (waking it, splitting the packing)
 * than it saves; training a small model runs thousands of such GEMMs. */
#define LOWP_GEMM_MIN_PARALLEL_MACS (INT64_C(1) << 22)
static int threads_for(int32_t want, int64_t m, int64_t n, int64_t k) {
    if (m * n * (k > 0 ? k : 1) < LOWP_GEMM_MIN_PARALLEL_MACS) return 1;
    return lowp_cpu_threads(want, 0);
}

/* Split a job's m range (or n range when m is short) into about 2 pieces per thread, fewer
 * when `share` jobs (the groups of a grouped GEMM) run on the same threads, and pieces of at
 * least MIN_PIECE rows or columns (but `threads` pieces for a single job, where it has as many
 * tiles). The fast kernels pack all of the job's B and decode its A once per block of B
 * columns: pieces along m pack B once each, pieces along n decode A once each, so a 64-row
 * piece spends about as long packing B as multiplying (4 pieces per thread ran an MoE
 * layer's GEMMs at 250-370 GFLOP/s on 2 Zen 4 cores, these pieces at 375-400). They split n
 * when M < N (pieces of 64 columns or more), or when the pieces are 256 columns or more. */
#define PIECES_PER_THREAD 2
#define MIN_PIECE         512
static int64_t split(const lowp_gemm_job *j, int threads, gemm_kernel k, lowp_gemm_job *out,
                     int64_t cap, int64_t share) {
    const int64_t M = j->m1 - j->m0, N = j->n1 - j->n0;
    int64_t want = threads > 1 ? ((int64_t) threads * PIECES_PER_THREAD + share - 1) / share : 1;
    if (threads > 1 && k != lowp_cpu_gemm_ref) {
        const int64_t most = (M >= N ? M : N) / MIN_PIECE, tiles = ((M >= N ? M : N) + 31) / 32;
        if (want > most) want = most;
        if (share == 1 && want < threads) want = threads < tiles ? threads : tiles;
        if (want < 1) want = 1;
    }
    if (want > cap) want = cap;
    const int fast_by_n = k != lowp_cpu_gemm_ref && N >= want * (M < N ? 64 : 256);
    const int by_m = !fast_by_n && (M >= N || M >= want * 32);
    const int64_t len = by_m ? M : N;
    int64_t step = (len + want - 1) / want;
    step = (step + 31) / 32 * 32; /* whole 32-row tiles for the fast kernels */
    if (step < 32) step = 32;
    int64_t n = 0;
    for (int64_t s = 0; s < len; s += step) {
        out[n] = *j;
        int64_t e = s + step < len ? s + step : len;
        if (by_m)
            out[n].m0 = j->m0 + s, out[n].m1 = j->m0 + e;
        else
            out[n].n0 = j->n0 + s, out[n].n1 = j->n0 + e;
        n++;
    }
    return n;
}

static lowp_status base_job(lowp_gemm_job *j, const lowp_qtensor *a, const lowp_qtensor *b,
                            int b_kn, lowp_tensor *c, const lowp_gemm_cfg *cfg) {
    memset(j, 0, sizeof *j);
    j->a = a;
    j->b = b;
    j->b_kn = b_kn;
    j->c = c;
    j->accumulate = cfg->accumulate;
    return lowp_gemm_classify("lowp_gemm", a, b, &j->pair, &j->bk);
}

lowp_status lowp_cpu_gemm(const lowp_qtensor *a, const lowp_qtensor *b, int b_kn, lowp_tensor *c,
                          const lowp_gemm_cfg *cfg) {
    lowp_gemm_job j;
    lowp_status st = base_job(&j, a, b, b_kn, c, cfg);
    if (st != LOWP_OK) return st;
    j.m1 = a->rows;
    j.n1 = b_kn ? b->cols : b->rows;
    j.k1 = a->cols;
    gemm_kernel k = pick(&j, cfg->path, &st);
    if (!k) return st;
    const int threads = threads_for(cfg->threads, j.m1, j.n1, j.k1);
    lowp_gemm_job pieces[LOWP_MAX_PIECES];
    return run_jobs(pieces, split(&j, threads, k, pieces, LOWP_MAX_PIECES, 1), k, threads);
}

lowp_status lowp_cpu_gemm_part(const lowp_qtensor *a, const lowp_qtensor *b, int b_kn,
                               lowp_tensor *c, int64_t m, int64_t n0, int64_t n1, int64_t k0,
                               int64_t k1) {
    lowp_gemm_cfg cfg; /* the defaults: overwrite C, the fastest kernel */
    memset(&cfg, 0, sizeof cfg);
    cfg.path = LOWP_KERNEL_PATH_AUTO;
    lowp_gemm_job j;
    lowp_status st = base_job(&j, a, b, b_kn, c, &cfg);
    if (st != LOWP_OK) return st;
    j.m1 = m;
    j.n0 = n0, j.n1 = n1;
    j.k0 = k0, j.k1 = k1;
    gemm_kernel k = pick(&j, cfg.path, &st);
    if (!k) return st;
    return run_jobs(&j, 1, k, 1);
}

/* The groups' pieces are queued and run together, one parallel region (and barrier) per
 * LOWP_MAX_PIECES pieces of the same kernel rather than one per group: a barrier per group
 * costs little cores, but a lot when another process takes one of them for a while. */
typedef struct job_queue {
    lowp_gemm_job pieces[LOWP_MAX_PIECES];
    int64_t count;
    gemm_kernel kernel;
    int threads;
    int64_t share; /* jobs (groups) that share the threads */
} job_queue;

static lowp_status queue_flush(job_queue *q) {
    lowp_status st = run_jobs(q->pieces, q->count, q->kernel, q->threads);
    q->count = 0;
    return st;
}

static lowp_status queue_add(job_queue *q, const lowp_gemm_job *j, gemm_kernel k) {
    const int64_t need = q->threads > 1 ? (int64_t) q->threads * PIECES_PER_THREAD : 1;
    if (q->count > 0 && (k != q->kernel || q->count + need > LOWP_MAX_PIECES)) {
        lowp_status st = queue_flush(q);
        if (st != LOWP_OK) return st;
    }
    q->kernel = k;
    q->count += split(j, q->threads, k, q->pieces + q->count, LOWP_MAX_PIECES - q->count, q->share);
    return LOWP_OK;
}

lowp_status lowp_cpu_grouped_gemm(const lowp_qtensor *a, const lowp_qtensor *b, int b_kn,
                                  const int32_t *offs, int32_t groups, lowp_tensor *c,
                                  const lowp_gemm_cfg *cfg) {
    const int64_t N = b_kn ? b[0].cols : b[0].rows;
    job_queue q;
    q.count = 0;
    q.kernel = NULL;
    /* The whole grouped GEMM's work decides whether it is worth a second thread. */
    q.threads = threads_for(cfg->threads, offs[groups - 1], N, a->cols);
    q.share = groups;
    int64_t start = 0;
    for (int32_t g = 0; g < groups; g++) {
        const int64_t end = offs[g];
        if (end > start) {
            lowp_gemm_job j;
            lowp_status st = base_job(&j, a, &b[g], b_kn, c, cfg);
            if (st != LOWP_OK) return st;
            j.m0 = start;
            j.m1 = end;
            j.n1 = N;
            j.k1 = a->cols;
            gemm_kernel k = pick(&j, cfg->path, &st);
            if (!k) return st;
            if ((st = queue_add(&q, &j, k)) != LOWP_OK) return st;
        }
        start = end;
    }
    return queue_flush(&q);
}

lowp_status lowp_cpu_grouped_gemm_wgrad(const lowp_qtensor *a, const lowp_qtensor *b, int b_kn,
                                        const int32_t *offs, int32_t groups, lowp_tensor *c,
                                        const lowp_gemm_cfg *cfg) {
    job_queue q;
    q.count = 0;
    q.kernel = NULL;
    const int64_t K = b_kn ? b->cols : b->rows; /* b: X^T [K, M], or X [M, K] as stored */
    q.threads = threads_for(cfg->threads, a->rows * groups, K, offs[groups - 1] / groups);
    q.share = groups;
    int64_t start = 0, blk = 0;
    for (int32_t g = 0; g < groups; g++) {
        const int64_t end = offs[g];
        lowp_gemm_job j;
        lowp_status st = base_job(&j, a, b, b_kn, c, cfg);
        if (st != LOWP_OK) return st;
        j.m1 = a->rows;
        j.n1 = K;
        j.k0 = start;
        j.k1 = end;
        j.a_blk = blk;
        j.b_blk = blk;
        j.c_row_base = (int64_t) g * a->rows;
        gemm_kernel k = pick(&j, cfg->path, &st);
        if (!k) return st;
        if ((st = queue_add(&q, &j, k)) != LOWP_OK) return st;
        if (j.bk > 0) blk += (end - start + j.bk - 1) / j.bk;
        start = end;
    }
    return queue_flush(&q);
}
