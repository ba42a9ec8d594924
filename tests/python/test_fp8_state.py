"""Delayed-scaling FP8 state of the param swap (issue 12 point 7): the extra-state blob byte for
byte against the C library (src/train/extra_state.c through lowp._testing) and the committed
fixture, the update rule against C's lowp_delayed_update, corrupt blobs, placement, and the
owning module's get_extra_state / set_extra_state. Where the extension is importable, a CPU
state updates and every blob is packed and read by the C code itself; the tests marked `impl`
run both that path and the torch implementation (which other devices and hosts without the
extension run) against the C reference."""

import copy
import io
import os
import struct
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn

import lowp._testing as T
import lowp.torch as lt
from lowp.torch import state as fs

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "extra_state_v1.bin")
FORMATS = ("e4m3", "e4m3", "e5m2")


@pytest.fixture(params=["c", "torch"])
def impl(request, monkeypatch):
    """"c": lowp.torch.state as it runs here (the extension's code for the update on the CPU
    and the blob); "torch": its torch implementation, as without the extension (the blob's
    Python code, lowp::delayed_update's portable kernel)."""
    if request.param == "torch":
        monkeypatch.setattr(fs, "_ext", None)
        with lt.kernel_preference("portable"):  # lowp::delayed_update's portable kernel
            yield request.param
        return
    yield request.param


def random_state(L, seed):
    g = np.random.default_rng(seed)
    hist = (g.random((3, L), dtype=np.float32) * np.float32(2.0) ** g.integers(-20, 20, (3, L))
            ).astype(np.float32)
    hist[:, g.integers(0, L)] = 0.0
    scales = (g.random(3, dtype=np.float32) * 1000 + 1e-3).astype(np.float32)
    return hist, scales


@pytest.mark.parametrize("L", [1, 4, 17, 1024])
@pytest.mark.parametrize("algo,margin", [("max", 0.0), ("most_recent", 2.0)])
def test_pack_bytes_equal_c(L, algo, margin, impl):
    hist, scales = random_state(L, L)
    want = T.extra_state_pack(hist, scales, FORMATS, margin, algo)
    got = fs.pack_blob(torch.from_numpy(hist), torch.from_numpy(scales), FORMATS, margin, algo)
    assert got == bytes(want)


@pytest.mark.parametrize("L,Lm", [(4, 4), (8, 3), (3, 8), (1, 5), (5, 1)])
def test_unpack_equals_c(L, Lm, impl):
    hist, scales = random_state(L, 100 + L)
    blob = T.extra_state_pack(hist, scales, FORMATS)
    ch, cs = T.extra_state_unpack(blob, Lm, FORMATS)
    ph, ps = fs.unpack_blob(blob, FORMATS, Lm)
    assert np.array_equal(ph.numpy().view(np.uint32), ch.view(np.uint32))
    assert np.array_equal(ps.numpy().view(np.uint32), cs.view(np.uint32))


def test_fixture_values_and_repack(impl):
    """The committed fixture (written from the spec by tests/fixtures/make_extra_state_fixture.py)."""
    with open(FIXTURE, "rb") as f:
        blob = f.read()
    hist, scales = fs.unpack_blob(blob, FORMATS, 4)
    assert hist.tolist() == [[0.0, 1.0, 4.0, 2.0], [0.0, 0.25, 0.5, 0.375],
                             [0.125, 0.0078125, 0.015625, 0.01171875]]
    assert scales.tolist() == [448.0 / 4.0, 448.0 / 0.5, 57344.0 / 0.015625]
    assert fs.pack_blob(hist, scales, FORMATS) == blob
    # The same bytes through a module's state.
    st = fs.DelayedScalingState(FORMATS, history_len=4)
    st.load_blob(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
    assert st.state_blob() == blob


def _corrupt_cases(blob):
    b = bytearray(blob)
    cases = {"truncated": bytes(b[:10]), "short": bytes(b[:-1]), "trailing": bytes(b) + b"\0"}
    m = bytearray(b)
    m[0] ^= 1
    cases["magic"] = bytes(m)
    c = bytearray(b)
    c[40] ^= 0x10
    cases["crc"] = bytes(c)

    def with_crc(body):
        body = bytes(body[:-4])
        return body + struct.pack("<I", zlib.crc32(body) & 0xFFFFFFFF)

    v = bytearray(b)
    v[8] = 2
    cases["version"] = with_crc(v)
    f = bytearray(b)
    f[40] = 9  # role 2's format
    cases["format code"] = with_crc(f)
    f2 = bytearray(b)
    f2[40] = 3  # e4m3 where the module has e5m2
    cases["format mismatch"] = with_crc(f2)
    s = bytearray(b)
    struct.pack_into("<f", s, 44 + 4 * 4, -1.0)  # role 0's scale
    cases["scale"] = with_crc(s)
    a = bytearray(b)
    struct.pack_into("<f", a, 44, -2.0)  # role 0, row 0
    cases["amax"] = with_crc(a)
    g = bytearray(b)
    struct.pack_into("<I", g, 28, 7)  # algorithm
    cases["algo"] = with_crc(g)
    return cases


def test_corrupt_blob_clear_error_state_untouched(impl):
    with open(FIXTURE, "rb") as f:
        blob = f.read()
    st = fs.DelayedScalingState(FORMATS, history_len=4)
    st.amax_history.fill_(0.5)
    st.scales.fill_(7.0)
    before = st.state_blob()
    for name, bad in _corrupt_cases(blob).items():
        with pytest.raises(ValueError, match="set_extra_state"):
            st.load_blob(bad)
        assert st.state_blob() == before, name
        # The C reader refuses the same blobs.
        with pytest.raises((ValueError, RuntimeError)):
            T.extra_state_unpack(bad, 4, FORMATS)
    with pytest.raises(TypeError, match="uint8"):
        st.load_blob(torch.zeros(4, dtype=torch.float32))


def test_legacy_bytesio_and_bytes_accepted():
    with open(FIXTURE, "rb") as f:
        blob = f.read()
    for form in (io.BytesIO(blob), blob, torch.frombuffer(bytearray(blob), dtype=torch.uint8)):
        st = fs.DelayedScalingState(FORMATS, history_len=4)
        st.load_blob(form)
        assert st.scales.tolist() == [112.0, 896.0, 3670016.0]


def _c_update(hist, scale, margin, algo):
    h = hist.copy()
    out = []
    for r in range(3):
        row = np.ascontiguousarray(h[r])
        s, _ = T.delayed_update(row, float(scale[r]), FORMATS[r], margin, algo)
        h[r] = row
        out.append(s)
    return h, np.array(out, np.float32)


@pytest.mark.parametrize("algo,margin", [("max", 0.0), ("most_recent", 0.0), ("max", 3.0)])
def test_update_equals_c(algo, margin, impl):
    L = 6
    st = fs.DelayedScalingState(FORMATS, history_len=L, margin=margin, amax_compute_algo=algo)
    ch = np.zeros((3, L), np.float32)
    cs = np.ones(3, np.float32)
    g = np.random.default_rng(1)
    amaxes = [[1.5, 0.0, 3e-3], [0.0, 0.0, 0.0], [float("inf"), 2.0, 1e-30], [1e-44, 5.0, 1e4],
              [float("nan"), 0.25, 7.0]] + [list(g.random(3) * 100) for _ in range(8)]
    for step in amaxes:
        for r, role in enumerate(fs.ROLES):
            st.record(role, torch.tensor(step[r], dtype=torch.float32))
            row = np.ascontiguousarray(ch[r])
            T.delayed_record(row, float(np.float32(step[r])), FORMATS[r])
            ch[r] = row
        assert np.array_equal(st.amax_history.numpy().view(np.uint32), ch.view(np.uint32))
        st.update()
        ch, cs = _c_update(ch, cs, margin, algo)
        assert np.array_equal(st.amax_history.numpy().view(np.uint32), ch.view(np.uint32))
        assert np.array_equal(st.scales.numpy().view(np.uint32), cs.view(np.uint32)), step


def test_cpu_state_runs_the_c_code(monkeypatch):
    """With the extension, a CPU state's update and its blobs are the C library's: the torch
    implementation is not called."""
    def fail(*a, **k):
        raise AssertionError("the torch implementation ran")
    monkeypatch.setattr(fs, "_pack_torch", fail)
    monkeypatch.setattr(fs, "_unpack_torch", fail)
    st = fs.DelayedScalingState(FORMATS, history_len=4, margin=1.0)
    st.record("input", torch.tensor(3.0))
    lt.reset_stats()
    st.update()
    assert lt.stats()["delayed_update.native"] == 1 and not lt.stats()["portable"]
    assert st.scales[0].item() == float(np.float32(224.0) / np.float32(3.0)) and st.amax_history[0, -1].item() == 3.0
    blob = st.state_blob()
    assert blob == bytes(T.extra_state_pack(st.amax_history.numpy(), st.scales.numpy(),
                                            FORMATS, 1.0))
    st.load_blob(blob)
    with pytest.raises(ValueError, match="set_extra_state: CRC"):
        st.load_blob(blob[:-1] + bytes([blob[-1] ^ 1]))


def _delayed_model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    lt.apply_recipe(m, "fp8_delayed")
    return m


def _train(m, steps, accum=1, seed=0):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for _ in range(accum):
            x = torch.randn(16, 32, generator=g)
            m(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def test_prepared_model_state_updates_once_per_step():
    m = _delayed_model()
    st = m[0]._lowp_fp8_state
    assert st is not m[2]._lowp_fp8_state
    assert st.device == torch.device("cpu") and st.amax_history.dtype == torch.float32
    _train(m, 3, accum=2)
    # updates run at the first forward after each optimizer step: steps 2 and 3
    assert st.updates == 2
    # two micro-batches per step: each forward records input and weight (it quantizes the
    # weight afresh; the same values within a step, so the step's maximum is unchanged)
    assert st.records["input"] == 6 and st.records["grad_output"] == 6
    assert st.records["weight"] == 6
    assert (st.scales != 1).all()
    # the scale in use is fmax / max(history) of the weight role at the last update (row 0
    # is this step's staging row, recorded after it), in binary32 as C computes it
    h = st.amax_history[1, 1:]
    assert float(st.scales[1]) == float(np.float32(448.0) / np.float32(h.max()))


def test_module_extra_state_roundtrip_and_device():
    m = _delayed_model()
    _train(m, 3)
    sd = m.state_dict()
    assert sd["0._extra_state"].dtype == torch.uint8
    blob = bytes(sd["0._extra_state"].numpy())
    assert blob == fs.pack_blob(m[0]._lowp_fp8_state.amax_history,
                                m[0]._lowp_fp8_state.scales, FORMATS)
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    sd2 = torch.load(buf, weights_only=True)
    m2 = _delayed_model()
    m2.load_state_dict(sd2)
    for i in (0, 2):
        a, b = m[i]._lowp_fp8_state, m2[i]._lowp_fp8_state
        assert torch.equal(a.amax_history, b.amax_history) and torch.equal(a.scales, b.scales)
        assert b.device == m2[i].weight.device
    # a corrupt blob in a state dict: clear error, state untouched
    bad = dict(sd2)
    t = bad["0._extra_state"].clone()
    t[20] ^= 1
    bad["0._extra_state"] = t
    before = m2[0]._lowp_fp8_state.state_blob()
    with pytest.raises(ValueError, match="CRC"):
        m2.load_state_dict(bad)
    assert m2[0]._lowp_fp8_state.state_blob() == before


def test_state_follows_module_device_not_dtype():
    """The state follows its weights' device, never their dtype. The module keeps torch's own
    class (no _apply of lowp's): the state moves at its weights' next use, and in fp8_states
    and load_state_dict."""
    m = _delayed_model()
    m.to(torch.bfloat16)
    st = m[0]._lowp_fp8_state
    assert st.amax_history.dtype == torch.float32
    m.to("meta")
    m(torch.randn(4, 32, dtype=torch.bfloat16, device="meta"))
    assert st.device.type == "meta"
    assert st.amax_history.dtype == torch.float32
    assert m[2]._lowp_fp8_state.device.type == "meta"
    m2 = _delayed_model()
    m2.to("meta")
    assert [s.device.type for _, s in lt.fp8_states(m2)] == ["meta", "meta"]


def test_synchronize_picks_the_state_device(monkeypatch):
    """A state on an XPU (say) synchronizes that device through torch.accelerator when it is
    the current accelerator, else through torch.xpu; never through torch.cuda."""
    calls = []

    def boom(*a, **k):
        raise AssertionError("torch.cuda was called")

    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    monkeypatch.setattr(torch.xpu, "synchronize", lambda d=None: calls.append(("xpu", d)))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    fs.synchronize_device(torch.device("cpu"))
    assert calls == []
    fs.synchronize_device("xpu:1")
    assert calls == [("xpu", torch.device("xpu:1"))]
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("xpu"))
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda d=None: calls.append(("acc", d)))
    fs.synchronize_device("xpu:0")
    assert calls[-1] == ("acc", torch.device("xpu:0"))


def _saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _hook_counts(mod):
    return len(mod._state_dict_hooks), len(mod._load_state_dict_pre_hooks)


def test_extra_state_through_hooks_class_kept_and_copies_own_theirs():
    """The module keeps its class; two hooks of its own write and read `<prefix>_extra_state`,
    and a deep copy or a whole-module pickle has them too, each with its own state."""
    m = _delayed_model()
    assert type(m[0]) is nn.Linear and type(m[2]) is nn.Linear
    assert _hook_counts(m[0]) == (1, 1) and _hook_counts(m[1]) == (0, 0)
    _train(m, 2)
    sd = m.state_dict()
    assert list(sd) == ["0.weight", "0.bias", "0._extra_state",
                        "2.weight", "2.bias", "2._extra_state"]
    for m2 in (copy.deepcopy(m), _saved(m)):
        assert type(m2[0]) is nn.Linear and _hook_counts(m2[0]) == (1, 1)
        st2 = m2[0]._lowp_fp8_state
        assert st2 is not m[0]._lowp_fp8_state
        st2.scales.fill_(3.0)  # the copy's own state is what its state dict holds
        blob2 = bytes(m2.state_dict()["0._extra_state"].numpy())
        assert blob2 == fs.pack_blob(st2.amax_history, st2.scales, FORMATS)
        assert blob2 != bytes(sd["0._extra_state"].numpy())
        m2.load_state_dict(sd)  # strict: the key is read, not reported unexpected
        assert st2.state_blob() == m[0]._lowp_fp8_state.state_blob()


def test_extra_state_missing_unexpected_and_convert_removes_hooks():
    m = _delayed_model()
    _train(m, 1)
    sd = m.state_dict()
    no_x = {k: v for k, v in sd.items() if not k.endswith("_extra_state")}
    r = m.load_state_dict(no_x, strict=False)
    assert r.missing_keys == ["0._extra_state", "2._extra_state"] and not r.unexpected_keys
    with pytest.raises(RuntimeError, match="Missing key.*0._extra_state"):
        m.load_state_dict(no_x)
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    r = plain.load_state_dict(sd, strict=False)
    assert r.unexpected_keys == ["0._extra_state", "2._extra_state"]
    lt.convert(m)
    for i in (0, 2):
        assert type(m[i]) is nn.Linear and _hook_counts(m[i]) == (0, 0)
        assert not hasattr(m[i], "_lowp_fp8_state")
    assert list(m.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    with pytest.raises(RuntimeError, match="Unexpected key.*0._extra_state"):
        m.load_state_dict(sd)


class _Owner(nn.Module):
    """A module with a delayed-scaled 3-D weight of its own and a child with another."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 64, 32))
        self.lin = nn.Linear(32, 64)


def test_extra_state_key_keeps_get_extra_state_place():
    """`_extra_state` sits where torch's get_extra_state puts it (Module._save_to_state_dict):
    after the module's own tensors, before its children's."""
    from torchao.quantization import quantize_

    m = _Owner()
    quantize_(m, lt.ParamSwapConfig(weight_config=lt.Float8TensorwiseConfig(delayed=True)),
              filter_fn=lt.param_swap_filter)
    assert list(m.state_dict()) == ["w", "_extra_state", "lin.weight", "lin.bias",
                                    "lin._extra_state"]
