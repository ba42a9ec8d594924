"""Recipe rules against torchtitan's parameter names, before 0.3.0 and in 0.3.0 (issue 39).

The fake modules below carry the exact parameter names of torchtitan 0.3.0's DeepSeek-V3 and
llama3 models (read from torchtitan-0.3.0's `models/common/decoder.py`, `models/common/moe.py`
and the state-dict adapters' `from_hf_map`), and those of the older `moe.experts.w1` naming;
no torchtitan import is needed. The expected configs are the recipe docs' table (routed experts
Block FP8 in `mix`; router, embeddings, norms and lm_head high precision), written out here by
hand."""

import warnings

import pytest
import torch
import torch.nn as nn

import lowp.torch as lt

D, F_, E = 32, 64, 4


class _Experts(nn.Module):  # torchtitan 0.3.0 models/common/moe.py GroupedExperts
    def __init__(self):
        super().__init__()
        self.w1_EFD = nn.Parameter(torch.randn(E, F_, D) * 0.02)
        self.w2_EDF = nn.Parameter(torch.randn(E, D, F_) * 0.02)
        self.w3_EFD = nn.Parameter(torch.randn(E, F_, D) * 0.02)


class _OldExperts(nn.Module):  # older torchtitan: layers.N.moe.experts.w1
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(E, F_, D) * 0.02)
        self.w2 = nn.Parameter(torch.randn(E, D, F_) * 0.02)
        self.w3 = nn.Parameter(torch.randn(E, F_, D) * 0.02)


def _ffn():
    m = nn.Module()
    m.w1, m.w2, m.w3 = nn.Linear(D, F_, False), nn.Linear(F_, D, False), nn.Linear(D, F_, False)
    return m


def _moe(new_names):
    moe = nn.Module()
    if new_names:
        moe.routed_experts = nn.Module()
        moe.routed_experts.inner_experts = _Experts()
    else:
        moe.experts = _OldExperts()
    moe.router = nn.Module()
    moe.router.gate = nn.Linear(D, E, False)
    moe.shared_experts = _ffn()
    moe.expert_bias_E = nn.Parameter(torch.zeros(E))  # 1-D, never a candidate
    return moe


def _attention_dsv3():
    a = nn.Module()
    a.wq = nn.Linear(D, D, False)
    a.wkv_a = nn.Linear(D, D, False)
    a.kv_norm = nn.RMSNorm(D)
    a.wkv_b = nn.Linear(D, 2 * D, False)
    a.wo = nn.Linear(D, D, False)
    return a


def _model(layer, n=2, lm_head="lm_head"):
    m = nn.Module()
    m.tok_embeddings = nn.Embedding(50, D)
    m.layers = nn.ModuleDict({str(i): layer(i) for i in range(n)})
    m.norm = nn.RMSNorm(D)
    setattr(m, lm_head, nn.Linear(D, 50, False))
    return m


def dsv3_030():
    """torchtitan 0.3.0 DeepSeek-V3: layer 0 dense (feed_forward), layer 1 MoE."""
    def layer(i):
        b = nn.Module()
        b.attention = _attention_dsv3()
        b.attention_norm, b.ffn_norm = nn.RMSNorm(D), nn.RMSNorm(D)
        if i == 0:
            b.feed_forward = _ffn()
        else:
            b.moe = _moe(True)
        return b
    return _model(layer)


def dsv3_old():
    def layer(i):
        b = nn.Module()
        b.attention = _attention_dsv3()
        b.attention_norm, b.ffn_norm = nn.RMSNorm(D), nn.RMSNorm(D)
        b.moe = _moe(False)
        return b
    return _model(layer, n=1, lm_head="output")


def llama3_030():
    def layer(i):
        b = nn.Module()
        b.attention = nn.Module()
        b.attention.qkv_linear = nn.Module()
        for w in ("wq", "wk", "wv"):
            setattr(b.attention.qkv_linear, w, nn.Linear(D, D, False))
        b.attention.wo = nn.Linear(D, D, False)
        b.attention_norm, b.ffn_norm = nn.RMSNorm(D), nn.RMSNorm(D)
        b.feed_forward = _ffn()
        return b
    return _model(layer)


ROUTED_030 = [f"layers.1.moe.routed_experts.inner_experts.{w}" for w in
              ("w1_EFD", "w2_EDF", "w3_EFD")]
BIAS = "layers.1.moe.expert_bias_E"
HIGH = ["tok_embeddings.weight", "norm.weight", "lm_head.weight",
        "layers.1.moe.router.gate.weight", "layers.1.moe.expert_bias_E"] + \
    ["layers.%d.%s.weight" % (i, n) for i in (0, 1)
     for n in ("attention.kv_norm", "attention_norm", "ffn_norm")]
MX_030 = (["layers.%d.attention.%s.weight" % (i, w) for i in (0, 1)
           for w in ("wq", "wkv_a", "wkv_b", "wo")]
          + ["layers.0.feed_forward.w%d.weight" % k for k in (1, 2, 3)]
          + ["layers.1.moe.shared_experts.w%d.weight" % k for k in (1, 2, 3)])


def _kinds(plan):
    return {k: (None if v is None else type(v).__name__) for k, v in plan.items()}


def test_mix_puts_torchtitan_030_routed_experts_in_block_fp8():
    m = dsv3_030()
    names = [n for n, _ in m.named_parameters()]
    assert set(ROUTED_030) | set(HIGH) | set(MX_030) == set(names)
    p = _kinds(lt.plan_recipe(m, "mix"))
    assert {k: p[k] for k in ROUTED_030} == dict.fromkeys(ROUTED_030, "BlockQuantizeConfig")
    assert {k: p[k] for k in MX_030} == dict.fromkeys(MX_030, "MXQuantizeConfig")
    assert not set(HIGH) & set(p)
    fp4 = lt.plan_recipe(m, "mix_fp4")
    assert all(fp4[k].mxfp4_fake_quantize_config is not None for k in ROUTED_030)
    assert all(getattr(fp4[k], "mxfp4_fake_quantize_config", None) is None for k in MX_030)


def test_mix_keeps_the_old_names():
    m = dsv3_old()
    p = _kinds(lt.plan_recipe(m, "mix"))
    for w in ("w1", "w2", "w3"):
        assert p["layers.0.moe.experts." + w] == "BlockQuantizeConfig"
        assert p["layers.0.moe.shared_experts.%s.weight" % w] == "MXQuantizeConfig"
    for hp in ("output.weight", "layers.0.moe.router.gate.weight", "tok_embeddings.weight"):
        assert hp not in p


def test_plan_recipe_by_names_matches_the_model_plan():
    m = dsv3_030()
    names = [n for n, _ in m.named_parameters()]
    by_name = lt.plan_recipe(iter(names), "mix")  # any iterable
    assert set(by_name) == set(names)
    assert {k for k, v in by_name.items() if v is None} == set(HIGH) - {BIAS}
    # names alone: the rules' answer; which of them the param swap can wrap (2-D linear or 3-D
    # expert weights, not this 1-D bias) takes the module
    assert type(by_name.pop(BIAS)).__name__ == "MXQuantizeConfig"
    assert _kinds({k: v for k, v in by_name.items() if v is not None}) == \
        _kinds(lt.plan_recipe(m, "mix"))
    assert lt.plan_recipe(["layers.7.moe.routed_experts.inner_experts.w2_EDF"],
                          "all_mxfp8", rules=[("layers.7.*", None)]) == \
        {"layers.7.moe.routed_experts.inner_experts.w2_EDF": None}
    with pytest.raises(TypeError, match="names"):
        lt.plan_recipe("layers.0.attention.wq.weight", "mix")
    with pytest.raises(TypeError, match=r"names\[1\]"):
        lt.plan_recipe(["a.weight", 3], "mix")
    with pytest.raises(ValueError, match="name"):
        lt.plan_recipe(names, "fp3")


def test_llama3_030_names():
    p = _kinds(lt.plan_recipe(llama3_030(), "all_block_fp8"))
    want = {"layers.%d.attention.%s.weight" % (i, w) for i in (0, 1)
            for w in ("qkv_linear.wq", "qkv_linear.wk", "qkv_linear.wv", "wo")}
    want |= {"layers.%d.feed_forward.w%d.weight" % (i, k) for i in (0, 1) for k in (1, 2, 3)}
    assert p == dict.fromkeys(want, "BlockQuantizeConfig")


def _notices(model, name, rules=None):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        lt.apply_recipe(model, name, rules=rules, verbose=True)
    return [str(w.message) for w in rec if "matched no parameter" in str(w.message)]


def test_verbose_lists_unmatched_rules_on_stderr(capsys):
    m = dsv3_030()
    notes = _notices(m, "mix", rules=[("layers.9.*", None)])
    out = capsys.readouterr()
    assert out.out == ""  # never stdout
    assert "weights wrapped" in out.err and ROUTED_030[0] in out.err
    assert len(notes) == 1 and "rules[0]" in notes[0] and "layers.9.*" in notes[0]
    # a dense model: the expert rules and the router rule decided nothing, and say so
    notes = _notices(llama3_030(), "mix")
    assert sorted(n.split("rule ")[1].split(" (")[0] for n in notes) == \
        ["routed experts", "router", "shared experts"]
    assert any("*.moe.routed_experts.*" in n for n in notes)
    # every name under a group: the catch-all deciding nothing is no notice
    m = dsv3_030()
    del m.layers["0"].feed_forward
    assert _notices(m, "mix") == []


def test_apply_recipe_wraps_030_routed_experts_as_block_fp8():
    m = dsv3_030()
    lt.apply_recipe(m, "mix")
    ex = m.layers["1"].moe.routed_experts.inner_experts
    assert isinstance(ex.w1_EFD, lt.LowpWeight)
    assert ex.w1_EFD.config.name == "block32x32"
    assert m.layers["1"].moe.shared_experts.w1.weight.config.name == "mxfp8"
    assert not isinstance(m.layers["1"].moe.router.gate.weight, lt.LowpWeight)


@pytest.mark.parametrize("rules", [5, "layers.0.*", 2.5])
def test_rules_of_the_wrong_type_name_the_argument(rules):
    """Before, `rules=5` raised a bare "'int' object is not iterable"."""
    with pytest.raises(TypeError, match="rules must be"):
        lt.apply_recipe(dsv3_030(), "mix", rules=rules)
    with pytest.raises(TypeError, match="rules must be"):
        lt.plan_recipe(["a.weight"], "mix", rules=rules)
