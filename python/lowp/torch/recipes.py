"""Named recipes: which weights of a model run in which low precision.

Usage::

    wrapped = lowp.torch.apply_recipe(model, "mix")            # {fqn: config}
    lowp.torch.apply_recipe(model, "all_mxfp8", rules=[("layers.0.*", None)], verbose=True)

A rule is ``(pattern, config)``: ``pattern`` an ``fnmatch`` glob over the parameter's full name
(``layers.3.moe.experts.w1``, ``layers.0.attention.wq.weight``), ``config`` a lowp config, a
preset name, or ``None`` (stays high precision). The first matching rule wins; ``rules`` are
tried before the recipe's own. The recipe's rules are the C library's (src/train/recipe.c,
through ``lowp.rules``; `lowp train` uses the same table) and follow both lowp's models' names
and torchtitan's, before 0.3.0 and in 0.3.0 (DeepSeek-V3, llama3, qwen3):

    router          *router*                                       high precision (always)
    embeddings      *embed*                                        high precision (always)
    output          head*, *.head, output*, *.output.*, *lm_head*  high precision (always)
    norms           *norm*                                         high precision (always)
    last block      layers.{last}.*, *.layers.{last}.*             high precision (nvfp4, mxfp4;
                    {last} is the highest N of the model's names holding "layers.N.")
    routed experts  *.moe.experts.* (lowp; torchtitan before 0.3.0: layers.N.moe.experts.w1),
                    *.moe.routed_experts.* (0.3.0: layers.N.moe.routed_experts.inner_experts.w1_EFD)
    shared experts  *.moe.shared_experts.*, *.moe.shared.*
    everything else *                                      (attention, dense feed-forward...)

``plan_recipe(names, name)`` looks names up without a model (``{name: config or None}``);
``apply_recipe(..., verbose=True)`` writes what it wrapped to stderr and warns for each rule
that decided no parameter (the library never prints to stdout).

Only parameters the param swap can run are candidates: ``nn.Linear`` weights and 3-D expert
weights (``ParamSwapConfig``'s default filter). The recipes:

    all_mxfp8      every weight MXFP8
    mix            attention, shared experts, dense layers MXFP8; routed experts Block FP8
    mix_fp4        mix, with MXFP4 fake quantization of the routed-expert weights
    nvfp4          every weight NVFP4 (TransformerEngine's recipe: SR gradients, the wgrad
                   Hadamard transform), the last transformer block in BF16
    mxfp4          every weight MXFP4 with SR gradients and the wgrad Hadamard transform
                   (Tseng et al. 2025), the last transformer block in BF16
    all_block_fp8  every weight Block FP8 (32x32 E8M0 weights, MX activations)
    block128       DeepSeek-V3 1x128 / 128x128
    fp8_rowwise    rowwise FP8
    fp8_delayed    tensorwise FP8 with delayed scaling (HYBRID: E5M2 gradients)
    fp8_current    tensorwise FP8 with current scaling (HYBRID)
    bf16           nothing wrapped

Each group of weights sharing a config is wrapped through torchao's own ``quantize_`` with a
``ParamSwapConfig``.
"""

import fnmatch
import re
import sys
import warnings
from collections.abc import Iterable

import torch.nn as nn

from .. import rules as _rules
from .config import (Block128Config, BlockQuantizeConfig, Float8RowwiseConfig,
                     Float8TensorwiseConfig, MXQuantizeConfig, NVFP4QuantizeConfig)
from .config import ParamSwapConfig
from .quantize import _default_params_filter, _owners, param_swap_filter
from .tensor import LowpWeight

# A rule: (label, patterns, config). A name matches a rule when it matches any of its patterns
# (fnmatch globs over the full parameter name); the first matching rule wins.

# The recipes are the C library's table (src/train/recipe.c, read through lowp.rules): ordered
# (pattern, preset or None) rules. This module adds only the config of each C preset and the
# labels under which the notices group consecutive patterns.
_PRESET_CONFIGS = {
    "bf16": lambda: None,
    "fp8_delayed": lambda: Float8TensorwiseConfig(delayed=True),
    "fp8_current": lambda: Float8TensorwiseConfig(),
    "fp8_rowwise": lambda: Float8RowwiseConfig(),
    "mxfp8": lambda: MXQuantizeConfig(),
    "block128": lambda: Block128Config(),
    "block_fp8": lambda: BlockQuantizeConfig(),
    "block_fp8_fp4": lambda: BlockQuantizeConfig(
        mxfp4_fake_quantize_config=MXQuantizeConfig(dtype="fp4")),
    "nvfp4": lambda: NVFP4QuantizeConfig(),
    "mxfp4": lambda: MXQuantizeConfig(dtype="fp4", grad_output_rounding="sr",
                                      wgrad_hadamard=True),
}
_LABELS = {"*router*": "router", "*embed*": "embeddings", "*norm*": "norms",
           **dict.fromkeys(("head*", "*.head", "output*", "*.output.*", "*lm_head*"), "output"),
           **dict.fromkeys(("*.moe.experts.*", "*.moe.routed_experts.*"), "routed experts"),
           **dict.fromkeys(("*.moe.shared_experts.*", "*.moe.shared.*"), "shared experts"),
           "*": "everything else",
           **dict.fromkeys(("layers.{last}.*", "*.layers.{last}.*"), "last block")}

RECIPES = tuple(_rules.TABLES["recipes"])


_LAYER_N = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _last_block(names):
    """The highest N of the names holding ``layers.N.`` at their start or after a dot (-1:
    none), what C's lowp_train_prepare binds ``{last}`` to (lowp_recipe_bind_last)."""
    ns = [int(m.group(1)) for n in names for m in _LAYER_N.finditer(n)]
    return max(ns) if ns else -1


def _recipe_table(name, last=-1):
    """[(label, patterns, config)] of the C recipe `name`, in its order, ``{last}`` bound to
    the last transformer block ``last`` (-1: left literal, matching no name); consecutive rules
    with one label and one preset form one rule (one config object per preset)."""
    if not isinstance(name, str) or name not in RECIPES:
        raise ValueError("name (%r) is not a recipe (%s)" % (name, ", ".join(RECIPES)))
    configs, table = {}, []
    for raw, preset in _rules.recipe(name):
        pattern = raw.replace("{last}", str(last)) if last >= 0 else raw
        if preset not in configs:
            configs[preset] = _PRESET_CONFIGS[preset]() if preset else None
        cfg, label = configs[preset], _LABELS.get(raw, pattern)
        if table and table[-1][0] == label and table[-1][2] is cfg:
            table[-1] = (label, table[-1][1] + (pattern,), cfg)
        else:
            table.append((label, (pattern,), cfg))
    return table


def _check_rules(rules):
    if rules is None:
        return []
    if isinstance(rules, dict):
        rules = list(rules.items())
    if isinstance(rules, (str, bytes)) or not hasattr(rules, "__iter__"):
        raise TypeError("rules must be a list of (pattern, config) pairs, a dict or None, not "
                        f"{type(rules).__name__}")
    out = []
    for i, r in enumerate(rules):
        if not (isinstance(r, (tuple, list)) and len(r) == 2 and isinstance(r[0], str)):
            raise TypeError("rules[%d] (%r) must be a (pattern, config) pair" % (i, r))
        out.append(("rules[%d]" % i, (r[0],), r[1]))
    return out


def _table(name, rules, names=()):
    return _check_rules(rules) + _recipe_table(name, _last_block(names))


def _first_match(fqn, table):
    """The index of the first rule of `table` matching `fqn` (None: no rule matches)."""
    for i, (_, pats, _) in enumerate(table):
        if any(fnmatch.fnmatchcase(fqn, p) for p in pats):
            return i
    return None


def _describe(cfg):
    return cfg if isinstance(cfg, str) else repr(cfg)


def _candidates(model):
    """[(fqn, candidate)] for every parameter of `model` (first name of a tied one):
    candidate is whether the param swap can wrap it."""
    out = []
    for _, (p, places) in _owners(model).items():
        owner, leaf, fqn = places[0]
        out.append((fqn, not isinstance(p, LowpWeight) and _default_params_filter(owner, leaf, p)))
    return out


def _check_names(names):
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise TypeError("names (%r) must be an nn.Module or an iterable of parameter names"
                        % (names,))
    names = list(names)
    for i, n in enumerate(names):
        if not isinstance(n, str):
            raise TypeError("names[%d] (%r) must be a str" % (i, n))
    return names


def _plan(items, table):
    """({fqn: config or None} over the (fqn, candidate) items, hits per rule): a rule's hit is
    a name it decided (first match), counted for high-precision rules over every name and for
    the others over candidates only."""
    plan, hits = {}, [0] * len(table)
    for fqn, cand in items:
        i = _first_match(fqn, table)
        if i is not None and (cand or table[i][2] is None):
            hits[i] += 1
        plan[fqn] = table[i][2] if (i is not None and cand) else None
    return plan, hits


def plan_recipe(model, name, rules=None):
    """What the recipe `name` (with the caller's `rules` first) does, changing nothing.

    `model` an nn.Module: {fqn: config} of the weights it would wrap. `model` an iterable of
    parameter names (no module needed, e.g. a checkpoint's keys): {name: config or None} for
    every name, None meaning high precision: the rules' answer for a weight of that name
    (which names the param swap can wrap, 2-D linear and 3-D expert weights, takes the
    module)."""
    if isinstance(model, nn.Module):
        items = _candidates(model)
        plan, _ = _plan(items, _table(name, rules, [f for f, _ in items]))
        return {k: v for k, v in plan.items() if v is not None}
    names = _check_names(model)
    plan, _ = _plan([(n, True) for n in names], _table(name, rules, names))
    return plan


def _unmatched_notices(name, table, hits):
    for (label, pats, cfg), n in zip(table, hits):
        if n == 0 and pats != ("*",):  # a catch-all is meant for no parameter in particular
            warnings.warn("lowp.torch.apply_recipe(%r): rule %s (%s -> %s) matched no parameter"
                          % (name, label, ", ".join(pats), _describe(cfg)), stacklevel=3)


def apply_recipe(model, name, rules=None, verbose=False):
    """Wrap ``model``'s weights by the recipe ``name`` (see the module docstring). Returns
    ``{fqn: config}`` of what was wrapped. ``verbose=True`` writes that list to stderr and
    warns once for each rule (the caller's, the high-precision ones and the recipe's groups,
    not a catch-all "*") that decided no parameter, e.g. a routed-expert rule that missed a
    model's expert names."""
    from torchao.quantization import quantize_

    items = _candidates(model)
    table = _table(name, rules, [f for f, _ in items])
    full, hits = _plan(items, table)
    plan = {k: v for k, v in full.items() if v is not None}
    groups = {}
    for fqn, cfg in plan.items():
        groups.setdefault(id(cfg), (cfg, set()))[1].add(fqn)
    for cfg, names in groups.values():
        quantize_(model,
                  ParamSwapConfig(weight_config=cfg,
                                  params_filter_fn=lambda p, fqn, names=names: fqn in names),
                  filter_fn=param_swap_filter)
    if verbose:
        width = max([len(f) for f in plan] + [4])
        lines = ["lowp.torch.apply_recipe(%r): %d weights wrapped" % (name, len(plan))]
        lines += ["  %-*s  %s" % (width, f, _describe(c)) for f, c in plan.items()]
        sys.stderr.write("\n".join(lines) + "\n")
        _unmatched_notices(name, table, hits)
    return plan
