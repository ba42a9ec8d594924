/* The phase profile of profile.h: a small stack of open phases on the calling thread. Opening
 * a phase charges the time since the last mark to the phase below it; closing charges it to
 * the phase being closed. Marks from other threads (inside OpenMP regions) are ignored, so the
 * stack is only ever touched by one thread at a time. */
#include <omp.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "lowp/profile.h"
#include "profile_internal.h"

#define STACK_MAX 16

int lowp_prof_on_flag;
static double g_secs[LOWP_PHASE_COUNT];
static int g_stack[STACK_MAX];
static int g_depth;
static double g_last;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

/* Charge the time since the last mark to the open phase. */
static void charge(void) {
    const double t = now_s();
    if (g_depth > 0) g_secs[g_stack[g_depth - 1]] += t - g_last;
    g_last = t;
}

void lowp_prof_push_slow(int phase) {
    if (omp_in_parallel()) return;
    charge();
    if (g_depth < STACK_MAX) g_stack[g_depth] = phase;
    g_depth++;
}

void lowp_prof_pop_slow(void) {
    if (omp_in_parallel() || g_depth == 0) return;
    charge();
    g_depth--;
}

void lowp_profile_enable(int on) {
    if (on && !lowp_prof_on_flag) g_depth = 0;
    lowp_prof_on_flag = on != 0;
}

void lowp_profile_reset(void) {
    memset(g_secs, 0, sizeof g_secs);
    g_depth = 0; /* a failed call may have left its phases open */
    g_last = now_s();
}

lowp_status lowp_profile_read(double *secs) {
    LOWP_CHECK_PTR("lowp_profile_read", secs);
    memcpy(secs, g_secs, sizeof g_secs);
    return LOWP_OK;
}

const char *lowp_phase_name(lowp_phase phase) {
    static const char *const names[LOWP_PHASE_COUNT] = {
        "other", "gemm", "quant", "attention", "elementwise", "optimizer", "data"};
    return (int) phase >= 0 && phase < LOWP_PHASE_COUNT ? names[phase] : NULL;
}
