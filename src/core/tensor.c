/* Sizes of plain tensors: the one place that knows how many bytes a row takes. */
#include "internal.h"
#include "lowp/tensor.h"

lowp_status lowp_row_nbytes(lowp_format format, int64_t cols, size_t *out) {
    const lowp_format_traits *t;
    lowp_status st = lowp_format_get(format, &t);
    if (st != LOWP_OK) return st;
    LOWP_CHECK_PTR("lowp_row_nbytes", out);
    if (cols < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_row_nbytes: cols (%lld) < 0",
                         (long long) cols);
    if ((uint64_t) cols > (SIZE_MAX / 4))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_row_nbytes: cols (%lld) too large",
                         (long long) cols);
    *out = t->bits == 4 ? ((size_t) cols + 1) / 2 : (size_t) cols * (size_t) (t->bits / 8);
    return LOWP_OK;
}

lowp_status lowp_tensor_nbytes(const lowp_tensor *t, size_t *out) {
    LOWP_CHECK_PTR("lowp_tensor_nbytes", t);
    LOWP_CHECK_PTR("lowp_tensor_nbytes", out);
    if (t->rows < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_tensor_nbytes: rows (%lld) < 0",
                         (long long) t->rows);
    size_t row;
    lowp_status st = lowp_row_nbytes(t->format, t->cols, &row);
    if (st != LOWP_OK) return st;
    if (row != 0 && (uint64_t) t->rows > SIZE_MAX / row)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_tensor_nbytes: rows (%lld) x row bytes (%zu) overflows",
                         (long long) t->rows, row);
    *out = (size_t) t->rows * row;
    return LOWP_OK;
}
