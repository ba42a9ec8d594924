"""The param swap (issue 12 points 1-6 and 10): ParamSwapConfig through torchao's quantize_, the
LowpWeight routing and dispatch, optimizers, checkpoints, the once-per-step cache, convert,
recipes and activation checkpointing.

The reference for every routed call is the lowp.torch op itself called on the plain master
weight: the wrapped model must give the same bits, forward and backward."""

import copy
import dataclasses
import io
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torchao.quantization import quantize_
from torchao.core.config import AOBaseConfig
from torchao.quantization.qat import QATConfig, QATStep
from torchao.quantization.transform_module import _QUANTIZE_CONFIG_HANDLER

import lowp.torch as lt
from lowp.torch import LowpWeight, MXQuantizeConfig, ParamSwapConfig, param_swap_filter
from lowp.torch.quantize import _param_swap_transform

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch"))
import moe_mix_recipe as moe_ex  # noqa: E402  (the example's TinyMoE, torchtitan naming)


def bits(t):
    t = t.detach().contiguous()
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32))


# ---- point 1: the config and its handler ----


def test_config_is_a_torchao_config_with_registered_handler():
    # A frozen dataclass on torchao's AOBaseConfig (QATConfig is a mutable dataclass, which a
    # frozen one cannot extend); the step is torchao's QATStep.
    cfg = ParamSwapConfig(weight_config=MXQuantizeConfig())
    assert isinstance(cfg, AOBaseConfig) and not isinstance(cfg, QATConfig)
    assert dataclasses.is_dataclass(cfg) and cfg.step is QATStep.PREPARE
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.step = QATStep.CONVERT
    assert _QUANTIZE_CONFIG_HANDLER[ParamSwapConfig] is _param_swap_transform
    # convert accepts the weight_config again (torchao's QATConfig refuses it)
    ParamSwapConfig(weight_config=MXQuantizeConfig(), step="convert")
    ParamSwapConfig(base_config="mxfp8")
    with pytest.raises(ValueError, match="step"):
        ParamSwapConfig(weight_config=MXQuantizeConfig(), step="train")
    with pytest.raises(ValueError, match="weight_config"):
        ParamSwapConfig()
    with pytest.raises(TypeError, match="weight_config"):
        ParamSwapConfig(weight_config=3)
    with pytest.raises(TypeError, match="params_filter_fn"):
        ParamSwapConfig(weight_config="mxfp8", params_filter_fn=5)
    with pytest.raises(ValueError, match="base_config"):
        ParamSwapConfig(base_config="mxfp8", weight_config="mxfp8")


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 32)
        self.conv = nn.Conv1d(4, 4, 3)
        self.lin = nn.Linear(32, 32)
        self.experts = nn.Module()
        self.experts.w1 = nn.Parameter(torch.randn(2, 32, 32))
        self.vec = nn.Parameter(torch.randn(32))


def _wrapped(m):
    return sorted(n for n, _ in lt.wrapped_parameters(m))


def test_default_params_filter():
    m = Mixed()
    quantize_(m, ParamSwapConfig(weight_config=MXQuantizeConfig()))  # torchao's default filter
    assert _wrapped(m) == ["lin.weight"]
    m = Mixed()
    quantize_(m, ParamSwapConfig(weight_config=MXQuantizeConfig()), filter_fn=param_swap_filter)
    assert _wrapped(m) == ["experts.w1", "lin.weight"]
    m = Mixed()
    seen = []

    def only_experts(p, fqn):
        seen.append(fqn)
        return fqn.startswith("experts.")

    quantize_(m, ParamSwapConfig(weight_config="mxfp8", params_filter_fn=only_experts),
              filter_fn=param_swap_filter)
    assert _wrapped(m) == ["experts.w1"] and "emb.weight" in seen


def test_tied_weights_stay_tied():
    m = nn.Sequential(nn.Linear(32, 32, bias=False), nn.Linear(32, 32, bias=False))
    m[1].weight = m[0].weight
    quantize_(m, ParamSwapConfig(weight_config="mxfp8"), filter_fn=param_swap_filter)
    assert m[0].weight is m[1].weight and isinstance(m[0].weight, LowpWeight)


# ---- point 2: the configs' bad fields are tested by tests/python/test_torch_ops.py
# (test_bad_config_fields); here: a wrapped weight carries the resolved recipe ----


def test_prepare_resolves_and_checks_the_recipe():
    m = mlp()
    quantize_(m, ParamSwapConfig(weight_config=lt.BlockQuantizeConfig(),
                                 activation_config=MXQuantizeConfig()))
    assert m[0].weight.config == lt.resolve_config(lt.BlockQuantizeConfig(), MXQuantizeConfig())
    with pytest.raises(ValueError, match="pairs"):
        quantize_(mlp(), ParamSwapConfig(weight_config=lt.Block128Config(),
                                         activation_config=MXQuantizeConfig()))


# ---- point 3: routing and dispatch ----


ROUTES = ["linear", "matmul3d", "matmul_op", "mm_t", "mm_left", "addmm", "linear_bias"]


@pytest.mark.parametrize("kind", ROUTES)
@pytest.mark.parametrize("cfg", ["mxfp8", "block32x32", "fp8_rowwise"])
def test_routes_equal_the_op(kind, cfg):
    torch.manual_seed(1)
    w0 = torch.randn(48, 64)
    b0 = torch.randn(48)
    pw = nn.Parameter(LowpWeight(w0.clone(), cfg))
    pd = nn.Parameter(w0.clone())
    x0 = torch.randn(2, 40, 64) if kind in ("matmul3d", "matmul_op") else torch.randn(40, 64)
    xw = x0.clone().requires_grad_()
    xd = x0.clone().requires_grad_()
    if kind == "linear":
        yw, yd = F.linear(xw, pw), lt.linear(xd, pd, None, cfg)
    elif kind == "linear_bias":
        bw, bd = nn.Parameter(b0.clone()), nn.Parameter(b0.clone())
        yw, yd = F.linear(xw, pw, bw), lt.linear(xd, pd, bd, cfg)
    elif kind == "matmul3d":
        yw = torch.matmul(xw, pw.t())
        yd = lt.mm(xd.reshape(-1, 64), pd.t(), cfg).reshape(2, 40, 48)
    elif kind == "matmul_op":
        yw = xw @ pw.t()
        yd = lt.mm(xd.reshape(-1, 64), pd.t(), cfg).reshape(2, 40, 48)
    elif kind == "mm_t":
        yw, yd = torch.mm(xw, pw.t()), lt.mm(xd, pd.t(), cfg)
    elif kind == "mm_left":  # W @ xᵀ: the weight stays the quantized operand
        yw = torch.mm(pw, xw.t())
        yd = lt.mm(xd, pd.t(), cfg).t()
    elif kind == "addmm":
        bw, bd = nn.Parameter(b0.clone()), nn.Parameter(b0.clone())
        yw = torch.addmm(bw, xw, pw.t())
        yd = lt.mm(xd, pd.t(), cfg) + bd
    assert type(yw) is torch.Tensor
    assert same(yw, yd)
    g = torch.randn_like(yd)
    yw.backward(g)
    yd.backward(g)
    assert same(xw.grad, xd.grad)
    assert type(pw.grad) is torch.Tensor and same(pw.grad, pd.grad)


@pytest.mark.parametrize("offs_kw", [True, False])
def test_grouped_mm_and_bmm_and_expert_slices(offs_kw):
    torch.manual_seed(2)
    cfg = "mxfp8"
    w0 = torch.randn(3, 64, 32)  # [G, N, K] as torchtitan's experts
    pw = nn.Parameter(LowpWeight(w0.clone(), cfg))
    pd = nn.Parameter(w0.clone())
    offs = torch.tensor([5, 5, 40], dtype=torch.int32)  # an empty group
    x0 = torch.randn(40, 32)
    xw, xd = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    if offs_kw:
        yw = torch._grouped_mm(xw, pw.transpose(-2, -1), offs=offs)
    else:
        yw = torch._grouped_mm(xw, pw.transpose(-2, -1), offs)
    yd = lt.grouped_mm(xd, pd.transpose(-2, -1), offs, cfg)
    assert same(yw, yd)
    g = torch.randn_like(yd)
    yw.backward(g)
    yd.backward(g)
    assert same(xw.grad, xd.grad) and same(pw.grad, pd.grad)
    # bmm: B equal groups
    xb = torch.randn(3, 8, 32)
    yb = torch.bmm(xb, pw.transpose(-2, -1))
    ref = lt.grouped_mm(xb.reshape(24, 32), pd.detach().transpose(-2, -1),
                        torch.tensor([8, 16, 24], dtype=torch.int32), cfg).reshape(3, 8, 64)
    assert same(yb, ref)
    # one expert sliced out of the 3-D parameter is still wrapped
    e1 = pw[1]
    assert isinstance(e1, LowpWeight) and e1.cache is pw.cache
    assert same(F.linear(x0, e1), lt.linear(x0, pd.detach()[1], None, cfg))


def test_dispatch_keeps_wrapper_only_on_weight_ops():
    w = LowpWeight(torch.randn(4, 6, 8), "mxfp8")
    kept = [w.detach(), w.clone(), w.view(4, 48), w.as_strided((2, 2), (1, 1)), w[1:3], w[0],
            w[[0, 2]], w.unsqueeze(0), w.unsqueeze(0).squeeze(0), w.permute(2, 0, 1),
            w.transpose(0, 1), w[0].t(), torch.empty_like(w), w.new_zeros(3),
            w.to(torch.bfloat16)] + list(w.split(2))
    assert all(isinstance(t, LowpWeight) for t in kept)
    plain = [w * 2, w + 1, w.sum(), torch.exp(w), w.abs(), w.norm(), w > 0, w.float() + w]
    assert all(type(t) is torch.Tensor for t in plain)
    master = w.master
    v = master._version
    w.zero_()
    w.fill_(3.0)
    assert (master == 3).all() and master._version > v
    src = torch.randn(4, 6, 8)
    assert w.copy_(src) is w and torch.equal(master, src)
    # views share the cache, copies own one
    assert w[0].cache is w.cache and w.clone().cache is not w.cache


@pytest.mark.parametrize("foreach", [True, False])
def test_adamw_clipping_match_the_plain_op_model(foreach):
    """A prepared model trained with AdamW (foreach or plain) and gradient clipping gives
    exactly the parameters of a plain model that calls lowp.torch.linear itself."""

    class Ref(nn.Module):
        def __init__(self, src):
            super().__init__()
            self.l0, self.l2 = copy.deepcopy(src[0]), copy.deepcopy(src[2])

        def forward(self, x):
            h = F.gelu(lt.linear(x, self.l0.weight, self.l0.bias, "mxfp8"))
            return lt.linear(h, self.l2.weight, self.l2.bias, "mxfp8")

    ref = Ref(mlp())
    m = mlp()
    quantize_(m, ParamSwapConfig(weight_config="mxfp8"))
    o1 = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=foreach)
    o2 = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=foreach)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        x = torch.randn(32, 64, generator=g)
        for mod, opt in ((m, o1), (ref, o2)):
            mod(x).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(mod.parameters(), 0.05)
            opt.step()
            opt.zero_grad()
    assert isinstance(m[0].weight, LowpWeight)
    assert same(m[0].weight.master, ref.l0.weight) and same(m[2].weight.master, ref.l2.weight)
    assert same(m[0].bias, ref.l0.bias)
    assert type(o1.state[m[0].weight]["exp_avg"]) is torch.Tensor


def test_model_to_dtype_and_requires_grad():
    m = mlp()
    quantize_(m, ParamSwapConfig(weight_config="mxfp8"))
    m.to(torch.bfloat16)
    w = m[0].weight
    assert isinstance(w, LowpWeight) and isinstance(w, nn.Parameter)
    assert w.dtype == torch.bfloat16 and w.master.dtype == torch.bfloat16
    y = m(torch.randn(4, 64, dtype=torch.bfloat16))
    y.float().sum().backward()
    assert w.grad is not None and w.grad.dtype == torch.bfloat16
    m.float()
    assert m[0].weight.master.dtype == torch.float32
    m.zero_grad(set_to_none=True)
    m[0].weight.requires_grad_(False)
    assert not m[0].weight.requires_grad
    m(torch.randn(4, 64)).sum().backward()
    assert m[0].weight.grad is None and m[2].weight.grad is not None
    quantize_(m, ParamSwapConfig(step="convert"))
    assert not m[0].weight.requires_grad and m[2].weight.requires_grad


def test_state_dict_save_load_weights_only():
    m = mlp()
    quantize_(m, ParamSwapConfig(weight_config="mxfp8"))
    with torch.no_grad():
        m[0].weight.mul_(1.5)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    assert type(sd["0.weight"]) is torch.Tensor
    # into a prepared model: the master weight takes the values and the wrapper stays
    m2 = mlp(seed=5)
    quantize_(m2, ParamSwapConfig(weight_config="mxfp8"))
    v = m2[0].weight.master._version
    m2.load_state_dict(sd)
    assert isinstance(m2[0].weight, LowpWeight) and same(m2[0].weight.master, m[0].weight.master)
    assert m2[0].weight.master._version > v
    x = torch.randn(8, 64)
    assert same(m2(x), m(x))
    # into a plain model
    p = mlp(seed=6)
    p.load_state_dict(sd)
    assert same(p[0].weight, m[0].weight.master)


def _train(m, opt, x, steps):
    for _ in range(steps):
        m(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def _continue_alike(m, opt, m2, x):
    """Two more steps of m (with its optimizer) and of m2 (a new SGD like it): same bits."""
    opt2 = torch.optim.SGD(m2.parameters(), lr=0.05)
    _train(m, opt, x, 2)
    _train(m2, opt2, x, 2)
    sd, sd2 = m.state_dict(), m2.state_dict()
    assert sd.keys() == sd2.keys() and all(same(sd[k], sd2[k]) for k in sd)


def _pickled(m):
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("cfg", ["mxfp8", "fp8_delayed"])
@pytest.mark.parametrize("how", ["torch.save", "deepcopy"])
def test_whole_module_pickle_and_deepcopy_continue_training(cfg, how):
    """torch.save(model) / torch.load and copy.deepcopy(model) give a prepared model (wrapped
    parameters, each delayed-scaling module with one state of its own, shared by its weights)
    that trains on bit for bit as the original does, also when the copy is taken between an
    optimizer step and the forward that runs the delayed update it owes."""
    config = lt.Float8TensorwiseConfig(delayed=True) if cfg == "fp8_delayed" else cfg
    m = mlp()
    quantize_(m, ParamSwapConfig(weight_config=config))
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    x = torch.randn(16, 64)
    _train(m, opt, x, 3)  # ends with a step: a delayed update is owed
    m2 = _pickled(m) if how == "torch.save" else copy.deepcopy(m)
    for i in (0, 2):
        w, w2 = m[i].weight, m2[i].weight
        assert isinstance(w2, LowpWeight) and isinstance(w2, nn.Parameter) and w2.requires_grad
        assert same(w2.master, w.master) and w2.config == w.config
        assert w2.cache is not w.cache
        if cfg == "fp8_delayed":
            st = m2[i]._lowp_fp8_state
            assert w2.fp8_state is st and st is not w.fp8_state
            assert w2._token in st._tracked
        else:
            assert w2.fp8_state is None
    _continue_alike(m, opt, m2, x)
    # and the copy taken after a forward (no update owed) too
    m(x).square().mean().backward()
    m3 = _pickled(m) if how == "torch.save" else copy.deepcopy(m)
    opt.zero_grad()  # gradients are not copied: start both without
    _continue_alike(m, opt, m3, x)


def test_delayed_state_dict_resume_bit_identical():
    """A state dict saved after an optimizer step (amaxes staged, an update owed) and loaded
    into a freshly prepared model: training goes on bit for bit as the uninterrupted run, whose
    next forward runs that update. Loaded before any training (nothing staged), nothing is
    owed."""
    def prepared(seed):
        m = mlp(seed)
        quantize_(m, ParamSwapConfig(weight_config=lt.Float8TensorwiseConfig(delayed=True)))
        return m

    m = prepared(0)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    x = torch.randn(16, 64)
    fresh = prepared(1)
    fresh.load_state_dict(prepared(0).state_dict())
    assert not fresh[0]._lowp_fp8_state._pending
    _train(m, opt, x, 3)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    m2 = prepared(5)
    m2.load_state_dict(torch.load(buf, weights_only=True))
    assert m2[0]._lowp_fp8_state._pending
    _continue_alike(m, opt, m2, x)


def test_delayed_state_pickle_drops_the_group():
    """A process group does not pickle: the unpickled state uses the default group (None)."""
    st = lt.DelayedScalingState()
    st.group = object()  # stands for a ProcessGroup
    st2 = copy.deepcopy(st)
    assert st2.group is None and st.group is not None
    assert torch.equal(st2.amax_history, st.amax_history) and not st2._pending


# ---- point 4: quantized once per optimizer step ----


def test_quantized_once_per_microbatch():
    m = mlp()
    quantize_(m, ParamSwapConfig(weight_config="mxfp8"))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    c = m[0].weight.cache
    steps, micro = 3, 4
    for _ in range(steps):
        for _ in range(micro):
            m(torch.randn(16, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    # each micro-batch's forward quantizes afresh (a forward never reuses: no version counter
    # sees a write through `.data` or numpy between two forwards); its backward reads the
    # copies its own forward made
    assert c.quantizations == steps * micro
    assert c.hits == 0


# ---- point 5: convert ----


def test_convert_bit_identical():
    m = mlp()
    quantize_(m, ParamSwapConfig(weight_config="mxfp8"))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for _ in range(3):
        m(torch.randn(8, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    masters = {n: p.master.clone() for n, p in lt.wrapped_parameters(m)}
    quantize_(m, ParamSwapConfig(weight_config=MXQuantizeConfig(), step="convert"))
    assert lt.wrapped_parameters(m) == []
    for n, w in masters.items():
        p = m.get_parameter(n)
        assert type(p) is nn.Parameter and same(p, w) and p.requires_grad
    x = torch.randn(4, 64)
    assert type(m(x)) is torch.Tensor


def test_convert_moe_experts_with_root_filter():
    model = moe_ex.TinyMoE(n_layers=1)
    lt.apply_recipe(model, "mix")
    w = model.layers[0].moe.experts.w1.master.clone()
    quantize_(model, ParamSwapConfig(step="convert"), filter_fn=param_swap_filter)
    assert lt.wrapped_parameters(model) == []
    assert same(model.layers[0].moe.experts.w1, w)


# ---- point 6: recipes ----


def test_recipes_follow_torchtitan_names():
    def plan(name, rules=None):
        return {k: type(v).__name__
                for k, v in lt.plan_recipe(moe_ex.TinyMoE(n_layers=1), name, rules).items()}

    p = plan("mix")
    assert p["layers.0.attention.wq.weight"] == "MXQuantizeConfig"
    assert p["layers.0.moe.shared_experts.w2.weight"] == "MXQuantizeConfig"
    assert p["layers.0.moe.experts.w1"] == "BlockQuantizeConfig"
    for hp in ("layers.0.moe.router.gate.weight", "output.weight", "tok_embeddings.weight",
               "norm.weight", "layers.0.attention_norm.weight"):
        assert hp not in p
    assert set(plan("all_mxfp8").values()) == {"MXQuantizeConfig"}
    assert set(plan("all_block_fp8").values()) == {"BlockQuantizeConfig"}
    assert set(plan("block128").values()) == {"Block128Config"}
    assert set(plan("fp8_rowwise").values()) == {"Float8RowwiseConfig"}
    assert set(plan("fp8_delayed").values()) == {"Float8TensorwiseConfig"}
    assert plan("bf16") == {}
    fp4 = lt.plan_recipe(moe_ex.TinyMoE(n_layers=1), "mix_fp4")
    assert fp4["layers.0.moe.experts.w2"].mxfp4_fake_quantize_config is not None
    assert len(plan("mix")) == 10
    # rules first, first match wins
    r = plan("mix", rules=[("layers.0.attention.wo.*", None), ("*.attention.*", "block128"),
                           ("*.attention.*", "mxfp4")])
    assert "layers.0.attention.wo.weight" not in r
    assert lt.plan_recipe(moe_ex.TinyMoE(n_layers=1), "mix", [("*.attention.*", "block128")])[
        "layers.0.attention.wq.weight"] == "block128"
    with pytest.raises(ValueError, match="name"):
        plan("fp3")
    with pytest.raises(TypeError, match="rules"):
        plan("mix", rules=["*"])


def test_apply_recipe_wraps_prints_and_returns(capsys):
    model = moe_ex.TinyMoE(n_layers=1)
    out = lt.apply_recipe(model, "mix", verbose=True)
    cap = capsys.readouterr()
    text = cap.err  # the library never prints to stdout
    assert cap.out == ""
    assert "layers.0.moe.experts.w1" in text and "BlockQuantizeConfig" in text
    wrapped = dict(lt.wrapped_parameters(model))
    assert set(wrapped) == set(out)
    for fqn, cfg in out.items():
        assert wrapped[fqn].config == lt.resolve_config(cfg)
    x, y = moe_ex.batch(0)
    model(x).sum().backward()
    assert model.layers[0].moe.experts.w1.grad is not None


# ---- point 10: activation checkpointing ----


class CkptNet(nn.Module):
    def __init__(self, use_ckpt):
        super().__init__()
        torch.manual_seed(3)
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)
        self.use_ckpt = use_ckpt

    def block(self, x):
        return self.b(F.gelu(self.a(x)))

    def forward(self, x):
        if self.use_ckpt:
            return checkpoint(self.block, x, use_reentrant=False)
        return self.block(x)


@pytest.mark.parametrize("recipe", ["all_mxfp8", "fp8_delayed"])
def test_checkpoint_reuses_cache_records_once_same_grads(recipe):
    nets = [CkptNet(False), CkptNet(True)]
    for n in nets:
        lt.apply_recipe(n, recipe)
    opts = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(32, 64, generator=g)
        for n, o in zip(nets, opts):
            n(x).pow(2).mean().backward()
        for k in ("a", "b"):
            wa, wb = getattr(nets[0], k).weight, getattr(nets[1], k).weight
            assert same(wa.grad, wb.grad)
            assert same(getattr(nets[0], k).bias.grad, getattr(nets[1], k).bias.grad)
        for o in opts:
            o.step()
            o.zero_grad()
    for k in ("a", "b"):
        ca, cb = getattr(nets[0], k).weight.cache, getattr(nets[1], k).weight.cache
        assert ca.quantizations == cb.quantizations == 3
        assert cb.hits > ca.hits  # the recomputation found the step's copies
    if recipe == "fp8_delayed":
        s0, s1 = nets[0].a._lowp_fp8_state, nets[1].a._lowp_fp8_state
        assert s0.records == s1.records and s1.skipped_records > 0
        assert torch.equal(s0.amax_history, s1.amax_history)


def _clear_caches(model):
    for _, p in lt.wrapped_parameters(model):
        p.cache.clear()


@pytest.mark.parametrize("foreach", [True, False])
def test_no_stale_copies_after_updates(foreach):
    """Views made in the forward (the experts' transposes, slices) and updates through .data or
    the optimizer: a cached copy never outlives an update (clearing every cache changes
    nothing)."""
    torch.manual_seed(0)
    model = moe_ex.TinyMoE(n_layers=1)
    lt.apply_recipe(model, "mix")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=foreach)
    x, _ = moe_ex.batch(0)
    for step in range(3):
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            a = model(x)
            _clear_caches(model)
            b = model(x)
        assert same(a, b), step
    w = model.layers[0].moe.experts.w1
    with torch.no_grad():
        w.data.add_(0.01)  # through .data (a detached view of the wrapper)
        w[1].mul_(0.5)  # through a slice
        a = model(x)
        _clear_caches(model)
        b = model(x)
    assert same(a, b)
