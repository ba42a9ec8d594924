/* AVX-512 quantization kernels (docs/numerics.md sections 3-4), bit-exact with quant_ref.c.
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
 * Memory. The dual-axis MX32 kernel works on 64x64 tiles copied to a local buffer (rows of x
 * a multiple of 4 KiB apart share one L1 set, so re-reading them from x would miss L1), so
 * that each output line of both copies is written whole by one 64-byte store, in 256-row
 * super-bands so that each page of the columnwise copy is visited once per 256 input rows
 * (a TLB miss each time). Its outputs, when at least NT_MIN_BYTES, go out with non-temporal
 * stores, like a large memcpy: lines written a row of the copy apart would each be read before
 * being written, and at strides of 1-2 KiB the 64 lines of a tile crowd a few L1 sets
 * (measured: 30% faster on an 8192x4096 input; with the threshold lowered from 8 MiB to 256
 * KiB, 1.5-1.7x on 1024x2048, 2048x1024 and 2048x2048 BF16 inputs, and the trainer's
 * quantization phase 15-22% shorter on `medium`, whose columnwise copies of [2048, 384]
 * activations are 768 KiB; no change measured below it). Where a copy's rows are not whole
 * lines (a dimension not a multiple of 64, a misaligned output, the grouped path's spans),
 * each line is completed from the bytes its predecessor segment left (col_carry) and stored
 * whole all the same. The
 * rowwise-only kernels write lines in order, which the caches handle as well without them
 * (measured: non-temporal stores 15% slower there), so they do not use them; except the byte
 * encoder's rowwise copies of BLOCK128, BLOCK128X128 and BLOCK32X32 (BF16 input) of at least
 * NT_ROWS_B_MIN_BYTES, which ran at memory speed only with them on a Xeon with AMX (8192x4096,
 * one thread, ordinary against non-temporal stores: BLOCK128 0.86-0.93 -> 1.06-1.09 of memcpy,
 * BLOCK128X128 0.76-0.83 -> 1.05-1.07, BLOCK32X32 0.81-0.86 -> 1.21-1.22; 4096x2048 1.05-1.10x;
 * 2048x1024, whose 2 MiB copy stays in L2, no gain). An sfence ends every call that used
 * them.
 *
 * The file also holds the dispatcher's whole-tensor passes (the TENSOR amax, the column
 * maxima of ROW's columnwise copy), which quant.c uses with these kernels.
 *
 * The byte encoder (its sections below) takes BF16 input to 8-bit codes on CPUs with
 * AVX512_VBMI: two byte lookups per element instead of the binary32 encoders. It runs the
 * dual-axis MX32 tiles (both copies from one split of each row) and the rowwise copies of
 * BLOCK128, BLOCK128X128 and BLOCK32X32. Measured on an 8192x4096 input, one thread, Zen 4,
 * against the same kernels with it masked: dual-axis MX32 1.2-1.4x (1.5-1.7x in cache),
 * BLOCK128 1.8-2.0x, BLOCK128X128 1.7-1.8x, BLOCK32X32 1.1-1.2x; outputs bit-identical. Its
 * dual-axis tiles later got the band path: a chunk's maxima first, read row by row (as the
 * prefetchers like), then its codes from L2, the column lines of each tile stored during the
 * next (mx_bands_b), and the next chunk prefetched into L2 meanwhile (band_pf).
 *
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq; quant.c calls it only when the CPU
 * has AVX-512F/BW, and the byte encoder's functions (target attribute avx512vbmi) run only
 * when it also has AVX512_VBMI. It never fails: the ops layer validated the arguments.
 */
#include <immintrin.h>
#include <stdlib.h>

#include "core/scale_rules.h"
#include "cpu.h"
#include "quant_kernels.h"

/* Forced inlining specializes every kernel for the constant formats and flags of the noinline
 * instances that call it (INSTANCE, MX_TILE64B, MX_BAND64B, ROWS_B). The sanitized build
 * (LOWP_SANITIZE, -O0) defines LOWP_NO_FORCED_INLINE: there the compiler copied whole kernels
 * into each instance and instrumented every copy, and this file's compile peaked at 7.1 GiB
 * (10 minutes); without the forced inlining, 0.14 GiB (2 s). Same source and same checks,
 * only not specialized; the Release object is unchanged, byte for byte. */
#ifdef LOWP_NO_FORCED_INLINE
#define FORCE_INLINE
#else
#define FORCE_INLINE __attribute__((always_inline))
#endif
#define AI     static inline FORCE_INLINE
#define V32(x) _mm512_set1_epi32((int) (uint32_t) (x))

/* Dual-axis copies whose codes take at least this many bytes (a quarter of a 1 MiB L2) are
 * stored non-temporally. */
#define NT_MIN_BYTES ((size_t) 256 << 10)
/* The byte encoder's rowwise copies of the block kinds take them from here (see the file
 * comment): beyond a core's L2, where the copy's lines go to memory anyway. */
#define NT_ROWS_B_MIN_BYTES ((size_t) 4 << 20)

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
static __attribute__((noinline)) void row_ahead(const char *xr, lowp_format xf, size_t rbytes) {
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
 * took 10.5-11.7 ms against 4.5 (docs/benchmarks.md, "Eighteenth session"). The row copy
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
    const int bias = ef_bias(ef), mb = ef_mbits(ef);
    _Alignas(64) uint8_t ccode[2][64];
    __mmask16 bad = 0;
    const __m512i lowc = V32(bias), nanc = V32(0xFF);
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
    const int64_t nbc = (C + 31) / 32;
    const uint8_t *rsc = want_row ? (const uint8_t *) j->row->scales + (size_t) r0 * (size_t) nbc +
                                        (size_t) (c0 / 32)
                                  : NULL;
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
    const __m512i vb = _mm512_set1_epi8((char) bias);
    __m512i ec[2], offc[2][2];
    for (int b = 0; b < 2; b++) {
        ec[b] = _mm512_sub_epi8(ld64(ccode[b]), vb);
        for (int h = 0; h < 2; h++)
            offc[b][h] = _mm512_slli_epi16(
                _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *) (ccode[b] + 32 * h))), mb);
    }
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 2; h++)
            offc[b][h] = _mm512_sub_epi16(offc[b][h], _mm512_set1_epi16((short) (bias << mb)));
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
            if (__builtin_expect(k != 0, 0)) { /* zeros, or lanes below the smallest normal */
                const __m512i nz = _mm512_or_si512(E, L);
                k &= _mm512_test_epi8_mask(nz, nz);
                const __mmask64 kc = k & _mm512_cmple_epu8_mask(E, ec[b]);
                if (kc)
                    cc = _mm512_mask_mov_epi8(cc, kc, btiny(x0, x1, offc[b][0], offc[b][1], ef));
                const __mmask64 kr = want_row ? k & _mm512_cmple_epu8_mask(E, er) : 0;
                if (kr)
                    rr = _mm512_mask_mov_epi8(
                        rr, kr,
                        btiny(x0, x1, _mm512_set1_epi16((short) ((rc0 - bias) << mb)),
                              _mm512_set1_epi16((short) ((rc1 - bias) << mb)), ef));
            }
            if (want_row) {
                rr = bsign(H, rr);
                if (rc)
                    col_put(rc, i, rout + (size_t) i * ob, rr, 1);
                else if (nt_row)
                    _mm512_stream_si512((__m512i *) (rout + (size_t) i * ob), rr);
                else
                    _mm512_storeu_si512(rout + (size_t) i * ob, rr);
            }
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
 * (docs/benchmarks.md, "Seventeenth session" and "Eighteenth session"). */
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
 * apart a tile (8192x4096), they cost 1-4 ms of an 8192x4096 call (docs/benchmarks.md,
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

/* Whether this CPU runs the byte encoder. */
static int have_vbmi(void) {
    return (lowp_cpu_caps()->flags & LOWP_CAP_AVX512_VBMI) != 0;
}

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
 * mx_tile64b tile by tile: see docs/benchmarks.md ("Fifteenth session"). */
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
 * (8192x4096 BF16, one thread: 0.54 of memcpy; see docs/benchmarks.md). */
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

/* Whether the rowwise byte encoder takes this job: BF16 input, 8-bit codes, the CPU's VBMI. */
AI int rows_b(lowp_format xf, lowp_format ef) {
    return xf != F32 && ef != E2M1 && have_vbmi();
}

/* The band [r0, r0+nr) (nr <= bs), in chunks of cw columns (a multiple of 512): the tile
 * maxima in one row-major pass, then the row codes row by row and the column codes in 32x32
 * transposes. Per 512 columns, 16 32-column pieces: piece k of group g is in tile
 * (16 g + k) * 32 / bs of the chunk. */
AI void tiles(const lowp_quant_job *j, int64_t r0, int64_t nr, lowp_format xf, lowp_format ef,
              int em_ok, int nt, int64_t cw) {
    const int e8 = j->scaling == LOWP_SCALING_BLOCK32X32, clip = clip_of(j);
    const int64_t bs = e8 ? 32 : 128, C = j->cols;
    const int64_t nbc = (C + bs - 1) / bs, nbr = j->col_nbr, tr = r0 / bs;
    const size_t es = xsize(xf);
    for (int64_t c0 = 0; c0 < C; c0 += cw) {
        const int64_t w = min64(C - c0, cw);
        const int ng = (int) ((w + 511) / 512); /* 512-column groups */
        __m512i m[TILES_MAX_CW / 32];           /* per tile (e8) or per 4 tiles' pieces */
        for (int k = 0; k < 16 * ng; k++) m[k] = _mm512_setzero_si512();
        for (int64_t i = 0; i < nr; i++) {
            const char *xr = xrow(j, xf, r0 + i) + (size_t) c0 * es;
            if (w < C) /* chunks of up to 128 rows a page apart are more streams than the
                        * hardware prefetchers follow: the row's next chunk, into L2 */
                for (size_t o = 0; o < (size_t) w * es; o += 64) prefetch(xr, (size_t) w * es + o);
            for (int k = 0; k < 16 * ng; k++) { /* 32-column pieces */
                const int t = e8 ? k : k / 4;
                const int64_t n = w - 32 * k;
                if (n <= 0) break;
                const char *pk = xr + (size_t) (32 * k) * es;
                if (e8) /* 16-bit magnitudes for BF16, folded by tree16 */
                    m[t] = umax(m[t], n >= 32 ? amax32w(pk, xf, 32, 1) : amax32w(pk, xf, n, 0),
                                xf != F32);
                else
                    m[t] = _mm512_max_epu32(m[t],
                                            n >= 32 ? amax32(pk, xf, 32, 1) : amax32(pk, xf, n, 0));
            }
        }
        float f[TILES_MAX_CW / 32]; /* factor (E8M0) or scale (binary32) of each tile */
        uint32_t am[TILES_MAX_CW / 32];
        unsigned nan[TILES_MAX_CW / 512];
        int em = EM_SUB;
        const int ntl = (int) ((w + bs - 1) / bs), tc0 = (int) (c0 / bs);
        if (e8) {
            for (int g = 0; g < ng; g++) {
                const int n = min64(ntl - 16 * g, 16);
                const __m512i cv = e8m0_codes(tree16(m + 16 * g, xf != F32), j->et, j->mode);
                if (e8_em(cv, mask16(n), ef, em_ok) != EM_SUB) em = EM_E8;
                _mm512_storeu_si512(am + 16 * g, cv); /* the codes, for now */
                nan[g] = _mm512_cmpeq_epi32_mask(cv, V32(0xFF)) & mask16(n);
            }
            for (int g = 0; g < ng; g++)
                _mm512_storeu_ps(f + 16 * g, e8m0_factors(_mm512_loadu_si512(am + 16 * g), ef, em));
            for (int t = 0; t < ntl; t++) {
                const uint8_t code = (uint8_t) am[t];
                if (j->row) ((uint8_t *) j->row->scales)[(size_t) (tr * nbc + tc0 + t)] = code;
                if (j->col) ((uint8_t *) j->col->scales)[(size_t) ((tc0 + t) * nbr + tr)] = code;
            }
        } else {
            em = EM_FP32;
            for (int t = 0; t < ntl; t++) {
                am[t] = _mm512_reduce_max_epu32(m[t]);
                f[t] = lowp_rule_fp32_scale(lowp_u2f(am[t]), j->et->fmax, j->eps, j->pow2);
                if (j->row) ((float *) j->row->scales)[(size_t) (tr * nbc + tc0 + t)] = 1.0f / f[t];
                if (j->col)
                    ((float *) j->col->scales)[(size_t) ((tc0 + t) * nbr + tr)] = 1.0f / f[t];
            }
        }
        int done = 0; /* the row codes, by the byte encoder */
        if (j->row && rows_b(xf, ef)) {
            if (!e8) {
                if (ef == LOWP_FORMAT_E4M3)
                    b128x128_rows_b_e4m3(j, r0, nr, c0, w, f, am, em_ok, nt);
                else
                    b128x128_rows_b_e5m2(j, r0, nr, c0, w, f, am, em_ok, nt);
                done = 1;
            } else if (em_ok && w % 64 == 0) {
                int ok = 1;
                for (int t = 0; t < ntl; t++)
                    ok &= am[t] >= (uint32_t) ef_bias(ef) && am[t] != 0xFF;
                if (ok && ef == LOWP_FORMAT_E4M3)
                    b32x32_rows_b_e4m3(j, r0, nr, c0, w, am, nt);
                else if (ok)
                    b32x32_rows_b_e5m2(j, r0, nr, c0, w, am, nt);
                done = ok;
            }
        }
        if (j->row && !done) {
            const size_t ob = code_bytes(ef, C);
            for (int64_t i = 0; i < nr; i++) {
                const char *xr = xrow(j, xf, r0 + i);
                uint8_t *orow = (uint8_t *) j->row->data + (size_t) (r0 + i) * ob;
                for (int g = 0; g < ng; g++) {
                    const int64_t p = c0 + 512 * g;
                    const int full = p + 512 <= C;
                    const int nt16 = (int) min64(ntl - 16 * g, 16);
                    if (em == EM_SUB) {
                        if (full)
                            enc_blocks32(xr, orow, p, 16, C, f + 16 * g, nan[g], xf, ef, EM_SUB,
                                         clip, 1, nt);
                        else
                            enc_blocks32(xr, orow, p, nt16, C, f + 16 * g, nan[g], xf, ef, EM_SUB,
                                         clip, 0, nt);
                    } else if (em == EM_E8) {
                        if (full)
                            enc_blocks32(xr, orow, p, 16, C, f + 16 * g, nan[g], xf, ef, EM_E8, 0,
                                         1, nt);
                        else
                            enc_blocks32(xr, orow, p, nt16, C, f + 16 * g, nan[g], xf, ef, EM_E8, 0,
                                         0, nt);
                    }
                }
                if (!e8)
                    for (int t = 0; t < ntl; t++) {
                        const int64_t p = c0 + 128 * t;
                        enc_run_a(xr, orow, p, min64(C - p, 128), _mm512_set1_ps(f[t]), am[t], xf,
                                  ef, em_ok, nt);
                    }
            }
        }
        if (j->col) {
            for (int64_t s = 0; s < w; s += 32) {
                const int t = (int) (s / bs);
                const int64_t ncv = min64(w - s, 32);
                const __m512 ft = _mm512_set1_ps(f[t]);
                const unsigned tn = e8 && (nan[t / 16] >> (t % 16)) & 1 ? 0xFFFFFFFFu : 0u;
                __m512 gt = ft;
                const int fsub =
                    !e8 && em_ok && fp32_em(am[t]) == EM_FIN && fsub_factors(ft, ef, &gt);
                for (int64_t i = 0; i < nr; i += 32) {
                    const int64_t n = min64(nr - i, 32);
                    if (em == EM_SUB)
                        col_seg_x(j, r0 + i, n, c0 + s, ncv, ft, ft, tn, xf, ef, EM_SUB, clip);
                    else if (em == EM_E8)
                        col_seg_x(j, r0 + i, n, c0 + s, ncv, ft, ft, tn, xf, ef, EM_E8, 0);
                    else if (fsub)
                        col_seg_x(j, r0 + i, n, c0 + s, ncv, gt, gt, 0, xf, ef, EM_FSUB, 0);
                    else if (fp32_em(am[t]) == EM_FIN)
                        col_seg_x(j, r0 + i, n, c0 + s, ncv, ft, ft, 0, xf, ef, EM_FIN, 0);
                    else
                        col_seg_x(j, r0 + i, n, c0 + s, ncv, ft, ft, 0, xf, ef, EM_FP32, 0);
                }
            }
        }
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

/* ---- entry points ---- */

/* Non-temporal stores for a copy: large enough, 8-bit codes, and 64-byte aligned rows. */
static int big_for_nt(const lowp_qtensor *q) {
    return q && q->format != LOWP_FORMAT_E2M1 &&
           (size_t) q->rows * (size_t) q->cols >= NT_MIN_BYTES;
}
static int want_nt(const lowp_qtensor *q) {
    return big_for_nt(q) && (uintptr_t) q->data % 64 == 0 && q->cols % 64 == 0;
}

/* A carry for the C columns of the job's columnwise copy (col_carry), in cc, when `on`
 * and its buffers can be allocated: returns cc, or NULL. */
static col_carry *carry_open(col_carry *cc, int64_t C, int on) {
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

AI void run(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf, lowp_format ef) {
    /* enc16_sub (BF16) and enc16_fsub (any input) need subnormal results */
    const int em_ok = subnormals_kept();
    /* non-temporal stores in the dual-axis kernel, the byte encoder's large rowwise copies of
     * the block kinds (see the file comment), and the columnwise copies of the binary32 kinds
     * (64-byte lines too, col_rows) */
    const int dual = j->scaling == LOWP_SCALING_MX32 && j->col;
    const int blk = j->scaling == LOWP_SCALING_BLOCK128 ||
                    j->scaling == LOWP_SCALING_BLOCK128X128 ||
                    j->scaling == LOWP_SCALING_BLOCK32X32;
    const int nt_row =
        want_nt(j->row) &&
        (dual || (blk && rows_b(xf, ef) &&
                  (size_t) j->row->rows * (size_t) j->row->cols >= NT_ROWS_B_MIN_BYTES));
    const int colk = dual || j->scaling == LOWP_SCALING_BLOCK128 ||
                     j->scaling == LOWP_SCALING_ROW || j->scaling == LOWP_SCALING_TENSOR;
    const int nt_col = colk && want_nt(j->col) && j->col_ob % 64 == 0;
    const int col_big = colk && big_for_nt(j->col);
    switch (j->scaling) {
    case LOWP_SCALING_TENSOR: {
        /* a scale from this input's finite maximum bounds every scaled value (EM_FIN) */
        const __m512 s = _mm512_set1_ps(j->tensor_scale);
        __m512 g = s;
        const int fsub = em_ok && j->tensor_fin && fsub_factors(s, ef, &g);
        const size_t ob = code_bytes(ef, j->cols);
        col_carry cb, *cc = carry_open(&cb, j->cols, col_big && !nt_col);
        /* band by band with a columnwise copy, as for BLOCK128 (the band is in L2) */
        for (int64_t rb = r0; rb < r1;) {
            const int64_t re = j->col ? band_end(rb, r1, 64) : r1;
            for (int64_t r = rb; j->row && r < re; r++) {
                const char *xr = xrow(j, xf, r);
                uint8_t *orow = (uint8_t *) j->row->data + (size_t) r * ob;
                row_ahead(xr, xf, (size_t) j->cols * xsize(xf));
                if (fsub)
                    enc_run(xr, orow, 0, j->cols, g, xf, ef, EM_FSUB, nt_row);
                else
                    enc_run(xr, orow, 0, j->cols, s, xf, ef, EM_FP32, nt_row);
            }
            if (j->col && fsub)
                col_fp32(j, rb, re, NULL, _mm512_cvtss_f32(g), xf, ef, EM_FSUB, em_ok, nt_col, cc);
            else if (j->col)
                col_fp32(j, rb, re, NULL, j->tensor_scale, xf, ef, EM_FP32, em_ok, nt_col, cc);
            rb = re;
        }
        carry_close(cc, j, r1);
        break;
    }
    case LOWP_SCALING_ROW:
        if (!j->col) {
            if (j->row) row_rows(j, r0, r1, xf, ef, em_ok, nt_row);
            break;
        }
        {
            col_carry cb, *cc = carry_open(&cb, j->cols, col_big && !nt_col);
            for (int64_t rb = r0; rb < r1;) { /* band by band, as for TENSOR */
                const int64_t re = band_end(rb, r1, 64);
                if (j->row) row_rows(j, rb, re, xf, ef, em_ok, nt_row);
                col_fp32(j, rb, re, j->col_scale, 0.0f, xf, ef, j->col_fin ? EM_FIN : EM_FP32,
                         em_ok, nt_col, cc);
                rb = re;
            }
            carry_close(cc, j, r1);
        }
        break;
    case LOWP_SCALING_MX32:
        if (j->col)
            mx_bands(j, r0, r1, xf, ef, em_ok, nt_row, nt_col, col_big,
                     big_for_nt(j->row)); /* and the row copy */
        else
            mx_rows(j, r0, r1, xf, ef, em_ok, nt_row);
        break;
    case LOWP_SCALING_BLOCK128:
        if (!j->col) {
            if (j->row) b128_rows_any(j, r0, r1, xf, ef, em_ok, nt_row);
            break;
        }
        {
            col_carry cb, *cc = carry_open(&cb, j->cols, col_big && !nt_col);
            /* band by band, so that the columnwise pass reads a band the rowwise one has just
             * brought into L2 */
            for (int64_t r = r0; r < r1; r += 128) {
                const int64_t n = min64(r1 - r, 128);
                if (j->row) b128_rows_any(j, r, r + n, xf, ef, em_ok, nt_row);
                b128_cols(j, r, n, xf, ef, em_ok, nt_col, cc);
            }
            carry_close(cc, j, r1);
        }
        break;
    case LOWP_SCALING_BLOCK32X32:
    case LOWP_SCALING_BLOCK128X128: {
        const int64_t bs = j->scaling == LOWP_SCALING_BLOCK32X32 ? 32 : 128;
        /* Whole rows when the band's maxima fit: the band is then one contiguous stream, and
         * its second reading comes from L2 or L3 (8192x4096 BF16, 1 thread: BLOCK128X128
         * 12.5 -> 9.0 ms, BLOCK32X32 9.0 -> 7.6; 512-column chunks a page apart, prefetched,
         * were slower however far ahead; chunks narrower than the row, slower still). */
        const int64_t cw = j->cols <= TILES_MAX_CW ? TILES_MAX_CW : 512;
        for (int64_t r = r0; r < r1; r += bs)
            tiles(j, r, min64(r1 - r, bs), xf, ef, em_ok, nt_row, cw);
        break;
    }
    default: break;
    }
    /* Non-temporal stores are weakly ordered: make them visible before the caller (or the
     * thread that joins this one) reads the outputs. */
    if (nt_row || nt_col) _mm_sfence();
}

int lowp_cpu_quant_avx512_supports(const lowp_quant_job *j) {
    if (j->efmt == E2M1)
        return (j->xfmt == LOWP_FORMAT_F32 || j->xfmt == LOWP_FORMAT_BF16) &&
               j->scaling == LOWP_SCALING_MX32;
    return lowp_quant_job_fp8(j);
}

/* One specialized instance per (input, element) format pair: the format arguments are
 * compile-time constants inside, so their switches fold away and shifts are immediates. */
#define INSTANCE(NAME, XF, EF)                                                                     \
    static __attribute__((noinline)) void NAME(const lowp_quant_job *j, int64_t r0, int64_t r1) {  \
        run(j, r0, r1, XF, EF);                                                                    \
    }
INSTANCE(run_f32_e4m3, LOWP_FORMAT_F32, LOWP_FORMAT_E4M3)
INSTANCE(run_f32_e5m2, LOWP_FORMAT_F32, LOWP_FORMAT_E5M2)
INSTANCE(run_f32_e2m1, LOWP_FORMAT_F32, LOWP_FORMAT_E2M1)
INSTANCE(run_bf16_e4m3, LOWP_FORMAT_BF16, LOWP_FORMAT_E4M3)
INSTANCE(run_bf16_e5m2, LOWP_FORMAT_BF16, LOWP_FORMAT_E5M2)
INSTANCE(run_bf16_e2m1, LOWP_FORMAT_BF16, LOWP_FORMAT_E2M1)

void lowp_cpu_quant_avx512(const lowp_quant_job *j, int64_t r0, int64_t r1) {
    const int bf = j->xfmt == LOWP_FORMAT_BF16;
    switch (j->efmt) {
    case LOWP_FORMAT_E4M3: bf ? run_bf16_e4m3(j, r0, r1) : run_f32_e4m3(j, r0, r1); return;
    case LOWP_FORMAT_E5M2: bf ? run_bf16_e5m2(j, r0, r1) : run_f32_e5m2(j, r0, r1); return;
    case LOWP_FORMAT_E2M1: bf ? run_bf16_e2m1(j, r0, r1) : run_f32_e2m1(j, r0, r1); return;
    default: lowp_cpu_quant_ref(j, r0, r1); return;
    }
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
