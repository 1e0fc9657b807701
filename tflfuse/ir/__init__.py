"""The graph IR: `Model` / `Graph` / `Op` / `Tensor` (`graph`), the flatbuffer door, the
only user of the TFLite schema (`flatbuffer`), facts about a model (`summary`) and whether its
quantization parameters are usable (`qparams`).
Imports nothing of tflfuse but `errors` and `files`. The IR's names are re-exported here:
`from tflfuse.ir import Graph, Op, Tensor`.
"""

from __future__ import annotations

from tflfuse.ir.graph import (
    ACTIVATIONS,
    NUMPY_DTYPES,
    Graph,
    IRError,
    Model,
    Op,
    Quantization,
    Signature,
    Tensor,
    dtype_name,
)

__all__ = [
    "ACTIVATIONS",
    "NUMPY_DTYPES",
    "Graph",
    "IRError",
    "Model",
    "Op",
    "Quantization",
    "Signature",
    "Tensor",
    "dtype_name",
]
