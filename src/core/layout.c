/* Converters between lowp's canonical E8M0 scale layout (row-major [srows, scols]) and the
 * layouts devices consume: cuBLAS/TE's swizzled 128x4 tiles and the Ascend NPU's pairs. */
#include "internal.h"
#include "lowp/layout.h"

static lowp_status check_dims(const char *fn, int64_t srows, int64_t scols) {
    if (srows < 0 || scols < 0 || srows > (INT64_C(1) << 40) || scols > (INT64_C(1) << 40))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: scale shape (%lld x %lld) is out of range", fn,
                         (long long) srows, (long long) scols);
    return LOWP_OK;
}

lowp_status lowp_scales_cublas_nbytes(int64_t srows, int64_t scols, size_t *out) {
    lowp_status st = check_dims("lowp_scales_cublas_nbytes", srows, scols);
    if (st != LOWP_OK) return st;
    LOWP_CHECK_PTR("lowp_scales_cublas_nbytes", out);
    *out = (size_t) ((srows + 127) / 128 * 128) * (size_t) ((scols + 3) / 4 * 4);
    return LOWP_OK;
}

/* Byte offset in the swizzled array of canonical element (r, c). */
static size_t swz_offset(int64_t r, int64_t c, int64_t ncb) {
    size_t tile = (size_t) ((r / 128) * ncb + c / 4) * 512;
    int64_t tr = r % 128, tc = c % 4;
    return tile + (size_t) ((tr % 32) * 16 + (tr / 32) * 4 + tc);
}

lowp_status lowp_scales_to_cublas(const uint8_t *canon, int64_t srows, int64_t scols, uint8_t *out,
                                  size_t out_bytes) {
    const char *fn = "lowp_scales_to_cublas";
    size_t need;
    lowp_status st = lowp_scales_cublas_nbytes(srows, scols, &need);
    if (st != LOWP_OK) return st;
    if (srows * scols > 0) LOWP_CHECK_PTR(fn, canon);
    if (need) LOWP_CHECK_PTR(fn, out);
    if (out_bytes < need)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: out_bytes (%zu) < %zu needed for %lld x %lld",
                         fn, out_bytes, need, (long long) srows, (long long) scols);
    memset(out, 0, need); /* padding rows and columns are zero */
    const int64_t ncb = (scols + 3) / 4;
    for (int64_t r = 0; r < srows; r++)
        for (int64_t c = 0; c < scols; c++) out[swz_offset(r, c, ncb)] = canon[r * scols + c];
    return LOWP_OK;
}

lowp_status lowp_scales_from_cublas(const uint8_t *swz, size_t swz_bytes, int64_t srows,
                                    int64_t scols, uint8_t *canon) {
    const char *fn = "lowp_scales_from_cublas";
    size_t need;
    lowp_status st = lowp_scales_cublas_nbytes(srows, scols, &need);
    if (st != LOWP_OK) return st;
    if (need) LOWP_CHECK_PTR(fn, swz);
    if (srows * scols > 0) LOWP_CHECK_PTR(fn, canon);
    if (swz_bytes < need)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: swz_bytes (%zu) < %zu needed for %lld x %lld",
                         fn, swz_bytes, need, (long long) srows, (long long) scols);
    const int64_t ncb = (scols + 3) / 4;
    for (int64_t r = 0; r < srows; r++)
        for (int64_t c = 0; c < scols; c++) canon[r * scols + c] = swz[swz_offset(r, c, ncb)];
    return LOWP_OK;
}

lowp_status lowp_scales_npu_nbytes(int64_t srows, int64_t scols, size_t *out) {
    lowp_status st = check_dims("lowp_scales_npu_nbytes", srows, scols);
    if (st != LOWP_OK) return st;
    LOWP_CHECK_PTR("lowp_scales_npu_nbytes", out);
    *out = (size_t) srows * (size_t) ((scols + 1) / 2 * 2);
    return LOWP_OK;
}

/* Byte offset in the NPU array of canonical element (r, c) (c may be the pad column). */
static size_t npu_offset(int64_t r, int64_t c, int64_t srows, int64_t pairs, lowp_npu_axis axis) {
    if (axis == LOWP_NPU_AXIS_LAST) return (size_t) ((r * pairs + c / 2) * 2 + c % 2);
    return (size_t) (((c / 2) * srows + r) * 2 + c % 2);
}

static lowp_status check_axis(const char *fn, lowp_npu_axis axis) {
    if (axis != LOWP_NPU_AXIS_LAST && axis != LOWP_NPU_AXIS_FIRST)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: axis (%d) is not a lowp_npu_axis", fn,
                         (int) axis);
    return LOWP_OK;
}

lowp_status lowp_scales_to_npu(const uint8_t *canon, int64_t srows, int64_t scols,
                               lowp_npu_axis axis, uint8_t *out, size_t out_bytes) {
    const char *fn = "lowp_scales_to_npu";
    size_t need;
    lowp_status st = lowp_scales_npu_nbytes(srows, scols, &need);
    if (st != LOWP_OK) return st;
    if ((st = check_axis(fn, axis)) != LOWP_OK) return st;
    if (srows * scols > 0) LOWP_CHECK_PTR(fn, canon);
    if (need) LOWP_CHECK_PTR(fn, out);
    if (out_bytes < need)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: out_bytes (%zu) < %zu needed for %lld x %lld",
                         fn, out_bytes, need, (long long) srows, (long long) scols);
    const int64_t pairs = (scols + 1) / 2;
    for (int64_t r = 0; r < srows; r++)
        for (int64_t c = 0; c < pairs * 2; c++)
            out[npu_offset(r, c, srows, pairs, axis)] = c < scols ? canon[r * scols + c] : 0;
    return LOWP_OK;
}

lowp_status lowp_scales_from_npu(const uint8_t *npu, size_t npu_bytes, int64_t srows, int64_t scols,
                                 lowp_npu_axis axis, uint8_t *canon) {
    const char *fn = "lowp_scales_from_npu";
    size_t need;
    lowp_status st = lowp_scales_npu_nbytes(srows, scols, &need);
    if (st != LOWP_OK) return st;
    if ((st = check_axis(fn, axis)) != LOWP_OK) return st;
    if (need) LOWP_CHECK_PTR(fn, npu);
    if (srows * scols > 0) LOWP_CHECK_PTR(fn, canon);
    if (npu_bytes < need)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: npu_bytes (%zu) < %zu needed for %lld x %lld",
                         fn, npu_bytes, need, (long long) srows, (long long) scols);
    const int64_t pairs = (scols + 1) / 2;
    for (int64_t r = 0; r < srows; r++)
        for (int64_t c = 0; c < scols; c++)
            canon[r * scols + c] = npu[npu_offset(r, c, srows, pairs, axis)];
    return LOWP_OK;
}
