"""Tensor names a model file may not hold: not UTF-8, or with a NUL byte.

The flatbuffer schema says names are UTF-8 strings. The loader reads any bytes (a surrogate
escape keeps them for a byte-exact round trip), but the interpreter decodes the names of a model's
inputs and outputs strictly, litert-quantizer decodes every name, and C code stops a name at a NUL
(two names that differ after it become one). Such a file is damaged, not a model to repair:
`convert` and `optimize` refuse it in one line naming the tensor.
"""

from __future__ import annotations

from tflfuse.errors import ModelError
from tflfuse.ir.graph import Model


def check_names(model: Model, where: str) -> None:
    """ModelError naming the first tensor of `model` whose name is not UTF-8 or holds a NUL."""
    for sg in model.subgraphs:
        for index, t in enumerate(sg.tensors):
            try:
                t.name.encode("utf-8")
            except UnicodeEncodeError:
                raw = t.name.encode("utf-8", "surrogateescape")
                raise ModelError(
                    where, f"tensor {index}'s name {raw!r} is not valid UTF-8 (a damaged file?)"
                ) from None
            if "\x00" in t.name:
                raise ModelError(
                    where, f"tensor {index}'s name {t.name!r} holds a NUL byte (a damaged file?)"
                )
