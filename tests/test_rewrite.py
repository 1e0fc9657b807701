"""The rewrite engine: pattern matching, the pass manager, refusals, cleanup, and the first rule."""

from __future__ import annotations

import numpy as np
import pytest
from irgraphs import add, conv, depthwise, fully_connected, model_of, op_types, to_bytes, unary

from tflfuse.ir import Graph, Model, Quantization, Tensor, flatbuffer
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
from tflfuse.targets import target as target_named
from tflfuse.verification import verify

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
    got = m.captures
    assert got["x"] is x and got["y"] is c.output and got["y"].op is c and m.root is r
    assert got["w"].is_constant and m.ops == [r, c] and set(got) == {"x", "w", "b", "y"}
    assert not hasattr(m, "x")  # captures reach a rule as its methods' keyword arguments
    assert list(find_matches(p.RELU(p.CONV_2D(p.const("x"), p.w, p.b)), g, r)) == []


def test_a_variable_never_captures_a_missing_optional_input() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3)
    c.set_input(2, None)  # no bias
    model_of(g, [x], [c.output])
    assert list(find_matches(p.CONV_2D(p.x, p.w, p.b), g, c)) == []
    assert len(list(find_matches(p.CONV_2D(p.x, p.w, ...), g, c))) == 1


class _NamesAMissingCapture(Rule):
    """RELU(x) => nothing: its check asks for `y`, which the pattern does not capture."""

    int8_error_steps = 0

    def pattern(self, pb: PatternBuilder):
        return pb.RELU(pb.x)

    def check(self, m, *, x: Tensor, y: Tensor):
        return None


class _TakesACaptureByPosition(Rule):
    int8_error_steps = 0

    def pattern(self, pb: PatternBuilder):
        return pb.RELU(pb.x)

    def rewrite(self, m, x: Tensor) -> None:
        pass


def test_a_method_naming_a_capture_the_pattern_lacks_fails_when_the_rule_is_registered() -> None:
    with pytest.raises(TypeError, match=r"_NamesAMissingCapture: check\(\) takes 'y', which its"
                       r" pattern does not capture \(it captures x\)"):  # fmt: skip
        PassManager([_NamesAMissingCapture()])
    with pytest.raises(TypeError, match=r"rewrite\(\) takes 'x' by position"):
        PassManager([_TakesACaptureByPosition()])


def test_a_refusal_is_a_sentence_not_a_string() -> None:
    from tflfuse.rewrite import NotApplicable, Refusal, refuse

    r, n = refuse("conv output is read by another op"), NotApplicable("no sibling")
    assert not isinstance(r, str) and str(r) == "conv output is read by another op"
    assert (r.quiet, n.quiet) == (False, True) and isinstance(n, Refusal)
    assert f"{n}" == "no sibling" and r != "conv output is read by another op"


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


# -- rule failures, float-only refusals, declared int8 error (issue 11) --------------------------
class RaisesInCheck(Rule):
    """RELU(x) => nothing: its check raises (a stand-in for a rule bug)."""

    int8_error_steps = 0

    def pattern(self, pb: PatternBuilder):
        return pb.RELU(pb.x)

    def check(self, m):
        return {}["missing"]


def _relu_model() -> Model:
    g = Graph()
    x = g.add_tensor("x", (1, 4))
    r = unary(g, "RELU", x, name="the_relu")
    return model_of(g, [x], [r.output])


def test_an_exception_in_a_rule_becomes_a_rewrite_error_naming_rule_and_op() -> None:
    with pytest.raises(RewriteError) as info:
        PassManager([RaisesInCheck()]).run(_relu_model())
    message = str(info.value)
    assert message.startswith("rule RaisesInCheck failed in its check on RELU op 'the_relu'")
    assert "KeyError" in message and "\n" not in message
    assert info.value.rule == "RaisesInCheck" and info.value.where == "the_relu"


def test_cli_shows_a_rule_failure_as_one_line_and_writes_nothing(
    tmp_path, monkeypatch, capsys
) -> None:
    from tflfuse import cli
    from tflfuse.rules.epilogue import FoldBiasIntoProducer

    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3)
    k = g.add_constant("k", np.ones(3, np.float32))
    model_of(g, [x], [add(g, c.output, k).output])
    src, dst = tmp_path / "in.tflite", tmp_path / "out.tflite"
    src.write_bytes(to_bytes(Model([g])))
    monkeypatch.setattr(FoldBiasIntoProducer, "check", lambda self, m: 1 / 0)
    assert cli.main(["optimize", str(src), "-o", str(dst)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "tflfuse: error: rule FoldBiasIntoProducer failed in its check on ADD op"
    ), err
    assert "ZeroDivisionError" in err[0] and not dst.exists()


def q8(scale: float, zero: int = 0) -> Quantization:
    return Quantization(np.array([scale], np.float32), np.array([zero]))


def int8_add_branches(n: int) -> Model:
    """x (int8) -> n separate ADD(x, c) branches, each a model output, plus one RELU output."""
    g = Graph()
    x = g.add_tensor("x", (1, 8), "INT8", quantization=q8(0.05))
    outs = []
    for i in range(n):
        c = g.add_constant(f"c{i}", np.full((8,), 10 * (i + 1), np.int8), "INT8", q8(0.05))
        y = g.add_tensor(f"sum{i}", (1, 8), "INT8", quantization=q8(0.05))
        g.add_op("ADD", [x, c], [y], {"fused_activation_function": "NONE"})
        outs.append(y)
    r = g.add_tensor("relu", (1, 8), "INT8", quantization=q8(0.05))
    g.add_op("RELU", [x], [r])
    return model_of(g, [x], [*outs, r])


class NudgesInt8Add(Rule):
    """ADD(x, c) => ADD(x, c + 2 steps): a deliberately wrong int8 rewrite that claims one
    requantization (1 step) of error but moves its output by 2."""

    quantized_ok = True
    int8_error_steps = 1

    def pattern(self, pb: PatternBuilder):
        return pb.ADD(pb.x, pb.const("c"))

    def check(self, m, *, c: Tensor):
        from tflfuse.rewrite import NotApplicable

        return NotApplicable("already nudged") if c.name.endswith("nudged") else None

    def rewrite(self, m, *, c: Tensor) -> None:
        value = (c.data.astype(np.int16) + 2).astype(np.int8)
        nudged = m.graph.add_constant(c.name + "_nudged", value, "INT8", c.quantization)
        m.root.set_input(1, nudged)


class FloatOnlyRelu(Rule):
    """RELU(x) => RELU(x): a float-only rule, to see its refusal on int8."""

    int8_error_steps = 0

    def pattern(self, pb: PatternBuilder):
        return pb.RELU(pb.x)

    def rewrite(self, m) -> None:
        raise AssertionError("must not run on a quantized op")


def test_float_only_rules_say_why_they_skip_quantized_ops() -> None:
    result = PassManager([FloatOnlyRelu()]).run(int8_add_branches(1))
    assert [(r.rule, r.where, r.reason) for r in result.refusals] == [
        ("FloatOnlyRelu", "relu", "float-only rule; the op is quantized")
    ]


def test_int8_error_is_bounded_per_output_along_its_paths() -> None:
    from tflfuse.rewrite import int8_error_bounds

    m = int8_add_branches(2)
    result = PassManager([NudgesInt8Add(), FuseActivationIntoProducer()]).run(m)
    assert result.fired() == {"NudgesInt8Add": 2}
    assert result.int8_rewrites() == {"NudgesInt8Add": {"count": 2, "steps": 2}}
    # each ADD's output carries its own rewrite's step, the untouched RELU output none
    assert int8_error_bounds(m, result) == {"sum0": 1, "sum1": 1, "relu": 0}


def test_a_wrong_int8_rewrite_that_the_old_budget_passed_now_fails(monkeypatch) -> None:
    """The old tolerance was 1 + (number of rewrites) steps on every output: 4 here, so a rule
    that moves each output by 2 passed. Per output along its paths it is 1: caught, named."""
    from tflfuse.convert import optimize

    before = to_bytes(int8_add_branches(3))
    m = flatbuffer.from_bytes(before)
    result = PassManager([NudgesInt8Add()]).run(m)
    after = to_bytes(m)
    old = verify.compare(before, after, int_atol=1 + len(result.events))
    assert old.ok and old.varies and old.max_abs == 2  # what used to pass

    monkeypatch.setattr(
        optimize, "pipeline", lambda level, target, **_: (NudgesInt8Add(), *CLEANUP)
    )
    with pytest.raises(optimize.VerificationError) as info:
        optimize.optimize_bytes(before)
    message = str(info.value)
    assert "output 'sum0' differs by 2 quantization steps (allowed 1)" in message
    assert "rule NudgesInt8Add" in message and message.endswith("nothing written")


def test_a_candidate_the_interpreter_refuses_is_a_verification_error(monkeypatch) -> None:
    """Issue 11: a rewrite whose model the interpreter rejects used to print 'not verified'
    and exit 0; now it names the rule and writes nothing."""
    from tflfuse.convert import optimize

    class ReluToBadPrelu(Rule):
        """RELU(x) => PRELU(x, alpha of shape (1, 1, C)) on a 2-D x: the interpreter refuses it
        (HaveSameShapes), as it did LegalizeLeakyRelu's int8 PRELU before issue 11."""

        int8_error_steps = 0

        def pattern(self, pb: PatternBuilder):
            return pb.RELU(pb.x)

        def rewrite(self, m, *, x: Tensor) -> None:
            alpha = m.graph.add_constant("alpha", np.zeros((1, 1, 4), np.float32))
            m.root.type = "PRELU"
            m.root.options = {}
            m.root.inputs = [x, alpha]

    monkeypatch.setattr(optimize, "pipeline", lambda level, target, **_: (ReluToBadPrelu(),))
    data = to_bytes(_relu_model())
    with pytest.raises(optimize.VerificationError, match=r"does not run .*rule ReluToBadPrelu"):
        optimize.optimize_bytes(data)
    assert optimize.optimize_bytes(data, verify=False).verification == {
        "verified": False,
        "reason": optimize.NOT_VERIFIED,
    }


def test_every_pipeline_rule_declares_its_int8_error() -> None:
    from tflfuse.convert.rule_sets import pipeline
    from tflfuse.targets import TARGETS

    undeclared = {
        p.name
        for t in TARGETS
        for p in pipeline(2, target_named(t))
        if isinstance(p, Rule)
        and not any("int8_error_steps" in vars(c) for c in type(p).__mro__ if c is not Rule)
    }
    assert undeclared == set()


class FoldsTanhOfRelu(Rule):
    """TANH(RELU(x)) => TANH(x) (wrong, but only the engine's check matters here); no check of
    its own that the RELU output has no other readers."""

    int8_error_steps = 0

    def pattern(self, pb: PatternBuilder):
        return pb.TANH(pb.RELU(pb.x, out="r"))

    def rewrite(self, m, *, x: Tensor) -> None:
        m.root.set_input(0, x)


@pytest.mark.parametrize(
    "shared, reason",
    [
        ("reader", "RELU output is also read by another op"),
        ("output", "RELU output is also a model output"),
    ],
)
def test_the_engine_refuses_matches_whose_inner_ops_are_read_outside(shared, reason) -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4))
    r = unary(g, "RELU", x)
    t = unary(g, "TANH", r.output)
    other = r.output if shared == "output" else unary(g, "EXP", r.output).output
    m = model_of(g, [x], [t.output, other])
    result = PassManager([FoldsTanhOfRelu()]).run(m)
    assert [r.reason for r in result.refusals] == [reason]
    assert not result.events


def test_int8_error_grows_through_an_fc_by_its_weights_and_one_rounding() -> None:
    """1 step at the ADD (scale 0.05) reaches the FC output (scale 0.05) as at most
    1.5 (the largest row sum of |W|) x 1 step + 1 step of the FC's own rounding: 3 steps."""
    from tflfuse.rewrite import int8_error_bounds

    m = int8_add_branches(1)
    g = m.main
    s = g.outputs[0]
    rows = np.zeros((2, 8), np.int8)
    rows[0, :2], rows[1, :2] = (100, -50), (20, 20)  # real rows [1, -0.5], [0.2, 0.2]
    w = g.add_constant("w", rows, "INT8", q8(0.01))
    b = g.add_constant("b", np.zeros(2, np.int32), "INT32", q8(0.0005))
    y = g.add_tensor("fc", (1, 2), "INT8", quantization=q8(0.05))
    g.add_op("FULLY_CONNECTED", [s, w, b], [y], {"fused_activation_function": "NONE"})
    g.outputs = [y, *g.outputs[1:]]
    result = PassManager([NudgesInt8Add()]).run(m)
    assert result.fired() == {"NudgesInt8Add": 1}
    assert int8_error_bounds(m, result) == {"fc": 3, "relu": 0}


def test_steps_whose_site_a_later_rewrite_removed_still_bound_a_float_output() -> None:
    """Found by the int8 property test: LegalizeHardSwish wrote 'hard_swish' (2 steps), then
    FuseActivationIntoProducer fused the RELU after it, so no tensor is called 'hard_swish' any
    more. Those steps count at every output: for a float output of a DEQUANTIZE, in the steps
    of the int8 tensor it reads (they were dropped for float outputs)."""
    from tflfuse.rewrite import RewriteEvent
    from tflfuse.rewrite.int8_error import output_bounds

    g = Graph("main")
    x = g.add_tensor("x", (1, 4), "INT8", quantization=q8(0.02))
    y = g.add_tensor("y_float", (1, 4), "FLOAT32")
    g.inputs, g.outputs = [x], [y]
    g.add_op("DEQUANTIZE", [x], [y], {})
    gone = RewriteEvent("SomeRule", 0, "hard_swish", int8_steps=2, sites=("hard_swish",))
    assert output_bounds(Model([g]), [gone]) == {"y_float": pytest.approx(2 * 0.02)}
