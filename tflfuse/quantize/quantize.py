"""Quantize a float .tflite with litert-quantizer, then give it the recipe's I/O types.

Quantizing after fusion keeps the rewrites in exact float arithmetic. Modes:
  int8     static int8 weights and activations (`static_wi8_ai8`), calibrated on the given data
  dynamic  int8 weights, activations quantized at run time (`dynamic_wi8_afp32`)
  float16  float16 weights for CONV/DW/FC, float32 compute (FLOAT_CASTING weight-only)
The int8 route, step by step (each step a function of its own, so one calibration can serve
several quantizations):
  calibrate   the global min/max of every activation over the data (`_calibrate`)
  ranges      statistics no scale can represent corrected or refused (`calibrated_ranges`:
              sentinel pad values such as PADV2's -inf never enter a range, an overflow is one
              line naming the tensor, a range of only zeros is widened)
  share       (`share_ranges=True`) a tensor only copied on takes the range of its source or of
              the concatenation it is part of (`shared_ranges`: one rounding where the float
              graph has one)
  quantize    litert-quantizer's `static_wi8_ai8` with those ranges
  complete    (`complete_int8=True`) the ops it leaves in float made int8 between the scales it
              chose (`int8_completion`: PRELU, RELU_0_TO_1, DEPTH_TO_SPACE), verified within
              their declared error
  check       every scale finite and > 0, every zero point in range (`qparams`), before any
              interpreter sees the model
litert-quantizer leaves float I/O with a QUANTIZE after each input and a DEQUANTIZE before each
output. For int8 I/O those boundary ops are removed; for uint8 I/O they are replaced by a
QUANTIZE between uint8 and int8 (same scale, zero point + 128), the form the Edge TPU compiler
maps. The quantizer imports TensorFlow, so this module is only used by `convert`.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tflfuse import isolation
from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Model, Quantization, flatbuffer, qparams
from tflfuse.quantize import layer_error as layer_error_mod
from tflfuse.quantize.calibrated_ranges import Stats, TensorStats, usable_ranges
from tflfuse.quantize.int8_completion import COMPLETED_OPS, complete
from tflfuse.quantize.range_hints import hinted_ranges
from tflfuse.quantize.shared_ranges import shared_ranges
from tflfuse.quiet import progress_bar
from tflfuse.rewrite import DeadCodeElimination
from tflfuse.targets import Target
from tflfuse.verification import run_memo

BOUNDARY_OPS = frozenset({"QUANTIZE", "DEQUANTIZE"})


@dataclass
class Quantized:
    data: bytes
    route: str
    float_ops: list[str] = field(default_factory=list)  # ops still computing in float (int8 mode)
    layer_error: list[dict[str, Any]] = field(default_factory=list)
    ranges_adjusted: dict[str, str] = field(default_factory=dict)  # tensor -> what changed
    completion: dict[str, Any] = field(default_factory=dict)  # int8_completion's record
    # the IR of `data` as its parse reads (flatbuffer.read_back), for the next stage to take
    # instead of parsing `data` (None: parse it)
    model: Model | None = field(default=None, repr=False, compare=False)


def _aeq_recipe(mode: str) -> Any:
    from litert_quantizer import qtyping, recipe, recipe_manager

    if mode == "int8":
        return recipe.static_wi8_ai8()
    if mode == "dynamic":
        return recipe.dynamic_wi8_afp32()
    if mode == "float16":
        manager = recipe_manager.RecipeManager()
        for op in ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D"):
            manager.add_weight_only_config(
                regex=".*",
                operation_name=getattr(qtyping.TFLOperationName, op),
                num_bits=16,
                algorithm_key="float_casting",
            )
        return manager.get_quantization_recipe()
    raise TflfuseError(f"quantization mode {mode!r} has no litert-quantizer recipe")


def quantize(
    float_model: bytes,
    mode: str,
    calibration: list[np.ndarray] | None,
    *,
    input_type: str = "float32",
    output_type: str = "float32",
    desc: str = "calibrating",
    progress: bool = True,
    layer_error: bool = False,
    complete_int8: bool = False,
    verify: bool = True,
    target: Target | None = None,
    parsed: Model | None = None,
    share_ranges: bool = False,
) -> Quantized:
    """The quantized model (bytes) and how it was made; `mode` 'none' returns the input.

    `complete_int8` makes the ops litert-quantizer leaves in float int8 (`int8_completion`),
    checked against its output unless `verify` is False, where that pays on `target` (an
    int8 PRELU on XNNPACK does not: `int8_completion`); without it the result is the
    quantizer's own (the stock baseline). `share_ranges`: a tensor only copied on takes the
    range of what it copies or of the concatenation it is part of (`shared_ranges`: one
    rounding, not two); off for the stock baseline. `parsed`: `float_model` already parsed
    (only read).
    Raises TflfuseError (one line naming the tensor) for calibration statistics no scale can
    represent and for unusable quantization parameters."""
    if mode == "none":
        return Quantized(float_model, "none (float32)")
    from litert_quantizer import quantizer

    logging.getLogger("absl").setLevel(logging.ERROR)
    # (convert passes its IR; the stock route and the tests give the file's bytes only)
    model = parsed if parsed is not None else flatbuffer.from_bytes(float_model)
    if not model.signatures:
        raise TflfuseError("the float model has no signature; litert-quantizer needs one")
    signature = model.signatures[0]
    q = quantizer.Quantizer(bytearray(float_model), _aeq_recipe(mode))
    calibration_result = None
    adjusted: dict[str, str] = {}
    samples: list[dict[str, np.ndarray]] = []
    if q.need_calibration:
        if calibration is None:
            raise TflfuseError(f"{mode} quantization needs calibration data (--calib)")
        names = list(signature.inputs)
        first = next(iter(signature.inputs.values()))
        b = max(int(first.shape[0]), 1) if first.shape else 1
        samples = [
            {name: arr[i * b : (i + 1) * b] for name, arr in zip(names, calibration)}
            for i in range(len(calibration[0]) // b)
        ]
        isolation.detail(f"litert-quantizer {desc}")
        stats = _statistics(q, float_model, mode, signature.key, samples, desc, progress)
        calibration_result, adjusted = usable_ranges(model.main, stats)
        calibration_result, hinted = hinted_ranges(model.main, calibration_result)
        adjusted.update((k, v) for k, v in hinted.items() if k not in adjusted)
        if share_ranges:
            calibration_result, shared = shared_ranges(model.main, calibration_result)
            adjusted.update((k, v) for k, v in shared.items() if k not in adjusted)
        calibration_result = in_tensor_ranks(model.main, calibration_result)
    isolation.detail(f"litert-quantizer quantizing ({desc})")
    result = q.quantize(calibration_result, enable_progress_bar=False, enable_progress_report=False)
    data = bytes(result.quantized_model)
    which = desc.removeprefix("calibrating ")
    # litert-quantizer writes bytes: parsed once, read here, completed and handed on as IR
    qmodel = flatbuffer.from_bytes(data)
    qparams.check(qmodel, f"litert-quantizer's output ({which})")
    out = Quantized(data, f"litert-quantizer {mode}", ranges_adjusted=adjusted)
    if layer_error and samples:
        pair = (bytes(float_model), data)
        out.layer_error = _layer_error_within_budget(q, signature.key, samples, model, pair)
    if mode == "int8" and complete_int8:
        data, qmodel = _completed(out, data, qmodel, verify, target)
    if mode == "int8":
        out.float_ops = float_compute_ops(qmodel.main)
        set_io_types(qmodel, input_type, output_type)
        data = flatbuffer.to_bytes(qmodel)
    out.data = data
    out.model = flatbuffer.read_back(qmodel)
    return out


def _completed(
    out: Quantized, data: bytes, qmodel: Model, verify: bool, target: Target | None
) -> tuple[bytes, Model]:
    """The quantizer's int8 model `data` (parsed: `qmodel`, which the completion rewrites) with
    the float islands it left made int8 (`int8_completion`), and its IR; `out` records how."""
    done = complete(data, model=qmodel, verify=verify, target=target)
    out.completion = done.to_dict()
    made = ", ".join(f"{n} {op}" for op, n in sorted(done.completed.items()))
    if done.kept and done.completed:
        data = done.data
        out.route += f"; {made} it left in float made int8 by tflfuse (int8_completion)"
    elif not done.kept:
        failure = done.verification.get("failure", "")
        out.route += f"; {made} left in float: their int8 form was not kept ({failure})"
    for op, (n, why) in sorted(done.kept_float.items()):
        out.route += f"; {n} {op} kept in float ({why})"
    # on with the completion's IR where it is that of `data` (else its passes changed `qmodel`,
    # and `data` is parsed again)
    held = done.model if done.data is data else None
    return data, held if held is not None else flatbuffer.from_bytes(data)


def _statistics(
    q: Any,
    float_model: bytes,
    mode: str,
    key: str,
    samples: list[dict[str, np.ndarray]],
    desc: str,
    progress: bool,
) -> Any:
    """The calibration statistics of `float_model` on `samples`, calibrated once per model and
    data: the same bytes calibrated on the same arrays by the same calibrator give the same
    statistics (a .tflite whose rules changed nothing is both the stock baseline's input and
    the fused model), so a repeat is answered from `tflfuse.verification.run_memo`. A copy is handed
    out."""
    names = tuple(sorted(samples[0])) if samples else ()
    digest = run_memo.digest(float_model, (sample[n] for sample in samples for n in names))

    def calibrate() -> Any:
        feed = list(progress_bar(samples, len(samples), desc, progress))
        return _calibrate(q, float_model, {key: feed})

    return copy.deepcopy(
        run_memo.remembered("quantize.statistics", (digest, mode, key, names), calibrate)
    )


def _calibrate(q: Any, float_model: bytes, dataset: dict[str, list[dict[str, np.ndarray]]]) -> Any:
    """Min/max of every tensor over the whole dataset, as TFLite's own calibrator keeps them.

    litert-quantizer's default update is a moving average (smoothing 0.95) of per-sample
    ranges: with a few hundred samples the range it keeps is far narrower than the data's, and
    outputs clip (measured on MobileNetV2 int8: max error 0.335 against 0.118 for the
    converter's PTQ). The profiler-based mode records the same ranges as keeping every tensor
    alive (identical up to float32 rounding on MobileNetV2) about 7x faster.
    """
    from litert_quantizer import calibrator

    modes = [
        getattr(calibrator.CalibrationMode, "CALIBRATION_PROFILER_BASED", None),
        calibrator.CalibrationMode.CALIBRATION_PRESERVE_ALL_TENSORS,
    ]
    manager = getattr(q, "_recipe_manager", None)
    for mode in [m for m in modes if m is not None]:
        try:
            if manager is None:  # a future quantizer without the attribute: its own update
                return q.calibrate(dataset, num_threads=2, mode=mode)
            calib = calibrator.Calibrator(
                bytes(float_model), num_threads=2, mode=mode, qsv_update_func=_global_min_max
            )
            calib.calibrate(dataset, manager)
            return calib.get_model_qsvs()
        except (ValueError, RuntimeError):
            continue
    raise TflfuseError("litert-quantizer could not calibrate this model")


def in_tensor_ranks(graph: Graph, stats: Stats) -> dict[str, TensorStats]:
    """Per-tensor statistics shaped as litert-quantizer's own calibrator keeps them: min and max
    with one dimension of size 1 per dimension of the tensor (keepdims).

    The profiler-based calibration (`_calibrate`) gives them as shape (1,). The quantizer turns a
    min/max into a scale of the same shape, and an op that shares one scale between its inputs
    and output (CONCATENATION, its SAME_AS_OUTPUT constraint) quantizes a constant input with the
    scale of its output, which a same-scale op upstream (RESHAPE) may have handed on from a
    tensor of another rank: a rank-4 scale for a rank-3 constant is refused ("Ranks of scales (4)
    and zps (4) must be the same as the tensor rank (3)", a DeiT's class token concatenated after
    CONV_2D -> RESHAPE). With every range in its own tensor's rank, the scales are too. Entries
    of more than one value (per-channel) and tensors not in the graph are left as they are."""
    rank = {t.name: len(t.shape) for t in graph.tensors}
    out = {}
    for name, entry in stats.items():
        shaped = dict(entry)
        n = rank.get(name)
        for key in ("min", "max"):
            value = entry.get(key)
            if n is not None and value is not None and np.size(value) == 1:
                shaped[key] = np.asarray(value).reshape((1,) * n)
        out[name] = shaped
    return out


def _global_min_max(qsv: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The running range: the smallest min and the largest max seen so far."""
    if not qsv:
        return new
    merged = dict(qsv)
    merged["min"] = np.minimum(qsv["min"], new["min"])
    merged["max"] = np.maximum(qsv["max"], new["max"])
    return merged


def _layer_error_within_budget(
    q: Any, key: str, samples: list[dict[str, np.ndarray]], model: Model, pair: tuple[bytes, bytes]
) -> list[dict[str, Any]]:
    """The per-tensor error on the first 4 samples (`pair`: the float and quantized bytes), or
    one row saying why it was not computed (over `layer_error.BUDGET` bytes of activations)."""
    held = layer_error_mod.activation_bytes(model)
    if held > layer_error_mod.BUDGET:
        return [{"error": layer_error_mod.skipped(held)}]
    return _layer_error(q, key, samples[:4], None if layer_error_mod.stateful(model) else pair)


def _layer_error(
    q: Any, key: str, samples: list[dict[str, np.ndarray]], pair: tuple[bytes, bytes] | None
) -> list[dict[str, Any]]:
    """Per-tensor error of the quantized model against the float one (litert-quantizer's
    validator: mean squared error and signal-to-noise ratio), worst first. `pair` (float,
    quantized bytes): computed with one interpreter per model (`layer_error.compare`, the
    validator's numbers); None: by the validator itself (a model holding variables)."""
    from litert_quantizer.utils import validation_utils

    metrics = [validation_utils.ValidationErrorMetric.MSE]
    snr = getattr(validation_utils.ValidationErrorMetric, "SNR", None)
    if snr is not None:
        metrics.append(snr)
    try:
        if pair is not None:
            outputs, intermediates = layer_error_mod.compare(*pair, key, samples, metrics)
        else:
            res = q.validate({key: samples}, error_metrics=metrics, num_threads=1)
            single = res.get_signature_comparison_result(key)
            outputs, intermediates = single.output_tensors, single.intermediate_tensors
    except (ValueError, RuntimeError, KeyError) as exc:
        return [{"error": f"validation failed: {exc}"}]
    rows: list[dict[str, Any]] = []
    for kind, table in (("output", outputs), ("activation", intermediates)):
        for name, values in table.items():
            rows.append(
                {"tensor": name, "kind": kind, **{str(k): float(v) for k, v in values.items()}}
            )
    mse_key = next((k for k in rows[0] if k.lower() == "mse"), None) if rows else None
    if mse_key:
        rows.sort(key=lambda r: -r.get(mse_key, 0.0))
    return rows


def float_compute_ops(graph: Graph) -> list[str]:
    """Ops (other than boundary QUANTIZE/DEQUANTIZE) that still read or write float tensors."""
    out = []
    for op in graph.ops:
        if op.type in BOUNDARY_OPS:
            continue
        tensors = [t for t in (*op.inputs, *op.outputs) if t is not None]
        if any(
            t.dtype == "FLOAT32" and not (t.is_constant and op.type == "DEQUANTIZE")
            for t in tensors
        ):
            out.append(op.type)
    return out


def aeq_unsupported(float_model: bytes, parsed: Model | None = None) -> list[str]:
    """Op types of the main graph that litert-quantizer has no int8 config for (e.g. RELU6)
    and `int8_completion` does not make int8 after it: with them the result is not fully int8,
    so the caller takes the converter's PTQ instead (where there is a TF graph)."""
    from litert_quantizer import qtyping

    known = set(qtyping.TFLOperationName.__members__) | COMPLETED_OPS
    # (convert passes its IR; a caller with the file's bytes only has them parsed)
    graph = (parsed if parsed is not None else flatbuffer.from_bytes(float_model)).main
    return sorted({op.type for op in graph.ops if op.type not in known | BOUNDARY_OPS})


def _float_boundary(t: Any, side: str) -> Any:
    """The QUANTIZE after a float input (or DEQUANTIZE before a float output) the quantizer
    left, or None."""
    if t.dtype != "FLOAT32":
        return None
    if side == "input":
        op = t.consumers[0] if len(t.consumers) == 1 else None
        return op if op is not None and op.type == "QUANTIZE" else None
    op = t.producer
    return op if op is not None and op.type == "DEQUANTIZE" else None


def _retype(graph: Any, tensors: list, io_type: str, side: str, renamed: dict) -> list:
    """The model's inputs (or outputs) with `io_type`; `renamed` maps old tensors to new. Every
    boundary op keeps its place in the op order (nothing is appended and re-sorted)."""
    out = []
    for t in tensors:
        boundary = _float_boundary(t, side)
        if boundary is not None:
            core = boundary.outputs[0] if side == "input" else boundary.inputs[0]
            if io_type == "float32":
                out.append(t)
                continue
            place = _neighbour(graph, boundary)
            graph.remove_op(boundary)
        elif t.dtype == "INT8":
            core, place = t, None
        else:
            out.append(t)
            continue
        new = core if io_type == "int8" else _boundary(graph, core, io_type, side, place)
        renamed[t] = new
        out.append(new)
    return out


def _neighbour(graph: Graph, op: Any) -> tuple[str, Any] | None:
    """Where a replacement of `op` goes to take its place: before the op after it, or after
    the op before it."""
    i = graph.ops.index(op)
    if i + 1 < len(graph.ops):
        return ("before", graph.ops[i + 1])
    return ("after", graph.ops[i - 1]) if i > 0 else None


def set_io_types(model: Model, input_type: str, output_type: str) -> None:
    """Give a quantized model the requested I/O types. Its int8 core tensors are found whether
    the quantizer left float boundaries (QUANTIZE after an input, DEQUANTIZE before an output) or
    int8 I/O; uint8 I/O adds a QUANTIZE between uint8 and int8 (zero point + 128, same scale) and
    float32 I/O a QUANTIZE / DEQUANTIZE. The signature follows the new tensors. A boundary op
    replaced takes the place of the one it replaces, a new one goes right before the first
    reader (or after the producer) of its int8 tensor: no other op moves, so the model keeps
    the op order its quantizer wrote."""
    graph = model.main
    renamed: dict[Any, Any] = {}
    graph.inputs = _retype(graph, graph.inputs, input_type, "input", renamed)
    graph.outputs = _retype(graph, graph.outputs, output_type, "output", renamed)
    model.retarget_signatures(renamed)
    DeadCodeElimination().run(graph)
    model.validate()


def _boundary(graph: Graph, core: Any, io_type: str, side: str, place: Any = None) -> Any:
    """A new uint8 or float32 I/O tensor joined to the int8 `core` by QUANTIZE / DEQUANTIZE,
    placed at `place` (("before" | "after", op)), else next to the ops of `core`."""
    qp = core.quantization
    if io_type == "uint8":
        quant = Quantization(
            scale=np.array(qp.scale, dtype=np.float32),
            zero_point=np.array(qp.zero_point, dtype=np.int64) + 128,
        )
        new = graph.add_tensor(f"{core.name}_uint8", core.shape, "UINT8", quantization=quant)
        op_type = "QUANTIZE"
    else:
        new = graph.add_tensor(f"{core.name}_float", core.shape, "FLOAT32")
        op_type = "QUANTIZE" if side == "input" else "DEQUANTIZE"
    if place is None:
        readers = [op for op in graph.ops if core in op.inputs]
        if side == "input" and readers:
            place = ("before", readers[0])
        elif side == "output" and core.producer is not None:
            place = ("after", core.producer)
    where = {place[0]: place[1]} if place is not None else {}
    if side == "input":
        graph.add_op(op_type, [new], [core], **where)
    else:
        graph.add_op(op_type, [core], [new], **where)
    return new
