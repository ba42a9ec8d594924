/* Private to the AVX-512 quantization kernels (quant_avx512*.c, docs/numerics.md sections 3-4,
 * bit-exact with quant_ref.c): the pieces every scaling family is built from, and the
 * families' entries, which quant_avx512.c calls with the plan of a call (q512_plan).
 *
 * Every kind is built from a few 16-lane pieces:
 *   - loads of 32 consecutive input elements as two binary32 vectors. F32 keeps natural order;
 *     BF16 is widened by unpacking with a zero vector (no shift needed), which interleaves
 *     groups of four elements across the two vectors. Packing and the column addresses of the
 *     transposed copy undo that order, so no permute is spent on the loads;
 *   - amax as an unsigned maximum of |x| bit patterns: NaN patterns sort above Inf above every
 *     finite value, so the integer maximum is NaN-propagating like lowp_amax_acc, and one test
 *     (>= 0x7F800000) finds the blocks whose E8M0 scale is 0xFF;
 *   - per-block maxima of 16 blocks reduced together by a transposing tree (3 ops a level);
 *   - the E8M0 scale rule vectorized over 16 blocks (mirrors lowp_rule_e8m0_code; the test
 *     sweeps amax bit patterns against the reference) and the binary32 rules, which are cheap
 *     per 128 elements or per row, called as the scalar functions of scale_rules.h;
 *   - 16-lane integer encoders: enc16 for any input, enc16_sub, shorter, for BF16 input with
 *     power-of-two scales, and enc16_fsub, as short but for a subnormal-product check, for
 *     any input with binary32 or power-of-two scales (see their comments); and a 32-lane one,
 *     enc32w, on BF16 patterns in 16-bit lanes with E8M0 scales (rowwise MX32);
 *   - byte packing with two saturating packs and one permute per 64 codes (cheaper than four
 *     vpmovdb), nibble merging for E2M1, and for the columnwise copy a register transpose:
 *     4x4 byte tiles by vpshufb, then an 8x16 dword transpose by unpacks and vpermt2q.
 *
 * E8M0 kinds need no NaN logic in the encoders: a block holding NaN or Inf gets scale 0xFF,
 * and every other block's scaled values are bounded by 2^(emax+1). Such blocks are encoded
 * with a dummy factor and their codes replaced in registers before the store. The binary32
 * kinds keep the per-element NaN and Inf rules (NaN keeps its sign there).
 *
 * Every piece is static and forcibly inlined: each family file specializes them in its noinline
 * instances, one per (input, element) format pair (Q512_INSTANCE). Include it only from files
 * compiled with the AVX-512 flags (src/cpu/CMakeLists.txt).
 */
#ifndef LOWP_CPU_QUANT_AVX512_SIMD_H
#define LOWP_CPU_QUANT_AVX512_SIMD_H

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "core/scale_rules.h"
#include "cpu.h"
#include "quant_kernels.h"

/* Forced inlining specializes every kernel for the constant formats and flags of the noinline
 * instances that call it (Q512_INSTANCE, MX_TILE64B, MX_BAND64B, ROWS_B). The sanitized build
 * (LOWP_SANITIZE, -O0) defines LOWP_NO_FORCED_INLINE: there the compiler copied whole kernels
 * into each instance and instrumented every copy, and the kernels' compile (then one file)
 * peaked at 7.1 GiB (10 minutes); without the forced inlining, 0.14 GiB (2 s). Same source and same
 * checks, only not specialized; the Release object is unchanged, byte for byte. */
#ifdef LOWP_NO_FORCED_INLINE
#define FORCE_INLINE
#else
#define FORCE_INLINE __attribute__((always_inline))
#endif
#define AI     static inline FORCE_INLINE
#define V32(x) _mm512_set1_epi32((int) (uint32_t) (x))

static const lowp_format F32 = LOWP_FORMAT_F32;
static const lowp_format E2M1 = LOWP_FORMAT_E2M1;

/* ---- small helpers ---- */

AI __mmask16 mask16(int64_t n) {
    return n <= 0 ? 0 : n >= 16 ? (__mmask16) 0xFFFF : (__mmask16) ((1u << n) - 1u);
}
AI __mmask32 mask32(int64_t n) {
    return n <= 0 ? 0 : n >= 32 ? (__mmask32) 0xFFFFFFFFu : (__mmask32) ((1u << n) - 1u);
}
AI __mmask64 mask64(int64_t n) {
    return n <= 0 ? 0 : n >= 64 ? (__mmask64) ~0ull : (__mmask64) ((1ull << n) - 1ull);
}
AI int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}
/* The end of the band of rows that starts at r: the next multiple of h, at most r1. */
AI int64_t band_end(int64_t r, int64_t r1, int64_t h) {
    return min64(r1, (r / h + 1) * h);
}
AI size_t xsize(lowp_format xf) {
    return xf == F32 ? 4 : 2;
}
/* Bytes of one output row of n codes (E2M1 packs two per byte). */
AI size_t code_bytes(lowp_format ef, int64_t n) {
    return ef == E2M1 ? (size_t) (n + 1) / 2 : (size_t) n;
}
AI const char *xrow(const lowp_quant_job *j, lowp_format xf, int64_t r) {
    return (const char *) j->x + (size_t) r * (size_t) j->cols * xsize(xf);
}
/* A hint only: prefetching never faults, so the address may lie past the input. Into L2: the
 * data is used a few tiles later, and bringing it into L1 would evict the tile buffer. */
AI void prefetch(const char *p, size_t off) {
    _mm_prefetch((const char *) ((uintptr_t) p + off), _MM_HINT_T1);
}

/* The rowwise kernels' loops over binary32 rows (MX32, BLOCK128, ROW, TENSOR): each row's
 * lines, ROW_AHEAD bytes on, asked into L1 while the row is encoded; the row loop stalled on
 * its first loads otherwise. Inputs not in the caches (96 different inputs in turn), one
 * thread, ms per call: 512x384 F32 MX32 0.099-0.106 -> 0.046-0.062, BLOCK128 0.089-0.100 ->
 * 0.056-0.057, ROW 0.076-0.094 -> 0.042; 2048x384 MX32 0.41 -> 0.22. `lowp bench quant --input
 * f32` (8192x4096): mxfp8_row 0.88-0.89 -> 0.93-0.97 of memcpy, tensor_dual 0.48 -> 0.52-0.53.
 * BF16 rows gained nothing (512x384, 2048x768 cold), so they go without. */
#define ROW_AHEAD 2048
/* Not inlined, the format test inside: inlined into the format instances (or only its call,
 * behind the test), it slowed BLOCK128X128's tile loop, which does not call it, from 0.68 to
 * 0.60 of memcpy (8192x4096 F32, one thread; code placement, measured in three rounds). */
static __attribute__((noinline, unused)) void row_ahead(const char *xr, lowp_format xf,
                                                        size_t rbytes) {
    if (xf != F32) return;
    for (size_t o = 0; o < rbytes; o += 64)
        _mm_prefetch((const char *) ((uintptr_t) xr + ROW_AHEAD + o), _MM_HINT_T0);
}

/* ---- element formats ---- */

AI int ef_mbits(lowp_format ef) {
    return ef == LOWP_FORMAT_E4M3 ? 3 : ef == E2M1 ? 1 : 2;
}
AI int ef_bias(lowp_format ef) {
    return ef == LOWP_FORMAT_E4M3 ? 7 : ef == E2M1 ? 1 : 15;
}
AI int ef_emax(lowp_format ef) {
    return ef == LOWP_FORMAT_E4M3 ? 8 : ef == E2M1 ? 2 : 15;
}
AI uint32_t ef_maxcode(lowp_format ef) {
    return ef == LOWP_FORMAT_E4M3 ? 0x7E : ef == E2M1 ? 0x7 : 0x7B;
}
AI uint32_t ef_nancode(lowp_format ef) {
    return ef == LOWP_FORMAT_E4M3 ? 0x7F : ef == E2M1 ? 0x0 : 0x7E;
}
AI int ef_bits(lowp_format ef) {
    return ef == E2M1 ? 4 : 8;
}

/* ---- encoders ---- */

/* Satfinite RNE codes of the 16 binary32 values y (docs/numerics.md section 2), in 32-bit lanes,
 * with one hardware rounding: |y| + C, where C is a power of two whose ulp is the target's
 * quantum at |y|'s exponent (the quantum stops shrinking at the target's smallest normal
 * exponent, so subnormal targets come out of the same add; the add is pinned to RNE, so the
 * MXCSR cannot change it). With `special` set, NaN gives sign|NaN code and Inf and overflow
 * give sign|max code, as the reference does; without it the caller guarantees finite
 * |y| < 2^(emax+2) (E8M0 blocks). */
AI __m512i enc16(__m512 y, lowp_format ef, int special) {
    const int m = ef_mbits(ef), b = ef_bias(ef);
    const uint32_t minn = (uint32_t) (128 - b) << 23; /* bits of the smallest normal */
    const uint32_t k = (uint32_t) (128 - b) << m;     /* exponent part of that code */
    const __m512i u = _mm512_castps_si512(y);
    __m512i a = _mm512_and_si512(u, V32(0x7FFFFFFF));
    __m512i ac = a;
    /* Everything at or above 2^(emax+2) saturates; clamping keeps C's exponent in range. */
    if (special) ac = _mm512_min_epu32(a, V32((uint32_t) (127 + ef_emax(ef) + 2) << 23));
    __m512i e = _mm512_max_epu32(_mm512_and_si512(ac, V32(0x7F800000)), V32(minn));
    __m512i c = _mm512_add_epi32(e, V32((uint32_t) (23 - m) << 23)); /* ulp(C) = quantum */
    __m512 s = _mm512_add_round_ps(_mm512_castsi512_ps(ac), _mm512_castsi512_ps(c),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* quanta above C (0 .. 2^(m+1)), plus the exponent field: the carry of a rounding that
     * reaches the next binade lands in the exponent for free. */
    __m512i code =
        _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(s), c), _mm512_srli_epi32(e, 23 - m));
    code = _mm512_sub_epi32(_mm512_min_epu32(code, V32(ef_maxcode(ef) + k)), V32(k));
    if (special) {
        __mmask16 nan = _mm512_cmpgt_epu32_mask(a, V32(0x7F800000));
        code = _mm512_mask_mov_epi32(code, nan, V32(ef_nancode(ef)));
    }
    /* sign | code in one ternary op ((A & B) | C). */
    const int bits = ef_bits(ef);
    return _mm512_ternarylogic_epi32(_mm512_srli_epi32(u, 32 - bits), V32(1u << (bits - 1)), code,
                                     0xEA);
}

/* How a kernel encodes: binary32 scales (NaN and Inf per element); binary32 scales of a
 * group whose amax is finite (EM_FIN: then |x * s| <= fmax (1 + 2^-23), as s <= fmax / amax
 * up to rounding, or s = FLT_MAX only for amax < fmax / FLT_MAX: no element needs the special
 * steps); E8M0 scales with enc16; E8M0 scales with enc16_sub (enc16_fsub for binary32
 * input); EM_FIN's groups with enc16_fsub (its factor from fsub_factors). */
enum { EM_FP32 = 0, EM_E8 = 1, EM_SUB = 2, EM_FIN = 3, EM_FSUB = 4 };

/* The binary32 patterns u rounded at bit sh, ties to even (the lsb test and a masked
 * increment), shifted down: the carry of a rounding into the next binade lands in the
 * exponent field; the sign bit moves to bit 31 - sh. */
AI __m512i round_raw(__m512i u, int sh) {
    __m512i t = _mm512_add_epi32(u, V32((1u << (sh - 1)) - 1u));
    t = _mm512_mask_add_epi32(t, _mm512_test_epi32_mask(u, V32(1u << sh)), t, V32(1));
    return _mm512_srli_epi32(t, sh);
}

/* Codes of E8M0 blocks for BF16 input: with f = 2^(bias - code), the product x * f is exact
 * whenever it matters (8 significant bits; a product too small to hold them is far below
 * half the smallest subnormal code) and is the reference's x * 2^(127-code) times
 * 2^(bias-127). That factor moves the target's smallest normal onto binary32's, so the
 * target's subnormals land on binary32's subnormal grid and the code is the bit pattern
 * rounded at bit sh = 23-m (RNE: the lsb test and a masked increment), exponent carry
 * included. The magnitudes are small, so the sign bit rides along untouched: the result is
 * "raw", the sign at bit 31-sh above the magnitude code; fixw finishes it after the first
 * pack, on 32 codes at once. Needs subnormal results (FTZ/DAZ off, checked per call) and
 * f >= 2^-149 (code <= bias+149, checked per block group). */
AI __m512i enc16_sub(__m512 x, __m512 f, lowp_format ef) {
    return round_raw(_mm512_castps_si512(_mm512_mul_ps(x, f)), 23 - ef_mbits(ef));
}

/* Finishes 32 raw enc16_sub codes packed to 16-bit words: the sign from bit 31-sh to the
 * format's sign bit; with `clip` (FLOOR and EVEN scales, which can put a block's maximum
 * above fmax; RCEIL and CEIL never do) the magnitude saturates at the largest code first. */
AI __m512i fixw(__m512i w, lowp_format ef, int em, int clip) {
    if (em != EM_SUB && em != EM_FSUB) return w;
    const int sb = 31 - (23 - ef_mbits(ef)), bits = ef_bits(ef);
    const __m512i low = _mm512_set1_epi16((short) ((1 << (bits - 1)) - 1));
    __m512i m = w;
    if (clip)
        m = _mm512_min_epu16(_mm512_and_si512(w, _mm512_set1_epi16((short) ((1 << sb) - 1))),
                             _mm512_set1_epi16((short) ef_maxcode(ef)));
    /* low bits from m, the sign bit from w >> (sb - bits + 1), nothing above (B ? C : A) */
    return _mm512_ternarylogic_epi32(_mm512_srli_epi16(w, sb - bits + 1), low, m, 0xB8);
}

/* EM_FIN's codes the way of enc16_sub, raw as it leaves them, for any binary32 x and a
 * binary32 scale s given as f = s * 2^(bias-127), a normal number (fsub_factors), or an E8M0
 * factor 2^(bias-code) (a power of two, so s is again exact; binary32 input). The product
 * x * f is the reference's x * s moved by a power of two, rounded once: where it is normal,
 * it is exactly round(x * s) * 2^(bias-127), and the target's codes are its bit pattern
 * rounded at bit sh (the target's exponent field is binary32's there; the largest EM_FIN
 * value rounds down to the largest code). Where it is subnormal, the multiply may already
 * have rounded at 2^-149, and rounding again at the target's quantum would be a second
 * rounding (x * s = (2k+1)/2 quanta + a little, rounded onto the tie, then to even): those
 * lanes, rare in practice (below 2^-6 after scaling, for E4M3), take enc16 on x * s, s being
 * f moved back exactly. Zero and underflow to zero are exact. Needs subnormal results. */
AI __m512i enc16_fsub(__m512 x, __m512 f, lowp_format ef) {
    const int sh = 23 - ef_mbits(ef), bits = ef_bits(ef);
    const __m512 z = _mm512_mul_ps(x, f);
    const __m512i u = _mm512_castps_si512(z);
    __m512i raw = round_raw(u, sh);
    const __mmask16 sub = _mm512_fpclass_ps_mask(z, 0x20); /* denormal lanes */
    if (__builtin_expect(sub != 0, 0)) {
        const __m512 back = _mm512_castsi512_ps(V32((uint32_t) (254 - ef_bias(ef)) << 23));
        const __m512i c = enc16(_mm512_mul_ps(x, _mm512_mul_ps(f, back)), ef, 0);
        /* its magnitude, with the sign where enc16_sub leaves it ((A & B) | C) */
        const __m512i mag = _mm512_and_si512(c, V32((1u << (bits - 1)) - 1u));
        raw = _mm512_mask_mov_epi32(
            raw, sub,
            _mm512_ternarylogic_epi32(_mm512_srli_epi32(u, sh), V32(1u << (31 - sh)), mag, 0xEA));
    }
    return raw;
}

/* The factors f = s * 2^(bias-127) of enc16_fsub for the 16 scales s: 1 when every lane of
 * s gives a normal factor (s >= 2^(1-bias); then s = f * 2^(127-bias) exactly), else 0. */
AI int fsub_factors(__m512 s, lowp_format ef, __m512 *f) {
    *f = _mm512_mul_ps(s, _mm512_castsi512_ps(V32((uint32_t) ef_bias(ef) << 23)));
    return _mm512_cmp_ps_mask(*f, _mm512_set1_ps(FLT_MIN), _CMP_LT_OQ) == 0;
}

/* Codes of x scaled by f (the scale, or the factor of that encoder). */
AI __m512i encx(__m512 x, __m512 f, lowp_format xf, lowp_format ef, int em) {
    if (em == EM_FSUB) return enc16_fsub(x, f, ef);
    /* E8M0 factors are powers of two: binary32 input takes enc16_fsub's subnormal check */
    if (em == EM_SUB) return xf == F32 ? enc16_fsub(x, f, ef) : enc16_sub(x, f, ef);
    return enc16(_mm512_mul_ps(x, f), ef, em == EM_FP32);
}

/* EM_FIN for a finite amax pattern, else EM_FP32. */
AI int fp32_em(uint32_t amax_bits) {
    return amax_bits < 0x7F800000u ? EM_FIN : EM_FP32;
}

/* ---- the 16-bit encoder: BF16 input, E8M0 scales, 8-bit codes ---- */

/* enc32w's target-subnormal magnitudes: |x| = sig * 2^(e' - 134) with e' = max(e, 1) and sig
 * the significand with its implicit bit (none for e = 0), and the code is |x| * 2^(127-code)
 * over the target's quantum 2^(1-bias-m), that is sig shifted right by n = code + 8 - bias - m
 * - e' and rounded to nearest even (n >= sh here; past 9 every sig < 256 gives 0). */
AI __m512i w16_tiny(__m512i a, __m512i off, lowp_format ef) {
    const int m = ef_mbits(ef);
    const __m512i one = _mm512_set1_epi16(1), e = _mm512_srli_epi16(a, 7);
    const __m512i m7 = _mm512_and_si512(a, _mm512_set1_epi16(0x7F));
    const __m512i sig = _mm512_mask_mov_epi16(m7, _mm512_test_epi16_mask(e, e),
                                              _mm512_or_si512(m7, _mm512_set1_epi16(0x80)));
    __m512i n = _mm512_sub_epi16(
        _mm512_add_epi16(_mm512_srli_epi16(off, m), _mm512_set1_epi16((short) (8 - m))),
        _mm512_max_epu16(e, one));
    n = _mm512_min_epu16(n, _mm512_set1_epi16(9));
    const __m512i hm1 = _mm512_sub_epi16(_mm512_sllv_epi16(one, _mm512_sub_epi16(n, one)), one);
    const __m512i lsb = _mm512_and_si512(_mm512_srlv_epi16(sig, n), one);
    return _mm512_srlv_epi16(_mm512_add_epi16(_mm512_add_epi16(sig, hm1), lsb), n);
}

/* A BF16 element is already a short binary32: multiplying by the block's factor 2^(127-code)
 * only moves its exponent, so wherever the scaled value is a normal number of the target, the
 * code is the BF16 pattern |x| rounded at bit sh = 7 - m (RNE: the lsb test and a masked
 * increment; a carry into the next binade lands in the exponent field) with (code - bias) << m
 * taken off the exponent field. That is 32 elements per vector in 16-bit lanes, without the
 * widening, the binary32 multiply and the packing to words of the binary32 encoders. The
 * subtraction saturates, so zeros come out as 0 with no test; it needs code >= bias (w16_ok).
 * The lanes whose scaled value is a target subnormal (0 < |x| < 2^(code+1-bias), BF16
 * subnormals included: their exponent field cannot be moved) are rare in practice and take
 * w16_tiny. With `clip` (FLOOR and EVEN scales, as in fixw) the magnitude saturates at the
 * largest code. Per lane, off = (code - bias) << m and thr1 = (code + 1 - bias) << 7, minus 1
 * (w16_params). The result is the code with its sign, in the low byte of each lane. The
 * rowwise MX32 kernel uses it (1.13-1.15x in cache, 64x4096 to 2048x4096 BF16, one thread;
 * about 1.04x beyond the caches, where memory bounds it); in the dual-axis kernel it measured
 * no faster on either copy (the maxima pass, the transpose and the stores hold its time), so
 * that kernel keeps the binary32 encoders. */
AI __m512i enc32w(__m512i v, __m512i off, __m512i thr1, lowp_format ef, int clip) {
    const int m = ef_mbits(ef), sh = 7 - m;
    const __m512i a = _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF));
    __m512i t = _mm512_add_epi16(a, _mm512_set1_epi16((short) ((1 << (sh - 1)) - 1)));
    t = _mm512_mask_add_epi16(t, _mm512_test_epi16_mask(a, _mm512_set1_epi16((short) (1 << sh))), t,
                              _mm512_set1_epi16(1));
    __m512i mag = _mm512_subs_epu16(_mm512_srli_epi16(t, sh), off);
    /* 0 < |x| < threshold: |x| - 1 (0 wraps to 0xFFFF) below threshold - 1 */
    const __mmask32 tiny = _mm512_cmplt_epu16_mask(_mm512_sub_epi16(a, _mm512_set1_epi16(1)), thr1);
    if (__builtin_expect(tiny != 0, 0))
        mag = _mm512_mask_mov_epi16(mag, tiny, w16_tiny(a, off, ef));
    if (clip) mag = _mm512_min_epu16(mag, _mm512_set1_epi16((short) ef_maxcode(ef)));
    /* sign | magnitude ((A & B) | C) */
    return _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 8), _mm512_set1_epi16(0x80), mag, 0xEA);
}

/* Whether enc32w can take the 16 E8M0 codes c (lanes m): 8-bit codes, subnormals kept (the
 * reference's products depend on the MXCSR otherwise), every code >= bias. */
AI int w16_ok(__m512i c, __mmask16 m, lowp_format ef, int em_ok) {
    return ef != E2M1 && em_ok && _mm512_mask_cmplt_epu32_mask(m, c, V32(ef_bias(ef))) == 0;
}

/* enc32w's lane parameters of 16 codes c, stored as 16-bit words: off[k], thr1[k] for lane k
 * (NaN blocks, code 0xFF, get parameters too: their codes are replaced). */
AI void w16_params(__m512i c, lowp_format ef, uint16_t *off, uint16_t *thr1) {
    const __m512i d = _mm512_sub_epi32(c, V32(ef_bias(ef)));
    _mm256_storeu_si256((__m256i *) off, _mm512_cvtepi32_epi16(_mm512_slli_epi32(d, ef_mbits(ef))));
    _mm256_storeu_si256((__m256i *) thr1,
                        _mm512_cvtepi32_epi16(_mm512_sub_epi32(
                            _mm512_slli_epi32(_mm512_add_epi32(d, V32(1)), 7), V32(1))));
}

/* 64 codes of enc32w (cols 0-31 in w0, 32-63 in w1) as 64 bytes in element order. */
AI __m512i pack_w(__m512i w0, __m512i w1) {
    return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                    _mm512_packus_epi16(w0, w1));
}

/* enc32w of 32 elements at p (n present, the rest +0), with the scalar parameters off, thr1. */
AI __m512i enc32w_at(const void *p, int64_t n, int full, const uint16_t *off, const uint16_t *thr1,
                     lowp_format ef, int clip) {
    const __m512i v = full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask32(n), p);
    return enc32w(v, _mm512_set1_epi16((short) *off), _mm512_set1_epi16((short) *thr1), ef, clip);
}

/* ---- loads and maxima ---- */

/* Input elements [0, n) at p (n <= 32; the rest read as +0 and touch no memory) as two
 * binary32 vectors. F32: lo = elements 0-15, hi = 16-31. BF16 (unpack with zero): lo holds
 * elements 0-3, 8-11, 16-19, 24-27 and hi the other groups of four. `full` says n == 32. */
AI void ld32(const void *p, lowp_format xf, int64_t n, int full, __m512 *lo, __m512 *hi) {
    if (xf == F32) {
        const float *f = (const float *) p;
        *lo = full ? _mm512_loadu_ps(f) : _mm512_maskz_loadu_ps(mask16(n), f);
        *hi = full ? _mm512_loadu_ps(f + 16) : _mm512_maskz_loadu_ps(mask16(n - 16), f + 16);
    } else {
        __m512i v = full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask32(n), p);
        *lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), v));
        *hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), v));
    }
}

/* One half (h = 0: lo, 1: hi) of ld32 of 32 present elements. */
AI __m512 ld_half(const void *p, lowp_format xf, int h) {
    if (xf == F32) return _mm512_loadu_ps((const float *) p + 16 * h);
    __m512i v = _mm512_loadu_si512(p);
    return _mm512_castsi512_ps(h ? _mm512_unpackhi_epi16(_mm512_setzero_si512(), v)
                                 : _mm512_unpacklo_epi16(_mm512_setzero_si512(), v));
}

/* The column (0..31) that lane k of half h of ld32 holds. */
AI int lane_col(lowp_format xf, int h, int k) {
    return xf == F32 ? 16 * h + k : 8 * (k >> 2) + 4 * h + (k & 3);
}

/* |x| bit patterns of 32 elements folded to 16 lanes (each the max of two elements). */
AI __m512i amax32(const void *p, lowp_format xf, int64_t n, int full) {
    if (xf == F32) {
        __m512 lo, hi;
        ld32(p, xf, n, full, &lo, &hi);
        return _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(lo), V32(0x7FFFFFFF)),
                                _mm512_and_si512(_mm512_castps_si512(hi), V32(0x7FFFFFFF)));
    }
    __m512i v = full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask32(n), p);
    __m512i a = _mm512_and_si512(v, V32(0x7FFF7FFF));
    return _mm512_max_epu32(_mm512_slli_epi32(a, 16), _mm512_and_si512(a, V32(0xFFFF0000)));
}

/* |x| of 32 elements as amax32w leaves them for tree16: F32 as amax32; BF16 the 32 raw 16-bit
 * magnitudes (the tree folds them, skipping a widening per block). */
AI __m512i amax32w(const void *p, lowp_format xf, int64_t n, int full) {
    if (xf == F32) return amax32(p, xf, n, full);
    __m512i v = full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask32(n), p);
    return _mm512_and_si512(v, V32(0x7FFF7FFF));
}

AI __m512i umax(__m512i a, __m512i b, int w16) {
    return w16 ? _mm512_max_epu16(a, b) : _mm512_max_epu32(a, b);
}

/* The maxima of 16 vectors, lane b = max over m[b] as binary32 patterns. Each level pairs
 * vectors and halves the lanes each contributes (256-bit halves, 128-bit lanes, qwords,
 * dwords), 3 ops per pair. With w16 (BF16, from amax32w) the lanes are pairs of 16-bit
 * magnitudes: the shuffles move 32 bits or more, so a dword's two words always belong to the
 * same block and one more step folds them. */
AI __m512i tree16(const __m512i m[16], int w16) {
    __m512i n[8], o[4], p[2];
    for (int i = 0; i < 8; i++)
        n[i] = umax(_mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0x44),
                    _mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0xEE), w16);
    for (int i = 0; i < 4; i++) /* 128-bit lanes: blocks 4i .. 4i+3 */
        o[i] = umax(_mm512_shuffle_i32x4(n[2 * i], n[2 * i + 1], 0x88),
                    _mm512_shuffle_i32x4(n[2 * i], n[2 * i + 1], 0xDD), w16);
    for (int i = 0; i < 2; i++) /* lane L: dwords 0-1 block 8i+L, dwords 2-3 block 8i+4+L */
        p[i] = umax(_mm512_unpacklo_epi64(o[2 * i], o[2 * i + 1]),
                    _mm512_unpackhi_epi64(o[2 * i], o[2 * i + 1]), w16);
    /* dwords (0,2) of each lane against (1,3): lane 4L+t holds block L + 4t */
    const __m512 p0 = _mm512_castsi512_ps(p[0]), p1 = _mm512_castsi512_ps(p[1]);
    __m512i q = umax(_mm512_castps_si512(_mm512_shuffle_ps(p0, p1, 0x88)),
                     _mm512_castps_si512(_mm512_shuffle_ps(p0, p1, 0xDD)), w16);
    if (w16) /* the larger word into the high half: a binary32 pattern */
        q = _mm512_slli_epi32(_mm512_max_epu16(q, _mm512_srli_epi32(q, 16)), 16);
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(idx, q);
}

/* ---- E8M0 scales ---- */

/* lowp_rule_e8m0_code of 16 amax patterns a (|amax| bits), lane by lane. */
AI __m512i e8m0_codes(__m512i a, const lowp_format_traits *t, lowp_scale_mode mode) {
    __m512i e;
    switch (mode) {
    case LOWP_SCALE_MODE_FLOOR: e = _mm512_sub_epi32(_mm512_srli_epi32(a, 23), V32(t->emax)); break;
    case LOWP_SCALE_MODE_CEIL:
        e = _mm512_srli_epi32(a, 23);
        e = _mm512_mask_add_epi32(e, _mm512_test_epi32_mask(a, V32(0x7FFFFF)), e, V32(1));
        e = _mm512_sub_epi32(e, V32(t->emax));
        break;
    case LOWP_SCALE_MODE_EVEN: {
        __m512i b =
            _mm512_and_si512(_mm512_add_epi32(a, V32(1u << (22 - t->mbits))), V32(0xFF800000));
        e = _mm512_sub_epi32(_mm512_srli_epi32(b, 23), V32(t->emax));
        break;
    }
    default: { /* RCEIL: the same binary32 multiply by the same constant 1/fmax */
        const float inv = 1.0f / t->fmax;
        __m512i d = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(inv)));
        /* E(d) + (M(d) != 0) is (d + 0x7FFFFF) >> 23; for E(d) == 0 the rule wants
         * M(d) > 0x400000, which is (d + 0x3FFFFF) >> 23. A finite amax keeps d <= FLT_MAX/6,
         * so the code stays in [0, 254] without clamps (NaN/Inf lanes are replaced below). */
        __m512i t7 = _mm512_add_epi32(d, V32(0x7FFFFF));
        t7 =
            _mm512_mask_sub_epi32(t7, _mm512_cmplt_epu32_mask(d, V32(0x800000)), t7, V32(0x400000));
        return _mm512_mask_mov_epi32(_mm512_srli_epi32(t7, 23),
                                     _mm512_cmpge_epu32_mask(a, V32(0x7F800000)), V32(0xFF));
    }
    }
    e = _mm512_min_epi32(_mm512_max_epi32(e, _mm512_setzero_si512()), V32(254));
    return _mm512_mask_mov_epi32(e, _mm512_cmpge_epu32_mask(a, V32(0x7F800000)), V32(0xFF));
}

/* The factors of 16 codes: for EM_E8 lowp_rule_e8m0_quant_factor, 2^(127-code); for EM_SUB
 * 2^(bias-code). Both may be binary32 subnormals. 0xFF (NaN) blocks get 1.0: their codes are
 * replaced anyway. */
AI __m512 e8m0_factors(__m512i code, lowp_format ef, int em) {
    const int top = em == EM_SUB ? 127 + ef_bias(ef) : 254;
    __m512i be = _mm512_sub_epi32(V32(top), code); /* biased exponent of the factor */
    __m512i f = _mm512_slli_epi32(be, 23);
    /* be <= 0: 2^(be-127) = 2^-149 * 2^(be+22) (a shift count past 31 gives 0) */
    f = _mm512_mask_mov_epi32(f, _mm512_cmple_epi32_mask(be, _mm512_setzero_si512()),
                              _mm512_sllv_epi32(V32(1), _mm512_add_epi32(be, V32(22))));
    f = _mm512_mask_mov_epi32(f, _mm512_cmpeq_epi32_mask(code, V32(0xFF)), V32(0x3F800000));
    return _mm512_castsi512_ps(f);
}

/* EM_SUB where the codes of lanes m allow it, else EM_E8: 2^(bias-code) must not underflow
 * (code <= bias + 149, NaN blocks aside), and em_ok says the MXCSR keeps subnormals (BF16
 * input then takes enc16_sub, binary32 input enc16_fsub: encx). */
AI int e8_em(__m512i code, __mmask16 m, lowp_format ef, int em_ok) {
    if (!em_ok) return EM_E8;
    __mmask16 big = _mm512_mask_cmpgt_epu32_mask(m, code, V32(ef_bias(ef) + 149)) &
                    _mm512_cmpneq_epi32_mask(code, V32(0xFF));
    return big ? EM_E8 : EM_SUB;
}

/* Whether subnormal results survive (FTZ and DAZ off), which enc16_sub needs. */
AI int subnormals_kept(void) {
    return (_mm_getcsr() & 0x8040u) == 0;
}

/* Whether the job's E8M0 scale mode can put a block's maximum above fmax (see fixw). */
AI int clip_of(const lowp_quant_job *j) {
    return j->mode == LOWP_SCALE_MODE_FLOOR || j->mode == LOWP_SCALE_MODE_EVEN;
}

/* Codes [p, p+n) of an output row: the NaN block's codes (E2M1: 0, pad nibble included). */
AI void fill_nan(uint8_t *orow, int64_t p, int64_t n, lowp_format ef) {
    if (n <= 0) return; /* never, but newer GCCs' -Wstringop-overflow cannot tell */
    if (ef == E2M1)
        memset(orow + p / 2, 0, code_bytes(ef, n));
    else
        memset(orow + p, (int) ef_nancode(ef), (size_t) n);
}

/* ---- packing and stores of the rowwise copy ---- */

/* 32 codes (the two halves of ld32) as 32 bytes in element order. */
AI __m256i pack2(__m512i lo, __m512i hi, lowp_format xf, lowp_format ef, int em, int clip) {
    /* lane L: lo dwords 4L..4L+3, hi 4L..4L+3 */
    __m512i w = fixw(_mm512_packus_epi32(lo, hi), ef, em, clip);
    if (xf == F32) /* natural halves: the qwords come as lo0 hi0 lo1 hi1 ... */
        w = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), w);
    return _mm512_cvtepi16_epi8(w);
}

/* 64 codes (two ld32 pairs) as 64 bytes in element order. */
AI __m512i pack4(__m512i l0, __m512i h0, __m512i l1, __m512i h1, lowp_format xf, lowp_format ef,
                 int em, int clip) {
    __m512i b = _mm512_packus_epi16(fixw(_mm512_packus_epi32(l0, h0), ef, em, clip),
                                    fixw(_mm512_packus_epi32(l1, h1), ef, em, clip));
    if (xf == F32) /* lane L dwords: run0 group L, run0 group 4+L, run1 L, run1 4+L */
        return _mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), b);
    /* BF16: each packus_epi32 is already in order; lane L qwords: run0 L, run1 L */
    return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), b);
}

/* E2M1: codes 2i and 2i+1 (bytes) into one byte, low nibble first; words to bytes. */
AI __m256i nibbles64(__m512i b) {
    return _mm512_cvtepi16_epi8(_mm512_or_si512(b, _mm512_srli_epi16(b, 4)));
}

/* Stores 64 codes (n valid; full: n == 64) at codes index p of the row. nan2 bit 0 (1): the
 * first (second) 32 codes belong to a NaN block. nt: a non-temporal store, only asked for
 * full 8-bit stores at 64-byte aligned addresses. */
AI void st64(uint8_t *orow, int64_t p, __m512i b, lowp_format ef, int64_t n, int full,
             unsigned nan2, int nt) {
    if (ef == E2M1) {
        __m256i h = nibbles64(b);
        if (nan2)
            h = _mm256_maskz_mov_epi8(~((nan2 & 1 ? 0xFFFFu : 0u) | (nan2 & 2 ? 0xFFFF0000u : 0u)),
                                      h);
        if (full)
            _mm256_storeu_si256((__m256i *) (orow + p / 2), h);
        else
            _mm256_mask_storeu_epi8(orow + p / 2, mask32((n + 1) / 2), h);
        return;
    }
    if (nan2)
        b = _mm512_mask_mov_epi8(
            b, (nan2 & 1 ? 0xFFFFFFFFull : 0ull) | (nan2 & 2 ? 0xFFFFFFFF00000000ull : 0ull),
            _mm512_set1_epi8((char) ef_nancode(ef)));
    if (full && nt)
        _mm512_stream_si512((__m512i *) (orow + p), b);
    else if (full)
        _mm512_storeu_si512(orow + p, b);
    else
        _mm512_mask_storeu_epi8(orow + p, mask64(n), b);
}

AI void st32(uint8_t *orow, int64_t p, __m256i b, lowp_format ef, int64_t n, int full) {
    if (ef == E2M1) {
        __m128i h = _mm256_cvtepi16_epi8(_mm256_or_si256(b, _mm256_srli_epi16(b, 4)));
        if (full)
            _mm_storeu_si128((__m128i *) (orow + p / 2), h);
        else
            _mm_mask_storeu_epi8(orow + p / 2, mask16((n + 1) / 2), h);
    } else {
        if (full)
            _mm256_storeu_si256((__m256i *) (orow + p), b);
        else
            _mm256_mask_storeu_epi8(orow + p, mask32(n), b);
    }
}

/* Codes of row elements [p, p+n) with one binary32 scale s (encoder EM_FP32 or EM_FIN). */
AI void enc_run(const char *xr, uint8_t *orow, int64_t p, int64_t n, __m512 s, lowp_format xf,
                lowp_format ef, int em, int nt) {
    const size_t es = xsize(xf);
    int64_t i = 0;
    __m512 a, b, c, d;
    for (; i + 64 <= n; i += 64) {
        ld32(xr + (size_t) (p + i) * es, xf, 32, 1, &a, &b);
        ld32(xr + (size_t) (p + i + 32) * es, xf, 32, 1, &c, &d);
        st64(orow, p + i,
             pack4(encx(a, s, xf, ef, em), encx(b, s, xf, ef, em), encx(c, s, xf, ef, em),
                   encx(d, s, xf, ef, em), xf, ef, em, 0),
             ef, 64, 1, 0, nt);
    }
    if (i < n) {
        const int64_t k = n - i;
        ld32(xr + (size_t) (p + i) * es, xf, k, 0, &a, &b);
        if (k > 32)
            ld32(xr + (size_t) (p + i + 32) * es, xf, k - 32, 0, &c, &d);
        else
            c = d = _mm512_setzero_ps();
        st64(orow, p + i,
             pack4(encx(a, s, xf, ef, em), encx(b, s, xf, ef, em), encx(c, s, xf, ef, em),
                   encx(d, s, xf, ef, em), xf, ef, em, 0),
             ef, k, 0, 0, 0);
    }
}

/* enc_run with the encoder chosen by the group's amax pattern and scale: EM_FSUB where
 * em_ok (subnormals kept) and the factor is normal. */
AI void enc_run_a(const char *xr, uint8_t *orow, int64_t p, int64_t n, __m512 s, uint32_t amax,
                  lowp_format xf, lowp_format ef, int em_ok, int nt) {
    __m512 f;
    if (fp32_em(amax) != EM_FIN)
        enc_run(xr, orow, p, n, s, xf, ef, EM_FP32, nt);
    else if (em_ok && fsub_factors(s, ef, &f))
        enc_run(xr, orow, p, n, f, xf, ef, EM_FSUB, nt);
    else
        enc_run(xr, orow, p, n, s, xf, ef, EM_FIN, nt);
}

/* Codes of row elements [p, p+32*nblk) (clipped at C) in 32-element blocks, block k scaled by
 * the E8M0 factor f[k] of encoder em; bit k of nan marks NaN blocks. Pairs of blocks make one
 * 64-byte store; p is a multiple of 64. */
AI void enc_blocks32(const char *xr, uint8_t *orow, int64_t p, int nblk, int64_t C, const float *f,
                     unsigned nan, lowp_format xf, lowp_format ef, int em, int clip, int full,
                     int nt) {
    const size_t es = xsize(xf);
    __m512 a, b, c, d;
    for (int k = 0; k < nblk; k += 2) {
        const int64_t q = p + 32 * k, n = full ? 64 : C - q;
        const int whole = full || n >= 64;
        if (whole) {
            ld32(xr + (size_t) q * es, xf, 32, 1, &a, &b);
            ld32(xr + (size_t) (q + 32) * es, xf, 32, 1, &c, &d);
        } else {
            ld32(xr + (size_t) q * es, xf, n, 0, &a, &b);
            if (n > 32)
                ld32(xr + (size_t) (q + 32) * es, xf, n - 32, 0, &c, &d);
            else
                c = d = _mm512_setzero_ps();
        }
        const __m512 f0 = _mm512_set1_ps(f[k]), f1 = _mm512_set1_ps(f[k + 1]);
        st64(orow, q,
             pack4(encx(a, f0, xf, ef, em), encx(b, f0, xf, ef, em), encx(c, f1, xf, ef, em),
                   encx(d, f1, xf, ef, em), xf, ef, em, clip),
             ef, n, whole, (nan >> k) & 3u, nt);
    }
}

/* enc_blocks32 with enc32w (BF16 input): block k's parameters off[k], thr1[k]. */
AI void enc_blocks32w(const char *xr, uint8_t *orow, int64_t p, int nblk, int64_t C,
                      const uint16_t *off, const uint16_t *thr1, unsigned nan, lowp_format ef,
                      int clip, int full, int nt) {
    for (int k = 0; k < nblk; k += 2) {
        const int64_t q = p + 32 * k, n = full ? 64 : C - q;
        const int whole = full || n >= 64;
        const char *x0 = xr + (size_t) q * 2;
        const __m512i w0 = enc32w_at(x0, n, whole || n >= 32, off + k, thr1 + k, ef, clip);
        const __m512i w1 = whole ? enc32w_at(x0 + 64, 32, 1, off + k + 1, thr1 + k + 1, ef, clip)
                           : n > 32
                               ? enc32w_at(x0 + 64, n - 32, 0, off + k + 1, thr1 + k + 1, ef, clip)
                               : _mm512_setzero_si512();
        st64(orow, q, pack_w(w0, w1), ef, n, whole, (nan >> k) & 3u, nt);
    }
}

/* ---- the columnwise copy: encode and transpose ---- */

/* Columnwise codes of a 32-row block of a tile buffer (rows `pitch` bytes apart, 32 present
 * elements each), half h of its 32 columns, each lane scaled by its factor in f, transposed:
 * z[4w+jj] holds the 32 codes (one per row) of lane 8w+jj in its low 32 bytes and of lane
 * 8w+jj+4 in its high 32 bytes. */
AI void col_codes(const char *tile, size_t pitch, int h, __m512 f, lowp_format xf, lowp_format ef,
                  int em, int clip, __m512i z[8]) {
    const __m512i tr4 =
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    __m512i t[8];
    for (int g = 0; g < 8; g++) {
        __m512i c[4];
        for (int u = 0; u < 4; u++)
            c[u] = encx(ld_half(tile + (size_t) (4 * g + u) * pitch, xf, h), f, xf, ef, em);
        /* lane L: a 4x4 byte tile (rows 4g.., lanes 4L..) row-major, shuffled to column-major:
         * dword k = the four rows' codes of lane k. */
        t[g] = _mm512_shuffle_epi8(
            _mm512_packus_epi16(fixw(_mm512_packus_epi32(c[0], c[1]), ef, em, clip),
                                fixw(_mm512_packus_epi32(c[2], c[3]), ef, em, clip)),
            tr4);
    }
    /* 8 x 16 dword transpose: v[jj][q] lane L = rows 16q..16q+15 of lane 4L+jj. */
    __m512i ulo[4], uhi[4], v[4][2];
    for (int pp = 0; pp < 4; pp++) {
        ulo[pp] = _mm512_unpacklo_epi32(t[2 * pp], t[2 * pp + 1]);
        uhi[pp] = _mm512_unpackhi_epi32(t[2 * pp], t[2 * pp + 1]);
    }
    for (int q = 0; q < 2; q++) {
        v[0][q] = _mm512_unpacklo_epi64(ulo[2 * q], ulo[2 * q + 1]);
        v[1][q] = _mm512_unpackhi_epi64(ulo[2 * q], ulo[2 * q + 1]);
        v[2][q] = _mm512_unpacklo_epi64(uhi[2 * q], uhi[2 * q + 1]);
        v[3][q] = _mm512_unpackhi_epi64(uhi[2 * q], uhi[2 * q + 1]);
    }
    const __m512i ia = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i ib = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    for (int jj = 0; jj < 4; jj++) {
        z[jj] = _mm512_permutex2var_epi64(v[jj][0], ia, v[jj][1]);
        z[4 + jj] = _mm512_permutex2var_epi64(v[jj][0], ib, v[jj][1]);
    }
}

/* Output row (input column) of lane k's codes in z[i] (col_codes): the low half of z[i] holds
 * lane lane_of(i, 0), the high half lane_of(i, 1). */
AI int lane_of(int i, int hi) {
    return 8 * (i >> 2) + (i & 3) + 4 * hi;
}

/* The band path's columnwise lines when the copy's rows are not whole 64-byte lines (the
 * grouped path's spans, or a number of input rows not a multiple of 64): per column c, the
 * bytes of its last segment that begin the next line (buf + 64 c, the segment rotated: bytes
 * [0, a) of a line a bytes into which the segment began), and whether it holds them (have[c]).
 * Each segment then completes the line its predecessor began and is stored as a whole line
 * (col_put). Stored as two pieces of lines (ordinary stores), each of the copy's lines was
 * read for ownership, 64 lines rows apart a tile: one thread, 4128x4096 ran at 0.33-0.34 of
 * memcpy against 0.95-0.96 with the carry, and 8192x2048 in 8 groups (lowp_quantize_grouped)
 * took 10.5-11.7 ms against 4.5 (docs/bench-log/quant.md, "Eighteenth session"). The row copy
 * uses the same carry along each row of a super-band (band_chunk's rc) when its rows are not
 * whole lines (columns not a multiple of 64): 4096x4128 0.30-0.31 of memcpy, 0.81-0.85 with
 * it. So do the binary32-scale kinds' column copies (col_store64, by col_put_s): 4128x4096
 * block128_dual 0.26-0.27 of memcpy, 0.48-0.50 with it. */
typedef struct col_carry {
    uint8_t *buf, *have;
} col_carry;

/* Column c's carried bytes, if any, into the line they begin (the line of d, its segment's
 * start, for a segment not stored by col_put: the carry then is empty; or the line after the
 * last segment's, d + 64). */
AI void col_carry_out(col_carry *cc, int64_t c, uint8_t *d) {
    const unsigned a = (unsigned) ((uintptr_t) d & 63);
    if (!cc->have[c]) return;
    _mm512_mask_storeu_epi8(d - a, mask64(a), _mm512_load_si512((__m512i *) (cc->buf + 64 * c)));
    cc->have[c] = 0;
}

/* col_put without the byte permutation (the binary32-scale kinds' column copies, which run
 * without AVX512_VBMI): the line assembled in a buffer from the carry and v. Always
 * non-temporal where the line is whole. The band path keeps col_put's permutation: with this
 * buffer (its loads span two stores, so they wait for them), 4128x4096 on two threads took
 * 4.1-4.4 ms against 2.6-2.8. */
AI void col_put_s(col_carry *cc, int64_t c, uint8_t *d, __m512i v) {
    const unsigned a = (unsigned) ((uintptr_t) d & 63);
    if (a == 0) {
        _mm512_stream_si512((__m512i *) d, v);
        return;
    }
    _Alignas(64) uint8_t t[128];
    uint8_t *slot = cc->buf + 64 * (size_t) c;
    _mm512_store_si512((__m512i *) t, _mm512_load_si512((const __m512i *) slot));
    _mm512_storeu_si512(t + a, v);
    const __m512i line = _mm512_load_si512((const __m512i *) t);
    if (cc->have[c])
        _mm512_stream_si512((__m512i *) (d - a), line);
    else
        _mm512_mask_storeu_epi8(d - a, ~mask64(a), line);
    _mm512_store_si512((__m512i *) slot, _mm512_load_si512((const __m512i *) (t + 64)));
    cc->have[c] = 1;
}

/* Stores col_codes output for the 32-row block at input row r0 (nr rows present), columns
 * c0 + lane_col(h, k) (ncv present in the segment); bit k of nan marks NaN lanes. */
AI void col_store32(const lowp_quant_job *j, const __m512i z[8], int64_t r0, int64_t nr, int64_t c0,
                    int64_t ncv, int h, unsigned nan, lowp_format xf, lowp_format ef, int full) {
    uint8_t *out = (uint8_t *) j->col->data;
    const size_t ob = j->col_ob;
    const size_t off = ef == E2M1 ? (size_t) r0 / 2 : (size_t) r0;
    for (int i = 0; i < 8; i++) {
        for (int hi = 0; hi < 2; hi++) {
            const int k = lane_of(i, hi), cc = lane_col(xf, h, k);
            if (!full && cc >= ncv) continue;
            uint8_t *d = out + (size_t) (c0 + cc) * ob + off;
            const __m256i zz =
                hi ? _mm512_extracti64x4_epi64(z[i], 1) : _mm512_castsi512_si256(z[i]);
            if (ef == E2M1) {
                __m128i n = _mm256_cvtepi16_epi8(_mm256_or_si256(zz, _mm256_srli_epi16(zz, 4)));
                if ((nan >> k) & 1) n = _mm_setzero_si128();
                if (full)
                    _mm_storeu_si128((__m128i *) d, n);
                else
                    _mm_mask_storeu_epi8(d, mask16((nr + 1) / 2), n);
            } else {
                const __m256i w = (nan >> k) & 1 ? _mm256_set1_epi8((char) ef_nancode(ef)) : zz;
                if (full)
                    _mm256_storeu_si256((__m256i *) d, w);
                else
                    _mm256_mask_storeu_epi8(d, mask32(nr), w);
            }
        }
    }
}

/* Stores the col_codes outputs of two stacked 32-row blocks (rows r0 .. r0+63, all present;
 * r0 a multiple of 64) for columns c0 + lane_col(h, k): 64 codes per output row, one 64-byte
 * store (E2M1: 32). nan0/nan1: NaN lanes of the upper/lower block. */
AI void col_store64(const lowp_quant_job *j, const __m512i z0[8], const __m512i z1[8], int64_t r0,
                    int64_t c0, int h, unsigned nan0, unsigned nan1, lowp_format xf, lowp_format ef,
                    int nt, col_carry *cc) {
    uint8_t *out = (uint8_t *) j->col->data;
    const size_t ob = j->col_ob;
    const size_t off = ef == E2M1 ? (size_t) r0 / 2 : (size_t) r0;
    for (int i = 0; i < 8; i++) {
        for (int hi = 0; hi < 2; hi++) {
            const int k = lane_of(i, hi);
            uint8_t *d = out + (size_t) (c0 + lane_col(xf, h, k)) * ob + off;
            /* the lane's 32 bytes of each block, side by side */
            __m512i w = hi ? _mm512_shuffle_i64x2(z0[i], z1[i], 0xEE)
                           : _mm512_shuffle_i64x2(z0[i], z1[i], 0x44);
            const unsigned n2 = ((nan0 >> k) & 1) | ((nan1 >> k) & 1) << 1;
            if (ef == E2M1) {
                __m256i n = nibbles64(w);
                if (n2)
                    n = _mm256_maskz_mov_epi8(
                        ~((n2 & 1 ? 0xFFFFu : 0u) | (n2 & 2 ? 0xFFFF0000u : 0u)), n);
                _mm256_storeu_si256((__m256i *) d, n);
            } else {
                if (n2)
                    w = _mm512_mask_mov_epi8(w,
                                             (n2 & 1 ? 0xFFFFFFFFull : 0ull) |
                                                 (n2 & 2 ? 0xFFFFFFFF00000000ull : 0ull),
                                             _mm512_set1_epi8((char) ef_nancode(ef)));
                if (cc)
                    col_put_s(cc, c0 + lane_col(xf, h, k), d, w);
                else if (nt)
                    _mm512_stream_si512((__m512i *) d, w);
                else
                    _mm512_storeu_si512(d, w);
            }
        }
    }
}

/* Copies input rows [r0, r0+nr) x columns [c0, c0+ncv) into a 32x32 tile buffer (rows 32
 * elements apart), zero-padded. */
AI void fill_tile(char *tile, const lowp_quant_job *j, int64_t r0, int64_t nr, int64_t c0,
                  int64_t ncv, lowp_format xf) {
    const size_t es = xsize(xf), stride = (size_t) j->cols * es;
    const char *base = (const char *) j->x + ((size_t) r0 * (size_t) j->cols + (size_t) c0) * es;
    for (int i = 0; i < 32; i++) {
        const char *p = base + (size_t) (i < nr ? i : 0) * stride;
        const int64_t n = i < nr ? ncv : 0;
        if (xf == F32) {
            __m512 lo, hi;
            ld32(p, xf, n, n == 32, &lo, &hi);
            _mm512_storeu_ps(tile + 128 * i, lo);
            _mm512_storeu_ps(tile + 128 * i + 64, hi);
        } else {
            _mm512_storeu_si512(tile + 64 * i, n == 32 ? _mm512_loadu_si512(p)
                                                       : _mm512_maskz_loadu_epi16(mask32(n), p));
        }
    }
}

/* Columnwise codes of a 32x32 tile buffer (rows r0.., nr present; columns c0.., ncv present)
 * with per-lane factors flo/fhi of encoder em; nan: bit 16h+k marks lane k of half h. */
AI void col_seg(const lowp_quant_job *j, const char *tile, int64_t r0, int64_t nr, int64_t c0,
                int64_t ncv, __m512 flo, __m512 fhi, unsigned nan, lowp_format xf, lowp_format ef,
                int em, int clip) {
    const int full = nr == 32 && ncv == 32;
    __m512i z[8];
    col_codes(tile, 32 * xsize(xf), 0, flo, xf, ef, em, clip, z);
    col_store32(j, z, r0, nr, c0, ncv, 0, nan & 0xFFFF, xf, ef, full);
    if (full || ncv > (xf == F32 ? 16 : 4)) { /* some column of the high half exists */
        col_codes(tile, 32 * xsize(xf), 1, fhi, xf, ef, em, clip, z);
        col_store32(j, z, r0, nr, c0, ncv, 1, nan >> 16, xf, ef, full);
    }
}

/* fill_tile, then col_seg. */
AI void col_seg_x(const lowp_quant_job *j, int64_t r0, int64_t nr, int64_t c0, int64_t ncv,
                  __m512 flo, __m512 fhi, unsigned nan, lowp_format xf, lowp_format ef, int em,
                  int clip) {
    _Alignas(64) char tile[32 * 32 * 4];
    fill_tile(tile, j, r0, nr, c0, ncv, xf);
    col_seg(j, tile, r0, nr, c0, ncv, flo, fhi, nan, xf, ef, em, clip);
}

/* 64 rows from r (a multiple of 64) of a whole 32-column segment at c0, columnwise, with the
 * per-lane scales flo, fhi of encoder em: both 32-row tiles encoded and transposed, then each
 * column's 64 codes in one 64-byte store (nt: non-temporal), as the dual-axis MX32 kernel
 * writes them. */
AI void col_pair64(const lowp_quant_job *j, int64_t r, int64_t c0, __m512 flo, __m512 fhi,
                   lowp_format xf, lowp_format ef, int em, int nt, col_carry *cc) {
    _Alignas(64) char tile[2][32 * 32 * 4];
    fill_tile(tile[0], j, r, 32, c0, 32, xf);
    fill_tile(tile[1], j, r + 32, 32, c0, 32, xf);
    for (int h = 0; h < 2; h++) {
        __m512i z0[8], z1[8];
        col_codes(tile[0], 32 * xsize(xf), h, h ? fhi : flo, xf, ef, em, 0, z0);
        col_codes(tile[1], 32 * xsize(xf), h, h ? fhi : flo, xf, ef, em, 0, z1);
        col_store64(j, z0, z1, r, c0, h, 0u, 0u, xf, ef, nt, cc);
    }
}

/* The column codes of rows [r, r + n) of the segment at c0 (ncv columns present), encoder em:
 * 64 rows at a time where whole 64-byte lines of the copy are (col_pair64), else 32. */
AI void col_rows(const lowp_quant_job *j, int64_t r, int64_t n, int64_t c0, int64_t ncv, __m512 flo,
                 __m512 fhi, lowp_format xf, lowp_format ef, int em, int nt, col_carry *cc) {
    int64_t i = 0;
    if (ncv == 32 && r % 64 == 0) /* whole 64-byte lines of the column copy */
        for (; i + 64 <= n; i += 64) col_pair64(j, r + i, c0, flo, fhi, xf, ef, em, nt, cc);
    if (cc && i < n) /* the carries into the first line of the rows stored directly */
        for (int64_t c = c0; c < c0 + ncv; c++)
            col_carry_out(cc, c,
                          (uint8_t *) j->col->data + (size_t) c * j->col_ob + (size_t) (r + i));
    for (; i < n; i += 32)
        col_seg_x(j, r + i, min64(n - i, 32), c0, ncv, flo, fhi, 0, xf, ef, em, 0);
}

/* A carry for the C columns of the job's columnwise copy (col_carry), in cc, when `on`
 * and its buffers can be allocated: returns cc, or NULL. */
static inline col_carry *carry_open(col_carry *cc, int64_t C, int on) {
    if (!on) return NULL;
    const size_t n = ((size_t) C * 65 + 63) / 64 * 64;
    cc->buf = aligned_alloc(64, n);
    if (!cc->buf) return NULL;
    cc->have = cc->buf + (size_t) C * 64;
    memset(cc->have, 0, (size_t) C);
    return cc;
}

/* The carries of the job's columns into the lines after their last segments (which end at
 * row r1), and the buffers freed. */
AI void carry_close(col_carry *cc, const lowp_quant_job *j, int64_t r1) {
    if (!cc) return;
    for (int64_t c = 0; c < j->cols; c++)
        col_carry_out(cc, c, (uint8_t *) j->col->data + (size_t) c * j->col_ob + (size_t) r1);
    free(cc->buf);
}

/* ---- the byte encoder (AVX512_VBMI): BF16 input, 8-bit codes ---- */

/* A BF16 element x with exponent field E and 7-bit mantissa m, scaled by s = 2^es * ms (ms in
 * [1, 2)), is 2^(E-127+es) * (1 + m/128) * ms; as long as the product is a normal number of
 * the target, its code is (E - Eoff) << mbits plus T[m], where Eoff = 127 - bias - es and T[m]
 * is the code offset of round((1 + m/128) * ms) from the code of 1.0 (0 .. 2^(mbits+1): the
 * carry into the next binades included). That is two byte lookups per element: T by m (128
 * entries, vpermt2b over two registers), the exponent part by D = E - Eoff saturating at 0
 * (64 entries, vpermb), added with saturation and, where the scale rule allows a value above
 * fmax, clamped at the largest code. The bytes E, m and the sign come from 64 elements (two
 * registers) by three vpermt2b, in element order, with no widening.
 *
 * For E8M0 scales (ms = 1) T is one fixed table. Lanes whose scaled value is below the
 * target's smallest normal (0 < |x| < 2^(Eoff+1-127), BF16 subnormals included) are rare and
 * take w16_tiny, as in enc32w; zeros fall out of the lookups as 0. Needs AVX512_VBMI (the
 * functions carry the target attribute; the dispatcher checks the CPU) and subnormal results
 * kept (as enc32w, for the reference's products). */

#define AIV static inline FORCE_INLINE __attribute__((target("avx512vbmi")))
#define NIV static __attribute__((noinline, target("avx512vbmi")))

#define L8(F, b) F(b), F(b + 1), F(b + 2), F(b + 3), F(b + 4), F(b + 5), F(b + 6), F(b + 7)
#define L64(F, b)                                                                                  \
    L8(F, b), L8(F, b + 8), L8(F, b + 16), L8(F, b + 24), L8(F, b + 32), L8(F, b + 40),            \
        L8(F, b + 48), L8(F, b + 56)
#define EVEN_B(k) (2 * (k))
#define ODD_B(k)  (2 * (k) + 1)
#define TR8_B(k)  (((k) % 8) * 8 + (k) / 8)
/* RNE of the 7-bit mantissa m at bit sh (the E8M0 table) */
#define T0_B(m, sh) (((m) + (1 << ((sh) -1)) - 1 + (((m) >> (sh)) & 1)) >> (sh))
#define T0_E4(m)    T0_B(m, 4)
#define T0_E5(m)    T0_B(m, 5)
#define DB_B(d, mb) (((d) << (mb) > 255 ? 255 : (d) << (mb)) & 0xFF)
#define DB_E4(d)    DB_B(d, 3)
#define DB_E5(d)    DB_B(d, 2)

static const uint8_t k_even[64] __attribute__((aligned(64))) = {L64(EVEN_B, 0)};
static const uint8_t k_odd[64] __attribute__((aligned(64))) = {L64(ODD_B, 0)};
static const uint8_t k_tr8[64] __attribute__((aligned(64))) = {L64(TR8_B, 0)};
#define IOTA_B(k) (k)
static const uint8_t k_iota[64] __attribute__((aligned(64))) = {L64(IOTA_B, 0)};
static const uint8_t k_t0_e4m3[128] __attribute__((aligned(64))) = {L64(T0_E4, 0), L64(T0_E4, 64)};
static const uint8_t k_t0_e5m2[128] __attribute__((aligned(64))) = {L64(T0_E5, 0), L64(T0_E5, 64)};
static const uint8_t k_db_e4m3[64] __attribute__((aligned(64))) = {L64(DB_E4, 0)};
static const uint8_t k_db_e5m2[64] __attribute__((aligned(64))) = {L64(DB_E5, 0)};

AI __m512i ld64(const uint8_t *p) {
    return _mm512_load_si512((const void *) p);
}

/* The exponent fields E, the low bytes L (m and E's lowest bit) and the high bytes H (the sign
 * and the rest of E) of the 64 BF16 elements in x0 (elements 0-31) and x1 (32-63). */
AIV void bsplit(__m512i x0, __m512i x1, __m512i *E, __m512i *L, __m512i *H) {
    const __m512i ev = ld64(k_even);
    *E = _mm512_permutex2var_epi8(_mm512_srli_epi16(x0, 7), ev, _mm512_srli_epi16(x1, 7));
    *L = _mm512_permutex2var_epi8(x0, ev, x1);
    *H = _mm512_permutex2var_epi8(x0, ld64(k_odd), x1);
}

/* Code magnitudes from E, T = T[m] and the per-lane offsets eo (Eoff), table db of ef. */
AIV __m512i bmag(__m512i E, __m512i T, __m512i eo, __m512i db, lowp_format ef, int clip) {
    __m512i c = _mm512_adds_epu8(_mm512_permutexvar_epi8(_mm512_subs_epu8(E, eo), db), T);
    if (clip) c = _mm512_min_epu8(c, _mm512_set1_epi8((char) ef_maxcode(ef)));
    return c;
}

/* w16_tiny's magnitudes of the 64 elements as bytes (off0, off1: its 16-bit parameters for
 * elements 0-31 and 32-63). */
AIV __m512i btiny(__m512i x0, __m512i x1, __m512i off0, __m512i off1, lowp_format ef) {
    const __m512i a0 = _mm512_and_si512(x0, _mm512_set1_epi16(0x7FFF));
    const __m512i a1 = _mm512_and_si512(x1, _mm512_set1_epi16(0x7FFF));
    return _mm512_permutex2var_epi8(w16_tiny(a0, off0, ef), ld64(k_even), w16_tiny(a1, off1, ef));
}

/* sign | magnitude ((A & B) | C) */
AI __m512i bsign(__m512i H, __m512i mag) {
    return _mm512_ternarylogic_epi32(H, _mm512_set1_epi8((char) 0x80), mag, 0xEA);
}

/* Whether this CPU runs the byte encoder. */
AI int have_vbmi(void) {
    return (lowp_cpu_caps()->flags & LOWP_CAP_AVX512_VBMI) != 0;
}

/* Whether the rowwise byte encoder takes this job: BF16 input, 8-bit codes, the CPU's VBMI. */
AI int rows_b(lowp_format xf, lowp_format ef) {
    return xf != F32 && ef != E2M1 && have_vbmi();
}

/* ---- the families' entries ---- */

/* What quant_avx512.c decided for one call, the same for every family. */
typedef struct q512_plan {
    int em_ok;   /* subnormal results kept: enc16_sub, enc16_fsub and the byte encoder usable */
    int nt_row;  /* non-temporal stores for the rowwise copy */
    int nt_col;  /* non-temporal stores for the columnwise copy (whole 64-byte lines) */
    int col_big; /* the columnwise copy large enough for col_carry (TENSOR, ROW, BLOCK128, MX32) */
    int row_big; /* the rowwise copy large enough for the band path's row carry (MX32) */
} q512_plan;

/* Defines NAME, the noinline instance of the family body BODY for input format XF and element
 * format EF: the formats are compile-time constants inside, so their switches fold away and
 * shifts are immediates. */
#define Q512_INSTANCE(NAME, BODY, XF, EF)                                                          \
    static __attribute__((noinline)) void NAME(const lowp_quant_job *j, int64_t r0, int64_t r1,    \
                                               const q512_plan *p) {                               \
        BODY(j, r0, r1, XF, EF, p);                                                                \
    }

/* Rows [r0, r1) of a job of the family (quant_avx512_mx.c: MX32; quant_avx512_block.c:
 * BLOCK128, BLOCK128X128, BLOCK32X32; quant_avx512_tensor.c: TENSOR, ROW). */
LOWP_HIDDEN void lowp_cpu_q512_mx(const lowp_quant_job *j, int64_t r0, int64_t r1,
                                  const q512_plan *p);
LOWP_HIDDEN void lowp_cpu_q512_block(const lowp_quant_job *j, int64_t r0, int64_t r1,
                                     const q512_plan *p);
LOWP_HIDDEN void lowp_cpu_q512_tensor(const lowp_quant_job *j, int64_t r0, int64_t r1,
                                      const q512_plan *p);
/* quant_avx512_nv.c: NV16, NV16X16 (E2M1 elements). */
LOWP_HIDDEN void lowp_cpu_q512_nv(const lowp_quant_job *j, int64_t r0, int64_t r1,
                                  const q512_plan *p);
/* quant_avx512_nv.c: MX32 with E2M1 elements under stochastic rounding (job->sr). */
LOWP_HIDDEN void lowp_cpu_q512_mx_sr(const lowp_quant_job *j, int64_t r0, int64_t r1);

#endif
