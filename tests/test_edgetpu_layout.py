"""The head RESHAPE / TRANSPOSE / SOFTMAX cut into pieces compiled models show (targets/edgetpu/
layout.py): a C2PSA-style head split, per-head transpose and merge, a softmax over more rows than
shown, and a DFL-style reshape; each undecided on the evidence before, every op shown mapped
after, bit-identical."""

from __future__ import annotations

import collections

import numpy as np
from rulekit import apply, ops, refusals

from tflfuse.ir import Graph, Model, Quantization, flatbuffer
from tflfuse.targets.edgetpu.broadcast import BROADCAST_LEGALIZATION
from tflfuse.targets.edgetpu.forms import form_of, gate, gated
from tflfuse.targets.edgetpu.layout import LAYOUT_LEGALIZATION, CutMeanIntoShownPieces
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
    return sum(o.runs_on == "edgetpu" for o in prediction.ops), len(prediction.ops)


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


def _se_mean(shape, keep: bool = True) -> bytes:
    """An int8 squeeze-excite pool: MEAN over the plane of NHWC `shape`, a finer output scale."""
    g = Graph("main")
    x = g.add_tensor("x", tuple(shape), "INT8", quantization=q(0.05, -20, "INT8"))
    g.inputs.append(x)
    axes = g.add_constant("axes", np.array([1, 2], np.int32))
    out_shape = (1, 1, 1, shape[3]) if keep else (1, shape[3])
    y = g.add_tensor("y", out_shape, "INT8", quantization=q(0.01, -90, "INT8"))
    g.add_op("MEAN", [x, axes], [y], {"keep_dims": keep})
    g.outputs = [y]
    g.validate()
    return flatbuffer.to_bytes(Model([g]))


def test_a_mean_over_more_than_shown_is_cut_along_its_channels() -> None:
    """[1, 28, 28, 120] (94080 elements; an int8 MEAN over a plane is shown up to 62720): two
    [1, 28, 28, 60] MEANs, every op shown mapped, within the declared step (TFLite's int8 MEAN
    rounds by channel count)."""
    for keep in (True, False):
        before = _se_mean((1, 28, 28, 120), keep)
        assert len(undecided(before)) == 1 and mapped(before) == (0, 1)
        after, model, result = apply(before, *LAYOUT_LEGALIZATION)
        assert [e.rule for e in result.events] == ["CutMeanIntoShownPieces"]
        assert ops(model) == ["SLICE", "MEAN", "SLICE", "MEAN", "CONCATENATION"]
        assert [op.outputs[0].shape[-1] for op in model.main.ops if op.type == "MEAN"] == [60, 60]
        assert undecided(after) == [] and mapped(after) == (5, 5)
        steps = CutMeanIntoShownPieces().int8_error_steps
        agreement = verify.compare(before, after, runs=3, int_atol=steps)
        assert agreement.ok and agreement.varies and agreement.max_abs <= steps, agreement


def test_a_mean_of_a_form_never_shown_is_not_cut() -> None:
    """A MEAN over W of an NCHW-like [1, 8, 14, 16] ("kkr") is shown at no size: pieces would be
    undecided too, so the rule refuses and says why."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 14, 16), "INT8", quantization=q(0.05, 0, "INT8"))
    g.inputs.append(x)
    y = g.add_tensor("y", (1, 8, 14, 1), "INT8", quantization=q(0.05, 0, "INT8"))
    g.add_op("MEAN", [x, g.add_constant("axes", np.array([3], np.int32))], [y], {"keep_dims": True})
    g.outputs = [y]
    before = flatbuffer.to_bytes(Model([g]))
    _, model, result = apply(before, *LAYOUT_LEGALIZATION)
    assert ops(model) == ["MEAN"]
    why = refusals(result, "CutMeanIntoShownPieces")
    assert len(why) == 1 and "no cut into at most 64 pieces along a kept axis" in why[0], why


def _se_product(c: int, hw: int, op_type: str = "MUL") -> bytes:
    """An int8 squeeze-excite product: the map [1, hw, hw, c] times the gate [1, 1, 1, c]."""
    g = Graph("main")
    x = g.add_tensor("x", (1, hw, hw, c), "INT8", quantization=q(0.05, -20, "INT8"))
    s = g.add_tensor("s", (1, 1, 1, c), "INT8", quantization=q(1 / 256, -128, "INT8"))
    g.inputs += [x, s]
    y = g.add_tensor("y", (1, hw, hw, c), "INT8", quantization=q(0.04, -10, "INT8"))
    g.add_op(op_type, [x, s], [y], {"fused_activation_function": "NONE"})
    g.outputs = [y]
    g.validate()
    return flatbuffer.to_bytes(Model([g]))


def test_a_broadcast_product_whose_tile_is_over_the_shown_size_is_cut_then_tiled() -> None:
    """[1, 14, 14, 480] x [1, 1, 1, 480]: its TILE would hold 6720 elements in its two innermost
    dims (shown up to 4224); two 240-channel halves, each tiled by TileBroadcastOperand: every op
    shown mapped, bit-identical."""
    before = _se_product(480, 14)
    assert mapped(before) == (0, 1)
    after, model, result = apply(before, *LAYOUT_LEGALIZATION, *BROADCAST_LEGALIZATION)
    fired = collections.Counter(e.rule for e in result.events)
    assert fired == {"CutBroadcastIntoShownPiecesMul": 1, "TileBroadcastOperandMul": 2}
    assert ops(model).count("TILE") == 2 and ops(model)[-1] == "CONCATENATION"
    assert undecided(after) == []
    n = len(ops(model))
    assert mapped(after) == (n, n)
    agreement = verify.compare(before, after, runs=3, int_atol=0)
    assert agreement.identical and agreement.varies, agreement


def test_a_broadcast_product_tiled_whole_is_left_to_tile_broadcast_operand() -> None:
    before = _se_product(120, 14)  # the tile [1, 14, 14, 120]: 1680 innermost, shown
    _, model, result = apply(before, *LAYOUT_LEGALIZATION)
    assert ops(model) == ["MUL"]
    assert any(
        "TileBroadcastOperand's" in r for r in refusals(result, "CutBroadcastIntoShownPiecesMul")
    )
