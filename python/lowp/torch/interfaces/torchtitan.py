"""lowp's recipes in torchtitan 0.3: a model-config converter and config-registry entries.

torchtitan 0.3.0 rewrites the model config before it builds the model (converters of
``ModelConfigConverter``; 0.2's ``register_model_converter`` / ``--model.converters`` are gone,
and only 0.3 is supported here). :class:`LowpConverter` rewrites:

- every ``Linear.Config`` whose weight the recipe quantizes into :class:`LowpLinear`, which
  calls ``lowp.torch.linear`` on its weight;
- every MoE ``GroupedExperts.Config`` into :class:`LowpGroupedExperts`, which calls
  ``lowp.torch.grouped_mm`` on the expert weights themselves (torchtitan's own casts them to
  BF16 first).

Each converted module has a ``lowp.torch.WeightCache``: activation-checkpoint recomputation
(torchtitan's selective AC) reuses its forward's quantized weights; every other forward
quantizes afresh (under FSDP2 too: the cache follows the sharded parameter).

Parameters stay plain ``nn.Parameter`` with torchtitan's names and shapes, so its meta-device
build, FSDP2 and distributed checkpoints need nothing extra. Which weight gets which config is
``lowp.torch.plan_recipe(names, recipe, rules)`` over the weights' full names
(``layers.1.moe.routed_experts.inner_experts.w1_EFD``, ``layers.0.attention.wq.weight``): the
recipes keep ``lm_head``, the router, embeddings and norms in high precision; ``exclude``
(fnmatch globs over those names) keeps more.

``fp8_delayed``: each converted module owns a ``lowp.torch.DelayedScalingState`` (its
``_extra_state`` in checkpoints). :func:`register_fp8_updates` runs every state's update after
each optimizer step (``Optimizer.register_step_post_hook`` on torchtitan's optimizer
container); the registry entries install it through the model spec's
``post_optimizer_build_fn``. Under FSDP2 no weight version moves at a step, so this hook, not
the param swap's version check, is what advances the scales.

From torchtitan's command line (the registry entries below; see docs/torch.md)::

    torchrun --nproc_per_node=1 -m torchtitan.train \\
        --module lowp.torch.interfaces.torchtitan --config deepseek_v3_debugmodel_lowp_mix ...

``<model>_lowp_<recipe>`` exists for ``deepseek_v3_debugmodel`` and ``llama3_debugmodel`` and
every recipe of ``lowp.torch.RECIPES``. In a config registry of one's own:
``lowp_trainer_config(config, "mix", exclude=[...])`` converts a ``Trainer.Config``.
On a machine with no accelerator the entries (and ``lowp_trainer_config``) call
``lowp.torch.patches.torchtitan_patch.patch_torchtitan()`` (torchtitan on the CPU).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional

import torch
import torch.nn.functional as F

from ..ops.cache import WeightCache
from ..ops.linear import grouped_mm, linear
from ..patches.torchtitan_patch import TESTED_VERSIONS, patch_torchtitan
from ..recipes import RECIPES, plan_recipe
from ..state import DelayedScalingState


def _check_version():
    try:
        import torchtitan
    except Exception as e:
        raise RuntimeError(f"lowp.torch.interfaces.torchtitan: torchtitan is not importable "
                           f"({type(e).__name__}: {e})") from None
    v = str(getattr(torchtitan, "__version__", "unknown"))
    if ".".join(v.split("+")[0].split(".")[:2]) not in TESTED_VERSIONS:
        raise RuntimeError(f"lowp.torch.interfaces.torchtitan: torchtitan {v} is not a tested "
                           f"version (tested: {', '.join(TESTED_VERSIONS)})")


_check_version()

from torch.distributed.tensor import DTensor  # noqa: E402
from torchtitan.models.common.linear import Linear  # noqa: E402
from torchtitan.models.common.moe import GroupedExperts  # noqa: E402
from torchtitan.protocols.model import ModelConfigConverter  # noqa: E402

__all__ = ["LowpConverter", "LowpLinear", "LowpGroupedExperts", "lowp_trainer_config",
           "register_fp8_updates", "fp8_modules"]

EXPERT_WEIGHTS = ("w1_EFD", "w2_EDF", "w3_EFD")


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def _is_delayed(cfg) -> bool:
    return bool(getattr(cfg, "delayed", False))


class _Fp8StateMixin:
    """The delayed-scaling state of a converted module (None unless a config is delayed)."""

    def _init_fp8(self, configs):
        delayed = [c for c in configs if _is_delayed(c)]
        self.lowp_fp8_state = DelayedScalingState.for_config(delayed[0]) if delayed else None
        if delayed:  # only these modules get an `_extra_state` key
            self.__class__ = _extra_state_class(type(self))

    def _fp8_for(self, x):
        st = self.lowp_fp8_state
        if st is not None and st.device != x.device:
            st.to(x.device)
        return st


_EXTRA_CLASSES: Dict[type, type] = {}


def _extra_state_class(cls):
    if issubclass(cls, _ExtraStateMixin):
        return cls
    if cls not in _EXTRA_CLASSES:
        _EXTRA_CLASSES[cls] = type(cls.__name__, (_ExtraStateMixin, cls), {})
    return _EXTRA_CLASSES[cls]


class _ExtraStateMixin:
    """The module's delayed-scaling state as lowp's versioned extra-state blob."""

    def get_extra_state(self):
        st = self.lowp_fp8_state
        return st.state_tensor() if st is not None else torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state):
        st = self.lowp_fp8_state
        n = state.numel() if isinstance(state, torch.Tensor) else len(state)
        if st is None and n == 0:
            return
        if st is None or n == 0:
            raise ValueError("set_extra_state: the blob is %s, but this module %s delayed-"
                             "scaling state" % (("empty", "has") if n == 0 else
                                                ("not empty", "has no")))
        st.load_blob(state)


class LowpLinear(_Fp8StateMixin, Linear):
    """torchtitan's ``Linear`` whose forward is ``lowp.torch.linear`` with ``lowp_config``."""

    @dataclass(kw_only=True, slots=True)
    class Config(Linear.Config):
        lowp_config: Any = None

    def __init__(self, config: Config):
        super().__init__(config)
        self.lowp_config = config.lowp_config
        self.lowp_cache = WeightCache()
        self._init_fp8([config.lowp_config])

    def forward(self, x):
        b = _local(self.bias) if self.bias is not None else None
        return linear(x, _local(self.weight), b, self.lowp_config, cache=self.lowp_cache,
                      fp8_state=self._fp8_for(x))


class LowpGroupedExperts(_Fp8StateMixin, GroupedExperts):
    """torchtitan's ``GroupedExperts`` whose three grouped GEMMs are ``lowp.torch.grouped_mm``
    on the expert weights (``lowp_configs``: weight name -> config; None: torch's grouped mm
    in BF16, as torchtitan)."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        lowp_configs: Dict[str, Any] = field(default_factory=dict)

    def __init__(self, config: Config):
        super().__init__(config)
        self.lowp_configs = dict(config.lowp_configs)
        self.lowp_cache = WeightCache()
        self._init_fp8(list(self.lowp_configs.values()))

    def _gmm(self, name, a, w, offs):
        cfg = self.lowp_configs.get(name)
        if cfg is None:
            return torch._grouped_mm(a.bfloat16(), w.bfloat16().transpose(-2, -1), offs=offs)
        return grouped_mm(a, w.transpose(-2, -1), offs, cfg, cache=self.lowp_cache,
                          fp8_state=self._fp8_for(a))

    def forward(self, x_RD, num_tokens_per_expert_E):
        w1, w2, w3 = (_local(getattr(self, n)) for n in EXPERT_WEIGHTS)
        offs = torch.cumsum(num_tokens_per_expert_E, dim=0, dtype=torch.int32)
        h = F.silu(self._gmm("w1_EFD", x_RD, w1, offs)) * self._gmm("w3_EFD", x_RD, w3, offs)
        return self._gmm("w2_EDF", h, w2, offs).type_as(x_RD)


def _replace(model_config, parent, attr, new):
    if parent is None:
        return new
    if isinstance(parent, list):
        parent[attr] = new
    else:
        setattr(parent, attr, new)
    return model_config


def _fields(config) -> dict:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


class LowpConverter(ModelConfigConverter):
    """Rewrites a torchtitan model config by a lowp recipe (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ModelConfigConverter.Config):
        recipe: str = "mix"
        """A recipe of lowp.torch.RECIPES."""
        exclude: list = field(default_factory=list)
        """fnmatch globs over full weight names kept in high precision."""

    def __init__(self, config: Config):
        if config.recipe not in RECIPES:
            raise ValueError("recipe (%r) is not a lowp recipe (%s)"
                             % (config.recipe, ", ".join(RECIPES)))
        if isinstance(config.exclude, (str, bytes)) or not all(
                isinstance(p, str) for p in config.exclude):
            raise TypeError("exclude (%r) must be a list of str globs" % (config.exclude,))
        self.config = config
        self.plan: Dict[str, Any] = {}

    def _lookup(self, names):
        rules = [(p, None) for p in self.config.exclude]
        got = plan_recipe(list(names), self.config.recipe, rules)
        self.plan.update(got)
        return got

    def convert(self, model_config):
        for fqn, cfg, parent, attr in list(model_config.traverse(Linear.Config)):
            if isinstance(cfg, LowpLinear.Config):
                continue
            q = self._lookup([fqn + ".weight"])[fqn + ".weight"]
            if q is not None:
                new = LowpLinear.Config(**_fields(cfg), lowp_config=q)
                model_config = _replace(model_config, parent, attr, new)
        for fqn, cfg, parent, attr in list(model_config.traverse(GroupedExperts.Config)):
            if isinstance(cfg, LowpGroupedExperts.Config):
                continue
            got = self._lookup([f"{fqn}.{w}" for w in EXPERT_WEIGHTS])
            qs = {w: got[f"{fqn}.{w}"] for w in EXPERT_WEIGHTS}
            if any(q is not None for q in qs.values()):
                base = {k: v for k, v in _fields(cfg).items() if k in
                        {f.name for f in dataclasses.fields(GroupedExperts.Config)}}
                new = LowpGroupedExperts.Config(**base, lowp_configs=qs)
                model_config = _replace(model_config, parent, attr, new)
        return model_config


# ---- fp8_delayed: one update per optimizer step ----

def fp8_modules(model_parts) -> list:
    """The modules of ``model_parts`` (a module or a list) that own a delayed-scaling state."""
    parts = [model_parts] if isinstance(model_parts, torch.nn.Module) else list(model_parts)
    return [m for p in parts for m in p.modules()
            if isinstance(m, _Fp8StateMixin) and m.lowp_fp8_state is not None]


def register_fp8_updates(optimizer, model_parts):
    """After each ``optimizer.step()``, update the delayed-scaling state of every converted
    module of ``model_parts`` (all-reduced over the default group when distributed). Returns
    the hook handle, or None when no module has delayed scaling."""
    mods = fp8_modules(model_parts)
    if not mods:
        return None

    def _update(opt, args, kwargs):
        for m in mods:
            m.lowp_fp8_state.update()
    return optimizer.register_step_post_hook(_update)


def _chain_post_optimizer(orig):
    def post_optimizer_build_fn(optimizers, model_parts, parallel_dims):
        if orig is not None:
            orig(optimizers, model_parts, parallel_dims)
        register_fp8_updates(optimizers, model_parts)
    post_optimizer_build_fn.lowp_chained = True
    return post_optimizer_build_fn


def lowp_trainer_config(config, recipe: str, exclude: Optional[Iterable[str]] = None):
    """Convert ``config`` (a torchtitan ``Trainer.Config`` with a ``model_spec``) by ``recipe``:
    the model config rewritten, the fp8 update hook chained to ``post_optimizer_build_fn``,
    and, with no accelerator, torchtitan patched for the CPU. Returns ``config``."""
    spec = getattr(config, "model_spec", None)
    if spec is None:
        raise ValueError("config has no model_spec (a torchtitan Trainer.Config is expected)")
    conv = LowpConverter(LowpConverter.Config(recipe=recipe, exclude=list(exclude or [])))
    spec.model = conv.convert(spec.model)
    if not getattr(spec.post_optimizer_build_fn, "lowp_chained", False):
        spec.post_optimizer_build_fn = _chain_post_optimizer(spec.post_optimizer_build_fn)
    from torch._utils import _get_available_device_type
    if _get_available_device_type() is None:
        patch_torchtitan()
    return config


# ---- config-registry entries: <model>_lowp_<recipe> ----

def _entry(base_module: str, base_fn: str, recipe: str):
    def entry():
        import importlib
        base = getattr(importlib.import_module(base_module), base_fn)()
        return lowp_trainer_config(base, recipe)
    entry.__name__ = entry.__qualname__ = f"{base_fn}_lowp_{recipe}"
    entry.__doc__ = f"torchtitan's {base_fn} with lowp's {recipe} recipe."
    return entry


_BASES = (("torchtitan.models.deepseek_v3.config_registry", "deepseek_v3_debugmodel"),
          ("torchtitan.models.llama3.config_registry", "llama3_debugmodel"))
for _mod, _fn in _BASES:
    for _r in RECIPES:
        globals()[f"{_fn}_lowp_{_r}"] = _entry(_mod, _fn, _r)
del _mod, _fn, _r
