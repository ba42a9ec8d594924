"""What can change a weight's values without moving its own version counter, for the
quantized-copy caches (`lowp.torch.WeightCache`, the caches of `patch_torchao()`).

A tensor's `_version` misses three kinds of writes:

- FSDP2 (`fully_shard`) copies each all-gather into the unsharded parameter under
  `torch.autograd._unsafe_preserve_version_counter`: the unsharded parameter the ops see keeps
  its version while the optimizer updates the sharded one. `fsdp_token(t)` maps an unsharded
  parameter (or a view of it) to the versions of its sharded parameter. The FSDP2 modules are
  learnt from a global module forward pre-hook (installed by the first `WeightCache` or cache
  lookup after `fully_shard` sharded a module; it runs before FSDP2's own unshard hook and only
  records the module's parameter group).
- Optimizer steps that write through `.data` or outside autograd: every step of a
  `torch.optim.Optimizer` (a global step post-hook) moves `epoch()`.
- Writes through `.data`, a numpy view of the storage or `_unsafe_preserve_version_counter`
  outside an optimizer step are seen by nothing: the caches therefore reuse a copy only in a
  forward recomputed inside a backward pass, where such a write would already break
  autograd's saved tensors; `invalidate_weight_caches()` moves `epoch()` by hand.
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["epoch", "fsdp_token", "install", "invalidate_weight_caches"]

_EPOCH = [0]


def epoch() -> int:
    """A counter moved by every optimizer step and by `invalidate_weight_caches()`."""
    return _EPOCH[0]


def invalidate_weight_caches() -> None:
    """Make every cached quantized weight copy stale. Needed only after writing weights in a
    way no version counter sees (`p.data.copy_(...)`, a numpy view of the storage) outside an
    optimizer step; in-place updates of the parameter itself and optimizer steps are seen."""
    _EPOCH[0] += 1


def _on_optimizer_step(optimizer, args, kwargs) -> None:
    _EPOCH[0] += 1


register_optimizer_step_post_hook(_on_optimizer_step)


class _Fsdp2:
    """Unsharded FSDP2 parameter -> its FSDPParam (weakly), learnt from the parameter groups
    of the FSDP2 modules that ran a forward."""

    def __init__(self):
        self.groups = weakref.WeakSet()
        self.params = WeakIdKeyDictionary()  # unsharded parameter -> weakref(FSDPParam)
        self.dirty = False
        self.handle = None

    def install(self) -> None:
        if self.handle is None:
            self.handle = torch.nn.modules.module.register_module_forward_pre_hook(self.hook)

    def hook(self, module, args) -> None:
        get = getattr(module, "_get_fsdp_state", None)
        if get is None:  # not an FSDPModule
            return
        group = getattr(get(), "_fsdp_param_group", None)
        if group is not None and group not in self.groups:
            self.groups.add(group)
            self.dirty = True

    def _rebuild(self) -> None:
        dirty = False
        for group in list(self.groups):
            for fp in group.fsdp_params:
                u = getattr(fp, "_unsharded_param", None)
                if u is None:
                    dirty = True  # not gathered yet
                else:
                    self.params[u] = weakref.ref(fp)
        self.dirty = dirty

    def find(self, t: torch.Tensor):
        for c in (t, t._base):
            if c is None:
                continue
            ref = self.params.get(c)
            if ref is None and self.dirty:
                self._rebuild()
                ref = self.params.get(c)
            if ref is not None:
                return ref()
        return None


_FSDP2 = _Fsdp2()


_FSDP2_MODULE = "torch.distributed.fsdp._fully_shard._fully_shard"


def _fsdp2_used() -> bool:
    """Whether `fully_shard` has sharded a module in this process (FSDP2 records the class it
    makes for each sharded module class)."""
    mod = sys.modules.get(_FSDP2_MODULE)
    get = getattr(mod, "get_cls_to_fsdp_cls", None)
    return bool(get is not None and get())


def install() -> None:
    """Start learning FSDP2 modules, once `fully_shard` has sharded one (idempotent). Before
    that no module can be an FSDP2 one, and no hook is installed: a global forward hook costs
    every module call of the process about 2 us (torch's slower call path)."""
    if _FSDP2.handle is None and _fsdp2_used():
        _FSDP2.install()


def fsdp_token(t: torch.Tensor):
    """None for a tensor that is not (a view of) an FSDP2 unsharded parameter; else the
    versions of its sharded parameter (the DTensor and its local tensor), which every update
    of the master weight moves. A module sharded before the hook was installed is learnt at
    its next forward; until then its copies were made from the values of this step (any
    write between goes with a forward, which registers it and so changes the token)."""
    if _FSDP2.handle is None:
        install()
    if not _FSDP2.groups:
        return None
    fp = _FSDP2.find(t)
    if fp is None:
        return None
    sp = fp.sharded_param
    local = getattr(sp, "_local_tensor", sp)
    return (id(fp), sp._version, local._version)
