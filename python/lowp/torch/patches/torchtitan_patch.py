"""torchtitan 0.3.0 on the CPU and on any device torchtitan does not know: opt-in runtime fixes.

Usage::

    import lowp.torch
    lowp.torch.patch_torchtitan()     # before torchtitan builds its Trainer; idempotent
    ...                               # torchtitan.train.main(), or the lowp configs
    lowp.torch.unpatch_torchtitan()   # every original torchtitan / torchao object is back

Each fix answers one place of torchtitan 0.3.0 (file:line in its wheel) that assumes CUDA:

1. ``tools/utils.py:55`` picks ``"cuda"`` when no accelerator is found (``device_type``,
   ``device_module``), and six modules copied those names at import: with no accelerator they
   become ``"cpu"`` and a host device module (below) in ``tools/utils.py``,
   ``components/metrics.py:21``, ``models/common/token_dispatcher.py:26``,
   ``distributed/parallel_dims.py:19``, ``distributed/utils.py:30``, ``tools/profiler.py:21``.
2. ``components/metrics.py:42-50,62,92`` calls ``get_device_name``, ``get_device_properties``,
   ``reset_peak_memory_stats``, ``empty_cache`` and ``memory_stats``, which ``torch.cpu`` lacks:
   the host device module gives them (peak memory = the process's peak resident set, VmHWM).
3. ``distributed/utils.py:586`` passes ``torch.cpu.current_device()``, the string ``"cpu"``, as
   a barrier's device id: the host module's ``current_device()`` is 0.
4. ``distributed/fsdp.py:41`` sets FSDP2's gradient divide factor to 1.0, which makes FSDP2
   reduce-scatter with ``PREMUL_SUM``, refused by gloo: on a gloo group the modules also force
   a plain SUM (``set_force_sum_reduction_for_comms``; the factor being 1, the same sums).
5. ``models/common/attention.py:331`` (``FlexAttention.forward``): FlexAttention has no CPU
   backward, and ``models/common/config_utils.py:97`` refuses SDPA for language models. For
   tensors off CUDA the forward materializes torchtitan's own block mask (its ``mask_mod``,
   every query/key pair) and calls SDPA with it; a ``score_mod`` or an ``out_transform`` (LSE)
   is refused there, naming it. The mask is [B, L, L] booleans: for short sequences.
6. ``components/quantization/mx.py:70,175``: the MXFP8 converters refuse anything before
   Blackwell (``has_cuda_capability(10, 0)``). While ``lowp.torch.patch_torchao()`` is on, their
   ops run on lowp's kernels, so the check passes; without it, it is torchtitan's.
7. ``models/common/token_dispatcher.py:744`` (``TorchAOTokenDispatcher._permute``) calls
   torchao's ``permute_and_pad``, whose index kernel is Triton
   (``torchao/prototype/moe_training/ep/permute.py``, ``generate_permute_indices``): for
   indices off CUDA it runs torchao's own CPU reference (``use_cpu=True``).

On a machine with an accelerator, fixes 1-3 are not installed (torchtitan found its device).
Version check as ``patch_torchao``: only torchtitan 0.3 is tested (``TESTED_VERSIONS``); another
version, or a missing module or name, raises ``RuntimeError`` and nothing is patched.
"""

from __future__ import annotations

import functools
import importlib
import os
import platform
import threading
import types
from typing import Callable, List, Tuple

import torch

__all__ = ["TESTED_VERSIONS", "patch_torchtitan", "unpatch_torchtitan", "torchtitan_patched",
           "HostDeviceModule"]

TESTED_VERSIONS: Tuple[str, ...] = ("0.3",)
_TT = "torchtitan"

_LOCK = threading.RLock()
_ORIGINALS: List[Tuple[object, str, object]] = []


# ---- 1-3: the host device module ----

def _peak_rss() -> int:
    """This process's peak resident set in bytes (VmHWM), 0 where unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (ImportError, OSError, ValueError):
        return 0


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class HostDeviceModule(types.SimpleNamespace):
    """What torchtitan calls on ``torch.cuda``, for the host: one device, index 0; memory
    statistics from the process's resident set; everything else is ``torch.cpu``'s."""

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def set_device(device=None) -> None:
        return None

    @staticmethod
    def synchronize(device=None) -> None:
        return None

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def get_device_name(device=None) -> str:
        return platform.processor() or platform.machine() or "cpu"

    @staticmethod
    def get_device_properties(device=None):
        return types.SimpleNamespace(name=HostDeviceModule.get_device_name(),
                                     total_memory=_total_memory())

    @staticmethod
    def memory_stats(device=None) -> dict:
        peak = _peak_rss()
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak,
                "num_alloc_retries": 0, "num_ooms": 0}

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        try:  # Linux: writing 5 to clear_refs resets VmHWM
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    @staticmethod
    def empty_cache() -> None:
        return None

    def __getattr__(self, name):
        return getattr(torch.cpu, name)


_HOST = HostDeviceModule()


# ---- 4: FSDP2 over gloo ----

def _make_disable_division(orig):
    @functools.wraps(orig)
    def disable_fsdp_gradient_division(model):
        orig(model)
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return
        if "gloo" not in str(dist.get_backend()).lower():
            return
        from torch.distributed.fsdp import FSDPModule
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
    return disable_fsdp_gradient_division


# ---- 5: FlexAttention off CUDA ----

def _flex_as_sdpa(orig):
    @functools.wraps(orig)
    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks, score_mod=None, scale=None,
                enable_gqa=False, out_transform=None, **kwargs):
        if q_BLNH.device.type == "cuda":
            return orig(self, q_BLNH, k_BLNH, v_BLNH, attention_masks=attention_masks,
                        score_mod=score_mod, scale=scale, enable_gqa=enable_gqa,
                        out_transform=out_transform, **kwargs)
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError(
                "lowp.torch.patch_torchtitan: FlexAttention off CUDA runs as SDPA with the "
                "materialized block mask; score_mod and out_transform (LSE) are not supported")
        from torch.nn.attention.flex_attention import create_mask
        B, L, _, _ = q_BLNH.shape
        S = k_BLNH.shape[1]
        mask = create_mask(attention_masks.mask_mod, B, None, L, S, device=q_BLNH.device)
        out = torch.nn.functional.scaled_dot_product_attention(
            q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2),
            attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2)
    return forward


# ---- 6: torchtitan's MXFP8 converters on lowp's kernels ----

def _make_capability(orig):
    @functools.wraps(orig)
    def has_cuda_capability(major, minor):
        from .torchao_patch import is_patched
        return True if is_patched() else orig(major, minor)
    return has_cuda_capability


# ---- 7: the token dispatcher's index kernel off CUDA ----

def _make_permute_indices(orig):
    @functools.wraps(orig)
    def generate_permute_indices(tokens_per_expert_group, experts_per_rank, num_ranks, max_len,
                                 alignment, use_cpu=False):
        if tokens_per_expert_group.device.type != "cuda":
            use_cpu = True
        out = orig(tokens_per_expert_group, experts_per_rank, num_ranks, max_len, alignment,
                   use_cpu=use_cpu)
        dev = tokens_per_expert_group.device
        return tuple(t.to(dev) for t in out)
    return generate_permute_indices


# ---- the targets ----

_Target = Tuple[str, str, Callable[[object], object], bool]  # module, name, make, host only


def _device_targets() -> List[_Target]:
    both = ("device_type", "device_module")
    mods = (("tools.utils", both), ("components.metrics", both),
            ("models.common.token_dispatcher", both), ("distributed.utils", both),
            ("distributed.parallel_dims", ("device_type",)), ("tools.profiler", ("device_module",)))
    value = {"device_type": lambda o: "cpu", "device_module": lambda o: _HOST}
    return [(f"{_TT}.{m}", n, value[n], True) for m, names in mods for n in names]


def _targets() -> List[_Target]:
    return _device_targets() + [
        (f"{_TT}.distributed.fsdp", "disable_fsdp_gradient_division", _make_disable_division,
         False),
        (f"{_TT}.models.common.attention:FlexAttention", "forward", _flex_as_sdpa, False),
        (f"{_TT}.components.quantization.mx", "has_cuda_capability", _make_capability, False),
        ("torchao.prototype.moe_training.ep.permute", "generate_permute_indices",
         _make_permute_indices, False),
    ]


def _version() -> str:
    try:
        import torchtitan
    except Exception as e:
        raise RuntimeError(f"lowp.torch.patch_torchtitan: torchtitan is not importable "
                           f"({type(e).__name__}: {e}); nothing was patched") from None
    return str(getattr(torchtitan, "__version__", "unknown"))


def _resolve(module: str):
    mname, _, cname = module.partition(":")
    m = importlib.import_module(mname)
    return getattr(m, cname) if cname else m


def _plan(version: str, host: bool):
    """[(owner, name, replacement)] for every target, or RuntimeError naming what is missing."""
    where = f"torchtitan {version}"
    if ".".join(version.split("+")[0].split(".")[:2]) not in TESTED_VERSIONS:
        raise RuntimeError(f"lowp.torch.patch_torchtitan: {where} is not a tested version "
                           f"(tested: {', '.join(TESTED_VERSIONS)}); nothing was patched")
    plan = []
    for module, name, make, host_only in _targets():
        if host_only and not host:
            continue
        try:
            owner = _resolve(module)
        except Exception as e:
            raise RuntimeError(f"lowp.torch.patch_torchtitan: {where} has no module {module} "
                               f"({type(e).__name__}: {e}); nothing was patched") from None
        orig = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if orig is None:
            raise RuntimeError(f"lowp.torch.patch_torchtitan: {where} lacks "
                               f"{module.replace(':', '.')}.{name}; nothing was patched")
        plan.append((owner, name, orig, make(orig)))
    return plan


def patch_torchtitan() -> None:
    """Install the fixes of the module docstring. Idempotent; ``unpatch_torchtitan()`` undoes
    it. Raises RuntimeError (and patches nothing) on an untested torchtitan or a missing
    internal."""
    with _LOCK:
        if _ORIGINALS:
            return
        from torch._utils import _get_available_device_type
        plan = _plan(_version(), _get_available_device_type() is None)
        saved = []
        try:
            for owner, name, orig, new in plan:
                saved.append((owner, name, orig))
                setattr(owner, name, new)
        except BaseException:
            for owner, name, orig in reversed(saved):
                setattr(owner, name, orig)
            raise
        _ORIGINALS.extend(saved)


def unpatch_torchtitan() -> None:
    """Put back every object ``patch_torchtitan()`` replaced (no-op when not patched)."""
    with _LOCK:
        while _ORIGINALS:
            owner, name, orig = _ORIGINALS.pop()
            setattr(owner, name, orig)


def torchtitan_patched() -> bool:
    return bool(_ORIGINALS)
