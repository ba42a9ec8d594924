/* Character-level text data for the trainer (trainer.h): the byte vocabulary, the 90/10
 * train/validation split and the batches.
 *
 * A batch is a pure function of (split, seed, index): its window starts come from Philox
 * words of the stream `seed`, numbered by the batch index. The trainer names each micro-batch
 * by a running counter, so a resumed run that restores the counter draws the very batches the
 * uninterrupted run would have drawn, without replaying anything.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/internal.h"
#include "io/fileio.h"
#include "core/philox.h"
#include "lowp/data.h"

LOWP_HIDDEN extern const unsigned char lowp_default_corpus[];
LOWP_HIDDEN extern const size_t lowp_default_corpus_len;

struct lowp_data {
    uint8_t *ids;          /* [bytes] token of every byte of the text */
    int64_t bytes, ntrain; /* the split: ids[0 .. ntrain-1] train, the rest validation */
    int32_t vocab;
    uint8_t symbols[256]; /* token -> byte */
    int16_t token[256];   /* byte -> token, -1 when absent */
    uint64_t hash;
    char *name;
};

static uint64_t fnv1a64(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

lowp_status lowp_data_from_text(const void *text, size_t len, const char *name, lowp_data **out) {
    const char *fn = "lowp_data_from_text";
    LOWP_CHECK_PTR(fn, out);
    *out = NULL;
    if (len > 0) LOWP_CHECK_PTR(fn, text);
    /* Both splits need at least two tokens (one input, one target). */
    if (len < 20)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: %s has %zu bytes; at least 20 are needed (90%% train, 10%% "
                         "validation, two tokens each at the least)",
                         fn, name ? name : "the text", len);
    lowp_data *d = calloc(1, sizeof *d);
    if (!d) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    d->ids = malloc(len);
    d->name = strdup(name ? name : "text");
    if (!d->ids || !d->name) {
        lowp_data_free(d);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: no memory for %zu bytes", fn, len);
    }
    const unsigned char *s = text;
    int present[256] = {0};
    for (size_t i = 0; i < len; i++) present[s[i]] = 1;
    for (int b = 0; b < 256; b++) {
        d->token[b] = -1;
        if (present[b]) {
            d->token[b] = (int16_t) d->vocab;
            d->symbols[d->vocab++] = (uint8_t) b;
        }
    }
    for (size_t i = 0; i < len; i++) d->ids[i] = (uint8_t) d->token[s[i]];
    d->bytes = (int64_t) len;
    d->ntrain = (int64_t) (len / 10 * 9 + (len % 10) * 9 / 10);
    d->hash = fnv1a64(s, len);
    *out = d;
    return LOWP_OK;
}

lowp_status lowp_data_from_file(const char *path, lowp_data **out) {
    const char *fn = "lowp_data_from_file";
    LOWP_CHECK_PTR(fn, path);
    LOWP_CHECK_PTR(fn, out);
    *out = NULL;
    unsigned char *buf;
    size_t len;
    lowp_status st = lowp_file_read_all(fn, path, &buf, &len);
    if (st != LOWP_OK) return st;
    st = lowp_data_from_text(buf, len, path, out);
    free(buf);
    return st;
}

lowp_status lowp_data_default(lowp_data **out) {
    return lowp_data_from_text(lowp_default_corpus, lowp_default_corpus_len, "built-in", out);
}

void lowp_data_free(lowp_data *d) {
    if (!d) return;
    free(d->ids);
    free(d->name);
    free(d);
}

lowp_status lowp_data_get_info(const lowp_data *d, lowp_data_info *out) {
    LOWP_CHECK_PTR("lowp_data_get_info", d);
    LOWP_CHECK_PTR("lowp_data_get_info", out);
    out->name = d->name;
    out->vocab = d->vocab;
    out->bytes = d->bytes;
    out->train_tokens = d->ntrain;
    out->val_tokens = d->bytes - d->ntrain;
    out->hash = d->hash;
    return LOWP_OK;
}

lowp_status lowp_data_vocab(const lowp_data *d, const uint8_t **symbols, int32_t *vocab) {
    LOWP_CHECK_PTR("lowp_data_vocab", d);
    if (symbols) *symbols = d->symbols;
    if (vocab) *vocab = d->vocab;
    return LOWP_OK;
}

lowp_status lowp_data_encode(const lowp_data *d, const char *text, size_t len, int32_t *tokens) {
    LOWP_CHECK_PTR("lowp_data_encode", d);
    if (len == 0) return LOWP_OK;
    LOWP_CHECK_PTR("lowp_data_encode", text);
    LOWP_CHECK_PTR("lowp_data_encode", tokens);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char) text[i];
        if (d->token[c] < 0)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "lowp_data_encode: byte %zu (0x%02x '%c') is not in the vocabulary "
                             "of %s",
                             i, c, (c >= 0x20 && c < 0x7f) ? c : '?', d->name);
        tokens[i] = d->token[c];
    }
    return LOWP_OK;
}

lowp_status lowp_data_decode(const lowp_data *d, const int32_t *tokens, size_t n, char *text) {
    LOWP_CHECK_PTR("lowp_data_decode", d);
    if (n == 0) return LOWP_OK;
    LOWP_CHECK_PTR("lowp_data_decode", tokens);
    LOWP_CHECK_PTR("lowp_data_decode", text);
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= d->vocab)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "lowp_data_decode: tokens[%zu] (%d) is not in [0, %d)", i,
                             (int) tokens[i], (int) d->vocab);
        text[i] = (char) d->symbols[tokens[i]];
    }
    return LOWP_OK;
}

lowp_status lowp_data_batch(const lowp_data *d, lowp_split split, uint64_t seed, uint64_t index,
                            int32_t B, int32_t T, int32_t *tokens, int32_t *targets) {
    const char *fn = "lowp_data_batch";
    LOWP_CHECK_PTR(fn, d);
    LOWP_CHECK_PTR(fn, tokens);
    LOWP_CHECK_PTR(fn, targets);
    if (split != LOWP_SPLIT_TRAIN && split != LOWP_SPLIT_VAL)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: split (%d) is not a lowp_split", fn,
                         (int) split);
    if (B <= 0 || T <= 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: B (%d) and T (%d) must be positive", fn,
                         (int) B, (int) T);
    const uint8_t *base = split == LOWP_SPLIT_TRAIN ? d->ids : d->ids + d->ntrain;
    int64_t n = split == LOWP_SPLIT_TRAIN ? d->ntrain : d->bytes - d->ntrain;
    if (n < (int64_t) T + 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: the %s split of %s has %lld tokens, fewer than T + 1 (%d): use a "
                         "shorter sequence or more text",
                         fn, split == LOWP_SPLIT_TRAIN ? "training" : "validation", d->name,
                         (long long) n, (int) T + 1);
    uint64_t key = split == LOWP_SPLIT_TRAIN ? seed : seed ^ LOWP_DATA_VAL_KEY;
    uint64_t starts = (uint64_t) (n - T); /* windows of T + 1 tokens that fit */
    for (int32_t b = 0; b < B; b++) {
        uint64_t w = 2 * (index * (uint64_t) B + (uint64_t) b);
        uint64_t r =
            (uint64_t) lowp_philox_word(key, w) | ((uint64_t) lowp_philox_word(key, w + 1) << 32);
        /* The modulo bias is below 2^-40 for any text that fits in memory. */
        const uint8_t *src = base + (r % starts);
        int32_t *tk = tokens + (size_t) b * (size_t) T;
        int32_t *tg = targets + (size_t) b * (size_t) T;
        for (int32_t t = 0; t < T; t++) {
            tk[t] = src[t];
            tg[t] = src[t + 1];
        }
    }
    return LOWP_OK;
}

lowp_status lowp_data_check_seq_len(const lowp_data *d, int32_t T) {
    LOWP_CHECK_PTR("lowp_data_check_seq_len", d);
    const int64_t ntrain = d->ntrain, nval = d->bytes - d->ntrain;
    if (T > 0 && ntrain >= (int64_t) T + 1 && nval >= (int64_t) T + 1) return LOWP_OK;
    return lowp_fail(LOWP_ERR_INVALID_ARG,
                     "lowp_data_check_seq_len: %s is too short for sequences of %d tokens: the "
                     "training split has %lld tokens and the validation split %lld, and each "
                     "needs T + 1",
                     d->name, (int) T, (long long) ntrain, (long long) nval);
}
