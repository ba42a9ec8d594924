/* Delayed scaling (docs/numerics.md section 5; TransformerEngine's DelayedScaling): a
 * tensorwise scale derived from a history of past amaxes, updated once per step. Implemented
 * in src/core/delayed.c; the per-module state of the training layer is lowp_fp8_state
 * (train.h).
 *
 *   float hist[16];
 *   lowp_delayed_cfg dc;
 *   lowp_delayed_cfg_init(&dc, LOWP_FORMAT_E4M3);
 *   dc.history_len = 16;
 *   lowp_delayed_state st;
 *   lowp_delayed_init(&st, &dc, hist);
 *   lowp_delayed_record(&st, amax);   // every quantization of the step
 *   lowp_delayed_update(&st);         // once per step: new st.scale, st.scale_inv
 */
#ifndef LOWP_DELAYED_H
#define LOWP_DELAYED_H

#include <stdint.h>

#include "format.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lowp_amax_algo {
    LOWP_AMAX_ALGO_MAX = 0,         /* max over the whole history */
    LOWP_AMAX_ALGO_MOST_RECENT = 1, /* row 0 */
} lowp_amax_algo;

/* The longest amax history a configuration may ask for. */
#define LOWP_DELAYED_MAX_HISTORY (1 << 20)

typedef struct lowp_delayed_cfg {
    lowp_format format;  /* E4M3 or E5M2: fmax */
    int32_t history_len; /* 1 to LOWP_DELAYED_MAX_HISTORY, default 1024 */
    float margin;        /* default 0 */
    lowp_amax_algo algo; /* default MAX */
} lowp_delayed_cfg;

/* State of one quantized tensor role. The caller owns `history` (history_len floats). */
typedef struct lowp_delayed_state {
    lowp_delayed_cfg cfg;
    float *history; /* row 0 is the staging slot the current step writes */
    float scale;
    float scale_inv;
} lowp_delayed_state;

LOWP_API lowp_status lowp_delayed_cfg_init(lowp_delayed_cfg *cfg, lowp_format format);
/* Zero the history, scale = scale_inv = 1. */
LOWP_API lowp_status lowp_delayed_init(lowp_delayed_state *st, const lowp_delayed_cfg *cfg,
                                       float *history);
/* Record this step's amax into row 0 (keeps the max of what row 0 holds; NaN sticks). */
LOWP_API lowp_status lowp_delayed_record(lowp_delayed_state *st, float amax);
/* The update of docs/numerics.md section 5 (after amaxes are recorded and reduced). */
LOWP_API lowp_status lowp_delayed_update(lowp_delayed_state *st);

#ifdef __cplusplus
}
#endif
#endif
