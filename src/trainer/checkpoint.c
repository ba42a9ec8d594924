/* Training checkpoints (trainer.h): the whole state of a run in one safetensors file, and the
 * resume that reproduces the uninterrupted run bit for bit.
 *
 * Numbers in __metadata__ are decimal strings (floats with 9 significant digits, which
 * round-trip binary32 exactly), one key per field, so that a person can read a checkpoint's
 * settings with any safetensors tool and a mismatch message can name the field. Loading
 * validates the whole file against the trainer before it changes anything, and restores the
 * FP8 extra state it already loaded if a later blob turns out to be corrupt.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_check.h"
#include "guard.h"
#include "trainer_internal.h"

#define KEYLEN LOWP_CKPT_KEYLEN
#define VALLEN 640 /* data.vocab: 2 hex digits per symbol, up to 256 */

/* ---- Metadata writing ---- */

typedef struct meta_list {
    lowp_st_meta *m;
    char (*k)[KEYLEN];
    char (*v)[VALLEN];
    int32_t n, cap;
} meta_list;

static int meta_add(meta_list *l, const char *key, const char *fmt, ...) LOWP_PRINTF(3, 4);

static int meta_add(meta_list *l, const char *key, const char *fmt, ...) {
    if (l->n == l->cap) return -1;
    snprintf(l->k[l->n], KEYLEN, "%s", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->v[l->n], VALLEN, fmt, ap);
    va_end(ap);
    l->m[l->n].key = l->k[l->n];
    l->m[l->n].value = l->v[l->n];
    l->n++;
    return 0;
}

/* The model configuration fields, by name (also the order of the messages). */
typedef struct cfg_field {
    const char *key;
    size_t off;
    int is_float;
} cfg_field;

#define CFG_I(name)                                                                                \
    { "config." #name, offsetof(lowp_moe_config, name), 0 }
#define CFG_F(name)                                                                                \
    { "config." #name, offsetof(lowp_moe_config, name), 1 }
static const cfg_field CONFIG_FIELDS[] = {
    CFG_I(vocab),         CFG_I(dim),        CFG_I(layers),   CFG_I(heads),
    CFG_I(seq_len),       CFG_I(experts),    CFG_I(top_k),    CFG_I(expert_hidden),
    CFG_I(shared_hidden), CFG_F(rope_theta), CFG_F(norm_eps), CFG_F(aux_loss_coef),
    CFG_F(dropout),
};
#define NCONFIG ((int) (sizeof CONFIG_FIELDS / sizeof CONFIG_FIELDS[0]))

static void hex_bytes(char *out, const uint8_t *b, int32_t n) {
    static const char H[] = "0123456789abcdef";
    for (int32_t i = 0; i < n; i++) {
        out[2 * i] = H[b[i] >> 4];
        out[2 * i + 1] = H[b[i] & 15];
    }
    out[2 * n] = '\0';
}

/* The tensors of a checkpoint: per parameter the weight, the two moments and (when wrapped)
 * the extra state of xs. names holds 3 per parameter. Returns how many. */
static int32_t save_tensors(lowp_trainer *t, const trainer_extra_state *xs, lowp_st_tensor *ts,
                            char (*names)[KEYLEN]) {
    int32_t nt = 0;
    const int32_t n = t->n;
    for (int32_t i = 0; i < n; i++) {
        const lowp_param *p = &t->params[i];
        lowp_st_tensor w = {0};
        w.dtype = LOWP_ST_F32;
        if (p->groups > 0) {
            w.ndim = 3;
            w.shape[0] = p->groups;
            w.shape[1] = p->rows;
            w.shape[2] = p->cols;
        } else {
            w.ndim = 2;
            w.shape[0] = p->rows;
            w.shape[1] = p->cols;
        }
        float *m, *v;
        lowp_adamw_moments(t->opt, i, &m, &v, NULL);
        w.name = p->name;
        w.data = p->data;
        ts[nt++] = w;
        snprintf(names[3 * i], KEYLEN, "optim.exp_avg.%s", p->name);
        snprintf(names[3 * i + 1], KEYLEN, "optim.exp_avg_sq.%s", p->name);
        w.name = names[3 * i];
        w.data = m;
        ts[nt++] = w;
        w.name = names[3 * i + 1];
        w.data = v;
        ts[nt++] = w;
        if (p->wrap) {
            snprintf(names[3 * i + 2], KEYLEN, "%s._extra_state", p->name);
            lowp_st_tensor x = {0};
            x.name = names[3 * i + 2];
            x.dtype = LOWP_ST_U8;
            x.ndim = 1;
            x.shape[0] = (int64_t) xs->len[i];
            x.data = xs->blob[i];
            ts[nt++] = x;
        }
    }

    return nt;
}

/* The settings, the run's position, the data's identity and the RNG tracker's states. */
static lowp_status save_settings(lowp_trainer *t, meta_list *ml, int *bad_out) {
    lowp_data_info di;
    lowp_data_get_info(t->data, &di);
    const uint8_t *sym;
    int32_t V;
    lowp_data_vocab(t->data, &sym, &V);
    char vocab_hex[2 * 256 + 1];
    hex_bytes(vocab_hex, sym, V);
    int64_t opt_t;
    lowp_adamw_get_t(t->opt, &opt_t);
    const lowp_trainer_cfg *c = &t->cfg;
    int bad = 0;
    bad |= meta_add(ml, "format", "%s", LOWP_TRAIN_CHECKPOINT_FORMAT);
    bad |= meta_add(ml, "format_version", "%d", LOWP_TRAIN_CHECKPOINT_VERSION);
    bad |= meta_add(ml, "lowp_version", "%s", lowp_version());
    bad |= meta_add(ml, "recipe", "%s", t->recipe.name);
    for (int f = 0; f < NCONFIG; f++) {
        const char *base = (const char *) &t->mcfg + CONFIG_FIELDS[f].off;
        if (CONFIG_FIELDS[f].is_float) {
            float x;
            memcpy(&x, base, sizeof x);
            bad |= meta_add(ml, CONFIG_FIELDS[f].key, "%.9g", (double) x);
        } else {
            int32_t x;
            memcpy(&x, base, sizeof x);
            bad |= meta_add(ml, CONFIG_FIELDS[f].key, "%d", (int) x);
        }
    }
    bad |= meta_add(ml, "model.seed", "%" PRIu64, t->model_seed);
    bad |= meta_add(ml, "train.step", "%" PRId64, t->step);
    bad |= meta_add(ml, "train.data_position", "%" PRIu64, t->data_pos);
    bad |= meta_add(ml, "train.optimizer_t", "%" PRId64, opt_t);
    bad |= meta_add(ml, "train.steps", "%d", (int) c->steps);
    bad |= meta_add(ml, "train.batch", "%d", (int) c->batch);
    bad |= meta_add(ml, "train.seq_len", "%d", (int) c->seq_len);
    bad |= meta_add(ml, "train.accum", "%d", (int) c->accum);
    bad |= meta_add(ml, "train.seed", "%" PRIu64, c->seed);
    bad |= meta_add(ml, "train.eval_seed", "%" PRIu64, c->eval_seed);
    bad |= meta_add(ml, "train.lr", "%.9g", (double) c->lr);
    bad |= meta_add(ml, "train.min_lr", "%.9g", (double) c->min_lr);
    bad |= meta_add(ml, "train.warmup", "%d", (int) c->warmup);
    bad |= meta_add(ml, "train.beta1", "%.9g", (double) c->adamw.beta1);
    bad |= meta_add(ml, "train.beta2", "%.9g", (double) c->adamw.beta2);
    bad |= meta_add(ml, "train.eps", "%.9g", (double) c->adamw.eps);
    bad |= meta_add(ml, "train.weight_decay", "%.9g", (double) c->adamw.weight_decay);
    bad |= meta_add(ml, "train.clip", "%.9g", (double) c->clip);
    bad |= meta_add(ml, "train.eval_every", "%d", (int) c->eval_every);
    bad |= meta_add(ml, "train.eval_batches", "%d", (int) c->eval_batches);
    /* The name is informational and metadata must be UTF-8: bytes outside ASCII become '?'. */
    char data_name[256];
    snprintf(data_name, sizeof data_name, "%s", di.name);
    for (char *q = data_name; *q; q++)
        if ((unsigned char) *q >= 0x80 || (unsigned char) *q < 0x20) *q = '?';
    bad |= meta_add(ml, "data.name", "%s", data_name);
    bad |= meta_add(ml, "data.bytes", "%" PRId64, di.bytes);
    bad |= meta_add(ml, "data.hash", "%016" PRIx64, di.hash);
    bad |= meta_add(ml, "data.vocab", "%s", vocab_hex);
    lowp_rng_state rs[LOWP_RNG_MAX_STATES];
    int32_t nrs = 0;
    lowp_status st = lowp_rng_tracker_get_states(&t->rng, rs, LOWP_RNG_MAX_STATES, &nrs);
    if (st != LOWP_OK) return st;
    bad |= meta_add(ml, "rng.count", "%d", (int) nrs);
    bad |= meta_add(ml, "rng.current", "%d", (int) t->rng.current);
    for (int32_t i = 0; i < nrs; i++) {
        char key[64];
        snprintf(key, sizeof key, "rng.%d.name", (int) i);
        bad |= meta_add(ml, key, "%s", rs[i].name);
        snprintf(key, sizeof key, "rng.%d.seed", (int) i);
        bad |= meta_add(ml, key, "%" PRIu64, rs[i].seed);
        snprintf(key, sizeof key, "rng.%d.offset", (int) i);
        bad |= meta_add(ml, key, "%" PRIu64, rs[i].offset);
    }
    *bad_out |= bad;
    return LOWP_OK;
}

/* The checksums (checkpoint_check.c): one per tensor, then one over all the metadata. */
static lowp_status save_checksums(const lowp_st_tensor *ts, int32_t nt, meta_list *ml,
                                  int *bad_out) {
    int bad = 0;
    for (int32_t i = 0; i < nt; i++) {
        char key[KEYLEN + 8];
        snprintf(key, sizeof key, "crc32c.%s", ts[i].name);
        bad |= meta_add(ml, key, "%08" PRIx32, lowp_ckpt_tensor_crc(&ts[i]));
    }
    uint32_t mcrc = 0;
    lowp_status st = lowp_ckpt_meta_crc(ml->m, ml->n, &mcrc);
    if (st != LOWP_OK) return st;
    bad |= meta_add(ml, "crc32c.__metadata__", "%08" PRIx32, mcrc);
    *bad_out |= bad;
    return LOWP_OK;
}

lowp_status lowp_trainer_checkpoint_save(lowp_trainer *t, const char *path) {
    const char *fn = "lowp_trainer_checkpoint_save";
    LOWP_CHECK_PTR(fn, t);
    LOWP_CHECK_PTR(fn, path);
    lowp_status st = LOWP_OK;
    const int32_t n = t->n;
    /* Per parameter: the weight, the two moments and (when wrapped) the extra state. */
    lowp_st_tensor *ts = calloc((size_t) (4 * n + 1), sizeof *ts);
    char(*names)[KEYLEN] = calloc((size_t) (3 * n + 1), sizeof *names);
    meta_list ml = {0};
    ml.cap = 64 + 3 * LOWP_RNG_MAX_STATES + 4 * n + 1; /* settings, RNG, a CRC per tensor */
    ml.m = calloc((size_t) ml.cap, sizeof *ml.m);
    ml.k = calloc((size_t) ml.cap, sizeof *ml.k);
    ml.v = calloc((size_t) ml.cap, sizeof *ml.v);
    trainer_extra_state xs;
    memset(&xs, 0, sizeof xs);
    if ((st = lowp_trainer_state_check(t, fn)) != LOWP_OK) goto done;
    if (!ts || !names || !ml.m || !ml.k || !ml.v) {
        st = lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        goto done;
    }
    if ((st = lowp_trainer_extra_state_save(t, &xs)) != LOWP_OK) goto done;
    const int32_t nt = save_tensors(t, &xs, ts, names);
    int bad = 0;
    if ((st = save_settings(t, &ml, &bad)) != LOWP_OK) goto done;
    if (!bad && (st = save_checksums(ts, nt, &ml, &bad)) != LOWP_OK) goto done;
    if (bad) {
        st = lowp_fail(LOWP_ERR_INTERNAL, "%s: too many metadata entries", fn);
        goto done;
    }
    st = lowp_safetensors_write(path, ts, nt, ml.m, ml.n);
    if (st != LOWP_OK) lowp_error_append("%s: saving the checkpoint %s", fn, path);
done:
    lowp_trainer_extra_state_free(&xs);
    free(ts);
    free(names);
    free(ml.m);
    free(ml.k);
    free(ml.v);
    return st;
}

/* ---- Metadata reading ---- */

static lowp_status need_meta(const lowp_safetensors *f, const char *path, const char *key,
                             const char **val) {
    if (lowp_safetensors_meta(f, key, val) != LOWP_OK)
        return lowp_fail(LOWP_ERR_CORRUPT, "checkpoint %s: metadata '%s' is missing", path, key);
    return LOWP_OK;
}

static lowp_status meta_u64(const lowp_safetensors *f, const char *path, const char *key, int base,
                            uint64_t *out) {
    const char *v;
    lowp_status st = need_meta(f, path, key, &v);
    if (st != LOWP_OK) return st;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, base);
    if (!*v || *end || errno || v[0] == '-' || v[0] == '+' || v[0] == ' ')
        return lowp_fail(LOWP_ERR_CORRUPT, "checkpoint %s: metadata '%s' ('%.40s') is not a number",
                         path, key, v);
    *out = (uint64_t) x;
    return LOWP_OK;
}

static lowp_status meta_i32(const lowp_safetensors *f, const char *path, const char *key,
                            int32_t *out) {
    uint64_t x = 0;
    lowp_status st = meta_u64(f, path, key, 10, &x);
    if (st != LOWP_OK) return st;
    if (x > INT32_MAX)
        return lowp_fail(LOWP_ERR_CORRUPT, "checkpoint %s: metadata '%s' (%llu) is out of range",
                         path, key, (unsigned long long) x);
    *out = (int32_t) x;
    return LOWP_OK;
}

static lowp_status meta_f32(const lowp_safetensors *f, const char *path, const char *key,
                            float *out) {
    const char *v;
    lowp_status st = need_meta(f, path, key, &v);
    if (st != LOWP_OK) return st;
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (!*v || *end || errno == ERANGE)
        return lowp_fail(LOWP_ERR_CORRUPT, "checkpoint %s: metadata '%s' ('%.40s') is not a number",
                         path, key, v);
    *out = x;
    return LOWP_OK;
}

/* The header fields of a checkpoint: format, recipe, configuration, settings. */
static lowp_status read_info(const lowp_safetensors *f, const char *path,
                             lowp_checkpoint_info *info) {
    memset(info, 0, sizeof *info);
    const char *v;
    if (lowp_safetensors_meta(f, "format", &v) != LOWP_OK ||
        strcmp(v, LOWP_TRAIN_CHECKPOINT_FORMAT) != 0)
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "checkpoint %s: a safetensors file, but not a lowp training checkpoint "
                         "(no __metadata__ format '%s')",
                         path, LOWP_TRAIN_CHECKPOINT_FORMAT);
    int32_t ver = 0;
    lowp_status st = meta_i32(f, path, "format_version", &ver);
    if (st != LOWP_OK) return st;
    if (ver != LOWP_TRAIN_CHECKPOINT_VERSION)
        return lowp_fail(LOWP_ERR_VERSION,
                         "checkpoint %s: format_version %d, this lowp reads version %d", path,
                         (int) ver, LOWP_TRAIN_CHECKPOINT_VERSION);
    if ((st = lowp_ckpt_verify(f, path)) != LOWP_OK) return st;
    if ((st = need_meta(f, path, "recipe", &v)) != LOWP_OK) return st;
    snprintf(info->recipe, sizeof info->recipe, "%s", v);
    if ((st = need_meta(f, path, "data.name", &v)) != LOWP_OK) return st;
    snprintf(info->data_name, sizeof info->data_name, "%s", v);
    if ((st = meta_u64(f, path, "data.hash", 16, &info->data_hash)) != LOWP_OK) return st;
    for (int i = 0; i < NCONFIG; i++) {
        char *base = (char *) &info->config + CONFIG_FIELDS[i].off;
        if (CONFIG_FIELDS[i].is_float) {
            float x;
            if ((st = meta_f32(f, path, CONFIG_FIELDS[i].key, &x)) != LOWP_OK) return st;
            memcpy(base, &x, sizeof x);
        } else {
            int32_t x;
            if ((st = meta_i32(f, path, CONFIG_FIELDS[i].key, &x)) != LOWP_OK) return st;
            memcpy(base, &x, sizeof x);
        }
    }
    lowp_trainer_cfg *c = &info->train;
    lowp_trainer_cfg_init(c);
    uint64_t u;
    if ((st = meta_u64(f, path, "model.seed", 10, &info->model_seed)) != LOWP_OK) return st;
    if ((st = meta_u64(f, path, "train.step", 10, &u)) != LOWP_OK) return st;
    info->step = (int64_t) u;
    if ((st = meta_i32(f, path, "train.steps", &c->steps)) != LOWP_OK ||
        (st = meta_i32(f, path, "train.batch", &c->batch)) != LOWP_OK ||
        (st = meta_i32(f, path, "train.seq_len", &c->seq_len)) != LOWP_OK ||
        (st = meta_i32(f, path, "train.accum", &c->accum)) != LOWP_OK ||
        (st = meta_u64(f, path, "train.seed", 10, &c->seed)) != LOWP_OK ||
        (st = meta_u64(f, path, "train.eval_seed", 10, &c->eval_seed)) != LOWP_OK ||
        (st = meta_f32(f, path, "train.lr", &c->lr)) != LOWP_OK ||
        (st = meta_f32(f, path, "train.min_lr", &c->min_lr)) != LOWP_OK ||
        (st = meta_i32(f, path, "train.warmup", &c->warmup)) != LOWP_OK ||
        (st = meta_f32(f, path, "train.beta1", &c->adamw.beta1)) != LOWP_OK ||
        (st = meta_f32(f, path, "train.beta2", &c->adamw.beta2)) != LOWP_OK ||
        (st = meta_f32(f, path, "train.eps", &c->adamw.eps)) != LOWP_OK ||
        (st = meta_f32(f, path, "train.weight_decay", &c->adamw.weight_decay)) != LOWP_OK ||
        (st = meta_f32(f, path, "train.clip", &c->clip)) != LOWP_OK ||
        (st = meta_i32(f, path, "train.eval_every", &c->eval_every)) != LOWP_OK ||
        (st = meta_i32(f, path, "train.eval_batches", &c->eval_batches)) != LOWP_OK)
        return st;
    if (u > INT32_MAX)
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "checkpoint %s: metadata 'train.step' (%llu) is out of range", path,
                         (unsigned long long) u);
    return lowp_ckpt_check_info(path, info);
}

lowp_status lowp_trainer_checkpoint_info(const char *path, lowp_checkpoint_info *out) {
    LOWP_CHECK_PTR("lowp_trainer_checkpoint_info", path);
    LOWP_CHECK_PTR("lowp_trainer_checkpoint_info", out);
    lowp_safetensors *f;
    lowp_status st = lowp_safetensors_read(path, &f);
    if (st != LOWP_OK) return st;
    st = read_info(f, path, out);
    lowp_safetensors_free(f);
    return st;
}

/* A tensor that must exist with this dtype and exactly this many elements. */
static lowp_status need_tensor(const lowp_safetensors *f, const char *path, const char *name,
                               lowp_st_dtype dtype, const lowp_param *p, lowp_st_tensor *out) {
    if (lowp_safetensors_find(f, name, out) != LOWP_OK)
        return lowp_fail(LOWP_ERR_CORRUPT, "checkpoint %s: tensor '%s' is missing", path, name);
    if (out->dtype != dtype)
        return lowp_fail(LOWP_ERR_CORRUPT, "checkpoint %s: tensor '%s' is %s, expected %s", path,
                         name, lowp_st_dtype_name(out->dtype), lowp_st_dtype_name(dtype));
    if (p) {
        int ok = p->groups > 0
                     ? (out->ndim == 3 && out->shape[0] == p->groups && out->shape[1] == p->rows &&
                        out->shape[2] == p->cols)
                     : (out->ndim == 2 && out->shape[0] == p->rows && out->shape[1] == p->cols);
        if (!ok)
            return lowp_fail(LOWP_ERR_CORRUPT,
                             "checkpoint %s: tensor '%s' has the wrong shape for parameter '%s' "
                             "([%lld, %lld] x %d groups)",
                             path, name, p->name, (long long) p->rows, (long long) p->cols,
                             (int) p->groups);
    }
    return LOWP_OK;
}

/* The checks of a checkpoint against this trainer, before anything changes. */
static lowp_status check_match(const lowp_trainer *t, const char *path,
                               const lowp_checkpoint_info *info) {
    if (strcmp(info->recipe, t->recipe.name) != 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "checkpoint %s was written with recipe '%s', this run uses '%s'", path,
                         info->recipe, t->recipe.name);
    for (int i = 0; i < NCONFIG; i++) {
        const char *a = (const char *) &info->config + CONFIG_FIELDS[i].off;
        const char *b = (const char *) &t->mcfg + CONFIG_FIELDS[i].off;
        if (memcmp(a, b, 4) == 0) continue;
        if (CONFIG_FIELDS[i].is_float) {
            float x, y;
            memcpy(&x, a, 4);
            memcpy(&y, b, 4);
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "checkpoint %s has %s = %.9g, this model has %.9g (the model "
                             "configuration must match)",
                             path, CONFIG_FIELDS[i].key, (double) x, (double) y);
        }
        int32_t x, y;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "checkpoint %s has %s = %d, this model has %d (the model configuration "
                         "must match)",
                         path, CONFIG_FIELDS[i].key, (int) x, (int) y);
    }
    lowp_data_info di;
    lowp_data_get_info(t->data, &di);
    const uint64_t hash = info->data_hash;
    if (hash != di.hash)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "checkpoint %s was trained on other data (%s, hash %016" PRIx64
                         "); this run's data is %s (hash %016" PRIx64 ")",
                         path, info->data_name, hash, di.name, di.hash);
    const struct {
        const char *what;
        long long ck, run;
    } order[] = {
        {"train.batch", info->train.batch, t->cfg.batch},
        {"train.seq_len", info->train.seq_len, t->cfg.seq_len},
        {"train.accum", info->train.accum, t->cfg.accum},
        {"train.seed", (long long) info->train.seed, (long long) t->cfg.seed},
    };
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (order[i].ck != order[i].run)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "checkpoint %s has %s = %lld, this run has %lld (the data order "
                             "would differ)",
                             path, order[i].what, order[i].ck, order[i].run);
    return LOWP_OK;
}

/* What a load reads before it changes anything. */
typedef struct ckpt_load {
    lowp_checkpoint_info info;
    uint64_t data_pos, opt_t;
    int32_t nrs, cur;
    lowp_rng_state rs[LOWP_RNG_MAX_STATES];
    lowp_st_tensor *w, *m, *v, *x; /* [n]: weight, moments, extra state of each parameter */
} ckpt_load;

/* The run's position: data position and optimizer t (consistent with the step), and the RNG
 * tracker's states. */
static lowp_status load_position(const lowp_safetensors *f, const char *path, ckpt_load *L) {
    lowp_status st;
    if ((st = meta_u64(f, path, "train.data_position", 10, &L->data_pos)) != LOWP_OK ||
        (st = meta_u64(f, path, "train.optimizer_t", 10, &L->opt_t)) != LOWP_OK ||
        (st = meta_i32(f, path, "rng.count", &L->nrs)) != LOWP_OK ||
        (st = meta_i32(f, path, "rng.current", &L->cur)) != LOWP_OK)
        return st;
    /* t counts the applied updates (skipped ones do not), and every update draws accum
     * micro-batches. */
    if (L->opt_t > (uint64_t) L->info.step ||
        L->data_pos != (uint64_t) L->info.step * (uint64_t) L->info.train.accum)
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "checkpoint %s: train.optimizer_t (%llu) or train.data_position (%llu) "
                         "does not fit train.step (%lld) and train.accum (%d)",
                         path, (unsigned long long) L->opt_t, (unsigned long long) L->data_pos,
                         (long long) L->info.step, (int) L->info.train.accum);
    if (L->nrs < 1 || L->nrs > LOWP_RNG_MAX_STATES || L->cur >= L->nrs)
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "checkpoint %s: rng.count (%d) or rng.current (%d) is out of range", path,
                         (int) L->nrs, (int) L->cur);
    memset(L->rs, 0, sizeof L->rs);
    for (int32_t i = 0; i < L->nrs; i++) {
        char key[64];
        const char *name;
        snprintf(key, sizeof key, "rng.%d.name", (int) i);
        if ((st = need_meta(f, path, key, &name)) != LOWP_OK) return st;
        if (strlen(name) >= LOWP_RNG_NAME_MAX)
            return lowp_fail(LOWP_ERR_CORRUPT, "checkpoint %s: %s is too long", path, key);
        strcpy(L->rs[i].name, name);
        snprintf(key, sizeof key, "rng.%d.seed", (int) i);
        if ((st = meta_u64(f, path, key, 10, &L->rs[i].seed)) != LOWP_OK) return st;
        snprintf(key, sizeof key, "rng.%d.offset", (int) i);
        if ((st = meta_u64(f, path, key, 10, &L->rs[i].offset)) != LOWP_OK) return st;
    }
    return LOWP_OK;
}

/* Every parameter's tensors, with their shapes and values checked. */
static lowp_status load_tensors(const lowp_trainer *t, const lowp_safetensors *f, const char *path,
                                ckpt_load *L) {
    lowp_status st;
    for (int32_t i = 0; i < t->n; i++) {
        const lowp_param *p = &t->params[i];
        char name[KEYLEN];
        if ((st = need_tensor(f, path, p->name, LOWP_ST_F32, p, &L->w[i])) != LOWP_OK) return st;
        snprintf(name, sizeof name, "optim.exp_avg.%s", p->name);
        if ((st = need_tensor(f, path, name, LOWP_ST_F32, p, &L->m[i])) != LOWP_OK) return st;
        snprintf(name, sizeof name, "optim.exp_avg_sq.%s", p->name);
        if ((st = need_tensor(f, path, name, LOWP_ST_F32, p, &L->v[i])) != LOWP_OK) return st;
        const int64_t cnt = lowp_param_numel(p);
        if ((st = lowp_ckpt_check_values(path, p->name, L->w[i].data, cnt, 0)) != LOWP_OK ||
            (st = lowp_ckpt_check_values(path, L->m[i].name, L->m[i].data, cnt, 0)) != LOWP_OK ||
            (st = lowp_ckpt_check_values(path, L->v[i].name, L->v[i].data, cnt, 1)) != LOWP_OK)
            return st;
        if (!p->wrap) continue;
        snprintf(name, sizeof name, "%s._extra_state", p->name);
        if ((st = need_tensor(f, path, name, LOWP_ST_U8, NULL, &L->x[i])) != LOWP_OK) return st;
        if (L->x[i].ndim != 1)
            return lowp_fail(LOWP_ERR_CORRUPT, "checkpoint %s: tensor '%s' is not 1-D", path, name);
    }
    return LOWP_OK;
}

/* Into the trainer. The extra state can still fail (its own CRC): it goes first and is undone
 * (with the RNG states) on failure, so the trainer is left as it was. */
static lowp_status apply_state(lowp_trainer *t, const char *path, const ckpt_load *L) {
    trainer_extra_state before;
    memset(&before, 0, sizeof before);
    lowp_status st = lowp_trainer_extra_state_save(t, &before);
    for (int32_t i = 0; st == LOWP_OK && i < t->n; i++) {
        if (!t->params[i].wrap) continue;
        st = lowp_param_extra_state_load(&t->params[i], L->x[i].data, (size_t) L->x[i].shape[0]);
        if (st != LOWP_OK) {
            lowp_error_append("checkpoint %s: the extra state of '%s'", path, t->params[i].name);
            if (st == LOWP_ERR_INVALID_ARG) st = LOWP_ERR_CORRUPT;
            (void) lowp_trainer_extra_state_load(t, &before); /* saved from this very state */
        }
    }
    lowp_rng_tracker saved_rng = t->rng;
    if (st == LOWP_OK && (st = lowp_rng_tracker_set_states(&t->rng, L->rs, L->nrs)) != LOWP_OK) {
        t->rng = saved_rng;
        (void) lowp_trainer_extra_state_load(t, &before);
        lowp_error_append("checkpoint %s: the RNG tracker's states", path);
    }
    lowp_trainer_extra_state_free(&before);
    if (st != LOWP_OK) return st;
    t->rng.current = L->cur;
    for (int32_t i = 0; i < t->n; i++) {
        float *mm, *vv;
        int64_t cnt;
        lowp_adamw_moments(t->opt, i, &mm, &vv, &cnt);
        const size_t nb = (size_t) cnt * sizeof(float);
        memcpy(t->params[i].data, L->w[i].data, nb);
        memcpy(mm, L->m[i].data, nb);
        memcpy(vv, L->v[i].data, nb);
        lowp_param_updated(&t->params[i]);
    }
    /* Cannot fail after load_position's range check; checked all the same. */
    if ((st = lowp_adamw_set_t(t->opt, (int64_t) L->opt_t)) != LOWP_OK) return st;
    t->step = L->info.step;
    t->data_pos = L->data_pos;
    t->model_seed = L->info.model_seed;
    t->t0 = lowp_trainer_now();
    t->run_steps = 0;
    return LOWP_OK;
}

lowp_status lowp_trainer_checkpoint_load(lowp_trainer *t, const char *path) {
    const char *fn = "lowp_trainer_checkpoint_load";
    LOWP_CHECK_PTR(fn, t);
    LOWP_CHECK_PTR(fn, path);
    lowp_safetensors *f = NULL;
    lowp_status st = lowp_safetensors_read(path, &f);
    if (st != LOWP_OK) return st;
    ckpt_load *L = calloc(1, sizeof *L);
    const size_t n = (size_t) t->n + 1;
    if (L) {
        L->w = calloc(n, sizeof *L->w);
        L->m = calloc(n, sizeof *L->m);
        L->v = calloc(n, sizeof *L->v);
        L->x = calloc(n, sizeof *L->x);
    }
    if (!L || !L->w || !L->m || !L->v || !L->x)
        st = lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    /* Every number and tensor is read and checked before anything changes. */
    if (st == LOWP_OK) st = read_info(f, path, &L->info);
    if (st == LOWP_OK) st = check_match(t, path, &L->info);
    if (st == LOWP_OK) st = load_position(f, path, L);
    if (st == LOWP_OK) st = load_tensors(t, f, path, L);
    if (st == LOWP_OK) st = apply_state(t, path, L);
    if (L) {
        free(L->w);
        free(L->m);
        free(L->v);
        free(L->x);
    }
    free(L);
    lowp_safetensors_free(f);
    return st;
}
