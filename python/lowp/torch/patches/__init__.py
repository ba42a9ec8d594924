"""Runtime patches: torchao's own MXFP8 and FP8 training recipes run on lowp's kernels.

Usage (torchao 0.18)::

    import lowp.torch
    from torchao.quantization import quantize_
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe

    lowp.torch.patch_torchao()          # opt-in; idempotent
    quantize_(model, MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_RCEIL))
    loss = model(x).sum(); loss.backward()   # F.linear / torch._grouped_mm on the wrapped
                                             # weights now run lowp.torch.linear / grouped_mm
    lowp.torch.unpatch_torchao()        # every original torchao object is back

With the patch on, torchao's MXFP8 training linear (`_to_mxfp8_then_scaled_mm`, `mx_mm`), its
MXFP8 grouped mm (`_to_mxfp8_then_scaled_grouped_mm`, `_MXFP8GroupedMM`), its FP8 rowwise
grouped mm (`_to_fp8_rowwise_then_scaled_grouped_mm`, `_Float8GroupedMM`), the linears of its
`Float8TrainingOpConfig` (`_to_fp8_then_scaled_mm`) and the capability assert of its
`quantize_` handler run through lowp: native kernels for CPU tensors, lowp's
portable torch path on other devices. AUTO recipes (`MXFP8_RCEIL`,
`MXFP8_RCEIL_WGRAD_WITH_HP`), which unpatched need SM100 GPUs and Triton, and EMULATED ones
(`MXFP8_EMULATED_RCEIL`) run the same lowp kernels. The results are those of lowp.torch's ops
with the equivalent config (`MXQuantizeConfig(scale_mode=...)`, `wgrad_hp=wgrad_with_hp`;
`"fp8_rowwise"` for the FP8 grouped mm); the settings map as `lowp.torch.patches.ops`
describes, and one lowp cannot honour raises naming it.

Each weight gets a `lowp.torch.WeightCache` (`weight_cache(param)` returns it), so activation
checkpointing (`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`, selective or
not) recomputes activations but reuses the weight's quantized copies.

Limits: only torchao 0.18 is tested (`TESTED_VERSIONS`); another version, or a missing
internal, is refused with nothing patched. Names bound before patching by user code (`from
torchao... import _to_mxfp8_then_scaled_grouped_mm`) keep the original. torchao 0.18's MXFP8
weight wrapper drops the bias of `F.linear(x, w, b)` and asserts on `torch.addmm(b, x, w)`;
patched (the patch replaces the wrapper's `__torch_function__` too) it adds the bias and
computes addmm as b + x w^T. `torch.mm(x, w)` / `torch.matmul` / `x @ w` keep torchao's
contract, x w^T for an [N, K] weight, in both wrappers.

Benchmark: `python -m lowp.torch.patches.bench` (see docs/benchmarks.md).
"""

from .ops import weight_cache
from .torchao_patch import (TESTED_VERSIONS, is_patched, patch_torchao, patched_targets,
                            unpatch_torchao)

__all__ = ["TESTED_VERSIONS", "is_patched", "patch_torchao", "patched_targets",
           "unpatch_torchao", "weight_cache"]

# torchtitan 0.3 on the CPU / any non-CUDA device (see torchtitan_patch's docstring).
from .torchtitan_patch import patch_torchtitan, torchtitan_patched, unpatch_torchtitan

__all__ += ["patch_torchtitan", "torchtitan_patched", "unpatch_torchtitan"]
