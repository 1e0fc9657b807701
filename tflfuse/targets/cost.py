"""A static cost model: kernels, activation traffic, weight bytes, multiply-adds; on-chip budgets.

Fusion pays by launching fewer kernels and writing fewer intermediate tensors to memory and
reading them back. This module counts those things per op (machine-independent numbers), and
answers the questions rules ask before a rewrite that is not a pure win on every target:
does a merged weight tensor still fit on chip, does a chain merge cost more multiply-adds.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import numpy as np

from tflfuse.ir import Graph, Model, Op
from tflfuse.resources import data_file
from tflfuse.targets.registry import MIB, Target

# What each target keeps on chip, which splits it delegates, how many dimensions it maps, and
# which measured runtime it runs on: its `CostProfile` in the target registry (`Target.cost`).


def layout_fits(target: Target, shape: tuple[int, ...]) -> bool:
    """A new intermediate tensor of this shape keeps the target's mapping."""
    limit = target.cost.max_nontrivial_dims
    return limit is None or sum(1 for d in shape if d > 1) <= limit


# Ops that are views or metadata for the runtime, not real kernels with traffic.
_FREE = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS"})


@dataclass
class OpCost:
    kernels: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    weight_bytes: int = 0
    macs: int = 0

    def __iadd__(self, other: OpCost) -> OpCost:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)
        return self


def _elements(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def macs(op: Op) -> int:
    """Multiply-adds of the heavy kernels (0 for element-wise and data-movement ops)."""
    if not op.outputs or len(op.inputs) < 2 or op.inputs[1] is None:
        return 0
    out = _elements(op.output.shape)
    w = op.inputs[1].shape  # tested above: present
    if op.type == "CONV_2D" and len(w) == 4:
        return out * w[1] * w[2] * w[3]
    if op.type == "DEPTHWISE_CONV_2D" and len(w) == 4:
        return out * w[1] * w[2]
    if op.type == "FULLY_CONNECTED" and len(w) == 2:
        return out * w[1]
    if op.type == "TRANSPOSE_CONV" and len(op.inputs) > 2 and op.inputs[2] is not None:
        wt = op.inputs[1].shape
        return _elements(op.inputs[2].shape) * wt[0] * wt[1] * wt[2]
    if op.type == "BATCH_MATMUL":
        a = op.input(0).shape  # a BATCH_MATMUL has both operands
        return out * (a[-1] if a else 1)
    return 0


def op_cost(op: Op) -> OpCost:
    """What running `op` once costs: one kernel, its activation reads/writes, its weights."""
    reads = sum(t.nbytes for t in op.inputs if t is not None and not t.is_constant)
    weights = sum(t.nbytes for t in op.inputs if t is not None and t.is_constant)
    writes = sum(t.nbytes for t in op.outputs)
    if op.type in _FREE:
        return OpCost(0, 0, 0, weights, 0)
    return OpCost(1, reads, writes, weights, macs(op))


def graph_cost(graph: Graph) -> OpCost:
    total = OpCost()
    for op in graph.ops:
        total += op_cost(op)
    return total


def model_cost(model: Model) -> dict[str, int]:
    """Totals over every subgraph: kernels, read/write bytes, weight bytes, multiply-adds.

    Reports show this before and after optimization (`cost_delta`).
    """
    total = OpCost()
    for g in model.subgraphs:
        total += graph_cost(g)
    return asdict(total)


def cost_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, dict[str, float]]:
    """{field: {before, after, ratio}} for a report."""
    out = {}
    for key, b in before.items():
        a = after.get(key, 0)
        out[key] = {"before": b, "after": a, "ratio": round(a / b, 4) if b else 1.0}
    return out


def chain_merge_pays(inputs: int, middle: int, outputs: int) -> bool:
    """Merging I->M->O linear maps into I->O costs no more multiply-adds per position."""
    return inputs * outputs <= inputs * middle + middle * outputs


def fits_on_chip(target: Target, weight_bytes: int) -> bool:
    return weight_bytes <= target.cost.on_chip_bytes


def horizontal_pays(
    target: Target, siblings: int, weight_bytes: int, *, absorbs_concat: bool, equal_parts: bool
) -> str | None:
    """None when merging `siblings` ops into one pays on `target`, else the reason it does not.

    Kernels after: 1 merged op, plus a split unless the outputs fed one concatenation. On an
    int8-only target a split is refused: the parts would lose their own scales
    (`CostProfile.int8_only`); absorbing a concatenation keeps the one scale its output had.
    """
    profile, name = target.cost, target.name
    if not fits_on_chip(target, weight_bytes):
        return (
            f"merged weights ({weight_bytes / MIB:.1f} MiB) exceed the {name} on-chip budget "
            f"({profile.on_chip_bytes / MIB:.0f} MiB)"
        )
    if not absorbs_concat and profile.int8_only:
        return (
            f"the {name} computes in int8 with one scale per tensor: the siblings' outputs would"
            " share the merged output's scale (their ranges may differ by orders of magnitude),"
            " and litert-quantizer leaves a SPLIT_V in float, which cuts the graph"
        )
    if not absorbs_concat and not equal_parts and not profile.split_v_delegated:
        return f"{name} does not delegate SPLIT_V, which unequal parts would need"
    most = profile.split_max_parts
    if not absorbs_concat and most is not None and siblings > most:
        return f"{name} splits into at most {most} parts"
    after = 1 if absorbs_concat else 2
    before = siblings + (1 if absorbs_concat else 0)
    if after >= before:
        return f"{siblings} ops would become {after} (merged op and a split): no fewer kernels"
    return None


# -- measured latency (delegates/cost_table.json, written by benchmarks/cost_table.py) -----------
# The measured runtime a target's models run on (`CostProfile.runtime`): XNNPACK, or the plain
# built-in kernels ("none"). Other targets (edgetpu, gpu) have no measured table: decisions
# keep their default.
_INT_TYPES = frozenset({"INT8", "UINT8", "INT16"})


def runtime_label(target: Target) -> str:
    """Words for the runtime a target's models run on (for refusal sentences)."""
    runtime = target.cost.runtime
    labels: dict[str | None, str] = {
        "xnnpack": "XNNPACK kernels",
        "none": "the plain built-in kernels",
    }
    return labels.get(runtime, f"the {target.name} kernels")


# (kind, dtype, runtime) -> (microseconds per call, microseconds per unit of work); a target
# without a measured runtime (None) finds no entry.
CostTable = dict[tuple[str, str, str | None], tuple[float, float]]


@functools.cache
def cost_table(path: str | None = None) -> CostTable:
    """{(kind, dtype, runtime): (microseconds per call, microseconds per unit of work)},
    fitted to the measured shape classes; empty when no table ships."""
    file = Path(path) if path else data_file("delegates", "cost_table.json")
    if file is None or not file.is_file():
        return {}
    entries = json.loads(file.read_text())["entries"]
    points: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for e in entries:
        points.setdefault((e["kind"], e["dtype"], e["runtime"]), []).append((e["work"], e["us"]))
    fitted: CostTable = {}
    for key, pts in points.items():
        pts.sort()
        (w0, u0), (w1, u1) = pts[0], pts[-1]
        slope = max((u1 - u0) / (w1 - w0), 0.0) if w1 > w0 else 0.0
        fitted[key] = (max(u0 - slope * w0, 0.0), slope)
    return fitted


def op_kind(op: Op) -> str:
    """The cost-table kind of an op: its type, with a variant that runs a different kernel."""
    if op.type in ("ADD", "SUB", "MUL", "SQUARED_DIFFERENCE", "DIV", "MAXIMUM", "MINIMUM"):
        shapes = [tuple(t.shape) for t in op.inputs[:2] if t is not None]
        return op.type + ("@bcast" if len(set(shapes)) > 1 else "")
    if op.type == "MEAN":
        if not op.options.get("keep_dims", False):
            return "MEAN@squeeze"
        x, axes = op.input(0), op.input(1)  # MEAN(x, axes)
        rank = len(x.shape)
        reduced = (
            {int(a) % rank for a in np.ravel(cast(np.ndarray, axes.data))}
            if axes.is_constant
            else set()
        )
        if reduced == {rank - 1}:
            return "MEAN@last"
        if rank == 4 and reduced == {1, 2} and x.shape[3] == 1 and x.shape[0] > 1:
            return "MEAN@rows"
        return "MEAN"
    if op.type == "CONV_2D":
        w = op.input(1).shape  # CONV_2D(x, w, b)
        if len(w) == 4 and w[1] > 1:
            return "CONV_2D@3x3"
    return op.type


_REDUCTIONS = frozenset({"MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"})


def work(op: Op) -> int:
    """What the op's time grows with: multiply-adds of a heavy kernel, elements read by a
    reduction, else elements written."""
    if op.type in _REDUCTIONS and op.inputs:
        return _elements(op.input(0).shape)
    return macs(op) or sum(_elements(t.shape) for t in op.outputs)


def op_dtype(op: Op) -> str:
    out = op.outputs[0] if op.outputs else None
    return "int8" if out is not None and out.dtype in _INT_TYPES else "float32"


def predict_op_us(op: Op, runtime: str | None, table: CostTable | None = None) -> float:
    """Predicted microseconds `op` adds on `runtime`; an unmeasured kind is priced as an
    element-wise ADD over its output (same dtype)."""
    table = cost_table() if table is None else table
    dtype = op_dtype(op)
    entry = table.get((op_kind(op), dtype, runtime)) or table.get((op.type, dtype, runtime))
    if entry is None:
        entry = table.get(("ADD", dtype, runtime), (1.0, 0.001))
        return entry[0] + entry[1] * sum(_elements(t.shape) for t in op.outputs)
    return entry[0] + entry[1] * work(op)


def predict_latency_us(model: Model, runtime: str | None, table: CostTable | None = None) -> float:
    """Predicted invoke time of the main subgraph on `runtime` (sum of its ops)."""
    return sum(predict_op_us(op, runtime, table) for op in model.main.ops)


def fast_sub(target: Target) -> bool:
    """The target's runtime runs an int8 SUB about as fast as an int8 ADD (within 1.5x at the
    medium shape class). Plain kernels do not (measured: benchmarks/cost_table.py); a rule
    that would write a SUB there writes ADD of a negation instead. True without a table."""
    table = cost_table()
    runtime = target.cost.runtime
    sub, add = table.get(("SUB@bcast", "int8", runtime)), table.get(("ADD@bcast", "int8", runtime))
    if sub is None or add is None:
        return runtime != "none"
    medium = 8192
    return sub[0] + sub[1] * medium <= 1.5 * (add[0] + add[1] * medium)


def mean_keep_dims_saving_us(target: Target, dtype: str, shape: tuple[int, ...]) -> float | None:
    """Microseconds a MEAN over H, W of `shape` saves on the target's runtime when written with
    keep_dims=True plus a RESHAPE instead of keep_dims=False (negative: it costs), and the
    keep_dims=False time; None without a measured table."""
    table = cost_table()
    runtime = target.cost.runtime
    squeeze = table.get(("MEAN@squeeze", dtype, runtime))
    keep, reshape = table.get(("MEAN", dtype, runtime)), table.get(("RESHAPE", dtype, runtime))
    if squeeze is None or keep is None or reshape is None:
        return None
    n, channels = _elements(shape), (shape[-1] if shape else 1)
    before = squeeze[0] + squeeze[1] * n
    after = keep[0] + keep[1] * n + reshape[0] + reshape[1] * channels
    return before - after


def mean_keep_dims_pays(target: Target, dtype: str, shape: tuple[int, ...]) -> bool:
    """keep_dims=True + RESHAPE saves at least a fifth of the MEAN's int8 time on the target's
    runtime. For a float graph, which convert may still quantize, the int8 saving must also
    outweigh the float cost (measured table; False without one)."""
    int8 = mean_keep_dims_saving_us(target, "int8", shape)
    if int8 is None or int8 <= 0:
        return False
    table = cost_table()
    squeeze = table[("MEAN@squeeze", "int8", target.cost.runtime)]
    if int8 < 0.2 * (squeeze[0] + squeeze[1] * _elements(shape)):
        return False
    if dtype == "int8":
        return True
    float_saving = mean_keep_dims_saving_us(target, "float32", shape)
    return float_saving is not None and int8 + float_saving > 0


def mean_last_as_rows_pays(target: Target, dtype: str, rows: int, cols: int) -> bool:
    """MEAN over the last axis of (1, rows, cols) is faster on the target's runtime as
    RESHAPE (rows, 1, cols, 1) -> MEAN over axes 1, 2 -> RESHAPE: the plain int8 kernels'
    fast pooling path. For a float graph convert may still quantize, the int8 saving must
    outweigh the float cost (measured table; False without one)."""
    table = cost_table()
    runtime = target.cost.runtime

    def saving(dt: str) -> float | None:
        last, pool = table.get(("MEAN@last", dt, runtime)), table.get(("MEAN@rows", dt, runtime))
        reshape = table.get(("RESHAPE", dt, runtime))
        if last is None or pool is None or reshape is None:
            return None
        n = rows * cols
        before = last[0] + last[1] * n
        after = pool[0] + pool[1] * n + 2 * (reshape[0] + reshape[1] * n)
        return before - after if before > 0 and after < 0.8 * before else -abs(after - before)

    int8 = saving("int8")
    if int8 is None or int8 <= 0:
        return False
    if dtype == "int8":
        return True
    other = saving("float32")
    return other is not None and int8 + other > 0


def spelled_hard_swish_pays(target: Target, elements: int) -> bool:
    """An int8 HARD_SWISH is slower on the target's runtime than the ADD (RELU6) and two MULs
    that spell it out: XNNPACK takes the three but not the int8 HARD_SWISH (measured table)."""
    table = cost_table()
    runtime = target.cost.runtime
    found = [table.get((k, "int8", runtime)) for k in ("HARD_SWISH", "ADD", "MUL", "MUL@bcast")]
    entries = [e for e in found if e is not None]
    if len(entries) < len(found):
        return False
    hswish, add, mul, mul_c = (a + b * elements for a, b in entries)
    return add + mul + mul_c < 0.8 * hswish


# -- int8 completion (tflfuse.quantize.int8_completion)
# --------------------------------------------------- The float ops litert-quantizer leaves between
# a DEQUANTIZE and a QUANTIZE (the "island"), and the int8 op the completion writes instead
# (RELU_0_TO_1 becomes an int8 RELU).
INT8_COMPLETION_OP: dict[str, str] = {
    "PRELU": "PRELU",
    "RELU_0_TO_1": "RELU",
    "DEPTH_TO_SPACE": "DEPTH_TO_SPACE",
}


def int8_completion_us(target: Target, float_op: str, elements: int) -> tuple[float, float] | None:
    """(island, int8 op): predicted microseconds of DEQUANTIZE -> float op -> QUANTIZE and of the
    int8 op that replaces them, over `elements` values on the target's runtime (measured table);
    None when the table lacks one of them or the target has no measured runtime."""
    table = cost_table()
    runtime = target.cost.runtime
    found = [
        table.get(("DEQUANTIZE", "float32", runtime)),
        table.get((float_op, "float32", runtime)),
        table.get(("QUANTIZE", "int8", runtime)),
    ]
    parts = [p for p in found if p is not None]
    int8 = table.get((INT8_COMPLETION_OP.get(float_op, float_op), "int8", runtime))
    if runtime is None or int8 is None or len(parts) < len(found):
        return None
    island = sum(a + b * elements for a, b in parts)
    return island, int8[0] + int8[1] * elements


def int8_completion_refusal(target: Target, float_op: str, elements: int) -> str | None:
    """Why the float island around `float_op` should stay on `target`, or None when the int8 op
    is the better spelling there.

    A target that computes in int8 only (the Edge TPU: a float op cuts its graph, the compiler
    maps the int8 op): always None. A CPU target: the int8 op must not be slower than the island
    on its runtime at this size (measured: an int8 PRELU or RELU runs on the plain kernels,
    XNNPACK takes neither, and costs ~20x the island; an int8 DEPTH_TO_SPACE is faster than the
    island on both runtimes). A target with no measured runtime keeps the fully-int8 default."""
    if target.cost.int8_only:
        return None
    times = int8_completion_us(target, float_op, elements)
    if times is None:
        return None
    island, int8 = times
    if int8 <= island:
        return None
    op = INT8_COMPLETION_OP.get(float_op, float_op)
    return (
        f"with {runtime_label(target)} the float island is faster: {island:.3g} us against"
        f" {int8:.3g} us for an int8 {op} of {elements} values (delegates/cost_table.json)"
    )
