"""The graph IR every tflfuse pass works on: Model -> Graph (one per subgraph) -> Op / Tensor.

Why an IR of our own: the flatbuffer object API addresses everything by index (tensor 17, opcode 4,
buffer 93), which makes rewrites fragile. Here ops point at Tensor objects, every Tensor knows its
producer and consumers, constants are numpy arrays and options are plain dicts with readable enum
names. `tflfuse.ir.flatbuffer` is the only module that translates between this and the schema.

Wiring is kept consistent by construction: `Op.inputs` / `Op.outputs` are tuples, and assigning
them (or calling `set_input`) updates `Tensor.producer` / `Tensor.consumers`. Nothing here imports
TensorFlow or the flatbuffer schema.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast, overload

import numpy as np

# TFLite tensor type name -> numpy dtype of one element, where numpy has one.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "FLOAT32": np.dtype("<f4"),
    "FLOAT16": np.dtype("<f2"),
    "FLOAT64": np.dtype("<f8"),
    "INT8": np.dtype("i1"),
    "UINT8": np.dtype("u1"),
    "INT16": np.dtype("<i2"),
    "UINT16": np.dtype("<u2"),
    "INT32": np.dtype("<i4"),
    "UINT32": np.dtype("<u4"),
    "INT64": np.dtype("<i8"),
    "UINT64": np.dtype("<u8"),
    "BOOL": np.dtype("?"),
    "COMPLEX64": np.dtype("<c8"),
    "COMPLEX128": np.dtype("<c16"),
}

# Fused activations an op can carry in its options ("fused_activation_function").
ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6", "TANH", "SIGN_BIT")


class IRError(ValueError):
    """The graph is structurally wrong (raised by `validate()` and by IR mutators)."""


@dataclass(eq=False)
class Quantization:
    """Affine quantization: real = scale * (q - zero_point), per tensor or along `axis`.

    `details` carries custom/blockwise quantization through untouched (an opaque schema object).
    """

    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None
    axis: int = 0
    min: np.ndarray | None = None
    max: np.ndarray | None = None
    details: Any = None

    @property
    def per_channel(self) -> bool:
        return self.scale is not None and self.scale.size > 1

    def is_empty(self) -> bool:
        return (
            self.scale is None
            and self.zero_point is None
            and self.min is None
            and self.max is None
            and self.details is None
        )

    def same_as(self, other: Quantization | None) -> bool:
        """Equal parameters (used by tests and by rules that may only merge equal scales)."""
        if other is None:
            return self.is_empty()

        def eq(a: np.ndarray | None, b: np.ndarray | None) -> bool:
            if a is None or b is None:
                return a is None and b is None
            return a.shape == b.shape and bool(np.array_equal(a, b))

        return (
            eq(self.scale, other.scale)
            and eq(self.zero_point, other.zero_point)
            and eq(self.min, other.min)
            and eq(self.max, other.max)
            and (self.axis == other.axis or not self.per_channel)
            and (self.details is None) == (other.details is None)
        )


class Tensor:
    """A value in a graph: an activation, a constant (`data` is set) or a variable.

    `data` holds a constant as a numpy array of `shape` and the numpy dtype of `dtype`; for types
    numpy cannot represent elementwise (STRING, INT4, sparse or otherwise packed data) it holds the
    raw bytes as a flat uint8 array and `is_raw` is True.
    """

    def __init__(
        self,
        name: str,
        shape: Sequence[int] = (),
        dtype: str = "FLOAT32",
        data: np.ndarray | None = None,
        quantization: Quantization | None = None,
        *,
        shape_signature: Sequence[int] | None = None,
        is_variable: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.data = data
        self.quantization = quantization
        self.shape_signature = None if shape_signature is None else tuple(shape_signature)
        self.is_variable = is_variable
        self.extra: dict[str, Any] = extra or {}
        self.producer: Op | None = None
        self._uses: list[Op] = []

    # -- relations ---------------------------------------------------------------------------
    @property
    def op(self) -> Op:
        """The op that writes this tensor, which must have one (a rule's `out=` capture):
        an IRError for a graph input or a constant. `producer` is the same op, or None."""
        if self.producer is None:
            raise IRError(f"tensor {self.name!r} is written by no op")
        return self.producer

    @property
    def consumers(self) -> list[Op]:
        """Ops reading this tensor, each once, in the order they started reading it."""
        return list(dict.fromkeys(self._uses))

    # -- data --------------------------------------------------------------------------------
    @property
    def is_constant(self) -> bool:
        return self.data is not None and not self.is_variable

    @property
    def is_raw(self) -> bool:
        """`data` holds packed bytes rather than one numpy element per tensor element."""
        if self.data is None:
            return False
        want = NUMPY_DTYPES.get(self.dtype)
        if want is None or self.data.dtype != want:
            return True
        packed_bytes = self.data.dtype == np.uint8 and self.data.ndim == 1
        return packed_bytes and self.data.shape != self.shape

    @property
    def np_dtype(self) -> np.dtype | None:
        return NUMPY_DTYPES.get(self.dtype)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        """Bytes of one materialized instance (0 when the element size is unknown)."""
        dt = NUMPY_DTYPES.get(self.dtype)
        if dt is None:
            return int(self.data.nbytes) if self.data is not None else 0
        return self.size * dt.itemsize

    @property
    def is_quantized(self) -> bool:
        q = self.quantization
        return q is not None and q.scale is not None and q.scale.size > 0

    def real_range(self) -> tuple[float, float]:
        """The least and largest real values a quantized integer tensor can hold: its type's
        extremes through its (first) scale and zero point."""
        info = np.iinfo(self.np_dtype)
        q = cast(Quantization, self.quantization)  # quantized: the caller checked
        scale = float(np.asarray(q.scale).reshape(-1)[0])
        zero = 0 if q.zero_point is None else int(np.asarray(q.zero_point).reshape(-1)[0])
        return scale * (info.min - zero), scale * (info.max - zero)

    def __repr__(self) -> str:
        kind = "const " if self.is_constant else ""
        return f"<{kind}Tensor {self.name!r} {self.dtype}{list(self.shape)}>"


class Op:
    """One operator. `type` is the builtin name ("CONV_2D") or "CUSTOM" with `custom_code` set.

    `options` are the builtin options as a dict with snake_case keys; the enums that rules use
    (fused_activation_function, padding) are names ("RELU6", "SAME"), the rest keep their numbers.
    """

    def __init__(
        self,
        type: str,
        inputs: Sequence[Tensor | None] = (),
        outputs: Sequence[Tensor] = (),
        options: dict[str, Any] | None = None,
        *,
        version: int = 1,
        custom_code: str | None = None,
        custom_options: bytes | None = None,
        options_type: str | None = None,
        intermediates: Sequence[Tensor] = (),
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.type = type
        self.options: dict[str, Any] = dict(options or {})
        self.version = version
        self.custom_code = custom_code
        self.custom_options = custom_options
        self.options_type = options_type
        self.intermediates: list[Tensor] = list(intermediates)
        self.extra: dict[str, Any] = extra or {}
        self._inputs: tuple[Tensor | None, ...] = ()
        self._outputs: tuple[Tensor, ...] = ()
        self.inputs = inputs
        self.outputs = outputs

    # -- wiring ------------------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[Tensor | None, ...]:
        return self._inputs

    @inputs.setter
    def inputs(self, tensors: Iterable[Tensor | None]) -> None:
        for t in self._inputs:
            if t is not None:
                t._uses.remove(self)
        self._inputs = tuple(tensors)
        for t in self._inputs:
            if t is not None:
                t._uses.append(self)

    @property
    def operands(self) -> tuple[Tensor, ...]:
        """Every input, each present: an IRError when an optional one is absent. What code
        walking an op that has no optional inputs (element-wise, layout) iterates."""
        present = tuple(t for t in self._inputs if t is not None)
        if len(present) != len(self._inputs):
            raise IRError(f"{self.type} op {self.name!r} has an absent input")
        return present

    def input(self, index: int) -> Tensor:
        """Input `index`, which must be present: an IRError when the op has no such input or
        it is an absent optional one (`inputs[index]` is None). `inputs` holds them all, None
        where an optional input is absent (TFLite's -1)."""
        t = self._inputs[index] if -len(self._inputs) <= index < len(self._inputs) else None
        if t is None:
            raise IRError(f"{self.type} op {self.name!r} has no input {index}")
        return t

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return self._outputs

    @outputs.setter
    def outputs(self, tensors: Iterable[Tensor]) -> None:
        for t in self._outputs:
            if t.producer is self:
                t.producer = None
        self._outputs = tuple(tensors)
        for t in self._outputs:
            if t.producer is not None and t.producer is not self:
                raise IRError(f"tensor {t.name!r} already produced by {t.producer}")
            t.producer = self

    def set_input(self, index: int, tensor: Tensor | None) -> None:
        new = list(self._inputs)
        new[index] = tensor
        self.inputs = new

    def disconnect(self) -> None:
        """Detach from every tensor (the op keeps its type and options)."""
        self.inputs = ()
        self.outputs = ()

    # -- conveniences for rules ------------------------------------------------------------------
    @property
    def output(self) -> Tensor:
        return self._outputs[0]

    @property
    def name(self) -> str:
        """A stable human name: the first output's tensor name."""
        return self._outputs[0].name if self._outputs else f"<{self.type}>"

    @property
    def fused_activation(self) -> str:
        return self.options.get("fused_activation_function", "NONE")

    @fused_activation.setter
    def fused_activation(self, value: str) -> None:
        if value not in ACTIVATIONS:
            raise IRError(f"unknown fused activation {value!r}")
        self.options["fused_activation_function"] = value

    def __repr__(self) -> str:
        code = f"({self.custom_code})" if self.custom_code else ""
        return f"<Op {self.type}{code} -> {self.name!r}>"


def _unwired_copy(t: Tensor) -> Tensor:
    """What `Tensor(t.name, t.shape, ..., extra=dict(t.extra))` makes of `t` (no producer, no
    readers), without the constructor's argument handling: `snapshot` copies every tensor of a
    graph, and a pipelined prediction snapshots the graph once per segment."""
    c: Tensor = object.__new__(Tensor)
    shape = t.shape
    c.name = t.name
    c.shape = (
        shape
        if type(shape) is tuple and all(type(d) is int for d in shape)
        else (tuple(int(d) for d in shape))
    )
    c.dtype = t.dtype
    c.data = t.data
    c.quantization = t.quantization
    signature = t.shape_signature
    c.shape_signature = (
        signature if signature is None or type(signature) is tuple else (tuple(signature))
    )
    c.is_variable = t.is_variable
    c.extra = dict(t.extra)
    c.producer = None
    c._uses = []
    return c


class Graph:
    """One subgraph: ops in execution order, the tensors they use, inputs and outputs."""

    def __init__(
        self,
        name: str = "",
        ops: Iterable[Op] = (),
        tensors: Iterable[Tensor] = (),
        inputs: Iterable[Tensor] = (),
        outputs: Iterable[Tensor] = (),
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.ops: list[Op] = list(ops)
        self.tensors: list[Tensor] = list(tensors)
        self.inputs: list[Tensor] = list(inputs)
        self.outputs: list[Tensor] = list(outputs)
        self.extra: dict[str, Any] = extra or {}
        self._names = itertools.count()
        self._index = _TensorIndex()

    # -- building --------------------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        taken = self._index.names(self.tensors)
        if base not in taken:
            return base
        while True:
            candidate = f"{base}_{next(self._names)}"
            if candidate not in taken:
                return candidate

    def add_tensor(
        self,
        name: str,
        shape: Sequence[int],
        dtype: str = "FLOAT32",
        data: np.ndarray | None = None,
        quantization: Quantization | None = None,
    ) -> Tensor:
        t = Tensor(self.unique_name(name), shape, dtype, data, quantization)
        self.tensors.append(t)
        return t

    def add_constant(
        self,
        name: str,
        value: np.ndarray,
        dtype: str | None = None,
        quantization: Quantization | None = None,
    ) -> Tensor:
        """A new constant tensor holding `value` (cast to `dtype`'s numpy type when given)."""
        if dtype is None:
            dtype = dtype_name(value.dtype)
        arr = np.array(value, dtype=NUMPY_DTYPES[dtype], order="C")  # keeps 0-d arrays 0-d
        return self.add_tensor(name, arr.shape, dtype, arr, quantization)

    def add_op(
        self,
        type: str,
        inputs: Sequence[Tensor | None],
        outputs: Sequence[Tensor],
        options: dict[str, Any] | None = None,
        *,
        before: Op | None = None,
        after: Op | None = None,
        **kwargs: Any,
    ) -> Op:
        """Create an op, wire it, and place it before/after an existing op (default: at the end)."""
        op = Op(type, inputs, outputs, options, **kwargs)
        for t in [*inputs, *outputs]:
            if t is not None and t not in self._tensor_set():
                self.tensors.append(t)  # (the index takes appended tensors in on its next use)
        if before is not None:
            self.ops.insert(self.ops.index(before), op)
        elif after is not None:
            self.ops.insert(self.ops.index(after) + 1, op)
        else:
            self.ops.append(op)
        return op

    def remove_op(self, op: Op) -> None:
        self.ops.remove(op)
        op.disconnect()

    def replace_uses(self, old: Tensor, new: Tensor) -> None:
        """Every reader of `old` (ops and graph outputs) reads `new` instead."""
        for op in old.consumers:
            op.inputs = [new if t is old else t for t in op.inputs]
        self.outputs = [new if t is old else t for t in self.outputs]

    def _tensor_set(self) -> set[Tensor]:
        """The graph's tensors as a set: a view callers only read (`_TensorIndex`)."""
        return self._index.tensors(self.tensors)

    def snapshot(self, only: Collection[int] | None = None) -> Graph:
        """A structural copy, to compare with after rewrites edit this graph in place: new
        ops, tensors and option dicts; constant arrays and quantization parameters are shared
        (rules replace them, never edit them in place). `only` (op indices): just those ops,
        the graph a full copy leaves after `remove_op` of every other op (every tensor copied,
        the ones no kept op touches unwired), without making and unwiring the others."""
        twin: dict[int, Tensor] = {}

        @overload
        def copy(t: Tensor) -> Tensor: ...
        @overload
        def copy(t: Tensor | None) -> Tensor | None: ...
        def copy(t: Tensor | None) -> Tensor | None:
            if t is None:
                return None
            c = twin.get(id(t))
            if c is None:
                c = twin[id(t)] = _unwired_copy(t)
            return c

        tensors = [copy(t) for t in self.tensors]
        ops = []
        for i, op in enumerate(self.ops):
            if only is not None and i not in only:
                continue
            options = {k: list(v) if isinstance(v, list) else v for k, v in op.options.items()}
            ops.append(
                Op(
                    op.type,
                    [copy(t) for t in op.inputs],
                    [copy(t) for t in op.outputs],
                    options,
                    version=op.version,
                    custom_code=op.custom_code,
                    custom_options=op.custom_options,
                    options_type=op.options_type,
                    intermediates=[copy(t) for t in op.intermediates],
                    extra=dict(op.extra),
                )
            )
        ins, outs = [copy(t) for t in self.inputs], [copy(t) for t in self.outputs]
        return Graph(self.name, ops, tensors, ins, outs, dict(self.extra))

    # -- queries ---------------------------------------------------------------------------------
    def ops_of(self, *types: str) -> list[Op]:
        return [op for op in self.ops if op.type in types]

    def is_graph_output(self, t: Tensor) -> bool:
        return any(o is t for o in self.outputs)

    def activations(self) -> list[Tensor]:
        """Non-constant tensors that ops produce (what the runtime must materialize)."""
        return [t for op in self.ops for t in op.outputs if not t.is_constant]

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.ops:
            key = op.custom_code if op.type == "CUSTOM" and op.custom_code else op.type
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    # -- ordering and checks ---------------------------------------------------------------------
    def toposort(self) -> bool:
        """Order ops so every op comes after its producers, keeping the current order where it can.

        Returns True when the order changed. Raises IRError on a cycle.
        """
        order = self.topological_order()
        changed = order != self.ops
        self.ops = order
        return changed

    def topological_order(self) -> list[Op]:
        """The ops, each after its producers; ties go to the op that comes first now.

        The project's one topological sort (Kahn's, stable): an order that already puts producers
        first comes back unchanged, so a parsed model keeps its file order. Reads only; raises
        IRError on a cycle.
        """
        position = {op: i for i, op in enumerate(self.ops)}
        indegree = {op: 0 for op in self.ops}
        users: dict[Op, list[Op]] = {op: [] for op in self.ops}
        for op in self.ops:
            for t in set(i for i in op.inputs if i is not None):
                p = t.producer
                if p is not None and p in indegree and p is not op:
                    indegree[op] += 1
                    users[p].append(op)
        ready = [(position[op], id(op), op) for op, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        order: list[Op] = []
        while ready:
            _, _, op = heapq.heappop(ready)
            order.append(op)
            for u in users[op]:
                indegree[u] -= 1
                if indegree[u] == 0:
                    heapq.heappush(ready, (position[u], id(u), u))
        if len(order) != len(self.ops):
            raise IRError(f"subgraph {self.name!r} has a cycle")
        return order

    def validate(self) -> None:
        """Raise IRError unless wiring, order and constants are consistent."""
        known = self._tensor_set()
        seen: set[Tensor] = set()
        available = {t for t in self.inputs} | {t for t in known if t.producer is None}
        for op in self.ops:
            for t in op.inputs:
                if t is None:
                    continue
                if t not in known:
                    raise IRError(f"{op} reads {t.name!r}, which is not in the subgraph")
                if op not in t._uses:
                    raise IRError(f"{op} reads {t.name!r} but is not among its consumers")
                if t not in available and not t.is_variable:
                    raise IRError(f"{op} reads {t.name!r} before it is produced")
            for t in op.outputs:
                if t not in known:
                    raise IRError(f"{op} writes {t.name!r}, which is not in the subgraph")
                if t.producer is not op:
                    raise IRError(f"{op} writes {t.name!r} but is not its producer")
                if t in seen:
                    raise IRError(f"tensor {t.name!r} is produced twice")
                seen.add(t)
                available.add(t)
        in_graph = set(self.ops)
        for t in self.tensors:
            if t.producer is not None and t.producer not in in_graph:
                raise IRError(f"tensor {t.name!r} is produced by an op outside the subgraph")
            if t.data is not None and not t.is_raw and t.data.shape != t.shape:
                raise IRError(
                    f"constant {t.name!r} has data of shape {t.data.shape}, not {t.shape}"
                )
        for t in [*self.inputs, *self.outputs]:
            if t not in known:
                raise IRError(f"subgraph input/output {t.name!r} is not in the subgraph")

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {len(self.ops)} ops, {len(self.tensors)} tensors>"


class _TensorIndex:
    """The set of a graph's tensors and of their names, for `unique_name` and `add_op`, which a
    rule calls once per tensor it adds: rebuilt from `Graph.tensors` at every call, they made
    adding n tensors to a graph of N cost n * N (a legalization adding thousands of ops to a
    model of thousands of tensors spent seconds there).

    Kept in step with the list without asking its writers to say anything: what was indexed is
    the list object, its length and its last tensor then; a use finding the same list, longer
    and with that tensor still in place takes in the appended tensors only, and anything else
    (a list assigned anew, a shorter one, an insertion or removal before the end) rebuilds the
    index from the list. So every way tflfuse changes `Graph.tensors` (append, assignment of a
    new list, sorting in place) gives what a rebuild gives. Not seen: a tensor replaced at a
    position before the end, or one renamed in place, without the list changing length (tflfuse
    does neither; the tests show the rebuild paths).
    """

    def __init__(self) -> None:
        self._list: list[Tensor] | None = None
        self._count = 0
        self._last: Tensor | None = None
        self._tensors: set[Tensor] = set()
        self._names: set[str] = set()

    def _sync(self, tensors: list[Tensor]) -> None:
        n = self._count
        same = (
            tensors is self._list and len(tensors) >= n and (n == 0 or tensors[n - 1] is self._last)
        )
        if not same:
            self._list, n = tensors, 0
            self._tensors, self._names = set(), set()
        for t in tensors[n:]:
            self._tensors.add(t)
            self._names.add(t.name)
        self._count = len(tensors)
        self._last = tensors[-1] if tensors else None

    def tensors(self, tensors: list[Tensor]) -> set[Tensor]:
        """The set of `tensors` (the graph's list), brought up to date."""
        self._sync(tensors)
        return self._tensors

    def names(self, tensors: list[Tensor]) -> set[str]:
        """The names of `tensors` (the graph's list), brought up to date."""
        self._sync(tensors)
        return self._names


@dataclass(eq=False)
class Signature:
    """A SignatureDef: named entry points into one subgraph."""

    key: str
    subgraph: int
    inputs: dict[str, Tensor] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)


@dataclass(eq=False)
class Model:
    """A whole .tflite: subgraphs (0 is the main one), signatures and metadata."""

    subgraphs: list[Graph] = field(default_factory=list)
    description: str = ""
    version: int = 3
    metadata: dict[str, bytes] = field(default_factory=dict)
    signatures: list[Signature] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def main(self) -> Graph:
        return self.subgraphs[0]

    def graphs(self) -> Iterator[tuple[int, Graph]]:
        return iter(enumerate(self.subgraphs))

    def retarget_signatures(self, renamed: dict[Tensor, Tensor]) -> None:
        """Point every signature entry that names a tensor in `renamed` at its replacement
        (after an input or output tensor was swapped for a new one)."""
        for s in self.signatures:
            s.inputs = {k: renamed.get(v, v) for k, v in s.inputs.items()}
            s.outputs = {k: renamed.get(v, v) for k, v in s.outputs.items()}

    def validate(self) -> None:
        if not self.subgraphs:
            raise IRError("model has no subgraphs")
        for g in self.subgraphs:
            g.validate()
        for s in self.signatures:
            if not 0 <= s.subgraph < len(self.subgraphs):
                raise IRError(f"signature {s.key!r} names subgraph {s.subgraph}, which is missing")
            known = set(self.subgraphs[s.subgraph].tensors)
            for t in [*s.inputs.values(), *s.outputs.values()]:
                if t not in known:
                    raise IRError(f"signature {s.key!r} names {t.name!r}, not in its subgraph")


def dtype_name(dtype: np.dtype) -> str:
    """The TFLite type name of a numpy dtype (raises IRError when there is none)."""
    dt = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)
    for name, candidate in NUMPY_DTYPES.items():
        if candidate == dt:
            return name
    raise IRError(f"numpy dtype {dtype} has no TFLite type")
