"""The wrapper weight: :class:`LowpWeight`, the tensor subclass a wrapped parameter holds,
and its routes from torch's matmuls to lowp's low-precision ones.

A wrapped parameter is an ``nn.Parameter`` whose data is a :class:`LowpWeight`: a wrapper
tensor subclass holding the master weight (a plain tensor; storage, dtype, in-place updates and
``requires_grad`` all refer to it), the matmul config, a :class:`lowp.torch.WeightCache` and,
for delayed scaling, the owning module's FP8 state. ``lowp.torch.quantize`` wraps and unwraps
parameters (the param swap); this module owns what the wrapper does:

- ``__torch_function__`` routes ``F.linear``, ``torch.mm``, ``torch.matmul`` (and ``@``),
  ``torch.addmm``, ``torch.bmm`` and ``torch._grouped_mm`` with a wrapped weight operand to
  ``lowp.torch.linear`` / ``mm`` / ``grouped_mm`` (forward and backward in low precision).
- ``__torch_dispatch__`` runs every other op on the master weight and returns plain tensors,
  except the ops that still denote the weight (views, copies, ``copy_``, ``zero_``...,
  ``_WEIGHT_OPS``): their results stay wrapped, so an expert weight sliced out of a 3-D
  parameter, ``model.to(dtype)`` or an FSDP2 shard still runs in low precision.
  An in-place op on a wrapper updates the master and bumps its version.
- Pickling a wrapper (``torch.save(model.state_dict())``) stores the plain master tensor: the
  checkpoint loads with ``torch.load(weights_only=True)`` into a prepared or a plain model.
- FSDP2: the wrapper is kept on the shards (the sharding ops are in ``_WEIGHT_OPS``) and
  ``fsdp_pre_all_gather`` / ``fsdp_post_all_gather`` gather the master shards and wrap the
  unsharded weight again (FSDP's own all-gather buffer, no copy). The quantized copies are
  never served stale: see ``lowp.torch.WeightCache``.
"""

import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from .ops import WeightCache
from .ops import linear as _lops
from ._autocast import autocast_dtype, exact

aten = torch.ops.aten

# Ops whose result still denotes the weight (the wrapper is kept). View-like ones share the
# parent's quantized-copy cache; the others own new storage and get a cache of their own.
_VIEW_OPS = {
    aten.detach,
    aten.alias,
    aten.view,
    aten._unsafe_view,
    aten.as_strided,
    aten.slice,
    aten.select,
    aten.unsqueeze,
    aten.squeeze,
    aten.permute,
    aten.transpose,
    aten.t,
    aten.split,
    aten.split_with_sizes,
}
_COPY_OPS = {
    aten.clone,
    aten.copy_,
    aten._to_copy,
    aten.index,
    aten.empty_like,
    aten.new_zeros,
    aten.zero_,
    aten.fill_,
    aten._pin_memory,
}
_WEIGHT_OPS = _VIEW_OPS | _COPY_OPS

_ids = itertools.count(1)


def _in_backward():
    """True while the autograd engine runs a backward pass: a forward seen now is the
    recomputation of an activation checkpoint."""
    return torch._C._current_graph_task_id() != -1


class _Unwrap(torch.autograd.Function):
    """The master weight as a plain tensor, differentiable back to the wrapper."""

    @staticmethod
    def forward(ctx, w):
        return _operand(w)

    @staticmethod
    def backward(ctx, grad):
        return grad


def _operand(w):
    """The weight as a plain tensor for the ops: a view of the root master tensor made here, at
    the autograd level, so it shares the root's version counter (views made inside
    __torch_dispatch__ get counters of their own, which optimizer updates never bump) and the
    WeightCache sees every update of the storage."""
    return _master_view(w).detach()


def _master_view(w):
    """w's data as the root tensor itself or an autograd-level view of it."""
    d, r = w._data, w._root
    if d is r or (d.size() == r.size() and d.stride() == r.stride()
                  and d.storage_offset() == r.storage_offset()):
        return r
    with torch.no_grad():
        return r.as_strided(d.size(), d.stride(), d.storage_offset())


def _unwrap_for_op(w):
    with torch._C.DisableTorchFunctionSubclass():
        if torch.is_grad_enabled() and w.requires_grad:
            return _Unwrap.apply(w)
        return _operand(w)


class LowpWeight(torch.Tensor):
    """A weight wrapped for low-precision matmuls (see the module docstring)."""

    @staticmethod
    def __new__(cls, data, config, cache=None, fp8_state=None, token=None, root=None):
        if not isinstance(data, torch.Tensor) or isinstance(data, LowpWeight):
            raise TypeError("data must be a plain torch.Tensor, got %s" % type(data).__name__)
        return torch.Tensor._make_wrapper_subclass(
            cls,
            data.size(),
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=data.dtype,
            layout=data.layout,
            device=data.device,
            requires_grad=data.requires_grad,
        )

    def __init__(self, data, config, cache=None, fp8_state=None, token=None, root=None):
        self._data = data
        # The tensor that owns the storage (the master weight itself for a parameter; for a
        # view of it, the parent's root): its version counter is the one that tells updates.
        self._root = data if root is None else root
        # Whose version counts the optimizer's updates (the sharded master under FSDP2).
        self._version_source = self._root
        self._config = config
        self._cache = cache if cache is not None else WeightCache()
        self._fp8_state = fp8_state
        # Identifies the weight for the FP8 state's once-per-step bookkeeping.
        self._token = token if token is not None else next(_ids)

    # ---- metadata ----
    @property
    def config(self):
        return self._config

    @property
    def master(self):
        """The master weight: a plain tensor sharing this wrapper's storage and the version
        counter that in-place updates bump."""
        return _master_view(self)

    @property
    def cache(self):
        return self._cache

    @property
    def data(self):
        return torch.Tensor.data.__get__(self, type(self))

    @data.setter
    def data(self, value):
        _assign_master(self, value)

    @property
    def fp8_state(self):
        return self._fp8_state

    def __repr__(self):
        return "LowpWeight(%r, config=%r)" % (self._data, self._config)

    def data_ptr(self):
        return self._data.data_ptr()

    def untyped_storage(self):
        return self._data.untyped_storage()

    def _like(self, data, view):
        new = LowpWeight(
            data,
            self._config,
            cache=self._cache if view else None,
            fp8_state=self._fp8_state,
            token=self._token,
            root=self._root if view else None,
        )
        if view:
            new._version_source = self._version_source
            if hasattr(self, "_gathered_at"):
                new._gathered_at = self._gathered_at
        return new

    # ---- torch.compile / swap_tensors / FSDP2 ----
    def __tensor_flatten__(self):
        return ["_data"], (self._config, self._cache, self._fp8_state, self._token)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        config, cache, st, token = meta
        return LowpWeight(inner["_data"], config, cache=cache, fp8_state=st, token=token)

    def fsdp_pre_all_gather(self, mesh, outer_size=None, outer_stride=None, module=None,
                            mp_policy=None):
        data = self._data
        if mp_policy is not None and getattr(mp_policy, "param_dtype", None) is not None:
            data = data.to(mp_policy.param_dtype)
        return (data,), None

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        # The unsharded wrapper wraps FSDP's all-gather output itself, no copy: lowp's kernels
        # read CPU tensors without making their storage non-resizable (lowp/_arrays.py), so
        # FSDP2 frees that buffer at every reshard (resize to 0) and gathers into it again.
        # FSDP keeps the buffer's version counter across its copy-out (the backward's re-gather
        # does not invalidate what the forward saved); the sharded master's version tells
        # whether an optimizer step changed the weight, and then the quantized copies are
        # dropped.
        (data,) = all_gather_outputs
        if out is not None:
            target = out._local_tensor if hasattr(out, "_local_tensor") else out
            root = target._root
            if not (root.untyped_storage()._cdata == data.untyped_storage()._cdata
                    and root.data_ptr() == data.data_ptr()):
                root.data.copy_(data)  # another buffer than the first time: through .data
            v = self._root._version
            if getattr(target, "_gathered_at", None) != v:
                target._cache = WeightCache()
                target._gathered_at = v
            target._version_source = self._root
            return
        new = LowpWeight(data, self._config, fp8_state=self._fp8_state, token=self._token)
        new._version_source = self._root
        new._gathered_at = self._root._version
        return new, (data,)

    # ---- pickling ----
    def __reduce_ex__(self, proto):
        # A parameter (a whole-module torch.save) comes back wrapped, with its config and FP8
        # state; anything else (state_dict entries are detached) is the master weight alone, a
        # plain tensor that torch.load(weights_only=True) reads.
        if isinstance(self, nn.Parameter):
            return (_rebuild_parameter,
                    (self._data.detach(), self._config, self.requires_grad, self._fp8_state))
        return self._data.detach().__reduce_ex__(proto)

    def __deepcopy__(self, memo):
        import copy

        # The FP8 state is copied through the memo: a deep copy of a model gives its module
        # and its weights one new state (sharing the original's, the copy's amaxes went there).
        st = copy.deepcopy(self._fp8_state, memo)
        new = LowpWeight(self._data.detach().clone(), copy.deepcopy(self._config, memo),
                         fp8_state=st)
        if st is not None:
            st.track(new._token)
        new.requires_grad_(self.requires_grad)
        if isinstance(self, nn.Parameter):  # a parameter's copy is a parameter too
            new = nn.Parameter(new, requires_grad=self.requires_grad)
        memo[id(self)] = new
        return new

    # ---- routing ----
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        route = _ROUTES.get(func)
        if route is not None:
            out = route(*args, **kwargs)
            if out is not NotImplemented:
                return out
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = []
        inner_to_outer = {}

        def unwrap(t):
            if not first:
                first.append(t)
            inner_to_outer[id(t._data)] = t
            return t._data

        uargs, ukwargs = pytree.tree_map_only(LowpWeight, unwrap, (args, kwargs))
        out = func(*uargs, **ukwargs)
        packet = func.overloadpacket
        if func._schema.is_mutable:
            # The master changed: bump its version so that cached quantized copies expire.
            for i, a in enumerate(func._schema.arguments):
                if a.alias_info is None or not a.alias_info.is_write:
                    continue
                val = args[i] if i < len(args) else kwargs.get(a.name)
                for t in pytree.tree_leaves(val):
                    if isinstance(t, LowpWeight):
                        torch.autograd.graph.increment_version(t._root)
            # In-place ops return their (wrapped) self.
            return pytree.tree_map_only(
                torch.Tensor, lambda t: inner_to_outer.get(id(t), t), out)
        if packet not in _WEIGHT_OPS:
            return out
        src = first[0]
        share = packet in _VIEW_OPS

        def rewrap(t):
            if not t.is_floating_point():
                return t
            return src._like(t, share)

        return pytree.tree_map_only(torch.Tensor, rewrap, out)


torch.serialization.add_safe_globals([LowpWeight])


def _assign_master(w, value):
    """``w.data = value`` (also ``nn.utils.vector_to_parameters``): value becomes the master
    weight, shared as ``.data =`` shares it on a plain tensor, so the forward, the state dict
    and the optimizer (which holds ``w``) all see it; the quantized copies start afresh. The
    wrapper's shape, dtype, device and strides are fixed at prepare (torch's set_data would
    change the wrapper's metadata but not the master it reads): a value that differs in any of
    them raises ValueError naming the parameter."""
    name = getattr(w, "_fqn", None) or "a wrapped weight %s" % (tuple(w.shape),)
    if isinstance(value, LowpWeight):
        value = value._data
    if not isinstance(value, torch.Tensor):
        raise TypeError("%s: .data must be set to a torch.Tensor, got %s"
                        % (name, type(value).__name__))
    for what, have, got in (("shape", tuple(w.shape), tuple(value.shape)),
                            ("dtype", w.dtype, value.dtype), ("device", w.device, value.device),
                            ("strides", w.stride(), value.stride())):
        if have != got:
            raise ValueError(
                "%s: .data = a tensor of %s %s, but the prepared (lowp-wrapped) weight has %s "
                "(copy into it with .data.copy_(t), or convert the model before changing it)"
                % (name, what, got, have))
    data = value.detach()
    w._data = w._root = w._version_source = data
    w._cache = WeightCache()
    if hasattr(w, "_gathered_at"):
        del w._gathered_at


def _opkw(w):
    return dict(cache=w._cache, fp8_state=_live_fp8_state(w))


def _live_fp8_state(w):
    st = w._fp8_state
    if st is not None and not _in_backward():
        st.before_use(w._token, w._version_source._version, w._version_source)
    return st


# ---- the routes: (args as the torch function takes them) -> result or NotImplemented ----


def _route_linear(input, weight, bias=None):
    if not isinstance(weight, LowpWeight) or isinstance(input, LowpWeight):
        return NotImplemented
    if isinstance(bias, LowpWeight):
        bias = bias._data
    return _lops.linear(input, _unwrap_for_op(weight), bias, weight._config, **_opkw(weight))


def _mm_wrapped_right(a, b):
    """a [M, K] plain, b [K, N] wrapped."""
    return _lops.mm(a, _unwrap_for_op(b), b._config, **_opkw(b))


def _route_mm(input, mat2, *, out=None, **kw):
    if out is not None or kw:
        return NotImplemented
    if isinstance(mat2, LowpWeight) and not isinstance(input, LowpWeight):
        return _mm_wrapped_right(input, mat2)
    if isinstance(input, LowpWeight) and not isinstance(mat2, LowpWeight):
        # W @ x = (xᵀ Wᵀ)ᵀ: the weight stays the quantized right operand.
        with torch._C.DisableTorchFunctionSubclass():
            wt = input.t()  # stays wrapped (dispatch keeps t)
        return _mm_wrapped_right(mat2.t(), wt).t()
    return NotImplemented


def _route_matmul(input, other, *, out=None):
    if out is not None:
        return NotImplemented
    if isinstance(other, LowpWeight) and not isinstance(input, LowpWeight):
        if other.dim() == 2 and input.dim() >= 2:
            lead = input.shape[:-1]
            y = _mm_wrapped_right(input.reshape(-1, input.shape[-1]), other)
            return y.reshape(*lead, other.shape[-1])
        if other.dim() == 3 and input.dim() == 3:
            return _route_bmm(input, other)
        return NotImplemented
    if isinstance(input, LowpWeight) and not isinstance(other, LowpWeight):
        if input.dim() == 2 and other.dim() == 2:
            return _route_mm(input, other)
    return NotImplemented


def _route_addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    """beta * input + alpha * (mat1 @ mat2): the product in mat1's dtype, the sum, then one
    rounding to what torch.addmm returns: the autocast dtype of mat1's device type when
    autocast is enabled there (lowp's autocast rule), else the sum's dtype."""
    if out is not None:
        return NotImplemented
    dev = mat1.device.type
    with exact(dev):
        y = _route_mm(mat1, mat2)
        if y is NotImplemented:
            return NotImplemented
        if alpha != 1:
            y = y * alpha
        if beta != 0:
            y = y + (input if beta == 1 else beta * input)
    return y.to(autocast_dtype(dev, y.dtype))


def _route_bmm(input, mat2, *, out=None):
    """Batched matmul with a wrapped [B, K, N] weight: a grouped mm with B equal groups."""
    if out is not None or not isinstance(mat2, LowpWeight) or isinstance(input, LowpWeight):
        return NotImplemented
    B, M, K = input.shape
    offs = torch.arange(1, B + 1, device=input.device, dtype=torch.int32) * M
    y = _lops.grouped_mm(input.reshape(B * M, K), _unwrap_for_op(mat2), offs, mat2._config,
                         **_opkw(mat2))
    return y.reshape(B, M, mat2.shape[-1])


def _route_grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if not isinstance(mat_b, LowpWeight) or isinstance(mat_a, LowpWeight):
        return NotImplemented
    if offs is None or bias is not None or mat_a.dim() != 2 or mat_b.dim() != 3:
        return NotImplemented
    y = _lops.grouped_mm(mat_a, _unwrap_for_op(mat_b), offs, mat_b._config, **_opkw(mat_b))
    if out_dtype is not None and y.dtype != out_dtype:
        y = y.to(out_dtype)
    return y


_ROUTES = {
    F.linear: _route_linear,
    torch.mm: _route_mm,
    torch.Tensor.mm: _route_mm,
    torch.matmul: _route_matmul,
    torch.Tensor.matmul: _route_matmul,
    torch.Tensor.__matmul__: _route_matmul,
    torch.addmm: _route_addmm,
    torch.bmm: _route_bmm,
    torch.Tensor.bmm: _route_bmm,
}
if hasattr(torch, "_grouped_mm"):
    _ROUTES[torch._grouped_mm] = _route_grouped_mm


def _rmatmul(self, other):
    return _route_matmul(other, self)


_ROUTES[torch.Tensor.__rmatmul__] = lambda self, other: _rmatmul(self, other)


def _rebuild_parameter(master, config, requires_grad, fp8_state):
    """Unpickling a wrapped parameter: the same wrapper around the master weight, a new weight
    cache, tracked by its module's FP8 state (pickled with the module)."""
    if not isinstance(master, torch.Tensor) or isinstance(master, LowpWeight):
        raise TypeError("_rebuild_parameter: master must be a plain tensor, got %s"
                        % type(master).__name__)
    p = nn.Parameter(LowpWeight(master, config, fp8_state=fp8_state), requires_grad=requires_grad)
    if fp8_state is not None:
        fp8_state.track(p._token)
    return p
