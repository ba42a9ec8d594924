"""lowp's NVFP4 quantization (kind nv16, through the lowp::quantize op) next to torchao 0.18's
own reference, `torchao.prototype.mx_formats.nvfp4_tensor.nvfp4_quantize` with the per-tensor
scale of `per_tensor_amax_to_scale` (issue 38 point 4).

The two differ on ordinary blocks only where docs/numerics.md section 10 says (items 6-8): the
tensor scale (`1 / (2688 / amax)` against `amax / 2688`), the block scale's binary32 value
before its E4M3 cast (`bamax * (S * (1/6))` against `(bamax / 6) / (amax / 2688)`, the latter
clamped to [2^-6, 448]) and the element factor (`1 / (decode(code) * D)` against
`(1 / P) / decode(code)`). Each test recomputes both sides from those formulas in numpy binary32
arithmetic with ml_dtypes casts (independent of both libraries), requires each library's bytes
to equal its own formula's, and requires every byte where lowp and torchao differ to be one
where the named intermediate value differs: a difference of any other kind fails."""

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
nvt = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")

from lowp.torch.ops import native  # noqa: E402
from lowp.torch.ops.layout import nv_split  # noqa: E402

pytestmark = pytest.mark.skipif(not native.available(), reason="needs lowp's C extension")

F32 = np.float32
SIXTH = F32(1.0) / F32(6.0)


def e4m3(v):
    """E4M3 codes of non-negative binary32 values (RNE; satfinite at 448)."""
    v = np.minimum(v.astype(F32), F32(448.0))
    return v.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def e4m3_value(c):
    return c.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)


def e2m1(v):
    """E2M1 codes (4 bits, sign at bit 3) of binary32 values (RNE; satfinite at 6)."""
    v = np.clip(v.astype(F32), F32(-6.0), F32(6.0))
    return v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF


def unpack(p, cols):
    p = np.asarray(p, np.uint8)
    return np.stack([p & 0xF, p >> 4], -1).reshape(p.shape[0], -1)[:, :cols]


def lowp_bytes(x):
    """(element codes [R, C], block codes [R, C/16], D) of lowp's nv16 copy of x."""
    R, C = x.shape
    d, s, _, _ = torch.ops.lowp.quantize(torch.from_numpy(x), "e2m1", "nv16", "", -1, 0.0, "row")
    blocks, dd = nv_split(s, R, C // 16)
    return unpack(d.numpy(), C), blocks.numpy(), F32(dd.item())


def torchao_bytes(x):
    """The same of torchao's nvfp4_quantize with per_tensor_amax_to_scale(amax)."""
    t = torch.from_numpy(x)
    p = nvt.per_tensor_amax_to_scale(t.abs().amax())
    sc, data = nvt.nvfp4_quantize(t, 16, p)
    return unpack(data.numpy(), x.shape[1]), sc.view(torch.uint8).numpy(), F32(p.item())


def models(x):
    """Both libraries' bytes from the section-10 formulas, with the intermediates that differ:
    {"lowp": (codes, blocks, D), "ao": (...), "v": (lowp's, torchao's block value),
    "f": (element factors)}."""
    R, C = x.shape
    xb = x.reshape(R, C // 16, 16)
    amax, bamax = np.abs(x).max(), np.abs(xb).max(-1)
    s = F32(2688.0) / amax
    d, p = F32(1.0) / s, amax / F32(2688.0)
    v_l, v_a = bamax * (s * SIXTH), (bamax / F32(6.0)) / p
    c_l, c_a = e4m3(v_l), e4m3(np.maximum(v_a, F32(2.0 ** -6)))
    with np.errstate(divide="ignore"):  # code 0x00: +Inf, which lowp replaces by FLT_MAX
        f_l = F32(1.0) / (e4m3_value(c_l) * d)
    f_l = np.where(np.isinf(f_l), np.finfo(F32).max, f_l).astype(F32)
    f_a = (F32(1.0) / p) / e4m3_value(c_a)
    q_l = e2m1(xb * f_l[:, :, None]).reshape(R, C)
    q_a = e2m1(xb * f_a[:, :, None]).reshape(R, C)
    return {"lowp": (q_l, c_l, d), "ao": (q_a, c_a, p), "v": (v_l, v_a), "f": (f_l, f_a)}


def ordinary(rows, cols, seed, amax):
    """Finite blocks whose amaxes lie within 2^-10 of the tensor's (no clamp in torchao), with
    elements spread over the E2M1 grid and its ties."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (rows, cols)) * np.exp2(rng.uniform(-10, 0, (rows, cols // 16, 1))
                                                   ).repeat(16, -1).reshape(rows, cols)
    x = x.astype(F32)
    x[0, :8] = F32([0.75, 1.25, 2.5, 5, -0.25, -1.75, 3.5, -6]) / F32(6.0)
    x = (x / np.abs(x).max() * F32(amax)).astype(F32)
    x[1, 5] = F32(amax)
    return x


def check_differences(x):
    """Each library equals its own formula; every difference is one of items 6-8. Returns
    (tensor scales differ, blocks that differ, elements that differ)."""
    m = models(x)
    lq, lb, ld = lowp_bytes(x)
    aq, ab, ap = torchao_bytes(x)
    assert np.array_equal(lq, m["lowp"][0]) and np.array_equal(lb, m["lowp"][1])
    assert ld.view(np.uint32) == m["lowp"][2].view(np.uint32)
    assert np.array_equal(aq, m["ao"][0]) and np.array_equal(ab, m["ao"][1])
    assert ap.view(np.uint32) == m["ao"][2].view(np.uint32)
    # item 6: the tensor scales, at most one ulp apart
    assert abs(int(ld.view(np.int32)) - int(ap.view(np.int32))) <= 1
    # item 7: a block code differs only where the binary32 value before the cast differs or
    # torchao clamped it to 2^-6
    blk = lb != ab
    assert not (blk & (m["v"][0] == m["v"][1]) & (m["v"][1] >= F32(2.0 ** -6))).any()
    # item 8: in a block with the same code, an element differs only where the factor differs
    R, C = x.shape
    el = (lq != aq).reshape(R, C // 16, 16).any(-1)
    assert not (el & ~blk & (m["f"][0] == m["f"][1])).any()
    return bool(ld != ap), int(blk.sum()), int((lq != aq).sum())


@pytest.mark.parametrize("amax", [1.0, 2688.0, 2688.0 * 2.0 ** 7, 2688.0 * 2.0 ** -9,
                                  np.nextafter(F32(2688.0), F32(0)), 3.0e4, 7.0e-3])
@pytest.mark.parametrize("seed", [1, 2])
def test_ordinary_blocks_differ_only_as_section_10_says(amax, seed):
    check_differences(ordinary(64, 256, seed, amax))


def test_most_bytes_are_identical_and_some_differ_as_named():
    """Over many tensors, items 6-8 each occur (so the classification is exercised) and the
    bytes that differ are few."""
    n6 = blocks = elems = total_b = total_e = 0
    for seed in range(40):
        amax = float(np.exp2(np.random.default_rng(seed).uniform(-20, 20)))
        d6, b, e = check_differences(ordinary(32, 128, 100 + seed, amax))
        n6, blocks, elems = n6 + d6, blocks + b, elems + e
        total_b, total_e = total_b + 32 * 8, total_e + 32 * 128
    assert n6 > 0 and elems > 0
    assert blocks < total_b // 50 and elems < total_e // 200


def test_tiny_blocks_take_torchao_clamped_scale():
    """Item 7's clamp: a block whose amax is below 2^-6 / 448 of the tensor's gets torchao's
    scale code 0x08 (2^-6); lowp keeps an E4M3 subnormal code or 0x00."""
    x = ordinary(4, 64, 3, 2688.0)
    x[2, 16:32] *= F32(2.0 ** -20)
    x[3, 32:48] *= F32(2.0 ** -30)
    check_differences(x)
    _, lb, _ = lowp_bytes(x)
    _, ab, _ = torchao_bytes(x)
    assert ab[2, 1] == ab[3, 2] == 0x08
    assert lb[2, 1] < 0x08 and lb[3, 2] == 0x00
