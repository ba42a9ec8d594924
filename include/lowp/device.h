/* Devices, backends and the registry. Implemented in src/device/ (registry.c: the registry,
 * memory and queues; plugin.c: loading out-of-tree backends); the capability names are
 * src/core/caps.c, the built-in CPU backend src/cpu/backend.c.
 *
 * A device is a (type, index) pair. Each device type is served by one backend: a vtable of
 * functions plus a context pointer. The registry always holds the CPU backend (type 0), the
 * only backend compiled into the library today (a CUDA backend does not exist yet; type 1 is
 * reserved for it), and loads
 * out-of-tree backends (an Ascend NPU, a test device) from shared objects with dlopen: from
 * every path in the colon-separated environment variable LOWP_BACKEND_PATH on first use, or
 * from lowp_backend_load(path).
 *
 *   int32_t npu;
 *   if (lowp_backend_load("./liblowp_npu.so", &npu) != LOWP_OK) puts(lowp_last_error());
 *   lowp_device dev = {npu, 0};
 *   void *buf;
 *   lowp_malloc(dev, 1 << 20, &buf);
 *   lowp_memcpy(dev, buf, LOWP_DEVICE_HOST, host_data, 1 << 20);
 *   lowp_device_synchronize(dev);      // waits for dev's queue only
 *
 * Writing a backend: fill a lowp_backend_iface (a NULL slot means "unsupported", and the ops
 * layer says so), and export from the shared object
 *
 *   LOWP_API lowp_status lowp_backend_entry(lowp_backend_reg *reg);
 *
 * which fills `reg` with api_version = LOWP_BACKEND_API_VERSION, struct_size =
 * sizeof(lowp_backend_reg), a name (1 to 31 characters of [A-Za-z0-9_.-], unique), the
 * vtable and a context. A plugin of an older version (down to LOWP_BACKEND_API_VERSION_MIN)
 * still loads; any other api_version is refused with LOWP_ERR_VERSION. The entry may run while the
 * registry is being set up (for LOWP_BACKEND_PATH), so it must not call lowp functions itself.
 * Registered backends stay until the process exits; the registry is never torn down.
 */
#ifndef LOWP_DEVICE_H
#define LOWP_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device type ids. CPU is fixed, CUDA is reserved for a compiled-in backend that does not
 * exist yet; loaded backends get ids from
 * LOWP_DEVICE_PLUGIN_FIRST upwards, in load order (look them up by name). */
enum {
    LOWP_DEVICE_CPU = 0,
    LOWP_DEVICE_CUDA = 1,
    LOWP_DEVICE_PLUGIN_FIRST = 16,
    LOWP_DEVICE_MAX_TYPES = 32,
};

typedef struct lowp_device {
    int32_t type;  /* a device type id */
    int32_t index; /* which device of that type, from 0 */
} lowp_device;

/* The host (CPU device 0), for lowp_memcpy and descriptors of host memory. */
#define LOWP_DEVICE_HOST ((lowp_device){LOWP_DEVICE_CPU, 0})

/* Capability bits. CPU bits come from CPUID and the kernel; other backends report theirs. */
enum {
    LOWP_CAP_AVX512F = 1u << 0,
    LOWP_CAP_AVX512BW = 1u << 1,
    LOWP_CAP_AVX512VL = 1u << 2,
    LOWP_CAP_AVX512_BF16 = 1u << 3,
    LOWP_CAP_AVX512_FP16 = 1u << 4,
    LOWP_CAP_AMX_TILE = 1u << 5,
    LOWP_CAP_AMX_BF16 = 1u << 6,
    LOWP_CAP_AMX_PERMITTED = 1u << 7, /* the kernel granted XTILEDATA to this process */
    LOWP_CAP_AVX2 = 1u << 8,
    LOWP_CAP_FMA = 1u << 9,
    LOWP_CAP_AVX512DQ = 1u << 10,
    LOWP_CAP_AVX512_VBMI = 1u << 11, /* byte permutes (vpermb, vpermt2b) */
    LOWP_CAP_ASYNC_QUEUE = 1u << 16, /* work completes after the call returns */
    LOWP_CAP_FP8_MATH = 1u << 17,    /* native FP8 matrix arithmetic */
    LOWP_CAP_MX_MATH = 1u << 18,     /* native block-scaled (MX) matrix arithmetic */
};

/* Which kernel an op runs (lowp_cast_cfg, lowp_quant_cfg, lowp_gemm_cfg `path`); tests and
 * benchmarks force one to compare them. The rule, the same for every op: REFERENCE runs the
 * scalar golden model; a forced fast path runs that kernel or fails with LOWP_ERR_UNSUPPORTED
 * naming why (the CPU lacks it, or it has no kernel for this job); AUTO runs the fastest kernel
 * the device and the job allow (on the CPU: AMX, then AVX-512, then AVX2, then the reference).
 * The CPU's instruction-set paths are the values of lowp/cpu_path.h; other backends ignore
 * them. */
typedef enum lowp_kernel_path {
    LOWP_KERNEL_PATH_AUTO = 0,
    LOWP_KERNEL_PATH_REFERENCE = 1,
} lowp_kernel_path;

typedef struct lowp_caps {
    char name[64];      /* e.g. the CPU brand string or the GPU name */
    uint32_t flags;     /* LOWP_CAP_* bits */
    int32_t cores;      /* hardware threads (CPU) or multiprocessors (GPU) */
    uint64_t mem_bytes; /* device memory, 0 if unknown */
} lowp_caps;

/* Names of the LOWP_CAP_* bits that are set, space separated, into buf. */
LOWP_API lowp_status lowp_caps_describe(const lowp_caps *caps, char *buf, size_t buf_size);

struct lowp_tensor;
struct lowp_cast_cfg;
struct lowp_qtensor;
struct lowp_quant_cfg;
struct lowp_gemm_cfg;

/* A backend's vtable. Every slot takes the backend's context first. */
typedef struct lowp_backend_iface {
    lowp_status (*device_count)(void *ctx, int32_t *count);
    lowp_status (*caps)(void *ctx, int32_t index, lowp_caps *out);
    /* Wait until all work queued on device `index` has completed. */
    lowp_status (*synchronize)(void *ctx, int32_t index);
    lowp_status (*alloc)(void *ctx, int32_t index, size_t nbytes, void **ptr);
    lowp_status (*free)(void *ctx, int32_t index, void *ptr);
    /* Copies, queued on the device's queue in order with its other work. A d2d copy is queued
     * on dst_index's queue and runs after the work already queued on src_index. */
    lowp_status (*memcpy_h2d)(void *ctx, int32_t index, void *dst, const void *src, size_t n);
    lowp_status (*memcpy_d2h)(void *ctx, int32_t index, void *dst, const void *src, size_t n);
    lowp_status (*memcpy_d2d)(void *ctx, int32_t dst_index, void *dst, int32_t src_index,
                              const void *src, size_t n);
    /* Element conversion (lowp_cast), both tensors on device `index`. */
    lowp_status (*cast)(void *ctx, int32_t index, const struct lowp_tensor *src,
                        struct lowp_tensor *dst, const struct lowp_cast_cfg *cfg);
    /* Quantization (lowp_quantize, lowp_quantize_grouped, lowp_dequantize, lowp_amax); the
     * ops layer has validated every argument. quantize serves both quantize calls: col_out
     * with group_offs set is lowp_quantize_grouped's grouped copy (row_out then ungrouped or
     * NULL), else either output may be NULL, not both. */
    lowp_status (*quantize)(void *ctx, int32_t index, const struct lowp_tensor *x,
                            struct lowp_qtensor *row_out, struct lowp_qtensor *col_out,
                            const struct lowp_quant_cfg *cfg);
    lowp_status (*dequantize)(void *ctx, int32_t index, const struct lowp_qtensor *q,
                              struct lowp_tensor *out);
    /* GEMMs (lowp_gemm; lowp_grouped_gemm, split-M with b[groups] or split-K with one b),
     * arguments validated. B's layout and the split are cfg->b_layout and cfg->split (a
     * backend refuses the combinations it cannot run with LOWP_ERR_UNSUPPORTED). */
    lowp_status (*gemm)(void *ctx, int32_t index, const struct lowp_qtensor *a,
                        const struct lowp_qtensor *b, struct lowp_tensor *c,
                        const struct lowp_gemm_cfg *cfg);
    lowp_status (*grouped_gemm)(void *ctx, int32_t index, const struct lowp_qtensor *a,
                                const struct lowp_qtensor *b, const int32_t *offs, int32_t groups,
                                struct lowp_tensor *c, const struct lowp_gemm_cfg *cfg);
    /* Called when the registry refuses a registration after the plugin's entry has run (a
     * duplicate name, say), so that the backend can release what the entry made: threads,
     * device contexts. Not called for registered backends, which live until exit. May be
     * NULL. */
    void (*destroy)(void *ctx);
    /* amax of x at the granularity of `scaling` (a lowp_scaling) into out[out_count]
     * (lowp_amax), on device `index`; arguments validated. */
    lowp_status (*amax)(void *ctx, int32_t index, const struct lowp_tensor *x, int32_t scaling,
                        float *out, size_t out_count);
} lowp_backend_iface;

/* Version 5 quantizes grouped copies in the quantize slot, with the rowwise copy from the same
 * read (version 4 had a quantize_grouped slot after quantize, for the grouped copy alone).
 * Version 4 has one GEMM slot and one grouped slot, B's layout and the split in the config
 * (version 3 had gemm, grouped_gemm and grouped_gemm_wgrad, destroy, amax, then gemm_kn,
 * grouped_gemm_kn and grouped_gemm_wgrad_kn; version 2 ended at amax, version 1 at destroy).
 * The registry still loads versions 1 to 4: it reads an older vtable in its own layout, no
 * further than its end, and serves it through adapters (src/device/compat.c) that route each
 * (layout, split) to the old slot, and a grouped quantization to quantize_grouped (then the
 * rowwise copy, if asked, to quantize); a call whose old slot is absent is
 * LOWP_ERR_UNSUPPORTED naming that slot. Other versions are refused with LOWP_ERR_VERSION. */
#define LOWP_BACKEND_API_VERSION     5u
#define LOWP_BACKEND_API_VERSION_MIN 1u
#define LOWP_BACKEND_ENTRY_SYMBOL    "lowp_backend_entry"

typedef struct lowp_backend_reg {
    uint32_t api_version; /* LOWP_BACKEND_API_VERSION of the headers it was built with */
    uint32_t struct_size; /* sizeof(lowp_backend_reg) */
    const char *name;     /* device type name, e.g. "npu"; unique in the registry */
    const lowp_backend_iface *iface;
    void *ctx;
} lowp_backend_reg;

typedef lowp_status (*lowp_backend_entry_fn)(lowp_backend_reg *reg);

/* Register a backend given in-process; *type_out (may be NULL) receives its device type id. */
LOWP_API lowp_status lowp_backend_register(const lowp_backend_reg *reg, int32_t *type_out);

/* dlopen `path`, call its lowp_backend_entry and register the backend. */
LOWP_API lowp_status lowp_backend_load(const char *path, int32_t *type_out);

/* Registered device types, in increasing id order: ids are listed in `types` (up to `cap`;
 * types may be NULL when cap is 0), and *n receives how many are registered, which may exceed
 * cap. */
LOWP_API lowp_status lowp_backend_list(int32_t *types, int32_t cap, int32_t *n);
LOWP_API lowp_status lowp_backend_name(int32_t type, const char **name);
LOWP_API lowp_status lowp_backend_find(const char *name, int32_t *type);

/* Messages of LOWP_BACKEND_PATH entries (and built-in backends) that failed to load, one line
 * each, each naming its path ("" when none). Empty entries of the variable are skipped. */
LOWP_API const char *lowp_backend_env_errors(void);

LOWP_API lowp_status lowp_device_count(int32_t type, int32_t *count);
LOWP_API lowp_status lowp_device_caps(lowp_device dev, lowp_caps *out);

/* Synchronize the queue of `dev`, and only that one. */
LOWP_API lowp_status lowp_device_synchronize(lowp_device dev);

/* Device memory. lowp_malloc of 0 bytes succeeds; lowp_free of NULL does nothing. Free only
 * memory whose queued work has completed (synchronize first). On the host a buffer is 64-byte
 * aligned; from 4 MiB up it is 2 MiB aligned and advised for transparent huge pages (Linux
 * madvise; LOWP_HUGEPAGES=0 in the environment turns that off), as are the models' and the
 * trainer's own large buffers. */
LOWP_API lowp_status lowp_malloc(lowp_device dev, size_t nbytes, void **ptr);
LOWP_API lowp_status lowp_free(lowp_device dev, void *ptr);
/* The host block cache. Host buffers that live for one call or one update (the GEMMs'
 * workspaces, the quantized copies of activations and gradients) are released into a cache of
 * at most LOWP_HOST_CACHE_MB MiB (environment, read once; default 512, 0 turns it off), so that
 * the next call reuses them instead of faulting fresh pages in. lowp_host_cache_bytes is what
 * it holds now; lowp_host_empty_cache hands every cached block back to the system, as
 * torch.cuda.empty_cache does for PyTorch's caching allocator. A block in use is never in the
 * cache, so emptying it is safe at any time, from any thread; lowp_moe_free empties it too. */
LOWP_API size_t lowp_host_cache_bytes(void);
LOWP_API void lowp_host_empty_cache(void);
/* Copy n bytes between any two devices. The copy is queued like other device work: on the
 * non-CPU device when one side is the host, on the destination device when both are of one
 * type; synchronize that device before reading the result or reusing the source. Copies
 * between two different non-CPU types go through host memory and return complete. */
LOWP_API lowp_status lowp_memcpy(lowp_device dst_dev, void *dst, lowp_device src_dev,
                                 const void *src, size_t n);

/* The registry entry of a type, for the ops layer: its vtable and context. */
LOWP_API lowp_status lowp_backend_get(int32_t type, const lowp_backend_iface **iface, void **ctx);

#ifdef __cplusplus
}
#endif
#endif
