"""Epilogue rules: activation, bias and per-channel scale into the producing kernel."""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops, refusals

from tflfuse.ir import Quantization, flatbuffer
from tflfuse.rules.epilogue import (
    FoldBiasIntoProducer,
    FoldScaleIntoProducer,
    FuseActivationIntoProducer,
)
from tflfuse.verification import verify


@pytest.mark.parametrize("producer", ["conv", "dw", "fc", "add", "sub", "mul", "maxpool"])
@pytest.mark.parametrize("act", ["RELU", "RELU6", "RELU_N1_TO_1"])
def test_activation_fuses_into_every_producer(producer: str, act: str) -> None:
    g = G()
    x = g.input((1, 6, 6, 4))
    if producer == "conv":
        y = g.conv(x, 5, k=3)
    elif producer == "dw":
        y = g.dwconv(x)
    elif producer == "fc":
        y = g.fc(x, 7)
    elif producer == "maxpool":
        y = g.op(
            "MAX_POOL_2D",
            [x],
            (1, 3, 3, 4),
            padding="VALID",
            stride_h=2,
            stride_w=2,
            filter_height=2,
            filter_width=2,
        )
    else:
        y = g.binary(producer.upper(), x, g.rand(4, name="k"))
    out = g.unary(act, y)
    data = g.bytes(out)
    fused, model, result = apply(data, FuseActivationIntoProducer())
    assert len(model.main.ops) == 1
    assert model.main.ops[0].fused_activation == act
    assert result.fired() == {"FuseActivationIntoProducer": 1}
    assert_same_function(data, fused)


def test_activation_refused_when_producer_output_is_shared() -> None:
    g = G()
    x = g.input((1, 4, 4, 3))
    y = g.conv(x, 3)
    r = g.unary("RELU", y)
    data = g.bytes(r, g.binary("ADD", y, r))
    _, model, result = apply(data, FuseActivationIntoProducer())
    assert ops(model) == ["CONV_2D", "RELU", "ADD"]
    assert refusals(result, "FuseActivationIntoProducer") == [
        "CONV_2D output is also read by another op"
    ]


def test_tanh_is_not_fused_and_says_why() -> None:
    g = G()
    x = g.input((1, 4, 4, 3))
    data = g.bytes(g.unary("TANH", g.conv(x, 3)))
    _, model, result = apply(data, FuseActivationIntoProducer())
    assert ops(model) == ["CONV_2D", "TANH"]
    assert refusals(result, "FuseActivationIntoProducer") == [
        "CONV_2D kernels do not apply a fused TANH"
    ]


def test_activation_fuses_on_int8() -> None:
    g = G()
    q_in = Quantization(np.array([0.05], np.float32), np.array([3]))
    q_mid = Quantization(np.array([0.1], np.float32), np.array([-5]))
    q_out = Quantization(np.array([0.05], np.float32), np.array([-128]))
    x = g.graph.add_tensor("x", (1, 8), "INT8", quantization=q_in)
    k = g.graph.add_constant(
        "k", np.arange(-4, 4, dtype=np.int8).reshape(1, 8), "INT8", quantization=q_in
    )
    g.graph.inputs.append(x)
    mid = g.graph.add_tensor("sum", (1, 8), "INT8", quantization=q_mid)
    out = g.graph.add_tensor("relu", (1, 8), "INT8", quantization=q_out)
    g.graph.add_op("ADD", [x, k], [mid], {"fused_activation_function": "NONE"})
    g.graph.add_op("RELU", [mid], [out])
    data = g.bytes(out)
    fused, model, _ = apply(data, FuseActivationIntoProducer())
    assert ops(model) == ["ADD"]
    agreement = verify.compare(data, fused, int_atol=1)
    assert agreement.ok and agreement.varies, agreement


@pytest.mark.parametrize("producer", ["conv", "dw", "fc", "tconv"])
def test_bias_and_scale_fold_into_producer(producer: str) -> None:
    g = G()
    x = g.input((1, 5, 5, 3))
    if producer == "conv":
        y, c = g.conv(x, 4, k=3), 4
    elif producer == "dw":
        y, c = g.dwconv(x, multiplier=2), 6
    elif producer == "fc":
        y, c = g.fc(x, 6), 6
    else:
        shape = g.const(np.array([1, 10, 10, 4], np.int32), "oshape")
        y = g.op(
            "TRANSPOSE_CONV",
            [shape, g.rand(4, 3, 3, 3), x, g.rand(4, name="b")],
            (1, 10, 10, 4),
            padding="SAME",
            stride_h=2,
            stride_w=2,
        )
        c = 4
    y = g.binary("MUL", y, g.rand(c, low=0.5, high=2.0, name="scale"))
    y = g.binary("SUB", y, g.rand(c, name="shift"))
    y = g.binary("ADD", y, g.rand(c, name="shift"), act="RELU")
    data = g.bytes(y)
    fused, model, result = apply(data, FoldBiasIntoProducer(), FoldScaleIntoProducer())
    assert len(model.main.ops) == 1
    assert model.main.ops[0].fused_activation == "RELU"
    assert result.fired() == {"FoldScaleIntoProducer": 1, "FoldBiasIntoProducer": 2}
    assert_same_function(data, fused)


def test_bias_fold_refuses_a_full_tensor_constant() -> None:
    g = G()
    x = g.input((1, 4, 4, 3))
    y = g.binary("ADD", g.conv(x, 2), g.rand(1, 4, 4, 2, name="map"))
    data = g.bytes(y)
    _, model, result = apply(data, FoldBiasIntoProducer())
    assert ops(model) == ["CONV_2D", "ADD"]
    assert refusals(result, "FoldBiasIntoProducer") == [
        "the bias constant is not one value per output channel"
    ]


def test_scale_fold_refuses_after_an_activation() -> None:
    g = G()
    x = g.input((1, 4, 4, 3))
    y = g.binary("MUL", g.conv(x, 2, act="RELU"), g.rand(2, name="s"))
    data = g.bytes(y)
    _, model, result = apply(data, FoldScaleIntoProducer())
    assert ops(model) == ["CONV_2D", "MUL"]
    assert refusals(result, "FoldScaleIntoProducer") == ["CONV_2D has fused RELU before the scale"]


def test_shared_weights_are_not_modified_in_place() -> None:
    g = G()
    x = g.input((1, 4, 4, 3))
    w, b = g.rand(2, 1, 1, 3), g.rand(2, name="b")
    a = g.op("CONV_2D", [x, w, b], (1, 4, 4, 2), padding="SAME", stride_h=1, stride_w=1)
    c = g.op("CONV_2D", [x, w, b], (1, 4, 4, 2), padding="SAME", stride_h=1, stride_w=1)
    data = g.bytes(g.binary("MUL", a, g.rand(2, name="s")), c)
    fused, model, _ = apply(data, FoldScaleIntoProducer())
    assert ops(model) == ["CONV_2D", "CONV_2D"]
    assert_same_function(data, fused)
    assert flatbuffer.from_bytes(fused).main.ops[1].inputs[1].data.tobytes() == w.data.tobytes()


def _transpose_conv(g: G, x, bias: bool):
    shape = g.const(np.array([1, 10, 10, 4], np.int32), "oshape")
    inputs = [shape, g.rand(4, 3, 3, x.shape[-1]), x]
    if bias:
        inputs.append(g.rand(4, name="b"))
    return g.op("TRANSPOSE_CONV", inputs, (1, 10, 10, 4), padding="SAME", stride_h=2, stride_w=2)


def _written_versions(data: bytes, op_type: str) -> list[int]:
    """Op versions as written in the flatbuffer (read back from the bytes)."""
    return [op.version for op in flatbuffer.from_bytes(data).main.ops if op.type == op_type]


@pytest.mark.parametrize("bias", [False, True])
def test_transpose_conv_with_fused_activation_is_written_as_version_4(bias: bool) -> None:
    """Issue 11: it kept version 1; a runtime without fused activations would drop the RELU."""
    g = G()
    x = g.input((1, 5, 5, 3))
    data = g.bytes(g.unary("RELU", _transpose_conv(g, x, bias)))
    # written at the version its operands need (a bias takes version 3), never less
    assert _written_versions(data, "TRANSPOSE_CONV") == [3 if bias else 1]
    fused, model, result = apply(data, FuseActivationIntoProducer())
    assert ops(model) == ["TRANSPOSE_CONV"]
    assert _written_versions(fused, "TRANSPOSE_CONV") == [4]
    assert_same_function(data, fused)


def test_transpose_conv_given_a_bias_is_written_as_version_3() -> None:
    g = G()
    x = g.input((1, 5, 5, 3))
    data = g.bytes(g.binary("ADD", _transpose_conv(g, x, bias=False), g.rand(4, name="c")))
    fused, model, _ = apply(data, FoldBiasIntoProducer())
    assert ops(model) == ["TRANSPOSE_CONV"]
    assert _written_versions(fused, "TRANSPOSE_CONV") == [3]
    assert_same_function(data, fused)
