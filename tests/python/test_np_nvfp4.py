"""The NVFP4 kinds (nv16, nv16x16: issue 38) in the Python package: the C tables list them, the
lowp.torch ops serve them (tests/python/test_torch_nvfp4.py), and until the numpy API serves
them it refuses them by name."""

import numpy as np
import pytest

import lowp
from lowp import rules


def test_tables_list_the_nvfp4_kinds():
    sc = rules.TABLES["scalings"]
    assert (sc["nv16"]["block_cols"], sc["nv16"]["scale"], sc["nv16"]["tensor_scale"]) == (
        16, "e4m3", True)
    assert (sc["nv16x16"]["block_rows"], sc["nv16x16"]["transposes"]) == (16, True)
    assert ("e2m1", "nv16", "e2m1", "nv16x16") in rules.TABLES["gemm_pairs"]


@pytest.mark.parametrize("kind", ["nv16", "nv16x16"])
def test_numpy_quantize_refuses_nvfp4_by_name(kind):
    assert kind not in lowp.SCALINGS
    with pytest.raises(ValueError, match=r"scaling.*nv16"):
        lowp.quantize(np.ones((2, 16), np.float32), "e2m1", kind)


def test_portable_path_lists_nvfp4():
    pytest.importorskip("torch")
    from lowp.torch.ops import portable as P
    assert {"nv16", "nv16x16"} <= set(P.SCALINGS)
    assert "nv16x16" in P.TILE_KINDS and "nv16" in P.TOKEN_BLOCK_KINDS


def test_check_device_asks_nvfp4_kernels():
    pytest.importorskip("torch")
    import importlib
    C = importlib.import_module("lowp.torch.check_device")  # the module, not the function
    keys = [k for op in ("scaled_mm", "scaled_grouped_mm") for k in C._gemm_keys(op)]
    assert {k.b_scaling for k in keys if k.scaling == "nv16"} == {"nv16", "nv16x16"}
