/* The aliasing rule of every op: no output buffer may overlap an input
 * buffer or another output; ops are never in place. Overlaps are refused with
 * LOWP_ERR_INVALID_ARG naming both buffers, before any work is queued. Sizes come from
 * lowp_tensor_nbytes / lowp_qtensor_nbytes, so a check costs a few comparisons. */
#ifndef LOWP_OPS_ALIAS_H
#define LOWP_OPS_ALIAS_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "lowp/scale.h"
#include "lowp/tensor.h"

typedef struct lowp_span {
    const char *name; /* "dst.data" */
    const void *p;
    size_t n; /* bytes; 0: nothing to overlap */
} lowp_span;

static inline int lowp_spans_overlap(const lowp_span *a, const lowp_span *b) {
    if (!a->p || !b->p || a->n == 0 || b->n == 0) return 0;
    const uintptr_t x = (uintptr_t) a->p, y = (uintptr_t) b->p;
    return x < y + b->n && y < x + a->n;
}

/* outs[0..nout-1] against each other and against ins[0..nin-1]. */
static inline lowp_status lowp_check_no_alias(const char *fn, const lowp_span *outs, int nout,
                                              const lowp_span *ins, int nin) {
    for (int i = 0; i < nout; i++) {
        for (int j = 0; j < nin; j++)
            if (lowp_spans_overlap(&outs[i], &ins[j]))
                return lowp_fail(LOWP_ERR_INVALID_ARG,
                                 "%s: %s overlaps %s (outputs may not alias inputs; ops are "
                                 "never in place)",
                                 fn, outs[i].name, ins[j].name);
        for (int j = i + 1; j < nout; j++)
            if (lowp_spans_overlap(&outs[i], &outs[j]))
                return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s overlaps %s (two outputs)", fn,
                                 outs[i].name, outs[j].name);
    }
    return LOWP_OK;
}

/* The data and the scales of q as two spans (q NULL: two empty spans). */
static inline void lowp_qtensor_spans(const lowp_qtensor *q, const char *data_name,
                                      const char *scales_name, lowp_span out[2]) {
    size_t db = 0, sb = 0;
    if (q && lowp_qtensor_nbytes(q, &db, &sb) != LOWP_OK) db = sb = 0;
    out[0] = (lowp_span){data_name, q ? q->data : NULL, db};
    out[1] = (lowp_span){scales_name, q ? q->scales : NULL, sb};
}

static inline lowp_span lowp_tensor_span(const lowp_tensor *t, const char *name) {
    size_t n = 0;
    if (lowp_tensor_nbytes(t, &n) != LOWP_OK) n = 0;
    return (lowp_span){name, t->data, n};
}

#endif
