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
import threading
import weakref
from typing import Optional

import torch
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.weak import WeakIdKeyDictionary

from ..config import MatmulSpec

__all__ = ["WeightCache", "epoch", "fsdp_token", "install", "invalidate_weight_caches"]

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


# ---- the weight cache ----

class WeightCache:
    """Quantized copies of weights, reused only by a forward that runs inside a backward pass
    (activation-checkpoint recomputation), while nothing can have changed them. A forward
    outside a backward always quantizes afresh and stores its copies: no counter sees a write
    through `.data` or numpy between two forwards.

    Keyed by the weight tensor's storage (its identity, not its address: FSDP2 frees an
    unsharded weight's memory at each reshard and gathers into newly allocated memory of the
    same storage), storage offset, shape, strides, dtype, device and the recipe. An entry is
    reused only while all of these are unchanged (`lowp.torch._weight_epochs`):
    - the tensor's `_version` (in-place updates of the parameter or a view of it);
    - the optimizer epoch: every `torch.optim` optimizer step moves it (a global step
      post-hook), so does `lowp.torch.invalidate_weight_caches()`;
    - for an FSDP2 unsharded parameter (or a view of it), the versions of its sharded
      parameter: FSDP2 writes each all-gather into the unsharded one without moving its
      version;
    and while its storage is the one the copies were made from (a weak reference: a new
    tensor whose storage reuses a freed one's address never hits). Within one call, the
    backward reads the copies its forward made (kept on the autograd context), never the
    cache. Counters: `quantizations` (copies made), `hits` (reuses).

    `version_fn` (optional, no arguments): the version to compare instead of the tensor's own
    `_version`, for a wrapper whose op-time tensors do not share the master weight's version
    counter (e.g. `lambda: master._version`)."""

    def __init__(self, version_fn=None):
        if version_fn is not None and not callable(version_fn):
            raise TypeError("version_fn must be callable or None")
        self.quantizations = 0
        self.hits = 0
        self._entries = {}
        self._version_fn = version_fn
        install()

    def _key(self, w: Tensor, spec: MatmulSpec):
        return (w.untyped_storage()._cdata, w.storage_offset(), tuple(w.shape),
                tuple(w.stride()), w.dtype, str(w.device),
                spec.weight, spec.fake_quant_mxfp4, spec.input.quantized,
                spec.grad_output.quantized)

    def lookup(self, w: Tensor, spec: MatmulSpec, make):
        key = self._key(w, spec)
        e = self._entries.get(key)
        storage = w.untyped_storage()
        own = self._version_fn() if self._version_fn is not None else w._version
        version = (own, epoch(), fsdp_token(w))
        if (e is not None and _in_backward() and e[0] == version and not e[1].expired()
                and e[1].cdata == storage._cdata):
            self.hits += 1
            return e[2]
        value = make()
        self.quantizations += 1
        self._entries[key] = (version, StorageWeakRef(storage), value)
        # forget entries whose weights are gone
        for k in [k for k, v in self._entries.items() if v[1].expired()]:
            del self._entries[k]
        return value

    def clear(self):
        self._entries.clear()

    def __len__(self):
        return len(self._entries)


def _in_backward() -> bool:
    """Whether autograd is running a backward pass in this thread (activation-checkpoint
    recomputation runs the forward again there)."""
    return torch._C._current_graph_task_id() != -1


class _InputMemo:
    """The quantized copies of the last forward input, for the next matmul on the same input:
    the model's q, k and v projections (and w1, w3 of a SwiGLU, dense or routed) read one
    tensor, which was quantized once per projection.

    Only for an input whose values are provably those of the entry: one produced by an op of
    an autograd graph (`_graph_anchor`: the tensor, or the base of the view, has a grad_fn),
    the same tensor object (a weak reference), at the same version. Such a tensor changes only
    through in-place ops, which bump the version; autograd itself relies on that. A leaf, a
    tensor without a graph (no_grad, inference_mode, `torch.from_numpy` over a buffer that
    numpy refills, writes through `x.data`, none of which moves a version) is quantized on
    every call. A hit also needs the same storage (alive), offset, shape, strides, dtype and
    version of the bytes quantized, the same values of `offs`, and the same operand spec and
    axes. Under no_grad or inference_mode (`enable(False)`, set by each call) nothing is
    reused or kept: an evaluation loop has no graph to vouch for a tensor made earlier, which a
    `.data` write could have changed. Per thread, one entry; cleared by every backward."""

    def __init__(self):
        self._local = threading.local()

    def enable(self, on: bool) -> None:
        """Whether the next matmuls of this thread may use the memo (grad mode, as the caller
        of the autograd function saw it: inside its forward grad mode is always off)."""
        self._local.on = on
        if not on:
            self._local.entry = None

    @staticmethod
    def _key(t: Tensor):
        st = t.untyped_storage()
        return (st._cdata, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype,
                t.device, t._version)

    def get(self, anchor: Tensor, x: Tensor, offs: Optional[Tensor], what, make):
        """The value for x (quantized from anchor's memory), made by make() on a miss."""
        if not getattr(self._local, "on", True):
            return make()
        key = (self._key(anchor), self._key(x), None if offs is None else tuple(offs.tolist()),
               what)
        e = getattr(self._local, "entry", None)
        if e is not None and e[0] == key and e[1]() is anchor and not e[2].expired():
            return e[3]
        value = make()
        self._local.entry = (key, weakref.ref(anchor), StorageWeakRef(x.untyped_storage()),
                             value)
        return value

    def clear(self):
        self._local.entry = None


def _graph_anchor(x: Tensor) -> Optional[Tensor]:
    """The tensor whose autograd history vouches for x's values (x, or the base of view x)
    when it has a grad_fn, else None (no memo)."""
    base = x._base if x._is_view() else x
    return base if base.grad_fn is not None else None

