"""Facts about a model for `tflfuse inspect` and reports: op tables, counts, bytes, quantization.

Everything here is machine-independent (counts and byte sizes), so tests can assert on it.
"""

from __future__ import annotations

from typing import Any

from tflfuse.ir import Graph, Model, Op, Tensor


def tensor_brief(t: Tensor | None) -> dict[str, Any] | None:
    if t is None:
        return None
    out: dict[str, Any] = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
    if t.is_constant:
        out["constant"] = True
    return out


def op_row(index: int, op: Op) -> dict[str, Any]:
    row: dict[str, Any] = {
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
                total += int(t.data.nbytes)
    return total


def activation_bytes(graph: Graph) -> int:
    """Bytes of every non-constant tensor an op writes: what goes to memory and back without
    fusion (the seeds' activation traffic, counted once per tensor)."""
    return sum(t.nbytes for t in graph.activations())


def quantization_summary(graph: Graph) -> dict[str, Any]:
    dtypes: dict[str, int] = {}
    per_channel = per_tensor = 0
    for t in graph.tensors:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
        if t.is_quantized:
            if t.quantization.per_channel:
                per_channel += 1
            else:
                per_tensor += 1
    io = {
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


def graph_summary(index: int, graph: Graph, *, ops: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
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


def model_summary(model: Model, *, ops: bool = True) -> dict[str, Any]:
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
