"""Edge TPU legalization of an int8 GELU: x * LOGISTIC(1.702 x), with its error declared per model.

GELU is outside the compiler's table. `LegalizeGelu` spells it in float (`optimize` on a float
model), but a model quantized next keeps its GELU through quantization (the tanh form's x^3
loses the signal in int8: `LegalizeGelu`), and on every int8 graph (`convert`'s, a stock int8
model given to `optimize`) a GELU would end the Edge TPU segment at the first MLP of every ViT.
In int8 GELU is a function of the input's 256 codes, but no op of the table
looks a code up. The form used here is the sigmoid approximation GELU(x) ~ x sigma(1.702 x)
(Hendrycks and Gimpel 2016): a swish with a slope, the form compiled YOLO models show mapped at
every activation (MUL by a constant, LOGISTIC, MUL of two tensors of one shape,
`delegates/edgetpu_forms.toml`).

    t = MUL(x, 1.702)      its scale is 1.702 s_x, its zero point x's: the codes of x, exactly
    s = LOGISTIC(t)        int8's fixed output parameters (1/256, -128)
    u = MUL(x, 256/255)    the codes of x again, at scale (256/255) s_x
    y = MUL(u, s)          y's own parameters

LOGISTIC's top code is 255/256, not 1: where sigma saturates (every x above about 3) the
product x s would be x (1 - 1/256), a bias of x/256 that at the top of a wide range (x ~ 20,
y's step ~ 0.08) is a whole step, on every large activation. The factor 256/255 on x makes
the top code exactly 1 and moves the small codes by 0.4% of a small value: over x's codes of
a GELU spanning -10..20, the rms distance to the float GELU goes from 0.54 to 0.26 steps of
y and the largest from 1.45 to 0.72 (the native kernel's rounding alone: 0.29 rms, 0.5).

The error is not guessed: x has 256 codes, so the rule computes, for each, the code the
rewrite gives (sigma rounded to its 1/256 step, the product rounded to y's step) and the code
the GELU kernel gives (erf form, or tanh form when `approximate`), and declares the largest
difference plus one step (the kernels' fixed-point rounding against this float model of it)
as the rewrite's int8 error, which the per-rewrite check then holds it to. Refused when that
exceeds `MAX_STEPS` (then it is another function, not a legalization).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from tflfuse.ir import Graph, Op, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, refuse
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets.edgetpu.headsplit import unshown
from tflfuse.targets.edgetpu.rules import _gated, _kind, _quant, _scale_zp, lifts_the_cut

SLOPE = 1.702
TOP = 256 / 255  # 1 / LOGISTIC's top value (code 127 of scale 1/256, zero point -128)
MAX_STEPS = 4


def _gelu(x: np.ndarray, approximate: bool) -> np.ndarray:
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def gelu_steps(s_x: float, z_x: int, s_y: float, z_y: int, approximate: bool) -> int:
    """The largest |rewrite - GELU| over x's 256 codes, in y's steps, plus one."""
    codes = np.arange(-128, 128, dtype=np.float64)
    x = s_x * (codes - z_x)
    sig = np.clip(np.round(1 / (1 + np.exp(-SLOPE * x)) * 256) - 128, -128, 127)
    ours = np.clip(np.round(TOP * x * (sig + 128) / 256 / s_y) + z_y, -128, 127)
    ref = np.clip(np.round(_gelu(x, approximate) / s_y) + z_y, -128, 127)
    return int(np.abs(ours - ref).max()) + 1


def pieces_unshown(x: Tensor) -> str | None:
    """Why an op the rewrite writes on `x` (int8, or float judged as it will be quantized) is
    not shown mapped by compiled evidence (`headsplit.unshown`), or None."""
    q = x.quantization if x.dtype in ("INT8", "UINT8") else None
    s_x, z_x = _scale_zp(x) if q is not None else (1.0, 0)
    like = (lambda scale, zero: _quant(scale, zero)) if q is not None else (lambda *_: None)
    t = Tensor("t", x.shape, x.dtype, quantization=like(SLOPE * s_x, z_x))
    s = Tensor("s", x.shape, x.dtype, quantization=like(1 / 256, -128))
    scalar = np.array([127], np.int8) if q is not None else np.array([SLOPE], np.float32)
    # MUL(x, 256/255) is the sloped MUL's form (x by the scalar code 127): checked once
    for op_type, ins, consts in (("MUL", [x], [scalar]), ("LOGISTIC", [t], []),
                                 ("MUL", [x, s], [])):  # fmt: skip
        why = unshown(op_type, ins, x.shape, {"fused_activation_function": "NONE"}, consts)
        if why:
            return f"its {op_type} is not shown mapped ({why})"
    return None


@lifts_the_cut
def float_gelu_lifted(op: Op, graph: Graph | None = None) -> bool:
    """A float GELU the quantized stage spells in mapped ops (`LegalizeGeluInt8`): where the
    recipe keeps GELU float until quantization (its tanh form loses the signal in int8), the
    float stage must not read it as a cut, or every legalization after the first MLP of a ViT
    (the attention products, calibrated in float) is held back by `after_the_cut` and the int8
    model keeps them on the CPU. Lifted when the three ops it becomes are shown mapped at x's
    shape; the int8 rule still checks its error over x's codes (`MAX_STEPS`)."""
    if op.type != "GELU" or not op.inputs or op.inputs[0] is None:
        return False
    x = op.inputs[0]
    return _kind(x) == "float" and _float_pieces_shown(tuple(x.shape))


@functools.lru_cache(maxsize=1024)
def _float_pieces_shown(shape: tuple[int, ...]) -> bool:
    """`pieces_unshown` of a float x of `shape` is None (asked at every gate: kept per shape)."""
    return pieces_unshown(Tensor("x", shape, "FLOAT32")) is None


class LegalizeGeluInt8(Rule):
    """int8: GELU(x)  =>  MUL(MUL(x, 256/255), LOGISTIC(MUL(x, 1.702)))  (module docstring:
    the error, and why 256/255)."""

    quantized_ok = True
    int8_error_steps = MAX_STEPS  # the most it fires with; `int8_error` gives each match's

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.GELU(p.x)

    def int8_error(self, m: Match, *, plan: int | None) -> int:
        return plan if isinstance(plan, int) else MAX_STEPS

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | int:
        """A refusal, or the declared int8 steps (the plan)."""
        out = m.root.output
        if _kind(x) == "float":
            return NotApplicable("float GELU: LegalizeGelu spells it (when not quantized next)")
        if _kind(x) != "int" or _kind(out) != "int" or x.dtype != "INT8" or out.dtype != "INT8":
            return refuse("GELU on other than per-tensor int8")
        (s_x, z_x), (s_y, z_y) = _scale_zp(x), _scale_zp(out)
        steps = gelu_steps(s_x, z_x, s_y, z_y, bool(m.root.options.get("approximate")))
        if steps > MAX_STEPS:
            return refuse(f"x sigma(1.702 x) is {steps} steps off GELU here (at most {MAX_STEPS})")
        why = pieces_unshown(x)
        return refuse(why) if why else steps

    def rewrite(self, m: Match, *, x: Tensor) -> None:
        s_x, z_x = _scale_zp(x)
        b = m.builder()
        t = b.MUL(x, b.scalar(SLOPE, "slope", like=x), name="sloped",
                  quant=_quant(SLOPE * s_x, z_x))  # fmt: skip
        s = b.LOGISTIC(t, name="sigma", quant=_quant(1 / 256, -128))
        u = b.MUL(x, b.scalar(TOP, "top", like=x), name="topped", quant=_quant(TOP * s_x, z_x))
        b.replace(m.root, b.MUL(u, s))


GELU_LEGALIZATION: tuple[Rule, ...] = (LegalizeGeluInt8(),)
