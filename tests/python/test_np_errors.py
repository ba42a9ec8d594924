"""Bad input to the numpy API: a TypeError or ValueError whose message names the argument
(the C library's own message where the C library finds the fault), one case each; nothing
crashes. numpy only (also run under ASan)."""

import ml_dtypes
import numpy as np
import pytest

import lowp

rng = np.random.default_rng(5)
X = rng.standard_normal((8, 64)).astype(np.float32)


def raises(exc, match, fn, *args, **kw):
    with pytest.raises(exc, match=match):
        fn(*args, **kw)


# ---- cast / decode ----

def test_cast_wrong_dtype():
    raises(TypeError, r"lowp.cast: x must be float32 or bfloat16, got float64", lowp.cast,
           X.astype(np.float64), "e4m3")


def test_cast_not_an_array():
    raises(TypeError, r"lowp.cast: x must be a numpy array or a torch CPU tensor, got list",
           lowp.cast, [1.0, 2.0], "e4m3")


def test_cast_non_contiguous():
    raises(ValueError, r"lowp.cast: x must be C-contiguous", lowp.cast, X[:, ::2], "e4m3")


def test_cast_unknown_format():
    raises(ValueError, r"lowp.cast: to \('e9m9'\) is not one of", lowp.cast, X, "e9m9")


def test_cast_bad_saturate_round_seed():
    raises(ValueError, r"saturate \('maybe'\)", lowp.cast, X, "e4m3", saturate="maybe")
    raises(ValueError, r"round \('up'\)", lowp.cast, X, "e4m3", round="up")
    raises(ValueError, r"seed \(-1\)", lowp.cast, X, "e4m3", round="sr", seed=-1)
    raises(TypeError, r"offset must be an int", lowp.cast, X, "e4m3", offset=1.5)


def test_cast_bf16_to_bf16_is_the_c_librarys_error():
    xb = X.astype(ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match=r"^lowp_cast: ") as e:
        lowp.cast(xb, "bf16")
    assert "bf16" in str(e.value) or "src" in str(e.value)


def test_decode_wrong_code_dtype():
    raises(TypeError, r"lowp.decode: codes of e4m3 must be uint8, got float32", lowp.decode, X,
           "e4m3")
    raises(TypeError, r"codes of bf16 must be uint16", lowp.decode, np.zeros(4, np.uint8),
           "bf16")


# ---- quantize ----

def test_quantize_wrong_rank():
    raises(ValueError, r"lowp.quantize: x must be 2-D \[R, C\] or 3-D", lowp.quantize, X[0])
    raises(ValueError, r"lowp.quantize: x must be 2-D", lowp.quantize, X.reshape(2, 2, 2, 64))


def test_quantize_wrong_dtype():
    raises(TypeError, r"lowp.quantize: x must be float32 or bfloat16, got int32", lowp.quantize,
           X.astype(np.int32))


def test_quantize_non_contiguous():
    raises(ValueError, r"lowp.quantize: x must be C-contiguous", lowp.quantize, X.T)


def test_quantize_unknown_names():
    raises(ValueError, r"format \('e3m4'\) is not one of e4m3, e5m2, e2m1", lowp.quantize, X,
           "e3m4")
    raises(ValueError, r"scaling \('mx16'\) is not one of", lowp.quantize, X, "e4m3", "mx16")
    raises(ValueError, r"scale_mode \('round'\) is not one of", lowp.quantize, X, "e4m3", "mx32",
           scale_mode="round")
    raises(ValueError, r"axis \('diag'\) is not one of", lowp.quantize, X, axis="diag")
    raises(ValueError, r"layout \(.swizzled.\) is not one of canonical, cublas, npu", lowp.quantize,
           X, layout="swizzled")


def test_quantize_option_that_does_not_apply():
    raises(ValueError, r"scale_mode applies to mx32 and block32x32, not tensor", lowp.quantize,
           X, "e4m3", "tensor", scale_mode="floor")
    raises(ValueError, r"pow2 applies to the binary32 scalings, not mx32", lowp.quantize, X,
           "e4m3", "mx32", pow2=True)
    raises(ValueError, r"eps applies to the binary32 scalings, not mx32", lowp.quantize, X,
           "e4m3", "mx32", eps=1e-12)
    raises(ValueError, r"scale applies to tensor scaling, not row", lowp.quantize, X, "e4m3",
           "row", scale=2.0)
    raises(TypeError, r"pow2 must be None, True or False", lowp.quantize, X, "e4m3", "row",
           pow2="yes")


def test_quantize_e2m1_needs_mx32_c_message():
    raises(ValueError, r"^lowp_quantize: .*", lowp.quantize, X, "e2m1", "row")


def test_quantize_negative_eps_c_message():
    raises(ValueError, r"^lowp_quantize: .*eps", lowp.quantize, X, "e4m3", "tensor", eps=-1.0)


def test_quantize_bad_given_scale_c_message():
    raises(ValueError, r"^lowp_quantize: .*scale", lowp.quantize, X, "e4m3", "tensor",
           scale=float("nan"))


def test_quantize_offs_errors():
    o = np.array([4, 8], np.int32)
    raises(ValueError, r"offs groups the columnwise copy: axis must be 'col' or 'both'",
           lowp.quantize, X, offs=o)
    raises(TypeError, r"lowp.quantize: offs must be int32, got int64", lowp.quantize, X,
           axis="col", offs=o.astype(np.int64))
    raises(ValueError, r"offs must be 1-D", lowp.quantize, X, axis="col", offs=o.reshape(1, 2))
    raises(ValueError, r"offs needs a 2-D x", lowp.quantize, X.reshape(2, 4, 64), axis="col",
           offs=o)
    # decreasing and out of range: the C library's messages
    raises(ValueError, r"^lowp_\w+: .*offs\[1\] \(3\)", lowp.quantize, X, axis="col",
           offs=np.array([6, 3], np.int32))
    raises(ValueError, r"^lowp_\w+: .*offs\[1\] \(9\)", lowp.quantize, X, axis="col",
           offs=np.array([4, 9], np.int32))
    raises(ValueError, r"^lowp_\w+: .*scaling \(tensor\) is not mx32, block128 or nv16", lowp.quantize,
           X, "e4m3", "tensor",
           axis="col", offs=o)


# ---- dequantize / QTensor ----

def test_dequantize_not_a_qtensor():
    raises(TypeError, r"lowp.dequantize: q must be a lowp.QTensor, got ndarray", lowp.dequantize,
           X)


def test_dequantize_missing_copy():
    q = lowp.quantize(X, axis="row")
    raises(ValueError, r"lowp.dequantize: q has no colwise copy", lowp.dequantize, q, axis="col")
    raises(ValueError, r"QTensor.col: this tensor has no columnwise copy", q.col)
    qc = lowp.quantize(X, axis="col")
    raises(ValueError, r"q has no rowwise copy \(use q.col\(\)", lowp.dequantize, qc)


def test_qtensor_with_truncated_buffers():
    """QTensor refuses short buffers at construction; the extension's own byte check still
    stands behind it (attributes assigned afterwards)."""
    q = lowp.quantize(X)
    raises(ValueError, r"lowp.QTensor: data has shape \(4, 64\), expected \(8, 64\)",
           lowp.QTensor, q.data[:4], q.scale, "e4m3", "mx32", X.shape)
    raises(ValueError, r"lowp.QTensor: scale has shape \(4, 2\), expected \(8, 2\)",
           lowp.QTensor, q.data, q.scale[:4], "e4m3", "mx32", X.shape)
    bad = lowp.QTensor(q.data, q.scale, "e4m3", "mx32", X.shape)
    bad.data = q.data[:4]
    raises(ValueError, r"lowp.dequantize: q.data holds 256 bytes, needs 512", lowp.dequantize,
           bad)
    bad = lowp.QTensor(q.data, q.scale, "e4m3", "mx32", X.shape)
    bad.scale = q.scale[:4]
    raises(ValueError, r"q.scale holds 8 bytes, needs 16", lowp.dequantize, bad)
    raises(ValueError, r"lowp.QTensor: shape \(64,\) must be", lowp.QTensor, q.data, q.scale,
           "e4m3", "mx32", (64,))
    raises(ValueError, r"data and data_col are both None", lowp.QTensor, None, None, "e4m3",
           "mx32", X.shape)


# ---- gemm ----

def test_gemm_mismatched_k():
    a = lowp.quantize(X)
    b = lowp.quantize(rng.standard_normal((5, 32)).astype(np.float32))
    raises(ValueError, r"^lowp.gemm: a.shape\[1\] \(64\) != b.shape\[1\] \(32\)", lowp.gemm,
           a, b)


def test_gemm_unsupported_pair_c_message():
    a = lowp.quantize(X, "e4m3", "mx32")
    b = lowp.quantize(X, "e4m3", "row")
    raises(ValueError, r"^lowp_gemm: ", lowp.gemm, a, b)


def test_gemm_mixed_plain_dtypes_c_message():
    raises(ValueError, r"^lowp_gemm: ", lowp.gemm, X, X.astype(ml_dtypes.bfloat16))


def test_gemm_wrong_rank_and_dtype():
    raises(ValueError, r"lowp.gemm: a must be 2-D", lowp.gemm, X[0], X)
    raises(TypeError, r"lowp.gemm: b must be float32 or bfloat16, got float16", lowp.gemm, X,
           X.astype(np.float16))
    raises(ValueError, r"a and b must be 2-D", lowp.gemm, X, X.reshape(2, 4, 64))


def test_gemm_out_errors():
    raises(ValueError, r"lowp.gemm: out has shape \(8, 7\), expected \(8, 8\)", lowp.gemm, X, X,
           out=np.zeros((8, 7), np.float32))
    raises(TypeError, r"lowp.gemm: out must be float32 or bfloat16", lowp.gemm, X, X,
           out=np.zeros((8, 8)))
    raises(ValueError, r"lowp.gemm: accumulate=True needs out", lowp.gemm, X, X,
           accumulate=True)
    raises(ValueError, r"lowp.gemm: out must be C-contiguous", lowp.gemm, X, X,
           out=np.zeros((8, 16), np.float32)[:, ::2])


# ---- grouped gemm ----

W = rng.standard_normal((3, 16, 64)).astype(np.float32)


def test_grouped_gemm_decreasing_offs_c_message():
    raises(ValueError, r"^lowp_grouped_gemm: .*offs", lowp.grouped_gemm, X, W,
           np.array([4, 2, 8], np.int32))


def test_grouped_gemm_offs_out_of_range_c_message():
    raises(ValueError, r"^lowp_grouped_gemm: .*offs", lowp.grouped_gemm, X, W,
           np.array([4, 6, 9], np.int32))
    raises(ValueError, r"^lowp_grouped_gemm: .*offs", lowp.grouped_gemm, X, W,
           np.array([-1, 6, 8], np.int32))


def test_grouped_gemm_group_count_mismatch():
    raises(ValueError, r"lowp.grouped_gemm: b has 3 groups, offs has 2", lowp.grouped_gemm, X, W,
           np.array([4, 8], np.int32))
    raises(ValueError, r"offs must hold at least one group", lowp.grouped_gemm, X, W,
           np.zeros(0, np.int32))


def test_grouped_gemm_offs_dtype():
    raises(TypeError, r"lowp.grouped_gemm: offs must be int32, got float32", lowp.grouped_gemm,
           X, W, np.array([1, 2, 3], np.float32))


def test_grouped_gemm_split_k_needs_grouped_operands():
    o = np.array([3, 8], np.int32)
    a = lowp.quantize(X, axis="col")
    b = lowp.quantize(X, axis="col", offs=o)
    raises(ValueError, r"a was not quantized along the tokens with offs", lowp.grouped_gemm, a, b,
           o)
    raises(ValueError, r"a.offs differs from offs", lowp.grouped_gemm, b, b,
           np.array([4, 8], np.int32))


def test_set_threads_bad_values():
    raises(ValueError, r"lowp.set_threads: n \(-1\)", lowp.set_threads, -1)
    raises(TypeError, r"lowp.set_threads: n must be an int or None", lowp.set_threads, 1.5)
