"""Algebraic simplification: identities, cancelling pairs, and activations spelled out in
element-wise ops (HardSwish, LeakyReLU, GELU) turned back into the one builtin kernel.

Exporters (onnx2tf, older converters, hand-written Keras) often write x * relu6(x + 3) / 6 in
some order, or maximum(x, 0.2 * x): several kernels and intermediate tensors for one activation.
"""

from __future__ import annotations

import math
from typing import TypeGuard

import numpy as np

from tflfuse.ir import Graph, Op, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, Value, common, refuse
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets import XNNPACK, Target, cost


def _identity_value(op: Op) -> float | None:
    return {"MUL": 1.0, "DIV": 1.0, "ADD": 0.0, "SUB": 0.0}.get(op.type)


class RemoveIdentityArithmetic(Rule):
    """x * 1 | x / 1 | x + 0 | x - 0  =>  x (when the constant does not broadcast x larger,
    or every reader is element-wise and broadcasts x to the same shape itself).

    The second case is LayerNorm's rsqrt(var) * gamma with gamma all ones (Keras' initial
    value): (1, S, 1) * ones(1, 1, C) only broadcasts, and the MUL reading it broadcasts anyway.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any("MUL", "DIV", "ADD", "SUB")(p.x, p.const("c"), out="y")

    def check(self, m: Match, *, c: Tensor, x: Tensor, y: Tensor) -> Refusal | None:
        value = common.float_constant(c)
        if value is None or not np.all(value == _identity_value(m.root)):
            return NotApplicable(f"the {m.root.type} constant is not the identity")
        if m.root.fused_activation != "NONE":
            return refuse(f"{m.root.type} applies fused {m.root.fused_activation}")
        if x.dtype != y.dtype:
            return refuse("the constant changes the type")
        if x.shape != y.shape and not _readers_broadcast(m.graph, y, x):
            return refuse("the constant broadcasts the value to a larger shape")
        return _forwardable(m.graph, y, x)

    def rewrite(self, m: Match, *, y: Tensor, x: Tensor) -> None:
        common.forward(m.graph, y, x)


_BROADCASTING = frozenset({"ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE"})


def _readers_broadcast(graph: Graph, y: Tensor, x: Tensor) -> bool:
    """Every reader of y is element-wise and writes the same shape when it reads x instead."""
    if graph.is_graph_output(y) or not y.consumers:
        return False
    for op in y.consumers:
        if op.type not in _BROADCASTING or len(op.inputs) != 2:
            return False
        shapes = [x.shape if t is y else t.shape for t in op.operands]
        try:
            if tuple(np.broadcast_shapes(*shapes)) != tuple(op.output.shape):
                return False
        except ValueError:
            return False
    return True


def _forwardable(graph: Graph, old: Tensor, new: Tensor) -> Refusal | None:
    if not graph.is_graph_output(old):
        return None
    if new.producer is None or graph.is_graph_output(new) or new in graph.inputs:
        return refuse("the result is a model output that cannot be renamed")
    return None


class FactorCommonMultiplier(Rule):
    """a * k + b * k  =>  (a + b) * k;  a * k + (-b) * k  =>  (a - b) * k
    (on targets whose int8 SUB is slow: (a + b * -1) * k).

    Two kernels fewer (one for the -1 form); the form the converter gives LayerNorm
    ((x - mean) * rsqrt(var) * gamma written as x * m + (-mean) * m). Float only; equal up to
    rounding. The plain int8 SUB kernel is slow (benchmarks/cost_table.py): a LayerNorm
    factored with SUB made the int8 zoo transformer 7% slower than stock on plain kernels, so
    for the "cpu" target the negation stays a MUL by -1 (the quantizer keeps NEG in float).
    """

    int8_error_steps = 0  # float-only

    def __init__(self, target: Target = XNNPACK) -> None:
        self.target = target

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.ADD(p.MUL(p.a, p.k, out="ma"), p.MUL(p.b, p.k, out="mb"))

    def check(
        self, m: Match, *, ma: Tensor, mb: Tensor, a: Tensor, b: Tensor, k: Tensor
    ) -> Refusal | None:
        if ma is mb:
            return NotApplicable("the same product twice")
        for t in (ma, mb):
            if t.op.fused_activation != "NONE":
                return refuse(f"a product has fused {t.op.fused_activation}")
            if not common.single_reader(m.graph, t):  # the engine's check, in this rule's words
                return refuse("a product is read elsewhere")
        if not all(common.is_float(t) for t in (a, b, k, m.root.output)):
            return refuse("not float")
        try:
            shape = np.broadcast_shapes(a.shape, _negated(b).shape, k.shape)
        except ValueError:
            return refuse("the operands do not broadcast")
        if tuple(shape) != tuple(m.root.output.shape):
            return refuse("the operands do not broadcast to the sum's shape")
        return None

    def rewrite(self, m: Match, *, b: Tensor, a: Tensor, k: Tensor) -> None:
        add, bld = m.root, m.builder(prefix="")
        neg = b.producer is not None and b.producer.type == "NEG"
        n = _negated(b)
        shape = tuple(np.broadcast_shapes(a.shape, n.shape))
        inner = bld.tensor(add.output.name + "_factored", shape)
        other: Tensor | Value = n
        if neg and not cost.fast_sub(self.target):
            negated = bld.tensor(n.name + "_negated", n.shape)
            other = bld.MUL(n, bld.const(np.float32(-1.0), "minus_one"), out=negated)
            neg = False
        bld.op("SUB" if neg else "ADD", a, other, out=inner)
        bld.replace(add, bld.MUL(inner, k, fused_activation_function=add.fused_activation))


class SquareExistingDifference(Rule):
    """SQUARED_DIFFERENCE(x, m) where d = x - m is already computed (a SUB, or an ADD of
    m * -1)  =>  MUL(d, d).

    Same kernel count; a LayerNorm that FactorCommonMultiplier left with x - m then squares
    that difference instead of recomputing it. Once quantized, the int8 SQUARED_DIFFERENCE
    kernel is 8-30x slower than an int8 MUL on both runtimes (XNNPACK does not take it; see
    delegates/cost_table.json). Float: the same products, exactly.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        # float inputs give a float square; a quantized one the engine refuses first
        return p.SQUARED_DIFFERENCE(
            p.x.of("float", because="not float"), p.mean.of("float", because="not float"), out="y"
        )

    def check(self, m: Match, *, x: Tensor, mean: Tensor, y: Tensor) -> Refusal | Tensor:
        """A refusal, or the tensor that holds x - mean."""
        d = _difference(x, mean)
        if d is None:
            return NotApplicable("x - m is not computed elsewhere")
        if d.shape != y.shape:
            return refuse("the difference has another shape than the square")
        if d.producer in _descendants(m.root):
            return refuse("the difference is computed from the square")
        return d

    def rewrite(self, m: Match, *, plan: Tensor) -> None:
        d, b = plan, m.builder()
        b.replace(m.root, b.MUL(d, d))
        m.graph.toposort()  # the difference may be computed after the square was


def _difference(x: Tensor, m: Tensor) -> Tensor | None:
    """The output of an op computing x - m: SUB(x, m), or ADD(x, n) with n = m * -1."""
    for op in x.consumers:
        if op.fused_activation != "NONE" or not op.outputs:
            continue
        if op.type == "SUB" and op.inputs[0] is x and op.inputs[1] is m:
            return op.output
        if op.type == "ADD" and x in op.inputs:
            n = _other(op, x)
            mul = n.producer if n is not None else None
            if _plain(mul, "MUL") and m in mul.inputs and _is_const(_other(mul, m), -1.0):
                return op.output
    return None


def _descendants(op: Op) -> set[Op]:
    seen: set[Op] = set()
    todo = [op]
    while todo:
        for t in todo.pop().outputs:
            for reader in t.consumers:
                if reader not in seen:
                    seen.add(reader)
                    todo.append(reader)
    return seen


def _negated(t: Tensor) -> Tensor:
    """n when t = NEG(n), else t."""
    op = t.producer
    return op.input(0) if op is not None and op.type == "NEG" else t


class CancelTransposePair(Rule):
    """TRANSPOSE(TRANSPOSE(x, p1), p2)  =>  x when p1[p2] is the identity,
    else TRANSPOSE(x, p1[p2])."""

    quantized_ok = True
    int8_error_steps = 0  # moves bytes only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.TRANSPOSE(p.TRANSPOSE(p.x, p.const("p1"), out="mid"), p.const("p2"), out="y")

    def check(
        self, m: Match, *, x: Tensor, p1: Tensor, p2: Tensor, y: Tensor
    ) -> Refusal | list[int]:
        """A refusal, or the composed permutation."""
        perm = _composed(p1, p2)
        if perm == list(range(len(perm))):
            return _forwardable(m.graph, y, x) or perm
        return perm

    def rewrite(self, m: Match, *, x: Tensor, y: Tensor, plan: list[int]) -> None:
        perm = plan
        if perm == list(range(len(perm))):
            common.forward(m.graph, y, x)
            return
        b = m.builder(prefix="")
        b.set_input(m.root, 0, x)
        b.set_input(m.root, 1, b.ints(perm, "perm"))
        b.commit()


def _composed(p1: Tensor, p2: Tensor) -> list[int]:
    first = np.asarray(p1.data).reshape(-1)
    second = np.asarray(p2.data).reshape(-1)
    return [int(v) for v in first[second]]


class CollapseReshapeChain(Rule):
    """RESHAPE(RESHAPE(x)) | RESHAPE(x) to x's own shape  =>  one RESHAPE | x."""

    quantized_ok = True
    int8_error_steps = 0  # moves bytes only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.RESHAPE(p.x, ..., out="y")

    def check(self, m: Match, *, x: Tensor, y: Tensor) -> Refusal | None:
        inner = x.producer
        if x.shape == y.shape and _same_q(x, y):
            return _forwardable(m.graph, y, x)
        if inner is not None and inner.type == "RESHAPE" and common.single_reader(m.graph, x):
            return None
        return _NOT_A_CHAIN

    def rewrite(self, m: Match, *, x: Tensor, y: Tensor) -> None:
        if x.shape == y.shape and _same_q(x, y):
            common.forward(m.graph, y, x)
            return
        b = m.builder(prefix="")
        b.set_input(m.root, 0, x.op.input(0))
        b.set_input(m.root, 1, b.ints(y.shape, "shape"))
        b.commit()
        m.root.options = {"new_shape": list(y.shape)} if m.root.options else {}


_NOT_A_CHAIN = NotApplicable("a single RESHAPE to a new shape")


def _same_q(a: Tensor, b: Tensor) -> bool:
    qa, qb = a.quantization, b.quantization
    if qa is None or qa.is_empty():
        return qb is None or qb.is_empty()
    return qa.same_as(qb)


class CancelQuantizeDequantize(Rule):
    """QUANTIZE(DEQUANTIZE(q)) with the same type and scale as q  =>  q (exact)."""

    quantized_ok = True
    int8_error_steps = 0  # same type and scale: the values are unchanged
    inner_ops_may_be_shared = True  # the DEQUANTIZE stays for its other readers

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.QUANTIZE(p.DEQUANTIZE(p.q, out="real"), out="y")

    def check(self, m: Match, *, q: Tensor, y: Tensor) -> Refusal | None:
        if q.dtype != y.dtype or not _same_q(q, y) or q.shape != y.shape:
            return refuse("the QUANTIZE uses another type or scale than the DEQUANTIZE input")
        return _forwardable(m.graph, y, q)

    def rewrite(self, m: Match, *, y: Tensor, q: Tensor) -> None:
        common.forward(m.graph, y, q)


# -- activations written out ---------------------------------------------------------------------
def _is_const(t: Tensor | None, value: float, tol: float = 1e-6) -> bool:
    v = common.scalar_value(t)
    return v is not None and abs(v - value) <= tol * max(1.0, abs(value))


def _other(op: Op, t: Tensor) -> Tensor | None:
    """The other input of a binary op whose one input is t."""
    a, b = op.input(0), op.input(1)
    return b if a is t else a if b is t else None


def _plain(op: Op | None, *types: str) -> TypeGuard[Op]:
    return op is not None and op.type in types and op.fused_activation == "NONE"


def _relu6_of_x_plus_3(t: Tensor) -> Tensor | None:
    """x when t = relu6(x + 3) (a RELU6 op or an ADD with fused RELU6)."""
    op = t.producer
    if op is None:
        return None
    if op.type == "RELU6":
        inner = op.input(0).producer
        if not _plain(inner, "ADD"):
            return None
        op, act = inner, "RELU6"
    else:
        act = op.fused_activation
    if op.type != "ADD" or act != "RELU6":
        return None
    a, b = op.operands
    for x, c in ((a, b), (b, a)):
        if _is_const(c, 3.0) and not x.is_constant:
            return x
    return None


def _hard_sigmoid(t: Tensor) -> tuple[Tensor, bool] | None:
    """(x, divided) when t = relu6(x + 3) [/ 6 | * (1/6)]."""
    x = _relu6_of_x_plus_3(t)
    if x is not None:
        return x, False
    op = t.producer
    if _plain(op, "MUL", "DIV"):
        a, b = op.operands
        for inner, c in ((a, b),) + (((b, a),) if op.type == "MUL" else ()):
            scale = 1 / 6 if op.type == "MUL" else 6.0
            if _is_const(c, scale, 1e-5):
                x = _relu6_of_x_plus_3(inner)
                if x is not None:
                    return x, True
    return None


def match_hard_swish(root: Op) -> Tensor | None:
    """x when root computes x * relu6(x + 3) / 6 in any of the usual association orders."""
    if not _plain(root, "MUL", "DIV") or len(root.inputs) != 2:
        return None
    a, b = root.operands
    # x * hsig(x) where hsig already includes the 1/6
    if root.type == "MUL":
        for x, h in ((a, b), (b, a)):
            found = _hard_sigmoid(h)
            if found is not None and found[0] is x and found[1]:
                return x
    # (x * relu6(x + 3)) / 6 or (x * relu6(x + 3)) * (1/6)
    for inner, c in ((a, b), (b, a)) if root.type == "MUL" else ((a, b),):
        scale = 1 / 6 if root.type == "MUL" else 6.0
        if not _is_const(c, scale, 1e-5) or not _plain(inner.producer, "MUL"):
            continue
        p, q = inner.producer.operands
        for x, h in ((p, q), (q, p)):
            if _relu6_of_x_plus_3(h) is x:
                return x
    # x * (relu6(x + 3) * (1/6)) is covered by the first case; (x/6) * relu6(x + 3):
    if root.type == "MUL":
        for s, h in ((a, b), (b, a)):
            op = s.producer
            if _plain(op, "MUL", "DIV"):
                z = _relu6_of_x_plus_3(h)
                scale = 1 / 6 if op.type == "MUL" else 6.0
                if z is not None and z in op.inputs and _is_const(_other(op, z), scale, 1e-5):
                    return z
    return None


class _Recognize(Rule):
    """Shared rewrite: the root's output becomes the output of one builtin activation op."""

    int8_error_steps = 0  # float-only

    builtin = ""

    def _find(self, root: Op) -> tuple[Tensor, dict] | None:
        """The activation's input and the builtin's options, when root ends one written out."""
        raise NotImplementedError

    def check(self, m: Match) -> Refusal | tuple[Tensor, dict]:
        """A refusal, or the activation's input and options."""
        found = self._find(m.root)
        if found is None:
            return NotApplicable(f"not a {self.builtin} written out")
        x = found[0]
        if not common.is_float(x) or x.shape != m.root.output.shape:
            return refuse(f"the {self.builtin} input is not float or is broadcast")
        return found

    def rewrite(self, m: Match, *, plan: tuple[Tensor, dict]) -> None:
        x, options = plan
        b = m.builder()
        b.replace(m.root, b.op(self.builtin, x, options=options))


class RecognizeHardSwish(_Recognize):
    """x * relu6(x + 3) / 6 (any association, / 6 or * 1/6, fused or separate RELU6)  =>
    HARD_SWISH(x)."""

    int8_error_steps = 0  # float-only

    builtin = "HARD_SWISH"

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any("MUL", "DIV")(p.a, p.b)

    def _find(self, root: Op) -> tuple[Tensor, dict] | None:
        x = match_hard_swish(root)
        return None if x is None else (x, {})


def _leaky(root: Op) -> tuple[Tensor, float] | None:
    """(x, alpha) when root = maximum(x, alpha * x), or alpha * x + (1 - alpha) * relu(x)."""
    a, b = root.input(0), root.input(1)
    for x, s in ((a, b), (b, a)):
        op = s.producer
        if root.type == "MAXIMUM" and _plain(op, "MUL") and x in op.operands:
            alpha = common.scalar_value(_other(op, x))
            if alpha is not None and 0.0 <= alpha < 1.0:
                return x, alpha
    if root.type == "ADD" and root.fused_activation == "NONE":
        for lin, rel in ((a, b), (b, a)):
            p, q = lin.producer, rel.producer
            if not (_plain(p, "MUL") and _plain(q, "MUL")):
                continue
            for x in p.operands:
                alpha = common.scalar_value(_other(p, x))
                if alpha is None or not 0.0 <= alpha < 1.0:
                    continue
                for r in q.operands:
                    relu = r.producer
                    if (
                        relu is not None
                        and relu.type == "RELU"
                        and relu.inputs[0] is x
                        and (_is_const(_other(q, r), 1.0 - alpha, 1e-5))
                    ):
                        return x, alpha
    return None


class RecognizeLeakyRelu(_Recognize):
    """maximum(x, a * x) | a * x + (1 - a) * relu(x), 0 <= a < 1  =>  LEAKY_RELU(x, alpha=a)."""

    int8_error_steps = 0  # float-only

    builtin = "LEAKY_RELU"

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any("MAXIMUM", "ADD")(p.a, p.b)

    def _find(self, root: Op) -> tuple[Tensor, dict] | None:
        found = _leaky(root)
        return None if found is None else (found[0], {"alpha": float(found[1])})


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh_input(t: Tensor) -> Tensor | None:
    """x when t = 1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)) (x^3 as POW or two MULs)."""
    op = t.producer
    if not _plain(op, "ADD"):
        return None
    th = next(
        (i for i in op.operands if i.producer is not None and i.producer.type == "TANH"), None
    )
    if th is None or not _is_const(_other(op, th), 1.0):
        return None
    inner = th.op.input(0).producer
    if not _plain(inner, "MUL"):
        return None
    poly = next((i for i in inner.operands if not i.is_constant), None)
    if poly is None or not _is_const(_other(inner, poly), _SQRT_2_OVER_PI, 1e-4):
        return None
    add = poly.producer
    if not _plain(add, "ADD"):
        return None
    first, second = add.operands
    for x, cubic in ((first, second), (second, first)):
        op = cubic.producer
        if _plain(op, "MUL"):
            consts = [i for i in op.operands if i.is_constant]
            cube = next((i for i in op.operands if not i.is_constant), None)
            if (
                cube is not None
                and len(consts) == 1
                and _is_const(consts[0], 0.044715, 1e-4)
                and _is_cube(cube, x)
            ):
                return x
    return None


def _is_cube(t: Tensor, x: Tensor) -> bool:
    op = t.producer
    if op is None:
        return False
    if op.type == "POW":
        return op.inputs[0] is x and _is_const(op.inputs[1], 3.0)
    if _plain(op, "MUL"):
        a, b = op.operands
        sq = b if a is x else a if b is x else None
        return sq is not None and _plain(sq.producer, "MUL") and list(sq.producer.inputs) == [x, x]
    return False


def _gelu(root: Op) -> Tensor | None:
    """x when root = 0.5 * x * (1 + tanh(...)) in one of the usual association orders."""
    if not _plain(root, "MUL"):
        return None
    a, b = root.operands
    for half, rest in ((a, b), (b, a)):
        op = half.producer
        # (0.5 * x) * (1 + tanh(..)) or (x * 0.5) * (...)
        if _plain(op, "MUL") and any(_is_const(i, 0.5) for i in op.inputs):
            x = next(i for i in op.inputs if not _is_const(i, 0.5))
            if _gelu_tanh_input(rest) is x:
                return x
        # 0.5 * (x * (1 + tanh(..)))
        if _is_const(half, 0.5) and _plain(rest.producer, "MUL"):
            p, q = rest.producer.operands
            for x, t in ((p, q), (q, p)):
                if _gelu_tanh_input(t) is x:
                    return x
        # x * (0.5 * (1 + tanh(..)))
        if _plain(rest.producer, "MUL"):
            p, q = rest.producer.operands
            for c, t in ((p, q), (q, p)):
                if _is_const(c, 0.5) and _gelu_tanh_input(t) is half:
                    return half
    return None


class RecognizeGelu(_Recognize):
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), any association  =>
    GELU(x, approximate=True)."""

    int8_error_steps = 0  # float-only

    builtin = "GELU"

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MUL(p.a, p.b)

    def _find(self, root: Op) -> tuple[Tensor, dict] | None:
        x = _gelu(root)
        return None if x is None else (x, {"approximate": True})
