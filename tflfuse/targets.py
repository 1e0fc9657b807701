"""Which ops of a model a target runs: the Edge TPU mapping predictor and the XNNPACK check.

The capability tables live in `delegates/*.toml` (one per delegate, each row citing its source);
this module reads them and applies them to a `tflfuse.ir.Model`. The Edge TPU prediction follows
the compiler's documented behaviour (see the semantics block in `delegates/edgetpu.toml`): ops map
in execution order until the first one that cannot, and that op and every op after it run on the
CPU. The result uses the compiler's own status strings, so `tflfuse check` and a real
`edgetpu_compiler -s` log can be compared line by line.

No TensorFlow here (GPU compatibility comes from TFLite's analyzer, in `tflfuse.gpu_compat`).
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Model, Op, Tensor

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TARGETS = ("edgetpu", "xnnpack", "gpu")
FLOAT_TYPES = frozenset({"FLOAT32", "FLOAT16", "FLOAT64"})


# -- capability tables ---------------------------------------------------------------------------
def _table_dirs() -> list[Path]:
    """Where the delegate tables are: the package data, found by `tflfuse.resources` (a wheel's
    `tflfuse/data/delegates/`, or `delegates/` of the checkout)."""
    from tflfuse.resources import data_dir

    return [Path(str(data_dir("delegates")))]  # a Path for every file-system install


@functools.cache
def capability(name: str) -> dict[str, Any]:
    """The parsed `delegates/NAME.toml`."""
    for folder in _table_dirs():
        path = folder / f"{name}.toml"
        if path.is_file():
            with path.open("rb") as f:
                return tomllib.load(f)
    raise TflfuseError(
        f"no capability table for target {name!r} (looked for delegates/{name}.toml)"
    )


# -- results -------------------------------------------------------------------------------------
@dataclass
class OpPrediction:
    index: int
    op: str
    target: str  # the accelerator's name, or "cpu"
    status: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "op": self.op,
            "target": self.target,
            "status": self.status,
            "reason": self.reason,
        }


@dataclass
class Prediction:
    """Per-op placement for one target, totals, and (Edge TPU) parameter memory."""

    target: str
    ops: list[OpPrediction]
    memory: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def mapped(self) -> int:
        return sum(1 for o in self.ops if o.target != "cpu")

    @property
    def cpu(self) -> int:
        return sum(1 for o in self.ops if o.target == "cpu")

    @property
    def fraction_mapped(self) -> float:
        return self.mapped / len(self.ops) if self.ops else 1.0

    def cpu_ops(self) -> list[int]:
        return [o.index for o in self.ops if o.target == "cpu"]

    def table(self) -> list[tuple[str, int, str]]:
        """(operator, count, status) rows, as in the compiler's `Operator Count Status` table."""
        counts: dict[tuple[str, str], int] = {}
        for o in self.ops:
            counts[(o.op, o.status)] = counts.get((o.op, o.status), 0) + 1
        return [(op, n, status) for (op, status), n in counts.items()]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "target": self.target,
            "ops": [o.to_dict() for o in self.ops],
            "mapped": self.mapped,
            "cpu": self.cpu,
        }
        if self.memory:
            out["memory"] = dict(self.memory)
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def op_label(op: Op) -> str:
    return op.custom_code if op.type == "CUSTOM" and op.custom_code else op.type


def predict(model: Model, target: str, compiler_version: str | None = None) -> Prediction:
    """Where each op of the main subgraph runs on `target` ("edgetpu", "xnnpack" or "gpu")."""
    if target == "edgetpu":
        return predict_edgetpu(model, compiler_version)
    if target == "xnnpack":
        return predict_xnnpack(model)
    if target == "gpu":  # TFLite's analyzer reads bytes; it needs the interpreter package
        from tflfuse import flatbuffer
        from tflfuse.delegate_probe import predict_gpu

        return predict_gpu(model, flatbuffer.to_bytes(model))
    raise TflfuseError(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")


# -- shared tensor facts -------------------------------------------------------------------------
def _activations(op: Op) -> list[Tensor]:
    return [t for t in (*op.inputs, *op.outputs) if t is not None and not t.is_constant]


def _is_dynamic(t: Tensor) -> bool:
    return t.shape_signature is not None and any(d < 0 for d in t.shape_signature)


def _const_ints(t: Tensor | None) -> list[int] | None:
    if t is None or not t.is_constant or t.is_raw:
        return None
    return [int(v) for v in np.asarray(t.data).reshape(-1)]


def _axes(op: Op) -> list[int] | None:
    """Normalized reduction axes of MEAN/SUM/REDUCE_* (None when not constant)."""
    axes = _const_ints(op.inputs[1] if len(op.inputs) > 1 else None)
    if axes is None:
        return None
    rank = len(op.inputs[0].shape)
    return sorted({a % rank for a in axes}) if rank else axes


# -- Edge TPU ------------------------------------------------------------------------------------
Check = Callable[[Op, dict[str, Any]], str | None]


def _check_pool_plane(op: Op, row: dict[str, Any]) -> str | None:
    limit = row.get("max_pool_plane")
    if limit is None:
        return None
    if op.type == "AVERAGE_POOL_2D":
        plane = int(op.options.get("filter_height", 1)) * int(op.options.get("filter_width", 1))
    else:
        axes = _axes(op) or []
        shape = op.inputs[0].shape
        plane = int(np.prod([shape[a] for a in axes if a not in (0, len(shape) - 1)] or [1]))
    if plane > limit:
        return f"averages a {plane}-pixel plane, more than the {limit} the compiler maps"
    return None


def _check_reduction(op: Op, row: dict[str, Any]) -> str | None:
    if op.type not in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN"):
        return None
    axes = _axes(op)
    if axes is None:
        return "reduction axes are not a constant"
    shape = op.inputs[0].shape
    if row.get("no_batch_reduction") and 0 in axes and len(shape) == 4 and shape[0] > 1:
        return "reduces over the batch dimension"
    multiple = row.get("z_reduction_multiple")
    last = len(shape) - 1
    if multiple and last in axes and len(shape) >= 3 and shape[last] % multiple:
        return f"reduces over {shape[last]} channels, not a multiple of {multiple}"
    return None


def _check_concat(op: Op, row: dict[str, Any]) -> str | None:
    if not row.get("constant_input_rule"):
        return None
    consts = [t for t in op.inputs if t is not None and t.is_constant]
    if not consts:
        return None
    if len(op.inputs) != 2:
        return "a constant input is allowed only when there are exactly 2 inputs"
    for t in consts:
        zero = 0
        if t.is_quantized and t.quantization.zero_point is not None:
            zero = int(np.asarray(t.quantization.zero_point).reshape(-1)[0])
        if t.is_raw or not np.all(np.asarray(t.data) == zero):
            return "its constant input is not all zeros"
    return None


def _check_pad(op: Op, row: dict[str, Any]) -> str | None:
    if not row.get("no_batch_padding"):
        return None
    pads = _const_ints(op.inputs[1] if len(op.inputs) > 1 else None)
    if pads is None:
        return "paddings are not a constant"
    if len(pads) >= 2 and (pads[0] or pads[1]):
        return "pads the batch dimension"
    return None


def _check_softmax(op: Op, row: dict[str, Any]) -> str | None:
    if not row.get("one_dimensional"):
        return None
    shape = op.inputs[0].shape
    if sum(1 for d in shape if d > 1) > 1:
        return f"input {list(shape)} is not one-dimensional"
    limit = row.get("max_elements")
    if limit and op.inputs[0].size > limit:
        return f"input has {op.inputs[0].size} elements, more than {limit}"
    return None


def _check_resize(op: Op, row: dict[str, Any]) -> str | None:
    if not row.get("integer_scale"):
        return None
    src, dst = op.inputs[0].shape, op.outputs[0].shape
    if len(src) != 4 or len(dst) != 4:
        return "input/output is not an image tensor"
    align = bool(op.options.get("align_corners", False))
    for n_in, n_out in ((src[1], dst[1]), (src[2], dst[2])):
        if n_in == n_out:
            continue
        if align:
            if n_in <= 1 or (n_out - 1) % (n_in - 1):
                return (
                    f"align_corners resize {n_in} -> {n_out} has no integer scale"
                    " (the compiler refuses it to avoid loss in precision)"
                )
        elif n_out % n_in:
            return f"resize {n_in} -> {n_out} has no integer scale"
    limit = row.get("max_output_plane")
    if limit and dst[1] * dst[2] > limit:
        return f"output plane {dst[1]}x{dst[2]} is larger than the compiler maps ({limit} px)"
    return None


def _check_fc(op: Op, row: dict[str, Any]) -> str | None:
    default_format = op.options.get("weights_format", 0) in (0, "DEFAULT")
    if row.get("default_weights_only") and not default_format:
        return "weights are not in the default format"
    return None


def _check_prelu(op: Op, row: dict[str, Any]) -> str | None:
    if op.type != "PRELU" or len(op.inputs) < 2 or op.inputs[1] is None:
        return None
    if any(d > 1 for d in op.inputs[1].shape[:-1]):
        return "alpha varies along more than the channel dimension"
    return None


def _check_pack(op: Op, row: dict[str, Any]) -> str | None:
    if row.get("no_batch_axis") and int(op.options.get("axis", 0)) == 0:
        return "packs along the batch dimension"
    return None


_EDGETPU_CHECKS: tuple[Check, ...] = (
    _check_pool_plane,
    _check_reduction,
    _check_concat,
    _check_pad,
    _check_softmax,
    _check_resize,
    _check_fc,
    _check_prelu,
    _check_pack,
)


def edgetpu_op_status(op: Op, table: dict[str, Any] | None = None) -> tuple[str, str]:
    """(status key, reason) for one op on its own: "mapped" or why not (see [status])."""
    table = table or capability("edgetpu")
    meta = table["meta"]
    row = table["ops"].get(op.type) if op.type != "CUSTOM" else None
    if row is None:
        return "unsupported", f"{op_label(op)} is not in the Edge TPU op table"
    acts, consts = set(meta["activation_types"]), set(meta["constant_types"])
    states = set(meta["state_types"])
    for t in (*op.inputs, *op.outputs):
        if t is None:
            continue
        if t.is_variable:
            ok = t.dtype in states
        elif t.is_constant:
            ok = t.dtype in consts
        else:
            ok = t.dtype in acts
        if not ok:
            kind = "constant" if t.is_constant else "tensor"
            return "data_type", f"{kind} {t.name!r} is {t.dtype} (the Edge TPU runs int8 only)"
    for t in _activations(op):
        if _is_dynamic(t):
            return "limitation", f"tensor {t.name!r} has a dynamic shape"
        big = [d for d in t.shape if d > 1]
        if len(big) > meta["max_nontrivial_dims"]:
            return "limitation", f"tensor {t.name!r} {list(t.shape)} has more than 3 dimensions > 1"
    if "fused_activation_function" in op.options:
        allowed = row.get("fused_activations", meta["default_fused_activations"])
        if op.fused_activation not in allowed:
            return "limitation", f"fused activation {op.fused_activation} is not allowed here"
    if row.get("no_half_pixel_centers") and op.options.get("half_pixel_centers"):
        return "version", "half_pixel_centers makes this op version 3, which the compiler rejects"
    for check in _EDGETPU_CHECKS:
        reason = check(op, row)
        if reason:
            return "limitation", reason
    return "mapped", "in the op table; types, shapes and limits hold"


def _boundary_cpu(op: Op, graph: Graph, status: str) -> bool:
    """An op left on the CPU outside the compiled segment without cutting it (float I/O)."""
    if status != "data_type":
        return False
    if op.type == "QUANTIZE":
        src = op.inputs[0]
        return src is not None and src.dtype in FLOAT_TYPES and src in graph.inputs
    if op.type == "DEQUANTIZE":
        return all(graph.is_graph_output(t) for t in op.outputs)
    return False


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


def predict_edgetpu(model: Model, compiler_version: str | None = None) -> Prediction:
    """The compiler's mapping of the main subgraph, predicted from `delegates/edgetpu.toml`.

    `compiler_version` (e.g. "14.1") predicts an older compiler: ops its table row says were
    added later are not supported by it. Default: the version the table describes.
    """
    table = capability("edgetpu")
    status_text = table["status"]
    graph = model.main
    ops: list[OpPrediction] = []
    cut: OpPrediction | None = None
    mapped_ops: list[Op] = []
    wanted = _version(compiler_version) if compiler_version else None
    for index, op in enumerate(graph.ops):
        key, reason = edgetpu_op_status(op, table)
        label = op_label(op)
        since = table["ops"].get(op.type, {}).get("since")
        if wanted and since and _version(since) > wanted and op.type != "CUSTOM":
            key, reason = "unsupported", f"{label} needs compiler {since} or later"
        if cut is None and key != "mapped" and not _boundary_cpu(op, graph, key):
            cut = OpPrediction(index, label, "cpu", status_text[key], reason)
            ops.append(cut)
            continue
        if cut is not None and key == "mapped":
            why = f"after the cut at op {cut.index} ({cut.op})"
            ops.append(OpPrediction(index, label, "cpu", status_text["after_cut"], why))
        elif key == "mapped":
            ops.append(OpPrediction(index, label, "edgetpu", status_text[key], reason))
            mapped_ops.append(op)
        else:
            ops.append(OpPrediction(index, label, "cpu", status_text[key], reason))
    prediction = Prediction("edgetpu", ops, memory=_edgetpu_memory(mapped_ops, table))
    if cut is not None and cut.status == status_text["data_type"] and not mapped_ops:
        prediction.notes.append(
            "the model computes in float: the Edge TPU needs full int8 (convert with the edgetpu"
            " recipe, uint8 I/O)"
        )
    if len(model.subgraphs) > 1:
        prediction.notes.append(
            f"only the main subgraph is predicted ({len(model.subgraphs) - 1} more not compiled)"
        )
    return prediction


def _edgetpu_memory(mapped_ops: list[Op], table: dict[str, Any]) -> dict[str, int]:
    """Estimated parameter bytes of the mapped ops and how much fits in the on-chip cache."""
    seen: set[int] = set()
    total = 0
    for op in mapped_ops:
        for t in op.inputs:
            if t is not None and t.is_constant and id(t) not in seen:
                seen.add(id(t))
                total += int(t.data.nbytes)
    cache = int(table["meta"]["parameter_cache_bytes"])
    return {
        "parameter_bytes": total,
        "cache_bytes": cache,
        "on_chip_bytes": min(total, cache),
        "off_chip_bytes": max(0, total - cache),
    }


# -- XNNPACK -------------------------------------------------------------------------------------
def xnnpack_op_status(op: Op, table: dict[str, Any] | None = None) -> tuple[bool, str]:
    """(taken, reason) for one op under XNNPACK, from `delegates/xnnpack.toml`."""
    table = table or capability("xnnpack")
    row = table["ops"].get(op.type) if op.type != "CUSTOM" else None
    if row is None:
        return False, f"{op_label(op)} has no XNNPACK kernel"
    types = set(row.get("types", table["meta"]["types"]))
    for t in _activations(op):
        if t.dtype not in types:
            return False, f"tensor {t.name!r} is {t.dtype}, which XNNPACK's {op.type} does not take"
        if _is_dynamic(t) and not row.get("dynamic_ok", False):
            return False, f"tensor {t.name!r} has a dynamic shape"
    if "fused_activation_function" in op.options:
        allowed = row.get("fused_activations", table["meta"]["fused_activations"])
        if op.fused_activation not in allowed:
            return False, f"fused activation {op.fused_activation} is not supported"
    if row.get("same_signedness") and op.inputs and op.inputs[0] is not None:
        kinds = {t.dtype for t in (op.inputs[0], *op.outputs)} & {"INT8", "UINT8"}
        if len(kinds) > 1:
            return False, "int8 <-> uint8 requantization is left to the TFLite kernels"
    if row.get("max_outputs") and len(op.outputs) > row["max_outputs"]:
        return False, f"{len(op.outputs)} outputs, more than the {row['max_outputs']} XNNPACK takes"
    for name in row.get("constant_inputs", []):
        index = int(name)
        t = op.inputs[index] if index < len(op.inputs) else None
        if t is not None and not _static(t):
            return False, f"input {index} must be a constant"
    return True, "XNNPACK has a kernel for this op, type and activation"


def _static(t: Tensor) -> bool:
    """A constant, or a DEQUANTIZE of one (float16 / sparse weights XNNPACK unpacks itself)."""
    if t.is_constant:
        return True
    op = t.producer
    return op is not None and op.type in ("DEQUANTIZE", "DENSIFY") and _static(op.inputs[0])


def predict_xnnpack(model: Model) -> Prediction:
    """Which ops of the main subgraph XNNPACK takes (it may form several partitions)."""
    table = capability("xnnpack")
    ops = []
    for index, op in enumerate(model.main.ops):
        taken, reason = xnnpack_op_status(op, table)
        status = "Delegated to XNNPACK" if taken else "Runs on the TFLite CPU kernels"
        ops.append(OpPrediction(index, op_label(op), "xnnpack" if taken else "cpu", status, reason))
    return Prediction("xnnpack", ops)


# -- text ----------------------------------------------------------------------------------------
def format_table(rows: list[tuple[str, int, str]]) -> list[str]:
    """Rows in the compiler's `Operator  Count  Status` layout."""
    lines = [f"{'Operator':<30} {'Count':<10} Status", ""]
    lines += [f"{op:<30} {count:<10} {status}" for op, count, status in rows]
    return lines


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}MiB" if n >= 2**20 else f"{n / 2**10:.2f}KiB"


def format_prediction(prediction: Prediction, model_name: str) -> str:
    """The text report of `tflfuse check`: header, status table, then each CPU op and why."""
    accel = {"edgetpu": "Edge TPU", "xnnpack": "XNNPACK", "gpu": "GPU"}[prediction.target]
    lines = [f"{model_name}: predicted placement on {accel}"]
    mem = prediction.memory
    if mem:
        lines += [
            f"Estimated parameters of mapped ops: {_mib(mem['parameter_bytes'])}",
            f"On-chip memory used for caching model parameters: {_mib(mem['on_chip_bytes'])}"
            f" of {_mib(mem['cache_bytes'])}",
            f"Off-chip memory used for streaming uncached model parameters:"
            f" {_mib(mem['off_chip_bytes'])}",
        ]
    lines += [
        f"Total number of operations: {len(prediction.ops)}",
        f"Number of operations that will run on {accel}: {prediction.mapped}",
        f"Number of operations that will run on CPU: {prediction.cpu}",
        "",
        *format_table(prediction.table()),
    ]
    cpu = [o for o in prediction.ops if o.target == "cpu"]
    if cpu:
        lines += ["", "On the CPU, and why:"]
        lines += [f"  #{o.index:<4} {o.op:<24} {o.reason}" for o in cpu]
    lines += [f"note: {n}" for n in prediction.notes]
    return "\n".join(lines)
