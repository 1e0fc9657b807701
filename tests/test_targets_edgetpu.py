"""The Edge TPU mapping predictor: checked against the real compiler (the Coral oracle pairs) and on
tiny graphs for each rule of delegates/edgetpu.toml (cut semantics, types, sizes, statuses)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import ORACLE, needs_oracle, oracle_models

from tflfuse.ir import Graph, Model, Quantization, Tensor, flatbuffer
from tflfuse.targets import (
    capability,
    edgetpu_op_status,
    edgetpu_shape_refusal,
    format_prediction,
    predict,
    predict_edgetpu,
)
from tflfuse.targets import target as target_named

STATUS = capability("edgetpu")["status"]


def _label(op) -> str:
    return op.custom_code or op.type


@needs_oracle()
@pytest.mark.parametrize("cpu_model", oracle_models(compiled=False), ids=lambda p: p.stem)
def test_predicted_cpu_ops_are_exactly_those_the_compiler_left_out(cpu_model: Path) -> None:
    model = flatbuffer.load(cpu_model)
    twin = flatbuffer.load(ORACLE / f"{cpu_model.stem}_edgetpu.tflite")
    custom = [op for op in twin.main.ops if op.custom_code == "edgetpu-custom-op"]
    assert len(custom) == 1
    left_out = [_label(op) for op in twin.main.ops if op.custom_code != "edgetpu-custom-op"]
    prediction = predict(model, target_named("edgetpu"))
    predicted = [_label(model.main.ops[i]) for i in prediction.cpu_ops()]
    assert predicted == left_out
    # the CPU ops of the twin read exactly what they read in the original (same outputs too)
    cpu_outputs = [op.outputs[0].name for op in twin.main.ops if op not in custom]
    assert cpu_outputs == [model.main.ops[i].outputs[0].name for i in prediction.cpu_ops()]
    assert prediction.mapped + prediction.cpu == len(model.main.ops)


@needs_oracle()
def test_deeplab_cut_is_the_align_corners_resize_and_the_rest_follows() -> None:
    model = flatbuffer.load(ORACLE / "deeplabv3_mnv2_dm05_pascal_quant.tflite")
    p = predict(model, target_named("edgetpu"))
    assert (p.mapped, p.cpu) == (64, 8)
    first = p.ops[64]
    assert first.op == "RESIZE_BILINEAR"
    assert first.status == STATUS["limitation"]
    assert "align_corners" in first.reason
    assert p.ops[66].status == STATUS["after_cut"]
    # ARG_MAX writes an INT64 index: the compiler reports the data type before the op type
    assert p.ops[71].status == STATUS["data_type"]
    assert 0 < p.memory["parameter_bytes"] < p.memory["cache_bytes"]
    assert p.memory["off_chip_bytes"] == 0


@needs_oracle()
def test_posenet_custom_decoder_stays_on_the_cpu_for_its_float_outputs() -> None:
    """Its four outputs are FLOAT32: the data type is judged before the op type, a custom op's
    too (the logs of an SSD's TFLite_Detection_PostProcess, compilers 2.1 and 16)."""
    model = flatbuffer.load(ORACLE / "posenet_mobilenet_v1_075_353_481_16_quant_decoder.tflite")
    p = predict(model, target_named("edgetpu"))
    assert [o.op for o in p.ops if o.runs_on == "cpu"] == ["PosenetDecoderOp"]
    assert p.ops[-1].status == STATUS["data_type"]


# -- tiny graphs ---------------------------------------------------------------------------------
Q = Quantization(scale=np.array([0.05], np.float32), zero_point=np.array([0], np.int64))


def act(g: Graph, name: str, shape, dtype: str = "INT8") -> Tensor:
    return g.add_tensor(name, shape, dtype, quantization=Q if dtype in ("INT8", "UINT8") else None)


def conv(g: Graph, x: Tensor, channels: int, act_fn: str = "NONE", name: str = "conv") -> Tensor:
    w = g.add_constant(f"{name}_w", np.ones((channels, 1, 1, x.shape[-1]), np.int8))
    b = g.add_constant(f"{name}_b", np.zeros((channels,), np.int32))
    y = act(g, name, (*x.shape[:3], channels))
    g.add_op(
        "CONV_2D",
        [x, w, b],
        [y],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": act_fn},
    )
    return y


def model_of(g: Graph, inputs, outputs) -> Model:
    g.inputs, g.outputs = list(inputs), list(outputs)
    return Model([g])


def test_ops_after_an_unsupported_op_run_on_the_cpu_even_when_supported() -> None:
    g = Graph("main")
    x = act(g, "x", (1, 8, 8, 4))
    y = conv(g, x, 8, "RELU6", "c1")
    z = act(g, "leaky", y.shape)
    g.add_op("LEAKY_RELU", [y], [z], {"alpha": 0.1})
    out = conv(g, z, 4, name="c2")
    p = predict(model_of(g, [x], [out]), target_named("edgetpu"))
    assert [o.runs_on for o in p.ops] == ["edgetpu", "cpu", "cpu"]
    assert [o.status for o in p.ops] == [
        STATUS["mapped"],
        STATUS["unsupported"],
        STATUS["after_cut"],
    ]
    assert "LEAKY_RELU" in p.ops[2].reason
    assert p.memory["parameter_bytes"] == 8 * 4 + 8 * 4  # c1 weights (int8) + bias (int32)


def test_float_io_leaves_boundary_quantize_ops_on_the_cpu_without_cutting() -> None:
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 4), "FLOAT32")
    xq = act(g, "xq", x.shape)
    g.add_op("QUANTIZE", [x], [xq])
    y = conv(g, xq, 8)
    out = g.add_tensor("out", y.shape, "FLOAT32")
    g.add_op("DEQUANTIZE", [y], [out])
    p = predict(model_of(g, [x], [out]), target_named("edgetpu"))
    assert [o.runs_on for o in p.ops] == ["cpu", "edgetpu", "cpu"]
    # the compiler's logs: a float -> int8 QUANTIZE is "otherwise supported, but not mapped"
    assert p.ops[0].status == STATUS["limitation"]
    assert p.ops[2].status == STATUS["data_type"]  # DEQUANTIZE writes float


def test_uint8_io_maps_the_boundary_quantize_ops() -> None:
    g = Graph("main")
    x = act(g, "x", (1, 8, 8, 4), "UINT8")
    xq = act(g, "xq", x.shape)
    g.add_op("QUANTIZE", [x], [xq])
    y = conv(g, xq, 8)
    out = act(g, "out", y.shape, "UINT8")
    g.add_op("QUANTIZE", [y], [out])
    p = predict(model_of(g, [x], [out]), target_named("edgetpu"))
    assert p.cpu == 0 and p.mapped == 3


def test_float_op_inside_the_graph_cuts_it_with_the_data_type_status() -> None:
    g = Graph("main")
    x = g.add_tensor("x", (1, 4, 4, 2), "FLOAT32")
    y = g.add_tensor("y", x.shape, "FLOAT32")
    g.add_op("RELU", [x], [y])
    p = predict(model_of(g, [x], [y]), target_named("edgetpu"))
    assert p.ops[0].status == STATUS["data_type"] and p.cpu == 1


def _single(op_type, inputs_shapes, out_shape, options=None, consts=()) -> tuple:
    g = Graph("main")
    ins = [act(g, f"in{i}", s) for i, s in enumerate(inputs_shapes)]
    ins += list(consts)
    out = act(g, "out", out_shape)
    op = g.add_op(op_type, ins, [out], options or {})
    return op, g


def test_mean_over_a_large_plane_is_a_limitation_and_a_small_one_maps() -> None:
    axes = Graph("tmp").add_constant("axes", np.array([1, 2], np.int32))
    op, _ = _single("MEAN", [(1, 256, 128, 8)], (1, 1, 1, 8), {"keep_dims": True}, [axes])
    assert edgetpu_op_status(op)[0] == "limitation"
    axes2 = Graph("tmp").add_constant("axes", np.array([1, 2], np.int32))
    op, _ = _single("MEAN", [(1, 64, 128, 8)], (1, 1, 1, 8), {"keep_dims": True}, [axes2])
    assert edgetpu_op_status(op)[0] == "mapped"


def test_a_dimension_outside_the_three_innermost_is_an_unsupported_rank() -> None:
    """Coral's requirement ("only the 3 innermost dimensions may have a size greater than 1"),
    with the compiler's own words for it; an outer dimension of 1 is fine."""
    op, _ = _single("RELU", [(2, 4, 4, 4)], (2, 4, 4, 4))
    key, reason = edgetpu_op_status(op)
    assert key == "rank" and "3 innermost" in reason
    assert STATUS[key] == "Tensor has unsupported rank (up to 3 innermost dimensions mapped)"
    op, _ = _single("RELU", [(2, 1, 1, 4)], (2, 1, 1, 4))  # two dimensions > 1, one outer
    assert edgetpu_op_status(op)[0] == "rank"
    op, _ = _single("RELU", [(1, 1, 4, 4, 4)], (1, 1, 4, 4, 4))
    assert edgetpu_op_status(op)[0] == "mapped"
    # what a float graph's op will be once quantized: refused for its shape alone
    float_op, _ = _single("RELU", [(2, 1, 1, 4)], (2, 1, 1, 4))
    assert "outside its 3 innermost" in str(edgetpu_shape_refusal(float_op))
    assert edgetpu_shape_refusal(op) is None


def _dequantize(g: Graph, shape: tuple[int, ...], name: str) -> Tensor:
    w = g.add_constant(f"{name}_fp16", np.ones(shape, np.float16))
    y = g.add_tensor(name, shape, "FLOAT32")
    g.add_op("DEQUANTIZE", [w], [y])
    return y


def test_the_rank_is_judged_before_the_data_type_but_not_on_a_filter() -> None:
    """An fp16 model's DEQUANTIZE of a [O, kh, kw, I] filter (O > 1) is an unsupported rank,
    though it writes float; one of [1, N, 1, 2] is refused for its data type, and the CONV_2D
    reading the computed filter for its data type too (the compiler 16 log of a fp16
    YOLOv5n-seg: 60 DEQUANTIZE so, its CONV_2D all data type)."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 4), "FLOAT32")
    w = _dequantize(g, (8, 3, 3, 4), "w")
    b = _dequantize(g, (8,), "b")
    grid = _dequantize(g, (1, 64, 1, 2), "grid")
    y = g.add_tensor("y", (1, 8, 8, 8), "FLOAT32")
    opts = {"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "NONE"}
    g.add_op("CONV_2D", [x, w, b], [y], opts)
    p = predict_edgetpu(model_of(g, [x], [y, grid]))
    assert [o.status for o in p.ops] == [
        STATUS["rank"],
        STATUS["data_type"],
        STATUS["data_type"],
        STATUS["data_type"],
    ]
    assert p.mapped == 0


def test_an_int8_op_refused_for_its_rank_cuts_what_follows() -> None:
    """The rank refusal places like any other refusal: after the segment it cuts."""
    g = Graph("main")
    x = act(g, "x", (1, 8, 8, 4))
    y = conv(g, x, 8)
    wide = act(g, "wide", (2, 4, 8, 8))
    shape = g.add_constant("shape", np.array([2, 4, 8, 8], np.int32))
    g.add_op("RESHAPE", [y, shape], [wide])
    out = act(g, "out", wide.shape)
    g.add_op("RELU", [wide], [out])
    p = predict_edgetpu(model_of(g, [x], [out]))
    assert [o.runs_on for o in p.ops] == ["edgetpu", "cpu", "cpu"]
    assert p.ops[1].status == STATUS["rank"] and p.ops[2].status == STATUS["rank"]


def test_pool_with_fused_activation_is_a_limitation() -> None:
    opts = {"padding": "VALID", "stride_w": 2, "stride_h": 2, "filter_width": 2}
    opts |= {"filter_height": 2, "fused_activation_function": "RELU"}
    op, _ = _single("MAX_POOL_2D", [(1, 4, 4, 4)], (1, 2, 2, 4), opts)
    assert edgetpu_op_status(op)[0] == "limitation"
    op.options["fused_activation_function"] = "NONE"
    assert edgetpu_op_status(op)[0] == "mapped"


def test_concatenation_constant_input_must_be_zeros_with_two_inputs() -> None:
    zeros = Graph("tmp").add_constant("z", np.zeros((1, 4, 4, 2), np.int8), quantization=Q)
    op, _ = _single("CONCATENATION", [(1, 4, 4, 2)], (1, 4, 4, 4), {"axis": 3}, [zeros])
    assert edgetpu_op_status(op)[0] == "mapped"
    ones = Graph("tmp").add_constant("o", np.ones((1, 4, 4, 2), np.int8), quantization=Q)
    op, _ = _single("CONCATENATION", [(1, 4, 4, 2)], (1, 4, 4, 4), {"axis": 3}, [ones])
    assert edgetpu_op_status(op)[0] == "limitation"


def test_resize_rules_integer_scale_size_and_half_pixel_version() -> None:
    size = Graph("tmp").add_constant("size", np.array([16, 16], np.int32))
    op, _ = _single("RESIZE_NEAREST_NEIGHBOR", [(1, 8, 8, 4)], (1, 16, 16, 4), {}, [size])
    assert edgetpu_op_status(op)[0] == "mapped"
    op.options["half_pixel_centers"] = True  # op version 3: compiler 16 maps it, 15 does not
    assert edgetpu_op_status(op)[0] == "mapped"
    key, reason = edgetpu_op_status(op, compiler_version="15.0")
    assert key == "version" and "16.0" in reason
    op, _ = _single("RESIZE_BILINEAR", [(1, 6, 6, 4)], (1, 16, 16, 4), {}, [size])
    assert edgetpu_op_status(op)[0] == "limitation"
    big = Graph("tmp").add_constant("size", np.array([512, 512], np.int32))
    op, _ = _single("RESIZE_BILINEAR", [(1, 256, 256, 1)], (1, 512, 512, 1), {}, [big])
    assert edgetpu_op_status(op)[0] == "limitation"


def test_softmax_over_the_last_axis_maps_for_any_allowed_shape() -> None:
    # 16384 elements: above the documented 16000, but compiled pairs map it (edgetpu-more)
    op, _ = _single("SOFTMAX", [(1, 16384)], (1, 16384), {"beta": 1.0})
    assert edgetpu_op_status(op)[0] == "mapped"
    # a YOLOv8 DFL softmax: the compiler's logs give it the after-the-cut status, not its own
    op, _ = _single("SOFTMAX", [(1, 4, 2100, 16)], (1, 4, 2100, 16), {"beta": 1.0})
    assert edgetpu_op_status(op)[0] == "mapped"
    op, _ = _single("SOFTMAX", [(2, 4, 8, 2)], (2, 4, 8, 2), {"beta": 1.0})
    assert edgetpu_op_status(op)[0] == "rank"  # a dimension > 1 outside the 3 innermost


def test_a_custom_op_writing_float_is_refused_for_its_data_type() -> None:
    """The data type is judged before the op type, a custom op's too: an SSD's
    TFLite_Detection_PostProcess (float outputs) is logged "working on an unsupported data
    type" by compilers 2.1 and 16; one writing int8 is not supported (outside the table)."""
    g = Graph("main")
    x = act(g, "x", (1, 10))
    y = g.add_tensor("y", (1, 10), "FLOAT32")
    z = act(g, "z", (1, 10))
    floats = g.add_op("CUSTOM", [x], [y], custom_code="MyOp")
    ints = g.add_op("CUSTOM", [x], [z], custom_code="MyOp")
    assert edgetpu_op_status(floats)[0] == "data_type"
    key, reason = edgetpu_op_status(ints)
    assert key == "unsupported" and "MyOp" in reason


def _transpose(shape, perm) -> tuple:
    p = Graph("tmp").add_constant("perm", np.array(perm, np.int32))
    return _single("TRANSPOSE", [shape], tuple(shape[i] for i in perm), {}, [p])


def test_transpose_limit_is_the_element_count_of_the_tensor() -> None:
    """Largest seen mapped: [1, 22, 22, 144] (69696); smallest refused: [1, 20, 20, 256] and
    [1, 80, 80, 16] (102400, from a plane smaller and one larger than the mapped one)."""
    assert edgetpu_op_status(_transpose((1, 22, 22, 144), (0, 3, 1, 2))[0])[0] == "mapped"
    for shape in ((1, 20, 20, 256), (1, 80, 80, 16), (1, 40, 40, 144)):
        key, reason = edgetpu_op_status(_transpose(shape, (0, 3, 1, 2))[0])
        assert key == "limitation" and "elements" in reason and "perm [0, 3, 1, 2]" in reason
    assert edgetpu_op_status(_transpose((16, 256), (1, 0))[0])[0] == "mapped"
    old = edgetpu_op_status(_transpose((16, 256), (1, 0))[0], compiler_version="14.1")
    assert old[0] == "unsupported"  # 14.1 logs: TRANSPOSE "Operation not supported" (gh242)


def _reshape(src, dst) -> tuple:
    shape = Graph("tmp").add_constant("shape", np.array(dst, np.int32))
    return _single("RESHAPE", [src], dst, {}, [shape])


def test_reshape_limits_elements_and_every_op_the_two_innermost_dimensions() -> None:
    # YOLOv5 heads: the 40x40 map reshapes on the Edge TPU, the 80x80 one does not
    assert edgetpu_op_status(_reshape((1, 40, 40, 255), (1, 1600, 3, 85))[0])[0] == "mapped"
    key, reason = edgetpu_op_status(_reshape((1, 80, 80, 255), (1, 6400, 3, 85))[0])
    assert key == "limitation" and "1632000 elements" in reason
    # [1, 1200, 85] rows hold 102000 elements and map; [1, 4800, 85] rows hold 408000
    assert edgetpu_op_status(_reshape((1, 400, 3, 85), (1, 1200, 85))[0])[0] == "mapped"
    key, reason = edgetpu_op_status(_reshape((1, 1600, 3, 85), (1, 4800, 85))[0])
    assert key == "limitation" and "innermost" in reason
    # the rule is every op's: a LOGISTIC over [1, 80, 2100] is accepted, over [1, 80, 8400] not
    assert edgetpu_op_status(_single("LOGISTIC", [(1, 80, 2100)], (1, 80, 2100))[0])[0] == (
        "mapped"
    )
    key, _ = edgetpu_op_status(_single("LOGISTIC", [(1, 80, 8400)], (1, 80, 8400))[0])
    assert key == "limitation"


def test_table_rows_each_cite_a_source() -> None:
    table = capability("edgetpu")
    assert table["ops"], "empty op table"
    for name, row in table["ops"].items():
        assert row.get("source"), f"{name} cites no source"
    assert set(table["status"]) == {
        "mapped",
        "after_cut",
        "limitation",
        "data_type",
        "rank",
        "unsupported",
        "version",
        "first_dimension",
    }


@needs_oracle()
def test_older_compiler_does_not_know_the_lstm() -> None:
    model = flatbuffer.load(ORACLE / "keras_lstm_mnist_ptq.tflite")
    assert predict(model, target_named("edgetpu")).cpu == 0
    old = predict(model, target_named("edgetpu"), compiler_version="15.0")
    assert old.ops[1].op == "UNIDIRECTIONAL_SEQUENCE_LSTM"
    assert old.ops[1].status == STATUS["unsupported"] and "16.0" in old.ops[1].reason
    assert old.mapped == 1  # only the input QUANTIZE before it


def test_float_model_gets_a_note() -> None:
    g = Graph("main")
    x = g.add_tensor("x", (1, 4, 4, 2), "FLOAT32")
    y = g.add_tensor("y", x.shape, "FLOAT32")
    g.add_op("RELU", [x], [y])
    p = predict(model_of(g, [x], [y]), target_named("edgetpu"))
    assert any("full int8" in n for n in p.notes)


# -- rules rebuilt from the compiled pairs (delegates/edgetpu.toml cites the pairs per row) -------
def test_a_minus_one_batch_in_the_shape_signature_is_static() -> None:
    g = Graph("main")
    x = act(g, "x", (1, 8, 8, 4))
    x.shape_signature = (-1, 8, 8, 4)  # what every Keras export writes
    y = conv(g, x, 8)
    y.shape_signature = (-1, 8, 8, 8)
    p = predict(model_of(g, [x], [y]), target_named("edgetpu"))
    assert p.cpu == 0
    y.shape_signature = (-1, -1, 8, 8)  # an unknown height is dynamic (documented rule)
    key, reason = edgetpu_op_status(g.ops[0])
    assert key == "limitation" and "dynamic" in reason


def _gather(g: Graph, data: Tensor, out_dtype: str) -> Tensor:
    idx = g.add_constant("idx", np.array([0, 2], np.int64))
    out = act(g, f"gathered_{out_dtype}", (2,), out_dtype)
    g.add_op("GATHER", [data, idx], [out], {"axis": 0})
    return out


def test_the_output_type_is_judged_before_the_op_type() -> None:
    g = Graph("main")
    data = act(g, "data", (4,))
    _gather(g, data, "INT8")
    wide = g.add_tensor("wide", (4,), "INT64")
    _gather(g, wide, "INT64")
    assert edgetpu_op_status(g.ops[0])[0] == "unsupported"  # int8 GATHER: not in the table
    assert edgetpu_op_status(g.ops[1])[0] == "data_type"  # writes INT64


def test_split_along_the_first_dimension_is_refused_with_the_compilers_status() -> None:
    g = Graph("main")
    axis0 = g.add_constant("axis0", np.array(0, np.int32))
    x = act(g, "x", (4, 2, 1))
    parts = [act(g, f"p{i}", (1, 2, 1)) for i in range(4)]
    op = g.add_op("SPLIT", [axis0, x], parts, {"num_splits": 4})
    key, reason = edgetpu_op_status(op)
    assert key == "first_dimension" and "first dimension" in reason
    assert STATUS[key].startswith("For example, a fully-connected")
    axis2 = g.add_constant("axis2", np.array(2, np.int32))
    y = act(g, "y", (1, 4, 4))
    halves = [act(g, f"h{i}", (1, 4, 2)) for i in range(2)]
    assert edgetpu_op_status(g.add_op("SPLIT", [axis2, y], halves, {"num_splits": 2}))[0] == (
        "mapped"
    )


def test_pack_along_dimension_zero_maps_below_rank_four() -> None:
    op, _ = _single("PACK", [(2, 1), (2, 1)], (2, 2, 1), {"axis": 0, "values_count": 2})
    assert edgetpu_op_status(op)[0] == "mapped"
    op, _ = _single("PACK", [(1, 4, 4), (1, 4, 4)], (2, 1, 4, 4), {"axis": 0, "values_count": 2})
    assert edgetpu_op_status(op)[0] == "rank"  # its output's batch of 2 is judged first
    op, _ = _single("PACK", [(1, 4, 4)], (1, 1, 4, 4), {"axis": 0, "values_count": 1})
    key, reason = edgetpu_op_status(op)
    assert key == "limitation" and "batch" in reason


def test_an_op_the_segment_does_not_need_does_not_cut_it() -> None:
    """ARG_MAX reads the input (before the segment) and feeds only an output: the conv maps."""
    g = Graph("main")
    x = act(g, "x", (1, 8, 8, 4))
    idx = g.add_tensor("idx", (1, 8, 8), "INT32")
    g.add_op("ARG_MAX", [x, g.add_constant("axis", np.array([3], np.int32))], [idx])
    y = conv(g, x, 8)
    p = predict(model_of(g, [x], [idx, y]), target_named("edgetpu"))
    assert [o.runs_on for o in p.ops] == ["cpu", "edgetpu"]
    assert p.ops[0].status == STATUS["data_type"]


def test_the_cut_follows_the_data_flow_not_the_execution_order() -> None:
    """The YOLOv8 head of the compiled pairs: a refused TRANSPOSE of one scale cuts what reads
    it; the next scale's convolutions, later in execution order, still map; the join of both
    runs on the CPU."""
    g = Graph("main")
    x = act(g, "x", (1, 40, 40, 8))
    big = conv(g, x, 48, name="p4")
    perm = g.add_constant("perm", np.array([0, 3, 1, 2], np.int32))
    moved = act(g, "moved", (1, 48, 40, 40))
    g.add_op("TRANSPOSE", [big, perm], [moved])  # 76800 elements: refused
    small = conv(g, x, 16, name="other")  # independent of the transpose, after it in order
    flat = act(g, "flat", (1, 16, 1600))
    g.add_op("RESHAPE", [small, g.add_constant("s", np.array([1, 16, 1600], np.int32))], [flat])
    flat2 = act(g, "flat2", (1, 48, 1600))
    g.add_op("RESHAPE", [moved, g.add_constant("s2", np.array([1, 48, 1600], np.int32))], [flat2])
    joined = act(g, "joined", (1, 64, 1600))
    g.add_op("CONCATENATION", [flat2, flat], [joined], {"axis": 1})
    p = predict(model_of(g, [x], [joined]), target_named("edgetpu"))
    assert [o.runs_on for o in p.ops] == ["edgetpu", "cpu", "edgetpu", "edgetpu", "cpu", "cpu"]
    assert p.ops[1].status == STATUS["limitation"]
    assert p.ops[4].status == STATUS["after_cut"] and "after the cut at op 1" in p.ops[4].reason
    assert p.segments == 1


def test_ops_before_the_segment_stay_on_the_cpu_without_cutting() -> None:
    """MoveNet's CAST -> QUANTIZE before the first convolution: both on the CPU, the rest maps;
    a CPU op fed by the segment cuts what depends on it."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3), "UINT8")
    f = g.add_tensor("f", x.shape, "FLOAT32")
    g.add_op("CAST", [x], [f])
    q = act(g, "q", x.shape)
    g.add_op("QUANTIZE", [f], [q])
    y = conv(g, q, 8, name="c1")
    z = act(g, "leaky", y.shape)
    g.add_op("LEAKY_RELU", [y], [z], {"alpha": 0.1})
    out = conv(g, z, 4, name="c2")
    p = predict(model_of(g, [x], [out]), target_named("edgetpu"))
    assert [o.runs_on for o in p.ops] == ["cpu", "cpu", "edgetpu", "cpu", "cpu"]
    assert [o.status for o in p.ops[3:]] == [STATUS["unsupported"], STATUS["after_cut"]]


def _two_islands() -> Model:
    """conv -> DEQUANTIZE -> CAST -> CAST -> QUANTIZE -> conv: two mappable groups."""
    g = Graph("main")
    x = act(g, "x", (1, 4, 4, 4))
    a = conv(g, x, 4, name="c1")
    f = g.add_tensor("f", a.shape, "FLOAT32")
    g.add_op("DEQUANTIZE", [a], [f])
    i = g.add_tensor("i", a.shape, "INT32")
    g.add_op("CAST", [f], [i])
    f2 = g.add_tensor("f2", a.shape, "FLOAT32")
    g.add_op("CAST", [i], [f2])
    q = act(g, "q", a.shape)
    g.add_op("QUANTIZE", [f2], [q])
    out = conv(g, q, 4, name="c2")
    return model_of(g, [x], [out])


def test_multiple_subgraphs_maps_every_mappable_op_and_counts_segments() -> None:
    model = _two_islands()
    single = predict(model, target_named("edgetpu"))
    assert [o.runs_on for o in single.ops] == ["edgetpu"] + ["cpu"] * 5
    assert single.segments == 1 and single.ops[5].status == STATUS["after_cut"]
    multi = predict_edgetpu(model, multiple_subgraphs=True)
    assert [o.runs_on for o in multi.ops] == ["edgetpu", "cpu", "cpu", "cpu", "cpu", "edgetpu"]
    assert multi.segments == 2
    assert [o.status for o in multi.ops[1:5]] == [
        STATUS["data_type"],
        STATUS["data_type"],
        STATUS["data_type"],
        STATUS["limitation"],  # a float -> int8 QUANTIZE inside the graph
    ]


def test_check_multiple_subgraphs_option(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import json

    from tflfuse.cli import main

    path = tmp_path / "islands.tflite"
    flatbuffer.save(_two_islands(), path)
    assert main(["check", str(path), "--target", "edgetpu", "--json"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert (single["mapped"], single["segments"]) == (1, 1)
    assert main(["check", str(path), "--target", "edgetpu", "--multiple-subgraphs"]) == 0
    text = capsys.readouterr().out
    assert "Number of Edge TPU subgraphs: 2" in text
    assert "Number of operations that will run on Edge TPU: 2" in text


def test_check_says_which_compiler_it_predicts_for(tmp_path: Path, capsys) -> None:
    """16 by default; `--compiler-version 15` refuses what only 16 maps (a half-pixel resize)."""
    import json

    from tflfuse.cli import main

    g = Graph("main")
    x = act(g, "x", (1, 8, 8, 4))
    y = act(g, "y", (1, 16, 16, 4))
    size = g.add_constant("size", np.array([16, 16], np.int32))
    g.add_op("RESIZE_NEAREST_NEIGHBOR", [x, size], [y], {"half_pixel_centers": True})
    path = tmp_path / "up.tflite"
    flatbuffer.save(model_of(g, [x], [y]), path)
    assert main(["check", str(path), "--target", "edgetpu"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "edgetpu_compiler 16.0" in first and "one Edge TPU subgraph" in first
    assert main(["check", str(path), "--target", "edgetpu", "--compiler-version", "15"]) == 0
    text = capsys.readouterr().out
    assert "edgetpu_compiler 15" in text.splitlines()[0]
    assert "Operation version not supported" in text
    assert main(["check", str(path), "--target", "edgetpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compiler_version"].startswith("16.0") and out["mapped"] == 1


# -- a refused op near the input: the reading the evidence leaves open ----------------------------
def _nchw_front(input_dtype: str) -> Model:
    """A PyTorch-style export: input -> QUANTIZE -> TRANSPOSE [1, 3, 160, 160] (76800 elements,
    over the limit) -> conv -> conv -> QUANTIZE to the output type."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 3, 160, 160), input_dtype, quantization=None)
    if input_dtype == "UINT8":
        x.quantization = Q
    xq = act(g, "xq", x.shape)
    g.add_op("QUANTIZE", [x], [xq])
    nhwc = act(g, "nhwc", (1, 160, 160, 3))
    g.add_op("TRANSPOSE", [xq, g.add_constant("perm", np.array([0, 2, 3, 1], np.int32))], [nhwc])
    y = conv(g, conv(g, nhwc, 8, name="c1"), 8, name="c2")
    out = act(g, "out", y.shape, "UINT8")
    g.add_op("QUANTIZE", [y], [out])
    return model_of(g, [x], [out])


def test_a_refusal_right_after_the_input_requantization_cuts_and_names_the_other_reading() -> None:
    """The litert-torch stock case: the uint8 input's QUANTIZE maps, the refused input TRANSPOSE
    cuts the rest (the segment starts at the first op the compiler maps); the other reading,
    which no compiled model decides against, leaves the QUANTIZE on the CPU too and maps the
    rest."""
    p = predict(_nchw_front("UINT8"), target_named("edgetpu"))
    assert [o.runs_on for o in p.ops] == ["edgetpu", "cpu", "cpu", "cpu", "cpu"]
    assert p.ops[1].status == STATUS["limitation"]
    (other,) = p.other_readings
    assert (other.ops, other.mapped) == ([1], 3)  # c1, c2 and the output QUANTIZE
    assert "undecided by the evidence" in other.reading and "op 0 QUANTIZE" in other.reading
    assert other.reading in p.notes
    assert p.to_dict()["other_readings"] == [other.to_dict()]
    text = format_prediction(p, "m.tflite")
    assert "will run on Edge TPU: 1 (or 3 on the other reading of op 1: undecided" in text


def test_a_refusal_ahead_of_every_mapped_op_stays_ahead_and_names_the_other_reading() -> None:
    """The Ultralytics int8 case: float input, its QUANTIZE on the CPU, then the refused
    TRANSPOSE: predicted ahead of the segment (the convolutions map), and the documented rule's
    reading (it cuts everything after it) is given beside it."""
    p = predict(_nchw_front("FLOAT32"), target_named("edgetpu"))
    assert [o.runs_on for o in p.ops] == ["cpu", "cpu", "edgetpu", "edgetpu", "edgetpu"]
    (other,) = p.other_readings
    assert (other.ops, other.mapped) == ([1], 0)
    assert "documentation" in other.reading


def test_no_other_reading_where_the_compiled_models_decide() -> None:
    """A refusal after a convolution (the segment's own work) is the cut the compiled models
    show, and a model with no refusal near the input has nothing undecided."""
    g = Graph("main")
    x = act(g, "x", (1, 8, 8, 4))
    y = conv(g, x, 8, name="c1")
    z = act(g, "leaky", y.shape)
    g.add_op("LEAKY_RELU", [y], [z], {"alpha": 0.1})
    out = conv(g, z, 4, name="c2")
    assert predict(model_of(g, [x], [out]), target_named("edgetpu")).other_readings == []
    assert predict(_two_islands(), target_named("edgetpu")).other_readings == []
    assert (
        predict(
            _nchw_front("UINT8"), target_named("edgetpu"), multiple_subgraphs=True
        ).other_readings
        == []
    )


def test_the_report_gives_the_other_reading_beside_the_mapped_count() -> None:
    """The convert report's Edge TPU table: stock 1/5 (or 4/5 ...: undecided by the evidence),
    and the sentence that says which reading is which."""
    from tflfuse.convert import report

    section = {
        "stock": report.edgetpu_cut(flatbuffer.read_back(_nchw_front("UINT8"))),
        "fused": report.edgetpu_cut(flatbuffer.read_back(_nchw_front("FLOAT32"))),
    }
    for v in section.values():
        v.pop("_prediction")
    assert section["stock"]["other_readings"][0]["mapped"] == 3
    text = "\n".join(report._edgetpu_lines(section))
    other = "on the other reading of op 1: undecided by the evidence"
    assert f"| stock | 1/5 (or 3/5 {other}) |" in text
    assert f"| fused | 3/5 (or 0/5 {other}) |" in text
    assert "stock: op 1 TRANSPOSE (transposes [1, 3, 160, 160]" in text
