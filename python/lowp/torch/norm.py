"""RMSNorm, computed in float32, in the dtype lowp's autocast rule gives (``_autocast.py``):
the autocast dtype when autocast is enabled for the input's own device type
(``torch.is_autocast_enabled(x.device.type)``, ``torch.get_autocast_dtype(x.device.type)``,
never a hard-coded ``"cuda"``), else the input's dtype.
"""

import torch
import torch.nn as nn

from ._autocast import exact, out_dtype


def rms_norm(x, weight=None, eps=1e-6):
    """``x / sqrt(mean(x^2, -1) + eps) * weight`` computed in float32."""
    odt = out_dtype(x)
    with exact(x.device.type):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        if weight is not None:
            y = y * weight.float()
    return y.to(odt)


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
