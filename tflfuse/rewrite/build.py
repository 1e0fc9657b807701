"""Building new ops in a rule's rewrite: a builder bound to the match.

    def rewrite(self, m: Match, *, x: Tensor) -> None:
        b = m.builder()                         # names new tensors "<root output>/<name>"
        y = b.MUL(b.MUL(x, b.scalar(0.5, "half", like=x), name="half_x"), ..., name="y")
        b.replace(m.root, y)                    # y's op writes the root's output; the root goes

`b.OP(*inputs, name=..., **options)` records an op of that type reading tensors of the graph or
values the builder made; its result is a `Value` whose shape and dtype are inferred (element-wise
broadcasting, RESHAPE/TRANSPOSE/SLICE/CONCATENATION from their constants, the input's for a unary
op) or given (`shape=`), and checked when both are known. `like=t` copies t's dtype and
quantization, `quant=` sets the quantization. Ops that carry a fused activation get
`fused_activation_function="NONE"` unless told otherwise. Nothing touches the graph until
`replace` (or `commit`): then the replacement's shape and dtype must equal the tensor it replaces,
the tensors are made, and the ops go where the anchor op was (the root by default; `after=op`:
right after that op), in the order they were built.

Ops that stay can be edited too, at commit and before the new ops are placed:
`b.set_input(op, i, v)`, `b.set_output(op, i, v)`, and for a conv, depthwise conv, fully
connected or transpose conv `b.set_weights(op, w)` (a new constant "<old weights>_fused") and
`b.set_bias(op, c)` (a new constant "<op>_bias"; the op's version rises to what the bias needs).
Rules never edit a constant's array in place (a buffer may be shared by several tensors): they
make a new constant and point the op at it. A builder made with `prefix=""` names new tensors
exactly as told.

Tensors are made in one order, the order of the calls: a constant when `b.const` (or `ints`,
`scalar`, `set_weights`, `set_bias`) is called, a declared tensor when `tensor` is, an op's output
when the op is built. A tensor's index in the subgraph (and a constant's buffer index) is its
place in `graph.tensors`, so that order decides the file's bytes, not what the model computes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import cast

import numpy as np
import numpy.typing as npt

from tflfuse.ir import Graph, IRError, Op, Quantization, Tensor
from tflfuse.ir.graph import NUMPY_DTYPES, dtype_name

# Ops whose options carry a fused activation: a new one gets NONE unless the rule says otherwise.
FUSES_ACTIVATION = frozenset(
    {
        "ADD",
        "SUB",
        "MUL",
        "DIV",
        "CONCATENATION",
        "AVERAGE_POOL_2D",
        "MAX_POOL_2D",
        "L2_POOL_2D",
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "FULLY_CONNECTED",
        "TRANSPOSE_CONV",
    }
)
ELEMENTWISE_BINARY = frozenset(
    {"ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "POW"}
)
ELEMENTWISE_UNARY = frozenset(
    {
        "ABS",
        "EXP",
        "HARD_SWISH",
        "LEAKY_RELU",
        "LOG",
        "LOGISTIC",
        "NEG",
        "PRELU",
        "RELU",
        "RELU6",
        "RELU_N1_TO_1",
        "RSQRT",
        "SQRT",
        "SQUARE",
        "TANH",
        "GELU",
        "SOFTMAX",
        "QUANTIZE",
        "DEQUANTIZE",
    }
)

# Where ops that carry (weights, bias) read them: input index of the weights and of the bias.
WEIGHTED = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV")
WEIGHT_INDEX = {"CONV_2D": 1, "DEPTHWISE_CONV_2D": 1, "FULLY_CONNECTED": 1, "TRANSPOSE_CONV": 1}
BIAS_INDEX = {"CONV_2D": 2, "DEPTHWISE_CONV_2D": 2, "FULLY_CONNECTED": 2, "TRANSPOSE_CONV": 3}


def fit_version(op: Op) -> None:
    """Raise `op.version` to what TFLite's op_version gives for what a rule made of it, so that
    an older runtime refuses the model instead of ignoring a feature: TRANSPOSE_CONV with a
    fused activation is version 4, with a bias input version 3."""
    if op.type == "TRANSPOSE_CONV":
        has_bias = len(op.inputs) > 3 and op.inputs[3] is not None
        need = 4 if op.fused_activation != "NONE" else 3 if has_bias else 1
        op.version = max(op.version, need)


class BuildError(IRError):
    """A rule built something inconsistent (shapes, dtypes, a value used twice as a result)."""


class Value:
    """A tensor the builder will make: an op's result, a constant or a declared tensor."""

    def __init__(
        self,
        builder: Builder,
        name: str,
        shape: Sequence[int],
        dtype: str,
        quantization: Quantization | None = None,
        data: np.ndarray | None = None,
    ) -> None:
        self.builder = builder
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.quantization = quantization
        self.data = data
        self.producer: _PendingOp | None = None
        self.tensor: Tensor | None = None  # made at commit (or the tensor it replaces)

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def made(self) -> Tensor:
        """The tensor made at commit (a BuildError before)."""
        if self.tensor is None:
            raise BuildError(f"{self.name!r} is not made before the builder commits")
        return self.tensor

    def __repr__(self) -> str:
        return f"<Value {self.name!r} {self.dtype}{list(self.shape)}>"


class _PendingOp:
    def __init__(self, type: str, inputs: list, out: Value, options: dict, kwargs: dict) -> None:
        self.type, self.inputs, self.out, self.options, self.kwargs = (
            type,
            inputs,
            out,
            options,
            kwargs,
        )
        self.more: list[Value] = []  # further outputs (SPLIT, SPLIT_V, UNPACK)


Input = Tensor | Value | None


class Builder:
    """New ops for one rewrite, placed where `at` is (see the module docstring)."""

    def __init__(
        self,
        graph: Graph,
        at: Op | None,
        prefix: str | None = None,
        after: Op | None = None,
    ) -> None:
        self.graph = graph
        self.at = at
        self.after = after
        self.prefix = prefix if prefix is not None else (at.output.name if at else graph.name)
        self.as_told = prefix == ""  # asked for no prefix (an empty output name still gives "/")
        self._values: list[Value] = []
        self._ops: list[_PendingOp] = []
        self._edits: list[tuple[Op, str, int, Input]] = []
        self._committed = False

    # -- values ----------------------------------------------------------------------------------
    def const(
        self,
        value: npt.ArrayLike,
        name: str,
        dtype: str | None = None,
        quant: Quantization | None = None,
    ) -> Value:
        """A new constant `<prefix>/<name>` holding `value` (float32 unless `dtype` or the array
        says otherwise)."""
        arr = np.asarray(value)
        if dtype is None:
            dtype = "FLOAT32" if arr.dtype.kind == "f" else dtype_name(arr.dtype)
        arr = np.array(arr, dtype=NUMPY_DTYPES[dtype], order="C")
        return self._value(name, arr.shape, dtype, quant, arr)

    def ints(self, values: Sequence[int], name: str) -> Value:
        """An INT32 constant: a shape, a permutation, a begin or size vector."""
        return self.const(np.asarray(values, np.int32), name, "INT32")

    def scalar(self, value: float, name: str, like: Tensor | Value) -> Value:
        """`value` as a constant of `like`'s type, shape (1,): float32, or int8/uint8 holding it
        exactly (the top code with scale value / top)."""
        if like.dtype == "FLOAT32":
            return self.const(np.array([value], np.float32), name, "FLOAT32")
        if like.dtype not in ("INT8", "UINT8"):
            raise BuildError(f"no scalar of type {like.dtype}")
        top = 127 if like.dtype == "INT8" else 255
        q = Quantization(
            scale=np.array([value / top], np.float32), zero_point=np.array([0], np.int64)
        )
        return self.const(np.array([top]), name, like.dtype, q)

    def tensor(
        self,
        name: str,
        shape: Sequence[int],
        like: Tensor | Value | None = None,
        *,
        dtype: str | None = None,
        quant: Quantization | None = None,
    ) -> Value:
        """Declare a tensor now (its index comes here) that an op writes later (`out=`)."""
        dtype = dtype or (like.dtype if like is not None else "FLOAT32")
        if quant is None and like is not None and dtype == like.dtype:
            quant = like.quantization
        return self._value(name, shape, dtype, quant)

    # -- ops that stay ----------------------------------------------------------------------------
    def set_input(self, op: Op, index: int, value: Input) -> None:
        """At commit, `op` reads `value` as input `index` (missing inputs before it: None)."""
        self._edits.append((op, "in", index, value))

    def set_output(self, op: Op, index: int, value: Tensor | Value) -> None:
        """At commit, `op` writes `value` as output `index` (before the new ops are placed, so
        one of them may write what `op` wrote)."""
        self._edits.append((op, "out", index, value))

    def set_weights(self, op: Op, value: np.ndarray) -> Value:
        """`op` reads new float32 weights `value`, named after the old ones ("<name>_fused")."""
        index = WEIGHT_INDEX[op.type]
        name = cast(Tensor, op.inputs[index]).name + "_fused"
        w = self._named_const(name, value)
        self.set_input(op, index, w)
        return w

    def set_bias(self, op: Op, value: np.ndarray) -> Value:
        """`op` reads a new float32 bias `value` ("<op>_bias"), added when it had none."""
        b = self._named_const(f"{op.name}_bias", value)
        self._edits.append((op, "bias", BIAS_INDEX[op.type], b))
        return b

    def _named_const(self, name: str, value: np.ndarray) -> Value:
        arr = np.array(np.asarray(value, dtype=np.float32), order="C")
        self._live()
        v = Value(self, name, arr.shape, "FLOAT32", None, arr)
        self._values.append(v)
        return v

    def _value(self, name, shape, dtype, quant, data=None) -> Value:
        self._live()
        full = name if self.as_told else f"{self.prefix}/{name}"
        v = Value(self, full, shape, dtype, quant, data)
        self._values.append(v)
        return v

    # -- ops -------------------------------------------------------------------------------------
    def op(
        self,
        type: str,
        *inputs: Input,
        name: str | None = None,
        shape: Sequence[int] | None = None,
        dtype: str | None = None,
        like: Tensor | Value | None = None,
        quant: Quantization | None = None,
        out: Value | Tensor | None = None,
        version: int = 1,
        options: Mapping[str, object] | None = None,
        **more_options: object,
    ) -> Value:
        """Record `type(*inputs)` and return its result (see the module docstring). Its
        options are `options` (a dict, e.g. copied from another op) and the keywords left."""
        self._live()
        options = {**(options or {}), **more_options}
        for t in inputs:
            if isinstance(t, Value) and t.builder is not self:
                raise BuildError(f"{t} belongs to another builder")
        if type in FUSES_ACTIVATION and "fused_activation_function" not in options:
            options["fused_activation_function"] = "NONE"
        inferred = infer_shape(type, list(inputs), options)
        if shape is not None and inferred is not None and tuple(shape) != inferred:
            raise BuildError(f"{type} gives shape {list(inferred)}, not {list(shape)}")
        shape = tuple(shape) if shape is not None else inferred
        _check_dtypes(type, list(inputs))
        if isinstance(out, Tensor):  # an existing tensor (a kept op's old output): written as is
            result = Value(self, out.name, out.shape, out.dtype, out.quantization)
            result.tensor = out
        elif isinstance(out, Value):
            if out.producer is not None or out.is_constant:
                raise BuildError(f"{out} already has a value")
            result = out
        else:
            if shape is None:
                raise BuildError(f"{type} needs shape= (its shape is not inferred)")
            first = next((t for t in inputs if t is not None), None)
            dtype = dtype or (
                like.dtype if like is not None else cast("Tensor | Value", first).dtype
            )
            if quant is None and like is not None:
                quant = like.quantization
            result = self._value(name or type.lower(), shape, dtype, quant)
        if shape is not None and result.shape != tuple(shape):
            raise BuildError(f"{type} gives shape {list(shape)}, written to {result}")
        pending = _PendingOp(type, list(inputs), result, options, {"version": version})
        result.producer = pending
        self._ops.append(pending)
        return result

    def __getattr__(self, name: str) -> Callable[..., Value]:
        if name.isupper():
            return lambda *inputs, **kw: self.op(name, *inputs, **kw)
        raise AttributeError(name)

    def split(
        self, type: str, *inputs: Input, outs: Sequence[Tensor | Value], **options: object
    ) -> list[Value]:
        """An op of several outputs (SPLIT, SPLIT_V, UNPACK) writing `outs`, tensors of the
        graph or declared values (`tensor`)."""
        if not outs:
            raise BuildError(f"{type} needs outputs")
        first, *rest = outs
        values = [self.op(type, *inputs, out=first, options=options)]
        pending = cast(_PendingOp, values[0].producer)
        for out in rest:
            if isinstance(out, Tensor):
                v = Value(self, out.name, out.shape, out.dtype, out.quantization)
                v.tensor = out
            elif out.producer is not None or out.is_constant:
                raise BuildError(f"{out} already has a value")
            else:
                v = out
            v.producer = pending
            pending.more.append(v)
            values.append(v)
        return values

    # -- committing ------------------------------------------------------------------------------
    def replace(self, old: Op | Tensor, value: Value | Tensor) -> None:
        """Make `value` stand for `old` (an op: its one output; a tensor) and commit: the op
        computing `value` writes `old`'s tensor (its name, place and quantization stay) and the
        op that wrote it goes. A tensor of the graph as `value`: readers of `old` read it."""
        target = old.output if isinstance(old, Op) else old
        dying = old if isinstance(old, Op) else target.producer
        if isinstance(value, Tensor):
            self.commit(remove=dying)
            self.graph.replace_uses(target, value)
            return
        if value.producer is None or value.tensor is not None:
            raise BuildError(f"{value} is not a new op's result")
        if value.shape != target.shape or value.dtype != target.dtype:
            raise BuildError(
                f"{value.producer.type} gives {value.dtype}{list(value.shape)}, but"
                f" {target.name!r} is {target.dtype}{list(target.shape)}"
            )
        value.tensor = target
        self.commit(remove=dying)

    def commit(self, remove: Op | Sequence[Op] | None = None) -> list[Op]:
        """Make the tensors and ops (once); `remove` (the ops being replaced) go first, and the
        new ops take the place of the anchor (the first op after it that stays, when it goes).
        Returns the new ops in graph order."""
        self._live()
        self._committed = True
        g = self.graph
        dying = [] if remove is None else [remove] if isinstance(remove, Op) else list(remove)
        anchor = self.at
        if self.after is not None:
            i = g.ops.index(self.after)
            anchor = g.ops[i + 1] if i + 1 < len(g.ops) else None
        if anchor is not None and any(anchor is op for op in dying):
            i = g.ops.index(anchor)
            anchor = next((op for op in g.ops[i:] if all(op is not d for d in dying)), None)
        for op in dying:
            g.remove_op(op)
        for v in self._values:  # in the order of the calls
            if v.tensor is not None:
                continue
            if v.is_constant:
                v.tensor = g.add_constant(v.name, cast(np.ndarray, v.data), v.dtype, v.quantization)
            else:
                v.tensor = g.add_tensor(v.name, v.shape, v.dtype, quantization=v.quantization)
        for op, where, index, value in self._edits:
            tensor = value.tensor if isinstance(value, Value) else value
            if where in ("in", "bias"):
                ins = list(op.inputs) + [None] * (index + 1 - len(op.inputs))
                ins[index] = tensor
                op.inputs = ins
                if where == "bias":
                    fit_version(op)
            else:
                outs = list(op.outputs)
                outs[index] = cast(Tensor, tensor)
                op.outputs = outs
        made = []
        for p in self._ops:
            ins = [t.tensor if isinstance(t, Value) else t for t in p.inputs]
            outs = cast("list[Tensor]", [p.out.tensor, *(v.tensor for v in p.more)])
            made.append(g.add_op(p.type, ins, outs, p.options, before=anchor, **p.kwargs))
        return made

    def _live(self) -> None:
        if self._committed:
            raise BuildError("the builder has committed; make a new one")


# -- shapes and dtypes -----------------------------------------------------------------------------
def _const_ints(t: Input) -> list[int] | None:
    data = t.data if t is not None else None
    return None if data is None else [int(v) for v in np.asarray(data).reshape(-1)]


def infer_shape(type: str, inputs: list[Input], options: dict) -> tuple[int, ...] | None:
    """The result's shape when the op's type and inputs decide it, else None."""
    if not inputs or inputs[0] is None:
        return None
    x = tuple(inputs[0].shape)
    if type in ELEMENTWISE_UNARY:
        return x
    if type in ELEMENTWISE_BINARY and len(inputs) == 2 and inputs[1] is not None:
        try:
            return tuple(int(d) for d in np.broadcast_shapes(x, tuple(inputs[1].shape)))
        except ValueError:
            raise BuildError(
                f"{type} cannot broadcast {list(x)} with {list(inputs[1].shape)}"
            ) from None
    if type == "RESHAPE" and len(inputs) > 1:
        shape = _const_ints(inputs[1])
        if shape is not None and -1 not in shape:
            if int(np.prod(shape)) != int(np.prod(x)):
                raise BuildError(f"RESHAPE {list(x)} to {shape} changes the element count")
            return tuple(shape)
    if type == "TRANSPOSE" and len(inputs) > 1:
        perm = _const_ints(inputs[1])
        if perm is not None:
            if sorted(p % len(x) for p in perm) != list(range(len(x))):
                raise BuildError(f"TRANSPOSE perm {perm} is not a permutation of {len(x)} axes")
            return tuple(x[p % len(x)] for p in perm)
    if type == "SLICE" and len(inputs) > 2:
        begin, size = _const_ints(inputs[1]), _const_ints(inputs[2])
        if begin is not None and size is not None:
            size = [d - b if s == -1 else s for s, b, d in zip(size, begin, x, strict=True)]
            if any(b < 0 or b + s > d for b, s, d in zip(begin, size, x, strict=True)):
                raise BuildError(f"SLICE {begin} + {size} leaves {list(x)}")
            return tuple(size)
    if type == "CONCATENATION":
        axis = int(options.get("axis", 0)) % len(x)
        shapes = [tuple(cast("Tensor | Value", t).shape) for t in inputs]
        if any(len(s) != len(x) or s[:axis] + s[axis + 1 :] != x[:axis] + x[axis + 1 :]
               for s in shapes):  # fmt: skip
            raise BuildError(f"CONCATENATION along {axis} of {[list(s) for s in shapes]}")
        return (*x[:axis], sum(s[axis] for s in shapes), *x[axis + 1 :])
    return None


def _check_dtypes(type: str, inputs: list[Input]) -> None:
    if type in ELEMENTWISE_BINARY or type == "CONCATENATION":
        dtypes = {t.dtype for t in inputs if t is not None}
        if len(dtypes) > 1:
            raise BuildError(f"{type} reads {sorted(dtypes)}: one type expected")
