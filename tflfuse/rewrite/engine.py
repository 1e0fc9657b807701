"""The pass manager: applies rules and passes in order, round after round, to a fixed point;
refuses matches the engine can judge alone (float-only rules on quantized ops, inner ops
read outside the match) and turns a rule's exception into a `RewriteError` naming it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, IRError, Model, Op
from tflfuse.rewrite.int8_error import output_bounds
from tflfuse.rewrite.pattern import Match, OpPattern, find_matches
from tflfuse.rewrite.rule import (
    Pass,
    PassResult,
    Refusal,
    RefusalEvent,
    RewriteEvent,
    Rule,
    call_hook,
    refuse,
)


class RewriteError(TflfuseError):
    """A rule failed (raised, or left the graph invalid): a bug in that rule, reported in one
    line with its name and the op it was working on; nothing is written."""

    def __init__(self, message: str, rule: str = "", where: str = "") -> None:
        super().__init__(message)
        self.rule = rule
        self.where = where


FLOAT_ONLY = "float-only rule; the op is quantized"
_HOOK = {
    "check": "check",
    "rewrite": "rewrite",
    "error bound": "error_bound",
    "int8 error": "int8_error",
}


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
        for p in self.passes:
            if isinstance(p, Rule):
                p.compiled()  # a method naming a capture its pattern lacks fails here
        self.validate = validate
        self.max_rounds = max_rounds

    def run(self, target: Model | Graph) -> PassResult:
        graphs = target.subgraphs if isinstance(target, Model) else [target]
        result = PassResult()
        for index, graph in enumerate(graphs):
            self._run_graph(index, graph, result)
        return result

    def _run_graph(self, index: int, graph: Graph, result: PassResult) -> None:
        fired: list[str] = []
        for round_no in range(1, self.max_rounds + 1):
            result.rounds = max(result.rounds, round_no)
            refusals: dict[tuple, RefusalEvent] = {}
            changed = False
            fired = []
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
                    fired.append(p.name)
                    self._check(graph, p.name)
            if not changed:
                for r in refusals.values():
                    (result.not_applicable if r.quiet else result.refusals).append(r)
                return
        raise RewriteError(
            f"no fixed point after {self.max_rounds} rounds"
            f" (rules keep rewriting: {', '.join(fired)})"
        )

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
                plan: Any = None
                if float_only:
                    reason: Refusal | None = refuse(FLOAT_ONLY)
                elif m.unmet is not None:
                    reason = refuse(m.unmet)
                else:
                    reason, plan = self._judge(rule, op, m)
                    if reason is None and not rule.inner_ops_may_be_shared:
                        reason = shared_inner_op(m)
                if reason is not None:
                    refusals[(rule.name, op.name, reason.reason)] = RefusalEvent(
                        rule.name, index, op.name, reason.reason, reason.quiet
                    )
                    if float_only:
                        break
                    continue
                where = op.name
                error = self._guarded(rule, op, "error bound", m, plan)
                quantized = any(touches_quantized(o) for o in m.ops) or touches_quantized(op)
                steps = self._guarded(rule, op, "int8 error", m, plan) if quantized else 0
                sites = tuple(t.name for t in op.outputs)
                boundary = match_boundary(m)
                self._guarded(rule, op, "rewrite", m, plan)
                result.events.append(
                    RewriteEvent(rule.name, index, where, error, steps, sites, quantized, boundary)
                )
                applied += 1
                break
        return applied

    def _judge(self, rule: Rule, op: Op, m: Match) -> tuple[Refusal | None, Any]:
        """The rule's check: (a refusal, None), or (None, the plan it made or None)."""
        verdict = self._guarded(rule, op, "check", m)
        if isinstance(verdict, Refusal):
            return verdict, None
        return None, verdict

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
    def _guarded(rule: Rule, op: Op, stage: str, m: Match, plan: Any = None) -> Any:
        """The rule's method for `stage` called on `m` (its captures and plan as keyword
        arguments), with any exception turned into a RewriteError naming the rule and the op."""
        try:
            return call_hook(rule, _HOOK[stage], m, plan)
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


def match_boundary(m: Match) -> tuple[str, ...]:
    """The activations the match's ops read from outside it (constants aside), in reading
    order: where a per-rewrite check feeds the ops before and after the same values."""
    inside = {id(t) for o in m.ops for t in o.outputs}
    seen: dict[str, None] = {}
    for o in m.ops:
        for t in o.inputs:
            if t is not None and not t.is_constant and id(t) not in inside:
                seen.setdefault(t.name, None)
    return tuple(seen)


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
    each output, worst case (see `tflfuse.rewrite.int8_error` for the exact rule); an output no int8
    rewrite reaches gets 0 and must match exactly.
    """
    return output_bounds(model, result.events)
