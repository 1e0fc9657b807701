#!/usr/bin/env python3
"""Attention on the Edge TPU: predicted mapped ops and int8 error, with and without the
legalization of the product of two activations (tflfuse/targets/edgetpu/attention.py).

    .venv/bin/python benchmarks/attention_edgetpu.py                  # encoder, Keras MHA, corpus
    .venv/bin/python benchmarks/attention_edgetpu.py A.tflite B.tflite  # these files only
    ATTENTION_KERAS=1 .venv/bin/python benchmarks/attention_edgetpu.py A.tflite  # and Keras MHA

Models: the litert-torch export of PyTorch's TransformerEncoderLayer (../shared/models/pytorch/
encoder.tflite), a Keras MultiHeadAttention block built here (random weights, seed 0), and every
float .tflite in the corpus folder (`$TFLFUSE_CORPUS`, default ../corpus beside the checkout:
YOLO11/YOLO26 and timm ViTs exported there, see its README). Calibration: `X.calib.npy` beside
`X.tflite` when present (the corpus's image-like samples), else image-like samples for an image
input (smooth random fields in [0, 1]) or normal noise for token inputs.

Each model is converted twice with `--recipe edgetpu`: as shipped ("on") and with
LegalizeActivationMatmul and LegalizeComputedFullyConnected disabled ("off"). For each: the
fused model's predicted placement (tflfuse's predictor, compiler 16, one Edge TPU subgraph; no
device), where it is cut, the max abs error of fused and stock against the float model (the
report's agreement), and the wall time of the conversion. Writes benchmarks/ATTENTION_EDGETPU.md
and benchmarks/out/attention_edgetpu.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import tflfuse  # noqa: E402
from tflfuse.ir import flatbuffer  # noqa: E402
from tflfuse.targets.edgetpu.predict import _single_segment, edgetpu_statuses  # noqa: E402

SHARED = Path(os.environ.get("TFLFUSE_SHARED") or HERE.parent.parent / "shared")
CORPUS = Path(os.environ.get("TFLFUSE_CORPUS") or HERE.parent.parent / "corpus")
RULES = ("LegalizeActivationMatmul", "LegalizeComputedFullyConnected")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def keras_mha_model() -> tuple[Any, np.ndarray]:
    """A MultiHeadAttention block on 16 tokens of 32 features (seed 0), and 32 calibration
    samples (tests/test_edgetpu_attention.py converts the same block)."""
    import keras

    keras.utils.set_random_seed(0)
    layers = keras.layers
    inputs = keras.Input((16, 32))
    x = layers.Dense(32)(inputs)
    x = layers.Add()([x, layers.MultiHeadAttention(num_heads=4, key_dim=8)(x, x)])
    x = layers.LayerNormalization()(x)
    outputs = layers.Dense(10)(layers.GlobalAveragePooling1D()(x))
    calib = np.random.default_rng(0).normal(0.0, 1.0, (32, 16, 32)).astype(np.float32)
    return keras.Model(inputs, outputs), calib


def keras_mha(folder: Path) -> tuple[Path, np.ndarray]:
    """`keras_mha_model`, saved as .keras."""
    model, calib = keras_mha_model()
    path = folder / "keras_mha.keras"
    model.save(path)
    return path, calib


def calibration_for(path: Path) -> np.ndarray:
    """The model's own samples beside it, else image-like fields or token noise."""
    own = path.with_suffix(".calib.npy")
    if own.is_file():
        return np.load(own)
    shape = tuple(flatbuffer.load(path).main.inputs[0].shape[1:])
    rng = np.random.default_rng(0)
    if len(shape) == 3 and 3 in (shape[0], shape[-1]):
        coarse = rng.uniform(0.0, 1.0, (16, *[max(1, s // 8) for s in shape]))
        fields = np.stack([_upsample(c, shape) for c in coarse])
        return fields.astype(np.float32)
    return rng.normal(0.0, 1.0, (16, *shape)).astype(np.float32)


def _upsample(coarse: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    reps = [s // c for s, c in zip(shape, coarse.shape, strict=True)]
    fine = np.kron(coarse, np.ones(reps))
    pad = [(0, s - f) for s, f in zip(shape, fine.shape, strict=True)]
    return np.pad(fine, pad, mode="edge")


def float_models() -> list[Path]:
    found = []
    for path in sorted(CORPUS.rglob("*.tflite")) if CORPUS.is_dir() else []:
        try:
            g = flatbuffer.load(path).main
        except Exception:  # a file the loader refuses is reported by the corpus, not here
            continue
        if g.inputs and g.inputs[0].dtype == "FLOAT32" and "int8" not in path.name:
            found.append(path)
    return found


def measure(model: Any, calib: np.ndarray, disabled: tuple[str, ...], out: Path) -> dict:
    start = time.perf_counter()
    try:
        res = tflfuse.convert(model, out, recipe="edgetpu", calibration=calib, progress=False,
                              disabled=disabled, force=True)  # fmt: skip
    except Exception as exc:  # a refusal is a row of the table, not the end of the run
        return {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    seconds = time.perf_counter() - start
    report = res.report
    ungated = {name: _if_undecided_map(path) for name, path in (("fused", res.fused),
                                                                 ("stock", res.stock))}  # fmt: skip
    edgetpu, agreement = report.get("edgetpu", {}), report.get("agreement", {})
    fused, stock = edgetpu.get("fused", {}), edgetpu.get("stock", {})
    return {
        "seconds": round(seconds, 1),
        "fused_mapped": fused.get("mapped"),
        "fused_ops": fused.get("ops"),
        "fused_cut": (fused.get("cut") or {}).get("op"),
        "fused_if_undecided_map": ungated["fused"],
        "stock_mapped": stock.get("mapped"),
        "stock_if_undecided_map": ungated["stock"],
        "stock_ops": stock.get("ops"),
        "fused_error": (agreement.get("fused") or {}).get("max_abs"),
        "stock_error": (agreement.get("stock") or {}).get("max_abs"),
        "fired": {r: report["legalization"]["fired"].get(r, 0) for r in RULES}
        if "fired" in report.get("legalization", {})
        else {},
        "float_fired": {r: report.get("rules", {}).get("fired", {}).get(r, 0) for r in RULES},
    }


def _if_undecided_map(path: Path) -> int:
    """Ops mapped in one segment if every op of a form no compiled model shows maps (the op
    table alone, without the forms gate): the more favourable reading."""
    model = flatbuffer.load(path)
    mapped, _, _ = _single_segment(model.main, edgetpu_statuses(model))
    return sum(mapped)


def main(argv: list[str]) -> None:
    work = Path(tempfile.mkdtemp(prefix="attention_edgetpu_"))
    models: list[tuple[str, Any, np.ndarray]] = []
    paths = [Path(a) for a in argv] or [SHARED / "models" / "pytorch" / "encoder.tflite"]
    for path in paths:
        if path.is_file():
            calib = calibration_for(path)
            if path.name == "encoder.tflite" and calib.shape[1:] != (1, 32, 64):
                calib = np.random.default_rng(0).normal(0, 1, (32, 1, 32, 64)).astype(np.float32)
            models.append((path.stem, path, calib))
    if not argv or os.environ.get("ATTENTION_KERAS"):
        mha, calib = keras_mha(work)
        models.append(("keras_mha", mha, calib))
    if not argv:
        models += [(p.stem, p, calibration_for(p)) for p in float_models()]
    rows = []
    for name, model, calib in models:
        row: dict[str, Any] = {"model": name}
        for label, disabled in (("off", RULES), ("on", ())):
            log(f"{name}: legalization {label}")
            row[label] = measure(model, calib, disabled, work / f"{name}_{label}")
        rows.append(row)
        log(json.dumps(row))
    write(rows)


def _cell(m: dict, key: str) -> str:
    value = m.get(key)
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _mapped(m: dict, which: str) -> str:
    ops = m[f"{which}_ops"]
    return f"{m[f'{which}_mapped']}/{ops} / {m[f'{which}_if_undecided_map']}/{ops}"


def write(rows: list[dict]) -> None:
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "attention_edgetpu.json").write_text(json.dumps(rows, indent=1))
    lines = [
        "# Attention on the Edge TPU (benchmarks/attention_edgetpu.py)",
        "",
        "`tflfuse convert --recipe edgetpu`, with the product-of-activations legalization off",
        "(its two rules disabled) and on. Mapped: tflfuse's prediction for compiler 16, one Edge",
        "TPU subgraph (no device here). Errors: max abs against the float model (the report's",
        "agreement). Seconds: the whole conversion (three models, calibration, verification).",
        "",
        "Each mapped cell: the prediction (ops of a form no compiled model shows counted on the",
        "CPU: the less favourable reading) / if every such op maps (the op table alone).",
        "",
        "| model | stock mapped | off: mapped | off: cut at | on: mapped | on: cut at |"
        " stock error | off: error | on: error | on: s |",
        "|---|---:|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        off, on = row["off"], row["on"]
        if "error" in on or "error" in off:
            lines.append(f"| {row['model']} | {on.get('error') or off.get('error')} |")
            continue
        lines.append(
            f"| {row['model']} | {_mapped(on, 'stock')}"
            f" | {_mapped(off, 'fused')} | {off['fused_cut'] or 'no cut'}"
            f" | {_mapped(on, 'fused')} | {on['fused_cut'] or 'no cut'}"
            f" | {_cell(on, 'stock_error')} | {_cell(off, 'fused_error')}"
            f" | {_cell(on, 'fused_error')} | {_cell(on, 'seconds')} |"
        )
    (HERE / "ATTENTION_EDGETPU.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
