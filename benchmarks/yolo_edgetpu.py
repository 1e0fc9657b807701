#!/usr/bin/env python3
"""Attention models and YOLO heads on the Edge TPU: the user's route, stock and tflfuse, predicted.

    /work/main/.venv/bin/python benchmarks/yolo_edgetpu.py [--corpus /work/corpus]
        [--only yolo26n-640 deit_tiny_patch16_224.litert ...] [--eval 8] [--cached]

(`--cached` renders the rows earlier runs left in `--out` without measuring: several runs on
disjoint `--only` sets, then one `--cached` run, give the whole table.)

Reads the corpus `benchmarks/attention_corpus.py` builds (default `/work/corpus`, or
`$TFLFUSE_CORPUS`; every `X.tflite` with its `X.json` and `X.calib.npy`; nothing copied here) and,
for every float export in it (model x size x route):

  user's int8  the route's own int8 file, where the route makes one: Ultralytics'
               `format="edgetpu"` leaves onnx2tf 1.28's `*_full_integer_quant.tflite`
               (`X.edgetpu-int8.tflite`); onnx2tf 2.6's `-oiqt` (`X.onnx2tf26-int8.tflite`).
               litert-torch makes none: a user quantizes with litert-quantizer, which is stock.
  stock        litert-quantizer's static int8 of the float export (what `convert` writes as
               `model_stock.tflite`), calibrated on the same data as tflfuse.
  tflfuse      `python -m tflfuse.cli convert X.tflite --recipe edgetpu --calib X.calib.npy`, run
               as a child process: wall seconds and peak RSS (wait4, the child and every process
               it waited for) are measured on it.

For each of the three: the Edge TPU mapping predicted by tflfuse's predictor (compiler 16) in one
Edge TPU subgraph and with `-a` (several subgraphs: segments, and the tensors and bytes that cross
between the CPU and the Edge TPU), and the largest |error| of its outputs against the float export
on `--eval` image-like inputs that calibration never saw (seed 99; int I/O quantized and
dequantized with the model's own parameters), with that error over the float output's largest
magnitude and the cosine. Writes benchmarks/YOLO_EDGETPU.md and the rows to
benchmarks/out/yolo_edgetpu.json. Predictions, not compiler or device numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import corpus_build  # noqa: E402  (image-like inputs)

from tflfuse.ir import flatbuffer  # noqa: E402
from tflfuse.targets import predict_edgetpu  # noqa: E402

CORPUS = Path(os.environ.get("TFLFUSE_CORPUS") or "/work/corpus")
FLOAT_ROUTES = {  # float file's route -> (route shown, the user's int8 file's route or None)
    "edgetpu-float32": ("Ultralytics format=edgetpu (onnx2tf 1.28)", "edgetpu-int8"),
    "litert": ("litert-torch", None),
    "onnx2tf26": ("onnx2tf 2.6", "onnx2tf26-int8"),
}
LIMITS = {"yolo26n-640": (90.0, 2 * 1024**3)}  # issue 25: seconds and bytes, tflfuse convert


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- placement


def crossings(graph: Any, mapped: list[bool]) -> tuple[int, int]:
    """Tensors that move between the CPU and the Edge TPU (graph inputs read on the Edge TPU and
    outputs written there count: they cross the host link too), and their bytes."""
    side = {}
    for op, m in zip(graph.ops, mapped):
        for t in op.outputs:
            side[id(t)] = m
    count = nbytes = 0
    for t in graph.tensors:
        if t.is_constant:
            continue
        made_on = side.get(id(t), False)  # graph inputs come from the host
        readers = {m for op, m in zip(graph.ops, mapped) if t in op.inputs}
        if t in graph.outputs:
            readers.add(False)
        if any(r != made_on for r in readers):
            count += 1
            nbytes += t.nbytes
    return count, nbytes


def placement(path: Path) -> dict[str, Any]:
    """One-segment and `-a` predictions of `path`: mapped counts, other readings, the first
    refusals, the segments and crossings."""
    model = flatbuffer.load(path)
    one = predict_edgetpu(model)
    many = predict_edgetpu(model, multiple_subgraphs=True)
    cpu = [o for o in one.ops if o.target == "cpu"]
    roots = [o for o in cpu if not o.reason.startswith("after the cut")]
    cross1 = crossings(model.main, [o.target != "cpu" for o in one.ops])
    cross_a = crossings(model.main, [o.target != "cpu" for o in many.ops])
    return {
        "total": len(one.ops),
        "mapped": one.mapped,
        "other_readings": [r.to_dict() for r in one.other_readings],
        "crossings": cross1,
        "mapped_a": many.mapped,
        "segments_a": many.segments,
        "crossings_a": cross_a,
        "cpu_types": dict(Counter(o.op for o in cpu)),
        "refused": [f"op {o.index} {o.op}: {o.reason}" for o in roots],
        "refused_a": dict(Counter(o.op for o in many.ops if o.target == "cpu")),
    }


# ---------------------------------------------------------------- error against the float model


def run_model(path: Path, xs: np.ndarray) -> list[list[np.ndarray]]:
    """Float outputs of `path` on each sample (int I/O quantized / dequantized with the model's
    parameters), in output-index order."""
    from tflfuse.runtime.interpreter import make_interpreter

    it = make_interpreter(path.read_bytes(), delegate="none")
    it.allocate_tensors()
    inp = it.get_input_details()[0]
    outs = sorted(it.get_output_details(), key=lambda d: d["index"])
    results = []
    for x in xs:
        x = x[None]
        if inp["dtype"] != np.float32:
            scale, zero = inp["quantization"]
            info = np.iinfo(inp["dtype"])
            x = np.clip(np.round(x / scale + zero), info.min, info.max)
        it.set_tensor(inp["index"], x.astype(inp["dtype"]))
        it.invoke()
        row = []
        for o in outs:
            y = it.get_tensor(o["index"]).astype(np.float64)
            if o["dtype"] != np.float32:
                scale, zero = o["quantization"]
                y = (y - zero) * scale
            row.append(y)
        results.append(row)
    return results


def errors(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> dict[str, Any]:
    """Worst |got - ref| over samples and outputs (outputs paired by shape, in order), that over
    the reference's largest magnitude, and the worst cosine."""
    worst = rel = 0.0
    cos = 1.0
    for r_row, g_row in zip(ref, got):
        left = list(g_row)
        for r in r_row:
            g = next((y for y in left if y.shape == r.shape), None)
            if g is None:
                return {"error": f"no output of shape {list(r.shape)}"}
            left.remove(g)
            d = float(np.abs(g - r).max())
            worst = max(worst, d)
            rel = max(rel, d / max(float(np.abs(r).max()), 1e-12))
            denom = float(np.linalg.norm(r) * np.linalg.norm(g))
            cos = min(cos, float((r * g).sum()) / denom if denom else 1.0)
    return {"max_abs": worst, "rel": rel, "cosine": cos}


def eval_inputs(info: dict[str, Any], n: int) -> np.ndarray:
    """`n` image-like samples (seed 99, never calibration's) in the model's input layout."""
    shape = info["input_shape"]
    kind = "unit" if info["architecture"].startswith("yolo") else "imagenet"
    c_last = info.get("input_layout") == "NHWC"
    nchw = (1, shape[3], shape[1], shape[2]) if c_last else tuple(shape)
    xs = corpus_build.varied_input(nchw, n, 99, kind)
    return corpus_build.to_model_layout(xs, shape).astype(np.float32)


# ---------------------------------------------------------------- one float export


def convert_child(src: Path, calib: Path, out: Path) -> tuple[float, int, int, str]:
    """`tflfuse convert` in a child: (seconds, peak RSS bytes, exit code, last stderr line)."""
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "tflfuse.cli", "convert", str(src), "--recipe", "edgetpu"]
    cmd += ["--calib", str(calib), "-o", str(out)]
    t0 = time.perf_counter()
    errf = out.parent / f"{out.name}.stderr"
    with errf.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [ln for ln in errf.read_text().splitlines() if ln.strip()]
    return seconds, int(usage.ru_maxrss) * 1024, proc.returncode, (lines or [""])[-1][:600]


def measure(side: Path, out_root: Path, n_eval: int) -> dict[str, Any]:
    info = json.loads(side.read_text())
    src = side.with_suffix(".tflite")
    route, user_route = FLOAT_ROUTES[info["route"]]
    row: dict[str, Any] = {"model": info["model"], "route": route, "file": src.name}
    row["input"] = f"{info['input_shape']} {info.get('input_layout', '')}"
    xs = eval_inputs(info, n_eval)
    ref = run_model(src, xs)
    user = src.with_name(f"{info['model']}.{user_route}.tflite") if user_route else None
    models: dict[str, Path] = {}
    if user is not None and user.is_file():
        models["user"] = user
    elif user_route:
        row["user_missing"] = json.loads(side.read_text()).get("user_int8") or "not made"
    out = out_root / src.stem
    log(f"{src.name}: convert --recipe edgetpu")
    seconds, rss, code, last = convert_child(src, side.with_suffix(".calib.npy"), out)
    row.update(convert_s=round(seconds, 1), peak_rss_mib=round(rss / 2**20))
    if code != 0:
        row["convert_error"] = last
    else:
        models["stock"], models["fused"] = out / "model_stock.tflite", out / "model.tflite"
        report = json.loads((out / "report.json").read_text())
        rules = report.get("rules", {}).get("fired", {})
        leg = report.get("legalization", {}).get("fired", {})
        row["rules"] = dict(Counter(rules) + Counter(leg))
    for who, path in models.items():
        if not path.is_file():
            continue
        row[who] = placement(path)
        try:
            row[who]["error"] = errors(ref, run_model(path, xs))
        except Exception as exc:  # a model the interpreter cannot run: a finding
            row[who]["error"] = {"error": str(exc).splitlines()[0][:200]}
    return row


# ---------------------------------------------------------------- the markdown


def _cell(p: dict[str, Any] | None) -> str:
    if not p:
        return "-"
    others = "".join(f" (or {r['mapped']})" for r in p["other_readings"])
    return f"{p['mapped']}/{p['total']}{others}"


def _cell_a(p: dict[str, Any] | None) -> str:
    if not p:
        return "-"
    n, nbytes = p["crossings_a"]
    return f"{p['mapped_a']}/{p['total']} in {p['segments_a']}, {n} x {nbytes / 1024:.0f} KiB"


def _err(p: dict[str, Any] | None) -> str:
    if not p:
        return "-"
    e = p.get("error", {})
    if "error" in e:
        return f"fails: {e['error'][:60]}"
    return f"{e['max_abs']:.3g} ({e['rel']:.1%}, cos {e['cosine']:.3f})"


def _short(refusal: str) -> str:
    """A refusal whose long tensor names are cut to 40 characters and an ellipsis."""
    return re.sub(r"'([^']{40})[^']{8,}'", r"'\1...'", refusal)


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Attention models and YOLO heads on the Edge TPU (predicted)",
        "",
        f"Generated by `{meta['command']}` in {meta['minutes']:.1f} min on {meta['corpus']}"
        " (built by `benchmarks/attention_corpus.py`: random weights, BatchNorm averaged over"
        " image-like inputs). Predicted by tflfuse's Edge TPU predictor (compiler 16); not run"
        " on a compiler or a device. Routes and columns: this script's docstring.",
        "",
        "Mapped, one segment: ops predicted on the Edge TPU in one Edge TPU subgraph (`(or N)`:"
        " the other reading where the evidence cannot decide). `-a`: mapped with several"
        " subgraphs, in how many segments, the tensors x bytes crossing CPU <-> Edge TPU per"
        " inference. Error: largest |output - float export| on image-like inputs calibration"
        " never saw (over the float output's largest magnitude; worst cosine).",
        "",
        "| model | route | mapped: user's int8 | stock | tflfuse | -a: user's | -a: stock |"
        " -a: tflfuse | error: user's | stock | tflfuse | convert s / MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        failed = r.get("convert_error", "").removeprefix("tflfuse: error: ")
        note = f" (convert refused: {failed[:90]}...; below)" if failed else ""
        u, s, f = r.get("user"), r.get("stock"), r.get("fused")
        lines.append(
            f"| {r['model']} | {r['route']} | {_cell(u)} | {_cell(s)} | {_cell(f)} |"
            f" {_cell_a(u)} | {_cell_a(s)} | {_cell_a(f)} | {_err(u)} | {_err(s)} | {_err(f)} |"
            f" {r.get('convert_s', '-')} / {r.get('peak_rss_mib', '-')}{note} |"
        )
    lines += ["", "## Where each is cut (one segment)", ""]
    for r in rows:
        lines.append(f"- {r['model']} / {r['route']} ({r['file']}, input {r['input']}):")
        if r.get("convert_error"):
            lines.append(f"  - convert: {r['convert_error']}")
        if r.get("user_missing"):
            lines.append(f"  - user's int8: none ({r['user_missing']})")
        for who, label in (("user", "user's int8"), ("stock", "stock"), ("fused", "tflfuse")):
            p = r.get(who)
            if p:
                cut = "; ".join(_short(x) for x in p["refused"][:3]) or "nothing refused"
                lines.append(f"  - {label}: {cut}")
        if r.get("rules"):
            lines.append(
                "  - rules: " + ", ".join(f"{k} x{v}" for k, v in sorted(r["rules"].items()))
            )
    over = [
        f"- {r['model']} / {r['route']}: {r.get('convert_s')} s, {r.get('peak_rss_mib')} MiB"
        f" (limit {lim[0]:.0f} s, {lim[1] / 2**30:.0f} GiB)"
        for r in rows
        for name, lim in LIMITS.items()
        if r["model"] == name and "convert_s" in r
    ]
    if over:
        lines += ["", "## Convert time and memory (issue 25's limits)", "", *over]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--only", nargs="*", help="models (or files' stems) to measure")
    parser.add_argument("--eval", type=int, default=8, help="image-like inputs for the errors")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "yolo_edgetpu")
    parser.add_argument("--md", type=Path, default=HERE / "YOLO_EDGETPU.md")
    parser.add_argument(
        "--cached",
        action="store_true",
        help="reuse the rows earlier runs left in --out (ROW.row.json) instead of measuring again",
    )
    args = parser.parse_args(argv)
    if not args.corpus.is_dir():
        print(f"no corpus at {args.corpus} (build it: benchmarks/attention_corpus.py)")
        return 1
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for side in sorted(args.corpus.glob("*.json")):
        info = json.loads(side.read_text())
        if info.get("route") not in FLOAT_ROUTES or not side.with_suffix(".tflite").is_file():
            continue
        if args.only and not {info["model"], side.stem} & set(args.only):
            continue
        cached = args.out / f"{side.stem}.row.json"
        if args.cached and cached.is_file():
            rows.append(json.loads(cached.read_text()))
            continue
        if args.cached:  # render only: a file no run measured yet is left out
            continue
        try:
            rows.append(measure(side, args.out, args.eval))
            cached.write_text(json.dumps(rows[-1], indent=1) + "\n")
        except Exception as exc:  # a failure is a row, not a crash
            error = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(
                {"model": info["model"], "route": info["route"], "file": side.name}
                | {"input": "", "convert_error": error}
            )
            log(f"{side.stem}: {exc}")
    meta = {
        "command": "python benchmarks/yolo_edgetpu.py " + " ".join(argv or sys.argv[1:]),
        "minutes": (time.perf_counter() - started) / 60,
        "corpus": str(args.corpus),
    }
    (args.out.parent / "yolo_edgetpu.json").write_text(json.dumps(rows, indent=1) + "\n")
    args.md.write_text(render(rows, meta))
    print(f"{len(rows)} rows -> {args.md} in {meta['minutes']:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
