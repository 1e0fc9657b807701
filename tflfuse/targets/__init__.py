"""Targets: what each accelerator or runtime can run, and where each op of a model goes.

`registry` holds one `Target` per accelerator or runtime (its name, capability table,
predictor, pipeline traits, cost profile, recipes): every list of targets and every branch on
one comes from it. `capabilities` reads the capability tables (`delegates/*.toml`) and holds the
prediction record and the XNNPACK check; `probe` asks the interpreter (XNNPACK, the GPU
analyzer); `edgetpu/` holds the Edge TPU predictor, compiler wrapper, truth reader, overlay and
legalization rules; `cost` the static cost model; `runtimes` which interpreter release runs a
model. `predict(model, target)` is the one entry point. No TensorFlow.

Importing this package stays light (no numpy), so the command line can list the targets: the
public names of `capabilities` and of the Edge TPU predictor are re-exported here on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tflfuse.targets.registry import (
    EDGETPU,
    TARGETS,
    XNNPACK,
    CostProfile,
    Target,
    every,
    find,
    names,
    target,
)

if TYPE_CHECKING:  # types only: importing them loads numpy and the model code
    from tflfuse.ir import Model
    from tflfuse.targets.capabilities import Prediction

# re-exported on first use: name -> the module that defines it
_LAZY = {
    **dict.fromkeys(
        (
            "FLOAT_TYPES",
            "OpPrediction",
            "OtherReading",
            "Prediction",
            "capability",
            "op_label",
            "predict_xnnpack",
            "xnnpack_op_status",
        ),
        "capabilities",
    ),
    **dict.fromkeys(("format_prediction", "format_table"), "text"),
    **dict.fromkeys(
        ("edgetpu_op_status", "edgetpu_shape_refusal", "edgetpu_statuses", "predict_edgetpu"),
        "edgetpu.predict",
    ),
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where == "capabilities":
        from tflfuse.targets import capabilities

        return getattr(capabilities, name)
    if where == "text":
        from tflfuse.targets import text

        return getattr(text, name)
    if where == "edgetpu.predict":
        from tflfuse.targets.edgetpu import predict as edgetpu_predict

        return getattr(edgetpu_predict, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def predict(
    model: Model,
    target: Target,
    compiler_version: str | None = None,
    *,
    multiple_subgraphs: bool = False,
) -> Prediction:
    """Where each op of the main subgraph runs on `target` (those with a
    predictor: `names(predicts=True)`).

    `compiler_version` and `multiple_subgraphs` describe the Edge TPU compile (see
    `predict_edgetpu`); the other targets ignore them."""
    from tflfuse.ir.summary import stored_float16_note

    prediction = target.predict(model, compiler_version, multiple_subgraphs)
    note = stored_float16_note(model)
    if note:
        prediction.notes.append(note)
    return prediction


__all__ = [
    "EDGETPU",
    "TARGETS",
    "XNNPACK",
    "CostProfile",
    "Target",
    "every",
    "find",
    "names",
    "predict",
    "target",
    *sorted(_LAZY),
]
