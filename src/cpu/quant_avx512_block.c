/* AVX-512 quantization, the Block FP8 family: LOWP_SCALING_BLOCK128 (1x128 blocks, binary32
 * scale_inv), BLOCK128X128 (128x128 tiles, binary32) and BLOCK32X32 (32x32 tiles, E8M0) (docs/
 * numerics.md section 3). BLOCK128 goes band by band, its columnwise copy right after the rows
 * that brought the band into L2; the tile kinds take a band's tile maxima in one row-major pass,
 * then its row codes and column codes (tiles). On CPUs with AVX512_VBMI, the rowwise copies of
 * BF16 input take the byte encoder (quant_avx512_simd.h), non-temporal when large (the plan,
 * quant_avx512.c). Entry: lowp_cpu_q512_block; the measurements behind these choices:
 * docs/benchmarks.md, "AVX-512 quantization kernels".
 */
#include "quant_avx512_simd.h"

/* ---- BLOCK128 ---- */

/* lowp_rule_fp32_scale of 16 amax patterns (|x| bits, NaN patterns above Inf), lane by lane:
 * the same compares and the same IEEE division, so the same scales. */
AI __m512 fp32_scales16(__m512i am, float fmax, float eps, int pow2) {
    const __m512 a0 = _mm512_castsi512_ps(am), e = _mm512_set1_ps(eps);
    const __mmask16 nan = _mm512_cmp_ps_mask(a0, a0, _CMP_UNORD_Q);
    const __mmask16 keep = nan | _mm512_cmp_ps_mask(a0, e, _CMP_GT_OQ);
    const __m512 a = _mm512_mask_mov_ps(e, keep, a0); /* amax > eps ? amax : eps (NaN kept) */
    const __mmask16 one = nan | _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_EQ_OQ) |
                          _mm512_cmp_ps_mask(a, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ);
    __m512 s = _mm512_div_ps(_mm512_set1_ps(fmax), a);
    s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(s, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ),
                           _mm512_set1_ps(FLT_MAX));
    if (pow2) s = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(s), V32(0xFF800000)));
    return _mm512_mask_mov_ps(s, one, _mm512_set1_ps(1.0f));
}

/* Rowwise copy, 16 blocks of one row from block b0: the 16 maxima first (loads only), their
 * scales in one vector rule, then the codes of each block. Per block, a horizontal maximum,
 * the scalar rule and two divisions made a dependency chain the next block's loads waited on
 * (8192x4096 BF16, one thread: 0.54 of memcpy; see docs/bench-log/quant.md). */
AI void b128_group(const lowp_quant_job *j, const char *xr, uint8_t *orow, float *sc, int64_t b0,
                   lowp_format xf, lowp_format ef, int em_ok, int nt) {
    const int64_t C = j->cols, nb = (C + 127) / 128;
    const int g = nb - b0 < 16 ? (int) (nb - b0) : 16;
    const size_t es = xsize(xf);
    __m512i m[16];
    for (int k = 0; k < 16; k++) {
        const int64_t p = 128 * (b0 + k), n = k < g ? min64(C - p, 128) : 0;
        __m512i v = _mm512_setzero_si512();
        if (n == 128) {
            for (int q = 0; q < 4; q++)
                v = _mm512_max_epu32(v, amax32(xr + (size_t) (p + 32 * q) * es, xf, 32, 1));
        } else {
            for (int q = 0; 32 * q < n; q++)
                v = _mm512_max_epu32(v, amax32(xr + (size_t) (p + 32 * q) * es, xf, n - 32 * q, 0));
        }
        m[k] = v;
    }
    const __m512i am = tree16(m, 0);
    const __m512 s = fp32_scales16(am, j->et->fmax, j->eps, j->pow2);
    _mm512_mask_storeu_ps(sc + b0, mask16(g), _mm512_div_ps(_mm512_set1_ps(1.0f), s));
    _Alignas(64) float sv[16];
    _Alignas(64) uint32_t av[16];
    _mm512_store_ps(sv, s);
    _mm512_store_si512(av, am);
    for (int k = 0; k < g; k++) {
        const int64_t p = 128 * (b0 + k);
        enc_run_a(xr, orow, p, min64(C - p, 128), _mm512_set1_ps(sv[k]), av[k], xf, ef, em_ok, nt);
    }
}

/* Rowwise copy: per row, groups of 16 blocks of 128 columns. */
AI void b128_rows(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
                  int em_ok, int nt) {
    const int64_t C = j->cols, nb = (C + 127) / 128;
    const size_t ob = code_bytes(ef, C);
    for (int64_t r = r0; r < r1; r++) {
        const char *xr = xrow(j, xf, r);
        uint8_t *orow = (uint8_t *) j->row->data + (size_t) r * ob;
        float *sc = (float *) j->row->scales + (size_t) r * (size_t) nb;
        row_ahead(xr, xf, (size_t) C * xsize(xf));
        for (int64_t b0 = 0; b0 < nb; b0 += 16) b128_group(j, xr, orow, sc, b0, xf, ef, em_ok, nt);
    }
}

/* Columnwise copy of the band [r0, r0+nr) (nr <= 128), in chunks of up to 512 columns: the
 * vertical maxima of the chunk in one row-major pass (whole rows of the chunk, not 32-column
 * pieces a row apart: rows a multiple of 4 KiB apart share an L1 set), then per 32-column
 * segment the rule for its 32 columns in one vector (fp32_scales16: the same compares and
 * division as the scalar rule) and the codes, 64 rows at a time where the segment is whole.
 * Each column's codes of a 32-row chunk, 32 bytes stored a row of the copy apart, were half
 * lines read before being written, and at 1-2 KiB strides crowded a few L1 sets. */
AI void b128_cols(const lowp_quant_job *j, int64_t r0, int64_t nr, lowp_format xf, lowp_format ef,
                  int em_ok, int nt, col_carry *car) {
    const int64_t C = j->cols, nbr = j->col_nbr;
    const size_t es = xsize(xf), stride = (size_t) C * es;
    float *sc = (float *) j->col->scales + (size_t) (r0 / 128);
    for (int64_t k0 = 0; k0 < C; k0 += 512) {
        const int64_t w = min64(C - k0, 512), nseg = (w + 31) / 32;
        __m512i mx[32]; /* F32: two vectors per segment (ld32 halves); BF16: one, 16-bit */
        for (int k = 0; k < 32; k++) mx[k] = _mm512_setzero_si512();
        const char *base = (const char *) j->x + ((size_t) r0 * (size_t) C + (size_t) k0) * es;
        for (int64_t i = 0; i < nr; i++) {
            const char *p = base + (size_t) i * stride;
            for (int64_t g = 0; g < nseg; g++) {
                const int64_t n = min64(w - 32 * g, 32);
                const char *q = p + (size_t) (32 * g) * es;
                if (xf == F32) {
                    __m512 a, b;
                    ld32(q, xf, n, n == 32, &a, &b);
                    mx[2 * g] = _mm512_max_epu32(
                        mx[2 * g], _mm512_and_si512(_mm512_castps_si512(a), V32(0x7FFFFFFF)));
                    mx[2 * g + 1] = _mm512_max_epu32(
                        mx[2 * g + 1], _mm512_and_si512(_mm512_castps_si512(b), V32(0x7FFFFFFF)));
                } else {
                    __m512i v =
                        n == 32 ? _mm512_loadu_si512(q) : _mm512_maskz_loadu_epi16(mask32(n), q);
                    mx[g] = _mm512_max_epu16(mx[g], _mm512_and_si512(v, V32(0x7FFF7FFF)));
                }
            }
        }
        for (int64_t g = 0; g < nseg; g++) {
            const int64_t c0 = k0 + 32 * g, ncv = min64(C - c0, 32);
            __m512i lo, hi;
            if (xf == F32) {
                lo = mx[2 * g];
                hi = mx[2 * g + 1];
            } else {
                hi = _mm512_unpackhi_epi16(_mm512_setzero_si512(), mx[g]);
                lo = _mm512_unpacklo_epi16(_mm512_setzero_si512(), mx[g]);
            }
            const __m512 flo = fp32_scales16(lo, j->et->fmax, j->eps, j->pow2);
            const __m512 fhi = fp32_scales16(hi, j->et->fmax, j->eps, j->pow2);
            float inv[32];
            _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), flo));
            _mm512_storeu_ps(inv + 16, _mm512_div_ps(_mm512_set1_ps(1.0f), fhi));
            for (int k = 0; k < 32; k++) {
                const int cc = lane_col(xf, k >> 4, k & 15);
                if (cc < ncv) sc[(size_t) (c0 + cc) * (size_t) nbr] = inv[k];
            }
            const int fin = fp32_em(_mm512_reduce_max_epu32(_mm512_max_epu32(lo, hi))) == EM_FIN;
            __m512 glo = flo, ghi = fhi;
            const int fsub =
                fin && em_ok && fsub_factors(flo, ef, &glo) & fsub_factors(fhi, ef, &ghi);
            if (fsub)
                col_rows(j, r0, nr, c0, ncv, glo, ghi, xf, ef, EM_FSUB, nt, car);
            else if (fin)
                col_rows(j, r0, nr, c0, ncv, flo, fhi, xf, ef, EM_FIN, nt, car);
            else
                col_rows(j, r0, nr, c0, ncv, flo, fhi, xf, ef, EM_FP32, nt, car);
        }
    }
}

/* ---- BLOCK32X32 and BLOCK128X128 ---- */

/* The widest column chunk of tiles(). */
#define TILES_MAX_CW 8192

/* ---- the byte encoder for rowwise copies ---- */

/* The byte encoder's table for the binary32 scale s (a normal number): T[m], m = 0..127, from
 * the products of 1 + m/128 and s's significand, made by the same binary32 multiply as the
 * reference's. */
AI void fp32_table(float s, lowp_format ef, uint8_t *t) {
    const int mb = ef_mbits(ef);
    const __m512 ms = _mm512_castsi512_ps(V32((lowp_f2u(s) & 0x7FFFFFu) | 0x3F800000u));
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int q = 0; q < 8; q++) {
        const __m512 v = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_add_epi32(iota, V32(0x3F80 + 16 * q)), 16));
        const __m512i c = round_raw(_mm512_castps_si512(_mm512_mul_ps(v, ms)), 23 - mb);
        _mm_storeu_si128((__m128i *) (t + 16 * q),
                         _mm512_cvtepi32_epi8(_mm512_sub_epi32(c, V32(127u << mb))));
    }
}

/* Eoff of the binary32 scale s for the byte encoder, or -1 where it would be negative. */
AI int fp32_eoff(float s, lowp_format ef) {
    const int e = (int) ((lowp_f2u(s) >> 23) & 0xFF);
    return e == 0 || e == 255 || 254 - ef_bias(ef) - e < 0 ? -1 : 254 - ef_bias(ef) - e;
}

/* The byte encoder on the 64 BF16 elements at p: magnitudes, the high bytes (for the signs) in
 * *H and in *tiny the lanes below the target's normal range that are not zero (their
 * magnitudes are wrong). */
AIV __m512i benc(const char *p, __m512i ta, __m512i tb, __m512i eo, __m512i db, lowp_format ef,
                 int clip, __m512i *H, __mmask64 *tiny) {
    __m512i E, L;
    bsplit(_mm512_loadu_si512(p), _mm512_loadu_si512(p + 64), &E, &L, H);
    __m512i mag = bmag(E, _mm512_permutex2var_epi8(ta, L, tb), eo, db, ef, clip);
    __mmask64 k = _mm512_cmple_epu8_mask(E, eo);
    if (__builtin_expect(k != 0, 0)) { /* zeros (T[0] is not 0 for every scale) and tiny lanes */
        mag = _mm512_maskz_mov_epi8(~k, mag);
        const __m512i nz = _mm512_or_si512(E, L);
        k &= _mm512_test_epi8_mask(nz, nz);
    }
    *tiny = k;
    return mag;
}

AI void st64b(uint8_t *d, __m512i v, int nt) {
    if (nt)
        _mm512_stream_si512((__m512i *) d, v);
    else
        _mm512_storeu_si512(d, v);
}

/* A whole 128-element block of a BF16 row with one binary32 scale s (maximum pattern am,
 * finite), from its table t and offset eo; each half holding lanes below the normal range is
 * encoded again by enc_run_a (bit-exact there, and rare). */
AIV void blk128_b(const char *xr, uint8_t *orow, int64_t p, const uint8_t *t, int eo, float s,
                  uint32_t am, lowp_format ef, int em_ok, int nt) {
    const __m512i ta = _mm512_loadu_si512(t), tb = _mm512_loadu_si512(t + 64);
    const __m512i eov = _mm512_set1_epi8((char) eo);
    const __m512i db = ld64(ef == LOWP_FORMAT_E4M3 ? k_db_e4m3 : k_db_e5m2);
    for (int h = 0; h < 2; h++) {
        const int64_t q = p + 64 * h;
        __m512i H;
        __mmask64 tiny;
        const __m512i mag = benc(xr + 2 * q, ta, tb, eov, db, ef, 1, &H, &tiny);
        if (tiny)
            enc_run_a(xr, orow, q, 64, _mm512_set1_ps(s), am, LOWP_FORMAT_BF16, ef, em_ok, nt);
        else
            st64b(orow + q, bsign(H, mag), nt);
    }
}

/* Tables of the binary32 scales, direct-mapped by the top 7 bits of the significand: the
 * scales of BF16 maxima have 128 significands (the division of fmax by 128 values), so a
 * row-by-row pass builds each table once. */
typedef struct fp32_tables {
    uint32_t tag[128]; /* significand | 1 << 31 of the table in t, 0: none */
    _Alignas(64) uint8_t t[128][128];
} fp32_tables;

AI const uint8_t *fp32_table_of(fp32_tables *c, float s, lowp_format ef) {
    const uint32_t ms = lowp_f2u(s) & 0x7FFFFFu, i = ms >> 16;
    if (c->tag[i] != (ms | 1u << 31)) {
        fp32_table(s, ef, c->t[i]);
        c->tag[i] = ms | 1u << 31;
    }
    return c->t[i];
}

/* b128_group for BF16 input and 8-bit codes on the byte encoder: whole blocks with a finite
 * maximum and a scale it takes (fp32_eoff); the rest as before. */
AIV void b128_group_b(const lowp_quant_job *j, const char *xr, uint8_t *orow, float *sc, int64_t b0,
                      lowp_format ef, int em_ok, int nt, fp32_tables *tc) {
    const lowp_format xf = LOWP_FORMAT_BF16;
    const int64_t C = j->cols, nb = (C + 127) / 128;
    const int g = nb - b0 < 16 ? (int) (nb - b0) : 16;
    __m512i m[16];
    for (int k = 0; k < 16; k++) {
        const int64_t p = 128 * (b0 + k), n = k < g ? min64(C - p, 128) : 0;
        __m512i v = _mm512_setzero_si512();
        if (n == 128) {
            for (int q = 0; q < 4; q++)
                v = _mm512_max_epu32(v, amax32(xr + (size_t) (p + 32 * q) * 2, xf, 32, 1));
        } else {
            for (int q = 0; 32 * q < n; q++)
                v = _mm512_max_epu32(v, amax32(xr + (size_t) (p + 32 * q) * 2, xf, n - 32 * q, 0));
        }
        m[k] = v;
    }
    const __m512i am = tree16(m, 0);
    const __m512 s = fp32_scales16(am, j->et->fmax, j->eps, j->pow2);
    _mm512_mask_storeu_ps(sc + b0, mask16(g), _mm512_div_ps(_mm512_set1_ps(1.0f), s));
    _Alignas(64) float sv[16];
    _Alignas(64) uint32_t av[16];
    _mm512_store_ps(sv, s);
    _mm512_store_si512(av, am);
    for (int k = 0; k < g; k++) {
        const int64_t p = 128 * (b0 + k), n = min64(C - p, 128);
        const int eo = n == 128 && av[k] < 0x7F800000u ? fp32_eoff(sv[k], ef) : -1;
        if (eo >= 0)
            blk128_b(xr, orow, p, fp32_table_of(tc, sv[k], ef), eo, sv[k], av[k], ef, em_ok, nt);
        else
            enc_run_a(xr, orow, p, n, _mm512_set1_ps(sv[k]), av[k], xf, ef, em_ok, nt);
    }
}

/* b128_rows on b128_group_b. */
AIV void b128_rows_b(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format ef, int em_ok,
                     int nt) {
    const int64_t C = j->cols, nb = (C + 127) / 128;
    fp32_tables tc;
    memset(tc.tag, 0, sizeof tc.tag);
    for (int64_t r = r0; r < r1; r++) {
        const char *xr = xrow(j, LOWP_FORMAT_BF16, r);
        uint8_t *orow = (uint8_t *) j->row->data + (size_t) r * (size_t) C;
        float *sc = (float *) j->row->scales + (size_t) r * (size_t) nb;
        for (int64_t b0 = 0; b0 < nb; b0 += 16)
            b128_group_b(j, xr, orow, sc, b0, ef, em_ok, nt, &tc);
    }
}

/* BLOCK128X128's row codes of the band [r0, r0+nr) x columns [c0, c0+w) on the byte encoder:
 * tile t (128 columns) has scale f[t] and maximum pattern am[t]; one table per tile. */
AIV void b128x128_rows_b(const lowp_quant_job *j, int64_t r0, int64_t nr, int64_t c0, int64_t w,
                         const float *f, const uint32_t *am, lowp_format ef, int em_ok, int nt) {
    const int64_t C = j->cols, ntl = (w + 127) / 128;
    _Alignas(64) uint8_t tab[TILES_MAX_CW / 128][128];
    int eo[TILES_MAX_CW / 128];
    for (int64_t t = 0; t < ntl; t++) {
        eo[t] = c0 + 128 * t + 128 <= C && am[t] < 0x7F800000u ? fp32_eoff(f[t], ef) : -1;
        if (eo[t] >= 0) fp32_table(f[t], ef, tab[t]);
    }
    for (int64_t i = 0; i < nr; i++) {
        const char *xr = xrow(j, LOWP_FORMAT_BF16, r0 + i);
        uint8_t *orow = (uint8_t *) j->row->data + (size_t) (r0 + i) * (size_t) C;
        for (int64_t t = 0; t < ntl; t++) {
            const int64_t p = c0 + 128 * t;
            if (eo[t] >= 0)
                blk128_b(xr, orow, p, tab[t], eo[t], f[t], am[t], ef, em_ok, nt);
            else
                enc_run_a(xr, orow, p, min64(C - p, 128), _mm512_set1_ps(f[t]), am[t],
                          LOWP_FORMAT_BF16, ef, em_ok, nt);
        }
    }
}

/* BLOCK32X32's row codes of the band [r0, r0+nr) x columns [c0, c0+w) (w a multiple of 64) on
 * the byte encoder, from the tiles' E8M0 codes code[t] (all at least bias, none 0xFF). */
AIV void b32x32_rows_b(const lowp_quant_job *j, int64_t r0, int64_t nr, int64_t c0, int64_t w,
                       const uint32_t *code, lowp_format ef, int clip, int nt) {
    const int64_t C = j->cols, nv = w / 64;
    const int bias = ef_bias(ef), mb = ef_mbits(ef);
    const uint8_t *t0 = ef == LOWP_FORMAT_E4M3 ? k_t0_e4m3 : k_t0_e5m2;
    const __m512i ta = ld64(t0), tb = ld64(t0 + 64);
    const __m512i db = ld64(ef == LOWP_FORMAT_E4M3 ? k_db_e4m3 : k_db_e5m2);
    __m512i eo[TILES_MAX_CW / 64];
    for (int64_t v = 0; v < nv; v++)
        eo[v] = _mm512_mask_blend_epi8(
            0xFFFFFFFF00000000ull, _mm512_set1_epi8((char) (code[2 * v] - (uint32_t) bias)),
            _mm512_set1_epi8((char) (code[2 * v + 1] - (uint32_t) bias)));
    for (int64_t i = 0; i < nr; i++) {
        const char *xr = xrow(j, LOWP_FORMAT_BF16, r0 + i) + (size_t) c0 * 2;
        uint8_t *orow = (uint8_t *) j->row->data + (size_t) (r0 + i) * (size_t) C + (size_t) c0;
        for (int64_t v = 0; v < nv; v++) {
            __m512i H;
            __mmask64 tiny;
            __m512i mag = benc(xr + 128 * v, ta, tb, eo[v], db, ef, clip, &H, &tiny);
            if (tiny) {
                const __m512i x0 = _mm512_loadu_si512(xr + 128 * v);
                const __m512i x1 = _mm512_loadu_si512(xr + 128 * v + 64);
                const short o0 = (short) ((code[2 * v] - (uint32_t) bias) << mb);
                const short o1 = (short) ((code[2 * v + 1] - (uint32_t) bias) << mb);
                mag = _mm512_mask_mov_epi8(
                    mag, tiny, btiny(x0, x1, _mm512_set1_epi16(o0), _mm512_set1_epi16(o1), ef));
            }
            st64b(orow + 64 * v, bsign(H, mag), nt);
        }
    }
}

/* The rowwise entry points with the format and flags as constants. */
#define ROWS_B(EF, SUF)                                                                            \
    NIV void b128_rows_b_##SUF(const lowp_quant_job *j, int64_t r0, int64_t r1, int em_ok,         \
                               int nt) {                                                           \
        b128_rows_b(j, r0, r1, EF, em_ok, nt);                                                     \
    }                                                                                              \
    NIV void b128x128_rows_b_##SUF(const lowp_quant_job *j, int64_t r0, int64_t nr, int64_t c0,    \
                                   int64_t w, const float *f, const uint32_t *am, int em_ok,       \
                                   int nt) {                                                       \
        b128x128_rows_b(j, r0, nr, c0, w, f, am, EF, em_ok, nt);                                   \
    }                                                                                              \
    NIV void b32x32_rows_b_##SUF(const lowp_quant_job *j, int64_t r0, int64_t nr, int64_t c0,      \
                                 int64_t w, const uint32_t *code, int nt) {                        \
        if (clip_of(j))                                                                            \
            b32x32_rows_b(j, r0, nr, c0, w, code, EF, 1, nt);                                      \
        else                                                                                       \
            b32x32_rows_b(j, r0, nr, c0, w, code, EF, 0, nt);                                      \
    }
ROWS_B(LOWP_FORMAT_E4M3, e4m3)
ROWS_B(LOWP_FORMAT_E5M2, e5m2)

/* A column chunk of tiles(): columns [c0, c0 + w) of the band [r0, r0 + nr), in ng 512-column
 * groups and ntl tiles; em, the encoder of the codes; per tile its factor (E8M0) or scale
 * (binary32) f and its E8M0 code or maximum pattern am; per 16 tiles, nan: those whose E8M0
 * code is 0xFF. Its readers copy the scalars to locals first: a byte store of codes may alias
 * the chunk, which would make the compiler reload them in the loops. */
typedef struct tiles_chunk {
    int64_t r0, nr, c0, w;
    int e8, ng, ntl, em;
    float f[TILES_MAX_CW / 32];
    uint32_t am[TILES_MAX_CW / 32];
    unsigned nan[TILES_MAX_CW / 512];
} tiles_chunk;

/* The chunk's maxima in one row-major pass, into m[t]: per tile for E8M0 (16-bit magnitudes
 * for BF16, folded by tree16 per 16 tiles), per 128-column tile for binary32. Per 512 columns,
 * 16 32-column pieces: piece k of group g is in tile (16 g + k) * 32 / bs of the chunk. */
AI void tiles_maxima(const lowp_quant_job *j, const tiles_chunk *k, lowp_format xf, __m512i *m) {
    const size_t es = xsize(xf);
    const int64_t w = k->w, nr = k->nr, r0 = k->r0, c0 = k->c0;
    const int e8 = k->e8, ng = k->ng;
    for (int q = 0; q < 16 * ng; q++) m[q] = _mm512_setzero_si512();
    for (int64_t i = 0; i < nr; i++) {
        const char *xr = xrow(j, xf, r0 + i) + (size_t) c0 * es;
        if (w < j->cols) /* chunks of up to 128 rows a page apart are more streams than the
                          * hardware prefetchers follow: the row's next chunk, into L2 */
            for (size_t o = 0; o < (size_t) w * es; o += 64) prefetch(xr, (size_t) w * es + o);
        for (int q = 0; q < 16 * ng; q++) { /* 32-column pieces */
            const int t = e8 ? q : q / 4;
            const int64_t n = w - 32 * q;
            if (n <= 0) break;
            const char *pk = xr + (size_t) (32 * q) * es;
            if (e8)
                m[t] =
                    umax(m[t], n >= 32 ? amax32w(pk, xf, 32, 1) : amax32w(pk, xf, n, 0), xf != F32);
            else
                m[t] =
                    _mm512_max_epu32(m[t], n >= 32 ? amax32(pk, xf, 32, 1) : amax32(pk, xf, n, 0));
        }
    }
}

/* The chunk's scales from its maxima m, into both copies' scales and the chunk (f, am, nan, em). */
AI void tiles_scales(const lowp_quant_job *j, tiles_chunk *k, lowp_format xf, lowp_format ef,
                     int em_ok, const __m512i *m) {
    const int64_t bs = k->e8 ? 32 : 128, nbc = (j->cols + bs - 1) / bs, nbr = j->col_nbr;
    const int64_t tr = k->r0 / bs;
    const int tc0 = (int) (k->c0 / bs), ntl = k->ntl;
    if (!k->e8) {
        k->em = EM_FP32;
        for (int t = 0; t < ntl; t++) {
            k->am[t] = _mm512_reduce_max_epu32(m[t]);
            k->f[t] = lowp_rule_fp32_scale(lowp_u2f(k->am[t]), j->et->fmax, j->eps, j->pow2);
            if (j->row) ((float *) j->row->scales)[(size_t) (tr * nbc + tc0 + t)] = 1.0f / k->f[t];
            if (j->col)
                ((float *) j->col->scales)[(size_t) ((tc0 + t) * nbr + tr)] = 1.0f / k->f[t];
        }
        return;
    }
    k->em = EM_SUB;
    for (int g = 0; g < k->ng; g++) {
        const int n = min64(ntl - 16 * g, 16);
        const __m512i cv = e8m0_codes(tree16(m + 16 * g, xf != F32), j->et, j->mode);
        if (e8_em(cv, mask16(n), ef, em_ok) != EM_SUB) k->em = EM_E8;
        _mm512_storeu_si512(k->am + 16 * g, cv); /* the codes, for now */
        k->nan[g] = _mm512_cmpeq_epi32_mask(cv, V32(0xFF)) & mask16(n);
    }
    for (int g = 0; g < k->ng; g++)
        _mm512_storeu_ps(k->f + 16 * g,
                         e8m0_factors(_mm512_loadu_si512(k->am + 16 * g), ef, k->em));
    for (int t = 0; t < ntl; t++) {
        const uint8_t code = (uint8_t) k->am[t];
        if (j->row) ((uint8_t *) j->row->scales)[(size_t) (tr * nbc + tc0 + t)] = code;
        if (j->col) ((uint8_t *) j->col->scales)[(size_t) ((tc0 + t) * nbr + tr)] = code;
    }
}

/* The chunk's row codes on the byte encoder, where rows_b and the scales let it: whether it
 * wrote them. */
AI int tiles_rows_b(const lowp_quant_job *j, const tiles_chunk *k, lowp_format xf, lowp_format ef,
                    int em_ok, int nt) {
    if (!rows_b(xf, ef)) return 0;
    if (!k->e8) {
        if (ef == LOWP_FORMAT_E4M3)
            b128x128_rows_b_e4m3(j, k->r0, k->nr, k->c0, k->w, k->f, k->am, em_ok, nt);
        else
            b128x128_rows_b_e5m2(j, k->r0, k->nr, k->c0, k->w, k->f, k->am, em_ok, nt);
        return 1;
    }
    if (!em_ok || k->w % 64 != 0) return 0;
    int ok = 1;
    for (int t = 0; t < k->ntl; t++) ok &= k->am[t] >= (uint32_t) ef_bias(ef) && k->am[t] != 0xFF;
    if (ok && ef == LOWP_FORMAT_E4M3)
        b32x32_rows_b_e4m3(j, k->r0, k->nr, k->c0, k->w, k->am, nt);
    else if (ok)
        b32x32_rows_b_e5m2(j, k->r0, k->nr, k->c0, k->w, k->am, nt);
    return ok;
}

/* The chunk's row codes, row by row: E8M0 tiles by enc_blocks32 per 16 tiles, binary32 tiles
 * by enc_run_a. */
AI void tiles_rows(const lowp_quant_job *j, const tiles_chunk *k, lowp_format xf, lowp_format ef,
                   int em_ok, int clip, int nt) {
    const int64_t C = j->cols, c0 = k->c0, r0 = k->r0, nr = k->nr;
    const int e8 = k->e8, ng = k->ng, ntl = k->ntl, em = k->em;
    const size_t ob = code_bytes(ef, C);
    const float *f = k->f;
    for (int64_t i = 0; i < nr; i++) {
        const char *xr = xrow(j, xf, r0 + i);
        uint8_t *orow = (uint8_t *) j->row->data + (size_t) (r0 + i) * ob;
        for (int g = 0; g < ng; g++) {
            const int64_t p = c0 + 512 * g;
            const int full = p + 512 <= C;
            const int nt16 = (int) min64(ntl - 16 * g, 16);
            if (em == EM_SUB) {
                if (full)
                    enc_blocks32(xr, orow, p, 16, C, f + 16 * g, k->nan[g], xf, ef, EM_SUB, clip, 1,
                                 nt);
                else
                    enc_blocks32(xr, orow, p, nt16, C, f + 16 * g, k->nan[g], xf, ef, EM_SUB, clip,
                                 0, nt);
            } else if (em == EM_E8) {
                if (full)
                    enc_blocks32(xr, orow, p, 16, C, f + 16 * g, k->nan[g], xf, ef, EM_E8, 0, 1,
                                 nt);
                else
                    enc_blocks32(xr, orow, p, nt16, C, f + 16 * g, k->nan[g], xf, ef, EM_E8, 0, 0,
                                 nt);
            }
        }
        if (!e8)
            for (int t = 0; t < ntl; t++) {
                const int64_t p = c0 + 128 * t;
                enc_run_a(xr, orow, p, min64(C - p, 128), _mm512_set1_ps(f[t]), k->am[t], xf, ef,
                          em_ok, nt);
            }
    }
}

/* The chunk's column codes, in 32x32 transposes (col_seg_x). */
AI void tiles_cols(const lowp_quant_job *j, const tiles_chunk *k, lowp_format xf, lowp_format ef,
                   int em_ok, int clip) {
    const int64_t r0 = k->r0, nr = k->nr, c0 = k->c0, w = k->w;
    const int e8 = k->e8, em = k->em;
    const int64_t bs = e8 ? 32 : 128;
    for (int64_t s = 0; s < w; s += 32) {
        const int t = (int) (s / bs);
        const int64_t ncv = min64(w - s, 32);
        const __m512 ft = _mm512_set1_ps(k->f[t]);
        const unsigned tn = e8 && (k->nan[t / 16] >> (t % 16)) & 1 ? 0xFFFFFFFFu : 0u;
        __m512 gt = ft;
        const int fin = fp32_em(k->am[t]) == EM_FIN;
        const int fsub = !e8 && em_ok && fin && fsub_factors(ft, ef, &gt);
        for (int64_t i = 0; i < nr; i += 32) {
            const int64_t n = min64(nr - i, 32);
            if (em == EM_SUB)
                col_seg_x(j, r0 + i, n, c0 + s, ncv, ft, ft, tn, xf, ef, EM_SUB, clip);
            else if (em == EM_E8)
                col_seg_x(j, r0 + i, n, c0 + s, ncv, ft, ft, tn, xf, ef, EM_E8, 0);
            else if (fsub)
                col_seg_x(j, r0 + i, n, c0 + s, ncv, gt, gt, 0, xf, ef, EM_FSUB, 0);
            else if (fin)
                col_seg_x(j, r0 + i, n, c0 + s, ncv, ft, ft, 0, xf, ef, EM_FIN, 0);
            else
                col_seg_x(j, r0 + i, n, c0 + s, ncv, ft, ft, 0, xf, ef, EM_FP32, 0);
        }
    }
}

/* The band [r0, r0+nr) (nr <= bs), in chunks of cw columns (a multiple of 512): the tile
 * maxima in one row-major pass, then the row codes row by row and the column codes in 32x32
 * transposes. */
AI void tiles(const lowp_quant_job *j, int64_t r0, int64_t nr, lowp_format xf, lowp_format ef,
              int em_ok, int nt, int64_t cw) {
    const int e8 = j->scaling == LOWP_SCALING_BLOCK32X32, clip = clip_of(j);
    const int64_t bs = e8 ? 32 : 128, C = j->cols;
    for (int64_t c0 = 0; c0 < C; c0 += cw) {
        tiles_chunk k;
        k.r0 = r0;
        k.nr = nr;
        k.c0 = c0;
        k.w = min64(C - c0, cw);
        k.e8 = e8;
        k.ng = (int) ((k.w + 511) / 512); /* 512-column groups */
        k.ntl = (int) ((k.w + bs - 1) / bs);
        __m512i m[TILES_MAX_CW / 32]; /* per tile (e8) or per 4 tiles' pieces */
        tiles_maxima(j, &k, xf, m);
        tiles_scales(j, &k, xf, ef, em_ok, m);
        if (j->row && !tiles_rows_b(j, &k, xf, ef, em_ok, nt))
            tiles_rows(j, &k, xf, ef, em_ok, clip, nt);
        if (j->col) tiles_cols(j, &k, xf, ef, em_ok, clip);
    }
}

/* BLOCK128's rowwise copy: on the byte encoder where rows_b takes it. */
AI void b128_rows_any(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf,
                      lowp_format ef, int em_ok, int nt) {
    if (rows_b(xf, ef) && ef == LOWP_FORMAT_E4M3)
        b128_rows_b_e4m3(j, r0, r1, em_ok, nt);
    else if (rows_b(xf, ef))
        b128_rows_b_e5m2(j, r0, r1, em_ok, nt);
    else
        b128_rows(j, r0, r1, xf, ef, em_ok, nt);
}

/* ---- the family's entry ---- */

/* Rows [r0, r1) of a BLOCK128 job: with a columnwise copy, band by band. */
AI void b128_job(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
                 const q512_plan *p) {
    if (!j->col) {
        if (j->row) b128_rows_any(j, r0, r1, xf, ef, p->em_ok, p->nt_row);
        return;
    }
    col_carry cb, *cc = carry_open(&cb, j->cols, p->col_big && !p->nt_col);
    /* band by band, so that the columnwise pass reads a band the rowwise one has just
     * brought into L2 */
    for (int64_t r = r0; r < r1; r += 128) {
        const int64_t n = min64(r1 - r, 128);
        if (j->row) b128_rows_any(j, r, r + n, xf, ef, p->em_ok, p->nt_row);
        b128_cols(j, r, n, xf, ef, p->em_ok, p->nt_col, cc);
    }
    carry_close(cc, j, r1);
}

/* Rows [r0, r1) of a BLOCK128X128 or BLOCK32X32 job, by bands of tiles. */
AI void tiles_job(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
                  const q512_plan *p) {
    const int64_t bs = j->scaling == LOWP_SCALING_BLOCK32X32 ? 32 : 128;
    /* Whole rows when the band's maxima fit: the band is then one contiguous stream, and
     * its second reading comes from L2 or L3 (8192x4096 BF16, 1 thread: BLOCK128X128
     * 12.5 -> 9.0 ms, BLOCK32X32 9.0 -> 7.6; 512-column chunks a page apart, prefetched,
     * were slower however far ahead; chunks narrower than the row, slower still). */
    const int64_t cw = j->cols <= TILES_MAX_CW ? TILES_MAX_CW : 512;
    for (int64_t r = r0; r < r1; r += bs)
        tiles(j, r, min64(r1 - r, bs), xf, ef, p->em_ok, p->nt_row, cw);
}

/* Rows [r0, r1) of a job of the Block FP8 family. */
AI void block_run(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef,
                  const q512_plan *p) {
    if (j->scaling == LOWP_SCALING_BLOCK128)
        b128_job(j, r0, r1, xf, ef, p);
    else
        tiles_job(j, r0, r1, xf, ef, p);
}
Q512_INSTANCE(block_f32_e4m3, block_run, LOWP_FORMAT_F32, LOWP_FORMAT_E4M3)
Q512_INSTANCE(block_f32_e5m2, block_run, LOWP_FORMAT_F32, LOWP_FORMAT_E5M2)
Q512_INSTANCE(block_bf16_e4m3, block_run, LOWP_FORMAT_BF16, LOWP_FORMAT_E4M3)
Q512_INSTANCE(block_bf16_e5m2, block_run, LOWP_FORMAT_BF16, LOWP_FORMAT_E5M2)

void lowp_cpu_q512_block(const lowp_quant_job *j, int64_t r0, int64_t r1, const q512_plan *p) {
    const int bf = j->xfmt == LOWP_FORMAT_BF16;
    switch (j->efmt) {
    case LOWP_FORMAT_E4M3:
        bf ? block_bf16_e4m3(j, r0, r1, p) : block_f32_e4m3(j, r0, r1, p);
        return;
    case LOWP_FORMAT_E5M2:
        bf ? block_bf16_e5m2(j, r0, r1, p) : block_f32_e5m2(j, r0, r1, p);
        return;
    default: lowp_cpu_quant_ref(j, r0, r1); return;
    }
}
