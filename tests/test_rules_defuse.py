"""Defuse: fused activations and biases become their own ops; the pipeline fuses them back."""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops, optimize

from tflfuse.ir import Quantization
from tflfuse.rules.defuse import Defuse
from tflfuse.verification import verify


def _small_net() -> tuple[G, bytes]:
    g = G()
    x = g.input((1, 8, 8, 3))
    y = g.conv(x, 8, k=3, stride=2, act="RELU6")
    y = g.dwconv(y, act="RELU")
    z = g.conv(y, 8, k=1)
    y = g.binary("ADD", y, z, act="RELU_N1_TO_1")
    return g, g.bytes(g.fc(y, 4, act="RELU"))


def test_defuse_splits_activations_and_biases() -> None:
    _, data = _small_net()
    out, model, _ = apply(data, Defuse())
    assert model.main.op_counts() == {
        "ADD": 5,
        "CONV_2D": 2,
        "DEPTHWISE_CONV_2D": 1,
        "FULLY_CONNECTED": 1,
        "RELU": 2,
        "RELU6": 1,
        "RELU_N1_TO_1": 1,
    }
    assert all(op.fused_activation == "NONE" for op in model.main.ops)
    assert_same_function(data, out)


def test_pipeline_fuses_a_defused_net_back_to_the_original_count() -> None:
    _, data = _small_net()
    defused, _, _ = apply(data, Defuse())
    back, model, _ = optimize(defused, level=1)
    assert len(model.main.ops) == 5
    assert_same_function(data, back)


def test_defuse_keeps_int8_bias_and_splits_the_activation_exactly() -> None:
    g = G()
    q = Quantization(np.array([0.05], np.float32), np.array([0]))
    q_out = Quantization(np.array([0.03], np.float32), np.array([-128]))
    x = g.graph.add_tensor("x", (1, 6), "INT8", quantization=q)
    g.graph.inputs.append(x)
    w = g.graph.add_constant(
        "w",
        np.arange(-12, 12, dtype=np.int8).reshape(4, 6),
        "INT8",
        quantization=Quantization(np.array([0.02], np.float32), np.array([0])),
    )
    b = g.graph.add_constant(
        "b",
        np.array([5, -3, 0, 9], np.int32),
        "INT32",
        quantization=Quantization(np.array([0.001], np.float32), np.array([0])),
    )
    out = g.graph.add_tensor("y", (1, 4), "INT8", quantization=q_out)
    g.graph.add_op("FULLY_CONNECTED", [x, w, b], [out], {"fused_activation_function": "RELU6"})
    data = g.bytes(out)
    defused, model, _ = apply(data, Defuse())
    assert ops(model) == ["FULLY_CONNECTED", "RELU6"]
    agreement = verify.compare(data, defused, int_atol=0)
    assert agreement.identical and agreement.varies


@pytest.mark.slow
def test_defused_mobilenet_v2_comes_back_to_the_stock_op_count(keras_tflite) -> None:
    stock = keras_tflite["mobilenet_v2_float"]
    defused, model, _ = apply(stock, Defuse())
    stock_ops = len(optimize(stock, level=0, rules=[])[1].main.ops)
    assert len(model.main.ops) > 2 * stock_ops
    assert_same_function(stock, defused)
    back, model, _ = optimize(defused, level=2)
    assert len(model.main.ops) <= stock_ops
    assert_same_function(stock, back)
