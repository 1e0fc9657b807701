"""Cleanup passes: constant folding through the interpreter, CSE, duplicate constants."""

from __future__ import annotations

import numpy as np
from rulekit import G, apply, assert_same_function, ops

from tflfuse.rules.cleanup import (
    EliminateCommonSubexpressions,
    FoldConstants,
    MergeDuplicateConstants,
)


def test_constant_subgraph_is_folded_by_the_interpreter() -> None:
    g = G()
    x = g.input((2, 3))
    a = g.const(np.arange(6, dtype=np.float32).reshape(2, 3), "a")
    folded = g.binary("MUL", g.unary("EXP", g.binary("ADD", a, g.const(np.float32(1.0)))), a)
    data = g.bytes(g.binary("ADD", x, folded))
    out, model, result = apply(data, FoldConstants())
    assert ops(model) == ["ADD"]
    const = model.main.ops[0].inputs[1]
    np.testing.assert_allclose(
        const.data, np.exp(np.arange(6).reshape(2, 3) + 1.0) * np.arange(6).reshape(2, 3), rtol=1e-6
    )
    assert_same_function(data, out)


def test_shape_chain_of_a_static_tensor_folds_away() -> None:
    g = G()
    x = g.input((1, 4, 6))
    shape = g.graph.add_tensor("shape", (3,), "INT32")
    g.graph.add_op("SHAPE", [x], [shape], {"out_type": 2})
    batch = g.graph.add_tensor("batch", (1,), "INT32")
    g.graph.add_op(
        "STRIDED_SLICE",
        [shape, g.const(np.array([0])), g.const(np.array([1])), g.const(np.array([1]))],
        [batch],
    )
    new_shape = g.graph.add_tensor("new_shape", (2,), "INT32")
    g.graph.add_op(
        "CONCATENATION", [batch, g.const(np.array([24], np.int32), "n")], [new_shape], {"axis": 0}
    )
    y = g.op("RESHAPE", [x, new_shape], (1, 24))
    data = g.bytes(g.unary("RELU", y))
    out, model, _ = apply(data, FoldConstants())
    assert ops(model) == ["RESHAPE", "RELU"]
    assert model.main.ops[0].inputs[1].data.tolist() == [1, 24]
    assert_same_function(data, out)


def test_dynamic_shape_is_not_folded() -> None:
    g = G()
    x = g.input((1, 4))
    x.shape_signature = (-1, 4)
    shape = g.graph.add_tensor("shape", (2,), "INT32")
    g.graph.add_op("SHAPE", [x], [shape], {"out_type": 2})
    data = g.bytes(shape)
    _, model, _ = apply(data, FoldConstants())
    assert ops(model) == ["SHAPE"]


def test_common_subexpressions_and_duplicate_constants_merge() -> None:
    g = G()
    x = g.input((1, 5))
    a = g.binary("ADD", x, g.const(np.full(5, 2.0, np.float32), "two"))
    b = g.binary("ADD", x, g.const(np.full(5, 2.0, np.float32), "two_again"))
    data = g.bytes(g.binary("MUL", g.unary("TANH", a), g.unary("TANH", b)))
    out, model, _ = apply(data, MergeDuplicateConstants(), EliminateCommonSubexpressions())
    assert ops(model) == ["ADD", "TANH", "MUL"]
    assert_same_function(data, out)


def test_cse_keeps_ops_writing_model_outputs() -> None:
    g = G()
    x = g.input((1, 5))
    data = g.bytes(g.unary("TANH", x), g.unary("TANH", x))
    _, model, _ = apply(data, EliminateCommonSubexpressions())
    assert ops(model) == ["TANH", "TANH"]


def test_cse_keeps_two_reads_of_a_variable_with_an_assign_between() -> None:
    """Issue 11: the second READ_VARIABLE was merged into the first (same handle, same key), so
    y = read2 - read1 became 0 instead of x."""
    g = G()
    x = g.input((1, 4))
    graph = g.graph
    handle = graph.add_tensor("handle", (), "RESOURCE")
    graph.add_op("VAR_HANDLE", [], [handle], {"container": "", "shared_name": "v"})
    graph.add_op("ASSIGN_VARIABLE", [handle, x], [])
    first = g.op("READ_VARIABLE", [handle], (1, 4))
    graph.add_op("ASSIGN_VARIABLE", [handle, g.binary("ADD", x, x)], [])
    second = g.op("READ_VARIABLE", [handle], (1, 4))
    data = g.bytes(g.binary("SUB", second, first))
    out, model, _ = apply(data, EliminateCommonSubexpressions())
    assert ops(model).count("READ_VARIABLE") == 2
    assert_same_function(data, out)
