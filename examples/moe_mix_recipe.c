/* The `mix` recipe on the MoE transformer: attention and the shared experts in MXFP8, the
 * routed experts in the NPU's Block FP8 (32x32 blocks, E8M0 scales), embeddings, norms, the
 * router and the output head in high precision.
 *
 * The program builds the tiny model on the built-in corpus, lets the trainer wrap its
 * parameters with the recipe, prints what each parameter got, trains 60 updates and prints
 * the loss as it goes, then a short sample. It exits with status 1 unless the loss fell.
 */
#include <stdio.h>
#include <stdlib.h>

#include "lowp/lowp.h"
#include "lowp/trainer.h"

#define TRY(call)                                                                                  \
    do {                                                                                           \
        lowp_status st_ = (call);                                                                  \
        if (st_ != LOWP_OK) {                                                                      \
            fprintf(stderr, "%s failed: %s\n", #call, lowp_last_error());                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int print_progress(const lowp_step_report *r, void *user) {
    float *first = user;
    if (r->step == 1) *first = r->loss;
    if (r->step % 10 == 0)
        printf("step %3lld  loss %.3f  val %.3f  %6.0f tokens/s\n", (long long) r->step,
               (double) r->loss, (double) r->val_loss, r->tokens_per_s);
    return 0; /* keep going */
}

int main(void) {
    /* Data: the built-in corpus, a byte vocabulary, 90% train / 10% validation. */
    lowp_data *data;
    TRY(lowp_data_default(&data));
    lowp_data_info di;
    TRY(lowp_data_get_info(data, &di));

    /* The model: the "tiny" preset sized to the vocabulary. */
    lowp_moe_config mc;
    TRY(lowp_moe_config_preset("tiny", di.vocab, &mc));
    lowp_model *model;
    TRY(lowp_model_create(&mc, 1234, &model));

    /* The recipe, and a trainer that applies it (lowp_train_prepare on every parameter). */
    lowp_recipe mix;
    TRY(lowp_recipe_init(&mix, "mix"));
    lowp_trainer_cfg tc;
    TRY(lowp_trainer_cfg_init(&tc));
    tc.steps = 60;
    tc.warmup = 6;
    tc.eval_every = 10;
    tc.eval_batches = 4;
    tc.threads = 1;
    lowp_trainer *t;
    TRY(lowp_trainer_create(model, data, &mix, &tc, &t));

    /* What the recipe decided, parameter by parameter. */
    lowp_param *params;
    int32_t n;
    TRY(lowp_trainer_params(t, &params, &n));
    printf("recipe %s on %d parameters:\n", mix.name, (int) n);
    for (int32_t i = 0; i < n; i++) {
        const char *how = "high precision (plain)";
        lowp_wrap_stats ws;
        if (params[i].wrap && lowp_param_stats(&params[i], &ws) == LOWP_OK) how = ws.cfg_name;
        printf("  %-28s %s\n", params[i].name, how);
    }

    /* Train; the callback prints every 10th update. */
    float first = 0;
    TRY(lowp_trainer_run(t, 0, print_progress, &first));
    float val;
    TRY(lowp_trainer_eval(t, &val));

    char text[121];
    lowp_sample_cfg sc;
    TRY(lowp_sample_cfg_init(&sc));
    TRY(lowp_sample_text(model, data, &sc, "The ", 120, text));
    printf("sample: The %s\n", text);

    lowp_trainer_free(t); /* unwraps the parameters */
    lowp_model_free(model);
    lowp_data_free(data);
    if (!(val < first - 0.5f)) {
        fprintf(stderr, "the loss did not fall enough: %.3f -> %.3f\n", (double) first,
                (double) val);
        return 1;
    }
    printf("validation loss %.3f (first training loss %.3f)\n", (double) val, (double) first);
    return 0;
}
