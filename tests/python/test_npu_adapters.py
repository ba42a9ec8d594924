"""The Ascend NPU adapters (lowp.torch.adapters.npu) against a stand-in of torch_npu's documented
functions on CPU tensors (npu_standin.py, built on the independent numpy reference), through
check_device: every kernel passes on every key it claims; the edge suite finds exactly the
predicted CANN difference (FLOOR writes zero elements in blocks of scale code 0); the pair
layout conversions equal the C library's (lowp.quantize(layout="npu"))."""

import types

import pytest

torch = pytest.importorskip("torch")

import lowp  # noqa: E402
import lowp.torch as lt  # noqa: E402
from lowp.torch import device_kernels as DK  # noqa: E402
from lowp.torch.adapters import npu  # noqa: E402
from lowp.torch.ops import portable as P  # noqa: E402

import npu_standin as S  # noqa: E402

FUNCS = ("npu_dynamic_mx_quant", "npu_dynamic_mx_quant_with_dual_axis",
         "npu_dynamic_block_mx_quant", "npu_quant_matmul", "npu_grouped_dynamic_mx_quant",
         "npu_grouped_matmul")


@pytest.fixture(scope="module")
def names():
    mod = types.ModuleType("torch_npu_standin")
    for f in FUNCS:
        setattr(mod, f, getattr(S, f))
    out = []
    for op, name, fn, sup in npu.kernels(mod):
        lt.register_kernel("cpu", op, fn, name="standin." + name, supports=sup)
        out.append("standin." + name)
    yield out
    for n in out:
        lt.unregister_kernel(n)


def test_every_npu_kernel_passes_on_every_key_it_claims(names):
    S.calls.clear()
    rep = lt.check_device("cpu", names, suite="standard")
    assert rep.passed, str(rep)
    ran = {r.kernel for r in rep.results}
    assert ran == set(names)  # each kernel served some key
    assert set(S.calls) == set(FUNCS)
    keys = {r.key for r in rep.results}
    assert any("scale_mode=rceil" in k for k in keys) and any("scale_mode=floor" in k
                                                             for k in keys)


def test_edge_suite_finds_exactly_the_floor_code_0_difference(names):
    rep = lt.check_device("cpu", names, suite="edge")
    assert not rep.passed
    for r in rep.failures:
        assert "scale_mode=floor" in r.key and r.op == "quantize", r.line()
        fmax = P.FORMATS[r.key.split("format=")[1].split(",")[0]].fmax
        for b in r.first_failure["bad_blocks"]:
            amax = struct_f32(b["amax_bits"])
            assert amax < fmax * 2.0 ** -126, r.line()  # a block of scale code 0
        assert r.first_failure["scale_golden"] == r.first_failure["scale_kernel"] == 0
        assert r.first_failure["code_kernel"] == 0 != r.first_failure["code_golden"]
    S.floor_zero_code0 = False  # the stand-in without the predicted difference: all pass
    try:
        assert lt.check_device("cpu", names, suite="edge").passed
    finally:
        S.floor_zero_code0 = True


def struct_f32(bits_hex):
    import struct
    return struct.unpack("<f", struct.pack("<I", int(bits_hex, 16)))[0]


@pytest.mark.parametrize("R,C", [(5, 70), (64, 64), (33, 32)])
def test_pair_layout_equals_the_c_converter(R, C):
    x = torch.randn(R, C)
    q = lowp.quantize(x, "e4m3", "mx32", axis="both")
    qn = lowp.quantize(x, "e4m3", "mx32", axis="both", layout="npu")
    assert torch.equal(npu.to_pairs(q.scale, False), qn.scale)
    assert torch.equal(npu.to_pairs(q.scale_col, True), qn.scale_col)
    assert torch.equal(npu.from_pairs(qn.scale, q.scale.shape[1], False), q.scale)
    assert torch.equal(npu.from_pairs(qn.scale_col, q.scale_col.shape[1], True), q.scale_col)


def test_register_needs_torch_npu_imported_by_the_user():
    before = len(DK._TABLE)
    npu.register()  # torch_npu not imported: nothing
    assert len(DK._TABLE) == before
    import sys
    assert "torch_npu" not in sys.modules


def test_grouped_pair_layout_round_trip_with_empty_and_odd_groups():
    offs = [40, 40, 70, 135]  # 2, 0, 1 and 3 blocks of 32 tokens
    canon = torch.randint(1, 255, (5, 6), dtype=torch.uint8)
    pairs = npu.to_grouped_pairs(canon, offs)
    assert pairs.shape == (1 + 0 + 1 + 2, 5, 2)
    assert torch.equal(pairs[1, :, 1], torch.zeros(5, dtype=torch.uint8))  # group 2 padded
    assert torch.equal(pairs[2], canon[:, 3:5])  # group 3's first pair
    back = npu.from_grouped_pairs(pairs, offs, 9)
    assert torch.equal(back[:, :6], canon) and not back[:, 6:].any()


def test_grouped_kernels_ran_split_m_and_split_k(names):
    rep = lt.check_device("cpu", ["standin.npu.grouped_matmul.mx",
                                  "standin.npu.grouped_dynamic_mx_quant"])
    assert rep.passed, str(rep)
    keys = {r.key for r in rep.results}
    assert any("wgrad=True" in k for k in keys) and any("wgrad" not in k and "scaled_grouped"
                                                       in k for k in keys)
    assert any(k.startswith("quantize(") and "grouped=True" in k for k in keys)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_grouped_copy_in_the_npu_layout(dtype):
    """lowp.quantize(layout="npu", offs=...): the grouped copy's scales in the NPU's grouped
    pair layout, equal to the adapter's converter and the stand-in's (two other
    implementations); dequantize and the split-K GEMM read it back unchanged."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(135, 40, generator=g).to(dtype)
    dy = torch.randn(135, 24, generator=g).to(dtype)
    offs = torch.tensor([40, 40, 70, 135], dtype=torch.int32)
    q = lowp.quantize(x, "e4m3", "mx32", axis="col", offs=offs)
    qn = lowp.quantize(x, "e4m3", "mx32", axis="col", offs=offs, layout="npu")
    assert qn.scale_col.shape == (1 + 0 + 1 + 2, 40, 2)
    assert torch.equal(qn.scale_col, npu.to_grouped_pairs(q.scale_col, offs.tolist()))
    assert torch.equal(qn.scale_col, torch.from_numpy(S._grouped_pairs(q.scale_col.numpy(),
                                                                       offs.tolist())))
    assert torch.equal(qn.data_col, q.data_col)
    assert torch.equal(lowp.dequantize(qn, "col"), lowp.dequantize(q, "col"))
    qd = lowp.quantize(dy, "e4m3", "mx32", axis="col", offs=offs)
    qdn = lowp.quantize(dy, "e4m3", "mx32", axis="col", offs=offs, layout="npu")
    assert torch.equal(lowp.grouped_gemm(qdn, qn, offs), lowp.grouped_gemm(qd, q, offs))
    with pytest.raises(ValueError, match="cublas"):
        lowp.quantize(x, "e4m3", "mx32", axis="col", offs=offs, layout="cublas")
