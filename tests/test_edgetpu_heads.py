"""Edge TPU heads cut along their anchors (tflfuse/targets/edgetpu/heads.py): tiny int8 heads
built inline (three NHWC scales flattened channels-first and joined, a DFL-like box branch and a
class branch), the ops after, bit-identical outputs, the predicted mapping, the refusals; and the
real 640-pixel YOLOv8n of the compiled pair."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SHARED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rulekit import apply, ops, refusals

from tflfuse.ir import Graph, Model, Quantization, Tensor, flatbuffer
from tflfuse.targets.edgetpu.heads import ChunkHeadAlongAnchors, _reshaped_axis
from tflfuse.verification import verify

RULE = "ChunkHeadAlongAnchors"


def q(scale: float, zero: int) -> Quantization:
    return Quantization(scale=np.array([scale], np.float32), zero_point=np.array([zero], np.int64))


class Head:
    """An int8 graph under construction (per-tensor parameters everywhere)."""

    def __init__(self) -> None:
        self.g = Graph("main")
        self.rng = np.random.default_rng(0)

    def input(self, shape, name: str) -> Tensor:
        t = self.g.add_tensor(name, shape, "INT8", quantization=q(0.05, 3))
        self.g.inputs.append(t)
        return t

    def op(self, type: str, inputs, shape, scale=0.05, zero=3, **options) -> Tensor:
        out = self.g.add_tensor(type.lower(), shape, "INT8", quantization=q(scale, zero))
        self.g.add_op(type, inputs, [out], options)
        return out

    def ints(self, values) -> Tensor:
        return self.g.add_constant("c", np.array(values, np.int32))

    def int8(self, shape, scale=0.02) -> Tensor:
        data = self.rng.integers(-100, 100, shape).astype(np.int8)
        return self.g.add_constant("w", data, "INT8", q(scale, 0))

    def flatten(self, x: Tensor) -> Tensor:
        _, h, w, c = x.shape
        t = self.op("TRANSPOSE", [x, self.ints([0, 3, 1, 2])], (1, c, h, w))
        return self.op("RESHAPE", [t, self.ints([1, c, h * w])], (1, c, h * w))

    def bytes(self, *outputs: Tensor) -> bytes:
        self.g.outputs = list(outputs)
        self.g.validate()
        return flatbuffer.to_bytes(Model([self.g]))


def head(size: int, channels: int = 20, box: int = 16, maps=None, uint8: bool = False) -> bytes:
    """Scales of size, size/2, size/4 pixels with `channels` channels joined along the anchors;
    a box branch (STRIDED_SLICE, RESHAPE [1, 4, box/4, N], TRANSPOSE, SOFTMAX, 1x1 CONV, RESHAPE,
    MUL by per-anchor strides) and a class branch (STRIDED_SLICE, LOGISTIC, requantizing
    QUANTIZE), joined along the channels into the output [1, 4 + channels - box, N]."""
    h = Head()
    xs = (
        maps(h)
        if maps
        else [h.input((1, s, s, channels), f"p{s}") for s in (size, size // 2, size // 4)]
    )
    n = sum(x.shape[1] * x.shape[2] for x in xs)
    joined = h.op("CONCATENATION", [h.flatten(x) for x in xs], (1, channels, n), axis=2,
                  fused_activation_function="NONE")  # fmt: skip
    ends = dict(begin_mask=5, end_mask=5, ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0)
    ones = h.ints([1, 1, 1])
    dist = h.op("STRIDED_SLICE", [joined, h.ints([0, 0, 0]), h.ints([1, box, n]), ones],
                (1, box, n), **ends)  # fmt: skip
    dist = h.op("RESHAPE", [dist, h.ints([1, 4, box // 4, n])], (1, 4, box // 4, n))
    dist = h.op("TRANSPOSE", [dist, h.ints([0, 1, 3, 2])], (1, 4, n, box // 4))
    soft = h.op("SOFTMAX", [dist], dist.shape, 1 / 256, -128, beta=1.0)
    bias = h.g.add_constant("bias", np.zeros(1, np.int32), "INT32", q(0.02 / 256, 0))
    conv = h.op("CONV_2D", [soft, h.int8((1, 1, 1, box // 4)), bias], (1, 4, n, 1), 0.01, -100,
                padding="VALID", stride_h=1, stride_w=1, dilation_h_factor=1,
                dilation_w_factor=1, fused_activation_function="NONE")  # fmt: skip
    boxes = h.op("RESHAPE", [conv, h.ints([1, 4, n])], (1, 4, n), 0.01, -100)
    strides = h.int8((1, 1, n), scale=0.05)
    boxes = h.op("MUL", [boxes, strides], (1, 4, n), 0.05, 3, fused_activation_function="NONE")
    cls = h.op("STRIDED_SLICE", [joined, h.ints([0, box, 0]), h.ints([1, channels, n]),
               h.ints([1, 1, 1])], (1, channels - box, n), **ends)  # fmt: skip
    cls = h.op("LOGISTIC", [cls], cls.shape, 1 / 256, -128)
    cls = h.op("QUANTIZE", [cls], cls.shape, 0.05, 3)
    out = h.op("CONCATENATION", [boxes, cls], (1, 4 + channels - box, n), axis=1,
               fused_activation_function="NONE")  # fmt: skip
    if uint8:  # the edgetpu interface: a uint8 output, requantized from int8
        q8 = h.g.add_tensor("uint8_out", out.shape, "UINT8", quantization=q(0.05, 131))
        h.g.add_op("QUANTIZE", [out], [q8])
        out = q8
    return h.bytes(out)


def _placed(model: Model, multiple: bool = False) -> list[bool]:
    """Which ops the compiler maps by the op table (`delegates/edgetpu.toml`): what the rule
    asks of every op it writes. Whether a compiled model shows each form mapped at its size is
    the forms evidence's question (`forms.gate`): the predictor and benchmarks/edgetpu_heads.py
    report the undecided ones; these tests count by the table, the same under either reading."""
    from tflfuse.targets.edgetpu.predict import _single_segment, edgetpu_statuses

    statuses = edgetpu_statuses(model)
    if multiple:
        return [key == "mapped" for key, _ in statuses]
    return _single_segment(model.main, statuses)[0]


def mapped(data: bytes, multiple: bool = False) -> tuple[int, int]:
    flags = _placed(flatbuffer.from_bytes(data), multiple)
    return sum(flags), len(flags) - sum(flags)


def cpu_ops(model: Model) -> list[str]:
    return [
        op.type for op, on_tpu in zip(model.main.ops, _placed(model), strict=True) if not on_tpu
    ]


def identical(before: bytes, after: bytes) -> None:
    agreement = verify.compare(before, after, runs=2, int_atol=0)
    assert agreement.identical and agreement.varies, agreement


# -- which axis a reshape keeps ------------------------------------------------------------------
def test_a_reshape_keeps_the_anchor_axis_whole_or_merges_whole_rows_into_it() -> None:
    assert _reshaped_axis((1, 144, 80, 80), (1, 144, 6400), 2) == 2  # rows merge: pieces of rows
    assert _reshaped_axis((1, 4, 8400, 1), (1, 1, 4, 8400), 2) == 3
    assert _reshaped_axis((1, 64, 8400), (1, 4, 16, 8400), 2) == 3
    assert _reshaped_axis((1, 4, 8400), (1, 33600), 2) is None  # anchors interleave with boxes
    assert _reshaped_axis((1, 144, 80, 80), (1, 144, 6400), 3) is None  # a column of each row


# -- a head the compiler takes once cut ----------------------------------------------------------
def test_a_320_pixel_head_is_cut_into_pieces_that_all_map_bit_exactly() -> None:
    """[1, 116, 2100] (a seg head's width) is over the compiler's 176400 in its two innermost
    dimensions; the [1, 104, 2100] output is not (218400 > 176400 still: joined on the CPU)."""
    before = head(40, channels=116, box=16)
    after, model, result = apply(before, ChunkHeadAlongAnchors())
    assert result.fired() == {RULE: 1}
    assert mapped(before)[1] > 0 and mapped(after) == (len(model.main.ops) - 1, 1)
    [last] = [op for op in model.main.ops if op.outputs[0] in model.main.outputs]
    assert last.type == "CONCATENATION" and last.options["axis"] == 2
    identical(before, after)


def test_the_uint8_output_requantization_is_cut_with_the_head() -> None:
    """`tflfuse convert --recipe edgetpu` ends an int8 model with a QUANTIZE to uint8: it maps,
    so it is computed per piece too, and the one op left on the CPU is the uint8 output's join."""
    before = head(40, channels=116, box=16, uint8=True)
    after, model, result = apply(before, ChunkHeadAlongAnchors())
    assert result.fired() == {RULE: 1}
    assert cpu_ops(model) == ["CONCATENATION"] and model.main.outputs[0].dtype == "UINT8"
    identical(before, after)


def test_a_head_whose_output_fits_maps_in_full() -> None:
    """[1, 84, 2100] = 176400: the output's join maps too, so every op maps, in one segment."""
    before = head(40, channels=144, box=64)
    after, model, result = apply(before, ChunkHeadAlongAnchors())
    assert result.fired() == {RULE: 1}
    assert mapped(after) == (len(model.main.ops), 0) and mapped(after, multiple=True)[1] == 0
    transposes = [op for op in model.main.ops if op.type == "TRANSPOSE"]
    assert all(op.inputs[0].size <= 69696 for op in transposes)  # the compiler's TRANSPOSE limit
    # the maps are flattened in pieces of whole rows (40x40: 4 of 10 rows; 20x20 and 10x10
    # whole), the decode after the join runs on pieces of up to 1089 anchors (the box
    # distribution's transpose): 800, 800, 500
    flattened = [
        op for op in model.main.ops if op.type == "TRANSPOSE" and op.inputs[0].shape[-1] == 144
    ]
    assert len(flattened) == 6
    assert sorted(op.outputs[0].shape[2] for op in model.main.ops if op.type == "SOFTMAX") == [
        500, 800, 800
    ]  # fmt: skip
    identical(before, after)


def test_a_join_that_maps_is_left_alone() -> None:
    before = head(16, channels=20, box=16)  # [1, 20, 336]
    _, model, result = apply(before, ChunkHeadAlongAnchors())
    assert not result.fired() and ops(model).count("SOFTMAX") == 1
    assert "the join maps as it is" in refusals(result, RULE)


def test_a_head_after_the_segment_is_not_cut() -> None:
    """The largest scale comes from a pool the compiler refuses (a fused RELU) after a mapped
    conv: the head reads what the CPU computes after the segment, so pieces would be CPU work."""

    def maps(h: Head) -> list[Tensor]:
        x = h.input((1, 40, 40, 116), "image")
        bias = h.g.add_constant("b", np.zeros(116, np.int32), "INT32", q(0.001, 0))
        y = h.op("DEPTHWISE_CONV_2D", [x, h.int8((1, 1, 1, 116)), bias], x.shape,
                 padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1,
                 dilation_h_factor=1, dilation_w_factor=1,
                 fused_activation_function="NONE")  # fmt: skip
        pool = dict(
            padding="VALID", filter_height=1, filter_width=1, fused_activation_function="RELU"
        )
        y = h.op("MAX_POOL_2D", [y], y.shape, stride_h=1, stride_w=1, **pool)
        return [y, h.input((1, 20, 20, 116), "p20"), h.input((1, 10, 10, 116), "p10")]

    before = head(40, channels=116, box=16, maps=maps)
    _, model, result = apply(before, ChunkHeadAlongAnchors())
    assert not result.fired()
    reasons = [r for r in refusals(result, RULE) if "join" not in r]
    assert reasons and all(
        "is computed on the CPU after the Edge TPU segment" in r for r in reasons
    )


def test_a_float_head_waits_for_the_int8_graph() -> None:
    h = Head()
    xs = [h.g.add_tensor(f"p{s}", (1, s, s, 116)) for s in (40, 20, 10)]
    h.g.inputs.extend(xs)
    flat = []
    for x in xs:
        _, s, _, c = x.shape
        t = h.g.add_tensor("t", (1, c, s, s))
        h.g.add_op("TRANSPOSE", [x, h.ints([0, 3, 1, 2])], [t])
        f = h.g.add_tensor("f", (1, c, s * s))
        h.g.add_op("RESHAPE", [t, h.ints([1, c, s * s])], [f])
        flat.append(f)
    y = h.g.add_tensor("y", (1, 116, 2100))
    h.g.add_op("CONCATENATION", flat, [y], {"axis": 2, "fused_activation_function": "NONE"})
    _, _, result = apply(h.bytes(y), ChunkHeadAlongAnchors())
    assert not result.fired()
    assert "float graph: cut after quantization, one scale for all pieces" in refusals(result, RULE)


# -- the real head ----------------------------------------------------------------------------
YOLOV8_INT8 = (
    SHARED / "oracle" / "edgetpu-more" / "MaxwellHogan__coral_wifi_webserver"
    / "yolov8n_saved_model__yolov8n_full_integer_quant" / "yolov8n_full_integer_quant.tflite"
)  # fmt: skip


@pytest.mark.skipif(not YOLOV8_INT8.is_file(), reason="../shared/oracle/edgetpu-more is absent")
def test_the_compiled_yolov8n_head_maps_but_its_output_join() -> None:
    """640 pixels: 230/255 predicted mapped (the compiler's own log: 230); the maps flattened
    in 19 pieces of whole rows (14 of the 80x80 map, 4 of the 40x40, the 20x20 whole), the
    decode in 10 (two by two where the box distribution's transpose allows: up to 1089
    anchors); every op mapped but the [1, 84, 8400] output's join, in one segment with -a
    too; outputs bit-identical."""
    before = YOLOV8_INT8.read_bytes()
    after, model, result = apply(before, ChunkHeadAlongAnchors())
    assert result.fired() == {RULE: 1}
    assert mapped(before) == (230, 25)
    n = len(model.main.ops)
    assert mapped(after) == (n - 1, 1) and mapped(after, multiple=True) == (n - 1, 1)
    # transposes: 18 flattening pieces, the 20x20 map's own (it maps), 2 per decode piece
    assert ops(model).count("SOFTMAX") == 10 and ops(model).count("TRANSPOSE") == 18 + 1 + 2 * 10
    assert cpu_ops(model) == ["CONCATENATION"]
    identical(before, after)


# -- a MEAN over a channel count the compiler refuses ----------------------------------------------
def _nchw_mean(q8: bool, width: int = 7) -> bytes:
    """A squeeze-excite MEAN of an NCHW export: [1, 16, 7, 7] over H and W (keep_dims)."""
    h = Head()
    shape = (1, 16, width, width)
    if q8:
        x = h.input(shape, "x")
        y = h.op("MEAN", [x, h.ints([2, 3])], (1, 16, 1, 1), 0.01, -5, keep_dims=True)
    else:
        x = h.g.add_tensor("x", shape)
        h.g.inputs.append(x)
        y = h.g.add_tensor("y", (1, 16, 1, 1))
        h.g.add_op("MEAN", [x, h.ints([2, 3])], [y], {"keep_dims": True})
    return h.bytes(y)


def test_a_mean_over_seven_innermost_values_reads_them_padded_to_eight_float_exactly() -> None:
    from rulekit import assert_same_function

    from tflfuse.targets.edgetpu.heads import PadChannelsForMean

    before = _nchw_mean(q8=False)
    after, model, result = apply(before, PadChannelsForMean())
    assert result.fired() == {"PadChannelsForMean": 1}
    assert ops(model) == ["PAD", "MEAN", "MUL"]
    assert model.main.ops[0].outputs[0].shape == (1, 16, 7, 8)
    assert_same_function(before, after, atol=1e-6, rtol=1e-6)


def test_a_mean_over_seven_innermost_values_int8_stays_within_its_steps_and_maps() -> None:
    from tflfuse.targets.edgetpu.heads import PadChannelsForMean

    before = _nchw_mean(q8=True)
    after, model, result = apply(before, PadChannelsForMean())
    assert result.fired() == {"PadChannelsForMean": 1}
    assert mapped(before) == (0, 1) and mapped(after) == (3, 0)
    agreement = verify.compare(before, after, runs=4, int_atol=PadChannelsForMean.int8_error_steps)
    assert agreement.ok and agreement.varies, agreement


def test_a_mean_over_a_multiple_of_four_is_left_alone() -> None:
    from tflfuse.targets.edgetpu.heads import PadChannelsForMean

    _, model, result = apply(_nchw_mean(q8=True, width=8), PadChannelsForMean())
    assert not result.fired() and ops(model) == ["MEAN"]


def test_a_litert_torch_head_with_two_joins_and_an_anchor_grid_is_cut_as_one() -> None:
    """litert-torch's YOLOv8 head at 640 pixels: box and class maps joined separately ([1, 64,
    8400] and [1, 80, 8400], both over the limit), the box decode reads an anchor grid [2, 8400]
    (rank 2, lined up with the anchors) and strides [1, 1, 8400]; the two branches meet in the
    output's join along the channels. One region, both joins cut alike, bit-identical."""
    h = Head()
    sizes = (80, 40, 20)
    n = sum(s * s for s in sizes)

    def join(channels: int, name: str) -> Tensor:
        flat = [h.flatten(h.input((1, s, s, channels), f"{name}{s}")) for s in sizes]
        return h.op("CONCATENATION", flat, (1, channels, n), axis=2,
                    fused_activation_function="NONE")  # fmt: skip

    box, cls = join(64, "box"), join(80, "cls")
    dist = h.op("RESHAPE", [box, h.ints([1, 4, 16, n])], (1, 4, 16, n))
    dist = h.op("TRANSPOSE", [dist, h.ints([0, 1, 3, 2])], (1, 4, n, 16))
    soft = h.op("SOFTMAX", [dist], dist.shape, 1 / 256, -128, beta=1.0)
    bias = h.g.add_constant("bias", np.zeros(1, np.int32), "INT32", q(0.02 / 256, 0))
    conv = h.op("CONV_2D", [soft, h.int8((1, 1, 1, 16)), bias], (1, 4, n, 1), 0.01, -100,
                padding="VALID", stride_h=1, stride_w=1, dilation_h_factor=1,
                dilation_w_factor=1, fused_activation_function="NONE")  # fmt: skip
    ltrb = h.op("RESHAPE", [conv, h.ints([1, 4, n])], (1, 4, n), 0.01, -100)
    lt = h.op("SLICE", [ltrb, h.ints([0, 0, 0]), h.ints([1, 2, n])], (1, 2, n), 0.01, -100)
    rb = h.op("SLICE", [ltrb, h.ints([0, 2, 0]), h.ints([1, 2, n])], (1, 2, n), 0.01, -100)
    grid = h.int8((2, n), scale=0.5)
    x1y1 = h.op("SUB", [grid, lt], (1, 2, n), 0.5, 0, fused_activation_function="NONE")
    x2y2 = h.op("ADD", [grid, rb], (1, 2, n), 0.5, 0, fused_activation_function="NONE")
    xy = h.op("ADD", [x1y1, x2y2], (1, 2, n), 0.5, 0, fused_activation_function="NONE")
    wh = h.op("SUB", [x2y2, x1y1], (1, 2, n), 0.5, 0, fused_activation_function="NONE")
    xywh = h.op("CONCATENATION", [xy, wh], (1, 4, n), 0.5, 0, axis=1,
                fused_activation_function="NONE")  # fmt: skip
    xywh = h.op("MUL", [xywh, h.int8((1, 1, n), scale=0.1)], (1, 4, n), 0.5, 0,
                fused_activation_function="NONE")  # fmt: skip
    scores = h.op("LOGISTIC", [cls], cls.shape, 1 / 256, -128)
    scores = h.op("QUANTIZE", [scores], cls.shape, 0.5, 0)
    out = h.op("CONCATENATION", [xywh, scores], (1, 84, n), 0.5, 0, axis=1,
               fused_activation_function="NONE")  # fmt: skip
    before = h.bytes(out)
    after, model, result = apply(before, ChunkHeadAlongAnchors())
    assert result.fired() == {RULE: 1}
    assert mapped(before)[1] > 10 and mapped(after) == (len(model.main.ops) - 1, 1)
    # the pieces: whole rows of the 80x80 map (an 80-channel transpose fits 10 rows: 8 pieces
    # for both branches), of the 40x40 map (21 rows: 2 pieces), the 20x20 map whole
    assert ops(model).count("SOFTMAX") == ops(model).count("LOGISTIC") == 11
    grids = [op.inputs[0] for op in model.main.ops if op.type == "SUB" and op.inputs[0].is_constant]
    assert sorted({t.shape for t in grids}) == [(2, 400), (2, 800)]
    identical(before, after)


def test_a_keypoint_decode_is_cut_with_the_head() -> None:
    """A pose head's keypoints [1, 51, 8400] decoded as [1, 17, 3, 8400] (three non-trivial
    dimensions: the compiler takes them) with a per-anchor grid: every op maps in pieces of
    whole rows; only the output's join stays on the CPU."""
    h = Head()
    flat = [h.flatten(h.input((1, s, s, 51), f"kpt{s}")) for s in (80, 40, 20)]
    joined = h.op("CONCATENATION", flat, (1, 51, 8400), axis=2, fused_activation_function="NONE")
    kpts = h.op("RESHAPE", [joined, h.ints([1, 17, 3, 8400])], (1, 17, 3, 8400))
    kpts = h.op(
        "MUL", [kpts, h.int8((1, 1, 1, 8400))], kpts.shape, fused_activation_function="NONE"
    )
    out = h.op("RESHAPE", [kpts, h.ints([1, 51, 8400])], (1, 51, 8400))
    before = h.bytes(out)
    after, model, result = apply(before, ChunkHeadAlongAnchors())
    assert result.fired() == {RULE: 1}
    assert cpu_ops(model) == ["CONCATENATION"]
    assert mapped(before)[0] < mapped(after)[0] == len(model.main.ops) - 1
    # flattened: the 80x80 map in 5 x 16 rows (a 51-channel transpose fits 17 rows), 40x40 in
    # 2 x 20, 20x20 whole; decoded in pieces of up to 3458 anchors (51 x 3458 <= 176400)
    assert sorted(op.outputs[0].shape for op in model.main.ops if op.type == "MUL") == [
        (1, 17, 3, 2560), (1, 17, 3, 2560), (1, 17, 3, 3280)
    ]  # fmt: skip
    identical(before, after)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.sampled_from([40, 48, 56, 80]),
    channels=st.sampled_from([84, 100, 116, 144]),
    box=st.sampled_from([16, 32, 64]),
)
def test_random_heads_are_cut_bit_exactly_into_pieces_that_map(size, channels, box) -> None:
    """Heads of other sizes and widths: whenever the join is over the limits the rule fires,
    every op it writes maps (only an output over the limits stays on the CPU: its join), and
    the outputs are bit-identical."""
    before = head(size, channels=channels, box=box)
    after, model, result = apply(before, ChunkHeadAlongAnchors())
    n = sum((size // d) ** 2 for d in (1, 2, 4))
    assert result.fired() == ({RULE: 1} if channels * n > 176400 else {})
    if result.fired():
        out = 4 + channels - box
        assert cpu_ops(model) == (["CONCATENATION"] if out * n > 176400 else [])
        identical(before, after)
