"""The device kernel table (lowp.torch.device_kernels): registration and its argument checks,
routing through the dispatcher's trampolines (a table kernel runs only when enabled; on the
CPU lowp's native kernels keep precedence unless the kernel is forced with `only`; a key the
kernel does not support falls back), stats' "device" counter, kernel_preference("portable")
over the table, entry points loaded lazily, and no vendor package imported."""

import sys

import pytest

torch = pytest.importorskip("torch")

import lowp.torch as lt  # noqa: E402
from lowp.torch import device_kernels as DK  # noqa: E402
from lowp.torch.adapters import cuda  # noqa: E402
from lowp.torch.ops import library as L  # noqa: E402

X = torch.randn(16, 64)
W = torch.randn(24, 64)


def q(x, scaling="row"):
    d, s, _, _ = torch.ops.lowp.quantize(x, "e4m3", scaling, "", -1, 0.0, "row")
    return d, s


def mm(scaling="row", out="f32"):
    (a, sa), (b, sb) = q(X, scaling), q(W, scaling)
    return torch.ops.lowp.scaled_mm(a, sa, "e4m3", scaling, b, sb, "e4m3", scaling, 64, out)


@pytest.fixture
def counting():
    """A scaled_mm kernel for the CPU that serves rowwise E4M3 with f32 output: the golden
    kernel plus 1, so the tests see which kernel ran."""
    calls = []
    portable = L._OPS["scaled_mm"][2]

    def fn(*args):
        calls.append(DK.key_of("scaled_mm", args))
        return portable(*args) + 1

    def supports(key):
        return key.scaling == "row" and key.out_dtype == "f32"

    lt.register_kernel("cpu", "scaled_mm", fn, name="test.counting", supports=supports)
    yield calls
    lt.unregister_kernel("test.counting")


def test_table_kernels_run_only_when_enabled_and_forced_on_the_cpu(counting):
    ref = mm()
    assert torch.equal(mm(), ref) and not counting  # not enabled
    with lt.use_device_kernels():  # enabled, not forced
        out = mm()
    if lt.native_available():
        assert torch.equal(out, ref) and not counting  # native keeps precedence
    else:
        assert len(counting) == 1
    counting.clear()
    lt.reset_stats()
    with lt.use_device_kernels(only=["test.counting"]):
        assert torch.allclose(mm(), ref + 1, rtol=1e-5, atol=1e-4)
        assert torch.equal(mm("tensor"), mm("tensor"))  # not supported: falls back
    st = lt.stats()
    assert st["device"] == 1 and st["scaled_mm.device"] == 1 and st["device.test.counting"] == 1
    key = counting[0]
    assert (key.op, key.format, key.scaling, key.b_scaling, key.out_dtype, key.b_kn) == \
        ("scaled_mm", "e4m3", "row", "row", "f32", False)
    assert not DK._STATE["enabled"]  # the with block restored the setting
    counting.clear()
    with lt.use_device_kernels(only=["test.counting"]):
        with lt.kernel_preference("portable"):  # the dispatch mode runs the portable kernel
            mm()
    assert not counting


def test_use_device_kernels_outside_a_with_block(counting):
    lt.use_device_kernels(True, only="test.counting")
    try:
        mm()
        assert len(counting) == 1
    finally:
        lt.use_device_kernels(False)
    mm()
    assert len(counting) == 1


def test_a_device_gets_a_trampoline_and_falls_back_to_portable():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    lt.register_kernel("cuda", "dequantize", lambda *a: None, name="test.cuda.deq",
                       supports=lambda key: False)
    try:
        assert has("lowp::dequantize", "CUDA")
        assert not lt.has_native_kernel("cuda")  # quantize has none; disabled anyway
    finally:
        lt.unregister_kernel("test.cuda.deq")


def test_register_kernel_checks_its_arguments(counting):
    ok = dict(name="test.x", supports=lambda k: True)
    with pytest.raises(ValueError, match="op"):
        lt.register_kernel("cpu", "gemm", print, **ok)
    with pytest.raises(TypeError, match="fn"):
        lt.register_kernel("cpu", "scaled_mm", 3, **ok)
    with pytest.raises(TypeError, match="supports"):
        lt.register_kernel("cpu", "scaled_mm", print, name="test.x", supports=None)
    with pytest.raises(TypeError, match="name"):
        lt.register_kernel("cpu", "scaled_mm", print, name="", supports=print)
    with pytest.raises(ValueError, match="already registered"):
        lt.register_kernel("cpu", "scaled_mm", print, name="test.counting", supports=print)
    with pytest.raises(ValueError, match="device_type"):
        lt.register_kernel("no_such_device", "scaled_mm", print, **ok)
    with pytest.raises(ValueError, match="meta"):
        lt.register_kernel("meta", "scaled_mm", print, **ok)
    with pytest.raises(ValueError, match="only"):
        lt.use_device_kernels(only=["no.such.kernel"])
    with pytest.raises(TypeError, match="enabled"):
        lt.use_device_kernels("yes")
    with pytest.raises(ValueError, match="name"):
        lt.unregister_kernel("no.such.kernel")
    assert "test.x" not in {k.name for k in lt.available_kernels()}


def test_entry_points_load_lazily_once(monkeypatch):
    import importlib.metadata as md
    loaded = []

    class EP:
        def __init__(self, name, fn):
            self.name, self.value, self._fn = name, "pkg:register", fn

        def load(self):
            return self._fn

    def good():
        loaded.append("good")
        lt.register_kernel("cpu", "quantize", print, name="test.plugin", supports=lambda k: 0)

    def broken():
        raise RuntimeError("no device")

    def eps(group=None):
        assert group == "lowp.torch.kernels"
        return [EP("good", good), EP("broken", broken)]

    monkeypatch.setattr(md, "entry_points", eps)
    monkeypatch.setitem(DK._LOADED, "entry_points", False)
    try:
        with pytest.warns(RuntimeWarning, match="broken"):
            names = {k.name for k in lt.available_kernels("cpu")}
        assert "test.plugin" in names and loaded == ["good"]
        lt.available_kernels()
        assert loaded == ["good"]  # once
    finally:
        lt.unregister_kernel("test.plugin")


def test_no_vendor_package_is_imported():
    lt.available_kernels()
    assert "torch_npu" not in sys.modules
    names = {k.name for k in lt.available_kernels()}
    assert "torch.scaled_mm" in names
    if not torch.cuda.is_available():
        assert not any(n.startswith("cuda.") for n in names)


def test_cuda_adapters_are_gated_on_capability():
    names = lambda cap: {n for _, n, _, _ in cuda.kernels(cap)}  # noqa: E731
    assert names((8, 0)) == set()
    assert names((8, 9)) == {"cuda.scaled_mm.tensor_row"}
    assert names((9, 0)) == {"cuda.scaled_mm.tensor_row", "cuda.scaled_mm.block128",
                             "cuda.scaled_grouped_mm.row"}
    assert "cuda.scaled_mm.mx" in names((10, 0)) and "cuda.scaled_mm.block128" not in \
        names((10, 0))


@pytest.mark.parametrize("sr,sc", [(5, 3), (128, 4), (130, 9)])
def test_cublas_scale_layout_equals_the_c_converter(sr, sc):
    import lowp
    x = torch.randn(sr, sc * 32)
    canon = lowp.quantize(x, "e4m3", "mx32").scale
    swz = lowp.quantize(x, "e4m3", "mx32", layout="cublas").scale
    assert torch.equal(cuda.cublas_scales(canon), swz.reshape(-1))


def test_cuda_tensor_row_kernel_with_its_padding_passes_on_the_cpu():
    """The CUDA tensorwise/rowwise kernel's own code (K and N zero-padded to 16, b
    column-major) through the CPU's torch._scaled_mm, on odd shapes (1 x 33, 37 x 70,
    130 x 261): the padding changes no output."""
    lt.register_kernel("cpu", "scaled_mm", cuda._tensor_row, name="test.cuda_code.tensor_row",
                       supports=cuda._tensor_row_supports)
    try:
        rep = lt.check_device("cpu", ["test.cuda_code.tensor_row"], suite="standard")
    finally:
        lt.unregister_kernel("test.cuda_code.tensor_row")
    assert rep.passed and len(rep.results) >= 12, str(rep)
    assert {r.data for r in rep.results} >= {"gaussian 1x33", "gaussian 130x261"}


def test_an_unregistered_builtin_stays_removed():
    lt.available_kernels()
    entry = next(k for k in DK._TABLE if k.name == "torch.scaled_mm")
    lt.unregister_kernel("torch.scaled_mm")
    try:
        assert "torch.scaled_mm" not in {k.name for k in lt.available_kernels()}
    finally:
        lt.register_kernel("cpu", "scaled_mm", entry.fn, name=entry.name,
                           supports=entry.supports)
    assert "torch.scaled_mm" in {k.name for k in lt.available_kernels()}
