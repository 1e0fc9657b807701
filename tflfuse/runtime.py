"""Interpreter factory: ai_edge_litert, else tflite_runtime, else tf.lite, with a chosen delegate.

Only numpy and one interpreter package are needed, so the device side (a Coral board with
`tflite_runtime` and no TensorFlow) can use it. Delegates:
  xnnpack  the default CPU path (XNNPACK applied by the interpreter)
  none     plain builtin kernels, no default delegate
  ref      reference kernels (slow, for correctness checks)
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from tflfuse.errors import TflfuseError

_PACKAGES = (
    "ai_edge_litert.interpreter",
    "tflite_runtime.interpreter",
    "tensorflow.lite.python.interpreter",
)
_RESOLVERS = {"xnnpack": "AUTO", "none": "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "ref": "BUILTIN_REF"}


def interpreter_module() -> Any:
    """The first interpreter package that imports (raises TflfuseError when none does)."""
    for name in _PACKAGES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        return module
    raise TflfuseError(
        "no TFLite interpreter found: pip install ai-edge-litert (or tflite-runtime on a device)"
    )


def make_interpreter(
    model: bytes | str | Path, delegate: str = "xnnpack", threads: int | None = None
) -> Any:
    """An allocated interpreter for a model given as bytes or a path."""
    module = interpreter_module()
    if delegate not in _RESOLVERS:
        raise TflfuseError(f"unknown delegate {delegate!r} (choose from {', '.join(_RESOLVERS)})")
    source = (
        {"model_content": bytes(model)}
        if isinstance(model, (bytes, bytearray))
        else {"model_path": str(model)}
    )
    resolver = getattr(module.OpResolverType, _RESOLVERS[delegate])
    try:
        interp = module.Interpreter(
            **source, num_threads=threads, experimental_op_resolver_type=resolver
        )
        interp.allocate_tensors()
    except (ValueError, RuntimeError) as exc:
        raise TflfuseError(
            f"the interpreter refused the model: {str(exc).strip().splitlines()[0]}"
        ) from None
    return interp
