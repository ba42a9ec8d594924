/* Autocast: a per-device-type policy (on or off, BF16 or F16) that the non-GEMM ops follow
 * (RMSNorm, in rmsnorm.c).
 *
 * Under autocast, RMSNorm behaves as if its input, weight and output were tensors of the
 * autocast dtype: each is rounded to it (RNE; overflow gives Inf, as a cast to that dtype does),
 * while the statistics (sum of squares, mean, 1/sqrt) stay in binary32, summed sequentially
 * along the row so that every run gives the same bits. The device type decides: the policy of
 * x's device type applies, so autocast on for another type leaves a CPU RMSNorm in binary32.
 *
 * The kernels run on host memory: CPU tensors only. Another device type gets
 * LOWP_ERR_UNSUPPORTED (no backend has an RMSNorm slot yet), rather than touching memory the
 * host may not be able to read. */
#include <math.h>

#include "train_internal.h"

lowp_status lowp_autocast_init(lowp_autocast *ac) {
    LOWP_CHECK_PTR("lowp_autocast_init", ac);
    for (int i = 0; i < LOWP_DEVICE_MAX_TYPES; i++) {
        ac->type[i].enabled = 0;
        ac->type[i].dtype = LOWP_FORMAT_BF16; /* what enabling without a choice would mean */
    }
    return LOWP_OK;
}

static lowp_status check_type(const char *fn, const char *arg, int32_t type) {
    if (type < 0 || type >= LOWP_DEVICE_MAX_TYPES)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s (%d) is not in [0, %d)", fn, arg, (int) type,
                         LOWP_DEVICE_MAX_TYPES);
    return LOWP_OK;
}

lowp_status lowp_autocast_set(lowp_autocast *ac, int32_t device_type, int32_t enabled,
                              lowp_format dtype) {
    const char *fn = "lowp_autocast_set";
    LOWP_CHECK_PTR(fn, ac);
    lowp_status s = check_type(fn, "device_type", device_type);
    if (s != LOWP_OK) return s;
    if (dtype != LOWP_FORMAT_BF16 && dtype != LOWP_FORMAT_F16)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: dtype (%d) is not bf16 (%d) or f16 (%d)", fn,
                         (int) dtype, LOWP_FORMAT_BF16, LOWP_FORMAT_F16);
    ac->type[device_type].enabled = enabled != 0;
    ac->type[device_type].dtype = dtype;
    return LOWP_OK;
}

lowp_status lowp_autocast_dtype(const lowp_autocast *ac, lowp_device dev, lowp_format *dtype) {
    const char *fn = "lowp_autocast_dtype";
    LOWP_CHECK_PTR(fn, ac);
    LOWP_CHECK_PTR(fn, dtype);
    lowp_status s = check_type(fn, "dev.type", dev.type);
    if (s != LOWP_OK) return s;
    lowp_format f = lowp_autocast_dtype_for(ac, dev.type);
    if (f != LOWP_FORMAT_F32 && f != LOWP_FORMAT_BF16 && f != LOWP_FORMAT_F16)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: ac.type[%d].dtype (%d) is not bf16 or f16", fn,
                         (int) dev.type, (int) f);
    *dtype = f;
    return LOWP_OK;
}
