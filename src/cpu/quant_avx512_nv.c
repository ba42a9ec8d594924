/* AVX-512 quantization, the NVFP4 family (docs/numerics.md section 4b, bit-exact with
 * quant_ref.c): LOWP_SCALING_NV16 (E4M3 scales per 1x16 block) rowwise, columnwise or both
 * from one read, LOWP_SCALING_NV16X16 (one E4M3 scale per 16x16 tile, its columnwise copy the
 * rowwise one transposed), and NV16's grouped columnwise copy (MoE weight gradients). The
 * tensor scale (step 1) was computed by the dispatcher (quant.c) from its amax pass; these
 * kernels do steps 2-4.
 *
 * A 1x16 block is one 16-lane binary32 vector (BF16 is widened exactly, in natural order).
 * The rowwise copy alone takes a row 256 elements at a time: the 16 blocks' maxima by the
 * transposing tree, 16 scales at once, codes packed 64 at a time into 32 contiguous bytes. The
 * other kinds take 16x16 tiles: the 16 row vectors are transposed in registers, so a column
 * block is a vector too, and the lane-wise maximum of the transposed vectors is the 16 row
 * blocks' maxima (of the rows, the column blocks'). Each block's 8 bytes of codes go to their
 * own output row. Scales, vectorized over 16 blocks:
 *   - code: |bamax| bit patterns (NaN above Inf above numbers) >= 0x7F800000 give 0x7F, else
 *     enc16 (E4M3, satfinite RNE) of bamax * (S * sixth), one rounded multiply;
 *   - factor: decode(code) as an exact int-to-float times a power of two, then
 *     1 / (decode * D) (one rounded multiply, one correctly rounded division), +Inf to FLT_MAX;
 *   - elements: enc16 (E2M1, satfinite RNE, sign of zero kept) of x * f; a NaN block's codes
 *     are zeroed before the pack. Padding lanes load as +0, whose code is 0 (the pad nibble).
 * Stochastic rounding (job->sr, docs/numerics.md 4b): step 4's RNE replaced by section 2's
 * SR, each block's 16 Philox words from sr_words16, lane by lane as the reference; MX32's E2M1
 * copies under SR have their own kernel here too (mxsr_*), the MX kernel staying RNE.
 * Compiled with the AVX-512 flags (src/cpu/CMakeLists.txt); it never fails.
 */
#include "philox_avx512.h"
#include "quant_avx512_simd.h"

static const lowp_format E4M3 = LOWP_FORMAT_E4M3;

/* 16 elements [0, n) at p as binary32 in natural order; the rest read as +0, untouched. */
AI __m512 nv_ld16(const char *p, lowp_format xf, int64_t n) {
    if (xf == F32) return n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask16(n), p);
    __m256i h =
        n >= 16 ? _mm256_loadu_si256((const __m256i *) p) : _mm256_maskz_loadu_epi16(mask16(n), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AI __m512i nv_abs(__m512 x) {
    return _mm512_and_si512(_mm512_castps_si512(x), V32(0x7FFFFFFF));
}

/* Step 2 for 16 block maxima (|x| bit patterns): E4M3 codes in 32-bit lanes. k = S * sixth. */
AI __m512i nv_codes(__m512i amax, float k) {
    const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(amax), _mm512_set1_ps(k));
    const __m512i c = enc16(v, E4M3, 1);
    return _mm512_mask_mov_epi32(c, _mm512_cmpge_epu32_mask(amax, V32(0x7F800000)), V32(0x7F));
}

/* Step 3 for 16 codes: f = 1 / (decode(code) * dec), FLT_MAX for +Inf. decode(code) is
 * m' * 2^(max(e,1) - 10), m' the significand with its implicit bit (exact: at most 4 bits). A
 * NaN code's factor is some finite number: its block's codes are zeroed. */
AI __m512 nv_factors(__m512i code, float dec) {
    __m512i e = _mm512_srli_epi32(code, 3), m = _mm512_and_si512(code, V32(7));
    m = _mm512_mask_or_epi32(m, _mm512_test_epi32_mask(e, e), m, V32(8));
    e = _mm512_max_epu32(e, V32(1));
    const __m512 p = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, V32(117)), 23));
    const __m512 val = _mm512_mul_ps(_mm512_cvtepi32_ps(m), p);
    const __m512 f = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(val, _mm512_set1_ps(dec)));
    return _mm512_min_ps(f, _mm512_set1_ps(FLT_MAX));
}

/* ---- stochastic rounding (job->sr) ---- */

/* Satfinite E2M1 codes of y by section 2's SR with the words r, lane by lane as the reference
 * (core/format.c small_encode): the significand as a count of quanta with 32 fraction bits,
 * plus r, the carry out of the fraction rounding up. Shift counts of 32 and more give 0, the
 * reference's q = 0 for tiny values; binary32 zeros and subnormals give the signed zero; NaN
 * gives 0 (a NaN block is zeroed anyway); Inf and overflow clamp at 6 (code 7). */
AI __m512i e2m1_sr16(__m512 y, __m512i r) {
    const __m512i u = _mm512_castps_si512(y), a = _mm512_and_si512(u, V32(0x7FFFFFFF));
    const __m512i m24 = _mm512_or_si512(_mm512_and_si512(a, V32(0x7FFFFF)), V32(0x800000));
    const __m512i em1 = _mm512_sub_epi32(_mm512_srli_epi32(a, 23), V32(127)); /* e - 1 */
    const __m512i zero = _mm512_setzero_si512();
    const __m512i shift =
        _mm512_add_epi32(_mm512_max_epi32(_mm512_sub_epi32(zero, em1), zero), V32(22));
    const __m512i hi = _mm512_srlv_epi32(m24, shift);
    const __m512i lo = _mm512_or_si512(_mm512_sllv_epi32(m24, _mm512_sub_epi32(V32(32), shift)),
                                       _mm512_srlv_epi32(m24, _mm512_sub_epi32(shift, V32(32))));
    const __mmask16 carry = _mm512_cmplt_epu32_mask(_mm512_add_epi32(lo, r), lo);
    __m512i code = _mm512_add_epi32(_mm512_slli_epi32(_mm512_max_epi32(em1, zero), 1),
                                    _mm512_mask_add_epi32(hi, carry, hi, V32(1)));
    code = _mm512_min_epu32(code, V32(7));
    const __m512i res = _mm512_ternarylogic_epi32(_mm512_srli_epi32(u, 28), V32(8), code, 0xEA);
    return _mm512_maskz_mov_epi32(_mm512_cmple_epu32_mask(a, V32(0x7F800000)), res);
}

/* Step 4: the E2M1 codes (sign at bit 3) of one block x with factor f, RNE or (rnd) SR with
 * the block's words; 0 for a NaN block. */
AI __m512i nv_enc(__m512 x, float f, int nan, const __m512i *rnd) {
    const __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(f));
    const __m512i c = rnd ? e2m1_sr16(y, *rnd) : enc16(y, E2M1, 1);
    return nan ? _mm512_setzero_si512() : c;
}

/* The codes of 4 blocks as 32 bytes, block b's 8 bytes at 8b (low nibble first). The packs
 * leave lane L holding the bytes of elements 4L..4L+3 of each block in turn; the nibble merge
 * halves them to 16-bit units, which one permute puts in block order. */
AI __m256i nv_pack4(__m512i c0, __m512i c1, __m512i c2, __m512i c3) {
    const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
    const __m256i h = _mm512_cvtepi16_epi8(_mm512_or_si512(b, _mm512_srli_epi16(b, 4)));
    const __m256i idx = _mm256_setr_epi16(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm256_permutexvar_epi16(idx, h);
}

/* 16 blocks x[i] with factors f[i] (nan bit i: block i is a NaN block) packed as 128 bytes;
 * rnd: NULL (RNE) or block i's SR words in rnd[i]. */
AI void nv_pack16(const __m512 x[16], const float f[16], unsigned nan, const __m512i *rnd,
                  uint8_t out[128]) {
    for (int q = 0; q < 4; q++) {
        const int b = 4 * q;
        __m256i h =
            nv_pack4(nv_enc(x[b], f[b], nan >> b & 1, rnd ? rnd + b : NULL),
                     nv_enc(x[b + 1], f[b + 1], nan >> (b + 1) & 1, rnd ? rnd + b + 1 : NULL),
                     nv_enc(x[b + 2], f[b + 2], nan >> (b + 2) & 1, rnd ? rnd + b + 2 : NULL),
                     nv_enc(x[b + 3], f[b + 3], nan >> (b + 3) & 1, rnd ? rnd + b + 3 : NULL));
        _mm256_storeu_si256((__m256i *) (out + 32 * q), h);
    }
}

/* The 16x16 binary32 transpose in registers: t[c] lane i = r[i] lane c. */
AI void nv_transpose(const __m512 r[16], __m512 t[16]) {
    __m512i a[16], u[16];
    for (int i = 0; i < 8; i++) {
        const __m512i x = _mm512_castps_si512(r[2 * i]), y = _mm512_castps_si512(r[2 * i + 1]);
        a[2 * i] = _mm512_unpacklo_epi32(x, y);
        a[2 * i + 1] = _mm512_unpackhi_epi32(x, y);
    }
    /* u[4g + k] lane L: rows 4g..4g+3 at column 4L + k */
    for (int g = 0; g < 4; g++) {
        u[4 * g] = _mm512_unpacklo_epi64(a[4 * g], a[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(a[4 * g], a[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(a[4 * g + 1], a[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(a[4 * g + 1], a[4 * g + 3]);
    }
    for (int k = 0; k < 4; k++) {
        const __m512i v = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
        const __m512i w = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        const __m512i w2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
        t[k] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(v, v2, 0x88));
        t[8 + k] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(v, v2, 0xDD));
        t[4 + k] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(w, w2, 0x88));
        t[12 + k] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(w, w2, 0xDD));
    }
}

/* The 32-bit lanes (truncated) of 16 uint64 values. */
AI __m512i sr_lo32(__m512i a, __m512i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(a)),
                              _mm512_cvtepi64_epi32(b), 1);
}

/* The random words of 16 blocks: R[i] lane l = word w + i * step + l of stream job->seed, w =
 * job->offset + base. Lane i of the k-th Philox run computes block (w_i >> 2) + k of block i's
 * window of 20 words (16 when every w_i is a multiple of 4); lane i of Rt[l] then picks word
 * (w_i & 3) + l of it, and the transpose makes the blocks' vectors. */
AI void sr_words16(const lowp_quant_job *j, uint64_t base, uint64_t step, __m512i R[16]) {
    uint64_t w[16];
    for (int i = 0; i < 16; i++) w[i] = j->offset + base + (uint64_t) i * step;
    const __m512i wa = _mm512_loadu_si512(w), wb = _mm512_loadu_si512(w + 8);
    const __m512i a = _mm512_and_si512(sr_lo32(wa, wb), V32(3));
    const __m512i blo = sr_lo32(_mm512_srli_epi64(wa, 2), _mm512_srli_epi64(wb, 2));
    const __m512i bhi = sr_lo32(_mm512_srli_epi64(wa, 34), _mm512_srli_epi64(wb, 34));
    __m512i W[20], Rt[16];
    const int runs = _mm512_test_epi32_mask(a, a) ? 5 : 4;
    for (int k = 0; k < runs; k++) { /* counter (w_i >> 2) + k, the carry into its high word */
        const __m512i c0 = _mm512_add_epi32(blo, V32(k));
        const __m512i c1 =
            _mm512_mask_add_epi32(bhi, _mm512_cmplt_epu32_mask(c0, blo), bhi, V32(1));
        lowp_philox16(j->seed, c0, c1, W + 4 * k);
    }
    if (runs == 4)
        for (int k = 16; k < 20; k++) W[k] = _mm512_setzero_si512();
    const __mmask16 m1 = _mm512_cmpeq_epi32_mask(a, V32(1)),
                    m2 = _mm512_cmpeq_epi32_mask(a, V32(2)),
                    m3 = _mm512_cmpeq_epi32_mask(a, V32(3));
    for (int l = 0; l < 16; l++) {
        __m512i v = _mm512_mask_mov_epi32(W[l], m1, W[l + 1]);
        v = _mm512_mask_mov_epi32(v, m2, W[l + 2]);
        Rt[l] = _mm512_mask_mov_epi32(v, m3, W[l + 3]);
    }
    nv_transpose((const __m512 *) Rt, (__m512 *) R);
}

/* Lane-wise maximum of the 16 vectors' |x| patterns. */
AI __m512i nv_lanemax(const __m512 v[16]) {
    __m512i m = nv_abs(v[0]);
    for (int i = 1; i < 16; i++) m = _mm512_max_epu32(m, nv_abs(v[i]));
    return m;
}

/* Scales of 16 blocks of maxima `amax`: codes into sc (n of them), factors into f; returns the
 * NaN blocks' bits. */
AI unsigned nv_scales(const lowp_quant_job *j, __m512i amax, uint8_t sc[16], float f[16]) {
    const __m512i code = nv_codes(amax, j->nv_enc * LOWP_NV_SIXTH);
    _mm_storeu_si128((__m128i *) sc, _mm512_cvtepi32_epi8(code));
    _mm512_storeu_ps(f, nv_factors(code, j->nv_dec));
    return _mm512_cmpeq_epi32_mask(code, V32(0x7F));
}

/* ---- NV16, the rowwise copy alone ---- */

AI void nv_rows(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, int sr) {
    const int64_t C = j->cols, nb = (C + 15) / 16;
    const size_t es = xsize(xf), ob = code_bytes(E2M1, C);
    for (int64_t r = r0; r < r1; r++) {
        const char *xr = xrow(j, xf, r);
        uint8_t *orow = (uint8_t *) j->row->data + (size_t) r * ob;
        uint8_t *srow = (uint8_t *) j->row->scales + (size_t) r * (size_t) nb;
        for (int64_t b0 = 0; b0 < nb; b0 += 16) {
            __m512 x[16];
            __m512i m[16];
            for (int k = 0; k < 16; k++) {
                const int64_t c = 16 * (b0 + k);
                x[k] = nv_ld16(xr + (size_t) c * es, xf, C - c);
                m[k] = nv_abs(x[k]);
            }
            uint8_t sc[16];
            float f[16];
            const unsigned nan = nv_scales(j, tree16(m, 0), sc, f);
            const int64_t g = min64(16, nb - b0);
            memcpy(srow + b0, sc, (size_t) g);
            uint8_t out[128];
            __m512i rnd[16];
            if (sr) sr_words16(j, (uint64_t) (r * C + 16 * b0), 16, rnd);
            nv_pack16(x, f, nan, sr ? rnd : NULL, out);
            const size_t o = (size_t) (8 * b0), n = ob - o < 128 ? ob - o : 128;
            memcpy(orow + o, out, n);
        }
    }
}

/* ---- 16x16 tiles: NV16 columnwise or dual-axis, NV16X16 ---- */

/* Writes the 8-byte code rows of a tile's blocks: block i (i < nb) to dst + i * pitch, n
 * bytes each. */
AI void nv_put_blocks(const uint8_t out[128], int nb, uint8_t *dst, size_t pitch, size_t n) {
    for (int i = 0; i < nb; i++) memcpy(dst + (size_t) i * pitch, out + 8 * i, n);
}

/* The tile at input rows [rb, rb + nr), columns [c0, c0 + nc): its rows r[] (zero-padded). */
AI void nv_load_tile(const lowp_quant_job *j, int64_t rb, int64_t nr, int64_t c0, int64_t nc,
                     lowp_format xf, __m512 r[16]) {
    const size_t es = xsize(xf);
    for (int i = 0; i < 16; i++)
        r[i] =
            i < nr ? nv_ld16(xrow(j, xf, rb + i) + (size_t) c0 * es, xf, nc) : _mm512_setzero_ps();
}

AI void nv_tile(const lowp_quant_job *j, int64_t rb, int64_t nr, int64_t c0, int64_t nc,
                lowp_format xf, int sr) {
    const int64_t R = j->rows, C = j->cols;
    const size_t rob = code_bytes(E2M1, C);
    __m512 r[16], t[16];
    __m512i rr[16], rc[16]; /* SR words of the row and the column blocks */
    uint8_t sc[16], out[128];
    float f[16];
    nv_load_tile(j, rb, nr, c0, nc, xf, r);
    if (j->col) nv_transpose(r, t);
    if (sr && j->row) sr_words16(j, (uint64_t) (rb * C + c0), (uint64_t) C, rr);
    if (sr && j->col) sr_words16(j, (uint64_t) (c0 * R + rb), (uint64_t) R, rc);
    const __m512i *pr = sr ? rr : NULL, *pc = sr ? rc : NULL;
    if (j->scaling == LOWP_SCALING_NV16X16) {
        const __m512i m = _mm512_set1_epi32((int) _mm512_reduce_max_epu32(nv_lanemax(r)));
        const unsigned nan = nv_scales(j, m, sc, f) ? 0xFFFFu : 0u;
        if (j->row) {
            const int64_t nbc = (C + 15) / 16;
            ((uint8_t *) j->row->scales)[(rb / 16) * nbc + c0 / 16] = sc[0];
            nv_pack16(r, f, nan, pr, out);
            nv_put_blocks(out, (int) nr, (uint8_t *) j->row->data + (size_t) rb * rob + c0 / 2, rob,
                          (size_t) (nc + 1) / 2);
        }
        if (j->col) {
            const int64_t nbr = (R + 15) / 16;
            ((uint8_t *) j->col->scales)[(c0 / 16) * nbr + rb / 16] = sc[0];
            nv_pack16(t, f, nan, pc, out);
            nv_put_blocks(out, (int) nc,
                          (uint8_t *) j->col->data + (size_t) c0 * j->col_ob + rb / 2, j->col_ob,
                          (size_t) (nr + 1) / 2);
        }
        return;
    }
    if (j->row) { /* NV16 dual-axis: row i's maximum is lane i of the transposed vectors' */
        const unsigned nan = nv_scales(j, nv_lanemax(t), sc, f);
        const int64_t nbc = (C + 15) / 16;
        uint8_t *s = (uint8_t *) j->row->scales + rb * nbc + c0 / 16;
        for (int i = 0; i < nr; i++) s[i * nbc] = sc[i];
        nv_pack16(r, f, nan, pr, out);
        nv_put_blocks(out, (int) nr, (uint8_t *) j->row->data + (size_t) rb * rob + c0 / 2, rob,
                      (size_t) (nc + 1) / 2);
    }
    if (j->col) {
        const unsigned nan = nv_scales(j, nv_lanemax(r), sc, f);
        uint8_t *s = (uint8_t *) j->col->scales + c0 * j->col_nbr + rb / 16;
        for (int i = 0; i < nc; i++) s[i * j->col_nbr] = sc[i];
        nv_pack16(t, f, nan, pc, out);
        nv_put_blocks(out, (int) nc, (uint8_t *) j->col->data + (size_t) c0 * j->col_ob + rb / 2,
                      j->col_ob, (size_t) (nr + 1) / 2);
    }
}

AI void nv_body(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, int sr) {
    if (j->scaling == LOWP_SCALING_NV16 && !j->col) {
        nv_rows(j, r0, r1, xf, sr);
        return;
    }
    for (int64_t rb = r0; rb < r1; rb += 16) /* r0 is a multiple of 16 (band_rows) */
        for (int64_t c0 = 0; c0 < j->cols; c0 += 16)
            nv_tile(j, rb, min64(16, r1 - rb), c0, min64(16, j->cols - c0), xf, sr);
}

/* ---- NV16's grouped columnwise copy ---- */

/* Writes n codes (nibbles of v, those past n zero) at element s of an output row: an odd s
 * completes the byte whose low nibble the previous group wrote (its high nibble then 0). */
AI void nv_put_nibbles(uint8_t *row, int64_t s, int64_t n, uint64_t v) {
    if (s & 1) {
        row[s / 2] = (uint8_t) ((row[s / 2] & 0x0F) | (v & 0xF) << 4);
        v >>= 4;
        s++;
        n--;
    }
    if (n > 0) memcpy(row + s / 2, &v, (size_t) (n + 1) / 2);
}

/* The blocks of input columns [c0, c0 + nc) over tokens [s, s + n) of one group, block index
 * blk of each output row. */
AI void nv_group_block(const lowp_quant_job *j, int64_t s, int64_t n, int64_t c0, int64_t nc,
                       int64_t blk, int64_t nbt, lowp_format xf, int sr) {
    const lowp_qtensor *q = j->col;
    const size_t ob = code_bytes(E2M1, j->rows);
    __m512 r[16], t[16];
    uint8_t sc[16], out[128];
    float f[16];
    nv_load_tile(j, s, n, c0, nc, xf, r);
    nv_transpose(r, t);
    const unsigned nan = nv_scales(j, nv_lanemax(r), sc, f);
    __m512i rc[16];
    if (sr) sr_words16(j, (uint64_t) (c0 * j->rows + s), (uint64_t) j->rows, rc);
    nv_pack16(t, f, nan, sr ? rc : NULL, out);
    for (int i = 0; i < nc; i++) {
        ((uint8_t *) q->scales)[(c0 + i) * nbt + blk] = sc[i];
        uint64_t v;
        memcpy(&v, out + 8 * i, sizeof v);
        nv_put_nibbles((uint8_t *) q->data + (size_t) (c0 + i) * ob, s, n, v);
    }
}

AI void nv_grouped_body(const lowp_quant_job *j, int64_t c0, int64_t c1, lowp_format xf, int sr) {
    const lowp_qtensor *q = j->col;
    int64_t nbt = 0, used = 0; /* blocks per output row, over every group */
    for (int32_t g = 0; g < q->groups; g++) {
        nbt += (q->group_offs[g] - used + 15) / 16;
        used = q->group_offs[g];
    }
    const size_t ob = code_bytes(E2M1, j->rows), u0 = code_bytes(E2M1, used);
    for (int64_t cc = c0; cc < c1; cc += 16) {
        const int64_t nc = min64(16, c1 - cc);
        int64_t start = 0, blk = 0;
        for (int32_t g = 0; g < q->groups; g++) {
            const int64_t end = q->group_offs[g];
            for (int64_t s = start; s < end; s += 16, blk++)
                nv_group_block(j, s, min64(16, end - s), cc, nc, blk, nbt, xf, sr);
            start = end;
        }
        if (u0 < ob) /* tokens past offs[G-1]: code 0 */
            for (int64_t i = 0; i < nc; i++)
                memset((uint8_t *) q->data + (size_t) (cc + i) * ob + u0, 0, ob - u0);
    }
}

/* ---- MX32 with E2M1 elements under SR ----
 * The reference's steps (section 3) on the vectors above: each 1x32 block is two 16-lane
 * vectors, the block maxima as |x| bit patterns (NaN above Inf above numbers), then per block
 * the scalar rules: the E8M0 code of the maximum under the job's mode and its quantization
 * factor; the elements x * factor rounded by SR (0 in a block of code 0xFF). The rowwise copy
 * takes a row 512 elements at a time, the columnwise one tiles of 32 rows by 16 columns (two
 * 16x16 transposes). */

/* Block codes into sc and factors into f for 16 blocks of maxima `amax`; returns the NaN
 * blocks' bits. */
AI unsigned mxsr_scales(const lowp_quant_job *j, __m512i amax, uint8_t sc[16], float f[16]) {
    uint32_t a[16];
    unsigned nan = 0;
    _mm512_storeu_si512(a, amax);
    for (int i = 0; i < 16; i++) {
        sc[i] = lowp_rule_e8m0_code(lowp_u2f(a[i]), j->et, j->mode);
        f[i] = lowp_rule_e8m0_quant_factor(sc[i]);
        if (sc[i] == 0xFF) nan |= 1u << i;
    }
    return nan;
}

/* 16 blocks of 32 (lo[i], hi[i]: block i's two halves, with their SR words rl[i], rh[i])
 * packed as 256 bytes, block i's 16 at 16i. */
AI void mxsr_pack16(const __m512 *lo, const __m512 *hi, int step, const float f[16], unsigned nan,
                    const __m512i rl[16], const __m512i rh[16], uint8_t out[256]) {
    for (int b = 0; b < 16; b += 2) {
        const int n0 = nan >> b & 1, n1 = nan >> (b + 1) & 1;
        const __m256i h =
            nv_pack4(nv_enc(lo[b * step], f[b], n0, rl + b), nv_enc(hi[b * step], f[b], n0, rh + b),
                     nv_enc(lo[(b + 1) * step], f[b + 1], n1, rl + b + 1),
                     nv_enc(hi[(b + 1) * step], f[b + 1], n1, rh + b + 1));
        _mm256_storeu_si256((__m256i *) (out + 16 * b), h);
    }
}

AI void mxsr_rows(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf) {
    const int64_t C = j->cols, nb = (C + 31) / 32;
    const size_t es = xsize(xf), ob = code_bytes(E2M1, C);
    for (int64_t r = r0; r < r1; r++) {
        const char *xr = xrow(j, xf, r);
        uint8_t *orow = (uint8_t *) j->row->data + (size_t) r * ob;
        uint8_t *srow = (uint8_t *) j->row->scales + (size_t) r * (size_t) nb;
        for (int64_t b0 = 0; b0 < nb; b0 += 16) {
            __m512 x[32];
            __m512i m[16], rl[16], rh[16];
            for (int k = 0; k < 32; k++) {
                const int64_t c = 16 * (2 * b0 + k);
                x[k] = nv_ld16(xr + (size_t) c * es, xf, C - c);
            }
            for (int k = 0; k < 16; k++)
                m[k] = _mm512_max_epu32(nv_abs(x[2 * k]), nv_abs(x[2 * k + 1]));
            uint8_t sc[16], out[256];
            float f[16];
            const unsigned nan = mxsr_scales(j, tree16(m, 0), sc, f);
            memcpy(srow + b0, sc, (size_t) min64(16, nb - b0));
            sr_words16(j, (uint64_t) (r * C + 32 * b0), 32, rl);
            sr_words16(j, (uint64_t) (r * C + 32 * b0 + 16), 32, rh);
            mxsr_pack16(x, x + 1, 2, f, nan, rl, rh, out);
            const size_t o = (size_t) (16 * b0), n = ob - o < 256 ? ob - o : 256;
            memcpy(orow + o, out, n);
        }
    }
}

/* The columnwise copy of input rows [r0, r1), r0 a multiple of 32. */
AI void mxsr_cols(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf) {
    const int64_t R = j->rows, C = j->cols;
    for (int64_t rb = r0; rb < r1; rb += 32) {
        const int64_t nr = min64(32, r1 - rb);
        for (int64_t c0 = 0; c0 < C; c0 += 16) {
            const int64_t nc = min64(16, C - c0);
            __m512 r[32], t[32];
            __m512i rl[16], rh[16];
            uint8_t sc[16], out[256];
            float f[16];
            nv_load_tile(j, rb, min64(16, nr), c0, nc, xf, r);
            nv_load_tile(j, rb + 16, nr - 16, c0, nc, xf, r + 16);
            const unsigned nan =
                mxsr_scales(j, _mm512_max_epu32(nv_lanemax(r), nv_lanemax(r + 16)), sc, f);
            uint8_t *s = (uint8_t *) j->col->scales + c0 * j->col_nbr + rb / 32;
            for (int i = 0; i < nc; i++) s[i * j->col_nbr] = sc[i];
            nv_transpose(r, t);
            nv_transpose(r + 16, t + 16);
            sr_words16(j, (uint64_t) (c0 * R + rb), (uint64_t) R, rl);
            sr_words16(j, (uint64_t) (c0 * R + rb + 16), (uint64_t) R, rh);
            mxsr_pack16(t, t + 16, 1, f, nan, rl, rh, out);
            for (int i = 0; i < nc; i++)
                memcpy((uint8_t *) j->col->data + (size_t) (c0 + i) * j->col_ob + rb / 2,
                       out + 16 * i, (size_t) (nr + 1) / 2);
        }
    }
}

AI void mxsr_body(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, int sr) {
    (void) sr;
    if (j->row) mxsr_rows(j, r0, r1, xf);
    if (j->col) mxsr_cols(j, r0, r1, xf);
}

/* ---- entries, one noinline instance per input format and rounding ---- */

#define NV_ENTRY(NAME, BODY, XF, SR)                                                               \
    static __attribute__((noinline)) void NAME(const lowp_quant_job *j, int64_t a, int64_t b) {    \
        BODY(j, a, b, XF, SR);                                                                     \
    }
NV_ENTRY(nv_f32, nv_body, F32, 0)
NV_ENTRY(nv_bf16, nv_body, LOWP_FORMAT_BF16, 0)
NV_ENTRY(nv_f32_sr, nv_body, F32, 1)
NV_ENTRY(nv_bf16_sr, nv_body, LOWP_FORMAT_BF16, 1)
NV_ENTRY(nvg_f32, nv_grouped_body, F32, 0)
NV_ENTRY(nvg_bf16, nv_grouped_body, LOWP_FORMAT_BF16, 0)
NV_ENTRY(nvg_f32_sr, nv_grouped_body, F32, 1)
NV_ENTRY(nvg_bf16_sr, nv_grouped_body, LOWP_FORMAT_BF16, 1)
NV_ENTRY(mxsr_f32, mxsr_body, F32, 1)
NV_ENTRY(mxsr_bf16, mxsr_body, LOWP_FORMAT_BF16, 1)

void lowp_cpu_q512_mx_sr(const lowp_quant_job *j, int64_t r0, int64_t r1) {
    (j->xfmt == F32 ? mxsr_f32 : mxsr_bf16)(j, r0, r1);
}

void lowp_cpu_q512_nv(const lowp_quant_job *j, int64_t r0, int64_t r1, const q512_plan *p) {
    (void) p;
    if (j->xfmt == F32)
        (j->sr ? nv_f32_sr : nv_f32)(j, r0, r1);
    else
        (j->sr ? nv_bf16_sr : nv_bf16)(j, r0, r1);
}

void lowp_cpu_quant_grouped_avx512_nv(const lowp_quant_job *j, int64_t c0, int64_t c1) {
    if (j->xfmt == F32)
        (j->sr ? nvg_f32_sr : nvg_f32)(j, c0, c1);
    else
        (j->sr ? nvg_bf16_sr : nvg_bf16)(j, c0, c1);
}
