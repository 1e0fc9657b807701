"""Edge TPU legalization: head RESHAPE / TRANSPOSE / SOFTMAX cut into pieces compiled models show.

Attention blocks (YOLO11's and YOLO26's C2PSA) and detection heads (the DFL) split and merge
heads with RESHAPEs and TRANSPOSEs, and normalize scores with SOFTMAX, in forms or at sizes the
compiler's table accepts but no compiled model shows mapped (`delegates/edgetpu_forms.toml`):
a RESHAPE [1, 256, 10, 10] -> [1, 2, 128, 100] ("nt=3>3", seen mapped with at most 10200 elements
in its two innermost dimensions, 12800 here); a per-head TRANSPOSE "perm=021" or an NCHW -> NHWC
"perm=120" (never seen mapped: only "perm=10" up to 4096 elements and "perm=201" up to 57600 /
2880 innermost are); a SOFTMAX over more rows than seen. The forms gate predicts them undecided,
and a one-segment compile stops at the first.

Each is pure data movement (SOFTMAX: each row on its own), so it can be cut into pieces along
axes it moves whole: pieces of the input (SLICE), each moved by the same op, joined
(CONCATENATION) where the piece lands in the output. A TRANSPOSE may first merge the axes that
stay adjacent and in order (a RESHAPE before and after), which turns "perm=120" over
[C, H, W] into "perm=10" over [C, H W]; a RESHAPE is cut in blocks along its outermost axis
that are whole rows of both its input and its output. The plan with the fewest ops whose every
op is shown mapped at its size (table and forms evidence; a gated form must be "mapped") is
taken, or the rule does not fire.

int8 only (the quantized stage): every piece keeps the tensor's quantization, so the pieces copy
codes (SOFTMAX: the same kernel on the same rows): bit-identical. Only ops the op table maps and
the forms evidence does not show mapped are touched (the table's own size refusals are
`SplitOversizedTranspose`'s). No TensorFlow here.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from tflfuse.ir import Op, Quantization, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, Value, refuse
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets.edgetpu.forms import form_of, gate, gated
from tflfuse.targets.edgetpu.heads import form_verdict
from tflfuse.targets.edgetpu.predict import edgetpu_shape_refusal
from tflfuse.targets.edgetpu.rules import _gated, _kind, _pieces, _refusal_of, _slice

MOST_PIECES = 64  # more would spell one op in hundreds


# -- whether an op the rule would write is shown mapped -------------------------------------------
@functools.lru_cache(maxsize=65536)
def _off(op_type: str, shapes: tuple, dtype: str, out_shape: tuple, extra) -> str | None:
    """Why an `op_type` op reading tensors of `shapes` (plus the constant `extra`: a perm or a
    shape, or None) and writing `out_shape` would not be shown mapped: the op table's refusal,
    or, for a gated form, the forms gate's answer when it is not "mapped"."""
    ins = [Tensor(f"in{i}", s, dtype) for i, s in enumerate(shapes)]
    consts = [] if extra is None else [np.asarray(extra, np.int32)]
    options = {"axis": extra[0]} if op_type == "CONCATENATION" else {}
    consts = [] if op_type == "CONCATENATION" else consts
    why = _refusal_of(op_type, ins, out_shape, options, consts)
    if why:
        return why
    verdict = form_verdict(op_type, ins, out_shape, options, consts)
    if gated(verdict.form) and verdict.answer != "mapped":
        return f"{verdict.answer}: {verdict.reason}"
    return None


def _shown_mapped(op: Op) -> bool:
    """Whether `op`'s gated form (if it has one) is shown mapped at its size."""
    return not gated(form_of(op)) or gate(op).answer == "mapped"


def _undecided(op: Op) -> Refusal | None:
    """NotApplicable unless the op table maps `op` and the forms evidence does not show it."""
    if edgetpu_shape_refusal(op) is not None:
        return NotApplicable("the op table refuses it (SplitOversizedTranspose's case)")
    if _shown_mapped(op):
        return NotApplicable("its form is shown mapped at its size")
    return None


def every_op_shown_mapped(ops: Sequence[Op]) -> bool:
    """Whether the op table maps every op of `ops` and each gated form is shown mapped at its
    size (a chain the Edge TPU keeps as written: `Target.layout_chain_kept`)."""
    return all(edgetpu_shape_refusal(op) is None and _shown_mapped(op) for op in ops)


def _int8_refusal(x: Tensor, out: Tensor, same_q: bool = True) -> Refusal | None:
    kind = _kind(x)
    if kind == "float":
        return NotApplicable("float graph: cut after quantization, one scale for all pieces")
    if kind is None or _kind(out) != "int":
        return refuse(f"{x.dtype} with per-channel or no quantization")
    if same_q and not cast(Quantization, out.quantization).same_as(x.quantization):  # (int8)
        return refuse("the op requantizes")
    return None


# -- a plan: pieces of a base tensor, each moved by one op, joined --------------------------------
@dataclass(frozen=True)
class CutPlan:
    """`base`: x's shape as the pieces are cut from it (x reshaped to it first when it differs);
    `perm`: the TRANSPOSE's permutation of `base` (None: SOFTMAX, the identity); `cuts`: per cut
    axis of `base` (outermost join first) the piece sizes; `moved`: the shape the joined pieces
    make (reshaped to the op's output when it differs)."""

    base: tuple[int, ...]
    perm: tuple[int, ...] | None
    cuts: tuple[tuple[int, tuple[int, ...]], ...]
    moved: tuple[int, ...]

    @property
    def pieces(self) -> int:
        return math.prod(len(sizes) for _, sizes in self.cuts)

    def out_axis(self, axis: int) -> int:
        return axis if self.perm is None else self.perm.index(axis)

    def moved_shape(self, piece: tuple[int, ...]) -> tuple[int, ...]:
        return piece if self.perm is None else tuple(piece[p] for p in self.perm)

    def ops(self, x: Tensor, out: Tensor) -> int:
        joins = sum(math.prod(len(s) for _, s in self.cuts[:i]) for i in range(len(self.cuts)))
        slices = self.pieces if self.pieces > 1 else 0
        reshapes = (self.base != tuple(x.shape)) + (self.moved != tuple(out.shape))
        return reshapes + slices + self.pieces + joins


def piece_op(plan: CutPlan, op_type: str, piece: tuple[int, ...]) -> tuple[str, tuple | None]:
    """The op that moves one piece and its constant: a TRANSPOSE that keeps the piece's
    non-trivial axes in order moves no byte, so it is the RESHAPE to its result."""
    if plan.perm is None:
        return op_type, None
    order = [p for p in plan.perm if piece[p] > 1]
    if order == sorted(order):
        return "RESHAPE", plan.moved_shape(piece)
    return op_type, plan.perm


def _piece_shapes(plan: CutPlan) -> set[tuple[int, ...]]:
    axes = {a: set(sizes) for a, sizes in plan.cuts}
    choices = [sorted(axes.get(i, {d})) for i, d in enumerate(plan.base)]
    return set(itertools.product(*choices))


def _join_shapes(plan: CutPlan) -> list[tuple[list[tuple[int, ...]], tuple[int, ...], int]]:
    """(input shapes, output shape, axis) of each distinct join, innermost level first."""
    joins = []
    for level in range(len(plan.cuts) - 1, -1, -1):
        axis, sizes = plan.cuts[level]
        inner = {a: set(s) for a, s in plan.cuts[:level]}
        choices = [sorted(inner.get(i, {d})) for i, d in enumerate(plan.base)]
        for lead in itertools.product(*choices):
            parts = [plan.moved_shape(tuple(s if i == axis else d for i, d in enumerate(lead)))
                     for s in sizes]  # fmt: skip
            joins.append((parts, plan.moved_shape(lead), plan.out_axis(axis)))
    return joins


def plan_refusal(plan: CutPlan, op_type: str, x: Tensor, out: Tensor) -> str | None:
    """Why some op `plan` writes would not be shown mapped, or None."""
    dt = x.dtype
    # (op type, input shapes, output shape, the constant it needs: a shape, an axis; or None)
    asks: list[tuple[str, tuple[tuple[int, ...], ...], tuple[int, ...], tuple[int, ...] | None]]
    asks = []
    if plan.base != tuple(x.shape):
        asks.append(("RESHAPE", (tuple(x.shape),), plan.base, plan.base))
    for piece in sorted(_piece_shapes(plan)):
        if plan.pieces > 1:
            asks.append(("SLICE", (plan.base,), piece, None))
        kind, extra = piece_op(plan, op_type, piece)
        asks.append((kind, (piece,), plan.moved_shape(piece), extra))
    for parts, shape, axis in _join_shapes(plan):
        if len(parts) > 1:
            asks.append(("CONCATENATION", tuple(parts), shape, (axis,)))
    if plan.moved != tuple(out.shape):
        asks.append(("RESHAPE", (plan.moved,), tuple(out.shape), tuple(out.shape)))
    for kind, shapes, shape, ext in asks:
        why = _off(kind, shapes, dt, tuple(shape), ext)
        if why:
            return f"its {kind} would not be shown mapped ({why})"
    return None


@functools.lru_cache(maxsize=4096)
def _counts(length: int) -> tuple[int, ...]:
    """Piece counts giving each distinct largest piece size of an axis of `length`."""
    return tuple(sorted({math.ceil(length / s) for s in range(1, length + 1)}))


def _candidates(base: tuple[int, ...], axes: list[int]) -> list[tuple[tuple[int, int], ...]]:
    """Cuts of up to two of `axes` into (axis, count), fewest pieces first."""
    found: list[tuple[tuple[int, int], ...]] = [()]
    for a in axes:
        found += [((a, c),) for c in _counts(base[a]) if 1 < c <= MOST_PIECES]
    for a, b in itertools.combinations(axes, 2):
        for ca in _counts(base[a]):
            for cb in _counts(base[b]):
                if ca > 1 and cb > 1 and ca * cb <= MOST_PIECES:
                    found.append(((a, ca), (b, cb)))
    return sorted(found, key=lambda cut: (math.prod(c for _, c in cut), cut))


def best_plan(op_type: str, x: Tensor, out: Tensor, bases) -> CutPlan | str:
    """The plan with the fewest ops whose every op is shown mapped, over `bases`
    ((base shape, perm or None, axes that may be cut)), or why none is."""
    plans = []
    for base, perm, axes in bases:
        moved = base if perm is None else tuple(base[p] for p in perm)
        for cut in _candidates(base, [a for a in axes if base[a] > 1]):
            cuts = tuple((a, tuple(_pieces(base[a], c))) for a, c in cut)
            plans.append(CutPlan(tuple(base), perm, cuts, tuple(moved)))
    plans.sort(key=lambda p: (p.ops(x, out), p.pieces))
    last = "no piece plan"
    for plan in plans:
        why = plan_refusal(plan, op_type, x, out)
        if why is None:
            return plan
        last = why
    return f"no cut into at most {MOST_PIECES} pieces is shown mapped (e.g. {last})"


def build_plan(m: Match, plan: CutPlan, make) -> None:
    """Write `plan` in place of `m.root`: `make(b, piece, name)` moves one piece."""
    x, out = m.root.input(0), m.root.output
    b = m.builder()
    src: Tensor | Value = x
    if plan.base != tuple(x.shape):
        src = b.RESHAPE(x, b.ints(plan.base, "base/shape"), name="base", quant=x.quantization,
                        shape=plan.base)  # fmt: skip

    def level(i: int, begin: list[int], shape: list[int], name: str):
        if i == len(plan.cuts):
            part = src
            if plan.pieces > 1:
                part = _slice(b, src, begin, shape, f"{name}/in", x.quantization)
            return make(b, part, name)
        axis, sizes = plan.cuts[i]
        parts, start = [], begin[axis]
        for j, size in enumerate(sizes):
            at = [start if k == axis else v for k, v in enumerate(begin)]
            sh = [size if k == axis else v for k, v in enumerate(shape)]
            parts.append(level(i + 1, at, sh, f"{name}/p{j}"))
            start += size
        if len(parts) == 1:
            return parts[0]
        joined = plan.moved_shape(tuple(shape))
        return b.CONCATENATION(*parts, axis=plan.out_axis(axis), name=f"{name}/join",
                               shape=joined, quant=out.quantization)  # fmt: skip

    result = level(0, [0] * len(plan.base), list(plan.base), "cut")
    if plan.moved != tuple(out.shape):
        result = b.RESHAPE(result, b.ints(out.shape, "moved/shape"), name="moved",
                           quant=out.quantization, shape=tuple(out.shape))  # fmt: skip
    b.replace(m.root, result)


# -- the bases a TRANSPOSE can be cut from ---------------------------------------------------------
def _nt_adjacent(shape: tuple[int, ...], a: int, b: int) -> bool:
    return b > a and all(shape[k] == 1 for k in range(a + 1, b))


def transpose_bases(shape: tuple[int, ...], perm: list[int]):
    """x as it is, and the merged transpose when it has fewer axes."""
    bases = [(tuple(shape), tuple(perm), list(range(len(shape))))]
    keep = [a for a in perm if shape[a] > 1]
    groups: list[list[int]] = []
    for a in keep:
        if groups and _nt_adjacent(shape, groups[-1][-1], a):
            groups[-1].append(a)
        else:
            groups.append([a])
    if len(groups) < len(keep) or len(groups) < len(shape):
        order = sorted(range(len(groups)), key=lambda g: groups[g][0])
        dims = tuple(math.prod(shape[a] for a in groups[g]) for g in order)
        new_perm = tuple(order.index(g) for g in range(len(groups)))
        if len(dims) >= 2:
            bases.append((dims, new_perm, list(range(len(dims)))))
    return bases


class CutTransposeIntoShownForms(Rule):
    """int8: TRANSPOSE(x, perm), mapped by the op table but of a form or size no compiled model
    shows mapped  =>  [RESHAPE] CONCATENATION(TRANSPOSE(SLICE(x)) ...) [RESHAPE], every op of a
    form and size compiled models show mapped (the module docstring). A slice along axis a of x,
    transposed, is the slice along perm.index(a) of the output: bit-identical."""

    quantized_ok = True
    int8_error_steps = 0  # data movement only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.TRANSPOSE(p.x, p.const("permutation"))

    @_gated
    def check(self, m: Match, *, x: Tensor, permutation: Tensor) -> Refusal | CutPlan:
        """A refusal, or the pieces (the plan)."""
        out = m.root.output
        refusal = _int8_refusal(x, out) or _undecided(m.root)
        if refusal is not None:
            return refusal
        perm = [int(v) % len(x.shape) for v in np.asarray(permutation.data).reshape(-1)]
        plan = best_plan("TRANSPOSE", x, out, transpose_bases(tuple(x.shape), perm))
        return refuse(plan) if isinstance(plan, str) else plan

    def rewrite(self, m: Match, *, plan: CutPlan) -> None:
        q = m.root.output.quantization

        def make(b, part, name):
            moved = plan.moved_shape(tuple(part.shape))
            kind, extra = piece_op(plan, "TRANSPOSE", tuple(part.shape))
            return b.op(kind, part, b.ints(extra, f"{name}/{kind.lower()}"), name=name, quant=q,
                        shape=moved)  # fmt: skip

        build_plan(m, plan, make)


class CutSoftmaxIntoShownRows(Rule):
    """int8: SOFTMAX(x) over more rows than compiled models show mapped  =>
    CONCATENATION(SOFTMAX(SLICE(x)) ...) cut along the rows (any axis but the last): each row is
    normalized on its own, by the same kernel with the same parameters: bit-identical."""

    quantized_ok = True
    int8_error_steps = 0  # the same kernel on the same rows

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.SOFTMAX(p.x)

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | CutPlan:
        """A refusal, or the pieces (the plan)."""
        out = m.root.output
        refusal = _int8_refusal(x, out, same_q=False) or _undecided(m.root)
        if refusal is not None:
            return refusal
        rows = list(range(len(x.shape) - 1))
        plan = best_plan("SOFTMAX", x, out, [(tuple(x.shape), None, rows)])
        return refuse(plan) if isinstance(plan, str) else plan

    def rewrite(self, m: Match, *, plan: CutPlan) -> None:
        q, options = m.root.output.quantization, dict(m.root.options)

        def make(b, part, name):
            return b.SOFTMAX(part, name=name, quant=q, shape=tuple(part.shape), options=options)

        build_plan(m, plan, make)


# -- a RESHAPE in blocks of whole rows -------------------------------------------------------------
def _lead(shape: tuple[int, ...]) -> int:
    return next((i for i, d in enumerate(shape) if d > 1), 0)


@dataclass(frozen=True)
class ReshapePlan:
    """`count` pieces of x along its axis `axis_in`, each reshaped and joined along the output's
    axis `axis_out`."""

    axis_in: int
    axis_out: int
    rows_in: tuple[int, ...]
    rows_out: tuple[int, ...]


def reshape_plan(src: tuple[int, ...], dst: tuple[int, ...], dtype: str) -> ReshapePlan | str:
    """Blocks of the flat data that are whole rows of both shapes' outermost non-trivial axis,
    the fewest pieces whose ops are all shown mapped."""
    i0, o0 = _lead(src), _lead(dst)
    s_in, s_out = math.prod(src[i0 + 1 :]), math.prod(dst[o0 + 1 :])
    block = math.lcm(s_in, s_out)
    blocks = math.prod(src) // block
    last = "the data is one block of whole rows"
    for count in range(2, min(blocks, MOST_PIECES) + 1):
        if blocks % count:
            continue
        per = blocks // count * block
        piece_in = tuple(per // s_in if i == i0 else d for i, d in enumerate(src))
        piece_out = tuple(per // s_out if i == o0 else d for i, d in enumerate(dst))
        why = (
            _off("SLICE", (src,), dtype, piece_in, None)
            or _off("RESHAPE", (piece_in,), dtype, piece_out, piece_out)
            or _off("CONCATENATION", (piece_out,) * count, dtype, dst, (o0,))
        )
        if why is None:
            return ReshapePlan(i0, o0, (piece_in[i0],) * count, (piece_out[o0],) * count)
        last = why
    return f"no cut into blocks of whole rows is shown mapped ({last})"


class CutReshapeIntoShownBlocks(Rule):
    """int8: RESHAPE(x) of 2+ non-trivial dims each way (a head split or merge) that the op table
    maps but no compiled model shows mapped at its size  =>  CONCATENATION(RESHAPE(SLICE(x)) ...):
    blocks of the flat data that are whole rows of x's outermost axis and of the output's, so
    each is a slice of x and a slice of the output: bit-identical."""

    quantized_ok = True
    int8_error_steps = 0  # data movement only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.RESHAPE(p.x, ...)

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | ReshapePlan:
        """A refusal, or the blocks (the plan)."""
        out = m.root.output
        refusal = _int8_refusal(x, out) or _undecided(m.root)
        if refusal is not None:
            return refusal
        plan = reshape_plan(tuple(x.shape), tuple(out.shape), x.dtype)
        return refuse(plan) if isinstance(plan, str) else plan

    def rewrite(self, m: Match, *, x: Tensor, plan: ReshapePlan) -> None:
        out = m.root.output
        b = m.builder()
        parts, start = [], 0
        for j, (rin, rout) in enumerate(zip(plan.rows_in, plan.rows_out)):
            begin = [start if k == plan.axis_in else 0 for k in range(len(x.shape))]
            size = [rin if k == plan.axis_in else d for k, d in enumerate(x.shape)]
            part = _slice(b, x, begin, size, f"block{j}/in", x.quantization)
            shape = tuple(rout if k == plan.axis_out else d for k, d in enumerate(out.shape))
            parts.append(b.RESHAPE(part, b.ints(shape, f"block{j}/shape"), name=f"block{j}",
                                   quant=out.quantization, shape=shape))  # fmt: skip
            start += rin
        b.replace(m.root, b.CONCATENATION(*parts, axis=plan.axis_out, shape=tuple(out.shape),
                                          quant=out.quantization))  # fmt: skip


# -- a MEAN cut along an axis it keeps -------------------------------------------------------------
@dataclass(frozen=True)
class AxisPlan:
    """x cut along its axis `axis_in` into pieces of `sizes`, each computed on its own (a MEAN
    that keeps the axis, a broadcast op whose operands both span it), joined along the output's
    axis `axis_out`."""

    axis_in: int
    axis_out: int
    sizes: tuple[int, ...]


def _reduced(shape: tuple[int, ...], axes: set[int], keep: bool) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)


def mean_plan(x: Tensor, out: Tensor, axes: set[int], keep: bool) -> AxisPlan | str:
    """The fewest pieces along one kept axis (the innermost first) whose SLICE, MEAN and
    CONCATENATION are all shown mapped at their sizes, or why none is."""
    shape, dt = tuple(x.shape), x.dtype
    kept = [a for a in range(len(shape)) if a not in axes and shape[a] > 1]
    last = "it keeps no axis longer than 1"
    axes_const = tuple(sorted(axes))
    for count in range(2, MOST_PIECES + 1):
        for axis in reversed(kept):
            if count > shape[axis]:
                continue
            sizes = tuple(_pieces(shape[axis], count))
            at = axis if keep else axis - sum(1 for a in axes if a < axis)
            parts = [tuple(n if i == axis else d for i, d in enumerate(shape)) for n in sizes]
            outs = [_reduced(p, axes, keep) for p in parts]
            why = next(
                (w for p, o in zip(parts, outs) for w in (
                    _off("SLICE", (shape,), dt, p, None), _off("MEAN", (p,), dt, o, axes_const))
                 if w),
                None,
            ) or _off("CONCATENATION", tuple(outs), dt, tuple(out.shape), (at,))  # fmt: skip
            if why is None:
                return AxisPlan(axis, at, sizes)
            last = why
    return f"no cut into at most {MOST_PIECES} pieces along a kept axis is shown mapped ({last})"


class CutMeanIntoShownPieces(Rule):
    """int8: MEAN(x, axes) of a form compiled models show mapped, but not at its size  =>
    CONCATENATION(MEAN(SLICE(x)) ...), pieces along an axis the MEAN keeps (a squeeze-excite's
    [1, 28, 28, 120] pool as two [1, 28, 28, 60] ones: shown up to [1, 7, 7, 1280]). Each output
    element averages the same inputs with the same parameters in its piece: exact in float; int8
    within one step (TFLite's int8 MEAN kernels round an element differently by channel count:
    1 step seen, [1, 28, 28, 120] against two 60-channel pieces)."""

    quantized_ok = True
    int8_error_steps = 1  # the CPU kernel's rounding differs by channel count

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MEAN(p.x, p.const("axes"))

    @_gated
    def check(self, m: Match, *, x: Tensor, axes: Tensor) -> Refusal | AxisPlan:
        """A refusal, or the pieces (the plan)."""
        out = m.root.output
        refusal = _int8_refusal(x, out, same_q=False) or _undecided(m.root)
        if refusal is not None:
            return refusal
        reduced = {int(a) % len(x.shape) for a in np.asarray(axes.data).reshape(-1)}
        plan = mean_plan(x, out, reduced, bool(m.root.options.get("keep_dims")))
        return refuse(plan) if isinstance(plan, str) else plan

    def rewrite(self, m: Match, *, x: Tensor, axes: Tensor, plan: AxisPlan) -> None:
        out = m.root.output
        b = m.builder()
        parts, start = [], 0
        for j, size in enumerate(plan.sizes):
            begin = [start if k == plan.axis_in else 0 for k in range(len(x.shape))]
            shape = [size if k == plan.axis_in else d for k, d in enumerate(x.shape)]
            part = _slice(b, x, begin, shape, f"piece{j}/in", x.quantization)
            piece_out = tuple(size if k == plan.axis_out else d for k, d in enumerate(out.shape))
            parts.append(b.MEAN(part, axes, name=f"piece{j}", quant=out.quantization,
                                shape=piece_out, options=dict(m.root.options)))  # fmt: skip
            start += size
        b.replace(m.root, b.CONCATENATION(*parts, axis=plan.axis_out, shape=tuple(out.shape),
                                          quant=out.quantization))  # fmt: skip


# -- a broadcast op cut along an axis both operands span ----------------------------------------
def _broadcast_operand(m: Match, a: Tensor, b: Tensor) -> int | Refusal:
    """Which operand of an int8 op of two activations (a, b) is broadcast against the other, or
    why the rule does not apply."""
    out = m.root.output
    if a.is_constant or b.is_constant:
        return NotApplicable("an operand is a constant")
    refusal = _int8_refusal(a, out, same_q=False) or _int8_refusal(b, out, same_q=False)
    if refusal is not None:
        return refusal
    small = [i for i, t in enumerate((a, b)) if tuple(t.shape) != tuple(out.shape)]
    s = (a, b)[small[0]] if len(small) == 1 else None
    if s is None or len(s.shape) != len(out.shape):
        return NotApplicable("not one operand broadcast against the other at the same rank")
    if gate(m.root).answer == "mapped":
        return NotApplicable("the broadcast form is shown mapped as it is")
    return small[0]


def broadcast_plan(m: Match, s: Tensor) -> AxisPlan | str:
    """The fewest pieces along one axis both operands span (the innermost first) whose SLICEs,
    CONCATENATION, TILE of the broadcast piece `s` and same-shape op are all shown mapped."""
    out = m.root.output
    shape, dt = tuple(out.shape), out.dtype
    spans = [k for k, d in enumerate(s.shape) if d == shape[k] and d > 1]
    last = "the broadcast operand spans no axis to cut"
    for count in range(2, MOST_PIECES + 1):
        for axis in reversed(spans):
            if count > shape[axis]:
                continue
            sizes = tuple(_pieces(shape[axis], count))
            for n in sorted(set(sizes)):
                piece = tuple(n if k == axis else d for k, d in enumerate(shape))
                small = tuple(n if k == axis else d for k, d in enumerate(s.shape))
                multiples = tuple(p // q for p, q in zip(piece, small))
                why = (
                    _off("SLICE", (shape,), dt, piece, None)
                    or _off("SLICE", (tuple(s.shape),), dt, small, None)
                    or _off("TILE", (small,), dt, piece, multiples)
                    or _off(m.root.type, (piece, piece), dt, piece, None)
                )
                if why:
                    break
            else:
                why = _off("CONCATENATION", tuple(
                    tuple(n if k == axis else d for k, d in enumerate(shape)) for n in sizes
                ), dt, shape, (axis,))  # fmt: skip
            if why is None:
                return AxisPlan(axis, axis, sizes)
            last = why
    return f"no cut into at most {MOST_PIECES} pieces is shown mapped once tiled ({last})"


class CutBroadcastIntoShownPieces(Rule):
    """int8: OP(x, s), OP in MUL/ADD/SUB of two activations, s broadcast against x, where the
    TILE that would give s x's shape is larger than compiled models show mapped  =>
    CONCATENATION(OP(SLICE(x), SLICE(s)) ...), pieces along an axis both span (a squeeze-excite's
    [1, 14, 14, 480] x [1, 1, 1, 480] as two 240-channel halves: the tile of [1, 1, 1, 240] over
    [1, 14, 14, 240] is within DeepLab's shown [1, 33, 33, 128]); `TileBroadcastOperand` then
    tiles each piece's operand. The pieces compute the same elements with the same parameters:
    bit-identical."""

    quantized_ok = True
    int8_error_steps = 0  # each output element computed as before

    def __init__(self, op_type: str = "MUL") -> None:
        self.op_type = op_type

    @property
    def name(self) -> str:
        return f"CutBroadcastIntoShownPieces{self.op_type.title()}"

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return getattr(p, self.op_type)(p.a, p.b)

    @_gated
    def check(self, m: Match, *, a: Tensor, b: Tensor) -> Refusal | tuple[int, AxisPlan]:
        """A refusal, or the broadcast operand and the pieces (the plan)."""
        which = _broadcast_operand(m, a, b)
        if isinstance(which, Refusal):
            return which
        s, out = (a, b)[which], m.root.output
        multiples = tuple(o // d for d, o in zip(s.shape, out.shape))
        if _off("TILE", (tuple(s.shape),), out.dtype, tuple(out.shape), multiples) is None:
            return NotApplicable("the whole operand's TILE is shown (TileBroadcastOperand's)")
        plan = broadcast_plan(m, s)
        return refuse(plan) if isinstance(plan, str) else (which, plan)

    def rewrite(self, m: Match, *, a: Tensor, b: Tensor, plan: tuple[int, AxisPlan]) -> None:
        _, cut = plan
        out = m.root.output
        bld = m.builder()
        parts, start = [], 0
        for j, size in enumerate(cut.sizes):
            pieces = []
            for k, t in enumerate((a, b)):
                begin = [start if i == cut.axis_in and t.shape[i] > 1 else 0
                         for i in range(len(t.shape))]  # fmt: skip
                shape = [size if i == cut.axis_in else d for i, d in enumerate(t.shape)]
                pieces.append(_slice(bld, t, begin, shape, f"piece{j}/in{k}", t.quantization))
            parts.append(bld.op(m.root.type, *pieces, name=f"piece{j}", quant=out.quantization,
                                options=dict(m.root.options)))  # fmt: skip
            start += size
        bld.replace(m.root, bld.CONCATENATION(*parts, axis=cut.axis_out, shape=tuple(out.shape),
                                              quant=out.quantization))  # fmt: skip


LAYOUT_LEGALIZATION: tuple[Rule, ...] = (
    CutReshapeIntoShownBlocks(),
    CutTransposeIntoShownForms(),
    CutSoftmaxIntoShownRows(),
    CutMeanIntoShownPieces(),
    *(CutBroadcastIntoShownPieces(t) for t in ("MUL", "ADD", "SUB")),
)
