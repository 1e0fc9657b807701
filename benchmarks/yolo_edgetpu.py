#!/usr/bin/env python3
"""Attention models and YOLO heads on the Edge TPU: the user's route, stock and tflfuse, predicted.

    /work/main/.venv/bin/python benchmarks/yolo_edgetpu.py [--corpus /work/corpus] [--jobs 2]
        [--only yolo26n-640 deit_tiny_patch16_224.litert ...] [--eval 8] [--fresh | --cached]

Each float export is measured in a child process (`--jobs` at once, each killed after
`--timeout` seconds), which leaves `--out`/STEM.row.json and STEM.log; progress goes to stderr.
A row is reused when it was measured on the same inputs: the float export, its calibration
data, the user's int8 file, the tflfuse package's files (sha256 of each) and the eval count
(`--fresh` measures anyway, e.g. after a change to what this script measures; `--cached`
renders whatever rows `--out` holds, without measuring). Each model's placement (keyed by its
bytes and the package's files) and error (by its bytes, the float export's and the eval count)
are cached on their own too: a predictor change re-predicts the user's and stock models but
reuses their errors when their bytes did not change. An interrupted run resumes where it stopped.

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
               it waited for) are measured on it. A convert refused as useless
               (`tflfuse.convert.usefulness`) is run again with `--accept-accuracy-loss`; the
               model it keeps is measured on its own row, `tflfuse, --accept-accuracy-loss`.

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
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
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
    cpu = [o for o in one.ops if o.runs_on == "cpu"]
    roots = [o for o in cpu if not o.reason.startswith("after the cut")]
    cross1 = crossings(model.main, [o.runs_on != "cpu" for o in one.ops])
    cross_a = crossings(model.main, [o.runs_on != "cpu" for o in many.ops])
    return {
        "total": len(one.ops),
        "mapped": one.mapped,
        "other_readings": [r.to_dict() for r in one.other_readings],
        "crossings": cross1,
        "mapped_a": many.mapped,
        "segments_a": many.segments,
        "other_readings_a": [r.to_dict() for r in many.other_readings],
        "crossings_a": cross_a,
        "cpu_types": dict(Counter(o.op for o in cpu)),
        "refused": [f"op {o.index} {o.op}: {o.reason}" for o in roots],
        "refused_a": dict(Counter(o.op for o in many.ops if o.runs_on == "cpu")),
        # parameters of the mapped ops in one segment, and those streamed on every inference
        "parameter_bytes": (one.memory or {}).get("parameter_bytes"),
        "streamed_bytes": (one.memory or {}).get("off_chip_bytes"),
    }


# ---------------------------------------------------------------- error against the float model


def as_input(x: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    """`x` (float, batch first) in the input's type: quantized at its scale and zero point."""
    if detail["dtype"] != np.float32:
        scale, zero = detail["quantization"]
        info = np.iinfo(detail["dtype"])
        x = np.clip(np.round(x / scale + zero), info.min, info.max)
    return x.astype(detail["dtype"])


def run_model(path: Path, xs: np.ndarray) -> list[list[np.ndarray]]:
    """Float outputs of `path` on each sample (int I/O quantized / dequantized with the model's
    parameters), in output-index order."""
    from tflfuse.device.interpreter import make_interpreter

    it = make_interpreter(path.read_bytes(), delegate="none")
    it.allocate_tensors()
    inp = it.get_input_details()[0]
    outs = sorted(it.get_output_details(), key=lambda d: d["index"])
    results = []
    for x in xs:
        it.set_tensor(inp["index"], as_input(x[None], inp))
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
            at = next((i for i, y in enumerate(left) if y.shape == r.shape), None)
            if at is None:
                return {"error": f"no output of shape {list(r.shape)}"}
            g = left.pop(at)  # by position: list.remove would compare arrays elementwise
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


def convert_child(
    src: Path, calib: Path, out: Path, extra: tuple[str, ...] = ()
) -> tuple[float, int, int, str]:
    """`tflfuse convert` in a child (`extra`: more arguments): (seconds, peak RSS bytes, exit
    code, last stderr line)."""
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "tflfuse.cli", "convert", str(src), "--recipe", "edgetpu"]
    cmd += ["--calib", str(calib), "-o", str(out), *extra]
    t0 = time.perf_counter()
    errf = out.parent / f"{out.name}.stderr"
    with errf.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [ln for ln in errf.read_text().splitlines() if ln.strip()]
    return seconds, int(usage.ru_maxrss) * 1024, proc.returncode, (lines or [""])[-1][:600]


def column(who: str, path: Path, ref: list, xs: np.ndarray, keys: dict[str, Any]) -> dict:
    """One model's placement and error, each from the cache when measured before on the same
    inputs (`cache/`: the placement keyed by the model's sha256 and the tflfuse package's, the
    error by the model's, the float export's and the eval count)."""
    digest = file_hash(path)[:20]
    place_file = keys["cache"] / f"place-{digest}-{keys['package']}.json"
    error_file = keys["cache"] / f"error-{digest}-{keys['float']}-e{keys['eval']}.json"
    keys["cache"].mkdir(parents=True, exist_ok=True)
    reused = [k for k, f in (("placement", place_file), ("error", error_file)) if f.is_file()]
    if place_file.is_file():
        result = json.loads(place_file.read_text())
    else:
        result = placement(path)
        place_file.write_text(json.dumps(result) + "\n")
    if error_file.is_file():
        result["error"] = json.loads(error_file.read_text())
    else:
        try:
            result["error"] = errors(ref, run_model(path, xs))
        except Exception as exc:  # a model the interpreter cannot run: a finding
            result["error"] = {"error": str(exc).splitlines()[0][:200]}
        error_file.write_text(json.dumps(result["error"]) + "\n")
    again = f" ({' and '.join(reused)} reused)" if reused else ""
    log(f"{path.name} ({who}): {result['mapped']}/{result['total']} mapped{again}")
    return result


def measure(side: Path, out_root: Path, n_eval: int) -> dict[str, Any]:
    info = json.loads(side.read_text())
    src = side.with_suffix(".tflite")
    route, user_route = FLOAT_ROUTES[info["route"]]
    row: dict[str, Any] = {"model": info["model"], "route": route, "file": src.name}
    row["input"] = f"{info['input_shape']} {info.get('input_layout', '')}"
    row["key"] = row_key(side, n_eval)
    xs = eval_inputs(info, n_eval)
    ref = run_model(src, xs)
    user = src.with_name(f"{info['model']}.{user_route}.tflite") if user_route else None
    keys = {"float": file_hash(src)[:20], "package": package_hash()[:20], "eval": n_eval}
    keys["cache"] = out_root / "cache"
    if user is not None and user.is_file():
        row["user"] = column("user", user, ref, xs, keys)
    elif user_route:
        row["user_missing"] = info.get("user_int8") or "not made"
    out = out_root / src.stem
    log(f"{src.name}: convert --recipe edgetpu")
    seconds, rss, code, last = convert_child(src, side.with_suffix(".calib.npy"), out)
    row.update(convert_s=round(seconds, 1), peak_rss_mib=round(rss / 2**20))
    if code != 0:
        row["convert_error"] = last
        if ACCEPT not in last:
            return row
        # refused as useless: converted again with the flag, measured on a row of its own
        log(f"{src.name}: refused; convert {ACCEPT}")
        out = out_root / f"{src.stem}.accepted"
        seconds, rss, code, last = convert_child(
            src, side.with_suffix(".calib.npy"), out, (ACCEPT,)
        )
        if code != 0:
            row["accepted_error"] = last
            return row
        row.update(accepted_s=round(seconds, 1), accepted_rss_mib=round(rss / 2**20))
    report = json.loads((out / "report.json").read_text())
    rules = report.get("rules", {}).get("fired", {})
    leg = report.get("legalization", {}).get("fired", {})
    row["rules"] = dict(Counter(rules) + Counter(leg))
    fused = "accepted" if row.get("convert_error") else "fused"
    for who, name in (("stock", "model_stock.tflite"), (fused, "model.tflite")):
        if (out / name).is_file():
            row[who] = column(who, out / name, ref, xs, keys)
    return row


# ---------------------------------------------------------------- cache keys

_HASHES: dict[tuple[str, int, int], str] = {}


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes (remembered per path, size and mtime)."""
    st = path.stat()
    memo = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo not in _HASHES:
        _HASHES[memo] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _HASHES[memo]


def package_hash() -> str:
    """sha256 over the tflfuse package's source and data files (names and bytes): what the
    convert, the predictor and its tables are made of."""
    import tflfuse

    root = Path(tflfuse.__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def row_key(side: Path, n_eval: int) -> str:
    """What a row depends on: the float export, its calibration data, the user's int8 file,
    the tflfuse package and the eval count (not this script: after changing what it measures,
    run with `--fresh`)."""
    files = [side.with_suffix(".tflite"), side.with_suffix(".calib.npy")]
    info = json.loads(side.read_text())
    user_route = FLOAT_ROUTES[info["route"]][1]
    user = side.with_name(f"{info['model']}.{user_route}.tflite") if user_route else None
    files += [user] if user is not None and user.is_file() else []
    parts = [file_hash(f)[:20] for f in files] + [package_hash()[:20], f"e{n_eval}"]
    return "-".join(parts)


# ---------------------------------------------------------------- the markdown

WHO = (("user", "user's int8"), ("stock", "stock"), ("fused", "tflfuse"))
# A convert refused as useless (tflfuse.convert.usefulness) is run again with this flag; the
# model it keeps is measured on a row of its own, labelled so (never as `tflfuse`).
ACCEPT = "--accept-accuracy-loss"
ACCEPTED = ("accepted", f"tflfuse, {ACCEPT}")


def _mapped(p: dict[str, Any], many: bool) -> str:
    """`mapped/total` on the evidence, `(or N)` per other reading (forms no compiled model shows
    mapped, read as mapped), and with `-a` the segments."""
    n = p["mapped_a"] if many else p["mapped"]
    others = p.get("other_readings_a", []) if many else p["other_readings"]
    text = f"{n}/{p['total']}" + "".join(f" (or {r['mapped']})" for r in others)
    return f"{text} in {p['segments_a']}" if many else text


def _crossing(pair: list[int] | tuple[int, int] | None) -> str:
    if not pair:
        return "-"
    return f"{pair[0]} x {pair[1] / 1024:.0f} KiB"


def _params(p: dict[str, Any]) -> str:
    """Predicted Edge TPU parameters in one segment and the part streamed on every inference
    ("-" for a row measured before the table recorded them)."""
    total, streamed = p.get("parameter_bytes"), p.get("streamed_bytes")
    if total is None or streamed is None:
        return "-"
    return f"{total / 2**20:.1f} ({streamed / 2**20:.1f})"


def _err(p: dict[str, Any]) -> str:
    e = p.get("error", {})
    if "error" in e:
        return f"fails: {e['error'][:60]}"
    return f"{e['max_abs']:.3g} ({e['rel']:.1%}, cos {e['cosine']:.3f})"


def _short(refusal: str) -> str:
    """A refusal whose long tensor names are cut to 40 characters and an ellipsis."""
    return re.sub(r"'([^']{40})[^']{8,}'", r"'\1...'", refusal)


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per model x route, one line each for the user's int8, stock and tflfuse."""
    lines = [
        "| model | route | file | mapped, one segment | crossings | mapped, -a | -a crossings |"
        " params MiB (streamed) | error vs float export | convert s / MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"| {r['model']} | {r['route']} |"
        if r.get("user_missing"):
            lines.append(f"{head} user's int8 | none | | | | | | |")
        for who, label in WHO:
            p = r.get(who)
            if not p:
                continue
            conv = f"{r.get('convert_s', '-')} / {r.get('peak_rss_mib', '-')}" * (who == "fused")
            lines.append(
                f"{head} {label} | {_mapped(p, False)} | {_crossing(p.get('crossings'))} |"
                f" {_mapped(p, True)} | {_crossing(p.get('crossings_a'))} | {_params(p)} |"
                f" {_err(p)} | {conv} |"
            )
        if r.get("convert_error"):
            failed = r["convert_error"].removeprefix("tflfuse: error: ")
            lines.append(f"{head} tflfuse | refused: {failed[:120]} (below) | | | | | | |")
        p = r.get(ACCEPTED[0])
        if p:
            conv = f"{r.get('accepted_s', '-')} / {r.get('accepted_rss_mib', '-')}"
            lines.append(
                f"{head} {ACCEPTED[1]} | {_mapped(p, False)} | {_crossing(p.get('crossings'))} |"
                f" {_mapped(p, True)} | {_crossing(p.get('crossings_a'))} | {_params(p)} |"
                f" {_err(p)} | {conv} |"
            )
    return lines


def cut_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Where each model is cut in one segment, the readings, and the rules that fired."""
    lines = []
    for r in rows:
        lines.append(f"- {r['model']} / {r['route']} ({r['file']}, input {r['input']}):")
        if r.get("convert_error"):
            lines.append(f"  - convert: {r['convert_error']}")
        if r.get("user_missing"):
            lines.append(f"  - user's int8: none ({r['user_missing']})")
        if r.get("accepted_error"):
            lines.append(f"  - convert {ACCEPT}: {r['accepted_error']}")
        for who, label in (*WHO, ACCEPTED):
            p = r.get(who)
            if p:
                cut = "; ".join(_short(x) for x in p["refused"][:3]) or "nothing refused"
                lines.append(f"  - {label}: {cut}")
                lines += [f"    - reading: {o['reading']}" for o in p["other_readings"]]
        if r.get("rules"):
            lines.append(
                "  - rules: " + ", ".join(f"{k} x{v}" for k, v in sorted(r["rules"].items()))
            )
    return lines


def row_package(row: dict[str, Any]) -> str:
    """The tflfuse package (12 hex digits) a row was measured on, read off its cache key."""
    key = row.get("key", "")
    return key.split("-")[-2][:12] if key.count("-") >= 2 else "unknown"


def provenance_lines(
    rows: list[dict[str, Any]], package: str, labels: dict[str, str] | None = None
) -> list[str]:
    """Rows rendered with `--cached` may come from several packages: say which, row by row,
    so a table never passes older rows off as the header's package (`labels`: what each
    package hash was, e.g. the commit it was measured on, from `--label HASH=TEXT`)."""
    labels = labels or {}
    older: dict[str, list[str]] = {}
    for row in rows:
        if (measured := row_package(row)) != package[:12]:
            older.setdefault(measured, []).append(f"{row['model']} / {row['route']}")
    return (
        [
            "",
            *(
                f"Measured on tflfuse package {pkg}"
                + (f" ({labels[pkg]})" if pkg in labels else "")
                + f", not the header's: {', '.join(names)}."
                for pkg, names in sorted(older.items())
            ),
        ]
        if older
        else []
    )


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    provenance = provenance_lines(rows, meta["package"], meta.get("labels"))
    rendered_on = " (rendered on it; the rows measured on other packages are named below the table)"
    lines = [
        "# Attention models and YOLO heads on the Edge TPU (predicted)",
        "",
        f"Generated by `{meta['command']}` in {meta['minutes']:.1f} min on {meta['corpus']}"
        " (built by `benchmarks/attention_corpus.py`: random weights, BatchNorm averaged over"
        " image-like inputs). Predicted by tflfuse's Edge TPU predictor (compiler 16); not run"
        f" on a compiler or a device. tflfuse package {meta['package'][:12]}"
        f"{rendered_on if provenance else ''}. Routes and"
        " columns: this script's docstring.",
        "",
        "Per model x route: the route's own int8 (`user's int8`: Ultralytics' onnx2tf 1.28"
        " full-integer file, onnx2tf 2.6 `-oiqt`; litert-torch makes none), litert-quantizer's"
        " int8 of the float export (`stock`) and `tflfuse convert --recipe edgetpu`. Mapped: ops"
        " predicted on the Edge TPU, on the evidence (forms no compiled model shows mapped are"
        " counted on the CPU); `(or N)`: the other reading, where those forms map. One segment:"
        " the compiler's default; `-a`: several Edge TPU subgraphs, `in S` segments. Crossings:"
        " tensors x bytes moving between the CPU and the Edge TPU per inference (graph inputs"
        " and outputs included). Params: the Edge TPU parameters of the mapped ops in one"
        " segment, in the compiler's layout (each layer its own copy of a shared kernel), and"
        " in brackets the part streamed from host memory on every inference (over the 8 MiB"
        " cache); `-` for a row measured before the table recorded them. Error: largest"
        " |output - float export| on image-like inputs"
        " calibration never saw (over the float output's largest magnitude; worst cosine)."
        " A convert refused as useless (`tflfuse.convert.usefulness`: its line gives stock's own"
        f" figure) is run again with `{ACCEPT}` and measured on its own row, `{ACCEPTED[1]}`.",
        "",
        *table_lines(rows),
        *provenance,
        "",
        "## Where each is cut (one segment)",
        "",
        *cut_lines(rows),
    ]
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


# ---------------------------------------------------------------- the driver


def float_exports(corpus: Path, only: list[str] | None) -> list[Path]:
    """The sidecars of the corpus' float exports (`--only`: models or files' stems), the
    largest file first (the longest converts start first under `--jobs`)."""
    sides = []
    for side in sorted(corpus.glob("*.json")):
        with contextlib.suppress(ValueError, OSError):
            info = json.loads(side.read_text())
            if info.get("route") not in FLOAT_ROUTES or not side.with_suffix(".tflite").is_file():
                continue
            if only and not {info["model"], side.stem} & set(only):
                continue
            sides.append(side)
    return sorted(sides, key=lambda s: -s.with_suffix(".tflite").stat().st_size)


def one_row(side: Path, out: Path, n_eval: int) -> int:
    """`--row`: measure one float export into OUT/STEM.row.json (a failure is a row too)."""
    info = json.loads(side.read_text())
    try:
        row = measure(side, out, n_eval)
    except Exception as exc:  # a failure is a row, not a crash
        row = {"model": info["model"], "route": FLOAT_ROUTES[info["route"]][0]}
        row |= {"file": side.name, "input": "", "convert_error": f"{type(exc).__name__}: {exc}"}
        row["convert_error"] = row["convert_error"].splitlines()[0][:300]
        row["key"] = row_key(side, n_eval)
        log(f"{side.stem}: {row['convert_error']}")
    (out / f"{side.stem}.row.json").write_text(json.dumps(row, indent=1) + "\n")
    return 0


def summary(row: dict[str, Any]) -> str:
    parts = [
        f"{label} {row[who]['mapped']}/{row[who]['total']}"
        for who, label in (*WHO, ACCEPTED)
        if row.get(who)
    ]
    if row.get("convert_error"):
        parts.append("convert refused")
    return ", ".join(parts) + (f"; convert {row['convert_s']} s" if "convert_s" in row else "")


def cached_row(side: Path, out: Path, n_eval: int, any_key: bool) -> dict[str, Any] | None:
    """The row an earlier run left for `side`, if it was measured on the same inputs (or, with
    `any_key`, whatever it was measured on)."""
    path = out / f"{side.stem}.row.json"
    if not path.is_file():
        return None
    row = json.loads(path.read_text())
    return row if any_key or row.get("key") == row_key(side, n_eval) else None


def start_child(side: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, float, Any]:
    """One `--row` child for `side`, in its own process group, its output in OUT/STEM.log."""
    cmd = [sys.executable, __file__, "--row", str(side), "--out", str(args.out)]
    cmd += ["--eval", str(args.eval)]
    (args.out / f"{side.stem}.row.json").unlink(missing_ok=True)  # the child writes it
    logf = (args.out / f"{side.stem}.log").open("w")
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
    )
    return proc, time.perf_counter(), logf


def stop_child(proc: subprocess.Popen) -> None:
    """End a child and everything it started (its convert)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def finished_row(side: Path, args: argparse.Namespace, late: bool) -> dict[str, Any]:
    """The row a finished child wrote, or one saying why there is none."""
    row = None if late else cached_row(side, args.out, args.eval, any_key=True)
    if row is None:
        info = json.loads(side.read_text())
        why = f"timed out after {args.timeout:.0f} s" if late else "the child left no row"
        row = {"model": info["model"], "route": FLOAT_ROUTES[info["route"]][0]}
        row |= {"file": side.name, "input": "", "convert_error": why}
    return row


def run_all(todo: list[Path], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Measure `todo`, `args.jobs` children at a time (each killed after `args.timeout`, all
    of them when this run is interrupted), printing progress; return the rows by stem."""
    rows: dict[str, dict[str, Any]] = {}
    waiting, running = list(todo), {}
    t0 = time.perf_counter()
    try:
        while waiting or running:
            while waiting and len(running) < args.jobs:
                side = waiting.pop(0)
                running[side] = start_child(side, args)
                log(f"started {side.stem} ({len(running)} running, {len(waiting)} waiting)")
            time.sleep(1)
            for side, (proc, started, logf) in list(running.items()):
                late = time.perf_counter() - started > args.timeout
                if proc.poll() is None and not late:
                    continue
                stop_child(proc)
                logf.close()
                del running[side]
                rows[side.stem] = finished_row(side, args, late)
                left = (time.perf_counter() - t0) / len(rows) * (len(todo) - len(rows))
                log(
                    f"[{len(rows)}/{len(todo)}] {side.stem} in"
                    f" {time.perf_counter() - started:.0f} s: {summary(rows[side.stem])}"
                    f" (about {left / 60:.0f} min left; log {args.out / side.stem}.log)"
                )
    finally:
        for proc, _, _ in running.values():
            stop_child(proc)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--only", nargs="*", help="models (or files' stems) to measure")
    parser.add_argument("--eval", type=int, default=8, help="image-like inputs for the errors")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "yolo_edgetpu")
    parser.add_argument("--md", type=Path, default=HERE / "YOLO_EDGETPU.md")
    parser.add_argument("--jobs", type=int, default=1, help="float exports measured at once")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per float export")
    parser.add_argument("--fresh", action="store_true", help="measure even rows cached as current")
    parser.add_argument(
        "--cached",
        action="store_true",
        help="render the rows earlier runs left in --out, whatever they were measured on",
    )
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="HASH=TEXT",
        help="with --cached: what a row's package (12 hex digits) was, e.g. its commit",
    )
    parser.add_argument("--row", type=Path, help=argparse.SUPPRESS)  # a child: one sidecar
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.row:
        return one_row(args.row, args.out, args.eval)
    if not args.corpus.is_dir():
        print(f"no corpus at {args.corpus} (build it: benchmarks/attention_corpus.py)")
        return 1
    started = time.perf_counter()
    sides = float_exports(args.corpus, args.only)
    rows, todo = {}, []
    for side in sides:
        row = None if args.fresh else cached_row(side, args.out, args.eval, args.cached)
        if row is not None:
            rows[side.stem] = row
        elif not args.cached:
            todo.append(side)
    log(f"{len(sides)} float exports: {len(rows)} cached, {len(todo)} to measure")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run_all's cleanup runs on kill
    rows |= run_all(todo, args)
    ordered = [rows[s.stem] for s in sorted(sides, key=lambda s: s.stem) if s.stem in rows]
    meta = {
        "command": "python benchmarks/yolo_edgetpu.py " + " ".join(argv or sys.argv[1:]),
        "minutes": (time.perf_counter() - started) / 60,
        "corpus": str(args.corpus),
        "package": package_hash(),
        "labels": dict(label.split("=", 1) for label in args.label),
    }
    (args.out.parent / "yolo_edgetpu.json").write_text(json.dumps(ordered, indent=1) + "\n")
    args.md.write_text(render(ordered, meta))
    print(f"{len(ordered)} rows -> {args.md} in {meta['minutes']:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
