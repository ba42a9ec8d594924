/* What the three CPU dispatchers (cast.c, quant.c, gemm.c) share: the kernel-path rule and the
 * thread count. */
#include "cpu.h"
#include "lowp/cpu_path.h"
#include "lowp/threads.h"

static int cpu_has_amx(void) {
    const uint32_t f = lowp_cpu_caps()->flags;
    return (f & LOWP_CAP_AMX_BF16) && (f & LOWP_CAP_AMX_PERMITTED) && lowp_cpu_has_avx512();
}

static int cpu_has_avx2(void) {
    const uint32_t f = lowp_cpu_caps()->flags;
    return (f & LOWP_CAP_AVX2) && (f & LOWP_CAP_FMA);
}

lowp_status lowp_cpu_pick_kernel(const char *fn, lowp_kernel_path path, int avx512_job, int amx_job,
                                 int avx2_job, lowp_cpu_kernel *out) {
    const int have512 = lowp_cpu_has_avx512(), have_amx = cpu_has_amx(), have2 = cpu_has_avx2();
    *out = LOWP_CPU_KERNEL_REFERENCE;
    switch ((int) path) { /* the CPU paths are cpu_path.h's values, outside the enum */
    case LOWP_KERNEL_PATH_REFERENCE: return LOWP_OK;
    case LOWP_KERNEL_PATH_AVX512:
        if (!have512)
            return lowp_fail(LOWP_ERR_UNSUPPORTED,
                             "%s: cfg.path (LOWP_KERNEL_PATH_AVX512) but this CPU lacks "
                             "AVX-512F/BW/VL/DQ",
                             fn);
        if (!avx512_job)
            return lowp_fail(LOWP_ERR_UNSUPPORTED,
                             "%s: cfg.path (LOWP_KERNEL_PATH_AVX512) but there is no AVX-512 "
                             "kernel for this job",
                             fn);
        *out = LOWP_CPU_KERNEL_AVX512;
        return LOWP_OK;
    case LOWP_KERNEL_PATH_AMX:
        if (!have_amx)
            return lowp_fail(LOWP_ERR_UNSUPPORTED,
                             "%s: cfg.path (LOWP_KERNEL_PATH_AMX) but AMX-BF16 is not available "
                             "to this process",
                             fn);
        if (!amx_job)
            return lowp_fail(LOWP_ERR_UNSUPPORTED,
                             "%s: cfg.path (LOWP_KERNEL_PATH_AMX) but there is no AMX kernel for "
                             "this job",
                             fn);
        *out = LOWP_CPU_KERNEL_AMX;
        return LOWP_OK;
    case LOWP_KERNEL_PATH_AVX2:
        if (!have2)
            return lowp_fail(LOWP_ERR_UNSUPPORTED,
                             "%s: cfg.path (LOWP_KERNEL_PATH_AVX2) but this CPU lacks AVX2 and FMA",
                             fn);
        if (!avx2_job)
            return lowp_fail(LOWP_ERR_UNSUPPORTED,
                             "%s: cfg.path (LOWP_KERNEL_PATH_AVX2) but there is no AVX2 kernel "
                             "for this job",
                             fn);
        *out = LOWP_CPU_KERNEL_AVX2;
        return LOWP_OK;
    case LOWP_KERNEL_PATH_AUTO:
    default:
        if (have_amx && amx_job)
            *out = LOWP_CPU_KERNEL_AMX;
        else if (have512 && avx512_job)
            *out = LOWP_CPU_KERNEL_AVX512;
        else if (have2 && avx2_job)
            *out = LOWP_CPU_KERNEL_AVX2;
        return LOWP_OK;
    }
}

#if LOWP_HAVE_LIBMVEC
static const lowp_cpu_vmath g_vmath512 = {"avx512", lowp_cpu_gelu_avx512, lowp_cpu_expf_avx512,
                                          lowp_cpu_swiglu_fwd_avx512, lowp_cpu_swiglu_bwd_avx512};
static const lowp_cpu_vmath g_vmath2 = {"avx2", lowp_cpu_gelu_avx2, lowp_cpu_expf_avx2,
                                        lowp_cpu_swiglu_fwd_avx2, lowp_cpu_swiglu_bwd_avx2};
#endif

const lowp_cpu_vmath *lowp_cpu_vmath_of(int avx2) {
#if LOWP_HAVE_LIBMVEC
    if (avx2) return cpu_has_avx2() ? &g_vmath2 : NULL;
    return lowp_cpu_has_avx512() ? &g_vmath512 : NULL;
#else
    (void) avx2;
    return NULL;
#endif
}

const lowp_cpu_vmath *lowp_cpu_vmath_pick(void) {
    const lowp_cpu_vmath *v = lowp_cpu_vmath_of(0);
    return v ? v : lowp_cpu_vmath_of(1);
}

int lowp_cpu_threads(int32_t want, int64_t work) {
    int n = lowp_thread_count(want);
    if (work >= 1 && work < n) n = (int) work;
    return n;
}
