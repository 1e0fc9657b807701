"""benchmarks/yolo_edgetpu.py: how a converted model's outputs are paired with the float model's.

Exporters order outputs differently (onnx2tf's int8 file lists a segmentation model's boxes
before its masks where the float file lists masks first), so outputs are paired by shape; the
error must then be measured, never the pairing fail on arrays compared elementwise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import benchmark_module

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    return benchmark_module("yolo_edgetpu")


def test_outputs_in_another_order_are_paired_by_shape(bench):
    rng = np.random.default_rng(0)
    masks, boxes = rng.normal(size=(1, 8, 8, 4)), rng.normal(size=(1, 6, 21))
    off_boxes = boxes + 0.5
    result = bench.errors([[masks, boxes]], [[off_boxes, masks]])
    assert result["max_abs"] == pytest.approx(0.5)
    assert result["rel"] == pytest.approx(0.5 / np.abs(boxes).max())


def test_an_output_of_no_matching_shape_is_reported(bench):
    result = bench.errors([[np.zeros((1, 3))]], [[np.zeros((1, 4))]])
    assert result == {"error": "no output of shape [1, 3]"}


def _placed(mapped: int) -> dict:
    return {
        "mapped": mapped, "total": 100, "other_readings": [], "mapped_a": mapped,
        "segments_a": 1, "crossings": [2, 4096], "crossings_a": [2, 4096], "refused": [],
        "error": {"max_abs": 1.5, "rel": 0.1, "cosine": 0.25},
    }  # fmt: skip


def test_a_refused_convert_is_measured_again_on_a_row_of_its_own(bench):
    """A convert refused as useless keeps its refusal line (with stock's figure); the model
    `--accept-accuracy-loss` keeps is a separate row, labelled so, never the `tflfuse` row."""
    refusal = (
        "tflfuse: error: model.tflite: output 'y' gives another class than the source model on"
        " all 8 check inputs (top-1 agreement 0.000; stock int8: top-1 agreement 0.000, fails"
        " the same way): nothing written (--accept-accuracy-loss keeps the model)"
    )
    row = {"model": "m", "route": "r", "file": "m.tflite", "input": "[1, 3, 8, 8]"}
    row |= {"convert_error": refusal, "stock": _placed(90), "accepted": _placed(95)}
    row |= {"accepted_s": 12.5, "accepted_rss_mib": 700}
    lines = bench.table_lines([row])
    labels = [line.split(" | ")[2] for line in lines[2:]]
    assert labels == ["stock", "tflfuse", "tflfuse, --accept-accuracy-loss"]
    assert "refused: model.tflite: output 'y' gives another class" in lines[3]
    assert "95/100" in lines[4] and "cos 0.250" in lines[4] and "12.5 / 700" in lines[4]
    assert "tflfuse, --accept-accuracy-loss 95/100" in bench.summary(row)


def test_measure_converts_a_refused_model_again_with_the_flag(bench, tmp_path, monkeypatch):
    """The first convert is refused as useless: the second, with --accept-accuracy-loss, goes
    to its own folder, and its models are measured as `stock` and `accepted` (never `fused`)."""
    import json

    side = tmp_path / "m.litert.json"
    side.write_text(json.dumps({"model": "m", "route": "litert", "input_shape": [1, 3, 8, 8]}))
    for suffix in (".tflite", ".calib.npy"):
        side.with_suffix(suffix).write_bytes(b"x")
    calls = []

    def convert(src, calib, out, extra=()):
        calls.append((out.name, tuple(extra)))
        if not extra:
            return 1.0, 2**20, 2, "tflfuse: error: ... (--accept-accuracy-loss keeps the model)"
        out.mkdir(parents=True)
        (out / "report.json").write_text("{}")
        for name in ("model.tflite", "model_stock.tflite"):
            (out / name).write_bytes(b"x")
        return 3.0, 2**21, 0, ""

    monkeypatch.setattr(bench, "convert_child", convert)
    monkeypatch.setattr(bench, "eval_inputs", lambda info, n: None)
    monkeypatch.setattr(bench, "run_model", lambda path, xs: [])
    monkeypatch.setattr(bench, "row_key", lambda side, n: "k")
    monkeypatch.setattr(
        bench, "column", lambda who, path, *a: {"who": who, "dir": path.parent.name}
    )
    row = bench.measure(side, tmp_path / "out", 2)
    assert calls == [("m.litert", ()), ("m.litert.accepted", ("--accept-accuracy-loss",))]
    assert row["convert_error"].endswith("keeps the model)") and "fused" not in row
    assert row["accepted"] == {"who": "accepted", "dir": "m.litert.accepted"}
    assert row["stock"]["dir"] == "m.litert.accepted" and row["accepted_s"] == 3.0


def test_rows_of_an_older_package_are_named_not_passed_off_as_the_headers(bench):
    current, older = "a" * 64, "b" * 64
    rows = [
        {"model": "m1", "route": "litert-torch", "key": f"f1-f2-{current[:20]}-e8"},
        {"model": "m2", "route": "litert-torch", "key": f"f3-f4-{older[:20]}-e8"},
    ]
    lines = bench.provenance_lines(rows, current)
    assert lines[1:] == [
        f"Measured on tflfuse package {older[:12]}, not the header's: m2 / litert-torch."
    ]
    assert bench.provenance_lines(rows[:1], current) == []
    labelled = bench.provenance_lines(rows, current, {older[:12]: "main at abc1234"})
    assert labelled[1].startswith(f"Measured on tflfuse package {older[:12]} (main at abc1234),")


def test_the_parameters_streamed_every_inference_have_a_column(bench):
    """Mapped is not fast when the parameters stream: each line gives the predicted Edge TPU
    parameters and the part streamed, `-` for a row measured before they were recorded, and
    every line of the table has the header's number of cells."""
    heavy = _placed(100) | {"parameter_bytes": 777 * 2**20, "streamed_bytes": 769 * 2**20}
    row = {"model": "m", "route": "r", "file": "m.tflite", "input": "[1, 3, 8, 8]"}
    row |= {"stock": _placed(90), "fused": heavy, "convert_error": ""}
    lines = bench.table_lines([row])
    assert [line.count("|") for line in lines] == [lines[0].count("|")] * len(lines)
    stock, fused = lines[2].split(" | "), lines[3].split(" | ")
    assert stock[7] == "-" and fused[7] == "777.0 (769.0)"
