"""Which ops of a model a target runs: the Edge TPU mapping predictor and the XNNPACK check.

The capability tables live in `delegates/*.toml` (one per delegate, each row citing its source);
this module reads them, holds the shared result types and the XNNPACK check; the target
registry (`tflfuse.targets.registry`) says which predictor each target has, and
`tflfuse.targets.predict` dispatches to it. The Edge TPU predictor lives in
`tflfuse.targets.edgetpu.predict` (re-exported by `tflfuse.targets`); it uses the compiler's
own status strings, so `tflfuse check` and a real `edgetpu_compiler -s` log can be compared
line by line.

No TensorFlow here (GPU compatibility comes from TFLite's analyzer, in `tflfuse.targets.probe`).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

import numpy as np

from tflfuse.errors import TflfuseError
from tflfuse.ir import Model, Op, Tensor
from tflfuse.json_types import JSONDict
from tflfuse.resources import data_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FLOAT_TYPES = frozenset({"FLOAT32", "FLOAT16", "FLOAT64"})


# -- capability tables ---------------------------------------------------------------------------
def _table_dirs() -> list[Path]:
    """Where the delegate tables are: the package data, found by `tflfuse.resources` (a wheel's
    `tflfuse/data/delegates/`, or `delegates/` of the checkout)."""
    return [Path(str(data_dir("delegates")))]  # a Path for every file-system install


class CapabilityTable(TypedDict, total=False):
    """A parsed `delegates/NAME.toml`: the target's facts (`meta`: types, fused activations,
    limits), one row of constraints per op type it maps (`ops`, keys as the table names them),
    and the Edge TPU's compiler tables (`status`: its log's phrases, `legalization`,
    `compiler_parse`; `edgetpu_forms.toml`'s `form` rows). The rows' values are TOML as read."""

    meta: dict[str, Any]
    ops: dict[str, dict[str, Any]]
    status: dict[str, str]
    legalization: dict[str, Any]
    compiler_parse: dict[str, Any]
    form: list[dict[str, Any]]


@functools.cache
def capability(name: str) -> CapabilityTable:
    """The parsed `delegates/NAME.toml`."""
    for folder in _table_dirs():
        path = folder / f"{name}.toml"
        if path.is_file():
            with path.open("rb") as f:
                return cast(CapabilityTable, tomllib.load(f))  # (the tables' layout)
    raise TflfuseError(
        f"no capability table for target {name!r} (looked for delegates/{name}.toml)"
    )


# -- results -------------------------------------------------------------------------------------
@dataclass
class OpPrediction:
    index: int
    op: str
    runs_on: str  # where it runs: the prediction's target's name, or "cpu" (JSON: "target")
    status: str
    reason: str

    def to_dict(self) -> JSONDict:
        return {
            "index": self.index,
            "op": self.op,
            "target": self.runs_on,
            "status": self.status,
            "reason": self.reason,
        }


@dataclass
class OtherReading:
    """What the Edge TPU compiler would map under the reading of its behaviour that the evidence
    leaves open (see "Not decided" in the header of `delegates/edgetpu.toml`): the refused ops
    near the input it concerns, `mapped` ops under the other reading, and the sentence that
    says so."""

    ops: list[int]
    mapped: int
    reading: str

    def to_dict(self) -> JSONDict:
        return {"ops": list(self.ops), "mapped": self.mapped, "reading": self.reading}

    @property
    def where(self) -> str:
        """`op 1`, or `ops 263, 264, ...` (what the tables name)."""
        if len(self.ops) == 1:
            return f"op {self.ops[0]}"
        return "ops " + ", ".join(map(str, self.ops[:3])) + (", ..." if len(self.ops) > 3 else "")


@dataclass
class Prediction:
    """Per-op placement for one target, totals, and (Edge TPU) parameter memory.

    `target_name` is the name its `Target` has in `tflfuse.targets.registry` (JSON: "target"):
    a name, not the `Target`, because the predictors that make it sit below the registry, which
    imports them on first use."""

    target_name: str
    ops: list[OpPrediction]
    memory: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    segments: int | None = None  # Edge TPU: number of compiled segments (edgetpu-custom-ops)
    compiler_version: str | None = None  # Edge TPU: the edgetpu_compiler this prediction is for
    mode: str | None = None  # Edge TPU: one Edge TPU subgraph (default) or several (-a)
    # Edge TPU: where the evidence cannot decide the compiler's placement, the other reading
    other_readings: list[OtherReading] = field(default_factory=list)

    @property
    def mapped(self) -> int:
        return sum(1 for o in self.ops if o.runs_on != "cpu")

    @property
    def cpu(self) -> int:
        return sum(1 for o in self.ops if o.runs_on == "cpu")

    @property
    def fraction_mapped(self) -> float:
        return self.mapped / len(self.ops) if self.ops else 1.0

    def cpu_ops(self) -> list[int]:
        return [o.index for o in self.ops if o.runs_on == "cpu"]

    def table(self) -> list[tuple[str, int, str]]:
        """(operator, count, status) rows, as in the compiler's `Operator Count Status` table."""
        counts: dict[tuple[str, str], int] = {}
        for o in self.ops:
            counts[(o.op, o.status)] = counts.get((o.op, o.status), 0) + 1
        return [(op, n, status) for (op, status), n in counts.items()]

    def to_dict(self) -> JSONDict:
        out: dict[str, Any] = {
            "target": self.target_name,
            "ops": [o.to_dict() for o in self.ops],
            "mapped": self.mapped,
            "cpu": self.cpu,
        }
        if self.segments is not None:
            out["segments"] = self.segments
        if self.compiler_version is not None:
            out["compiler_version"] = self.compiler_version
        if self.mode is not None:
            out["mode"] = self.mode
        if self.memory:
            out["memory"] = dict(self.memory)
        if self.notes:
            out["notes"] = list(self.notes)
        if self.other_readings:
            out["other_readings"] = [r.to_dict() for r in self.other_readings]
        return out


def op_label(op: Op) -> str:
    return op.custom_code if op.type == "CUSTOM" and op.custom_code else op.type


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
    rank = len(op.input(0).shape)  # a reduction's input
    return sorted({a % rank for a in axes}) if rank else axes


# -- XNNPACK -------------------------------------------------------------------------------------
def xnnpack_op_status(op: Op, table: CapabilityTable | None = None) -> tuple[bool, str]:
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
        w = op.inputs[index] if index < len(op.inputs) else None
        if w is not None and not _static(w):
            return False, f"input {index} must be a constant"
    return True, "XNNPACK has a kernel for this op, type and activation"


def _static(t: Tensor) -> bool:
    """A constant, or a DEQUANTIZE of one (float16 / sparse weights XNNPACK unpacks itself)."""
    if t.is_constant:
        return True
    op = t.producer
    if op is None or op.type not in ("DEQUANTIZE", "DENSIFY"):
        return False
    return _static(op.input(0))  # DEQUANTIZE(x), DENSIFY(x)


def predict_xnnpack(model: Model) -> Prediction:
    """Which ops of the main subgraph XNNPACK takes (it may form several partitions)."""
    table = capability("xnnpack")
    ops = []
    for index, op in enumerate(model.main.ops):
        taken, reason = xnnpack_op_status(op, table)
        status = "Delegated to XNNPACK" if taken else "Runs on the TFLite CPU kernels"
        ops.append(OpPrediction(index, op_label(op), "xnnpack" if taken else "cpu", status, reason))
    return Prediction("xnnpack", ops)
