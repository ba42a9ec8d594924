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
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cli_common.h"
#include "lowp/lowp.h"
#include "lowp/model.h"
#include "lowp/trainer.h"
#include "report.h"

/* ---- Options ---- */

typedef struct train_opts {
    const char *recipe, *recipes, *config, *data, *log, *checkpoint, *resume, *prompt, *out;
    int32_t steps, stop_at, batch, accum, seq_len, warmup, eval_every, eval_batches, threads;
    int32_t checkpoint_every, sample, sample_top_k, progress_every, max_skipped;
    int activation_checkpoint;
    float lr, min_lr, weight_decay, clip, beta1, beta2, temperature;
    uint64_t seed;
    /* model overrides */
    int32_t dim, layers, heads, experts, top_k, expert_hidden, shared_hidden;
    float dropout, aux_loss_coef;
} train_opts;

/* Where an option applies. */
enum { TRAIN_ONLY, BOTH, COMPARE_ONLY };

typedef struct scoped_opt {
    lowp_cli_opt opt;
    int scope;
} scoped_opt;

#define I(name, field, scope)                                                                      \
    { LOWP_CLI_I32(name, train_opts, field, 0, INT32_MAX), scope }
#define F(name, field, scope)                                                                      \
    { LOWP_CLI_FLOAT(name, train_opts, field, 0), scope }
#define S(name, field, scope)                                                                      \
    { LOWP_CLI_STR(name, train_opts, field), scope }
static const scoped_opt OPTS[] = {
    S("--recipe", recipe, TRAIN_ONLY),
    S("--recipes", recipes, COMPARE_ONLY),
    S("--config", config, BOTH),
    S("--data", data, BOTH),
    I("--steps", steps, BOTH),
    I("--stop-at", stop_at, TRAIN_ONLY),
    I("--batch", batch, BOTH),
    I("--accum", accum, BOTH),
    I("--seq-len", seq_len, BOTH),
    F("--lr", lr, BOTH),
    F("--min-lr", min_lr, BOTH),
    I("--warmup", warmup, BOTH),
    F("--weight-decay", weight_decay, BOTH),
    F("--clip", clip, BOTH),
    F("--beta1", beta1, BOTH),
    F("--beta2", beta2, BOTH),
    I("--eval-every", eval_every, BOTH),
    I("--eval-batches", eval_batches, BOTH),
    {LOWP_CLI_U64("--seed", train_opts, seed), BOTH},
    {LOWP_CLI_I32("--threads", train_opts, threads, 0, LOWP_MAX_THREADS), BOTH},
    S("--log", log, BOTH),
    S("--checkpoint", checkpoint, TRAIN_ONLY),
    I("--checkpoint-every", checkpoint_every, TRAIN_ONLY),
    S("--resume", resume, TRAIN_ONLY),
    I("--sample", sample, BOTH),
    F("--temperature", temperature, BOTH),
    I("--sample-top-k", sample_top_k, BOTH),
    S("--prompt", prompt, BOTH),
    I("--progress-every", progress_every, BOTH),
    I("--max-skipped", max_skipped, BOTH),
    {LOWP_CLI_FLAG("--activation-checkpoint", train_opts, activation_checkpoint), BOTH},
    S("--out", out, COMPARE_ONLY),
    I("--dim", dim, BOTH),
    I("--layers", layers, BOTH),
    I("--heads", heads, BOTH),
    I("--experts", experts, BOTH),
    I("--top-k", top_k, BOTH),
    I("--expert-hidden", expert_hidden, BOTH),
    I("--shared-hidden", shared_hidden, BOTH),
    F("--dropout", dropout, BOTH),
    F("--aux-loss-coef", aux_loss_coef, BOTH),
};
#undef I
#undef F
#undef S
#define NOPTS ((int) (sizeof OPTS / sizeof OPTS[0]))

static const char TRAIN_USAGE[] =
    "usage: lowp train [--recipe NAME] [--config NAME] [--data FILE] [--steps N] [OPTIONS]\n"
    "\n"
    "Train the MoE transformer on a text file, character by character (the first 90%% of the\n"
    "bytes train, the last 10%% validate), with AdamW, warm-up and cosine decay, gradient\n"
    "clipping and accumulation. Without --data it trains on a built-in corpus.\n"
    "\n"
    "  --recipe NAME          one of the recipes listed below (default bf16)\n"
    "  --config NAME          tiny, small, medium (MoE) or nanogpt (dense; default tiny)\n"
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
    "  --resume PATH          continue from a checkpoint (bit for bit); the model and training\n"
    "                         options left unset are taken from it; --data is not (give the\n"
    "                         same --data again: the checkpoint stores only its hash)\n"
    "  --sample N             print N sampled characters at the end (default 200, 0: none)\n"
    "  --temperature X        sampling temperature (default 0.8; 0: greedy)\n"
    "  --sample-top-k K       sample from the K most likely (default 0: all)\n"
    "  --prompt TEXT          start the sample with TEXT\n"
    "  --progress-every N     without a terminal, a progress line every N updates\n"
    "  --activation-checkpoint  recompute layer activations in the backward\n"
    "  --max-skipped N        stop after N consecutive updates skipped for a non-finite\n"
    "                         gradient (default 10, 0: never); a non-finite loss always stops\n"
    "  --dim N --layers N --heads N --experts N --top-k N --expert-hidden N\n"
    "  --shared-hidden N --dropout X --aux-loss-coef X   override the configuration\n"
    "\n"
    "Recipes: %s.\n"
    "Exit status: 0 success, 2 bad usage or bad input (data, checkpoint), 1 other failures\n"
    "(including a run that diverged: a non-finite loss or too many skipped updates; no\n"
    "checkpoint is written from a non-finite state).\n";

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

/* The parsed command line of `lowp train` or `lowp compare`. */
typedef struct cmdline {
    const char *cmd;
    train_opts o;
    lowp_cli_opt opts[NOPTS];
    lowp_cli_args args;
    char usage[4096];
} cmdline;

static int given(const struct cmdline *c, const char *name);

/* Returns -1 to go on, else the exit status. */
static int parse_cmdline(cmdline *c, const char *cmd, int compare, int argc, char **argv,
                         int32_t default_sample) {
    memset(c, 0, sizeof *c);
    c->cmd = cmd;
    int n = 0;
    for (int j = 0; j < NOPTS; j++)
        if (OPTS[j].scope == BOTH || OPTS[j].scope == (compare ? COMPARE_ONLY : TRAIN_ONLY))
            c->opts[n++] = OPTS[j].opt;
    snprintf(c->usage, sizeof c->usage, compare ? COMPARE_USAGE : TRAIN_USAGE, lowp_recipe_names());
    lowp_cli_args a = {cmd, c->usage, c->opts, n, &c->o, {0}, {0}, 0};
    c->args = a;
    int rc = lowp_cli_parse(&c->args, argc, argv);
    if (rc >= 0) return rc;
    if (c->args.npos > 0)
        return lowp_cli_fail(cmd, 2, "unexpected argument '%s' (see `lowp %s --help`)",
                             c->args.pos[0], cmd);
    if (!given(c, "--sample")) c->o.sample = default_sample;
    if (!given(c, "--temperature")) c->o.temperature = 0.8f;
    return -1;
}

static int given(const struct cmdline *c, const char *name) {
    return lowp_cli_given(&c->args, name);
}

/* ---- Settings ---- */

typedef struct setup {
    lowp_data *data;
    lowp_moe_config mc;
    lowp_trainer_cfg tc;
    char config_desc[256];
    char data_desc[600];
} setup;

/* The corpus, and on resume the check that it is the checkpoint's. */
static int load_data(const cmdline *c, const lowp_checkpoint_info *ck, setup *s) {
    const char *cmd = c->cmd;
    lowp_status st =
        c->o.data ? lowp_data_from_file(c->o.data, &s->data) : lowp_data_default(&s->data);
    if (st != LOWP_OK) return lowp_cli_lib_fail(cmd, st);
    lowp_data_info di;
    lowp_data_get_info(s->data, &di);
    snprintf(s->data_desc, sizeof s->data_desc, "%s (%lld bytes, vocabulary %d)", di.name,
             (long long) di.bytes, (int) di.vocab);
    if (ck && ck->data_hash != di.hash)
        return lowp_cli_fail(cmd, 2,
                             "the checkpoint was trained on other data (%s, hash %016llx); this "
                             "run's data is %s (hash %016llx): pass the same --data",
                             ck->data_name, (unsigned long long) ck->data_hash, di.name,
                             (unsigned long long) di.hash);
    return -1;
}

/* The model configuration: a preset, or the checkpoint's when nothing overrides it. */
static int model_config(const cmdline *c, const lowp_checkpoint_info *ck, setup *s) {
    static const char *const overrides[] = {
        "--dim",           "--layers",        "--heads",   "--experts",       "--top-k",
        "--expert-hidden", "--shared-hidden", "--dropout", "--aux-loss-coef", "--seq-len"};
    int overridden = 0;
    for (size_t i = 0; i < sizeof overrides / sizeof overrides[0]; i++)
        overridden |= given(c, overrides[i]);
    lowp_data_info di;
    lowp_data_get_info(s->data, &di);
    const train_opts *o = &c->o;
    const char *cfgname = o->config ? o->config : "tiny";
    if (ck && !o->config && !overridden) {
        s->mc = ck->config; /* the checkpoint's, when nothing says otherwise */
        cfgname = "from checkpoint";
    } else if (lowp_moe_config_preset(cfgname, di.vocab, &s->mc) != LOWP_OK) {
        return lowp_cli_fail(c->cmd, 2, "--config: %s", lowp_last_error());
    }
    lowp_moe_config *m = &s->mc;
    if (given(c, "--dim")) m->dim = o->dim;
    if (given(c, "--layers")) m->layers = o->layers;
    if (given(c, "--heads")) m->heads = o->heads;
    if (given(c, "--experts")) m->experts = o->experts;
    if (given(c, "--top-k")) m->top_k = o->top_k;
    if (given(c, "--expert-hidden")) m->expert_hidden = o->expert_hidden;
    if (given(c, "--shared-hidden")) m->shared_hidden = o->shared_hidden;
    if (given(c, "--dropout")) m->dropout = o->dropout;
    if (given(c, "--aux-loss-coef")) m->aux_loss_coef = o->aux_loss_coef;
    if (given(c, "--seq-len")) m->seq_len = o->seq_len;
    snprintf(s->config_desc, sizeof s->config_desc,
             "%s: dim %d, %d layers, %d heads, seq_len %d, %d experts (top-%d, hidden %d), "
             "shared hidden %d, vocabulary %d, dropout %g",
             cfgname, (int) m->dim, (int) m->layers, (int) m->heads, (int) m->seq_len,
             (int) m->experts, (int) m->top_k, (int) m->expert_hidden, (int) m->shared_hidden,
             (int) m->vocab, (double) m->dropout);
    /* Cheap checks before the model's memory is allocated: a sequence the corpus can hold. */
    lowp_status st = lowp_data_check_seq_len(s->data, m->seq_len);
    if (st != LOWP_OK) return lowp_cli_fail(c->cmd, 2, "--seq-len: %s", lowp_last_error());
    return -1;
}

/* The trainer settings: defaults (or the checkpoint's), then the options given. */
static int trainer_settings(const cmdline *c, const lowp_checkpoint_info *ck, setup *s) {
    const train_opts *o = &c->o;
    lowp_trainer_cfg *t = &s->tc;
    if (ck)
        *t = ck->train;
    else
        lowp_trainer_cfg_init(t);
    t->seq_len = s->mc.seq_len;
    if (given(c, "--steps")) t->steps = o->steps;
    if (given(c, "--batch")) t->batch = o->batch;
    if (given(c, "--accum")) t->accum = o->accum;
    if (given(c, "--lr")) t->lr = o->lr;
    if (given(c, "--min-lr"))
        t->min_lr = o->min_lr;
    else if (!ck || given(c, "--lr"))
        t->min_lr = t->lr / 10.0f;
    if (given(c, "--warmup"))
        t->warmup = o->warmup;
    else if (!ck)
        t->warmup = t->steps / 10;
    if (given(c, "--weight-decay")) t->adamw.weight_decay = o->weight_decay;
    if (given(c, "--beta1")) t->adamw.beta1 = o->beta1;
    if (given(c, "--beta2")) t->adamw.beta2 = o->beta2;
    if (given(c, "--clip")) t->clip = o->clip;
    if (given(c, "--eval-every"))
        t->eval_every = o->eval_every;
    else if (!ck)
        t->eval_every = t->steps >= 10 ? t->steps / 10 : 1;
    if (given(c, "--eval-batches")) t->eval_batches = o->eval_batches;
    if (given(c, "--seed")) t->seed = o->seed;
    if (given(c, "--max-skipped")) t->max_skipped = o->max_skipped;
    t->threads = o->threads;
    t->activation_checkpoint = o->activation_checkpoint;
    if (t->batch < 1 || t->accum < 1 || t->eval_batches < 1)
        return lowp_cli_fail(c->cmd, 2, "--batch, --accum and --eval-batches must be at least 1");
    if (t->steps < 1) return lowp_cli_fail(c->cmd, 2, "--steps must be at least 1");
    if (!(t->adamw.beta1 < 1) || !(t->adamw.beta2 < 1))
        return lowp_cli_fail(c->cmd, 2, "--beta1 and --beta2 must be below 1");
    return -1;
}

/* Data, model configuration and trainer settings from the options (and, on resume, from the
 * checkpoint for what the options leave unset). Returns -1 to go on, else the exit status;
 * s->data is set (or NULL) either way. */
static int build_setup(const cmdline *c, const lowp_checkpoint_info *ck, setup *s) {
    memset(s, 0, sizeof *s);
    int rc = load_data(c, ck, s);
    if (rc < 0) rc = model_config(c, ck, s);
    if (rc < 0) rc = trainer_settings(c, ck, s);
    return rc;
}

/* A path the checkpoint can be written to (issue: a run that trains for hours and then cannot
 * save): a temporary file created and removed in its directory, before the first step. */
static int check_writable(const char *cmd, const char *path) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return lowp_cli_fail(cmd, 2, "--checkpoint %s: is a directory", path);
    char *tmpl = lowp_cli_join(path, ".XXXXXX");
    if (!tmpl) return lowp_cli_fail(cmd, 1, "out of memory");
    const int fd = mkstemp(tmpl);
    const int err = errno;
    if (fd >= 0) {
        close(fd);
        unlink(tmpl);
    }
    free(tmpl);
    if (fd < 0)
        return lowp_cli_fail(cmd, 2, "--checkpoint %s: cannot write there: %s", path,
                             strerror(err));
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

static void progress_init(progress *p, const char *cmd, const char *label, FILE *log, int every) {
    memset(p, 0, sizeof *p);
    p->cmd = cmd;
    p->label = label;
    p->log = log;
    p->tty = isatty(2);
    p->every = every;
    p->last_saved = -1;
    p->last_loss = p->last_val = NAN;
}

/* The --log file. A resumed run keeps the lines of the steps up to the checkpoint's and drops
 * later ones (written by a run that went on past the checkpoint and was then resumed from it),
 * so no step is logged twice; the kept lines are rewritten atomically, then appended to. */
static FILE *open_log(const char *path, int resume, int64_t step0) {
    if (!resume) return fopen(path, "w");
    char err[512];
    char *text = lowp_cli_read_text(path, (size_t) 1 << 30, err, sizeof err);
    if (!text) return errno == ENOENT || access(path, F_OK) != 0 ? fopen(path, "w") : NULL;
    char *tmp = lowp_cli_join(path, ".tmp");
    FILE *f = tmp ? fopen(tmp, "w") : NULL;
    for (char *line = text; f && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        int64_t step;
        if (*line && (!lowp_cli_json_int(line, "step", &step) || step <= step0))
            fprintf(f, "%s\n", line);
        if (!nl) break;
        line = nl + 1;
    }
    free(text);
    int ok = f && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f) ok &= fclose(f) == 0;
    ok = ok && rename(tmp, path) == 0;
    if (!ok && tmp) remove(tmp);
    free(tmp);
    return ok ? fopen(path, "a") : NULL;
}

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
            lowp_cli_error(p->cmd, "%s", lowp_last_error());
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

/* One `lowp train` run: what it opened, for the steps below and the cleanup. */
typedef struct train_run {
    cmdline c;
    lowp_checkpoint_info ck;
    int resume;
    setup s;
    lowp_recipe recipe;
    uint64_t model_seed;
    lowp_model *model;
    lowp_trainer *t;
    FILE *log;
    int64_t step0;
    progress p;
} train_run;

/* The checkpoint to resume, the settings, the recipe and the prompt: every input checked
 * before anything big is allocated. */
static int train_inputs(train_run *r) {
    const char *cmd = r->c.cmd;
    const train_opts *o = &r->c.o;
    if (o->checkpoint_every && !o->checkpoint)
        return lowp_cli_fail(cmd, 2, "--checkpoint-every needs --checkpoint PATH");
    if (o->threads > 0) omp_set_num_threads(o->threads);
    r->resume = o->resume != NULL;
    if (r->resume) {
        lowp_status st = lowp_trainer_checkpoint_info(o->resume, &r->ck);
        if (st != LOWP_OK) return lowp_cli_lib_fail(cmd, st);
    }
    int rc = build_setup(&r->c, r->resume ? &r->ck : NULL, &r->s);
    if (rc >= 0) return rc;
    const char *name = o->recipe ? o->recipe : (r->resume ? r->ck.recipe : "bf16");
    if (lowp_recipe_init(&r->recipe, name) != LOWP_OK)
        return lowp_cli_fail(cmd, 2, "--recipe: unknown recipe '%s' (one of %s)", name,
                             lowp_recipe_names());
    if (o->prompt && o->sample > 0) {
        /* Refuse a prompt the vocabulary cannot spell now, not after the training. */
        size_t plen = strlen(o->prompt);
        int32_t *tok = malloc((plen + 1) * sizeof *tok);
        lowp_status pst =
            tok ? lowp_data_encode(r->s.data, o->prompt, plen, tok) : LOWP_ERR_OUT_OF_MEMORY;
        free(tok);
        if (pst != LOWP_OK) return lowp_cli_fail(cmd, 2, "--prompt: %s", lowp_last_error());
    }
    if (o->checkpoint && (rc = check_writable(cmd, o->checkpoint)) >= 0) return rc;
    r->model_seed = r->resume && !given(&r->c, "--seed") ? r->ck.model_seed : r->s.tc.seed;
    return -1;
}

/* The model, the trainer (from the checkpoint on resume) and the log. */
static int train_create(train_run *r) {
    const char *cmd = r->c.cmd;
    const train_opts *o = &r->c.o;
    lowp_status st = lowp_model_create(&r->s.mc, r->model_seed, &r->model);
    if (st == LOWP_OK) st = lowp_trainer_create(r->model, r->s.data, &r->recipe, &r->s.tc, &r->t);
    if (st == LOWP_OK) st = lowp_trainer_set_model_seed(r->t, r->model_seed);
    if (st == LOWP_OK && r->resume) st = lowp_trainer_checkpoint_load(r->t, o->resume);
    if (st != LOWP_OK) return lowp_cli_lib_fail(cmd, st);
    lowp_trainer_get_step(r->t, &r->step0);
    /* A resumed run appends to its log from the step it resumes at: lines of later steps (from
     * a run that went on past the checkpoint) would repeat. */
    if (o->log && !(r->log = open_log(o->log, r->resume, r->step0)))
        return lowp_cli_fail(cmd, 2, "cannot open --log %s: %s", o->log, strerror(errno));
    return -1;
}

static void train_banner(const train_run *r) {
    char wrapped[256];
    describe_wrapping(r->t, wrapped, sizeof wrapped);
    fprintf(stderr, "lowp train: recipe %s (%s)\n  model %s\n  data %s\n", r->recipe.name, wrapped,
            r->s.config_desc, r->s.data_desc);
    if (r->resume)
        fprintf(stderr, "  resuming from %s at step %lld of %d\n", r->c.o.resume,
                (long long) r->step0, (int) r->s.tc.steps);
}

/* The updates, with progress, log and periodic checkpoints, then the final checkpoint. */
static int train_loop(train_run *r, double *secs) {
    const char *cmd = r->c.cmd;
    const train_opts *o = &r->c.o;
    const int32_t steps = r->s.tc.steps;
    progress *p = &r->p;
    progress_init(p, cmd, NULL, r->log,
                  o->progress_every > 0 ? o->progress_every : (steps >= 20 ? steps / 20 : 1));
    p->t = r->t;
    p->checkpoint = o->checkpoint;
    p->checkpoint_every = o->checkpoint_every;
    p->stop_at = o->stop_at > 0 && o->stop_at < steps ? o->stop_at : steps;
    const double t0 = omp_get_wtime();
    lowp_status st = lowp_trainer_run(r->t, p->stop_at, on_step, p);
    *secs = omp_get_wtime() - t0;
    if (st != LOWP_OK) {
        if (p->tty) fputc('\n', stderr);
        lowp_cli_lib_fail(cmd, st);
        return 1; /* the inputs were fine: this failed while training */
    }
    if (p->failed) return 1;
    int64_t step;
    lowp_trainer_get_step(r->t, &step);
    if (o->checkpoint && p->last_saved != step &&
        (st = lowp_trainer_checkpoint_save(r->t, o->checkpoint)) != LOWP_OK) {
        lowp_cli_lib_fail(cmd, st);
        return 1;
    }
    return -1;
}

/* The result line, the divergence verdict and the sample. */
static int train_report(train_run *r, double secs) {
    const char *cmd = r->c.cmd;
    const train_opts *o = &r->c.o;
    const progress *p = &r->p;
    int64_t step;
    lowp_trainer_get_step(r->t, &step);
    if (step > r->step0) {
        printf("trained %s: step %lld/%d, loss %.4f", r->recipe.name, (long long) step,
               (int) r->s.tc.steps, (double) p->last_loss);
        if (isfinite(p->last_val)) printf(", val_loss %.4f", (double) p->last_val);
        printf(", %.1f s", secs);
        if (p->skipped)
            printf(", %lld updates skipped (non-finite gradient)", (long long) p->skipped);
        printf("\n");
    } else {
        printf("nothing to train: the checkpoint is at step %lld of %d\n", (long long) step,
               (int) r->s.tc.steps);
    }
    if (o->checkpoint) printf("checkpoint: %s\n", o->checkpoint);
    if (step > r->step0 && !isfinite(p->last_loss))
        return lowp_cli_fail(cmd, 1, "the loss is %g at step %lld: training diverged",
                             (double) p->last_loss, (long long) step);
    if (o->sample <= 0) return 0;
    lowp_sample_cfg sc;
    lowp_sample_cfg_init(&sc);
    sc.temperature = o->temperature;
    sc.top_k = o->sample_top_k;
    sc.seed = r->s.tc.seed;
    sc.threads = o->threads;
    char *sample = malloc((size_t) o->sample + 1);
    if (!sample) return lowp_cli_fail(cmd, 1, "out of memory for the sample");
    lowp_status st = lowp_sample_text(r->model, r->s.data, &sc, o->prompt, o->sample, sample);
    if (st == LOWP_OK)
        printf("--- sample (temperature %g) ---\n%s%s\n", (double) sc.temperature,
               o->prompt ? o->prompt : "", sample);
    free(sample);
    return st == LOWP_OK ? 0 : lowp_cli_lib_fail(cmd, st);
}

int lowp_cli_train(int argc, char **argv) {
    train_run *r = calloc(1, sizeof *r);
    if (!r) return lowp_cli_fail("train", 1, "out of memory");
    int rc = parse_cmdline(&r->c, "train", 0, argc, argv, 200);
    double secs = 0;
    if (rc < 0) rc = train_inputs(r);
    if (rc < 0) rc = train_create(r);
    if (rc < 0) {
        train_banner(r);
        rc = train_loop(r, &secs);
    }
    if (rc < 0) rc = train_report(r, secs);
    if (r->log) fclose(r->log);
    lowp_trainer_free(r->t);
    lowp_model_free(r->model);
    lowp_data_free(r->s.data);
    free(r);
    return rc;
}

/* ---- lowp compare ---- */

#define MAX_RECIPES 16

typedef struct compare_run {
    cmdline c;
    setup s;
    char names[MAX_RECIPES][32];
    int nr;
    const char *out;
    FILE *log;
    report_run runs[MAX_RECIPES];
    progress prog[MAX_RECIPES];
    char wrapped[MAX_RECIPES][256];
} compare_run;

/* The comma-separated recipes, each checked before any training. */
static int parse_recipes(compare_run *r, const char *list) {
    const char *cmd = r->c.cmd;
    for (const char *q = list; *q;) {
        const char *comma = strchr(q, ',');
        size_t len = comma ? (size_t) (comma - q) : strlen(q);
        if (len == 0 || len >= sizeof r->names[0] || r->nr == MAX_RECIPES)
            return lowp_cli_fail(cmd, 2,
                                 "--recipes: '%s' is not a comma-separated list of at most %d "
                                 "recipes",
                                 list, MAX_RECIPES);
        char *name = r->names[r->nr];
        memcpy(name, q, len);
        name[len] = '\0';
        lowp_recipe rec;
        if (lowp_recipe_init(&rec, name) != LOWP_OK)
            return lowp_cli_fail(cmd, 2, "--recipes: unknown recipe '%s' (one of %s)", name,
                                 lowp_recipe_names());
        r->nr++;
        q = comma ? comma + 1 : q + len;
    }
    return -1;
}

/* Recipe i from the shared initialization: trains it and fills runs[i]. */
static int compare_one(compare_run *r, int i) {
    const char *cmd = r->c.cmd;
    const int32_t steps = r->s.tc.steps;
    progress *p = &r->prog[i];
    progress_init(p, cmd, r->names[i], r->log,
                  r->c.o.progress_every > 0 ? r->c.o.progress_every
                                            : (steps >= 10 ? steps / 10 : 1));
    p->stop_at = steps;
    const size_t cap = (size_t) steps + 2; /* evaluations: at most one per update, plus one */
    p->steps = malloc(cap * sizeof *p->steps);
    p->val = malloc(cap * sizeof *p->val);
    p->tps = malloc(cap * sizeof *p->tps);
    p->cap = (int32_t) (cap > INT32_MAX ? INT32_MAX : cap);
    if (!p->steps || !p->val || !p->tps)
        return lowp_cli_fail(cmd, 1, "out of memory for the records of %d updates", (int) steps);
    lowp_recipe recipe;
    lowp_recipe_init(&recipe, r->names[i]);
    lowp_model *model = NULL;
    lowp_trainer *t = NULL;
    lowp_status st = lowp_model_create(&r->s.mc, r->s.tc.seed, &model);
    if (st == LOWP_OK) st = lowp_trainer_create(model, r->s.data, &recipe, &r->s.tc, &t);
    if (st != LOWP_OK) {
        lowp_model_free(model);
        return lowp_cli_lib_fail(cmd, st);
    }
    describe_wrapping(t, r->wrapped[i], sizeof r->wrapped[i]);
    fprintf(stderr, "[%d/%d] %s: %s\n", i + 1, r->nr, r->names[i], r->wrapped[i]);
    p->t = t;
    const double t0 = omp_get_wtime();
    st = lowp_trainer_run(t, 0, on_step, p);
    const double secs = omp_get_wtime() - t0;
    int rc = -1;
    if (st != LOWP_OK) {
        if (p->tty) fputc('\n', stderr);
        lowp_cli_lib_fail(cmd, st);
        rc = 1;
    }
    double flops = 0;
    lowp_model_flops_per_token(model, r->s.tc.seq_len, &flops);
    report_run *run = &r->runs[i];
    run->recipe = r->names[i];
    run->points = p->points;
    run->steps = p->steps;
    run->val_loss = p->val;
    run->final_train_loss = p->last_loss;
    run->tokens_per_s = median(p->tps, p->ntps);
    run->gflops = flops * run->tokens_per_s / 1e9;
    run->seconds = secs;
    run->skipped = p->skipped;
    run->wrapped = r->wrapped[i];
    lowp_trainer_free(t);
    lowp_model_free(model);
    return rc;
}

/* report.md and val_loss.svg, the summary table, and the divergence verdict. */
static int compare_report(compare_run *r, int argc, char **argv) {
    const char *cmd = r->c.cmd;
    char cmdline_text[1024];
    int len = snprintf(cmdline_text, sizeof cmdline_text, "lowp");
    for (int i = 0; i < argc && len > 0 && (size_t) len < sizeof cmdline_text; i++)
        len += snprintf(cmdline_text + len, sizeof cmdline_text - (size_t) len, " %s", argv[i]);
    const lowp_trainer_cfg *tc = &r->s.tc;
    report_info info = {r->s.config_desc, r->s.data_desc, tc->steps,      tc->batch,
                        tc->seq_len,      tc->accum,      r->c.o.threads, tc->lr,
                        tc->min_lr,       tc->warmup,     tc->seed,       cmdline_text};
    char err[600];
    if (report_write(r->out, &info, r->runs, r->nr, err, sizeof err) != 0)
        return lowp_cli_fail(cmd, 1, "%s", err);
    printf("| recipe | final val loss | tokens/s | GFLOP/s |\n| --- | ---: | ---: | ---: |\n");
    for (int i = 0; i < r->nr; i++)
        printf("| %s | %.4f | %.0f | %.2f |\n", r->names[i],
               r->runs[i].points ? (double) r->runs[i].val_loss[r->runs[i].points - 1] : NAN,
               r->runs[i].tokens_per_s, r->runs[i].gflops);
    printf("report: %s/report.md\nplot: %s/val_loss.svg\n", r->out, r->out);
    int rc = 0;
    for (int i = 0; i < r->nr; i++)
        if (r->runs[i].points && !isfinite(r->runs[i].val_loss[r->runs[i].points - 1]))
            rc = lowp_cli_fail(cmd, 1, "recipe %s diverged (validation loss is not finite)",
                               r->names[i]);
    return rc;
}

int lowp_cli_compare(int argc, char **argv) {
    compare_run *r = calloc(1, sizeof *r);
    if (!r) return lowp_cli_fail("compare", 1, "out of memory");
    int rc = parse_cmdline(&r->c, "compare", 1, argc, argv, 0);
    const train_opts *o = &r->c.o;
    if (rc < 0) {
        if (o->threads > 0) omp_set_num_threads(o->threads);
        r->out = o->out ? o->out : "out/compare";
        rc = parse_recipes(r, o->recipes ? o->recipes : "bf16,all_mxfp8,all_block_fp8,mix");
    }
    if (rc < 0) rc = build_setup(&r->c, NULL, &r->s);
    if (rc < 0) {
        if (!given(&r->c, "--eval-every"))
            r->s.tc.eval_every = r->s.tc.steps >= 20 ? r->s.tc.steps / 20 : 1;
        if (o->log && !(r->log = fopen(o->log, "w")))
            rc = lowp_cli_fail(r->c.cmd, 2, "cannot open --log %s: %s", o->log, strerror(errno));
    }
    if (rc < 0) {
        fprintf(stderr, "lowp compare: %d recipes, %d updates each\n  model %s\n  data %s\n", r->nr,
                (int) r->s.tc.steps, r->s.config_desc, r->s.data_desc);
        for (int i = 0; i < r->nr && rc < 0; i++) rc = compare_one(r, i);
    }
    if (r->log) fclose(r->log);
    if (rc < 0) rc = compare_report(r, argc, argv);
    for (int i = 0; i < r->nr; i++) {
        free(r->prog[i].steps);
        free(r->prog[i].val);
        free(r->prog[i].tps);
    }
    lowp_data_free(r->s.data);
    free(r);
    return rc;
}
