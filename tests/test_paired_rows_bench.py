"""benchmarks/paired_rows.py: the paired gap, its standard error and the verdict it gives."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import benchmark_module


@pytest.fixture(scope="module")
def bench():
    return benchmark_module("paired_rows")


def _figures(rms: list[float]) -> dict[str, list[float]]:
    return {"rms": rms, "max": [10 * r for r in rms]}


def test_the_gap_is_paired_per_input(bench) -> None:
    """Inputs that move both models alike cancel: a constant 0.001 gap on inputs spread over
    0.1-0.9 is 'farther' with a zero standard error, which unpaired means would not see."""
    stock = list(np.linspace(0.1, 0.9, 16))
    fused = [s + 0.001 for s in stock]
    mean, se, closer, n = bench.paired(_figures(fused), _figures(stock), "rms")
    assert mean == pytest.approx(0.001) and se == pytest.approx(0.0, abs=1e-12)
    assert (closer, n) == (0, 16)
    assert bench.verdict(mean, se) == "farther"


def test_the_verdict_needs_two_standard_errors(bench) -> None:
    assert bench.verdict(-0.003, 0.001) == "closer"
    assert bench.verdict(-0.001, 0.001) == "as close"
    assert bench.verdict(0.0019, 0.001) == "as close"
    assert bench.verdict(0.0021, 0.001) == "farther"


def test_a_failing_stock_gives_no_verdict(bench) -> None:
    fig = {"fused": _figures([0.1, 0.2]), "stock": {"error": "div.cc:262 failed"}}
    line, verdict = bench.row_line("m.onnx2tf26", "abc", fig)
    assert verdict == "" and "fails: div.cc:262" in line and "(no stock)" in line
    fig = {"fused": _figures([0.1, 0.3]), "stock": _figures([0.2, 0.4])}
    line, verdict = bench.row_line("m.litert", "abc", fig)
    assert verdict == "closer" and "-0.1000 +- 0.0000 (2/2)" in line


def test_outputs_are_paired_by_shape(bench, tmp_path, monkeypatch) -> None:
    """A converted model that writes its outputs in another order is compared output to
    output of the same shape, not index to index (yolo26n-seg's onnx2tf rows did)."""
    ref = [[np.ones((1, 4, 6)), np.zeros((1, 8, 8, 2))]]
    got = [[np.zeros((1, 8, 8, 2)), np.full((1, 4, 6), 1.5)]]
    monkeypatch.setattr(bench.yolo_edgetpu, "run_model", lambda path, xs: got)
    fig = bench.per_input(tmp_path / "m.tflite", ref, np.zeros((1, 1)))
    assert fig == {"max": [0.5], "rms": [pytest.approx(0.5)]}
    got[0] = [np.zeros((1, 8, 8, 2))]
    assert bench.per_input(tmp_path / "m.tflite", ref, np.zeros((1, 1))) == {
        "error": "no output of shape [1, 4, 6]"
    }
