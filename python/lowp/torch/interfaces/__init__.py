"""Framework adapters of lowp.torch (the torchao_npu design's ``interfaces/``).

- ``lowp.torch.interfaces.torchtitan``: a model-config converter and config-registry entries
  for torchtitan 0.3 (import it explicitly; it needs torchtitan, this package does not).
"""
