"""The training loop: ``Trainer`` (one run of the MoE of ``model.py`` with a recipe), the
learning-rate schedule, recipe preparation, evaluation, the checkpoint's values (``state``,
``load``; the file and its checks are ``checkpoint.py``'s) and text sampling.

The PyTorch twin of `lowp train` (tools/cli_train.c, src/trainer/): the same model shapes,
initialization and batches (so the C and the PyTorch runs of one seed start from the same
weights and see the same data), AdamW with decoupled weight decay on matrices, warm-up +
cosine schedule, global-norm clipping, gradient accumulation, and checkpoints from which a run
resumes bit for bit (N updates + resume + N updates == 2N updates: weights, optimizer, FP8
state, RNG state and data position).

Recipes: every lowp recipe through ``lowp.torch.apply_recipe`` (the param swap), ``bf16``
(plain weights, bfloat16 matmuls on torch's own kernels), ``fp32`` (plain, float32 matmuls),
and ``torchao_mxfp8``: torchao's own MXFP8 training path in its emulated kernel mode
(``quantize_`` with ``MXFP8TrainingOpConfig`` from the ``mxfp8_emulated_rceil`` recipe) on the
same weights lowp's MXFP8 recipe wraps (attention, shared and routed experts).
"""
from __future__ import annotations

import dataclasses
import json
import math
import time

import numpy as np
import torch

import lowp
import lowp.torch as lt

from . import checkpoint as ckfile
from .config import TrainConfig
from .data import CharData
from .model import GroupedExperts, MoETransformer, philox_words

__all__ = ["Trainer", "apply_training_recipe", "describe_wrapping", "lr_at", "sample_text",
           "set_threads"]


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
        plan = lt.apply_recipe(model, recipe)
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


def set_threads(n: int) -> None:
    """torch's and lowp's thread counts (n > 0; 0 leaves the defaults)."""
    if n > 0:
        torch.set_num_threads(n)
        lowp.set_threads(n)


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
        self._fp8_update = lt.update_fp8_states if lt.fp8_states(model) else None
        self.step_n = 0
        self.data_pos = 0
        self.run_steps = 0
        self.t0 = time.perf_counter()
        torch.manual_seed(cfg.seed)  # dropout draws from the default generator
        # the FP4 recipes' SR and Hadamard signs: seed + 1 and seed + 2, as lowp's C trainer
        lt.philox_states().reset(cfg.seed)

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
        meta = {"format": ckfile.CHECKPOINT_FORMAT, "version": ckfile.CHECKPOINT_VERSION,
                "step": self.step_n, "data_pos": self.data_pos, "recipe": self.recipe,
                "model_seed": self.model_seed, "data_name": self.data.name,
                "data_hash": self.data.hash,
                "philox": {k: list(v) for k, v in lt.philox_states().get_states().items()}}
        meta.update({"config." + k: v for k, v in dataclasses.asdict(self.model.cfg).items()})
        meta.update({"train." + k: v for k, v in dataclasses.asdict(self.cfg).items()})
        return tensors, {k: json.dumps(v) for k, v in meta.items()}

    def save(self, path: str) -> None:
        """Writes a checkpoint atomically (checkpoint.write_atomic): a failure raises OSError
        and leaves the previous file at ``path`` whole, and no temporary file."""
        tensors, meta = self.state()
        ckfile.write_atomic(path, ckfile.encode(tensors, meta))

    def load(self, path: str, ck: dict | None = None) -> None:
        """Restores a checkpoint of a run with the same model, recipe, data and data order.
        Everything is checked first (every checksum, every tensor's name, shape, dtype and
        values, the counters and settings); a refused checkpoint raises ValueError naming
        the field or the tensor and changes nothing. ``ck``: read_checkpoint(path)'s."""
        ck = ckfile.read_checkpoint(path) if ck is None else ck
        self._check_match(ck, path)
        params, opt_state, extra, rng = ckfile.checked_state(
            ck["tensors"], self.model, self._param_order(), self._extra_state(), ck["step"], path)
        self._apply(params, opt_state, extra, rng, path)
        if ck["philox"] is not None:  # the FP4 recipes' SR and Hadamard stream positions
            lt.philox_states().set_states(ck["philox"])
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

