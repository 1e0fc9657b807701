"""Targets: what each accelerator or runtime can run, and where each op of a model goes.

`capabilities` reads the capability tables (`delegates/*.toml`) and holds the prediction
record and the XNNPACK check; `probe` asks the interpreter (XNNPACK, the GPU analyzer);
`edgetpu/` holds the Edge TPU predictor, compiler wrapper, truth reader, overlay and
legalization rules; `cost` the static cost model; `runtimes` which interpreter release
runs a model. `predict(model, target)` is the one entry point; the public names of
`capabilities` and the Edge TPU predictor are re-exported here. No TensorFlow.
"""

from __future__ import annotations

from tflfuse.errors import TflfuseError
from tflfuse.ir import Model, flatbuffer
from tflfuse.ir.summary import stored_float16_note
from tflfuse.targets.capabilities import (
    FLOAT_TYPES,
    TARGETS,
    OpPrediction,
    OtherReading,
    Prediction,
    capability,
    format_prediction,
    format_table,
    op_label,
    predict_xnnpack,
    xnnpack_op_status,
)
from tflfuse.targets.edgetpu.predict import (
    edgetpu_op_status,
    edgetpu_shape_refusal,
    edgetpu_statuses,
    predict_edgetpu,
)
from tflfuse.targets.probe import predict_gpu


def predict(
    model: Model,
    target: str,
    compiler_version: str | None = None,
    *,
    multiple_subgraphs: bool = False,
) -> Prediction:
    """Where each op of the main subgraph runs on `target` ("edgetpu", "xnnpack" or "gpu").

    `compiler_version` and `multiple_subgraphs` describe the Edge TPU compile (see
    `predict_edgetpu`); the other targets ignore them."""
    if target == "edgetpu":
        prediction = predict_edgetpu(model, compiler_version, multiple_subgraphs=multiple_subgraphs)
    elif target == "xnnpack":
        prediction = predict_xnnpack(model)
    elif target == "gpu":  # TFLite's analyzer reads bytes; it needs the interpreter package
        prediction = predict_gpu(model, flatbuffer.to_bytes(model))
    else:
        raise TflfuseError(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")
    note = stored_float16_note(model)
    if note:
        prediction.notes.append(note)
    return prediction


__all__ = [
    "FLOAT_TYPES",
    "TARGETS",
    "OpPrediction",
    "OtherReading",
    "Prediction",
    "capability",
    "edgetpu_op_status",
    "edgetpu_shape_refusal",
    "edgetpu_statuses",
    "format_prediction",
    "format_table",
    "op_label",
    "predict",
    "predict_edgetpu",
    "predict_xnnpack",
    "xnnpack_op_status",
]
