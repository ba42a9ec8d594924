"""The portable Philox stream (lowp.torch.ops.philox) and ``lowp.torch.hadamard`` (issue 38
point 3), against the Random123 known-answer vectors (tests/c/test_rng.c), the C stream and the
C transform through the extension, numpy float64 ``H16 @ diag(s) @ x / 4`` and an
element-by-element numpy float32 butterfly.
"""

import numpy as np
import pytest
import torch

import lowp.torch as lt
from lowp.torch.hadamard import hadamard_signs
from lowp.torch.ops.philox import PhiloxStates, philox_block, philox_words

try:
    from lowp._numpy_api import _lowp as _ext
except Exception:  # pragma: no cover - depends on the build
    _ext = None


def _has(name):
    return _ext is not None and hasattr(_ext, name)


# ---- Philox ----

KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox_block_known_answers(ctr, key, want):
    c = [torch.tensor([v], dtype=torch.int64) for v in ctr]
    assert tuple(int(t) for t in philox_block(*c, *key)) == want


@pytest.mark.skipif(not _has("philox_fill"), reason="needs the extension's philox_fill")
@pytest.mark.parametrize("seed,offset,n", [(0, 0, 8), (1234, 3, 101), (2**63 - 1, 2**40 + 1, 37),
                                           (2**64 - 1, 2**34 - 2, 9), (7, 2**62 - 5, 13)])
def test_philox_words_equal_c_stream(seed, offset, n):
    want = np.zeros(n, dtype=np.uint32)
    _ext.philox_fill(seed, offset, want, n)
    got = philox_words(seed, offset, n).numpy()
    assert got.dtype == np.int64 and got.min() >= 0 and got.max() < 2**32
    np.testing.assert_array_equal(got.astype(np.uint32), want)


def test_philox_word_on_the_host_equals_the_tensor_stream():
    from lowp.torch.ops.philox import philox_word
    for seed, off in [(0, 0), (1234, 7), (2**64 - 1, 2**63 + 5), (3, 2**34 - 1)]:
        assert philox_word(seed, off) == int(philox_words(seed, off, 1)[0])


def test_philox_words_bad_arguments():
    with pytest.raises(ValueError, match="seed"):
        philox_words(-1, 0, 4)
    with pytest.raises(ValueError, match="n"):
        philox_words(0, 0, -1)
    with pytest.raises(TypeError, match="offset"):
        philox_words(0, 1.5, 4)
    assert philox_words(3, 9, 0).numel() == 0


def test_philox_states_take_advances():
    s = PhiloxStates(10)
    assert s.take("stochastic_rounding", 5) == (11, 0)
    assert s.take("stochastic_rounding", 2) == (11, 5)
    assert s.take("hadamard", 1) == (12, 0)
    saved = s.get_states()
    s.take("hadamard", 1)
    s.set_states(saved)
    assert s.take("hadamard", 1) == (12, 1)
    with pytest.raises(ValueError, match="name"):
        s.take("dropout", 1)


# ---- the Hadamard transform ----

H16 = np.array([[(-1) ** bin(i & j).count("1") for j in range(16)] for i in range(16)],
               dtype=np.float64)


def _butterfly_np(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The spec's order of operations, one element at a time in numpy float32."""
    y = x.astype(np.float32).copy()
    for blk in range(y.shape[-1] // 16):
        for r in range(y.shape[0]):
            t = [np.float32(s[i]) * y[r, blk * 16 + i] for i in range(16)]
            for h in (1, 2, 4, 8):
                for i in range(16):
                    if i & h == 0:
                        a, b = t[i], t[i + h]
                        t[i], t[i + h] = np.float32(a + b), np.float32(a - b)
            for i in range(16):
                y[r, blk * 16 + i] = np.float32(t[i] * np.float32(0.25))
    return y


def test_hadamard_float64_reference_and_bits():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 53, generator=g) * torch.exp2(torch.randint(-20, 20, (6, 53), generator=g))
    y = lt.hadamard(x, seed=77, offset=5)
    s = hadamard_signs(77, 5).double().numpy()
    w = philox_words(77, 5, 1).item()
    assert list(s) == [-1.0 if (w >> i) & 1 else 1.0 for i in range(16)]
    xb = x[:, :48].double().numpy().reshape(6, 3, 16)
    ref = np.einsum("ij,rbj->rbi", H16 @ np.diag(s), xb).reshape(6, 48) / 4
    scale = np.abs(xb).sum(-1, keepdims=True).repeat(16, -1).reshape(6, 48) / 4
    err = np.abs(y[:, :48].double().numpy() - ref)
    assert (err <= 4 * 2.0**-24 * scale).all()  # four rounded adds on partial sums <= scale
    assert torch.equal(y[:, 48:], x[:, 48:])  # the partial last block is left as it is
    np.testing.assert_array_equal(y.numpy().view(np.int32),
                                  _butterfly_np(x.numpy(), s).view(np.int32))


def test_hadamard_bf16_nan_inf_and_groups():
    x = torch.randn(3, 40).to(torch.bfloat16)
    assert torch.equal(lt.hadamard(x, 1, 2), lt.hadamard(x.float(), 1, 2))
    z = torch.randn(2, 32)
    z[0, 3] = float("nan")
    z[1, 20] = float("inf")
    y = lt.hadamard(z, 4, 0)
    assert torch.isnan(y[0, :16]).all() and not torch.isnan(y[0, 16:]).any()
    assert torch.isinf(y[1, 16:]).all() or torch.isnan(y[1, 16:]).any()
    # groups restart the blocks; a group's short tail and the columns past offs[-1] stay
    g = torch.randn(2, 60)
    y = lt.hadamard(g, 9, 3, offs=[20, 52])
    assert torch.equal(y[:, :16], lt.hadamard(g[:, :16], 9, 3))
    assert torch.equal(y[:, 16:20], g[:, 16:20])
    assert torch.equal(y[:, 20:52], lt.hadamard(g[:, 20:52], 9, 3))
    assert torch.equal(y[:, 52:], g[:, 52:])
    with pytest.raises(ValueError, match="offs"):
        lt.hadamard(g, 0, 0, offs=[30, 20])
    with pytest.raises(TypeError, match="x"):
        lt.hadamard(np.zeros((2, 16)))


@pytest.mark.skipif(not _has("hadamard16"), reason="needs the extension's hadamard16")
@pytest.mark.parametrize("rows,cols,offs", [(5, 48, None), (3, 37, None), (4, 70, [16, 33, 60]),
                                            (2, 15, None)])
def test_hadamard_equals_c(rows, cols, offs):
    g = torch.Generator().manual_seed(rows * cols)
    x = torch.randn(rows, cols, generator=g) * 1e3
    x[0, 0] = -0.0
    x[-1, -1] = 3e38
    want = torch.empty(rows, cols)
    o = None if offs is None else np.array(offs, dtype=np.int32)
    _ext.hadamard16(x.numpy(), "f32", want.numpy(), rows, cols, 123, 45, o, 1)
    got = lt.hadamard(x, 123, 45, offs=offs)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
