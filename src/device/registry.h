/* The registry's internal interface (registry.c owns it), for the ops layer above:
 * device resolution and the guard around calls into a backend. The plugin
 * loader has its own header (plugin.h), which only the registry uses. Not installed. */
#ifndef LOWP_DEVICE_REGISTRY_H
#define LOWP_DEVICE_REGISTRY_H

#include "core/internal.h"
#include "lowp/device.h"

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
