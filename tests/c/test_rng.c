/* Philox4x32-10 against the Random123 known-answer vectors, and the word-stream contract of
 * rng.h (word j = lane j % 4 of block j / 4, offsets compose). */
#include <string.h>

#include "lowp/rng.h"
#include "testutil.h"

static void kat(const uint32_t ctr[4], const uint32_t key[2], const uint32_t want[4]) {
    uint32_t out[4];
    CHECK(lowp_philox4x32_10(ctr, key, out) == LOWP_OK);
    CHECKF(memcmp(out, want, sizeof out) == 0, "got %08x %08x %08x %08x", out[0], out[1], out[2],
           out[3]);
}

int main(void) {
    /* Random123 kat_vectors, philox4x32 10 rounds. */
    const uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    const uint32_t w0[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    const uint32_t c1[4] = {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff};
    const uint32_t k1[2] = {0xffffffff, 0xffffffff};
    const uint32_t w1[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
    const uint32_t c2[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    const uint32_t k2[2] = {0xa4093822, 0x299f31d0};
    const uint32_t w2[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
    kat(c0, k0, w0);
    kat(c1, k1, w1);
    kat(c2, k2, w2);

    /* Stream: words 0..3 of seed 0 are the first KAT block; seed splits into the key. */
    uint32_t s[8];
    CHECK(lowp_philox_fill(0, 0, s, 8) == LOWP_OK);
    CHECK(memcmp(s, w0, sizeof w0) == 0);
    uint32_t blk1[4];
    const uint32_t ctr1[4] = {1, 0, 0, 0};
    lowp_philox4x32_10(ctr1, k0, blk1);
    CHECK(memcmp(s + 4, blk1, sizeof blk1) == 0);
    uint64_t seed = ((uint64_t) k2[1] << 32) | k2[0];
    /* A block index that uses the counter's high word (word index = block * 4 < 2^64). */
    uint64_t block = ((uint64_t) (c2[1] & 0x3FFFFFFFu) << 32) | c2[0];
    const uint32_t ctr_hi[4] = {c2[0], c2[1] & 0x3FFFFFFFu, 0, 0};
    uint32_t want_hi[4], got_hi[4];
    lowp_philox4x32_10(ctr_hi, k2, want_hi);
    CHECK(lowp_philox_fill(seed, block * 4, got_hi, 4) == LOWP_OK);
    CHECK(memcmp(got_hi, want_hi, sizeof got_hi) == 0);

    /* Offsets compose: fill(offset=3, n=5) is words 3..7 of fill(0, 8). */
    uint32_t t[5];
    lowp_philox_fill(0, 3, t, 5);
    CHECK(memcmp(t, s + 3, sizeof t) == 0);
    /* Different seeds give different words. */
    uint32_t u[8];
    lowp_philox_fill(1, 0, u, 8);
    CHECK(memcmp(u, s, sizeof u) != 0);

    /* Every start lane and length (the fill computes a block once for up to four words):
     * word j is lane j % 4 of the KAT-checked block function at counter j / 4. */
    for (uint64_t off = 0; off < 9; off++)
        for (size_t n = 1; n <= 13; n++) {
            uint32_t got[13];
            CHECK(lowp_philox_fill(seed, off, got, n) == LOWP_OK);
            for (size_t i = 0; i < n; i++) {
                const uint64_t j = off + i;
                const uint32_t ctr[4] = {(uint32_t) (j >> 2), 0, 0, 0};
                uint32_t blk[4];
                lowp_philox4x32_10(ctr, k2, blk);
                CHECKF(got[i] == blk[j & 3], "offset %llu, n %zu, word %zu",
                       (unsigned long long) off, n, i);
            }
        }

    /* Bad arguments. */
    CHECK(lowp_philox_fill(0, 0, NULL, 4) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "out") != NULL);
    CHECK(lowp_philox_fill(0, 0, NULL, 0) == LOWP_OK);
    CHECK(lowp_philox4x32_10(NULL, k0, s) == LOWP_ERR_INVALID_ARG);
    return testutil_finish();
}
