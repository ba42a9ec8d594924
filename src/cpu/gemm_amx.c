/* AMX BF16 GEMM kernel: the blocked BF16 driver (gemm_blk.c) on a micro-kernel of 2x2 tiles
 * (32x32 of C per step: two A tiles of 16 rows x 32 K, two VNNI B tiles of 16 K-pairs x 16
 * columns, four TDPBF16PS per 32 K). The driver's layouts are the tiles themselves, so every
 * tile load is a contiguous 1 KiB.
 *
 * Built with LOWP_AMX_EMULATE (only by tests/c/test_gemm_fast.c, which includes this file), the
 * tile instructions become a scalar model of their documented semantics (BF16 denormal inputs
 * read as zero, binary32 denormal results flushed) and the entry points get an _emu suffix,
 * so the kernel's layouts and tile configuration are tested on machines without AMX. The model
 * checks layouts, not bits: on AMX hardware (a Xeon, 2026-12) TDPBF16PS does not sum as the
 * documented pair of FMAs per K pair; one pair gives C + RNE(a0 b0 + a1 b1), and with more
 * pairs some outputs differ by an ulp from both that sequence and the exactly rounded sum
 * (docs/numerics.md section 6). Both the hardware and the model are held to the reference with
 * the GEMM tolerance of that section. */
#include "gemm_blk.h"

#ifndef LOWP_AMX_EMULATE
#include <immintrin.h>

#include "cpu.h"
#define AMX_API
#define AMX_NAME(x) x
#else
#include <float.h>
#include <math.h>
#define AMX_API     static
#define AMX_NAME(x) x##_emu
#endif

/* The 64-byte tile configuration (palette 1). It lives in thread-local static memory, not on
 * the stack: GCC 12 may drop the stores to a stack struct whose only reader is LDTILECFG. */
typedef struct amx_cfg {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

static _Thread_local amx_cfg g_cfg __attribute__((aligned(64)));

#ifndef LOWP_AMX_EMULATE
#define TILE_LOADCFG(c)     _tile_loadconfig(c)
#define TILE_RELEASE()      _tile_release()
#define TILE_ZERO(t)        _tile_zero(t)
#define TILE_LOAD(t, p, s)  _tile_loadd(t, p, s)
#define TILE_STORE(t, p, s) _tile_stored(t, p, s)
#define TILE_DP(c, a, b)    _tile_dpbf16ps(c, a, b)
#else
/* ---- the scalar model ---- */
static _Thread_local struct {
    amx_cfg cfg;
    uint8_t t[8][16][64];
} g_emu;

static void emu_loadcfg(const amx_cfg *c) {
    g_emu.cfg = *c;
    memset(g_emu.t, 0, sizeof g_emu.t); /* LDTILECFG zeroes every tile */
}
static void emu_release(void) {
    memset(&g_emu, 0, sizeof g_emu);
}
static void emu_zero(int t) {
    memset(g_emu.t[t], 0, sizeof g_emu.t[t]);
}
static void emu_load(int t, const void *p, size_t stride) {
    emu_zero(t);
    for (int r = 0; r < g_emu.cfg.rows[t]; r++)
        memcpy(g_emu.t[t][r], (const uint8_t *) p + (size_t) r * stride, g_emu.cfg.colsb[t]);
}
static void emu_store(int t, void *p, size_t stride) {
    for (int r = 0; r < g_emu.cfg.rows[t]; r++)
        memcpy((uint8_t *) p + (size_t) r * stride, g_emu.t[t][r], g_emu.cfg.colsb[t]);
}
static float emu_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    float x = lowp_u2f((uint32_t) h << 16);
    return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; /* denormal inputs read as zero */
}
static float emu_ftz(float x) {
    return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x;
}
static void emu_dp(int c, int a, int b) {
    const int M = g_emu.cfg.rows[c], N = g_emu.cfg.colsb[c] / 4, K = g_emu.cfg.colsb[a] / 4;
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) {
                float acc;
                memcpy(&acc, &g_emu.t[c][m][4 * n], 4);
                for (int e = 0; e < 2; e++)
                    acc = emu_ftz(fmaf(emu_bf16(&g_emu.t[a][m][4 * k + 2 * e]),
                                       emu_bf16(&g_emu.t[b][k][4 * n + 2 * e]), acc));
                memcpy(&g_emu.t[c][m][4 * n], &acc, 4);
            }
}
#define TILE_LOADCFG(c)     emu_loadcfg(c)
#define TILE_RELEASE()      emu_release()
#define TILE_ZERO(t)        emu_zero(t)
#define TILE_LOAD(t, p, s)  emu_load(t, p, s)
#define TILE_STORE(t, p, s) emu_store(t, p, s)
#define TILE_DP(c, a, b)    emu_dp(c, a, b)
#endif

/* Tiles 0-3: C (rows 0-15 x cols 0-15, 0-15 x 16-31, 16-31 x 0-15, 16-31 x 16-31);
 * 4-5: A rows 0-15 and 16-31; 6-7: B columns 0-15 and 16-31. All 16 rows x 64 bytes:
 * partial strips and panels are zero-padded by the driver, so one configuration serves. */
static void amx_begin(void) {
    memset(&g_cfg, 0, sizeof g_cfg);
    g_cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        g_cfg.rows[t] = 16;
        g_cfg.colsb[t] = 64;
    }
    TILE_LOADCFG(&g_cfg);
}

/* P (32 x 32, row stride 32 floats) = strip . panel over nkt K tiles. The whole strip is
 * computed (r0 = 0, mr = 32: the kernel's row granularity). */
static void micro_amx(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, int mr, float *p) {
    (void) r0;
    (void) mr;
    TILE_ZERO(0);
    TILE_ZERO(1);
    TILE_ZERO(2);
    TILE_ZERO(3);
    for (int64_t kt = 0; kt < nkt; kt++) {
        const uint16_t *ak = a + kt * LOWP_BLK_TILE_U16, *bk = b + kt * LOWP_BLK_TILE_U16;
        TILE_LOAD(4, ak, 64);
        TILE_LOAD(6, bk, 64);
        TILE_LOAD(5, ak + 512, 64);
        TILE_LOAD(7, bk + 512, 64);
        TILE_DP(0, 4, 6);
        TILE_DP(1, 4, 7);
        TILE_DP(2, 5, 6);
        TILE_DP(3, 5, 7);
    }
    TILE_STORE(0, p, 128);
    TILE_STORE(1, p + 16, 128);
    TILE_STORE(2, p + 16 * 32, 128);
    TILE_STORE(3, p + 16 * 32 + 16, 128);
}

/* 1 MiB of packed B per column block: half the L2 of the cores that have AMX. Measured on AMX
 * hardware (docs/bench-log/train-step.md, fourteenth session): 512 KiB was 5-33% slower at K = 384
 * to 4096 and 4 MiB up to 25% slower at K >= 2048; 2 MiB, and a minimum block width of 256 columns,
 * were within the noise; 512 columns was mixed (-23% to +3%). Up to 1.5 MiB in one block when that
 * holds all the job's columns (whole_n_bytes): the K = 2048 weight gradients with N = 384 then
 * decode A once, not twice (MXFP8 384x384x2048 and 512x384x2048 1.02-1.14x on one
 * thread, 1.07-1.11x on two); 2 MiB made the 512-column pieces of 2048^3 on two threads half as
 * fast (the block and the strips no longer fit the 2 MiB L2). */
static const lowp_gemm_blk_kernel k_amx = {micro_amx, lowp_gemm_micro_f32x, 32, (size_t) 1 << 20,
                                           0,         (size_t) 3 << 19};

AMX_API int AMX_NAME(lowp_cpu_gemm_amx_supports)(const lowp_gemm_job *j) {
#ifndef LOWP_AMX_EMULATE
    const uint32_t need = LOWP_CAP_AVX512F | LOWP_CAP_AVX512BW | LOWP_CAP_AVX512VL |
                          LOWP_CAP_AMX_TILE | LOWP_CAP_AMX_BF16 | LOWP_CAP_AMX_PERMITTED;
    if ((lowp_cpu_caps()->flags & need) != need) return 0;
#endif
    return lowp_gemm_blk_supports(j);
}

AMX_API size_t AMX_NAME(lowp_cpu_gemm_amx_ws_floats)(const lowp_gemm_job *j) {
    return lowp_gemm_blk_ws_floats(j, &k_amx);
}

AMX_API void AMX_NAME(lowp_cpu_gemm_amx)(const lowp_gemm_job *j) {
    /* Configured per job: another library on this thread may have loaded its own. */
    amx_begin();
    lowp_gemm_blk_run(j, &k_amx);
    TILE_RELEASE();
}
