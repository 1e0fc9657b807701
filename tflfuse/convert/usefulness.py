"""Whether a converted model is useless: its outputs carry nothing of the source's where the data
shows they could.

The refusal line also gives stock's figure for the same output (litert-quantizer's int8 of the
same file: "stock int8: top-1 agreement 0.000, fails the same way"), so a user sees whether the
model fails for stock as well (then the int8 quantization of that model is the cause, not a
rewrite; `benchmarks/yolo_edgetpu.py` measures such models again with `--accept-accuracy-loss`).

The report's warnings (`tflfuse.convert.caveats`) say when a check cannot tell; this module says
when it can, and the answer is no. `convert` then refuses the result (one line naming the output
and the figure) unless the user accepts the loss. Two signs, each on an output of the source that
varies over the check inputs:

- top-1 agreement 0 on class scores: the model gives another class than the source for every
  check input, where the source gives more than one class over them (random weights can give
  one class for every input: DeiT-tiny's litert and onnx2tf exports did, with cosine 0.84 and
  0.85 for the converter's own int8, and every conversion was refused on a figure that says
  nothing; the cosine still judges such an output);
- the centered cosine (`tflfuse.convert.report.centered_cosine`: does the output move with the
  source's from one input to the next) under `COSINE_BOUND`, on an output whose spread over the
  inputs is at least `STEPS` of its int8 step. Below that spread int8 cannot follow the source
  (an output that varies by less than one step comes out constant: cosine 0, and correct), so
  nothing is refused there.

Why 0.5 and 4 steps. If the quantized output is the source's plus independent noise of RMS `n`,
its centered cosine is s / sqrt(s^2 + n^2) for a source spread (RMS deviation) `s`. A good int8
model errs by about one to two output steps (the rules' declared bounds, and what the corpus shows),
so with s >= 4 steps the cosine is at least 4 / sqrt(16 + 4) = 0.89; under 0.5 the noise is
larger than the signal (n > 1.7 s). Measured (`tflfuse convert`, report.json):
the hostile small_float model calibrated on uniform [-1, 1]: spread under 4 steps, cosine 0.71,
top-1 1.000, max error 0.002 (passes: nothing checked on the cosine); calibrated on the same data
times 1e30: cosine 0.000, top-1 0.000, max error 0.60 on an output spanning 0.80 (refused);
MobileNetV3-Small at 96x96 (`tflfuse example mobilenet_v3_small --calib`, its 64 samples; softmax
spread 7 steps): cosines fused 0.984, unfused 0.932, stock 0.981 on the edgetpu recipe, fused
0.981, unfused 0.932, stock 0.981 on xnnpack-int8 (top-1 0.94, 0.88, 0.94); the same model
calibrated on its samples times 1e30 crashes litert-quantizer (one line, exit 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from tflfuse.ir import Model

if TYPE_CHECKING:
    from tflfuse.convert.records import ModelAgreement, OutputAgreement

COSINE_BOUND = 0.5
STEPS = 4.0


def output_steps(model: Model) -> list[float | None]:
    """Per output of `model`, its int8 step in output units: the scale of an int8/uint8 output,
    or of the tensor a DEQUANTIZE turns into a float output; None for a float output."""
    graph = model.main
    producers = {t: op for op in graph.ops for t in op.outputs if t is not None}
    steps: list[float | None] = []
    for t in graph.outputs:
        op = producers.get(t)
        if t.dtype == "FLOAT32" and op is not None and op.type == "DEQUANTIZE" and op.inputs:
            t = op.input(0)  # DEQUANTIZE(x)
        q = t.quantization
        scale = None if q is None or q.scale is None or np.size(q.scale) != 1 else q.scale
        steps.append(float(np.ravel(scale)[0]) if scale is not None else None)
    return steps


def _top1_fails(row: OutputAgreement) -> bool:
    """Another class than the source's on every input, where the source's class moves."""
    top1 = row.get("top1_agreement")
    return top1 is not None and top1 == 0.0 and row.get("reference_classes") != 1


def _cosine_fails(row: OutputAgreement, step: float | None) -> bool:
    """A centered cosine under COSINE_BOUND on an output spread over STEPS int8 steps."""
    cosine, spread = row.get("cosine"), row.get("spread")
    if cosine is None or spread is None or step is None or spread < STEPS * step:
        return False
    return cosine < COSINE_BOUND


def _stock_figure(stock: ModelAgreement | None, k: int, sign: str, step: float | None) -> str:
    """ "; stock int8: <the same figure>[, fails the same way]" for output `k`, or "" when
    stock was not verified (the user then learns whether the model fails for stock too)."""
    if not stock or not stock.get("verified"):
        return ""
    rows = stock.get("outputs", [])
    if k >= len(rows):
        return ""
    row = rows[k]
    if sign == "top1":
        value, fails = row.get("top1_agreement"), _top1_fails(row)
        figure = "top-1 agreement"
    else:
        value, fails = row.get("cosine"), _cosine_fails(row, step)
        figure = "centered cosine"
    if value is None:
        return ""
    return f"; stock int8: {figure} {value:.3f}" + (", fails the same way" if fails else "")


def useless(
    agreement: ModelAgreement,
    steps: Sequence[float | None],
    names: Sequence[str],
    file: str,
    stock: ModelAgreement | None = None,
    stock_steps: Sequence[float | None] | None = None,
) -> str | None:
    """One line naming the first output of `file` that carries nothing of the source's, with the
    figure and stock's own figure for that output (`stock`: litert-quantizer's int8 of the same
    file, its output steps `stock_steps`; "fails the same way" when it fails that sign too), or
    None (also when the model was not verified)."""
    if not agreement.get("verified"):
        return None
    samples = agreement.get("samples")
    for k, row in enumerate(agreement.get("outputs", [])):
        if not row.get("varies"):
            continue
        name = names[k] if k < len(names) else f"output {k}"
        own = stock_steps if stock_steps is not None else steps
        stock_step = own[k] if k < len(own) else None
        if _top1_fails(row):
            also = _stock_figure(stock, k, "top1", stock_step)
            return (
                f"{file}: output {name!r} gives another class than the source model on all"
                f" {samples} check inputs (top-1 agreement 0.000{also})"
            )
        step = steps[k] if k < len(steps) else None
        if _cosine_fails(row, step):
            cosine, spread = cast(float, row.get("cosine")), cast(float, row.get("spread"))
            also = _stock_figure(stock, k, "cosine", stock_step)
            return (
                f"{file}: output {name!r} does not follow the source model (centered cosine"
                f" {cosine:.3f} over {samples} check inputs, under {COSINE_BOUND}; its spread is"
                f" {spread / cast(float, step):.0f} int8 steps{also})"
            )
    return None
