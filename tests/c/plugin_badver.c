/* A backend built "against other headers": everything is valid except api_version, which is
 * one ahead of the library's. test_device checks that lowp_backend_load refuses it with
 * LOWP_ERR_VERSION and a message that names both versions. The entry has no side effects,
 * because a refused plugin of an unknown layout gets no destroy call. */
#include "lowp/device.h"

static lowp_status bv_device_count(void *ctx, int32_t *count) {
    (void) ctx;
    *count = 1;
    return LOWP_OK;
}

static lowp_status bv_synchronize(void *ctx, int32_t index) {
    (void) ctx;
    (void) index;
    return LOWP_OK;
}

static lowp_status bv_alloc(void *ctx, int32_t index, size_t nbytes, void **ptr) {
    (void) ctx;
    (void) index;
    (void) nbytes;
    *ptr = 0;
    return LOWP_ERR_OUT_OF_MEMORY;
}

static lowp_status bv_free(void *ctx, int32_t index, void *ptr) {
    (void) ctx;
    (void) index;
    (void) ptr;
    return LOWP_OK;
}

static const lowp_backend_iface k_iface = {
    .device_count = bv_device_count,
    .synchronize = bv_synchronize,
    .alloc = bv_alloc,
    .free = bv_free,
};

__attribute__((visibility("default"))) lowp_status lowp_backend_entry(lowp_backend_reg *reg) {
    reg->api_version = LOWP_BACKEND_API_VERSION + 1;
    reg->struct_size = sizeof *reg;
    reg->name = "badver";
    reg->iface = &k_iface;
    reg->ctx = 0;
    return LOWP_OK;
}
