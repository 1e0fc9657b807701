"""Edge TPU legalization of head splits: data movement through tensors of more than 3 dims > 1.

Attention blocks split the fused q/k/v projection into heads by data movement alone: timm's ViT
and DeiT (through litert-torch or onnx2tf) write RESHAPE [1, N, 3 C] -> [1, N, 3, H, d],
TRANSPOSE to [3, 1, H, N, d] and one SLICE per q, k, v. Each tensor in the middle has more than 3
dimensions > 1, which the compiler never maps (`delegates/edgetpu.toml` [meta]), so the one Edge
TPU segment ends at the first head split; and no compiled model shows those 5-D permutations.

Every tensor such a chain ends in is a pure gather of the chain's input x: y.flat[i] =
x.flat[g[i]], with g found by running the chain on the indices of x (numpy, no model run). Where
g is an affine window of a view of x (g = base + sum_j i_j s_j, strides in row-major order), y
is one SLICE of x, seen as that view, and a RESHAPE; where it is not (the heads of q: the head
axis steps by d, the token axis by 3 C), y is cut along its outermost dimension > 1 into slabs
that are windows (one head each: a SLICE of x's columns), and the slabs are joined with a
CONCATENATION along that dimension. Every tensor written has at most 3 dimensions > 1; the
chain's own ops go.

Exact: SLICE, RESHAPE and CONCATENATION copy values. On the int8 graph every tensor written
keeps x's quantization (refused where an op of the chain requantizes): bit-identical. On the
float graph (where the `edgetpu` recipe legalizes first, so that what follows the split, the
products of two activations and GELU, is legalized in float too) the same values are copied;
the quantizer then calibrates the pieces and their join like any tensor (the end-to-end check
judges the int8 model). Fires only when every op it writes is accepted by the
compiler's table and, for a form the forms gate asks about (`forms.gated`), shown mapped by
compiled evidence (`heads.form_verdict`): otherwise the chain stays as it is.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from tflfuse.ir import Graph, Op, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, Value, refuse
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets.edgetpu.forms import gated
from tflfuse.targets.edgetpu.heads import form_verdict
from tflfuse.targets.edgetpu.rules import _gated, _kind, _refusal_of

MOVES = frozenset({"RESHAPE", "TRANSPOSE", "SLICE", "STRIDED_SLICE", "SQUEEZE", "EXPAND_DIMS"})
MAX_DIMS = 3  # dimensions > 1 the compiler maps (delegates/edgetpu.toml [meta])


def nontrivial(shape) -> int:
    return sum(1 for d in shape if d > 1)


def _ints(t: Tensor | None) -> list[int] | None:
    if t is None or not t.is_constant or t.is_raw:
        return None
    return [int(v) for v in np.asarray(t.data).reshape(-1)]


def _strided(op: Op, x: np.ndarray) -> np.ndarray | None:
    o = op.options
    if any(int(o.get(f, 0)) for f in ("ellipsis_mask", "new_axis_mask")) or o.get("offset"):
        return None
    begin, end, strides = (_ints(op.inputs[i]) for i in (1, 2, 3))
    if begin is None or end is None or strides is None:
        return None
    keys = []
    for k in range(x.ndim):
        b = None if int(o.get("begin_mask", 0)) >> k & 1 else begin[k]
        e = None if int(o.get("end_mask", 0)) >> k & 1 else end[k]
        keys.append(b if int(o.get("shrink_axis_mask", 0)) >> k & 1 else slice(b, e, strides[k]))
    return np.asarray(x[tuple(keys)])


def move(op: Op, x: np.ndarray) -> np.ndarray | None:
    """What the data-movement op `op` writes when it reads `x` (None: a form not handled)."""
    out = op.outputs[0]
    if op.type in ("RESHAPE", "SQUEEZE", "EXPAND_DIMS"):
        return x.reshape(out.shape)
    if op.type == "TRANSPOSE":
        perm = _ints(op.inputs[1])
        return None if perm is None else np.transpose(x, perm)
    if op.type == "SLICE":
        begin, size = _ints(op.inputs[1]), _ints(op.inputs[2])
        if begin is None or size is None:
            return None
        ends = [x.shape[k] if s == -1 else b + s for k, (b, s) in enumerate(zip(begin, size))]
        return x[tuple(slice(b, e) for b, e in zip(begin, ends))]
    got = _strided(op, x)
    return None if got is None else got.reshape(out.shape)


# -- the chain: its ops, the tensors read after it ----------------------------------------------
@dataclass
class Chain:
    """The data movement downstream of `x`: its ops in graph order, and `ends`, the tensors it
    writes that an op outside it (or the graph's outputs) reads, with their gather maps."""

    x: Tensor
    ops: list[Op]
    ends: list[tuple[Tensor, np.ndarray]]


def _squeeze_only(op: Op) -> bool:
    """A RESHAPE (SQUEEZE, EXPAND_DIMS) that only adds or drops dimensions of 1."""
    if op.type not in ("RESHAPE", "SQUEEZE", "EXPAND_DIMS"):
        return False
    x = op.input(0)  # (each of the three reads its data first)
    dims = [[d for d in t.shape if d > 1] for t in (x, op.outputs[0])]
    return dims[0] == dims[1]


def find_chain(graph: Graph, root: Op) -> Chain | Refusal:
    """The movement ops reachable from `root` (its input is x) through tensors of more than 3
    dimensions > 1, and the RESHAPEs that only drop dimensions of 1 after them: a TRANSPOSE of a
    tensor that fits (an exporter's K^T) is left to the ops that read it."""
    x = root.input(0)  # (a movement op: its data input)
    ops, todo, seen = [], [root], set()
    while todo:
        op = todo.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        ops.append(op)
        out = op.outputs[0]
        todo += [r for r in out.consumers if r.type in MOVES and (nontrivial(out.shape) > MAX_DIMS
                 or _squeeze_only(r))]  # fmt: skip
    ops.sort(key=graph.ops.index)
    values: dict[int, np.ndarray] = {id(x): np.arange(x.size).reshape(x.shape)}
    ends = []
    for op in ops:
        src = values.get(id(op.inputs[0]))
        if src is None:
            return refuse(f"{op.type} reads the chain's tensors and another")
        got = move(op, src)
        if got is None or tuple(got.shape) != tuple(op.outputs[0].shape):
            return refuse(f"{op.type} in a form this rule does not read")
        out = op.outputs[0]
        values[id(out)] = got
        outside = [r for r in out.consumers if id(r) not in seen]
        if outside or graph.is_graph_output(out):
            if nontrivial(out.shape) > MAX_DIMS:
                who = outside[0].type if outside else "the graph's outputs"
                return NotApplicable(f"{who} reads {list(out.shape)}: more than 3 dims > 1")
            ends.append((out, got))
    return Chain(x, ops, ends)


# -- one window of x -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """A SLICE of x seen as `view` (None: x as it is): begin and size per axis of the view."""

    view: tuple[int, ...] | None
    begin: tuple[int, ...]
    size: tuple[int, ...]


def window(g: np.ndarray, x_shape: tuple[int, ...]) -> Window | None:
    """The window of x whose row-major elements are `g`, when `g` is one (see the docstring):
    g = base + sum_j i_j s_j over g's dimensions > 1, s_1 > s_2 > ... > 0, each dividing the one
    before; x seen as axes of strides s_1, s_2, ... (and 1), the window is one SLICE."""
    dims = [d for d in g.shape if d > 1]
    flat = g.reshape(dims)
    base = int(flat.reshape(-1)[0])
    steps = [int(flat[tuple(int(j == k) for j in range(len(dims)))]) - base
             for k in range(len(dims))]  # fmt: skip
    if any(s <= 0 for s in steps) or any(a <= b for a, b in itertools.pairwise(steps)):
        return None
    if dims:
        grid = np.indices(dims).reshape(len(dims), -1)
        if not np.array_equal(flat.reshape(-1), base + np.asarray(steps, np.int64) @ grid):
            return None
    strides, sizes = [math.prod(x_shape), *steps], list(dims)
    if not steps or steps[-1] > 1:  # one element along the innermost, stride-1 axis
        strides, sizes = [*strides, 1], [*sizes, 1]
    if any(a % b for a, b in itertools.pairwise(strides)):
        return None
    view = [a // b for a, b in itertools.pairwise(strides)]
    begin = [base % a // b for a, b in itertools.pairwise(strides)]
    if any(b + s > d for b, s, d in zip(begin, sizes, view)) or nontrivial(view) > MAX_DIMS:
        return None
    if [d for d in view if d > 1] != [d for d in x_shape if d > 1]:
        return Window(tuple(view), tuple(begin), tuple(sizes))
    on_x, size_x = [0] * len(x_shape), [1] * len(x_shape)  # x is the view: slice it as it is
    for k, j in zip(
        [k for k, d in enumerate(x_shape) if d > 1], [j for j, d in enumerate(view) if d > 1]
    ):
        on_x[k], size_x[k] = begin[j], sizes[j]
    return Window(None, tuple(on_x), tuple(size_x))


# -- the plan: each end from x, in windows -------------------------------------------------------
@dataclass(frozen=True)
class EndPlan:
    """How one end of the chain is written: one window, or one per index along `axis` (the
    end's outermost dimension > 1) joined with a CONCATENATION."""

    end: Tensor
    axis: int | None
    windows: tuple[Window, ...]


def plan_end(end: Tensor, g: np.ndarray, x_shape: tuple[int, ...]) -> EndPlan | None:
    whole = window(g, x_shape)
    if whole is not None:
        return EndPlan(end, None, (whole,))
    big = [k for k, d in enumerate(g.shape) if d > 1]
    if len(big) < 2:
        return None
    axis = big[0]
    found = [window(np.take(g, [i], axis=axis), x_shape) for i in range(g.shape[axis])]
    slabs = tuple(w for w in found if w is not None)
    return None if len(slabs) < len(found) else EndPlan(end, axis, slabs)


def _piece_shape(plan: EndPlan) -> tuple[int, ...]:
    shape = list(plan.end.shape)
    if plan.axis is not None:
        shape[plan.axis] = 1
    return tuple(shape)


def unshown(
    op_type: str, ins: list[Tensor], out_shape, options=None, consts=(), *, every_form: bool = False
) -> str | None:
    """Why an op the rule would write is not shown mapped: the op table refuses it, or its form
    is one the forms gate asks about (any form with `every_form`: a rule that writes no join or
    broadcast the predictor would not ask about) and compiled evidence does not show it mapped."""
    why = _refusal_of(op_type, ins, out_shape, options, consts)
    if why:
        return why
    verdict = form_verdict(op_type, ins, out_shape, options or {}, consts)
    if (every_form or gated(verdict.form)) and verdict.answer != "mapped":
        return f"{verdict.answer}: {verdict.reason}"
    return None


def _written(x: Tensor, plan: EndPlan):
    """The ops writing one end, as (type, input tensors, output shape, options, constants)."""
    like = lambda shape: Tensor("t", tuple(shape), x.dtype, quantization=x.quantization)  # noqa: E731
    piece = _piece_shape(plan)
    for w in plan.windows:
        src = x
        if w.view is not None:
            yield "RESHAPE", [x], w.view, {}, [np.array(w.view, np.int32)]
            src = like(w.view)
        consts = [np.array(w.begin, np.int32), np.array(w.size, np.int32)]
        yield "SLICE", [src], w.size, {}, consts
        if tuple(w.size) != piece:
            yield "RESHAPE", [like(w.size)], piece, {}, [np.array(piece, np.int32)]
    if plan.axis is not None:
        ins = [like(piece)] * len(plan.windows)
        yield "CONCATENATION", ins, plan.end.shape, {"axis": plan.axis}, []


def _same_quantization(chain: Chain) -> bool:
    q = chain.x.quantization
    if q is None:  # a float graph
        return all(op.outputs[0].quantization is None for op in chain.ops)
    outs = [op.outputs[0].quantization for op in chain.ops]
    return all(o is not None and o.same_as(q) for o in outs)


class SplitHeadsInWindows(Rule):
    """int8: a chain of RESHAPE / TRANSPOSE / SLICE / STRIDED_SLICE through tensors of more
    than 3 dimensions > 1 (attention's head split)  =>  each tensor the chain ends in, written
    from the chain's input as SLICEs of windows of it (per head), RESHAPEs that only add
    dimensions of 1, and a CONCATENATION: at most 3 dimensions > 1 everywhere (module docstring).

    The root is the chain's first RESHAPE into more than 3 dimensions > 1."""

    quantized_ok = True
    int8_error_steps = 0  # data movement only: codes are copied

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.RESHAPE(p.x, p.const("shape"))

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | tuple[Chain, list[EndPlan]]:
        """A refusal, or the chain and how each of its ends is written (the plan)."""
        out = m.root.output
        if nontrivial(out.shape) <= MAX_DIMS or nontrivial(x.shape) > MAX_DIMS:
            return NotApplicable("not a reshape into more than 3 dimensions > 1")
        if _kind(x) is None:
            return refuse(f"RESHAPE on {x.dtype} with per-channel or no quantization")
        chain = find_chain(m.graph, m.root)
        if isinstance(chain, Refusal):
            return chain
        if not _same_quantization(chain):
            return refuse("an op of the chain requantizes")
        plans = []
        for end, g in chain.ends:
            plan = plan_end(end, g, tuple(x.shape))
            if plan is None:
                return refuse(f"{list(end.shape)} is no window of x, nor joined windows")
            seen = set()
            for op_type, ins, shape, options, consts in _written(x, plan):
                key = (op_type, tuple(tuple(t.shape) for t in ins), tuple(shape))
                if key in seen:
                    continue
                seen.add(key)
                why = unshown(op_type, ins, shape, options, consts)
                if why:
                    return refuse(f"the {op_type} it would write is not shown mapped ({why})")
            plans.append(plan)
        return chain, plans

    def rewrite(self, m: Match, *, plan: tuple[Chain, list[EndPlan]]) -> None:
        chain, ends = plan
        for end in ends:
            _write_end(m, chain.x, end)
        drop_unread(m.graph, chain.ops)


def drop_unread(graph: Graph, chain: list[Op]) -> None:
    """Remove the ops of a rewritten movement chain that nothing reads any more, last first
    (an op the chain's other ends still read stays)."""
    for op in reversed(chain):
        if not any(o is op for o in graph.ops):
            continue
        out = op.outputs[0]
        if not out.consumers and not graph.is_graph_output(out):
            graph.remove_op(op)


def _write_end(m: Match, x: Tensor, plan: EndPlan) -> None:
    producer = plan.end.op  # (an end is written by an op of the chain)
    b = m.builder(at=producer)
    piece, pieces = _piece_shape(plan), []
    for i, w in enumerate(plan.windows):
        src: Tensor | Value = x
        if w.view is not None:
            src = b.RESHAPE(x, b.ints(w.view, f"view{i}/shape"), name=f"view{i}", like=x)
        part = b.SLICE(src, b.ints(w.begin, f"piece{i}/begin"), b.ints(w.size, f"piece{i}/size"),
                       name=f"piece{i}", like=x)  # fmt: skip
        if tuple(w.size) != piece:
            part = b.RESHAPE(part, b.ints(piece, f"piece{i}/shape"), name=f"piece{i}/shaped",
                             like=x)  # fmt: skip
        pieces.append(part)
    result = pieces[0] if plan.axis is None else b.CONCATENATION(*pieces, axis=plan.axis, like=x)
    b.replace(producer, result)


HEAD_SPLIT_LEGALIZATION: tuple[Rule, ...] = (SplitHeadsInWindows(),)
