"""The device kernel table: vendor kernels for the `lowp::` ops, per device type.

A vendor kernel (torch's own `torch._scaled_mm`, CUDA's, an Ascend NPU's `torch_npu` ops, or an
out-of-tree package's) serves one op -- quantize, dequantize, scaled_mm or scaled_grouped_mm --
on lowp's canonical operands: it takes the op's own arguments (codes, canonical scales, grouped
copies as the op gives them) and converts layouts itself. `supports(key)` says which calls it
serves (a `KernelKey`: formats, scalings, scale mode, axis, dtype...).

- `register_kernel(device_type, op, fn, *, name, supports)` adds one; `unregister_kernel(name)`
  removes it; `available_kernels()` lists them.
- `use_device_kernels(enabled=True, only=())`: vendor kernels run only when enabled (off by
  default); `only` names the kernels allowed, and forces them: on the CPU lowp's native kernels
  keep precedence over any table kernel that is not forced. Usable as a context manager,
  which restores the previous setting.
- The routing is torch's dispatcher's: registering a kernel for a device type installs, for that
  device's dispatch key, a trampoline (`ops/library.py`) that asks this table (`_route`) and
  runs the portable kernel for anything not served (on the CPU, the native kernel).
  `lowp.torch.stats()` counts "device" runs beside "native" and "portable".
- Out-of-tree vendors register through the entry-point group `lowp.torch.kernels` (the Python
  twin of the C plugin ABI): each entry point names a callable taking no argument that calls
  `register_kernel`. Entry points and the built-in adapters (`adapters/`) load lazily, the
  first time the table is listed, enabled or checked; importing lowp imports no vendor package
  (the NPU adapter registers only once `torch_npu` has been imported by the user).

Conformance (docs/numerics.md section 10): quantize and dequantize kernels must give the golden
bytes, GEMMs must stay within section 6's bound with NaN and Inf in the same places;
`lowp.torch.check_device` checks both. A vendor quantizer with another rule is not a lowp kernel.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .ops import library as _lib
from .ops import portable as _P

__all__ = ["KernelKey", "DeviceKernel", "OPS", "register_kernel", "unregister_kernel",
           "available_kernels", "use_device_kernels", "serves", "key_of"]

OPS = ("quantize", "dequantize", "scaled_mm", "scaled_grouped_mm")
ENTRY_POINT_GROUP = "lowp.torch.kernels"
_BUILTIN = ("lowp.torch.adapters.cpu_scaled_mm", "lowp.torch.adapters.cuda",
            "lowp.torch.adapters.npu")


@dataclass(frozen=True)
class KernelKey:
    """What one call of a `lowp::` op asks for; a kernel's `supports(key)` answers.

    op: "quantize", "dequantize", "scaled_mm" or "scaled_grouped_mm".
    format, scaling: the element format and scaling kind (quantize, dequantize; a GEMM's a).
    scale_mode: the E8M0 rule ("rceil", "floor", "ceil", "even"; the kind's default resolved),
        "" for binary32 scalings.
    axis: quantize's "row", "col" or "both". dtype: quantize's input dtype.
    grouped: offsets given (a copy quantized along the tokens in groups; dequantize of one).
    stacked: quantize of a 3-D x (stacked matrices). delayed: quantize with a given scale.
    pow2, eps: quantize's binary32-scale options (-1: the kind's default).
    b_format, b_scaling, out_dtype ("f32"/"bf16"), b_kn, wgrad: the GEMMs'.
    """

    op: str
    format: str = ""
    scaling: str = ""
    scale_mode: str = ""
    axis: str = ""
    dtype: Optional[torch.dtype] = None
    grouped: bool = False
    stacked: bool = False
    delayed: bool = False
    pow2: int = -1
    eps: float = 0.0
    b_format: str = ""
    b_scaling: str = ""
    out_dtype: str = ""
    b_kn: bool = False
    wgrad: bool = False

    def __str__(self):
        fields = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name != "op" and v != f.default:
                fields.append(f"{f.name}={str(v).replace('torch.', '')}")
        return f"{self.op}({', '.join(fields)})"


@dataclass(frozen=True)
class DeviceKernel:
    """One entry of the table."""

    device_type: str
    op: str
    name: str
    fn: Callable
    supports: Callable[[KernelKey], bool]


_TABLE: List[DeviceKernel] = []
_STATE = {"enabled": False, "only": ()}
_LOADED = {"entry_points": False}
_UNREGISTERED = set()  # names the user removed: the built-in adapters do not bring them back


def _check_str(fn: str, arg: str, v) -> str:
    if not isinstance(v, str) or not v:
        raise TypeError(f"{fn}: {arg} must be a non-empty str, got {v!r}")
    return v


def register_kernel(device_type: str, op: str, fn: Callable, *, name: str,
                    supports: Callable[[KernelKey], bool]) -> DeviceKernel:
    """Add kernel `fn` for op `op` on tensors of `device_type` ("cpu", "cuda", "npu"...).

    fn takes the op's arguments (already checked) and returns what the op returns; supports
    takes a `KernelKey` and says whether fn serves it. `name` identifies the kernel (unique);
    it runs only under `use_device_kernels()`."""
    fname = "register_kernel"
    _check_str(fname, "device_type", device_type)
    _check_str(fname, "name", name)
    if op not in OPS:
        raise ValueError(f"{fname}: op ({op!r}) is not one of {', '.join(OPS)}")
    if not callable(fn):
        raise TypeError(f"{fname}: fn must be callable, got {type(fn).__name__}")
    if not callable(supports):
        raise TypeError(f"{fname}: supports must be callable, got {type(supports).__name__}")
    if any(k.name == name for k in _TABLE):
        raise ValueError(f"{fname}: name ({name!r}) is already registered")
    try:
        _lib._install_trampoline(op, device_type)
    except ValueError as e:
        raise ValueError(f"{fname}: {e}") from None
    entry = DeviceKernel(device_type, op, name, fn, supports)
    _TABLE.append(entry)
    _UNREGISTERED.discard(name)
    return entry


def unregister_kernel(name: str) -> None:
    """Remove the kernel registered as `name` (its trampoline stays: it falls back). A
    built-in adapter's kernel stays removed until registered again by hand."""
    for i, k in enumerate(_TABLE):
        if k.name == name:
            del _TABLE[i]
            _UNREGISTERED.add(name)
            return
    raise ValueError(f"unregister_kernel: name ({name!r}) is not registered")


def _load() -> None:
    """Register the built-in adapters (each decides for itself whether its device is there)
    and, once, the entry points of group lowp.torch.kernels."""
    for mod in _BUILTIN:
        importlib.import_module(mod).register()
    if _LOADED["entry_points"]:
        return
    _LOADED["entry_points"] = True
    from importlib.metadata import entry_points
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()()
        except Exception as e:  # a broken plugin must not break lowp
            warnings.warn(f"lowp.torch.kernels entry point {ep.name} ({ep.value}) failed: "
                          f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)


def available_kernels(device_type: Optional[str] = None) -> List[DeviceKernel]:
    """The registered kernels (of device_type when given), after loading the built-in
    adapters and the entry points."""
    _load()
    return [k for k in _TABLE if device_type is None or k.device_type == device_type]


class _Setting:
    """use_device_kernels' result: the setting is already made; `with` restores the previous
    one at the end of the block."""

    def __init__(self, previous):
        self._previous = previous

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _STATE.update(self._previous)
        return False


def use_device_kernels(enabled: bool = True, only: Sequence[str] = ()) -> _Setting:
    """Let the table's kernels run (enabled) or not; `only`: the names of the kernels allowed
    (all when empty), which are then forced (on the CPU, ahead of lowp's native kernels)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"use_device_kernels: enabled must be a bool, got {enabled!r}")
    if isinstance(only, str):
        only = (only,)
    only = tuple(only)
    for n in only:
        _check_str("use_device_kernels", "only", n)
    previous = dict(_STATE)
    if enabled:
        _load()
        names = {k.name for k in _TABLE}
        missing = [n for n in only if n not in names]
        if missing:
            raise ValueError(f"use_device_kernels: only names unregistered kernels: "
                             f"{', '.join(missing)} (registered: {', '.join(sorted(names))})")
    _STATE.update(enabled=enabled, only=only)
    return _Setting(previous)


def serves(device_type: str) -> bool:
    """Whether the table would run kernels on device_type now (enabled, some registered)."""
    return _STATE["enabled"] and any(_allowed(k) for k in _TABLE if k.device_type == device_type)


def _allowed(k: DeviceKernel) -> bool:
    return not _STATE["only"] or k.name in _STATE["only"]


# ---- the key of a call ----

_SCHEMA_NAMES: Dict[str, Tuple[Tuple[str, object], ...]] = {}


def _bind(op: str, args, kwargs) -> dict:
    """The op's arguments by name, defaults filled in."""
    names = _SCHEMA_NAMES.get(op)
    if names is None:
        schema = getattr(torch.ops.lowp, op).default._schema
        names = tuple((a.name, a.default_value if a.has_default_value() else None)
                      for a in schema.arguments)
        _SCHEMA_NAMES[op] = names
    out = {n: d for n, d in names}
    out.update(zip((n for n, _ in names), args))
    out.update(kwargs)
    return out


def key_of(op: str, args, kwargs=None) -> KernelKey:
    """The KernelKey of a call of lowp::op with these arguments."""
    a = _bind(op, args, kwargs or {})
    if op == "quantize":
        mode = _P.default_mode(a["scaling"], a["scale_mode"] or None) \
            if a["scaling"] in _P.E8M0_KINDS else ""
        return KernelKey(op, a["format"], a["scaling"], mode, a["axis"], a["x"].dtype,
                         a["offs"] is not None, a["x"].dim() == 3, a["scale"] is not None,
                         int(a["pow2"]), float(a["eps"]))
    if op == "dequantize":
        return KernelKey(op, a["format"], a["scaling"], grouped=a["offs"] is not None)
    return KernelKey(op, a["a_format"], a["a_scaling"], b_format=a["b_format"],
                     b_scaling=a["b_scaling"], out_dtype=a["out_dtype"], b_kn=bool(a["b_kn"]),
                     wgrad=bool(a.get("wgrad", False)), grouped=op == "scaled_grouped_mm")


def _route(device_type: str, op: str, native: bool, args, kwargs):
    """The trampolines' question: (name, fn) of the kernel to run, or None (fall back)."""
    if not _STATE["enabled"]:
        return None
    cands = [k for k in _TABLE if k.device_type == device_type and k.op == op and _allowed(k)]
    if native and not _STATE["only"]:
        return None  # the CPU: lowp's native kernels keep precedence unless one is forced
    if not cands:
        return None
    key = key_of(op, args, kwargs)
    for k in cands:
        if k.supports(key):
            return k.name, k.fn
    return None


_lib._ROUTER = _route
_lib._SERVES = serves
