"""RMSNorm, and the autocast rule of every lowp op that computes outside a GEMM.

The compute dtype follows the autocast state of the tensor's own device type:
``torch.is_autocast_enabled(x.device.type)`` and ``torch.get_autocast_dtype(x.device.type)``,
never a hard-coded ``"cuda"``. RMSNorm computes in float32 and returns the autocast dtype when
autocast is on for that device type, else the input's dtype.
"""

import torch
import torch.nn as nn


def autocast_dtype(device_type, default):
    """The dtype an op outside a GEMM returns on ``device_type``: the autocast dtype when
    autocast is enabled for that device type, else ``default``."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return default


def rms_norm(x, weight=None, eps=1e-6):
    """``x / sqrt(mean(x^2, -1) + eps) * weight`` computed in float32."""
    out_dtype = autocast_dtype(x.device.type, x.dtype)
    with torch.autocast(x.device.type, enabled=False):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        if weight is not None:
            y = y * weight.float()
    return y.to(out_dtype)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm over the last dimension (see the module docstring)."""

    def __init__(self, dim, eps=1e-6, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError("dim (%r) must be a positive int" % (dim,))
        if not (eps >= 0.0):
            raise ValueError("eps (%r) must be >= 0" % (eps,))
        self.dim = dim
        self.eps = float(eps)
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        if x.shape[-1] != self.dim:
            raise ValueError("x's last dimension (%d) != dim (%d)" % (x.shape[-1], self.dim))
        return rms_norm(x, self.weight, self.eps)

    def reset_parameters(self):
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def extra_repr(self):
        return "%d, eps=%g" % (self.dim, self.eps)
