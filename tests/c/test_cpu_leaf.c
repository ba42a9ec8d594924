/* The CPU backend is a leaf that links on its own: this program links the static library
 * lowp_cpu (and lowp_core under it), not liblowp, so a call from src/cpu/ into a higher layer
 * (the registry, the ops, the models) makes it fail to link. It fills the backend's
 * registration and runs it through its vtable, as the registry does: the rowwise and
 * columnwise MXFP8 copies of a tensor with zeros, subnormals, maxima, NaN and Inf, from one
 * read on the fast kernels (AUTO) and on the scalar reference, byte for byte, and the grouped
 * copy with the rowwise one, against the reference's two separate calls. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "lowp/quant.h"
#include "testutil.h"

enum { M = 70, K = 96 };

static lowp_quant_cfg cfg_of(lowp_kernel_path path) {
    lowp_quant_cfg c;
    memset(&c, 0, sizeof c); /* lowp_quant_cfg_init is the ops layer's: not linked here */
    c.scale_mode = LOWP_SCALE_MODE_DEFAULT;
    c.pow2_scales = -1;
    c.path = path;
    return c;
}

/* A qtensor [r, c] of x's format and kind with buffers of `fill` (its sizes in n[2]). */
static lowp_qtensor q_new(int64_t r, int64_t c, const int32_t *offs, int32_t groups, int fill,
                          size_t n[2]) {
    lowp_qtensor q = {
        LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, r, c, NULL, NULL, LOWP_DEVICE_HOST, offs, groups};
    CHECK_OK(lowp_qtensor_nbytes(&q, &n[0], &n[1]));
    q.data = malloc(n[0] + 1);
    q.scales = malloc(n[1] + 1);
    memset(q.data, fill, n[0] + 1);
    memset(q.scales, fill, n[1] + 1);
    return q;
}

static void same(const char *what, const lowp_qtensor *a, const lowp_qtensor *b,
                 const size_t n[2]) {
    CHECKF(memcmp(a->data, b->data, n[0]) == 0, "%s: codes differ", what);
    CHECKF(memcmp(a->scales, b->scales, n[1]) == 0, "%s: scales differ", what);
}

static void q_free(lowp_qtensor *q) {
    free(q->data);
    free(q->scales);
}

int main(void) {
    lowp_backend_reg reg;
    memset(&reg, 0, sizeof reg);
    CHECK_OK(lowp_cpu_backend_entry(&reg));
    CHECK(reg.api_version == LOWP_BACKEND_API_VERSION && reg.iface && reg.iface->quantize);
    if (!reg.iface || !reg.iface->quantize) return testutil_finish();
    static float xs[M * K];
    for (int i = 0; i < M * K; i++) xs[i] = (float) ((i * 37) % 101 - 50) * 0.37f;
    xs[5] = 0.0f, xs[6] = -0.0f, xs[7] = 1e-40f, xs[8] = 448.0f, xs[9] = 3.0e38f;
    xs[200] = NAN, xs[300] = INFINITY, xs[301] = -INFINITY;
    lowp_tensor x = {LOWP_FORMAT_F32, M, K, xs, LOWP_DEVICE_HOST};
    static const int32_t offs[3] = {17, 17, M};
    size_t nr[2], nc[2], ng[2];
    lowp_qtensor r[2], c[2], g[3], rg[3];
    for (int p = 0; p < 2; p++) { /* 0: reference, 1: AUTO */
        const lowp_quant_cfg cfg = cfg_of(p ? LOWP_KERNEL_PATH_AUTO : LOWP_KERNEL_PATH_REFERENCE);
        r[p] = q_new(M, K, NULL, 0, 0x11 * (p + 1), nr);
        c[p] = q_new(K, M, NULL, 0, 0x22 * (p + 1), nc);
        CHECK_OK(reg.iface->quantize(reg.ctx, 0, &x, &r[p], &c[p], &cfg));
    }
    same("rowwise, AUTO against the reference", &r[0], &r[1], nr);
    same("columnwise, AUTO against the reference", &c[0], &c[1], nc);
    for (int p = 0; p < 3; p++) { /* 0: two reference calls; 1, 2: one call AUTO, reference */
        const lowp_quant_cfg cfg =
            cfg_of(p == 1 ? LOWP_KERNEL_PATH_AUTO : LOWP_KERNEL_PATH_REFERENCE);
        rg[p] = q_new(M, K, NULL, 0, 0x33 * (p + 1), nr);
        g[p] = q_new(K, M, offs, 3, 0x44 * (p + 1), ng);
        if (p == 0) {
            CHECK_OK(reg.iface->quantize(reg.ctx, 0, &x, &rg[p], NULL, &cfg));
            CHECK_OK(reg.iface->quantize(reg.ctx, 0, &x, NULL, &g[p], &cfg));
        } else {
            CHECK_OK(reg.iface->quantize(reg.ctx, 0, &x, &rg[p], &g[p], &cfg));
        }
    }
    for (int p = 1; p < 3; p++) {
        same(p == 1 ? "grouped's rowwise copy, AUTO" : "grouped's rowwise copy, reference", &rg[0],
             &rg[p], nr);
        same(p == 1 ? "grouped copy, AUTO" : "grouped copy, reference", &g[0], &g[p], ng);
    }
    same("grouped call's rowwise copy against the ungrouped one", &r[0], &rg[0], nr);
    for (int p = 0; p < 3; p++) {
        if (p < 2) q_free(&r[p]), q_free(&c[p]);
        q_free(&rg[p]);
        q_free(&g[p]);
    }
    return testutil_finish();
}
