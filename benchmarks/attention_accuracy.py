#!/usr/bin/env python3
"""Attention's A.V on the Edge TPU recipe: the fused model's error against the float model, beside
stock's, with the softmax operand in one range, two and three.

    /work/main/.venv/bin/python benchmarks/attention_accuracy.py [--corpus /work/corpus]
        [--only levit_128s.litert ...] [--eval 8] [--variants one two three] [--fresh]

`LegalizeActivationMatmul` spells A.V (A a softmax output in [0, 1]) as MUL products that are
calibrated one tensor each, so a diffuse row's small weights round to nothing at the step a
peaked row sets; the split into ranges (`tflfuse/targets/edgetpu/softmax_split.py`) gives each
range its own product and scale. This measures what that does on exported attention models:

  stock     litert-quantizer's static int8 of the float export (`convert`'s model_stock.tflite)
  one       `tflfuse convert --recipe edgetpu`, the softmax operand not split (POINTS = ())
  two       split at 8/n where 8/n < 1/2 (POINTS = (8,)): the split before the three ranges
  three     split at 1/n and 8/n, each where it lies in [1/256, 1) (POINTS = (1, 8)): today's

Each fused variant is a `tflfuse convert X.tflite --recipe edgetpu --calib X.calib.npy
--accept-accuracy-loss` in a child process whose `softmax_split.POINTS` (and LARGEST_POINT)
is set first (the flag so that a model refused as useless is still measured; the row says it
was). For each model: the
Edge TPU mapping tflfuse's predictor gives in one segment (mapped/total ops) and, on `--eval`
image-like inputs calibration never saw (seed 99, `yolo_edgetpu.eval_inputs`), the largest
|output - float output| and the worst cosine (`yolo_edgetpu.errors`). Reads the corpus
`benchmarks/attention_corpus.py` builds (default /work/corpus or $TFLFUSE_CORPUS). Results are
cached per variant in `--out` (keyed by the float file's, its calibration's and the package's
sha256, the points and the eval count). Writes benchmarks/ATTENTION_ACCURACY.md and
benchmarks/out/attention_accuracy.json. Accuracy only: no timing claim.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import yolo_edgetpu  # noqa: E402  (placement, errors, eval inputs, hashes)

CORPUS = Path(os.environ.get("TFLFUSE_CORPUS") or "/work/corpus")
# softmax_split's (POINTS in multiples of 1/n, LARGEST_POINT) per variant: `two` is the split
# before the three ranges (tau = 8/n, only under 1/2), `three` today's
VARIANTS = {"one": ((), 1.0), "two": ((8.0,), 0.5), "three": ((1.0, 8.0), 1.0)}
LABELS = {"one": "one range", "two": "two (8/n)", "three": "three (1/n, 8/n)"}
MODELS = ["levit_128s.litert", "levit_128s.onnx2tf26", "yolo11n-320.litert", "yolo26n-320.litert"]
ACCEPT = "--accept-accuracy-loss"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def child(variant: str, src: str, calib: str, out: str) -> int:
    """`--child`: convert with the softmax split at the variant's points."""
    from tflfuse.cli import main
    from tflfuse.targets.edgetpu import softmax_split

    softmax_split.POINTS, softmax_split.LARGEST_POINT = VARIANTS[variant]
    return main(["convert", src, "--recipe", "edgetpu", "--calib", calib, "-o", out, ACCEPT])


def convert(variant: str, side: Path, out: Path) -> tuple[float, int, str]:
    """A child converting `side`'s float export into `out` (a folder that does not exist yet):
    (seconds, exit code, last stderr line)."""
    src, calib = side.with_suffix(".tflite"), side.with_suffix(".calib.npy")
    cmd = ["nice", sys.executable, __file__, "--child", variant, str(src), str(calib), str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stderr.replace("\r", "\n").splitlines() if ln.strip()]
    return time.perf_counter() - t0, proc.returncode, (lines or [""])[-1][:400]


def measured(path: Path, ref: list, xs: Any) -> dict[str, Any]:
    """Mapped ops in one segment and the error against the float outputs."""
    place = yolo_edgetpu.placement(path)
    result = {"mapped": place["mapped"], "total": place["total"]}
    result["error"] = yolo_edgetpu.errors(ref, yolo_edgetpu.run_model(path, xs))
    return result


def variant_row(side: Path, variant: str, args: argparse.Namespace, ref, xs) -> dict[str, Any]:
    """One fused variant of one model (and stock, from the first variant's convert: the same
    litert-quantizer int8 in each), cached in `args.out`."""
    src = side.with_suffix(".tflite")
    with_stock = variant == args.variants[0]
    key = "-".join(
        [yolo_edgetpu.file_hash(f)[:16] for f in (src, side.with_suffix(".calib.npy"))]
        + [yolo_edgetpu.package_hash()[:16], repr(VARIANTS[variant]), f"e{args.eval}"]
        + ["stock"] * with_stock
    )
    cache = args.out / f"{side.stem}.{variant}.json"
    if cache.is_file() and not args.fresh:
        row = json.loads(cache.read_text())
        if row.get("key") == key:
            log(f"{side.stem} {variant}: cached")
            return {**row, "cached": True}
    # a folder of this run's own in --out, removed after: the models are large, the figures
    # are kept, and nothing this script did not write is ever deleted
    work = Path(tempfile.mkdtemp(prefix=f"{side.stem}.{variant}.", dir=args.out))
    out = work / "convert"
    try:
        seconds, code, last = convert(variant, side, out)
        row: dict[str, Any] = {"key": key, "variant": variant, "convert_s": round(seconds, 1)}
        if code != 0:
            row["convert_error"] = last
        else:
            report = json.loads((out / "report.json").read_text())
            row["refused_as_useless"] = report.get("accuracy_loss_accepted")
            row["fused"] = measured(out / "model.tflite", ref, xs)
            if with_stock:
                row["stock"] = measured(out / "model_stock.tflite", ref, xs)
    finally:
        shutil.rmtree(work)
    log(f"{side.stem} {variant}: {summary(row)}")
    cache.write_text(json.dumps(row, indent=1) + "\n")
    return row


def summary(row: dict[str, Any]) -> str:
    if "convert_error" in row:
        return f"convert failed: {row['convert_error']}"
    stock = f"; stock {_cell(row['stock'])}" if row.get("stock") else ""
    return f"fused {_cell(row['fused'])}{stock}"


def _cell(p: dict[str, Any]) -> str:
    e = p["error"]
    if "error" in e:
        return f"{p['mapped']}/{p['total']} mapped, fails: {e['error'][:60]}"
    return f"{p['mapped']}/{p['total']} mapped, max err {e['max_abs']:.3g}, cos {e['cosine']:.3f}"


def model_rows(side: Path, args: argparse.Namespace) -> dict[str, Any]:
    info = json.loads(side.read_text())
    xs = yolo_edgetpu.eval_inputs(info, args.eval)
    ref = yolo_edgetpu.run_model(side.with_suffix(".tflite"), xs)
    variants = {v: variant_row(side, v, args, ref, xs) for v in args.variants}
    return {"stem": side.stem, "model": info["model"], "route": info["route"], **variants}


def _line(head: str, label: str, p: dict[str, Any]) -> str:
    e = p["error"]
    if "error" in e:
        return f"{head} {label} | {p['mapped']}/{p['total']} | fails: {e['error'][:60]} | | |"
    return (
        f"{head} {label} | {p['mapped']}/{p['total']} | {e['max_abs']:.3g} | {e['rel']:.1%} |"
        f" {e['cosine']:.4f} |"
    )


def table_lines(models: list[dict[str, Any]], variants: list[str]) -> list[str]:
    """Per model: stock, then each fused variant (mapped, max abs error, relative, cosine)."""
    lines = [
        "| model | route | int8 model | mapped, one segment | max abs error | rel | cosine |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in models:
        head = f"| {m['model']} | {m['route']} |"
        stock = next((m[v]["stock"] for v in variants if m[v].get("stock")), None)
        if stock is not None:
            lines.append(_line(head, "stock", stock))
        for v in variants:
            label = f"tflfuse, {LABELS[v]}"
            if "fused" in m[v]:
                lines.append(_line(head, label, m[v]["fused"]))
            else:
                failed = m[v].get("convert_error", "")[:100]
                lines.append(f"{head} {label} | convert failed: {failed} | | | |")
    return lines


def against_stock(models: list[dict[str, Any]], variants: list[str]) -> list[str]:
    """Per model, each fused variant's max error and cosine over stock's (ratio, difference)."""
    out = []
    for m in models:
        stock = next((m[v]["stock"] for v in variants if m[v].get("stock")), None)
        if stock is None or "error" in stock["error"]:
            continue
        s = stock["error"]
        parts = []
        for v in variants:
            e = m[v].get("fused", {}).get("error", {})
            if "max_abs" in e:
                parts.append(
                    f"{LABELS[v]}: max error x{e['max_abs'] / s['max_abs']:.2f},"
                    f" cosine {e['cosine'] - s['cosine']:+.4f}"
                )
        out.append(f"- {m['stem']} (against stock's): " + "; ".join(parts))
    return out


def notes(models: list[dict[str, Any]], variants: list[str]) -> list[str]:
    """Which fused variants `convert` would have refused as useless (kept with the flag)."""
    out = []
    for m in models:
        for v in variants:
            why = m[v].get("refused_as_useless")
            if why:
                out.append(f"- {m['stem']}, {LABELS[v]}: refused without {ACCEPT}: {why}")
    return out or ["- none: every fused variant passed `convert`'s usefulness check"]


def render(models: list[dict[str, Any]], variants: list[str], meta: dict[str, Any]) -> str:
    return "\n".join(
        [
            "# Attention's A.V split: fused error against the float model, beside stock",
            "",
            f"Generated by `{meta['command']}` in {meta['minutes']:.1f} min ({meta['cached']}"
            f" converts of earlier runs on the same files and package reused) on {meta['corpus']}"
            f" (random weights, `benchmarks/attention_corpus.py`); tflfuse package"
            f" {meta['package'][:12]}. {meta['eval']} image-like inputs calibration never saw"
            " (seed 99); error: largest |int8 model's output - float export's| (rel: over the"
            " float output's largest magnitude), cosine: the worst over inputs and outputs."
            " Mapped: ops tflfuse's predictor puts on the Edge TPU in one segment (compiler 16;"
            " predicted, not compiled). Fused: `tflfuse convert --recipe edgetpu` with the softmax"
            " operand of each attention A.V in one range (not split), two (split at 8/n where"
            " under 1/2) and three (at 1/n and 8/n, each where it lies in [1/256, 1); n the"
            " softmax row's length): see this script's docstring and"
            " `tflfuse/targets/edgetpu/softmax_split.py`.",
            "",
            *table_lines(models, variants),
            "",
            "## Against stock",
            "",
            *against_stock(models, variants),
            "",
            "## Refused as useless (measured with `--accept-accuracy-loss`)",
            "",
            *notes(models, variants),
            "",
            "## Left",
            "",
            "- Q.K^T: its logits' products are calibrated one tensor each too, and their range is"
            " not known before calibration (unlike a softmax's [0, 1]), so a split needs the"
            " calibrated ranges passed to the rules; not done.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--only", nargs="*", default=MODELS, help="float exports' stems")
    parser.add_argument("--eval", type=int, default=8, help="image-like inputs for the errors")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=HERE / "out" / "attention_accuracy")
    parser.add_argument("--md", type=Path, default=HERE / "ATTENTION_ACCURACY.md")
    parser.add_argument("--fresh", action="store_true", help="measure even cached variants")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)  # variant src calib out
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    args.out.mkdir(parents=True, exist_ok=True)
    sides = [args.corpus / f"{stem}.json" for stem in args.only]
    missing = [s.name for s in sides if not s.with_suffix(".tflite").is_file()]
    if missing:
        print(f"not in {args.corpus}: {', '.join(missing)} (benchmarks/attention_corpus.py)")
        return 1
    started = time.perf_counter()
    models = [model_rows(side, args) for side in sides]
    meta = {
        "command": "python benchmarks/attention_accuracy.py " + " ".join(argv or sys.argv[1:]),
        "minutes": (time.perf_counter() - started) / 60,
        "cached": sum(bool(m[v].get("cached")) for m in models for v in args.variants),
        "corpus": str(args.corpus),
        "package": yolo_edgetpu.package_hash(),
        "eval": args.eval,
    }
    (args.out.parent / "attention_accuracy.json").write_text(json.dumps(models, indent=1) + "\n")
    shown = [v for v in VARIANTS if v in args.variants]  # in this order, however asked
    args.md.write_text(render(models, shown, meta))
    print(f"{len(models)} models -> {args.md} in {meta['minutes']:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
