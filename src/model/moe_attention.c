/* The attention half of a decoder layer, forward and backward side by side:
 *
 *   h = attn_norm(x)                       RMSNorm (lowp_rmsnorm_*, autocast applies)
 *   q, k, v = h Wq^T, h Wk^T, h Wv^T        lowp linears (recipes apply by name)
 *   q, k = rope(q), rope(k)                 rotary positions, pairs (2i, 2i+1) of each head
 *   o[t] = sum_{j<=t} softmax_j(q[t] . k[j] / sqrt(hd)) v[j]     per head, binary32
 *   y = o Wo^T
 *
 * The attention core runs per (sequence, head) task on lowp_gemm's binary32 GEMMs, one thread
 * per task: each task owns its rows and head columns of every output and gradient, so no sum
 * depends on the thread count. The softmax probabilities are kept ([B, nh, T, T]) for the
 * backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/profile_internal.h"
#include "cpu/host.h"
#include "model_internal.h"

/* Rotates each pair (2i, 2i+1) of every head of row n by the angle t * theta^(-2i / hd), where
 * t = n % T is the position in the sequence; sign -1 rotates by minus the angle, which is the
 * transpose of the rotation and so its backward. cosv, sinv: [seq_len, hd / 2]. */
static void rope_rotate(float *x, const moe_dims *d, const float *cosv, const float *sinv,
                        float sign, int nthreads) {
    const int64_t half = d->hd / 2;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (d->N * d->D >= MOE_PARALLEL_MIN)
    for (int64_t n = 0; n < d->N; n++) {
        const float *c = cosv + (n % d->T) * half;
        const float *s = sinv + (n % d->T) * half;
        for (int64_t h = 0; h < d->nh; h++) {
            float *p = x + n * d->D + h * d->hd;
            for (int64_t i = 0; i < half; i++) {
                const float a = p[2 * i], b = p[2 * i + 1], sn = sign * s[i];
                p[2 * i] = a * c[i] - b * sn;
                p[2 * i + 1] = a * sn + b * c[i];
            }
        }
    }
}

/* The attention core runs per task (sequence b, head h) on the binary32 GEMM kernels, one
 * thread per task, so no sum depends on the thread count. The left operands are read where
 * they lie: the head's columns of q and dO in the [N, D] activations (row stride D), and the
 * scores and probabilities of a task, a contiguous [T, T] block of att. The right operands (the
 * head's K, V, Q, dO) are packed once per task into the SGEMM's panels (att_op) where the
 * AVX-512 kernels run, and read as they lie by lowp_cpu_gemm_part elsewhere; the outputs go
 * straight to the head's columns of o, dq, dk, dv. The products run by blocks of query rows
 * (S, O, dP, dQ) or of keys (dK, dV) over the part of the square that the causal mask leaves
 * nonzero (att_block). */

/* c (i, n) = c[i * ldc + n] for i < m, n in [n0, n1): the sum over kk in [k0, k1) of
 * a[i * lda + kk] times b[n * ldb + kk] (kn: b[kk * ldb + n]); b has brows rows. One thread,
 * binary32. */
static lowp_status mm_part(const float *a, int64_t lda, int64_t m, const float *b, int64_t ldb,
                           int64_t brows, int kn, int64_t n0, int64_t n1, int64_t k0, int64_t k1,
                           float *c, int64_t ldc) {
    lowp_qtensor qa = {0}, qb = {0};
    qa.format = qb.format = LOWP_FORMAT_F32;
    qa.scaling = qb.scaling = LOWP_SCALING_NONE;
    qa.device = qb.device = LOWP_DEVICE_HOST;
    qa.rows = m, qa.cols = lda, qa.data = (void *) a;
    qb.rows = brows, qb.cols = ldb, qb.data = (void *) b;
    lowp_tensor ct = moe_tensor(c, m, ldc);
    return lowp_cpu_gemm_part(&qa, &qb, kn, &ct, m, n0, n1, k0, k1);
}

/* The right operand of a task's products, one head of one sequence: b [n, k] (row stride ldb)
 * or, kn, [k, n]. Where the AVX-512 kernels run it is packed once per task (pk) and every
 * product of the task reads the panels (lowp_cpu_sgp_mul, the same bits as lowp_cpu_gemm_part);
 * packing it again for each block of rows took a third of the attention core's GEMM time. */
typedef struct att_op {
    const float *b;
    int64_t ldb, n, k;
    int kn;
    float *pk; /* NULL: lowp_cpu_gemm_part on b as it lies */
} att_op;

static void op_set(att_op *o, const float *b, int64_t ldb, int kn, int64_t n, int64_t k,
                   float *pk) {
    o->b = b, o->ldb = ldb, o->n = n, o->k = k, o->kn = kn, o->pk = pk;
    if (pk) lowp_cpu_sgp_pack(b, ldb, kn, n, k, pk);
}

/* c[i * ldc + n] for i < m, n < n1: the sum over kk in [k0, k1) of a[i * lda + kk - k0] times
 * the operand's (n, kk). One thread, binary32. */
static lowp_status op_mul(const float *a, int64_t lda, int64_t m, const att_op *o, int64_t n1,
                          int64_t k0, int64_t k1, float *c, int64_t ldc) {
    if (o->pk) {
        lowp_cpu_sgp_mul(a, lda, m, o->pk, o->n, o->k, n1, k0, k1, c, ldc);
        return LOWP_OK;
    }
    const float *b = o->kn ? o->b + k0 * o->ldb : o->b + k0;
    return mm_part(a, lda, m, b, o->ldb, o->kn ? o->k - k0 : o->n, o->kn, 0, n1, 0, k1 - k0, c,
                   ldc);
}

/* A thread's panels for `count` operands of [T, hd] (either orientation) in one buffer (*buf,
 * freed by the caller), or pk[i] = NULL where the products run on lowp_cpu_gemm_part. 0 when
 * memory ran out. */
static int op_buffers(const moe_dims *d, int count, float **buf, float **pk) {
    *buf = NULL;
    for (int i = 0; i < count; i++) pk[i] = NULL;
    if (!lowp_cpu_has_avx512()) return 1;
    const size_t a = lowp_cpu_sgp_floats(d->T, d->hd), b = lowp_cpu_sgp_floats(d->hd, d->T);
    const size_t each = ((a > b ? a : b) + 15) / 16 * 16; /* whole 64-byte lines */
    *buf = aligned_alloc(64, (size_t) count * each * sizeof(float));
    for (int i = 0; *buf && i < count; i++) pk[i] = *buf + (size_t) i * each;
    return *buf != NULL;
}

/* Query rows per block of the attention core: a block of rows [i0, i0 + r) multiplies only
 * the keys [0, i0 + r) it can see, so the score and value products of the causal triangle
 * cost about (1 + R / T) / 2 of the square's. A multiple of the SGEMM's 12-row strips; short
 * sequences stay one block (`nanogpt`, T = 64: 24-row blocks made its attention phase slower,
 * 24% -> 27% of an update). */
static int64_t att_block(int64_t T) {
    return T >= 192 ? 48 : T;
}

/* Row t of the scores s [T] -> causal softmax probabilities of s * scale (0 past t). */
static void softmax_row(float *s, int64_t T, int64_t t, float scale) {
    float mx = -INFINITY;
    for (int64_t j = 0; j <= t; j++) {
        s[j] *= scale;
        if (s[j] > mx) mx = s[j];
    }
    float sum = 0.0f;
    const lowp_cpu_vmath *vm = lowp_cpu_vmath_pick();
    if (vm) { /* the same steps, the exponentials 16 (AVX-512) or 8 at a time */
        for (int64_t j = 0; j <= t; j++) s[j] -= mx;
        vm->expf(s, t + 1);
        for (int64_t j = 0; j <= t; j++) sum += s[j];
    } else
        for (int64_t j = 0; j <= t; j++) {
            s[j] = expf(s[j] - mx);
            sum += s[j];
        }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j <= t; j++) s[j] *= inv;
    for (int64_t j = t + 1; j < T; j++) s[j] = 0.0f;
}

/* softmax_row of eight rows at once, rows s + i * ld of queries t0 + i (i < 8; row length
 * L): the running maxima and the sums of the eight rows side by side, each row's still
 * sequential in its own order (the same bits as softmax_row), so that the eight dependent
 * chains overlap instead of running one after another. */
static void softmax_rows8(const lowp_cpu_vmath *vm, float *s, int64_t ld, int64_t L, int64_t t0,
                          float scale) {
    float *row[8], mx[8], sum[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) row[i] = s + i * ld, mx[i] = -INFINITY, sum[i] = 0.0f;
    const int64_t common = t0 + 1; /* columns every row of the eight has */
    for (int64_t j = 0; j < common; j++) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const float v = row[i][j] * scale;
            row[i][j] = v;
            if (v > mx[i]) mx[i] = v;
        }
    }
    for (int i = 1; i < 8; i++)
        for (int64_t j = common; j <= t0 + i; j++) {
            row[i][j] *= scale;
            if (row[i][j] > mx[i]) mx[i] = row[i][j];
        }
    for (int i = 0; i < 8; i++) {
        for (int64_t j = 0; j <= t0 + i; j++) row[i][j] -= mx[i];
        vm->expf(row[i], t0 + i + 1);
    }
    for (int64_t j = 0; j < common; j++) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) sum[i] += row[i][j];
    }
    for (int i = 1; i < 8; i++)
        for (int64_t j = common; j <= t0 + i; j++) sum[i] += row[i][j];
    for (int i = 0; i < 8; i++) {
        const float inv = 1.0f / sum[i];
        for (int64_t j = 0; j <= t0 + i; j++) row[i][j] *= inv;
        for (int64_t j = t0 + i + 1; j < L; j++) row[i][j] = 0.0f;
    }
}

/* Rows [0, r) of a block of scores (row stride L), row t the query i0 + t: softmax_row of
 * each, eight at a time where the vector exponential runs. */
void moe_softmax_block(float *sb, int64_t r, int64_t L, int64_t i0, float scale) {
    int64_t t = 0;
    const lowp_cpu_vmath *vm = lowp_cpu_vmath_pick();
    if (vm)
        for (; t + 8 <= r; t += 8) softmax_rows8(vm, sb + t * L, L, L, i0 + t, scale);
    for (; t < r; t++) softmax_row(sb + t * L, L, i0 + t, scale);
}

/* dS rows of a block in place: row t (query i0 + t, P row pr = p + (i0 + t) * T, dP row rw =
 * db + t * L) becomes P * (dP - sum_j P[j] dP[j]) * scale on the visible keys, 0 past them.
 * Eight rows' sums run side by side, each sequential in j (the order of one row alone). */
void moe_ds_block(const float *p, int64_t T, float *db, int64_t r, int64_t L, int64_t i0,
                  float scale) {
    for (int64_t t0 = 0; t0 < r; t0 += 8) {
        const int n = r - t0 < 8 ? (int) (r - t0) : 8;
        const float *pr[8];
        float *rw[8], pdp[8];
        for (int i = 0; i < 8; i++) {
            const int ii = i < n ? i : 0; /* rows past the block repeat the first: unused */
            pr[i] = p + (i0 + t0 + ii) * T, rw[i] = db + (t0 + ii) * L, pdp[i] = 0.0f;
        }
        const int64_t common = i0 + t0 + 1;
        for (int64_t j = 0; j < common; j++) {
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) pdp[i] += pr[i][j] * rw[i][j];
        }
        for (int i = 1; i < n; i++)
            for (int64_t j = common; j <= i0 + t0 + i; j++) pdp[i] += pr[i][j] * rw[i][j];
        for (int i = 0; i < n; i++) {
            const int64_t end = i0 + t0 + i; /* the last visible key */
            for (int64_t j = 0; j <= end; j++) rw[i][j] = pr[i][j] * (rw[i][j] - pdp[i]) * scale;
            for (int64_t j = end + 1; j < L; j++) rw[i][j] = 0.0f;
        }
    }
}

/* The first failure of a parallel loop's tasks (the others are skipped). */
static void keep_first(lowp_status *all, lowp_status st) {
    if (st == LOWP_OK) return;
#pragma omp critical(moe_attention_status)
    if (*all == LOWP_OK) *all = st;
}

static int failed(const lowp_status *all) {
    lowp_status v;
#pragma omp atomic read
    v = *all;
    return v != LOWP_OK;
}

/* Causal attention. q, k, v, o: [N, D] with head h in columns [h * hd, (h + 1) * hd);
 * att: [B, nh, T, T]. Task (b, h) covers rows b * T .. b * T + T - 1 of head h:
 *   S = Q K^T (GEMM), P = softmax(S / sqrt(hd)) row by row (causal), O = P V (GEMM). */
lowp_status moe_attention_core_forward(const moe_dims *d, const float *q, const float *k,
                                       const float *v, float *att, float *o, int nthreads) {
    const int64_t T = d->T, D = d->D, hd = d->hd;
    const float scale = 1.0f / sqrtf((float) hd);
    const int64_t work = d->N * d->T * d->D; /* ~ twice the multiply-adds */
    lowp_status all = LOWP_OK;
#pragma omp parallel num_threads(nthreads) if (work >= MOE_PARALLEL_MIN)
    {
        const int64_t R = att_block(T);
        float *pbuf, *pk[2];
        if (!op_buffers(d, 2, &pbuf, pk))
            keep_first(&all, lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "attention: scratch"));
#pragma omp for schedule(static)
        for (int64_t task = 0; task < d->B * d->nh; task++) {
            if (failed(&all)) continue;
            const int64_t seq = (task / d->nh) * T * D + (task % d->nh) * hd; /* head's (0, 0) */
            float *p = att + task * T * T; /* [T, T]: the probabilities, 0 past the diagonal */
            att_op kh, vh;                 /* K [T keys, hd], V [T keys, hd] read as [k, n] */
            op_set(&kh, k + seq, D, 0, T, hd, pk[0]);
            op_set(&vh, v + seq, D, 1, hd, T, pk[1]);
            lowp_status st = LOWP_OK;
            for (int64_t i0 = 0; i0 < T && st == LOWP_OK; i0 += R) {
                /* rows [i0, i0 + r) see keys [0, L) */
                const int64_t r = T - i0 < R ? T - i0 : R, L = i0 + r;
                float *pb = p + i0 * T; /* the block's rows of P, in place of their scores */
                /* S = Q K^T over the head's columns */
                st = op_mul(q + seq + i0 * D, D, r, &kh, L, 0, hd, pb, T);
                if (st != LOWP_OK) break;
                moe_softmax_block(pb, r, T, i0, scale);
                /* O = P V, into the head's columns of o */
                st = op_mul(pb, T, r, &vh, hd, 0, L, o + seq + i0 * D, D);
            }
            keep_first(&all, st);
        }
        free(pbuf);
    }
    return all;
}

/* dst [cols, rows] (row stride rows) = the block src [rows, cols] (row stride lds),
 * transposed. */
static void block_transpose(const float *src, int64_t rows, int64_t cols, int64_t lds, float *dst) {
    if (lowp_cpu_has_avx512()) { /* the same bits, 16x16 blocks in registers */
        lowp_cpu_transpose_f32_avx512(src, rows, cols, lds, dst, rows);
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * lds + c];
}

/* Backward of moe_attention_core_forward: from do_ [N, D], dq, dk, dv [N, D] (overwritten).
 * Per task, with P the probabilities [T, T]:
 *   dP = dO V^T;  dS = P * (dP - rowsum(P * dP)) / sqrt(hd);
 *   dQ = dS K;  dK = dS^T Q;  dV = P^T dO.
 * dP and dQ run by blocks of query rows (as the forward); dK and dV by blocks of R keys
 * [j0, j0 + c), which only the queries [j0, T) see: dK rows = (dS block)^T Q rows [j0, T), the
 * block transposed into contiguous [c, T - j0] scratch. Each dK and dV element is the same
 * sequence of multiply-adds over the queries as over the whole square (the queries before j0
 * only add exact zeros to a sum that starts at +0), in a third of the square's work at T = 256. */
lowp_status moe_attention_core_backward(const moe_dims *d, const float *q, const float *k,
                                        const float *v, const float *att, const float *do_,
                                        float *dq, float *dk, float *dv, int nthreads) {
    const int64_t T = d->T, D = d->D, hd = d->hd;
    const float scale = 1.0f / sqrtf((float) hd);
    const int64_t work = d->N * d->T * d->D; /* ~ twice the multiply-adds */
    lowp_status all = LOWP_OK;
#pragma omp parallel num_threads(nthreads) if (work >= MOE_PARALLEL_MIN)
    {
        const int64_t R = att_block(T);
        float *buf = malloc((size_t) (T * T + R * T) * sizeof(float));
        float *ds = buf;        /* dP, then dS [T, T] */
        float *tb = ds + T * T; /* a key block of dS or P, transposed: [c, T - j0] */
        float *pbuf, *pk[4];
        if (!op_buffers(d, 4, &pbuf, pk) || !buf)
            keep_first(&all, lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "attention: scratch"));
#pragma omp for schedule(static)
        for (int64_t task = 0; task < d->B * d->nh; task++) {
            if (failed(&all)) continue;
            const int64_t seq = (task / d->nh) * T * D + (task % d->nh) * hd; /* head's (0, 0) */
            const float *p = att + task * T * T;
            att_op vh, kh, qh, doh; /* V [T keys, hd]; K, Q, dO read as [k, n] */
            op_set(&vh, v + seq, D, 0, T, hd, pk[0]);
            op_set(&kh, k + seq, D, 1, hd, T, pk[1]);
            op_set(&qh, q + seq, D, 1, hd, T, pk[2]);
            op_set(&doh, do_ + seq, D, 1, hd, T, pk[3]);
            lowp_status st = LOWP_OK;
            for (int64_t i0 = 0; i0 < T && st == LOWP_OK; i0 += R) {
                const int64_t r = T - i0 < R ? T - i0 : R, L = i0 + r; /* as in the forward */
                float *db = ds + i0 * T;
                /* dP = dO V^T over the head's columns */
                st = op_mul(do_ + seq + i0 * D, D, r, &vh, L, 0, hd, db, T);
                if (st != LOWP_OK) break;
                moe_ds_block(p, T, db, r, T, i0, scale);
                /* dQ = dS K, into the head's columns of dq */
                st = op_mul(db, T, r, &kh, hd, 0, L, dq + seq + i0 * D, D);
            }
            for (int64_t j0 = 0; j0 < T && st == LOWP_OK; j0 += R) {
                const int64_t c = T - j0 < R ? T - j0 : R, n = T - j0;
                /* dK rows [j0, j0 + c) = (dS block)^T Q rows [j0, T); dV from P and dO */
                block_transpose(ds + j0 * T + j0, n, c, T, tb);
                st = op_mul(tb, n, c, &qh, hd, j0, T, dk + seq + j0 * D, D);
                if (st != LOWP_OK) break;
                block_transpose(p + j0 * T + j0, n, c, T, tb);
                st = op_mul(tb, n, c, &doh, hd, j0, T, dv + seq + j0 * D, D);
            }
            keep_first(&all, st);
        }
        free(buf);
        free(pbuf);
    }
    return all;
}

lowp_status moe_attention_forward(lowp_param *lp, const moe_dims *d, const moe_exec *ex,
                                  const float *rope_cos, const float *rope_sin, const float *x,
                                  moe_attn_acts *a, int keep) {
    const int64_t N = d->N, D = d->D;
    lowp_status st;

    /* h [N, D] = attn_norm(x [N, D]) */
    lowp_tensor xt = moe_tensor(x, N, D), ht = moe_tensor(a->h, N, D);
    st = lowp_rmsnorm_forward_nt(&xt, lp[MOE_ATTN_NORM].data, d->eps, &ht, a->rstd, ex->autocast,
                                 ex->nthreads);
    if (st != LOWP_OK) return st;

    /* q, k, v [N, D] = h Wq^T, h Wk^T, h Wv^T; then RoPE on q and k */
    st = moe_linear_fwd(&lp[MOE_WQ], a->h, N, a->q, ex, keep ? &a->saved[0] : NULL);
    if (st != LOWP_OK) return st;
    st = moe_linear_fwd_again(&lp[MOE_WK], a->h, N, a->k, ex, keep ? &a->saved[1] : NULL);
    if (st != LOWP_OK) return st;
    st = moe_linear_fwd_again(&lp[MOE_WV], a->h, N, a->v, ex, keep ? &a->saved[2] : NULL);
    if (st != LOWP_OK) return st;
    lowp_prof_push(LOWP_PHASE_ATTENTION);
    rope_rotate(a->q, d, rope_cos, rope_sin, 1.0f, ex->nthreads);
    rope_rotate(a->k, d, rope_cos, rope_sin, 1.0f, ex->nthreads);

    /* o [N, D] = causal softmax attention; att [B, nh, T, T] kept */
    st = moe_attention_core_forward(d, a->q, a->k, a->v, a->att, a->o, ex->nthreads);
    lowp_prof_pop();
    if (st != LOWP_OK) return st;

    /* y [N, D] = o Wo^T */
    return moe_linear_fwd(&lp[MOE_WO], a->o, N, a->y, ex, keep ? &a->saved[3] : NULL);
}

lowp_status moe_attention_backward(lowp_param *lp, const moe_dims *d, const moe_exec *ex,
                                   const float *rope_cos, const float *rope_sin, const float *x,
                                   moe_attn_acts *a, const float *dy, float *dx, moe_grads *g) {
    const int64_t N = d->N, D = d->D;
    lowp_status st;

    /* y = o Wo^T:  do_ [N, D] = dy Wo;  Wo.grad += dy^T o */
    st = moe_linear_bwd(&lp[MOE_WO], a->o, N, dy, g->do_, ex, &a->saved[3]);
    if (st != LOWP_OK) return st;

    /* attention core: dq, dk, dv [N, D]; then RoPE's transpose on dq and dk */
    lowp_prof_push(LOWP_PHASE_ATTENTION);
    st = moe_attention_core_backward(d, a->q, a->k, a->v, a->att, g->do_, g->dq, g->dk, g->dv,
                                     ex->nthreads);
    if (st == LOWP_OK) {
        rope_rotate(g->dq, d, rope_cos, rope_sin, -1.0f, ex->nthreads);
        rope_rotate(g->dk, d, rope_cos, rope_sin, -1.0f, ex->nthreads);
    }
    lowp_prof_pop();
    if (st != LOWP_OK) return st;

    /* q, k, v = h W^T:  dh [N, D] = dq Wq + dk Wk + dv Wv */
    st = moe_linear_bwd(&lp[MOE_WQ], a->h, N, g->dq, g->dh, ex, &a->saved[0]);
    if (st != LOWP_OK) return st;
    st = moe_linear_bwd(&lp[MOE_WK], a->h, N, g->dk, g->dtmp, ex, &a->saved[1]);
    if (st != LOWP_OK) return st;
    moe_add(g->dh, g->dtmp, N * D, ex->nthreads);
    st = moe_linear_bwd(&lp[MOE_WV], a->h, N, g->dv, g->dtmp, ex, &a->saved[2]);
    if (st != LOWP_OK) return st;
    moe_add(g->dh, g->dtmp, N * D, ex->nthreads);

    /* h = attn_norm(x):  dx [N, D] += the norm's backward; attn_norm.grad += */
    lowp_tensor xt = moe_tensor(x, N, D), dht = moe_tensor(g->dh, N, D);
    lowp_tensor dxt = moe_tensor(g->dtmp, N, D);
    st = lowp_rmsnorm_backward_nt(&xt, lp[MOE_ATTN_NORM].data, a->rstd, &dht, &dxt,
                                  lp[MOE_ATTN_NORM].grad, ex->nthreads);
    if (st != LOWP_OK) return st;
    moe_add(dx, g->dtmp, N * D, ex->nthreads);
    return LOWP_OK;
}
