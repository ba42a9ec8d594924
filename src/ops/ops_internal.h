/* The preamble every entry point of src/ops/ shares (cast.c, quant.c, gemm.c): the common
 * argument checks, and the call into the backend of the operands' device
 *
 *   lowp_op_call c;
 *   if ((st = lowp_op_begin(&c, fn, "x.device", x->device, LOWP_OP_SLOT(quantize))) != LOWP_OK)
 *       return st;                          // unknown device, or the backend lacks the slot
 *   st = c.iface->quantize(c.ctx, x->device.index, ...);
 *   return lowp_op_end(&c, st);             // names backend, slot and device on a silent failure
 *
 * so that each entry point is its own checks, then these three lines. Implemented in
 * src/ops/op_call.c. Not installed. */
#ifndef LOWP_OPS_INTERNAL_H
#define LOWP_OPS_INTERNAL_H

#include <stddef.h>

#include "core/internal.h"
#include "device/registry.h"
#include "lowp/device.h"

/* A vtable slot by name: its name for messages and its offset in lowp_backend_iface. */
#define LOWP_OP_SLOT(slot) #slot, offsetof(lowp_backend_iface, slot)

typedef struct lowp_op_call {
    const char *fn, *slot;
    lowp_device dev;
    const lowp_backend_iface *iface;
    void *ctx;
    lowp_call_guard guard;
} lowp_op_call;

/* Resolve the backend of `dev` (`arg` names it in messages), check that its vtable has the
 * slot at `slot_offset` (LOWP_ERR_UNSUPPORTED: 'backend "npu" has no amax kernel'), then begin
 * the guarded call. */
LOWP_HIDDEN lowp_status lowp_op_begin(lowp_op_call *c, const char *fn, const char *arg,
                                      lowp_device dev, const char *slot, size_t slot_offset);
/* Finish the call begun by lowp_op_begin with the slot's status. */
LOWP_HIDDEN lowp_status lowp_op_end(lowp_op_call *c, lowp_status st);

static inline int lowp_same_device(lowp_device a, lowp_device b) {
    return a.type == b.type && a.index == b.index;
}

/* cfg.threads (>= 0; lowp/threads.h) and cfg.path (a lowp_kernel_path) of an op's config. */
LOWP_HIDDEN lowp_status lowp_op_check_threads_path(const char *fn, int32_t threads,
                                                   lowp_kernel_path path);

/* Group offsets: offs[0 .. groups-1] cumulative, non-decreasing, each in [previous, limit]
 * (`limit_name` names the limit in messages: "a.rows"). groups >= 1 and offs non-NULL are
 * checked too. For lowp_grouped_gemm, lowp_grouped_gemm_wgrad and the grouped linear layers. */
LOWP_HIDDEN lowp_status lowp_check_offs(const char *fn, const int32_t *offs, int32_t groups,
                                        int64_t limit, const char *limit_name);

/* lowp_hadamard16 of x^T [C, T] (F32; blocks of 16 tokens restarting at each of the G group
 * ends go, NULL: one group), transposed back into y [T, C] (no alias), computed down the
 * columns of x [T, C] with the same operations; threads as lowp_hadamard_cfg's. */
LOWP_HIDDEN void lowp_hadamard16_tokens(const float *x, int64_t T, int64_t C, const int32_t *go,
                                        int32_t G, uint64_t seed, uint64_t offset, int32_t threads,
                                        float *y);

#endif
