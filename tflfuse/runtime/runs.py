"""Run a model over input sets with the interpreter: raw outputs (`run`, for verification)
and outputs in float, quantized inputs and dequantized outputs (`run_float`, for
agreement in output units). Host side; the interpreter comes from
`tflfuse.runtime.interpreter`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tflfuse.convert.report import _run_float
from tflfuse.errors import TflfuseError
from tflfuse.runtime import run_memo
from tflfuse.runtime.verify import _invoke


def run(
    model: bytes,
    inputs: list[list[np.ndarray]],
    delegate: str = "none",
    interp: Any = None,
    *,
    remember: bool = True,
) -> list[list[np.ndarray]]:
    """Outputs of `model` for each input set, in output-detail order (TflfuseError when the
    interpreter refuses the model or fails to invoke it). Run on a fresh interpreter (`interp`:
    one made for `model` and `delegate` and not invoked yet), or, with `remember`, remembered
    from an earlier run of the same bytes on the same inputs (`tflfuse.runtime.run_memo`)."""
    if not remember:
        return _invoke(model, inputs, delegate, interp)
    key = (run_memo.digest(model, (a for one in inputs for a in one)), delegate)
    return run_memo.remembered("verify.run", key, lambda: _invoke(model, inputs, delegate, interp))


def _to_model(value: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    if dtype.kind == "f":
        return value.astype(dtype)
    scale, zero = detail["quantization"]
    if not scale:
        raise TflfuseError(f"input {detail['name']} is {dtype} without quantization parameters")
    info = np.iinfo(dtype)
    return np.clip(np.round(value / scale + zero), info.min, info.max).astype(dtype)


def _from_model(value: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    if value.dtype.kind == "f":
        return value.astype(np.float64)
    scale, zero = detail["quantization"]
    return (value.astype(np.float64) - zero) * (scale or 1.0)


def run_float(data: bytes, inputs: list[np.ndarray], delegate: str = "none") -> list[np.ndarray]:
    """Outputs in float (dequantized) for each sample of `inputs` (arrays with a sample axis);
    remembered for the same bytes and inputs (`tflfuse.runtime.run_memo`: a .tflite whose rules
    changed
    nothing is both the reference and the fused float model)."""
    key = (run_memo.digest(data, inputs), delegate)
    return run_memo.remembered("report.run_float", key, lambda: _run_float(data, inputs, delegate))
