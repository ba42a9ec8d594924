"""Built-in adapters of the device kernel table (`lowp.torch.device_kernels`): each module wraps
one vendor's kernels as lowp kernels on lowp's canonical operands, converts the scale layouts,
and registers them through `register()` when its device is there (called lazily by the table;
registering twice is a no-op). No module imports a vendor package at import time.

- `cpu_scaled_mm`: torch's own `torch._scaled_mm` on the CPU (FP8 tensorwise and rowwise);
- `cuda`: `torch._scaled_mm` / `torch._scaled_grouped_mm` on CUDA, gated on the capability;
- `npu`: the Ascend 950's `torch_npu` MX quantization and matmuls (unverified on hardware).
"""
