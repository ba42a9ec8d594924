/* STUB: CPU backend vtable */
#include "cpu.h"
static lowp_status cpu_cast(void *ctx, int32_t index, const lowp_tensor *src, lowp_tensor *dst, const lowp_cast_cfg *cfg) {
    (void) ctx; (void) index; return lowp_cpu_cast(src, dst, cfg);
}
static const lowp_backend_iface g_iface = {.cast = cpu_cast};
lowp_status lowp_cpu_backend_entry(lowp_backend_reg *reg) {
    reg->api_version = LOWP_BACKEND_API_VERSION; reg->struct_size = sizeof *reg; reg->name = "cpu"; reg->iface = &g_iface; reg->ctx = NULL;
    return LOWP_OK;
}
