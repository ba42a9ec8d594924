/* libFuzzer target: the training-checkpoint loader (src/trainer/checkpoint.c), header info and
 * full load, on a trainer built once
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(g_path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    lowp_checkpoint_info info;
    (void) lowp_trainer_checkpoint_info(g_path, &info);
    (void) lowp_trainer_checkpoint_load(g_t, g_path);
    unlink(g_path);
    return 0;
}
