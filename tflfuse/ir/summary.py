"""Facts about a model for `tflfuse inspect`, `check` and reports: op tables, counts, bytes,
quantization, weights stored as float16.

Everything here is machine-independent (counts and byte sizes), so tests can assert on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict, cast

from tflfuse.ir.graph import Graph, Model, Op, Quantization, Tensor

if TYPE_CHECKING:
    import numpy as np


class _TensorBrief(TypedDict):
    name: str
    shape: list[int]
    dtype: str


class TensorBrief(_TensorBrief, total=False):
    constant: bool  # only on a constant, True


class _OpRow(TypedDict):
    index: int
    op: str  # the builtin name, or a custom op's code
    inputs: list[TensorBrief | None]  # None: an omitted optional input
    outputs: list[TensorBrief | None]


class OpRow(_OpRow, total=False):
    fused_activation: str  # only on an op with the option


class QuantizedTensors(TypedDict):
    per_tensor: int
    per_channel: int


class IoTypes(TypedDict):
    inputs: list[str]
    outputs: list[str]


class QuantizationSummary(TypedDict):
    kind: str  # float, float16, dynamic-range, int8, uint8, int16
    tensor_dtypes: dict[str, int]
    quantized_tensors: QuantizedTensors
    io: IoTypes


class _GraphSummary(TypedDict):
    index: int
    name: str
    op_count: int
    tensor_count: int
    op_counts: dict[str, int]
    parameter_bytes: int
    activation_bytes: int
    inputs: list[TensorBrief | None]
    outputs: list[TensorBrief | None]
    quantization: QuantizationSummary


class GraphSummary(_GraphSummary, total=False):
    ops: list[OpRow]  # only when asked for


class SignatureSummary(TypedDict):
    key: str
    subgraph: int
    inputs: list[str]
    outputs: list[str]


class ModelSummary(TypedDict):
    description: str
    subgraphs: list[GraphSummary]
    signatures: list[SignatureSummary]
    metadata: dict[str, int]  # name -> bytes


def tensor_brief(t: Tensor | None) -> TensorBrief | None:
    if t is None:
        return None
    out: TensorBrief = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
    if t.is_constant:
        out["constant"] = True
    return out


def op_row(index: int, op: Op) -> OpRow:
    row: OpRow = {
        "index": index,
        "op": op.custom_code if op.type == "CUSTOM" and op.custom_code else op.type,
        "inputs": [tensor_brief(t) for t in op.inputs],
        "outputs": [tensor_brief(t) for t in op.outputs],
    }
    if "fused_activation_function" in op.options:
        row["fused_activation"] = op.fused_activation
    return row


def parameter_bytes(graph: Graph) -> int:
    """Bytes of constant data the subgraph's ops read (each constant counted once)."""
    seen: set[int] = set()
    total = 0
    for op in graph.ops:
        for t in op.inputs:
            if t is not None and t.is_constant and id(t.data) not in seen:
                seen.add(id(t.data))
                total += int(cast("np.ndarray", t.data).nbytes)
    return total


def activation_bytes(graph: Graph) -> int:
    """Bytes of every non-constant tensor an op writes: what goes to memory and back without
    fusion (the seeds' activation traffic, counted once per tensor)."""
    return sum(t.nbytes for t in graph.activations())


def quantization_summary(graph: Graph) -> QuantizationSummary:
    dtypes: dict[str, int] = {}
    per_channel = per_tensor = 0
    for t in graph.tensors:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
        if t.is_quantized:
            if cast(Quantization, t.quantization).per_channel:
                per_channel += 1
            else:
                per_tensor += 1
    io: IoTypes = {
        "inputs": [t.dtype for t in graph.inputs],
        "outputs": [t.dtype for t in graph.outputs],
    }
    if per_channel or per_tensor:
        kind = "int8" if dtypes.get("INT8") else "uint8" if dtypes.get("UINT8") else "int16"
        if dtypes.get("FLOAT32") and not any(op.type in ("QUANTIZE",) for op in graph.ops):
            kind = "dynamic-range" if dtypes.get("INT8") else kind
    elif dtypes.get("FLOAT16") and any(op.type == "DEQUANTIZE" for op in graph.ops):
        kind = "float16"
    else:
        kind = "float"
    return {
        "kind": kind,
        "tensor_dtypes": dict(sorted(dtypes.items())),
        "quantized_tensors": {"per_tensor": per_tensor, "per_channel": per_channel},
        "io": io,
    }


def graph_summary(index: int, graph: Graph, *, ops: bool = True) -> GraphSummary:
    out: GraphSummary = {
        "index": index,
        "name": graph.name,
        "op_count": len(graph.ops),
        "tensor_count": len(graph.tensors),
        "op_counts": graph.op_counts(),
        "parameter_bytes": parameter_bytes(graph),
        "activation_bytes": activation_bytes(graph),
        "inputs": [tensor_brief(t) for t in graph.inputs],
        "outputs": [tensor_brief(t) for t in graph.outputs],
        "quantization": quantization_summary(graph),
    }
    if ops:
        out["ops"] = [op_row(i, op) for i, op in enumerate(graph.ops)]
    return out


def model_summary(model: Model, *, ops: bool = True) -> ModelSummary:
    return {
        "description": model.description,
        "subgraphs": [graph_summary(i, g, ops=ops) for i, g in model.graphs()],
        "signatures": [
            {
                "key": s.key,
                "subgraph": s.subgraph,
                "inputs": list(s.inputs),
                "outputs": list(s.outputs),
            }
            for s in model.signatures
        ],
        "metadata": {k: len(v) for k, v in model.metadata.items()},
    }


def float16_source(op: Op) -> tuple[Tensor, bool] | None:
    """(the float16 constant, read through DENSIFY) when `op` is a DEQUANTIZE of one to float32."""
    if op.type != "DEQUANTIZE" or not op.inputs or op.outputs[0].dtype != "FLOAT32":
        return None
    t = op.inputs[0]
    if t is None:
        return None
    if t.is_constant and t.dtype == "FLOAT16":
        return t, False
    producer = t.producer
    if producer is not None and producer.type == "DENSIFY" and producer.inputs:
        w = producer.inputs[0]
        if w is not None and w.is_constant and w.dtype == "FLOAT16" and _sparsity(w) is not None:
            return w, True
    return None


def count(graph: Graph) -> int:
    """How many DEQUANTIZE ops of `graph` read a float16 constant (directly or densified)."""
    return sum(1 for op in graph.ops if float16_source(op) is not None)


def stored_float16_note(model: Model) -> str | None:
    """What `tflfuse check` says of a model whose weights are stored as float16 (else None)."""
    n = count(model.main)
    if not n:
        return None
    return (
        f"{n} weights are stored as float16 and read through DEQUANTIZE: a float model at half"
        " size (tflfuse convert takes it as float, the weights widened exactly to float32)"
    )


def _sparsity(t: Tensor) -> object | None:
    return t.extra.get("sparsity")
