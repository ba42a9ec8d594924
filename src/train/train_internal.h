/* The training layer's internal interface: what lowp_train_prepare attaches to a parameter.
 * Shared by the linear layers (linear.c), prepare/convert (wrap.c) and the extra-state
 * checkpoint (extra_state.c). */
#ifndef LOWP_TRAIN_INTERNAL_H
#define LOWP_TRAIN_INTERNAL_H

#include "core/internal.h"
#include "lowp/checkpoint.h"
#include "lowp/train.h"

struct lowp_wrap {
    lowp_linear_cfg cfg;  /* from the recipe rule that matched */
    char cfg_name[32];
    lowp_fp8_state *fp8;  /* delayed-scaling state, NULL when no operand is delayed */
    lowp_wrap_stats stats;
    /* The linear layer's cached quantized weight copies live here too (linear.c). */
    void *cache;
};

#endif
