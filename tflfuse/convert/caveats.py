"""When an accuracy check cannot tell, and calibration data that cannot be trusted: one-line
warnings for the conversion report and the command line.

A conversion is judged by comparing each model's outputs with the source model's on check inputs
(the calibration samples, else seeded noise). That comparison says nothing when
- an output of the source does not vary over the check inputs (random weights with default
  BatchNorm statistics shrink every activation to nothing: any model "agrees" with it);
- the source gives the same class for every check input: top-1 agreement is then 1.000 for any
  model that keeps that class, however wrong its scores;
- the output is not class scores at all: top-1 of an autoencoder's 640-value reconstruction or of
  21 hand landmarks (x, y, z) is a number without meaning, so it is not computed
  (see `class_scores`).
And the int8 models are only as good as the calibration data:
- all-zero or constant data gives every activation a range made of biases alone;
- a range dominated by outliers (one 1e20 among values in [-1, 1]) leaves the real values a
  fraction of one int8 step, and the model's outputs become noise;
- an error larger than the output's whole range over the check inputs means that model's output
  carries nothing of the source's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tflfuse.convert.records import ModelAgreement
    from tflfuse.ir import Model

# the share of values a range should hold, and how much wider than that share's span the whole
# range may be before the int8 scale it gives leaves them too few levels (255 / 100: ~2.5)
CENTRAL = 0.998
OUTLIER_RATIO = 100.0
SUBSAMPLE = 1_000_000
# ops whose output, shaped (batch, classes), is class scores: probabilities, and logits (when
# the model has no other output)
PROBABILITY_OPS = frozenset({"SOFTMAX", "LOG_SOFTMAX"})
LOGIT_OPS = frozenset({"FULLY_CONNECTED", "BATCH_MATMUL"})
_LOOK_THROUGH = frozenset({"RESHAPE", "SQUEEZE", "DEQUANTIZE", "QUANTIZE"})


def _name(names: Sequence[str], k: int) -> str:
    return names[k] if k < len(names) else f"output {k}"


def class_scores(
    shape: Sequence[int], producer: str | None, input_sizes: Sequence[int], only_output: bool
) -> bool:
    """Whether an output is class scores, which top-1 agreement is defined for: shaped (batch, C)
    with C >= 2, not the size of a model input (then it is a reconstruction, e.g. an
    autoencoder's), and written by SOFTMAX / LOG_SOFTMAX (probabilities), or by a
    FULLY_CONNECTED / BATCH_MATMUL head (logits) when it is the model's only output: a
    classifier has one head, where landmark and detection models write their coordinates with
    the same ops beside other outputs. Producers are looked up through RESHAPE, SQUEEZE and
    (de)quantization."""
    if len(shape) != 2 or shape[1] < 2 or int(shape[1]) in set(input_sizes):
        return False
    return producer in PROBABILITY_OPS or (producer in LOGIT_OPS and only_output)


def output_producers(model: Model) -> list[str | None]:
    """The op type behind each output of `model` (an ir.Model), through reshapes and
    (de)quantization."""
    out: list[str | None] = []
    for t in model.main.outputs:
        op = t.producer
        while op is not None and op.type in _LOOK_THROUGH and op.inputs and op.inputs[0]:
            op = op.inputs[0].producer
        out.append(op.type if op is not None else None)
    return out


def calibration_warnings(calib: Sequence[np.ndarray] | None, names: Sequence[str]) -> list[str]:
    """All-zero, constant and outlier-dominated calibration inputs (one line each)."""
    warnings: list[str] = []
    for k, a in enumerate(calib or []):
        x = np.asarray(a).ravel()
        if x.dtype.kind != "f":
            x = x.astype(np.float64)
        x = x[np.isfinite(x)]
        if not x.size:
            continue
        name = _name(names, k)
        lo, hi = float(x.min()), float(x.max())
        if lo == hi:
            what = "all zeros" if lo == 0 else f"the single value {lo:.6g}"
            warnings.append(
                f"calibration input {name!r} is {what}: int8 ranges then come from the biases"
                " alone and the agreement checks see one input (give real samples)"
            )
            continue
        tail = (1.0 - CENTRAL) / 2
        if x.size > SUBSAMPLE:  # quantiles of a seeded sample: a sort of 1e8 values is slow
            x = x[np.random.default_rng(0).integers(0, x.size, SUBSAMPLE)]
        c_lo, c_hi = (float(v) for v in np.quantile(x.astype(np.float64), [tail, 1 - tail]))
        if hi - lo > OUTLIER_RATIO * (c_hi - c_lo):
            levels = 255.0 * (c_hi - c_lo) / (hi - lo)
            warnings.append(
                f"calibration input {name!r}: its range [{lo:.3g}, {hi:.3g}] is dominated by"
                f" outliers ({CENTRAL:.1%} of the values lie in [{c_lo:.2g}, {c_hi:.2g}]), so the"
                f" int8 scale leaves them {levels:.2g} of its 255 steps (remove the outliers)"
            )
    return warnings


def reference_warnings(
    reference: Sequence[np.ndarray], names: Sequence[str], classifier: Sequence[bool]
) -> list[str]:
    """Outputs of the source that do not vary over the check inputs, and class-score outputs
    whose class never changes."""
    warnings: list[str] = []
    for k, ref in enumerate(reference):
        name, n = _name(names, k), len(ref)
        if n < 2:
            continue
        if np.allclose(ref, ref[:1]):
            warnings.append(
                f"output {name!r} of the source does not vary over the {n} check inputs: the"
                " agreement on it says nothing (check the model and the data)"
            )
        elif k < len(classifier) and classifier[k]:
            classes = np.unique(np.asarray(ref).reshape(n, -1).argmax(1))
            if classes.size == 1:
                warnings.append(
                    f"output {name!r}: the source gives class {int(classes[0])} for all {n} check"
                    " inputs, so top-1 agreement says nothing (calibrate on real, varied data)"
                )
    return warnings


def error_warnings(agreement: Mapping[str, ModelAgreement], names: Sequence[str]) -> list[str]:
    """Outputs on which a model's error exceeds the output's whole range over the check inputs
    (one line per output, naming the models)."""
    worst: dict[int, list[tuple[str, float]]] = {}
    spans: dict[int, float] = {}
    for model, a in agreement.items():
        for k, row in enumerate(a.get("outputs", []) if a.get("verified") else []):
            span = row.get("reference_range", 0.0)
            if span > 0 and row["max_abs"] > span:
                worst.setdefault(k, []).append((model, row["max_abs"]))
                spans[k] = span
    return [
        f"output {_name(names, k)!r} moves by {spans[k]:.3g} over the check inputs, less than"
        f" the error of the {', '.join(m for m, _ in bad)} model(s)"
        f" ({', '.join(f'{e:.3g}' for _, e in bad)}): they do not follow the source's output"
        " from one input to the next"
        for k, bad in worst.items()
    ]
