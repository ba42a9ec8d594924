/* The plugin loader: dlopen a shared object and call its lowp_backend_entry; the registry
 * (registry.c), which owns loading, adds the result or gives it back (lowp_plugin_close). Every
 * failure closes the object again and leaves a message that names the path, so that a bad
 * LOWP_BACKEND_PATH entry can be found from lowp_backend_env_errors. Calls nothing of the
 * registry. */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

#include "device/compat.h"
#include "device/plugin.h"

lowp_status lowp_plugin_fail(lowp_status st, const char *path) {
    char inner[1024];
    snprintf(inner, sizeof inner, "%s", lowp_last_error());
    return lowp_fail(st, "lowp_backend_load: \"%s\": %s", path, inner);
}

lowp_status lowp_plugin_open(const char *path, lowp_backend_reg *reg, void **dl_handle) {
    LOWP_CHECK_PTR("lowp_backend_load", path);
    if (!path[0]) return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_backend_load: path is \"\"");

    /* RTLD_NOW: an unresolved symbol fails here, not at the first call into the backend.
     * RTLD_LOCAL: two plugins may use the same internal symbol names. */
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        /* A path with a slash names a file; without one dlopen searches the library path. */
        int missing = strchr(path, '/') && access(path, F_OK) != 0;
        return lowp_fail(missing ? LOWP_ERR_NOT_FOUND : LOWP_ERR_IO,
                         "lowp_backend_load: cannot dlopen \"%s\": %s", path,
                         why ? why : "unknown error");
    }

    dlerror();
    void *sym = dlsym(h, LOWP_BACKEND_ENTRY_SYMBOL);
    if (!sym) {
        const char *why = dlerror();
        lowp_status st =
            lowp_fail(LOWP_ERR_NOT_FOUND, "lowp_backend_load: \"%s\" has no symbol %s: %s", path,
                      LOWP_BACKEND_ENTRY_SYMBOL, why ? why : "symbol is NULL");
        dlclose(h);
        return st;
    }
    /* ISO C has no conversion from void * to a function pointer; POSIX guarantees that the
     * representation matches, so copy the bits. */
    lowp_backend_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry);

    memset(reg, 0, sizeof *reg);
    lowp_clear_error();
    lowp_status st = entry(reg);
    if (st != LOWP_OK) {
        if (lowp_last_error()[0])
            st = lowp_plugin_fail(st, path);
        else
            st = lowp_fail(st, "lowp_backend_load: \"%s\": %s returned %s", path,
                           LOWP_BACKEND_ENTRY_SYMBOL, lowp_status_str(st));
        dlclose(h);
        return st;
    }
    *dl_handle = h;
    return LOWP_OK;
}

void lowp_plugin_close(void *dl_handle, const lowp_backend_reg *reg, int release) {
    /* The entry may have started threads or opened a device for this registration; let it
     * release them before its code is unmapped. */
    lowp_backend_destroy_fn destroy = release ? lowp_backend_destroy_of(reg) : NULL;
    if (destroy) destroy(reg->ctx);
    dlclose(dl_handle);
}
