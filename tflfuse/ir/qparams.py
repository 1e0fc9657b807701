"""Are a model's quantization parameters usable? Checked before any interpreter sees the model.

An int8 kernel (or XNNPACK, or the Edge TPU compiler) given a scale of inf, NaN, 0 or a negative
number fails in native code, some builds by aborting the process ("unsupported scale value (inf)"
from `allocate_tensors`). Every model tflfuse quantizes, and every quantized model it is given, is
checked here first, and a bad one is refused in one line naming the tensor.

A usable quantized tensor (an integer tensor with a non-empty scale) has every scale finite and
> 0, a zero point for each scale (or one for all), and (INT8, UINT8, INT4) zero points its type
can hold.
"""

from __future__ import annotations

import numpy as np

from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Model, Tensor

_ZERO_POINT_RANGE: dict[str, tuple[int, int] | None] = {
    "INT8": (-128, 127),
    "UINT8": (0, 255),
    "INT4": (-8, 7),
    "INT16": None,  # kernels insist on their own zero points; only the scale is judged here
    "INT32": None,
    "INT64": None,
}


class QuantizationParameterError(TflfuseError):
    """A tensor's scale or zero point would make the interpreter fail (or abort)."""


def problem(t: Tensor) -> str | None:
    """Why tensor `t`'s quantization is unusable, or None (also for unquantized tensors)."""
    q = t.quantization
    if q is None or q.scale is None or not np.asarray(q.scale).size:
        return None
    if t.dtype not in _ZERO_POINT_RANGE:
        return None  # a float tensor with recorded ranges, or a type tflfuse does not judge
    scale = np.asarray(q.scale, np.float64).reshape(-1)
    bad = scale[~(np.isfinite(scale) & (scale > 0))]
    if bad.size:
        where = "" if scale.size == 1 else f" ({bad.size} of {scale.size} channels)"
        return f"scale {float(bad[0]):.3g}{where}; scales must be finite and > 0"
    zero = np.asarray(q.zero_point if q.zero_point is not None else [0], np.int64).reshape(-1)
    if zero.size not in (1, scale.size):
        return f"{zero.size} zero points for {scale.size} scales"
    limits = _ZERO_POINT_RANGE[t.dtype]
    if limits is None:
        return None
    lo, hi = limits
    outside = zero[(zero < lo) | (zero > hi)]
    if outside.size:
        return f"zero point {int(outside[0])} outside [{lo}, {hi}] for {t.dtype}"
    return None


def problems(graph: Graph) -> list[tuple[str, str]]:
    """(tensor name, problem) for every tensor of `graph` with unusable quantization."""
    return [(t.name, why) for t in graph.tensors for why in [problem(t)] if why is not None]


def check(model: Model, where: str) -> None:
    """Raise QuantizationParameterError (one line: the first bad tensor, and how many) unless
    every quantized tensor of every subgraph is usable."""
    found = [p for g in model.subgraphs for p in problems(g)]
    if found:
        name, why = found[0]
        more = f" (and {len(found) - 1} more tensors)" if len(found) > 1 else ""
        raise QuantizationParameterError(
            f"{where}: tensor {name!r} has unusable quantization: {why}{more}"
        )
