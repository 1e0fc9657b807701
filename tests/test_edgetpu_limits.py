"""The row limit at a model's interface, named in the compile modes' notes (`check`, the
report): an NCHW image input over it with the --channels-last remedy, an output over it with
none (tflfuse/targets/edgetpu/limits.py)."""

from __future__ import annotations

from rulekit import G

from tflfuse.ir import flatbuffer
from tflfuse.targets.edgetpu.limits import interface_limit_notes
from tflfuse.targets.edgetpu.modes import compare_modes


def _inputs(model) -> list[str]:
    return [n for n in interface_limit_notes(model) if n.startswith("input")]


def _model(in_shape, out_shape=None):
    g = G()
    x = g.unary("TANH", g.input(in_shape, "image"))
    if out_shape is None:
        return flatbuffer.from_bytes(g.bytes(x))
    a = g.unary("TANH", g.input((1, out_shape[1] // 2, out_shape[2]), "a"))
    b = g.unary("TANH", g.input((1, out_shape[1] - out_shape[1] // 2, out_shape[2]), "b"))
    joined = g.op("CONCATENATION", [a, b], out_shape, axis=1)
    return flatbuffer.from_bytes(g.bytes(x, joined))


def test_an_nchw_image_input_over_the_row_limit_names_channels_last() -> None:
    [note] = _inputs(_model((1, 3, 640, 640)))
    assert "[1, 3, 640, 640] holds 409,600 elements" in note
    assert "[1, 640, 640, 3]: 1,920" in note and "--channels-last" in note
    assert any("--channels-last" in n for n in compare_modes(_model((1, 3, 640, 640))).notes)


def test_inputs_within_the_limit_or_not_images_get_no_remedy() -> None:
    assert _inputs(_model((1, 640, 640, 3))) == []
    assert _inputs(_model((1, 3, 320, 320))) == []  # 102,400: within
    [note] = _inputs(_model((1, 8, 500, 500)))  # 8 channels: not an image
    assert "250,000 elements" in note and "--channels-last" not in note


def test_a_joined_head_output_over_the_limit_is_named_with_its_writer() -> None:
    notes = interface_limit_notes(_model((1, 64, 64, 3), (1, 135, 2100)))
    assert len(notes) == 1
    assert "[1, 135, 2100] holds 283,500 elements" in notes[0]
    assert "CONCATENATION" in notes[0] and "every mode" in notes[0]
    assert interface_limit_notes(_model((1, 64, 64, 3), (1, 84, 2100))) == []  # 176,400
