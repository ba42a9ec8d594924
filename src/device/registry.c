/* STUB (to be replaced by the device-layer work): CPU-only registry. */
#include "core/internal.h"
#include "cpu/cpu.h"
static lowp_backend_reg g_cpu;
static int g_init;
lowp_status lowp_backend_get(int32_t type, const lowp_backend_iface **iface, void **ctx) {
    if (!g_init) { lowp_cpu_backend_entry(&g_cpu); g_init = 1; }
    if (type != 0) return lowp_fail(LOWP_ERR_NOT_FOUND, "lowp_backend_get: type (%d)", type);
    *iface = g_cpu.iface; *ctx = g_cpu.ctx; return LOWP_OK;
}
lowp_status lowp_backend_name(int32_t type, const char **name) { (void) type; *name = "cpu"; return LOWP_OK; }
