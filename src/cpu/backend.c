/* The CPU backend: the host as a device. Work on it is synchronous (kernels return when they
 * are done), so synchronize has nothing to wait for and the copies are plain memcpy. It is
 * registered in-process by the registry, so unlike a plugin it may write lowp_last_error. */
#include <stdlib.h>

#include "cpu.h"
#include "lowp/gemm.h"

/* Cache-line alignment, and a whole number of 64-byte AVX-512 vectors per buffer, so that
 * kernels may use aligned full-width loads and stores up to the rounded end. */
#define CPU_ALIGN 64
_Static_assert(CPU_ALIGN == 64, "lowp_host_alloc gives 64-byte blocks");

static lowp_status check_index(const char *fn, int32_t index) {
    if (index != 0)
        return lowp_fail(LOWP_ERR_NOT_FOUND, "%s: device index (%d) >= device count (1) of \"cpu\"",
                         fn, (int) index);
    return LOWP_OK;
}

static lowp_status cpu_device_count(void *ctx, int32_t *count) {
    (void) ctx;
    *count = 1;
    return LOWP_OK;
}

static lowp_status cpu_caps(void *ctx, int32_t index, lowp_caps *out) {
    (void) ctx;
    lowp_status st = check_index("lowp_device_caps", index);
    if (st == LOWP_OK) *out = *lowp_cpu_caps();
    return st;
}

static lowp_status cpu_synchronize(void *ctx, int32_t index) {
    (void) ctx;
    return check_index("lowp_device_synchronize", index);
}

static lowp_status cpu_alloc(void *ctx, int32_t index, size_t nbytes, void **ptr) {
    (void) ctx;
    lowp_status st = check_index("lowp_malloc", index);
    if (st != LOWP_OK) return st;
    if (nbytes > SIZE_MAX - (CPU_ALIGN - 1))
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_malloc: nbytes (%zu) is too large", nbytes);
    /* a whole number of CPU_ALIGN blocks; 0 bytes still gets a real pointer so that a
     * successful lowp_malloc always returns something lowp_free accepts; large buffers on
     * huge pages (hostmem.c) */
    *ptr = lowp_host_alloc(nbytes);
    if (!*ptr)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY,
                         "lowp_malloc: cannot allocate %zu bytes on the CPU", nbytes);
    return LOWP_OK;
}

static lowp_status cpu_free(void *ctx, int32_t index, void *ptr) {
    (void) ctx;
    lowp_status st = check_index("lowp_free", index);
    if (st == LOWP_OK) free(ptr);
    return st;
}

static lowp_status cpu_copy(void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
    return LOWP_OK;
}

static lowp_status cpu_h2d(void *ctx, int32_t index, void *dst, const void *src, size_t n) {
    (void) ctx;
    lowp_status st = check_index("lowp_memcpy", index);
    return st == LOWP_OK ? cpu_copy(dst, src, n) : st;
}

static lowp_status cpu_d2d(void *ctx, int32_t dst_index, void *dst, int32_t src_index,
                           const void *src, size_t n) {
    (void) ctx;
    lowp_status st = check_index("lowp_memcpy", dst_index);
    if (st == LOWP_OK) st = check_index("lowp_memcpy", src_index);
    return st == LOWP_OK ? cpu_copy(dst, src, n) : st;
}

static lowp_status cpu_cast(void *ctx, int32_t index, const lowp_tensor *src, lowp_tensor *dst,
                            const lowp_cast_cfg *cfg) {
    (void) ctx;
    lowp_status st = check_index("lowp_cast", index);
    return st == LOWP_OK ? lowp_cpu_cast(src, dst, cfg) : st;
}

static lowp_status cpu_quantize(void *ctx, int32_t index, const lowp_tensor *x, lowp_qtensor *row,
                                lowp_qtensor *col, const lowp_quant_cfg *cfg) {
    (void) ctx;
    const int grouped = col && col->group_offs; /* lowp_quantize_grouped */
    lowp_status st = check_index(grouped ? "lowp_quantize_grouped" : "lowp_quantize", index);
    if (st != LOWP_OK) return st;
    return grouped ? lowp_cpu_quantize_grouped(x, row, col, cfg)
                   : lowp_cpu_quantize(x, row, col, cfg);
}

static lowp_status cpu_dequantize(void *ctx, int32_t index, const lowp_qtensor *q,
                                  lowp_tensor *out) {
    (void) ctx;
    lowp_status st = check_index("lowp_dequantize", index);
    return st == LOWP_OK ? lowp_cpu_dequantize(q, out, 0) : st; /* every core */
}

static lowp_status cpu_gemm(void *ctx, int32_t index, const lowp_qtensor *a, const lowp_qtensor *b,
                            lowp_tensor *c, const lowp_gemm_cfg *cfg) {
    (void) ctx;
    lowp_status st = check_index("lowp_gemm", index);
    return st == LOWP_OK ? lowp_cpu_gemm(a, b, cfg->b_layout == LOWP_LAYOUT_KN, c, cfg) : st;
}

/* Split-M with b[groups], or split-K with one b (cfg->split). */
static lowp_status cpu_grouped_gemm(void *ctx, int32_t index, const lowp_qtensor *a,
                                    const lowp_qtensor *b, const int32_t *offs, int32_t groups,
                                    lowp_tensor *c, const lowp_gemm_cfg *cfg) {
    (void) ctx;
    lowp_status st = check_index("lowp_grouped_gemm", index);
    if (st != LOWP_OK) return st;
    const int kn = cfg->b_layout == LOWP_LAYOUT_KN;
    return cfg->split == LOWP_GROUPED_SPLIT_K
               ? lowp_cpu_grouped_gemm_wgrad(a, b, kn, offs, groups, c, cfg)
               : lowp_cpu_grouped_gemm(a, b, kn, offs, groups, c, cfg);
}

static lowp_status cpu_amax(void *ctx, int32_t index, const lowp_tensor *x, int32_t scaling,
                            float *out, size_t out_count) {
    (void) ctx;
    (void) out_count; /* checked against the scale shape by src/ops/quant.c */
    lowp_status st = check_index("lowp_amax", index);
    return st == LOWP_OK ? lowp_cpu_amax(x, (int) scaling, out) : st;
}

static const lowp_backend_iface k_cpu_iface = {
    .device_count = cpu_device_count,
    .caps = cpu_caps,
    .synchronize = cpu_synchronize,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memcpy_h2d = cpu_h2d,
    .memcpy_d2h = cpu_h2d, /* host and device are the same memory */
    .memcpy_d2d = cpu_d2d,
    .cast = cpu_cast,
    .quantize = cpu_quantize,
    .dequantize = cpu_dequantize,
    .gemm = cpu_gemm,
    .grouped_gemm = cpu_grouped_gemm,
    .destroy = NULL,
    .amax = cpu_amax,
};

lowp_status lowp_cpu_backend_entry(lowp_backend_reg *reg) {
    LOWP_CHECK_PTR("lowp_cpu_backend_entry", reg);
    reg->api_version = LOWP_BACKEND_API_VERSION;
    reg->struct_size = sizeof *reg;
    reg->name = "cpu";
    reg->iface = &k_cpu_iface;
    reg->ctx = NULL;
    return LOWP_OK;
}
