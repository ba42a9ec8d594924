"""torchtitan config registry of lowp's benchmark: ``<model>_<recipe>`` for

- model ``debug``: torchtitan's DeepSeek-V3 debug model (``deepseek_v3_debugmodel``: dim 256,
  6 layers, 8 routed experts top-3, 2 shared, MLA attention, vocabulary 2048);
- model ``moe_small``: a larger DeepSeek-V3-style MoE that still trains on two CPU cores (dim
  512, 4 layers, 16 routed experts top-4, 1 shared, about 45M parameters);

and every recipe of ``recipe_converter.RECIPES``. Settings for a CPU: sequence 256, local
batch 4, 20 steps, seed 0; the tokenizer and data made by ``assets.py`` under
``$LOWP_TITAN_ASSETS`` (default ``out/torchtitan/assets``). Everything is overridable on
torchtitan's command line::

    PYTHONPATH=python:. torchrun --nproc_per_node=2 -m torchtitan.train \\
        --module benchmarks.torchtitan --config debug_mix --training.steps 50
"""

import os

from torchtitan.models import deepseek_v3 as _ds
from torchtitan.models.deepseek_v3 import config_registry as _ds_registry

from . import recipe_converter

ASSETS = os.environ.get("LOWP_TITAN_ASSETS", os.path.join("out", "torchtitan", "assets"))


def _moe_small_model():
    """The larger MoE's model config, laid out as torchtitan's ``_debugmodel``."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    dim, vocab, rope_dim = 512, 2048, 32
    layers = _ds._build_dsv3_layers(
        n_layers=4, n_dense_layers=1, dim=dim, n_heads=8, q_lora_rank=0, kv_lora_rank=256,
        qk_nope_head_dim=64, qk_rope_head_dim=rope_dim, v_head_dim=64, mscale=0.70,
        dense_hidden_dim=1536, moe_hidden_dim=512, num_experts=16, num_shared_experts=1,
        router_top_k=4, router_score_func="softmax", attn_backend="flex",
        moe_comm_backend="standard", non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim=rope_dim, max_seq_len=4096 * 4, theta=10000.0,
                                scaling="yarn", rope_factor=40.0, beta_fast=32.0,
                                beta_slow=1.0, original_seq_len=4096))
    return _ds.DeepSeekV3Model.Config(
        vocab_size=vocab, dim=dim,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,
                                        param_init=_ds._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_ds._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab,
                              param_init=_ds._output_linear_init(dim)),
        layers=layers, mtp_layers=[])


def _spec(model: str, converters=None):
    if model == "debug":
        return _ds.model_registry("debugmodel", converters=converters)
    from torchtitan.protocols.model_spec import ModelSpec
    cfg = _moe_small_model()
    for c in converters or []:
        cfg = c.build().convert(cfg)
    return ModelSpec(name="deepseek_v3", flavor="moe_small", model=cfg,
                     parallelize_fn=_ds.parallelize_deepseekv3, pipelining_fn=_ds.pipeline_llm,
                     post_optimizer_build_fn=_ds.register_moe_load_balancing_hook,
                     state_dict_adapter=_ds.DeepSeekV3StateDictAdapter)


def _config(model: str, recipe: str):
    cfg = _ds_registry.deepseek_v3_debugmodel()
    cfg.model_spec = _spec(model)
    cfg.hf_assets_path = os.path.join(ASSETS, "tokenizer")
    cfg.dataloader.dataset_path = os.path.join(ASSETS, "data")
    cfg.training.seq_len, cfg.training.local_batch_size, cfg.training.steps = 256, 4, 20
    cfg.debug.seed = 0
    cfg.checkpoint.enable = False
    cfg.dump_folder = os.path.join("out", "torchtitan", "runs")
    return recipe_converter.convert(cfg, recipe, lambda conv: _spec(model, conv))


def _entry(model: str, recipe: str):
    def entry():
        return _config(model, recipe)
    entry.__name__ = entry.__qualname__ = f"{model}_{recipe}"
    entry.__doc__ = f"The {model} model with the {recipe} recipe."
    return entry


for _m in ("debug", "moe_small"):
    for _r in recipe_converter.RECIPES:
        globals()[f"{_m}_{_r}"] = _entry(_m, _r)
del _m, _r
