/* Backends of API versions 1 to 4 (compat.h): the registry holds their vtable in the version-3
 * layout and serves it through these adapters, which call each old slot with the backend's
 * own context and route lowp_gemm and lowp_grouped_gemm by (cfg.b_layout, cfg.split) to the
 * slot that version had for it: gemm / gemm_kn, grouped_gemm / grouped_gemm_kn,
 * grouped_gemm_wgrad / grouped_gemm_wgrad_kn; and a grouped quantization (col_out with
 * group_offs) to quantize_grouped, its rowwise copy to quantize. */
#include <string.h>

#include "device/compat.h"
#include "lowp/gemm.h"

#define OLD(ctx)  (&((const lowp_legacy_backend *) (ctx))->old)
#define OCTX(ctx) (((const lowp_legacy_backend *) (ctx))->ctx)

static lowp_status ad_device_count(void *ctx, int32_t *count) {
    return OLD(ctx)->device_count(OCTX(ctx), count);
}
static lowp_status ad_caps(void *ctx, int32_t index, lowp_caps *out) {
    return OLD(ctx)->caps(OCTX(ctx), index, out);
}
static lowp_status ad_synchronize(void *ctx, int32_t index) {
    return OLD(ctx)->synchronize(OCTX(ctx), index);
}
static lowp_status ad_alloc(void *ctx, int32_t index, size_t nbytes, void **ptr) {
    return OLD(ctx)->alloc(OCTX(ctx), index, nbytes, ptr);
}
static lowp_status ad_free(void *ctx, int32_t index, void *ptr) {
    return OLD(ctx)->free(OCTX(ctx), index, ptr);
}
static lowp_status ad_h2d(void *ctx, int32_t index, void *dst, const void *src, size_t n) {
    return OLD(ctx)->memcpy_h2d(OCTX(ctx), index, dst, src, n);
}
static lowp_status ad_d2h(void *ctx, int32_t index, void *dst, const void *src, size_t n) {
    return OLD(ctx)->memcpy_d2h(OCTX(ctx), index, dst, src, n);
}
static lowp_status ad_d2d(void *ctx, int32_t dst_index, void *dst, int32_t src_index,
                          const void *src, size_t n) {
    return OLD(ctx)->memcpy_d2d(OCTX(ctx), dst_index, dst, src_index, src, n);
}
static lowp_status ad_cast(void *ctx, int32_t index, const lowp_tensor *src, lowp_tensor *dst,
                           const lowp_cast_cfg *cfg) {
    return OLD(ctx)->cast(OCTX(ctx), index, src, dst, cfg);
}
static lowp_status ad_dequantize(void *ctx, int32_t index, const lowp_qtensor *q,
                                 lowp_tensor *out) {
    return OLD(ctx)->dequantize(OCTX(ctx), index, q, out);
}
static void ad_destroy(void *ctx) {
    OLD(ctx)->destroy(OCTX(ctx));
}
static lowp_status ad_amax(void *ctx, int32_t index, const lowp_tensor *x, int32_t scaling,
                           float *out, size_t out_count) {
    return OLD(ctx)->amax(OCTX(ctx), index, x, scaling, out, out_count);
}

/* The (layout, split) the old vtable has no slot for. */
static lowp_status missing(void *ctx, const char *fn, const char *slot) {
    const lowp_legacy_backend *l = ctx;
    return lowp_fail(LOWP_ERR_UNSUPPORTED, "%s: backend \"%s\" (API version %u) has no %s kernel",
                     fn, l->name, (unsigned) l->version, slot);
}

/* A grouped col (lowp_quantize_grouped) goes to the old quantize_grouped slot, and its rowwise
 * copy, if asked, to quantize: two reads of x, the same bytes. Nothing is called when a slot
 * that the call needs is absent. */
static lowp_status ad_quantize(void *ctx, int32_t index, const lowp_tensor *x, lowp_qtensor *row,
                               lowp_qtensor *col, const lowp_quant_cfg *cfg) {
    const lowp_backend_iface_v3 *o = OLD(ctx);
    if (!col || !col->group_offs)
        return o->quantize ? o->quantize(OCTX(ctx), index, x, row, col, cfg)
                           : missing(ctx, "lowp_quantize", "quantize");
    if (!o->quantize_grouped) return missing(ctx, "lowp_quantize_grouped", "quantize_grouped");
    if (row && !o->quantize) return missing(ctx, "lowp_quantize_grouped", "quantize");
    lowp_status st = row ? o->quantize(OCTX(ctx), index, x, row, NULL, cfg) : LOWP_OK;
    return st == LOWP_OK ? o->quantize_grouped(OCTX(ctx), index, x, col, cfg) : st;
}

static lowp_status ad_gemm(void *ctx, int32_t index, const lowp_qtensor *a, const lowp_qtensor *b,
                           lowp_tensor *c, const lowp_gemm_cfg *cfg) {
    const lowp_backend_iface_v3 *o = OLD(ctx);
    if (cfg->b_layout == LOWP_LAYOUT_KN)
        return o->gemm_kn ? o->gemm_kn(OCTX(ctx), index, a, b, c, cfg)
                          : missing(ctx, "lowp_gemm", "gemm_kn");
    return o->gemm ? o->gemm(OCTX(ctx), index, a, b, c, cfg) : missing(ctx, "lowp_gemm", "gemm");
}

typedef lowp_status (*grouped_fn)(void *, int32_t, const lowp_qtensor *, const lowp_qtensor *,
                                  const int32_t *, int32_t, lowp_tensor *, const lowp_gemm_cfg *);

static lowp_status ad_grouped_gemm(void *ctx, int32_t index, const lowp_qtensor *a,
                                   const lowp_qtensor *b, const int32_t *offs, int32_t groups,
                                   lowp_tensor *c, const lowp_gemm_cfg *cfg) {
    const lowp_backend_iface_v3 *o = OLD(ctx);
    const int kn = cfg->b_layout == LOWP_LAYOUT_KN, split_k = cfg->split == LOWP_GROUPED_SPLIT_K;
    grouped_fn f = split_k ? (kn ? o->grouped_gemm_wgrad_kn : o->grouped_gemm_wgrad)
                           : (kn ? o->grouped_gemm_kn : o->grouped_gemm);
    if (!f)
        return missing(ctx, "lowp_grouped_gemm",
                       split_k ? (kn ? "grouped_gemm_wgrad_kn" : "grouped_gemm_wgrad")
                               : (kn ? "grouped_gemm_kn" : "grouped_gemm"));
    return f(OCTX(ctx), index, a, b, offs, groups, c, cfg);
}

/* How many bytes of a vtable of `version` (1 to 3) there are to read. */
static size_t old_size(uint32_t version) {
    if (version >= 3) return sizeof(lowp_backend_iface_v3);
    return version == 2 ? offsetof(lowp_backend_iface_v3, gemm_kn)
                        : offsetof(lowp_backend_iface_v3, amax);
}

/* A version-4 vtable in the version-3 layout (compat.h). */
static void from_v4(const lowp_backend_iface_v4 *v, lowp_backend_iface_v3 *o) {
    *o = (lowp_backend_iface_v3){
        .device_count = v->device_count,
        .caps = v->caps,
        .synchronize = v->synchronize,
        .alloc = v->alloc,
        .free = v->free,
        .memcpy_h2d = v->memcpy_h2d,
        .memcpy_d2h = v->memcpy_d2h,
        .memcpy_d2d = v->memcpy_d2d,
        .cast = v->cast,
        .quantize = v->quantize,
        .quantize_grouped = v->quantize_grouped,
        .dequantize = v->dequantize,
        .gemm = v->gemm,
        .grouped_gemm = v->grouped_gemm,
        .grouped_gemm_wgrad = v->grouped_gemm,
        .destroy = v->destroy,
        .amax = v->amax,
        .gemm_kn = v->gemm,
        .grouped_gemm_kn = v->grouped_gemm,
        .grouped_gemm_wgrad_kn = v->grouped_gemm,
    };
}

void lowp_legacy_adapt(const lowp_backend_reg *reg, const char *name, lowp_legacy_backend *legacy,
                       lowp_backend_iface *iface) {
    memset(legacy, 0, sizeof *legacy);
    if (reg->api_version == 4) {
        lowp_backend_iface_v4 v4;
        memcpy(&v4, (const void *) reg->iface, sizeof v4);
        from_v4(&v4, &legacy->old);
    } else {
        memcpy(&legacy->old, (const void *) reg->iface, old_size(reg->api_version));
    }
    legacy->ctx = reg->ctx;
    legacy->name = name;
    legacy->version = reg->api_version;
    const lowp_backend_iface_v3 *o = &legacy->old;
    *iface = (lowp_backend_iface){
        .device_count = o->device_count ? ad_device_count : NULL,
        .caps = o->caps ? ad_caps : NULL,
        .synchronize = o->synchronize ? ad_synchronize : NULL,
        .alloc = o->alloc ? ad_alloc : NULL,
        .free = o->free ? ad_free : NULL,
        .memcpy_h2d = o->memcpy_h2d ? ad_h2d : NULL,
        .memcpy_d2h = o->memcpy_d2h ? ad_d2h : NULL,
        .memcpy_d2d = o->memcpy_d2d ? ad_d2d : NULL,
        .cast = o->cast ? ad_cast : NULL,
        .quantize = o->quantize || o->quantize_grouped ? ad_quantize : NULL,
        .dequantize = o->dequantize ? ad_dequantize : NULL,
        .gemm = o->gemm || o->gemm_kn ? ad_gemm : NULL,
        .grouped_gemm = o->grouped_gemm || o->grouped_gemm_kn || o->grouped_gemm_wgrad ||
                                o->grouped_gemm_wgrad_kn
                            ? ad_grouped_gemm
                            : NULL,
        .destroy = o->destroy ? ad_destroy : NULL,
        .amax = o->amax ? ad_amax : NULL,
    };
}

lowp_backend_destroy_fn lowp_backend_destroy_of(const lowp_backend_reg *reg) {
    if (!reg->iface) return NULL;
    if (reg->api_version >= 5) return reg->iface->destroy;
    if (reg->api_version == 4) {
        lowp_backend_iface_v4 v4;
        memcpy(&v4, (const void *) reg->iface, sizeof v4);
        return v4.destroy;
    }
    lowp_backend_iface_v3 old;
    memcpy(&old, (const void *) reg->iface,
           offsetof(lowp_backend_iface_v3, amax)); /* destroy is in every one */
    return old.destroy;
}
