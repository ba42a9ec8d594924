/* Backends built against older headers (API versions 1 to 4) still load, and the registry
 * serves their vtables, in their own layout, through the version-5 one (one GEMM slot and one
 * grouped slot, B's layout and the split in lowp_gemm_cfg; grouped quantization in the quantize
 * slot):
 *
 * - version 1 (ends at destroy): lowp_amax is LOWP_ERR_UNSUPPORTED naming the slot; lowp_gemm
 *   with b_layout NK calls its gemm, with KN is LOWP_ERR_UNSUPPORTED naming gemm_kn;
 * - version 2 (ends at amax): amax is called, gemm_kn past its end is never read;
 * - version 3: each (layout, split) reaches the slot that version had for it (gemm, gemm_kn,
 *   grouped_gemm, grouped_gemm_kn, grouped_gemm_wgrad, grouped_gemm_wgrad_kn), with the
 *   backend's own context, and lowp_backend_get hands back a vtable and context that work
 *   together;
 * - version 4: its two GEMM slots see cfg.b_layout and cfg.split; lowp_quantize_grouped calls
 *   its quantize_grouped slot with the grouped copy, and its quantize slot with the rowwise
 *   copy when asked (without quantize_grouped: LOWP_ERR_UNSUPPORTED naming it, nothing called);
 *   its destroy slot is read where version 4 had it;
 * - version 5 (the current one): lowp_quantize_grouped reaches the quantize slot with both
 *   copies;
 * - versions 0 and 6 are refused.
 *
 * The old layouts below are the version-3 and version-4 vtables exactly as lowp/device.h
 * declared them then: what a plugin built against those headers hands the registry. */
#include <string.h>

#include "lowp/lowp.h"
#include "testutil.h"

typedef lowp_status (*gemm_fn)(void *, int32_t, const lowp_qtensor *, const lowp_qtensor *,
                               lowp_tensor *, const lowp_gemm_cfg *);
typedef lowp_status (*grouped_fn)(void *, int32_t, const lowp_qtensor *, const lowp_qtensor *,
                                  const int32_t *, int32_t, lowp_tensor *, const lowp_gemm_cfg *);
typedef struct iface_v3 {
    lowp_status (*device_count)(void *ctx, int32_t *count);
    lowp_status (*caps)(void *ctx, int32_t index, lowp_caps *out);
    lowp_status (*synchronize)(void *ctx, int32_t index);
    lowp_status (*alloc)(void *ctx, int32_t index, size_t nbytes, void **ptr);
    lowp_status (*free)(void *ctx, int32_t index, void *ptr);
    void *memcpy_h2d, *memcpy_d2h, *memcpy_d2d, *cast, *quantize, *quantize_grouped, *dequantize;
    gemm_fn gemm;
    grouped_fn grouped_gemm, grouped_gemm_wgrad;
    void (*destroy)(void *ctx);
    lowp_status (*amax)(void *ctx, int32_t index, const lowp_tensor *x, int32_t scaling, float *out,
                        size_t out_count);
    gemm_fn gemm_kn;
    grouped_fn grouped_gemm_kn, grouped_gemm_wgrad_kn;
} iface_v3;

typedef lowp_status (*quantize_fn)(void *, int32_t, const lowp_tensor *, lowp_qtensor *,
                                   lowp_qtensor *, const lowp_quant_cfg *);
typedef lowp_status (*quantize_grouped_fn)(void *, int32_t, const lowp_tensor *, lowp_qtensor *,
                                           const lowp_quant_cfg *);
typedef struct iface_v4 {
    lowp_status (*device_count)(void *ctx, int32_t *count);
    lowp_status (*caps)(void *ctx, int32_t index, lowp_caps *out);
    lowp_status (*synchronize)(void *ctx, int32_t index);
    lowp_status (*alloc)(void *ctx, int32_t index, size_t nbytes, void **ptr);
    lowp_status (*free)(void *ctx, int32_t index, void *ptr);
    void *memcpy_h2d, *memcpy_d2h, *memcpy_d2d, *cast;
    quantize_fn quantize;
    quantize_grouped_fn quantize_grouped;
    void *dequantize;
    gemm_fn gemm;
    grouped_fn grouped_gemm;
    void (*destroy)(void *ctx);
    void *amax;
} iface_v4;

static int g_ctx_tag;       /* the backends' context: the adapters must pass it, not their own */
static const char *g_last;  /* the last GEMM or amax slot called */
static int g_bad_ctx;       /* calls that got another context */
static lowp_gemm_cfg g_cfg; /* the cfg the last GEMM slot got */

/* A call of `slot` (NULL for the device slots, which every op calls to resolve the device). */
static void record(void *ctx, const char *slot, const lowp_gemm_cfg *cfg) {
    if (slot) g_last = slot;
    if (ctx != &g_ctx_tag) g_bad_ctx++;
    if (cfg) g_cfg = *cfg;
}

static lowp_status f_count(void *ctx, int32_t *count) {
    record(ctx, NULL, NULL);
    *count = 1;
    return LOWP_OK;
}
static lowp_status f_sync(void *ctx, int32_t index) {
    (void) index;
    record(ctx, NULL, NULL);
    return LOWP_OK;
}
static lowp_status f_alloc(void *ctx, int32_t index, size_t nbytes, void **ptr) {
    (void) index, (void) nbytes;
    record(ctx, NULL, NULL);
    *ptr = NULL;
    return LOWP_ERR_OUT_OF_MEMORY;
}
static lowp_status f_free(void *ctx, int32_t index, void *ptr) {
    (void) index, (void) ptr;
    record(ctx, NULL, NULL);
    return LOWP_OK;
}
static lowp_status f_amax(void *ctx, int32_t index, const lowp_tensor *x, int32_t scaling,
                          float *out, size_t n) {
    (void) index, (void) x, (void) scaling, (void) out, (void) n;
    record(ctx, "amax", NULL);
    return LOWP_OK;
}

#define GEMM_SLOT(name)                                                                            \
    static lowp_status f_##name(void *ctx, int32_t index, const lowp_qtensor *a,                   \
                                const lowp_qtensor *b, lowp_tensor *c, const lowp_gemm_cfg *cfg) { \
        (void) index, (void) a, (void) b, (void) c;                                                \
        record(ctx, #name, cfg);                                                                   \
        return LOWP_OK;                                                                            \
    }
#define GROUPED_SLOT(name)                                                                         \
    static lowp_status f_##name(void *ctx, int32_t index, const lowp_qtensor *a,                   \
                                const lowp_qtensor *b, const int32_t *offs, int32_t groups,        \
                                lowp_tensor *c, const lowp_gemm_cfg *cfg) {                        \
        (void) index, (void) a, (void) b, (void) offs, (void) groups, (void) c;                    \
        record(ctx, #name, cfg);                                                                   \
        return LOWP_OK;                                                                            \
    }
GEMM_SLOT(gemm)
GEMM_SLOT(gemm_kn)
GROUPED_SLOT(grouped_gemm)
GROUPED_SLOT(grouped_gemm_kn)
GROUPED_SLOT(grouped_gemm_wgrad)
GROUPED_SLOT(grouped_gemm_wgrad_kn)

/* Every slot of the old layout filled (those past a version's end too: they must be ignored). */
static iface_v3 full_v3(void) {
    iface_v3 f;
    memset(&f, 0, sizeof f);
    f.device_count = f_count, f.synchronize = f_sync, f.alloc = f_alloc, f.free = f_free;
    f.gemm = f_gemm, f.grouped_gemm = f_grouped_gemm, f.grouped_gemm_wgrad = f_grouped_gemm_wgrad;
    f.amax = f_amax;
    f.gemm_kn = f_gemm_kn, f.grouped_gemm_kn = f_grouped_gemm_kn;
    f.grouped_gemm_wgrad_kn = f_grouped_gemm_wgrad_kn;
    return f;
}

static int32_t register_old(uint32_t version, const char *name, const iface_v3 *f) {
    /* the struct a plugin of that version fills: its vtable pointer is its own layout */
    lowp_backend_reg reg = {version, sizeof reg, name,
                            (const lowp_backend_iface *) (const void *) f, &g_ctx_tag};
    int32_t type = -1;
    CHECK_OK(lowp_backend_register(&reg, &type));
    return type;
}

/* Operands on device `type` (the fake slots read nothing). */
static float g_x[64];
typedef struct ops {
    lowp_qtensor a, b_nk, b_kn, dyt, xt, x;
    lowp_tensor c, cw;
} ops;
static ops ops_on(int32_t type) {
    const lowp_device d = {type, 0};
    ops o = {
        .a = {LOWP_FORMAT_F32, LOWP_SCALING_NONE, 4, 8, g_x, NULL, d, NULL, 0},
        .b_nk = {LOWP_FORMAT_F32, LOWP_SCALING_NONE, 2, 8, g_x, NULL, d, NULL, 0},
        .b_kn = {LOWP_FORMAT_F32, LOWP_SCALING_NONE, 8, 2, g_x, NULL, d, NULL, 0},
        .dyt = {LOWP_FORMAT_F32, LOWP_SCALING_NONE, 2, 4, g_x, NULL, d, NULL, 0}, /* [N, M] */
        .xt = {LOWP_FORMAT_F32, LOWP_SCALING_NONE, 3, 4, g_x, NULL, d, NULL, 0},  /* [K, M] */
        .x = {LOWP_FORMAT_F32, LOWP_SCALING_NONE, 4, 3, g_x, NULL, d, NULL, 0},   /* [M, K] */
    };
    static float c[64], cw[64];
    o.c = (lowp_tensor){LOWP_FORMAT_F32, 4, 2, c, d};
    o.cw = (lowp_tensor){LOWP_FORMAT_F32, 2 * 2, 3, cw, d}; /* [G * N, K], G = 2 */
    return o;
}

static lowp_gemm_cfg cfg_of(int32_t b_layout, int32_t split) {
    lowp_gemm_cfg cfg;
    lowp_gemm_cfg_init(&cfg);
    cfg.b_layout = b_layout;
    cfg.split = split;
    return cfg;
}

/* The six GEMM forms on `type`; want[i]: the old slot form i must reach (NULL: refused, the
 * message naming `missing[i]`). Forms: gemm NK, gemm KN, split-M NK, split-M KN, split-K NK,
 * split-K KN. */
static void check_forms(int32_t type, const char *const want[6], const char *const missing[6]) {
    ops o = ops_on(type);
    const int32_t offs[2] = {1, 4};
    const lowp_qtensor bs_nk[2] = {o.b_nk, o.b_nk}, bs_kn[2] = {o.b_kn, o.b_kn};
    for (int i = 0; i < 6; i++) {
        const int kn = i % 2, form = i / 2;
        const lowp_gemm_cfg cfg = cfg_of(kn ? LOWP_LAYOUT_KN : LOWP_LAYOUT_NK,
                                         form == 2 ? LOWP_GROUPED_SPLIT_K : LOWP_GROUPED_SPLIT_M);
        g_last = NULL;
        g_bad_ctx = 0;
        lowp_clear_error();
        lowp_status st;
        if (form == 0)
            st = lowp_gemm(&o.a, kn ? &o.b_kn : &o.b_nk, &o.c, &cfg);
        else if (form == 1)
            st = lowp_grouped_gemm(&o.a, kn ? bs_kn : bs_nk, offs, 2, &o.c, &cfg);
        else
            st = lowp_grouped_gemm(&o.dyt, kn ? &o.x : &o.xt, offs, 2, &o.cw, &cfg);
        if (want[i]) {
            CHECKF(st == LOWP_OK && g_last && strcmp(g_last, want[i]) == 0,
                   "form %d: %s, slot %s called, want %s (%s)", i, lowp_status_str(st),
                   g_last ? g_last : "none", want[i], lowp_last_error());
            CHECKF(g_bad_ctx == 0, "form %d: the slot got another context than the backend's", i);
        } else {
            CHECKF(st == LOWP_ERR_UNSUPPORTED && !g_last &&
                       strstr(lowp_last_error(), missing[i]) != NULL,
                   "form %d: %s, slot %s called; message \"%s\" should name %s", i,
                   lowp_status_str(st), g_last ? g_last : "none", lowp_last_error(), missing[i]);
        }
    }
}

static void test_v1(void) {
    iface_v3 f = full_v3(); /* amax and the _kn slots lie past a version-1 vtable */
    const int32_t type = register_old(1u, "apiv1", &f);
    float x[8] = {0}, out[2];
    lowp_tensor xt = {LOWP_FORMAT_F32, 2, 4, x, {type, 0}};
    g_last = NULL;
    CHECK_FAIL(lowp_amax(&xt, LOWP_SCALING_ROW, out, 2), LOWP_ERR_UNSUPPORTED,
               "backend \"apiv1\" has no amax kernel");
    CHECK(g_last == NULL);
    const char *want[6] = {"gemm", NULL, "grouped_gemm", NULL, "grouped_gemm_wgrad", NULL};
    const char *missing[6] = {"", "\"apiv1\" (API version 1) has no gemm_kn kernel",
                              "", "has no grouped_gemm_kn kernel",
                              "", "has no grouped_gemm_wgrad_kn kernel"};
    check_forms(type, want, missing);
}

static void test_v2(void) {
    iface_v3 f = full_v3(); /* the _kn slots lie past a version-2 vtable */
    const int32_t type = register_old(2u, "apiv2", &f);
    float x[8] = {0}, out[2];
    lowp_tensor xt = {LOWP_FORMAT_F32, 2, 4, x, {type, 0}};
    g_last = NULL;
    CHECK_OK(lowp_amax(&xt, LOWP_SCALING_ROW, out, 2));
    CHECK(g_last && strcmp(g_last, "amax") == 0);
    const char *want[6] = {"gemm", NULL, "grouped_gemm", NULL, "grouped_gemm_wgrad", NULL};
    const char *missing[6] = {
        "", "lowp_gemm: backend \"apiv2\" (API version 2) has no gemm_kn",
        "", "lowp_grouped_gemm: backend \"apiv2\" (API version 2) has no grouped_gemm_kn",
        "", "has no grouped_gemm_wgrad_kn kernel"};
    check_forms(type, want, missing);
    /* a version-2 vtable without grouped slots: the ops layer names the current slot */
    f.grouped_gemm = f.grouped_gemm_wgrad = NULL;
    const int32_t t2 = register_old(2u, "apiv2nogroup", &f);
    ops o = ops_on(t2);
    const int32_t offs[2] = {1, 4};
    const lowp_gemm_cfg split_k = cfg_of(LOWP_LAYOUT_NK, LOWP_GROUPED_SPLIT_K);
    CHECK_FAIL(lowp_grouped_gemm(&o.dyt, &o.xt, offs, 2, &o.cw, &split_k), LOWP_ERR_UNSUPPORTED,
               "backend \"apiv2nogroup\" has no grouped_gemm kernel");
}

static void test_v3(void) {
    iface_v3 f = full_v3();
    const int32_t type = register_old(3u, "apiv3", &f);
    const char *want[6] = {"gemm",
                           "gemm_kn",
                           "grouped_gemm",
                           "grouped_gemm_kn",
                           "grouped_gemm_wgrad",
                           "grouped_gemm_wgrad_kn"};
    const char *missing[6] = {0};
    check_forms(type, want, missing);
    /* the vtable and context lowp_backend_get gives reach the backend's own, with its ctx */
    const lowp_backend_iface *iface;
    void *ctx;
    CHECK_OK(lowp_backend_get(type, &iface, &ctx));
    int32_t n = -1;
    g_bad_ctx = 0;
    CHECK(iface->device_count(ctx, &n) == LOWP_OK && n == 1 && g_bad_ctx == 0);
    CHECK(iface->caps == NULL && iface->cast == NULL); /* absent slots stay absent */
    /* the deprecated twins reach the same slots */
    ops o = ops_on(type);
    const int32_t offs[2] = {1, 4};
    g_last = NULL;
    CHECK_OK(lowp_grouped_gemm_wgrad_kn(&o.dyt, &o.x, offs, 2, &o.cw, NULL));
    CHECK(g_last && strcmp(g_last, "grouped_gemm_wgrad_kn") == 0);
}

/* The quantize slots record what they got: "quantize(row)", "quantize(row,col)",
 * "quantize(row,grouped col)", "quantize_grouped". */
static char g_quant_calls[128];
static void note(void *ctx, const char *what) {
    record(ctx, NULL, NULL);
    if (g_quant_calls[0]) strcat(g_quant_calls, " ");
    strcat(g_quant_calls, what);
}
static lowp_status f_quantize(void *ctx, int32_t index, const lowp_tensor *x, lowp_qtensor *row,
                              lowp_qtensor *col, const lowp_quant_cfg *cfg) {
    (void) index, (void) x, (void) cfg;
    note(ctx, !col              ? "quantize(row)"
              : !row            ? (col->group_offs ? "quantize(grouped col)" : "quantize(col)")
              : col->group_offs ? "quantize(row,grouped col)"
                                : "quantize(row,col)");
    return LOWP_OK;
}
static lowp_status f_quantize_grouped(void *ctx, int32_t index, const lowp_tensor *x,
                                      lowp_qtensor *col, const lowp_quant_cfg *cfg) {
    (void) index, (void) x, (void) cfg;
    note(ctx, col->group_offs ? "quantize_grouped" : "quantize_grouped without offs");
    return LOWP_OK;
}
static int g_destroyed;
static void f_destroy(void *ctx) {
    if (ctx == &g_ctx_tag) g_destroyed++;
}

/* lowp_quantize_grouped on device `type`, with the rowwise copy when `with_row`: the calls the
 * backend's quantize slots saw ("" when none), and the status. */
static lowp_status quantize_grouped_on(int32_t type, int with_row) {
    const lowp_device d = {type, 0};
    static uint8_t codes[2][128], scales[2][64];
    static const int32_t offs[2] = {1, 4};
    lowp_tensor x = {LOWP_FORMAT_F32, 4, 32, g_x, d}; /* [M, K], M = 4 tokens */
    lowp_qtensor row = {
        LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 4, 32, codes[0], scales[0], d, NULL, 0};
    lowp_qtensor col = {
        LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 32, 4, codes[1], scales[1], d, offs, 2};
    g_quant_calls[0] = 0;
    g_bad_ctx = 0;
    lowp_clear_error();
    return lowp_quantize_grouped(&x, with_row ? &row : NULL, &col, NULL);
}

static void test_v4(void) {
    iface_v4 f = {0};
    f.device_count = f_count, f.synchronize = f_sync, f.alloc = f_alloc, f.free = f_free;
    f.gemm = f_gemm, f.grouped_gemm = f_grouped_gemm;
    f.quantize = f_quantize, f.quantize_grouped = f_quantize_grouped;
    lowp_backend_reg reg = {4u, sizeof reg, "apiv4", (const lowp_backend_iface *) (const void *) &f,
                            &g_ctx_tag};
    int32_t type = -1;
    CHECK_OK(lowp_backend_register(&reg, &type));
    const char *want[6] = {"gemm",         "gemm",         "grouped_gemm",
                           "grouped_gemm", "grouped_gemm", "grouped_gemm"};
    const char *missing[6] = {0};
    check_forms(type, want, missing); /* the last call: split-K, KN */
    CHECK(g_cfg.b_layout == LOWP_LAYOUT_KN && g_cfg.split == LOWP_GROUPED_SPLIT_K);
    ops o = ops_on(type);
    CHECK_OK(lowp_gemm_kn(&o.a, &o.b_kn, &o.c, NULL)); /* a twin sets the layout */
    CHECK(g_cfg.b_layout == LOWP_LAYOUT_KN && g_cfg.split == LOWP_GROUPED_SPLIT_M);
    /* grouped quantization: the grouped copy to quantize_grouped, the rowwise one to quantize */
    lowp_status st = quantize_grouped_on(type, 1);
    CHECKF(st == LOWP_OK && strcmp(g_quant_calls, "quantize(row) quantize_grouped") == 0,
           "v4 grouped with row: %s, calls \"%s\" (%s)", lowp_status_str(st), g_quant_calls,
           lowp_last_error());
    st = quantize_grouped_on(type, 0);
    CHECKF(st == LOWP_OK && strcmp(g_quant_calls, "quantize_grouped") == 0 && g_bad_ctx == 0,
           "v4 grouped: %s, calls \"%s\"", lowp_status_str(st), g_quant_calls);
    /* without a quantize_grouped slot: refused, naming it, nothing called */
    f.quantize_grouped = NULL;
    reg.name = "apiv4noqg";
    CHECK_OK(lowp_backend_register(&reg, &type));
    st = quantize_grouped_on(type, 1);
    CHECKF(st == LOWP_ERR_UNSUPPORTED && g_quant_calls[0] == 0 &&
               strstr(lowp_last_error(), "(API version 4) has no quantize_grouped kernel"),
           "v4 without quantize_grouped: %s, calls \"%s\" (%s)", lowp_status_str(st), g_quant_calls,
           lowp_last_error());
    /* destroy, read where version 4 had it, served with the backend's context */
    f.destroy = f_destroy;
    reg.name = "apiv4destroy";
    CHECK_OK(lowp_backend_register(&reg, &type));
    const lowp_backend_iface *iface;
    void *ctx;
    CHECK_OK(lowp_backend_get(type, &iface, &ctx));
    g_destroyed = 0;
    CHECK(iface->destroy != NULL);
    if (iface->destroy) iface->destroy(ctx);
    CHECKF(g_destroyed == 1, "v4 destroy reached the backend %d times", g_destroyed);
}

static void test_v5(void) {
    lowp_backend_iface f = {0};
    f.device_count = f_count, f.synchronize = f_sync, f.alloc = f_alloc, f.free = f_free;
    f.gemm = f_gemm, f.grouped_gemm = f_grouped_gemm, f.quantize = f_quantize;
    CHECK(LOWP_BACKEND_API_VERSION == 5u);
    lowp_backend_reg reg = {LOWP_BACKEND_API_VERSION, sizeof reg, "apiv5", &f, &g_ctx_tag};
    int32_t type = -1;
    CHECK_OK(lowp_backend_register(&reg, &type));
    const char *want[6] = {"gemm",         "gemm",         "grouped_gemm",
                           "grouped_gemm", "grouped_gemm", "grouped_gemm"};
    const char *missing[6] = {0};
    check_forms(type, want, missing);
    lowp_status st = quantize_grouped_on(type, 1);
    CHECKF(st == LOWP_OK && strcmp(g_quant_calls, "quantize(row,grouped col)") == 0,
           "v5 grouped with row: %s, calls \"%s\" (%s)", lowp_status_str(st), g_quant_calls,
           lowp_last_error());
    st = quantize_grouped_on(type, 0);
    CHECKF(st == LOWP_OK && strcmp(g_quant_calls, "quantize(grouped col)") == 0,
           "v5 grouped: %s, calls \"%s\"", lowp_status_str(st), g_quant_calls);

    lowp_backend_reg reg0 = {0u, sizeof reg0, "apiv0", &f, NULL};
    CHECK_FAIL(lowp_backend_register(&reg0, NULL), LOWP_ERR_VERSION, "reg.api_version (0)");
    lowp_backend_reg reg6 = {LOWP_BACKEND_API_VERSION + 1, sizeof reg6, "apiv6", &f, NULL};
    CHECK_FAIL(lowp_backend_register(&reg6, NULL), LOWP_ERR_VERSION, "reg.api_version (6)");
}

int main(void) {
    test_v1();
    test_v2();
    test_v3();
    test_v4();
    test_v5();
    return testutil_finish();
}
