/* The counter-based random generator: Philox4x32-10 (Salmon et al., SC'11; the generator of
 * CUDA's curand and PyTorch), the single source of random bits in lowp. Implemented in
 * src/core/rng.c (the block function itself is src/core/philox.h, which the kernels inline); the
 * named states that training draws from are rng_tracker.h.
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

#ifdef __cplusplus
}
#endif
#endif
