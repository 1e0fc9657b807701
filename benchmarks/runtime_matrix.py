#!/usr/bin/env python3
"""The runtime matrix: models x real interpreters, predicted `runtime_ok` against what the
interpreter does (load, allocate, invoke). Writes benchmarks/RUNTIMES.md.

    TFLFUSE_RUNTIMES=/path/to/venvs python benchmarks/runtime_matrix.py [--work DIR]

Models: the zoo's stock / unfused / fused conversions (`tflfuse convert`, TensorFlow 2.21; float
and int8 recipes; the transformer encoder carries Keras' GELU, which TF 2.21 writes as builtin
150), the transformer converted with `--runtime tflite-runtime==2.7.0`, the PyTorch exports in
../shared/models/pytorch and the Coral oracle's models (CPU and compiled twins). Runtimes: every
interpreter tests/runtime_kit.py finds (this environment's ai-edge-litert and TensorFlow, and the
venvs benchmarks/install_runtimes.py made). Each (model, runtime) is tried in a child process of
that runtime's Python (device_scripts/try_models.py), one model per process. Conversions are
kept in --work between runs (they take minutes); nothing is written into the checkout but the
table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import runtime_kit as kit  # noqa: E402

from tflfuse.errors import TflfuseError  # noqa: E402
from tflfuse.ir import flatbuffer  # noqa: E402
from tflfuse.targets import runtimes  # noqa: E402

# (zoo architecture, recipe, --runtime or None)
CONVERSIONS = (
    ("mobilenet_v2", "xnnpack-int8", None),
    ("ds_cnn", "edgetpu", None),
    ("yolo_style", "cpu-float", None),
    ("transformer_encoder", "cpu-float", None),
    ("transformer_encoder", "xnnpack-int8", None),
    ("transformer_encoder", "cpu-float", "tflite-runtime==2.7.0"),
    ("transformer_encoder", "xnnpack-int8", "tflite-runtime==2.7.0"),
)
SIZES = {"mobilenet_v2": 96, "yolo_style": 96}
MODEL_FILES = ("model_stock.tflite", "model_unfused.tflite", "model.tflite")
REFUSED: dict[str, str] = {}  # conversions `convert --runtime` refused (in one line)


def convert_zoo(work: Path) -> list[Path]:
    """The zoo conversions (cached in `work`): three models each."""
    import tflfuse
    from tflfuse.examples import zoo

    out = []
    for name, recipe, runtime in CONVERSIONS:
        tag = f"{name}__{recipe}" + (f"__for_{runtime.replace('==', '-')}" if runtime else "")
        folder = work / tag
        if not (folder / "model.tflite").is_file():
            kwargs = {"input_size": SIZES[name]} if name in SIZES else {}
            model = zoo.build(name, **kwargs)
            calib = zoo.sample_inputs(tuple(model.input_shape[1:]), n=32, seed=3)
            overrides = {"runtime": runtime} if runtime else {}
            print(f"converting {tag} ...", flush=True)
            try:
                tflfuse.convert(model, folder, recipe=recipe, calibration=calib, force=True,
                                progress=False, samples=32, **overrides)  # fmt: skip
            except TflfuseError as exc:  # a --runtime refusal is a result too
                REFUSED[tag] = str(exc)
                print(f"  refused: {exc}", flush=True)
                continue
        if (folder / "model.tflite").is_file():
            out += [folder / f for f in MODEL_FILES]
    return out


def shared_models() -> list[Path]:
    found = []
    for sub in ("models/pytorch", "oracle/edgetpu"):
        folder = kit.SHARED / sub
        found += sorted(folder.glob("*.tflite")) if folder.is_dir() else []
    return found


def label(path: Path, work: Path) -> str:
    try:
        return path.relative_to(work).as_posix()
    except ValueError:
        return path.relative_to(kit.SHARED).as_posix()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/tflfuse-runtime-matrix"))
    p.add_argument("-o", "--output", type=Path, default=HERE / "RUNTIMES.md")
    p.add_argument("--no-zoo", action="store_true", help="skip the zoo conversions")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    models = ([] if args.no_zoo else convert_zoo(args.work)) + shared_models()
    interps = [i for i in kit.installed() if i.name in runtimes.table().runtimes]
    interps.sort(key=lambda i: (runtimes.FAMILIES.index(i.family), runtimes.version_key(i.name)))
    rows, agree, total = [], 0, 0
    for path in models:
        model = flatbuffer.load(path)
        cells = []
        for interp in interps:
            predicted = runtimes.check(model, interp.name).runtime_ok
            real = kit.try_each(interp, [path])[str(path)]
            total += 1
            agree += predicted == real["ok"]
            cells.append((predicted, real))
        oldest = runtimes.oldest(model)["tflite-runtime"]
        rows.append((label(path, args.work), oldest, cells))
        print(f"{label(path, args.work)}: {''.join('+' if c[1]['ok'] else '-' for c in cells)}")
    args.output.write_text(render(rows, interps, agree, total, time.time() - started))
    print(f"{args.output}: {agree}/{total} predictions agree with the interpreters")
    return 0 if agree == total else 1


def render(rows: list, interps: list, agree: int, total: int, seconds: float) -> str:
    short = [i.name.replace("tflite-runtime==", "tfl-rt ").replace("ai-edge-litert==", "litert ")
             .replace("tensorflow==", "tf ") for i in interps]  # fmt: skip
    lines = [
        "# Runtime matrix: predicted `runtime_ok` vs the real interpreter",
        "",
        "Generated by `benchmarks/runtime_matrix.py` (interpreters from"
        " `benchmarks/install_runtimes.py`). Each cell: the prediction of `tflfuse check --runtime`"
        " (from `delegates/runtimes.toml`, no interpreter) and what the interpreter did with the"
        " model (load, allocate tensors, invoke on random inputs):",
        "`ok` both say it runs; `no` both say it does not; `MISS` they disagree (the cell says"
        " which way).",
        "",
        f"**{agree} of {total} predictions agree** ({len(rows)} models x {len(interps)} runtimes,"
        f" {seconds / 60:.0f} min). Python of each runtime: tflite-runtime 2.7-2.11 on 3.7,"
        " 2.12-2.14 on 3.8, ai-edge-litert 1.4/2.1 and TensorFlow/ai-edge-litert 2.3 on 3.11.",
        "",
        "| model | oldest tflite-runtime | " + " | ".join(short) + " |",
        "|---|---|" + "---|" * len(short),
    ]
    reasons: dict[str, str] = {}
    for name, oldest, cells in rows:
        out = []
        for predicted, real in cells:
            if predicted == real["ok"]:
                out.append("ok" if predicted else "no")
            else:
                out.append(f"MISS (predicted {'ok' if predicted else 'no'})")
            if not real["ok"]:
                reasons.setdefault(name, f"{real['stage']}: {real['error']}")
        oldest_text = oldest.partition("==")[2] if oldest else "none"
        lines.append(f"| {name} | {oldest_text} | " + " | ".join(out) + " |")
    if REFUSED:
        lines += ["", "## Conversions `convert --runtime` refused", ""]
        lines += [f"- `{tag}`: {why}" for tag, why in REFUSED.items()]
    lines += ["", "## What the interpreters said (first refusal per model)", ""]
    lines += [f"- `{name}`: {why}" for name, why in reasons.items()]
    lines += [
        "",
        "## Not measured here",
        "",
        "- tflite-runtime 2.5.0 (what Coral's pycoral 2.0 pins on Mendel) and 2.6.0: not on PyPI"
        " for these Pythons. Their rows in `delegates/runtimes.toml` are runtime_version.cc's"
        " entries for 2.5.0/2.6.0 (LiteRT's copy, commit cited in the file), which the measured"
        " releases found off by one release in both directions for 17 op versions (see"
        " [corrections]); treat 2.5/2.6 verdicts near those ops with that margin.",
        "- TensorFlow 2.15-2.20 and ai-edge-litert 1.0-1.3: no interpreter here (1.0-1.3 were built"
        " from TensorFlow's master and pin no source; they are not in the table).",
        "- The Edge TPU: compiled `_edgetpu` models need libedgetpu, absent here; every plain"
        " interpreter refuses them (`Encountered unresolved custom op: edgetpu-custom-op`), as"
        " predicted.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
