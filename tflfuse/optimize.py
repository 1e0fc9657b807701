"""`tflfuse optimize`: load a .tflite, run the target pipeline, verify, describe what happened.

Verification runs the input and the output in the interpreter on the same seeded inputs. A result
outside tolerance is an error (nothing is written); a model the interpreter cannot run on this host
(e.g. an Edge TPU custom op) is reported as not verified, with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tflfuse import flatbuffer
from tflfuse.cost import cost_delta, model_cost
from tflfuse.errors import TflfuseError
from tflfuse.ir import Model
from tflfuse.rewrite import PassManager, PassResult
from tflfuse.rules import pipeline
from tflfuse.summary import activation_bytes

ATOL = RTOL = 1e-5  # float outputs: |fused - input| <= ATOL + RTOL * |input|
PROPAGATION = 10.0  # allowance for an approximation's error growing through later layers


class VerificationError(TflfuseError):
    """The optimized model does not compute the same function as its input."""


@dataclass
class OptimizeResult:
    data: bytes
    model: Model
    result: PassResult
    before: dict[str, Any]
    after: dict[str, Any]
    verification: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "before": self.before,
            "after": self.after,
            **self.result.to_dict(),
            "cost": cost_delta(self.before["cost"], self.after["cost"]),
            "verification": self.verification,
        }


def _totals(model: Model) -> dict[str, Any]:
    return {
        "op_count": sum(len(g.ops) for g in model.subgraphs),
        "op_counts": model.main.op_counts(),
        "activation_bytes": sum(activation_bytes(g) for g in model.subgraphs),
        "cost": model_cost(model),
    }


def check_options(*, level: int, target: str, disabled: Sequence[str] = ()) -> None:
    """TflfuseError (one line) for an unknown level, target or rule name: none is ignored."""
    from tflfuse.rules import TARGETS, all_rule_names

    if isinstance(level, bool) or level not in (0, 1, 2):
        raise TflfuseError(f"level must be 0, 1 or 2, not {level!r}")
    if target not in TARGETS:
        raise TflfuseError(f"target {target!r} unknown (choose from {', '.join(TARGETS)})")
    if isinstance(disabled, str):
        raise TflfuseError(f"disabled must be a list of rule names, not the string {disabled!r}")
    names = all_rule_names()
    unknown = [r for r in disabled if r not in names]
    if unknown:
        raise TflfuseError(f"unknown rule {unknown[0]!r} (rules: {', '.join(names)})")


def optimize_bytes(
    data: bytes,
    *,
    level: int = 2,
    target: str = "xnnpack",
    disabled: tuple[str, ...] = (),
    verify: bool = True,
    source: str = "<bytes>",
) -> OptimizeResult:
    """Optimize a .tflite given as bytes; raises VerificationError if the function changed."""
    check_options(level=level, target=target, disabled=disabled)
    model = flatbuffer.from_bytes(data, source)
    before = _totals(model)
    result = PassManager(pipeline(level, target), disabled=disabled).run(model)
    out = flatbuffer.to_bytes(model)
    # Quantized outputs: every rewrite may round differently by one step (e.g. PRELU vs the
    # LEAKY_RELU kernel), so the budget is one step per rewrite applied, plus one.
    int_atol = 1 + len(result.events)
    # An approximation's error can grow through the layers after it: allow PROPAGATION times
    # the summed per-op bounds on top of the float tolerance (0 when every rewrite is exact).
    atol = ATOL + PROPAGATION * sum(e.error for e in result.events)
    verification = _verify(data, out, verify and level > 0, atol, int_atol)
    if verification.get("ok") is False:
        raise VerificationError(
            f"verification failed: max abs error {verification['max_abs']:.3g} "
            f"(rules fired: {', '.join(result.fired()) or 'none'}); nothing written"
        )
    return OptimizeResult(out, model, result, before, _totals(model), verification)


def _verify(
    reference: bytes, candidate: bytes, enabled: bool, atol: float, int_atol: int
) -> dict[str, Any]:
    if not enabled:
        return {"verified": False, "reason": "not requested"}
    if reference == candidate:
        return {"verified": True, "ok": True, "identical_bytes": True}
    from tflfuse.verify import compare

    try:
        agreement = compare(reference, candidate, atol=atol, rtol=RTOL, int_atol=int_atol)
    except TflfuseError as exc:
        return {"verified": False, "reason": str(exc)}
    tolerance = {"atol": atol, "rtol": RTOL, "int_steps": int_atol}
    return {"verified": True, **agreement.to_dict(), "tolerance": tolerance}
