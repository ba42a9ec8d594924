/* Extra-state checkpoints: the FP8 delayed-scaling state of a wrapped module as a versioned,
 * little-endian binary blob (what a framework stores next to the weights as `_extra_state`).
 * Implemented in src/train/extra_state.c.
 *
 *   size_t len;
 *   lowp_param_extra_state_size(&w, &len);
 *   void *blob = malloc(len);
 *   lowp_param_extra_state_save(&w, blob, len, &len);   // synchronizes w's device first
 *   ...
 *   lowp_param_extra_state_load(&w, blob, len);        // state on w's device, synchronized
 *
 * Format (version 1), all little-endian:
 *   offset 0   8 bytes  magic "LOWPXST1"
 *          8   u32      version (1)
 *         12   u32      payload bytes that follow, up to the CRC
 *         16   u32      role count R (3: input, weight, grad_output)
 *         20   u32      history length L
 *         24   f32      margin
 *         28   u32      amax algorithm (0 max, 1 most_recent)
 *         32   R x u32  element format of each role (lowp_format values)
 *              R x (L x f32 amax history, f32 scale)
 *        end   u32      CRC-32 (IEEE, reflected, as zlib's crc32) of every byte before it
 * scale_inv is derived on load (1 / scale). A stateless module (no delayed scaling) saves an
 * empty blob (0 bytes) and loads only an empty blob. Loading a blob with another history
 * length keeps row 0 (this step's staging row) and the most recent L-1 rows that fit, padding
 * with zeros. A truncated or corrupt blob (bad magic, version, sizes, CRC, formats, a
 * non-finite or non-positive scale) returns an error and leaves the module's state untouched.
 * The module's own margin and algorithm (from its recipe) win over the blob's, which are
 * checked but not applied; role formats that differ from the module's are LOWP_ERR_INVALID_ARG;
 * a version above LOWP_EXTRA_STATE_VERSION is LOWP_ERR_VERSION.
 */
#ifndef LOWP_CHECKPOINT_H
#define LOWP_CHECKPOINT_H

#include "train.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOWP_EXTRA_STATE_VERSION 1u

LOWP_API lowp_status lowp_fp8_state_blob_size(const lowp_fp8_state *st, size_t *len);
LOWP_API lowp_status lowp_fp8_state_save(lowp_fp8_state *st, void *blob, size_t cap, size_t *len);
LOWP_API lowp_status lowp_fp8_state_load(lowp_fp8_state *st, const void *blob, size_t len);

/* The same for a parameter: its wrap's FP8 state, or an empty blob when it has none. */
LOWP_API lowp_status lowp_param_extra_state_size(const lowp_param *param, size_t *len);
LOWP_API lowp_status lowp_param_extra_state_save(lowp_param *param, void *blob, size_t cap,
                                                 size_t *len);
LOWP_API lowp_status lowp_param_extra_state_load(lowp_param *param, const void *blob, size_t len);

#ifdef __cplusplus
}
#endif
#endif
