"""lowp.torch on a non-CPU device runs the portable path; its bytes must equal the CPU native
kernels'. Runs on CUDA when present, or on the device named by LOWP_TEST_DEVICE (e.g. "xpu",
"mps", "npu"); the meta device (shapes only) always runs."""

import os

import pytest
import torch

import lowp.torch as lt

from test_torch_ops_portable import awkward


def _device():
    name = os.environ.get("LOWP_TEST_DEVICE")
    if name:
        return name
    return "cuda" if torch.cuda.is_available() else None


DEV = _device()
on_device = pytest.mark.skipif(DEV is None or not lt.native_available(),
                               reason="no accelerator (set LOWP_TEST_DEVICE) or no extension")


def test_meta_device_shapes():
    x = torch.empty(70, 96, device="meta", requires_grad=True)
    w = torch.empty(48, 96, device="meta", requires_grad=True)
    y = lt.linear(x, w, None, "mxfp8")
    assert y.shape == (70, 48) and y.device.type == "meta"
    y.backward(torch.empty(70, 48, device="meta"))
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


@on_device
@pytest.mark.parametrize("fmt,kind,mode", [("e4m3", "mx32", "rceil"), ("e2m1", "mx32", "even"),
                                           ("e4m3", "block32x32", "floor"),
                                           ("e4m3", "block128", ""), ("e5m2", "row", ""),
                                           ("e4m3", "tensor", "")])
def test_device_quantize_equals_cpu_native(fmt, kind, mode):
    x = torch.from_numpy(awkward(130, 257, 1))
    cpu = torch.ops.lowp.quantize(x, fmt, kind, mode, -1, 0.0, "both", None, None)
    lt.reset_stats()
    dev = torch.ops.lowp.quantize(x.to(DEV), fmt, kind, mode, -1, 0.0, "both", None, None)
    assert lt.stats()["quantize.portable"] == 1
    for c, d in zip(cpu, dev):
        assert torch.equal(c.view(torch.uint8), d.cpu().view(torch.uint8))


@on_device
@pytest.mark.parametrize("name", ["mxfp8", "block32x32", "block128", "fp8_rowwise"])
def test_device_linear_matches_cpu_native(name):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 256, generator=g)
    w = torch.randn(96, 256, generator=g) / 16
    dy = torch.randn(128, 96, generator=g)
    outs = []
    for dev in ("cpu", DEV):
        # detach first: on the CPU, x.to("cpu") is x itself, and marking it would make the
        # device leg's copy a non-leaf whose .grad stays None
        xd = x.detach().to(dev).requires_grad_()
        wd = w.detach().to(dev).requires_grad_()
        y = lt.linear(xd, wd, None, name)
        y.backward(dy.to(dev))
        outs.append([t.detach().cpu() for t in (y, xd.grad, wd.grad)])
    for a, b in zip(*outs):
        assert (a - b).norm() <= 1e-5 * a.norm()
