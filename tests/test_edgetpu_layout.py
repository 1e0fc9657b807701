"""The head RESHAPE / TRANSPOSE / SOFTMAX cut into pieces compiled models show (targets/edgetpu/
layout.py): a C2PSA-style head split, per-head transpose and merge, a softmax over more rows than
shown, and a DFL-style reshape; each undecided on the evidence before, every op shown mapped
after, bit-identical."""

from __future__ import annotations

import collections

import numpy as np
from rulekit import apply, ops, refusals

from tflfuse.ir import Graph, Model, Quantization, flatbuffer
from tflfuse.targets.edgetpu.forms import form_of, gate, gated
from tflfuse.targets.edgetpu.layout import LAYOUT_LEGALIZATION
from tflfuse.targets.edgetpu.predict import predict_edgetpu
from tflfuse.targets.edgetpu.rules import SplitOversizedTranspose
from tflfuse.verification import verify


def q(scale: float, zero: int, dtype: str) -> Quantization | None:
    if dtype == "FLOAT32":
        return None
    return Quantization(scale=np.array([scale], np.float32), zero_point=np.array([zero], np.int64))


def chain(x_shape, steps, dtype: str = "INT8") -> bytes:
    """x, then each step (op type, constant or None, output shape) in turn; the same
    quantization throughout but for SOFTMAX's output."""
    g = Graph("main")
    t = g.add_tensor("x", tuple(x_shape), dtype, quantization=q(0.05, 3, dtype))
    g.inputs.append(t)
    for i, (op_type, const, shape) in enumerate(steps):
        ins = [t] + ([g.add_constant(f"c{i}", np.asarray(const, np.int32))] if const else [])
        soft = op_type == "SOFTMAX"
        quant = q(1 / 256, -128, dtype) if soft else t.quantization
        out = g.add_tensor(f"t{i}", tuple(shape), dtype, quantization=quant)
        g.add_op(op_type, ins, [out], {"beta": 1.0} if soft else {})
        t = out
    g.outputs = [t]
    g.validate()
    return flatbuffer.to_bytes(Model([g]))


def mapped(data: bytes) -> tuple[int, int]:
    """Ops predicted on the Edge TPU (the evidence reading: undecided forms on the CPU), ops."""
    model = flatbuffer.from_bytes(data)
    prediction = predict_edgetpu(model)
    return sum(o.target == "edgetpu" for o in prediction.ops), len(prediction.ops)


def undecided(data: bytes) -> list[str]:
    model = flatbuffer.from_bytes(data)
    return [
        gate(op).reason
        for op in model.main.ops
        if gated(form_of(op)) and gate(op).answer != "mapped"
    ]


ATTENTION = [  # YOLO11n-320's C2PSA head split, per-head transpose and merge
    ("TRANSPOSE", [0, 3, 1, 2], (1, 256, 10, 10)),
    ("RESHAPE", [1, 2, 128, 100], (1, 2, 128, 100)),  # nt=3>3, 12800 innermost
    ("TRANSPOSE", [0, 1, 3, 2], (1, 2, 100, 128)),  # perm=021: never seen mapped
    ("TRANSPOSE", [0, 2, 1, 3], (1, 100, 2, 128)),  # perm=102: never seen mapped
    ("RESHAPE", [1, 10, 10, 256], (1, 10, 10, 256)),
]


def test_a_head_split_transpose_and_merge_map_in_shown_pieces_bit_identically() -> None:
    before = chain((1, 10, 10, 256), ATTENTION)
    assert len(undecided(before)) == 3
    assert mapped(before) == (1, 5)
    after, model, result = apply(before, *LAYOUT_LEGALIZATION)
    fired = collections.Counter(e.rule for e in result.events)
    assert fired == {"CutReshapeIntoShownBlocks": 1, "CutTransposeIntoShownForms": 2}, refusals(
        result, "CutTransposeIntoShownForms"
    )
    assert undecided(after) == []
    n = len(ops(model))
    assert mapped(after) == (n, n)
    agreement = verify.compare(before, after, runs=3, int_atol=0)
    assert agreement.identical and agreement.varies, agreement


def test_a_softmax_over_more_rows_than_shown_is_cut_along_the_rows() -> None:
    before = chain((1, 2, 400, 400), [("SOFTMAX", None, (1, 2, 400, 400))])
    assert len(undecided(before)) == 1  # 160000 innermost, seen mapped up to 134400
    after, model, result = apply(before, *LAYOUT_LEGALIZATION)
    assert [e.rule for e in result.events] == ["CutSoftmaxIntoShownRows"]
    assert undecided(after) == [] and ops(model).count("SOFTMAX") == 2
    n = len(ops(model))
    assert mapped(after) == (n, n)
    agreement = verify.compare(before, after, runs=3, int_atol=0)
    assert agreement.identical and agreement.varies, agreement


def test_a_dfl_reshape_and_transpose_are_cut_along_the_anchors() -> None:
    steps = [
        ("RESHAPE", [1, 4, 16, 2100], (1, 4, 16, 2100)),  # nt=2>3 over 86016 seen
        ("TRANSPOSE", [0, 1, 3, 2], (1, 4, 2100, 16)),  # perm=021
    ]
    before = chain((1, 64, 2100), steps)
    assert len(undecided(before)) == 2  # the TRANSPOSE is also over the table's 69696
    after, model, result = apply(before, *LAYOUT_LEGALIZATION, SplitOversizedTranspose())
    assert undecided(after) == []
    n = len(ops(model))
    assert mapped(after) == (n, n)
    assert ops(model).count("TRANSPOSE") <= 64  # the cut is bounded
    agreement = verify.compare(before, after, runs=2, int_atol=0)
    assert agreement.identical and agreement.varies, agreement


def test_a_float_graph_waits_for_quantization() -> None:
    before = chain((1, 10, 10, 256), ATTENTION[:3], dtype="FLOAT32")
    _, model, result = apply(before, *LAYOUT_LEGALIZATION)
    assert ops(model) == ["TRANSPOSE", "RESHAPE", "TRANSPOSE"]
    assert any("float graph" in r for r in refusals(result, "CutReshapeIntoShownBlocks"))


def test_the_status_memo_follows_an_op_changed_in_place() -> None:
    """predict's per-op memo: a status is recomputed when the op's tensors or constants change."""
    from tflfuse.targets.edgetpu.predict import statuses_once_quantized

    model = flatbuffer.from_bytes(
        chain((1, 8, 8, 16), [("TRANSPOSE", [0, 3, 1, 2], (1, 16, 8, 8))])
    )
    graph = model.main
    assert statuses_once_quantized(graph)[0][0] == "mapped"
    op = graph.ops[0]
    op.inputs[1].data[:] = [0, 1, 3, 2]  # another perm, written in place
    op.inputs[0].shape, op.outputs[0].shape = (1, 300, 300, 16), (1, 300, 16, 300)
    assert statuses_once_quantized(graph)[0][0] != "mapped"  # 1440000 elements moved
