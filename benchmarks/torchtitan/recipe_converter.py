"""Recipe name -> a torchtitan Trainer.Config converted for it (the RFC's recipe converter).

Recipes:

- ``bf16``: torchtitan's own model, untouched.
- a lowp recipe (``all_mxfp8``, ``mix``, ``all_block_fp8``, ``mix_fp4``, ``fp8_rowwise``,
  ``fp8_delayed``, ``block128``): ``lowp.torch.interfaces.torchtitan.lowp_trainer_config``.
- ``torchtitan_mxfp8``: torchtitan's own MXFP8 converters (``MXFP8LinearConverter`` on
  attention, shared experts and dense feed-forward; ``MXFP8GroupedExpertsConverter`` with its
  padding token dispatcher), as its ``deepseek_v3_debugmodel_mxfp8`` sets them, running on
  lowp's kernels through ``lowp.torch.patch_torchao()``.

On a machine with no accelerator every recipe runs with ``patch_torchtitan()``.
"""

from torch._utils import _get_available_device_type

import lowp.torch as lt
from lowp.torch.interfaces import torchtitan as lti
from lowp.torch.patches.torchtitan_patch import patch_torchtitan

RECIPES = ("bf16", "all_mxfp8", "mix", "all_block_fp8", "mix_fp4", "fp8_rowwise",
           "fp8_delayed", "block128", "torchtitan_mxfp8")


def _torchtitan_mxfp8_converters():
    from torchtitan.components.quantization import (MXFP8GroupedExpertsConverter,
                                                    MXFP8LinearConverter)
    return [MXFP8LinearConverter.Config(fqns=["attention", "shared_experts", "feed_forward"]),
            MXFP8GroupedExpertsConverter.Config(pad_multiple=128)]


def convert(config, recipe: str, model_builder=None):
    """Convert ``config`` (Trainer.Config) for ``recipe``. ``model_builder(converters)``
    rebuilds the model spec with torchtitan converters (``torchtitan_mxfp8`` needs it: its
    converters run when the spec is built)."""
    if recipe not in RECIPES:
        raise ValueError("recipe (%r) is not one of %s" % (recipe, ", ".join(RECIPES)))
    if _get_available_device_type() is None:
        patch_torchtitan()
    if recipe == "bf16":
        return config
    if recipe == "torchtitan_mxfp8":
        if model_builder is None:
            raise ValueError("recipe torchtitan_mxfp8 needs model_builder")
        lt.patch_torchao()  # before the converters check the device
        config.model_spec = model_builder(_torchtitan_mxfp8_converters())
        return config
    return lti.lowp_trainer_config(config, recipe)
