"""SpellOutL2Normalization: EdgeNeXt's L2_NORMALIZATION of q and k over their tokens, written as
a row sum of squares by two 1 x 1 convolutions (sum, then copy into every element), RSQRT and a
MUL of two operands of one shape. Float, the same function up to round-off."""

from __future__ import annotations

import numpy as np
from rulekit import G, apply, assert_same_function, ops
from test_rules_property_int8 import observed_ranges, quantize_graph

from tflfuse.ir import flatbuffer
from tflfuse.targets.edgetpu.l2norm import SpellOutL2Normalization
from tflfuse.targets.edgetpu.predict import predict_edgetpu


def normalized(heads: int = 2, d: int = 4, tokens: int = 32) -> bytes:
    g = G()
    x = g.input((1, heads, d, tokens), "q")
    y = g.op("L2_NORMALIZATION", [g.binary("ADD", x, x)], x.shape, fused_activation_function="NONE")
    return g.bytes(g.binary("ADD", y, y))


def mapped(data: bytes) -> tuple[int, int]:
    """(ops predicted on the Edge TPU, on the CPU) in one segment, forms evidence included."""
    p = predict_edgetpu(flatbuffer.from_bytes(data))
    on = sum(o.status.startswith("Mapped") for o in p.ops)
    return on, len(p.ops) - on


def _int8(data: bytes) -> bytes:
    graph = flatbuffer.from_bytes(data).main
    return quantize_graph(graph, observed_ranges(graph))


def test_an_l2_normalization_is_spelled_in_shown_forms_and_maps() -> None:
    before = normalized()
    after, model, result = apply(before, SpellOutL2Normalization())
    assert result.fired() == {"SpellOutL2Normalization": 1}
    assert "L2_NORMALIZATION" not in ops(model)
    assert ops(model).count("CONV_2D") == 2 and ops(model).count("RSQRT") == 1
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)
    # int8 twins: the kernel is undecided (no compiled model shows it) and cuts; the spelling maps
    assert mapped(_int8(before)) == (1, 2)
    assert mapped(_int8(after)) == (len(ops(model)), 0)


def test_an_int8_l2_normalization_is_left_to_the_kernel() -> None:
    data = _int8(normalized())
    _, _, result = apply(data, SpellOutL2Normalization())
    assert result.fired() == {}
    assert np.isfinite(mapped(data)[0])
