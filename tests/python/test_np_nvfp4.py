"""The NVFP4 kinds (nv16, nv16x16: issue 38) in the Python package: the C tables list them, and
until the numpy API and the portable torch path serve them, both refuse them by name."""

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


def test_portable_path_does_not_list_nvfp4():
    pytest.importorskip("torch")
    from lowp.torch.ops import portable as P
    assert not {"nv16", "nv16x16"} & (set(P.SCALINGS) | set(P.TILE_KINDS) |
                                      set(P.TOKEN_BLOCK_KINDS))


def test_check_device_asks_no_nvfp4_kernel():
    pytest.importorskip("torch")
    import importlib
    C = importlib.import_module("lowp.torch.check_device")  # the module, not the function
    keys = [k for op in ("scaled_mm", "scaled_grouped_mm") for k in C._gemm_keys(op)]
    assert keys and not [k for k in keys if "nv16" in (k.scaling, k.b_scaling)]
