"""Algebraic rules: identities, cancelling pairs, activations spelled out in element-wise ops."""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops, refusals

from tflfuse.ir import Quantization
from tflfuse.rules.algebra import (
    CancelQuantizeDequantize,
    CancelTransposePair,
    CollapseReshapeChain,
    FactorCommonMultiplier,
    RecognizeGelu,
    RecognizeHardSwish,
    RecognizeLeakyRelu,
    RemoveIdentityArithmetic,
    SquareExistingDifference,
)
from tflfuse.targets import target as target_named


def test_identity_arithmetic_disappears() -> None:
    g = G()
    x = g.input((1, 4, 4, 3))
    y = g.conv(x, 3)
    y = g.binary("MUL", y, g.const(np.ones(3, np.float32)))
    y = g.binary("ADD", y, g.const(np.float32(0.0)))
    y = g.binary("DIV", y, g.const(np.float32(1.0)))
    y = g.binary("SUB", y, g.const(np.zeros((1, 1, 1, 3), np.float32)))
    data = g.bytes(y)
    fused, model, result = apply(data, RemoveIdentityArithmetic())
    assert ops(model) == ["CONV_2D"]
    assert model.main.outputs[0].name == "sub"  # the model output keeps its name
    assert_same_function(data, fused)


def test_identity_refused_when_it_broadcasts() -> None:
    g = G()
    x = g.input((1, 3))
    data = g.bytes(g.binary("MUL", g.fc(x, 3), g.const(np.ones((2, 3), np.float32))))
    _, model, result = apply(data, RemoveIdentityArithmetic())
    assert ops(model) == ["FULLY_CONNECTED", "MUL"]
    assert refusals(result, "RemoveIdentityArithmetic") == [
        "the constant broadcasts the value to a larger shape"
    ]


def test_identity_refused_on_an_input_to_output_copy() -> None:
    g = G()
    x = g.input((1, 3))
    data = g.bytes(g.binary("ADD", x, g.const(np.float32(0.0))))
    _, model, result = apply(data, RemoveIdentityArithmetic())
    assert ops(model) == ["ADD"]
    assert refusals(result, "RemoveIdentityArithmetic") == [
        "the result is a model output that cannot be renamed"
    ]


@pytest.mark.parametrize("second", [[0, 2, 1, 3], [0, 3, 1, 2]])
def test_transpose_pairs_cancel_or_compose(second: list[int]) -> None:
    g = G()
    x = g.input((1, 2, 3, 4))
    t = g.op("TRANSPOSE", [x, g.const(np.array([0, 2, 1, 3]))], (1, 3, 2, 4))
    shape = tuple(t.shape[i] for i in second)
    t2 = g.op("TRANSPOSE", [t, g.const(np.array(second))], shape)
    data = g.bytes(g.unary("RELU", t2))
    fused, model, _ = apply(data, CancelTransposePair())
    assert ops(model) == (["RELU"] if second == [0, 2, 1, 3] else ["TRANSPOSE", "RELU"])
    assert_same_function(data, fused)


def test_reshape_chain_collapses() -> None:
    g = G()
    x = g.input((1, 4, 6))
    r1 = g.op("RESHAPE", [x, g.const(np.array([1, 24]))], (1, 24), new_shape=[1, 24])
    r2 = g.op("RESHAPE", [r1, g.const(np.array([2, 12]))], (2, 12), new_shape=[2, 12])
    r3 = g.op(
        "RESHAPE", [g.unary("RELU", r2), g.const(np.array([2, 12]))], (2, 12), new_shape=[2, 12]
    )
    data = g.bytes(g.unary("TANH", r3))
    fused, model, _ = apply(data, CollapseReshapeChain())
    assert ops(model) == ["RESHAPE", "RELU", "TANH"]
    assert_same_function(data, fused)


def test_quantize_dequantize_pair_cancels_only_with_equal_scales() -> None:
    g = G()
    q = Quantization(np.array([0.02], np.float32), np.array([4]))
    other = Quantization(np.array([0.03], np.float32), np.array([4]))
    x = g.graph.add_tensor("x", (1, 8), "INT8", quantization=q)
    g.graph.inputs.append(x)
    real = g.graph.add_tensor("real", (1, 8))
    g.graph.add_op("DEQUANTIZE", [x], [real])
    same = g.graph.add_tensor("same", (1, 8), "INT8", quantization=q)
    g.graph.add_op("QUANTIZE", [real], [same])
    diff = g.graph.add_tensor("diff", (1, 8), "INT8", quantization=other)
    g.graph.add_op("QUANTIZE", [real], [diff])
    outs = []
    for t in (same, diff):
        o = g.graph.add_tensor(t.name + "_out", (1, 8), "INT8", quantization=t.quantization)
        g.graph.add_op("RELU", [t], [o])
        outs.append(o)
    data = g.bytes(*outs)
    fused, model, result = apply(data, CancelQuantizeDequantize())
    assert sorted(ops(model)) == ["DEQUANTIZE", "QUANTIZE", "RELU", "RELU"]
    assert refusals(result, "CancelQuantizeDequantize") == [
        "the QUANTIZE uses another type or scale than the DEQUANTIZE input"
    ]
    from tflfuse.verification import verify

    agreement = verify.compare(data, fused, int_atol=0)
    assert agreement.ok and agreement.identical and agreement.varies


def _hsig(g: G, x, fused: bool):
    if fused:
        return g.binary("ADD", x, g.const(np.float32(3.0)), act="RELU6")
    return g.unary("RELU6", g.binary("ADD", g.const(np.float32(3.0)), x))


@pytest.mark.parametrize("order", ["x*(h/6)", "(x*h)/6", "(x*h)*(1/6)", "(x/6)*h", "h*1/6*x"])
@pytest.mark.parametrize("fused", [True, False])
def test_hard_swish_in_any_order(order: str, fused: bool) -> None:
    g = G()
    x = g.conv(g.input((1, 4, 4, 3)), 3)
    h = _hsig(g, x, fused)
    sixth, six = g.const(np.float32(1 / 6)), g.const(np.float32(6.0))
    if order == "x*(h/6)":
        y = g.binary("MUL", x, g.binary("DIV", h, six))
    elif order == "(x*h)/6":
        y = g.binary("DIV", g.binary("MUL", x, h), six)
    elif order == "(x*h)*(1/6)":
        y = g.binary("MUL", g.binary("MUL", h, x), sixth)
    elif order == "(x/6)*h":
        y = g.binary("MUL", g.binary("DIV", x, six), h)
    else:
        y = g.binary("MUL", g.binary("MUL", h, sixth), x)
    data = g.bytes(y)
    fused_bytes, model, _ = apply(data, RecognizeHardSwish())
    assert ops(model) == ["CONV_2D", "HARD_SWISH"]
    assert_same_function(data, fused_bytes)


def test_hard_swish_refused_with_a_wrong_offset() -> None:
    g = G()
    x = g.conv(g.input((1, 4, 4, 3)), 3)
    h = g.binary("ADD", x, g.const(np.float32(2.0)), act="RELU6")
    data = g.bytes(g.binary("MUL", x, g.binary("DIV", h, g.const(np.float32(6.0)))))
    _, model, result = apply(data, RecognizeHardSwish())
    assert "HARD_SWISH" not in ops(model)
    assert "not a HARD_SWISH written out" in refusals(result, "RecognizeHardSwish")


@pytest.mark.parametrize("form", ["maximum", "relu_sum"])
def test_leaky_relu_forms(form: str) -> None:
    g = G()
    x = g.conv(g.input((1, 4, 4, 3)), 3)
    if form == "maximum":
        y = g.binary("MAXIMUM", g.binary("MUL", g.const(np.float32(0.2)), x), x)
    else:
        y = g.binary(
            "ADD",
            g.binary("MUL", x, g.const(np.float32(0.2))),
            g.binary("MUL", g.unary("RELU", x), g.const(np.float32(0.8))),
        )
    data = g.bytes(y)
    fused, model, _ = apply(data, RecognizeLeakyRelu())
    assert ops(model) == ["CONV_2D", "LEAKY_RELU"]
    assert model.main.ops[1].options["alpha"] == pytest.approx(0.2)
    assert_same_function(data, fused)


def test_leaky_relu_refuses_alpha_above_one() -> None:
    g = G()
    x = g.conv(g.input((1, 4, 4, 3)), 3)
    data = g.bytes(g.binary("MAXIMUM", x, g.binary("MUL", x, g.const(np.float32(1.5)))))
    _, model, result = apply(data, RecognizeLeakyRelu())
    assert ops(model) == ["CONV_2D", "MUL", "MAXIMUM"]
    assert refusals(result, "RecognizeLeakyRelu") == ["not a LEAKY_RELU written out"]


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_gelu_tanh_form(cube: str) -> None:
    g = G()
    x = g.fc(g.input((2, 6)), 5)
    if cube == "pow":
        x3 = g.binary("POW", x, g.const(np.float32(3.0)))
    else:
        x3 = g.binary("MUL", x, g.binary("MUL", x, x))
    inner = g.binary("ADD", x, g.binary("MUL", x3, g.const(np.float32(0.044715))))
    t = g.unary("TANH", g.binary("MUL", g.const(np.float32(np.sqrt(2 / np.pi))), inner))
    one_plus = g.binary("ADD", t, g.const(np.float32(1.0)))
    y = g.binary("MUL", g.binary("MUL", x, g.const(np.float32(0.5))), one_plus)
    data = g.bytes(y)
    fused, model, _ = apply(data, RecognizeGelu())
    assert ops(model) == ["FULLY_CONNECTED", "GELU"]
    assert_same_function(data, fused, atol=1e-5, rtol=1e-4)


def test_layernorm_tail_is_factored() -> None:
    g = G()
    x = g.input((1, 6, 8))
    mean = g.op("MEAN", [x, g.const(np.array([2]))], (1, 6, 1), keep_dims=True)
    m = g.binary(
        "MUL",
        g.unary("RSQRT", g.binary("ADD", mean, g.const(np.float32(2.0)))),
        g.rand(1, 1, 8, name="gamma"),
    )
    y = g.binary("ADD", g.binary("MUL", x, m), g.binary("MUL", g.unary("NEG", mean), m))
    data = g.bytes(y)
    fused, model, _ = apply(data, FactorCommonMultiplier())
    assert ops(model) == ["MEAN", "ADD", "RSQRT", "MUL", "SUB", "MUL"]
    assert_same_function(data, fused)


def test_factoring_refused_when_a_product_is_shared() -> None:
    g = G()
    x, z = g.input((1, 8)), g.input((1, 8), "z")
    k = g.rand(1, 8, name="k")
    a = g.binary("MUL", x, k)
    data = g.bytes(g.binary("ADD", a, g.binary("MUL", z, k)), a)
    _, model, result = apply(data, FactorCommonMultiplier())
    assert ops(model) == ["MUL", "MUL", "ADD"]
    assert refusals(result, "FactorCommonMultiplier") == ["a product is read elsewhere"]


def _layernorm(g: G, x, gamma):
    """The converter's LayerNorm: x * m + (-mean) * m with m = rsqrt(var + eps) * gamma."""
    mean = g.op("MEAN", [x, g.const(np.array([2]))], (1, 6, 1), keep_dims=True)
    sq = g.binary("SQUARED_DIFFERENCE", x, mean)
    var = g.op("MEAN", [sq, g.const(np.array([2]))], (1, 6, 1), keep_dims=True)
    r = g.unary("RSQRT", g.binary("ADD", var, g.const(np.float32(1e-3))))
    m = g.binary("MUL", r, gamma)
    return g.binary("ADD", g.binary("MUL", x, m), g.binary("MUL", g.unary("NEG", mean), m))


@pytest.mark.parametrize("target", ["xnnpack", "cpu"])
def test_layernorm_squares_the_factored_difference(target: str) -> None:
    g = G()
    x = g.input((1, 6, 8))
    data = g.bytes(_layernorm(g, x, g.rand(1, 1, 8, name="gamma")))
    fused, model, result = apply(
        data, FactorCommonMultiplier(target_named(target)), SquareExistingDifference()
    )
    assert result.fired() == {"FactorCommonMultiplier": 1, "SquareExistingDifference": 1}
    # plain kernels run an int8 SUB slowly: the cpu form adds m * -1 instead
    diff = ["SUB"] if target == "xnnpack" else ["MUL", "ADD"]
    assert ops(model) == ["MEAN", *diff, "MUL", "MEAN", "ADD", "RSQRT", "MUL", "MUL"]
    assert_same_function(data, fused)


def test_squared_difference_stays_when_no_difference_is_computed() -> None:
    g = G()
    x = g.input((1, 6, 8))
    mean = g.op("MEAN", [x, g.const(np.array([2]))], (1, 6, 1), keep_dims=True)
    data = g.bytes(g.binary("SQUARED_DIFFERENCE", x, mean))
    _, model, result = apply(data, SquareExistingDifference())
    assert ops(model) == ["MEAN", "SQUARED_DIFFERENCE"]
    assert refusals(result, "SquareExistingDifference") == ["x - m is not computed elsewhere"]


def test_identity_that_only_broadcasts_disappears_when_readers_broadcast() -> None:
    g = G()
    x = g.input((1, 6, 8))
    r = g.unary("TANH", g.op("MEAN", [x, g.const(np.array([2]))], (1, 6, 1), keep_dims=True))
    gamma_ones = g.binary("MUL", r, g.const(np.ones((1, 1, 8), np.float32)))
    data = g.bytes(g.binary("MUL", x, gamma_ones))
    fused, model, _ = apply(data, RemoveIdentityArithmetic())
    assert ops(model) == ["MEAN", "TANH", "MUL"]
    assert model.main.ops[-1].inputs[1].shape == (1, 6, 1)
    assert_same_function(data, fused)
