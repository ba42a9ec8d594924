"""Tests of lowp.torch.trainer.model and python -m lowp.torch.trainer (issue 13).

- Philox4x32-10 against the Random123 known-answer vectors; the model's initialization and
  the first update's loss against the C trainer's (`lowp train`, env LOWP_CLI or
  build/bin/lowp) for the same seed and data.
- The MoE layer against a per-expert float64 loop; torch._grouped_mm's gradients against the
  loop's.
- Resume is bit-exact: N updates, a checkpoint, a fresh model resumed from it and N more equal
  2N updates (weights, AdamW moments, step, data position, RNG), for bf16, torchao_mxfp8 and
  every lowp recipe apply_recipe knows; an evaluation inside the run leaves no trace.
- A checkpoint is replaced atomically; a corrupt or mismatched one is refused with a message
  naming what differs.
- End to end: the compare mode on tiny, a few dozen updates, two recipes: exit 0, the loss
  falls, report.md has both rows, val_loss.svg is well-formed with one line per recipe.
"""

import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from lowp.torch.trainer import (  # noqa: E402
    CharData, MoEConfig, MoETransformer, TrainConfig, Trainer)
from lowp.torch.trainer.checkpoint import read_checkpoint  # noqa: E402
from lowp.torch.trainer.checkpoint import write_atomic as atomic_write  # noqa: E402
from lowp.torch.trainer.loop import lr_at  # noqa: E402
from lowp.torch.trainer.model import philox_words  # noqa: E402

torch.set_num_threads(1)


def _lowp_recipes():
    try:
        from lowp.torch import apply_recipe  # noqa: F401
    except ImportError:
        return []
    return ["all_mxfp8", "mix", "all_block_fp8", "fp8_delayed"]


def _cli():
    c = os.environ.get("LOWP_CLI") or os.path.join(ROOT, "build", "bin", "lowp")
    return c if os.path.exists(c) else None


# ---------------------------------------------------------------- Philox, init, data


def test_philox_known_answers():
    # Random123's kat_vectors for philox4x32_10: counter, key -> out.
    assert philox_words(0, 0, 4).tolist() == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = (0xFFFFFFFF << 32) | 0xFFFFFFFF
    # word j = lane j % 4 of block j / 4 (counter (j/4 low, j/4 high, 0, 0)); counter
    # (ffffffff, ffffffff, 0, 0) is not a KAT vector, so check the stream's structure instead.
    w = philox_words(ones, 8, 6)
    assert w.tolist() == philox_words(ones, 0, 14)[8:].tolist()


def test_data_split_and_batches():
    text = bytes(range(32, 127)) * 3
    d = CharData(text, "t")
    assert d.vocab == 95 and d.ntrain == len(text) * 9 // 10
    tok, tgt = d.batch("train", 7, 3, 4, 16)
    assert tok.shape == (4, 16) and torch.equal(tok[:, 1:], tgt[:, :-1])
    tok2, _ = d.batch("train", 7, 3, 4, 16)
    assert torch.equal(tok, tok2)
    vt, _ = d.batch("val", 7, 3, 4, 16)
    assert int(vt.min()) >= 0
    with pytest.raises(ValueError, match="split"):
        d.batch("test", 7, 0, 1, 4)
    with pytest.raises(ValueError, match="at least 20"):
        CharData(b"short", "s")


def test_the_builtin_corpus_is_the_c_librarys_with_or_without_the_extension(monkeypatch):
    """lowp.default_corpus() (the extension's copy of the C string) and, without the extension,
    the trainer's reading of the C source it is compiled from (src/*/default_corpus.c beside
    the package) give the same text."""
    import lowp  # noqa: PLC0415
    from lowp.torch.trainer import data as data_mod  # noqa: PLC0415

    text = lowp.default_corpus()
    assert isinstance(text, bytes) and len(text) > 1000 and b"\n" in text
    assert data_mod.default_corpus() == text
    monkeypatch.setitem(sys.modules, "lowp", None)  # `import lowp` raises ImportError
    assert data_mod.default_corpus() == text


def test_lr_schedule():
    c = TrainConfig(steps=100, warmup=10, lr=1e-3, min_lr=1e-4)
    assert lr_at(c, 0) == pytest.approx(1e-4)
    assert lr_at(c, 9) == pytest.approx(1e-3)
    assert lr_at(c, 10) == pytest.approx(1e-3)
    assert lr_at(c, 55) == pytest.approx(5.5e-4, rel=1e-6)
    assert lr_at(c, 100) == pytest.approx(1e-4)


@pytest.mark.skipif(_cli() is None, reason="the C CLI is not built")
def test_init_and_first_loss_match_the_c_trainer(tmp_path):
    import struct

    ck = tmp_path / "c.safetensors"
    log = tmp_path / "c.jsonl"
    subprocess.run([_cli(), "train", "--steps", "1", "--lr", "0", "--threads", "1", "--sample",
                    "0", "--checkpoint", str(ck), "--log", str(log)], check=True,
                   capture_output=True)
    raw = ck.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    data = CharData.builtin()
    assert head["__metadata__"]["data.hash"] == f"{data.hash:016x}"
    model = MoETransformer(MoEConfig.preset("tiny", data.vocab), 1234)
    c_names = [k for k in head if k != "__metadata__" and not k.startswith("optim")
               and not k.endswith("_extra_state")]
    order = model.c_order()
    assert len(c_names) == len(order)
    for cn, (pn, p, _) in zip(c_names, order):
        a, b = head[cn]["data_offsets"]
        c = np.frombuffer(body[a:b], dtype=np.float32).reshape(p.shape)
        assert np.array_equal(c, p.detach().numpy()), (cn, pn)
    # The same batch through the same weights: the first update's loss (bf16 GEMMs in both).
    c_loss = json.loads(log.read_text().splitlines()[0])["loss"]
    tok, tgt = data.batch("train", 1234, 0, 8, 32)
    with torch.no_grad():
        _, ce, _ = model(tok, tgt)
    assert abs(float(ce) - c_loss) < 2e-3, (float(ce), c_loss)


# ---------------------------------------------------------------- the model


def test_moe_layer_against_a_per_expert_loop():
    torch.manual_seed(0)
    cfg = MoEConfig(vocab=11, dim=16, layers=1, heads=2, seq_len=8, experts=4, top_k=2,
                    expert_hidden=24, shared_hidden=8)
    model = MoETransformer(cfg, 3, plain_dtype=torch.float32)
    moe = model.layers["0"].moe
    h = torch.randn(13, 16, requires_grad=True)  # 13 tokens: awkward group sizes
    y, aux = moe(h, torch.float32)
    g = torch.randn_like(y)
    (y * g).sum().backward()

    hd = h.detach().double().requires_grad_()
    ws = {k: getattr(moe.experts, k).detach().double().requires_grad_() for k in ("w1", "w2", "w3")}
    wr = moe.router.gate.weight.detach().double()
    probs = torch.softmax(hd @ wr.T, dim=-1)
    top, idx = torch.topk(probs, 2, dim=-1)
    gate = top / top.sum(-1, keepdim=True)
    sh = moe.shared_experts
    s1, s2, s3 = (m.weight.detach().double() for m in (sh.w1, sh.w2, sh.w3))
    ref = (torch.nn.functional.silu(hd @ s1.T) * (hd @ s3.T)) @ s2.T
    for n in range(13):
        for j in range(2):
            e = int(idx[n, j])
            u = torch.nn.functional.silu(hd[n] @ ws["w1"][e].T) * (hd[n] @ ws["w3"][e].T)
            ref = ref.index_add(0, torch.tensor([n]), (gate[n, j] * (u @ ws["w2"][e].T))[None])
    counts = torch.bincount(idx.reshape(-1), minlength=4).double() / 26
    ref_aux = 4 * (counts * probs.mean(0)).sum()
    (ref * g.double()).sum().backward()
    torch.testing.assert_close(y.double(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(aux.double(), ref_aux.detach(), rtol=1e-5, atol=1e-7)
    for k in ("w1", "w2", "w3"):
        torch.testing.assert_close(getattr(moe.experts, k).grad.double(), ws[k].grad,
                                   rtol=1e-4, atol=1e-6)


def test_module_names_follow_torchtitan_deepseek():
    model = MoETransformer(MoEConfig.preset("tiny", 20), 1)
    names = {n for n, _ in model.named_parameters()}
    for n in ("tok_embeddings.weight", "layers.1.attention.wq.weight",
              "layers.0.attention.wo.weight", "layers.0.moe.shared_experts.w2.weight",
              "layers.0.moe.experts.w1", "layers.0.moe.router.gate.weight",
              "layers.0.attention_norm.weight", "layers.0.ffn_norm.weight", "norm.weight",
              "output.weight"):
        assert n in names, n
    assert model.layers["0"].moe.experts.w2.shape == (4, 64, 64)
    with pytest.raises(ValueError, match="preset"):
        MoEConfig.preset("huge", 20)
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig.preset("tiny", 20, top_k=9)


# ---------------------------------------------------------------- FP8 state


@pytest.mark.skipif("fp8_delayed" not in _lowp_recipes(), reason="needs lowp.torch's recipes")
def test_every_update_ends_with_the_delayed_scaling_update():
    """The FP8 states' update runs at the end of each optimizer update
    (lowp.torch.update_fp8_states, as lowp_train_step_end in C), evaluations included: a
    trainer that skipped it (as one whose lazy import of a moved module failed silently did)
    leaves it to the next forward and has one update fewer."""
    import lowp.torch as lt  # noqa: PLC0415

    data = CharData.builtin()
    model = MoETransformer(MoEConfig.preset("tiny", data.vocab), 3)
    t = Trainer(model, data, "fp8_delayed", TrainConfig(steps=4, batch=2, warmup=1,
                                                        eval_every=2, eval_batches=1))
    states = [st for _, st in lt.fp8_states(model)]
    assert states
    for n in range(1, 5):
        t.step()
        assert [st.updates for st in states] == [n] * len(states), n


# ---------------------------------------------------------------- resume


def _trainer(recipe, steps, **kw):
    data = CharData.builtin()
    cfg = TrainConfig(steps=steps, batch=4, accum=2, warmup=2, eval_every=3, eval_batches=2,
                      seed=5, **kw)
    model = MoETransformer(MoEConfig.preset("tiny", data.vocab), 5)
    return Trainer(model, data, recipe, cfg)


def _assert_same_state(a: Trainer, b: Trainer):
    (ta, ma), (tb, mb) = a.state(), b.state()
    assert ma["step"] == mb["step"] and ma["data_pos"] == mb["data_pos"]
    assert ta.keys() == tb.keys()  # weights, moments, FP8 extra state, RNG state
    for n in ta:
        assert torch.equal(ta[n], tb[n]), n


@pytest.mark.parametrize("recipe", ["bf16", "torchao_mxfp8"] + _lowp_recipes())
def test_resume_is_bit_exact(recipe, tmp_path):
    N = 4
    full = _trainer(recipe, 2 * N)
    full_log = []
    full.run(0, lambda r: full_log.append((r["loss"], r["grad_norm"], r["val_loss"])))

    first = _trainer(recipe, 2 * N)
    log = []
    first.run(N, lambda r: log.append((r["loss"], r["grad_norm"], r["val_loss"])))
    path = str(tmp_path / "ck.pt")
    first.save(path)
    second = _trainer(recipe, 2 * N)
    second.load(path)
    assert second.step_n == N
    second.run(0, lambda r: log.append((r["loss"], r["grad_norm"], r["val_loss"])))
    _assert_same_state(full, second)
    for x, y in zip(full_log, log):
        assert x[:2] == y[:2] and (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2])))


def test_resume_with_dropout_is_bit_exact(tmp_path):
    def make():
        data = CharData.builtin()
        cfg = TrainConfig(steps=4, batch=2, warmup=1, eval_every=0, seed=9)
        model = MoETransformer(MoEConfig.preset("tiny", data.vocab, dropout=0.1), 9)
        return Trainer(model, data, "bf16", cfg)

    full = make()
    full.run()
    a = make()
    a.run(2)
    a.save(str(tmp_path / "d.pt"))
    torch.rand(5)  # the default generator moves on; the checkpoint's state must win
    b = make()
    b.load(str(tmp_path / "d.pt"))
    b.run()
    _assert_same_state(full, b)


def test_checkpoint_refusals_and_atomic_write(tmp_path):
    t = _trainer("bf16", 2)
    t.run(1)
    path = str(tmp_path / "ck.pt")
    t.save(path)
    assert os.listdir(tmp_path) == ["ck.pt"]
    other = _trainer("torchao_mxfp8", 2)
    with pytest.raises(ValueError, match="recipe"):
        other.load(path)
    data = CharData.builtin()
    t2 = Trainer(MoETransformer(MoEConfig.preset("tiny", data.vocab), 5), data, "bf16",
                 TrainConfig(steps=2, batch=3, accum=2, seed=5))
    with pytest.raises(ValueError, match="train.batch"):
        t2.load(path)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"garbage" * 10)
    with pytest.raises(ValueError, match=r"bad\.pt: .*(not a lowp checkpoint|not a safetensors)"):
        read_checkpoint(str(bad))
    # atomic_write replaces the file whole and leaves no temporary behind
    atomic_write(path, b"new")
    assert open(path, "rb").read() == b"new" and sorted(os.listdir(tmp_path)) == ["bad.pt",
                                                                                   "ck.pt"]


# ---------------------------------------------------------------- end to end


def _run(args, **kw):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    return subprocess.run([sys.executable, "-m", "lowp.torch.trainer"] + args, env=env,
                          capture_output=True, text=True, **kw)


def test_compare_end_to_end(tmp_path):
    second = (_lowp_recipes() or ["torchao_mxfp8"])[0]
    out = tmp_path / "cmp"
    log = tmp_path / "log.jsonl"
    r = _run(["--recipes", f"bf16,{second}", "--config", "tiny", "--steps", "24", "--batch",
              "4", "--eval-every", "4", "--threads", "1", "--out", str(out), "--log",
              str(log)])
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    for name in ("bf16", second):
        mine = [x for x in recs if x["recipe"] == name]
        assert len(mine) == 24
        assert all(math.isfinite(x["loss"]) and x["tokens_per_s"] > 0 for x in mine)
        vals = [x["val_loss"] for x in mine if "val_loss" in x]
        assert vals[-1] < vals[0] and vals[-1] < 3.6, vals
    md = (out / "report.md").read_text()
    assert f"| {second} |" in md and "| bf16 |" in md and "tokens/s vs bf16" in md
    svg = ET.parse(out / "val_loss.svg").getroot()
    groups = [g for g in svg.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "recipe"]
    assert [g.get("data-recipe") for g in groups] == ["bf16", second]
    assert len(list(groups[0].iter("{http://www.w3.org/2000/svg}circle"))) == 6
    # the same report rebuilt from the log alone
    from lowp.torch.trainer import main

    assert main(["--report-from", str(log), "--out", str(tmp_path / "again")]) == 0
    md2 = (tmp_path / "again" / "report.md").read_text()
    final = {x["recipe"]: x["val_loss"] for x in recs if "val_loss" in x}
    for name, v in final.items():
        assert f"| {name} | {v:.4f} |" in md2 and f"| {name} | {v:.4f} |" in md


def test_cli_train_resume_and_errors(tmp_path, capsys):
    from lowp.torch.trainer import main

    ck = str(tmp_path / "run.pt")
    base = ["--config", "tiny", "--batch", "2", "--threads", "1", "--sample", "0"]
    assert main(base + ["--steps", "4", "--stop-at", "2", "--checkpoint", ck]) == 0
    assert "step 2/4" in capsys.readouterr().err
    assert main(["--resume", ck, "--threads", "1", "--sample", "20", "--checkpoint", ck]) == 0
    out = capsys.readouterr()
    assert "resuming from" in out.err and "trained bf16: step 4/4" in out.out
    assert "--- sample" in out.out
    assert main(["--recipe", "nope"] + base) == 2
    assert "--recipe" in capsys.readouterr().err
    assert main(["--resume", str(tmp_path / "missing.pt")]) == 2
    assert main(["--recipes", "bf16", "--resume", ck]) == 2
    assert "does not apply" in capsys.readouterr().err


@pytest.mark.parametrize("recipe", ["bf16"] + [r for r in _lowp_recipes() if r == "fp8_delayed"])
def test_evaluation_leaves_no_trace(recipe):
    def run(eval_every):
        data = CharData.builtin()
        cfg = TrainConfig(steps=5, batch=2, warmup=1, eval_every=eval_every, eval_batches=2,
                          seed=3)
        t = Trainer(MoETransformer(MoEConfig.preset("tiny", data.vocab), 3), data, recipe, cfg)
        t.run()
        return t

    _assert_same_state(run(1), run(0))


def test_fused_adamw_updates_wrapped_weights_and_expires_their_copies():
    """On CPU the trainer runs torch's fused AdamW; its in-place update of a param-swapped
    weight must bump the version the weight cache keys on (else the next forward would reuse
    the old quantized copies), and it is AdamW: the same update as torch's per-tensor loop to
    rounding."""
    from lowp.torch import LowpWeight

    t = _trainer("all_mxfp8", 4)
    assert t.opt.defaults.get("fused") is True
    wrapped = [p for p in t.model.parameters() if isinstance(p, LowpWeight)]
    assert wrapped
    ref = _trainer("all_mxfp8", 4)
    ref_opt = torch.optim.AdamW(
        [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in
         ref.opt.param_groups], lr=ref.opt.defaults["lr"], betas=ref.opt.defaults["betas"],
        eps=ref.opt.defaults["eps"], foreach=False)
    ref.opt = ref_opt
    t.step()
    before = [w._root._version for w in wrapped]
    masters = [w._data.detach().clone() for w in wrapped]
    t.step()
    assert all(w._root._version > v for w, v in zip(wrapped, before))
    assert all(not torch.equal(w._data, m) for w, m in zip(wrapped, masters))
    ref.step()
    ref.step()
    for (n, a), (_, b) in zip(t.model.named_parameters(), ref.model.named_parameters()):
        a = a._data if isinstance(a, LowpWeight) else a
        b = b._data if isinstance(b, LowpWeight) else b
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), n
