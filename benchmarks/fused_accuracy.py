#!/usr/bin/env python3
"""Fused against stock, faithful to the float export: the error of `convert --recipe edgetpu`
made by two trees (before and after a change), beside stock's, on more inputs than
YOLO_EDGETPU.md's 8, with the spread of that table's figure.

    /work/main/.venv/bin/python benchmarks/fused_accuracy.py --before /work/main --after . \
        [--only yolo11n-320.litert ...] [--eval 32] [--out DIR] [--md benchmarks/FUSED_ACCURACY.md]

For every float export named (the corpus `benchmarks/attention_corpus.py` builds, default
/work/corpus), `tflfuse convert X.tflite --recipe edgetpu --calib X.calib.npy
--accept-accuracy-loss` runs in a child whose working directory is the tree (`python -m`
puts it first on sys.path, so each tree's own tflfuse converts), before and after in turn for
each model (interleaved). Each convert writes its stock model too (litert-quantizer's int8 of
the same float export: the same in both trees unless the change touches it, which the table
shows). Measured on `--eval` image-like inputs calibration never saw (seed 99,
`yolo_edgetpu.eval_inputs`; the first 8 are YOLO_EDGETPU.md's):

  max, first 8     largest |output - float output| on the first 8 (YOLO_EDGETPU.md's figure)
  max per 8        the same figure on each further block of 8 inputs: how much it moves when
                   only the inputs change (the spread of a maximum over 8 x outputs elements)
  max, all         over all `--eval` inputs
  p99.99           the 99.99th percentile of |error| over every output element of every input
  rms              root mean square error over the float output's root mean square
  cosine           the worst over inputs and outputs

and the Edge TPU mapping tflfuse's predictor gives in one segment (mapped/total; predicted,
not compiled). Paired against stock (always): per input, the largest |error| and the rms error
of each fused model minus stock's, their mean with its standard error, and on how many inputs
the fused model is the closer (a maximum over 8 inputs moves with the inputs by more than most
gaps: the paired means decide). `--tensors`: also the per-tensor table (error at the float
export's tensors each int8 model holds; every tensor of each model kept for 4 inputs, so only
under `TENSOR_BUDGET` of float activations). Converts are cached in `--out` (per tree: the
models and the figures, keyed by the float file's, its calibration's and the tree's package
sha256). Writes the markdown and `--out`/fused_accuracy.json. Accuracy only: no timing claim.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import yolo_edgetpu  # noqa: E402  (eval inputs, running a model, placement)

from tflfuse.ir import flatbuffer  # noqa: E402
from tflfuse.quantize.layer_error import activation_bytes  # noqa: E402

CORPUS = Path(os.environ.get("TFLFUSE_CORPUS") or "/work/corpus")
# Float activations up to which the per-tensor table is made (a 640-px YOLO26n's 305 MiB, kept
# for four models on four inputs, ran this machine out of memory)
TENSOR_BUDGET = 128 << 20
MODELS = [
    "yolo11n-320.litert",
    "yolo11n-pose-320.litert",
    "yolo26n-320.edgetpu-float32",
    "efficientformer_l1.litert",
    "mobilenet_v3_large.onnx2tf26",
]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def tree_hash(tree: Path) -> str:
    """sha256 over the tree's tflfuse package (names and bytes of its source and data files)."""
    h = hashlib.sha256()
    root = tree / "tflfuse"
    for f in sorted(root.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def convert(tree: Path, side: Path, out: Path) -> tuple[int, str]:
    """`tflfuse convert` of `side`'s float export with `tree`'s tflfuse into `out`: (exit
    code, last stderr line)."""
    src, calib = side.with_suffix(".tflite"), side.with_suffix(".calib.npy")
    cmd = ["nice", sys.executable, "-m", "tflfuse.cli", "convert", str(src), "--recipe"]
    cmd += ["edgetpu", "--calib", str(calib), "-o", str(out), "--force", "--accept-accuracy-loss"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stderr.replace("\r", "\n").splitlines() if ln.strip()]
    return proc.returncode, (lines or [""])[-1][:300]


def figures(ref: list, got: list) -> dict[str, Any]:
    """The module docstring's figures of `got` against `ref` (per input: lists of outputs)."""
    per = [yolo_edgetpu.errors([r], [g]) for r, g in zip(ref, got)]
    if any("error" in p for p in per):
        return {"error": next(p["error"] for p in per if "error" in p)}
    diffs = [np.abs(g[0] - r[0]).ravel() for r, g in zip(ref, got)]
    e = np.concatenate(diffs)
    r = np.concatenate([r[0].ravel() for r in ref])
    maxima = [float(d.max()) for d in diffs]
    blocks = [max(maxima[i : i + 8]) for i in range(0, len(maxima), 8)]
    return {
        "max8": yolo_edgetpu.errors(ref[:8], got[:8])["max_abs"],
        "blocks": blocks,
        "max": max(p["max_abs"] for p in per),
        "p9999": float(np.quantile(e, 0.9999)),
        "rms": float(np.sqrt((e**2).mean() / max((r**2).mean(), 1e-24))),
        "cosine": min(p["cosine"] for p in per),
    }


def measured(path: Path, ref: list, xs: np.ndarray) -> dict[str, Any]:
    place = yolo_edgetpu.placement(path)
    result = figures(ref, yolo_edgetpu.run_model(path, xs))
    return {**result, "mapped": place["mapped"], "total": place["total"]}


def one(tree: Path, label: str, side: Path, args: argparse.Namespace, ref, xs) -> dict:
    """One tree's convert of one model, measured (cached in `args.out`)."""
    src = side.with_suffix(".tflite")
    files = (src, side.with_suffix(".calib.npy"))
    key = "-".join([yolo_edgetpu.file_hash(f)[:16] for f in files] + [tree_hash(tree)[:16]])
    key += f"-e{args.eval}"
    folder = args.out / f"{side.stem}.{label}"
    cache = folder / "figures.json"
    if cache.is_file() and json.loads(cache.read_text()).get("key") == key:
        log(f"{side.stem} {label}: cached")
        return json.loads(cache.read_text())
    log(f"{side.stem} {label}: convert with {tree}")
    code, last = convert(tree, side, folder / "convert")
    row: dict[str, Any] = {"key": key, "tree": str(tree)}
    if code != 0:
        row["convert_error"] = last
    else:
        row["fused"] = measured(folder / "convert" / "model.tflite", ref, xs)
        row["stock"] = measured(folder / "convert" / "model_stock.tflite", ref, xs)
    cache.write_text(json.dumps(row, indent=1) + "\n")
    return row


def _tensor_values(path: Path, xs: np.ndarray) -> dict[str, np.ndarray]:
    """Every float or int8 tensor of `path` (dequantized) on each input, by name."""
    from tflfuse.device.interpreter import make_interpreter

    it = make_interpreter(path.read_bytes(), delegate="none", keep_all=True)
    inp = it.get_input_details()[0]
    details = it.get_tensor_details()
    values: dict[str, list[np.ndarray]] = {}
    for x in xs:
        it.set_tensor(inp["index"], yolo_edgetpu.as_input(x[None], inp))
        it.invoke()
        for d in details:
            try:
                v = it.get_tensor(d["index"])
            except ValueError:
                continue
            if v is None or not v.size or d["dtype"] not in (np.float32, np.int8, np.uint8):
                continue
            v = np.asarray(v, np.float32)
            if d["dtype"] != np.float32:
                scale, zero = d["quantization"]
                if not scale:
                    continue
                v = (v - zero) * scale
            values.setdefault(d["name"], []).append(v)
    return {
        k: np.stack(v)
        for k, v in values.items()
        if len(v) == len(xs) and len({a.shape for a in v}) == 1
    }


def attribution(side: Path, models: dict[str, Path], n: int = 4) -> list[dict[str, Any]]:
    """Per tensor of the float export (in op order) that every model in `models` also holds
    under its name and shape: each model's error there, rms over the float tensor's rms, on
    the first `n` inputs. Where the fused model's rule-written ops replace a tensor it is
    absent, so the rows are the points where the graphs agree."""
    src = side.with_suffix(".tflite")
    xs = yolo_edgetpu.eval_inputs(json.loads(side.read_text()), n)
    ref = _tensor_values(src, xs)
    got = {label: _tensor_values(path, xs) for label, path in models.items()}
    rows = []
    for op in flatbuffer.load(src).main.ops:
        for t in op.outputs:
            r = ref.get(t.name)
            if r is None or any(g.get(t.name, r[:0]).shape != r.shape for g in got.values()):
                continue
            rms = float(np.sqrt((r.astype(np.float64) ** 2).mean())) or 1e-12
            errors = {
                k: float(np.sqrt(((g[t.name] - r) ** 2).mean())) / rms for k, g in got.items()
            }
            rows.append({"tensor": t.name, "shape": list(r.shape[1:]), **errors})
    return rows


def attribution_lines(stem: str, rows: list[dict[str, Any]], labels: list[str]) -> list[str]:
    """The tensors where a fused model's error first exceeds stock's by over 2%, and at the
    outputs: a table per model."""
    out = [f"### {stem}", "", "| tensor | shape | " + " | ".join(labels) + " |"]
    out.append("|---|---|" + "---|" * len(labels))
    shown = 0
    for i, row in enumerate(rows):
        worse = any(row[k] > 1.02 * row["stock"] for k in labels if k != "stock")
        if (worse and shown < 6) or i >= len(rows) - 2:
            shown += worse
            cells = " | ".join(f"{row[k]:.4f}" for k in labels)
            out.append(f"| `{row['tensor'][-60:]}` | {row['shape']} | {cells} |")
    return [*out, ""]


def per_input(path: Path, ref: list, xs: np.ndarray) -> dict[str, Any]:
    """Per input: the largest |error| and the rms error over the float output's rms, of the
    float export's first output against the model's first output of its shape (a converted
    model may order its outputs otherwise: `yolo_edgetpu.errors` pairs them so too); or
    {"error": line} where the interpreter fails or no output has that shape."""
    try:
        got = yolo_edgetpu.run_model(path, xs)
    except (RuntimeError, ValueError) as exc:
        line = str(exc).strip().splitlines()
        return {"error": (line[0] if line else type(exc).__name__)[:120]}
    maxima, rms = [], []
    for r_row, g_row in zip(ref, got):
        r = r_row[0]
        g = next((y for y in g_row if y.shape == r.shape), None)
        if g is None:
            return {"error": f"no output of shape {list(r.shape)}"}
        d = g - r
        maxima.append(float(np.abs(d).max()))
        rms.append(float(np.sqrt((d**2).mean() / max((r**2).mean(), 1e-24))))
    return {"max": maxima, "rms": rms}


def paired(a: dict[str, Any], b: dict[str, Any], key: str) -> tuple[float, float, int, int]:
    """Mean and standard error of a[key] - b[key] over inputs (`per_input`'s figures), inputs
    where a is the closer, inputs."""
    d = np.array(a[key]) - np.array(b[key])
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
    return float(d.mean()), se, int(np.sum(d < 0)), len(d)


def paired_lines(models: list[dict[str, Any]]) -> list[str]:
    """Per model and fused tree: the mean over inputs of (fused - stock) for the per-input
    largest error and rms error, with its standard error, and on how many inputs fused is
    the closer."""
    out = [
        "| model | tflfuse | max error - stock's (mean +- s.e.) | fused closer (max) |"
        " rms error - stock's (mean +- s.e.) | fused closer (rms) |",
        "|---|---|---|---|---|---|",
    ]
    for m in models:
        per = m.get("paired")
        if not per:
            continue
        for label in ("before", "after"):
            cells = []
            for key in ("max", "rms"):
                mean, se, closer, n = paired(per[label], per["stock"], key)
                cells.append(f"{mean:+.4f} +- {se:.4f} | {closer}/{n}")
            out.append(f"| {m['stem']} | {label} | {' | '.join(cells)} |")
    return out


def _cell(p: dict[str, Any]) -> str:
    if "error" in p:
        return f"fails: {p['error'][:60]} | | | | | |"
    blocks = ", ".join(f"{b:.3g}" for b in p["blocks"][1:])
    return (
        f"{p['mapped']}/{p['total']} | {p['max8']:.3g} | {blocks} | {p['max']:.3g} |"
        f" {p['p9999']:.3g} | {p['rms']:.4f} | {p['cosine']:.4f} |"
    )


def table(models: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | int8 model | mapped, one segment | max, first 8 | max per further 8 |"
        " max, all | p99.99 | rms | cosine |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in models:
        for label, row in (("before", m["before"]), ("after", m["after"])):
            head = f"| {m['stem']} |"
            if "convert_error" in row:
                lines.append(f"{head} tflfuse, {label} | convert failed: {row['convert_error']}")
                continue
            if label == "before" or row["stock"] != m["before"].get("stock"):
                lines.append(f"{head} stock ({label}'s tree) | {_cell(row['stock'])}")
            lines.append(f"{head} tflfuse, {label} | {_cell(row['fused'])}")
    return lines


WHERE_HEAD = [
    "## Where the error grows (per tensor, first 4 inputs)",
    "",
    "Error of each int8 model at the tensors of the float export it holds too (same name and"
    " shape), rms over the float tensor's rms: the first tensors where a fused model is over 2%"
    " worse than stock, and the last two (the outputs). Stock: the before tree's.",
    "",
]
# What the tables show, per model (measured: this table, the paired one, FLOAT_ISLANDS.md)
CAUSES = [
    "- EfficientFormer-L1 (the row where the paired gap was several standard errors): its"
    " error first exceeded stock's at the first GELU and grew at every one. `LegalizeGeluInt8`"
    " wrote GELU as x sigma(1.702 x) (the table has no GELU), 0.02 off GELU near |x| = 2 (low on"
    " both sides: a bias), where y's step is 0.04 to 0.09 (0.009 at the last GELU). The rule"
    " now writes, where its codes are closer to the GELU kernel's over x's 256 codes, the"
    " cubic form sigma(x (a + b min(x^2, 9))): the tanh form's argument, its x^2 saturating at"
    " 9 and its argument at +-6.5 (past them LOGISTIC's int8 output is its end code), each new"
    " tensor on the image of x's range (3 more mapped ops per GELU; tests/"
    "test_edgetpu_gelu_forms.py: 0.44x the sloped form's rms distance to the kernel on +-10,"
    " 0.64x on the narrow last one, the same on the int8 reference kernels). Paired over 32"
    " inputs, the rms gap to stock went +0.0067 +- 0.0022 -> -0.0048 +- 0.0021 (fused the"
    " closer on 24 of 32) and the largest error's +0.0092 +- 0.0032 -> -0.0023 +- 0.0042;"
    " after - before: rms -0.0116 +- 0.0021, after the closer on 28 of 32. Mapped: 617/620 ->"
    " 662/665 (the 3 left on the CPU as before).",
    "- MobileViT-XXS: `benchmarks/FLOAT_ISLANDS.md` (families of ops run in float, paired):"
    " stock's and the fused model's error against the float export are the same size, and"
    " about 40% of each is LayerNorm's variance: (x - mean)^2 is quantized over [0, 152]"
    " (calibration's largest square; scale 0.6, where the median square is 0.04) and its row"
    " mean over [0, 16] (scale 0.062 for a median variance of 0.075), so RSQRT reads one or"
    " two codes. Both spell LayerNorm the same way; the fix is a form that normalizes twice"
    " (not made here). Removing every rounding inside attention changes no output code:"
    " with random weights the transformer branches add too little to the residual to move"
    " its int8 steps, so this export cannot show attention's error. Per input the fused model"
    " is as close as stock (paired: largest error -0.0002 +- 0.0011, rms -0.0013 +- 0.0054);"
    " the 8-input maximum (0.0877 against 0.0754) is one draw of a figure that moves as much"
    " with the inputs (stock's: 0.0545 to 0.0754 over the four blocks of 8).",
    "- DeiT-tiny (litert): fused and stock are within two standard errors of each other"
    " before and after (the cubic GELU, on its 12 GELUs, changes its rms error by +0.0015 +-"
    " 0.0021: no difference measured); mapped 6930/6930 -> 6966/6966. `FLOAT_ISLANDS.md` (16"
    " inputs): LayerNorm's variance is 0.20 of both models' 0.52 to 0.53 rms error, and"
    " attention's roundings 0.040 +- 0.007 of stock's against 0.057 +- 0.009 of the fused"
    " model's: the products of two activations rounded one by one (`attention.py`) are what"
    " the fused model adds.",
    "- YOLO11n-320 (control: no GELU, no LayerNorm): the same model before and after.",
]


def render(models: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    labels = ["stock", "before", "after"]
    where = [
        ln
        for m in models
        if m.get("tensors")
        for ln in attribution_lines(m["stem"], m["tensors"], labels)
    ]
    return "\n".join(
        [
            "# Fused against stock, faithful to the float export (before and after)",
            "",
            f"Generated by `{meta['command']}` in {meta['minutes']:.1f} min{meta['source']} on"
            f" {meta['corpus']}"
            f" (random weights, `benchmarks/attention_corpus.py`). Before: {meta['before']}"
            f" (package {meta['before_hash'][:12]}); after: {meta['after']} (package"
            f" {meta['after_hash'][:12]}). {meta['eval']} image-like inputs calibration never"
            " saw (seed 99; the first 8 are YOLO_EDGETPU.md's). Columns: this script's"
            " docstring. Stock is litert-quantizer's int8 of the same float export (shown once"
            " when both trees make the same).",
            "",
            *table(models),
            "",
            "## Paired against stock (per input)",
            "",
            "The same inputs through stock and each fused model: the mean over the inputs of"
            " the fused model's error minus stock's (negative: closer to the float export), its"
            " standard error, and on how many inputs the fused model is the closer. Largest"
            " |error| and rms error (over the float output's rms) of the first output, per input.",
            "",
            *paired_lines(models),
            "",
            *(["## Causes", "", *CAUSES, ""] if meta.get("causes", True) else []),
            *(WHERE_HEAD + where if where else []),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a tflfuse checkout")
    parser.add_argument("--after", type=Path, required=True, help="a tflfuse checkout")
    parser.add_argument("--names", nargs=2, help="what the two trees are (e.g. their commits)")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--only", nargs="*", default=MODELS, help="float exports' stems")
    parser.add_argument("--eval", type=int, default=32, help="image-like inputs")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "fused_accuracy")
    parser.add_argument("--md", type=Path, default=HERE / "FUSED_ACCURACY.md")
    parser.add_argument("--tensors", action="store_true", help="per-tensor attribution too")
    parser.add_argument(
        "--rendered-from",
        type=Path,
        help="render the markdown from an earlier run's fused_accuracy.json (nothing measured)",
    )
    parser.add_argument(
        "--no-causes",
        action="store_true",
        help="leave out the Causes section (it explains the cubic GELU's before and after)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    models = []
    if args.rendered_from is not None:
        models = json.loads(args.rendered_from.read_text())
        args.only = []
    for stem in args.only:
        side = args.corpus / f"{stem}.json"
        (args.out / f"{stem}.before").mkdir(parents=True, exist_ok=True)
        (args.out / f"{stem}.after").mkdir(parents=True, exist_ok=True)
        xs = yolo_edgetpu.eval_inputs(json.loads(side.read_text()), args.eval)
        ref = yolo_edgetpu.run_model(side.with_suffix(".tflite"), xs)
        before = one(args.before.resolve(), "before", side, args, ref, xs)
        after = one(args.after.resolve(), "after", side, args, ref, xs)
        entry = {"stem": stem, "before": before, "after": after}
        made = {
            "stock": args.out / f"{stem}.before" / "convert" / "model_stock.tflite",
            "before": args.out / f"{stem}.before" / "convert" / "model.tflite",
            "after": args.out / f"{stem}.after" / "convert" / "model.tflite",
        }
        if all(p.is_file() for p in made.values()):
            entry["paired"] = {k: per_input(p, ref, xs) for k, p in made.items()}
        if args.tensors and all(p.is_file() for p in made.values()):
            held = activation_bytes(flatbuffer.load(side.with_suffix(".tflite")))
            if held <= TENSOR_BUDGET:  # every tensor of 4 models on 4 inputs, kept at once
                entry["tensors"] = attribution(side, made)
            else:
                entry["tensors_skipped"] = f"{held / 2**20:.0f} MiB of float activations"
        models.append(entry)
        (args.out / "fused_accuracy.json").write_text(json.dumps(models, indent=1) + "\n")
    meta = {
        "command": "python benchmarks/fused_accuracy.py " + " ".join(argv or sys.argv[1:]),
        "minutes": (time.perf_counter() - started) / 60,
        "source": (
            f" (rendered from {args.rendered_from.name}, the figures an earlier run of this"
            " script measured on the same trees and inputs)"
            if args.rendered_from is not None
            else ""
        ),
        "corpus": str(args.corpus),
        "before": args.names[0] if args.names else str(args.before),
        "after": args.names[1] if args.names else str(args.after),
        "before_hash": tree_hash(args.before.resolve()),
        "after_hash": tree_hash(args.after.resolve()),
        "eval": args.eval,
        "causes": not args.no_causes,
    }
    args.md.write_text(render(models, meta))
    print(f"{len(models)} models -> {args.md} in {meta['minutes']:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
