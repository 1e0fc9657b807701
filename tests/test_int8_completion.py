"""No op left float by the quantizer (issue 16): PRELU, RELU_0_TO_1 and DEPTH_TO_SPACE, which
litert-quantizer has no int8 config for, come out int8, and the Edge TPU maps PRELU and RELU.

The rules are checked exhaustively on int8 islands built inline (every int8 input value, against
the DEQUANTIZE -> float op -> QUANTIZE the quantizer leaves); the whole route on a Keras model with
PReLU layers (per channel and per tensor) and on an onnx2tf export of a MobileNetV3-style block
(HardSigmoid as RELU_0_TO_1, PRelu, HardSwish).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rulekit import apply, ops, refusals

from tflfuse.ir import Graph, Model, Quantization, Tensor, flatbuffer
from tflfuse.quantize.int8_completion import (
    COMPLETED_OPS,
    QuantizeDepthToSpace,
    QuantizeL2Normalization,
    QuantizePrelu,
    QuantizeRelu0To1,
    l2_steps,
)
from tflfuse.targets import predict
from tflfuse.targets import target as target_named
from tflfuse.verification import runs

ALL_INT8 = np.arange(-128, 128, dtype=np.int8)


def _q(scale: float, zero: int) -> Quantization:
    return Quantization(np.array([scale], np.float32), np.array([zero], np.int64))


def _island(op_type: str, channels: int, out_q: Quantization, alpha: np.ndarray | None = None):
    """x (int8, every value along axis 1) -> DEQUANTIZE -> op (float) -> QUANTIZE -> y (int8):
    what litert-quantizer leaves around an op it has no int8 config for."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 256, channels), "INT8", quantization=_q(0.04, -20))
    xf = g.add_tensor("x_dequant", x.shape)
    g.add_op("DEQUANTIZE", [x], [xf])
    yf = g.add_tensor("y_float", x.shape)
    inputs: list[Tensor] = [xf]
    if alpha is not None:
        inputs.append(g.add_constant("alpha", alpha.astype(np.float32), "FLOAT32"))
    g.add_op(op_type, inputs, [yf])
    y = g.add_tensor("y", x.shape, "INT8", quantization=out_q)
    g.add_op("QUANTIZE", [yf], [y])
    g.inputs, g.outputs = [x], [y]
    model = Model([g])
    model.validate()
    return flatbuffer.to_bytes(model)


def _every_value(data: bytes, channels: int) -> np.ndarray:
    x = np.repeat(ALL_INT8[None, :, None], channels, axis=2)
    return runs.run(data, [[x]])[0][0].astype(np.int32)


def _mapped(data: bytes) -> tuple[int, int]:
    p = predict(flatbuffer.from_bytes(data), target_named("edgetpu"))
    return p.mapped, len(p.ops)


@pytest.mark.parametrize(
    "alpha",
    [
        np.array([[[0.25, -0.1, 0.02, 1.7]]]),  # per channel (1, 1, C), one alpha above 1
        np.array([[[0.2]]]),  # one alpha for every channel
    ],
    ids=["per-channel", "per-tensor"],
)
def test_prelu_island_becomes_one_int8_prelu(alpha: np.ndarray) -> None:
    channels = 4
    out_q = _q(0.03, -60)
    before = _island("PRELU", channels, out_q, alpha)
    after, model, result = apply(before, QuantizePrelu())
    assert ops(model) == ["PRELU"] and result.fired() == {"QuantizePrelu": 1}
    prelu = model.main.ops[0]
    a = prelu.inputs[1]
    assert a.dtype == "INT8" and a.shape == alpha.shape  # the source's shape, per tensor scale
    assert float(a.quantization.scale[0]) == pytest.approx(np.abs(alpha).max() / 127)
    assert int(a.quantization.zero_point[0]) == 0 and a.quantization.scale.size == 1
    ref, got = _every_value(before, channels), _every_value(after, channels)
    assert np.ptp(ref) > 100  # the island's output spans the int8 range
    worst = int(np.abs(ref - got).max())
    declared = result.events[0].int8_steps
    assert worst <= declared <= 2, (worst, declared)
    assert _mapped(before) == (0, 3) and _mapped(after) == (1, 1)


def test_relu_0_to_1_island_becomes_int8_relu_exactly_where_it_saturates() -> None:
    before = _island("RELU_0_TO_1", 2, _q(1 / 255, -128))
    after, model, result = apply(before, QuantizeRelu0To1())
    assert ops(model) == ["RELU"] and model.main.ops[0].version == 2
    ref, got = _every_value(before, 2), _every_value(after, 2)
    assert ref.min() == -128 and ref.max() == 127  # both clamps are exercised (x spans [-4, 6])
    assert int(np.abs(ref - got).max()) <= result.events[0].int8_steps == 1
    assert np.array_equal(ref == 127, got == 127) and np.array_equal(ref == -128, got == -128)
    assert _mapped(after) == (1, 1)


def test_relu_0_to_1_with_an_output_range_past_one_stays_float() -> None:
    before = _island("RELU_0_TO_1", 2, _q(2 / 255, -128))
    _, model, result = apply(before, QuantizeRelu0To1())
    assert ops(model) == ["DEQUANTIZE", "RELU_0_TO_1", "QUANTIZE"]
    assert refusals(result, "QuantizeRelu0To1") == [
        "the output's range reaches 2 > 1, so saturation is not the clamp at 1"
    ]


def _depth_to_space_island(out_q: Quantization) -> bytes:
    g = Graph("main")
    x = g.add_tensor("x", (1, 4, 4, 16), "INT8", quantization=_q(0.04, -20))
    xf, yf = g.add_tensor("x_dequant", x.shape), g.add_tensor("y_float", (1, 8, 8, 4))
    y = g.add_tensor("y", (1, 8, 8, 4), "INT8", quantization=out_q)
    g.add_op("DEQUANTIZE", [x], [xf])
    g.add_op("DEPTH_TO_SPACE", [xf], [yf], {"block_size": 2})
    g.add_op("QUANTIZE", [yf], [y])
    g.inputs, g.outputs = [x], [y]
    return flatbuffer.to_bytes(Model([g]))


def test_depth_to_space_island_becomes_int8_exactly() -> None:
    before = _depth_to_space_island(_q(0.04, -20))
    after, model, result = apply(before, QuantizeDepthToSpace())
    assert ops(model) == ["DEPTH_TO_SPACE"] and model.main.ops[0].options == {"block_size": 2}
    x = np.resize(ALL_INT8, (1, 4, 4, 16))
    ref, got = runs.run(before, [[x]])[0][0], runs.run(after, [[x]])[0][0]
    assert np.array_equal(ref, got) and np.ptp(ref.astype(np.int32)) == 255
    other = _depth_to_space_island(_q(0.05, -20))
    _, model, result = apply(other, QuantizeDepthToSpace())
    assert ops(model) == ["DEQUANTIZE", "DEPTH_TO_SPACE", "QUANTIZE"]
    assert refusals(result, "QuantizeDepthToSpace") == [
        "the output has other quantization parameters than the input"
    ]


def test_the_quantizer_fallback_knows_what_tflfuse_completes() -> None:
    """convert takes the converter's PTQ (where there is a TF graph) only for ops that stay float:
    PRELU and RELU_0_TO_1 no longer count, RELU6 still does."""
    pytest.importorskip("litert_quantizer")
    from tflfuse.quantize.quantize import aeq_unsupported

    g = Graph("main")
    x = g.add_tensor("x", (1, 4))
    cur = x
    for op_type in ("PRELU", "RELU_0_TO_1", "RELU6"):
        out = g.add_tensor(op_type.lower(), (1, 4))
        extra = [g.add_constant("a", np.full((4,), 0.1, np.float32))] if op_type == "PRELU" else []
        g.add_op(op_type, [cur, *extra], [out])
        cur = out
    g.inputs, g.outputs = [x], [cur]
    assert aeq_unsupported(flatbuffer.to_bytes(Model([g]))) == ["RELU6"]
    assert {"PRELU", "RELU_0_TO_1", "DEPTH_TO_SPACE", "L2_NORMALIZATION"} == COMPLETED_OPS


# -- the whole route ------------------------------------------------------------------------------
def _keras_prelu_tflite() -> bytes:
    """conv -> PReLU (alpha per channel) -> conv -> PReLU (one alpha) -> depthwise -> PReLU ->
    pooled dense head: iris/hand-landmark style, with sane BatchNorm-free activations."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(5)
    inp = keras.Input((16, 16, 3), batch_size=1)
    init = keras.initializers.RandomUniform(-0.3, 0.6)
    y = keras.layers.Conv2D(8, 3, padding="same")(inp)
    y = keras.layers.PReLU(alpha_initializer=init, shared_axes=[1, 2])(y)
    y = keras.layers.Conv2D(8, 3, strides=2, padding="same")(y)
    y = keras.layers.PReLU(alpha_initializer=init, shared_axes=[1, 2, 3])(y)
    y = keras.layers.DepthwiseConv2D(3, padding="same")(y)
    y = keras.layers.PReLU(alpha_initializer=init, shared_axes=[1, 2])(y)
    y = keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(y))
    converter = tf.lite.TFLiteConverter.from_keras_model(keras.Model(inp, y))
    return bytes(converter.convert())


def test_prelu_model_comes_out_fully_int8_and_mapped(tmp_path: Path) -> None:
    pytest.importorskip("litert_quantizer")
    from tflfuse.convert.pipeline import convert

    data = _keras_prelu_tflite()
    assert [op.type for op in flatbuffer.from_bytes(data).main.ops].count("PRELU") == 3
    calib = np.random.default_rng(0).uniform(-1, 1, (32, 16, 16, 3)).astype(np.float32)
    res = convert(data, "edgetpu", calib, tmp_path / "o", progress=False)
    r = res.report
    q = r["quantization"]
    assert q["float_ops_left"] == [] and q["edgetpu_valid"]
    assert "3 PRELU it left in float made int8 by tflfuse" in q["fused_route"]
    assert "3 PRELU" in q["unfused_route"]  # the baseline is quantized the same way
    fused = flatbuffer.load(res.fused).main
    assert fused.op_counts().get("PRELU") == 3 and "DEQUANTIZE" not in fused.op_counts()
    tpu = r["edgetpu"]
    assert tpu["fused"]["mapped"] == tpu["fused"]["ops"]
    assert tpu["stock"]["mapped"] < tpu["stock"]["ops"]  # the quantizer's own: PRELU in float
    a, stock = r["agreement"]["fused"], r["agreement"]["stock"]
    assert a["verified"] and a["outputs"][0]["varies"]
    spread = a["outputs"][0]["reference_range"]
    spread = spread[1] - spread[0] if isinstance(spread, list) else spread
    assert a["max_abs"] <= 0.05 * spread
    assert a["max_abs"] <= 2 * stock["max_abs"] + 0.01 * spread


def _onnx_mobilenet_v3_block(path: Path) -> None:
    """What torch.onnx writes for a MobileNetV3 block, built with onnx.helper: strided conv,
    HardSwish, depthwise conv, squeeze-excite (GlobalAveragePool, Conv, Relu, Conv, HardSigmoid,
    Mul), a 1x1 conv and PRelu. Four input channels: onnx2tf 1.28 downloads sample images for a
    3-channel image input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    inits = [
        w("w1", 8, 4, 3, 3),
        w("b1", 8, scale=0.1),
        w("wd", 8, 1, 3, 3),
        w("bd", 8, scale=0.1),
        w("ws1", 4, 8, 1, 1),
        w("bs1", 4, scale=0.1),
        w("ws2", 8, 4, 1, 1),
        w("bs2", 8, scale=0.1),
        w("w2", 8, 8, 1, 1),
        w("b2", 8, scale=0.1),
        w("slope", 1, 8, 1, 1, scale=0.2),
    ]
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        node("HardSwish", ["c1"], ["h1"]),
        node("Conv", ["h1", "wd", "bd"], ["d1"], pads=[1, 1, 1, 1], group=8),
        node("GlobalAveragePool", ["d1"], ["s0"]),
        node("Conv", ["s0", "ws1", "bs1"], ["s1"]),
        node("Relu", ["s1"], ["s2"]),
        node("Conv", ["s2", "ws2", "bs2"], ["s3"]),
        node("HardSigmoid", ["s3"], ["s4"], alpha=1 / 6, beta=0.5),
        node("Mul", ["d1", "s4"], ["g"]),
        node("Conv", ["g", "w2", "b2"], ["c2"]),
        node("PRelu", ["c2", "slope"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mnv3_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def test_onnx2tf_hardsigmoid_and_prelu_come_out_int8_and_mapped(tmp_path: Path) -> None:
    pytest.importorskip("litert_quantizer")
    onnx2tf = pytest.importorskip("onnx2tf")
    from tflfuse.convert.pipeline import convert

    _onnx_mobilenet_v3_block(tmp_path / "m.onnx")
    onnx2tf.convert(
        input_onnx_file_path=str(tmp_path / "m.onnx"),
        output_folder_path=str(tmp_path / "o2t"),
        non_verbose=True,
    )
    source = tmp_path / "o2t" / "m_float32.tflite"
    given = [op.type for op in flatbuffer.load(source).main.ops]
    assert {"RELU_0_TO_1", "PRELU", "HARD_SWISH"} <= set(given)  # onnx2tf's spelling
    calib = np.random.default_rng(1).uniform(-1, 1, (32, 16, 16, 4)).astype(np.float32)
    res = convert(source, "edgetpu", calib, tmp_path / "o", progress=False)
    r = res.report
    assert r["quantization"]["float_ops_left"] == []
    fused_ops = flatbuffer.load(res.fused).main.ops
    fused = [op.type for op in fused_ops]
    assert "RELU_0_TO_1" not in fused and "PRELU" in fused
    # the HardSigmoid's clamp became its producer's fused RELU (or an int8 RELU)
    assert "RELU" in fused or any(op.fused_activation == "RELU" for op in fused_ops)
    tpu = r["edgetpu"]
    # the squeeze-excitation MUL multiplies two activations, one broadcast over the plane: no
    # compiled model shows that form mapped, so its gate is tiled first (TILE of a channel
    # vector and a same-shape MUL, both shown mapped) and every op maps on the evidence
    assert "TILE" in fused
    assert tpu["fused"]["mapped"] == tpu["fused"]["ops"]
    assert not tpu["fused"].get("other_readings")
    assert tpu["fused"]["ops"] > tpu["stock"]["mapped"]
    assert tpu["fused"]["mapped"] >= tpu["stock"]["mapped"]
    a = r["agreement"]["fused"]
    assert a["verified"] and a["outputs"][0]["varies"]
    assert a["max_abs"] <= 2 * r["agreement"]["stock"]["max_abs"] + 1e-3


# -- per target: a runtime only gets what it has kernels for ------------------------------------
def test_the_measured_table_says_the_island_is_faster_where_xnnpack_has_no_int8_op() -> None:
    """The facts the decision stands on (delegates/cost_table.json, benchmarks/cost_table.py;
    benchmarks/INT8_COMPLETION.md in context): an int8 PRELU or RELU costs several times its
    island on XNNPACK and on the plain kernels; an int8 DEPTH_TO_SPACE costs less."""
    from tflfuse.targets import cost

    for target in ("xnnpack", "cpu"):
        for op in ("PRELU", "RELU_0_TO_1"):
            island, int8 = cost.int8_completion_us(target_named(target), op, 65536)
            assert int8 > 5 * island, (target, op, island, int8)
        island, int8 = cost.int8_completion_us(target_named(target), "DEPTH_TO_SPACE", 65536)
        assert int8 < island, (target, island, int8)
    assert (
        cost.int8_completion_refusal(target_named("edgetpu"), "PRELU", 65536) is None
    )  # maps: always
    assert (
        cost.int8_completion_us(target_named("gpu"), "PRELU", 65536) is None
    )  # unmeasured: the default


def test_xnnpack_takes_the_island_but_not_an_int8_prelu() -> None:
    """Checked on the interpreter (ai-edge-litert's XNNPACK): every op of the island is
    delegated, the int8 PRELU is not (its TFLite delegate checks for float tensors)."""
    from tflfuse.targets.probe import xnnpack_delegated_ops

    alpha = np.array([[[0.25, -0.1, 0.02, 0.7]]])
    island = _island("PRELU", 4, _q(0.03, -60), alpha)
    completed, _, _ = apply(island, QuantizePrelu())
    assert xnnpack_delegated_ops(island) == {0, 1, 2}
    assert xnnpack_delegated_ops(completed) == set()


@pytest.mark.parametrize("target", ["xnnpack", "cpu"])
def test_a_prelu_island_stays_float_on_the_cpu_targets_and_says_why(target: str) -> None:
    before = _island("PRELU", 4, _q(0.03, -60), np.array([[[0.25, -0.1, 0.02, 0.7]]]))
    _, model, result = apply(before, QuantizePrelu(target_named(target)))
    assert ops(model) == ["DEQUANTIZE", "PRELU", "QUANTIZE"] and not result.events
    (reason,) = refusals(result, "QuantizePrelu")
    runtime = {"xnnpack": "XNNPACK kernels", "cpu": "the plain built-in kernels"}[target]
    assert f"with {runtime} the float island is faster" in reason
    assert reason.startswith("XNNPACK takes no int8 PRELU, and ") == (target == "xnnpack")
    _, model, _ = apply(before, QuantizePrelu(target_named("edgetpu")))
    assert ops(model) == ["PRELU"]  # the Edge TPU maps it: completed there


def test_depth_to_space_is_completed_on_every_target() -> None:
    before = _depth_to_space_island(_q(0.04, -20))
    for target in ("xnnpack", "cpu", "edgetpu", None):
        _, model, _ = apply(before, QuantizeDepthToSpace(target and target_named(target)))
        assert ops(model) == ["DEPTH_TO_SPACE"], target


def _conv_relu_0_to_1_island(read_elsewhere: bool = False) -> tuple[bytes, np.ndarray]:
    """int8 x -> CONV_2D 1x1 (int8, per-channel weights) -> DEQUANTIZE -> RELU_0_TO_1 ->
    QUANTIZE -> y: onnx2tf's HardSigmoid after its convolution, as the quantizer leaves it.
    Also the float weights the int8 ones stand for (to compute the float reference)."""
    rng = np.random.default_rng(3)
    g = Graph("main")
    x = g.add_tensor("x", (1, 16, 16, 8), "INT8", quantization=_q(0.05, 3))
    w_float = rng.uniform(-0.6, 0.6, (4, 1, 1, 8))
    w_scale = np.abs(w_float).reshape(4, -1).max(1) / 127
    w_int = np.round(w_float / w_scale[:, None, None, None]).astype(np.int8)
    wq = Quantization(w_scale.astype(np.float32), np.zeros(4, np.int64), axis=0)
    w = g.add_constant("w", w_int, "INT8", wq)
    bq = Quantization((0.05 * w_scale).astype(np.float32), np.zeros(4, np.int64))
    b = g.add_constant("b", np.round(0.5 / (0.05 * w_scale)).astype(np.int32), "INT32", bq)
    h = g.add_tensor("conv", (1, 16, 16, 4), "INT8", quantization=_q(0.03, -20))
    options = {"padding": "VALID", "stride_h": 1, "stride_w": 1, "dilation_h_factor": 1,
               "dilation_w_factor": 1, "fused_activation_function": "NONE"}  # fmt: skip
    g.add_op("CONV_2D", [x, w, b], [h], options, version=3)
    hf, yf = g.add_tensor("h_dequant", h.shape), g.add_tensor("y_float", h.shape)
    g.add_op("DEQUANTIZE", [h], [hf])
    g.add_op("RELU_0_TO_1", [hf], [yf])
    y = g.add_tensor("y", h.shape, "INT8", quantization=_q(1 / 255, -128))
    g.add_op("QUANTIZE", [yf], [y])
    g.inputs, g.outputs = [x], [y]
    if read_elsewhere:
        other = g.add_tensor("other", h.shape, "INT8", quantization=h.quantization)
        g.add_op("RELU", [h], [other], version=2)
        g.outputs.append(other)
    model = Model([g])
    model.validate()
    return flatbuffer.to_bytes(model), w_int * w_scale[:, None, None, None]


@pytest.mark.parametrize("target", ["xnnpack", "cpu", "edgetpu"])
def test_a_hardsigmoid_clamp_becomes_its_convolutions_fused_relu(target: str) -> None:
    """On every target the island disappears into the convolution (fused RELU writing the
    island's output): no op XNNPACK lacks, one op fewer on the Edge TPU, and one rounding from
    the accumulator instead of the island's two."""
    from tflfuse.targets.probe import xnnpack_delegated_ops

    before, w = _conv_relu_0_to_1_island()
    after, model, result = apply(before, QuantizeRelu0To1(target_named(target)))
    assert ops(model) == ["CONV_2D"] and model.main.ops[0].fused_activation == "RELU"
    assert model.main.ops[0].outputs[0].name == "y"
    x = np.random.default_rng(0).integers(-128, 128, (1, 16, 16, 8)).astype(np.int8)
    ref = runs.run(before, [[x]])[0][0].astype(np.int32)
    got = runs.run(after, [[x]])[0][0].astype(np.int32)
    assert ref.min() == -128 and ref.max() == 127  # both clamps are reached
    assert int(np.abs(ref - got).max()) <= result.events[0].int8_steps
    # against the float function: the fused form is within a step, the island is not always
    real = 0.05 * (x.astype(np.float64) - 3)
    z = np.clip(np.einsum("nhwc,oc->nhwo", real, w[:, 0, 0, :]) + 0.5, 0.0, 1.0)
    step = 1 / 255
    assert np.abs((got + 128) * step - z).max() <= step * 1.01
    assert np.abs((ref + 128) * step - z).max() > step
    assert len(xnnpack_delegated_ops(after)) == 1


def test_a_clamp_whose_input_is_read_elsewhere_keeps_the_target_decision() -> None:
    before, _ = _conv_relu_0_to_1_island(read_elsewhere=True)
    _, model, _ = apply(before, QuantizeRelu0To1(target_named("edgetpu")))
    assert "RELU_0_TO_1" not in ops(model) and model.main.ops[0].fused_activation == "NONE"
    _, model, result = apply(before, QuantizeRelu0To1(target_named("xnnpack")))
    assert "RELU_0_TO_1" in ops(model)  # an int8 RELU would run on the plain kernels
    (reason,) = refusals(result, "QuantizeRelu0To1")
    assert reason.startswith("XNNPACK takes no int8 RELU, and with XNNPACK kernels the float")


def test_complete_reports_what_it_kept_float_per_target() -> None:
    from tflfuse.quantize.int8_completion import complete

    before = _island("PRELU", 4, _q(0.03, -60), np.array([[[0.25, -0.1, 0.02, 0.7]]]))
    kept = complete(before, model=flatbuffer.from_bytes(before), target=target_named("xnnpack"))
    assert kept.data == before and kept.completed == {}
    assert list(kept.kept_float) == ["PRELU"] and kept.kept_float["PRELU"][0] == 1
    assert kept.to_dict()["kept_float"]["PRELU"]["reason"].startswith("XNNPACK takes no int8")
    done = complete(before, model=flatbuffer.from_bytes(before), target=target_named("edgetpu"))
    assert done.completed == {"PRELU": 1} and done.kept_float == {}
    assert done.verification["verified"]


def test_a_clamp_whose_float_tensors_are_read_elsewhere_is_not_fused() -> None:
    """The fused form removes the island; if its float output is also a model output, the
    island must stay for that reader, and the producer keeps writing x for its DEQUANTIZE."""
    before, _ = _conv_relu_0_to_1_island()
    model = flatbuffer.from_bytes(before)
    g = model.main
    g.outputs.append(next(t for t in g.tensors if t.name == "y_float"))
    data = flatbuffer.to_bytes(model)
    after, model, result = apply(data, QuantizeRelu0To1(target_named("edgetpu")))
    assert ops(model) == ["CONV_2D", "DEQUANTIZE", "RELU_0_TO_1", "RELU"]
    assert model.main.ops[0].fused_activation == "NONE"
    x = np.random.default_rng(1).integers(-128, 128, (1, 16, 16, 8)).astype(np.int8)
    (ref_y, ref_float), (got_y, got_float) = runs.run(data, [[x]])[0], runs.run(after, [[x]])[0]
    assert np.array_equal(ref_float, got_float) and np.ptp(ref_float) > 0.5
    assert np.abs(ref_y.astype(int) - got_y.astype(int)).max() <= result.events[0].int8_steps


# -- L2_NORMALIZATION (EdgeNeXt's cross-covariance attention normalizes q and k) ----------------
def _rows(channels: int) -> np.ndarray:
    return np.random.default_rng(7).integers(-128, 128, (1, 256, channels)).astype(np.int8)


def test_l2_normalization_island_becomes_int8_within_its_declared_steps() -> None:
    """The int8 kernel writes 1/128 steps; a QUANTIZE takes them to the island's output."""
    before = _island("L2_NORMALIZATION", 16, _q(2 / 255, 0))
    after, model, result = apply(before, QuantizeL2Normalization())
    assert ops(model) == ["L2_NORMALIZATION", "QUANTIZE"] and model.main.ops[0].version == 2
    l2 = model.main.ops[0].output
    assert float(l2.quantization.scale[0]) == 1 / 128 and int(l2.quantization.zero_point[0]) == 0
    x = _rows(16)
    ref = runs.run(before, [[x]])[0][0].astype(np.int32)
    got = runs.run(after, [[x]])[0][0].astype(np.int32)
    assert np.ptp(ref) > 100  # the rows' values span the output's range
    declared = result.events[0].int8_steps
    assert declared == l2_steps(2 / 255) == 3
    assert int(np.abs(ref - got).max()) <= declared


def test_l2_normalization_with_the_kernels_own_output_is_one_op() -> None:
    before = _island("L2_NORMALIZATION", 16, _q(1 / 128, 0))
    after, model, _ = apply(before, QuantizeL2Normalization())
    assert ops(model) == ["L2_NORMALIZATION"]
    x = _rows(16)
    ref, got = (runs.run(d, [[x]])[0][0].astype(np.int32) for d in (before, after))
    assert int(np.abs(ref - got).max()) <= l2_steps(1 / 128) == 3


def test_l2_normalization_with_an_output_finer_than_the_kernels_stays_float() -> None:
    _, model, result = apply(
        _island("L2_NORMALIZATION", 16, _q(0.001, 0)), QuantizeL2Normalization()
    )
    assert ops(model) == ["DEQUANTIZE", "L2_NORMALIZATION", "QUANTIZE"]
    [reason] = refusals(result, "QuantizeL2Normalization")
    assert "finer than the int8 kernel's 1/128: 13 steps off the island (at most 4)" in reason


def test_int8_l2_normalization_is_predicted_undecided_on_the_edgetpu() -> None:
    """In Coral's op list, but no compiled model shows it mapped: not counted mapped."""
    _, model, _ = apply(_island("L2_NORMALIZATION", 16, _q(1 / 128, 0)), QuantizeL2Normalization())
    p = predict(model, target_named("edgetpu"))
    assert p.mapped == 0 and p.ops[0].reason.startswith("undecided:")
    assert "L2_NORMALIZATION" in COMPLETED_OPS
