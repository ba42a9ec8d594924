/* lowp: low-precision training numerics (FP8, MXFP8, MXFP4, Block FP8) in C.
 * Include this header for the whole public API. */
#ifndef LOWP_LOWP_H
#define LOWP_LOWP_H

#include "status.h"
#include "format.h"
#include "rng.h"
#include "threads.h"
#include "rng_tracker.h"
#include "device.h"
#include "cpu_path.h"
#include "tensor.h"
#include "cast.h"
#include "scale.h"
#include "quant.h"
#include "hadamard.h"
#include "layout.h"
#include "delayed.h"
#include "gemm.h"
#include "recipe.h"
#include "train.h"
#include "checkpoint.h"
#include "model.h"
#include "data.h"
#include "optim.h"
#include "safetensors.h"
#include "trainer.h"
#include "profile.h"

#endif
