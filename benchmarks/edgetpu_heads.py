#!/usr/bin/env python3
"""Big heads on the Edge TPU: predicted mapping before and after the head rules, and the error.

    .venv/bin/python benchmarks/edgetpu_heads.py            # the compiled pair and the corpus
    .venv/bin/python benchmarks/edgetpu_heads.py --models yolo11n-640.edgetpu-int8

For every int8 YOLO file found (the licensed compiled pair in ../shared/oracle/edgetpu-more, an
Ultralytics YOLOv8n at 640 pixels; the corpus's `*.edgetpu-int8.tflite`, Ultralytics' own Coral
route, `$TFLFUSE_CORPUS`, default ../corpus beside the checkout) it runs the Edge TPU int8
legalization as `tflfuse convert` does on an int8 input
(`tflfuse.convert.rule_sets.legalize_quantized`), once without the head rules (`--disable
ChunkHeadAlongAnchors PadChannelsForMean`: what tflfuse did before) and once with them, and writes
per model:

- ops, predicted mapped in one Edge TPU segment and with `-a` (segments), the ops left on the CPU
  (one segment), and the bytes the Edge TPU hands the CPU (tensors its ops write that CPU ops or
  the model's outputs read: one segment);
- how many of the mapped ops are of a form the predictor asks the evidence about (`forms.gated`)
  that no compiled model shows mapped at its size (`forms.gate`: undecided): mapped by the op
  table, undecided by the evidence (a predictor that asks the gate counts them on the CPU on its
  less favourable reading);
- whether the outputs are bit-identical to the input file's (the rules' declared 0 steps), and
  the error against the float32 file of the same export on the corpus's reference inputs
  (`MODEL.reference_inputs.npy`, NCHW float images, given NHWC, quantized for the int8 file).

With `--convert FILE ...` (float files with a `FILE.calib.npy` beside them, e.g. the corpus's
litert-torch and onnx2tf 2.6 exports) it also runs `tflfuse convert FILE --recipe edgetpu` with
and without the head rules and reads its report: fused and stock predicted mapped, the fused
model with `-a`, and the error of fused and stock against the source float model.

Predictions of the compiler's placement, not device numbers: no timing. Writes
benchmarks/EDGETPU_HEADS.md and benchmarks/out/edgetpu_heads.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tflfuse.convert.rule_sets import legalize_quantized  # noqa: E402
from tflfuse.ir import Model, flatbuffer  # noqa: E402
from tflfuse.targets.edgetpu.forms import form_of, gate, gated  # noqa: E402
from tflfuse.targets.edgetpu.predict import predict_edgetpu  # noqa: E402
from tflfuse.verification import verify  # noqa: E402

CORPUS = Path(os.environ.get("TFLFUSE_CORPUS") or HERE.parent.parent / "corpus")
SHARED = Path(os.environ.get("TFLFUSE_SHARED") or HERE.parent.parent / "shared")
PAIR = (
    SHARED / "oracle" / "edgetpu-more" / "MaxwellHogan__coral_wifi_webserver"
    / "yolov8n_saved_model__yolov8n_full_integer_quant" / "yolov8n_full_integer_quant.tflite"
)  # fmt: skip
HEAD_RULES = ("ChunkHeadAlongAnchors", "PadChannelsForMean")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def placement(model: Model) -> dict[str, Any]:
    """Predicted mapping in one segment and with -a, CPU ops, bytes to the CPU, undecided forms."""
    one = predict_edgetpu(model)
    many = predict_edgetpu(model, multiple_subgraphs=True)
    graph = model.main
    on_tpu = {id(op) for op, p in zip(graph.ops, one.ops, strict=True) if p.runs_on == "edgetpu"}
    crossing = {
        id(t): t.nbytes
        for op in graph.ops
        if id(op) in on_tpu
        for t in op.outputs
        if graph.is_graph_output(t) or any(id(c) not in on_tpu for c in t.consumers)
    }
    verdicts = [gate(op) for op in graph.ops if gated(form_of(op))]
    undecided = Counter(v.form.key for v in verdicts if v.answer == "undecided")
    return {
        "ops": len(graph.ops),
        "mapped": one.mapped,
        "mapped_other": max([one.mapped, *(r.mapped for r in one.other_readings)]),
        "mapped_a": many.mapped,
        "mapped_a_other": max([many.mapped, *(r.mapped for r in many.other_readings)]),
        "segments_a": many.segments,
        "cpu": dict(Counter(p.op for p in one.ops if p.runs_on == "cpu")),
        "bytes_to_cpu": int(sum(crossing.values())),
        "undecided": sum(undecided.values()),
        "undecided_forms": dict(undecided.most_common(5)),
    }


def _run(data: bytes, x: np.ndarray) -> np.ndarray:
    """One float NHWC sample through a model: quantized to its input, its output dequantized."""
    from tflfuse.device.interpreter import make_interpreter

    interpreter = make_interpreter(data, delegate="none")
    [inp], out = interpreter.get_input_details(), interpreter.get_output_details()[0]
    s, z = inp["quantization"]
    if s:
        info = np.iinfo(inp["dtype"])
        x = np.clip(np.round(x / s + z), info.min, info.max)
    interpreter.set_tensor(inp["index"], x.astype(inp["dtype"]))
    interpreter.invoke()
    y = interpreter.get_tensor(out["index"]).astype(np.float32)
    s, z = out["quantization"]
    return (y - z) * s if s else y


def float_error(path: Path, data: bytes) -> dict[str, float] | None:
    """Max and mean |output - the float model's| on the corpus's reference inputs: the float32
    file of the same export (`X.edgetpu-float32.tflite` beside `X.edgetpu-int8.tflite`), else
    the PyTorch model's output; None without reference inputs."""
    stem = path.name.split(".")[0]
    inputs = path.parent / f"{stem}.reference_inputs.npy"
    sibling = path.parent / path.name.replace("edgetpu-int8", "edgetpu-float32")
    if not inputs.is_file() or not sibling.is_file():
        return None
    floats = sibling.read_bytes()
    errors = []
    for x in np.load(inputs):
        x = np.transpose(x, (1, 2, 0))[None]
        errors.append(np.abs(_run(data, x) - _run(floats, x)))
    return {"max": float(max(e.max() for e in errors)), "mean": float(np.mean(errors))}


def run_one(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    row: dict[str, Any] = {"model": path.name, "input": placement(flatbuffer.from_bytes(data))}
    for name, disabled in (("before", HEAD_RULES), ("after", ())):
        model = flatbuffer.from_bytes(data)
        started = time.perf_counter()
        result = legalize_quantized(model, disabled=disabled)
        seconds = time.perf_counter() - started
        out = flatbuffer.to_bytes(model)
        agreement = verify.compare(data, out, runs=2, int_atol=0)
        row[name] = {
            **placement(model),
            "fired": result.fired(),
            "seconds": round(seconds, 2),
            "identical": bool(agreement.identical),
            "error_vs_float": float_error(path, out),
        }
        log(f"{path.name} {name}: {row[name]['mapped']}/{row[name]['ops']}, {result.fired()}")
    return row


def convert_one(path: Path, scratch: Path) -> dict[str, Any]:
    """`tflfuse convert` with and without the head rules: mapping and error from its report."""
    import subprocess

    row: dict[str, Any] = {"model": path.name}
    calib = path.with_suffix(".calib.npy")
    scratch.mkdir(parents=True, exist_ok=True)
    for name, disabled in (("before", HEAD_RULES), ("after", ())):
        out = scratch / f"{path.stem}.{name}"
        cmd = [sys.executable, "-m", "tflfuse.cli", "convert", str(path), "--recipe", "edgetpu",
               "--calib", str(calib), "-o", str(out), "--force"]  # fmt: skip
        for rule in disabled:
            cmd += ["--disable", rule]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
        report = json.loads((out / "report.json").read_text())
        fused = flatbuffer.load(out / "model.tflite")
        row[name] = {
            "ops": report["edgetpu"]["fused"]["ops"],
            "mapped": report["edgetpu"]["fused"]["mapped"],
            "mapped_a": predict_edgetpu(fused, multiple_subgraphs=True).mapped,
            "stock": f"{report['edgetpu']['stock']['mapped']}/{report['edgetpu']['stock']['ops']}",
            "fired": report["legalization"]["fired"],
            "error": report["agreement"]["fused"]["max_abs"],
            "stock_error": report["agreement"]["stock"]["max_abs"],
        }
        log(f"{path.name} {name}: {row[name]['mapped']}/{row[name]['ops']}")
    return row


def render_converted(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "`tflfuse convert FILE --recipe edgetpu` on float files (before: `--disable` the head"
        " rules), predicted mapped, and the max |error| against the source float model:",
        "",
        "| model | stock mapped | fused mapped before -> after | fused -a before -> after |"
        " error fused before -> after | error stock | int8 legalization fired (after) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, a = r["before"], r["after"]
        lines.append(
            f"| {r['model']} | {a['stock']} | {b['mapped']}/{b['ops']} -> {a['mapped']}/{a['ops']}"
            f" | {b['mapped_a']} -> {a['mapped_a']} | {b['error']:.3g} -> {a['error']:.3g}"
            f" | {a['stock_error']:.3g} | {a['fired']} |"
        )
    return lines


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Big heads on the Edge TPU (benchmarks/edgetpu_heads.py)",
        "",
        "Predicted placement (tflfuse's predictor, compiler 16) of each int8 file after the Edge"
        " TPU int8 legalization without the head rules (before) and with them (after). `-a`:"
        " the compiler's multiple-subgraph mode. In brackets: the other reading (every op of a"
        " form no compiled model shows mapped at its size mapped; the prediction counts them"
        " on the CPU). Bytes to the CPU: what the one segment hands"
        " the CPU. Undecided: mapped ops of a gated form no compiled model shows mapped at their"
        " size (forms evidence).",
        "",
        "| model | ops before -> after | one segment before -> after | -a (segments) before ->"
        " after | CPU ops after | bytes to CPU before -> after | undecided after | identical |"
        " error vs float32 (max / mean) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, a = r["before"], r["after"]
        err = a["error_vs_float"]
        lines.append(
            f"| {r['model']} | {b['ops']} -> {a['ops']}"
            f" | {b['mapped']} [{b['mapped_other']}] -> {a['mapped']} [{a['mapped_other']}]"
            f" | {b['mapped_a']} [{b['mapped_a_other']}] ({b['segments_a']}) ->"
            f" {a['mapped_a']} [{a['mapped_a_other']}] ({a['segments_a']})"
            f" | {', '.join(f'{k} x{v}' for k, v in a['cpu'].items()) or '-'}"
            f" | {b['bytes_to_cpu']} -> {a['bytes_to_cpu']} | {a['undecided']}"
            f" | {'yes' if a['identical'] and b['identical'] else 'NO'}"
            f" | {'-' if err is None else '{:.3g} / {:.3g}'.format(err['max'], err['mean'])} |"
        )
    lines += ["", "Rules fired (after):", ""]
    lines += [f"- {r['model']}: {r['after']['fired']}" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="file stems to keep (default: all found)")
    parser.add_argument("--convert", nargs="*", default=[], type=Path, help="float files")
    args = parser.parse_args(argv)
    paths = [PAIR] if PAIR.is_file() else []
    paths += sorted(CORPUS.glob("*.edgetpu-int8.tflite"))
    if args.models:
        paths = [p for p in paths if any(p.name.startswith(m) for m in args.models)]
    rows = [run_one(p) for p in paths]
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    converted = [convert_one(p.resolve(), out / "edgetpu_heads") for p in args.convert]
    (out / "edgetpu_heads.json").write_text(json.dumps({"int8": rows, "convert": converted}))
    text = render(rows) + ("\n".join(render_converted(converted)) + "\n" if converted else "")
    (HERE / "EDGETPU_HEADS.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
