"""Edge TPU legalization: a row normalization (LayerNorm's, RMSNorm's) normalized twice, so that
int8 reads its variance over a narrow range.

Why. A LayerNorm divides the centred rows c by rsqrt(mean(c^2) + eps). Quantized with ranges
calibrated over every row, the square c^2 and its row mean are int8 over [0, the largest seen]:
in MobileViT-XXS (`benchmarks/FLOAT_ISLANDS.md`) the square over [0, 152] (step 0.6; the median
square is 0.04) and the variance over [0, 16] (step 0.062; the median variance is 0.075), so
RSQRT reads one or two codes, and 40% of the int8 model's error against the float model is that
variance's rounding. The rows' variances differ by orders of magnitude; no single int8 range
serves them all.

The form. Keep the normalization as written (the first, coarse in int8), and normalize its output
once more:

    c1 = c * r1                         r1 = rsqrt(mean(c^2) + eps): as written
    y  = c1 * rsqrt(mean(c1^2 + eps r1^2))

In float the second factor is 1 for any r1 > 0: mean(c1^2) + eps r1^2 = r1^2 (mean(c^2) + eps),
so y = c r1 / (r1 sqrt(mean(c^2) + eps)) = c / sqrt(mean(c^2) + eps): the same function (float
round-off of the extra products). In int8 the second variance is near 1 on every row, whatever
the row's own variance was: the rounding of the first is what it measures, and it is read over
[0, `SECOND_VARIANCE_MAX`], where a variance of 1 is 64 codes (against one or two).

Ranges. Calibration runs the float model, where the second variance is 1 and its rsqrt 1 on
every row: calibrated, both would be int8 over [0, 1], and an int8 first factor that is off by
more would saturate them. So the rule records a range on those two float tensors (a
`Quantization` with only min/max: a range hint), which quantization takes as the least range
(`tflfuse.quantize.range_hints`): the second variance over [0, 4] (the first factor within a
factor of 2 of the exact one), its rsqrt over [0, 2]. The squares c1^2 keep their calibrated
range (that of y^2): the row mean averages their rounding over the row's length.

int8 bound. Against the exact normalization of the int8 first output c1 itself (whatever the
first factor's error): the second variance is within D = (s_sq + s_add + s_e + s_v) / 2 of
mean(c1^2) + eps r1^2 (the roundings of the squares, of the eps ADD, of eps r1^2 and of the
mean, half a step each; a mean of roundings is within the largest), the second factor within
|rsqrt(v +- D) - rsqrt(v)| and one step of its own, the output within one step of c1 times it
(tests/test_edgetpu_renorm.py checks each). Where the first factor is off by more than 2x (the
second variance outside [0, 4], its rsqrt over 2), the second factor saturates at its range's
end: the row moves toward the exact one, not all the way. Against the float model, what is left
is c1's rounding and the rows' own (x - mean) rounding before any normalization.

Matched by arithmetic, not by names: MUL(c, r) with r = RSQRT(ADD(v, eps)) or DIV(1, SQRT(ADD(v,
eps))) (onnx2tf's, before `ReciprocalSqrtAsRsqrt`), v = MEAN over the innermost axis (keeping
dims) of MUL(c, c) or of SQUARED_DIFFERENCE(a, b) with c = SUB(a, b) or SUB(b, a), r one value
per row of c (a DIV(1, SQRT) is written as RSQRT, the form compiled models show mapped). A
normalization already rewritten (c1 squared, r1 read twice) is left alone; one whose rows
are computed after the Edge TPU segment's cut is refused (it would only add CPU work).
The new per-row ops compute on the column; `ReplicateRowMean` then writes both means as 1x1
convolutions and every op of the form is an elementwise op of two tensors of one shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tflfuse.ir import Op, Quantization, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, Value, common, refuse
from tflfuse.rewrite.common import NotApplicable, is_float
from tflfuse.targets.edgetpu.predict import cut_origins
from tflfuse.targets.edgetpu.rowmean import is_row_mean
from tflfuse.targets.edgetpu.rules import lifted_once_quantized

SECOND_VARIANCE_MAX = 4.0  # the first factor within 2x of the exact one
SECOND_RSQRT_MAX = 2.0  # 1 / sqrt(1/4)


@dataclass
class Normalization:
    """What `match` found: c (the rows), r (the first factor), eps, and the ops between them
    that only the normalization reads."""

    c: Tensor
    r: Tensor
    eps: float
    inner: list[Op]


def _square_of(s: Tensor, c: Tensor) -> bool:
    """s = c^2: MUL(c, c), or SQUARED_DIFFERENCE(a, b) where c = SUB(a, b) or SUB(b, a)."""
    op = s.producer
    if op is None or len(op.inputs) != 2 or op.fused_activation != "NONE":
        return False
    a, b = op.input(0), op.input(1)
    if op.type == "MUL":
        return a is c and b is c
    if op.type != "SQUARED_DIFFERENCE":
        return False
    sub = c.producer
    if sub is None or sub.type != "SUB" or sub.fused_activation != "NONE":
        return False
    return {id(sub.input(0)), id(sub.input(1))} == {id(a), id(b)} and a is not b


def _factor(r: Tensor) -> tuple[Tensor, list[Op]] | None:
    """(the ADD(v, eps) r is the reciprocal square root of, the ops that compute r from it)."""
    op = r.producer
    if op is not None and op.type == "RSQRT":
        return op.input(0), [op]
    if op is None or op.type != "DIV" or op.fused_activation != "NONE":
        return None
    one, sqrt = op.input(0), op.input(1).producer
    if common.scalar_value(one) != 1.0 or sqrt is None or sqrt.type != "SQRT":
        return None
    return sqrt.input(0), [op, sqrt]


def _per_row(r: Tensor, c: Tensor) -> bool:
    return len(c.shape) >= 2 and tuple(r.shape) == (*c.shape[:-1], 1)


def match(root: Op) -> Normalization | None:
    """c * r with r = 1 / sqrt(mean(c^2, innermost) + eps), or None (the module docstring)."""
    if root.type != "MUL" or len(root.inputs) != 2:
        return None
    for c, r in ((root.input(0), root.input(1)), (root.input(1), root.input(0))):
        if c is r or not _per_row(r, c):
            continue
        found = _factor(r)
        if found is None:
            continue
        shifted, rs = found
        add = shifted.producer
        if add is None or add.type != "ADD" or add.fused_activation != "NONE":
            continue
        v = next((t for t in add.inputs if t is not None and not t.is_constant), None)
        k = next((t for t in add.inputs if t is not None and t.is_constant), None)
        eps = common.scalar_value(k)
        mean = v.producer if v is not None else None
        if eps is None or eps < 0 or mean is None or mean.type != "MEAN":
            continue
        s = mean.input(0)
        if not is_row_mean(s, mean) or not _square_of(s, c):
            continue
        return Normalization(c, r, float(eps), [mean, add, *rs])
    return None


def _hint(lo: float, hi: float) -> Quantization:
    """A range for a float tensor, taken by quantization as its least range."""
    return Quantization(min=np.array([lo], np.float32), max=np.array([hi], np.float32))


class NormalizeTwice(Rule):
    """float: c * rsqrt(mean(c^2) + eps)  =>  c1 * rsqrt(mean(c1^2 + eps r1^2)), c1 = c r1,
    r1 = rsqrt(mean(c^2) + eps) as written (the module docstring). Equal in float for any r1 > 0
    (round-off of the extra products); in int8 the second variance is read near 1 over a
    narrow range, where the first was read over every row's range."""

    int8_error_steps = 2  # float-only; y rounds twice (c1, y): the module's int8 bound

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MUL(p.a, p.b)

    def check(self, m: Match) -> Refusal | Normalization:
        """A refusal, or what was found (the plan)."""
        found = match(m.root)
        if found is None:
            return NotApplicable("not a normalization c * rsqrt(mean(c^2) + eps)")
        if not (is_float(found.c) and is_float(found.r) and is_float(m.root.output)):
            return NotApplicable("not float")
        if tuple(m.root.output.shape) != tuple(found.c.shape):
            return refuse("the product is broadcast beyond the rows")
        y = m.root.output
        if any(op.type == "MUL" and op.input(0) is y and op.input(1) is y for op in y.consumers):
            return NotApplicable("its output is squared again: normalized twice already")
        inner = [op.output for op in found.inner] + [found.r]
        if any(len(t.consumers) != 1 or m.graph.is_graph_output(t) for t in inner):
            return NotApplicable("the variance or its factor is read elsewhere (normalized twice?)")
        # the rows' own cut only: onnx2tf's SQRT is off the table until the rule writes RSQRT
        origins = cut_origins(m.graph, lifted=lambda op: lifted_once_quantized(op, m.graph))
        if id(found.c) in origins:
            cut = m.graph.ops[origins[id(found.c)]]
            return refuse(
                f"its rows are computed on the CPU after the Edge TPU segment (cut at {cut.type}):"
                " normalized twice, they would still run on the CPU, in more ops"
            )
        return found

    def rewrite(self, m: Match, *, plan: Normalization) -> None:
        c = plan.c
        b = m.builder()
        r1: Tensor | Value = plan.r
        if plan.r.producer is not None and plan.r.producer.type == "DIV":  # 1 / SQRT(v + eps), once
            r1 = b.RSQRT(plan.inner[1].output, name="factor", like=plan.r)
        c1 = b.MUL(c, r1, name="once", like=c)
        squares = b.MUL(c1, c1, name="once_squared", like=c)
        if plan.eps > 0:
            r1_squared = b.MUL(r1, r1, name="factor_squared", like=r1)
            eps = b.MUL(r1_squared, b.scalar(plan.eps, "eps", like=r1), name="eps_scaled", like=r1)
            squares = b.ADD(squares, eps, name="once_squared_eps", like=c)
        axis = b.ints([len(c.shape) - 1], "axis")
        column = (*c.shape[:-1], 1)
        v2 = b.MEAN(squares, axis, name="second_variance", shape=column, like=r1, keep_dims=True,
                    quant=_hint(0.0, SECOND_VARIANCE_MAX))  # fmt: skip
        r2 = b.RSQRT(v2, name="second_factor", like=r1, quant=_hint(0.0, SECOND_RSQRT_MAX))
        root = m.root
        b.replace(root, b.MUL(c1, r2, fused_activation_function=root.fused_activation))


RENORM_LEGALIZATION: tuple[Rule, ...] = (NormalizeTwice(),)
