"""Patterns, rules and the pass manager that applies them to a fixed point.

A rule is three small methods (see ../DESIGN "How a rule looks"):

    class FuseReluIntoConv(Rule):
        '''CONV_2D(x) -> RELU  =>  CONV_2D(x, fused_activation=RELU).'''
        def pattern(self, p): return p.RELU(p.CONV_2D(p.x, p.w, p.b, out="conv"))
        def check(self, m):
            if m.conv.op.fused_activation != "NONE": return refuse("conv already has an activation")
        def rewrite(self, m): ...

`p.UPPER(...)` matches an op of that type (`p.any("ADD", "SUB")(...)` one of several), its
arguments match the op's inputs in order; `p.lower` is a variable that captures a tensor (the same
name twice must be the same tensor); `p.const("w")` captures a constant; `...` as the last argument
accepts any further inputs. `out="name"` captures the op's output tensor (`m.name.op` is the op,
`m.name.consumers` its readers). Binary ops that commute are tried in both input orders.

`check` returns None to go ahead or a `Refusal` (a sentence); the pass manager records refusals
so `--explain` can tell users why a pattern stayed unfused. `rewrite` edits `m.graph` in place;
dead ops and tensors left behind are cleaned by `DeadCodeElimination`. An exception raised by a
rule's check or rewrite becomes a `RewriteError` naming the rule and the op.

Every rule declares `int8_error_steps`: how many quantization steps one application may move the
int8 tensor it writes (0 for rewrites that only move bytes, 1 for one requantization more or
less). `int8_error_bounds` turns the events into a bound per model output (see there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, IRError, Model, Op, Tensor

COMMUTATIVE = frozenset(
    {"ADD", "MUL", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "EQUAL", "NOT_EQUAL"}
)

# Ops whose effect is more than their outputs: dead-code elimination keeps them.
SIDE_EFFECTS = frozenset(
    {
        "ASSIGN_VARIABLE",
        "VAR_HANDLE",
        "CALL_ONCE",
        "WHILE",
        "IF",
        "CALL",
        "CUSTOM",
        "HASHTABLE",
        "HASHTABLE_IMPORT",
        "HASHTABLE_FIND",
        "HASHTABLE_SIZE",
        "STABLEHLO_CUSTOM_CALL",
    }
)


# -- refusals ----------------------------------------------------------------------------------
class Refusal(str):
    """Why a rule declined a match: one sentence, shown to the user by `--explain`."""

    quiet = False


class NotApplicable(Refusal):
    """A match that is no candidate at all (a lone conv has no sibling): nothing to explain,
    so the pass manager does not list it among the refusals."""

    quiet = True


def refuse(reason: str) -> Refusal:
    return Refusal(reason)


# -- patterns ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Var:
    """Captures one tensor (or a missing optional input, None) under `name`."""

    name: str
    constant: bool = False


@dataclass(frozen=True)
class OpPattern:
    types: frozenset[str]
    inputs: tuple[Any, ...] | None  # None: any inputs
    out: str | None = None
    rest: bool = False  # the pattern ended with `...`: further inputs are accepted


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


class Match:
    """Captured tensors by name (`m.x`), the anchor op (`m.root`) and the graph (`m.graph`)."""

    def __init__(self, graph: Graph, root: Op, captures: dict[str, Any], ops: list[Op]) -> None:
        self.graph = graph
        self.root = root
        self.ops = ops
        self._captures = captures

    def __getattr__(self, name: str) -> Any:
        try:
            return self._captures[name]
        except KeyError:
            raise AttributeError(f"pattern captured no {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._captures


def _match_op(pat: OpPattern, op: Op, env: dict[str, Any], ops: list[Op]) -> Iterator[dict]:
    if op.type not in pat.types:
        return
    env = dict(env)
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
        if pat.constant and (t is None or not t.is_constant):
            return
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


# -- rules and passes --------------------------------------------------------------------------
class Rule:
    """pattern + check + rewrite. Subclasses set a docstring `before => after`.

    `quantized_ok` says the rewrite is also valid on int8 graphs; the pass manager refuses other
    rules on ops that touch quantized tensors ("float-only rule; the op is quantized").
    `int8_error_steps` is what one application may change, in quantization steps of the int8
    tensor it writes: 0 for a rewrite that only moves bytes, 1 for one requantization more or
    less. Every rule sets it (None is counted as 1 and a test insists on a declaration).
    """

    quantized_ok: ClassVar[bool] = False
    int8_error_steps: ClassVar[int | None] = None
    # The engine refuses a match whose inner ops (all but the root) write a tensor that an op
    # outside the match reads or that is a model output: rewriting them would change what those
    # readers see. A rule whose rewrite leaves the inner ops in place for such readers (it only
    # stops reading them) sets this.
    inner_ops_may_be_shared: ClassVar[bool] = False

    def error_bound(self, m: Match) -> float:
        """The absolute error one application may add to its output: 0 for an exact rewrite.
        An approximation (e.g. erf GELU in the tanh form, for a target with no GELU) overrides
        it; the pass manager records it with the event and verification allows for it."""
        return 0.0

    def int8_error(self, m: Match) -> int:
        """Steps one application may move the int8 tensor it writes: `int8_error_steps`, unless
        a rule whose error depends on the match (a requantization between two scales) says
        more for this one; the pass manager records it with the event."""
        return _declared_steps(self)

    @property
    def name(self) -> str:
        return type(self).__name__

    def pattern(self, p: PatternBuilder) -> OpPattern:
        raise NotImplementedError

    def check(self, m: Match) -> Refusal | None:
        return None

    def rewrite(self, m: Match) -> None:
        raise NotImplementedError

    def compiled(self) -> OpPattern:
        """The pattern, built once per rule instance."""
        if "_pattern" not in self.__dict__:
            self._pattern = self.pattern(PatternBuilder())
        return self._pattern


class Pass:
    """A whole-graph transformation (cleanup, ordering). `run` returns how many changes it made."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def run(self, graph: Graph) -> int:
        raise NotImplementedError


@dataclass(frozen=True)
class RewriteEvent:
    rule: str
    subgraph: int
    where: str
    error: float = 0.0  # the rule's error bound for this application (0: exact)
    int8_steps: int = 0  # quantization steps it may add to an int8 tensor (0: float or exact)
    sites: tuple[str, ...] = ()  # the tensors the rewritten op wrote (where the error enters)


@dataclass(frozen=True)
class RefusalEvent:
    rule: str
    subgraph: int
    where: str
    reason: str
    quiet: bool = False  # a NotApplicable: kept for tests and debugging, not for --explain


@dataclass
class PassResult:
    """What a PassManager run did: applied rewrites, refusals at the fixed point, rounds."""

    events: list[RewriteEvent] = field(default_factory=list)
    refusals: list[RefusalEvent] = field(default_factory=list)
    not_applicable: list[RefusalEvent] = field(default_factory=list)
    rounds: int = 0
    # what the whole-graph passes (cleanup, folding) did to the ops, which makes no events:
    # {pass: {op type: ops removed (negative: added)}}, so every removed op is attributed
    pass_changes: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.events)

    def fired(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in self.events:
            counts[e.rule] = counts.get(e.rule, 0) + 1
        return counts

    def note_pass(self, name: str, before: Counter[str], after: Counter[str]) -> None:
        """Record the ops pass `name` removed (or added), by type."""
        entry = self.pass_changes.setdefault(name, {})
        for op_type in sorted(set(before) | set(after)):
            delta = before[op_type] - after[op_type]
            if delta:
                entry[op_type] = entry.get(op_type, 0) + delta
                if not entry[op_type]:
                    del entry[op_type]
        if not entry:
            del self.pass_changes[name]

    def approximations(self) -> dict[str, dict[str, float]]:
        """Rules that fired as approximations: {rule: {count, error_bound}} (summed bounds)."""
        out: dict[str, dict[str, float]] = {}
        for e in self.events:
            if e.error > 0:
                entry = out.setdefault(e.rule, {"count": 0, "error_bound": 0.0})
                entry["count"] += 1
                entry["error_bound"] += e.error
        return out

    def int8_rewrites(self) -> dict[str, dict[str, int]]:
        """Rules that fired on int8 tensors with a declared error: {rule: {count, steps}}."""
        out: dict[str, dict[str, int]] = {}
        for e in self.events:
            if e.int8_steps > 0:
                entry = out.setdefault(e.rule, {"count": 0, "steps": 0})
                entry["count"] += 1
                entry["steps"] += e.int8_steps
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "approximations": self.approximations(),
            "int8_rewrites": self.int8_rewrites(),
            "fired": self.fired(),
            "passes": {name: dict(ops) for name, ops in self.pass_changes.items()},
            "events": [vars(e) for e in self.events],
            "refusals": [{k: v for k, v in vars(r).items() if k != "quiet"} for r in self.refusals],
        }


class RewriteError(TflfuseError):
    """A rule failed (raised, or left the graph invalid): a bug in that rule, reported in one
    line with its name and the op it was working on; nothing is written."""

    def __init__(self, message: str, rule: str = "", where: str = "") -> None:
        super().__init__(message)
        self.rule = rule
        self.where = where


FLOAT_ONLY = "float-only rule; the op is quantized"


def touches_quantized(op: Op) -> bool:
    return any(t is not None and t.is_quantized for t in (*op.inputs, *op.outputs))


class PassManager:
    """Applies rules and passes in order, round after round, until a round changes nothing."""

    def __init__(
        self,
        passes: Sequence[Rule | Pass],
        *,
        validate: bool = True,
        max_rounds: int = 50,
        disabled: Sequence[str] = (),
    ) -> None:
        self.passes = [p for p in passes if p.name not in set(disabled)]
        self.validate = validate
        self.max_rounds = max_rounds

    def run(self, target: Model | Graph) -> PassResult:
        graphs = target.subgraphs if isinstance(target, Model) else [target]
        result = PassResult()
        for index, graph in enumerate(graphs):
            self._run_graph(index, graph, result)
        return result

    def _run_graph(self, index: int, graph: Graph, result: PassResult) -> None:
        for round_no in range(1, self.max_rounds + 1):
            result.rounds = max(result.rounds, round_no)
            refusals: dict[tuple, RefusalEvent] = {}
            changed = False
            for p in self.passes:
                if isinstance(p, Rule):
                    n = self._apply_rule(p, index, graph, result, refusals)
                else:
                    before = Counter(op.type for op in graph.ops)
                    n = self._run_pass(p, graph)
                    if n:
                        result.note_pass(p.name, before, Counter(op.type for op in graph.ops))
                if n:
                    changed = True
                    self._check(graph, p.name)
            if not changed:
                for r in refusals.values():
                    (result.not_applicable if r.quiet else result.refusals).append(r)
                return
        raise RewriteError(f"no fixed point after {self.max_rounds} rounds (rules keep rewriting)")

    def _apply_rule(
        self, rule: Rule, index: int, graph: Graph, result: PassResult, refusals: dict
    ) -> int:
        pattern = rule.compiled()
        applied = 0
        for op in list(graph.ops):
            if op.type not in pattern.types or not op.outputs:
                continue  # wrong type, or removed by an earlier rewrite in this sweep
            float_only = not rule.quantized_ok and touches_quantized(op)
            for m in self._matches(rule, pattern, graph, op):
                if float_only:
                    reason: Refusal | None = refuse(FLOAT_ONLY)
                else:
                    reason = self._guarded(rule, op, "check", rule.check, m)
                    if reason is None and not rule.inner_ops_may_be_shared:
                        reason = shared_inner_op(m)
                if reason is not None:
                    refusals[(rule.name, op.name, reason)] = RefusalEvent(
                        rule.name, index, op.name, str(reason), getattr(reason, "quiet", False)
                    )
                    if float_only:
                        break
                    continue
                where = op.name
                error = self._guarded(rule, op, "error bound", rule.error_bound, m)
                quantized = any(touches_quantized(o) for o in m.ops) or touches_quantized(op)
                steps = (
                    self._guarded(rule, op, "int8 error", rule.int8_error, m) if quantized else 0
                )
                sites = tuple(t.name for t in op.outputs)
                self._guarded(rule, op, "rewrite", rule.rewrite, m)
                result.events.append(RewriteEvent(rule.name, index, where, error, steps, sites))
                applied += 1
                break
        return applied

    @staticmethod
    def _run_pass(p: Pass, graph: Graph) -> int:
        try:
            return p.run(graph)
        except TflfuseError:
            raise
        except Exception as exc:  # any failure is that pass's bug, named
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise RewriteError(
                f"pass {p.name} failed on subgraph {graph.name!r}: {type(exc).__name__}"
                f"{': ' + detail if detail else ''} (a bug in tflfuse; pass --disable {p.name}"
                " to go on without it)",
                rule=p.name,
            ) from exc

    @staticmethod
    def _matches(rule: Rule, pattern: OpPattern, graph: Graph, op: Op) -> Iterator[Match]:
        try:
            yield from find_matches(pattern, graph, op)
        except RewriteError:
            raise
        except Exception as exc:  # any failure is that rule's bug, named
            raise _rule_failed(rule, op, "pattern", exc) from exc

    @staticmethod
    def _guarded(rule: Rule, op: Op, stage: str, fn: Callable[[Match], Any], m: Match) -> Any:
        """fn(m), with any exception turned into a RewriteError naming the rule and the op."""
        try:
            return fn(m)
        except RewriteError:
            raise
        except Exception as exc:  # any failure is that rule's bug, named
            raise _rule_failed(rule, op, stage, exc) from exc

    def _check(self, graph: Graph, name: str) -> None:
        if not self.validate:
            return
        try:
            graph.validate()
        except IRError as exc:
            raise RewriteError(
                f"{name} left subgraph {graph.name!r} invalid: {exc}", rule=name
            ) from exc


def shared_inner_op(m: Match) -> Refusal | None:
    """A refusal when an inner op of the match (any but the root) writes a tensor read outside
    the match or a model output: the one check every multi-op rule needs, made once here."""
    inside = {id(o) for o in m.ops}
    for inner in m.ops:
        if inner is m.root:
            continue
        for t in inner.outputs:
            if m.graph.is_graph_output(t):
                return refuse(f"{inner.type} output is also a model output")
            if any(id(c) not in inside for c in t.consumers):
                return refuse(f"{inner.type} output is also read by another op")
    return None


def _declared_steps(rule: Rule) -> int:
    steps = rule.int8_error_steps
    return 1 if steps is None else int(steps)


def _rule_failed(rule: Rule, op: Op, stage: str, exc: Exception) -> RewriteError:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    what = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return RewriteError(
        f"rule {rule.name} failed in its {stage} on {op.type} op {op.name!r}: {what}"
        f" (a bug in tflfuse; pass --disable {rule.name} to go on without it)",
        rule=rule.name,
        where=op.name,
    )


def int8_error_bounds(model: Model, result: PassResult) -> dict[str, float]:
    """The error each output of the main subgraph may carry after the rewrites in `result`:
    quantization steps for int8 outputs, real units for float outputs of an int8 graph.

    The declared steps of every rewrite are carried from the tensor it wrote along the paths to
    each output, worst case (see `tflfuse.int8_error` for the exact rule); an output no int8
    rewrite reaches gets 0 and must match exactly.
    """
    from tflfuse.int8_error import output_bounds

    return output_bounds(model, result.events)


# -- the passes every pipeline ends with -------------------------------------------------------
class DeadCodeElimination(Pass):
    """Remove ops nobody reads (unless they have side effects) and tensors nobody references."""

    def run(self, graph: Graph) -> int:
        removed = 0
        outputs = set(graph.outputs)
        changed = True
        while changed:
            changed = False
            for op in reversed(list(graph.ops)):
                if op.type in SIDE_EFFECTS or op.extra.get("mutating_variable_inputs"):
                    continue
                if any(t.is_variable for t in op.inputs if t is not None):
                    continue
                if any(t.consumers or t in outputs for t in op.outputs):
                    continue
                graph.remove_op(op)
                removed += 1
                changed = True
        referenced = set(graph.inputs) | outputs
        for op in graph.ops:
            referenced.update(
                t for t in (*op.inputs, *op.outputs, *op.intermediates) if t is not None
            )
        kept = [t for t in graph.tensors if t in referenced]
        removed += len(graph.tensors) - len(kept)
        graph.tensors = kept
        return removed


class TopologicalSort(Pass):
    """Re-order ops so producers come first (rewrites may append ops at the end)."""

    def run(self, graph: Graph) -> int:
        return int(graph.toposort())
