"""Exporter rules: what litert-torch / onnx2tf leave behind, on tiny inline graphs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SHARED
from rulekit import G, apply, assert_same_function, ops, optimize, refusals

from tflfuse.convert.rule_sets import pipeline
from tflfuse.ir import Quantization, Tensor
from tflfuse.rules.algebra import CollapseReshapeChain, RecognizeHardSwish
from tflfuse.rules.exporter import (
    BatchMatmulToFullyConnected,
    CanonicalizeLayoutChain,
    FoldPadByWidenedKernel,
    LegalizePadV2BeforeMaxPool,
    RecognizeClamp,
    ShortenLayerNorm,
    SinkReshapeBelowScalarOp,
    SliceBeforeLayout,
    SoftmaxThroughReshape,
)
from tflfuse.targets import target as target_named
from tflfuse.targets.edgetpu.rules import DropHalfPixelCentersFromNearestResize
from tflfuse.verification import verify

LOWEST = float(np.finfo(np.float32).min)


def loud(result, rule: str) -> list[str]:
    """The refusals --explain shows for `rule` (not the quiet not-applicable ones)."""
    return [r.reason for r in result.refusals if r.rule == rule]


def _ints(g: G, values) -> Tensor:
    return g.const(np.asarray(values, np.int32))


def _reshape(g: G, x: Tensor, shape) -> Tensor:
    return g.op("RESHAPE", [x, _ints(g, shape)], shape, new_shape=list(shape))


def _transpose(g: G, x: Tensor, perm) -> Tensor:
    return g.op("TRANSPOSE", [x, _ints(g, perm)], [x.shape[p] for p in perm])


# -- LayerNorm -----------------------------------------------------------------------------------
def _litert_layer_norm(g: G, x: Tensor) -> tuple[Tensor, Tensor]:
    """nn.LayerNorm as litert-torch writes it; returns (output, the first mean)."""
    rows = x.shape[1]
    mean = g.op("MEAN", [x, _ints(g, [0, 2])], (rows,), keep_dims=False)
    sq = g.binary("SQUARED_DIFFERENCE", x, _reshape(g, mean, (1, rows, 1)))
    var = g.op("MEAN", [sq, _ints(g, [0, 2])], (rows,), keep_dims=False)
    r = g.unary("RSQRT", g.binary("ADD", var, g.const(np.float32(1e-5))))
    neg = g.binary("SUB", g.const(np.float32(0.0)), g.binary("MUL", r, mean))
    scaled = g.binary("MUL", x, _reshape(g, r, (1, rows, 1)))
    return g.binary("ADD", scaled, _reshape(g, neg, (1, rows, 1))), mean


def test_layer_norm_is_shortened_to_seven_ops() -> None:
    g = G()
    x = g.op(
        "FULLY_CONNECTED", [g.input((1, 6, 8)), g.rand(8, 8), None], (1, 6, 8), keep_num_dims=True
    )
    y, _ = _litert_layer_norm(g, x)
    data = g.bytes(g.fc(y, 3))
    fused, model, result = apply(data, ShortenLayerNorm())
    assert ops(model) == [
        "FULLY_CONNECTED",
        "MEAN",
        "SQUARED_DIFFERENCE",
        "MEAN",
        "ADD",
        "RSQRT",
        "SUB",
        "MUL",
        "FULLY_CONNECTED",
    ]
    assert result.fired() == {"ShortenLayerNorm": 1}
    assert_same_function(data, fused, atol=1e-5, rtol=1e-4)


def test_layer_norm_kept_when_its_mean_is_read_elsewhere() -> None:
    g = G()
    x = g.fc(g.input((6, 8)), 8)
    x = _reshape(g, x, (1, 6, 8))
    y, mean = _litert_layer_norm(g, x)
    data = g.bytes(y, g.unary("RELU", mean))
    _, model, result = apply(data, ShortenLayerNorm())
    assert ops(model).count("RSQRT") == 1 and len(ops(model)) == 15
    assert loud(result, "ShortenLayerNorm") == [
        "a LayerNorm intermediate (mean or variance) is read elsewhere"
    ]


# -- layout chains -------------------------------------------------------------------------------
def _k_transposed(g: G, k: Tensor) -> Tensor:
    """litert-torch's K^T for 2 heads of 4: [1,6,1,8] -> [2,4,6] in five layout ops."""
    t = _transpose(g, _reshape(g, k, (6, 2, 4)), (1, 0, 2))
    t = _transpose(g, _reshape(g, t, (1, 2, 6, 4)), (0, 1, 3, 2))
    return _reshape(g, t, (2, 4, 6))


def test_layout_chain_becomes_one_transpose() -> None:
    g = G()
    k = g.unary("RELU", g.input((1, 6, 1, 8)))
    data = g.bytes(g.unary("TANH", _k_transposed(g, k)))
    fused, model, result = apply(data, CanonicalizeLayoutChain())
    assert ops(model) == ["RELU", "RESHAPE", "TRANSPOSE", "TANH"]
    assert_same_function(data, fused, atol=0, rtol=0)


def test_layout_chain_with_an_outer_dimension_is_rewritten_for_the_edgetpu() -> None:
    """onnx2tf's heads on a batch axis: TRANSPOSE [1, 2, 32, 100] -> [2, 100, 1, 32] (a
    dimension > 1 outside the 3 innermost, which the Edge TPU does not map) then RESHAPE to
    [2, 100, 32]. As short as the plan, the chain is still rewritten where the target limits
    the dimensions, into tensors whose dimensions > 1 are all inner; left alone without it."""
    g = G()
    x = g.unary("RELU", g.input((1, 2, 32, 100)))
    data = g.bytes(g.unary("TANH", _reshape(g, _transpose(g, x, (1, 3, 0, 2)), (2, 100, 32))))
    _, plain, result = apply(data, CanonicalizeLayoutChain())
    assert result.fired() == {}
    fused, model, result = apply(data, CanonicalizeLayoutChain(max_nontrivial_dims=3))
    assert result.fired() == {"CanonicalizeLayoutChain": 1}
    for t in model.main.tensors:
        assert all(d == 1 for d in t.shape[:-3]), (t.name, t.shape)
    assert_same_function(data, fused, atol=0, rtol=0)


def test_layout_chain_int8_moves_the_same_bytes() -> None:
    g = G()
    q = Quantization(np.array([0.05], np.float32), np.array([3]))

    def int8(name, shape):
        return g.graph.add_tensor(name, shape, "INT8", quantization=q)

    x = int8("x", (1, 6, 1, 8))
    g.graph.inputs.append(x)
    current = x
    for kind, arg, shape in (
        ("RESHAPE", (6, 2, 4), (6, 2, 4)),
        ("TRANSPOSE", (1, 0, 2), (2, 6, 4)),
        ("RESHAPE", (1, 2, 6, 4), (1, 2, 6, 4)),
        ("TRANSPOSE", (0, 1, 3, 2), (1, 2, 4, 6)),
        ("RESHAPE", (2, 4, 6), (2, 4, 6)),
    ):
        out = int8(kind.lower(), shape)
        g.graph.add_op(kind, [current, _ints(g, arg)], [out])
        current = out
    data = g.bytes(current)
    fused, model, _ = apply(data, CanonicalizeLayoutChain())
    assert ops(model) == ["RESHAPE", "TRANSPOSE"]
    assert CanonicalizeLayoutChain.int8_error_steps == 0
    agreement = verify.compare(data, fused, int_atol=0)
    assert agreement.ok and agreement.identical and agreement.varies


def test_layout_chain_refused_when_no_single_transpose_does_it() -> None:
    g = G()
    x = g.unary("RELU", g.input((2, 3)))
    y = _transpose(g, _reshape(g, _transpose(g, x, (1, 0)), (2, 3)), (1, 0))
    data = g.bytes(g.unary("TANH", y))
    _, model, result = apply(data, CanonicalizeLayoutChain())
    assert ops(model) == ["RELU", "TRANSPOSE", "RESHAPE", "TRANSPOSE", "TANH"]
    assert loud(result, "CanonicalizeLayoutChain") == [
        "the chain's element order is not one slice and one transpose"
    ]


def test_qkv_split_slices_the_projection_first() -> None:
    g = G()
    x = g.input((1, 6, 8))
    qkv = g.op("FULLY_CONNECTED", [x, g.rand(24, 8), None], (1, 6, 24), keep_num_dims=True)
    t = _transpose(g, _reshape(g, qkv, (6, 1, 3, 8)), (2, 0, 1, 3))
    heads = []
    for i in range(3):
        part = g.op("SLICE", [t, _ints(g, [i, 0, 0, 0]), _ints(g, [1, 6, 1, 8])], (1, 6, 1, 8))
        if i < 2:  # q and k are scaled, as torch's attention does
            part = g.binary("MUL", part, g.const(np.float32(0.5)))
        if i == 1:
            heads.append(_k_transposed(g, part))
        else:
            heads.append(_transpose(g, _reshape(g, part, (6, 2, 4)), (1, 0, 2)))
    scores = g.op("BATCH_MATMUL", [heads[0], heads[1]], (2, 6, 6), adj_x=False, adj_y=False)
    data = g.bytes(g.op("BATCH_MATMUL", [scores, heads[2]], (2, 6, 4), adj_x=False, adj_y=False))
    before = len(ops(g.model(*g.graph.outputs)))
    rules = (SliceBeforeLayout(), SinkReshapeBelowScalarOp(), CanonicalizeLayoutChain())
    fused, model, result = apply(data, *rules, CollapseReshapeChain())
    assert before == 19
    assert ops(model).count("TRANSPOSE") == 3 and "SLICE" in ops(model)
    assert len(ops(model)) == 14
    assert set(result.fired()) >= {"SliceBeforeLayout", "SinkReshapeBelowScalarOp"}
    assert_same_function(data, fused, atol=1e-6, rtol=1e-5)


def test_slices_that_need_a_transpose_are_refused() -> None:
    g = G()
    t = _transpose(g, g.unary("RELU", g.input((4, 6))), (1, 0))
    top = g.op("SLICE", [t, _ints(g, [0, 0]), _ints(g, [3, 4])], (3, 4))
    data = g.bytes(g.unary("TANH", top))
    _, model, result = apply(data, SliceBeforeLayout())
    assert ops(model) == ["RELU", "TRANSPOSE", "SLICE", "TANH"]
    assert loud(result, "SliceBeforeLayout") == ["a slice is not one block of the layout's input"]


def test_reshape_not_sunk_when_read_elsewhere() -> None:
    g = G()
    r = _reshape(g, g.unary("RELU", g.input((1, 6, 8))), (6, 8))
    scaled = g.binary("MUL", r, g.const(np.float32(0.5)))
    data = g.bytes(_transpose(g, scaled, (1, 0)), g.unary("TANH", r))
    _, model, result = apply(data, SinkReshapeBelowScalarOp())
    assert ops(model) == ["RELU", "RESHAPE", "MUL", "TRANSPOSE", "TANH"]
    assert loud(result, "SinkReshapeBelowScalarOp") == ["the RESHAPE is read elsewhere"]


def test_softmax_sheds_its_reshape_sandwich() -> None:
    g = G()
    x = g.unary("RELU", g.input((2, 5, 5)))
    s = g.op("SOFTMAX", [_reshape(g, x, (1, 2, 5, 5))], (1, 2, 5, 5), beta=1.0)
    data = g.bytes(g.unary("TANH", _reshape(g, s, (2, 5, 5))))
    fused, model, _ = apply(data, SoftmaxThroughReshape())
    assert ops(model) == ["RELU", "SOFTMAX", "TANH"]
    assert_same_function(data, fused, atol=0, rtol=0)


def test_softmax_reshape_over_its_axis_is_refused() -> None:
    g = G()
    x = g.unary("RELU", g.input((2, 5, 5)))
    s = g.op("SOFTMAX", [_reshape(g, x, (2, 25))], (2, 25), beta=1.0)
    data = g.bytes(g.unary("TANH", _reshape(g, s, (2, 5, 5))))
    _, model, result = apply(data, SoftmaxThroughReshape())
    assert ops(model) == ["RELU", "RESHAPE", "SOFTMAX", "RESHAPE", "TANH"]
    assert loud(result, "SoftmaxThroughReshape") == ["the reshape changes the softmax axis"]


# -- clamps --------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["min_max", "max_min", "min_relu"])
def test_clamp_becomes_relu6_and_fuses(form: str) -> None:
    g = G()
    x = g.conv(g.input((1, 5, 5, 3)), 4)
    six, zero = g.const(np.float32(6.0)), g.const(np.float32(0.0))
    if form == "min_max":
        y = g.binary("MINIMUM", g.binary("MAXIMUM", x, zero), six)
    elif form == "max_min":
        y = g.binary("MAXIMUM", zero, g.binary("MINIMUM", x, six))
    else:
        y = g.binary("MINIMUM", g.unary("RELU", x), six)
    data = g.bytes(y)
    fused, model, _ = apply(data, RecognizeClamp())
    assert ops(model) == ["CONV_2D", "RELU6"]
    assert_same_function(data, fused, atol=0, rtol=0)
    _, model, _ = apply(data, *pipeline(2, target_named("xnnpack")))
    assert ops(model) == ["CONV_2D"] and model.main.ops[0].fused_activation == "RELU6"


def test_clamped_hard_swish_is_recognized_and_legalized_for_edgetpu() -> None:
    g = G()
    x = g.conv(g.input((1, 5, 5, 3)), 4)
    shifted = g.binary("ADD", x, g.const(np.float32(3.0)))
    clamp = g.binary(
        "MINIMUM", g.binary("MAXIMUM", shifted, g.const(np.float32(0.0))), g.const(np.float32(6.0))
    )
    data = g.bytes(g.binary("DIV", g.binary("MUL", x, clamp), g.const(np.float32(6.0))))
    fused, model, _ = apply(data, RecognizeClamp(), RecognizeHardSwish())
    assert ops(model) == ["CONV_2D", "HARD_SWISH"]
    assert_same_function(data, fused)
    fused, model, _ = apply(data, *pipeline(2, target_named("edgetpu")))
    assert "MINIMUM" not in ops(model) and "MAXIMUM" not in ops(model)
    assert "HARD_SWISH" not in ops(model)
    assert any(op.type == "ADD" and op.fused_activation == "RELU6" for op in model.main.ops)
    assert_same_function(data, fused)


def test_clamp_to_other_bounds_is_not_an_activation() -> None:
    g = G()
    x = g.conv(g.input((1, 5, 5, 3)), 4)
    y = g.binary(
        "MINIMUM", g.binary("MAXIMUM", x, g.const(np.float32(0.0))), g.const(np.float32(5.0))
    )
    _, model, result = apply(g.bytes(y), RecognizeClamp())
    assert ops(model) == ["CONV_2D", "RELU", "MINIMUM"]  # max(x, 0) alone is a RELU
    assert "not a RELU-family clamp" in refusals(result, "RecognizeClamp")


# -- PADV2 before a max pool ---------------------------------------------------------------------
def _padded_pool(g: G, x: Tensor, pads, value: float) -> Tensor:
    n, h, w, c = x.shape
    pad = g.op(
        "PADV2",
        [x, _ints(g, [[0, 0], pads, pads, [0, 0]]), g.const(np.float32(value))],
        (n, h + sum(pads), w + sum(pads), c),
    )
    oh = (h + sum(pads) - 3) // 2 + 1
    return g.op(
        "MAX_POOL_2D",
        [pad],
        (n, oh, oh, c),
        padding="VALID",
        stride_h=2,
        stride_w=2,
        filter_height=3,
        filter_width=3,
        fused_activation_function="NONE",
    )


@pytest.mark.parametrize(
    ("size", "pads", "after"),
    [(9, [1, 1], ["CONV_2D", "MAX_POOL_2D"]), (8, [1, 1], ["CONV_2D", "PAD", "MAX_POOL_2D"])],
)
def test_padv2_before_max_pool_is_legalized(size: int, pads, after) -> None:
    g = G()
    x = g.conv(g.input((1, size, size, 3)), 4, act="RELU")
    data = g.bytes(g.unary("TANH", _padded_pool(g, x, pads, LOWEST)))
    fused, model, _ = apply(data, LegalizePadV2BeforeMaxPool())
    assert ops(model) == [*after, "TANH"]
    assert_same_function(data, fused, atol=0, rtol=0)
    agreement = verify.compare(data, fused, delegate="xnnpack", atol=0, rtol=0)
    assert agreement.ok and agreement.varies


def test_padv2_int8_with_zero_point_at_its_minimum_becomes_pad() -> None:
    g = G()
    q = Quantization(np.array([0.02], np.float32), np.array([-128]))
    x = g.graph.add_tensor("x", (1, 8, 8, 3), "INT8", quantization=q)
    g.graph.inputs.append(x)
    padded = g.graph.add_tensor("padded", (1, 10, 10, 3), "INT8", quantization=q)
    value = g.graph.add_constant("v", np.array(-128, np.int8), "INT8", quantization=q)
    pads = _ints(g, [[0, 0], [1, 1], [1, 1], [0, 0]])
    g.graph.add_op("PADV2", [x, pads, value], [padded])
    y = g.graph.add_tensor("y", (1, 4, 4, 3), "INT8", quantization=q)
    g.graph.add_op(
        "MAX_POOL_2D",
        [padded],
        [y],
        {
            "padding": "VALID",
            "stride_h": 2,
            "stride_w": 2,
            "filter_height": 3,
            "filter_width": 3,
            "fused_activation_function": "NONE",
        },
    )
    data = g.bytes(y)
    fused, model, _ = apply(data, LegalizePadV2BeforeMaxPool())
    assert ops(model) == ["PAD", "MAX_POOL_2D"]
    assert LegalizePadV2BeforeMaxPool.int8_error_steps == 0
    agreement = verify.compare(data, fused, int_atol=0)
    assert agreement.ok and agreement.identical and agreement.varies


def test_padv2_over_negative_values_is_kept() -> None:
    g = G()
    x = g.conv(g.input((1, 8, 8, 3)), 4)
    data = g.bytes(_padded_pool(g, x, [1, 1], LOWEST))
    _, model, result = apply(data, LegalizePadV2BeforeMaxPool())
    assert ops(model) == ["CONV_2D", "PADV2", "MAX_POOL_2D"]
    assert loud(result, "LegalizePadV2BeforeMaxPool") == [
        "the PADV2 pads with -3.40282e+38 and the input may be negative: zeros could win"
    ]


# -- BATCH_MATMUL with constant weights ----------------------------------------------------------
@pytest.mark.parametrize("adj_y", [False, True])
def test_constant_batch_matmul_becomes_fully_connected(adj_y: bool) -> None:
    g = G()
    x = g.unary("RELU", g.input((1, 5, 6)))
    w = g.rand(4, 6) if adj_y else g.rand(6, 4)
    data = g.bytes(g.op("BATCH_MATMUL", [x, w], (1, 5, 4), adj_x=False, adj_y=adj_y))
    fused, model, _ = apply(data, BatchMatmulToFullyConnected())
    assert ops(model) == ["RELU", "FULLY_CONNECTED"]
    assert list(model.main.ops[1].inputs[1].shape) == [4, 6]
    assert_same_function(data, fused, atol=1e-6, rtol=1e-5)


def test_batch_matmul_with_constant_on_the_left_is_kept() -> None:
    g = G()
    x = g.unary("RELU", g.input((1, 6, 5)))
    data = g.bytes(g.op("BATCH_MATMUL", [g.rand(4, 6), x], (1, 4, 5), adj_x=False, adj_y=False))
    _, model, result = apply(data, BatchMatmulToFullyConnected())
    assert ops(model) == ["RELU", "BATCH_MATMUL"]
    assert loud(result, "BatchMatmulToFullyConnected") == [
        "the constant is the left operand: FULLY_CONNECTED takes it on the right"
    ]


# -- int8 forms of the byte-moving rules (int8_error_steps = 0: bit for bit) ---------------------
Q8 = Quantization(np.array([0.05], np.float32), np.array([3]))


def _int8_op(g: G, type: str, inputs, shape, q: Quantization = Q8, **options) -> Tensor:
    out = g.graph.add_tensor(type.lower(), shape, "INT8", quantization=q)
    g.graph.add_op(type, inputs, [out], options)
    return out


def _int8_input(g: G, shape) -> Tensor:
    x = g.graph.add_tensor("x", shape, "INT8", quantization=Q8)
    g.graph.inputs.append(x)
    return x


def _assert_bit_exact(data: bytes, fused: bytes) -> None:
    agreement = verify.compare(data, fused, int_atol=0)
    assert agreement.ok and agreement.identical and agreement.varies


def test_int8_qkv_split_slices_first() -> None:
    g = G()
    x = _int8_input(g, (1, 6, 24))
    r = _int8_op(g, "RESHAPE", [x, _ints(g, [6, 1, 3, 8])], (6, 1, 3, 8))
    t = _int8_op(g, "TRANSPOSE", [r, _ints(g, [2, 0, 1, 3])], (3, 6, 1, 8))
    outs = []
    for i in range(3):
        part = _int8_op(
            g, "SLICE", [t, _ints(g, [i, 0, 0, 0]), _ints(g, [1, 6, 1, 8])], (1, 6, 1, 8)
        )
        outs.append(_int8_op(g, "RESHAPE", [part, _ints(g, [6, 8])], (6, 8)))
    data = g.bytes(*outs)
    fused, model, _ = apply(data, SliceBeforeLayout(), CollapseReshapeChain())
    assert sorted(ops(model)) == ["RESHAPE"] * 3 + ["SLICE"] * 3
    assert SliceBeforeLayout.int8_error_steps == 0
    _assert_bit_exact(data, fused)


def test_int8_softmax_sheds_its_reshapes() -> None:
    g = G()
    x = _int8_input(g, (2, 5, 5))
    soft_q = Quantization(np.array([1 / 256], np.float32), np.array([-128]))
    r = _int8_op(g, "RESHAPE", [x, _ints(g, [1, 2, 5, 5])], (1, 2, 5, 5))
    s = _int8_op(g, "SOFTMAX", [r], (1, 2, 5, 5), soft_q, beta=1.0)
    data = g.bytes(_int8_op(g, "RESHAPE", [s, _ints(g, [2, 5, 5])], (2, 5, 5), soft_q))
    fused, model, _ = apply(data, SoftmaxThroughReshape())
    assert ops(model) == ["SOFTMAX"]
    assert SoftmaxThroughReshape.int8_error_steps == 0
    _assert_bit_exact(data, fused)


def test_layer_norm_with_the_mean_broadcast_along_the_wrong_axis_is_not_one() -> None:
    g = G()
    x = g.op(
        "FULLY_CONNECTED", [g.input((1, 8, 8)), g.rand(8, 8), None], (1, 8, 8), keep_num_dims=True
    )
    mean = g.op("MEAN", [x, _ints(g, [0, 2])], (8,), keep_dims=False)
    sq = g.binary("SQUARED_DIFFERENCE", x, _reshape(g, mean, (1, 1, 8)))  # along the columns
    var = g.op("MEAN", [sq, _ints(g, [0, 2])], (8,), keep_dims=False)
    r = g.unary("RSQRT", g.binary("ADD", var, g.const(np.float32(1e-5))))
    neg = g.binary("SUB", g.const(np.float32(0.0)), g.binary("MUL", r, mean))
    y = g.binary("ADD", g.binary("MUL", x, _reshape(g, r, (1, 8, 1))), _reshape(g, neg, (1, 8, 1)))
    _, model, result = apply(g.bytes(y), ShortenLayerNorm())
    assert "SQUARED_DIFFERENCE" in ops(model) and len(ops(model)) == 13
    assert "not a LayerNorm written out" in refusals(result, "ShortenLayerNorm")


def test_padv2_read_by_another_op_keeps_its_value() -> None:
    g = G()
    x = g.conv(g.input((1, 8, 8, 3)), 4, act="RELU")
    pool = _padded_pool(g, x, [1, 1], LOWEST)
    padded = pool.producer.inputs[0]
    data = g.bytes(pool, g.unary("TANH", padded))
    _, model, result = apply(data, LegalizePadV2BeforeMaxPool())
    assert "PADV2" in ops(model) and "PAD" not in ops(model)
    assert loud(result, "LegalizePadV2BeforeMaxPool") == [
        "the PADV2 output is also read by an op that needs its value"
    ]


# -- the litert-torch exports in ../shared -------------------------------------------------------
PYTORCH = SHARED / "models" / "pytorch"


@pytest.mark.skipif(not PYTORCH.is_dir(), reason="../shared/models/pytorch is absent")
@pytest.mark.parametrize(("target", "after"), [("xnnpack", 39)])
def test_litert_torch_encoder_loses_a_third_of_its_ops(target: str, after: int) -> None:
    # edgetpu: the attention products are legalized there (tests/test_edgetpu_attention.py)
    data = (PYTORCH / "encoder.tflite").read_bytes()
    fused, model, result = optimize(data, target=target)
    fired = result.fired()
    assert fired["ShortenLayerNorm"] == 2 and fired["SliceBeforeLayout"] == 1
    assert len(ops(model)) == after  # from 57
    # off the Edge TPU, SquareExistingDifference squares the difference the LayerNorm computes
    assert ("SQUARED_DIFFERENCE" in ops(model)) == (target == "edgetpu")
    assert ops(model).count("TRANSPOSE") == 4
    assert_same_function(data, fused, atol=1e-4, rtol=1e-3)


@pytest.mark.skipif(not PYTORCH.is_dir(), reason="../shared/models/pytorch is absent")
def test_litert_torch_yolo_upsampling_becomes_mappable() -> None:
    data = (PYTORCH / "yolov8n.tflite").read_bytes()
    _, model, result = apply(data, DropHalfPixelCentersFromNearestResize())
    assert result.fired() == {"DropHalfPixelCentersFromNearestResize": 2}
    resizes = model.main.ops_of("RESIZE_NEAREST_NEIGHBOR")
    assert [op.options["half_pixel_centers"] for op in resizes] == [False, False]


# -- PAD before a strided depthwise conv ---------------------------------------------------------
def _padded_dw(g: G, x: Tensor, type: str = "DEPTHWISE_CONV_2D") -> Tensor:
    n, h, w, c = x.shape
    pad = g.op("PAD", [x, _ints(g, [[0, 0], [1, 1], [1, 1], [0, 0]])], (n, h + 2, w + 2, c))
    o = (h + 2 - 3) // 2 + 1
    dw = type == "DEPTHWISE_CONV_2D"
    weights = g.rand(1, 3, 3, c) if dw else g.rand(c, 3, 3, c)
    extra = {"depth_multiplier": 1} if dw else {}
    return g.op(
        type,
        [pad, weights, g.rand(c, name="b")],
        (n, o, o, c),
        padding="VALID",
        stride_h=2,
        stride_w=2,
        fused_activation_function="RELU6",
        **extra,
    )


def test_pytorch_pad_before_strided_depthwise_becomes_a_wider_same_kernel() -> None:
    g = G()
    x = g.conv(g.input((1, 8, 8, 4)), 4, act="RELU6")
    data = g.bytes(g.conv(_padded_dw(g, x), 4))
    fused, model, _ = apply(data, FoldPadByWidenedKernel())
    assert ops(model) == ["CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D"]
    dw = model.main.ops[1]
    assert dw.options["padding"] == "SAME" and list(dw.inputs[1].shape) == [1, 4, 4, 4]
    assert np.all(dw.inputs[1].data[:, 3, :, :] == 0) and np.all(dw.inputs[1].data[:, :, 3, :] == 0)
    assert_same_function(data, fused, atol=1e-6, rtol=1e-5)
    for target in ("xnnpack", "cpu", "edgetpu"):  # measured slower: in no pipeline
        _, model, result = apply(data, *pipeline(2, target_named(target)))
        assert "PAD" in ops(model) and "FoldPadByWidenedKernel" not in result.fired()


def test_widened_kernel_refused_for_a_full_conv() -> None:
    g = G()
    x = g.conv(g.input((1, 8, 8, 4)), 4, act="RELU6")
    _, model, result = apply(g.bytes(_padded_dw(g, x, "CONV_2D")), FoldPadByWidenedKernel())
    assert ops(model) == ["CONV_2D", "PAD", "CONV_2D"]
    assert loud(result, "FoldPadByWidenedKernel") == [
        "a CONV_2D with a widened kernel does more multiply-adds than the PAD costs"
    ]
