"""Calibration never makes an unusable scale (issue 16): sentinel pad values, overflowing and
all-zero calibration data, and the check of quantization parameters before any interpreter.

The range rules (`tflfuse.quantize.calibrated_ranges`) are tested on statistics directly (no
TensorFlow); the quantizer tests build a torch-style padded max pool (PADV2 with -inf, and onnx2tf's
-3.4e38) in the IR and quantize it with litert-quantizer.
"""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G

from tflfuse.errors import TflfuseError
from tflfuse.ir import Quantization, flatbuffer, qparams
from tflfuse.quantize.calibrated_ranges import RangeError, usable_ranges

FLT_MAX = float(np.finfo(np.float32).max)


def _stat(lo: float, hi: float) -> dict[str, np.ndarray]:
    return {"min": np.array([lo]), "max": np.array([hi])}


def _padded_pool(pad_value: float, *, relu: bool = False, seed: int = 1) -> G:
    """conv -> PADV2(pad_value) -> MAX_POOL_2D(3x3, stride 2, VALID) -> conv: what torch's
    MaxPool2d(3, 2, padding=1) and onnx2tf's MaxPool with pads become."""
    g = G(seed)
    x = g.input((1, 8, 8, 3))
    c = g.conv(x, 4, k=3, act="RELU" if relu else "NONE")
    pads = g.const(np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32), "pads")
    value = g.graph.add_constant("pad_value", np.array(pad_value, np.float32), "FLOAT32")
    p = g.op("PADV2", [c, pads, value], (1, 10, 10, 4))
    m = g.op(
        "MAX_POOL_2D",
        [p],
        (1, 4, 4, 4),
        padding="VALID",
        stride_w=2,
        stride_h=2,
        filter_width=3,
        filter_height=3,
        fused_activation_function="NONE",
    )
    g.out = g.conv(m, 2, k=1)
    return g


# -- the range rules, on statistics -------------------------------------------------------------
@pytest.mark.parametrize("pad_value", [-np.inf, -FLT_MAX])
def test_a_sentinel_pad_value_never_enters_a_range(pad_value: float) -> None:
    g = _padded_pool(pad_value)
    stats = {
        "input": _stat(-1, 1),
        "conv_2d": _stat(-4.0, 5.0),
        "padv2": _stat(pad_value, 5.0),
        "max_pool_2d": _stat(-1.0, 5.0),
    }
    fixed, changed = usable_ranges(g.model(g.out).main, stats)
    assert float(fixed["padv2"]["min"][0]) == -4.0 and float(fixed["padv2"]["max"][0]) == 5.0
    assert list(changed) == ["padv2"] and "sentinel" in changed["padv2"]
    assert stats["padv2"]["min"][0] == pad_value  # the measured statistics are kept as they were


def test_sentinels_are_followed_through_ops_that_only_move_values() -> None:
    g = G()
    x = g.input((1, 4, 4, 2))
    pads = g.const(np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32), "pads")
    value = g.graph.add_constant("v", np.array(-np.inf, np.float32), "FLOAT32")
    p = g.op("PADV2", [x, pads, value], (1, 6, 6, 2))
    r = g.op("RESHAPE", [p, g.const(np.array([1, 72], np.int32), "shape")], (1, 72))
    stats = {"input": _stat(-2, 3), "padv2": _stat(-np.inf, 3), "reshape": _stat(-np.inf, 3)}
    fixed, changed = usable_ranges(g.model(r).main, stats)
    assert [float(fixed["reshape"][k][0]) for k in ("min", "max")] == [-2.0, 3.0]
    assert set(changed) == {"padv2", "reshape"}


def test_an_overflow_is_refused_naming_the_tensor() -> None:
    g = _padded_pool(-np.inf)
    stats = {"input": _stat(-1, 3e38), "conv_2d": _stat(-np.inf, np.inf)}
    with pytest.raises(RangeError) as err:
        usable_ranges(g.model(g.out).main, stats)
    message = str(err.value)
    assert "'conv_2d'" in message and "overflows" in message and "\n" not in message


def test_sentinels_reaching_arithmetic_are_refused() -> None:
    """PADV2(-inf) read by a convolution: -inf enters the arithmetic, nothing sane to quantize."""
    g = G()
    x = g.input((1, 4, 4, 2))
    pads = g.const(np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32), "pads")
    value = g.graph.add_constant("v", np.array(-np.inf, np.float32), "FLOAT32")
    p = g.op("PADV2", [x, pads, value], (1, 6, 6, 2))
    c = g.conv(p, 2, k=1)
    stats = {"input": _stat(-1, 1), "padv2": _stat(-np.inf, 1), "conv_2d": _stat(-np.inf, np.inf)}
    with pytest.raises(RangeError, match="'conv_2d' \\(CONV_2D\\) reached \\[-inf, inf\\]"):
        usable_ranges(g.model(c).main, stats)


def test_a_range_of_only_zeros_is_widened() -> None:
    g = G()
    x = g.input((1, 4))
    r = g.unary("RELU", x)
    stats = {"input": _stat(-3.0, -0.5), "relu": _stat(0.0, 0.0)}
    fixed, changed = usable_ranges(g.model(r).main, stats)
    assert [float(fixed["relu"][k][0]) for k in ("min", "max")] == [-3.0, 3.0]
    zeros = {"input": _stat(0.0, 0.0), "relu": _stat(0.0, 0.0)}
    fixed, changed = usable_ranges(g.model(r).main, zeros)
    assert [float(fixed["input"][k][0]) for k in ("min", "max")] == [-1.0, 1.0]
    assert float(fixed["relu"]["max"][0]) == 1.0 and set(changed) == {"input", "relu"}


# -- quantization parameters are checked before any interpreter -----------------------------------
def _int8_tensor_model(scale: float, zero_point: int = 0):
    g = G()
    x = g.input((1, 4))
    y = g.unary("RELU", x)
    model = g.model(y)
    for t in model.main.tensors:
        t.dtype = "INT8"
        t.quantization = Quantization(np.array([scale], np.float32), np.array([zero_point]))
    return model


@pytest.mark.parametrize(
    ("scale", "zero_point", "expect"),
    [
        (np.inf, 0, "scale inf"),
        (np.nan, 0, "scale nan"),
        (0.0, 0, "scale 0"),
        (-0.5, 0, "scale -0.5"),
        (0.1, 300, "zero point 300 outside [-128, 127]"),
    ],
)
def test_unusable_quantization_is_one_line_naming_the_tensor(scale, zero_point, expect) -> None:
    model = _int8_tensor_model(scale, zero_point)
    with pytest.raises(qparams.QuantizationParameterError) as err:
        qparams.check(model, "m.tflite")
    assert str(err.value).startswith("m.tflite: tensor 'input' has unusable quantization: ")
    assert expect in str(err.value) and "(and 1 more tensors)" in str(err.value)
    qparams.check(_int8_tensor_model(0.1, -5), "m.tflite")  # a usable one passes


def test_the_interpreter_is_never_given_an_unusable_scale() -> None:
    """The runtime's own guard (any model, any command): refused before allocate_tensors, which
    aborts the process in some builds."""
    from tflfuse.device.interpreter import make_interpreter

    data = flatbuffer.to_bytes(_int8_tensor_model(np.inf))
    with pytest.raises(TflfuseError, match="tensor 'input' has quantization scale inf"):
        make_interpreter(data)


# -- through litert-quantizer ------------------------------------------------------------------
def _signed(g: G) -> bytes:
    from tflfuse.sources import tflite as tflite_frontend

    return tflite_frontend.load(g.bytes(g.out)).float_tflite(None)


def _scales_usable(data: bytes) -> None:
    model = flatbuffer.from_bytes(data)
    assert qparams.problems(model.main) == []
    quantized = [t for t in model.main.tensors if t.is_quantized]
    assert quantized and all(np.all(np.isfinite(t.quantization.scale)) for t in quantized)
    assert all(np.all(t.quantization.scale > 0) for t in quantized)


def _error_and_variation(float_data: bytes, q_data: bytes, x: np.ndarray) -> tuple[float, float]:
    from tflfuse.verification.runs import run_float

    ref, got = run_float(float_data, [x])[0], run_float(q_data, [x])[0]
    assert np.all(np.isfinite(got))
    return float(np.max(np.abs(ref - got))), float(np.ptp(ref, axis=0).max())


@pytest.mark.parametrize("pad_value", [-np.inf, -FLT_MAX])
def test_padv2_of_the_lowest_value_quantizes_exactly(pad_value: float) -> None:
    pytest.importorskip("litert_quantizer")
    from tflfuse.quantize.quantize import quantize

    data = _signed(_padded_pool(pad_value))
    rng = np.random.default_rng(0)
    calib = rng.uniform(-1, 1, (32, 8, 8, 3)).astype(np.float32)
    q = quantize(data, "int8", [calib], progress=False)
    _scales_usable(q.data)
    assert "padv2" in q.ranges_adjusted
    model = flatbuffer.from_bytes(q.data)
    (pad,) = model.main.ops_of("PADV2")
    assert pad.inputs[2].data.reshape(-1).tolist() == [-128]  # the lowest int8: "pad with -inf"
    err, spread = _error_and_variation(data, q.data, calib[:8])
    assert spread > 0.5  # the outputs vary with the input: the comparison means something
    assert err <= 0.05 * spread, (err, spread)


def test_huge_finite_calibration_data_give_finite_scales() -> None:
    """Inputs of 1e20: every scale finite and positive, the model runs, and it is as close to the
    float model, relative to the output's size, as for ordinary data."""
    pytest.importorskip("litert_quantizer")
    from tflfuse.quantize.quantize import quantize

    data = _signed(_padded_pool(-np.inf))
    calib = np.random.default_rng(0).uniform(-1e20, 1e20, (32, 8, 8, 3)).astype(np.float32)
    q = quantize(data, "int8", [calib], progress=False)
    _scales_usable(q.data)
    err, spread = _error_and_variation(data, q.data, calib[:8])
    assert spread > 1e19 and err <= 0.05 * spread


def test_calibration_data_that_overflow_are_refused_in_one_line() -> None:
    pytest.importorskip("litert_quantizer")
    from tflfuse.quantize.quantize import quantize

    data = _signed(_padded_pool(-np.inf))
    calib = np.random.default_rng(0).uniform(-1, 1, (8, 8, 8, 3)).astype(np.float32)
    calib[0, 0, 0, :] = 3e38  # finite in float32; the convolution overflows to inf
    with pytest.raises(RangeError) as err:
        quantize(data, "int8", [calib], progress=False)
    assert "'conv_2d'" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", [0.0, 0.5])
def test_all_equal_calibration_data_give_usable_scales(value: float) -> None:
    """Every sample the same: all zeros (widened to [-1, 1]) or all 0.5 (the quantizer's range
    takes in 0: [0, 0.5], nothing to correct)."""
    pytest.importorskip("litert_quantizer")
    from tflfuse.quantize.quantize import quantize

    data = _signed(_padded_pool(-np.inf, relu=True))
    q = quantize(data, "int8", [np.full((8, 8, 8, 3), value, np.float32)], progress=False)
    _scales_usable(q.data)
    assert ("input" in q.ranges_adjusted) == (value == 0)
    model = flatbuffer.from_bytes(q.data)
    (quantize_op,) = model.main.ops_of("QUANTIZE")
    expect = 2 / 255 if value == 0 else value / 255
    assert float(quantize_op.outputs[0].quantization.scale[0]) == pytest.approx(expect, rel=1e-3)
    x = np.random.default_rng(0).uniform(-1, 1, (8, 8, 8, 3)).astype(np.float32)
    from tflfuse.verification.runs import run_float

    assert np.all(np.isfinite(run_float(q.data, [x])[0]))
