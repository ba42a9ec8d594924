/* The trainer's guard against divergence: a run stops with LOWP_ERR_DIVERGED
 * on a non-finite loss or after cfg.max_skipped consecutive updates skipped for a non-finite
 * gradient, and a checkpoint is never written from a state that holds a non-finite weight,
 * Adam moment (or a negative second moment), or FP8 delayed-scaling value (amax history,
 * scale). Called by the loop (trainer.c) and by the checkpoint save (checkpoint_train.c).
 */
#include <math.h>
#include <stdio.h>

#include "trainer/guard.h"
#include "trainer/trainer_internal.h"
#include "train/train_internal.h"

/* The index of the first element of v[0..n-1] that is not finite (or, with `nonneg`, below 0),
 * or -1. */
static int64_t first_bad(const float *v, int64_t n, int nonneg) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]) || (nonneg && v[i] < 0.0f)) return i;
    return -1;
}

static lowp_status bad_value(const char *fn, const char *what, const char *name, int64_t i,
                             float x) {
    return lowp_fail(LOWP_ERR_DIVERGED,
                     "%s: %s of '%s' holds %g at element %lld: the run diverged (no checkpoint "
                     "is written from a non-finite state)",
                     fn, what, name, (double) x, (long long) i);
}

lowp_status lowp_trainer_state_check(lowp_trainer *t, const char *fn) {
    for (int32_t i = 0; i < t->n; i++) {
        lowp_param *p = &t->params[i];
        const int64_t cnt = lowp_param_numel(p);
        int64_t k = first_bad(p->data, cnt, 0);
        if (k >= 0) return bad_value(fn, "the weight", p->name, k, p->data[k]);
        float *m, *v;
        if (lowp_adamw_moments(t->opt, i, &m, &v, NULL) == LOWP_OK) {
            if ((k = first_bad(m, cnt, 0)) >= 0)
                return bad_value(fn, "the Adam first moment", p->name, k, m[k]);
            if ((k = first_bad(v, cnt, 1)) >= 0)
                return bad_value(fn, "the Adam second moment", p->name, k, v[k]);
        }
        if (!p->wrap || !p->wrap->fp8) continue;
        lowp_fp8_state *s = p->wrap->fp8;
        lowp_status st = lowp_fp8_state_pull(s);
        if (st != LOWP_OK) return st;
        for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
            const lowp_delayed_state *d = &s->roles[r];
            if (!isfinite(d->scale) || !isfinite(d->scale_inv))
                return bad_value(fn, "the FP8 scale", p->name, r, d->scale);
            if (d->history && (k = first_bad(d->history, s->history_len, 1)) >= 0)
                return bad_value(fn, "the FP8 amax history", p->name, k, d->history[k]);
        }
    }
    return LOWP_OK;
}

lowp_status lowp_trainer_guard_loss(const lowp_trainer *t, float loss) {
    if (isfinite(loss)) return LOWP_OK;
    return lowp_fail(LOWP_ERR_DIVERGED,
                     "lowp_trainer_step: the loss is %g at step %lld: training diverged (the "
                     "update was not applied; lower the learning rate)",
                     (double) loss, (long long) t->step + 1);
}

lowp_status lowp_trainer_guard_skips(lowp_trainer *t, int skipped) {
    t->skipped_run = skipped ? t->skipped_run + 1 : 0;
    if (t->cfg.max_skipped == 0 || t->skipped_run < t->cfg.max_skipped) return LOWP_OK;
    return lowp_fail(LOWP_ERR_DIVERGED,
                     "lowp_trainer_step: %d consecutive updates skipped for a non-finite "
                     "gradient (steps %lld to %lld; cfg.max_skipped %d): training diverged "
                     "(lower the learning rate)",
                     (int) t->skipped_run, (long long) (t->step - t->skipped_run + 1),
                     (long long) t->step, (int) t->cfg.max_skipped);
}
