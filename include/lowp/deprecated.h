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
 *          -e 's/\bLOWP_ROUND_\(RNE\|SR\)\b/LOWP_ROUNDING_\1/g' FILES
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
#endif

#endif
