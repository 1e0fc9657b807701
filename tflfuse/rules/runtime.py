"""Runtime legalization: write only the builtin codes and op versions an interpreter release has.

`convert/optimize --runtime tflite-runtime==2.5.0` run these last (`runtime_legalization`), after
the target's pipeline: each rule fires only where the model holds an op version the release
(`tflfuse.targets.runtimes`, from delegates/runtimes.toml) does not register, and replaces it by the
same function in ops that release has. What no rule can lower is refused in one line by the caller
(`tflfuse.targets.runtimes.RuntimeCheck.refusal`), naming the op, the version and the runtime.

  SpellOutGelu                    GELU (builtin 150, TFLite 2.8)  =>  ops of TFLite 1.x
  SplitTransposeConvActivation    TRANSPOSE_CONV with a fused activation (v4, TFLite 2.12)  =>
                                  TRANSPOSE_CONV (v1-3) -> RELU / RELU6 / RELU_N1_TO_1
"""

from __future__ import annotations

import math

from tflfuse.ir import Op, Tensor
from tflfuse.ir.op_versions import required
from tflfuse.rewrite import (
    DeadCodeElimination,
    Match,
    NotApplicable,
    OpPattern,
    Pass,
    PatternBuilder,
    Refusal,
    Rule,
    TopologicalSort,
    Value,
    refuse,
)
from tflfuse.rewrite.common import is_float
from tflfuse.targets.edgetpu.rules import LegalizeGelu
from tflfuse.targets.runtimes import Runtime

# Abramowitz & Stegun 7.1.26: erf(a) = 1 - t (A1 + t (A2 + t (A3 + t (A4 + t A5)))) exp(-a^2),
# t = 1 / (1 + P a), |error| <= 1.5e-7 for a >= 0.
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
# max |GELU_erf(x) - the spelled form| over [-12, 12] in float64 (2.11e-7 at x = 3.08); float32
# rounding of the result (an ulp of relu(x)) is within verification's relative tolerance
_GELU_ERF_BOUND = 2.2e-7
_GELU_TANH_VS_ERF = 4.74e-4  # max |erf form - tanh form| (targets/edgetpu/rules.py, LegalizeGelu)
_ACTIVATION_OP = {"RELU": "RELU", "RELU6": "RELU6", "RELU_N1_TO_1": "RELU_N1_TO_1"}


def written(op: Op) -> int:
    """The version the op is written at: its own, or what its operands need when more."""
    return max(op.version, required(op))


class _RuntimeRule(Rule):
    """A rule that fires only where `runtime` lacks the op version the model holds."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def runs_as_is(self, op: Op) -> bool:
        """The runtime has the version the op is written at."""
        return written(op) in self.runtime.versions.get(op.type, ())

    def has(self, *ops: str) -> str | None:
        """The first of `ops` (version 1) the runtime lacks, else None."""
        return next((o for o in ops if 1 not in self.runtime.versions.get(o, ())), None)


class SpellOutGelu(_RuntimeRule):
    """GELU(x)  =>  the same function in MUL, ADD, SUB, DIV, ABS, EXP, TANH, RELU (float).

    approximate=True:  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  -- the kernel's own
    formula (the Edge TPU's LegalizeGelu builds it).
    approximate=False: GELU(x) = x Phi(x) = 0.5 x + 0.5 |x| erf(|x|/sqrt 2) (erf is odd), and with
    Abramowitz-Stegun 7.1.26 for erf on a >= 0,
        GELU(x) = relu(x) - 0.5 |x| P(t) exp(-x^2 / 2),  t = 1 / (1 + (p / sqrt 2) |x|),
    P(t) = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))): within 2.2e-7 of the erf GELU (the tanh
    form is 4.7e-4 away). Every op is version 1 of TFLite 1.x. Float only: an int8 GELU is
    refused (spell it out before quantizing: `convert --runtime` does). Before int8
    quantization (`tanh_form=True`) the erf GELU takes the tanh form too: litert-quantizer has
    no int8 ABS or EXP, and 4.7e-4 is far below an int8 step.
    """

    def __init__(self, runtime: Runtime, tanh_form: bool = False) -> None:
        super().__init__(runtime)
        self.tanh_form = tanh_form

    quantized_ok = True  # so that an int8 GELU gets the refusal below, not "float-only"
    int8_error_steps = 0  # refuses int8

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.GELU(p.x)

    def check(self, m: Match, *, x: Tensor) -> Refusal | None:
        if self.runs_as_is(m.root):
            return NotApplicable(f"{self.runtime.label} has GELU v{written(m.root)}")
        if not (is_float(x) and is_float(m.root.output)):
            return refuse(
                f"{self.runtime.label} has no GELU v{written(m.root)} and an int8 GELU is spelled"
                " out only before quantizing (convert --runtime does)"
            )
        missing = self.has("MUL", "ADD", "SUB", "DIV", "ABS", "EXP", "TANH", "RELU")
        if missing:
            return refuse(f"{self.runtime.label} has no {missing} to spell GELU out with")
        return None

    def error_bound(self, m: Match) -> float:
        if m.root.options.get("approximate"):
            return 0.0
        return _GELU_TANH_VS_ERF if self.tanh_form else _GELU_ERF_BOUND

    def rewrite(self, m: Match, *, x: Tensor) -> None:
        if m.root.options.get("approximate") or self.tanh_form:
            LegalizeGelu().rewrite(m, x=x)  # the tanh form (exactly this GELU when approximate)
            return
        b = m.builder()

        def c(name: str, value: float) -> Value:
            return b.scalar(value, name, like=x)

        ax = b.ABS(x, name="abs_x")
        scaled = b.MUL(ax, c("p_over_sqrt2", _AS_P / math.sqrt(2.0)), name="p_abs_x")
        denominator = b.ADD(scaled, c("one", 1.0), name="1_plus_p_abs_x")
        t = b.DIV(c("one_", 1.0), denominator, name="t")
        poly = b.MUL(t, c("a5", _AS_A[4]), name="poly5")
        for i in (3, 2, 1, 0):
            poly = b.ADD(poly, c(f"a{i + 1}", _AS_A[i]), name=f"poly{i + 1}_sum")
            poly = b.MUL(poly, t, name=f"poly{i + 1}")
        square = b.MUL(x, x, name="x2")
        gauss = b.EXP(b.MUL(square, c("minus_half", -0.5), name="minus_half_x2"), name="gauss")
        tail = b.MUL(b.MUL(ax, poly, name="abs_x_poly"), gauss, name="tail2")
        half_tail = b.MUL(tail, c("half", 0.5), name="tail")
        b.replace(m.root, b.SUB(b.RELU(x, name="relu_x"), half_tail, name="gelu"))


class SplitTransposeConvActivation(_RuntimeRule):
    """TRANSPOSE_CONV(x, fused_activation=A)  =>  A(TRANSPOSE_CONV(x)), A in RELU, RELU6,
    RELU_N1_TO_1.

    The fused activation made the op version 4 (TFLite 2.12); without it the op is version 3
    with a bias input, 2 with int8 weights, else 1 (TFLite's op_version rules). The activation
    op reads and writes tensors of the output's type and quantization, so the values are the same
    (int8: the same clamp of the same requantized result).
    """

    quantized_ok = True
    int8_error_steps = 0  # same requantization, same clamp

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.TRANSPOSE_CONV(p.shape, p.w, p.x, ...)

    def check(self, m: Match) -> Refusal | None:
        op = m.root
        act = op.fused_activation
        if act == "NONE" or self.runs_as_is(op):
            return NotApplicable("nothing to lower")
        if act not in _ACTIVATION_OP:
            return refuse(f"TRANSPOSE_CONV with fused {act} has no separate op form")
        lowered = _transpose_conv_version(op)
        if lowered not in self.runtime.versions.get("TRANSPOSE_CONV", ()):
            return refuse(f"{self.runtime.label} has no TRANSPOSE_CONV v{lowered} either")
        missing = self.has(_ACTIVATION_OP[act])
        if missing:
            return refuse(f"{self.runtime.label} has no {missing}")
        return None

    def rewrite(self, m: Match) -> None:
        op = m.root
        act, out = op.fused_activation, op.output
        b = m.builder(after=op)
        raw = b.tensor("linear", out.shape, out)
        b.set_output(op, 0, raw)
        b.op(_ACTIVATION_OP[act], raw, out=out)
        b.commit()
        op.fused_activation = "NONE"
        op.version = _transpose_conv_version(op)


def _transpose_conv_version(op: Op) -> int:
    """TFLite's version of a TRANSPOSE_CONV without a fused activation."""
    has_bias = len(op.inputs) > 3 and op.inputs[3] is not None
    if has_bias:
        return 3
    return 2 if op.inputs[1] is not None and op.input(1).dtype == "INT8" else 1


def runtime_legalization(runtime: Runtime, *, before_int8: bool = False) -> tuple[Rule | Pass, ...]:
    """The rules that lower a model to `runtime`'s op versions, then cleanup. `before_int8`:
    the model is quantized next (GELU in ops litert-quantizer takes)."""
    return (
        SpellOutGelu(runtime, tanh_form=before_int8),
        SplitTransposeConvActivation(runtime),
        DeadCodeElimination(),
        TopologicalSort(),
    )


RULES = (SpellOutGelu, SplitTransposeConvActivation)
