"""Named random-generator states for any device (NUMERICS.md section 7).

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

import torch


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
