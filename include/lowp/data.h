/* Text data for training: a byte-level vocabulary, a 90/10 train/validation split, and
 * batches drawn from a seed through Philox. Implemented in src/data/ (data.c; the built-in
 * corpus in default_corpus.c).
 *
 *   lowp_data *data;
 *   lowp_data_from_file("input.txt", &data);       // or lowp_data_default(&data)
 *   lowp_data_info di;
 *   lowp_data_get_info(data, &di);                 // di.vocab sizes the model
 *   lowp_data_batch(data, LOWP_SPLIT_TRAIN, seed, step, B, T, tokens, targets);
 *   lowp_data_free(data);
 */
#ifndef LOWP_DATA_H
#define LOWP_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Text data: a byte-level vocabulary and a 90/10 train/validation split ----
 *
 * The vocabulary is the sorted set of distinct bytes of the text (token i is the i-th
 * smallest byte value present), so "character level" means byte level: UTF-8 text trains
 * fine, a multi-byte character being several tokens. The first 90% of the bytes (rounded
 * down) are the training split, the rest the validation split. */

typedef struct lowp_data lowp_data;

typedef enum lowp_split { LOWP_SPLIT_TRAIN = 0, LOWP_SPLIT_VAL = 1 } lowp_split;

/* From text in memory (copied), from a file, or from the built-in corpus (a few tens of KB of
 * English prose compiled into the library, so that training needs nothing else). */
LOWP_API lowp_status lowp_data_from_text(const void *text, size_t len, const char *name,
                                         lowp_data **out);
LOWP_API lowp_status lowp_data_from_file(const char *path, lowp_data **out);
LOWP_API lowp_status lowp_data_default(lowp_data **out);
LOWP_API void lowp_data_free(lowp_data *data);

typedef struct lowp_data_info {
    const char *name;     /* the file path, "built-in" or the name given; valid with the data */
    int32_t vocab;        /* distinct bytes, 1 to 256 */
    int64_t bytes;        /* tokens in all */
    int64_t train_tokens; /* bytes * 9 / 10 */
    int64_t val_tokens;   /* the rest */
    uint64_t hash;        /* FNV-1a 64 of the text: checkpoints refuse other data */
} lowp_data_info;
LOWP_API lowp_status lowp_data_get_info(const lowp_data *data, lowp_data_info *out);
/* LOWP_OK when both splits hold a window of seq_len + 1 tokens; else LOWP_ERR_INVALID_ARG with
 * a message that names the data and both split sizes. Cheap: call it before building a model. */
LOWP_API lowp_status lowp_data_check_seq_len(const lowp_data *data, int32_t seq_len);

/* The vocabulary: symbols[i] is the byte of token i, for i < vocab. */
LOWP_API lowp_status lowp_data_vocab(const lowp_data *data, const uint8_t **symbols,
                                     int32_t *vocab);
/* Bytes -> tokens (a byte outside the vocabulary is an error naming it) and back. */
LOWP_API lowp_status lowp_data_encode(const lowp_data *data, const char *text, size_t len,
                                      int32_t *tokens);
LOWP_API lowp_status lowp_data_decode(const lowp_data *data, const int32_t *tokens, size_t n,
                                      char *text);

/* Batch `index` of the stream (split, seed): B windows of T + 1 tokens of the split, window b
 * starting at a uniform position drawn from Philox words 2 (index B + b) and 2 (index B + b)
 * + 1 of stream seed (train) or seed ^ LOWP_DATA_VAL_KEY (validation). tokens [B, T] are the
 * windows' first T tokens and targets [B, T] the next ones. The split must hold T + 1 tokens. */
#define LOWP_DATA_VAL_KEY 0x76616c6964617465ull
LOWP_API lowp_status lowp_data_batch(const lowp_data *data, lowp_split split, uint64_t seed,
                                     uint64_t index, int32_t B, int32_t T, int32_t *tokens,
                                     int32_t *targets);

#ifdef __cplusplus
}
#endif
#endif
