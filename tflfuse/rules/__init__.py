"""Rewrite rules, one module per kind, and the ordered pipelines that use them.

A pipeline is a tuple read top to bottom; `pipeline(level, target)` returns the one to run.
"""

from __future__ import annotations

from tflfuse.rewrite import DeadCodeElimination, Pass, Rule, TopologicalSort
from tflfuse.rules.epilogue import FuseActivationIntoProducer


def pipeline(level: int, target: str = "xnnpack") -> tuple[Rule | Pass, ...]:
    """The rules and passes for an optimization level (0: none) and target."""
    if level <= 0:
        return ()
    return (
        FuseActivationIntoProducer(),
        DeadCodeElimination(),
        TopologicalSort(),
    )


def all_rule_names() -> list[str]:
    return sorted({p.name for level in (1, 2) for p in pipeline(level)})
