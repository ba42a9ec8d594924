"""The deliberate differences between lowp and torchao's eager code (NUMERICS.md section 10,
docs/numerics.md), each pinned by a named case: torchao's functions are run on a block that
shows the difference, and both results are checked, so a change on either side is noticed.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

from torchao.float8.config import ScalingGranularity  # noqa: E402
from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic  # noqa: E402
from torchao.float8.float8_training_tensor import LinearMMConfig  # noqa: E402
from torchao.prototype.blockwise_fp8_training import kernels as bk  # noqa: E402
from torchao.prototype.mx_formats.mx_tensor import (  # noqa: E402
    ScaleCalculationMode, to_dtype, to_mx)

import lowp  # noqa: E402

E4M3 = torch.float8_e4m3fn


def f32_bits(v):
    return int(np.float32(v).view(np.uint32))


def from_bits(b):
    return float(np.uint32(b).view(np.float32))


def sqnr(ref, x):
    ref, x = np.asarray(ref, np.float64), np.asarray(x, np.float64)
    err = np.linalg.norm(ref - x)
    return math.inf if err == 0 else 20 * math.log10(np.linalg.norm(ref) / err)


def ao_mx(x, mode):
    s, d = to_mx(x, E4M3, 32, mode)
    return s.view(torch.uint8), d


def ao_mx_dequant(x, mode):
    s, d = to_mx(x, E4M3, 32, mode)
    return to_dtype(d, s, E4M3, 32, torch.float32)


def test_diff_1_rceil_of_f32_amax_just_above_a_power_of_two():
    # amax = 448 * 2^10 * (1 + 2^-23): d = amax / 448 is one ulp above 2^10. The exact rule
    # gives code 127 + 10 + 1 = 138; torchao's ceil(log2(d)) sees log2(d) == 10.0 in binary32
    # and gives 137, so its block maximum scales to just above 448 and is clamped.
    amax = from_bits(f32_bits(448.0 * 1024) + 1)
    x = torch.ones(1, 32)
    x[0, 5] = amax
    d = np.float32(amax) * np.float32(1.0 / 448.0)
    e, m = (f32_bits(d) >> 23) & 0xFF, f32_bits(d) & 0x7FFFFF
    assert e + (m != 0) == 138                                   # NUMERICS.md 3, RCEIL
    assert torch.log2(torch.tensor(amax) / 448.0).item() == 10.0  # the binary32 log2
    s_ao, d_ao = ao_mx(x, ScaleCalculationMode.RCEIL)
    q = lowp.quantize(x, "e4m3", "mx32", scale_mode="rceil")
    assert q.scale[0, 0].item() == 138 and s_ao[0, 0].item() == 137
    assert d_ao.view(torch.uint8)[0, 5].item() == 0x7E           # clamped at 448
    assert q.data[0, 5].item() == 0x76                           # 224 = amax / 2^11, rounded
    # on bfloat16 input no amax is that close to a power of two times 448: both agree
    xb = x.to(torch.bfloat16)
    assert torch.equal(lowp.quantize(xb, "e4m3", "mx32").scale,
                       ao_mx(xb, ScaleCalculationMode.RCEIL)[0])


def test_diff_2_pow2_rowwise_scale_just_below_a_power_of_two():
    # amax = 14 * (1 + 2^-23): the scale 448 / amax is 32 * (1 - 2^-23) in binary32.
    # torchao's exp2(floor(log2(scale))) computes log2 == 5.0 and keeps 32, so amax * 32
    # passes 448 and is clamped; lowp rounds the scale down by its bits to 16.
    amax = from_bits(f32_bits(14.0) + 1)
    x = torch.full((1, 64), 0.5)
    x[0, 3] = amax
    raw = np.float32(448.0) / np.float32(amax)
    assert raw < 32 and torch.log2(torch.tensor(float(raw))).item() == 5.0
    t = hp_tensor_to_float8_dynamic(x, E4M3, LinearMMConfig(),
                                    scaling_granularity=ScalingGranularity.AXISWISE,
                                    axiswise_dim=-1, round_scales_to_power_of_2=True)
    assert t._scale.item() == 32.0
    assert t._data.view(torch.uint8)[0, 3].item() == 0x7E        # clamped
    q = lowp.quantize(x, "e4m3", "row", pow2=True, eps=1e-12)
    assert q.scale.item() == 1.0 / 16
    assert q.data[0, 3].item() == 0x76                           # 224: nothing clamped
    # without the power-of-two option both give the same bytes
    t2 = hp_tensor_to_float8_dynamic(x, E4M3, LinearMMConfig(),
                                     scaling_granularity=ScalingGranularity.AXISWISE,
                                     axiswise_dim=-1)
    q2 = lowp.quantize(x, "e4m3", "row", pow2=False, eps=1e-12)
    assert torch.equal(q2.data, t2._data.view(torch.uint8))
    assert q2.scale.item() == (1.0 / t2._scale).item()


@pytest.mark.parametrize("mode,ao_ceiling", [("floor", 7.0), ("rceil", 1.0)])
def test_diff_3_scale_code_0_blocks(mode, ao_ceiling):
    # A block whose amax is below about 448 * 2^-127 gets scale code 0x00 (2^-127). torchao
    # scales its elements by 2^126 (FLOOR: the scale is clamped to the smallest normal) or by
    # 1 (RCEIL) but decodes with 2^-127; lowp scales by exactly 2^127.
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(1, 32, generator=g, dtype=torch.float64) * 2.0**-124).float()
    modes = {"floor": ScaleCalculationMode.FLOOR, "rceil": ScaleCalculationMode.RCEIL}
    s_ao, _ = ao_mx(x, modes[mode])
    q = lowp.quantize(x, "e4m3", "mx32", scale_mode=mode)
    assert s_ao[0, 0].item() == 0
    assert q.scale[0, 0].item() in (0, 1)
    ref = x.double().numpy()
    assert sqnr(ref, ao_mx_dequant(x, modes[mode]).numpy()) < ao_ceiling
    assert sqnr(ref, lowp.dequantize(q).numpy()) > 25.0


def test_diff_4_inf_block_is_nan_in_lowp():
    # +Inf without NaN: torchao derives a finite scale from amax = Inf and clamps Inf to 448;
    # lowp marks the whole block NaN (scale 0xFF, element codes 0x7F).
    x = torch.linspace(-1, 1, 64).reshape(1, 64)
    x[0, 7] = math.inf
    for mode in (ScaleCalculationMode.FLOOR, ScaleCalculationMode.RCEIL):
        s_ao, d_ao = ao_mx(x, mode)
        assert s_ao[0, 0].item() != 0xFF
        assert d_ao.view(torch.uint8)[0, 7].item() == 0x7E
    q = lowp.quantize(x, "e4m3", "mx32")
    assert q.scale[0, 0].item() == 0xFF
    assert bool((q.data[0, :32] == 0x7F).all())
    assert torch.isnan(lowp.dequantize(q)[0, :32]).all()
    # the other block is untouched and equal to torchao's
    s_ao, d_ao = ao_mx(x, ScaleCalculationMode.RCEIL)
    assert q.scale[0, 1] == s_ao[0, 1]
    assert torch.equal(q.data[0, 32:], d_ao.view(torch.uint8)[0, 32:])
    # a NaN block: both scale 0xFF; both decode the block to NaN
    y = x.clone()
    y[0, 7] = math.nan
    s_ao, d_ao = ao_mx(y, ScaleCalculationMode.RCEIL)
    qy = lowp.quantize(y, "e4m3", "mx32")
    assert s_ao[0, 0].item() == 0xFF and qy.scale[0, 0].item() == 0xFF
    assert torch.isnan(lowp.dequantize(qy)[0, :32]).all()
    assert torch.isnan(ao_mx_dequant(y, ScaleCalculationMode.RCEIL)[0, :32]).all()


def test_diff_5_eps_default_zero_and_1e12_reproduces_torchao():
    # torchao clamps amax below by 1e-12 (tensorwise, rowwise, blockwise); lowp's default eps
    # is 0, so a tiny tensor keeps its full resolution, and eps=1e-12 gives torchao's bytes.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(128, 128, generator=g) * 1e-17  # amax * 448 / 1e-12: E4M3 subnormals
    t = hp_tensor_to_float8_dynamic(x, E4M3, LinearMMConfig(),
                                    scaling_granularity=ScalingGranularity.TENSORWISE)
    q0 = lowp.quantize(x, "e4m3", "tensor")
    q12 = lowp.quantize(x, "e4m3", "tensor", eps=1e-12)
    assert torch.equal(q12.data, t._data.view(torch.uint8))
    assert q12.scale.item() == (1.0 / t._scale).item()
    assert not torch.equal(q0.data, q12.data)
    ref = x.double().numpy()
    assert sqnr(ref, lowp.dequantize(q0).numpy()) > sqnr(ref, lowp.dequantize(q12).numpy()) + 10
    # all zeros: scale 1 with eps 0, torchao's 448 / 1e-12 with eps 1e-12
    z = torch.zeros(4, 128)
    assert lowp.quantize(z, "e4m3", "tensor").scale.item() == 1.0
    tz = hp_tensor_to_float8_dynamic(z, E4M3, LinearMMConfig(),
                                     scaling_granularity=ScalingGranularity.TENSORWISE)
    assert lowp.quantize(z, "e4m3", "tensor", eps=1e-12).scale.item() == (1.0 / tz._scale).item()
    # the 1x128 blocks
    d_ao, s_ao = bk.torch_blockwise_scale_act_quant_lhs(x, 128, E4M3)
    qb = lowp.quantize(x, "e4m3", "block128", eps=1e-12)
    assert torch.equal(qb.scale, s_ao.contiguous())
    assert torch.equal(qb.data, d_ao.view(torch.uint8))
    assert not torch.equal(lowp.quantize(x, "e4m3", "block128").scale, qb.scale)
