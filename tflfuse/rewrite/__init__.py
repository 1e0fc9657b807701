"""Patterns, rules and the pass manager that applies them to a fixed point.

A rule is three small methods (see docs/ARCHITECTURE.md, "Where things go"):

    class FuseReluIntoConv(Rule):
        '''CONV_2D(x) -> RELU  =>  CONV_2D(x, fused_activation=RELU).'''
        def pattern(self, p): return p.RELU(p.CONV_2D(p.x, p.w, ..., out="conv"))
        def check(self, m: Match, *, conv: Tensor) -> Refusal | None:
            if conv.op.fused_activation != "NONE": return refuse("conv already has an activation")
        def rewrite(self, m: Match, *, x: Tensor, conv: Tensor) -> None: ...

`p.UPPER(...)` matches an op of that type (`p.any("ADD", "SUB")(...)` one of several), its
arguments match the op's inputs in order; `p.lower` is a variable that captures a tensor (the same
name twice must be the same tensor; a missing optional input matches none); `p.const("w")`
captures a constant; `...` as the last argument accepts any further inputs. `out="name"` captures
the op's output tensor (`name.op` is the op, `name.consumers` its readers). Binary ops that
commute are tried in both input orders. The captures reach `check`, `rewrite`, `error_bound` and
`int8_error` as keyword-only arguments of type `Tensor`, each method naming those it reads; a
name the pattern does not capture is a TypeError when the rule is registered (see `rule`).

`check` returns None to go ahead, a `Refusal` (`refuse("a sentence")`; `NotApplicable(...)` when
the pattern only looked alike) or a plan, which `rewrite` (and `error_bound`, `int8_error`)
receive as their `plan` argument, typed as the rule declares it (what check worked out is not
worked out twice); the pass manager records refusals so
`--explain` can tell users why a pattern stayed unfused. Patterns may constrain options and tensor
kinds (`p.CONV_2D(...).where(fused_activation="NONE")`, `p.x.of("float")`, see `pattern`).
`rewrite` builds new ops with a builder bound to the match (`b = m.builder(); y = b.MUL(x, c);
b.replace(m.root, y)`, see `build`), which names, places and checks them; dead ops and tensors
left behind are cleaned by `DeadCodeElimination`. An exception raised by a
rule's check or rewrite becomes a `RewriteError` naming the rule and the op.

Every rule declares `int8_error_steps`: how many quantization steps one application may move the
int8 tensor it writes (0 for rewrites that only move bytes, 1 for one requantization more or
less). `int8_error_bounds` turns the events into a bound per model output (see there).
"""

from __future__ import annotations

from tflfuse.rewrite.build import Builder, BuildError, Value
from tflfuse.rewrite.engine import (
    FLOAT_ONLY,
    PassManager,
    RewriteError,
    int8_error_bounds,
    shared_inner_op,
    touches_quantized,
)
from tflfuse.rewrite.passes import SIDE_EFFECTS, DeadCodeElimination, TopologicalSort
from tflfuse.rewrite.pattern import COMMUTATIVE, Match, OpPattern, PatternBuilder, Var, find_matches
from tflfuse.rewrite.rule import (
    NotApplicable,
    Pass,
    PassResult,
    Refusal,
    RefusalEvent,
    RewriteEvent,
    Rule,
    refuse,
)

__all__ = [
    "COMMUTATIVE",
    "FLOAT_ONLY",
    "SIDE_EFFECTS",
    "BuildError",
    "Builder",
    "DeadCodeElimination",
    "Match",
    "NotApplicable",
    "OpPattern",
    "Pass",
    "PassManager",
    "PassResult",
    "PatternBuilder",
    "Refusal",
    "RefusalEvent",
    "RewriteError",
    "RewriteEvent",
    "Rule",
    "TopologicalSort",
    "Value",
    "Var",
    "find_matches",
    "int8_error_bounds",
    "refuse",
    "shared_inner_op",
    "touches_quantized",
]
