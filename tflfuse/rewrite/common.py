"""Helpers the rules share: reading constants, per-channel vectors, weights and biases, rewiring.

New weights and biases are made by the match's builder (`b.set_weights`, `b.set_bias` in
`tflfuse.rewrite.build`), which never edits a constant's array in place.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Graph, Op, Tensor
from tflfuse.rewrite.build import BIAS_INDEX as _BIAS_INDEX
from tflfuse.rewrite.build import WEIGHT_INDEX as _WEIGHT_INDEX
from tflfuse.rewrite.build import WEIGHTED  # noqa: F401 - the rules read it here
from tflfuse.rewrite.rule import NotApplicable, Refusal  # noqa: F401 - NotApplicable re-exported

# Where the data input of a weighted op (`WEIGHTED`) lives.
_DATA_INDEX = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 0, "FULLY_CONNECTED": 0, "TRANSPOSE_CONV": 2}


def is_float(t: Tensor | None) -> bool:
    return t is not None and t.dtype == "FLOAT32" and not t.is_quantized


def float_constant(t: Tensor | None) -> np.ndarray | None:
    """The value of a float32 constant (not quantized, not packed), else None."""
    if t is None or not t.is_constant or t.is_raw or not is_float(t):
        return None
    return np.asarray(t.data, dtype=np.float32)


def scalar_value(t: Tensor | None) -> float | None:
    """The value of a float constant that holds one number (any shape of size 1)."""
    value = float_constant(t)
    if value is None or value.size != 1:
        return None
    return float(value.reshape(-1)[0])


def channel_vector(t: Tensor | None, channels: int, rank: int) -> np.ndarray | None:
    """A float constant that broadcasts along the last axis only, as a vector of `channels`.

    Accepts shapes (), (1,), (C,), (1, ..., 1, C) of rank <= `rank`; a scalar is repeated.
    """
    value = float_constant(t)
    if value is None or value.ndim > rank:
        return None
    if value.size == 1:
        return np.full(channels, value.reshape(-1)[0], dtype=np.float32)
    if value.shape[-1] != channels or value.size != channels:
        return None
    return value.reshape(channels)


def single_reader(graph: Graph, t: Tensor) -> bool:
    """Exactly one op reads `t` and it is not a model output (so the op may be rewritten)."""
    return len(t.consumers) == 1 and not graph.is_graph_output(t)


def data_input(op: Op) -> Tensor:
    return op.input(_DATA_INDEX[op.type])


def weights(op: Op) -> np.ndarray:
    """The op's float weights; a ValueError when they are not a float constant (a rule calls
    this after `has_float_params`)."""
    return _known(float_constant(op.input(_WEIGHT_INDEX[op.type])), op, "weights")


def out_channels(op: Op) -> int:
    w = op.input(_WEIGHT_INDEX[op.type])
    return int(w.shape[3] if op.type == "DEPTHWISE_CONV_2D" else w.shape[0])


def bias(op: Op) -> np.ndarray:
    """The op's float bias, zeros when it has none; a ValueError when it is not a float
    constant (a rule calls this after `has_float_params`)."""
    return _known(_bias_or_zeros(op), op, "bias")


def _bias_or_zeros(op: Op) -> np.ndarray | None:
    index = _BIAS_INDEX[op.type]
    t = op.inputs[index] if len(op.inputs) > index else None
    if t is None:
        return np.zeros(out_channels(op), dtype=np.float32)
    return float_constant(t)


def _known(value: np.ndarray | None, op: Op, what: str) -> np.ndarray:
    if value is None:
        raise ValueError(f"the {what} of {op.type} op {op.name!r} are not a float constant")
    return value


def has_float_params(op: Op) -> bool:
    """Weights and bias are plain float32 constants, so they can be recomputed exactly."""
    w = float_constant(op.inputs[_WEIGHT_INDEX[op.type]])
    return w is not None and _bias_or_zeros(op) is not None and is_float(op.output)


def pads_for_same(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """(before, after) zeros that SAME padding adds along one spatial axis."""
    effective = (kernel - 1) * dilation + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def kernel_hw(op: Op) -> tuple[int, int]:
    """Spatial kernel size of a conv, depthwise conv or pool."""
    if op.type in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        w = op.input(1)
        return int(w.shape[1]), int(w.shape[2])
    return int(op.options.get("filter_height", 1)), int(op.options.get("filter_width", 1))


def same_padding_is_zero(op: Op) -> bool:
    """The op pads nothing: VALID, or SAME where the kernel needs no border on this input."""
    if op.options.get("padding") != "SAME":
        return True
    x = op.input(0)
    if len(x.shape) != 4:
        return False
    kh, kw = kernel_hw(op)
    h = pads_for_same(
        x.shape[1], kh, op.options.get("stride_h", 1), op.options.get("dilation_h_factor", 1)
    )
    w = pads_for_same(
        x.shape[2], kw, op.options.get("stride_w", 1), op.options.get("dilation_w_factor", 1)
    )
    return h == (0, 0) and w == (0, 0)


def forward(graph: Graph, old: Tensor, new: Tensor) -> bool:
    """Make every reader of `old` read `new` instead (`old`'s producer becomes dead).

    When `old` is a model output its name and place are kept: `new`'s producer writes `old`
    instead. Returns False (nothing changed) when that is impossible.
    """
    if not graph.is_graph_output(old):
        graph.replace_uses(old, new)
        return True
    producer = new.producer
    if producer is None or graph.is_graph_output(new) or new in graph.inputs:
        return False
    if old.dtype != new.dtype or old.shape != new.shape:
        return False
    dying = old.producer
    if dying is not None:
        dying.outputs = [
            graph.add_tensor(old.name + "_dead", old.shape, old.dtype) if t is old else t
            for t in dying.outputs
        ]
    graph.replace_uses(new, old)
    producer.outputs = [old if t is new else t for t in producer.outputs]
    return True
