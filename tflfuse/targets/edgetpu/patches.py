"""Edge TPU legalization of patch unfold and fold: data movement through more than 3 dims > 1.

MobileViT's transformer reads its feature map as patches: timm writes the unfold as RESHAPE
[B C nh, ph, nw, pw], TRANSPOSE, RESHAPE [B, C, N, P], TRANSPOSE and RESHAPE [B P, N, C] (P =
ph pw, N = nh nw), and the fold back as the same steps reversed; an NCHW exporter adds a
TRANSPOSE to and from its NHWC convolutions. Each tensor in the middle has more than 3
dimensions > 1, which the compiler never maps (`delegates/edgetpu.toml` [meta]): the segment
ends at the first unfold. `SplitHeadsInWindows` (headsplit.py) writes an end of such a chain
that is one window of its input or one window per index of its outermost dimension; a patch
unfold is neither (its tokens step by 2 pw and by 2 W C in the input).

Every tensor such a chain ends in is a gather of the chain's input x (y.flat[i] = x.flat[g[i]],
g found by running the chain on x's indices: `headsplit.find_chain`). The chain is taken from
the first layout op above it to the last below it (an NCHW exporter's TRANSPOSEs included), so
that g is read between the layouts the neighbouring ops use. g is then written in digits: y's
flat index in mixed radix, outermost first, each digit with its stride in x (y.flat[i] = base +
sum_j i_j s_j). Where the strides fall from the outermost digit to the innermost, y is one
window of a view of x (a RESHAPE of x into at most 3 dims > 1, a SLICE); where they do not,
the fewest pieces are cut along some digits (each value of those digits a window) and joined
by CONCATENATIONs along the innermost axis of [before, after] views, a digit group at a time:
an unfold of 2 x 2 patches is 4 windows and one join, its fold 4 windows and 3 joins (pw
within ph).

Exact: RESHAPE, SLICE and CONCATENATION copy codes. The rule runs on the int8 graph, where every
tensor it writes keeps x's quantization (refused where an op of the chain requantizes):
bit-identical, int8 error 0. On the float graph the chain stays (pieces calibrated apart would
need a requantizing join), and the gate of the float legalizations does not read it as a cut
(`planned_once_quantized`), so that the transformer between unfold and fold is legalized in
float like any other.

A leaf whose digits' strides do not fall and that has at most 3 of them is the window of its
digits in falling order and one TRANSPOSE (EdgeNeXt's cross-covariance attention puts each
head's tokens innermost: q is the window [N, h d] of qkv, transposed).

Evidence: every op written must be accepted by the compiler's table (at most 3 dims > 1, the
row limit) and its form not refused at its size by a compiled model (`forms.gate`). A RESHAPE
or TRANSPOSE of a form the predictor's gate asks about and no compiled model shows at that
size is written: the prediction says undecided, and the layout cuts (layout.py) may cut it
into shown pieces. Every CONCATENATION must be shown mapped at its size: the predictor's gate
does not ask about joins, so an unshown one would be counted mapped. SLICE is trusted to the
table, as the predictor does (no compiled model in the evidence shows a SLICE, only
STRIDED_SLICE). Where a join is not shown (MobileViT-xxs's unfold at 32 x 32 x 64 joins 4 rows
of 16384 into 65536, where the largest 4-way join shown holds 10240 in its two innermost
dims), the chain stays whole, with that reason; in float, `patchbranches.py` runs such a
block's patch positions apart first, so that no join of them is written at all.
"""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass
from typing import cast

import numpy as np

from tflfuse.ir import Graph, Op, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, Value, refuse
from tflfuse.rewrite.common import NotApplicable, is_float
from tflfuse.targets.edgetpu.heads import form_verdict
from tflfuse.targets.edgetpu.headsplit import (
    MAX_DIMS,
    Window,
    drop_unread,
    find_chain,
    move,
    nontrivial,
    plan_end,
    window,
)
from tflfuse.targets.edgetpu.rules import _gated, _kind, _refusal_of, lifts_the_cut

LAYOUT = frozenset({"RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS"})
MAX_PIECES = 16  # windows per end: beyond that the join costs more than the chain saves
MAX_DIGITS = 8  # digits of one gather (subsets of them are searched)


# -- the gather in digits ------------------------------------------------------------------------
@dataclass(frozen=True)
class Digit:
    """One digit of y's flat index: its radix and its stride in x's flat index."""

    radix: int
    stride: int


def digits_of(g: np.ndarray) -> tuple[int, list[Digit]] | None:
    """(base, digits outermost first) with g.flat[i] = base + sum_j i_j stride_j, i_j the mixed
    radix digits of i; None when g is not such a gather. Each digit is the longest run of one
    stride whose length divides what is left (greedy from the innermost, then checked)."""
    flat = np.asarray(g, np.int64).reshape(-1)
    n, base = flat.size, int(flat[0]) if flat.size else 0
    found: list[Digit] = []
    period = 1
    while period < n:
        stride = int(flat[period] - flat[0])
        left = n // period
        run = 1
        while run < left and int(flat[period * run] - flat[0]) == run * stride:
            run += 1
        while left % run:
            run -= 1
        if run < 2:
            return None
        found.append(Digit(run, stride))
        period *= run
    digits = found[::-1]
    if digits:
        grid = np.indices([d.radix for d in digits]).reshape(len(digits), -1)
        strides = np.asarray([d.stride for d in digits], np.int64)
        if not np.array_equal(flat, base + strides @ grid):
            return None
    return base, digits


def _gather(base: int, digits: list[Digit]) -> np.ndarray:
    if not digits:
        return np.array([base], np.int64)
    grid = np.indices([d.radix for d in digits]).reshape(len(digits), -1)
    strides = np.asarray([d.stride for d in digits], np.int64)
    return (base + strides @ grid).reshape([d.radix for d in digits])


# -- the plan: windows and joins -----------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """A window of x (`leaf`), or `children` joined along the innermost axis of [before, after]
    views: out viewed as [before, radix, after], child v its [before, after] at v."""

    shape: tuple[int, ...]  # the piece's natural shape: its digits' radices
    leaf: Window | None = None
    children: tuple[Piece, ...] = ()
    before: int = 1
    after: int = 1
    # a leaf whose digits' strides do not fall: the window holds them in falling order, shaped
    # `moved`, and a TRANSPOSE by `perm` puts them in the piece's order
    moved: tuple[int, ...] | None = None
    perm: tuple[int, ...] | None = None


def _piece(
    base: int, digits: list[tuple[int, Digit]], cut: frozenset[int], x_shape: tuple[int, ...]
) -> Piece | None:
    """The piece writing `digits` (each with its position in the gather's list) at `base`,
    cut along the digits whose positions are in `cut`; None when a leaf is no window."""
    shape = tuple(d.radix for _, d in digits)
    at = next((k for k, (i, _) in enumerate(digits) if i in cut), None)
    if at is None:
        w = window(_gather(base, [d for _, d in digits]), x_shape)
        return Piece(shape, leaf=w) if w is not None else _transposed(base, digits, x_shape)
    end = at
    while end + 1 < len(digits) and digits[end + 1][0] in cut:
        end += 1
    group = [d for _, d in digits[at : end + 1]]
    rest = digits[:at] + digits[end + 1 :]
    children = []
    for values in itertools.product(*(range(d.radix) for d in group)):
        offset = sum(v * d.stride for v, d in zip(values, group))
        child = _piece(base + offset, rest, cut, x_shape)
        if child is None:
            return None
        children.append(child)
    before = math.prod(d.radix for _, d in digits[:at])
    after = math.prod(d.radix for _, d in digits[end + 1 :])
    return Piece(shape, children=tuple(children), before=before, after=after)


def _transposed(
    base: int, digits: list[tuple[int, Digit]], x_shape: tuple[int, ...]
) -> Piece | None:
    """A leaf whose strides do not fall, as the window of its digits in falling order and one
    TRANSPOSE of at most 3 dims (a head split that moves the tokens innermost: EdgeNeXt's
    cross-covariance attention), or None."""
    kept = [d for _, d in digits]
    order = sorted(range(len(kept)), key=lambda k: -kept[k].stride)
    if len(kept) > MAX_DIMS or order == list(range(len(kept))):
        return None
    moved = tuple(kept[k].radix for k in order)
    w = window(_gather(base, [kept[k] for k in order]), x_shape)
    if w is None:
        return None
    perm = tuple(order.index(k) for k in range(len(kept)))
    return Piece(tuple(d.radix for d in kept), leaf=w, moved=moved, perm=perm)


def _leaves(p: Piece) -> int:
    return 1 if p.leaf is not None else sum(_leaves(c) for c in p.children)


def plan_gather(g: np.ndarray, x_shape: tuple[int, ...]) -> Piece | None:
    """The fewest windows (at most MAX_PIECES) that write g, joined (module docstring)."""
    found = digits_of(g)
    if found is None:
        return None
    base, digits = found
    if len(digits) > MAX_DIGITS:
        return None
    every, n = range(len(digits)), len(digits)
    subsets = [frozenset(c) for r in range(n + 1) for c in itertools.combinations(every, r)]
    subsets.sort(key=lambda s: (math.prod(digits[i].radix for i in s), len(s)))
    for cut in subsets:
        if math.prod(digits[i].radix for i in cut) > MAX_PIECES:
            return None
        piece = _piece(base, list(enumerate(digits)), cut, x_shape)
        if piece is not None:
            return piece
    return None


# -- what the plan writes -----------------------------------------------------------------------
Written = tuple[str, list[tuple[int, ...]], tuple[int, ...], dict, list[np.ndarray]]


class _Sink:
    """Where `_emit` writes: shapes only (`_Shapes`, what the checks read) or the graph
    (`_Built`). A value is whatever the sink hands back; `shape_of` reads its shape."""

    def shape_of(self, v: object) -> tuple[int, ...]:
        raise NotImplementedError

    def view(self, shape: tuple[int, ...]) -> object:
        raise NotImplementedError

    def reshape(self, v: object, shape: tuple[int, ...]) -> object:
        raise NotImplementedError

    def slice(self, v: object, begin: tuple[int, ...], size: tuple[int, ...]) -> object:
        raise NotImplementedError

    def concat(self, parts: list[object], axis: int) -> object:
        raise NotImplementedError

    def transpose(self, v: object, perm: tuple[int, ...]) -> object:
        raise NotImplementedError


def _part_shape(before: int, after: int, outer: int) -> tuple[int, ...]:
    """How a join's parts are laid out: [outer, before / outer, after] when the parent's own
    parts start with `outer` (so that the join reshapes into them by merging dims: RESHAPE
    3>2, a form compiled models show, where 2>2 is not), else [before, after]."""
    if 1 < outer < before and before % outer == 0:
        return (outer, before // outer, after)
    return (before, after) if before > 1 else (1, after)


def _emit(sink: _Sink, p: Piece, outer: int, views: dict) -> object:
    """Write piece `p`; a join lays its parts out as `_part_shape` says, `outer` the first dim
    its parent wants. RESHAPEs of x into one view are written once (`views`)."""
    if p.leaf is not None:
        w, view = p.leaf, p.leaf.view or ()
        if view not in views:
            views[view] = sink.view(view)
        got = sink.slice(views[view], w.begin, w.size)
        if p.moved is None or p.perm is None:
            return got
        if sink.shape_of(got) != p.moved:
            got = sink.reshape(got, p.moved)
        return sink.transpose(got, p.perm)
    part = _part_shape(p.before, p.after, outer)
    parts = []
    for child in p.children:
        v = _emit(sink, child, part[0], views)
        if sink.shape_of(v) != part:
            v = sink.reshape(v, part)
        parts.append(v)
    return sink.concat(parts, len(part) - 1)


class _Shapes(_Sink):
    """Records (type, input shapes, output shape, options, constants) per op written."""

    def __init__(self, x_shape: tuple[int, ...]) -> None:
        self.x_shape, self.ops = x_shape, cast("list[Written]", [])

    def shape_of(self, v: object) -> tuple[int, ...]:
        return cast("tuple[int, ...]", v)

    def _add(self, op: str, ins: list, out: tuple[int, ...], options: dict, consts: list) -> object:
        self.ops.append((op, [tuple(i) for i in ins], tuple(out), options, consts))
        return tuple(out)

    def view(self, shape: tuple[int, ...]) -> object:
        if not shape:
            return self.x_shape
        return self._add("RESHAPE", [self.x_shape], shape, {}, [np.array(shape, np.int32)])

    def reshape(self, v: object, shape: tuple[int, ...]) -> object:
        return self._add("RESHAPE", [v], shape, {}, [np.array(shape, np.int32)])

    def slice(self, v: object, begin: tuple[int, ...], size: tuple[int, ...]) -> object:
        consts = [np.array(begin, np.int32), np.array(size, np.int32)]
        return self._add("SLICE", [v], size, {}, consts)

    def transpose(self, v: object, perm: tuple[int, ...]) -> object:
        shape = self.shape_of(v)
        out = tuple(shape[k] for k in perm)
        return self._add("TRANSPOSE", [v], out, {}, [np.array(perm, np.int32)])

    def concat(self, parts: list[object], axis: int) -> object:
        first = self.shape_of(parts[0])
        out = (*first[:axis], sum(self.shape_of(p)[axis] for p in parts), *first[axis + 1 :])
        return self._add("CONCATENATION", parts, out, {"axis": axis}, [])


def written(x_shape: tuple[int, ...], piece: Piece, out_shape: tuple[int, ...]) -> list[Written]:
    """Every op the plan writes for one end, in order (shapes only: the checks' input)."""
    sink = _Shapes(tuple(x_shape))
    last = sink.shape_of(_emit(sink, piece, 1, {}))
    if last != tuple(out_shape):
        sink.reshape(last, tuple(out_shape))
    return sink.ops


def _first_refusal(x: Tensor, ops: list[Written]) -> str | None:
    """Why an op the plan would write may not be written: the table refuses it, a compiled
    model refuses its form at its size, or it is a CONCATENATION no compiled model shows
    mapped at its size (the predictor's gate does not ask about joins, so this rule writes
    none unshown). A RESHAPE or TRANSPOSE of a form the gate asks about and no compiled model
    shows is written: the prediction says undecided, and the layout cuts (layout.py) may cut
    it into shown pieces."""
    seen = set()
    for op_type, shapes, out, options, consts in ops:
        key = (op_type, tuple(shapes), out)
        if key in seen:
            continue
        seen.add(key)
        ins = [Tensor("t", s, x.dtype, quantization=x.quantization) for s in shapes]
        why = _refusal_of(op_type, ins, out, options, consts)
        if why:
            return f"the {op_type} it would write is refused by the table ({why})"
        verdict = form_verdict(op_type, ins, out, options, consts)
        asked = verdict.answer == "refused" or op_type == "CONCATENATION"
        if asked and verdict.answer != "mapped":
            shown = f"{verdict.answer}: {verdict.reason}"
            return f"the {op_type} it would write is not shown mapped ({shown})"
    return None


# -- the chain, from the layout op above it to the one below it ----------------------------------
@dataclass
class Patches:
    """The chain's source `x`, its ops (to remove where nothing else reads them), and per end
    (the tensor read after it) its plan and what it writes."""

    x: Tensor
    ops: list[Op]
    ends: list[tuple[Tensor, Piece, list[Written]]]


def _upstream(x: Tensor, ops: list[Op]) -> tuple[Tensor, list[Op], np.ndarray | None]:
    """The first tensor above x reached through layout ops of at most 3 dims > 1 each, the ops
    passed, and x's gather map from it (None: none passed)."""
    passed: list[Op] = []
    src = x
    while src.producer is not None and src.producer.type in LAYOUT and src.producer.inputs:
        op = src.producer
        up = op.inputs[0]
        if up is None or up.is_constant or nontrivial(up.shape) > MAX_DIMS:
            break
        passed.insert(0, op)
        src = up
    if not passed:
        return x, [], None
    values = np.arange(src.size).reshape(src.shape)
    for op in passed:
        got = move(op, values)
        if got is None:
            return x, [], None
        values = got
    return src, passed, values


def _downstream(graph: Graph, end: Tensor, g: np.ndarray) -> tuple[Tensor, np.ndarray, list[Op]]:
    """The end moved on through the layout ops that alone read it (an NCHW exporter's TRANSPOSE
    back to NHWC, a RESHAPE to tokens), with its gather map and the ops passed."""
    passed = []
    while not graph.is_graph_output(end) and len(end.consumers) == 1:
        op = end.consumers[0]
        if op.type not in LAYOUT or op.inputs[0] is not end:
            break
        got = move(op, g)
        if got is None or tuple(got.shape) != tuple(op.outputs[0].shape):
            break
        passed.append(op)
        end, g = op.outputs[0], got
    return end, g, passed


def plan_patches(graph: Graph, root: Op) -> Patches | Refusal:
    """The chain from `root` (a RESHAPE into more than 3 dims > 1) widened to the layout ops
    around it, each end planned and checked (module docstring)."""
    chain = find_chain(graph, root)
    if isinstance(chain, Refusal):
        return chain
    x0 = chain.x
    if all(plan_end(end, g, tuple(x0.shape)) is not None for end, g in chain.ends):
        return NotApplicable("every end is a window or windows per head: SplitHeadsInWindows")
    x, above, lift = _upstream(x0, chain.ops)
    ops = [*above, *chain.ops]
    ends = []
    for end, g in chain.ends:
        full = g if lift is None else lift.reshape(-1)[g]
        last, full, below = _downstream(graph, end, full)
        ops += below
        piece = plan_gather(full, tuple(x.shape))
        if piece is None:
            return refuse(f"{list(last.shape)} is no join of at most {MAX_PIECES} windows of x")
        writes = written(tuple(x.shape), piece, tuple(last.shape))
        why = _first_refusal(x, writes)
        if why:
            return refuse(why)
        ends.append((last, piece, writes))
    return Patches(x, ops, ends)


def _requantizes(p: Patches) -> bool:
    q = p.x.quantization
    outs = [op.outputs[0].quantization for op in p.ops]
    if q is None or not p.x.is_quantized:
        return any(o is not None and not o.is_empty() for o in outs)
    return not all(o is not None and o.same_as(q) for o in outs)


class MovePatchesInShownForms(Rule):
    """int8: a chain of RESHAPE / TRANSPOSE / SLICE through tensors of more than 3 dims > 1
    (a patch unfold or fold), with the layout ops around it  =>  per tensor it ends in, SLICEs
    of windows of the chain's source (each seen through a RESHAPE of at most 3 dims > 1) joined
    by CONCATENATIONs along an innermost axis (module docstring). Data movement only: codes are
    copied (int8 error 0).

    The root is the chain's first RESHAPE into more than 3 dims > 1; ends that are windows or
    windows per head are `SplitHeadsInWindows`'s."""

    quantized_ok = True
    int8_error_steps = 0  # data movement only: codes are copied

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.RESHAPE(p.x, p.const("shape"))

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | Patches:
        """A refusal, or the chain and how each of its ends is written (the plan)."""
        out = m.root.output
        if nontrivial(out.shape) <= MAX_DIMS or nontrivial(x.shape) > MAX_DIMS:
            return NotApplicable("not a reshape into more than 3 dimensions > 1")
        if _kind(x) != "int":
            return NotApplicable(
                "float: the chain is rewritten once quantized, one scale for every piece"
            )
        plan = plan_patches(m.graph, m.root)
        if isinstance(plan, Refusal):
            return plan
        if _requantizes(plan):
            return refuse("an op of the chain requantizes")
        return plan

    def rewrite(self, m: Match, *, plan: Patches) -> None:
        for end, piece, _ in plan.ends:
            _write_end(m, plan.x, end, piece)
        drop_unread(m.graph, plan.ops)


class _Built(_Sink):
    """Writes the ops with the match's builder, every tensor quantized as x."""

    def __init__(self, m: Match, x: Tensor, at: Op) -> None:
        self.b, self.x, self.n = m.builder(at=at), x, itertools.count()

    def shape_of(self, v: object) -> tuple[int, ...]:
        return tuple(cast("Tensor | Value", v).shape)

    def view(self, shape: tuple[int, ...]) -> object:
        if not shape:
            return self.x
        i = next(self.n)
        return self.b.RESHAPE(self.x, self.b.ints(shape, f"view{i}/shape"), name=f"view{i}",
                              like=self.x)  # fmt: skip

    def reshape(self, v: object, shape: tuple[int, ...]) -> object:
        i = next(self.n)
        return self.b.RESHAPE(v, self.b.ints(shape, f"part{i}/shape"), name=f"part{i}",
                              like=self.x)  # fmt: skip

    def slice(self, v: object, begin: tuple[int, ...], size: tuple[int, ...]) -> object:
        i, b = next(self.n), self.b
        return b.SLICE(v, b.ints(begin, f"piece{i}/begin"), b.ints(size, f"piece{i}/size"),
                       name=f"piece{i}", like=self.x)  # fmt: skip

    def concat(self, parts: list[object], axis: int) -> object:
        i = next(self.n)
        return self.b.CONCATENATION(*parts, axis=axis, name=f"join{i}", like=self.x)

    def transpose(self, v: object, perm: tuple[int, ...]) -> object:
        i = next(self.n)
        return self.b.TRANSPOSE(v, self.b.ints(perm, f"moved{i}/perm"), name=f"moved{i}",
                                like=self.x)  # fmt: skip


def _write_end(m: Match, x: Tensor, end: Tensor, piece: Piece) -> None:
    producer = end.op  # (an end is written by an op of the chain)
    sink = _Built(m, x, producer)
    result = cast(Value, _emit(sink, piece, 1, {}))
    if tuple(result.shape) != tuple(end.shape):
        result = cast(Value, sink.reshape(result, tuple(end.shape)))
    sink.b.replace(producer, result)


# -- the float stage: the chain is no cut where the int8 stage writes it -------------------------
_PLANNED: weakref.WeakKeyDictionary[Op, tuple[tuple, bool]] = weakref.WeakKeyDictionary()


def _root_of(op: Op) -> Op | None:
    """The RESHAPE into more than 3 dims > 1 that starts the chain `op` is in (walking up
    through movement ops reading tensors of more than 3 dims > 1)."""
    while op.type in ("RESHAPE", "TRANSPOSE", "SLICE", "STRIDED_SLICE", "SQUEEZE", "EXPAND_DIMS"):
        x = op.inputs[0] if op.inputs else None
        if x is None:
            return None
        if nontrivial(x.shape) <= MAX_DIMS:
            into = op.type == "RESHAPE" and nontrivial(op.outputs[0].shape) > MAX_DIMS
            return op if into else None
        if x.producer is None:
            return None
        op = x.producer
    return None


@lifts_the_cut
def planned_once_quantized(op: Op, graph: Graph) -> bool:
    """A float movement op of a chain `MovePatchesInShownForms` writes once quantized (shapes
    only, as its plan reads them): the float legalizations' gate does not count it as a cut."""
    if not op.outputs or not op.inputs or op.inputs[0] is None or not is_float(op.inputs[0]):
        return False
    root = _root_of(op)
    if root is None:
        return False
    x = root.inputs[0]
    key = (
        len(graph.ops),
        id(x.producer) if x is not None else 0,
        tuple(id(c) for c in root.outputs[0].consumers),
    )
    known = _PLANNED.get(root)
    if known is not None and known[0] == key:
        return known[1]
    ok = not isinstance(plan_patches(graph, root), Refusal)
    _PLANNED[root] = (key, ok)
    return ok


PATCH_LEGALIZATION: tuple[Rule, ...] = (MovePatchesInShownForms(),)
