"""Edge TPU legalization: an NCHW island an exporter leaves between two TRANSPOSEs, computed in
the layout it came from.

onnx2tf 2.6 keeps some blocks of an NHWC graph in NCHW: its MobileNetV3 squeeze-excite blocks
read TRANSPOSE(x, [0, 3, 1, 2]), apply HARD_SWISH, MEAN over axes [2, 3] (a reduction over W,
14 "channels" that are not a multiple of 4, and a form "krr" no compiled model shows mapped),
scale the map by the gate [1, C, 1, 1] and TRANSPOSE back with [0, 2, 3, 1]. Elementwise ops,
a MEAN that keeps its dims and a product with a tensor of one non-trivial dimension compute the
same values in either layout, so the island can be computed on x itself: the two TRANSPOSEs go,
the MEAN reduces the axes they map to ([1, 2]: the global pool of an NHWC map, shown mapped),
an operand of one non-trivial dimension is reshaped (its data order is the same), and a small
island tensor (at most one non-trivial dimension: the pooled vector) read outside is reshaped
back. No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tflfuse.ir import Graph, Op, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, refuse
from tflfuse.rewrite.common import NotApplicable

UNARY = frozenset(
    {"HARD_SWISH", "RELU", "RELU6", "RELU_0_TO_1", "RELU_N1_TO_1", "LOGISTIC", "TANH", "ABS",
     "NEG", "LEAKY_RELU", "GELU", "QUANTIZE", "DEQUANTIZE"}
)  # fmt: skip
BINARY = frozenset({"MUL", "ADD", "SUB", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE"})
MOST_OPS = 64  # an island is a block, not a network


def _nontrivial(shape) -> int:
    return sum(1 for d in shape if d > 1)


def _per_tensor(t: Tensor) -> bool:
    q = t.quantization
    return q is None or np.asarray(q.scale).size <= 1


def _requantizes(op: Op) -> bool:
    a, b = op.input(0).quantization, op.output.quantization
    return a is not None and b is not None and not a.same_as(b)


def _const_axes(op: Op) -> list[int] | None:
    axes = op.inputs[1] if len(op.inputs) > 1 else None
    if axes is None or axes.data is None:
        return None
    rank = len(op.input(0).shape)  # a reduction's input
    return sorted({int(a) % rank for a in np.asarray(axes.data).reshape(-1)})


@dataclass
class Island:
    """The ops computed in the transposed layout (graph order), the TRANSPOSEs that leave it,
    the tensors inside (full and small) and the outside operands to reshape."""

    ops: list[Op] = field(default_factory=list)
    exits: list[Op] = field(default_factory=list)
    inside: dict[int, Tensor] = field(default_factory=dict)


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _admit(op: Op, island: Island, rank: int) -> str | None:
    """Why `op`, reading an island tensor, cannot be computed in the other layout, or None."""
    out = op.outputs[0] if len(op.outputs) == 1 else None
    if out is None or len(out.shape) != rank or not _per_tensor(out):
        return f"{op.type} writes no single {rank}-D per-tensor quantized tensor"
    if op.type in UNARY:
        return None
    if op.type in BINARY:
        for t in op.inputs:
            if t is None or id(t) in island.inside:
                continue
            if t.size > 1 and (len(t.shape) != rank or _nontrivial(t.shape) > 1):
                return f"{op.type} reads {t.name!r} {list(t.shape)} of more than one axis"
            if not _per_tensor(t):
                return f"{op.type} reads {t.name!r} quantized per channel"
        return None
    if op.type == "MEAN":
        if _const_axes(op) is None or not op.options.get("keep_dims"):
            return "a MEAN that drops dims or has computed axes"
        return None
    return f"{op.type} is not elementwise"


def find_island(entry: Op, graph: Graph) -> Island | str:
    """The island TRANSPOSE `entry` opens, or why it cannot be computed in x's layout."""
    perm = [int(v) for v in np.asarray(entry.input(1).data).reshape(-1)]
    inv, rank = _inverse(perm), len(perm)
    island = Island()
    island.inside[id(entry.output)] = entry.output
    todo = [entry.output]
    while todo:
        t = todo.pop()
        if any(t is o for o in graph.outputs):
            return f"{t.name!r} is a model output"
        for op in t.consumers:
            if op in island.ops or op in island.exits:
                continue
            if (
                op.type == "TRANSPOSE"
                and op.inputs[0] is t
                and op.input(1).data is not None  # TRANSPOSE(x, perm)
            ):
                back = [int(v) for v in np.asarray(op.input(1).data).reshape(-1)]
                if back == inv:
                    island.exits.append(op)
                    continue
            if _nontrivial(t.shape) <= 1 and id(t) != id(entry.output):
                continue  # a small tensor read outside: reshaped back for that reader
            why = _admit(op, island, rank)
            if why:
                return why
            island.ops.append(op)
            island.inside[id(op.output)] = op.output
            todo.append(op.output)
            if len(island.ops) > MOST_OPS:
                return f"more than {MOST_OPS} ops"
    if not island.exits:
        return "no TRANSPOSE back to x's layout"
    island.ops.sort(key=graph.ops.index)
    return island


class ComputeNchwIslandInNhwc(Rule):
    """TRANSPOSE(x, p) -> elementwise ops, MEANs keeping dims, products with one-axis tensors ->
    TRANSPOSE(., p^-1)  =>  the same ops on x (MEAN axes a -> p[a], a one-axis operand reshaped),
    both TRANSPOSEs gone (the module docstring). Float: exact. int8: the same kernels on the same
    codes in another order; a MEAN reducing other axes may take another CPU kernel path, within
    one step (as `CutMeanIntoShownPieces`)."""

    quantized_ok = True
    int8_error_steps = 1  # a MEAN over other axes: another kernel path's rounding

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.TRANSPOSE(p.x, p.const("permutation"))

    def check(self, m: Match, *, x: Tensor, permutation: Tensor) -> Refusal | Island:
        """A refusal, or the island (the plan)."""
        perm = [int(v) for v in np.asarray(permutation.data).reshape(-1)]
        if perm == sorted(perm) or len(perm) != len(x.shape):
            return NotApplicable("not a permutation of x's axes")
        if any(m.root.output is o for o in m.graph.outputs) or not m.root.output.consumers:
            return NotApplicable("the TRANSPOSE writes a model output: no island after it")
        island = find_island(m.root, m.graph)
        if isinstance(island, str):
            return refuse(f"its output is not an island the other layout computes: {island}")
        if any(_requantizes(op) for op in [m.root, *island.exits]):
            return refuse(
                "a TRANSPOSE of the island changes the quantization (its kernel does not)"
            )
        if not island.ops:
            return NotApplicable("a TRANSPOSE pair with nothing between (CancelTransposePair's)")
        return island

    def rewrite(self, m: Match, *, x: Tensor, permutation: Tensor, plan: Island) -> None:
        island = plan
        graph, entry = m.graph, m.root
        perm = [int(v) for v in np.asarray(permutation.data).reshape(-1)]
        inv = _inverse(perm)
        old_shapes = {id(t): t.shape for t in island.inside.values()}

        def moved(shape) -> tuple[int, ...]:
            return tuple(shape[inv[j]] for j in range(len(shape)))

        for op in island.ops:  # graph order: producers first
            self._operands(m, op, island, moved)
            if op.type == "MEAN":
                axes = sorted(perm[a] for a in _const_axes(op) or ())  # the check read them
                op.inputs = [op.inputs[0], graph.add_constant(
                    f"{op.output.name}/axes_nhwc", np.asarray(axes, np.int32))]  # fmt: skip
            op.output.shape = moved(op.output.shape)
            op.output.shape_signature = None
        for op in island.ops:  # small tensors read outside: reshaped back
            t = op.output
            outside = [c for c in t.consumers if c not in island.ops and c not in island.exits]
            if outside and t.shape != old_shapes[id(t)]:
                back = graph.add_tensor(f"{t.name}/nchw", old_shapes[id(t)], t.dtype,
                                        quantization=t.quantization)  # fmt: skip
                shape = graph.add_constant(f"{t.name}/nchw_shape",
                                           np.asarray(old_shapes[id(t)], np.int32))  # fmt: skip
                for c in outside:
                    c.inputs = [back if i is t else i for i in c.inputs]
                graph.add_op("RESHAPE", [t, shape], [back], {"new_shape": list(back.shape)},
                             after=op)  # fmt: skip
        for op in island.exits:  # the island's last op writes the exit's tensor where it can
            t, out = op.input(0), op.output
            producer = t.producer
            graph.remove_op(op)
            if producer is not None and not t.consumers and t.shape == out.shape:
                producer.outputs = [out if o is t else o for o in producer.outputs]
            else:
                graph.replace_uses(out, t)
        graph.replace_uses(entry.output, x)
        graph.remove_op(entry)

    @staticmethod
    def _operands(m: Match, op: Op, island: Island, moved) -> None:
        """A one-axis operand from outside the island, reshaped to the other layout."""
        graph = m.graph
        ins = list(op.inputs)
        for i, t in enumerate(ins):
            if t is None or id(t) in island.inside or t.size <= 1 or op.type not in BINARY:
                continue
            shape = moved(t.shape)
            if t.is_constant:
                ins[i] = graph.add_constant(f"{t.name}/nhwc", np.asarray(t.data).reshape(shape),
                                            t.dtype, t.quantization)  # fmt: skip
                continue
            new = graph.add_tensor(f"{t.name}/nhwc", shape, t.dtype, quantization=t.quantization)
            const = graph.add_constant(f"{t.name}/nhwc_shape", np.asarray(shape, np.int32))
            graph.add_op("RESHAPE", [t, const], [new], {"new_shape": list(shape)}, before=op)
            ins[i] = new
        op.inputs = ins


class ReduceBeforeTranspose(Rule):
    """MEAN(TRANSPOSE(x, perm), axes), the kept axes in x's order  =>  MEAN(x, perm[axes])
    (keep_dims: and a RESHAPE to the NCHW shape, the same data order).

    A classifier head exported from NCHW (EdgeNeXt through litert-torch) moves its last NHWC map
    to NCHW and averages H and W there: a MEAN "krr" no compiled model shows mapped, where the
    global pool of the NHWC map ("rrk") is shown. The same elements are averaged and the kept
    ones come out in the same order: float the same up to the sum's order; int8 the same codes
    summed in int32 and rounded once (bit-identical)."""

    quantized_ok = True
    int8_error_steps = 0  # the same integer sum, one rounding

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MEAN(p.TRANSPOSE(p.x, p.const("perm"), out="moved"), p.const("axes"))

    def check(self, m: Match, *, x: Tensor, moved: Tensor, axes: Tensor) -> Refusal | list[int]:
        """A refusal, or the axes of x to average (the plan)."""
        perm = [int(v) for v in np.asarray(moved.op.input(1).data).reshape(-1)]
        rank = len(moved.shape)
        reduced = sorted({int(a) % rank for a in np.asarray(axes.data).reshape(-1)})
        kept = [perm[a] for a in range(rank) if a not in reduced]
        if kept != sorted(kept):
            return NotApplicable("the kept axes come out in another order")
        if len(moved.consumers) != 1:
            return refuse("the TRANSPOSE is read elsewhere too")
        return sorted(perm[a] for a in reduced)

    def rewrite(self, m: Match, *, x: Tensor, plan: list[int]) -> None:
        b = m.builder()
        out = m.root.output
        keep = bool(m.root.options.get("keep_dims"))
        shape = tuple(1 if a in plan else d for a, d in enumerate(x.shape)) if keep else out.shape
        mean = b.MEAN(x, b.ints(plan, "axes"), shape=tuple(shape), like=out, keep_dims=keep)
        if tuple(shape) != tuple(out.shape):  # keep_dims: the same data, in the NCHW shape
            mean = b.RESHAPE(mean, b.ints(tuple(out.shape), "shape"), like=out)
        b.replace(m.root, mean)


NHWC_LEGALIZATION: tuple[Rule, ...] = (ComputeNchwIslandInNhwc(), ReduceBeforeTranspose())
