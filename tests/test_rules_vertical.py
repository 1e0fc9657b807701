"""Vertical rules: affine into the following conv/FC, scale through RELU, chains, PAD."""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops, refusals

from tflfuse.rules.epilogue import FuseActivationIntoProducer
from tflfuse.rules.vertical import (
    DropReshapeBeforeFullyConnected,
    FoldAffineIntoFollowing,
    FoldBiasThroughAdd,
    FoldPadIntoConv,
    FoldScaleIntoMatmulOperand,
    MergeLinearChain,
    MoveScaleThroughMean,
    MoveScaleThroughRelu,
)


@pytest.mark.parametrize("reader", ["conv_same", "conv_valid", "dw", "fc"])
def test_mul_and_add_fold_into_following(reader: str) -> None:
    g = G()
    x = g.input((1, 6, 6, 3))
    y = g.binary("MUL", x, g.rand(3, low=0.5, high=2.0, name="s"))
    y = g.binary("ADD", y, g.rand(3, name="c"))
    if reader == "conv_same":
        out = g.conv(y, 4, k=1)  # SAME with a 1x1 kernel pads nothing
    elif reader == "conv_valid":
        out = g.conv(y, 4, k=3, padding="VALID")
    elif reader == "dw":
        out = g.dwconv(y, k=3, padding="VALID", multiplier=2)
    else:
        out = g.fc(y, 5)  # FC on NHWC: one row per pixel, weights [5, 3]
    data = g.bytes(out)
    fused, model, result = apply(data, FoldAffineIntoFollowing())
    assert len(model.main.ops) == 1
    assert result.fired() == {"FoldAffineIntoFollowing": 2}
    assert_same_function(data, fused)


def test_add_before_same_padded_conv_is_refused() -> None:
    g = G()
    x = g.input((1, 6, 6, 3))
    y = g.binary("ADD", x, g.rand(3, name="c"))
    data = g.bytes(g.conv(y, 4, k=3))
    _, model, result = apply(data, FoldAffineIntoFollowing())
    assert ops(model) == ["ADD", "CONV_2D"]
    assert refusals(result, "FoldAffineIntoFollowing") == [
        "CONV_2D uses SAME padding: its zero border would not see the added constant"
    ]


def test_mul_before_same_padded_conv_folds_and_feeds_two_readers() -> None:
    g = G()
    x = g.input((1, 6, 6, 3))
    y = g.binary("MUL", x, g.rand(3, name="s"))
    data = g.bytes(g.conv(y, 4, k=3), g.dwconv(y, k=3))
    fused, model, _ = apply(data, FoldAffineIntoFollowing())
    assert ops(model) == ["CONV_2D", "DEPTHWISE_CONV_2D"]
    assert_same_function(data, fused)


def test_scale_through_relu_folds_preactivation_batchnorm() -> None:
    g = G()
    x = g.input((1, 6, 6, 4))
    h = g.binary("ADD", x, g.conv(x, 4, k=3))  # a residual: the BN cannot fold backwards
    bn = g.binary("MUL", h, g.rand(4, low=0.3, high=2.0, name="gamma"))
    bn = g.binary("ADD", bn, g.rand(4, name="beta"))
    data = g.bytes(g.conv(g.unary("RELU", bn), 6, k=3))
    fused, model, result = apply(
        data, FuseActivationIntoProducer(), MoveScaleThroughRelu(), FoldAffineIntoFollowing()
    )
    assert ops(model) == ["CONV_2D", "ADD", "ADD", "CONV_2D"]
    assert model.main.ops[2].fused_activation == "RELU"
    assert result.fired()["MoveScaleThroughRelu"] == 1
    assert_same_function(data, fused)


def test_scale_through_relu_refuses_a_negative_scale() -> None:
    g = G()
    x = g.input((1, 6, 6, 2))
    bn = g.binary("MUL", x, g.const(np.array([0.5, -1.0], np.float32), "s"))
    bn = g.binary("ADD", bn, g.rand(2, name="b"), act="RELU")
    data = g.bytes(g.conv(bn, 3, k=1))
    _, model, result = apply(data, MoveScaleThroughRelu())
    assert ops(model) == ["MUL", "ADD", "CONV_2D"]
    assert refusals(result, "MoveScaleThroughRelu") == [
        "a scale is not positive, so it does not commute with RELU"
    ]


@pytest.mark.parametrize("kind", ["conv", "fc"])
def test_linear_chain_merges(kind: str) -> None:
    g = G()
    x = g.input((1, 4, 4, 8))
    if kind == "conv":
        mid = g.conv(x, 16, k=1, stride=2)
        out = g.conv(mid, 4, k=1, act="RELU6")
    else:
        out = g.fc(g.fc(x, 16), 4, act="RELU6")
    data = g.bytes(out)
    fused, model, result = apply(data, MergeLinearChain())
    assert ops(model) == ["CONV_2D" if kind == "conv" else "FULLY_CONNECTED"]
    assert model.main.ops[0].fused_activation == "RELU6"
    assert result.fired() == {"MergeLinearChain": 1}
    assert_same_function(data, fused)


def test_linear_chain_refuses_a_bottleneck() -> None:
    g = G()
    x = g.input((1, 4, 4, 32))
    data = g.bytes(g.conv(g.conv(x, 4, k=1), 32, k=1))
    _, model, result = apply(data, MergeLinearChain())
    assert ops(model) == ["CONV_2D", "CONV_2D"]
    assert refusals(result, "MergeLinearChain") == [
        "merging 32->4->32 channels into 32->32 would need more multiply-adds"
    ]


def test_linear_chain_refuses_an_activation_between() -> None:
    g = G()
    x = g.input((1, 4, 4, 8))
    data = g.bytes(g.conv(g.conv(x, 8, k=1, act="RELU"), 4, k=1))
    _, _, result = apply(data, MergeLinearChain())
    assert refusals(result, "MergeLinearChain") == ["RELU between the two ops is not linear"]


@pytest.mark.parametrize("stride", [1, 2])
def test_pad_folds_into_conv_and_relu_maxpool(stride: int) -> None:
    g = G()
    x = g.input((1, 7, 7, 3))
    # SAME with a 3x3 kernel on 7 pixels adds 1 and 1 at stride 1 and at stride 2
    pads = g.const(np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32), "p")
    y = g.op("PAD", [x, pads], (1, 9, 9, 3))
    y = g.conv(y, 4, k=3, stride=stride, padding="VALID", act="RELU")
    n = y.shape[1]
    pads2 = g.const(np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32), "p2")
    z = g.op("PAD", [y, pads2], (1, n + 2, n + 2, 4))
    z = g.op(
        "MAX_POOL_2D",
        [z],
        (1, n, n, 4),
        padding="VALID",
        stride_h=1,
        stride_w=1,
        filter_height=3,
        filter_width=3,
    )
    data = g.bytes(z)
    fused, model, result = apply(data, FoldPadIntoConv())
    assert ops(model) == ["CONV_2D", "MAX_POOL_2D"]
    assert result.fired() == {"FoldPadIntoConv": 2}
    assert_same_function(data, fused)


def test_pad_that_is_not_same_is_refused() -> None:
    g = G()
    x = g.input((1, 8, 8, 3))
    pads = g.const(np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32), "p")
    y = g.op("PAD", [x, pads], (1, 10, 10, 3))
    data = g.bytes(g.conv(y, 4, k=3, stride=2, padding="VALID"))
    _, model, result = apply(data, FoldPadIntoConv())
    assert ops(model) == ["PAD", "CONV_2D"]
    assert refusals(result, "FoldPadIntoConv") == [
        "the PAD adds [1, 1]/[1, 1] but SAME would add [0, 1]/[0, 1]"
    ]


def test_resnet_v2_tail_scale_moves_through_relu_and_mean_into_the_classifier() -> None:
    g = G()
    x = g.input((1, 5, 5, 4))
    h = g.binary("ADD", x, g.conv(x, 4, k=3))
    bn = g.binary("MUL", h, g.rand(4, low=0.3, high=2.0, name="gamma"))
    bn = g.binary("ADD", bn, g.rand(4, name="beta"), act="RELU")
    pooled = g.op("MEAN", [bn, g.const(np.array([1, 2]))], (1, 4), keep_dims=False)
    data = g.bytes(g.fc(pooled, 3))
    fused, model, result = apply(
        data,
        MoveScaleThroughRelu(),
        MoveScaleThroughMean(),
        FoldAffineIntoFollowing(),
        FoldBiasThroughAdd(),
    )
    assert ops(model) == ["CONV_2D", "ADD", "MEAN", "FULLY_CONNECTED"]
    assert model.main.ops[1].fused_activation == "RELU"
    assert result.fired() == {
        "MoveScaleThroughRelu": 1,
        "MoveScaleThroughMean": 1,
        "FoldAffineIntoFollowing": 1,
        "FoldBiasThroughAdd": 1,
    }
    assert_same_function(data, fused)


def test_scale_does_not_move_through_a_mean_over_channels() -> None:
    g = G()
    x = g.input((1, 5, 5, 4))
    scaled = g.binary("MUL", x, g.rand(4, name="s"))
    data = g.bytes(
        g.fc(g.op("MEAN", [scaled, g.const(np.array([3]))], (1, 5, 5), keep_dims=False), 2)
    )
    _, model, result = apply(data, MoveScaleThroughMean())
    assert ops(model) == ["MUL", "MEAN", "FULLY_CONNECTED"]
    assert refusals(result, "MoveScaleThroughMean") == ["the MEAN averages over the channel axis"]


def test_offset_after_a_residual_add_folds_into_the_branch_conv() -> None:
    g = G()
    x = g.input((1, 5, 5, 4))
    h = g.binary("ADD", g.conv(x, 4, k=3), x)
    data = g.bytes(g.binary("ADD", h, g.rand(4, name="c"), act="RELU6"))
    fused, model, _ = apply(data, FoldBiasThroughAdd())
    assert ops(model) == ["CONV_2D", "ADD"]
    assert model.main.ops[1].fused_activation == "RELU6"
    assert_same_function(data, fused)


def test_offset_refused_when_the_residual_sum_feeds_the_next_shortcut() -> None:
    g = G()
    x = g.input((1, 5, 5, 4))
    h = g.binary("ADD", g.conv(x, 4, k=3), x)
    data = g.bytes(g.binary("ADD", h, g.rand(4, name="c")), h)
    _, model, result = apply(data, FoldBiasThroughAdd())
    assert ops(model) == ["CONV_2D", "ADD", "ADD"]
    assert refusals(result, "FoldBiasThroughAdd") == [
        "the residual sum is read elsewhere (e.g. the next shortcut)"
    ]


def _flattening_fc(g: G, x, units: int, row: int):
    """An FC reading an NHWC tensor directly, with rows of `row` values (TFLite flattens x)."""
    rows = int(np.prod(x.shape)) // row
    w, b = g.rand(units, row, low=-0.3, high=0.3), g.rand(units, name="b")
    return g.op(
        "FULLY_CONNECTED",
        [x, w, b],
        (rows, units),
        fused_activation_function="NONE",
        keep_num_dims=False,
    )


@pytest.mark.parametrize("kind", ["MUL", "ADD", "SUB"])
def test_affine_folds_into_an_fc_that_flattens_a_rank4_tensor(kind: str) -> None:
    """Issue 11: this raised a raw ValueError (weights [5, 108] times a 3-vector)."""
    g = G()
    x = g.input((1, 6, 6, 3))
    y = g.binary(kind, x, g.rand(3, low=0.5, high=2.0, name="s"))
    data = g.bytes(_flattening_fc(g, y, 5, 6 * 6 * 3))
    fused, model, result = apply(data, FoldAffineIntoFollowing())
    assert ops(model) == ["FULLY_CONNECTED"]
    assert result.fired() == {"FoldAffineIntoFollowing": 1}
    assert_same_function(data, fused)


def test_affine_refused_when_fc_rows_do_not_line_up_with_channels() -> None:
    g = G()
    x = g.input((1, 2, 3, 4))
    y = g.binary("MUL", x, g.rand(4, name="s"))
    data = g.bytes(_flattening_fc(g, y, 5, 6))  # rows of 6 values over 4 channels
    _, model, result = apply(data, FoldAffineIntoFollowing())
    assert ops(model) == ["MUL", "FULLY_CONNECTED"]
    assert refusals(result, "FoldAffineIntoFollowing") == [
        "FULLY_CONNECTED rows of 6 values do not line up with the 4 channels"
    ]


def _heads(g: G, x, name: str):
    """A projection of x (1, 4, 8) split into 2 heads: FC -> RESHAPE -> TRANSPOSE (1, 2, 4, 4)."""
    w, b = g.rand(8, 8, name=name + "_w"), g.rand(8, name=name + "_b")
    p = g.op("FULLY_CONNECTED", [x, w, b], (1, 4, 8), keep_num_dims=True,
             fused_activation_function="NONE")  # fmt: skip
    r = g.op("RESHAPE", [p, g.const(np.array([1, 4, 2, 4]))], (1, 4, 2, 4), new_shape=[1, 4, 2, 4])
    return g.op("TRANSPOSE", [r, g.const(np.array([0, 2, 1, 3]))], (1, 2, 4, 4))


def test_attention_scale_folds_into_the_query_projection() -> None:
    g = G()
    x = g.input((1, 4, 8))
    q, k = _heads(g, x, "q"), _heads(g, x, "k")
    scores = g.op("BATCH_MATMUL", [q, k], (1, 2, 4, 4), adj_x=False, adj_y=True)
    data = g.bytes(g.op("SOFTMAX", [g.binary("MUL", scores, g.const(np.float32(0.5)))],
                        (1, 2, 4, 4), beta=1.0))  # fmt: skip
    fused, model, result = apply(data, FoldScaleIntoMatmulOperand())
    assert result.fired() == {"FoldScaleIntoMatmulOperand": 1}
    assert "MUL" not in ops(model)
    assert len(model.main.ops) == 8
    assert_same_function(data, fused)


def test_attention_scale_stays_when_no_operand_is_a_projection() -> None:
    g = G()
    q, k = g.input((1, 2, 4, 4)), g.input((1, 2, 4, 4), "k")
    scores = g.op("BATCH_MATMUL", [q, k], (1, 2, 4, 4), adj_x=False, adj_y=True)
    data = g.bytes(g.unary("TANH", g.binary("MUL", scores, g.const(np.float32(0.5)))))
    _, model, result = apply(data, FoldScaleIntoMatmulOperand())
    assert ops(model) == ["BATCH_MATMUL", "MUL", "TANH"]
    assert refusals(result, "FoldScaleIntoMatmulOperand") == [
        "no matmul operand comes from a projection through layout ops only"
    ]


def _reshape_fc(g: G, x, dtype_q=None):
    flat = g.graph.add_tensor("flat", (4, 8), x.dtype, quantization=dtype_q)
    g.graph.add_op("RESHAPE", [x, g.const(np.array([4, 8]))], [flat], {"new_shape": [4, 8]})
    return flat


def test_reshape_before_fully_connected_disappears() -> None:
    g = G()
    x = g.unary("TANH", g.input((1, 4, 2, 4)))
    data = g.bytes(g.fc(_reshape_fc(g, x), 3))
    fused, model, _ = apply(data, DropReshapeBeforeFullyConnected())
    assert ops(model) == ["TANH", "FULLY_CONNECTED"]
    assert_same_function(data, fused)


def test_reshape_before_fully_connected_disappears_in_int8() -> None:
    from tflfuse.ir import Quantization
    from tflfuse.verification import verify

    g = G()

    def q(scale: float, n: int = 1, axis: int = 0) -> Quantization:
        return Quantization(np.full(n, scale, np.float32), np.zeros(n, np.int64), axis=axis)

    x = g.graph.add_tensor("x", (1, 4, 2, 4), "INT8", quantization=q(0.05))
    g.graph.inputs.append(x)
    flat = _reshape_fc(g, x, q(0.05))
    w = g.graph.add_constant("w", g.rng.integers(-127, 128, (3, 8)).astype(np.int8), "INT8",
                             q(1 / 127, 3))  # fmt: skip
    b = g.graph.add_constant("b", np.arange(3, dtype=np.int32), "INT32", q(0.05 / 127, 3))
    out = g.graph.add_tensor("out", (4, 3), "INT8", quantization=q(0.1))
    g.graph.add_op("FULLY_CONNECTED", [flat, w, b], [out],
                   {"fused_activation_function": "NONE", "keep_num_dims": False})  # fmt: skip
    data = g.bytes(out)
    fused, model, _ = apply(data, DropReshapeBeforeFullyConnected())
    assert ops(model) == ["FULLY_CONNECTED"]
    agreement = verify.compare(data, fused, int_atol=0)
    assert agreement.ok and agreement.identical and agreement.varies


def test_reshape_before_fc_that_keeps_dims_stays() -> None:
    g = G()
    x = g.unary("TANH", g.input((1, 4, 2, 4)))
    flat = _reshape_fc(g, x)
    w, b = g.rand(3, 8), g.rand(3, name="b")
    data = g.bytes(g.op("FULLY_CONNECTED", [flat, w, b], (4, 3), keep_num_dims=True,
                        fused_activation_function="NONE"))  # fmt: skip
    _, model, result = apply(data, DropReshapeBeforeFullyConnected())
    assert ops(model) == ["TANH", "RESHAPE", "FULLY_CONNECTED"]
    assert refusals(result, "DropReshapeBeforeFullyConnected") == [
        "the FC keeps its input's dimensions"
    ]


def _int8_pad_conv(g: G, pad_value: int | None):
    from tflfuse.ir import Quantization

    def q(scale: float, zero: int = 0, n: int = 1) -> Quantization:
        return Quantization(np.full(n, scale, np.float32), np.full(n, zero, np.int64))

    x = g.graph.add_tensor("x", (1, 6, 6, 3), "INT8", quantization=q(0.05, -4))
    g.graph.inputs.append(x)
    padded = g.graph.add_tensor("padded", (1, 8, 8, 3), "INT8", quantization=q(0.05, -4))
    pads = g.const(np.array([[0, 0], [1, 1], [1, 1], [0, 0]]))
    if pad_value is None:
        g.graph.add_op("PAD", [x, pads], [padded])
    else:
        value = g.graph.add_constant("v", np.array([pad_value], np.int8), "INT8", q(0.05, -4))
        g.graph.add_op("PADV2", [x, pads, value], [padded])
    w = g.graph.add_constant("w", g.rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8),
                             "INT8", q(1 / 127, 0, 4))  # fmt: skip
    b = g.graph.add_constant("b", np.arange(4, dtype=np.int32), "INT32", q(0.05 / 127, 0, 4))
    out = g.graph.add_tensor("out", (1, 6, 6, 4), "INT8", quantization=q(0.1, 2))
    g.graph.add_op("CONV_2D", [padded, w, b], [out],
                   {"padding": "VALID", "stride_h": 1, "stride_w": 1,
                    "fused_activation_function": "NONE"})  # fmt: skip
    return out


@pytest.mark.parametrize("pad_value", [None, -4])
def test_int8_pad_folds_into_conv(pad_value: int | None) -> None:
    from tflfuse.verification import verify

    g = G()
    data = g.bytes(_int8_pad_conv(g, pad_value))
    fused, model, _ = apply(data, FoldPadIntoConv())
    assert ops(model) == ["CONV_2D"]
    agreement = verify.compare(data, fused, int_atol=0)
    assert agreement.ok and agreement.identical and agreement.varies


def test_int8_pad_with_another_value_is_refused() -> None:
    g = G()
    data = g.bytes(_int8_pad_conv(g, 10))
    _, model, result = apply(data, FoldPadIntoConv())
    assert ops(model) == ["PADV2", "CONV_2D"]
    assert refusals(result, "FoldPadIntoConv") == [
        "the PAD value is not the zero point (real zero)"
    ]
