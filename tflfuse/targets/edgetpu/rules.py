"""Edge TPU legalization: rewrite ops the compiler does not map into ops it does.

One unmappable op sends itself and every op that depends on it to the CPU, so a single
LEAKY_RELU near the input of a YOLO-style model costs nearly the whole accelerator. Each rule here
replaces such an op by the same function spelled in ops the Edge TPU table maps
(`delegates/edgetpu.toml`, [legalization] keeps each choice and its source), and a rule that
writes new ops asks the table first (`edgetpu_shape_refusal`) so that it never trades a refused op
for another. They run first in the `edgetpu` pipeline.

Every legalization is also refused when an op it would rewrite reads what the compiler computes
on the CPU after its one segment (`after_the_cut`): the cut follows the data flow, so such an op
never maps whatever it becomes, and spelling it out only adds CPU work (the encoder's GELU after
attention's BATCH_MATMUL of two activations stays one op instead of nine: benchmarks/PYTORCH.md).
A float TRANSPOSE over the element limit that the quantized stage splits into mapped pieces
(`split_once_quantized`) is no cut there: at 640 px YOLO's [1, 20, 20, 256] layout TRANSPOSE held
the attention product, which must be legalized in float to be calibrated, on the CPU. Nor is a
float GELU the quantized stage spells in mapped ops (`gelu.float_gelu_lifted`): the recipe
keeps it float until then, and read as a cut it held back every legalization after a ViT's MLP.

Most rules work on float graphs (the `edgetpu` recipe fuses and legalizes in float, then
quantizes) and on int8/uint8 graphs (a stock-converted `.tflite` given to `optimize`): there the
new tensors get quantization parameters derived from the tensors they replace, so every step is
one requantization and the result stays within a step or two of the original. GELU is float only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from tflfuse.ir import Graph, Op, Quantization, Tensor
from tflfuse.rewrite import (
    Builder,
    Match,
    OpPattern,
    Pass,
    PatternBuilder,
    Refusal,
    Rule,
    Value,
    refuse,
)
from tflfuse.rewrite.common import NotApplicable, is_float, single_reader
from tflfuse.targets.capabilities import capability
from tflfuse.targets.edgetpu.predict import (
    cut_origins,
    edgetpu_shape_refusal,
    statuses_once_quantized,
)

_INT_TYPES = ("INT8", "UINT8")


# -- the gate every legalization passes ------------------------------------------------------------
def after_the_cut(m: Match) -> Refusal | None:
    """Refusal when an op of the match reads what a one-segment compile computes on the CPU
    after the Edge TPU segment (`tflfuse.targets.edgetpu.predict.cut_origins`). The cut follows the
    data flow, so such an op never maps, whatever it is rewritten into: the legalization would
    only spell it out in more ops on the CPU (a GELU after attention's BATCH_MATMUL of two
    activations: 9 ops instead of 1). The graph is judged as it stands; the pass manager runs
    round after round, so once a rule lifts the refusal upstream, the legalization follows."""
    inside = {id(t) for op in m.ops for t in op.outputs}
    reads = [t for op in m.ops for t in op.inputs if t is not None and id(t) not in inside]
    origins = cut_origins(m.graph, lifted=lambda op: lifted_once_quantized(op, m.graph))
    cut = min((origins[id(t)] for t in reads if id(t) in origins), default=None)
    if cut is None:
        return None
    op = m.graph.ops[cut]
    why = statuses_once_quantized(m.graph)[cut][1]
    return refuse(
        f"its input is computed on the CPU after the Edge TPU segment (cut at op {cut}"
        f" {op.type}: {why}): legalized, it would still run on the CPU, in more ops"
    )


def lifted_once_quantized(op: Op, graph: Graph) -> bool:
    """A refused float op the quantized stage's legalization makes mapped, which the gate does
    not count as a cut: an oversized TRANSPOSE (`split_once_quantized`), and what the modules
    whose int8 rules lift a cut register with `lifts_the_cut` (a float GELU left to its int8
    form: gelu.py; a layout op of a patch unfold or fold: patches.py)."""
    return split_once_quantized(op) or any(lift(op, graph) for lift in _LIFTS)


_LIFTS: list[Callable[[Op, Graph], bool]] = []


def lifts_the_cut(lift: Callable[[Op, Graph], bool]) -> Callable[[Op, Graph], bool]:
    """Register `lift(op, graph)`: True for a float op an int8 legalization makes mapped (those
    modules are built on this one, so they register here rather than being imported by it)."""
    _LIFTS.append(lift)
    return lift


def split_once_quantized(op: Op) -> bool:
    """A float TRANSPOSE over the compiler's element limit that `SplitOversizedTranspose` cuts
    into mapped pieces once the graph is quantized (it waits for one scale for every piece):
    the gate does not count it as a cut, so a legalization that must run in float (the
    attention product, calibrated there) is not held back by it. Shapes only, as the rule's
    own plan (`transpose_split`) asks them."""
    if op.type != "TRANSPOSE" or len(op.inputs) < 2 or not op.outputs:
        return False
    x, perm_t = op.inputs[0], op.inputs[1]
    if x is None or perm_t is None or not perm_t.is_constant or not is_float(x):
        return False
    if x.size <= _transpose_limit():
        return False
    perm = [int(v) % len(x.shape) for v in np.asarray(perm_t.data).reshape(-1)]
    plan = transpose_split(tuple(x.shape), perm, tuple(op.outputs[0].shape), "INT8")
    return not isinstance(plan, Refusal)


def _gated(check: Callable[..., Refusal | Any]) -> Callable[..., Refusal | Any]:
    """A legalization's `check`, then `after_the_cut` (last: it reads the whole graph); a plan
    the check made goes to `rewrite` when the cut lets the rule fire. The wrapper keeps the
    check's signature (`__wrapped__`), so the engine passes it the captures the check names."""

    @functools.wraps(check)
    def gated(self: Rule, m: Match, **captures: Tensor) -> Refusal | Any:
        verdict = check(self, m, **captures)
        if isinstance(verdict, Refusal):
            return verdict
        return after_the_cut(m) or verdict

    return gated


# -- helpers -------------------------------------------------------------------------------------
def _same_scale(a: Tensor, b: Tensor) -> bool:
    """a is quantized as b is (a's quantization `same_as` b's)."""
    return a.quantization is not None and a.quantization.same_as(b.quantization)


def _kind(t: Tensor) -> str | None:
    """ "float", "int" (per-tensor int8/uint8) or None (something these rules do not handle)."""
    if is_float(t):
        return "float"
    q = t.quantization
    if t.dtype in _INT_TYPES and t.is_quantized and q is not None and not q.per_channel:
        return "int"
    return None


def _kind_refusal(what: str, x: Tensor, out: Tensor) -> Refusal | None:
    """Refused unless `x` and `out` are both float or both per-tensor int8/uint8 (`_kind`)."""
    kind = _kind(x)
    if kind is None or _kind(out) != kind:
        return refuse(f"{what} on {x.dtype} with per-channel or no quantization")
    return None


def _scale_zp(t: Tensor) -> tuple[float, int]:
    q = cast(Quantization, t.quantization)  # quantized: the caller checked
    scale = cast(np.ndarray, q.scale)
    return float(scale.reshape(-1)[0]), int(np.asarray(q.zero_point).reshape(-1)[0])


def _quant(scale: float, zero_point: int) -> Quantization:
    return Quantization(
        scale=np.array([scale], np.float32), zero_point=np.array([zero_point], np.int64)
    )


def _range_q(ref: Tensor, low: float, high: float) -> Quantization:
    """Per-tensor quantization of `ref`'s integer type covering [low, high] (0 included)."""
    low, high = min(low, 0.0), max(high, 0.0)
    qmin, qmax = (-128, 127) if ref.dtype == "INT8" else (0, 255)
    scale = (high - low) / (qmax - qmin) or 1.0
    zero = round(qmin - low / scale)
    return _quant(scale, max(qmin, min(qmax, zero)))


def _refusal_of(op_type: str, ins: list[Tensor], out_shape, options=None, consts=()) -> str | None:
    """Why the compiler would refuse an `op_type` op reading tensors shaped like `ins` (plus the
    constants `consts`, as numpy arrays) and writing `out_shape`, or None: asked of an op before a
    rule writes it (a scratch graph; the rule's own graph is not touched)."""
    g = Graph("scratch")
    inputs = [g.add_tensor(f"in{i}", t.shape, t.dtype) for i, t in enumerate(ins)]
    inputs += [g.add_constant(f"c{i}", np.asarray(c)) for i, c in enumerate(consts)]
    out = g.add_tensor("out", tuple(out_shape), ins[0].dtype)
    return edgetpu_shape_refusal(g.add_op(op_type, inputs, [out], dict(options or {})))


# -- activations ---------------------------------------------------------------------------------
class LegalizeLeakyRelu(Rule):
    """float: LEAKY_RELU(x, a)  =>  ADD(MUL(x, a), MUL(RELU(x), 1 - a)).
    int8:  LEAKY_RELU(x, a)  =>  PRELU(x, alpha = a per channel).

    x > 0: a x + (1 - a) x = x;  x <= 0: a x + 0 = a x. Built from plainly supported ops (the
    MAXIMUM(x, a x) form hit internal compiler errors, google-coral/edgetpu#165, #185) and ones
    litert-quantizer can quantize (it has no PRELU), so the float model is legalized this way
    before quantizing. On an int8 graph PRELU computes the same two requantizations as the
    LEAKY_RELU kernel (alpha stored as 127 x a/127), but its multipliers round differently, so
    the result may move by one step (measured by the int8 property test), where the four-op form
    would round once more per layer.
    """

    quantized_ok = True
    int8_error_steps = 1  # PRELU rounds once differently (measured: 1 step)

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.LEAKY_RELU(p.x)

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | None:
        refusal = _kind_refusal("LEAKY_RELU", x, m.root.output)
        if refusal is not None:
            return refusal
        alpha = float(m.root.options.get("alpha", 0.2))
        if _kind(x) == "int" and not 0.0 < alpha <= 1.0:
            return refuse(f"int8 LEAKY_RELU with alpha {alpha} outside (0, 1]")
        return None

    def rewrite(self, m: Match, *, x: Tensor) -> None:
        alpha = float(m.root.options.get("alpha", 0.2))
        b = m.builder()
        if _kind(x) == "int":
            top = 127 if x.dtype == "INT8" else 255
            # alpha broadcasts to x exactly: (1, 1, C) for NHWC, (C,) for (N, C); the kernel
            # refuses an alpha of higher rank than x
            alpha_shape = (*[1] * max(len(x.shape) - 2, 0), x.shape[-1])
            slope = b.const(np.full(alpha_shape, top), "alpha", x.dtype, _quant(alpha / top, 0))
            b.replace(m.root, b.PRELU(x, slope))
            return
        scaled = b.MUL(x, b.scalar(alpha, "alpha", like=x), name="alpha_x")
        relu = b.RELU(x, name="relu")
        kept = b.MUL(relu, b.scalar(1 - alpha, "one_minus_alpha", like=x), name="relu_part")
        b.replace(m.root, b.ADD(scaled, kept))


class LegalizeRelu0To1(Rule):
    """int8: RELU_0_TO_1(x)  =>  RELU(x)                 when the output saturates at 1 or below
                             =>  MINIMUM(RELU(x), q(1))  otherwise (q(1): 1 at the output's scale)

    The int8 RELU_0_TO_1 kernel requantizes x to the output and clamps to [q(0), q(1)] (each
    within the type's range); RELU requantizes the same way and clamps to [q(0), the type's top],
    so where q(1) is at or past the top the two are the same op, and otherwise the MINIMUM with
    the constant q(1), at the output's parameters, is the missing clamp: exact either way. The
    Edge TPU maps RELU and MINIMUM, not RELU_0_TO_1. A float RELU_0_TO_1 is made int8 where it is
    quantized (`tflfuse.quantize.int8_completion`); this takes the ones an int8 file brings.
    """

    quantized_ok = True
    int8_error_steps = 0  # the same requantization and clamps

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.RELU_0_TO_1(p.x)

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | None:
        if _kind(x) == "float":
            return NotApplicable("float: made int8 where it is quantized (int8_completion)")
        refusal = _kind_refusal("RELU_0_TO_1", x, m.root.output)
        if refusal is not None:
            return refusal
        if self._one(m) is not None:
            why = _refusal_of("MINIMUM", [m.root.output], m.root.output.shape,
                              consts=[np.zeros(1, np.int8)])  # fmt: skip
            if why:
                return refuse(f"the clamp at 1 would stay on the CPU: {why}")
        return None

    @staticmethod
    def _one(m: Match) -> int | None:
        """1 at the output's scale when it is below the type's top (a clamp RELU lacks)."""
        out = m.root.output
        scale, zero = _scale_zp(out)
        top = 127 if out.dtype == "INT8" else 255
        one = zero + round(1.0 / scale)
        return one if one < top else None

    def rewrite(self, m: Match, *, x: Tensor) -> None:
        out, b = m.root.output, m.builder()
        one = self._one(m)
        relu = b.RELU(x, name="relu", quant=out.quantization)
        if one is None:
            b.replace(m.root, relu)
            return
        clamp = b.const(np.array([one]), "one", out.dtype, out.quantization)
        b.replace(m.root, b.MINIMUM(relu, clamp))


class LegalizeHardSwish(Rule):
    """HARD_SWISH(x)  =>  MUL(MUL(x, ADD(x, 3, fused RELU6)), 1/6).

    x * relu6(x + 3) / 6 exactly; the RELU6 rides on the ADD as its fused activation (the Edge TPU
    and the quantizer both take ADD with RELU6). int8: the gate relu6(x + 3) is quantized over
    [0, relu6(x_max + 3)], x_max the largest value x's quantization holds (the gate never exceeds
    it, and a finer gate step is a smaller error); x * relu6(..) is 6 y, quantized at 6x the
    output scale with the output's zero point.
    """

    quantized_ok = True
    # The least `int8_error` gives (inputs whose range reaches past +3); see int8_error.
    int8_error_steps = 2

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.HARD_SWISH(p.x)

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | None:
        return _kind_refusal("HARD_SWISH", x, m.root.output)

    def int8_error(self, m: Match, *, x: Tensor) -> int:
        """hard_swish_int8_steps for this match's scales; 0 on a float HARD_SWISH."""
        if _kind(x) != "int":
            return 0
        return hard_swish_int8_steps(x, m.root.output)

    def rewrite(self, m: Match) -> None:
        spell_out_hard_swish(m)


def spell_out_hard_swish(m: Match) -> None:
    """Replace the HARD_SWISH root of `m` (float, or int8/uint8 per tensor) by
    MUL(MUL(x, ADD(x, 3, fused RELU6)), 1/6); see LegalizeHardSwish for the quantization of
    the intermediates. Also XNNPACK's form for int8 (rules/kernels.py: SpellOutInt8HardSwish)."""
    x, out = m.root.input(0), m.root.output  # HARD_SWISH(x)
    q_gate = q_prod = None
    if _kind(x) == "int":
        s_out, z_out = _scale_zp(out)
        q_gate, q_prod = _range_q(x, 0.0, _gate_top(x)), _quant(6 * s_out, z_out)
    b = m.builder()
    three = b.scalar(3.0, "three", like=x)
    gate = b.ADD(x, three, name="relu6_x_plus_3", quant=q_gate, fused_activation_function="RELU6")
    prod = b.MUL(x, gate, name="x_times_gate", quant=q_prod)
    b.replace(m.root, b.MUL(prod, b.scalar(1.0 / 6.0, "one_sixth", like=x)))


def _gate_top(x: Tensor) -> float:
    """The largest relu6(x + 3) an int8 x can give: the top of the gate's quantized range."""
    return min(6.0, max(0.0, x.real_range()[1] + 3.0))


def hard_swish_int8_steps(x: Tensor, out: Tensor) -> int:
    """How far, in output steps, the spelled-out int8 HARD_SWISH may be from the kernel's.

    Against the exact x relu6(x + 3) / 6 (x as quantized, the same for both forms): the gate
    rounds by half its step s_g, which moves y by |x| s_g / 12, and only where -3 < x < 3 (the
    RELU6 clamps exactly to 0 and to the gate's top elsewhere); the product rounds by half of
    its 6 output steps, divided by 6: half a step; the output rounds by half a step; the kernel
    rounds once (half a step; its fixed-point gate is finer than ours). So

        steps <= 1.5 + min(3, max |x|) s_g / (12 s_y)

    which is 2 when x reaches past +3 (s_g = 6/255, s_y >= (x_max + 0.375)/255 and |x| in the
    gate's active range <= 3: the common case) and grows when x's range is mostly negative, so
    that the output's range, and step, are small: x in [-4.4, 0] gives y in [-0.375, 0] with a
    gate span 3, 4 steps (found by the int8 property test at 3, where 2 were declared).
    """
    lo, hi = x.real_range()
    s_g = float(cast(np.ndarray, _range_q(x, 0.0, _gate_top(x)).scale)[0])
    s_y = _scale_zp(out)[0]
    active = min(3.0, max(-lo, hi))
    return max(2, math.ceil(1.5 + active * s_g / (12.0 * s_y)))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


_GELU_TANH_VS_ERF = 4.74e-4
_GELU_IN_FLOAT = "GELU is legalized on the float model, before quantization"


class LegalizeGelu(Rule):
    """GELU(x)  =>  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (MUL, ADD, TANH only).

    Exact for GELU(approximate=True); within 4.74e-4 of the erf form. Float only, and not
    written before a quantization to int8 (`float_form_loses_int8`): x^2 and x^3 take int8
    ranges of the square and cube of x's, whose steps swallow the small values the tanh reads
    (EfficientFormer-L1, litert-torch: SNR 1.5 at a block's x^3, the fused model's cosine
    against the float export 0.875 where stock's is 0.974). The quantizer quantizes the GELU
    itself and `LegalizeGeluInt8` (targets/edgetpu/gelu.py) spells the int8 op with its error
    measured over the input's 256 codes (cosine 0.9745, 2 steps per GELU). Kept for `optimize`
    on a float model. (`quantized_ok` only so that an int8 GELU gets that refusal in
    `--explain`.)
    """

    quantized_ok = True
    int8_error_steps = 0  # refuses int8
    float_form_loses_int8 = True

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.GELU(p.x.of("float", because=_GELU_IN_FLOAT))

    @_gated
    def check(self, m: Match) -> Refusal | None:
        """The float test is the pattern's; what is left is where the cut falls."""
        return None

    def error_bound(self, m: Match) -> float:
        """0 for GELU(approximate=True); max |erf form - tanh form| = 4.74e-4 (at x = 2.70)."""
        return 0.0 if m.root.options.get("approximate") else _GELU_TANH_VS_ERF

    def rewrite(self, m: Match, *, x: Tensor) -> None:
        b = m.builder()

        def c(name: str, value: float) -> Value:
            return b.scalar(value, name, like=x)

        x3 = b.MUL(b.MUL(x, x, name="x2"), x, name="x3")
        inner = b.ADD(x, b.MUL(x3, c("k", 0.044715), name="cubic"), name="inner")
        th = b.TANH(b.MUL(inner, c("sqrt_2_over_pi", _SQRT_2_OVER_PI), name="arg"), name="tanh")
        one_plus = b.ADD(th, c("one", 1.0), name="1_plus")
        half_x = b.MUL(x, c("half", 0.5), name="half_x")
        b.replace(m.root, b.MUL(half_x, one_plus))


# -- reductions ----------------------------------------------------------------------------------
def _pool_limit() -> int:
    return int(capability("edgetpu")["ops"]["AVERAGE_POOL_2D"].get("max_pool_plane", 1 << 30))


def _mean_limit() -> int:
    """The largest H x W plane a MEAN maps over as it is (YAMNet's 3x2 one did: edgetpu-more)."""
    return int(capability("edgetpu")["ops"]["MEAN"].get("max_pool_plane", 0))


def _pool_stages(h: int, w: int, limit: int) -> list[tuple[int, int]] | None:
    """Pool windows (fh, fw) whose successive averages equal the mean over h x w, each window at
    most `limit` pixels: one stage when h*w fits, else two (fh | h, fw | w), else None."""
    if h * w <= limit:
        return [(h, w)]
    best: tuple[int, int] | None = None
    for fh in (d for d in range(1, h + 1) if h % d == 0):
        for fw in (d for d in range(1, w + 1) if w % d == 0):
            fits = fh * fw <= limit and (h // fh) * (w // fw) <= limit
            if fits and (best is None or fh * fw > best[0] * best[1]):
                best = (fh, fw)
    if best is None:
        return None
    return [best, (h // best[0], w // best[1])]


def _average_pool_chain(
    b: Builder, x: Tensor, stages: list[tuple[int, int]], final: Value | None, names: str = ""
) -> Tensor | Value:
    """x -> AVERAGE_POOL_2D per stage; the last writes `final` (a declared tensor) or is
    returned (to replace the root). Integer pools keep x's parameters (the int8 kernel wants
    equal input and output scales); the stages between are named `<names>pool<i>`."""
    current: Tensor | Value = x  # (x itself only for no stage: `check` plans at least one)
    n, h, w, ch = x.shape
    for i, (fh, fw) in enumerate(stages):
        h, w = h // fh, w // fw
        last = i == len(stages) - 1
        current = b.AVERAGE_POOL_2D(
            current, name=f"{names}pool{i}", shape=(n, h, w, ch), like=x,
            out=final if last else None, padding="VALID", stride_h=fh, stride_w=fw,
            filter_height=fh, filter_width=fw,
        )  # fmt: skip
    return current


def _keep_input_quantization(out: Tensor, x: Tensor) -> None:
    """A pool written straight to `out` keeps x's parameters when `out` has none."""
    if out.quantization is None and x.quantization is not None:
        out.quantization = x.quantization


class MeanToAveragePool(Rule):
    """MEAN(x, axes=[1, 2])  =>  AVERAGE_POOL_2D(x, filter = H x W) [-> RESHAPE] [-> QUANTIZE],
    only for a plane larger than a MEAN maps over (the compiler maps a MEAN within its limit as it
    is: YAMNet's, edgetpu-more; the pool would add ops and roundings there).

    The same average (exact in float). A plane larger than the compiler maps is pooled in two
    stages: windows fh x fw, then the (H/fh) x (W/fw) grid of their averages — the mean of equal-
    sized tile means is the mean (the split workaround of google-coral/edgetpu#461). keep_dims=False
    adds a RESHAPE; an int8 MEAN whose output scale differs from its input's adds a requantizing
    QUANTIZE (the int8 pool kernel ignores output parameters: checked, 38 steps off otherwise), so
    it rounds twice: within two steps of the MEAN when the output scale is finer than the input's.
    """

    quantized_ok = True
    int8_error_steps = 2  # pool, then a requantizing QUANTIZE: two roundings

    def int8_error(self, m: Match, *, x: Tensor, plan: list[tuple[int, int]]) -> int:
        """Each pool stage rounds at x's scale s_x (half a step), the QUANTIZE and the MEAN at
        the output's s_y: |error| <= stages * s_x / (2 s_y) + 1 output steps (found by the int8
        property test: 5 steps for a 3x3 mean whose output scale is 8x finer)."""
        if _kind(x) != "int":
            return 0
        stages = max(len(plan), 1)
        ratio = _scale_zp(x)[0] / _scale_zp(m.root.output)[0]
        return max(self.int8_error_steps, math.floor(stages * ratio / 2 + 1))

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MEAN(p.x, p.const("axes"))

    @_gated
    def check(self, m: Match, *, x: Tensor, axes: Tensor) -> Refusal | list[tuple[int, int]]:
        """A refusal, or the pool stages (the plan)."""
        if len(x.shape) != 4 or x.shape[0] != 1:
            return refuse(f"MEAN input {list(x.shape)} is not a batch-1 image tensor")
        reduced = sorted({int(a) % 4 for a in np.asarray(axes.data).reshape(-1)})
        if reduced != [1, 2]:
            return refuse(f"MEAN reduces axes {reduced}, not height and width")
        refusal = _kind_refusal("MEAN", x, m.root.output)
        if refusal is not None:
            return refusal
        plane, mean_limit = x.shape[1] * x.shape[2], _mean_limit()
        if plane <= mean_limit:
            return refuse(
                f"the MEAN maps on the Edge TPU as it is (a {x.shape[1]}x{x.shape[2]} plane, within"
                f" the {mean_limit} px of delegates/edgetpu.toml [ops.MEAN]): a pool would add ops"
                " and roundings"
            )
        stages = _pool_stages(x.shape[1], x.shape[2], _pool_limit())
        if stages is None:
            return refuse(f"no exact tiling of the {x.shape[1]}x{x.shape[2]} plane fits the limit")
        return stages

    def rewrite(self, m: Match, *, x: Tensor, plan: list[tuple[int, int]]) -> None:
        out, b = m.root.output, m.builder()
        pooled_shape = (1, 1, 1, x.shape[3])
        requant = _kind(x) == "int" and not _same_scale(out, x)
        if out.shape == pooled_shape and not requant:  # the pools write the MEAN's output
            _keep_input_quantization(out, x)
            b.replace(m.root, _average_pool_chain(b, x, plan, None))
            return
        pooled = b.tensor("pooled", pooled_shape, like=x)
        y = _average_pool_chain(b, x, plan, pooled, "pooled/")
        if requant:
            y = b.QUANTIZE(y, name="requantized", quant=out.quantization)
        if y.shape != out.shape:
            y = b.RESHAPE(y, b.ints(out.shape, "shape"))
        b.replace(m.root, y)


class SplitOversizedAveragePool(Rule):
    """AVERAGE_POOL_2D over a whole plane larger than the compiler maps  =>  two AVERAGE_POOL_2D
    stages (fh x fw windows, then their grid), the same mean (google-coral/edgetpu#461)."""

    quantized_ok = True
    int8_error_steps = 1  # two pool stages round once more

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.AVERAGE_POOL_2D(p.x)

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | list[tuple[int, int]]:
        """A refusal, or the pool stages (the plan)."""
        op = m.root
        fh, fw = int(op.options.get("filter_height", 1)), int(op.options.get("filter_width", 1))
        if fh * fw <= _pool_limit():
            return NotApplicable("the pool window already fits")
        if len(x.shape) != 4 or (fh, fw) != tuple(x.shape[1:3]) or op.output.shape[1:3] != (1, 1):
            return refuse("only a global average pool (window = whole plane) is split")
        if op.fused_activation != "NONE":
            return refuse("the pool has a fused activation")
        if _kind(x) == "int" and not _same_scale(op.output, x):
            return refuse("int8 pool changes the scale")
        stages = _pool_stages(fh, fw, _pool_limit())
        if stages is None:
            return refuse(f"no exact tiling of the {fh}x{fw} plane fits the limit")
        return stages

    def rewrite(self, m: Match, *, x: Tensor, plan: list[tuple[int, int]]) -> None:
        _keep_input_quantization(m.root.output, x)
        b = m.builder()
        b.replace(m.root, _average_pool_chain(b, x, plan, None))


# -- resize ----------------------------------------------------------------------------------------
def _slice(b: Builder, x: Tensor | Value, begin, size, name: str, q) -> Value:
    """SLICE(x, begin, size) named `name`, quantized `q` (its constants `<name>/begin|size`)."""
    return b.SLICE(x, b.ints(begin, f"{name}/begin"), b.ints(size, f"{name}/size"), name=name,
                   quant=q)  # fmt: skip


class SplitOversizedResize(Rule):
    """RESIZE(x) with an output plane larger than the compiler maps  =>
    CONCATENATION_rows(RESIZE(SLICE_rows(x)) ...), tiles of input rows each under the limit.

    Integer scale factors, no align_corners: output row r reads input rows floor(r/f) and
    (bilinear) the next one, so a tile of input rows [a, b) plus one extra row gives output rows
    [a f, b f) exactly; the extra output rows are sliced off. With half-pixel centers (what
    PyTorch's and TF2's bilinear upsampling write, e.g. a segmentation model's final full-size
    resize) output row r reads source row (r + 1/2)/f - 1/2, which lies in [a - 1/2, b - 1/2)
    for r in [a f, b f): rows a - 1 to b, so the tile takes one extra row on each side (where
    the image has one) and its own clamping at the tile's edges never reaches the rows kept;
    the tile's scale is the same 1/f (also in the int8 kernel's fixed point, a ratio of sizes),
    so its kept rows are the same numbers. Nearest-neighbour with half-pixel centers picks
    floor((r + 1/2)/f) = floor(r/f): no extra row. The same numbers in float; int8 tiles keep
    the tensors' parameters (the kernels do not rescale).
    """

    quantized_ok = True
    int8_error_steps = 0  # bit-exact tiles

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")(p.x, p.const("size"))

    def _plan(self, m: Match, x: Tensor) -> tuple[int, int, int, int] | Refusal:
        op = m.root
        limit = _resize_limit(op.type)
        (n, h, w, _), (_, big_h, big_w, _) = x.shape, op.output.shape
        if n != 1 or big_h * big_w <= limit:
            return NotApplicable("the resize output already fits")
        if op.options.get("align_corners"):
            return refuse("only resizes without align_corners are tiled")
        if big_h % h or big_w % w:
            return refuse(f"scale {h}x{w} -> {big_h}x{big_w} is not an integer factor")
        if _kind(x) is None:
            return refuse(f"RESIZE on {x.dtype} with per-channel or no quantization")
        fh = big_h // h
        bilinear = op.type == "RESIZE_BILINEAR"
        above = 1 if bilinear and op.options.get("half_pixel_centers") else 0
        below = 1 if bilinear else 0
        extra = above + below
        rows = limit // (fh * big_w) - extra
        if rows < 1:
            return refuse(f"even one input row resizes to more than {limit} pixels")
        c = x.shape[3]
        tile = Tensor("tile", (1, (rows + extra) * fh, big_w, c), op.output.dtype)
        why = _refusal_of(
            op.type, [Tensor("rows", (1, rows + extra, w, c), x.dtype)], tile.shape,
            dict(op.options), consts=[np.array(tile.shape[1:3], np.int32)],
        ) or _refusal_of("CONCATENATION", [tile], op.output.shape, {"axis": 1})  # fmt: skip
        if why:
            return refuse(f"a tile would stay on the CPU: {why}")
        return fh, rows, above, below

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | tuple[int, int, int, int]:
        return self._plan(m, x)

    def rewrite(self, m: Match, *, x: Tensor, plan: tuple[int, int, int, int]) -> None:
        op, (fh, rows, above, below) = m.root, plan
        out = op.output
        _, h, w, c = x.shape
        big_w = out.shape[2]
        b = m.builder()
        tiles = []
        for i, a in enumerate(range(0, h, rows)):
            end = min(h, a + rows)
            first, ext = max(0, a - above), min(h, end + below)
            name = f"tile{i}"
            piece = _slice(b, x, [0, first, 0, 0], [1, ext - first, w, c], name, x.quantization)
            full = b.op(
                op.type, piece, b.ints([(ext - first) * fh, big_w], f"{name}/out_size"),
                name=f"{name}/resized", shape=(1, (ext - first) * fh, big_w, c),
                dtype=out.dtype, quant=out.quantization, options=op.options,
            )  # fmt: skip
            if (first, ext) != (a, end):
                full = _slice(b, full, [0, (a - first) * fh, 0, 0], [1, (end - a) * fh, big_w, c],
                              f"{name}/rows", out.quantization)  # fmt: skip
            tiles.append(full)
        b.replace(op, b.CONCATENATION(*tiles, axis=1))


def _resize_limit(op_type: str) -> int:
    return int(capability("edgetpu")["ops"][op_type].get("max_output_plane", 1 << 30))


# -- detection heads (YOLOv5/v8 exports) -----------------------------------------------------------
def _resize_version(dtype: str) -> int:
    """TFLite's version of RESIZE_NEAREST_NEIGHBOR without half_pixel_centers/align_corners
    (op_version.cc: 4 for int16, 2 for int8, else 1)."""
    return {"INT16": 4, "INT8": 2}.get(dtype, 1)


class DropHalfPixelCentersFromNearestResize(Rule):
    """RESIZE_NEAREST_NEIGHBOR(x, half_pixel_centers=True), integer factors  =>
    RESIZE_NEAREST_NEIGHBOR(x, half_pixel_centers=False) (op version 3 => 1, int8 2).

    For an output index o = k f + r (0 <= r < f, f = out/in an integer) the source row is
    floor((o + 0.5) / f) = k with half-pixel centers and floor(o / f) = k without: the same
    pixel, so the same values in float and int8. litert-torch writes every nearest upsample this
    way (PyTorch's convention). Compiler 16 maps version 3 (its logs on YOLOv5 exports, the
    compiled YOLOv8 pairs); 14.1 and 15.0 reject it as "Operation version not supported" (gh206,
    gh420), so the rewrite costs nothing on 16 and keeps the model mappable by older compilers.
    """

    quantized_ok = True
    int8_error_steps = 0  # the same pixels are copied

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.RESIZE_NEAREST_NEIGHBOR(p.x, p.const("size"))

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | None:
        op = m.root
        if not op.options.get("half_pixel_centers"):
            return NotApplicable("no half_pixel_centers")
        if op.options.get("align_corners"):
            return refuse("align_corners with half_pixel_centers picks other pixels")
        if len(x.shape) != 4 or len(op.output.shape) != 4:
            return refuse(f"input {list(x.shape)} is not an NHWC image")
        (_, h, w, _), (_, big_h, big_w, _) = x.shape, op.output.shape
        if min(h, w) < 1 or big_h % h or big_w % w:
            return refuse(f"{h}x{w} -> {big_h}x{big_w} is not an integer upscale")
        return None

    def rewrite(self, m: Match, *, x: Tensor) -> None:
        op = m.root
        op.options = {**op.options, "half_pixel_centers": False}
        op.version = _resize_version(x.dtype)


_NCHW_FROM_NHWC = [0, 3, 1, 2]


def _flattened_nchw(graph: Graph, t: Tensor | None) -> tuple[Tensor, Quantization | None] | None:
    """(x, q) when `t` = [QUANTIZE to q](RESHAPE(TRANSPOSE(x [1, H, W, C], [0, 3, 1, 2]),
    [1, C, H*W])), each step read only there and the layout steps keeping x's quantization
    (litert-quantizer puts a requantizing QUANTIZE before a join); else None."""
    if t is None:
        return None
    requant = None
    op = t.producer
    if op is not None and op.type == "QUANTIZE" and single_reader(graph, t):
        src = op.inputs[0]
        if not (t.is_quantized and src is not None and src.is_quantized):
            return None
        requant, t = t.quantization, src
        op = t.producer
    if op is None or op.type != "RESHAPE" or not single_reader(graph, t):
        return None
    mid = op.inputs[0]
    transpose = mid.producer if mid is not None else None
    if mid is None or transpose is None or transpose.type != "TRANSPOSE":
        return None
    if not single_reader(graph, mid):
        return None
    perm = transpose.inputs[1]
    if perm is None or not perm.is_constant:
        return None
    x = transpose.input(0)  # TRANSPOSE(x, perm)
    if [int(v) for v in np.asarray(perm.data).reshape(-1)] != _NCHW_FROM_NHWC:
        return None
    if len(x.shape) != 4 or x.shape[0] != 1:
        return None
    _, h, w, c = x.shape
    if t.shape != (1, c, h * w):
        return None
    for q in (mid.quantization, t.quantization):
        if x.is_quantized and (q is None or not q.same_as(x.quantization)):
            return None
    return x, requant


class ConcatFlattenedMapsInNHWC(Rule):
    """CONCATENATION_2(RESHAPE(TRANSPOSE(x_i, [0,3,1,2]), [1, C, H_i W_i]) ...)  =>
    TRANSPOSE(CONCATENATION_1(RESHAPE(x_i, [1, H_i W_i, C]) ...), [0, 2, 1]).
    (A requantizing QUANTIZE between an input's RESHAPE and the join moves along.)

    The detection head of YOLOv5/v8 exports flattens each feature map [1, H, W, C] to channels-
    first [1, C, H W] and joins the scales along the anchors. Flattening in NHWC order is a plain
    reshape (no data moves), and one TRANSPOSE after the join gives the same [1, C, N] tensor:
    element (c, offset_i + h W_i + w) is x_i[h, w, c] either way. Pure data movement, so exact
    in float and int8 (the join's requantization is element-wise and unchanged). Three layout
    TRANSPOSEs of whole feature maps become one.

    The one TRANSPOSE is larger than each of the three, and the compiler's TRANSPOSE limit is the
    tensor's element count (edgetpu.toml); the NHWC rows [1, H W, C] and the join may also exceed
    its two-innermost-dimensions limit. So the rewrite is refused unless every op it writes maps:
    it never trades a refused op for another, nor moves the cut earlier (on a 640-pixel YOLOv8n
    the joined [1, 8400, 144] TRANSPOSE holds 1.2 million elements; only small inputs qualify).
    """

    quantized_ok = True
    int8_error_steps = 0  # data movement only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.CONCATENATION()

    def _maps(self, m: Match) -> list[tuple[Tensor, Quantization | None]] | Refusal:
        op = m.root
        out = op.output
        if len(out.shape) != 3 or int(op.options.get("axis", 0)) % 3 != 2:
            return NotApplicable("not a join along the last axis of a 3-D tensor")
        if op.fused_activation != "NONE":
            return refuse("the join has a fused activation")
        found = [_flattened_nchw(m.graph, t) for t in op.inputs]
        maps = [x for x in found if x is not None]
        if len(maps) != len(found):
            return NotApplicable("not every input is an NHWC map flattened channels-first")
        if len({x.shape[3] for x, _ in maps}) != 1:
            return refuse("the maps have different channel counts")
        refusal = self._refused_by_the_compiler(maps, out)
        return refuse(refusal) if refusal else maps

    @staticmethod
    def _refused_by_the_compiler(maps: list[tuple[Tensor, Quantization | None]], out: Tensor):
        """Why an op the rewrite would write stays on the CPU (edgetpu.toml), or None."""
        c = maps[0][0].shape[3]
        rows = []
        for x, _ in maps:
            row = (1, x.shape[1] * x.shape[2], c)
            why = _refusal_of("RESHAPE", [x], row, consts=[np.array(row, np.int32)])
            if why:
                return f"its NHWC rows would stay on the CPU: {why}"
            rows.append(Tensor("row", row, x.dtype))
        joined = (1, sum(r.shape[1] for r in rows), c)
        why = _refusal_of("CONCATENATION", rows, joined, {"axis": 1})
        if why:
            return f"its join would stay on the CPU: {why}"
        why = _refusal_of("TRANSPOSE", [Tensor("j", joined, out.dtype)], out.shape,
                          consts=[np.array([0, 2, 1], np.int32)])  # fmt: skip
        return f"its one TRANSPOSE would stay on the CPU: {why}" if why else None

    @_gated
    def check(self, m: Match) -> Refusal | list[tuple[Tensor, Quantization | None]]:
        """A refusal, or each input's map and requantization (the plan)."""
        return self._maps(m)

    def rewrite(self, m: Match, *, plan: list[tuple[Tensor, Quantization | None]]) -> None:
        out, b = m.root.output, m.builder()
        rows = []
        for i, (x, requant) in enumerate(plan):
            shape = (1, x.shape[1] * x.shape[2], x.shape[3])
            row = b.RESHAPE(x, b.ints(shape, f"nhwc{i}/shape"), name=f"nhwc{i}", like=x)
            if requant is not None:  # the same requantization, on the NHWC rows
                row = b.QUANTIZE(row, name=f"nhwc{i}/requantized", quant=requant)
            rows.append(row)
        joined = b.CONCATENATION(*rows, name="nhwc", like=out, axis=1)
        b.replace(m.root, b.TRANSPOSE(joined, b.ints([0, 2, 1], "perm")))


# -- data movement over the compiler's limits ------------------------------------------------------
def _transpose_limit() -> int:
    return int(capability("edgetpu")["ops"]["TRANSPOSE"]["max_elements"])


def _pieces(length: int, count: int) -> list[int]:
    """`length` cut into `count` consecutive pieces whose sizes differ by at most one."""
    base, extra = divmod(length, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def transpose_split(
    shape: tuple[int, ...], perm: list[int], out_shape: tuple[int, ...], dtype: str
) -> tuple[int, list[int]] | Refusal:
    """SplitOversizedTranspose's plan from shapes alone: (the axis cut, the pieces' sizes), or
    why no cut maps (every piece TRANSPOSE and their CONCATENATION asked of the op table)."""
    limit, size = _transpose_limit(), int(np.prod(shape, dtype=np.int64))
    plans = []
    for axis, length in enumerate(shape):
        per_row = size // length
        if length < 2 or per_row > limit:
            continue
        plans.append((math.ceil(length / (limit // per_row)), axis))
    if not plans:
        return refuse(f"no axis of {list(shape)} cuts it into pieces of at most {limit}")
    count, axis = min(plans)
    sizes = _pieces(shape[axis], count)
    j = perm.index(axis)
    for piece_len in sorted(set(sizes)):
        piece = tuple(piece_len if i == axis else d for i, d in enumerate(shape))
        moved = tuple(piece[i] for i in perm)
        why = _refusal_of("TRANSPOSE", [Tensor("p", piece, dtype)], moved,
                          consts=[np.array(perm, np.int32)])  # fmt: skip
        if why:
            return refuse(f"a piece would stay on the CPU: {why}")
    moved_t = [Tensor("m", tuple(s if i == j else d for i, d in enumerate(out_shape)), dtype)
               for s in sorted(set(sizes))]  # fmt: skip
    why = _refusal_of("CONCATENATION", moved_t, out_shape, {"axis": j})
    if why:
        return refuse(f"the transposed tensor itself stays on the CPU: {why}")
    return axis, sizes


class SplitOversizedTranspose(Rule):
    """TRANSPOSE(x, perm) over the compiler's element limit  =>
    CONCATENATION_j(TRANSPOSE(SLICE_a(x, piece_i), perm) ...), j the axis with perm[j] = a.

    Consecutive slices of x along axis a, each transposed, are consecutive slices of the output
    along the axis a lands on: out[.., i_j, ..] = x[.., i_a = i_j, ..]. Pure data movement, so
    bit-exact; it runs on the int8 graph (the quantized stage), where every piece keeps x's
    quantization (a float graph quantized afterwards could give each piece its own scale).

    The compiler's TRANSPOSE limit is the element count of the tensor it moves (edgetpu.toml:
    69696 seen mapped, 102400 refused), so the pieces stay under the largest seen mapped; the
    axis cut into the fewest pieces is chosen. Refused unless every op it writes maps (a result
    whose two innermost dimensions are over the limit stays on the CPU however it is cut) and
    unless its input comes from the Edge TPU segment (after the cut the pieces would only add CPU
    work). YOLOv8 heads at 256 pixels: the [1, 32, 32, 80] class-score map and the
    [1, 4, 16, 1344] DFL transposes; at 640 the 40x40 and 80x80 feature maps.
    """

    quantized_ok = True
    int8_error_steps = 0  # data movement only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.TRANSPOSE(p.x, p.const("permutation"))

    def _plan(self, m: Match, x: Tensor, permutation: Tensor) -> tuple[int, list[int]] | Refusal:
        out = m.root.output
        if x.size <= _transpose_limit():
            return NotApplicable("the transpose is within the limit")
        perm = [int(v) % len(x.shape) for v in np.asarray(permutation.data).reshape(-1)]
        kind = _kind(x)
        if kind == "float":  # quantizing the pieces separately could give each its own scale
            return NotApplicable("float graph: split after quantization, one scale for all pieces")
        if kind is None:
            return refuse(f"TRANSPOSE on {x.dtype} with per-channel or no quantization")
        if not (out.is_quantized and _same_scale(out, x)):
            return refuse("the transpose requantizes")
        return transpose_split(tuple(x.shape), perm, tuple(out.shape), x.dtype)

    @_gated
    def check(self, m: Match, *, x: Tensor, permutation: Tensor) -> Refusal | tuple[int, list[int]]:
        """A refusal, or the axis to cut and the sizes of the pieces (the plan)."""
        return self._plan(m, x, permutation)

    def rewrite(
        self, m: Match, *, x: Tensor, permutation: Tensor, plan: tuple[int, list[int]]
    ) -> None:
        axis, sizes = plan
        perm = [int(v) % len(x.shape) for v in np.asarray(permutation.data).reshape(-1)]
        b = m.builder()
        pieces, start = [], 0
        for i, size in enumerate(sizes):
            begin = [start if k == axis else 0 for k in range(len(x.shape))]
            shape = [size if k == axis else d for k, d in enumerate(x.shape)]
            part = _slice(b, x, begin, shape, f"piece{i}", x.quantization)
            order = b.ints(perm, f"piece{i}/perm")
            pieces.append(b.TRANSPOSE(part, order, name=f"piece{i}/moved",
                                      quant=m.root.output.quantization))  # fmt: skip
            start += size
        b.replace(m.root, b.CONCATENATION(*pieces, axis=perm.index(axis)))


# -- fusions the compiler would refuse -------------------------------------------------------------
def fused_activation_refusal(op_type: str, activation: str) -> Refusal | None:
    """Why fusing `activation` into an `op_type` op would cost the Edge TPU that op, or None.

    The answer is the op's row in `delegates/edgetpu.toml` (`fused_activations`, else the table's
    `default_fused_activations`): a pool row allows only NONE, so MAX_POOL_2D + RELU stays two
    ops, both mapped, instead of one fused pool the compiler leaves on the CPU. An op outside the
    table runs on the CPU either way: no objection then.
    """
    table = capability("edgetpu")
    row = table["ops"].get(op_type)
    if row is None:
        return None
    allowed = row.get("fused_activations", table["meta"]["default_fused_activations"])
    if activation in allowed:
        return None
    return refuse(
        f"the Edge TPU maps {op_type} only with fused activation {', '.join(allowed)}: "
        f"{activation} stays a separate op (delegates/edgetpu.toml)"
    )


EDGETPU_LEGALIZATION: tuple[Rule | Pass, ...] = (
    LegalizeLeakyRelu(),
    LegalizeRelu0To1(),
    LegalizeHardSwish(),
    LegalizeGelu(),
    MeanToAveragePool(),
    SplitOversizedAveragePool(),
    SplitOversizedResize(),
    DropHalfPixelCentersFromNearestResize(),
    ConcatFlattenedMapsInNHWC(),
    SplitOversizedTranspose(),
)
