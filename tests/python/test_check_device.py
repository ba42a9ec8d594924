"""check_device (lowp.torch.check_device): the conformance check of device kernels.

- torch's own torch._scaled_mm, the CPU adapter, PASSES (a real third-party kernel);
- torchao's to_mx, registered as an mx32 quantize kernel, FAILS on exactly the cases of
  docs/numerics.md section 10 (scale code 0 blocks, Inf blocks, NaN blocks' element bytes,
  RCEIL of a binary32 amax just above a power of two) and on nothing else, each failing block
  classified from its input's amax alone;
- four deliberately wrong kernels FAIL, each report naming the first failing block (or output
  element): FLOOR under an RCEIL key, a scale applied twice, a dropped NaN, a transposed pair of
  scales;
- the CLI writes JSON and exits 1 on a failure.
"""

import json
import math
import os
import struct
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import lowp.torch as lt  # noqa: E402
from lowp.torch.adapters import npu  # noqa: E402
from lowp.torch.ops import library as L  # noqa: E402
from lowp.torch.ops import portable as P  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def f32(bits_hex):
    return struct.unpack("<f", struct.pack("<I", int(bits_hex, 16)))[0]


def golden(op):
    return L._OPS[op][3] if L.native_available() else L._OPS[op][2]


@pytest.fixture
def register():
    names = []

    def reg(op, fn, supports, name):
        lt.register_kernel("cpu", op, fn, name=name, supports=supports)
        names.append(name)
        return name

    yield reg
    for n in names:
        lt.unregister_kernel(n)


def test_cpu_scaled_mm_passes():
    rep = lt.check_device("cpu", kernels=["torch.scaled_mm"])
    assert rep.passed, str(rep)
    keys = {r.key for r in rep.results}
    assert any("scaling=tensor" in k for k in keys) and any("scaling=row" in k for k in keys)
    assert all(r.metrics["rel_err"] <= 1e-5 for r in rep.results)


# ---- torchao's to_mx ----

ao = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
DT = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.float4_e2m1fn_x2}
MODES = {"floor": "FLOOR", "ceil": "CEIL", "even": "EVEN", "rceil": "RCEIL"}


def to_mx_kernel(x, format, scaling, scale_mode, pow2, eps, axis, offs=None, scale=None):
    """torchao's to_mx as a rowwise mx32 quantize kernel (columns zero-padded to 32: a zero
    never changes a block's amax)."""
    R, C = x.shape
    xp = torch.nn.functional.pad(x, (0, -C % 32))
    s, d = ao.to_mx(xp, DT[format], 32, getattr(ao.ScaleCalculationMode, MODES[scale_mode]))
    d = d.view(torch.uint8)[:, : (C + 1) // 2 if format == "e2m1" else C].contiguous()
    e = torch.empty(0, dtype=torch.uint8)
    return d, s.view(torch.uint8).reshape(R, -1).contiguous(), e, e


def to_mx_supports(key):
    return (key.op == "quantize" and key.scaling == "mx32" and key.axis == "row"
            and not key.grouped and not key.stacked)


def classify(amax, fmt, mode, dtype):
    """Which section 10 case a block of this amax is (None: an ordinary block)."""
    fmax = P.FORMATS[fmt].fmax
    if math.isnan(amax):
        return "nan block"
    if math.isinf(amax):
        return "inf block"
    if 0 < amax < fmax * 2.0 ** -126:
        return "scale code 0"
    d = struct.unpack("<I", struct.pack("<f", amax * (1.0 / fmax)))[0]
    if mode == "rceil" and dtype == "float32" and 0 < (d & 0x7FFFFF) < 16:
        return "rceil just above 2^k"
    return None


def test_to_mx_fails_exactly_on_the_section_10_cases(register):
    register("quantize", to_mx_kernel, to_mx_supports, "test.torchao.to_mx")
    rep = lt.check_device("cpu", kernels=["test.torchao.to_mx"], suite="edge")
    seen = set()
    for r in rep.results:
        if r.passed:
            continue
        assert r.data.startswith("edge"), r.line()  # Gaussian blocks are all identical
        key = dict(kv.split("=") for kv in r.key[len("quantize("):-1].split(", "))
        for b in r.first_failure["bad_blocks"]:
            case = classify(f32(b["amax_bits"]), key["format"], key["scale_mode"], key["dtype"])
            assert case is not None, (r.line(), b)
            seen.add(case)
    assert seen == {"nan block", "inf block", "scale code 0", "rceil just above 2^k"}
    assert sum(r.passed for r in rep.results) > len(rep.results) // 2


# ---- four wrong kernels ----


def floor_under_rceil(x, format, scaling, scale_mode, *rest):
    return golden("quantize")(x, format, scaling, "floor", *rest)


def scale_twice(data, scale, format, scaling, rows, cols, offs=None):
    y = golden("dequantize")(data, scale, format, scaling, rows, cols, offs)
    f = torch.pow(2.0, scale.float() - 127).repeat_interleave(32, dim=1)[:, :cols]
    return y * f


def dropped_nan(*args):
    d, s, dc, sc = golden("quantize")(*args)
    nan = s == 0xFF
    d = torch.where(nan.repeat_interleave(32, dim=1)[:, : d.shape[1]], 0, d)
    return d, torch.where(nan, 127, s).to(torch.uint8), dc, sc


def swapped_pairs(a, a_scale, a_format, a_scaling, b, b_scale, *rest):
    pairs = npu.to_pairs(b_scale, False).flip(-1)  # each pair's two scales swapped
    return golden("scaled_mm")(a, a_scale, a_format, a_scaling, b,
                               npu.from_pairs(pairs, b_scale.shape[1], False), *rest)


def mx_key(op, **want):
    def supports(key):
        return key.op == op and key.scaling == "mx32" and all(
            getattr(key, k) == v for k, v in want.items())
    return supports


@pytest.mark.parametrize("name,op,fn,supports,suite,named", [
    ("floor_under_rceil", "quantize", floor_under_rceil,
     mx_key("quantize", scale_mode="rceil", grouped=False, format="e4m3"), "quick", "block"),
    ("scale_twice", "dequantize", scale_twice, mx_key("dequantize", grouped=False), "quick",
     "block"),
    ("dropped_nan", "quantize", dropped_nan,
     mx_key("quantize", axis="row", grouped=False, format="e4m3"), "edge", "block"),
    ("swapped_pairs", "scaled_mm", swapped_pairs,
     mx_key("scaled_mm", b_scaling="mx32", format="e4m3", b_format="e4m3"), "quick", "output"),
])
def test_wrong_kernel_fails_naming_the_first_block(register, name, op, fn, supports, suite,
                                                   named):
    register(op, fn, supports, "test.wrong." + name)
    rep = lt.check_device("cpu", kernels=["test.wrong." + name], suite=suite)
    assert rep.results and not rep.passed
    first = rep.failures[0].first_failure
    assert named in first, first
    assert "block" in str(rep) or "output" in str(rep)
    if name == "floor_under_rceil":  # FLOOR's code is the RCEIL one or one less
        assert first["scale_golden"] - first["scale_kernel"] in (0, 1)
    if name == "dropped_nan":
        amaxes = [f32(b["amax_bits"]) for r in rep.failures
                  for b in r.first_failure["bad_blocks"]]
        assert not any(map(math.isfinite, amaxes))  # NaN blocks (lowp makes Inf blocks NaN)
        assert any(map(math.isnan, amaxes))
        assert first["scale_golden"] == 0xFF and first["scale_kernel"] == 127
    if name == "swapped_pairs":
        assert rep.failures[0].metrics["rel_err"] > 1e-5


def test_cli_json_and_exit_status(tmp_path, register):
    out = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, "-m", "lowp.torch.check_device", "--device", "cpu",
                        "--kernels", "torch.scaled_mm", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS" in p.stdout and "torch.scaled_mm" in p.stderr  # progress on stderr
    rep = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert rep["passed"] and rep["cases"] == len(rep["results"]) > 0
    p = subprocess.run([sys.executable, "-m", "lowp.torch.check_device", "--device", "cpu",
                        "--kernels", "no.such.kernel"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 2 and "no.such.kernel" in p.stderr
    from lowp.torch.check_device import main
    register("dequantize", scale_twice, mx_key("dequantize", grouped=False), "test.cli.wrong")
    assert main(["--device", "cpu", "--kernels", "test.cli.wrong", "--quiet"]) == 1


def test_nothing_checked_is_not_a_pass(register):
    register("quantize", floor_under_rceil, lambda key: False, "test.serves_nothing")
    rep = lt.check_device("cpu", kernels=["test.serves_nothing"])
    assert not rep.results and not rep.passed and "nothing was checked" in str(rep)


def test_cli_npu_without_torch_npu_says_so():
    from lowp.torch.check_device import main
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        assert main(["--device", "npu", "--quiet"]) == 2
    else:  # pragma: no cover - an Ascend host
        pytest.skip("torch_npu is installed")


def test_bad_arguments():
    with pytest.raises(ValueError, match="suite"):
        lt.check_device("cpu", suite="fast")
    with pytest.raises(ValueError, match="device"):
        lt.check_device("no-such-device")
    with pytest.raises(ValueError, match="kernels"):
        lt.check_device("cpu", kernels=["nope"])


def test_a_gemm_that_drops_nan_fails_with_the_mismatch_counted(register):
    def nan_to_zero(*args):
        return torch.nan_to_num(golden("scaled_mm")(*args), nan=0.0)

    register("scaled_mm", nan_to_zero, mx_key("scaled_mm", format="e4m3", b_format="e4m3",
                                              out_dtype="f32", b_kn=False), "test.wrong.gemm_nan")
    rep = lt.check_device("cpu", kernels=["test.wrong.gemm_nan"], suite="edge")
    bad = rep.failures
    assert bad and all(r.data.startswith("edge") for r in bad)  # Gaussian data has no NaN
    assert all(r.metrics["nan_mismatch"] > 0 for r in bad)
    first = bad[0].first_failure
    assert math.isnan(first["golden"]) and first["kernel"] == 0.0
