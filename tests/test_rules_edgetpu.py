"""Edge TPU legalization rules: each keeps the function (interpreter outputs) and raises the
predicted number of ops the compiler maps; refusals say why. Float rules are checked on float
graphs, integer rules on int8 graphs built inline; the YOLO-style zoo model shows the whole story
(stock conversion maps few ops, legalized + quantized maps all)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SHARED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rulekit import G, apply, assert_same_function, ops, optimize, refusals

from tflfuse.device.interpreter import make_interpreter
from tflfuse.ir import Graph, Model, Quantization, Tensor, flatbuffer
from tflfuse.rewrite import DeadCodeElimination, PassManager, TopologicalSort
from tflfuse.targets import predict
from tflfuse.targets import target as target_named
from tflfuse.targets.edgetpu.predict import statuses_once_quantized
from tflfuse.targets.edgetpu.rules import (
    EDGETPU_LEGALIZATION,
    LegalizeGelu,
    LegalizeHardSwish,
    LegalizeLeakyRelu,
    MeanToAveragePool,
    SplitOversizedAveragePool,
    SplitOversizedResize,
    SplitOversizedTranspose,
)
from tflfuse.verification import verify


def q(scale: float, zero: int) -> Quantization:
    return Quantization(scale=np.array([scale], np.float32), zero_point=np.array([zero], np.int64))


class Q8:
    """An int8 graph under construction (per-tensor quantization everywhere)."""

    def __init__(self) -> None:
        self.graph = Graph("main")

    def input(self, shape, scale: float = 0.05, zero: int = 0) -> Tensor:
        t = self.graph.add_tensor("input", shape, "INT8", quantization=q(scale, zero))
        self.graph.inputs.append(t)
        return t

    def op(self, type: str, inputs, shape, scale: float, zero: int, dtype="INT8", **opts) -> Tensor:
        out = self.graph.add_tensor(type.lower(), shape, dtype, quantization=q(scale, zero))
        self.graph.add_op(type, inputs, [out], opts)
        return out

    def bytes(self, *outputs: Tensor) -> bytes:
        self.graph.outputs = list(outputs)
        self.graph.validate()
        return flatbuffer.to_bytes(Model([self.graph]))


def mapped(data: bytes) -> tuple[int, int]:
    p = predict(flatbuffer.from_bytes(data), target_named("edgetpu"))
    return p.mapped, p.cpu


# -- LEAKY_RELU ----------------------------------------------------------------------------------
def test_leaky_relu_float_becomes_mul_relu_mul_add_exactly() -> None:
    g = G()
    x = g.input((1, 8, 8, 4))
    y = g.op("LEAKY_RELU", [g.conv(x, 8, 3)], (1, 8, 8, 8), alpha=0.1)
    before = g.bytes(y)
    after, model, result = apply(before, LegalizeLeakyRelu())
    assert ops(model) == ["CONV_2D", "MUL", "RELU", "MUL", "ADD"]
    assert result.fired() == {"LegalizeLeakyRelu": 1}
    assert_same_function(before, after, atol=1e-6, rtol=1e-6)


def test_leaky_relu_int8_keeps_the_function_and_maps() -> None:
    g = Q8()
    x = g.input((1, 8, 8, 16), 0.05, 3)
    y = g.op("LEAKY_RELU", [x], x.shape, 0.04, -100, alpha=0.1)
    before = g.bytes(y)
    after, model, _ = apply(before, LegalizeLeakyRelu())
    assert ops(model) == ["PRELU"]
    # PRELU's kernel rounds differently from LEAKY_RELU's: one step at most (measured)
    agreement = verify.compare(before, after, int_atol=1, runs=4)
    assert agreement.ok and agreement.varies, agreement
    assert mapped(before) == (0, 1)
    assert mapped(after) == (1, 0)


def test_leaky_relu_int8_alpha_outside_unit_interval_is_refused() -> None:
    g = Q8()
    x = g.input((1, 4, 4, 4))
    y = g.op("LEAKY_RELU", [x], x.shape, 0.05, 0, alpha=1.5)
    _, model, result = apply(g.bytes(y), LegalizeLeakyRelu())
    assert ops(model) == ["LEAKY_RELU"]
    assert refusals(result, "LegalizeLeakyRelu") == [
        "int8 LEAKY_RELU with alpha 1.5 outside (0, 1]"
    ]


# -- HARD_SWISH ----------------------------------------------------------------------------------
def test_hard_swish_float_is_exact() -> None:
    g = G()
    x = g.input((1, 6, 6, 4))
    h = g.conv(x, 8, 1)
    y = g.op("MUL", [h, g.const(np.array([4.0], np.float32))], h.shape)  # reach past +-3
    out = g.unary("HARD_SWISH", y)
    before = g.bytes(out)
    after, model, _ = apply(before, LegalizeHardSwish())
    assert ops(model) == ["CONV_2D", "MUL", "ADD", "MUL", "MUL"]
    assert model.main.ops[2].fused_activation == "RELU6"
    assert_same_function(before, after, atol=1e-5, rtol=1e-5)


def test_hard_swish_int8_within_one_step_and_maps() -> None:
    g = Q8()
    x = g.input((1, 8, 8, 16), 0.05, 0)  # [-6.4, 6.35]
    out_scale = (6.35 + 0.375) / 255
    y = g.op("HARD_SWISH", [x], x.shape, out_scale, round(-128 + 0.375 / out_scale))
    before = g.bytes(y)
    after, model, _ = apply(before, LegalizeHardSwish())
    assert ops(model) == ["ADD", "MUL", "MUL"]
    agreement = verify.compare(before, after, int_atol=1, runs=4)
    assert agreement.ok and agreement.varies, agreement
    assert mapped(before) == (0, 1) and mapped(after) == (3, 0)


def _every_code_through(data: bytes) -> np.ndarray:
    """The int8 output codes of a (1, 256) int8 model fed every input code once."""
    interpreter = make_interpreter(data, delegate="none")
    interpreter.allocate_tensors()
    x, y = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    interpreter.set_tensor(x["index"], np.arange(-128, 128, dtype=np.int8).reshape(1, 256))
    interpreter.invoke()
    return interpreter.get_tensor(y["index"]).astype(int).ravel()


@pytest.mark.parametrize(
    "x_low, x_high, bound",
    [
        (-6.0, 6.0, 2),  # reaches past +3: the common case, 2 steps
        (-1.0, 9.0, 2),
        (-4.43, 0.0, 4),  # the int8 property test's case: 3 steps off, 2 declared, before
        (-8.0, 0.1, 4),
        (-2.2, 0.01, 3),
    ],
)
def test_int8_hard_swish_bound_holds_for_every_input_code(x_low, x_high, bound) -> None:
    """Over all 256 input codes, the spelled form is within the bound it declares for the match's
    scales (hard_swish_int8_steps); that bound is 2 where x reaches past +3 and larger where x is
    mostly negative (a tiny output step). The gate quantized over [0, relu6(x_max + 3)] keeps
    even those within 2 steps (measured: 3 to 4 with the gate over [0, 6])."""
    g = Q8()
    x_scale = (x_high - x_low) / 255
    x = g.input((1, 256), x_scale, round(-128 - x_low / x_scale))
    reals = x_scale * (np.arange(-128, 128) - round(-128 - x_low / x_scale))
    swish = reals * np.clip(reals + 3, 0, 6) / 6
    y_low, y_high = min(float(swish.min()), 0.0), max(float(swish.max()), 0.0)
    y_scale = (y_high - y_low) / 255
    y = g.op("HARD_SWISH", [x], x.shape, y_scale, round(-128 - y_low / y_scale))
    before = g.bytes(y)
    after, model, result = apply(before, LegalizeHardSwish())
    assert ops(model) == ["ADD", "MUL", "MUL"]
    (event,) = [e for e in result.events if e.rule == "LegalizeHardSwish"]
    assert event.int8_steps == bound
    kernel, spelled = _every_code_through(before), _every_code_through(after)
    assert len(set(kernel.tolist())) > 32  # the output varies with the input
    assert np.abs(kernel - spelled).max() <= min(bound, 2)


# -- GELU ----------------------------------------------------------------------------------------
def test_gelu_float_becomes_tanh_form() -> None:
    g = G()
    x = g.input((1, 16))
    y = g.op("GELU", [g.fc(x, 32)], (1, 32), approximate=True)
    before = g.bytes(y)
    after, model, _ = apply(before, LegalizeGelu())
    assert "GELU" not in ops(model)
    assert set(ops(model)) == {"FULLY_CONNECTED", "MUL", "ADD", "TANH"}
    assert_same_function(before, after, atol=1e-5, rtol=1e-4)


def test_gelu_int8_is_refused_with_the_reason() -> None:
    g = Q8()
    x = g.input((1, 16))
    y = g.op("GELU", [x], x.shape, 0.03, -20)
    _, model, result = apply(g.bytes(y), LegalizeGelu())
    assert ops(model) == ["GELU"]
    assert refusals(result, "LegalizeGelu") == [
        "GELU is legalized on the float model, before quantization"
    ]


def _attention_then_gelu(constant_right: bool) -> tuple[G, Tensor]:
    """x [1, 8, 16] -> BATCH_MATMUL(x, a constant or EXP(x^T)) -> FC -> GELU: the encoder's
    shape. The product of two activations is legalized (targets/edgetpu/attention.py), so the
    computed operand goes through EXP, an op outside the table that no rule rewrites."""
    g = G()
    x = g.input((1, 8, 16))
    right = (
        g.rand(1, 16, 8, name="k")
        if constant_right
        else g.unary(
            "EXP", g.op("TRANSPOSE", [x, g.const(np.array([0, 2, 1]), "perm")], (1, 16, 8))
        )
    )
    scores = g.op("BATCH_MATMUL", [x, right], (1, 8, 8), adj_x=False, adj_y=False)
    h = g.op(
        "FULLY_CONNECTED",
        [scores, g.rand(32, 8), g.rand(32)],
        (1, 8, 32),
        fused_activation_function="NONE",
        keep_num_dims=True,
    )
    return g, g.op("GELU", [h], (1, 8, 32), approximate=True)


def test_gelu_behind_an_op_that_never_maps_is_left_whole() -> None:
    """EXP has no Edge TPU form: everything after it runs on the CPU, so spelling GELU out in
    nine ops would only cost CPU time: refused, with the cut."""
    g, y = _attention_then_gelu(constant_right=False)
    _, model, result = optimize(g.bytes(y), target="edgetpu")
    assert "GELU" in ops(model) and "TANH" not in ops(model)
    [reason] = refusals(result, "LegalizeGelu")
    assert reason.startswith("its input is computed on the CPU after the Edge TPU segment")
    assert "EXP is not in the Edge TPU op table" in reason


def test_gelu_behind_an_op_a_rule_makes_mappable_is_legalized() -> None:
    """A BATCH_MATMUL with a constant right operand becomes a FULLY_CONNECTED (an exporter
    rule, later in the pipeline): the next round finds nothing refused ahead of GELU and
    legalizes it, and the whole graph maps once quantized."""
    g, y = _attention_then_gelu(constant_right=True)
    before = g.bytes(y)
    after, model, result = optimize(before, target="edgetpu")
    assert "GELU" not in ops(model) and "BATCH_MATMUL" not in ops(model)
    assert result.fired()["LegalizeGelu"] == 1
    assert_same_function(before, after, atol=1e-5, rtol=1e-4)
    assert {key for key, _ in statuses_once_quantized(model.main)} == {"mapped"}


def test_every_legalization_is_gated_by_the_cut() -> None:
    """LEAKY_RELU and HARD_SWISH behind the attention product stay whole too (the gate is the
    legalizations' own, not GELU's)."""
    for op_type, rule in (("LEAKY_RELU", "LegalizeLeakyRelu"), ("HARD_SWISH", "LegalizeHardSwish")):
        g, y = _attention_then_gelu(constant_right=False)
        z = g.op(op_type, [y], y.shape, **({"alpha": 0.1} if op_type == "LEAKY_RELU" else {}))
        _, model, result = optimize(g.bytes(z), target="edgetpu")
        assert op_type in ops(model)
        [reason] = refusals(result, rule)
        assert "after the Edge TPU segment (cut at op" in reason


# -- MEAN ----------------------------------------------------------------------------------------
def test_oversized_mean_hw_int8_becomes_pools_with_requantize_and_reshape() -> None:
    g = Q8()
    x = g.input((1, 256, 128, 4), 0.05, 0)
    axes = g.graph.add_constant("axes", np.array([1, 2], np.int32))
    y = g.op("MEAN", [x, axes], (1, 4), 0.02, 5, keep_dims=False)
    before = g.bytes(y)
    after, model, _ = apply(before, MeanToAveragePool())
    assert ops(model) == ["AVERAGE_POOL_2D", "AVERAGE_POOL_2D", "QUANTIZE", "RESHAPE"]
    # two pool stages rounded at the input scale (0.05), then the finer output scale (0.02)
    agreement = verify.compare(before, after, int_atol=MeanToAveragePool().int8_error_steps + 1)
    assert agreement.ok and agreement.varies, agreement


def test_a_mean_the_compiler_maps_stays_a_mean() -> None:
    g = Q8()
    x = g.input((1, 8, 8, 16), 0.05, 0)
    axes = g.graph.add_constant("axes", np.array([1, 2], np.int32))
    y = g.op("MEAN", [x, axes], (1, 16), 0.02, 5, keep_dims=False)
    _, model, result = apply(g.bytes(y), MeanToAveragePool())
    assert ops(model) == ["MEAN"]
    assert refusals(result, "MeanToAveragePool") == [
        "the MEAN maps on the Edge TPU as it is (a 8x8 plane, within the 16384 px of"
        " delegates/edgetpu.toml [ops.MEAN]): a pool would add ops and roundings"
    ]
    assert mapped(g.bytes(y)) == (1, 0)


def test_oversized_mean_is_pooled_in_two_stages_and_then_maps() -> None:
    g = Q8()
    x = g.input((1, 256, 128, 4), 0.05, 0)
    axes = g.graph.add_constant("axes", np.array([1, 2], np.int32))
    y = g.op("MEAN", [x, axes], (1, 1, 1, 4), 0.05, 0, keep_dims=True)
    before = g.bytes(y)
    after, model, _ = apply(before, MeanToAveragePool())
    assert ops(model) == ["AVERAGE_POOL_2D", "AVERAGE_POOL_2D"]
    windows = [(op.options["filter_height"], op.options["filter_width"]) for op in model.main.ops]
    assert all(h * w <= 16384 for h, w in windows)
    assert windows[0][0] * windows[1][0] == 256 and windows[0][1] * windows[1][1] == 128
    agreement = verify.compare(before, after, int_atol=1, runs=3)
    assert agreement.ok and agreement.varies, agreement
    assert mapped(before) == (0, 1) and mapped(after) == (2, 0)


def test_oversized_global_average_pool_float_is_split_exactly() -> None:
    g = G()
    x = g.input((1, 192, 192, 2))
    y = g.op(
        "AVERAGE_POOL_2D", [x], (1, 1, 1, 2), padding="VALID", stride_h=1, stride_w=1,
        filter_height=192, filter_width=192, fused_activation_function="NONE",
    )  # fmt: skip
    before = g.bytes(y)
    after, model, _ = apply(before, SplitOversizedAveragePool())
    assert ops(model) == ["AVERAGE_POOL_2D", "AVERAGE_POOL_2D"]
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


def test_mean_over_channels_is_refused() -> None:
    g = G()
    x = g.input((1, 4, 4, 8))
    y = g.op("MEAN", [x, g.const(np.array([3]))], (1, 4, 4, 1), keep_dims=True)
    _, model, result = apply(g.bytes(y), MeanToAveragePool())
    assert ops(model) == ["MEAN"]
    assert refusals(result, "MeanToAveragePool") == ["MEAN reduces axes [3], not height and width"]


# -- order ---------------------------------------------------------------------------------------
def test_execution_order_does_not_move_the_cut() -> None:
    """The compiler's cut follows the data flow (edgetpu.toml), so no pass reorders ops: an
    unmappable side op placed first or last leaves the same mappable ops on the Edge TPU."""

    def side_head(first: bool) -> bytes:
        g = Q8()
        x = g.input((1, 4, 4, 8), 0.05, 0)
        a = g.op("RELU", [x], x.shape, 0.05, 0)
        side = g.graph.add_tensor("argmax", (1, 4, 4), "INT32")
        argmax = g.graph.add_op(
            "ARG_MAX", [a, g.graph.add_constant("axis", np.array([3], np.int32))], [side],
            {"output_type": 2},
        )  # fmt: skip
        b = g.op("RELU6", [a], x.shape, 0.05, 0)
        if not first:  # the ARG_MAX after the RELU6 in execution order
            g.graph.ops.remove(argmax)
            g.graph.ops.append(argmax)
        return g.bytes(side, b)

    early, late = side_head(first=True), side_head(first=False)
    assert ops(flatbuffer.from_bytes(early)) == ["RELU", "ARG_MAX", "RELU6"]
    assert mapped(early) == mapped(late) == (2, 1)


# -- a YOLO-style model end to end -----------------------------------------------------------------
@pytest.fixture(scope="session")
def yolo() -> dict[str, bytes]:
    pytest.importorskip("tensorflow")
    pytest.importorskip("litert_quantizer")
    from tflfuse.examples import zoo
    from tflfuse.quantize.quantize import quantize

    model = zoo.build("yolo_style", input_size=64)
    calibration = zoo.sample_inputs((64, 64, 3), n=16, seed=2)
    out = {
        "float": zoo.to_tflite(model),
        "stock": zoo.to_tflite(model, int8=True, calibration=calibration, io_type="uint8"),
    }
    legal = flatbuffer.from_bytes(out["float"])
    PassManager((*EDGETPU_LEGALIZATION, DeadCodeElimination(), TopologicalSort())).run(legal)
    out["legal_float"] = flatbuffer.to_bytes(legal)
    out["tflfuse"] = quantize(
        out["legal_float"], "int8", [calibration], input_type="uint8", output_type="uint8",
        progress=False,
    ).data  # fmt: skip
    return out


def _mean_error(data: bytes, reference: bytes, x: np.ndarray) -> float:
    from tflfuse.device.interpreter import make_interpreter

    def outputs(model: bytes) -> np.ndarray:
        interp = make_interpreter(model, "none")
        i, o = interp.get_input_details()[0], interp.get_output_details()[0]
        results = []
        for sample in x:
            value = sample[None]
            if i["dtype"] == np.uint8:
                s, z = i["quantization"]
                value = np.clip(np.round(value / s + z), 0, 255).astype(np.uint8)
            interp.set_tensor(i["index"], value)
            interp.invoke()
            y = interp.get_tensor(o["index"]).astype(np.float32)
            if o["dtype"] == np.uint8:
                y = (y - o["quantization"][1]) * o["quantization"][0]
            results.append(y)
        return np.concatenate(results)

    return float(np.abs(outputs(data) - outputs(reference)).mean())


def test_yolo_stock_maps_under_60_percent_and_tflfuse_maps_all(yolo: dict[str, bytes]) -> None:
    stock = predict(flatbuffer.from_bytes(yolo["stock"]), target_named("edgetpu"))
    assert stock.fraction_mapped < 0.6
    assert {o.op for o in stock.ops if o.status == "Operation not supported"} >= {"LEAKY_RELU"}
    fused = predict(flatbuffer.from_bytes(yolo["tflfuse"]), target_named("edgetpu"))
    assert fused.cpu == 0 and fused.mapped > 0
    ops_after = {o.op for o in fused.ops}
    assert not ops_after & {"LEAKY_RELU", "HARD_SWISH"}  # a MEAN within its limit maps


def test_yolo_legalization_keeps_the_function(yolo: dict[str, bytes]) -> None:
    assert_same_function(yolo["float"], yolo["legal_float"], atol=1e-4, rtol=1e-4)
    from tflfuse.examples import zoo

    x = zoo.sample_inputs((64, 64, 3), n=6, seed=7)
    stock_error = _mean_error(yolo["stock"], yolo["float"], x)
    fused_error = _mean_error(yolo["tflfuse"], yolo["float"], x)
    assert fused_error <= 1.5 * stock_error, (fused_error, stock_error)


def test_yolo_stock_int8_legalized_in_place_maps_all_and_stays_close(yolo) -> None:
    model = flatbuffer.from_bytes(yolo["stock"])
    PassManager((*EDGETPU_LEGALIZATION, DeadCodeElimination(), TopologicalSort())).run(model)
    legal = flatbuffer.to_bytes(model)
    assert predict(model, target_named("edgetpu")).cpu == 0
    from tflfuse.examples import zoo

    x = zoo.sample_inputs((64, 64, 3), n=6, seed=7)
    stock_error = _mean_error(yolo["stock"], yolo["float"], x)
    legal_error = _mean_error(legal, yolo["float"], x)
    assert legal_error <= 1.25 * stock_error, (legal_error, stock_error)


# -- property: random float chains keep their function -----------------------------------------
_ACTS = st.sampled_from(["LEAKY_RELU", "HARD_SWISH", "GELU", "RELU"])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    acts=st.lists(_ACTS, min_size=1, max_size=4),
    alpha=st.floats(0.01, 0.5),
    size=st.integers(2, 6),
    head=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_random_float_chains_are_legalized_and_keep_their_function(
    acts, alpha, size, head, seed
) -> None:
    g = G(seed)
    x = g.input((1, size, size, 3))
    y = x
    for act in acts:
        y = g.conv(y, 4, 3)
        options = {"alpha": alpha} if act == "LEAKY_RELU" else {}
        if act == "GELU":
            options = {"approximate": True}
        y = g.op(act, [y], y.shape, **options)
    if head:
        y = g.op("MEAN", [y, g.const(np.array([1, 2]))], (1, 4), keep_dims=False)
    before = g.bytes(y)
    after, model, _ = apply(before, *EDGETPU_LEGALIZATION)
    assert not set(ops(model)) & {"LEAKY_RELU", "HARD_SWISH", "GELU"}
    assert_same_function(before, after, atol=1e-4, rtol=1e-4)


# -- oversized RESIZE ------------------------------------------------------------------------------
def test_oversized_bilinear_resize_float_is_tiled_exactly() -> None:
    g = G()
    x = g.input((1, 160, 160, 2))
    y = g.op("RESIZE_BILINEAR", [x, g.const(np.array([320, 320]))], (1, 320, 320, 2),
             align_corners=False, half_pixel_centers=False)  # fmt: skip
    before = g.bytes(y)
    after, model, result = apply(before, SplitOversizedResize())
    assert result.fired() == {"SplitOversizedResize": 1}
    resizes = [op for op in model.main.ops if op.type == "RESIZE_BILINEAR"]
    assert len(resizes) == 2
    assert all(op.output.shape[1] * op.output.shape[2] <= 65536 for op in resizes)
    assert ops(model)[-1] == "CONCATENATION"
    assert_same_function(before, after, atol=1e-5, rtol=1e-5)


def test_oversized_nearest_resize_int8_is_tiled_bit_exactly_and_maps() -> None:
    g = Q8()
    x = g.input((1, 160, 160, 4), 0.05, 0)
    size = g.graph.add_constant("size", np.array([320, 320], np.int32))
    y = g.op("RESIZE_NEAREST_NEIGHBOR", [x, size], (1, 320, 320, 4), 0.05, 0,
             align_corners=False, half_pixel_centers=False)  # fmt: skip
    before = g.bytes(y)
    after, model, _ = apply(before, SplitOversizedResize())
    assert ops(model).count("RESIZE_NEAREST_NEIGHBOR") == 2
    assert verify.compare(before, after, int_atol=0, runs=2).identical
    assert mapped(before) == (0, 1)
    assert mapped(after) == (len(model.main.ops), 0)


@pytest.mark.parametrize("q8", [False, True])
def test_a_segmentation_models_half_pixel_full_size_resize_is_tiled_exactly(q8: bool) -> None:
    """The final x4 bilinear upsample of a segmentation model to 320 x 320 (PyTorch's and TF2's
    half-pixel centers): tiles of input rows with one extra row on each side, the extra output
    rows sliced off: the same numbers in float, bit-identical in int8, and every op maps."""
    g = Q8() if q8 else G()
    x = g.input((1, 80, 80, 3), 0.05, 0) if q8 else g.input((1, 80, 80, 3))
    size = g.graph.add_constant("size", np.array([320, 320], np.int32))
    options = dict(align_corners=False, half_pixel_centers=True)
    if q8:
        y = g.op("RESIZE_BILINEAR", [x, size], (1, 320, 320, 3), 0.05, 0, **options)
    else:
        y = g.op("RESIZE_BILINEAR", [x, size], (1, 320, 320, 3), **options)
    before = g.bytes(y)
    after, model, result = apply(before, SplitOversizedResize())
    assert result.fired() == {"SplitOversizedResize": 1}
    resizes = [op for op in model.main.ops if op.type == "RESIZE_BILINEAR"]
    assert len(resizes) == 2 and all(op.options["half_pixel_centers"] for op in resizes)
    # 51 input rows fit 65536 output pixels; less the two neighbours, 49 per tile: rows 0-48
    # and the row below, rows 49-79 and the row above
    assert [op.inputs[0].shape[1] for op in resizes] == [50, 32]
    assert all(op.output.shape[1] * op.output.shape[2] <= 65536 for op in resizes)
    if q8:
        assert verify.compare(before, after, int_atol=0, runs=2).identical
        assert mapped(before) == (0, 1)
        # no compiled model shows a x4 half-pixel bilinear resize mapped (forms.gated): the
        # tiles are undecided, predicted on the CPU, and the other reading maps every op
        p = predict(model, target_named("edgetpu"))
        n = len(model.main.ops)
        assert all(p.ops[i].runs_on == "cpu" for i, op in enumerate(model.main.ops)
                   if op.type == "RESIZE_BILINEAR")  # fmt: skip
        assert [r.mapped for r in p.other_readings] == [n]
    else:
        assert_same_function(before, after, atol=1e-6, rtol=1e-6)


def test_align_corners_resize_is_not_tiled() -> None:
    g = G()
    x = g.input((1, 160, 160, 1))
    y = g.op("RESIZE_BILINEAR", [x, g.const(np.array([320, 320]))], (1, 320, 320, 1),
             align_corners=True, half_pixel_centers=False)  # fmt: skip
    _, model, result = apply(g.bytes(y), SplitOversizedResize())
    assert ops(model) == ["RESIZE_BILINEAR"]
    assert refusals(result, "SplitOversizedResize") == [
        "only resizes without align_corners are tiled"
    ]


def test_a_resize_whose_tiles_would_not_map_is_not_tiled() -> None:
    """256 x 700 rows hold 179200 elements, over the two-innermost-dimensions limit: tiles of any
    height would stay on the CPU, so the resize is left as it is (not run: only planned)."""
    g = G()
    x = g.input((1, 129, 128, 700))
    y = g.op("RESIZE_NEAREST_NEIGHBOR", [x, g.const(np.array([258, 256]))], (1, 258, 256, 700))
    g.graph.outputs = [y]
    result = PassManager([SplitOversizedResize()], validate=False).run(g.graph)
    assert [op.type for op in g.graph.ops] == ["RESIZE_NEAREST_NEIGHBOR"]
    [reason] = refusals(result, "SplitOversizedResize")
    assert reason.startswith("a tile would stay on the CPU") and "innermost" in reason


# -- fusions the Edge TPU table forbids ------------------------------------------------------------
def _int8_conv(g: Q8, x: Tensor, out_ch: int, scale: float, zero: int) -> Tensor:
    rng = np.random.default_rng(3)
    s_in = float(x.quantization.scale[0])
    w = g.graph.add_constant(
        "w", rng.integers(-100, 100, (out_ch, 3, 3, x.shape[-1])).astype(np.int8), "INT8",
        q(0.01, 0),
    )  # fmt: skip
    b = g.graph.add_constant(
        "b", rng.integers(-500, 500, (out_ch,)).astype(np.int32), "INT32", q(s_in * 0.01, 0)
    )
    shape = (*x.shape[:3], out_ch)
    return g.op(
        "CONV_2D", [x, w, b], shape, scale, zero, padding="SAME", stride_h=1, stride_w=1,
        fused_activation_function="NONE",
    )  # fmt: skip


def _pool_options() -> dict:
    return {
        "padding": "VALID", "stride_h": 2, "stride_w": 2, "filter_height": 2, "filter_width": 2,
        "fused_activation_function": "NONE",
    }  # fmt: skip


def conv_maxpool_relu_int8() -> bytes:
    g = Q8()
    x = g.input((1, 8, 8, 4), 0.05, 0)
    c = _int8_conv(g, x, 8, 0.1, -10)
    pooled = g.op("MAX_POOL_2D", [c], (1, 4, 4, 8), 0.1, -10, **_pool_options())
    y = g.op("RELU", [pooled], pooled.shape, 0.1, -10)
    return g.bytes(y)


def conv_maxpool_relu_float(pool: str = "MAX_POOL_2D") -> bytes:
    g = G()
    x = g.input((1, 8, 8, 4))
    pooled = g.op(pool, [g.conv(x, 8, 3)], (1, 4, 4, 8), **_pool_options())
    return g.bytes(g.unary("RELU", pooled))


@pytest.mark.parametrize("pool", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
def test_float_pool_relu_stays_separate_for_edgetpu_and_fuses_for_xnnpack(pool: str) -> None:
    from rulekit import optimize

    before = conv_maxpool_relu_float(pool)
    tpu, tpu_model, result = optimize(before, target="edgetpu")
    assert ops(tpu_model) == ["CONV_2D", pool, "RELU"]
    assert refusals(result, "FuseActivationIntoProducer") == [
        f"the Edge TPU maps {pool} only with fused activation NONE: RELU stays a separate op"
        " (delegates/edgetpu.toml)"
    ]
    assert_same_function(before, tpu)
    cpu, cpu_model, _ = optimize(before, target="xnnpack")
    assert ops(cpu_model) == ["CONV_2D", pool]
    assert cpu_model.main.ops[1].fused_activation == "RELU"
    assert_same_function(before, cpu)


def test_int8_maxpool_relu_stays_separate_and_all_of_it_maps() -> None:
    from rulekit import optimize

    before = conv_maxpool_relu_int8()
    tpu, tpu_model, _ = optimize(before, target="edgetpu")
    assert ops(tpu_model) == ["CONV_2D", "MAX_POOL_2D", "RELU"]
    assert mapped(tpu) == (3, 0)
    agreement = verify.compare(before, tpu, int_atol=0)
    assert agreement.identical and agreement.varies
    cpu, cpu_model, _ = optimize(before, target="xnnpack")
    assert ops(cpu_model) == ["CONV_2D", "MAX_POOL_2D"]
    assert verify.compare(before, cpu, int_atol=1).ok
    # what the edgetpu pipeline avoided: the predictor leaves the fused pool on the CPU
    p = predict(cpu_model, target_named("edgetpu"))
    assert [o.runs_on for o in p.ops] == ["edgetpu", "cpu"]
    assert "fused activation RELU" in p.ops[1].reason


def test_every_fused_activation_the_edgetpu_pipeline_writes_is_in_its_row() -> None:
    """The pipeline as a whole never fuses what the table forbids (pools, concatenation)."""
    from rulekit import optimize

    from tflfuse.targets import capability

    g = G()
    x = g.input((1, 8, 8, 4))
    a = g.unary("RELU", g.op("MAX_POOL_2D", [g.conv(x, 8, 3)], (1, 4, 4, 8), **_pool_options()))
    b = g.unary(
        "RELU6", g.op("AVERAGE_POOL_2D", [g.conv(x, 8, 1)], (1, 4, 4, 8), **_pool_options())
    )
    c = g.unary("RELU", g.binary("ADD", a, b))
    _, model, _ = optimize(g.bytes(c), target="edgetpu")
    table = capability("edgetpu")
    for op in model.main.ops:
        row = table["ops"][op.type]
        allowed = row.get("fused_activations", table["meta"]["default_fused_activations"])
        assert op.fused_activation in allowed, (op.type, op.fused_activation)
    assert [op.fused_activation for op in model.main.ops if op.type == "ADD"] == ["RELU"]


# -- the quantized stage: what `convert` runs after quantizing ------------------------------------
def test_quantized_pipeline_is_the_edgetpu_legalization_only() -> None:
    from tflfuse.convert.rule_sets import pipeline
    from tflfuse.targets.edgetpu.heads import HEAD_LEGALIZATION
    from tflfuse.targets.edgetpu.nhwc import NHWC_LEGALIZATION
    from tflfuse.targets.edgetpu.renorm import RENORM_LEGALIZATION
    from tflfuse.targets.edgetpu.rowmean import ROW_MEAN_LEGALIZATION

    names = [p.name for p in pipeline(2, target_named("edgetpu"), quantized=True)]
    first = [*NHWC_LEGALIZATION, *RENORM_LEGALIZATION, *ROW_MEAN_LEGALIZATION]
    legalization = [*first, *HEAD_LEGALIZATION, *EDGETPU_LEGALIZATION]
    assert names[: len(legalization)] == [p.name for p in legalization]
    assert "SplitOversizedTranspose" in names and "FuseActivationIntoProducer" not in names
    assert pipeline(2, target_named("xnnpack"), quantized=True) == ()


MORE = SHARED / "oracle" / "edgetpu-more"
YOLOV8_INT8 = (
    MORE
    / "MaxwellHogan__coral_wifi_webserver"
    / "yolov8n_saved_model__yolov8n_full_integer_quant"
    / "yolov8n_full_integer_quant.tflite"
)
YAMNET_INT8 = MORE / "google-coral__coralmicro/models__yamnet_spectra_in/yamnet_spectra_in.tflite"


@pytest.mark.skipif(not YAMNET_INT8.is_file(), reason="../shared/oracle/edgetpu-more is absent")
def test_legalize_quantized_keeps_a_real_int8_mean_the_compiler_mapped() -> None:
    """YAMNet's int8 head: the compiled twin maps its MEAN over the 3x2 plane as it is (only
    QUANTIZE and DEQUANTIZE stay on the CPU), so the legalization leaves it alone and says why."""
    from tflfuse.convert.rule_sets import legalize_quantized

    data = YAMNET_INT8.read_bytes()
    model = flatbuffer.from_bytes(data)
    assert "MEAN" in ops(model)
    result = legalize_quantized(model)
    assert "MeanToAveragePool" not in result.fired() and "MEAN" in ops(model)
    assert any("maps on the Edge TPU as it is" in r.reason for r in result.refusals)
    twin = YAMNET_INT8.with_name("yamnet_spectra_in_edgetpu.tflite")
    cpu_left = [op.type for op in flatbuffer.from_bytes(twin.read_bytes()).main.ops]
    assert "MEAN" not in cpu_left  # the compiler took the MEAN


# -- detection heads -------------------------------------------------------------------------------
def nearest_upsample(dtype: str, factor: int, hpc: bool = True, align: bool = False) -> bytes:
    g = G() if dtype == "FLOAT32" else Q8()
    if dtype == "FLOAT32":
        x = g.input((1, 3, 5, 4))
        src = g.conv(x, 4, 1)
    else:
        x = g.input((1, 3, 5, 4), 0.05, 0)
        src = x
    size = g.graph.add_constant("size", np.array([3 * factor, 5 * factor], np.int32))
    shape = (1, 3 * factor, 5 * factor, 4)
    options = {"align_corners": align, "half_pixel_centers": hpc}
    if dtype == "FLOAT32":
        y = g.op("RESIZE_NEAREST_NEIGHBOR", [src, size], shape, **options)
    else:
        y = g.op("RESIZE_NEAREST_NEIGHBOR", [src, size], shape, 0.05, 0, **options)
    y.producer.version = 3
    return g.bytes(y)


@pytest.mark.parametrize("factor", [2, 3])
def test_half_pixel_nearest_upsample_float_becomes_version_1_exactly(factor: int) -> None:
    from tflfuse.targets.edgetpu.rules import DropHalfPixelCentersFromNearestResize

    before = nearest_upsample("FLOAT32", factor)
    after, model, result = apply(before, DropHalfPixelCentersFromNearestResize())
    assert ops(model) == ["CONV_2D", "RESIZE_NEAREST_NEIGHBOR"]
    resize = model.main.ops[1]
    assert resize.options["half_pixel_centers"] is False and resize.version == 1
    assert flatbuffer.from_bytes(after).main.ops[1].version == 1
    agreement = assert_same_function(before, after, atol=0, rtol=0)
    assert agreement.identical


def test_half_pixel_nearest_upsample_int8_is_bit_exact_and_maps_on_older_compilers() -> None:
    from tflfuse.targets.edgetpu.rules import DropHalfPixelCentersFromNearestResize

    before = nearest_upsample("INT8", 2)
    after, model, _ = apply(before, DropHalfPixelCentersFromNearestResize())
    assert model.main.ops[0].version == 2
    agreement = verify.compare(before, after, int_atol=0)
    assert agreement.identical and agreement.varies
    assert mapped(before) == mapped(after) == (1, 0)  # compiler 16 maps either
    for data, cpu in ((before, 1), (after, 0)):  # 15.0 refuses op version 3
        assert predict(flatbuffer.from_bytes(data), target_named("edgetpu"), "15.0").cpu == cpu


def test_half_pixel_downsample_and_align_corners_are_refused() -> None:
    from tflfuse.targets.edgetpu.rules import DropHalfPixelCentersFromNearestResize

    g = G()
    x = g.input((1, 6, 6, 2))
    size = g.graph.add_constant("size", np.array([4, 4], np.int32))
    y = g.op("RESIZE_NEAREST_NEIGHBOR", [x, size], (1, 4, 4, 2), half_pixel_centers=True)
    _, model, result = apply(g.bytes(y), DropHalfPixelCentersFromNearestResize())
    assert model.main.ops[0].options["half_pixel_centers"] is True
    assert refusals(result, "DropHalfPixelCentersFromNearestResize") == [
        "6x6 -> 4x4 is not an integer upscale"
    ]
    _, _, result = apply(
        nearest_upsample("FLOAT32", 2, align=True), DropHalfPixelCentersFromNearestResize()
    )
    assert refusals(result, "DropHalfPixelCentersFromNearestResize") == [
        "align_corners with half_pixel_centers picks other pixels"
    ]


def _flatten_nchw(g, x: Tensor, q8: bool) -> Tensor:
    _, h, w, c = x.shape
    perm = g.graph.add_constant("perm", np.array([0, 3, 1, 2], np.int32))
    shape = g.graph.add_constant("shape", np.array([1, c, h * w], np.int32))
    if q8:
        s, z = float(x.quantization.scale[0]), int(x.quantization.zero_point[0])
        t = g.op("TRANSPOSE", [x, perm], (1, c, h, w), s, z)
        return g.op("RESHAPE", [t, shape], (1, c, h * w), s, z)
    return g.op("RESHAPE", [g.op("TRANSPOSE", [x, perm], (1, c, h, w)), shape], (1, c, h * w))


def yolo_head(q8: bool, requantize: bool = False) -> bytes:
    """Three NHWC scales flattened channels-first and joined, then a class-score LOGISTIC.
    int8: the join needs one scale on every input (TFLite's kernel); with `requantize` the
    middle scale comes at another one and a QUANTIZE brings it there, as litert-quantizer does."""
    g = Q8() if q8 else G()
    x = g.input((1, 8, 8, 6), 0.05, 0) if q8 else g.input((1, 8, 8, 6))
    if q8:
        maps = [x]
        for size in (4, 2):
            scale = 0.04 if requantize and size == 4 else 0.05
            options = {**_pool_options(), "stride_h": 8 // size, "stride_w": 8 // size}
            options["filter_height"] = options["filter_width"] = 8 // size
            pooled = g.op("AVERAGE_POOL_2D", [x], (1, size, size, 6), 0.05, 0, **options)
            if scale != 0.05:  # give the map its own scale first
                pooled = g.op("QUANTIZE", [pooled], pooled.shape, scale, 0)
            maps.append(pooled)
    else:
        maps = [g.conv(x, 6, 1), g.conv(x, 6, 3, stride=2), g.conv(x, 6, 3, stride=4)]
    flat = [_flatten_nchw(g, m, q8) for m in maps]
    if q8 and requantize:
        flat[1] = g.op("QUANTIZE", [flat[1]], flat[1].shape, 0.05, 0)
    n = sum(f.shape[2] for f in flat)
    if q8:
        joined = g.op("CONCATENATION", flat, (1, 6, n), 0.05, 0, axis=2,
                      fused_activation_function="NONE")  # fmt: skip
        y = g.op("LOGISTIC", [joined], joined.shape, 1 / 256, -128)
    else:
        joined = g.op("CONCATENATION", flat, (1, 6, n), axis=2, fused_activation_function="NONE")
        y = g.unary("LOGISTIC", joined)
    return g.bytes(y)


def test_flattened_maps_join_in_nhwc_float_exactly() -> None:
    from tflfuse.targets.edgetpu.rules import ConcatFlattenedMapsInNHWC

    before = yolo_head(q8=False)
    after, model, result = apply(before, ConcatFlattenedMapsInNHWC())
    assert result.fired() == {"ConcatFlattenedMapsInNHWC": 1}
    assert ops(model) == [
        "CONV_2D", "CONV_2D", "CONV_2D", "RESHAPE", "RESHAPE", "RESHAPE", "CONCATENATION",
        "TRANSPOSE", "LOGISTIC",
    ]  # fmt: skip
    assert model.main.ops[6].options["axis"] == 1 and model.main.ops[6].output.shape == (1, 84, 6)
    assert assert_same_function(before, after, atol=0, rtol=0).identical


@pytest.mark.parametrize("requantize", [False, True])
def test_flattened_maps_join_in_nhwc_int8_bit_exactly(requantize: bool) -> None:
    from tflfuse.targets.edgetpu.rules import ConcatFlattenedMapsInNHWC

    before = yolo_head(q8=True, requantize=requantize)
    after, model, _ = apply(before, ConcatFlattenedMapsInNHWC())
    assert ops(model).count("TRANSPOSE") == 1
    assert ops(model).count("QUANTIZE") == 2 * int(requantize)  # the map's own, and the moved one
    agreement = verify.compare(before, after, int_atol=0)
    assert agreement.identical and agreement.varies


def test_a_join_of_maps_with_another_layout_is_left_alone() -> None:
    from tflfuse.targets.edgetpu.rules import ConcatFlattenedMapsInNHWC

    g = G()
    x = g.input((1, 4, 4, 3))
    a = _flatten_nchw(g, g.conv(x, 3, 1), q8=False)
    other = g.graph.add_constant("shape2", np.array([1, 3, 16], np.int32))
    b = g.op("RESHAPE", [g.conv(x, 3, 1), other], (1, 3, 16))  # no TRANSPOSE: another layout
    y = g.op("CONCATENATION", [a, b], (1, 3, 32), axis=2, fused_activation_function="NONE")
    _, model, result = apply(g.bytes(y), ConcatFlattenedMapsInNHWC())
    assert ops(model).count("TRANSPOSE") == 1 and not result.fired()
    assert refusals(result, "ConcatFlattenedMapsInNHWC") == [
        "not every input is an NHWC map flattened channels-first"
    ]


def test_maps_with_different_channel_counts_are_refused() -> None:
    from tflfuse.targets.edgetpu.rules import ConcatFlattenedMapsInNHWC

    g = G()
    x = g.input((1, 4, 4, 3))
    a = _flatten_nchw(g, g.conv(x, 3, 1), q8=False)
    b = _flatten_nchw(g, g.conv(x, 5, 1), q8=False)
    # a join along the anchors needs equal channels; this one joins [1, 3, 16] and [1, 5, 16]
    # along axis 2 of a deliberately inconsistent graph only to reach the refusal
    y = g.graph.add_tensor("joined", (1, 3, 32))
    g.graph.add_op("CONCATENATION", [a, b], [y], {"axis": 2, "fused_activation_function": "NONE"})
    g.graph.outputs = [y]
    result = PassManager([ConcatFlattenedMapsInNHWC()], validate=False).run(g.graph)
    assert refusals(result, "ConcatFlattenedMapsInNHWC") == [
        "the maps have different channel counts"
    ]


def test_a_join_whose_one_transpose_would_not_map_is_refused() -> None:
    """A 640-pixel head: the joined [1, N, C] TRANSPOSE and the NHWC rows are over the compiler's
    limits, so joining would trade three refused feature-map transposes for refused ops."""
    from tflfuse.targets.edgetpu.rules import ConcatFlattenedMapsInNHWC

    g = Q8()
    maps = [g.input((1, 40, 40, 144), 0.05, 0)]
    for size in (20, 10):
        options = {**_pool_options(), "stride_h": 40 // size, "stride_w": 40 // size}
        options["filter_height"] = options["filter_width"] = 40 // size
        maps.append(g.op("AVERAGE_POOL_2D", [maps[0]], (1, size, size, 144), 0.05, 0, **options))
    flat = [_flatten_nchw(g, m, q8=True) for m in maps]
    joined = g.op("CONCATENATION", flat, (1, 144, 2100), 0.05, 0, axis=2,
                  fused_activation_function="NONE")  # fmt: skip
    _, model, result = apply(g.bytes(joined), ConcatFlattenedMapsInNHWC())
    assert not result.fired() and ops(model).count("TRANSPOSE") == 3
    [reason] = refusals(result, "ConcatFlattenedMapsInNHWC")
    assert reason.startswith("its NHWC rows would stay on the CPU") and "innermost" in reason


# -- data movement over the compiler's limits ------------------------------------------------------
def _transpose_model(shape, perm, q8: bool = True) -> bytes:
    g = Q8() if q8 else G()
    x = g.input(shape, 0.05, 3) if q8 else g.input(shape)
    p = g.graph.add_constant("perm", np.array(perm, np.int32))
    moved = tuple(shape[i] for i in perm)
    y = g.op("TRANSPOSE", [x, p], moved, 0.05, 3) if q8 else g.op("TRANSPOSE", [x, p], moved)
    return g.bytes(y)


def test_oversized_transpose_int8_is_split_bit_exactly_and_maps() -> None:
    """A YOLOv8 class-score map at 256 pixels: 81920 elements, over the 69696 seen mapped."""
    before = _transpose_model((1, 32, 32, 80), (0, 3, 1, 2))
    after, model, result = apply(before, SplitOversizedTranspose())
    assert result.fired() == {"SplitOversizedTranspose": 1}
    assert ops(model) == ["SLICE", "TRANSPOSE", "SLICE", "TRANSPOSE", "CONCATENATION"]
    assert [op.inputs[0].shape for op in model.main.ops if op.type == "TRANSPOSE"] == [
        (1, 16, 32, 80), (1, 16, 32, 80)
    ]  # fmt: skip
    assert model.main.ops[-1].options["axis"] == 2  # input axis 1 lands on output axis 2
    agreement = verify.compare(before, after, int_atol=0)
    assert agreement.identical and agreement.varies
    assert mapped(before) == (0, 1) and mapped(after) == (5, 0)


def test_a_dfl_transpose_is_split_along_its_sides() -> None:
    before = _transpose_model((1, 4, 16, 1344), (0, 1, 3, 2))
    after, model, _ = apply(before, SplitOversizedTranspose())
    assert ops(model).count("TRANSPOSE") == 2 and model.main.ops[-1].options["axis"] == 1
    assert verify.compare(before, after, int_atol=0).identical
    # the pieces transpose the two innermost dims: no compiled model shows that perm mapped, so
    # the prediction counts them on the CPU and names the reading where all 5 ops map
    p = predict(flatbuffer.from_bytes(after), target_named("edgetpu"))
    assert (p.mapped, p.cpu) == (2, 3)
    assert [r.mapped for r in p.other_readings] == [5]


def test_a_transpose_whose_result_is_over_the_limits_is_not_split() -> None:
    before = _transpose_model((1, 64, 8400), (0, 2, 1))  # [1, 8400, 64]: rows of 537600
    _, model, result = apply(before, SplitOversizedTranspose())
    assert ops(model) == ["TRANSPOSE"]
    [reason] = refusals(result, "SplitOversizedTranspose")
    assert reason.startswith("the transposed tensor itself stays on the CPU")


def test_a_float_transpose_waits_for_the_int8_graph() -> None:
    _, model, result = apply(_transpose_model((1, 32, 32, 80), (0, 3, 1, 2), q8=False),
                             SplitOversizedTranspose())  # fmt: skip
    assert ops(model) == ["TRANSPOSE"] and not result.fired()
    assert refusals(result, "SplitOversizedTranspose") == [
        "float graph: split after quantization, one scale for all pieces"
    ]


@pytest.mark.skipif(not YOLOV8_INT8.is_file(), reason="../shared/oracle/edgetpu-more is absent")
def test_real_yolov8_head_is_cut_along_its_anchors_and_stays_bit_exact() -> None:
    """The Ultralytics int8 export of the compiled pair (640 pixels): the join in NHWC is
    refused (its one TRANSPOSE would not map); the head is cut along its anchors
    (ChunkHeadAlongAnchors, tests/test_edgetpu_heads.py), which takes the refused feature-map
    transposes with it, so SplitOversizedTranspose finds nothing left over its limit; only the
    [1, 84, 8400] output's join stays on the CPU; outputs identical."""
    from tflfuse.convert.rule_sets import legalize_quantized
    from tflfuse.targets.edgetpu.predict import _single_segment, edgetpu_statuses

    def on_cpu(model: Model) -> list[str]:  # by the op table (the forms gate aside)
        flags = _single_segment(model.main, edgetpu_statuses(model))[0]
        return [op.type for op, mapped in zip(model.main.ops, flags, strict=True) if not mapped]

    data = YOLOV8_INT8.read_bytes()
    model = flatbuffer.from_bytes(data)
    assert len(on_cpu(model)) == 25  # 230/255 mapped: the compiler's own log
    before = predict(model, target_named("edgetpu"))
    result = legalize_quantized(model)
    assert "ConcatFlattenedMapsInNHWC" not in result.fired()
    fired = result.fired()
    assert fired["ChunkHeadAlongAnchors"] == 1
    assert set(fired) <= {"ChunkHeadAlongAnchors", "CutTransposeIntoShownForms"}
    assert on_cpu(model) == ["CONCATENATION"]
    # with the forms gate: the pieces' DFL transposes of forms no compiled model shows are cut
    # into shown ones (targets/edgetpu/layout.py), so on the evidence reading too only the
    # output's join is left
    after = predict(model, target_named("edgetpu"))
    assert after.mapped > before.mapped
    assert len(after.ops) - after.mapped == 1
    agreement = verify.compare(data, flatbuffer.to_bytes(model), runs=2, int_atol=0)
    assert agreement.identical and agreement.varies
