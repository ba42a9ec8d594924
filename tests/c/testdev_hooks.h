/* Loading the asynchronous "testdev" plugin (tests/c/plugin_test.c) into a test process and
 * reaching its hooks, for the tests that need a device whose queue completes work after the
 * call returns. ctest passes the plugin's path in LOWP_TEST_PLUGIN (tests/CMakeLists.txt). */
#ifndef LOWP_TESTDEV_HOOKS_H
#define LOWP_TESTDEV_HOOKS_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lowp/device.h"

typedef struct testdev_hooks {
    int32_t type; /* the device type id the registry gave testdev */
    int (*sync_count)(int);
    int (*queued)(int);
    long (*live_allocs)(int);
    int (*hold)(int, int);
    void (*set_delay_us)(int);
} testdev_hooks;

/* Load the plugin named by LOWP_TEST_PLUGIN and fill *h. Call before any other lowp call:
 * LOWP_BACKEND_PATH is cleared first, so that a testdev from the caller's environment cannot
 * take the name and leave the hooks pointing at another copy. Returns 0 (with a line on
 * stderr) when the plugin or a hook is missing. */
static inline int testdev_open(testdev_hooks *h) {
    memset(h, 0, sizeof *h);
    const char *path = getenv("LOWP_TEST_PLUGIN");
    if (!path || !path[0]) {
        fprintf(stderr, "LOWP_TEST_PLUGIN must name the testdev plugin\n");
        return 0;
    }
    unsetenv("LOWP_BACKEND_PATH");
    if (lowp_backend_load(path, &h->type) != LOWP_OK) {
        fprintf(stderr, "loading %s: %s\n", path, lowp_last_error());
        return 0;
    }
    /* RTLD_NOLOAD: the copy the library loaded, whose context is the registered one. */
    void *dl = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!dl) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 0;
    }
    /* POSIX function pointers from void *: copy the bits (ISO C has no such conversion). */
#define TESTDEV_HOOK(field, name)                                                                  \
    do {                                                                                           \
        void *p_ = dlsym(dl, name);                                                                \
        if (!p_) {                                                                                 \
            fprintf(stderr, "dlsym %s: %s\n", name, dlerror());                                    \
            return 0;                                                                              \
        }                                                                                          \
        memcpy(&h->field, &p_, sizeof p_);                                                         \
    } while (0)
    TESTDEV_HOOK(sync_count, "testdev_sync_count");
    TESTDEV_HOOK(queued, "testdev_queued");
    TESTDEV_HOOK(live_allocs, "testdev_live_allocs");
    TESTDEV_HOOK(hold, "testdev_hold");
    TESTDEV_HOOK(set_delay_us, "testdev_set_delay_us");
#undef TESTDEV_HOOK
    return 1; /* the handle stays open, like the library's */
}

/* A thread body (pthread_create) that releases testdev queue `index` after `after_us`
 * microseconds: the caller holds the queue, starts this, then makes the call that must wait. */
typedef struct testdev_release_arg {
    testdev_hooks *td;
    int index;
    int after_us;
} testdev_release_arg;

static inline void *testdev_release_later(void *p) {
    testdev_release_arg *a = p;
    usleep((useconds_t) a->after_us);
    a->td->hold(a->index, 0);
    return NULL;
}

#endif
