"""Cleanup passes: constant folding (evaluated by the interpreter itself), common-subexpression
elimination and duplicate-constant merging. Dead ops and unused tensors/buffers go with
`tflfuse.rewrite.passes.DeadCodeElimination` (the writer stores only buffers that tensors still
use).

Folding runs each foldable op in a one-op model through the TFLite interpreter, so the folded
value is exactly what the kernel would have computed at run time — no second implementation of
TFLite semantics here.
"""

from __future__ import annotations

import numpy as np

from tflfuse.device.interpreter import make_interpreter
from tflfuse.errors import TflfuseError
from tflfuse.ir import NUMPY_DTYPES, Graph, Model, Op, Tensor, flatbuffer
from tflfuse.rewrite import SIDE_EFFECTS, Pass

# Kept on purpose: DEQUANTIZE of float16/int8 weights is how compressed models stay small.
_NEVER_FOLD = SIDE_EFFECTS | {
    "DEQUANTIZE",
    "CUSTOM",
    "DELEGATE",
    "RANDOM_UNIFORM",
    "RANDOM_STANDARD_NORMAL",
    "MULTINOMIAL",
}
# Two of these with the same inputs may still give different results: a READ_VARIABLE sees the
# ASSIGN_VARIABLEs between them (the resource handle is the same tensor), a random op draws anew.
_NEVER_MERGE = SIDE_EFFECTS | {
    "READ_VARIABLE",
    "RANDOM_UNIFORM",
    "RANDOM_STANDARD_NORMAL",
    "MULTINOMIAL",
}
# A folded constant may not grow the model by more than this over the inputs it replaces.
_MAX_GROWTH_BYTES = 1 << 20


def _foldable(op: Op) -> bool:
    if op.type in _NEVER_FOLD or not op.outputs:
        return False
    if any(t.dtype not in NUMPY_DTYPES for t in op.outputs):
        return False
    real = [t for t in op.inputs if t is not None]
    if op.type == "SHAPE" and len(real) == 1:
        return True
    return bool(real) and all(t.is_constant and not t.is_raw for t in real)


def _static_shape(t: Tensor) -> bool:
    signature = t.shape_signature
    return signature is None or all(d >= 0 for d in signature)


def evaluate(op: Op) -> list[np.ndarray]:
    """Run one op whose inputs are constants in the interpreter; its outputs as arrays."""
    graph = Graph("fold")
    clones: dict[Tensor, Tensor] = {}
    for t in op.inputs:
        if t is not None and t not in clones:
            clones[t] = Tensor(t.name, t.shape, t.dtype, t.data, t.quantization)
    outs = [Tensor(t.name + "_out", t.shape, t.dtype, None, t.quantization) for t in op.outputs]
    clone = Op(
        op.type,
        [None if t is None else clones[t] for t in op.inputs],
        outs,
        dict(op.options),
        version=op.version,
        options_type=op.options_type,
    )
    graph.ops = [clone]
    graph.tensors = [*clones.values(), *outs]
    graph.outputs = list(outs)
    interp = make_interpreter(flatbuffer.to_bytes(Model([graph])), delegate="none")
    interp.invoke()
    return [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()]


class FoldConstants(Pass):
    """OP(constants...)  =>  the constant it computes; SHAPE(x) of a static x  =>  its shape.

    A model whose dynamic batch was pinned to 1 thereby loses its SHAPE -> GATHER/STRIDED_SLICE ->
    PACK -> RESHAPE chains. Results larger than the inputs by more than 1 MiB are not folded
    (a broadcast would bloat the model).
    """

    def __init__(self) -> None:
        self._failed: set[int] = set()

    def run(self, graph: Graph) -> int:
        folded = 0
        for op in list(graph.ops):
            if id(op) in self._failed or not _foldable(op):
                continue
            if op.type == "SHAPE":
                if not self._fold_shape(graph, op):
                    continue
                folded += 1
                continue
            out_bytes = sum(t.nbytes for t in op.outputs)
            in_bytes = sum(t.nbytes for t in op.inputs if t is not None)
            if out_bytes > in_bytes + _MAX_GROWTH_BYTES:
                continue
            try:
                values = evaluate(op)
            except (TflfuseError, ValueError, RuntimeError):
                self._failed.add(id(op))
                continue
            self._replace(graph, op, values)
            folded += 1
        return folded

    @staticmethod
    def _replace(graph: Graph, op: Op, values: list[np.ndarray]) -> None:
        outs = list(op.outputs)
        graph.remove_op(op)
        for t, value in zip(outs, values):
            if value.size == t.size and _static_shape(t):
                value = value.reshape(t.shape)  # keep the declared rank (scalars come back 1-D)
            t.data = np.array(value, dtype=NUMPY_DTYPES[t.dtype], order="C")
            t.shape = tuple(value.shape)
            t.shape_signature = None

    def _fold_shape(self, graph: Graph, op: Op) -> bool:
        x = op.input(0)
        if not _static_shape(x):
            return False
        out = op.output
        self._replace(graph, op, [np.asarray(x.shape, dtype=NUMPY_DTYPES[out.dtype])])
        return True


def _quant_key(t: Tensor) -> tuple:
    q = t.quantization
    if q is None or q.is_empty():
        return ()
    scale, zero = (None if v is None else np.asarray(v).tobytes() for v in (q.scale, q.zero_point))
    return (scale, zero, q.axis)


class MergeDuplicateConstants(Pass):
    """Constants with the same type, shape, bytes and quantization become one tensor."""

    def run(self, graph: Graph) -> int:
        seen: dict[tuple, Tensor] = {}
        merged = 0
        protected = set(graph.inputs) | set(graph.outputs)
        for t in list(graph.tensors):
            if t.data is None or not t.is_constant or t.producer is not None:
                continue
            if t in protected or not t.consumers:
                continue
            key = (t.dtype, t.shape, t.data.tobytes(), _quant_key(t))
            first = seen.setdefault(key, t)
            if first is not t:
                graph.replace_uses(t, first)
                merged += 1
        return merged


def _op_key(op: Op) -> tuple:
    return (
        op.type,
        op.custom_code,
        op.version,
        repr(sorted(op.options.items())),
        op.custom_options,
        tuple(id(t) for t in op.inputs),
        tuple((t.dtype, t.shape, _quant_key(t)) for t in op.outputs),
    )


class EliminateCommonSubexpressions(Pass):
    """Two ops of the same type, options and inputs  =>  the first; readers of the second read it.

    Never merged: ops with side effects, READ_VARIABLE (an ASSIGN_VARIABLE may come between),
    random ops, ops reading a variable tensor. Run after MergeDuplicateConstants so equal
    constants count as the same input.
    """

    def run(self, graph: Graph) -> int:
        seen: dict[tuple, Op] = {}
        removed = 0
        for op in list(graph.ops):
            if op.type in _NEVER_MERGE or op.type.startswith("RANDOM_"):
                continue
            if not op.outputs or op.intermediates:
                continue
            if any(t is not None and t.is_variable for t in op.inputs):
                continue  # reads mutable state
            key = _op_key(op)
            first = seen.setdefault(key, op)
            if first is op or any(graph.is_graph_output(t) for t in op.outputs):
                continue
            for dup, keep in zip(op.outputs, first.outputs):
                graph.replace_uses(dup, keep)
            removed += 1
        return removed
