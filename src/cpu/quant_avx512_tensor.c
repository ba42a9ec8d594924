/* AVX-512 quantization, the binary32-scale kinds: LOWP_SCALING_TENSOR (one scale per tensor,
 * given) and LOWP_SCALING_ROW (one per row), their rowwise and columnwise copies (docs/numerics.md
 * section 3). With a columnwise copy both go band by band (64 rows, in L2), the columnwise codes
 * of each band in whole 64-byte lines (col_fp32). The whole-tensor passes these kinds need first
 * (the TENSOR amax, the column maxima of ROW's columnwise copy) are quant_avx512.c's. Entry:
 * lowp_cpu_q512_tensor; pieces: quant_avx512_simd.h.
 */
#include "quant_avx512_simd.h"

/* The columnwise copy of rows [r0, r1) with binary32 scales per column given as natural-order
 * values (cs != NULL, ROW) or one scale s for all (TENSOR), in bands of up to 64 rows (aligned
 * to 64) swept left to right, each segment's rows by col_rows; encoder em (EM_FP32; for one
 * scale also EM_FSUB with s the factor; EM_FIN where every maximum is finite, which takes
 * EM_FSUB per segment where em_ok and the 32 factors are normal). Whole columns of 32-row pieces,
 * 32-byte stores a row of the copy apart, were half lines read before being written. */
AI void col_fp32(const lowp_quant_job *j, int64_t r0, int64_t r1, const float *cs, float s,
                 lowp_format xf, lowp_format ef, int em, int em_ok, int nt, col_carry *cc) {
    const int64_t C = j->cols;
    __m512i ilo = _mm512_setzero_si512(), ihi = ilo;
    if (xf != F32) { /* the BF16 lane order of the columns */
        ilo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
        ihi = _mm512_add_epi32(ilo, V32(4));
    }
    for (int64_t rb = r0; rb < r1;) {
        const int64_t re = band_end(rb, r1, 64);
        for (int64_t c0 = 0; c0 < C; c0 += 32) {
            const int64_t ncv = min64(C - c0, 32);
            __m512 flo = _mm512_set1_ps(s), fhi = flo;
            if (cs) {
                __m512 s0 = _mm512_maskz_loadu_ps(mask16(ncv), cs + c0);
                __m512 s1 = _mm512_maskz_loadu_ps(mask16(ncv - 16), cs + c0 + 16);
                if (xf == F32) {
                    flo = s0;
                    fhi = s1;
                } else {
                    flo = _mm512_permutex2var_ps(s0, ilo, s1);
                    fhi = _mm512_permutex2var_ps(s0, ihi, s1);
                }
            }
            __m512 glo, ghi;
            if (em == EM_FIN && em_ok && fsub_factors(flo, ef, &glo) & fsub_factors(fhi, ef, &ghi))
                col_rows(j, rb, re - rb, c0, ncv, glo, ghi, xf, ef, EM_FSUB, nt, cc);
            else if (em == EM_FIN)
                col_rows(j, rb, re - rb, c0, ncv, flo, fhi, xf, ef, EM_FIN, nt, cc);
            else
                col_rows(j, rb, re - rb, c0, ncv, flo, fhi, xf, ef, em, nt, cc);
        }
        rb = re;
    }
}

/* ---- ROW ---- */

/* Rowwise copy: per row, the maximum, the scalar rule (stored as scale_inv), codes; the row
 * is reread from L1. */
AI void row_rows(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
                 int em_ok, int nt) {
    const int64_t C = j->cols;
    const size_t es = xsize(xf), ob = code_bytes(ef, C);
    for (int64_t r = r0; r < r1; r++) {
        const char *xr = xrow(j, xf, r);
        row_ahead(xr, xf, (size_t) C * es);
        __m512i m0 = _mm512_setzero_si512(), m1 = m0;
        int64_t c = 0;
        for (; c + 64 <= C; c += 64) {
            m0 = _mm512_max_epu32(m0, amax32(xr + (size_t) c * es, xf, 32, 1));
            m1 = _mm512_max_epu32(m1, amax32(xr + (size_t) (c + 32) * es, xf, 32, 1));
        }
        for (; c < C; c += 32)
            m0 = _mm512_max_epu32(m0, amax32(xr + (size_t) c * es, xf, C - c, 0));
        const uint32_t am = _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
        const float s = lowp_rule_fp32_scale(lowp_u2f(am), j->et->fmax, j->eps, j->pow2);
        ((float *) j->row->scales)[r] = 1.0f / s;
        enc_run_a(xr, (uint8_t *) j->row->data + (size_t) r * ob, 0, C, _mm512_set1_ps(s), am, xf,
                  ef, em_ok, nt);
    }
}

/* ---- the family's entry ---- */

/* Rows [r0, r1) of a TENSOR job, with the given scale. */
AI void tensor_job(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
                   const q512_plan *p) {
    /* a scale from this input's finite maximum bounds every scaled value (EM_FIN) */
    const __m512 s = _mm512_set1_ps(j->tensor_scale);
    __m512 g = s;
    const int fsub = p->em_ok && j->tensor_fin && fsub_factors(s, ef, &g);
    const size_t ob = code_bytes(ef, j->cols);
    col_carry cb, *cc = carry_open(&cb, j->cols, p->col_big && !p->nt_col);
    /* band by band with a columnwise copy, as for BLOCK128 (the band is in L2) */
    for (int64_t rb = r0; rb < r1;) {
        const int64_t re = j->col ? band_end(rb, r1, 64) : r1;
        for (int64_t r = rb; j->row && r < re; r++) {
            const char *xr = xrow(j, xf, r);
            uint8_t *orow = (uint8_t *) j->row->data + (size_t) r * ob;
            row_ahead(xr, xf, (size_t) j->cols * xsize(xf));
            if (fsub)
                enc_run(xr, orow, 0, j->cols, g, xf, ef, EM_FSUB, p->nt_row);
            else
                enc_run(xr, orow, 0, j->cols, s, xf, ef, EM_FP32, p->nt_row);
        }
        if (j->col && fsub)
            col_fp32(j, rb, re, NULL, _mm512_cvtss_f32(g), xf, ef, EM_FSUB, p->em_ok, p->nt_col,
                     cc);
        else if (j->col)
            col_fp32(j, rb, re, NULL, j->tensor_scale, xf, ef, EM_FP32, p->em_ok, p->nt_col, cc);
        rb = re;
    }
    carry_close(cc, j, r1);
}

/* Rows [r0, r1) of a ROW job. */
AI void row_job(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
                const q512_plan *p) {
    if (!j->col) {
        if (j->row) row_rows(j, r0, r1, xf, ef, p->em_ok, p->nt_row);
        return;
    }
    col_carry cb, *cc = carry_open(&cb, j->cols, p->col_big && !p->nt_col);
    for (int64_t rb = r0; rb < r1;) { /* band by band, as for TENSOR */
        const int64_t re = band_end(rb, r1, 64);
        if (j->row) row_rows(j, rb, re, xf, ef, p->em_ok, p->nt_row);
        col_fp32(j, rb, re, j->col_scale, 0.0f, xf, ef, j->col_fin ? EM_FIN : EM_FP32, p->em_ok,
                 p->nt_col, cc);
        rb = re;
    }
    carry_close(cc, j, r1);
}

/* Rows [r0, r1) of a TENSOR or ROW job. */
AI void tensor_run(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
                   const q512_plan *p) {
    if (j->scaling == LOWP_SCALING_TENSOR)
        tensor_job(j, r0, r1, xf, ef, p);
    else
        row_job(j, r0, r1, xf, ef, p);
}
Q512_INSTANCE(tensor_f32_e4m3, tensor_run, LOWP_FORMAT_F32, LOWP_FORMAT_E4M3)
Q512_INSTANCE(tensor_f32_e5m2, tensor_run, LOWP_FORMAT_F32, LOWP_FORMAT_E5M2)
Q512_INSTANCE(tensor_bf16_e4m3, tensor_run, LOWP_FORMAT_BF16, LOWP_FORMAT_E4M3)
Q512_INSTANCE(tensor_bf16_e5m2, tensor_run, LOWP_FORMAT_BF16, LOWP_FORMAT_E5M2)

void lowp_cpu_q512_tensor(const lowp_quant_job *j, int64_t r0, int64_t r1, const q512_plan *p) {
    const int bf = j->xfmt == LOWP_FORMAT_BF16;
    switch (j->efmt) {
    case LOWP_FORMAT_E4M3:
        bf ? tensor_bf16_e4m3(j, r0, r1, p) : tensor_f32_e4m3(j, r0, r1, p);
        return;
    case LOWP_FORMAT_E5M2:
        bf ? tensor_bf16_e5m2(j, r0, r1, p) : tensor_f32_e5m2(j, r0, r1, p);
        return;
    default: lowp_cpu_quant_ref(j, r0, r1); return;
    }
}
