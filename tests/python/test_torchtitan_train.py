"""Issue 39.3-5: torchtitan 0.3's DeepSeek-V3 debug model trains on the CPU with every recipe.

The assets are made here (a BPE tokenizer trained on ../shared/data/tinyshakespeare.txt and
the text as torchtitan's `c4_test` dataset; nothing is downloaded). One process trains the
debug model 6 steps (sequence 128, batch 2, seed 0) with torchtitan's bf16, each lowp recipe
and torchtitan's own MXFP8 converters on lowp's kernels (`patch_torchao()`), through
benchmarks/torchtitan/run.py (torchtitan's ConfigManager and Trainer). Checks:

- the loss falls (step 6 at least 0.5 below step 1; bf16 falls 1.05 here);
- every lowp recipe is within 2% of bf16 at every step (the issue's bound; measured: < 0.5%);
- torchtitan's MXFP8 recipe through the patch equals lowp's all_mxfp8 step for step (1e-6
  relative: the same kernels on the same numbers);
- a distributed checkpoint saved at step 3 and resumed gives the uninterrupted losses of steps
  4-6 exactly (fp8_delayed: weights, optimizer, data position and the FP8 extra state);
- two processes (FSDP2 over gloo) train `mix` and its loss falls."""

import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("torchao")
pytest.importorskip("tokenizers")
pytest.importorskip("datasets")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "torchtitan"))
import assets  # noqa: E402

if not os.path.isfile(assets.DEFAULT_TEXT):
    pytest.skip(f"{assets.DEFAULT_TEXT} is missing", allow_module_level=True)

LOWP = ("all_mxfp8", "mix", "all_block_fp8", "mix_fp4", "fp8_rowwise", "fp8_delayed",
        "block128")
SMALL = ["--training.steps", "6", "--training.seq_len", "128", "--training.local_batch_size",
         "2"]


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("titan")
    assets.make_assets(str(tmp / "assets"))
    e = dict(os.environ)
    e.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1",
             HF_DATASETS_CACHE=str(tmp / "hf"), LOWP_TITAN_ASSETS=str(tmp / "assets"),
             PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), ROOT,
                                         e.get("PYTHONPATH", "")]))
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    return tmp, e


def _run(env, configs, extra, nproc=1, name="run"):
    tmp, e = env
    out = tmp / f"{name}.json"
    runner = [os.path.join(ROOT, "benchmarks", "torchtitan", "run.py"), "--configs",
              ",".join(configs), "--out", str(out), "--", "--dump_folder", str(tmp / name),
              *SMALL, *extra]
    if nproc == 1:
        cmd = [sys.executable, *runner]
        e = dict(e, MASTER_PORT=str(_port()))
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               f"--master_port={_port()}", *runner]
    p = subprocess.run(cmd, env=e, cwd=ROOT, capture_output=True, text=True, timeout=800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    with open(out) as f:
        runs = json.load(f)["runs"]
    return {k: [v["steps"][str(s)]["loss"] for s in sorted(map(int, v["steps"]))]
            for k, v in runs.items()}


@pytest.fixture(scope="module")
def losses(env):
    names = ["debug_bf16"] + [f"debug_{r}" for r in LOWP] + ["debug_torchtitan_mxfp8"]
    return _run(env, names, [], name="recipes")


def test_loss_falls(losses):
    for name, ls in losses.items():
        assert len(ls) == 6, name
        assert ls[-1] < ls[0] - 0.5, (name, ls)


@pytest.mark.parametrize("recipe", LOWP)
def test_recipe_within_2_percent_of_bf16(losses, recipe):
    ref, got = losses["debug_bf16"], losses[f"debug_{recipe}"]
    for step, (a, b) in enumerate(zip(got, ref), 1):
        assert abs(a - b) <= 0.02 * b, (recipe, step, got, ref)


def test_torchtitan_mxfp8_through_patch_equals_all_mxfp8(losses):
    a, b = losses["debug_torchtitan_mxfp8"], losses["debug_all_mxfp8"]
    for x, y in zip(a, b):
        assert abs(x - y) <= 1e-6 * abs(y), (a, b)


def test_checkpoint_resume_gives_the_uninterrupted_losses(env, losses):
    ck = ["--checkpoint.enable", "--checkpoint.interval", "3"]
    full = _run(env, ["debug_fp8_delayed"], ck, name="ckpt")["debug_fp8_delayed"]
    assert full == losses["debug_fp8_delayed"]  # saving changes nothing
    tmp, _ = env
    resumed = _run(env, ["debug_fp8_delayed"], ck + ["--checkpoint.load_step", "3",
                                                      "--checkpoint.folder",
                                                      str(tmp / "ckpt" / "checkpoint")],
                   name="resume")["debug_fp8_delayed"]
    assert resumed == full[3:]


def test_two_processes_fsdp2_over_gloo(env):
    ls = _run(env, ["debug_mix"], [], nproc=2, name="two")["debug_mix"]
    assert len(ls) == 6 and ls[-1] < ls[0] - 0.5, ls
