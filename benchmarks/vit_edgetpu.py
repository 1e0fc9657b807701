#!/usr/bin/env python3
"""ViT-style classifiers that stopped early on the Edge TPU recipe: before and after a change.

    /work/main/.venv/bin/python benchmarks/vit_edgetpu.py --before /work/main [FILE.tflite ...]
        [--corpus /work/corpus] [--cached] [--fresh]

For each float export (default: EfficientFormer-L1, MobileViT-xxs and EdgeNeXt-xx-small from
litert-torch and onnx2tf 2.6 in the corpus `benchmarks/attention_corpus.py` builds, each with its
`X.calib.npy`), `python -m tflfuse.cli convert X.tflite --recipe edgetpu --calib X.calib.npy` is
run as a child process twice, before and after, alternating (the tflfuse tree given by
`--before`, e.g. a checkout of main, and this checkout), each with its tree first on PYTHONPATH.
From each conversion's report: the fused and stock models' Edge TPU placement predicted in one
segment (tflfuse's predictor, compiler 16; no device, no compiler), where the fused model is
cut, the max abs error and centered cosine of the fused and stock models against the float
export on the report's check inputs, the int8 rules that fired, the float ops left, and the
wall seconds. A refusal is a row with its one line.

Writes benchmarks/out/vit_edgetpu.json (rows reused by `--cached`; without `--fresh` a row
already measured for the same file and tree label is kept) and the section "ViT-style
classifiers that stopped early" of benchmarks/ATTENTION_EDGETPU.md (that section only; the rest
of the file is benchmarks/attention_edgetpu.py's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out" / "vit_edgetpu.json"
DOC = HERE / "ATTENTION_EDGETPU.md"
SECTION = "## ViT-style classifiers that stopped early"
MODELS = ("efficientformer_l1", "mobilevit_xxs", "edgenext_xx_small")
ROUTES = ("litert", "onnx2tf26")
INT8_RULES = ("MovePatchesInShownForms", "LegalizeGeluInt8", "SplitHeadsInWindows")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def convert(tree: Path, path: Path, work: Path) -> dict[str, Any]:
    """One conversion with `tree` first on PYTHONPATH: the report's numbers, or the refusal."""
    out = work / f"{path.stem}.{tree.name}"
    calib = path.with_suffix(".calib.npy")
    cmd = [sys.executable, "-m", "tflfuse.cli", "convert", str(path), "--recipe", "edgetpu",
           "-o", str(out), "--force"]  # fmt: skip
    if calib.is_file():
        cmd += ["--calib", str(calib)]
    env = {**os.environ, "PYTHONPATH": str(tree), "TF_CPP_MIN_LOG_LEVEL": "3"}
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    seconds = round(time.perf_counter() - start, 1)
    report_path = out / "report.json"
    if done.returncode != 0 or not report_path.is_file():
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        return {"error": (lines[-1] if lines else f"exit {done.returncode}")[:300],
                "seconds": seconds}  # fmt: skip
    return summarize(json.loads(report_path.read_text()), seconds)


def _agreement(report: dict, which: str) -> dict[str, float | None]:
    row = (report.get("agreement") or {}).get(which) or {}
    outs = row.get("outputs") or [{}]
    return {"max_abs": row.get("max_abs"), "cosine": outs[0].get("cosine")}


def summarize(report: dict, seconds: float) -> dict[str, Any]:
    edgetpu = report.get("edgetpu") or {}
    fused, stock = edgetpu.get("fused") or {}, edgetpu.get("stock") or {}
    fired = (report.get("legalization") or {}).get("fired") or {}
    quant = report.get("quantization") or {}
    return {
        "seconds": seconds,
        "fused": [fused.get("mapped"), fused.get("ops")],
        "stock": [stock.get("mapped"), stock.get("ops")],
        "cut": {k: (fused.get("cut") or {}).get(k) for k in ("index", "op", "reason")},
        "other_readings": [r.get("mapped") for r in fused.get("other_readings") or []],
        "fused_error": _agreement(report, "fused"),
        "stock_error": _agreement(report, "stock"),
        "int8_fired": {r: fired.get(r, 0) for r in INT8_RULES if fired.get(r)},
        "float_ops_left": quant.get("float_ops_left"),
    }


def default_files(corpus: Path) -> list[Path]:
    return [corpus / f"{m}.{r}.tflite" for m in MODELS for r in ROUTES]


def measure(files: list[Path], trees: dict[str, Path], rows: dict, fresh: bool) -> dict:
    """Convert each file with each tree in a temporary folder of its own (removed after: the
    figures are kept in OUT, the models are not)."""
    with tempfile.TemporaryDirectory(prefix="vit_edgetpu_") as tmp:
        work = Path(tmp)
        for path in files:
            if not path.is_file():
                log(f"{path.name}: not in the corpus")
                continue
            for label, tree in trees.items():  # before and after, alternating per model
                key = f"{path.name}|{label}"
                if key in rows and not fresh:
                    continue
                log(f"{path.name}: {label} ({tree})")
                rows[key] = {"file": path.name, "tree": label, **convert(tree, path, work)}
                log(json.dumps(rows[key])[:400])
                OUT.parent.mkdir(exist_ok=True)
                OUT.write_text(json.dumps(rows, indent=1))
    return rows


def _mapped(pair: list | None) -> str:
    return "-" if not pair or pair[0] is None else f"{pair[0]}/{pair[1]}"


def _err(e: dict | None) -> str:
    if not e or e.get("max_abs") is None:
        return "-"
    cos = e.get("cosine")
    return f"{e['max_abs']:.3g} / {cos:.4f}" if cos is not None else f"{e['max_abs']:.3g}"


def _cut(row: dict) -> str:
    cut = row.get("cut") or {}
    return "no cut" if cut.get("op") is None else f"op {cut['index']} {cut['op']}"


def section(rows: dict) -> list[str]:
    lines = [
        SECTION,
        "",
        "Written by benchmarks/vit_edgetpu.py: `tflfuse convert --recipe edgetpu --calib",
        "X.calib.npy` on the corpus's float exports (random weights, image-like calibration),",
        "before (main) and after (this branch: a float GELU left to its int8 form is no cut for",
        "the float legalizations; MovePatchesInShownForms; QuantizeL2Normalization), alternating.",
        "Mapped: tflfuse's prediction, one Edge TPU segment, compiler 16 (no device, no",
        "compiler). Error: max abs / centered cosine against the float export on the report's",
        "check inputs.",
        "",
        "| file | tree | stock mapped | fused mapped | fused cut at | stock error | fused error"
        " | int8 rules fired | float ops left | s |",
        "|---|---|---:|---:|---|---:|---:|---|---|---:|",
    ]
    for key in sorted(rows, key=lambda k: (rows[k]["file"], rows[k]["tree"] != "before")):
        r = rows[key]
        if "error" in r:
            lines.append(f"| {r['file']} | {r['tree']} | refused: {r['error']} |")
            continue
        fired = ", ".join(f"{k} x{v}" for k, v in r["int8_fired"].items()) or "-"
        left = ", ".join(r.get("float_ops_left") or []) or "-"
        lines.append(
            f"| {r['file']} | {r['tree']} | {_mapped(r['stock'])} | {_mapped(r['fused'])}"
            f" | {_cut(r)} | {_err(r['stock_error'])} | {_err(r['fused_error'])} | {fired}"
            f" | {left} | {r['seconds']} |"
        )
    return lines


def write(rows: dict, notes: list[str]) -> None:
    text = DOC.read_text() if DOC.is_file() else ""
    head = text.split(SECTION)[0].rstrip()
    tail = ""
    if SECTION in text:
        rest = text.split(SECTION, 1)[1]
        nxt = rest.find("\n## ")
        tail = rest[nxt:].rstrip() if nxt >= 0 else ""
    body = "\n".join([*section(rows), *(line for note in notes for line in ("", note))])
    DOC.write_text("\n\n".join(p for p in (head, body, tail.strip()) if p) + "\n")
    print(body)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--before", type=Path, help="the tflfuse tree to compare with (e.g. main)")
    ap.add_argument("--corpus", type=Path, default=Path(os.environ.get("TFLFUSE_CORPUS",
                                                                    "/work/corpus")))  # fmt: skip
    ap.add_argument("--cached", action="store_true", help="render the stored rows only")
    ap.add_argument("--fresh", action="store_true", help="measure rows already stored too")
    ap.add_argument("--note", action="append", default=[], help="a paragraph under the table")
    args = ap.parse_args(argv)
    rows = json.loads(OUT.read_text()) if OUT.is_file() else {}
    if not args.cached:
        trees = {"before": args.before, "after": ROOT} if args.before else {"after": ROOT}
        rows = measure(args.files or default_files(args.corpus), trees, rows, args.fresh)
    write(rows, args.note)


if __name__ == "__main__":
    main(sys.argv[1:])
