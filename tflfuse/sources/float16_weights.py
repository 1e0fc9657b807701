"""Float models that store their weights as float16 (MediaPipe, many vendors), read as float32.

The TFLite converter's float16 option, MediaPipe and many vendors ship float models at half size:
each weight is a FLOAT16 constant read through a DEQUANTIZE (some through a DENSIFY first, when the
constant is stored sparse), and everything is computed in float32. Every float16 number is exactly
a float32 number, so replacing each such read by a float32 constant computes the same function,
bit for bit:

  DEQUANTIZE(w: FLOAT16 constant)            =>  w as a FLOAT32 constant
  DEQUANTIZE(DENSIFY(w: sparse FLOAT16))     =>  w densified, as a FLOAT32 constant

After that the model is the float model it always was, and the rules and the quantizer see plain
float32 weights (litert-quantizer 0.11 fails on weights behind DEQUANTIZE). `widen` returns what it
did; `tflite_frontend` checks the widened model against the original on the interpreter.

Sparse constants use TFLite's format (schema `SparsityParameters`): dimensions visited in
`traversal_order`, each DENSE (every index 0..dense_size-1) or SPARSE_CSR (the indices of one row
are `array_indices[array_segments[p]:array_segments[p+1]]`), the last `len(block_map)` traversal
dimensions being block dimensions of the original dimensions `block_map` names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tflfuse.errors import TflfuseError
from tflfuse.ir import Model, Tensor
from tflfuse.ir.summary import _sparsity, float16_source
from tflfuse.rewrite import DeadCodeElimination

_DENSE, _SPARSE_CSR = 0, 1  # schema DimensionType


@dataclass
class Widened:
    """What `widen` did: DEQUANTIZE ops of float16 constants removed (`sparse` of them read
    through DENSIFY) and how many float16 constants became float32."""

    dequantize_ops: int = 0
    sparse: int = 0
    constants: int = 0

    def describe(self) -> str:
        sparse = f", {self.sparse} of them sparse (DENSIFY)" if self.sparse else ""
        return (
            f"the source stores its weights as float16 ({self.constants} constants read through"
            f" DEQUANTIZE{sparse}): a float model; the weights were widened exactly to float32"
        )


def dense_value(t: Tensor) -> np.ndarray:
    """The value of a FLOAT16 constant as a float32 array of its shape (sparse ones densified)."""
    sparsity = _sparsity(t)
    raw = np.asarray(t.data)
    if sparsity is None:
        if t.is_raw:
            raw = np.frombuffer(raw.tobytes(), np.float16).reshape(t.shape)
        return raw.astype(np.float32)
    values = np.frombuffer(raw.tobytes(), np.float16).astype(np.float32)
    return densify(values, sparsity, t.shape, t.name)


def _listed(v: list | np.ndarray | None) -> list | np.ndarray:
    """A schema vector field (None, a list or a numpy array) as something to iterate."""
    return [] if v is None else v


def _vector(v: object | None) -> np.ndarray:
    values = getattr(v, "values", None)
    return np.zeros(0, np.int64) if values is None else np.asarray(values, np.int64)


def densify(values: np.ndarray, sparsity: object, shape: tuple[int, ...], name: str) -> np.ndarray:
    """The dense array of shape `shape` that TFLite's sparse format `sparsity` stores as `values`.

    Level by level along the traversal order, every stored element carries its index at that
    level (`pos`, what the next CSR level's segments are indexed by) and its coordinate along
    each traversal dimension visited so far; the values are stored in that traversal order."""
    order = [int(d) for d in _listed(getattr(sparsity, "traversalOrder", None))]
    block_map = [int(d) for d in _listed(getattr(sparsity, "blockMap", None))]
    levels = list(_listed(getattr(sparsity, "dimMetadata", None)))
    if len(order) != len(levels) or len(order) != len(shape) + len(block_map):
        raise TflfuseError(f"sparse constant {name!r}: inconsistent sparsity parameters")
    pos = np.zeros(1, np.int64)
    coords: list[np.ndarray] = []
    for level in levels:
        if int(level.format) == _DENSE:
            size = int(level.denseSize)
            coords = [np.repeat(c, size) for c in coords]
            coords.append(np.tile(np.arange(size, dtype=np.int64), len(pos)))
            pos = (pos[:, None] * size + np.arange(size, dtype=np.int64)).reshape(-1)
        else:
            segments, indices = _vector(level.arraySegments), _vector(level.arrayIndices)
            starts, ends = segments[pos], segments[pos + 1]
            counts = ends - starts
            coords = [np.repeat(c, counts) for c in coords]
            offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
                np.cumsum(counts) - counts, counts
            )
            pos = np.repeat(starts, counts) + offsets
            coords.append(indices[pos])
    by_dim = {d: c for d, c in zip(order, coords)}
    full = [by_dim[d].copy() for d in range(len(shape))]
    for i, d in enumerate(block_map):
        block = int(levels[order.index(len(shape) + i)].denseSize)
        full[d] = full[d] * block + by_dim[len(shape) + i]
    if pos.size > values.size:
        raise TflfuseError(
            f"sparse constant {name!r}: more positions than its {values.size} values"
        )
    dense = np.zeros(shape, np.float32)
    dense[tuple(full)] = values[: pos.size]  # stored in traversal order, as TFLite reads them
    return dense


def widen(model: Model) -> Widened:
    """Replace every float16 weight read (see the module docstring) in every subgraph by a
    float32 constant; ops and constants left unread are removed."""
    done = Widened()
    for graph in model.subgraphs:
        widened: dict[int, Tensor] = {}
        for op in list(graph.ops):
            found = float16_source(op)
            out = op.outputs[0] if op.outputs else None
            if found is None or out is None or graph.is_graph_output(out):
                continue
            weight, sparse = found
            if id(weight) not in widened:
                value = dense_value(weight)
                widened[id(weight)] = graph.add_constant(f"{weight.name}_float32", value, "FLOAT32")
                done.constants += 1
            graph.replace_uses(out, widened[id(weight)])
            graph.remove_op(op)
            done.dequantize_ops += 1
            done.sparse += int(sparse)
        if widened:
            DeadCodeElimination().run(graph)
    return done
