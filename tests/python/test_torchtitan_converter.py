"""Issue 39.1: lowp's converter for torchtitan 0.3 (lowp.torch.interfaces.torchtitan).

- which of torchtitan's DeepSeek-V3 modules each recipe converts, by the names the issue gives
  (routed experts `layers.N.moe.routed_experts.inner_experts.w1_EFD` Block FP8 under `mix`;
  lm_head, router, embeddings and norms never), and `exclude`;
- the converted modules compute torchtitan's own linear and grouped experts (checked against
  float64 references within each format's error) with plain parameters of the same names;
- fp8_delayed: the state advances once per optimizer step through the step post-hook, with the
  scale an independent computation gives (448 / amax of the recorded inputs), and not without
  the hook; its extra state round-trips through a state dict;
- bad recipes, bad exclusions and an untested torchtitan version are refused."""

import pytest
import torch

torchtitan = pytest.importorskip("torchtitan")
pytest.importorskip("torchao")

import lowp.torch as lt  # noqa: E402
from lowp.torch.interfaces import torchtitan as lti  # noqa: E402
from torchtitan.models.common.linear import Linear  # noqa: E402
from torchtitan.models.common.moe import GroupedExperts  # noqa: E402


def _debug_model(recipe, exclude=()):
    from torchtitan.models.deepseek_v3 import model_registry
    spec = model_registry("debugmodel",
                          converters=[lti.LowpConverter.Config(recipe=recipe,
                                                               exclude=list(exclude))])
    with torch.device("meta"):
        return spec.model.build()


def _kinds(model):
    out = {}
    for n, m in model.named_modules():
        if isinstance(m, lti.LowpLinear):
            out[n] = type(m.lowp_config).__name__
        elif isinstance(m, lti.LowpGroupedExperts):
            out[n] = {k: type(v).__name__ for k, v in m.lowp_configs.items()}
    return out


def test_mix_names_torchtitan_0_3():
    model = _debug_model("mix")
    kinds = _kinds(model)
    experts = "layers.1.moe.routed_experts.inner_experts"
    assert kinds[experts] == {w: "BlockQuantizeConfig" for w in lti.EXPERT_WEIGHTS}
    for n in ("layers.1.attention.wq", "layers.1.attention.wkv_b",
              "layers.1.moe.shared_experts.w2", "layers.0.feed_forward.w1"):
        assert kinds[n] == "MXQuantizeConfig"
    for n, m in model.named_modules():  # kept in high precision
        if any(s in n for s in ("lm_head", "router", "tok_embeddings", "norm")):
            assert not isinstance(m, (lti.LowpLinear, lti.LowpGroupedExperts)), n
    assert type(model.lm_head) is Linear
    assert sum(isinstance(m, lti.LowpGroupedExperts) for m in model.modules()) == 5
    # parameters keep torchtitan's names and stay plain
    names = dict(model.named_parameters())
    assert f"{experts}.w1_EFD" in names and "layers.1.attention.wq.weight" in names
    assert all(type(p) is torch.nn.Parameter for p in names.values())


def test_recipes_and_exclusions():
    assert _kinds(_debug_model("bf16")) == {}
    allb = _kinds(_debug_model("all_block_fp8"))
    assert set(allb["layers.2.attention.wo"].split()) == {"BlockQuantizeConfig"}
    ex = _kinds(_debug_model("all_mxfp8", exclude=["layers.1.*", "*.wkv_a.weight"]))
    assert not any(k.startswith("layers.1.") for k in ex)
    assert not any(k.endswith("wkv_a") for k in ex) and "layers.2.attention.wq" in ex
    with pytest.raises(ValueError, match="recipe .'nope'. is not a lowp recipe"):
        lti.LowpConverter(lti.LowpConverter.Config(recipe="nope"))
    with pytest.raises(TypeError, match="exclude"):
        lti.LowpConverter(lti.LowpConverter.Config(recipe="mix", exclude="layers.*"))


def test_untested_version_refused(monkeypatch):
    monkeypatch.setattr(torchtitan, "__version__", "0.2.2")
    with pytest.raises(RuntimeError, match="torchtitan 0.2.2 is not a tested version"):
        lti._check_version()


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def test_linear_computes_torchtitans_linear():
    torch.manual_seed(0)
    cfg = Linear.Config(in_features=128, out_features=64)
    ref = cfg.build()
    for recipe_cfg, bound in ((lt.MXQuantizeConfig(), 0.08), (lt.BlockQuantizeConfig(), 0.08)):
        m = lti.LowpLinear.Config(in_features=128, out_features=64, lowp_config=recipe_cfg).build()
        m.load_state_dict(ref.state_dict())
        x = torch.randn(2, 16, 128, requires_grad=True)
        y = m(x)
        exact = x.double() @ ref.weight.double().t()
        assert _rel(y, exact) < bound
        y.sum().backward()
        assert m.weight.grad is not None and _rel(m.weight.grad, torch.ones(2 * 16, 64).double()
                                                  .t() @ x.detach().double().view(-1, 128)) < bound


def test_grouped_experts_compute_torchtitans_experts():
    torch.manual_seed(0)
    base = dict(dim=64, hidden_dim=96, num_experts=4)
    ref = GroupedExperts.Config(**base).build()
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.1)
    counts = torch.tensor([5, 0, 17, 10])
    x = torch.randn(int(counts.sum()), 64)
    w1, w2, w3 = (getattr(ref, n).detach().double() for n in lti.EXPERT_WEIGHTS)
    rows, s = [], 0  # float64 SwiGLU expert by expert
    for e, c in enumerate(counts.tolist()):
        xe = x[s:s + c].double()
        rows.append((torch.nn.functional.silu(xe @ w1[e].t()) * (xe @ w3[e].t())) @ w2[e].t())
        s += c
    exact = torch.cat(rows)
    for q in (lt.MXQuantizeConfig(), lt.BlockQuantizeConfig()):
        m = lti.LowpGroupedExperts.Config(**base, lowp_configs={w: q for w in
                                                                 lti.EXPERT_WEIGHTS}).build()
        m.load_state_dict(ref.state_dict())
        out = m(x, counts)
        assert out.dtype == x.dtype and _rel(out, exact) < 0.1
        out.square().sum().backward()
        assert all(getattr(m, n).grad is not None and getattr(m, n).grad.abs().sum() > 0
                   for n in lti.EXPERT_WEIGHTS)


def _delayed_model():
    torch.manual_seed(0)
    cfg = lt.Float8TensorwiseConfig(delayed=True, history_len=4)
    return torch.nn.Sequential(*(lti.LowpLinear.Config(in_features=64, out_features=64,
                                                       lowp_config=cfg).build()
                                 for _ in range(2)))


def _steps(model, opt, xs):
    for x in xs:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def test_fp8_delayed_updates_after_each_optimizer_step():
    xs = [torch.randn(8, 64) * (i + 1) for i in range(3)]
    model = _delayed_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    assert lti.register_fp8_updates(opt, model) is not None
    states = [m.lowp_fp8_state for m in lti.fp8_modules(model)]
    assert len(states) == 2
    _steps(model, opt, xs)
    assert [s.updates for s in states] == [3, 3]
    # input role of the first layer: max over its history of each step's amax(x)
    expect = torch.tensor(448.0) / max(float(x.abs().max()) for x in xs)
    assert torch.equal(states[0].scale("input"), expect.float())
    # without the hook nothing advances (under FSDP2 no weight version moves either)
    model2 = _delayed_model()
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.01)
    _steps(model2, opt2, xs)
    assert [m.lowp_fp8_state.updates for m in lti.fp8_modules(model2)] == [0, 0]
    assert torch.equal(lti.fp8_modules(model2)[0].lowp_fp8_state.scale("input"),
                       torch.tensor(1.0))


def test_fp8_delayed_extra_state_round_trips():
    xs = [torch.randn(8, 64) for _ in range(2)]
    model = _delayed_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    lti.register_fp8_updates(opt, model)
    _steps(model, opt, xs)
    sd = model.state_dict()
    assert "0._extra_state" in sd and sd["0._extra_state"].dtype == torch.uint8
    fresh = _delayed_model()
    fresh.load_state_dict(sd)
    a, b = model[0].lowp_fp8_state, fresh[0].lowp_fp8_state
    assert torch.equal(a.scales, b.scales) and torch.equal(a.amax_history, b.amax_history)
    # a module without delayed scaling has no `_extra_state` key (bf16 checkpoints load)
    plain = lti.LowpLinear.Config(in_features=64, out_features=64,
                                  lowp_config=lt.MXQuantizeConfig()).build()
    assert set(plain.state_dict()) == {"weight"}


def test_registry_entries_and_trainer_config():
    for model in ("deepseek_v3_debugmodel", "llama3_debugmodel"):
        for r in lt.RECIPES:
            assert callable(getattr(lti, f"{model}_lowp_{r}"))
    cfg = lti.deepseek_v3_debugmodel_lowp_fp8_delayed()
    assert getattr(cfg.model_spec.post_optimizer_build_fn, "lowp_chained", False)
    with pytest.raises(ValueError, match="model_spec"):
        lti.lowp_trainer_config(object(), "mix")
