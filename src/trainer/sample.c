/* Sampling text from a model (trainer.h): temperature and top-k over the logits of the last
 * position, the draws from a Philox stream so that a seed names the text. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"
#include "core/internal.h"
#include "lowp/trainer.h"

/* ---- Sampling ---- */

lowp_status lowp_sample_cfg_init(lowp_sample_cfg *cfg) {
    LOWP_CHECK_PTR("lowp_sample_cfg_init", cfg);
    cfg->temperature = 0.8f;
    cfg->top_k = 0;
    cfg->seed = 42;
    cfg->threads = 0;
    return LOWP_OK;
}

/* The next token from logits [V]: argmax at temperature <= 0, else a draw from the softmax of
 * the top_k largest (ties broken by the lower token) at the temperature. u in [0, 1). */
static int32_t pick(const float *logits, int32_t V, float temperature, int32_t top_k, double u,
                    int32_t *order, double *prob) {
    int32_t best = 0;
    for (int32_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (!(temperature > 0)) return best;
    int32_t k = (top_k > 0 && top_k < V) ? top_k : V;
    /* Selection of the k largest by insertion into order[0 .. k-1]: V is at most 256. */
    int32_t have = 0;
    for (int32_t v = 0; v < V; v++) {
        if (have == k && !(logits[v] > logits[order[k - 1]])) continue;
        int32_t j = have < k ? have++ : k - 1;
        while (j > 0 && logits[v] > logits[order[j - 1]]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
    double mx = logits[order[0]], sum = 0.0;
    for (int32_t j = 0; j < k; j++) {
        prob[j] = exp(((double) logits[order[j]] - mx) / (double) temperature);
        sum += prob[j];
    }
    double acc = 0.0, target = u * sum;
    for (int32_t j = 0; j < k; j++) {
        acc += prob[j];
        if (target < acc) return order[j];
    }
    return order[k - 1];
}

lowp_status lowp_sample_text(lowp_model *model, const lowp_data *data, const lowp_sample_cfg *cfg,
                             const char *prompt, int32_t n, char *out) {
    const char *fn = "lowp_sample_text";
    LOWP_CHECK_PTR(fn, model);
    LOWP_CHECK_PTR(fn, data);
    LOWP_CHECK_PTR(fn, cfg);
    LOWP_CHECK_PTR(fn, out);
    if (n < 0) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: n (%d) < 0", fn, (int) n);
    if (!isfinite(cfg->temperature))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: temperature (%g) is not finite", fn,
                         (double) cfg->temperature);
    lowp_moe_config mc;
    lowp_status st = lowp_model_get_config(model, &mc);
    if (st != LOWP_OK) return st;
    const uint8_t *symbols;
    int32_t V;
    lowp_data_vocab(data, &symbols, &V);
    if (V != mc.vocab)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: the model's vocab (%d) != the data's (%d)", fn,
                         (int) mc.vocab, (int) V);
    size_t plen = prompt ? strlen(prompt) : 0;
    const size_t cap = plen + (size_t) n + 1;
    int32_t *ctx = malloc(cap * sizeof *ctx);
    int32_t *order = malloc((size_t) V * sizeof *order);
    double *prob = malloc((size_t) V * sizeof *prob);
    if (!ctx || !order || !prob) {
        free(ctx);
        free(order);
        free(prob);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    size_t len = 0;
    if (plen) {
        st = lowp_data_encode(data, prompt, plen, ctx);
        len = plen;
    } else {
        ctx[0] = 0;
        for (int32_t v = 0; v < V; v++)
            if (symbols[v] == '\n') ctx[0] = v;
        len = 1;
    }
    lowp_model_run run;
    memset(&run, 0, sizeof run);
    run.threads = cfg->threads;
    for (int32_t i = 0; i < n && st == LOWP_OK; i++) {
        const size_t T = len < (size_t) mc.seq_len ? len : (size_t) mc.seq_len;
        const int32_t *window = ctx + (len - T);
        float unused;
        st = lowp_model_forward(model, window, NULL, 1, (int32_t) T, &run, &unused);
        const float *logits = NULL;
        if (st == LOWP_OK) st = lowp_model_logits(model, &logits);
        if (st != LOWP_OK) break;
        const uint64_t w = 2 * (uint64_t) i;
        const uint64_t r = ((uint64_t) lowp_philox_word(cfg->seed, w) << 21) ^
                           (uint64_t) lowp_philox_word(cfg->seed, w + 1);
        const double u = (double) (r & ((1ull << 53) - 1)) / 9007199254740992.0;
        const int32_t next =
            pick(logits + (T - 1) * (size_t) V, V, cfg->temperature, cfg->top_k, u, order, prob);
        ctx[len++] = next;
        out[i] = (char) symbols[next];
    }
    if (st == LOWP_OK) out[n] = '\0';
    free(ctx);
    free(order);
    free(prob);
    return st;
}
