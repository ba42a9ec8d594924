/* The FP8 delayed-scaling state of one wrapped module (train.h): three roles (input, weight,
 * grad-output), each an amax history and a scale (docs/numerics.md section 5), kept on the module's
 * device with a host mirror that the update computes on.
 *
 * Device image, per role: history_len amax rows, then the scale. The mirror has the same
 * layout (roles[r].history points into it; roles[r].scale is the authority for the scale and is
 * written into the image's scale slot by every push). On the CPU the mirror IS the device
 * buffer (dev_buf == host_buf) and push/pull only move the scale slots.
 *
 * Off the CPU, two host staging images sit behind the mirror in the same allocation:
 *  - push copies the mirror into the push stage and queues host->device from there, so the
 *    caller may go on recording into the mirror while the copy is still pending (the queue
 *    reads its source later, on the device's own time). Before overwriting the stage, a push
 *    waits for the previous one if it may still be reading it.
 *  - pull queues device->host into the pull stage, synchronizes, and only then copies into the
 *    mirror, so a failed pull leaves the mirror as it was, and a pull never writes a buffer a
 *    pending push still reads.
 * A pull first pushes what the mirror has gained since the last push (amaxes recorded this
 * step): otherwise reading the device back would silently drop them. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "train_internal.h"

/* The host allocation behind lowp_fp8_state.host_buf (which points at `image`). */
typedef struct fp8_block {
    int32_t pending; /* a push was queued and no synchronize of the device has followed */
    int32_t dirty;   /* the mirror changed (record, update) since the last push */
    float *push_stage, *pull_stage; /* NULL on the CPU */
    float image[];                  /* the mirror */
} fp8_block;

static fp8_block *block_of(const lowp_fp8_state *st) {
    return (fp8_block *) (void *) ((char *) st->host_buf - offsetof(fp8_block, image));
}

static int on_cpu(lowp_device dev) {
    return dev.type == LOWP_DEVICE_CPU;
}

/* Floats of one image: per role, the history and the scale. */
static size_t image_floats(int32_t history_len) {
    return (size_t) LOWP_ROLE_COUNT * ((size_t) history_len + 1);
}

static float *scale_slot(const lowp_fp8_state *st, int r) {
    return st->host_buf + (size_t) r * ((size_t) st->history_len + 1) + (size_t) st->history_len;
}

/* A state that init made (and free has not cleared). */
static lowp_status check_state(const char *fn, const lowp_fp8_state *st) {
    LOWP_CHECK_PTR(fn, st);
    if (!st->host_buf || !st->dev_buf || st->history_len < 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: st is not an initialized state (host_buf %p, dev_buf %p, "
                         "history_len %d)",
                         fn, (void *) st->host_buf, (void *) st->dev_buf, (int) st->history_len);
    return LOWP_OK;
}

static lowp_status check_role(const char *fn, lowp_role role) {
    if ((int) role < 0 || (int) role >= LOWP_ROLE_COUNT)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: role (%d) is not a lowp_role", fn, (int) role);
    return LOWP_OK;
}

/* That `dev` names a registered device, through the public device API (lowp/device.h). */
static lowp_status check_device(const char *fn, lowp_device dev) {
    if (dev.type < 0 || dev.type >= LOWP_DEVICE_MAX_TYPES)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: device.type (%d) is outside 0..%d", fn,
                         (int) dev.type, LOWP_DEVICE_MAX_TYPES - 1);
    int32_t count = 0;
    if (lowp_device_count(dev.type, &count) != LOWP_OK)
        return lowp_fail(LOWP_ERR_NOT_FOUND, "%s: device.type (%d) is not a registered device type",
                         fn, (int) dev.type);
    if (dev.index < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: device.index (%d) < 0", fn, (int) dev.index);
    if (dev.index >= count) {
        const char *name = "?";
        lowp_backend_name(dev.type, &name);
        return lowp_fail(LOWP_ERR_NOT_FOUND, "%s: device.index (%d) >= device count (%d) of \"%s\"",
                         fn, (int) dev.index, (int) count, name);
    }
    return LOWP_OK;
}

lowp_status lowp_fp8_state_init(lowp_fp8_state *st, const lowp_delayed_cfg *cfg,
                                const lowp_format formats[LOWP_ROLE_COUNT], lowp_device device) {
    const char *fn = "lowp_fp8_state_init";
    LOWP_CHECK_PTR(fn, st);
    memset(st, 0, sizeof *st); /* so that free after a failed init does nothing */
    LOWP_CHECK_PTR(fn, cfg);
    LOWP_CHECK_PTR(fn, formats);
    for (int r = 0; r < LOWP_ROLE_COUNT; r++)
        if (formats[r] != LOWP_FORMAT_E4M3 && formats[r] != LOWP_FORMAT_E5M2)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: formats[%d] (%d) is not e4m3 or e5m2", fn,
                             r, (int) formats[r]);
    lowp_status s = lowp_delayed_cfg_check(fn, "cfg", cfg);
    if (s != LOWP_OK) return s;
    if ((s = check_device(fn, device)) != LOWP_OK) return s;

    const size_t n = image_floats(cfg->history_len);
    const size_t images = on_cpu(device) ? 1 : 3;
    if (n > (SIZE_MAX - sizeof(fp8_block)) / sizeof(float) / images)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: cfg.history_len (%d) is too large", fn,
                         (int) cfg->history_len);
    fp8_block *blk = calloc(1, sizeof(fp8_block) + images * n * sizeof(float));
    if (!blk)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY,
                         "%s: cannot allocate the host mirror (history_len %d)", fn,
                         (int) cfg->history_len);
    float *dev_buf = blk->image;
    if (!on_cpu(device)) {
        blk->push_stage = blk->image + n;
        blk->pull_stage = blk->image + 2 * n;
        void *p = NULL;
        if ((s = lowp_malloc(device, n * sizeof(float), &p)) != LOWP_OK) {
            free(blk);
            lowp_error_append("%s: allocating the state on the device", fn);
            return s;
        }
        dev_buf = p;
    }
    st->device = device;
    st->history_len = cfg->history_len;
    st->host_buf = blk->image;
    st->dev_buf = dev_buf;
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        lowp_delayed_cfg c = *cfg;
        c.format = formats[r];
        /* Validated above: cannot fail. */
        lowp_delayed_init(&st->roles[r], &c, st->host_buf + (size_t) r * (n / LOWP_ROLE_COUNT));
    }
    /* The device copy is valid from the start, and a device that cannot take it fails here
     * rather than at the first step. */
    blk->dirty = 1;
    s = lowp_fp8_state_push(st);
    if (s == LOWP_OK && !on_cpu(device)) {
        s = lowp_device_synchronize(device);
        if (s == LOWP_OK) blk->pending = 0;
    }
    if (s != LOWP_OK) {
        /* free synchronizes, which may overwrite the message: keep the first failure's. */
        char why[512];
        snprintf(why, sizeof why, "%s", lowp_last_error());
        lowp_fp8_state_free(st);
        lowp_fail(s, "%s", why);
        lowp_error_append("%s: placing the initial state on the device", fn);
        return s;
    }
    return LOWP_OK;
}

void lowp_fp8_state_free(lowp_fp8_state *st) {
    if (!st || !st->host_buf) return;
    fp8_block *blk = block_of(st);
    if (!on_cpu(st->device) && st->dev_buf) {
        /* A queued copy may still read the stage or write dev_buf: let it finish before
         * either goes away. Nothing to report from a void function if the device fails. */
        lowp_device_synchronize(st->device);
        lowp_free(st->device, st->dev_buf);
    }
    free(blk);
    memset(st, 0, sizeof *st);
}

lowp_status lowp_fp8_state_record(lowp_fp8_state *st, lowp_role role, float amax) {
    const char *fn = "lowp_fp8_state_record";
    lowp_status s = check_state(fn, st);
    if (s == LOWP_OK) s = check_role(fn, role);
    if (s != LOWP_OK) return s;
    lowp_delayed_record(&st->roles[role], amax);
    block_of(st)->dirty = 1;
    return LOWP_OK;
}

lowp_status lowp_fp8_state_update(lowp_fp8_state *st, const lowp_reduce_hook *hook) {
    const char *fn = "lowp_fp8_state_update";
    lowp_status s = check_state(fn, st);
    if (s != LOWP_OK) return s;
    /* The staging amaxes, reduced in one call for all roles (one collective per module). The
     * mirror is written only after the hook succeeded, so a failed reduction changes nothing. */
    float amax[LOWP_ROLE_COUNT];
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) amax[r] = st->roles[r].history[0];
    if (hook && hook->fn) {
        lowp_clear_error();
        s = hook->fn(amax, LOWP_ROLE_COUNT, hook->user);
        if (s != LOWP_OK) {
            /* Keep what the hook said, if it said anything. */
            if (lowp_last_error()[0])
                lowp_error_append("%s: the amax reduce hook returned %s", fn, lowp_status_str(s));
            else
                lowp_fail(s, "%s: the amax reduce hook returned %s", fn, lowp_status_str(s));
            return s;
        }
        for (int r = 0; r < LOWP_ROLE_COUNT; r++)
            if (amax[r] < 0.0f) /* NaN passes: it sticks, as record's does */
                return lowp_fail(LOWP_ERR_INVALID_ARG,
                                 "%s: the amax reduce hook returned amax[%d] = %g (negative)", fn,
                                 r, (double) amax[r]);
    }
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        st->roles[r].history[0] = amax[r];
        lowp_delayed_update(&st->roles[r]); /* arguments valid: cannot fail */
    }
    block_of(st)->dirty = 1;
    return lowp_fp8_state_push(st);
}

lowp_status lowp_fp8_state_push(lowp_fp8_state *st) {
    const char *fn = "lowp_fp8_state_push";
    lowp_status s = check_state(fn, st);
    if (s != LOWP_OK) return s;
    fp8_block *blk = block_of(st);
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) *scale_slot(st, r) = st->roles[r].scale;
    if (on_cpu(st->device)) { /* the mirror is the device buffer */
        blk->dirty = 0;
        return LOWP_OK;
    }
    const size_t bytes = image_floats(st->history_len) * sizeof(float);
    if (blk->pending) {
        if ((s = lowp_device_synchronize(st->device)) != LOWP_OK) {
            lowp_error_append("%s: waiting for the previous push", fn);
            return s;
        }
        blk->pending = 0;
    }
    memcpy(blk->push_stage, st->host_buf, bytes);
    if ((s = lowp_memcpy(st->device, st->dev_buf, LOWP_DEVICE_HOST, blk->push_stage, bytes)) !=
        LOWP_OK) {
        lowp_error_append("%s: queueing the copy to the device", fn);
        return s;
    }
    blk->pending = 1;
    blk->dirty = 0;
    return LOWP_OK;
}

lowp_status lowp_fp8_state_pull(lowp_fp8_state *st) {
    const char *fn = "lowp_fp8_state_pull";
    lowp_status s = check_state(fn, st);
    if (s != LOWP_OK) return s;
    fp8_block *blk = block_of(st);
    if (blk->dirty && (s = lowp_fp8_state_push(st)) != LOWP_OK) return s;
    const size_t n = image_floats(st->history_len);
    const float *src = st->host_buf;
    if (!on_cpu(st->device)) {
        /* Everything queued on the state's device before this point (a push, a kernel writing
         * amaxes) must have landed before the read is queued; the read itself is queued too,
         * hence the second synchronize. */
        if ((s = lowp_device_synchronize(st->device)) != LOWP_OK) {
            lowp_error_append("%s: synchronizing the state's device", fn);
            return s;
        }
        blk->pending = 0;
        if ((s = lowp_memcpy(LOWP_DEVICE_HOST, blk->pull_stage, st->device, st->dev_buf,
                             n * sizeof(float))) != LOWP_OK ||
            (s = lowp_device_synchronize(st->device)) != LOWP_OK) {
            lowp_error_append("%s: reading the state back from the device", fn);
            return s;
        }
        memcpy(st->host_buf, blk->pull_stage, n * sizeof(float));
        src = blk->pull_stage;
    }
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        st->roles[r].scale =
            src[(size_t) r * ((size_t) st->history_len + 1) + (size_t) st->history_len];
        st->roles[r].scale_inv = 1.0f / st->roles[r].scale;
    }
    return LOWP_OK;
}
