/* Backends built against older headers (API versions 1 to 4), for the registry: their vtable
 * layouts, and the adapters that serve them through the current lowp_backend_iface.
 * Implemented in compat.c. Not installed. */
#ifndef LOWP_DEVICE_COMPAT_H
#define LOWP_DEVICE_COMPAT_H

#include "core/internal.h"
#include "lowp/device.h"

struct lowp_gemm_cfg;

/* The version-3 vtable, as device.h declared it: version 2 is its prefix up to gemm_kn,
 * version 1 up to amax. */
typedef struct lowp_backend_iface_v3 {
    lowp_status (*device_count)(void *ctx, int32_t *count);
    lowp_status (*caps)(void *ctx, int32_t index, lowp_caps *out);
    lowp_status (*synchronize)(void *ctx, int32_t index);
    lowp_status (*alloc)(void *ctx, int32_t index, size_t nbytes, void **ptr);
    lowp_status (*free)(void *ctx, int32_t index, void *ptr);
    lowp_status (*memcpy_h2d)(void *ctx, int32_t index, void *dst, const void *src, size_t n);
    lowp_status (*memcpy_d2h)(void *ctx, int32_t index, void *dst, const void *src, size_t n);
    lowp_status (*memcpy_d2d)(void *ctx, int32_t dst_index, void *dst, int32_t src_index,
                              const void *src, size_t n);
    lowp_status (*cast)(void *ctx, int32_t index, const struct lowp_tensor *src,
                        struct lowp_tensor *dst, const struct lowp_cast_cfg *cfg);
    lowp_status (*quantize)(void *ctx, int32_t index, const struct lowp_tensor *x,
                            struct lowp_qtensor *row_out, struct lowp_qtensor *col_out,
                            const struct lowp_quant_cfg *cfg);
    lowp_status (*quantize_grouped)(void *ctx, int32_t index, const struct lowp_tensor *x,
                                    struct lowp_qtensor *col_out, const struct lowp_quant_cfg *cfg);
    lowp_status (*dequantize)(void *ctx, int32_t index, const struct lowp_qtensor *q,
                              struct lowp_tensor *out);
    lowp_status (*gemm)(void *ctx, int32_t index, const struct lowp_qtensor *a,
                        const struct lowp_qtensor *b, struct lowp_tensor *c,
                        const struct lowp_gemm_cfg *cfg);
    lowp_status (*grouped_gemm)(void *ctx, int32_t index, const struct lowp_qtensor *a,
                                const struct lowp_qtensor *b, const int32_t *offs, int32_t groups,
                                struct lowp_tensor *c, const struct lowp_gemm_cfg *cfg);
    lowp_status (*grouped_gemm_wgrad)(void *ctx, int32_t index, const struct lowp_qtensor *a,
                                      const struct lowp_qtensor *b, const int32_t *offs,
                                      int32_t groups, struct lowp_tensor *c,
                                      const struct lowp_gemm_cfg *cfg);
    void (*destroy)(void *ctx);
    lowp_status (*amax)(void *ctx, int32_t index, const struct lowp_tensor *x, int32_t scaling,
                        float *out, size_t out_count);
    lowp_status (*gemm_kn)(void *ctx, int32_t index, const struct lowp_qtensor *a,
                           const struct lowp_qtensor *b, struct lowp_tensor *c,
                           const struct lowp_gemm_cfg *cfg);
    lowp_status (*grouped_gemm_kn)(void *ctx, int32_t index, const struct lowp_qtensor *a,
                                   const struct lowp_qtensor *b, const int32_t *offs,
                                   int32_t groups, struct lowp_tensor *c,
                                   const struct lowp_gemm_cfg *cfg);
    lowp_status (*grouped_gemm_wgrad_kn)(void *ctx, int32_t index, const struct lowp_qtensor *a,
                                         const struct lowp_qtensor *b, const int32_t *offs,
                                         int32_t groups, struct lowp_tensor *c,
                                         const struct lowp_gemm_cfg *cfg);
} lowp_backend_iface_v3;

/* The version-4 vtable, as device.h declared it: one GEMM slot and one grouped slot, and the
 * grouped copy of lowp_quantize_grouped in its own slot. */
typedef struct lowp_backend_iface_v4 {
    lowp_status (*device_count)(void *ctx, int32_t *count);
    lowp_status (*caps)(void *ctx, int32_t index, lowp_caps *out);
    lowp_status (*synchronize)(void *ctx, int32_t index);
    lowp_status (*alloc)(void *ctx, int32_t index, size_t nbytes, void **ptr);
    lowp_status (*free)(void *ctx, int32_t index, void *ptr);
    lowp_status (*memcpy_h2d)(void *ctx, int32_t index, void *dst, const void *src, size_t n);
    lowp_status (*memcpy_d2h)(void *ctx, int32_t index, void *dst, const void *src, size_t n);
    lowp_status (*memcpy_d2d)(void *ctx, int32_t dst_index, void *dst, int32_t src_index,
                              const void *src, size_t n);
    lowp_status (*cast)(void *ctx, int32_t index, const struct lowp_tensor *src,
                        struct lowp_tensor *dst, const struct lowp_cast_cfg *cfg);
    lowp_status (*quantize)(void *ctx, int32_t index, const struct lowp_tensor *x,
                            struct lowp_qtensor *row_out, struct lowp_qtensor *col_out,
                            const struct lowp_quant_cfg *cfg);
    lowp_status (*quantize_grouped)(void *ctx, int32_t index, const struct lowp_tensor *x,
                                    struct lowp_qtensor *col_out, const struct lowp_quant_cfg *cfg);
    lowp_status (*dequantize)(void *ctx, int32_t index, const struct lowp_qtensor *q,
                              struct lowp_tensor *out);
    lowp_status (*gemm)(void *ctx, int32_t index, const struct lowp_qtensor *a,
                        const struct lowp_qtensor *b, struct lowp_tensor *c,
                        const struct lowp_gemm_cfg *cfg);
    lowp_status (*grouped_gemm)(void *ctx, int32_t index, const struct lowp_qtensor *a,
                                const struct lowp_qtensor *b, const int32_t *offs, int32_t groups,
                                struct lowp_tensor *c, const struct lowp_gemm_cfg *cfg);
    void (*destroy)(void *ctx);
    lowp_status (*amax)(void *ctx, int32_t index, const struct lowp_tensor *x, int32_t scaling,
                        float *out, size_t out_count);
} lowp_backend_iface_v4;

/* An older backend as the registry holds it: its vtable in the version-3 layout (the slots
 * past its version's end NULL; a version-4 vtable's gemm slot in each of gemm and gemm_kn, its
 * grouped slot in each of the four grouped ones, since the adapters pass cfg on unchanged),
 * its own context and its name. The registry passes a pointer to this as the context of
 * the adapter vtable, so it must not move (the registry's slots are static). */
typedef struct lowp_legacy_backend {
    lowp_backend_iface_v3 old;
    void *ctx;
    const char *name;
    uint32_t version;
} lowp_legacy_backend;

/* reg (api_version 1 to 4, checked) into *legacy, and *iface filled with the adapters of the
 * slots the old vtable has (NULL where it has none); `name` must outlive the registration. */
LOWP_HIDDEN void lowp_legacy_adapt(const lowp_backend_reg *reg, const char *name,
                                   lowp_legacy_backend *legacy, lowp_backend_iface *iface);

/* The destroy slot of reg's vtable, wherever its version puts it (NULL when absent). */
typedef void (*lowp_backend_destroy_fn)(void *ctx);
LOWP_HIDDEN lowp_backend_destroy_fn lowp_backend_destroy_of(const lowp_backend_reg *reg);

#endif
