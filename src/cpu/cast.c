/* CPU cast dispatcher: picks the kernel (reference, AVX-512 or AVX2) and splits the tensor into
 * pieces for the threads. Arguments were validated by the ops layer (src/ops/cast.c). */
#include <omp.h>

#include "cpu.h"

typedef void (*cast_kernel)(const lowp_cast_piece *);

static size_t elem_bytes(lowp_format f) {
    const lowp_format_traits *t;
    lowp_format_get(f, &t);
    return (size_t) t->bits / 8; /* 0 for E2M1: addressed by pairs below */
}

/* Address of element i of a row-contiguous buffer (i even for E2M1). */
static const uint8_t *elem_addr(const void *base, lowp_format f, size_t i) {
    return f == LOWP_FORMAT_E2M1 ? (const uint8_t *) base + i / 2
                                 : (const uint8_t *) base + i * elem_bytes(f);
}

lowp_status lowp_cpu_cast(const lowp_tensor *src, lowp_tensor *dst, const lowp_cast_cfg *cfg) {
    lowp_cpu_kernel which;
    lowp_status st = lowp_cpu_pick_kernel(
        "lowp_cast", cfg->path,
        lowp_cpu_cast_avx512_supports(src->format, dst->format, cfg->rounding), 0,
        lowp_cpu_cast_avx2_supports(src->format, dst->format, cfg->rounding), &which);
    if (st != LOWP_OK) return st;
    cast_kernel kernel = which == LOWP_CPU_KERNEL_AVX512 ? lowp_cpu_cast_avx512
                         : which == LOWP_CPU_KERNEL_AVX2 ? lowp_cpu_cast_avx2
                                                         : lowp_cpu_cast_ref;

    int64_t rows = src->rows, cols = src->cols;
    if (rows == 0 || cols == 0) return LOWP_OK;
    int packed = src->format == LOWP_FORMAT_E2M1 || dst->format == LOWP_FORMAT_E2M1;
    int threads = lowp_cpu_threads(cfg->threads, 0);
    /* Rows are contiguous, so unless an E2M1 row of odd length starts mid-byte the tensor is
     * one flat run of elements: split it into equal chunks (multiples of 64 elements). */
    if (!packed || (cols % 2) == 0 || rows == 1) {
        size_t total = (size_t) rows * (size_t) cols;
        size_t per = (total + (size_t) threads - 1) / (size_t) threads;
        per = (per + 63) & ~(size_t) 63;
        if (per < 4096) per = 4096; /* a thread is not worth starting for less */
        int64_t nchunks = (int64_t) ((total + per - 1) / per);
#pragma omp parallel for num_threads(lowp_cpu_threads(threads, nchunks))                           \
    schedule(static) if (nchunks > 1)
        for (int64_t c = 0; c < nchunks; c++) {
            size_t i0 = (size_t) c * per;
            size_t n = total - i0 < per ? total - i0 : per;
            lowp_cast_piece p = {elem_addr(src->data, src->format, i0),
                                 (void *) elem_addr(dst->data, dst->format, i0),
                                 n,
                                 i0,
                                 src->format,
                                 dst->format,
                                 cfg};
            kernel(&p);
        }
    } else {
        size_t srow, drow;
        lowp_row_nbytes(src->format, cols, &srow);
        lowp_row_nbytes(dst->format, cols, &drow);
#pragma omp parallel for num_threads(lowp_cpu_threads(threads, rows))                              \
    schedule(static) if (rows * cols > 8192)
        for (int64_t r = 0; r < rows; r++) {
            lowp_cast_piece p = {(const uint8_t *) src->data + (size_t) r * srow,
                                 (uint8_t *) dst->data + (size_t) r * drow,
                                 (size_t) cols,
                                 (uint64_t) r * (uint64_t) cols,
                                 src->format,
                                 dst->format,
                                 cfg};
            kernel(&p);
        }
    }
    return LOWP_OK;
}
