/* Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
 * SC'11) and the word stream of rng.h. The round function is written out from the paper's
 * definition; the known-answer vectors of the Random123 distribution are checked in
 * tests/c/test_rng.c. */
#include "lowp/rng.h"

#include "internal.h"
#include "philox.h"

lowp_status lowp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    LOWP_CHECK_PTR("lowp_philox4x32_10", ctr);
    LOWP_CHECK_PTR("lowp_philox4x32_10", key);
    LOWP_CHECK_PTR("lowp_philox4x32_10", out);
    lowp_philox_block(ctr, key, out);
    return LOWP_OK;
}

lowp_status lowp_philox_fill(uint64_t seed, uint64_t offset, uint32_t *out, size_t n) {
    if (n == 0) return LOWP_OK;
    LOWP_CHECK_PTR("lowp_philox_fill", out);
    /* One Philox block gives four consecutive words (lanes 0..3 of block j / 4): compute each
     * block once, not once per word. */
    const uint32_t key[2] = {(uint32_t) seed, (uint32_t) (seed >> 32)};
    size_t i = 0;
    while (i < n) {
        const uint64_t j = offset + i, b = j >> 2;
        const uint32_t ctr[4] = {(uint32_t) b, (uint32_t) (b >> 32), 0, 0};
        uint32_t blk[4];
        lowp_philox_block(ctr, key, blk);
        for (unsigned lane = (unsigned) (j & 3); lane < 4 && i < n; lane++) out[i++] = blk[lane];
    }
    return LOWP_OK;
}
