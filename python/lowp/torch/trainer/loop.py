"""Train the MoE transformer of lowp.torch.trainer.model with a lowp recipe, in PyTorch.

    python -m lowp.torch.trainer --recipe all_mxfp8 --config small --data input.txt --steps 1000
    python -m lowp.torch.trainer --recipes bf16,all_mxfp8,mix,torchao_mxfp8 --out out/cmp

The PyTorch twin of `lowp train` / `lowp compare` (tools/cli_train.c): the same options where
they apply, the same model shapes, initialization and batches (so the C and the PyTorch runs of
one seed start from the same weights and see the same data), AdamW with decoupled weight decay
on matrices, warm-up + cosine schedule, global-norm clipping, gradient accumulation, the same
JSON-lines log records, a progress line on stderr, and checkpoints written atomically from
which a run resumes bit for bit (N updates + resume + N updates == 2N updates: weights,
optimizer, FP8 state, RNG state and data position).

Recipes: every lowp recipe through ``lowp.torch.apply_recipe`` (the param swap), ``bf16``
(plain weights, bfloat16 matmuls on torch's own kernels), ``fp32`` (plain, float32 matmuls),
and ``torchao_mxfp8``: torchao's own MXFP8 training path in its emulated kernel mode
(``quantize_`` with ``MXFP8TrainingOpConfig`` from the ``mxfp8_emulated_rceil`` recipe) on the
same weights lowp's MXFP8 recipe wraps (attention, shared and routed experts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from .model import MoEConfig, MoETransformer, philox_words
from . import checkpoint as ckfile
from .checkpoint import write_atomic
from .data import CharData

__all__ = ["TrainConfig", "Trainer", "apply_training_recipe", "atomic_write", "lr_at", "main",
           "sample_text", "LOWP_RECIPES", "RECIPES"]

try:  # the recipes apply_recipe knows (lowp.torch.recipes), else the C library's names
    from ..recipes import RECIPES as LOWP_RECIPES
except ImportError:
    LOWP_RECIPES = ("bf16", "fp8_delayed", "fp8_rowwise", "all_mxfp8", "block128",
                    "all_block_fp8", "mix", "mix_fp4")
RECIPES = LOWP_RECIPES + ("fp32", "torchao_mxfp8")
# The checkpoint's format name: the command's name when the format was made (before the
# trainer moved to lowp.torch.trainer), kept so that earlier checkpoints still resume.
CHECKPOINT_FORMAT, CHECKPOINT_VERSION = "lowp.torch.train", 2


@dataclasses.dataclass
class TrainConfig:
    """The run's settings (lowp_trainer_cfg's defaults)."""

    steps: int = 200
    batch: int = 8
    seq_len: int = 0  # 0: the model's
    accum: int = 1
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip: float = 1.0
    eval_every: int = 50
    eval_batches: int = 8
    seed: int = 1234
    eval_seed: int = 0
    threads: int = 0
    activation_checkpoint: bool = False

    def check(self) -> None:
        for f in ("steps", "batch", "accum", "eval_batches"):
            if getattr(self, f) < 1:
                raise ValueError(f"--{f.replace('_', '-')} must be at least 1")
        for f in ("seq_len", "warmup", "eval_every", "threads"):
            if getattr(self, f) < 0:
                raise ValueError(f"--{f.replace('_', '-')} must be >= 0")
        for f in ("lr", "min_lr", "weight_decay", "clip"):
            v = getattr(self, f)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"--{f.replace('_', '-')} ({v}) must be finite and >= 0")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError("--beta1 and --beta2 must be in [0, 1)")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ValueError(f"eps ({self.eps}) must be finite and > 0")
        for f in ("seed", "eval_seed"):
            if not 0 <= getattr(self, f) < 2 ** 64:
                raise ValueError(f"--{f.replace('_', '-')} ({getattr(self, f)}) must be an "
                                 "unsigned 64-bit integer")


def lr_at(cfg: TrainConfig, step: int) -> float:
    """The learning rate of update ``step`` (0-based), rounded to float32 as lowp_lr_at."""
    if step < cfg.warmup:
        return float(np.float32(cfg.lr * (step + 1) / cfg.warmup))
    span = cfg.steps - cfg.warmup
    p = (step - cfg.warmup) / span if span > 0 else 1.0
    if p >= 1.0:
        return float(np.float32(cfg.min_lr))
    return float(np.float32(cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * p))
                            * (cfg.lr - cfg.min_lr)))


def atomic_write(path: str, data: bytes) -> None:
    """A temporary file unique to this writer, fsync, rename to PATH, fsync of the directory:
    an interrupted or failed write leaves the previous file whole (checkpoint.write_atomic)."""
    write_atomic(path, data)


def _plain_copy(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor with t's values (t may be a wrapper subclass)."""
    out = torch.empty(t.shape, dtype=t.dtype, device="cpu")
    with torch.no_grad():
        out.copy_(t.detach())
    return out


def _is_wrapped(p: torch.Tensor) -> bool:
    return type(p) not in (torch.Tensor, torch.nn.Parameter)


def _torchao_filter(module, fqn: str) -> bool:
    """The weights lowp's all_mxfp8 wraps: attention, shared and routed experts (never the
    embedding, the router, the norms or the output head)."""
    from .model import GroupedExperts  # noqa: PLC0415

    if isinstance(module, GroupedExperts):
        return True
    return isinstance(module, torch.nn.Linear) and (".attention." in f".{fqn}"
                                                    or ".shared_experts." in f".{fqn}")


def apply_training_recipe(model: MoETransformer, recipe: str) -> str:
    """Prepares ``model`` for ``recipe``; returns what it wrapped, in words."""
    if recipe == "fp32":
        model.plain_dtype = torch.float32
    elif recipe == "bf16":
        model.plain_dtype = torch.bfloat16
    elif recipe == "torchao_mxfp8":
        from torchao.prototype.moe_training.config import (  # noqa: PLC0415
            MXFP8TrainingOpConfig,
            MXFP8TrainingRecipe,
        )
        from torchao.quantization import quantize_  # noqa: PLC0415

        cfg = MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL)
        quantize_(model, cfg, filter_fn=_torchao_filter)
    else:
        try:
            from lowp.torch import apply_recipe  # noqa: PLC0415
        except ImportError as e:
            raise ValueError(f"--recipe {recipe}: lowp.torch.apply_recipe is not available "
                             f"({e})") from e
        plan = apply_recipe(model, recipe)
        if isinstance(plan, dict):
            return describe_wrapping(model, plan)
    return describe_wrapping(model)


def describe_wrapping(model: torch.nn.Module, plan: dict | None = None) -> str:
    """"20 of 29 parameters wrapped: MXQuantizeConfig x 12, BlockQuantizeConfig x 8"; plan:
    apply_recipe's {name: config}."""
    params = list(model.named_parameters())
    kinds: dict[str, int] = {}
    if plan is not None:
        for cfg in plan.values():
            name = cfg if isinstance(cfg, str) else type(cfg).__name__
            kinds[name] = kinds.get(name, 0) + 1
    for _, p in params if plan is None else []:
        if _is_wrapped(p):
            cfg = getattr(p, "config", None)
            name = type(cfg).__name__ if cfg is not None else type(p).__name__
            kinds[name] = kinds.get(name, 0) + 1
    n = sum(kinds.values())
    s = f"{n} of {len(params)} parameters wrapped"
    return s + (": " + ", ".join(f"{k} x {v}" for k, v in kinds.items()) if kinds else "")


def _set_threads(n: int) -> None:
    if n > 0:
        torch.set_num_threads(n)
        try:
            import lowp  # noqa: PLC0415

            if hasattr(lowp, "set_threads"):
                lowp.set_threads(n)
        except ImportError:
            pass


def _adamw_impl(params) -> dict:
    """torch's fused AdamW where every parameter's device has the kernel (CPU does): on CPU
    the default is the per-tensor loop, a few element-wise ops per parameter, each through the
    param-swap wrapper's dispatch on a wrapped weight (medium, 2 threads: 54 ms an update in
    bf16 and 67 ms in all_mxfp8, against 24 and 26 fused). The same for every recipe."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices  # noqa
        ok = set(_get_fused_kernels_supported_devices())
    except ImportError:
        return {}
    if params and all(p.device.type in ok and p.is_floating_point() for p in params):
        return {"fused": True}
    return {}


class Trainer:
    """One run: ``model`` (prepared here by ``recipe``), ``data``, ``cfg``."""

    def __init__(self, model: MoETransformer, data: CharData, recipe: str, cfg: TrainConfig,
                 model_seed: int | None = None):
        cfg.check()
        if data.vocab != model.cfg.vocab:
            raise ValueError(f"the model's vocab ({model.cfg.vocab}) != the data's "
                             f"({data.vocab} distinct bytes in {data.name})")
        if cfg.seq_len == 0:
            cfg.seq_len = model.cfg.seq_len
        if cfg.seq_len > model.cfg.seq_len:
            raise ValueError(f"--seq-len ({cfg.seq_len}) > the model's seq_len "
                             f"({model.cfg.seq_len})")
        T = cfg.seq_len
        if data.ntrain < T + 1 or data.bytes - data.ntrain < T + 1:
            raise ValueError(f"data: {data.name} is too short for sequences of {T} tokens")
        self.model, self.data, self.recipe, self.cfg = model, data, recipe, cfg
        self.model_seed = cfg.seed if model_seed is None else model_seed
        self.wrapped = apply_training_recipe(model, recipe)
        model.activation_checkpoint = cfg.activation_checkpoint
        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
            **_adamw_impl(decay + no_decay))
        self._fp8_update = None
        try:
            from ..state import fp8_states, update_all  # noqa: PLC0415

            if fp8_states(model):
                self._fp8_update = update_all
        except ImportError:
            pass
        self.step_n = 0
        self.data_pos = 0
        self.run_steps = 0
        self.t0 = time.perf_counter()
        torch.manual_seed(cfg.seed)  # dropout draws from the default generator

    # ---- one update

    def _grads(self):
        return [p.grad for p in self.model.parameters() if p.grad is not None]

    def step(self) -> dict:
        cfg, model = self.cfg, self.model
        B, T, A = cfg.batch, cfg.seq_len, cfg.accum
        t_begin = time.perf_counter()
        model.train()
        self.opt.zero_grad(set_to_none=True)
        ce_sum = aux_sum = 0.0
        for _ in range(A):
            tokens, targets = self.data.batch("train", cfg.seed, self.data_pos, B, T)
            self.data_pos += 1
            loss, ce, aux = model(tokens, targets)
            loss.backward()
            ce_sum += float(ce.detach())
            aux_sum += float(aux.detach())
        grads = self._grads()
        with torch.no_grad():
            if A > 1:
                torch._foreach_mul_(grads, 1.0 / A)
            sq = sum(float(torch.linalg.vector_norm(g, dtype=torch.float64)) ** 2 for g in grads)
            norm = math.sqrt(sq)
            if cfg.clip > 0 and math.isfinite(norm) and norm > cfg.clip:
                torch._foreach_mul_(grads, float(np.float32(cfg.clip / norm)))
        lr = lr_at(cfg, self.step_n)
        # A non-finite gradient would poison the weights and both moments: skip the update.
        skipped = not math.isfinite(norm)
        if not skipped:
            for g in self.opt.param_groups:
                g["lr"] = lr
            self.opt.step()
        self._step_end()
        self.step_n += 1
        t_update = time.perf_counter()
        tokens_n = A * B * T
        rep = {"step": self.step_n, "steps": cfg.steps, "loss": ce_sum / A,
               "aux_loss": aux_sum / A, "lr": lr, "grad_norm": norm,
               "tokens_per_s": tokens_n / (t_update - t_begin),
               "step_s": t_update - t_begin, "val_loss": math.nan, "evaluated": False,
               "skipped": skipped, "tokens": tokens_n}
        if self.step_n == cfg.steps or (cfg.eval_every > 0 and self.step_n % cfg.eval_every == 0):
            rep["val_loss"] = self.evaluate()
            rep["evaluated"] = True
            rep["eval_s"] = time.perf_counter() - t_update
        self.run_steps += 1
        rep["elapsed_s"] = time.perf_counter() - self.t0
        rep["eta_s"] = rep["elapsed_s"] / self.run_steps * max(cfg.steps - self.step_n, 0)
        return rep

    def _step_end(self) -> None:
        """The delayed-scaling update of every FP8 state, once per update and at its end (as
        lowp_train_step_end in C), not lazily at the next forward: so an evaluation, which
        restores the state it touched, or a checkpoint taken here cannot shift or drop it."""
        if self._fp8_update is not None:
            self._fp8_update(self.model)

    # ---- evaluation (leaves no trace in the training state)

    def _extra_state(self) -> dict:
        return {k: v for k, v in self.model.state_dict().items() if k.endswith("_extra_state")}

    def evaluate(self) -> float:
        cfg, model = self.cfg, self.model
        snap = {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                for k, v in self._extra_state().items()}
        was_training = model.training
        model.eval()
        total = 0.0
        try:
            with torch.no_grad():
                for i in range(cfg.eval_batches):
                    tokens, targets = self.data.batch("val", cfg.eval_seed, i, cfg.batch,
                                                      cfg.seq_len)
                    _, ce, _ = model(tokens, targets)
                    total += float(ce)
        finally:
            model.train(was_training)
            if snap:
                model.load_state_dict(snap, strict=False)
                # A weight's amax is recorded when its quantized copies are made, once per
                # version: the restore just dropped the record the evaluation made, and the
                # cached copies would keep the next training forward from making it again.
                # Dropping them makes it quantize afresh (same codes) and record, as a run
                # that did not evaluate here does (lowp_trainer_eval does the same in C).
                for p in model.parameters():
                    cache = getattr(p, "cache", None)
                    if cache is not None and hasattr(cache, "clear"):
                        cache.clear()
        return total / cfg.eval_batches

    def run(self, until: int = 0, on_step=None) -> None:
        until = until or self.cfg.steps
        while self.step_n < until:
            rep = self.step()
            if on_step is not None and on_step(rep):
                break

    # ---- checkpoints (the file: checkpoint.py; the values and their checks: here)

    def _param_order(self) -> list:
        """The parameters' names in the optimizer's index order (its state_dict keys)."""
        ids = {id(p): n for n, p in self.model.named_parameters()}
        return [ids[id(p)] for g in self.opt.param_groups for p in g["params"]]

    def state(self) -> tuple:
        """``(tensors, meta)`` of a checkpoint: every weight, AdamW moment and step count, FP8
        extra state and the RNG state as tensors; the counters and settings as metadata."""
        tensors = {"params." + n: _plain_copy(p) for n, p in self.model.named_parameters()}
        opt = self.opt.state_dict()["state"]
        for i, n in enumerate(self._param_order()):
            for k, v in sorted(opt.get(i, {}).items()):
                if not isinstance(v, torch.Tensor):
                    v = torch.tensor(v, dtype=torch.float32)
                tensors[f"optim.{k}.{n}"] = _plain_copy(v)
        for k, v in self._extra_state().items():
            if isinstance(v, (bytes, bytearray)):
                v = torch.frombuffer(bytearray(v), dtype=torch.uint8)
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"checkpoint: the extra state {k} is a {type(v).__name__}, "
                                "not a tensor")
            tensors[k] = _plain_copy(v)
        tensors["rng"] = torch.get_rng_state()
        meta = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
                "step": self.step_n, "data_pos": self.data_pos, "recipe": self.recipe,
                "model_seed": self.model_seed, "data_name": self.data.name,
                "data_hash": self.data.hash}
        meta.update({"config." + k: v for k, v in dataclasses.asdict(self.model.cfg).items()})
        meta.update({"train." + k: v for k, v in dataclasses.asdict(self.cfg).items()})
        return tensors, {k: json.dumps(v) for k, v in meta.items()}

    def save(self, path: str) -> None:
        """Writes a checkpoint atomically (checkpoint.write_atomic): a failure raises OSError
        and leaves the previous file at ``path`` whole, and no temporary file."""
        tensors, meta = self.state()
        write_atomic(path, ckfile.encode(tensors, meta))

    def load(self, path: str, ck: dict | None = None) -> None:
        """Restores a checkpoint of a run with the same model, recipe, data and data order.
        Everything is checked first (every checksum, every tensor's name, shape, dtype and
        values, the counters and settings); a refused checkpoint raises ValueError naming
        the field or the tensor and changes nothing. ``ck``: read_checkpoint(path)'s."""
        ck = read_checkpoint(path) if ck is None else ck
        self._check_match(ck, path)
        tensors = ck["tensors"]
        params = _checked_params(self.model, tensors, path)
        opt_state = _checked_moments(self.model, self._param_order(), tensors, ck["step"], path)
        extra = _checked_extra(self._extra_state(), tensors, path)
        rng = _checked_rng(tensors, path)
        known = set(params) | set(extra) | {"rng"} | {
            f"optim.{k}.{n}" for i, n in enumerate(self._param_order())
            for k in opt_state.get(i, {})}
        unknown = sorted(set(tensors) - known)
        if unknown:
            raise ValueError(f"--resume {path}: tensor '{unknown[0]}' is not one of this "
                             "model's")
        self._apply(params, opt_state, extra, rng, path)
        self.step_n, self.data_pos = ck["step"], ck["data_pos"]
        self.run_steps = 0
        self.t0 = time.perf_counter()

    def _check_match(self, ck: dict, path: str) -> None:
        mine = {"recipe": self.recipe, "data_hash": self.data.hash,
                "config": dataclasses.asdict(self.model.cfg)}
        for k, v in mine.items():
            if ck[k] != v:
                raise ValueError(f"--resume {path}: the checkpoint's {k} ({ck[k]!r}) differs from "
                                 f"this run's ({v!r})")
        for k in ("batch", "seq_len", "accum", "seed"):
            if ck["train"][k] != getattr(self.cfg, k):
                raise ValueError(f"--resume {path}: the checkpoint's train.{k} "
                                 f"({ck['train'][k]!r}) differs from this run's "
                                 f"({getattr(self.cfg, k)!r})")
        if ck["data_pos"] != ck["step"] * self.cfg.accum:
            raise ValueError(f"--resume {path}: data_pos ({ck['data_pos']}) != step "
                             f"({ck['step']}) x accum ({self.cfg.accum})")

    def _apply(self, params: dict, opt_state: dict, extra: dict, rng, path: str) -> None:
        """Applies checked values: the FP8 extra state first (its blobs' own checks may still
        refuse one: then the state it had is put back), then what cannot fail."""
        if extra:
            snap = {k: v.clone() for k, v in self._extra_state().items()}
            try:
                self.model.load_state_dict(extra, strict=False)
            except (ValueError, TypeError, RuntimeError) as e:
                self.model.load_state_dict(snap, strict=False)
                raise ValueError(f"--resume {path}: an extra state is refused: {e}") from e
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(params["params." + n])
                cache = getattr(p, "cache", None)  # quantized copies of the old values
                if cache is not None and hasattr(cache, "clear"):
                    cache.clear()
        groups = self.opt.state_dict()["param_groups"]
        self.opt.load_state_dict({"state": opt_state, "param_groups": groups})
        torch.set_rng_state(rng)


def _bad(path: str, name: str, what: str) -> ValueError:
    return ValueError(f"--resume {path}: tensor '{name}' {what}")


def _checked(tensors: dict, name: str, like: torch.Tensor, path: str, nonneg=False):
    """tensors[name], which must have ``like``'s shape and dtype and finite values (>= 0)."""
    t = tensors.get(name)
    if t is None:
        raise _bad(path, name, "is missing")
    if t.dtype != like.dtype or tuple(t.shape) != tuple(like.shape):
        raise _bad(path, name, f"is {t.dtype} {tuple(t.shape)}, the model's is {like.dtype} "
                               f"{tuple(like.shape)}")
    if t.is_floating_point():
        bad = ~torch.isfinite(t) | (t < 0) if nonneg else ~torch.isfinite(t)
        if bool(bad.any()):
            i = int(bad.reshape(-1).nonzero()[0])
            raise _bad(path, name, f"holds {float(t.reshape(-1)[i])} at element {i} (values "
                                   f"must be finite{' and >= 0' if nonneg else ''})")
    return t


def _checked_params(model, tensors: dict, path: str) -> dict:
    return {"params." + n: _checked(tensors, "params." + n, _plain_like(p), path)
            for n, p in model.named_parameters()}


def _plain_like(p: torch.Tensor) -> torch.Tensor:
    return torch.empty(p.shape, dtype=p.dtype, device="meta")


def _checked_moments(model, order: list, tensors: dict, step: int, path: str) -> dict:
    """The optimizer state {index: {step, exp_avg, exp_avg_sq}}: per parameter all three or
    none; moments of the parameter's shape and dtype, finite (exp_avg_sq >= 0); the step an
    integer in [0, the checkpoint's step] (an update skipped for a non-finite gradient does
    not count)."""
    named = dict(model.named_parameters())
    state = {}
    for i, n in enumerate(order):
        keys = [k for k in ("step", "exp_avg", "exp_avg_sq") if f"optim.{k}.{n}" in tensors]
        if not keys:
            continue
        like = _plain_like(named[n])
        s = {"exp_avg": _checked(tensors, f"optim.exp_avg.{n}", like, path),
             "exp_avg_sq": _checked(tensors, f"optim.exp_avg_sq.{n}", like, path, nonneg=True),
             "step": _checked(tensors, f"optim.step.{n}", torch.empty((), device="meta"), path)}
        v = float(s["step"])
        if not (v == int(v) and 0 <= v <= step):
            raise _bad(path, f"optim.step.{n}", f"is {v}, not an integer in [0, step {step}]")
        state[i] = s
    return state


def _checked_extra(mine: dict, tensors: dict, path: str) -> dict:
    out = {}
    for k, v in mine.items():
        t = tensors.get(k)
        if t is None:
            raise _bad(path, k, "is missing")
        if t.dtype != torch.uint8 or t.ndim != 1:
            raise _bad(path, k, f"is {t.dtype} {tuple(t.shape)}, not a uint8 blob")
        out[k] = t
    return out


def _checked_rng(tensors: dict, path: str) -> torch.Tensor:
    t = tensors.get("rng")
    like = torch.get_rng_state()
    if t is None or t.dtype != like.dtype or t.shape != like.shape:
        raise _bad(path, "rng", "is missing or is not a CPU generator state "
                                f"(uint8 {tuple(like.shape)})")
    try:
        torch.Generator().set_state(t)
    except RuntimeError as e:
        raise _bad(path, "rng", f"is not a valid generator state ({e})") from e
    return t


def _meta_value(meta: dict, key: str, typ, path: str):
    if key not in meta:
        raise ValueError(f"--resume {path}: metadata '{key}' is missing")
    try:
        v = json.loads(meta[key])
    except ValueError:
        v = None
    if typ is float and type(v) is int:
        v = float(v)
    if type(v) is not typ:
        raise ValueError(f"--resume {path}: metadata '{key}' ({meta[key][:40]!r}) is not "
                         f"a {typ.__name__}")
    return v


def _meta_fields(meta: dict, prefix: str, cls, path: str) -> dict:
    types = {"int": int, "float": float, "bool": bool, "str": str}
    return {f.name: _meta_value(meta, f"{prefix}.{f.name}", types.get(str(f.type), f.type), path)
            for f in dataclasses.fields(cls)}


def read_checkpoint(path: str) -> dict:
    """A checkpoint's contents after the checks that need no model: the file's structure and
    every checksum (checkpoint.decode), the format and version, each field's type, the
    settings (TrainConfig.check, MoEConfig.check) and the counters' ranges. Returns
    {"step", "data_pos", "recipe", "model_seed", "data_name", "data_hash", "config": {...},
    "train": {...}, "tensors": {name: tensor}}; ValueError naming the field otherwise."""
    with open(path, "rb") as f:
        data = f.read()
    tensors, meta = ckfile.decode(data, path)
    if meta.get("format") != json.dumps(CHECKPOINT_FORMAT):
        raise ValueError(f"--resume {path}: not a {CHECKPOINT_FORMAT} checkpoint")
    if meta.get("version") != json.dumps(CHECKPOINT_VERSION):
        raise ValueError(f"--resume {path}: version {meta.get('version')}, this program reads "
                         f"{CHECKPOINT_VERSION}")
    ck = {k: _meta_value(meta, k, t, path) for k, t in (
        ("step", int), ("data_pos", int), ("recipe", str), ("model_seed", int),
        ("data_name", str), ("data_hash", int))}
    ck["config"] = _meta_fields(meta, "config", MoEConfig, path)
    ck["train"] = _meta_fields(meta, "train", TrainConfig, path)
    try:
        MoEConfig(**ck["config"]).check()
        TrainConfig(**ck["train"]).check()
    except ValueError as e:
        raise ValueError(f"--resume {path}: the checkpoint's settings: {e}") from e
    if not 0 <= ck["step"] <= ck["train"]["steps"]:
        raise ValueError(f"--resume {path}: metadata 'step' ({ck['step']}) is outside [0, "
                         f"train.steps {ck['train']['steps']}]")
    if not 0 <= ck["data_pos"] < 2 ** 62:
        raise ValueError(f"--resume {path}: metadata 'data_pos' ({ck['data_pos']}) is negative "
                         "or too large")
    ck["tensors"] = tensors
    return ck


# ---- sampling (as lowp_sample_text)


@torch.no_grad()
def sample_text(model: MoETransformer, data: CharData, n: int, temperature: float = 0.8,
                top_k: int = 0, seed: int = 42, prompt: str | None = None) -> str:
    ctx = data.encode(prompt) if prompt else [int(np.nonzero(data.symbols == 10)[0][0])
                                              if (data.symbols == 10).any() else 0]
    was = model.training
    model.eval()
    out = []
    V = data.vocab
    for i in range(n):
        window = ctx[-model.cfg.seq_len:]
        logits = model(torch.tensor([window], dtype=torch.int64))[-1].double()
        if not temperature > 0:
            nxt = int(torch.argmax(logits))
        else:
            w = philox_words(seed, 2 * i, 2).astype(np.uint64)
            r = (int(w[0]) << 21) ^ int(w[1])
            u = (r & ((1 << 53) - 1)) / 9007199254740992.0
            k = top_k if 0 < top_k < V else V
            order = sorted(range(V), key=lambda v: (-float(logits[v]), v))[:k]
            mx = float(logits[order[0]])
            prob = [math.exp((float(logits[v]) - mx) / temperature) for v in order]
            target, acc, nxt = u * sum(prob), 0.0, order[-1]
            for v, pr in zip(order, prob):
                acc += pr
                if target < acc:
                    nxt = v
                    break
        ctx.append(nxt)
        out.append(nxt)
    model.train(was)
    return data.decode(out)


# ---- the command


def _fmt_dur(s: float) -> str:
    if not (s >= 0) or s > 1e7:
        return "?"
    t = int(s + 0.5)
    return f"{t // 3600}h{t // 60 % 60:02d}m" if t >= 3600 else (
        f"{t // 60}m{t % 60:02d}s" if t >= 60 else f"{t}s")


class Progress:
    """The callback: JSON-lines log records and the progress line on stderr."""

    def __init__(self, log, every: int, label: str | None = None, trainer=None,
                 checkpoint: str | None = None, checkpoint_every: int = 0):
        self.log, self.every, self.label = log, max(every, 1), label
        self.tty = sys.stderr.isatty()
        self.trainer, self.checkpoint, self.checkpoint_every = trainer, checkpoint, checkpoint_every
        self.last_saved = -1
        self.save_error: str | None = None
        self.steps, self.val, self.tps = [], [], []
        self.last_loss = self.last_val = math.nan
        self.skipped = 0

    def __call__(self, r: dict) -> bool:
        self.last_loss = r["loss"]
        self.skipped += r["skipped"]
        self.tps.append(r["tokens_per_s"])
        if r["evaluated"]:
            self.last_val = r["val_loss"]
            self.steps.append(r["step"])
            self.val.append(r["val_loss"])
        if self.log:
            rec = {"recipe": self.label} if self.label else {}
            rec["step"] = r["step"]
            for k in ("loss", "aux_loss", "lr", "grad_norm", "tokens_per_s", "step_s",
                      "elapsed_s"):
                rec[k] = r[k] if math.isfinite(r[k]) else None
            if r["evaluated"]:
                rec["val_loss"] = r["val_loss"] if math.isfinite(r["val_loss"]) else None
            if r["skipped"]:
                rec["skipped"] = True
            self.log.write(json.dumps(rec) + "\n")
            self.log.flush()
        last = r["step"] == r["steps"]
        if self.tty or r["evaluated"] or last or r["step"] % self.every == 0:
            val = f" | val {r['val_loss']:.4f}" if r["evaluated"] else ""
            lab = f"{self.label} | " if self.label else ""
            line = (f"{lab}step {r['step']}/{r['steps']} | loss {r['loss']:.4f}{val} | lr "
                    f"{r['lr']:.2e} | {r['tokens_per_s']:.0f} tok/s | ETA {_fmt_dur(r['eta_s'])}")
            if self.tty:
                sys.stderr.write("\r" + line + "\x1b[K" + ("\n" if r["evaluated"] or last else ""))
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()
        if self.checkpoint and self.checkpoint_every > 0 and r["step"] % self.checkpoint_every == 0:
            return not self.save(r["step"])
        return False

    def save(self, step: int) -> bool:
        """Saves the checkpoint; on failure keeps the reason in ``save_error`` (one line: the
        previous checkpoint is kept, no temporary file is left) and returns False."""
        try:
            self.trainer.save(self.checkpoint)
        except OSError as e:
            if self.tty:
                sys.stderr.write("\n")
            self.save_error = (f"cannot save the checkpoint {self.checkpoint} at step {step} "
                               f"({e.strerror or e}); the previous checkpoint is kept")
            return False
        self.last_saved = step
        return True


_I32_MAX = 2 ** 31 - 1


def _i32(lo: int = 0, hi: int = _I32_MAX):
    """An integer option in [lo, hi] (the C CLI's LOWP_CLI_I32)."""
    def parse(v: str) -> int:
        try:
            x = int(v, 10)
        except ValueError:
            x = None
        if x is None or not lo <= x <= hi:
            raise argparse.ArgumentTypeError(f"'{v}' is not an integer from {lo} to {hi}")
        return x
    return parse


def _u64(v: str) -> int:
    """An unsigned 64-bit option (LOWP_CLI_U64)."""
    try:
        x = int(v, 10)
    except ValueError:
        x = -1
    if not 0 <= x < 2 ** 64 or v.strip() != v or v.startswith(("+", "-")):
        raise argparse.ArgumentTypeError(f"'{v}' is not an unsigned 64-bit integer")
    return x


def _fnonneg(v: str) -> float:
    """A float option, finite and >= 0 (LOWP_CLI_FLOAT with lo 0)."""
    try:
        x = float(v)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x >= 0):
        raise argparse.ArgumentTypeError(f"'{v}' is not a finite number >= 0")
    return x


#: The rules of the command's valued options: the C CLI's (tools/cli_train.c OPTS), one entry
#: per option: (name, parse, help). Range rules between options are TrainConfig.check's.
OPTIONS = (
    ("steps", _i32(), "optimizer updates, the schedule's length (default 200)"),
    ("stop-at", _i32(), "stop after update N (the schedule still spans --steps)"),
    ("batch", _i32(), "sequences per micro-batch (default 8)"),
    ("accum", _i32(), "micro-batches per update (default 1)"),
    ("seq-len", _i32(), "tokens per sequence (default: the configuration's)"),
    ("lr", _fnonneg, "peak learning rate (default 3e-3)"),
    ("min-lr", _fnonneg, "final learning rate (default lr / 10)"),
    ("warmup", _i32(), "updates of linear warm-up (default steps / 10)"),
    ("weight-decay", _fnonneg, "AdamW decoupled weight decay on matrices (default 0.1)"),
    ("beta1", _fnonneg, "AdamW beta1 (default 0.9)"),
    ("beta2", _fnonneg, "AdamW beta2 (default 0.95)"),
    ("clip", _fnonneg, "global gradient-norm clipping, 0 off (default 1)"),
    ("eval-every", _i32(), "validate every N updates and after the last (default "
                           "steps / 10; compare: steps / 20)"),
    ("eval-batches", _i32(), "validation batches per evaluation (default 8)"),
    ("seed", _u64, "initialization, data order and dropout (default 1234)"),
    ("threads", _i32(0, 256), "torch and lowp threads (0: torch's default)"),
    ("log", str, "JSON lines: step, loss, lr, grad_norm, tokens_per_s, val_loss..."),
    ("checkpoint", str, "save a checkpoint there at the end"),
    ("checkpoint-every", _i32(), "and every N updates"),
    ("resume", str, "continue from a checkpoint (bit for bit); unset options are taken "
                    "from it"),
    ("sample", _i32(), "print N sampled characters at the end (default 200; compare: 0)"),
    ("temperature", _fnonneg, "sampling temperature (default 0.8; 0: greedy)"),
    ("sample-top-k", _i32(), "sample from the K most likely (default 0: all)"),
    ("prompt", str, "start the sample with TEXT"),
    ("progress-every", _i32(), "without a terminal, a progress line every N updates"),
    ("dim", _i32(), None), ("layers", _i32(), None), ("heads", _i32(), None),
    ("experts", _i32(), None), ("top-k", _i32(), None), ("expert-hidden", _i32(), None),
    ("shared-hidden", _i32(), None), ("dropout", _fnonneg, None),
    ("aux-loss-coef", _fnonneg, "override the configuration"))


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line on stderr, exit status 2 (as `lowp train`)."""

    def error(self, message):
        self.exit(2, f"lowp.torch.trainer: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m lowp.torch.trainer",
        description="Train the MoE transformer in PyTorch with a lowp recipe on a text file, "
                    "character by character (the first 90%% of the bytes train, the last 10%% "
                    "validate). With --recipes, compare several recipes from the same "
                    "initialization on the same batches and write a report.",
        epilog="Recipes: " + ", ".join(RECIPES) + ".")
    a = p.add_argument
    a("--recipe", help="one recipe (default bf16)")
    a("--recipes", help="comma-separated recipes to compare (compare mode)")
    a("--out", help="compare mode: the report's directory (default out/torch_compare)")
    a("--config", help="tiny, small or medium (default tiny)")
    a("--data", help="any text file (default: lowp's built-in corpus)")
    for name, typ, what in OPTIONS:
        a("--" + name, type=typ, default=None, help=what)
    a("--report-from", help="compare mode without training: build the report from the "
                            "--log files (comma-separated) of earlier runs")
    a("--activation-checkpoint", action="store_true",
      help="recompute layer activations in the backward")
    return p


_OVERRIDES = ("dim", "layers", "heads", "experts", "top_k", "expert_hidden", "shared_hidden",
              "dropout", "aux_loss_coef", "seq_len")


def _setup(args, ck: dict | None):
    try:
        data = CharData.from_file(args.data) if args.data else CharData.builtin()
    except OSError as e:
        raise ValueError(f"--data {args.data}: {e.strerror or e}") from None
    if ck is not None and ck["data_hash"] != data.hash:
        raise ValueError(f"--resume: the checkpoint was trained on other data "
                         f"({ck['data_name']}); this run's data is {data.name}: pass the same "
                         "--data")
    overrides = {k: getattr(args, k) for k in _OVERRIDES if getattr(args, k) is not None}
    if ck is not None and args.config is None and not overrides:
        mcfg, cname = MoEConfig(**ck["config"]), "from checkpoint"
    else:
        cname = args.config or "tiny"
        mcfg = MoEConfig.preset(cname, data.vocab, **overrides)
    tc = TrainConfig(**ck["train"]) if ck is not None else TrainConfig()
    tc.seq_len = mcfg.seq_len
    for k in ("steps", "batch", "accum", "lr", "weight_decay", "beta1", "beta2", "clip",
              "eval_batches", "seed"):
        if getattr(args, k) is not None:
            setattr(tc, k, getattr(args, k))
    if args.min_lr is not None:
        tc.min_lr = args.min_lr
    elif ck is None or args.lr is not None:
        tc.min_lr = tc.lr / 10
    if args.warmup is not None:
        tc.warmup = args.warmup
    elif ck is None:
        tc.warmup = tc.steps // 10
    if args.eval_every is not None:
        tc.eval_every = args.eval_every
    elif ck is None:
        tc.eval_every = tc.steps // (20 if args.recipes else 10) or 1
    tc.threads = args.threads or 0
    tc.activation_checkpoint = args.activation_checkpoint
    tc.check()
    _check_memory(mcfg, tc)
    return data, mcfg, cname, tc


def _check_memory(mcfg: MoEConfig, tc: TrainConfig) -> None:
    """Refuses a micro-batch whose activations cannot fit this machine's memory: a lower
    bound (per token and layer 10 x dim floats kept for the backward, and the logits),
    against the physical memory, so that an enormous --batch ends in one line, not in an
    allocation failure or the out-of-memory killer after the model is built."""
    floats = tc.batch * tc.seq_len * (mcfg.layers * 10 * mcfg.dim + mcfg.vocab)
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    if phys > 0 and 4 * floats > phys:
        raise ValueError(f"--batch {tc.batch} x --seq-len {tc.seq_len}: a micro-batch needs "
                         f"at least {4 * floats / 2 ** 30:.3g} GiB of activations, more than "
                         f"this machine's {phys / 2 ** 30:.3g} GiB")


def _check_writable(path: str) -> None:
    """A path the checkpoint can be written to (as `lowp train`): not a directory, and a
    temporary file can be created and removed beside it; checked before the first update."""
    if os.path.isdir(path):
        raise ValueError(f"--checkpoint {path}: is a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".",
                                   dir=os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        raise ValueError(f"--checkpoint {path}: cannot write there: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(tmp)


def _open_log(path: str, step0: int | None):
    """The --log file. A resumed run (step0: its step) keeps the records of the steps up to
    the checkpoint's and drops later ones and partial lines (written by a run killed after
    its last checkpoint), so that no step is logged twice; the kept lines are rewritten
    atomically, then appended to."""
    try:
        if step0 is None or not os.path.exists(path):
            return open(path, "w")
        keep = []
        with open(path, "rb") as f:
            for line in f.read().decode("utf-8", "replace").splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or \
                        rec["step"] <= step0:
                    keep.append(line + "\n")
        write_atomic(path, "".join(keep).encode())
        return open(path, "a")
    except OSError as e:
        raise ValueError(f"cannot open --log {path}: {e.strerror or e}") from None


def _train(args) -> int:
    ck = read_checkpoint(args.resume) if args.resume else None
    data, mcfg, cname, tc = _setup(args, ck)
    recipe = args.recipe or (ck["recipe"] if ck else "bf16")
    if recipe not in RECIPES:
        raise ValueError(f"--recipe: unknown recipe {recipe!r} (one of {', '.join(RECIPES)})")
    if args.checkpoint_every and not args.checkpoint:
        raise ValueError("--checkpoint-every needs --checkpoint PATH")
    if args.checkpoint:
        _check_writable(args.checkpoint)
    sample_n = 200 if args.sample is None else args.sample
    if args.prompt and sample_n > 0:
        data.encode(args.prompt)  # refuse a prompt the vocabulary cannot spell, now
    model_seed = ck["model_seed"] if ck is not None and args.seed is None else tc.seed
    model = MoETransformer(mcfg, model_seed)
    t = Trainer(model, data, recipe, tc, model_seed)
    if ck is not None:
        t.load(args.resume, ck)
    until = args.stop_at if args.stop_at and args.stop_at < tc.steps else tc.steps
    sys.stderr.write(f"lowp.torch.trainer: recipe {recipe} ({t.wrapped})\n  model {cname}: "
                     f"{mcfg.describe()}\n  data {data.describe()}\n")
    if ck is not None:
        sys.stderr.write(f"  resuming from {args.resume} at step {t.step_n} of {tc.steps}\n")
    log = _open_log(args.log, t.step_n if ck else None) if args.log else None
    try:
        every = args.progress_every or (tc.steps // 20 if tc.steps >= 20 else 1)
        prog = Progress(log, every, None, t, args.checkpoint, args.checkpoint_every or 0)
        step0, t_run = t.step_n, time.perf_counter()
        t.run(until, prog)
    finally:
        if log:
            log.close()
    if args.checkpoint and prog.save_error is None and prog.last_saved != t.step_n:
        prog.save(t.step_n)
    if prog.save_error is not None:
        sys.stderr.write(f"lowp.torch.trainer: {prog.save_error}\n")
        return 1
    secs = time.perf_counter() - t_run
    if t.step_n > step0:
        line = f"trained {recipe}: step {t.step_n}/{tc.steps}, loss {prog.last_loss:.4f}"
        if math.isfinite(prog.last_val):
            line += f", val_loss {prog.last_val:.4f}"
        line += f", {secs:.1f} s"
        if prog.skipped:
            line += f", {prog.skipped} updates skipped (non-finite gradient)"
        print(line)
    else:
        print(f"nothing to train: the checkpoint is at step {t.step_n} of {tc.steps}")
    if args.checkpoint:
        print(f"checkpoint: {args.checkpoint}")
    if t.step_n > step0 and not math.isfinite(prog.last_loss):
        sys.stderr.write(f"lowp.torch.trainer: the loss is {prog.last_loss} at step {t.step_n}: "
                         "training diverged\n")
        return 1
    if sample_n > 0:
        temp = 0.8 if args.temperature is None else args.temperature
        text = sample_text(model, data, sample_n, temp, args.sample_top_k or 0, tc.seed,
                           args.prompt)
        print(f"--- sample (temperature {temp:g}) ---\n{args.prompt or ''}{text}")
    return 0


def _compare(args) -> int:
    from .report import Run, table, write_report  # noqa: PLC0415

    for opt in ("recipe", "checkpoint", "resume", "stop_at"):
        if getattr(args, opt) is not None:
            raise ValueError(f"--{opt.replace('_', '-')} does not apply to compare mode")
    names = [r for r in args.recipes.split(",")]
    for r in names:
        if r not in RECIPES:
            raise ValueError(f"--recipes: unknown recipe {r!r} (one of {', '.join(RECIPES)})")
    data, mcfg, cname, tc = _setup(args, None)
    out = args.out or "out/torch_compare"
    sys.stderr.write(f"lowp.torch.trainer compare: {len(names)} recipes, {tc.steps} updates each\n"
                     f"  model {cname}: {mcfg.describe()}\n  data {data.describe()}\n")
    log = _open_log(args.log, None) if args.log else None
    runs = []
    try:
        for i, name in enumerate(names):
            model = MoETransformer(mcfg, tc.seed)
            t = Trainer(model, data, name, dataclasses.replace(tc), tc.seed)
            sys.stderr.write(f"[{i + 1}/{len(names)}] {name}: {t.wrapped}\n")
            every = args.progress_every or (tc.steps // 10 if tc.steps >= 10 else 1)
            prog = Progress(log, every, name)
            t0 = time.perf_counter()
            t.run(0, prog)
            tps = statistics.median(prog.tps)
            runs.append(Run(name, prog.steps, prog.val, prog.last_loss, tps,
                            model.flops_per_token(tc.seq_len) * tps / 1e9,
                            time.perf_counter() - t0, prog.skipped, t.wrapped))
    finally:
        if log:
            log.close()
    settings = {
        "model": f"{cname}: {mcfg.describe()}", "data": data.describe(),
        "updates": f"{tc.steps} (warm-up {tc.warmup}, lr {tc.lr:.3g} -> {tc.min_lr:.3g} cosine)",
        "tokens per update": f"{tc.batch} x {tc.seq_len} x {tc.accum} (batch x sequence x "
                             "accumulation)",
        "seed": tc.seed, "threads": tc.threads or torch.get_num_threads(),
        "torch": torch.__version__,
        "command": "`python -m lowp.torch.trainer " + " ".join(sys.argv[1:]) + "`"}
    md, svg = write_report(out, settings, runs)
    print(table(runs), end="")
    print(f"report: {md}\nplot: {svg}")
    bad = [r.recipe for r in runs if not math.isfinite(r.final_val)]
    for r in bad:
        sys.stderr.write(f"lowp.torch.trainer: recipe {r} diverged (validation loss is not "
                         "finite)\n")
    return 1 if bad else 0


def _report_from(args) -> int:
    """The compare report from JSON-lines logs (runs of one seed and settings, e.g. recipes
    trained in separate processes; each recipe's last log wins)."""
    from .report import Run, table, write_report  # noqa: PLC0415

    recs: dict[str, list] = {}
    for path in args.report_from.split(","):
        mine: dict[str, list] = {}
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                mine.setdefault(r.get("recipe") or args.recipe or "run", []).append(r)
        recs.update(mine)
    runs = []
    for name, rs in recs.items():
        ev = [r for r in rs if "val_loss" in r]
        val = [math.nan if r["val_loss"] is None else r["val_loss"] for r in ev]
        loss = rs[-1]["loss"]
        runs.append(Run(name, [r["step"] for r in ev], val,
                        math.nan if loss is None else loss,
                        statistics.median(r["tokens_per_s"] for r in rs), 0.0,
                        rs[-1]["elapsed_s"], sum(1 for r in rs if r.get("skipped")),
                        f"{len(rs)} updates logged"))
    runs.sort(key=lambda r: (r.recipe != "bf16", r.recipe))
    md, svg = write_report(args.out or "out/torch_compare",
                           {"source": ", ".join(f"`{p}`" for p in args.report_from.split(","))},
                           runs)
    print(table(runs), end="")
    print(f"report: {md}\nplot: {svg}")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        _set_threads(args.threads or 0)
        if args.report_from:
            return _report_from(args)
        return _compare(args) if args.recipes else _train(args)
    except (ValueError, TypeError, FileNotFoundError) as e:
        sys.stderr.write(f"lowp.torch.trainer: {e}\n")
        return 2
    except MemoryError:
        sys.stderr.write("lowp.torch.trainer: out of memory\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
