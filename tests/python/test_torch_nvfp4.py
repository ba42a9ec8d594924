"""NVFP4 (kinds nv16, nv16x16; docs/numerics.md 4b) in lowp.torch: the lowp:: ops' native
kernels (the C library) and portable kernels (plain torch ops) against the independent numpy
reference of tests/oracle/nvfp4_ref.py, and against each other byte for byte (element codes,
E4M3 block scales, the binary32 tensor scale) on awkward shapes, zeros, subnormals, NaN/Inf
blocks, amax near 2688 * 2^k, stacked and grouped copies (empty and ragged groups), eager and
under torch.compile(fullgraph=True); the GEMMs (plain, [K, N], split-M, split-K) within
section 6's bound of a float64 product of the dequantized operands, NaN in the same places."""

import numpy as np
import pytest
import torch

import nvfp4_ref as N
from lowp.torch.ops import library as L
from lowp.torch.ops import native
from lowp.torch.ops import portable as P
from lowp.torch.ops.layout import nv_nbytes, nv_split

pytestmark = pytest.mark.skipif(not native.available(), reason="needs lowp's C extension")


def awkward(rows, cols, seed, amax=None):
    """Varied block magnitudes plus zeros, binary32 subnormals and E2M1 ties at fixed places;
    `amax` (when given): the tensor's largest magnitude."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-12, 12, (rows, 1)))
    x = x.astype(np.float32)
    x[rows // 3, :] = 0.0
    x[4 % rows, :17] = np.float32(1e-41)
    ties = np.float32([0.75, 1.25, 2.5, 5, -0.25, -1.75, 3.5, -6])
    x[5 % rows, :8] = ties[:min(cols, 8)]
    if amax is not None:
        top = np.float32(np.max(np.abs(x)))
        x = (x / top * np.float32(amax)).astype(np.float32) if top else x
        x[0, 0] = np.float32(amax)
    return x


def with_specials(x):
    """x with a NaN block and two Inf blocks."""
    x = x.copy()
    r, c = x.shape
    x[1 % r, 3 % c] = np.nan
    x[2 % r, 40 % c] = np.inf
    x[3 % r, 7 % c] = -np.inf
    return x


def quantize(x, kind, axis="both", portable=False, offs=None):
    t = torch.from_numpy(np.ascontiguousarray(x))
    o = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    args = (t, "e2m1", kind, "", -1, 0.0, axis, o)
    if portable:
        with L.kernel_preference("portable"):
            return torch.ops.lowp.quantize(*args)
    return torch.ops.lowp.quantize(*args)


def split(scale, kind, rows, cols, offs=None):
    """(block codes [sr, sc], D) of the ops' NVFP4 scale tensor (grouped: padded bound)."""
    if offs is not None:
        sr, sc = rows, -(-cols // 16) + len(offs)
    else:
        sr, sc = P.scale_shape(kind, rows, cols)
    blocks, d = nv_split(scale, sr, sc)
    return blocks.numpy(), np.float32(d.item())


def check_copy(data, scale, want, kind, rows, cols):
    codes, scales, d = want
    got_b, got_d = split(scale, kind, rows, cols)
    assert np.array_equal(N.unpack(data.numpy(), cols), codes)
    assert np.array_equal(got_b, scales)
    assert np.float32(got_d).view(np.uint32) == np.float32(d).view(np.uint32)
    assert scale.numel() == nv_nbytes(scales.size)


CASES = [(1, 1, None), (5, 17, None), (37, 70, None), (33, 48, 2688.0), (16, 16, 2688.0 * 4),
         (20, 50, 2688.0 * 2.0 ** -20), (19, 33, 2.0 ** -120), (18, 40, 3.0e38)]


@pytest.mark.parametrize("kind", ["nv16", "nv16x16"])
@pytest.mark.parametrize("rows,cols,amax", CASES)
@pytest.mark.parametrize("special", [False, True])
def test_quantize_native_and_portable_equal_reference(kind, rows, cols, amax, special):
    """Both kernels give the reference's bytes: rowwise copy, and the columnwise copy (the
    quantization of x^T with the same tensor scale; 16x16 tiles: the rowwise copy
    transposed)."""
    x = awkward(rows, cols, rows * cols, amax)
    if special:
        x = with_specials(x)
    tiles = kind == "nv16x16"
    row = N.quantize(x, tiles)
    if tiles:
        col = (row[0].T, row[1].T, row[2])
    else:
        _, _, s_dec = row
        s_enc = N.tensor_scale(N.tensor_amax(x))[0]
        col = N.quantize_blocks(x.T, s_enc, s_dec, 1, 16) + (s_dec,)
    for portable in (False, True):
        rd, rs, cd, cs = quantize(x, kind, portable=portable)
        check_copy(rd, rs, row, kind, rows, cols)
        check_copy(cd, cs, col, kind, cols, rows)


@pytest.mark.parametrize("kind", ["nv16", "nv16x16"])
def test_quantize_bf16_input_and_stack_native_equals_portable(kind):
    """bfloat16 inputs (widened exactly) and a stack of matrices, each with its own tensor
    scale: the two kernels give the same bytes."""
    ms = [awkward(21, 35, g, 2688.0 * 2.0 ** (3 * g)) for g in range(3)]
    x = torch.from_numpy(np.stack([with_specials(ms[0])] + ms[1:])).to(torch.bfloat16)
    nat = torch.ops.lowp.quantize(x, "e2m1", kind, "", -1, 0.0, "both")
    with L.kernel_preference("portable"):
        por = torch.ops.lowp.quantize(x, "e2m1", kind, "", -1, 0.0, "both")
    for a, b in zip(nat, por):
        assert a.dtype == b.dtype == torch.uint8 and torch.equal(a, b)
    ds = {split(nat[1][g], kind, 21, 35)[1] for g in range(3)}
    assert len(ds) == 3


def boundaries(amax, seed):
    """x [48, 64] of amax `amax` whose blocks have their maxima a few ulps around the values
    where the block scale's E4M3 code changes (v = bamax * (S * sixth) at a midpoint of two
    codes) and whose elements lie a few ulps around E2M1 midpoints under their block's factor:
    where the order of each rounded step matters."""
    rng = np.random.default_rng(seed)
    s_enc, s_dec = N.tensor_scale(np.float64(np.float32(amax)))
    k = np.float32(np.float32(s_enc) * np.float32(N.SIXTH))
    vals = N.e4m3_values(np.arange(0, 0x7F, dtype=np.uint8)).astype(np.float64)
    mids = ((vals[1:] + vals[:-1]) / 2)[rng.integers(0, 125, 48 * 4)]
    bamax = (mids / np.float64(k)).astype(np.float32)
    bamax = np.nextafter(bamax, np.float32(np.inf) * rng.choice([-1, 1], bamax.shape))
    bamax = np.minimum(bamax, np.float32(amax)).reshape(48, 4)
    codes = N.block_codes(bamax.astype(np.float64), np.float64(np.float32(s_enc)))
    f = N.elem_factor(codes, s_dec).astype(np.float32)
    e2 = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])[rng.integers(0, 7, (48, 4, 16))]
    x = (e2 / f[:, :, None]).astype(np.float32)
    x = np.nextafter(x, np.float32(np.inf) * rng.choice([-1, 1], x.shape)).astype(np.float32)
    x = np.minimum(np.abs(x), bamax[:, :, None]) * rng.choice([-1, 1], x.shape)
    x[:, :, 0] = bamax * rng.choice([-1, 1], bamax.shape)
    x = x.reshape(48, 64).astype(np.float32)
    x[0, 0] = np.float32(amax)
    return x


@pytest.mark.parametrize("amax,seed", [(2688.0, 1), (2688.0 * 1.37, 2), (5.1e-3, 3),
                                       (2688.0 * 2.0 ** 11 * 1.9, 4)])
def test_quantize_at_rounding_boundaries_equals_reference(amax, seed):
    """Block maxima and elements a few ulps around the rounding boundaries of the block scale
    and of the elements: both kernels give the reference's bytes (each rounded step of 4b
    computed in its order)."""
    x = boundaries(amax, seed)
    want = N.quantize(x)
    for portable in (False, True):
        rd, rs = quantize(x, "nv16", "row", portable)[:2]
        check_copy(rd, rs, want, "nv16", 48, 64)


@pytest.mark.parametrize("offs", [[0, 5, 5, 40, 77], [77], [0, 0], [16, 32, 48], [3, 30]])
def test_grouped_quantize_equals_reference(offs):
    """Grouped columnwise copies along tokens (MoE weight gradients): blocks restart at every
    group end, empty groups hold no block, tokens past offs[-1] hold code 0, and the tensor
    scale is that of the tokens in groups (here the tail holds the largest value)."""
    x = awkward(80, 23, 7)
    x[-1, :] = 1.0e30
    codes, scales, d = N.quantize_grouped(x, offs)
    for portable in (False, True):
        _, _, cd, cs = quantize(x, "nv16", "col", portable, offs)
        got_b, got_d = split(cs, "nv16", 23, 80, offs)
        assert np.array_equal(N.unpack(cd.numpy(), 80), codes)
        assert np.array_equal(got_b[:, :scales.shape[1]], scales)
        assert not got_b[:, scales.shape[1]:].any()
        assert np.float32(got_d).view(np.uint32) == np.float32(d).view(np.uint32)


@pytest.mark.parametrize("kind", ["nv16", "nv16x16"])
@pytest.mark.parametrize("offs", [None, [0, 9, 9, 40]])
def test_dequantize_native_and_portable_equal_reference(kind, offs):
    if offs is not None and kind == "nv16x16":
        pytest.skip("16x16 tiles are not quantized in groups")
    x = with_specials(awkward(40, 37, 3, 2688.0 * 8))
    if offs is None:
        codes, scales, d = N.quantize(x, kind == "nv16x16")
        want = N.dequantize(codes, scales, d, kind == "nv16x16")
        data, scale, rows, cols = *quantize(x, kind, "row")[:2], 40, 37
    else:
        codes, scales, d = N.quantize_grouped(x, offs)
        want, start, blk = np.zeros((37, 40), np.float32), 0, 0
        for end in offs:  # each group's blocks in turn
            nb = -(-(end - start) // 16)
            want[:, start:end] = N.dequantize(codes[:, start:end], scales[:, blk:blk + nb], d)
            start, blk = end, blk + nb
        data, scale, rows, cols = *quantize(x, kind, "col", offs=offs)[2:], 37, 40
    o = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    args = (data, scale, "e2m1", kind, rows, cols, o)
    got = torch.ops.lowp.dequantize(*args)
    with L.kernel_preference("portable"):
        got_p = torch.ops.lowp.dequantize(*args)
    assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
    assert np.array_equal(got_p.numpy().view(np.uint32), want.view(np.uint32))


def deq(*args):
    """float64 values of an operand given as the dequantize op's arguments."""
    return torch.ops.lowp.dequantize(*args).double()


def within_bound(got, a, b):
    """got (float32 A . B^T) against the float64 product of the dequantized operands a, b:
    within section 6's bound for fast paths, 1e-5 of ||C||, and NaN exactly where the product
    has it (a NaN block scale of A or B)."""
    want = a @ b.t()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    ok = ~nan
    err = (got.double()[ok] - want[ok]).abs().max() if ok.any() else 0.0
    assert err <= 1e-5 * max(want[ok].norm().item(), 1e-300)
    return want


def run_both(op, *args, **kw):
    nat = op(*args, **kw)
    with L.kernel_preference("portable"):
        por = op(*args, **kw)
    return nat, por


@pytest.mark.parametrize("ka,kb", [("nv16", "nv16"), ("nv16", "nv16x16"), ("nv16x16", "nv16"),
                                   ("nv16x16", "nv16x16")])
@pytest.mark.parametrize("special", [False, True])
def test_gemm_native_and_portable_within_bound(ka, kb, special):
    M, N_, K = 19, 24, 77
    xa = awkward(M, K, 1, 2688.0 * 64)
    xb = awkward(N_, K, 2, 2688.0 * 2.0 ** -30)
    if special:
        xa[2, 20] = np.nan
        xb[4, 50] = np.inf
    ad, asc = quantize(xa, ka, "row")[:2]
    bd, bsc = quantize(xb, kb, "row")[:2]
    args = (ad, asc, "e2m1", ka, bd, bsc, "e2m1", kb, K)
    nat, por = run_both(torch.ops.lowp.scaled_mm, *args)
    a = deq(ad, asc, "e2m1", ka, M, K)
    for got in (nat, por):
        want = within_bound(got, a, deq(bd, bsc, "e2m1", kb, N_, K))
    assert bool(torch.isnan(want).any()) == special
    if kb == "nv16x16":  # b read as stored [K, N]: a copy of xb^T
        cd, cs = quantize(np.ascontiguousarray(xb.T), kb, "row")[:2]
        b = deq(cd, cs, "e2m1", kb, K, N_).t()
        for got in run_both(torch.ops.lowp.scaled_mm, ad, asc, "e2m1", ka, cd, cs, "e2m1", kb,
                            K, "f32", True):
            within_bound(got, a, b)


def test_grouped_gemm_split_m_native_and_portable_within_bound():
    """Tokens [T, K] in groups times a stack of expert weights (16x16 tiles, one tensor scale
    per expert); rows past offs[-1] are 0."""
    T, N_, K, offs = 45, 20, 40, [10, 10, 33]
    xa = with_specials(awkward(T, K, 5))
    w = np.stack([awkward(N_, K, 10 + g, 2688.0 * 4.0 ** g) for g in range(3)])
    ad, asc = quantize(xa, "nv16", "row")[:2]
    a = deq(ad, asc, "e2m1", "nv16", T, K)
    wq = torch.ops.lowp.quantize(torch.from_numpy(w), "e2m1", "nv16x16", "", -1, 0.0, "row")
    o = torch.tensor(offs, dtype=torch.int32)
    args = (ad, asc, "e2m1", "nv16", wq[0], wq[1], "e2m1", "nv16x16", o, K, False)
    for got in run_both(torch.ops.lowp.scaled_grouped_mm, *args):
        start = 0
        for g, end in enumerate(offs):
            if end > start:
                within_bound(got[start:end], a[start:end],
                             deq(wq[0][g], wq[1][g], "e2m1", "nv16x16", N_, K))
            start = end
        assert not got[offs[-1]:].any()


def test_grouped_gemm_split_k_native_and_portable_within_bound():
    """dW[g] = dY_g^T . X_g with both operands quantized along the tokens in groups (empty and
    ragged groups)."""
    T, N_, K, offs = 70, 12, 18, [0, 17, 17, 50, 66]
    dy = awkward(T, N_, 3)
    x = with_specials(awkward(T, K, 4))
    o = torch.tensor(offs, dtype=torch.int32)
    _, _, ad, asc = quantize(dy, "nv16", "col", offs=offs)
    _, _, bd, bsc = quantize(x, "nv16", "col", offs=offs)
    args = (ad, asc, "e2m1", "nv16", bd, bsc, "e2m1", "nv16", o, T, True)
    nat, por = run_both(torch.ops.lowp.scaled_grouped_mm, *args)
    a = torch.ops.lowp.dequantize(ad, asc, "e2m1", "nv16", N_, T, o).double()
    b = torch.ops.lowp.dequantize(bd, bsc, "e2m1", "nv16", K, T, o).double()
    start = 0
    for g, end in enumerate(offs):
        want = a[:, start:end] @ b[:, start:end].t()
        for got in (nat[g], por[g]):
            nan = torch.isnan(want)
            assert torch.equal(torch.isnan(got), nan)
            err = (got.double()[~nan] - want[~nan]).abs().max() if (~nan).any() else 0.0
            assert err <= 1e-5 * max(want[~nan].norm().item(), 1e-300)
        start = end


@pytest.mark.parametrize("kind", ["nv16", "nv16x16"])
def test_portable_quantize_under_torch_compile_equals_native(kind):
    """The portable NVFP4 quantization under torch.compile(fullgraph=True) gives the native
    kernel's bytes (both axes in one graph; bfloat16 input with NaN and Inf blocks)."""
    t = torch.from_numpy(with_specials(awkward(67, 150, 1, 2688.0 * 2.0 ** -7)))
    t = t.to(torch.bfloat16)

    def q(x):
        return torch.ops.lowp.quantize.portable(x, "e2m1", kind, "", -1, 0.0, "both")

    torch._dynamo.reset()
    got = torch.compile(q, fullgraph=True)(t)
    want = torch.ops.lowp.quantize(t, "e2m1", kind, "", -1, 0.0, "both")
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("kind", ["nv16", "nv16x16"])
@pytest.mark.parametrize("special", [False, True])
def test_portable_torch_code_compiled_by_inductor_equals_native(kind, special):
    """The portable quantization's torch code itself traced and compiled by inductor
    (fullgraph, not the op called from a graph): the native kernel's bytes, D included."""
    x = awkward(67, 150, 5, 2688.0 * 2.0 ** 5)
    t = torch.from_numpy(with_specials(x) if special else x).to(torch.bfloat16)

    def q(x):
        r, c = P.quantize(x, "e2m1", kind, axis="both")
        return r.qdata, r.scale, r.tensor_scale, c.qdata, c.scale, c.tensor_scale

    torch._dynamo.reset()
    got = torch.compile(q, fullgraph=True)(t)
    rd, rs, cd, cs = torch.ops.lowp.quantize(t, "e2m1", kind, "", -1, 0.0, "both")
    want = (rd, *nv_split(rs, *P.scale_shape(kind, 67, 150)),
            cd, *nv_split(cs, *P.scale_shape(kind, 150, 67)))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g.view(torch.uint8), w.view(torch.uint8))


@pytest.mark.parametrize("bad,match", [
    (dict(format="e4m3"), "NVFP4.*e2m1"), (dict(pow2=1), "pow2"), (dict(eps=1e-3), "eps"),
    (dict(scale_mode="rceil"), "scale_mode")])
def test_quantize_refuses_what_nvfp4_does_not_take(bad, match):
    kw = dict(format="e2m1", scaling="nv16", scale_mode="", pow2=-1, eps=0.0, axis="row")
    kw.update(bad)
    x = torch.ones(4, 32)
    for portable in (False, True):
        with pytest.raises(ValueError, match=match):
            if portable:
                with L.kernel_preference("portable"):
                    torch.ops.lowp.quantize(x, *kw.values())
            else:
                torch.ops.lowp.quantize(x, *kw.values())


def test_scale_tensor_of_the_wrong_size_is_refused_by_name():
    x = torch.ones(4, 32)
    d, s, _, _ = torch.ops.lowp.quantize(x, "e2m1", "nv16", "", -1, 0.0, "row")
    with pytest.raises(ValueError, match=r"lowp::dequantize: scale .*nv16"):
        torch.ops.lowp.dequantize(d, s[:-4], "e2m1", "nv16", 4, 32)


def test_check_device_passes_the_portable_kernels_on_nvfp4_keys():
    """The portable kernels, registered as a device's kernels for every NVFP4 key, pass
    check_device's edge suite against the CPU golden kernels (split-M with 16x16 tiles on A
    included: their row slices are nv16 copies with the same values)."""
    import inspect
    import lowp.torch as lt
    check = lt.check_device  # (the function; a module where an import of it shadowed it)
    check = check.check_device if inspect.ismodule(check) else check
    names = []
    try:
        for op in ("quantize", "dequantize", "scaled_mm", "scaled_grouped_mm"):
            lt.register_kernel("cpu", op, L._PORTABLE[getattr(torch.ops.lowp, op).default],
                               name=f"test.nvfp4.{op}", supports=lambda k: "nv16" in str(k))
            names.append(f"test.nvfp4.{op}")
        rep = check("cpu", kernels=names, suite="edge")
    finally:
        for n in names:
            lt.unregister_kernel(n)
    assert rep.passed and len(rep.results) > 100, rep.failures[:2]
    assert {r.op for r in rep.results} == {"quantize", "dequantize", "scaled_mm",
                                            "scaled_grouped_mm"}


@pytest.mark.parametrize("N_", [33, 32])
def test_kn_with_odd_n_takes_n(N_):
    """b read as stored [K, N] holds E2M1 codes packed along N: the ops take N from `n` (an odd
    N's last byte holds one code), split-M too."""
    M, K, offs = 9, 40, [4, 9]
    x = awkward(M, K, 11)
    wt = np.stack([awkward(K, N_, 12 + g) for g in range(2)])  # stored [K, N] per expert
    ad, asc = quantize(x, "nv16", "row")[:2]
    bq = torch.ops.lowp.quantize(torch.from_numpy(wt), "e2m1", "nv16x16", "", -1, 0.0, "row")
    a = deq(ad, asc, "e2m1", "nv16", M, K)
    b0 = deq(bq[0][0], bq[1][0], "e2m1", "nv16x16", K, N_).t()
    for got in run_both(torch.ops.lowp.scaled_mm, ad, asc, "e2m1", "nv16", bq[0][0], bq[1][0],
                        "e2m1", "nv16x16", K, "f32", True, N_):
        assert got.shape == (M, N_)
        within_bound(got, a, b0)
    o = torch.tensor(offs, dtype=torch.int32)
    for got in run_both(torch.ops.lowp.scaled_grouped_mm, ad, asc, "e2m1", "nv16", bq[0], bq[1],
                        "e2m1", "nv16x16", o, K, False, "f32", True, N_):
        assert got.shape == (M, N_)
        within_bound(got[:4], a[:4], b0)
        within_bound(got[4:], a[4:], deq(bq[0][1], bq[1][1], "e2m1", "nv16x16", K, N_).t())


def test_n_is_refused_where_it_does_not_apply():
    ad, asc = quantize(awkward(4, 32, 1), "nv16", "row")[:2]
    with pytest.raises(ValueError, match=r"n \(8\) is N of a b read as stored"):
        torch.ops.lowp.scaled_mm(ad, asc, "e2m1", "nv16", ad, asc, "e2m1", "nv16", 32, "f32",
                                 False, 8)
    with pytest.raises(ValueError, match=r"n \(-2\) must be an int >= -1"):
        torch.ops.lowp.scaled_mm(ad, asc, "e2m1", "nv16", ad, asc, "e2m1", "nv16", 32, "f32",
                                 False, -2)


def test_gemm_overflow_to_inf_in_the_same_places():
    """Tensor scales near FLT_MAX: (acc * D_A) * D_B overflows to +-Inf for the large rows and
    stays finite for the others, in both kernels; the finite outputs within the bound."""
    M, N_, K = 24, 20, 64
    rng = np.random.default_rng(8)
    xa = (rng.standard_normal((M, K)) * np.exp2(np.arange(M) * 5.0)[:, None]).astype(np.float32)
    xa *= np.float32(3.0e38) / np.abs(xa).max()
    xb = (rng.standard_normal((N_, K)) * 1.0e30).astype(np.float32)
    ad, asc = quantize(xa, "nv16", "row")[:2]
    bd, bsc = quantize(xb, "nv16x16", "row")[:2]
    nat, por = run_both(torch.ops.lowp.scaled_mm, ad, asc, "e2m1", "nv16", bd, bsc, "e2m1",
                        "nv16x16", K)
    inf = torch.isinf(nat)
    assert inf.any() and (~inf).any()
    assert torch.equal(torch.isinf(por), inf) and torch.equal(por[inf], nat[inf])
    want = deq(ad, asc, "e2m1", "nv16", M, K) @ deq(bd, bsc, "e2m1", "nv16x16", N_, K).t()
    err = (por.double()[~inf] - want[~inf]).abs().max()
    assert err <= 1e-5 * want[~inf].norm()
