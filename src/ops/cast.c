/* lowp_cast: validate the arguments, then run the cast on the backend of the tensors'
 * device. */
#include "lowp/cast.h"
#include "ops_internal.h"
#include "ops/alias.h"

lowp_status lowp_cast_cfg_init(lowp_cast_cfg *cfg) {
    LOWP_CHECK_PTR("lowp_cast_cfg_init", cfg);
    memset(cfg, 0, sizeof *cfg);
    cfg->overflow = LOWP_OVERFLOW_DEFAULT;
    cfg->rounding = LOWP_ROUNDING_RNE;
    cfg->path = LOWP_KERNEL_PATH_AUTO;
    return LOWP_OK;
}

static lowp_status check_cfg(const lowp_cast_cfg *cfg) {
    if (cfg->overflow != LOWP_OVERFLOW_SATFINITE && cfg->overflow != LOWP_OVERFLOW_NONSAT &&
        cfg->overflow != LOWP_OVERFLOW_DEFAULT)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_cast: cfg.overflow (%d) is not a lowp_overflow",
                         (int) cfg->overflow);
    if (cfg->rounding != LOWP_ROUNDING_RNE && cfg->rounding != LOWP_ROUNDING_SR)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_cast: cfg.rounding (%d) is not a lowp_rounding",
                         (int) cfg->rounding);
    return lowp_op_check_threads_path("lowp_cast", cfg->threads, cfg->path);
}

lowp_status lowp_cast(const lowp_tensor *src, lowp_tensor *dst, const lowp_cast_cfg *cfg) {
    LOWP_CHECK_PTR("lowp_cast", src);
    LOWP_CHECK_PTR("lowp_cast", dst);
    lowp_cast_cfg defaults;
    if (!cfg) {
        lowp_cast_cfg_init(&defaults);
        cfg = &defaults;
    }
    lowp_status st = check_cfg(cfg);
    if (st != LOWP_OK) return st;
    const lowp_format_traits *st_, *dt;
    if (lowp_format_get(src->format, &st_) != LOWP_OK)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_cast: src.format (%d) is not a lowp_format",
                         (int) src->format);
    if (lowp_format_get(dst->format, &dt) != LOWP_OK)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_cast: dst.format (%d) is not a lowp_format",
                         (int) dst->format);
    int encode_pair = src->format == LOWP_FORMAT_F32 ||
                      (src->format == LOWP_FORMAT_BF16 && dst->format != LOWP_FORMAT_F32 &&
                       dst->format != LOWP_FORMAT_BF16);
    int decode_pair = dst->format == LOWP_FORMAT_F32;
    if (!encode_pair && !decode_pair)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "lowp_cast: src.format (%s) -> dst.format (%s) is not a supported pair "
                         "(f32 -> any, bf16 -> 8/4-bit or f16, any -> f32)",
                         st_->name, dt->name);
    if (cfg->rounding == LOWP_ROUNDING_SR && !dt->encode_sr)
        return lowp_fail(
            LOWP_ERR_UNSUPPORTED,
            "lowp_cast: cfg.rounding (LOWP_ROUNDING_SR) is not defined for dst.format (%s)",
            dt->name);
    if (src->rows != dst->rows || src->cols != dst->cols)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_cast: dst shape (%lld x %lld) != src shape (%lld x %lld)",
                         (long long) dst->rows, (long long) dst->cols, (long long) src->rows,
                         (long long) src->cols);
    size_t sbytes, dbytes;
    if ((st = lowp_tensor_nbytes(src, &sbytes)) != LOWP_OK) return st;
    if ((st = lowp_tensor_nbytes(dst, &dbytes)) != LOWP_OK) return st;
    if (sbytes && !src->data) return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_cast: src.data is NULL");
    if (dbytes && !dst->data) return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_cast: dst.data is NULL");
    if (!lowp_same_device(src->device, dst->device))
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_cast: dst.device (%d:%d) != src.device (%d:%d); copy first",
                         dst->device.type, dst->device.index, src->device.type, src->device.index);
    const lowp_span out = {"dst.data", dst->data, dbytes}, in = {"src.data", src->data, sbytes};
    if ((st = lowp_check_no_alias("lowp_cast", &out, 1, &in, 1)) != LOWP_OK) return st;
    /* Backends see a concrete policy: the format's default is resolved here, once. */
    lowp_cast_cfg resolved = *cfg;
    resolved.overflow = (lowp_overflow) lowp_overflow_resolve(dst->format, cfg->overflow);
    lowp_op_call c;
    if ((st = lowp_op_begin(&c, "lowp_cast", "src.device", src->device, LOWP_OP_SLOT(cast))) !=
        LOWP_OK)
        return st;
    st = c.iface->cast(c.ctx, src->device.index, src, dst, &resolved);
    return lowp_op_end(&c, st);
}
