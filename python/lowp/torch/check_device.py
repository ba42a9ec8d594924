"""`check_device`: the conformance check of the device kernel table's kernels.

For every registered kernel of a device (or the ones named) and every key it supports, the same
inputs go through the kernel, on the device, and through the CPU golden kernels (lowp's native
kernels; the portable ones where the extension is not built), and the two conformance classes
of docs/numerics.md section 10 decide:

- quantize and dequantize must give the golden bytes. The report counts the data and scale
  bytes that differ and names the first differing block: its copy ("row"/"col"), its index in
  the scale grid, its amax bits (of the input, binary32) and both codes (scale and element);
- scaled_mm and scaled_grouped_mm must stay within section 6's bound, a relative error of at
  most 1e-5 of ||C|| (Frobenius, over the finite outputs), with NaN and Inf in the same places.
  The report gives the relative error, the NaN/Inf mismatches, the share of identical outputs
  and the SQNR, and names the first failing output element.

Suites: "quick" (Gaussian data on one odd shape, ragged groups with an empty one), "standard"
(several odd shapes), "edge" (standard plus a matrix of special blocks: zero blocks, code-0
blocks, subnormal blocks, Inf and NaN blocks, block maxima at fmax * 2^k and a few ulps either
side). A kernel that raises fails its case with the error.

`python -m lowp.torch.check_device --device DEV [--kernels NAME ...] [--suite S] [--json FILE]`
prints the summary, writes progress to stderr, and exits 1 on a failure or when no case ran (2
on bad arguments). For `--device npu` it imports torch_npu first (the command line only).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import struct
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import torch
from torch import Tensor

from . import device_kernels as DK
from .ops import library as _lib
from .ops import portable as _P

__all__ = ["check_device", "DeviceReport", "CaseResult", "SUITES", "GEMM_BOUND", "main"]

SUITES = ("quick", "standard", "edge")
GEMM_BOUND = 1e-5  # docs/numerics.md section 6
_SHAPES = {"quick": [(37, 70)], "standard": [(1, 33), (37, 70), (130, 261)]}
_MAX_BAD_BLOCKS = 256


@dataclass
class CaseResult:
    """One kernel on one key and one input."""

    kernel: str
    op: str
    key: str
    data: str  # "gaussian RxC" or "edge RxC"
    passed: bool
    metrics: Dict = field(default_factory=dict)
    first_failure: Optional[Dict] = None
    error: Optional[str] = None

    def line(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        what = self.error or (_describe(self.first_failure) if self.first_failure else "")
        return f"{status} {self.kernel} {self.key} [{self.data}] {what}".rstrip()


@dataclass
class DeviceReport:
    device: str
    suite: str
    kernels: List[str]
    results: List[CaseResult]

    @property
    def passed(self) -> bool:
        """Every case passed, and at least one ran (nothing checked is not a pass)."""
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def failures(self) -> List[CaseResult]:
        return [r for r in self.results if not r.passed]

    def to_dict(self) -> Dict:
        return {"device": self.device, "suite": self.suite, "kernels": self.kernels,
                "passed": self.passed, "cases": len(self.results),
                "failures": len(self.failures),
                "results": [r.__dict__ for r in self.results]}

    def __str__(self) -> str:
        none = "" if self.results else " (no kernel case ran: nothing was checked)"
        head = (f"check_device({self.device!r}, suite={self.suite!r}): "
                f"{'PASS' if self.passed else 'FAIL'}{none}, {len(self.results)} cases, "
                f"{len(self.failures)} failing, kernels: {', '.join(self.kernels) or 'none'}")
        return "\n".join([head] + [r.line() for r in self.failures])


def _describe(f: Dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in f.items() if k != "bad_blocks")


# ---- golden kernels and keys ----


def _golden(op: str) -> Callable:
    """The CPU golden kernel of op (its argument checks first, as the ops run them)."""
    check, _, portable, native = _lib._OPS[op]
    impl = native if _lib.native_available() else portable

    def run(*args):
        check(*args, eager=True)
        return impl(*args)

    return run


def _formats():
    return tuple(_P.FORMATS)


def _quantize_keys() -> Iterator[tuple]:
    """(key, scale_mode argument, grouped) of every quantize call the suites try."""
    for fmt in _formats():
        for kind in _P.SCALINGS:
            modes = _P.SCALE_MODES if kind in _P.E8M0_KINDS else ("",)
            for mode in modes:
                for dt in (torch.float32, torch.bfloat16):
                    for axis in ("row", "col", "both"):
                        yield DK.KernelKey("quantize", fmt, kind, mode, axis, dt), mode, False
                    if kind in _P.TOKEN_BLOCK_KINDS:
                        yield (DK.KernelKey("quantize", fmt, kind, mode, "col", dt, True),
                               mode, True)


def _gemm_pairs():
    from .. import rules
    return sorted(p for p in rules.TABLES["gemm_pairs"]  # the kinds the portable path serves
                  if p[1] != "none" and p[1] in _P.SCALINGS and p[3] in _P.SCALINGS)


def _gemm_keys(op: str) -> Iterator[DK.KernelKey]:
    from .ops.layout import KN_KINDS
    for fa, sa, fb, sb in _gemm_pairs():
        for out in ("f32", "bf16"):
            if op == "scaled_mm":
                for kn in (False, True) if sb in KN_KINDS else (False,):
                    yield DK.KernelKey(op, fa, sa, b_format=fb, b_scaling=sb, out_dtype=out,
                                       b_kn=kn)
            else:
                for wgrad in (False, True):
                    yield DK.KernelKey(op, fa, sa, b_format=fb, b_scaling=sb, out_dtype=out,
                                       wgrad=wgrad, grouped=True)


# ---- inputs ----


def _gaussian(rows: int, cols: int, dtype, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g).to(dtype)


def _step(v: float, ulps: int, dtype) -> float:
    """v moved by ulps units in the last place of dtype."""
    t = torch.tensor(v, dtype=dtype)
    it = torch.int16 if dtype == torch.bfloat16 else torch.int32
    return float((t.view(it) + ulps).view(dtype))


def edge_input(fmt: str, dtype, cols: int = 96) -> Tensor:
    """The edge suite's matrix [rows, cols] of dtype: Gaussian, with special 32-element blocks
    at the start of rows: row 0 zeros, row 1 a code-0 block (amax about fmax * 2^-130), row 2
    subnormals (of binary32 and bfloat16), rows 3-5 a block holding +Inf, NaN, -Inf, then
    rows whose block maximum is fmax * 2^k moved by -2..2 ulps (k = -3, 0, 5)."""
    fmax = _P.FORMATS[fmt].fmax
    specials = [(k, s) for k in (-3, 0, 5) for s in (-2, -1, 0, 1, 2)]
    x = _gaussian(6 + len(specials), cols, torch.float32, 7).to(torch.float64)
    x[0, :32] = 0
    x[1, :32] *= fmax * 2.0 ** -132
    x[2, :32] *= 2.0 ** -129  # subnormal in binary32 and in bfloat16
    for r, v in ((3, math.inf), (4, math.nan), (5, -math.inf)):
        x[r, 5] = v
    for i, (k, s) in enumerate(specials):
        row = x[6 + i, :32]
        peak = _step(fmax * 2.0 ** k, s, dtype)
        row.mul_(0.5 * abs(peak) / row.abs().max())
        row[3 + i % 20] = peak if i % 2 else -peak
    return x.to(dtype)


def _inputs(suite: str, fmt: str, dtype) -> Iterator[tuple]:
    """(label, x) of the suite, in dtype."""
    for i, (r, c) in enumerate(_SHAPES["quick" if suite == "quick" else "standard"]):
        yield f"gaussian {r}x{c}", _gaussian(r, c, dtype, 1000 + i)
    if suite == "edge":
        x = edge_input(fmt, dtype)
        yield f"edge {x.shape[0]}x{x.shape[1]}", x


def _offs(tokens: int) -> Tensor:
    """Ragged group ends over tokens, with an empty group."""
    a = tokens // 3
    return torch.tensor([a, a, tokens - 1, tokens], dtype=torch.int32)


# ---- quantize and dequantize: the golden bytes ----


def _block_ids(scaling: str, rows: int, cols: int, offs: Optional[Sequence[int]] = None):
    """[rows, cols] block index of each element of a copy in its scale grid (flattened), and
    the grid's width."""
    r = torch.arange(rows)[:, None]
    c = torch.arange(cols)[None, :]
    if scaling == "tensor":
        return torch.zeros(rows, cols, dtype=torch.long), 1
    if scaling == "row":
        return r.expand(rows, cols).clone(), 1
    bs = _P.block_of(scaling)
    if scaling in _P.TILE_KINDS:
        w = -(-cols // bs)
        return (r // bs) * w + c // bs, w
    if offs is None:
        w = -(-cols // bs)
        return r * w + c // bs, w
    col_block = torch.empty(cols, dtype=torch.long)
    nb, prev = 0, 0
    for e in offs:
        n = int(e) - prev
        col_block[prev:int(e)] = nb + torch.arange(n) // bs
        nb, prev = nb + -(-n // bs), int(e)
    w = -(-cols // bs) + len(offs)  # the static bound the op pads to
    return r * w + col_block[None, :], w


def _elem_mismatch(g: Tensor, k: Tensor, fmt: str, cols: int) -> Tensor:
    """[rows, cols] elements whose codes differ (E2M1: by nibble)."""
    d = g ^ k
    if fmt != "e2m1":
        return d != 0
    m = torch.stack([(d & 0xF) != 0, (d >> 4) != 0], dim=-1).reshape(d.shape[0], -1)
    return m[:, :cols]


def _bits_hex(v: float) -> str:
    return "0x%08x" % struct.unpack("<I", struct.pack("<f", v))[0]


def _scale_repr(s: Tensor, i: int):
    v = s.reshape(-1)[i]
    return int(v) if s.dtype == torch.uint8 else _bits_hex(float(v))


def _code_at(data: Tensor, fmt: str, r: int, c: int) -> int:
    if fmt != "e2m1":
        return int(data[r, c])
    b = int(data[r, c // 2])
    return (b >> 4) if c % 2 else (b & 0xF)


def _compare_copy(copy: str, xt: Tensor, fmt: str, scaling: str, g: tuple, k: tuple,
                  offs=None) -> Dict:
    """One quantized copy (codes, scales) of xt [rows, cols]: kernel k against golden g."""
    (gd, gs), (kd, ks) = g, k
    rows, cols = xt.shape
    for what, a, b in (("data", gd, kd), ("scale", gs, ks)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return {"copy": copy, "shape": f"{what} {b.dtype} {tuple(b.shape)}, golden "
                    f"{a.dtype} {tuple(a.shape)}", "data_bytes": -1, "scale_bytes": -1}
    gb, kb = gs.contiguous().view(torch.uint8), ks.contiguous().view(torch.uint8)
    out = {"copy": copy, "data_bytes": int((gd != kd).sum()),
           "scale_bytes": int((gb != kb).sum())}
    if not out["data_bytes"] and not out["scale_bytes"]:
        return out
    ids, w = _block_ids(scaling, rows, cols, offs)
    em = _elem_mismatch(gd, kd, fmt, cols)
    per = 4 if gs.dtype == torch.float32 else 1
    sm = (gb != kb).reshape(-1, per).any(dim=1)
    bad = torch.unique(torch.cat([ids[em], torch.nonzero(sm).reshape(-1)]))
    ax = xt.float().abs()
    blocks = []
    for b in bad[:_MAX_BAD_BLOCKS].tolist():
        vals = ax[ids == b]
        amax = math.nan if vals.isnan().any() else float(vals.max()) if vals.numel() else 0.0
        blocks.append({"copy": copy, "block": divmod(b, w), "amax_bits": _bits_hex(amax)})
    first = blocks[0]
    b = int(bad[0])
    pos = torch.nonzero(em & (ids == b))
    r, c = pos[0].tolist() if len(pos) else torch.nonzero(ids == b)[0].tolist() \
        if (ids == b).any() else (0, 0)
    first.update(scale_golden=_scale_repr(gs, b) if b < gs.numel() else None,
                 scale_kernel=_scale_repr(ks, b) if b < ks.numel() else None,
                 element=(r, c), code_golden=_code_at(gd, fmt, r, c) if cols else None,
                 code_kernel=_code_at(kd, fmt, r, c) if cols else None)
    out["first"], out["bad_blocks"] = first, blocks
    return out


def _quantize_result(x: Tensor, key, args, g: tuple, k: tuple) -> tuple:
    """(passed, metrics, first failure) of a quantize call."""
    if not isinstance(k, (tuple, list)) or len(k) != 4:
        return False, {}, {"output": f"expected 4 tensors, got {type(k).__name__}"}
    offs = args[7].tolist() if args[7] is not None else None
    copies = []
    if key.axis in ("row", "both") and not key.grouped:
        copies.append(("row", x, (g[0], g[1]), (k[0], k[1]), None))
    if key.axis in ("col", "both"):
        copies.append(("col", x.t(), (g[2], g[3]), (k[2], k[3]), offs))
    metrics = {"data_bytes": 0, "scale_bytes": 0}
    first, blocks = None, []
    for copy, xt, gc, kc, o in copies:
        c = _compare_copy(copy, xt, key.format, key.scaling, gc, kc, o)
        if c["data_bytes"] < 0:
            return False, metrics, {"copy": copy, "shape": c["shape"]}
        metrics["data_bytes"] += c["data_bytes"]
        metrics["scale_bytes"] += c["scale_bytes"]
        blocks += c.get("bad_blocks", [])
        first = first or c.get("first")
    if first is not None:
        first = dict(first, bad_blocks=blocks)
    return first is None, metrics, first


def _dequantize_result(key, args, g: Tensor, k: Tensor) -> tuple:
    if not isinstance(k, Tensor) or k.shape != g.shape or k.dtype != g.dtype:
        return False, {}, {"output": f"got {getattr(k, 'dtype', type(k))} "
                           f"{tuple(getattr(k, 'shape', ()))}, golden {g.dtype} {tuple(g.shape)}"}
    gi, ki = g.view(torch.int32), k.view(torch.int32)
    diff = gi != ki
    metrics = {"data_bytes": int(diff.sum())}
    if not metrics["data_bytes"]:
        return True, metrics, None
    offs = args[6].tolist() if args[6] is not None else None
    ids, w = _block_ids(key.scaling, g.shape[0], g.shape[1], offs)
    r, c = torch.nonzero(diff)[0].tolist()
    b = int(ids[r, c])
    return False, metrics, {"block": divmod(b, w), "element": (r, c),
                            "golden": _bits_hex(float(g[r, c])),
                            "kernel": _bits_hex(float(k[r, c]))}


# ---- GEMMs: section 6's bound ----


def _bf16_ulp(g: Tensor) -> Tensor:
    """One unit in the last place of each BF16 value (float64)."""
    e = ((g.view(torch.int16).to(torch.int32) >> 7) & 0xFF).clamp(min=1)
    return torch.pow(2.0, (e - 127 - 7).double())


def _gemm_result(g: Tensor, k) -> tuple:
    """Section 6: relative error at most GEMM_BOUND of ||C||, NaN/Inf in the same places; a
    BF16 output may also differ by one BF16 ulp per element (the final rounding of binary32
    results that agree within the bound)."""
    if not isinstance(k, Tensor) or k.shape != g.shape or k.dtype != g.dtype:
        return False, {}, {"output": f"got {getattr(k, 'dtype', type(k))} "
                           f"{tuple(getattr(k, 'shape', ()))}, golden {g.dtype} {tuple(g.shape)}"}
    gd, kd = g.double(), k.double()
    nan_bad = gd.isnan() != kd.isnan()
    inf_bad = (gd.isinf() | kd.isinf()) & (gd != kd) & ~nan_bad
    fin = gd.isfinite() & kd.isfinite()
    err = torch.where(fin, kd - gd, 0.0)
    if g.dtype == torch.bfloat16:  # a binary32 result within the bound may round either way
        err = torch.where(err.abs() <= _bf16_ulp(g), 0.0, err)
    ref = torch.where(fin, gd, 0.0)
    en, rn = float(err.norm()), float(ref.norm())
    rel = en / rn if rn > 0 else (0.0 if en == 0 else math.inf)
    same = (g.view(torch.int16 if g.dtype == torch.bfloat16 else torch.int32) ==
            k.view(torch.int16 if k.dtype == torch.bfloat16 else torch.int32)) | \
        (gd.isnan() & kd.isnan())
    metrics = {"rel_err": rel, "nan_mismatch": int(nan_bad.sum()),
               "inf_mismatch": int(inf_bad.sum()),
               "identical": float(same.float().mean()) if same.numel() else 1.0,
               "sqnr_db": 10 * math.log10(rn ** 2 / en ** 2) if en > 0 and rn > 0 else math.inf}
    bad = nan_bad | inf_bad
    if bad.any():
        pos = torch.nonzero(bad)[0].tolist()
    elif rel > GEMM_BOUND:
        pos = list(divmod(int(err.abs().reshape(-1).argmax()), g.shape[-1]))
        if g.dim() == 3:
            flat = int(err.abs().reshape(-1).argmax())
            pos = [flat // (g.shape[1] * g.shape[2]), *divmod(flat % (g.shape[1] * g.shape[2]),
                                                            g.shape[2])]
    else:
        return True, metrics, None
    return False, metrics, {"output": tuple(pos), "golden": float(g[tuple(pos)]),
                            "kernel": float(k[tuple(pos)]), "rel_err": rel}


# ---- the cases ----


def _q(x, fmt, kind, mode, axis, offs=None):
    return _golden("quantize")(x, fmt, kind, mode, -1, 0.0, axis, offs, None)


def _quantize_cases(key, mode, suite) -> Iterator[tuple]:
    for label, x in _inputs(suite, key.format, key.dtype):
        offs = _offs(x.shape[0]) if key.grouped else None
        yield label, (x, key.format, key.scaling, mode, -1, 0.0, key.axis, offs, None), x


def _dequantize_cases(key, suite) -> Iterator[tuple]:
    mode = _P.default_mode(key.scaling, None) if key.scaling in _P.E8M0_KINDS else ""
    for label, x in _inputs(suite, key.format, torch.float32):
        if key.grouped:
            offs = _offs(x.shape[0])
            _, _, d, s = _q(x, key.format, key.scaling, mode, "col", offs)
            yield label, (d, s, key.format, key.scaling, x.shape[1], x.shape[0], offs), x
        else:
            d, s, _, _ = _q(x, key.format, key.scaling, mode, "row")
            yield label, (d, s, key.format, key.scaling, x.shape[0], x.shape[1], None), x


def _operand(x, fmt, kind, axis="row", offs=None):
    mode = _P.default_mode(kind, None) if kind in _P.E8M0_KINDS else ""
    d, s, dc, sc = _q(x, fmt, kind, mode, axis, offs)
    return (d, s) if axis == "row" else (dc, sc)


def _gemm_inputs(suite, fmt):
    """(label, a-side matrix, b-side matrix): the b side has other values and rows."""
    for label, x in _inputs(suite, fmt, torch.float32):
        y = _gaussian(x.shape[0] + 5, x.shape[1], torch.float32, 99)
        if label.startswith("edge"):
            y[: x.shape[0]] = x.flip(0)
        yield label, x, y


def _scaled_mm_cases(key, suite) -> Iterator[tuple]:
    for label, x, y in _gemm_inputs(suite, key.format):
        k = x.shape[1]
        a, sa = _operand(x, key.format, key.scaling)
        if key.b_kn:  # b given as stored [k, N]: the rowwise copy of a [k, N] matrix
            b, sb = _operand(y[:, :k].t().contiguous(), key.b_format, key.b_scaling)
        else:
            b, sb = _operand(y, key.b_format, key.b_scaling)
        yield label, (a, sa, key.format, key.scaling, b, sb, key.b_format, key.b_scaling, k,
                      key.out_dtype, key.b_kn), x


def _grouped_cases(key, suite) -> Iterator[tuple]:
    for label, x, y in _gemm_inputs(suite, key.format):
        T = x.shape[0]
        offs = _offs(T)
        if not key.wgrad:  # split-M: a [T, k], b [G, N, k]
            k = x.shape[1]
            a, sa = _operand(x, key.format, key.scaling)
            G = offs.numel()
            w = _gaussian(9 * G, k, torch.float32, 77).reshape(G, 9, k)
            w = w * torch.arange(1, G + 1, dtype=torch.float32)[:, None, None]
            n = min(9, y.shape[0])
            w[0, :n] = y[:n]  # the edge rows too, on the edge suite
            b, sb = _operand(w, key.b_format, key.b_scaling)
        else:  # split-K: a = dY^T [N, T], b = X^T [K, T], quantized along the tokens
            k = T
            dy = y[:T, :17].contiguous()
            tok = lambda kind: offs if kind in _P.TOKEN_BLOCK_KINDS else None  # noqa: E731
            a, sa = _operand(dy, key.format, key.scaling, "col", tok(key.scaling))
            b, sb = _operand(x, key.b_format, key.b_scaling, "col", tok(key.b_scaling))
        yield label, (a, sa, key.format, key.scaling, b, sb, key.b_format, key.b_scaling, offs,
                      k, key.wgrad, key.out_dtype), x


def _keyed(op: str, supports) -> Iterator[tuple]:
    """(key, cases(suite)) of every key of op that supports() takes; cases(suite) yields
    (label, args, x) and raises ValueError where the golden kernels refuse the key."""
    if op == "quantize":
        for key, mode, _ in _quantize_keys():
            if supports(key):
                yield key, (lambda suite, key=key, mode=mode: _quantize_cases(key, mode, suite))
        return
    if op == "dequantize":
        keys = (DK.KernelKey("dequantize", f, s, grouped=gr) for f in _formats()
                for s in _P.SCALINGS for gr in (False, True)
                if not gr or s in _P.TOKEN_BLOCK_KINDS)
        make = _dequantize_cases
    else:
        keys = _gemm_keys(op)
        make = _scaled_mm_cases if op == "scaled_mm" else _grouped_cases
    for key in keys:
        if supports(key):
            yield key, (lambda suite, key=key: make(key, suite))


# ---- running ----


def _to(obj, device):
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, device) for o in obj)
    return obj


def _judge(op, key, args, x, g, k) -> tuple:
    if op == "quantize":
        return _quantize_result(x, key, args, g, k)
    if op == "dequantize":
        return _dequantize_result(key, args, g, k)
    return _gemm_result(g, k)


def _run_case(kern, key, label, args, x, device) -> Optional[CaseResult]:
    """One case; None where the golden kernels refuse it (not a lowp call)."""
    try:
        g = _golden(kern.op)(*args)
    except ValueError:
        return None
    res = CaseResult(kern.name, kern.op, str(key), label, False)
    try:
        k = _to(kern.fn(*_to(args, device)), "cpu")
    except Exception as e:  # the kernel's failure is the report's, not the check's
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.passed, res.metrics, res.first_failure = _judge(kern.op, key, args, x, g, k)
    return res


def _run_kernel(kern, suite, device, progress) -> Iterator[CaseResult]:
    for key, cases in _keyed(kern.op, kern.supports):
        try:
            made = list(cases(suite))
        except ValueError:  # the golden kernels refuse the key: not a lowp call
            continue
        for label, args, x in made:
            res = _run_case(kern, key, label, args, x, device)
            if res is not None:
                if progress is not None:
                    progress(res.line())
                yield res


def check_device(device, kernels: Optional[Sequence[str]] = None, suite: str = "quick",
                 progress: Optional[Callable[[str], None]] = None) -> DeviceReport:
    """Check the device kernels of `device` (every one registered for its type, or those
    named in `kernels`) against the CPU golden kernels; returns a DeviceReport (`.passed`,
    `.failures`, `.to_dict()`). progress(line) is called after each case when given."""
    if suite not in SUITES:
        raise ValueError(f"check_device: suite ({suite!r}) is not one of {', '.join(SUITES)}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"check_device: device ({device!r}) is not a torch device: {e}") \
            from None
    if isinstance(kernels, str):
        kernels = [kernels]
    table = DK.available_kernels(dev.type)
    if kernels is not None:
        everything = {k.name: k for k in DK.available_kernels()}
        unknown = [n for n in kernels if n not in everything]
        if unknown:
            raise ValueError(f"check_device: kernels names unregistered kernels: "
                             f"{', '.join(unknown)} (registered for {dev.type}: "
                             f"{', '.join(k.name for k in table) or 'none'})")
        table = [everything[n] for n in kernels]
    results: List[CaseResult] = []
    for kern in table:
        results += _run_kernel(kern, suite, dev, progress)
    return DeviceReport(str(dev), suite, [k.name for k in table], results)


def _plain(o):
    """o with non-finite floats as strings ("inf", "nan"): strict JSON."""
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    return o


_VENDOR_MODULES = {"npu": "torch_npu"}  # imported by the command line only, never by lowp


def _import_vendor(device: str) -> None:
    """The command line imports the device's torch extension (torch_npu for "npu"), so that
    torch knows the device and the adapter registers its kernels."""
    mod = _VENDOR_MODULES.get(str(device).split(":")[0])
    if mod is not None:
        try:
            importlib.import_module(mod)
        except ImportError as e:
            raise ValueError(f"device {device!r} needs {mod}, which does not import: {e}") \
                from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: the summary on stdout, progress on stderr; returns 1 on a failure,
    2 on bad arguments."""
    ap = argparse.ArgumentParser(prog="python -m lowp.torch.check_device",
                                 description="Check a device's lowp kernels against the CPU "
                                             "golden kernels (docs/torch.md, Devices).")
    ap.add_argument("--device", required=True, help="torch device, e.g. cuda, npu, cpu")
    ap.add_argument("--kernels", nargs="*", default=None, help="kernel names (default: all "
                    "registered for the device)")
    ap.add_argument("--suite", choices=SUITES, default="quick")
    ap.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ns = ap.parse_args(argv)
    prog = None if ns.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        _import_vendor(ns.device)
        rep = check_device(ns.device, ns.kernels, ns.suite, progress=prog)
    except ValueError as e:
        print(f"check_device: {e}", file=sys.stderr)
        return 2
    print(rep)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(_plain(rep.to_dict()), f, indent=1, default=str, allow_nan=False)
    return 0 if rep.passed else 1


if __name__ == "__main__":
    sys.exit(main())
