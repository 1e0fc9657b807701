"""Are two models the same function? Run both on the same seeded inputs and compare outputs.

Models are run in one interpreter each, invoked once per input set in order, so stateful models
(variables, streaming) are compared over the same sequence. `Agreement.varies` says whether the
reference output changed with the input at all: a constant output makes any equality vacuous.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tflfuse.bench import seeded_input_values
from tflfuse.runtime import make_interpreter


@dataclass
class Agreement:
    """How closely `candidate` reproduced `reference` on the same inputs."""

    max_abs: float
    max_rel: float
    identical: bool
    varies: bool
    runs: int
    ok: bool  # every element within atol + rtol * |reference| (integers: within int_atol steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def seeded_inputs(interp: Any, seed: int, runs: int) -> list[list[np.ndarray]]:
    """`runs` sets of random inputs matching the interpreter's input details (the benchmark's
    generator, so a verified input set and a timed one come from the same rule)."""
    details = interp.get_input_details()
    return [seeded_input_values(details, seed + i) for i in range(runs)]


def run(
    model: bytes, inputs: list[list[np.ndarray]], delegate: str = "none"
) -> list[list[np.ndarray]]:
    """Outputs of `model` for each input set, in output-detail order."""
    interp = make_interpreter(model, delegate=delegate)
    in_details = interp.get_input_details()
    out_details = interp.get_output_details()
    results = []
    for one in inputs:
        for d, value in zip(in_details, one):
            interp.set_tensor(d["index"], value)
        interp.invoke()
        results.append([interp.get_tensor(d["index"]).copy() for d in out_details])
    return results


def _as_real(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) if x.dtype.kind in "fiub" else np.abs(x).astype(np.float64)


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
) -> Agreement:
    """Run both models on the same `runs` seeded input sets and measure the worst difference.

    Float outputs must satisfy |c - r| <= atol + rtol * |r|; integer (quantized) outputs may
    differ by `int_atol` quantization steps.
    """
    ref_interp = make_interpreter(reference, delegate=delegate)
    inputs = seeded_inputs(ref_interp, seed, runs)
    ref = run(reference, inputs, delegate)
    cand = run(candidate, inputs, delegate)
    max_abs = max_rel = 0.0
    identical = ok = True
    mismatch = Agreement(float("inf"), float("inf"), False, True, runs, False)
    for r_set, c_set in zip(ref, cand):
        if len(r_set) != len(c_set):
            return mismatch
        for r, c in zip(r_set, c_set):
            if r.shape != c.shape:
                return mismatch
            identical &= r.dtype == c.dtype and r.tobytes() == c.tobytes()
            diff = np.abs(_as_real(r) - _as_real(c))
            if diff.size:
                max_abs = max(max_abs, float(diff.max()))
                scale = np.maximum(np.abs(_as_real(r)), 1e-6)
                max_rel = max(max_rel, float((diff / scale).max()))
                if r.dtype.kind == "f":
                    ok &= bool(np.all(diff <= atol + rtol * np.abs(_as_real(r))))
                else:
                    ok &= bool(diff.max() <= int_atol)
    varies = runs > 1 and any(
        not np.array_equal(ref[0][k], ref[i][k]) for i in range(1, runs) for k in range(len(ref[0]))
    )
    return Agreement(max_abs, max_rel, identical, varies, runs, ok)
