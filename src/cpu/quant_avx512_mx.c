/* AVX-512 quantization, the MX family: LOWP_SCALING_MX32 (E8M0 scales per 1x32 block), the
 * rowwise copy alone or both copies from one read (docs/numerics.md section 4).
 *
 * The dual-axis kernel works on 64x64 tiles copied to a local buffer (rows of x a multiple of
 * 4 KiB apart share one L1 set), so that each output line of both copies is written whole by one
 * 64-byte store, in super-bands so that each page of the columnwise copy is visited once per band;
 * large outputs go out with non-temporal stores (the plan, quant_avx512.c). Where a copy's rows
 * are not whole lines, each line is completed from the bytes its predecessor segment left
 * (col_carry). On CPUs with AVX512_VBMI, BF16 tiles take the byte encoder (quant_avx512_simd.h)
 * and its band path (mx_bands_b). Entry: lowp_cpu_q512_mx; pieces: quant_avx512_simd.h; the
 * measurements behind these choices: docs/benchmarks.md, "AVX-512 quantization kernels".
 */
#include "quant_avx512_simd.h"

/* ---- MX32 ---- */

/* Rowwise copy, 16 blocks of one row (from block b0; full: all 512 elements present):
 * maxima, scales (one 16-byte store), factors, codes. */
AI void mx_group(const lowp_quant_job *j, const char *xr, uint8_t *orow, uint8_t *srow, int64_t b0,
                 lowp_format xf, lowp_format ef, int full, int em_ok, int nt) {
    const int64_t C = j->cols, nb = (C + 31) / 32;
    const int g = nb - b0 < 16 ? (int) (nb - b0) : 16;
    const size_t es = xsize(xf);
    __m512i m[16];
    for (int k = 0; k < 16; k++) {
        const int64_t q = 32 * (b0 + k), n = full ? 32 : C - q;
        m[k] = full || n >= 32 ? amax32w(xr + (size_t) q * es, xf, 32, 1)
               : n > 0         ? amax32w(xr + (size_t) q * es, xf, n, 0)
                               : _mm512_setzero_si512();
    }
    const __m512i code = e8m0_codes(tree16(m, xf != F32), j->et, j->mode);
    if (full)
        _mm_storeu_si128((__m128i *) (srow + b0), _mm512_cvtepi32_epi8(code));
    else
        _mm512_mask_cvtepi32_storeu_epi8(srow + b0, mask16(g), code);
    const unsigned nan = _mm512_cmpeq_epi32_mask(code, V32(0xFF)) & mask16(g);
    if (xf != F32 && w16_ok(code, mask16(g), ef, em_ok)) {
        uint16_t off[16], thr1[16];
        w16_params(code, ef, off, thr1);
        if (clip_of(j)) /* constant flags: the loop keeps no tests of them */
            enc_blocks32w(xr, orow, 32 * b0, g, C, off, thr1, nan, ef, 1, full, nt);
        else if (nan)
            enc_blocks32w(xr, orow, 32 * b0, g, C, off, thr1, nan, ef, 0, full, nt);
        else
            enc_blocks32w(xr, orow, 32 * b0, g, C, off, thr1, 0, ef, 0, full, nt);
        return;
    }
    float f[16];
    if (e8_em(code, mask16(g), ef, em_ok) == EM_SUB) {
        _mm512_storeu_ps(f, e8m0_factors(code, ef, EM_SUB));
        enc_blocks32(xr, orow, 32 * b0, g, C, f, nan, xf, ef, EM_SUB, clip_of(j), full, nt);
    } else {
        _mm512_storeu_ps(f, e8m0_factors(code, ef, EM_E8));
        enc_blocks32(xr, orow, 32 * b0, g, C, f, nan, xf, ef, EM_E8, 0, full, nt);
    }
}

AI void mx_rows(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
                int em_ok, int nt) {
    const int64_t C = j->cols, nb = (C + 31) / 32;
    const size_t ob = code_bytes(ef, C);
    for (int64_t r = r0; r < r1; r++) {
        const char *xr = xrow(j, xf, r);
        uint8_t *orow = (uint8_t *) j->row->data + (size_t) r * ob;
        uint8_t *srow = (uint8_t *) j->row->scales + (size_t) r * (size_t) nb;
        row_ahead(xr, xf, (size_t) C * xsize(xf));
        for (int64_t b0 = 0; b0 < nb; b0 += 16) {
            if (32 * (b0 + 16) <= C)
                mx_group(j, xr, orow, srow, b0, xf, ef, 1, em_ok, nt);
            else
                mx_group(j, xr, orow, srow, b0, xf, ef, 0, em_ok, nt);
        }
    }
}

/* With a columnwise copy, any 32x32 tile (rows [r0, r0+nr), columns [c0, c0+ncv)): it holds 32
 * row blocks and 32 column blocks. One pass takes both kinds of maxima (row maxima by the
 * tree, column maxima by a running vertical max) and copies the tile to a buffer; the row
 * codes and the transposed column codes come from the buffer. Used at the edges. */
AI void mx_tile32(const lowp_quant_job *j, int64_t r0, int64_t nr, int64_t c0, int64_t ncv,
                  lowp_format xf, lowp_format ef, int em_ok) {
    const int64_t C = j->cols;
    const size_t es = xsize(xf), stride = (size_t) C * es;
    const char *base = (const char *) j->x + ((size_t) r0 * (size_t) C + (size_t) c0) * es;
    _Alignas(64) char tile[32 * 32 * 4];
    __m512i rm[32], clo = _mm512_setzero_si512(), chi = clo;
    for (int i = 0; i < 32; i++) {
        const char *p = base + (size_t) (i < nr ? i : 0) * stride;
        const int64_t n = i < nr ? ncv : 0;
        if (xf == F32) {
            __m512 lo, hi;
            ld32(p, xf, n, 0, &lo, &hi);
            _mm512_storeu_ps(tile + 128 * i, lo);
            _mm512_storeu_ps(tile + 128 * i + 64, hi);
            __m512i alo = _mm512_and_si512(_mm512_castps_si512(lo), V32(0x7FFFFFFF));
            __m512i ahi = _mm512_and_si512(_mm512_castps_si512(hi), V32(0x7FFFFFFF));
            rm[i] = _mm512_max_epu32(alo, ahi);
            clo = _mm512_max_epu32(clo, alo);
            chi = _mm512_max_epu32(chi, ahi);
        } else { /* clo collects 16-bit column maxima here, unpacked below */
            __m512i v = _mm512_maskz_loadu_epi16(mask32(n), p);
            _mm512_storeu_si512(tile + 64 * i, v);
            rm[i] = _mm512_and_si512(v, V32(0x7FFF7FFF));
            clo = _mm512_max_epu16(clo, rm[i]);
        }
    }
    if (xf != F32) { /* the same lane order as ld32 */
        chi = _mm512_unpackhi_epi16(_mm512_setzero_si512(), clo);
        clo = _mm512_unpacklo_epi16(_mm512_setzero_si512(), clo);
    }
    if (j->row) {
        const int64_t nbc = (C + 31) / 32;
        uint8_t *sc = (uint8_t *) j->row->scales + (size_t) (c0 / 32);
        uint8_t *out = (uint8_t *) j->row->data;
        const size_t ob = code_bytes(ef, C);
        const __m512i cv0 = e8m0_codes(tree16(rm, xf != F32), j->et, j->mode);
        const __m512i cv1 = e8m0_codes(tree16(rm + 16, xf != F32), j->et, j->mode);
        const int em = e8_em(cv0, mask16(nr), ef, em_ok) == EM_SUB &&
                               e8_em(cv1, mask16(nr - 16), ef, em_ok) == EM_SUB
                           ? EM_SUB
                           : EM_E8;
        float f[32];
        uint8_t code[32];
        _mm512_storeu_ps(f, e8m0_factors(cv0, ef, em));
        _mm512_storeu_ps(f + 16, e8m0_factors(cv1, ef, em));
        _mm_storeu_si128((__m128i *) code, _mm512_cvtepi32_epi8(cv0));
        _mm_storeu_si128((__m128i *) (code + 16), _mm512_cvtepi32_epi8(cv1));
        for (int i = 0; i < nr; i++) {
            sc[(size_t) (r0 + i) * (size_t) nbc] = code[i];
            __m512 lo, hi;
            ld32(tile + (size_t) i * 32 * es, xf, 32, 1, &lo, &hi);
            const __m512 fi = _mm512_set1_ps(f[i]);
            __m256i b = em == EM_SUB
                            ? pack2(encx(lo, fi, xf, ef, EM_SUB), encx(hi, fi, xf, ef, EM_SUB), xf,
                                    ef, EM_SUB, clip_of(j))
                            : pack2(encx(lo, fi, xf, ef, EM_E8), encx(hi, fi, xf, ef, EM_E8), xf,
                                    ef, EM_E8, 0);
            st32(out + (size_t) (r0 + i) * ob, c0, b, ef, ncv, 0);
            if (code[i] == 0xFF) fill_nan(out + (size_t) (r0 + i) * ob, c0, ncv, ef);
        }
    }
    if (j->col) {
        const int64_t nbr = j->col_nbr;
        uint8_t *sc = (uint8_t *) j->col->scales + (size_t) (r0 / 32);
        const __m512i cl = e8m0_codes(clo, j->et, j->mode), ch = e8m0_codes(chi, j->et, j->mode);
        uint8_t code[32];
        _mm_storeu_si128((__m128i *) code, _mm512_cvtepi32_epi8(cl));
        _mm_storeu_si128((__m128i *) (code + 16), _mm512_cvtepi32_epi8(ch));
        for (int k = 0; k < 32; k++) {
            const int cc = lane_col(xf, k >> 4, k & 15);
            if (cc < ncv) sc[(size_t) (c0 + cc) * (size_t) nbr] = code[k];
        }
        const unsigned nan = _mm512_cmpeq_epi32_mask(cl, V32(0xFF)) |
                             (unsigned) _mm512_cmpeq_epi32_mask(ch, V32(0xFF)) << 16;
        if (e8_em(cl, 0xFFFF, ef, em_ok) == EM_SUB && e8_em(ch, 0xFFFF, ef, em_ok) == EM_SUB)
            col_seg(j, tile, r0, nr, c0, ncv, e8m0_factors(cl, ef, EM_SUB),
                    e8m0_factors(ch, ef, EM_SUB), nan, xf, ef, EM_SUB, clip_of(j));
        else
            col_seg(j, tile, r0, nr, c0, ncv, e8m0_factors(cl, ef, EM_E8),
                    e8m0_factors(ch, ef, EM_E8), nan, xf, ef, EM_E8, 0);
    }
}

/* Row codes of a full 64x64 tile buffer: row i's blocks scaled by f0[i], f1[i]. nan_any: some
 * block's code is 0xFF (a constant 0 drops the per-row tests of the common case). */
AI void tile64_rows(const lowp_quant_job *j, const char *tile, int64_t r0, int64_t c0,
                    const float *f0, const float *f1, const uint8_t *c0s, const uint8_t *c1s,
                    lowp_format xf, lowp_format ef, int em, int clip, int nt, int nan_any) {
    const size_t es = xsize(xf), pitch = 64 * es, ob = code_bytes(ef, j->cols);
    uint8_t *out = (uint8_t *) j->row->data + (size_t) r0 * ob;
    for (int i = 0; i < 64; i++) {
        __m512 a, b, c, d;
        ld32(tile + (size_t) i * pitch, xf, 32, 1, &a, &b);
        ld32(tile + (size_t) i * pitch + 32 * es, xf, 32, 1, &c, &d);
        const __m512 g0 = _mm512_set1_ps(f0[i]), g1 = _mm512_set1_ps(f1[i]);
        const unsigned nan2 = nan_any ? (c0s[i] == 0xFF) | (unsigned) (c1s[i] == 0xFF) << 1 : 0u;
        st64(out + (size_t) i * ob, c0,
             pack4(encx(a, g0, xf, ef, em), encx(b, g0, xf, ef, em), encx(c, g1, xf, ef, em),
                   encx(d, g1, xf, ef, em), xf, ef, em, clip),
             ef, 64, 1, nan2, nt);
    }
}

/* Column codes of a full 64x64 tile buffer: per 32-column segment s and half h, the two
 * 32-row blocks (factors f[b][2s+h]) transposed and stored as 64-byte output rows. */
AI void tile64_cols(const lowp_quant_job *j, const char *tile, int64_t r0, int64_t c0,
                    const __m512 f[2][4], const unsigned nan[2][4], lowp_format xf, lowp_format ef,
                    int em, int clip, int nt, int nan_any) {
    const size_t es = xsize(xf), pitch = 64 * es;
    for (int s = 0; s < 2; s++)
        for (int h = 0; h < 2; h++) {
            __m512i z0[8], z1[8];
            col_codes(tile + 32 * s * es, pitch, h, f[0][2 * s + h], xf, ef, em, clip, z0);
            col_codes(tile + 32 * pitch + 32 * s * es, pitch, h, f[1][2 * s + h], xf, ef, em, clip,
                      z1);
            col_store64(j, z0, z1, r0, c0 + 32 * s, h, nan_any ? nan[0][2 * s + h] : 0u,
                        nan_any ? nan[1][2 * s + h] : 0u, xf, ef, nt, NULL);
        }
}

/* mx_tile64's first pass: copies the tile's 64 rows to `tile` (pitch 64 elements),
 * prefetching the next tile to the right, and takes the E8M0 codes rc[k][q] of block k of rows
 * 16q..16q+15 (when want_row) and the column maxima cm[b][q] of band b (rows 32b..): F32 per
 * 16 columns, BF16 widened to the same ld32 halves. The rows go in 16-row groups whose
 * maxima tree16 reduces at once, mostly from registers: the whole tile's row maxima, stored
 * and reloaded, were a third of the pass's stores (dual-axis MXFP8 0.51 -> 0.57 of memcpy). */
AI void tile64_maxima(const char *base, size_t stride, size_t pitch, lowp_format xf, int want_row,
                      const lowp_format_traits *et, lowp_scale_mode mode, char *tile,
                      __m512i rc[2][4], __m512i cm[2][4]) {
    const size_t half = pitch / 2; /* bytes of one block column of a row */
    for (int b = 0; b < 2; b++) {
        __m512i c[4];
        for (int q = 0; q < 4; q++) c[q] = _mm512_setzero_si512();
        for (int g = 2 * b; g < 2 * b + 2; g++) {
            __m512i rm[2][16];
            for (int r = 0; r < 16; r++) {
                const int i = 16 * g + r;
                const char *p = base + (size_t) i * stride;
                char *tp = tile + (size_t) i * pitch;
                for (size_t o = 0; o < pitch; o += 64) prefetch(p, pitch + o);
                for (int k = 0; k < 2; k++) {
                    if (xf == F32) {
                        __m512i lo = _mm512_loadu_si512(p + k * half);
                        __m512i hi = _mm512_loadu_si512(p + k * half + 64);
                        _mm512_store_si512(tp + k * half, lo);
                        _mm512_store_si512(tp + k * half + 64, hi);
                        __m512i alo = _mm512_and_si512(lo, V32(0x7FFFFFFF));
                        __m512i ahi = _mm512_and_si512(hi, V32(0x7FFFFFFF));
                        rm[k][r] = _mm512_max_epu32(alo, ahi);
                        c[2 * k] = _mm512_max_epu32(c[2 * k], alo);
                        c[2 * k + 1] = _mm512_max_epu32(c[2 * k + 1], ahi);
                    } else {
                        __m512i v = _mm512_loadu_si512(p + k * half);
                        _mm512_store_si512(tp + k * half, v);
                        rm[k][r] = _mm512_and_si512(v, V32(0x7FFF7FFF));
                        c[k] = _mm512_max_epu16(c[k], rm[k][r]);
                    }
                }
            }
            if (want_row)
                for (int k = 0; k < 2; k++)
                    rc[k][g] = e8m0_codes(tree16(rm[k], xf != F32), et, mode);
        }
        for (int q = 0; q < 4; q++) cm[b][q] = c[q];
        if (xf != F32) { /* u16 maxima of 32 columns -> the ld32 halves */
            for (int s = 1; s >= 0; s--) {
                cm[b][2 * s + 1] = _mm512_unpackhi_epi16(_mm512_setzero_si512(), c[s]);
                cm[b][2 * s] = _mm512_unpacklo_epi16(_mm512_setzero_si512(), c[s]);
            }
        }
    }
}

/* mx_tile64's row-wise copy: the scales of each row's two blocks from their codes cv, then the
 * codes. */
AI void tile64_row_side(const lowp_quant_job *j, const char *tile, __m512i cv[2][4], int64_t r0,
                        int64_t c0, lowp_format xf, lowp_format ef, int em_ok, int nt_row) {
    const int64_t C = j->cols;
    const int64_t nbc = (C + 31) / 32;
    uint8_t *sc = (uint8_t *) j->row->scales + (size_t) r0 * (size_t) nbc + (size_t) (c0 / 32);
    _Alignas(64) float f[2][64];
    _Alignas(64) uint8_t code[2][64];
    int em = EM_SUB, nan_any = 0;
    for (int k = 0; k < 2; k++)
        for (int q = 0; q < 4; q++) {
            if (e8_em(cv[k][q], 0xFFFF, ef, em_ok) != EM_SUB) em = EM_E8;
            nan_any |= _mm512_cmpeq_epi32_mask(cv[k][q], V32(0xFF)) != 0;
            _mm_storeu_si128((__m128i *) (code[k] + 16 * q), _mm512_cvtepi32_epi8(cv[k][q]));
        }
    if (nan_any) em = EM_E8; /* the NaN tiles' one general form (rare) */
    for (int k = 0; k < 2; k++)
        for (int q = 0; q < 4; q++) _mm512_storeu_ps(f[k] + 16 * q, e8m0_factors(cv[k][q], ef, em));
    for (int i = 0; i < 64; i++) { /* the row's two scales, one 16-bit store */
        const uint16_t pair = (uint16_t) (code[0][i] | code[1][i] << 8);
        memcpy(sc + (size_t) i * (size_t) nbc, &pair, 2);
    }
    if (em == EM_SUB)
        tile64_rows(j, tile, r0, c0, f[0], f[1], code[0], code[1], xf, ef, EM_SUB, clip_of(j),
                    nt_row, 0);
    else if (!nan_any)
        tile64_rows(j, tile, r0, c0, f[0], f[1], code[0], code[1], xf, ef, EM_E8, 0, nt_row, 0);
    else
        tile64_rows(j, tile, r0, c0, f[0], f[1], code[0], code[1], xf, ef, EM_E8, 0, nt_row, 1);
}

/* mx_tile64's column-wise copy: the scales of each column's two blocks from cm, then the
 * codes. */
AI void tile64_col_side(const lowp_quant_job *j, const char *tile, __m512i cm[2][4], int64_t r0,
                        int64_t c0, lowp_format xf, lowp_format ef, int em_ok, int nt_col) {
    const int64_t nbr = j->col_nbr;
    uint8_t *sc = (uint8_t *) j->col->scales + (size_t) (r0 / 32);
    __m512i cv[2][4];
    __m512 f[2][4];
    unsigned nan[2][4], nan_any = 0;
    __m128i cb[2][4]; /* the codes as bytes, lane order */
    int em = EM_SUB;
    for (int b = 0; b < 2; b++)
        for (int q = 0; q < 4; q++) {
            cv[b][q] = e8m0_codes(cm[b][q], j->et, j->mode);
            if (e8_em(cv[b][q], 0xFFFF, ef, em_ok) != EM_SUB) em = EM_E8;
            nan[b][q] = _mm512_cmpeq_epi32_mask(cv[b][q], V32(0xFF));
            nan_any |= nan[b][q];
            cb[b][q] = _mm512_cvtepi32_epi8(cv[b][q]);
        }
    if (nan_any) em = EM_E8; /* as in tile64_row_side */
    for (int b = 0; b < 2; b++)
        for (int q = 0; q < 4; q++) f[b][q] = e8m0_factors(cv[b][q], ef, em);
    /* Each column's scales of both blocks, one 16-bit store, columns in order: the halves
     * of a segment in column order (BF16 lanes interleave groups of four), then bytes of
     * the two blocks paired. */
    _Alignas(64) uint16_t pair[64];
    for (int s = 0; s < 2; s++) {
        __m128i nat[2][2]; /* [block][columns 0-15, 16-31] */
        for (int b = 0; b < 2; b++) {
            const __m128i lo = cb[b][2 * s], hi = cb[b][2 * s + 1];
            nat[b][0] = xf == F32 ? lo : _mm_unpacklo_epi32(lo, hi);
            nat[b][1] = xf == F32 ? hi : _mm_unpackhi_epi32(lo, hi);
        }
        for (int g = 0; g < 2; g++) {
            _mm_store_si128((__m128i *) (pair + 32 * s + 16 * g),
                            _mm_unpacklo_epi8(nat[0][g], nat[1][g]));
            _mm_store_si128((__m128i *) (pair + 32 * s + 16 * g + 8),
                            _mm_unpackhi_epi8(nat[0][g], nat[1][g]));
        }
    }
    uint8_t *d = sc + (size_t) c0 * (size_t) nbr;
    for (int c = 0; c < 64; c++, d += nbr) memcpy(d, &pair[c], 2);
    const unsigned(*nn)[4] = (const unsigned(*)[4]) nan;
    if (em == EM_SUB)
        tile64_cols(j, tile, r0, c0, (const __m512(*)[4]) f, nn, xf, ef, EM_SUB, clip_of(j), nt_col,
                    0);
    else if (!nan_any)
        tile64_cols(j, tile, r0, c0, (const __m512(*)[4]) f, nn, xf, ef, EM_E8, 0, nt_col, 0);
    else
        tile64_cols(j, tile, r0, c0, (const __m512(*)[4]) f, nn, xf, ef, EM_E8, 0, nt_col, 1);
}

/* A full 64x64 tile with a columnwise copy (r0 a multiple of 64, all present): the maxima
 * pass copies it to a buffer and prefetches the next tile to the right (64 rows a page apart
 * are more streams than the hardware prefetchers follow). Every output line is written by
 * one store: 64 row codes per row, 64 column codes per column. */
AI void mx_tile64(const lowp_quant_job *j, int64_t r0, int64_t c0, lowp_format xf, lowp_format ef,
                  int want_row, int em_ok, int nt_row, int nt_col) {
    const int64_t C = j->cols;
    const size_t es = xsize(xf), stride = (size_t) C * es, pitch = 64 * es;
    const char *base = (const char *) j->x + ((size_t) r0 * (size_t) C + (size_t) c0) * es;
    _Alignas(64) char tile[64 * 64 * 4];
    __m512i rc[2][4]; /* E8M0 codes of block k (columns 32k..) of rows 16q.. */
    __m512i cm[2][4]; /* column maxima of band b (rows 32b..): F32 per 16 columns, BF16 u16 */
    tile64_maxima(base, stride, pitch, xf, want_row, j->et, j->mode, tile, rc, cm);
    if (want_row) tile64_row_side(j, tile, rc, r0, c0, xf, ef, em_ok, nt_row);
    tile64_col_side(j, tile, cm, r0, c0, xf, ef, em_ok, nt_col);
}

/* out[q] qword r = in[r] qword q (an 8x8 transpose of qwords). */
AI void tr8x8q(const __m512i in[8], __m512i out[8]) {
    __m512i lo[4], hi[4], m[4], n[4];
    for (int p = 0; p < 4; p++) { /* lo: columns 0,2,4,6 of rows 2p, 2p+1; hi: 1,3,5,7 */
        lo[p] = _mm512_unpacklo_epi64(in[2 * p], in[2 * p + 1]);
        hi[p] = _mm512_unpackhi_epi64(in[2 * p], in[2 * p + 1]);
    }
    const __m512i ia = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i ib = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    /* m: rows 0-3, n: rows 4-7; [0] columns 0|4, [1] 2|6, [2] 1|5, [3] 3|7 */
    m[0] = _mm512_permutex2var_epi64(lo[0], ia, lo[1]);
    m[1] = _mm512_permutex2var_epi64(lo[0], ib, lo[1]);
    m[2] = _mm512_permutex2var_epi64(hi[0], ia, hi[1]);
    m[3] = _mm512_permutex2var_epi64(hi[0], ib, hi[1]);
    n[0] = _mm512_permutex2var_epi64(lo[2], ia, lo[3]);
    n[1] = _mm512_permutex2var_epi64(lo[2], ib, lo[3]);
    n[2] = _mm512_permutex2var_epi64(hi[2], ia, hi[3]);
    n[3] = _mm512_permutex2var_epi64(hi[2], ib, hi[3]);
    static const int col[4] = {0, 2, 1, 3};
    for (int t = 0; t < 4; t++) {
        out[col[t]] = _mm512_shuffle_i64x2(m[t], n[t], 0x44);
        out[col[t] + 4] = _mm512_shuffle_i64x2(m[t], n[t], 0xEE);
    }
}

/* Column group q (8 columns) of a tile's staged 8x8-byte blocks tb as its 8 whole 64-byte
 * lines of the columnwise copy: a qword transpose. */
AI void col_lines(const uint8_t (*tb)[8][64], int q, uint8_t (*lines)[64]) {
    __m512i v[8], w[8];
    for (int g = 0; g < 8; g++) v[g] = _mm512_load_si512((const __m512i *) tb[g][q]);
    tr8x8q(v, w);
    for (int c = 0; c < 8; c++) _mm512_store_si512((__m512i *) lines[c], w[c]);
}

AI void col_store_line(uint8_t *d, __m512i v, int nt) {
    if (nt)
        _mm512_stream_si512((__m512i *) d, v);
    else
        _mm512_storeu_si512(d, v);
}

/* A cursor over the lines of the band path's next chunk (rows of row_bytes bytes, stride bytes
 * apart, rows_left of them from p), prefetched into L2 two lines per row coded: chunk after
 * chunk, the maxima pass then reads from L2 instead of memory. */
typedef struct band_pf {
    const char *p;
    size_t stride, off, row_bytes;
    int64_t rows_left;
} band_pf;

/* The cursor's next line, if any. */
AI void band_pf_step(band_pf *f) {
    if (f->rows_left <= 0) return;
    prefetch(f->p, f->off);
    f->off += 64;
    if (f->off == f->row_bytes) {
        f->off = 0;
        f->p += f->stride;
        f->rows_left--;
    }
}

/* A tile's columnwise codes, transposed in 8x8-byte blocks ([8-row group][8-column group]),
 * whose lines are still to be stored: rows r0.. of the copy (cout), columns c0...; cc: the
 * band path's carry (col_carry), or NULL. */
typedef struct col_stage {
    _Alignas(64) uint8_t tb[8][8][64];
    uint8_t *cout;
    int64_t c0;
    int have;
    col_carry *cc;
} col_stage;

/* Column c's 64 codes v, from d in the copy: stored as they are (col_store_line) without a
 * carry or when d starts a line; else the line d is in, its first a bytes from the carry when
 * it holds them (then the whole line, non-temporal with nt) or left as they are (a masked
 * store), and the rest of v into the carry. */
AIV void col_put(col_carry *cc, int64_t c, uint8_t *d, __m512i v, int nt) {
    const unsigned a = (unsigned) ((uintptr_t) d & 63);
    if (!cc || a == 0) {
        col_store_line(d, v, nt);
        return;
    }
    const __m512i idx = _mm512_and_si512(_mm512_sub_epi8(ld64(k_iota), _mm512_set1_epi8((char) a)),
                                         _mm512_set1_epi8(63));
    const __m512i rot = _mm512_permutexvar_epi8(idx, v); /* rot[i] = v[(i - a) mod 64] */
    uint8_t *line = d - a, *slot = cc->buf + 64 * (size_t) c;
    if (cc->have[c])
        col_store_line(
            line, _mm512_mask_blend_epi8(mask64(a), rot, _mm512_load_si512((__m512i *) slot)), nt);
    else
        _mm512_mask_storeu_epi8(line, ~mask64(a), rot);
    _mm512_store_si512((__m512i *) slot, rot);
    cc->have[c] = 1;
}

/* Stores all of a staged tile's lines. */
AIV void col_stage_flush(col_stage *s, size_t cob, int nt) {
    for (int q = 0; q < 8; q++) {
        _Alignas(64) uint8_t lines[8][64];
        col_lines((const uint8_t(*)[8][64]) s->tb, q, lines);
        for (int c = 0; c < 8; c++)
            col_put(s->cc, s->c0 + 8 * q + c, s->cout + (size_t) (s->c0 + 8 * q + c) * cob,
                    _mm512_load_si512((const __m512i *) lines[c]), nt);
    }
    s->have = 0;
}

/* mx_tile64b_enc's column scales: the E8M0 codes of its two 32-row blocks from the column
 * maxima cm, into ccode, and stored to the copy's scales (or to the band path's staging, two
 * rows at cst and cst + cst_ld); returns 0 having stored nothing when a code is below bias or
 * 0xFF. */
AIV int tile64b_col_scales(const lowp_quant_job *j, int64_t r0, int64_t c0, lowp_format ef,
                           const __m512i cm[2][2], uint8_t *cst, size_t cst_ld,
                           uint8_t ccode[2][64]) {
    __mmask16 bad = 0;
    const __m512i lowc = V32(ef_bias(ef)), nanc = V32(0xFF);
    for (int b = 0; b < 2; b++)
        for (int q = 0; q < 4; q++) {
            const __m256i h = q & 1 ? _mm512_extracti64x4_epi64(cm[b][q / 2], 1)
                                    : _mm512_castsi512_si256(cm[b][q / 2]);
            const __m512i cv =
                e8m0_codes(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16), j->et, j->mode);
            bad |= _mm512_cmplt_epu32_mask(cv, lowc) | _mm512_cmpeq_epi32_mask(cv, nanc);
            _mm_store_si128((__m128i *) (ccode[b] + 16 * q), _mm512_cvtepi32_epi8(cv));
        }
    if (bad) return 0;
    if (cst) { /* the band path's staging, two rows of column scales (SC_GROUP_BLOCKS) */
        _mm512_store_si512((__m512i *) cst, ld64(ccode[0]));
        _mm512_store_si512((__m512i *) (cst + cst_ld), ld64(ccode[1]));
    } else {
        const int64_t nbr = j->col_nbr;
        uint8_t *sc = (uint8_t *) j->col->scales + (size_t) (r0 / 32) + (size_t) c0 * (size_t) nbr;
        for (int c = 0; c < 64; c++) {
            const uint16_t pair = (uint16_t) (ccode[0][c] | ccode[1][c] << 8);
            memcpy(sc + (size_t) c * (size_t) nbr, &pair, 2);
        }
    }
    return 1;
}

/* From the column scale codes ccode of block b: ec[b], its Eoff in every byte, and offc[b], the
 * code offsets btiny takes for its two 32-column halves. */
AIV void tile64b_offsets(const uint8_t ccode[2][64], lowp_format ef, __m512i ec[2],
                         __m512i offc[2][2]) {
    const int bias = ef_bias(ef), mb = ef_mbits(ef);
    const __m512i vb = _mm512_set1_epi8((char) bias);
    for (int b = 0; b < 2; b++) {
        ec[b] = _mm512_sub_epi8(ld64(ccode[b]), vb);
        for (int h = 0; h < 2; h++)
            offc[b][h] = _mm512_slli_epi16(
                _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *) (ccode[b] + 32 * h))), mb);
    }
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 2; h++)
            offc[b][h] = _mm512_sub_epi16(offc[b][h], _mm512_set1_epi16((short) (bias << mb)));
}

/* A row's lanes k (E <= the larger Eoff: zeros, or below the smallest normal of a copy's
 * scale) that are not zeros, encoded again by btiny: in *cc those below the column block's
 * (Eoff ecb, offsets offc), in *rr (with want_row) those below the row's (Eoff er, codes rc0 and
 * rc1 of its two halves). */
AIV void tile64b_tiny(__mmask64 k, __m512i E, __m512i L, __m512i x0, __m512i x1, __m512i ecb,
                      const __m512i offc[2], __m512i er, int rc0, int rc1, lowp_format ef,
                      int want_row, __m512i *cc, __m512i *rr) {
    const int bias = ef_bias(ef), mb = ef_mbits(ef);
    const __m512i nz = _mm512_or_si512(E, L);
    k &= _mm512_test_epi8_mask(nz, nz);
    const __mmask64 kc = k & _mm512_cmple_epu8_mask(E, ecb);
    if (kc) *cc = _mm512_mask_mov_epi8(*cc, kc, btiny(x0, x1, offc[0], offc[1], ef));
    const __mmask64 kr = want_row ? k & _mm512_cmple_epu8_mask(E, er) : 0;
    if (kr)
        *rr = _mm512_mask_mov_epi8(*rr, kr,
                                   btiny(x0, x1, _mm512_set1_epi16((short) ((rc0 - bias) << mb)),
                                         _mm512_set1_epi16((short) ((rc1 - bias) << mb)), ef));
}

/* A row's 64 codes v of the row copy to d: through the row carry rc (row i of the tile) when
 * there is one, else stored, non-temporal with nt. */
AIV void tile64b_row_put(col_carry *rc, int64_t i, uint8_t *d, __m512i v, int nt) {
    if (rc)
        col_put(rc, i, d, v, 1);
    else if (nt)
        _mm512_stream_si512((__m512i *) d, v);
    else
        _mm512_storeu_si512(d, v);
}

/* mx_tile64b's codes of both copies, the scales of the rows already stored (want_row): the
 * column scales from the column maxima cm ([32-row block][32-column half], u16 |x| patterns),
 * then each row's codes of both copies from one split of its 64 elements. The columnwise codes
 * are transposed in registers (8x8-byte blocks by a qword transpose and one vpermb per 8 rows)
 * and staged in cur; their lines (a qword transpose per 8 columns) are stored at the end, or,
 * with prev (the band path), during the next tile: prev's column group g one line per row of
 * row group g, so that the non-temporal stores of both copies are spread evenly over the work
 * (stored in bursts at the end of each tile, they stalled it); with pf (the band path, or
 * NULL), two of the next chunk's lines prefetched per row. The column scales go to the copy,
 * or with cst (the band path's staging, or NULL) to two 64-byte rows of it, at cst and
 * cst + cst_ld. Returns 0 having written nothing more when a column block's scale code is
 * below bias or 0xFF. */
AIV int mx_tile64b_enc(const lowp_quant_job *j, int64_t r0, int64_t c0, lowp_format ef,
                       int want_row, int clip, int nt_row, int nt_col, const __m512i cm[2][2],
                       col_stage *cur, col_stage *prev, band_pf *pf, uint8_t *cst, size_t cst_ld,
                       col_carry *rc) {
    const int64_t C = j->cols;
    const size_t stride = (size_t) C * 2;
    const char *base = (const char *) j->x + ((size_t) r0 * (size_t) C + (size_t) c0) * 2;
    const int bias = ef_bias(ef);
    _Alignas(64) uint8_t ccode[2][64];
    if (!tile64b_col_scales(j, r0, c0, ef, cm, cst, cst_ld, ccode)) return 0;
    const int64_t nbc = (C + 31) / 32;
    const uint8_t *rsc = want_row ? (const uint8_t *) j->row->scales + (size_t) r0 * (size_t) nbc +
                                        (size_t) (c0 / 32)
                                  : NULL;
    __m512i ec[2], offc[2][2];
    tile64b_offsets(ccode, ef, ec, offc);
    const uint8_t *t0 = ef == LOWP_FORMAT_E4M3 ? k_t0_e4m3 : k_t0_e5m2;
    const __m512i ta = ld64(t0), tb = ld64(t0 + 64);
    const __m512i db = ld64(ef == LOWP_FORMAT_E4M3 ? k_db_e4m3 : k_db_e5m2);
    const size_t ob = (size_t) C;
    uint8_t *rout = want_row ? (uint8_t *) j->row->data + (size_t) r0 * ob + (size_t) c0 : NULL;
    uint8_t(*tbuf)[8][64] = cur->tb; /* [8-row group][8-column group]: transposed blocks */
    const size_t cob = j->col_ob;
    const int pend = prev && prev->have;
    for (int g = 0; g < 8; g++) {
        __m512i cr[8], ct[8];
        _Alignas(64) uint8_t lines[8][64];
        if (pend) /* column group g of the previous tile, stored one line per row below */
            col_lines(prev->tb, g, lines);
        for (int r = 0; r < 8; r++) {
            const int i = 8 * g + r, b = i >> 5;
            const char *p = base + (size_t) i * stride;
            if (pf) {
                band_pf_step(pf);
                band_pf_step(pf);
            }
            if (pend)
                col_put(prev->cc, prev->c0 + 8 * g + r,
                        prev->cout + (size_t) (prev->c0 + 8 * g + r) * cob,
                        _mm512_load_si512((const __m512i *) lines[r]), nt_col);
            const __m512i x0 = _mm512_loadu_si512(p), x1 = _mm512_loadu_si512(p + 64);
            __m512i E, L, H;
            bsplit(x0, x1, &E, &L, &H);
            const __m512i T = _mm512_permutex2var_epi8(ta, L, tb);
            __m512i er = ec[b], mx = ec[b];
            int rc0 = 0, rc1 = 0; /* the row's scale codes */
            if (want_row) {
                rc0 = rsc[(size_t) i * (size_t) nbc];
                rc1 = rsc[(size_t) i * (size_t) nbc + 1];
                er = _mm512_mask_blend_epi8(0xFFFFFFFF00000000ull,
                                            _mm512_set1_epi8((char) (rc0 - bias)),
                                            _mm512_set1_epi8((char) (rc1 - bias)));
                mx = _mm512_max_epu8(er, ec[b]);
            }
            __m512i cc = bmag(E, T, ec[b], db, ef, clip);
            __m512i rr = want_row ? bmag(E, T, er, db, ef, clip) : cc;
            __mmask64 k = _mm512_cmple_epu8_mask(E, mx);
            if (__builtin_expect(k != 0, 0)) /* zeros, or lanes below the smallest normal */
                tile64b_tiny(k, E, L, x0, x1, ec[b], offc[b], er, rc0, rc1, ef, want_row, &cc, &rr);
            if (want_row) tile64b_row_put(rc, i, rout + (size_t) i * ob, bsign(H, rr), nt_row);
            cr[r] = bsign(H, cc);
        }
        tr8x8q(cr, ct);
        const __m512i t8 = ld64(k_tr8);
        for (int q = 0; q < 8; q++)
            _mm512_store_si512((__m512i *) tbuf[g][q], _mm512_permutexvar_epi8(t8, ct[q]));
    }
    cur->cout = (uint8_t *) j->col->data + (size_t) r0;
    cur->c0 = c0;
    cur->have = 1;
    if (prev)
        prev->have = 0;
    else /* no next tile to store them during */
        col_stage_flush(cur, cob, nt_col);
    return 1;
}

/* mx_tile64 on the byte encoder: the same tile, outputs and order of work (maxima and scales,
 * then each row's codes of both copies from one split of its 64 elements, mx_tile64b_enc). The
 * rows are read again from x, not copied to a buffer first (8 KiB apart, they miss L1 on the
 * second reading but stay in L2). Returns 0 when a block's scale code is below bias (its Eoff
 * would be negative) or 0xFF (NaN and Inf blocks), having written at most the row scales: the
 * caller runs mx_tile64 then. */
AIV int mx_tile64b(const lowp_quant_job *j, int64_t r0, int64_t c0, lowp_format ef, int want_row,
                   int clip, int nt_row, int nt_col) {
    const int64_t C = j->cols;
    const size_t stride = (size_t) C * 2;
    const char *base = (const char *) j->x + ((size_t) r0 * (size_t) C + (size_t) c0) * 2;
    __m512i rc[2][4], cm[2][2];
    for (int b = 0; b < 2; b++) {
        __m512i c[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int g = 2 * b; g < 2 * b + 2; g++) {
            __m512i rm[2][16];
            for (int r = 0; r < 16; r++) {
                const char *p = base + (size_t) (16 * g + r) * stride;
                prefetch(p, 128);
                prefetch(p, 192);
                for (int k = 0; k < 2; k++) {
                    const __m512i v = _mm512_loadu_si512(p + 64 * k);
                    rm[k][r] = _mm512_and_si512(v, V32(0x7FFF7FFF));
                    c[k] = _mm512_max_epu16(c[k], rm[k][r]);
                }
            }
            if (want_row)
                for (int k = 0; k < 2; k++) rc[k][g] = e8m0_codes(tree16(rm[k], 1), j->et, j->mode);
        }
        cm[b][0] = c[0];
        cm[b][1] = c[1];
    }
    if (want_row) {
        const int bias = ef_bias(ef);
        _Alignas(64) uint8_t rcode[2][64];
        __mmask16 bad = 0;
        for (int b = 0; b < 2; b++)
            for (int q = 0; q < 4; q++) {
                const __m512i rv = rc[b][q];
                bad |=
                    _mm512_cmplt_epu32_mask(rv, V32(bias)) | _mm512_cmpeq_epi32_mask(rv, V32(0xFF));
                _mm_store_si128((__m128i *) (rcode[b] + 16 * q), _mm512_cvtepi32_epi8(rv));
            }
        if (bad) return 0;
        /* the row scales, as tile64_row_side stores them */
        const int64_t nbc = (C + 31) / 32;
        uint8_t *sc = (uint8_t *) j->row->scales + (size_t) r0 * (size_t) nbc + (size_t) (c0 / 32);
        for (int i = 0; i < 64; i++) {
            const uint16_t pair = (uint16_t) (rcode[0][i] | rcode[1][i] << 8);
            memcpy(sc + (size_t) i * (size_t) nbc, &pair, 2);
        }
    }
    col_stage st;
    st.cc = NULL;
    return mx_tile64b_enc(j, r0, c0, ef, want_row, clip, nt_row, nt_col, (const __m512i(*)[2]) cm,
                          &st, NULL, NULL, NULL, 0, NULL);
}

/* mx_tile64b with the job's flags as constants. */
#define MX_TILE64B(NAME, EF)                                                                       \
    NIV int NAME(const lowp_quant_job *j, int64_t r0, int64_t c0, int nt_row, int nt_col) {        \
        if (j->row)                                                                                \
            return clip_of(j) ? mx_tile64b(j, r0, c0, EF, 1, 1, nt_row, nt_col)                    \
                              : mx_tile64b(j, r0, c0, EF, 1, 0, nt_row, nt_col);                   \
        return clip_of(j) ? mx_tile64b(j, r0, c0, EF, 0, 1, 0, nt_col)                             \
                          : mx_tile64b(j, r0, c0, EF, 0, 0, 0, nt_col);                            \
    }
MX_TILE64B(mx_tile64b_e4m3, LOWP_FORMAT_E4M3)
MX_TILE64B(mx_tile64b_e5m2, LOWP_FORMAT_E5M2)

/* ---- the band path of the dual-axis byte encoder ---- */

/* Super-bands of at most BAND_ROWS rows, in chunks of at most BAND_EL elements (256 KiB of BF16,
 * in L2 between the two phases). Measured (8192x4096): before the next chunk was prefetched
 * (band_pf), 256 rows by 512 columns beat 64, 128 and 512 rows on one thread (512: 1.2x
 * slower), and 64K-element and 256K-element chunks were slower. With the prefetch, on one
 * thread, 64 rows by 512 columns (BAND_ROWS_1) beat 256 by 1.1-1.3x (8192x4096, 4096x4096,
 * 16384x2048; other shapes within noise), while on two threads they were 1.3x slower than 256
 * (the column scales' scattered 2-byte stores: skipped, timing only, 64 rows on two threads
 * ran 1.9x faster). With those scales staged (SC_GROUP_BLOCKS), 64 rows beat 128 and 256 on
 * two threads too (8192x4096: 4.4-4.5 ms against 4.5-5.0 and 5.5-5.8): so 64 rows whenever the
 * scales are staged, and otherwise when one call takes every row of the input, 256 else
 * (docs/bench-log/quant.md, "Seventeenth session" and "Eighteenth session"). */
#define BAND_ROWS   256
#define BAND_ROWS_1 64
#define BAND_EL     ((int64_t) 1 << 17)
/* Inputs of at least this many bytes have each chunk's successor prefetched (band_pf): 8192x4096,
 * one thread, 1.08-1.19x (two sets of alternating runs); 4096x2048 1.06-1.10x;
 * 2048x1024 1.04-1.07x; 1000x1030, in cache, 1.04-1.07x slower with it. */
#define BAND_PF_MIN_BYTES ((size_t) 4 << 20)

/* The band path's column scales, staged (SC_GROUP_BLOCKS): the codes of SC_GROUP_BLOCKS 32-row
 * blocks (2048 rows) of every column, one staging row per block, written by band_codes two
 * whole 64-byte rows a tile and stored, once the group's rows are done, as one 64-byte line
 * per column (scale_flush). Stored directly, two bytes per column and 64 lines 256 bytes
 * apart a tile (8192x4096), they cost 1-4 ms of an 8192x4096 call (docs/bench-log/quant.md,
 * "Seventeenth session"); staged, the call took 9.5-9.8 ms on one thread against 11.0-11.5,
 * and with 64-row super-bands on two threads 4.4-4.5 against 6.0-6.2 (256 rows, direct):
 * "Eighteenth session". Taken when the staging (SC_GROUP_BLOCKS rows of the whole tiles'
 * columns) is at most SC_STAGE_MAX_BYTES (inputs up to 65536 columns) and can be allocated. */
#define SC_GROUP_BLOCKS    64
#define SC_STAGE_MAX_BYTES ((size_t) 4 << 20)

/* A chunk: nb 64-row bands from r0, columns [w0, w0 + w) (w a multiple of 64); cm: the column
 * maxima of each 32-row block (w u16 |x| patterns each, memory order); bad[b] bit t: tile t of
 * band b, which the byte encoder does not take; pf: the next chunk's lines, to prefetch; cst:
 * the column scales' staging (row b of it: block b of its group), cst_ld bytes a row. */
typedef struct band_chunk {
    int64_t r0, w0, w;
    int nb;
    uint64_t bad[BAND_ROWS / 64];
    band_pf pf;
    uint8_t *cst; /* column-scale staging (SC_GROUP_BLOCKS) or NULL */
    size_t cst_ld;
    col_carry *cc; /* or NULL */
    col_carry *rc; /* the row copy's carry (64 rows), or NULL */
    _Alignas(64) uint16_t cm[BAND_EL / 32];
} band_chunk;

/* 16 blocks of one row at p (n of them, even; full: n == 16): the column maxima into cm
 * (stored, for the first row of a 32-row block), the row codes to rs and, for a code the byte
 * encoder does not take, the mark of its tile (t0 + block / 2) in *bad. */
AIV void band_row16(const lowp_quant_job *j, const uint16_t *p, uint16_t *cm, int first,
                    int want_row, uint8_t *rs, int n, int full, int bias, uint64_t *bad, int t0) {
    __m512i rm[16];
    for (int k = 0; k < 16; k++) {
        if (!full && k >= n) {
            rm[k] = _mm512_setzero_si512();
            continue;
        }
        const __m512i a = _mm512_and_si512(_mm512_loadu_si512(p + 32 * k), V32(0x7FFF7FFF));
        __m512i *q = (__m512i *) (cm + 32 * k);
        rm[k] = a;
        _mm512_store_si512(q, first ? a : _mm512_max_epu16(_mm512_load_si512(q), a));
    }
    if (!want_row) return;
    const __m512i code = e8m0_codes(tree16(rm, 1), j->et, j->mode);
    const __mmask16 m = full ? (__mmask16) 0xFFFF : mask16(n);
    _mm512_mask_cvtepi32_storeu_epi8(rs, m, code);
    const __mmask16 b =
        (_mm512_cmplt_epu32_mask(code, V32(bias)) | _mm512_cmpeq_epi32_mask(code, V32(0xFF))) & m;
    if (__builtin_expect(b != 0, 0))
        for (int t = 0; t < 8; t++)
            if ((b >> (2 * t)) & 3) *bad |= 1ull << (t0 + t);
}

/* The band path's first phase: chunk k's maxima, read row by row in runs of w elements, which
 * the hardware prefetchers follow (mx_tile64b reads 64 rows of 128 bytes a tile, more streams
 * than they track): the row codes to the row scales, the column maxima to k->cm, marks to
 * k->bad. */
AIV void band_maxima(const lowp_quant_job *j, band_chunk *k, lowp_format ef, int want_row) {
    const int64_t C = j->cols, nbc = (C + 31) / 32, w = k->w;
    const int bias = ef_bias(ef);
    for (int b = 0; b < k->nb; b++) k->bad[b] = 0;
    for (int i = 0; i < 64 * k->nb; i++) {
        const uint16_t *p =
            (const uint16_t *) j->x + (size_t) (k->r0 + i) * (size_t) C + (size_t) k->w0;
        uint16_t *c = k->cm + (size_t) (i >> 5) * (size_t) w;
        uint8_t *rs = want_row ? (uint8_t *) j->row->scales + (size_t) (k->r0 + i) * (size_t) nbc +
                                     (size_t) (k->w0 / 32)
                               : NULL;
        uint64_t *bb = k->bad + (i >> 6);
        const int first = (i & 31) == 0;
        int64_t g = 0;
        for (; g + 512 <= w; g += 512)
            band_row16(j, p + g, c + g, first, want_row, rs ? rs + g / 32 : NULL, 16, 1, bias, bb,
                       (int) (g / 64));
        if (g < w)
            band_row16(j, p + g, c + g, first, want_row, rs ? rs + g / 32 : NULL,
                       (int) ((w - g) / 32), 0, bias, bb, (int) (g / 64));
    }
}

/* With the row copy's carry (one super-band of 64 rows, k->nb 1), the carried bytes of each
 * row into the first line of the tile at chunk column c, which mx_tile64 stores later. */
NIV void row_carry_out(const lowp_quant_job *j, band_chunk *k, int64_t c) {
    if (!k->rc) return;
    uint8_t *d =
        (uint8_t *) j->row->data + (size_t) k->r0 * (size_t) j->cols + (size_t) (k->w0 + c);
    for (int i = 0; i < 64; i++) col_carry_out(k->rc, i, d + (size_t) i * (size_t) j->cols);
}

/* The band path's second phase: chunk k's tiles (in L2 now), column by column, by
 * mx_tile64b_enc from the column maxima and the row scales, each tile's column lines stored
 * during the next one's rows. Tiles it does not take stay marked in k->bad. */
AIV void band_codes(const lowp_quant_job *j, band_chunk *k, lowp_format ef, int want_row, int clip,
                    int nt_row, int nt_col) {
    const int64_t w = k->w;
    col_stage stg[2];
    int cs = 0;
    stg[0].have = stg[1].have = 0;
    stg[0].cc = stg[1].cc = k->cc;
    band_pf *pf = k->pf.rows_left > 0 ? &k->pf : NULL;
    for (int64_t c = 0; c < w; c += 64)
        for (int b = 0; b < k->nb; b++) {
            if (k->bad[b] >> (c / 64) & 1) {
                row_carry_out(j, k, c);
                continue;
            }
            __m512i m[2][2];
            for (int h = 0; h < 2; h++)
                for (int q = 0; q < 2; q++)
                    m[h][q] = _mm512_load_si512(k->cm + (size_t) (2 * b + h) * (size_t) w +
                                                (size_t) c + 32 * (size_t) q);
            uint8_t *cst =
                k->cst ? k->cst + (size_t) ((k->r0 / 32 + 2 * b) % SC_GROUP_BLOCKS) * k->cst_ld +
                             (size_t) (k->w0 + c)
                       : NULL;
            if (mx_tile64b_enc(j, k->r0 + 64 * b, k->w0 + c, ef, want_row, clip, nt_row, nt_col,
                               (const __m512i(*)[2]) m, &stg[cs], &stg[cs ^ 1], pf, cst, k->cst_ld,
                               k->rc))
                cs ^= 1;
            else {
                k->bad[b] |= 1ull << (c / 64);
                row_carry_out(j, k, c);
            }
        }
    if (stg[cs ^ 1].have) col_stage_flush(&stg[cs ^ 1], j->col_ob, nt_col);
}

/* Both phases of a chunk with the job's flags as constants. */
#define MX_BAND64B(NAME, EF)                                                                       \
    NIV void NAME(const lowp_quant_job *j, band_chunk *k, int nt_row, int nt_col) {                \
        if (j->row) {                                                                              \
            band_maxima(j, k, EF, 1);                                                              \
            clip_of(j) ? band_codes(j, k, EF, 1, 1, nt_row, nt_col)                                \
                       : band_codes(j, k, EF, 1, 0, nt_row, nt_col);                               \
        } else {                                                                                   \
            band_maxima(j, k, EF, 0);                                                              \
            clip_of(j) ? band_codes(j, k, EF, 0, 1, 0, nt_col)                                     \
                       : band_codes(j, k, EF, 0, 0, 0, nt_col);                                    \
        }                                                                                          \
    }
MX_BAND64B(mx_band64b_e4m3, LOWP_FORMAT_E4M3)
MX_BAND64B(mx_band64b_e5m2, LOWP_FORMAT_E5M2)

/* Staged rows [lo, hi) of the group of column-scale blocks from block gb (st: its staging,
 * ld bytes a row; C64 columns) into the copy's scales: 64x64-byte transposes, and lines
 * stored under a mask of those rows (a thread's rows may start or end inside a group; the
 * grouped path's spans need not be aligned). */
NIV void scale_flush(const lowp_quant_job *j, const uint8_t *st, size_t ld, int64_t C64, int64_t gb,
                     int lo, int hi) {
    const int64_t nbr = j->col_nbr;
    const __mmask64 m = mask64(hi) & ~mask64(lo);
    const __m512i t8 = ld64(k_tr8);
    uint8_t *sc = (uint8_t *) j->col->scales + (size_t) gb;
    for (int64_t c0 = 0; c0 < C64; c0 += 64) {
        _Alignas(64) uint8_t tb[8][8][64];
        for (int g = 0; g < 8; g++) {
            __m512i v[8], t[8];
            for (int r = 0; r < 8; r++) /* rows outside [lo, hi) were not staged */
                v[r] = 8 * g + r >= lo && 8 * g + r < hi
                           ? _mm512_load_si512(
                                 (const __m512i *) (st + (size_t) (8 * g + r) * ld + (size_t) c0))
                           : _mm512_setzero_si512();
            tr8x8q(v, t);
            for (int q = 0; q < 8; q++)
                _mm512_store_si512((__m512i *) tb[g][q], _mm512_permutexvar_epi8(t8, t[q]));
        }
        for (int q = 0; q < 8; q++) {
            _Alignas(64) uint8_t lines[8][64];
            col_lines((const uint8_t(*)[8][64]) tb, q, lines);
            for (int c = 0; c < 8; c++)
                _mm512_mask_storeu_epi8(sc + (size_t) (c0 + 8 * q + c) * (size_t) nbr, m,
                                        _mm512_load_si512((const __m512i *) lines[c]));
        }
    }
}

/* The carries of columns [c0, c1) into the lines of their rows from r: the line after each
 * column's last segment (r: where it ended), or the first line of a segment stored without
 * col_put (r: where it starts; the fallback's tiles). */
NIV void col_carry_flush(col_carry *cc, const lowp_quant_job *j, int64_t c0, int64_t c1,
                         int64_t r) {
    for (int64_t c = c0; c < c1; c++)
        col_carry_out(cc, c, (uint8_t *) j->col->data + (size_t) c * j->col_ob + (size_t) r);
}

/* mx_bands on the byte encoder's band path (BF16 input, 8-bit codes, r0 a multiple of 64, at
 * least 64 rows and columns): super-bands of br rows in chunks of whole tiles, each
 * chunk's maxima read first (band_maxima) and its codes then taken from L2 (band_codes); the
 * tiles it does not take by mx_tile64 (their column scales copied into the staging), the
 * edges (the last columns short of 64, the last rows short of 64) by mx_tile32. With staged
 * column scales the super-bands have 64 rows (BAND_ROWS), so that none crosses a group's end,
 * and each group is stored when its last super-band is done. One thread, 8192x4096, against
 * mx_tile64b tile by tile: see docs/bench-log/quant.md ("Fifteenth session"). */
AI void mx_bands_b(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
                   int em_ok, int nt_row, int nt_col, int col_big, int row_big) {
    const int64_t C = j->cols, C64 = C & ~(int64_t) 63, rend = r0 + (r1 - r0) / 64 * 64;
    const int64_t W = min64(C64, BAND_EL / BAND_ROWS); /* a multiple of 64 */
    const int pf = (size_t) j->rows * (size_t) C * 2 >= BAND_PF_MIN_BYTES;
    _Alignas(64) band_chunk chunk;
    band_chunk *k = &chunk;
    const size_t ld = (size_t) C64; /* a multiple of 64 */
    /* the carry: with staged scales (64-row super-bands, so that each column's segments come
     * in order), for a copy large enough for non-temporal stores whose rows are not lines */
    const int carry = col_big && !nt_col;
    uint8_t *st = ld * SC_GROUP_BLOCKS <= SC_STAGE_MAX_BYTES
                      ? aligned_alloc(64, ld * (SC_GROUP_BLOCKS + (carry ? 65 : 0)))
                      : NULL;
    const int sd = st != NULL;
    k->cst = st;
    k->cst_ld = ld;
    col_carry cc = {NULL, NULL};
    k->cc = NULL;
    if (sd && carry) {
        cc.buf = st + ld * SC_GROUP_BLOCKS;
        cc.have = cc.buf + ld * 64;
        memset(cc.have, 0, ld);
        k->cc = &cc;
    }
    const int ntc = k->cc ? 1 : nt_col; /* the band path's column lines */
    /* the same for the row copy, along each row of a super-band */
    _Alignas(64) uint8_t rbuf[64 * 64], rhave[64];
    col_carry rc = {rbuf, rhave};
    k->rc = sd && j->row && row_big && !nt_row ? &rc : NULL;
    memset(rhave, 0, sizeof rhave); /* and emptied again at the end of each super-band */
    /* see BAND_ROWS and SC_GROUP_BLOCKS */
    const int64_t br = sd || (r0 == 0 && r1 == j->rows) ? BAND_ROWS_1 : BAND_ROWS;
    for (int64_t sb = r0, se; sb < rend; sb = se) {
        se = min64(sb + br, rend);
        k->r0 = sb;
        k->nb = (int) (se - sb) / 64;
        for (k->w0 = 0; k->w0 < C64; k->w0 += W) {
            k->w = min64(W, C64 - k->w0);
            /* the next chunk: the next columns of this super-band, or the next super-band's
             * first columns */
            const int64_t nw0 = k->w0 + W < C64 ? k->w0 + W : 0, nr0 = nw0 ? sb : se;
            k->pf.p = (const char *) j->x + ((size_t) nr0 * (size_t) C + (size_t) nw0) * 2;
            k->pf.stride = (size_t) C * 2;
            k->pf.off = 0;
            k->pf.row_bytes = (size_t) min64(W, C64 - nw0) * 2;
            k->pf.rows_left = pf ? min64(nr0 + br, rend) - nr0 : 0; /* <= 0: none */
            if (ef == LOWP_FORMAT_E4M3)
                mx_band64b_e4m3(j, k, nt_row, ntc);
            else
                mx_band64b_e5m2(j, k, nt_row, ntc);
            for (int b = 0; b < k->nb; b++)
                for (int64_t c = 0; c < k->w; c += 64)
                    if (k->bad[b] >> (c / 64) & 1) {
                        const int64_t rt = sb + 64 * b, ct = k->w0 + c;
                        if (k->cc) col_carry_flush(k->cc, j, ct, ct + 64, rt);
                        mx_tile64(j, rt, ct, xf, ef, j->row != NULL, em_ok, nt_row, nt_col);
                        if (st) { /* its column scales, into the staging */
                            const uint8_t *cs =
                                (const uint8_t *) j->col->scales + (size_t) (rt / 32);
                            for (int h = 0; h < 2; h++) {
                                uint8_t *d = st + (size_t) ((rt / 32 + h) % SC_GROUP_BLOCKS) * ld +
                                             (size_t) ct;
                                for (int64_t q = 0; q < 64; q++)
                                    d[q] = cs[(size_t) (ct + q) * (size_t) j->col_nbr + (size_t) h];
                            }
                        }
                    }
        }
        if (k->rc) row_carry_out(j, k, C64 - k->w0); /* after each row's last segment */
        for (int64_t r = sb; r < se; r += 32)        /* the last columns */
            for (int64_t c = C64; c < C; c += 32)
                mx_tile32(j, r, 32, c, min64(C - c, 32), xf, ef, em_ok);
        if (st && (se % (32 * SC_GROUP_BLOCKS) == 0 || se == rend)) {
            const int64_t gb = (se - 1) / 32 / SC_GROUP_BLOCKS * SC_GROUP_BLOCKS;
            scale_flush(j, st, ld, C64, gb, (int) (gb > r0 / 32 ? 0 : r0 / 32 - gb),
                        (int) (se / 32 - gb));
        }
    }
    if (k->cc && rend > r0) /* the carries, into the lines after the last segments */
        col_carry_flush(k->cc, j, 0, C64, rend);
    free(st);
    for (int64_t r = rend; r < r1; r += 32) /* the last rows */
        for (int64_t c = 0; c < C; c += 32)
            mx_tile32(j, r, min64(r1 - r, 32), c, min64(C - c, 32), xf, ef, em_ok);
}

/* MX32 with a columnwise copy over rows [r0, r1) (r0 a multiple of 32). 256-row super-bands,
 * swept left to right in 64x64 tiles (edges in 32x32 tiles). col_big: the columnwise copy is
 * large enough for non-temporal stores (nt_col: and its rows are whole lines). */
AI void mx_bands(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
                 int em_ok, int nt_row, int nt_col, int col_big, int row_big) {
    const int64_t C = j->cols;
    const int vb = em_ok && have_vbmi();
    if (vb && xf != F32 && ef != E2M1 && r0 % 64 == 0 && r1 - r0 >= 64 && C >= 64) {
        mx_bands_b(j, r0, r1, xf, ef, em_ok, nt_row, nt_col, col_big, row_big);
        return;
    }
    for (int64_t sb = r0; sb < r1; sb += 256) {
        const int64_t se = min64(sb + 256, r1);
        for (int64_t c0 = 0; c0 < C; c0 += 64) {
            for (int64_t r = sb; r < se; r += 64) {
                if (r + 64 <= se && c0 + 64 <= C && r % 64 == 0) {
                    const int ntc = nt_col; /* r % 64 == 0: output lines are whole */
                    if (vb && xf != F32 && ef != E2M1 &&
                        (ef == LOWP_FORMAT_E4M3 ? mx_tile64b_e4m3(j, r, c0, nt_row, ntc)
                                                : mx_tile64b_e5m2(j, r, c0, nt_row, ntc)))
                        continue;
                    if (j->row)
                        mx_tile64(j, r, c0, xf, ef, 1, em_ok, nt_row, ntc);
                    else
                        mx_tile64(j, r, c0, xf, ef, 0, em_ok, nt_row, ntc);
                    continue;
                }
                for (int64_t rr = r; rr < min64(r + 64, se); rr += 32)
                    for (int64_t cc = c0; cc < min64(c0 + 64, C); cc += 32)
                        mx_tile32(j, rr, min64(se - rr, 32), cc, min64(C - cc, 32), xf, ef, em_ok);
            }
        }
    }
}

/* ---- the family's entry ---- */

/* Rows [r0, r1) of an MX32 job: both copies from one read, or the rowwise copy alone. */
AI void mx_run(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
               const q512_plan *p) {
    if (j->col)
        mx_bands(j, r0, r1, xf, ef, p->em_ok, p->nt_row, p->nt_col, p->col_big, p->row_big);
    else
        mx_rows(j, r0, r1, xf, ef, p->em_ok, p->nt_row);
}

Q512_INSTANCE(mx_f32_e4m3, mx_run, LOWP_FORMAT_F32, LOWP_FORMAT_E4M3)
Q512_INSTANCE(mx_f32_e5m2, mx_run, LOWP_FORMAT_F32, LOWP_FORMAT_E5M2)
Q512_INSTANCE(mx_f32_e2m1, mx_run, LOWP_FORMAT_F32, LOWP_FORMAT_E2M1)
Q512_INSTANCE(mx_bf16_e4m3, mx_run, LOWP_FORMAT_BF16, LOWP_FORMAT_E4M3)
Q512_INSTANCE(mx_bf16_e5m2, mx_run, LOWP_FORMAT_BF16, LOWP_FORMAT_E5M2)
Q512_INSTANCE(mx_bf16_e2m1, mx_run, LOWP_FORMAT_BF16, LOWP_FORMAT_E2M1)

void lowp_cpu_q512_mx(const lowp_quant_job *j, int64_t r0, int64_t r1, const q512_plan *p) {
    const int bf = j->xfmt == LOWP_FORMAT_BF16;
    switch (j->efmt) {
    case LOWP_FORMAT_E4M3: bf ? mx_bf16_e4m3(j, r0, r1, p) : mx_f32_e4m3(j, r0, r1, p); return;
    case LOWP_FORMAT_E5M2: bf ? mx_bf16_e5m2(j, r0, r1, p) : mx_f32_e5m2(j, r0, r1, p); return;
    case LOWP_FORMAT_E2M1: bf ? mx_bf16_e2m1(j, r0, r1, p) : mx_f32_e2m1(j, r0, r1, p); return;
    default: lowp_cpu_quant_ref(j, r0, r1); return;
    }
}
