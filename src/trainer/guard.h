/* The divergence guard (guard.c owns it): the checks the training loop (trainer.c) and
 * checkpoint loading (checkpoint.c) run on the trainer's state and losses. Not installed. */
#ifndef LOWP_TRAINER_GUARD_H
#define LOWP_TRAINER_GUARD_H

#include "core/internal.h"
#include "lowp/trainer.h"

/* LOWP_ERR_DIVERGED (message starting with `fn`, naming the tensor) when
 * a weight, an Adam moment or an FP8 delayed-scaling value is not finite (or a second moment
 * is negative); pulls the FP8 state from its device first. */
LOWP_HIDDEN lowp_status lowp_trainer_state_check(lowp_trainer *t, const char *fn);
/* LOWP_ERR_DIVERGED when the loss of the update about to be applied is
 * not finite. */
LOWP_HIDDEN lowp_status lowp_trainer_guard_loss(const lowp_trainer *t, float loss);
/* Counts consecutive skipped updates (call after t->step++);
 * LOWP_ERR_DIVERGED when the streak reaches cfg.max_skipped. */
LOWP_HIDDEN lowp_status lowp_trainer_guard_skips(lowp_trainer *t, int skipped);

#endif
