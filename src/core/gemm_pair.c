/* Which operand pairs lowp multiplies, and how their scales combine. */
#include "gemm_pair.h"

static int fp8(lowp_format f) {
    return f == LOWP_FORMAT_E4M3 || f == LOWP_FORMAT_E5M2;
}

lowp_status lowp_gemm_classify(const char *fn, const lowp_qtensor *a, const lowp_qtensor *b,
                               lowp_gemm_pair *pair, int64_t *bk) {
    const lowp_scaling sa = a->scaling, sb = b->scaling;
    const lowp_format fa = a->format, fb = b->format;
    *bk = 0;
    if (sa == LOWP_SCALING_NONE && sb == LOWP_SCALING_NONE && fa == fb &&
        (fa == LOWP_FORMAT_F32 || fa == LOWP_FORMAT_BF16)) {
        *pair = LOWP_PAIR_PLAIN;
        return LOWP_OK;
    }
    if (sa == LOWP_SCALING_TENSOR && sb == LOWP_SCALING_TENSOR && fp8(fa) && fp8(fb)) {
        *pair = LOWP_PAIR_TENSOR;
        return LOWP_OK;
    }
    if (sa == LOWP_SCALING_ROW && sb == LOWP_SCALING_ROW && fp8(fa) && fp8(fb)) {
        *pair = LOWP_PAIR_ROW;
        return LOWP_OK;
    }
    const int mx_a = sa == LOWP_SCALING_MX32 && (fp8(fa) || fa == LOWP_FORMAT_E2M1);
    if (mx_a && sb == LOWP_SCALING_MX32 && (fp8(fb) || fb == LOWP_FORMAT_E2M1)) {
        *pair = LOWP_PAIR_MX;
        *bk = 32;
        return LOWP_OK;
    }
    if (mx_a && sb == LOWP_SCALING_BLOCK32X32 && fp8(fb)) {
        *pair = LOWP_PAIR_MX_B32;
        *bk = 32;
        return LOWP_OK;
    }
    if (sa == LOWP_SCALING_BLOCK128 && fp8(fa) && fp8(fb) &&
        (sb == LOWP_SCALING_BLOCK128X128 || sb == LOWP_SCALING_BLOCK128)) {
        *pair = sb == LOWP_SCALING_BLOCK128 ? LOWP_PAIR_B128_B128 : LOWP_PAIR_B128_W;
        *bk = 128;
        return LOWP_OK;
    }
    const int nv_a = sa == LOWP_SCALING_NV16 || sa == LOWP_SCALING_NV16X16;
    const int nv_b = sb == LOWP_SCALING_NV16 || sb == LOWP_SCALING_NV16X16;
    if (nv_a && nv_b && fa == LOWP_FORMAT_E2M1 && fb == LOWP_FORMAT_E2M1) {
        *pair = LOWP_PAIR_NV;
        *bk = 16;
        return LOWP_OK;
    }
    const lowp_format_traits *ta, *tb;
    const char *na = lowp_format_get(fa, &ta) == LOWP_OK ? ta->name : "?";
    const char *nb = lowp_format_get(fb, &tb) == LOWP_OK ? tb->name : "?";
    return lowp_fail(LOWP_ERR_UNSUPPORTED,
                     "%s: operand pair a (%s %s) x b (%s %s) is not supported (pairs: none x none "
                     "f32/bf16, tensor x tensor, row x row, mx32 x mx32, block128 x block128x128, "
                     "block128 x block128, mx32 x block32x32, nv16/nv16x16 x nv16/nv16x16 e2m1)",
                     fn, lowp_scaling_name(sa), na, lowp_scaling_name(sb), nb);
}
