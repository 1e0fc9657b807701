"""`tflfuse optimize`: load a .tflite, run the target pipeline, verify, describe what happened.

The pipeline is applied, verified and blamed by `tflfuse.verification.verified` (the one service
every rewrite goes through). Verification runs the input and the output in the interpreter on the
same seeded inputs, and it can fail three ways, each an error that writes nothing:
- the output does not run while the input does (a rewrite broke it): the rule is named, found
  by re-running the pipeline without each fired rule in turn;
- an output differs by more than its tolerance: a float output element by the float32 round-off
  that re-associating the arithmetic behind it can cause (`tflfuse.verification.roundoff`: it
  follows the output's magnitude and the gain of every path to it, measured on the input model),
  plus `verified.PROPAGATION` times the declared bounds of approximations; int8 outputs by the sum
  of the `int8_error_steps` of the rewrites on the paths to that output
  (`tflfuse.rewrite.int8_error_bounds`), so an output no int8 rewrite reached must match exactly;
- the input itself does not run on this host (custom ops the interpreter lacks): nothing can be
  compared, and the model is written only when the caller asks for no verification
  (`--no-verify`), which the report then says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tflfuse.convert.rule_sets import all_rule_names, pipeline
from tflfuse.errors import TflfuseError
from tflfuse.ir import Model, flatbuffer
from tflfuse.ir.names import check_names
from tflfuse.ir.summary import activation_bytes
from tflfuse.json_types import JSONDict
from tflfuse.rewrite import PassResult
from tflfuse.rules.runtime import runtime_legalization
from tflfuse.targets import TARGETS, XNNPACK, Target, find, runtimes
from tflfuse.targets.cost import cost_delta, model_cost
from tflfuse.targets.runtimes import Runtime, resolve
from tflfuse.verification import verified
from tflfuse.verification.verified import NOT_VERIFIED


class VerificationError(TflfuseError):
    """The optimized model does not compute the same function as its input (or does not run)."""


@dataclass
class OptimizeResult:
    data: bytes
    model: Model
    result: PassResult
    before: dict[str, Any]
    after: dict[str, Any]
    verification: dict[str, Any] = field(default_factory=dict)
    runtime: dict[str, Any] | None = None  # --runtime: the release it was made for

    def to_dict(self) -> JSONDict:
        return {
            "before": self.before,
            "after": self.after,
            **self.result.to_dict(),
            "cost": cost_delta(self.before["cost"], self.after["cost"]),
            "verification": self.verification,
            **({"runtime": self.runtime} if self.runtime is not None else {}),
        }


def _totals(model: Model) -> dict[str, Any]:
    return {
        "op_count": sum(len(g.ops) for g in model.subgraphs),
        "op_counts": model.main.op_counts(),
        "activation_bytes": sum(activation_bytes(g) for g in model.subgraphs),
        "cost": model_cost(model),
    }


def check_options(*, level: int, target: Target | str, disabled: Sequence[str] = ()) -> Target:
    """TflfuseError (one line) for an unknown level, target or rule name: none is ignored. The
    target as a `Target` (the door's name resolved here, once)."""
    if isinstance(level, bool) or level not in (0, 1, 2):
        raise TflfuseError(f"level must be 0, 1 or 2, not {level!r}")
    found = target if isinstance(target, Target) else find(target)
    if found is None:
        raise TflfuseError(f"target {target!r} unknown (choose from {', '.join(TARGETS)})")
    if isinstance(disabled, str):
        raise TflfuseError(f"disabled must be a list of rule names, not the string {disabled!r}")
    names = all_rule_names()
    unknown = [r for r in disabled if r not in names]
    if unknown:
        raise TflfuseError(f"unknown rule {unknown[0]!r} (rules: {', '.join(names)})")
    return found


def _stages(
    level: int,
    target: Target,
    runtime: Runtime | None = None,
    before_int8: bool = False,
    int8_completes: bool = False,
) -> verified.Stages:
    """The target's pipeline, then (`runtime`) the runtime legalization as a stage of its own:
    it may undo a fusion the pipeline made."""

    def stages() -> list[Any]:
        made: list[Any] = [
            pipeline(level, target, before_int8=before_int8, int8_completes=int8_completes)
        ]
        if runtime is not None:
            made.append(runtime_legalization(runtime, before_int8=before_int8))
        return made

    return stages


def runtime_section(model: Model, runtime: Runtime, source: str) -> JSONDict:
    """The model's check against `runtime`; TflfuseError (one line, nothing written) when the
    runtime cannot run it: the op, the version it needs and the runtime, in the runtime's words."""
    result = runtimes.check(model, runtime)
    if not result.runtime_ok:
        raise TflfuseError(f"{source}: {result.refusal()}; nothing written")
    return {"made_for": runtime.name, "runtime_ok": True, "basis": runtime.basis}


def optimize_bytes(
    data: bytes,
    *,
    level: int = 2,
    target: Target = XNNPACK,
    disabled: tuple[str, ...] = (),
    verify: bool = True,
    source: str = "<bytes>",
    runtime: str | Runtime | None = None,
    before_int8: bool = False,
    int8_completes: bool = False,
) -> OptimizeResult:
    """Optimize a .tflite given as bytes; raises VerificationError if the function changed or
    the result does not run, TflfuseError if the input cannot be verified here and `verify`.
    `runtime` (e.g. "tflite-runtime==2.5.0"): lower the result to the op versions that release
    has (tflfuse.rules.runtime, at any level), or refuse in one line when it cannot run it;
    `before_int8`: the result is quantized next (convert), so rewrites use quantizable ops;
    `int8_completes`: and the rules whose float form waits for an int8 rule write it
    (`Rule.float_form_waits_for_int8`)."""
    target = check_options(level=level, target=target, disabled=disabled)
    if runtime is not None:
        runtime = resolve(runtime)
    parsed = flatbuffer.from_bytes(data, source)  # (given as bytes: a file, a converter's output)
    check_names(parsed, source)  # (the interpreter decodes the I/O names strictly)
    before = _totals(parsed)  # (read before the passes rewrite `parsed` in place)
    stages = _stages(level, target, runtime, before_int8, before_int8 and int8_completes)
    candidate = verified.apply(data, stages, disabled=disabled, name=source, model=parsed)
    model, result = candidate.model, candidate.result
    made_for = runtime_section(model, runtime, source) if runtime is not None else None
    if not verify:
        verification: dict[str, Any] = {"verified": False, "reason": NOT_VERIFIED}
    elif level <= 0 and not result.changed:
        verification = {"verified": False, "reason": "level 0 rewrites nothing"}
    else:
        failure, verification = verified.judge(candidate)
        if failure is not None:
            culprit = verified.culprit(candidate)
            raise VerificationError(f"{source}: {failure}{culprit}; nothing written")
    out = candidate.data
    optimized = OptimizeResult(out, model, result, before, _totals(model), verification)
    optimized.runtime = made_for
    return optimized
