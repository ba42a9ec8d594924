/* AVX-512 quantization kernels, the entry (docs/numerics.md sections 3-4; bit-exact with
 * quant_ref.c). lowp_cpu_quant_avx512 plans a call (q512_plan: which copies go out with
 * non-temporal stores, whether the columnwise copy takes a carry, whether subnormal results are
 * kept) and hands its rows to the file of the job's scaling family:
 *   quant_avx512_mx.c      MX32, with the byte encoder's band path for dual-axis BF16 input;
 *   quant_avx512_block.c   Block FP8: BLOCK128, BLOCK128X128, BLOCK32X32;
 *   quant_avx512_tensor.c  the binary32-scale kinds TENSOR and ROW;
 *   quant_avx512_nv.c      NVFP4: NV16 (with its grouped copy), NV16X16;
 * all built from the pieces of quant_avx512_simd.h. This file also holds the dispatcher's
 * whole-tensor passes (the TENSOR amax, the column maxima of ROW's columnwise copy), which
 * quant.c uses with these kernels. The measurements behind the kernels' choices are in
 * docs/benchmarks.md, "AVX-512 quantization kernels".
 *
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq; quant.c calls it only when the CPU
 * has AVX-512F/BW, and the byte encoder's functions (target attribute avx512vbmi) run only
 * when it also has AVX512_VBMI. It never fails: the ops layer validated the arguments.
 */
#include "quant_avx512_simd.h"

/* Dual-axis copies whose codes take at least this many bytes (a quarter of a 1 MiB L2) are
 * stored non-temporally. */
#define NT_MIN_BYTES ((size_t) 256 << 10)
/* The byte encoder's rowwise copies of the block kinds take them from here: beyond a core's
 * L2, where the copy's lines go to memory anyway (docs/benchmarks.md, "AVX-512 quantization
 * kernels"). */
#define NT_ROWS_B_MIN_BYTES ((size_t) 4 << 20)

/* ---- entry points ---- */

/* Non-temporal stores for a copy: large enough, 8-bit codes, and 64-byte aligned rows. */
static int big_for_nt(const lowp_qtensor *q) {
    return q && q->format != LOWP_FORMAT_E2M1 &&
           (size_t) q->rows * (size_t) q->cols >= NT_MIN_BYTES;
}
static int want_nt(const lowp_qtensor *q) {
    return big_for_nt(q) && (uintptr_t) q->data % 64 == 0 && q->cols % 64 == 0;
}

/* The plan of a call. Non-temporal stores: in the dual-axis MX32 kernel, in the byte encoder's
 * large rowwise copies of the block kinds, and in the columnwise copies of the binary32 kinds
 * (64-byte lines too, col_rows). */
static q512_plan plan_of(const lowp_quant_job *j) {
    const lowp_format xf = j->xfmt == LOWP_FORMAT_BF16 ? LOWP_FORMAT_BF16 : F32, ef = j->efmt;
    const int dual = j->scaling == LOWP_SCALING_MX32 && j->col;
    const int blk = j->scaling == LOWP_SCALING_BLOCK128 ||
                    j->scaling == LOWP_SCALING_BLOCK128X128 ||
                    j->scaling == LOWP_SCALING_BLOCK32X32;
    const int colk = dual || j->scaling == LOWP_SCALING_BLOCK128 ||
                     j->scaling == LOWP_SCALING_ROW || j->scaling == LOWP_SCALING_TENSOR;
    q512_plan p;
    p.em_ok = subnormals_kept(); /* enc16_sub (BF16) and enc16_fsub (any input) need them */
    p.nt_row = want_nt(j->row) &&
               (dual || (blk && rows_b(xf, ef) &&
                         (size_t) j->row->rows * (size_t) j->row->cols >= NT_ROWS_B_MIN_BYTES));
    p.nt_col = colk && want_nt(j->col) && j->col_ob % 64 == 0;
    p.col_big = colk && big_for_nt(j->col);
    p.row_big = big_for_nt(j->row);
    return p;
}

int lowp_cpu_quant_avx512_supports(const lowp_quant_job *j) {
    if (j->efmt == E2M1)
        return (j->xfmt == LOWP_FORMAT_F32 || j->xfmt == LOWP_FORMAT_BF16) &&
               (j->scaling == LOWP_SCALING_MX32 || j->scaling == LOWP_SCALING_NV16 ||
                j->scaling == LOWP_SCALING_NV16X16);
    return lowp_quant_job_fp8(j);
}

void lowp_cpu_quant_avx512(const lowp_quant_job *j, int64_t r0, int64_t r1) {
    const q512_plan p = plan_of(j);
    switch (j->scaling) {
    case LOWP_SCALING_TENSOR:
    case LOWP_SCALING_ROW: lowp_cpu_q512_tensor(j, r0, r1, &p); break;
    case LOWP_SCALING_MX32:
        if (j->sr)
            lowp_cpu_q512_mx_sr(j, r0, r1);
        else
            lowp_cpu_q512_mx(j, r0, r1, &p);
        break;
    case LOWP_SCALING_BLOCK128:
    case LOWP_SCALING_BLOCK128X128:
    case LOWP_SCALING_BLOCK32X32: lowp_cpu_q512_block(j, r0, r1, &p); break;
    case LOWP_SCALING_NV16:
    case LOWP_SCALING_NV16X16: lowp_cpu_q512_nv(j, r0, r1, &p); break;
    default: break;
    }
    /* Non-temporal stores are weakly ordered: make them visible before the caller (or the
     * thread that joins this one) reads the outputs. */
    if (p.nt_row || p.nt_col) _mm_sfence();
}

/* ---- whole-tensor passes for the dispatcher (quant.c) ---- */

/* Largest |x| bit pattern over rows [r0, r1) (NaN patterns sort above Inf, as in tensor_amax). */
uint32_t lowp_cpu_amax_bits_avx512(const lowp_quant_job *j, int64_t r0, int64_t r1) {
    const lowp_format xf = j->xfmt;
    const int64_t C = j->cols;
    const size_t es = xsize(xf);
    __m512i m0 = _mm512_setzero_si512(), m1 = m0;
    for (int64_t r = r0; r < r1; r++) {
        const char *xr = xrow(j, xf, r);
        int64_t c = 0;
        for (; c + 64 <= C; c += 64) {
            m0 = _mm512_max_epu32(m0, amax32(xr + (size_t) c * es, xf, 32, 1));
            m1 = _mm512_max_epu32(m1, amax32(xr + (size_t) (c + 32) * es, xf, 32, 1));
        }
        for (; c < C; c += 32)
            m0 = _mm512_max_epu32(m0, amax32(xr + (size_t) c * es, xf, C - c, 0));
    }
    return _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
}

/* acc[c] = max(acc[c], |x[r][c]| bit patterns over rows [r0, r1)), columns in natural order. */
void lowp_cpu_colamax_bits_avx512(const lowp_quant_job *j, int64_t r0, int64_t r1, uint32_t *acc) {
    const lowp_format xf = j->xfmt;
    const int64_t C = j->cols;
    /* Bands of 16 rows, and in each 256 columns at a time with their maxima in registers
     * over the band's rows: a running maximum kept in acc for every row was a load and a
     * masked store per 16 elements, each load waiting on the store of the row before, and
     * 256 columns down every row were 2-D strided reads the prefetchers follow badly. */
    for (int64_t rb = r0; rb < r1; rb += 16) {
        const int64_t re = min64(r1, rb + 16);
        for (int64_t c0 = 0; c0 < C; c0 += 256) {
            const int64_t w = min64(C - c0, 256), nv = (w + 15) / 16;
            __m512i m[16];
            __mmask16 mk[16];
            for (int k = 0; k < 16; k++) {
                mk[k] = mask16(w - 16 * k);
                m[k] = k < nv ? _mm512_maskz_loadu_epi32(mk[k], acc + c0 + 16 * k)
                              : _mm512_setzero_si512();
            }
            for (int64_t r = rb; r < re; r++) {
                const char *xr = xrow(j, xf, r) + (size_t) c0 * xsize(xf);
                for (int k = 0; k < 16; k++) {
                    if (k >= nv) break;
                    __m512i v;
                    if (xf == F32)
                        v = _mm512_maskz_loadu_epi32(mk[k], (const float *) xr + 16 * k);
                    else /* natural order here: widen, then into the binary32 position */
                        v = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                                  mk[k], (const uint16_t *) xr + 16 * k)),
                                              16);
                    m[k] = _mm512_max_epu32(m[k], _mm512_and_si512(v, V32(0x7FFFFFFF)));
                }
            }
            for (int k = 0; k < nv; k++) _mm512_mask_storeu_epi32(acc + c0 + 16 * k, mk[k], m[k]);
        }
    }
}
