"""The conversion report: facts about each model, agreement with the source model, and the
report.json / report.md files `tflfuse convert` writes.

Agreement is measured in output units: an int8/uint8 model's inputs are quantized and its outputs
dequantized with their own scales, so float and integer models are compared on the same scale.
No TensorFlow here (the interpreter comes from `tflfuse.runtime`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tflfuse import flatbuffer
from tflfuse.errors import TflfuseError
from tflfuse.runtime import make_interpreter
from tflfuse.summary import activation_bytes, parameter_bytes, quantization_summary


def model_facts(data: bytes) -> dict[str, Any]:
    """Op count and table, activation and parameter bytes, quantization kind, file size."""
    model = flatbuffer.from_bytes(data)
    g = model.main
    return {
        "op_count": sum(len(sg.ops) for sg in model.subgraphs),
        "op_counts": g.op_counts(),
        "activation_bytes": sum(activation_bytes(sg) for sg in model.subgraphs),
        "parameter_bytes": sum(parameter_bytes(sg) for sg in model.subgraphs),
        "file_bytes": len(data),
        "quantization": quantization_summary(g)["kind"],
        "io": quantization_summary(g)["io"],
    }


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
    """Outputs in float (dequantized) for each sample of `inputs` (arrays with a sample axis)."""
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


def agreement(data: bytes, inputs: list[np.ndarray], reference: list[np.ndarray]) -> dict[str, Any]:
    """Max and mean absolute error against the reference, in output units; top-1 agreement when
    an output looks like class scores (batch, classes)."""
    try:
        got = run_float(data, inputs)
    except TflfuseError as exc:
        return {"verified": False, "reason": str(exc)}
    out: dict[str, Any] = {"verified": True, "samples": len(inputs[0]), "outputs": []}
    for ref, cand in zip(reference, got):
        ref = ref.astype(np.float64)
        diff = np.abs(ref - cand.reshape(ref.shape))
        row: dict[str, Any] = {
            "max_abs": float(diff.max()) if diff.size else 0.0,
            "mean_abs": float(diff.mean()) if diff.size else 0.0,
            "reference_range": float(ref.max() - ref.min()) if ref.size else 0.0,
            "varies": bool(len(ref) > 1 and not np.allclose(ref, ref[:1])),
        }
        if ref.ndim == 2 and ref.shape[1] > 1:
            row["top1_agreement"] = float(
                np.mean(ref.argmax(1) == cand.reshape(ref.shape).argmax(1))
            )
        out["outputs"].append(row)
    out["max_abs"] = max((r["max_abs"] for r in out["outputs"]), default=0.0)
    return out


def delegate_check(data: bytes, delegate: str) -> dict[str, Any]:
    """Where the fused model's ops run on the recipe's delegate (tflfuse.targets, when present)."""
    try:
        from tflfuse import targets
    except ImportError:
        return {"delegate": delegate, "checked": False, "reason": "tflfuse.targets not available"}
    try:
        prediction = targets.predict(flatbuffer.from_bytes(data), delegate)
    except (TflfuseError, AttributeError, KeyError, ValueError) as exc:
        return {"delegate": delegate, "checked": False, "reason": str(exc)}
    return {
        "delegate": delegate,
        "checked": True,
        "mapped": prediction.mapped,
        "cpu": prediction.cpu,
        "table": [list(row) for row in prediction.table()],
    }


def write(report: dict[str, Any], folder: Path) -> None:
    folder = Path(folder)
    (folder / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (folder / "report.md").write_text(markdown(report))


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def markdown(r: dict[str, Any]) -> str:
    rec = r["recipe"]
    q = r["quantization"]
    lines = [
        f"# tflfuse conversion: {r['source']}",
        "",
        f"Recipe **{rec['name']}** ({rec['description']}); target `{rec['target']}`, delegate"
        f" `{rec['delegate']}`; quantization `{q['mode']}`, I/O {rec['input_type']} ->"
        f" {rec['output_type']}. TensorFlow {r['versions']['tensorflow']}, ai-edge-quantizer"
        f" {r['versions']['ai_edge_quantizer']}.",
        "",
    ]
    for notice in r.get("notices", []):
        lines.append(f"- notice: {notice}")
    lines += [
        "",
        "## Models",
        "",
        "| model | ops | activation bytes | parameter bytes | file | quantization |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, m in r["models"].items():
        lines.append(
            f"| {name} | {m['op_count']} | {_kib(m['activation_bytes'])} |"
            f" {_kib(m['parameter_bytes'])} | {_kib(m['file_bytes'])} | {m['quantization']} |"
        )
    lines += [
        "",
        "## Agreement with the source model",
        "",
        "| model | max abs error | mean abs error | top-1 agreement |",
        "|---|---:|---:|---:|",
    ]
    for group in ("agreement", "float_agreement"):
        for name, a in r[group].items():
            label = name if group == "agreement" else f"{name} (float, before quantization)"
            if not a.get("verified"):
                lines.append(f"| {label} | not run: {a.get('reason')} | | |")
                continue
            o = a["outputs"][0]
            top1 = f"{o['top1_agreement']:.3f}" if "top1_agreement" in o else "-"
            lines.append(f"| {label} | {a['max_abs']:.3g} | {o['mean_abs']:.3g} | {top1} |")
    g = r["grappler"]
    lines += [
        "",
        "## Grappler",
        "",
        f"Optimizers: {', '.join(g['optimizers'])} (remapper {g['remapper']}). Nodes"
        f" {g['nodes_before']} -> {g['nodes_after']}.",
        "",
    ]
    if g.get("dropped"):
        dropped = g["dropped"]
        lines += [f"Dropped {', '.join(dropped['optimizers'])}: {dropped['reason']}.", ""]
    for op, (b, a) in g["changed_node_types"].items():
        lines.append(f"- {op}: {b} -> {a}")
    rules = r["rules"]
    lines += ["", "## Rules", ""]
    fired = rules.get("fired", {})
    lines.append("Fired: " + (", ".join(f"{k} x{v}" for k, v in fired.items()) or "none"))
    for ref in rules.get("refusals", [])[:30]:
        lines.append(f"- refused {ref.get('rule')} at {ref.get('where')!r}: {ref.get('reason')}")
    lines += [
        "",
        "## Quantization",
        "",
        f"Fused: {q['fused_route']}; unfused: {q['unfused_route']}; stock:"
        f" {q['stock_route']}. Calibration samples: {q['calibration_samples']} (seed"
        f" {q['seed']}).",
    ]
    if q["float_ops_left"]:
        lines.append(f"Ops still in float: {', '.join(sorted(set(q['float_ops_left'])))}.")
    if q["layer_error"]:
        lines += [
            "",
            "Worst per-tensor quantization error (ai-edge-quantizer validator):",
            "",
            "| tensor | kind | metrics |",
            "|---|---|---|",
        ]
        for row in q["layer_error"][:10]:
            metrics = ", ".join(
                f"{k} {v:.3g}"
                for k, v in row.items()
                if k not in ("tensor", "kind") and isinstance(v, float)
            )
            lines.append(f"| {row.get('tensor', '')} | {row.get('kind', '')} | {metrics} |")
    d = r["delegate_check"]
    lines += ["", "## Delegate check", ""]
    if d.get("checked"):
        lines.append(f"{d['delegate']}: {d['mapped']} ops mapped, {d['cpu']} on the CPU.")
    else:
        lines.append(f"{d['delegate']}: not checked ({d.get('reason')}).")
    lines += ["", f"Unfused baseline: {r['unfused_route']}.", ""]
    return "\n".join(lines) + "\n"
