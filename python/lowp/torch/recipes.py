"""Named recipes: which weights of a model run in which low precision.

Usage::

    wrapped = lowp.torch.apply_recipe(model, "mix")            # {fqn: config}
    lowp.torch.apply_recipe(model, "all_mxfp8", rules=[("layers.0.*", None)], verbose=True)

A rule is ``(pattern, config)``: ``pattern`` an ``fnmatch`` glob over the parameter's full name
(``layers.3.moe.experts.w1``, ``layers.0.attention.wq.weight``), ``config`` a lowp config, a
preset name, or ``None`` (stays high precision). The first matching rule wins; ``rules`` are
tried before the recipe's own. The recipe's rules follow torchtitan's DeepSeek naming:

    *router*, *tok_embeddings*, output*, *norm*   high precision (always)
    *.moe.experts.*                               routed experts
    *.moe.shared_experts.*                        shared experts
    *.attention.*                                 attention projections
    *                                             everything else (dense feed-forward...)

Only parameters the param swap can run are candidates: ``nn.Linear`` weights and 3-D expert
weights (``ParamSwapConfig``'s default filter). The recipes:

    all_mxfp8      every weight MXFP8
    mix            attention, shared experts, dense layers MXFP8; routed experts Block FP8
    mix_fp4        mix, with MXFP4 fake quantization of the routed-expert weights
    all_block_fp8  every weight Block FP8 (32x32 E8M0 weights, MX activations)
    block128       DeepSeek-V3 1x128 / 128x128
    fp8_rowwise    rowwise FP8
    fp8_delayed    tensorwise FP8 with delayed scaling (HYBRID: E5M2 gradients)
    bf16           nothing wrapped

Each group of weights sharing a config is wrapped through torchao's own ``quantize_`` with a
``ParamSwapConfig``.
"""

import fnmatch

from .param_swap import (LowpWeight, ParamSwapConfig, _default_params_filter, _owners,
                         param_swap_filter)

# Always high precision, whatever the recipe (checked first).
_HIGH_PRECISION = [
    ("*router*", None),
    ("*tok_embeddings*", None),
    ("*embed*", None),
    ("output*", None),
    ("*.output.*", None),
    ("lm_head*", None),
    ("*norm*", None),
]


def _cfgs():
    import lowp.torch as lt

    return lt


def _recipe_table(name):
    lt = _cfgs()
    mx = lt.MXQuantizeConfig
    blk = lt.BlockQuantizeConfig
    if name == "all_mxfp8":
        return [("*", mx())]
    if name == "mix":
        return [("*.moe.experts.*", blk()), ("*", mx())]
    if name == "mix_fp4":
        return [("*.moe.experts.*", blk(mxfp4_fake_quantize_config=mx(dtype="fp4"))),
                ("*", mx())]
    if name == "all_block_fp8":
        return [("*", blk())]
    if name == "block128":
        return [("*", lt.Block128Config())]
    if name == "fp8_rowwise":
        return [("*", lt.Float8RowwiseConfig())]
    if name == "fp8_delayed":
        return [("*", lt.Float8TensorwiseConfig(delayed=True))]
    if name == "bf16":
        return [("*", None)]
    raise ValueError("name (%r) is not a recipe (%s)" % (name, ", ".join(RECIPES)))


RECIPES = ("all_mxfp8", "mix", "mix_fp4", "all_block_fp8", "block128", "fp8_rowwise",
           "fp8_delayed", "bf16")


def _check_rules(rules):
    if rules is None:
        return []
    if isinstance(rules, dict):
        rules = list(rules.items())
    out = []
    for i, r in enumerate(rules):
        if not (isinstance(r, (tuple, list)) and len(r) == 2 and isinstance(r[0], str)):
            raise TypeError("rules[%d] (%r) must be a (pattern, config) pair" % (i, r))
        out.append((r[0], r[1]))
    return out


def _first_match(fqn, rules):
    for pat, cfg in rules:
        if fnmatch.fnmatchcase(fqn, pat):
            return True, cfg
    return False, None


def _describe(cfg):
    return cfg if isinstance(cfg, str) else repr(cfg)


def plan_recipe(model, name, rules=None):
    """{fqn: config} the recipe would wrap (nothing is changed)."""
    table = _check_rules(rules) + _HIGH_PRECISION + _recipe_table(name)
    plan = {}
    for _, (p, places) in _owners(model).items():
        owner, leaf, fqn = places[0]
        if isinstance(p, LowpWeight) or not _default_params_filter(owner, leaf, p):
            continue
        hit, cfg = _first_match(fqn, table)
        if hit and cfg is not None:
            plan[fqn] = cfg
    return plan


def apply_recipe(model, name, rules=None, verbose=False):
    """Wrap ``model``'s weights by the recipe ``name`` (see the module docstring). Returns
    ``{fqn: config}`` of what was wrapped; ``verbose=True`` also prints it."""
    from torchao.quantization import quantize_

    plan = plan_recipe(model, name, rules)
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
        print("lowp.torch.apply_recipe(%r): %d weights wrapped" % (name, len(plan)))
        for fqn, cfg in plan.items():
            print("  %-*s  %s" % (width, fqn, _describe(cfg)))
    return plan
