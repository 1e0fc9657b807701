"""SpellOutL2Normalization: EdgeNeXt's L2_NORMALIZATION of q and k over their tokens, written as
a row sum of squares by two 1 x 1 convolutions (sum, then copy into every element), RSQRT and a
MUL of two operands of one shape. Float, the same function up to round-off."""

from __future__ import annotations

import numpy as np
from rulekit import G, apply, assert_same_function, edgetpu_placed, ops
from test_rules_property_int8 import int8_twin

from tflfuse.targets.edgetpu.l2norm import SpellOutL2Normalization


def normalized(heads: int = 2, d: int = 4, tokens: int = 32) -> bytes:
    g = G()
    x = g.input((1, heads, d, tokens), "q")
    y = g.op("L2_NORMALIZATION", [g.binary("ADD", x, x)], x.shape, fused_activation_function="NONE")
    return g.bytes(g.binary("ADD", y, y))


def test_an_l2_normalization_is_spelled_in_shown_forms_and_maps() -> None:
    before = normalized()
    after, model, result = apply(before, SpellOutL2Normalization())
    assert result.fired() == {"SpellOutL2Normalization": 1}
    assert "L2_NORMALIZATION" not in ops(model)
    assert ops(model).count("CONV_2D") == 2 and ops(model).count("RSQRT") == 1
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)
    # int8 twins: the kernel is undecided (no compiled model shows it) and cuts; the spelling maps
    assert edgetpu_placed(int8_twin(before)) == (1, 2)
    assert edgetpu_placed(int8_twin(after)) == (len(ops(model)), 0)


def test_an_int8_l2_normalization_is_left_to_the_kernel() -> None:
    data = int8_twin(normalized())
    _, _, result = apply(data, SpellOutL2Normalization())
    assert result.fired() == {}
    assert np.isfinite(edgetpu_placed(data)[0])
