"""Horizontal fusion: sibling CONV_2D / FULLY_CONNECTED ops that read the same tensor become one.

Inception blocks (several 1x1 convs on one input) and attention (Q, K, V projections of one
sequence) launch one GEMM per sibling and read the input once each. Merged, the input is read
once by one larger GEMM. The cost model decides per target: merged weights must fit the
on-chip budget, and a split after the merged op must leave fewer kernels than before.
"""

from __future__ import annotations

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
from tflfuse.targets import XNNPACK, Target, cost

_SIBLINGS = ("CONV_2D", "FULLY_CONNECTED")
_GEOMETRY = (
    "padding",
    "stride_h",
    "stride_w",
    "dilation_h_factor",
    "dilation_w_factor",
    "fused_activation_function",
    "keep_num_dims",
    "weights_format",
)


def _geometry(op: Op) -> tuple:
    return (*[op.options.get(k) for k in _GEOMETRY], tuple(op.input(1).shape[1:]))


def _mergeable(op: Op, x: Tensor) -> bool:
    return (
        op.inputs[0] is x
        and x not in op.inputs[1:]
        and common.has_float_params(op)
        and not op.options.get("weights_format", 0)
    )


def _siblings(root: Op, x: Tensor) -> list[Op]:
    """Ops of root's type and geometry that read x as data, in graph order."""
    return [
        op
        for op in x.consumers
        if op.type == root.type and _mergeable(op, x) and _geometry(op) == _geometry(root)
    ]


def _absorbing_concat(graph: Graph, group: list[Op]) -> Op | None:
    """A CONCATENATION on the last axis that reads exactly the group's outputs, each once."""
    outs = [op.output for op in group]
    if any(not common.single_reader(graph, t) for t in outs):
        return None
    reader = outs[0].consumers[0]
    if reader.type != "CONCATENATION" or reader.fused_activation != "NONE":
        return None
    rank = len(outs[0].shape)
    if reader.options.get("axis") not in (-1, rank - 1):
        return None
    if len(reader.inputs) != len(outs) or set(reader.inputs) != set(outs):
        return None
    return reader


class MergeSiblingOps(Rule):
    """W1(x), W2(x), ... Wn(x) (same op type, kernel, stride, padding, dilation, activation)  =>
    W(x) with W = concat(W1..Wn) and b = concat(b1..bn) on the output-channel axis, then
    SPLIT/SPLIT_V back into the n outputs — or writing the CONCATENATION that joined them,
    which disappears. Exact: each output channel is computed from the same weights as before.
    """

    int8_error_steps = 0  # float-only

    def __init__(self, target: Target = XNNPACK) -> None:
        self.target = target

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any(*_SIBLINGS)(p.x, p.const("w"), ...)

    def check(self, m: Match, *, x: Tensor) -> Refusal | tuple[list[Op], Op | None]:
        if not _mergeable(m.root, x):
            return NotApplicable("not a float op with constant weights")
        group = _siblings(m.root, x)
        if len(group) < 2:
            same_type = [op for op in x.consumers if op.type == m.root.type]
            if len(same_type) > 1:
                return refuse(f"sibling {m.root.type} ops differ in kernel, stride or activation")
            return NotApplicable("no sibling reads the same input")
        concat = _absorbing_concat(m.graph, group)
        sizes = [op.output.shape[-1] for op in group]
        weight_bytes = sum(op.input(1).nbytes for op in group)
        reason = cost.horizontal_pays(
            self.target,
            len(group),
            weight_bytes,
            absorbs_concat=concat is not None,
            equal_parts=len(set(sizes)) == 1,
        )
        return refuse(reason) if reason is not None else (group, concat)

    def rewrite(self, m: Match, *, x: Tensor, plan: tuple[list[Op], Op | None]) -> None:
        g = m.graph
        group, concat = plan
        if concat is not None:
            order = {t: i for i, t in enumerate(concat.inputs)}
            group.sort(key=lambda op: order[op.output])
        first = min(group, key=g.ops.index)
        w = np.concatenate([common.weights(op) for op in group], axis=0)
        b = np.concatenate([common.bias(op) for op in group], axis=0)
        outs = [op.output for op in group]
        proto = group[0]
        bld = m.builder(at=first, prefix="")
        merged_out: Tensor | Value
        if concat is not None:
            merged_out = concat.output
        else:
            merged_out = bld.tensor(
                proto.output.name + "_merged", (*proto.output.shape[:-1], w.shape[0])
            )
        merged = bld.op(
            proto.type,
            x,
            bld.const(w, proto.input(1).name + "_merged"),
            bld.const(b, proto.name + "_merged_bias"),
            out=merged_out,
            options=dict(proto.options),
            version=proto.version,
        )
        if concat is None:
            _split(bld, merged, outs)
        bld.commit(remove=[op for op in (concat, *group) if op is not None])


def _split(b: Builder, merged: Value, outs: list[Tensor]) -> None:
    """SPLIT (equal parts) or SPLIT_V of `merged` along its last axis into `outs`."""
    axis = b.const(np.array(len(outs[0].shape) - 1, dtype=np.int32), "split_axis")
    sizes = [t.shape[-1] for t in outs]
    if len(set(sizes)) == 1:
        b.split("SPLIT", axis, merged, outs=outs, num_splits=len(outs))
    else:
        size_splits = b.const(np.array(sizes, dtype=np.int32), "split_sizes")
        b.split("SPLIT_V", merged, size_splits, axis, outs=outs, num_splits=len(outs))


def _pad_kernel(w: np.ndarray, kh: int, kw: int) -> np.ndarray:
    """A [O, h, w, I] kernel centred in a [O, kh, kw, I] one of zeros."""
    top, left = (kh - w.shape[1]) // 2, (kw - w.shape[2]) // 2
    out = np.zeros((w.shape[0], kh, kw, w.shape[3]), dtype=w.dtype)
    out[:, top : top + w.shape[1], left : left + w.shape[2], :] = w
    return out


class MergeSiblingSum(Rule):
    """W_a(x) + W_b(x)  =>  W(x) with W = W_a + W_b, b = b_a + b_b (the ADD's activation moves).

    Both are CONV_2D (or both FULLY_CONNECTED) with the same stride, padding and no activation.
    Convs of different odd kernel sizes merge too when both use SAME padding at stride 1 (the
    smaller kernel is zero-padded to the larger, centred: RepVGG-style re-parametrization).
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.ADD(
            p.any(*_SIBLINGS)(p.x, p.const("wa"), ..., out="ya"),
            p.any(*_SIBLINGS)(p.x, p.const("wb"), ..., out="yb"),
        )

    def check(self, m: Match, *, ya: Tensor, yb: Tensor, x: Tensor) -> Refusal | None:
        a, b = ya.op, yb.op
        if a is b or a.type != b.type:
            return refuse("the two addends are not the same kind of op")
        for op in (a, b):
            if op.fused_activation != "NONE":
                return refuse(f"an addend has fused {op.fused_activation}")
            if not _mergeable(op, x):
                return refuse("an addend's weights are not float constants")
        if m.root.output.shape != ya.shape:
            return refuse("the ADD broadcasts")
        geometry = [k for k in _GEOMETRY if k != "fused_activation_function"]
        if any(a.options.get(k) != b.options.get(k) for k in geometry):
            return refuse("the addends differ in stride, padding or dilation")
        if a.input(1).shape != b.input(1).shape:
            if a.type != "CONV_2D" or a.options.get("padding") != "SAME":
                return refuse("different kernel sizes merge only with SAME padding")
            if (a.options.get("stride_h"), a.options.get("stride_w")) != (1, 1):
                return refuse("different kernel sizes merge only at stride 1")
            if (a.options.get("dilation_h_factor", 1), a.options.get("dilation_w_factor", 1)) != (
                1,
                1,
            ):
                return refuse("different kernel sizes merge only without dilation")
            if any(d % 2 == 0 for d in (*a.input(1).shape[1:3], *b.input(1).shape[1:3])):
                return refuse("an even kernel size has no centre")
        return None

    def rewrite(self, m: Match, *, ya: Tensor, yb: Tensor, x: Tensor) -> None:
        g, a, b, add = m.graph, ya.op, yb.op, m.root
        wa, wb = common.weights(a), common.weights(b)
        if wa.shape != wb.shape:
            kh = max(wa.shape[1], wb.shape[1])
            kw = max(wa.shape[2], wb.shape[2])
            wa, wb = _pad_kernel(wa, kh, kw), _pad_kernel(wb, kh, kw)
        bias = common.bias(a) + common.bias(b)
        out, act = add.output, add.fused_activation
        options = dict(a.options)
        options["fused_activation_function"] = act
        bld = m.builder(at=min((a, b), key=g.ops.index), prefix="")
        bld.op(
            a.type,
            x,
            bld.const(wa + wb, a.input(1).name + "_sum"),
            bld.const(bias, a.name + "_sum_bias"),
            out=out,
            options=options,
            version=max(a.version, b.version),
        )
        bld.commit(remove=add)


def _perm(op: Op) -> list[int] | None:
    t = op.inputs[1] if len(op.inputs) > 1 else None
    data = t.data if t is not None and t.is_constant else None
    return None if data is None else [int(v) for v in data.reshape(-1)]


def _swap_last(perm: list[int]) -> list[int]:
    return [*perm[:-2], perm[-1], perm[-2]]


def _adjoint_reader(t: Tensor) -> tuple[Op, str] | None:
    """(BATCH_MATMUL, flag) when t is read only by one BATCH_MATMUL that can transpose it."""
    if len(t.consumers) != 1:
        return None
    op = t.consumers[0]
    if op.type != "BATCH_MATMUL" or op.inputs[0] is op.inputs[1]:
        return None
    return op, "adj_x" if op.inputs[0] is t else "adj_y"


# HoistLayoutAboveSplit's plan: (base perm, mid dims, split channel dims,
# [(reshape, transpose, adjoint BATCH_MATMUL reader and its flag)])
_HoistPlan = tuple[
    list[int], tuple[int, ...], tuple[int, ...], list[tuple[Op, Op, tuple[Op, str] | None]]
]


class HoistLayoutAboveSplit(Rule):
    """SPLIT(x) -> n x (RESHAPE -> TRANSPOSE(p))  =>  RESHAPE(x) -> TRANSPOSE -> SPLIT(axis 0).

    After merged Q/K/V projections each head split is reshaped and transposed separately
    (2n kernels); one reshape and one transpose of the merged tensor do the same. A part whose
    transpose differs by swapping the last two axes, read by a BATCH_MATMUL (K^T), takes the
    common layout and the matmul's adj flag flips instead. Pure data movement: exact.
    """

    quantized_ok = True
    int8_error_steps = 0  # moves bytes only

    def __init__(self, target: Target = XNNPACK) -> None:
        self.target = target

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.SPLIT(p.const("axis"), p.x)

    def check(self, m: Match, *, x: Tensor, axis: Tensor) -> Refusal | _HoistPlan:
        """A refusal, or the plan of `_hoist_plan`."""
        plan = _hoist_plan(m, x, axis)
        if isinstance(plan, Refusal):
            return plan
        _, mid, split_c, chains = plan
        shape = (*mid, len(chains), *split_c)
        if not cost.layout_fits(self.target, shape):
            return refuse(
                f"the merged head layout {list(shape)} has more non-trivial dimensions than "
                f"the {self.target.name} maps ({self.target.cost.max_nontrivial_dims})"
            )
        return plan

    def rewrite(self, m: Match, *, x: Tensor, plan: _HoistPlan) -> None:
        split = m.root
        base, mid, split_c, chains = plan
        n, rank = len(chains), len(chains[0][1].output.shape)
        m_len = len(mid)
        axis_map = {0: m_len, **{k: k - 1 for k in range(1, m_len + 1)}}
        axis_map.update({k: k for k in range(m_len + 1, rank)})
        q = [axis_map[a] for a in base]
        outs = []
        for _reshape, transpose, reader in chains:
            out = transpose.output
            if reader is not None:
                matmul, flag = reader
                matmul.options[flag] = not matmul.options.get(flag, False)
                out.shape = (*out.shape[:-2], out.shape[-1], out.shape[-2])
            outs.append(out)
        b = m.builder(prefix="")
        shape = (*mid, n, *split_c)
        r = b.tensor(x.name + "_heads", shape, x)
        t = b.tensor(x.name + "_heads_t", tuple(shape[a] for a in q), x)
        b.RESHAPE(x, b.ints(shape, "shape"), out=r, new_shape=list(shape))
        b.TRANSPOSE(r, b.ints(q, "perm"), out=t)
        b.split("SPLIT", b.const(np.array(0, np.int32), "axis"), t, outs=outs, num_splits=n)
        b.commit(remove=[*(op for r_op, t_op, _ in chains for op in (t_op, r_op)), split])


def _hoist_plan(m: Match, x: Tensor, axis: Tensor) -> Refusal | _HoistPlan:
    """(base perm, mid dims, split channel dims, [(reshape, transpose, adj reader)]) or a
    Refusal."""
    split = m.root
    rank = len(x.shape)
    dim = int(np.asarray(axis.data).reshape(-1)[0])
    if rank < 2 or x.shape[0] != 1 or dim % rank != rank - 1:
        return NotApplicable("not a split of the channel axis of a batch-1 tensor")
    chains = []
    for part in split.outputs:
        if not common.single_reader(m.graph, part) or part.consumers[0].type != "RESHAPE":
            return NotApplicable("a part is not only reshaped")
        reshape = part.consumers[0]
        out = reshape.output
        if not common.single_reader(m.graph, out) or out.consumers[0].type != "TRANSPOSE":
            return NotApplicable("a reshaped part is not only transposed")
        chains.append((reshape, out.consumers[0]))
    shapes = {tuple(r.output.shape) for r, _ in chains}
    if len(shapes) != 1:
        return refuse("the parts are reshaped differently")
    shape = next(iter(shapes))
    mid = tuple(x.shape[1:-1])
    per_part = x.shape[-1] // len(chains)
    if shape[: len(mid) + 1] != (1, *mid) or int(np.prod(shape[len(mid) + 1 :])) != per_part:
        return refuse("the reshape does more than split the channel axis")
    found = [_perm(t) for _, t in chains]
    perms = [p for p in found if p is not None and p[0] == 0]
    if len(perms) != len(found):
        return refuse("a transpose moves the batch axis")
    base = max(perms, key=perms.count)
    planned = []
    for (reshape, transpose), p in zip(chains, perms):
        reader = None
        if p != base:
            reader = _adjoint_reader(transpose.output)
            if p != _swap_last(base) or reader is None:
                return refuse("the parts are transposed differently")
        planned.append((reshape, transpose, reader))
    return base, mid, tuple(shape[len(mid) + 1 :]), planned
