/* The shared preamble of the ops layer (ops_internal.h): resolve the backend, check the slot,
 * guard the call; and the argument checks that several entry points make. */
#include <string.h>

#include "lowp/cpu_path.h"
#include "ops_internal.h"

lowp_status lowp_op_begin(lowp_op_call *c, const char *fn, const char *arg, lowp_device dev,
                          const char *slot, size_t slot_offset) {
    c->fn = fn;
    c->slot = slot;
    c->dev = dev;
    lowp_status st = lowp_device_resolve(fn, arg, dev, &c->iface, &c->ctx);
    if (st != LOWP_OK) return st;
    /* Every slot is a function pointer of the same size; copy its bits to test for NULL. */
    void (*fnptr)(void) = NULL;
    memcpy(&fnptr, (const unsigned char *) c->iface + slot_offset, sizeof fnptr);
    if (!fnptr) {
        const char *name = "?";
        lowp_backend_name(dev.type, &name);
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "%s: backend \"%s\" has no %s kernel", fn, name,
                         slot);
    }
    lowp_call_begin(&c->guard);
    return LOWP_OK;
}

lowp_status lowp_op_end(lowp_op_call *c, lowp_status st) {
    return lowp_call_end(&c->guard, st, c->fn, c->dev, c->slot);
}

lowp_status lowp_op_check_threads_path(const char *fn, int32_t threads, lowp_kernel_path path) {
    if (threads < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.threads (%d) < 0", fn, (int) threads);
    if ((unsigned) path >= LOWP_KERNEL_PATH_COUNT)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.path (%d) is not a lowp_kernel_path", fn,
                         (int) path);
    return LOWP_OK;
}

lowp_status lowp_check_offs(const char *fn, const int32_t *offs, int32_t groups, int64_t limit,
                            const char *limit_name) {
    if (groups < 1) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: groups (%d) < 1", fn, groups);
    if (!offs) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: offs is NULL", fn);
    int64_t prev = 0;
    for (int32_t g = 0; g < groups; g++) {
        if (offs[g] < prev || offs[g] > limit)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: offs[%d] (%d) is not in [%lld, %s (%lld)] (offsets are "
                             "cumulative group ends)",
                             fn, g, offs[g], (long long) prev, limit_name, (long long) limit);
        prev = offs[g];
    }
    return LOWP_OK;
}
