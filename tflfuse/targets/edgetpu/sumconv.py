"""Edge TPU legalization, int8 stage: a SUM over axis 1 as the depthwise conv the compiler maps.

The attention legalization (`tflfuse.targets.edgetpu.attention`) sums each product over its
contracted axis with a d x 1 DEPTHWISE_CONV_2D of ones ([1, d, 1, w] -> [1, 1, 1, w]; a SUM over
a spatial axis is a reduction form no compiled model shows). Written in float before the
quantization, those kernels (d x w weights, up to 400 x 4096 a piece, 216 ops on a 640-px
YOLO26n) are what every float interpreter of the model packs: XNNPACK packs each op's kernel on
its own, 3.3 GB for one calibration interpreter (`benchmarks/interpreter_memory.py`). So when an
int8 quantization follows (the recipe's [legalization] attention_sum_after_int8), the float graph
carries a plain SUM(axis=1, keep_dims) (and a MUL by the split factor where the sum is scaled,
`Rule.float_form_waits_for_int8`), and the rules here, run on the quantized model, write the int8
DEPTHWISE_CONV_2D the float form used to be:

    SumAsDepthwise        SUM(x [1, h, w, c], axis 1, keep_dims)  =>
                          DEPTHWISE_CONV_2D(x, h x 1 kernel of 127 at scale 1/127, zero bias)
    ScaledSumAsDepthwise  MUL(SUM(x, axis 1, keep_dims), f)  =>
                          DEPTHWISE_CONV_2D(x, h x 1 kernel of 127 sign(f) at scale |f|/127)

Exactness (int8): the conv's weights are f exactly as the int8 model reads them (one code, its
scale |f|/127), its int32 accumulator holds the exact sum of the codes, and it rounds once into
the output's scale. The SUM kernel rounds once too: the two may differ by one step of the
output (`int8_error_steps` 1). The scaled form also drops the SUM's own rounding to its scale
s_sum, which the MUL magnifies by |f|: ceil(|f| s_sum / (2 s_out)) + 1 steps
(`scaled_sum_steps`). Each form is written only where the table maps the depthwise conv it
writes; no gate on where the cut falls (the float form was a depthwise conv everywhere). No
TensorFlow here.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from tflfuse.ir import Graph, Tensor
from tflfuse.rewrite import Builder, Match, OpPattern, PatternBuilder, Refusal, Rule, Value
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets.edgetpu.rules import _kind, _quant, _refusal_of, _scale_zp


def _axis_one_sum(x: Tensor, axis: Tensor, keep_dims: bool) -> Refusal | None:
    """NotApplicable unless the SUM reduces axis 1 of a 4-D int8 [1, h, w, c] tensor keeping
    its dims (a depthwise conv's h x 1 window); a refusal when the table refuses that conv."""
    if _kind(x) != "int" or x.dtype != "INT8":
        return NotApplicable("not a per-tensor int8 sum")
    if len(x.shape) != 4 or x.shape[0] != 1 or not keep_dims or axis.data is None:
        return NotApplicable("not a 4-D sum keeping its dims")
    axes = {int(a) % 4 for a in np.asarray(axis.data).reshape(-1)}
    if axes != {1}:
        return NotApplicable("not a sum over axis 1 alone")
    _, h, w, c = (int(a) for a in x.shape)
    why = _refusal_of("DEPTHWISE_CONV_2D", [x], (1, 1, w, c),
                      {"fused_activation_function": "NONE"},
                      [np.ones((1, h, 1, c), np.int8)])  # fmt: skip
    if why:
        return Refusal(f"the depthwise conv it would be is refused: {why}")
    return None


def _constant_value(t: Tensor) -> float | None:
    """The one number a float or per-tensor int8 constant holds (dequantized), else None."""
    if t.data is None or np.asarray(t.data).size != 1:
        return None
    raw = float(np.asarray(t.data).reshape(-1)[0])
    if t.dtype == "FLOAT32":
        return raw
    if _kind(t) != "int":
        return None
    scale, zero = _scale_zp(t)
    return (raw - zero) * scale


# The constants the conversions of one graph wrote, shared by every conv of the same kernel (the
# quantized stage runs no constant merging): {graph: {(kind, shape, code, scale): tensor}}.
# Unshared, a 640-px YOLO26n's 216 sums wrote 110 MB of identical kernels into its file.
_SHARED: weakref.WeakKeyDictionary[Graph, dict[tuple, Tensor]] = weakref.WeakKeyDictionary()


def _shared_const(
    m: Match, b: Builder, key: tuple, value: np.ndarray, dtype: str, scale: float
) -> Tensor | Value:
    """A constant of the graph equal to `value` at `scale` that an op still reads, else a new
    one (remembered once the rewrite commits)."""
    known = _SHARED.setdefault(m.graph, {}).get(key)
    if known is not None and known.consumers:
        return known
    return b.const(value, f"sum/{key[0]}", dtype, _quant(scale, 0))


def _depthwise(m: Match, x: Tensor, factor: float, out: Tensor) -> None:
    """Replace the match (its SUM, and its MUL) by DEPTHWISE_CONV_2D(x, h x 1 kernel of
    `factor` in int8, zero bias) writing the root's output tensor (its quantization kept);
    equal kernels and biases are one constant."""
    b = m.builder()
    _, h, _, c = (int(a) for a in x.shape)
    code, s_w = 127 if factor > 0 else -127, float(np.float32(abs(factor) / 127.0))
    s_b = float(np.float32(_scale_zp(x)[0]) * np.float32(s_w))
    keys = (("w", (1, h, 1, c), code, s_w), ("b", (c,), 0, s_b))
    w = _shared_const(m, b, keys[0], np.full((1, h, 1, c), code, np.int8), "INT8", s_w)
    bias = _shared_const(m, b, keys[1], np.zeros(c, np.int32), "INT32", s_b)
    b.DEPTHWISE_CONV_2D(
        x, w, bias, out=out, padding="VALID", stride_w=1, stride_h=1, depth_multiplier=1,
        dilation_w_factor=1, dilation_h_factor=1, fused_activation_function="NONE",
    )  # fmt: skip
    b.commit(remove=list(m.ops))
    shared = _SHARED[m.graph]
    for key, made in zip(keys, (w, bias)):
        if isinstance(made, Value) and made.tensor is not None:
            shared[key] = made.tensor


class ScaledSumAsDepthwise(Rule):
    """MUL(SUM(x [1, h, w, c] int8, axis 1, keep_dims), f)  =>
    DEPTHWISE_CONV_2D(x, h x 1 kernel 127 sign(f) at scale |f|/127, zero bias).

    The attention's split sums (`attention`, a part scaled by tau/6), written in float as a SUM
    and a MUL when int8 follows. One rounding instead of two: within
    ceil(|f| s_sum / (2 s_out)) + 1 steps of the output (`scaled_sum_steps`).
    """

    quantized_ok = True
    int8_error_steps = 1  # at least; `int8_error` gives the match's (scaled_sum_steps)

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MUL(p.SUM(p.x, p.const("axis"), out="s"), p.const("f"), out="y")

    def check(
        self, m: Match, *, x: Tensor, axis: Tensor, s: Tensor, f: Tensor, y: Tensor
    ) -> Refusal | float:
        """A refusal, or the factor f as the int8 model reads it."""
        why = _axis_one_sum(x, axis, bool(s.op.options.get("keep_dims")))
        if why is not None:
            return why
        factor = _constant_value(f)
        if factor is None or factor == 0.0 or not math.isfinite(factor):
            return NotApplicable("the factor is not one nonzero number")
        if _kind(y) != "int" or y.dtype != "INT8" or _kind(s) != "int":
            return NotApplicable("the scaled sum is not per-tensor int8")
        if tuple(y.shape) != tuple(s.shape):
            return NotApplicable("the factor broadcasts the sum")
        return factor

    def int8_error(self, m: Match, *, s: Tensor, y: Tensor, plan: float) -> int:
        return scaled_sum_steps(plan, s, y)

    def rewrite(self, m: Match, *, x: Tensor, y: Tensor, plan: float) -> None:
        _depthwise(m, x, plan, y)


def scaled_sum_steps(factor: float, s: Tensor, y: Tensor) -> int:
    """Steps of y the depthwise conv may differ from MUL(SUM(x), f): the SUM's rounding (half
    its step s_sum) times |f|, and the two final roundings (ours and the kernel's)."""
    s_sum, s_out = _scale_zp(s)[0], _scale_zp(y)[0]
    return math.ceil(abs(factor) * s_sum / (2.0 * s_out) - 1e-9) + 1


class SumAsDepthwise(Rule):
    """SUM(x [1, h, w, c] int8, axis 1, keep_dims)  =>
    DEPTHWISE_CONV_2D(x, h x 1 kernel of 127 at scale 1/127, zero bias).

    The attention's sums over the contracted axis (`attention`), written in float as a SUM
    when int8 follows; the depthwise conv is the form compiled models show mapped. One rounding
    each: within one step of the SUM kernel.
    """

    quantized_ok = True
    int8_error_steps = 1

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.SUM(p.x, p.const("axis"), out="y")

    def check(self, m: Match, *, x: Tensor, axis: Tensor, y: Tensor) -> Refusal | None:
        """A refusal, or None to go ahead."""
        why = _axis_one_sum(x, axis, bool(m.root.options.get("keep_dims")))
        if why is not None:
            return why
        if _kind(y) != "int" or y.dtype != "INT8":
            return NotApplicable("its output is not per-tensor int8")
        return None

    def rewrite(self, m: Match, *, x: Tensor, y: Tensor) -> None:
        _depthwise(m, x, 1.0, y)


# the scaled form first: it takes the SUM with its MUL
SUM_CONV_LEGALIZATION: tuple[Rule, ...] = (ScaledSumAsDepthwise(), SumAsDepthwise())
