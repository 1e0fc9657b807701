"""The example zoo: every architecture builds, converts to float TFLite, computes the Keras
function, gives outputs that vary with the input, and holds the patterns it exists to exercise."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from tflfuse.device.interpreter import make_interpreter
from tflfuse.errors import TflfuseError
from tflfuse.examples import zoo
from tflfuse.ir import flatbuffer
from tflfuse.verification.runs import run
from tflfuse.verification.verify import seeded_inputs


@pytest.fixture(scope="module", params=sorted(zoo.BUILDERS))
def converted(request: pytest.FixtureRequest) -> tuple[str, object, bytes]:
    model = zoo.build(request.param)
    return request.param, model, zoo.to_tflite(model)


def _sibling_count(graph, op_type: str) -> int:
    """Largest number of `op_type` ops reading one non-constant tensor."""
    best = 0
    for t in graph.tensors:
        if not t.is_constant:
            best = max(best, sum(1 for op in t.consumers if op.type == op_type))
    return best


def test_converts_computes_keras_function_and_varies(converted) -> None:
    name, model, data = converted
    interp = make_interpreter(data)
    inputs = seeded_inputs(interp, seed=0, runs=3)
    outputs = run(data, inputs)
    assert not np.array_equal(outputs[0][0], outputs[1][0]), f"{name}: constant output"
    assert np.std(outputs[0][0]) > 1e-4
    for one, out in zip(inputs, outputs):
        expected = np.asarray(model([one[0]]))
        np.testing.assert_allclose(out[0], expected, atol=1e-4, rtol=1e-3)
    shape = tuple(interp.get_input_details()[0]["shape"])
    assert shape[0] == 1 and len(shape) >= 3


EXPECTED_PATTERNS = {
    "mobilenet_v2": lambda g, c: c.get("DEPTHWISE_CONV_2D", 0) >= 10,
    "mobilenet_v3_small": lambda g, c: c.get("HARD_SWISH", 0) > 0 and c.get("MEAN", 0) > 1,
    "efficientnet_b0": lambda g, c: c.get("LOGISTIC", 0) > 0 and c.get("MUL", 0) > 0,
    # pre-activation BatchNorm stays as MUL + ADD: it does not directly follow a conv
    "resnet_v2_style": lambda g, c: c.get("MUL", 0) >= 3,
    "inception_style": lambda g, c: _sibling_count(g, "CONV_2D") >= 3,
    "transformer_encoder": lambda g, c: _sibling_count(g, "FULLY_CONNECTED") >= 3,
    "ds_cnn": lambda g, c: c.get("DEPTHWISE_CONV_2D", 0) == 4 and c.get("CONV_2D", 0) == 5,
    "yolo_style": lambda g, c: all(c.get(k, 0) for k in ("LEAKY_RELU", "HARD_SWISH", "MEAN")),
}


def test_architecture_holds_its_patterns(converted) -> None:
    name, _, data = converted
    graph = flatbuffer.from_bytes(data, name).subgraphs[0]
    counts = graph.op_counts()
    assert EXPECTED_PATTERNS[name](graph, counts), f"{name}: {counts}"
    assert "SHAPE" not in counts  # batch-1 inputs convert without dynamic-shape plumbing


def test_every_builder_has_a_pattern_check() -> None:
    assert set(EXPECTED_PATTERNS) == set(zoo.BUILDERS)


def test_unknown_name_is_a_one_line_error() -> None:
    with pytest.raises(TflfuseError, match="unknown zoo model"):
        zoo.build("no_such_net")
