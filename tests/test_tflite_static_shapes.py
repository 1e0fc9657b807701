"""Internal tensors an exporter marked dynamic, in a model whose inputs are static, take the static
shapes the interpreter computes from those inputs (onnx2tf 2.6's MobileViT: 117 such tensors after
SLICEs whose size reads "to the end"); a stored shape the interpreter disagrees with stays
refused, in one line."""

from __future__ import annotations

import irgraphs
import numpy as np
import pytest

from tflfuse.errors import ModelError
from tflfuse.ir import Graph, flatbuffer
from tflfuse.sources import tflite
from tflfuse.verification.runs import run_float


def _slice_to_the_end(stored: tuple[int, ...] = (1, 4, 4, 6)) -> bytes:
    """x [1,4,4,8] -> SLICE(begin [0,0,0,2], size [-1,-1,-1,-1]) -> RESHAPE [1,16,6] -> ADD,
    the sliced and reshaped tensors marked (1, -1, -1, -1) and (-1, -1, -1) as onnx2tf 2.6
    writes them; `stored` is the slice's stored shape."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 4, 4, 8))
    begin = g.add_constant("begin", np.array([0, 0, 0, 2], np.int32), "INT32")
    size = g.add_constant("size", np.array([-1, -1, -1, -1], np.int32), "INT32")
    sliced = g.add_tensor("sliced", stored)
    g.add_op("SLICE", [x, begin, size], [sliced])
    sliced.shape_signature = (1, -1, -1, -1)
    shape = g.add_constant("shape", np.array([1, 16, 6], np.int32), "INT32")
    tokens = g.add_tensor("tokens", (1, 16, 6))
    g.add_op("RESHAPE", [sliced, shape], [tokens], {"new_shape": [1, 16, 6]})
    tokens.shape_signature = (-1, -1, -1)
    bias = g.add_constant("bias", irgraphs.weights(1, 16, 6))
    y = irgraphs.add(g, tokens, bias, name="y").output
    return irgraphs.to_bytes(irgraphs.model_of(g, [x], [y]))


def test_dynamic_internal_tensors_take_the_interpreters_static_shapes() -> None:
    data = _slice_to_the_end()
    source = tflite.load(data)
    assert any("2 internal tensors the exporter marked dynamic" in n for n in source.notices)
    model = flatbuffer.from_bytes(source.float_tflite(None))
    signatures = {t.name: t.shape_signature for t in model.main.tensors}
    assert signatures["sliced"] == (1, 4, 4, 6)
    assert signatures["tokens"] == (1, 16, 6)
    x = np.random.default_rng(0).normal(size=(3, 4, 4, 8)).astype(np.float32)
    assert np.array_equal(run_float(source.float_tflite(None), [x])[0], run_float(data, [x])[0])


def test_a_stored_shape_the_interpreter_contradicts_stays_refused() -> None:
    """The slice stored as [1,4,4,5] where the interpreter computes [1,4,4,6]: no shape is
    guessed, the file is refused as before."""
    with pytest.raises(ModelError, match="tensor sliced has dynamic dimensions"):
        tflite.load(_slice_to_the_end(stored=(1, 4, 4, 5)))


def test_a_dynamic_input_is_not_inferred() -> None:
    model = flatbuffer.from_bytes(_slice_to_the_end())
    model.main.inputs[0].shape_signature = (1, -1, -1, 8)
    with pytest.raises(ModelError, match="input x has dynamic dimensions"):
        tflite.load(flatbuffer.to_bytes(model))
