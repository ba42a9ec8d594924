"""Test of `lowp train` and `lowp compare` (env LOWP_CLI) on ../shared/data/tinyshakespeare.txt
(relative to the repository root; the built-in corpus when the file is absent).

- Every built-in recipe trains the tiny configuration: exit 0, no NaN, the training loss falls
  and the validation loss at the end is below the first one.
- Resume is bit-exact: 2N updates equal N updates, a checkpoint, a resume and N more (with
  gradient accumulation, dropout and an evaluation cadence that does not divide N), for
  recipes with and without FP8 delayed-scaling state: the two final checkpoint files are equal
  byte for byte (weights, Adam moments, extra state, RNG and data position), and the logged
  losses, learning rates, gradient norms and validation losses of every step are equal.
- Checkpoints are safetensors files a plain reader loads: weights under their own names, F32,
  the expected metadata.
- A kill -9 of a run that saves every update, at several moments, leaves a checkpoint that
  reads, and a later run resumes from it.
- Corrupt or mismatched checkpoints (truncated, garbage, a bad header, a bad extra-state blob,
  another safetensors file, another config, recipe, data or batch, a missing file) and bad
  usage give exit status 2 and exactly one line on stderr that says what is wrong.
- --log writes JSON lines with step, loss, tokens_per_s, and val_loss on the evaluation steps.
- `lowp compare` writes report.md (every recipe, tokens/s) and val_loss.svg, a well-formed SVG
  with one line per recipe and one point per evaluation.
Prints "N passed, M failed"; exits nonzero on failure.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
from oracle import Report  # noqa: E402

CLI = os.environ.get("LOWP_CLI")
if not CLI:
    sys.exit("LOWP_CLI is not set (path of the lowp executable); run through ctest")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt"))
HAVE_DATA = os.path.isfile(DATA)
DATA_ARGS = ["--data", DATA] if HAVE_DATA else []
SANITIZE = bool(os.environ.get("LOWP_SANITIZE"))
QUICK = SANITIZE or bool(os.environ.get("LOWP_TEST_QUICK"))

rep = Report()
tmp = tempfile.TemporaryDirectory(prefix="lowp_train_")
TMP = tmp.name
TIMINGS = []


def path(name):
    return os.path.join(TMP, name)


def run(*args, env=None, timeout=900):
    e = dict(os.environ)
    # ctest runs tests side by side: OpenMP threads that spin between parallel regions would
    # take the cores from each other (a run with 2 threads slows down tenfold).
    e.setdefault("OMP_WAIT_POLICY", "passive")
    if env:
        e.update(env)
    t0 = time.time()
    p = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, env=e)
    return p.returncode, p.stdout, p.stderr, time.time() - t0


def one_line(err):
    return err.endswith("\n") and err.count("\n") == 1 and len(err.strip()) > 0


def read_log(p):
    with open(p) as fh:
        return [json.loads(line) for line in fh if line.strip()]


ST_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "U8": np.uint8,
             "I32": np.int32, "I64": np.int64, "U16": np.uint16, "U32": np.uint32}


def read_safetensors(p):
    """A plain reader of the format, as any user would write: (tensors, metadata)."""
    with open(p, "rb") as fh:
        raw = fh.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=ST_DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out, meta


def recipe_names():
    rc, out, _, _ = run("train", "--help")
    for line in out.splitlines():
        if line.startswith("Recipes:"):
            return [x.strip() for x in line[len("Recipes:"):].strip().rstrip(".").split(",") if x.strip()]
    return ["bf16", "fp8_delayed", "fp8_rowwise", "all_mxfp8", "block128", "all_block_fp8", "mix"]


def test_every_recipe():
    steps = 20 if QUICK else 40
    for r in recipe_names():
        log = path(f"every_{r}.log")
        rc, out, err, secs = run("train", "--recipe", r, "--config", "tiny", *DATA_ARGS,
                                 "--steps", str(steps), "--threads", "1", "--eval-every",
                                 str(steps // 4), "--eval-batches", "4", "--sample", "40",
                                 "--log", log)
        TIMINGS.append((r, secs))
        if not rep.check(f"train {r}: exit 0", rc == 0, [err.strip()[-400:]]):
            continue
        lines = read_log(log)
        losses = [x["loss"] for x in lines]
        vals = [x["val_loss"] for x in lines if "val_loss" in x]
        finite = all(v is not None and np.isfinite(v) for v in losses + vals)
        rep.check(f"train {r}: {steps} log lines, every loss and val_loss finite",
                  len(lines) == steps and finite, [f"{len(lines)} lines; losses {losses[:3]}...{losses[-3:]}"])
        if not finite or len(losses) < 6:
            continue
        first, last = float(np.mean(losses[:3])), float(np.mean(losses[-3:]))
        rep.check(f"train {r}: the loss falls ({first:.3f} -> {last:.3f})", last < first - 0.4,
                  [f"losses {losses}"])
        rep.check(f"train {r}: the validation loss falls ({vals[0]:.3f} -> {vals[-1]:.3f})",
                  len(vals) == 4 and vals[-1] < vals[0], [f"val {vals}"])
        rep.check(f"train {r}: a sample is printed", "--- sample" in out, [out[-300:]])


def test_log_format():
    log = path("fmt.log")
    rc, out, err, _ = run("train", "--recipe", "all_mxfp8", *DATA_ARGS, "--steps", "12",
                          "--eval-every", "5", "--eval-batches", "2", "--threads", "1",
                          "--sample", "0", "--log", log)
    if not rep.check("--log run: exit 0", rc == 0, [err[-300:]]):
        return
    lines = read_log(log)
    need = all({"step", "loss", "tokens_per_s", "lr", "grad_norm"} <= set(x) for x in lines)
    rep.check("--log: every line has step, loss, tokens_per_s, lr, grad_norm", need and len(lines) == 12,
              [str(lines[:2])])
    rep.check("--log: steps 1..12 in order", [x["step"] for x in lines] == list(range(1, 13)))
    evals = [x["step"] for x in lines if "val_loss" in x]
    rep.check("--log: val_loss on steps 5, 10 and the last (12) only", evals == [5, 10, 12], [str(evals)])
    rep.check("--log: tokens_per_s positive", all(x["tokens_per_s"] > 0 for x in lines))
    # Without a terminal, the progress goes to stderr as plain lines, results to stdout.
    rep.check("progress: plain lines on stderr without \\r", "\r" not in err and "step 12/12" in err
              and "val" in err, [err[-300:]])
    rep.check("summary on stdout", "trained all_mxfp8: step 12/12" in out, [out])
    # Activation checkpointing recomputes the same numbers (model.h: bit for bit).
    log2 = path("fmt_ac.log")
    rc, out, err, _ = run("train", "--recipe", "all_mxfp8", *DATA_ARGS, "--steps", "12",
                          "--eval-every", "5", "--eval-batches", "2", "--threads", "1",
                          "--sample", "0", "--log", log2, "--activation-checkpoint")
    if rep.check("--activation-checkpoint run: exit 0", rc == 0, [err[-300:]]):
        compare_logs("--activation-checkpoint", log, log2)
    # A text too short for the sequence length is refused before training.
    short = path("short.txt")
    with open(short, "w") as fh:
        fh.write("to be or not to be, that is the question\n" * 2)
    rc, out, err, _ = run("train", "--data", short, "--steps", "2")
    rep.check("a text too short for seq_len: exit 2, one line", rc == 2 and one_line(err)
              and "too short" in err, [f"exit {rc}", repr(err)])


def train_args(recipe, steps, extra=()):
    return ["train", "--recipe", recipe, "--config", "tiny", *DATA_ARGS, "--steps", str(steps),
            "--accum", "2", "--dropout", "0.1", "--eval-every", "3", "--eval-batches", "2",
            "--sample", "0", *extra]


def compare_logs(name, a, b):
    keys = ("step", "loss", "aux_loss", "lr", "grad_norm", "val_loss")
    la = [{k: x.get(k) for k in keys} for x in read_log(a)]
    lb = [{k: x.get(k) for k in keys} for x in read_log(b)]
    diff = [i for i, (x, y) in enumerate(zip(la, lb)) if x != y]
    rep.check(f"{name}: logged loss, lr, grad_norm, val_loss equal at every step",
              len(la) == len(lb) and not diff,
              [f"{len(la)} vs {len(lb)} lines; first difference at line {diff[:1]}: "
               f"{la[diff[0]] if diff else ''} vs {lb[diff[0]] if diff else ''}"])


def test_resume_bit_exact():
    N = 5
    cases = [("fp8_delayed", "1"), ("mix", "2")] if not QUICK else [("fp8_delayed", "1")]
    if not QUICK:
        cases.append(("all_block_fp8", "1"))
        cases.append(("nvfp4", "1"))  # the SR and Hadamard states' offsets resume too
    for recipe, threads in cases:
        name = f"resume {recipe} (threads {threads})"
        th = ["--threads", threads]
        a, b1, b2 = path(f"{recipe}_a.st"), path(f"{recipe}_b1.st"), path(f"{recipe}_b2.st")
        la, lb = path(f"{recipe}_a.log"), path(f"{recipe}_b.log")
        rc1, _, e1, _ = run(*train_args(recipe, 2 * N, th + ["--checkpoint", a, "--log", la]))
        rc2, _, e2, _ = run(*train_args(recipe, 2 * N, th + ["--stop-at", str(N), "--checkpoint",
                                                             b1, "--log", lb]))
        rc3, o3, e3, _ = run(*train_args(recipe, 2 * N, th + ["--resume", b1, "--checkpoint", b2,
                                                              "--log", lb]))
        if not rep.check(f"{name}: the three runs exit 0", rc1 == rc2 == rc3 == 0,
                         [e1[-200:], e2[-200:], e3[-200:]]):
            continue
        rep.check(f"{name}: the resumed run starts at step {N}", f"at step {N} of {2 * N}" in e3, [e3[:400]])
        ta, ma = read_safetensors(a)
        tb, mb = read_safetensors(b2)
        _, m1 = read_safetensors(b1)
        rep.check(f"{name}: the stopped run's checkpoint is at step {N}", m1.get("train.step") == str(N))
        differ = sorted(k for k in ta if k not in tb or ta[k].tobytes() != tb[k].tobytes())
        rep.check(f"{name}: every tensor equal bit for bit ({len(ta)} tensors)",
                  not differ and set(ta) == set(tb), [f"differ: {differ[:5]}"])
        mdiff = sorted(k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k))
        rep.check(f"{name}: metadata equal (step, data position, RNG offsets...)", not mdiff,
                  [f"{k}: {ma.get(k)} vs {mb.get(k)}" for k in mdiff[:5]])
        with open(a, "rb") as fa, open(b2, "rb") as fb:
            rep.check(f"{name}: the checkpoint files are identical", fa.read() == fb.read())
        rep.check(f"{name}: extra state saved for wrapped parameters",
                  any(k.endswith("._extra_state") and v.size > 0 for k, v in ta.items())
                  or recipe != "fp8_delayed")
        compare_logs(name, la, lb)


def test_checkpoint_contents():
    p = path("contents.st")
    rc, _, err, _ = run("train", "--recipe", "fp8_delayed", *DATA_ARGS, "--steps", "3",
                        "--threads", "1", "--sample", "0", "--checkpoint", p)
    if not rep.check("checkpoint run: exit 0", rc == 0, [err[-300:]]):
        return
    t, m = read_safetensors(p)
    rep.check("checkpoint: weights by name, F32, shapes of model.h",
              t["embed"].dtype == np.float32 and t["embed"].ndim == 2 and t["head"].shape == t["embed"].shape
              and t["layers.0.moe.experts.w1"].ndim == 3 and "layers.1.attn.wq" in t,
              [str(sorted(t)[:8])])
    rep.check("checkpoint: Adam moments for every weight",
              all(f"optim.exp_avg.{k}" in t and f"optim.exp_avg_sq.{k}" in t
                  for k in t if not k.startswith("optim.") and not k.endswith("._extra_state")))
    xs = [k for k in t if k.endswith("._extra_state")]
    rep.check("checkpoint: extra-state blobs start with LOWPXST1",
              xs and all(t[k].size == 0 or t[k][:8].tobytes() == b"LOWPXST1" for k in xs), [str(xs[:3])])
    need = ["format", "recipe", "train.step", "train.data_position", "rng.0.offset", "config.dim", "data.hash"]
    rep.check("checkpoint: metadata format, recipe, step, data position, RNG, config, data",
              all(k in m for k in need) and m["format"] == "lowp.train" and m["recipe"] == "fp8_delayed"
              and m["train.step"] == "3", [str(m)[:300]])
    rep.check("checkpoint: no .tmp left behind", not os.path.exists(p + ".tmp"))


def test_kill_during_save():
    """kill -9 of a training process that saves every update, at several moments: the
    checkpoint always reads and a later run resumes from it (no test hook in the library)."""
    c = path("crash.st")
    base = ["train", "--recipe", "fp8_delayed", *DATA_ARGS, "--steps", "400", "--threads", "1",
            "--sample", "0", "--eval-every", "100", "--eval-batches", "1"]
    rc, _, err, _ = run(*base, "--stop-at", "2", "--checkpoint", c)
    if not rep.check("kill: first checkpoint written", rc == 0 and os.path.exists(c), [err[-300:]]):
        return
    e = dict(os.environ)
    e.setdefault("OMP_WAIT_POLICY", "passive")
    steps = []
    for delay in (0.3, 0.7, 1.1):
        p = subprocess.Popen([CLI, *base, "--resume", c, "--checkpoint", c, "--checkpoint-every", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=e)
        time.sleep(delay)
        p.kill()  # SIGKILL
        p.wait()
        _, m = read_safetensors(c)
        steps.append(int(m.get("train.step", "-1")))
    rep.check("kill: after each kill -9 the checkpoint reads, at a step >= 2",
              all(s >= 2 for s in steps), [f"steps {steps}"])
    rc, out, err, _ = run(*base, "--resume", c, "--stop-at", str(steps[-1] + 2), "--checkpoint", c)
    _, m = read_safetensors(c)
    rep.check("kill: a later run resumes from it and saves", rc == 0 and m.get("train.step") == str(steps[-1] + 2),
              [f"exit {rc}", err[-300:]])


def test_bad_checkpoints():
    good = path("good.st")
    base = ["train", "--recipe", "fp8_delayed", *DATA_ARGS, "--steps", "4", "--threads", "1",
            "--sample", "0", "--eval-batches", "1"]
    rc, _, err, _ = run(*base, "--stop-at", "2", "--checkpoint", good)
    if not rep.check("bad checkpoints: a good one to spoil", rc == 0, [err[-300:]]):
        return
    with open(good, "rb") as fh:
        raw = fh.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])

    def write(name, data):
        p = path(name)
        with open(p, "wb") as fh:
            fh.write(data)
        return p

    # An extra-state blob with one byte flipped: its CRC no longer matches.
    xname = next(k for k, v in header.items()
                 if k.endswith("._extra_state") and v["data_offsets"][1] > v["data_offsets"][0])
    xoff = 8 + hlen + header[xname]["data_offsets"][0] + 40
    flipped = bytearray(raw)
    flipped[xoff] ^= 0x55
    bad_header = bytearray(raw)
    bad_header[8 + hlen // 2] = ord("}")
    # A valid safetensors file that is not a training checkpoint.
    other_h = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    other = struct.pack("<Q", len(other_h)) + other_h + b"\0" * 8
    cases = [
        ("truncated", write("trunc.st", raw[: len(raw) // 2]), ["truncated"]),
        ("truncated header", write("trunc_h.st", raw[:8 + hlen // 3]), ["truncated"]),
        ("garbage", write("garbage.st", b"This is not a checkpoint at all.\n" * 10), []),
        ("empty", write("empty.st", b""), []),
        ("malformed header", write("badh.st", bytes(bad_header)), []),
        ("corrupt extra state", write("xcrc.st", bytes(flipped)), ["CRC", xname[: -len("._extra_state")]]),
        ("not a training checkpoint", write("other.st", other), ["not a lowp training checkpoint"]),
        ("missing file", path("does_not_exist.st"), ["does_not_exist.st"]),
    ]
    for what, p, words in cases:
        rc, out, err, _ = run(*base, "--resume", p)
        ok = rc == 2 and one_line(err) and all(w in err for w in words) and p in err
        rep.check(f"resume from a {what} checkpoint: exit 2, one line naming the file", ok,
                  [f"exit {rc}", repr(err[-400:])])
    mismatches = [
        ("another config", ["--dim", "32"], ["config.dim"]),
        ("another recipe", ["--recipe", "bf16"], ["recipe"]),
        ("another batch", ["--batch", "4"], ["train.batch"]),
    ]
    if HAVE_DATA:
        mismatches.append(("other data", ["--data-builtin"], ["other data"]))
    for what, extra, words in mismatches:
        args = list(base)
        if extra == ["--data-builtin"]:
            i = args.index("--data")
            del args[i:i + 2]
            extra = []
        if "--recipe" in extra:
            i = args.index("--recipe")
            del args[i:i + 2]
        rc, out, err, _ = run(*args, *extra, "--resume", good)
        ok = rc == 2 and one_line(err) and all(w in err for w in words)
        rep.check(f"resume with {what}: exit 2, one line naming the field", ok, [f"exit {rc}", repr(err[-400:])])
    # Resuming with nothing but --resume and --data takes the settings from the checkpoint.
    rc, out, err, _ = run("train", *DATA_ARGS, "--threads", "1", "--sample", "0", "--resume", good)
    rep.check("resume with only --resume: settings from the checkpoint, runs to its --steps",
              rc == 0 and "step 4/4" in out, [f"exit {rc}", err[-300:], out[-200:]])


def test_usage_errors():
    cases = [
        ("unknown recipe", ["train", "--recipe", "fp7"]),
        ("unknown option", ["train", "--frobnicate"]),
        ("bad number", ["train", "--steps", "ten"]),
        ("missing value", ["train", "--steps"]),
        ("missing data file", ["train", "--data", path("nope.txt")]),
        ("unknown config", ["train", "--config", "enormous"]),
        ("checkpoint-every without checkpoint", ["train", "--checkpoint-every", "5"]),
        ("prompt outside the vocabulary", ["train", *DATA_ARGS, "--prompt", "~~"]),
        ("steps 0", ["train", "--steps", "0"]),
        ("compare: unknown recipe", ["compare", "--recipes", "bf16,nope"]),
        ("compare: --resume is not an option", ["compare", "--resume", "x"]),
    ]
    for what, args in cases:
        rc, out, err, _ = run(*args)
        rep.check(f"usage: {what}: exit 2, one line on stderr", rc == 2 and one_line(err),
                  [f"exit {rc}", repr(err[-300:])])
    rc, out, err, _ = run("train", "--help")
    rep.check("train --help: exit 0, lists the options", rc == 0 and "--checkpoint-every" in out)
    rc, out, err, _ = run("help")
    rep.check("lowp help lists train and compare", "train" in out and "compare" in out)


def test_compare():
    out_dir = path("cmp")
    log = path("cmp.log")
    steps = 10 if QUICK else 20
    rc, out, err, secs = run("compare", "--recipes", "bf16,all_mxfp8", "--config", "tiny", *DATA_ARGS,
                             "--steps", str(steps), "--eval-batches", "2", "--threads", "1",
                             "--out", out_dir, "--log", log)
    TIMINGS.append(("compare bf16,all_mxfp8", secs))
    if not rep.check("compare: exit 0", rc == 0, [err[-400:]]):
        return
    md_path, svg_path = os.path.join(out_dir, "report.md"), os.path.join(out_dir, "val_loss.svg")
    rep.check("compare: report.md and val_loss.svg written", os.path.isfile(md_path) and os.path.isfile(svg_path))
    if not os.path.isfile(md_path) or not os.path.isfile(svg_path):
        return
    md = open(md_path).read()
    rep.check("report.md: both recipes, tokens/s and GFLOP/s columns, the plot",
              "| bf16 |" in md and "| all_mxfp8 |" in md and "tokens/s" in md and "GFLOP/s" in md
              and "val_loss.svg" in md, [md[:400]])
    try:
        root = ET.parse(svg_path).getroot()
        ok_xml = True
    except ET.ParseError as e:
        ok_xml, root = False, None
        rep.fail("val_loss.svg is well-formed XML", [str(e)])
    if ok_xml:
        ns = "{http://www.w3.org/2000/svg}"
        rep.check("val_loss.svg: an <svg> root with width and height", root.tag == ns + "svg"
                  and root.get("width") and root.get("height"))
        groups = [g for g in root.iter(ns + "g") if g.get("class") == "recipe"]
        names = [g.get("data-recipe") for g in groups]
        rep.check("val_loss.svg: one group per recipe", names == ["bf16", "all_mxfp8"], [str(names)])
        pts = [len(pl.get("points").split()) for g in groups for pl in g.iter(ns + "polyline")]
        rep.check(f"val_loss.svg: one point per evaluation ({steps})", pts == [steps, steps], [str(pts)])
        texts = " ".join(t.text or "" for t in root.iter(ns + "text"))
        rep.check("val_loss.svg: axis labels, ticks and legend", "step" in texts and "validation loss" in texts
                  and "bf16" in texts and "tok/s" in texts, [texts[:300]])
    lines = read_log(log)
    rep.check("compare --log: lines of both recipes", {x.get("recipe") for x in lines} == {"bf16", "all_mxfp8"}
              and len(lines) == 2 * steps)
    rep.check("compare: a summary table on stdout", "| bf16 |" in out and "report:" in out, [out[-300:]])


def main():
    if not HAVE_DATA:
        rep.note(f"{DATA} is absent: training on the built-in corpus instead")
    test_usage_errors()
    test_log_format()
    test_checkpoint_contents()
    test_resume_bit_exact()
    test_kill_during_save()
    test_bad_checkpoints()
    test_compare()
    test_every_recipe()
    for name, secs in TIMINGS:
        print(f"time: {name}: {secs:.1f} s")
    tmp.cleanup()
    rep.finish()


if __name__ == "__main__":
    main()
