"""MoveClassTokenIntoAdd: a ViT's class token joined to the tokens, then the position embedding
added, written as a join with zeros (a form the compiler's table accepts) and one constant added.

Synthetic float graphs shaped like timm's ViT/DeiT export: tokens [1, N, C] computed,
CONCATENATION([cls [1, 1, C], tokens]) along the token axis, ADD of a [1, N + 1, C] constant.
"""

from __future__ import annotations

import numpy as np
from rulekit import G, apply, assert_same_function, ops, refusals
from test_edgetpu_heads import mapped
from test_rules_property_int8 import int8_twin

from tflfuse.targets.edgetpu.clstoken import MoveClassTokenIntoAdd

RULE = "MoveClassTokenIntoAdd"


def class_token(tokens: int = 16, width: int = 8, cls_zero: bool = False, read_twice: bool = False):
    g = G()
    x = g.input((1, tokens, width), "x")
    y = g.binary("ADD", x, x)  # the tokens, computed
    cls = np.zeros((1, 1, width), np.float32) if cls_zero else g.rng.uniform(-1, 1, (1, 1, width))
    joined = g.op("CONCATENATION", [g.const(cls, "cls"), y], (1, tokens + 1, width), axis=1,
                  fused_activation_function="NONE")  # fmt: skip
    z = g.binary("ADD", joined, g.rand(1, tokens + 1, width, name="pos"))
    outs = [g.binary("ADD", z, z)]
    if read_twice:
        outs.append(g.binary("MUL", joined, joined))
    return g.bytes(*outs)


def test_a_class_token_moves_into_the_added_constant_bit_exactly_and_the_join_maps() -> None:
    before = class_token()
    after, model, result = apply(before, MoveClassTokenIntoAdd())
    assert result.fired() == {RULE: 1}
    assert ops(model) == ["ADD", "CONCATENATION", "ADD", "ADD"]
    cat = next(op for op in model.main.ops if op.type == "CONCATENATION")
    assert not np.any(np.asarray(cat.inputs[0].data))  # the constant joined is zeros now
    assert_same_function(before, after, atol=0, rtol=0)
    # int8 twins: the source cuts at the join (its constant input is not all zeros); the result
    # maps whole
    assert mapped(int8_twin(before)) == (1, 3)
    assert mapped(int8_twin(after)) == (4, 0)


def test_a_join_read_elsewhere_or_already_zero_is_left_alone() -> None:
    _, model, result = apply(class_token(read_twice=True), MoveClassTokenIntoAdd())
    assert RULE not in result.fired()
    assert "read elsewhere" in " ".join(refusals(result, RULE))
    _, model, result = apply(class_token(cls_zero=True), MoveClassTokenIntoAdd())
    assert RULE not in result.fired() and ops(model).count("CONCATENATION") == 1
