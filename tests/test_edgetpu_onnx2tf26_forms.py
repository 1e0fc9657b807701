"""Forms onnx2tf 2.6 exports that the compiler refuses, legalized into ops it maps.

MEAN over the plane of an NCHW tensor (its MobileNetV3 squeeze-excite): refused as a reduction
over W "channels" that are not a multiple of 4; laid out NHWC it is the global pool the compiler
maps. RELU_0_TO_1 (its HardSigmoid) in an int8 file: RELU, or RELU and MINIMUM. Stand-ins built
in the IR: float and int8, 7x7 and 14x14 planes."""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops, refusals
from test_rules_edgetpu import Q8, mapped

from tflfuse.runtime import verify
from tflfuse.targets.edgetpu.rules import (
    LegalizeRelu0To1,
    MeanOverNchwPlane,
    SplitOversizedTranspose,
)


def _float_se_mean(c: int, hw: int, keep_dims: bool = True) -> bytes:
    g = G()
    x = g.input((1, c, hw, hw))
    y = g.unary("RELU", x)
    axes = g.const(np.array([2, 3], np.int32), "axes")
    shape = (1, c, 1, 1) if keep_dims else (1, c)
    return g.bytes(g.op("MEAN", [y, axes], shape, keep_dims=keep_dims))


@pytest.mark.parametrize(("c", "hw", "keep_dims"), [(16, 7, True), (8, 14, False)])
def test_float_nchw_mean_becomes_an_nhwc_mean_and_maps(c: int, hw: int, keep_dims: bool) -> None:
    before = _float_se_mean(c, hw, keep_dims)
    after, model, result = apply(before, MeanOverNchwPlane())
    assert result.fired() == {"MeanOverNchwPlane": 1}
    assert ops(model) == ["RELU", "TRANSPOSE", "MEAN", "RESHAPE"]
    mean = model.main.ops[2]
    assert [int(a) for a in mean.inputs[1].data] == [1, 2] and mean.outputs[0].shape == (1, 1, 1, c)
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


def test_int8_nchw_mean_keeps_the_function_and_maps() -> None:
    g = Q8()
    x = g.input((1, 24, 7, 7), 0.05, -10)
    axes = g.graph.add_constant("axes", np.array([2, 3], np.int32))
    y = g.op("MEAN", [x, axes], (1, 24, 1, 1), 0.02, 3, keep_dims=True)
    before = g.bytes(y)
    assert mapped(before) == (0, 1)  # "reduces over 7 channels, not a multiple of 4"
    after, model, result = apply(before, MeanOverNchwPlane())
    assert ops(model) == ["TRANSPOSE", "MEAN", "RESHAPE"]
    transpose = model.main.ops[0]
    assert transpose.outputs[0].quantization.same_as(x.quantization)
    assert mapped(after) == (3, 0)
    steps = MeanOverNchwPlane().int8_error_steps
    agreement = verify.compare(before, after, int_atol=steps, runs=3)
    assert agreement.ok and agreement.varies, agreement


def test_an_oversized_transpose_is_then_cut_and_everything_maps() -> None:
    """[1, 672, 14, 14] (131712 elements): the new TRANSPOSE is over the compiler's limit, and
    SplitOversizedTranspose cuts it into pieces it maps."""
    g = Q8()
    x = g.input((1, 672, 14, 14), 0.05, 0)
    axes = g.graph.add_constant("axes", np.array([2, 3], np.int32))
    y = g.op("MEAN", [x, axes], (1, 672, 1, 1), 0.05, 0, keep_dims=True)
    before = g.bytes(y)
    after, model, _ = apply(before, MeanOverNchwPlane(), SplitOversizedTranspose())
    assert "CONCATENATION" in ops(model) and ops(model).count("TRANSPOSE") >= 2
    assert mapped(after) == (len(model.main.ops), 0)
    agreement = verify.compare(before, after, int_atol=1, runs=2)
    assert agreement.ok and agreement.varies, agreement


def test_a_mean_the_compiler_maps_or_another_reduction_is_left_alone() -> None:
    g = Q8()
    x = g.input((1, 16, 8, 8), 0.05, 0)  # W = 8: a multiple of 4, mapped as it is
    axes = g.graph.add_constant("axes", np.array([2, 3], np.int32))
    y = g.op("MEAN", [x, axes], (1, 16, 1, 1), 0.05, 0, keep_dims=True)
    _, model, result = apply(g.bytes(y), MeanOverNchwPlane())
    assert ops(model) == ["MEAN"]
    assert refusals(result, "MeanOverNchwPlane") == ["the compiler maps this MEAN as it is"]
    g = Q8()
    x = g.input((1, 7, 7, 16), 0.05, 0)
    axes = g.graph.add_constant("axes", np.array([1, 2], np.int32))
    y = g.op("MEAN", [x, axes], (1, 1, 1, 16), 0.05, 0, keep_dims=True)
    _, model, result = apply(g.bytes(y), MeanOverNchwPlane())
    assert ops(model) == ["MEAN"]
    assert refusals(result, "MeanOverNchwPlane") == [
        "MEAN reduces axes [1, 2], not the two innermost"
    ]


# -- RELU_0_TO_1 (an int8 file's; a float one is made int8 by int8_completion) -------------------
@pytest.mark.parametrize(
    ("scale", "zero", "expect"),
    [
        (1 / 255, -128, ["RELU"]),  # 1 is the type's top: RELU's clamp is the clamp at 1
        (0.006, -20, ["RELU"]),  # 1 is past the top (q(1) = 147)
        (0.01, -128, ["RELU", "MINIMUM"]),  # q(1) = -28: the clamp at 1 is a MINIMUM
        (0.005, -100, ["RELU", "MINIMUM"]),
    ],
)
def test_int8_relu_0_to_1_becomes_table_ops_exactly(scale: float, zero: int, expect) -> None:
    g = Q8()
    x = g.input((1, 6, 6, 8), 0.02, 3)
    y = g.op("RELU_0_TO_1", [x], x.shape, scale, zero)
    before = g.bytes(y)
    assert mapped(before) == (0, 1)
    after, model, result = apply(before, LegalizeRelu0To1())
    assert result.fired() == {"LegalizeRelu0To1": 1}
    assert ops(model) == expect
    assert mapped(after) == (len(expect), 0)
    agreement = verify.compare(before, after, int_atol=0, runs=4)
    assert agreement.ok and agreement.varies, agreement
