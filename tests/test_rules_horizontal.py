"""Horizontal rules: sibling convs/FCs on one input merged; sums of siblings merged."""

from __future__ import annotations

import numpy as np
from rulekit import G, apply, assert_same_function, ops, refusals

from tflfuse.rules.horizontal import MergeSiblingOps, MergeSiblingSum


def test_qkv_projections_become_one_fc_and_a_split() -> None:
    g = G()
    x = g.input((6, 16))
    q, k, v = g.fc(x, 8), g.fc(x, 8), g.fc(x, 8)
    data = g.bytes(q, k, v)
    fused, model, result = apply(data, MergeSiblingOps("xnnpack"))
    assert ops(model) == ["FULLY_CONNECTED", "SPLIT"]
    assert result.fired() == {"MergeSiblingOps": 1}
    assert_same_function(data, fused)


def test_inception_siblings_feeding_a_concat_lose_the_concat() -> None:
    g = G()
    x = g.input((1, 6, 6, 8))
    a, b, c = g.conv(x, 4, act="RELU"), g.conv(x, 6, act="RELU"), g.conv(x, 2, act="RELU")
    cat = g.op("CONCATENATION", [c, a, b], (1, 6, 6, 12), axis=3)
    data = g.bytes(cat)
    fused, model, _ = apply(data, MergeSiblingOps("xnnpack"))
    assert ops(model) == ["CONV_2D"]
    assert_same_function(data, fused)


def test_unequal_siblings_use_split_v_where_the_target_delegates_it() -> None:
    g = G()
    x = g.input((1, 6, 6, 8))
    outs = [g.conv(x, n) for n in (4, 6, 2)]
    data = g.bytes(*[g.unary("RELU", o) for o in outs])
    fused, model, _ = apply(data, MergeSiblingOps("edgetpu"))
    assert ops(model)[:2] == ["CONV_2D", "SPLIT_V"]
    assert_same_function(data, fused)
    _, model, result = apply(data, MergeSiblingOps("xnnpack"))
    assert ops(model).count("CONV_2D") == 3
    assert set(refusals(result, "MergeSiblingOps")) == {
        "xnnpack does not delegate SPLIT_V, which unequal parts would need"
    }


def test_two_siblings_without_concat_are_not_worth_a_split() -> None:
    g = G()
    x = g.input((4, 16))
    data = g.bytes(g.fc(x, 8), g.fc(x, 8))
    _, model, result = apply(data, MergeSiblingOps("xnnpack"))
    assert ops(model) == ["FULLY_CONNECTED", "FULLY_CONNECTED"]
    assert set(refusals(result, "MergeSiblingOps")) == {
        "2 ops would become 2 (merged op and a split): no fewer kernels"
    }


def test_merged_weights_must_fit_the_edgetpu_budget() -> None:
    g = G()
    x = g.input((1, 1024))
    outs = [g.fc(x, 1024) for _ in range(3)]  # 3 x 4 MiB of float weights
    data = g.bytes(*outs)
    _, model, result = apply(data, MergeSiblingOps("edgetpu"))
    assert ops(model).count("FULLY_CONNECTED") == 3
    assert set(refusals(result, "MergeSiblingOps")) == {
        "merged weights (12.0 MiB) exceed the edgetpu on-chip budget (8 MiB)"
    }


def test_siblings_with_different_kernels_are_refused() -> None:
    g = G()
    x = g.input((1, 6, 6, 4))
    data = g.bytes(g.conv(x, 4, k=1), g.conv(x, 4, k=3))
    _, _, result = apply(data, MergeSiblingOps("xnnpack"))
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
