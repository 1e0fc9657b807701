"""Horizontal rules: sibling convs/FCs on one input merged; sums of siblings merged."""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops, refusals

from tflfuse.rules.horizontal import HoistLayoutAboveSplit, MergeSiblingOps, MergeSiblingSum
from tflfuse.targets import target as target_named


def test_qkv_projections_become_one_fc_and_a_split() -> None:
    g = G()
    x = g.input((6, 16))
    q, k, v = g.fc(x, 8), g.fc(x, 8), g.fc(x, 8)
    data = g.bytes(q, k, v)
    fused, model, result = apply(data, MergeSiblingOps(target_named("xnnpack")))
    assert ops(model) == ["FULLY_CONNECTED", "SPLIT"]
    assert result.fired() == {"MergeSiblingOps": 1}
    assert_same_function(data, fused)


def test_inception_siblings_feeding_a_concat_lose_the_concat() -> None:
    g = G()
    x = g.input((1, 6, 6, 8))
    a, b, c = g.conv(x, 4, act="RELU"), g.conv(x, 6, act="RELU"), g.conv(x, 2, act="RELU")
    cat = g.op("CONCATENATION", [c, a, b], (1, 6, 6, 12), axis=3)
    data = g.bytes(cat)
    fused, model, _ = apply(data, MergeSiblingOps(target_named("xnnpack")))
    assert ops(model) == ["CONV_2D"]
    assert_same_function(data, fused)


def test_unequal_siblings_use_split_v_where_the_target_delegates_it() -> None:
    g = G()
    x = g.input((1, 6, 6, 8))
    outs = [g.conv(x, n) for n in (4, 6, 2)]
    data = g.bytes(*[g.unary("RELU", o) for o in outs])
    fused, model, _ = apply(data, MergeSiblingOps(target_named("gpu")))
    assert ops(model)[:2] == ["CONV_2D", "SPLIT_V"]
    assert_same_function(data, fused)
    _, model, result = apply(data, MergeSiblingOps(target_named("xnnpack")))
    assert ops(model).count("CONV_2D") == 3
    assert set(refusals(result, "MergeSiblingOps")) == {
        "xnnpack does not delegate SPLIT_V, which unequal parts would need"
    }


@pytest.mark.parametrize("sizes", [(4, 6, 2), (4, 4, 4)], ids=["split_v", "split"])
def test_the_edgetpu_keeps_siblings_whose_outputs_have_their_own_scales(sizes) -> None:
    """The Edge TPU runs int8 only: a merged output would carry one scale for every sibling
    (MediaPipe's hand landmark heads: ranges 220 and 0.2), and litert-quantizer has no int8
    SPLIT_V (the float split cut the graph: 68/68 mapped in stock, 59/71 fused)."""
    g = G()
    x = g.input((1, 6, 6, 8))
    data = g.bytes(*[g.unary("RELU", g.conv(x, n)) for n in sizes])
    _, model, result = apply(data, MergeSiblingOps(target_named("edgetpu")))
    assert ops(model).count("CONV_2D") == 3 and "SPLIT_V" not in ops(model)
    (reason,) = set(refusals(result, "MergeSiblingOps"))
    assert reason.startswith("the edgetpu computes in int8 with one scale per tensor")
    # a concatenation that joined them had one scale already: that merge still pays there
    g = G()
    x = g.input((1, 6, 6, 8))
    cat = g.op("CONCATENATION", [g.conv(x, n) for n in sizes], (1, 6, 6, sum(sizes)), axis=3)
    data = g.bytes(cat)
    fused, model, _ = apply(data, MergeSiblingOps(target_named("edgetpu")))
    assert ops(model) == ["CONV_2D"]
    assert_same_function(data, fused)


def test_two_siblings_without_concat_are_not_worth_a_split() -> None:
    g = G()
    x = g.input((4, 16))
    data = g.bytes(g.fc(x, 8), g.fc(x, 8))
    _, model, result = apply(data, MergeSiblingOps(target_named("xnnpack")))
    assert ops(model) == ["FULLY_CONNECTED", "FULLY_CONNECTED"]
    assert set(refusals(result, "MergeSiblingOps")) == {
        "2 ops would become 2 (merged op and a split): no fewer kernels"
    }


def test_merged_weights_must_fit_the_edgetpu_budget() -> None:
    g = G()
    x = g.input((1, 1024))
    outs = [g.fc(x, 1024) for _ in range(3)]  # 3 x 4 MiB of float weights
    data = g.bytes(*outs)
    _, model, result = apply(data, MergeSiblingOps(target_named("edgetpu")))
    assert ops(model).count("FULLY_CONNECTED") == 3
    assert set(refusals(result, "MergeSiblingOps")) == {
        "merged weights (12.0 MiB) exceed the edgetpu on-chip budget (8 MiB)"
    }


def test_siblings_with_different_kernels_are_refused() -> None:
    g = G()
    x = g.input((1, 6, 6, 4))
    data = g.bytes(g.conv(x, 4, k=1), g.conv(x, 4, k=3))
    _, _, result = apply(data, MergeSiblingOps(target_named("xnnpack")))
    assert set(refusals(result, "MergeSiblingOps")) == {
        "sibling CONV_2D ops differ in kernel, stride or activation"
    }


def test_sum_of_sibling_convs_becomes_one_conv_repvgg_style() -> None:
    g = G()
    x = g.input((1, 6, 6, 4))
    data = g.bytes(g.binary("ADD", g.conv(x, 5, k=3), g.conv(x, 5, k=1), act="RELU"))
    fused, model, _ = apply(data, MergeSiblingSum())
    assert ops(model) == ["CONV_2D"]
    assert model.main.ops[0].fused_activation == "RELU"
    assert_same_function(data, fused)


def test_sum_of_sibling_fcs_becomes_one_fc() -> None:
    g = G()
    x = g.input((3, 10))
    data = g.bytes(g.binary("ADD", g.fc(x, 4), g.fc(x, 4)))
    fused, model, _ = apply(data, MergeSiblingSum())
    assert ops(model) == ["FULLY_CONNECTED"]
    assert_same_function(data, fused)


def test_sum_refuses_valid_padding_with_different_kernels() -> None:
    g = G()
    x = g.input((1, 6, 6, 4))
    a = g.conv(x, 5, k=3, padding="SAME")
    b = g.conv(x, 5, k=1, padding="SAME")
    b.producer.options["padding"] = "VALID"
    data = g.bytes(g.binary("ADD", a, b))
    _, model, result = apply(data, MergeSiblingSum())
    assert ops(model) == ["CONV_2D", "CONV_2D", "ADD"]
    assert refusals(result, "MergeSiblingSum") == [
        "the addends differ in stride, padding or dilation"
    ]
    assert np.all(np.isfinite(a.producer.inputs[1].data))


def _qkv_heads(g: G, k_perm: list[int]) -> tuple:
    x = g.input((1, 4, 8))
    merged = g.op(
        "FULLY_CONNECTED",
        [x, g.rand(24, 8), g.rand(24, name="b")],
        (1, 4, 24),
        keep_num_dims=True,
        fused_activation_function="NONE",
    )
    parts = g.multi(
        "SPLIT", [g.const(np.array(2, np.int32)), merged], [(1, 4, 8)] * 3, num_splits=3
    )
    heads = []
    for part, perm in zip(parts, ([0, 2, 1, 3], k_perm, [0, 2, 1, 3])):
        r = g.op(
            "RESHAPE", [part, g.const(np.array([1, 4, 2, 4]))], (1, 4, 2, 4), new_shape=[1, 4, 2, 4]
        )
        shape = tuple((1, 4, 2, 4)[i] for i in perm)
        heads.append(g.op("TRANSPOSE", [r, g.const(np.array(perm))], shape))
    return heads


def test_head_layout_is_hoisted_above_the_qkv_split() -> None:
    g = G()
    q, kt, v = _qkv_heads(g, [0, 2, 3, 1])
    scores = g.op("BATCH_MATMUL", [q, kt], (1, 2, 4, 4), adj_x=False, adj_y=False)
    data = g.bytes(
        g.op("BATCH_MATMUL", [g.unary("TANH", scores), v], (1, 2, 4, 4), adj_x=False, adj_y=False)
    )
    fused, model, result = apply(data, HoistLayoutAboveSplit())
    assert ops(model) == [
        "FULLY_CONNECTED",
        "RESHAPE",
        "TRANSPOSE",
        "SPLIT",
        "BATCH_MATMUL",
        "TANH",
        "BATCH_MATMUL",
    ]
    assert model.main.ops[4].options["adj_y"] is True
    assert result.fired() == {"HoistLayoutAboveSplit": 1}
    assert_same_function(data, fused)


def test_hoisting_refuses_unrelated_transposes() -> None:
    g = G()
    heads = _qkv_heads(g, [0, 3, 1, 2])
    data = g.bytes(*heads)
    _, model, result = apply(data, HoistLayoutAboveSplit())
    assert ops(model).count("TRANSPOSE") == 3
    assert refusals(result, "HoistLayoutAboveSplit") == ["the parts are transposed differently"]


def test_head_layout_is_not_hoisted_into_a_shape_the_edgetpu_cannot_map() -> None:
    """The merged layout (4, 3, 2, 4) has four dimensions > 1; the Edge TPU maps at most three,
    so hoisting would move the CPU cut before the attention (seen on the zoo transformer)."""
    g = G()
    q, kt, v = _qkv_heads(g, [0, 2, 3, 1])
    scores = g.op("BATCH_MATMUL", [q, kt], (1, 2, 4, 4), adj_x=False, adj_y=False)
    data = g.bytes(
        g.op("BATCH_MATMUL", [g.unary("TANH", scores), v], (1, 2, 4, 4), adj_x=False, adj_y=False)
    )
    _, model, result = apply(data, HoistLayoutAboveSplit(target_named("edgetpu")))
    assert result.fired() == {}
    assert refusals(result, "HoistLayoutAboveSplit") == [
        "the merged head layout [4, 3, 2, 4] has more non-trivial dimensions than the edgetpu"
        " maps (3)"
    ]


def test_zoo_transformer_loses_over_30_percent_of_its_ops_and_keeps_its_function() -> None:
    """Issue 13: the stock float encoder (84 ops) through the XNNPACK pipeline: Q/K/V merged
    with their head layout, attention scale folded into Q, LayerNorm factored and squared."""
    pytest.importorskip("tensorflow")
    from rulekit import optimize

    from tflfuse.examples import zoo
    from tflfuse.ir import flatbuffer

    stock = zoo.to_tflite(zoo.build("transformer_encoder"))
    before = len(flatbuffer.from_bytes(stock).main.ops)
    fused, model, result = optimize(stock)
    assert before == 84
    assert len(model.main.ops) <= 0.7 * before
    assert {"SQUARED_DIFFERENCE", "NEG"}.isdisjoint(model.main.op_counts())
    assert result.fired()["FoldScaleIntoMatmulOperand"] == 2
    assert_same_function(stock, fused, atol=1e-5, rtol=1e-4)
