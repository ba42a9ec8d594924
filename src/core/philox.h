/* Inline Philox4x32-10 for kernels that draw random words per element. */
#ifndef LOWP_PHILOX_H
#define LOWP_PHILOX_H

#include <stdint.h>

#define LOWP_PHILOX_M0 0xD2511F53u
#define LOWP_PHILOX_M1 0xCD9E8D57u
#define LOWP_PHILOX_W0 0x9E3779B9u
#define LOWP_PHILOX_W1 0xBB67AE85u

static inline void lowp_philox_block(const uint32_t ctr[4], const uint32_t key[2],
                                     uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t) LOWP_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t) LOWP_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t) (p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t) (p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t) p1;
        c3 = (uint32_t) p0;
        c0 = n0;
        c2 = n2;
        k0 += LOWP_PHILOX_W0;
        k1 += LOWP_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Word j of stream `seed` (rng.h): lane j % 4 of block j / 4. */
static inline uint32_t lowp_philox_word(uint64_t seed, uint64_t j) {
    uint64_t b = j >> 2;
    uint32_t ctr[4] = {(uint32_t) b, (uint32_t) (b >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t) seed, (uint32_t) (seed >> 32)};
    uint32_t out[4];
    lowp_philox_block(ctr, key, out);
    return out[j & 3];
}

#endif
