"""The rewrite engine: pattern matching, the pass manager, refusals, cleanup, and the first rule."""

from __future__ import annotations

import numpy as np
import pytest
from irgraphs import add, conv, depthwise, fully_connected, model_of, op_types, to_bytes, unary

from tflfuse import flatbuffer, verify
from tflfuse.ir import Graph, Model, Quantization
from tflfuse.rewrite import (
    DeadCodeElimination,
    PassManager,
    PatternBuilder,
    RewriteError,
    Rule,
    TopologicalSort,
    find_matches,
)
from tflfuse.rules.epilogue import FuseActivationIntoProducer

CLEANUP = (DeadCodeElimination(), TopologicalSort())
p = PatternBuilder()


def fuse(m: Model, *rules: Rule):
    return PassManager((*rules, *CLEANUP)).run(m)


# -- patterns ------------------------------------------------------------------------------------
def test_pattern_captures_tensors_and_output() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3)
    r = unary(g, "RELU", c.output)
    model_of(g, [x], [r.output])
    pat = p.RELU(p.CONV_2D(p.x, p.const("w"), p.b, out="y"))
    (m,) = find_matches(pat, g, r)
    assert m.x is x and m.y is c.output and m.y.op is c and m.root is r
    assert m.w.is_constant and m.ops == [r, c]
    assert list(find_matches(p.RELU(p.CONV_2D(p.const("x"), p.w, p.b)), g, r)) == []


def test_commutative_ops_match_in_either_order() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4))
    k = g.add_constant("k", np.ones((1, 4), np.float32))
    a = add(g, k, x)  # constant first
    model_of(g, [x], [a.output])
    assert len(list(find_matches(p.ADD(p.x, p.const("c")), g, a))) == 1
    assert list(find_matches(p.SUB(p.x, p.const("c")), g, a)) == []


def test_a_variable_named_twice_must_bind_the_same_tensor() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4))
    y = g.add_tensor("y", (1, 4))
    same = add(g, x, x, name="same")
    other = add(g, x, y, name="other")
    model_of(g, [x, y], [same.output, other.output])
    pat = p.ADD(p.v, p.v)
    assert len(list(find_matches(pat, g, same))) >= 1
    assert list(find_matches(pat, g, other)) == []


def test_ellipsis_accepts_any_further_inputs() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3)
    model_of(g, [x], [c.output])
    assert list(find_matches(p.CONV_2D(p.x), g, c)) == []
    assert len(list(find_matches(p.CONV_2D(p.x, ...), g, c))) == 1


# -- FuseActivationIntoProducer --------------------------------------------------------------
def build_producer(kind: str) -> tuple[Graph, object]:
    g = Graph()
    if kind == "FULLY_CONNECTED":
        x = g.add_tensor("x", (2, 6))
        op = fully_connected(g, x, 5)
    else:
        x = g.add_tensor("x", (1, 5, 5, 3))
        if kind == "CONV_2D":
            op = conv(g, x, 4)
        elif kind == "DEPTHWISE_CONV_2D":
            op = depthwise(g, x)
        else:
            op = add(g, x, g.add_constant("k", np.full((1, 5, 5, 3), 0.3, np.float32)))
    return g, x, op


@pytest.mark.parametrize("producer", ["CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD"])
@pytest.mark.parametrize("activation", ["RELU", "RELU6", "RELU_N1_TO_1"])
def test_activation_fuses_into_producer(producer: str, activation: str) -> None:
    g, x, op = build_producer(producer)
    r = unary(g, activation, op.output, name="act")
    m = model_of(g, [x], [r.output])
    before = to_bytes(m)
    result = fuse(m, FuseActivationIntoProducer())
    assert op_types(m) == [producer]
    assert m.main.ops[0].fused_activation == activation
    assert m.main.outputs[0].name == "act"  # the model's output keeps its name
    assert result.fired() == {"FuseActivationIntoProducer": 1}
    agreement = verify.compare(before, to_bytes(m), runs=3)
    assert agreement.varies and agreement.ok and agreement.max_abs <= 1e-6


def refusals_of(m: Model) -> list[str]:
    return [r.reason for r in fuse(m, FuseActivationIntoProducer()).refusals]


def test_refuses_when_the_producer_already_has_an_activation() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3, act="RELU6")
    r = unary(g, "RELU", c.output)
    m = model_of(g, [x], [r.output])
    assert refusals_of(m) == ["CONV_2D already has fused activation RELU6"]
    assert op_types(m) == ["CONV_2D", "RELU"]


def test_refuses_when_the_producer_output_has_another_reader() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3)
    r = unary(g, "RELU", c.output)
    t = unary(g, "LOGISTIC", c.output)
    m = model_of(g, [x], [r.output, t.output])
    assert refusals_of(m) == ["CONV_2D output is also read by another op"]
    assert op_types(m) == ["CONV_2D", "RELU", "LOGISTIC"]


def test_refuses_when_the_producer_output_is_a_model_output() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3)
    r = unary(g, "RELU", c.output)
    m = model_of(g, [x], [r.output, c.output])
    assert refusals_of(m) == ["CONV_2D output is also a model output"]


def int8_conv_relu(relu_scale: float, relu_zero: int) -> Model:
    """x -> CONV_2D (out scale 0.05, zp 3: real range [-6.55, 6.2]) -> RELU (given scale)."""
    rng = np.random.default_rng(7)
    g = Graph()
    q_in = Quantization(np.array([0.02], np.float32), np.array([0]))
    x = g.add_tensor("x", (1, 6, 6, 3), "INT8", quantization=q_in)
    w = g.add_constant(
        "w",
        rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8),
        "INT8",
        Quantization(np.full(4, 0.01, np.float32), np.zeros(4, np.int64), axis=0),
    )
    b = g.add_constant(
        "b",
        rng.integers(-500, 500, 4).astype(np.int32),
        "INT32",
        Quantization(np.full(4, 0.0002, np.float32), np.zeros(4, np.int64)),
    )
    y = g.add_tensor(
        "y",
        (1, 6, 6, 4),
        "INT8",
        quantization=Quantization(np.array([0.05], np.float32), np.array([3])),
    )
    g.add_op(
        "CONV_2D",
        [x, w, b],
        [y],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "NONE"},
        version=3,
    )
    z = g.add_tensor(
        "z",
        (1, 6, 6, 4),
        "INT8",
        quantization=Quantization(np.array([relu_scale], np.float32), np.array([relu_zero])),
    )
    g.add_op("RELU", [y], [z], version=2)
    return model_of(g, [x], [z])


def test_int8_fusion_stays_within_one_quantization_step() -> None:
    """Quantized conv -> RELU: fusing removes the intermediate rounding to the conv's scale
    (0.05), so outputs move by at most one of those steps, in the RELU's units (0.02)."""
    m = int8_conv_relu(0.02, -128)  # RELU range [0, 5.1] lies inside the conv's
    before = to_bytes(m)
    fuse(m, FuseActivationIntoProducer())
    assert op_types(m) == ["CONV_2D"] and m.main.ops[0].fused_activation == "RELU"
    agreement = verify.compare(before, to_bytes(m), runs=3, int_atol=int(np.ceil(0.05 / 0.02)))
    assert agreement.varies and agreement.ok and agreement.max_abs >= 1  # rounding did move


def test_int8_fusion_refused_when_the_producer_saturates_first() -> None:
    m = int8_conv_relu(0.03, -128)  # RELU can output up to 7.65, the conv saturates at 6.2
    assert refusals_of(m) == [
        "int8 CONV_2D output saturates at [-6.55, 6.2], inside the RELU output range "
        "[0, 7.65]: fusing would change results"
    ]
    assert op_types(m) == ["CONV_2D", "RELU"]


# -- the pass manager ---------------------------------------------------------------------------
class BreaksTheGraph(Rule):
    """RELU(x) => (an op reading a tensor from nowhere): a deliberately wrong rule."""

    def pattern(self, pb: PatternBuilder):
        return pb.RELU(pb.x)

    def rewrite(self, m) -> None:
        from tflfuse.ir import Tensor

        m.root.set_input(0, Tensor("nowhere", (1,)))


def test_validation_names_the_rule_that_broke_the_graph() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4))
    r = unary(g, "RELU", x)
    m = model_of(g, [x], [r.output])
    with pytest.raises(RewriteError, match="BreaksTheGraph"):
        PassManager([BreaksTheGraph()]).run(m)


class SwapTanhSigmoid(Rule):
    """TANH(x) => LOGISTIC(x), and back: never reaches a fixed point (a deliberately bad pair)."""

    def pattern(self, pb: PatternBuilder):
        return pb.any("TANH", "LOGISTIC")(pb.x)

    def rewrite(self, m) -> None:
        m.root.type = "LOGISTIC" if m.root.type == "TANH" else "TANH"


def test_rules_that_never_settle_are_stopped() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4))
    t = unary(g, "TANH", x)
    m = model_of(g, [x], [t.output])
    with pytest.raises(RewriteError, match="fixed point"):
        PassManager([SwapTanhSigmoid()], max_rounds=5).run(m)


def test_disabled_rules_do_not_run() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3)
    r = unary(g, "RELU", c.output)
    m = model_of(g, [x], [r.output])
    result = PassManager(
        (FuseActivationIntoProducer(), *CLEANUP), disabled=["FuseActivationIntoProducer"]
    ).run(m)
    assert not result.changed and op_types(m) == ["CONV_2D", "RELU"]


def test_chains_fuse_to_a_fixed_point_across_subgraph_outputs() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    c1 = conv(g, x, 3, name="c1")
    r1 = unary(g, "RELU6", c1.output, name="r1")
    c2 = conv(g, r1.output, 3, name="c2")
    r2 = unary(g, "RELU", c2.output, name="r2")
    m = model_of(g, [x], [r2.output])
    before = to_bytes(m)
    result = fuse(m, FuseActivationIntoProducer())
    assert op_types(m) == ["CONV_2D", "CONV_2D"]
    assert result.fired() == {"FuseActivationIntoProducer": 2}
    assert len(m.main.tensors) == len(flatbuffer.from_bytes(to_bytes(m)).main.tensors)
    assert verify.compare(before, to_bytes(m)).ok


def test_dead_code_elimination_keeps_side_effects_and_outputs() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4))
    used = unary(g, "RELU", x, name="used")
    unary(g, "TANH", x, name="dead")
    unary(g, "LOGISTIC", g.tensors[-1], name="dead2")
    state = g.add_tensor("state", (1, 4))
    state.is_variable = True
    g.add_op("ASSIGN_VARIABLE", [state, x], [])
    m = model_of(g, [x], [used.output])
    removed = DeadCodeElimination().run(m.main)
    assert op_types(m) == ["RELU", "ASSIGN_VARIABLE"]
    assert removed >= 2
    assert {t.name for t in m.main.tensors} == {"x", "used", "state"}
