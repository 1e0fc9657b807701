#!/usr/bin/env python3
"""`tflfuse optimize` on int8 models no one here built: optimized vs original, per runtime.

    python benchmarks/int8_rules_bench.py               # writes benchmarks/INT8.md (~3 min)
    python benchmarks/int8_rules_bench.py --runs 100

Models: the CPU (not `_edgetpu`) .tflite files of ../shared/oracle/edgetpu and
../shared/oracle/edgetpu-more (Coral's zoo and public Coral projects, quantized by their
authors) and the int8 streaming models inside the pymicro-wakeword wheel; then, in a section
of their own, the TFLite converter's full-int8 output of the zoo architectures (built here,
quantized by the stock converter; needs TensorFlow, `--no-zoo` skips them). For each model and
runtime, the model is optimized for the target that runtime stands for (XNNPACK: `--target
xnnpack`; plain kernels: `--target cpu`), verified by `optimize`, and timed interleaved with
the original (one thread). A model where no rule fired is the same graph: reported, not timed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tflfuse.convert.optimize import optimize_bytes  # noqa: E402
from tflfuse.device.bench import run_benchmark  # noqa: E402
from tflfuse.device.interpreter import interpreter_package  # noqa: E402
from tflfuse.errors import TflfuseError  # noqa: E402
from tflfuse.ir import flatbuffer  # noqa: E402

ORACLE = ROOT.parent / "shared" / "oracle"
RUNTIMES = {"xnnpack": "xnnpack", "none": "cpu"}  # runtime -> the target optimized for
MIN_SECONDS, MAX_RUNS = 1.0, 5000
ZOO = "zoo stock int8/"
MAX_SECONDS, MIN_RUNS = 120.0, 50


def models() -> list[tuple[str, Path]]:
    """(label, path): oracle CPU models, then the pymicro-wakeword models."""
    found = []
    for folder in ("edgetpu", "edgetpu-more"):
        for path in sorted((ORACLE / folder).rglob("*.tflite")):
            if "_edgetpu" not in path.name:
                found.append((f"{folder}/{path.name}", path))
    try:
        files = importlib.metadata.files("pymicro-wakeword") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in sorted(files, key=str):
        if str(f).endswith(".tflite"):
            found.append((f"pymicro-wakeword/{Path(str(f)).name}", Path(f.locate())))
    return found


def zoo_stock_models(folder: Path) -> list[tuple[str, Path]]:
    """The TFLite converter's own full-int8 output (int8 I/O) of each zoo architecture: what
    a user who quantized with the stock converter hands to `tflfuse optimize`. Needs
    TensorFlow; the architectures are built here, the quantization is the converter's."""
    from tflfuse.examples import zoo

    found = []
    for name in zoo.BUILDERS:
        model = zoo.build(name)
        calib = zoo.sample_inputs(tuple(model.input_shape[1:]), n=32, seed=7)
        path = folder / f"{name}_stock_int8.tflite"
        path.write_bytes(zoo.to_tflite(model, int8=True, calibration=calib, io_type="int8"))
        found.append((f"{ZOO}{name}", path))
    return found


def measure(label: str, path: Path, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"model": label, "runtimes": {}}
    data = path.read_bytes()
    try:
        row["ops"] = sum(len(g.ops) for g in flatbuffer.from_bytes(data, str(path)).subgraphs)
    except TflfuseError as exc:
        row["skipped"] = f"does not load: {exc}"
        return row
    for runtime, target in RUNTIMES.items():
        entry: dict[str, Any] = {"target": target}
        row["runtimes"][runtime] = entry
        try:
            result = optimize_bytes(data, level=2, target=target, source=str(path))
        except TflfuseError as exc:
            entry["error"] = str(exc)
            continue
        entry["fired"] = result.result.fired()
        entry["ops_after"] = result.after["op_count"]
        entry["verified"] = result.verification.get("verified", False)
        entry["max_abs"] = result.verification.get("max_abs")
        if not result.result.events:
            continue
        out = tmp / f"{path.stem}_{target}.tflite"
        out.write_bytes(result.data)
        pair, names = [path, out], ["original", "optimized"]
        pilot = run_benchmark(pair, delegate=runtime, runs=20, warmup=2, threads=1, names=names,
                              progress=False)  # fmt: skip
        slowest = max(m["latency_ms"]["p50"] for m in pilot["models"]) / 1000
        # tiny models (a few microseconds) get more rounds: at least ~MIN_SECONDS of timing each
        runs = int(min(max(args.runs, MIN_SECONDS / max(slowest, 1e-6)), MAX_RUNS))
        # ...and huge ones (yolov8n at 640 px on the plain kernels) fewer: MAX_SECONDS per pair
        runs = max(min(runs, int(MAX_SECONDS / (2 * max(slowest, 1e-6)))), MIN_RUNS)
        entry["runs"] = runs
        bench = run_benchmark(pair, delegate=runtime, runs=runs, warmup=args.warmup, threads=1,
                              names=names, progress=False)  # fmt: skip
        p50 = {m["name"]: m["latency_ms"]["p50"] for m in bench["models"]}
        entry["p50_ms"] = p50
        entry["ratio"] = p50["optimized"] / p50["original"]
    return row


def _section(rows: list[dict[str, Any]], what: str) -> list[str]:
    """Computed findings and the per-model table for a group of models."""
    timed = [
        (r["model"], rt, e["ratio"])
        for r in rows
        for rt, e in r.get("runtimes", {}).items()
        if "ratio" in e
    ]
    wins = [f"{m} on {rt} ({v:.2f})" for m, rt, v in timed if v <= 0.95]
    worst = max(timed, key=lambda t: t[2]) if timed else None
    lines = [
        f"### Findings ({what}, computed)",
        "",
        f"- Models measured: {sum(1 for r in rows if 'skipped' not in r)};"
        f" a rule fired on {len({m for m, _, _ in timed})} of them.",
        f"- Worst optimized/original: {worst[2]:.2f} ({worst[0]} on {worst[1]})."
        if worst
        else "- Nothing was timed.",
        f"- At least 5% faster: {'; '.join(wins) or 'none'}.",
        "",
        "| model | ops | XNNPACK ratio | XNNPACK rules | none ratio | none rules | max error"
        " | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r:
            continue
        cells = []
        errors = []
        for rt in RUNTIMES:
            e = r["runtimes"].get(rt, {})
            if "error" in e:
                cells += ["error", e["error"]]
                continue
            ratio = f"{e['ratio']:.2f}" if "ratio" in e else "-"
            fired = ", ".join(f"{k} {v}" for k, v in e.get("fired", {}).items()) or "-"
            cells += [ratio, fired]
            if e.get("max_abs") is not None and e.get("fired"):
                errors.append(f"{e['max_abs']:.3g}")
        err = " / ".join(errors) or "-"
        runs = " / ".join(str(r["runtimes"][rt].get("runs", "-")) for rt in RUNTIMES)
        row = f"| {r['model']} | {r['ops']} | " + " | ".join(cells)
        lines.append(f"{row} | {err} | {runs} |")
    return lines


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# int8 rules on models quantized elsewhere",
        "",
        f"Regenerate: `{meta['command']}` ({meta['minutes']:.1f} min here). Machine:"
        f" {meta['machine']}, {meta['cpu_count']} cores, {meta['interpreter']}, Python"
        f" {meta['python']}. One thread; at least {meta['runs']} timed runs (more for"
        f" fast models: {MIN_SECONDS:.0f} s of timing each, up to {MAX_RUNS}; fewer, down to"
        f" {MIN_RUNS}, where one pair would take over {MAX_SECONDS:.0f} s) after"
        f" {meta['warmup']} warm-up, original and optimized interleaved; p50 optimized /"
        " original (< 1: faster)."
        " XNNPACK runs the model optimized with `--target xnnpack`, the plain kernels (`none`)"
        " the one optimized with `--target cpu`. `-`: no rule fired, the same graph (not timed).",
        "",
    ]
    zoo_rows = [r for r in rows if r["model"].startswith(ZOO)]
    lines += ["## Models quantized elsewhere", ""]
    lines += _section([r for r in rows if r not in zoo_rows], "models quantized elsewhere")
    if zoo_rows:
        lines += [
            "",
            "## The stock converter's int8 zoo models",
            "",
            "The zoo architectures, built here but quantized by the TFLite converter (full int8,"
            " int8 I/O): what a user of the stock converter hands to `tflfuse optimize`.",
            "",
            *_section(zoo_rows, "zoo stock int8 models"),
        ]
    lines += [
        "",
        "## The int8 rules",
        "",
        "Rules that run on int8 graphs (`quantized_ok`), with the quantization steps one"
        " application may add (`int8_error_steps`):",
        "",
        "| rule | steps | what | where it runs |",
        "|---|---|---|---|",
        "| FoldPadIntoConv | 0 | PAD of zero points (real 0) into a conv's SAME border | all |",
        "| DropReshapeBeforeFullyConnected | 0 | the FC flattens its input itself | CPU targets |",
        "| MeanKeepDims | 1 | global pool with keep_dims=True + RESHAPE: the plain int8"
        " kernels' fast path | `cpu` (cost table) |",
        "| MeanLastAxisAsRows | 1 | LayerNorm's mean over the last axis as a pool of rows |"
        " `cpu` (cost table) |",
        "| SpellOutInt8HardSwish | 3 | int8 HARD_SWISH as ADD (RELU6), MUL, MUL, which XNNPACK"
        " delegates (it does not take int8 HARD_SWISH) | `xnnpack` (cost table) |",
        "| CancelTransposePair, CollapseReshapeChain, CancelQuantizeDequantize,"
        " HoistLayoutAboveSplit | 0 | data movement only | all |",
        "",
        "The float-only rules that recompute weights (affine folding, chain merges) have no"
        " exact int8 form: the new weights need new scales and the result one more"
        " requantization; they stay float-only (convert applies them before quantizing).",
    ]
    skipped = [r for r in rows if "skipped" in r]
    if skipped:
        lines += ["", "## Not measured", ""]
        lines += [f"- {r['model']}: {r['skipped']}" for r in skipped]
    lines += [
        "",
        "max error: the largest output difference `optimize`'s verification found (quantized"
        " outputs in quantization steps), XNNPACK target / cpu target.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--out", default=str(HERE / "INT8.md"))
    p.add_argument("--no-zoo", action="store_true", help="skip the zoo's stock int8 models")
    p.add_argument("--render-only", action="store_true", help="rewrite OUT from out/int8.json")
    args = p.parse_args(argv)
    if args.render_only:
        saved = json.loads((HERE / "out" / "int8.json").read_text())
        Path(args.out).write_text(markdown(saved["rows"], saved["meta"]))
        return 0
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        found = models()
        if not args.no_zoo:
            found += zoo_stock_models(Path(tmp))
        for label, path in found:
            print(f"[{time.strftime('%H:%M:%S')}] {label}", file=sys.stderr, flush=True)
            rows.append(measure(label, path, args, Path(tmp)))
    meta = {
        "command": "python benchmarks/int8_rules_bench.py",
        "minutes": (time.perf_counter() - started) / 60,
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "interpreter": interpreter_package(),
        "python": platform.python_version(),
        "runs": args.runs,
        "warmup": args.warmup,
    }
    Path(args.out).write_text(markdown(rows, meta))
    raw = HERE / "out"
    raw.mkdir(exist_ok=True)
    (raw / "int8.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
