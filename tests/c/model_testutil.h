/* Helpers shared by the model tests (test_model.c, test_dense.c): token ids, parameter sizes,
 * zeroed gradients, the loss of a forward (binary32 and binary64). */
#ifndef LOWP_MODEL_TESTUTIL_H
#define LOWP_MODEL_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "lowp/model.h"
#include "lowp/train.h"
#include "model/model_internal.h"
#include "testutil.h"

/* Deterministic pseudo-random ids in [0, V). */
static inline void fill_ids(int32_t *ids, int64_t n, int32_t V, uint64_t seed) {
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t) ((s >> 33) % (uint64_t) V);
    }
}

static inline int64_t numel(const lowp_param *p) {
    return (p->groups > 0 ? p->groups : 1) * p->rows * p->cols;
}

static inline void zero_grads(lowp_param *ps, int32_t n) {
    for (int32_t i = 0; i < n; i++) memset(ps[i].grad, 0, (size_t) numel(&ps[i]) * sizeof(float));
}

static inline float loss_of(lowp_moe *m, const int32_t *tok, const int32_t *tgt, int32_t B,
                            int32_t T, const lowp_moe_run *run) {
    float loss = NAN;
    lowp_status st = lowp_moe_forward(m, tok, tgt, B, T, run, &loss);
    if (st != LOWP_OK) CHECKF(st == LOWP_OK, "forward: %s", lowp_last_error());
    return loss;
}

/* The same loss in binary64, for finite differences. */
static inline double loss64(lowp_moe *m, const int32_t *tok, const int32_t *tgt, int32_t B,
                            int32_t T, const lowp_moe_run *run) {
    loss_of(m, tok, tgt, B, T, run);
    return model_loss_f64(m);
}

#endif
