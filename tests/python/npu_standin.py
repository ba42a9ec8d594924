"""A stand-in for torch_npu's MX functions on CPU tensors (test code, never installed).

It implements the documented signatures and semantics of the Ascend 950 ops that
lowp.torch.adapters.npu wraps, from CANN's operator documents, on the independent numpy
reference of tests/oracle/quant_ref.py (not on lowp's kernels):
- npu_dynamic_mx_quant(input, axis=-1, round_mode="rint", dst_type=..., block_size=32,
  scale_alg=0, dst_type_max=0.0) -> (y, mxscale): y in the input's shape and orientation,
  mxscale in pairs along the quantized axis (rank + 1, last dimension 2); scale_alg 0 is the
  OCP FLOOR rule, 1 the RCEIL rule (FP8 only);
- npu_dynamic_mx_quant_with_dual_axis(input, round_mode, dst_type, scale_alg) -> (y1,
  mxscale1, y2, mxscale2): the -1 and -2 axes at once;
- npu_dynamic_block_mx_quant(input, round_mode, dst_type, scale_alg, dst_type_max=0.0) ->
  (y, scale1, scale2): 32x32 blocks, the block's scale broadcast to its 32 rows (scale1, pairs
  along the columns) and to its 32 columns (scale2, pairs along the rows);
- npu_grouped_dynamic_mx_quant(x, group_index, ...) and npu_grouped_matmul(x, weight, *,
  scale, per_token_scale, group_list, group_type, ...): the grouped forms (MX), as
  lowp.torch.adapters.npu reads their documents (see each function);
- npu_quant_matmul(x1, x2, scale, *, pertoken_scale, output_dtype, group_sizes, ...):
  x1 [M, K] . x2 [K, N], MX (group_sizes [1, 1, 32], E8M0 pair scales: pertoken_scale x1's
  [M, K/64, 2], scale x2's [K/64, N, 2]) or Block FP8 ([1, 128, 128]: pertoken_scale [M, K/128],
  scale [K/128, N/128], binary32), in binary64 here.

`floor_zero_code0=True` (the default) models the predicted CANN difference of
docs/numerics.md section 10: under FLOOR (scale_alg 0), a block whose scale code is 0 gets zero
elements.
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
import quant_ref as R  # noqa: E402

floor_zero_code0 = True
_FMT = {torch.float8_e4m3fn: R.E4M3, torch.float8_e5m2: R.E5M2}
_ALG = {0: R.FLOOR, 1: R.RCEIL}
calls = []  # names of the functions called, for the tests


def _pairs(canon, columnwise):
    sr, sc = canon.shape
    p = np.zeros((sr, sc + sc % 2), np.uint8)
    p[:, :sc] = canon
    p = p.reshape(sr, -1, 2)
    return np.ascontiguousarray(p.transpose(1, 0, 2)) if columnwise else p


def _rowwise(x2d, fmt, kind, alg):
    codes, scales = R.quantize_rowwise(x2d, fmt, kind, _ALG[alg])
    if alg == 0 and floor_zero_code0:
        br, bc = R.block_geometry(kind, *x2d.shape)
        codes = np.where(R.expand(scales == 0, br, bc, *x2d.shape), 0, codes).astype(np.uint8)
    return codes, scales


def _y(codes, dst_type):
    return torch.from_numpy(np.ascontiguousarray(codes)).view(dst_type)


def _np(x):
    return x.detach().float().numpy()


def npu_dynamic_mx_quant(input, axis=-1, round_mode="rint", dst_type=torch.float8_e4m3fn,
                         block_size=32, scale_alg=0, dst_type_max=0.0):
    calls.append("npu_dynamic_mx_quant")
    assert round_mode == "rint" and block_size == 32 and input.dim() == 2
    x, fmt = _np(input), _FMT[dst_type]
    if axis in (-1, 1):
        codes, s = _rowwise(x, fmt, R.MX32, scale_alg)
        return _y(codes, dst_type), torch.from_numpy(_pairs(s, False))
    assert axis in (-2, 0)
    codes, s = _rowwise(np.ascontiguousarray(x.T), fmt, R.MX32, scale_alg)
    return _y(codes.T, dst_type), torch.from_numpy(_pairs(s, True))


def npu_dynamic_mx_quant_with_dual_axis(input, round_mode="rint", dst_type=torch.float8_e4m3fn,
                                        scale_alg=0, dst_type_max=0.0):
    calls.append("npu_dynamic_mx_quant_with_dual_axis")
    y1, s1 = npu_dynamic_mx_quant(input, -1, round_mode, dst_type, 32, scale_alg)
    y2, s2 = npu_dynamic_mx_quant(input, -2, round_mode, dst_type, 32, scale_alg)
    return y1, s1, y2, s2


def npu_dynamic_block_mx_quant(input, round_mode="rint", dst_type=torch.float8_e4m3fn,
                               scale_alg=0, dst_type_max=0.0):
    calls.append("npu_dynamic_block_mx_quant")
    x, fmt = _np(input), _FMT[dst_type]
    codes, grid = _rowwise(x, fmt, R.BLOCK32X32, scale_alg)
    M, N = x.shape
    rows = np.repeat(grid, 32, axis=0)[:M]  # each row of a tile carries the tile's scale
    cols = np.repeat(grid, 32, axis=1)[:, :N]
    return (_y(codes, dst_type), torch.from_numpy(_pairs(rows, False)),
            torch.from_numpy(_pairs(np.ascontiguousarray(cols.T), True)))


def _grouped_pairs(canon, offs):
    """Canonical grouped scales [C, nb] -> each group's blocks padded to even, paired, stacked
    along the first dimension ([sum ceil(nb_g/2), C, 2])."""
    parts, b0, prev = [], 0, 0
    for e in offs:
        n = R.cdiv(int(e) - prev, 32)
        parts.append(_pairs(canon[:, b0:b0 + n], True))
        b0, prev = b0 + n, int(e)
    return np.concatenate(parts, axis=0)


def _grouped_factors(pairs, offs, rows):
    """[rows, T] element factors of a grouped pair layout [P, rows, 2] along T."""
    p = pairs.view(torch.uint8).numpy()
    T = int(offs[-1]) if len(offs) else 0
    f = np.zeros((rows, T))
    r0, prev = 0, 0
    for e in offs:
        n = int(e) - prev
        half = R.cdiv(R.cdiv(n, 32), 2)
        codes = p[r0:r0 + half].transpose(1, 0, 2).reshape(rows, -1)
        f[:, prev:int(e)] = np.repeat(R.e8m0_value(codes), 32, axis=1)[:, :n]
        r0, prev = r0 + half, int(e)
    return f


def npu_grouped_dynamic_mx_quant(x, group_index, round_mode="rint", dst_type=torch.float8_e4m3fn,
                                 blocksize=32, scale_alg=0, dst_type_max=0.0):
    """x [T, C] grouped along dim 0 by group_index (cumulative ends): y [T, C], mxscale
    [sum_g ceil(nb_g/2), C, 2]."""
    calls.append("npu_grouped_dynamic_mx_quant")
    assert blocksize == 32 and round_mode == "rint"
    offs = [int(v) for v in group_index]
    xn, fmt = _np(x), _FMT[dst_type]
    codes, scales = R.quantize_grouped(xn, offs, fmt, R.MX32, _ALG[scale_alg])  # [C, T]
    if scale_alg == 0 and floor_zero_code0:
        b0, prev = 0, 0
        for e in offs:
            n = int(e) - prev
            z = np.repeat(scales[:, b0:b0 + R.cdiv(n, 32)] == 0, 32, axis=1)[:, :n]
            codes[:, prev:int(e)][z] = 0
            b0, prev = b0 + R.cdiv(n, 32), int(e)
    return _y(codes.T, dst_type), torch.from_numpy(_grouped_pairs(scales, offs))


def npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                       antiquant_offset=None, per_token_scale=None, group_list=None,
                       activation_input=None, activation_quant_scale=None,
                       activation_quant_offset=None, split_item=0, group_type=None,
                       group_list_type=0, act_type=0, output_dtype=None, scale_dtype=None,
                       per_token_scale_dtype=None):
    """MX operands only. group_type 0 (split-M): x [T, K], weight [G, K, N], scale [G, K/64, N,
    2], per_token_scale [T, K/64, 2]; group_type 2 (split-K): x [M, T], weight [T, N], both
    grouped along T (scale [P, N, 2], per_token_scale [M, P, 2]). Returns [out]."""
    calls.append("npu_grouped_matmul")
    assert group_list_type == 0 and split_item == 3 and len(x) == len(weight) == 1
    offs = [int(v) for v in group_list]
    a, w = _decode(x[0]), _decode(weight[0])
    if group_type == 0:
        K = a.shape[1]
        nb = R.cdiv(K, 32)
        fa = np.repeat(_e8m0(per_token_scale[0], False, nb), 32, axis=1)[:, :K]
        out, prev = np.zeros((a.shape[0], w.shape[2])), 0
        for g, e in enumerate(offs):
            fb = np.repeat(_e8m0(scale[0][g], True, nb), 32, axis=1)[:, :K].T  # [K, N]
            with np.errstate(all="ignore"):
                out[prev:e] = (a[prev:e] * fa[prev:e]) @ (w[g] * fb)
            prev = e
    else:
        assert group_type == 2
        fa = _grouped_factors(per_token_scale[0].permute(1, 0, 2), offs, a.shape[0])  # [M, T]
        fb = _grouped_factors(scale[0], offs, w.shape[1]).T  # [T, N]
        out, prev = np.zeros((len(offs), a.shape[0], w.shape[1])), 0
        for g, e in enumerate(offs):
            with np.errstate(all="ignore"):
                out[g] = (a[:, prev:e] * fa[:, prev:e]) @ (w[prev:e] * fb[prev:e])
            prev = e
    return [torch.from_numpy(out).to(output_dtype or torch.float32)]


def _decode(t):
    return R.decode(t.view(torch.uint8).numpy(), _FMT[t.dtype]).astype(np.float64)


def _e8m0(pairs, columnwise, n):
    p = pairs.view(torch.uint8).numpy()
    if columnwise:
        p = p.transpose(1, 0, 2)
    return R.e8m0_value(p.reshape(p.shape[0], -1)[:, :n]).astype(np.float64)


def npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None,
                     output_dtype=None, x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None,
                     scale_dtype=None, group_sizes=None):
    calls.append("npu_quant_matmul")
    a, b = _decode(x1), _decode(x2)  # [M, K], [K, N]
    K = a.shape[1]
    if list(group_sizes) == [1, 1, 32]:
        nb = -(-K // 32)
        fa = np.repeat(_e8m0(pertoken_scale, False, nb), 32, axis=1)[:, :K]
        fb = np.repeat(_e8m0(scale, True, nb), 32, axis=1)[:, :K].T
    else:
        assert list(group_sizes) == [1, 128, 128]
        sa, sb = pertoken_scale.double().numpy(), scale.double().numpy()  # [M, K/128], [K/128, N/128]
        fa = np.repeat(sa, 128, axis=1)[:, :K]
        fb = np.repeat(np.repeat(sb, 128, axis=0), 128, axis=1)[:K, :b.shape[1]]
    with np.errstate(all="ignore"):
        c = (a * fa) @ (b * fb)
    return torch.from_numpy(c).to(output_dtype or torch.float32)
