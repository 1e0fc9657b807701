"""benchmarks/attention_accuracy.py: the table it writes (stock once, then each fused variant of
the softmax split) and the points each variant sets (softmax_split.POINTS)."""

from __future__ import annotations

import pytest
from conftest import benchmark_module

from tflfuse.targets.edgetpu import softmax_split


@pytest.fixture(scope="module")
def bench():
    return benchmark_module("attention_accuracy")


def _measured(mapped: int, max_abs: float, cosine: float) -> dict:
    error = {"max_abs": max_abs, "rel": max_abs / 10, "cosine": cosine}
    return {"mapped": mapped, "total": 700, "error": error}


def test_the_variants_are_the_splits_compared(bench):
    """`three` is the module's own points; `two` the split at 8/n before; `one` no split."""
    assert bench.VARIANTS["three"] == (softmax_split.POINTS, softmax_split.LARGEST_POINT)
    assert bench.VARIANTS["two"] == ((8.0,), 0.5) and bench.VARIANTS["one"][0] == ()


def test_the_table_gives_stock_once_then_each_variant(bench):
    model = {"stem": "m.litert", "model": "m", "route": "litert"}
    model["one"] = {"fused": _measured(637, 0.662, 0.99), "stock": _measured(1, 0.569, 0.99)}
    model["two"] = {"fused": _measured(651, 0.681, 0.99)}
    model["three"] = {"convert_error": "tflfuse: error: boom"}
    lines = bench.table_lines([model], ["one", "two", "three"])
    labels = [line.split(" | ")[2] for line in lines[2:]]
    assert labels == [
        "stock", "tflfuse, one range", "tflfuse, two (8/n)", "tflfuse, three (1/n, 8/n)"
    ]  # fmt: skip
    assert "| 1/700 | 0.569 | 5.7% | 0.9900 |" in lines[2]
    assert "| 651/700 | 0.681 |" in lines[4] and "convert failed: tflfuse: error: boom" in lines[5]
    model["two"]["refused_as_useless"] = "output 'y' ..."
    assert bench.notes([model], ["one", "two"]) == [
        "- m.litert, two (8/n): refused without --accept-accuracy-loss: output 'y' ..."
    ]


def test_against_stock_gives_ratios_and_differences(bench):
    model = {"stem": "m.litert", "one": {"stock": _measured(1, 0.5, 0.99)}}
    model["one"]["fused"] = _measured(600, 0.6, 0.98)
    assert bench.against_stock([model], ["one"]) == [
        "- m.litert (against stock's): one range: max error x1.20, cosine -0.0100"
    ]
