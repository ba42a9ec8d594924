/* Where a training step's time goes: wall-clock seconds per phase, summed by the library while
 * profiling is on (off by default; a disabled mark costs one load and a branch).
 *
 *   lowp_profile_enable(1);
 *   lowp_profile_reset();
 *   ... lowp_trainer_step(t, &rep) ...
 *   double s[LOWP_PHASE_COUNT];
 *   lowp_profile_read(s);                        // s[LOWP_PHASE_GEMM] = seconds in GEMMs
 *   printf("%s\n", lowp_phase_name(LOWP_PHASE_GEMM));
 *
 * Phases nest: a region's time goes to the innermost phase open on the calling thread (the
 * GEMMs inside attention's projections count as GEMM, the attention core as attention). Only
 * the thread that calls into the library marks phases; time inside the library's OpenMP
 * regions counts to the phase that opened them. Process-wide: profile one run at a time. */
#ifndef LOWP_PROFILE_H
#define LOWP_PROFILE_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lowp_phase {
    LOWP_PHASE_OTHER = 0,   /* unmarked time inside a marked region's caller */
    LOWP_PHASE_GEMM,        /* lowp_gemm / grouped GEMMs of the linear layers */
    LOWP_PHASE_QUANT,       /* quantization, BF16 rounding and transposes of GEMM operands */
    LOWP_PHASE_ATTENTION,   /* the attention core: scores, softmax, weighted values, RoPE */
    LOWP_PHASE_ELEMENTWISE, /* norms, activations, routing, residuals, embedding, loss */
    LOWP_PHASE_OPTIMIZER,   /* gradient zeroing and clipping, AdamW, lowp_train_step_end */
    LOWP_PHASE_DATA,        /* batch sampling */
    LOWP_PHASE_COUNT
} lowp_phase;

/* on: 1 to start summing, 0 to stop (the sums are kept). */
LOWP_API void lowp_profile_enable(int on);
LOWP_API void lowp_profile_reset(void);
/* secs [LOWP_PHASE_COUNT] [out]: seconds per phase since the last reset. */
LOWP_API lowp_status lowp_profile_read(double *secs);
/* "gemm", "quant", ...; NULL for a value out of range. */
LOWP_API const char *lowp_phase_name(lowp_phase phase);

#ifdef __cplusplus
}
#endif
#endif
