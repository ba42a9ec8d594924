/* Checkpoint integrity (checkpoint_check.c owns it), used by checkpoint.c, the Python
 * extension's checkpoint reader and the checkpoint fuzzer. Not installed. */
#ifndef LOWP_TRAINER_CHECKPOINT_CHECK_H
#define LOWP_TRAINER_CHECKPOINT_CHECK_H

#include "core/internal.h"
#include "lowp/safetensors.h"
#include "lowp/trainer.h"

/* Checksums and value checks of checkpoints (format version 2,
 * described in checkpoint_check.c). Keys and tensor names are shorter than LOWP_CKPT_KEYLEN. */
#define LOWP_CKPT_KEYLEN 320
LOWP_HIDDEN uint32_t lowp_ckpt_tensor_crc(const lowp_st_tensor *t);
/* Over every entry but "crc32c.__metadata__", in key order. */
LOWP_HIDDEN lowp_status lowp_ckpt_meta_crc(const lowp_st_meta *m, int32_t n, uint32_t *crc);
/* Every checksum of a file: LOWP_ERR_CORRUPT naming the tensor or the metadata. */
LOWP_HIDDEN lowp_status lowp_ckpt_verify(const lowp_safetensors *f, const char *path);
/* The n binary32 values at v (any alignment) finite (and >= 0 with nonneg), else
 * LOWP_ERR_CORRUPT naming `name`. */
LOWP_HIDDEN lowp_status lowp_ckpt_check_values(const char *path, const char *name, const void *v,
                                               int64_t n, int nonneg);
/* Every number of info in the range lowp_trainer_create and the loop accept. */
LOWP_HIDDEN lowp_status lowp_ckpt_check_info(const char *path, const lowp_checkpoint_info *info);

#endif
