/* `lowp bench train`: training throughput of the MoE model per configuration and recipe.
 *
 * For each configuration and recipe: build the model on the built-in corpus's vocabulary,
 * wrap it with the recipe, run one untimed update (first-touch of the activation arena, the
 * weight caches), then time --steps full updates (forward, backward, clipping, AdamW,
 * lowp_train_step_end; no evaluation). Reports the median update's tokens/s and the achieved
 * GFLOP/s = FLOPs per token (6 x active parameters + attention, lowp_model_flops_per_token) x
 * tokens/s. Runs on 2 threads unless told otherwise: the machines this is tuned for have two
 * cores, and a fixed count makes runs comparable.
 *
 * The phase profile (profile.h) splits the timed updates' mean into GEMMs, quantization,
 * attention, norms and elementwise, optimizer, data, and the rest. MFU is the achieved
 * GFLOP/s over the rate of lowp's BF16 GEMM measured at the start of the same run, on the
 * same threads, at 2048 x 2048 x 2048 (the machine's attainable GEMM rate).
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cli.h"
#include "lowp/lowp.h"
#include "lowp/model.h"
#include "lowp/trainer.h"

#define DEFAULT_RECIPES "bf16,fp8_delayed,fp8_rowwise,all_mxfp8,block128,all_block_fp8,mix"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lowp bench train [--json] [--configs LIST] [--recipes LIST] [--steps N]\n"
            "                        [--batch N] [--threads N]\n"
            "  --configs LIST   tiny, small, medium, nanogpt (default small,medium)\n"
            "  --recipes LIST   recipes (default " DEFAULT_RECIPES ")\n"
            "  --steps N        timed updates per run, after one untimed (default 3)\n"
            "  --batch N        sequences per update (default 8), at the configuration's seq_len\n"
            "  --threads N      threads (default 2)\n"
            "  --json           one JSON object per line instead of the table\n"
            "  --no-profile     skip the per-phase columns\n"
            "Tokens/s is the median over the timed updates; GFLOP/s counts 6 x active parameters\n"
            "per token plus attention.\n");
}

/* GFLOP/s of lowp's BF16 GEMM at 2048^3 on the current threads: the best of 7 calls, after
 * calls for at least a quarter of a second. 0 when it cannot run. The best, not the median:
 * on a shared host the median of 5 after one warm-up call read 16-47% under the steady rate
 * in some processes (the first calls of a process ramping up on an AMX Xeon, and another
 * tenant taking one of the two vCPUs for 50 ms at a time), which inflated the MFU by as much. */
static double bf16_gemm_rate(int threads) {
    enum { S = 2048 };
    const size_t n = (size_t) S * S;
    uint16_t *a = lowp_bench_alloc(n * 2), *b = lowp_bench_alloc(n * 2);
    float *c = lowp_bench_alloc(n * sizeof(float));
    double rate = 0;
    if (a && b && c) {
        for (size_t i = 0; i < n; i++) {
            /* BF16 values in [-1, 1): finite, no subnormals */
            const uint32_t r = (uint32_t) (i * 2654435761u) >> 9;
            const float x = (float) r / (float) (1u << 22) - 1.0f, y = -x;
            uint32_t ux, uy;
            memcpy(&ux, &x, 4);
            memcpy(&uy, &y, 4);
            a[i] = (uint16_t) (ux >> 16);
            b[i] = (uint16_t) (uy >> 16);
        }
        lowp_qtensor qa = {0}, qb = {0};
        qa.format = qb.format = LOWP_FORMAT_BF16;
        qa.scaling = qb.scaling = LOWP_SCALING_NONE;
        qa.rows = qa.cols = qb.rows = qb.cols = S;
        qa.data = a;
        qb.data = b;
        qa.device = qb.device = LOWP_DEVICE_HOST;
        lowp_tensor ct = {LOWP_FORMAT_F32, S, S, c, LOWP_DEVICE_HOST};
        lowp_gemm_cfg gc;
        lowp_gemm_cfg_init(&gc);
        gc.threads = threads;
        int ok = 1;
        for (const double w0 = lowp_bench_now(); ok && lowp_bench_now() - w0 < 0.25;)
            ok = lowp_gemm(&qa, &qb, &ct, &gc) == LOWP_OK;
        double best = 0;
        for (int r = 0; ok && r < 7; r++) {
            const double t0 = lowp_bench_now();
            ok = lowp_gemm(&qa, &qb, &ct, &gc) == LOWP_OK;
            const double t = lowp_bench_now() - t0;
            if (r == 0 || t < best) best = t;
        }
        rate = ok && best > 0 ? 2.0 * S * S * (double) S / best / 1e9 : 0;
    }
    lowp_bench_free(a);
    lowp_bench_free(b);
    lowp_bench_free(c);
    return rate;
}

/* The phases shown, in order, and their column titles. */
static const lowp_phase k_shown[] = {LOWP_PHASE_GEMM,      LOWP_PHASE_QUANT,
                                     LOWP_PHASE_ATTENTION, LOWP_PHASE_ELEMENTWISE,
                                     LOWP_PHASE_OPTIMIZER, LOWP_PHASE_DATA};
#define N_SHOWN ((int) (sizeof k_shown / sizeof k_shown[0]))

/* What one configuration and recipe measured. */
typedef struct train_result {
    double med, tps, gflops,
        mfu;               /* median update (s), tokens/s, GFLOP/s, its share of the GEMM rate */
    int64_t active, total; /* parameters */
    double share[LOWP_PHASE_COUNT]; /* of the mean timed update, by phase (with --profile) */
    float loss;                     /* of the last update */
} train_result;

/* The model (seed 1234) and a trainer on a flat schedule without evaluation; 2 (with a line on
 * stderr) when the configuration or recipe is unknown. */
static int bench_setup(const char *config, const char *recipe_name, const lowp_data *data,
                       int batch, int threads, lowp_moe_config *mc, lowp_model **m,
                       lowp_trainer **t, lowp_status *st) {
    lowp_data_info di;
    lowp_data_get_info(data, &di);
    lowp_recipe recipe;
    if (lowp_moe_config_preset(config, di.vocab, mc) != LOWP_OK) {
        fprintf(stderr, "lowp bench train: --configs: %s\n", lowp_last_error());
        return 2;
    }
    if (lowp_recipe_init(&recipe, recipe_name) != LOWP_OK) {
        fprintf(stderr, "lowp bench train: --recipes: unknown recipe '%s' (one of %s)\n",
                recipe_name, lowp_recipe_names());
        return 2;
    }
    lowp_trainer_cfg tc;
    lowp_trainer_cfg_init(&tc);
    tc.steps = 1 << 30; /* no evaluation, a flat schedule */
    tc.warmup = 0;
    tc.batch = batch;
    tc.threads = threads;
    *st = lowp_model_create(mc, 1234, m);
    if (*st == LOWP_OK) *st = lowp_trainer_create(*m, data, &recipe, &tc, t);
    return 0;
}

/* One untimed update, then `steps` timed ones into secs[0 .. steps-1] (the profile, when on,
 * covers the timed ones: phase[] and their sum *step_sum). */
static lowp_status bench_steps(lowp_trainer *t, int steps, int profile, double *secs, double *phase,
                               double *step_sum, lowp_step_report *r) {
    lowp_status st = LOWP_OK;
    for (int i = 0; st == LOWP_OK && i <= steps; i++) {
        if (i == 1 && profile) {
            lowp_profile_enable(1);
            lowp_profile_reset();
        }
        st = lowp_trainer_step(t, r);
        if (i > 0) {
            secs[i - 1] = r->step_s;
            *step_sum += r->step_s;
        }
    }
    if (profile) {
        lowp_profile_read(phase);
        lowp_profile_enable(0);
    }
    return st;
}

/* Rates, MFU and phase shares from the timings. */
static void bench_summarize(const lowp_model *m, const lowp_moe_config *mc, int batch, int steps,
                            double *secs, const double *phase, double step_sum, double gemm_rate,
                            train_result *res) {
    double flops = 0;
    lowp_model_flops_per_token(m, mc->seq_len, &flops);
    lowp_model_active_params(m, &res->active, &res->total);
    res->med = lowp_bench_median(secs, (size_t) steps);
    const double tokens = (double) batch * mc->seq_len;
    res->tps = res->med > 0 ? tokens / res->med : 0;
    res->gflops = flops * res->tps / 1e9;
    res->mfu = gemm_rate > 0 ? res->gflops / gemm_rate : 0;
    /* Phase shares of the mean timed update (the profile sums all of them). */
    double marked = 0;
    memset(res->share, 0, sizeof res->share);
    for (int p = 1; p < LOWP_PHASE_COUNT; p++) {
        res->share[p] = step_sum > 0 ? phase[p] / step_sum : 0;
        marked += res->share[p];
    }
    res->share[LOWP_PHASE_OTHER] = marked < 1 ? 1 - marked : 0;
}

static void bench_print_json(const char *config, const char *recipe_name, int threads, int batch,
                             int seq_len, int steps, int profile, double gemm_rate,
                             const train_result *res) {
    lowp_bench_json j;
    lowp_bench_json_begin(&j);
    lowp_bench_json_str(&j, "bench", "train");
    lowp_bench_json_str(&j, "config", config);
    lowp_bench_json_str(&j, "recipe", recipe_name);
    lowp_bench_json_int(&j, "threads", threads);
    lowp_bench_json_int(&j, "batch", batch);
    lowp_bench_json_int(&j, "seq_len", seq_len);
    lowp_bench_json_int(&j, "active_params", (long long) res->active);
    lowp_bench_json_int(&j, "total_params", (long long) res->total);
    lowp_bench_json_int(&j, "steps", steps);
    lowp_bench_json_num(&j, "step_s", res->med);
    lowp_bench_json_num(&j, "tokens_per_s", res->tps);
    lowp_bench_json_num(&j, "gflops", res->gflops);
    lowp_bench_json_num(&j, "bf16_gemm_gflops", gemm_rate);
    lowp_bench_json_str(&j, "pages", lowp_bench_pages());
    lowp_bench_json_num(&j, "mfu", res->mfu);
    if (profile) {
        char key[48];
        for (int p = 0; p < LOWP_PHASE_COUNT; p++) {
            snprintf(key, sizeof key, "share_%s", lowp_phase_name((lowp_phase) p));
            lowp_bench_json_num(&j, key, res->share[p]);
        }
    }
    lowp_bench_json_num(&j, "loss", res->loss);
    lowp_bench_json_end(&j, stdout);
}

static void bench_print_row(const char *config, const char *recipe_name, int profile,
                            const train_result *res) {
    printf("%-8s %-13s %7.1fM %9.2f %9.0f %8.1f %5.1f%%", config, recipe_name,
           (double) res->active / 1e6, res->med * 1e3, res->tps, res->gflops, 100 * res->mfu);
    if (profile) {
        for (int p = 0; p < N_SHOWN; p++) printf(" %5.1f", 100 * res->share[k_shown[p]]);
        printf(" %5.1f", 100 * res->share[LOWP_PHASE_OTHER]);
    }
    printf("\n");
}

static int bench_one(const char *config, const char *recipe_name, const lowp_data *data, int steps,
                     int batch, int threads, int json, int profile, double gemm_rate) {
    lowp_moe_config mc;
    lowp_model *m = NULL;
    lowp_trainer *t = NULL;
    lowp_status st = LOWP_OK;
    const int bad = bench_setup(config, recipe_name, data, batch, threads, &mc, &m, &t, &st);
    if (bad) return bad;
    double *secs = calloc((size_t) steps + 1, sizeof *secs);
    lowp_step_report r;
    double phase[LOWP_PHASE_COUNT] = {0}, step_sum = 0;
    if (st == LOWP_OK && secs) st = bench_steps(t, steps, profile, secs, phase, &step_sum, &r);
    int rc = 0;
    if (st != LOWP_OK || !secs) {
        fprintf(stderr, "lowp bench train: %s / %s: %s\n", config, recipe_name,
                secs ? lowp_last_error() : "out of memory");
        rc = 1;
    } else {
        train_result res;
        bench_summarize(m, &mc, batch, steps, secs, phase, step_sum, gemm_rate, &res);
        res.loss = r.loss;
        if (json)
            bench_print_json(config, recipe_name, threads, batch, mc.seq_len, steps, profile,
                             gemm_rate, &res);
        else
            bench_print_row(config, recipe_name, profile, &res);
        fflush(stdout);
    }
    free(secs);
    lowp_trainer_free(t);
    lowp_model_free(m);
    return rc;
}

/* Calls fn on each item of a comma-separated list; stops at the first nonzero status. */
static int for_each(const char *list, int (*fn)(const char *item, void *ctx), void *ctx) {
    char item[64];
    for (const char *q = list; *q;) {
        const char *comma = strchr(q, ',');
        size_t len = comma ? (size_t) (comma - q) : strlen(q);
        if (len == 0 || len >= sizeof item) {
            fprintf(stderr, "lowp bench train: bad list '%s'\n", list);
            return 2;
        }
        memcpy(item, q, len);
        item[len] = '\0';
        int rc = fn(item, ctx);
        if (rc) return rc;
        q = comma ? comma + 1 : q + len;
    }
    return 0;
}

static int check_config(const char *config, void *ctx) {
    lowp_moe_config mc;
    (void) ctx;
    if (lowp_moe_config_preset(config, 64, &mc) == LOWP_OK) return 0;
    fprintf(stderr, "lowp bench train: --configs: %s\n", lowp_last_error());
    return 2;
}

static int check_recipe(const char *name, void *ctx) {
    lowp_recipe r;
    (void) ctx;
    if (lowp_recipe_init(&r, name) == LOWP_OK) return 0;
    fprintf(stderr, "lowp bench train: --recipes: unknown recipe '%s' (one of %s)\n", name,
            lowp_recipe_names());
    return 2;
}

typedef struct bench_ctx {
    const char *recipes;
    const char *config;
    const lowp_data *data;
    int steps, batch, threads, json, profile;
    double gemm_rate;
} bench_ctx;

static int run_recipe(const char *recipe, void *ctx) {
    bench_ctx *c = ctx;
    return bench_one(c->config, recipe, c->data, c->steps, c->batch, c->threads, c->json,
                     c->profile, c->gemm_rate);
}

static int run_config(const char *config, void *ctx) {
    bench_ctx *c = ctx;
    c->config = config;
    return for_each(c->recipes, run_recipe, c);
}

int lowp_bench_train(int argc, char **argv) {
    bench_ctx c = {DEFAULT_RECIPES, NULL, NULL, 3, 8, 2, 0, 1, 0};
    const char *configs = "small,medium";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) {
            c.json = 1;
        } else if (strcmp(a, "--no-profile") == 0) {
            c.profile = 0;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (i + 1 < argc && strcmp(a, "--configs") == 0) {
            configs = argv[++i];
        } else if (i + 1 < argc && strcmp(a, "--recipes") == 0) {
            c.recipes = argv[++i];
        } else if (i + 1 < argc && (strcmp(a, "--steps") == 0 || strcmp(a, "--batch") == 0 ||
                                    strcmp(a, "--threads") == 0)) {
            int v;
            if (lowp_bench_parse_int(argv[i + 1], &v) != 0) {
                fprintf(stderr, "lowp bench train: %s: '%s' is not a positive integer\n", a,
                        argv[i + 1]);
                return 2;
            }
            *(strcmp(a, "--steps") == 0   ? &c.steps
              : strcmp(a, "--batch") == 0 ? &c.batch
                                          : &c.threads) = v;
            i++;
        } else {
            fprintf(stderr, "lowp bench train: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    /* Names first: a typo should not cost the minutes of the runs before it. */
    int rc = for_each(configs, check_config, NULL);
    if (rc == 0) rc = for_each(c.recipes, check_recipe, NULL);
    if (rc) return rc;
    omp_set_num_threads(c.threads);
    lowp_data *data = NULL;
    if (lowp_data_default(&data) != LOWP_OK) {
        fprintf(stderr, "lowp bench train: %s\n", lowp_last_error());
        return 1;
    }
    c.data = data;
    c.gemm_rate = bf16_gemm_rate(c.threads);
    if (!c.json) {
        printf("lowp bench train: %d threads, batch %d, median of %d updates after 1 untimed, "
               "pages %s (from 4 MiB); BF16 GEMM 2048^3 %.1f GFLOP/s (MFU = GFLOP/s over it)\n",
               c.threads, c.batch, c.steps, lowp_bench_pages(), c.gemm_rate);
        printf("%-8s %-13s %8s %9s %9s %8s %6s", "config", "recipe", "active", "step_ms",
               "tokens/s", "GFLOP/s", "MFU");
        if (c.profile)
            printf(" %5s %5s %5s %5s %5s %5s %5s  (%% of the mean update)", "gemm", "quant", "attn",
                   "elem", "optim", "data", "other");
        printf("\n");
    }
    rc = for_each(configs, run_config, &c);
    lowp_data_free(data);
    return rc;
}
