/* The device layer's internal interface, shared by the registry (registry.c), the plugin
 * loader (plugin.c) and the ops layer above.
 * Not installed. */
#ifndef LOWP_DEVICE_REGISTRY_H
#define LOWP_DEVICE_REGISTRY_H

#include "core/internal.h"
#include "lowp/device.h"

/* Run the one-time registry setup (built-in backends, then LOWP_BACKEND_PATH) if no one has
 * yet. Every public device function calls it first. */
LOWP_HIDDEN void lowp_registry_ensure(void);

/* Validate and add a backend. `fn` names the public function for messages; `dl_handle` is the
 * plugin's dlopen handle (NULL for in-process backends), kept for the life of the process.
 * Does not run lowp_registry_ensure, so the setup itself may call it. */
LOWP_HIDDEN lowp_status lowp_registry_add(const char *fn, const lowp_backend_reg *reg,
                                          void *dl_handle, int32_t *type_out);

/* dlopen `path`, run its entry and add it (plugin.c). Like lowp_registry_add it does not run
 * the setup, so the setup can load LOWP_BACKEND_PATH with it. */
LOWP_HIDDEN lowp_status lowp_plugin_open(const char *path, int32_t *type_out);

/* Check that `dev` names a registered type and an existing index, and return its backend.
 * Messages read "<fn>: <arg>.index (3) >= device count (2) of \"testdev\"". For the ops
 * layer too: lowp_device_resolve("lowp_cast", "src.device", src->device, &iface, &ctx). */
LOWP_HIDDEN lowp_status lowp_device_resolve(const char *fn, const char *arg, lowp_device dev,
                                            const lowp_backend_iface **iface, void **ctx);

/* Around a call into a backend's vtable from the ops layer: lowp_call_begin saves and clears
 * the thread's message; lowp_call_end restores it after a success, or writes one naming the
 * backend, the slot and the device when the backend failed without a message (a plugin
 * cannot write lowp_last_error). */
typedef struct lowp_call_guard {
    char saved[1024];
} lowp_call_guard;
LOWP_HIDDEN void lowp_call_begin(lowp_call_guard *g);
LOWP_HIDDEN lowp_status lowp_call_end(const lowp_call_guard *g, lowp_status st, const char *fn,
                                      lowp_device dev, const char *slot);

#endif
