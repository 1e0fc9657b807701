"""The attention product in the forms onnx2tf writes at 320 and 640 px (issue 25): keys' tokens
on a batch axis read back through the TRANSPOSE that restores the plain product, and a float
TRANSPOSE over the element limit (which the quantized stage splits) no longer holding the
product's legalization back as a cut."""

from __future__ import annotations

import numpy as np
from rulekit import G, apply, assert_same_function, ops, refusals

from tflfuse.ir import flatbuffer
from tflfuse.targets.edgetpu.attention import LegalizeActivationMatmul
from tflfuse.targets.edgetpu.rules import split_once_quantized

RULE = "LegalizeActivationMatmul"


def _columns_on_batch(after_perm=(3, 1, 2, 0)) -> bytes:
    """q [1, 2, d, N] (adj_x) @ TRANSPOSE(k, [3, 1, 2, 0]) [N, 2, d, 1] -> [N, 2, N, 1], then
    TRANSPOSE(after_perm) and a SOFTMAX (onnx2tf's q^T k of YOLO26's attention)."""
    n, d = 6, 4
    g = G()
    q = g.unary("TANH", g.input((1, 2, d, n), "q"))
    k = g.unary("TANH", g.input((1, 2, d, n), "k"))
    kt = g.op("TRANSPOSE", [k, g.const(np.array([3, 1, 2, 0]), "perm")], (n, 2, d, 1))
    prod = g.op("BATCH_MATMUL", [q, kt], (n, 2, n, 1), adj_x=True, adj_y=False)
    moved = tuple((n, 2, n, 1)[p] for p in after_perm)
    back = g.op("TRANSPOSE", [prod, g.const(np.array(after_perm), "perm2")], moved)
    return g.bytes(g.op("SOFTMAX", [back], moved, beta=1.0))


def test_keys_on_a_batch_axis_are_read_as_the_plain_product() -> None:
    """The product is written straight into the TRANSPOSE that restores [1, H, N, N]: no
    BATCH_MATMUL and no 4-D TRANSPOSE left, the same function."""
    before = _columns_on_batch()
    after, model, result = apply(before, LegalizeActivationMatmul())
    assert result.fired() == {RULE: 1}
    kinds = ops(model)
    assert "BATCH_MATMUL" not in kinds
    four_d = [
        op for op in model.main.ops if op.type == "TRANSPOSE" and len(op.inputs[0].shape) == 4
    ]
    assert four_d == []
    assert kinds[-1] == "SOFTMAX"
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


def test_keys_on_a_batch_axis_with_another_transpose_after_are_refused() -> None:
    """Read back by a TRANSPOSE that does not give the plain product: left whole."""
    before = _columns_on_batch(after_perm=(3, 2, 1, 0))
    _, model, result = apply(before, LegalizeActivationMatmul())
    assert "BATCH_MATMUL" in ops(model)
    assert refusals(result, RULE) == ["its operands broadcast their batch dimensions"]


def _behind_a_transpose(shape: tuple[int, ...]) -> bytes:
    """TANH(x) -> TRANSPOSE (0, 3, 1, 2) of `shape` -> RESHAPE to heads -> q.k^T."""
    g = G()
    x = g.unary("TANH", g.input(shape, "x"))
    moved = (shape[0], shape[3], shape[1], shape[2])
    t = g.op("TRANSPOSE", [x, g.const(np.array([0, 3, 1, 2]), "perm")], moved)
    tokens = shape[1] * shape[2]
    heads = g.op("RESHAPE", [t, g.const(np.array([1, 2, shape[3] // 2, tokens]), "s")],
                 (1, 2, shape[3] // 2, tokens))  # fmt: skip
    y = g.unary("TANH", heads)
    return g.bytes(g.op("BATCH_MATMUL", [heads, y], (1, 2, tokens, tokens), adj_x=True))


def test_a_float_transpose_the_quantized_stage_splits_is_no_cut() -> None:
    """[1, 20, 20, 256] (102400 elements, over the TRANSPOSE limit) is split into mapped pieces
    once quantized: the product behind it is legalized in float, where it is calibrated."""
    before = _behind_a_transpose((1, 20, 20, 256))
    model = flatbuffer.from_bytes(before)
    [transpose] = [op for op in model.main.ops if op.type == "TRANSPOSE"]
    assert split_once_quantized(transpose)
    after, model, result = apply(before, LegalizeActivationMatmul())
    assert result.fired() == {RULE: 1}
    assert "BATCH_MATMUL" not in ops(model)
    assert_same_function(before, after, atol=1e-4, rtol=1e-4)


def test_a_transpose_no_split_maps_still_cuts() -> None:
    """[1, 4, 50000, 1] -> [1, 1, 4, 50000]: however it is cut, the joined result's two
    innermost dimensions (200000) are over the row limit: it stays a cut."""
    g = G()
    x = g.unary("TANH", g.input((1, 4, 50000, 1), "x"))
    g.op("TRANSPOSE", [x, g.const(np.array([0, 3, 1, 2]), "perm")], (1, 1, 4, 50000))
    [transpose] = [op for op in g.graph.ops if op.type == "TRANSPOSE"]
    assert not split_once_quantized(transpose)


def test_the_keys_transpose_is_no_cut_for_the_gate() -> None:
    """The keys' TRANSPOSE to a batch axis ([N, H, d, 1]: a dimension > 1 outside the 3
    innermost, refused on its own) is read through by the legalization, so the gate lifts it;
    a TRANSPOSE also read by another op is not lifted."""
    from tflfuse.ir.flatbuffer import from_bytes
    from tflfuse.targets.edgetpu.attention import read_through

    graph = from_bytes(_columns_on_batch()).main
    keys = [op for op in graph.ops if op.type == "TRANSPOSE" and op.outputs[0].consumers
            and op.outputs[0].consumers[0].type == "BATCH_MATMUL"]  # fmt: skip
    assert keys and all(read_through(op, graph) for op in keys)
    assert not any(read_through(op, graph) for op in graph.ops if op not in keys)


def test_a_chain_of_layout_ops_reaching_only_products_is_read_through() -> None:
    """The heads on a batch axis through a TRANSPOSE and a RESHAPE ([1, 2, 32, 8] -> [2, 8, 1,
    32] -> [2, 8, 32]) into q.k^T: both are lifted; once the RESHAPE is also read by a TANH,
    neither is (the chain then stays, and its cut is real)."""
    from tflfuse.targets.edgetpu.attention import read_through

    for also_read in (False, True):
        g = G()
        x = g.unary("TANH", g.input((1, 2, 32, 8), "x"))
        t = g.op("TRANSPOSE", [x, g.const(np.array([1, 3, 0, 2]), "perm")], (2, 8, 1, 32))
        q = g.op("RESHAPE", [t, g.const(np.array([2, 8, 32]), "s")], (2, 8, 32))
        k = g.unary("TANH", g.input((2, 8, 32), "k"))
        y = g.op("BATCH_MATMUL", [q, k], (2, 8, 8), adj_y=True)
        outs = [y, g.unary("RELU", q)] if also_read else [y]
        graph = flatbuffer.from_bytes(g.bytes(*outs)).main
        layout = [op for op in graph.ops if op.type in ("TRANSPOSE", "RESHAPE")]
        assert len(layout) == 2
        assert [read_through(op, graph) for op in layout] == [not also_read] * 2
