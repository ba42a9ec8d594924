"""Issue 39.2: `patch_torchtitan()` / `unpatch_torchtitan()`, torchtitan 0.3 on the CPU.

Each fix is checked against what torchtitan does without it (the unpatched call fails, or
gives "cuda"), and against an independent reference where it computes something: the SDPA
stand-in for FlexAttention against attention written out in float64 with the mask built by
loops; the token dispatcher's indices against a hand-worked layout; FSDP2's gradients over
gloo against the gradient of the summed losses computed without FSDP. The patch is all or
nothing (a refused version or a missing name changes nothing) and fully undone."""

import socket

import pytest
import torch

torchtitan = pytest.importorskip("torchtitan")
pytest.importorskip("torchao")

import lowp.torch.patches as P  # noqa: E402
from lowp.torch.patches import torchtitan_patch as TP  # noqa: E402

NO_ACCEL = torch._utils._get_available_device_type() is None


@pytest.fixture(autouse=True)
def _unpatched():
    P.unpatch_torchtitan()
    P.unpatch_torchao()
    yield
    P.unpatch_torchtitan()
    P.unpatch_torchao()


def _bindings():
    """(owner, name) -> object now bound, over every target."""
    out = {}
    for module, name, _, _ in TP._targets():
        owner = TP._resolve(module)
        out[(module, name)] = (vars(owner).get(name) if isinstance(owner, type)
                               else getattr(owner, name, None))
    return out


def test_exports():
    assert P.patch_torchtitan is TP.patch_torchtitan
    assert P.unpatch_torchtitan is TP.unpatch_torchtitan


def test_untested_version_patches_nothing(monkeypatch):
    before = _bindings()
    monkeypatch.setattr(torchtitan, "__version__", "0.2.1")
    with pytest.raises(RuntimeError, match=r"torchtitan 0\.2\.1 is not a tested version.*"
                                           r"nothing was patched"):
        P.patch_torchtitan()
    assert not P.torchtitan_patched()
    assert _bindings() == before


def test_missing_name_patches_nothing(monkeypatch):
    import torchao.prototype.moe_training.ep.permute as perm
    before = _bindings()
    monkeypatch.delattr(perm, "generate_permute_indices")  # the last target
    with pytest.raises(RuntimeError, match="lacks torchao.prototype.moe_training.ep.permute."
                                           "generate_permute_indices; nothing was patched"):
        P.patch_torchtitan()
    assert not P.torchtitan_patched()
    after = _bindings()
    del before[("torchao.prototype.moe_training.ep.permute", "generate_permute_indices")]
    del after[("torchao.prototype.moe_training.ep.permute", "generate_permute_indices")]
    assert after == before


def test_patch_and_unpatch_restore_every_object():
    before = _bindings()
    P.patch_torchtitan()
    P.patch_torchtitan()  # idempotent
    assert P.torchtitan_patched()
    now = _bindings()
    changed = {k for k in before if now[k] is not before[k]}
    host_only = {(m, n) for m, n, _, h in TP._targets() if h}
    expect = set(before) - (set() if NO_ACCEL else host_only)
    assert changed == expect
    P.unpatch_torchtitan()
    assert not P.torchtitan_patched()
    after = _bindings()
    assert all(after[k] is before[k] for k in before)


@pytest.mark.skipif(not NO_ACCEL, reason="the device fixes apply with no accelerator")
def test_device_helpers_on_the_host(monkeypatch):
    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.utils as dutils
    import torchtitan.tools.utils as tutils
    assert tutils.device_type == "cuda"  # torchtitan's fallback, tools/utils.py:55
    with pytest.raises(AttributeError):
        torch.cpu.memory_stats  # noqa: B018  what metrics.py:62 calls
    assert torch.cpu.current_device() == "cpu"  # what distributed/utils.py:586 passes
    P.patch_torchtitan()
    assert tutils.device_type == "cpu" and metrics.device_type == "cpu"
    assert dutils.device_module.current_device() == 0
    mon = metrics.DeviceMemoryMonitor("cpu")  # torch.cuda calls before the patch
    stats = mon.get_peak_stats()
    assert 0 < stats.max_active_gib <= mon.device_capacity_gib
    assert stats.num_alloc_retries == 0 and stats.num_ooms == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert tutils.get_local_device() == torch.device("cpu", 0)  # one host device


def _attention_reference(q, k, v, allowed, scale):
    """float64 softmax attention, (B, L, N, H) layout, `allowed[b][i][j]` a Python bool."""
    q, k, v = (t.detach().double() for t in (q, k, v))
    B, L, N, _ = q.shape
    s = torch.einsum("bind,bjnd->bnij", q, k) * scale
    mask = torch.tensor(allowed).view(B, 1, L, L)
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("bnij,bjnd->bind", torch.softmax(s, dim=-1), v)


def _doc_causal(B, L):
    """torchtitan's block-causal mask (causal and same document) as a BlockMask, the document
    ids and the Python-built truth table."""
    from torch.nn.attention.flex_attention import and_masks, create_block_mask
    from torchtitan.models.common.attention import get_causal_mask_mod, get_document_mask_mod
    positions = torch.zeros(B, L, dtype=torch.long)
    starts = [[0, 5, 20], [0, 31]]
    docs = []
    for b in range(B):
        d, doc = -1, []
        for i in range(L):
            if i in starts[b]:
                d += 1
                pos = 0
            positions[b, i] = pos
            pos += 1
            doc.append(d)
        docs.append(doc)
    mm = and_masks(get_causal_mask_mod(), get_document_mask_mod(positions))
    bm = create_block_mask(mm, B, None, L, L, device="cpu")
    allowed = [[[j <= i and docs[b][i] == docs[b][j] for j in range(L)] for i in range(L)]
               for b in range(B)]
    return bm, allowed


def test_flex_attention_runs_as_sdpa_with_the_block_mask():
    from torchtitan.models.common.attention import FlexAttention
    B, L, N, H = 2, 48, 3, 16
    bm, allowed = _doc_causal(B, L)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, L, N, H, generator=g, requires_grad=True) for _ in range(3))
    fa = FlexAttention(FlexAttention.Config())
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        fa(q, k, v, attention_masks=bm, scale=0.3).sum().backward()
    P.patch_torchtitan()
    out = fa(q, k, v, attention_masks=bm, scale=0.3)
    ref = _attention_reference(q, k, v, allowed, 0.3)
    assert torch.allclose(out.double(), ref, atol=1e-5, rtol=1e-5)
    out.square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    with pytest.raises(NotImplementedError, match="score_mod"):
        fa(q, k, v, attention_masks=bm, score_mod=lambda s, b, h, i, j: s)


def test_dispatcher_indices_off_cuda():
    from torchao.prototype.moe_training.ep import permute as perm
    counts = torch.tensor([2, 0, 3], dtype=torch.int32)  # one rank, three experts
    x = torch.arange(5 * 4, dtype=torch.float32).view(5, 4)
    try:
        perm.permute_and_pad(x, counts, 1, 3, 4)
        unpatched_ok = True
    except Exception:
        unpatched_ok = False  # the Triton index kernel on CPU tensors
    assert not unpatched_ok
    P.patch_torchtitan()
    shape, out, idx, sizes, offs = perm.permute_and_pad(x, counts, 1, 3, 4)
    # groups padded to 4 (an empty expert gets 4 rows of padding); -1 is the zero row
    assert sizes.tolist() == [4, 4, 4] and offs.tolist() == [4, 8, 12]
    assert idx[:12].tolist() == [0, 1, -1, -1, -1, -1, -1, -1, 2, 3, 4, -1]
    assert torch.equal(out[:2], x[:2]) and torch.equal(out[8:11], x[2:5])
    assert not out[2:8].any() and not out[11].any()


@pytest.mark.skipif(not NO_ACCEL, reason="the gate only matters without Blackwell")
def test_mxfp8_converters_follow_patch_torchao():
    from torchtitan.components.quantization import MXFP8LinearConverter
    P.patch_torchtitan()
    with pytest.raises(ValueError, match="SM100"):
        MXFP8LinearConverter(MXFP8LinearConverter.Config())
    P.patch_torchao()
    MXFP8LinearConverter(MXFP8LinearConverter.Config())  # now runs on lowp's kernels


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("patched", [False, True])
def test_fsdp2_over_gloo_with_divide_factor_one(tmp_path, patched):
    import torch.multiprocessing as mp
    import dist_torchtitan_worker as W
    mp.spawn(W.worker, args=(2, _free_port(), str(tmp_path), patched), nprocs=2, join=True)
    res = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    if not patched:  # torchtitan's distributed/fsdp.py:41 alone: PREMUL_SUM on gloo
        assert all("error" in r for r in res), res
        assert any("PREMUL_SUM" in r["error"] or "premul" in r["error"].lower() for r in res)
        return
    assert all("grad" in r for r in res), [r.get("trace") for r in res]
    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 4, bias=False)
    loss = 0
    for rank in range(2):  # divide factor 1: the gradient of the SUM of the ranks' losses
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1 + rank))
        loss = loss + ref(x).square().sum()
    loss.backward()
    for r in res:
        assert torch.allclose(r["grad"], ref.weight.grad, rtol=1e-5, atol=1e-6)
