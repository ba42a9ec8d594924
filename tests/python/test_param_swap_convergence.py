"""Acceptance: the small MoE of examples/torch/moe_mix_recipe.py, prepared with all_mxfp8, mix
and all_block_fp8 and trained 200 steps on a fixed synthetic language (arithmetic progressions
with 10% random tokens, so the loss has a floor), reaches a loss within 2% of the same model
trained in bf16 (CPU autocast) from the same initialization. Loss: mean of the last 20 steps."""

import os
import sys

import pytest
import torch

import lowp.torch as lt

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch"))
import moe_mix_recipe as ex  # noqa: E402

STEPS = 200
torch.set_num_threads(1)  # tiny matrices; two cores shared with ctest -j2
_cache = {}


def final_loss(recipe):
    if recipe not in _cache:
        torch.manual_seed(0)
        model = ex.TinyMoE(n_layers=1)
        if recipe != "bf16":
            assert lt.apply_recipe(model, recipe)
        losses = ex.train(model, STEPS, noise=0.1)
        _cache[recipe] = (losses[0], sum(losses[-20:]) / 20)
    return _cache[recipe]


@pytest.mark.parametrize("recipe", ["all_mxfp8", "mix", "all_block_fp8"])
def test_loss_within_2_percent_of_bf16(recipe):
    first_ref, ref = final_loss("bf16")
    first, got = final_loss(recipe)
    assert first == pytest.approx(first_ref, rel=0.01)  # the same initialization
    assert ref < 0.6 * first_ref  # the task is learned, not flat
    gap = got / ref - 1
    print("%s: loss %.5f vs bf16 %.5f (gap %+.3f%%)" % (recipe, got, ref, 100 * gap))
    assert abs(gap) < 0.02
