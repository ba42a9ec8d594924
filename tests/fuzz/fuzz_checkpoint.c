/* libFuzzer target: the training-checkpoint loader (src/trainer/checkpoint.c), header info and
 * full load. With the first input byte odd, the rest is parsed as safetensors and written back
 * with every checksum recomputed (src/trainer/checkpoint_check.c), so that mutations reach the
 * value and range checks behind the CRC-32Cs. The trainer is built once
 * with the configuration of the seed checkpoints (tests/fuzz/seeds.sh: the tiny preset with
 * dim 16, 1 layer, 2 heads, 2 experts top-1, hidden 16, recipe fp8_delayed, the built-in
 * corpus, batch 2). The input is written to a file (the loader reads paths) in $TMPDIR. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lowp/lowp.h"
#include "lowp/model.h"
#include "lowp/trainer.h"
#include "trainer/checkpoint_check.h"

static lowp_trainer *g_t;
static char g_path[512];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void) argc;
    (void) argv;
    lowp_data *data;
    lowp_moe_config mc;
    lowp_trainer_cfg tc;
    lowp_recipe r;
    lowp_moe *m;
    if (lowp_data_default(&data) != LOWP_OK) abort();
    lowp_data_info di;
    lowp_data_get_info(data, &di);
    lowp_moe_config_preset("tiny", di.vocab, &mc);
    mc.dim = 16, mc.layers = 1, mc.heads = 2, mc.experts = 2, mc.top_k = 1;
    mc.expert_hidden = 16, mc.shared_hidden = 16;
    lowp_trainer_cfg_init(&tc);
    tc.batch = 2;
    tc.threads = 1;
    if (lowp_recipe_init(&r, "fp8_delayed") != LOWP_OK ||
        lowp_moe_create(&mc, 1234, &m) != LOWP_OK ||
        lowp_trainer_create(m, data, &r, &tc, &g_t) != LOWP_OK)
        abort();
    const char *dir = getenv("TMPDIR");
    snprintf(g_path, sizeof g_path, "%s/lowp_fuzz_ck_%d.safetensors", dir ? dir : "/tmp",
             (int) getpid());
    return 0;
}

/* Rewrite the safetensors bytes with valid checksums; 0 when they do not parse. */
static int write_signed(const uint8_t *data, size_t size) {
    lowp_safetensors *st = NULL;
    if (lowp_safetensors_parse(data, size, &st) != LOWP_OK) return 0;
    int32_t nt = 0, nm = 0;
    lowp_safetensors_count(st, &nt, &nm);
    lowp_st_tensor *ts = calloc((size_t) nt + 1, sizeof *ts);
    lowp_st_meta *m = calloc((size_t) (nm + nt + 2), sizeof *m);
    char(*keys)[LOWP_CKPT_KEYLEN + 8] = calloc((size_t) nt + 1, sizeof *keys);
    char(*vals)[12] = calloc((size_t) nt + 2, sizeof *vals);
    int ok = ts && m && keys && vals;
    int32_t k = 0;
    for (int32_t i = 0; ok && i < nm; i++) {
        lowp_safetensors_meta_at(st, i, &m[k].key, &m[k].value);
        if (strncmp(m[k].key, "crc32c.", 7) != 0) k++; /* replaced below */
    }
    for (int32_t i = 0; ok && i < nt; i++) {
        lowp_safetensors_tensor(st, i, &ts[i]);
        snprintf(keys[i], sizeof keys[i], "crc32c.%s", ts[i].name);
        snprintf(vals[i], sizeof vals[i], "%08x", (unsigned) lowp_ckpt_tensor_crc(&ts[i]));
        m[k].key = keys[i];
        m[k++].value = vals[i];
    }
    uint32_t c = 0;
    if (ok) lowp_ckpt_meta_crc(m, k, &c);
    snprintf(vals[nt], sizeof vals[nt], "%08x", (unsigned) c);
    m[k].key = "crc32c.__metadata__";
    m[k++].value = vals[nt];
    ok = ok && lowp_safetensors_write(g_path, ts, nt, m, k) == LOWP_OK;
    free(ts);
    free(m);
    free(keys);
    free(vals);
    lowp_safetensors_free(st);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int sign = data[0] & 1;
    data++;
    size--;
    if (sign) {
        if (!write_signed(data, size)) return 0;
    } else {
        FILE *f = fopen(g_path, "wb");
        if (!f) return 0;
        fwrite(data, 1, size, f);
        fclose(f);
    }
    lowp_checkpoint_info info;
    (void) lowp_trainer_checkpoint_info(g_path, &info);
    (void) lowp_trainer_checkpoint_load(g_t, g_path);
    unlink(g_path);
    return 0;
}
