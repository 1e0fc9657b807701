"""A .tflite whose op reads a tensor no op writes (not a model input, not a constant) is a broken
export the interpreter cannot run ("Input tensor N lacks data" at its first invoke; onnx2tf 2.6's
EdgeNeXt): `tflfuse convert` refuses it in one line naming the file, the tensor (index and name)
and the op that reads it, before any work, never with a traceback."""

from __future__ import annotations

from pathlib import Path

import irgraphs
import numpy as np
import pytest

from tflfuse.cli import main
from tflfuse.device.interpreter import make_interpreter
from tflfuse.errors import ModelError
from tflfuse.ir import Graph
from tflfuse.sources import tflite


def _orphan_read() -> bytes:
    """x [1,8] -> ADD(x, orphan) -> MUL(., 2): `orphan` (tensor 1) has no writer and no data."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 8))
    orphan = g.add_tensor("orphan/bias", (1, 8))
    y = irgraphs.add(g, x, orphan, name="y").output
    two = g.add_constant("two", np.full((1,), 2.0, np.float32))
    z = g.add_tensor("z", (1, 8))
    g.add_op("MUL", [y, two], [z], {"fused_activation_function": "NONE"})
    return irgraphs.to_bytes(irgraphs.model_of(g, [x], [z]))


def test_the_interpreter_cannot_run_it() -> None:
    """The premise: it builds and fails at invoke (what stock conversion meets too)."""
    interp = make_interpreter(_orphan_read(), delegate="none")
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], np.zeros((1, 8), np.float32))
    with pytest.raises(RuntimeError, match="Input tensor 1 lacks data"):
        interp.invoke()


def test_load_names_the_tensor_and_the_op_that_reads_it() -> None:
    with pytest.raises(ModelError) as caught:
        tflite.load(_orphan_read())
    text = str(caught.value)
    assert text.startswith("<bytes>: tensor 1 'orphan/bias' is read by op 0 (ADD)")
    assert "written by no op" in text and "\n" not in text


def test_convert_refuses_it_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "broken.tflite"
    path.write_bytes(_orphan_read())
    out = tmp_path / "out.tflite"
    assert main(["convert", str(path), "--recipe", "edgetpu", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{path}: tensor 1 'orphan/bias' is read by op 0 (ADD)" in err
    assert not out.exists()


def test_a_reshape_shape_operand_read_for_its_shape_only_passes() -> None:
    """RESHAPE's second input, when not a vector, is read for nothing (the interpreter lets it
    pass): the model loads."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 8))
    shape = g.add_tensor("shape_only", (2, 4), "INT32")
    y = g.add_tensor("y", (2, 4))
    g.add_op("RESHAPE", [x, shape], [y], {"new_shape": [2, 4]})
    source = tflite.load(irgraphs.to_bytes(irgraphs.model_of(g, [x], [y])))
    assert source.input_shapes == [(8,)]
