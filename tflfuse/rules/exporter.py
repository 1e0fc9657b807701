"""What PyTorch/ONNX exporters leave behind: LayerNorm spelled out, head-split layout chains,
clamps written as MINIMUM/MAXIMUM, a padded max pool as PADV2, a constant-weight BATCH_MATMUL.

litert-torch writes `nn.LayerNorm` as twelve ops (MEAN, RESHAPE, SQUARED_DIFFERENCE, MEAN, ADD,
RSQRT, MUL, SUB 0 - .., RESHAPE, MUL, RESHAPE, ADD) and multi-head attention as one fused QKV
projection reshaped, transposed and sliced, each head then reshaped and transposed again. TFLite
has no LayerNorm builtin (nor ERF or SiLU ones), so the rules here shorten what is written out to
the fewest ops of the schema, and turn data movement chains into at most one transpose.

Layout rules work on the index map of a chain: the chain is run on `arange(size)` (numpy), which
says which source element lands where; a map that is a box of the source followed by one strided
transpose is rebuilt as [SLICE] [RESHAPE] [TRANSPOSE] [RESHAPE]. That makes the rewrite exact by
construction (int8 included: they only move bytes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeGuard

import numpy as np

from tflfuse.ir import Graph, Op, Tensor
from tflfuse.rewrite import (
    Builder,
    Match,
    OpPattern,
    PatternBuilder,
    Refusal,
    Rule,
    Value,
    common,
    refuse,
)
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets import Target

_MOVEMENT = ("RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS")
_RESHAPES = ("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
_SCALAR_ELEMENTWISE = ("MUL", "ADD", "SUB", "DIV")
_MAX_MAP_ELEMENTS = 1 << 22  # index maps are int64 arrays: at most 32 MiB


def _only_inside(graph: Graph, tensors: list[Tensor], ops: set[Op]) -> bool:
    """Every tensor is read only by `ops` and none is a model output."""
    return all(not graph.is_graph_output(t) and all(c in ops for c in t.consumers) for t in tensors)


# -- LayerNorm -----------------------------------------------------------------------------------
def _through_reshapes(t: Tensor) -> Tensor:
    """The tensor before any RESHAPE/SQUEEZE/EXPAND_DIMS (the value, whatever its shape)."""
    while t.producer is not None and t.producer.type in _RESHAPES:
        t = t.producer.input(0)
    return t


def _reshape_ops(t: Tensor) -> list[Op]:
    ops = []
    while t.producer is not None and t.producer.type in _RESHAPES:
        ops.append(t.producer)
        t = t.producer.input(0)
    return ops


def _plain(op: Op | None, *types: str) -> TypeGuard[Op]:
    return op is not None and op.type in types and op.fused_activation == "NONE"


def _other(op: Op, t: Tensor) -> Tensor | None:
    a, b = op.input(0), op.input(1)
    return b if a is t else a if b is t else None


def _axes(op: Op) -> set[int] | None:
    t = op.inputs[1] if len(op.inputs) > 1 else None
    if t is None or not t.is_constant:
        return None
    rank = len(op.input(0).shape)
    return {int(a) % rank for a in np.asarray(t.data).reshape(-1)}


class _LayerNorm:
    """What `_match_layer_norm` found: x, eps, and every op of the written-out form."""

    def __init__(self, x: Tensor, eps: float, ops: list[Op]) -> None:
        self.x, self.eps, self.ops = x, eps, ops


def _last_axis_mean(op: Op | None, x: Tensor) -> bool:
    """op is MEAN(x) over the last axis (and size-1 axes only)."""
    if op is None or op.type != "MEAN" or op.inputs[0] is not x or len(x.shape) < 2:
        return False
    axes = _axes(op)
    last = len(x.shape) - 1
    return axes is not None and last in axes and all(x.shape[a] == 1 for a in axes - {last})


def _match_layer_norm(root: Op) -> _LayerNorm | None:
    """x * r + (0 - mean * r) | x * r + NEG(mean * r) | x * r - mean * r, where
    r = rsqrt(mean((x - mean)^2) + eps) and mean = MEAN(x, last axis), reshapes anywhere."""
    if root.type not in ("ADD", "SUB") or len(root.inputs) != 2:
        return None
    first, second = root.operands
    orders = [(first, second)]
    if root.type == "ADD":
        orders.append((second, first))
    for scaled, offset in orders:
        mul = scaled.producer
        if not _plain(mul, "MUL"):
            continue
        a, b = mul.operands
        for x_cand, r_cand in ((a, b), (b, a)):
            if not (_per_row(r_cand, x_cand) and _per_row(offset, x_cand)):
                continue
            found = _layer_norm_from(root, mul, x_cand, _through_reshapes(r_cand), offset)
            if found is not None:
                return found
    return None


def _per_row(t: Tensor, x: Tensor) -> bool:
    """t broadcasts against x as one value per row: its shape is x's with the last axis 1
    (leading 1s may be dropped). Another placement would broadcast along the wrong axis."""
    shape = tuple(t.shape)
    padded = (1,) * (len(x.shape) - len(shape)) + shape
    return len(shape) <= len(x.shape) and padded == (*x.shape[:-1], 1)


def _layer_norm_from(root: Op, mul: Op, x: Tensor, r: Tensor, offset: Tensor) -> _LayerNorm | None:
    rsqrt = r.producer
    if rsqrt is None or rsqrt.type != "RSQRT":
        return None
    add_eps = _through_reshapes(rsqrt.input(0)).producer
    if not _plain(add_eps, "ADD"):
        return None
    var = next((i for i in add_eps.operands if not i.is_constant), None)
    eps = common.scalar_value(next((i for i in add_eps.operands if i.is_constant), None))
    if var is None or eps is None or eps < 0:
        return None
    var_mean = _through_reshapes(var).producer
    if var_mean is None or var_mean.type != "MEAN":
        return None
    sq = var_mean.input(0).producer
    if sq is None or sq.type != "SQUARED_DIFFERENCE" or not _last_axis_mean(var_mean, sq.output):
        return None
    mean_t = _other(sq, x)
    if mean_t is None or not _per_row(mean_t, x):
        return None
    mean = _through_reshapes(mean_t)
    if not _last_axis_mean(mean.producer, x):
        return None
    # the offset: -(mean * r), as 0 - m, NEG(m) (under ADD) or m itself (under SUB)
    off = _through_reshapes(offset)
    neg = off.producer
    if root.type == "ADD":
        if _plain(neg, "SUB") and common.scalar_value(neg.input(0)) == 0.0:
            prod = neg.input(1)
        elif neg is not None and neg.type == "NEG":
            prod = neg.input(0)
        else:
            return None
        negation = [neg]
    else:
        prod, negation = off, []
    pm = _through_reshapes(prod).producer
    if not _plain(pm, "MUL") or pm.input(0).shape != pm.input(1).shape:
        return None
    operands = {id(_through_reshapes(i)) for i in pm.operands}
    if operands != {id(r), id(mean)}:
        return None
    ops = [mean.op, sq, var_mean, add_eps, rsqrt, mul, pm, *negation, root]
    scale = [t for t in mul.operands if t is not x]  # x itself may be read elsewhere
    for t in (mean_t, var, rsqrt.input(0), *scale, offset, prod, *pm.operands):
        ops.extend(_reshape_ops(t))
    return _LayerNorm(x, float(eps), list(dict.fromkeys(ops)))


class ShortenLayerNorm(Rule):
    """x * r + (0 - mean * r)  (the twelve ops litert-torch writes for nn.LayerNorm, gamma/beta
    left to the ops after it)  =>  (x - mu) * rsqrt(MEAN((x - mu)^2) + eps), mu = MEAN(x).

    Seven ops: MEAN(keep_dims), SQUARED_DIFFERENCE, MEAN(keep_dims), ADD eps, RSQRT, SUB, MUL; no
    RESHAPEs, no zero-minus. TFLite has no LayerNorm builtin, so this is the shortest exact form
    in its ops. The same function: (x - mu) r = x r - mu r, equal up to float rounding. Float
    only (the recipes rewrite before quantizing). Reductions over the last axis (size-1 axes such
    as the batch may be included: they change nothing).
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any("ADD", "SUB")(p.a, p.b)

    def check(self, m: Match) -> Refusal | _LayerNorm:
        ln = _match_layer_norm(m.root)
        if ln is None:
            return NotApplicable("not a LayerNorm written out")
        if not common.is_float(ln.x) or ln.x.shape != m.root.output.shape:
            return refuse("the LayerNorm input is not float or is broadcast")
        inner = [t for op in ln.ops if op is not m.root for t in op.outputs]
        if not _only_inside(m.graph, inner, set(ln.ops)):
            return refuse("a LayerNorm intermediate (mean or variance) is read elsewhere")
        return ln

    def rewrite(self, m: Match, *, plan: _LayerNorm) -> None:
        x, b = plan.x, m.builder()
        axis = b.ints([len(x.shape) - 1], "axis")
        reduced = (*x.shape[:-1], 1)
        mu = b.MEAN(x, axis, name="mean", shape=reduced, like=x, keep_dims=True)
        sq = b.SQUARED_DIFFERENCE(x, mu, name="sq", like=x)
        var = b.MEAN(sq, axis, name="var", shape=reduced, like=x, keep_dims=True)
        eps = b.const(np.array(plan.eps, np.float32), "eps")
        r = b.RSQRT(b.ADD(var, eps, name="var_eps", like=x), name="rsqrt", like=x)
        centred = b.SUB(x, mu, name="centred", like=x)
        b.replace(m.root, b.MUL(centred, r, fused_activation_function=m.root.fused_activation))


# -- layout chains -------------------------------------------------------------------------------
def _movement_map(source: Tensor, chain: list[Op]) -> np.ndarray | None:
    """For each element of the chain's output, the flat index of the source element it copies
    (None for dynamic shapes, non-constant parameters or a source too large to map)."""
    if source.size > _MAX_MAP_ELEMENTS or not source.shape:
        return None
    tensors = [source, *(op.output for op in chain)]
    if any(t.shape_signature is not None and -1 in t.shape_signature for t in tensors):
        return None
    idx = np.arange(source.size, dtype=np.int64).reshape(source.shape)
    for op in chain:
        if op.type in _RESHAPES:
            idx = idx.reshape(op.output.shape)
        elif op.type == "TRANSPOSE":
            perm = op.inputs[1]
            if perm is None or not perm.is_constant:
                return None
            idx = idx.transpose([int(p) for p in np.asarray(perm.data).reshape(-1)])
        elif op.type == "SLICE":
            begin, size = (
                np.asarray(t.data).reshape(-1) if t is not None and t.is_constant else None
                for t in op.inputs[1:3]
            )
            if begin is None or size is None:
                return None
            index = tuple(
                slice(int(b), None if int(s) == -1 else int(b) + int(s))
                for b, s in zip(begin, size)
            )
            idx = idx[index]
        else:
            return None
        if tuple(idx.shape) != tuple(op.output.shape):
            return None
    return idx


def _strided_axes(f: np.ndarray) -> list[tuple[int, int]] | None:
    """(length, stride) of each axis, inner to outer, when f (a permutation of arange(n)) is
    arange(n) reshaped and transposed once; adjacent axes that move together are merged."""
    n = f.size
    axes: list[tuple[int, int]] = []
    block = 1
    while block < n:
        stride = int(f[block] - f[0])
        length = 1
        while block * (length + 1) <= n and np.array_equal(
            f[block * length : block * (length + 1)], f[:block] + length * stride
        ):
            length += 1
        if length == 1 or n % (block * length):
            return None
        axes.append((length, stride))
        block *= length
    return axes


class _Plan:
    """The canonical form of a movement map: SLICE box, the shape to transpose, the perm."""

    def __init__(self, begin, box, dims, perm) -> None:
        self.begin, self.box, self.dims, self.perm = list(begin), list(box), list(dims), list(perm)

    def ops(self, source_shape, out_shape) -> list[str]:
        ops = []
        shape = list(source_shape)
        if self.box != shape:
            ops.append("SLICE")
            shape = self.box
        if self.perm != list(range(len(self.perm))):
            if self.dims != shape:
                ops.append("RESHAPE")
            ops.append("TRANSPOSE")
            shape = [self.dims[p] for p in self.perm]
        if shape != list(out_shape):
            ops.append("RESHAPE")
        return ops


def _partition(shape, sizes) -> list[list[int]] | None:
    """shape's dims cut into consecutive groups whose products are `sizes` (1s ride along)."""
    groups: list[list[int]] = []
    dims = list(shape)
    i = 0
    for size in sizes:
        group, prod = [], 1
        while i < len(dims) and prod < size:
            group.append(dims[i])
            prod *= dims[i]
            i += 1
        if prod != size:
            return None
        groups.append(group)
    if any(d != 1 for d in dims[i:]) or not groups:
        return None
    groups[-1].extend(dims[i:])
    return groups


def _split_axes(plan: _Plan, groups: list[list[int]]) -> _Plan:
    """The plan with input axis a of `dims` split into groups[a] (the output follows)."""
    start, offset = [], 0
    for g in groups:
        start.append(offset)
        offset += len(g)
    dims = [d for g in groups for d in g]
    perm = [start[a] + k for a in plan.perm for k in range(len(groups[a]))]
    return _Plan(plan.begin, plan.box, dims, perm)


def _refined(plan: _Plan, out_shape) -> list[_Plan]:
    """The plan, and the same movement with axes split to match the box (no RESHAPE before the
    transpose) or the output (none after), whichever exist."""

    def to_box(p: _Plan) -> _Plan | None:
        groups = _partition(p.box, p.dims)
        return None if groups is None else _split_axes(p, groups)

    def to_out(p: _Plan) -> _Plan | None:
        transposed = [p.dims[a] for a in p.perm]
        out_groups = _partition(out_shape, transposed)
        if out_groups is None:
            return None
        groups = [out_groups[p.perm.index(a)] for a in range(len(p.dims))]
        return _split_axes(p, groups)

    plans = [plan]
    for first in (to_box, to_out):
        p = first(plan)
        if p is not None:
            plans.append(p)
            q = (to_out if first is to_box else to_box)(p)
            if q is not None:
                plans.append(q)
    return plans


def _plan(idx: np.ndarray, source_shape) -> _Plan | None:
    """Decompose a movement map into box + one transpose (fewest axes), or None."""
    coords = np.unravel_index(idx.reshape(-1), tuple(source_shape))
    begin = [int(c.min()) for c in coords]
    box = [int(c.max()) - b + 1 for c, b in zip(coords, begin)]
    if math.prod(box) != idx.size:
        return None
    local = np.ravel_multi_index(tuple(c - b for c, b in zip(coords, begin)), tuple(box))
    if idx.size == 1 or np.array_equal(local, np.arange(idx.size)):
        return _Plan(begin, box, box, list(range(len(box))))
    axes = _strided_axes(local)
    if axes is None:
        return None
    out_axes = list(reversed(axes))  # outer to inner, as the output is laid out
    order = sorted(range(len(out_axes)), key=lambda j: -out_axes[j][1])
    dims = [out_axes[j][0] for j in order]
    perm = [order.index(j) for j in range(len(out_axes))]
    check = np.arange(idx.size).reshape(dims).transpose(perm).reshape(-1)
    if not np.array_equal(check, local):
        return None
    return _Plan(begin, box, dims, perm)


def _squeezed(p: _Plan) -> _Plan:
    """The same movement with the transpose over its dimensions > 1 only (its size-1 axes hold
    no elements to move): [16, 1, 1, 16] with perm [3, 1, 2, 0] is [16, 16] with perm [1, 0]."""
    keep = [i for i, d in enumerate(p.dims) if d > 1] or [len(p.dims) - 1]
    return _Plan(
        p.begin, p.box, [p.dims[i] for i in keep], [keep.index(a) for a in p.perm if a in keep]
    )


def _inner_only(shape, limit: int) -> bool:
    """Whether every dimension > 1 of `shape` is among its `limit` innermost: the Edge TPU maps
    only those ("only the 3 innermost dimensions may have a size greater than 1", Coral's model
    requirements; `targets.edgetpu.predict._outer_dimension`)."""
    return all(d == 1 for d in list(shape)[: max(len(shape) - limit, 0)])


def _transpose_fits(p: _Plan, limit: int) -> bool:
    """The plan's transpose reads and writes tensors a target of `limit` non-trivial innermost
    dimensions maps (no transpose at all fits)."""
    if p.perm == sorted(p.perm):
        return True
    out = [p.dims[a] for a in p.perm]
    return _nontrivial(p.dims) <= limit and _inner_only(p.dims, limit) and _inner_only(out, limit)


def _written(p: _Plan) -> list[list[int]]:
    """The shapes the plan's SLICE, RESHAPE and TRANSPOSE write before its last RESHAPE."""
    return [p.box, p.dims, [p.dims[a] for a in p.perm]]


def _best_plan(idx: np.ndarray, source_shape, out_shape, limit: int | None) -> _Plan | None:
    """The candidate with the fewest ops (then fewest axes) whose transpose fits `limit`: at most
    `limit` dimensions > 1, all among the innermost `limit` (a candidate's transpose is also
    tried over its dimensions > 1 alone, `_squeezed`)."""
    base = _plan(idx, source_shape)
    if base is None:
        return None
    candidates = _refined(base, out_shape)
    if limit is not None:
        candidates += [_squeezed(p) for p in candidates]
    fits = [p for p in candidates if limit is None or _transpose_fits(p, limit)]
    if not fits:
        return None
    return min(fits, key=lambda p: (len(p.ops(source_shape, out_shape)), len(p.dims)))


def _same_layout_q(tensors: list[Tensor]) -> bool:
    """All float, or all the same quantized type and parameters (movement keeps the bytes)."""
    first = tensors[0]
    for t in tensors[1:]:
        if t.dtype != first.dtype:
            return False
        qa, qb = first.quantization, t.quantization
        if (qa is None or qa.is_empty()) != (qb is None or qb.is_empty()):
            return False
        if qa is not None and not qa.is_empty() and not qa.same_as(qb):
            return False
    return True


def _emit(b: Builder, source: Tensor, plan: _Plan, out: Tensor) -> Tensor | Value:
    """The plan's ops from source; the last one's result is to replace `out`."""
    steps = plan.ops(source.shape, out.shape) or ["RESHAPE"]  # a copy when nothing moves
    current: Tensor | Value = source
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        if step == "SLICE":
            begin, size = b.ints(plan.begin, "begin"), b.ints(plan.box, "size")
            current = b.SLICE(current, begin, size, name="slice", like=source)
        elif step == "TRANSPOSE":
            current = b.TRANSPOSE(current, b.ints(plan.perm, "perm"), name="transpose", like=source)
        else:
            shape = list(out.shape if last else plan.dims)
            current = b.RESHAPE(current, b.ints(shape, "shape"), name="reshape", like=source,
                                new_shape=shape)  # fmt: skip
    return current


def _nontrivial(shape) -> int:
    return sum(1 for d in shape if d > 1)


def _chain_up(root: Op, graph: Graph, types=(*_MOVEMENT, "SLICE")) -> list[Op]:
    """root and the single-reader movement ops above it, source first."""
    chain = [root]
    while True:
        t = chain[0].input(0)
        op = t.producer
        if op is None or op.type not in types or not common.single_reader(graph, t):
            break
        chain.insert(0, op)
    return chain


class CanonicalizeLayoutChain(Rule):
    """A chain of RESHAPE / TRANSPOSE / SQUEEZE / EXPAND_DIMS / SLICE  =>  the same element
    movement as [SLICE] [RESHAPE] [TRANSPOSE] [RESHAPE], when that is fewer ops.

    E.g. litert-torch's K^T: RESHAPE [1,32,1,64]->[32,4,16], TRANSPOSE, RESHAPE [1,4,32,16],
    TRANSPOSE, RESHAPE [4,16,32]  =>  TRANSPOSE [1,32,64]->[64,1,32], RESHAPE [4,16,32] (axes that
    move together are merged, so the transpose has as few as it can). The map is computed on an
    index array, so the new form moves every element where the old one did: exact, int8 too.
    With `max_nontrivial_dims` (the Edge TPU: 3) a transpose needing more is refused.
    """

    quantized_ok = True
    int8_error_steps = 0

    def __init__(
        self,
        max_nontrivial_dims: int | None = None,
        kept: Callable[[Sequence[Op]], bool] | None = None,
    ) -> None:
        self.max_nontrivial_dims = max_nontrivial_dims
        self.kept = kept  # the target's `layout_chain_kept`: a chain it keeps as written

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any(*_MOVEMENT, "SLICE")(p.x, ...)

    def _plan(self, m: Match) -> tuple[list[Op], _Plan] | Refusal:
        out = m.root.output
        readers = out.consumers
        goes_on = len(readers) == 1 and readers[0].type in (*_MOVEMENT, "SLICE")
        if goes_on and not m.graph.is_graph_output(out):
            return NotApplicable("the chain goes on")
        chain = _chain_up(m.root, m.graph)
        if len(chain) < 2:
            return NotApplicable("a single layout op")
        if self.kept is not None and self.kept(chain):
            return NotApplicable("the target keeps the chain as written (every op shown mapped)")
        source = chain[0].input(0)
        tensors = [source, *(op.output for op in chain)]
        if not _same_layout_q(tensors):
            return refuse("the chain changes type or quantization")
        idx = _movement_map(source, chain)
        if idx is None:
            return refuse("the chain has dynamic or non-constant shapes, or is too large")
        if _plan(idx, source.shape) is None:
            return refuse("the chain's element order is not one slice and one transpose")
        plan = _best_plan(idx, source.shape, out.shape, self.max_nontrivial_dims)
        if plan is None:
            return refuse(
                f"the one transpose would need more than {self.max_nontrivial_dims}"
                " non-trivial dimensions"
            )
        limit = self.max_nontrivial_dims
        outside = (
            limit is not None
            and not all(_inner_only(op.output.shape, limit) for op in chain[:-1])
            and all(_inner_only(shape, limit) for shape in [*_written(plan), out.shape])
        )  # the chain's own tensors go outside the innermost, the plan's and its output do not
        if len(plan.ops(source.shape, out.shape)) >= len(chain) and not outside:
            return NotApplicable("the chain is already as short as it gets")
        return chain, plan

    def check(self, m: Match) -> Refusal | tuple[list[Op], _Plan]:
        """A refusal, or the chain and the plan that replaces it."""
        return self._plan(m)

    def rewrite(self, m: Match, *, plan: tuple[list[Op], _Plan]) -> None:
        chain, layout = plan
        source, out = chain[0].input(0), m.root.output
        if not layout.ops(source.shape, out.shape) and common.forward(m.graph, out, source):
            return  # the chain moves nothing: its readers read the source
        b = m.builder()
        b.replace(m.root, _emit(b, source, layout, out))


def _free_reshape_after(t: Tensor) -> bool:
    """A RESHAPE written to t would merge into what reads t: a layout op, or a scalar
    element-wise op whose one reader is a layout op (SinkReshapeBelowScalarOp moves it)."""
    if len(t.consumers) != 1:
        return False
    op = t.consumers[0]
    if op.type in _MOVEMENT:
        return True
    if op.type in _SCALAR_ELEMENTWISE and _scalar_operand(op, t) is not None:
        nxt = op.output.consumers
        return len(nxt) == 1 and nxt[0].type in _MOVEMENT
    return False


def _scalar_operand(op: Op, t: Tensor) -> Tensor | None:
    a, b = op.input(0), op.input(1)
    other = b if a is t else a if b is t else None
    if other is None or not other.is_constant or other.size != 1:
        return None
    return other


class SliceBeforeLayout(Rule):
    """SLICE_i(layout(x)) for every reader of a RESHAPE/TRANSPOSE chain  =>  RESHAPE(SLICE_i(x)),
    when each slice is a box of x (no transpose needed).

    litert-torch splits a fused QKV projection as RESHAPE [1,32,192]->[32,1,3,64], TRANSPOSE,
    then three SLICEs; each slice is a contiguous block of the projection's channels. Slicing the
    projection first drops the TRANSPOSE, and the RESHAPEs merge with the per-head ones after.
    Fires only when that leaves fewer ops. Exact (moves bytes, int8 too).
    """

    quantized_ok = True
    int8_error_steps = 0

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any(*_MOVEMENT)(p.x, ...)

    def _plans(self, m: Match) -> tuple[Tensor, list[tuple[Op, _Plan]]] | Refusal:
        out = m.root.output
        readers = out.consumers
        if m.graph.is_graph_output(out) or not readers or any(r.type != "SLICE" for r in readers):
            return NotApplicable("not read by SLICEs only")
        chain = _chain_up(m.root, m.graph, _MOVEMENT)
        source = chain[0].input(0)
        if not _same_layout_q([source, *(op.output for op in chain), *(r.output for r in readers)]):
            return refuse("the chain changes type or quantization")
        plans = []
        for reader in readers:
            if reader.inputs[0] is not out:
                return NotApplicable("the layout output is a slice parameter")
            idx = _movement_map(source, [*chain, reader])
            plan = None if idx is None else _best_plan(idx, source.shape, reader.output.shape, None)
            if plan is None or plan.perm != list(range(len(plan.perm))):
                return refuse("a slice is not one block of the layout's input")
            plans.append((reader, plan))
        before = len(chain) + len(readers)
        after = sum(
            len(plan.ops(source.shape, r.output.shape)) - int(_free_reshape_after(r.output))
            for r, plan in plans
        )
        if after >= before:
            return refuse(f"slicing first would leave {after} ops for {before}")
        return source, plans

    def check(self, m: Match) -> Refusal | tuple[Tensor, list[tuple[Op, _Plan]]]:
        """A refusal, or the chain's source and each SLICE's plan."""
        return self._plans(m)

    def rewrite(self, m: Match, *, plan: tuple[Tensor, list[tuple[Op, _Plan]]]) -> None:
        source, plans = plan
        for reader, piece in plans:
            b = m.builder(at=reader)
            b.replace(reader, _emit(b, source, piece, reader.output))


def _reshaped_input(op: Op) -> Tensor | None:
    return next(
        (t for t in op.operands if t.producer is not None and t.producer.type == "RESHAPE"), None
    )


class SinkReshapeBelowScalarOp(Rule):
    """OP(RESHAPE(x), c)  =>  RESHAPE(OP(x, c)), OP in MUL/ADD/SUB/DIV and c one number, when a
    layout op reads the result: the two RESHAPEs then meet and merge. Element-wise with a
    scalar, so the shape does not matter: exact. Float only."""

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any(*_SCALAR_ELEMENTWISE)(p.a, p.b)

    def check(self, m: Match) -> Refusal | Tensor:
        """A refusal, or the RESHAPE's output the op reads."""
        root = m.root
        r = _reshaped_input(root)
        if r is None or _scalar_operand(root, r) is None:
            return NotApplicable("not an element-wise op of a RESHAPE and a number")
        readers = root.output.consumers
        if (
            len(readers) != 1
            or readers[0].type not in _MOVEMENT
            or m.graph.is_graph_output(root.output)
        ):
            return NotApplicable("no layout op reads the result")
        if not common.single_reader(m.graph, r):
            return refuse("the RESHAPE is read elsewhere")
        if not (common.is_float(r) and common.is_float(root.output)):
            return refuse("not float")
        return r

    def rewrite(self, m: Match, *, plan: Tensor) -> None:
        root, r = m.root, plan
        x, out = r.op.input(0), root.output
        b = m.builder(after=root)
        inner = b.tensor("unreshaped", x.shape, dtype=out.dtype)
        shape = b.ints(out.shape, "shape")
        for i, t in enumerate(root.inputs):
            if t is r:
                b.set_input(root, i, x)
        b.set_output(root, 0, inner)
        b.RESHAPE(inner, shape, out=out, new_shape=list(out.shape))
        b.commit()


class SoftmaxThroughReshape(Rule):
    """RESHAPE(SOFTMAX(RESHAPE(x)))  =>  SOFTMAX(x), when the reshapes keep the last axis and
    give x's shape back (litert-torch's [4,32,32] -> [1,4,32,32] -> SOFTMAX -> [4,32,32]).
    SOFTMAX works along the last axis only: the same values. Exact, int8 too."""

    quantized_ok = True
    int8_error_steps = 0

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.RESHAPE(p.SOFTMAX(p.RESHAPE(p.x, ..., out="inner"), out="soft"), ...)

    def check(self, m: Match, *, x: Tensor, inner: Tensor, soft: Tensor) -> Refusal | None:
        out = m.root.output
        if out.shape != x.shape or not x.shape:
            return refuse("the reshapes do not give the SOFTMAX input's shape back")
        if inner.shape[-1] != x.shape[-1]:
            return refuse("the reshape changes the softmax axis")
        if not _same_layout_q([x, inner]) or not _same_layout_q([soft, out]):
            return refuse("a reshape changes type or quantization")
        return None

    def rewrite(self, m: Match, *, x: Tensor, soft: Tensor) -> None:
        b = m.builder()
        b.replace(m.root, b.SOFTMAX(x, options=soft.op.options))


# -- clamps, padded max pool, constant matmul ----------------------------------------------------
_CLAMPS = {(0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1", (0.0, math.inf): "RELU"}


def _clamp(root: Op) -> tuple[Tensor, str] | None:
    """(x, activation) when root = MINIMUM(MAXIMUM(x, lo), hi), MAXIMUM(MINIMUM(x, hi), lo),
    MINIMUM(RELU(x), 6) or MAXIMUM(x, 0), for the RELU-family bounds."""
    if root.type not in ("MINIMUM", "MAXIMUM") or len(root.inputs) != 2:
        return None
    first, second = root.operands
    for t, c in ((first, second), (second, first)):
        bound = common.scalar_value(c)
        if bound is None or t.is_constant:
            continue
        inner = t.producer
        lo, hi = (-math.inf, bound) if root.type == "MINIMUM" else (bound, math.inf)
        x = t
        if inner is not None and inner.type in ("MINIMUM", "MAXIMUM") and inner.type != root.type:
            p, q = inner.operands
            for u, d in ((p, q), (q, p)):
                other = common.scalar_value(d)
                if other is not None and not u.is_constant:
                    lo, hi = (other, bound) if root.type == "MINIMUM" else (bound, other)
                    x = u
                    break
        elif inner is not None and inner.type == "RELU" and root.type == "MINIMUM":
            lo, x = 0.0, inner.input(0)
        act = _CLAMPS.get((lo, hi))
        if act is not None:
            return x, act
    return None


class RecognizeClamp(Rule):
    """MINIMUM(MAXIMUM(x, 0), 6) | MAXIMUM(MINIMUM(x, 6), 0) | MINIMUM(RELU(x), 6)  =>  RELU6(x);
    the same with -1, 1  =>  RELU_N1_TO_1(x); MAXIMUM(x, 0)  =>  RELU(x).

    How exporters write clamp/hardtanh (and the relu6 inside hard-swish). One op instead of two,
    which then fuses into the producer (FuseActivationIntoProducer) and lets RecognizeHardSwish
    see relu6(x + 3). Exact. Float only.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any("MINIMUM", "MAXIMUM")(p.a, p.b)

    def check(self, m: Match) -> Refusal | tuple[Tensor, str]:
        found = _clamp(m.root)
        if found is None:
            return NotApplicable("not a RELU-family clamp")
        x, _ = found
        if not common.is_float(x) or x.shape != m.root.output.shape:
            return refuse("the clamp input is not float or is broadcast")
        return found

    def rewrite(self, m: Match, *, plan: tuple[Tensor, str]) -> None:
        x, activation = plan
        b = m.builder()
        b.replace(m.root, b.op(activation, x))


class ReciprocalSqrtAsRsqrt(Rule):
    """DIV(c, SQRT(y))  =>  RSQRT(y)  (c = 1),  MUL(RSQRT(y), c)  (another single number c).

    onnx2tf 2.6 writes a normalization's 1 / sqrt(var + eps) this way (MobileViT: 21 of them).
    Quantized as written, the DIV reads the SQRT's int8 tensor, whose range starts at 0, so a
    small variance quantizes to the zero point and the int8 DIV kernel refuses to divide by it
    (`div.cc: data[i] != zero_point`): litert-quantizer's int8 of the file fails in the
    interpreter. RSQRT is the same function in one op (within float32 round-off of the quotient)
    and its int8 form has no divisor. Float only; the SQRT must have no other reader.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.DIV(p.const("c"), p.SQRT(p.y, out="sqrt"))

    def check(self, m: Match, *, y: Tensor, c: Tensor, sqrt: Tensor) -> Refusal | None:
        if not common.is_float(y) or not common.is_float(m.root.output):
            return NotApplicable("not float")
        if c.size != 1 or c.is_raw:
            return refuse("the numerator is not one number")
        if m.root.output.shape != y.shape or not common.single_reader(m.graph, sqrt):
            return refuse("the quotient is broadcast, or the SQRT has other readers")
        return None

    def rewrite(self, m: Match, *, c: Tensor, y: Tensor) -> None:
        b = m.builder()
        k = float(np.asarray(c.data, np.float64).reshape(-1)[0])
        r = b.RSQRT(y, name="rsqrt", like=y)
        b.replace(m.root, r if k == 1.0 else b.MUL(r, b.scalar(k, "c", like=y)))


def _non_negative(t: Tensor) -> bool:
    """t >= 0 everywhere: it comes from a RELU/RELU6 (or fused one), or it is int8/uint8 whose
    zero point is its lowest value (real range starts at 0)."""
    op = t.producer
    if op is not None and (
        op.type in ("RELU", "RELU6") or op.fused_activation in ("RELU", "RELU6")
    ):
        return True
    q = t.quantization
    if q is not None and t.is_quantized and not q.per_channel and t.np_dtype is not None:
        zp = int(np.asarray(q.zero_point).reshape(-1)[0])
        return zp == int(np.iinfo(t.np_dtype).min)
    return False


def _pad_value(pad: Op) -> float | None:
    """The real value PADV2 pads with, or None. An integer constant is a value in the input's
    quantized domain: dequantized with its own parameters, else with the input's."""
    c = pad.inputs[2] if len(pad.inputs) > 2 else None
    if c is None or not c.is_constant or c.size != 1:
        return None
    v = float(np.asarray(c.data).reshape(-1)[0])
    if c.dtype in ("INT8", "UINT8"):
        q = c.quantization if c.is_quantized else pad.input(0).quantization
        if q is None or q.scale is None or q.per_channel:
            return None
        v = float(q.scale.reshape(-1)[0]) * (v - int(np.asarray(q.zero_point).reshape(-1)[0]))
    return v


class LegalizePadV2BeforeMaxPool(Rule):
    """PADV2(x, pads, v) -> MAX_POOL_2D(VALID)  =>  MAX_POOL_2D(x, SAME) when pads are SAME's and
    v never wins (v <= x everywhere), else PAD(x, pads) -> MAX_POOL_2D when x >= 0 and v <= 0.

    PyTorch's MaxPool2d(padding=p) is exported as PADV2 with -inf (or the int8 minimum): the
    Edge TPU table has no PADV2 and XNNPACK does not delegate it. A max over a window is the
    same whether the border holds v or 0 when no real value is below 0 (after RELU, or an int8
    tensor whose zero point is its minimum), provided every window holds a real value. Exact
    (moves bytes, int8 too).
    """

    quantized_ok = True
    int8_error_steps = 0

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MAX_POOL_2D(p.PADV2(p.x, p.const("paddings"), ..., out="padded"))

    def _plan(self, m: Match, x: Tensor, padded: Tensor, paddings: Tensor) -> str | Refusal:
        pool, pad = m.root, padded.op
        if pool.options.get("padding") != "VALID":
            return refuse("the max pool already pads")
        value = _pad_value(pad)
        if value is None:
            return refuse("the PADV2 value is not a constant number")
        if len(x.shape) != 4 or x.dtype != padded.dtype:
            return refuse("the PADV2 input is not an NHWC tensor of the pool's type")
        if not _same_layout_q([x, padded]):
            return refuse("the PADV2 changes quantization")
        pads = np.asarray(paddings.data).reshape(-1, 2).tolist()
        if len(pads) != 4 or pads[0] != [0, 0] or pads[3] != [0, 0]:
            return refuse("the PADV2 pads the batch or channel axis")
        kh, kw = common.kernel_hw(pool)
        if max(pads[1]) >= kh or max(pads[2]) >= kw:
            return refuse("a window would hold only padding")
        sh, sw = pool.options.get("stride_h", 1), pool.options.get("stride_w", 1)
        same = tuple(pads[1]) == common.pads_for_same(x.shape[1], kh, sh) and tuple(
            pads[2]
        ) == common.pads_for_same(x.shape[2], kw, sw)
        lowest = value <= -3.0e38 or (x.is_quantized and _is_type_min(pad.input(2)))
        nonneg = _non_negative(x)
        if same and (lowest or (nonneg and value <= 0.0)):
            return "same"
        if nonneg and value <= 0.0:
            # the engine's check, in this rule's words
            if not common.single_reader(m.graph, padded):
                return refuse("the PADV2 output is also read by an op that needs its value")
            return "pad"
        return refuse(
            f"the PADV2 pads with {value:g} and the input may be negative: zeros could win"
        )

    def check(self, m: Match, *, x: Tensor, padded: Tensor, paddings: Tensor) -> Refusal | str:
        """A refusal, or "same" (the pool pads) or "pad" (a PAD with zeros)."""
        return self._plan(m, x, padded, paddings)

    def rewrite(self, m: Match, *, x: Tensor, padded: Tensor, paddings: Tensor, plan: str) -> None:
        if plan == "same":
            m.root.options["padding"] = "SAME"
            m.root.set_input(0, x)
            return
        pad = padded.op
        b = m.builder(at=pad)
        b.replace(pad, b.PAD(x, paddings, shape=padded.shape, like=padded))


def _is_type_min(c: Tensor) -> bool:
    dt = c.np_dtype
    if dt is None or dt.kind not in "iu":
        return False
    return int(np.asarray(c.data).reshape(-1)[0]) == int(np.iinfo(dt).min)


class BatchMatmulToFullyConnected(Rule):
    """BATCH_MATMUL(x, W) with W a constant [K, N] (or [.., 1, K, N])  =>
    FULLY_CONNECTED(x, W^T, keep_num_dims) ( adj_y: W is [N, K] already ).

    x @ W = x @ (W^T)^T: the same products. onnx2tf writes MatMul with weights this way; the
    Edge TPU maps FULLY_CONNECTED but has no BATCH_MATMUL. Float only.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.BATCH_MATMUL(p.x, p.w)

    def check(self, m: Match, *, x: Tensor, w: Tensor) -> Refusal | np.ndarray:
        """A refusal, or the constant operand (the plan)."""
        if x.is_constant and not w.is_constant:
            return refuse("the constant is the left operand: FULLY_CONNECTED takes it on the right")
        weights = common.float_constant(w)
        if weights is None:
            return NotApplicable("no constant float operand")
        if not common.is_float(x) or x.is_constant:
            return refuse("the activation operand is not float")
        if m.root.options.get("adj_x"):
            return refuse("adj_x transposes the activation operand")
        if (
            weights.ndim < 2
            or any(d != 1 for d in weights.shape[:-2])
            or weights.ndim > len(x.shape)
        ):
            return refuse(f"the constant {list(weights.shape)} is batched")
        n = weights.shape[-2] if m.root.options.get("adj_y") else weights.shape[-1]
        if tuple(m.root.output.shape) != (*x.shape[:-1], n):
            return refuse("the product broadcasts to another shape")
        return weights

    def rewrite(self, m: Match, *, x: Tensor, plan: np.ndarray) -> None:
        data = plan
        w2 = data.reshape(data.shape[-2:])
        weights = w2 if m.root.options.get("adj_y") else w2.T
        b = m.builder()
        filt = b.const(np.ascontiguousarray(weights), "weights", "FLOAT32")
        fc = b.FULLY_CONNECTED(
            x, filt, None, shape=m.root.output.shape, fused_activation_function="NONE",
            weights_format=0, keep_num_dims=True, asymmetric_quantize_inputs=False,
        )  # fmt: skip
        b.replace(m.root, fc)


def _widened(
    size: int, kernel: int, stride: int, before: int, after: int
) -> tuple[int, int] | None:
    """(k', zero rows before) such that SAME with kernel k' reads, for every output, the window
    PAD(before, after) + VALID kernel `kernel` reads, plus zero-weighted rows; None if none does."""
    out = (size + before + after - kernel) // stride + 1
    if -(-size // stride) != out:
        return None
    for wide in range(kernel, kernel + 2 * stride + 1):
        top, _ = common.pads_for_same(size, wide, stride)
        lead = top - before
        if lead >= 0 and lead + kernel <= wide:
            return wide, lead
    return None


class FoldPadByWidenedKernel(Rule):
    """PAD(x, (1, 1)) -> DEPTHWISE_CONV_2D 3x3 stride 2 VALID  =>  DEPTHWISE_CONV_2D 4x4 SAME,
    the kernel given a zero row and column after (in general: the smallest kernel whose SAME
    windows cover the PAD's windows, the extra taps zero).

    PyTorch pads both sides; at stride 2 on an even size SAME pads only after, so the 3x3
    windows do not line up (FoldPadIntoConv refuses). A 4x4 SAME window starts one row earlier,
    the same place as PyTorch's, and its fourth row and column get weight 0: the same sums,
    exact. It trades the PAD's copy of the activation for 16/9 of the depthwise multiply-adds.
    Measured (benchmarks/exporter_rules_bench.py, 64x64x96 block, after/before p50): float
    plain kernels 0.96-0.98, float XNNPACK 1.11-2.8, int8 XNNPACK 1.34, int8 plain kernels 2.03
    (the 3x3 kernels are the optimized ones). So no pipeline runs it; it is kept, tested, for a
    runtime where the PAD is the expensive part. Float only.
    """

    int8_error_steps = 0  # float-only

    def __init__(self, types: tuple[str, ...] = ("DEPTHWISE_CONV_2D",)) -> None:
        self.types = types

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any("CONV_2D", "DEPTHWISE_CONV_2D")(
            p.any("PAD", "PADV2")(p.x, p.const("paddings"), ..., out="padded"), ...
        )

    def _plan(
        self, m: Match, x: Tensor, padded: Tensor, paddings: Tensor
    ) -> tuple[tuple[int, int], tuple[int, int]] | Refusal:
        op, pad = m.root, padded.op
        if op.options.get("padding") != "VALID" or op.inputs[0] is not padded:
            return NotApplicable("the conv pads already or reads the PAD as weights")
        if not common.is_float(x) or len(x.shape) != 4 or not common.has_float_params(op):
            return NotApplicable("not a float NHWC conv with constant weights")
        if pad.type == "PADV2" and common.scalar_value(pad.inputs[2]) != 0.0:
            return NotApplicable("the PAD value is not zero")
        pads = np.asarray(paddings.data).reshape(-1, 2).tolist()
        if len(pads) != 4 or pads[0] != [0, 0] or pads[3] != [0, 0]:
            return NotApplicable("the PAD touches the batch or channel axis")
        kh, kw = common.kernel_hw(op)
        sh, sw = op.options.get("stride_h", 1), op.options.get("stride_w", 1)
        if (sh, sw) == (1, 1) or any(
            op.options.get(k, 1) != 1 for k in ("dilation_h_factor", "dilation_w_factor")
        ):
            return NotApplicable("not a strided, undilated conv")
        same = (
            common.pads_for_same(x.shape[1], kh, sh),
            common.pads_for_same(x.shape[2], kw, sw),
        )
        if (tuple(pads[1]), tuple(pads[2])) == same:
            return NotApplicable("the PAD is SAME's own (FoldPadIntoConv folds it)")
        if op.type not in self.types:
            return refuse(
                f"a {op.type} with a widened kernel does more multiply-adds than the PAD costs"
            )
        h = _widened(x.shape[1], kh, sh, *pads[1])
        w = _widened(x.shape[2], kw, sw, *pads[2])
        if h is None or w is None:
            return refuse("no SAME window of any size lines up with the PAD's windows")
        return h, w

    def check(
        self, m: Match, *, x: Tensor, padded: Tensor, paddings: Tensor
    ) -> Refusal | tuple[tuple[int, int], tuple[int, int]]:
        """A refusal, or the widened kernel and its leading zero rows, per axis."""
        return self._plan(m, x, padded, paddings)

    def rewrite(
        self, m: Match, *, x: Tensor, plan: tuple[tuple[int, int], tuple[int, int]]
    ) -> None:
        (wh, lh), (ww, lw) = plan
        op = m.root
        w = common.weights(op)
        kh, kw = w.shape[1], w.shape[2]
        wide = np.pad(w, [(0, 0), (lh, wh - kh - lh), (lw, ww - kw - lw), (0, 0)])
        b = m.builder()
        b.set_weights(op, wide)
        b.set_input(op, 0, x)
        op.options["padding"] = "SAME"
        b.commit()


def exporter_rules(target: Target) -> tuple[Rule, ...]:
    """The exporter rules a target's level-2 pipeline runs, each where it was measured to pay
    (benchmarks/exporter_rules_bench.py; `cpu` is the plain kernels): fewer kernels everywhere.
    A constant BATCH_MATMUL as FULLY_CONNECTED where the target's
    `batch_matmul_as_fully_connected` says so. FoldPadByWidenedKernel is in no pipeline: it is
    slower wherever it matters (see its docstring). PADV2 and BATCH_MATMUL are Edge TPU
    legalizations too (half-pixel resizes are in targets/edgetpu/rules.py); a layout chain keeps
    within the target's `max_nontrivial_dims` (the Edge TPU: 3)."""
    rules: list[Rule] = [
        ShortenLayerNorm(),
        RecognizeClamp(),
        ReciprocalSqrtAsRsqrt(),
        SliceBeforeLayout(),
        SinkReshapeBelowScalarOp(),
        CanonicalizeLayoutChain(
            target.cost.max_nontrivial_dims,
            target.layout_chain_kept,
        ),
        SoftmaxThroughReshape(),
        LegalizePadV2BeforeMaxPool(),
    ]
    if target.batch_matmul_as_fully_connected:
        rules.append(BatchMatmulToFullyConnected())
    return tuple(rules)
