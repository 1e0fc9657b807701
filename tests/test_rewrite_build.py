"""The builder bound to a match, plans carried from check to rewrite, and pattern constraints."""

from __future__ import annotations

import numpy as np
import pytest
from irgraphs import add, conv, model_of, to_bytes, unary

from tflfuse.ir import Graph, Quantization, Tensor, flatbuffer
from tflfuse.rewrite import (
    Builder,
    BuildError,
    DeadCodeElimination,
    Match,
    PassManager,
    PatternBuilder,
    RewriteError,
    Rule,
    TopologicalSort,
    find_matches,
)
from tflfuse.verification import verify

p = PatternBuilder()


def _relu_graph(shape=(1, 4, 4, 3)):
    """x -> RELU -> y -> TANH -> z: a root with a reader after it."""
    g = Graph()
    x = g.add_tensor("x", shape)
    r = unary(g, "RELU", x, "y")
    t = unary(g, "TANH", r.output, "z")
    return g, x, r, t


def _match(g: Graph, pattern, root) -> Match:
    (m,) = find_matches(pattern, g, root)
    return m


# -- the builder ---------------------------------------------------------------------------------
def test_builder_names_places_and_replaces() -> None:
    g, x, r, t = _relu_graph()
    m = _match(g, p.RELU(p.x), r)
    b = m.builder()
    half = b.scalar(0.5, "half", like=x)
    y = b.MUL(b.RELU(x, name="r"), half, name="half_r")
    b.replace(m.root, b.ADD(y, y))
    assert [op.type for op in g.ops] == ["RELU", "MUL", "ADD", "TANH"]  # where the root was
    assert r not in g.ops and not r.outputs  # the root is gone
    new_relu, mul, add_op = g.ops[:3]
    assert new_relu.output.name == "y/r" and mul.output.name == "y/half_r"
    assert mul.inputs[1].name == "y/half" and mul.inputs[1].data.tolist() == [0.5]
    assert add_op.output is t.inputs[0]  # the ADD writes the RELU's old tensor: readers kept
    assert add_op.output.name == "y" and mul.output.shape == x.shape
    assert mul.options == {"fused_activation_function": "NONE"}  # fusing ops get NONE
    assert new_relu.options == {}
    g.validate()


def test_builder_output_computes_what_it_says() -> None:
    g, x, r, t = _relu_graph()
    model = model_of(g, [x], [t.output])
    before = to_bytes(model)
    m = _match(g, p.RELU(p.x), r)
    b = m.builder()
    # relu(x) = (x + |x|) / 2, spelled with MAXIMUM to keep it in the builder's inferred ops
    zero = b.scalar(0.0, "zero", like=x)
    b.replace(m.root, b.MAXIMUM(x, zero))
    after = to_bytes(model)
    assert after != before
    report = verify.compare(before, after)
    assert report.ok, report


def test_tensors_are_made_in_the_order_of_the_calls() -> None:
    """One order (a tensor's index decides the file's bytes): each tensor when its call happens."""
    g, x, r, _ = _relu_graph()
    m = _match(g, p.RELU(p.x), r)
    b = m.builder()
    a = b.MUL(x, b.scalar(2.0, "two", like=x), name="a")
    c = b.ADD(a, b.scalar(1.0, "one", like=x), name="c")
    b.replace(m.root, b.RESHAPE(c, b.ints(x.shape, "shape")))
    assert [t.name for t in g.tensors[3:]] == ["y/two", "y/a", "y/one", "y/c", "y/shape"]


def test_declared_tensor_comes_first_and_an_op_writes_it() -> None:
    g, x, r, _ = _relu_graph()
    m = _match(g, p.RELU(p.x), r)
    b = m.builder()
    late = b.tensor("late", x.shape, like=x)
    early = b.TANH(x, name="early")
    b.RELU(early, out=late)
    b.replace(m.root, b.ABS(late))
    assert [t.name for t in g.tensors[3:]] == ["y/late", "y/early"]
    assert [op.type for op in g.ops] == ["TANH", "RELU", "ABS", "TANH"]
    g.validate()


def test_shapes_are_inferred_and_checked() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 6))
    b = Builder(g, None, "n")
    assert b.MUL(x, b.const(np.ones(6, np.float32), "w")).shape == (1, 4, 6)
    assert b.TRANSPOSE(x, b.ints([0, 2, 1], "p")).shape == (1, 6, 4)
    assert b.RESHAPE(x, b.ints([4, 6], "s")).shape == (4, 6)
    assert b.SLICE(x, b.ints([0, 1, 0], "b"), b.ints([1, 2, -1], "z")).shape == (1, 2, 6)
    assert b.CONCATENATION(x, x, axis=-1).shape == (1, 4, 12)
    with pytest.raises(BuildError, match="cannot broadcast"):
        b.ADD(x, b.const(np.ones(5, np.float32), "bad"))
    with pytest.raises(BuildError, match="element count"):
        b.RESHAPE(x, b.ints([5, 5], "s2"))
    with pytest.raises(BuildError, match="not a permutation"):
        b.TRANSPOSE(x, b.ints([0, 0, 1], "p2"))
    with pytest.raises(BuildError, match="leaves"):
        b.SLICE(x, b.ints([0, 3, 0], "b2"), b.ints([1, 2, 6], "z2"))
    with pytest.raises(BuildError, match="not \\[2, 2\\]"):
        b.TANH(x, shape=(2, 2))
    with pytest.raises(BuildError, match="needs shape="):
        b.AVERAGE_POOL_2D(x)
    with pytest.raises(BuildError, match="one type expected"):
        b.ADD(x, b.ints([1], "i"))


def test_replace_checks_shape_and_dtype_and_commits_once() -> None:
    g, x, r, _ = _relu_graph()
    m = _match(g, p.RELU(p.x), r)
    b = m.builder()
    with pytest.raises(BuildError, match="but 'y' is FLOAT32\\[1, 4, 4, 3\\]"):
        b.replace(m.root, b.RESHAPE(x, b.ints([1, 48], "flat")))
    b2 = m.builder()
    b2.replace(m.root, b2.TANH(x))
    with pytest.raises(BuildError, match="committed"):
        b2.TANH(x)


def test_kept_ops_get_new_weights_and_bias_and_outputs_at_commit() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 3))
    c = conv(g, x, 2, k=1)
    t = unary(g, "TANH", c.output, "z")
    old_w, old_out = c.inputs[1], c.output
    b = Builder(g, c, prefix="", after=c)
    w = b.set_weights(c, old_w.data * 2)
    bias = b.set_bias(c, np.ones(2, np.float32))
    pre = b.tensor("conv_pre", old_out.shape)
    b.set_output(c, 0, pre)
    b.RELU(pre, out=old_out)
    assert c.inputs[1] is old_w and c.output is old_out  # nothing changes before the commit
    b.commit()
    assert [op.type for op in g.ops] == ["CONV_2D", "RELU", "TANH"]  # right after the conv
    assert c.inputs[1] is w.tensor and w.tensor.name == "conv/w_fused"
    assert np.array_equal(w.tensor.data, old_w.data * 2) and w.tensor.dtype == "FLOAT32"
    assert c.inputs[2] is bias.tensor and bias.tensor.name == "conv_bias"  # named at the call
    assert c.output.name == "conv_pre" and g.ops[1].output is old_out is t.inputs[0]
    assert old_w.data is not w.tensor.data  # the old constant is not edited in place
    g.validate()


def test_set_bias_adds_a_missing_bias_and_raises_the_version() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 3))
    w = g.add_constant("w", np.ones((2, 3, 3, 3), np.float32))
    shape = g.add_constant("shape", np.array([1, 8, 8, 2], np.int32))
    y = g.add_tensor("y", (1, 8, 8, 2))
    op = g.add_op("TRANSPOSE_CONV", [shape, w, x], [y], {"padding": "SAME"})
    b = Builder(g, op)
    b.set_bias(op, np.zeros(2, np.float32))
    b.commit()
    assert len(op.inputs) == 4 and op.inputs[3].name == "y_bias" and op.version == 3


def test_split_writes_several_outputs_and_commit_removes_several_ops() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4))
    a = unary(g, "RELU", x, "a")
    c = unary(g, "TANH", x, "c")
    z = unary(g, "ABS", a.output, "z")
    outs = [a.output, c.output]
    b = Builder(g, a, prefix="")
    both = b.CONCATENATION(x, x, axis=-1, name="both")
    parts = b.split("SPLIT", b.const(np.array(1, np.int32), "axis"), both, outs=outs, num_splits=2)
    assert [v.tensor for v in parts] == outs
    b.commit(remove=[a, c])
    assert [op.type for op in g.ops] == ["CONCATENATION", "SPLIT", "ABS"]
    assert list(g.ops[1].outputs) == outs and z.inputs[0] is outs[0]
    assert g.ops[0].output.name == "both" and g.tensors[-1].name == "axis"
    g.validate()


def test_an_empty_prefix_names_tensors_as_told() -> None:
    g, x, r, _ = _relu_graph()
    m = _match(g, p.RELU(p.x), r)
    b = m.builder(prefix="")
    b.replace(m.root, b.MUL(x, b.scalar(2.0, "two", like=x), name="twice"))
    assert g.ops[0].inputs[1].name == "two"


def test_scalar_of_an_int8_tensor_holds_the_value_exactly() -> None:
    g = Graph()
    q = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([3], np.int64))
    x = g.add_tensor("x", (1, 4), "INT8", quantization=q)
    b = Builder(g, None, "n")
    c = b.scalar(0.25, "quarter", like=x)
    b.MUL(x, c, quant=q)
    b.commit()
    t = c.tensor
    real = float(t.quantization.scale[0]) * (int(t.data[0]) - int(t.quantization.zero_point[0]))
    assert t.dtype == "INT8" and real == pytest.approx(0.25, rel=1e-6)
    assert g.ops[0].output.quantization is q


# -- plans and constraints in the engine ---------------------------------------------------------
class _Doubling(Rule):
    """RELU(x) => MAXIMUM(x, 0) + 0 * plan, a toy to watch check and rewrite."""

    int8_error_steps = 0

    def __init__(self) -> None:
        self.checks = 0
        self.plans: list = []

    def pattern(self, p):
        return p.RELU(p.x.of("float", because="not float"))

    def check(self, m):
        self.checks += 1
        return {"zero": 0.0}

    def rewrite(self, m, *, x: Tensor, plan: dict[str, float]):
        self.plans.append(plan)
        b = m.builder()
        b.replace(m.root, b.MAXIMUM(x, b.scalar(plan["zero"], "zero", like=x)))


def test_check_returns_a_plan_that_rewrite_receives() -> None:
    g, x, r, t = _relu_graph()
    model_of(g, [x], [t.output])
    rule = _Doubling()
    result = PassManager([rule, DeadCodeElimination(), TopologicalSort()]).run(g)
    assert result.fired() == {"_Doubling": 1}
    assert rule.checks == 1 and rule.plans == [{"zero": 0.0}]
    assert [op.type for op in g.ops] == ["MAXIMUM", "TANH"]


def test_soft_constraint_is_a_refusal_with_its_sentence_and_check_does_not_run() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4), "INT32")
    r = unary(g, "RELU", x, "y")
    model_of(g, [x], [r.output])
    rule = _Doubling()
    result = PassManager([rule]).run(g)
    assert [e.reason for e in result.refusals] == ["not float"] and rule.checks == 0


def test_option_constraints_match_or_refuse() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3, act="RELU")
    plain = conv(g, c.output, 3, name="c2")
    hard = p.CONV_2D(p.x, ...).where(fused_activation="NONE")
    assert list(find_matches(hard, g, c)) == [] and len(list(find_matches(hard, g, plain))) == 1
    soft = p.CONV_2D(p.x, ...).where(fused_activation="NONE", because="has an activation")
    (m,) = find_matches(soft, g, c)
    assert m.unmet == "has an activation"
    assert _match(g, soft, plain).unmet is None
    assert list(find_matches(p.CONV_2D(p.x, ...).where(padding="VALID"), g, plain)) == []


def test_a_rule_that_builds_wrongly_is_named() -> None:
    class Broken(Rule):
        int8_error_steps = 0

        def pattern(self, p):
            return p.ADD(p.a, p.b)

        def rewrite(self, m):
            b = m.builder()
            b.replace(m.root, b.RESHAPE(m.a, b.ints([-1], "flat")))

    g = Graph()
    x = g.add_tensor("x", (1, 4))
    a = add(g, x, x)
    model = model_of(g, [x], [a.output])
    with pytest.raises(RewriteError, match="rule Broken failed in its rewrite on ADD"):
        PassManager([Broken()]).run(model)
    assert flatbuffer.from_bytes(to_bytes(model)).main.ops[0].type == "ADD"  # untouched
