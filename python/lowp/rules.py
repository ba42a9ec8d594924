"""lowp's rule tables for Python: owns where the package reads the C library's rules from.

Every rule lives once, in C (docs/architecture.md): the format traits, the scaling kinds' traits
(block, scale type, grouped copies, orientation, default mode and pow2), the scale-mode names,
the GEMM operand pairs lowp multiplies, the linear presets, the built-in recipes and the linear
plan (which GEMM of a layer runs quantized, on which copies, and whether the dgrad reads the
forward's weight copy as stored). This module serves them from the extension
(`lowp._lowp.tables()`) when it is importable, else from `lowp._tables`, the copy that
tools/gen_tables.py writes and the ctest `tables_drift` keeps equal to the extension (so the
portable path runs on a host without a C compiler). Nothing here states a rule: the helpers
only select rows of the tables.
"""

from typing import Dict, Optional, Tuple

__all__ = ["TABLES", "SOURCE", "load", "names", "kinds", "scaling_pairs", "linear_plan",
           "preset", "recipe"]


def load(prefer_extension: bool = True):
    """(tables, source): the extension's tables when `prefer_extension` and it is importable,
    else those of lowp._tables; source is "extension" or "_tables"."""
    if prefer_extension:
        try:
            from ._numpy_api import _lowp
            return _lowp.tables(), "extension"
        except ImportError:
            pass
    from ._tables import TABLES as t
    return t, "_tables"


TABLES, SOURCE = load()


def _by_code(table: Dict[str, dict]) -> Tuple[str, ...]:
    return tuple(sorted(table, key=lambda n: table[n]["code"]))


def names(table: str) -> Tuple[str, ...]:
    """The names of "formats", "scalings" or "scale_modes", in the order of their C codes."""
    if table == "scale_modes":
        modes = TABLES["scale_modes"]
        return tuple(sorted(modes, key=modes.get))
    return _by_code(TABLES[table])


def kinds(**traits) -> Tuple[str, ...]:
    """The quantized scaling kinds (not "none") whose traits equal `traits`, in code order:
    kinds(scale="e8m0") -> ("mx32", "block32x32")."""
    sc = TABLES["scalings"]
    return tuple(n for n in _by_code(sc)
                 if n != "none" and all(sc[n][k] == v for k, v in traits.items()))


def scaling_pairs(fa: Optional[str] = None, fb: Optional[str] = None):
    """{(a scaling, b scaling)} of the GEMM pairs lowp multiplies (with formats fa, fb when
    given)."""
    return {(sa, sb) for (a, sa, b, sb) in TABLES["gemm_pairs"]
            if (fa is None or a == fa) and (fb is None or b == fb)}


def linear_plan(input_q: bool, grad_output_q: bool, wgrad_hp: bool, weight_scaling: str):
    """{"forward" | "dgrad" | "wgrad": {quantized, a, a_columnwise, b, b_columnwise, b_kn}} of a
    layer whose input / grad_output are quantized or not and whose weight has `weight_scaling`
    ("none": not quantized)."""
    return TABLES["linear_plan"][(bool(input_q), bool(grad_output_q), bool(wgrad_hp),
                                  weight_scaling)]


def preset(name: str) -> dict:
    """The C linear preset `name` (lowp_linear_cfg_preset) as a dict."""
    return TABLES["presets"][name]


def recipe(name: str):
    """The C built-in recipe `name`: [(pattern, preset name, or None for high precision)]."""
    return TABLES["recipes"][name]
