#!/usr/bin/env python3
"""LayerNorm normalized twice (`NormalizeTwice`, targets/edgetpu/renorm.py): the fused model of
two trees (before: without the rule; after: with it) and stock, paired against the float export
on the same inputs.

    cd /tmp && PYTHONPATH=/work/h-NAME /work/main/.venv/bin/python \
        /work/h-NAME/benchmarks/layernorm_accuracy.py --before /work/main --after /work/h-NAME \
        [--only edgenext_xx_small.litert ...] [--eval 32] [--out DIR] \
        [--md benchmarks/FUSED_ACCURACY_LAYERNORM.md]

Each tree converts each float export (`fused_accuracy.convert`: `tflfuse convert --recipe
edgetpu` in a child whose working directory is that tree, cached in `--out` by the files' and
the tree's package hashes). Measured on `--eval` image-like inputs calibration never saw (seed
99, `yolo_edgetpu.eval_inputs`), per input: the largest |error| and the rms error (over the
float output's rms) of the first output against the float export. Paired: per input, after
minus before, after minus stock and before minus stock, their mean, standard error and on how
many inputs the first is the closer. Also the Edge TPU ops predicted mapped in one segment and
the op count of each model. A stock model the interpreter cannot run (EdgeNeXt's int8 DIV:
`div.cc: data[i] != zero_point`) is said so; the fused pair is still compared. Accuracy only.
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

import fused_accuracy  # noqa: E402  (convert, tree hash)
import yolo_edgetpu  # noqa: E402  (eval inputs, running a model, placement)

MODELS = ["edgenext_xx_small.litert", "efficientformer_l1.litert", "deit_tiny_patch16_224.litert"]
SIDES = ("stock", "before", "after")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def per_input(path: Path, ref: list, xs: np.ndarray) -> dict[str, Any]:
    """Per input: the largest |error| and the rms error over the float output's rms (first
    output), or the one-line reason the model does not run."""
    try:
        got = yolo_edgetpu.run_model(path, xs)
    except (RuntimeError, ValueError) as exc:
        return {"error": str(exc).strip().splitlines()[0][:120]}
    maxima, rms = [], []
    for r, g in zip(ref, got):
        d = g[0] - r[0]
        maxima.append(float(np.abs(d).max()))
        rms.append(float(np.sqrt((d**2).mean() / max((r[0] ** 2).mean(), 1e-24))))
    return {"max": maxima, "rms": rms}


def converted(tree: Path, label: str, side: Path, out: Path) -> Path | str:
    """The folder of `tree`'s convert of `side` (cached by the files' and the tree's hashes),
    or the convert's last error line."""
    files = (side.with_suffix(".tflite"), side.with_suffix(".calib.npy"))
    key = "-".join([yolo_edgetpu.file_hash(f)[:16] for f in files])
    key += "-" + fused_accuracy.tree_hash(tree)[:16]
    folder = out / f"{side.stem}.{label}"
    stamp = folder / "key.txt"
    if stamp.is_file() and stamp.read_text() == key and (folder / "convert").is_dir():
        log(f"{side.stem} {label}: cached")
        return folder / "convert"
    folder.mkdir(parents=True, exist_ok=True)
    log(f"{side.stem} {label}: convert with {tree}")
    code, last = fused_accuracy.convert(tree, side, folder / "convert")
    if code != 0:
        return last
    stamp.write_text(key)
    return folder / "convert"


def model_facts(path: Path) -> dict[str, Any]:
    place = yolo_edgetpu.placement(path)
    from tflfuse.ir import flatbuffer

    return {"mapped": place["mapped"], "total": place["total"],
            "ops": len(flatbuffer.load(path).main.ops)}  # fmt: skip


def measure(stem: str, args: argparse.Namespace) -> dict[str, Any]:
    side = args.corpus / f"{stem}.json"
    xs = yolo_edgetpu.eval_inputs(json.loads(side.read_text()), args.eval)
    ref = yolo_edgetpu.run_model(side.with_suffix(".tflite"), xs)
    entry: dict[str, Any] = {"stem": stem}
    folders = {}
    for label, tree in (("before", args.before), ("after", args.after)):
        made = converted(tree.resolve(), label, side, args.out)
        if isinstance(made, str):
            entry[label] = {"error": f"convert failed: {made}"}
            continue
        folders[label] = made
    paths = {k: folders[k] / "model.tflite" for k in folders}
    if "before" in folders:
        paths["stock"] = folders["before"] / "model_stock.tflite"
    for label, path in paths.items():
        entry[label] = {**per_input(path, ref, xs), **model_facts(path)}
    return entry


def _paired(a: dict, b: dict, key: str) -> str:
    if "error" in a or "error" in b or key not in a or key not in b:
        return "n/a"
    d = np.array(a[key]) - np.array(b[key])
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
    return f"{d.mean():+.4f} +- {se:.4f} ({int(np.sum(d < 0))}/{len(d)})"


def render(models: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# LayerNorm normalized twice: fused against main and stock, paired",
        "",
        f"Generated by `{meta['command']}` in {meta['minutes']:.1f} min{meta['source']} on"
        f" {meta['corpus']}"
        " (random weights, `benchmarks/attention_corpus.py`). Before:"
        f" {meta['before']} (package {meta['before_hash'][:12]}); after: {meta['after']}"
        f" (package {meta['after_hash'][:12]}). {meta['eval']} image-like inputs calibration"
        " never saw (seed 99). Stock: litert-quantizer's int8 of the same float export (the"
        " before tree's). Columns: this script's docstring.",
        "",
        "| model | int8 model | mapped, one segment | ops | rms error (mean) | max error (mean) |",
        "|---|---|---|---|---|---|",
    ]
    for m in models:
        for label in SIDES:
            row = m.get(label, {})
            if "rms" not in row:
                why = row.get("error", "not measured")
                facts = f"{row['mapped']}/{row['total']} | {row['ops']}" if "ops" in row else " | "
                lines.append(f"| {m['stem']} | {label} | {facts} | does not run: {why} | |")
                continue
            lines.append(
                f"| {m['stem']} | {label} | {row['mapped']}/{row['total']} | {row['ops']} |"
                f" {np.mean(row['rms']):.4f} | {np.mean(row['max']):.4f} |"
            )
    lines += [
        "",
        "## Paired (per input: first minus second; mean +- standard error, (inputs where the"
        " first is the closer))",
        "",
        "| model | error | after - before | after - stock | before - stock |",
        "|---|---|---|---|---|",
    ]
    for m in models:
        for key in ("rms", "max"):
            a, b, s = (m.get(k, {}) for k in ("after", "before", "stock"))
            lines.append(
                f"| {m['stem']} | {key} | {_paired(a, b, key)} | {_paired(a, s, key)} |"
                f" {_paired(b, s, key)} |"
            )
    return "\n".join([*lines, "", *meta.get("notes", []), ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a tflfuse checkout")
    parser.add_argument("--after", type=Path, required=True, help="a tflfuse checkout")
    parser.add_argument("--names", nargs=2, help="what the two trees are (e.g. their commits)")
    parser.add_argument("--corpus", type=Path, default=fused_accuracy.CORPUS)
    parser.add_argument("--only", nargs="*", default=MODELS, help="float exports' stems")
    parser.add_argument("--eval", type=int, default=32, help="image-like inputs")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "layernorm_accuracy")
    parser.add_argument("--md", type=Path, default=HERE / "FUSED_ACCURACY_LAYERNORM.md")
    parser.add_argument("--notes", type=Path, help="a text file appended to the markdown")
    parser.add_argument(
        "--also",
        type=Path,
        help="an earlier run's layernorm_accuracy.json (same trees and inputs): its models are"
        " shown first, as measured then",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    models = json.loads(args.also.read_text()) if args.also else []
    for stem in args.only:
        models.append(measure(stem, args))
        (args.out / "layernorm_accuracy.json").write_text(json.dumps(models, indent=1) + "\n")
    meta = {
        "command": "python benchmarks/layernorm_accuracy.py " + " ".join(argv or sys.argv[1:]),
        "minutes": (time.perf_counter() - started) / 60,
        "corpus": str(args.corpus),
        "source": (
            f" (and, shown first, the models of {args.also.name} as an earlier run of this script"
            " measured them on the same trees and inputs)"
            if args.also
            else ""
        ),
        "before": args.names[0] if args.names else str(args.before),
        "after": args.names[1] if args.names else str(args.after),
        "before_hash": fused_accuracy.tree_hash(args.before.resolve()),
        "after_hash": fused_accuracy.tree_hash(args.after.resolve()),
        "eval": args.eval,
        "notes": args.notes.read_text().splitlines() if args.notes else [],
    }
    args.md.write_text(render(models, meta))
    print(f"{len(models)} models -> {args.md} in {meta['minutes']:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
