"""The torchao_npu RFC's two usage examples run through torchao's own quantize_ with lowp's
configs, only their import lines changed (issue 36 acceptance): (a) MXFP8 prepare -> train ->
convert with QATStep.CONVERT; (b) the mix recipe (routed experts Block FP8, the other linear
weights MXFP8) chosen by params_filter_fn.

The RFC text itself was not at hand; the examples follow its API as the issue states it
(ParamSwapConfig(base_config=None, activation_config=None, weight_config=None, *, step,
params_filter_fn), MXQuantizeConfig(), BlockQuantizeConfig(), torchao's QATStep). Each example
sits between the ``# ---- example`` markers; the checks after it use independent references:
lowp.torch.linear on the plain weights (a), the mix recipe's table (b), and plain torch after
convert."""

import copy
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import lowp.torch as lt
from lowp.torch import LowpWeight

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch"))
import moe_mix_recipe as moe_ex  # noqa: E402  (TinyMoE, torchtitan naming)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32))


def train(model, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 64, generator=g)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def test_rfc_example_mxfp8_prepare_train_convert():
    model = mlp()
    ref = copy.deepcopy(model)
    # ---- example (a) ----
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATStep
    from lowp.torch import MXQuantizeConfig, ParamSwapConfig  # torchao_npu's, in the RFC

    quantize_(model, ParamSwapConfig(weight_config=MXQuantizeConfig(), step="prepare"))
    train(model)
    quantize_(model, ParamSwapConfig(step=QATStep.CONVERT))
    # ---- checks ----
    # training ran lowp's MXFP8 linear on every weight: the same steps on the plain copy
    # through lowp.torch.linear give the same bits
    def ref_forward(x):
        h = F.gelu(lt.linear(x, ref[0].weight, ref[0].bias, "mxfp8"))
        return lt.linear(h, ref[2].weight, ref[2].bias, "mxfp8")

    ref.forward = ref_forward
    train(ref)
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert type(p) is nn.Parameter and not isinstance(p, LowpWeight), n
        assert torch.equal(p, q), n
    # converted: plain torch modules, plain F.linear
    x = torch.randn(4, 64)
    want = F.linear(F.gelu(F.linear(x, ref[0].weight, ref[0].bias)), ref[2].weight, ref[2].bias)
    assert torch.equal(model(x), want)


def _non_routed_linear(param, fqn):
    keep_high = ("tok_embeddings", "router", "output", "norm")
    return param.dim() == 2 and not any(k in fqn for k in keep_high)


def test_rfc_example_mix_recipe_through_params_filter_fn():
    torch.manual_seed(0)
    model = moe_ex.TinyMoE(n_layers=1)
    torch.manual_seed(0)
    recipe = moe_ex.TinyMoE(n_layers=1)
    # ---- example (b) ----
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATStep
    from lowp.torch import BlockQuantizeConfig, MXQuantizeConfig, ParamSwapConfig

    def is_routed_expert(param, fqn):
        return ".moe.experts." in fqn

    whole_model = lambda module, fqn: fqn == ""  # noqa: E731  (hand the handler the root)
    quantize_(model, ParamSwapConfig(weight_config=BlockQuantizeConfig(),
                                     params_filter_fn=is_routed_expert), filter_fn=whole_model)
    quantize_(model, ParamSwapConfig(weight_config=MXQuantizeConfig(),
                                     params_filter_fn=_non_routed_linear), filter_fn=whole_model)
    losses = moe_ex.train(model, 4)
    quantize_(model, ParamSwapConfig(step=QATStep.CONVERT), filter_fn=whole_model)
    # ---- checks ----
    # the weights the example wrapped, and how, are the mix recipe's; trained, the same losses
    plan = lt.apply_recipe(recipe, "mix")
    assert {type(c) for c in plan.values()} == {BlockQuantizeConfig, MXQuantizeConfig}
    want_losses = moe_ex.train(recipe, 4)
    assert losses == want_losses
    for (n, p), (m, q) in zip(model.named_parameters(), recipe.named_parameters()):
        assert n == m and type(p) is nn.Parameter and torch.equal(p, q.detach()), n
