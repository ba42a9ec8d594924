/* The plugin loader (plugin.c): opens a backend's shared object and runs its entry. The
 * registry (registry.c) owns loading: it calls these and adds what they return. Not installed. */
#ifndef LOWP_DEVICE_PLUGIN_H
#define LOWP_DEVICE_PLUGIN_H

#include "core/internal.h"
#include "lowp/device.h"

/* dlopen `path` (RTLD_NOW | RTLD_LOCAL) and run its lowp_backend_entry into *reg; on success
 * *dl_handle is the open object, for the registry to keep or to give back with
 * lowp_plugin_close. On failure nothing stays open and the message names the path. */
LOWP_HIDDEN lowp_status lowp_plugin_open(const char *path, lowp_backend_reg *reg, void **dl_handle);

/* Give back an object lowp_plugin_open opened and the registry refused: with `release`, the
 * registration's destroy runs first (only when reg's layout is known to be ours: a struct from
 * other headers may hold anything where we expect iface); then dlclose. */
LOWP_HIDDEN void lowp_plugin_close(void *dl_handle, const lowp_backend_reg *reg, int release);

/* Re-issue the current message with the path in front ("lowp_backend_load: \"x.so\": ...");
 * returns st. */
LOWP_HIDDEN lowp_status lowp_plugin_fail(lowp_status st, const char *path);

#endif
