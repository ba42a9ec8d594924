"""Parameters a quantize_ call's module filter leaves out (issue 36, acceptance): torchao's
default filter hands ParamSwapConfig's handler only nn.Linear modules, so without
``filter_fn=lowp.torch.param_swap_filter`` a prepare leaves 3-D expert weights in high
precision and a convert leaves them wrapped. Both now warn, naming the parameters, and
``lowp.torch.convert(model)`` unwraps every wrapped parameter whatever the filter."""

import warnings

import pytest
import torch
import torch.nn as nn
from torchao.quantization import quantize_

import lowp.torch as lt
from lowp.torch import LowpWeight, ParamSwapConfig, param_swap_filter


class Moe(nn.Module):
    """Two linears, an embedding and a module holding a 3-D expert weight."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 32)
        self.attn = nn.Linear(32, 32)
        self.out = nn.Linear(32, 32)
        self.experts = nn.Module()
        self.experts.w1 = nn.Parameter(torch.randn(2, 32, 32))


def _notices(fn):
    """Run fn(); the texts of the lowp.torch quantize_ notices it raised."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in rec if str(w.message).startswith("lowp.torch: quantize_")]


def _wrapped(m):
    return sorted(n for n, _ in lt.wrapped_parameters(m))


def test_prepare_without_the_filter_names_the_experts_left_out():
    m = Moe()
    got = _notices(lambda: quantize_(m, ParamSwapConfig(weight_config="mxfp8")))
    assert _wrapped(m) == ["attn.weight", "out.weight"]
    assert len(got) == 1  # once per call, not once per nn.Linear handed to the handler
    assert "1 parameters in high precision" in got[0] and ": experts.w1;" in got[0]
    assert "filter_fn=lowp.torch.param_swap_filter" in got[0] and "\n" not in got[0]


def test_prepare_that_reaches_every_weight_is_silent():
    m = Moe()
    assert _notices(lambda: quantize_(m, ParamSwapConfig(weight_config="mxfp8"),
                                      filter_fn=param_swap_filter)) == []
    assert _wrapped(m) == ["attn.weight", "experts.w1", "out.weight"]
    m = Moe()  # a filter of the user's own that hands the expert module too
    reach = lambda mod, fqn: isinstance(mod, nn.Linear) or fqn == "experts"  # noqa: E731
    assert _notices(lambda: quantize_(m, ParamSwapConfig(weight_config="mxfp8"),
                                      filter_fn=reach)) == []
    assert _wrapped(m) == ["attn.weight", "experts.w1", "out.weight"]
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))  # nothing but linears
    assert _notices(lambda: quantize_(m, ParamSwapConfig(weight_config="mxfp8"))) == []


def test_prepare_notice_follows_params_filter_fn():
    m = Moe()  # params_filter_fn sees full names, as with param_swap_filter
    cfg = ParamSwapConfig(weight_config="mxfp8", params_filter_fn=lambda p, fqn: p.dim() == 2)
    got = _notices(lambda: quantize_(m, cfg))
    assert len(got) == 1 and ": emb.weight;" in got[0]
    m = Moe()  # the config would take no weight that torchao's filter does not reach
    cfg = ParamSwapConfig(weight_config="mxfp8",
                          params_filter_fn=lambda p, fqn: p.dim() == 2 and "emb" not in fqn)
    assert _notices(lambda: quantize_(m, cfg)) == []


def test_the_notice_points_at_the_quantize_call():
    m = Moe()
    with pytest.warns(UserWarning, match="experts.w1") as rec:
        quantize_(m, ParamSwapConfig(weight_config="mxfp8"))
    assert [w.filename for w in rec] == [__file__]


def test_convert_without_the_filter_names_the_weights_left_wrapped():
    m = Moe()
    quantize_(m, ParamSwapConfig(weight_config="mxfp8"), filter_fn=param_swap_filter)
    got = _notices(lambda: quantize_(m, ParamSwapConfig(step="convert")))
    assert _wrapped(m) == ["experts.w1"]
    assert len(got) == 1 and "1 parameters wrapped" in got[0] and ": experts.w1;" in got[0]
    assert "lowp.torch.convert(model)" in got[0]
    m = Moe()
    quantize_(m, ParamSwapConfig(weight_config="mxfp8"), filter_fn=param_swap_filter)
    assert _notices(lambda: quantize_(m, ParamSwapConfig(step="convert"),
                                      filter_fn=param_swap_filter)) == []
    assert _wrapped(m) == []


def test_convert_unwraps_every_weight_whatever_the_filter():
    m = Moe()
    plain = {n: p.detach().clone() for n, p in m.named_parameters()}
    quantize_(m, ParamSwapConfig(weight_config="mxfp8"), filter_fn=param_swap_filter)
    masters = {n: p.master for n, p in lt.wrapped_parameters(m)}
    with pytest.warns(UserWarning, match="leaves 1 parameters wrapped"):
        quantize_(m, ParamSwapConfig(step="convert"))  # leaves experts.w1 wrapped
    assert sorted(lt.convert(m)) == ["experts.w1"]
    assert _wrapped(m) == [] and lt.convert(m) == []
    for n, p in m.named_parameters():
        assert type(p) is nn.Parameter and not isinstance(p, LowpWeight)
        assert torch.equal(p.detach(), plain[n])
    assert m.experts.w1.data_ptr() == masters["experts.w1"].data_ptr()  # the master itself


def test_convert_checks_its_argument():
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        lt.convert({"w": torch.zeros(2)})
