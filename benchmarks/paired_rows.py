#!/usr/bin/env python3
"""Fused against stock, paired, on every row of YOLO_EDGETPU.md: is `convert --recipe edgetpu`'s
model at least as faithful to the float export as stock's (issue 25's goal), per input?

YOLO_EDGETPU.md's error column is the largest |error| over 8 inputs: one draw of a figure that
moves with the inputs by more than most fused-stock gaps (FUSED_ACCURACY.md, "max per further
8"). This script reads the models `benchmarks/yolo_edgetpu.py` already converted (its `--out`:
ROW/model.tflite and ROW/model_stock.tflite, with ROW.row.json naming the tflfuse package that
made them; ROW.accepted/ where the convert was refused as useless and run again with
--accept-accuracy-loss), runs them and the float export on `--eval` image-like inputs
calibration never saw (seed 99, `yolo_edgetpu.eval_inputs`: the table's 8 first), and pairs
them per input:

  rms            the first output's rms error over the float output's rms, mean over inputs
  fused - stock  per input the fused model's figure minus stock's: mean +- standard error, and
                 on how many inputs fused is the closer (rms, and the largest |error|)
  verdict        closer: the mean rms gap is below 0 by more than 2 standard errors; farther:
                 above 0 by more than 2; as close: within them
  user's int8    the route's own int8 (`yolo_edgetpu.FLOAT_ROUTES`: Ultralytics' onnx2tf
                 full-integer file), where the corpus has one, paired against stock the same way

    .venv/bin/python benchmarks/paired_rows.py --rows /work/scratch/lead/combined2 \
        --corpus /work/corpus --md benchmarks/FUSED_ACCURACY_ROWS.md

Per-input figures are cached in ROW/paired-eN.json, keyed by the files' sha256. Accuracy only:
no timing claim. Converts nothing: a row the table has not measured is not here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import yolo_edgetpu  # noqa: E402  (eval inputs, file hashes)
from fused_accuracy import paired, per_input  # noqa: E402  (per-input errors, their pairing)

# The verdict's bound, in standard errors of the paired mean
SIGMAS = 2.0
# yolo_edgetpu.py's folder for a convert refused as useless and run again with
# --accept-accuracy-loss (its row names it `tflfuse, --accept-accuracy-loss`)
ACCEPTED = ".accepted"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure_row(row_dir: Path, corpus: Path, n_eval: int) -> dict[str, Any] | None:
    """Per-input figures of the row's fused and stock models (and the user's int8, if any)."""
    stem = row_dir.name.removesuffix(ACCEPTED)
    side = corpus / f"{stem}.json"
    fused, stock = row_dir / "model.tflite", row_dir / "model_stock.tflite"
    if not (side.is_file() and fused.is_file() and stock.is_file()):
        return None
    src = corpus / f"{stem}.tflite"
    model, route = stem.rsplit(".", 1)
    user_route = yolo_edgetpu.FLOAT_ROUTES.get(route, ("", None))[1]
    user = corpus / f"{model}.{user_route}.tflite"
    models = {"fused": fused, "stock": stock}
    if user_route and user.is_file():
        models["user"] = user
    key = "-".join(yolo_edgetpu.file_hash(p)[:16] for p in [src, *models.values()])
    cache = row_dir / f"paired-e{n_eval}.json"
    if cache.is_file() and json.loads(cache.read_text()).get("key") == key:
        return json.loads(cache.read_text())
    log(f"{stem}: {n_eval} inputs through the float export and {', '.join(models)}")
    xs = yolo_edgetpu.eval_inputs(json.loads(side.read_text()), n_eval)
    ref = yolo_edgetpu.run_model(src, xs)
    result = {"key": key, **{k: per_input(p, ref, xs) for k, p in models.items()}}
    cache.write_text(json.dumps(result) + "\n")
    return result


def verdict(mean: float, se: float) -> str:
    if mean + SIGMAS * se < 0:
        return "closer"
    if mean - SIGMAS * se > 0:
        return "farther"
    return "as close"


def _gap(a: dict[str, Any], b: dict[str, Any], key: str) -> str:
    mean, se, closer, n = paired(a, b, key)
    return f"{mean:+.4f} +- {se:.4f} ({closer}/{n})"


def row_line(stem: str, package: str, fig: dict[str, Any]) -> tuple[str, str]:
    """The table's line for one row and its verdict ('' where there is no paired figure)."""
    fused, stock = fig["fused"], fig["stock"]
    head = f"| {stem} | {package} |"
    if "error" in fused:
        return f"{head} fused fails: {fused['error']} | | | | | |", ""
    fused_rms = f"{np.mean(fused['rms']):.4f}"
    if "error" in stock:
        return f"{head} fails: {stock['error'][:60]} | {fused_rms} | | | (no stock) | |", ""
    mean, se, _, _ = paired(fused, stock, "rms")
    rel = mean / max(float(np.mean(stock["rms"])), 1e-12)
    user = fig.get("user")
    user_cell = ""
    if user is not None:
        user_cell = user["error"][:60] if "error" in user else _gap(user, stock, "rms")
    line = (
        f"{head} {np.mean(stock['rms']):.4f} | {fused_rms} | {_gap(fused, stock, 'rms')}"
        f" ({rel:+.1%}) | {_gap(fused, stock, 'max')} | {verdict(mean, se)} | {user_cell} |"
    )
    return line, verdict(mean, se)


def render(rows: list[tuple[str, str, dict[str, Any]]], meta: dict[str, Any]) -> str:
    lines, verdicts = [], []
    for stem, package, fig in rows:
        line, v = row_line(stem, package, fig)
        lines.append(line)
        verdicts.append(v)
    counts = {v: verdicts.count(v) for v in ("closer", "as close", "farther")}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    return "\n".join(
        [
            "# Fused against stock on every row of YOLO_EDGETPU.md, paired per input",
            "",
            f"Generated by `{meta['command']}` in {meta['minutes']:.1f} min on {meta['corpus']}"
            f" (random weights, BatchNorm averaged over image-like inputs). {meta['eval']}"
            " image-like inputs calibration never saw (seed 99; the first 8 are"
            " YOLO_EDGETPU.md's). The models are the ones YOLO_EDGETPU.md measured (`package`:"
            " the tflfuse package that converted the row). Columns: this script's docstring;"
            " gaps are fused (or the user's int8) minus stock, mean +- standard error (inputs"
            " where it is the closer / inputs), the rms gap also relative to stock's rms.",
            "",
            f"Verdicts ({SIGMAS:g} standard errors): {summary}.",
            "",
            "| row | package | stock rms | fused rms | fused - stock, rms | fused - stock, max"
            " | verdict | user's int8 - stock, rms |",
            "|---|---|---|---|---|---|---|---|",
            *lines,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=Path, required=True, help="yolo_edgetpu.py's --out")
    parser.add_argument("--corpus", type=Path, default=yolo_edgetpu.CORPUS)
    parser.add_argument("--eval", type=int, default=32, help="image-like inputs")
    parser.add_argument("--only", nargs="*", help="rows (folder names) to measure")
    parser.add_argument("--md", type=Path, help="write the markdown here")
    args = parser.parse_args(argv)
    t0 = time.time()
    rows = []
    for row_dir in sorted(p for p in args.rows.iterdir() if p.is_dir() and p.name[0] != "."):
        if args.only and row_dir.name not in args.only:
            continue
        name = row_dir.name.removesuffix(ACCEPTED)
        sidecar = args.rows / f"{name}.row.json"
        row = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
        if (name != row_dir.name) != bool(row.get("convert_error")):
            continue  # the row's model is in the other folder (an .accepted one from before)
        fig = measure_row(row_dir, args.corpus, args.eval)
        if fig is None:
            continue
        package = yolo_edgetpu.row_package(row)[:12] if row else ""
        if name != row_dir.name:
            name += " (refused; --accept-accuracy-loss)"
        rows.append((name, package, fig))
    meta = {
        "command": "python benchmarks/paired_rows.py " + " ".join(sys.argv[1:]),
        "minutes": (time.time() - t0) / 60,
        "corpus": args.corpus,
        "eval": args.eval,
    }
    text = render(rows, meta)
    if args.md:
        args.md.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
