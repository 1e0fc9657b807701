"""Forms onnx2tf 2.6 exports that the compiler refuses, legalized into ops it maps: RELU_0_TO_1
(its HardSigmoid) in an int8 file as RELU, or RELU and MINIMUM, exactly. (Its NCHW MEANs over a
7x7 or 14x14 plane are `targets/edgetpu/heads.PadChannelsForMean`'s.) Stand-ins built in the
IR."""

from __future__ import annotations

import pytest
from rulekit import apply, ops
from test_rules_edgetpu import Q8, mapped

from tflfuse.targets.edgetpu.rules import LegalizeRelu0To1
from tflfuse.verification import verify


# -- RELU_0_TO_1 (an int8 file's; a float one is made int8 by int8_completion) -------------------
@pytest.mark.parametrize(
    ("scale", "zero", "expect"),
    [
        (1 / 255, -128, ["RELU"]),  # 1 is the type's top: RELU's clamp is the clamp at 1
        (0.006, -20, ["RELU"]),  # 1 is past the top (q(1) = 147)
        (0.01, -128, ["RELU", "MINIMUM"]),  # q(1) = -28: the clamp at 1 is a MINIMUM
        (0.005, -100, ["RELU", "MINIMUM"]),
    ],
)
def test_int8_relu_0_to_1_becomes_table_ops_exactly(scale: float, zero: int, expect) -> None:
    g = Q8()
    x = g.input((1, 6, 6, 8), 0.02, 3)
    y = g.op("RELU_0_TO_1", [x], x.shape, scale, zero)
    before = g.bytes(y)
    assert mapped(before) == (0, 1)
    after, model, result = apply(before, LegalizeRelu0To1())
    assert result.fired() == {"LegalizeRelu0To1": 1}
    assert ops(model) == expect
    assert mapped(after) == (len(expect), 0)
    agreement = verify.compare(before, after, int_atol=0, runs=4)
    assert agreement.ok and agreement.varies, agreement
