/* The backend registry: a table indexed by device type id that maps each type to its vtable
 * and context, plus the device-level entry points (count, caps, synchronize, memory) that
 * validate a (type, index) pair and forward to the right backend.
 *
 * The table is filled once on first use (pthread_once): the built-in backends of k_builtins,
 * then every shared object named in LOWP_BACKEND_PATH. The registry owns loading: the plugin
 * loader (plugin.c) only opens an object and runs its entry, and load_plugin here adds the
 * result or gives it back. Later registrations take a mutex; reads
 * take no lock, because a slot is written completely before its `present` flag is published
 * with release order and is never changed or removed afterwards. Backends therefore live until
 * the process exits: tearing them down from a destructor would race the plugins' own
 * destructors (a GPU runtime that has already shut down), and the OS reclaims everything. */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu/cpu.h"
#include "device/compat.h"
#include "device/plugin.h"
#include "device/registry.h"

#define NAME_CAP       32          /* backend names: 1..31 characters */
#define ENV_ERRORS_CAP 4096        /* all LOWP_BACKEND_PATH failures together */
#define STAGE_CHUNK    (32u << 20) /* host staging buffer for copies between two device types */

typedef struct backend_slot {
    char name[NAME_CAP];
    lowp_backend_iface iface;   /* a copy: callers may pass a vtable that does not outlive them */
    void *ctx;                  /* the backend's, or &legacy for an older version's adapters */
    lowp_legacy_backend legacy; /* a vtable of API version 1 to 4 (compat.h) */
    void *dl_handle;            /* kept open for the life of the process */
} backend_slot;

static backend_slot g_slots[LOWP_DEVICE_MAX_TYPES];
static atomic_int g_present[LOWP_DEVICE_MAX_TYPES];
static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER; /* serializes writers */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_env_errors[ENV_ERRORS_CAP]; /* written during the setup only */

/* Backends compiled into the library, with their fixed type ids. Only the CPU backend exists
 * today; a compiled-in one (a future CUDA backend, id LOWP_DEVICE_CUDA reserved for it) is a
 * new folder under src/ plus one line here. */
static const struct builtin {
    int32_t type;
    lowp_backend_entry_fn entry;
} k_builtins[] = {
    {LOWP_DEVICE_CPU, lowp_cpu_backend_entry},
};

/* One line per failure. `what` prefixes messages that do not already name their source
 * (plugin load messages name the path themselves). */
static void env_errors_add(const char *what, const char *msg) {
    size_t len = strlen(g_env_errors);
    snprintf(g_env_errors + len, sizeof g_env_errors - len, "%s%s%s%s", len ? "\n" : "",
             what ? what : "", what ? ": " : "", msg[0] ? msg : "failed without a message");
}

static lowp_status add_at(const char *fn, const lowp_backend_reg *reg, void *dl_handle,
                          int32_t fixed_type, int32_t *type_out);
static lowp_status load_plugin(const char *path, int32_t *type_out);

static void registry_setup(void) {
    /* The setup runs on whichever thread first touches the registry; keep that thread's last
     * error as it was, since failures here are reported through lowp_backend_env_errors. */
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", lowp_last_error());

    for (size_t i = 0; i < sizeof k_builtins / sizeof k_builtins[0]; i++) {
        lowp_backend_reg reg;
        memset(&reg, 0, sizeof reg);
        lowp_clear_error();
        lowp_status st = k_builtins[i].entry(&reg);
        if (st == LOWP_OK)
            st = add_at("lowp (built-in backend)", &reg, NULL, k_builtins[i].type, NULL);
        if (st != LOWP_OK) {
            char what[64];
            snprintf(what, sizeof what, "built-in backend type %d", (int) k_builtins[i].type);
            env_errors_add(what, lowp_last_error());
        }
    }

    const char *env = getenv("LOWP_BACKEND_PATH");
    if (env && env[0]) {
        char *paths = strdup(env);
        if (!paths) {
            env_errors_add("LOWP_BACKEND_PATH", "out of memory copying the variable");
        } else {
            char *save = NULL;
            for (char *p = strtok_r(paths, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
                lowp_clear_error();
                if (load_plugin(p, NULL) != LOWP_OK) env_errors_add(NULL, lowp_last_error());
            }
            free(paths);
        }
    }

    if (saved[0])
        lowp_fail(LOWP_OK, "%s", saved); /* lowp_fail is the only setter; the status is unused */
    else
        lowp_clear_error();
}

/* Run the one-time setup if no one has yet. Every public device function calls it first. */
static void lowp_registry_ensure(void) {
    pthread_once(&g_once, registry_setup);
}

const char *lowp_backend_env_errors(void) {
    lowp_registry_ensure();
    return g_env_errors;
}

/* ---- registration ------------------------------------------------------------------------ */

static int name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n >= NAME_CAP) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-' || c == '.';
        if (!ok) return 0;
    }
    return 1;
}

static int present(int32_t type) {
    return type >= 0 && type < LOWP_DEVICE_MAX_TYPES &&
           atomic_load_explicit(&g_present[type], memory_order_acquire);
}

/* Validation that needs no lock. The version is checked before anything else is read, since
 * a struct from other headers may not even have the fields we expect after the first two. */
static lowp_status check_reg(const char *fn, const lowp_backend_reg *reg) {
    if (!reg) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: reg is NULL", fn);
    if (reg->api_version < LOWP_BACKEND_API_VERSION_MIN ||
        reg->api_version > LOWP_BACKEND_API_VERSION)
        return lowp_fail(LOWP_ERR_VERSION,
                         "%s: reg.api_version (%u) != LOWP_BACKEND_API_VERSION (%u) of this "
                         "library (which also loads versions %u and up); rebuild the backend "
                         "against this lowp's headers",
                         fn, (unsigned) reg->api_version, (unsigned) LOWP_BACKEND_API_VERSION,
                         (unsigned) LOWP_BACKEND_API_VERSION_MIN);
    if (reg->struct_size != sizeof(lowp_backend_reg))
        return lowp_fail(LOWP_ERR_VERSION,
                         "%s: reg.struct_size (%u) != sizeof(lowp_backend_reg) (%zu) of this "
                         "library; rebuild the backend against this lowp's headers",
                         fn, (unsigned) reg->struct_size, sizeof(lowp_backend_reg));
    if (!reg->name) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: reg.name is NULL", fn);
    if (!name_ok(reg->name))
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: reg.name (\"%.64s\") must be 1 to %d characters of [A-Za-z0-9_.-]",
                         fn, reg->name, NAME_CAP - 1);
    if (!reg->iface)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: reg.iface of \"%s\" is NULL", fn, reg->name);
    const lowp_backend_iface *f = reg->iface;
    const char *missing = !f->device_count  ? "device_count"
                          : !f->synchronize ? "synchronize"
                          : !f->alloc       ? "alloc"
                          : !f->free        ? "free"
                                            : NULL;
    if (missing)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: reg.iface->%s of \"%s\" is NULL (device_count, synchronize, alloc "
                         "and free are mandatory)",
                         fn, missing, reg->name);
    return LOWP_OK;
}

/* fixed_type >= 0 puts a built-in backend at its reserved id; -1 takes the next plugin id. */
static lowp_status add_at(const char *fn, const lowp_backend_reg *reg, void *dl_handle,
                          int32_t fixed_type, int32_t *type_out) {
    lowp_status st = check_reg(fn, reg);
    if (st != LOWP_OK) return st;

    pthread_mutex_lock(&g_mutex);
    int32_t type = fixed_type;
    for (int32_t t = 0; t < LOWP_DEVICE_MAX_TYPES; t++) {
        if (present(t) && strcmp(g_slots[t].name, reg->name) == 0) {
            pthread_mutex_unlock(&g_mutex);
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: a backend named \"%s\" is already registered (type %d)", fn,
                             reg->name, (int) t);
        }
    }
    if (type < 0) {
        for (int32_t t = LOWP_DEVICE_PLUGIN_FIRST; t < LOWP_DEVICE_MAX_TYPES && type < 0; t++)
            if (!present(t)) type = t;
        if (type < 0) {
            pthread_mutex_unlock(&g_mutex);
            return lowp_fail(LOWP_ERR_UNSUPPORTED,
                             "%s: cannot register \"%s\": all %d plugin type ids (%d..%d) are "
                             "taken",
                             fn, reg->name, LOWP_DEVICE_MAX_TYPES - LOWP_DEVICE_PLUGIN_FIRST,
                             LOWP_DEVICE_PLUGIN_FIRST, LOWP_DEVICE_MAX_TYPES - 1);
        }
    } else if (present(type)) {
        pthread_mutex_unlock(&g_mutex);
        return lowp_fail(LOWP_ERR_INTERNAL, "%s: built-in type id %d registered twice", fn,
                         (int) type);
    }
    backend_slot *s = &g_slots[type];
    snprintf(s->name, sizeof s->name, "%s", reg->name);
    if (reg->api_version == LOWP_BACKEND_API_VERSION) {
        s->iface = *reg->iface;
        s->ctx = reg->ctx;
    } else { /* an older layout, read no further than its end and served by adapters */
        lowp_legacy_adapt(reg, s->name, &s->legacy, &s->iface);
        s->ctx = &s->legacy;
    }
    s->dl_handle = dl_handle;
    atomic_store_explicit(&g_present[type], 1, memory_order_release);
    pthread_mutex_unlock(&g_mutex);
    if (type_out) *type_out = type;
    return LOWP_OK;
}

/* Open a plugin and add it at the next plugin id (the setup's LOWP_BACKEND_PATH and
 * lowp_backend_load); an object the registry refuses is given back, its message naming the path.
 * Does not run the setup, so the setup itself can call it. */
static lowp_status load_plugin(const char *path, int32_t *type_out) {
    lowp_backend_reg reg;
    void *h = NULL;
    lowp_status st = lowp_plugin_open(path, &reg, &h);
    if (st != LOWP_OK) return st;
    st = add_at(LOWP_BACKEND_ENTRY_SYMBOL, &reg, h, -1, type_out);
    if (st == LOWP_OK) return LOWP_OK;
    st = lowp_plugin_fail(st, path);
    /* A version check that failed means that reg's layout may not be ours. */
    lowp_plugin_close(h, &reg, st != LOWP_ERR_VERSION);
    return st;
}

lowp_status lowp_backend_load(const char *path, int32_t *type_out) {
    LOWP_CHECK_PTR("lowp_backend_load", path);
    lowp_registry_ensure();
    return load_plugin(path, type_out);
}

lowp_status lowp_backend_register(const lowp_backend_reg *reg, int32_t *type_out) {
    lowp_registry_ensure();
    return add_at("lowp_backend_register", reg, NULL, -1, type_out);
}

/* ---- lookups ----------------------------------------------------------------------------- */

static lowp_status check_type(const char *fn, const char *arg, int32_t type) {
    if (type < 0 || type >= LOWP_DEVICE_MAX_TYPES)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s (%d) is outside 0..%d", fn, arg, (int) type,
                         LOWP_DEVICE_MAX_TYPES - 1);
    if (!present(type))
        return lowp_fail(LOWP_ERR_NOT_FOUND, "%s: %s (%d) is not a registered device type", fn, arg,
                         (int) type);
    return LOWP_OK;
}

lowp_status lowp_backend_list(int32_t *types, int32_t cap, int32_t *n) {
    LOWP_CHECK_PTR("lowp_backend_list", n);
    if (cap < 0) return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_backend_list: cap (%d) < 0", cap);
    if (cap > 0 && !types)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_backend_list: types is NULL with cap (%d)",
                         cap);
    lowp_registry_ensure();
    int32_t count = 0;
    for (int32_t t = 0; t < LOWP_DEVICE_MAX_TYPES; t++) {
        if (!present(t)) continue;
        if (count < cap) types[count] = t;
        count++;
    }
    *n = count;
    return LOWP_OK;
}

lowp_status lowp_backend_name(int32_t type, const char **name) {
    LOWP_CHECK_PTR("lowp_backend_name", name);
    lowp_registry_ensure();
    lowp_status st = check_type("lowp_backend_name", "type", type);
    if (st != LOWP_OK) return st;
    *name = g_slots[type].name;
    return LOWP_OK;
}

lowp_status lowp_backend_find(const char *name, int32_t *type) {
    LOWP_CHECK_PTR("lowp_backend_find", name);
    LOWP_CHECK_PTR("lowp_backend_find", type);
    lowp_registry_ensure();
    char known[256] = "";
    size_t len = 0;
    for (int32_t t = 0; t < LOWP_DEVICE_MAX_TYPES; t++) {
        if (!present(t)) continue;
        if (strcmp(g_slots[t].name, name) == 0) {
            *type = t;
            return LOWP_OK;
        }
        if (len < sizeof known)
            len += (size_t) snprintf(known + len, sizeof known - len, "%s%s", len ? ", " : "",
                                     g_slots[t].name);
    }
    return lowp_fail(LOWP_ERR_NOT_FOUND, "lowp_backend_find: no backend named \"%.64s\" (have: %s)",
                     name, known);
}

lowp_status lowp_backend_get(int32_t type, const lowp_backend_iface **iface, void **ctx) {
    LOWP_CHECK_PTR("lowp_backend_get", iface);
    lowp_registry_ensure();
    lowp_status st = check_type("lowp_backend_get", "type", type);
    if (st != LOWP_OK) return st;
    *iface = &g_slots[type].iface;
    if (ctx) *ctx = g_slots[type].ctx;
    return LOWP_OK;
}

/* ---- devices ----------------------------------------------------------------------------- */

/* Around every call into a backend. Backends built outside lowp cannot write
 * lowp_last_error, so after a failure of theirs the message would be stale or empty: clear it
 * before the call and, if the backend failed without a message, write one that names the
 * backend, the slot and the device. After a success the caller's earlier message comes back,
 * so that a successful device call never erases the report of an earlier failure. */
typedef lowp_call_guard call_guard;

static void guard_begin(call_guard *g) {
    snprintf(g->saved, sizeof g->saved, "%s", lowp_last_error());
    lowp_clear_error();
}

static void guard_restore(const call_guard *g) {
    if (g->saved[0])
        lowp_fail(LOWP_OK, "%s", g->saved); /* lowp_fail is the only setter; status unused */
    else
        lowp_clear_error();
}

static lowp_status guard_end(const call_guard *g, lowp_status st, const char *fn, int32_t type,
                             int32_t index, const char *slot) {
    if (st == LOWP_OK)
        guard_restore(g);
    else if (lowp_last_error()[0] == '\0')
        lowp_fail(st, "%s: backend \"%s\" %s failed on device %d:%d (%s)", fn, g_slots[type].name,
                  slot, (int) type, (int) index, lowp_status_str(st));
    return st;
}

void lowp_call_begin(lowp_call_guard *g) {
    guard_begin(g);
}

lowp_status lowp_call_end(const lowp_call_guard *g, lowp_status st, const char *fn, lowp_device dev,
                          const char *slot) {
    return guard_end(g, st, fn, dev.type, dev.index, slot);
}

static lowp_status device_count(const char *fn, int32_t type, int32_t *count) {
    const backend_slot *s = &g_slots[type];
    call_guard g;
    guard_begin(&g);
    int32_t c = -1;
    lowp_status st = guard_end(&g, s->iface.device_count(s->ctx, &c), fn, type, 0, "device_count");
    if (st != LOWP_OK) return st;
    if (c < 0)
        return lowp_fail(LOWP_ERR_DEVICE, "%s: backend \"%s\" reported a device count of %d", fn,
                         s->name, (int) c);
    *count = c;
    return LOWP_OK;
}

lowp_status lowp_device_resolve(const char *fn, const char *arg, lowp_device dev,
                                const lowp_backend_iface **iface, void **ctx) {
    lowp_registry_ensure();
    char what[96];
    snprintf(what, sizeof what, "%s.type", arg);
    lowp_status st = check_type(fn, what, dev.type);
    if (st != LOWP_OK) return st;
    if (dev.index < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.index (%d) < 0", fn, arg, (int) dev.index);
    int32_t count = 0;
    if ((st = device_count(fn, dev.type, &count)) != LOWP_OK) return st;
    if (dev.index >= count)
        return lowp_fail(LOWP_ERR_NOT_FOUND, "%s: %s.index (%d) >= device count (%d) of \"%s\"", fn,
                         arg, (int) dev.index, (int) count, g_slots[dev.type].name);
    if (iface) *iface = &g_slots[dev.type].iface;
    if (ctx) *ctx = g_slots[dev.type].ctx;
    return LOWP_OK;
}

lowp_status lowp_device_count(int32_t type, int32_t *count) {
    LOWP_CHECK_PTR("lowp_device_count", count);
    lowp_registry_ensure();
    lowp_status st = check_type("lowp_device_count", "type", type);
    if (st != LOWP_OK) return st;
    return device_count("lowp_device_count", type, count);
}

lowp_status lowp_device_caps(lowp_device dev, lowp_caps *out) {
    LOWP_CHECK_PTR("lowp_device_caps", out);
    const lowp_backend_iface *f = NULL;
    void *ctx = NULL;
    lowp_status st = lowp_device_resolve("lowp_device_caps", "dev", dev, &f, &ctx);
    if (st != LOWP_OK) return st;
    if (!f->caps)
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "lowp_device_caps: backend \"%s\" has no caps",
                         g_slots[dev.type].name);
    memset(out, 0, sizeof *out);
    call_guard g;
    guard_begin(&g);
    st = f->caps(ctx, dev.index, out);
    out->name[sizeof out->name - 1] = '\0'; /* whatever the backend wrote */
    return guard_end(&g, st, "lowp_device_caps", dev.type, dev.index, "caps");
}

lowp_status lowp_device_synchronize(lowp_device dev) {
    const lowp_backend_iface *f = NULL;
    void *ctx = NULL;
    lowp_status st = lowp_device_resolve("lowp_device_synchronize", "dev", dev, &f, &ctx);
    if (st != LOWP_OK) return st;
    call_guard g;
    guard_begin(&g);
    st = f->synchronize(ctx, dev.index);
    return guard_end(&g, st, "lowp_device_synchronize", dev.type, dev.index, "synchronize");
}

/* ---- memory ------------------------------------------------------------------------------ */

lowp_status lowp_malloc(lowp_device dev, size_t nbytes, void **ptr) {
    LOWP_CHECK_PTR("lowp_malloc", ptr);
    *ptr = NULL;
    const lowp_backend_iface *f = NULL;
    void *ctx = NULL;
    lowp_status st = lowp_device_resolve("lowp_malloc", "dev", dev, &f, &ctx);
    if (st != LOWP_OK) return st;
    call_guard g;
    guard_begin(&g);
    st = guard_end(&g, f->alloc(ctx, dev.index, nbytes, ptr), "lowp_malloc", dev.type, dev.index,
                   "alloc");
    if (st == LOWP_OK && nbytes > 0 && !*ptr)
        return lowp_fail(LOWP_ERR_DEVICE, "lowp_malloc: backend \"%s\" returned NULL for %zu bytes",
                         g_slots[dev.type].name, nbytes);
    return st;
}

lowp_status lowp_free(lowp_device dev, void *ptr) {
    const lowp_backend_iface *f = NULL;
    void *ctx = NULL;
    lowp_status st = lowp_device_resolve("lowp_free", "dev", dev, &f, &ctx);
    if (st != LOWP_OK) return st;
    if (!ptr) return LOWP_OK; /* like free(NULL) */
    call_guard g;
    guard_begin(&g);
    st = f->free(ctx, dev.index, ptr);
    return guard_end(&g, st, "lowp_free", dev.type, dev.index, "free");
}

/* A copy between two different non-CPU types: neither backend can reach the other's memory,
 * so go through a host buffer, chunk by chunk. Each chunk must have left the source before it
 * is sent (synchronize src) and must have arrived before the buffer is reused or freed
 * (synchronize dst), so this copy is synchronous. */
static lowp_status memcpy_staged(lowp_device dd, void *dst, lowp_device sd, const void *src,
                                 size_t n) {
    const backend_slot *ds = &g_slots[dd.type], *ss = &g_slots[sd.type];
    if (!ss->iface.memcpy_d2h || !ds->iface.memcpy_h2d)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "lowp_memcpy: copying \"%s\" -> \"%s\" goes through the host, but "
                         "backend \"%s\" has no %s",
                         ss->name, ds->name, !ss->iface.memcpy_d2h ? ss->name : ds->name,
                         !ss->iface.memcpy_d2h ? "memcpy_d2h" : "memcpy_h2d");
    size_t chunk = n < STAGE_CHUNK ? n : STAGE_CHUNK;
    unsigned char *stage = malloc(chunk);
    if (!stage)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY,
                         "lowp_memcpy: cannot allocate a %zu-byte host staging buffer", chunk);
    call_guard g;
    guard_begin(&g);
    lowp_status st = LOWP_OK;
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        st = ss->iface.memcpy_d2h(ss->ctx, sd.index, stage, (const char *) src + off, m);
        if (st != LOWP_OK) {
            guard_end(&g, st, "lowp_memcpy", sd.type, sd.index, "memcpy_d2h");
            break;
        }
        if ((st = ss->iface.synchronize(ss->ctx, sd.index)) != LOWP_OK) {
            guard_end(&g, st, "lowp_memcpy", sd.type, sd.index, "synchronize");
            break;
        }
        st = ds->iface.memcpy_h2d(ds->ctx, dd.index, (char *) dst + off, stage, m);
        if (st != LOWP_OK) {
            guard_end(&g, st, "lowp_memcpy", dd.type, dd.index, "memcpy_h2d");
            break;
        }
        if ((st = ds->iface.synchronize(ds->ctx, dd.index)) != LOWP_OK) {
            guard_end(&g, st, "lowp_memcpy", dd.type, dd.index, "synchronize");
            break;
        }
    }
    if (st == LOWP_OK) guard_restore(&g);
    free(stage);
    return st;
}

lowp_status lowp_memcpy(lowp_device dst_dev, void *dst, lowp_device src_dev, const void *src,
                        size_t n) {
    lowp_status st = lowp_device_resolve("lowp_memcpy", "dst_dev", dst_dev, NULL, NULL);
    if (st != LOWP_OK) return st;
    if ((st = lowp_device_resolve("lowp_memcpy", "src_dev", src_dev, NULL, NULL)) != LOWP_OK)
        return st;
    if (n == 0) return LOWP_OK;
    LOWP_CHECK_PTR("lowp_memcpy", dst);
    LOWP_CHECK_PTR("lowp_memcpy", src);

    /* Same type: the backend's own d2d (memcpy for the CPU). A CPU side: the other backend's
     * h2d or d2h. Two different non-CPU types: staged through the host. */
    if (dst_dev.type != src_dev.type && dst_dev.type != LOWP_DEVICE_CPU &&
        src_dev.type != LOWP_DEVICE_CPU)
        return memcpy_staged(dst_dev, dst, src_dev, src, n);
    const char *slot = dst_dev.type == src_dev.type      ? "memcpy_d2d"
                       : src_dev.type == LOWP_DEVICE_CPU ? "memcpy_h2d"
                                                         : "memcpy_d2h";
    /* The device whose backend runs the copy (a d2d is queued on the destination). */
    lowp_device on = dst_dev.type == LOWP_DEVICE_CPU ? src_dev : dst_dev;
    const lowp_backend_iface *f = &g_slots[on.type].iface;
    int has = dst_dev.type == src_dev.type      ? f->memcpy_d2d != NULL
              : src_dev.type == LOWP_DEVICE_CPU ? f->memcpy_h2d != NULL
                                                : f->memcpy_d2h != NULL;
    if (!has)
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "lowp_memcpy: backend \"%s\" has no %s",
                         g_slots[on.type].name, slot);
    void *ctx = g_slots[on.type].ctx;
    call_guard g;
    guard_begin(&g);
    if (dst_dev.type == src_dev.type)
        st = f->memcpy_d2d(ctx, dst_dev.index, dst, src_dev.index, src, n);
    else if (src_dev.type == LOWP_DEVICE_CPU)
        st = f->memcpy_h2d(ctx, dst_dev.index, dst, src, n);
    else
        st = f->memcpy_d2h(ctx, src_dev.index, dst, src, n);
    return guard_end(&g, st, "lowp_memcpy", on.type, on.index, slot);
}
