"""torch.library.opcheck on every lowp:: operator: the schema, the autograd registration, the
fake kernel against the real one, and AOT dispatch with dynamic shapes, on CPU tensors (the
native kernels where the extension is built, else the portable ones) and under
kernel_preference("portable")."""

import pytest
import torch

import lowp.torch as lt

g = torch.Generator().manual_seed(3)
X = torch.randn(40, 96, generator=g)
W = torch.randn(3, 24, 96, generator=g)
OFFS = torch.tensor([10, 10, 37], dtype=torch.int32)


def _q(x, fmt="e4m3", scaling="mx32", axis="row", offs=None, scale=None):
    return torch.ops.lowp.quantize(x, fmt, scaling, "", -1, 0.0, axis, offs, scale)


def _cases():
    ad, asc, _, _ = _q(X)
    bd, bsc, _, _ = _q(W[0])
    wd, wsc, _, _ = _q(W)
    td, tsc, _, _ = _q(W[0], scaling="tensor")
    _, _, gd, gsc = _q(X[:37], axis="col", offs=OFFS)
    _, _, yd, ysc = _q(torch.randn(37, 24, generator=g), axis="col", offs=OFFS)
    xt, xts, _, _ = _q(X, scaling="tensor")
    nd, nsc, _, _ = _q(X, "e2m1", "nv16")  # NVFP4 (issue 38)
    nkd, nksc, _, _ = _q(X[:, :24].contiguous(), "e2m1", "nv16")
    nod, nosc, _, _ = _q(W[0, :, :33].contiguous(), "e2m1", "nv16x16")  # stored [24, N=33]
    nwd, nwsc, _, _ = _q(W, "e2m1", "nv16x16", "both")
    _, _, ngd, ngsc = _q(X[:37], "e2m1", "nv16", "col", OFFS)
    _, _, nyd, nysc = _q(torch.randn(37, 24, generator=g), "e2m1", "nv16", "col", OFFS)
    nvfp4 = {
        "quantize nv16 both": (torch.ops.lowp.quantize.default,
                               (X, "e2m1", "nv16", "", -1, 0.0, "both")),
        "quantize stacked nv16x16": (torch.ops.lowp.quantize.default,
                                     (W, "e2m1", "nv16x16", "", -1, 0.0, "both")),
        "quantize grouped nv16": (torch.ops.lowp.quantize.default,
                                  (X, "e2m1", "nv16", "", -1, 0.0, "col", OFFS)),
        "dequantize grouped nv16": (torch.ops.lowp.dequantize.default,
                                    (ngd, ngsc, "e2m1", "nv16", 96, 37, OFFS)),
        "scaled_mm nv16 x nv16x16": (torch.ops.lowp.scaled_mm.default,
                                     (nd, nsc, "e2m1", "nv16", nwd[0], nwsc[0], "e2m1",
                                      "nv16x16", 96)),
        "scaled_mm nv16x16 kn": (torch.ops.lowp.scaled_mm.default,
                                 (nkd, nksc, "e2m1", "nv16", nwd[0], nwsc[0], "e2m1", "nv16x16",
                                  24, "f32", True)),
        "scaled_mm nv16x16 kn odd n": (torch.ops.lowp.scaled_mm.default,
                                       (nkd, nksc, "e2m1", "nv16", nod, nosc, "e2m1", "nv16x16",
                                        24, "f32", True, 33)),
        "scaled_grouped_mm nv split-M": (torch.ops.lowp.scaled_grouped_mm.default,
                                         (nd, nsc, "e2m1", "nv16", nwd, nwsc, "e2m1",
                                          "nv16x16", OFFS, 96, False)),
        "scaled_grouped_mm nv split-K": (torch.ops.lowp.scaled_grouped_mm.default,
                                         (nyd, nysc, "e2m1", "nv16", ngd, ngsc, "e2m1", "nv16",
                                          OFFS, 37, True)),
    }
    return nvfp4 | {
        "quantize mx32 both": (torch.ops.lowp.quantize.default,
                               (X, "e4m3", "mx32", "", -1, 0.0, "both")),
        "quantize e2m1 row": (torch.ops.lowp.quantize.default,
                              (X, "e2m1", "mx32", "even", -1, 0.0, "row")),
        "quantize tensor delayed": (torch.ops.lowp.quantize.default,
                                    (X, "e5m2", "tensor", "", 1, 0.0, "both", None,
                                     torch.tensor(4.0))),
        "quantize grouped": (torch.ops.lowp.quantize.default,
                             (X, "e4m3", "block128", "", -1, 0.0, "col", OFFS)),
        "quantize stacked block32x32": (torch.ops.lowp.quantize.default,
                                        (W, "e4m3", "block32x32", "", -1, 0.0, "both")),
        "dequantize": (torch.ops.lowp.dequantize.default, (ad, asc, "e4m3", "mx32", 40, 96)),
        "dequantize grouped": (torch.ops.lowp.dequantize.default,
                               (gd, gsc, "e4m3", "mx32", 96, 37, OFFS)),
        "scaled_mm mx": (torch.ops.lowp.scaled_mm.default,
                         (ad, asc, "e4m3", "mx32", bd, bsc, "e4m3", "mx32", 96)),
        "scaled_mm kn bf16 out": (torch.ops.lowp.scaled_mm.default,
                                  (xt, xts, "e4m3", "tensor", td.t().contiguous(), tsc, "e4m3",
                                   "tensor", 96, "bf16", True)),
        "scaled_mm plain": (torch.ops.lowp.scaled_mm.default,
                            (X.bfloat16(), lt.ops.layout.empty("cpu"), "bf16", "none",
                             W[0].bfloat16(), lt.ops.layout.empty("cpu"), "bf16", "none", 96)),
        "scaled_grouped_mm split-M": (torch.ops.lowp.scaled_grouped_mm.default,
                                      (ad, asc, "e4m3", "mx32", wd, wsc, "e4m3", "mx32", OFFS,
                                       96, False)),
        "scaled_grouped_mm split-K": (torch.ops.lowp.scaled_grouped_mm.default,
                                      (yd, ysc, "e4m3", "mx32", gd, gsc, "e4m3", "mx32", OFFS,
                                       37, True)),
        "delayed_update": (torch.ops.lowp.delayed_update.default,
                           (torch.rand(3, 5, generator=g) * 9, torch.ones(3),
                            ["e4m3", "e4m3", "e5m2"], 1.0, "max")),
    }


CASES = _cases()


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("pref", ["auto", "portable"])
def test_opcheck(name, pref):
    op, args = CASES[name]
    with lt.kernel_preference(pref):
        torch.library.opcheck(op, args)


def test_every_op_is_checked():
    ops = {op.default for op in (torch.ops.lowp.quantize, torch.ops.lowp.dequantize,
                                 torch.ops.lowp.scaled_mm, torch.ops.lowp.scaled_grouped_mm,
                                 torch.ops.lowp.delayed_update)}
    assert ops == {op for op, _ in CASES.values()}


def test_cpu_kernel_is_the_native_one_and_others_default_to_portable():
    """The dispatcher, not Python, picks the kernel: CPU has its own kernel when the
    extension is built; meta has only the fake one; every other key falls back to the
    portable CompositeExplicitAutograd kernel."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in ("quantize", "dequantize", "scaled_mm", "scaled_grouped_mm", "delayed_update"):
        assert has(f"lowp::{name}", "CompositeExplicitAutograd")
        assert has(f"lowp::{name}", "CPU") == lt.native_available()
    assert lt.has_native_kernel("cpu") == lt.native_available()
    lt.reset_stats()
    _q(X)
    with lt.kernel_preference("portable"):
        _q(X)
    s = lt.stats()
    assert s["quantize.portable"] == 1
    assert s["quantize.native" if lt.native_available() else "quantize.portable"] >= 1


def test_native_preference_needs_native_kernels():
    with pytest.raises(ValueError, match="kernel preference"):
        with lt.kernel_preference("fastest"):
            pass
    with pytest.raises(ValueError, match="meta has no native lowp kernels"):
        with lt.kernel_preference(lt.KernelPreference.NATIVE, device="meta"):
            pass


def test_portable_overloads():
    """Each op has a .portable overload: the portable kernel on any device (what a config's
    KernelPreference.PORTABLE calls), checked by opcheck too."""
    for name in ("quantize", "dequantize", "scaled_mm", "scaled_grouped_mm", "delayed_update"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"lowp::{name}.portable",
                                                               "CompositeExplicitAutograd")
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"lowp::{name}.portable",
                                                                   "CPU")
    op, args = CASES["scaled_mm mx"]
    torch.library.opcheck(torch.ops.lowp.scaled_mm.portable, args)


@pytest.mark.parametrize("pref", ["auto", "portable"])
def test_kernel_preference_holds_under_compile(pref):
    """A config's kernel preference gives the same forward and backward eagerly and under
    torch.compile(fullgraph=True), running the kernels it names in both."""
    torch.manual_seed(0)
    x = torch.randn(64, 96, requires_grad=True)
    w = torch.randn(48, 96, requires_grad=True)
    cfg = lt.MXQuantizeConfig(kernel_preference=pref)

    def run(f):
        lt.reset_stats()
        y = f(x, w)
        y.sum().backward()
        out = (y.detach(), x.grad, w.grad, lt.stats())
        x.grad = w.grad = None
        return out

    def f(a, b):
        return lt.linear(a, b, config=cfg)

    eager = run(f)
    torch._dynamo.reset()
    compiled = run(torch.compile(f, fullgraph=True, backend="aot_eager"))
    for e, c in zip(eager[:3], compiled[:3]):
        assert torch.equal(e, c)
    for s in (eager[3], compiled[3]):
        if pref == "portable":
            assert s["portable"] > 0 and s["native"] == 0
        elif lt.native_available():
            assert s["native"] > 0 and s["portable"] == 0
