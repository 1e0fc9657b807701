"""Patterns: what a rule matches (`p.RELU(p.CONV_2D(p.x, p.w, p.b, out="conv"))`), and
the matcher that finds every way a pattern matches at an op (see `tflfuse.rewrite`).

Constraints beyond op types: `p.CONV_2D(...).where(fused_activation="NONE")` requires option
values (`fused_activation` is short for `fused_activation_function`, NONE when absent) and
`p.x.of("float")` a tensor kind ("float": float32 and not quantized; "int8": int8/uint8
quantized per tensor; or a dtype name). A constraint without `because=` is part of the pattern
(no match, nothing to explain); with `because="..."` the match is made and the engine refuses it
with that sentence before the rule's check runs, so `--explain` keeps telling users why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from tflfuse.ir import Graph, Op, Quantization, Tensor
from tflfuse.rewrite.build import Builder

COMMUTATIVE = frozenset(
    {"ADD", "MUL", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "EQUAL", "NOT_EQUAL"}
)


# -- patterns ----------------------------------------------------------------------------------
_UNMET = "!unmet"  # the key under which a match carries the reason of a failed soft constraint
_OPTION_ALIASES = {"fused_activation": "fused_activation_function"}
_OPTION_DEFAULTS = {"fused_activation_function": "NONE"}


def tensor_kind_is(t: Tensor | None, kind: str) -> bool:
    """`t` is of `kind`: "float" (float32, not quantized), "int8" (int8/uint8 quantized per
    tensor) or a TFLite dtype name."""
    if t is None:
        return False
    if kind == "float":
        return t.dtype == "FLOAT32" and not t.is_quantized
    if kind == "int8":
        q = cast(Quantization, t.quantization)
        return t.dtype in ("INT8", "UINT8") and t.is_quantized and not q.per_channel
    return t.dtype == kind


@dataclass(frozen=True)
class Var:
    """Captures one tensor under `name` (a missing optional input matches no variable)."""

    name: str
    constant: bool = False
    kind: str | None = None
    because: str | None = None

    def of(self, kind: str, because: str | None = None) -> Var:
        """This variable, constrained to tensors of `kind` (see the module docstring)."""
        return Var(self.name, self.constant, kind, because)


@dataclass(frozen=True)
class OpPattern:
    types: frozenset[str]
    inputs: tuple[Any, ...] | None  # None: any inputs
    out: str | None = None
    rest: bool = False  # the pattern ended with `...`: further inputs are accepted
    options: tuple[tuple[str, Any], ...] = ()
    because: str | None = None

    def where(self, because: str | None = None, **options: object) -> OpPattern:
        """This pattern, matching only ops whose options have these values."""
        pairs = tuple((_OPTION_ALIASES.get(k, k), v) for k, v in options.items())
        return OpPattern(
            self.types, self.inputs, self.out, self.rest, self.options + pairs, because
        )

    def options_hold(self, op: Op) -> bool:
        return all(op.options.get(k, _OPTION_DEFAULTS.get(k)) == v for k, v in self.options)


class PatternBuilder:
    """`p` in `Rule.pattern(self, p)`: attribute access builds patterns."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name.isupper():
            return self.any(name)
        return Var(name)

    def const(self, name: str) -> Var:
        return Var(name, constant=True)

    def any(self, *types: str) -> Callable[..., OpPattern]:
        def build(*inputs: Any, out: str | None = None) -> OpPattern:
            rest = bool(inputs) and inputs[-1] is Ellipsis
            args = inputs[:-1] if rest else inputs
            return OpPattern(frozenset(types), tuple(args) if inputs else None, out, rest)

        return build


def captured_names(pattern: OpPattern) -> frozenset[str]:
    """Every name `pattern` captures: its variables and its ops' `out=` names."""
    names: set[str] = set()
    todo: list[Any] = [pattern]
    while todo:
        pat = todo.pop()
        if isinstance(pat, Var):
            names.add(pat.name)
        elif isinstance(pat, OpPattern):
            if pat.out is not None:
                names.add(pat.out)
            todo.extend(pat.inputs or ())
    return frozenset(names)


class Match:
    """One match: the anchor op (`m.root`), the matched ops (`m.ops`), the graph (`m.graph`)
    and a builder bound to them (`m.builder()`).

    The captured tensors reach the rule's methods as keyword arguments (see
    `tflfuse.rewrite.rule`); `captures` holds them for the engine that passes them on.
    `m.unmet` is the reason of a failed soft constraint.
    """

    def __init__(self, graph: Graph, root: Op, captures: dict[str, Any], ops: list[Op]) -> None:
        self.graph = graph
        self.root = root
        self.ops = ops
        captures = dict(captures)
        self.unmet: str | None = captures.pop(_UNMET, None)
        self.captures: Mapping[str, Tensor] = MappingProxyType(captures)

    def builder(
        self,
        at: Op | None = None,
        prefix: str | None = None,
        after: Op | None = None,
    ) -> Builder:
        """A builder placing new ops where `at` (default: the root) is, or right after `after`,
        naming new tensors `<prefix>/<name>` (default: the output name of `at`; `prefix=""`:
        the names as given); see `tflfuse.rewrite.build`."""
        return Builder(self.graph, at or after or self.root, prefix, after)


def _match_op(pat: OpPattern, op: Op, env: dict[str, Any], ops: list[Op]) -> Iterator[dict]:
    if op.type not in pat.types:
        return
    env = dict(env)
    if pat.options and not pat.options_hold(op):
        if pat.because is None:
            return
        env.setdefault(_UNMET, pat.because)
    if pat.out is not None:
        if not op.outputs:
            return
        if pat.out in env and env[pat.out] is not op.outputs[0]:
            return
        env[pat.out] = op.outputs[0]
    if pat.inputs is None:
        ops.append(op)
        yield env
        ops.pop()
        return
    n = len(pat.inputs)
    if len(op.inputs) < n or (len(op.inputs) > n and not pat.rest):
        return
    orders = [op.inputs[:n]]
    if op.type in COMMUTATIVE and n == 2 and op.inputs[0] is not op.inputs[1]:
        orders.append((op.inputs[1], op.inputs[0]))
    ops.append(op)
    for args in orders:
        yield from _match_args(list(pat.inputs), list(args), env, ops)
    ops.pop()


def _match_args(pats: list, tensors: list, env: dict, ops: list[Op]) -> Iterator[dict]:
    if not pats:
        yield env
        return
    for env2 in _match_tensor(pats[0], tensors[0], env, ops):
        yield from _match_args(pats[1:], tensors[1:], env2, ops)


def _match_tensor(pat: Any, t: Tensor | None, env: dict, ops: list[Op]) -> Iterator[dict]:
    if isinstance(pat, Var):
        if t is None or (pat.constant and not t.is_constant):
            return
        if pat.kind is not None and not tensor_kind_is(t, pat.kind):
            if pat.because is None:
                return
            env = {**env, _UNMET: env.get(_UNMET, pat.because)}
        if pat.name in env:
            if env[pat.name] is t:
                yield env
            return
        yield {**env, pat.name: t}
    elif isinstance(pat, OpPattern):
        if t is None or t.producer is None:
            return
        for env2 in _match_op(pat, t.producer, env, ops):
            if t is not t.producer.outputs[0]:
                continue  # patterns speak of an op's first output
            yield env2
    else:
        raise TypeError(f"not a pattern: {pat!r}")


def find_matches(pattern: OpPattern, graph: Graph, op: Op) -> Iterator[Match]:
    """Every way `pattern` matches with `op` as its root."""
    ops: list[Op] = []
    for env in _match_op(pattern, op, {}, ops):
        yield Match(graph, op, env, list(ops))
