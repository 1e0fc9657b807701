"""How far may each int8 output of a rewritten model be from the original's? A bound per output.

Each rewrite event says how many quantization steps it may have moved the int8 tensor it wrote
(its site): the rule's `int8_error_steps`, or `Rule.int8_error(m)` for this match. The bound of
an output is that error carried forward through the final graph to the output, worst case:

    e(t) = site error of t (steps x scale of t, summed over the events that wrote t)
         + gain(op) * e(inputs of op)        (op = t's producer; inputs' errors in real units)
         + scale(t) when op requantizes a perturbed input (one more rounding may flip)

in real units, then `ceil(e(output) / scale(output))` steps (at most the 255 an int8 can differ
by). `gain` is the op's worst-case sensitivity: 1 for data movement, max pools, activations that
are 1-Lipschitz, ADD/SUB (summed over inputs), max(1, |alpha|) for LEAKY_RELU/PRELU, the largest
row sum of |weights| (dequantized) for conv, depthwise, FC and TRANSPOSE_CONV, the other operand's
largest magnitude for MUL (times the contracted depth for BATCH_MATMUL), beta/2 for SOFTMAX (the
largest row sum of its Jacobian's magnitudes). An output that no event reaches has bound 0: it must
match bit for bit. An op type the table does not know makes the bound of what it feeds unlimited
(reported as 255 steps). Events whose sites a later rewrite removed (an activation fused into the
op a legalization wrote), and events in other subgraphs, count their steps at every output (for a
float output of a DEQUANTIZE, in the steps of the int8 tensor it reads).

For a chain of ops that keep the scale (the common case after an exact fusion) this is the sum of
the steps of the rewrites on the paths to the output, plus one per requantizing op after a
perturbation. It is a real worst-case bound, so a correct rewrite never fails it; a wrong one
(a shifted constant, a lost requantization) that moves an output further fails verification.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import numpy as np

from tflfuse.ir import Model, Op, Quantization, Tensor

MAX_STEPS = 255
_MOVES = frozenset(
    {
        "RESHAPE",
        "SQUEEZE",
        "EXPAND_DIMS",
        "TRANSPOSE",
        "CONCATENATION",
        "PAD",
        "PADV2",
        "SLICE",
        "STRIDED_SLICE",
        "GATHER",
        "SPLIT",
        "SPLIT_V",
        "PACK",
        "UNPACK",
        "MAX_POOL_2D",
        "MAXIMUM",
        "MINIMUM",
        "RESIZE_NEAREST_NEIGHBOR",
        "DEPTH_TO_SPACE",
        "SPACE_TO_DEPTH",
        "BROADCAST_TO",
        "TILE",
        "REDUCE_MAX",
        "REDUCE_MIN",
        "DEQUANTIZE",
    }
)
_UNIT_GAIN = frozenset(
    {
        "ADD",
        "SUB",
        "RELU",
        "RELU6",
        "RELU_N1_TO_1",
        "RELU_0_TO_1",
        "TANH",
        "AVERAGE_POOL_2D",
        "MEAN",
        "RESIZE_BILINEAR",
        "QUANTIZE",
        "L2_NORMALIZATION",
        "ABS",
        "NEG",
    }
)
_GAIN = {"LOGISTIC": 0.25, "HARD_SWISH": 1.5, "ELU": 1.0, "GELU": 1.13}


def scale(t: Tensor) -> float | None:
    """The per-tensor scale of an int8/uint8 tensor (the largest one if per channel)."""
    q = t.quantization
    if q is None or q.scale is None or not len(q.scale):
        return None
    return float(np.max(q.scale))


def _magnitude(t: Tensor) -> float:
    """The largest |real value| a tensor holds: its constant data, else its quantized range."""
    real = _real(t)
    if real is not None:
        return float(np.abs(real).max()) if real.size else 0.0
    s = scale(t)
    if s is None or t.np_dtype is None or t.np_dtype.kind not in "iu":
        return math.inf
    info = np.iinfo(t.np_dtype)
    zero = int(np.asarray(cast(Quantization, t.quantization).zero_point).reshape(-1)[0])
    return s * max(abs(info.min - zero), abs(info.max - zero))


def _real(t: Tensor | None) -> np.ndarray | None:
    """A constant's dequantized value (per-channel scales along the quantization axis)."""
    if t is None or not t.is_constant or t.is_raw or t.data is None:
        return None
    data = np.asarray(t.data, np.float64)
    q = t.quantization
    if q is None or q.scale is None or not len(q.scale) or t.dtype in ("FLOAT32", "FLOAT16"):
        return data
    s = np.asarray(q.scale, np.float64)
    z = np.zeros_like(s) if q.zero_point is None else np.asarray(q.zero_point, np.float64)
    if s.size > 1 and data.ndim:
        shape = [1] * data.ndim
        shape[q.axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    return (data - z) * s


def _weight_gain(op: Op) -> float:
    """max over output channels of sum |W| over what one output reads (dequantized)."""
    w = _real(op.inputs[1])
    if w is None:
        return math.inf
    if op.type == "DEPTHWISE_CONV_2D":
        return float(np.abs(w).sum(axis=(0, 1, 2)).max())
    return float(np.abs(w.reshape(w.shape[0], -1)).sum(axis=1).max())


def _times(gain: float, error: float) -> float:
    """gain * error, with an unperturbed input (error 0) contributing 0 even for gain inf."""
    return 0.0 if error == 0 else gain * error


def _propagated(op: Op, errors: Sequence[float]) -> float:
    """The real-valued error of op's outputs from its inputs' errors (before its own rounding)."""
    t = op.type
    data = list(errors)
    if t in _MOVES:
        return max(data)
    if t in ("ADD", "SUB"):
        return sum(data)
    if t in _UNIT_GAIN:
        return max(data)
    if t in _GAIN:
        return _GAIN[t] * max(data)
    if t in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
        return _times(_weight_gain(op), data[0])
    if t == "TRANSPOSE_CONV":
        return _times(_weight_gain(op), data[2]) if len(data) > 2 else math.inf
    if t == "MUL" and len(data) == 2:
        a, b = cast("tuple[Tensor, Tensor]", op.inputs)
        return _times(_magnitude(b), data[0]) + _times(_magnitude(a), data[1]) + data[0] * data[1]
    if t == "BATCH_MATMUL" and len(data) == 2:
        return _matmul_error(op, data[0], data[1])
    if t == "SOFTMAX":
        # |d softmax_i| <= sum_j |J_ij| |dx_j| with sum_j |J_ij| = 2 p_i (1 - p_i) beta <= beta/2
        return 0.5 * abs(float(op.options.get("beta", 1.0))) * max(data)
    if t == "LEAKY_RELU":
        return _times(max(1.0, abs(float(op.options.get("alpha", 0.2)))), data[0])
    if t == "PRELU" and len(data) == 2:
        x, alpha_t = op.input(0), op.input(1)
        alpha = _magnitude(alpha_t)
        return _times(max(1.0, alpha), data[0]) + _times(_magnitude(x), data[1])
    return math.inf


def _matmul_error(op: Op, ea: float, eb: float) -> float:
    """A product of two operands summed over the contracted depth: each of its terms moves by
    ea |b| + eb |a| + ea eb."""
    a, b = op.input(0), op.input(1)
    depth = a.shape[-2] if op.options.get("adj_x") else a.shape[-1]
    term = _times(_magnitude(b), ea) + _times(_magnitude(a), eb) + ea * eb
    return depth * term


def _requantizes(op: Op, out: Tensor) -> bool:
    """The op computes a new integer value (rounding), rather than copying input values."""
    if op.type in _MOVES:
        s = scale(out)
        return (
            any(t is not None and not t.is_constant and scale(t) != s for t in op.inputs)
            and op.type != "DEQUANTIZE"
        )
    return True


def output_bounds(model: Model, events: Sequence) -> dict[str, float]:
    """{output name: bound in the output's steps (int8) or real units (float outputs)}."""
    graph = model.main
    index = next((i for i, g in enumerate(model.subgraphs) if g is graph), 0)
    by_name = {t.name: t for t in graph.tensors}
    site: dict[str, float] = {}
    everywhere = 0  # steps of events that cannot be placed
    for e in events:
        if e.int8_steps <= 0:
            continue
        placed = [by_name[s] for s in e.sites if e.subgraph == index and s in by_name]
        if not placed:
            everywhere += e.int8_steps
            continue
        for t in placed:
            site[t.name] = site.get(t.name, 0.0) + e.int8_steps * (scale(t) or 0.0)
    error: dict[int, float] = {}
    for op in graph.topological_order():
        ins = [0.0 if t is None else error.get(id(t), 0.0) for t in op.inputs]
        carried = _propagated(op, ins) if any(ins) else 0.0
        for out in op.outputs:
            e = carried
            if carried and _requantizes(op, out):
                e += scale(out) or 0.0
            e += site.get(out.name, 0.0)
            if e:
                error[id(out)] = e
    bounds: dict[str, float] = {}
    for out in graph.outputs:
        e = error.get(id(out), 0.0)
        s = scale(out)
        if out.dtype in ("FLOAT32", "FLOAT16") or s is None:
            # a real-valued output (e.g. DEQUANTIZE): an atol; steps that could not be placed
            # count in the steps of the int8 tensor it dequantizes
            source = out.producer.inputs[0] if out.producer is not None else None
            s_in = (
                scale(source)
                if source is not None and cast(Op, out.producer).type == "DEQUANTIZE"
                else None
            )
            bounds[out.name] = e + everywhere * (s_in or 0.0)
            continue
        steps = MAX_STEPS if not math.isfinite(e) else math.ceil(e / s - 1e-9)
        bounds[out.name] = float(min(MAX_STEPS, steps + everywhere))
    return bounds
