"""Op forms as the Edge TPU compiler sees them (tflfuse/targets/edgetpu/forms.py), the table of
what compiled models show (delegates/edgetpu_forms.toml) and the gate the predictor applies."""

from __future__ import annotations

import numpy as np
import pytest
import tomllib
from conftest import ORACLE

from tflfuse.ir import Graph, Model, Op, Tensor
from tflfuse.targets import capability, format_prediction, predict_edgetpu
from tflfuse.targets.edgetpu import predict as predict_module
from tflfuse.targets.edgetpu.forms import (
    Form,
    FormEntry,
    FormTable,
    Size,
    form_of,
    gate,
    gated,
    load_table,
    observe_pair,
    observe_twin,
    shown_sizes,
    size_of,
)

STATUS = capability("edgetpu")["status"]


def _act(g: Graph, name: str, shape: tuple[int, ...], dtype: str = "INT8") -> Tensor:
    return g.add_tensor(name, shape, dtype)


def _binary(g: Graph, kind: str, a: Tensor, b: Tensor, shape: tuple[int, ...]) -> Op:
    y = _act(g, f"{kind.lower()}_{len(g.ops)}", shape, a.dtype)
    return g.add_op(kind, [a, b], [y], {"fused_activation_function": "NONE"})


def _reduce(g: Graph, kind: str, x: Tensor, axes: list[int], keep: bool) -> Op:
    ax = g.add_constant(f"axes_{len(g.ops)}", np.array(axes, np.int32))
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else ()
    if not keep:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    y = _act(g, f"{kind.lower()}_{len(g.ops)}", shape, x.dtype)
    return g.add_op(kind, [x, ax], [y], {"keep_dims": keep})


def _transpose(g: Graph, x: Tensor, perm: tuple[int, ...]) -> Op:
    p = g.add_constant(f"perm_{len(g.ops)}", np.array(perm, np.int32))
    y = _act(g, f"transpose_{len(g.ops)}", tuple(x.shape[i] for i in perm), x.dtype)
    return g.add_op("TRANSPOSE", [x, p], [y])


# -- signatures ------------------------------------------------------------------------------------
def test_a_squeeze_excitation_product_is_a_broadcast_of_two_activations() -> None:
    g = Graph()
    x, s = _act(g, "x", (1, 8, 8, 16)), _act(g, "s", (1, 1, 1, 16))
    form = form_of(_binary(g, "MUL", x, s, (1, 8, 8, 16)))
    assert form.key == "MUL(a:INT8[xxx], a:INT8[11x]) -> INT8 one-sided"
    assert gated(form)


def test_broadcast_patterns_name_each_side() -> None:
    g = Graph()
    a, b = _act(g, "a", (1, 8, 1, 16)), _act(g, "b", (1, 1, 8, 16))
    two = form_of(_binary(g, "MUL", a, b, (1, 8, 8, 16)))
    assert two.operands == ("a:INT8[x1x]", "a:INT8[1xx]") and two.detail == "two-sided"
    c = _act(g, "c", (1, 8, 8, 16))
    same = form_of(_binary(g, "ADD", c, c, (1, 8, 8, 16)))
    assert same.detail == "same" and not gated(same)  # a plain residual ADD is not gated
    bias = g.add_constant("bias", np.zeros((16,), np.int8), "INT8")
    const = form_of(_binary(g, "ADD", c, bias, (1, 8, 8, 16)))
    assert const.operands == ("a:INT8[xxx]", "c:INT8[11x]") and not gated(const)


def test_reductions_name_their_axes_among_the_non_trivial_dims() -> None:
    g = Graph()
    x = _act(g, "x", (1, 8, 8, 16))
    assert form_of(_reduce(g, "MEAN", x, [1, 2], keep=True)).detail == "axes=rrk keep"
    assert form_of(_reduce(g, "SUM", x, [3], keep=False)).detail == "axes=kkr"
    heads = _act(g, "heads", (1, 4, 64, 16))  # [1, h, N, d]: batch 1 is not a dim
    assert form_of(_reduce(g, "SUM", heads, [-1], keep=True)).detail == "axes=kkr keep"


def test_transpose_softmax_reshape_depthwise_details() -> None:
    g = Graph()
    x = _act(g, "x", (1, 4, 16, 32))
    assert form_of(_transpose(g, x, (0, 1, 3, 2))).detail == "perm=021"
    y = _act(g, "y", (1, 4, 16, 32))
    softmax = form_of(g.add_op("SOFTMAX", [x], [y], {"beta": 1.0}))
    assert softmax.detail == "nt=3 last=x" and gated(softmax)
    flat = _act(g, "flat", (1, 64, 32))
    shape = g.add_constant("shape", np.array([1, 64, 32], np.int32))
    reshape = form_of(g.add_op("RESHAPE", [x, shape], [flat]))
    assert reshape.detail == "nt=3>2" and gated(reshape)
    row = _act(g, "row", (1, 2048))
    flatten = form_of(g.add_op("RESHAPE", [x, shape], [row]))
    assert flatten.detail == "nt=3>1" and not gated(flatten)  # a flatten is not a head split
    w = g.add_constant("w", np.ones((1, 3, 3, 64), np.int8), "INT8")
    b = g.add_constant("b", np.zeros((64,), np.int32), "INT32")
    dw = g.add_op("DEPTHWISE_CONV_2D", [x, w, b], [_act(g, "dw", (1, 4, 16, 64))],
                  {"depth_multiplier": 2, "fused_activation_function": "NONE"})  # fmt: skip
    assert form_of(dw).detail == "dm=2" and gated(form_of(dw))
    assert size_of(dw) == Size(4096, 1024)


def test_a_pack_of_many_inputs_names_its_count_and_axis() -> None:
    g = Graph()
    parts = [_act(g, f"p{i}", (1, 16)) for i in range(128)]
    pack = g.add_op("PACK", parts, [_act(g, "packed", (128, 1, 16))], {"axis": 0})
    assert form_of(pack).key == "PACK(a:INT8) -> INT8 n=128 axis=outer"


def test_a_float_op_is_judged_as_it_will_be_once_quantized() -> None:
    g = Graph()
    x, s = _act(g, "x", (1, 8, 8, 16), "FLOAT32"), _act(g, "s", (1, 1, 1, 16), "FLOAT32")
    op = _binary(g, "MUL", x, s, (1, 8, 8, 16))
    assert form_of(op).output == "FLOAT32"
    assert form_of(op, as_quantized=True).key == "MUL(a:INT8[xxx], a:INT8[11x]) -> INT8 one-sided"
    w = g.add_constant("w", np.ones((8, 1, 1, 16), np.float32))
    b = g.add_constant("b", np.zeros((8,), np.float32))
    conv = g.add_op("CONV_2D", [x, w, b], [_act(g, "c", (1, 8, 8, 8), "FLOAT32")],
                    {"fused_activation_function": "NONE"})  # fmt: skip
    assert form_of(conv, as_quantized=True).operands == ("a:INT8", "c:INT8", "c:INT32")


# -- the gate --------------------------------------------------------------------------------------
def _table(form: Form, mapped: list[Size], refused: list[Size] = ()) -> FormTable:
    entry = FormEntry(form, len(mapped), len(refused), list(mapped), list(refused), ["test"])
    return FormTable({form.key: entry})


def test_the_gate_answers_mapped_refused_or_undecided_by_form_and_size() -> None:
    g = Graph()
    x, s = _act(g, "x", (1, 8, 8, 16)), _act(g, "s", (1, 1, 1, 16))
    op = _binary(g, "MUL", x, s, (1, 8, 8, 16))  # 1024 elements, 128 in the two inner dims
    form = form_of(op)
    assert gate(op, _table(form, [Size(2048, 256)])).answer == "mapped"
    assert gate(op, _table(form, [Size(512, 128)])).answer == "undecided"  # seen smaller only
    assert gate(op, _table(form, [], [Size(512, 64)])).answer == "refused"
    assert gate(op, _table(form, [], [Size(4096, 64)])).answer == "undecided"
    assert gate(op, FormTable()).answer == "undecided"
    wide = _table(form, [Size(512, 512), Size(4096, 64), Size(256, 64)])
    assert shown_sizes(form, wide) == [Size(512, 512), Size(4096, 64)]  # (256, 64) is inside
    other = Form("MUL", ("a:INT8[xxx]", "a:INT8[xxx]"), "INT8", "same")
    assert gate(op, _table(other, [Size(10**6, 10**4)])).answer == "undecided"
    uint8 = form_of(op).eight_bit()  # the same form in uint8 shows it too
    shown = Form(uint8.op, tuple(o.replace("INT8", "UINT8") for o in uint8.operands), "UINT8",
                 uint8.detail)  # fmt: skip
    verdict = gate(op, _table(shown, [Size(2048, 256)]))
    assert verdict.answer == "mapped" and "MUL(" in verdict.reason


def test_the_table_round_trips_through_toml() -> None:
    form = Form("SUM", ("a:INT8", "c:INT32"), "INT8", "axes=kkr keep")
    entry = FormEntry(form, 3, 1, [Size(4096, 512), Size(100, 1000)], [Size(9, 9)], ["lic x3"])
    table = FormTable({form.key: entry}, header='a "header"\nline two')
    text = table.to_toml()
    back = FormTable.from_dict(tomllib.loads(text))
    assert [e.to_dict() for e in back.entries.values()] == [entry.to_dict()]
    assert text.startswith('# a "header"\n# line two\n')


def _se_model() -> Model:
    """MEAN over the plane then MUL of the input by it: the squeeze-excitation product."""
    g = Graph()
    x = _act(g, "x", (1, 8, 8, 16))
    mean = _reduce(g, "MEAN", x, [1, 2], keep=True)
    mul = _binary(g, "MUL", x, mean.outputs[0], (1, 8, 8, 16))
    g.inputs, g.outputs = [x], [mul.outputs[0]]
    return Model([g])


def test_the_predictor_counts_an_undecided_form_on_the_cpu_and_names_the_other_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _se_model()
    mean, mul = model.main.ops
    shown_mean = _table(form_of(mean), [Size(10**5, 10**4)])
    monkeypatch.setattr(predict_module, "load_table", lambda: shown_mean)
    p = predict_edgetpu(model)
    assert (p.mapped, p.cpu) == (1, 1)
    assert p.ops[1].reason.startswith("undecided: MUL(a:INT8[xxx], a:INT8[11x])")
    [reading] = p.other_readings
    assert reading.ops == [1] and reading.mapped == 2
    assert "no compiled model shows" in reading.reading and "op 1 MUL(" in reading.reading
    assert "(or 2 on the other reading of op 1" in format_prediction(p, "se.tflite")
    both = FormTable({**shown_mean.entries, **_table(form_of(mul), [Size(2048, 256)]).entries})
    monkeypatch.setattr(predict_module, "load_table", lambda: both)
    p = predict_edgetpu(model)
    assert (p.mapped, p.other_readings) == (2, [])
    refused = FormTable({**shown_mean.entries, **_table(form_of(mul), [], [Size(8, 8)]).entries})
    monkeypatch.setattr(predict_module, "load_table", lambda: refused)
    p = predict_edgetpu(model)
    assert (p.mapped, p.other_readings) == (1, [])
    assert p.ops[1].status == STATUS["limitation"] and "refuses it on its own" in p.ops[1].reason


def test_the_other_reading_maps_the_undecided_ops_another_undecided_op_cuts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    g = Graph()
    x = _act(g, "x", (1, 8, 8, 16))
    relu = g.add_op("RELU", [x], [_act(g, "r", (1, 8, 8, 16))])
    mean = _reduce(g, "MEAN", relu.outputs[0], [1, 2], keep=True)
    mul = _binary(g, "MUL", relu.outputs[0], mean.outputs[0], (1, 8, 8, 16))
    g.inputs, g.outputs = [x], [mul.outputs[0]]
    monkeypatch.setattr(predict_module, "load_table", lambda: FormTable())
    p = predict_edgetpu(Model([g]))
    # MEAN (undecided) reads the segment: it cuts, and MUL (undecided too) is after the cut
    assert p.mapped == 1 and p.ops[2].status == STATUS["after_cut"]
    assert [(r.ops, r.mapped) for r in p.other_readings] == [([1, 2], 3)]


# -- what compiled models show ----------------------------------------------------------------
def test_observations_tell_own_refusals_from_ops_after_the_cut() -> None:
    model = _se_model()
    g = model.main
    tail = _binary(g, "ADD", g.ops[1].outputs[0], g.ops[1].outputs[0], (1, 8, 8, 16))
    seen = observe_pair(g.ops, [1, 2], g.inputs)
    # MEAN mapped; MUL (reads the input and MEAN's output) refused on its own; ADD says nothing
    assert [(o.index, o.outcome) for o in seen] == [(0, "mapped"), (1, "refused")]
    rows = [("MUL", 1, STATUS["after_cut"]), ("ADD", 1, STATUS["limitation"])]
    logged = observe_pair(g.ops, [1, 2], g.inputs, rows)
    assert [(o.index, o.outcome) for o in logged] == [
        (0, "mapped"),
        (1, "accepted"),
        (2, "refused"),
    ]
    assert tail.type == "ADD"


def test_a_twin_shows_the_refusals_reading_its_custom_op() -> None:
    g = Graph()
    x = _act(g, "x", (1, 8, 8, 16))
    seg = _act(g, "seg", (1, 8, 8, 16))
    g.add_op("CUSTOM", [x], [seg], custom_code="edgetpu-custom-op")
    first = _transpose(g, seg, (0, 2, 1, 3))
    _transpose(g, first.outputs[0], (0, 2, 1, 3))
    seen = observe_twin(g.ops, "edgetpu-custom-op", [x])
    assert [(o.index, o.form.detail, o.outcome) for o in seen] == [(1, "perm=102", "refused")]


@pytest.mark.skipif(not ORACLE.is_dir(), reason="../shared/oracle is absent")
def test_every_op_a_licensed_twin_maps_is_shown_mapped_by_the_committed_table() -> None:
    from tflfuse.targets.edgetpu.truth import find_pairs, read_truth

    table = load_table()
    pairs = [*find_pairs(ORACLE), *find_pairs(ORACLE.parent / "edgetpu-more")]
    assert len(pairs) >= 38
    checked = 0
    for pair in pairs:
        truth = read_truth(pair)
        for i, op in enumerate(truth.model.main.ops):
            if i in truth.cpu_ops:
                continue
            verdict = gate(op, table)
            assert verdict.answer == "mapped", (pair.key, i, verdict.reason)
            checked += 1
    assert checked > 800
