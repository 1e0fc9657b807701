"""Calibration statistics -> ranges int8 quantization can use: every scale finite and positive.

litert-quantizer turns the calibrated [min, max] of each activation into a scale and a zero point
((max - min) / 255, with 0 inside the range). Three kinds of statistics give an unusable scale;
each has one rule, applied to the statistics before they are quantized (the statistics themselves
are left as they were measured, so one calibration can serve several quantizations):

- **Sentinel constants never enter a range.** A constant that is +-inf, or of magnitude at least
  `SENTINEL` (1e30), stands for "the lowest (highest) representable value", not for a number to
  represent: torch's padded MaxPool2d exports as PADV2 with a -inf pad value, onnx2tf pads with
  -3.4e38. An op that only places values (PADV2, CONCATENATION, RESHAPE, MAXIMUM, ... :
  `PLACING`) and reads such a constant, or a tensor that holds its sentinels, writes a tensor
  whose range is the union of the finite ranges of its other inputs, and the sentinel quantizes
  to the saturated end of that range (int8 -128 for -inf). That is what it meant: PADV2(-inf)
  before MAX_POOL_2D is exact in int8, since no activation is below -128.
- **A non-finite range with no sentinel behind it is refused.** The float model computed inf or
  NaN on the calibration data (an overflow from huge inputs, or a sentinel reaching arithmetic):
  no scale means anything, so `quantize` stops with one line naming the tensor.
- **A zero-width range is widened.** Only zeros seen (all-zero calibration data, a RELU that never
  fired) would give the quantizer's floor scale (~4e-12), whose requantization multipliers int8
  kernels reject. The tensor takes [-m, m], m the largest magnitude its producer reads, or
  [-1, 1] with nothing to go on: zero stays exact, and values unseen in calibration get a sane
  scale.
Huge finite ranges are kept: their scales are finite and positive (`qparams` checks every
quantized model before an interpreter sees it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Op, Tensor

SENTINEL = 1e30  # a constant this large (or inf) means "lowest/highest representable"

# Ops whose outputs hold only values their inputs hold (moved, selected, repeated, or the larger
# or smaller of two): a sentinel they read is passed on, never computed with.
PLACING = frozenset(
    {
        "PAD",
        "PADV2",
        "MIRROR_PAD",
        "CONCATENATION",
        "PACK",
        "UNPACK",
        "SPLIT",
        "SPLIT_V",
        "RESHAPE",
        "SQUEEZE",
        "EXPAND_DIMS",
        "TRANSPOSE",
        "SLICE",
        "STRIDED_SLICE",
        "GATHER",
        "GATHER_ND",
        "BROADCAST_TO",
        "TILE",
        "SPACE_TO_DEPTH",
        "DEPTH_TO_SPACE",
        "SELECT",
        "SELECT_V2",
        "MAXIMUM",
        "MINIMUM",
        "MAX_POOL_2D",
        "REDUCE_MAX",
        "REDUCE_MIN",
    }
)

# One tensor's calibration statistics as litert-quantizer keeps them ({"min": array, "max": array,
# ...}), and a model's: tensor name -> its statistics (read only).
TensorStats = dict[str, np.ndarray]
Stats = Mapping[str, Mapping[str, np.ndarray]]


class RangeError(TflfuseError):
    """Calibration gave a tensor a range no int8 scale can represent."""


def is_sentinel(t: Tensor | None) -> bool:
    """A float constant holding +-inf or a value of magnitude >= SENTINEL (or NaN)."""
    if t is None or not t.is_constant or t.is_raw or t.dtype not in ("FLOAT32", "FLOAT16"):
        return False
    values = np.asarray(t.data, np.float64)
    return bool(values.size) and bool(np.any(~np.isfinite(values) | (np.abs(values) >= SENTINEL)))


def _bounds(entry: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(entry["min"], np.float64), np.asarray(entry["max"], np.float64)


def _usable(lo: np.ndarray, hi: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)))


def _reaches_sentinel(lo: np.ndarray, hi: np.ndarray) -> bool:
    big = np.maximum(np.abs(lo), np.abs(hi))
    return not _usable(lo, hi) or bool(np.any(big >= SENTINEL))


def _fmt(lo: np.ndarray, hi: np.ndarray) -> str:
    return f"[{float(np.min(lo)):.3g}, {float(np.max(hi)):.3g}]"


class _Ranges:
    """The rules of the module docstring, applied op by op in dependency order."""

    def __init__(self, stats: Stats) -> None:
        self.out: dict[str, TensorStats] = {k: dict(v) for k, v in stats.items()}
        self.holds_sentinels: set[int] = set()  # ids of tensors that hold placed sentinels
        self.changed: dict[str, str] = {}

    def range_of(self, t: Tensor) -> tuple[np.ndarray, np.ndarray] | None:
        """The (already corrected) range of an activation, or a finite constant's values."""
        if t.is_constant:
            if t.is_raw or is_sentinel(t) or t.dtype not in ("FLOAT32", "FLOAT16"):
                return None
            values = np.asarray(t.data, np.float64)
            if not values.size:
                return None
            return np.array([values.min()]), np.array([values.max()])
        entry = self.out.get(t.name)
        return None if entry is None else _bounds(entry)

    def visit(self, op: Op) -> None:
        for out in op.outputs:
            entry = self.out.get(out.name)
            if entry is None:
                continue
            lo, hi = _bounds(entry)
            reads_sentinel = any(
                t is not None and (is_sentinel(t) or id(t) in self.holds_sentinels)
                for t in op.inputs
            )
            if op.type in PLACING and reads_sentinel and _reaches_sentinel(lo, hi):
                lo, hi = self._placed(op, out, lo, hi)
                self.holds_sentinels.add(id(out))
            elif not _usable(lo, hi):
                raise RangeError(self._refusal(op, out, lo, hi))
            lo, hi = self._widened(op, out, lo, hi)
            entry["min"], entry["max"] = lo, hi

    def _placed(
        self, op: Op, out: Tensor, lo: np.ndarray, hi: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The union of the finite ranges of the values `op` places (its non-sentinel inputs)."""
        ranges = [
            r
            for t in op.inputs
            if t is not None and t.dtype in ("FLOAT32", "FLOAT16")
            for r in [self.range_of(t)]
            if r is not None and _usable(*r)
        ]
        if not ranges:
            raise RangeError(
                f"calibration: tensor {out.name!r} ({op.type}) holds only sentinel values"
                f" {_fmt(lo, hi)}; there is no finite range to quantize it with"
            )
        new_lo = np.minimum.reduce([np.min(r[0]) for r in ranges]) * np.ones_like(lo)
        new_hi = np.maximum.reduce([np.max(r[1]) for r in ranges]) * np.ones_like(hi)
        self.changed[out.name] = (
            f"{_fmt(lo, hi)} -> {_fmt(new_lo, new_hi)} (sentinel values placed by {op.type}"
            " are not part of the range; they quantize to its saturated end)"
        )
        return new_lo, new_hi

    def _widened(
        self, op: Op, out: Tensor, lo: np.ndarray, hi: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """A range that saw only zeros, widened to what its producer reads (else [-1, 1])."""
        if np.any(np.maximum(hi, 0) - np.minimum(lo, 0) > 0):
            return lo, hi
        magnitude = 0.0
        for t in op.inputs:
            r = self.range_of(t) if t is not None and not t.is_constant else None
            if r is not None and _usable(*r):
                magnitude = max(magnitude, float(np.max(np.abs(np.concatenate(r)))))
        if not 0 < magnitude < SENTINEL:
            magnitude = 1.0
        self.changed[out.name] = f"only zeros seen -> [{-magnitude:.3g}, {magnitude:.3g}]"
        return -magnitude * np.ones_like(lo), magnitude * np.ones_like(hi)

    def _refusal(self, op: Op, out: Tensor, lo: np.ndarray, hi: np.ndarray) -> str:
        inputs = [
            f"{t.name} {_fmt(*r)}"
            for t in op.inputs
            if t is not None and not t.is_constant
            for r in [self.range_of(t)]
            if r is not None
        ]
        read = f" from {', '.join(inputs[:2])}" if inputs else ""
        return (
            f"calibration: tensor {out.name!r} ({op.type}) reached {_fmt(lo, hi)}{read}: the float"
            " model overflows on the calibration data, so no int8 scale fits (give data in the"
            " model's input range)"
        )


def usable_ranges(graph: Graph, stats: Stats) -> tuple[dict[str, TensorStats], dict[str, str]]:
    """(corrected statistics, {tensor: what changed}) for `graph`'s calibration `stats`
    (litert-quantizer's per-tensor {"min", "max"}), by the rules of the module docstring.
    Raises RangeError (one line naming the tensor) for a range no scale can represent. The
    given statistics are not modified."""
    ranges = _Ranges(stats)
    for t in graph.inputs:
        entry = ranges.out.get(t.name)
        if entry is None:
            continue
        lo, hi = _bounds(entry)
        if not _usable(lo, hi):
            raise RangeError(
                f"calibration: model input {t.name!r} has the range {_fmt(lo, hi)}; calibration"
                " data must be finite"
            )
        if np.all(np.maximum(hi, 0) - np.minimum(lo, 0) == 0):
            ranges.changed[t.name] = "only zeros seen -> [-1, 1]"
            entry["min"], entry["max"] = -np.ones_like(lo), np.ones_like(hi)
    for op in graph.ops:  # a .tflite stores its ops in execution order
        ranges.visit(op)
    return ranges.out, ranges.changed
