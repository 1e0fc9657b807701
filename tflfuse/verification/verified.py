"""The one verified-apply service: passes applied to a model, the result checked numerically
against the model before, then kept or refused, with the rule to blame named.

Every rewrite tflfuse makes goes through here: `optimize` (the target's pipeline, then a
`--runtime` legalization), `convert`'s stages (the int8 legalization, the runtime
legalization, the defused baselines of a .tflite) and int8 completion in `quantize`. The three
steps are separate because the callers differ only in what they do between them and with a
failure (a conversion keeps the model before the int8 rules, `optimize` and the runtime stage
refuse; `optimize` first refuses what a runtime cannot run):

  apply     `apply(reference, stages)`: the reference parsed once (or its parse given), each
            stage a list of passes run to its fixed point by a `PassManager`, one after the
            other on the same IR; a `Candidate` (the IR, what fired, its bytes when asked for)
  judge     `judge(candidate, enabled, check)`: (why it fails or None, the verification
            record); `enabled=False` (--no-verify) records that nothing was checked
  blame     `culprit(candidate)`: the first fired rule without which the result passes

Two checks, both on the interpreter (`verification.verify.compare`, the same seeded inputs):
  within_declared_error       a float output element within its float32 round-off bound
                              (`verification.roundoff`) plus PROPAGATION times the declared error of
                              the approximations that fired; an int8 output within the summed
                              `int8_error_steps` of the rewrites on its paths
                              (`rewrite.int8_error_bounds`): an output no rewrite reached matches
                              exactly. Candidate bytes equal to the reference pass as they are.
                              Then each int8 rewrite where it stands (`verification.rewrite_check`):
                              the region it changed, run alone on the reference's own
                              activations (kept by the same run), within its rule's steps; the
                              record lists them as `rewrites`.
  on_reference_kernels        bit-identical on the reference kernels (BUILTIN_REF), where
                              splitting an epilogue off rounds exactly as the fused op did
                              (floats held to the round-off bound, int8 to 0 steps): `rules.defuse`

It sits in `convert/` because it needs both the rewrite engine and the interpreter: `rewrite`
may import only `ir`, the host `runtime` never imports `rewrite`, and `sources` (which gives
models, never converts them) sits below `convert`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Model, flatbuffer
from tflfuse.json_types import JSONDict
from tflfuse.rewrite import Pass, PassManager, PassResult, Rule, int8_error_bounds
from tflfuse.verification import rewrite_check
from tflfuse.verification import verify as verify_mod
from tflfuse.verification.verify import (
    Agreement,
    CandidateFailedError,
    OutputTolerance,
    UnverifiableError,
)

PROPAGATION = 10.0  # allowance for an approximation's error growing through later layers
NOT_VERIFIED = "--no-verify: written without the numeric check"

Stages = Callable[[], Sequence[Sequence[Rule | Pass]]]  # fresh passes, stage by stage


@dataclass
class Candidate:
    """A model after passes, not yet judged: the reference bytes it was made from, its IR,
    what the passes did, and how to make it again (for `culprit`)."""

    reference: bytes
    model: Model
    result: PassResult
    stages: Stages
    disabled: tuple[str, ...] = ()
    name: str = "<bytes>"
    before: Graph | None = None  # the main graph as the passes found it (per-rewrite check)

    @cached_property
    def data(self) -> bytes:
        """The candidate's bytes (serialized once, when first asked for)."""
        return flatbuffer.to_bytes(self.model)


Check = Callable[[Candidate], tuple[str | None, JSONDict]]


def apply(
    reference: bytes,
    stages: Stages,
    *,
    disabled: Sequence[str] = (),
    name: str = "<bytes>",
    model: Model | None = None,
) -> Candidate:
    """`reference` (or `model`, its parse, which is rewritten in place) through each stage of
    passes in turn; a later stage may undo what an earlier one made (a runtime legalization
    after the target's pipeline). One PassResult: the events, refusals and rounds of all."""
    model = model if model is not None else flatbuffer.from_bytes(reference, name)
    before = model.main.snapshot()
    result: PassResult | None = None
    for passes in stages():
        ran = PassManager(passes, disabled=disabled).run(model)
        if result is None:
            result = ran
            continue
        result.events += ran.events
        result.refusals += ran.refusals
        result.not_applicable += ran.not_applicable
        result.rounds = max(result.rounds, ran.rounds)
    assert result is not None, "apply needs at least one stage"
    return Candidate(reference, model, result, stages, tuple(disabled), name, before)


def judge(
    candidate: Candidate, enabled: bool = True, check: Check | None = None
) -> tuple[str | None, JSONDict]:
    """(why `candidate` fails `check` or None, the verification record); with `enabled` off
    (--no-verify) nothing runs and the record says it was written unchecked."""
    if not enabled:
        return None, {"verified": False, "reason": NOT_VERIFIED}
    return (check or within_declared_error)(candidate)


def culprit(candidate: Candidate, check: Check | None = None) -> str:
    """' (rule R: ...)' naming the first fired rule without which the stages' result passes
    `check`, or the list of rules fired when no single one is to blame."""
    check = check or within_declared_error
    result = candidate.result
    fired = list(result.fired())
    for rule in fired[:16]:
        trial = apply(
            candidate.reference,
            candidate.stages,
            disabled=(*candidate.disabled, rule),
            name=candidate.name,
        )
        try:
            failure, _ = check(trial)
        except TflfuseError:
            continue
        if failure is None:
            where = [e.where for e in result.events if e.rule == rule][:3]
            at = f" at {', '.join(repr(w) for w in where)}" if where else ""
            return f" (rule {rule}{at}: the result passes without it; --disable {rule})"
    return f" (rules fired: {', '.join(fired) or 'none'})"


# -- the checks ------------------------------------------------------------------------------------
def tolerances(model: Model, result: PassResult) -> tuple[float, dict[str, OutputTolerance]]:
    """(float atol for every output, {output name: OutputTolerance}) for a pipeline's result, on
    top of the round-off bound `compare` measures.

    An approximation's error can grow through the layers after it: PROPAGATION times the summed
    per-op bounds (0 when every rewrite is exact). Int8 outputs get the bound of
    `int8_error_bounds` in steps; a float output of an int8 graph (after DEQUANTIZE) gets its
    real-valued bound on top of the atol.
    """
    atol = PROPAGATION * sum(e.error for e in result.events)
    bounds = int8_error_bounds(model, result)
    per_output: dict[str, OutputTolerance] = {}
    for t in model.main.outputs:
        bound = bounds.get(t.name, 0.0)
        if t.dtype in ("FLOAT32", "FLOAT16"):
            per_output[t.name] = OutputTolerance(0, bound)
        else:
            per_output[t.name] = OutputTolerance(int(bound), 0.0)
    return atol, per_output


# the verification record of a result byte for byte the reference: what `compare` would say of
# it (every figure 0, outputs identical), without running it
_IDENTICAL = {
    "verified": True,
    "ok": True,
    "identical_bytes": True,
    "identical": True,
    "max_abs": 0.0,
    "max_rel": 0.0,
}


def within_declared_error(candidate: Candidate) -> tuple[str | None, JSONDict]:
    """Each output of `candidate` against its reference within the error its rewrites declare,
    then each int8 rewrite where it stands (the module docstring). TflfuseError when the
    reference does not run on this host."""
    if candidate.reference == candidate.data:
        return None, dict(_IDENTICAL)
    events = candidate.result.events
    plan = rewrite_check.plan(candidate.reference, candidate.model, events, before=candidate.before)
    failure, record = end_to_end(candidate, keep=plan.names if plan and plan.sites else None)
    if failure is not None:
        return failure, record
    return per_rewrite(candidate, record, plan)


def _unverifiable(exc: Exception) -> TflfuseError:
    return TflfuseError(
        f"cannot verify the result on this host ({exc}); pass --no-verify to write it unverified"
    )


def end_to_end(candidate: Candidate, keep: set[str] | None = None) -> tuple[str | None, JSONDict]:
    """Each output of `candidate` against its reference, on the same seeded inputs, within
    its round-off bound and the error the rewrites on its paths declare. `keep`: the tensors
    the per-rewrite check will read, kept by the same run of the reference."""
    reference, data = candidate.reference, candidate.data
    if reference == data:
        return None, dict(_IDENTICAL)
    atol, per_output = tolerances(candidate.model, candidate.result)
    try:
        agreement = verify_mod.compare(
            reference, data, atol=atol, rtol=0.0, per_output=per_output, roundoff=True, keep=keep
        )
    except UnverifiableError as exc:
        raise _unverifiable(exc) from None
    except CandidateFailedError as exc:
        return f"verification failed: the optimized model does not run ({exc})", {}
    tolerance: JSONDict = {
        "atol": atol,
        "roundoff": "float32 round-off bound per element (tflfuse.verification.roundoff)",
        "int8_steps": {name: tol.int_steps for name, tol in per_output.items()},
    }
    record: JSONDict = {"verified": True, **agreement.to_dict(), "tolerance": tolerance}
    if not agreement.ok:
        return f"verification failed: {describe_failure(agreement)}", record
    return None, record


def per_rewrite(
    candidate: Candidate, record: JSONDict, plan: rewrite_check.Plan | None = None
) -> tuple[str | None, JSONDict]:
    """`record` (the end-to-end check's) with each int8 rewrite checked where it stands
    (`verification.rewrite_check`, by `plan` when one was made): `rewrites`, and the failure of the
    first that moved its tensor by more than its rule declares."""
    if plan is None:
        plan = rewrite_check.plan(
            candidate.reference, candidate.model, candidate.result.events, before=candidate.before
        )
    if plan is None:
        return None, {**record, "rewrites": []}
    try:
        values = verify_mod.activations(candidate.reference, plan.names) if plan.sites else []
        failure, checked = rewrite_check.judge(plan, values)
    except UnverifiableError as exc:
        raise _unverifiable(exc) from None
    record = {**record, **checked}
    if failure is None:
        return None, record
    record["ok"] = False
    return f"verification failed: {failure}", record


def on_reference_kernels(candidate: Candidate) -> tuple[str | None, JSONDict]:
    """`candidate` against its reference on the reference kernels, expected bit-identical
    (float outputs held to the round-off bound, int8 ones to 0 steps); the failure is what was
    measured, the record says against what it was checked."""
    # two input sets: the reference kernels are slow, and identity is expected
    check = verify_mod.compare(
        candidate.reference,
        candidate.data,
        runs=2,
        delegate="ref",
        atol=0.0,
        rtol=0.0,
        int_atol=0,
        roundoff=True,
    )
    record = {"against": "the input, on the reference kernels", **check.to_dict()}
    return (None if check.ok else describe_failure(check)), record


def describe_failure(agreement: Agreement) -> str:
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
