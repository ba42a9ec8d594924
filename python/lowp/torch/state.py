"""Training state that lives beside the weights: the delayed-scaling FP8 state (docs/numerics.md
section 5) with its extra-state blob, and the RNG states tracker.

**Delayed scaling**, for the param swap, on the device of the weights.

One :class:`DelayedScalingState` per module that owns delayed-scaled wrapped weights
(``Float8TensorwiseConfig(delayed=True)``), shared by its weights, with three roles (input,
weight, grad_output). It implements the ``fp8_state`` protocol of ``lowp.torch.linear``
(``scale(role)``, ``record(role, amax)``):

- ``amax_history`` ``[3, L]`` and ``scales`` ``[3]``, float32 tensors on the device of the
  weights that use the state: after ``module.to(device)`` they follow at the weights' next use
  (and in ``fp8_states`` and ``load_state_dict``); ``module.to(dtype)`` never casts them.
- ``record`` keeps the max of this step's amaxes in row 0 (NaN sticks) on the device, without a
  host synchronization. Inside a backward pass (activation-checkpoint recomputation) the input
  and weight roles are not recorded a second time (``skipped_records`` counts them).
- The update (roll, new scales) runs once per optimizer step: the first forward after a wrapped
  weight's version changed triggers it (so gradient-accumulation micro-batches share the
  scales); :meth:`update` runs it explicitly. When ``torch.distributed`` is initialized, the
  staging amaxes are MAX all-reduced over ``group`` (default: the default group) first, so the
  scales are identical on every rank.
- The owning module keeps the state in its attribute ``_lowp_fp8_state``, and two hooks of
  its own (``register_state_dict_post_hook``, ``register_load_state_dict_pre_hook``; its class
  is unchanged, convert removes them) put it in its state dict as ``<prefix>_extra_state``,
  TransformerEngine's key and what ``get_extra_state`` would write: lowp's versioned blob
  (``include/lowp/checkpoint.h``, the bytes of ``src/train/extra_state.c``) as a uint8 CPU
  tensor; before reading the state it synchronizes the state's own device (``torch.accelerator``
  or the device type's module, never ``torch.cuda`` for a state that is not on CUDA).
  ``load_state_dict()`` takes that tensor, ``bytes``, or the legacy ``io.BytesIO`` holding the
  blob, validates all of it first (a corrupt blob raises ``ValueError`` and changes nothing),
  then places the state on the device of the module's weights.

**The RNG states tracker**: named random-generator states for any device (docs/numerics.md
section 7).

Usage::

    tracker = lowp.torch.RNGStatesTracker(device=model_device)
    tracker.add("model-parallel-rng", seed=1234)
    with tracker.fork("model-parallel-rng"):
        y = F.dropout(x, p=0.1)        # draws from the named state, not the default one
    states = tracker.get_states()     # for checkpoints and activation recomputation
    tracker.set_states(states)

Each named state is made by ``torch.Generator(device=...)`` for the tracker's device, whatever
its type. ``fork`` swaps the named state into that device's default generator (CPU:
``torch.default_generator``; another device type: its own module's ``get_rng_state`` /
``set_rng_state``, e.g. ``torch.xpu`` or ``torch.npu``) and restores the default state on exit,
so code inside draws from the named state and code outside sees the default sequence as if the
fork had not happened. ``torch.cuda`` is touched only when the device is a CUDA device.
"""

import contextlib
import io
import math
import struct
import weakref
import zlib

import numpy as np
import torch

from .config import resolve_config
from .ops import library as _library  # noqa: F401  (defines torch.ops.lowp.delayed_update)

try:  # the C library's update and blob (absent on a host without the extension)
    from .._numpy_api import _lowp as _ext
except ImportError:  # pragma: no cover - depends on the build
    _ext = None

ROLES = ("input", "weight", "grad_output")
_ROLE_INDEX = {r: i for i, r in enumerate(ROLES)}
_FORMAT_CODES = {"e4m3": 3, "e5m2": 4}  # lowp_format values
_FORMAT_NAMES = {v: k for k, v in _FORMAT_CODES.items()}
_ALGOS = {"max": 0, "most_recent": 1}

MAGIC = b"LOWPXST1"
VERSION = 1
_HEAD = 16
_FIXED = 16
_CRC = 4
_ROLES_OFFSET = 32


def _payload_bytes(L):
    R = len(ROLES)
    return _FIXED + 4 * R + 4 * R * (L + 1)


def pack_blob(history, scales, formats, margin=0.0, amax_compute_algo="max"):
    """The version-1 blob of a state: ``history`` ``[3, L]`` and ``scales`` ``[3]`` (float32,
    any device), ``formats`` ("e4m3"/"e5m2" per role). Returns ``bytes``: the C library's
    (src/train/extra_state.c) where the extension is importable, else ``_pack_torch``'s, the
    same bytes."""
    h = history.detach().to("cpu", torch.float32).contiguous()
    s = scales.detach().to("cpu", torch.float32).contiguous()
    R, L = h.shape
    if R != len(ROLES) or s.shape != (R,):
        raise ValueError("history must be [3, L] and scales [3], got %s and %s" %
                         (tuple(h.shape), tuple(s.shape)))
    if _ext is None:
        return _pack_torch(h, s, formats, margin, amax_compute_algo)
    # raw memory (h and s stay alive for the call): .numpy() would pin the state's storage
    return _ext.extra_state_pack(L, float(margin), amax_compute_algo, tuple(formats),
                                 (h.data_ptr(), 4 * h.numel()), (s.data_ptr(), 4 * s.numel()))


def _pack_torch(h, s, formats, margin, amax_compute_algo):
    """pack_blob's bytes from CPU float32 history [3, L] and scales [3], in Python."""
    R, L = h.shape
    body = struct.pack("<IIfI", R, L, float(margin), _ALGOS[amax_compute_algo])
    body += struct.pack("<%dI" % R, *[_FORMAT_CODES[f] for f in formats])
    rows = torch.cat([h, s[:, None]], dim=1)  # per role: L amaxes, then the scale
    body += rows.numpy().astype("<f4").tobytes()
    data = MAGIC + struct.pack("<II", VERSION, len(body)) + body
    return data + struct.pack("<I", zlib.crc32(data) & 0xFFFFFFFF)


def _blob_bytes(state):
    if isinstance(state, io.BytesIO):
        return state.getvalue()
    if isinstance(state, (bytes, bytearray, memoryview)):
        return bytes(state)
    if isinstance(state, torch.Tensor):
        if state.dtype != torch.uint8:
            raise TypeError("the extra state must be a uint8 tensor, got dtype %s" % state.dtype)
        # a copy's numpy view: .numpy() of the caller's tensor would make its storage
        # non-resizable
        return state.detach().cpu().clone().numpy().tobytes()
    raise TypeError("the extra state must be a uint8 tensor, bytes or io.BytesIO, got %s" %
                    type(state).__name__)


def unpack_blob(blob, formats, history_len):
    """Validate a blob completely and return ``(history [3, history_len], scales [3])`` as
    float32 CPU tensors, in the module's history length (row 0 kept, the most recent rows
    aligned at the end, oldest dropped or zero-padded). Raises ``ValueError`` naming what is
    wrong (truncated, magic, version, sizes, CRC, formats, values). The C library reads it
    where the extension is importable, else ``_unpack_torch``, with the same rules."""
    p = _blob_bytes(blob)
    if _ext is None:
        return _unpack_torch(p, formats, history_len)
    hist = np.zeros((len(ROLES), int(history_len)), np.float32)
    scales = np.zeros(len(ROLES), np.float32)
    try:  # margin and algorithm: the module's win (the blob's are validated only)
        _ext.extra_state_unpack(p, int(history_len), 0.0, "max", tuple(formats), hist, scales)
    except ValueError as e:
        msg = str(e).split(": ", 1)[-1]  # the C function's name -> this entry point's
        raise ValueError("set_extra_state: " + msg) from None
    return torch.from_numpy(hist), torch.from_numpy(scales)


def _check_header(p, fn):
    """The blob's magic, version, size and CRC-32; returns the payload's byte count."""
    n = len(p)
    if n < _HEAD + _CRC:
        raise ValueError("%s: the blob has %d bytes (< %d): it is truncated" %
                         (fn, n, _HEAD + _CRC))
    if p[:8] != MAGIC:
        raise ValueError('%s: bad magic (the blob does not start with "%s")' %
                         (fn, MAGIC.decode()))
    version, payload = struct.unpack_from("<II", p, 8)
    if version != 1:
        raise ValueError("%s: version (%d) is not one this library reads (1 to %d)" %
                         (fn, version, VERSION))
    if _HEAD + payload + _CRC != n:
        raise ValueError("%s: payload bytes (%d) + %d != the blob's %d bytes: it is truncated "
                         "or has trailing bytes" % (fn, payload, _HEAD + _CRC, n))
    (crc,) = struct.unpack_from("<I", p, n - _CRC)
    want = zlib.crc32(p[:n - _CRC]) & 0xFFFFFFFF
    if crc != want:
        raise ValueError("%s: CRC-32 (0x%08x) != computed (0x%08x): the blob is corrupt" %
                         (fn, crc, want))
    if payload < _FIXED:
        raise ValueError("%s: payload bytes (%d) < %d" % (fn, payload, _FIXED))
    return payload


def _check_fixed(p, payload, formats, fn):
    """The payload's fixed part (roles, history length, margin, algorithm, formats); returns
    the history length L."""
    roles, L, margin, algo = struct.unpack_from("<IIfI", p, 16)
    R = len(ROLES)
    if roles != R:
        raise ValueError("%s: role count (%d) != %d" % (fn, roles, R))
    if L < 1:
        raise ValueError("%s: history length (%d) < 1" % (fn, L))
    if _payload_bytes(L) != payload:
        raise ValueError("%s: payload bytes (%d) != %d for history length %d" %
                         (fn, payload, _payload_bytes(L), L))
    if not math.isfinite(margin):
        raise ValueError("%s: margin (%g) is not finite" % (fn, margin))
    if algo not in (0, 1):
        raise ValueError("%s: amax algorithm (%d) is not 0 (max) or 1 (most_recent)" % (fn, algo))
    codes = struct.unpack_from("<%dI" % R, p, _ROLES_OFFSET)
    for r, f in enumerate(codes):
        if f not in _FORMAT_NAMES:
            raise ValueError("%s: format of role %d (%d) is not e4m3 (3) or e5m2 (4)" % (fn, r, f))
        if _FORMAT_NAMES[f] != formats[r]:
            raise ValueError("%s: format of role %d (%s) in the blob is %s, the module's is %s"
                             % (fn, r, ROLES[r], _FORMAT_NAMES[f], formats[r]))
    return L


def _unpack_torch(p, formats, history_len):
    """unpack_blob of the bytes p, in Python."""
    fn = "set_extra_state"
    L = _check_fixed(p, _check_header(p, fn), formats, fn)
    R = len(ROLES)
    off = _ROLES_OFFSET + 4 * R
    vals = np.frombuffer(p, dtype="<f4", count=R * (L + 1), offset=off).reshape(R, L + 1)
    hist_in = torch.from_numpy(vals[:, :L].astype(np.float32))
    scales = torch.from_numpy(vals[:, L].astype(np.float32))
    for r in range(R):
        bad = (hist_in[r] < 0).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise ValueError("%s: amax history of role %d, row %d (%g) < 0" %
                             (fn, r, i, float(hist_in[r, i])))
        sc = float(scales[r])
        if not (math.isfinite(sc) and sc > 0.0):
            raise ValueError("%s: scale of role %d (%g) is not finite and > 0" % (fn, r, sc))
    Lm = int(history_len)
    hist = torch.zeros(R, Lm, dtype=torch.float32)
    hist[:, 0] = hist_in[:, 0]
    keep = min(Lm, L) - 1
    if keep > 0:
        hist[:, Lm - keep:] = hist_in[:, L - keep:]
    return hist, scales


def synchronize_device(device):
    """Wait for the work queued on ``device`` (and only that device). Never touches
    ``torch.cuda`` unless ``device`` is a CUDA device; nothing to do on the CPU."""
    device = torch.device(device)
    if device.type in ("cpu", "meta"):
        return
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        cur = acc.current_accelerator()
        if cur is not None and cur.type == device.type:
            acc.synchronize(device)
            return
    mod = getattr(torch, device.type, None)
    if mod is None or not hasattr(mod, "synchronize"):
        raise RuntimeError("cannot synchronize device %s: torch.%s.synchronize does not exist" %
                           (device, device.type))
    mod.synchronize(device)


def _in_backward():
    return torch._C._current_graph_task_id() != -1


class DelayedScalingState:
    """Amax histories and scales of one module's delayed-scaled weights (see module doc)."""

    def __init__(self, formats=("e4m3", "e4m3", "e5m2"), history_len=1024, margin=0.0,
                 amax_compute_algo="max", device=None, group=None):
        formats = tuple(formats)
        if len(formats) != len(ROLES) or any(f not in _FORMAT_CODES for f in formats):
            raise ValueError("formats (%r) must be 3 of 'e4m3'/'e5m2' (input, weight, "
                             "grad_output)" % (formats,))
        if isinstance(history_len, bool) or not isinstance(history_len, int) or history_len < 1:
            raise ValueError("history_len (%r) must be an int >= 1" % (history_len,))
        if not math.isfinite(float(margin)):
            raise ValueError("margin (%r) is not finite" % (margin,))
        if amax_compute_algo not in _ALGOS:
            raise ValueError("amax_compute_algo (%r) is not 'max' or 'most_recent'" %
                             (amax_compute_algo,))
        self.formats = formats
        self.history_len = history_len
        self.margin = float(margin)
        self.amax_compute_algo = amax_compute_algo
        dev = torch.device(device) if device is not None else torch.device("cpu")
        self.amax_history = torch.zeros(len(ROLES), history_len, dtype=torch.float32, device=dev)
        self.scales = torch.ones(len(ROLES), dtype=torch.float32, device=dev)
        self.group = group
        self.records = {r: 0 for r in ROLES}
        self.skipped_records = 0
        self.updates = 0
        self._seen = {}
        self._sources = {}  # token -> weak reference to the tensor whose version it saw
        self._tracked = set()
        self._pending = False  # unpickled with an update owed: run it at the first use

    @classmethod
    def for_config(cls, config, device=None):
        spec = resolve_config(config)
        return cls(formats=(spec.input.format, spec.weight.format, spec.grad_output.format),
                   history_len=spec.history_len, margin=spec.margin,
                   amax_compute_algo=spec.amax_compute_algo, device=device)

    @property
    def device(self):
        return self.amax_history.device

    # ---- the fp8_state protocol ----
    def scale(self, role):
        """The scale to multiply by for ``role``: a float32 0-dim tensor on the state's device."""
        return self.scales[_ROLE_INDEX[role]].clone()

    def scale_inv(self, role):
        return torch.reciprocal(self.scales[_ROLE_INDEX[role]])

    def record(self, role, amax):
        """Keep the max of this step's amaxes of ``role`` in row 0 (NaN sticks)."""
        i = _ROLE_INDEX[role]
        if role != "grad_output" and _in_backward():
            self.skipped_records += 1  # a recomputed forward: recorded already
            return
        a = torch.as_tensor(amax).detach().to(device=self.device, dtype=torch.float32)
        a = a.abs().amax() if a.dim() else a.abs()
        h0 = self.amax_history[i, 0]
        self.amax_history[i, 0] = torch.where(torch.isnan(a) | (a > h0), a, h0)
        self.records[role] += 1

    # ---- once per optimizer step ----
    def track(self, token):
        self._tracked.add(token)

    def before_use(self, token, version, source=None):
        """Called before a wrapped weight's matmul: runs the update when this weight's version
        differs from the one it had at its previous use (an optimizer step happened), or at
        the first use after unpickling a state that owed one. ``source``: the tensor whose
        version ``version`` is (kept weakly, for pickling)."""
        if source is not None and source.device != self.device:
            self.to(source.device)  # its weights moved (module.to): the state follows them
        seen = self._seen.get(token)
        if (seen is not None and seen != version) or (seen is None and self._pending):
            self.update()
            self._seen = {}
            self._pending = False
        self._seen[token] = version
        if source is not None:
            self._sources[token] = weakref.ref(source)

    def _owes_update(self):
        """Whether a weight used since the last update has changed since (an optimizer step):
        its next use runs the update."""
        if self._pending:
            return True
        for token, version in self._seen.items():
            ref = self._sources.get(token)
            src = ref() if ref is not None else None
            if src is not None and src._version != version:
                return True
        return False

    def update(self):
        """Reduce the staging amaxes (distributed), then docs/numerics.md section 5 through the
        `lowp::delayed_update` op: the C library's lowp_delayed_update for a state on the CPU
        where the extension is built, the portable torch kernel on any other device (the same
        bits); torch's dispatcher chooses."""
        staging = self.amax_history[:, 0].clone()
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(staging, op=dist.ReduceOp.MAX, group=self.group)
        self.amax_history[:, 0] = staging
        torch.ops.lowp.delayed_update(self.amax_history, self.scales, list(self.formats),
                                      float(self.margin), self.amax_compute_algo)
        self.updates += 1

    # ---- pickling (a whole-module torch.save) ----
    def __getstate__(self):
        # The per-step bookkeeping is keyed by this process's weight tokens: the unpickled
        # weights track themselves again. A process group does not pickle: the default group
        # (None) is used until set_reduce_group names another.
        # Whether an update is owed (a step since the last use) is kept: the unpickled state
        # runs it at its first use, as this one would.
        d = dict(self.__dict__)
        d["_pending"] = self._owes_update()
        d["_seen"], d["_sources"], d["_tracked"], d["group"] = {}, {}, set(), None
        return d

    # ---- device placement ----
    def to(self, device):
        device = torch.device(device)
        self.amax_history = self.amax_history.to(device)
        self.scales = self.scales.to(device)
        return self

    # ---- checkpoints ----
    def state_blob(self):
        """The extra-state blob (bytes), read after synchronizing the state's device."""
        synchronize_device(self.device)
        return pack_blob(self.amax_history, self.scales, self.formats, self.margin,
                         self.amax_compute_algo)

    def load_blob(self, blob):
        hist, scales = unpack_blob(blob, self.formats, self.history_len)  # raises: untouched
        self.amax_history.copy_(hist.to(self.device))
        self.scales.copy_(scales.to(self.device))
        synchronize_device(self.device)
        self._seen = {}
        # A checkpoint is taken at a step boundary (after optimizer.step(), where trainers save
        # it): amaxes staged in row 0 since the last update mean that update is owed, and the
        # first forward runs it, as it would have in the run that saved it. After an update
        # row 0 is zero, so a checkpoint taken right after one (the C trainer's, which updates
        # at the step) owes nothing.
        self._pending = bool((self.amax_history[:, 0] != 0).any())

    def state_tensor(self):
        b = self.state_blob()
        return torch.frombuffer(bytearray(b), dtype=torch.uint8)


# ---- the owning module: its `_extra_state` through state-dict hooks ----

_STATE_ATTR = "_lowp_fp8_state"  # the module's DelayedScalingState (in its __dict__)
_HOOKS_ATTR = "_lowp_fp8_hooks"  # the handles of the two hooks below
EXTRA_STATE_SUFFIX = "_extra_state"  # torch's (and TransformerEngine's) key: <prefix>_extra_state


def _state_of(module):
    return module.__dict__.get(_STATE_ATTR)


def _follow_weights(module, st):
    """Place ``st`` on the device of ``module``'s weights that use it (the state follows its
    weights, never their dtype; a weight's next use moves it too)."""
    for p in module.parameters(recurse=False):
        if getattr(p, "fp8_state", None) is st:
            if p.device != st.device:
                st.to(p.device)
            return


def _state_dict_post_hook(module, state_dict, prefix, local_metadata):
    """``module.state_dict()`` gets ``<prefix>_extra_state``: the state's blob as a uint8 CPU
    tensor (read after synchronizing the state's device)."""
    st = _state_of(module)
    if st is None:
        return
    # get_extra_state's place: after the module's own tensors, before its children's (which
    # the state dict holds already when this hook runs), so checkpoints keep their order.
    children = tuple(prefix + name + "." for name in module._modules)
    later = [k for k in state_dict if k.startswith(children)] if children else []
    moved = [(k, state_dict.pop(k)) for k in later]
    state_dict[prefix + EXTRA_STATE_SUFFIX] = st.state_tensor()
    state_dict.update(moved)


def _load_state_dict_pre_hook(module, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
    """``module.load_state_dict()`` reads ``<prefix>_extra_state`` into the state (validated
    completely first: a corrupt blob raises ``ValueError`` and changes nothing) and takes the
    key out of the module's own view of the state dict, so that a strict load does not report
    it; a state dict without it reports the key missing, as ``set_extra_state`` did."""
    st = _state_of(module)
    key = prefix + EXTRA_STATE_SUFFIX
    if st is None:
        return
    if key not in state_dict:
        missing_keys.append(key)
        return
    blob = state_dict[key]
    if len(_blob_bytes(blob)) == 0:
        raise ValueError("set_extra_state: the blob is empty (a stateless module's), but this "
                         "module has delayed-scaling state")
    _follow_weights(module, st)
    st.load_blob(blob)
    del state_dict[key]  # load_state_dict's own copy: the module's keys are checked after


def attach(module, state):
    """Give ``module`` the delayed-scaling ``state``: the attribute ``_lowp_fp8_state`` and
    the state-dict hooks that write and read it as ``<prefix>_extra_state``. The module's class
    is not changed; the hooks are module-level functions that find the state on the module, so
    a whole-module ``torch.save`` / ``copy.deepcopy`` carries both, each copy with its own."""
    detach_state(module)
    object.__setattr__(module, _STATE_ATTR, state)
    handles = (module.register_state_dict_post_hook(_state_dict_post_hook),
               module.register_load_state_dict_pre_hook(_load_state_dict_pre_hook))
    object.__setattr__(module, _HOOKS_ATTR, handles)


def detach_state(module):
    """Undo :func:`attach` (convert): remove the hooks and the state."""
    for handle in module.__dict__.pop(_HOOKS_ATTR, ()):
        handle.remove()
    module.__dict__.pop(_STATE_ATTR, None)


def fp8_states(model):
    """(module name, DelayedScalingState) of every module of ``model`` that has one, each on
    the device of its module's weights."""
    out = []
    for n, m in model.named_modules():
        st = _state_of(m)
        if st is not None:
            _follow_weights(m, st)
            out.append((n, st))
    return out


def set_reduce_group(model, group):
    """All-reduce the amaxes of ``model``'s delayed-scaling states over ``group``."""
    for _, st in fp8_states(model):
        st.group = group


def update_all(model):
    """Run every state's update now (instead of at the next forward after a step)."""
    for _, st in fp8_states(model):
        st.update()
        st._seen = {}
        st._pending = False


# ---- the RNG states tracker ----




def _device_module(device):
    mod = getattr(torch, device.type, None)
    if mod is None or not hasattr(mod, "get_rng_state") or not hasattr(mod, "set_rng_state"):
        raise ValueError("device (%s): torch.%s has no get_rng_state/set_rng_state" %
                         (device, device.type))
    return mod


def _get_default_state(device):
    if device.type == "cpu":
        return torch.default_generator.get_state()
    mod = _device_module(device)
    return mod.get_rng_state(device)


def _set_default_state(device, state):
    if device.type == "cpu":
        torch.default_generator.set_state(state)
        return
    _device_module(device).set_rng_state(state, device)


class RNGStatesTracker:
    """Named generator states of one device (see the module docstring)."""

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        if self.device.type != "cpu" and self.device.index is None:
            # The device's generator is per index: pin the current one.
            acc = getattr(torch, "accelerator", None)
            if acc is not None and acc.is_available() and \
                    acc.current_accelerator().type == self.device.type:
                self.device = torch.device(self.device.type, acc.current_device_index())
        self.reset()

    def reset(self):
        self._states = {}
        self._seeds = {}

    @property
    def names(self):
        return list(self._states)

    def add(self, name, seed):
        """Add a state named ``name`` seeded with ``seed``; a used name or seed is refused."""
        if not isinstance(name, str) or not name:
            raise TypeError("name must be a non-empty string, got %r" % (name,))
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError("seed must be an int, got %r" % (seed,))
        if name in self._states:
            raise ValueError("name (%r) is already a state of this tracker" % name)
        if seed in self._seeds.values():
            raise ValueError("seed (%d) is already used by state %r" %
                             (seed, next(n for n, s in self._seeds.items() if s == seed)))
        g = torch.Generator(device=self.device)
        g.manual_seed(seed)
        self._states[name] = g.get_state()
        self._seeds[name] = seed

    def get_states(self):
        """{name: state} (copies), for checkpoints and recomputation."""
        return {n: s.clone() for n, s in self._states.items()}

    def set_states(self, states):
        """Replace the states by ``states`` (as :meth:`get_states` returned them)."""
        if not isinstance(states, dict):
            raise TypeError("states must be a dict {name: ByteTensor}, got %s" %
                            type(states).__name__)
        for n, s in states.items():
            if not isinstance(s, torch.Tensor) or s.dtype != torch.uint8:
                raise TypeError("states[%r] must be a uint8 tensor" % (n,))
        self._states = {n: s.clone() for n, s in states.items()}
        self._seeds = {n: self._seeds.get(n) for n in self._states}

    @contextlib.contextmanager
    def fork(self, name="model-parallel-rng"):
        """Inside, the device's default generator runs from the named state."""
        if name not in self._states:
            raise ValueError("name (%r) is not a state of this tracker (%s)" %
                             (name, ", ".join(self._states) or "none added"))
        saved = _get_default_state(self.device)
        _set_default_state(self.device, self._states[name])
        try:
            yield
        finally:
            self._states[name] = _get_default_state(self.device)
            _set_default_state(self.device, saved)
