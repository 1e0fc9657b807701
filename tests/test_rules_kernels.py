"""Kernel-choice rules: MEAN keep_dims for the plain int8 kernels (decided by the cost table)."""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops, refusals

from tflfuse.ir import Quantization
from tflfuse.rules.kernels import MeanKeepDims, MeanLastAxisAsRows, SpellOutInt8HardSwish
from tflfuse.targets import target as target_named
from tflfuse.verification import verify


def _q(scale: float, zero: int = 0) -> Quantization:
    return Quantization(np.array([scale], np.float32), np.array([zero], np.int64))


def _global_pool_int8(g: G):
    x = g.graph.add_tensor("x", (1, 5, 5, 16), "INT8", quantization=_q(0.05, 3))
    g.graph.inputs.append(x)
    y = g.graph.add_tensor("y", (1, 16), "INT8", quantization=_q(0.02, -5))
    g.graph.add_op("MEAN", [x, g.const(np.array([1, 2]))], [y], {"keep_dims": False})
    out = g.graph.add_tensor("out", (1, 16), "INT8", quantization=_q(0.02, -5))
    g.graph.add_op("RELU", [y], [out])
    return out


def test_int8_global_pool_keeps_dims_for_the_plain_kernels() -> None:
    g = G()
    data = g.bytes(_global_pool_int8(g))
    fused, model, _ = apply(data, MeanKeepDims(target_named("cpu")))
    assert ops(model) == ["MEAN", "RESHAPE", "RELU"]
    assert model.main.ops[0].options["keep_dims"] is True
    # the fast path rounds its sum differently: at most one quantization step
    agreement = verify.compare(data, fused, int_atol=MeanKeepDims.int8_error_steps)
    assert agreement.ok and agreement.varies
    assert MeanKeepDims.int8_error_steps == 1


def test_int8_global_pool_stays_for_xnnpack() -> None:
    g = G()
    data = g.bytes(_global_pool_int8(g))
    _, model, result = apply(data, MeanKeepDims(target_named("xnnpack")))
    assert ops(model) == ["MEAN", "RELU"]
    assert refusals(result, "MeanKeepDims") == [
        "XNNPACK kernels run this MEAN as fast without keep_dims (cost table)"
    ]


@pytest.mark.parametrize("target", ["cpu", "xnnpack"])
def test_float_global_pool_keeps_dims_where_its_int8_form_will_pay(target: str) -> None:
    g = G()
    x = g.input((1, 5, 5, 16))
    y = g.op("MEAN", [x, g.const(np.array([1, 2]))], (1, 16), keep_dims=False)
    data = g.bytes(g.unary("TANH", y))
    fused, model, result = apply(data, MeanKeepDims(target_named(target)))
    if target == "cpu":  # the float graph may be quantized: the int8 saving decides
        assert ops(model) == ["MEAN", "RESHAPE", "TANH"]
    else:
        assert ops(model) == ["MEAN", "TANH"]
        assert len(refusals(result, "MeanKeepDims")) == 1
    assert_same_function(data, fused)


def _layernorm_mean_int8(g: G):
    x = g.graph.add_tensor("x", (1, 6, 16), "INT8", quantization=_q(0.05, 3))
    g.graph.inputs.append(x)
    y = g.graph.add_tensor("y", (1, 6, 1), "INT8", quantization=_q(0.01, -2))
    g.graph.add_op("MEAN", [x, g.const(np.array([2]))], [y], {"keep_dims": True})
    return y


def test_int8_mean_over_the_last_axis_becomes_a_pool_for_the_plain_kernels() -> None:
    g = G()
    data = g.bytes(_layernorm_mean_int8(g))
    fused, model, _ = apply(data, MeanLastAxisAsRows(target_named("cpu")))
    assert ops(model) == ["RESHAPE", "MEAN", "RESHAPE"]
    assert model.main.ops[1].inputs[0].shape == (6, 1, 16, 1)
    agreement = verify.compare(data, fused, int_atol=MeanLastAxisAsRows.int8_error_steps)
    assert agreement.ok and agreement.varies


def test_int8_mean_over_the_last_axis_stays_for_xnnpack() -> None:
    g = G()
    data = g.bytes(_layernorm_mean_int8(g))
    _, model, result = apply(data, MeanLastAxisAsRows(target_named("xnnpack")))
    assert ops(model) == ["MEAN"]
    assert refusals(result, "MeanLastAxisAsRows") == [
        "XNNPACK kernels reduce the last axis as fast as a pool (cost table)"
    ]


def _hard_swish_int8(g: G):
    x = g.graph.add_tensor("x", (1, 4, 4, 8), "INT8", quantization=_q(6 / 255, -43))
    g.graph.inputs.append(x)
    y = g.graph.add_tensor("y", (1, 4, 4, 8), "INT8", quantization=_q(5.5 / 255, -113))
    g.graph.add_op("HARD_SWISH", [x], [y])
    return y


def test_int8_hard_swish_is_spelled_out_for_xnnpack() -> None:
    g = G()
    data = g.bytes(_hard_swish_int8(g))
    fused, model, _ = apply(data, SpellOutInt8HardSwish(target_named("xnnpack")))
    assert ops(model) == ["ADD", "MUL", "MUL"]
    assert model.main.ops[0].fused_activation == "RELU6"
    agreement = verify.compare(data, fused, int_atol=SpellOutInt8HardSwish.int8_error_steps)
    assert agreement.ok and agreement.varies


def test_int8_hard_swish_stays_for_the_plain_kernels() -> None:
    g = G()
    data = g.bytes(_hard_swish_int8(g))
    _, model, result = apply(data, SpellOutInt8HardSwish(target_named("cpu")))
    assert ops(model) == ["HARD_SWISH"]
    assert refusals(result, "SpellOutInt8HardSwish") == [
        "the plain built-in kernels run the int8 HARD_SWISH as fast (cost table)"
    ]
