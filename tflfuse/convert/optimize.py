"""`tflfuse optimize`: load a .tflite, run the target pipeline, verify, describe what happened.

Verification runs the input and the output in the interpreter on the same seeded inputs, and it
can fail three ways, each an error that writes nothing:
- the output does not run while the input does (a rewrite broke it): the rule is named, found
  by re-running the pipeline without each fired rule in turn;
- an output differs by more than its tolerance: a float output element by the float32 round-off
  that re-associating the arithmetic behind it can cause (`tflfuse.runtime.roundoff`: it follows the
  output's magnitude and the gain of every path to it, measured on the input model), plus
  PROPAGATION times the declared bounds of approximations; int8 outputs by the sum of the
  `int8_error_steps` of the rewrites on the paths to that output
  (`tflfuse.rewrite.int8_error_bounds`), so an output no int8 rewrite reached must match
  exactly;
- the input itself does not run on this host (custom ops the interpreter lacks): nothing can be
  compared, and the model is written only when the caller asks for no verification
  (`--no-verify`), which the report then says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tflfuse.errors import TflfuseError
from tflfuse.ir import Model, flatbuffer
from tflfuse.ir.summary import activation_bytes
from tflfuse.rewrite import PassManager, PassResult, int8_error_bounds
from tflfuse.rules import all_rule_names, pipeline
from tflfuse.rules.runtime import runtime_legalization
from tflfuse.runtime import verify as verify_mod
from tflfuse.runtime.verify import CandidateFailedError, OutputTolerance, UnverifiableError
from tflfuse.targets import TARGETS, runtimes
from tflfuse.targets.cost import cost_delta, model_cost
from tflfuse.targets.runtimes import Runtime, resolve

PROPAGATION = 10.0  # allowance for an approximation's error growing through later layers
NOT_VERIFIED = "--no-verify: written without the numeric check"


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

    def to_dict(self) -> dict[str, Any]:
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


def check_options(*, level: int, target: str, disabled: Sequence[str] = ()) -> None:
    """TflfuseError (one line) for an unknown level, target or rule name: none is ignored."""
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


def _run_pipeline(
    data: bytes,
    level: int,
    target: str,
    disabled: tuple[str, ...],
    source: str,
    runtime: Runtime | None = None,
    before_int8: bool = False,
) -> tuple[Model, PassResult, bytes]:
    model = flatbuffer.from_bytes(data, source)
    result = PassManager(pipeline(level, target), disabled=disabled).run(model)
    if runtime is not None:  # a stage of its own: it may undo a fusion the pipeline made
        rules = runtime_legalization(runtime, before_int8=before_int8)
        lowered = PassManager(rules, disabled=disabled).run(model)
        result.events += lowered.events
        result.refusals += lowered.refusals
        result.not_applicable += lowered.not_applicable
        result.rounds = max(result.rounds, lowered.rounds)
    return model, result, flatbuffer.to_bytes(model)


def runtime_section(model: Model, runtime: Runtime, source: str) -> dict[str, Any]:
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
    target: str = "xnnpack",
    disabled: tuple[str, ...] = (),
    verify: bool = True,
    source: str = "<bytes>",
    runtime: str | Runtime | None = None,
    before_int8: bool = False,
) -> OptimizeResult:
    """Optimize a .tflite given as bytes; raises VerificationError if the function changed or
    the result does not run, TflfuseError if the input cannot be verified here and `verify`.
    `runtime` (e.g. "tflite-runtime==2.5.0"): lower the result to the op versions that release
    has (tflfuse.rules.runtime, at any level), or refuse in one line when it cannot run it;
    `before_int8`: the result is quantized next (convert), so rewrites use quantizable ops."""
    check_options(level=level, target=target, disabled=disabled)
    if runtime is not None:
        runtime = resolve(runtime)
    before = _totals(flatbuffer.from_bytes(data, source))
    model, result, out = _run_pipeline(data, level, target, disabled, source, runtime, before_int8)
    made_for = runtime_section(model, runtime, source) if runtime is not None else None
    if not verify:
        verification: dict[str, Any] = {"verified": False, "reason": NOT_VERIFIED}
    elif level <= 0 and not result.changed:
        verification = {"verified": False, "reason": "level 0 rewrites nothing"}
    else:
        failure, verification = verify_rewrite(data, out, model, result)
        if failure is not None:
            culprit = _blame(data, level, target, disabled, source, result, runtime, before_int8)
            raise VerificationError(f"{source}: {failure}{culprit}; nothing written")
    optimized = OptimizeResult(out, model, result, before, _totals(model), verification)
    optimized.runtime = made_for
    return optimized


def tolerances(model: Model, result: PassResult) -> tuple[float, dict[str, Any]]:
    """(float atol for every output, {output name: OutputTolerance}) for a pipeline's result, on
    top of the round-off bound `compare` measures.

    An approximation's error can grow through the layers after it: PROPAGATION times the summed
    per-op bounds (0 when every rewrite is exact). Int8 outputs get the bound of
    `int8_error_bounds` in steps; a float output of an int8 graph (after DEQUANTIZE) gets its
    real-valued bound on top of the atol.
    """
    atol = PROPAGATION * sum(e.error for e in result.events)
    bounds = int8_error_bounds(model, result)
    per_output = {}
    for t in model.main.outputs:
        bound = bounds.get(t.name, 0.0)
        if t.dtype in ("FLOAT32", "FLOAT16"):
            per_output[t.name] = OutputTolerance(0, bound)
        else:
            per_output[t.name] = OutputTolerance(int(bound), 0.0)
    return atol, per_output


def verify_rewrite(
    reference: bytes, candidate: bytes, model: Model, result: PassResult
) -> tuple[str | None, dict[str, Any]]:
    """(why the candidate fails or None, the verification record) for `candidate`, the bytes of
    `model` after the rewrites in `result`, against `reference`: the tolerance is each output's
    declared error (see the module docstring). `convert`'s int8 legalization uses it too."""
    if reference == candidate:
        return None, {"verified": True, "ok": True, "identical_bytes": True}
    atol, per_output = tolerances(model, result)
    try:
        agreement = verify_mod.compare(
            reference, candidate, atol=atol, rtol=0.0, per_output=per_output, roundoff=True
        )
    except UnverifiableError as exc:
        raise TflfuseError(
            f"cannot verify the result on this host ({exc}); pass --no-verify to write it"
            " unverified"
        ) from None
    except CandidateFailedError as exc:
        return f"verification failed: the optimized model does not run ({exc})", {}
    tolerance = {
        "atol": atol,
        "roundoff": "float32 round-off bound per element (tflfuse.runtime.roundoff)",
        "int8_steps": {name: tol.int_steps for name, tol in per_output.items()},
    }
    record = {"verified": True, **agreement.to_dict(), "tolerance": tolerance}
    if agreement.ok:
        return None, record
    return f"verification failed: {describe_failure(agreement)}", record


def describe_failure(agreement: Any) -> str:
    """One clause saying which output failed and what was measured against what was allowed."""
    bad = agreement.failed_outputs() or list(agreement.outputs)[:1] or ["?"]
    detail = agreement.outputs.get(bad[0], {})
    if "allowed_steps" in detail:
        return (
            f"output {bad[0]!r} differs by {detail.get('max_abs', float('inf')):.3g} quantization"
            f" steps (allowed {detail['allowed_steps']})"
        )
    if "allowed_atol" not in detail:
        return "the outputs differ in number or shape"
    where = ""
    roundoff = detail.get("roundoff")
    if roundoff:
        where = (
            f"; float32 round-off there, measured: {roundoff['noise_max']:.3g} at most on an"
            f" output of scale {roundoff['output_scale']:.3g}, {roundoff['depth']} ops deep"
        )
    return (
        f"output {bad[0]!r} differs by {detail['diff_there']:.3g} where"
        f" {detail['allowed_atol']:.3g} is allowed ({detail['ratio']:.3g}x its bound; worst"
        f" difference {detail.get('max_abs', 0.0):.3g}{where})"
    )


def _blame(
    data: bytes,
    level: int,
    target: str,
    disabled: tuple[str, ...],
    source: str,
    result: PassResult,
    runtime: Runtime | None = None,
    before_int8: bool = False,
) -> str:
    """' (rule R: ...)' naming the first fired rule without which the pipeline's result passes
    verification, or the list of rules fired when no single one is to blame."""
    fired = list(result.fired())
    for rule in fired[:16]:
        model, trial, out = _run_pipeline(
            data, level, target, (*disabled, rule), source, runtime, before_int8
        )
        try:
            failure, _ = verify_rewrite(data, out, model, trial)
        except TflfuseError:
            continue
        if failure is None:
            where = [e.where for e in result.events if e.rule == rule][:3]
            at = f" at {', '.join(repr(w) for w in where)}" if where else ""
            return f" (rule {rule}{at}: the result passes without it; --disable {rule})"
    return f" (rules fired: {', '.join(fired) or 'none'})"
