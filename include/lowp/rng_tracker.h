/* The RNG tracker: named Philox generator states (rng.h), and the dropout that draws from
 * them. Implemented in src/train/rng_tracker.c.
 *
 * A tracker holds named (seed, offset) states and a current one. Random ops (dropout) draw
 * from the current state and advance its offset. fork(name) makes a named state current until
 * the matching restore: the way a tensor-parallel region gets dropout masks that agree (or
 * differ) across ranks while the default state keeps its own sequence. get/set copy every
 * state, for checkpoints and for replaying a forward during activation recomputation.
 *
 *   lowp_rng_tracker t;
 *   lowp_rng_tracker_init(&t, 1234 + rank);          // the "default" state, per rank
 *   lowp_rng_tracker_add(&t, "model-parallel", 99);  // shared by the TP ranks
 *   int32_t prev;
 *   lowp_rng_tracker_fork(&t, "model-parallel", &prev);
 *   lowp_dropout_forward(&t, x, mask, y, n, 0.1f);   // same mask on every rank
 *   lowp_rng_tracker_restore(&t, prev);
 */
#ifndef LOWP_RNG_TRACKER_H
#define LOWP_RNG_TRACKER_H

#include <stddef.h>
#include <stdint.h>

#include "rng.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOWP_RNG_MAX_STATES 16
#define LOWP_RNG_NAME_MAX   32

typedef struct lowp_rng_state {
    char name[LOWP_RNG_NAME_MAX];
    uint64_t seed;
    uint64_t offset; /* next Philox word */
} lowp_rng_state;

typedef struct lowp_rng_tracker {
    int32_t count;
    int32_t current; /* index of the current state */
    lowp_rng_state states[LOWP_RNG_MAX_STATES];
} lowp_rng_tracker;

/* One state, "default", with `seed`, current. */
LOWP_API lowp_status lowp_rng_tracker_init(lowp_rng_tracker *t, uint64_t seed);
/* Add a named state; a duplicate name or seed is refused (LOWP_ERR_INVALID_ARG). */
LOWP_API lowp_status lowp_rng_tracker_add(lowp_rng_tracker *t, const char *name, uint64_t seed);
/* Make `name` current; *prev receives the index to restore. */
LOWP_API lowp_status lowp_rng_tracker_fork(lowp_rng_tracker *t, const char *name, int32_t *prev);
LOWP_API lowp_status lowp_rng_tracker_restore(lowp_rng_tracker *t, int32_t prev);
/* Copy all states out (up to cap; *n receives the count) or in (names must match). */
LOWP_API lowp_status lowp_rng_tracker_get_states(const lowp_rng_tracker *t, lowp_rng_state *out,
                                                 int32_t cap, int32_t *n);
LOWP_API lowp_status lowp_rng_tracker_set_states(lowp_rng_tracker *t, const lowp_rng_state *in,
                                                 int32_t n);
/* Take n words from the current state (advancing its offset by n). */
LOWP_API lowp_status lowp_rng_tracker_draw(lowp_rng_tracker *t, uint32_t *out, size_t n);

/* Inverted dropout: mask[i] = 1 keeps x[i] (scaled by 1/(1-p)), 0 drops it; element i keeps
 * when its Philox word (from the tracker's current state) is >= p * 2^32. y may alias x;
 * mask may be NULL. */
LOWP_API lowp_status lowp_dropout_forward(lowp_rng_tracker *t, const float *x, uint8_t *mask,
                                          float *y, size_t n, float p);
LOWP_API lowp_status lowp_dropout_backward(const uint8_t *mask, const float *dy, float *dx,
                                           size_t n, float p);

#ifdef __cplusplus
}
#endif
#endif
