"""lowp.rules: the C library's tables as the package reads them (issue 36.5).

The extension's tables and the committed python/lowp/_tables.py agree (the ctest tables_drift
checks the text too); the file is what lowp.rules falls back to without the extension; the
values agree with independent references (ml_dtypes' and torch's format limits, scale.h's
layout table and gemm.h's pairs, written out here by hand); and the names the portable path
and the recipes export are the ones they had when Python wrote its own tables."""

import sys

import ml_dtypes
import numpy as np
import pytest
import torch

import lowp
from lowp import rules


def test_extension_and_generated_file_agree():
    ext, src = rules.load()
    assert src == "extension" and rules.SOURCE == "extension"
    from lowp._tables import TABLES
    assert ext == TABLES
    assert list(ext["recipes"]) == list(TABLES["recipes"])  # order too


def test_without_the_extension_the_generated_file_serves(monkeypatch):
    monkeypatch.setitem(sys.modules, "lowp._numpy_api", None)  # import fails
    tables, src = rules.load()
    assert src == "_tables" and tables == rules.TABLES


@pytest.mark.parametrize("name,ref", [("e4m3", ml_dtypes.float8_e4m3fn),
                                      ("e5m2", ml_dtypes.float8_e5m2),
                                      ("e2m1", ml_dtypes.float4_e2m1fn),
                                      ("bf16", ml_dtypes.bfloat16), ("f16", np.float16),
                                      ("f32", np.float32)])
def test_formats_match_ml_dtypes(name, ref):
    f, fi = rules.TABLES["formats"][name], ml_dtypes.finfo(ref)
    assert f["fmax"] == float(fi.max)
    assert f["mbits"] == fi.nmant and f["bits"] == fi.bits
    assert f["min_normal"] == float(fi.smallest_normal)
    assert f["min_subnormal"] == float(fi.smallest_subnormal)
    assert f["emax"] == fi.maxexp - 1
    assert f["has_inf"] == bool(np.isinf(np.array(np.inf, dtype=np.float32).astype(ref)))


def test_e4m3_matches_torch():
    fi = torch.finfo(torch.float8_e4m3fn)
    assert rules.TABLES["formats"]["e4m3"]["fmax"] == fi.max
    code = torch.tensor([fi.max]).to(torch.float8_e4m3fn).view(torch.uint8).item()
    assert rules.TABLES["formats"]["e4m3"]["max_code"] == code


# scale.h's layout table: block (rows, cols), scale type; grouped copies for MX32, BLOCK128 and
# NV16; lowp_gemm_kn's kinds; RCEIL for MX32, FLOOR for 32x32; pow2 on for ROW; a binary32 tensor
# scale after the E4M3 block scales for the NVFP4 kinds.
SCALE_H = {
    "tensor": (0, 0, "f32", False, True, None, False, False),
    "row": (1, 0, "f32", False, False, None, True, False),
    "mx32": (1, 32, "e8m0", True, False, "rceil", False, False),
    "block128": (1, 128, "f32", True, False, None, False, False),
    "block128x128": (128, 128, "f32", False, True, None, False, False),
    "block32x32": (32, 32, "e8m0", False, True, "floor", False, False),
    "none": (0, 0, None, False, True, None, False, False),
    "nv16": (1, 16, "e4m3", True, False, None, False, True),
    "nv16x16": (16, 16, "e4m3", False, True, None, False, True),
}


def test_scalings_are_scale_h():
    got = {n: (s["block_rows"], s["block_cols"], s["scale"], s["grouped"], s["transposes"],
               s["default_mode"], s["default_pow2"], s["tensor_scale"])
           for n, s in rules.TABLES["scalings"].items()}
    assert got == SCALE_H
    assert rules.names("scalings") == tuple(SCALE_H)
    assert rules.names("scale_modes") == ("default", "rceil", "floor", "ceil", "even")


@pytest.mark.parametrize("kind", ["tensor", "row", "mx32", "block128", "block128x128",
                                  "block32x32"])
def test_scale_shapes_of_the_kernels_follow_the_blocks(kind):
    br, bc, scale = SCALE_H[kind][:3]
    q = lowp.quantize(np.ones((256, 320), np.float32), "e4m3", kind)
    want = (256 // br if br else 1, -(-320 // bc) if bc else 1)
    assert q.scale.reshape(want).shape == want and q.scale.size == want[0] * want[1]
    assert q.scale.dtype == (np.uint8 if scale == "e8m0" else np.float32)


def test_gemm_pairs_are_gemm_h():
    fp8 = ("e4m3", "e5m2")
    want = {("f32", "none", "f32", "none"), ("bf16", "none", "bf16", "none")}
    for a in fp8:
        for b in fp8:
            want |= {(a, k, b, k) for k in ("tensor", "row", "mx32", "block128")}
            want |= {(a, "block128", b, "block128x128"), (a, "mx32", b, "block32x32")}
    for x in fp8 + ("e2m1",):
        want |= {("e2m1", "mx32", x, "mx32"), (x, "mx32", "e2m1", "mx32")}
    want |= {("e2m1", "mx32", b, "block32x32") for b in fp8}
    want |= {("e2m1", a, "e2m1", b) for a in ("nv16", "nv16x16") for b in ("nv16", "nv16x16")}
    assert set(rules.TABLES["gemm_pairs"]) == want


def test_portable_names_are_unchanged():
    from lowp.torch.ops import portable as P
    assert {n: (f.bits, f.mbits, f.bias, f.max_code, f.nan_code, f.fmax, f.emax)
            for n, f in P.FORMATS.items()} == {
        "e4m3": (8, 3, 7, 0x7E, 0x7F, 448.0, 8), "e5m2": (8, 2, 15, 0x7B, 0x7E, 57344.0, 15),
        "e2m1": (4, 1, 1, 0x7, 0x0, 6.0, 2)}
    assert list(P.FORMATS) == ["e4m3", "e5m2", "e2m1"]
    assert set(P.E8M0_KINDS) == {"mx32", "block32x32"}
    assert set(P.FP32_KINDS) == {"tensor", "row", "block128", "block128x128"}
    assert set(P.TILE_KINDS) == {"block32x32", "block128x128", "nv16x16"}
    assert set(P.TOKEN_BLOCK_KINDS) == {"mx32", "block128", "nv16"}
    assert set(P.NV_KINDS) == {"nv16", "nv16x16"}
    assert P.SCALINGS == ("tensor", "row", "mx32", "block128", "block128x128", "block32x32",
                          "nv16", "nv16x16")
    assert P.SCALE_MODES == ("rceil", "floor", "ceil", "even")
    assert [P.block_of(k) for k in P.SCALINGS + ("none",)] == [0, 0, 32, 128, 128, 32, 16, 16,
                                                               0]
    assert [P.default_mode(k, None) for k in ("mx32", "block32x32")] == ["rceil", "floor"]
    assert [P.default_pow2(k, None) for k in P.SCALINGS] == [False, True] + [False] * 6


@pytest.mark.parametrize("qi", [False, True])
@pytest.mark.parametrize("qg", [False, True])
@pytest.mark.parametrize("hp", [False, True])
@pytest.mark.parametrize("ws", ["none", "tensor", "row", "mx32", "block128", "block128x128",
                                "block32x32"])
def test_linear_plan(qi, qg, hp, ws):
    """linear.c's plan, written out: a GEMM is quantized when both operands are (the wgrad not
    under wgrad_hp); the dgrad reads W's forward copy when both GEMMs take W alike and a copy
    of W^T would be W's transposed (plain, tensor, 128x128 and 32x32 tiles)."""
    qw = ws != "none"
    p = rules.linear_plan(qi, qg, hp, ws)
    assert [p[g]["quantized"] for g in ("forward", "dgrad", "wgrad")] == \
        [qi and qw, qg and qw, qg and qi and not hp]
    kn = (qi and qw) == (qg and qw) and (not (qg and qw) or
                                         ws in ("tensor", "block128x128", "block32x32"))
    assert p["dgrad"]["b_kn"] == kn and p["dgrad"]["b_columnwise"] == (not kn)
    assert (p["wgrad"]["a"], p["wgrad"]["b"]) == ("grad_output", "input")
    assert p["wgrad"]["a_columnwise"] and p["wgrad"]["b_columnwise"]
    # the autograd linear follows it
    from lowp.torch.config import MatmulSpec, OperandSpec
    from lowp.torch.ops import linear as L
    q = OperandSpec("e4m3", "mx32")
    spec = MatmulSpec(q if qi else OperandSpec(), OperandSpec("e4m3", ws) if qw else OperandSpec(),
                      q if qg else OperandSpec())
    assert L._plan(spec, hp) == (qi and qw, qg and qw, qg and qi and not hp)
    assert L._dgrad_kn(spec, *L._plan(spec, hp)[:2]) == kn


def test_recipes_are_the_c_table():
    import lowp.torch as lt
    assert set(lt.RECIPES) == set(rules.TABLES["recipes"])
    # lowp's own models' names (src/model) and torchtitan's heads: one table for both
    plan = lt.plan_recipe(["head.weight", "embed.weight", "output.weight",
                           "layers.0.moe.shared.w1", "layers.0.moe.experts.w1",
                           "layers.0.attn.wq"], "mix")
    assert plan["head.weight"] is None and plan["embed.weight"] is None
    assert plan["output.weight"] is None
    assert type(plan["layers.0.moe.shared.w1"]).__name__ == "MXQuantizeConfig"
    assert type(plan["layers.0.moe.experts.w1"]).__name__ == "BlockQuantizeConfig"
    assert type(plan["layers.0.attn.wq"]).__name__ == "MXQuantizeConfig"
    cur = lt.plan_recipe(["layers.0.attn.wq"], "fp8_current")["layers.0.attn.wq"]
    assert (type(cur).__name__, cur.delayed) == ("Float8TensorwiseConfig", False)


def test_numpy_api_names_are_unchanged():
    from lowp import _numpy_api as A
    assert lowp.FORMATS == ("e4m3", "e5m2", "e2m1")
    assert lowp.SCALINGS == ("tensor", "row", "mx32", "block128", "block128x128", "block32x32",
                             "nv16", "nv16x16")
    assert lowp.SCALE_MODES == ("rceil", "floor", "ceil", "even")
    assert A._E8M0_KINDS == ("mx32", "block32x32")
    assert A._DEFAULT_MODE == {"mx32": "rceil", "block32x32": "floor"}


def test_scale_calculation_mode_is_the_c_modes():
    from lowp.torch.config import ScaleCalculationMode
    assert tuple(m.value for m in ScaleCalculationMode) == \
        tuple(m for m in rules.names("scale_modes") if m != "default")


def _spec(fmt, kind, mode=None, delayed=False):
    from lowp.torch.config import OperandSpec
    return OperandSpec(fmt, kind, mode, None, delayed)


def _specs():
    """Each config's MatmulSpec as config.py wrote it by hand before it read the C presets."""
    from lowp.torch import config as C
    mx, b32 = _spec("e4m3", "mx32", "rceil"), _spec("e4m3", "block32x32", "floor")
    fp4, e5f = _spec("e2m1", "mx32", "rceil"), _spec("e5m2", "mx32", "floor")
    b128, row = _spec("e4m3", "block128"), _spec("e4m3", "row")
    t4, t5 = _spec("e4m3", "tensor"), _spec("e5m2", "tensor")
    d4, d5 = _spec("e4m3", "tensor", delayed=True), _spec("e5m2", "tensor", delayed=True)
    M, bf = C.MatmulSpec, C.OperandSpec()
    return [
        (C.MXQuantizeConfig(), M(mx, mx, mx, name="mxfp8")),
        (C.MXQuantizeConfig(dtype="fp4"), M(fp4, fp4, fp4, name="mxfp4")),
        (C.MXQuantizeConfig(dtype="e5m2", scale_mode="floor"), M(e5f, e5f, e5f, name="custom")),
        (C.BlockQuantizeConfig(), M(mx, b32, mx, name="block32x32")),
        (C.BlockQuantizeConfig(mxfp4_fake_quantize_config=True),
         M(mx, b32, mx, fake_quant_mxfp4=True, name="block32x32_fp4")),
        (C.Block128Config(), M(b128, _spec("e4m3", "block128x128"), b128, name="block128")),
        (C.Float8RowwiseConfig(), M(row, row, row, keep_quantized=False, name="fp8_rowwise")),
        (C.Float8TensorwiseConfig(), M(t4, t4, t5, name="fp8_tensorwise")),
        (C.Float8TensorwiseConfig(delayed=True, history_len=16, margin=2.0,
                                  amax_compute_algo="most_recent"),
         M(d4, d4, d5, history_len=16, margin=2.0, amax_compute_algo="most_recent",
           name="fp8_delayed")),
        (None, M(bf, bf, bf, keep_quantized=False, name="bf16")),
    ]


def test_configs_build_their_specs_from_the_c_presets():
    from lowp.torch.config import resolve_config
    for cfg, want in _specs():
        assert resolve_config(cfg) == want, cfg


def test_gemm_pairs_checked_are_the_c_pairs():
    from lowp.torch import config as C
    with pytest.raises(ValueError, match="does not multiply"):
        C.resolve_config(C.MXQuantizeConfig(), activation_config=C.Float8RowwiseConfig())
    # MX32 e2m1 activations with a 32x32-tiled e4m3 weight: lowp_gemm multiplies them (the
    # hand-written Python list refused them)
    s = C.resolve_config(C.BlockQuantizeConfig(),
                         activation_config=C.MXQuantizeConfig(dtype="fp4"))
    assert (s.input.format, s.weight.scaling) == ("e2m1", "block32x32")
