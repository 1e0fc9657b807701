"""Shared calibrated ranges (`tflfuse.quantize.shared_ranges`): an exact copy keeps its input's
range and a concatenation's part takes the concatenation's, so each rounds once.

The rules are tested on statistics directly (no TensorFlow); then through litert-quantizer on a
small graph as the Edge TPU's attention rules write it (a copy convolution, parts joined by
CONCATENATION): fewer QUANTIZE ops and no larger error against the float model.
"""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G

from tflfuse.ir import Tensor, flatbuffer
from tflfuse.quantize.shared_ranges import is_exact_copy, shared_ranges


def _stat(lo: float, hi: float) -> dict[str, np.ndarray]:
    return {"min": np.array([lo]), "max": np.array([hi])}


def _copy_conv(g: G, x: Tensor, repeat: int, *, weight: float = 1.0, act: str = "NONE") -> Tensor:
    """A 1x1 CONV_2D repeating the channels of x `repeat` times (weights 0/1, a zero bias)."""
    c = x.shape[-1]
    w = np.zeros((repeat * c, 1, 1, c), np.float32)
    for j in range(repeat * c):
        w[j, 0, 0, j % c] = weight
    shape = (*x.shape[:-1], repeat * c)
    return g.op(
        "CONV_2D",
        [x, g.const(w, "repeat"), g.const(np.zeros(repeat * c, np.float32), "zero")],
        shape,
        padding="VALID",
        stride_h=1,
        stride_w=1,
        fused_activation_function=act,
    )


def _joined(seed: int = 0) -> tuple[G, Tensor]:
    """The attention rules' repeat, product and pieces, in small: a SLICE of y's channels
    repeated by a copy conv, its MUL with z, two 1x1 convs each RESHAPEd and joined by
    CONCATENATION."""
    g = G(seed)
    x = g.input((1, 4, 4, 3))
    y = g.conv(x, 6)
    begin, size = g.const(np.zeros(4, np.int32), "begin"), g.const([1, 4, 4, 3], "size")
    part = g.op("SLICE", [y, begin, size], (1, 4, 4, 3))
    r = _copy_conv(g, part, 2)
    t = g.binary("MUL", r, g.conv(x, 6))
    pieces = [
        g.op("RESHAPE", [g.conv(t, 2), g.const([1, 16, 2], "shape")], (1, 16, 2)) for _ in "ab"
    ]
    g.out = g.op("CONCATENATION", pieces, (1, 16, 4), axis=2, fused_activation_function="NONE")
    return g, x


def test_a_copy_conv_is_recognized_and_a_scaled_or_clipped_one_is_not() -> None:
    g = G()
    x = g.input((1, 2, 2, 3))
    assert is_exact_copy(_copy_conv(g, x, 2).producer)
    assert not is_exact_copy(_copy_conv(g, x, 2, weight=2.0).producer)
    assert not is_exact_copy(_copy_conv(g, x, 2, act="RELU").producer)
    assert not is_exact_copy(g.conv(x, 3).producer)  # random weights


def test_a_copy_takes_its_inputs_range_and_parts_take_the_concatenations() -> None:
    g, _ = _joined()
    graph = g.model(g.out).main
    (copy,) = [op for op in graph.ops if is_exact_copy(op)]
    part = copy.input(0)
    views = graph.ops_of("RESHAPE")
    a, b = (op.input(0) for op in views)
    stats = {
        part.name: _stat(-2.0, 3.0),
        copy.output.name: _stat(-1.0, 1.5),
        a.name: _stat(-0.5, 0.5),
        views[0].output.name: _stat(-0.5, 0.5),
        b.name: _stat(-4.0, 1.0),
        views[1].output.name: _stat(-4.0, 1.0),
        g.out.name: _stat(-4.0, 1.0),
    }
    out, changed = shared_ranges(graph, stats)
    assert (out[copy.output.name]["min"].item(), out[copy.output.name]["max"].item()) == (-2, 3)
    for t in (a, views[0].output):  # the piece and its view, down to the conv writing it
        assert (out[t.name]["min"].item(), out[t.name]["max"].item()) == (-4.0, 1.0)
    assert a.name in changed and copy.output.name in changed
    assert stats[a.name]["min"].item() == -0.5  # the given statistics untouched


def test_a_part_read_elsewhere_keeps_its_own_range() -> None:
    g = G()
    x = g.input((1, 4, 4, 3))
    a, b = g.conv(x, 2), g.conv(x, 2)
    joined = g.op("CONCATENATION", [a, b], (1, 4, 4, 4), axis=3, fused_activation_function="NONE")
    other = g.unary("RELU", a)  # a second reader of a
    graph = g.model(joined, other).main
    stats = {a.name: _stat(-0.5, 0.5), b.name: _stat(-4.0, 1.0), joined.name: _stat(-4.0, 1.0)}
    out, changed = shared_ranges(graph, stats)
    assert out[a.name]["min"].item() == -0.5
    assert a.name not in changed and b.name in changed


def test_shared_ranges_drop_the_requantizations_and_add_no_error() -> None:
    pytest.importorskip("litert_quantizer")
    from tflfuse.quantize.quantize import quantize
    from tflfuse.sources import tflite as tflite_frontend
    from tflfuse.verification.runs import run_float

    g, _ = _joined(seed=3)
    data = tflite_frontend.load(g.bytes(g.out)).float_tflite(None)
    rng = np.random.default_rng(0)
    calib = rng.uniform(-1, 1, (32, 4, 4, 3)).astype(np.float32)
    plain = quantize(data, "int8", [calib], progress=False)
    shared = quantize(data, "int8", [calib], progress=False, share_ranges=True)

    def requantizations(q: bytes) -> int:
        """int8 -> int8 QUANTIZE ops that change the scale (the quantizer writes one before each
        RESHAPEd piece of a CONCATENATION; one of the same parameters copies)."""
        graph = flatbuffer.from_bytes(q).main
        return sum(
            op.type == "QUANTIZE"
            and op.input(0).dtype == "INT8"
            and not op.input(0).quantization.same_as(op.output.quantization)
            for op in graph.ops
        )

    assert requantizations(plain.data) >= 1  # a piece rounded at its own scale, then again
    assert requantizations(shared.data) == 0
    x = rng.uniform(-1, 1, (64, 4, 4, 3)).astype(np.float32)
    ref = run_float(data, [x])[0]
    err_plain = np.abs(run_float(plain.data, [x])[0] - ref)
    err_shared = np.abs(run_float(shared.data, [x])[0] - ref)
    assert np.sqrt((err_shared**2).mean()) <= np.sqrt((err_plain**2).mean())


@pytest.mark.parametrize("softmax", [True, False])
def test_joined_copies_of_one_tensor_keep_its_range(softmax: bool) -> None:
    """spread's copies of an operand: a slice of it reshaped, joined with itself (4 copies) and
    that join with itself: the views and joins take the operand's range (a softmax's fixed one,
    [0, 255/256]), where calibrated alone they got the narrower one of the rows copied."""
    g = G()
    x = g.input((1, 8, 6))
    a = g.op("SOFTMAX", [x], (1, 8, 6), beta=1.0) if softmax else g.unary("TANH", x)
    begin, size = g.const(np.zeros(3, np.int32), "begin"), g.const([1, 4, 6], "size")
    part = g.op("SLICE", [a, begin, size], (1, 4, 6))
    plane = g.op("RESHAPE", [part, g.const([1, 2, 2, 6], "shape")], (1, 2, 2, 6))
    four = g.op("CONCATENATION", [plane] * 4, (1, 2, 2, 24), axis=3)
    eight = g.op("CONCATENATION", [four, four], (1, 2, 2, 48), axis=3)
    other = g.op("CONCATENATION", [plane, g.unary("TANH", plane)], (1, 2, 2, 12), axis=3)
    graph = g.graph
    stats = {t.name: _stat(0.1, 0.4) for t in (part, plane, four, eight, other)}
    stats[a.name] = _stat(-0.9, 0.95)
    out, changed = shared_ranges(graph, stats)
    lo, hi = (0.0, 255 / 256) if softmax else (-0.9, 0.95)
    for t in (part, plane, four, eight):
        assert (float(out[t.name]["min"][0]), float(out[t.name]["max"][0])) == (lo, hi)
        assert t.name in changed
    assert other.name not in changed  # a join of two different tensors
