/* STUB: capability detection */
#include "cpu.h"
static lowp_caps g_caps;
const lowp_caps *lowp_cpu_caps(void) { return &g_caps; }
