"""Are two models the same function? Run both on the same seeded inputs and compare outputs.

Models are run in one interpreter each, invoked once per input set in order, so stateful models
(variables, streaming) are compared over the same sequence. `Agreement.varies` says whether the
reference output changed with the input at all: a constant output makes any equality vacuous.

Two failures are told apart: a reference the interpreter cannot run here (custom ops it lacks)
is `UnverifiableError`; a candidate that fails while its reference runs is a broken rewrite,
`CandidateFailedError`. Tolerances may be given per output (by tensor name), e.g. the int8
error bound that `tflfuse.rewrite.int8_error_bounds` computes for each output.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tflfuse.device.bench import seeded_input_values
from tflfuse.device.interpreter import make_interpreter
from tflfuse.errors import TflfuseError
from tflfuse.json_types import JSONDict
from tflfuse.verification import run_memo
from tflfuse.verification.roundoff import estimate
from tflfuse.verification.runs import run, run_keeping

if TYPE_CHECKING:
    from tflfuse.device.interpreter import Interpreter, TensorDetails


class UnverifiableError(TflfuseError):
    """The reference model does not run in this host's interpreter, so nothing can be compared."""


class CandidateFailedError(TflfuseError):
    """The reference runs and the candidate does not: the rewrite broke the model."""


@dataclass(frozen=True)
class OutputTolerance:
    """What one output may differ by: `int_steps` quantization steps (integer outputs) and
    `atol` on top of the global float tolerance (float outputs, e.g. a DEQUANTIZE of int8)."""

    int_steps: int = 0
    atol: float = 0.0


@dataclass
class Agreement:
    """How closely `candidate` reproduced `reference` on the same inputs."""

    max_abs: float
    max_rel: float
    identical: bool
    varies: bool
    runs: int
    ok: bool  # every element within atol + rtol * |reference| (integers: within int_atol steps)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # per output: worst, allowed

    def failed_outputs(self) -> list[str]:
        return [name for name, o in self.outputs.items() if not o["ok"]]

    def to_dict(self) -> JSONDict:
        return asdict(self)


def seeded_inputs(interp: Interpreter, seed: int, runs: int) -> list[list[np.ndarray]]:
    """`runs` sets of random inputs matching the interpreter's input details (the benchmark's
    generator, so a verified input set and a timed one come from the same rule)."""
    details = interp.get_input_details()
    return [seeded_input_values(details, seed + i) for i in range(runs)]


def _details(
    model: bytes, delegate: str
) -> tuple[list[TensorDetails], list[str], Interpreter | None]:
    """(input details, output names, a fresh interpreter or None) of `model`: the interpreter
    is made only when the model's details are not remembered (then it also runs the model)."""
    made: list[Interpreter] = []

    def read() -> tuple[list[TensorDetails], list[str]]:
        made.append(make_interpreter(model, delegate=delegate))
        names = [d["name"] for d in made[0].get_output_details()]
        return made[0].get_input_details(), names

    key = (run_memo.digest(model), delegate)
    in_details, names = run_memo.remembered("verify.details", key, read)
    return in_details, names, made[0] if made else None


def activations(
    reference: bytes, names: set[str], *, seed: int = 0, runs: int = 3
) -> list[dict[str, np.ndarray]]:
    """The reference's values of the tensors named in `names` (intermediates too), on the same
    seeded input sets `compare` uses: the activations a per-rewrite check feeds the ops before
    and after a rewrite. `UnverifiableError` when the reference does not run here."""
    try:
        in_details, _, _ = _details(reference, "none")
        inputs = [seeded_input_values(in_details, seed + i) for i in range(runs)]
        key = (run_memo.digest(reference), tuple(sorted(names)), seed, runs)
        return run_memo.remembered(
            "verify.activations", key, lambda: run_keeping(reference, inputs, names)
        )
    except TflfuseError as exc:
        raise UnverifiableError(str(exc)) from None


def output_names(model: bytes) -> list[str]:
    """The model's output tensor names in output-detail order."""
    return [d["name"] for d in make_interpreter(model, delegate="none").get_output_details()]


def _as_real(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) if x.dtype.kind in "fiub" else np.abs(x).astype(np.float64)


def _abs_diff(r: np.ndarray, c: np.ndarray) -> np.ndarray:
    """|r - c| in float64; 0 where both hold the same infinity or both are NaN (a model whose
    output saturates to inf agrees with a candidate that does too)."""
    a, b = _as_real(r), _as_real(c)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        return np.where(same, 0.0, np.abs(a - b))


def compare(
    reference: bytes,
    candidate: bytes,
    *,
    seed: int = 0,
    runs: int = 3,
    delegate: str = "none",
    atol: float = 1e-5,
    rtol: float = 1e-5,
    int_atol: int = 1,
    per_output: Mapping[str, OutputTolerance] | None = None,
    roundoff: bool = False,
    keep: set[str] | None = None,
) -> Agreement:
    """Run both models on the same `runs` seeded input sets and measure the worst difference.

    Float outputs must satisfy |c - r| <= atol + rtol * |r| elementwise, plus, with `roundoff`, the
    float32 round-off bound of each element (`tflfuse.verification.roundoff`: what re-associating
    the arithmetic between the input and that element can do, measured on the reference); integer
    (quantized) outputs may differ by `int_atol` quantization steps. `per_output` (by output tensor
    name) replaces `int_atol` and adds to `atol` for the outputs it names. Raises
    `UnverifiableError` when the reference does not run here, `CandidateFailedError` when only the
    candidate fails. `keep` (plain kernels): the reference run also keeps these tensors, which
    `activations(reference, keep)` then returns without running it again.
    """
    inputs, names, ref, cand = _run_pair(
        reference, candidate, seed=seed, runs=runs, delegate=delegate, keep=keep
    )
    bounds, noise = (
        _roundoff_bounds(reference, inputs, ref, cand, names, delegate=delegate, seed=seed)
        if roundoff
        else ({}, {})
    )
    tolerances = [(per_output or {}).get(name, OutputTolerance(int_atol, 0.0)) for name in names]
    return _measure(ref, cand, names, tolerances, int_atol, atol, rtol, bounds, noise, runs)


def _run_pair(
    reference: bytes,
    candidate: bytes,
    *,
    seed: int,
    runs: int,
    delegate: str,
    keep: set[str] | None = None,
) -> tuple[list, list[str], list, list]:
    """(inputs, output names, reference outputs, candidate outputs) on `runs` seeded input sets;
    a failure of the reference is `UnverifiableError`, of the candidate `CandidateFailedError`.
    Once the reference's interpreter is made, the candidate runs in a worker thread while the
    reference runs here: two independent interpreters, each giving a lone run's outputs."""
    try:
        in_details, names, ref_interp = _details(reference, delegate)
        inputs = [seeded_input_values(in_details, seed + i) for i in range(runs)]
    except TflfuseError as exc:
        raise UnverifiableError(str(exc)) from None
    with ThreadPoolExecutor(1) as pool:
        candidate_run = pool.submit(run, candidate, inputs, delegate)
        try:
            kept = activations(reference, keep, seed=seed, runs=runs) if keep else []
            if delegate == "none" and kept and all(n in kept[0] for n in names):
                ref = [[k[n] for n in names] for k in kept]  # the same kernels, the same run
            else:
                ref = run(reference, inputs, delegate, ref_interp)
        except TflfuseError as exc:
            raise UnverifiableError(str(exc)) from None
        try:
            cand = candidate_run.result()
        except TflfuseError as exc:
            raise CandidateFailedError(str(exc)) from None
    return inputs, names, ref, cand


def _roundoff_bounds(
    reference: bytes,
    inputs: list,
    ref: list,
    cand: list,
    names: list[str],
    *,
    delegate: str,
    seed: int,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """({output name: per-element round-off bound}, {output name: its summary}) measured on the
    reference; empty when the outputs are bit-identical or none is float (no bound needed)."""
    same = all(
        r.dtype == c.dtype and r.tobytes() == c.tobytes()
        for r_set, c_set in zip(ref, cand)
        for r, c in zip(r_set, c_set)
    )
    floats = any(r.dtype.kind == "f" for r in ref[0]) if ref else False
    if not floats or same:
        return {}, {}
    try:
        estimated = estimate(reference, inputs, ref, names=names, delegate=delegate, seed=seed)
    except TflfuseError as exc:
        raise UnverifiableError(f"the round-off estimate failed: {exc}") from None
    return estimated.bounds, estimated.summary


def _measure(
    ref: list,
    cand: list,
    names: list[str],
    tolerances: list[OutputTolerance],
    int_atol: int,
    atol: float,
    rtol: float,
    bounds: Mapping[str, np.ndarray],
    noise: Mapping[str, Any],
    runs: int,
) -> Agreement:
    """The worst differences of every output over every run, each held to its tolerance; a
    mismatch of output count or shape is an `Agreement` that failed without a number."""
    max_abs = max_rel = 0.0
    identical = ok = True
    mismatch = Agreement(float("inf"), float("inf"), False, True, runs, False)
    outputs: dict[str, dict[str, Any]] = {}
    for r_set, c_set in zip(ref, cand):
        if len(r_set) != len(c_set):
            return mismatch
        for k, (r, c) in enumerate(zip(r_set, c_set)):
            if r.shape != c.shape:
                return mismatch
            tol = tolerances[k] if k < len(tolerances) else OutputTolerance(int_atol, 0.0)
            name = names[k] if k < len(names) else f"output_{k}"
            entry = outputs.setdefault(name, {"max_abs": 0.0, "ok": True})
            identical &= r.dtype == c.dtype and r.tobytes() == c.tobytes()
            diff = _abs_diff(r, c)
            if not diff.size:
                continue
            worst = float(diff.max())
            max_abs = max(max_abs, worst)
            entry["max_abs"] = max(entry["max_abs"], worst)
            scale = np.maximum(np.abs(_as_real(r)), 1e-6)
            with np.errstate(invalid="ignore"):
                max_rel = max(max_rel, float(np.nanmax(diff / scale)))
            if r.dtype.kind == "f":
                allowed = atol + tol.atol + rtol * np.abs(_as_real(r))
                if name in bounds:
                    allowed = allowed + bounds[name]
                    entry["roundoff"] = noise[name]
                good = _record_float(entry, diff, allowed)
            else:
                good = worst <= tol.int_steps
                entry["allowed_steps"] = tol.int_steps
            entry["ok"] &= good
            ok &= good
    varies = runs > 1 and any(
        not np.array_equal(ref[0][k], ref[i][k]) for i in range(1, runs) for k in range(len(ref[0]))
    )
    return Agreement(max_abs, max_rel, identical, varies, runs, ok, outputs)


def _record_float(entry: dict[str, Any], diff: np.ndarray, allowed: np.ndarray) -> bool:
    """Whether every element is within its allowance; records the allowance at the element
    closest to (or furthest past) its bound: `allowed_atol` is what that element was allowed,
    `diff_there` what it differed by and `ratio` the two's quotient (above 1: refused)."""
    allowed = np.broadcast_to(allowed, diff.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff > 0, diff / np.where(allowed > 0, allowed, 0.0), 0.0)
    ratio = np.nan_to_num(ratio, nan=np.inf)
    at = int(np.argmax(ratio))
    worst = float(ratio.flat[at])
    if worst >= entry.get("ratio", -1.0):
        entry.update(
            ratio=worst,
            allowed_atol=float(allowed.flat[at]),
            diff_there=float(diff.flat[at]),
            allowed_max=float(allowed.max()),
        )
    return bool(worst <= 1.0)
