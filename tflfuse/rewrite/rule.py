"""Rules and passes, refusals, and the record of what a run did (`PassResult`).

A `Rule` is pattern + check + rewrite; `check` returns None, a `Refusal` (a sentence that
`--explain` shows) or a plan for `rewrite`. A `Pass` is a whole-graph transformation.

Captures reach a rule as typed keyword arguments, named as the pattern names them:

    def pattern(self, p): return p.MUL(p.x, p.const("c"), out="y")
    def check(self, m: Match, *, x: Tensor, c: Tensor) -> Refusal | None: ...
    def rewrite(self, m: Match, *, x: Tensor, y: Tensor) -> None: ...

Each of `check`, `rewrite`, `error_bound` and `int8_error` takes the `Match` (root, graph, ops,
builder) and, keyword-only, the captures it uses, each a `Tensor` (a variable never captures a
missing optional input); `rewrite`, `error_bound` and `int8_error` may also take `plan`, what
`check` returned when it went ahead (None if it returned None). Keyword arguments rather than a
record per rule (onnxscript's rewriter passes captures the same way): the parameter list is
the one declaration, mypy checks every use in the body against `Tensor`, a method takes only
what it reads, and a name the pattern does not capture fails when the rule is first compiled
(`bind_captures`), not at some later match.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from tflfuse.ir import Graph
from tflfuse.json_types import JSONDict
from tflfuse.rewrite.pattern import Match, OpPattern, PatternBuilder, captured_names


# -- refusals ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Refusal:
    """Why a rule declined a match: one sentence (`reason`), shown to the user by `--explain`.
    `str(refusal)` is the sentence; a refusal is not itself a string, so a plan can never be
    mistaken for one (nor one for a plan)."""

    reason: str
    quiet: bool = False

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class NotApplicable(Refusal):
    """A match that is no candidate at all (a lone conv has no sibling): nothing to explain,
    so the pass manager does not list it among the refusals."""

    quiet: bool = True


def refuse(reason: str) -> Refusal:
    return Refusal(reason)


# -- captures as keyword arguments -------------------------------------------------------------
HOOKS = ("check", "rewrite", "error_bound", "int8_error")
_RESERVED = frozenset({"m", "plan", "self"})


def bind_captures(rule: Rule, pattern: OpPattern) -> dict[str, tuple[str, ...]]:
    """{hook: the keyword arguments it takes} for each of the rule's `HOOKS`, checked against
    the captures of its pattern: a TypeError naming the rule, the method and the name when a
    method asks for a capture the pattern lacks (a typo found when the rule is compiled)."""
    captures = captured_names(pattern)
    clash = sorted(captures & _RESERVED)
    if clash:
        raise TypeError(f"rule {rule.name}: its pattern captures {clash[0]!r}, a reserved name")
    wants: dict[str, tuple[str, ...]] = {}
    for hook in HOOKS:
        names = []
        params = list(inspect.signature(getattr(rule, hook)).parameters.values())[1:]
        for param in params:
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue  # the base class's catch-all
            if param.kind is not param.KEYWORD_ONLY:
                raise TypeError(
                    f"rule {rule.name}: {hook}() takes {param.name!r} by position; captures"
                    " are keyword-only (after `*`)"
                )
            if param.name not in captures and not (param.name == "plan" and hook != "check"):
                known = ", ".join(sorted(captures)) or "nothing"
                raise TypeError(
                    f"rule {rule.name}: {hook}() takes {param.name!r}, which its pattern does"
                    f" not capture (it captures {known})"
                )
            names.append(param.name)
        wants[hook] = tuple(names)
    return wants


def call_hook(rule: Rule, hook: str, m: Match, plan: object = None) -> object:
    """rule.<hook>(m, **the captures and plan it takes)."""
    rule.compiled()
    captures: Mapping[str, object] = m.captures
    kwargs = {n: plan if n == "plan" else captures[n] for n in rule._wants[hook]}
    result: object = getattr(rule, hook)(m, **kwargs)
    return result


# -- the hooks' defaults (a rule's own method replaces them) -----------------------------------
def _exact(rule: Rule, m: Match, *_: object, **captures: object) -> float:
    return 0.0


def _declared(rule: Rule, m: Match, *_: object, **captures: object) -> int:
    return _declared_steps(rule)


def _go_ahead(rule: Rule, m: Match, *_: object, **captures: object) -> None:
    return None


def _unwritten(rule: Rule, m: Match, *_: object, **captures: object) -> None:
    raise NotImplementedError


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
    # A float spelling whose intermediate tensors would take int8 ranges that lose the signal,
    # where an int8 form of the same rule (run after quantizing) measures its own error: before
    # a quantization (`pipeline(..., before_int8=True)`) the float form is not written, and the
    # quantized op is left to that int8 form.
    float_form_loses_int8: ClassVar[bool] = False
    # A float form that, when an int8 quantization follows, writes an op an int8 rule completes
    # later (the attention's sums: a float SUM before quantizing, whose int8 form
    # `tflfuse.targets.edgetpu.sumconv` turns into the DEPTHWISE_CONV_2D the compiler maps, so no
    # float interpreter packs the depthwise kernels). Before a quantization, where the recipe
    # asks for it (`pipeline(..., int8_completes=True)`), `waiting_for_int8()` runs in its place.
    float_form_waits_for_int8: ClassVar[bool] = False
    _pattern: OpPattern  # set by `compiled`
    _wants: dict[str, tuple[str, ...]]  # {hook: the captures it takes}, set by `compiled`

    # The hooks: attributes of type `Callable[..., result]` (the defaults are the functions
    # below), so that a rule's own method (the captures it reads, keyword-only and typed) is a
    # valid override for mypy, whose result must still be the hook's.
    # error_bound: the absolute error one application may add to its output: 0 for an exact
    # rewrite. An approximation (e.g. erf GELU in the tanh form, for a target with no GELU)
    # overrides it; the pass manager records it with the event and verification allows for it.
    error_bound: Callable[..., float] = _exact
    # int8_error: steps one application may move the int8 tensor it writes: `int8_error_steps`,
    # unless a rule whose error depends on the match (a requantization between two scales) says
    # more for this one; the pass manager records it with the event.
    int8_error: Callable[..., int] = _declared
    # check: None to go ahead, a `Refusal` to decline, or a plan (anything else: `object`): what
    # the check worked out and `rewrite` needs, which the engine hands over as its `plan`.
    check: Callable[..., object] = _go_ahead
    rewrite: Callable[..., None] = _unwritten

    def waiting_for_int8(self) -> Rule:
        """The rule as it writes its float form when an int8 rule completes it after the
        quantization (`float_form_waits_for_int8`); itself for every other rule."""
        return self

    @property
    def name(self) -> str:
        return type(self).__name__

    def pattern(self, p: PatternBuilder) -> OpPattern:
        raise NotImplementedError

    def compiled(self) -> OpPattern:
        """The pattern, built once per rule instance, its captures bound to the methods that
        take them (`bind_captures`: a TypeError when one names a capture the pattern lacks)."""
        if "_pattern" not in self.__dict__:
            pattern = self.pattern(PatternBuilder())
            self._wants = bind_captures(self, pattern)
            self._pattern = pattern
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
    quantized: bool = False  # the match touched quantized tensors (an int8 rewrite)
    boundary: tuple[str, ...] = ()  # the activations the match read from outside it


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

    def to_dict(self) -> JSONDict:
        return {
            "rounds": self.rounds,
            "approximations": self.approximations(),
            "int8_rewrites": self.int8_rewrites(),
            "fired": self.fired(),
            "passes": {name: dict(ops) for name, ops in self.pass_changes.items()},
            "events": [vars(e) for e in self.events],
            "refusals": [{k: v for k, v in vars(r).items() if k != "quiet"} for r in self.refusals],
        }


def _declared_steps(rule: Rule) -> int:
    steps = rule.int8_error_steps
    return 1 if steps is None else int(steps)
