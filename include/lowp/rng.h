/* The counter-based random generator: Philox4x32-10 (Salmon et al., SC'11; the generator of
 * CUDA's curand and PyTorch), the single source of random bits in lowp.
 *
 * A stream is keyed by a 64-bit seed. Its 32-bit words are numbered 0, 1, 2, ...; word j is
 * output lane (j % 4) of Philox4x32-10 applied to the counter {lo32(j/4), hi32(j/4), 0, 0}
 * with the key {lo32(seed), hi32(seed)}. A (seed, offset) pair names the position of the next
 * word, so the same (seed, offset, element index) gives the same bits on every device.
 *
 *   uint32_t r[8];
 *   lowp_philox_fill(1234, 0, r, 8);     // words 0..7 of stream 1234
 */
#ifndef LOWP_RNG_H
#define LOWP_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One Philox4x32-10 block: out = philox(ctr, key). */
LOWP_API lowp_status lowp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                        uint32_t out[4]);

/* Words offset .. offset + n - 1 of stream `seed` into out[0 .. n-1]. */
LOWP_API lowp_status lowp_philox_fill(uint64_t seed, uint64_t offset, uint32_t *out, size_t n);

/* ---- The RNG tracker: named generator states ----
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
