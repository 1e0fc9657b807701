"""Edge TPU legalization of an int8 GELU in ops of the table, with its error declared per model.

GELU is outside the compiler's table. `LegalizeGelu` spells it in float (`optimize` on a float
model), but a model quantized next keeps its GELU through quantization (the tanh form's x^3
loses the signal in int8: `LegalizeGelu`), and on every int8 graph (`convert`'s, a stock int8
model given to `optimize`) a GELU would end the Edge TPU segment at the first MLP of every ViT.
In int8 GELU is a function of the input's 256 codes, but no op of the table
looks a code up. Both forms here are swishes GELU(x) = x Phi(x) ~ x sigma(t(x)), the form
compiled YOLO models show mapped at every activation (MUL by a constant, LOGISTIC, MUL of two
tensors of one shape, `delegates/edgetpu_forms.toml`); they differ in the argument t.

**sloped**: t = 1.702 x (Hendrycks and Gimpel 2016), 4 ops:

    t = MUL(x, 1.702)      its scale is 1.702 s_x, its zero point x's: the codes of x, exactly
    s = LOGISTIC(t)        int8's fixed output parameters (1/256, -128)
    u = MUL(x, 256/255)    the codes of x again, at scale (256/255) s_x
    y = MUL(u, s)          y's own parameters

It is up to 0.02 off GELU near |x| = 2 (low on both sides: a bias, where y's step is 0.04 to
0.09 on EfficientFormer-L1's GELUs and 0.009 on its last one).

**cubic**: t = x (a + b min(x^2, 9)), a = 2 sqrt(2/pi), b = 0.044715 a: sigma(t) is exactly
the tanh form's (1 + tanh(t/2))/2 where |x| <= 3 (0.0003 |x| off erf's Phi), and past 3 both
are LOGISTIC's end code. 7 ops, each new tensor's range the image of x's (`cubic_ranges`):

    v = MUL(x, b)          the codes of x at scale b s_x (exact, as the sloped MUL)
    q = MUL(x, v)          b x^2 over [0, b X^2], X = min(3, |x|'s largest): the int8
                           output saturates there, which is the min(x^2, 9)
    k = ADD(q, a)          over [0, a + b X^2]
    t = MUL(x, k)          over t's image of x's range, cut to +-6.5 (past it LOGISTIC's int8
                           output is its end code: it saturates into that)
    s, u, y                as sloped

Each rounding lands where sigma is flat or on a fine grid, so over x's codes the form is within
about 0.01 of y's step of the native kernel's own rounding on wide ranges, and halves the sloped
form's error on narrow ones (`tests/test_edgetpu_gelu_forms.py`: the numbers).

LOGISTIC's top code is 255/256, not 1: where sigma saturates (every x above about 3) the
product x s would be x (1 - 1/256), a bias of x/256 that at the top of a wide range (x ~ 20,
y's step ~ 0.08) is a whole step, on every large activation. The factor 256/255 on x makes
the top code exactly 1 and moves the small codes by 0.4% of a small value.

The error is not guessed: x has 256 codes, so the rule computes, for each, the code each form
gives (every op's rounding to its output's grid, as the int8 kernels round) and the code the
GELU kernel gives (erf form, or tanh form when `approximate`). It writes the form whose codes
are closer to the kernel's (root mean square over the 256; the sloped one on a tie, or where
an op of the cubic one is not shown mapped), and declares its largest difference plus one step
(the kernels' fixed-point rounding against this float model of it) as the rewrite's int8
error, which the per-rewrite check then holds it to. Refused when that exceeds `MAX_STEPS`
(then it is another function, not a legalization).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from tflfuse.ir import Graph, Op, Quantization, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, refuse
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets.edgetpu.headsplit import unshown
from tflfuse.targets.edgetpu.rules import _gated, _kind, _quant, _scale_zp, lifts_the_cut

SLOPE = 1.702
TOP = 256 / 255  # 1 / LOGISTIC's top value (code 127 of scale 1/256, zero point -128)
MAX_STEPS = 4
CUBIC_A = 2 * math.sqrt(2 / math.pi)  # sigma(a x + b x^3) = (1 + tanh(sqrt(2/pi)(x + c x^3)))/2
CUBIC_B = 0.044715 * CUBIC_A
CLAMP = 3.0  # |x| past which sigma(t) is LOGISTIC's end code: x^2 is held at CLAMP^2
T_END = 6.5  # |t| past which LOGISTIC's int8 output is its end code (it is from 6.24 and 5.54)


def _gelu(x: np.ndarray, approximate: bool) -> np.ndarray:
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _grid(v: np.ndarray, scale: float, zero: int) -> np.ndarray:
    """`v` rounded onto an int8 grid (saturating) and back to real values."""
    return scale * (np.clip(np.round(v / scale) + zero, -128, 127) - zero)


def _range(low: float, high: float) -> tuple[float, int]:
    """(scale, zero point) of an int8 tensor over [low, high] with 0 inside."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / 255 or 1.0
    return scale, max(-128, min(127, round(-128 - low / scale)))


@dataclass(frozen=True)
class CubicRanges:
    """The int8 (scale, zero point) of the cubic form's q, k and t for an x of (s_x, z_x)."""

    q: tuple[float, int]
    k: tuple[float, int]
    t: tuple[float, int]


def cubic_ranges(s_x: float, z_x: int) -> CubicRanges:
    """The ranges the cubic form's tensors take: each the image of x's representable range."""
    low, high = s_x * (-128 - z_x), s_x * (127 - z_x)
    reach = min(CLAMP, max(-low, high))
    t = lambda v: v * (CUBIC_A + CUBIC_B * v * v)  # noqa: E731  (increasing)
    t_low = max(-T_END, t(max(low, -CLAMP)))
    t_high = min(T_END, t(min(high, CLAMP)))
    return CubicRanges(
        _range(0.0, CUBIC_B * reach * reach),
        _range(0.0, CUBIC_A + CUBIC_B * reach * reach),
        _range(t_low, t_high),
    )


def _sigma(t: np.ndarray) -> np.ndarray:
    return _grid(1 / (1 + np.exp(-t)), 1 / 256, -128)


def form_codes(form: str, s_x: float, z_x: int, s_y: float, z_y: int) -> np.ndarray:
    """The code y takes for each of x's 256 codes (-128..127) in `form` ("sloped", "cubic"),
    each op rounding to its output's grid."""
    x = s_x * (np.arange(-128, 128, dtype=np.float64) - z_x)
    if form == "sloped":
        sig = _sigma(SLOPE * x)
    else:
        r = cubic_ranges(s_x, z_x)
        q = _grid(x * (CUBIC_B * x), *r.q)
        k = _grid(q + CUBIC_A, *r.k)
        sig = _sigma(_grid(x * k, *r.t))
    return np.clip(np.round(TOP * x * sig / s_y) + z_y, -128, 127)


def kernel_codes(s_x: float, z_x: int, s_y: float, z_y: int, approximate: bool) -> np.ndarray:
    """The code the GELU kernel gives for each of x's 256 codes (its float value, rounded)."""
    x = s_x * (np.arange(-128, 128, dtype=np.float64) - z_x)
    return np.clip(np.round(_gelu(x, approximate) / s_y) + z_y, -128, 127)


@dataclass(frozen=True)
class GeluPlan:
    """The form a match is written in, and its declared int8 error (steps of y)."""

    form: str
    steps: int


def form_error(
    form: str, s_x: float, z_x: int, s_y: float, z_y: int, approximate: bool
) -> tuple[float, int]:
    """(rms, largest + 1) of |form's codes - the kernel's| over x's 256 codes, in y's steps."""
    d = form_codes(form, s_x, z_x, s_y, z_y) - kernel_codes(s_x, z_x, s_y, z_y, approximate)
    return float(np.sqrt(np.mean(d * d))), int(np.abs(d).max()) + 1


def gelu_steps(s_x: float, z_x: int, s_y: float, z_y: int, approximate: bool) -> int:
    """The largest |sloped form - GELU| over x's 256 codes, in y's steps, plus one."""
    return form_error("sloped", s_x, z_x, s_y, z_y, approximate)[1]


def choose_form(
    s_x: float, z_x: int, s_y: float, z_y: int, approximate: bool, cubic_shown: bool = True
) -> GeluPlan:
    """The form closer to the kernel over x's codes (rms; sloped on a tie or when the cubic
    form's ops are not shown mapped), with its declared steps."""
    rms, steps = form_error("sloped", s_x, z_x, s_y, z_y, approximate)
    plan = GeluPlan("sloped", steps)
    if cubic_shown:
        c_rms, c_steps = form_error("cubic", s_x, z_x, s_y, z_y, approximate)
        if c_rms < rms and c_steps <= max(steps, MAX_STEPS):
            plan = GeluPlan("cubic", c_steps)
    return plan


def pieces_unshown(x: Tensor, form: str = "sloped") -> str | None:
    """Why an op the rewrite in `form` writes on `x` (int8, or float judged as it will be
    quantized) is not shown mapped by compiled evidence (`headsplit.unshown`), or None."""
    q = x.quantization if x.dtype in ("INT8", "UINT8") else None
    s_x, z_x = _scale_zp(x) if q is not None else (1.0, 0)
    like = (lambda scale, zero: _quant(scale, zero)) if q is not None else (lambda *_: None)
    t = Tensor("t", x.shape, x.dtype, quantization=like(SLOPE * s_x, z_x))
    s = Tensor("s", x.shape, x.dtype, quantization=like(1 / 256, -128))
    scalar = np.array([127], np.int8) if q is not None else np.array([SLOPE], np.float32)
    # MUL(x, 256/255) is the sloped MUL's form (x by the scalar code 127): checked once
    pieces: list[tuple[str, list[Tensor], list[np.ndarray]]] = [
        ("MUL", [x], [scalar]), ("LOGISTIC", [t], []), ("MUL", [x, s], [])
    ]  # fmt: skip
    if form == "cubic":
        r = cubic_ranges(s_x, z_x)
        v = Tensor("q", x.shape, x.dtype, quantization=like(*r.q))
        k = Tensor("k", x.shape, x.dtype, quantization=like(*r.k))
        pieces += [("MUL", [x, v], []), ("ADD", [v], [scalar]), ("MUL", [x, k], [])]
    for op_type, ins, consts in pieces:
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
    model keeps them on the CPU. Lifted when the three ops of the sloped form are shown mapped
    at x's shape; the int8 rule still checks its error over x's codes (`MAX_STEPS`)."""
    if op.type != "GELU" or not op.inputs or op.inputs[0] is None:
        return False
    x = op.inputs[0]
    return _kind(x) == "float" and _float_pieces_shown(tuple(x.shape))


@functools.lru_cache(maxsize=1024)
def _float_pieces_shown(shape: tuple[int, ...]) -> bool:
    """`pieces_unshown` of a float x of `shape` is None (asked at every gate: kept per shape)."""
    return pieces_unshown(Tensor("x", shape, "FLOAT32")) is None


class LegalizeGeluInt8(Rule):
    """int8: GELU(x)  =>  MUL(MUL(x, 256/255), LOGISTIC(t)), t = MUL(x, 1.702) (sloped) or
    t = MUL(x, ADD(MUL(x, MUL(x, b)), a)) (cubic: the tanh form's argument; module docstring:
    the error, which form, and why 256/255)."""

    quantized_ok = True
    int8_error_steps = MAX_STEPS  # the most it fires with; `int8_error` gives each match's

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.GELU(p.x)

    def int8_error(self, m: Match, *, plan: GeluPlan | None) -> int:
        return plan.steps if isinstance(plan, GeluPlan) else MAX_STEPS

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | GeluPlan:
        """A refusal, or the form and its declared int8 steps (the plan)."""
        out = m.root.output
        if _kind(x) == "float":
            return NotApplicable("float GELU: LegalizeGelu spells it (when not quantized next)")
        if _kind(x) != "int" or _kind(out) != "int" or x.dtype != "INT8" or out.dtype != "INT8":
            return refuse("GELU on other than per-tensor int8")
        why = pieces_unshown(x)
        if why:
            return refuse(why)
        (s_x, z_x), (s_y, z_y) = _scale_zp(x), _scale_zp(out)
        approximate = bool(m.root.options.get("approximate"))
        plan = choose_form(s_x, z_x, s_y, z_y, approximate, pieces_unshown(x, "cubic") is None)
        if plan.steps > MAX_STEPS:
            return refuse(
                f"x sigma(1.702 x) and its cubic form are {plan.steps} steps off GELU here"
                f" (at most {MAX_STEPS})"
            )
        return plan

    def rewrite(self, m: Match, *, x: Tensor, plan: GeluPlan) -> None:
        s_x, z_x = _scale_zp(x)
        b = m.builder()
        if plan.form == "cubic":
            r = cubic_ranges(s_x, z_x)
            v = b.MUL(x, b.scalar(CUBIC_B, "b", like=x), name="cubed_slope",
                      quant=_quant(CUBIC_B * s_x, z_x))  # fmt: skip
            q = b.MUL(x, v, name="square", quant=_q(r.q))
            k = b.ADD(q, b.scalar(CUBIC_A, "a", like=x), name="slope", quant=_q(r.k))
            t = b.MUL(x, k, name="argument", quant=_q(r.t))
        else:
            t = b.MUL(x, b.scalar(SLOPE, "slope", like=x), name="sloped",
                      quant=_quant(SLOPE * s_x, z_x))  # fmt: skip
        s = b.LOGISTIC(t, name="sigma", quant=_quant(1 / 256, -128))
        u = b.MUL(x, b.scalar(TOP, "top", like=x), name="topped", quant=_quant(TOP * s_x, z_x))
        b.replace(m.root, b.MUL(u, s))


def _q(scale_zero: tuple[float, int]) -> Quantization:
    return _quant(*scale_zero)


GELU_LEGALIZATION: tuple[Rule, ...] = (LegalizeGeluInt8(),)
