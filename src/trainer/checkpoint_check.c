/* The integrity of training checkpoints: checksums written with every save
 * and verified before a load changes anything, and range checks of every value a checkpoint
 * carries. The checkpoint format (trainer.h) version 2:
 *
 *   __metadata__ "crc32c.NAME"          CRC-32C (src/io/crc32c.h) of tensor NAME's bytes, as 8
 *                                       lower-case hex digits, for every tensor of the file
 *   __metadata__ "crc32c.__metadata__"  CRC-32C over every other metadata entry, in bytewise
 *                                       key order, each as KEY 0x00 VALUE 0x00
 *
 * A flipped bit anywhere in a tensor or an edited setting fails with LOWP_ERR_CORRUPT naming the
 * tensor or "the metadata". Version 1 files (no checksums; only the test suites ever wrote
 * them, no release did) are refused with LOWP_ERR_VERSION. Values: weights and first moments
 * must be finite, second moments finite and >= 0; train.* settings must be ones
 * lowp_trainer_create accepts; the step, optimizer t and data position consistent.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/crc32c.h"
#include "checkpoint_check.h"

#define META_CRC_KEY "crc32c.__metadata__"

uint32_t lowp_ckpt_tensor_crc(const lowp_st_tensor *t) {
    size_t n = 0;
    if (lowp_st_tensor_nbytes(t, &n) != LOWP_OK) n = 0;
    return lowp_crc32c(0, t->data, n);
}

static int by_key(const void *a, const void *b) {
    return strcmp((*(const lowp_st_meta *const *) a)->key, (*(const lowp_st_meta *const *) b)->key);
}

lowp_status lowp_ckpt_meta_crc(const lowp_st_meta *m, int32_t n, uint32_t *crc) {
    const lowp_st_meta **order = malloc((size_t) (n + 1) * sizeof *order);
    if (!order) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "checkpoint metadata checksum");
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++)
        if (strcmp(m[i].key, META_CRC_KEY) != 0) order[k++] = &m[i];
    qsort(order, (size_t) k, sizeof *order, by_key);
    uint32_t c = 0;
    for (int32_t i = 0; i < k; i++) {
        c = lowp_crc32c(c, order[i]->key, strlen(order[i]->key) + 1);
        c = lowp_crc32c(c, order[i]->value, strlen(order[i]->value) + 1);
    }
    free(order);
    *crc = c;
    return LOWP_OK;
}

static lowp_status stored_crc(const lowp_safetensors *f, const char *path, const char *key,
                              uint32_t *out) {
    const char *v;
    if (lowp_safetensors_meta(f, key, &v) != LOWP_OK)
        return lowp_fail(LOWP_ERR_CORRUPT, "checkpoint %s: the checksum '%s' is missing", path,
                         key);
    char *end;
    unsigned long x = strtoul(v, &end, 16);
    if (strlen(v) != 8 || *end || x > 0xFFFFFFFFul)
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "checkpoint %s: the checksum '%s' ('%.20s') is not 8 hex "
                         "digits",
                         path, key, v);
    *out = (uint32_t) x;
    return LOWP_OK;
}

lowp_status lowp_ckpt_verify(const lowp_safetensors *f, const char *path) {
    int32_t nt = 0, nm = 0;
    lowp_status st = lowp_safetensors_count(f, &nt, &nm);
    if (st != LOWP_OK) return st;
    lowp_st_meta *m = malloc((size_t) (nm + 1) * sizeof *m);
    if (!m) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "checkpoint %s: out of memory", path);
    for (int32_t i = 0; i < nm && st == LOWP_OK; i++)
        st = lowp_safetensors_meta_at(f, i, &m[i].key, &m[i].value);
    uint32_t want = 0, got = 0;
    if (st == LOWP_OK) st = stored_crc(f, path, META_CRC_KEY, &want);
    if (st == LOWP_OK) st = lowp_ckpt_meta_crc(m, nm, &got);
    free(m);
    if (st != LOWP_OK) return st;
    if (got != want)
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "checkpoint %s: the metadata fails its CRC-32C check (stored %08" PRIx32
                         ", computed %08" PRIx32 "): a setting was changed or damaged",
                         path, want, got);
    for (int32_t i = 0; i < nt; i++) {
        lowp_st_tensor t;
        if ((st = lowp_safetensors_tensor(f, i, &t)) != LOWP_OK) return st;
        char key[LOWP_CKPT_KEYLEN];
        if (snprintf(key, sizeof key, "crc32c.%s", t.name) >= (int) sizeof key)
            return lowp_fail(LOWP_ERR_CORRUPT, "checkpoint %s: tensor name '%.40s...' too long",
                             path, t.name);
        if ((st = stored_crc(f, path, key, &want)) != LOWP_OK) return st;
        if ((got = lowp_ckpt_tensor_crc(&t)) != want)
            return lowp_fail(LOWP_ERR_CORRUPT,
                             "checkpoint %s: tensor '%s' fails its CRC-32C check (stored %08" PRIx32
                             ", computed %08" PRIx32 ")",
                             path, t.name, want, got);
    }
    return LOWP_OK;
}

lowp_status lowp_ckpt_check_values(const char *path, const char *name, const void *v, int64_t n,
                                   int nonneg) {
    /* A safetensors payload sits at any byte offset after its header: read through memcpy. */
    const unsigned char *b = v;
    for (int64_t i = 0; i < n; i++) {
        float x;
        memcpy(&x, b + 4 * i, sizeof x);
        if (!isfinite(x) || (nonneg && x < 0.0f))
            return lowp_fail(LOWP_ERR_CORRUPT,
                             "checkpoint %s: tensor '%s' holds %g at element %lld (%s)", path, name,
                             (double) x, (long long) i,
                             nonneg ? "second moments are finite and >= 0" : "must be finite");
    }
    return LOWP_OK;
}

lowp_status lowp_ckpt_check_info(const char *path, const lowp_checkpoint_info *info) {
    const lowp_trainer_cfg *c = &info->train;
    const struct {
        const char *key;
        double v, lo, hi;
    } ranges[] = {
        {"train.step", (double) info->step, 0, INT32_MAX},
        {"train.steps", c->steps, 1, INT32_MAX},
        {"train.batch", c->batch, 1, INT32_MAX},
        {"train.seq_len", c->seq_len, 1, INT32_MAX},
        {"train.accum", c->accum, 1, INT32_MAX},
        {"train.warmup", c->warmup, 0, INT32_MAX},
        {"train.eval_every", c->eval_every, 0, INT32_MAX},
        {"train.eval_batches", c->eval_batches, 1, INT32_MAX},
        {"train.lr", c->lr, 0, 3.4e38},
        {"train.min_lr", c->min_lr, 0, 3.4e38},
        {"train.beta1", c->adamw.beta1, 0, 0.99999999},
        {"train.beta2", c->adamw.beta2, 0, 0.99999999},
        {"train.eps", c->adamw.eps, 1e-45, 3.4e38},
        {"train.weight_decay", c->adamw.weight_decay, 0, 3.4e38},
        {"train.clip", c->clip, 0, 3.4e38},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (!(ranges[i].v >= ranges[i].lo && ranges[i].v <= ranges[i].hi))
            return lowp_fail(LOWP_ERR_CORRUPT,
                             "checkpoint %s: metadata '%s' (%.9g) is outside [%.9g, %.9g]", path,
                             ranges[i].key, ranges[i].v, ranges[i].lo, ranges[i].hi);
    return LOWP_OK;
}
