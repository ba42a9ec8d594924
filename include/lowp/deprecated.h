/* Deprecated names, kept for one release (removed in lowp 0.3): the enum values renamed in 0.2 so
 * that each carries its enum's name, and the GEMM path enum merged into lowp_kernel_path. Old
 * code compiles unchanged; define LOWP_NO_DEPRECATED before including any lowp header to check
 * that it no longer uses them. Included by status.h, so every lowp header brings it. To update
 * code in one go:
 *
 *   sed -i -e 's/\bLOWP_GEMM_PATH_\([A-Z0-9]*\)\b/LOWP_KERNEL_PATH_\1/g' \
 *          -e 's/\bLOWP_PATH_\(AUTO\|REFERENCE\|AVX512\)\b/LOWP_KERNEL_PATH_\1/g' \
 *          -e 's/\blowp_gemm_path\b/lowp_kernel_path/g' \
 *          -e 's/\bLOWP_SCALE_\(DEFAULT\|RCEIL\|FLOOR\|CEIL\|EVEN\)\b/LOWP_SCALE_MODE_\1/g' \
 *          -e 's/\bLOWP_AMAX_\(MAX\|MOST_RECENT\)\b/LOWP_AMAX_ALGO_\1/g' \
 *          -e 's/\bLOWP_ROUND_\(RNE\|SR\)\b/LOWP_ROUNDING_\1/g' \
 *          -e 's/\blowp_fp8_state_blob_size\b/lowp_fp8_state_extra_state_size/g' \
 *          -e 's/\blowp_fp8_state_\(save\|load\)\b/lowp_fp8_state_extra_state_\1/g' FILES
 *
 * The GEMM twins of 0.2 (lowp_gemm_kn, lowp_grouped_gemm_kn, lowp_grouped_gemm_wgrad,
 * lowp_grouped_gemm_wgrad_kn) became fields of lowp_gemm_cfg: b_layout = LOWP_LAYOUT_KN and
 * split = LOWP_GROUPED_SPLIT_K with lowp_gemm and lowp_grouped_gemm. They stay below as thin
 * wrappers (declared once gemm.h is included, which includes this file again at its end).
 *
 * lowp_quantize_grouped took (x, col_out, cfg) in 0.2 and takes (x, row_out, col_out, cfg) now,
 * the rowwise copy from the same read as lowp_quantize's: one name cannot keep both forms, so
 * C code fails to compile until it passes NULL as row_out; bindings that declare the C
 * signature themselves (ctypes) must add the argument.
 */
#ifndef LOWP_DEPRECATED_H
#define LOWP_DEPRECATED_H

#ifndef LOWP_NO_DEPRECATED
/* lowp_kernel_path (device.h) */
#define LOWP_PATH_AUTO           LOWP_KERNEL_PATH_AUTO
#define LOWP_PATH_REFERENCE      LOWP_KERNEL_PATH_REFERENCE
#define LOWP_PATH_AVX512         LOWP_KERNEL_PATH_AVX512
#define LOWP_GEMM_PATH_AUTO      LOWP_KERNEL_PATH_AUTO
#define LOWP_GEMM_PATH_REFERENCE LOWP_KERNEL_PATH_REFERENCE
#define LOWP_GEMM_PATH_AVX512    LOWP_KERNEL_PATH_AVX512
#define LOWP_GEMM_PATH_AMX       LOWP_KERNEL_PATH_AMX
#define lowp_gemm_path           lowp_kernel_path
/* lowp_scale_mode (scale.h) */
#define LOWP_SCALE_DEFAULT LOWP_SCALE_MODE_DEFAULT
#define LOWP_SCALE_RCEIL   LOWP_SCALE_MODE_RCEIL
#define LOWP_SCALE_FLOOR   LOWP_SCALE_MODE_FLOOR
#define LOWP_SCALE_CEIL    LOWP_SCALE_MODE_CEIL
#define LOWP_SCALE_EVEN    LOWP_SCALE_MODE_EVEN
/* lowp_amax_algo (delayed.h) */
#define LOWP_AMAX_MAX         LOWP_AMAX_ALGO_MAX
#define LOWP_AMAX_MOST_RECENT LOWP_AMAX_ALGO_MOST_RECENT
/* lowp_rounding (format.h) */
#define LOWP_ROUND_RNE LOWP_ROUNDING_RNE
#define LOWP_ROUND_SR  LOWP_ROUNDING_SR
/* extra state (checkpoint.h): one word for it, "extra state"; its bytes are "the blob" */
#define lowp_fp8_state_blob_size lowp_fp8_state_extra_state_size
#define lowp_fp8_state_save      lowp_fp8_state_extra_state_save
#define lowp_fp8_state_load      lowp_fp8_state_extra_state_load
#endif

#endif

/* The GEMM twins (gemm.h), same arguments as before: each sets b_layout and split in a copy of
 * cfg (NULL: the defaults) and calls lowp_gemm or lowp_grouped_gemm. */
#if defined(LOWP_GEMM_H) && !defined(LOWP_DEPRECATED_GEMM_H) && !defined(LOWP_NO_DEPRECATED)
#define LOWP_DEPRECATED_GEMM_H
#ifdef __cplusplus
extern "C" {
#endif
/* lowp_gemm with b_layout KN */
LOWP_API lowp_status lowp_gemm_kn(const lowp_qtensor *a, const lowp_qtensor *b, lowp_tensor *c,
                                  const lowp_gemm_cfg *cfg);
/* lowp_grouped_gemm, split-M, b_layout KN */
LOWP_API lowp_status lowp_grouped_gemm_kn(const lowp_qtensor *a, const lowp_qtensor *b,
                                          const int32_t *offs, int32_t groups, lowp_tensor *c,
                                          const lowp_gemm_cfg *cfg);
/* lowp_grouped_gemm, split-K, b_layout NK */
LOWP_API lowp_status lowp_grouped_gemm_wgrad(const lowp_qtensor *a, const lowp_qtensor *b,
                                             const int32_t *offs, int32_t groups, lowp_tensor *c,
                                             const lowp_gemm_cfg *cfg);
/* lowp_grouped_gemm, split-K, b_layout KN */
LOWP_API lowp_status lowp_grouped_gemm_wgrad_kn(const lowp_qtensor *a, const lowp_qtensor *b,
                                                const int32_t *offs, int32_t groups, lowp_tensor *c,
                                                const lowp_gemm_cfg *cfg);
#ifdef __cplusplus
}
#endif
#endif
