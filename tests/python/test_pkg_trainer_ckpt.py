"""The PyTorch trainer's checkpoints and command line (issue 40, points 1-4 and 9).

- The file is the C trainer's format (safetensors, a CRC-32C per tensor and over the
  metadata): the CRC-32C against its published check value; the C trainer's own file passes
  the Python checker, and the Python trainer's passes the C checker.
- A bit-flip sweep: random single-bit flips of one trained checkpoint, each refused before
  anything loads, naming the tensor whose bytes it hit, the model, optimizer, FP8 state, RNG
  state and counters unchanged (200 flips; LOWP_TEST_LONG=1: 3000).
- Checkpoints with valid checksums but wrong content (a moment of the wrong shape, a NaN, a
  bad step, data position, RNG state or FP8 blob) are refused, naming it, and change nothing;
  on the command line a wrong-shaped moment ends in one line and exit status 2, not a crash.
- Saving: the path checked before the first update, a failed save keeps the previous file
  and leaves no temporary file (one line, exit 1), writers to one path do not collide, and a
  resume after a kill logs no step twice.
- The options' rules are the C CLI's (negative or NaN temperature, top-k -1, seed -1, a
  directory as --log or --data, an enormous --batch): one line, exit status 2.
Named test_pkg_* so that the sanitized build (`make sanitize`) runs it too.
"""

import errno
import json
import os
import random
import struct
import subprocess
import sys
import threading

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from lowp.torch.trainer import (  # noqa: E402
    CharData, MoEConfig, MoETransformer, TrainConfig, Trainer)
from lowp.torch.trainer import checkpoint as ckfile  # noqa: E402
from lowp.torch.trainer import main  # noqa: E402
from lowp.torch.trainer.checkpoint import read_checkpoint  # noqa: E402
from lowp.torch.trainer.checkpoint import write_atomic as atomic_write  # noqa: E402

torch.set_num_threads(1)
LONG = os.environ.get("LOWP_TEST_LONG") == "1"
HAVE_C = ckfile._ext() is not None


def _recipe():
    try:
        from lowp.torch import apply_recipe  # noqa: F401, PLC0415
    except ImportError:
        return "bf16"
    return "fp8_delayed"  # weights, moments, FP8 extra state, RNG state


def _trainer(recipe=None, steps=4):
    data = CharData.builtin()
    cfg = TrainConfig(steps=steps, batch=2, warmup=1, eval_every=0, eval_batches=1, seed=7)
    return Trainer(MoETransformer(MoEConfig.preset("tiny", data.vocab), 7), data,
                   recipe or _recipe(), cfg)


def _snapshot(t: Trainer):
    tensors, meta = t.state()
    return {k: v.clone() for k, v in tensors.items()}, meta, t.step_n, t.data_pos


def _assert_unchanged(t: Trainer, snap):
    tensors, meta, step, pos = _snapshot(t)
    assert (meta, step, pos) == snap[1:]
    assert tensors.keys() == snap[0].keys()
    for k, v in tensors.items():
        assert torch.equal(v, snap[0][k]), k


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint after 2 updates: (path, bytes, {tensor: (begin, end) in the file})."""
    t = _trainer()
    t.run(2)
    path = str(tmp_path_factory.mktemp("ck") / "run.ckpt")
    t.save(path)
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])  # read independently of ckfile
    spans = {k: (8 + n + e["data_offsets"][0], 8 + n + e["data_offsets"][1])
             for k, e in header.items() if k != "__metadata__"}
    return path, data, spans, header


@pytest.fixture(scope="module")
def target():
    """The trainer that every refused load is aimed at (a fresh run of the same settings)."""
    t = _trainer()
    t.run(1)  # moments, FP8 history and RNG state that a partial load would change
    return t


# ---------------------------------------------------------------- the format


def test_crc32c_check_value_and_c_agree():
    assert ckfile.crc32c_py(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert ckfile.crc32c_py(b"") == 0
    blob = bytes(random.Random(1).randrange(256) for _ in range(4099))
    whole = ckfile.crc32c_py(blob)
    assert ckfile.crc32c_py(blob[1000:], ckfile.crc32c_py(blob[:1000])) == whole
    if HAVE_C:
        import lowp  # noqa: PLC0415

        assert lowp.crc32c(b"123456789") == 0xE3069283 and lowp.crc32c(blob) == whole
        assert lowp.crc32c(blob[1000:], lowp.crc32c(blob[:1000])) == whole


@pytest.mark.skipif(not HAVE_C, reason="needs lowp's C extension")
def test_lowp_crc32c_and_checkpoint_verify_name_a_bad_argument():
    import lowp  # noqa: PLC0415

    for bad, exc, name in (("abc", TypeError, "data"), (None, TypeError, "data")):
        with pytest.raises(exc, match=name):
            lowp.crc32c(bad)
    for crc, exc in ((2 ** 32, ValueError), (-1, ValueError), (1.0, TypeError),
                     (True, TypeError)):
        with pytest.raises(exc, match="crc"):  # not wrapped to 32 bits
            lowp.crc32c(b"x", crc)
    assert lowp.crc32c(b"x", 2 ** 32 - 1) == ckfile.crc32c_py(b"x", 2 ** 32 - 1)
    with pytest.raises(TypeError, match="path"):
        lowp.checkpoint_verify(b"", 5)
    with pytest.raises(ValueError):
        lowp.checkpoint_verify(b"\0" * 16, "f.safetensors")


def test_every_tensor_and_the_metadata_carry_a_checksum(saved):
    _, _, spans, header = saved
    meta = header["__metadata__"]
    assert set(spans) >= {"rng"} and any(k.startswith("optim.exp_avg_sq.") for k in spans)
    if _recipe() == "fp8_delayed":
        assert any(k.endswith("_extra_state") for k in spans)
    for name in spans:
        assert len(meta["crc32c." + name]) == 8, name
    assert {"step", "data_pos", "crc32c.__metadata__"} <= set(meta)


@pytest.mark.skipif(not HAVE_C, reason="needs lowp's C extension (the C checker)")
def test_the_c_checker_and_the_python_port_agree(saved, tmp_path):
    path, data, spans, _ = saved
    ckfile.decode(data, path, use_c=True)
    ckfile.decode(data, path, use_c=False)
    rng = random.Random(3)
    for _ in range(4):  # the Python port reads a few MB a second: a few flips
        name = rng.choice(sorted(k for k, (b, e) in spans.items() if e > b))
        b, e = spans[name]
        bad = bytearray(data)
        bad[rng.randrange(b, e)] ^= 1 << rng.randrange(8)
        for use_c in (True, False):
            with pytest.raises(ValueError, match=f"tensor '{name}' fails its CRC-32C"):
                ckfile.decode(bytes(bad), path, use_c=use_c)


def _cli():
    c = os.environ.get("LOWP_CLI") or os.path.join(ROOT, "build", "bin", "lowp")
    return c if os.path.exists(c) else None


@pytest.mark.skipif(_cli() is None, reason="needs the lowp CLI (build/bin/lowp)")
def test_the_c_trainers_file_passes_the_python_checker(tmp_path):
    ck = str(tmp_path / "c.safetensors")
    r = subprocess.run([_cli(), "train", "--config", "tiny", "--steps", "1", "--batch", "2",
                        "--sample", "0", "--eval-batches", "1", "--threads", "1",
                        "--checkpoint", ck], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    data = open(ck, "rb").read()
    tensors, meta = ckfile.decode(data, ck, use_c=False)
    assert "train.step" in meta and tensors
    bad = bytearray(data)
    bad[-5] ^= 0x10  # inside the last tensor of the data section
    with pytest.raises(ValueError, match="fails its CRC-32C check"):
        ckfile.decode(bytes(bad), ck, use_c=False)


# ---------------------------------------------------------------- the bit-flip sweep


def _where(pos: int, spans: dict):
    for name, (b, e) in spans.items():
        if b <= pos < e:
            return name
    return None  # the header


def test_bit_flip_sweep(saved, target, tmp_path):
    """Every single-bit flip is refused before anything loads, naming the tensor it hit (a
    flip in the header: the metadata, the header or the entry it broke), and the target
    trainer is unchanged after each refusal."""
    path, data, spans, _ = saved
    n = 3000 if LONG else 200
    if not HAVE_C:
        n = 12  # the Python CRC-32C reads a few MB a second
    rng = random.Random(40)
    snap = _snapshot(target)
    bad_path = str(tmp_path / "flipped.ckpt")
    header_end = min(b for b, _ in spans.values())
    positions = [rng.randrange(len(data)) for _ in range(n)]
    positions += [rng.randrange(header_end) for _ in range(n // 10)]  # the header too
    for pos in positions:
        bit = rng.randrange(8)
        bad = bytearray(data)
        bad[pos] ^= 1 << bit
        with open(bad_path, "wb") as f:
            f.write(bad)
        with pytest.raises(ValueError) as exc:
            target.load(bad_path)
        msg = str(exc.value)
        name = _where(pos, spans)
        if name is not None:
            assert f"tensor '{name}' fails its CRC-32C check" in msg, (pos, bit, msg)
        else:
            assert bad_path in msg, (pos, bit, msg)  # the header entry or JSON it broke
    _assert_unchanged(target, snap)
    target.load(path)  # and the intact file still loads


# ---------------------------------------------------------------- atomic, validated loads


def _rewrite(path: str, out: str, edit):
    """The checkpoint at path with edit(tensors, meta) applied and valid checksums."""
    tensors, meta = ckfile.decode(open(path, "rb").read(), path)
    edit(tensors, meta)
    with open(out, "wb") as f:
        f.write(ckfile.encode(tensors, meta))


def _first(tensors, prefix):
    return sorted(k for k in tensors if k.startswith(prefix))[-1]


def _moment_shape(t, m):
    k = _first(t, "optim.exp_avg.")
    t[k] = torch.zeros(t[k].shape[0] + 1, *t[k].shape[1:])
    return k


def _nan_weight(t, m):
    k = _first(t, "params.")
    t[k] = t[k].clone()
    t[k].view(-1)[3] = float("nan")
    return k


def _negative_sq(t, m):
    k = _first(t, "optim.exp_avg_sq.")
    t[k] = t[k].clone()
    t[k].view(-1)[0] = -1.0
    return k


def _weight_dtype(t, m):
    k = _first(t, "params.")
    t[k] = t[k].double()
    return k


def _rng_short(t, m):
    t["rng"] = t["rng"][:100].clone()
    return "rng"


def _step_text(t, m):
    m["step"] = '"two"'
    return "step"


def _step_negative(t, m):
    m["step"] = "-1"
    m["data_pos"] = "-1"
    return "step"


def _data_pos(t, m):
    m["data_pos"] = "5"
    return "data_pos"


def _optim_step(t, m):
    k = _first(t, "optim.step.")
    t[k] = torch.tensor(9.0)
    return k


def _extra_blob(t, m):
    ks = [k for k in t if k.endswith("_extra_state") and t[k].numel()]
    if not ks:
        pytest.skip("no FP8 extra state in this recipe")
    t[ks[-1]] = t[ks[-1]].clone()
    t[ks[-1]][-1] ^= 1  # the blob's own CRC-32, valid file checksums
    return "extra state"


def _unknown(t, m):
    t["params.not_a_weight"] = torch.zeros(2)
    return "params.not_a_weight"


def _lr_text(t, m):
    m["train.lr"] = "null"
    return "train.lr"


@pytest.mark.parametrize("edit", [_moment_shape, _nan_weight, _negative_sq, _weight_dtype,
                                  _rng_short, _step_text, _step_negative, _data_pos,
                                  _optim_step, _extra_blob, _unknown, _lr_text])
def test_a_refused_checkpoint_changes_nothing(saved, target, tmp_path, edit):
    """Valid checksums, a wrong value: refused, naming it, and the target is unchanged (the
    old loader copied every weight before it checked the optimizer, FP8 and RNG state)."""
    path = saved[0]
    out = str(tmp_path / "edited.ckpt")
    named = []
    _rewrite(path, out, lambda t, m: named.append(edit(t, m)))
    snap = _snapshot(target)
    with pytest.raises(ValueError) as exc:
        target.load(out)
    assert named[0] in str(exc.value), str(exc.value)
    _assert_unchanged(target, snap)


def test_a_wrong_shaped_moment_on_the_command_line(saved, tmp_path):
    """Point 3: the old trainer's fused AdamW crashed (exit 139) on it after --resume."""
    out = str(tmp_path / "moment.ckpt")
    named = []
    _rewrite(saved[0], out, lambda t, m: named.append(_moment_shape(t, m)))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "lowp.torch.trainer", "--resume", out,
                        "--sample", "0", "--threads", "1"], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("lowp.torch.trainer: ") and named[0] in last
    assert "Traceback" not in r.stderr


# ---------------------------------------------------------------- saving


def _base(tmp_path, *extra):
    return ["--config", "tiny", "--batch", "2", "--threads", "1", "--sample", "0",
            "--eval-batches", "1", "--seed", "3", *extra]


def test_the_checkpoint_path_is_checked_before_training(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    for bad in (str(tmp_path), str(tmp_path / "missing" / "ck")):
        assert main(_base(tmp_path, "--steps", "2", "--log", str(log), "--checkpoint",
                          bad)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--checkpoint {bad}:" in err
        assert not log.exists()  # refused before the first update
    assert sorted(os.listdir(tmp_path)) == []  # no /tmp.tmp-style leftovers


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, capsys, monkeypatch):
    ck = str(tmp_path / "run.ckpt")
    assert main(_base(tmp_path, "--steps", "4", "--stop-at", "2", "--checkpoint", ck)) == 0
    before = open(ck, "rb").read()
    capsys.readouterr()
    real_write = os.write

    def full_disk(fd, b):
        real_write(fd, bytes(b)[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckfile.os, "write", full_disk)
    rc = main(["--resume", ck, "--threads", "1", "--sample", "0", "--checkpoint", ck])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert rc == 1
    last = err.strip().splitlines()[-1]
    assert "cannot save the checkpoint" in last and "No space left" in last
    assert "previous checkpoint is kept" in last and "Traceback" not in err
    assert open(ck, "rb").read() == before and os.listdir(tmp_path) == ["run.ckpt"]
    assert read_checkpoint(ck)["step"] == 2


def test_writers_to_one_path_do_not_collide(tmp_path):
    """Two writers saving to one path: each save lands whole (the old PATH.tmp was shared:
    22 of 60 saves collided)."""
    path = str(tmp_path / "shared.ckpt")
    payloads = [ckfile.encode({"w": torch.full((1 << 16,), float(i))}, {"who": str(i)})
                for i in range(2)]
    errors = []

    def writer(i):
        try:
            for _ in range(30):
                atomic_write(path, payloads[i])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert open(path, "rb").read() in payloads
    assert os.listdir(tmp_path) == ["shared.ckpt"]


def test_a_resume_after_a_kill_logs_no_step_twice(tmp_path, capsys):
    ck, early, log = (str(tmp_path / n) for n in ("run.ckpt", "early.ckpt", "log.jsonl"))
    base = _base(tmp_path, "--steps", "6", "--log", log, "--checkpoint", ck)
    assert main(base + ["--stop-at", "2"]) == 0
    with open(ck, "rb") as f, open(early, "wb") as g:
        g.write(f.read())
    assert main(["--resume", ck, "--stop-at", "4", "--threads", "1", "--sample", "0",
                 "--log", log, "--checkpoint", ck]) == 0
    with open(log, "a") as f:
        f.write('{"step": 5, "loss": 1.2')  # killed in the middle of a record
    # the run was killed after step 4, its last checkpoint is the one of step 2
    assert main(["--resume", early, "--threads", "1", "--sample", "0", "--log", log,
                 "--checkpoint", ck]) == 0
    steps = [json.loads(x)["step"] for x in open(log).read().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    capsys.readouterr()


# ---------------------------------------------------------------- the options' rules


@pytest.mark.parametrize("args,says", [
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "inf"], "--temperature"),
    (["--sample-top-k", "-1"], "--sample-top-k"),
    (["--seed", "-1"], "--seed"),
    (["--seed", "18446744073709551616"], "--seed"),
    (["--batch", "0"], "--batch"),
    (["--steps", "2147483648"], "--steps"),
    (["--lr", "nan"], "--lr"),
    (["--threads", "257"], "--threads"),
    (["--batch", "2000000000"], "--batch"),
    (["--log", "{dir}"], "--log"),
    (["--data", "{dir}"], "--data"),
])
def test_bad_options_end_in_one_line(args, says, tmp_path, capsys):
    argv = ["--config", "tiny", "--steps", "1", "--sample", "0", "--threads", "1"]
    argv += [a.format(dir=tmp_path) for a in args]
    with pytest.raises(SystemExit) as exc:
        sys.exit(main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("lowp.torch.trainer: ") and says in last, err
    assert "Traceback" not in err
