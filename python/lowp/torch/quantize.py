"""The param swap's transform: torchao's ``quantize_`` handler for :class:`ParamSwapConfig`,
the parameter filters, wrapping and unwrapping a model's weights, and the notices for
parameters a ``quantize_`` call leaves out.

Usage::

    import lowp.torch
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATStep
    from lowp.torch import ParamSwapConfig, MXQuantizeConfig

    quantize_(model, ParamSwapConfig(weight_config=MXQuantizeConfig()))   # prepare
    ...train as usual...
    quantize_(model, ParamSwapConfig(step=QATStep.CONVERT))   # or step="convert"

``quantize_`` with its default module filter hands the handler each ``nn.Linear``. To reach the
3-D expert weights of MoE layers too, pass ``filter_fn=lowp.torch.param_swap_filter``: the
handler then runs once on the whole model and ``params_filter_fn(param, fqn)`` sees every
parameter with its full name (``apply_recipe`` does this). Without it, a prepare that leaves
out weights the config would take, and a convert that leaves wrapped ones behind, warn naming
them; ``convert(model)`` unwraps every wrapped parameter whatever the filter.
"""

import sys
import warnings
import weakref

import torch.nn as nn

from . import state as _fs
from .config import ParamSwapConfig, QATStep, resolve_config
from .tensor import LowpWeight

try:  # torchao's entry point; lowp.torch works without torchao, the param swap needs it.
    from torchao.quantization.quant_api import quantize_ as _ao_quantize
    from torchao.quantization.transform_module import register_quantize_module_handler
except ImportError:  # pragma: no cover - torchao is installed by make test
    _ao_quantize = register_quantize_module_handler = None

__all__ = ["param_swap_filter", "wrap_parameters", "unwrap_parameters", "convert",
           "wrapped_parameters"]

def param_swap_filter(module, fqn):
    """A ``quantize_`` module filter that hands ParamSwapConfig's handler the whole model
    once (true at the root only), so that MoE expert weights are reached too."""
    return fqn == ""


def _default_params_filter(owner, leaf, param):
    if isinstance(owner, nn.Linear):
        return leaf == "weight"
    if isinstance(owner, (nn.modules.conv._ConvNd, nn.Embedding, nn.EmbeddingBag)):
        return False
    return param.dim() == 3 and param.is_floating_point()


def _owners(module):
    """id(param) -> [(owner module, leaf name, fqn)], tied parameters included."""
    found = {}
    for mname, mod in module.named_modules(remove_duplicate=False):
        for leaf, p in mod.named_parameters(recurse=False, remove_duplicate=False):
            fqn = leaf if not mname else mname + "." + leaf
            found.setdefault(id(p), (p, []))[1].append((mod, leaf, fqn))
    return found


def _is_delayed(spec):
    return any(getattr(spec, r).delayed for r in ("input", "weight", "grad_output"))


def wrap_parameters(module, config, params_filter_fn=None):
    """Wrap the chosen parameters of ``module`` (the prepare step). Returns the fqns wrapped."""
    if isinstance(config, ParamSwapConfig):
        mm_cfg = config.matmul_config()
    else:
        mm_cfg = resolve_config(config)
    wrapped = []
    states = {}
    for _, (p, places) in _owners(module).items():
        if isinstance(p, LowpWeight):
            continue
        owner, leaf, fqn = places[0]
        if params_filter_fn is not None:
            chosen = params_filter_fn(p, fqn)
        else:
            chosen = _default_params_filter(owner, leaf, p)
        if not chosen:
            continue
        st = None
        if _is_delayed(mm_cfg):
            st = states.get(id(owner))
            if st is None:
                st = _fs.DelayedScalingState.for_config(mm_cfg, device=p.device)
                states[id(owner)] = st
                _fs.attach(owner, st)
        master = p.detach()
        newp = nn.Parameter(LowpWeight(master, mm_cfg, fp8_state=st), requires_grad=p.requires_grad)
        if st is not None:
            st.track(newp._token)
        newp._fqn = fqn  # names the parameter in errors
        for mod, lf, _ in places:
            setattr(mod, lf, newp)
        wrapped.append(fqn)
    return wrapped


def unwrap_parameters(module):
    """Replace every wrapped parameter of ``module`` by a plain ``nn.Parameter`` holding the
    master weight itself (bit-identical: the same storage). Returns the fqns unwrapped."""
    done = []
    for _, (p, places) in _owners(module).items():
        if not isinstance(p, LowpWeight):
            continue
        newp = nn.Parameter(p.master.detach(), requires_grad=p.requires_grad)
        for mod, lf, _ in places:
            setattr(mod, lf, newp)
            _fs.detach_state(mod)
        done.append(places[0][2])
    return done


def convert(model):
    """Unwrap every wrapped parameter of ``model``, whatever filter prepared it (the convert
    step of ``quantize_`` unwraps only what its ``filter_fn`` hands the handler). Returns the
    fqns unwrapped; the plain parameters share the masters' storage (bit-identical)."""
    if not isinstance(model, nn.Module):
        raise TypeError("lowp.torch.convert: model must be an nn.Module, got %s"
                        % type(model).__name__)
    return unwrap_parameters(model)


# ---- notices for parameters a quantize_ call leaves out ----

_NOTICED = weakref.WeakKeyDictionary()  # root model -> (id(config), id(frame)) last noticed


def _quantize_call():
    """(frame, model, filter_fn) of the torchao ``quantize_`` call running the handler, or None.
    torchao hands a handler only the module its filter chose; what the call leaves out is seen
    from the whole model, which only that call's frame holds."""
    code = getattr(_ao_quantize, "__code__", None)
    f = sys._getframe(1)
    while f is not None and code is not None:
        if f.f_code is code:
            return f, f.f_locals.get("model"), f.f_locals.get("filter_fn")
        f = f.f_back
    return None


def _reached(root, filter_fn, fqn):
    """Whether quantize_(root, ..., filter_fn) hands the handler the module at ``fqn`` or one
    of its ancestors (torchao's walk: the first module the filter accepts, top down)."""
    parts = fqn.split(".") if fqn else []
    mod = root
    for i in range(len(parts) + 1):
        if filter_fn(mod, ".".join(parts[:i])):
            return True
        if i < len(parts):
            mod = getattr(mod, parts[i])
    return False


def _left_out(root, config, filter_fn):
    """fqns of the parameters ``quantize_(root, config, filter_fn=param_swap_filter)`` would
    wrap (prepare) or unwrap (convert) that ``filter_fn`` does not reach."""
    out = []
    for _, (p, places) in _owners(root).items():
        if config.step is QATStep.CONVERT:
            take = isinstance(p, LowpWeight)
        elif isinstance(p, LowpWeight):
            take = False
        elif config.params_filter_fn is not None:
            take = config.params_filter_fn(p, places[0][2])
        else:
            take = _default_params_filter(places[0][0], places[0][1], p)
        if take and not any(_reached(root, filter_fn, fqn.rpartition(".")[0])
                            for _, _, fqn in places):
            out.append(places[0][2])
    return out


def _notice_left_out(module, config):
    """Warn, once per quantize_ call, naming the parameters it leaves out (see _left_out)."""
    call = _quantize_call()
    if call is None or call[1] is None or call[1] is module or call[2] is None:
        return
    frame, root, filter_fn = call
    key = (id(config), id(frame))
    if _NOTICED.get(root) == key:
        return
    _NOTICED[root] = key
    names = _left_out(root, config, filter_fn)
    if not names:
        return
    shown = ", ".join(names[:8]) + (", and %d more" % (len(names) - 8) if len(names) > 8 else "")
    if config.step is QATStep.PREPARE:
        what = "leaves %d parameters in high precision that the config would wrap" % len(names)
        fix = "pass filter_fn=lowp.torch.param_swap_filter"
    else:
        what = "leaves %d parameters wrapped" % len(names)
        fix = "pass filter_fn=lowp.torch.param_swap_filter or call lowp.torch.convert(model)"
    level, f = 2, sys._getframe(0)  # the warning points at the line calling quantize_
    while f is not frame:
        level, f = level + 1, f.f_back
    warnings.warn("lowp.torch: quantize_ with ParamSwapConfig(step=%r) %s, as its filter_fn "
                  "does not reach them: %s; %s" % (config.step.value, what, shown, fix),
                  stacklevel=level)


def _param_swap_transform(module, config):
    _notice_left_out(module, config)
    if config.step is QATStep.PREPARE:
        wrap_parameters(module, config, config.params_filter_fn)
    else:
        unwrap_parameters(module)
    return module


if register_quantize_module_handler is not None:
    register_quantize_module_handler(ParamSwapConfig)(_param_swap_transform)


def wrapped_parameters(model):
    """(fqn, LowpWeight parameter) for every wrapped parameter of ``model``."""
    return [(n, p) for n, p in model.named_parameters() if isinstance(p, LowpWeight)]
