"""Epilogue fusion: element-wise ops appended to the kernel that produces their input.

Activations go into the producer's `fused_activation_function`; a per-channel bias ADD/SUB or
scale MUL (a lowered BatchNorm, or a bias a converter left outside) goes into its weights.
"""

from __future__ import annotations

import math

import numpy as np

from tflfuse.ir import Op, Tensor
from tflfuse.rewrite import Builder, Match, OpPattern, PatternBuilder, Refusal, Rule, common, refuse
from tflfuse.rewrite.build import fit_version
from tflfuse.targets import XNNPACK, Target

# Producers whose TFLite kernels apply a fused activation, and the activations they take.
_ACTIVATION_OPS = ("RELU", "RELU6", "RELU_N1_TO_1", "TANH")
_PRODUCERS = (
    "CONV_2D",
    "DEPTHWISE_CONV_2D",
    "FULLY_CONNECTED",
    "TRANSPOSE_CONV",
    "ADD",
    "SUB",
    "MUL",
    "AVERAGE_POOL_2D",
    "MAX_POOL_2D",
)
# The kernels clamp with CalculateActivationRange, which knows only the RELU family.
_CLAMPS = ("RELU", "RELU6", "RELU_N1_TO_1")
# int8 pools (and their XNNPACK versions) require equal input and output quantization.
_SAME_SCALE_ONLY = ("AVERAGE_POOL_2D", "MAX_POOL_2D")


class FuseActivationIntoProducer(Rule):
    """PRODUCER(x...) -> RELU|RELU6|RELU_N1_TO_1  =>  PRODUCER(x..., fused_activation=that).

    PRODUCER is CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, TRANSPOSE_CONV, ADD, SUB, MUL or a
    2-D pool. Float: exact (the kernel clamps the same values). int8: the fused op writes the
    activation's output tensor, so it requantizes once to the activation's scale instead of
    twice: equal to within one step. TANH is matched only to say why it stays: these kernels
    clamp, they do not apply a fused TANH. A fusion the target's `fused_activation_limit` forbids
    is refused (the Edge TPU's table: a pool with a fused activation; the separate RELU maps, the
    fused pool would not).
    """

    quantized_ok = True
    int8_error_steps = 1  # one requantization instead of two

    def int8_error(self, m: Match, *, y: Tensor) -> int:
        """Unfused, y is rounded to its scale s_y first: half a step of s_y, s_y / (2 s_z) steps
        of the activation's output scale s_z, plus one for the two final roundings. Producers
        with a coarser scale than the activation differ by more than one step (the int8 property
        test found 8 for an FC whose range was 16x wider than the RELU's)."""
        z = m.root.output
        qy, qz = y.quantization, z.quantization
        if qy is None or qz is None or qy.scale is None or qz.scale is None:
            return 0  # not quantized
        if not (y.is_quantized and z.is_quantized) or y.np_dtype is None:
            return 0
        ratio = float(qy.scale[0]) / float(qz.scale[0])
        if abs(ratio - 1.0) < 1e-6:
            # same scale: the RELU's requantization is exact, so fusing changes nothing unless
            # y saturates inside the activation's range (the check allows one step of that)
            (y_lo, y_hi), (z_lo, z_hi) = y.real_range(), z.real_range()
            lo, hi = _CLAMP_RANGE.get(m.root.type, (-np.inf, np.inf))
            covered = y_lo <= max(lo, z_lo) and y_hi >= min(hi, z_hi)
            return 0 if covered else 1
        return max(self.int8_error_steps, math.floor(ratio / 2 + 1))

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any(*_ACTIVATION_OPS)(p.any(*_PRODUCERS)(..., out="y"))

    def __init__(self, target: Target = XNNPACK) -> None:
        self.target = target

    def check(self, m: Match, *, y: Tensor) -> Refusal | None:
        return activation_fusion_refusal(y.op, y, m.root.type, m.root.output, self.target)

    def rewrite(self, m: Match, *, y: Tensor) -> None:
        _adopt(m, y, m.builder(), m.root.type)


_CLAMP_RANGE = {"RELU": (0.0, np.inf), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0)}


def activation_fusion_refusal(
    producer: Op, y: Tensor, activation: str, out: Tensor, target: Target
) -> Refusal | None:
    """Why `producer` (writing y) cannot take over an `activation` that reads y and writes `out`
    as its fused activation on `target`; None when it can (the check of
    FuseActivationIntoProducer, also asked by `int8_completion` before it writes a fused RELU)."""
    if producer.type not in _PRODUCERS:
        return refuse(f"{producer.type} takes no fused activation")
    if activation not in _CLAMPS:
        return refuse(f"{producer.type} kernels do not apply a fused {activation}")
    refusal = target.fused_activation_refusal(producer.type, activation)
    if refusal is not None:
        return refusal
    if producer.fused_activation != "NONE":
        return refuse(f"{producer.type} already has fused activation {producer.fused_activation}")
    if y.dtype != out.dtype:
        return refuse("activation changes the tensor type")
    if (
        producer.type in _SAME_SCALE_ONLY
        and y.quantization is not None
        and y.is_quantized
        and not y.quantization.same_as(out.quantization)
    ):
        return refuse(f"int8 {producer.type} needs the same scale on input and output")
    return _saturation_refusal(producer.type, y, activation, out)


def _saturation_refusal(producer: str, y: Tensor, activation: str, z: Tensor) -> Refusal | None:
    """Quantized: unfused, y saturates at its own range before the activation clamps; fused, the
    kernel clamps in the activation's output range. Equal (to one step) only if y's range covers
    every value the activation can output."""
    qy, qz = y.quantization, z.quantization
    if qy is None or qz is None or qz.scale is None or not (y.is_quantized and z.is_quantized):
        return None
    if qy.per_channel or qz.per_channel or y.np_dtype is None:
        return refuse("per-channel quantized activations: saturation cannot be compared")
    (y_lo, y_hi), (z_lo, z_hi) = y.real_range(), z.real_range()
    lo, hi = _CLAMP_RANGE[activation]
    need_lo, need_hi, step = max(lo, z_lo), min(hi, z_hi), float(qz.scale[0])
    if y_lo > need_lo + step or y_hi < need_hi - step:
        return refuse(
            f"int8 {producer} output saturates at [{y_lo:.3g}, {y_hi:.3g}], inside the "
            f"{activation} output range [{need_lo:.3g}, {need_hi:.3g}]: fusing would change results"
        )
    return None


def _affine_check(m: Match, y: Tensor, c: Tensor, kind: str) -> Refusal | np.ndarray:
    """A refusal, or c as one value per output channel of y's producer (the plan)."""
    producer = y.op
    if producer.fused_activation != "NONE":
        return refuse(f"{producer.type} has fused {producer.fused_activation} before the {kind}")
    if not common.single_reader(m.graph, y):  # the engine's check, in this rule's words
        return refuse(f"{producer.type} output is also read elsewhere")
    if not common.has_float_params(producer) or not common.is_float(m.root.output):
        return refuse(f"{producer.type} weights or bias are not float constants")
    if m.root.fused_activation not in ("NONE", "RELU", "RELU6", "RELU_N1_TO_1"):
        return refuse(f"{m.root.type} has fused {m.root.fused_activation}")
    vector = common.channel_vector(c, common.out_channels(producer), len(y.shape))
    if vector is None:
        return refuse(f"the {kind} constant is not one value per output channel")
    if m.root.output.shape != y.shape:
        return refuse(f"the {kind} broadcasts to a larger shape")
    return vector


def _adopt(m: Match, y: Tensor, b: Builder, act: str | None = None) -> None:
    """y's producer takes over the root's output and `act` (default: the root's fused
    activation); the root goes, with what `b` built committed."""
    producer, root = y.op, m.root
    act = root.fused_activation if act is None else act
    b.set_output(producer, 0, root.output)
    b.commit(remove=root)
    producer.fused_activation = act
    fit_version(producer)


class FoldBiasIntoProducer(Rule):
    """W(x) + c | W(x) - c  =>  W'(x) with bias b + c | b - c, c one value per output channel.

    W is CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED or TRANSPOSE_CONV. Float only. The ADD's
    fused activation moves to W.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any("ADD", "SUB")(p.any(*common.WEIGHTED)(..., out="y"), p.const("c"))

    def check(self, m: Match, *, y: Tensor, c: Tensor) -> Refusal | np.ndarray:
        return _affine_check(m, y, c, "bias")

    def rewrite(self, m: Match, *, y: Tensor, plan: np.ndarray) -> None:
        producer, vector = y.op, plan
        sign = -1.0 if m.root.type == "SUB" else 1.0
        b = m.builder()
        b.set_bias(producer, common.bias(producer) + sign * vector)
        _adopt(m, y, b)


class FoldScaleIntoProducer(Rule):
    """W(x) * s  =>  W'(x) with W'[o] = W[o] * s[o], b' = b * s; s one value per output channel.

    W is CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED or TRANSPOSE_CONV (weights [O, ...];
    depthwise [1, kh, kw, O]). Float only. The MUL's fused activation moves to W.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MUL(p.any(*common.WEIGHTED)(..., out="y"), p.const("c"))

    def check(self, m: Match, *, y: Tensor, c: Tensor) -> Refusal | np.ndarray:
        return _affine_check(m, y, c, "scale")

    def rewrite(self, m: Match, *, y: Tensor, plan: np.ndarray) -> None:
        producer, s = y.op, plan
        w = common.weights(producer)
        if producer.type == "DEPTHWISE_CONV_2D":
            scaled = w * s.reshape(1, 1, 1, -1)
        else:
            scaled = w * s.reshape(-1, *([1] * (w.ndim - 1)))
        b = m.builder()
        b.set_weights(producer, scaled)
        b.set_bias(producer, common.bias(producer) * s)
        _adopt(m, y, b)
