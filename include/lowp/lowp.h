/* lowp: low-precision training numerics (FP8, MXFP8, MXFP4, Block FP8) in C.
 * Include this header for the whole public API. */
#ifndef LOWP_LOWP_H
#define LOWP_LOWP_H

#include "status.h"
#include "format.h"
#include "rng.h"
#include "device.h"
#include "tensor.h"
#include "cast.h"
#include "quant.h"
#include "gemm.h"
#include "recipe.h"
#include "train.h"
#include "checkpoint.h"
#include "model.h"
#include "trainer.h"
#include "profile.h"

#endif
