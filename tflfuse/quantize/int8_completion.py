"""Ops litert-quantizer leaves in float, made int8 between the scales it chose: PRELU,
RELU_0_TO_1, DEPTH_TO_SPACE, L2_NORMALIZATION (EdgeNeXt's cross-covariance attention
normalizes q and k: `QuantizeL2Normalization`).

litert-quantizer has no int8 config for PRELU (MediaPipe's iris, face, hand and palm models),
RELU_0_TO_1 (onnx2tf's HardSigmoid) or DEPTH_TO_SPACE (MediaPipe's pose detector). It leaves each
one in float, between a DEQUANTIZE of its int8 input and a QUANTIZE of its output, so the model is
not fully int8 and on the Edge TPU the first one cuts the graph (iris landmark: 2 of 278 ops
mapped). Both scales are already chosen from calibration (the DEQUANTIZE reads the input's, the
QUANTIZE writes the output's), so the float island is replaced by one int8 op between the same
two tensors:

  QUANTIZE(PRELU(DEQUANTIZE(x), alpha))    =>  PRELU(x, alpha in int8)
  QUANTIZE(RELU_0_TO_1(DEQUANTIZE(x)))     =>  RELU(x)   (the output's range tops out at <= 1)
  QUANTIZE(DEPTH_TO_SPACE(DEQUANTIZE(x)))  =>  DEPTH_TO_SPACE(x)   (same parameters in and out)

PRELU: alpha keeps the source's shape (per channel or per tensor values) with one symmetric
scale, max|alpha| / 127, as the TFLite converter quantizes it (TFLite's int8 PRELU kernel reads
alpha's scale and zero point per tensor). The Edge TPU maps int8 PRELU whose alpha varies along
channels only (delegates/edgetpu.toml). RELU_0_TO_1: when the output's largest representable value
is 1 or less, the int8 RELU that requantizes to the output's scale saturates exactly where the
clamp at 1 would (and clamps at the zero point, real 0), so the clamp is the quantization itself;
RELU maps on the Edge TPU, RELU_0_TO_1 does not.

DEPTH_TO_SPACE moves bytes: its output's calibrated range is its input's, so the quantizer gave
both the same parameters and the int8 op is exact (other parameters are refused: a copy cannot
requantize). PRELU and RELU round once where the island rounded once (its QUANTIZE), from the same
real value: one step apart at most, plus, for PRELU, alpha's rounding times the largest negative
input (`QuantizePrelu.int8_error`). `complete` runs the rules and verifies the result against the
model as the quantizer left it, with those declared bounds.

A runtime only gets what it has kernels for, so completion is decided per target
(`complete(..., target=...)`, `cost.int8_completion_refusal`):
- the Edge TPU: always (a float op cuts its graph; the compiler maps int8 PRELU, RELU and
  DEPTH_TO_SPACE);
- the CPU targets (XNNPACK, the plain kernels): only where the int8 op is not slower than the
  island, measured (delegates/cost_table.json, benchmarks/INT8_COMPLETION.md). XNNPACK has no
  int8 PRELU or RELU (its TFLite delegate checks for float tensors; XNNPACK's PRELU is defined
  for real types only), so those int8 ops run on the plain kernels, split the delegate's
  partition and cost about 20x the island: PRELU keeps its island there. int8 DEPTH_TO_SPACE is
  faster than its island on both runtimes.
- RELU_0_TO_1 has a spelling every runtime takes: when the island's input comes from an op
  with a fused-activation field (a convolution, ADD, ...) that only the island reads, that op
  writes the island's output with fused RELU, and the island is gone (onnx2tf's HardSigmoid
  follows a CONV_2D). The kernel clamps at the zero point and saturates where the clamp at 1
  does, and rounds once from its accumulator where the island rounded twice.
- A target with no measured runtime (gpu) keeps the fully-int8 default; `target=None` too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import numpy as np

from tflfuse.ir import Model, Op, Quantization, Tensor, flatbuffer
from tflfuse.json_types import JSONDict
from tflfuse.rewrite import (
    DeadCodeElimination,
    Match,
    OpPattern,
    PatternBuilder,
    Refusal,
    Rule,
    TopologicalSort,
    refuse,
)
from tflfuse.rules.epilogue import activation_fusion_refusal
from tflfuse.targets import XNNPACK, Target, capability, cost
from tflfuse.verification import verified


def _per_tensor_int8(t: Tensor) -> bool:
    q = t.quantization
    return t.dtype == "INT8" and t.is_quantized and q is not None and not q.per_channel


def _scale_zp(t: Tensor) -> tuple[float, int]:
    q = cast(Quantization, t.quantization)  # quantized: the caller checked
    return float(np.asarray(q.scale).reshape(-1)[0]), int(np.asarray(q.zero_point).reshape(-1)[0])


def _island_check(m: Match, x: Tensor) -> Refusal | None:
    """The island reads and writes per-tensor int8 tensors (what the rewrite keeps)."""
    if not _per_tensor_int8(x):
        return refuse(f"the input {x.name!r} is not per-tensor int8")
    if not _per_tensor_int8(m.root.output):
        return refuse(f"the output {m.root.output.name!r} is not per-tensor int8")
    return None


def _replace(
    m: Match,
    float_out: Tensor,
    op_type: str,
    inputs: list[Tensor],
    version: int,
    options: dict | None = None,
) -> None:
    """The island's QUANTIZE gives way to `op_type` writing the same int8 tensor (placed after
    the float op writing `float_out`, which stays for any other reader until dead-code
    elimination)."""
    g, out, float_op = m.graph, m.root.output, float_out.producer
    g.remove_op(m.root)
    g.add_op(op_type, inputs, [out], options, after=float_op, version=version)


def _alpha_int8(alpha: np.ndarray) -> tuple[np.ndarray, float]:
    """alpha as int8 values and their one symmetric scale (max |alpha| / 127)."""
    top = float(np.max(np.abs(alpha))) if alpha.size else 0.0
    scale = top / 127.0 if top > 0 else 1.0
    values = np.clip(np.rint(alpha / scale), -127, 127).astype(np.int8)
    return values, scale


def _elements(t: Tensor) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) if t.shape else 1


def _xnnpack_takes_int8(op_type: str) -> bool:
    """delegates/xnnpack.toml lists INT8 among the types XNNPACK takes for `op_type`."""
    row = capability("xnnpack").get("ops", {}).get(op_type, {})
    return "INT8" in row.get("types", [])


class _Completion(Rule):
    """A rule that makes one float op type int8 (`completes`), on `target` only where the int8
    op pays there (module docstring); `target=None` completes everywhere."""

    completes: ClassVar[str] = ""
    quantized_ok = True
    inner_ops_may_be_shared = True  # the float op stays for any other reader

    def __init__(self, target: Target | None = None) -> None:
        self.target = target

    def target_refusal(self, m: Match) -> Refusal | None:
        """The island stays on a target whose runtime runs it faster than the int8 op."""
        if self.target is None:
            return None
        reason = cost.int8_completion_refusal(self.target, self.completes, _elements(m.root.output))
        if reason is None:
            return None
        int8_op = cost.INT8_COMPLETION_OP.get(self.completes, self.completes)
        if self.target.cost.runtime == "xnnpack" and not _xnnpack_takes_int8(int8_op):
            reason = f"XNNPACK takes no int8 {int8_op}, and {reason}"
        return refuse(reason)


class QuantizePrelu(_Completion):
    """QUANTIZE(PRELU(DEQUANTIZE(x), alpha))  =>  PRELU(x, alpha_q)   (int8).

    alpha_q = round(alpha / s_a), s_a = max|alpha| / 127, zero point 0, alpha's own shape. For
    x < 0 the kernel computes alpha_q s_a x; alpha's rounding moves it by at most s_a / 2 |x|.
    """

    completes = "PRELU"
    int8_error_steps = 1  # one rounding where the QUANTIZE rounded; alpha's share: int8_error

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.QUANTIZE(p.PRELU(p.DEQUANTIZE(p.x), p.const("alpha"), out="float_out"))

    def check(self, m: Match, *, x: Tensor, alpha: Tensor) -> Refusal | None:
        if alpha.dtype != "FLOAT32" or alpha.is_raw:
            return refuse(f"alpha {alpha.name!r} is {alpha.dtype}, not a float32 constant")
        if not np.all(np.isfinite(np.asarray(alpha.data))):
            return refuse(f"alpha {alpha.name!r} is not finite")
        return _island_check(m, x) or self.target_refusal(m)

    def int8_error(self, m: Match, *, alpha: Tensor, x: Tensor) -> int:
        values, scale = _alpha_int8(np.asarray(alpha.data, np.float64))
        rounding = (
            float(np.max(np.abs(values * scale - np.asarray(alpha.data)))) if values.size else 0.0
        )
        s_x, z_x = _scale_zp(x)
        s_out, _ = _scale_zp(m.root.output)
        most_negative = s_x * (z_x + 128)  # |x| at int8 -128
        return 1 + math.ceil(rounding * most_negative / s_out - 1e-9)

    def rewrite(self, m: Match, *, x: Tensor, alpha: Tensor, float_out: Tensor) -> None:
        values, scale = _alpha_int8(np.asarray(alpha.data, np.float64))
        q = Quantization(scale=np.array([scale], np.float32), zero_point=np.array([0], np.int64))
        alpha_q = m.graph.add_constant(f"{alpha.name}_int8", values, "INT8", q)
        _replace(m, float_out, "PRELU", [x, alpha_q], version=1)


class QuantizeRelu0To1(_Completion):
    """QUANTIZE(RELU_0_TO_1(DEQUANTIZE(x)))  =>  RELU(x)   (int8, output range top <= 1)
    or, when x's producer P takes a fused activation and only the island reads x,
    =>  P(..., fused_activation=RELU) writing the island's output.

    clamp(x, 0, 1) quantized to an output whose largest value (127 - z) s is at most 1 (to half a
    step) equals max(x, 0) requantized to that output: both saturate at 127 for x >= 1. The fused
    form requantizes P's accumulator straight to that output (one rounding instead of the
    island's two), so it may differ from the island by x's half step in output steps, plus one.
    """

    completes = "RELU_0_TO_1"
    int8_error_steps = 1  # one requantization where the QUANTIZE rounded once

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.QUANTIZE(p.RELU_0_TO_1(p.DEQUANTIZE(p.x), out="float_out"))

    def check(self, m: Match, *, x: Tensor, float_out: Tensor) -> Refusal | Op | None:
        """A refusal, the producer the clamp fuses into (the plan), or None: a separate RELU."""
        refusal = _island_check(m, x)
        if refusal is not None:
            return refusal
        scale, zero = _scale_zp(m.root.output)
        top = (127 - zero) * scale
        if top > 1.0 + scale / 2:
            return refuse(
                f"the output's range reaches {top:.4g} > 1, so saturation is not the clamp at 1"
            )
        producer = self._fusable_producer(m, x, float_out)
        return producer if producer is not None else self.target_refusal(m)

    def _fusable_producer(self, m: Match, x: Tensor, float_out: Tensor) -> Op | None:
        """x's producer, when it can take the clamp as its fused RELU (FuseActivationIntoProducer's
        check) and nothing outside the island reads x or the island's float tensors (they go)."""
        producer, relu = x.producer, float_out.op
        chain = [(x, relu.input(0).producer), (relu.input(0), relu), (float_out, m.root)]
        if producer is None or any(
            t in m.graph.outputs or t.consumers != [reader] for t, reader in chain
        ):
            return None
        target = self.target or XNNPACK
        refusal = activation_fusion_refusal(producer, x, "RELU", m.root.output, target)
        return producer if refusal is None else None

    def int8_error(self, m: Match, *, x: Tensor, plan: Op | None) -> int:
        if plan is None:
            return self.int8_error_steps
        ratio = _scale_zp(x)[0] / _scale_zp(m.root.output)[0]
        return max(1, math.floor(ratio / 2 + 1))

    def rewrite(self, m: Match, *, x: Tensor, float_out: Tensor, plan: Op | None) -> None:
        producer = plan
        if producer is None:
            _replace(m, float_out, "RELU", [x], version=2)  # TFLite's op version of an int8 RELU
            return
        out = m.root.output
        m.graph.remove_op(m.root)  # the DEQUANTIZE and RELU_0_TO_1 go with dead-code elimination
        producer.outputs = [out]
        producer.fused_activation = "RELU"


class QuantizeDepthToSpace(_Completion):
    """QUANTIZE(DEPTH_TO_SPACE(DEQUANTIZE(x)))  =>  DEPTH_TO_SPACE(x)   (int8, same parameters).

    The output holds the input's values rearranged; with equal scale and zero point the int8
    values are the island's exactly.
    """

    completes = "DEPTH_TO_SPACE"
    int8_error_steps = 0  # moves bytes

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.QUANTIZE(p.DEPTH_TO_SPACE(p.DEQUANTIZE(p.x), out="float_out"))

    def check(self, m: Match, *, x: Tensor) -> Refusal | None:
        refusal = _island_check(m, x)
        if refusal is not None:
            return refusal
        if _scale_zp(x) != _scale_zp(m.root.output):
            return refuse("the output has other quantization parameters than the input")
        return self.target_refusal(m)

    def rewrite(self, m: Match, *, float_out: Tensor, x: Tensor) -> None:
        options = dict(float_out.op.options)  # the block size
        _replace(m, float_out, "DEPTH_TO_SPACE", [x], version=2, options=options)  # int8: version 2


L2_SCALE = 1.0 / 128.0  # TFLite's int8 L2_NORMALIZATION writes scale 1/128, zero point 0
L2_MAX_STEPS = 4  # beyond, the kernel's 1/128 grid is coarser than the island's output


def l2_steps(s_out: float) -> int:
    """The declared int8 error of `QuantizeL2Normalization` in the output's steps: the kernel's
    result is within 1.5 of its 1/128 steps of x / ||x|| (half a step of rounding, one of its
    fixed-point inverse square root), and its requantization to the output rounds once where
    the island's QUANTIZE rounded once."""
    return math.ceil(1.5 * L2_SCALE / s_out - 1e-9) + 1


class QuantizeL2Normalization(_Completion):
    """QUANTIZE(L2_NORMALIZATION(DEQUANTIZE(x)))  =>  QUANTIZE(L2_NORMALIZATION(x))   (int8).

    x / ||x|| over the innermost axis does not depend on x's scale: the int8 kernel normalizes
    the codes x_q - z_x and writes its fixed output parameters (scale 1/128, zero point 0); a
    QUANTIZE requantizes that to the island's output (none when it already has them). Within
    `l2_steps` of the island; refused where that exceeds L2_MAX_STEPS (an output calibrated
    finer than 1/128 would lose what it resolves). No compiled model shows L2_NORMALIZATION
    mapped: the Edge TPU prediction says undecided (forms.gated), the model is fully int8.
    """

    completes = "L2_NORMALIZATION"
    int8_error_steps = L2_MAX_STEPS  # the most it fires with; `int8_error` gives each match's

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.QUANTIZE(p.L2_NORMALIZATION(p.DEQUANTIZE(p.x), out="float_out"))

    def check(self, m: Match, *, x: Tensor, float_out: Tensor) -> Refusal | None:
        refusal = _island_check(m, x)
        if refusal is not None:
            return refusal
        if float_out.op.fused_activation not in ("NONE", ""):
            return refuse(f"a fused {float_out.op.fused_activation} after the normalization")
        steps = l2_steps(_scale_zp(m.root.output)[0])
        if steps > L2_MAX_STEPS:
            return refuse(
                f"the output's step {_scale_zp(m.root.output)[0]:.3g} is finer than the int8"
                f" kernel's 1/128: {steps} steps off the island (at most {L2_MAX_STEPS})"
            )
        return self.target_refusal(m)

    def int8_error(self, m: Match) -> int:
        return l2_steps(_scale_zp(m.root.output)[0])

    def rewrite(self, m: Match, *, x: Tensor, float_out: Tensor) -> None:
        out = m.root.output
        fixed = Quantization(
            scale=np.array([L2_SCALE], np.float32), zero_point=np.array([0], np.int64)
        )
        if _scale_zp(out) == (L2_SCALE, 0):
            _replace(m, float_out, "L2_NORMALIZATION", [x], version=2)
            return
        g = m.graph
        normed = g.add_tensor(
            g.unique_name(f"{out.name}/l2_int8"), out.shape, "INT8", quantization=fixed
        )
        g.remove_op(m.root)
        l2 = g.add_op("L2_NORMALIZATION", [x], [normed], {"fused_activation_function": "NONE"},
                      after=float_out.producer, version=2)  # fmt: skip
        g.add_op("QUANTIZE", [normed], [out], {}, after=l2)


RULES = (QuantizePrelu(), QuantizeRelu0To1(), QuantizeDepthToSpace(), QuantizeL2Normalization())
COMPLETED_OPS = frozenset(rule.completes for rule in RULES)  # float ops these rules make int8


def rules_for(target: Target | None) -> tuple[_Completion, ...]:
    """The completion rules deciding for `target` (None: complete wherever the rules apply)."""
    return tuple(type(rule)(target) for rule in RULES)


@dataclass
class Completion:
    """The model after completion, which islands were completed, and the verification record."""

    data: bytes
    completed: dict[str, int] = field(default_factory=dict)  # op type -> how many made int8
    refusals: list[str] = field(default_factory=list)  # islands left in float, and why
    kept_float: dict[str, tuple[int, str]] = field(default_factory=dict)  # op -> (n, why)
    verification: dict[str, Any] = field(default_factory=dict)
    kept: bool = True  # False: the completed model failed verification; `data` is the input
    # the IR of `data` as its parse reads (flatbuffer.read_back), for the caller to go on with;
    # None where the passes changed the given model and `data` is the input (parse `data`)
    model: Model | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> JSONDict:
        return {
            "completed": dict(self.completed),
            "kept": self.kept,
            "refusals": list(self.refusals),
            "kept_float": {
                op: {"count": n, "reason": why} for op, (n, why) in self.kept_float.items()
            },
            "verification": self.verification,
        }


def complete(
    data: bytes, *, model: Model, verify: bool = True, target: Target | None = None
) -> Completion:
    """The quantized model `data` with its float islands of `COMPLETED_OPS` made int8 where
    that pays on `target` (module docstring), checked against `data` within the declared int8
    error. A result outside it is not kept: `data` is returned with the reason.
    `model`: the parse of `data`, which the passes rewrite in place (the result's `model` says
    what to go on with)."""
    if not any(op.type in COMPLETED_OPS for op in model.main.ops):
        return Completion(data, model=model)  # (untouched)
    rules = rules_for(target)
    candidate = verified.apply(
        data, lambda: [(*rules, DeadCodeElimination(), TopologicalSort())], model=model
    )
    result = candidate.result
    refusals = [f"{r.rule} at {r.where!r}: {r.reason}" for r in result.refusals]
    kept_float = _kept_float(rules, result.refusals)
    if not result.events:
        return Completion(data, refusals=refusals, kept_float=kept_float)
    out = candidate.data
    made = {r.completes: n for r in rules for name, n in result.fired().items() if name == r.name}
    failure, record = verified.judge(candidate, verify)
    if failure is not None:
        return Completion(data, made, refusals, kept_float, {**record, "failure": failure}, False)
    kept = flatbuffer.read_back(candidate.model)  # (after the check, which reads it as made)
    return Completion(out, made, refusals, kept_float, record, model=kept)


def _kept_float(rules: tuple[_Completion, ...], refusals: list[Any]) -> dict[str, tuple[int, str]]:
    """Per float op type: how many islands stayed float, and the first reason given."""
    by_rule = {r.name: r.completes for r in rules}
    kept: dict[str, tuple[int, str]] = {}
    for r in refusals:
        op = by_rule.get(r.rule)
        if op is None:
            continue
        n, why = kept.get(op, (0, r.reason))
        kept[op] = (n + 1, why)
    return kept
