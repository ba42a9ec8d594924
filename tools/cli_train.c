/* `lowp train` (train the MoE model of model.h with a recipe, with progress, JSON-lines logs,
 * checkpoints and resume, and a text sample at the end) and `lowp compare` (train several
 * recipes on the same data from the same initialization and write a markdown report with an
 * SVG plot of validation loss against step).
 *
 * The library reports progress through lowp_trainer_run's callback; everything printed is
 * printed here: a progress line on stderr (redrawn in place on a terminal, plain lines
 * otherwise), results and the sample on stdout.
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "lowp/lowp.h"
#include "lowp/model.h"
#include "lowp/trainer.h"
#include "report.h"

/* ---- Options ---- */

typedef enum opt_kind { OPT_INT, OPT_U64, OPT_FLOAT, OPT_STR, OPT_FLAG } opt_kind;

typedef struct train_opts {
    const char *recipe, *recipes, *config, *data, *log, *checkpoint, *resume, *prompt, *out;
    int steps, stop_at, batch, accum, seq_len, warmup, eval_every, eval_batches, threads;
    int checkpoint_every, sample, sample_top_k, progress_every, activation_checkpoint;
    float lr, min_lr, weight_decay, clip, beta1, beta2, temperature;
    uint64_t seed;
    /* model overrides */
    int dim, layers, heads, experts, top_k, expert_hidden, shared_hidden;
    float dropout, aux_loss_coef;
} train_opts;

typedef struct opt_def {
    const char *name;
    opt_kind kind;
    size_t off;
    int compare; /* 0: train only, 1: both, 2: compare only */
} opt_def;

#define O(name, kind, field, cmp)                                                                  \
    { name, kind, offsetof(train_opts, field), cmp }
static const opt_def OPTS[] = {
    O("--recipe", OPT_STR, recipe, 0),
    O("--recipes", OPT_STR, recipes, 2),
    O("--config", OPT_STR, config, 1),
    O("--data", OPT_STR, data, 1),
    O("--steps", OPT_INT, steps, 1),
    O("--stop-at", OPT_INT, stop_at, 0),
    O("--batch", OPT_INT, batch, 1),
    O("--accum", OPT_INT, accum, 1),
    O("--seq-len", OPT_INT, seq_len, 1),
    O("--lr", OPT_FLOAT, lr, 1),
    O("--min-lr", OPT_FLOAT, min_lr, 1),
    O("--warmup", OPT_INT, warmup, 1),
    O("--weight-decay", OPT_FLOAT, weight_decay, 1),
    O("--clip", OPT_FLOAT, clip, 1),
    O("--beta1", OPT_FLOAT, beta1, 1),
    O("--beta2", OPT_FLOAT, beta2, 1),
    O("--eval-every", OPT_INT, eval_every, 1),
    O("--eval-batches", OPT_INT, eval_batches, 1),
    O("--seed", OPT_U64, seed, 1),
    O("--threads", OPT_INT, threads, 1),
    O("--log", OPT_STR, log, 1),
    O("--checkpoint", OPT_STR, checkpoint, 0),
    O("--checkpoint-every", OPT_INT, checkpoint_every, 0),
    O("--resume", OPT_STR, resume, 0),
    O("--sample", OPT_INT, sample, 1),
    O("--temperature", OPT_FLOAT, temperature, 1),
    O("--sample-top-k", OPT_INT, sample_top_k, 1),
    O("--prompt", OPT_STR, prompt, 1),
    O("--progress-every", OPT_INT, progress_every, 1),
    O("--activation-checkpoint", OPT_FLAG, activation_checkpoint, 1),
    O("--out", OPT_STR, out, 2),
    O("--dim", OPT_INT, dim, 1),
    O("--layers", OPT_INT, layers, 1),
    O("--heads", OPT_INT, heads, 1),
    O("--experts", OPT_INT, experts, 1),
    O("--top-k", OPT_INT, top_k, 1),
    O("--expert-hidden", OPT_INT, expert_hidden, 1),
    O("--shared-hidden", OPT_INT, shared_hidden, 1),
    O("--dropout", OPT_FLOAT, dropout, 1),
    O("--aux-loss-coef", OPT_FLOAT, aux_loss_coef, 1),
};
#define NOPTS ((int) (sizeof OPTS / sizeof OPTS[0]))

static const char TRAIN_USAGE[] =
    "usage: lowp train [--recipe NAME] [--config NAME] [--data FILE] [--steps N] [OPTIONS]\n"
    "\n"
    "Train the MoE transformer on a text file, character by character (the first 90%% of the\n"
    "bytes train, the last 10%% validate), with AdamW, warm-up and cosine decay, gradient\n"
    "clipping and accumulation. Without --data it trains on a built-in corpus.\n"
    "\n"
    "  --recipe NAME          one of the recipes listed below (default bf16)\n"
    "  --config NAME          tiny, small or medium (default tiny)\n"
    "  --data FILE            any text file\n"
    "  --steps N              optimizer updates, the length of the schedule (default 200)\n"
    "  --stop-at N            stop after update N (the schedule still spans --steps)\n"
    "  --batch N              sequences per micro-batch (default 8)\n"
    "  --accum N              micro-batches per update (default 1)\n"
    "  --seq-len N            tokens per sequence (default: the configuration's)\n"
    "  --lr X, --min-lr X     peak and final learning rate (default 3e-3, lr / 10)\n"
    "  --warmup N             updates of linear warm-up (default steps / 10)\n"
    "  --weight-decay X       AdamW decoupled weight decay on matrices (default 0.1)\n"
    "  --beta1 X, --beta2 X   AdamW betas (default 0.9, 0.95)\n"
    "  --clip X               global gradient-norm clipping, 0 off (default 1)\n"
    "  --eval-every N         validate every N updates and after the last (default steps/10)\n"
    "  --eval-batches N       validation batches per evaluation (default 8)\n"
    "  --seed N               initialization, data order and dropout (default 1234)\n"
    "  --threads N            0 to 256; 0: all cores (default)\n"
    "  --log PATH             JSON lines: step, loss, lr, grad_norm, tokens_per_s, val_loss...\n"
    "  --checkpoint PATH      save a safetensors checkpoint there at the end\n"
    "  --checkpoint-every N   and every N updates\n"
    "  --resume PATH          continue from a checkpoint (bit for bit); unset options are\n"
    "                         taken from it\n"
    "  --sample N             print N sampled characters at the end (default 200, 0: none)\n"
    "  --temperature X        sampling temperature (default 0.8; 0: greedy)\n"
    "  --sample-top-k K       sample from the K most likely (default 0: all)\n"
    "  --prompt TEXT          start the sample with TEXT\n"
    "  --progress-every N     without a terminal, a progress line every N updates\n"
    "  --activation-checkpoint  recompute layer activations in the backward\n"
    "  --dim N --layers N --heads N --experts N --top-k N --expert-hidden N\n"
    "  --shared-hidden N --dropout X --aux-loss-coef X   override the configuration\n"
    "\n"
    "Recipes: %s.\n"
    "Exit status: 0 success, 2 bad usage or bad input (data, checkpoint), 1 other failures\n"
    "(including a run whose loss became NaN).\n";

static const char COMPARE_USAGE[] =
    "usage: lowp compare [--recipes LIST] [--config NAME] [--data FILE] [--steps N]\n"
    "                    [--out DIR] [OPTIONS]\n"
    "\n"
    "Train each recipe of LIST (comma-separated; default bf16,all_mxfp8,all_block_fp8,mix)\n"
    "from the same initialization on the same batches, then write DIR/report.md (settings,\n"
    "validation loss, tokens/s and GFLOP/s per recipe) and DIR/val_loss.svg (validation loss\n"
    "against step). DIR defaults to out/compare.\n"
    "Options as for `lowp train` (without --recipe, --checkpoint, --resume and --stop-at);\n"
    "--eval-every defaults to steps / 20 and --sample to 0. With --log, every line carries\n"
    "the recipe.\n"
    "Recipes: %s.\n";

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int
fail(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "lowp %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 0;
}

/* The exit status for a library failure: bad input (2) or something else (1). */
static int lib_fail(const char *cmd, lowp_status st) {
    fail(cmd, "%s", lowp_last_error());
    return (st == LOWP_ERR_CORRUPT || st == LOWP_ERR_INVALID_ARG || st == LOWP_ERR_VERSION ||
            st == LOWP_ERR_IO || st == LOWP_ERR_NOT_FOUND)
               ? 2
               : 1;
}

static int parse_int_str(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* seen[i] marks options given on the command line. Returns -1 to go on, else the status. */
static int parse_opts(const char *cmd, int compare, int argc, char **argv, train_opts *o,
                      int *seen) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            printf(compare ? COMPARE_USAGE : TRAIN_USAGE, lowp_recipe_names());
            return 0;
        }
        char name[40];
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t) (eq - arg) : strlen(arg);
        if (strncmp(arg, "--", 2) != 0 || nlen >= sizeof name) {
            fail(cmd, "unexpected argument '%s' (see `lowp %s --help`)", arg, cmd);
            return 2;
        }
        memcpy(name, arg, nlen);
        name[nlen] = '\0';
        int k = -1;
        for (int j = 0; j < NOPTS; j++)
            if (strcmp(OPTS[j].name, name) == 0 &&
                (compare ? OPTS[j].compare : OPTS[j].compare != 2))
                k = j;
        if (k < 0) {
            fail(cmd, "unknown option '%s' (see `lowp %s --help`)", name, cmd);
            return 2;
        }
        if (seen[k]) {
            fail(cmd, "%s given twice", name);
            return 2;
        }
        seen[k] = 1;
        char *field = (char *) o + OPTS[k].off;
        if (OPTS[k].kind == OPT_FLAG) {
            if (eq) {
                fail(cmd, "%s takes no value", name);
                return 2;
            }
            *(int *) field = 1;
            continue;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (i + 1 >= argc) {
                fail(cmd, "%s needs a value", name);
                return 2;
            }
            val = argv[++i];
        }
        long long v;
        char *end;
        switch (OPTS[k].kind) {
        case OPT_INT:
            if (!parse_int_str(val, 0, INT32_MAX, &v)) {
                fail(cmd, "%s: '%s' is not a non-negative integer", name, val);
                return 2;
            }
            *(int *) field = (int) v;
            break;
        case OPT_U64: {
            if (!*val || *val == '-' || *val == '+') {
                fail(cmd, "%s: '%s' is not an unsigned integer", name, val);
                return 2;
            }
            errno = 0;
            unsigned long long u = strtoull(val, &end, 10);
            if (*end || errno) {
                fail(cmd, "%s: '%s' is not an unsigned 64-bit integer", name, val);
                return 2;
            }
            *(uint64_t *) field = (uint64_t) u;
            break;
        }
        case OPT_FLOAT: {
            errno = 0;
            float x = strtof(val, &end);
            if (!*val || *end || errno || !isfinite(x) || x < 0) {
                fail(cmd, "%s: '%s' is not a finite non-negative number", name, val);
                return 2;
            }
            *(float *) field = x;
            break;
        }
        case OPT_STR: *(const char **) field = val; break;
        default: break;
        }
    }
    return -1;
}

static int given(const int *seen, const char *name) {
    for (int j = 0; j < NOPTS; j++)
        if (strcmp(OPTS[j].name, name) == 0) return seen[j];
    return 0;
}

/* ---- Settings ---- */

typedef struct setup {
    lowp_data *data;
    lowp_moe_config mc;
    lowp_trainer_cfg tc;
    char config_desc[256];
    char data_desc[600];
} setup;

/* Data, model configuration and trainer settings from the options (and, on resume, from the
 * checkpoint for what the options leave unset). */
static int build_setup(const char *cmd, const train_opts *o, const int *seen,
                       const lowp_checkpoint_info *ck, setup *s) {
    memset(s, 0, sizeof *s);
    lowp_status st = o->data ? lowp_data_from_file(o->data, &s->data) : lowp_data_default(&s->data);
    if (st != LOWP_OK) return lib_fail(cmd, st);
    lowp_data_info di;
    lowp_data_get_info(s->data, &di);
    snprintf(s->data_desc, sizeof s->data_desc, "%s (%lld bytes, vocabulary %d)", di.name,
             (long long) di.bytes, (int) di.vocab);
    if (ck && ck->data_hash != di.hash) {
        fail(cmd,
             "the checkpoint was trained on other data (%s, hash %016llx); this run's data is %s "
             "(hash %016llx): pass the same --data",
             ck->data_name, (unsigned long long) ck->data_hash, di.name,
             (unsigned long long) di.hash);
        return 2;
    }

    const int overrides = given(seen, "--dim") || given(seen, "--layers") ||
                          given(seen, "--heads") || given(seen, "--experts") ||
                          given(seen, "--top-k") || given(seen, "--expert-hidden") ||
                          given(seen, "--shared-hidden") || given(seen, "--dropout") ||
                          given(seen, "--aux-loss-coef") || given(seen, "--seq-len");
    const char *cfgname = o->config ? o->config : "tiny";
    if (ck && !o->config && !overrides) {
        s->mc = ck->config; /* the checkpoint's, when nothing says otherwise */
        cfgname = "from checkpoint";
    } else if (lowp_moe_config_preset(cfgname, di.vocab, &s->mc) != LOWP_OK) {
        fail(cmd, "--config: %s", lowp_last_error());
        return 2;
    }
    lowp_moe_config *m = &s->mc;
    if (given(seen, "--dim")) m->dim = o->dim;
    if (given(seen, "--layers")) m->layers = o->layers;
    if (given(seen, "--heads")) m->heads = o->heads;
    if (given(seen, "--experts")) m->experts = o->experts;
    if (given(seen, "--top-k")) m->top_k = o->top_k;
    if (given(seen, "--expert-hidden")) m->expert_hidden = o->expert_hidden;
    if (given(seen, "--shared-hidden")) m->shared_hidden = o->shared_hidden;
    if (given(seen, "--dropout")) m->dropout = o->dropout;
    if (given(seen, "--aux-loss-coef")) m->aux_loss_coef = o->aux_loss_coef;
    if (given(seen, "--seq-len")) m->seq_len = o->seq_len;
    snprintf(s->config_desc, sizeof s->config_desc,
             "%s: dim %d, %d layers, %d heads, seq_len %d, %d experts (top-%d, hidden %d), "
             "shared hidden %d, vocabulary %d, dropout %g",
             cfgname, (int) m->dim, (int) m->layers, (int) m->heads, (int) m->seq_len,
             (int) m->experts, (int) m->top_k, (int) m->expert_hidden, (int) m->shared_hidden,
             (int) m->vocab, (double) m->dropout);

    lowp_trainer_cfg *c = &s->tc;
    if (ck)
        *c = ck->train;
    else
        lowp_trainer_cfg_init(c);
    c->seq_len = m->seq_len;
    if (given(seen, "--steps")) c->steps = o->steps;
    if (given(seen, "--batch")) c->batch = o->batch;
    if (given(seen, "--accum")) c->accum = o->accum;
    if (given(seen, "--lr")) c->lr = o->lr;
    if (given(seen, "--min-lr"))
        c->min_lr = o->min_lr;
    else if (!ck || given(seen, "--lr"))
        c->min_lr = c->lr / 10.0f;
    if (given(seen, "--warmup"))
        c->warmup = o->warmup;
    else if (!ck)
        c->warmup = c->steps / 10;
    if (given(seen, "--weight-decay")) c->adamw.weight_decay = o->weight_decay;
    if (given(seen, "--beta1")) c->adamw.beta1 = o->beta1;
    if (given(seen, "--beta2")) c->adamw.beta2 = o->beta2;
    if (given(seen, "--clip")) c->clip = o->clip;
    if (given(seen, "--eval-every"))
        c->eval_every = o->eval_every;
    else if (!ck)
        c->eval_every = c->steps >= 10 ? c->steps / 10 : 1;
    if (given(seen, "--eval-batches")) c->eval_batches = o->eval_batches;
    if (given(seen, "--seed")) c->seed = o->seed;
    c->threads = o->threads;
    c->activation_checkpoint = o->activation_checkpoint;
    if (c->batch < 1 || c->accum < 1 || c->eval_batches < 1) {
        fail(cmd, "--batch, --accum and --eval-batches must be at least 1");
        return 2;
    }
    if (c->steps < 1) {
        fail(cmd, "--steps must be at least 1");
        return 2;
    }
    if (!(c->adamw.beta1 < 1) || !(c->adamw.beta2 < 1)) {
        fail(cmd, "--beta1 and --beta2 must be below 1");
        return 2;
    }
    return -1;
}

/* "26 of 31 parameters wrapped: mxfp8 x 20, block_fp8 x 6". */
static void describe_wrapping(lowp_trainer *t, char *buf, size_t n) {
    lowp_param *p;
    int32_t np;
    lowp_trainer_params(t, &p, &np);
    char names[8][32];
    int counts[8] = {0}, kinds = 0, wrapped = 0;
    for (int32_t i = 0; i < np; i++) {
        if (!p[i].wrap) continue;
        wrapped++;
        lowp_wrap_stats ws;
        if (lowp_param_stats(&p[i], &ws) != LOWP_OK) continue;
        int k = 0;
        while (k < kinds && strcmp(names[k], ws.cfg_name) != 0) k++;
        if (k == kinds && kinds < 8) snprintf(names[kinds++], sizeof names[0], "%s", ws.cfg_name);
        if (k < 8) counts[k]++;
    }
    int len = snprintf(buf, n, "%d of %d parameters wrapped", wrapped, (int) np);
    for (int k = 0; k < kinds && len > 0 && (size_t) len < n; k++)
        len += snprintf(buf + len, n - (size_t) len, "%s%s x %d", k ? ", " : ": ", names[k],
                        counts[k]);
}

/* ---- Progress ---- */

typedef struct progress {
    const char *cmd;
    const char *label; /* recipe, in compare */
    FILE *log;
    int tty, every;
    lowp_trainer *t;
    const char *checkpoint;
    int checkpoint_every;
    int64_t last_saved;
    int failed; /* a callback failure: exit status */
    int64_t stop_at;
    /* what compare collects */
    int64_t *steps;
    float *val;
    int32_t points, cap;
    double *tps;
    int64_t ntps, skipped;
    float last_loss, last_val;
} progress;

static void fmt_dur(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "?");
        return;
    }
    long t = (long) (s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
}

static void json_float(FILE *f, const char *key, double v) {
    if (isfinite(v))
        fprintf(f, ", \"%s\": %.9g", key, v);
    else
        fprintf(f, ", \"%s\": null", key);
}

static int on_step(const lowp_step_report *r, void *user) {
    progress *p = user;
    p->last_loss = r->loss;
    if (r->skipped) p->skipped++;
    if (p->tps) p->tps[p->ntps++] = r->tokens_per_s;
    if (r->evaluated) {
        p->last_val = r->val_loss;
        if (p->steps && p->points < p->cap) {
            p->steps[p->points] = r->step;
            p->val[p->points++] = r->val_loss;
        }
    }
    if (p->log) {
        fprintf(p->log, "{");
        if (p->label) fprintf(p->log, "\"recipe\": \"%s\", ", p->label);
        fprintf(p->log, "\"step\": %lld", (long long) r->step);
        json_float(p->log, "loss", r->loss);
        json_float(p->log, "aux_loss", r->aux_loss);
        json_float(p->log, "lr", r->lr);
        json_float(p->log, "grad_norm", r->grad_norm);
        json_float(p->log, "tokens_per_s", r->tokens_per_s);
        json_float(p->log, "step_s", r->step_s);
        json_float(p->log, "elapsed_s", r->elapsed_s);
        if (r->evaluated) json_float(p->log, "val_loss", r->val_loss);
        if (r->skipped) fprintf(p->log, ", \"skipped\": true");
        fprintf(p->log, "}\n");
        fflush(p->log);
    }
    const int last = r->step == r->steps || r->step == p->stop_at;
    if (p->tty || r->evaluated || last || r->step % p->every == 0) {
        char eta[32], val[48] = "";
        fmt_dur(eta, sizeof eta, r->eta_s);
        if (r->evaluated) snprintf(val, sizeof val, " | val %.4f", (double) r->val_loss);
        fprintf(stderr, "%s%s%sstep %lld/%lld | loss %.4f%s | lr %.2e | %.0f tok/s | ETA %s%s",
                p->tty ? "\r" : "", p->label ? p->label : "", p->label ? " | " : "",
                (long long) r->step, (long long) r->steps, (double) r->loss, val, (double) r->lr,
                r->tokens_per_s, eta, p->tty ? "\x1b[K" : "");
        if (!p->tty || r->evaluated || last) fputc('\n', stderr);
        fflush(stderr);
    }
    if (p->checkpoint && p->checkpoint_every > 0 && r->step % p->checkpoint_every == 0) {
        lowp_status st = lowp_trainer_checkpoint_save(p->t, p->checkpoint);
        if (st != LOWP_OK) {
            if (p->tty) fputc('\n', stderr);
            fail(p->cmd, "%s", lowp_last_error());
            p->failed = 1;
            return 1;
        }
        p->last_saved = r->step;
    }
    return 0;
}

static double median(double *v, int64_t n) {
    if (n <= 0) return 0.0;
    /* Insertion sort: a run has at most a few thousand updates. */
    for (int64_t i = 1; i < n; i++) {
        double x = v[i];
        int64_t j = i;
        while (j > 0 && v[j - 1] > x) v[j] = v[j - 1], j--;
        v[j] = x;
    }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- lowp train ---- */

int lowp_cli_train(int argc, char **argv) {
    const char *cmd = "train";
    train_opts o;
    memset(&o, 0, sizeof o);
    int seen[NOPTS] = {0};
    int rc = parse_opts(cmd, 0, argc, argv, &o, seen);
    if (rc >= 0) return rc;
    if (!given(seen, "--sample")) o.sample = 200;
    if (!given(seen, "--temperature")) o.temperature = 0.8f;
    if (o.checkpoint_every && !o.checkpoint) {
        fail(cmd, "--checkpoint-every needs --checkpoint PATH");
        return 2;
    }
    if (o.threads > LOWP_MAX_THREADS) {
        fail(cmd, "--threads: %d is not a thread count (0 to %d)", o.threads, LOWP_MAX_THREADS);
        return 2;
    }
    if (o.threads > 0) omp_set_num_threads(o.threads);

    lowp_checkpoint_info ck;
    if (o.resume) {
        lowp_status st = lowp_trainer_checkpoint_info(o.resume, &ck);
        if (st != LOWP_OK) return lib_fail(cmd, st);
    }
    setup s;
    rc = build_setup(cmd, &o, seen, o.resume ? &ck : NULL, &s);
    if (rc >= 0) {
        lowp_data_free(s.data);
        return rc;
    }
    const char *recipe_name = o.recipe ? o.recipe : (o.resume ? ck.recipe : "bf16");
    lowp_recipe recipe;
    if (lowp_recipe_init(&recipe, recipe_name) != LOWP_OK) {
        fail(cmd, "--recipe: unknown recipe '%s' (one of %s)", recipe_name, lowp_recipe_names());
        lowp_data_free(s.data);
        return 2;
    }
    if (o.prompt && o.sample > 0) {
        /* Refuse a prompt the vocabulary cannot spell now, not after the training. */
        size_t plen = strlen(o.prompt);
        int32_t *tok = malloc((plen + 1) * sizeof *tok);
        lowp_status pst =
            tok ? lowp_data_encode(s.data, o.prompt, plen, tok) : LOWP_ERR_OUT_OF_MEMORY;
        free(tok);
        if (pst != LOWP_OK) {
            fail(cmd, "--prompt: %s", lowp_last_error());
            lowp_data_free(s.data);
            return 2;
        }
    }
    const uint64_t model_seed = o.resume && !given(seen, "--seed") ? ck.model_seed : s.tc.seed;

    lowp_moe *model = NULL;
    lowp_trainer *t = NULL;
    FILE *log = NULL;
    char *sample = NULL;
    lowp_status st = lowp_moe_create(&s.mc, model_seed, &model);
    if (st != LOWP_OK) {
        rc = lib_fail(cmd, st);
        goto done;
    }
    if ((st = lowp_trainer_create(model, s.data, &recipe, &s.tc, &t)) != LOWP_OK) {
        rc = lib_fail(cmd, st);
        goto done;
    }
    lowp_trainer_set_model_seed(t, model_seed);
    if (o.resume && (st = lowp_trainer_checkpoint_load(t, o.resume)) != LOWP_OK) {
        rc = lib_fail(cmd, st);
        goto done;
    }
    if (o.log && !(log = fopen(o.log, o.resume ? "a" : "w"))) {
        fail(cmd, "cannot open --log %s: %s", o.log, strerror(errno));
        rc = 2;
        goto done;
    }
    int64_t step0;
    lowp_trainer_get_step(t, &step0);
    const int64_t until = o.stop_at > 0 && o.stop_at < s.tc.steps ? o.stop_at : s.tc.steps;
    char wrapped[256];
    describe_wrapping(t, wrapped, sizeof wrapped);
    fprintf(stderr, "lowp train: recipe %s (%s)\n  model %s\n  data %s\n", recipe.name, wrapped,
            s.config_desc, s.data_desc);
    if (o.resume)
        fprintf(stderr, "  resuming from %s at step %lld of %d\n", o.resume, (long long) step0,
                (int) s.tc.steps);

    progress p;
    memset(&p, 0, sizeof p);
    p.cmd = cmd;
    p.log = log;
    p.tty = isatty(2);
    p.every = o.progress_every > 0 ? o.progress_every : (s.tc.steps >= 20 ? s.tc.steps / 20 : 1);
    p.t = t;
    p.checkpoint = o.checkpoint;
    p.checkpoint_every = o.checkpoint_every;
    p.last_saved = -1;
    p.stop_at = until;
    p.last_loss = NAN;
    p.last_val = NAN;
    const double t_run = omp_get_wtime();
    if ((st = lowp_trainer_run(t, until, on_step, &p)) != LOWP_OK) {
        if (p.tty) fputc('\n', stderr);
        rc = lib_fail(cmd, st);
        rc = rc == 2 ? 1 : rc; /* the inputs were fine: this failed while training */
        goto done;
    }
    if (p.failed) {
        rc = 1;
        goto done;
    }
    int64_t step;
    lowp_trainer_get_step(t, &step);
    if (o.checkpoint && p.last_saved != step) {
        if ((st = lowp_trainer_checkpoint_save(t, o.checkpoint)) != LOWP_OK) {
            rc = lib_fail(cmd, st);
            rc = 1;
            goto done;
        }
    }
    const double secs = omp_get_wtime() - t_run;
    if (step > step0) {
        printf("trained %s: step %lld/%d, loss %.4f", recipe.name, (long long) step,
               (int) s.tc.steps, (double) p.last_loss);
        if (isfinite(p.last_val)) printf(", val_loss %.4f", (double) p.last_val);
        printf(", %.1f s", secs);
        if (p.skipped)
            printf(", %lld updates skipped (non-finite gradient)", (long long) p.skipped);
        printf("\n");
    } else {
        printf("nothing to train: the checkpoint is at step %lld of %d\n", (long long) step,
               (int) s.tc.steps);
    }
    if (o.checkpoint) printf("checkpoint: %s\n", o.checkpoint);
    if (step > step0 && !isfinite(p.last_loss)) {
        fail(cmd, "the loss is %g at step %lld: training diverged", (double) p.last_loss,
             (long long) step);
        rc = 1;
        goto done;
    }
    if (o.sample > 0) {
        lowp_sample_cfg sc;
        lowp_sample_cfg_init(&sc);
        sc.temperature = o.temperature;
        sc.top_k = o.sample_top_k;
        sc.seed = s.tc.seed;
        sc.threads = o.threads;
        sample = malloc((size_t) o.sample + 1);
        if (!sample) {
            fail(cmd, "out of memory for the sample");
            rc = 1;
            goto done;
        }
        if ((st = lowp_sample_text(model, s.data, &sc, o.prompt, o.sample, sample)) != LOWP_OK) {
            rc = lib_fail(cmd, st);
            goto done;
        }
        printf("--- sample (temperature %g) ---\n%s%s\n", (double) sc.temperature,
               o.prompt ? o.prompt : "", sample);
    }
    rc = 0;
done:
    if (log) fclose(log);
    free(sample);
    lowp_trainer_free(t);
    lowp_moe_free(model);
    lowp_data_free(s.data);
    return rc;
}

/* ---- lowp compare ---- */

#define MAX_RECIPES 16

int lowp_cli_compare(int argc, char **argv) {
    const char *cmd = "compare";
    train_opts o;
    memset(&o, 0, sizeof o);
    int seen[NOPTS] = {0};
    int rc = parse_opts(cmd, 1, argc, argv, &o, seen);
    if (rc >= 0) return rc;
    if (!given(seen, "--temperature")) o.temperature = 0.8f;
    if (o.threads > LOWP_MAX_THREADS) {
        fail(cmd, "--threads: %d is not a thread count (0 to %d)", o.threads, LOWP_MAX_THREADS);
        return 2;
    }
    if (o.threads > 0) omp_set_num_threads(o.threads);
    const char *list = o.recipes ? o.recipes : "bf16,all_mxfp8,all_block_fp8,mix";
    const char *out = o.out ? o.out : "out/compare";

    /* The recipes, checked before any training. */
    char names[MAX_RECIPES][32];
    int nr = 0;
    for (const char *q = list; *q;) {
        const char *comma = strchr(q, ',');
        size_t len = comma ? (size_t) (comma - q) : strlen(q);
        if (len == 0 || len >= sizeof names[0] || nr == MAX_RECIPES) {
            fail(cmd, "--recipes: '%s' is not a comma-separated list of at most %d recipes", list,
                 MAX_RECIPES);
            return 2;
        }
        memcpy(names[nr], q, len);
        names[nr][len] = '\0';
        lowp_recipe r;
        if (lowp_recipe_init(&r, names[nr]) != LOWP_OK) {
            fail(cmd, "--recipes: unknown recipe '%s' (one of %s)", names[nr], lowp_recipe_names());
            return 2;
        }
        nr++;
        q = comma ? comma + 1 : q + len;
    }
    setup s;
    rc = build_setup(cmd, &o, seen, NULL, &s);
    if (rc >= 0) {
        lowp_data_free(s.data);
        return rc;
    }
    if (!given(seen, "--eval-every")) s.tc.eval_every = s.tc.steps >= 20 ? s.tc.steps / 20 : 1;

    FILE *log = NULL;
    if (o.log && !(log = fopen(o.log, "w"))) {
        fail(cmd, "cannot open --log %s: %s", o.log, strerror(errno));
        lowp_data_free(s.data);
        return 2;
    }
    report_run runs[MAX_RECIPES];
    progress prog[MAX_RECIPES];
    char wrapped[MAX_RECIPES][256];
    memset(runs, 0, sizeof runs);
    memset(prog, 0, sizeof prog);
    const int32_t cap = s.tc.steps + 2;
    rc = 0;
    fprintf(stderr, "lowp compare: %d recipes, %d updates each\n  model %s\n  data %s\n", nr,
            (int) s.tc.steps, s.config_desc, s.data_desc);
    for (int i = 0; i < nr && rc == 0; i++) {
        progress *p = &prog[i];
        p->cmd = cmd;
        p->label = names[i];
        p->log = log;
        p->tty = isatty(2);
        p->every =
            o.progress_every > 0 ? o.progress_every : (s.tc.steps >= 10 ? s.tc.steps / 10 : 1);
        p->stop_at = s.tc.steps;
        p->last_loss = p->last_val = NAN;
        p->steps = malloc((size_t) cap * sizeof *p->steps);
        p->val = malloc((size_t) cap * sizeof *p->val);
        p->tps = malloc((size_t) cap * sizeof *p->tps);
        p->cap = cap;
        if (!p->steps || !p->val || !p->tps) {
            fail(cmd, "out of memory");
            rc = 1;
            break;
        }
        lowp_recipe recipe;
        lowp_recipe_init(&recipe, names[i]);
        lowp_moe *model = NULL;
        lowp_trainer *t = NULL;
        lowp_status st = lowp_moe_create(&s.mc, s.tc.seed, &model);
        if (st == LOWP_OK) st = lowp_trainer_create(model, s.data, &recipe, &s.tc, &t);
        if (st != LOWP_OK) {
            rc = lib_fail(cmd, st);
            lowp_moe_free(model);
            break;
        }
        describe_wrapping(t, wrapped[i], sizeof wrapped[i]);
        fprintf(stderr, "[%d/%d] %s: %s\n", i + 1, nr, names[i], wrapped[i]);
        p->t = t;
        const double t0 = omp_get_wtime();
        st = lowp_trainer_run(t, 0, on_step, p);
        const double secs = omp_get_wtime() - t0;
        if (st != LOWP_OK) {
            if (p->tty) fputc('\n', stderr);
            lib_fail(cmd, st);
            rc = 1;
        }
        double flops = 0;
        lowp_moe_flops_per_token(model, s.tc.seq_len, &flops);
        runs[i].recipe = names[i];
        runs[i].points = p->points;
        runs[i].steps = p->steps;
        runs[i].val_loss = p->val;
        runs[i].final_train_loss = p->last_loss;
        runs[i].tokens_per_s = median(p->tps, p->ntps);
        runs[i].gflops = flops * runs[i].tokens_per_s / 1e9;
        runs[i].seconds = secs;
        runs[i].skipped = p->skipped;
        runs[i].wrapped = wrapped[i];
        lowp_trainer_free(t);
        lowp_moe_free(model);
    }
    if (log) fclose(log);
    if (rc == 0) {
        char cmdline[1024];
        int len = snprintf(cmdline, sizeof cmdline, "lowp");
        for (int i = 0; i < argc && len > 0 && (size_t) len < sizeof cmdline; i++)
            len += snprintf(cmdline + len, sizeof cmdline - (size_t) len, " %s", argv[i]);
        report_info info = {s.config_desc, s.data_desc, s.tc.steps, s.tc.batch,
                            s.tc.seq_len,  s.tc.accum,  o.threads,  s.tc.lr,
                            s.tc.min_lr,   s.tc.warmup, s.tc.seed,  cmdline};
        char err[600];
        if (report_write(out, &info, runs, nr, err, sizeof err) != 0) {
            fail(cmd, "%s", err);
            rc = 1;
        } else {
            printf(
                "| recipe | final val loss | tokens/s | GFLOP/s |\n| --- | ---: | ---: | ---: |\n");
            for (int i = 0; i < nr; i++)
                printf("| %s | %.4f | %.0f | %.2f |\n", names[i],
                       runs[i].points ? (double) runs[i].val_loss[runs[i].points - 1] : NAN,
                       runs[i].tokens_per_s, runs[i].gflops);
            printf("report: %s/report.md\nplot: %s/val_loss.svg\n", out, out);
            for (int i = 0; i < nr; i++)
                if (runs[i].points && !isfinite(runs[i].val_loss[runs[i].points - 1])) {
                    fail(cmd, "recipe %s diverged (validation loss is not finite)", names[i]);
                    rc = 1;
                }
        }
    }
    for (int i = 0; i < nr; i++) {
        free(prog[i].steps);
        free(prog[i].val);
        free(prog[i].tps);
    }
    lowp_data_free(s.data);
    return rc;
}
