"""Edge TPU legalization of a patch unfold whose patch positions are a batch: run them apart.

MobileViT unfolds its feature map X [H, W, C] into patches of fh x fw pixels: the transformer
reads T [P, N, C] (P = fh fw patch positions, N = H W / P patches) with
T[p, n, c] = X[fh nh + ph, fw nw + pw, c], and the fold writes the same gather back. Every op of
the transformer acts on each patch position on its own: LayerNorm and the MLP row by row,
attention over the N tokens of one position (the export's batch axis, or a factor of it). The
unfold is a join of P windows of X along a non-channel axis (65,536 elements for MobileViT-xxs
at 32 x 32 x 64), and no compiled model shows such a join mapped (`patches.py`).

So the P positions are never joined:

    unfold(X) -> transformer -> fold  =>  per p: SLICE(RESHAPE(X)) -> transformer_p;
                                          fold = CONV_1x1(MUL(RESIZE_NN(CONCAT_c(out_p)), M))

- Each branch's input is one window of a view of X (a SLICE of a RESHAPE: `headsplit.window`).
- Each op of the transformer is written once per branch, on the branch's part of its tensors:
  the position digit sits in one axis of every tensor (a factor of it, `Lay`), found by
  following its stride through each op; an op is taken only where it provably does not mix
  positions (element-wise ops, FULLY_CONNECTED and BATCH_MATMUL with the position in a batch
  axis, reductions and SOFTMAX over other axes, layout ops that keep the digit whole, checked
  on indices). A constant that varies along the position is cut per branch.
- The fold: the branch outputs joined along channels ([H/fh, W/fw, P C]: a channel join, shown
  mapped), RESIZE_NEAREST_NEIGHBOR by (fh, fw) (every pixel of a patch reads its patch's
  P C values; shown mapped), a constant 0/1 mask keeping at pixel (ph, pw) only the channels
  of its own position, and a 1 x 1 CONV_2D with one-hot weights summing the P channel groups.

Exact in float: the branches compute the same products and sums on the same values as the
batched ops (attention per branch is the export's attention per batch entry); the fold adds
zeros (x 0 + x 1 + ...: every product with 0 is 0 and adding 0 changes no float sum). Float
only: the quantizer calibrates the branches like any tensor. Fires only where every op the
unfold and fold write is accepted by the compiler's table and, for a form the forms gate asks
about, shown mapped (`headsplit.unshown`); CONCATENATION is asked too (the gate does not ask
about joins). No name is read: the chain's shapes and index maps decide.

Evidence (`delegates/edgetpu_forms.toml`, MobileViT-xxs's largest block in brackets): RESHAPE
nt=3>3 (shown by 5 compiled models up to 408,000 elements, 10,200 innermost; [1, 32, 32, 64] ->
[16, 32, 128]: 65,536 / 4,096), RESHAPE nt=3>2 and 2>3, CONCATENATION n=4 axis=inner (13 models,
up to 819,200 / 10,240; [1, 16, 16, 256]: 65,536 / 4,096), RESIZE_NEAREST_NEIGHBOR f=2x2 (7
models, up to 819,200 / 10,240; [1, 32, 32, 256]: 262,144 / 8,192), CONV_2D 1x1 (176 models).
SLICE and the MUL by the constant mask are forms the forms gate does not ask about (trusted to
the op table, as the predictor does for every SLICE and every product with a constant); no
compiled model shows a MUL(a, c) "same" over 3 dims > 1 (over 2 dims: shown). A TRANSPOSE_CONV
(the fold's usual spelling) or DEPTH_TO_SPACE is not written: no compiled model shows the first,
one refuses the second.

Not held back by the one-segment cut (`rules.after_the_cut`), unlike the other legalizations:
it must take the unfold and fold as the exporter wrote them, in the first round, before the
layout rules rewrite those chains (a later block's fold, after the cut of an earlier one, would
otherwise be cut into pieces it no longer reads). Behind a cut it only writes exact CPU ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from tflfuse.ir import Graph, Op, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, Value, refuse
from tflfuse.rewrite.build import Builder
from tflfuse.rewrite.common import NotApplicable, is_float
from tflfuse.targets.edgetpu.headsplit import (
    MAX_DIMS,
    find_chain,
    move,
    nontrivial,
    unshown,
    window,
)
from tflfuse.targets.edgetpu.patches import _downstream, _upstream, digits_of

MAX_POSITIONS = 16
UNARY = frozenset(
    {"ABS", "EXP", "GELU", "HARD_SWISH", "LOG", "LOGISTIC", "NEG", "RELU", "RELU6", "RSQRT",
     "SQRT", "SQUARE", "TANH", "LEAKY_RELU", "RELU_N1_TO_1", "RELU_0_TO_1"}
)  # fmt: skip
BINARY = frozenset({"ADD", "SUB", "MUL", "DIV", "SQUARED_DIFFERENCE", "MAXIMUM", "MINIMUM", "POW"})
REDUCE = frozenset({"MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"})
MOVES = frozenset({"RESHAPE", "TRANSPOSE", "SLICE", "STRIDED_SLICE", "SQUEEZE", "EXPAND_DIMS"})


# -- where the position digit sits in a tensor -------------------------------------------------
@dataclass(frozen=True)
class Lay:
    """The position digit of a tensor: in `axis`, whose size is outer x P x inner."""

    axis: int
    outer: int
    inner: int


def lay_of(shape: tuple[int, ...], stride: int, positions: int) -> Lay | None:
    """The axis holding a digit of `positions` values with `stride` in the flat index (None:
    the digit straddles axes)."""
    below = 1
    for a in reversed(range(len(shape))):
        if stride < below * shape[a]:
            if stride % below:
                return None
            inner = stride // below
            if shape[a] % (inner * positions):
                return None
            return Lay(a, shape[a] // (inner * positions), inner)
        below *= shape[a]
    return None


def stride_of(shape: tuple[int, ...], lay: Lay) -> int:
    return lay.inner * math.prod(shape[lay.axis + 1 :])


def branch_shape(shape: tuple[int, ...], lay: Lay, positions: int) -> tuple[int, ...]:
    out = list(shape)
    out[lay.axis] //= positions
    return tuple(out)


def branch_part(arr: np.ndarray, lay: Lay, positions: int, p: int) -> np.ndarray:
    """Position p's part of `arr` (shaped as the tensor whose digit is `lay`)."""
    shape = tuple(arr.shape)
    before = math.prod(shape[: lay.axis]) * lay.outer
    after = lay.inner * math.prod(shape[lay.axis + 1 :])
    part = np.asarray(arr).reshape(before, positions, after)[:, p, :]
    return part.reshape(branch_shape(shape, lay, positions))


def _ints(t: Tensor | None) -> list[int] | None:
    if t is None or not t.is_constant or t.is_raw:
        return None
    return [int(v) for v in np.asarray(t.data).reshape(-1)]


# -- one op, per branch ------------------------------------------------------------------------
@dataclass
class Clone:
    """How one op of the transformer is written per branch: its output's digit and, per input
    index, what each branch reads (a region tensor, the same tensor, or a constant cut per
    branch), and the constants its own parameters take (a RESHAPE's shape, a SLICE's size)."""

    op: Op
    out_lay: Lay
    cut_consts: dict[int, list[np.ndarray]] = field(default_factory=dict)
    params: dict[int, np.ndarray] = field(default_factory=dict)


def _other_operand(
    t: Tensor, out_shape: tuple[int, ...], lay: Lay, positions: int, rank_offset: int
) -> list[np.ndarray] | Refusal | None:
    """A non-branch operand of a broadcasting op: None when it is the same for every position
    (size 1 or absent along the digit's axis), its per-branch cuts when it is a constant that
    varies along it, else a refusal."""
    a = lay.axis - rank_offset
    if a < 0 or t.shape[a] == 1:
        return None
    if t.shape[a] != out_shape[lay.axis] or t.data is None or t.is_raw:
        return refuse(f"{t.name!r} varies along the patch positions and is no constant")
    own = Lay(a, lay.outer, lay.inner)
    return [branch_part(np.asarray(t.data), own, positions, p) for p in range(positions)]


def _aligned(lays: dict[int, Lay], t: Tensor, out_rank: int) -> Lay | None:
    lay = lays.get(id(t))
    if lay is None:
        return None
    return Lay(lay.axis + out_rank - len(t.shape), lay.outer, lay.inner)


def clone_of(op: Op, lays: dict[int, Lay], positions: int) -> Clone | Refusal:
    """How `op` (reading a branch tensor) is written per branch, or why it cannot be."""
    out = op.outputs[0]
    shape = tuple(out.shape)
    if len(op.outputs) != 1:
        return refuse(f"{op.type} writes several tensors")
    ins = [(i, t) for i, t in enumerate(op.inputs) if t is not None]
    mine = [(i, t) for i, t in ins if id(t) in lays]
    if op.type in UNARY or op.type in ("SOFTMAX", "LOG_SOFTMAX"):
        lay = lays[id(mine[0][1])]
        if op.type in ("SOFTMAX", "LOG_SOFTMAX") and lay.axis == len(shape) - 1:
            return refuse("the softmax runs over the patch positions")
        return Clone(op, lay)
    if op.type in BINARY or op.type == "BATCH_MATMUL":
        return _broadcasting(op, lays, positions, mine, ins)
    if op.type == "FULLY_CONNECTED":
        x = op.input(0)
        row = lays.get(id(x))
        if row is None or len(mine) != 1 or row.axis == len(x.shape) - 1:
            return refuse("FULLY_CONNECTED mixes the patch positions")
        stride = stride_of(tuple(x.shape), row) // x.shape[-1] * shape[-1]
        got = lay_of(shape, stride, positions)
        return refuse("the FULLY_CONNECTED's rows split the positions") if got is None else (
            Clone(op, got))  # fmt: skip
    if op.type in REDUCE:
        return _reduction(op, lays[id(op.input(0))], positions)
    if op.type in MOVES:
        return _movement(op, lays[id(op.input(0))], positions)
    return refuse(f"{op.type} is not known to keep the patch positions apart")


def _broadcasting(op: Op, lays: dict[int, Lay], positions: int, mine: list, ins: list):
    shape = tuple(op.outputs[0].shape)
    rank = len(shape)
    found = {_aligned(lays, t, rank) for _, t in mine}
    if len(found) != 1:
        return refuse(f"{op.type}'s operands hold the patch positions in different axes")
    lay = found.pop()
    assert lay is not None
    if op.type == "BATCH_MATMUL" and lay.axis >= rank - 2:
        return refuse("BATCH_MATMUL contracts or spans the patch positions")
    clone = Clone(op, lay)
    for i, t in ins:
        if id(t) in lays:
            continue
        got = _other_operand(t, shape, lay, positions, rank - len(t.shape))
        if isinstance(got, Refusal):
            return got
        if got is not None:
            clone.cut_consts[i] = got
    return clone


def _reduction(op: Op, lay: Lay, positions: int) -> Clone | Refusal:
    x = op.input(0)
    axes = _ints(op.inputs[1] if len(op.inputs) > 1 else None)
    if axes is None:
        return refuse(f"{op.type} over axes that are not constant")
    axes = [a % len(x.shape) for a in axes]
    if lay.axis in axes:
        return refuse(f"{op.type} reduces over the patch positions")
    keep = bool(op.options.get("keep_dims"))
    axis = lay.axis if keep else lay.axis - sum(1 for a in axes if a < lay.axis)
    return Clone(op, Lay(axis, lay.outer, lay.inner))


def _movement(op: Op, lay: Lay, positions: int) -> Clone | Refusal:
    """A layout op, written per branch with its parameters cut; checked on indices: the branch
    op moves each branch's part as the op moves the whole."""
    x, out = op.input(0), op.outputs[0]
    xs, ys = tuple(x.shape), tuple(out.shape)
    idx = np.arange(x.size).reshape(xs)
    moved = move(op, idx)
    if moved is None:
        return refuse(f"{op.type} in a form this rule does not read")
    params: dict[int, np.ndarray] = {}
    if op.type == "TRANSPOSE":
        perm = _ints(op.inputs[1])
        assert perm is not None
        axis = perm.index(lay.axis)
        got = Lay(axis, lay.outer, lay.inner)
    elif op.type == "SLICE":
        begin, size = _ints(op.inputs[1]), _ints(op.inputs[2])
        assert begin is not None and size is not None
        if begin[lay.axis] != 0 or size[lay.axis] not in (-1, xs[lay.axis]):
            return refuse("the SLICE cuts the patch positions")
        size[lay.axis] = -1 if size[lay.axis] == -1 else xs[lay.axis] // positions
        params[2] = np.array(size, np.int32)
        got = lay
    elif op.type in ("RESHAPE", "SQUEEZE", "EXPAND_DIMS"):
        found = lay_of(ys, stride_of(xs, lay), positions)
        if found is None:
            return refuse("the reshape splits the patch positions")
        got = found
        if op.type == "RESHAPE" and len(op.inputs) > 1 and op.inputs[1] is not None:
            params[1] = np.array(branch_shape(ys, got, positions), np.int32)
    else:
        return refuse(f"{op.type} among the patch positions' ops")
    ok = all(
        np.array_equal(
            _moved_branch(op, branch_part(idx, lay, positions, p), params, got, positions),
            branch_part(moved, got, positions, p),
        )
        for p in range(positions)
    )
    return Clone(op, got, params=params) if ok else refuse(f"{op.type} mixes the positions")


def _moved_branch(op: Op, part: np.ndarray, params: dict, got: Lay, positions: int):
    """What the branch op writes when it reads `part` (numpy)."""
    shape = branch_shape(tuple(op.outputs[0].shape), got, positions)
    if op.type == "TRANSPOSE":
        return np.transpose(part, _ints(op.inputs[1]))
    if op.type == "SLICE":
        begin = _ints(op.inputs[1]) or []
        size = [int(v) for v in params[2]]
        ends = [part.shape[k] if s == -1 else b + s for k, (b, s) in enumerate(zip(begin, size))]
        return part[tuple(slice(b, e) for b, e in zip(begin, ends))]
    return part.reshape(shape)


# -- the unfold: each end, per position, a window of x -----------------------------------------
@dataclass
class Unfold:
    """The chain's source x, its ops, the number of positions, and per end its digit and per
    position the window of x it reads."""

    x: Tensor
    ops: list[Op]
    positions: int
    ends: list[tuple[Tensor, Lay, list]]


def _positions(full: np.ndarray, end: Tensor, x_shape: tuple[int, ...]):
    """(the position digits, as (radix, stride in x), the end's Lay, the windows) for the
    fewest positions whose windows of x write the end, or None."""
    found = digits_of(full)
    if found is None:
        return None
    _, digits = found
    radices = [d.radix for d in digits]
    runs = [(i, j) for i in range(len(digits)) for j in range(i + 1, len(digits) + 1)]
    runs.sort(key=lambda r: math.prod(radices[r[0] : r[1]]))
    for i, j in runs:
        positions = math.prod(radices[i:j])
        if positions > MAX_POSITIONS:
            return None
        lay = lay_of(tuple(end.shape), math.prod(radices[j:]), positions)
        if lay is None:
            continue
        rest = [*radices[:i], *radices[j:]]  # each part in its digits, for `window`
        parts = [branch_part(full.reshape(end.shape), lay, positions, p) for p in range(positions)]
        windows = [window(part.reshape(rest), x_shape) for part in parts]
        if all(w is not None for w in windows):
            key = tuple((d.radix, d.stride) for d in digits[i:j])
            return key, lay, windows
    return None


def plan_unfold(graph: Graph, root: Op) -> Unfold | Refusal:
    """The unfold from `root` (a RESHAPE into more than 3 dims > 1), widened to the layout ops
    above it, and per end its positions' windows (module docstring)."""
    chain = find_chain(graph, root)
    if isinstance(chain, Refusal):
        return chain
    x, above, lift = _upstream(chain.x, chain.ops)
    if not chain.ends:
        return NotApplicable("the chain ends nowhere")
    ends, keys, ops = [], set(), [*above, *chain.ops]
    for first, g in chain.ends:
        full = g if lift is None else lift.reshape(-1)[g]
        end, full, below = _downstream(graph, first, full)
        ops += below
        if window(full.reshape(end.shape), tuple(x.shape)) is not None:
            return NotApplicable("an end is one window of x: SplitHeadsInWindows")
        got = _positions(full, end, tuple(x.shape))
        if got is None:
            return NotApplicable(f"{list(end.shape)} is no set of windows of x, one per position")
        key, lay, windows = got
        keys.add(key)
        ends.append((end, lay, windows))
    if len(keys) != 1:
        return refuse("the chain's ends order the patch positions differently")
    positions = math.prod(r for r, _ in next(iter(keys)))
    return Unfold(x, ops, positions, ends)


# -- the transformer, per position, and where it folds -----------------------------------------
@dataclass
class Fold:
    """A fold: the branch tensor `src` it reads, its ops, the tensor `y` [1, H, W, C] it
    writes, the patch (fh, fw) and the position of each (ph, pw) (`order`)."""

    src: Tensor
    ops: list[Op]
    y: Tensor
    patch: tuple[int, int]
    order: np.ndarray


@dataclass
class Branches:
    unfold: Unfold
    clones: list[Clone]
    lays: dict[int, Lay]
    folds: list[Fold]


def _fold_ops(graph: Graph, stop: Op, region: dict[int, Clone], lays: dict[int, Lay]):
    """The fold through `stop` (a layout op that splits the positions): up from it through the
    layout ops of the region that alone lead to it (written once, not per branch) to the branch
    tensor it reads, down through the layout ops that alone read each tensor; (src, ops, y)."""
    ops, t = [stop], stop.input(0)
    while t.producer is not None and id(t.producer) in region and t.producer.type in MOVES:
        up = t.producer.input(0)
        if id(up) not in lays or len(t.consumers) != 1 or graph.is_graph_output(t):
            break
        ops.insert(0, t.producer)
        t = up
    src, y = t, stop.outputs[0]
    while len(y.consumers) == 1 and not graph.is_graph_output(y) and y.consumers[0].type in MOVES:
        ops.append(y.consumers[0])
        y = y.consumers[0].outputs[0]
    return src, ops, y


def plan_fold(src: Tensor, ops: list[Op], y: Tensor, lay: Lay, positions: int) -> Fold | Refusal:
    """The fold of `ops` from branch tensor `src` when it writes y [1, H, W, C] with
    y[fh h + ph, fw w + pw, c] = branch_p[h, w, c] (p the position of (ph, pw))."""
    g = np.arange(src.size).reshape(src.shape)
    for op in ops:
        got = move(op, g)
        if got is None:
            return refuse(f"the fold's {op.type} in a form this rule does not read")
        g = got
    if len(y.shape) != 4 or y.shape[0] != 1:
        return refuse(f"the patches fold into {list(y.shape)}, not [1, H, W, C]")
    _, h, w, c = y.shape
    s = stride_of(tuple(src.shape), lay)
    flat = g.reshape(h, w, c).astype(np.int64)
    pos = flat // s % positions
    within = flat // (s * positions) * s + flat % s
    for fh in range(1, positions + 1):
        fw = positions // fh
        if fh * fw != positions or h % fh or w % fw:
            continue
        order = pos[:fh, :fw, 0]
        hh, ww, cc = np.indices((h, w, c))
        want_pos = order[hh % fh, ww % fw]
        want_in = ((hh // fh) * (w // fw) + ww // fw) * c + cc
        if np.array_equal(pos, want_pos) and np.array_equal(within, want_in):
            return Fold(src, ops, y, (fh, fw), order)
    return refuse(f"the fold into {list(y.shape)} is no interleave of the positions' patches")


def plan_branches(graph: Graph, unfold: Unfold) -> Branches | Refusal:
    """Every op downstream of the unfold, written per position, up to the folds."""
    positions = unfold.positions
    lays = {id(end): lay for end, lay, _ in unfold.ends}
    chain_ops = {id(op) for op in unfold.ops}
    region: dict[int, Clone] = {}
    stops: list[Op] = []
    for op in graph.ops:
        if id(op) in chain_ops or not any(t is not None and id(t) in lays for t in op.inputs):
            continue
        if op.type == "SHAPE":  # static shapes (onnx2tf's dead SHAPE ops): left to DCE
            continue
        got = clone_of(op, lays, positions)
        if isinstance(got, Refusal):
            if op.type not in MOVES:
                return refuse(f"op {graph.ops.index(op)} {op.type}: {got}")
            stops.append(op)
            continue
        region[id(op)] = got
        lays[id(op.outputs[0])] = got.out_lay
    if not stops:
        return refuse("the patches are never folded back")
    folds = []
    for op in stops:
        src, ops, y = _fold_ops(graph, op, region, lays)
        fold = plan_fold(src, ops, y, lays[id(src)], positions)
        if isinstance(fold, Refusal):
            return fold
        folds.append(fold)
        for f in fold.ops:
            region.pop(id(f), None)
    clones = list(region.values())
    folding = {id(f.ops[0]) for f in folds}
    for c in clones:
        t = c.op.outputs[0]
        inside = region.keys() | folding
        readers = [r for r in t.consumers if id(r) not in inside and r.type != "SHAPE"]
        if graph.is_graph_output(t) or readers:
            return refuse(f"{t.name!r} is read outside the patches' ops")
    return Branches(unfold, clones, lays, folds)


# -- what the unfold and the folds write, checked against the evidence --------------------------
Written = tuple[str, list[tuple[int, ...]], tuple[int, ...], dict, list[np.ndarray]]


def _unfold_writes(plan: Branches) -> list[Written]:
    u, out = plan.unfold, cast("list[Written]", [])
    xs = tuple(u.x.shape)
    for end, lay, windows in u.ends:
        piece = branch_shape(tuple(end.shape), lay, u.positions)
        for w in windows:
            src = xs
            if w.view is not None:
                out.append(("RESHAPE", [xs], w.view, {}, [np.array(w.view, np.int32)]))
                src = w.view
            consts = [np.array(w.begin, np.int32), np.array(w.size, np.int32)]
            out.append(("SLICE", [src], w.size, {}, consts))
            if tuple(w.size) != piece:
                out.append(("RESHAPE", [w.size], piece, {}, [np.array(piece, np.int32)]))
    return out


def _fold_shapes(fold: Fold, positions: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The branch's patch grid [1, H/fh, W/fw, C] and the join [1, H/fh, W/fw, P C]."""
    _, h, w, c = fold.y.shape
    fh, fw = fold.patch
    return (1, h // fh, w // fw, c), (1, h // fh, w // fw, positions * c)


def _fold_writes(plan: Branches) -> list[Written]:
    out: list[Written] = []
    n = plan.unfold.positions
    for f in plan.folds:
        grid, joined = _fold_shapes(f, n)
        y = tuple(f.y.shape)
        part = branch_shape(tuple(f.src.shape), plan.lays[id(f.src)], n)
        if part != grid:
            out.append(("RESHAPE", [part], grid, {}, [np.array(grid, np.int32)]))
        out.append(("CONCATENATION", [grid] * n, joined, {"axis": 3}, []))
        size = np.array(y[1:3], np.int32)
        out.append(("RESIZE_NEAREST_NEIGHBOR", [joined], (*y[:3], joined[3]), {}, [size]))
        full = (*y[:3], joined[3])
        out.append(("MUL", [full], full, {}, [np.ones(full, np.float32)]))
        w = np.zeros((y[3], 1, 1, joined[3]), np.float32)
        out.append(("CONV_2D", [full], y, {"stride_h": 1, "stride_w": 1, "padding": "VALID"},
                    [w, np.zeros(y[3], np.float32)]))  # fmt: skip
    return out


def _first_unshown(x: Tensor, writes: list[Written]) -> str | None:
    seen = set()
    for op_type, shapes, out, options, consts in writes:
        key = (op_type, tuple(shapes), out)
        if key in seen:
            continue
        seen.add(key)
        ins = [Tensor("t", s, x.dtype) for s in shapes]
        why = unshown(op_type, ins, out, options, consts, every_form=op_type == "CONCATENATION")
        if why:
            return f"the {op_type} {list(out)} it would write is not shown mapped ({why})"
    return None


class RunPatchPositionsApart(Rule):
    """float: a patch unfold (RESHAPE / TRANSPOSE through more than 3 dims > 1), the ops that
    act on each patch position alone, and the fold  =>  per position a window of the unfold's
    source, those ops written once per position, and the fold as a channel join, a nearest
    resize, a 0/1 mask and a one-hot 1 x 1 conv (module docstring). Exact in float."""

    int8_error_steps = 0  # float only: the quantizer calibrates what it writes

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.RESHAPE(p.x, p.const("shape"))

    def check(self, m: Match, *, x: Tensor) -> Refusal | Branches:
        """A refusal, or the unfold, the ops per position and the folds (the plan)."""
        out = m.root.output
        if nontrivial(out.shape) <= MAX_DIMS or nontrivial(x.shape) > MAX_DIMS:
            return NotApplicable("not a reshape into more than 3 dimensions > 1")
        if not is_float(x):
            return NotApplicable("int8: the patches are run apart before quantizing")
        unfold = plan_unfold(m.graph, m.root)
        if isinstance(unfold, Refusal):
            return unfold
        plan = plan_branches(m.graph, unfold)
        if isinstance(plan, Refusal):
            return plan
        why = _first_unshown(unfold.x, [*_unfold_writes(plan), *_fold_writes(plan)])
        return refuse(why) if why else plan

    def rewrite(self, m: Match, *, plan: Branches) -> None:
        write_branches(m, plan)


# -- the rewrite ---------------------------------------------------------------------------------
def _write_unfold(b: Builder, plan: Branches, parts: dict[int, list]) -> None:
    u = plan.unfold
    views: dict[tuple[int, ...], object] = {}
    for end, lay, windows in u.ends:
        piece = branch_shape(tuple(end.shape), lay, u.positions)
        got = []
        for p, w in enumerate(windows):
            src: object = u.x
            if w.view is not None:
                if w.view not in views:
                    views[w.view] = b.RESHAPE(u.x, b.ints(w.view, f"{end.name}/view{len(views)}"),
                                              name=f"{u.x.name}/view{len(views)}")  # fmt: skip
                src = views[w.view]
            name = f"{end.name}/p{p}"
            part = b.SLICE(src, b.ints(w.begin, f"{name}/begin"), b.ints(w.size, f"{name}/size"),
                           name=f"{name}/window")  # fmt: skip
            if tuple(w.size) != piece:
                part = b.RESHAPE(part, b.ints(piece, f"{name}/shape"), name=name)
            got.append(part)
        parts[id(end)] = got


def _write_clone(b: Builder, c: Clone, positions: int, parts: dict[int, list]) -> None:
    op, out = c.op, c.op.outputs[0]
    shape = branch_shape(tuple(out.shape), c.out_lay, positions)
    options = dict(op.options)
    if "new_shape" in options:
        options["new_shape"] = list(shape)
    got = []
    for p in range(positions):
        name = f"{out.name}/p{p}"
        ins: list = []
        for i, t in enumerate(op.inputs):
            if t is not None and id(t) in parts:
                ins.append(parts[id(t)][p])
            elif i in c.cut_consts:
                assert t is not None
                ins.append(b.const(c.cut_consts[i][p], f"{name}/in{i}", t.dtype))
            elif i in c.params:
                ins.append(b.ints([int(v) for v in c.params[i]], f"{name}/param{i}"))
            else:
                ins.append(t)
        got.append(b.op(op.type, *ins, name=name, shape=shape, dtype=out.dtype,
                        options=options, version=op.version))  # fmt: skip
    parts[id(out)] = got


def _write_fold(b: Builder, f: Fold, positions: int, parts: dict[int, list]) -> object:
    grid, joined = _fold_shapes(f, positions)
    _, h, w, c = f.y.shape
    fh, fw = f.patch
    name = f.y.name
    pieces = []
    for p, part in enumerate(parts[id(f.src)]):
        if tuple(part.shape) != grid:
            part = b.RESHAPE(part, b.ints(grid, f"{name}/p{p}/grid"), name=f"{name}/p{p}/grid")
        pieces.append(part)
    full = (1, h, w, positions * c)
    cat = b.CONCATENATION(*pieces, axis=3, name=f"{name}/positions")
    size = b.ints([h, w], f"{name}/size")
    up = b.RESIZE_NEAREST_NEIGHBOR(cat, size, name=f"{name}/patches", shape=full,
                                   align_corners=False, half_pixel_centers=False)  # fmt: skip
    own = f.order[np.arange(h)[:, None] % fh, np.arange(w)[None, :] % fw]  # position per pixel
    mask = (own[:, :, None] == np.arange(positions)[None, None, :]).astype(np.float32)
    mask = np.repeat(mask, c, axis=2).reshape(full)
    kept = b.MUL(up, b.const(mask, f"{name}/own_position"), name=f"{name}/own")
    ones = np.zeros((c, 1, 1, positions * c), np.float32)
    for p in range(positions):
        ones[np.arange(c), 0, 0, p * c + np.arange(c)] = 1.0
    return b.CONV_2D(kept, b.const(ones, f"{name}/sum_weights"),
                     b.const(np.zeros(c, np.float32), f"{name}/sum_bias"), name=f"{name}/folded",
                     shape=tuple(f.y.shape), padding="VALID", stride_w=1, stride_h=1,
                     dilation_w_factor=1, dilation_h_factor=1)  # fmt: skip


def write_branches(m: Match, plan: Branches) -> None:
    """Write the unfold's windows, every op per position and the folds; drop the old ops."""
    g, n = m.graph, plan.unfold.positions
    last = max(plan.folds, key=lambda f: g.ops.index(f.ops[-1]))
    after = g.ops[g.ops.index(last.ops[-1]) + 1 :]
    b = Builder(g, after[0] if after else None, prefix="")
    parts: dict[int, list] = {}
    _write_unfold(b, plan, parts)
    for c in plan.clones:
        _write_clone(b, c, n, parts)
    folded = [(f, _write_fold(b, f, n, parts)) for f in plan.folds]
    b.commit()
    for f, value in folded:
        g.replace_uses(f.y, cast(Value, value).made)
    old = [
        *plan.unfold.ops,
        *(c.op for c in plan.clones),
        *(op for f in plan.folds for op in f.ops),
    ]
    for op in sorted(old, key=g.ops.index, reverse=True):
        if not any(t.consumers or g.is_graph_output(t) for t in op.outputs):
            g.remove_op(op)
    g.toposort()


PATCH_BRANCH_LEGALIZATION: tuple[Rule, ...] = (RunPatchPositionsApart(),)
