/* The phase profile (profile.h): nested phases charge their own time to the innermost open
 * phase, nothing is charged while profiling is off, marks from inside an OpenMP region are
 * ignored, and a step of the trainer spends time in the phases the model marks. */
#include <omp.h>
#include <string.h>
#include <time.h>

#include "core/profile_internal.h"
#include "lowp/lowp.h"
#include "testutil.h"

/* Waits until `secs` of wall time have passed. */
static void wait_s(double secs) {
    const double t0 = now_s();
    while (now_s() - t0 < secs) {
    }
}

static double sum(const double *s) {
    double t = 0;
    for (int p = 0; p < LOWP_PHASE_COUNT; p++) t += s[p];
    return t;
}

int main(void) {
    double s[LOWP_PHASE_COUNT];
    CHECK(strcmp(lowp_phase_name(LOWP_PHASE_GEMM), "gemm") == 0);
    CHECK(strcmp(lowp_phase_name(LOWP_PHASE_DATA), "data") == 0);
    CHECK(lowp_phase_name(LOWP_PHASE_COUNT) == NULL);
    CHECK(lowp_profile_read(NULL) == LOWP_ERR_INVALID_ARG);

    /* Off: nothing is charged. */
    lowp_profile_reset();
    lowp_prof_push(LOWP_PHASE_GEMM);
    wait_s(0.005);
    lowp_prof_pop();
    CHECK_OK(lowp_profile_read(s));
    CHECK(sum(s) == 0.0);

    /* On: gemm [quant] gemm; quant's time is not gemm's. */
    lowp_profile_enable(1);
    lowp_profile_reset();
    const double t0 = now_s();
    lowp_prof_push(LOWP_PHASE_GEMM);
    wait_s(0.010);
    lowp_prof_push(LOWP_PHASE_QUANT);
    wait_s(0.020);
#pragma omp parallel num_threads(2)
    {
        lowp_prof_push(LOWP_PHASE_DATA); /* ignored: inside a parallel region */
        lowp_prof_pop();
    }
    lowp_prof_pop();
    wait_s(0.010);
    lowp_prof_pop();
    const double elapsed = now_s() - t0;
    CHECK_OK(lowp_profile_read(s));
    CHECKF(s[LOWP_PHASE_GEMM] >= 0.020 && s[LOWP_PHASE_QUANT] >= 0.020, "gemm %g quant %g",
           s[LOWP_PHASE_GEMM], s[LOWP_PHASE_QUANT]);
    CHECKF(sum(s) <= elapsed + 1e-9, "phases %g > elapsed %g", sum(s), elapsed);
    CHECK(s[LOWP_PHASE_DATA] == 0.0);

    /* A trainer step: the model marks GEMMs, quantization, attention, elementwise, the
     * optimizer and the data. */
    lowp_data *data = NULL;
    CHECK_OK(lowp_data_default(&data));
    lowp_data_info di;
    lowp_data_get_info(data, &di);
    lowp_moe_config mc;
    CHECK_OK(lowp_moe_config_preset("tiny", di.vocab, &mc));
    lowp_moe *m = NULL;
    CHECK_OK(lowp_moe_create(&mc, 1, &m));
    lowp_recipe r;
    CHECK_OK(lowp_recipe_init(&r, "all_mxfp8"));
    lowp_trainer_cfg tc;
    lowp_trainer_cfg_init(&tc);
    tc.steps = 100;
    tc.batch = 2;
    tc.threads = 1;
    lowp_trainer *t = NULL;
    CHECK_OK(lowp_trainer_create(m, data, &r, &tc, &t));
    lowp_step_report rep;
    lowp_profile_reset();
    CHECK_OK(lowp_trainer_step(t, &rep));
    CHECK_OK(lowp_profile_read(s));
    for (int p = LOWP_PHASE_GEMM; p < LOWP_PHASE_COUNT; p++)
        CHECKF(s[p] > 0, "phase %s: %g s", lowp_phase_name((lowp_phase) p), s[p]);
    CHECKF(sum(s) <= rep.step_s * 1.01 + 1e-4, "phases %g s > step %g s", sum(s), rep.step_s);
    lowp_profile_enable(0);
    lowp_trainer_free(t);
    lowp_moe_free(m);
    lowp_data_free(data);
    return testutil_finish();
}
