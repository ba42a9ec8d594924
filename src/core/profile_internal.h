/* Phase marks for the library's own code (profile.h): lowp_prof_push(p) opens phase p and
 * lowp_prof_pop() closes the innermost one; both are one branch while profiling is off. Not
 * installed. */
#ifndef LOWP_PROFILE_INTERNAL_H
#define LOWP_PROFILE_INTERNAL_H

#include "internal.h"
#include "lowp/profile.h"

LOWP_HIDDEN extern int lowp_prof_on_flag;
LOWP_HIDDEN void lowp_prof_push_slow(int phase);
LOWP_HIDDEN void lowp_prof_pop_slow(void);

static inline void lowp_prof_push(lowp_phase phase) {
    if (lowp_prof_on_flag) lowp_prof_push_slow((int) phase);
}
static inline void lowp_prof_pop(void) {
    if (lowp_prof_on_flag) lowp_prof_pop_slow();
}

#endif
