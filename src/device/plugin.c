/* The plugin loader: dlopen a shared object, call its lowp_backend_entry and hand the result
 * to the registry. Every failure closes the object again and leaves a message that names the
 * path, so that a bad LOWP_BACKEND_PATH entry can be found from lowp_backend_env_errors. */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

#include "device/registry.h"

/* Re-issue the current message with the path in front: "lowp_backend_load: \"x.so\": ...". */
static lowp_status fail_with_path(lowp_status st, const char *path) {
    char inner[1024];
    snprintf(inner, sizeof inner, "%s", lowp_last_error());
    return lowp_fail(st, "lowp_backend_load: \"%s\": %s", path, inner);
}

lowp_status lowp_plugin_open(const char *path, int32_t *type_out) {
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

    lowp_backend_reg reg;
    memset(&reg, 0, sizeof reg);
    lowp_clear_error();
    lowp_status st = entry(&reg);
    if (st != LOWP_OK) {
        if (lowp_last_error()[0])
            st = fail_with_path(st, path);
        else
            st = lowp_fail(st, "lowp_backend_load: \"%s\": %s returned %s", path,
                           LOWP_BACKEND_ENTRY_SYMBOL, lowp_status_str(st));
        dlclose(h);
        return st;
    }

    st = lowp_registry_add(LOWP_BACKEND_ENTRY_SYMBOL, &reg, h, type_out);
    if (st != LOWP_OK) {
        st = fail_with_path(st, path);
        /* The entry may have started threads or opened a device for this registration; let it
         * release them before its code is unmapped. Only when the layout is known to be ours:
         * a struct from other headers may hold anything where we expect iface. */
        if (st != LOWP_ERR_VERSION && reg.iface && reg.iface->destroy) reg.iface->destroy(reg.ctx);
        dlclose(h);
        return st;
    }
    return LOWP_OK;
}

lowp_status lowp_backend_load(const char *path, int32_t *type_out) {
    LOWP_CHECK_PTR("lowp_backend_load", path);
    lowp_registry_ensure();
    return lowp_plugin_open(path, type_out);
}
