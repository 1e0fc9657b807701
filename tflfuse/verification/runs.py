"""Run a model over input sets with the interpreter: raw outputs (`run`, for verification)
and outputs in float, quantized inputs and dequantized outputs (`run_float`, for
agreement in output units). Host side; the interpreter comes from
`tflfuse.device.interpreter`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tflfuse.device.interpreter import make_interpreter
from tflfuse.errors import TflfuseError
from tflfuse.verification import run_memo

if TYPE_CHECKING:
    from tflfuse.device.interpreter import Interpreter, TensorDetails


def run(
    model: bytes,
    inputs: list[list[np.ndarray]],
    delegate: str = "none",
    interp: Interpreter | None = None,
    *,
    remember: bool = True,
) -> list[list[np.ndarray]]:
    """Outputs of `model` for each input set, in output-detail order (TflfuseError when the
    interpreter refuses the model or fails to invoke it). Run on a fresh interpreter (`interp`:
    one made for `model` and `delegate` and not invoked yet), or, with `remember`, remembered
    from an earlier run of the same bytes on the same inputs (`tflfuse.verification.run_memo`)."""
    if not remember:
        return _invoke(model, inputs, delegate, interp)
    key = (run_memo.digest(model, (a for one in inputs for a in one)), delegate)
    return run_memo.remembered("verify.run", key, lambda: _invoke(model, inputs, delegate, interp))


def _invoke(
    model: bytes, inputs: list[list[np.ndarray]], delegate: str, interp: Interpreter | None
) -> list[list[np.ndarray]]:
    interp = interp if interp is not None else make_interpreter(model, delegate=delegate)
    in_details = interp.get_input_details()
    out_details = interp.get_output_details()
    results = []
    for one in inputs:
        _invoke_once(interp, in_details, one)
        results.append([interp.get_tensor(d["index"]).copy() for d in out_details])
    return results


def _invoke_once(
    interp: Interpreter, in_details: list[TensorDetails], values: list[np.ndarray]
) -> None:
    """Set the inputs and invoke once; a failing invoke is a TflfuseError in one line."""
    for d, value in zip(in_details, values):
        interp.set_tensor(d["index"], value)
    try:
        interp.invoke()
    except (RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TflfuseError(f"the interpreter failed to run the model: {first}") from None


def run_keeping(
    model: bytes, inputs: list[list[np.ndarray]], names: set[str], delegate: str = "none"
) -> list[dict[str, np.ndarray]]:
    """For each input set, the values of the main subgraph's tensors named in `names` after
    one invoke (intermediates included: the interpreter keeps every tensor). A name two tensors
    share is left out (which one it means is not known), and every name when one of the model's
    is not UTF-8; TflfuseError when the model fails."""
    interp = make_interpreter(model, delegate=delegate, keep_all=True)
    count: dict[str, int] = {}
    index: dict[str, int] = {}
    try:
        details = interp.get_tensor_details()
    except UnicodeDecodeError:  # a name that is not UTF-8: nothing can be found by name
        details = []
    for d in details:
        if d["name"] in names:
            count[d["name"]] = count.get(d["name"], 0) + 1
            index[d["name"]] = d["index"]
    wanted = {n: i for n, i in index.items() if count[n] == 1}
    in_details = interp.get_input_details()
    kept = []
    for one in inputs:
        _invoke_once(interp, in_details, one)
        kept.append({n: interp.get_tensor(i).copy() for n, i in wanted.items()})
    return kept


def _to_model(value: np.ndarray, detail: TensorDetails) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    if dtype.kind == "f":
        return value.astype(dtype)
    scale, zero = detail["quantization"]
    if not scale:
        raise TflfuseError(f"input {detail['name']} is {dtype} without quantization parameters")
    info = np.iinfo(dtype)
    return np.clip(np.round(value / scale + zero), info.min, info.max).astype(dtype)


def _from_model(value: np.ndarray, detail: TensorDetails) -> np.ndarray:
    if value.dtype.kind == "f":
        return value.astype(np.float64)
    scale, zero = detail["quantization"]
    return (value.astype(np.float64) - zero) * (scale or 1.0)


def run_float(data: bytes, inputs: list[np.ndarray], delegate: str = "none") -> list[np.ndarray]:
    """Outputs in float (dequantized) for each sample of `inputs` (arrays with a sample axis);
    remembered for the same bytes and inputs (`tflfuse.verification.run_memo`: a .tflite whose rules
    changed nothing is both the reference and the fused float model)."""
    key = (run_memo.digest(data, inputs), delegate)
    return run_memo.remembered("report.run_float", key, lambda: _run_float(data, inputs, delegate))


def _run_float(data: bytes, inputs: list[np.ndarray], delegate: str) -> list[np.ndarray]:
    interp = make_interpreter(data, delegate=delegate)
    ins, outs = interp.get_input_details(), interp.get_output_details()
    results: list[list[np.ndarray]] = [[] for _ in outs]
    b = max(int(ins[0]["shape"][0]), 1) if len(ins[0]["shape"]) else 1
    for i in range(len(inputs[0]) // b):
        for d, a in zip(ins, inputs):
            interp.set_tensor(d["index"], _to_model(a[i * b : (i + 1) * b], d))
        interp.invoke()
        for k, d in enumerate(outs):
            results[k].append(_from_model(interp.get_tensor(d["index"]), d))
    return [np.concatenate(r) for r in results]
