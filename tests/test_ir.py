"""The IR keeps producers and consumers consistent and catches broken graphs."""

from __future__ import annotations

import numpy as np
import pytest
from irgraphs import add, conv, model_of, unary

from tflfuse.ir import Graph, IRError, Op, Tensor, dtype_name


def small_graph() -> tuple[Graph, Tensor, Op, Op]:
    g = Graph("main")
    x = g.add_tensor("x", (1, 4, 4, 3))
    c = conv(g, x, 4)
    r = unary(g, "RELU", c.output)
    model_of(g, [x], [r.output])
    return g, x, c, r


def test_wiring_follows_assignment() -> None:
    g, x, c, r = small_graph()
    assert c.output.consumers == [r]
    assert r.output.producer is r and r.inputs[0].op is c
    r.set_input(0, x)
    assert c.output.consumers == []
    assert r in x.consumers


def test_required_inputs_and_producers_are_typed_and_checked() -> None:
    """`input(i)`, `operands` and `op` give a Tensor / Op or say what is missing; `inputs` and
    `producer` keep None for an absent optional input and a tensor no op writes."""
    g, x, c, r = small_graph()
    assert r.input(0) is c.output and r.operands == (c.output,) and c.output.op is c
    c.set_input(2, None)  # no bias
    assert c.inputs[2] is None and c.input(0) is x
    with pytest.raises(IRError, match=r"CONV_2D op .* has no input 2"):
        c.input(2)
    with pytest.raises(IRError, match="has no input 3"):
        c.input(3)
    with pytest.raises(IRError, match="has an absent input"):
        _ = c.operands
    assert x.producer is None
    with pytest.raises(IRError, match="tensor 'x' is written by no op"):
        _ = x.op


def test_replace_uses_rewires_ops_and_graph_outputs() -> None:
    g, x, c, r = small_graph()
    g.replace_uses(r.output, c.output)
    assert g.outputs == [c.output]
    g.remove_op(r)
    g.validate()
    assert [op.type for op in g.ops] == ["CONV_2D"]


def test_a_tensor_cannot_have_two_producers() -> None:
    g, x, c, r = small_graph()
    with pytest.raises(IRError, match="already produced"):
        g.add_op("RELU", [x], [c.output])


def test_validate_rejects_use_before_definition() -> None:
    g, x, c, r = small_graph()
    g.ops.reverse()
    with pytest.raises(IRError, match="before it is produced"):
        g.validate()
    assert g.toposort() is True
    g.validate()
    assert [op.type for op in g.ops] == ["CONV_2D", "RELU"]


def test_toposort_keeps_a_valid_order_and_detects_cycles() -> None:
    g, x, c, r = small_graph()
    assert g.toposort() is False
    c.set_input(0, r.output)  # conv reads relu, relu reads conv: a cycle
    with pytest.raises(IRError, match="cycle"):
        g.toposort()


def test_topological_order_reads_only_and_breaks_ties_by_current_position() -> None:
    g = Graph("main")
    x = g.add_tensor("x", (1, 4))
    a = unary(g, "RELU", x)
    b = unary(g, "TANH", x)
    s = add(g, a.output, b.output)
    model_of(g, [x], [s.output])
    g.ops = [s, b, a]  # the sum first: out of order, two independent producers
    assert g.topological_order() == [b, a, s]  # b stays before a, as it is now
    assert g.ops == [s, b, a]  # nothing moved
    assert g.toposort() is True and g.ops == [b, a, s]
    assert g.topological_order() == g.ops


def test_validate_rejects_foreign_tensors_and_bad_constants() -> None:
    g, x, c, r = small_graph()
    stray = Tensor("stray", (1, 4, 4, 4))
    r.set_input(0, stray)
    with pytest.raises(IRError, match="not in the subgraph"):
        g.validate()
    g2, _, c2, _ = small_graph()
    c2.inputs[1].data = np.zeros((2, 2), np.float32)
    with pytest.raises(IRError, match="data of shape"):
        g2.validate()


def test_unique_names_and_dtypes() -> None:
    g = Graph()
    a = g.add_tensor("t", (1,))
    b = g.add_tensor("t", (1,))
    assert a.name != b.name
    assert dtype_name(np.dtype(np.int8)) == "INT8"
    assert dtype_name(np.dtype(">f4")) == "FLOAT32"
    with pytest.raises(IRError):
        dtype_name(np.dtype("U3"))


def test_op_counts_and_activations() -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 2, 2, 2))
    a = add(g, x, x)
    r = unary(g, "RELU", a.output)
    model_of(g, [x], [r.output])
    assert g.op_counts() == {"ADD": 1, "RELU": 1}
    assert [t.name for t in g.activations()] == ["add", "relu"]
    assert a.output.nbytes == 1 * 2 * 2 * 2 * 4
    assert x.consumers == [a]  # read twice by one op, listed once


def _wiring(g: Graph) -> list:
    """The graph's structure by position: each tensor's name, producer and readers (op indices)."""
    index = {id(op): i for i, op in enumerate(g.ops)}
    where = lambda op: None if op is None else index.get(id(op), "stray")  # noqa: E731
    tensors = [(t.name, where(t.producer), [where(o) for o in t._uses]) for t in g.tensors]
    ops = [(op.type, [t.name if t else None for t in op.inputs], op.name) for op in g.ops]
    return [tensors, ops]


def test_a_snapshot_of_some_ops_is_the_copy_with_the_others_removed() -> None:
    g, x, c, r = small_graph()
    unary(g, "RELU6", c.output)  # a second reader of the conv's output
    add(g, r.output, g.ops[-1].output)
    for keep in ({1, 2}, {0, 3}, {3}, set()):
        full = g.snapshot()
        for i, op in reversed(list(enumerate(full.ops))):
            if i not in keep:
                full.remove_op(op)
        assert _wiring(g.snapshot(only=keep)) == _wiring(full)
    assert _wiring(g) == _wiring(g.snapshot())  # (and the original untouched)


def _fresh_names(g: Graph) -> set[str]:
    """What `unique_name` avoided before it kept an index: every name, read from the list."""
    return {t.name for t in g.tensors}


def test_the_tensor_index_gives_what_the_list_gives_and_follows_every_change() -> None:
    """`unique_name` and `add_op` read an index of the tensors (`_TensorIndex`) instead of the
    whole list per call: after each way the list changes it holds what a rebuild holds."""
    g, x, c, r = small_graph()

    def agrees() -> None:
        assert g._tensor_set() == set(g.tensors)
        assert g._index.names(g.tensors) == _fresh_names(g)

    agrees()
    t = g.add_tensor("relu", (1,))  # a taken name: suffixed, and then known
    assert t.name != "relu" and t.name in g._index.names(g.tensors)
    agrees()
    g.tensors.append(Tensor("appended", (1,)))  # appended behind the graph's back
    agrees()
    assert g.add_tensor("appended", (1,)).name != "appended"
    g.tensors = [u for u in g.tensors if u.name != "appended"]  # a new list, shorter
    agrees()
    assert g.add_tensor("appended", (1,)).name == "appended"  # free again
    g.tensors.remove(x)  # shorter, the same list
    agrees()
    g.tensors.insert(0, x)  # as long as before, its last tensor moved
    agrees()
    last = g.tensors.pop()  # one removed and another added: as long, another last tensor
    g.tensors.append(Tensor("other", (1,)))
    agrees()
    assert last.name not in g._index.names(g.tensors)
    g.tensors.sort(key=lambda u: u.name)  # reordered in place: the same set and names
    agrees()
    y = Tensor("y_new", (1, 4, 4, 2))
    op = g.add_op("RELU", [r.output], [y])  # a new output tensor is registered once
    assert g.tensors.count(y) == 1 and op in r.output.consumers
    agrees()
    g.add_op("ADD", [y, y], [Tensor("sum", (1, 4, 4, 2))])  # one tensor read twice: kept once
    assert g.tensors.count(y) == 1
    agrees()


def test_a_snapshot_copies_each_tensor_as_the_constructor_would() -> None:
    """`snapshot` copies tensors without the constructor (`_unwired_copy`): every field is the
    one `Tensor(...)` sets, shapes as tuples of ints, and the copies unwired until rewired."""
    g, x, c, r = small_graph()
    x.shape = [np.int64(1), 4, 4, 3]  # (written as a list of numpy ints: normalized)
    x.shape_signature = [-1, 4, 4, 3]
    x.extra["k"] = 1
    twin = g.snapshot()
    for t, u in zip(g.tensors, twin.tensors):
        made = Tensor(t.name, t.shape, t.dtype, t.data, t.quantization,
                      shape_signature=t.shape_signature, is_variable=t.is_variable,
                      extra=dict(t.extra))  # fmt: skip
        assert vars(u).keys() == vars(made).keys()
        for k in ("name", "shape", "dtype", "shape_signature", "is_variable", "extra"):
            assert getattr(u, k) == getattr(made, k) and type(getattr(u, k)) is type(
                getattr(made, k)
            )
        assert all(type(d) is int for d in u.shape)
        assert u.data is t.data and u.quantization is t.quantization and u.extra is not t.extra
    assert _wiring(twin) == _wiring(g.snapshot())
