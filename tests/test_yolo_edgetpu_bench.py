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
