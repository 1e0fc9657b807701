"""Ranges a rule recorded on float tensors, taken as their least calibrated range.

Calibration runs the float model. Where a rule writes a form whose int8 values move further than
its float values do, calibration alone gives a range too narrow: `NormalizeTwice`'s second
variance is 1 on every row in float, and in int8 it measures how far the first (coarse) variance
was off. Such a rule records the range the int8 values need on the float tensor, as a
`Quantization` holding only min and max (no scale: the tensor stays float, and a file keeps the
range in its tensor's quantization parameters). Before quantizing, each such tensor's calibrated
range is widened to hold the recorded one: never narrowed, so a value calibration saw is never
clipped.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Graph
from tflfuse.quantize.calibrated_ranges import TensorStats


def hinted_ranges(
    graph: Graph, stats: dict[str, TensorStats]
) -> tuple[dict[str, TensorStats], dict[str, str]]:
    """(statistics with every recorded range taken in, {tensor: what changed}). The given
    statistics are not modified."""
    out = dict(stats)
    changed: dict[str, str] = {}
    for t in graph.tensors:
        q = t.quantization
        if t.dtype != "FLOAT32" or t.is_quantized or q is None or q.min is None or q.max is None:
            continue
        entry = out.get(t.name)
        if entry is None or np.size(q.min) != 1 or np.size(q.max) != 1:
            continue
        lo = np.minimum(np.asarray(entry["min"]), np.float32(np.asarray(q.min).reshape(-1)[0]))
        hi = np.maximum(np.asarray(entry["max"]), np.float32(np.asarray(q.max).reshape(-1)[0]))
        if np.array_equal(lo, entry["min"]) and np.array_equal(hi, entry["max"]):
            continue
        out[t.name] = {**entry, "min": lo.astype(np.float32), "max": hi.astype(np.float32)}
        changed[t.name] = f"recorded range [{float(q.min[0]):g}, {float(q.max[0]):g}] taken in"
    return out, changed
