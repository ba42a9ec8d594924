/* Tests of the extra-state checkpoint (checkpoint.h, src/train/extra_state.c):
 *  - the layout, field by field, read back with the test's own little-endian reader and its
 *    own (table-driven) CRC-32;
 *  - bit-exact round trips (NaN and Inf amaxes included), per state and per parameter;
 *  - the committed version-1 fixture (tests/fixtures/extra_state_v1.bin, written by
 *    tests/fixtures/make_extra_state_fixture.py from the spec alone): every value, and a
 *    re-save that reproduces it byte for byte;
 *  - history-length changes (pad and truncate, keeping row 0 and the most recent rows);
 *  - stateless parameters (the empty blob), save/load argument errors;
 *  - targeted corruptions (each field, with a valid CRC) and a fuzz of thousands of random
 *    truncations, bit flips (with and without a repaired CRC) and garbage headers: never a
 *    crash (ASan in the sanitizer build), never a change of state on error;
 *  - device correctness on the asynchronous testdev plugin: a save synchronizes the state's
 *    device (and no other) and returns the finished values; the same read after synchronizing
 *    the other device sees stale data; a load leaves nothing queued on the module's device. */
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "lowp/lowp.h"
#include "testdev_hooks.h"
#include "testutil.h"
#include "train/train_internal.h"

static const lowp_format k_hybrid[LOWP_ROLE_COUNT] = {LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3,
                                                      LOWP_FORMAT_E5M2};

/* The test's own reader and CRC (a 256-entry table, unlike the library's bitwise loop). */
static uint32_t rd32(const unsigned char *p) {
    return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}
static void wr32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char) (v >> (8 * i));
}
static uint32_t g_crc_table[256];
static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        g_crc_table[n] = c;
    }
}
static uint32_t crc32_table(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = g_crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}
static void fix_crc(unsigned char *b, size_t len) {
    wr32(b + len - 4, crc32_table(b, len - 4));
}

static size_t blob_len(int32_t L) {
    return 16 + 16 + 12 + 12 * ((size_t) L + 1) + 4;
}

/* ---- whole-state snapshots --------------------------------------------------------------- */

typedef struct snap {
    lowp_fp8_state copy;
    float *image; /* the host mirror, scale slots included */
    float *dev;   /* the device image (host-readable for the CPU and testdev) */
} snap;

static size_t image_n(const lowp_fp8_state *st) {
    return 3 * ((size_t) st->history_len + 1);
}

static void snap_take(snap *s, const lowp_fp8_state *st) {
    s->copy = *st;
    size_t n = image_n(st) * sizeof(float);
    s->image = malloc(n);
    s->dev = malloc(n);
    memcpy(s->image, st->host_buf, n);
    memcpy(s->dev, st->dev_buf, n);
}
static void snap_free(snap *s) {
    free(s->image);
    free(s->dev);
}
static int snap_same(const snap *s, const lowp_fp8_state *st) {
    const lowp_fp8_state *a = &s->copy;
    if (a->device.type != st->device.type || a->device.index != st->device.index ||
        a->history_len != st->history_len || a->host_buf != st->host_buf ||
        a->dev_buf != st->dev_buf)
        return 0;
    for (int r = 0; r < 3; r++) {
        const lowp_delayed_state *x = &a->roles[r], *y = &st->roles[r];
        if (x->history != y->history || f2u(x->scale) != f2u(y->scale) ||
            f2u(x->scale_inv) != f2u(y->scale_inv) || x->cfg.format != y->cfg.format ||
            x->cfg.history_len != y->cfg.history_len || f2u(x->cfg.margin) != f2u(y->cfg.margin) ||
            x->cfg.algo != y->cfg.algo)
            return 0;
    }
    size_t n = image_n(st) * sizeof(float);
    return memcmp(s->image, st->host_buf, n) == 0 && memcmp(s->dev, st->dev_buf, n) == 0;
}

/* Run `steps` steps of random amaxes (a NaN and an Inf among them when `odd`). */
static void run_steps(lowp_fp8_state *st, int steps, int odd) {
    for (int s = 0; s < steps; s++) {
        for (int r = 0; r < 3; r++) {
            if (xorshift32() % 8 == 0) continue; /* unused this step */
            float a =
                ldexpf((float) (xorshift32() % 1000 + 1) / 997.0f, (int) (xorshift32() % 30) - 15);
            lowp_fp8_state_record(st, (lowp_role) r, a);
        }
        lowp_fp8_state_update(st, NULL);
    }
    if (odd) {
        lowp_fp8_state_record(st, LOWP_ROLE_WEIGHT, u2f(0x7FC00123u)); /* a NaN payload */
        lowp_fp8_state_update(st, NULL);
        lowp_fp8_state_record(st, LOWP_ROLE_GRAD_OUTPUT, INFINITY);
        lowp_fp8_state_record(st, LOWP_ROLE_INPUT, 0.75f); /* staged, not updated */
    }
}

static unsigned char *save_new(lowp_fp8_state *st, size_t *len) {
    size_t n = 0;
    CHECK_OK(lowp_fp8_state_extra_state_size(st, &n));
    unsigned char *b = malloc(n);
    CHECK_OK(lowp_fp8_state_extra_state_save(st, b, n, len));
    CHECK(*len == n);
    return b;
}

/* ---- layout and round trips -------------------------------------------------------------- */

static void test_layout_and_round_trip(void) {
    const unsigned char kat[] = "123456789";
    CHECK(crc32_table(kat, 9) == 0xCBF43926u); /* the test's CRC is zlib's */

    lowp_delayed_cfg c = delayed_cfg(16, 1.5f, LOWP_AMAX_ALGO_MOST_RECENT);
    lowp_fp8_state a, b;
    CHECK_OK(lowp_fp8_state_init(&a, &c, k_hybrid, LOWP_DEVICE_HOST));
    CHECK_OK(lowp_fp8_state_init(&b, &c, k_hybrid, LOWP_DEVICE_HOST));
    run_steps(&a, 40, 1);
    size_t len = 0;
    unsigned char *blob = save_new(&a, &len);
    CHECK(len == blob_len(16));

    /* Field by field, as checkpoint.h lays them out. */
    CHECK(memcmp(blob, "LOWPXST1", 8) == 0);
    CHECK(rd32(blob + 8) == 1);
    CHECK(rd32(blob + 12) == len - 20);
    CHECK(rd32(blob + 16) == 3);
    CHECK(rd32(blob + 20) == 16);
    CHECK(rd32(blob + 24) == f2u(1.5f));
    CHECK(rd32(blob + 28) == 1);
    CHECK(rd32(blob + 32) == 3 && rd32(blob + 36) == 3 && rd32(blob + 40) == 4);
    int fields_ok = 1;
    for (int r = 0; r < 3; r++) {
        const unsigned char *q = blob + 44 + (size_t) r * 17 * 4;
        for (int i = 0; i < 16; i++) fields_ok &= rd32(q + 4 * i) == f2u(a.roles[r].history[i]);
        fields_ok &= rd32(q + 64) == f2u(a.roles[r].scale);
    }
    CHECK(fields_ok);
    CHECK(rd32(blob + len - 4) == crc32_table(blob, len - 4));
    CHECK(isnan(a.roles[1].history[15]) && f2u(a.roles[1].history[15]) == 0x7FC00123u);
    CHECK(isinf(a.roles[2].history[0]) && a.roles[0].history[0] == 0.75f);

    /* Into a fresh state: everything equal, bit for bit; saving again gives the same bytes. */
    CHECK_OK(lowp_fp8_state_extra_state_load(&b, blob, len));
    int same = 1;
    for (int r = 0; r < 3; r++) {
        same &= memcmp(a.roles[r].history, b.roles[r].history, 16 * sizeof(float)) == 0;
        same &= f2u(a.roles[r].scale) == f2u(b.roles[r].scale);
        same &= f2u(a.roles[r].scale_inv) == f2u(b.roles[r].scale_inv);
    }
    CHECK(same);
    CHECK(memcmp(a.host_buf, b.host_buf, image_n(&a) * sizeof(float)) == 0);
    size_t len2 = 0;
    unsigned char *again = save_new(&b, &len2);
    CHECK(len2 == len && memcmp(again, blob, len) == 0);
    /* Both continue identically. */
    lowp_fp8_state_record(&a, LOWP_ROLE_INPUT, 3.0f);
    lowp_fp8_state_record(&b, LOWP_ROLE_INPUT, 3.0f);
    lowp_fp8_state_update(&a, NULL);
    lowp_fp8_state_update(&b, NULL);
    CHECK(memcmp(a.host_buf, b.host_buf, image_n(&a) * sizeof(float)) == 0);
    free(again);

    /* Save errors: a short buffer reports the size; NULL arguments. */
    size_t got = 0;
    CHECK_FAIL(lowp_fp8_state_extra_state_save(&a, blob, len - 1, &got), LOWP_ERR_INVALID_ARG,
               "cap (251) < the blob's size (252)");
    CHECK(got == len);
    CHECK_FAIL(lowp_fp8_state_extra_state_save(&a, NULL, len, &got), LOWP_ERR_INVALID_ARG,
               "blob is NULL");
    CHECK_FAIL(lowp_fp8_state_extra_state_save(&a, blob, len, NULL), LOWP_ERR_INVALID_ARG,
               "len is NULL");
    CHECK_FAIL(lowp_fp8_state_extra_state_size(&a, NULL), LOWP_ERR_INVALID_ARG, "len is NULL");
    CHECK_FAIL(lowp_fp8_state_extra_state_load(&a, NULL, len), LOWP_ERR_INVALID_ARG,
               "blob is NULL");
    lowp_fp8_state zero;
    memset(&zero, 0, sizeof zero);
    CHECK_FAIL(lowp_fp8_state_extra_state_save(&zero, blob, len, &got), LOWP_ERR_INVALID_ARG,
               "not an initialized state");
    CHECK_FAIL(lowp_fp8_state_extra_state_load(&zero, blob, len), LOWP_ERR_INVALID_ARG,
               "not an initialized state");

    /* The margin and algorithm of the module win over the blob's (validated, not applied). */
    lowp_delayed_cfg c2 = delayed_cfg(16, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state m;
    CHECK_OK(lowp_fp8_state_init(&m, &c2, k_hybrid, LOWP_DEVICE_HOST));
    CHECK_OK(lowp_fp8_state_extra_state_load(&m, blob, len));
    CHECK(m.roles[0].cfg.margin == 0.0f && m.roles[0].cfg.algo == LOWP_AMAX_ALGO_MAX);
    CHECK(rd32(blob + 44 + 2 * 68 + 64) == f2u(m.roles[2].scale));
    lowp_fp8_state_free(&m);

    /* Another element format is another module: refused, state untouched. */
    lowp_format other[3] = {LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3};
    lowp_fp8_state o;
    CHECK_OK(lowp_fp8_state_init(&o, &c, other, LOWP_DEVICE_HOST));
    snap s;
    snap_take(&s, &o);
    CHECK_FAIL(lowp_fp8_state_extra_state_load(&o, blob, len), LOWP_ERR_INVALID_ARG,
               "format of role 2 in the blob (4) != the module's (3)");
    CHECK(snap_same(&s, &o));
    snap_free(&s);
    lowp_fp8_state_free(&o);

    free(blob);
    lowp_fp8_state_free(&a);
    lowp_fp8_state_free(&b);
}

/* ---- the version-1 fixture --------------------------------------------------------------- */

static unsigned char *read_fixture(size_t *len) {
    const char *dir = getenv("LOWP_FIXTURES");
    char path[4096];
    snprintf(path, sizeof path, "%s/extra_state_v1.bin", dir ? dir : "tests/fixtures");
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s (set LOWP_FIXTURES)\n", path);
        return NULL;
    }
    unsigned char *b = malloc(4096);
    *len = fread(b, 1, 4096, f);
    fclose(f);
    return b;
}

/* The values tests/fixtures/make_extra_state_fixture.py writes. */
static const float k_fix_hist[3][4] = {{0.0f, 1.0f, 4.0f, 2.0f},
                                       {0.0f, 0.25f, 0.5f, 0.375f},
                                       {0.125f, 0.0078125f, 0.015625f, 0.01171875f}};
static const float k_fix_scale[3] = {112.0f, 896.0f, 3670016.0f};

static void test_fixture(const unsigned char *fix, size_t flen) {
    CHECK(flen == blob_len(4));
    lowp_delayed_cfg c = delayed_cfg(4, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state st;
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, LOWP_DEVICE_HOST));
    CHECK_OK(lowp_fp8_state_extra_state_load(&st, fix, flen));
    int vals = 0;
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 4; i++) {
            CHECKF(f2u(st.roles[r].history[i]) == f2u(k_fix_hist[r][i]), "role %d row %d: %g", r, i,
                   (double) st.roles[r].history[i]);
            vals++;
        }
        CHECK(f2u(st.roles[r].scale) == f2u(k_fix_scale[r]));
        CHECK(f2u(st.roles[r].scale_inv) == f2u(1.0f / k_fix_scale[r])); /* derived */
        CHECK(st.dev_buf[r * 5 + 4] == k_fix_scale[r]);
        vals += 2;
    }
    CHECK(vals == 18);
    /* Re-saving reproduces the fixture byte for byte: lowp's writer agrees with the spec. */
    size_t len = 0;
    unsigned char *b = save_new(&st, &len);
    CHECK(len == flen && memcmp(b, fix, flen) == 0);
    free(b);
    /* The loaded state works: the next update uses the loaded history (max 4 -> 112). */
    CHECK_OK(lowp_fp8_state_update(&st, NULL));
    CHECK(st.roles[0].scale == 112.0f);
    CHECK(st.roles[2].scale == 57344.0f / 0.125f); /* the staged 0.125 is now the max */
    lowp_fp8_state_free(&st);
}

/* Loading into another history length: row 0 kept, the most recent rows aligned at the end. */
static void test_history_change(const unsigned char *fix, size_t flen) {
    static const int32_t lens[] = {1, 2, 3, 6, 9};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        int32_t L = lens[k];
        lowp_delayed_cfg c = delayed_cfg(L, 0.0f, LOWP_AMAX_ALGO_MAX);
        lowp_fp8_state st;
        CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, LOWP_DEVICE_HOST));
        lowp_fp8_state_record(&st, LOWP_ROLE_INPUT, 99.0f); /* overwritten by the load */
        lowp_fp8_state_update(&st, NULL);
        CHECK_OK(lowp_fp8_state_extra_state_load(&st, fix, flen));
        CHECK(st.history_len == L);
        int ok = 1;
        for (int r = 0; r < 3; r++) {
            float want[16] = {0};
            want[0] = k_fix_hist[r][0];
            for (int j = 1; j < 4 && j < L; j++) want[L - j] = k_fix_hist[r][4 - j];
            for (int i = 0; i < L; i++) ok &= f2u(st.roles[r].history[i]) == f2u(want[i]);
            ok &= st.roles[r].scale == k_fix_scale[r];
        }
        CHECKF(ok, "history length %d", L);
        /* Saved again, it is a valid blob of the new length. */
        size_t len = 0;
        unsigned char *b = save_new(&st, &len);
        CHECK(len == blob_len(L) && rd32(b + 20) == (uint32_t) L);
        free(b);
        lowp_fp8_state_free(&st);
    }
    /* L = 6 spelled out: [r0, 0, 0, r1, r2, r3]. */
    lowp_delayed_cfg c = delayed_cfg(6, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state st;
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, LOWP_DEVICE_HOST));
    CHECK_OK(lowp_fp8_state_extra_state_load(&st, fix, flen));
    const float *h = st.roles[2].history;
    CHECK(h[0] == 0.125f && h[1] == 0.0f && h[2] == 0.0f && h[3] == 0.0078125f &&
          h[4] == 0.015625f && h[5] == 0.01171875f);
    lowp_fp8_state_free(&st);
    /* L = 2: [r0, r3]. */
    c = delayed_cfg(2, 0.0f, LOWP_AMAX_ALGO_MAX);
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, LOWP_DEVICE_HOST));
    CHECK_OK(lowp_fp8_state_extra_state_load(&st, fix, flen));
    CHECK(st.roles[0].history[0] == 0.0f && st.roles[0].history[1] == 2.0f);
    lowp_fp8_state_free(&st);
}

/* ---- parameters -------------------------------------------------------------------------- */

static void test_params(const unsigned char *fix, size_t flen) {
    unsigned char buf[512];
    size_t len = 99;
    /* Plain (never wrapped) and wrapped without delayed scaling: the empty blob. */
    lowp_param plain = {.name = "plain", .rows = 4, .cols = 4};
    struct lowp_wrap stateless;
    memset(&stateless, 0, sizeof stateless);
    lowp_param mx = {.name = "mx", .rows = 4, .cols = 4, .wrap = &stateless};
    lowp_param *ps[2] = {&plain, &mx};
    for (int i = 0; i < 2; i++) {
        len = 99;
        CHECK_OK(lowp_param_extra_state_size(ps[i], &len));
        CHECK(len == 0);
        len = 99;
        CHECK_OK(lowp_param_extra_state_save(ps[i], NULL, 0, &len));
        CHECK(len == 0);
        CHECK_OK(lowp_param_extra_state_load(ps[i], NULL, 0));
        CHECK_FAIL(lowp_param_extra_state_load(ps[i], fix, flen), LOWP_ERR_INVALID_ARG,
                   "has no delayed-scaling state");
    }
    CHECK_FAIL(lowp_param_extra_state_size(NULL, &len), LOWP_ERR_INVALID_ARG, "param is NULL");
    CHECK_FAIL(lowp_param_extra_state_size(&plain, NULL), LOWP_ERR_INVALID_ARG, "len is NULL");
    CHECK_FAIL(lowp_param_extra_state_save(NULL, buf, sizeof buf, &len), LOWP_ERR_INVALID_ARG,
               "param is NULL");
    CHECK_FAIL(lowp_param_extra_state_load(NULL, fix, flen), LOWP_ERR_INVALID_ARG, "param is NULL");

    /* With delayed scaling: the state's blob, through the parameter. */
    lowp_delayed_cfg c = delayed_cfg(4, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state st;
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, LOWP_DEVICE_HOST));
    struct lowp_wrap w;
    memset(&w, 0, sizeof w);
    w.fp8 = &st;
    lowp_param p = {.name = "layers.0.mlp.fc1", .rows = 4, .cols = 4, .wrap = &w};
    CHECK_OK(lowp_param_extra_state_load(&p, fix, flen));
    CHECK(st.roles[1].scale == 896.0f);
    CHECK_OK(lowp_param_extra_state_size(&p, &len));
    CHECK(len == flen);
    CHECK_OK(lowp_param_extra_state_save(&p, buf, sizeof buf, &len));
    CHECK(len == flen && memcmp(buf, fix, flen) == 0);
    /* An empty blob is a truncated one for a module with state; messages name the param. */
    snap s;
    snap_take(&s, &st);
    CHECK_FAIL(lowp_param_extra_state_load(&p, buf, 0), LOWP_ERR_CORRUPT,
               "param \"layers.0.mlp.fc1\"");
    CHECK(snap_same(&s, &st));
    CHECK_FAIL(lowp_param_extra_state_save(&p, buf, 8, &len), LOWP_ERR_INVALID_ARG,
               "param \"layers.0.mlp.fc1\"");
    snap_free(&s);
    lowp_fp8_state_free(&st);
}

/* ---- corruption -------------------------------------------------------------------------- */

typedef struct corrupt_case {
    size_t off;       /* where to write */
    uint32_t value;   /* the u32 written there */
    lowp_status want; /* the status */
    const char *has;  /* in the message */
} corrupt_case;

static void test_corruptions(const unsigned char *fix, size_t flen) {
    lowp_delayed_cfg c = delayed_cfg(4, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state st;
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, LOWP_DEVICE_HOST));
    run_steps(&st, 7, 0);
    snap s;
    snap_take(&s, &st);
    const corrupt_case cases[] = {
        {0, 0x5057474Cu, LOWP_ERR_CORRUPT, "bad magic"},
        {8, 0, LOWP_ERR_CORRUPT, "version (0)"},
        {8, 2, LOWP_ERR_VERSION, "version (2)"},
        {12, 87, LOWP_ERR_CORRUPT, "payload bytes (87)"},
        {16, 2, LOWP_ERR_CORRUPT, "role count (2)"},
        {20, 0, LOWP_ERR_CORRUPT, "history length (0)"},
        {20, 5, LOWP_ERR_CORRUPT, "history length 5"},
        {20, 0xFFFFFFFFu, LOWP_ERR_CORRUPT, "history length 4294967295"},
        {24, 0x7FC00000u, LOWP_ERR_CORRUPT, "margin"},
        {24, 0x7F800000u, LOWP_ERR_CORRUPT, "margin"},
        {28, 2, LOWP_ERR_CORRUPT, "amax algorithm (2)"},
        {36, 5, LOWP_ERR_CORRUPT, "format of role 1 (5)"},
        {40, 0, LOWP_ERR_CORRUPT, "format of role 2 (0)"},
        {40, 3, LOWP_ERR_INVALID_ARG, "format of role 2 in the blob (3)"},
        {44 + 4, 0xBF800000u, LOWP_ERR_CORRUPT, "role 0, row 1 (-1)"},
        {44 + 20 + 12, 0xFF800000u, LOWP_ERR_CORRUPT, "role 1, row 3"},
        {44 + 16, 0, LOWP_ERR_CORRUPT, "scale of role 0 (0)"},
        {44 + 20 + 16, 0xC0000000u, LOWP_ERR_CORRUPT, "scale of role 1 (-2)"},
        {44 + 40 + 16, 0x7F800000u, LOWP_ERR_CORRUPT, "scale of role 2 (inf)"},
        {44 + 40 + 16, 0x7FC00000u, LOWP_ERR_CORRUPT, "scale of role 2 (nan)"},
        {44 + 40 + 16, 0x80000000u, LOWP_ERR_CORRUPT, "scale of role 2 (-0)"},
    };
    unsigned char b[256];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memcpy(b, fix, flen);
        wr32(b + cases[k].off, cases[k].value);
        fix_crc(b, flen);
        CHECK_FAIL(lowp_fp8_state_extra_state_load(&st, b, flen), cases[k].want, cases[k].has);
        CHECK(snap_same(&s, &st));
    }
    /* A wrong CRC, a trailing byte, every truncation (0 bytes included). */
    memcpy(b, fix, flen);
    b[flen - 1] ^= 0x40;
    CHECK_FAIL(lowp_fp8_state_extra_state_load(&st, b, flen), LOWP_ERR_CORRUPT, "CRC-32");
    memcpy(b, fix, flen);
    b[flen] = 0;
    CHECK_FAIL(lowp_fp8_state_extra_state_load(&st, b, flen + 1), LOWP_ERR_CORRUPT, "trailing");
    int trunc_ok = 1;
    for (size_t n = 0; n < flen; n++) {
        lowp_clear_error();
        lowp_status r = lowp_fp8_state_extra_state_load(&st, fix, n);
        trunc_ok &= r == LOWP_ERR_CORRUPT && lowp_last_error()[0] != '\0' && snap_same(&s, &st);
    }
    CHECK(trunc_ok);
    /* A NaN amax is a legal state (NaN sticks), a +Inf one too: accepted. */
    memcpy(b, fix, flen);
    wr32(b + 44 + 8, 0x7FC00000u);
    wr32(b + 44 + 20 + 8, 0x7F800000u);
    fix_crc(b, flen);
    CHECK_OK(lowp_fp8_state_extra_state_load(&st, b, flen));
    CHECK(isnan(st.roles[0].history[2]) && isinf(st.roles[1].history[2]));
    snap_free(&s);
    lowp_fp8_state_free(&st);
}

/* ---- fuzz -------------------------------------------------------------------------------- */

/* Load `b` into st. On error the state must be exactly as before; on success, a re-save must
 * give the same bytes except margin and algorithm (the module's win); then the original is
 * reloaded for the next case. Returns 1 when the case behaved. */
static int fuzz_one(lowp_fp8_state *st, const snap *s, const unsigned char *orig, size_t olen,
                    const unsigned char *b, size_t len, int *accepted) {
    lowp_clear_error();
    lowp_status r = lowp_fp8_state_extra_state_load(st, b, len);
    if (r != LOWP_OK) return lowp_last_error()[0] != '\0' && snap_same(s, st);
    ++*accepted;
    int ok = len == olen;
    unsigned char again[512];
    size_t n = 0;
    ok &= lowp_fp8_state_extra_state_save(st, again, sizeof again, &n) == LOWP_OK && n == len;
    if (ok) {
        unsigned char m[512];
        memcpy(m, b, len);
        memcpy(m + 24, again + 24, 8);
        fix_crc(m, len);
        ok &= memcmp(m, again, len) == 0;
    }
    ok &= lowp_fp8_state_extra_state_load(st, orig, olen) == LOWP_OK && snap_same(s, st);
    return ok;
}

static void test_fuzz(void) {
    lowp_delayed_cfg c = delayed_cfg(16, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state st;
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, LOWP_DEVICE_HOST));
    run_steps(&st, 30, 1);
    size_t olen = 0;
    unsigned char *orig = save_new(&st, &olen);
    /* The snapshot is of the state as the original blob loads it (pull has run). */
    CHECK_OK(lowp_fp8_state_extra_state_load(&st, orig, olen));
    snap s;
    snap_take(&s, &st);

    unsigned char b[512];
    memset(b, 0, sizeof b);
    int cases = 0, bad = 0, accepted = 0, crc_accepted = 0;
    /* 1. Every truncation, and random ones of random-flipped blobs. */
    for (size_t n = 0; n < olen; n++, cases++)
        bad += !fuzz_one(&st, &s, orig, olen, orig, n, &accepted);
    for (int i = 0; i < 1000; i++, cases++) {
        memcpy(b, orig, olen);
        b[xorshift32() % olen] ^= (unsigned char) (1u << (xorshift32() % 8));
        bad += !fuzz_one(&st, &s, orig, olen, b, xorshift32() % olen, &accepted);
    }
    /* 2. Random bit flips (1 to 8 bits), CRC left as is: the CRC must catch every one. */
    for (int i = 0; i < 3000; i++, cases++) {
        memcpy(b, orig, olen);
        int flips = 1 + (int) (xorshift32() % 8);
        for (int f = 0; f < flips; f++)
            b[xorshift32() % olen] ^= (unsigned char) (1u << (xorshift32() % 8));
        if (memcmp(b, orig, olen) == 0) b[0] ^= 1; /* flips that cancelled out */
        bad += !fuzz_one(&st, &s, orig, olen, b, olen, &crc_accepted);
    }
    CHECKF(crc_accepted == 0, "%d corrupted blobs passed the CRC", crc_accepted);
    /* 3. Bit flips with the CRC repaired: the field checks have to do the work; what they
     *    let through must be a state that saves back to the same bytes. */
    for (int i = 0; i < 3000; i++, cases++) {
        memcpy(b, orig, olen);
        int flips = 1 + (int) (xorshift32() % 4);
        for (int f = 0; f < flips; f++) {
            /* Half the flips in the 44-byte header, where the interesting checks are. */
            size_t at = xorshift32() % 2 ? xorshift32() % 44 : xorshift32() % (olen - 4);
            b[at] ^= (unsigned char) (1u << (xorshift32() % 8));
        }
        fix_crc(b, olen);
        bad += !fuzz_one(&st, &s, orig, olen, b, olen, &accepted);
    }
    /* 4. Garbage in the header fields (random u32 values, sometimes small), the length
     *    sometimes matching the claimed payload. */
    for (int i = 0; i < 2000; i++, cases++) {
        memcpy(b, orig, olen);
        for (size_t off = 8; off < 44; off += 4)
            if (xorshift32() % 3 == 0)
                wr32(b + off, xorshift32() % 2 ? xorshift32() : xorshift32() % 8);
        size_t len = olen;
        if (xorshift32() % 2) {
            uint32_t pl = rd32(b + 12);
            if (pl < 400) len = 20 + (size_t) pl;
        }
        if (len >= 4) fix_crc(b, len);
        bad += !fuzz_one(&st, &s, orig, olen, b, len, &accepted);
    }
    /* 5. Random bytes behind a valid magic. */
    for (int i = 0; i < 1000; i++, cases++) {
        size_t len = xorshift32() % 300;
        for (size_t k = 0; k < len; k++) b[k] = (unsigned char) xorshift32();
        if (len >= 8) memcpy(b, "LOWPXST1", 8);
        if (len >= 24 && xorshift32() % 2) wr32(b + 8, 1);
        if (len >= 24 && xorshift32() % 2) wr32(b + 12, (uint32_t) len - 20);
        if (len >= 4 && xorshift32() % 2) fix_crc(b, len);
        bad += !fuzz_one(&st, &s, orig, olen, b, len, &accepted);
    }
    CHECKF(bad == 0, "%d of %d fuzz cases broke the contract", bad, cases);
    CHECK(cases > 8000);
    CHECK(accepted > 0); /* some repaired flips are legal states (an amax bit, say) */
    printf("fuzz: %d cases, %d accepted, %d refused\n", cases, accepted, cases - accepted);
    snap_free(&s);
    free(orig);
    lowp_fp8_state_free(&st);
}

/* ---- an asynchronous device -------------------------------------------------------------- */

/* The blob's value for role r, row i (i == L: the scale). */
static float blob_at(const unsigned char *b, int32_t L, int r, int i) {
    return u2f(rd32(b + 44 + (size_t) r * 4 * ((size_t) L + 1) + 4 * (size_t) i));
}

/* Whether the blob holds ref's histories and scales, bit for bit. */
static int blob_holds(const unsigned char *blob, int32_t L, const lowp_fp8_state *ref) {
    int ok = 1;
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < L; i++)
            ok &= f2u(blob_at(blob, L, r, i)) == f2u(ref->roles[r].history[i]);
        ok &= f2u(blob_at(blob, L, r, L)) == f2u(ref->roles[r].scale);
    }
    return ok;
}

/* Loading the fixture into a state on testdev:1 (device d1, history L): the device memory
 * holds it, a corrupt blob never reaches the device, and the parameter functions save it. */
static void check_device_load(testdev_hooks *td, lowp_fp8_state *st, lowp_device d1, int32_t L,
                              const unsigned char *fix, size_t flen) {
    unsigned char blob[256];
    size_t len = 0;
    /* Load places the state on testdev:1 and returns with nothing queued there. */
    const int s0 = td->sync_count(0);
    int s1 = td->sync_count(1);
    CHECK_OK(lowp_fp8_state_extra_state_load(st, fix, flen));
    CHECK(td->queued(1) == 0);
    CHECK(td->sync_count(1) > s1);
    CHECK(td->sync_count(0) == s0);
    int dev_ok = 1;
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < L; i++) dev_ok &= st->dev_buf[r * (L + 1) + i] == k_fix_hist[r][i];
        dev_ok &= st->dev_buf[r * (L + 1) + L] == k_fix_scale[r];
    }
    CHECK(dev_ok); /* the device memory itself holds the loaded state */

    /* A corrupt blob never reaches the device: nothing queued, nothing synchronized, no
     * change. */
    unsigned char bad[256];
    memcpy(bad, fix, flen);
    bad[50] ^= 1;
    snap s;
    snap_take(&s, st);
    s1 = td->sync_count(1);
    CHECK_FAIL(lowp_fp8_state_extra_state_load(st, bad, flen), LOWP_ERR_CORRUPT, "CRC");
    CHECK(td->queued(1) == 0 && td->sync_count(1) == s1);
    CHECK(snap_same(&s, st));
    snap_free(&s);
    td->set_delay_us(2000);

    /* A parameter whose state lives on testdev:1, through the parameter functions. */
    struct lowp_wrap w;
    memset(&w, 0, sizeof w);
    w.fp8 = st;
    lowp_param p = {.name = "dev.w", .rows = 2, .cols = 2, .device = d1, .wrap = &w};
    CHECK_OK(lowp_param_extra_state_save(&p, blob, sizeof blob, &len));
    CHECK(len == flen && memcmp(blob, fix, flen) == 0);
}

static void test_device(testdev_hooks *td, const unsigned char *fix, size_t flen) {
    const lowp_device d0 = {td->type, 0}, d1 = {td->type, 1};
    const int32_t L = 4;
    lowp_delayed_cfg c = delayed_cfg(L, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state st, ref; /* ref: the same steps on the CPU, the expected values */
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, d1));
    CHECK_OK(lowp_fp8_state_init(&ref, &c, k_hybrid, LOWP_DEVICE_HOST));
    const float amax[3] = {4.0f, 0.5f, 2.0f};
    for (int r = 0; r < 3; r++) {
        lowp_fp8_state_record(&st, (lowp_role) r, amax[r]);
        lowp_fp8_state_record(&ref, (lowp_role) r, amax[r]);
    }
    CHECK_OK(lowp_fp8_state_update(&ref, NULL));

    /* The update's push is pending on testdev:1 (held). */
    CHECK(td->hold(1, 1) == 0);
    CHECK_OK(lowp_fp8_state_update(&st, NULL));
    CHECK(td->queued(1) == 1);
    CHECK(st.dev_buf[L] == 1.0f); /* the device still has the initial scale */

    /* The wrong device: reading back after synchronizing testdev:0 gives stale values. */
    int s0 = td->sync_count(0);
    st.device = d0;
    CHECK_OK(lowp_fp8_state_pull(&st));
    st.device = d1;
    CHECK(td->sync_count(0) > s0);
    CHECK(st.roles[0].scale == 1.0f && st.roles[0].scale != ref.roles[0].scale); /* stale */
    CHECK(st.roles[0].history[L - 1] == 0.0f);

    /* The right one: save synchronizes testdev:1 (released by another thread while save
     * waits) and returns the finished values; testdev:0 is not synchronized at all. */
    s0 = td->sync_count(0);
    int s1 = td->sync_count(1);
    pthread_t th;
    testdev_release_arg ra = {td, 1, 30000};
    CHECK(pthread_create(&th, NULL, testdev_release_later, &ra) == 0);
    unsigned char blob[256];
    size_t len = 0;
    CHECK_OK(lowp_fp8_state_extra_state_save(&st, blob, sizeof blob, &len));
    pthread_join(th, NULL);
    CHECK(td->sync_count(1) >= s1 + 2);
    CHECK(td->sync_count(0) == s0);
    CHECK(len == blob_len(L) && blob_holds(blob, L, &ref));
    CHECK(blob_at(blob, L, 0, L) == 112.0f);

    /* With a slow queue instead of a hold, and the host mirror clobbered after the push: the
     * saved values can only have come from the device. */
    td->set_delay_us(20000);
    for (int r = 0; r < 3; r++) {
        lowp_fp8_state_record(&st, (lowp_role) r, 2.0f * amax[r]);
        lowp_fp8_state_record(&ref, (lowp_role) r, 2.0f * amax[r]);
    }
    CHECK_OK(lowp_fp8_state_update(&ref, NULL));
    CHECK_OK(lowp_fp8_state_update(&st, NULL));
    CHECK(td->queued(1) >= 1);
    for (size_t i = 0; i < image_n(&st); i++) st.host_buf[i] = -123.0f;
    for (int r = 0; r < 3; r++) st.roles[r].scale = -5.0f;
    s0 = td->sync_count(0);
    CHECK_OK(lowp_fp8_state_extra_state_save(&st, blob, sizeof blob, &len));
    CHECK(td->sync_count(0) == s0);
    int mirror_ok = 1;
    for (int r = 0; r < 3; r++)
        mirror_ok &= f2u(st.roles[r].scale) == f2u(ref.roles[r].scale); /* mirror restored */
    CHECK(blob_holds(blob, L, &ref) && mirror_ok);

    check_device_load(td, &st, d1, L, fix, flen);
    lowp_fp8_state_free(&st);
    lowp_fp8_state_free(&ref);
}

int main(void) {
    tu_seed(0x2545F4914F6CDD1Dull);
    crc_init();
    testdev_hooks td;
    int have_td = testdev_open(&td);
    CHECK(have_td);
    size_t flen = 0;
    unsigned char *fix = read_fixture(&flen);
    CHECK(fix != NULL);
    test_layout_and_round_trip();
    test_fuzz();
    if (fix) {
        test_fixture(fix, flen);
        test_history_change(fix, flen);
        test_params(fix, flen);
        test_corruptions(fix, flen);
        if (have_td) test_device(&td, fix, flen);
    }
    free(fix);
    return testutil_finish();
}
